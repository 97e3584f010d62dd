"""Lossless decoding with an EAGLE-3 drafter through the engine (pdraft.decode.engine.generate): greedy output
token-identical to the target alone for every gamma 1..16 at batch 1 and 5, with a reduced draft vocabulary and
with the whole one, drafts both accepted and rejected; sampled output following the target's exact joint
distribution of the first two tokens (chi-square, several batches per run, with and without top-k / top-p);
and a negative control: the same chain claiming a q that is not zero outside its draft vocabulary (what a
proposer that forgot the d2t mapping would report) is caught as biased."""

import types

import pytest
import torch

from doubles import tiny_target
from pdraft.decode.engine import generate
from pdraft.metrics import summarize
from pdraft.models.api import SamplingParams
from pdraft.models.build import build_drafter
from pdraft.streams import request_seeds
from pdraft.train.losses import drafter_loss, position_weights
from test_decode_sampling import ALPHA, chi_square_p, exact_two_token_joint, joint_counts
from test_models_support import captured

PROMPTS = [[3, 5, 7], [1], [9, 8, 7, 6, 5, 4, 3, 2, 1, 10, 11, 12, 13], [2, 4], [6, 6, 6, 6]]


def make(target, vocab: int, draft_vocab: int | None, seed: int = 0, steps: int = 150):
    """An EAGLE-3 distilled for `steps` steps of training-time test on the target's own greedy continuations of
    random prompts, through the trainer's loss (KL, 0.8^(k-1) step weights), so that its drafts are often right."""
    drafter = build_drafter("eagle3", target.config, seed=seed, draft_vocab_size=draft_vocab, ttt_steps=4)
    drafter.attach_target(target)
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(0, vocab, (32, 4), generator=g)
    with torch.no_grad():
        seqs = target.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=28, do_sample=False,
                               pad_token_id=-1)  # [32, 32]
        feats = captured(target, seqs, drafter.config.target_layer_ids)
        last = target.model(seqs).last_hidden_state  # [32, 32, hidden]
    drafter.init_from_tokens(torch.bincount(seqs[:, 4:].flatten(), minlength=vocab))
    opt = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=3e-3)
    w_lm = target.get_output_embeddings().weight
    for step in range(steps):
        rows = torch.randint(0, 32, (8,), generator=g)
        anchors = torch.randint(4, 26, (8, 6), generator=g).sort(1).values
        out = drafter.forward_train(seqs[rows], feats[rows], anchors, compute_logits=False)
        t_idx = anchors[:, :, None] + torch.arange(4)  # the target's distribution for draft k is at a + k - 1
        t_hidden = last[rows][torch.arange(8)[:, None, None], t_idx]  # [8, N, K, hidden]
        k = torch.arange(4).expand(8, 6, 4)
        res = drafter_loss(out.hidden.flatten(0, 2), w_lm, t_hidden.flatten(0, 2), out.target_ids.flatten(),
                           position_weights(k, 4.48).flatten(), head=out.head, vocab=out.vocab, alpha_kl=1.0)
        opt.zero_grad()
        res.loss.backward()
        opt.step()
    return drafter.eval()


@pytest.fixture(scope="module")
def small_target():
    return tiny_target(vocab_size=16, hidden_size=32, num_layers=4)


@pytest.mark.parametrize("draft_vocab", [12, None], ids=["12-of-16", "whole"])
def test_greedy_matches_target_for_gamma_1_to_16_at_batch_1_and_5(small_target, draft_vocab):
    drafter = make(small_target, 16, draft_vocab)
    records = []
    for prompts in (PROMPTS[2:3], PROMPTS):
        refs = generate(small_target, None, prompts, max_new_tokens=20).output_ids
        for gamma in range(1, 17):
            out = generate(small_target, drafter, prompts, gamma=gamma, max_new_tokens=20)
            assert out.output_ids == refs, (len(prompts), gamma)
            records += out.records
    first = summarize(records).conditional_acceptance[0]
    assert 0.1 < first < 0.9, first  # first drafts were both accepted and rejected


def sample_first_two(target, drafter, sampling, n=4000, batch=1000, gamma=3):
    prompt = [3, 1, 4, 1, 5]
    outputs, records = [], []
    for start in range(0, n, batch):  # several batches of one run: each request has its own stream
        out = generate(target, drafter, [prompt] * batch, gamma=gamma, sampling=sampling, max_new_tokens=4,
                       seeds=request_seeds(7, start, batch))
        outputs += out.output_ids
        records += out.records
    assert sum(a == b for a, b in zip(outputs[:batch], outputs[batch:])) < batch // 2  # not a replayed batch
    y = torch.tensor([o[:2] for o in outputs])
    return y, summarize(records), exact_two_token_joint(target, prompt, sampling)


@pytest.mark.parametrize("sampling", [SamplingParams(temperature=1.0), SamplingParams(0.8, top_k=6, top_p=0.9)],
                         ids=["t1", "t0.8-k6-p0.9"])
def test_sampling_matches_the_target_joint(small_target, sampling):
    drafter = make(small_target, 16, 12)
    y, summary, exact = sample_first_two(small_target, drafter, sampling)
    assert 0 < summary.token_acceptance < 1  # drafts were both accepted and rejected
    assert chi_square_p(joint_counts(y[:, 0], y[:, 1], 16), exact) > ALPHA


def test_a_q_that_is_not_zero_outside_the_draft_vocabulary_is_caught(small_target):
    """Negative control: the chain's own tokens, but a q that keeps mass on tokens it can never draft (half of
    it spread over the whole target vocabulary)."""
    drafter = make(small_target, 16, 12)
    draw = drafter._draw

    def leaky(self, hidden, sampling, uniforms):
        token, q, top = draw(hidden, sampling, uniforms)
        return token, None if q is None else 0.5 * q + 0.5 / q.shape[-1], top

    drafter._draw = types.MethodType(leaky, drafter)
    y, _, exact = sample_first_two(small_target, drafter, SamplingParams(temperature=1.0))
    assert chi_square_p(joint_counts(y[:, 0], y[:, 1], 16), exact) < ALPHA
