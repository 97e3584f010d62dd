"""The tree acceptance rule (pdraft.decode.tree_accept) on exact joints: the greedy longest matching path by hand;
sampled trees whose first two output tokens follow the target's exact joint (chi-square, false-alarm rate 1e-3)
with candidates drawn without replacement, drawn deterministically (top-k), and with width 1 (the chain); and two
negative controls the same test catches: the residual left unnormalised after a rejected sibling, and
without-replacement candidates tested as if drawn with replacement."""

import pytest
import torch

from pdraft.decode.tree_accept import accept_tree, children_of
from pdraft.models.api import SamplingParams
from pdraft.models.sampling import probs_from_logits
from test_decode_sampling import ALPHA, TwoStep, chi_square_p, draw, joint_counts


def test_children_in_drafted_order():
    parents = torch.tensor([[0, 0, 1, 1, 2, 0]])
    kids = children_of(parents, torch.ones(1, 6, dtype=torch.bool), width=3)
    assert kids[0, 0].tolist() == [1, 2, 6] and kids[0, 1].tolist() == [3, 4, 0] and kids[0, 2].tolist() == [5, 0, 0]
    kids = children_of(parents, torch.tensor([[True, False, True, True, False, True]]), width=2)
    assert kids[0, 0].tolist() == [1, 6] and kids[0, 2].tolist() == [0, 0]


def test_greedy_keeps_the_longest_matching_path():
    # root -> {1: tok 2, 2: tok 5}; node 1 -> {3: tok 4}; node 2 -> {4: tok 1, 5: tok 3}; node 5 -> {6: tok 0}
    tokens = torch.tensor([[2, 5, 4, 1, 3, 0]])
    parents = torch.tensor([[0, 0, 1, 2, 2, 5]])
    argmax = [5, 4, 3, 0, 0, 2, 1]  # target argmax after node 0..6: 5 -> node 2, then 3 -> node 5, then 2 != 0
    logits = torch.nn.functional.one_hot(torch.tensor([argmax]), 6).float() * 5
    acc = accept_tree(logits, tokens, parents, torch.ones(1, 6, dtype=torch.bool), None, None, width=2, depth=3)
    assert acc.accepted.tolist() == [2] and acc.path[0].tolist() == [0, 2, 5, 0] and acc.next_token.tolist() == [2]
    real = torch.tensor([[True, True, True, True, False, True]])  # node 5 not verified: the path stops at node 2
    acc = accept_tree(logits, tokens, parents, real, None, None, width=2, depth=3)
    assert acc.accepted.tolist() == [1] and acc.next_token.tolist() == [3]


class TreeWorld(TwoStep):
    """TwoStep's target and drafts, drafted as a tree: k1 children of the root drawn from q1 and k2 children of
    each drawn from q2[child], without replacement (or the top k of q when `top_k`)."""

    def sample_tree(self, n, sampling, g, k1, k2, *, top_k=False, **control):
        v = self.vocab
        if top_k:
            c1 = self.q1.topk(k1).indices.expand(n, -1)  # [n, k1]
            c2 = self.q2.topk(k2, dim=-1).indices[c1]  # [n, k1, k2]
        else:
            c1 = torch.multinomial(self.q1.expand(n, -1), k1, replacement=False, generator=g)  # sequential draws
            c2 = torch.multinomial(self.q2[c1.flatten()], k2, replacement=False, generator=g).view(n, k1, k2)
        tokens = torch.cat([c1, c2.flatten(1)], dim=1)  # [n, N] parents first
        parents = torch.cat([torch.zeros(n, k1, dtype=torch.long),
                             torch.arange(1, k1 + 1).repeat_interleave(k2).expand(n, -1)], dim=1)
        nodes = tokens.shape[1]
        logits = torch.zeros(n, nodes + 1, v)
        logits[:, 0] = self.t1
        logits[:, 1:k1 + 1] = self.t2[c1]
        probs = None
        if not top_k:
            probs = torch.full((n, nodes + 1, v), 1.0 / v)
            probs[:, 0] = self.q1
            probs[:, 1:k1 + 1] = self.q2[c1]
        acc = accept_tree(logits, tokens, parents, torch.ones(n, nodes, dtype=torch.bool), probs, sampling,
                          torch.rand(n, nodes + 1, generator=g), width=max(k1, k2), depth=2, **control)
        at = tokens.gather(1, (acc.path[:, 1:] - 1).clamp(min=0))  # [n, 2] tokens of the kept path
        y1 = torch.where(acc.accepted == 0, acc.next_token, at[:, 0])
        fresh = draw(probs_from_logits(self.t2[y1], sampling), g)  # after a rejection at depth 1: the next round
        y2 = torch.where(acc.accepted == 0, fresh, torch.where(acc.accepted == 1, acc.next_token, at[:, 1]))
        return y1, y2, acc


SAMPLINGS = [SamplingParams(temperature=1.0), SamplingParams(temperature=0.8, top_k=4)]


@pytest.mark.parametrize("k1,k2,top_k", [(3, 2, False), (1, 1, False), (2, 3, True)],
                         ids=["3x2-without-replacement", "chain", "2x3-top-k"])
@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["t1", "t0.8-k4"])
def test_sampled_tree_follows_the_target_joint(k1, k2, top_k, sampling):
    world, g = TreeWorld(vocab=6, seed=1), torch.Generator().manual_seed(7)
    y1, y2, acc = world.sample_tree(20000, sampling, g, k1, k2, top_k=top_k)
    if sampling.top_k == 0:  # (with the target's top-k the deterministic candidates may all lie outside it)
        assert set(acc.accepted.unique().tolist()) == {0, 1, 2}  # every outcome occurs
        if k1 > 1:  # later siblings were accepted too
            assert bool((acc.path[:, 1] > 1).any())
    assert chi_square_p(joint_counts(y1, y2, 6), world.exact(sampling)) > ALPHA


@pytest.mark.parametrize("control", [{"renormalise": False}, {"without_replacement": False}],
                         ids=["residual-not-renormalised", "tested-as-with-replacement"])
def test_negative_controls_are_caught(control):
    """The same draws and the same test: each biased variant of the rule is detected."""
    world, g = TreeWorld(vocab=6, seed=1), torch.Generator().manual_seed(7)
    sampling = SAMPLINGS[0]
    y1, y2, _ = world.sample_tree(20000, sampling, g, 3, 2, **control)
    assert chi_square_p(joint_counts(y1, y2, 6), world.exact(sampling)) < ALPHA
