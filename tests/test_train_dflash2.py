"""Training a DFlash2 drafter: `pdraft train` of a tiny dflash2 recipe on the tiny test target runs, lowers the
loss, and logs the selector's term and figures (candidate recall, selector / unary accuracy, lift); the
selector term is alpha_selector x the K-way cross-entropy and reaches the selector's parameters; the selector's
distance from the target's distribution over its K (`selector_tv`) is logged whichever label trains."""

from __future__ import annotations

import json

import torch

from pdraft.cli.main import main
from test_train_loop import env, recipe_file, setup  # noqa: F401 - env is a fixture

SELECTOR = ("selector_ce", "candidate_recall", "selector_accuracy", "unary_accuracy", "selector_lift", "selector_tv")
DFLASH2 = ["drafter.kind=dflash2", "drafter.conv_group_size=8", "drafter.selector_rank=8",
           "drafter.selector_top_k=4"]


def test_pdraft_train_dflash2_lowers_the_loss_and_logs_the_selector(env, capsys):  # noqa: F811
    root, target, data = env
    path = recipe_file(root, target, data, "dflash2", steps=40, eval_every=40, lr=1e-2, alpha_ce=0.0,
                       alpha_tv=1.0, num_anchors=16)
    setup(path, DFLASH2)  # writes the hidden-state cache
    args = ["train", str(path), *sum((["--set", s] for s in DFLASH2), [])]
    assert main(args) == 0
    shown = capsys.readouterr().out
    assert "dflash2 validation" in shown and "selector acc" in shown
    run = root / "dflash2"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train_rows = [row for row in rows if "loss" in row]
    assert train_rows[-1]["loss"] < train_rows[0]["loss"]
    assert train_rows[-1]["selector_ce"] < train_rows[0]["selector_ce"]
    for row in train_rows + [rows[-1]["validation"]]:
        assert set(SELECTOR) <= set(row)
        assert 0.0 <= row["candidate_recall"] <= 1.0
        assert abs(row["selector_lift"] - (row["selector_accuracy"] - row["unary_accuracy"])) < 1e-6
        assert 0.0 <= row["selector_tv"] <= 1.0
    cfg = json.loads((run / "final" / "config.json").read_text())
    assert cfg["architectures"] == ["DFlash2DraftModel"]


def test_selector_term_is_alpha_times_the_k_way_ce_and_trains_the_selector(env):  # noqa: F811
    from pdraft.train.loop import LossSettings, TrainForward, block_loss
    from pdraft.models.build import build_from_recipe
    from pdraft.train.batches import micro_generator, sample_anchors

    root, target, data = env
    r, t, source = setup(recipe_file(root, target, data, "dflash2-alpha"), DFLASH2)
    drafter = build_from_recipe(r.drafter, t, seed=0)
    drafter.attach_target(t.model)
    w_lm = t.model.get_output_embeddings().weight
    batch = source.batch([0, 1], "cpu", torch.float32)
    anchors, keep = sample_anchors(batch.loss_mask.cpu(), 4, micro_generator(0, 0))
    losses = {}
    for alpha in (0.0, 2.0):
        settings = LossSettings.from_recipe(r.model_copy(update={"train": r.train.model_copy(
            update={"alpha_selector": alpha})}).train, drafter)
        drafter.zero_grad()
        loss, stats = block_loss(TrainForward(drafter), batch, anchors, keep, w_lm, settings)
        loss.backward()
        losses[alpha] = (float(loss.detach()), stats)
        grad = drafter.candidate_selector.successor_codebook.grad
        assert (grad is not None and float(grad.abs().sum()) > 0) == (alpha > 0)
    (l0, s0), (l2, s2) = losses[0.0], losses[2.0]
    assert abs((l2 - l0) - 2.0 * s2.extra["selector_ce"]) < 1e-4
