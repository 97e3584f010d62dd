"""A drafter's reduced draft vocabulary, shared by every family that has one (EAGLE-3, and DFlash / DSpark with
`draft_vocab_size`): which tokens it holds, the `d2t` / `t2d` buffers the engines read, and the two ways a
draft-vocabulary result reaches the target's vocabulary.

The vocabulary is the `size` most frequent tokens of the training responses (the loss-masked tokens of the
hidden-state cache), ties broken by the lower id, sorted by id: SpecForge's `generate_vocab_mapping_file`
(specforge/data/preprocessing.py) and speculators' `--draft-vocab-size` pick the same set (top-N token frequency
over the training data). Draft id i is target id `i + d2t[i]` (vLLM's `compute_logits` in llama_eagle3.py,
qwen3_dflash.py; `map_draft_to_target` in qwen3_dspark.py: `draft_ids + draft_id_to_target_id[draft_ids]`), and
`t2d[t]` says whether target id t is drafted (vLLM skips it; SpecForge's loss reads it).

The maps from a file are input, checked as one rule for every family (issue 45, class 3; moved here from EAGLE-3's
folder, issue 40): an id outside the target's vocabulary crashes the embedding, and a many-to-one map decodes
without a word while the sampled q it builds puts two draft probabilities on one target token (q no longer sums to
the draft's distribution, so sampled decoding stops following the target). `check_vocab_map` refuses, in one
line each: a map of the wrong length or of a non-integer dtype (load_state_dict would cast 1.5 to 1 silently), a
target id outside [0, vocab), two draft ids onto one target id, and a `t2d` that does not mark exactly the ids
`d2t` maps to. Drafters call it as their weights load (pdraft.models.checkpoint.load_drafter, so decode, bench,
export and pull) and before they are written (save_drafter)."""

from __future__ import annotations

import torch
from torch import nn

from pdraft.errors import PdraftError


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


def check_vocab_map(d2t: torch.Tensor, t2d: torch.Tensor, vocab_size: int, draft_vocab_size: int,
                    where: str) -> None:
    """Refuse, in one line naming `where`, vocabulary maps that cannot be used (the module docstring's rule)."""
    if tuple(d2t.shape) != (draft_vocab_size,):
        raise PdraftError(f"{where}: d2t has shape {tuple(d2t.shape)}, expected ({draft_vocab_size},): one offset "
                          f"per draft id")
    if tuple(t2d.shape) != (vocab_size,):
        raise PdraftError(f"{where}: t2d has shape {tuple(t2d.shape)}, expected ({vocab_size},): one flag per "
                          f"target id")
    if d2t.is_floating_point() or d2t.is_complex() or d2t.dtype == torch.bool:
        raise PdraftError(f"{where}: d2t has dtype {str(d2t.dtype).removeprefix('torch.')}, expected an integer "
                          f"dtype (int64): target id = draft id + d2t[draft id]")
    if t2d.is_floating_point() or t2d.is_complex():
        raise PdraftError(f"{where}: t2d has dtype {str(t2d.dtype).removeprefix('torch.')}, expected bool")
    target_ids = torch.arange(draft_vocab_size, dtype=torch.long) + d2t.detach().to("cpu", torch.long)
    outside = (target_ids < 0) | (target_ids >= vocab_size)
    if bool(outside.any()):
        i = int(outside.nonzero()[0])
        raise PdraftError(f"{where}: d2t maps draft id {i} to target id {int(target_ids[i])}, outside the target's "
                          f"vocabulary [0, {vocab_size}) ({int(outside.sum())} such ids)")
    ordered, order = target_ids.sort()
    repeated = ordered[1:] == ordered[:-1]
    if bool(repeated.any()):
        j = int(repeated.nonzero()[0])
        a, b = sorted((int(order[j]), int(order[j + 1])))
        raise PdraftError(f"{where}: d2t maps draft ids {a} and {b} both to target id {int(ordered[j])}; the map must "
                          f"be one-to-one (a many-to-one map puts two draft probabilities on one target token)")
    flags = t2d.detach().to("cpu")
    if flags.dtype != torch.bool and bool(((flags != 0) & (flags != 1)).any()):
        raise PdraftError(f"{where}: t2d holds values other than 0 and 1, expected a bool mask")
    flags = flags.bool()
    expected = torch.zeros(vocab_size, dtype=torch.bool).index_fill_(0, target_ids, True)
    if not torch.equal(flags, expected):
        k = int((flags != expected).nonzero()[0])
        say = "marks" if bool(flags[k]) else "does not mark"
        which = "does not map to" if bool(flags[k]) else "maps to"
        raise PdraftError(f"{where}: t2d {say} target id {k}, which d2t {which}; "
                          f"t2d must mark exactly the {draft_vocab_size} target ids of d2t")


__all__ = ["check_vocab_map", "choose_vocabulary", "draft_vocabulary", "register_vocab_buffers", "spread_logits",
           "spread_probs", "vocab_ids"]
