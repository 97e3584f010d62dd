"""`export-hidden` as a library call: load the recipe's prompts, optionally regenerate their responses with
the target, build the training sequences (pdraft.data.prepare, the stage online training runs too, so both
train on the very same sequences), print the size estimate, and write (or resume) the hidden-state cache with a
progress bar in tokens per second. The command file only parses arguments and calls `export_hidden`.

Under torchrun every process loads the same prompts; each data-parallel group (pdraft.runtime.Layout: one
process, or the N processes holding one sharded copy of the target with `target.tensor_parallel: N`)
regenerates its share of them and computes its share of the shards, which the group's first process writes;
rank 0 alone prints and writes the manifest (the writer's docstring says how). The processes only meet at a
few waits (pdraft.runtime.wait_for_peers), which say whom they wait for and last as long as the peers are
alive, since shares finish unevenly. With `data.regenerate_engine: vllm` rank 0 drives vLLM
(pdraft.data.regenerate_vllm) while the others wait, before the capture pass.
"""

from __future__ import annotations

import contextlib
import functools
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from pdraft.cache import format as fmt
from pdraft.cache.writer import ExportResult, write_cache
from pdraft.data.prepare import REGENERATED_NAME, LoopFor, load_records, loaded, prepare_sequences
from pdraft.data.templates import encode_prompt
from pdraft.errors import PdraftError
from pdraft.io_plan import Input, Output, check_io, input_if_local
from pdraft.locks import LOCK_NAME
from pdraft.runtime import join_group, layout, wait_for_peers
from pdraft.streams import run_seed
from pdraft.rich_text import styled


def cache_folder(recipe) -> Path:
    return Path(recipe.data.cache_dir) if recipe.data.cache_dir else Path(recipe.output_dir) / "hidden"


def check_export_io(recipe, folder: str | Path | None = None) -> None:
    """Refuse, before the target is loaded or anything written, a cache folder over what export-hidden reads
    (the recipe, the prompt file, a local target), one that holds another artifact (a drafter's config.json),
    or a name it writes that is a link (pdraft.io_plan)."""
    folder = Path(folder) if folder else cache_folder(recipe)
    inputs: list[Input] = input_if_local("the recipe", recipe.source) + input_if_local("target.id", recipe.target.id)
    inputs += input_if_local("data.source", recipe.data.source)
    written = [fmt.MANIFEST_NAME, "recipe.resolved.yaml"]
    if recipe.data.regenerate:
        written += [REGENERATED_NAME, REGENERATED_NAME + ".meta.json"]
    outputs = [Output("data.cache_dir", folder, "folder", artifact="hidden-state cache", shares=("run folder",),
                      whole=False), Output("its lock", folder / LOCK_NAME, "append")]
    outputs += [Output(f"its {name}", folder / name, "append" if name == REGENERATED_NAME else "file")
                for name in written]
    if folder.is_dir():
        outputs += [Output(f"its {p.name}", p) for p in sorted(folder.glob("shard-*.safetensors"))]
    check_io("export-hidden", inputs, outputs)


@contextmanager
def progress_bar(console: Console | None, label: str, total: int, unit: str):
    """Yield an `advance(n)` callable; a rich bar with a rate column, or nothing when console is None."""
    if console is None:
        yield lambda n: None
        return
    columns = [TextColumn("{task.description}", style="bold", markup=False), BarColumn(), MofNCompleteColumn(),
               TextColumn(f"{{task.fields[rate]}} {unit}/s", markup=False), TimeElapsedColumn(), TimeRemainingColumn()]
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task(label, total=total, rate="-")
        first = [True]

        def advance(n: int) -> None:
            # The first call reports work done by an earlier run: shown, but kept out of this run's rate.
            if first[0]:
                bar.reset(task, completed=n, rate="-")
                first[0] = False
                return
            bar.advance(task, n)
            speed = bar.tasks[0].speed
            bar.update(task, rate=f"{speed:,.0f}" if speed else "-")

        yield advance


@dataclass
class ExportReport:
    result: ExportResult
    records: int
    skipped_lines: list[int]
    dropped: int
    without_response: int
    upper_bound: bool = False  # the estimate assumes every regenerated response reaches max_new_tokens

    def summary(self) -> dict:
        return {**self.result.summary(), "records": self.records, "skipped_lines": self.skipped_lines,
                "dropped_sequences": self.dropped, "records_without_response": self.without_response,
                "estimate_is_upper_bound": self.upper_bound}


def _print_estimate(console: Console | None, est: fmt.SizeEstimate, remaining: int, folder: Path, note: str = "") -> None:
    if console is None:
        return
    free = fmt.free_bytes(folder)
    console.print(styled("cache size{}: {} sequences, {} tokens x ({} layers + last) x {} hidden x {} B + ids = "
                         "[bold]{}[/bold] ({} a token, {} a sample); to write {}, free {} in {}", note,
                         f"{est.sequences:,}", f"{est.tokens:,}", est.num_layers, est.hidden_size, est.dtype_bytes,
                         fmt.human_bytes(est.total_bytes), fmt.human_bytes(est.bytes_per_token),
                         fmt.human_bytes(est.bytes_per_sample), fmt.human_bytes(remaining), fmt.human_bytes(free), folder))


