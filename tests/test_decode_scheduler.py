"""Unit tests of the verification-length policies: the SPS table, Algorithm 1 on hand-checked cases, the
static threshold on the cumulative survival product, and the policy objects the engine calls (`lengths`)."""

import json
import math

import pytest
import torch

from pdraft.policies.base import VerifyConfig, VerifyPolicy, make_policy, survival
from pdraft.policies.cost import SpsTable
from pdraft.policies.scheduler import schedule_prefixes
from pdraft.policies.threshold import threshold_lengths
from pdraft.errors import PdraftError
from pdraft.models.api import Proposal

APPENDIX = SpsTable([1, 2, 3], [1.0, 0.5, 0.45], 3)


def test_sps_interpolation_and_limits(tmp_path):
    table = SpsTable([2, 4, 8], [10.0, 8.0, 4.0], 10)
    assert table(1) == 10.0 and table(3) == 9.0 and table(6) == 6.0 and table(9) == 4.0 and table(11) == 0.0
    path = tmp_path / "sps.json"
    path.write_text(json.dumps({"sample_batch_tokens": [2, 4, 8], "sample_steps_per_sec": [10, 8, 4],
                                "max_batch_tokens": 10}))
    assert SpsTable.load(path) == table
    with pytest.raises(PdraftError, match="does not exist"):
        SpsTable.load(tmp_path / "missing.json")
    path.write_text(json.dumps({"sample_batch_tokens": [4, 2], "sample_steps_per_sec": [1, 1]}))
    with pytest.raises(PdraftError, match="strictly increasing"):
        SpsTable.load(path)


def test_algorithm1_appendix_cases():
    # Case 1 of Appendix A: a = (0.8, 0.72). Theta: 1.0, 0.9, 1.134. Early stop halts at the first step.
    a = torch.tensor([[0.8, 0.72]])
    assert schedule_prefixes(a, APPENDIX, early_stop=True) == [0]
    assert schedule_prefixes(a, APPENDIX, early_stop=False) == [2]  # the retrospective global maximum
    # Case 2: c_2 = 0, so a_2 = 0 is never a candidate; both return 0.
    assert schedule_prefixes(torch.tensor([[0.8, 0.0]]), APPENDIX, early_stop=False) == [0]


def test_algorithm1_batch_greedy_order():
    # Two requests; flat SPS up to 5 tokens then nothing: admit the 3 most likely extensions over the batch.
    sps = SpsTable([1, 5], [1.0, 1.0], 5)
    a = torch.tensor([[0.9, 0.5, 0.4], [0.95, 0.85, 0.1]])
    assert schedule_prefixes(a, sps) == [1, 2]
    # A falling table stops admission once tau * SPS stops improving: B=2 -> 2*1.0; B=3 -> 2.95*0.9 = 2.655;
    # B=4 -> 3.85*0.7 = 2.695; B=5 -> 4.7*0.55 = 2.585 < best, stop.
    sps = SpsTable([2, 3, 4, 5], [1.0, 0.9, 0.7, 0.55], 8)
    assert schedule_prefixes(a, sps) == [1, 1]


def test_survival_is_cumulative_and_threshold_uses_it():
    logits = torch.tensor([[math.log(9), 0.0, math.log(9)]])  # c = 0.9, 0.5, 0.9
    a = survival(logits)
    assert torch.allclose(a, torch.tensor([[0.9, 0.45, 0.405]]))
    assert threshold_lengths(a, 0.5).tolist() == [1]  # per-position scores would have kept position 3
    assert threshold_lengths(a, 0.4).tolist() == [3]
    assert torch.allclose(survival(logits, [1.0, 1.0, 2.0])[0, 2], torch.tensor(0.45 * 0.75))


def verify_lengths(config, gamma: int, confidence, caps: torch.Tensor) -> torch.Tensor:
    """The lengths the engine's round gets from `config`'s policy (or from a policy object) for drafts with these
    confidence logits."""
    proposal = Proposal(tokens=torch.zeros(len(caps), gamma, dtype=torch.long), probs=None, confidence=confidence)
    policy = config if isinstance(config, VerifyPolicy) else make_policy(config)
    return policy.lengths(proposal if gamma else None, caps)


def test_verify_lengths_caps_and_finished():
    conf = torch.full((3, 4), 5.0)
    caps = torch.tensor([4, 1, -1])
    assert verify_lengths(VerifyConfig(), 4, None, caps).tolist() == [4, 1, -1]
    assert verify_lengths(VerifyConfig(mode="threshold", knobs={"threshold": 0.5}), 4, conf, caps).tolist() == [4, 1, -1]
    sched = VerifyConfig(mode="scheduler", sps=SpsTable([1, 100], [1.0, 1.0], 100))
    assert verify_lengths(sched, 4, conf, caps).tolist() == [4, 1, -1]
    with pytest.raises(PdraftError, match="confidence head"):
        verify_lengths(sched, 4, None, caps)


