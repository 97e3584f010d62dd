"""The online acceptance estimator: a verification policy for every family (DFlash, DSpark, DFlash2, EAGLE-3)
that predicts each draft's acceptance from draft-side features, learned from the run's own verified rounds,
and verifies the prefixes that maximise expected committed tokens per second of the round.

Model. p_hat(r, k) = P(draft k of request r is accepted | drafts 1..k-1 were), from Beta-smoothed counts in
two levels: per position k, shrunk toward an optimistic prior (PRIOR_MEAN, so a position with no data is
verified, i.e. explored); and per cell (k, bin of the draft's top probability max_v q_k(v), bin of sigmoid of
DSpark's confidence logit where the drafter has the head), shrunk toward its position's estimate. `observe`
adds each request's round: positions 1..min(a + 1, l) were reached, 1..a accepted, a + 1 rejected when a < l.
Counts, not a regression, because they are exact, cheap and checkable by hand, and the two levels let a
rarely seen cell borrow its position's rate.

Choice. The prefix survival s_{r,k} = prod_{j<=k} p_hat(r, j) makes the expected tokens of a round sum_r (1 +
sum_{k<=l_r} s_{r,k}); Algorithm 1 of the DSpark paper (pdraft.policies.scheduler.schedule_prefixes, one copy)
admits candidates in descending s while tokens per second improve. The cost of a verify pass of B tokens is
the calibration's SPS table when one is beside the drafter; otherwise a line a + b * B fitted (Theil-Sen,
robust to stalled passes) to the last COST_WINDOW rounds' measured verify seconds (B = sum(1 + l_r), or
R * (1 + max l_r) with the padded verifier), the last fit kept while the window has no spread in B. Each
round also pays time the lengths do not change (drafting, acceptance, commit): the `round_overhead_s` setting
when given, otherwise the median over the window of (time between two observe calls - verify seconds).
Until COST_ROUNDS rounds are measured every request verifies its whole block, and request r always does in
the rounds t with (t + r) % EXPLORE_EVERY == 0, so late positions keep getting data however low their
estimate falls.

Losslessness. The decision "l_r >= k" may depend on the distribution q_k (a function of x_<k), on anything of
positions < k, on the position, on the round counter and on earlier rounds' outcomes; never on the realised
token x_k or anything drafted after it, and never on the current round's target output. The features obey
that: max_v q_k(v) is a function of q_k alone (under greedy q_k(x_k) equals it, under sampling q_k(x_k) of the
sampled token would not), the confidence logit of k reads x_{k-1}; the counts and the cost fit change only in
`observe`, after the round; exploration reads the round counter and the row. Algorithm 1's early stop keeps
the batch decision a stopping rule (the scheduler module's argument, the paper's Appendix A), and the final
length max(explored, scheduled) is two such rules. The negative-control tests (tests/policy_controls.py)
replace the feature by q_k(x_k), the realised token's probability, in a subclass of their own, to show that
they catch its bias."""

from __future__ import annotations

import statistics
import time
from collections import deque

import torch

from pdraft.models.api import Proposal
from pdraft.policies import ROUND_OVERHEAD
from pdraft.policies.base import VerifyConfig, VerifyPolicy
from pdraft.policies.scheduler import schedule_prefixes

__all__ = ["EstimatorPolicy", "AcceptanceCounts", "LinearCost", "BIN_EDGES"]

BIN_EDGES = (0.3, 0.5, 0.7, 0.9)  # bins of the top probability and of the confidence: [0, .3), ..., [.9, 1]
BINS = len(BIN_EDGES) + 1
PRIOR_MEAN, PRIOR_WEIGHT = 0.9, 2.0  # per position: Beta(1.8, 0.2), optimistic so unseen positions are verified
CELL_WEIGHT = 4.0  # pseudo-counts with which a cell is pulled toward its position's estimate
EXPLORE_EVERY = 16  # request r verifies its whole block in rounds t with (t + r) % EXPLORE_EVERY == 0
# Rounds the measured cost is fitted over, and rounds timed before it is used: two points already give a line
# (round 0 verifies anchors only, round 1 whole blocks), and every full-block round spent waiting costs a
# short run much (8 rounds were a third of a 64-token quickstart decode).
COST_WINDOW, COST_ROUNDS = 64, 2


