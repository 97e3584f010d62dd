"""The compiled bfloat16 product (pdraft.kernels.cpu_gemv): its rows equal float32 sums of the same bfloat16
values rounded once to bfloat16 (within one unit in the last place, the order of the sums being its own), on
shapes that are not multiples of its 32-wide slices or 4-row groups, with and without a bias, NaN kept; FastLinear
offers it only in bfloat16 and only while the compiled loops are on."""

import pytest
import torch
import torch.nn.functional as F

from pdraft import gemm
from pdraft.kernels import cc, cpu_gemv

needs_gemv = pytest.mark.skipif(cpu_gemv.kernels() is None, reason=f"no compiled bf16 product: {cpu_gemv.status()}")


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
    got = cpu_gemv.kernels().bind(w, b)(x)
    want = F.linear(x.float(), w.float(), None if b is None else b.float()).bfloat16()
    assert got.shape == (rows, n) and got.dtype == torch.bfloat16
    assert _ulps(got, want) <= 1
    assert (got == want).float().mean() > 0.95
    assert not torch.equal(got, F.linear(x.float(), w.float()).bfloat16()) or b is None  # the bias is added


@needs_gemv
def test_nan_stays_nan_and_the_weight_is_kept_alive():
    w = torch.randn(8, 64).bfloat16()
    product = cpu_gemv.kernels().bind(w.clone(), None)  # the only reference to the weight is the function's
    x = torch.randn(1, 64).bfloat16()
    x[0, 3] = float("nan")
    assert torch.isnan(product(x)).all()
    x[0, 3] = 1.0
    assert torch.equal(product(x), cpu_gemv.kernels().bind(w, None)(x))


@needs_gemv
def test_fast_linear_offers_it_in_bfloat16_only(monkeypatch):
    w, b = torch.randn(96, 64).bfloat16(), torch.randn(96).bfloat16()
    plan = gemm.FastLinear(w, b)
    assert "gemv" in plan.backends and "gemv" not in gemm.FastLinear(w.float(), b.float()).backends
    x = torch.randn(2, 3, 64).bfloat16()[:, 1:]  # a strided slice, as the drafters pass
    assert _ulps(plan._gemv(x), plan._mkl(x)) <= 1 and plan._gemv(x).shape == (2, 2, 96)
    monkeypatch.setenv(cc.ENV, "0")
    assert cpu_gemv.kernels() is None and "gemv" not in gemm.FastLinear(w, b).backends
    assert "PDRAFT_CPU_KERNELS=0" in cpu_gemv.status()
