"""The cost table SPS(B) a policy weighs verification against: engine steps per second as a function of the
number of tokens B one verify pass runs, profiled by `pdraft calibrate-threshold` (pdraft.calibrate.sps) on the
device and written beside the drafter. A JSON file in SGLang's layout, {"sample_batch_tokens": [...],
"sample_steps_per_sec": [...], "max_batch_tokens": N}. Between samples SPS is interpolated linearly, below the
first sample it is the first value, and above max_batch_tokens it is 0 (the engine cannot run that batch)."""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass
from pathlib import Path

from pdraft.errors import PdraftError


@dataclass
class SpsTable:
    """Engine steps per second as a function of the number of tokens B in one target forward."""

    batch_tokens: list[int]
    steps_per_sec: list[float]
    max_batch_tokens: int

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
    def from_dict(cls, data: dict) -> SpsTable:
        missing = [k for k in ("sample_batch_tokens", "sample_steps_per_sec") if k not in data]
        if missing:
            raise PdraftError(f"SPS table is missing {', '.join(missing)}")
        tokens = [int(b) for b in data["sample_batch_tokens"]]
        sps = [float(s) for s in data["sample_steps_per_sec"]]
        return cls(tokens, sps, int(data.get("max_batch_tokens", tokens[-1] if tokens else 0)))

    @classmethod
    def load(cls, path: str | Path) -> SpsTable:
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise PdraftError(f"SPS table {path} does not exist", hint="profile it with calibrate-threshold")
        except (OSError, json.JSONDecodeError) as e:
            raise PdraftError(f"cannot read SPS table {path}: {e}")
        if not isinstance(data, dict):
            raise PdraftError(f"SPS table {path} must hold a JSON object")
        return cls.from_dict(data)


__all__ = ["SpsTable"]
