"""The compiled bfloat16 loops (pdraft.kernels.cpu_bf16). The one-row product and the AMX product: their rows
equal float32 sums of the same bfloat16 values rounded once to bfloat16 (within one unit in the last place, the
order of the sums being their own), on shapes that are not multiples of their slices, blocks or row groups (1 to
32 rows, the AMX product's one and two A tiles), with and without a bias, NaN kept. RMSNorm: transformers' order
and the fused one, each within one unit of torch's, a row's output independent of the rows beside it. FastLinear
offers them only in bfloat16, only while the compiled loops are on, and hands a prefill's rows to oneDNN."""

import pytest
import torch
import torch.nn.functional as F

from pdraft import gemm
from pdraft.kernels import cc, cpu_bf16

needs_gemv = pytest.mark.skipif(cpu_bf16.kernels() is None, reason=f"no compiled bf16 product: {cpu_bf16.status()}")


needs_amx = pytest.mark.skipif(cpu_bf16.kernels() is None or not cpu_bf16.kernels().amx,
                               reason="no AMX tiles on this CPU (or no compiled loops)")


def _ulps(a: torch.Tensor, b: torch.Tensor) -> int:
    """The largest distance between bfloat16 tensors in units of the last place (same-sign finite values)."""
    ia, ib = a.view(torch.int16).int(), b.view(torch.int16).int()
    return int((ia - ib).abs().max())


@needs_gemv
@pytest.mark.parametrize("rows,n,k,bias", [(1, 4096, 256, False), (1, 1536, 256, True), (2, 7, 45, True),
                                           (3, 5, 33, False), (1, 1, 1, True), (4, 256, 768, False)])
def test_product_is_the_float32_sum_rounded_once(rows, n, k, bias):
    g = torch.Generator().manual_seed(rows * 1000 + n + k)
    x = torch.randn(rows, k, generator=g).bfloat16()
    w = torch.randn(n, k, generator=g).bfloat16()
    b = torch.randn(n, generator=g).bfloat16() if bias else None
    got = cpu_bf16.kernels().bind(w, b)(x)
    want = F.linear(x.float(), w.float(), None if b is None else b.float()).bfloat16()
    assert got.shape == (rows, n) and got.dtype == torch.bfloat16
    assert _ulps(got, want) <= 1
    assert (got == want).float().mean() > 0.95
    assert not torch.equal(got, F.linear(x.float(), w.float()).bfloat16()) or b is None  # the bias is added


@needs_gemv
def test_nan_stays_nan_and_the_weight_is_kept_alive():
    w = torch.randn(8, 64).bfloat16()
    product = cpu_bf16.kernels().bind(w.clone(), None)  # the only reference to the weight is the function's
    x = torch.randn(1, 64).bfloat16()
    x[0, 3] = float("nan")
    assert torch.isnan(product(x)).all()
    x[0, 3] = 1.0
    assert torch.equal(product(x), cpu_bf16.kernels().bind(w, None)(x))


@needs_gemv
def test_fast_linear_offers_it_in_bfloat16_only(monkeypatch):
    w, b = torch.randn(96, 64).bfloat16(), torch.randn(96).bfloat16()
    plan = gemm.FastLinear(w, b)
    assert "gemv" in plan.backends and "gemv" not in gemm.FastLinear(w.float(), b.float()).backends
    x = torch.randn(2, 3, 64).bfloat16()[:, 1:]  # a strided slice, as the drafters pass
    assert _ulps(plan._gemv(x), plan._mkl(x)) <= 1 and plan._gemv(x).shape == (2, 2, 96)
    monkeypatch.setenv(cc.ENV, "0")
    assert cpu_bf16.kernels() is None and "gemv" not in gemm.FastLinear(w, b).backends
    assert "PDRAFT_CPU_KERNELS=0" in cpu_bf16.status()


@needs_amx
@pytest.mark.parametrize("rows,n,k,bias", [(1, 4096, 256, False), (16, 1536, 256, True), (17, 1536, 256, True),
                                           (32, 100, 64, False), (20, 7, 32, True), (5, 256, 768, False)])
