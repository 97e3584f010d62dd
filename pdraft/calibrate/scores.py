"""Calibration metrics of predicted probabilities against 0/1 outcomes: expected calibration error (ECE) with
equal-width or equal-mass bins, the reliability bins behind it, ROC-AUC and the Brier score.

ECE = sum over bins of (bin share of samples) * |mean prediction - mean outcome| (Naeini et al., 2015), as
DeepSpec's deepspec/eval/dspark/confidence_head.py and SGLang's python/sglang/benchmark/dspark_sts_fit.py
compute it; both use equal-width bins only. pdraft also offers equal-mass bins (each bin holds the same number
of samples, after sorting by prediction), which do not leave most bins empty when the predictions crowd
near 0 or 1 as prefix-survival probabilities do at late positions. ROC-AUC is computed exactly (the
Mann-Whitney statistic with tied predictions counted one half), not from DeepSpec's 1000-bin histogram.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

import numpy as np

Binning = Literal["equal_mass", "equal_width"]


@dataclass
class Bin:
    low: float  # smallest prediction the bin may hold (equal-width: its edge; equal-mass: its first sample)
    high: float
    count: int
    mean_pred: float
    mean_outcome: float

    def to_dict(self) -> dict:
        return asdict(self)


def _arrays(probs, outcomes) -> tuple[np.ndarray, np.ndarray]:
    p = np.asarray(probs, dtype=np.float64).reshape(-1)
    y = np.asarray(outcomes, dtype=np.float64).reshape(-1)
    if p.shape != y.shape:
        raise ValueError(f"predictions ({p.size}) and outcomes ({y.size}) differ in length")
    return p, y


def bin_indices(probs, bins: int, binning: Binning) -> np.ndarray:
    """Bin number (0..bins-1) of every prediction."""
    p = np.asarray(probs, dtype=np.float64).reshape(-1)
    if binning == "equal_width":
        return np.clip((p * bins).astype(np.int64), 0, bins - 1)
    if binning != "equal_mass":
        raise ValueError(f"unknown binning {binning!r}: use equal_mass or equal_width")
    # Equal mass: rank the samples by prediction (stable, so ties keep their order) and cut the ranks into
    # `bins` runs whose sizes differ by at most one.
    order = np.argsort(p, kind="stable")
    idx = np.empty(p.size, dtype=np.int64)
    idx[order] = (np.arange(p.size) * bins) // max(p.size, 1)
    return idx


def reliability(probs, outcomes, bins: int = 15, binning: Binning = "equal_mass") -> list[Bin]:
    """The non-empty bins of a reliability diagram, in increasing order of prediction."""
    p, y = _arrays(probs, outcomes)
    if p.size == 0:
        return []
    idx = bin_indices(p, bins, binning)
    out = []
    for b in range(bins):
        m = idx == b
        n = int(m.sum())
        if n == 0:
            continue
        if binning == "equal_width":
            low, high = b / bins, (b + 1) / bins
        else:
            low, high = float(p[m].min()), float(p[m].max())
        out.append(Bin(low, high, n, float(p[m].mean()), float(y[m].mean())))
    return out


def ece(probs, outcomes, bins: int = 15, binning: Binning = "equal_mass") -> float | None:
    """Expected calibration error in [0, 1]; None without samples."""
    p, _ = _arrays(probs, outcomes)
    if p.size == 0:
        return None
    return float(sum(b.count * abs(b.mean_pred - b.mean_outcome) for b in reliability(probs, outcomes, bins, binning))
                 / p.size)


def ece_floor(probs, bins: int = 15, binning: Binning = "equal_mass", draws: int = 32, seed: int = 0,
              sample=None) -> float | None:
    """The ECE a perfectly calibrated predictor would still show on this many samples: the mean ECE of
    `draws` outcome vectors drawn from Bernoulli(probs) itself (or from `sample(rng)`, for outcomes that are
    not independent). Binning a finite sample leaves each bin's mean outcome off its mean prediction by
    sampling noise alone, so an ECE near this floor is as calibrated as the sample can show; an ECE above it
    by more than a fraction of it is real miscalibration."""
    p = np.asarray(probs, dtype=np.float64).reshape(-1)
    if p.size == 0:
        return None
    rng = np.random.default_rng(seed)
    sample = sample or (lambda r: r.random(p.size) < p)
    return float(np.mean([ece(p, np.asarray(sample(rng), dtype=np.float64), bins, binning) for _ in range(draws)]))


def roc_auc(probs, outcomes) -> float | None:
    """Probability that a random positive outranks a random negative (ties count 1/2); None when the
    outcomes are all 0 or all 1, where the AUC is undefined."""
    p, y = _arrays(probs, outcomes)
    pos = int((y > 0.5).sum())
    neg = p.size - pos
    if pos == 0 or neg == 0:
        return None
    # Mid-ranks of the predictions (ties share the mean of their ranks), then the Mann-Whitney U of positives.
    order = np.argsort(p, kind="stable")
    sorted_p = p[order]
    ranks = np.empty(p.size, dtype=np.float64)
    start = 0
    while start < p.size:
        end = start
        while end + 1 < p.size and sorted_p[end + 1] == sorted_p[start]:
            end += 1
        ranks[order[start:end + 1]] = 0.5 * (start + end) + 1.0
        start = end + 1
    u = ranks[y > 0.5].sum() - pos * (pos + 1) / 2.0
    return float(u / (pos * neg))


def brier(probs, outcomes) -> float | None:
    """Mean squared difference between prediction and outcome; None without samples."""
    p, y = _arrays(probs, outcomes)
    return float(np.mean((p - y) ** 2)) if p.size else None
