"""The DFlash2 drafter: the z-lab DFlash backbone of pdraft.models.dflash.model with DFlash2 decoder layers (a
dynamic conv around each sublayer, conv.py), the block's token embeddings scaled by `input_embedding_scale`,
and the candidate selector (selector.py) in place of per-position sampling: one backbone pass, then the top-K
unary candidates of every draft position and a walk through their pair scores from the anchor. `Proposal.probs`
is the exact conditional distribution of each drafted token given the ones before it (zero outside that
position's K candidates). The sampling parameters' top-k / top-p shape the target side only: the draft's q is
the selector's own softmax at the request's temperature, and the rejection rule needs q exact, not equal to p."""

from __future__ import annotations

from functools import partial

import torch
from torch import nn

from pdraft.errors import PdraftError
from pdraft.kernels import cpu_walks
from pdraft.models.api import Proposal, TreeBlock
from pdraft.models.dflash2.config import DFlash2Config
from pdraft.models.dflash2.conv import DFlash2DecoderLayer, GroupedDynamicConv
from pdraft.models.dflash2.selector import (CandidateSelector, SelectorLossOutput, greedy_walk, sampled_walk,
                                            selector_loss, unary_candidates)
from pdraft.models.dflash.model import DFlashDrafter
from pdraft.models.sampling import is_greedy, top_probability

# Rows of training logits formed at once for the selector's candidates (as pdraft.train.losses.SLICE).
CANDIDATE_SLICE = 1024


