"""calibrate-threshold end to end on a tiny random target and a tiny DSpark drafter: the engine records the
confidence logits, the SPS table round-trips in SGLang's layout and warns on another device, the command
writes every file and exits 0, and the user errors (no confidence head, too few samples) are one line with
exit code 2 (as pdraft.cli.main maps PdraftError)."""

import json
import warnings

import pytest
import torch

from pdraft.calibrate import find_calibration, find_sps_table, load_calibration, load_sps_table
from pdraft import serving
from pdraft.calibrate import sps as sps_module
from pdraft.calibrate.sps import isotonic_non_increasing, profile, profile_points, save_sps_table, smooth
from pdraft.calibration_files import DeviceMismatchWarning
from pdraft.cli.calibrate import calibrate_threshold
from doubles import tiny_target
from pdraft.decode.engine import generate
from pdraft.policies.cost import SpsTable
from pdraft.models import build_drafter, save_drafter
from reliability_support import invoke_command
import fake_engine
from test_data_tinytarget import make_tiny_target, write_chat_jsonl


def test_isotonic_fit():
    assert isotonic_non_increasing([5, 4, 4.5, 3, 3.5, 1]) == pytest.approx([5, 4.25, 4.25, 3.25, 3.25, 1])
    assert isotonic_non_increasing([1, 2, 3]) == pytest.approx([2, 2, 2])
    # a plateau then a cliff becomes a steady ramp between the block centres, still non-increasing
    assert smooth([10, 10, 10, 4, 4, 4]) == pytest.approx([10, 10, 8, 6, 4, 4])
    assert smooth([5, 6]) == pytest.approx([5.5, 5.5])


def test_sps_profile_measures_its_points_and_stores_every_b(tmp_path):
    """Past 32 tokens the profile measures every 8th B; the table still holds the fit at every B, and the plot
    puts the raw medians at the B they were measured at."""
    from pdraft.calibrate.report import plot_sps

    model = tiny_target(40, 32, num_layers=2, context=128)
    table = profile(model, 50, repeats=1, context=16, target="tiny")
    assert table["sample_batch_tokens"] == list(range(1, 51)) and len(table["sample_steps_per_sec"]) == 50
    assert table["pdraft"]["measured_batch_tokens"] == list(range(1, 33)) + [40, 48, 50]
    assert len(table["pdraft"]["raw_steps_per_sec"]) == 35
    assert plot_sps(table, tmp_path / "sps.png").exists()


def test_sps_table_round_trip_and_device_warning(tmp_path):
    model = tiny_target(40, 32, num_layers=2, context=128)
    table = profile(model, 6, repeats=2, context=16, target="tiny")
    assert table["sample_batch_tokens"] == [1, 2, 3, 4, 5, 6] and table["max_batch_tokens"] == 6
    sps = table["sample_steps_per_sec"]
    assert all(a >= b for a, b in zip(sps, sps[1:])) and all(s > 0 for s in sps)
    assert len(table["pdraft"]["raw_steps_per_sec"]) == 6 and table["pdraft"]["torch_version"] == torch.__version__
    path = save_sps_table(table, tmp_path / "sps_table.json")
    assert find_sps_table(tmp_path) == path
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # same device: no warning
        loaded = load_sps_table(path)
    assert isinstance(loaded, SpsTable) and loaded.steps_per_sec == pytest.approx(sps)
    assert loaded(3) == pytest.approx(sps[2]) and loaded(7) == 0.0
    other = dict(table, pdraft=dict(table["pdraft"], device="NVIDIA H200"))
    save_sps_table(other, tmp_path / "other.json")
    with pytest.warns(DeviceMismatchWarning, match="NVIDIA H200.*CPU"):
        load_sps_table(tmp_path / "other.json")
    bare = {k: table[k] for k in ("sample_batch_tokens", "sample_steps_per_sec", "max_batch_tokens")}
    (tmp_path / "sglang.json").write_text(json.dumps(bare))  # SGLang's own file: no metadata, no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_sps_table(tmp_path / "sglang.json")


