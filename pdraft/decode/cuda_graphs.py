"""CUDA graphs for the two passes of a speculative round, at fixed shapes: the drafter's propose pass and the
target's verify pass, each captured once per (batch bucket, gamma) and replayed every round, so a round costs
two graph launches instead of hundreds of kernel launches from Python. Used only where CUDA is present; on a
CPU machine this module imports, `available()` is False, `why_unavailable()` says why, and building a graph
raises PdraftError.

What the graphs assume (they are only correct under these conditions):
- Static shapes: batch B (pad a smaller batch up to its bucket, see `bucket`), gamma, and every request verifies
  all gamma drafts (fixed query length gamma + 1; acceptance then keeps a prefix, so lossless decoding holds).
- Static KV capacity, allocated before capture and never reallocated: the drafter's DraftState comes from
  `static_draft_state` (extend_context only writes in place while it stays within capacity; a graph checks the
  buffers' addresses on every replay), and the target uses a transformers StaticCache of `capacity` slots,
  shared slot indices across the batch with a per-request `valid` mask (dead slots are holes, as in
  pdraft/decode/target_runner.py). A request whose context would pass `capacity` must leave the graphed path.
- No host synchronisation inside a round except reading the accepted lengths after verification: the write
  position of the verify pass (`start`), the valid mask and the target cache's fill level live on the device and
  are updated by `GraphedVerify.commit` with device ops only.
- Sampling inside a graph draws from the default CUDA generator (graph-safe Philox offsets); a custom
  torch.Generator is not captured. Greedy decoding uses no randomness.
- Inputs are copied into static buffers before each replay and outputs are the graph's static buffers: read or
  clone them before the next replay."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pdraft.errors import PdraftError
from pdraft.models.api import DraftState, Proposal, SamplingParams

BUCKETS = (1, 2, 4, 8, 16, 32, 64)


def available() -> bool:
    return torch.cuda.is_available()


def why_unavailable() -> str | None:
    """None when graphs can be captured here, else the reason in one line."""
    if not torch.cuda.is_available():
        return "CUDA graphs need a CUDA device; this machine has none (torch %s)" % torch.__version__
    return None


def _require_cuda(what: str) -> None:
    reason = why_unavailable()
    if reason is not None:
        raise PdraftError(f"{what}: {reason}", hint="run without CUDA graphs (the eager path is the default)")


def bucket(batch: int) -> int:
    """The captured batch size a batch of `batch` requests runs in (padded up)."""
    for b in BUCKETS:
        if batch <= b:
            return b
    raise PdraftError(f"batch {batch} is larger than the largest CUDA-graph bucket {BUCKETS[-1]}")


def _capture(fn, warmup: int = 2):
    """Warm `fn` up on a side stream (as torch requires before capture), then capture it; returns (graph, out)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


# ---- draft pass --------------------------------------------------------------------------------------------
def static_draft_state(drafter, batch: int, capacity: int) -> DraftState:
    """A DraftState whose KV buffers already hold `capacity` context slots, so that extend_context writes in
    place (it grows buffers only when a request's length would pass their capacity)."""
    state = drafter.new_state(batch)
    state.keys = [torch.nn.functional.pad(k, (0, 0, 0, capacity)) for k in state.keys]
    state.values = [torch.nn.functional.pad(v, (0, 0, 0, capacity)) for v in state.values]
    return state


class GraphedPropose:
    """drafter.propose(state, anchors, positions, gamma, sampling) captured for one (batch, gamma, capacity).
    `replay` takes the live DraftState (from `static_draft_state`, same buffers as at capture) and returns a
    Proposal of static output buffers."""

    def __init__(self, drafter, state: DraftState, gamma: int, sampling: SamplingParams | None = None,
                 warmup: int = 2):
        _require_cuda("GraphedPropose")
        self.drafter, self.gamma, self.sampling = drafter, int(gamma), sampling
        self.batch = state.batch_size
        dev = state.lengths.device
        self._ptrs = [t.data_ptr() for t in state.keys + state.values]
        self.capacity = state.keys[0].shape[2]
        # The graph reads lengths, anchors and positions from these buffers; the KV buffers are the state's own.
        self.state = DraftState(keys=state.keys, values=state.values, lengths=state.lengths.clone())
        self.anchors = torch.zeros(self.batch, dtype=torch.long, device=dev)
        self.positions = torch.zeros(self.batch, dtype=torch.long, device=dev)
        saved = self.state.lengths.clone()
        self.graph, self.out = _capture(lambda: drafter.propose(self.state, self.anchors, self.positions, self.gamma,
                                                                sampling, None), warmup)
        self.state.lengths.copy_(saved)

    def replay(self, state: DraftState, anchor_ids: torch.Tensor, anchor_positions: torch.Tensor) -> Proposal:
        if [t.data_ptr() for t in state.keys + state.values] != self._ptrs:
            raise PdraftError("the draft state's KV buffers were reallocated since capture (context grew past the "
                              f"static capacity {self.capacity}): recapture with a larger capacity")
        self.state.lengths.copy_(state.lengths, non_blocking=True)
        self.anchors.copy_(anchor_ids.reshape(self.batch), non_blocking=True)
        self.positions.copy_(anchor_positions.reshape(self.batch), non_blocking=True)
        self.graph.replay()
        return self.out


# ---- verify pass -------------------------------------------------------------------------------------------
@dataclass
class VerifyOut:
    logits: torch.Tensor  # [batch, gamma + 1, vocab] static buffer
    hidden: torch.Tensor | None  # [batch, gamma + 1, len(layer_ids) * hidden] static buffer, or None