class DFlash2Drafter(DFlashDrafter):
    def __init__(self, config: DFlash2Config):
        super().__init__(config)
        # The parent built plain DFlash layers; DFlash2 layers hold the same sublayers plus the two convs.
        self.layers = nn.ModuleList([DFlash2DecoderLayer(config) for _ in range(config.num_hidden_layers)])
        self.candidate_selector = CandidateSelector(config.hidden_size, config.vocab_size, config.selector_rank,
                                                    config.selector_top_k)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        scale = self.config.input_embedding_scale
        return super().embed(ids) if scale == 1.0 else super().embed(ids) * scale  # no operation for a scale of 1

    def candidates(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden [..., hidden] -> (candidate target ids [..., K], unary scores [..., K] float32): the top-K of the
        head's logits (its own head over a draft vocabulary, mapped to target ids, when it has one)."""
        cfg = self.config
        # the top-K of the head's logits in its own dtype: only the K chosen become float32 (the same ids and
        # values as over float32 copies of all of them, which a bfloat16 head's logits convert to exactly)
        ids, unary = unary_candidates(self.head_logits(hidden), cfg.selector_top_k, cfg.output_multiplier,
                                      cfg.final_logit_softcapping)
        return self.to_target(ids), unary

    def sample_block(self, hidden, anchor_ids, sampling, uniforms) -> Proposal:
        """hidden [batch, gamma, d]; anchor_ids [batch]; uniforms [batch, gamma] (None when greedy)."""
        cand, unary = self.candidates(hidden)  # [batch, gamma, K]
        selector = self.candidate_selector
        walks = cpu_walks.kernels() if is_greedy(sampling) and hidden.device.type == "cpu" else None
        if walks is not None:  # the walk in one compiled loop, reading only the rows it walks (cpu_walks)
            idx = walks.selector_walk(cand, unary, selector.projected(hidden), *selector.float_books(), anchor_ids)
            lattice = partial(selector.edge_scores, cand, unary, hidden, anchor_ids)  # formed if a policy reads it
            return Proposal(tokens=cand.gather(2, idx[..., None])[..., 0], probs=None, confidence=None,
                            top_prob=lambda: _walked_top(lattice(), idx))
        scores = selector.edge_scores(cand, unary, hidden, anchor_ids)  # [batch, gamma, K, K]
        if is_greedy(sampling):
            tokens, idx = greedy_walk(scores, cand)  # [batch, gamma] each
            return Proposal(tokens=tokens, probs=None, confidence=None, top_prob=partial(_walked_top, scores, idx))
        if uniforms is None:
            raise PdraftError("DFlash2 sampled drafting needs one uniform per position")
        tokens, q = sampled_walk(scores, cand, float(sampling.temperature), uniforms, self.config.vocab_size)
        return Proposal(tokens=tokens, probs=q, confidence=None, top_prob=partial(top_probability, q, q))

    @torch.no_grad()
    def tree_block(self, state, anchor_ids: torch.Tensor, anchor_positions: torch.Tensor, width: int) -> TreeBlock:
        """The backbone pass and the candidate lattice; the shape is planned from the unary softmax over each
        position's K candidates (a node has at most K children)."""
        anchor_ids = anchor_ids.reshape(state.batch_size).to(state.lengths.device).long()
        hidden = self.block_hidden(state, anchor_ids, anchor_positions)  # [b, G, hidden]
        cand, unary = self.candidates(hidden)  # [b, G, K]
        scores = self.candidate_selector.edge_scores(cand, unary, hidden, anchor_ids)  # [b, G, K, K]
        top = torch.softmax(unary, dim=-1)[..., :width]  # best first
        if top.shape[-1] < width:
            top = torch.cat([top, top.new_zeros(*top.shape[:-1], width - top.shape[-1])], dim=-1)
        return TreeBlock(top=top, data={"cand": cand, "scores": scores})

    def tree_step(self, block, depth: int, rows: torch.Tensor, prev_ids: torch.Tensor, carry, sampling):
        """The edges out of each node's candidate (the anchor's row at depth 1), on the vocabulary: -inf (q 0)
        outside the position's K candidates."""
        cand, scores = block.data["cand"], block.data["scores"]
        here = cand[rows, depth - 1]  # [M, K]
        if depth == 1:
            pred = torch.zeros_like(rows)
        else:  # every node is one of its position's candidates: its index there
            pred = (cand[rows, depth - 2] == prev_ids.to(cand.device).unsqueeze(1)).int().argmax(-1)
        edge = scores[rows, depth - 1, pred]  # [M, K]
        full = torch.full((rows.numel(), self.config.vocab_size), float("-inf"), device=edge.device)
        full.scatter_(1, here, edge)
        if is_greedy(sampling):
            return full, None, None
        q = torch.zeros_like(full).scatter_(1, here, torch.softmax(edge / float(sampling.temperature), dim=-1))
        return full, q, None

    def init_extras(self, std: float = 0.02) -> None:
        reset_dflash2_extras(self, std)

    def extra_train_loss(self, out, *, valid: torch.Tensor, weights: torch.Tensor,
                         target_hidden: torch.Tensor | None = None, target_rows: torch.Tensor | None = None,
                         target_head: torch.Tensor | None = None, alpha_selector: float,
                         selector_target: str = "token") -> SelectorLossOutput:
        """The selector term of a teacher-forced pass: out = forward_train(...) (hidden [b, N, G, d], target_ids
        and prev_ids [b, N, G]: the gold token and its gold predecessor, the anchor at slot 0); valid [b, N, G]
        the supervised positions; weights [b, N, G] the DFlash position weights; target_hidden [T, hidden_t],
        target_rows [b, N, G] and target_head [vocab, hidden_t]: the target's last hidden states, the row each
        position's target distribution is read from (the rows the shared TV loss reads) and its LM head;
        alpha_selector and selector_target the recipe's weight and label of the term. Only the supervised
        positions' LM-head logits are formed ([M, vocab])."""
        cfg = self.config
        h = out.hidden[valid]  # [M, d]
        with torch.no_grad():  # the candidates only: the scores that need a gradient are recomputed per candidate;
            # slices of CANDIDATE_SLICE rows keep each [rows, V_d] logits tensor under glibc's mmap threshold (a whole
            # [M, V_d] one was mapped and zero-filled afresh every step), and only the top K of each row is kept
            parts = [unary_candidates(self.draft_logits(h[i:i + CANDIDATE_SLICE]), self.candidate_selector.top_k,
                                      cfg.output_multiplier, cfg.final_logit_softcapping)
                     for i in range(0, h.shape[0], CANDIDATE_SLICE)]
            candidates = (torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]))  # [M, K] each
        head = self.draft_head.weight if cfg.reduced_vocab else self._target()[1].weight
        t_h = None if target_hidden is None or target_rows is None else target_hidden[target_rows[valid]]  # [M, h_t]
        return selector_loss(self.candidate_selector, None, h, out.target_ids[valid],
                             out.prev_ids[valid], torch.ones_like(out.target_ids[valid], dtype=torch.bool),
                             alpha=alpha_selector, output_multiplier=cfg.output_multiplier,
                             softcap=cfg.final_logit_softcapping, weights=weights[valid], head_weight=head,
                             vocab=self.vocab_ids(), target=selector_target, target_hidden=t_h,
                             target_head=target_head, candidates=candidates)


def _walked_top(scores: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """The top probability of each greedy draft's distribution: the walk's row at step l is the edges out of the
    candidate picked at l - 1 (row 0 at l = 0), and its temperature-1 softmax is the distribution draft l was
    chosen from, known before it is. scores [batch, gamma, K, K], idx [batch, gamma] -> [batch, gamma]; computed
    only when a policy reads it."""
    prev = torch.cat([torch.zeros_like(idx[:, :1]), idx[:, :-1]], dim=1)  # [batch, gamma]
    rows = scores.gather(2, prev[..., None, None].expand(-1, -1, 1, scores.shape[-1]))[:, :, 0]  # [b, g, K]
    return top_probability(rows, None)


def reset_dflash2_extras(drafter: DFlash2Drafter, std: float = 0.02) -> None:
    """Identity convs and a unary-only selector: after `init_weights` (which draws every Linear, the convs'
    kernel projections included) this restores the DFlash2 starting point."""
    for m in drafter.modules():
        if isinstance(m, GroupedDynamicConv):
            m.reset_identity()
    drafter.candidate_selector.reset_parameters(std)


__all__ = ["DFlash2Drafter", "reset_dflash2_extras"]
