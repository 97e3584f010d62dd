"""Write the hidden-state cache: run the target over tokenised training sequences and store, shard by shard,
the chosen layers' features and the final-norm hidden state (format in format.py).

Sharding is deterministic: sequences go, in order, into shards of at most `shard_tokens` tokens (a longer
sequence gets a shard of its own), and the forward batches inside a shard are fixed by the same lengths. So
the plan depends only on the data, and a rerun after an interruption recomputes exactly the missing shards
and ends with files byte-identical to an uninterrupted run. Each shard is written to a temporary name,
fsynced, checksummed and renamed; only then is it added to the manifest (itself replaced atomically), so a
kill at any moment leaves no shard that looks complete without being so.

Before anything is written the size is estimated and checked against the free disk.

Under torchrun (`part=(rank, world_size)`, the data-parallel rank and size) the missing shards are dealt out
round-robin; each part writes its own shards and lists them in its own ``manifest.part-r.json``; part 0
alone writes ``manifest.json``: once before the others start, and once, complete, after all of them
finished. A rerun with any number of processes counts the shards listed in all these files (each verified by
its checksum) as done. Since the plan does not depend on who writes a shard, the cache is byte-identical to a
single-process export. With a sharded target the processes of a part compute every one of its shards
together and only the one with `writer=True` writes.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from pdraft.cache import format as fmt
from pdraft.cache.reader import pad_stack
from pdraft.data.templates import TrainingSequence
from pdraft.errors import PdraftError
from pdraft.paths import atomic_write_text, atomic_write_with, fsync_dir, make_dir
from pdraft.readback import load, loads
from pdraft.targets.fingerprint import target_fingerprint
from pdraft.targets.capture import check_layer_ids, final_norm

FP16_MAX = 65504.0


@torch.no_grad()
def target_states(target, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None):
    """One target forward: (features [batch, seq, n_layers*hidden], last hidden [batch, seq, hidden]).

    The last hidden state is the final norm's output, what the LM head consumes; the LM head itself runs on
    one position only (`logits_to_keep=1`), so no vocabulary-sized tensor is made for the whole sequence.
    Online training calls this too, so both paths see the same tensors."""
    grabbed: dict[str, torch.Tensor] = {}

    def keep(_module, _inputs, output):
        # The model calls its final norm once; the layer-capture hook of the last layer id reads the same call.
        grabbed["last"] = output[0] if isinstance(output, tuple) else output

    handle = final_norm(target.model).register_forward_hook(keep)
    try:
        kwargs = {"attention_mask": attention_mask, "use_cache": False}
        try:
            _, features = target.forward_features(input_ids, logits_to_keep=1, **kwargs)
        except TypeError:  # models without logits_to_keep
            _, features = target.forward_features(input_ids, **kwargs)
    finally:
        handle.remove()
    return features, grabbed["last"]


def plan_shards(lengths: Sequence[int], shard_tokens: int) -> list[tuple[int, int]]:
    """Consecutive sequence ranges [start, end) of at most `shard_tokens` tokens each (one sequence may exceed)."""
    plan: list[tuple[int, int]] = []
    start, tokens = 0, 0
    for i, n in enumerate(lengths):
        if i > start and tokens + n > shard_tokens:
            plan.append((start, i))
            start, tokens = i, 0
        tokens += n
    if len(lengths) > start:
        plan.append((start, len(lengths)))
    return plan


def plan_batches(lengths: Sequence[int], batch_tokens: int) -> list[tuple[int, int]]:
    """Forward batches [start, end) inside one shard: padded size (count x longest) at most batch_tokens."""
    batches: list[tuple[int, int]] = []
    start, longest = 0, 0
    for i, n in enumerate(lengths):
        if i > start and max(longest, n) * (i - start + 1) > batch_tokens:
            batches.append((start, i))
            start, longest = i, 0
        longest = max(longest, n)
    if len(lengths) > start:
        batches.append((start, len(lengths)))
    return batches


def data_fingerprint(sequences: Sequence[TrainingSequence]) -> str:
    h = hashlib.sha256()
    for s in sequences:
        h.update(len(s.input_ids).to_bytes(4, "little"))
        h.update(torch.tensor(s.input_ids, dtype=torch.int64).numpy().tobytes())
        h.update(bytes(s.loss_mask))
    return h.hexdigest()


@dataclass
class ExportResult:
    folder: Path
    estimate: fmt.SizeEstimate
    num_shards: int
    shards_done_before: int = 0
    shards_written: int = 0
    tokens_written: int = 0
    seconds: float = 0.0
    estimate_only: bool = False
    manifest: dict = field(default_factory=dict, repr=False)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens_written / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> dict:
        return {"folder": str(self.folder), "estimate_only": self.estimate_only, "sequences": self.estimate.sequences,
                "tokens": self.estimate.tokens, "bytes": self.estimate.total_bytes,
                "bytes_per_token": self.estimate.bytes_per_token, "bytes_per_sample": self.estimate.bytes_per_sample,
                "num_shards": self.num_shards,
                "shards_done_before": self.shards_done_before, "shards_written": self.shards_written,
                "tokens_written": self.tokens_written, "seconds": round(self.seconds, 3),
                "tokens_per_second": round(self.tokens_per_second, 1)}


# Manifest keys whose change makes existing shards useless (compared on resume).
_IDENTITY_KEYS = ("layer_ids", "hidden_size", "dtype", "shard_tokens", "batch_tokens", "plan")


def remove_cache(folder: Path) -> None:
    """--fresh: delete what a cache writer made (never unrelated files in the folder). Shards are recognised by
    name and by the manifest that marks the folder as a pdraft cache (of any format version); without that
    manifest a `shard-*.safetensors` is deleted only if its own header says pdraft wrote it. A `manifest.json`
    that is not pdraft's refuses the whole --fresh before anything is deleted."""
    manifest = folder / fmt.MANIFEST_NAME
    ours = False
    if os.path.lexists(manifest):
        try:
            data = fmt.parse_manifest(manifest) if not manifest.is_symlink() else None
        except PdraftError:
            data = None
        if not isinstance(data, dict) or data.get("format") != fmt.FORMAT_NAME:
            raise PdraftError(f"--fresh refused: {manifest} is not a pdraft hidden-state cache manifest; nothing was "
                              f"deleted", hint="point data.cache_dir at a folder of its own")
        ours = True
    for p in folder.glob("shard-*.safetensors"):
        if not p.is_symlink() and (ours or _shard_is_ours(p)):
            p.unlink(missing_ok=True)
    for p in folder.glob(fmt.TMP_PREFIX + "*"):
        if p.is_file() and not p.is_symlink():
            p.unlink(missing_ok=True)
    (folder / fmt.MANIFEST_NAME).unlink(missing_ok=True)


