"""The cost table SPS(B) a policy weighs verification against: engine steps per second as a function of the
number of tokens B one verify pass runs, profiled by `pdraft calibrate-threshold` (pdraft.calibrate.sps) on the
device and written beside the drafter. A JSON file in SGLang's layout, {"sample_batch_tokens": [...],
"sample_steps_per_sec": [...], "max_batch_tokens": N}. Between samples SPS is interpolated linearly, below the
first sample it is the first value, and above max_batch_tokens it is 0 (the engine cannot run that batch).

The file's schema (`SPS_FILE`) is here, once: decode, bench, calibrate (with --skip-sps), export (into SGLang's
layout), push and pull read a table through `SpsTable.load` / `SpsTable.from_dict`, so a count that is text,
null, NaN, negative or infinite is refused by each in the same line."""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field

from pdraft.errors import PdraftError
from pdraft.readback import FileKind, Schema, check, load

MAX_SAMPLES = 1 << 16  # calibrate.sps_max_batch_tokens' ceiling: one sample per batch size
MAX_BATCH_TOKENS = 1 << 24
_Tokens = Annotated[int, Field(ge=1, le=MAX_BATCH_TOKENS)]


class SpsFile(Schema):
    """sps_table.json: SGLang's SpsCostTable fields (python/sglang/srt/speculative/dspark_components/
    dspark_sps.py) plus pdraft's `pdraft` object (the device it was measured on, the raw timings)."""

    sample_batch_tokens: list[_Tokens] = Field(min_length=1, max_length=MAX_SAMPLES)
    sample_steps_per_sec: list[Annotated[float, Field(gt=0, le=1e9)]] = Field(min_length=1, max_length=MAX_SAMPLES)
    max_batch_tokens: _Tokens | None = None
    pdraft: dict[str, Any] | None = None


SPS_FILE = FileKind("SPS table", 16 << 20, SpsFile)


@dataclass
class SpsTable:
    """Engine steps per second as a function of the number of tokens B in one target forward."""

    batch_tokens: list[int]
    steps_per_sec: list[float]
    max_batch_tokens: int
    device: str | None = None  # where pdraft measured it (its `pdraft.device`); None for SGLang's tables

    def __post_init__(self):
        if not self.batch_tokens or len(self.batch_tokens) != len(self.steps_per_sec):
            raise PdraftError(
                "SPS table: sample_batch_tokens and sample_steps_per_sec must be non-empty lists of the same "
                f"length (got {len(self.batch_tokens)} and {len(self.steps_per_sec)})"
            )
        if any(b <= a for a, b in zip(self.batch_tokens, self.batch_tokens[1:])) or self.batch_tokens[0] < 1:
            raise PdraftError("SPS table: sample_batch_tokens must be positive and strictly increasing")
        if any(not s > 0 for s in self.steps_per_sec):
            raise PdraftError("SPS table: sample_steps_per_sec must all be > 0")
        if self.max_batch_tokens < self.batch_tokens[0]:
            raise PdraftError(
                f"SPS table: max_batch_tokens {self.max_batch_tokens} is below the first sample "
                f"{self.batch_tokens[0]}"
            )

    def __call__(self, tokens: int) -> float:
        if tokens > self.max_batch_tokens:
            return 0.0
        xs, ys = self.batch_tokens, self.steps_per_sec
        if tokens <= xs[0]:
            return ys[0]
        if tokens >= xs[-1]:
            return ys[-1]
        i = bisect.bisect_right(xs, tokens)
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return y0 + (y1 - y0) * (tokens - x0) / (x1 - x0)

    @classmethod
    def from_file(cls, data: SpsFile, where: str = "SPS table") -> SpsTable:
        tokens = list(data.sample_batch_tokens)
        meta = data.pdraft or {}
        device = meta.get("device") if isinstance(meta.get("device"), str) else None
        try:
            return cls(tokens, list(data.sample_steps_per_sec), data.max_batch_tokens or tokens[-1], device)
        except PdraftError as e:
            raise PdraftError(f"{where}: {e.message.removeprefix('SPS table: ')}") from None

    @classmethod
    def from_dict(cls, data: Any, where: str = "SPS table") -> SpsTable:
        """A table from its parsed JSON (or the dict calibrate is about to write), checked by the schema."""
        return cls.from_file(check(SPS_FILE, data, where), where)

    @classmethod
    def load(cls, path: str | Path, *, inside: str | None = None, blob: bytes | None = None) -> SpsTable:
        """The table in the file at `path` (`inside`: the folder kind it is read as part of, whose links are
        refused; `blob`: its bytes, already read)."""
        return cls.from_file(load(path, SPS_FILE, inside=inside, blob=blob), f"SPS table {path}")


__all__ = ["SpsTable"]