class AcceptanceCounts:
    """The two-level Beta-smoothed acceptance counts (module docstring), grown to the longest block seen."""

    def __init__(self):
        self.reached = torch.zeros(0, BINS, BINS, dtype=torch.float64)  # [gamma, prob bin, confidence bin]
        self.accepted = torch.zeros(0, BINS, BINS, dtype=torch.float64)

    def _grow(self, gamma: int) -> None:
        extra = gamma - self.reached.shape[0]
        if extra > 0:
            pad = torch.zeros(extra, BINS, BINS, dtype=torch.float64)
            self.reached, self.accepted = torch.cat([self.reached, pad]), torch.cat([self.accepted, pad.clone()])

    def estimate(self, prob_bins: torch.Tensor, conf_bins: torch.Tensor) -> torch.Tensor:
        """prob_bins, conf_bins [R, gamma] long -> p_hat [R, gamma] float32."""
        gamma = prob_bins.shape[1]
        self._grow(gamma)
        n, a = self.reached[:gamma], self.accepted[:gamma]  # [gamma, BINS, BINS]
        position = (a.sum((1, 2)) + PRIOR_MEAN * PRIOR_WEIGHT) / (n.sum((1, 2)) + PRIOR_WEIGHT)  # [gamma]
        k = torch.arange(gamma).expand_as(prob_bins)  # [R, gamma]
        cell_n, cell_a = n[k, prob_bins, conf_bins], a[k, prob_bins, conf_bins]  # [R, gamma]
        return ((cell_a + CELL_WEIGHT * position[k]) / (cell_n + CELL_WEIGHT)).float()

    def add(self, prob_bins: torch.Tensor, conf_bins: torch.Tensor, lengths: torch.Tensor,
            accepted: torch.Tensor) -> None:
        """One round: bins [R, gamma]; lengths [R] (-1 = finished), accepted [R]: request r reached positions
        1..min(a + 1, l) and had 1..a accepted."""
        gamma = prob_bins.shape[1]
        self._grow(gamma)
        pos = torch.arange(1, gamma + 1).unsqueeze(0)  # [1, gamma]
        a, l = accepted.unsqueeze(1).long(), lengths.unsqueeze(1).long()  # [R, 1]
        reached = pos <= torch.minimum(a + 1, l)  # [R, gamma]; l = -1 or 0 reaches nothing
        hit = pos <= a  # [R, gamma]
        k = (pos - 1).expand_as(prob_bins)
        index = (k[reached], prob_bins[reached], conf_bins[reached])
        self.reached.index_put_(index, torch.ones(len(index[0]), dtype=torch.float64), accumulate=True)
        index = (k[hit], prob_bins[hit], conf_bins[hit])
        self.accepted.index_put_(index, torch.ones(len(index[0]), dtype=torch.float64), accumulate=True)


class LinearCost:
    """Verify steps per second 1 / (a + b * B) of a measured line, called as Algorithm 1 calls an SpsTable."""

    def __init__(self, intercept_s: float, slope_s: float):
        self.intercept_s, self.slope_s = intercept_s, slope_s

    def __call__(self, tokens: int) -> float:
        return 1.0 / max(self.intercept_s + self.slope_s * tokens, 1e-9)  # a zero fit: free, so verify all

    @classmethod
    def fit(cls, points) -> LinearCost | None:
        """The Theil-Sen line through (B, seconds) points: slope = the median of the slopes between every two
        points of different B, intercept = the median of seconds - slope * B; None when B has no spread. Not
        least squares: one pass stalled by another process (a shared CPU, a page fault) would tilt a squares
        fit, and the lengths with it, while a median ignores up to ~29% of such points. Both are kept >= 0 (a
        noisy negative slope would say longer passes are cheaper)."""
        x, y = (torch.tensor(v, dtype=torch.float64) for v in zip(*points))  # [n] each
        dx, dy = x[None, :] - x[:, None], y[None, :] - y[:, None]  # [n, n]
        pairs = dx > 0
        if not pairs.any():
            return None
        slope = max(float((dy[pairs] / dx[pairs]).median()), 0.0)
        return cls(max(float((y - slope * x).median()), 0.0), slope)


