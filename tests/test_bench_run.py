"""`pdraft bench` on a tiny saved target with tiny random DFlash and DSpark drafters: gamma parsing and its
errors; the JSON report's figures recomputed from the per-round counts it contains (with metrics.summarize and
by hand from the definitions) equal its summary figures; same seed and settings give the same acceptance
figures, greedy and sampled; the command end to end (tables with definitions, bench.json, plots, metrics
stream, recommendations); and the user errors (missing prompt set, malformed JSONL line with and without
--skip-malformed, backwards gamma range, gamma beyond a drafter) as one line with exit code 2."""

import json

import pytest
import torch

from pdraft.metrics import RoundRecord, summarize
from pdraft.bench.report import build_report, recommend, write_report
from pdraft.bench.contenders import LoopContender
from pdraft.bench.sweep import (BenchSettings, check_gammas, domain_name, drafted_gammas, drafter_contender,
                              drafter_name, load_domains, ngram_contender, parse_gammas, run_bench, skipped_gammas,
                              target_contender)
from pdraft.cli.bench import bench
from pdraft.decode.settings import DecodeSettings
from pdraft.errors import PdraftError
from pdraft.models.api import SamplingParams

from reliability_support import invoke_command
from test_data_tinytarget import make_tiny_target

CODE = ["def add(a, b):\n    return a + b", "for i in range(10):\n    print(i * i)", "def sub(a, b):"]
PROSE = ["The quick brown fox jumps over the lazy dog.", "A robe takes 2 bolts of blue fiber."]
TIMING = {"decode_s", "tpot_s", "tokens_per_s", "draft_s", "verify_s", "bookkeeping_s", "draft_s_per_round",
          "verify_s_per_round", "round_s_per_round", "accept_s_per_round", "commit_s_per_round", "host_s_per_round",
          "tpot_p50_s", "tpot_p90_s", "per_user_tokens_per_s", "prefill_s"}


def write_jsonl(path, texts, bad_line=None):
    lines = [json.dumps({"turns": [t]}) for t in texts]
    if bad_line is not None:
        lines.insert(bad_line - 1, '{"turns": [unterminated')
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def save_tiny_drafters(root, target_config) -> None:
    """root/dflash-tiny and root/dspark-tiny: random 1-layer drafters of block 8 for the tiny target."""
    from pdraft.models import build_drafter, save_drafter

    for kind in ("dflash", "dspark"):
        extra = {"markov_rank": 8} if kind == "dspark" else {}
        drafter = build_drafter(kind, target_config, seed=0, mask_token_id=0, num_hidden_layers=1, block_size=8,
                                **extra)
        save_drafter(drafter, root / f"{kind}-tiny")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    root = tmp_path_factory.mktemp("bench")
    folder = make_tiny_target(root / "target", hidden=32, layers=2)
    model = AutoModelForCausalLM.from_pretrained(folder).float().eval()
    save_tiny_drafters(root, model.config)
    return {
        "root": root, "target": folder, "model": model, "tokenizer": AutoTokenizer.from_pretrained(folder),
        "code": write_jsonl(root / "code.jsonl", CODE), "prose": write_jsonl(root / "prose.jsonl", PROSE),
        "dflash": root / "dflash-tiny", "dspark": root / "dspark-tiny",
    }


def sweep(world, sampling=None, seed=0, gammas=(2, 5), batch_size=2, repeats=1, temperatures=None,
          sampled_gammas=None, sampled_num_prompts=None):
    model = world["model"]
    contenders = [drafter_contender(world["dflash"], model), drafter_contender(world["dspark"], model),
                  ngram_contender(model)]
    domains = load_domains([str(world["code"]), str(world["prose"])], world["tokenizer"], num_prompts=3)
    decode = DecodeSettings(max_new_tokens=10, sampling=sampling or SamplingParams(), seed=seed, batch_size=batch_size)
    settings = BenchSettings(gammas=list(gammas), decode=decode, repeats=repeats, num_prompts=3,
                             temperatures=temperatures, sampled_gammas=sampled_gammas,
                             sampled_num_prompts=sampled_num_prompts)
    return run_bench(model, contenders, domains, settings, eos_token_ids=[world["tokenizer"].eos_token_id])


# ------------------------------------------------------------------------------------------- gamma


def test_parse_gammas():
    assert parse_gammas("10..20") == list(range(10, 21))
    assert parse_gammas("4,8,16") == [4, 8, 16]
    assert parse_gammas("16, 4,8,4") == [4, 8, 16]
    assert parse_gammas("7") == [7]
    assert parse_gammas(" 3..3 ") == [3]


