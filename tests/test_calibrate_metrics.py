"""Calibration metrics against hand-computed values, STS recovering known miscalibration temperatures from
synthetic rounds, the threshold sweep on a hand-made record set, and the calibration-file round trip."""

import json
import math

import numpy as np
import pytest

from pdraft.metrics import RoundRecord
from pdraft.calibrate.collect import RoundData, from_records
from pdraft.calibrate.scores import bin_indices, brier, ece, ece_floor, reliability, roc_auc
from pdraft.calibrate.sts import calibration_dict, evaluate, fit_sts, pooled, save_calibration, sigmoid
from pdraft.calibration_files import find_calibration, load_calibration
from pdraft.calibrate.threshold_sweep import recommend, sweep
from pdraft.policies.base import survival as scheduler_survival
from pdraft.policies.cost import SpsTable
from pdraft.errors import PdraftError


def test_ece_equal_width_by_hand():
    p = [0.1, 0.2, 0.8, 0.9]
    y = [0, 1, 1, 1]
    # 2 bins: [0, .5): mean pred .15, outcome .5 -> .35; [.5, 1]: mean pred .85, outcome 1 -> .15
    assert ece(p, y, bins=2, binning="equal_width") == pytest.approx(0.5 * 0.35 + 0.5 * 0.15)
    # 1 bin: |0.5 - 0.75|
    assert ece(p, y, bins=1, binning="equal_width") == pytest.approx(0.25)


def test_ece_equal_mass_by_hand():
    p = [0.9, 0.1, 0.3, 0.35, 0.8, 0.2]
    y = [1, 0, 1, 0, 0, 0]
    # sorted: .1(0) .2(0) | .3(1) .35(0) | .8(0) .9(1) -> errors .15, .175, .35, each weight 1/3
    assert ece(p, y, bins=3, binning="equal_mass") == pytest.approx((0.15 + 0.175 + 0.35) / 3)
    assert list(bin_indices(p, 3, "equal_mass")) == [2, 0, 1, 1, 2, 0]
    bins = reliability(p, y, 3, "equal_mass")
    assert [b.count for b in bins] == [2, 2, 2] and bins[2].low == pytest.approx(0.8)
    assert ece([], [], 3) is None


def test_auc_and_brier_by_hand():
    # positives .8 .4, negatives .6 .2: pairs (.8>.6) (.8>.2) (.4<.6) (.4>.2) -> 3/4
    assert roc_auc([0.8, 0.4, 0.6, 0.2], [1, 1, 0, 0]) == pytest.approx(0.75)
    assert roc_auc([0.5, 0.5], [1, 0]) == pytest.approx(0.5)  # a tie counts one half
    assert roc_auc([0.3, 0.7], [1, 1]) is None
    assert brier([1.0, 0.0, 0.5], [1, 1, 0]) == pytest.approx((0 + 1 + 0.25) / 3)


