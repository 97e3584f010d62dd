"""Static confidence-threshold sweep (DSpark paper, Figure 5), replayed from full-verification rounds.

For threshold t a request verifies its longest prefix whose calibrated cumulative survival a_j stays >= t, the
rule of pdraft.policies.threshold.threshold_lengths (t = 0 verifies the whole block). Replaying it on rounds
that were verified in full is exact: acceptance of position j depends only on the drafts and target outputs
at positions <= j, never on how many drafts after j were sent, so with l_t drafts verified the round accepts
min(a, l_t), where a is what full verification accepted, and rejects l_t - min(a, l_t).

Recommendation. With a cost table, the threshold with the largest expected throughput of one request,
sum(accepted + 1) / sum(1 / SPS(1 + l_t)) tokens per second of target time (draft time left out: it does not
depend on t). Without one, the "knee": the largest threshold that keeps at least 95% of full verification's
tokens per round (tau) while verifying fewer drafts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from pdraft.calibrate.collect import RoundData
from pdraft.calibrate.sts import survival

THRESHOLDS = [round(0.1 * i, 1) for i in range(10)]
KNEE_TAU_SHARE = 0.95


@dataclass
class SweepRow:
    threshold: float
    verified: float  # mean drafts verified per round
    accepted: float  # mean drafts accepted per round
    rejected: float  # mean drafts verified and rejected per round
    acceptance_rate: float | None  # sum accepted / sum verified
    tau: float  # mean accepted + 1 per round
    tokens_per_s: float | None = None  # expected, one request, from the cost table

    def to_dict(self) -> dict:
        return asdict(self)


def threshold_lengths(a: np.ndarray, cap: np.ndarray, t: float) -> np.ndarray:
    """[N, gamma] survival, [N] verified under full verification -> [N] drafts verified at threshold t."""
    within = np.arange(1, a.shape[1] + 1)[None, :] <= cap[:, None]
    if t <= 0:
        return cap.copy()
    keep = (a >= t) & within
    return np.cumprod(keep, axis=1).sum(axis=1)


def sweep(data: RoundData, temperatures: list[float] | None, thresholds=THRESHOLDS, sps=None) -> list[SweepRow]:
    a = survival(data.logits, temperatures)  # [N, gamma]
    rows = []
    for t in thresholds:
        l_t = threshold_lengths(a, data.verified, t)
        acc = np.minimum(data.accepted, l_t)
        n = max(len(data), 1)
        speed = None
        if sps is not None and len(data):
            seconds = sum(1.0 / sps(int(1 + l)) if sps(int(1 + l)) > 0 else float("inf") for l in l_t)
            speed = float((acc + 1).sum() / seconds) if seconds > 0 else None
        rows.append(SweepRow(
            threshold=float(t), verified=float(l_t.sum() / n), accepted=float(acc.sum() / n),
            rejected=float((l_t - acc).sum() / n),
            acceptance_rate=float(acc.sum() / l_t.sum()) if l_t.sum() else None,
            tau=float((acc + 1).sum() / n), tokens_per_s=speed))
    return rows


def recommend(rows: list[SweepRow]) -> tuple[float, str]:
    """(threshold, the rule used)."""
    if all(r.tokens_per_s is not None for r in rows):
        best = max(rows, key=lambda r: (r.tokens_per_s, -r.threshold))
        return best.threshold, ("largest expected tokens per second of target time for one request, from the "
                                "profiled cost table")
    full = rows[0].tau
    ok = [r for r in rows if r.tau >= KNEE_TAU_SHARE * full]
    best = max(ok, key=lambda r: r.threshold)
    return best.threshold, (f"knee: largest threshold keeping >= {KNEE_TAU_SHARE:.0%} of full verification's "
                            "tokens per round (no cost table)")