@pytest.mark.parametrize("text,message", [
    ("20..10", "runs backwards"), ("0..4", "gamma 0 is out of range"), ("4,40", "gamma 40 is out of range"),
    ("a..b", "cannot read gamma"), ("4;8", "cannot read gamma"), ("", "names no value"), (",", "names no value"),
])
def test_parse_gammas_errors(text, message):
    with pytest.raises(PdraftError, match=message):
        parse_gammas(text)


def test_huge_gamma_range_is_refused_before_it_is_expanded():
    import time

    t0 = time.perf_counter()
    for text in ("1..999999999999", "999999999999..1000000000000", "-999999999999..4"):
        with pytest.raises(PdraftError, match="out of range") as info:
            parse_gammas(text)
        assert "\n" not in info.value.one_line()
    with pytest.raises(PdraftError, match="cannot read gamma") as info:  # 5000 digits: int() refuses them
        parse_gammas("1.." + "9" * 5000)
    assert len(info.value.one_line()) < 200
    assert time.perf_counter() - t0 < 1.0


def test_gamma_beyond_a_drafter_skips_only_those_gammas():
    c = LoopContender("dspark-final (dspark)", "dspark", lambda p: None, max_gamma=8)
    check_gammas([c], [4, 8])
    check_gammas([c], [4, 10])  # 4 is drafted, 10 is reported as beyond the block size
    assert drafted_gammas(c, [4, 8, 10, 12]) == [4, 8] and skipped_gammas(c, [4, 8, 10, 12]) == [10, 12]
    assert skipped_gammas(target_contender(), [4, 40]) == []
    with pytest.raises(PdraftError, match=r"gamma 10 .*dspark-final \(dspark\).*at most 8"):
        check_gammas([c], [10, 12])  # none of the sweep: the drafter cannot take part at all


def test_labels_of_drafters_and_domains(tmp_path):
    assert drafter_name(tmp_path / "dspark-code") == "dspark-code"
    assert drafter_name(tmp_path / "dspark" / "step_200") == "dspark/step_200"
    assert drafter_name(tmp_path / "dflash" / "final") == "dflash/final"
    assert domain_name("builtin:code") == "code" and domain_name("/data/humaneval.jsonl") == "humaneval"
    assert domain_name("openai/gsm8k") == "openai/gsm8k"


# ------------------------------------------------------------------------------------------ report


def _by_hand(records):
    """The DESIGN.md definitions written out again, independently of pdraft.metrics."""
    drafted = [r for r in records if r.gamma > 0]
    sum_l = sum(r.verified for r in records)
    taus = [r.accepted + 1 for r in (drafted or records)]  # drafting rounds; target-only steps have tau 1
    out = {"tau": sum(taus) / len(taus),
           "token_acceptance": sum(r.accepted for r in records) / sum_l if sum_l else None,
           "block_acceptance": sum(r.accepted == r.gamma for r in drafted) / len(drafted) if drafted else None,
           "verification_utilization": sum_l / sum(r.gamma for r in records) if drafted else None,
           "generated_tokens": sum(r.committed for r in records)}
    cond = []
    for k in range(1, max((r.gamma for r in records), default=0) + 1):
        reached = [r for r in records if r.accepted >= k - 1 and r.verified >= k]
        cond.append(sum(r.accepted >= k for r in reached) / len(reached) if reached else None)
    out["conditional_acceptance"] = cond
    per_round = {r.round: r.round_s for r in records}
    per_request = {}
    for r in records:
        t, c = per_request.get(r.request, (0.0, 0))
        per_request[r.request] = (t + per_round[r.round], c + r.committed)
    out["tpot_s"] = sum(t / c for t, c in per_request.values()) / len(per_request)
    return out