def synthetic(t_true, n=6000, seed=0):
    """Rounds whose position-k survival really is sigmoid(c_k / T_k) given 1..k-1 survived: the head is
    miscalibrated by T_k, and STS should find it."""
    rng = np.random.default_rng(seed)
    gamma = len(t_true)
    logits = rng.normal(1.5, 2.0, size=(n, gamma))
    p = sigmoid(logits / np.asarray(t_true)[None, :])
    ok = rng.random((n, gamma)) < p
    accepted = np.where(ok.all(axis=1), gamma, np.argmin(ok, axis=1))
    return RoundData(logits, np.full(n, gamma), accepted, np.arange(n) // 10)


def test_sts_recovers_known_temperatures():
    t_true = [2.0, 0.7, 1.5, 1.0]
    fit_data, held = synthetic(t_true, seed=1), synthetic(t_true, seed=2)
    fit = fit_sts(fit_data, bins=15, binning="equal_mass", min_samples=50)
    assert all(fit.fitted) and not fit.warnings
    for got, want in zip(fit.temperatures, t_true):
        assert abs(math.log(got / want)) < math.log(1.25), (fit.temperatures, t_true)
    before = evaluate(held, None, 15, "equal_mass")
    after = evaluate(held, fit.temperatures, 15, "equal_mass")
    assert before[0].ece > 0.03 and after[0].ece < 0.02
    assert sum(m.ece for m in after) < 0.5 * sum(m.ece for m in before)
    # Temperatures preserve order within a position: the AUC is unchanged at position 1.
    assert after[0].auc == pytest.approx(before[0].auc)
    # The engine's scheduler applies the temperatures the same way (logit / T per position, then cumprod).
    import torch

    from pdraft.calibrate.sts import survival

    np.testing.assert_allclose(
        survival(held.logits[:5], fit.temperatures),
        scheduler_survival(torch.tensor(held.logits[:5]), fit.temperatures).numpy(), rtol=1e-5)


def test_ece_floor_is_the_ece_of_a_calibrated_predictor_on_that_many_samples():
    rng = np.random.default_rng(3)
    p = rng.uniform(0.05, 0.95, 2000)
    floor = ece_floor(p, 15, "equal_mass")
    # honest outcomes land around the floor; outcomes from a miscalibrated truth land well above it
    honest = [ece(p, rng.random(p.size) < p, 15) for _ in range(20)]
    assert 0.5 * floor < np.median(honest) < 1.6 * floor
    assert ece(p, rng.random(p.size) < np.clip(p + 0.1, 0, 1), 15) > 2.5 * floor
    assert ece_floor(np.tile(p, 16), 15) < 0.4 * floor  # noise shrinks like 1/sqrt(n)
    assert ece_floor([0.0, 1.0, 1.0, 0.0], 2) == 0.0 and ece_floor([], 15) is None


def test_pooled_floor_follows_each_round_survival_chain():
    t_true = [1.0, 1.0, 1.0, 1.0]
    data = synthetic(t_true, n=3000, seed=4)  # calibrated at T = 1: the ECE sits at the floor
    m = pooled(data, t_true, 15, "equal_mass")
    assert m["ece_floor"] > 0 and m["ece"] < 2.5 * m["ece_floor"]
    off = pooled(data, [3.0] * 4, 15, "equal_mass")  # a wrong temperature: far above its floor
    assert off["ece"] > 3 * off["ece_floor"]
    per_position = evaluate(data, t_true, 15, "equal_mass")
    assert all(x.ece_floor is not None and x.ece_floor > 0 for x in per_position)


def test_sts_inherits_temperature_where_samples_are_few():
    data = synthetic([2.0, 2.0, 2.0, 2.0], n=400)
    data.accepted = np.minimum(data.accepted, 1)  # position 2 never survives: position 3 is never reached
    fit = fit_sts(data, min_samples=50)
    assert fit.fitted[:2] == [True, True] and fit.fitted[2:] == [False, False]
    assert fit.temperatures[2] == fit.temperatures[1] == fit.temperatures[3]
    assert "position 3" in fit.warnings[0] and "inherited" in fit.warnings[0]
    with pytest.raises(PdraftError, match="too few calibration samples"):
        fit_sts(data, min_samples=10_000)


def hand_records():
    # gamma 3, full verification; confidences given as logits of the probabilities below (T = 1)
    def lg(*ps):
        return [math.log(p / (1 - p)) for p in ps]
    return [
        RoundRecord(0, 0, 3, 3, 3, 4, confidence=lg(0.9, 0.9, 0.9)),  # a: .9 .81 .729
        RoundRecord(0, 1, 3, 3, 1, 2, confidence=lg(0.9, 0.5, 0.9)),  # a: .9 .45 .405
        RoundRecord(1, 0, 3, 3, 0, 1, confidence=lg(0.3, 0.9, 0.9)),  # a: .3 .27 .243
        RoundRecord(1, 1, 3, 2, 2, 3, confidence=lg(0.9, 0.9, 0.9)),  # token budget: only 2 verified
    ]


def test_sweep_from_hand_made_records():
    data = from_records(hand_records())
    assert data.observed()[3].tolist() == [True, True, False]
    assert data.reached()[1].tolist() == [True, True, False] and data.survived()[1].tolist() == [True, False, False]
    rows = {r.threshold: r for r in sweep(data, None, thresholds=[0.0, 0.4, 0.5, 0.8])}
    # t = 0: verify all (3, 3, 3, 2) accept (3, 1, 0, 2)
    assert rows[0.0].verified == pytest.approx(11 / 4) and rows[0.0].accepted == pytest.approx(6 / 4)
    assert rows[0.0].rejected == pytest.approx(5 / 4) and rows[0.0].acceptance_rate == pytest.approx(6 / 11)
    # t = .4: lengths 3, 3, 0, 2 -> accepted 3, 1, 0, 2
    assert rows[0.4].verified == pytest.approx(8 / 4) and rows[0.4].accepted == pytest.approx(6 / 4)
    # t = .5: lengths 3, 1, 0, 2 -> accepted 3, 1, 0, 2: no rejection left
    assert rows[0.5].verified == pytest.approx(6 / 4) and rows[0.5].rejected == 0
    assert rows[0.5].acceptance_rate == 1.0 and rows[0.5].tau == pytest.approx(10 / 4)
    # t = .8: lengths 2, 1, 0, 2 -> accepted 2, 1, 0, 2
    assert rows[0.8].accepted == pytest.approx(5 / 4)
    # knee rule without a cost table: largest t with tau >= 95% of t = 0's
    assert recommend(list(rows.values()))[0] == 0.5
    # with a cost table where every extra token halves the speed, verifying less wins
    steep = SpsTable([1, 2, 3, 4], [8.0, 4.0, 2.0, 1.0], 4)
    costed = sweep(data, None, thresholds=[0.0, 0.5, 0.8], sps=steep)
    assert recommend(costed)[0] == 0.8 and "cost table" in recommend(costed)[1]


def test_calibration_file_round_trip_in_sglang_layout(tmp_path):
    data = synthetic([1.5, 1.5], n=500)
    fit = fit_sts(data, min_samples=10)
    ev = evaluate(data, fit.temperatures, 10, "equal_width")
    doc = calibration_dict(fit, dataset="synthetic", fit_rows=len(data), before=evaluate(data, None, 10, "equal_width"),
                           after=ev, extra={"binning": "equal_width"})
    path = save_calibration(doc, tmp_path / "confidence_sts.json")
    raw = json.loads(path.read_text())
    # SGLang's DSparkStsCalibration fields and types
    assert isinstance(raw["temperatures"], list) and isinstance(raw["dataset"], str)
    assert isinstance(raw["num_samples"], int) and len(raw["ece_before"]) == len(raw["ece_after"]) == 2
    assert find_calibration(tmp_path) == path and find_calibration(tmp_path / "nope") is None
    assert load_calibration(path) == pytest.approx(fit.temperatures)
    (tmp_path / "bad.json").write_text(json.dumps({"temperatures": [1.0, -2.0]}))
    with pytest.raises(PdraftError, match=r"temperatures\.1: expected a value greater than 0"):
        load_calibration(tmp_path / "bad.json")
    with pytest.raises(PdraftError, match="does not exist"):
        load_calibration(tmp_path / "missing.json")


def test_calibration_splits_script_refits_every_seed(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    data = synthetic([2.0, 0.7, 1.5, 1.0], n=3000, seed=5)
    rounds = tmp_path / "rounds.json"
    rounds.write_text(json.dumps(data.to_dict()))
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "calibration_splits.py"
    done = subprocess.run([sys.executable, str(script), str(rounds), "--seeds", "3", "--json", str(tmp_path / "o.json")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "o.json").read_text())
    assert [r["seed"] for r in report["splits"]] == [0, 1, 2]
    for r in report["splits"]:  # the synthetic head is miscalibrated by known temperatures: STS must help
        assert r["after"]["pooled_ece"] < r["before"]["pooled_ece"]
        assert r["fit_rounds"] + r["eval_rounds"] == 3000
    assert "median" in done.stdout
    missing = subprocess.run([sys.executable, str(script), str(tmp_path / "nope.json")], capture_output=True, text=True)
    assert missing.returncode == 2 and "calibrate-threshold" in missing.stderr
