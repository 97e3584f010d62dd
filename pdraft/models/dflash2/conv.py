"""DFlash2's grouped dynamic depthwise convolution, and the decoder layer that wraps it around each sublayer of
the DFlash backbone layer. Each channel c of position i mixes the same channel of the positions before it in
its block: out[i, c] = sum_t (base[t, c] + delta[i, t, g(c)]) * x[i - t, c], g(c) = c // conv_group_size,
taps that would reach before the block's first position contribute zero. One linear map of the sublayer's
normed input gives both sides' deltas (`kernel_projection`: hidden -> [2, taps, groups], the first half for
the pre-conv on the sublayer input, the second for the post-conv on its output), in the order of vLLM's
`DFlashGroupedConv.prepare` / `finish` (vllm/model_executor/models/qwen3_dflash2.py). Identity initialisation
(tap 0 of `base_kernel` = 1, other taps and the projection = 0) makes an untrained conv a no-op, so a fresh
DFlash2 backbone computes exactly what the DFlash backbone does."""

from __future__ import annotations

import torch
from torch import nn

from pdraft import gemm
from pdraft.kernels import cpu_bf16
from pdraft.models.layers import DecoderLayer, derived, fast_linear, fused_pass


def grouped_dynamic_conv(x: torch.Tensor, delta: torch.Tensor, base: torch.Tensor, block_size: int) -> torch.Tensor:
    """x [batch, seq, hidden] with seq a multiple of block_size (blocks laid end to end); delta
    [batch, seq, taps, groups]; base [taps, hidden] -> [batch, seq, hidden]."""
    return conv_with(x, conv_coefficients(delta, base), block_size)


