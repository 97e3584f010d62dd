"""The hidden-state cache on disk: file names, the versioned manifest (with the target fingerprint of
pdraft.targets.fingerprint), size estimates
and checksums. The writer (writer.py) and the reader (reader.py) share every definition here.

Layout of a cache folder::

    manifest.json             format version, target id/revision/fingerprint, layer ids, dtype, the shard
                              plan and, per finished shard, token counts, byte size and sha256
    recipe.resolved.yaml      the recipe that made it
    shard-00000.safetensors   one shard (below)
    ...

A shard holds consecutive whole sequences; its safetensors tensors are ``hidden`` [tokens, n_layers*hidden]
(the chosen layers' outputs concatenated in layer-id order), ``last_hidden`` [tokens, hidden] (the target's
final-norm output, which its frozen LM head turns into logits, so vocabulary-sized tensors are never
stored), ``input_ids`` int32 [tokens], ``loss_mask`` uint8 [tokens] and ``offsets`` int64 [sequences+1]
(sequence j is rows offsets[j]:offsets[j+1]). Compared with DeepSpec's cache (raw .bin shards plus a
binary index) the per-sequence index lives inside each shard, so a shard is self-describing and safe to
checksum on its own.

Stored dtype ("auto"): bfloat16 when the target computes in bfloat16 (GPU default, as DeepSpec stores),
float16 when it computes in float16 or float32 (CPU default: half the disk of float32 and three more
mantissa bits than bfloat16; values beyond float16's range stop the export with an error instead of
silently becoming inf).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from pydantic import Field

from pdraft.errors import PdraftError
from pdraft.paths import atomic_write_text, sha256_file as _sha256_file
from pdraft.readback import FileKind, Schema, check, parse_json, read_bytes

FORMAT_NAME = "pdraft-hidden-cache"
FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
SHARD_PATTERN = "shard-{:05d}.safetensors"
TMP_PREFIX = ".tmp-"
STORE_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
_NUMBER_LIST = re.compile(r"\[\s*(-?\d+(?:,\s*-?\d+)*)\s*\]")
_COUNT = 1 << 62


class _Fingerprint(Schema):
    num_layers: int = Field(ge=1, le=1024)


class _Target(Schema):
    id: str
    revision: str | None = None
    fingerprint: _Fingerprint


class _Shard(Schema):
    index: int = Field(ge=0, le=99_999)
    file: str = Field(pattern=r"^shard-\d{5}\.safetensors$")  # a name of this folder, never a path
    sequences: list[int] = Field(min_length=2, max_length=2)
    num_sequences: int = Field(ge=0, le=_COUNT)
    tokens: int = Field(ge=0, le=_COUNT)
    bytes: int = Field(ge=0, le=_COUNT)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class CacheManifest(Schema):
    """What the reader, the writer's resume and `train` take from manifest.json, typed and in range (the rest,
    such as the recipe that made the cache, is kept as written)."""

    format: str
    version: int
    target: _Target
    layer_ids: list[int] = Field(min_length=1, max_length=1024)
    hidden_size: int = Field(ge=1, le=1 << 16)
    dtype: str = Field(pattern="^(" + "|".join(STORE_DTYPES) + ")$")
    plan: list[list[int]] = Field(max_length=99_999)
    shards: list[_Shard] = Field(max_length=99_999)
    complete: bool = False


class PartManifest(Schema):
    """manifest.part-N.json: the shards one process of a distributed export finished."""

    shards: list[_Shard] = Field(max_length=99_999)


MANIFEST = FileKind("cache manifest", 256 << 20, CacheManifest)
PART_MANIFEST = FileKind("part manifest", 256 << 20, PartManifest)


# The cache code calls it through this module (tests patch fmt.sha256_file).
sha256_file = _sha256_file


def shard_name(index: int) -> str:
    return SHARD_PATTERN.format(index)


def shard_fault(folder: str | Path, entry: dict, *, checksum: bool = True) -> str | None:
    """None when the shard of manifest `entry` is in `folder` with the recorded byte size and (if `checksum`)
    sha256; else the first check that failed: "missing", "size" or "sha256"."""
    p = Path(folder) / entry["file"]
    if not p.exists():
        return "missing"
    if p.stat().st_size != entry["bytes"]:
        return "size"
    if checksum and sha256_file(p) != entry["sha256"]:
        return "sha256"
    return None


def resolve_store_dtype(name: str, compute_dtype: torch.dtype) -> str:
    if name == "auto":
        return "bfloat16" if compute_dtype == torch.bfloat16 else "float16"
    if name not in STORE_DTYPES:
        raise PdraftError(f"cache dtype {name!r} is not one of auto, {', '.join(STORE_DTYPES)}")
    return name


def check_compatible(manifest: dict, *, fingerprint: dict | None = None, layer_ids: list[int] | None = None,
                     where: str = "cache") -> None:
    """Refuse, in one line, a cache made for another target or other layer ids, or for ids the layer-id rule
    refuses (an older cache with unsorted ids or the target's last layer)."""
    from pdraft.targets.capture import check_layer_ids

    num_layers = (manifest.get("target", {}).get("fingerprint") or {}).get("num_layers")
    try:
        check_layer_ids(manifest["layer_ids"], num_layers, legacy_last=False)
    except PdraftError as e:
        raise PdraftError(f"{where}: {e.message}", hint="re-run export-hidden with allowed layer ids") from None
    if layer_ids is not None and list(manifest["layer_ids"]) != [int(i) for i in layer_ids]:
        raise PdraftError(f"{where} was made for target layer ids {manifest['layer_ids']}, not {list(layer_ids)}",
                          hint="re-run export-hidden with these layer ids, or use the matching recipe")
    if fingerprint is not None:
        mine = manifest["target"]["fingerprint"]
        diff = [k for k in fingerprint if fingerprint.get(k) != mine.get(k)]
        if diff:
            raise PdraftError(f"{where} was made for another target ({manifest['target']['id']}; differs in "
                              f"{', '.join(diff)})", hint="re-run export-hidden for this target")


# --------------------------------------------------------------------------------------------- manifest


def parse_manifest(path: Path) -> object:
    """The parsed JSON of the manifest at `path`, read within its size limit and nesting bound (pdraft.readback):
    for the writer's --fresh, which only asks whether a manifest is pdraft's."""
    return parse_json(read_bytes(path, MANIFEST.title, MANIFEST.limit, inside="cache folder"), f"{path}")


def read_manifest(folder: str | Path) -> dict | None:
    path = Path(folder) / MANIFEST_NAME
    if not path.exists():
        return None
    try:
        manifest = parse_manifest(path)
    except PdraftError as e:
        raise PdraftError(f"unreadable cache manifest: {e.message}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
        raise PdraftError(f"{path}: not a pdraft hidden-state cache manifest")
    if manifest.get("version") != FORMAT_VERSION:
        raise PdraftError(f"{path}: cache format version {manifest.get('version')} is not supported "
                          f"(this pdraft reads version {FORMAT_VERSION})", hint="re-run export-hidden with --fresh")
    check(MANIFEST, manifest, f"{path}")  # every field the reader and the writer use, typed and in range
    return manifest


def write_manifest(folder: str | Path, manifest: dict) -> None:
    text = json.dumps(manifest, indent=1)
    # Keep lists of numbers (layer ids, the shard plan) on one line each, so the manifest stays readable.
    text = _NUMBER_LIST.sub(lambda m: "[" + ", ".join(m.group(1).replace(",", " ").split()) + "]", text)
    atomic_write_text(Path(folder) / MANIFEST_NAME, text + "\n")


# --------------------------------------------------------------------------------------------- sizing


@dataclass(frozen=True)
class SizeEstimate:
    tokens: int
    sequences: int
    num_layers: int
    hidden_size: int
    dtype_bytes: int
    shards: int = 1

    @property
    def bytes_per_token(self) -> int:
        # layers' features + last hidden state, plus int32 id and uint8 mask
        return (self.num_layers + 1) * self.hidden_size * self.dtype_bytes + 4 + 1

    @property
    def bytes_per_sample(self) -> int:
        """What one training sequence costs on disk, on average."""
        return self.total_bytes // max(1, self.sequences)

    @property
    def total_bytes(self) -> int:
        # + int64 offsets (sequences + 1 per shard) + a safetensors header (under 1 KB) per shard
        return self.tokens * self.bytes_per_token + 8 * (self.sequences + self.shards) + 1024 * self.shards


def estimate(tokens: int, sequences: int, num_layers: int, hidden_size: int, dtype: str, shards: int = 1) -> SizeEstimate:
    return SizeEstimate(tokens, sequences, num_layers, hidden_size, STORE_DTYPES[dtype].itemsize, shards)


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"


def free_bytes(folder: str | Path) -> int:
    """Free space where `folder` will live (its nearest existing ancestor). Called through `shutil` so that
    tests can simulate a full disk."""
    import shutil

    p = Path(folder).resolve()
    while not p.exists() and p != p.parent:
        p = p.parent
    return int(shutil.disk_usage(p).free)


def check_disk(folder: str | Path, needed: int, est: SizeEstimate | None = None) -> None:
    """Refuse an export the disk cannot hold, saying what it needs (a sample's share too, when `est` is given)
    and that online training (`train.online: true`) needs no cache at all."""
    free = free_bytes(folder)
    if needed > free:
        each = f" ({human_bytes(est.bytes_per_sample)} a sample)" if est is not None else ""
        raise PdraftError(f"not enough disk for the hidden-state cache in {folder}: needs {human_bytes(needed)}{each}, "
                          f"{human_bytes(free)} free",
                          hint="train with train.online: true, which computes the target's hidden states during "
                               "training and needs no cache; or free space, point data.cache_dir elsewhere, or "
                               "lower data.max_samples")


def clean_temporaries(folder: str | Path) -> int:
    """Remove shard temporaries left by a killed writer; they never look like finished shards."""
    removed = 0
    for p in Path(folder).glob(TMP_PREFIX + "*"):
        try:
            os.remove(p)
            removed += 1
        except OSError:
            pass
    return removed
