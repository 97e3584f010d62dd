"""`pdraft train RECIPE`: train the recipe's drafter from the hidden-state cache (or online), resuming from
the run's `latest` checkpoint unless --fresh."""

from __future__ import annotations

from typing import Annotated

import typer

from pdraft.cli.common import JsonOpt, RecipeArg, SetOpt, err, out, print_json, recipe_from
from pdraft.rich_text import styled


def train(
    recipe: RecipeArg = None,
    set_: SetOpt = None,
    fresh: Annotated[bool, typer.Option("--fresh", help="Delete the checkpoints pdraft wrote in the run folder and start over (a folder holding anything else is refused).")] = False,
    json_: JsonOpt = False,
) -> None:
    """Train a DFlash, DSpark, DFlash2 or EAGLE-3 drafter; resumes from the run's latest checkpoint.

    Several processes: torchrun --nproc_per_node 2 -m pdraft train RECIPE (only rank 0 prints).

    Example: pdraft train recipes/quickstart.yaml --set drafter.kind=dflash --set train.steps=300
    """
    from contextlib import nullcontext

    from pdraft.decode.session import target_alone_loop
    from pdraft.hub.pull import drafter_folder
    from pdraft.runtime import make_runtime
    from pdraft.targets.loader import inspect_target, load_target
    from pdraft.train.distributed import env_rank, leave_group
    from pdraft.train.loop import check_train_io, run_dir_of, training_source
    from pdraft.train.loop import train as run_training
    from pdraft.train.progress import train_bar, validation_line

    r = recipe_from(recipe, set_)
    check_train_io(r, run_dir_of(r), fresh)  # before the target loads: outputs over inputs, links where it writes
    rt = make_runtime(r.runtime)
    main = env_rank() == 0  # under torchrun every process trains, rank 0 alone talks
    console = err if json_ else out
    # Online training may regenerate the responses first (with vLLM: before pdraft loads the weights).
    init_from = drafter_folder(r.drafter.init_from) if r.drafter.init_from else None  # a Hub id: pulled now
    source = training_source(r, inspect_target(r.target, rt), console=console if main else None,
                             loop_for=target_alone_loop)
    target = source.target if source.online else load_target(r.target, rt)
    run_dir = run_dir_of(r)
    with train_bar(console, r.drafter.kind, r.train.steps) if main else nullcontext() as progress:
        report = run_training(r, target, source, run_dir=run_dir, fresh=fresh, progress=progress, init_from=init_from)
    leave_group()
    if not main:
        return
    result = {"run_dir": str(report.run_dir), "drafter": str(report.final_dir), "steps": report.steps,
              "resumed_from": report.resumed_from, "validation": report.validation}
    if json_:
        print_json(result)
        return
    if report.resumed_from is not None:
        out.print(f"resumed from step {report.resumed_from}")
    if report.validation:
        out.print(validation_line(r.drafter.kind, report.validation))
    out.print(styled("drafter written to [bold]{}[/bold] (checkpoints and metrics.jsonl in {})", report.final_dir, report.run_dir))