def _shard_is_ours(path: Path) -> bool:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            meta = loads((f.metadata() or {}).get("pdraft", "{}"))
        return meta.get("format") == fmt.FORMAT_NAME
    except Exception:  # not a safetensors file at all, or not one of ours: leave it
        return False


PART_MANIFEST = "manifest.part-{}.json"


def _part_manifests(folder: Path) -> list[Path]:
    return sorted(folder.glob(PART_MANIFEST.format("*")))


def _listed_shards(folder: Path, manifest: dict) -> list[dict]:
    """Shards listed in the manifest or in a process's part manifest, by index."""
    entries = {e["index"]: e for e in manifest.get("shards", [])}
    for part in _part_manifests(folder):
        try:
            shards = load(part, fmt.PART_MANIFEST, inside="cache folder").model_dump()["shards"]
        except PdraftError:  # unreadable (a kill mid-write cannot do it: it is replaced atomically)
            continue
        entries.update({e["index"]: e for e in shards})
    return [e for _, e in sorted(entries.items())]


def _verified_shards(folder: Path, manifest: dict) -> list[dict]:
    """Listed shards whose file is present with the recorded size and checksum; others are redone."""
    return [e for e in _listed_shards(folder, manifest) if fmt.shard_fault(folder, e) is None]


def write_cache(
    target,
    sequences: Sequence[TrainingSequence],
    folder: str | Path,
    *,
    shard_tokens: int = 65536,
    dtype: str = "auto",
    batch_tokens: int = 8192,
    extra: dict | None = None,
    estimate_only: bool = False,
    fresh: bool = False,
    on_estimate: Callable[[fmt.SizeEstimate, int], None] | None = None,
    progress: Callable[[int], None] | None = None,
    part: tuple[int, int] = (0, 1),
    writer: bool = True,
    barrier: Callable[[str], None] = lambda what: None,
) -> ExportResult:
    """Export `sequences` through `target` into `folder`, resuming a partial cache made with the same plan.

    `extra` goes into the manifest as is (source, resolved recipe). `on_estimate(estimate, bytes still to
    write)` is called before anything is written; `progress(tokens)` after each forward batch. `part` is
    (rank, world_size) under torchrun, `writer` whether this process writes its part's files, and
    `barrier(what)` waits for every process (see the module docstring). The cache folder is locked while it is
    written (pdraft.locks), by rank 0 for a distributed job: a second writer stops at once with one line."""
    kw = dict(shard_tokens=shard_tokens, dtype=dtype, batch_tokens=batch_tokens, extra=extra,
              estimate_only=estimate_only, fresh=fresh, on_estimate=on_estimate, progress=progress, part=part,
              writer=writer, barrier=barrier)
    if estimate_only or part[0] != 0 or not writer or (Path(folder).exists() and not Path(folder).is_dir()):
        return _write_cache(target, sequences, folder, **kw)  # writes nothing, refuses, or rank 0 holds the lock
    from pdraft.locks import folder_lock

    with folder_lock(folder, "hidden-state cache folder"):
        return _write_cache(target, sequences, folder, **kw)


