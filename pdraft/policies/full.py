"""Full verification, the default: every request verifies all gamma drafts (within its cap)."""

from __future__ import annotations

import torch

from pdraft.policies.base import VerifyPolicy
from pdraft.models.api import Proposal


class FullPolicy(VerifyPolicy):
    def choose(self, proposal: Proposal, caps: torch.Tensor) -> torch.Tensor:
        return caps.clamp(max=proposal.tokens.shape[1])  # a finished request's -1 stays -1
