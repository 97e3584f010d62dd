"""The conversation with a child engine (the vLLM worker, pdraft.engines.vllm_driver): JSON lines sent on its
stdin, one reply line read back per message. The child is another program's code running on another
library's version, so its replies are input, read like a file pdraft reads back (pdraft.readback):

- **bounded**: a reply line holds at most the bytes its message can need (`max_bytes`, the caller's figure
  from what it asked), and the whole conversation at most the sum of those figures, so a flood of output costs
  one bounded buffer, never the machine's memory;
- **on time**: each reply is awaited until a deadline that names what it waits for (the engine loading, a
  chunk of prompts), so an engine that never finishes loading or never answers ends in one line, not a hang;
- **parsed and typed**: a line is JSON of bounded nesting, validated by a strict schema (pdraft.readback.Schema),
  so a banner line, a missing field or a value of the wrong type is one line naming the reply and the field.

On any violation the child is stopped (its process group terminated, then killed: pdraft.children) before the
one-line error is raised, and the error names the log its stderr went to. The log is opened through pdraft's no-follow write path
(pdraft.paths.open_append): a link at its name is refused, never truncated through."""

from __future__ import annotations

import json
import os
import select
import subprocess
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from pdraft.children import STOP_GRACE_S, popen, stop_group
from pdraft.errors import PdraftError
from pdraft.paths import make_dir, open_append
from pdraft.readback import TooDeep, loads, validate

_READ = 1 << 16
MAX_MESSAGE_TEXT = 300  # characters of a child's own error text shown to the user


def printable(text: object, limit: int = MAX_MESSAGE_TEXT) -> str:
    """A child's text for a one-line message: control characters dropped, cut at `limit` characters."""
    s = "".join(c if c.isprintable() else " " for c in str(text))
    return s if len(s) <= limit else s[:limit] + "..."


class ChildChannel:
    """A child process started with `argv`, its stderr appended to `log` (truncated first), spoken to in JSON
    lines. `what` names the child in messages ("the vLLM worker")."""

    def __init__(self, argv: list[str], *, log: Path, what: str, env: dict | None = None):
        self.what, self.log = what, Path(log)
        make_dir(self.log.parent)
        self._log_file = open_append(self.log, f"{what}'s log", truncate=True)  # never through a link
        try:
            self.proc = popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log_file, env=env)
        except OSError as e:
            self._log_file.close()
            raise PdraftError(f"cannot start {what} ({e.strerror or type(e).__name__})") from None
        self._buffer = bytearray()
        self.budget = 0  # bytes the replies asked for so far may hold in all
        self.read_total = 0  # bytes read from the child's stdout so far

    # ---- sending and reading -----------------------------------------------------------------------------
    def send(self, message: dict) -> None:
        try:
            self.proc.stdin.write((json.dumps(message) + "\n").encode("utf-8"))
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # the child is gone: the reply read next says so

    def read_line(self, *, waiting_for: str, timeout_s: float, max_bytes: int) -> bytes:
        """One reply line (without its newline), at most `max_bytes` long, read before `timeout_s` seconds pass."""
        self.budget += max_bytes + 1
        deadline = time.monotonic() + timeout_s
        fd = self.proc.stdout.fileno()
        while True:
            newline = self._buffer.find(b"\n")
            if newline >= 0:
                line = bytes(self._buffer[:newline])
                del self._buffer[: newline + 1]
                if len(line) > max_bytes:
                    raise self.violation(f"a reply line of {len(line):,} bytes while waiting for {waiting_for}, more "
                                         f"than the {max_bytes:,} it can need")
                return line
            if len(self._buffer) > max_bytes:
                raise self.violation(f"more than {max_bytes:,} bytes without a line end while waiting for "
                                     f"{waiting_for}, more than its reply can need")
            left = deadline - time.monotonic()
            if left <= 0:
                raise self.violation(f"no reply within {timeout_s:g} s while waiting for {waiting_for}")
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, _READ)
            if not chunk:
                code = self.proc.wait()
                tail = self.last_log_line()
                raise PdraftError(f"{self.what} exited with code {code} while pdraft waited for {waiting_for}; its "
                                  f"log: {self.log}", hint=printable(tail) if tail else None)
            self.read_total += len(chunk)
            if self.read_total > self.budget + _READ:
                raise self.violation(f"{self.read_total:,} bytes of output, more than the {self.budget:,} its "
                                     f"replies so far can hold")
            self._buffer += chunk

    def parse(self, line: bytes, waiting_for: str) -> Any:
        """A reply line as JSON of bounded nesting; anything else (a banner, a partial line) stops the child."""
        try:
            return loads(line)
        except TooDeep as e:
            raise self.violation(f"its reply to {waiting_for} is {e}") from None
        except ValueError:  # JSON's errors and UnicodeDecodeError
            raise self.violation(f"its reply to {waiting_for} is not a JSON line (it starts "
                                 f"{printable(line[:60].decode('utf-8', 'replace'), 60)!r})") from None

    def check(self, schema: type[BaseModel], data: Any, waiting_for: str) -> Any:
        """`data` validated by `schema`; the first problem stops the child: `its reply to ...: FIELD: expected ...`."""
        try:
            return validate(schema, data, f"its reply to {waiting_for}")
        except PdraftError as e:
            raise self.violation(e.message) from None

    # ---- stopping ----------------------------------------------------------------------------------------
    def violation(self, problem: str) -> PdraftError:
        """Stop the child and return the one-line error naming what it did (the caller raises it)."""
        self.stop()
        return PdraftError(f"{self.what} broke the protocol: {problem}; it was stopped; its log: {self.log}")

    def stop(self, exit_message: dict | None = None, grace_s: float = STOP_GRACE_S) -> None:
        """Ask the child to exit (`exit_message`, when it still runs), then stop its process group: what it
        started (vLLM's engine processes) goes with it."""
        if self.proc.poll() is None and exit_message is not None:
            self.send(exit_message)
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
        stop_group(self.proc, grace_s)
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass

    def close(self, exit_message: dict | None = None, grace_s: float = STOP_GRACE_S) -> None:
        self.stop(exit_message, grace_s)
        self._log_file.close()

    # ---- the log -----------------------------------------------------------------------------------------
    def log_lines(self, limit: int = 1 << 20) -> list[str]:
        """The last `limit` bytes of the log, as non-empty lines (the log of a long run may be large)."""
        self._log_file.flush()
        try:
            with open(self.log, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                f.seek(max(0, size - limit))
                text = f.read(limit).decode("utf-8", "replace")
        except OSError:
            return []
        return [x for x in text.splitlines() if x.strip()]

    def last_log_line(self) -> str | None:
        lines = self.log_lines()
        return lines[-1] if lines else None


__all__ = ["ChildChannel", "printable", "STOP_GRACE_S"]