def test_amx_product_is_the_float32_sum_rounded_once(rows, n, k, bias):
    g = torch.Generator().manual_seed(rows * 7 + n + k)
    x = torch.randn(rows, k, generator=g).bfloat16()
    w = torch.randn(n, k, generator=g).bfloat16()
    b = torch.randn(n, generator=g).bfloat16() if bias else None
    got = cpu_bf16.kernels().bind_amx(w, b)(x)
    want = F.linear(x.float(), w.float(), None if b is None else b.float()).bfloat16()
    assert got.shape == (rows, n) and _ulps(got, want) <= 1 and (got == want).float().mean() > 0.95
    if rows > 16:  # the second A tile's rows are its own, not a copy of the first's
        assert not torch.equal(got[16:], got[:rows - 16])


@needs_amx
def test_amx_refuses_what_its_tiles_cannot_take_and_prefills_go_to_onednn():
    assert cpu_bf16.kernels().bind_amx(torch.randn(8, 48).bfloat16(), None) is None  # K not a multiple of 32
    w = torch.randn(64, 64).bfloat16()
    plan = gemm.FastLinear(w, None)
    assert "amx" in plan.backends
    many = torch.randn(cpu_bf16.AMX_ROWS + 8, 64).bfloat16()
    assert torch.equal(plan._amx(many), plan.backends.get("onednn", plan._mkl)(many))
    assert _ulps(plan._amx(many[:17]), plan._mkl(many[:17])) <= 1


@needs_gemv
@pytest.mark.parametrize("weight_last", [True, False])
@pytest.mark.parametrize("shape", [(1, 256), (17, 256), (17, 4, 64), (5, 7, 33)])
@torch.no_grad()
def test_rms_norm_in_both_orders(shape, weight_last):
    g = torch.Generator().manual_seed(shape[0] + shape[-1])
    x = (3 * torch.randn(*shape, generator=g)).bfloat16()
    w = (1 + 0.1 * torch.randn(shape[-1], generator=g)).bfloat16()
    got = cpu_bf16.rms_norm(x, w, 1e-6, weight_last=weight_last)
    if weight_last:  # transformers' order: the normalised row rounded, then the weight
        want = F.rms_norm(x.float(), (shape[-1],), None, 1e-6).bfloat16() * w
    else:
        want = F.rms_norm(x, (shape[-1],), w, 1e-6)
    assert got is not None and got.shape == x.shape and _ulps(got, want) <= 1
    one = cpu_bf16.rms_norm(x[:1].contiguous(), w, 1e-6, weight_last=weight_last)
    assert torch.equal(one, got[:1])  # a row alone normalises as it does beside others
    assert cpu_bf16.rms_norm(x, w, 1e-6, weight_last=True if not weight_last else False) is not None
    assert not torch.equal(cpu_bf16.rms_norm(x, w * 2, 1e-6, weight_last=weight_last), got)  # the weight is read


def test_rms_norm_declines_where_torch_must_run():
    x, w = torch.randn(3, 32).bfloat16(), torch.ones(32).bfloat16()
    with torch.no_grad():
        assert cpu_bf16.rms_norm(x.float(), w.float(), 1e-6, weight_last=True) is None  # not bfloat16
    with torch.enable_grad():
        assert cpu_bf16.rms_norm(x.requires_grad_(), w, 1e-6, weight_last=True) is None  # a gradient to take


@needs_gemv
@pytest.mark.parametrize("shape,k", [((1, 16, 1024), 16), ((3, 7, 4096), 16), ((2, 5, 40), 40), ((1, 1, 17), 16),
                                     ((4, 33), 1)])
def test_topk_is_torchs_values_with_ties_to_the_lower_index(shape, k):
    g = torch.Generator().manual_seed(sum(shape) + k)
    x = torch.randn(*shape, generator=g).bfloat16()  # bfloat16: ties are common among 1,024 values
    values, ids = cpu_bf16.topk(x, k)
    want, _ = torch.topk(x, k, dim=-1)
    assert torch.equal(values, want.float()) and ids.dtype == torch.int64
    assert torch.equal(x.gather(-1, ids).float(), values)  # each id holds its value
    assert (ids.sort(-1).values.diff(dim=-1) > 0).all()  # k distinct ids
    tied = values[..., 1:] == values[..., :-1]
    assert (ids[..., 1:][tied] > ids[..., :-1][tied]).all()  # equal values: the lower index first


@needs_gemv
def test_topk_leaves_nan_and_falls_back_where_it_does_not_apply():
    x = torch.tensor([[1.0, float("nan"), 3.0, -2.0, 3.0]]).bfloat16()
    values, ids = cpu_bf16.topk(x, 3)
    assert values.tolist() == [[3.0, 3.0, 1.0]] and ids.tolist() == [[2, 4, 0]]
    assert cpu_bf16.topk(x.float(), 3) is None and cpu_bf16.topk(x, 6) is None
    assert cpu_bf16.topk(x.requires_grad_(), 3) is None


