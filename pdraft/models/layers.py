"""Building blocks of the KV-injection backbone: RMSNorm, rotary embeddings, the attention whose keys and
values are [projected target context ; draft block] (DFlash eq. 3), dense and mixture-of-experts MLPs, and the
decoder layer. Module and parameter names match DeepSpec's `Qwen3DSparkModel` and z-lab's `DFlashDraftModel`
(q_proj/k_proj/v_proj/o_proj, q_norm/k_norm, gate_proj/up_proj/down_proj, input_layernorm,
post_attention_layernorm), so a state dict maps onto their checkpoints name for name. The numerics follow
transformers' Qwen3 (norms in float32, RoPE cos/sin computed in float32)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """cos, sin [batch, seq, head_dim] for absolute `positions` [batch, seq] (half-split layout)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=positions.device).float()
                                / head_dim))  # [head_dim / 2]
    freqs = positions.float()[..., None] * inv_freq  # [batch, seq, head_dim / 2]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [batch, heads, seq, head_dim]; cos/sin [batch, seq, head_dim]."""
    cos, sin = cos[:, None], sin[:, None]
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class InjectedAttention(nn.Module):
    """Block queries attend to [context keys ; block keys]. The context part is computed once per committed
    token (`context_kv`) and cached by the caller, because it depends only on that token's projected
    features and position, never on the block."""

    def __init__(self, cfg):
        super().__init__()
        self.num_heads, self.num_kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.theta = float(cfg.rope_theta)
        bias = bool(cfg.attention_bias)
        self.q_proj = nn.Linear(cfg.hidden_size, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, cfg.hidden_size, bias=bias)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)

    def _kv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        b, t, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        return apply_rope(k, cos, sin), v  # each [batch, kv_heads, t, head_dim]

    def context_kv(self, ctx: torch.Tensor, positions: torch.Tensor):
        """ctx [batch, t, hidden] projected context features at `positions` [batch, t]."""
        return self._kv(ctx, *rope_cos_sin(positions, self.head_dim, self.theta, ctx.dtype))

    def forward(self, x: torch.Tensor, positions: torch.Tensor, ctx_k: torch.Tensor, ctx_v: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:
        """x [batch, q, hidden] at `positions` [batch, q]; ctx_k/ctx_v [batch, kv_heads, T, head_dim];
        mask [batch, 1, q, T + q] bool, True = may attend."""
        b, q_len, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, q_len, self.num_heads, self.head_dim)).transpose(1, 2)
        cos, sin = rope_cos_sin(positions, self.head_dim, self.theta, x.dtype)
        q = apply_rope(q, cos, sin)  # [batch, heads, q, head_dim]
        k_blk, v_blk = self._kv(x, cos, sin)
        k = torch.cat([ctx_k.to(x.dtype), k_blk], dim=2)  # [batch, kv_heads, T + q, head_dim]
        v = torch.cat([ctx_v.to(x.dtype), v_blk], dim=2)
        groups = self.num_heads // self.num_kv_heads
        if groups > 1:
            k = k.repeat_interleave(groups, dim=1)
            v = v.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.head_dim ** -0.5)
        return self.o_proj(out.transpose(1, 2).reshape(b, q_len, self.num_heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MoE(nn.Module):
    """Top-k routed experts with renormalised softmax weights (Qwen3-MoE style; names `gate`, `experts.e.*`).
    No shared expert, and no load-balancing loss anywhere in training: nothing keeps the router from collapsing
    onto a few experts."""

    def __init__(self, hidden: int, intermediate: int, num_experts: int, top_k: int):
        super().__init__()
        self.top_k = top_k
        self.gate = nn.Linear(hidden, num_experts, bias=False)
        self.experts = nn.ModuleList([MLP(hidden, intermediate) for _ in range(num_experts)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])  # [tokens, hidden]
        logits = self.gate(flat)  # [tokens, experts]
        weights = torch.softmax(logits.float(), dim=-1)
        top_w, top_i = torch.topk(weights, self.top_k, dim=-1)  # [tokens, k]
        top_w = (top_w / top_w.sum(-1, keepdim=True)).to(x.dtype)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            token_idx, slot = torch.nonzero(top_i == e, as_tuple=True)
            if token_idx.numel() == 0:
                continue
            y = expert(flat[token_idx]) * top_w[token_idx, slot, None]
            out = out.index_add(0, token_idx, y)
        return out.view(shape)


class DecoderLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.self_attn = InjectedAttention(cfg)
        if cfg.is_moe:
            inter = cfg.moe_intermediate_size or cfg.intermediate_size
            self.mlp = MoE(cfg.hidden_size, inter, cfg.num_experts, cfg.num_experts_per_tok)
        else:
            self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, positions, ctx_k, ctx_v, mask):
        x = x + self.self_attn(self.input_layernorm(x), positions, ctx_k, ctx_v, mask)
        return x + self.mlp(self.post_attention_layernorm(x))
