"""Training an EAGLE-3 drafter: `pdraft train` with `drafter.kind=eagle3` lowers EAGLE-3's loss (the KL
divergence from the target's distribution, each of the K training-time-test steps weighted 0.8^(k-1)), picks
its draft vocabulary from the training responses, writes the engines' layout, resumes exactly and trains
online; the shared loss, given a drafter's own head over a reduced vocabulary, computes CE, TV and KL in the
target's vocabulary with q = 0 outside the drafter's, as the definitions say."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from pdraft.cli.main import main
from pdraft.models import load_drafter
from pdraft.models.eagle3.model import draft_vocabulary
from pdraft.train.batches import split_validation
from pdraft.train.losses import drafter_loss
from test_train_loop import env, recipe_file, setup, weights  # noqa: F401 - env is a fixture

EAGLE3 = ["drafter.kind=eagle3", "drafter.draft_vocab_size=120", "drafter.ttt_steps=3"]


def test_pdraft_train_eagle3_lowers_its_loss_and_writes_the_engines_layout(env, capsys):  # noqa: F811
    root, target, data = env
    path = recipe_file(root, target, data, "eagle3", steps=40, eval_every=40, lr=1e-2, alpha_ce=0.0, num_anchors=16)
    r, t, source = setup(path, EAGLE3)
    assert main(["train", str(path), *sum((["--set", s] for s in EAGLE3), [])]) == 0
    assert "eagle3 validation" in capsys.readouterr().out
    run = root / "eagle3"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train_rows = [row for row in rows if "loss" in row]
    assert train_rows[-1]["kl"] < train_rows[0]["kl"] and train_rows[-1]["loss"] < train_rows[0]["loss"]
    assert len(train_rows[0]["accept_per_position"]) == 3  # one per training-time-test step
    cfg = json.loads((run / "final" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["draft_vocab_size"] == 120
    assert cfg["pdraft"]["ttt_steps"] == 3
    drafter = load_drafter(run / "final", t.config)
    train_ids, _ = split_validation(len(source))
    want = draft_vocabulary(source.token_counts(train_ids, t.config.vocab_size), 120)
    assert torch.equal(drafter.vocab_ids(), want)  # the training responses' 120 most frequent tokens


def test_eagle3_resumes_exactly_and_trains_online(env):  # noqa: F811
    from pdraft.train.loop import train

    root, target, data = env
    straight = recipe_file(root, target, data, "e3-straight", steps=8, checkpoint_every=4)
    r, t, source = setup(straight, EAGLE3)
    train(r, t, source, run_dir=Path(r.train.output_dir))
    stopped = recipe_file(root, target, data, "e3-stopped", steps=8, checkpoint_every=4)
    r2, t2, source2 = setup(stopped, EAGLE3)
    train(r2, t2, source2, run_dir=Path(r2.train.output_dir), stop_after=4)
    report = train(r2, t2, source2, run_dir=Path(r2.train.output_dir))
    assert report.resumed_from == 4
    a, b = weights(root / "e3-straight" / "final"), weights(root / "e3-stopped" / "final")
    assert a.keys() == b.keys() and {"d2t", "t2d", "lm_head.weight"} <= set(a)
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0, msg=key)
    online = recipe_file(root, target, data, "e3-online", steps=3)
    r3, t3, source3 = setup(online, [*EAGLE3, "train.online=true"])
    assert source3.online and train(r3, t3, source3, run_dir=Path(r3.train.output_dir)).steps == 3


def test_eagle3_loss_defaults_are_eagle3s(env):  # noqa: F811
    from pdraft.models.build import build_from_recipe
    from pdraft.train.loop import LossSettings
    from pdraft.train.losses import position_weights

    root, target, data = env
    r, t, _ = setup(recipe_file(root, target, data, "e3-defaults"), EAGLE3)
    s = LossSettings.from_recipe(r.train, build_from_recipe(r.drafter, t))
    assert (s.alpha_kl, s.alpha_tv, s.alpha_conf) == (1.0, 0.0, 0.0)
    assert position_weights(torch.arange(4), s.decay).tolist() == pytest.approx([1.0, 0.8, 0.64, 0.512])
    r2, _, _ = setup(recipe_file(root, target, data, "e3-set", alpha_kl=0.5, loss_decay=2.0), EAGLE3)
    s2 = LossSettings.from_recipe(r2.train, build_from_recipe(r2.drafter, t))
    assert (s2.alpha_kl, s2.decay) == (0.5, 2.0)


def test_a_drafters_own_head_is_scored_in_the_target_vocabulary():
    g = torch.Generator().manual_seed(0)
    n, hidden, vocab = 6, 8, 10
    h, t_hidden = torch.randn(n, hidden, generator=g), torch.randn(n, hidden, generator=g)
    w_lm, head = torch.randn(vocab, hidden, generator=g), torch.randn(4, hidden, generator=g)
    rows = torch.tensor([1, 3, 4, 8])  # the target ids the head drafts
    targets = torch.tensor([3, 0, 8, 8, 1, 5])  # 0 and 5 cannot be drafted
    weights = torch.tensor([1.0, 0.5, 0.25, 1.0, 1.0, 0.5])
    out = drafter_loss(h, w_lm, t_hidden, targets, weights, head=head, vocab=rows, alpha_ce=0.0, alpha_kl=1.0)
    q = torch.zeros(n, vocab).index_copy(1, rows, torch.softmax(h @ head.t(), -1))  # q = 0 outside the rows
    p = torch.softmax(t_hidden @ w_lm.t(), -1)
    tv = 0.5 * (q - p).abs().sum(-1)
    p_r = p[:, rows] / p[:, rows].sum(-1, keepdim=True)
    inside = torch.tensor([1.0, 0, 1, 1, 1, 0])
    kl = (p_r * (p_r.log() - q[:, rows].log())).sum(-1) * inside
    ce = -q[torch.arange(n), targets].clamp_min(1e-30).log() * inside
    mean = lambda x: float((x * weights).sum() / weights.sum())  # noqa: E731
    assert float(out.tv) == pytest.approx(mean(tv), rel=1e-5) and float(out.kl) == pytest.approx(mean(kl), rel=1e-5)
    assert float(out.ce) == pytest.approx(mean(ce), rel=1e-5) and float(out.loss) == pytest.approx(mean(kl), rel=1e-5)
    assert out.agree.tolist() == (rows[(h @ head.t()).argmax(-1)] == p.argmax(-1)).float().tolist()
    assert math.isfinite(float(out.loss))
