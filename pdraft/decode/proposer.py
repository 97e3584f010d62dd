"""The drafter side of a decode run: a drafter (pdraft.models.api.Drafter) and its context state for one batch
of requests. The state starts from the prompt's captured target features and tokens, proposes gamma tokens per
running request (in one pass for a parallel drafter, in gamma for EAGLE-3's chain), and grows by the features
and tokens of each round's committed tokens. Requests that finish
leave the state (the drafter stops drafting for them); the proposal is laid back over the whole batch, so the
rest of the round never sees the narrowing."""

from __future__ import annotations

import torch

from pdraft.models.api import DraftTree, Proposal, SamplingParams
from pdraft.models.tree import draft_tree


class Proposer:
    def __init__(self, drafter, batch: int, gamma: int, *, capacity: int | None = None, propose=None,
                 argmax_drafts: bool = False):
        """`capacity`: context positions the run reaches (the drafter's state is allocated for them once);
        `propose`: the drafter's pass as the backend runs it (pdraft.decode.backend.drafter_pass), by default
        the drafter's own; `argmax_drafts` (decode.draft_sample_method greedy): a chain's drafts are the drafter's
        argmax whatever the run samples with, proposed without a distribution, which acceptance then reads as
        one-hot (pdraft.decode.acceptance), so the round stays lossless."""
        self.drafter, self.batch, self.gamma, self.capacity = drafter, batch, gamma, capacity
        self.argmax_drafts = argmax_drafts
        self.state = drafter.new_state(batch, capacity)
        self.live = torch.arange(batch)  # [live] the requests the state holds, in batch order
        self._propose = propose or drafter.propose

    def prefill(self, hidden: torch.Tensor, positions: torch.Tensor, valid: torch.Tensor, ids: torch.Tensor) -> None:
        """The prompt's features: hidden [batch, T, F], positions, valid and token ids [batch, T]."""
        if hidden.shape[1] > 0:
            self.drafter.extend_context(self.state, hidden, positions, valid, ids)

    def refill(self, row: int, hidden: torch.Tensor, ids: torch.Tensor) -> None:
        """Row `row` takes a new request (continuous batching): its context restarts from the new prompt's
        features hidden [n, F] and tokens ids [n] (the anchor included: its first token is already taken). The
        drafter runs on that request alone, in a fresh one-row state that is then placed in the row, so a
        refill costs one request's context whatever the number of slots. The rows keep their places, so this
        runs only while no request has left the state; a state type without `place` refuses (pdraft.models.api)."""
        if self.live.numel() != self.batch:
            raise RuntimeError("internal: a row was refilled after requests left the drafter state")
        n = hidden.shape[0]
        one = self.drafter.new_state(1, self.capacity)
        self.drafter.extend_context(one, hidden.unsqueeze(0), torch.arange(n).unsqueeze(0), None,
                                    ids.to(hidden.device).unsqueeze(0))
        self.state.place(torch.tensor([row]), one)

    def propose(
        self,
        running: torch.Tensor,  # [running] long: the requests still decoding, in batch order
        anchors: torch.Tensor,  # [batch] long: last committed token
        anchor_positions: torch.Tensor,  # [batch] long
        sampling: SamplingParams,
        uniforms: torch.Tensor | None,  # [batch, gamma] the drafts' uniforms; None when greedy
    ) -> Proposal:
        """gamma drafts for every request: tokens [batch, gamma] (rows of finished requests are filler)."""
        if running.numel() < self.live.numel():  # requests finished: the drafter stops drafting for them
            self.state = self.state.select(torch.searchsorted(self.live, running))
            self.live = running
        live = self.live
        if self.argmax_drafts:  # the round's uniforms for the drafts are drawn all the same: streams stay aligned
            sampling, uniforms = SamplingParams(), None
        p = self._propose(self.state, anchors[live], anchor_positions[live], self.gamma, sampling,
                          None if uniforms is None else uniforms[live])
        return p.scatter(live, self.batch) if live.numel() < self.batch else p

    def propose_tree(
        self,
        running: torch.Tensor,  # [running] long: the requests still decoding, in batch order
        anchors: torch.Tensor,  # [batch] long
        anchor_positions: torch.Tensor,  # [batch] long
        nodes: int,
        width: int,
        sampling: SamplingParams,
        uniforms: torch.Tensor | None,  # [batch, nodes] the draws' uniforms; None when greedy
        depth_limit: torch.Tensor,  # [batch] long: deepest node each request may verify (its cap, <= gamma)
        node_limit: torch.Tensor,  # [batch] long: most nodes each request's cache row can take
    ) -> DraftTree:
        """A tree of up to `nodes` drafts (`width` children per node, depth gamma) for every request from one
        drafting pass (pdraft.models.tree); rows of finished requests have no real node."""
        if running.numel() < self.live.numel():
            self.state = self.state.select(torch.searchsorted(self.live, running))
            self.live = running
        live = self.live
        tree = draft_tree(self.drafter, self.state, anchors[live], anchor_positions[live], self.gamma, nodes, width,
                          sampling, None if uniforms is None else uniforms[live], depth_limit[live], node_limit[live])
        return tree.scatter(live, self.batch) if live.numel() < self.batch else tree

    def extend(
        self,
        hidden: torch.Tensor,  # [batch, L+1, F] the verify pass's captured features
        keep: torch.Tensor,  # [batch, L+1] bool: the anchor and the accepted drafts
        anchors: torch.Tensor,  # [batch] long: the anchors just verified
        anchor_positions: torch.Tensor,  # [batch] long: their positions
        drafts: torch.Tensor,  # [batch, L] long: the drafts verified after them
        accepted: torch.Tensor,  # [batch] long
    ) -> None:
        """Add the features of the tokens this round committed to the target's cache, with the tokens: the
        anchor and the accepted drafts (the target's own token enters as the next anchor)."""
        t = int(accepted.max()) + 1
        live = self.live
        positions = anchor_positions[live].unsqueeze(1) + torch.arange(t)  # [live, t]
        ids = torch.cat([anchors.to(drafts.device).unsqueeze(1), drafts], dim=1)[live, :t]  # [live, t]
        self.drafter.extend_context(self.state, hidden[live, :t], positions, keep[live, :t], ids)
