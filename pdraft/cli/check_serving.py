"""`pdraft check-serving DRAFTER --engine vllm [--export DIR]`: is the drafter served as it was trained? Checks DIR
(default: a fresh export of DRAFTER) against the export pdraft writes and the engine's loader, then replays N
prompts greedily in the engine and in pdraft's loop and compares outputs and per-round accepted counts; names
the likely cause of any difference and exits 1, or prints the engine's tau beside pdraft's. Parses flags and
calls pdraft.serving.check."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pdraft.cli.common import JsonOpt, SetOpt, err, out, print_json
from pdraft.rich_text import styled


def check_serving(
    drafter: Annotated[Path, typer.Argument(help="The drafter checkpoint folder as trained.", metavar="DRAFTER")],
    engine: Annotated[str, typer.Option("--engine", help="The serving engine (vllm, llamacpp).")] = "vllm",
    export_dir: Annotated[Path | None, typer.Option("--export", help="The exported folder the engine serves (default: a fresh export of DRAFTER).")] = None,
    recipe: Annotated[Path | None, typer.Option("--recipe", help="Recipe with the target and the prompt sets (default: DRAFTER's recipe.resolved.yaml).")] = None,
    set_: SetOpt = None,
    target: Annotated[Path | None, typer.Option("--target", help="The target folder the engine loads (default: the recipe's target).")] = None,
    num_prompts: Annotated[int, typer.Option("--num-prompts", help="Prompts replayed from each of the recipe's bench sets.", min=1, max=256)] = 2,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", help="Tokens generated per prompt.", min=1, max=4096)] = 32,
    num_speculative_tokens: Annotated[int | None, typer.Option("--num-speculative-tokens", help="What the engine is served with (default: what the export prints).", min=1, max=64)] = None,
    replay: Annotated[bool | None, typer.Option("--replay/--no-replay", help="Serve it even when the export check already failed (--replay), or never (--no-replay); default: only when the export check passes.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Check that an engine serves DRAFTER's export exactly as pdraft decodes DRAFTER.

    Example: pdraft check-serving runs/quickstart/eagle3/final --engine vllm --export serve/eagle3-vllm
    """
    from pdraft.serving.check import cause_texts, check_serving as run_check
    from pdraft.recipe import load_recipe

    r = load_recipe(recipe, set_ or []) if recipe is not None or set_ else None
    report = run_check(drafter, engine=engine, export_dir=export_dir, recipe=r, num_prompts=num_prompts,
                       max_new_tokens=max_new_tokens, num_speculative=num_speculative_tokens, served_target=target,
                       replay=replay, log=lambda m: err.print(styled("[dim]check-serving {}[/]", m)))
    if json_out:
        print_json(report.to_dict())
    else:
        print_report(report, cause_texts(report.engine))
    if not report.ok:
        raise typer.Exit(1)


def print_report(report, causes: dict) -> None:
    s = report.stats
    if report.replayed and s:
        out.print(f"{report.engine}: {s['prompts']} prompts, {s['rounds_compared']} rounds compared "
                  f"({s['rounds_equal']} equal); tau {report.engine} {_tau(s['tau_engine'])} over "
                  f"{s['engine_rounds']} steps, tau pdraft {_tau(s['tau_pdraft'])} over {s['pdraft_rounds']} rounds")
    for line in report.near_ties:  # not failures: pdraft.decode.greedy_audit
        out.print(f"near-tie: {line}", markup=False)
    if report.ok:
        out.print(f"OK: {report.engine} serves {report.export} as pdraft decodes {report.drafter}, token for token "
                  f"and round for round (speculative config {report.speculative_config})")
        return
    out.print(f"FAIL: {report.engine} does not serve {report.export} as {report.drafter} was trained")
    for f in report.findings:
        out.print(f"  cause {f.cause} ({causes[f.cause]}): {f.detail}", markup=False)
    for line in report.problems[:20]:
        out.print(f"  replay: {line}", markup=False)
    if report.problems and not report.findings:
        out.print("  the export matches what pdraft writes for this drafter: the engine reads it differently "
                  "(its loader or version); see pdraft/hub/ENGINES.md for the fields it reads", markup=False)
    if report.findings and not report.replayed:
        out.print("  not served: the export check already failed (--replay serves it anyway)")


def _tau(v) -> str:
    return "-" if v is None else f"{v:.3f}"
