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
from typing import Annotated, Any, Literal

from pydantic import Field
from rich.console import Console
from rich.table import Table

from pdraft.bench.sweep import BenchResult, skipped_gammas
from pdraft.bench.stream import ROUND_FIELDS
from pdraft import ledger
from pdraft.models.family import MAX_GAMMA
from pdraft.readback import FileKind, Schema

SCHEMA = "pdraft.bench/1"
_Share = Annotated[float, Field(ge=0, le=1)]


class _RunSummary(Schema):
    tau: Annotated[float, Field(ge=0, le=MAX_GAMMA + 1)] | None
    token_acceptance: _Share | None = None


class _Run(Schema):
    domain: str
    drafter: str
    kind: str
    gamma: int = Field(ge=0, le=MAX_GAMMA)  # 0: the target alone
    summary: _RunSummary
    speedup: Annotated[float, Field(gt=0, le=1e6)] | None = None


class BenchReport(Schema):
    """What a bench.json read back must hold (the model card reads it when it is pushed; pull checks a copied
    one): pdraft's schema tag and the measured runs, each figure typed, in range and finite."""

    schema_: Literal["pdraft.bench/1"] = Field(alias="schema")
    runs: list[_Run] = Field(max_length=1_000_000)
    machine: dict[str, Any] | None = None


BENCH_REPORT = FileKind("bench report", 256 << 20, BenchReport)
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
    "draft_s_per_round, verify_s_per_round": "drafter and target-verify seconds per round (a batched round counts once)",
    "speedup": "TPOT(target alone) / TPOT(this run), same prompts, same sweep",
    "skipped": f"a gamma of the sweep larger than a drafter's block size: {BEYOND_BLOCK}, not decoded",
}
FOOTER = ("tau = mean(a+1) incl. bonus token · token acc = Σa/Σl · block acc = P(a=γ) · verif util = Σl/Σγ · "
          "cond acc k = P(k | 1..k-1) · TPOT = decode time / generated token (per request, mean) · "
          "speedup = TPOT(target alone) / TPOT, same run · draft/verify = ms per round")


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


def build_report(result: BenchResult, *, recipe: dict | None = None, machine: dict | None = None,
                 target: str | None = None) -> dict:
    s = result.settings
    d = s.decode  # the sweep's decode settings
    runs = [{
        "domain": r.domain, "drafter": r.drafter, "kind": r.kind, "gamma": r.gamma, "verify": r.verify,
        "summary": r.summary.to_dict(), "speedup": r.speedup, "tpot_repeats_s": r.tpot_repeats_s,
        "kept_repeat": r.kept_repeat, "finish_reasons": r.finish_reasons,
        "rounds": [[getattr(rec, name) for name in ROUND_FIELDS] for rec in r.records],
    } for r in result.runs]
    return {
        "schema": SCHEMA,
        "target": target,
        "definitions": DEFINITIONS,
        "round_fields": list(ROUND_FIELDS),
        "settings": {
            "gammas": s.gammas, "num_prompts": s.num_prompts, "max_new_tokens": d.max_new_tokens,
            "temperature": d.sampling.temperature, "top_k": d.sampling.top_k, "top_p": d.sampling.top_p,
            "sampling": sampling_note(d.sampling), "seed": d.seed, "batch_size": d.batch_size,
            "repeats": s.repeats, "verify": s.verify.mode if s.verify is not None else s.decode.verify,
        },
        "domains": [{"name": d.name, "source": d.source, "prompts": len(d.prompts),
                     "skipped_lines": d.skipped_lines} for d in result.domains],
        "drafters": [{"label": c.label, "kind": c.kind, "path": c.path, "max_gamma": c.max_gamma,
                      "skipped_gammas": skipped_gammas(c, s.gammas)} for c in result.contenders],
        "runs": runs,
        # The sweep's (domain, drafter, gamma) that were not decoded, and why; never mixed into `runs`, whose
        # every entry carries measured figures.
        "skipped": [{"domain": d.name, "drafter": c.label, "kind": c.kind, "gamma": g, "reason": BEYOND_BLOCK,
                     "max_gamma": c.max_gamma}
                    for d in result.domains for c in result.contenders for g in skipped_gammas(c, s.gammas)],
        "recommendations": recommend(runs),
        "recipe": recipe,
        "machine": machine if machine is not None else machine_info(),
    }