def test_report_figures_recompute_from_its_round_counts(world, tmp_path):
    result = sweep(world, repeats=2)
    path = write_report(build_report(result, recipe={"bench": {"gamma": "2,5"}}, target="tiny"), tmp_path)
    report = json.loads(path.read_text())
    # 2 domains x (target alone + transformers generate() + 3 contenders x 2 gammas)
    assert len(report["runs"]) == 2 * (2 + 3 * 2)
    assert report["recipe"] == {"bench": {"gamma": "2,5"}} and report["machine"]["torch"] == torch.__version__
    references = {}
    for domain in {r["domain"] for r in report["runs"]}:
        alone = [r for r in report["runs"] if r["domain"] == domain and r["kind"] in ("target", "generate")]
        assert [r["kind"] for r in alone] == ["target", "generate"]
        assert alone[1]["same_as_target"] is True  # greedy: generate() gives the target-alone tokens
        references[domain] = min(alone, key=lambda r: r["summary"]["tpot_s"])  # the faster baseline
    steps = {r["domain"]: r["summary"]["verify_s_per_round"] for r in report["runs"] if r["kind"] == "target"}
    for run in report["runs"]:
        records = [RoundRecord(**dict(zip(report["round_fields"], row))) for row in run["rounds"]]
        assert records, run["drafter"]
        assert summarize(records).to_dict() == run["summary"]
        hand = _by_hand(records)
        for key, value in hand.items():
            stored = run["summary"][key]
            if value is None:  # an empty denominator (e.g. token acceptance of the target alone)
                assert stored is None, (key, run["drafter"], run["gamma"])
            elif isinstance(value, list):
                assert stored == pytest.approx(value, abs=1e-12), (key, run["drafter"], run["gamma"])
            else:
                assert stored == pytest.approx(value, abs=1e-12, rel=1e-12), (key, run["drafter"], run["gamma"])
        ref = references[run["domain"]]["summary"]["tpot_s"]
        assert run["speedup"] == pytest.approx(ref / run["summary"]["tpot_s"], rel=1e-12)
        assert run["baseline"] == references[run["domain"]]["drafter"]
        step, s = steps[run["domain"]], run["summary"]
        timed = {r.round: r for r in records if r.gamma > 0} or {r.round: r for r in records}  # drafting rounds
        round_s = sum(r.round_s for r in timed.values()) / len(timed)
        assert s["round_s_per_round"] == pytest.approx(round_s)
        assert s["draft_s_per_round"] == pytest.approx(sum(r.draft_s for r in timed.values()) / len(timed))
        assert s["verify_s_per_round"] == pytest.approx(sum(r.verify_s for r in timed.values()) / len(timed))
        assert run["t_step_s"] == step and run["verify_per_step"] == pytest.approx(s["verify_s_per_round"] / step)
        assert run["draft_per_step"] == pytest.approx(s["draft_s_per_round"] / step)
        assert run["speedup_vs_ideal"] == pytest.approx(run["speedup"] / (s["tau"] * step / round_s))
        assert run["backend"] == ("" if run["kind"] == "generate" else "static eager") and run["compile_s"] == 0
        assert run["summary"]["tpot_s"] == sorted(run["tpot_repeats_s"])[0]  # lower median of two repeats
        pairs = [b / t for b, t in zip(references[run["domain"]]["tpot_repeats_s"], run["tpot_repeats_s"])]
        assert run["speedup_range"] == pytest.approx([min(pairs), max(pairs)], rel=1e-12)  # repeat i vs repeat i
        assert sum(run["finish_reasons"].values()) == run["summary"]["requests"]
    assert report["recommendations"] == recommend(report["runs"])
    for rec in report["recommendations"]:
        rows = [r for r in report["runs"] if r["drafter"] == rec["drafter"] and r["domain"] == rec["domain"]]
        assert rec["best_speedup"]["speedup"] == max(r["speedup"] for r in rows)
        ok = [r["gamma"] for r in rows if (r["summary"]["token_acceptance"] or 0) >= 0.6]
        assert (rec["acceptance_rule"] or {}).get("gamma") == (max(ok) if ok else None)


def test_generate_times_its_own_threads_under_auto(world):
    """runtime.threads auto: transformers' generate() baseline measures its own thread count on a short generate()
    (the count measured on pdraft's loop may not be its best), says what it chose, gives the same tokens, and
    leaves torch's thread count as it found it."""
    from pdraft.bench.contenders import GenerateContender, Workload

    model, tok = world["model"], world["tokenizer"]
    prompts = [d for d in load_domains([str(world["code"])], tok, num_prompts=2)[0].prompts]
    decode = DecodeSettings(max_new_tokens=6, batch_size=2)
    work = Workload([list(p) for p in prompts], decode, 0, None, eos_token_ids=[tok.eos_token_id])
    before = torch.get_num_threads()
    plain = GenerateContender("g", target_model=model).run(work)
    measured = GenerateContender("g", target_model=model, threads="auto").run(work)
    assert plain.backend == "" and measured.backend.startswith("transformers generate(), ")
    assert "measured" in measured.backend or "default" in measured.backend  # one core: nothing to choose
    assert measured.outputs == plain.outputs and torch.get_num_threads() == before


