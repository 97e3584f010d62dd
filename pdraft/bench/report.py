"""The bench report: one JSON document holding every figure of a sweep, the per-round counts they were computed
from (so a reader can recompute them with pdraft.metrics.summarize, or by hand from the definitions it
states), the resolved recipe, the sampling settings, the machine and the versions; the gammas of the sweep a
drafter could not draft (beyond its block size: listed under `skipped`, never in `runs`); the gamma
recommendations (two rules, each named); and the rich tables that print it, one per domain, with the metric
definitions and the skipped gammas in their footer. Tables are drawn from the report dict, so what is printed is what is saved.
"""

from __future__ import annotations

import datetime
import os
import platform
from pathlib import Path

from rich.console import Console
from rich.table import Table

from pdraft.decode.backend import runtime_line
from pdraft.metrics import RoundRecord
from pdraft.bench import draft_cost
from pdraft.bench.contenders import ENGINE_NOTE
from pdraft.bench.sweep import BenchResult, skipped_gammas
from pdraft.bench.stream import ROUND_FIELDS
from pdraft import ledger
from pdraft.rich_text import styled
# The schema of bench.json read back (its tag, BenchReport, BENCH_REPORT) lives in the leaf pdraft.bench_file,
# which push, pull and the model card read without importing the bench; re-exported here for the writer's callers.
from pdraft.bench_file import BENCH_REPORT, SCHEMA, BenchReport  # noqa: F401

BEYOND_BLOCK = "beyond block size"  # why a (drafter, gamma) of the sweep has no run
ACCEPTANCE_RULE = 0.60  # the seed article: keep token acceptance at 60% or more
DEFINITIONS = {
    "tau": "accepted length: mean over rounds of a + 1 (a drafts accepted, plus the target's bonus/correction "
           "token)",
    "token_acceptance": "sum a / sum l (l = drafts sent to verification; l = gamma without a scheduler)",
    "block_acceptance": "share of rounds with a = gamma",
    "verification_utilization": "sum l / sum gamma",
    "conditional_acceptance[k]": "P(position k accepted | positions 1..k-1 accepted and k verified)",
    "joint_acceptance[k]": "P(a >= k) over rounds that drafted at least k tokens",
    "tpot_s": "decode wall time / generated tokens per request, averaged over requests (prefill excluded)",
    "draft_s_per_round, verify_s_per_round": "drafter and target-verify seconds per drafting round (a batched round counts once; a request's first token, a target-only step, is left out as in tau)",
    "speedup": "TPOT(baseline) / TPOT(this run), same prompts, same sweep; baseline = the faster of pdraft's "
               "target-alone loop and transformers' generate() on the domain (named in `baseline`)",
    "speedup_range": "the lowest and highest speedup over the repeats, repeat i against the baseline's repeat i "
                     "(they ran in the same pass round the domain); null with one repeat",
    "accept_s_per_round, commit_s_per_round, host_s_per_round": "the rest of a drafting round, the same rounds: the "
        "acceptance test (and the policy's observe), the target's cache commit of the accepted drafts, and the "
        "host's bookkeeping (round less draft, verify, accept and commit: outputs, stop checks, records); `bench "
        "--profile` prints the whole account",
    "t_step_s": "one target step: verify seconds per round of pdraft's target-alone run on the domain",
    "draft_per_step, verify_per_step, round_per_step": "draft, verify and whole-round seconds per drafting round / "
                                                       "t_step_s: what a round costs in target steps",
    "accept_per_step, commit_per_step, host_per_step": "the same for the acceptance test, the cache commit and the "
                                                       "host's bookkeeping",
    "ideal_speedup": "tau * t_step_s / round seconds: the speedup if every token of the baseline cost one step",
    "speedup_vs_ideal": "speedup / ideal_speedup: below 1 when the baseline is cheaper than one step per token, "
                        "rounds commit fewer than tau tokens (EOS, token budget, batch stragglers) or requests "
                        "spend a target-only step on their first token",
    "compile_s": "seconds spent compiling during the run, kept out of every timing (the compiled code serves "
                 "every later request of the process); 0 when nothing was compiled",
    "skipped": f"a gamma of the sweep larger than a drafter's block size: {BEYOND_BLOCK}, not decoded",
    "draft_cost": "per (drafter, domain): draft ms per round at each gamma, the least-squares fit a + b * gamma "
                  "(b = ms per drafted token) and the ratio of the largest gamma's draft time to the smallest's",
    "winners": "per domain: the drafter and gamma with the best measured speedup, with its drafting mode",
}
FOOTER = ("tau = mean(a+1) incl. bonus token · token acc = Σa/Σl · block acc = P(a=γ) · verif util = Σl/Σγ · "
          "cond acc k = P(k | 1..k-1) · TPOT = decode time / generated token (per request, mean) · "
          "speedup = TPOT(faster target-alone baseline) / TPOT, same run (lowest-highest over the repeats) · draft/verify = ms per round (in target "
          "steps) · vs ideal = speedup / (tau · step / round)")


