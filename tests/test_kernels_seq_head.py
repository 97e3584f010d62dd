"""DSpark's fused sequential-head kernel: the torch reference equals DSparkDrafter.sample_block, inverse-CDF
sampling draws from `probs`, and the Triton kernel (CPU interpreter here, compiled on CUDA in the gpu tests)
equals the reference: tokens exactly, probabilities and confidence to float32 tolerance."""

import pytest
import torch

from pdraft.models.dspark.fused_seq_head import drafter_inputs, inverse_cdf, sequential_head, sequential_head_reference
from pdraft.models.api import SamplingParams
import test_kernels_support
from test_kernels_support import needs_triton

interpret = test_kernels_support.interpret  # TRITON_INTERPRET=1 and Triton forced, a fixture


def tiny_dspark(head="markov", with_markov=True, vocab=97, rank=8):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from pdraft.models import build_drafter

    torch.manual_seed(0)
    target = Qwen3ForCausalLM(Qwen3Config(vocab_size=vocab, hidden_size=32, intermediate_size=64,
                                          num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                          head_dim=16)).eval()
    d = build_drafter("dspark", target.config, seed=0, mask_token_id=vocab - 1, num_hidden_layers=1, block_size=6,
                      sequential_head=head, markov_rank=rank, confidence_with_markov=with_markov)
    with torch.no_grad():  # random weights large enough that the Markov bias moves the draws
        d.markov_head.markov_w2.weight.normal_(0, 1.0)
        d.markov_head.markov_w1.weight.normal_(0, 1.0)
        target.lm_head.weight.normal_(0, 0.5)
    d.attach_target(target)
    return d.eval()


PARAMS = [SamplingParams(1.0), SamplingParams(0.7, top_k=9), SamplingParams(1.2, top_p=0.8),
          SamplingParams(0.9, top_k=30, top_p=0.9)]


@torch.no_grad()
def test_reference_equals_sample_block_greedy():
    d = tiny_dspark()
    hidden = torch.randn(3, 6, 32)
    anchors = torch.tensor([1, 50, 96])
    loop = d.sample_block(hidden, anchors, None, None)
    ref = sequential_head_reference(d.lm_head(hidden), anchors, None, None, **drafter_inputs(d, hidden))
    assert torch.equal(ref.tokens, loop.tokens) and ref.probs is None and loop.probs is None
    torch.testing.assert_close(ref.confidence, loop.confidence)


@pytest.mark.parametrize("params", PARAMS)
@torch.no_grad()
def test_reference_equals_sample_block_sampled(params):
    """The eager loop and the reference draw by inverse CDF from the same uniforms, so tokens, distributions
    and confidences must all agree."""
    d = tiny_dspark()
    hidden = torch.randn(4, 6, 32)
    anchors = torch.tensor([3, 7, 60, 90])
    u = torch.rand(4, 6, generator=torch.Generator().manual_seed(1))  # [batch, gamma]
    loop = d.sample_block(hidden, anchors, params, u)
    ref = sequential_head_reference(d.lm_head(hidden), anchors, u, params, **drafter_inputs(d, hidden))
    assert torch.equal(ref.tokens, loop.tokens)
    torch.testing.assert_close(ref.probs, loop.probs)
    torch.testing.assert_close(ref.confidence, loop.confidence)
    # the reference's distributions really are top-k / top-p shaped
    kept = (ref.probs > 0).sum(-1)
    if params.top_k:
        assert int(kept.max()) <= params.top_k
    if params.top_p < 1:
        assert int(kept.min()) >= 1 and bool((kept < 97).all())


def test_inverse_cdf_draws_from_probs():
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(40, generator=g) * 2, 0)
    probs[5] = 0.0
    probs = probs / probs.sum()
    n = 40000
    ids = inverse_cdf(probs.expand(n, 40), torch.rand(n, generator=g))
    freq = torch.bincount(ids, minlength=40).float() / n
    assert int(freq[5]) == 0
    assert 0.5 * float((freq - probs).abs().sum()) < 0.02


