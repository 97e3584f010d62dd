"""`pdraft train` with `drafter.draft_vocab_size` (issue 40) for DSpark and DFlash2 on the tiny test target: a few
steps run, the final checkpoint's config.json keeps the draft vocabulary's size, its file holds the own head
[V_d, H] and the `d2t` / `t2d` maps of the training responses' most frequent tokens, and the trained drafter
loads and decodes greedily to exactly the target's own tokens, its drafts target ids of the draft vocabulary."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from pdraft.cli.main import main
from pdraft.decode.engine import generate
from pdraft.models import load_drafter
from pdraft.models.api import SamplingParams
from pdraft.models.vocab import draft_vocabulary
from pdraft.train.batches import split_validation
from test_models_support import captured
from test_train_dflash2 import DFLASH2
from test_train_loop import env, recipe_file, setup  # noqa: F401 - env is a fixture

DRAFT_VOCAB = 16  # of the 19 tokens the tiny data's responses hold
KINDS = {"dspark": ["drafter.kind=dspark"], "dflash2": DFLASH2}


@pytest.mark.parametrize("kind", list(KINDS))
def test_pdraft_train_keeps_the_draft_vocabulary_and_decodes_losslessly(env, capsys, kind):  # noqa: F811
    root, target, data = env
    path = recipe_file(root, target, data, f"vocab-{kind}", steps=20, eval_every=20, checkpoint_every=20,
                       lr=1e-2, alpha_ce=0.0, alpha_tv=1.0, num_anchors=16)
    overrides = [*KINDS[kind], f"drafter.draft_vocab_size={DRAFT_VOCAB}"]
    _, t, source = setup(path, overrides)  # writes the hidden-state cache
    assert main(["train", str(path), *sum((["--set", s] for s in overrides), [])]) == 0
    capsys.readouterr()
    final = root / f"vocab-{kind}" / "final"
    cfg = json.loads((final / "config.json").read_text())
    weights = load_file(str(final / "model.safetensors"))
    vocab, hidden = int(t.model.config.vocab_size), int(t.model.config.hidden_size)
    assert cfg["draft_vocab_size"] == DRAFT_VOCAB
    assert tuple(weights["lm_head.weight"].shape) == (DRAFT_VOCAB, hidden)
    assert weights["d2t"].dtype == torch.int64 and tuple(weights["d2t"].shape) == (DRAFT_VOCAB,)
    assert weights["t2d"].dtype == torch.bool and tuple(weights["t2d"].shape) == (vocab,)
    # the vocabulary is the training responses' most frequent tokens, as the trainer counts them
    train_ids, _ = split_validation(len(source))
    want = draft_vocabulary(source.token_counts(train_ids, vocab), DRAFT_VOCAB)  # [V_d] target ids
    assert torch.equal(torch.arange(DRAFT_VOCAB) + weights["d2t"], want)
    assert int(weights["t2d"].sum()) == DRAFT_VOCAB and bool(weights["t2d"][want].all())

    drafter = load_drafter(final, t.model.config).eval()
    drafter.attach_target(t.model)
    assert drafter.config.draft_vocab_size == DRAFT_VOCAB and torch.equal(drafter.vocab_ids(), want)
    batch = source.batch(train_ids[:3], "cpu", torch.float32)
    prompts = [row[: int(mask.nonzero()[0]) + 2].tolist() for row, mask in zip(batch.input_ids, batch.loss_mask)]
    alone = generate(t.model, None, prompts, max_new_tokens=16).output_ids
    for gamma in (2, drafter.max_gamma()):
        assert generate(t.model, drafter, prompts, gamma=gamma, max_new_tokens=16).output_ids == alone
    # its drafts are target ids of the draft vocabulary (mapped through d2t; the vocabulary is not ids 0..V_d-1),
    # greedy and sampled, and each sampled draft has mass under the q it was drawn from
    assert not torch.equal(want.sort().values, torch.arange(DRAFT_VOCAB))
    torch.manual_seed(0)
    for prompt in prompts:
        ids = torch.tensor([prompt])
        state = drafter.new_state(1)
        drafter.extend_context(state, captured(t.model, ids, drafter.config.target_layer_ids),
                               torch.arange(ids.shape[1])[None])
        for sampling in (SamplingParams(), SamplingParams(temperature=1.0)):
            p = drafter.propose(state, ids[:, -1], torch.tensor([ids.shape[1]]), drafter.max_gamma(), sampling)
            assert set(p.tokens.flatten().tolist()) <= set(want.tolist())
            if p.probs is not None:  # [1, gamma, vocab]
                assert bool((p.probs.gather(-1, p.tokens[..., None]) > 0).all())
