"""`export-hidden` as a library call: load the recipe's prompts, optionally regenerate their responses with
the target, build the training sequences, print the size estimate, and write (or resume) the hidden-state
cache with a progress bar in tokens per second. The command file only parses arguments and calls
`export_hidden`; training code can call `training_sequences` to get the very same sequences online.

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
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from pdraft.cache import format as fmt
from pdraft.cache.writer import ExportResult, write_cache
from pdraft.data.prompts import Conversation, load_prompts
from pdraft.data.regenerate import RegenerateSettings, merge_parts, part_paths, regenerate, regenerated_records
from pdraft.data.regenerate_vllm import VllmSettings, regenerate_vllm
from pdraft.data.templates import TrainingSequence, build_sequences, encode_prompt
from pdraft.errors import PdraftError
from pdraft.io_plan import Input, Output, check_io, input_if_local
from pdraft.locks import LOCK_NAME
from pdraft.runtime import join_group, layout, wait_for_peers
from pdraft.streams import run_seed
from pdraft.target.loader import Target, load_target
from pdraft.rich_text import styled

REGENERATED_NAME = "regenerated.jsonl"


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
def _bar(console: Console | None, label: str, total: int, unit: str):
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


def training_sequences(recipe, target, records) -> tuple[list[TrainingSequence], int]:
    max_length = min(recipe.data.max_length, target.max_context)
    # decode.enable_thinking, so that training contexts are the ones decode will build.
    return build_sequences(target.tokenizer, records, max_length, recipe.data.chat_template,
                           recipe.decode.enable_thinking, min_loss_tokens=recipe.data.min_loss_tokens)


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


def regenerate_settings(recipe) -> RegenerateSettings:
    data = recipe.data
    return RegenerateSettings(max_new_tokens=data.regenerate_max_new_tokens, temperature=data.regenerate_temperature,
                              seed=run_seed(recipe), batch_size=data.regenerate_batch_size,
                              chat_template=data.chat_template, enable_thinking=recipe.decode.enable_thinking,
                              top_k=data.regenerate_top_k, top_p=data.regenerate_top_p,
                              greedy_share=data.regenerate_greedy_share)


def loaded(recipe, target) -> Target:
    """`target` with its weights: as it is when loaded, else loaded now (export and online training get a
    pdraft.target.loader.TargetInfo first, so that an estimate or vLLM regeneration runs without them)."""
    return target if isinstance(target, Target) else load_target(recipe.target, target.runtime)


def own_loop(target: Target):
    """pdraft's own target-alone loop as regeneration's batch generator (pdraft.data.regenerate.BatchLoop), or None
    for transformers' generate(). The loop (pdraft.decode.engine: static KV cache, per-row lengths, each row's
    uniforms from its own stream, one per token, as regeneration's generate() sampler draws them) gives the same
    tokens (tests/test_data_regenerate.py compares both, greedy and sampled) about a third faster on the
    quickstart's target. It is used in one process where the static path covers the target eagerly (a CPU; on
    CUDA that path compiles, which a one-off regeneration does not pay back); sharded or wrapped targets under
    torchrun keep generate(), which their collectives are tested with."""
    import torch

    from pdraft.decode import backend
    from pdraft.decode.engine import generate

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return None
    chosen = backend.resolve("auto", target.model)
    if not chosen.static or chosen.compiled:
        return None

    def loop(prompts, max_new_tokens, stops, seeds, sampling):
        out = generate(target.model, None, prompts, max_new_tokens=max_new_tokens, eos_token_ids=stops, seeds=seeds,
                       sampling=sampling)
        return [list(row) for row in out.output_ids]

    return loop


def regenerated(recipe, target, records: list[Conversation], folder: Path, *, fresh: bool = False,
                console: Console | None = None) -> list[Conversation]:
    """`records` with the target's own responses (data.regenerate), made or resumed in folder/regenerated.jsonl
    by data.regenerate_engine; every process of a torchrun job calls it and gets the same list. vLLM runs in
    rank 0 (its own child process, pdraft.data.regenerate_vllm) and needs no weights (a TargetInfo);
    transformers runs in every process, each data-parallel group its share, and needs the loaded target."""
    from pdraft.locks import folder_lock

    lay = layout(recipe.target.tensor_parallel)
    rank = lay.rank
    path = folder / REGENERATED_NAME
    settings = regenerate_settings(recipe)

    def lock():  # rank 0 holds the cache's lock for the whole job; the other ranks are its helpers
        return folder_lock(folder, "hidden-state cache folder") if rank == 0 else contextlib.nullcontext()

    vllm = VllmSettings.from_recipe(recipe, target) if recipe.data.regenerate_engine == "vllm" else None
    if vllm is not None and rank == 0:
        vllm.check()  # before anything is written
    if lay.world_size > 1 and fresh and rank == 0:
        for old in [path, path.with_name(path.name + ".meta.json"), *part_paths(path)]:
            old.unlink(missing_ok=True)
    if lay.world_size > 1:
        wait_for_peers("reading the old regeneration")
    if vllm is not None:
        if rank == 0:
            with lock(), _bar(console, "regenerate (vLLM)", len(records), "samples") as advance:
                regenerate_vllm(target, records, path, settings, vllm, fresh=fresh and lay.world_size == 1,
                                progress=advance)
        if lay.world_size == 1:
            return regenerated_records(records, path)
        wait_for_peers("the vLLM regeneration")
        return regenerated_records(records, path)
    if not isinstance(target, Target):
        raise TypeError("regeneration with transformers needs the loaded target (see `loaded`)")
    if lay.world_size == 1:
        with lock(), _bar(console, "regenerate", len(records), "samples") as advance:
            return regenerate(target, records, path, settings, fresh=fresh, progress=advance, loop=own_loop(target))
    # Each data-parallel group its share of the batches, then rank 0 folds the parts into one file.
    with lock(), _bar(console, "regenerate", len(records), "samples") as advance:
        regenerate(target, records, path, settings, progress=advance, part=(lay.dp_rank, lay.dp_size),
                   write=lay.writes)
    wait_for_peers("their share of the regeneration")
    if rank == 0:
        merge_parts(path)
    wait_for_peers("merging the regenerated responses")
    return regenerated_records(records, path)


def export_hidden(recipe, target, *, folder: str | Path | None = None, estimate_only: bool = False,
                  fresh: bool = False, console: Console | None = None) -> ExportReport:
    """Run the whole export for `recipe`. `target` is a loaded Target, or a TargetInfo (pdraft.target.loader
    .inspect_target): the weights are then loaded only once they are needed, after a vLLM regeneration and
    never for an estimate. `console` receives the estimate and progress."""
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

    prompts = load_prompts(data.source, data.split, data.max_samples,
                           on_error="skip" if data.skip_malformed else "stop")
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
        if data.regenerate_engine == "transformers":
            target = loaded(recipe, target)
        records = regenerated(recipe, target, records, folder, fresh=fresh, console=console)
    without = sum(1 for r in records if r.response is None and r.response_ids is None)
    if without and console is not None and data.chat_template:
        console.print(styled("[yellow]note[/yellow]: {} of {} records have no response; they are used as plain text "
                             "with every token counted (set data.regenerate=true to train on the target's own answers)",
                             without, len(records)))
    sequences, dropped = training_sequences(recipe, target, records)
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
    with lock, _bar(console, "export-hidden", total, "tokens") as advance:
        result = write_cache(target, sequences, folder, shard_tokens=data.shard_tokens, dtype=store,
                             batch_tokens=data.export_batch_tokens, extra=extra, fresh=fresh,
                             on_estimate=on_estimate, progress=advance, part=(lay.dp_rank, lay.dp_size),
                             writer=lay.writes, barrier=wait_for_peers if lay.world_size > 1 else lambda what: None)
        if rank == 0:
            save_resolved(recipe, folder, derived=derived)
    return ExportReport(result, len(records), prompts.skipped, dropped, without)