def test_recommendation_rules_pick_by_their_own_criterion():
    def run(gamma, acc, speed):
        return {"kind": "dspark", "drafter": "d", "domain": "code", "gamma": gamma, "speedup": speed,
                "summary": {"token_acceptance": acc}}
    (rec,) = recommend([run(4, 0.9, 1.5), run(8, 0.7, 2.1), run(12, 0.61, 1.9), run(16, 0.4, 1.2)])
    assert rec["best_speedup"] == {"gamma": 8, "speedup": 2.1}
    assert rec["acceptance_rule"]["gamma"] == 12 and rec["acceptance_rule"]["threshold"] == 0.6
    (rec,) = recommend([run(4, 0.3, 1.1), run(8, 0.2, 0.9)])
    assert rec["acceptance_rule"] is None and rec["best_speedup"]["gamma"] == 4


def _acceptance(result):
    return [(r.domain, r.drafter, r.gamma, {k: v for k, v in r.summary.to_dict().items() if k not in TIMING},
             [(x.request, x.round, x.gamma, x.verified, x.accepted, x.committed) for x in r.records])
            for r in result.runs]


def test_same_seed_same_acceptance_greedy_and_sampled(world):
    assert _acceptance(sweep(world, gammas=(3,))) == _acceptance(sweep(world, gammas=(3,)))
    hot = SamplingParams(temperature=1.0)
    first = _acceptance(sweep(world, sampling=hot, seed=7, gammas=(3,)))
    assert first == _acceptance(sweep(world, sampling=hot, seed=7, gammas=(3,)))
    assert first != _acceptance(sweep(world, sampling=hot, seed=8, gammas=(3,)))  # the seed does matter


def test_two_temperatures_side_by_side_are_each_temperature_alone(world):
    """temperatures [0, 1] with sampled gammas [5]: the T=0 runs are a greedy sweep's, the T=1 runs a T=1 sweep's at
    gamma 5 only (same seeds, same rounds), each temperature's speedups count against its own target-alone runs,
    and every recommendation names its temperature."""
    both = sweep(world, gammas=(2, 5), temperatures=[0.0, 1.0], sampled_gammas=[5], seed=4)
    greedy = sweep(world, gammas=(2, 5), seed=4)
    hot = sweep(world, gammas=(5,), sampling=SamplingParams(temperature=1.0), seed=4)
    at = {t: [r for r in both.runs if r.temperature == t] for t in (0.0, 1.0)}
    assert _acceptance(type(both)(both.settings, both.domains, both.contenders, at[0.0])) == _acceptance(greedy)
    assert _acceptance(type(both)(both.settings, both.domains, both.contenders, at[1.0])) == _acceptance(hot)
    assert {r.gamma for r in at[1.0]} == {0, 5}
    for t, runs in at.items():
        for domain in ("code", "prose"):
            here = [r for r in runs if r.domain == domain]
            fastest = min((r for r in here if r.kind in ("target", "generate")), key=lambda r: r.summary.tpot_s)
            assert all(r.baseline == fastest.drafter for r in here)
            assert all(r.speedup == pytest.approx(fastest.summary.tpot_s / r.summary.tpot_s) for r in here)
    report = build_report(both, machine={})
    assert report["settings"]["temperatures"] == [0.0, 1.0]
    assert report["settings"]["gammas_by_temperature"] == {"0": [2, 5], "1": [5]}
    recs = {(r["drafter"], r["domain"], r["temperature"]) for r in report["recommendations"]}
    assert ("dspark-tiny (dspark)", "code", 1.0) in recs and ("dspark-tiny (dspark)", "code", 0.0) in recs
    assert {w["temperature"] for w in report["winners"]} == {0.0, 1.0}
    assert {r["temperature"] for r in report["runs"]} == {0.0, 1.0}
    # fewer prompts at T=1: its first ones, the same draws as a T=1 sweep over those prompts alone
    few = sweep(world, gammas=(2, 5), temperatures=[0.0, 1.0], sampled_gammas=[5], sampled_num_prompts=2, seed=4)
    hot_few = [r for r in few.runs if r.temperature == 1.0]
    assert all(len({x.request for x in r.records}) == 2 for r in hot_few)
    assert [r.summary.tau for r in few.runs if r.temperature == 0.0] == [r.summary.tau for r in at[0.0]]
    first_two = [(r.domain, r.drafter, [(x.request, x.round, x.accepted) for x in r.records if x.request < 2])
                 for r in at[1.0]]
    assert [(r.domain, r.drafter, [(x.request, x.round, x.accepted) for x in r.records]) for r in hot_few] == first_two
    assert build_report(few, machine={})["settings"]["num_prompts_by_temperature"] == {"0": 3, "1": 2}


# -------------------------------------------------------------------------------------------- CLI


def invoke(args):
    """Invoke `bench` as pdraft.cli.main does: PdraftError -> one line and exit code 2."""
    return invoke_command("bench", bench, args)


