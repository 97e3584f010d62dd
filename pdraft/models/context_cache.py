"""The drafter's context cache, preallocated and indexed by position: the keys and values every draft layer
projects from the target features of committed tokens, in two tensors [layers, batch, kv_heads, capacity + 1,
head_dim] allocated once per decode run, and `lengths` [batch], how many context positions of each request are
committed.

Slot j of row b holds the context entry of position j of the request in row b, exactly as the target's
static KV cache (pdraft.decode.static_target) holds its keys: an entry is written at its position, a query
reads the slots below `lengths`, so rolling back is setting a length, and a finished request's row can take a
new request (continuous batching) without clearing anything. The one extra slot (`scratch`, index
`capacity`) takes the writes of padding entries, so a write never needs a data-dependent shape (what
compiled code and CUDA graphs need) and can never land on a committed slot; no query reads it. A drafter that
keeps its own KV cache over gamma sequential passes (EAGLE-3) writes its drafted positions the same way and,
after verification, sets `lengths` to the committed length: the accepted entries are then recomputed from
the target's features by its next pass, the rejected ones are overwritten.

Given no capacity (a direct `draft_step`, tests), the cache grows geometrically the way the list cache before
it did; the engine always gives the run's capacity, so decoding never reallocates.
"""

from __future__ import annotations

import torch

from pdraft.models.api import DraftState


class ContextCache(DraftState):
    """keys, values [layers, batch, kv_heads, capacity + 1, head_dim]; `keys[i]` is layer i's [batch, kv_heads,
    capacity + 1, head_dim], so code written for DraftState's per-layer lists reads it unchanged."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, lengths: torch.Tensor):
        super().__init__(keys=keys, values=values, lengths=lengths)

    @classmethod
    def allocate(cls, layers: int, batch: int, kv_heads: int, head_dim: int, capacity: int, *,
                 dtype: torch.dtype, device: torch.device) -> ContextCache:
        shape = (layers, batch, kv_heads, capacity + 1, head_dim)
        return cls(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device),
                   torch.zeros(batch, dtype=torch.long, device=device))

    @property
    def capacity(self) -> int:
        return self.keys.shape[3] - 1

    def write(self, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor, valid: torch.Tensor) -> None:
        """keys/values [layers, batch, kv_heads, t, head_dim] of t new entries per request at `positions`
        [batch, t]; `valid` [batch, t] bool marks the real ones, a prefix of each row that continues the
        committed context (the engine's contract). Padding goes to the scratch slot."""
        b, t = positions.shape
        if b == 1 and self.keys.device.type == "cpu" and self._write_run(keys, values, positions, valid):
            return
        need = int((self.lengths + valid.sum(1)).max()) if b else 0
        if need > self.capacity:
            self._grow(max(need, 2 * self.capacity))
        slots = torch.where(valid, positions, torch.full_like(positions, self.capacity))  # [batch, t]
        rows = torch.arange(b, device=positions.device)[:, None].expand(b, t)
        # [layers, batch, kv, t, d] -> indexed as [batch, t] pairs: [batch, t, layers, kv, d]
        self.keys[:, rows, :, slots] = keys.permute(1, 3, 0, 2, 4).to(self.keys.dtype)
        self.values[:, rows, :, slots] = values.permute(1, 3, 0, 2, 4).to(self.values.dtype)
        self.lengths = self.lengths + valid.sum(1)

    def _write_run(self, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor, valid: torch.Tensor
                   ) -> bool:
        """One request's entries, all real, at the positions right after its committed ones and within capacity
        (every decode round at batch 1): written as two slice copies instead of the indexed scatter's dozen
        operations (a fifth of a drafter's context extension on a CPU, issue 38). False, writing nothing, for any
        other case."""
        t = positions.shape[1]
        start = int(self.lengths[0])
        if start + t > self.capacity or not bool(valid.all()):
            return False
        if not torch.equal(positions[0], torch.arange(start, start + t, device=positions.device)):
            return False
        self.keys[:, 0, :, start:start + t] = keys[:, 0]
        self.values[:, 0, :, start:start + t] = values[:, 0]
        self.lengths = self.lengths + t
        return True

    def _grow(self, capacity: int) -> None:
        grow = capacity - self.capacity
        pad = lambda x: torch.cat([x[:, :, :, :-1], x.new_zeros(*x.shape[:3], grow + 1, x.shape[4])], dim=3)  # noqa: E731
        self.keys, self.values = pad(self.keys), pad(self.values)

    def truncate(self, lengths: torch.Tensor) -> None:
        """Roll back to `lengths` [batch] committed entries (never beyond what is written)."""
        self.lengths = torch.minimum(self.lengths, lengths.to(self.lengths.device))

    def place(self, rows: torch.Tensor, other: ContextCache) -> None:
        """Rows `rows` [k] become `other`'s k requests (continuous batching: a slot takes a new request whose
        context was built in a state of its own, allocated for the same capacity)."""
        if other.keys.shape[3] != self.keys.shape[3]:
            raise RuntimeError(f"internal: placing a context of capacity {other.capacity} into one of "
                               f"{self.capacity}")
        rows = rows.to(self.lengths.device)
        self.keys[:, rows] = other.keys.to(self.keys.dtype)
        self.values[:, rows] = other.values.to(self.values.dtype)
        self.lengths = self.lengths.index_copy(0, rows, other.lengths)

    def select(self, rows: torch.Tensor) -> ContextCache:
        rows = rows.to(self.lengths.device)
        return ContextCache(self.keys.index_select(1, rows), self.values.index_select(1, rows),
                            self.lengths.index_select(0, rows))
