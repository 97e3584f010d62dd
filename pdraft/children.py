"""Every child process pdraft starts (an engine interpreter's probe, the vLLM worker, the C compiler), started
and stopped by one rule, because a child is another program that may hang, flood or leave its own children
behind (issue 60, class 1):

- **its own process group**, so that stopping it stops what it started too (vLLM's engine-core processes, a
  shell script's `sleep`): a grandchild that kept the pipes open would otherwise keep pdraft waiting on them;
- **stopped with pdraft**: on Linux the child gets SIGTERM when pdraft's process dies (PR_SET_PDEATHSIG), so
  even a pdraft killed outright leaves no engine running;
- **bounded**: a probe's output is read up to `max_bytes` per stream and the rest dropped as it arrives (a child
  that floods its stdout costs one bounded buffer, never the machine's memory), and the whole run ends at a
  deadline, after which the group is terminated, then killed.

Long conversations with a child (pdraft.engines.channel) start it through `popen` and stop it through
`stop_group`; short ones (a version probe, a compile) go through `run_bounded`."""

from __future__ import annotations

import ctypes
import os
import select
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

_READ = 1 << 16
STOP_GRACE_S = 10.0  # how long a stopped child may take to exit before its group is killed
_PR_SET_PDEATHSIG = 1


def _prctl():
    """libc's prctl, looked up in pdraft's process (never between fork and exec, where loading is unsafe)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _prctl()


def _die_with_parent() -> None:  # runs in the child between fork and exec: one plain call
    _PRCTL(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def popen(argv: list[str], **kwargs) -> subprocess.Popen:
    """subprocess.Popen in a process group of its own, stopped with pdraft where the platform allows. The
    death signal follows the thread that starts the child, so it is asked for only from the main thread."""
    if _PRCTL is not None and threading.current_thread() is threading.main_thread():
        kwargs.setdefault("preexec_fn", _die_with_parent)
    return subprocess.Popen(argv, start_new_session=True, **kwargs)


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)  # the child leads its group (start_new_session): this reaches its children too
    except (ProcessLookupError, PermissionError):
        pass


def stop_group(proc: subprocess.Popen, grace_s: float = STOP_GRACE_S) -> int | None:
    """Terminate the child's process group, wait `grace_s` for the child, then kill the group. Returns its code."""
    _signal_group(proc, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    _signal_group(proc, signal.SIGKILL)  # whatever of the group outlived the grace (a grandchild ignoring TERM)
    return proc.wait()


@dataclass(frozen=True)
class Finished:
    """What a bounded run left: its exit code (None when it was stopped at its deadline) and the first
    `max_bytes` of each stream; `cut` when more was written and dropped."""

    returncode: int | None
    stdout: str
    stderr: str
    cut: bool = False

    @property
    def timed_out(self) -> bool:
        return self.returncode is None

    def first_error_line(self) -> str:
        lines = [x for x in self.stderr.strip().splitlines() if x.strip()]
        return lines[0] if lines else "no message"


def run_bounded(argv: list[str], *, timeout_s: float, max_bytes: int = 1 << 16, env: dict | None = None,
                cwd: str | None = None) -> Finished:
    """Run `argv` to its end or to `timeout_s`, keeping at most `max_bytes` of stdout and of stderr. Raises
    OSError only when it cannot be started."""
    proc = popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cwd)
    kept = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
    open_fds, cut = [out_fd, err_fd], False
    deadline = time.monotonic() + timeout_s
    try:
        while open_fds:
            left = deadline - time.monotonic()
            if left <= 0:
                stop_group(proc)
                return Finished(None, kept[out_fd].decode("utf-8", "replace"), kept[err_fd].decode("utf-8", "replace"),
                                cut)
            ready, _, _ = select.select(open_fds, [], [], left)
            for fd in ready:
                chunk = os.read(fd, _READ)
                if not chunk:
                    open_fds.remove(fd)
                    continue
                room = max_bytes - len(kept[fd])
                if len(chunk) > room:
                    cut = True
                kept[fd] += chunk[:max(room, 0)]
        try:
            code = proc.wait(timeout=max(deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            stop_group(proc)
            code = None
        return Finished(code, kept[out_fd].decode("utf-8", "replace"), kept[err_fd].decode("utf-8", "replace"), cut)
    finally:
        if proc.poll() is None:
            stop_group(proc)
        _signal_group(proc, signal.SIGKILL)  # a grandchild left holding nothing still goes with its group
        for stream in (proc.stdout, proc.stderr):
            stream.close()


__all__ = ["Finished", "STOP_GRACE_S", "popen", "run_bounded", "stop_group"]
