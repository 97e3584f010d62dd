"""One writer per output folder: `folder_lock(folder, what)` holds an exclusive lock on `folder/.pdraft.lock`
for as long as a command writes there (a training run folder, a hidden-state cache), so a second `train` into
the same folder or a second `export-hidden` into the same cache stops at once with one line naming the other
process, instead of the two racing on the same temporary names. The lock is `fcntl.flock` where the platform
has it: the kernel drops it when its process dies, so a lock file left by a killed run is never stale (it
still names the dead holder's pid and host, and is simply taken over). The holder deletes the file when it
is done, so a finished command leaves the folder as it found it. The lock file is opened without following a
link and must be a regular file with one name (pdraft.paths.open_in_place): a `.pdraft.lock` that is a
symbolic or hard link to a user's file is refused in one line, and that file is never written. Where flock is missing the file is created
with O_CREAT|O_EXCL and a lock whose pid no longer runs on this host is taken over. Locks are
re-entrant within one process, so a command that writes a folder may call a library function that locks it
too."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from pdraft.errors import PdraftError
from pdraft.paths import make_dir, open_in_place
from pdraft.readback import loads

LOCK_NAME = ".pdraft.lock"

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

_held: dict[str, tuple[int, int]] = {}  # realpath of lock file -> (fd, depth) for this process


def _holder() -> dict:
    return {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "command": " ".join(["pdraft", *sys.argv[1:3]])[:200]}


def _read_holder(path: Path) -> dict:
    """The holder a lock file names (read without following a link, at most 4 KB); ValueError when unreadable."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as e:
        raise ValueError(str(e)) from None
    try:
        h = loads(os.read(fd, 4096).decode("utf-8"))  # at most 4 KB, nesting bounded (pdraft.readback)
    finally:
        os.close(fd)
    if not isinstance(h, dict):
        raise ValueError("not a JSON object")
    return h


def _describe(path: Path) -> str:
    try:
        h = _read_holder(path)
        return f"pid {int(h['pid'])} on {h['host']}, since {h['since']} ({h['command']})"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"


def _busy(folder: Path, what: str, path: Path) -> PdraftError:
    return PdraftError(f"{what} {folder} is in use by {_describe(path)}",
                       hint=f"wait for it to finish, or use another folder; if no such process runs, delete {path}")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _acquire_flock(path: Path, folder: Path, what: str) -> int:
    """flock the lock file. The holder unlinks the file before releasing, so a lock won on a file that is no
    longer the one at `path` (unlinked meanwhile) is worthless: retry on the new file."""
    for _ in range(100):
        fd = open_in_place(path, os.O_CREAT | os.O_RDWR, f"{what} {folder}: its lock file")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise _busy(folder, what, path) from None
        except BaseException:
            os.close(fd)
            raise
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)
    raise _busy(folder, what, path)


def _acquire_excl(path: Path, folder: Path, what: str) -> int:
    """The O_EXCL fallback: create the file, or take over one whose holder is dead on this host."""
    for _ in range(2):
        try:
            return os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644)
        except FileExistsError:
            try:
                h = _read_holder(path)
                stale = h.get("host") == socket.gethostname() and not _pid_alive(int(h["pid"]))
            except (OSError, ValueError, KeyError, TypeError):
                stale = False
            if not stale:
                raise _busy(folder, what, path) from None
            path.unlink(missing_ok=True)
    raise _busy(folder, what, path)


@contextlib.contextmanager
def folder_lock(folder: str | os.PathLike, what: str = "output folder") -> Iterator[Path]:
    """Hold the exclusive lock of `folder` (created if missing) for the block; raise a one-line PdraftError at
    once when another process holds it. `what` names the folder in the message ("run folder", "cache")."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise PdraftError(f"{what} {folder} is a file, not a folder", hint="choose a folder path")
    created = not folder.exists()
    make_dir(folder, what)
    path = folder / LOCK_NAME
    key = os.path.realpath(path)
    if key in _held:
        fd, depth = _held[key]
        _held[key] = (fd, depth + 1)
        try:
            yield path
        finally:
            fd, depth = _held[key]
            _held[key] = (fd, depth - 1)
        return
    fd = _acquire_flock(path, folder, what) if fcntl is not None else _acquire_excl(path, folder, what)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps(_holder()).encode("utf-8"))  # fd is fresh: this writes at offset 0
        _held[key] = (fd, 1)
        yield path
    except BaseException:
        # A command that fails before writing anything leaves no folder behind, not even the lock's.
        if created and os.listdir(folder) == [LOCK_NAME]:
            with contextlib.suppress(OSError):
                path.unlink()
                folder.rmdir()
        raise
    finally:
        _held.pop(key, None)
        with contextlib.suppress(OSError):  # unlinked while still held: see _acquire_flock
            path.unlink()
        os.close(fd)
