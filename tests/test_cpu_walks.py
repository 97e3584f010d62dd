"""The compiled CPU walks (pdraft.kernels.cpu_walks) against the torch walks they stand in for: DSpark's Markov
walk (tokens and logits, with and without a draft vocabulary) and DFlash2's selector walk (the picked
candidates), at a batch of two; and the fallback when there is no compiler or PDRAFT_CPU_KERNELS=0."""

import pytest
import torch

from pdraft.kernels import cc, cpu_walks
from pdraft.models.dflash2.selector import CandidateSelector, greedy_walk

needs_cc = pytest.mark.skipif(cpu_walks.kernels() is None, reason=cpu_walks.status())


def torch_markov_walk(base, anchors, w1, w2t, d2t):
    prev, tokens, logits = anchors.long(), [], []
    for k in range(base.shape[1]):
        step = base[:, k] + w1[prev] @ w2t
        tok = step.argmax(-1)
        tokens.append(tok)
        logits.append(step)
        prev = tok if d2t is None else tok + d2t[tok]
    return torch.stack(tokens, 1), torch.stack(logits, 1)


@needs_cc
@pytest.mark.parametrize("reduced", [False, True])
def test_markov_walk_is_the_torch_walk(reduced):
    g = torch.Generator().manual_seed(1)
    vocab_t, vocab_d, rank = 1300, 1200 if reduced else 1300, 19  # tiles of 512 and a ragged last one; r % 8 != 0
    base = torch.randn(2, 9, vocab_d, generator=g)
    w1, w2t = torch.randn(vocab_t, rank, generator=g), 3 * torch.randn(rank, vocab_d, generator=g)
    d2t = torch.randint(0, vocab_t - vocab_d + 1, (vocab_d,), generator=g) if reduced else None
    anchors = torch.tensor([5, 77])
    tokens, logits, conf = cpu_walks.kernels().markov_walk(base, anchors, w1, w2t, d2t)
    assert conf is None
    want_tokens, want_logits = torch_markov_walk(base, anchors, w1, w2t, d2t)
    assert torch.equal(tokens, want_tokens)
    torch.testing.assert_close(logits, want_logits, rtol=1e-5, atol=1e-4)
    assert not torch.equal(tokens, base.argmax(-1))  # the head moved the walk: the test sees the previous token
    half = base.bfloat16()  # a bfloat16 head's logits, widened as the loop reads them
    tokens, logits, _ = cpu_walks.kernels().markov_walk(half, anchors, w1, w2t, d2t)
    want_tokens, want_logits = torch_markov_walk(half.float(), anchors, w1, w2t, d2t)
    assert torch.equal(tokens, want_tokens) and logits.dtype == torch.float32
    torch.testing.assert_close(logits, want_logits, rtol=1e-5, atol=1e-4)


@needs_cc
@pytest.mark.parametrize("with_markov", [False, True])
def test_markov_walk_confidence(with_markov):
    g = torch.Generator().manual_seed(3)
    base, w1, w2t = torch.randn(2, 5, 40, generator=g), torch.randn(60, 8, generator=g), torch.randn(8, 40, generator=g)
    hidden, wh, we = torch.randn(2, 5, 12, generator=g), torch.randn(12, generator=g), torch.randn(8, generator=g)
    anchors = torch.tensor([1, 50])
    tokens, _, conf = cpu_walks.kernels().markov_walk(base, anchors, w1, w2t, None,
                                                      (hidden, wh, 0.25, we if with_markov else None))
    prevs = torch.cat([anchors[:, None], tokens[:, :-1]], dim=1)
    want = hidden @ wh + 0.25 + ((w1[prevs] @ we) if with_markov else 0.0)
    torch.testing.assert_close(conf, want, rtol=1e-5, atol=1e-5)


@needs_cc
def test_selector_walk_is_the_lattice_walk():
    torch.manual_seed(2)
    sel = CandidateSelector(24, 50, 8, 5)
    with torch.no_grad():
        sel.successor_codebook.normal_(0, 2.0)
        sel.predecessor_codebook.normal_(0, 2.0)
    hidden = torch.randn(2, 7, 24)
    cand = torch.stack([torch.randperm(50)[:5] for _ in range(14)]).view(2, 7, 5)
    unary = torch.randn(2, 7, 5)
    anchors = torch.tensor([3, 41])
    with torch.no_grad():
        want_tokens, want_idx = greedy_walk(sel.edge_scores(cand, unary, hidden, anchors), cand)
        idx = cpu_walks.kernels().selector_walk(cand, unary, sel.projected(hidden), *sel.float_books(), anchors)
    assert torch.equal(idx, want_idx)
    assert not torch.equal(idx, unary.argmax(-1))  # the pair scores moved the walk


