"""Helpers shared by the thin command files: the consoles, the recipe option with `--set` overrides, and
JSON output. Rich is used for output only; argument parsing stays with typer."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from pdraft.recipe import Recipe, load_recipe
from pdraft.rich_text import console

LOG_WIDTH = 160  # columns of tables written to a log or a pipe


def _width(stream) -> int | None:
    """None (rich asks the terminal) on a terminal or when COLUMNS is set; otherwise LOG_WIDTH, because rich
    falls back to 80 columns off a terminal and squeezes wide tables (bench, calibrate) into truncated cells."""
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        tty = False
    return None if tty or os.environ.get("COLUMNS") else LOG_WIDTH


out = console(highlight=False, soft_wrap=True, width=_width(sys.stdout))  # no markup in plain strings: pdraft.rich_text
err = console(stderr=True, highlight=False, soft_wrap=True, width=_width(sys.stderr))

RecipeArg = Annotated[Path | None, typer.Argument(help="YAML recipe; omitted = the built-in defaults.", show_default=False)]
SetOpt = Annotated[list[str] | None, typer.Option("--set", "-s", help="Override a recipe key, e.g. --set train.lr=3e-4 (repeatable).", metavar="KEY=VALUE", show_default=False)]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result as JSON on stdout instead of the human view.")]


def check_flags(section: type, flags: dict[str, tuple[str, object]]) -> None:
    """Check command-line values against the recipe field they stand for, with that field's type and range
    (one definition of each range): `{"--temperature": ("temperature", 0.7)}` against DecodeSection. None
    means the flag was not given. nan and inf are refused like out-of-range values."""
    from pydantic import ValidationError

    from pdraft.errors import PdraftError

    for flag, (name, value) in flags.items():
        if value is None:
            continue
        try:
            section.__pydantic_validator__.validate_assignment(section.model_construct(), name, value)
        except ValidationError as e:
            msg = e.errors()[0]["msg"].removeprefix("Input should be ")
            raise PdraftError(f"{flag} {value}: expected {'a value ' if msg.startswith(('less', 'greater')) else ''}"
                              f"{msg}") from None


def one_target_copy(recipe: Recipe, command: str) -> bool:
    """decode and bench run one copy of the target. Under torchrun with `target.tensor_parallel: N` that copy is
    shared by exactly N processes, which run the same requests in lockstep; all but rank 0 are silenced here
    (rank 0 alone prints and writes). Returns whether this process is rank 0."""
    from pdraft.errors import PdraftError
    from pdraft.runtime import layout

    lay = layout(recipe.target.tensor_parallel)
    if lay.dp_size > 1:
        raise PdraftError(f"{command} runs one copy of the target: start exactly target.tensor_parallel="
                          f"{lay.tensor_parallel} process(es), not {lay.world_size}",
                          hint="torchrun --nproc_per_node N with N = target.tensor_parallel, or no torchrun")
    if lay.rank != 0:
        quiet = open(os.devnull, "w")  # noqa: SIM115 - for the rest of this process's life
        sys.stdout, out.file, err.file = quiet, quiet, quiet
    return lay.rank == 0


def recipe_from(path: Path | None, overrides: list[str] | None) -> Recipe:
    return load_recipe(path, overrides or [])


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
    sys.stdout.flush()
