"""`pdraft quickstart` end to end on a tiny random target: every stage runs, the artifacts exist (four
drafters, DFlash, DSpark, DFlash2 and EAGLE-3, a calibration file, a bench report with plots and T=0 and T=1 side
by side), the decoded sample equals the target's greedy output, and a rerun resumes instead of redoing the work."""

import json
from pathlib import Path

import pytest

from pdraft.cli.main import main
from pdraft.lifecycle import bench_overrides
from pdraft.recipe import load_recipe
from test_data_tinytarget import make_tiny_target, write_chat_jsonl


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("lifecycle")
    target = make_tiny_target(root / "t")
    data = write_chat_jsonl(root / "d.jsonl", 24)
    recipe = {
        "name": "tiny", "output_dir": str(root / "run"),
        "target": {"id": str(target), "num_layer_ids": 2},
        "data": {"source": str(data), "shard_tokens": 512},
        # a draft vocabulary, as the shipped quickstart has: EAGLE-3 takes it, the parallel families run on the
        # target's head in the quickstart
        "drafter": {"num_layers": 1, "block_size": 4, "markov_rank": 8, "mask_token_id": 0, "draft_vocab_size": 120},
        "train": {"steps": 4, "batch_size": 4, "num_anchors": 4, "checkpoint_every": 2, "eval_every": 4},
        "calibrate": {"prompts": str(data), "num_prompts": 8, "max_new_tokens": 8, "min_samples": 1,
                      "sps_max_batch_tokens": 4, "sps_repeats": 1},
        "decode": {"max_new_tokens": 8},
        "bench": {"gamma": "2,4", "prompt_sets": [str(data)], "num_prompts": 2, "max_new_tokens": 6},
        "runtime": {"threads": 1},
    }
    path = root / "quick.yaml"
    path.write_text(json.dumps(recipe))
    return root, path


def test_quickstart_runs_every_stage_and_resumes(world, capsys):
    root, recipe = world
    assert main(["quickstart", str(recipe), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert set(summary["stages"]) == {"target", "export-hidden", "train dflash", "train dspark", "train dflash2",
                                      "train eagle3", "calibrate dspark", "bench", "decode"}
    for kind in ("dflash", "dspark", "dflash2", "eagle3"):
        assert (Path(summary[f"train_{kind}"]["drafter"]) / "model.safetensors").exists()
        assert summary[f"train_{kind}"]["steps"] == 4  # the same steps for every kind
    # DFlash2 always uses the z-lab block: one more slot than the recipe's DeepSpec block, the same largest gamma
    d2 = json.loads((Path(summary["train_dflash2"]["drafter"]) / "config.json").read_text())
    assert d2["architectures"] == ["DFlash2DraftModel"] and d2["block_size"] == 5 and "draft_vocab_size" not in d2
    for kind in ("dflash", "dspark", "eagle3"):
        cfg = json.loads((Path(summary[f"train_{kind}"]["drafter"]) / "config.json").read_text())
        assert cfg.get("draft_vocab_size") == (120 if kind == "eagle3" else None), kind
    assert Path(summary["calibration"]["file"]).exists()
    bench = json.loads(Path(summary["bench"]["report"]).read_text())
    assert {r["kind"] for r in bench["runs"]} >= {"target", "dflash", "dspark", "dflash2", "eagle3", "ngram"}
    d2_runs = [r for r in bench["runs"] if r["kind"] == "dflash2"]
    # greedy over the whole sweep, and T=1 side by side at its middle gamma (lifecycle.bench_overrides)
    assert sorted((r["temperature"], r["gamma"]) for r in d2_runs if r["domain"] == d2_runs[0]["domain"]) == [
        (0.0, 2), (0.0, 4), (1.0, 4)]
    headline = summary["bench"]["headline"][d2_runs[0]["domain"]][d2_runs[0]["drafter"]]
    assert set(headline) == {"2", "4", "4 T=1"} and headline["4 T=1"]["token_acceptance"] is not None
    for run in d2_runs:  # the per-position conditional acceptance and the draft time per round are reported
        assert run["summary"]["conditional_acceptance"] and run["summary"]["draft_s_per_round"] > 0
    assert summary["train_dflash2"]["validation"]["selector_accuracy"] is not None
    assert summary["bench"]["plots"] and all(Path(p).exists() for p in summary["bench"]["plots"])
    assert summary["decode"]["identical_to_target_greedy"] is True
    assert (root / "run" / "quickstart.json").exists()

    assert main(["quickstart", str(recipe), "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["train_dspark"]["resumed_from"] == 4 and again["calibration"]["reused"] is True
    assert again["calibration"]["headline"] == summary["calibration"]["headline"]  # the reused file's figures


def test_unknown_kind_is_a_user_error(world, capsys):
    _, recipe = world
    assert main(["quickstart", str(recipe), "--kinds", "eagle"]) == 2
    assert "unknown drafter kind" in capsys.readouterr().err


def test_the_quickstart_benches_both_temperatures_unless_the_recipe_chooses(world):
    """T=0 over bench.gamma and T=1 at its middle gamma by default; a recipe's own temperatures, sampled gammas,
    sampled bench temperature or serving sweep are left as they are."""
    _, recipe = world
    assert bench_overrides(load_recipe(recipe)) == ["bench.temperatures=[0,1]", "bench.sampled_gamma=4",
                                                    "bench.sampled_num_prompts=1"]
    assert bench_overrides(load_recipe(recipe, ["bench.gamma=4,8,16", "bench.num_prompts=12"])) == [
        "bench.temperatures=[0,1]", "bench.sampled_gamma=8", "bench.sampled_num_prompts=6"]
    assert bench_overrides(load_recipe(recipe, ["bench.sampled_gamma=2", "bench.sampled_num_prompts=2"])) == [
        "bench.temperatures=[0,1]"]
    for own in (["bench.temperatures=[0,0.7]"], ["bench.temperature=1"], ["bench.concurrency=[1,4]"]):
        assert bench_overrides(load_recipe(recipe, own)) == []