def test_off_switch_and_missing_compiler(monkeypatch):
    monkeypatch.setenv(cpu_walks.ENV, "0")
    assert cpu_walks.kernels() is None and "PDRAFT_CPU_KERNELS=0" in cpu_walks.status()
    monkeypatch.delenv(cpu_walks.ENV)
    monkeypatch.setattr(cc.shutil, "which", lambda name: None)
    cc._compiler.cache_clear(), cc.build.cache_clear(), cpu_walks.load.cache_clear()
    try:
        assert cpu_walks.kernels() is None and "no working C compiler" in cpu_walks.status()
    finally:
        cc._compiler.cache_clear(), cc.build.cache_clear(), cpu_walks.load.cache_clear()


@needs_cc
@pytest.mark.parametrize("kind", ["dspark", "dflash2"])
def test_drafters_draft_the_same_with_and_without_the_compiled_walks(kind, monkeypatch):
    from test_models_support import MASK, captured, tiny_drafter, tiny_target

    target = tiny_target()
    d = tiny_drafter(kind, target, **({"selector_top_k": 4} if kind == "dflash2" else {}))
    if kind == "dflash2":
        with torch.no_grad():
            d.candidate_selector.successor_codebook.normal_(0, 1.0)
    seq = torch.randint(0, MASK, (1, 12), generator=torch.Generator().manual_seed(4))
    hidden = captured(target, seq, d.config.target_layer_ids)
    state = d.new_state(1, 20)
    d.extend_context(state, hidden[:, :8], torch.arange(8)[None])
    with torch.no_grad():
        compiled = d.propose(state, seq[:, 8], torch.tensor([8]), d.max_gamma())
        monkeypatch.setenv(cpu_walks.ENV, "0")
        plain = d.propose(state, seq[:, 8], torch.tensor([8]), d.max_gamma())
    assert torch.equal(compiled.tokens, plain.tokens)
    torch.testing.assert_close(compiled.top_probabilities(), plain.top_probabilities())
    if kind == "dspark":  # the confidence head, h_k part outside the loop and W1[x_{k-1}] part inside
        assert compiled.confidence is not None
        torch.testing.assert_close(compiled.confidence, plain.confidence, rtol=1e-5, atol=1e-5)


@needs_cc
@pytest.mark.parametrize("rank,vocab", [(64, 4096), (19, 1000), (7, 5)])
def test_bfloat16_walk_is_the_torch_walk(rank, vocab):
    """The AVX-512 BF16 walk over bfloat16 weights (vnni_layout: W2 in pairs; an odd rank padded with a zero
    row) gives the torch walk's tokens and logits, ragged tiles and the confidence logit included."""
    walks = cpu_walks.kernels()
    if not walks.vnni:
        pytest.skip("no AVX-512 BF16 on this CPU")
    g = torch.Generator().manual_seed(rank)
    w1 = torch.randn(vocab, rank, generator=g).bfloat16().float()  # bfloat16 values, as a bf16 drafter's
    w2t = torch.randn(rank, vocab, generator=g).bfloat16().float()
    base, anchors = torch.randn(2, 6, vocab, generator=g).bfloat16(), torch.tensor([1, vocab - 1])
    hidden, wh, we = torch.randn(2, 6, 12, generator=g), torch.randn(12, generator=g), torch.randn(rank, generator=g)
    v1, v2 = cpu_walks.vnni_layout(w1, w2t)
    assert v1.dtype == v2.dtype == torch.bfloat16 and v2.shape == (-(-vocab // 64), -(-rank // 2), 64, 2)
    tokens, logits, conf = walks.markov_walk(base, anchors, v1, v2, None, (hidden, wh, 0.5, we))
    want_tokens, want_logits = torch_markov_walk(base.float(), anchors, w1, w2t, None)
    assert torch.equal(tokens, want_tokens)
    torch.testing.assert_close(logits, want_logits, rtol=1e-5, atol=1e-4)
    prevs = torch.cat([anchors[:, None], tokens[:, :-1]], dim=1)
    torch.testing.assert_close(conf, hidden @ wh + 0.5 + w1[prevs] @ we, rtol=1e-5, atol=1e-4)
