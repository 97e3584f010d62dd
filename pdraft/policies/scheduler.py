"""How many of the drafted tokens each request sends to verification.

Three modes. `full`: all gamma drafts (the default). `threshold`: a static confidence threshold t; request r
verifies its longest prefix whose *cumulative* survival probability a_{r,j} = prod_{i<=j} sigmoid(c_{r,i})
stays >= t. We use the cumulative product, not each position's own score, because the confidence head models
P(k survives | 1..k-1 survived) (paper eq. 7-8), so the product is the probability that the whole prefix
survives, the quantity the paper calibrates with STS and that DeepSpec's evaluator scores; since it only
decreases with j, "longest prefix with a_j >= t" and "stop at the first position below t" are the same rule.
`scheduler`: the hardware-aware prefix scheduler of the DSpark paper (Algorithm 1): over the whole batch,
admit candidate tokens (r, j) in descending order of a_{r,j} while the expected throughput
Theta = tau * SPS(B) improves, with B = R + admitted tokens and tau = R + sum of admitted a_{r,j}.

Cost model = what the engine really pays (our adaptation of the paper's Theta). B is the number of tokens
the verify pass runs: sum(1 + l_r) with the packed verifier (the default, the paper's B), and
R * (1 + max_r l_r) with the padded one (`VerifyConfig.packed=False`), where lengthening a request up to the
current longest costs nothing. And the table times the verify step alone, while a round also drafts and
updates the drafter's context: `round_overhead_s`, seconds per round that do not depend on the verify
lengths, turns SPS(B) into rounds per second 1 / (1 / SPS(B) + overhead). Leaving it out overstates what a
shorter verify pass saves, and the scheduler then cuts prefixes that would have paid for themselves.

Losslessness. The admission of draft j of request r must not depend on the realised token x_{r,j} (paper
Appendix A). c_{r,j} depends only on x_{r,j-1}, so a_{r,j} is known before x_{r,j} is drawn; stopping at the
first non-improving step keeps the decision "l_r >= j" a function of candidates ranked at or above (r, j),
none of which depends on x_{r,j}. The `early_stop=False` option runs the retrospective global search the
paper warns against; it exists only for the negative-control test that detects its bias. Never use it.

SPS(B) table: a JSON file in SGLang's layout, {"sample_batch_tokens": [...], "sample_steps_per_sec": [...],
"max_batch_tokens": N}. Between samples SPS is interpolated linearly, below the first sample it is the first
value, and above max_batch_tokens it is 0 (the engine cannot run that batch), which stops admission.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from pdraft.decode.settings import VerifyConfig, VerifyMode, check_confidence  # the policy is a run setting
from pdraft.errors import PdraftError

__all__ = ["SpsTable", "VerifyConfig", "VerifyMode", "schedule_prefixes", "survival", "threshold_lengths",
           "verify_lengths"]


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


def survival(confidence_logits: torch.Tensor, temperatures: list[float] | None = None) -> torch.Tensor:
    """confidence logits [R, gamma] -> prefix survival probabilities a_{r,j} = prod_{i<=j} c_{r,i}."""
    logits = confidence_logits.float()
    if temperatures is not None:
        t = torch.tensor(temperatures[: logits.shape[1]], dtype=torch.float32)
        if t.numel() < logits.shape[1]:
            raise PdraftError(
                f"confidence calibration has {t.numel()} temperatures but the block drafts {logits.shape[1]}"
            )
        logits = logits / t
    return torch.sigmoid(logits).cumprod(dim=-1)


def threshold_lengths(prefix_survival: torch.Tensor, threshold: float) -> torch.Tensor:
    """[R, gamma] -> [R] long: the longest prefix whose cumulative survival is >= threshold."""
    return (prefix_survival >= threshold).long().cumprod(-1).sum(-1)


def schedule_prefixes(prefix_survival: torch.Tensor, sps: SpsTable, early_stop: bool = True, *, padded: bool = False,
                      round_overhead_s: float = 0.0) -> list[int]:
    """Algorithm 1 of the DSpark paper over R requests. prefix_survival [R, gamma]: a_{r,j}, entries that are
    0 (or masked to 0 by the caller, e.g. past a request's token budget) are never admitted. `padded`: the
    verify pass costs R * (1 + max l) tokens instead of sum(1 + l); `round_overhead_s`: see the module
    docstring. Either way each decision sees only the candidates ranked at or above it, and the search stops
    at the first non-improving step, so a_{r,k} for k > j (which depend on x_{r,j}) never decide l_r >= j."""
    a = prefix_survival.tolist()
    rows = len(a)
    # Ties are broken by position, then request, so a request's prefix is always admitted left to right.
    candidates = sorted(
        ((v, j + 1, r) for r, row in enumerate(a) for j, v in enumerate(row) if v > 0.0),
        key=lambda c: (-c[0], c[1], c[2]),
    )

    def throughput(tau: float, tokens: int) -> float:  # expected tokens per second of the whole round
        steps = sps(tokens)
        return tau / (1.0 / steps + round_overhead_s) if steps > 0 else 0.0

    lengths = [0] * rows
    best_lengths = [0] * rows
    admitted, longest, tau = 0, 0, float(rows)
    best = throughput(tau, rows)
    for value, j, r in candidates:
        lengths[r] = j
        admitted += 1
        longest = max(longest, j)
        tau += value
        theta = throughput(tau, rows * (1 + longest) if padded else rows + admitted)
        if theta > best:
            best = theta
            best_lengths = list(lengths)
        elif early_stop:
            break
    return best_lengths


def verify_lengths(
    config: VerifyConfig,
    gamma: int,
    confidence: torch.Tensor | None,  # [batch, gamma] raw confidence logits
    caps: torch.Tensor,  # [batch] long: most drafts each request may verify; -1 = request finished
) -> torch.Tensor:
    """[batch] long: l, the number of drafts each request sends to the target this round."""
    if config.mode == "full" or gamma == 0:
        return caps.clamp(max=gamma)
    if confidence is None:  # the drafter proposed without a confidence head
        check_confidence(None, f"verification mode {config.mode!r}")
    a = survival(confidence[:, :gamma].cpu(), config.confidence_temperatures)  # [batch, gamma], on the host like caps
    within = torch.arange(1, gamma + 1).unsqueeze(0) <= caps.unsqueeze(1)  # [batch, gamma]
    a = a * within  # positions past the cap are never admitted; caps depend on lengths only, not tokens
    if config.mode == "threshold":
        lengths = threshold_lengths(a, config.threshold) if config.threshold > 0 else caps.clamp(max=gamma)
    else:
        lengths = torch.zeros_like(caps)
        active = (caps >= 0).nonzero().flatten()  # finished requests take no part in the batch
        if active.numel():
            chosen = schedule_prefixes(a[active], config.sps, config.early_stop, padded=not config.packed,
                                       round_overhead_s=config.round_overhead_s)
            lengths[active] = torch.tensor(chosen, dtype=torch.long)
    return torch.where(caps < 0, caps, lengths)  # -1 marks a finished request
