"""Sequential Temperature Scaling (DSpark paper, section 3.2.1) and the calibration file it produces.

The confidence head's c_k models P(k survives | 1..k-1 survived), so a_k = prod_{i<=k} sigmoid(c_i / T_i) is
the probability that the prefix 1..k survives. STS fits T_1, T_2, ... left to right: for position k a 1-D
grid search picks the T_k that minimises the ECE of a_k against the outcome "accepted through k", with
T_1..T_{k-1} already fixed. Temperatures divide the raw logit, per position, exactly as SGLang applies them
(`sigmoid(confidence_raw / sts_temperatures)` in DSparkConfidenceHead.apply_sts, python/sglang/srt/models/
dspark.py) and as pdraft.policies.base.survival does.

The samples of position k are the rounds in which k was verified, whatever happened before it (the label is
then 0): the population DeepSpec's evaluator (deepspec/eval/dspark/confidence_head.py) and SGLang's fit
(python/sglang/benchmark/dspark_sts_fit.py) score. Differences from SGLang's fit: a finer grid (2^(i/16), T
from 1/16 to 16, 4.4% steps, T = 1 included, ties go to the T closest to 1); the recipe's binning (equal mass
by default); and positions with fewer than `min_samples` reached rounds inherit the previous position's
temperature instead of fitting noise.

The calibration file is SGLang's `--speculative-dspark-confidence-sts-path` layout (DSparkStsCalibration in
python/sglang/srt/speculative/dspark_components/dspark_sts.py: `temperatures`, `dataset`, `num_samples`,
`ece_before`, `ece_after`, the last two per position) plus a `pdraft` object with the per-position metrics;
SGLang's msgspec loader ignores keys it does not know.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from pdraft.calibrate.collect import RoundData
from pdraft.calibrate.scores import Binning, brier, ece, ece_floor, reliability, roc_auc
from pdraft.errors import PdraftError
from pdraft import ledger

HIST_BINS = 20
GRID = [2.0 ** (i / 16.0) for i in range(-64, 65)]


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.clip(x, -60.0, 60.0)))


def conditional(logits: np.ndarray, temperatures: list[float] | None = None) -> np.ndarray:
    """[N, gamma] raw logits -> [N, gamma] sigmoid(c_k / T_k) = P(k survives | 1..k-1 survived)."""
    t = np.ones(logits.shape[1]) if temperatures is None else np.asarray(temperatures[: logits.shape[1]], float)
    return sigmoid(logits / t[None, :])


def survival(logits: np.ndarray, temperatures: list[float] | None = None) -> np.ndarray:
    """[N, gamma] raw logits -> [N, gamma] prefix survival a_k = prod_{i<=k} sigmoid(c_i / T_i)."""
    return np.cumprod(conditional(logits, temperatures), axis=1)


@dataclass
class PositionMetrics:
    position: int  # 1-based drafted position
    samples: int  # rounds in which the position was verified
    reached: int  # ... and every earlier position accepted
    ece: float | None
    auc: float | None
    brier: float | None
    mean_pred: float | None
    mean_outcome: float | None
    bins: list[dict] = field(default_factory=list)  # reliability diagram
    histogram: list[int] = field(default_factory=list)  # predictions per equal-width bin of [0, 1], HIST_BINS
    ece_floor: float | None = None  # the ECE a perfectly calibrated predictor shows on these samples (metrics.ece_floor)


def evaluate(data: RoundData, temperatures: list[float] | None, bins: int, binning: Binning) -> list[PositionMetrics]:
    """Per-position calibration of the cumulative survival against "accepted through k"."""
    a, observed, reached, label = survival(data.logits, temperatures), data.observed(), data.reached(), data.survived()
    out = []
    for k in range(data.gamma):
        m = observed[:, k]
        p, y = a[m, k], label[m, k].astype(float)
        out.append(PositionMetrics(
            position=k + 1, samples=int(m.sum()), reached=int(reached[:, k].sum()),
            ece=ece(p, y, bins, binning), auc=roc_auc(p, y), brier=brier(p, y),
            mean_pred=float(p.mean()) if p.size else None, mean_outcome=float(y.mean()) if y.size else None,
            bins=[b.to_dict() for b in reliability(p, y, bins, binning)],
            histogram=np.histogram(p, bins=HIST_BINS, range=(0.0, 1.0))[0].tolist(),
            ece_floor=ece_floor(p, bins, binning, seed=k)))
    return out


def overall(metrics: list[PositionMetrics]) -> dict:
    """Sample-weighted means over positions (DeepSpec's `ece_mean`, `auc_mean`, `brier_mean`)."""
    def mean(name):
        rows = [(getattr(m, name), m.samples) for m in metrics if getattr(m, name) is not None and m.samples]
        weight = sum(w for _, w in rows)
        return sum(v * w for v, w in rows) / weight if weight else None
    return {"ece": mean("ece"), "auc": mean("auc"), "brier": mean("brier"), "ece_floor": mean("ece_floor"),
            "samples": sum(m.samples for m in metrics)}


def pooled(data: RoundData, temperatures: list[float] | None, bins: int, binning: Binning) -> dict:
    """Calibration of the cumulative survival over every verified (round, position) pair at once: the single
    ECE / AUC / Brier of all a_k against "accepted through k". It has gamma times the samples of any one
    position, so its ECE is far less dominated by binning noise than the per-position mean. `ece_floor` is what
    a perfectly calibrated predictor would score on the same samples."""
    q, observed, label = conditional(data.logits, temperatures), data.observed(), data.survived()
    p, y = np.cumprod(q, axis=1)[observed], label[observed].astype(float)
    # The floor's outcomes are nested like the real ones: each round survives position k with probability
    # q_k once it survived k-1, so they are drawn along the calibrated chain, not independently per sample.
    floor = ece_floor(p, bins, binning, sample=lambda rng: np.cumprod(rng.random(q.shape) < q, axis=1)[observed])
    return {"ece": ece(p, y, bins, binning), "auc": roc_auc(p, y), "brier": brier(p, y), "samples": int(p.size),
            "ece_floor": floor}


@dataclass
class StsFit:
    temperatures: list[float]
    fitted: list[bool]  # False: too few reached samples, temperature inherited from the position before
    warnings: list[str] = field(default_factory=list)


def fit_sts(data: RoundData, *, bins: int = 15, binning: Binning = "equal_mass", min_samples: int = 50,
            grid: list[float] | None = None) -> StsFit:
    grid = list(grid or GRID)
    if not len(data) or data.gamma == 0:
        raise PdraftError("no calibration rounds: the drafter drafted nothing on the calibration prompts")
    observed, reached, label = data.observed(), data.reached(), data.survived()
    if int(reached[:, 0].sum()) < min_samples:
        raise PdraftError(f"too few calibration samples: {int(reached[:, 0].sum())} rounds to fit on, "
                          f"calibrate.min_samples is {min_samples}",
                          hint="raise calibrate.num_prompts or calibrate.max_new_tokens, or lower --held-out")
    prefix = np.ones(len(data))  # [N] fitted survival of positions 1..k-1
    temps, fitted, warnings = [], [], []
    for k in range(data.gamma):
        n_reached = int(reached[:, k].sum())
        m = observed[:, k]
        y = label[m, k].astype(float)
        if n_reached < min_samples:
            t = temps[-1] if temps else 1.0
            warnings.append(f"position {k + 1}: only {n_reached} reached samples (< min_samples {min_samples}); "
                            f"temperature {t:.3g} inherited from position {k}" if temps else
                            f"position 1: only {n_reached} reached samples; temperature 1")
            fitted.append(False)
        else:
            def score(t):
                return ece(prefix[m] * sigmoid(data.logits[m, k] / t), y, bins, binning)
            scored = [(score(t), abs(math.log(t)), t) for t in grid]
            t = min(scored)[2]  # lowest ECE; among equals, the temperature closest to 1
            fitted.append(True)
        temps.append(float(t))
        prefix = prefix * sigmoid(data.logits[:, k] / t)
    return StsFit(temps, fitted, warnings)


# ---- the calibration file ----------------------------------------------------------------------------------
def calibration_dict(fit: StsFit, *, dataset: str, fit_rows: int, before: list[PositionMetrics],
                     after: list[PositionMetrics], extra: dict) -> dict:
    """SGLang's layout first; `ece_before` / `ece_after` are measured on the held-out part (`pdraft.ece_on`)."""
    return {
        "temperatures": fit.temperatures,
        "dataset": dataset,
        "num_samples": int(fit_rows),
        "ece_before": [m.ece if m.ece is not None else float("nan") for m in before],
        "ece_after": [m.ece if m.ece is not None else float("nan") for m in after],
        "pdraft": {
            **extra,
            "fitted": fit.fitted,
            "warnings": fit.warnings,
            "overall_before": overall(before),
            "overall_after": overall(after),
            "per_position_before": [asdict(m) for m in before],
            "per_position_after": [asdict(m) for m in after],
        },
    }


def save_calibration(data: dict, path: str | Path) -> Path:
    path = Path(path)
    # NaN is not JSON: SGLang's msgspec decoder refuses it, so a position without samples is written as null.
    clean = json.loads(json.dumps(data, default=float), parse_constant=lambda _: None)
    ledger.write_text(path, json.dumps(clean, indent=2) + "\n")
    return path
