"""Regenerate training responses with the target itself, because a drafter must learn the target's own
distribution rather than whoever wrote the dataset's answers (DeepSpec and SpecForge do the same).

Generation runs over fixed batches of prompts (batch k holds prompts [k*B, (k+1)*B)), greedy or sampled, by
plain `model.generate` with a KV cache or by a loop the caller gives (export-hidden gives pdraft's own
target-alone loop where it covers the target in one process); both give the same tokens. Sampling (temperature,
top-k, top-p: the DSpark paper regenerates "with recommended sampling parameters", so that a drafter meets the
contexts sampled serving reaches) goes through pdraft.models.sampling, the code decode samples with, and
draws prompt i's tokens from its own stream seeded from
(seed, i), the streams `pdraft decode` uses (pdraft.streams): a logits processor draws each row's
token and leaves only it for generate's greedy pick, because generate's own sampling shares one global
generator across the batch. So a sample does not depend on its batch, and comes out the same in the first
attempt or after a restart. A mix (`greedy_share`) regenerates an even spread of the prompts greedily and the
rest sampled: prompt i's mode is a function of i alone (`sampling_of`), and each batch is generated in (at most)
two groups, its greedy prompts and its sampled ones. Each finished sample is appended to a JSONL file as one line written in one call
and flushed (fsynced per batch); a rerun reads the file, drops a last line cut by a kill, and generates only
the missing samples. A sidecar `.meta.json` records the target and settings (the seed among them), and a
rerun with other ones refuses to mix outputs.

Under torchrun (`part=(rank, world_size)`, data-parallel) part r generates the batches k with
k % world_size == r into its own file ``<name>.part-r``; every run reads the samples of all such files, so a
run interrupted with some number of processes resumes with any other, and `merge_parts` folds them into the
one file at the end. With a sharded target the processes of a part generate together (in lockstep: the same
batches, the same streams) and only the one with `write=True` writes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from pdraft.data.prompts import Conversation
from pdraft.data.templates import encode_prompt, eos_ids
from pdraft.streams import Streams, request_seed
from pdraft.errors import PdraftError
from pdraft.models.api import SamplingParams
from pdraft.models.sampling import is_greedy, probs_from_logits, sample
from pdraft.paths import atomic_write_text, make_dir, open_append, open_in_place
from pdraft.readback import iter_lines, loads, parse_json, read_bytes
from pdraft.targets.fingerprint import target_fingerprint


MAX_RESPONSE_LINE = 64 << 20  # one regenerated sample (prompt, response, index) per line


@dataclass(frozen=True)
class RegenerateSettings:
    max_new_tokens: int = 256
    temperature: float = 0.0  # 0 = greedy
    seed: int = 0
    batch_size: int = 8
    chat_template: bool = True
    enable_thinking: bool = False
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1.0 = off
    greedy_share: float = 0.0  # with temperature > 0: this share of the prompts, spread evenly, regenerated greedily

    def sampling_of(self, index: int) -> SamplingParams:
        """How prompt `index` is regenerated: greedy when temperature is 0 or when the prompt falls in the greedy
        share (prompt i is greedy when floor((i + 1) * share) > floor(i * share): an even spread, so a share of
        0.5 alternates and the code and prose parts of a source each get half), else sampled."""
        share = self.greedy_share
        if self.temperature <= 0 or int((index + 1) * share) > int(index * share):
            return SamplingParams()
        return SamplingParams(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)

    def meta(self) -> dict:
        """The settings as the responses file's metadata records them; the sampling keys added after files were
        first written are left out at their defaults, so a greedy file written before them still resumes."""
        out = asdict(self)
        for key, default in (("top_k", 0), ("top_p", 1.0), ("greedy_share", 0.0)):
            if out[key] == default:
                del out[key]
        return out


def _meta_path(path: Path) -> Path:
    return path.with_name(path.name + ".meta.json")


def _prompts_sha(records: Sequence[Conversation]) -> str:
    h = hashlib.sha256()
    for r in records:
        h.update(json.dumps(r.prompt).encode())
    return h.hexdigest()


def part_paths(path: Path) -> list[Path]:
    return sorted(path.parent.glob(path.name + ".part-*"))


def merge_parts(path: Path) -> None:
    """Append the samples of the per-process files missing from `path` (in index order), then delete them."""
    path = Path(path)
    done = read_done(path)
    extra: dict[int, dict] = {}
    for part in part_paths(path):
        extra.update({i: row for i, row in read_done(part).items() if i not in done})
    with open_append(path, "regenerated responses") as out:
        for i in sorted(extra):
            out.write(json.dumps(extra[i], ensure_ascii=False) + "\n")
        out.flush()
        os.fsync(out.fileno())
    for part in part_paths(path):
        part.unlink()


def read_done(path: Path, repair: bool = True) -> dict[int, dict]:
    """Finished samples by index. A trailing partial line (a kill in mid-write) is cut off the file when
    `repair` (only ever by the one process that appends to it: another's file may be mid-write)."""
    done: dict[int, dict] = {}
    if not path.exists():
        return done
    size, good_end = path.stat().st_size, 0
    # Line by line within a bound (pdraft.readback): the file of a large regeneration holds gigabytes.
    for line in iter_lines(path, "regenerated responses", MAX_RESPONSE_LINE):
        if not line.endswith(b"\n"):
            break
        try:
            row = loads(line)
            done[int(row["index"])] = row
        except (ValueError, KeyError, TypeError, OverflowError):
            break
        good_end += len(line)
    if good_end != size and repair:  # cut in place, never through a link (pdraft.paths.open_in_place)
        fd = open_in_place(path, os.O_WRONLY, "regenerated responses")
        try:
            os.ftruncate(fd, good_end)
        finally:
            os.close(fd)
    return done


class _StreamSampler:
    """A transformers logits processor that samples each row from its own stream (one uniform per token, as
    the engine's target-alone rounds draw) and returns logits that keep only the drawn token."""

    def __init__(self, streams: Streams, sampling: SamplingParams):
        self.streams, self.sampling = streams, sampling

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        rows = torch.arange(scores.shape[0])
        ids = sample(probs_from_logits(scores, self.sampling), self.streams.draw(rows, 1)[:, 0])  # [batch]
        return torch.full_like(scores, float("-inf")).scatter(1, ids[:, None].to(scores.device), 0.0)


# A batch generator other than generate(): (prompts, max_new_tokens, stop ids, stream seeds, sampling) -> each
# prompt's new ids up to and including its first stop id (pdraft.decode.session.target_alone_loop gives pdraft's own).
BatchLoop = Callable[[list[list[int]], int, list[int], list[int], SamplingParams], list[list[int]]]


def _generate(target, prompts: list[list[int]], settings: RegenerateSettings, indices: list[int],
              loop: BatchLoop | None = None) -> list[list[int]]:
    """Each prompt's new ids, its greedy prompts and its sampled ones generated as two groups (one sampling
    setting per group, as every engine takes it), returned in the order of `indices`."""
    groups: dict[bool, list[int]] = {}  # greedy or not -> the batch's rows
    for j, i in enumerate(indices):
        groups.setdefault(is_greedy(settings.sampling_of(i)), []).append(j)
    out: list[list[int]] = [[] for _ in indices]
    for rows in groups.values():
        sampling = settings.sampling_of(indices[rows[0]])
        new = _generate_group(target, [prompts[j] for j in rows], settings, [indices[j] for j in rows], sampling, loop)
        for j, ids in zip(rows, new):
            out[j] = ids
    return out


@torch.no_grad()
def _generate_group(target, prompts: list[list[int]], settings: RegenerateSettings, indices: list[int],
                    sampling: SamplingParams, loop: BatchLoop | None = None) -> list[list[int]]:
    """Batched generation of the prompts of numbers `indices` under one `sampling`; returns each sample's new
    ids up to and including the first stop id: by `loop` when given, else by transformers' generate() over
    left-padded batches."""
    stops = set(eos_ids(target.model, target.tokenizer))
    longest = max(len(p) for p in prompts)
    max_new = new_token_cap(target, settings, longest)
    seeds = [request_seed(settings.seed, i) for i in indices]  # prompt i's stream, whatever its group
    if loop is not None:
        return loop(prompts, max_new, sorted(stops), seeds, sampling)
    from transformers import GenerationConfig, LogitsProcessorList

    device = target.runtime.device if target.runtime else torch.device("cpu")
    pad_id = getattr(target.tokenizer, "pad_token_id", None)
    pad_id = pad_id if pad_id is not None else (min(stops) if stops else 0)
    ids = torch.full((len(prompts), longest), pad_id, dtype=torch.long)  # [batch, longest]
    mask = torch.zeros_like(ids)
    for j, p in enumerate(prompts):
        ids[j, longest - len(p):] = torch.tensor(p)
        mask[j, longest - len(p):] = 1
    config = GenerationConfig(max_new_tokens=max_new, do_sample=False, pad_token_id=pad_id,
                              eos_token_id=sorted(stops) or None)
    processors = LogitsProcessorList()
    if sampling.temperature > 0:
        processors.append(_StreamSampler(Streams(seeds), sampling))
    # synced_gpus=False: transformers would otherwise sync every step over all processes when the target is
    # FSDP-wrapped (replicated across data-parallel groups), which generate different batches; the members of
    # one tensor-parallel group see the same batch and stop together anyway.
    out = target.model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), generation_config=config,
                                logits_processor=processors, synced_gpus=False)
    return [cut_at_stop(row, stops) for row in out[:, longest:].tolist()]  # [batch, new]


