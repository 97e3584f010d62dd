"""`pdraft target build|eval`: build the embedded default target (or its test variant) and measure held-out
loss and top-1 next-token accuracy per domain. A thin layer over `pdraft.targets.builtin`; the library does the
work."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from pdraft.cli.common import out
from pdraft.readback import parse_json, read_bytes
from pdraft.targets.builtin.builder import SAMPLE_PROMPT, VARIANTS
from pdraft.targets.builtin.converted import CONVERTED
from pdraft.rich_text import styled

app = typer.Typer(help="Build and evaluate pdraft's builtin targets (builtin:tiny-stdlib, the embedded default, and "
                       "builtin:smollm2-135m-instruct, converted from a registry wheel).",
                  no_args_is_help=True)


def _table(metrics: dict, title: str) -> Table:
    table = Table(title=title)
    buckets = next(iter(metrics["held_out"].values())).get("loss_by_position", {})
    for col in ("domain", "held-out loss", "top-1", "tokens", "bytes/token", *(f"loss @{b}" for b in buckets)):
        table.add_column(col, justify="right" if col != "domain" else "left")
    for domain, m in metrics["held_out"].items():
        by_pos = m.get("loss_by_position", {})  # absent from metrics of builds before it was recorded
        table.add_row(domain, f"{m['loss']:.3f}", f"{m['top1']:.3f}", str(m["tokens"]),
                      str(metrics.get("bytes_per_token", {}).get(domain, "")),
                      *(f"{by_pos[b]:.3f}" if b in by_pos else "" for b in buckets))
    return table


def _print(metrics: dict, as_json: bool, title: str) -> None:
    if as_json:
        typer.echo(json.dumps(metrics, indent=2, sort_keys=True))
        return
    out.print(_table(metrics, title))
    if "greedy_loops" in metrics:
        for form, m in metrics["greedy_loops"].items():
            out.print(f"greedy 64-token continuations of {m['prompts']} held-out code prompts, {form} prompts: "
                      f"{m['loops']:.0%} loop (mean length {m['mean_tokens']} tokens)")
        for form, text in metrics["samples"].items():
            out.print(styled("[bold]{}, {}:[/bold]", repr(SAMPLE_PROMPT), form))
            out.print(text, markup=False, highlight=False)
    if "build_seconds" in metrics:
        out.print(f"{metrics['params']:,} parameters, {metrics['train_tokens']:,} training tokens, "
                  f"built in {metrics['build_seconds']}s on {metrics['threads']} thread(s) "
                  f"({metrics['train_tokens_per_second']:.0f} tok/s)")


TARGET_NAMES_HELP = (f"builtin target: {', '.join((*VARIANTS, *CONVERTED))} (tiny-stdlib ships; "
                     f"{', '.join(CONVERTED)} is converted from its registry package on first use; the others build)")
DEFAULT_DATASETS = Path("../shared/datasets")


def _print_prompt_eval(report: dict, as_json: bool, title: str) -> None:
    if as_json:
        typer.echo(json.dumps(report, indent=2, sort_keys=True))
        return
    table = Table(title=title)
    cols = ("domain", "prompts", "prompt loss", "prompt top-1", "answer top-1 prob", "answer tokens", "loops",
            "mask max prob")
    for col in cols:
        table.add_column(col, justify="left" if col == "domain" else "right")
    for domain, m in report["domains"].items():
        table.add_row(domain, str(m["prompts"]), f"{m['prompt_loss']:.3f}", f"{m['prompt_top1']:.3f}",
                      f"{m['answer_top1_prob']:.3f}", f"{m['answer_tokens']:.0f}", f"{m['answer_loops']:.0%}",
                      f"{m['mask_max_prob']:.2g}")
    out.print(table)
    for domain, m in report["domains"].items():
        out.print(styled("[bold]{} (greedy, chat template):[/bold]", domain))
        out.print(m["first_answer"], markup=False, highlight=False)


@app.command()
def build(
    name: str = typer.Argument("tiny-stdlib", help=TARGET_NAMES_HELP),
    seed: int = typer.Option(0, help="training seed; the shipped weights use 0"),
    out: Optional[Path] = typer.Option(None, help="folder to build into (default: a fresh cache entry)"),
    prompts_out: Optional[Path] = typer.Option(None, help="also write code.jsonl and prose.jsonl here"),
    checkpoint_every: int = typer.Option(50, min=0, help="save the training state every N steps (0: never); "
                                         "rerunning the same command resumes a killed build"),
    fresh: bool = typer.Option(False, "--fresh", help="discard the checkpoints of an earlier, killed build"),
    as_json: bool = typer.Option(False, "--json", help="print the metrics as JSON"),
) -> None:
    """Build a builtin target from the standard library and print its held-out metrics.

    Example (reproduces the shipped weights and prompt sets bit for bit on the same Python and torch):

        pdraft target build tiny-stdlib --seed 0 --out pdraft/targets/builtin/weights/tiny-stdlib
        --prompts-out pdraft/targets/builtin/prompts
    """
    from pdraft.targets import builtin
    from pdraft.targets.builtin.cache import normalise_name

    bare = normalise_name(name)
    if bare in CONVERTED:
        from pdraft.targets.builtin.converted import convert

        record = convert(bare, out, progress=not as_json) if out is not None else None
        path = out if out is not None else builtin.resolve(bare, progress=not as_json)
        typer.echo(json.dumps(record, indent=2, sort_keys=True) if as_json and record else f"builtin:{bare} at {path}")
        return
    if out is None:
        # Build beside the cache, then let resolve() install it with its checks and atomic rename.
        folder = builtin.target_dir(bare, seed=seed)
        if folder.exists():
            typer.echo(f"already in the cache at {folder}: showing its metrics (--out builds a fresh copy)",
                       err=True)
        path = builtin.resolve(bare, seed=seed)
        metrics = parse_json(read_bytes(path / "metrics.json", "the target's metrics", 16 << 20),
                             str(path / "metrics.json"))
    else:
        metrics = builtin.build(bare, out, seed=seed, progress=not as_json, prompts_dir=prompts_out,
                                checkpoint_every=checkpoint_every, fresh=fresh)
    _print(metrics, as_json, f"builtin:{bare} (seed {seed})")


@app.command("eval")
def evaluate(
    name: str = typer.Argument("tiny-stdlib", help=TARGET_NAMES_HELP),
    tokens: int = typer.Option(32768, help="held-out tokens per domain"),
    loop_prompts: int = typer.Option(100, min=0, help="held-out code prompts continued greedily (64 tokens, raw "
                                     "and chat) to measure the loop share; 0 skips it"),
    datasets: Path = typer.Option(DEFAULT_DATASETS, help="for a converted target: the folder of DeepSpec JSONL prompt "
                                  "sets (humaneval, mbpp, gsm8k, math500, mt-bench)"),
    per_set: int = typer.Option(4, min=1, help="for a converted target: prompts per prompt set"),
    as_json: bool = typer.Option(False, "--json", help="print the metrics as JSON"),
) -> None:
    """Measure a builtin target's held-out loss and top-1 next-token accuracy per domain, from its cache, and
    the share of greedy continuations of held-out code prompts that loop (the same 4-gram three times in a row,
    or any repeat of up to 21 tokens three times).

    Example:

        pdraft target eval tiny-stdlib --tokens 8192 --json

    A converted target (builtin:smollm2-135m-instruct) has no held-out corpus of its own: it is measured per
    domain (code, math, chat) on the shared benchmark prompts, rendered with its chat template (see
    pdraft/targets/builtin/prompt_eval.py).
    """
    from pdraft.targets import builtin
    from pdraft.targets.builtin.builder import evaluate_folder
    from pdraft.targets.builtin.cache import normalise_name

    bare = normalise_name(name)
    if bare in CONVERTED:
        _print_prompt_eval(_eval_converted(bare, datasets, per_set, as_json), as_json, f"builtin:{bare}")
        return
    path = builtin.resolve(name, progress=not as_json)
    _print(evaluate_folder(path, tokens, loop_prompts=loop_prompts), as_json, f"builtin:{name.removeprefix('builtin:')}")


def _eval_converted(name: str, datasets: Path, per_set: int, as_json: bool) -> dict:
    import time

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pdraft.targets import builtin
    from pdraft.targets.builtin.converted import quiet_transformers
    from pdraft.targets.builtin.prompt_eval import domain_files, evaluate_prompt_sets

    files = domain_files(datasets)  # before the minute of a first conversion
    path = builtin.resolve(name, progress=not as_json)
    t0 = time.perf_counter()
    with quiet_transformers():
        tok = AutoTokenizer.from_pretrained(str(path))
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    domains = evaluate_prompt_sets(model, tok, files, per_set, tok.mask_token_id)
    return {"target": f"builtin:{name}", "folder": str(path), "datasets": str(datasets), "per_set": per_set,
            "mask_token": tok.mask_token, "mask_token_id": tok.mask_token_id, "domains": domains,
            "seconds": round(time.perf_counter() - t0, 1), "threads": torch.get_num_threads()}
