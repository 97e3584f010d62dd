"""The n-gram prompt-lookup drafter: its lookup rule on hand-made histories, that it rebuilds the committed
history from the engine's anchors alone (greedy output token-identical to the target alone, batched, with EOS and
several gammas), that it really accepts tokens where the text repeats, and that sampled decoding with it keeps
the target's distribution (chi-square on the first two tokens)."""

import pytest
import torch

from doubles import tiny_target
from pdraft.decode.engine import generate
from pdraft.decode.ngram import NgramDrafter
from pdraft.errors import PdraftError
from pdraft.models.api import SamplingParams

from test_decode_sampling import ALPHA, chi_square_p, exact_two_token_joint, joint_counts


@pytest.fixture(scope="module")
def target():
    return tiny_target(64, 32, num_layers=3)


def lookup(history, gamma, **kw):
    cfg = tiny_target(16, 32, num_layers=2).config
    return NgramDrafter(cfg, [history], **kw)._lookup(list(history), gamma)


def test_lookup_copies_what_followed_the_most_recent_match():
    assert lookup([1, 2, 3, 9, 7, 1, 2, 3], 2) == [9, 7]
    # the longest suffix wins: (5, 2, 3) matched at the start beats the later (2, 3)
    assert lookup([5, 2, 3, 4, 2, 3, 8, 5, 2, 3], 1) == [4]
    # among equal suffixes the most recent occurrence wins
    assert lookup([1, 4, 0, 1, 6, 0, 1], 1, max_ngram=1) == [6]
    # a copy that reaches the end continues periodically from its own proposal
    assert lookup([7, 8, 7, 8], 5) == [7, 8, 7, 8, 7]
    # no earlier occurrence of even the last token: the anchor repeated
    assert lookup([1, 2, 3], 3) == [3, 3, 3]
    assert lookup([4], 2) == [4, 4]


def test_bad_sizes_and_batch_mismatch_are_errors(target):
    with pytest.raises(PdraftError, match="n-gram sizes"):
        NgramDrafter(target.config, [[1]], max_ngram=1, min_ngram=2)
    with pytest.raises(PdraftError, match="built for 1 prompts"):
        generate(target, NgramDrafter(target.config, [[1, 2]]), [[1, 2], [3, 4]], gamma=2, max_new_tokens=4)


@pytest.mark.parametrize("gamma", [1, 3, 8])
def test_greedy_output_equals_target_alone(target, gamma):
    prompts = [[5, 6, 7, 5, 6, 7, 5, 6], [1, 2, 3], [9] * 12, [4, 8, 15, 16, 23, 42, 4, 8]]
    eos = [11]
    ref = generate(target, None, prompts, max_new_tokens=40, eos_token_ids=eos)
    out = generate(target, NgramDrafter(target.config, prompts), prompts, gamma=gamma, max_new_tokens=40,
                   eos_token_ids=eos)
    assert out.output_ids == ref.output_ids
    assert out.finish_reasons == ref.finish_reasons
    # the first token of each request is the target's own step (gamma 0), every later round drafts gamma
    assert all(r.gamma == (gamma if r.round > 0 else 0) for r in out.records)


def bigram_target(vocab=64, seed=0):
    """A target whose next token depends on the current token only (attention and MLP outputs zeroed, LM head
    untied): greedy decoding follows x -> g(x), so its output soon cycles, and a prompt made of the target's
    own continuation repeats exactly what it will generate."""
    model = tiny_target(vocab, 32, num_layers=2, seed=seed)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.lm_head.weight = torch.nn.Parameter(torch.randn(vocab, 32, generator=torch.Generator().manual_seed(seed)))
    return model


def test_accepts_tokens_on_repetitive_text():
    target = bigram_target()
    path = generate(target, None, [[3]], max_new_tokens=40).output_ids[0]
    prompt = [[3] + path]  # the target's own continuation: every later token already appears after its predecessor
    out = generate(target, NgramDrafter(target.config, prompt), prompt, gamma=4, max_new_tokens=32)
    assert out.output_ids == generate(target, None, prompt, max_new_tokens=32).output_ids
    s = out.summary()
    # 1 token from the target's first step, then 7 rounds of 4 accepted drafts + 1 (the last one cut at 32)
    assert s.token_acceptance == 1.0 and s.tau == 31 / s.rounds and s.rounds == 7, s
    # the same target on a prompt that never shows its transitions: far fewer drafts survive
    other = [[t for t in range(64) if t not in path][:8]]
    cold = generate(target, NgramDrafter(target.config, other), other, gamma=4, max_new_tokens=32).summary()
    assert cold.token_acceptance < s.token_acceptance and cold.rounds > s.rounds


def test_sampling_keeps_the_target_distribution():
    target = tiny_target(16, 32, num_layers=2)
    prompt, n = [3, 1, 4, 1, 5, 3, 1, 4, 1, 5, 3, 1], 4000
    sampling = SamplingParams(temperature=1.0)
    prompts = [prompt] * n
    out = generate(target, NgramDrafter(target.config, prompts), prompts, gamma=3, sampling=sampling,
                   max_new_tokens=3, seed=5)
    assert out.summary().token_acceptance > 0  # drafts were proposed and some accepted
    y = torch.tensor([o[:2] for o in out.output_ids])
    assert chi_square_p(joint_counts(y[:, 0], y[:, 1], 16), exact_two_token_joint(target, prompt, sampling)) > ALPHA