def _case(b, gamma, vocab, rank, head=True, conf=True, conf_emb=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(b, gamma, vocab, generator=g) * 2  # [batch, gamma, vocab]
    w1 = torch.randn(vocab, rank, generator=g) if head else None
    w2 = (torch.randn(vocab, rank, generator=g) * 0.5).t() if head else None  # strided, as a Linear's weight.t()
    anchors = torch.randint(0, vocab, (b,), generator=g)
    u = torch.rand(b, gamma, generator=g)
    cb = torch.randn(b, gamma, generator=g) if conf else None
    cw = torch.randn(rank, generator=g) if conf and conf_emb and head else None
    return base, anchors, u, dict(w1=w1, w2=w2, conf_base=cb, conf_w1=cw)


def _check(case, params):
    base, anchors, u, kw = case
    ref = sequential_head_reference(base, anchors, u, params, **kw)
    out = sequential_head(base, anchors, u, params, **kw)
    assert torch.equal(out.tokens, ref.tokens)
    if ref.probs is None:
        assert out.probs is None
    else:
        torch.testing.assert_close(out.probs, ref.probs, rtol=1e-5, atol=1e-6)
    if ref.confidence is None:
        assert out.confidence is None
    else:
        torch.testing.assert_close(out.confidence, ref.confidence, rtol=1e-5, atol=1e-5)
    return ref


@needs_triton
@pytest.mark.parametrize("params", [None] + PARAMS)
def test_kernel_equals_reference_gamma16(interpret, params):
    _check(_case(2, 16, 64, 8), params)


@needs_triton
@pytest.mark.parametrize("vocab,rank,params", [
    (512, 32, SamplingParams(1.0)),
    (300, 12, SamplingParams(0.8, top_k=20)),
    (300, 12, SamplingParams(0.8, top_p=0.7)),
    (700, 16, None),  # two vocabulary tiles
    (700, 16, SamplingParams(1.1, top_k=50, top_p=0.95)),
])
def test_kernel_equals_reference_shapes(interpret, vocab, rank, params):
    ref = _check(_case(3, 4, vocab, rank, seed=vocab), params)
    if params is not None and params.top_k:
        assert int((ref.probs > 0).sum(-1).max()) <= params.top_k


@needs_triton
def test_kernel_without_head_and_greedy_ties(interpret):
    base, anchors, u, kw = _case(2, 3, 80, 4, head=False, conf_emb=False)
    base[:, :, 10] = 50.0
    base[:, :, 70] = 50.0  # tie: torch.argmax takes the first
    ref = _check((base, anchors, u, kw), None)
    assert bool((ref.tokens == 10).all())
    _check((base, anchors, u, kw), SamplingParams(0.5, top_p=0.95))


@needs_triton
@pytest.mark.parametrize("params", [None, SamplingParams(0.8, top_k=12, top_p=0.9)])
def test_drafter_hook_uses_the_kernel(interpret, monkeypatch, params):
    import pdraft.models.dspark.fused_seq_head as sh

    launches = []
    real = sh._launch
    monkeypatch.setattr(sh, "_launch", lambda *a: launches.append(1) or real(*a))
    d = tiny_dspark()
    hidden = torch.randn(2, 6, 32)
    anchors = torch.tensor([4, 40])
    with torch.no_grad():
        d.use_fused_kernel = True
        u = None if params is None else torch.rand(2, 6, generator=torch.Generator().manual_seed(3))
        fused = d.sample_block(hidden, anchors, params, u)
        ref = sequential_head_reference(d.lm_head(hidden), anchors, u, params, **drafter_inputs(d, hidden))
    assert launches == [1]
    assert torch.equal(fused.tokens, ref.tokens)
    torch.testing.assert_close(fused.confidence, ref.confidence, rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_drafter_hook_keeps_the_loop_where_triton_cannot_run():
    d = tiny_dspark()
    hidden = torch.randn(2, 6, 32)
    anchors = torch.tensor([4, 40])
    params = SamplingParams(0.8, top_k=12)
    u = torch.rand(2, 6, generator=torch.Generator().manual_seed(3))
    loop = d.sample_block(hidden, anchors, params, u)
    d.use_fused_kernel = True  # no force_triton and a CPU tensor: the eager loop runs, same draws
    again = d.sample_block(hidden, anchors, params, u)
    assert torch.equal(loop.tokens, again.tokens) and torch.equal(loop.probs, again.probs)


@pytest.mark.gpu
@needs_triton
@pytest.mark.parametrize("params", [None, SamplingParams(1.0), SamplingParams(0.8, top_k=40, top_p=0.9)])
def test_kernel_equals_reference_on_cuda(params):
    base, anchors, u, kw = _case(2, 16, 32000, 64)
    cuda = lambda x: None if x is None else x.cuda()  # noqa: E731
    case = (base.cuda(), anchors.cuda(), u.cuda(), {k: cuda(v) for k, v in kw.items()})
    _check(case, params)