def test_engine_records_confidence_logits():
    target = tiny_target(48, 32, num_layers=2)
    drafter = build_drafter("dspark", target.config, seed=0, mask_token_id=47, num_hidden_layers=1, markov_rank=8,
                            block_size=4)
    drafter.attach_target(target)
    out = generate(target, drafter.eval(), [[1, 2, 3], [4, 5]], gamma=3, max_new_tokens=6)
    drafted = [r for r in out.records if r.gamma > 0]  # the first step of each request is the target's alone
    assert drafted and all(len(r.confidence) == 3 for r in drafted)
    assert all(r.confidence is None and r.round == 0 for r in out.records if r.gamma == 0)
    assert all(r.confidence is None for r in generate(target, None, [[1, 2]], max_new_tokens=3).records)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("calib")
    target = make_tiny_target(root / "target")
    prompts = write_chat_jsonl(root / "prompts.jsonl", 12)
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(target)
    for name, extra in (("dspark", {"markov_rank": 8}), ("dspark_noconf", {"markov_rank": 8, "confidence_head": False}),
                        ("dflash", {})):
        kind = "dflash" if name == "dflash" else "dspark"
        d = build_drafter(kind, cfg, seed=0, mask_token_id=cfg.pad_token_id, num_hidden_layers=1, block_size=4,
                          **extra)
        save_drafter(d, root / name)
    recipe = root / "recipe.yaml"
    recipe.write_text(
        f"target:\n  id: {target}\n"
        f"calibrate:\n  prompts: {prompts}\n  num_prompts: 8\n  max_new_tokens: 12\n  min_samples: 5\n"
        "  sps_max_batch_tokens: 4\n  sps_repeats: 1\n  bins: 5\n"
        "runtime:\n  device: cpu\n")
    return root, recipe


def run(args):
    return invoke_command("calibrate-threshold", calibrate_threshold, args)


def test_cli_end_to_end_writes_every_file(env):
    root, recipe = env
    out = root / "out"
    code, stdout, _ = run([str(recipe), "--drafter", str(root / "dspark"), "--out", str(out), "--held-out", "0.25"])
    assert code == 0, stdout
    assert "held-out ECE of the cumulative survival" in stdout and "recommended static threshold" in stdout
    cal = find_calibration(out)
    assert cal is not None and len(load_calibration(cal)) == 4  # one temperature per drafted position
    doc = json.loads(cal.read_text())
    assert {"temperatures", "dataset", "num_samples", "ece_before", "ece_after"} <= set(doc)
    assert doc["pdraft"]["ece_on"] == "held-out" and doc["pdraft"]["binning"] == "equal_mass"
    assert find_sps_table(out) is not None
    assert json.loads(find_sps_table(out).read_text())["pdraft"]["measured_in"]["engine"] == "pdraft"
    for name in ("reliability.png", "threshold_sweep.png", "sps.png", "rounds.json", "recipe.resolved.yaml",
                 "report.json"):
        assert (out / "calibration" / name).stat().st_size > 0, name
    assert not (root / "dspark" / "confidence_sts.json").exists()  # --out respected
    code, stdout, _ = run([str(recipe), "--drafter", str(root / "dspark"), "--out", str(out), "--json",
                           "--skip-sps"])
    assert code == 0
    data = json.loads(stdout)
    assert len(data["sweep"]["rows"]) == 10 and data["overall_after"]["samples"] > 0
    assert data["sps_table"]["max_batch_tokens"] == 4  # the existing table was kept and used


def test_cli_errors_are_one_line(env):
    root, recipe = env
    for name in ("dspark_noconf", "dflash"):
        code, _, msg = run([str(recipe), "--drafter", str(root / name), "--out", str(root / "e")])
        assert code == 2 and "no confidence head" in msg and "\n" not in msg
    code, _, msg = run([str(recipe), "--drafter", str(root / "dspark"), "--out", str(root / "e"), "--skip-sps",
                        "--set", "calibrate.min_samples=100000"])
    assert code == 2 and "too few calibration samples" in msg and "\n" not in msg
    code, _, msg = run([str(recipe), "--drafter", str(root / "missing"), "--out", str(root / "e")])
    assert code == 2 and "missing" in msg


