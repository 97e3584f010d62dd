"""`pdraft target build|eval`: build the embedded default target (or its test variant) and measure held-out
loss and top-1 next-token accuracy per domain. A thin layer over `pdraft.target.builtin`; the library does the
work."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from pdraft.cli.common import out

app = typer.Typer(help="Build and evaluate pdraft's embedded default target (builtin:tiny-stdlib).",
                  no_args_is_help=True)


def _table(metrics: dict, title: str) -> Table:
    table = Table(title=title)
    for col in ("domain", "held-out loss", "top-1", "tokens", "bytes/token"):
        table.add_column(col, justify="right" if col != "domain" else "left")
    for domain, m in metrics["held_out"].items():
        table.add_row(domain, f"{m['loss']:.3f}", f"{m['top1']:.3f}", str(m["tokens"]),
                      str(metrics.get("bytes_per_token", {}).get(domain, "")))
    return table


def _print(metrics: dict, as_json: bool, title: str) -> None:
    if as_json:
        typer.echo(json.dumps(metrics, indent=2, sort_keys=True))
        return
    out.print(_table(metrics, title))
    if "build_seconds" in metrics:
        out.print(f"{metrics['params']:,} parameters, {metrics['train_tokens']:,} training tokens, "
                  f"built in {metrics['build_seconds']}s on {metrics['threads']} thread(s) "
                  f"({metrics['train_tokens_per_second']:.0f} tok/s)")


@app.command()
def build(
    name: str = typer.Argument("tiny-stdlib", help="builtin target: tiny-stdlib or tiny-stdlib-test"),
    seed: int = typer.Option(0, help="training seed; the shipped weights use 0"),
    out: Optional[Path] = typer.Option(None, help="folder to build into (default: a fresh cache entry)"),
    prompts_out: Optional[Path] = typer.Option(None, help="also write code.jsonl and prose.jsonl here"),
    as_json: bool = typer.Option(False, "--json", help="print the metrics as JSON"),
) -> None:
    """Build a builtin target from the standard library and print its held-out metrics.

    Example (reproduces the shipped weights and prompt sets bit for bit on the same Python and torch):

        pdraft target build tiny-stdlib --seed 0 --out pdraft/target/builtin/weights/tiny-stdlib
        --prompts-out pdraft/target/builtin/prompts
    """
    from pdraft.target import builtin
    from pdraft.target.builtin.cache import normalise_name

    bare = normalise_name(name)
    if out is None:
        # Build beside the cache, then let resolve() install it with its checks and atomic rename.
        folder = builtin.target_dir(bare, seed=seed)
        if folder.exists():
            typer.echo(f"already in the cache at {folder}: showing its metrics (--out builds a fresh copy)",
                       err=True)
        path = builtin.resolve(bare, seed=seed)
        metrics = json.loads((path / "metrics.json").read_text(encoding="utf-8"))
    else:
        metrics = builtin.build(bare, out, seed=seed, progress=not as_json, prompts_dir=prompts_out)
    _print(metrics, as_json, f"builtin:{bare} (seed {seed})")


@app.command("eval")
def evaluate(
    name: str = typer.Argument("tiny-stdlib", help="builtin target: tiny-stdlib or tiny-stdlib-test"),
    tokens: int = typer.Option(32768, help="held-out tokens per domain"),
    as_json: bool = typer.Option(False, "--json", help="print the metrics as JSON"),
) -> None:
    """Measure a builtin target's held-out loss and top-1 next-token accuracy per domain, from its cache.

    Example:

        pdraft target eval tiny-stdlib --tokens 8192 --json
    """
    from pdraft.target import builtin
    from pdraft.target.builtin.builder import evaluate_folder

    path = builtin.resolve(name, progress=not as_json)
    _print(evaluate_folder(path, tokens), as_json, f"builtin:{name.removeprefix('builtin:')}")
