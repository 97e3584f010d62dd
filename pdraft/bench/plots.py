"""Plots of a bench report (matplotlib, Agg backend, PNG files next to bench.json), drawn from the report dict
only: tau and speedup against gamma per drafter and domain; per-position conditional acceptance at the largest
gamma (the DSpark paper's Figure 2: one panel per domain, one line per drafter); token acceptance against gamma
with the seed article's 60% line, so the gammas that fall below it stand out; draft time per round against
gamma with each drafter's fitted line (pdraft.bench.draft_cost). Gammas of the sweep beyond a
drafter's block size (the report's `skipped`) are marked with an x on the gamma axis in that drafter's colour,
labelled "beyond block size", so a line that stops early is not read as a missing measurement.
"""

from __future__ import annotations

from pathlib import Path

from pdraft.bench import draft_cost
from pdraft.bench.report import ACCEPTANCE_RULE, BEYOND_BLOCK, primary_runs
from pdraft.paths import make_dir
from pdraft.plotting import pyplot, save_figure


def _series(report: dict, domain: str, key):
    """{drafter: (gammas, values)} for the non-target runs of a domain; key(run) -> value or None."""
    out: dict[str, tuple[list[int], list[float | None]]] = {}
    for run in report["runs"]:
        if run["domain"] == domain and run["gamma"] > 0:  # baselines (gamma 0) draft nothing
            gammas, values = out.setdefault(run["drafter"], ([], []))
            gammas.append(run["gamma"])
            values.append(key(run))
    return out


def _skipped(report: dict, domain: str) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for x in report.get("skipped", []):
        if x["domain"] == domain:
            out.setdefault(x["drafter"], []).append(x["gamma"])
    return out


def _plot_lines(ax, series, ylabel: str, skipped: dict[str, list[int]] | None = None) -> None:
    colours = {}
    for drafter, (gammas, values) in series.items():
        pts = [(g, v) for g, v in zip(gammas, values) if v is not None]
        if pts:
            (line,) = ax.plot([g for g, _ in pts], [v for _, v in pts], marker="o", label=drafter)
            colours[drafter] = line.get_color()
    for drafter, gammas in (skipped or {}).items():
        # x in data units, y in axes units: the marks sit on the gamma axis whatever the value range.
        ax.plot(gammas, [0.03] * len(gammas), linestyle="none", marker="x", color=colours.get(drafter, "grey"),
                transform=ax.get_xaxis_transform(), clip_on=False, label=f"{drafter}: {BEYOND_BLOCK}")
    ax.set_xlabel("γ (draft length)")
    ax.set_ylabel(ylabel)
    _integer_ticks(ax)
    ax.grid(alpha=0.3)


