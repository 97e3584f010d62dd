"""Drafter models on a tiny Qwen3 target: forward and backward of every backbone/head combination, the
incremental context cache against from-scratch computation, denoise steps, both block conventions,
and the sampling helper."""

import pytest
import torch

from pdraft.errors import PdraftError
from pdraft.models import SamplingParams, draft_step, probs_from_logits, sample
import test_models_support
from test_models_support import MASK, VOCAB, captured, tiny_drafter

target = test_models_support.target  # tiny_target(), a module fixture

T1 = SamplingParams(temperature=1.0)


@pytest.fixture(scope="module")
def seq():
    g = torch.Generator().manual_seed(3)
    return torch.randint(0, MASK, (2, 12), generator=g)


@pytest.mark.parametrize("kind,kw", [
    ("dflash", {}),
    ("dflash", {"num_experts": 4, "num_experts_per_tok": 2, "block_convention": "zlab"}),
    ("dspark", {"sequential_head": "markov", "confidence_with_markov": True}),
    ("dspark", {"sequential_head": "rnn", "confidence_with_markov": False, "num_experts": 3,
                "num_experts_per_tok": 1}),
    ("dspark", {"sequential_head": "gated", "confidence_with_markov": True}),
    ("dspark", {"sequential_head": "none", "confidence_with_markov": False}),
])
def test_forward_backward(target, seq, kind, kw):
    d = tiny_drafter(kind, target, **kw)
    hidden = captured(target, seq, d.config.target_layer_ids)
    out = d.forward_train(seq, hidden, torch.tensor([[1, 6], [0, 9]]))
    g = d.max_gamma()
    assert out.logits.shape == (2, 2, g, VOCAB) and out.target_ids.shape == (2, 2, g)
    loss = torch.nn.functional.cross_entropy(out.logits.flatten(0, 2), out.target_ids.flatten(),
                                             reduction="none")[out.label_valid.flatten()].mean()
    if out.confidence_logits is not None:
        assert out.confidence_logits.shape == (2, 2, g)
        loss = loss + torch.nn.functional.binary_cross_entropy_with_logits(
            out.confidence_logits, torch.full_like(out.confidence_logits, 0.5))
    loss.backward()
    trained = {n: p for n, p in d.named_parameters()}
    for name in ("fc.weight", "layers.0.self_attn.q_proj.weight", "layers.1.self_attn.k_norm.weight"):
        assert trained[name].grad is not None and trained[name].grad.abs().sum() > 0, name
    if kw.get("num_experts", 0) > 1:
        assert trained["layers.0.mlp.gate.weight"].grad.abs().sum() > 0
    if kind == "dspark" and kw["sequential_head"] != "none":
        assert trained["markov_head.markov_w1.weight"].grad.abs().sum() > 0
        assert trained["markov_head.markov_w2.weight"].grad.abs().sum() > 0
    if kw.get("sequential_head") == "rnn":
        assert trained["markov_head.joint_proj.weight"].grad.abs().sum() > 0
    if kind == "dspark":
        w = trained["confidence_head.proj.weight"]
        width = 32 + (8 if kw["confidence_with_markov"] else 0)
        assert w.shape == (1, width) and w.grad.abs().sum() > 0
    assert target.model.embed_tokens.weight.grad is None and target.lm_head.weight.grad is None
    assert not any(n.startswith(("embed_tokens", "lm_head")) for n in d.state_dict())


@pytest.mark.parametrize("convention", ["deepspec", "zlab"])
def test_propose_matches_teacher_forced_forward(target, seq, convention):
    """Two independent routes to the same numbers: the cached inference path and the training forward."""
    d = tiny_drafter("dflash", target, block_convention=convention)
    hidden = captured(target, seq, d.config.target_layer_ids)
    a = 7
    out = d.forward_train(seq, hidden, torch.tensor([[a], [a]]))
    p = draft_step(d, hidden[:, :a], seq[:, a], sampling=T1)
    assert p.probs.shape == (2, d.max_gamma(), VOCAB)
    torch.testing.assert_close(p.probs, torch.softmax(out.base_logits[:, 0], -1), rtol=1e-5, atol=1e-6)


