"""The typed configuration of a DSpark drafter: the DFlash backbone (`DFlashConfig`) plus the sequential head
(Markov, DeepSpec's gated Markov, RNN, or none) and the confidence head. The DeepSpec layout
(pdraft/models/dspark/format.py) maps it onto `Qwen3DSparkModel`'s config.json."""

from __future__ import annotations

from dataclasses import dataclass

from pdraft.models.dflash.config import LIMITS, DFlashConfig
from pdraft.models.family import Limit

SEQUENTIAL_HEADS = ("markov", "gated", "rnn", "none")  # "gated" is DeepSpec's gated Markov variant
# markov_rank's one range, for the recipe key and the config.json field (0 there: no sequential head, as a
# DeepSpec-layout DFlash is written)
MARKOV_RANK = Limit(1, 4096, off=0)


@dataclass
class DSparkConfig(DFlashConfig):
    """A DSpark drafter: the DFlash backbone plus a sequential head and a confidence head."""

    sequential_head: str = "markov"  # "markov" (W1[x] W2), "gated", "rnn" (paper eq. 6) or "none"
    markov_rank: int = 256  # r: width of W1 rows (and of the RNN state)
    confidence_head: bool = True
    confidence_with_markov: bool = True  # eq. 7 input [h_k; W1[x_{k-1}]] instead of h_k alone

    kind = "dspark"
    model_type = "pdraft_dspark"
    limits = {**LIMITS, "markov_rank": MARKOV_RANK}

    @property
    def has_confidence(self) -> bool:
        return bool(self.confidence_head)

    @property
    def has_sequential_head(self) -> bool:
        return self.sequential_head != "none"

    def validate(self) -> None:
        super().validate()
        if self.sequential_head not in SEQUENTIAL_HEADS:
            self.bad(f"sequential_head must be one of {SEQUENTIAL_HEADS}, got {self.sequential_head!r}")
        if self.has_sequential_head and self.markov_rank == MARKOV_RANK.off:  # "no head" is for heads of "none"
            self.bad(f"markov_rank must be {MARKOV_RANK.low}..{MARKOV_RANK.high} with a sequential head, got "
                     f"{self.markov_rank}")
        if self.confidence_head and self.confidence_with_markov and not self.has_sequential_head:
            self.bad("confidence_with_markov needs a sequential head (it reads the head's W1 embedding)")

    def card_heads(self) -> str:
        return (f"; sequential head: {self.sequential_head}" + (f" (rank {self.markov_rank})" if self.has_sequential_head
                else "") + f"; confidence head: {'yes' if self.has_confidence else 'no'}")


__all__ = ["DSparkConfig", "SEQUENTIAL_HEADS"]