class GraphedVerify:
    """The target's verify pass over [anchor, d_1..d_gamma] for a batch, on a StaticCache of `capacity` slots.
    Slots are shared by the batch: every pass writes gamma + 1 slots at `start` (a device scalar); `valid`
    [batch, capacity] says which slots each request may attend to. `prefill` runs eagerly; `verify` replays."""

    def __init__(self, model, batch: int, gamma: int, capacity: int, layer_ids=None, warmup: int = 2):
        _require_cuda("GraphedVerify")
        from transformers import StaticCache

        self.model, self.batch, self.q = model, int(batch), int(gamma) + 1
        self.capacity = int(capacity)
        self.layer_ids = list(layer_ids) if layer_ids else None
        param = next(model.parameters())
        dev, self.dtype = param.device, param.dtype
        self.cache = StaticCache(config=model.config, max_cache_len=self.capacity)
        self.valid = torch.zeros(self.batch, self.capacity, dtype=torch.bool, device=dev)  # [batch, capacity]
        self.start = torch.zeros((), dtype=torch.long, device=dev)  # next write slot (device scalar)
        self.ids = torch.zeros(self.batch, self.q, dtype=torch.long, device=dev)
        self.positions = torch.zeros(self.batch, self.q, dtype=torch.long, device=dev)
        self._slots = torch.arange(self.capacity, device=dev)
        self._offsets = torch.arange(self.q, device=dev)
        self.graph = None
        self._warmup = warmup

    def _mask(self, real: torch.Tensor, q: int) -> torch.Tensor:
        """Additive mask [batch, 1, q, capacity]: committed live slots, plus the new slots start..start+q-1
        causally (the new slots are real for real queries only)."""
        rel = self._slots[None, :] - self.start  # [1, capacity]
        new = (rel >= 0) & (rel <= torch.arange(q, device=rel.device)[:, None])  # [q, capacity]
        allowed = (self.valid[:, None, :] | new[None]) & real[:, :, None]  # [batch, q, capacity]
        allowed = allowed | ((rel == torch.arange(q, device=rel.device)[:, None])[None])  # own slot: no empty row
        mask = torch.zeros(allowed.shape, dtype=self.dtype, device=allowed.device)
        return mask.masked_fill_(~allowed, torch.finfo(self.dtype).min).unsqueeze(1)

    def _set_fill(self) -> None:
        for layer in self.cache.layers:
            if getattr(layer, "is_initialized", False):
                layer.cumulative_length.copy_(self.start)

    def _forward(self, ids, positions, real):
        import contextlib

        from pdraft.target.layers import capture_layers, stack_captured

        cap = capture_layers(self.model, self.layer_ids) if self.layer_ids else contextlib.nullcontext({})
        with cap as captured:
            out = self.model(input_ids=ids, attention_mask=self._mask(real, ids.shape[1]), position_ids=positions,
                             cache=self.cache, use_cache=True)
        hidden = stack_captured(captured, self.layer_ids) if self.layer_ids else None
        return VerifyOut(out.logits, hidden)

    @torch.no_grad()
    def prefill(self, ids: torch.Tensor, lengths: torch.Tensor) -> VerifyOut:
        """Eager: right-padded ids [batch, T] with lengths [batch] (x_0..x_{n-2} of each prompt, as
        TargetRunner.prefill) written at slots start..start+T-1."""
        t = ids.shape[1]
        if int(self.start) + t + self.q > self.capacity:
            raise PdraftError(f"prefill of {t} tokens does not fit the static capacity {self.capacity}")
        real = torch.arange(t, device=ids.device)[None, :] < lengths[:, None]
        positions = torch.arange(t, device=ids.device).expand(self.batch, t)
        self._set_fill()
        out = self._forward(ids, positions, real)
        self.valid[:, int(self.start): int(self.start) + t] = real
        self.start += t
        self._set_fill()
        return out

    def _replayable(self) -> VerifyOut:
        # Part of the graph: reset the cache's fill level to `start` first, so every warm-up run and every
        # replay writes at start..start+q-1 whatever the previous pass left behind.
        self._set_fill()
        real = torch.ones(self.batch, self.q, dtype=torch.bool, device=self.ids.device)
        return self._forward(self.ids, self.positions, real)

    @torch.no_grad()
    def verify(self, anchors: torch.Tensor, anchor_positions: torch.Tensor, drafts: torch.Tensor) -> VerifyOut:
        """anchors [batch], anchor_positions [batch], drafts [batch, gamma] -> static logits (and features). The
        caller keeps start + gamma + 1 <= capacity (it knows the committed lengths on the host)."""
        self.ids[:, 0].copy_(anchors, non_blocking=True)
        self.ids[:, 1:].copy_(drafts, non_blocking=True)
        self.positions.copy_(anchor_positions[:, None] + self._offsets, non_blocking=True)
        if self.graph is None:
            saved_valid, saved_start = self.valid.clone(), self.start.clone()
            self.graph, self.out = _capture(self._replayable, self._warmup)
            self.valid.copy_(saved_valid)
            self.start.copy_(saved_start)
        self.graph.replay()
        return self.out

    @torch.no_grad()
    def commit(self, accepted: torch.Tensor) -> None:
        """accepted [batch] long (device): keep the anchor and the first accepted[b] drafts of the last verify
        pass live; device ops only. The next pass writes after the longest kept run (shorter ones leave holes)."""
        keep = self._offsets[None, :] <= accepted[:, None]  # [batch, q]
        cols = self.start + self._offsets  # [q]
        self.valid.index_copy_(1, cols.clamp(max=self.capacity - 1), keep)
        self.start += accepted.max() + 1
        self._set_fill()
