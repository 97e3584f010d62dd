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

from pdraft import gemm
from pdraft.kernels import cpu_bf16


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # One fused call where x and the weight share a dtype and no gradient is taken (a drafter pass on a CPU is
        # mostly per-operation cost: issue 38; the fused kernel keeps float32 statistics and rounds once, after
        # the weight, as the engines' fused norms do); otherwise transformers' order: float32 statistics, then
        # weight * normalised in x's dtype.
        if x.dtype == self.weight.dtype and (x.dtype == torch.float32 or not torch.is_grad_enabled()):
            compiled = cpu_bf16.rms_norm(x, self.weight, self.eps, weight_last=False)  # the same sums, one C call
            return compiled if compiled is not None else F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        dtype = x.dtype
        return self.weight * F.rms_norm(x.float(), (x.shape[-1],), None, self.eps).to(dtype)


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


class Rope:
    """cos and sin of one pass's positions, computed once and shared by every layer (and by queries and keys):
    `apply(x)` [batch, heads, seq, head_dim] is `apply_rope` in three operations, because rotate_half(x) * sin
    == roll(x, d/2) * [-sin_lo; sin_hi] exactly (a negation is exact)."""

    def __init__(self, positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
        cos, sin = rope_cos_sin(positions, head_dim, theta, dtype)  # [batch, seq, head_dim]
        half = head_dim // 2
        self.cos = cos[:, None]  # [batch, 1, seq, head_dim]
        self.sin = torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)[:, None]
        self.half = half

    @classmethod
    def of(cls, cos: torch.Tensor, signed_sin: torch.Tensor) -> Rope:
        """From tables already laid out as `apply` reads them: [batch, 1, seq, head_dim] each (RopeTable)."""
        rope = cls.__new__(cls)
        rope.cos, rope.sin, rope.half = cos, signed_sin, cos.shape[-1] // 2
        return rope

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addcmul(x * self.cos, x.roll(self.half, dims=-1), self.sin)


class RopeTable:
    """Rope's cos and signed sin of positions 0..n-1, computed once by the same operations as `Rope` (so a row of
    the table is bitwise the tables a pass would compute) and read by indexing: a drafter pass's rotary tables
    in two operations instead of a dozen (a block pass on a CPU is mostly per-operation cost, issue 38). The
    table doubles when a position beyond it is asked for; it is kept per dtype."""

    def __init__(self, head_dim: int, theta: float):
        self.head_dim, self.theta = head_dim, theta
        self.tables: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor]] = {}

    def rope(self, positions: torch.Tensor, dtype: torch.dtype) -> Rope:
        """positions [batch, seq] (a CPU tensor: its largest value is read) -> the same Rope as
        Rope(positions, head_dim, theta, dtype)."""
        need = int(positions.max()) + 1 if positions.numel() else 1
        cos, sin = self.tables.get(dtype, (None, None))
        if cos is None or cos.shape[0] < need:
            size = max(256, 1 << (need - 1).bit_length())
            full = Rope(torch.arange(size, device=positions.device)[None], self.head_dim, self.theta, dtype)
            cos, sin = self.tables[dtype] = full.cos[0, 0], full.sin[0, 0]  # [size, head_dim]
        return Rope.of(cos[positions][:, None], sin[positions][:, None])


def fast_linear(owner: nn.Module, *linears: nn.Linear) -> gemm.FastLinear:
    """Linears that read the same input (`linears`; default `owner` itself) as one product for passes without
    gradients: their weights concatenated into one [sum out, in] matrix and run through the backend measured
    fastest on this machine (pdraft.gemm: MKL, or oneDNN with the weight packed once), built once and kept on
    `owner` until any of the weights changes (an optimizer step, a load), which its version counter and storage
    tell."""
    linears = linears or (owner,)

    def build() -> gemm.FastLinear:
        w = torch.cat([m.weight for m in linears]).contiguous() if len(linears) > 1 else linears[0].weight
        b = (torch.cat([m.bias for m in linears]) if len(linears) > 1 else linears[0].bias) \
            if linears[0].bias is not None else None
        return gemm.fused(w, b)

    return derived(owner, "_fast_linear", [p for m in linears for p in (m.weight, m.bias) if p is not None], build)


def derived(owner: nn.Module, slot: str, params, build, extra: tuple = ()):
    """`build()`'s result (run without gradients), kept on `owner` under `slot` (not a buffer: never saved, never
    moved) until any of `params` changes (an optimizer step, a load: its storage or version counter tells) or
    `extra` does: a product plan, a weight laid out or converted for a pass."""
    key = (*extra, *((p.data_ptr(), p._version) for p in params))
    kept = owner.__dict__.get(slot)
    if kept is None or kept[0] != key:
        with torch.no_grad():
            kept = owner.__dict__[slot] = (key, build())
    return kept[1]

@torch.no_grad()
def prepare_products(model: nn.Module) -> None:
    """Build (and measure) every `fast_linear` plan of `model`'s backbone layers now, so that a timed decode run
    does not pay for it in its first round (a plan times its backends when built: tens of ms per drafter on a CPU).
    Plans follow the weights, so a later load or optimizer step rebuilds them as before."""
    for m in model.modules():
        if isinstance(m, InjectedAttention):
            fast_linear(m, m.q_proj, m.k_proj, m.v_proj)
            fast_linear(m.k_proj, m.k_proj, m.v_proj)
            fast_linear(m.o_proj)
        elif isinstance(m, MLP):
            fast_linear(m, m.gate_proj, m.up_proj)
            fast_linear(m.down_proj)
        elif hasattr(m, "build_products"):  # a family's own module with products of its own (DFlash2's selector)
            m.build_products()