def _close_in_bf16(got: torch.Tensor, want: torch.Tensor) -> None:
    """Within a few bfloat16 roundings of the tensor's scale (the loops round once where torch rounds after each
    operation, and a sum that cancels keeps its terms' rounding): a wrong index, tap or rotation is off by the
    scale itself."""
    torch.testing.assert_close(got.float(), want.float(), rtol=2 ** -6, atol=float(want.float().abs().max()) * 2 ** -6)


@needs_gemv
@pytest.mark.parametrize("batch,heads,kv_heads,dim", [(1, 4, 2, 64), (2, 4, 4, 64), (1, 2, 1, 48)])
def test_qkv_block_is_the_attentions_torch_path(monkeypatch, batch, heads, kv_heads, dim):
    """InjectedAttention's bfloat16 pass with the compiled q/k norms, rotation and context concatenation gives
    its torch operations' output (up to their roundings), over a sliced cache as a decode pass reads it, on its
    sixteen-lane path and (a half head of 24) its scalar one; a training pass and float32 keep torch's path."""
    from types import SimpleNamespace

    from pdraft.models.layers import InjectedAttention

    cfg = SimpleNamespace(num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=dim, rope_theta=1e4,
                          attention_bias=False, hidden_size=256, rms_norm_eps=1e-6)
    torch.manual_seed(batch + heads + kv_heads)
    attention = InjectedAttention(cfg)
    for p in attention.parameters():
        torch.nn.init.normal_(p, 0.0, 0.3)
    attention = attention.bfloat16().eval()
    x = torch.randn(batch, 20, 256).bfloat16()
    keys, values = torch.randn(2, batch, kv_heads, 150, dim).bfloat16()
    ctx_k, ctx_v = keys[:, :, :115], values[:, :, :115]  # the cache's committed part, strided
    rope = attention.rope(torch.arange(115, 135).expand(batch, 20), torch.bfloat16)
    calls = []
    compiled = cpu_bf16.qkv_block
    monkeypatch.setattr(cpu_bf16, "qkv_block", lambda *a: calls.append(1) or compiled(*a))
    with torch.no_grad():
        got = attention(x, rope, ctx_k, ctx_v, None)
        assert calls and compiled(attention.q_proj(x).new_zeros(batch, 20, (heads + 2 * kv_heads) * dim), heads,
                                  kv_heads, attention.q_norm, attention.k_norm, rope.cos, rope.sin, ctx_k,
                                  ctx_v) is not None
        monkeypatch.setattr(cpu_bf16, "qkv_block", lambda *a: None)
        want = attention(x, rope, ctx_k, ctx_v, None)
    _close_in_bf16(got, want)
    assert compiled(x, heads, kv_heads, attention.q_norm, attention.k_norm, rope.cos, rope.sin, ctx_k, ctx_v) is None


@needs_gemv
@pytest.mark.parametrize("hidden,taps,group,block", [(256, 2, 16, 21), (64, 3, 8, 7), (48, 4, 16, 5)])
def test_dyn_conv_is_the_convs_torch_path(hidden, taps, group, block):
    """DFlash2's conv with its coefficients formed in the compiled loop (and the residual added there) gives the
    torch path's pre-conv and residual + post-conv, up to their roundings; group sizes that are and are not a
    multiple of the loop's 16 lanes."""
    from pdraft.models.dflash2.conv import GroupedDynamicConv

    torch.manual_seed(hidden + taps)
    conv = GroupedDynamicConv(hidden, taps, group, block)
    torch.nn.init.normal_(conv.kernel_projection.weight, 0.0, 0.3)
    torch.nn.init.normal_(conv.base_kernel, 0.0, 0.5)
    conv = conv.bfloat16()
    x, y, res = torch.randn(3, 2, block, hidden).bfloat16()
    with torch.no_grad():
        pre, post = conv.prepare(x)
        out = conv.finish(y, post, residual=res)
    assert isinstance(post, tuple)  # the compiled pass ran
    with torch.enable_grad():
        want_pre, want_post = conv.prepare(x)
        want = conv.finish(y, want_post, residual=res)
    assert not isinstance(want_post, tuple)
    _close_in_bf16(pre, want_pre)
    _close_in_bf16(out, want)
