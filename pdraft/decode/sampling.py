"""The token-distribution transform (temperature, then top-k, then top-p) of the target side of verification.
Order and semantics follow the common serving convention (vLLM, HF): top-k keeps the k most likely tokens,
top-p keeps the smallest set of most likely tokens whose mass reaches p (the most likely token always
survives). pdraft.models.sampling (the drafters' copy, same semantics) replaces this one at merge: the engine
only calls `sampling_probs`, `is_greedy` and `check_sampling` from here."""

from __future__ import annotations

import torch

from pdraft.errors import PdraftError
from pdraft.models.api import SamplingParams


def is_greedy(sampling: SamplingParams | None) -> bool:
    return sampling is None or sampling.temperature <= 0.0


def check_sampling(sampling: SamplingParams | None) -> None:
    if sampling is None:
        return
    if sampling.temperature < 0:
        raise PdraftError(f"temperature must be >= 0, got {sampling.temperature}")
    if sampling.top_k < 0:
        raise PdraftError(f"top-k must be >= 0 (0 = off), got {sampling.top_k}")
    if not 0.0 < sampling.top_p <= 1.0:
        raise PdraftError(f"top-p must be in (0, 1], got {sampling.top_p}")


def probs_from_logits(
    logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0
) -> torch.Tensor:
    """logits [..., vocab] -> float32 probabilities [..., vocab]. temperature 0 gives the one-hot argmax."""
    logits = logits.float()
    if temperature <= 0.0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    logits = logits / temperature
    vocab = logits.shape[-1]
    if 0 < top_k < vocab:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]  # [..., 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs  # exclusive cumulative mass
        drop_sorted = mass_before >= top_p  # the first token always has mass_before 0 and survives
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sampling_probs(logits: torch.Tensor, sampling: SamplingParams | None) -> torch.Tensor:
    if sampling is None:
        return probs_from_logits(logits, 0.0)
    return probs_from_logits(logits, sampling.temperature, sampling.top_k, sampling.top_p)