def open_responses(target, records: Sequence[Conversation], path: Path, settings: RegenerateSettings, *,
                   fresh: bool = False, part: tuple[int, int] = (0, 1), write: bool = True,
                   engine: str = "transformers") -> tuple[dict[int, dict], Path]:
    """What every engine does before generating: --fresh, refuse a file made with other settings (or another
    engine), record the settings, and read what is done. Returns (samples done by index, the file this part
    appends to)."""
    rank, world_size = part
    meta = {"target": target.id, "fingerprint": target_fingerprint(target), "settings": settings.meta(),
            "prompts_sha256": _prompts_sha(records), "num_prompts": len(records)}
    if engine != "transformers":  # absent for transformers, as in files written before engines were a choice
        meta["engine"] = engine
    meta_path = _meta_path(path)
    if fresh:
        for p in [path, meta_path, *part_paths(path)]:
            p.unlink(missing_ok=True)
    if (path.exists() or part_paths(path)) and meta_path.exists():
        old = parse_json(read_bytes(meta_path, "regeneration metadata", 16 << 20), str(meta_path))
        if not isinstance(old, dict):
            raise PdraftError(f"{meta_path} does not hold a JSON object", hint="pass --fresh to regenerate them all")
        changed = [k for k in sorted(set(meta) | set(old)) if old.get(k) != meta.get(k)]
        if changed:
            raise PdraftError(f"{path} holds responses made with other settings (changed: {', '.join(changed)})",
                              hint="pass --fresh to regenerate them all")
    make_dir(path.parent)
    if rank == 0 and write:
        atomic_write_text(meta_path, json.dumps(meta, indent=1) + "\n")
    out_path = path if world_size == 1 else path.with_name(f"{path.name}.part-{rank}")
    done = read_done(path, repair=write and out_path == path)
    for other in part_paths(path):  # samples of an earlier run with several processes, and the other parts'
        done.update(read_done(other, repair=write and other == out_path))
    return done, out_path