def machine_info() -> dict:
    import torch
    import transformers

    import pdraft

    from pdraft.runtime import cpu_model

    cpu = cpu_model()
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {
        "cpu": cpu, "cpu_count": os.cpu_count(), "gpu": gpu, "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
        "transformers": transformers.__version__, "pdraft": pdraft.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def sampling_note(sampling) -> str:
    t, k, p = sampling.temperature, sampling.top_k, sampling.top_p
    if t <= 0:
        return "greedy (temperature 0): outputs equal the target's greedy output token for token"
    mode = "greedy in effect (top_k=1 keeps only the argmax)" if k == 1 else "really samples"
    return (f"temperature {t}, top_k {k} ({'off' if k == 0 else 'on'}), top_p {p} ({'off' if p >= 1 else 'on'}): "
            f"{mode}; top_k=1 would be greedy whatever the temperature")


def primary_runs(report: dict) -> list[dict]:
    """The runs at the report's first temperature (all of them in a report of one temperature, or from before
    temperatures): what the plots and the draft-cost fit read."""
    temps = report.get("settings", {}).get("temperatures")
    if not temps or len(temps) < 2:
        return report["runs"]
    return [r for r in report["runs"] if r.get("temperature", temps[0]) == temps[0]]


def build_report(result: BenchResult, *, recipe: dict | None = None, machine: dict | None = None,
                 target: str | None = None) -> dict:
    s = result.settings
    d = s.decode  # the sweep's decode settings
    temps = s.temperature_list()
    steps: dict[tuple[str, str, float], float | None] = {}  # one target step: the first baseline's (pdraft's target alone)
    for r in result.runs:
        if r.gamma == 0:
            steps.setdefault((r.engine, r.domain, r.temperature), r.summary.verify_s_per_round)
    runs = [{
        "domain": r.domain, "drafter": r.drafter, "kind": r.kind, "gamma": r.gamma, "temperature": r.temperature,
        "verify": r.verify,
        "summary": r.summary.to_dict(), "speedup": r.speedup, "baseline": r.baseline, "backend": r.backend,
        "speedup_range": list(r.speedup_range) if r.speedup_range else None,
        "compile_s": r.compile_s, **({"same_as_target": r.same_as_target} if r.same_as_target is not None else {}),
        **({"divergences": [d.to_dict() for d in r.divergences]} if r.divergences else {}),
        **({"engine": r.engine, "engine_info": r.engine_info} if r.engine else {}),
        **({"dtype": r.dtype} if r.dtype else {}),
        **round_costs(r.summary, steps.get((r.engine, r.domain, r.temperature)), r.speedup),
        "tpot_repeats_s": r.tpot_repeats_s, "kept_repeat": r.kept_repeat, "finish_reasons": r.finish_reasons,
        "rounds": [[getattr(rec, name) for name in ROUND_FIELDS] for rec in r.records],
    } for r in result.runs]
    return {
        "schema": SCHEMA,
        "target": target,
        "definitions": DEFINITIONS,
        "round_fields": list(ROUND_FIELDS),
        "settings": {
            "gammas": s.gammas, "num_prompts": s.num_prompts, "max_new_tokens": d.max_new_tokens,
            "temperature": temps[0], "top_k": d.sampling.top_k, "top_p": d.sampling.top_p,
            "sampling": sampling_note(s.at(temps[0]).decode.sampling), "seed": d.seed, "batch_size": d.batch_size,
            # every temperature the sweep ran, side by side (the first is `temperature`), and the gammas each ran
            "temperatures": temps, "gammas_by_temperature": {f"{t:g}": s.at(t).gammas for t in temps},
            "num_prompts_by_temperature": {f"{t:g}": s.at(t).num_prompts for t in temps},
            "sampling_by_temperature": {f"{t:g}": sampling_note(s.at(t).decode.sampling) for t in temps},
            "repeats": s.repeats, "verify": s.verify.mode if s.verify is not None else s.decode.verify,
        },
        "domains": [{"name": d.name, "source": d.source, "prompts": len(d.prompts),
                     "skipped_lines": d.skipped_lines} for d in result.domains],
        "drafters": [{"label": c.label, "kind": c.kind, "path": c.path, "max_gamma": c.max_gamma,
                      "skipped_gammas": skipped_gammas(c, s.gammas),
                      **({"tree": list(c.tree), "chain": c.chain} if c.tree is not None else {})}
                     for c in result.contenders],
        "runs": runs,
        # The sweep's (domain, drafter, gamma) that were not decoded, and why; never mixed into `runs`, whose
        # every entry carries measured figures.
        "skipped": [{"domain": d.name, "drafter": c.label, "kind": c.kind, "gamma": g, "reason": BEYOND_BLOCK,
                     "max_gamma": c.max_gamma, "temperature": t}
                    for t in temps for d in result.domains for c in result.contenders
                    for g in skipped_gammas(c, s.at(t).gammas)],
        # Contenders that could not run at all (a serving engine refusing a family or a setting), one line each.
        **({"refused": result.refused} if result.refused else {}),
        "recommendations": recommend(runs),
        # The latency equation (draft time per round against gamma, fitted per drafter) at the first temperature
        # (a draft's cost hardly depends on it), and each domain's winner at each temperature.
        "draft_cost": draft_cost.draft_costs([r for r in runs if r["temperature"] == temps[0]]),
        "winners": [{**w, "temperature": t} for t in temps
                    for w in draft_cost.winners([r for r in runs if r["temperature"] == t])],
        "recipe": recipe,
        "machine": machine if machine is not None else machine_info(),
    }


PROFILE_PARTS = ("draft", "verify", "accept", "commit", "host")  # a drafting round's account, in its order


def round_costs(summary, t_step: float | None, speedup: float | None) -> dict:
    """What a round costs in target steps and how much of the speedup the costs explain (DEFINITIONS)."""
    round_s = summary.round_s_per_round  # over the drafting rounds, as the draft and verify costs
    if not t_step or round_s is None:
        return {"t_step_s": t_step, **{f"{p}_per_step": None for p in PROFILE_PARTS}, "round_per_step": None,
                "ideal_speedup": None, "speedup_vs_ideal": None}
    ideal = summary.tau * t_step / round_s if summary.tau and round_s else None
    return {"t_step_s": t_step, **{f"{p}_per_step": (getattr(summary, f"{p}_s_per_round") or 0.0) / t_step
                                   for p in PROFILE_PARTS},
            "round_per_step": round_s / t_step,
            "ideal_speedup": ideal, "speedup_vs_ideal": speedup / ideal if speedup and ideal else None}


def profile_table(report: dict) -> Table | None:
    """`bench --profile`: where each pdraft run's drafting round goes, in ms per round, target steps and share of
    the round (an engine's rows carry no per-round times and are left out). None when no run was timed."""
    rows = [r for r in report["runs"] if not r.get("engine") and r["summary"].get("round_s_per_round")
            and r["summary"].get("host_s_per_round") is not None]
    if not rows:
        return None
    table = Table(title="round account: ms per drafting round (target steps, share of the round)",
                  caption="draft = propose + the drafter's context extension · verify = the target's pass · accept = "
                          "the acceptance test · commit = the target's cache commit · host = the rest of the round "
                          "(outputs, stop checks, records) · steps = / the domain's target-alone step",
                  caption_justify="left")
    for name in ("domain", "drafter", "γ", "T", "round", *PROFILE_PARTS):
        table.add_column(name, justify="left" if name in ("domain", "drafter") else "right")
    for r in rows:
        s, whole = r["summary"], r["summary"]["round_s_per_round"]
        cells = []
        for part in PROFILE_PARTS:
            sec, steps = s.get(f"{part}_s_per_round"), r.get(f"{part}_per_step")
            cells.append(_cost(sec, steps) + ("" if sec is None else f" {100 * sec / whole:.0f}%"))
        table.add_row(r["domain"], r["drafter"], str(r["gamma"]) if r["gamma"] else "-",
                      f"{r.get('temperature', 0.0):g}", _cost(whole, r.get("round_per_step")), *cells)
    return table


def recommend(runs: list[dict]) -> list[dict]:
    """Per (drafter, domain, temperature): (a) the gamma with the best measured speedup; (b) the largest gamma
    whose token acceptance stays at or above 60% (the seed article's rule). Either may be None (no timing; every
    gamma below 60%). Each names the temperature it holds for: acceptance, and so the best gamma, differ."""
    groups: dict[tuple[str, str, float], list[dict]] = {}
    for run in runs:
        if run["gamma"] > 0:  # a baseline (gamma 0) drafts nothing
            groups.setdefault((run["drafter"], run["domain"], run.get("temperature", 0.0)), []).append(run)
    out = []
    for (drafter, domain, temperature), rows in groups.items():
        timed = [r for r in rows if r["speedup"] is not None]
        best = max(timed, key=lambda r: (r["speedup"], -r["gamma"]), default=None)
        healthy = [r for r in rows if (r["summary"]["token_acceptance"] or 0.0) >= ACCEPTANCE_RULE]
        largest = max(healthy, key=lambda r: r["gamma"], default=None)
        out.append({
            "drafter": drafter, "domain": domain, "temperature": temperature,
            "best_speedup": None if best is None else {"gamma": best["gamma"], "speedup": best["speedup"]},
            "acceptance_rule": None if largest is None else {
                "gamma": largest["gamma"], "token_acceptance": largest["summary"]["token_acceptance"],
                "threshold": ACCEPTANCE_RULE},
        })
    return out


def write_report(report: dict, folder: str | Path) -> Path:
    import json

    path = Path(folder) / "bench.json"
    ledger.write_text(path, json.dumps(report, indent=1) + "\n")  # its folder is made, never through a link
    return path


# ------------------------------------------------------------------------------------------ tables


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def _num(v, digits=2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _ms(v) -> str:
    return "-" if v is None else f"{1000 * v:.2f}"


def _positions(values, shown: int = 4) -> str:
    text = " ".join("-" if v is None else f"{100 * v:.0f}" for v in values[:shown])
    return text + (" …" if len(values) > shown else "")


def gamma_text(gammas: list[int]) -> str:
    """[12, 17, 18, 19, 20] -> '12, 17..20' (the --gamma syntax)."""
    parts, run = [], []
    for g in sorted(gammas):
        if run and g != run[-1] + 1:
            parts.append(run)
            run = []
        run.append(g)
    if run:
        parts.append(run)
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}..{r[-1]}" for r in parts)


def skip_notes(report: dict) -> list[str]:
    """One line per drafter that skipped part of the sweep: which gammas, and its largest."""
    return [f"{d['label']} skipped γ {gamma_text(d['skipped_gammas'])}: {BEYOND_BLOCK} (drafts at most "
            f"{d['max_gamma']})" for d in report.get("drafters", []) if d.get("skipped_gammas")]


def _temperatures(report: dict) -> list[float]:
    return report["settings"].get("temperatures") or [report["settings"].get("temperature", 0.0)]


def print_report(report: dict, console: Console, profile: bool = False) -> None:
    """The bench's tables; `profile`: also the round account (profile_table)."""
    temps = _temperatures(report)
    for domain in report["domains"]:
        for t in temps:
            rows = [r for r in report["runs"] if r["domain"] == domain["name"] and r.get("temperature", t) == t]
            skipped = [x for x in report.get("skipped", []) if x["domain"] == domain["name"]
                       and x.get("temperature", t) == t]
            console.print(_domain_table(domain, rows, report["settings"], skipped,
                                        skip_notes(report) + report.get("refused", []),
                                        temperature=t if len(temps) > 1 else None))
        rows = [r for r in report["runs"] if r["domain"] == domain["name"]]
        skipped = [x for x in report.get("skipped", []) if x["domain"] == domain["name"]]
        pivot = _pivot_table(domain["name"], rows, skipped, temps)
        if pivot is not None:
            console.print(pivot)
    trees = _tree_table(report)
    if trees is not None:
        console.print(trees)
    console.print(_recommendation_table(report["recommendations"]))
    if report.get("draft_cost"):
        console.print(draft_cost.table(report))
    if report.get("winners"):
        console.print(draft_cost.winners_table(report))
    if profile and (account := profile_table(report)) is not None:
        console.print(account)
    for t in temps:
        note = report["settings"].get("sampling_by_temperature", {}).get(f"{t:g}", report["settings"]["sampling"])
        console.print(styled("[dim]sampling: {}[/]", note))
    if report.get("runtime"):
        console.print(styled("[dim]{}[/]", runtime_line(report["runtime"])))


def _speedup(run: dict) -> str:
    """The speedup with its spread over the repeats where there were several: 2.10x (1.93-2.33)."""
    low_high = run.get("speedup_range")
    return _num(run["speedup"]) + "x" + (f" ({low_high[0]:.2f}-{low_high[1]:.2f})" if low_high else "")


def _domain_table(domain: dict, rows: list[dict], settings: dict, skipped: list[dict] = (),
                  notes: list[str] = (), temperature: float | None = None) -> Table:
    skipped_lines = f", {len(domain['skipped_lines'])} malformed lines skipped" if domain["skipped_lines"] else ""
    if temperature is not None:
        n = settings.get("num_prompts_by_temperature", {}).get(f"{temperature:g}")
        skipped_lines += f"; T={temperature:g}" + (f", its first {n}" if n is not None and n < domain["prompts"] else "")
    columns = ("drafter", "γ", "tau", "token acc", "block acc", "verif util", "cond acc k=1..4 %", "TPOT ms",
               "draft ms (steps)", "verify ms (steps)", "speedup", "vs ideal")
    base = next((r["baseline"] for r in rows if r.get("baseline")), None)
    table = Table(title=f"{domain['name']} ({domain['source']}: {domain['prompts']} prompts, "
                        f"{settings['max_new_tokens']} new tokens{skipped_lines}; speedups vs {base or '-'})",
                  caption="\n".join([FOOTER, *_run_notes(rows), *notes]), caption_justify="left")
    for name in columns:
        table.add_column(name, justify="left" if name in ("drafter", "cond acc k=1..4 %") else "right")
    by_drafter: dict[str, list[dict]] = {}
    for r in rows:
        by_drafter.setdefault(r["drafter"], []).append(r)
    for drafter, runs in by_drafter.items():
        for r in runs:
            s = r["summary"]
            table.add_row(r["drafter"], str(r["gamma"]) if r["gamma"] else "-", _num(s["tau"]),
                          _pct(s["token_acceptance"]), _pct(s["block_acceptance"]),
                          _pct(s["verification_utilization"]), _positions(s["conditional_acceptance"]),
                          _ms(s["tpot_s"]), _cost(s["draft_s_per_round"], r.get("draft_per_step")),
                          _cost(s["verify_s_per_round"], r.get("verify_per_step")), _speedup(r),
                          _num(r.get("speedup_vs_ideal")))
        gone = [x["gamma"] for x in skipped if x["drafter"] == drafter]
        if gone:  # one row for the drafter's skipped gammas, right under its measured ones
            table.add_row(drafter, gamma_text(gone), BEYOND_BLOCK, *["-"] * (len(columns) - 3))
    return table


def _cost(seconds, steps) -> str:
    return "-" if seconds is None else f"{1000 * seconds:.2f}" + ("" if steps is None else f" ({steps:.2f})")


def _run_notes(rows: list[dict]) -> list[str]:
    """Which backend ran, what compiling cost (kept out of TPOT: the compiled code serves every later request
    of the process), and whether generate() gave the target-alone run's tokens."""
    notes = []
    backends = sorted({r["backend"] for r in rows if r.get("backend")})
    compiled = sum(r.get("compile_s") or 0.0 for r in rows)
    if backends:
        notes.append(f"backend: {', '.join(backends)}" + (
            f"; compiling took {compiled:.1f} s, reported here and kept out of every TPOT (the compiled code serves "
            "every later request of the process)" if compiled else "; nothing compiled"))
    engines = sorted({r["engine"] for r in rows if r.get("engine")})
    if engines:
        notes.append(ENGINE_NOTE.format(engines=", ".join(engines)))
    for r in rows:
        if r["gamma"] == 0 and r.get("kind") == "generate":
            notes.append(f"{r['drafter']}: first token (its prefill) left out of its timings")
        if r["gamma"] == 0 and r.get("dtype"):
            loop = "transformers' generate()" if r.get("kind") == "generate" else "pdraft's loop"
            notes.append(f"{r['drafter']}: {loop} on a {r['dtype']} copy of the target (bench.float32_baseline), a "
                         "speedup reference like the others; its outputs are not compared, another dtype rounds otherwise")
    notes.extend(greedy_notes(rows))
    return notes


def greedy_notes(rows: list[dict]) -> list[str]:
    """The greedy check, one line per verdict: identical to the target alone; different only at near-ties of the
    run's dtype (pdraft.decode.greedy_audit: the engines' convention, lossless up to hardware numerics); or a loss,
    which fails the check. The reference is each engine's first baseline (pdraft's target alone; a serving engine
    without speculation); a second baseline (generate()) is checked like a drafter."""
    checked = [r for r in rows if r.get("same_as_target") is not None]
    if not checked:
        return []
    label = lambda r: r["drafter"] + (f" γ{r['gamma']}" if r["gamma"] else "")  # noqa: E731
    same = [r for r in checked if r["same_as_target"]]
    ties = [r for r in checked if not r["same_as_target"] and _verdict(r) == "rounding"]
    lost = [r for r in checked if not r["same_as_target"] and _verdict(r) != "rounding"]
    notes = []
    if same:
        notes.append(f"greedy outputs of {'all ' if len(same) == len(checked) else ''}{len(same)}"
                     f"{'' if len(same) == len(checked) else f' of {len(checked)}'} checked runs identical to the "
                     "target alone, token for token")
    if ties:
        worst = max((d for r in ties for d in r["divergences"]), key=lambda d: max(d["ours_gap"], d["reference_gap"]))
        notes.append(f"{', '.join(label(r) for r in ties)}: outputs differ from the target alone only at near-ties of "
                     f"the run's dtype ({sum(len(r['divergences']) for r in ties)} request(s); at each first differing "
                     f"token both choices are within the float64 target's rounding reach, widest gap "
                     f"{max(worst['ours_gap'], worst['reference_gap']):.3g} against a rounding error of "
                     f"{worst['rounding_error']:.3g}): lossless up to hardware numerics, the engines' convention "
                     "(docs/DECODE.md)")
    if lost:
        notes.append("LOSSLESS CHECK FAILED, outputs DIFFERENT from the target alone, not explained by rounding: "
                     + ", ".join(label(r) for r in lost))
    return notes


def _verdict(row: dict) -> str:
    divergences = row.get("divergences")
    if not divergences:
        return "unaudited"
    return "rounding" if all(d["rounding"] for d in divergences) else "loss"


def _pivot_table(domain: str, rows: list[dict], skipped: list[dict] = (), temps: list[float] = (0.0,)
                 ) -> Table | None:
    """tau (speedup) by gamma with one column per drafter, and per temperature when the sweep ran several (T=0
    and T=1 side by side): the DFlash-vs-DSpark comparison at a glance."""
    drafters = list(dict.fromkeys(r["drafter"] for r in rows if r["gamma"] > 0))
    if not drafters:
        return None
    first = temps[0]
    beyond = {(x["drafter"], x["gamma"], x.get("temperature", first)) for x in skipped}
    several = len(temps) > 1
    table = Table(title=f"{domain}: tau (speedup) by gamma" + (", T=" + " | T=".join(f"{t:g}" for t in temps)
                                                                if several else ""))
    table.add_column("γ", justify="right")
    for d in drafters:
        for t in temps:
            table.add_column(f"{d} T={t:g}" if several else d, justify="right")
    for gamma in sorted({r["gamma"] for r in rows if r["gamma"]} | {g for _, g, _ in beyond}):
        cells = []
        for d in drafters:
            for t in temps:
                run = next((r for r in rows if r["drafter"] == d and r["gamma"] == gamma
                            and r.get("temperature", first) == t), None)
                if run is not None:
                    cells.append(f"{_num(run['summary']['tau'])} ({_num(run['speedup'])}x)")
                else:
                    cells.append(BEYOND_BLOCK if (d, gamma, t) in beyond else "-")
        table.add_row(str(gamma), *cells)
    return table


def _tree_table(report: dict) -> Table | None:
    """Each tree run beside the same drafter's chain at the same domain and gamma: tau, verify ms per round and
    speedup, chain -> tree, with the tree / chain ratio of tau and of speedup."""
    pairs = [(d["chain"], d["label"], d["tree"]) for d in report.get("drafters", []) if d.get("tree")]
    if not pairs:
        return None
    table = Table(title="trees beside their chains (same drafter, domain and gamma)",
                  caption="tau and speedup ratios are tree / chain; verify ms = the target's verify pass per "
                          "drafting round", caption_justify="left")
    for name in ("domain", "drafter", "tree", "T", "γ", "tau chain -> tree", "ratio", "verify ms chain -> tree",
                 "speedup chain -> tree", "ratio "):
        table.add_column(name, justify="left" if name in ("domain", "drafter", "tree") else "right")
    # one row per temperature too: a T=0 | T=1 bench runs every tree at both, beside the chain at the same T
    runs = {(r["domain"], r["drafter"], r["gamma"], r.get("temperature", 0.0)): r for r in report["runs"]}
    for chain, label, (nodes, width) in pairs:
        for (domain, drafter, gamma, temperature), tr in runs.items():
            ch = runs.get((domain, chain, gamma, temperature))
            if drafter != label or ch is None:
                continue
            a, b = ch["summary"], tr["summary"]

            def ratio(x, y):
                return "-" if x in (None, 0) or y is None else f"{y / x:.2f}"

            table.add_row(domain, chain, f"{nodes}x{width}", f"{temperature:g}", str(gamma),
                          f"{_num(a['tau'])} -> {_num(b['tau'])}",
                          ratio(a["tau"], b["tau"]),
                          f"{_cost(a['verify_s_per_round'], None)} -> {_cost(b['verify_s_per_round'], None)}",
                          f"{_num(ch['speedup'])}x -> {_num(tr['speedup'])}x", ratio(ch["speedup"], tr["speedup"]))
    return table


def _recommendation_table(recs: list[dict]) -> Table:
    table = Table(title="recommended gamma", caption=(
        f"best speedup = the gamma with the highest measured speedup; acceptance rule = the largest gamma whose "
        f"token acceptance stays >= {ACCEPTANCE_RULE:.0%} (the seed article's rule)"), caption_justify="left")
    for name in ("domain", "drafter", "temperature", "by best speedup", "by acceptance >= 60%"):
        table.add_column(name)
    for rec in recs:
        best, rule = rec["best_speedup"], rec["acceptance_rule"]
        t = rec.get("temperature", 0.0)
        table.add_row(
            rec["domain"], rec["drafter"], f"T={t:g}" + (" (greedy)" if t == 0 else " (sampled)"),
            "-" if best is None else f"γ={best['gamma']} ({best['speedup']:.2f}x)",
            "none reaches 60%" if rule is None else f"γ={rule['gamma']} ({rule['token_acceptance']:.0%})",
        )
    return table