def base(world, tmp_path):
    """The float32 baseline is off here (runtime.dtype auto is bfloat16 on a CPU with bf16 units, float32
    elsewhere, so the runs counted below would depend on the machine); test_float32_baseline turns it on."""
    return ["--target", str(world["target"]), "--num-prompts", "2", "--max-new-tokens", "6",
            "--out", str(tmp_path / "out"), "--set", f"output_dir={tmp_path}", "--set", "bench.float32_baseline=false"]


def test_float32_baseline(world, tmp_path):
    """A bfloat16 CPU run also times the target alone and generate() on a float32 copy: rows of their own, named
    in bench.json, not greedy-checked against the bfloat16 target (another dtype rounds otherwise), and speedup
    references like the others (every speedup is against the fastest of the four baselines); a float32 run has none."""
    args = base(world, tmp_path)[:-2] + ["--gamma", "2", "--drafter", str(world["dflash"]), "--prompt-set",
                                         str(world["code"]), "--json"]
    code, out, _ = invoke(args + ["--set", "runtime.dtype=bfloat16"])
    assert code == 0, out
    runs = json.loads((tmp_path / "out" / "bench.json").read_text())["runs"]
    baselines = [r for r in runs if r["gamma"] == 0]
    assert [r["drafter"] for r in baselines] == ["target alone", "transformers generate()", "target alone (float32)",
                                                 "transformers generate() (float32)"]
    f32, g32 = baselines[2:]
    assert f32["dtype"] == "float32" and "same_as_target" not in f32 and f32["kind"] == "target"
    assert g32["dtype"] == "float32" and "same_as_target" not in g32 and g32["kind"] == "generate"
    fastest = min(baselines, key=lambda r: r["summary"]["tpot_s"])
    assert all(r["baseline"] == fastest["drafter"] for r in runs)
    drafted = next(r for r in runs if r["gamma"] == 2 and r["kind"] == "dflash")
    assert drafted["speedup"] == pytest.approx(fastest["summary"]["tpot_s"] / drafted["summary"]["tpot_s"])
    assert "same_as_target" in drafted  # the run's own dtype is still checked
    code, out, _ = invoke(args + ["--set", "runtime.dtype=float32"])
    assert code == 0, out
    runs = json.loads((tmp_path / "out" / "bench.json").read_text())["runs"]
    assert not any(r.get("dtype") for r in runs) and sum(r["gamma"] == 0 for r in runs) == 2


