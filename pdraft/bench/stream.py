"""The metrics stream that decode and bench write with `--metrics PATH` and `pdraft monitor` follows: JSON
lines, one `{"type": "run", ...}` header per decoding run (drafter label, gamma, and whatever else the writer
knows: the domain, and `verify` = full / threshold / scheduler, which the monitor uses to judge utilisation) followed by one `{"type": "round", ...}` line per RoundRecord (its `to_dict()` fields).
Every line is written whole and flushed, so a reader following the file like `tail -f` sees complete records
(and buffers a partial last line until its newline arrives).

Round and request numbers in a RoundRecord restart at 0 with every `generate` call; the writer keeps them
unique within a run (call `next_batch()` between calls), because metrics.summarize counts a batched round's
time once per round number.
"""

from __future__ import annotations

import json
import math
import os
import stat
import time
from pathlib import Path

from pdraft.metrics import RoundRecord
from pdraft.errors import PdraftError
from pdraft.models.family import MAX_GAMMA
from pdraft.paths import make_dir, open_append
from pdraft.readback import loads

ROUND_FIELDS = tuple(RoundRecord.__dataclass_fields__)


class MetricsStream:
    """Appends a metrics stream to `path` (created with its folders). Use:

        with MetricsStream("runs/metrics.jsonl") as stream:
            stream.begin_run(drafter="dspark-final (dspark)", gamma=8)
            generate(..., on_round=lambda e: [stream.write_round(r) for r in e.records])
            stream.next_batch()   # before the next generate() call of the same run
    """

    def __init__(self, path: str | Path, truncate: bool = False):
        self.path = Path(path)
        try:  # never through a link, and only into a regular file of its own (pdraft.paths.open_in_place)
            make_dir(self.path.parent)
            self._file = open_append(self.path, "metrics stream", truncate=truncate)
        except OSError as e:
            raise PdraftError(f"cannot write the metrics stream {self.path}: {e.strerror or e}") from None
        self._in_run = False
        self._round_offset = self._request_offset = 0
        self._max_round = self._max_request = -1

    def begin_run(self, *, drafter: str, gamma: int, **meta) -> None:
        """Start a run: every following round belongs to it until the next begin_run."""
        self._write({"type": "run", "drafter": drafter, "gamma": int(gamma), "time": time.time(), **meta})
        self._in_run = True
        self._round_offset = self._request_offset = 0
        self._max_round = self._max_request = -1

    def next_batch(self) -> None:
        """The next records come from a new generate() call: shift its round and request numbers past these."""
        self._round_offset = self._max_round + 1
        self._request_offset = self._max_request + 1

    def write_round(self, record: RoundRecord) -> None:
        if not self._in_run:
            raise ValueError("MetricsStream.write_round before begin_run: the monitor needs the run's header")
        row = record.to_dict()
        row["round"] += self._round_offset
        row["request"] += self._request_offset
        self._max_round = max(self._max_round, row["round"])
        self._max_request = max(self._max_request, row["request"])
        self._write({"type": "round", "t": time.time(), **row})

    def _write(self, obj: dict) -> None:
        self._file.write(json.dumps(obj) + "\n")  # one write per line: readers never see half of it
        self._file.flush()

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> MetricsStream:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# A reader's bound, not the gamma ceiling: stream lines come from files (another pdraft version, another tool,
# damage), and the metrics loop over positions, so a count past this is refused as damaged. It sits far above
# the longest block anything drafts (MAX_GAMMA) so that a newer writer's longer blocks still read.
STREAM_GAMMA_LIMIT = 32 * MAX_GAMMA
MAX_INDEX = 2**53  # round and request numbers: exact in a float, far above any real run
MAX_LINE = 1 << 20  # bytes of one stream line; a run header or a round is a few hundred


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_time(v) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) and math.isfinite(v) and v >= 0


