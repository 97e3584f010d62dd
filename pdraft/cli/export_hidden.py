"""`pdraft export-hidden RECIPE`: run the target over the recipe's data and write the hidden-state cache
(chosen layers' features and the last hidden state, sharded safetensors with a manifest) that `pdraft
train` reads. Thin: parsing and output here, the work in `pdraft.cache.export_hidden`."""

from __future__ import annotations

from typing import Annotated

import typer

from pdraft.cli.common import JsonOpt, RecipeArg, SetOpt, err, out, print_json, recipe_from
from pdraft.rich_text import styled

EstimateOpt = Annotated[bool, typer.Option("--estimate", help="Print the size the cache needs and exit without writing.")]
FreshOpt = Annotated[bool, typer.Option("--fresh", help="Delete an existing cache (and regenerated responses) and start over instead of resuming.")]


def export_hidden(recipe: RecipeArg = None, set_: SetOpt = None, estimate: EstimateOpt = False,
                  json_: JsonOpt = False, fresh: FreshOpt = False) -> None:
    """Store the target's hidden states for training; resumes an interrupted export.

    Prints the size needed before writing and refuses to start when the disk cannot hold it. The cache goes
    to data.cache_dir, or OUTPUT_DIR/hidden.

    Several processes: torchrun --nproc_per_node 2 -m pdraft export-hidden RECIPE (the prompts are split).

    Example: pdraft export-hidden recipes/quickstart.yaml --set data.max_samples=200 --estimate
    """
    from pdraft.cache import format as fmt
    from pdraft.cache.export_hidden import cache_folder, check_export_io
    from pdraft.cache.export_hidden import export_hidden as run_export
    from pdraft.decode.session import target_alone_loop
    from pdraft.runtime import make_runtime
    from pdraft.targets.loader import inspect_target
    from pdraft.train.distributed import env_rank, leave_group

    r = recipe_from(recipe, set_)
    check_export_io(r)  # before the target loads: outputs over inputs, links where it writes
    runtime = make_runtime(r.runtime)
    main = env_rank() == 0  # under torchrun every process exports its share, rank 0 alone talks
    if main:
        err.print(f"target {r.target.id} on {runtime.describe()}")
    # The weights are loaded by the export once it needs them: never for --estimate (a config.json is enough),
    # and after a vLLM regeneration, which then has the devices to itself.
    target = inspect_target(r.target, runtime, weights=not estimate)
    report = run_export(r, target, folder=cache_folder(r), estimate_only=estimate, fresh=fresh, console=err,
                        loop_for=target_alone_loop)
    leave_group()
    if not main:
        return
    summary = report.summary()
    if json_:
        print_json(summary)
        return
    res = report.result
    if estimate:
        out.print(f"estimate only: {fmt.human_bytes(res.estimate.total_bytes)} for {res.estimate.sequences:,} samples "
                  f"({fmt.human_bytes(res.estimate.bytes_per_sample)} a sample, {fmt.human_bytes(res.estimate.bytes_per_token)} "
                  f"a token{', an upper bound before regeneration' if report.upper_bound else ''}); nothing written to "
                  f"{res.folder}")
        return
    if report.skipped_lines:
        out.print(styled("[yellow]skipped[/yellow] malformed lines: {}", report.skipped_lines[:20]))
    if report.dropped:
        out.print(styled("[yellow]dropped[/yellow] {} sequences without response tokens within data.max_length", report.dropped))
    done = f"{res.shards_done_before} already done, " if res.shards_done_before else ""
    rate = f"{res.tokens_per_second:,.0f} tokens/s" if res.shards_written else "nothing left to do"
    out.print(styled("[green]cache ready[/green] {}: {} sequences, {} tokens, {} shards ({}{} written, {}), layers {}, {}",
                     res.folder, f"{res.estimate.sequences:,}", f"{res.estimate.tokens:,}", res.num_shards, done,
                     res.shards_written, rate, target.layer_ids, res.manifest.get("dtype", "")))
