"""Lossless decoding with a DFlash2 drafter through the engine (pdraft.decode.engine.generate): greedy output
token-identical to the target alone for several gammas and batch sizes; sampled output following the target's
exact joint distribution of the first two tokens (chi-square, several batches per run, with and without the
request's top-k / top-p, which shape the target side only: the selector's walk samples from its own softmax
and hands the engine that exact q); and a negative control: the same drafter claiming the per-position unary
softmax as its q (what a DFlash head would report, not what the walk sampled from) is caught as biased."""

import types

import pytest
import torch

from doubles import tiny_target, widen as widen_weights
from pdraft.decode.engine import generate
from pdraft.metrics import summarize
from pdraft.models.api import Proposal, SamplingParams
from pdraft.models.build import build_drafter
from pdraft.models.sampling import probs_from_logits
from pdraft.streams import request_seeds
from test_decode_sampling import ALPHA, chi_square_p, exact_two_token_joint, joint_counts

PROMPTS = [[3, 5, 7], [1], [9, 8, 7, 6, 5, 4, 3, 2, 1, 10, 11, 12, 13], [2, 4]]


def make(target, vocab, *, widen: float | None = None, **extra):
    fields = dict(mask_token_id=vocab - 1, num_hidden_layers=1, block_size=8, conv_group_size=8, selector_rank=8,
                  selector_top_k=4)
    fields.update(extra)
    drafter = build_drafter("dflash2", target.config, seed=0, **fields)
    if widen is not None:  # convs and selector included: drafts then depend on their predecessor
        widen_weights(drafter, widen)
    drafter.attach_target(target)
    return drafter.eval()


@pytest.fixture(scope="module")
def target():
    return tiny_target(64, 32, num_layers=4)


@pytest.fixture(scope="module")
def small_target():
    return tiny_target(vocab_size=16, hidden_size=32, num_layers=2)


@pytest.mark.parametrize("widen", [None, 0.3])
def test_greedy_matches_target_for_every_gamma_and_batch_size(target, widen):
    drafter = make(target, 64, widen=widen)
    for prompts in (PROMPTS, PROMPTS[:1], PROMPTS[1:3]):
        refs = generate(target, None, prompts, max_new_tokens=16).output_ids
        for gamma in (1, 2, 5, drafter.max_gamma()):
            out = generate(target, drafter, prompts, gamma=gamma, max_new_tokens=16)
            assert out.output_ids == refs, (len(prompts), gamma, widen)


def sample_first_two(small_target, drafter, sampling, n=4000, batch=1000, gamma=3):
    prompt = [3, 1, 4, 1, 5]
    outputs, records = [], []
    for start in range(0, n, batch):  # several batches of one run: each request has its own stream
        out = generate(small_target, drafter, [prompt] * batch, gamma=gamma, sampling=sampling, max_new_tokens=4,
                       seeds=request_seeds(5, start, batch))
        outputs += out.output_ids
        records += out.records
    assert sum(a == b for a, b in zip(outputs[:batch], outputs[batch:])) < batch // 2  # not a replayed batch
    y = torch.tensor([o[:2] for o in outputs])
    return y, summarize(records), exact_two_token_joint(small_target, prompt, sampling)


@pytest.mark.parametrize("sampling", [SamplingParams(temperature=1.0), SamplingParams(0.8, top_k=6, top_p=0.9)],
                         ids=["t1", "t0.8-k6-p0.9"])
def test_sampling_matches_the_target_joint(small_target, sampling):
    drafter = make(small_target, 16, widen=0.3, block_size=4)
    y, summary, exact = sample_first_two(small_target, drafter, sampling)
    assert 0 < summary.token_acceptance < 1  # drafts were both accepted and rejected
    assert chi_square_p(joint_counts(y[:, 0], y[:, 1], 16), exact) > ALPHA


def test_wrong_q_is_caught(small_target):
    """Negative control: the walk's tokens, but the per-position unary softmax as the claimed q."""
    drafter = make(small_target, 16, widen=0.3, block_size=4)
    walk = drafter.sample_block

    def unary_q(self, hidden, anchor_ids, sampling, uniforms):
        p = walk(hidden, anchor_ids, sampling, uniforms)
        wrong = probs_from_logits(self.lm_head(hidden), SamplingParams(sampling.temperature))  # [b, gamma, V]
        return Proposal(tokens=p.tokens, probs=wrong, confidence=None)

    drafter.sample_block = types.MethodType(unary_q, drafter)
    sampling = SamplingParams(temperature=1.0)
    y, _, exact = sample_first_two(small_target, drafter, sampling)
    assert chi_square_p(joint_counts(y[:, 0], y[:, 1], 16), exact) < ALPHA


def test_engine_verifies_against_the_exact_q_the_walk_returns(small_target):
    """The proposal's probs are the walk's own law: q[l] sums to one over the K candidates of position l and
    the drafted token is one of them (the engine passes them to the rejection rule unchanged)."""
    drafter = make(small_target, 16, widen=0.3, block_size=4)
    from pdraft.models.build import draft_step
    from test_models_support import captured

    ids = torch.tensor([[3, 1, 4, 1, 5, 9]])
    hidden = captured(small_target, ids, drafter.config.target_layer_ids)
    p = draft_step(drafter, hidden[:, :5], ids[:, 5], 3, SamplingParams(1.0, top_k=2), torch.rand(1, 3))
    assert torch.allclose(p.probs.sum(-1), torch.ones(1, 3))
    assert ((p.probs > 0).sum(-1) <= 4).all()  # K candidates, whatever the request's top_k
    assert (p.probs.gather(-1, p.tokens[..., None]) > 0).all()
