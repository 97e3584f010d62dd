"""Tree verification through the engine (DecodeSettings.tree; pdraft.decode.tree_round) for DFlash, DSpark and
DFlash2 on tiny random drafters: greedy output token-identical to the target alone for gamma 2..16 at batch 1
and 5, on the static path and on the reference path, for chains of width 1 and wider trees; sampled output
following the target's exact joint of tokens 2 and 3 (the first drafting round's depth 1 and 2) (chi-square, several batches per run); a negative
control, the acceptance testing without-replacement siblings against q itself, caught by the same test; the
static cache after a tree round equals the cache of a chain that drafted the kept path; refusals in one line."""

import functools

import pytest
import torch

from doubles import tiny_target, widen as widen_weights
from pdraft.decode import tree_round
from pdraft.decode.engine import generate
from pdraft.decode.settings import DecodeSettings
from pdraft.decode.tree_accept import accept_tree
from pdraft.errors import PdraftError
from pdraft.metrics import summarize
from pdraft.models.api import SamplingParams
from pdraft.models.build import build_drafter
from pdraft.models.sampling import probs_from_logits
from pdraft.streams import request_seeds
from test_decode_sampling import ALPHA, chi_square_p, joint_counts

PROMPTS = [[3, 5, 7], [1], [9, 8, 7, 6, 5, 4, 3, 2, 1, 10, 11, 12, 13], [2, 4], [6, 6, 6, 6]]
FAMILIES = {
    "dflash": {},
    "dspark": dict(confidence_head=True),
    "dflash2": dict(conv_group_size=8, selector_rank=8, selector_top_k=4),
}


def make(target, kind, vocab, block_size=17, widen=0.3):
    drafter = build_drafter(kind, target.config, seed=0, mask_token_id=vocab - 1, num_hidden_layers=1,
                            block_size=block_size, **FAMILIES[kind])
    widen_weights(drafter, widen)
    drafter.attach_target(target)
    return drafter.eval()


@pytest.fixture(scope="module")
def target():
    return tiny_target(64, 32, num_layers=3)


@pytest.fixture(scope="module")
def small_target():
    return tiny_target(vocab_size=16, hidden_size=32, num_layers=2)


@pytest.mark.parametrize("compile", ["auto", "off"], ids=["static", "reference"])
@pytest.mark.parametrize("kind", list(FAMILIES))
def test_greedy_tree_matches_the_target(target, kind, compile):
    drafter = make(target, kind, 64)
    for prompts in (PROMPTS, PROMPTS[2:3]):
        refs = generate(target, None, prompts, max_new_tokens=18, compile=compile).output_ids
        for gamma, tree in ((2, (2, 1)), (2, (6, 3)), (5, (16, 4)), (16, (32, 4)), (16, (16, 1))):
            out = generate(target, drafter, prompts, gamma=gamma, max_new_tokens=18, compile=compile, tree=tree)
            assert out.output_ids == refs, (kind, compile, len(prompts), gamma, tree)
            shapes = [r.tree for r in out.records if r.gamma]
            assert shapes and all(len(s) == gamma and sum(s) <= tree[0] for s in shapes)
            if tree[1] == 1:
                assert all(set(s) <= {0, 1} for s in shapes)


def test_the_tree_accepts_more_than_its_chain(target):
    """Same drafter, same gamma: a 4-wide tree keeps at least the chain's accepted length on these prompts."""
    drafter = make(target, "dflash", 64)
    chain = summarize(generate(target, drafter, PROMPTS, gamma=6, max_new_tokens=24).records)
    tree = summarize(generate(target, drafter, PROMPTS, gamma=6, max_new_tokens=24, tree=(24, 4)).records)
    assert tree.tau > chain.tau


def test_static_cache_after_a_tree_round_is_the_chain_cache(target):
    """After decoding, every committed position of the static cache holds what the target alone computes there:
    the kept path's keys and values were moved to their positions (a stale tree slot would differ)."""
    from pdraft.decode import backend as backends

    drafter = make(target, "dspark", 64)
    prompts = PROMPTS[:3]
    out = generate(target, drafter, prompts, gamma=6, max_new_tokens=14, tree=(20, 4))
    assert sum(r.accepted for r in out.records) > 0
    (cache,) = [lean._caches[len(prompts)] for lean, _ in backends._entries(target).values()
                if len(prompts) in lean._caches]
    for b, (p, o) in enumerate(zip(prompts, out.output_ids)):
        seq = torch.tensor([p + o[:-1]])  # the last token never entered the cache
        with torch.no_grad():
            kv = target(seq, use_cache=True).past_key_values
        n = seq.shape[1]
        for layer in range(len(kv.layers)):
            assert torch.allclose(cache.keys[layer, b, :, :n], kv.layers[layer].keys[0], atol=1e-4), (b, layer)