def test_max_gamma_per_convention(target):
    assert tiny_drafter("dflash", target, block_size=5).max_gamma() == 5
    assert tiny_drafter("dflash", target, block_size=5, block_convention="zlab").max_gamma() == 4
    d = tiny_drafter("dspark", target)
    state = d.new_state(1)
    for bad in (0, d.max_gamma() + 1):
        with pytest.raises(PdraftError):
            d.propose(state, torch.tensor([1]), torch.tensor([0]), bad)


@pytest.mark.parametrize("kind", ["dflash", "dspark"])
def test_incremental_context_equals_from_scratch(target, seq, kind):
    d = tiny_drafter(kind, target, sequential_head="rnn", confidence_with_markov=False) if kind == "dspark" \
        else tiny_drafter(kind, target)
    hidden = captured(target, seq, d.config.target_layer_ids)
    n = 10
    pos = torch.arange(12).expand(2, 12)
    whole = d.new_state(2)
    d.extend_context(whole, hidden[:, :n], pos[:, :n])
    parts = d.new_state(2)
    for lo, hi in ((0, 3), (3, 4), (4, 10)):
        d.extend_context(parts, hidden[:, lo:hi], pos[:, lo:hi])
    args = (seq[:, n], torch.tensor([n, n]), d.max_gamma(), T1)
    p1 = d.propose(whole, *args, uniforms=torch.rand(2, d.max_gamma(), generator=torch.Generator().manual_seed(5)))
    p2 = d.propose(parts, *args, uniforms=torch.rand(2, d.max_gamma(), generator=torch.Generator().manual_seed(5)))
    torch.testing.assert_close(p2.probs, p1.probs, rtol=1e-5, atol=1e-6)
    assert torch.equal(p1.tokens, p2.tokens)
    if kind == "dspark":
        torch.testing.assert_close(p2.confidence, p1.confidence, rtol=1e-5, atol=1e-6)


