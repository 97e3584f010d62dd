"""Draft trees from one parallel pass (pdraft.models.tree) for DFlash, DSpark (Markov and RNN heads) and DFlash2:
the best-first shape by hand; the tree of width 1 and budget gamma is the chain, token for token and q for q,
greedy and sampled; a wider tree keeps the budget, the width and the depth, holds distinct siblings, each node's
q is its own distribution given its parent (DSpark's head, DFlash2's selector), and sampled children come from
that q (inside its support); EAGLE-3 refuses in one line."""

import pytest
import torch

from doubles import tiny_target, widen as widen_weights
from pdraft.errors import PdraftError
from pdraft.models.api import SamplingParams
from pdraft.models.build import build_drafter
from pdraft.models.tree import draft_tree, plan
from test_models_support import captured

FAMILIES = {
    "dflash": {},
    "dspark": dict(confidence_head=True),
    "dspark-rnn": dict(sequential_head="rnn"),
    "dflash2": dict(conv_group_size=8, selector_rank=8, selector_top_k=4),
}


@pytest.fixture(scope="module")
def target():
    return tiny_target(32, 32, num_layers=2)


def make(target, name):
    kind = name.split("-")[0]
    drafter = build_drafter(kind, target.config, seed=0, mask_token_id=31, num_hidden_layers=1, block_size=8,
                            **FAMILIES[name])
    widen_weights(drafter, 0.3)
    drafter.attach_target(target)
    return drafter.eval()


def context(target, drafter, batch=3):
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2], [2, 7, 1, 8, 2, 8, 1], [1, 1, 2, 3, 5, 8, 13]])[:batch]
    hidden = captured(target, ids, drafter.config.target_layer_ids)
    state = drafter.new_state(batch)
    drafter.extend_context(state, hidden[:, :6], torch.arange(6).expand(batch, 6))
    return state, ids[:, 6], torch.full((batch,), 6)


def test_plan_is_best_first_parents_first():
    top = torch.tensor([[[0.6, 0.3], [0.9, 0.05], [0.5, 0.4]]])  # [1, G=3, w=2]
    parents, depth, real = plan(top, torch.tensor([3]), torch.tensor([4]), 5, 2)
    # scores: a=0.6 (d1 r0), b=0.3 (d1 r1), a.a=0.54, a.a.a=0.27, b.a=0.27, a.a.b=0.216, a.b=0.03
    assert real[0].tolist() == [True, True, True, True, False]  # the node limit (4) binds before the budget (5)
    assert depth[0, :4].tolist() == [1, 1, 2, 3] and parents[0, :4].tolist() == [0, 0, 1, 3]
    parents, depth, real = plan(top, torch.tensor([2]), torch.tensor([9]), 4, 2)  # depth limited to 2
    assert depth[0].tolist() == [1, 1, 2, 2] and parents[0].tolist() == [0, 0, 1, 2]
    parents, depth, real = plan(top, torch.tensor([3]), torch.tensor([3]), 3, 1)  # width 1: the chain
    assert depth[0].tolist() == [1, 2, 3] and parents[0].tolist() == [0, 1, 2]


@pytest.mark.parametrize("name", list(FAMILIES))
@pytest.mark.parametrize("sampling", [None, SamplingParams(temperature=1.0), SamplingParams(0.8, top_k=5)],
                         ids=["greedy", "t1", "t0.8-k5"])
def test_width_one_is_the_chain(target, name, sampling):
    drafter = make(target, name)
    state, anchors, pos = context(target, drafter)
    gamma = 5
    u = torch.rand(3, gamma, generator=torch.Generator().manual_seed(3))
    chain = drafter.propose(state, anchors, pos, gamma, sampling, None if sampling is None else u)
    tree = draft_tree(drafter, state, anchors, pos, gamma, gamma, 1, sampling, None if sampling is None else u)
    assert tree.real.all() and tree.depth.tolist() == [[1, 2, 3, 4, 5]] * 3
    if name == "dflash2" and sampling is not None:
        # The same law, but the walk inverts its CDF over the K candidates in score order and the tree over the
        # vocabulary: one uniform maps to different tokens, so only the first distribution is comparable.
        assert torch.allclose(tree.probs[:, 0], chain.probs[:, 0], atol=1e-6)
        return
    assert torch.equal(tree.tokens, chain.tokens)
    if sampling is not None:
        assert torch.allclose(tree.probs[:, :gamma], chain.probs, atol=1e-6)


@pytest.mark.parametrize("name", list(FAMILIES))
@pytest.mark.parametrize("sampling", [None, SamplingParams(temperature=1.0)], ids=["greedy", "t1"])
def test_a_wider_tree(target, name, sampling):
    drafter = make(target, name)
    state, anchors, pos = context(target, drafter)
    nodes, width, gamma = 12, 3, 6
    u = torch.rand(3, nodes, generator=torch.Generator().manual_seed(4))
    tree = draft_tree(drafter, state, anchors, pos, gamma, nodes, width, sampling, u,
                      depth_limit=torch.tensor([6, 2, 6]), node_limit=torch.tensor([12, 12, 5]))
    assert tree.real.sum(1).tolist() == [12, 12, 5] if name != "dflash2" else tree.real.sum(1).max() <= 12
    assert int(tree.depth[1][tree.real[1]].max()) <= 2
    ext = torch.cat([anchors.unsqueeze(1), tree.tokens], dim=1)
    for b in range(3):
        shape = tree.shape(b)
        assert sum(shape) == int(tree.real[b].sum()) and len(shape) == gamma
        for node in range(tree.nodes + 1):
            kids = [i for i in range(tree.nodes) if tree.real[b, i] and int(tree.parents[b, i]) == node]
            assert len(kids) <= width
            assert len({int(tree.tokens[b, i]) for i in kids}) == len(kids)  # distinct siblings
            if sampling is not None and kids:
                assert (tree.probs[b, node, tree.tokens[b, kids]] > 0).all()  # drawn inside q's support
                assert torch.allclose(tree.probs[b, node].sum(), torch.tensor(1.0), atol=1e-5)
    if name != "dflash" and sampling is not None:
        # Children of two different depth-1 nodes have different q (the head / the selector reads the parent).
        firsts = [i + 1 for i in range(tree.nodes) if tree.real[0, i] and int(tree.depth[0, i]) == 1]
        with_kids = [n for n in firsts if tree.probs[0, n].sum() > 0]
        if len(with_kids) >= 2:
            assert not torch.allclose(tree.probs[0, with_kids[0]], tree.probs[0, with_kids[1]])
    del ext


def test_eagle3_refuses_a_tree():
    target = tiny_target(32, 32, num_layers=4)
    drafter = build_drafter("eagle3", target.config, seed=0, ttt_steps=4)
    drafter.attach_target(target)
    with pytest.raises(PdraftError, match="cannot draft a tree"):
        drafter.tree_block(None, torch.tensor([1]), torch.tensor([3]), 4)
