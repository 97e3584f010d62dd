"""The latency equation, measured: what a round's drafting costs against gamma for every contender of a sweep,
and which drafter wins each domain. From a bench report's runs (the drafter's seconds of each drafting round, a
batched round counted once, their median: one stall of a shared machine, a round of 0.66 s among two hundred of
10 ms, moved a mean by 30%; the summary's mean where a run carries no rounds) it fits ``draft(γ) = a + b·γ`` by least squares per (drafter, domain), so `b` is
the measured cost of one more drafted token: about one drafter pass for an autoregressive drafter (EAGLE-3's
chain), close to nothing for a parallel one, whose single pass drafts the whole block. It also states the ratio
of the draft time at the sweep's largest gamma to its smallest (20 against 4 in the quickstart's sweep). The winners are
the (drafter, gamma) with the best measured speedup per domain, with the family's drafting mode, so the
recommendation says which family pays on this target by measurement, not by rule. Torch-free, read from the
report dict only, like the tables and plots."""

from __future__ import annotations

import statistics
from pathlib import Path

from pdraft.metrics import RoundRecord, drafting_rounds
from pdraft.models.families import FAMILIES

def drafting_mode(kind: str) -> str:
    """"parallel" | "autoregressive" for a registered family; "lookup" for the n-gram baseline."""
    return FAMILIES.get(kind).drafting if kind in FAMILIES.kinds else "lookup"


def fit_line(points: list[tuple[float, float]]) -> tuple[float, float] | None:
    """(intercept, slope) of the least-squares line through (x, y) points; None with fewer than two x values."""
    if len({x for x, _ in points}) < 2:
        return None
    n = len(points)
    mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    slope = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)
    return my - slope * mx, slope


def draft_ms(run: dict) -> float:
    """The run's draft ms per round: the median over its drafting rounds (gamma > 0, each batched round once) of
    the drafter's seconds, from its `rounds` (pdraft.bench.report: ROUND_FIELDS order); without rounds, the
    summary's mean (pdraft.metrics)."""
    records = [RoundRecord(*row) for row in run.get("rounds") or ()]
    if any(r.gamma > 0 for r in records):
        timed = drafting_rounds(records)
        return 1000 * statistics.median(r.draft_s for r in timed)
    return 1000 * run["summary"]["draft_s_per_round"]


def draft_costs(runs: list[dict]) -> list[dict]:
    """One entry per (drafter, domain): draft ms per round at each gamma, the fitted intercept and cost per
    drafted token (ms), and the ratio of the largest gamma's draft time to the smallest's."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for run in runs:
        if run["gamma"] > 0 and run["summary"].get("draft_s_per_round") is not None:  # baselines draft nothing
            groups.setdefault((run["drafter"], run["domain"]), []).append(run)
    out = []
    for (drafter, domain), rows in groups.items():
        rows = sorted(rows, key=lambda r: r["gamma"])
        ms = {r["gamma"]: draft_ms(r) for r in rows}
        fit = fit_line(list(ms.items()))
        lo, hi = min(ms), max(ms)
        out.append({"drafter": drafter, "domain": domain, "kind": rows[0]["kind"],
                    "drafting": drafting_mode(rows[0]["kind"]), "draft_ms_per_round": {str(g): v for g, v in ms.items()},
                    "intercept_ms": None if fit is None else fit[0], "ms_per_drafted_token": None if fit is None else fit[1],
                    "ratio": {"gammas": [hi, lo], "value": ms[hi] / ms[lo] if ms[lo] > 0 and hi != lo else None}})
    return out


def winners(runs: list[dict]) -> list[dict]:
    """Per domain, the drafter and gamma with the best measured speedup, and its family's drafting mode."""
    best: dict[str, dict] = {}
    for run in runs:
        if run["gamma"] == 0 or run.get("speedup") is None:
            continue
        cur = best.get(run["domain"])
        if cur is None or (run["speedup"], -run["gamma"]) > (cur["speedup"], -cur["gamma"]):
            best[run["domain"]] = run
    return [{"domain": d, "drafter": r["drafter"], "kind": r["kind"], "drafting": drafting_mode(r["kind"]),
             "gamma": r["gamma"], "speedup": r["speedup"], "tau": r["summary"]["tau"]} for d, r in best.items()]