def _is_confidence(v) -> bool:
    return v is None or (isinstance(v, list) and len(v) <= STREAM_GAMMA_LIMIT and all(
        isinstance(c, (int, float)) and not isinstance(c, bool) and math.isfinite(c) for c in v))


def _is_tree(v) -> bool:
    return v is None or (isinstance(v, list) and len(v) <= STREAM_GAMMA_LIMIT and all(
        _is_int(n) and 0 <= n <= MAX_INDEX for n in v))


# Every field of a round line is typed by the type RoundRecord declares for it (one rule for every field, so a
# field added to RoundRecord is checked as it is read back, or the import fails here): a count, seconds, or a list
# (confidence logits; a tree's nodes per depth). A count is required; the others may be absent (older writers) or
# null (a writer that did not time them: `prefill_s` outside continuous batching, issue 60), both read as not
# measured; seconds are never text.
_CHECKS = {"int": (_is_int, "a whole number >= 0"), "float": (_is_time, "seconds >= 0"),
           "list[float] | None": (_is_confidence, "a list of finite numbers or null"),
           "list[int] | None": (_is_tree, "a list of whole numbers >= 0 or null")}
_FIELD_TYPES = {name: str(f.type) for name, f in RoundRecord.__dataclass_fields__.items()}
_unchecked = {n: t for n, t in _FIELD_TYPES.items() if t not in _CHECKS}
if _unchecked:
    raise TypeError(f"RoundRecord fields {_unchecked} have types the stream reader does not check (add them to _CHECKS)")
_COUNTS = tuple(n for n, t in _FIELD_TYPES.items() if t == "int")


def record_from(obj: dict) -> RoundRecord:
    """A RoundRecord from a stream line (unknown keys ignored, so newer writers stay readable). Every field
    is checked for type and range first (ValueError names the first bad one): a string, a null, a fraction or a
    count like 1e12 would otherwise reach the metrics, which loop over positions and add seconds."""
    for k, kind in _FIELD_TYPES.items():
        if k not in obj or (kind == "float" and obj[k] is None):  # seconds not measured: as an older writer's
            if kind == "int":
                raise ValueError(f"round line misses '{k}'")
            continue
        ok, expected = _CHECKS[kind]
        if not ok(obj[k]) or (kind == "int" and not 0 <= obj[k] <= MAX_INDEX):
            shown = repr(obj[k])
            raise ValueError(f"round field '{k}' is {shown if len(shown) <= 40 else shown[:40] + '...'}, expected {expected}")
    g, ell, a = obj["gamma"], obj["verified"], obj["accepted"]
    if not (g <= STREAM_GAMMA_LIMIT and ell <= g + 1 and a <= max(ell, g) and obj["committed"] <= a + 1):
        raise ValueError(f"round counts gamma {g}, verified {ell}, accepted {a}, committed {obj['committed']} "
                         f"are inconsistent (expected 0 <= accepted <= verified <= gamma <= {STREAM_GAMMA_LIMIT})")
    return RoundRecord(**{k: obj[k] for k in ROUND_FIELDS if k in obj and obj[k] is not None})


def check_line(obj) -> dict:
    """`obj` if it is a well-formed stream line (a run header or a round), else ValueError: what the monitor
    and every other reader of a stream may rely on (`t` finite seconds; a header's gamma a count)."""
    if not isinstance(obj, dict):
        raise ValueError("not a JSON object")
    kind = obj.get("type")
    t = obj.get("t", obj.get("time"))
    if t is not None and not (_is_time(t) or (isinstance(t, float) and math.isfinite(t))):
        raise ValueError(f"time {t!r} is not a number of seconds")
    if kind == "run":
        if not _is_int(obj.get("gamma")) or not 0 <= obj["gamma"] <= STREAM_GAMMA_LIMIT:
            raise ValueError(f"run header gamma {obj.get('gamma')!r} is not a count in 0..{STREAM_GAMMA_LIMIT}")
        if not isinstance(obj.get("drafter", ""), str) or not isinstance(obj.get("verify", ""), str):
            raise ValueError("run header drafter and verify must be text")
    elif kind == "round":
        record_from(obj)
    return obj


