"""The hardware-aware prefix scheduler of the DSpark paper (Algorithm 1): over the whole batch, admit
candidate tokens (r, j) in descending order of their cumulative survival a_{r,j} (pdraft.policies.base.
survival) while the expected throughput Theta = tau * SPS(B) improves, with B = R + admitted tokens and
tau = R + sum of admitted a_{r,j}; SPS(B) is the profiled cost table (pdraft.policies.cost).

Cost model = what the engine really pays (our adaptation of the paper's Theta). B is the number of tokens
the verify pass runs: sum(1 + l_r) with the packed verifier (the default, the paper's B), and
R * (1 + max_r l_r) with the padded one (`VerifyConfig.packed=False`), where lengthening a request up to the
current longest costs nothing. And the table times the verify step alone, while a round also drafts and
updates the drafter's context: `round_overhead_s`, seconds per round that do not depend on the verify
lengths, turns SPS(B) into rounds per second 1 / (1 / SPS(B) + overhead). Leaving it out overstates what a
shorter verify pass saves, and the scheduler then cuts prefixes that would have paid for themselves.

Losslessness. The admission of draft j of request r must not depend on the realised token x_{r,j} (paper
Appendix A). c_{r,j} depends only on x_{r,j-1}, so a_{r,j} is known before x_{r,j} is drawn; stopping at the
first non-improving step keeps the decision "l_r >= j" a function of candidates ranked at or above (r, j),
none of which depends on x_{r,j}. `schedule_prefixes(..., early_stop=False)` runs the retrospective global
search the paper warns against; only the negative-control tests call it (tests/policy_controls.py), to show
that they detect its bias. Never use it.

A batch the table says the engine cannot run (above its max_batch_tokens) has throughput 0, which stops
admission.
"""

from __future__ import annotations

import torch

from pdraft.policies import ROUND_OVERHEAD
from pdraft.policies.base import VerifyPolicy, admitted_survival
from pdraft.policies.cost import SpsTable
from pdraft.models.api import Proposal

__all__ = ["SchedulerPolicy", "schedule_prefixes"]


def schedule_prefixes(prefix_survival: torch.Tensor, sps: SpsTable, early_stop: bool = True, *, padded: bool = False,
                      round_overhead_s: float = 0.0) -> list[int]:
    """Algorithm 1 of the DSpark paper over R requests. prefix_survival [R, gamma]: a_{r,j}, entries that are
    0 (or masked to 0 by the caller, e.g. past a request's token budget) are never admitted. `padded`: the
    verify pass costs R * (1 + max l) tokens instead of sum(1 + l); `round_overhead_s`: see the module
    docstring. Either way each decision sees only the candidates ranked at or above it, and the search stops
    at the first non-improving step, so a_{r,k} for k > j (which depend on x_{r,j}) never decide l_r >= j."""
    a = prefix_survival.tolist()
    rows = len(a)
    # Ties are broken by position, then request, so a request's prefix is always admitted left to right.
    candidates = sorted(
        ((v, j + 1, r) for r, row in enumerate(a) for j, v in enumerate(row) if v > 0.0),
        key=lambda c: (-c[0], c[1], c[2]),
    )

    def throughput(tau: float, tokens: int) -> float:  # expected tokens per second of the whole round
        steps = sps(tokens)
        return tau / (1.0 / steps + round_overhead_s) if steps > 0 else 0.0

    lengths = [0] * rows
    best_lengths = [0] * rows
    admitted, longest, tau = 0, 0, float(rows)
    best = throughput(tau, rows)
    for value, j, r in candidates:
        lengths[r] = j
        admitted += 1
        longest = max(longest, j)
        tau += value
        theta = throughput(tau, rows * (1 + longest) if padded else rows + admitted)
        if theta > best:
            best = theta
            best_lengths = list(lengths)
        elif early_stop:
            break
    return best_lengths


class SchedulerPolicy(VerifyPolicy):
    def choose(self, proposal: Proposal, caps: torch.Tensor) -> torch.Tensor:
        a = admitted_survival(self, proposal, caps)  # [batch, gamma], 0 past each cap
        lengths = torch.zeros_like(caps)
        active = (caps >= 0).nonzero().flatten()  # finished requests take no part in the batch
        if active.numel():
            lengths[active] = torch.tensor(self.schedule(a[active]), dtype=torch.long)
        return torch.where(caps < 0, caps, lengths)  # -1 marks a finished request

    def schedule(self, prefix_survival: torch.Tensor) -> list[int]:
        """Algorithm 1 with its early stop over the running requests' prefix survival [R, gamma]."""
        cfg = self.config
        return schedule_prefixes(prefix_survival, cfg.sps, padded=not cfg.packed,
                                 round_overhead_s=cfg.knob(ROUND_OVERHEAD))
