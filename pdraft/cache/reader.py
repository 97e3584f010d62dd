"""Read the hidden-state cache as a torch Dataset of sequences, after checking that it is complete, intact
and made for the target and layer ids the caller trains against.

At open, the manifest is read, compared with the expected target fingerprint and layer ids, and every
shard's presence and byte size are checked (a truncated shard fails here). Checksums are verified either at
open (`verify="open"`), or the first time each shard is read in a process (`verify="lazy"`, the default,
so that a large cache opens at once), or never (`verify="none"`). Every failure is one PdraftError line
naming the shard. Items use DeepSpec's key names, so a trainer written for either reads both.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import Literal

import torch
from torch.utils.data import Dataset

from pdraft.cache import format as fmt
from pdraft.errors import PdraftError
from pdraft.targets.fingerprint import target_fingerprint

Verify = Literal["open", "lazy", "none"]


class HiddenCache(Dataset):
    """Sequences of a finished cache. Item i is a dict:
    input_ids [T] int64, loss_mask [T] bool, target_hidden_states [T, n_layers*hidden],
    target_last_hidden_states [T, hidden] (stored dtype)."""

    def __init__(self, folder: str | Path, *, target=None, fingerprint: dict | None = None,
                 layer_ids: list[int] | None = None, verify: Verify = "lazy", max_open_shards: int = 4):
        self.folder = Path(folder)
        manifest = fmt.read_manifest(self.folder)
        if manifest is None:
            raise PdraftError(f"{self.folder}: no hidden-state cache here (no {fmt.MANIFEST_NAME})",
                              hint="run `pdraft export-hidden` first")
        if target is not None:
            fingerprint = fingerprint or target_fingerprint(target)
            layer_ids = layer_ids if layer_ids is not None else list(target.layer_ids)
        fmt.check_compatible(manifest, fingerprint=fingerprint, layer_ids=layer_ids, where=f"the cache in {self.folder}")
        if not manifest.get("complete"):
            raise PdraftError(f"the cache in {self.folder} is incomplete ({len(manifest['shards'])} of "
                              f"{len(manifest['plan'])} shards)", hint="re-run `pdraft export-hidden` to finish it")
        self.manifest = manifest
        self.shards = sorted(manifest["shards"], key=lambda e: e["index"])
        for entry in self.shards:
            self._check(entry)
        self._verified: set[int] = set()
        self.verify_mode = verify
        if verify == "open":
            self.verify()
        self._shard_of: list[tuple[int, int]] = []  # sequence -> (shard position, index inside the shard)
        for pos, entry in enumerate(self.shards):
            if entry["sequences"][0] != len(self._shard_of):
                raise PdraftError(f"{self.folder / fmt.MANIFEST_NAME}: shard {entry['file']} does not follow the previous one")
            self._shard_of.extend((pos, j) for j in range(entry["num_sequences"]))
        self._open: OrderedDict[int, tuple] = OrderedDict()
        self.max_open_shards = max_open_shards

    # ------------------------------------------------------------------ facts
    @property
    def layer_ids(self) -> list[int]:
        return list(self.manifest["layer_ids"])

    @property
    def hidden_size(self) -> int:
        return int(self.manifest["hidden_size"])

    @property
    def dtype(self) -> torch.dtype:
        return fmt.STORE_DTYPES[self.manifest["dtype"]]

    def __len__(self) -> int:
        return len(self._shard_of)

    # ------------------------------------------------------------------ integrity
    def _path(self, entry: dict) -> Path:
        return self.folder / entry["file"]

    def _check(self, entry: dict, checksum: bool = False) -> None:
        """Presence and byte size, and the sha256 too with `checksum`."""
        p = self._path(entry)
        fault = fmt.shard_fault(self.folder, entry, checksum=checksum)
        if fault == "missing":
            raise PdraftError(f"cache shard {p} is missing", hint="re-run `pdraft export-hidden` to rebuild it")
        if fault == "size":
            raise PdraftError(f"cache shard {p} is truncated or altered: {p.stat().st_size} bytes, the manifest says "
                              f"{entry['bytes']}", hint="re-run `pdraft export-hidden` to rebuild it")
        if fault == "sha256":
            raise PdraftError(f"cache shard {p} is corrupted (sha256 differs from the manifest)",
                              hint="re-run `pdraft export-hidden` to rebuild it")

    def _check_sum(self, pos: int) -> None:
        self._check(self.shards[pos], checksum=True)
        self._verified.add(pos)

    def verify(self) -> None:
        """Check every shard's checksum now."""
        for pos in range(len(self.shards)):
            if pos not in self._verified:
                self._check_sum(pos)

    # ------------------------------------------------------------------ reading
    def _shard(self, pos: int):
        if pos in self._open:
            self._open.move_to_end(pos)
            return self._open[pos]
        if self.verify_mode == "lazy" and pos not in self._verified:
            self._check_sum(pos)
        from safetensors import safe_open

        path = self._path(self.shards[pos])
        try:
            handle = safe_open(str(path), framework="pt")
            offsets = handle.get_tensor("offsets")  # [sequences + 1]
        except Exception as e:  # noqa: BLE001 - safetensors reports a damaged header in several ways
            raise PdraftError(f"cache shard {path} is unreadable ({type(e).__name__})",
                              hint="re-run `pdraft export-hidden` to rebuild it") from None
        self._open[pos] = (handle, offsets)
        while len(self._open) > self.max_open_shards:
            self._open.popitem(last=False)
        return self._open[pos]

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if not 0 <= i < len(self):
            raise IndexError(i)
        pos, j = self._shard_of[i]
        handle, offsets = self._shard(pos)
        a, b = int(offsets[j]), int(offsets[j + 1])
        return {
            "input_ids": handle.get_slice("input_ids")[a:b].long(),
            "loss_mask": handle.get_slice("loss_mask")[a:b].bool(),
            "target_hidden_states": handle.get_slice("hidden")[a:b],
            "target_last_hidden_states": handle.get_slice("last_hidden")[a:b],
        }

    def response_ids(self, i: int) -> torch.Tensor:
        """The loss-mask tokens of sequence i [n] int64, read without its hidden states."""
        if not 0 <= i < len(self):
            raise IndexError(i)
        pos, j = self._shard_of[i]
        handle, offsets = self._shard(pos)
        a, b = int(offsets[j]), int(offsets[j + 1])
        return handle.get_slice("input_ids")[a:b].long()[handle.get_slice("loss_mask")[a:b].bool()]

    def lengths(self) -> list[int]:
        """Sequence lengths in order (reads each shard's small offsets tensor), e.g. for length-grouped batches."""
        out: list[int] = []
        for pos in range(len(self.shards)):
            _, offsets = self._shard(pos)
            out.extend((offsets[1:] - offsets[:-1]).tolist())
        return out

    def __getstate__(self):  # DataLoader workers open their own handles
        state = dict(self.__dict__)
        state["_open"] = OrderedDict()
        return state


def pad_stack(rows: list[torch.Tensor], value=0) -> torch.Tensor:
    """Right-pad rows [T_i, ...] into [len(rows), max T_i, ...] filled with `value` (dtype and device of rows[0])."""
    longest = max(r.shape[0] for r in rows)
    out = rows[0].new_full((len(rows), longest, *rows[0].shape[1:]), value)
    for i, r in enumerate(rows):
        out[i, : r.shape[0]] = r
    return out


def collate(items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Right-pad a list of items into a batch with an attention mask ([batch, T_max] and [batch, T_max, D])."""
    out = {key: pad_stack([it[key] for it in items]) for key in items[0]}
    out["attention_mask"] = pad_stack([torch.ones(it["input_ids"].shape[0], dtype=torch.long) for it in items])
    return out


def open_cache(folder: str | Path, target=None, verify: Verify = "lazy") -> HiddenCache:
    return HiddenCache(folder, target=target, verify=verify)
