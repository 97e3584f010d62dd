"""`pdraft recipe check|show|explain`: validate a recipe, print it resolved, describe its fields."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from pdraft.cli.common import JsonOpt, RecipeArg, SetOpt, out, print_json, recipe_from
from pdraft.errors import PdraftError, RecipeError
from pdraft.recipe import dump_resolved, explain, resolved_dict
from pdraft.rich_text import styled

app = typer.Typer(help="Validate, show and explain recipes.", no_args_is_help=True)


@app.command("check")
def check(recipe: RecipeArg = None, set_: SetOpt = None, json_: JsonOpt = False) -> None:
    """Validate a recipe; print one line per problem (file:line: key: expected, found) and exit 2 on any.

    Example: pdraft recipe check recipes/quickstart.yaml --set train.lr=3e-4
    """
    r = recipe_from(recipe, set_)
    check_layers(r)
    if json_:
        print_json({"ok": True, "recipe": r.source})
    else:
        out.print(styled("[green]ok[/green] {}", r.source or "defaults"))


def check_layers(r) -> None:
    """The layer ids against the target's depth when its config.json is at hand (builtin or local folder)."""
    from pdraft.targets.capture import check_layer_ids
    from pdraft.targets.loader import target_num_layers

    layers = target_num_layers(r.target.id) if r.target.layer_ids else None
    if layers is not None:
        try:
            check_layer_ids(r.target.layer_ids, layers, legacy_last=False)
        except PdraftError as e:
            raise RecipeError([f"{r.source or '<defaults>'}: target.layer_ids: {e.message}"]) from None


@app.command("show")
def show(recipe: RecipeArg = None, set_: SetOpt = None, json_: JsonOpt = False) -> None:
    """Print the resolved recipe: every key with its value, defaults filled in.

    Example: pdraft recipe show recipes/quickstart.yaml --set decode.gamma=8
    """
    r = recipe_from(recipe, set_)
    if json_:
        print_json(resolved_dict(r))
    else:
        out.print(dump_resolved(r), end="", markup=False)


@app.command("explain")
def explain_cmd(
    key: Annotated[str | None, typer.Argument(help="A section (train) or a key (train.lr); omitted = everything.")] = None,
    json_: JsonOpt = False,
) -> None:
    """Describe recipe fields: type and range, default, one-line description.

    Example: pdraft recipe explain drafter
    """
    rows = explain(key)
    if json_:
        print_json([dict(zip(("key", "type", "default", "description"), r)) for r in rows])
        return
    table = Table(show_lines=False, header_style="bold")
    for col in ("key", "type", "default", "description"):
        table.add_column(col, overflow="fold")
    for row in rows:
        table.add_row(*row)
    out.print(table)