def product_plans(model: nn.Module) -> list[gemm.FastLinear]:
    """The `fast_linear` plans built on `model`'s modules so far (prepare_products builds them)."""
    return [kept[1] for m in model.modules() if (kept := m.__dict__.get("_fast_linear")) is not None]


def fused_pass() -> bool:
    """Whether this pass may run its projections through `fast_linear` and other precomputed forms: passes
    without gradients and without autocast only (a training pass keeps each Linear, whose gradient the optimizer
    reads; under autocast the products' dtype is autocast's)."""
    return not torch.is_grad_enabled() and not torch.is_autocast_enabled("cpu")


def kept_rope(owner: nn.Module, positions: torch.Tensor, dtype: torch.dtype) -> Rope:
    """The rotary tables of `owner` (an attention with head_dim and theta) at `positions` [batch, seq]: read from a
    table kept on `owner` for CPU positions outside compiled code (the same numbers, a dozen operations fewer a
    pass), computed for the pass elsewhere (a table's size would depend on the data there)."""
    if positions.device.type == "cpu" and not torch.compiler.is_compiling():
        table = owner.__dict__.get("_rope_table")  # not a buffer: never saved, never moved
        if table is None:
            table = owner.__dict__["_rope_table"] = RopeTable(owner.head_dim, owner.theta)
        return table.rope(positions, dtype)
    return Rope(positions, owner.head_dim, owner.theta, dtype)


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

    def rope(self, positions: torch.Tensor, dtype: torch.dtype) -> Rope:
        """The rotary tables of a pass at `positions` [batch, seq], shared by every layer of the pass
        (`kept_rope`)."""
        return kept_rope(self, positions, dtype)

    def _kv(self, x: torch.Tensor, rope: Rope):
        b, t, _ = x.shape
        if fused_pass():
            kv_out = fast_linear(self.k_proj, self.k_proj, self.v_proj)(x)  # [b, t, 2 kv]
            k, v = kv_out.view(b, t, 2 * self.num_kv_heads, self.head_dim).transpose(1, 2).split(
                self.num_kv_heads, dim=1)
        else:
            k = self.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
            v = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        return rope.apply(self.k_norm(k)), v  # each [batch, kv_heads, t, head_dim]

    def context_kv(self, ctx: torch.Tensor, positions: torch.Tensor, rope: Rope | None = None):
        """ctx [batch, t, hidden] projected context features at `positions` [batch, t] (`rope`: their tables,
        when a caller shares them over layers)."""
        return self._kv(ctx, rope or self.rope(positions, ctx.dtype))

    def forward(self, x: torch.Tensor, rope: Rope, ctx_k: torch.Tensor, ctx_v: torch.Tensor,
                mask: torch.Tensor | None) -> torch.Tensor:
        """x [batch, q, hidden] with the rotary tables of its positions (`rope`: [batch, q]); ctx_k/ctx_v
        [batch, kv_heads, T, head_dim]; mask [batch, 1, q, T + q] bool, True = may attend (None: all may)."""
        b, q_len, _ = x.shape
        h, kvh, d = self.num_heads, self.num_kv_heads, self.head_dim
        compiled = None
        if fused_pass():  # one matmul for q, k and v, one norm call each, RoPE once over q and k together
            qkv = fast_linear(self, self.q_proj, self.k_proj, self.v_proj)(x)
            # bfloat16 on a CPU: norms, rotation and the context's concatenation in one compiled loop (a dozen
            # operations of a pass that is mostly per-operation cost, issue 38)
            compiled = cpu_bf16.qkv_block(qkv, h, kvh, self.q_norm, self.k_norm, rope.cos, rope.sin, ctx_k, ctx_v)
            if compiled is None:
                q, k_blk, v_blk = qkv.view(b, q_len, h + 2 * kvh, d).transpose(1, 2).split([h, kvh, kvh], dim=1)
                qk = rope.apply(torch.cat([self.q_norm(q), self.k_norm(k_blk)], dim=1))  # [b, h + kv, q, d]
                q, k_blk = qk.split([h, kvh], dim=1)
        else:
            q = rope.apply(self.q_norm(self.q_proj(x).view(b, q_len, h, d).transpose(1, 2)))  # [b, h, q, d]
            k_blk, v_blk = self._kv(x, rope)
        if compiled is not None:
            q, k, v = compiled
        else:
            k = torch.cat([ctx_k.to(x.dtype), k_blk], dim=2)  # [batch, kv_heads, T + q, head_dim]
            v = torch.cat([ctx_v.to(x.dtype), v_blk], dim=2)
        # Grouped heads are read in place (SDPA's enable_gqa), not copied per query head.
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=d ** -0.5, enable_gqa=h != kvh)
        out = out.transpose(1, 2).reshape(b, q_len, h * d)
        return fast_linear(self.o_proj)(out) if fused_pass() else self.o_proj(out)


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if fused_pass():  # gate and up as one matmul
            gate, up = fast_linear(self, self.gate_proj, self.up_proj)(x).chunk(2, dim=-1)
            return fast_linear(self.down_proj)(F.silu(gate) * up)
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

    def forward(self, x, rope: Rope, ctx_k, ctx_v, mask):
        x = x + self.self_attn(self.input_layernorm(x), rope, ctx_k, ctx_v, mask)
        return x + self.mlp(self.post_attention_layernorm(x))