def conv_coefficients(delta: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    """Every position's per-channel kernel: delta [..., taps, groups] + base [taps, hidden] (each group's delta
    spread over its channels) -> [..., taps, hidden], one operation whatever the leading dimensions (both of a
    module's convs at once: delta [..., 2, taps, groups], base [2, taps, hidden])."""
    taps, groups = delta.shape[-2:]
    hidden = base.shape[-1]
    grouped = base.reshape(*base.shape[:-1], groups, hidden // groups).to(delta.dtype) + delta[..., None]
    return grouped.flatten(-2)


def conv_with(x: torch.Tensor, coeff: torch.Tensor, block_size: int) -> torch.Tensor:
    """x [batch, seq, hidden]; coeff [batch, seq, taps, hidden] (any strides) -> out[i, c] = sum_t coeff[i, t, c]
    x[i - t, c] within each block: tap t of position i reads position i - t of the same block, so a block's first
    t positions get nothing from it (one fused multiply-add into a slice per tap, no padded copy: a DFlash2 pass
    on a CPU is mostly per-operation cost, issue 38)."""
    b, s, d = x.shape
    taps, n = coeff.shape[-2], s // block_size
    if n == 1:  # one block a row (every decode pass): the same sums without a block dimension's views
        out = coeff[:, :, 0] * x
        for t in range(1, min(taps, s)):
            out[:, t:].addcmul_(coeff[:, t:, t], x[:, : s - t])
        return out.to(x.dtype)
    blocks = x.reshape(b, n, block_size, d)
    coeff = coeff.reshape(b, n, block_size, taps, d)
    out = coeff[:, :, :, 0] * blocks
    for t in range(1, min(taps, block_size)):
        out[:, :, t:].addcmul_(coeff[:, :, t:, t], blocks[:, :, : block_size - t])
    return out.reshape(b, s, d).to(x.dtype)


class GroupedDynamicConv(nn.Module):
    """`layers.N.attention_conv` / `layers.N.mlp_conv`: base_kernel [2, taps, hidden] and kernel_projection
    [2 * taps * groups, hidden], the names and shapes vLLM and SpecForge load."""

    def __init__(self, hidden: int, taps: int, group_size: int, block_size: int):
        super().__init__()
        self.taps, self.groups, self.group_size, self.block_size = taps, hidden // group_size, group_size, block_size
        self.base_kernel = nn.Parameter(torch.zeros(2, taps, hidden))
        self.kernel_projection = nn.Linear(hidden, 2 * taps * self.groups, bias=False)
        self.reset_identity()

    @torch.no_grad()
    def reset_identity(self) -> None:
        self.base_kernel.zero_()
        self.base_kernel[:, 0] = 1.0
        self.kernel_projection.weight.zero_()

    def prepare(self, x: torch.Tensor) -> tuple[torch.Tensor, object]:
        """x [batch, seq, hidden] (the sublayer's normed input) -> (pre-conv of x, what `finish` needs for the
        post-conv): both convs' kernels from one projection and one addition, or, in a pass without gradients,
        from one product (`coefficient_product`: the post-conv's coefficients [batch, seq, taps, hidden]); in a
        bfloat16 pass of one block a row on a CPU, the projection's deltas alone (2 x taps x groups a position,
        a 32 KB weight where the coefficient product's is 512 KB) and a compiled loop that forms each coefficient
        as it reads it (cpu_bf16.dyn_conv; the post-conv's (deltas, base) kept for `finish`)."""
        if fused_pass() and x.shape[1] == self.block_size:
            delta = fast_linear(self.kernel_projection)(x).view(*x.shape[:-1], 2, self.taps, self.groups)
            pre = cpu_bf16.dyn_conv(x, delta[:, :, 0], self.base_kernel[0], self.group_size)
            if pre is not None:
                return pre, (delta[:, :, 1], self.base_kernel[1])
        if fused_pass():
            coeff = self.coefficient_product()(x).view(*x.shape[:-1], 2, self.taps, -1)
        else:
            delta = self.kernel_projection(x).reshape(*x.shape[:-1], 2, self.taps, self.groups)
            coeff = conv_coefficients(delta, self.base_kernel)  # [batch, seq, 2, taps, hidden]
        return conv_with(x, coeff[:, :, 0], self.block_size), coeff[:, :, 1]

    def coefficient_product(self) -> gemm.FastLinear:
        """base + delta as one product for passes without gradients: the projection's rows repeated over each
        group's channels, with the base kernel as the bias, so x -> [.., 2 * taps * hidden] coefficients directly
        (the projection and the broadcast addition were a sixth of a DFlash2 block pass on a CPU, issue 38). Kept
        until either weight changes, as `fast_linear` keeps its plans."""
        w, base = self.kernel_projection.weight, self.base_kernel

        def build() -> gemm.FastLinear:
            rows = w.reshape(2, self.taps, self.groups, 1, -1).expand(-1, -1, -1, base.shape[-1] // self.groups, -1)
            return gemm.fused(rows.reshape(-1, w.shape[-1]).contiguous(), base.reshape(-1).to(w.dtype).contiguous())

        return derived(self, "_coefficient_product", (w, base), build)

    def build_products(self) -> None:
        """The measured plans a decode pass uses, built before any timed round (prepare_products): the
        projection's (a bfloat16 CPU pass) and the coefficient product's (any other pass without gradients)."""
        fast_linear(self.kernel_projection)
        w = self.base_kernel
        if w.dtype != torch.bfloat16 or w.device.type != "cpu" or cpu_bf16.kernels() is None:
            self.coefficient_product()

    def finish(self, y: torch.Tensor, post, residual: torch.Tensor | None = None) -> torch.Tensor:
        """y [batch, seq, hidden] (the sublayer's output) -> its post-conv with what `prepare` gave, plus
        `residual` when given (in the compiled loop's pass, added inside it)."""
        if isinstance(post, tuple):  # prepare's compiled pass: (deltas [b, s, taps, groups], base [taps, hidden])
            delta, base = post
            out = cpu_bf16.dyn_conv(y, delta, base, self.group_size, residual)
            if out is not None:
                return out
            post = conv_coefficients(delta, base)
        out = conv_with(y, post, self.block_size)
        return out if residual is None else residual + out


class DFlash2DecoderLayer(DecoderLayer):
    """The DFlash backbone layer (KV-injection attention, MLP, norms: pdraft.models.layers) with a dynamic conv
    around each sublayer: norm -> pre-conv -> attention -> post-conv -> residual; norm -> pre-conv -> MLP ->
    post-conv -> residual."""

    def __init__(self, cfg):
        super().__init__(cfg)
        args = (cfg.hidden_size, cfg.conv_kernel_size, cfg.conv_group_size, cfg.block_size)
        self.attention_conv = GroupedDynamicConv(*args)
        self.mlp_conv = GroupedDynamicConv(*args)

    def forward(self, x, rope, ctx_k, ctx_v, mask):
        """x [batch, q, hidden] with q a multiple of block_size; the rest as DecoderLayer.forward."""
        h, post = self.attention_conv.prepare(self.input_layernorm(x))
        x = self.attention_conv.finish(self.self_attn(h, rope, ctx_k, ctx_v, mask), post, residual=x)
        h, post = self.mlp_conv.prepare(self.post_attention_layernorm(x))
        return self.mlp_conv.finish(self.mlp(h), post, residual=x)


__all__ = ["grouped_dynamic_conv", "conv_coefficients", "conv_with", "GroupedDynamicConv", "DFlash2DecoderLayer"]
