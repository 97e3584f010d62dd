"""EAGLE-3's vocabulary maps, checked as one rule (issue 45, class 3): `d2t` [draft_vocab] (target id = draft id +
d2t[draft id], vLLM's llama_eagle3.py `compute_logits`; SpecForge writes it from the sorted used tokens) and
`t2d` [vocab] (True where a target id has a draft id; vLLM skips it on load, SGLang reads it). A map from a file
is input: an id outside the target's vocabulary crashes the embedding, and a many-to-one map decodes without a
word while the sampled q it builds puts two draft probabilities on one target token (q no longer sums to the
draft's distribution, so sampled decoding stops following the target). `check_vocab_map` refuses, in one line
each: a map of the wrong length or of a non-integer dtype (load_state_dict would cast 1.5 to 1 silently), a
target id outside [0, vocab), two draft ids onto one target id, and a `t2d` that does not mark exactly the ids
`d2t` maps to. Drafters call it as their weights load (pdraft.models.checkpoint.load_drafter, so decode, bench,
export and pull) and before they are written (save_drafter)."""

from __future__ import annotations

import torch

from pdraft.errors import PdraftError


def check_vocab_map(d2t: torch.Tensor, t2d: torch.Tensor, vocab_size: int, draft_vocab_size: int, where: str) -> None:
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
        raise PdraftError(f"{where}: t2d {say} target id {k}, which d2t {'does not map to' if bool(flags[k]) else 'maps to'}; "
                          f"t2d must mark exactly the {draft_vocab_size} target ids of d2t")


__all__ = ["check_vocab_map"]
