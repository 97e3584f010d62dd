"""`pdraft bench --engine NAME` without a real engine: a test-double engine (tests/fake_engine.py), registered as
one module plus one line in pdraft.serving.ENGINES (what adding SGLang would take), whose contenders are pdraft's
own loop under another engine name. Both sweeps run it beside pdraft's runs: its speedups count against its own
baseline, never pdraft's; a contender it refuses leaves one line and the rest runs; policies it refuses are
skipped in one line; its rows carry the engine and its info, and the tables print them. The vLLM module itself is
tested against the real engine in tests/test_serving_check_vllm.py and .ci/run."""

import json

import pytest

from pdraft import serving
from pdraft.serving.vllm import engine_records
from pdraft.cli.bench import bench
from pdraft.errors import PdraftError
from pdraft.metrics import summarize_engine

import fake_engine as fake_engine_module
from reliability_support import invoke_command
from test_bench_serving import base, world  # noqa: F401 - the fixture


@pytest.fixture(autouse=True)
def fake_engine(monkeypatch):
    monkeypatch.setitem(serving.ENGINES, fake_engine_module.NAME, fake_engine_module.ENGINE)


def invoke(args):
    return invoke_command("bench", bench, args)


def test_gamma_sweep_with_an_engine(world, tmp_path):  # noqa: F811
    code, out, err = invoke(base(world, tmp_path) + ["--drafter", str(world["dflash"]), "--drafter",
                                                     str(world["dspark"]), "--engine", "fake", "--no-ngram",
                                                     "--set", "bench.float32_baseline=false"])  # counted below
    assert code == 0, (out, err)
    report = json.loads((tmp_path / "out" / "bench.json").read_text())
    fake = [r for r in report["runs"] if r.get("engine") == "fake"]
    ours = [r for r in report["runs"] if "engine" not in r]
    assert {r["drafter"] for r in fake} == {"fake target alone", "fake dflash-tiny (dflash)"}
    assert all(r["baseline"] == "fake target alone" for r in fake)
    assert all(r["baseline"] in ("target alone", "transformers generate()") for r in ours)
    assert all(r["engine_info"]["name"] == "fake" for r in fake)
    assert report["refused"] == ["fake nothing: not exported (a test line)", "fake refuses fake dspark-tiny (dspark)"]
    flat = " ".join(out.split())
    assert "fake rows: the engine's own figures" in flat and "fake refuses fake dspark-tiny (dspark)" in flat
    # the engine ran the same requests: greedy outputs equal pdraft's own target alone's, token for token
    for domain in {r["domain"] for r in fake}:
        same = [r for r in report["runs"] if r["domain"] == domain and r["gamma"] == 0]
        assert len(same) == 3


def test_serving_sweep_with_an_engine(world, tmp_path):  # noqa: F811
    code, out, err = invoke(base(world, tmp_path) + ["--drafter", str(world["dflash"]), "--drafter",
                                                     str(world["dspark"]), "--engine", "fake", "--concurrency", "1,2",
                                                     "--policy", "full,threshold"])
    assert code == 0, (out, err)
    report = json.loads((tmp_path / "out" / "bench.json").read_text())
    fake = [r for r in report["runs"] if r.get("engine") == "fake"]
    assert sorted((r["drafter"], r["concurrency"]) for r in fake) == [
        ("fake dflash-tiny (dflash)", 1), ("fake dflash-tiny (dflash)", 2), ("fake target alone", 1),
        ("fake target alone", 2)]
    assert all(r["baseline"] == "fake target alone" and r["same_as_target"] is not False for r in fake)
    reasons = [x["reason"] for x in report["skipped"]]
    assert "fake verifies full blocks only, not threshold" in reasons
    assert "fake refuses fake dspark-tiny (dspark)" in reasons and "fake nothing: not exported (a test line)" in reasons
    assert "fake rows: the engine's own figures" in " ".join(out.split())


def test_an_unknown_engine_is_one_line(world, tmp_path):  # noqa: F811
    code, out, err = invoke(base(world, tmp_path) + ["--drafter", str(world["dflash"]), "--engine", "sglang2"])
    assert code == 2 and "unknown serving engine 'sglang2': use one of" in " ".join(err.split())


def test_engine_records_from_vllm_metrics():
    """vLLM's per-request results as pdraft's rounds: the first token a target-only record, one record per verify
    step, the last step's committed count capped by what the output holds; TPOT from the engine's clock."""
    results = [{"token_ids": [1, 2, 3, 4, 5, 6, 7], "per_step_accepted": [2, 0, 3], "per_step_drafted": [3, 3, 3],
                "first_token_ts": 10.0, "last_token_ts": 10.6, "finish_reason": "length"},
               {"token_ids": [9], "per_step_accepted": [], "per_step_drafted": [], "first_token_ts": 11.0,
                "last_token_ts": 11.0, "finish_reason": "stop"}]
    records, outputs, times = engine_records(results, speculative=True)
    assert [(r.request, r.gamma, r.accepted, r.committed) for r in records] == [
        (0, 0, 0, 1), (0, 3, 2, 3), (0, 3, 0, 1), (0, 3, 3, 2), (1, 0, 0, 1)]
    assert len({r.round for r in records}) == len(records) and outputs[1] == [9]
    s = summarize_engine(records, times, wall_s=2.0)
    assert s.generated_tokens == 8 and s.tau == pytest.approx((3 + 1 + 4) / 3)
    assert s.tpot_s == pytest.approx(0.1) and s.tokens_per_s == pytest.approx(4.0)
    assert s.draft_s_per_round is None and s.verify_s_per_round is None
    plain, _, _ = engine_records(results, speculative=False)
    assert all(r.gamma == 0 and r.committed == 1 for r in plain) and len(plain) == 8


def test_the_engine_registry_refuses_unknown_names():
    with pytest.raises(PdraftError, match="unknown serving engine 'x'"):
        serving.engine_factory("x")
