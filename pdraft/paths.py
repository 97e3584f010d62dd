"""Where pdraft keeps things on disk: the user cache folder (platform convention, overridable by the
PDRAFT_CACHE_DIR environment variable or the recipe's `runtime.cache_dir`) and atomic file writes used by
every artifact writer, so an interrupted write never leaves a file that looks complete."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

CACHE_ENV = "PDRAFT_CACHE_DIR"
RESOLVED_NAME = "recipe.resolved.yaml"  # the resolved recipe written next to every artifact (pdraft.recipe)


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


# --- What pdraft owns, and what lies inside a folder -------------------------------------------------------
# A folder pdraft creates to hold a checkpoint or drafter carries this empty marker file, so that replacing or
# clearing output removes only what pdraft wrote: a folder is pdraft's when its NAME is one pdraft uses there
# AND it holds the marker (a copied `best/` holds the marker but not the name; a user's `final/` the name but
# not the marker). The name has no .json/.yaml/.md/.safetensors suffix, so pull, push and export never carry it.
OWNED_MARKER = ".pdraft-owned"


def mark_owned(folder: str | os.PathLike) -> None:
    Path(folder, OWNED_MARKER).write_text("written by pdraft; `pdraft train --fresh` may delete this folder\n")


def is_owned(folder: str | os.PathLike) -> bool:
    p = Path(folder)
    return not p.is_symlink() and p.is_dir() and Path(p, OWNED_MARKER).is_file()


def is_working_folder(folder: str | os.PathLike) -> bool:
    """True for the current folder, any folder above it, the home folder and the file-system root: folders no
    pdraft command may ever clear, whatever they hold."""
    p = Path(folder).expanduser().resolve()
    cwd = Path.cwd().resolve()
    return p == cwd or cwd.is_relative_to(p) or p == Path.home().resolve() or p == Path(p.anchor)


def link_outside(path: str | os.PathLike, root: str | os.PathLike) -> bool:
    """True when `path` is (or passes through) a symbolic link whose target lies outside `root`."""
    real_root = Path(os.path.realpath(root))
    return not Path(os.path.realpath(path)).is_relative_to(real_root)


def regular_file_inside(folder: str | os.PathLike, name: str, *, what: str = "folder") -> Path:
    """folder/name, refused with one line unless it is a regular file and not a symbolic link: a file read as
    part of a folder (pushed, exported, loaded as its calibration) must not be a link to something elsewhere,
    such as a token file. `name` is a plain file name (the caller checked it)."""
    from pdraft.errors import PdraftError

    path = Path(folder) / name
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise PdraftError(f"{path} does not exist") from None
    if stat.S_ISLNK(st.st_mode):
        raise PdraftError(f"{path} is a symbolic link; pdraft reads only regular files inside the {what}, never "
                          f"what a link points to", hint="replace the link with a copy of the file if it belongs there")
    if not stat.S_ISREG(st.st_mode):
        raise PdraftError(f"{path} is not a regular file")
    return path


def read_regular(folder: str | os.PathLike, name: str, *, what: str = "folder") -> bytes:
    """The bytes of folder/name after regular_file_inside, opened without following a link (O_NOFOLLOW), so a
    link swapped in between the check and the read is refused too."""
    from pdraft.errors import PdraftError

    path = regular_file_inside(folder, name, what=what)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as e:
        raise PdraftError(f"cannot read {path}: {e.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise PdraftError(f"{path} is not a regular file")
        return f.read()
