"""The negative controls of the verification policies: variants that break the losslessness argument on
purpose, so that the statistical tests can show they catch the bias. They live here, not in pdraft: nothing
registers them and no setting reaches them.

- `NoEarlyStopScheduler`: Algorithm 1 without its early stop, the retrospective global search the DSpark
  paper's Appendix A warns against (pdraft.policies.scheduler).
- `PeekingEstimator`: the online estimator reading the realised token's probability q_k(x_k) instead of
  max_v q_k(v), a feature that depends on the draft it decides about (pdraft.policies.estimator)."""

from __future__ import annotations

import torch

from pdraft.models.api import Proposal
from pdraft.policies import ROUND_OVERHEAD
from pdraft.policies.base import VerifyConfig, VerifyPolicy, make_policy
from pdraft.policies.estimator import EstimatorPolicy
from pdraft.policies.scheduler import SchedulerPolicy, schedule_prefixes


class NoEarlyStopScheduler(SchedulerPolicy):
    def schedule(self, prefix_survival: torch.Tensor) -> list[int]:
        cfg = self.config
        return schedule_prefixes(prefix_survival, cfg.sps, early_stop=False, padded=not cfg.packed,
                                 round_overhead_s=cfg.knob(ROUND_OVERHEAD))


class PeekingEstimator(EstimatorPolicy):
    def top_probability(self, proposal: Proposal) -> torch.Tensor | None:
        if proposal.probs is None:
            return super().top_probability(proposal)
        return proposal.probs.gather(-1, proposal.tokens.unsqueeze(-1).to(proposal.probs.device))[..., 0]


def policy(config: VerifyConfig, control: bool) -> VerifyPolicy:
    """The registered policy of `config`, or its negative control when `control`."""
    if not control:
        return make_policy(config)
    return {"scheduler": NoEarlyStopScheduler, "estimator": PeekingEstimator}[config.mode](config)