def recommend(runs: list[dict]) -> list[dict]:
    """Per (drafter, domain): (a) the gamma with the best measured speedup; (b) the largest gamma whose token
    acceptance stays at or above 60% (the seed article's rule). Either may be None (no timing; every gamma
    below 60%)."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for run in runs:
        if run["kind"] != "target":
            groups.setdefault((run["drafter"], run["domain"]), []).append(run)
    out = []
    for (drafter, domain), rows in groups.items():
        timed = [r for r in rows if r["speedup"] is not None]
        best = max(timed, key=lambda r: (r["speedup"], -r["gamma"]), default=None)
        healthy = [r for r in rows if (r["summary"]["token_acceptance"] or 0.0) >= ACCEPTANCE_RULE]
        largest = max(healthy, key=lambda r: r["gamma"], default=None)
        out.append({
            "drafter": drafter, "domain": domain,
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


def print_report(report: dict, console: Console) -> None:
    for domain in report["domains"]:
        rows = [r for r in report["runs"] if r["domain"] == domain["name"]]
        skipped = [x for x in report.get("skipped", []) if x["domain"] == domain["name"]]
        console.print(_domain_table(domain, rows, report["settings"], skipped, skip_notes(report)))
        pivot = _pivot_table(domain["name"], rows, skipped)
        if pivot is not None:
            console.print(pivot)
    console.print(_recommendation_table(report["recommendations"]))
    console.print(f"[dim]sampling: {report['settings']['sampling']}[/]")


def _domain_table(domain: dict, rows: list[dict], settings: dict, skipped: list[dict] = (),
                  notes: list[str] = ()) -> Table:
    skipped_lines = f", {len(domain['skipped_lines'])} malformed lines skipped" if domain["skipped_lines"] else ""
    columns = ("drafter", "γ", "tau", "token acc", "block acc", "verif util", "cond acc k=1..4 %", "TPOT ms",
               "draft ms/round", "verify ms/round", "speedup")
    table = Table(title=f"{domain['name']} ({domain['source']}: {domain['prompts']} prompts, "
                        f"{settings['max_new_tokens']} new tokens{skipped_lines})",
                  caption="\n".join([FOOTER, *notes]), caption_justify="left")
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
                          _ms(s["tpot_s"]), _ms(s["draft_s_per_round"]), _ms(s["verify_s_per_round"]),
                          _num(r["speedup"]) + "x")
        gone = [x["gamma"] for x in skipped if x["drafter"] == drafter]
        if gone:  # one row for the drafter's skipped gammas, right under its measured ones
            table.add_row(drafter, gamma_text(gone), BEYOND_BLOCK, *["-"] * (len(columns) - 3))
    return table


def _pivot_table(domain: str, rows: list[dict], skipped: list[dict] = ()) -> Table | None:
    """tau (speedup) by gamma with one column per drafter: the DFlash-vs-DSpark comparison at a glance."""
    drafters = list(dict.fromkeys(r["drafter"] for r in rows if r["kind"] != "target"))
    if not drafters:
        return None
    beyond = {(x["drafter"], x["gamma"]) for x in skipped}
    table = Table(title=f"{domain}: tau (speedup) by gamma")
    table.add_column("γ", justify="right")
    for d in drafters:
        table.add_column(d, justify="right")
    for gamma in sorted({r["gamma"] for r in rows if r["gamma"]} | {g for _, g in beyond}):
        cells = []
        for d in drafters:
            run = next((r for r in rows if r["drafter"] == d and r["gamma"] == gamma), None)
            if run is not None:
                cells.append(f"{_num(run['summary']['tau'])} ({_num(run['speedup'])}x)")
            else:
                cells.append(BEYOND_BLOCK if (d, gamma) in beyond else "-")
        table.add_row(str(gamma), *cells)
    return table


def _recommendation_table(recs: list[dict]) -> Table:
    table = Table(title="recommended gamma", caption=(
        f"best speedup = the gamma with the highest measured speedup; acceptance rule = the largest gamma whose "
        f"token acceptance stays >= {ACCEPTANCE_RULE:.0%} (the seed article's rule)"), caption_justify="left")
    for name in ("domain", "drafter", "by best speedup", "by acceptance >= 60%"):
        table.add_column(name)
    for rec in recs:
        best, rule = rec["best_speedup"], rec["acceptance_rule"]
        table.add_row(
            rec["domain"], rec["drafter"],
            "-" if best is None else f"γ={best['gamma']} ({best['speedup']:.2f}x)",
            "none reaches 60%" if rule is None else f"γ={rule['gamma']} ({rule['token_acceptance']:.0%})",
        )
    return table
