"""A drafter's reduced draft vocabulary, shared by every family that has one (EAGLE-3, and DFlash / DSpark with
`draft_vocab_size`): which tokens it holds, the `d2t` / `t2d` buffers the engines read, and the two ways a
draft-vocabulary result reaches the target's vocabulary.

The vocabulary is the `size` most frequent tokens of the training responses (the loss-masked tokens of the
hidden-state cache), ties broken by the lower id, sorted by id: SpecForge's `generate_vocab_mapping_file`
(specforge/data/preprocessing.py) and speculators' `--draft-vocab-size` pick the same set (top-N token frequency
over the training data). Draft id i is target id `i + d2t[i]` (vLLM's `compute_logits` in llama_eagle3.py,
qwen3_dflash.py; `map_draft_to_target` in qwen3_dspark.py: `draft_ids + draft_id_to_target_id[draft_ids]`), and
`t2d[t]` says whether target id t is drafted (vLLM skips it; SpecForge's loss reads it)."""

from __future__ import annotations

import torch
from torch import nn


def draft_vocabulary(counts: torch.Tensor, size: int) -> torch.Tensor:
    """The `size` most frequent token ids of `counts` [vocab] (ties: the lower id), sorted ascending: the draft
    vocabulary, draft id i = target id out[i]."""
    vocab = counts.shape[0]
    order = sorted(range(vocab), key=lambda t: (-int(counts[t]), t))[:size]
    return torch.tensor(sorted(order), dtype=torch.long)


def register_vocab_buffers(module: nn.Module, draft_vocab: int, vocab: int) -> None:
    """`d2t` [V_d] long (offsets, all zero: the first V_d tokens until init_from_tokens) and `t2d` [V] bool, under
    the engines' names."""
    first = torch.arange(draft_vocab)
    module.register_buffer("d2t", torch.zeros(draft_vocab, dtype=torch.long))
    module.register_buffer("t2d", torch.zeros(vocab, dtype=torch.bool).index_fill(0, first, True))


def vocab_ids(d2t: torch.Tensor) -> torch.Tensor:
    """[V_d] long: the target id of every draft id (vLLM: arange + draft_id_to_target_id)."""
    return torch.arange(d2t.shape[0], device=d2t.device) + d2t


@torch.no_grad()
def choose_vocabulary(module: nn.Module, counts: torch.Tensor, head: nn.Linear, target_head: torch.Tensor | None):
    """Set `module`'s d2t / t2d to the draft vocabulary of `counts` [vocab] and start `head` [V_d, H] from the
    target head's rows of those tokens (`target_head` [V, H]; None: no target attached, the head stays as is)."""
    ids = draft_vocabulary(counts.cpu(), module.d2t.shape[0])  # [V_d]
    module.d2t.copy_(ids.to(module.d2t.device) - torch.arange(len(ids), device=module.d2t.device))
    module.t2d.zero_().index_fill_(0, ids.to(module.t2d.device), True)
    if target_head is not None:
        if hasattr(target_head, "full_tensor"):  # a tensor-parallel target's sharded head: every rank gathers it here
            target_head = target_head.full_tensor()
        head.weight.copy_(target_head[ids.to(target_head.device)].to(head.weight))


def spread_probs(q: torch.Tensor, vocab: torch.Tensor, size: int) -> torch.Tensor:
    """q [..., V_d] -> [..., V]: the same distribution in the target's vocabulary, exactly zero outside the draft
    vocabulary (what lossless verification needs of q)."""
    full = q.new_zeros(*q.shape[:-1], size)
    full[..., vocab] = q
    return full


def spread_logits(logits: torch.Tensor, vocab: torch.Tensor, size: int) -> torch.Tensor:
    """logits [..., V_d] -> [..., V] with -inf outside the draft vocabulary (vLLM's compute_logits)."""
    return logits.new_full((*logits.shape[:-1], size), float("-inf")).index_copy(-1, vocab, logits)


__all__ = ["draft_vocabulary", "register_vocab_buffers", "vocab_ids", "choose_vocabulary", "spread_probs",
           "spread_logits"]