def test_cli_end_to_end(world, tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    code, out, _ = invoke(base(world, tmp_path) + [
        "--gamma", "2,4", "--drafter", str(world["dflash"]), "--drafter", str(world["dspark"]),
        "--prompt-set", str(world["code"]), "--prompt-set", str(world["prose"]), "--metrics", str(metrics),
        "--temperature", "0.8", "--seed", "3"])
    assert code == 0, out
    for text in ("code (", "prose (", "dflash-tiny (dflash)", "dspark-tiny (dspark)", "n-gram (prompt lookup)",
                 "target alone", "transformers generate()", "speedups vs", "backend: static eager",
                 "tau = mean(a+1) incl. bonus token", "cond acc k = P(k | 1..k-1)",
                 "tau (speedup) by gamma", "recommended gamma", "top_k=1 would be greedy", "really samples",
                 "the latency equation", "which drafter wins each domain"):
        assert text in out, text
    folder = tmp_path / "out"
    report = json.loads((folder / "bench.json").read_text())
    assert report["settings"]["gammas"] == [2, 4] and report["settings"]["seed"] == 3
    assert report["settings"]["top_k"] == 0 and report["settings"]["top_p"] == 1.0
    assert report["recipe"]["target"]["id"] == str(world["target"])
    assert {p.name for p in folder.glob("*.png")} == {"tau_speedup.png", "conditional_acceptance.png",
                                                      "token_acceptance.png", "draft_time.png"}
    assert (folder / "recipe.resolved.yaml").exists()
    lines = [json.loads(line) for line in metrics.read_text().splitlines()]
    headers = [x for x in lines if x["type"] == "run"]
    assert len(headers) == 2 * (2 + 3 * 2) and all(h["verify"] == "full" for h in headers)
    assert sum(x["type"] == "round" for x in lines) == sum(len(r["rounds"]) for r in report["runs"])


def test_bench_retimes_its_drafters_products_at_the_chosen_threads(world, tmp_path, monkeypatch):
    """Issue 59: the bench chose its threads after the drafters' product plans were timed at load; every drafter
    it loaded now goes to cpu_runtime (as decode's does), once each, and its plans are timed at the threads chosen."""
    import pdraft.decode.backend as backend

    seen = []
    real = backend.cpu_runtime

    def spy(*args, drafters=(), **kwargs):
        seen.append(list(drafters))
        return real(*args, drafters=drafters, **kwargs)

    monkeypatch.setattr(backend, "cpu_runtime", spy)
    code, out, _ = invoke(base(world, tmp_path) + ["--gamma", "2", "--drafter", str(world["dflash"]), "--drafter",
                                                   str(world["dspark"]), "--prompt-set", str(world["code"]),
                                                   "--num-prompts", "1", "--tree", "4", "--no-ngram"])
    assert code == 0, out
    assert len(seen) == 1 and sorted(d.config.kind for d in seen[0]) == ["dflash", "dspark"]  # the tree shares its chain's


def test_speedup_cell_shows_the_spread_over_repeats():
    from pdraft.bench.report import _speedup

    assert _speedup({"speedup": 2.1, "speedup_range": [1.93, 2.33]}) == "2.10x (1.93-2.33)"
    assert _speedup({"speedup": 2.1, "speedup_range": None}) == "2.10x"


def test_cli_sweep_past_a_drafters_block_marks_the_rest(world, tmp_path, monkeypatch):
    """dflash-tiny drafts at most 8 tokens: --gamma 7..9 runs it at 7 and 8, the n-gram baseline at 7..9, and
    gamma 9 of dflash is "beyond block size" in the tables, the footer, bench.json and the plots."""
    import pdraft.bench.plots as plots

    figures = []
    real_save = plots.save_figure
    monkeypatch.setattr(plots, "save_figure", lambda fig, path, dpi: (figures.append(
        [t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()]),
        real_save(fig, path, dpi))[1])
    code, out, _ = invoke(base(world, tmp_path) + ["--gamma", "7..9", "--drafter", str(world["dflash"]),
                                                   "--prompt-set", str(world["code"])])
    assert code == 0, out
    assert "beyond block size" in out
    assert "dflash-tiny (dflash) skipped γ 9: beyond block size (drafts at most 8)" in " ".join(out.split())
    report = json.loads((tmp_path / "out" / "bench.json").read_text())
    measured = {(r["drafter"], r["gamma"]) for r in report["runs"]}
    assert measured == {("target alone", 0), ("transformers generate()", 0), ("dflash-tiny (dflash)", 7),
                        ("dflash-tiny (dflash)", 8),
                        ("n-gram (prompt lookup)", 7), ("n-gram (prompt lookup)", 8), ("n-gram (prompt lookup)", 9)}
    assert report["skipped"] == [{"domain": "code", "drafter": "dflash-tiny (dflash)", "kind": "dflash", "gamma": 9,
                                  "reason": "beyond block size", "max_gamma": 8, "temperature": 0.0}]
    skips = {d["label"]: d["skipped_gammas"] for d in report["drafters"]}
    assert skips == {"dflash-tiny (dflash)": [9], "n-gram (prompt lookup)": []}
    tau_speedup, _, token_acc, _ = figures
    for legend in (tau_speedup, token_acc):
        assert "dflash-tiny (dflash): beyond block size" in legend, legend
        assert "n-gram (prompt lookup): beyond block size" not in legend


def test_cli_two_temperatures(world, tmp_path):
    code, out, _ = invoke(base(world, tmp_path) + ["--gamma", "2,4", "--drafter", str(world["dspark"]),
                                                   "--prompt-set", str(world["code"]), "--temperature", "0,1",
                                                   "--set", "bench.sampled_gamma=4", "--no-ngram"])
    assert code == 0, out
    flat = " ".join(out.split())
    for text in ("T=0", "T=1", "T=0 (greedy)", "T=1 (sampled)", "dspark-tiny (dspark) T=1", "really samples",
                 "greedy (temperature 0)"):
        assert text in flat, text
    report = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert sorted((r["temperature"], r["gamma"]) for r in report["runs"] if r["kind"] == "dspark") == [
        (0.0, 2), (0.0, 4), (1.0, 4)]
    # greedy runs are checked against the target alone token for token (sampled ones are not: other draws)
    assert [r["same_as_target"] for r in report["runs"] if r["kind"] == "dspark" and r["temperature"] == 0] == [
        True, True]
    assert all("same_as_target" not in r for r in report["runs"] if r["temperature"] == 1 and r["gamma"] > 0)
    assert "greedy outputs of all 3 checked runs identical to the target alone" in flat  # generate() too


def test_a_greedy_run_whose_output_differs_is_reported():
    """The negative control of the greedy check: a drafter run whose tokens are not the target alone's is named."""
    from pdraft.bench.report import _run_notes

    rows = [{"drafter": "target alone", "gamma": 0}, {"drafter": "d", "gamma": 4, "same_as_target": True},
            {"drafter": "e", "gamma": 8, "same_as_target": False}]
    notes = " ".join(_run_notes(rows))
    assert "LOSSLESS CHECK FAILED" in notes and "e γ8" in notes and "d γ4" not in notes


def test_cli_json_and_no_ngram(world, tmp_path):
    code, out, _ = invoke(base(world, tmp_path) + ["--gamma", "3", "--prompt-set", str(world["code"]),
                                                   "--no-ngram", "--json"])
    assert code == 0
    report = json.loads(out)
    assert [r["drafter"] for r in report["runs"]] == ["target alone", "transformers generate()"]
    assert all(r["summary"]["tau"] == 1.0 and r["speedup"] <= 1.0 for r in report["runs"])
    assert max(r["speedup"] for r in report["runs"]) == 1.0  # the faster baseline is the reference


def test_cli_user_errors(world, tmp_path):
    args = base(world, tmp_path)
    code, _, msg = invoke(args + ["--gamma", "2", "--prompt-set", str(tmp_path / "missing.jsonl")])
    assert code == 2 and "not found" in msg and "missing.jsonl" in msg
    bad = write_jsonl(tmp_path / "bad.jsonl", CODE, bad_line=2)
    code, _, msg = invoke(args + ["--gamma", "2", "--prompt-set", str(bad)])
    assert code == 2 and "bad.jsonl:2:" in msg and "invalid JSON" in msg and "\n" not in msg
    code, out, err = invoke(args + ["--gamma", "2", "--prompt-set", str(bad), "--skip-malformed", "--no-ngram"])
    assert code == 0 and "skipped 1 malformed line(s): 2" in err and "1 malformed lines skipped" in out
    code, _, msg = invoke(args + ["--gamma", "20..10", "--prompt-set", str(world["code"])])
    assert code == 2 and "runs backwards" in msg
    code, _, msg = invoke(args + ["--gamma", "12", "--drafter", str(world["dspark"]), "--prompt-set",
                                  str(world["code"])])
    assert code == 2 and "dspark-tiny (dspark)" in msg and "at most 8" in msg
    code, _, msg = invoke(args + ["--gamma", "2", "--drafter", str(tmp_path / "nope")])
    assert code == 2 and "not found" in msg


def test_cli_tree_beside_the_chain(world, tmp_path):
    """`--tree 12x3`: each parallel drafter also runs verifying trees, in rows beside its chain and in the
    tree-vs-chain table; the rounds carry each tree's shape; a width above the budget is one line."""
    code, out, _ = invoke(base(world, tmp_path) + ["--gamma", "4", "--drafter", str(world["dflash"]),
                                                   "--prompt-set", str(world["code"]), "--no-ngram", "--tree", "12x3"])
    assert code == 0, out
    for text in ("dflash-tiny (dflash) tree 12x3", "trees beside their chains", "tau chain -> tree"):
        assert text in out, text
    report = json.loads((tmp_path / "out" / "bench.json").read_text())
    runs = {r["drafter"]: r for r in report["runs"]}
    tree = runs["dflash-tiny (dflash) tree 12x3"]
    assert "dflash-tiny (dflash)" in runs
    shapes = [row[report["round_fields"].index("tree")] for row in tree["rounds"]]
    assert any(s and sum(s) > 4 for s in shapes) and all(s is None or sum(s) <= 12 for s in shapes)
    assert {"tree": [12, 3], "chain": "dflash-tiny (dflash)"}.items() <= next(
        d for d in report["drafters"] if d["label"].endswith("tree 12x3")).items()
    code, _, msg = invoke(base(world, tmp_path) + ["--gamma", "4", "--prompt-set", str(world["code"]),
                                                   "--tree", "3x4"])
    assert code == 2 and "tree width" in msg and "\n" not in msg


def test_profile_accounts_for_every_part_of_the_round(world, tmp_path):
    """`--profile` prints the round account; bench.json holds it for every pdraft run, chain and tree: draft,
    verify, accept, commit and host per drafting round add up to the round, each part is timed (accept and commit
    are not zero where drafts were verified), and each per-round figure is the mean of the rounds' own columns."""
    code, out, _ = invoke(base(world, tmp_path) + ["--gamma", "4", "--drafter", str(world["dflash"]), "--profile",
                                                   "--prompt-set", str(world["code"]), "--no-ngram", "--tree", "12x3"])
    assert code == 0, out
    assert "round account" in out and "host = the rest of the round" in out
    report = json.loads((tmp_path / "out" / "bench.json").read_text())
    fields = report["round_fields"]
    drafted = [r for r in report["runs"] if r["gamma"] > 0]
    assert {r["drafter"] for r in drafted} == {"dflash-tiny (dflash)", "dflash-tiny (dflash) tree 12x3"}
    for r in drafted:
        s = r["summary"]
        parts = [s[f"{p}_s_per_round"] for p in ("draft", "verify", "accept", "commit", "host")]
        assert sum(parts) == pytest.approx(s["round_s_per_round"], rel=1e-9), r["drafter"]
        assert all(p > 0 for p in parts[:4]) and parts[4] > -1e-6, (r["drafter"], parts)
        rows = {row[fields.index("round")]: row for row in r["rounds"] if row[fields.index("gamma")] > 0}
        for name in ("accept_s", "commit_s"):
            mean = sum(row[fields.index(name)] for row in rows.values()) / len(rows)
            assert s[f"{name}_per_round"] == pytest.approx(mean, rel=1e-9), (r["drafter"], name)
        assert r["commit_per_step"] == pytest.approx(s["commit_s_per_round"] / r["t_step_s"], rel=1e-9)


def test_recipe_tree_runs_beside_the_chain(world, tmp_path):
    """`decode.tree` in the recipe is bench's tree as `--tree` is (the decode section's verification settings are
    bench's): the tree row beside the chain, shaped by the recipe's budget; `--tree` wins over it; with the serving
    sweep, which does not take a tree, one line that names the key, before the target loads."""
    args = base(world, tmp_path) + ["--gamma", "4", "--drafter", str(world["dflash"]), "--prompt-set",
                                    str(world["code"]), "--no-ngram", "--set", "decode.tree=6x2"]
    code, out, _ = invoke(args)
    assert code == 0, out
    labels = {r["drafter"] for r in json.loads((tmp_path / "out" / "bench.json").read_text())["runs"]}
    assert {"dflash-tiny (dflash)", "dflash-tiny (dflash) tree 6x2"} <= labels and "trees beside their chains" in out
    code, out, _ = invoke(args + ["--tree", "5x1", "--out", str(tmp_path / "flag")])
    labels = {r["drafter"] for r in json.loads((tmp_path / "flag" / "bench.json").read_text())["runs"]}
    assert code == 0 and "dflash-tiny (dflash) tree 5x1" in labels and not any("6x2" in label for label in labels)
    code, _, msg = invoke(args + ["--concurrency", "1"])
    assert code == 2 and "(--tree, decode.tree) runs in the gamma sweep" in msg and "\n" not in msg


def test_tree_table_keeps_each_temperature_beside_its_own_chain():
    """A T=0 | T=1 bench runs every tree at both temperatures: the table pairs each tree row with the chain at its
    own temperature (keyed without T, the T=1 runs overwrote the T=0 ones and the greedy pairs went missing)."""
    from rich.console import Console

    from pdraft.bench.report import _tree_table

    def run(drafter, temperature, tau, speedup):
        return {"domain": "code", "drafter": drafter, "gamma": 8, "temperature": temperature, "speedup": speedup,
                "summary": {"tau": tau, "verify_s_per_round": 0.002}}

    report = {"drafters": [{"label": "d tree 32x4", "chain": "d", "tree": [32, 4]}],
              "runs": [run("d", 0.0, 4.0, 2.0), run("d tree 32x4", 0.0, 5.0, 1.5),
                       run("d", 1.0, 1.3, 0.6), run("d tree 32x4", 1.0, 1.6, 0.4)]}
    console = Console(width=200, record=True)
    console.print(_tree_table(report))
    text = console.export_text()
    assert "4.00 -> 5.00" in text and "1.30 -> 1.60" in text, text
    assert "2.00x -> 1.50x" in text and "0.60x -> 0.40x" in text, text


def test_float32_baseline_left_out_where_the_copy_would_not_fit(monkeypatch):
    import os

    from pdraft.bench.sweep import float32_baseline_refusal

    model = torch.nn.Linear(1024, 1024).bfloat16()
    assert float32_baseline_refusal(model) is None
    assert "float32" in float32_baseline_refusal(torch.nn.Linear(4, 4))
    monkeypatch.setattr(os, "sysconf", lambda name: 1024 if name == "SC_AVPHYS_PAGES" else 1024)  # 1 MiB free
    why = float32_baseline_refusal(model)
    assert why.startswith("bench.float32_baseline") and "4.0 GiB" not in why and "left out" in why
