"""What one training step reads: sequences from the hidden-state cache or computed online by the target,
anchor positions sampled per sequence (paper 3.3, DeepSpec's `num_anchors`), and which block positions are
supervised.

An anchor is a position ``a`` whose token and next token are both response tokens (loss mask 1): the block
drafted from it predicts tokens ``a+1 .. a+G``, and position ``k`` is supervised only while ``a+k`` stays
inside the sequence and every earlier position was supervised (a contiguous prefix, as in DeepSpec). The
target distribution for the token at ``a+k`` comes from the target's last hidden state at ``a+k-1``.

Anchors are drawn from a generator seeded by (run seed, micro-batch number), so a resumed run draws exactly
the anchors the uninterrupted run would have drawn.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pdraft.cache.reader import pad_stack
from pdraft.errors import PdraftError


def micro_generator(seed: int, micro_index: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed((seed * 1_000_003 + micro_index) % (2**63 - 1))
    return g


def sample_anchors(loss_mask: torch.Tensor, num_anchors: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """loss_mask [batch, S] bool -> anchors [batch, N] long (sorted), keep [batch, N] bool.

    Each sequence draws up to N distinct valid anchors uniformly; sequences with fewer valid anchors get
    dummy anchors (position 0) masked out by `keep`."""
    b, s = loss_mask.shape
    if s < 2:
        return torch.zeros(b, num_anchors, dtype=torch.long), torch.zeros(b, num_anchors, dtype=torch.bool)
    valid = loss_mask[:, :-1] & loss_mask[:, 1:]  # [batch, S-1]
    scores = torch.rand(b, s - 1, generator=generator)
    scores = torch.where(valid, scores, torch.full_like(scores, 2.0))  # invalid ones sort last
    order = scores.argsort(dim=1)[:, :num_anchors]  # [batch, <=N]
    counts = valid.sum(1).clamp(max=num_anchors)
    n = order.shape[1]
    keep = torch.arange(n)[None, :] < counts[:, None]
    anchors = torch.where(keep, order, torch.zeros_like(order))
    if n < num_anchors:
        pad = num_anchors - n
        anchors = torch.cat([anchors, torch.zeros(b, pad, dtype=torch.long)], 1)
        keep = torch.cat([keep, torch.zeros(b, pad, dtype=torch.bool)], 1)
    # sort kept anchors ascending (dummies stay at the end)
    key = torch.where(keep, anchors, torch.full_like(anchors, s + 1))
    idx = key.argsort(dim=1)
    return anchors.gather(1, idx), keep.gather(1, idx)


def supervised_mask(anchors: torch.Tensor, keep: torch.Tensor, loss_mask: torch.Tensor, gamma: int) -> torch.Tensor:
    """[batch, N, G] bool: block position k (1-based) of each anchor is trained on (a contiguous prefix)."""
    b, s = loss_mask.shape
    lab = anchors[:, :, None] + torch.arange(1, gamma + 1, device=anchors.device)  # [batch, N, G]
    inside = lab < s
    lm = torch.gather(loss_mask[:, None, :].expand(b, anchors.shape[1], s), 2, lab.clamp(max=s - 1))
    ok = inside & lm & keep[:, :, None]
    return ok.int().cumprod(dim=-1).bool()


@dataclass
class Batch:
    input_ids: torch.Tensor  # [batch, S] long
    loss_mask: torch.Tensor  # [batch, S] bool (False on padding)
    features: torch.Tensor  # [batch, S, n_layers * hidden]
    last_hidden: torch.Tensor  # [batch, S, hidden] target's final-norm output


class CacheSource:
    """Sequences from a hidden-state cache written by `pdraft export-hidden`."""

    online = False

    def __init__(self, cache):
        self.cache = cache
        if len(cache) == 0:
            raise PdraftError(f"the hidden-state cache {getattr(cache, 'folder', '')} holds no sequences")

    def __len__(self) -> int:
        return len(self.cache)

    def token_counts(self, indices: list[int], vocab: int) -> torch.Tensor:
        """[vocab] long: how often each token occurs among the responses (loss-mask tokens) of `indices`."""
        return _count([self.cache.response_ids(i) for i in indices], vocab)

    def batch(self, indices: list[int], device: torch.device, dtype: torch.dtype) -> Batch:
        items = [self.cache[i] for i in indices]
        return Batch(
            input_ids=pad_stack([it["input_ids"].long() for it in items]).to(device),
            loss_mask=pad_stack([it["loss_mask"].bool() for it in items], False).to(device),
            features=pad_stack([it["target_hidden_states"] for it in items]).to(device, dtype),
            last_hidden=pad_stack([it["target_last_hidden_states"] for it in items]).to(device, dtype),
        )


class OnlineSource:
    """Sequences tokenised in memory; the target computes their features on the fly (train.online)."""

    online = True

    def __init__(self, target, sequences):
        self.target = target
        self.sequences = list(sequences)
        if not self.sequences:
            raise PdraftError("the training data holds no sequences")

    def __len__(self) -> int:
        return len(self.sequences)

    def token_counts(self, indices: list[int], vocab: int) -> torch.Tensor:
        """[vocab] long: how often each token occurs among the responses (loss-mask tokens) of `indices`."""
        seqs = [self.sequences[i] for i in indices]
        return _count([torch.tensor(s.input_ids, dtype=torch.long)[torch.tensor(s.loss_mask, dtype=torch.bool)]
                       for s in seqs], vocab)

    def batch(self, indices: list[int], device: torch.device, dtype: torch.dtype) -> Batch:
        from pdraft.cache.writer import target_states  # the exporter's forward: both paths see the same tensors

        seqs = [self.sequences[i] for i in indices]
        ids = pad_stack([torch.tensor(s.input_ids, dtype=torch.long) for s in seqs]).to(device)
        mask = pad_stack([torch.tensor(s.loss_mask, dtype=torch.bool) for s in seqs], False).to(device)
        attn = pad_stack([torch.ones(len(s.input_ids), dtype=torch.long) for s in seqs]).to(device)
        features, last = target_states(self.target, ids, attention_mask=attn)
        return Batch(input_ids=ids, loss_mask=mask, features=features.to(dtype), last_hidden=last.to(dtype))


def _count(responses: list[torch.Tensor], vocab: int) -> torch.Tensor:
    ids = torch.cat(responses) if responses else torch.zeros(0, dtype=torch.long)
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
        raise PdraftError(f"the training responses hold token ids outside the vocabulary (0..{vocab - 1})")
    return torch.bincount(ids, minlength=vocab)


def split_validation(n: int, fraction: float = 0.05, max_count: int = 64) -> tuple[list[int], list[int]]:
    """A fixed split of sequence indices into (train, validation): every k-th sequence validates."""
    if n < 2:
        return list(range(n)), []
    count = max(1, min(max_count, int(n * fraction)))
    stride = n // count
    val = set(range(stride - 1, n, stride)[:count])
    return [i for i in range(n) if i not in val], sorted(val)