def response_row(target, record: Conversation, index: int, new_ids: list[int]) -> dict:
    """One line of the responses file: the sample's index, its turns, the new ids and their text."""
    return {"index": index, "turns": record.turns,
            "response": target.tokenizer.decode(new_ids, skip_special_tokens=True), "response_ids": new_ids}


def new_token_cap(target, settings: RegenerateSettings, prompt_len: int) -> int:
    """The recipe's cap on new tokens, shortened to what the target's context leaves after a prompt of
    `prompt_len` tokens; a prompt that leaves nothing is refused in one line."""
    cap = min(settings.max_new_tokens, target.max_context - prompt_len)
    if cap < 1:
        raise PdraftError(f"a prompt of {prompt_len} tokens leaves no room to generate within the target's "
                          f"context of {target.max_context} tokens", hint="lower data.max_length or drop long prompts")
    return cap


def engine_request(target, record: Conversation, settings: RegenerateSettings) -> tuple[list[int], int]:
    """A prompt's ids and its own cap on new tokens, as an engine child (vLLM, llama.cpp) is asked for them."""
    ids = encode_prompt(target.tokenizer, record.prompt, settings.chat_template, settings.enable_thinking)
    return ids, new_token_cap(target, settings, len(ids))


def cut_at_stop(ids: list[int], stops: set[int]) -> list[int]:
    """The new ids up to and including the first stop id."""
    return ids[: next((k + 1 for k, t in enumerate(ids) if t in stops), len(ids))]


