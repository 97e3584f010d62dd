"""The target side of a decode run on a preallocated KV cache, with the target's forward written out over its
own modules: the fast path beside pdraft.decode.target_runner's reference (transformers' forward on a
DynamicCache), chosen once per run by `decode.compile` (pdraft.decode.runners).

Cache layout. `StaticKV` holds the keys and values of every layer in two tensors [layers, rows, kv_heads,
capacity, head_dim], allocated once. Slot j of row b holds the token at absolute position j of the request in
row b, so the cache needs no bookkeeping of live slots: a query at position p may attend to slots 0..p of its
row, and those hold exactly the request's tokens, because every position below p was written by a real token
of the prompt or of an earlier verify pass, and a draft that was rejected sits at a position the next pass
overwrites before any query can reach it. Rollback is therefore by length and free (nothing is cropped,
compacted, copied or reallocated, and no Python runs over layers), and a row that a finished request leaves
can take a new request as it is (its prefill rewrites positions from 0): the property continuous batching
(issue 29) needs. A drafter that keeps its own KV cache across sequential passes (EAGLE-3) indexes its cache
the same way and rolls back with the target by setting its length to the committed one.

The forward (`LeanTarget.forward`) is the decoder of transformers' Qwen3 / Qwen2 / Llama / Mistral families
written out with few operations (a step of a small target on a CPU is mostly per-operation overhead): the
model's own weights and rotary module (so RoPE scaling is the model's), RMSNorm as one `F.rms_norm` call, and,
when `fuse` is set (the eager path), the q/k/v and the gate/up projections as one matmul each over weights
concatenated once (a copy of those weights: for the small targets a CPU runs); compiled code reads the
model's own weights. It runs on the packed real tokens of the round ([N] ids, positions and rows). Only attention runs on
the [rows, width] grid: queries are scattered into it, keys and values written into the cache at (row,
position), SDPA over the whole capacity with the mask `slot <= position`, grouped-query heads folded into the
query axis (as transformers' `pack_gqa`, without copying keys). Every shape but N and width is fixed, which is
what `torch.compile` and CUDA-graph capture (pdraft.decode.compiled) need. The captured feature layers follow
pdraft.targets.capture's rule: id i = output of decoder layer i, -1 = the embedding output, a legacy last layer
after the final norm.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch.distributed.tensor import DTensor
import torch.nn.functional as F

from pdraft import gemm
from pdraft.kernels import cpu_bf16
from pdraft.errors import PdraftError
from pdraft.targets.capture import EMBEDDING, check_layer_ids, decoder_layers
from pdraft.decode.target_runner import Features
from pdraft.models.api import DraftTree

FAMILIES = ("qwen3", "qwen2", "llama", "mistral")  # decoder layers this forward reproduces exactly
STATIC_ROPE = ("default", "linear", "llama3", "yarn")  # rotary types whose frequencies never change with length
CAPACITY_STEP = 128  # capacities are rounded up to this, so compiled code sees few distinct cache shapes


def windowed_attention(cfg) -> str | None:
    """What in a target's config makes some layers attend to less than the whole context (a sliding window, or
    layer types other than full attention), or None. Neither decode path runs that: both verify drafts with a
    full causal mask (pdraft.decode.backend.check_decodable)."""
    kind = getattr(cfg, "model_type", None)
    if getattr(cfg, "use_sliding_window", False) or getattr(cfg, "sliding_window", None) and kind == "mistral":
        return f"sliding-window attention (sliding_window {getattr(cfg, 'sliding_window', None)})"
    other = sorted({t for t in (getattr(cfg, "layer_types", None) or []) if t != "full_attention"})
    if other:
        return f"layers other than full attention ({', '.join(map(str, other))})"
    return None


def unsupported_reason(model: torch.nn.Module) -> str | None:
    """Why `LeanTarget` cannot run `model` exactly as transformers does, or None when it can."""
    cfg = model.config
    kind = getattr(cfg, "model_type", None)
    # A tensor-parallel target (target.tensor_parallel: transformers' tp_plan) holds DTensor shards: its forward
    # runs the collectives the plan wires in, which this forward, over the weights as plain tensors, does not.
    if any(isinstance(p, DTensor) for p in model.parameters()):
        return "a tensor-parallel target (its weights are DTensor shards)"
    if kind not in FAMILIES:
        return f"model type {kind!r} (the static path covers {', '.join(FAMILIES)})"
    rope = (getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {})
    rope_type = rope.get("rope_type") or rope.get("type") or "default"
    if rope_type not in STATIC_ROPE:
        return f"RoPE type {rope_type!r} changes with the sequence length"
    if (window := windowed_attention(cfg)) is not None:
        return window
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"MLP activation {cfg.hidden_act!r}"
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "rotary_emb") or not hasattr(inner, "embed_tokens"):
        return f"{type(model).__name__} has no .model.rotary_emb / .model.embed_tokens"
    layer = decoder_layers(model)[0]
    attn = layer.self_attn
    if not all(hasattr(attn, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj")):
        return "attention without q/k/v/o projections"
    if not all(hasattr(layer.mlp, n) for n in ("gate_proj", "up_proj", "down_proj")):
        return "an MLP without gate/up/down projections"
    return None


def _eps(norm: torch.nn.Module) -> float:
    return float(getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6)))


def _rms(x: torch.Tensor, norm: torch.nn.Module) -> torch.Tensor:
    """transformers' RMSNorm of these families: float32 statistics, then weight * normalised in x's dtype (one
    call in float32, where both orders give the same numbers)."""
    if x.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), norm.weight, _eps(norm))
    compiled = cpu_bf16.rms_norm(x, norm.weight, _eps(norm), weight_last=True)  # the same order, one call
    if compiled is not None:
        return compiled
    return F.rms_norm(x.float(), (x.shape[-1],), None, _eps(norm)).to(x.dtype) * norm.weight


class StaticKV:
    """Keys and values of every layer, preallocated: [layers, rows, kv_heads, capacity + 1, head_dim] each; slot j
    of row b holds position j of the request in row b (module docstring). The extra slot (`scratch`) takes the
    writes of padding cells in a padded pass; no query ever reads it."""

    def __init__(self, layers: int, rows: int, kv_heads: int, capacity: int, head_dim: int, *,
                 dtype: torch.dtype, device: torch.device):
        shape = (layers, rows, kv_heads, capacity + 1, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)

    @property
    def rows(self) -> int:
        return self.keys.shape[1]

    @property
    def capacity(self) -> int:
        return self.keys.shape[3] - 1


def capacity_for(tokens: int, limit: int) -> int:
    """Slots for `tokens` positions, rounded up to CAPACITY_STEP (never below `tokens`, at most `limit` unless
    `tokens` itself is larger)."""
    rounded = -(-tokens // CAPACITY_STEP) * CAPACITY_STEP
    return max(tokens, min(rounded, limit))


class LeanTarget:
    """The target's forward over its own modules, on a StaticKV (module docstring). `forward` is a pure function
    of its tensor arguments and the cache buffers it writes, so it can be compiled."""

    def __init__(self, model: torch.nn.Module, layer_ids: Sequence[int] | None = None, *, fuse: bool = False):
        reason = unsupported_reason(model)
        if reason is not None:
            raise PdraftError(f"the static decode path cannot run this target: {reason}",
                              hint="set decode.compile: off (the reference path runs any causal LM)")
        self.model, cfg = model, model.config
        self.inner = model.model
        self.layers = list(decoder_layers(model))
        self.head = model.get_output_embeddings()
        attn = self.layers[0].self_attn
        self.head_dim = int(attn.head_dim)
        self.heads = int(cfg.num_attention_heads)
        self.kv_heads = int(getattr(cfg, "num_key_value_heads", None) or self.heads)
        self.scaling = float(attn.scaling)
        self.qk_norm = hasattr(attn, "q_norm")
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.max_positions = int(getattr(cfg, "max_position_embeddings", 1 << 30))
        self.layer_ids = list(check_layer_ids(layer_ids, len(self.layers))) if layer_ids else []
        # The decoder layers whose outputs are features (-1 = the embedding output); the last layer's state is
        # taken after the final norm (legacy drafters only, as pdraft.targets.capture takes it).
        self.taps = set(self.layer_ids)
        self.legacy_last = len(self.layers) - 1 in self.taps
        self._caches: dict[int, StaticKV] = {}
        self.on_new_cache: Callable[[StaticKV], None] | None = None  # e.g. mark the buffers static for graphs
        self.fused: list[_Linears] | None = None
        self.head_fn: Callable[[torch.Tensor], torch.Tensor] = self.head
        if fuse:
            # The eager path: q|k|v and gate|up as one product each, every product through the backend measured
            # fastest for its rows on this machine (pdraft.gemm); the LM head's plan is the one a drafter sharing
            # the head uses too.
            with torch.no_grad():
                self.fused = [_Linears(
                    qkv=gemm.fused(*_cat(layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj)),
                    o=gemm.for_linear(layer.self_attn.o_proj),
                    gate_up=gemm.fused(*_cat(layer.mlp.gate_proj, layer.mlp.up_proj)),
                    down=gemm.for_linear(layer.mlp.down_proj)) for layer in self.layers]
                if isinstance(self.head, torch.nn.Linear):
                    self.head_fn = gemm.for_linear(self.head)

    def gemm_plans(self) -> list:
        """The products' measured plans (pdraft.gemm.FastLinear), for the run's report; [] off the eager path."""
        if self.fused is None:
            return []
        plans = [p for f in self.fused for p in (f.qkv, f.o, f.gate_up, f.down)]
        return plans + ([self.head_fn] if isinstance(self.head_fn, gemm.FastLinear) else [])

    def _qkv(self, i: int, h: torch.Tensor) -> torch.Tensor:
        """[N, hidden] -> [N, heads + 2 kv_heads, head_dim]."""
        if self.fused is not None:
            out = self.fused[i].qkv(h)
        else:
            a = self.layers[i].self_attn
            out = torch.cat([a.q_proj(h), a.k_proj(h), a.v_proj(h)], dim=-1)
        return out.view(h.shape[0], self.heads + 2 * self.kv_heads, self.head_dim)

    def _o(self, i: int, h: torch.Tensor) -> torch.Tensor:
        return self.fused[i].o(h) if self.fused is not None else self.layers[i].self_attn.o_proj(h)

    def _mlp(self, i: int, h: torch.Tensor) -> torch.Tensor:
        mlp = self.layers[i].mlp
        if self.fused is not None:
            gate, up = self.fused[i].gate_up(h).chunk(2, dim=-1)
            return self.fused[i].down(F.silu(gate) * up)
        gate, up = mlp.gate_proj(h), mlp.up_proj(h)
        return mlp.down_proj(F.silu(gate) * up)

    def cache(self, rows: int, capacity: int) -> StaticKV:
        """The cache for `rows` requests, kept between runs: reused while it is large enough (so compiled code
        and CUDA graphs see the same buffers run after run), replaced by a larger one otherwise."""
        c = self._caches.get(rows)
        if c is None or c.capacity < capacity:
            c = self._caches[rows] = StaticKV(len(self.layers), rows, self.kv_heads, capacity, self.head_dim,
                                              dtype=self.dtype, device=self.device)
            if self.on_new_cache is not None:
                self.on_new_cache(c)
        return c

    def forward(
        self,
        ids: torch.Tensor,  # [N] long: the tokens of the pass, row-major over the grid
        positions: torch.Tensor,  # [N] long: absolute positions (RoPE)
        slots: torch.Tensor,  # [N] long: the cache slot each token writes (its position; padding: the scratch)
        index: torch.Tensor,  # [N] long: row * width + column of each token on the attention grid
        grid_positions: torch.Tensor,  # [rows, width] long: position of every grid cell (padding: 0)
        keys: torch.Tensor,  # [layers, rows, kv_heads, capacity + 1, head_dim], written in place
        values: torch.Tensor,
        logits: bool = True,
        last_only: bool = False,  # logits of the last token only (a prefill that takes its first token)
        attend: torch.Tensor | None = None,  # [rows, width, capacity + 1] bool: the slots each grid cell attends
        # to; None = the chain's `slot <= position` (a tree: the committed context and the node's ancestors)
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """-> (logits [N, vocab] ([1, vocab] with last_only) or None, features [N, len(layer_ids) * hidden] or
        None)."""
        rows, width = grid_positions.shape
        capacity = keys.shape[3]
        heads, kv, d = self.heads, self.kv_heads, self.head_dim
        n = ids.shape[0]
        rep = heads // kv
        row_of = index // width  # [N]
        x = self.inner.embed_tokens(ids)  # [N, hidden]
        cos, sin = self.inner.rotary_emb(x, positions[None])  # [1, N, head_dim], both halves equal
        cos, sin = cos[0, :, None], sin[0, :, None]  # [N, 1, head_dim]
        # rotate_half(x) * sin == roll(x, d/2) * [-sin; sin], exactly (a negation is exact): 4 ops, not 7
        sin = torch.cat([-sin[..., : d // 2], sin[..., d // 2:]], dim=-1)
        dense = n == rows * width  # every grid cell is a real token (batch 1, or every target-alone step)
        every = torch.arange(capacity, device=ids.device)  # the scratch slot is last: above every position
        allowed = (every.view(1, 1, capacity) <= grid_positions.unsqueeze(-1) if attend is None
                   else attend)  # [rows, width, capacity + 1]
        # Queries are folded as [kv_heads, rep * width] (head h = kv * rep + r): the mask repeats per folded head.
        mask = allowed.unsqueeze(1).expand(rows, rep, width, capacity).reshape(rows, 1, rep * width, capacity)
        feats: list[torch.Tensor] = [x] if EMBEDDING in self.taps else []
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            qkv = self._qkv(i, _rms(x, layer.input_layernorm))  # [N, heads + 2 kv, d]
            q, k, v = qkv.split([heads, kv, kv], dim=1)
            if self.qk_norm:
                q, k = _rms(q, attn.q_norm), _rms(k, attn.k_norm)
            qk = torch.cat([q, k], dim=1)  # RoPE once for both: [N, heads + kv, d]
            qk = qk * cos + qk.roll(d // 2, dims=-1) * sin
            keys[i, row_of, :, slots] = qk[:, heads:].to(keys.dtype)  # [N, kv, d] at (row, slot)
            values[i, row_of, :, slots] = v.to(values.dtype)
            if dense:  # tokens are the grid's cells in order: no scatter, no gather
                grid = qk[:, :heads]
            else:
                grid = qk.new_zeros(rows * width, heads, d)
                grid[index] = qk[:, :heads]
            grid = grid.reshape(rows, width, heads, d).permute(0, 2, 1, 3).reshape(rows, kv, rep * width, d)
            out = F.scaled_dot_product_attention(grid, keys[i], values[i], attn_mask=mask, scale=self.scaling)
            out = out.view(rows, heads, width, d).permute(0, 2, 1, 3).reshape(rows * width, heads * d)
            out = out if dense else out[index]  # [N, heads * d]
            x = x + self._o(i, out)  # [N, hidden]
            x = x + self._mlp(i, _rms(x, layer.post_attention_layernorm))
            if i in self.taps and i != len(self.layers) - 1:
                feats.append(x)
        x = _rms(x, self.inner.norm)
        if self.legacy_last:
            feats.append(x)
        features = torch.cat(feats, dim=-1) if feats else None  # [N, F], in layer-id order
        return (self.head_fn(x[-1:] if last_only else x) if logits else None), features


@dataclass
class _Linears:
    """One decoder layer's products on the eager path (pdraft.gemm.FastLinear each)."""

    qkv: gemm.FastLinear
    o: gemm.FastLinear
    gate_up: gemm.FastLinear
    down: gemm.FastLinear


