"""pdraft.gemm: every backend a FastLinear may choose computes the product it replaces, whatever the input's
layout (issue 38: a 3-d slice took torch's batched path over a copied weight), in float32 and bfloat16."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pdraft import gemm
from pdraft.models.layers import fast_linear


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 5, 17])
def test_every_backend_computes_the_product(dtype, rows):
    torch.manual_seed(0)
    weight, bias = torch.randn(96, 64).to(dtype), torch.randn(96).to(dtype)
    plan = gemm.FastLinear(weight, bias)
    assert "mkl" in plan.backends and all(c in plan.backends for c in plan.choice)
    block = torch.randn(2, rows + 3, 64).to(dtype)
    x = block[:1, 1: rows + 1]  # a slice: its size-1 batch dimension's stride is not rows x width
    want = F.linear(x.float(), weight.float(), bias.float())
    tol = 1e-4 if dtype == torch.float32 else 0.1
    for name, backend in plan.backends.items():
        got = backend(x)
        assert got.shape == (1, rows, 96) and got.dtype == dtype, name
        torch.testing.assert_close(got.float(), want, rtol=0, atol=tol, msg=name)
    torch.testing.assert_close(plan(x).float(), want, rtol=0, atol=tol)


def test_bfloat16_is_packed_where_this_torch_can():
    plan = gemm.FastLinear(torch.randn(64, 32).bfloat16(), measure=False)
    if gemm.onednn_available():
        try:
            torch.ops.mkldnn._reorder_linear_weight(torch.randn(64, 32).bfloat16(), 17)
        except RuntimeError:
            pytest.skip("this torch's oneDNN packs no bfloat16 weight")
        assert "onednn" in plan.backends
    else:
        assert list(plan.backends) == ["mkl"]


def test_fast_linear_follows_its_weights():
    """Kept on its owner until a weight changes (an optimizer step): then rebuilt, never stale."""
    lin = torch.nn.Linear(16, 8, bias=False)
    x = torch.randn(3, 16)
    with torch.no_grad():
        first = fast_linear(lin)
        assert fast_linear(lin) is first
        torch.testing.assert_close(first(x), lin(x))
        lin.weight.add_(1.0)
        again = fast_linear(lin)
        assert again is not first
        torch.testing.assert_close(again(x), lin(x))


def test_a_traced_call_takes_the_plain_product():
    """Under torch.compile the packed weight (an opaque oneDNN tensor) is left out: the compiler lowers the plain
    product (aot_eager here: the trace, not inductor's code generation)."""
    plan = gemm.FastLinear(torch.randn(32, 16), torch.randn(32))
    plan.choice = ["onednn" if "onednn" in plan.backends else "mkl"] * len(gemm.BUCKETS)
    x = torch.randn(4, 16)
    compiled = torch.compile(lambda t: plan(t), backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(x), F.linear(x, plan.weight, plan.bias), rtol=1e-5, atol=1e-5)
