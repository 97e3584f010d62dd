"""Continuous batching (pdraft.decode.engine.generate with `concurrency`): a queue of requests feeds C slots
of the decode loop; a request that finishes leaves its slot to the next, whose prompt is prefilled into that
row (target KV row, drafter context row, EAGLE-3's own KV row, the book's row, the request's stream) while
the other rows keep decoding. Greedy output at C in {1, 3} over more requests than slots equals target-only
decoding for DFlash, DSpark, DFlash2 and EAGLE-3; under sampling with full verification a request's output is
the same at C = 1, C = 3 and in one static batch (it depends on its own stream only); slots really are
reused; the target alone runs through the same loop; the reference path refuses in one line."""

import pytest
import torch

from doubles import tiny_target
from pdraft.decode.engine import generate
from pdraft.errors import PdraftError
from pdraft.models.api import SamplingParams
from pdraft.models.build import build_drafter

PROMPTS = [[3, 5, 7], [1], [9, 8, 7, 6, 5, 4, 3, 2, 1, 10, 11, 12, 13], [2, 4], [6, 6, 6], [1, 2, 3, 4, 5],
           [7], [4, 4, 2, 9]]
VOCAB = 16
KINDS = ["dflash", "dspark", "dflash2", "eagle3"]


@pytest.fixture(scope="module")
def target():
    return tiny_target(VOCAB, 32, num_layers=4)


def make(kind, target):
    if kind == "eagle3":
        drafter = build_drafter("eagle3", target.config, seed=0, ttt_steps=4)
    else:
        extra = {"markov_rank": 8} if kind == "dspark" else {}
        drafter = build_drafter(kind, target.config, seed=0, mask_token_id=VOCAB - 1, num_hidden_layers=1,
                                block_size=8, **extra)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # wider weights than the init, so that drafts are sometimes accepted
        for p in drafter.parameters():
            if p.dim() > 1 and p.requires_grad:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    drafter.attach_target(target)
    return drafter.eval()


def accepted(result) -> int:
    return sum(r.accepted for r in result.records)


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_equals_target_alone_at_every_concurrency(target, kind):
    refs = generate(target, None, PROMPTS, max_new_tokens=14).output_ids
    drafter = make(kind, target)
    total = 0
    for concurrency in (1, 3):
        out = generate(target, drafter, PROMPTS, gamma=4, max_new_tokens=14, concurrency=concurrency)
        assert out.output_ids == refs, (kind, concurrency)
        assert out.finish_reasons == ["length"] * len(PROMPTS)
        total += accepted(out)
    assert total > 0  # drafts were accepted: the identity is not only the target's own tokens


@pytest.mark.parametrize("kind", KINDS)
def test_sampled_output_does_not_depend_on_slot_or_neighbours(target, kind):
    drafter = make(kind, target)
    sampling = SamplingParams(temperature=1.0)
    runs = [generate(target, drafter, PROMPTS, gamma=4, max_new_tokens=14, sampling=sampling, seed=7,
                     concurrency=c) for c in (1, 3, None)]
    assert runs[0].output_ids == runs[1].output_ids == runs[2].output_ids
    assert sum(accepted(r) for r in runs) > 0
    other = generate(target, drafter, PROMPTS, gamma=4, max_new_tokens=14, sampling=sampling, seed=8,
                     concurrency=3)
    assert other.output_ids != runs[1].output_ids  # the seed matters: the equality above is not vacuous


def test_slots_are_reused_and_rounds_overlap(target):
    """8 requests on 3 slots: every request is served, some start while others are mid-decode, and a round
    holds at most 3 requests."""
    drafter = make("dflash", target)
    seen: list[list[int]] = []
    out = generate(target, drafter, PROMPTS, gamma=4, max_new_tokens=14, concurrency=3,
                   on_round=lambda e: seen.append([r.request for r in e.records]))
    assert sorted({r.request for r in out.records}) == list(range(len(PROMPTS)))
    assert max(len(s) for s in seen) == 3
    first_round = {}
    last_round = {}
    for r in out.records:
        first_round.setdefault(r.request, r.round)
        last_round[r.request] = r.round
    late = [q for q in first_round if first_round[q] > 0]
    assert len(late) == len(PROMPTS) - 3 == out.refills  # five requests took a slot someone else left
    # a late request joined while an early one was still decoding (the batch was not drained first)
    assert any(first_round[q] <= last_round[e] for q in late for e in range(3) if e not in late)


def test_uneven_lengths_refill_mid_run(target):
    """Requests with different budgets (EOS-like early ends emulated by a stop token) finish at different
    rounds: each freed slot is refilled at once, and greedy output still equals the target alone."""
    refs = generate(target, None, PROMPTS, max_new_tokens=14, eos_token_ids=[3]).output_ids
    drafter = make("dspark", target)
    out = generate(target, drafter, PROMPTS, gamma=4, max_new_tokens=14, eos_token_ids=[3], concurrency=2)
    assert out.output_ids == refs
    assert [r[-1] == 3 for r in refs] == [f == "eos" for f in out.finish_reasons]


def test_target_alone_through_the_same_loop(target):
    refs = generate(target, None, PROMPTS, max_new_tokens=10).output_ids
    out = generate(target, None, PROMPTS, max_new_tokens=10, concurrency=3)
    assert out.output_ids == refs
    assert all(r.gamma == 0 for r in out.records)
    # the first token of each request comes from its prefill and is left out of the decode rounds with it
    assert sum(r.committed for r in out.records) == 9 * len(PROMPTS)
    assert all(r.prefill_s > 0 for r in out.records if r.round == 0)  # every request was prefilled in round 0
    assert out.summary().prefill_s > 0 and out.summary().decode_s > 0
    assert len({r.round for r in out.records}) > 10  # more rounds than one batch of 8 would take


def test_first_token_stop_frees_the_slot_in_the_same_round(target):
    out = generate(target, None, PROMPTS, max_new_tokens=1, concurrency=2)
    assert [len(o) for o in out.output_ids] == [1] * len(PROMPTS)
    assert {r.round for r in out.records} == {0}  # every request came and went in the first round's refills


def test_reference_path_refuses_in_one_line(target):
    with pytest.raises(PdraftError, match="needs the static decode path"):
        generate(target, None, PROMPTS, max_new_tokens=4, concurrency=2, compile="off")
    with pytest.raises(PdraftError, match="concurrency must be at least 1"):
        generate(target, None, PROMPTS, max_new_tokens=4, concurrency=0)


def test_padded_verifier_refills_too(target):
    """The padded verify grid (the CUDA-graph layout) under continuous batching: same tokens as the target alone."""
    refs = generate(target, None, PROMPTS, max_new_tokens=12).output_ids
    out = generate(target, make("dspark", target), PROMPTS, gamma=4, max_new_tokens=12, concurrency=3,
                   packed_verify=False)
    assert out.output_ids == refs and out.refills == len(PROMPTS) - 3
