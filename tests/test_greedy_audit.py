"""Greedy identity on the bf16 path, against the target alone on the same path: where a verify pass of many tokens
and a one-token step round apart at a near-tie, pdraft.decode.greedy_audit calls the difference rounding (both
choices within the float64 target's reach of the run's own logit error); a broken verifier's output, and a token
swapped for one the target does not choose, are called a loss, in bf16 and in float32 (the negative controls). The
bench's notes fail the check on a loss or an unaudited difference and not on rounding."""

import pytest
import torch

import pdraft.decode.engine as engine
from doubles import DoubleConfig, OracleDrafter, RandomDrafter, tiny_target
from pdraft.bench.report import greedy_notes
from pdraft.decode.acceptance import Acceptance
from pdraft.decode.engine import generate
from pdraft.decode.greedy_audit import GreedyAuditor, first_divergences, verdict

VOCAB, HIDDEN, NEW = 256, 64, 40
PROMPTS = [[3, 5, 7], [1], [9, 8, 7, 6, 5, 4, 3, 2, 1, 10, 11, 12, 13], [2, 4], [60, 61, 62, 63, 0, 1, 2],
           [17, 18], [200, 100, 50, 25]]
LAYERS = [0, 1]


@pytest.fixture(scope="module")
def bf16_target():
    # init_std 0.05: logits close together, so near-ties (and bf16 flips) are common, not rare
    return tiny_target(VOCAB, HIDDEN, num_layers=3, init_std=0.05).to(torch.bfloat16)


@pytest.fixture(scope="module")
def fp32_target():
    return tiny_target(VOCAB, HIDDEN, num_layers=3)


def drafters(alone, seed):
    config = DoubleConfig(VOCAB, HIDDEN, LAYERS, block_size=16)
    return [RandomDrafter(config, seed=seed),
            OracleDrafter(config, [p + r for p, r in zip(PROMPTS, alone)], miss_rate=0.25, seed=seed)]


def test_first_divergences():
    assert first_divergences([[1, 2, 3], [4, 5], [6]], [[1, 2, 3], [4, 9], [6, 7]]) == [(1, 1), (2, 1)]


@pytest.mark.parametrize("gamma", [1, 4, 8, 16])
def test_bf16_speculative_output_is_the_target_alones_up_to_rounding(bf16_target, gamma):
    alone = generate(bf16_target, None, PROMPTS, max_new_tokens=NEW).output_ids
    auditor = GreedyAuditor(bf16_target)
    for drafter in drafters(alone, gamma):
        out = generate(bf16_target, drafter, PROMPTS, gamma=gamma, max_new_tokens=NEW).output_ids
        found = auditor.audit(PROMPTS, out, alone)
        assert verdict(found) in ("identical", "rounding"), [d for d in found if not d.rounding]


def broken_accept(target_logits, drafts, draft_probs, lengths, sampling, uniforms=None):
    """A verifier that keeps every draft: what greedy decoding looks like when acceptance is broken."""
    best = target_logits.argmax(-1)  # [batch, L+1]
    lengths = lengths.to(best.device)
    return Acceptance(lengths, best[torch.arange(best.shape[0], device=best.device), lengths])


@pytest.mark.parametrize("which", ["bf16", "fp32"])
def test_a_broken_verifier_is_a_loss_not_rounding(bf16_target, fp32_target, which, monkeypatch):
    target = bf16_target if which == "bf16" else fp32_target
    alone = generate(target, None, PROMPTS, max_new_tokens=NEW).output_ids
    monkeypatch.setattr(engine, "accept", broken_accept)
    config = DoubleConfig(VOCAB, HIDDEN, LAYERS, block_size=16)
    out = generate(target, RandomDrafter(config, seed=3), PROMPTS, gamma=4, max_new_tokens=NEW).output_ids
    found = GreedyAuditor(target).audit(PROMPTS, out, alone)
    assert verdict(found) == "loss"
    assert sum(not d.rounding for d in found) >= len(PROMPTS) - 1  # random drafts: nearly every request lost


@pytest.mark.parametrize("which", ["bf16", "fp32"])
def test_a_swapped_token_is_a_loss(bf16_target, fp32_target, which):
    target = bf16_target if which == "bf16" else fp32_target
    alone = generate(target, None, PROMPTS, max_new_tokens=NEW).output_ids
    prefix = torch.tensor([PROMPTS[0] + alone[0][:5]])
    with torch.no_grad():
        worst = int(target(input_ids=prefix).logits[0, -1].argmin())
    swapped = [list(o) for o in alone]
    swapped[0] = alone[0][:5] + [worst]
    found = GreedyAuditor(target).audit(PROMPTS, swapped, alone)
    assert [(d.request, d.position, d.ours, d.rounding) for d in found] == [(0, 5, worst, False)]
    assert found[0].ours_gap > 10 * found[0].rounding_error
    assert verdict(GreedyAuditor(target).audit(PROMPTS, alone, alone)) == "identical"


def test_bench_notes_fail_on_loss_and_unaudited_not_on_rounding():
    tie = {"request": 0, "position": 3, "ours": 1, "reference": 2, "ours_gap": 0.0, "reference_gap": 0.01,
           "rounding_error": 0.04, "rounding": True, "why": ""}
    lost = dict(tie, ours_gap=3.0, rounding=False)
    base = [{"drafter": "target alone", "gamma": 0}, {"drafter": "d", "gamma": 4, "same_as_target": True}]
    rounding = " ".join(greedy_notes(base + [{"drafter": "e", "gamma": 8, "same_as_target": False,
                                              "divergences": [tie]}]))
    assert "LOSSLESS CHECK FAILED" not in rounding and "e γ8: outputs differ" in rounding and "near-ties" in rounding
    for row in ({"drafter": "e", "gamma": 8, "same_as_target": False, "divergences": [tie, lost]},
                {"drafter": "e", "gamma": 8, "same_as_target": False}):
        notes = " ".join(greedy_notes(base + [row]))
        assert "LOSSLESS CHECK FAILED" in notes and "e γ8" in notes and "d γ4" not in notes


def test_a_swap_at_a_real_near_tie_is_rounding(bf16_target):
    """The positive case on a real model: at a position of the target-alone output where the float64 target's
    top two logits are closer than the bf16 run's own logit error, the runner-up is what another kernel shape could
    have chosen; swapping it in is rounding, not a loss."""
    alone = generate(bf16_target, None, PROMPTS, max_new_tokens=NEW).output_ids
    auditor = GreedyAuditor(bf16_target)
    exact = auditor._reference_model()
    ties = []
    with torch.no_grad():
        for i, (prompt, out) in enumerate(zip(PROMPTS, alone)):
            ids = torch.tensor([prompt + out])
            logits = exact(input_ids=ids).logits[0, len(prompt) - 1:-1]  # [NEW, vocab]
            error = (bf16_target(input_ids=ids).logits[0, len(prompt) - 1:-1].double() - logits).abs().amax(-1)
            top2 = logits.topk(2, dim=-1)
            gaps = top2.values[:, 0] - top2.values[:, 1]
            ties += [(i, p, int(top2.indices[p, 1])) for p in range(len(out)) if gaps[p] < error[p]
                     and int(top2.indices[p, 0]) == out[p]]
    assert ties, "no near-tie in this fixture: the test needs one"
    i, p, runner_up = ties[0]
    swapped = [list(o) for o in alone]
    swapped[i] = alone[i][:p] + [runner_up]
    found = auditor.audit(PROMPTS, swapped, alone)
    assert [(d.request, d.position, d.rounding) for d in found] == [(i, p, True)], found
