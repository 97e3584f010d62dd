"""Figures and the terminal summary of calibrate-threshold: the reliability diagram of every drafted position
(cumulative survival before and after STS against the observed "accepted through k" rate, over the sample
histogram, as the paper's Figure 6), the static-threshold sweep (stacked accepted/rejected drafts per round
and the acceptance rate, as Figure 5), the SPS curve (raw medians and the smoothed table), and a rich table.
matplotlib runs on its Agg backend so that no display is ever needed."""

from __future__ import annotations

from pathlib import Path

from rich.table import Table

from pdraft.plotting import pyplot, save_figure


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def _num(v, digits=3) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def plot_reliability(before: list[dict], after: list[dict], path: str | Path, title: str = "") -> Path:
    """before/after: per-position metric dicts (PositionMetrics as dicts) measured on the same rounds."""
    plt = pyplot()
    n = max(len(after), 1)
    cols = min(4, n)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 3.4 * rows), squeeze=False)
    for i, (b, a) in enumerate(zip(before, after)):
        ax = axes[i // cols][i % cols]
        hist = ax.twinx()
        counts = a.get("histogram") or []
        if counts:  # equal-width, whatever the ECE binning: equal-mass bins would all show the same count
            width = 1.0 / len(counts)
            hist.bar([(i + 0.5) * width for i in range(len(counts))], counts, width=width, color="0.6", alpha=0.25)
        hist.set_yticks([])
        ax.set_zorder(hist.get_zorder() + 1)
        ax.patch.set_visible(False)
        ax.plot([0, 1], [0, 1], "--", color="0.5", linewidth=1, label="perfect")
        for m, style, name in ((b, "o-", "before"), (a, "s-", "after")):
            ax.plot([x["mean_pred"] for x in m["bins"]], [x["mean_outcome"] for x in m["bins"]], style,
                    markersize=3, linewidth=1.2, label=name)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        auc = a["auc"]
        ax.set_title(f"position {a['position']}  ECE {_pct(b['ece'])} -> {_pct(a['ece'])}\n"
                     f"AUC {_num(auc)}  n={a['samples']}  (grey: samples)", fontsize=8)
        ax.tick_params(labelsize=7)
        if i == 0:
            ax.legend(fontsize=7, loc="upper left")
    for j in range(len(after), rows * cols):
        axes[j // cols][j % cols].axis("off")
    fig.supxlabel("predicted prefix survival", fontsize=9)
    fig.supylabel("observed prefix survival", fontsize=9)
    if title:
        fig.suptitle(title, fontsize=10)
    return save_figure(fig, path, dpi=120)


def plot_sweep(rows: list[dict], path: str | Path, recommended: float | None = None, title: str = "") -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.6))
    xs = [r["threshold"] for r in rows]
    ax.bar(xs, [r["accepted"] for r in rows], width=0.07, label="accepted", color="tab:blue")
    ax.bar(xs, [r["rejected"] for r in rows], width=0.07, bottom=[r["accepted"] for r in rows], label="rejected",
           color="tab:red", alpha=0.5, hatch="//")
    ax.set_xlabel("confidence threshold (calibrated cumulative survival)")
    ax.set_ylabel("drafts verified per round")
    rate = ax.twinx()
    rate.plot(xs, [r["acceptance_rate"] if r["acceptance_rate"] is not None else float("nan") for r in rows], "ko-",
              markersize=3, label="acceptance rate")
    rate.set_ylim(0, 1.05)
    rate.set_ylabel("acceptance rate")
    if recommended is not None:
        ax.axvline(recommended, color="green", linestyle=":", label=f"recommended {recommended:.1f}")
    ax.legend(fontsize=7, loc="upper right")
    if title:
        ax.set_title(title, fontsize=9)
    return save_figure(fig, path, dpi=120)


def plot_sps(table: dict, path: str | Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.4))
    xs = table["sample_batch_tokens"]
    raw = table.get("pdraft", {}).get("raw_steps_per_sec")
    if raw:  # measured at a subset of the B (the profile's points); tables before them measured every B
        ax.plot(table["pdraft"].get("measured_batch_tokens", xs), raw, ".", color="0.5", label="median per B")
    ax.plot(xs, table["sample_steps_per_sec"], "-", label="roofline fit (the cost table)")
    ax.set_xlabel("tokens in the verification forward (B)")
    ax.set_ylabel("steps per second")
    ax.set_ylim(bottom=0)
    ax.set_title(table.get("pdraft", {}).get("device", ""), fontsize=9)
    ax.legend(fontsize=7)
    return save_figure(fig, path, dpi=120)


def summary_tables(result: dict) -> list[Table]:
    """result: the dict pdraft.calibrate.pipeline.calibrate returns."""
    cal = result["calibration"]
    meta = cal["pdraft"]
    where = meta["ece_on"]
    pos = Table(title=f"STS calibration ({meta['binning'].replace('_', '-')} ECE, {meta['bins']} bins, on the "
                      f"{where} part)")
    for col in ("pos", "T", "samples", "reached", "ECE before", "ECE after", "floor", "AUC", "Brier before",
                "Brier after"):
        pos.add_column(col, justify="right")
    for t, fitted, b, a in zip(cal["temperatures"], meta["fitted"], meta["per_position_before"],
                               meta["per_position_after"]):
        pos.add_row(str(a["position"]), f"{t:.3f}" + ("" if fitted else "*"), str(a["samples"]), str(a["reached"]),
                    _pct(b["ece"]), _pct(a["ece"]), _pct(a.get("ece_floor")), _num(a["auc"]), _num(b["brier"]),
                    _num(a["brier"]))
    ob, oa = meta["overall_before"], meta["overall_after"]
    pos.add_section()
    pos.add_row("mean", "", str(oa["samples"]), "", _pct(ob["ece"]), _pct(oa["ece"]), _pct(oa.get("ece_floor")),
                _num(oa["auc"]), _num(ob["brier"]), _num(oa["brier"]))
    pb, pa = meta.get("pooled_before"), meta.get("pooled_after")
    if pb and pa:
        pos.add_row("pooled", "", str(pa["samples"]), "", _pct(pb["ece"]), _pct(pa["ece"]), _pct(pa.get("ece_floor")),
                    _num(pa["auc"]), _num(pb["brier"]), _num(pa["brier"]))
    pos.caption = ("floor: the ECE a perfectly calibrated predictor would show on the same samples (sampling "
                   "noise alone); * inherited temperature")
    sweep = Table(title="static threshold sweep (per round)")
    for col in ("threshold", "verified", "accepted", "rejected", "acceptance", "tau", "tokens/s (1 req)"):
        sweep.add_column(col, justify="right")
    for r in result["sweep"]["rows"]:
        mark = " <" if r["threshold"] == result["sweep"]["recommended"] else ""
        sweep.add_row(f"{r['threshold']:.1f}{mark}", _num(r["verified"], 2), _num(r["accepted"], 2),
                      _num(r["rejected"], 2), _pct(r["acceptance_rate"]), _num(r["tau"], 2),
                      _num(r["tokens_per_s"], 1))
    return [pos, sweep]
