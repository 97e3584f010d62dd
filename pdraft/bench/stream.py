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
import os
import time
from pathlib import Path

from pdraft.metrics import RoundRecord
from pdraft.errors import PdraftError

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
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("w" if truncate else "a", encoding="utf-8")
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


def record_from(obj: dict) -> RoundRecord:
    """A RoundRecord from a stream line (unknown keys ignored, so newer writers stay readable)."""
    return RoundRecord(**{k: obj[k] for k in ROUND_FIELDS if k in obj})


class StreamFollower:
    """Reads a metrics stream incrementally, like `tail -f`: `poll()` returns the complete new lines as dicts.
    A file that does not exist yet gives nothing until it appears; a file that shrank (truncated) or was
    replaced (rotated: another inode) is read again from its start, and `reset` is set so the caller can drop
    what it had. A partial last line waits for its newline. Malformed lines are counted in `bad_lines`."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.offset = 0
        self.inode: int | None = None
        self.partial = b""
        self.bad_lines = 0
        self.reset = False

    def poll(self) -> list[dict]:
        self.reset = False
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return []
        if self.inode is not None and (st.st_ino != self.inode or st.st_size < self.offset):
            self.offset, self.partial, self.reset = 0, b"", True
        self.inode = st.st_ino
        if st.st_size == self.offset:
            return []
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        self.offset += len(data)
        *lines, self.partial = (self.partial + data).split(b"\n")
        rows = []
        for line in lines:
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                self.bad_lines += 1
                continue
            if isinstance(obj, dict):
                rows.append(obj)
            else:
                self.bad_lines += 1
        return rows
