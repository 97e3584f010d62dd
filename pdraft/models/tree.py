"""Draft trees from one parallel pass: a parallel drafter's backbone gives a whole distribution at every block
position and a chain uses one token of each; a tree keeps several candidates per position and the target
verifies them all in one pass (pdraft.decode.tree_verify), which raises the accepted length at the same number
of target passes (SpecInfer, Miao et al. 2024; Sequoia, Chen et al. 2024; for parallel drafters SGLang's open
DFlash tree PR #31069 and DDTree).

A tree has a node budget N (drafted nodes, the root excluded) and a width w (most children per node); its depth
is at most gamma. The chain is the tree of width 1 and N = gamma.

Shape. Best-first over the drafter's own marginals (the expansion EAGLE-2 and DDTree use): a node is reached by
a rank path (rank j = the j-th candidate of its parent), scored by the product of the j-th largest marginal
probability at each depth along it (TreeBlock.top); the N best nodes form the tree, so a confident position
grows a chain and an unsure one branches. The shape reads the backbone's marginals only (DSpark without its
sequential head's bias, DFlash2 its unary scores), never a drawn token: it is fixed before anything is sampled,
which the sampled acceptance needs (a node whose presence depended on its own draw would be a biased draw).

Tokens, depth by depth. The children of a node come from its own distribution given the path to it
(`Drafter.tree_step`): DFlash's positions are independent, so every node of a depth shares one distribution;
DSpark's sequential head adds its bias given the node's token (and its RNN state along the path); DFlash2's
selector scores the edges out of the node's candidate. Greedy: the node's best `k` tokens by score. Sampling:
`k` draws without replacement from q, each by inverse CDF from the uniform of the node it fills (the request's
stream), so q (`DraftTree.probs`) and the draw order are exactly what the recursive rejection rule of
pdraft.decode.tree_accept needs. A node whose distribution has fewer than `k` candidates (DFlash2's K, a
top-k/top-p draft) keeps as many children as it has: that count is a function of q, known before the draws."""

from __future__ import annotations

import heapq

import torch

from pdraft.models.api import DraftTree, SamplingParams
from pdraft.models.sampling import inverse_cdf, is_greedy