def _write_cache(target, sequences, folder, *, shard_tokens, dtype, batch_tokens, extra, estimate_only, fresh,
                 on_estimate, progress, part, writer, barrier) -> ExportResult:
    rank, world_size = part
    main = rank == 0 and writer
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise PdraftError(f"cache folder {folder} is a file", hint="point data.cache_dir at a folder")
    if not sequences:
        raise PdraftError("empty dataset: no training sequence to export")
    store = fmt.resolve_store_dtype(dtype, target.runtime.dtype if target.runtime else torch.float32)
    lengths = [len(s) for s in sequences]
    plan = plan_shards(lengths, shard_tokens)
    check_layer_ids(target.layer_ids, target.num_layers, legacy_last=False)  # never write a cache no engine can use
    est = fmt.estimate(sum(lengths), len(sequences), len(target.layer_ids), target.hidden_size, store, len(plan))
    header = {
        "format": fmt.FORMAT_NAME, "version": fmt.FORMAT_VERSION,
        "target": {"id": target.id, "revision": target.revision, "fingerprint": target_fingerprint(target)},
        "layer_ids": list(target.layer_ids), "hidden_size": target.hidden_size, "dtype": store,
        "shard_tokens": shard_tokens, "batch_tokens": batch_tokens,
        "data": {"sha256": data_fingerprint(sequences), "sequences": len(sequences), "tokens": est.tokens,
                 "loss_tokens": sum(s.num_loss_tokens for s in sequences)},
        "plan": [list(r) for r in plan],
    }
    old = None if fresh else fmt.read_manifest(folder)
    done: list[dict] = []
    if old is not None:
        changed = [k for k in _IDENTITY_KEYS if old.get(k) != header[k]]
        if old["target"]["fingerprint"] != header["target"]["fingerprint"]:
            changed.insert(0, "target")
        if old["data"]["sha256"] != header["data"]["sha256"]:
            changed.append("data")
        if changed:
            raise PdraftError(f"the cache in {folder} was started with other settings (changed: {', '.join(changed)})",
                              hint="pass --fresh to start over, or point data.cache_dir elsewhere")
        done = _verified_shards(folder, old)
    done_idx = {e["index"] for e in done}
    todo = [(a, b) for i, (a, b) in enumerate(plan) if i not in done_idx]
    mine = set([i for i in range(len(plan)) if i not in done_idx][rank::world_size])
    remaining_bytes = fmt.estimate(sum(sum(lengths[a:b]) for a, b in todo), sum(b - a for a, b in todo),
                                   len(target.layer_ids), target.hidden_size, store, len(todo)).total_bytes
    if on_estimate:
        on_estimate(est, remaining_bytes)
    result = ExportResult(folder, est, len(plan), shards_done_before=len(done), estimate_only=estimate_only)
    if estimate_only:
        return result
    fmt.check_disk(folder, remaining_bytes, est)

    barrier("reading the cache's old state")  # before rank 0 rewrites it
    manifest = {**header, **(extra or {}), "complete": False, "shards": sorted(done, key=lambda e: e["index"])}
    if main:
        make_dir(folder, "cache folder")
        if fresh:
            remove_cache(folder)
        fmt.clean_temporaries(folder)
        fmt.write_manifest(folder, manifest)  # the part manifests' shards are in it now
        for part_file in _part_manifests(folder):
            part_file.unlink()
    barrier("starting the manifest")
    if progress:
        progress(sum(e["tokens"] for e in done))
    start = time.perf_counter()
    mine_written: list[dict] = []
    for index, (a, b) in enumerate(plan):
        if index not in mine:
            continue
        entry = _write_shard(target, sequences[a:b], folder, index, (a, b), store, batch_tokens, progress, writer)
        if not writer:  # a member of a sharded target's group: it computed the shard with the writer
            continue
        if world_size == 1:
            manifest["shards"].append(entry)
            manifest["shards"].sort(key=lambda e: e["index"])
            fmt.write_manifest(folder, manifest)
        else:
            mine_written.append(entry)
            atomic_write_text(folder / PART_MANIFEST.format(rank), json.dumps({"shards": mine_written}) + "\n")
        result.shards_written += 1
        result.tokens_written += entry["tokens"]
    barrier("their share of the shards")
    if world_size > 1:  # every process's shards, just written and listed in the part manifests
        manifest["shards"] = _listed_shards(folder, manifest)
    manifest["complete"] = len(manifest["shards"]) == len(plan)
    if main:
        fmt.write_manifest(folder, manifest)
        for part_file in _part_manifests(folder):
            part_file.unlink()
    barrier("completing the manifest")
    result.seconds = time.perf_counter() - start
    result.manifest = manifest
    return result


