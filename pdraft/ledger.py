"""What pdraft wrote into a folder: a small JSON list, `.pdraft-files`, beside the files of every artifact folder
pdraft writes (a drafter or checkpoint, a calibration, a bench report, an export, a pulled copy, a run folder).
Each entry is a file name with the sha256 and size of the bytes pdraft wrote under it, or, for a log pdraft
appends to, the name alone. It is how pdraft later tells its own files from anything else that lies there,
by content rather than by name or kind:

- `push` uploads a file only when its bytes hash to the entry pdraft recorded, so neither a symbolic link nor
  a hard link to anything else (a file holding the Hub token) nor a file a user copied or edited in travels;
- `train --fresh` and replacing a checkpoint delete from a pdraft-owned folder only the files listed there,
  and refuse, before deleting anything, a folder that holds something else.

The ledger names no folders: a sub-folder pdraft wrote (a drafter's `calibration/`) carries its own ledger.
It has no .json suffix, so pull, push and export never take it for part of a drafter. A folder without a
ledger was written by a pdraft before it kept one (or by someone else): pdraft then knows nothing of its
files by content; what each caller does then is said where it is called (push refuses and points at `pull
--out`, which makes a checked copy that has a ledger; --fresh falls back to the names pdraft writes there).

Updates are read-modify-write by one process: each artifact folder has one writer at a time (the run folder's
lock, a fresh temporary folder, the calibration run)."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

from pdraft.errors import PdraftError
from pdraft.paths import append_text, atomic_write_bytes, atomic_write_text, atomic_write_with, read_regular
from pdraft.readback import loads

LEDGER_NAME = ".pdraft-files"
FORMAT = "pdraft.files/1"
MAX_LEDGER_BYTES = 4 << 20  # a few hundred entries of ~150 bytes; anything far larger is not pdraft's
LOG = "log"  # the kind of an entry pdraft appends to: listed by name, its content not pinned


def read_ledger(folder: str | os.PathLike) -> dict[str, dict] | None:
    """{file name: {"sha256": ..., "bytes": ...} or {"kind": "log"}} of `folder`, or None when it has no
    ledger. A ledger that is a link, too large, or not pdraft's layout is refused in one line."""
    path = Path(folder) / LEDGER_NAME
    if not os.path.lexists(path):
        return None
    blob = read_regular(folder, LEDGER_NAME, what="folder", limit=MAX_LEDGER_BYTES)
    try:
        data = loads(blob.decode("utf-8"))  # nesting bounded (pdraft.readback)
    except ValueError:  # UnicodeDecodeError and JSON's errors included
        data = None
    files = data.get("files") if isinstance(data, dict) and data.get("format") == FORMAT else None
    if not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(v, dict) for k, v in files.items()):
        raise PdraftError(f"{path} is not pdraft's list of the files it wrote (damaged?)",
                          hint="delete it, then make a checked copy of the folder with `pdraft pull FOLDER --out NEW`")
    return files


def _save(folder: Path, files: dict[str, dict]) -> None:
    body = {"format": FORMAT, "files": {k: files[k] for k in sorted(files)}}
    atomic_write_text(folder / LEDGER_NAME, json.dumps(body, indent=1) + "\n")


def record(path: str | os.PathLike, sha256: str | None = None, size: int | None = None) -> None:
    """Enter `path` in its folder's ledger with the sha256 and size of what pdraft wrote there (hashed from the
    file when not given: call it right after writing, before anyone else could touch the file)."""
    path = Path(path)
    if sha256 is None:
        blob = read_regular(path.parent, path.name)
        sha256, size = hashlib.sha256(blob).hexdigest(), len(blob)
    files = read_ledger(path.parent) or {}
    files[path.name] = {"sha256": sha256, "bytes": int(size if size is not None else path.stat().st_size)}
    _save(path.parent, files)


def record_folder(folder: str | os.PathLike) -> None:
    """Enter every regular file of `folder` the ledger does not list yet: for a folder pdraft has just created
    and filled itself (a checkpoint's temporary, through a caller's writer that names files itself)."""
    folder = Path(folder)
    files = read_ledger(folder) or {}
    for entry in sorted(os.listdir(folder)):
        path = folder / entry
        if entry == LEDGER_NAME or entry in files or path.is_symlink() or not path.is_file():
            continue
        blob = read_regular(folder, entry)
        files[entry] = {"sha256": hashlib.sha256(blob).hexdigest(), "bytes": len(blob)}
    _save(folder, files)


def forget(path: str | os.PathLike) -> None:
    """Drop `path` from its folder's ledger (pdraft deleted it)."""
    path = Path(path)
    files = read_ledger(path.parent)
    if files is not None and files.pop(path.name, None) is not None:
        _save(path.parent, files)


def write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """paths.atomic_write_bytes, then entered in the folder's ledger."""
    record(path, atomic_write_bytes(path, data), len(data))
    return Path(path)


def write_text(path: str | os.PathLike, text: str) -> Path:
    return write_bytes(path, text.encode("utf-8"))


def write_with(path: str | os.PathLike, write: Callable[[Path], object]) -> Path:
    """paths.atomic_write_with (a library writes the file by name), then entered in the folder's ledger."""
    digest = atomic_write_with(path, write)
    record(path, digest, Path(path).stat().st_size)
    return Path(path)


def append_log(path: str | os.PathLike, text: str, what: str = "log") -> None:
    """paths.append_text, with `path` entered in the ledger (by name) the first time."""
    path = Path(path)
    append_text(path, text, what)
    files = read_ledger(path.parent) or {}
    if files.get(path.name) != {"kind": LOG}:
        files[path.name] = {"kind": LOG}
        _save(path.parent, files)


def listed(folder: str | os.PathLike, name: str) -> bool:
    files = read_ledger(folder)
    return files is not None and name in files


def verified_bytes(folder: str | os.PathLike, name: str, *, what: str = "folder") -> bytes:
    """The bytes of folder/name, read without following a link, only if they are exactly what pdraft wrote
    there (the ledger's sha256); otherwise one line saying why. The bytes returned are the bytes checked."""
    folder = Path(folder)
    files = read_ledger(folder)
    if files is None:
        raise PdraftError(f"{folder} has no record of the files pdraft wrote there ({LEDGER_NAME}): it was written "
                          f"by an older pdraft or by hand", hint=f"make a checked copy with `pdraft pull {folder} "
                          f"--out NEW_FOLDER` and use that")
    entry = files.get(name)
    if entry is None or "sha256" not in entry:
        raise PdraftError(f"{folder / name} was not written there by pdraft (it is not in {LEDGER_NAME})",
                          hint=f"move it out of the {what}; if an older pdraft wrote it, make a checked copy with "
                               f"`pdraft pull {folder} --out NEW_FOLDER` and use that")
    blob = read_regular(folder, name, what=what)
    if hashlib.sha256(blob).hexdigest() != entry["sha256"]:
        raise PdraftError(f"{folder / name} is not the file pdraft wrote there: its content changed since (its "
                          f"sha256 differs from {LEDGER_NAME}: damaged, edited, or replaced by a link to another file)",
                          hint=f"move it out of the {what}, or let pdraft write it again")
    return blob


def unlisted(folder: str | os.PathLike, *, also: tuple[str, ...] = ()) -> list[str]:
    """Entries of `folder` that its ledger does not list (sub-folders included, by name), besides the ledger
    itself and the names in `also` (bookkeeping such as the ownership marker). None of them is pdraft's."""
    files = read_ledger(folder) or {}
    return sorted(e for e in os.listdir(folder) if e not in files and e != LEDGER_NAME and e not in also)
