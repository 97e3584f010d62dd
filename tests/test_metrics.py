"""The metric definitions of DESIGN.md, recomputed by hand on a small known list of rounds."""

import pytest

from pdraft.metrics import RoundRecord, speedup, summarize


def records():
    # gamma 4; (verified l, accepted a, committed) per round; request 0 in rounds 0-2, request 1 in 0-1.
    rows = [(0, 0, 4, 4, 5), (1, 0, 4, 2, 3), (0, 1, 3, 1, 2), (1, 1, 4, 0, 1), (0, 2, 2, 2, 2)]
    times = {0: (0.010, 0.002, 0.006), 1: (0.008, 0.002, 0.005), 2: (0.004, 0.001, 0.002)}
    return [RoundRecord(req, rnd, 4, l, a, c, times[rnd][1], times[rnd][2], times[rnd][0])
            for req, rnd, l, a, c in rows]


def test_summary_by_hand():
    s = summarize(records())
    assert s.rounds == 5 and s.requests == 2 and s.generated_tokens == 13
    assert s.tau == pytest.approx((5 + 3 + 2 + 1 + 3) / 5)  # a + 1 per round
    assert s.token_acceptance == pytest.approx(9 / 17)  # sum a / sum l
    assert s.block_acceptance == pytest.approx(1 / 5)  # only the first round accepted a = gamma = 4
    assert s.verification_utilization == pytest.approx(17 / 20)  # sum l / (gamma * rounds)
    # Conditional at k: rounds with l >= k and a >= k-1. k=1: all 5, accepted a>=1 in 4 -> 4/5.
    # k=2: l>=2 & a>=1: rounds (4,4),(4,2),(3,1),(2,2) -> a>=2 in 3 -> 3/4.
    # k=3: l>=3 & a>=2: (4,4),(4,2) -> a>=3: 1 -> 1/2.  k=4: l>=4 & a>=3: (4,4) -> 1/1.
    assert s.conditional_acceptance == pytest.approx([4 / 5, 3 / 4, 1 / 2, 1.0])
    # Joint at k: P(a >= k) over all 5 rounds.
    assert s.joint_acceptance == pytest.approx([4 / 5, 3 / 5, 1 / 5, 1 / 5])
    # Times: each batched round counted once.
    assert s.decode_s == pytest.approx(0.022) and s.draft_s == pytest.approx(0.005)
    assert s.verify_s == pytest.approx(0.013) and s.bookkeeping_s == pytest.approx(0.004)
    assert s.tpot_s == pytest.approx((0.022 / 9 + 0.018 / 4) / 2)  # per request, then mean
    assert s.tokens_per_s == pytest.approx(13 / 0.022)
    rounds = len({r.round for r in records()})
    assert s.batched_rounds == rounds < s.rounds
    assert s.draft_s_per_round == pytest.approx(0.005 / rounds)
    assert s.verify_s_per_round == pytest.approx(0.013 / rounds)


def test_times_per_round_leave_out_target_only_steps():
    # Round 0 is each request's first token, the target alone (gamma 0, nothing drafted, one token verified);
    # rounds 1-2 draft. Per-round costs are over the drafting rounds, as tau is; a target-alone run keeps all.
    recs = [RoundRecord(0, 0, 0, 0, 0, 1, 0.0, 0.001, 0.0012), RoundRecord(0, 1, 4, 4, 2, 3, 0.004, 0.006, 0.011),
            RoundRecord(0, 2, 4, 4, 0, 1, 0.002, 0.008, 0.011)]
    s = summarize(recs)
    assert s.draft_s_per_round == pytest.approx(0.003) and s.verify_s_per_round == pytest.approx(0.007)
    assert s.round_s_per_round == pytest.approx(0.011)
    assert s.draft_s == pytest.approx(0.006) and s.decode_s == pytest.approx(0.0232)  # totals keep every round
    alone = summarize([RoundRecord(0, k, 0, 0, 0, 1, 0.0, 0.001 * (k + 1), 0.002) for k in range(3)])
    assert alone.verify_s_per_round == pytest.approx(0.002) and alone.draft_s_per_round == 0.0


def test_conditional_skips_unverified_positions():
    # A round that verified only 1 of 4 drafts says nothing about position 2.
    recs = [RoundRecord(0, 0, 4, 1, 1, 2), RoundRecord(0, 1, 4, 4, 1, 2)]
    s = summarize(recs)
    assert s.conditional_acceptance[1] == 0.0  # only round 1 verified position 2, and rejected it
    assert s.conditional_acceptance[2] is None  # no round reached position 3 with 1..2 accepted


def test_target_only_and_speedup():
    base = summarize([RoundRecord(0, i, 0, 0, 0, 1, 0.0, 0.01, 0.01) for i in range(10)])
    assert base.tau == 1.0 and base.token_acceptance is None and base.block_acceptance is None
    assert base.verification_utilization is None and base.tpot_s == pytest.approx(0.01)
    spec = summarize([RoundRecord(0, i, 4, 4, 3, 4, 0.004, 0.01, 0.016) for i in range(3)])
    assert spec.tpot_s == pytest.approx(0.004)
    assert speedup(base, spec) == pytest.approx(2.5)
    assert summarize([]).tau is None


def test_serving_figures_by_hand():
    """Per-user tokens/s, total tokens/s and the TPOT percentiles of records(): request 0 took part in rounds
    0, 1, 2 (0.010 + 0.008 + 0.004 = 0.022 s) for 5 + 2 + 2 = 9 tokens, request 1 in rounds 0, 1 (0.018 s) for
    3 + 1 = 4 tokens."""
    from pdraft.metrics import percentile, request_tpots

    s = summarize(records())
    assert request_tpots(records()) == pytest.approx([0.022 / 9, 0.018 / 4])
    assert s.per_user_tokens_per_s == pytest.approx((9 / 0.022 + 4 / 0.018) / 2)
    assert s.tokens_per_s == pytest.approx(13 / 0.022)  # total: every round once
    assert s.tpot_p50_s == pytest.approx(0.022 / 9)  # nearest rank of 2 values: ceil(1.0) = the 1st
    assert s.tpot_p90_s == pytest.approx(0.018 / 4)  # ceil(1.8) = the 2nd
    values = [5.0, 1.0, 4.0, 2.0, 3.0, 10.0, 7.0, 6.0, 9.0, 8.0]
    assert percentile(values, 50) == 5.0 and percentile(values, 90) == 9.0 and percentile(values, 91) == 10.0
    assert percentile(values, 0) == 1.0 and percentile([], 50) is None
    assert summarize([]).per_user_tokens_per_s is None


def test_speedup_range_pairs_each_repeat_with_the_baselines_same_repeat():
    from pdraft.metrics import speedup_range

    assert speedup_range([4.0, 5.0, 4.5], [2.0, 2.0, 3.0]) == (1.5, 2.5)  # 2.0, 2.5, 1.5: not 4/3 .. 5/2 sorted apart
    assert speedup_range([4.0, None, 6.0], [2.0, 2.0, None]) is None  # one timed pair: no spread to show
    assert speedup_range([4.0], [2.0]) is None
