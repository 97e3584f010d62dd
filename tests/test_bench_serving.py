"""`pdraft bench --concurrency ... --temperature 0,1 --policy ... --sla-tps N`, the serving sweep
(pdraft.bench.serving) on a tiny saved target with tiny random DFlash and DSpark drafters (the DSpark one with a
cost table beside it): every (contender, policy that applies, level, temperature) measured, the target alone and
generate() at every level, max(2 C, P) requests per level with their stream seeds recorded, greedy runs
token-identical to the target alone, the figures recomputed from the rounds bench.json holds, the SLA pick
recomputed by hand, the Pareto plot written; a policy that cannot run is a note, never an error; and the user
errors (an unknown policy, temperatures without levels) as one line."""

import json

import pytest

from pdraft.bench.plots import pareto_front
from pdraft.bench.serving import parse_levels, parse_policies, parse_temperatures, requests_for, sla_picks
from pdraft.cli.bench import bench
from pdraft.errors import PdraftError
from pdraft.metrics import RoundRecord, summarize

from reliability_support import invoke_command
from test_bench_run import CODE, PROSE, save_tiny_drafters, write_jsonl
from test_data_tinytarget import make_tiny_target

SPS = {"sample_batch_tokens": [1, 8, 64], "sample_steps_per_sec": [100.0, 90.0, 40.0], "max_batch_tokens": 512}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("serving")
    folder = make_tiny_target(root / "target", hidden=32, layers=2)
    model = AutoModelForCausalLM.from_pretrained(folder).float().eval()
    save_tiny_drafters(root, model.config)
    (root / "dspark-tiny" / "sps_table.json").write_text(json.dumps(SPS))
    return {"target": folder, "code": write_jsonl(root / "code.jsonl", CODE),
            "prose": write_jsonl(root / "prose.jsonl", PROSE), "dflash": root / "dflash-tiny",
            "dspark": root / "dspark-tiny"}


def invoke(args):
    return invoke_command("bench", bench, args)


def base(world, tmp_path):
    return ["--target", str(world["target"]), "--num-prompts", "2", "--max-new-tokens", "6", "--gamma", "3",
            "--out", str(tmp_path / "out"), "--set", f"output_dir={tmp_path}",
            "--prompt-set", str(world["code"]), "--prompt-set", str(world["prose"])]


def test_serving_sweep_end_to_end(world, tmp_path):
    code, out, err = invoke(base(world, tmp_path) + [
        "--drafter", str(world["dflash"]), "--drafter", str(world["dspark"]), "--concurrency", "1,3",
        "--temperature", "0,1", "--policy", "full,threshold,scheduler", "--sla-tps", "1", "--seed", "5",
        "--repeats", "2"])
    assert code == 0, (out, err)
    flat = " ".join(out.split())
    for text in ("serving sweep, T=0", "serving sweep, T=1", "per-user", "TPOT p90", "SLA: per-user >= 1",
                 "dflash-tiny (dflash): threshold skipped: the static threshold needs a confidence head",
                 "dflash-tiny (dflash): scheduler skipped", "static padded batches of C", "refilled"):
        assert text in flat, text
    folder = tmp_path / "out"
    report = json.loads((folder / "bench.json").read_text())
    assert (folder / "pareto.png").stat().st_size > 0
    assert report["schema"] == "pdraft.bench/1" and report["sweep"] == "serving"
    st = report["settings"]
    assert st["concurrency"] == [1, 3] and st["temperatures"] == [0.0, 1.0] and st["sla_tps"] == 1.0
    assert st["policies"] == ["full", "threshold", "scheduler"]
    prompts = 4  # two per set, pooled
    assert len(report["stream_seeds"]) == max(2 * 3, prompts) == 6
    got = {(r["drafter"], r["verify"], r["concurrency"], r["temperature"]) for r in report["runs"]}
    want = {(d, p, c, t) for c in (1, 3) for t in (0.0, 1.0)
            for d, p in [("target alone", "full"), ("generate(), static C", "full"), ("dflash-tiny (dflash)", "full"),
                         ("dspark-tiny (dspark)", "full"), ("dspark-tiny (dspark)", "threshold"),
                         ("dspark-tiny (dspark)", "scheduler")]}
    assert got == want
    assert {(x["drafter"], x["verify"]) for x in report["skipped"]} == {("dflash-tiny (dflash)", "threshold"),
                                                                       ("dflash-tiny (dflash)", "scheduler")}
    fields = report["round_fields"]
    for r in report["runs"]:
        assert r["requests"] == max(2 * r["concurrency"], prompts)
        assert len(r["tpot_repeats_s"]) == 2 and r["summary"]["tpot_s"] == min(r["tpot_repeats_s"])  # lower median
        records = [RoundRecord(**dict(zip(fields, row))) for row in r["rounds"]]
        again = summarize(records).to_dict()
        for key in ("tau", "token_acceptance", "verification_utilization", "tokens_per_s",
                    "per_user_tokens_per_s", "tpot_p50_s", "tpot_p90_s"):
            assert again[key] == pytest.approx(r["summary"][key]), key
        assert again["requests"] == r["requests"]
        if r["temperature"] == 0 and r["drafter"] != "target alone":
            assert r["same_as_target"] is True, r["drafter"]
        if r["kind"] != "generate" and r["concurrency"] == 3:
            assert r["refills"] == r["requests"] - 3  # every request past the first three took a freed slot
    for pick in report["sla"]:
        rows = [r for r in report["runs"] if r["drafter"] == pick["drafter"]
                and r["temperature"] == pick["temperature"] and r["summary"]["per_user_tokens_per_s"] >= 1]
        best = max(rows, key=lambda r: r["summary"]["tokens_per_s"])
        assert pick["pick"]["total_tokens_per_s"] == best["summary"]["tokens_per_s"]


