"""A static confidence threshold t: request r verifies its longest prefix whose *cumulative* survival
probability a_{r,j} = prod_{i<=j} sigmoid(c_{r,i}) stays >= t. We use the cumulative product, not each
position's own score, because the confidence head models P(k survives | 1..k-1 survived) (DSpark paper eq. 7-8),
so the product is the probability that the whole prefix survives, the quantity the paper calibrates with STS
and that DeepSpec's evaluator scores; since it only decreases with j, "longest prefix with a_j >= t" and "stop
at the first position below t" are the same rule, and the decision to verify position j reads nothing drafted
after it. t = 0 verifies the whole block."""

from __future__ import annotations

import torch

from pdraft.policies import THRESHOLD
from pdraft.policies.base import VerifyPolicy, admitted_survival
from pdraft.models.api import Proposal


def threshold_lengths(prefix_survival: torch.Tensor, threshold: float) -> torch.Tensor:
    """[R, gamma] -> [R] long: the longest prefix whose cumulative survival is >= threshold."""
    return (prefix_survival >= threshold).long().cumprod(-1).sum(-1)


class ThresholdPolicy(VerifyPolicy):
    def choose(self, proposal: Proposal, caps: torch.Tensor) -> torch.Tensor:
        a = admitted_survival(self, proposal, caps)  # [batch, gamma], 0 past each cap
        t = self.config.knob(THRESHOLD)
        lengths = threshold_lengths(a, t) if t > 0 else caps.clamp(max=proposal.tokens.shape[1])
        return torch.where(caps < 0, caps, lengths)  # -1 marks a finished request


__all__ = ["ThresholdPolicy", "threshold_lengths"]
