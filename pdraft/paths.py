"""Where pdraft keeps things on disk, and how it writes there. The user cache folder (platform convention,
overridable by the PDRAFT_CACHE_DIR environment variable or the recipe's `runtime.cache_dir`); the writes every
artifact writer uses; ownership of folders; and reading files that belong to a folder.

pdraft never writes through a link. A file is written whole through a temporary file created exclusively
(O_EXCL, a random name) in the same folder and then renamed over the name, so an interrupted write never
leaves a file that looks complete and a symbolic link at the name would be replaced, not written through; the
name is refused in one line when it exists as a link anyway, so a user's link is never silently replaced
either. A file pdraft appends to or locks in place (a metrics log, a lock file) is opened with O_NOFOLLOW and
refused unless it is a regular file with a single name (a hard link would let the write land in another file).
A folder pdraft creates or fills is refused when its own name is a link (a link further up, such as
`runs -> /scratch/runs`, is the user's choice of disk and is followed)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from pdraft.errors import PdraftError

CACHE_ENV = "PDRAFT_CACHE_DIR"
RESOLVED_NAME = "recipe.resolved.yaml"  # the resolved recipe written next to every artifact (pdraft.recipe)
TMP_PREFIX = ".tmp-"  # every temporary a write leaves behind when killed starts so (cleaned by the cache writer)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


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


# --- Writing without following links ------------------------------------------------------------------------
def refuse_link(path: str | os.PathLike, what: str = "file") -> None:
    """One line when `path` exists as a symbolic link: pdraft neither writes through it nor replaces it."""
    if os.path.islink(path):
        raise PdraftError(f"{what} {path} is a symbolic link (to {os.readlink(path)}); pdraft never writes "
                          f"through a link nor replaces one", hint="remove the link, or choose another path")


def make_dir(folder: str | os.PathLike, what: str = "folder") -> Path:
    """Create `folder` (and its parents) if missing; refused when its own name is a symbolic link."""
    folder = Path(folder)
    refuse_link(folder, what)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def atomic_write_with(path: str | os.PathLike, write: Callable[[Path], object]) -> str:
    """Have `write(tmp)` fill a temporary file created exclusively beside `path` (a library that opens the
    file by name itself: safetensors, matplotlib), fsync it, then rename it over `path`. Returns the sha256
    of the bytes written. The temporary keeps `path`'s suffix, so writers that pick a format by it work."""
    path = Path(path)
    make_dir(path.parent)
    refuse_link(path)
    fd, tmp = tempfile.mkstemp(prefix=f"{TMP_PREFIX}{path.name}.", suffix=path.suffix, dir=path.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        h = hashlib.sha256()
        with open(tmp, "rb+") as f:
            while block := f.read(1 << 22):
                h.update(block)
            os.fsync(f.fileno())
        refuse_link(path)  # a link put there meanwhile is refused, not replaced
        os.replace(tmp, path)
        return h.hexdigest()
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_files_with(folder: str | os.PathLike, write: Callable[[Path], object]) -> list[str]:
    """Have `write(tmp)` fill a fresh folder created exclusively inside `folder` (a library that writes a whole
    folder by name: transformers' save_pretrained), then fsync each file it wrote and rename it over its name in
    `folder`, a link there refused, never written through. Returns the names moved; the temporary is removed."""
    folder = make_dir(folder)
    tmp = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{folder.name}.", dir=folder))
    try:
        write(tmp)
        names = sorted(p.name for p in tmp.iterdir())
        for name in names:
            src = tmp / name
            if src.is_symlink() or not src.is_file():
                raise PdraftError(f"{src} is not a regular file; pdraft moves only files a writer made")
            with open(src, "rb") as f:
                os.fsync(f.fileno())
            refuse_link(folder / name)
            os.replace(src, folder / name)
        return names
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> str:
    """Write `data` to `path` through an exclusive temporary file in the same folder, fsync, then rename;
    returns the sha256 of `data`."""
    path = Path(path)
    make_dir(path.parent)
    refuse_link(path)
    fd, tmp = tempfile.mkstemp(prefix=f"{TMP_PREFIX}{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        refuse_link(path)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return hashlib.sha256(data).hexdigest()


def atomic_write_text(path: str | os.PathLike, text: str) -> str:
    return atomic_write_bytes(path, text.encode("utf-8"))


def open_in_place(path: str | os.PathLike, flags: int, what: str = "file") -> int:
    """An fd on `path` opened with O_NOFOLLOW (plus `flags`, e.g. O_CREAT | O_APPEND | O_WRONLY), refused in
    one line unless it is a regular file with one name: a file written in place (appended to, locked) must be
    pdraft's own, never a symbolic or hard link into someone else's file."""
    path = Path(path)
    try:
        fd = os.open(path, flags | _NOFOLLOW, 0o644)
    except OSError:
        if os.path.islink(path):  # O_NOFOLLOW's ELOOP: say so in one line
            refuse_link(path, what)
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
        os.close(fd)
        why = "not a regular file" if not stat.S_ISREG(st.st_mode) else f"a hard link ({st.st_nlink} names)"
        raise PdraftError(f"{what} {path} is {why}; pdraft writes in place only into a file of its own",
                          hint="remove it, or choose another path")
    return fd


def append_text(path: str | os.PathLike, text: str, what: str = "file") -> None:
    """Append `text` to `path` (created if missing) in one write, flushed; see open_in_place."""
    fd = open_in_place(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, what)
    try:
        os.write(fd, text.encode("utf-8"))
    finally:
        os.close(fd)


def open_append(path: str | os.PathLike, what: str = "file", truncate: bool = False):
    """A text file object appending to `path` (or truncating it first), opened as open_in_place says."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if truncate else os.O_APPEND)
    return os.fdopen(open_in_place(path, flags, what), "w", encoding="utf-8")


def fresh_dir(folder: str | os.PathLike) -> Path:
    """An empty folder at `folder` for a writer to fill: one pdraft left there before (a killed writer's
    temporary, a pdraft name) is removed first; a link at the name is refused, never followed."""
    folder = Path(folder)
    refuse_link(folder)
    if folder.is_dir():
        shutil.rmtree(folder)
    elif os.path.lexists(folder):
        folder.unlink()
    folder.mkdir(parents=True)
    return folder


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
    out = Path(out).expanduser().absolute()
    refuse_link(out, "--out")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise PdraftError(f"{out} already exists and is not empty", hint="choose another --out or remove it")
    make_dir(out.parent)
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
# Which files inside such a folder pdraft wrote is listed by pdraft.ledger.
OWNED_MARKER = ".pdraft-owned"


def mark_owned(folder: str | os.PathLike) -> None:
    atomic_write_text(Path(folder, OWNED_MARKER), "written by pdraft; `pdraft train --fresh` may delete this folder\n")


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


def read_regular(folder: str | os.PathLike, name: str, *, what: str = "folder", limit: int | None = None) -> bytes:
    """The bytes of folder/name after regular_file_inside, opened without following a link (O_NOFOLLOW), so a
    link swapped in between the check and the read is refused too; with `limit`, a larger file is refused
    before it is read."""
    path = regular_file_inside(folder, name, what=what)
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW)
    except OSError as e:
        raise PdraftError(f"cannot read {path}: {e.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise PdraftError(f"{path} is not a regular file")
        if limit is not None and st.st_size > limit:
            raise PdraftError(f"{path} holds {st.st_size:,} bytes, more than the {limit:,} such a file may hold")
        return f.read()


def check_input_file(path: str | os.PathLike, what: str, limit: int | None = None) -> os.stat_result:
    """The stat of an input file the user named, refused in one line unless it is a regular file (a device
    such as /dev/zero or a pipe never ends) and, with `limit`, holds at most `limit` bytes."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise PdraftError(f"{what} {path} not found") from None
    if stat.S_ISDIR(st.st_mode):
        raise PdraftError(f"{what} {path}: is a folder, expected a file")
    if not stat.S_ISREG(st.st_mode):
        raise PdraftError(f"{what} {path} is not a regular file (a device or a pipe never ends)",
                          hint="give a file")
    if limit is not None and st.st_size > limit:
        raise PdraftError(f"{what} {path} holds {st.st_size:,} bytes, more than the {limit:,} pdraft reads "
                          f"from such a file")
    return st