def plan(top: torch.Tensor, depth_limit: torch.Tensor, node_limit: torch.Tensor, nodes: int, width: int
         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """top [batch, G, width] (marginal top probabilities, sorted), depth_limit and node_limit [batch] long ->
    (parents, depth, real) [batch, nodes], parents first by depth, siblings by rank. Best-first: popping a node
    pushes its next sibling and its first child, so parents and better siblings always come first."""
    batch, g = top.shape[:2]
    scores = top.float().cpu().tolist()
    depth_limit, node_limit = depth_limit.tolist(), node_limit.tolist()
    parents = torch.zeros(batch, nodes, dtype=torch.long)
    depth = torch.ones(batch, nodes, dtype=torch.long)
    real = torch.zeros(batch, nodes, dtype=torch.bool)
    for b in range(batch):
        top_b, dmax, nmax = scores[b], min(int(depth_limit[b]), g), min(int(node_limit[b]), nodes)
        if dmax < 1 or nmax < 1:
            continue
        picked = []  # (depth, parent pick index or -1, rank)
        heap = [(-top_b[0][0], 0, -1, 1, 0, 1.0)]  # (-score, tie, parent pick, depth, rank, the parent's score)
        tie = 1
        while heap and len(picked) < nmax:
            neg, _, parent, d, rank, above = heapq.heappop(heap)
            me = len(picked)
            picked.append((d, parent, rank))
            if rank + 1 < width and top_b[d - 1][rank + 1] > 0:  # the next sibling
                heapq.heappush(heap, (-above * top_b[d - 1][rank + 1], tie, parent, d, rank + 1, above))
                tie += 1
            if d < dmax and top_b[d][0] > 0:  # the first child
                heapq.heappush(heap, (neg * top_b[d][0], tie, me, d + 1, 0, -neg))
                tie += 1
        # Renumber parents first: by depth, then by the parent's new index, then by rank.
        order = sorted(range(len(picked)), key=lambda i: (picked[i][0], i))
        new = {}
        rows = []
        for d_now in range(1, dmax + 1):
            level = [i for i in order if picked[i][0] == d_now]
            level.sort(key=lambda i: (new[picked[i][1]] if picked[i][1] >= 0 else 0, picked[i][2]))
            for i in level:
                new[i] = len(rows) + 1
                rows.append(i)
        for k, i in enumerate(rows):
            d, parent, _ = picked[i]
            parents[b, k] = new[parent] if parent >= 0 else 0
            depth[b, k] = d
            real[b, k] = True
    return parents, depth, real


def draft_tree(drafter, state, anchor_ids: torch.Tensor, anchor_positions: torch.Tensor, gamma: int, nodes: int,
               width: int, sampling: SamplingParams | None, uniforms: torch.Tensor | None,
               depth_limit: torch.Tensor | None = None, node_limit: torch.Tensor | None = None) -> DraftTree:
    """A tree of up to `nodes` drafted tokens, `width` children per node and depth `gamma` per request, from one
    backbone pass: anchor_ids / anchor_positions [batch]; uniforms [batch, nodes] (column i - 1 draws node i;
    None when greedy); depth_limit / node_limit [batch] long cap each request's depth and nodes (its remaining
    budget, the cache's room; None = gamma, nodes)."""
    block = drafter.tree_block(state, anchor_ids, anchor_positions, width)
    top = block.top[:, :gamma]
    batch = top.shape[0]
    dev = top.device
    depth_limit = torch.full((batch,), gamma) if depth_limit is None else depth_limit.cpu().clamp(max=gamma)
    node_limit = torch.full((batch,), nodes) if node_limit is None else node_limit.cpu().clamp(max=nodes)
    parents, depth, real = plan(top, depth_limit, node_limit, nodes, width)
    parents, depth, real = parents.to(dev), depth.to(dev), real.to(dev)
    anchor_ids = anchor_ids.reshape(batch).to(dev).long()
    greedy = is_greedy(sampling)
    if not greedy:
        uniforms = (torch.rand(batch, nodes) if uniforms is None else uniforms).to(dev).float()
    tokens = torch.zeros(batch, nodes + 1, dtype=torch.long, device=dev)  # by node index, the root's = anchor
    tokens[:, 0] = anchor_ids
    live = torch.cat([torch.ones(batch, 1, dtype=torch.bool, device=dev), real], dim=1)  # [batch, N+1]
    probs = None
    carry_of: torch.Tensor | None = None  # [batch, N+1, ...]: what each node's children step returned
    for d in range(1, gamma + 1):
        level = depth == d
        live[:, 1:] &= ~level | live.gather(1, parents)  # a child that could not be drawn takes its subtree
        child = live[:, 1:] & level  # [batch, N]: nodes of this depth still alive
        if not bool(child.any()):
            break
        par = torch.where(child, parents, -1)
        # The frontier: nodes of depth d - 1 with at least one child, one row each.
        has = torch.zeros(batch, nodes + 1, dtype=torch.bool, device=dev)
        has[child.nonzero()[:, 0], par[child]] = True
        fb, fnode = has.nonzero(as_tuple=True)  # [M] request, node index
        grand = torch.cat([torch.zeros(batch, 1, dtype=torch.long, device=dev), parents], dim=1)[fb, fnode]
        carry_in = None if carry_of is None or d == 1 else carry_of[fb, grand]
        scores, q, carry = drafter.tree_step(block, d, fb, tokens[fb, fnode], carry_in, sampling)
        if carry is not None:
            if carry_of is None:
                carry_of = carry.new_zeros(batch, nodes + 1, *carry.shape[1:])
            carry_of[fb, fnode] = carry
        if q is not None:
            if probs is None:
                probs = torch.zeros(batch, nodes + 1, q.shape[-1], dtype=torch.float32, device=dev)
            probs[fb, fnode] = q.float()
        row_of = torch.full((batch, nodes + 1), -1, dtype=torch.long, device=dev)
        row_of[fb, fnode] = torch.arange(fb.numel(), device=dev)
        # Children in rank order (nodes of a depth come sorted by parent, then rank).
        cb, ci = child.nonzero(as_tuple=True)  # [C] request, node slot (node index ci + 1)
        crow = row_of[cb, par[cb, ci]]  # [C] frontier row of each child
        same = crow.unsqueeze(0) == crow.unsqueeze(1)
        rank = (same & torch.ones_like(same).tril(-1)).sum(-1)  # [C]: earlier siblings
        kmax = int(rank.max()) + 1
        if greedy:
            best = scores.float().topk(min(kmax, scores.shape[-1]), dim=-1)  # [M, k]
            tok = best.indices[crow, rank]
            ok = torch.isfinite(best.values[crow, rank])
        else:
            left = q.float().clone()  # [M, vocab]: q without the siblings drawn so far
            tok = torch.zeros_like(crow)
            ok = torch.zeros_like(crow, dtype=torch.bool)
            for j in range(kmax):
                at = (rank == j).nonzero().flatten()  # children of rank j, one per frontier row at most
                rows = crow[at]
                mass = left[rows].sum(-1)
                dist = left[rows] / mass.clamp_min(1e-30).unsqueeze(1)
                drawn = inverse_cdf(dist, uniforms[cb[at], ci[at]])
                tok[at], ok[at] = drawn, mass > 1e-12
                left[rows, drawn] = 0.0
        tokens[cb, ci + 1] = tok
        live[cb, ci + 1] = ok
    return DraftTree(tokens[:, 1:], parents, depth, live[:, 1:], probs, width, gamma)