def table(report: dict):
    """The rich table of the draft cost per drafter and domain (draft ms per round by gamma and the fit)."""
    from rich.table import Table

    costs = report.get("draft_cost") or []
    gammas = sorted({int(g) for c in costs for g in c["draft_ms_per_round"]})
    t = Table(title="draft time per round against gamma (ms): the latency equation", caption=(
        "fit: draft ms = a + b·γ by least squares over the sweep; b = measured cost of one more drafted token; "
        "ratio = draft ms at the largest γ / at the smallest"), caption_justify="left")
    for name in ("domain", "drafter", "drafting", *[f"γ={g}" for g in gammas], "a ms", "b ms/token", "ratio"):
        t.add_column(name, justify="left" if name in ("domain", "drafter", "drafting") else "right")
    for c in costs:
        cells = [c["draft_ms_per_round"].get(str(g)) for g in gammas]
        ratio = c["ratio"]
        t.add_row(c["domain"], c["drafter"], c["drafting"], *["-" if v is None else f"{v:.2f}" for v in cells],
                  "-" if c["intercept_ms"] is None else f"{c['intercept_ms']:.2f}",
                  "-" if c["ms_per_drafted_token"] is None else f"{c['ms_per_drafted_token']:.3f}",
                  "-" if ratio["value"] is None else f"{ratio['value']:.2f} (γ{ratio['gammas'][0]}/γ{ratio['gammas'][1]})")
    return t


def winners_table(report: dict):
    from rich.table import Table

    t = Table(title="which drafter wins each domain (best measured speedup of the sweep)")
    for name in ("domain", "drafter", "family", "drafting", "γ", "tau", "speedup"):
        t.add_column(name)
    for w in report.get("winners") or []:
        domain = w["domain"] + (f" (T={w['temperature']:g})" if "temperature" in w else "")
        t.add_row(domain, w["drafter"], w["kind"], w["drafting"], str(w["gamma"]), f"{w['tau']:.2f}",
                  f"{w['speedup']:.2f}x")
    return t


def plot(report: dict, folder: str | Path, pyplot, save_figure) -> Path | None:
    """draft_time.png: draft ms per round against gamma, one panel per domain, one line per drafter with its
    fitted line dashed (autoregressive drafters climb with gamma, parallel ones stay flat)."""
    costs = report.get("draft_cost") or []
    domains = list(dict.fromkeys(c["domain"] for c in costs))
    if not domains:
        return None
    plt = pyplot()
    fig, axes = plt.subplots(1, len(domains), figsize=(5 * len(domains), 3.8), squeeze=False)
    for ax, domain in zip(axes[0], domains):
        for c in (c for c in costs if c["domain"] == domain):
            xs = sorted(int(g) for g in c["draft_ms_per_round"])
            (line,) = ax.plot(xs, [c["draft_ms_per_round"][str(g)] for g in xs], marker="o",
                              label=f"{c['drafter']} ({c['drafting']})")
            if c["ms_per_drafted_token"] is not None:
                ax.plot(xs, [c["intercept_ms"] + c["ms_per_drafted_token"] * g for g in xs], linestyle="--",
                        color=line.get_color(), linewidth=1)
        ax.set_title(domain)
        ax.set_xlabel("γ (draft length)")
        ax.set_ylabel("draft ms per round")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return save_figure(fig, Path(folder) / "draft_time.png", dpi=110)


__all__ = ["draft_costs", "winners", "fit_line", "drafting_mode", "table", "winners_table", "plot"]