def test_config_errors():
    with pytest.raises(PdraftError, match="SPS table"):
        VerifyConfig(mode="scheduler")
    with pytest.raises(PdraftError, match="threshold"):
        VerifyConfig(mode="threshold", knobs={"threshold": 1.5})
    with pytest.raises(PdraftError, match="unknown verification mode"):
        VerifyConfig(mode="greedy")


def test_padded_cost_model():
    """With the padded pass a verify step costs R * (1 + max l): the first token of a new, longer column is
    expensive and tokens up to the current longest are free."""
    a = torch.tensor([[0.9, 0.3], [0.8, 0.2]])
    sps = SpsTable([2, 3, 4, 5, 6], [1.0, 0.9, 0.6, 0.55, 0.5], 6)
    assert schedule_prefixes(a, sps) == [1, 0]  # packed: B=3 -> 2.61 > 2.0, B=4 -> 2.22: stop
    assert schedule_prefixes(a, sps, padded=True) == [0, 0]  # padded: the first token already costs B=4
    a = torch.tensor([[0.9], [0.05]])
    sps = SpsTable([2, 3, 4], [1.0, 0.95, 0.9], 4)
    assert schedule_prefixes(a, sps) == [1, 0]  # packed: 2.755, then 2.95 * 0.9 = 2.655: stop
    assert schedule_prefixes(a, sps, padded=True) == [1, 1]  # padded: the second token rides along free


def test_round_overhead_makes_verification_cheaper_relatively():
    # Appendix table: verify-only Theta stops at once; with 1 s of drafting per round, a round of B=3 costs
    # 1/0.45 + 1 = 3.22 s against 2 s for B=1, and 2.52 tokens / 3.22 s beats 1 token / 2 s.
    a = torch.tensor([[0.8, 0.72]])
    assert schedule_prefixes(a, APPENDIX) == [0]
    assert schedule_prefixes(a, APPENDIX, round_overhead_s=1.0) == [2]
    with pytest.raises(PdraftError, match="round overhead"):
        VerifyConfig(knobs={"round_overhead_s": -1.0})


def _violations(early_stop: bool, trials: int = 300) -> int:
    """How often the decision l_r >= j changed when only a_{r,k}, k > j (functions of x_{r,j}) changed."""
    g = torch.Generator().manual_seed(0)
    found = 0
    for t in range(trials):
        rows, gamma = 3, 4
        a = torch.rand(rows, gamma, generator=g).clamp_min(0.05).cumprod(-1)  # [R, gamma] non-increasing
        tokens = list(range(rows, rows * (gamma + 1) + 1))
        sps = SpsTable(tokens, torch.empty(len(tokens)).uniform_(0.5, 1.0, generator=g).cumprod(0).tolist(),
                       tokens[-1])
        kw = dict(padded=bool(t % 2), round_overhead_s=0.2 * (t % 3))
        before = schedule_prefixes(a, sps, early_stop, **kw)
        for r in range(rows):
            for j in range(1, gamma):
                b = a.clone()
                b[r, j:] = a[r, j - 1] * torch.rand(gamma - j, generator=g).sort(descending=True).values
                after = schedule_prefixes(b, sps, early_stop, **kw)
                found += (before[r] >= j) != (after[r] >= j)
    return found


def test_decisions_never_look_past_the_processed_prefix():
    """The property the paper's Appendix A needs, checked directly over random batches, tables, both cost
    models and round overheads: changing a request's survival after position j never changes whether it
    verifies position j. Without the early stop (the negative control) it does."""
    assert _violations(early_stop=True) == 0
    assert _violations(early_stop=False) > 0


def test_roofline_fit_of_the_cost_table():
    """The profile's fit recovers a flat-then-linear step time from noisy medians, so 1 / T never rises."""
    from pdraft.calibrate.sps import roofline_fit

    g = torch.Generator().manual_seed(0)
    true = [max(10.0, 5.0 + 0.1 * b) for b in range(1, 301)]
    noisy = [t * float(1 + 0.1 * torch.randn(1, generator=g)) for t in true]
    fit = roofline_fit(noisy)
    assert max(abs(f - t) / t for f, t in zip(fit, true)) < 0.05
    assert all(b >= a for a, b in zip(fit, fit[1:]))
    assert roofline_fit([1.0, 2.0, 3.0]) == pytest.approx([1.0, 2.0, 3.0])
    # Measured at the profile's points only, the fit at every B still recovers the curve.
    from pdraft.calibrate.sps import profile_points

    points = profile_points(300)
    assert points[:32] == list(range(1, 33)) and points[-1] == 300 and len(points) < 80
    sparse = roofline_fit([noisy[b - 1] for b in points], points, 300)
    assert len(sparse) == 300 and max(abs(f - t) / t for f, t in zip(sparse, true)) < 0.05