def test_padded_batch_equals_single_requests(target, seq):
    d = tiny_drafter("dflash", target)
    hidden = captured(target, seq, d.config.target_layer_ids)
    lens = [8, 5]
    state = d.new_state(2)
    valid = torch.arange(8)[None, :] < torch.tensor(lens)[:, None]
    d.extend_context(state, hidden[:, :8], torch.arange(8).expand(2, 8), valid)
    anchors = torch.stack([seq[b, lens[b]] for b in range(2)])
    p = d.propose(state, anchors, torch.tensor(lens), 3, T1)
    for b in range(2):
        single = draft_step(d, hidden[b : b + 1, : lens[b]], seq[b, lens[b]], gamma=3, sampling=T1)
        torch.testing.assert_close(p.probs[b : b + 1], single.probs, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("convention", ["deepspec", "zlab"])
def test_denoise_steps_are_honoured(target, seq, convention):
    one = tiny_drafter("dflash", target, block_convention=convention, denoise_steps=1)
    three = tiny_drafter("dflash", target, block_convention=convention, denoise_steps=3)
    assert three.config.denoise_steps == 3
    calls = []
    three.layers[0].register_forward_hook(lambda *a: calls.append(1))
    hidden = captured(target, seq, one.config.target_layer_ids)
    p1 = draft_step(one, hidden[:, :8], seq[:, 8], sampling=T1)
    p3 = draft_step(three, hidden[:, :8], seq[:, 8], sampling=T1)
    assert len(calls) == 3  # one backbone pass per denoise step
    assert not torch.allclose(p1.probs[:, 1:], p3.probs[:, 1:])  # later passes saw fed-back tokens
    greedy = draft_step(one, hidden[:, :8], seq[:, 8])
    assert greedy.probs is None and greedy.tokens.shape == (2, one.max_gamma())


def test_dspark_sequential_head_conditions_on_sampled_tokens(target, seq):
    d = tiny_drafter("dspark", target, sequential_head="markov")
    torch.nn.init.normal_(d.markov_head.markov_w2.weight, std=3.0)  # a strong bias makes the effect visible
    hidden = captured(target, seq, d.config.target_layer_ids)
    p = draft_step(d, hidden[:, :8], seq[:, 8], sampling=T1,
                   uniforms=torch.rand(2, d.max_gamma(), generator=torch.Generator().manual_seed(1)))
    out = d.forward_train(seq, hidden, torch.tensor([[8], [8]]))
    # position k's distribution = softmax(U_k + W1[x_{k-1}] W2) with x_{k-1} the token sampled before it
    prev = torch.cat([seq[:, 8:9], p.tokens[:, :-1]], dim=1)
    bias = d.markov_head.markov_w2(d.markov_head.markov_w1(prev))
    torch.testing.assert_close(p.probs, torch.softmax(out.base_logits[:, 0] + bias, -1), rtol=1e-5, atol=1e-6)


def test_greedy_is_argmax_of_head_adjusted_logits(target, seq):
    d = tiny_drafter("dspark", target, sequential_head="rnn")
    hidden = captured(target, seq, d.config.target_layer_ids)
    g = draft_step(d, hidden[:, :8], seq[:, 8])
    # Random init leaves the top two logits of one position only 1.06e-4 apart: at temperature 1e-4 the runner-up
    # is drawn about a third of the time, so the test passed or failed with the global RNG state left by the
    # tests before it. At 1e-6 the runner-up's odds are about e^-106.
    u = torch.rand(seq.shape[0], d.max_gamma(), generator=torch.Generator().manual_seed(0))
    s = draft_step(d, hidden[:, :8], seq[:, 8], sampling=SamplingParams(temperature=1e-6), uniforms=u)
    assert torch.equal(g.tokens, s.tokens)


def test_probs_from_logits_filters():
    logits = torch.log(torch.tensor([[0.1, 0.5, 0.25, 0.15]]))
    assert torch.equal(probs_from_logits(logits, None), torch.tensor([[0.0, 1, 0, 0]]))
    torch.testing.assert_close(probs_from_logits(logits, SamplingParams(1.0, top_k=2)),
                               torch.tensor([[0.0, 2 / 3, 1 / 3, 0]]))
    # top-p 0.6: 0.5 alone falls short, so the next most likely joins, and nothing else
    torch.testing.assert_close(probs_from_logits(logits, SamplingParams(1.0, top_p=0.6)),
                               torch.tensor([[0.0, 2 / 3, 1 / 3, 0]]))
    torch.testing.assert_close(probs_from_logits(logits, SamplingParams(1.0, top_p=0.8)),
                               torch.tensor([[0.0, 0.5, 0.25, 0.15]]) / 0.9)
    torch.testing.assert_close(probs_from_logits(logits, SamplingParams(2.0)),
                               torch.softmax(logits / 2, -1))
    with pytest.raises(PdraftError):
        probs_from_logits(logits, SamplingParams(1.0, top_p=0.0))


def test_sample_follows_distribution():
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4]).expand(20000, 4)
    draws = sample(probs, torch.rand(20000, generator=torch.Generator().manual_seed(0)))
    freq = torch.bincount(draws, minlength=4).float() / draws.numel()
    assert torch.allclose(freq, probs[0], atol=0.015)


def test_start_from_target_copies_the_top_layers_and_final_norm():
    """drafter.init_from_target: drafter layer i starts as target layer L - n + i and the final norm as the
    target's, parameter for parameter; EAGLE-3, whose layer has no counterpart, starts as it was."""
    from doubles import tiny_target
    from pdraft.models.build import build_drafter, start_from_target

    target = tiny_target(64, 32, num_layers=4)
    drafter = build_drafter("dflash", target.config, seed=0, mask_token_id=63, num_hidden_layers=2)
    copied = start_from_target(drafter, target)
    assert "layers.0.mlp.gate_proj.weight" in copied and "norm.weight" in copied
    for i, t in ((0, 2), (1, 3)):
        for name, p in drafter.layers[i].named_parameters():
            assert torch.equal(p, dict(target.model.layers[t].named_parameters())[name]), name
    assert torch.equal(drafter.norm.weight, target.model.norm.weight)
    assert not any(n.startswith("fc.") for n in copied)  # the feature projection has no counterpart
    eagle = build_drafter("eagle3", target.config, seed=0)
    assert start_from_target(eagle, target) == []  # its one layer reads [embedding; hidden]: nothing to take