def test_sla_pick_and_pareto_by_hand():
    def run(drafter, c, per_user, total):
        return {"drafter": drafter, "temperature": 0.0, "gamma": 4, "verify": "full", "concurrency": c,
                "summary": {"per_user_tokens_per_s": per_user, "tokens_per_s": total}}

    runs = [run("a", 1, 100, 100), run("a", 4, 60, 240), run("a", 16, 20, 320), run("b", 1, 40, 40)]
    picks = {p["drafter"]: p["pick"] for p in sla_picks(runs, 50)}
    assert picks["a"]["concurrency"] == 4 and picks["a"]["total_tokens_per_s"] == 240  # 16 misses the floor
    assert picks["b"] is None
    assert sla_picks(runs, None) == []
    assert pareto_front([(100, 100), (60, 240), (20, 320), (50, 200), (90, 90)]) == [(20, 320), (60, 240),
                                                                                    (100, 100)]


def test_parsers_and_requests_rule():
    assert parse_levels("16,1, 4,4") == [1, 4, 16]
    assert parse_temperatures("0,1") == [0.0, 1.0]
    assert parse_policies(["full", " scheduler", "full"]) == ["full", "scheduler"]
    for bad, fn in (("1,x", parse_levels), ("0", parse_levels), ("hot", parse_temperatures), ("9", parse_temperatures)):
        with pytest.raises(PdraftError):
            fn(bad)
    with pytest.raises(PdraftError, match="unknown verification mode 'nope'"):
        parse_policies(["full", "nope"])
    assert len(requests_for([[1], [2], [3]], 1)) == 3 and len(requests_for([[1], [2], [3]], 4)) == 8
    assert requests_for([[1], [2], [3]], 4)[3:5] == [[1], [2]]


def test_serving_user_errors(world, tmp_path):
    code, _, err = invoke(base(world, tmp_path) + ["--concurrency", "1", "--policy", "full,nope"])
    assert code == 2 and "unknown verification mode 'nope'" in err and "\n" not in err.strip()
    # policies and an SLA belong to the serving sweep (temperatures no longer do: the gamma sweep runs them too)
    code, _, err = invoke(base(world, tmp_path) + ["--policy", "full,scheduler"])
    assert code == 2 and "serving sweep" in err and "--concurrency" in err and "bench.policies" in err
    code, _, err = invoke(base(world, tmp_path) + ["--concurrency", "2", "--set", "decode.compile='off'"])
    assert code == 2 and "needs the static decode path" in err
