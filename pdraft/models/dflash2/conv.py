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

from pdraft.models.layers import DecoderLayer


def grouped_dynamic_conv(x: torch.Tensor, delta: torch.Tensor, base: torch.Tensor, block_size: int) -> torch.Tensor:
    """x [batch, seq, hidden] with seq a multiple of block_size (blocks laid end to end); delta
    [batch, seq, taps, groups]; base [taps, hidden] -> [batch, seq, hidden]."""
    b, s, d = x.shape
    taps, groups = delta.shape[-2:]
    n = s // block_size
    blocks = x.reshape(b, n, block_size, groups, d // groups)  # [b, N, size, G, group_size]
    coeff = base.reshape(taps, groups, d // groups).to(delta.dtype) + delta.reshape(b, n, block_size, taps, groups, 1)
    out = coeff[:, :, :, 0] * blocks
    for t in range(1, min(taps, block_size)):  # tap t of position i reads position i - t of the same block: the
        # block's first t positions get nothing (one fused multiply-add into a slice, no padded copy: a DFlash2
        # pass on a CPU is mostly per-operation cost, issue 38)
        out[:, :, t:].addcmul_(coeff[:, :, t:, t], blocks[:, :, : block_size - t])
    return out.reshape(b, s, d).to(x.dtype)


class GroupedDynamicConv(nn.Module):
    """`layers.N.attention_conv` / `layers.N.mlp_conv`: base_kernel [2, taps, hidden] and kernel_projection
    [2 * taps * groups, hidden], the names and shapes vLLM and SpecForge load."""

    def __init__(self, hidden: int, taps: int, group_size: int, block_size: int):
        super().__init__()
        self.taps, self.groups, self.block_size = taps, hidden // group_size, block_size
        self.base_kernel = nn.Parameter(torch.zeros(2, taps, hidden))
        self.kernel_projection = nn.Linear(hidden, 2 * taps * self.groups, bias=False)
        self.reset_identity()

    @torch.no_grad()
    def reset_identity(self) -> None:
        self.base_kernel.zero_()
        self.base_kernel[:, 0] = 1.0
        self.kernel_projection.weight.zero_()

    def prepare(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [batch, seq, hidden] (the sublayer's normed input) -> (pre-conv of x, post-conv deltas
        [batch, seq, taps, groups])."""
        delta = self.kernel_projection(x).reshape(*x.shape[:-1], 2, self.taps, self.groups)
        return grouped_dynamic_conv(x, delta[..., 0, :, :], self.base_kernel[0], self.block_size), delta[..., 1, :, :]

    def finish(self, y: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        """y [batch, seq, hidden] (the sublayer's output) -> its post-conv with the deltas from `prepare`."""
        return grouped_dynamic_conv(y, delta, self.base_kernel[1], self.block_size)


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
        h, delta = self.attention_conv.prepare(self.input_layernorm(x))
        x = x + self.attention_conv.finish(self.self_attn(h, rope, ctx_k, ctx_v, mask), delta)
        h, delta = self.mlp_conv.prepare(self.post_attention_layernorm(x))
        return x + self.mlp_conv.finish(self.mlp(h), delta)


__all__ = ["grouped_dynamic_conv", "GroupedDynamicConv", "DFlash2DecoderLayer"]
