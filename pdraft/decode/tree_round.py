"""A decode round that verifies a tree instead of a chain (DecodeSettings.tree = (nodes, width)), as the engine's
round (pdraft.decode.engine) runs it in place of propose -> policy -> verify -> accept -> commit:

    draft      Proposer.propose_tree     one parallel pass, a tree of up to `nodes` drafts, `width` children per
                                         node, depth gamma within each request's cap (pdraft.models.tree)
    verify     verifier.verify_tree      one target pass over [anchor, nodes], positions by depth, each node
                                         attending to the context and its ancestors only
    accept     accept_tree               the greedy longest matching path, or recursive rejection sampling over
                                         siblings (pdraft.decode.tree_accept)
    commit     verifier.commit_tree      the kept path's keys and values in consecutive slots (the static cache:
                                         moved to their positions; the reference cache: the path kept live);
                                         then, as for a chain, rollback by length, the drafter's context
                                         extended along the path and the path's tokens appended

A round returns what the chain's steps leave for the rest of the loop: the kept path as a chain of `drafts`
(so the drafter, the book and the records read it as they read a chain), the target's features along it,
and `lengths` (the deepest node each request may keep: gamma within its cap). Every node is verified, so a
tree runs with full verification only (the settings refuse the other policies)."""

from __future__ import annotations

import time
from typing import NamedTuple

import torch

from pdraft.decode.tree_accept import accept_tree
from pdraft.models.api import DraftTree


class TreeOutcome(NamedTuple):
    """What a tree round leaves for the rest of the loop (TreeRound.round), and the seconds of each part."""

    tree: DraftTree
    lengths: torch.Tensor  # [batch]: the deepest node each request may keep; -1 = finished
    drafts: torch.Tensor  # [batch, gamma]: the kept path's tokens (0 past it)
    logits: torch.Tensor
    hidden: torch.Tensor | None  # [batch, gamma+1, F] along the path
    acc: object  # the acceptance (accepted, next_token, path)
    keep: torch.Tensor  # [batch, gamma+1]
    verify_s: float
    draft_s: float
    accept_s: float
    commit_s: float


class TreeRound:
    def __init__(self, nodes: int, width: int):
        self.nodes, self.width = nodes, width
        self.last: DraftTree | None = None  # the round's tree, for its shape in the records

    def round(self, proposer, verifier, book, caps: torch.Tensor, running: torch.Tensor, gamma: int, sampling,
              u: torch.Tensor | None):
        """-> TreeOutcome: the tree, lengths [batch], drafts [batch, gamma] (the kept path's tokens), logits,
        hidden [batch, gamma+1, F] along the path, the acceptance, keep [batch, gamma+1], and the seconds of each
        part of the round."""
        t0 = time.perf_counter()
        lengths = caps.clamp(max=gamma)  # [batch]: -1 = finished
        live = lengths >= 0
        room = verifier.tree_room(book.anchor_pos)  # [batch]: the nodes each cache row can take
        tree = proposer.propose_tree(running, book.anchors, book.anchor_pos, self.nodes, self.width, sampling,
                                     None if u is None else u[:, :self.nodes], lengths.clamp(min=0), room)
        self.last = tree
        t1 = time.perf_counter()
        logits, hidden = verifier.verify_tree(book.anchors, book.anchor_pos, tree, live)  # [batch, N+1, vocab|F]
        t2 = time.perf_counter()
        verify_s = t2 - t1
        acc = accept_tree(logits, tree.tokens, tree.parents, tree.real & live.to(tree.real.device).unsqueeze(1),
                          tree.probs, sampling, None if u is None else u[:, self.nodes:], width=self.width,
                          depth=gamma)
        t3 = time.perf_counter()
        keep = verifier.commit_tree(acc.path, acc.accepted)  # [batch, gamma+1]
        commit_s = time.perf_counter() - t3
        path = acc.path.to(tree.tokens.device)
        ext = torch.cat([book.anchors.to(tree.tokens.device).unsqueeze(1), tree.tokens], dim=1)  # by node index
        drafts = ext.gather(1, path[:, 1:]).cpu()  # [batch, gamma]: the path's tokens (0 past it)
        if hidden is not None:
            hidden = hidden.gather(1, path.to(hidden.device).unsqueeze(2).expand(-1, -1, hidden.shape[2]))
        return TreeOutcome(tree, lengths, drafts, logits, hidden, acc, keep, verify_s=verify_s, draft_s=t1 - t0,
                           accept_s=t3 - t2, commit_s=commit_s)

    def shape(self, row: int) -> list[int]:
        return self.last.shape(row)
