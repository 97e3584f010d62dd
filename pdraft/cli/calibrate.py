"""`pdraft calibrate-threshold`: fit Sequential Temperature Scaling on a DSpark drafter's confidence head,
report ECE / AUC / Brier before and after on held-out prompts, sweep static thresholds, profile the target's
SPS(B) cost table (with pdraft's verifier, or in a serving engine: `--engine`), and write the calibration and
the cost table next to the drafter (SGLang's layouts), with figures. Parses flags and calls
pdraft.calibrate.pipeline.calibrate; `--json` prints the metrics as JSON."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Annotated

import typer

from pdraft.cli.common import JsonOpt, RecipeArg, SetOpt, err, out, print_json, recipe_from


def calibrate_threshold(
    recipe: RecipeArg = None,
    set_: SetOpt = None,
    drafter: Annotated[Path, typer.Option("--drafter", help="DSpark drafter checkpoint folder (with a confidence head).", show_default=False)] = ...,
    held_out: Annotated[float | None, typer.Option("--held-out", help="Share of prompts kept out of the fit to measure the after-ECE (default: calibrate.held_out_fraction).", show_default=False)] = None,
    out_dir: Annotated[Path | None, typer.Option("--out", help="Write the files here instead of next to the drafter.", show_default=False)] = None,
    json_out: JsonOpt = False,
    skip_sps: Annotated[bool, typer.Option("--skip-sps", help="Do not profile the SPS cost table (keep an existing one).")] = False,
    engine: Annotated[str | None, typer.Option("--engine", help="Measure the SPS cost table in this serving engine (vllm) instead of pdraft's verifier: the target alone, started in its own interpreter (VLLM_VENV); the table's metadata names the engine (calibrate.sps_engine).", show_default=False)] = None,
) -> None:
    """Calibrate a DSpark confidence head (STS), sweep static thresholds and profile the scheduler's cost table.

    Example: pdraft calibrate-threshold recipes/quickstart.yaml --drafter runs/quickstart/dspark/final --held-out 0.3
    """
    from pdraft.calibrate.report import summary_tables
    from pdraft.calibrate.pipeline import calibrate, headline

    r = recipe_from(recipe, (set_ or []) + ([f"calibrate.sps_engine={engine}"] if engine is not None else []))
    profiler = None
    if r.calibrate.sps_engine:  # checked before the target loads
        from pdraft.serving import sps_profiler

        profiler = sps_profiler(r.calibrate.sps_engine)

    def log(msg: str) -> None:
        if not json_out:
            err.print(msg)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = calibrate(r, drafter, held_out=held_out, out_dir=out_dir, skip_sps=skip_sps, log=log,
                           sps_profiler=profiler)
    for w in caught:
        err.print(f"warning: {w.message}")
    for w in result["warnings"]:
        err.print(f"warning: {w}")
    if json_out:
        cal = result["calibration"]
        print_json({"headline": headline(result), "temperatures": cal["temperatures"],
                    "ece_before": cal["ece_before"], "ece_after": cal["ece_after"],
                    "overall_before": cal["pdraft"]["overall_before"], "overall_after": cal["pdraft"]["overall_after"],
                    "per_position": [{k: v for k, v in m.items() if k != "bins"} for m in cal["pdraft"]["per_position_after"]],
                    "sweep": result["sweep"], "warnings": result["warnings"], "files": result["files"],
                    "sps_table": {k: result["sps"][k] for k in ("sample_batch_tokens", "sample_steps_per_sec",
                                                                 "max_batch_tokens")} if result["sps"] else None})
        return
    for table in summary_tables(result):
        out.print(table)
    sw = result["sweep"]
    out.print(f"recommended static threshold: {sw['recommended']:.1f} ({sw['rule']})")
    out.print(headline(result))
    for name, path in result["files"].items():
        if path:
            out.print(f"  {name}: {path}")
