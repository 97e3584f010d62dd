"""EAGLE-3's single decoder layer, as vLLM builds it (vllm/model_executor/models/llama_eagle3.py `LlamaDecoderLayer`
with layer_idx 0, qwen3_eagle3.py `Qwen3Eagle3DecoderLayer` for the q/k-norm variant) and SpecForge trains it
(specforge/modeling/draft/llama3_eagle.py): the token embedding and the hidden state are normed separately
(input_layernorm, hidden_norm) and concatenated, so q/k/v read 2H; o_proj returns H; the residual stream starts
from the hidden state (normed first when `norm_before_residual`); a post-attention norm and a SiLU MLP follow.
The layer is split where the drafter needs it: `project` gives queries, keys and values (RoPE applied at the
given positions) and the residual; the caller attends over whatever keys it holds (its KV cache while
drafting, the unrolled chains while training); `finish` turns the attention output into the layer's output
before the final norm (vLLM's `hidden_prenorm`, the hidden state the next drafting step reads). Parameter names
are the engines' checkpoint names under `midlayer.`."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pdraft.models.layers import MLP, RMSNorm, apply_rope, fast_linear, fused_pass, kept_rope, rope_cos_sin


class Eagle3Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.theta = float(cfg.rope_theta)
        width = 2 * cfg.hidden_size  # [embedding ; hidden]; no biases (Eagle3Config refuses attention_bias)
        self.q_proj = nn.Linear(width, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(width, self.num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(width, self.num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, cfg.hidden_size, bias=False)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.qk_norm = bool(cfg.qk_norm)

    def qkv(self, x: torch.Tensor, positions: torch.Tensor):
        """x [batch, q, 2H] at `positions` [batch, q] -> q [batch, heads, q, d], k and v [batch, kv_heads, q, d]."""
        b, n, _ = x.shape
        h, kvh, d = self.num_heads, self.num_kv_heads, self.head_dim
        if fused_pass():  # drafting: one measured product for q, k and v, the rotary tables read from a table
            q, k, v = fast_linear(self, self.q_proj, self.k_proj, self.v_proj)(x).view(b, n, h + 2 * kvh, d).split(
                [h, kvh, kvh], dim=2)
            v = v.transpose(1, 2)
            if self.qk_norm:
                q, k = self.q_norm(q), self.k_norm(k)
            rope = kept_rope(self, positions, x.dtype)
            return rope.apply(q.transpose(1, 2)), rope.apply(k.transpose(1, 2)), v
        q = self.q_proj(x).view(b, n, h, d)
        k = self.k_proj(x).view(b, n, kvh, d)
        v = self.v_proj(x).view(b, n, kvh, d).transpose(1, 2)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = rope_cos_sin(positions, d, self.theta, x.dtype)
        return apply_rope(q.transpose(1, 2), cos, sin), apply_rope(k.transpose(1, 2), cos, sin), v

    def build_products(self) -> None:
        """The q|k|v and o products' measured plans, built before any timed round (layers.prepare_products)."""
        fast_linear(self, self.q_proj, self.k_proj, self.v_proj)
        fast_linear(self.o_proj)

    def repeat_kv(self, x: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """[batch, kv_heads, ...] -> [batch, heads, ...] (grouped-query attention)."""
        groups = self.num_heads // self.num_kv_heads
        return x if groups == 1 else x.repeat_interleave(groups, dim=dim)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """q [batch, heads, q, d] over keys/values [batch, kv_heads, T, d] where mask [batch, 1, q, T] (True = may
        attend) -> [batch, q, heads * d]."""
        out = F.scaled_dot_product_attention(q, self.repeat_kv(k), self.repeat_kv(v), attn_mask=mask,
                                             scale=self.head_dim ** -0.5)
        b, _, n, _ = out.shape
        return out.transpose(1, 2).reshape(b, n, self.num_heads * self.head_dim)


class Eagle3Layer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.self_attn = Eagle3Attention(cfg)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.norm_before_residual = bool(cfg.norm_before_residual)

    def project(self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor):
        """embeds, hidden [batch, q, H] (the token's embedding; the fused target features or the previous step's
        output) at `positions` [batch, q] -> (q, k, v as Eagle3Attention.qkv, residual [batch, q, H])."""
        normed = self.hidden_norm(hidden)
        residual = normed if self.norm_before_residual else hidden
        x = torch.cat([self.input_layernorm(embeds), normed], dim=-1)  # [batch, q, 2H]
        q, k, v = self.self_attn.qkv(x, positions)
        return q, k, v, residual

    def finish(self, attn: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """attn [batch, q, heads * d] -> the layer's output before the final norm [batch, q, H]."""
        o_proj = self.self_attn.o_proj
        residual = (fast_linear(o_proj)(attn) if fused_pass() else o_proj(attn)) + residual
        return self.mlp(self.post_attention_layernorm(residual)) + residual