def bins(values: torch.Tensor | None, shape) -> torch.Tensor:
    """[R, gamma] values in [0, 1] (None: the feature is absent, one bin) -> [R, gamma] long bins."""
    if values is None:
        return torch.zeros(shape, dtype=torch.long)
    return torch.bucketize(values.float().cpu().contiguous(), torch.tensor(BIN_EDGES), right=True)


class EstimatorPolicy(VerifyPolicy):
    def __init__(self, config: VerifyConfig):
        super().__init__(config)
        self.counts = AcceptanceCounts()
        self.rounds = 0  # observe calls so far: the round counter exploration reads
        self.cost_points: deque = deque(maxlen=COST_WINDOW)  # (B, verify seconds) of the recent rounds
        self.overheads: deque = deque(maxlen=COST_WINDOW)  # seconds of each round outside its verify pass
        self.cost: LinearCost | None = None
        self._last_observe: float | None = None

    def features(self, proposal: Proposal) -> tuple[torch.Tensor, torch.Tensor]:
        """(probability bins, confidence bins) [batch, gamma] of the round's drafts (module docstring)."""
        shape = tuple(proposal.tokens.shape)
        conf = None if proposal.confidence is None else torch.sigmoid(proposal.confidence.float()[:, : shape[1]])
        return bins(self.top_probability(proposal), shape), bins(conf, shape)

    def top_probability(self, proposal: Proposal) -> torch.Tensor | None:
        """[batch, gamma] max_v q_k(v) of each draft, known before x_k is drawn (None: the drafter gives none)."""
        top = proposal.top_probabilities()
        if top is None and proposal.probs is not None:  # a drafter that fills probs but not top_prob
            return proposal.probs.amax(-1)
        return top

    def survival(self, proposal: Proposal, caps: torch.Tensor) -> torch.Tensor:
        """[batch, gamma] estimated prefix survival prod_{j<=k} p_hat(r, j), zero past each request's cap."""
        gamma = proposal.tokens.shape[1]
        s = self.counts.estimate(*self.features(proposal)).cumprod(-1)  # [batch, gamma]
        return s * (torch.arange(1, gamma + 1).unsqueeze(0) <= caps.unsqueeze(1))

    def overhead_s(self) -> float:
        given = self.config.knob(ROUND_OVERHEAD)
        if given > 0 or not self.overheads:
            return given
        return statistics.median(self.overheads)

    def choose(self, proposal: Proposal, caps: torch.Tensor) -> torch.Tensor:
        cfg = self.config
        gamma = proposal.tokens.shape[1]
        full = caps.clamp(max=gamma)
        cost = cfg.sps if cfg.sps is not None else self.cost
        if cost is None or (cfg.sps is None and len(self.cost_points) < COST_ROUNDS):
            return full  # no cost measured yet: verify everything (explores, and gives the fit its points)
        rows = torch.arange(len(caps))
        explore = torch.where((self.rounds + rows) % EXPLORE_EVERY == 0, full, torch.zeros_like(full))
        lengths = torch.zeros_like(caps)
        active = (caps >= 0).nonzero().flatten()  # finished requests take no part in the batch
        if active.numel():
            s = self.survival(proposal, caps)
            chosen = schedule_prefixes(s[active], cost, padded=not cfg.packed, round_overhead_s=self.overhead_s())
            lengths[active] = torch.tensor(chosen, dtype=torch.long)
        return torch.where(caps < 0, caps, torch.maximum(lengths, explore))  # -1 marks a finished request

    def observe(self, proposal: Proposal | None, lengths: torch.Tensor, accepted: torch.Tensor,
                verify_s: float) -> None:
        now = time.perf_counter()
        live = lengths >= 0
        if live.any():
            used = lengths[live]
            tokens = int(used.numel() * (1 + int(used.max()))) if not self.config.packed else int((1 + used).sum())
            self.cost_points.append((tokens, float(verify_s)))
            if self._last_observe is not None:
                self.overheads.append(max(now - self._last_observe - float(verify_s), 0.0))
            fit = LinearCost.fit(self.cost_points) if len(self.cost_points) >= 2 else None
            self.cost = fit or self.cost
        if proposal is not None:
            self.counts.add(*self.features(proposal), lengths.cpu(), accepted.cpu())
        self.rounds += 1
        self._last_observe = now
