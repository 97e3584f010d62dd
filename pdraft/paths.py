"""Where pdraft keeps things on disk: the user cache folder (platform convention, overridable by the
PDRAFT_CACHE_DIR environment variable or the recipe's `runtime.cache_dir`) and atomic file writes used by
every artifact writer, so an interrupted write never leaves a file that looks complete."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

CACHE_ENV = "PDRAFT_CACHE_DIR"


def cache_dir(override: str | os.PathLike | None = None) -> Path:
    """The folder pdraft caches built targets and other reusable artifacts in."""
    if override:
        return Path(override).expanduser()
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    if sys.platform == "darwin":
        base = Path.home() / "Library" / "Caches"
    elif sys.platform.startswith("win"):
        base = Path(os.environ.get("LOCALAPPDATA", Path.home() / "AppData" / "Local"))
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "pdraft"


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to `path` through a temporary file in the same folder, fsync, then rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def fsync_dir(folder: str | os.PathLike) -> None:
    """Flush a folder's entries (a rename inside it) to disk; a no-op where folders cannot be opened."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def partial_dir_beside(out: str | os.PathLike) -> tuple[Path, Path]:
    """(out, tmp): refuse a non-empty `out`, and make a hidden temporary folder beside it to fill and then
    rename into place, so an interrupted writer never leaves a folder that looks complete."""
    from pdraft.errors import PdraftError

    out = Path(out).expanduser().absolute()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise PdraftError(f"{out} already exists and is not empty", hint="choose another --out or remove it")
    out.parent.mkdir(parents=True, exist_ok=True)
    return out, Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))


@contextlib.contextmanager
def staged_dir(out: str | os.PathLike) -> Iterator[tuple[Path, Path]]:
    """partial_dir_beside as a block: yields (out, tmp) to fill tmp; renames tmp to `out` when the block ends
    and removes tmp on any exception."""
    out, tmp = partial_dir_beside(out)
    try:
        yield out, tmp
        if out.exists():
            out.rmdir()
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
