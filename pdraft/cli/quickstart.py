"""`pdraft quickstart [RECIPE]`: the whole lifecycle in one command (pdraft.lifecycle)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pdraft.cli.common import JsonOpt, SetOpt, err, out, print_json
from pdraft.errors import PdraftError
from pdraft.models.families import FAMILIES

DEFAULT = Path("recipes/quickstart.yaml")


def quickstart(
    recipe: Annotated[Path | None, typer.Argument(help="Recipe (default: recipes/quickstart.yaml in this folder).", show_default=False)] = None,
    set_: SetOpt = None,
    kinds: Annotated[str, typer.Option("--kinds", help="Drafter kinds to train and compare, comma-separated.")] = ",".join(FAMILIES.kinds),
    fresh: Annotated[bool, typer.Option("--fresh", help="Redo every stage instead of resuming.")] = False,
    json_: JsonOpt = False,
) -> None:
    """Build the embedded target, export hidden states, train every family, calibrate, bench, decode.

    Example: pdraft quickstart recipes/quickstart.yaml
    """
    from pdraft.lifecycle import run

    if recipe is None:
        if not DEFAULT.exists():
            raise PdraftError(f"no recipe given and {DEFAULT} does not exist here",
                              hint="run from a pdraft checkout or pass a recipe path")
        recipe = DEFAULT
    summary = run(recipe, set_ or [], console=err if json_ else out,
                  kinds=tuple(k.strip() for k in kinds.split(",") if k.strip()), fresh=fresh)
    if json_:
        print_json(summary)