def write_plots(report: dict, folder: str | Path) -> list[Path]:
    """The gamma sweep's plots, at its first temperature (bench.json and the tables hold every temperature)."""
    plt = pyplot()
    runs = primary_runs(report)
    temps = {r.get("temperature") for r in runs}
    report = {**report, "runs": runs,
              "skipped": [x for x in report.get("skipped", []) if x.get("temperature") in temps | {None}]}

    folder = Path(folder)
    make_dir(folder, "bench report folder")
    domains = [d["name"] for d in report["domains"]]
    if not any(r["gamma"] > 0 for r in report["runs"]):
        return []
    paths = []
    n = len(domains)

    fig, axes = plt.subplots(2, n, figsize=(5 * n, 7), squeeze=False)
    for i, domain in enumerate(domains):
        skipped = _skipped(report, domain)
        _plot_lines(axes[0][i], _series(report, domain, lambda r: r["summary"]["tau"]), "tau (incl. bonus token)",
                    skipped)
        axes[0][i].set_title(domain)
        _plot_lines(axes[1][i], _series(report, domain, lambda r: r["speedup"]), "speedup vs faster target alone",
                    skipped)
        axes[1][i].axhline(1.0, color="grey", linestyle=":", linewidth=1)
    axes[0][0].legend(fontsize=8)
    paths.append(save_figure(fig, folder / "tau_speedup.png", dpi=110))

    fig, axes = plt.subplots(1, n, figsize=(5 * n, 3.8), squeeze=False)
    for i, domain in enumerate(domains):
        ax = axes[0][i]
        for drafter, (gammas, _) in _series(report, domain, lambda r: None).items():
            run = max((r for r in report["runs"] if r["domain"] == domain and r["drafter"] == drafter),
                      key=lambda r: r["gamma"])
            cond = run["summary"]["conditional_acceptance"]
            pts = [(k + 1, v) for k, v in enumerate(cond) if v is not None]
            if pts:
                ax.plot([k for k, _ in pts], [v for _, v in pts], marker="o", label=f"{drafter} (γ={run['gamma']})")
        ax.set_title(domain)
        ax.set_xlabel("draft position k")
        _integer_ticks(ax)
        ax.set_ylabel("conditional acceptance P(k | 1..k-1)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    paths.append(save_figure(fig, folder / "conditional_acceptance.png", dpi=110))

    fig, axes = plt.subplots(1, n, figsize=(5 * n, 3.8), squeeze=False)
    for i, domain in enumerate(domains):
        ax = axes[0][i]
        _plot_lines(ax, _series(report, domain, lambda r: r["summary"]["token_acceptance"]), "token acceptance",
                    _skipped(report, domain))
        ax.axhline(ACCEPTANCE_RULE, color="red", linestyle="--", linewidth=1, label="60% (article's rule)")
        ax.axhspan(0.0, ACCEPTANCE_RULE, color="red", alpha=0.06)
        ax.set_ylim(0.0, 1.02)
        ax.set_title(domain)
        ax.legend(fontsize=8)
    paths.append(save_figure(fig, folder / "token_acceptance.png", dpi=110))
    drafting = draft_cost.plot(report, folder, pyplot, save_figure)  # draft ms per round against gamma
    if drafting is not None:
        paths.append(drafting)
    return paths


def _integer_ticks(ax) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


PARETO_FILE = "pareto.png"


def pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The points no other point beats on both axes (per-user x, total y), by increasing x."""
    front = []
    for x, y in sorted(points, key=lambda p: (-p[0], -p[1])):  # from the fastest per user down
        if not front or y > front[-1][1]:
            front.append((x, y))
    return sorted(front)


def write_pareto(report: dict, folder: str | Path) -> Path | None:
    """The serving sweep's Pareto plot (pdraft.bench.serving): per-user tokens/s on x, total tokens/s on y, one
    panel per temperature; every measured point of a contender (target alone and generate() included) as a
    marker, its Pareto front as a line, and the SLA floor as a vertical line."""
    plt = pyplot()
    folder = Path(folder)
    make_dir(folder, "bench report folder")
    temps = report["settings"]["temperatures"]
    floor = report["settings"].get("sla_tps")
    fig, axes = plt.subplots(1, len(temps), figsize=(6 * len(temps), 4.6), squeeze=False)
    drawn = False
    for ax, temperature in zip(axes[0], temps):
        by: dict[str, list[tuple[float, float]]] = {}
        for r in report["runs"]:
            s = r["summary"]
            if r["temperature"] == temperature and s.get("per_user_tokens_per_s") and s.get("tokens_per_s"):
                by.setdefault(r["drafter"], []).append((s["per_user_tokens_per_s"], s["tokens_per_s"]))
        for label, pts in by.items():
            drawn = True
            front = pareto_front(pts)
            (line,) = ax.plot([x for x, _ in front], [y for _, y in front], marker="o", label=label)
            ax.plot([x for x, _ in pts], [y for _, y in pts], linestyle="none", marker=".", alpha=0.5,
                    color=line.get_color())
        if floor:
            ax.axvline(floor, color="red", linestyle="--", linewidth=1, label=f"SLA {floor:g} tok/s per user")
        ax.set_title(f"T={temperature:g}: each contender's Pareto front (dots: every point)")
        ax.set_xlabel("per-user tokens/s")
        ax.set_ylabel("total tokens/s")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    if not drawn:
        plt.close(fig)
        return None
    return save_figure(fig, folder / PARETO_FILE, dpi=110)
