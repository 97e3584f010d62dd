"""`pdraft check-serving` and `pdraft export --check` through an engine added as one module plus its registration:
the test double tests/fake_engine.py (pdraft's loop reported as engine "fake", serving pdraft.hub.export's `sglang`
layout) is registered in pdraft.serving.ENGINES and nothing else changes. The check exports in the engine's format,
reads the engine's serve command, replays through the engine's contender and prints the engine's tau beside
pdraft's; a replay that differs, an unknown engine and a broken export fail as they do for vLLM, the cause cited
with the engine's own loader note. The drafters and recipe are tests/test_serving_check.py's (a z-lab DFlash and an
EAGLE-3 on a tiny random target)."""

import json
import shutil

import pytest

from pdraft import serving
from pdraft.cli.check_serving import check_serving
from pdraft.cli.hub import export as export_command
from pdraft.hub.export import export
from pdraft.paths import RESOLVED_NAME

import fake_engine
from reliability_support import invoke_command
from test_serving_check import world  # noqa: F401 - the fixture


@pytest.fixture(autouse=True)
def registered(monkeypatch):
    monkeypatch.setitem(serving.ENGINES, fake_engine.NAME, fake_engine.ENGINE)  # the registration
    monkeypatch.setitem(fake_engine.SKEW, "rounds", False)
    fake_engine.SERVED.clear()


def run(world, kind, *extra):  # noqa: F811
    return invoke_command("check-serving", check_serving, [
        str(world["root"] / kind), "--engine", "fake", "--recipe", str(world["root"] / "recipe.yaml"),
        "--num-prompts", "1", "--max-new-tokens", "8", *extra])


@pytest.mark.parametrize("kind,method,drafts", [("dflash", "dflash", 4), ("eagle3", "eagle3", 4)])
def test_check_serving_runs_through_the_registered_engine(world, kind, method, drafts):  # noqa: F811
    code, out, err = run(world, kind, "--json")
    assert code == 0, (out, err)
    report = json.loads(out)
    assert report["ok"] and report["replayed"] and report["engine"] == "fake" and report["findings"] == []
    # the engine's own speculative config, read from SGLang's serve command by its module
    assert report["speculative_config"]["method"] == method
    assert report["speculative_config"]["num_speculative_tokens"] == drafts
    assert "draft_model_path" in report["speculative_config"] and "model" not in report["speculative_config"]
    stats = report["stats"]
    assert stats["prompts"] == 2 and stats["rounds_compared"] > 0 and stats["rounds_equal"] == stats["rounds_compared"]
    assert report["engine_info"]["name"] == "fake"
    served = fake_engine.SERVED[-1]
    assert (served["method"], served["gamma"], served["dtype"]) == (method, drafts, "float32")


def test_a_replay_the_engine_runs_otherwise_fails(world):  # noqa: F811
    fake_engine.SKEW["rounds"] = True
    code, out, err = run(world, "dflash")
    flat = " ".join(out.split())
    assert code == 1, (out, err)
    assert "FAIL: fake does not serve" in flat and "rounds differ; first at drafting round 1" in flat
    assert "the export matches what pdraft writes for this drafter" in flat


def test_a_broken_export_cites_the_engines_own_loader(world, tmp_path):  # noqa: F811
    folder = export(world["root"] / "dflash", "sglang", tmp_path / "broken", target=str(world["target"])).path
    data = json.loads((folder / "config.json").read_text())
    data["dflash_config"]["target_layer_ids"] = [i + 1 for i in data["dflash_config"]["target_layer_ids"]]
    (folder / "config.json").write_text(json.dumps(data))
    code, out, err = run(world, "dflash", "--export", str(folder))
    flat = " ".join(out.split())
    assert code == 1, (out, err)
    assert ("cause layer-ids (target layer ids or their offset convention (fake reads them in "
            "tests/fake_engine.py))") in flat and "not served" in flat
    assert "vLLM" not in flat and fake_engine.SERVED == []


def test_an_unknown_engine_names_the_registered_ones(world):  # noqa: F811
    code, out, err = invoke_command("check-serving", check_serving, [str(world["root"] / "dflash"), "--engine", "nope"])
    assert code == 2 and "unknown serving engine 'nope': use one of fake, llamacpp, vllm" in " ".join(err.split())


def test_export_check_serves_the_format_in_its_engine(world, tmp_path):  # noqa: F811
    drafter = tmp_path / "dflash"
    shutil.copytree(world["root"] / "dflash", drafter)
    shutil.copy(world["root"] / "recipe.yaml", drafter / RESOLVED_NAME)  # the recipe check-serving reads
    code, out, err = invoke_command("export", export_command, [str(drafter), "--format", "sglang", "--out",
                                                               str(tmp_path / "served"), "--target",
                                                               str(world["target"]), "--check"])
    flat = " ".join(out.split())
    assert code == 0, (out, err)
    assert "wrote sglang layout" in flat and f"OK: fake serves {tmp_path / 'served'}" in flat
    assert fake_engine.SERVED[-1]["export"] == str(tmp_path / "served")
    code, _, err = invoke_command("export", export_command, [str(drafter), "--format", "zlab-dflash", "--out",
                                                             str(tmp_path / "z"), "--check"])
    assert code == 2 and ("--check serves the export in vLLM or llama.cpp or Fake: give it with --format vllm or "
                          "--format gguf or --format sglang and without --json") in " ".join(err.split())