@pytest.fixture
def fake_registered(monkeypatch):
    monkeypatch.setitem(serving.ENGINES, fake_engine.NAME, fake_engine.ENGINE)
    fake_engine.PROFILED.clear()


def test_cli_engine_measures_the_cost_table_in_the_engine(env, fake_registered, monkeypatch):
    """--engine routes the SPS profile to the engine's profiler (pdraft's verifier is never timed), at the B,
    requests and repeats pdraft's own profile uses; the table has the same layout, names the engine in its
    metadata, and the scheduler's reader takes it as it takes pdraft's."""
    root, recipe = env

    def not_here(*a, **k):
        raise AssertionError("pdraft's own verifier was timed")
    monkeypatch.setattr(sps_module, "measure", not_here)
    out = root / "engine"
    code, stdout, msg = run([str(recipe), "--drafter", str(root / "dspark"), "--out", str(out), "--engine", "fake"])
    assert code == 0, stdout + msg
    assert [c["points"] for c in fake_engine.PROFILED] == [profile_points(4)]
    assert fake_engine.PROFILED[0]["requests"] == 8 and fake_engine.PROFILED[0]["repeats"] == 1
    data = json.loads(find_sps_table(out).read_text())
    assert data["sample_batch_tokens"] == [1, 2, 3, 4] and data["max_batch_tokens"] == 4
    meta = data["pdraft"]
    assert meta["measured_in"] == {"engine": "fake", "version": "0"} and meta["measured"] == "a made-up step time"
    assert meta["raw_steps_per_sec"] == pytest.approx([1 / (0.010 + 0.001 * b) for b in (1, 2, 3, 4)])
    assert meta["device_type"] == "cpu" and meta["context_tokens"] == fake_engine.PROFILED[0]["context"]
    table = load_sps_table(find_sps_table(out))
    assert table(1) == pytest.approx(1 / 0.011) and table(4) == pytest.approx(1 / 0.014)


def test_cli_engine_without_a_profiler_is_one_line(env, fake_registered, monkeypatch):
    from dataclasses import replace

    root, recipe = env
    monkeypatch.setitem(serving.ENGINES, "mute", replace(fake_engine.ENGINE, name="mute", title="Mute",
                                                         sps_profiler=None))
    code, _, msg = run([str(recipe), "--drafter", str(root / "dspark"), "--out", str(root / "e"), "--engine", "mute"])
    assert code == 2 and "Mute (mute) cannot measure the scheduler's cost table" in msg and "\n" not in msg.strip()
    assert not (root / "e").exists() and not fake_engine.PROFILED  # refused before anything ran
    code, _, msg = run([str(recipe), "--drafter", str(root / "dspark"), "--out", str(root / "e"), "--engine", "nope"])
    assert code == 2 and "unknown serving engine 'nope'" in msg
    code, _, msg = run([str(recipe), "--drafter", str(root / "dspark"), "--out", str(root / "e"), "--engine", "fake",
                        "--skip-sps"])
    assert code == 2 and "--skip-sps" in msg and not fake_engine.PROFILED


def test_table_reader_unchanged_by_measured_in(tmp_path):
    """A table written before `measured_in` existed and one an engine measured read the same way: the metadata
    is not the scheduler's business."""
    seconds, points = [0.01, 0.012, 0.02], [1, 2, 4]
    new = sps_module.cost_table(seconds, points, 4, device="CPU x", device_type="cpu",
                                meta={"measured_in": {"engine": "vllm", "version": "0.32.0"}})
    old = dict(new, pdraft={k: v for k, v in new["pdraft"].items() if k != "measured_in"})
    a, b = SpsTable.from_dict(new), SpsTable.from_dict(old)
    assert a.steps_per_sec == b.steps_per_sec and a.device == b.device == "CPU x"
    assert [a(n) for n in range(1, 6)] == [b(n) for n in range(1, 6)]