def _cat(*linears: torch.nn.Linear) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The weights (and biases) of linears that read the same input, as one [sum out, in] matrix."""
    w = torch.cat([m.weight for m in linears]).contiguous()
    b = torch.cat([m.bias for m in linears]) if linears[0].bias is not None else None
    return w, b


@dataclass
class _Pass:
    """The real tokens of one forward and where they sit on the [rows, width] grid."""

    real: torch.Tensor  # [rows, width] bool
    index: torch.Tensor  # [N] long
    anchor: torch.Tensor | None = None  # [rows] long: a tree pass's anchor positions (its slots start there)


class StaticVerifier:
    """The target side of a decode run (prefill, verify, commit: the interface of
    pdraft.decode.target_runner.TargetRunner) on a StaticKV. `step` runs LeanTarget.forward and may be a
    compiled version of it (pdraft.decode.backend); prefill always runs eagerly (once per request, every
    length different). Packed (the default) runs the real tokens only, sum(1 + l); `padded` runs every cell of
    the [batch, L+1] grid, so that every shape is fixed per (batch, width) as CUDA graphs need, padding cells
    writing into the scratch slot. Features and logits come back on the grid, zeros at padding."""

    def __init__(self, lean: LeanTarget, step: Callable | None = None, *, room: int = 0, padded: bool = False):
        self.lean = lean
        self.step = step or lean.forward
        self.room, self.padded = room, padded
        self.packed = not padded
        self.device = lean.device
        self.max_positions = lean.max_positions
        self.cache: StaticKV | None = None
        self.pending: _Pass | None = None

    def prefill(self, prompts: Sequence[Sequence[int]]) -> Features:
        """Run x_0..x_{n-2} of every prompt. The cache is sized once for the run: real tokens only are written
        at their positions, and none reaches past the context or past the longest prompt plus `room` (the run's
        new tokens)."""
        batch = len(prompts)
        width = max(len(p) - 1 for p in prompts)
        need = min(max(len(p) for p in prompts) + self.room, self.max_positions)
        self.cache = self.lean.cache(batch, capacity_for(need, self.max_positions))
        lengths = torch.tensor([len(p) - 1 for p in prompts], device=self.device)
        grid_pos = torch.arange(width, device=self.device).expand(batch, width)
        real = grid_pos < lengths.unsqueeze(1)  # [batch, T]
        ids = torch.zeros(batch, width, dtype=torch.long)  # [batch, T]: the tokens (EAGLE-3 reads them too)
        for b, p in enumerate(prompts):
            ids[b, : len(p) - 1] = torch.tensor(list(p[:-1]), dtype=torch.long)
        ids = ids.to(self.device)
        if width == 0:
            return Features(torch.zeros(batch, 0, 0), grid_pos, real, ids)
        _, feats = self._run(self.lean.forward, ids, grid_pos, real.cpu(), logits=False, packed=True)
        return Features(feats, grid_pos, real, ids)

    def reserve(self, rows: int, longest: int) -> None:
        """The cache of a continuous-batching run (pdraft.decode.engine, `concurrency`): `rows` slots, each
        for a prompt of up to `longest` tokens plus `room`. Requests enter by `refill`, not `prefill`."""
        need = min(longest + self.room, self.max_positions)
        self.cache = self.lean.cache(rows, capacity_for(need, self.max_positions))

    def refill(self, row: int, prompt: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """A new request takes row `row`: one eager pass over its whole prompt, written into that row of the
        cache from position 0 (the previous request's entries are overwritten or never reached again: module
        docstring). -> (logits [vocab] after the last prompt token, from which its first token is taken, as an
        engine takes it from the prefill; features [n, F] of the n prompt tokens, the anchor included)."""
        n = len(prompt)
        ids = torch.tensor(list(prompt), dtype=torch.long, device=self.device)  # [n]
        positions = torch.arange(n, device=self.device)  # [n]: dense, one row, index = position
        keys = self.cache.keys[:, row:row + 1]  # views: the pass writes the row in place
        values = self.cache.values[:, row:row + 1]
        logits, feats = self.lean.forward(ids, positions, positions, positions, positions.unsqueeze(0), keys, values,
                                          last_only=True)
        return logits[0], feats

    def verify(self, anchors: torch.Tensor, anchor_positions: torch.Tensor, drafts: torch.Tensor,
               lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One pass over [anchor, d_1..d_l] per request (lengths -1 = finished, skipped): logits
        [batch, L+1, vocab] and features [batch, L+1, F] (None without layer ids)."""
        lengths = lengths.cpu()
        offsets = torch.arange(drafts.shape[1] + 1)
        top = int((anchor_positions.cpu() + lengths).max())  # the furthest real position of the pass
        if top >= self.cache.capacity:
            raise PdraftError(f"internal: position {top} is past the static cache's {self.cache.capacity} slots")
        real = offsets.unsqueeze(0) <= lengths.unsqueeze(1)  # [batch, L+1], on the host: packing reads it there
        ids = torch.cat([anchors.to(drafts.device).unsqueeze(1), drafts], dim=1).to(self.device)  # [batch, L+1]
        positions = anchor_positions.to(self.device).unsqueeze(1) + offsets.to(self.device)  # [batch, L+1]
        return self._run(self.step, ids, positions, real, logits=True, packed=not self.padded)

    def verify_tree(self, anchors: torch.Tensor, anchor_positions: torch.Tensor, tree: DraftTree,
                    running: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One pass over [anchor, node_1..node_N] per running request ([batch] bool): node i sits at position
        anchor + depth_i (RoPE) and is written at slot anchor + i, and attends to the committed context (slots
        below the anchor's position) and to its ancestors' slots. -> logits [batch, N+1, vocab] and features
        [batch, N+1, F] (None without layer ids). `commit_tree` moves the kept path's entries to their positions."""
        n = tree.nodes
        real = torch.cat([running.cpu().unsqueeze(1), tree.real.cpu() & running.cpu().unsqueeze(1)], dim=1)
        anchor = anchor_positions.cpu()
        top = int((anchor + n).masked_fill(~running.cpu(), 0).max())  # the furthest slot of the pass
        if top >= self.cache.capacity:
            raise PdraftError(f"internal: tree slot {top} is past the static cache's {self.cache.capacity} slots")
        dev = self.device
        anchor_d = anchor.to(dev).unsqueeze(1)  # [batch, 1]
        depth = torch.cat([torch.zeros(len(anchor), 1, dtype=torch.long), tree.depth.cpu()], dim=1).to(dev)
        cols = (anchor_d + torch.arange(n + 1, device=dev)).clamp(max=self.cache.capacity)  # [batch, N+1] slots
        every = torch.arange(self.cache.capacity + 1, device=dev)
        attend = (every.view(1, 1, -1) < anchor_d.unsqueeze(2)).expand(-1, n + 1, -1).clone()  # the context
        attend.scatter_(2, cols.unsqueeze(1).expand(-1, n + 1, -1), tree.ancestors().to(dev))
        ids = torch.cat([anchors.to(dev).unsqueeze(1), tree.tokens.to(dev)], dim=1)  # [batch, N+1]
        out = self._run(self.step, ids, anchor_d + depth, real, logits=True, packed=not self.padded, slots=cols,
                        attend=attend)
        self.pending.anchor = anchor
        return out

    def commit_tree(self, path: torch.Tensor, accepted: torch.Tensor) -> torch.Tensor:
        """path [batch, D+1] (node indices of the kept path, the root first), accepted [batch]: the kept nodes'
        keys and values move from their tree slots to their positions (anchor + 1..a), all gathered before any
        is written, so a move never reads a slot another one just wrote. -> keep [batch, D+1] bool, the
        anchor and the kept path, as `commit` returns it for a chain."""
        real, anchor = self.pending.real[:, 0], self.pending.anchor
        accepted = accepted.cpu()
        depth = path.shape[1] - 1
        k = torch.arange(depth + 1)
        keep = real.unsqueeze(1) & (k.unsqueeze(0) <= accepted.unsqueeze(1))  # [batch, D+1]
        moving = keep[:, 1:] & (path[:, 1:].cpu() != k[1:])  # [batch, D]: kept nodes not already in place
        if bool(moving.any()):
            scratch = self.cache.capacity
            src = torch.where(moving, anchor.unsqueeze(1) + path[:, 1:].cpu(), scratch).to(self.device)
            dst = torch.where(moving, anchor.unsqueeze(1) + k[1:], scratch).to(self.device)
            rows = torch.arange(len(anchor), device=self.device).unsqueeze(1).expand_as(src)
            for cache in (self.cache.keys, self.cache.values):
                cache[:, rows, :, dst] = cache[:, rows, :, src]  # the right side is gathered (copied) first
        self.pending = None
        return keep

    def tree_room(self, anchor_positions: torch.Tensor) -> torch.Tensor:
        """[batch] long: most tree nodes each request's row of the cache can hold after its anchor."""
        return (self.cache.capacity - 1 - anchor_positions.cpu()).clamp(min=0)

    def _run(self, step, ids, positions, real, *, logits: bool, packed: bool, slots: torch.Tensor | None = None,
             attend: torch.Tensor | None = None):
        """`slots` [rows, width]: where each cell writes (None: its position); `attend`: LeanTarget.forward's."""
        rows, width = ids.shape
        dev = self.device
        index = (real.flatten().nonzero().flatten() if packed else torch.arange(rows * width)).to(dev)  # [N]
        real_d = real.to(dev)
        grid_pos = torch.where(real_d, positions, torch.zeros_like(positions))  # padding attends to slot 0 only
        flat_pos = grid_pos.flatten()[index]
        at = flat_pos if slots is None else slots.to(dev).flatten()[index]
        slots = torch.where(real_d.flatten()[index], at, torch.full_like(flat_pos, self.cache.capacity))
        tree = {} if attend is None else {"attend": attend}
        out, feats = step(ids.flatten()[index], flat_pos, slots, index, grid_pos, self.cache.keys,
                          self.cache.values, logits, **tree)
        self.pending = _Pass(real, index)
        if not packed:  # every cell ran: the grid is the output, zeroed at padding
            mask = real_d.flatten()[:, None]
            return tuple(None if t is None else (t * mask).view(rows, width, -1) for t in (out, feats))

        def grid(t: torch.Tensor | None) -> torch.Tensor | None:  # [N, X] -> [rows, width, X]
            if t is None:
                return None
            full = t.new_zeros(rows * width, t.shape[-1])
            full[index] = t
            return full.view(rows, width, -1)

        return grid(out), grid(feats)

    def commit(self, accepted: torch.Tensor) -> torch.Tensor:
        """Keep the anchor and the first a drafts of the last pass: [batch, L+1] bool. Nothing moves in the
        cache: positions past the committed length are overwritten by the next pass."""
        real = self.pending.real
        offsets = torch.arange(real.shape[1], device=real.device)
        keep = real & (offsets.unsqueeze(0) <= accepted.to(real.device).unsqueeze(1))
        self.pending = None
        return keep
