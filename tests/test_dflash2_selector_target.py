"""`train.selector_target`: DFlash2's selector trained toward the gold token (`token`, the default, unchanged) or
toward the target's own distribution over the K loss candidates (`distribution`). The soft label is the softmax of
the target's last hidden state times its LM head's candidate rows; `token` gives today's loss bit for bit; a few
optimizer steps with `distribution` bring the selector's softmax to the target's where `token` on a flat target
cannot; the recipe key is checked."""

from __future__ import annotations

import pytest
import torch

from pdraft.cli.main import main
from pdraft.errors import PdraftError
from pdraft.models.dflash2.selector import CandidateSelector, candidate_distribution, selector_loss
from pdraft.recipe import load_recipe
from test_models_dflash2 import random_selector


def _case():
    """A hand-built batch: vocab 10, K 3, the gold of row 1 outside the drafter's top-3 (so it is injected)."""
    sel = random_selector(vocab=10, rank=3, k=3, hidden=4)
    logits = torch.tensor([[5.0, 4.0, 3.0, 2.0, 1.0, 0.0, -1.0, -2.0, -3.0, -4.0]] * 3, dtype=torch.float64)
    hidden = torch.randn(3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    gold, prev = torch.tensor([1, 7, 0]), torch.tensor([9, 8, 4])
    t_hidden = torch.randn(3, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    t_head = torch.randn(10, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    return sel, logits, hidden, gold, prev, t_hidden, t_head


def test_the_soft_target_is_the_targets_softmax_over_the_loss_candidates():
    sel, logits, hidden, gold, prev, t_hidden, t_head = _case()
    loss_ids = [[0, 1, 2], [0, 1, 7], [0, 1, 2]]  # row 1: the gold replaces the 3rd candidate
    want = []
    for r, ids in enumerate(loss_ids):  # written out: exp(h . W[id]) / sum over the three ids
        e = [float(torch.dot(t_hidden[r], t_head[i]).exp()) for i in ids]
        want.append([x / sum(e) for x in e])
    got = candidate_distribution(t_hidden, t_head, torch.tensor(loss_ids))
    torch.testing.assert_close(got.double(), torch.tensor(want, dtype=torch.float64), rtol=1e-5, atol=1e-7)

    w = torch.tensor([1.0, 0.5, 0.25], dtype=torch.float64)
    out = selector_loss(sel, logits, hidden, gold, prev, torch.ones(3, dtype=torch.bool), alpha=0.5, weights=w,
                        target="distribution", target_hidden=t_hidden, target_head=t_head)
    soft, tv = [], []
    for r, ids in enumerate(loss_ids):
        s = sel.pair_scores(prev[r], torch.tensor(ids), logits[r, ids], hidden[r]).detach()
        p = torch.tensor(want[r], dtype=torch.float64)
        soft.append(float(-(p * torch.log_softmax(s, -1)).sum()))
        tv.append(float(0.5 * (torch.softmax(s, -1) - p).abs().sum()))
    assert float(out.loss.detach()) == pytest.approx(0.5 * sum(x * y for x, y in zip(soft, w.tolist())) / 1.75,
                                                     rel=1e-5)
    assert out.metrics()["selector_tv"] == pytest.approx(sum(tv) / 3, rel=1e-5)
    out.loss.backward()
    assert sel.successor_codebook.grad[7].abs().sum() > 0  # the injected gold is trained toward its share


def test_token_target_is_todays_loss_bit_for_bit():
    sel, logits, hidden, gold, prev, t_hidden, t_head = _case()
    ones = torch.ones(3, dtype=torch.bool)
    runs = []
    for kw in ({}, {"target": "token", "target_hidden": t_hidden, "target_head": t_head}):
        sel.zero_grad()
        out = selector_loss(sel, logits, hidden, gold, prev, ones, alpha=0.5, **kw)
        out.loss.backward()
        runs.append((out, [p.grad.clone() for p in sel.parameters()]))
    (plain, g0), (token, g1) = runs
    assert torch.equal(plain.loss, token.loss) and torch.equal(plain.ce, token.ce)
    assert all(torch.equal(a, b) for a, b in zip(g0, g1))
    assert "selector_tv" not in plain.metrics() and "selector_tv" in token.metrics()  # the metric needs the target

    def ce(row, ids, label):  # today's K-way cross-entropy toward the gold's index
        s = sel.pair_scores(prev[row], torch.tensor(ids), logits[row, ids], hidden[row])
        return float(torch.nn.functional.cross_entropy(s[None].detach(), torch.tensor([label])))

    want = [ce(0, [0, 1, 2], 1), ce(1, [0, 1, 7], 2), ce(2, [0, 1, 2], 0)]
    assert float(token.loss.detach()) == pytest.approx(0.5 * sum(want) / 3, rel=1e-6)  # float32 scores
    dist = selector_loss(sel, logits, hidden, gold, prev, ones, alpha=0.5, target="distribution",
                         target_hidden=t_hidden, target_head=t_head)
    assert not torch.equal(dist.loss, token.loss)  # the switch does change the term
    assert torch.equal(dist.ce, token.ce)  # selector_ce stays the cross-entropy to the gold in both modes


def _train_selector(target: str, steps: int = 150) -> tuple[float, float]:
    """A tiny selector on fixed positions whose target spreads its mass nearly evenly over the K candidates (the
    gold is its argmax, as on greedy data). Returns (TV before, TV after) between the selector's softmax and the
    target's over the K, averaged over positions, computed here from the scores."""
    gen = torch.Generator().manual_seed(0)
    n, vocab, k, hid, hid_t = 24, 40, 4, 8, 6
    sel = CandidateSelector(hid, vocab, 8, k).double()
    with torch.no_grad():
        sel.successor_codebook.normal_(0.0, 0.1, generator=gen)
    logits = torch.randn(n, vocab, dtype=torch.float64, generator=gen)
    hidden = torch.randn(n, hid, dtype=torch.float64, generator=gen)
    prev = torch.randint(0, vocab, (n,), generator=gen)
    t_hidden = 0.3 * torch.randn(n, hid_t, dtype=torch.float64, generator=gen)  # small: a flat distribution
    t_head = torch.randn(vocab, hid_t, dtype=torch.float64, generator=gen)
    ids = torch.topk(logits, k, -1).indices  # the candidates (the gold is one of them: no injection)
    p_t = candidate_distribution(t_hidden, t_head, ids).double()
    gold = ids.gather(-1, p_t.argmax(-1, keepdim=True))[:, 0]
    ones = torch.ones(n, dtype=torch.bool)

    def tv() -> float:
        with torch.no_grad():
            s = sel.pair_scores(prev, ids, logits.gather(-1, ids), hidden)
            return float((0.5 * (torch.softmax(s, -1) - p_t).abs().sum(-1)).mean())

    opt = torch.optim.Adam(sel.parameters(), lr=0.05)
    before = tv()
    for _ in range(steps):
        opt.zero_grad()
        selector_loss(sel, logits, hidden, gold, prev, ones, alpha=1.0, target=target, target_hidden=t_hidden,
                      target_head=t_head).loss.backward()
        opt.step()
    return before, tv()


def test_a_few_steps_toward_the_distribution_bring_the_selector_to_the_targets_shape():
    before, soft = _train_selector("distribution")
    _, hard = _train_selector("token")
    assert soft < 0.5 * before and soft < 0.05  # it learns the target's shape over the K
    # The one-hot label sharpens the softmax toward the argmax: on a flat target it ends far from it.
    assert hard > 0.3 and hard > 5 * soft


def test_distribution_without_the_targets_hidden_states_is_refused():
    sel, logits, hidden, gold, prev, _, t_head = _case()
    with pytest.raises(PdraftError, match="last hidden states"):
        selector_loss(sel, logits, hidden, gold, prev, torch.ones(3, dtype=torch.bool), alpha=1.0,
                      target="distribution", target_head=t_head)
    with pytest.raises(PdraftError, match="selector target"):
        selector_loss(sel, logits, hidden, gold, prev, torch.ones(3, dtype=torch.bool), alpha=1.0, target="soft")


def test_the_recipe_key_defaults_to_token_reaches_the_loss_and_refuses_other_values_in_one_line(capsys):
    from pdraft.models.build import build_drafter
    from pdraft.train.loop import LossSettings
    from test_models_support import MASK, tiny_target_config

    assert load_recipe(None, ["drafter.kind=dflash2"]).train.selector_target == "token"
    r = load_recipe(None, ["drafter.kind=dflash2", "train.selector_target=distribution"])
    drafter = build_drafter("dflash2", tiny_target_config(), mask_token_id=MASK, block_size=4, num_hidden_layers=1,
                            conv_group_size=8, selector_rank=4, selector_top_k=3)
    assert LossSettings.from_recipe(r.train, drafter).family == {"alpha_selector": 1.0,
                                                                 "selector_target": "distribution"}
    with pytest.raises(PdraftError, match="train.selector_target"):
        load_recipe(None, ["drafter.kind=dflash2", "train.selector_target=soft"])
    capsys.readouterr()
    assert main(["recipe", "check", "--set", "train.selector_target=soft"]) == 2
    err = capsys.readouterr().err.strip()
    assert "train.selector_target" in err and "distribution" in err and len(err.splitlines()) == 1
