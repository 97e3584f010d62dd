"""Reading back files: the one layer every file pdraft reads goes through (its own artifacts and sidecars,
published configs, cost tables, bench reports, cache manifests, run state; the line readers of prompt sets and
metrics streams parse each line here too). A file is opened once, without blocking (a pipe) and, when it is
read as part of a folder, without following a link; its size is checked on the open descriptor before a byte
is read, so a 3 GB sidecar or /dev/zero is refused at the cost of an fstat; JSON is parsed with its nesting
bounded (MAX_DEPTH levels; a deeper document is refused, never recursed into) and its NaN / Infinity tokens
kept as floats for the schema to judge; and the parsed value is validated by the one schema of its kind.

A kind (`FileKind`) is what a file is to pdraft: a title for messages, a size limit and a schema, a pydantic
model whose fields carry the types (strict: "1.5" is not a number), ranges and finiteness. Each kind is
declared once beside the code that owns it (the STS calibration in pdraft.calibration_files, the cost table in
pdraft.policies.cost, the bench report in pdraft.bench.report, the cache manifest in pdraft.cache.format,
the trainer state in pdraft.run_folder), and every command that reads that kind (decode, bench, export, push,
pull, calibrate, train) calls `load` with it, so each refuses the same files with the same one line:
`FILE: FIELD: expected ..., found ...`. config.json keeps its field table (pdraft.models.schema) and recipes
their pydantic schema (pdraft.recipe): both are read through `read_bytes` and `parse_json` here."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from pdraft.errors import PdraftError
from pdraft.paths import regular_file_inside
from pdraft.typed_yaml import format_error

MAX_DEPTH = 32  # JSON nesting: pdraft's deepest file (a bench report) nests 5 levels
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


class Schema(BaseModel):
    """The base of every file schema: strict types (a string is never read as a number, a float never as a
    count), no NaN or infinity, unknown keys kept (a file written by a newer pdraft or by an engine may carry
    more than this one reads)."""

    model_config = ConfigDict(strict=True, allow_inf_nan=False, extra="allow")


@dataclass(frozen=True)
class FileKind:
    title: str  # what the file is, for messages: "STS calibration"
    limit: int  # bytes; a larger file is refused before it is read
    schema: type[BaseModel] | None = None  # None: any JSON value within the limits (the reader checks the rest)


class TooDeep(ValueError):
    """A JSON document nested deeper than MAX_DEPTH (a ValueError, like json's own decoding errors)."""

    def __init__(self, depth: int = MAX_DEPTH):
        super().__init__(f"nested deeper than {depth} levels")


def _open_regular(path: Path, what: str, inside: str | None):
    """A binary file object on `path`, opened without blocking (a pipe) and, with `inside`, without following a
    link; refused in one line unless it is a regular file."""
    if inside is not None:
        regular_file_inside(path.parent, path.name, what=inside)
    try:
        fd = os.open(path, os.O_RDONLY | _NONBLOCK | (_NOFOLLOW if inside is not None else 0))
    except FileNotFoundError:
        raise PdraftError(f"{what} {path} does not exist") from None
    except OSError as e:
        raise PdraftError(f"cannot read {what} {path}: {e.strerror or type(e).__name__}") from None
    f = os.fdopen(fd, "rb")
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        f.close()
        if stat.S_ISDIR(st.st_mode):
            raise PdraftError(f"{what} {path} is a folder, expected a file")
        raise PdraftError(f"{what} {path} is not a regular file (a device or a pipe never ends)")
    return f


def read_bytes(path: str | os.PathLike, what: str, limit: int, *, inside: str | None = None) -> bytes:
    """The bytes of `path`, refused in one line unless it is a regular file of at most `limit` bytes, checked
    on the open descriptor before anything is read (and at most limit + 1 bytes are ever read, should it grow
    meanwhile). `inside` names the folder kind when the file is read as part of a folder (a drafter's sidecar,
    a cache's manifest): a symbolic link there is refused, never followed (pdraft.paths.regular_file_inside)."""
    path = Path(path)
    with _open_regular(path, what, inside) as f:
        st = os.fstat(f.fileno())
        if st.st_size > limit:
            raise PdraftError(f"{what} {path} holds {st.st_size:,} bytes, more than the {limit:,} such a file may "
                              f"hold; it was not read")
        try:
            blob = f.read(limit + 1)
        except OSError as e:
            raise PdraftError(f"cannot read {what} {path}: {e.strerror or type(e).__name__}") from None
    if len(blob) > limit:
        raise PdraftError(f"{what} {path} grew past the {limit:,} bytes such a file may hold while it was read")
    return blob


def read_text(path: str | os.PathLike, what: str, limit: int, *, inside: str | None = None) -> str:
    """read_bytes decoded as UTF-8; text that is not UTF-8 is one line."""
    try:
        return read_bytes(path, what, limit, inside=inside).decode("utf-8")
    except UnicodeDecodeError:
        raise PdraftError(f"{what} {path} is not UTF-8 text") from None


def iter_lines(path: str | os.PathLike, what: str, max_line: int, *, inside: str | None = None) -> Iterator[bytes]:
    """The lines of a file read line by line (a metrics log), each at most `max_line` bytes held: a longer one
    is yielded cut at max_line + 1 bytes (so the caller can tell it is too long) and the rest of it skipped."""
    with _open_regular(Path(path), what, inside) as f:
        while line := f.readline(max_line + 1):
            if len(line) > max_line and not line.endswith(b"\n"):
                while (rest := f.readline(max_line)) and not rest.endswith(b"\n"):
                    pass  # the rest of the over-long line
            yield line


def depth(value: Any) -> int:
    """How deeply `value` nests (a scalar 0, [] or {} 1, [[1]] 2), walked without recursion."""
    if not isinstance(value, (list, dict)):
        return 0
    deepest, stack = 1, [(value, 1)]
    while stack:
        node, level = stack.pop()
        deepest = max(deepest, level)
        children = node.values() if isinstance(node, dict) else node
        stack.extend((child, level + 1) for child in children if isinstance(child, (list, dict)))
    return deepest


def loads(text: str | bytes, max_depth: int = MAX_DEPTH) -> Any:
    """json.loads with its nesting bounded: TooDeep past `max_depth` levels (the parser's own recursion limit
    included); json's ValueErrors otherwise. NaN and Infinity stay floats, for the schema to refuse."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise TooDeep(max_depth) from None
    if depth(value) > max_depth:
        raise TooDeep(max_depth)
    return value


def parse_json(blob: str | bytes, where: str, max_depth: int = MAX_DEPTH) -> Any:
    """`loads`, with every failure one line naming `where`."""
    try:
        return loads(blob, max_depth)
    except TooDeep as e:
        raise PdraftError(f"{where}: refused, {e}") from None
    except UnicodeDecodeError:
        raise PdraftError(f"{where} is not UTF-8 text") from None
    except json.JSONDecodeError as e:
        raise PdraftError(f"{where} is not valid JSON ({e.msg}, line {e.lineno})") from None
    except ValueError as e:
        raise PdraftError(f"{where} is not valid JSON ({e})") from None


def validate(schema: type[BaseModel], data: Any, where: str):
    """`data` validated into `schema`; the first problem is one line: `where: FIELD: expected ..., found ...`."""
    try:
        return schema.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        if not err["loc"] and err["type"] in ("model_type", "dict_type"):
            raise PdraftError(f"{where} must hold a JSON object, found {_found(data)}") from None
        if err["type"] == "missing":
            raise PdraftError(f"{where} misses field '{'.'.join(map(str, err['loc']))}'") from None
        raise PdraftError(format_error(schema, err, where, {}, {})) from None


def _found(value: Any) -> str:
    return {list: "a list", str: "text", bool: "true/false", type(None): "null"}.get(type(value), "a number")


def check(kind: FileKind, data: Any, where: str):
    """The data of a file of `kind` (already parsed, or about to be written) validated by its schema."""
    return validate(kind.schema, data, where) if kind.schema is not None else data


def load(path: str | os.PathLike, kind: FileKind, *, inside: str | None = None, blob: bytes | None = None):
    """A file of `kind`: read within its size limit (`blob`: bytes already read, such as those push sends),
    parsed with bounded nesting, validated by its schema (the model instance; the parsed JSON for a kind
    without one)."""
    path = Path(path)
    where = f"{kind.title} {path}"
    if blob is None:
        blob = read_bytes(path, kind.title, kind.limit, inside=inside)
    elif len(blob) > kind.limit:
        raise PdraftError(f"{where} holds {len(blob):,} bytes, more than the {kind.limit:,} such a file may hold")
    return check(kind, parse_json(blob, where), where)


__all__ = ["MAX_DEPTH", "Schema", "FileKind", "TooDeep", "read_bytes", "read_text", "iter_lines", "depth", "loads",
           "parse_json",
           "validate", "check", "load"]
