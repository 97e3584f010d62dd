"""The data-preparation stage: from the recipe's prompts to the training sequences, through the target's own
responses where `data.regenerate` asks for them (made or resumed in the cache folder's regenerated.jsonl, by
`data.regenerate_engine`). `prepare_sequences` is the one call export-hidden (before it captures hidden
states) and online training (instead of reading the cache) make, so both train on the very same sequences.
It sits below everything that decodes or shares: the batch generator of pdraft's own loop and the progress
bar are handed in by the command that runs it (`loop_for`, `bar`), never imported from pdraft.decode."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol
from pathlib import Path

from pdraft.data.prompts import Conversation, PromptSet, load_prompts
from pdraft.data.regenerate import (BatchLoop, RegenerateSettings, merge_parts, part_paths, regenerate,
                                    regenerated_records)
from pdraft.data.regenerate_llamacpp import LlamaCppSettings, regenerate_llamacpp
from pdraft.data.regenerate_vllm import regenerate_vllm
from pdraft.data.templates import TrainingSequence, build_sequences
from pdraft.engines.vllm_driver import VllmSettings
from pdraft.runtime import layout, wait_for_peers
from pdraft.streams import run_seed
from pdraft.targets.loader import Target, load_target

REGENERATED_NAME = "regenerated.jsonl"
Bar = Callable[[str, int, str], AbstractContextManager]  # (label, total, unit) -> a context yielding advance(n)
LoopFor = Callable[[Target], "BatchLoop | None"]  # the loaded target -> regeneration's batch generator, or None


@contextlib.contextmanager
def no_bar(label: str, total: int, unit: str):
    yield lambda n: None


def load_records(recipe) -> PromptSet:
    """The recipe's prompts (data.source, split, max_samples), malformed lines skipped or refused as
    data.skip_malformed says."""
    data = recipe.data
    return load_prompts(data.source, data.split, data.max_samples, on_error="skip" if data.skip_malformed else "stop")


@dataclass
class Prepared:
    target: object  # the target, loaded where regeneration needed its weights
    records: list[Conversation]  # with the target's own responses where data.regenerate
    sequences: list[TrainingSequence]
    dropped: int  # sequences dropped (too few loss tokens after truncation)


def prepare_sequences(recipe, target, records: list[Conversation], folder: Path, *, fresh: bool = False,
                      bar: Bar = no_bar, loop_for: LoopFor | None = None) -> Prepared:
    """Prompts -> (regenerated) -> training sequences. `target` is a loaded Target or a TargetInfo: the
    weights are loaded here only when transformers regenerates (vLLM and llama.cpp need none; the caller loads them for
    what follows)."""
    if recipe.data.regenerate and records:
        if recipe.data.regenerate_engine == "transformers":
            target = loaded(recipe, target)
        records = regenerated(recipe, target, records, folder, fresh=fresh, bar=bar, loop_for=loop_for)
    sequences, dropped = training_sequences(recipe, target, records)
    return Prepared(target, records, sequences, dropped)


def training_sequences(recipe, target, records) -> tuple[list[TrainingSequence], int]:
    max_length = min(recipe.data.max_length, target.max_context)
    # decode.enable_thinking, so that training contexts are the ones decode will build.
    return build_sequences(target.tokenizer, records, max_length, recipe.data.chat_template,
                           recipe.decode.enable_thinking, min_loss_tokens=recipe.data.min_loss_tokens)


class EngineSettings(Protocol):
    """What an engine child is given (VllmSettings, LlamaCppSettings)."""

    def check(self) -> None:
        """Refuses, in one line, what cannot run: before anything is written."""


@dataclass(frozen=True)
class ChildEngine:
    title: str  # how the progress bar and the wait name it
    settings: EngineSettings
    run: Callable  # regenerate_vllm or regenerate_llamacpp, given `settings` after the RegenerateSettings


def child_engine(recipe, target) -> ChildEngine | None:
    """The engine data.regenerate_engine runs as a child process (rank 0 only, no weights in pdraft), or None
    for transformers."""
    engine = recipe.data.regenerate_engine
    if engine == "vllm":
        return ChildEngine("vLLM", VllmSettings.from_recipe(recipe, target), regenerate_vllm)
    if engine == "llamacpp":
        return ChildEngine("llama.cpp", LlamaCppSettings.from_recipe(recipe), regenerate_llamacpp)
    return None


def regenerate_settings(recipe) -> RegenerateSettings:
    data = recipe.data
    return RegenerateSettings(max_new_tokens=data.regenerate_max_new_tokens, temperature=data.regenerate_temperature,
                              seed=run_seed(recipe), batch_size=data.regenerate_batch_size,
                              chat_template=data.chat_template, enable_thinking=recipe.decode.enable_thinking,
                              top_k=data.regenerate_top_k, top_p=data.regenerate_top_p,
                              greedy_share=data.regenerate_greedy_share)


def loaded(recipe, target) -> Target:
    """`target` with its weights: as it is when loaded, else loaded now (export and online training get a
    pdraft.targets.loader.TargetInfo first, so that an estimate or vLLM regeneration runs without them)."""
    return target if isinstance(target, Target) else load_target(recipe.target, target.runtime)


def regenerated(recipe, target, records: list[Conversation], folder: Path, *, fresh: bool = False,
                bar: Bar = no_bar, loop_for: LoopFor | None = None) -> list[Conversation]:
    """`records` with the target's own responses (data.regenerate), made or resumed in folder/regenerated.jsonl
    by data.regenerate_engine; every process of a torchrun job calls it and gets the same list. vLLM and llama.cpp
    run in rank 0 (child processes: pdraft.data.regenerate_vllm, regenerate_llamacpp) and need no weights (a TargetInfo);
    transformers runs in every process, each data-parallel group its share, and needs the loaded target.
    `bar(label, total, unit)` shows progress; `loop_for(target)` gives the batch generator transformers'
    regeneration runs (pdraft.decode.session.target_alone_loop, handed in by the command; None: generate())."""
    from pdraft.locks import folder_lock

    lay = layout(recipe.target.tensor_parallel)
    rank = lay.rank
    path = folder / REGENERATED_NAME
    settings = regenerate_settings(recipe)

    def lock():  # rank 0 holds the cache's lock for the whole job; the other ranks are its helpers
        return folder_lock(folder, "hidden-state cache folder") if rank == 0 else contextlib.nullcontext()

    child = child_engine(recipe, target)
    if child is not None and rank == 0:
        child.settings.check()  # before anything is written
    if lay.world_size > 1 and fresh and rank == 0:
        for old in [path, path.with_name(path.name + ".meta.json"), *part_paths(path)]:
            old.unlink(missing_ok=True)
    if lay.world_size > 1:
        wait_for_peers("reading the old regeneration")
    if child is not None:
        if rank == 0:
            with lock(), bar(f"regenerate ({child.title})", len(records), "samples") as advance:
                child.run(target, records, path, settings, child.settings, fresh=fresh and lay.world_size == 1,
                          progress=advance)
        if lay.world_size > 1:
            wait_for_peers(f"the {child.title} regeneration")
        return regenerated_records(records, path)
    if not isinstance(target, Target):
        raise TypeError("regeneration with transformers needs the loaded target (see `loaded`)")
    if lay.world_size == 1:
        with lock(), bar("regenerate", len(records), "samples") as advance:
            return regenerate(target, records, path, settings, fresh=fresh, progress=advance, loop=loop_for(target) if loop_for is not None else None)
    # Each data-parallel group its share of the batches, then rank 0 folds the parts into one file.
    with lock(), bar("regenerate", len(records), "samples") as advance:
        regenerate(target, records, path, settings, progress=advance, part=(lay.dp_rank, lay.dp_size),
                   write=lay.writes)
    wait_for_peers("their share of the regeneration")
    if rank == 0:
        merge_parts(path)
    wait_for_peers("merging the regenerated responses")
    return regenerated_records(records, path)
