"""The target side of speculative decoding: prefill, the verify pass and KV-cache rollback, for a batch of
requests whose prompts and accepted lengths all differ.

Batching choice: one transformers `DynamicCache` shared by the batch, plus our own per-request bookkeeping of
which cache slots are live (`valid`, [batch, slots]). Every forward passes explicit per-request position ids
and a custom 4D additive mask (query may see a slot iff the slot is live for its request and not in its
future). Requests that accept fewer drafts than others simply leave dead slots ("holes") behind instead of
forcing a common crop length; the cache is cropped to the last slot any request still uses (for one request
this is the exact rollback to the committed length) and compacted by one gather when holes outnumber live
slots. We chose this over per-request caches or re-padding every round because it keeps one batched target
forward per round, never recomputes a committed token, and costs no copy in the common case. Prompts are
right-padded in the prefill, so captured features come out "real tokens first", as the drafter API expects.
Padding queries attend only to their own slot, so no attention row is empty (no NaN) whatever the backend.

Packed verification (the default). Requests verify different numbers of drafts, and a padded [batch, L+1]
verify pass costs batch * (1 + max l) tokens in every projection, MLP and the LM head, so shortening some
requests saves nothing. `verify` therefore flattens the real tokens of all requests into one row of
N = sum(1 + l_r) tokens for everything that is per token (embedding, projections, MLP, norms, LM head), and
only the attention itself runs on the padded [batch, L+1] grid against the batched KV cache: an attention
function scatters the row's q/k/v into the grid, appends k/v to the cache, calls the model's own attention
kernel with the same 4D mask as the padded path and gathers the output back. The cache layout, rollback and
compaction are untouched, and the cost of a verify pass follows sum(1 + l_r), the batch size of the DSpark
paper's cost model (Algorithm 1), as in its flattened variable-length kernels (section 5.3).

Two verifiers, chosen when the engine is built (`make_verifier`), never per forward: `PaddedVerifier` runs the
plain padded pass (the reference the packed one is tested against); `PackedVerifier` registers the packed
attention for the model's own kernel with transformers' AttentionInterface when it is constructed and points
the model at it once. That attention passes every forward that carries no packing (the prefill, a padded
verifier on the same model, any other caller) straight to the kernel it wraps, with that kernel's own mask
function, so nothing else the model runs changes.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import AttentionInterface, DynamicCache
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from pdraft.errors import PdraftError
from pdraft.models.api import DraftTree
from pdraft.targets.capture import capture_layers, stack_captured


@dataclass
class Features:
    """Target hidden states of newly committed tokens, in drafter-API layout."""

    hidden: torch.Tensor  # [batch, t, len(layer_ids) * hidden]
    positions: torch.Tensor  # [batch, t] long, absolute positions
    valid: torch.Tensor  # [batch, t] bool, False = padding (request had fewer new tokens)
    ids: torch.Tensor  # [batch, t] long, the token at each position


PACKED_ATTENTION = "pdraft_packed"


@dataclass
class _Pack:
    """How one packed row of N tokens maps onto the padded [rows, width] grid of a verify pass."""

    index: torch.Tensor  # [N] long: r * width + i of each packed token
    rows: int
    width: int
    cache: DynamicCache

    def unpack(self, t: torch.Tensor) -> torch.Tensor:
        """[1, H, N, D] -> [rows, H, width, D], zeros at padding."""
        flat = t[0].transpose(0, 1)  # [N, H, D]
        grid = flat.new_zeros(self.rows * self.width, *flat.shape[1:])
        grid[self.index] = flat
        return grid.view(self.rows, self.width, *flat.shape[1:]).transpose(1, 2)

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        """[rows, width, ...] -> [1, N, ...]: the real tokens only."""
        return t.reshape(self.rows * self.width, *t.shape[2:])[self.index].unsqueeze(0)


def _packed_attention(kernel, module, query, key, value, attention_mask, pdraft_pack: _Pack | None = None,
                      **kwargs):
    """Attention of a packed verify row: q/k/v [1, H, N, D] -> grid, cache update, `kernel` (the model's own)
    with the grid's 4D mask, output [1, N, H, D]. The model runs with cache=None, so k/v arrive here uncached.
    A forward without `pdraft_pack` is not a packed one: `kernel` runs exactly as the model would run it."""
    if pdraft_pack is None:
        return kernel(module, query, key, value, attention_mask, **kwargs)
    pack = pdraft_pack
    q, k, v = pack.unpack(query), pack.unpack(key), pack.unpack(value)  # [rows, H, width, D]
    k, v = pack.cache.update(k, v, module.layer_idx)  # [rows, H_kv, slots + width, D]
    out, _ = kernel(module, q, k, v, attention_mask, **kwargs)  # [rows, width, H, D]
    return pack.pack(out), None


def install_packed_attention(model: torch.nn.Module) -> str:
    """Register the packed attention around `model`'s own kernel and point the model at it, once; returns its
    name. The kernel's mask function is registered under that name too, so a forward that builds its mask from
    a 2D padding mask gets the mask it got before."""
    config = model.config
    current = config._attn_implementation or "eager"
    if current.startswith(PACKED_ATTENTION):
        return current
    if current == "eager":  # not in the registry: each family defines its eager function beside its attention
        layers = [m for m in model.modules() if hasattr(m, "layer_idx") and hasattr(m, "q_proj")]
        family = importlib.import_module(type(layers[0]).__module__) if layers else None
        kernel = getattr(family, "eager_attention_forward", None)
        if kernel is None:
            raise PdraftError(f"packed verification is not supported by {type(model).__name__}",
                              hint="set decode.packed_verify: false")
        name = f"{PACKED_ATTENTION}:eager:{family.__name__}"
    else:
        kernel = ALL_ATTENTION_FUNCTIONS[current]
        name = f"{PACKED_ATTENTION}:{current}"
    AttentionInterface.register(name, functools.partial(_packed_attention, kernel))
    if current in ALL_MASK_ATTENTION_FUNCTIONS:
        AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[current])
    config._attn_implementation = name
    return name


class TargetRunner:
    """Holds the target's KV cache for one batch of requests. Committed tokens x_0..x_{n-1} of a request have
    KV for x_0..x_{n-2} live in the cache; x_{n-1} (the anchor) enters it through the next verify pass. The
    verify pass itself is a subclass's: PaddedVerifier or PackedVerifier (`make_verifier`)."""

    packed = False

    def __init__(self, model: torch.nn.Module, layer_ids: Sequence[int] | None = None):
        self.model = model
        self.layer_ids = list(layer_ids) if layer_ids else None
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.max_positions = int(getattr(model.config, "max_position_embeddings", 1 << 30))
        self.cache = DynamicCache(config=model.config)
        self.valid = torch.zeros(0, 0, dtype=torch.bool, device=self.device)  # [batch, slots]
        self.pending: torch.Tensor | None = None  # [batch, Q] bool: real tokens of the last forward

    @property
    def slots(self) -> int:
        return self.valid.shape[1]

    def _mask(self, real: torch.Tensor, ancestors: torch.Tensor | None = None) -> torch.Tensor:
        """real [batch, Q] bool (real queries are a causal run, or a tree whose `ancestors` [batch, Q, Q] bool say
        which queries each one sees) -> additive mask [batch, 1, Q, slots + Q]."""
        q = real.shape[1]
        i = torch.arange(q, device=self.device).view(1, q, 1)
        j = torch.arange(q, device=self.device).view(1, 1, q)
        real_q = real.unsqueeze(2)  # [batch, Q, 1]
        sees = (j <= i) if ancestors is None else ancestors.to(self.device)
        new = (sees & real_q & real.unsqueeze(1)) | (j == i)  # [batch, Q, Q]
        old = self.valid.unsqueeze(1) & real_q  # [batch, Q, slots]
        allowed = torch.cat([old, new], dim=-1)
        mask = torch.zeros(allowed.shape, dtype=self.dtype, device=self.device)
        return mask.masked_fill_(~allowed, torch.finfo(self.dtype).min).unsqueeze(1)

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor, real: torch.Tensor, all_logits: bool,
                 ancestors: torch.Tensor | None = None):
        capture = capture_layers(self.model, self.layer_ids) if self.layer_ids else contextlib.nullcontext({})
        positions = positions.clamp(0, self.max_positions - 1)  # padding rows may run past the context
        with capture as captured:
            out = self.model(
                input_ids=ids,
                attention_mask=self._mask(real, ancestors),
                position_ids=positions,
                cache=self.cache,
                use_cache=True,
                logits_to_keep=0 if all_logits else 1,
            )
        hidden = stack_captured(captured, self.layer_ids) if self.layer_ids else None
        self.pending = real
        return out.logits, hidden

    def _packed_forward(self, ids: torch.Tensor, positions: torch.Tensor, real: torch.Tensor,
                        ancestors: torch.Tensor | None = None):
        """The verify pass on the real tokens only (module docstring); returns logits and features on the
        padded grid, zeros at padding, exactly like `_forward`."""
        rows, width = ids.shape
        index = real.flatten().nonzero().flatten()  # [N]
        mask = self._mask(real, ancestors)  # [rows, 1, width, slots + width]
        masks = {kind: mask for kind in set(getattr(self.model.config, "layer_types", None) or ["full_attention"])}
        capture = capture_layers(self.model, self.layer_ids) if self.layer_ids else contextlib.nullcontext({})
        positions = positions.clamp(0, self.max_positions - 1)
        with capture as captured:
            out = self.model(
                input_ids=ids.flatten()[index].unsqueeze(0),  # [1, N]
                attention_mask=masks,
                position_ids=positions.flatten()[index].unsqueeze(0),  # [1, N]
                cache=None,
                use_cache=False,
                logits_to_keep=0,
                pdraft_pack=_Pack(index, rows, width, self.cache),
            )
        self.pending = real

        def grid(t: torch.Tensor) -> torch.Tensor:  # [1, N, X] -> [rows, width, X]
            full = t.new_zeros(rows * width, t.shape[-1])
            full[index] = t[0]
            return full.view(rows, width, -1)

        hidden = grid(stack_captured(captured, self.layer_ids)) if self.layer_ids else None
        return grid(out.logits), hidden

    def prefill(self, prompts: Sequence[Sequence[int]]) -> Features:
        """Run x_0..x_{n-2} of every prompt (right-padded); the last prompt token becomes the first anchor."""
        batch = len(prompts)
        width = max(len(p) - 1 for p in prompts)
        self.valid = torch.zeros(batch, 0, dtype=torch.bool, device=self.device)
        ids = torch.zeros(batch, width, dtype=torch.long, device=self.device)
        for b, p in enumerate(prompts):
            ids[b, : len(p) - 1] = torch.tensor(list(p[:-1]), dtype=torch.long)
        lengths = torch.tensor([len(p) - 1 for p in prompts], device=self.device)
        positions = torch.arange(width, device=self.device).expand(batch, width)
        real = positions < lengths.unsqueeze(1)  # [batch, T]
        if width == 0:
            return Features(torch.zeros(batch, 0, 0), positions, real, ids)
        _, hidden = self._forward(ids, positions, real, all_logits=False)
        self._commit(real)
        return Features(hidden, positions, real, ids)

    def verify(
        self,
        anchors: torch.Tensor,  # [batch] long: last committed token
        anchor_positions: torch.Tensor,  # [batch] long
        drafts: torch.Tensor,  # [batch, L] long
        lengths: torch.Tensor,  # [batch] long: drafts to verify per request; -1 = finished, skip
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One target pass over [anchor, d_1..d_l] per request: logits [batch, L+1, vocab] and captured
        features [batch, L+1, F] (None without layer ids). Call `commit` with the accepted counts next."""
        # The engine's bookkeeping lives on the host and the drafts on the drafter's device: one move here.
        anchors, anchor_positions, drafts, lengths = (x.to(self.device) for x in (anchors, anchor_positions, drafts,
                                                                                  lengths))
        ids = torch.cat([anchors.unsqueeze(1), drafts], dim=1)  # [batch, L+1]
        offsets = torch.arange(ids.shape[1], device=self.device)
        positions = anchor_positions.unsqueeze(1) + offsets  # [batch, L+1]
        real = offsets.unsqueeze(0) <= lengths.unsqueeze(1)  # [batch, L+1]
        return self._verify(ids, positions, real)

    def verify_tree(self, anchors: torch.Tensor, anchor_positions: torch.Tensor, tree: DraftTree,
                    running: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One pass over [anchor, node_1..node_N] per running request ([batch] bool), node i at position anchor
        + depth_i, attending to the live context and to its ancestors: logits [batch, N+1, vocab], features
        [batch, N+1, F]. The nodes enter the cache as new slots; `commit_tree` keeps the path's live (the rest
        become holes, as a chain's rejected drafts do)."""
        dev = self.device
        running = running.to(dev)
        ids = torch.cat([anchors.to(dev).unsqueeze(1), tree.tokens.to(dev)], dim=1)  # [batch, N+1]
        depth = torch.cat([torch.zeros_like(tree.depth[:, :1]), tree.depth], dim=1).to(dev)
        positions = anchor_positions.to(dev).unsqueeze(1) + depth  # [batch, N+1]
        real = torch.cat([running.unsqueeze(1), tree.real.to(dev) & running.unsqueeze(1)], dim=1)
        return self._verify(ids, positions, real, tree.ancestors().to(dev))

    def commit_tree(self, path: torch.Tensor, accepted: torch.Tensor) -> torch.Tensor:
        """path [batch, D+1] (node indices of the kept path, the root first), accepted [batch]: the anchor and the
        path stay live, in position order (their slots are in node order, which is depth order). -> keep
        [batch, D+1] bool along the path, as `commit` returns it for a chain."""
        path, accepted = path.to(self.device), accepted.to(self.device)
        k = torch.arange(path.shape[1], device=self.device)
        keep = self.pending[:, 0].unsqueeze(1) & (k.unsqueeze(0) <= accepted.unsqueeze(1))  # [batch, D+1]
        on_path = torch.zeros(self.pending.shape, dtype=torch.long, device=self.device)
        on_path = on_path.scatter_add_(1, torch.where(keep, path, 0), keep.long()) > 0  # [batch, N+1]
        self._commit(self.pending & on_path)
        return keep

    def tree_room(self, anchor_positions: torch.Tensor) -> torch.Tensor:
        """[batch] long: most tree nodes each request can take (a DynamicCache grows: no limit but the budget)."""
        return torch.full((anchor_positions.shape[0],), 1 << 20, dtype=torch.long)

    def _verify(self, ids: torch.Tensor, positions: torch.Tensor, real: torch.Tensor,
                ancestors: torch.Tensor | None = None):
        raise NotImplementedError  # PaddedVerifier, PackedVerifier

    def commit(self, accepted: torch.Tensor) -> torch.Tensor:
        """accepted [batch] long: keep the anchor and the first a drafts of the last verify pass live. Returns
        that mask, [batch, L+1] bool (all False for a request the pass skipped)."""
        offsets = torch.arange(self.pending.shape[1], device=self.device)
        keep = self.pending & (offsets.unsqueeze(0) <= accepted.to(self.device).unsqueeze(1))
        self._commit(keep)
        return keep

    def _commit(self, keep: torch.Tensor) -> None:
        self.valid = torch.cat([self.valid, keep], dim=1)
        self.pending = None
        live_cols = self.valid.any(0).nonzero()
        end = int(live_cols.max()) + 1 if live_cols.numel() else 0
        if end < self.slots:  # rollback: drop slots no request uses any more
            self.cache.crop(end - self.slots)
            self.valid = self.valid[:, :end]
        live = int(self.valid.sum(1).max()) if self.slots else 0
        if self.slots > 2 * live + 32:
            self._compact(live)

    def _compact(self, live: int) -> None:
        """Gather every request's live slots to the right end, dropping holes left by shorter accepts."""
        order = torch.sort(self.valid.to(torch.int8), dim=1, stable=True).indices[:, self.slots - live :]
        self.valid = self.valid.gather(1, order)  # [batch, live]
        for layer in self.cache.layers:
            if getattr(layer, "keys", None) is None or layer.keys.numel() == 0:
                continue
            index = order.view(order.shape[0], 1, live, 1)
            layer.keys = layer.keys.gather(2, index.expand(-1, layer.keys.shape[1], -1, layer.keys.shape[3]))
            layer.values = layer.values.gather(
                2, index.expand(-1, layer.values.shape[1], -1, layer.values.shape[3])
            )


class PaddedVerifier(TargetRunner):
    """The verify pass over the padded [batch, L+1] grid: batch * (1 + max l) tokens."""

    def _verify(self, ids: torch.Tensor, positions: torch.Tensor, real: torch.Tensor, ancestors=None):
        return self._forward(ids, positions, real, all_logits=True, ancestors=ancestors)


class PackedVerifier(TargetRunner):
    """The verify pass over the real tokens only, sum(1 + l), through the packed attention registered here."""

    packed = True

    def __init__(self, model: torch.nn.Module, layer_ids: Sequence[int] | None = None):
        super().__init__(model, layer_ids)
        self.attention = install_packed_attention(model)

    def _verify(self, ids: torch.Tensor, positions: torch.Tensor, real: torch.Tensor, ancestors=None):
        if not bool(real.any()):  # every request has finished: nothing to pack
            return self._forward(ids, positions, real, all_logits=True, ancestors=ancestors)
        return self._packed_forward(ids, positions, real, ancestors)


def make_verifier(model: torch.nn.Module, layer_ids: Sequence[int] | None = None, *, packed: bool = True
                  ) -> TargetRunner:
    """The target side of a decode run, packed (the default) or padded: chosen here, once."""
    return (PackedVerifier if packed else PaddedVerifier)(model, layer_ids)