def _write_shard(target, seqs: Sequence[TrainingSequence], folder: Path, index: int, span: tuple[int, int],
                 store: str, batch_tokens: int, progress, writer: bool = True) -> dict | None:
    from safetensors.torch import save_file

    store_dtype = fmt.STORE_DTYPES[store]
    device = target.runtime.device if target.runtime else torch.device("cpu")
    pad_id = getattr(target.tokenizer, "pad_token_id", None) or 0
    feats, lasts = [], []
    for a, b in plan_batches([len(s) for s in seqs], batch_tokens):
        batch = seqs[a:b]
        ids = pad_stack([torch.tensor(s.input_ids, dtype=torch.long) for s in batch], pad_id)  # [batch, longest]
        mask = pad_stack([torch.ones(len(s), dtype=torch.long) for s in batch])
        # Right padding with a causal model leaves real positions untouched; the mask is only passed when
        # there is padding, so single-length batches take the plain causal path.
        attn = mask.to(device) if bool((mask == 0).any()) else None
        f, last = target_states(target, ids.to(device), attn)  # [batch, longest, L*H], [batch, longest, H]
        for j, s in enumerate(batch):
            feats.append(_stored(f[j, : len(s)], store_dtype, index))
            lasts.append(_stored(last[j, : len(s)], store_dtype, index))
        if progress:
            progress(sum(len(s) for s in batch))
    if not writer:
        return None
    lengths = torch.tensor([len(s) for s in seqs], dtype=torch.int64)
    tensors = {
        "hidden": torch.cat(feats).contiguous(),  # [tokens, L*H]
        "last_hidden": torch.cat(lasts).contiguous(),  # [tokens, H]
        "input_ids": torch.tensor([t for s in seqs for t in s.input_ids], dtype=torch.int32),  # [tokens]
        "loss_mask": torch.tensor([m for s in seqs for m in s.loss_mask], dtype=torch.uint8),  # [tokens]
        "offsets": torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]),  # [sequences + 1]
    }
    name = fmt.shard_name(index)
    # One metadata key only: safetensors writes its metadata map in hash order, so several keys would make
    # two runs' files differ byte for byte.
    meta = json.dumps({"format": fmt.FORMAT_NAME, "version": fmt.FORMAT_VERSION, "shard": index, "sequences": list(span)})
    # Through an exclusive temporary renamed over the name: a link at the name is refused, never written through.
    digest = atomic_write_with(folder / name, lambda tmp: save_file(tensors, str(tmp), metadata={"pdraft": meta}))
    entry = {"index": index, "file": name, "sequences": list(span), "num_sequences": len(seqs),
             "tokens": int(lengths.sum()), "loss_tokens": int(tensors["loss_mask"].sum()),
             "bytes": os.stat(folder / name).st_size, "sha256": digest}
    fsync_dir(folder)
    return entry


def _stored(x: torch.Tensor, dtype: torch.dtype, index: int) -> torch.Tensor:
    if dtype == torch.float16 and x.dtype != torch.float16 and bool((x.abs() > FP16_MAX).any()):
        raise PdraftError(f"shard {index}: hidden states exceed the float16 range (|x| > {FP16_MAX:.0f})",
                          hint="store the cache in bfloat16 or float32 instead")
    return x.detach().to("cpu", dtype)
