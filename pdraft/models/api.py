"""The drafter runtime API: the contract between the drafter models (pdraft/models/) and the decoding engine
(pdraft/decode/). This copy follows /work/briefs/drafter_api.md to the letter so the engine can be built and
tested before the real drafters land; the drafter-models branch owns this module and replaces it at merge."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class SamplingParams:
    """How tokens are drawn. temperature == 0 (or None params) means greedy."""

    temperature: float = 0.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1.0 = off


@dataclass
class Proposal:
    tokens: torch.Tensor  # [batch, gamma] long: the drafted tokens
    # [batch, gamma, vocab] float32: the exact distribution each draft token was sampled from (after
    # temperature/top-k/top-p and, for DSpark, after the sequential head). None when greedy.
    probs: torch.Tensor | None
    # [batch, gamma] raw confidence LOGITS (DSpark with a confidence head); position k =
    # P(k survives | 1..k-1 survived). None otherwise.
    confidence: torch.Tensor | None


class DraftState:
    """Per-batch incremental drafter context (projected context features' per-layer keys/values for every
    committed token whose target hidden states are known, plus per-request lengths). Opaque to the engine."""


class Drafter(torch.nn.Module):
    """What DFlashDrafter and DSparkDrafter implement. `config` has at least: kind ("dflash"|"dspark"),
    block_size, target_layer_ids (id i = transformers hidden_states[i+1]), mask_token_id, block_convention
    ("deepspec"|"zlab"), denoise_steps, has_confidence, hidden_size, vocab_size."""

    config: Any

    def attach_target(self, target_model: torch.nn.Module) -> None:
        raise NotImplementedError

    def max_gamma(self) -> int:
        raise NotImplementedError

    def new_state(self, batch_size: int) -> DraftState:
        raise NotImplementedError

    def extend_context(
        self,
        state: DraftState,
        target_hidden: torch.Tensor,  # [batch, t, len(target_layer_ids) * target_hidden_size]
        positions: torch.Tensor,  # [batch, t] long
        valid: torch.Tensor | None = None,  # [batch, t] bool, False = padding
    ) -> None:
        raise NotImplementedError

    def crop_context(self, state: DraftState, lengths: torch.Tensor) -> None:  # lengths: [batch] long
        raise NotImplementedError

    def propose(
        self,
        state: DraftState,
        anchor_ids: torch.Tensor,  # [batch] long
        anchor_positions: torch.Tensor,  # [batch] long
        gamma: int,
        sampling: SamplingParams | None = None,
        generator: torch.Generator | None = None,
    ) -> Proposal:
        raise NotImplementedError