def exact_joint_of_tokens_2_and_3(model, prompt, sampling):
    """P(y2, y3) = sum_a p(y1 = a) p(y2 | a) p(y3 | a, y2) by enumeration: [V, V]."""
    with torch.no_grad():
        p1 = probs_from_logits(model(torch.tensor([prompt])).logits[0, -1], sampling)  # [V]
        v = p1.numel()
        ones = torch.tensor([prompt + [a] for a in range(v)])
        p2 = probs_from_logits(model(ones).logits[:, -1], sampling)  # [V (a), V (y2)]
        twos = torch.tensor([prompt + [a, b] for a in range(v) for b in range(v)])
        p3 = probs_from_logits(model(twos).logits[:, -1], sampling).view(v, v, v)  # [a, y2, y3]
    return (p1[:, None, None] * p2[:, :, None] * p3).sum(0)


def sample_tokens_2_and_3(small_target, drafter, sampling, tree, n=4000, batch=1000, gamma=3):
    """Token 1 comes from the target alone (a request's first step); with 4 new tokens the next round may keep
    a path of depth 2, so tokens 2 and 3 are the first drafting round's: its depth-1 and depth-2 choices."""
    prompt = [3, 1, 4, 1, 5]
    outputs, records = [], []
    for start in range(0, n, batch):  # several batches of one run: each request has its own stream
        out = generate(small_target, drafter, [prompt] * batch, gamma=gamma, sampling=sampling, max_new_tokens=4,
                       seeds=request_seeds(5, start, batch), tree=tree)
        outputs += out.output_ids
        records += out.records
    assert sum(a == b for a, b in zip(outputs[:batch], outputs[batch:])) < batch // 2  # not a replayed batch
    y = torch.tensor([o[1:3] for o in outputs])
    return y, records, exact_joint_of_tokens_2_and_3(small_target, prompt, sampling)


@pytest.mark.parametrize("kind", list(FAMILIES))
def test_sampled_tree_follows_the_target_joint(small_target, kind):
    drafter = make(small_target, kind, 16, block_size=5)
    sampling = SamplingParams(temperature=1.0) if kind != "dspark" else SamplingParams(0.8, top_k=6, top_p=0.9)
    y, records, exact = sample_tokens_2_and_3(small_target, drafter, sampling, tree=(8, 3))
    drafted = [r for r in records if r.gamma]
    assert 0 < summarize(records).token_acceptance < 1  # drafts were both accepted and rejected
    assert max(sum(r.tree) for r in drafted) > 3 and max(len(r.tree) - r.tree.count(0) for r in drafted) == 2
    assert max(r.accepted for r in drafted) == 2  # paths of depth 2 were kept
    assert chi_square_p(joint_counts(y[:, 0], y[:, 1], 16), exact) > ALPHA


def test_siblings_tested_as_if_drawn_with_replacement_are_caught(small_target, monkeypatch):
    """Negative control end to end: the same drafts, the acceptance told the parent's q for every sibling."""
    monkeypatch.setattr(tree_round, "accept_tree", functools.partial(accept_tree, without_replacement=False))
    drafter = make(small_target, "dflash", 16, block_size=5)
    sampling = SamplingParams(temperature=1.0)
    y, _, exact = sample_tokens_2_and_3(small_target, drafter, sampling, tree=(8, 3))
    assert chi_square_p(joint_counts(y[:, 0], y[:, 1], 16), exact) < ALPHA


def test_refusals(target):
    eagle_target = tiny_target(64, 32, num_layers=4)
    eagle = build_drafter("eagle3", eagle_target.config, seed=0, ttt_steps=4)
    eagle.attach_target(eagle_target)
    with pytest.raises(PdraftError, match="EAGLE-3 drafts a chain"):
        generate(eagle_target, eagle, PROMPTS[:1], gamma=3, max_new_tokens=4, tree=(8, 2))
    drafter = make(target, "dflash", 64)
    with pytest.raises(PdraftError, match="cannot run with --verify estimator"):
        DecodeSettings(verify="estimator", tree=(8, 2))
    with pytest.raises(PdraftError, match="tree width"):
        generate(target, drafter, PROMPTS[:1], gamma=3, max_new_tokens=4, tree=(4, 5))


def test_continuous_batching_with_a_tree(target):
    """Slots refilled under tree rounds: greedy output still the target's, a sampled request's output the same
    whatever the concurrency (its own stream, its own tree)."""
    drafter = make(target, "dspark", 64)
    refs = generate(target, None, PROMPTS, max_new_tokens=16).output_ids
    assert generate(target, drafter, PROMPTS, gamma=6, max_new_tokens=16, tree=(16, 4), concurrency=2).output_ids == refs
    sampling = SamplingParams(temperature=1.0)
    outs = [generate(target, drafter, PROMPTS, gamma=6, max_new_tokens=16, tree=(16, 4), sampling=sampling, seed=3,
                     concurrency=c).output_ids for c in (None, 2)]
    assert outs[0] == outs[1]
