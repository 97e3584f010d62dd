"""Acceptance of a verified draft *tree*: which root-to-node path a request keeps and which token the target adds
itself, losslessly. The chain's rule (pdraft.decode.acceptance) is the tree of width 1.

A tree of N drafted nodes hangs under the root (node 0, the anchor); node i (1..N) holds a token, a parent
(< i: nodes come parents first, siblings in the order they were drafted) and the target's logits after the
path root..i come from the one verify pass (pdraft.decode.tree_verify).

Greedy: the longest root-to-node path whose every token equals the target's argmax after its parent. Siblings
hold distinct tokens, so at most one child of a node matches and the path is unique; the added token is the
target's argmax after the path's last node.

Sampling: recursive rejection sampling over siblings (SpecInfer, Miao et al., ASPLOS 2024, "multi-step
speculative sampling"; with candidates drawn without replacement as in Sequoia, Chen et al., 2024, section
3.2). At a node u with target distribution p = p_t(. | path to u) the children c_1..c_k were drawn in that order,
c_j from q_j, the draft distribution of u's children with c_1..c_{j-1} removed and renormalised (without
replacement; `probs` holds q = q_1 per node). Starting from r_1 = p:

    for j = 1..k:  accept c_j with probability min(1, r_j(c_j) / q_j(c_j)) and descend into c_j, or else
                   r_{j+1} = (r_j - q_j)+ / |(r_j - q_j)+|      (the residual, renormalised)
    no child accepted: draw the token from r_{k+1}; a node without children draws from p (the bonus token).

Why the output follows p (sketch of SpecInfer's Theorem 4.2 / Sequoia's Theorem 3.6 for this variant): claim
that, conditioned on everything before step j, the token emitted from step j on has law r_j. For the last step
it holds by construction (a draw from r_{k+1}). Step j: c_j ~ q_j given the past (it is the j-th draw without
replacement, and nothing before it looked at c_j), so P(emit x at step j) = q_j(x) min(1, r_j(x)/q_j(x)) =
min(q_j(x), r_j(x)), and P(reject) = 1 - sum_x min(q_j, r_j) = |(r_j - q_j)+| =: beta. A rejection happens only
where q_j(c_j) > r_j(c_j), so r_{j+1}(c_j) = 0 and r_{j+1} does not depend on which c_j was rejected; by the
claim for j + 1, after a rejection the emitted token has law r_{j+1} = (r_j - q_j)+ / beta whatever c_j was. In
total min(q_j, r_j)(x) + (r_j - q_j)+(x) = r_j(x). With j = 1 the first token has law p; an accepted child c then
starts the same argument one level down with p_t(. | path to c), so every token of the round, and the bonus or
correction token, follows the target (the chain's argument of Leviathan et al. applied per level). Two things
break it, and the negative controls in tests/test_tree_accept.py are these: leaving r unnormalised after a
rejection (then later siblings are tested against the wrong ratio), and testing without-replacement draws
against q itself (as if they had been drawn with replacement). Deterministic candidates (a drafter's top-k,
`probs` None) are the case q_j = one-hot(c_j): accept c_j with probability r_j(c_j), else drop it from r.

Each request is handled at once with masks, one step per depth and per sibling rank; randomness comes only
from the uniforms the caller passes (the request's own stream, pdraft.streams)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pdraft.models.api import SamplingParams
from pdraft.models.sampling import greedy_ids, inverse_cdf, is_greedy, probs_from_logits


@dataclass
class TreeAcceptance:
    accepted: torch.Tensor  # [batch] long: a, the depth of the kept path (0 = no draft kept)
    next_token: torch.Tensor  # [batch] long: the target's own token after the path (correction or bonus)
    path: torch.Tensor  # [batch, D + 1] long: node index at each depth of the kept path (column 0: the root, 0);
    # columns past a hold 0


def children_of(parents: torch.Tensor, real: torch.Tensor, width: int) -> torch.Tensor:
    """parents [batch, N] long (0 = the root; node i+1's parent), real [batch, N] bool -> children [batch, N+1,
    width] long: the j-th child (node index 1..N) of every node, in drafted order; 0 where there is none."""
    batch, n = parents.shape
    dev = parents.device
    ids = torch.arange(1, n + 1, device=dev)
    same = (parents.unsqueeze(2) == parents.unsqueeze(1)) & real.unsqueeze(1) & real.unsqueeze(2)  # [b, N, N]
    earlier = torch.ones(n, n, dtype=torch.bool, device=dev).tril(-1)  # [i, j]: j < i
    rank = (same & earlier).sum(-1)  # [batch, N]: siblings drafted before each node
    out = torch.zeros(batch, n + 1, width + 1, dtype=torch.long, device=dev)  # column `width`: overflow, dropped
    slot = torch.where(real & (rank < width), rank, torch.full_like(rank, width))
    out[torch.arange(batch, device=dev).unsqueeze(1), parents, slot] = ids.expand(batch, n)
    return out[..., :width]


def accept_tree(
    target_logits: torch.Tensor,  # [batch, N+1, vocab]: after the root (anchor) and after each node
    tokens: torch.Tensor,  # [batch, N] long: node i+1's token
    parents: torch.Tensor,  # [batch, N] long: node i+1's parent, 0..i (0 = the root)
    real: torch.Tensor,  # [batch, N] bool: the nodes drafted and verified (the rest is padding)
    probs: torch.Tensor | None,  # [batch, N+1, vocab]: q of each node's children before any was drawn; None:
    # the children are deterministic (a drafter's top-k), i.e. q_j = one-hot(c_j)
    sampling: SamplingParams | None,
    uniforms: torch.Tensor | None = None,  # [batch, N+1]: column i-1 tests node i, the last column the final draw
    *,
    width: int,  # most children of any node
    depth: int,  # deepest node
    renormalise: bool = True,  # False ONLY for the negative-control test (residual left unnormalised)
    without_replacement: bool = True,  # False ONLY for the negative-control test (siblings tested against q)
) -> TreeAcceptance:
    batch, n = tokens.shape
    dev = target_logits.device
    tokens, parents, real = tokens.to(dev), parents.to(dev), real.to(dev)
    rows = torch.arange(batch, device=dev)
    kids = children_of(parents, real, width)  # [batch, N+1, width]
    ext = torch.cat([torch.zeros(batch, 1, dtype=torch.long, device=dev), tokens], dim=1)  # [batch, N+1]
    path = torch.zeros(batch, depth + 1, dtype=torch.long, device=dev)
    accepted = torch.zeros(batch, dtype=torch.long, device=dev)
    cur = torch.zeros(batch, dtype=torch.long, device=dev)  # the path's last node

    if is_greedy(sampling):
        best = greedy_ids(target_logits)  # [batch, N+1]
        for d in range(depth):
            child = kids[rows, cur]  # [batch, width]
            hit = (ext.gather(1, child) == best[rows, cur].unsqueeze(1)) & (child > 0)  # at most one per row
            moved = hit.any(-1)
            cur = torch.where(moved, child.gather(1, hit.long().argmax(-1, keepdim=True)).squeeze(1), cur)
            accepted += moved.long()
            path[:, d + 1] = torch.where(moved, cur, 0)
            if not bool(moved.any()):
                break
        return TreeAcceptance(accepted, best[rows, cur], path)

    p_t = probs_from_logits(target_logits, sampling)  # [batch, N+1, vocab]
    vocab = p_t.shape[-1]
    if uniforms is None:
        uniforms = torch.rand(batch, n + 1)
    uniforms = uniforms.to(dev).float()
    u_ext = torch.cat([torch.zeros(batch, 1, device=dev), uniforms[:, :n]], dim=1)  # [batch, N+1] by node index
    q_all = probs.to(dev).float() if probs is not None else None
    r = p_t[:, 0].clone()  # [batch, vocab] the residual target at the current node
    q = q_all[:, 0].clone() if q_all is not None else None  # [batch, vocab] q of the next sibling
    active = torch.ones(batch, dtype=torch.bool, device=dev)
    for d in range(depth):
        moved = torch.zeros(batch, dtype=torch.bool, device=dev)
        for j in range(width):
            c = kids[rows, cur, j]  # [batch]
            test = active & ~moved & (c > 0)
            if not bool(test.any()):
                break
            tok = ext[rows, c]
            q_j = q if q is not None else torch.nn.functional.one_hot(tok, vocab).float()
            ok = test & (u_ext[rows, c] * q_j[rows, tok] < r[rows, tok])  # u < r / q without dividing by q
            rej = test & ~ok
            residual = (r - q_j).clamp_min(0.0)
            if renormalise:
                mass = residual.sum(-1, keepdim=True)
                # mass is 0 only when r == q_j, where a rejection has probability 0; keep r for float safety
                residual = torch.where(mass > 0, residual / mass.clamp_min(1e-30), r)
            r = torch.where(rej.unsqueeze(1), residual, r)
            if q is not None and without_replacement:  # the next sibling was drawn with c_j removed
                dropped = q.scatter(1, tok.unsqueeze(1), 0.0)
                dropped = dropped / dropped.sum(-1, keepdim=True).clamp_min(1e-30)
                q = torch.where(rej.unsqueeze(1), dropped, q)
            cur = torch.where(ok, c, cur)
            moved |= ok
        accepted += moved.long()
        path[:, d + 1] = torch.where(moved, cur, 0)
        active &= moved
        if bool(moved.any()):  # a row that moved starts over at its new node
            r = torch.where(moved.unsqueeze(1), p_t[rows, cur], r)
            if q is not None:
                q = torch.where(moved.unsqueeze(1), q_all[rows, cur], q)
        else:
            break
    # Rows that stopped draw from their residual; rows whose path ended at a leaf (or at `depth`) have r = p_t
    # there: the bonus token.
    final = r / r.sum(-1, keepdim=True).clamp_min(1e-30)
    return TreeAcceptance(accepted, inverse_cdf(final, uniforms[:, -1]), path)
