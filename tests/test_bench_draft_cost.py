"""The latency equation in the bench report (pdraft/bench/draft_cost.py): the least-squares fit of draft time
per round against gamma recovers a known line, the ratio is the largest gamma's over the smallest's, baselines
draft nothing and are left out, each drafter is labelled with its family's drafting mode, and the winner of a
domain is its best measured speedup."""

import pytest

from pdraft.bench.draft_cost import draft_costs, draft_ms, drafting_mode, fit_line, winners
from pdraft.metrics import RoundRecord


def run(drafter, kind, gamma, draft_ms, speedup=None, domain="code", tau=2.0):
    return {"drafter": drafter, "kind": kind, "domain": domain, "gamma": gamma, "speedup": speedup,
            "summary": {"draft_s_per_round": None if draft_ms is None else draft_ms / 1000, "tau": tau}}


def test_the_fit_recovers_a_line_and_the_ratio_is_largest_over_smallest():
    assert fit_line([(4, 3.0), (8, 5.0), (16, 9.0)]) == pytest.approx((1.0, 0.5))
    assert fit_line([(4, 3.0), (4, 5.0)]) is None  # one gamma: no slope
    runs = [run("e (eagle3)", "eagle3", g, 0.4 + 1.1 * g) for g in (4, 8, 12, 16)]
    runs += [run("d (dspark)", "dspark", g, 5.0 + 0.01 * g) for g in (4, 8, 12, 16)]
    runs += [run("target alone", "target", 0, 0.0), run("n-gram (prompt lookup)", "ngram", 4, 0.2)]
    costs = {c["drafter"]: c for c in draft_costs(runs)}
    assert set(costs) == {"e (eagle3)", "d (dspark)", "n-gram (prompt lookup)"}
    e, d = costs["e (eagle3)"], costs["d (dspark)"]
    assert e["ms_per_drafted_token"] == pytest.approx(1.1) and e["intercept_ms"] == pytest.approx(0.4)
    assert e["ratio"]["gammas"] == [16, 4] and e["ratio"]["value"] == pytest.approx(18.0 / 4.8)
    assert d["ratio"]["value"] == pytest.approx(5.16 / 5.04)
    assert (e["drafting"], d["drafting"], costs["n-gram (prompt lookup)"]["drafting"]) == (
        "autoregressive", "parallel", "lookup")
    assert costs["n-gram (prompt lookup)"]["ms_per_drafted_token"] is None  # one gamma only
    assert drafting_mode("dflash2") == "parallel" and drafting_mode("eagle3") == "autoregressive"


def test_draft_time_is_the_median_of_the_drafting_rounds():
    """From the run's rounds: target-only steps (gamma 0) left out, a batched round once, and one stall of the
    machine does not move it; without rounds, the summary's mean."""
    def row(req, rnd, gamma, draft_s):
        rec = RoundRecord(req, rnd, gamma, gamma, 0, 1, draft_s, 0.01, 0.02)
        return [getattr(rec, k) for k in RoundRecord.__dataclass_fields__]

    rounds = [row(0, 0, 0, 0.0), row(1, 0, 0, 0.0)]  # each request's first token: the target alone
    rounds += [row(b, k, 4, 0.002 + 0.001 * (k % 3)) for k in range(1, 10) for b in (0, 1)]  # batch 2: twice each
    rounds += [row(0, 10, 4, 0.66), row(1, 10, 4, 0.66)]  # a stall
    r = run("d (dspark)", "dspark", 4, 99.0) | {"rounds": rounds}
    assert draft_ms(r) == pytest.approx(3.0)  # median of 2,3,4,2,3,4,2,3,4,660 ms
    assert draft_ms(run("d (dspark)", "dspark", 4, 7.0)) == pytest.approx(7.0)


def test_the_winner_of_a_domain_is_its_best_measured_speedup():
    runs = [run("e (eagle3)", "eagle3", 4, 2.0, 1.4), run("e (eagle3)", "eagle3", 8, 4.0, 1.2),
            run("d (dspark)", "dspark", 8, 5.0, 1.9), run("d (dspark)", "dspark", 8, 5.0, 1.1, domain="prose"),
            run("e (eagle3)", "eagle3", 4, 2.0, 1.3, domain="prose"), run("target alone", "target", 0, 0.0, 1.0)]
    best = {w["domain"]: w for w in winners(runs)}
    assert (best["code"]["drafter"], best["code"]["gamma"], best["code"]["drafting"]) == ("d (dspark)", 8, "parallel")
    assert (best["prose"]["kind"], best["prose"]["speedup"]) == ("eagle3", 1.3)