class StreamFollower:
    """Reads a metrics stream incrementally, like `tail -f`: `poll()` returns the complete new lines as dicts,
    at most `chunk` bytes' worth per call (`more` says the file holds more), so a huge stream is read in
    slices, never whole. A file that does not exist yet gives nothing until it appears; a file that shrank
    (truncated) or was replaced (rotated: another inode) is read again from its start, and `reset` is set so
    the caller can drop what it had. A partial last line waits for its newline. Malformed lines (not JSON, not
    an object, binary, longer than MAX_LINE, or fields of the wrong type or range: `check_line`) are counted
    in `bad_lines` and `last_problem` says what the last one was. With `until` (a byte offset), nothing past
    it is read: `monitor --once` reads what the file held when it started, and so returns even while another
    process keeps appending (a partial line at that offset is left for later, like any partial line)."""

    def __init__(self, path: str | Path, chunk: int = 8 << 20, until: int | None = None):
        self.path = Path(path)
        self.chunk = chunk
        self.offset = 0
        self.inode: int | None = None
        self.partial = b""
        self.bad_lines = 0
        self.good_rounds = 0
        self.last_problem: str | None = None
        self.reset = False
        self.more = False
        self.until = until
        self._file = None  # with `until`: the one descriptor the stream is read through

    def poll(self) -> list[dict]:
        self.reset = self.more = False
        if self.until is not None:
            data = self._read_once()
        else:
            try:
                st = os.stat(self.path)
            except FileNotFoundError:
                return []
            if self.inode is not None and (st.st_ino != self.inode or st.st_size < self.offset):
                self.offset, self.partial, self.reset = 0, b"", True
            self.inode = st.st_ino
            end = st.st_size
            if end <= self.offset:
                return []
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read(min(self.chunk, end - self.offset))
            self.offset += len(data)
            self.more = self.offset < end
        *lines, self.partial = (self.partial + data).split(b"\n")
        if len(self.partial) > MAX_LINE:  # no newline in sight: drop it rather than buffer it whole
            self._bad(f"a line longer than {MAX_LINE} bytes")
            self.partial = b""
        rows = []
        for line in lines:
            if not line.strip():
                continue
            if len(line) > MAX_LINE:
                self._bad(f"a line longer than {MAX_LINE} bytes")
                continue
            try:
                rows.append(check_line(loads(line)))  # nesting bounded (pdraft.readback)
            except ValueError as e:  # JSONDecodeError, UnicodeDecodeError and TooDeep are ValueErrors
                self._bad(str(e) if not isinstance(e, json.JSONDecodeError) else "not JSON")
                continue
            self.good_rounds += rows[-1].get("type") == "round"
        return rows

    def _read_once(self) -> bytes:
        """With `until`: the next slice of the one descriptor opened at the first poll, never past `until` nor
        past the size the file had when it was opened, so the reads end whatever a writer does meanwhile
        (appends, truncates, replaces the file under its name): `monitor --once` returns after one read."""
        if self._file is None:
            try:
                fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
            except FileNotFoundError:
                self.until = 0
                return b""
            self._file = os.fdopen(fd, "rb")
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):  # a pipe or a device never ends
                self._file.close()
                raise PdraftError(f"metrics stream {self.path} is not a regular file (a device or a pipe never ends)")
            self.until = min(self.until, st.st_size)
        data = self._file.read(min(self.chunk, self.until - self.offset)) if self.offset < self.until else b""
        self.offset += len(data)
        self.more = bool(data) and self.offset < self.until
        if not self.more:
            self._file.close()
            self.until = self.offset  # read once: later polls read nothing
        return data

    def _bad(self, problem: str) -> None:
        self.bad_lines += 1
        self.last_problem = problem[:200]
