"""safetensors headers, checked against the bytes before anything is read: the header length is sane and fits
the file, every tensor has a known dtype, a shape of whole numbers and byte offsets whose length is dtype size
x element count, the tensors' byte ranges are disjoint and cover the data section exactly, and the file ends
where the last tensor does. Only then are the bytes read, so a damaged header, or a 5 GB sparse file behind a
small header, is refused at the cost of reading its first kilobytes. `index_digest` is the checksum of the
header's tensor index (names, dtypes, shapes, offsets), which pdraft records beside the checksum of the tensor
bytes: an edited dtype or two swapped offsets change it even though the bytes do not. The format is the one
safetensors documents (8-byte little-endian header length, JSON header, data). A sharded checkpoint's
`model.safetensors.index.json` is read here too (`index_shards`), by its one schema, for every reader of one
(drafter loading, pull, push, the target loader)."""

from __future__ import annotations

import hashlib
import json
import math
import struct
from pathlib import Path
from typing import Any

from pydantic import Field

from pdraft.errors import PdraftError
from pdraft.readback import FileKind, Schema, load, loads

DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8, "U32": 4,
               "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
MAX_HEADER_BYTES = 100 << 20  # safetensors' own limit
MAX_DIMS = 8


def _bad(path: Path, why: str) -> PdraftError:
    return PdraftError(f"cannot read {path}: truncated or corrupted safetensors ({why})")


def read_header(path: str | Path) -> tuple[dict, int]:
    """(header, byte offset of the data section) of a safetensors file, every entry checked against the file's
    length. Reads only the header. Raises a one-line PdraftError naming what is wrong."""
    path = Path(path)
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        f.seek(0)
        if size < 8:
            raise _bad(path, "file shorter than the safetensors header length")
        (n,) = struct.unpack("<Q", f.read(8))
        if n > MAX_HEADER_BYTES or 8 + n > size:
            raise _bad(path, f"header length {n} does not fit a file of {size} bytes")
        raw = f.read(n)
    try:
        header = loads(raw)  # nesting bounded (pdraft.readback)
    except ValueError:
        raise _bad(path, "header is not JSON") from None
    if not isinstance(header, dict):
        raise _bad(path, "header is not a JSON object")
    meta = header.get("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        raise _bad(path, "__metadata__ is not a mapping of strings")
    spans = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(entry, dict) or entry.get("dtype") not in DTYPE_BYTES:
            raise _bad(path, f"tensor {name!r} has no known dtype")
        shape, offsets = entry.get("shape"), entry.get("data_offsets")
        if not (isinstance(shape, list) and len(shape) <= MAX_DIMS
                and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
            raise _bad(path, f"tensor {name!r} has shape {shape!r}")
        if not (isinstance(offsets, list) and len(offsets) == 2
                and all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offsets)):
            raise _bad(path, f"tensor {name!r} has data offsets {offsets!r}")
        if offsets[1] - offsets[0] != math.prod(shape) * DTYPE_BYTES[entry["dtype"]]:
            raise _bad(path, f"tensor {name!r}: {entry['dtype']} x {shape} does not take the "
                             f"{offsets[1] - offsets[0]} bytes its offsets give")
        spans.append((offsets[0], offsets[1], name))
    end = 0
    for start, stop, name in sorted(spans):
        if start != end:
            raise _bad(path, f"tensor {name!r} starts at byte {start}, expected {end} (overlapping or gapped data)")
        end = stop
    if 8 + n + end != size:
        raise _bad(path, f"the header describes {end} bytes of tensors, the file holds {size - 8 - n}")
    return header, 8 + n


def index_digest(header: dict) -> str:
    """SHA-256 of the tensor index (every entry but __metadata__), in a canonical JSON form."""
    index = {k: v for k, v in header.items() if k != "__metadata__"}
    return hashlib.sha256(json.dumps(index, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def shapes_of(header: dict) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v["shape"]) for k, v in header.items() if k != "__metadata__"}


class WeightIndex(Schema):
    """model.safetensors.index.json: tensor name -> shard file (transformers' layout)."""

    weight_map: dict[str, str] = Field(min_length=1, max_length=1 << 22)
    metadata: dict[str, Any] | None = None


WEIGHT_INDEX = FileKind("weight index", 64 << 20, WeightIndex)


def index_shards(index: str | Path, *, inside: str | None = None) -> list[str]:
    """The shard files a weight index names, sorted, each refused unless it is a plain file name (a name from
    the file must never point outside its folder). `inside`: the folder kind, whose links are refused."""
    names = sorted(set(load(index, WEIGHT_INDEX, inside=inside).weight_map.values()))
    for n in names:
        if not n or "/" in n or "\\" in n or n in (".", "..") or "\x00" in n:
            raise PdraftError(f"{index} names an unsafe shard file {n!r}")
    return names