def regenerate(target, records: Sequence[Conversation], path: str | Path, settings: RegenerateSettings,
               fresh: bool = False, progress: Callable[[int], None] | None = None,
               part: tuple[int, int] = (0, 1), write: bool = True, loop: BatchLoop | None = None
               ) -> list[Conversation] | None:
    """Records with `response`/`response_ids` from the target, resuming from `path` when it exists.
    With `part=(rank, world_size)`, world_size > 1, only this part's batches are generated and None is
    returned: the caller waits for every process, calls `merge_parts`, then `regenerated_records`. `write`
    False: generate with the part's writer (a sharded target's other members) but write nothing. `loop`: what
    generates a batch instead of generate() (see BatchLoop)."""
    rank, world_size = part
    path = Path(path)
    done, out_path = open_responses(target, records, path, settings, fresh=fresh, part=part, write=write)
    if progress:
        progress(len(done))
    bs = settings.batch_size
    with open_append(out_path, "regenerated responses") if write else contextlib.nullcontext() as out:  # never through a link
        for k in range(0, (len(records) + bs - 1) // bs):
            if k % world_size != rank:
                continue
            indices = list(range(k * bs, min((k + 1) * bs, len(records))))
            if all(i in done for i in indices):
                continue
            prompts = [encode_prompt(target.tokenizer, records[i].prompt, settings.chat_template,
                                     settings.enable_thinking) for i in indices]
            # The whole batch is generated again even when part of it was written, so that its samples
            # come out exactly as in an uninterrupted run.
            outputs = _generate(target, prompts, settings, indices, loop)
            written = 0
            for i, new_ids in zip(indices, outputs):
                if i in done:
                    continue
                row = response_row(target, records[i], i, new_ids)
                if out is not None:
                    out.write(json.dumps(row, ensure_ascii=False) + "\n")
                    out.flush()
                done[i] = row
                written += 1
            if out is not None:
                os.fsync(out.fileno())
            if progress:
                progress(written)
    return with_responses(records, done) if world_size == 1 else None


def regenerated_records(records: Sequence[Conversation], path: str | Path) -> list[Conversation]:
    """The records with the responses a finished (and merged) regeneration wrote to `path`."""
    return with_responses(records, read_done(Path(path)))


def with_responses(records: Sequence[Conversation], done: dict[int, dict]) -> list[Conversation]:
    return [Conversation(list(r.turns), done[i]["response"], list(done[i]["response_ids"]), r.origin)
            for i, r in enumerate(records)]