def export_hidden(recipe, target, *, folder: str | Path | None = None, estimate_only: bool = False,
                  fresh: bool = False, console: Console | None = None, loop_for: LoopFor | None = None
                  ) -> ExportReport:
    """Run the whole export for `recipe`. `target` is a loaded Target, or a TargetInfo (pdraft.targets.loader
    .inspect_target): the weights are then loaded only once they are needed, after a vLLM regeneration and
    never for an estimate. `console` receives the estimate and progress; `loop_for`, the regeneration's batch
    generator (pdraft.data.prepare)."""
    from pdraft.locks import folder_lock
    from pdraft.recipe import resolved_dict, save_resolved

    check_export_io(recipe, folder)
    lay = layout(recipe.target.tensor_parallel)
    rank = lay.rank
    if lay.world_size > 1:
        join_group(target.runtime.device, target.runtime.dist_timeout_s)
        console = console if rank == 0 else None
    data = recipe.data
    folder = Path(folder) if folder else cache_folder(recipe)

    prompts = load_records(recipe)
    if prompts.skipped and console is not None:
        console.print(styled("[yellow]skipped {} malformed line(s): {}{}", len(prompts.skipped),
                             ", ".join(map(str, prompts.skipped[:20])), " ..." if len(prompts.skipped) > 20 else ""))
    if not prompts:
        raise PdraftError(f"empty dataset: {data.source} gives no record (data.max_samples={data.max_samples})")
    store = fmt.resolve_store_dtype(data.cache_dtype, target.runtime.dtype if target.runtime else None)
    records = list(prompts)
    if data.regenerate:
        # Responses are unknown before generating: bound every sequence by prompt + max_new_tokens.
        max_length = min(data.max_length, target.max_context)
        lengths = [min(len(encode_prompt(target.tokenizer, r.prompt, data.chat_template, recipe.decode.enable_thinking))
                       + data.regenerate_max_new_tokens,
                       max_length) for r in records]
        bound = fmt.estimate(sum(lengths), len(lengths), len(target.layer_ids), target.hidden_size, store)
        _print_estimate(console, bound, bound.total_bytes, folder, note=" (upper bound, before regeneration)")
        if estimate_only:
            result = ExportResult(folder, bound, 0, estimate_only=True)
            return ExportReport(result, len(records), prompts.skipped, 0, 0, upper_bound=True)
        fmt.check_disk(folder, bound.total_bytes, bound)
    # the data-preparation stage: (regenerated) records -> training sequences, as online training makes them
    prepared = prepare_sequences(recipe, target, records, folder, fresh=fresh,
                                 bar=functools.partial(progress_bar, console), loop_for=loop_for)
    target, records, sequences, dropped = prepared.target, prepared.records, prepared.sequences, prepared.dropped
    without = sum(1 for r in records if r.response is None and r.response_ids is None)
    if without and console is not None and data.chat_template:
        console.print(styled("[yellow]note[/yellow]: {} of {} records have no response; they are used as plain text "
                             "with every token counted (set data.regenerate=true to train on the target's own answers)",
                             without, len(records)))
    total = sum(len(s) for s in sequences)
    derived = {"target.layer_ids": list(target.layer_ids)}
    extra = {"source": data.source, "split": data.split, "regenerated": data.regenerate,
             "regenerate_seed": run_seed(recipe) if data.regenerate and data.regenerate_temperature > 0 else None,
             "recipe": resolved_dict(recipe, derived)}

    def on_estimate(est: fmt.SizeEstimate, remaining: int) -> None:
        _print_estimate(console, est, remaining, folder)

    if estimate_only:
        result = write_cache(target, sequences, folder, shard_tokens=data.shard_tokens, dtype=store,
                             batch_tokens=data.export_batch_tokens, extra=extra, estimate_only=True,
                             fresh=fresh, on_estimate=on_estimate)
        return ExportReport(result, len(records), prompts.skipped, dropped, without)
    target = loaded(recipe, target)
    lock = folder_lock(folder, "hidden-state cache folder") if rank == 0 else contextlib.nullcontext()
    with lock, progress_bar(console, "export-hidden", total, "tokens") as advance:
        result = write_cache(target, sequences, folder, shard_tokens=data.shard_tokens, dtype=store,
                             batch_tokens=data.export_batch_tokens, extra=extra, fresh=fresh,
                             on_estimate=on_estimate, progress=advance, part=(lay.dp_rank, lay.dp_size),
                             writer=lay.writes, barrier=wait_for_peers if lay.world_size > 1 else lambda what: None)
        if rank == 0:
            save_resolved(recipe, folder, derived=derived)
    return ExportReport(result, len(records), prompts.skipped, dropped, without)
