"""Cross-check against the reference implementations themselves: their own model code runs unmodified from
where the user has it, a checkpoint written by their own `save_pretrained` must load in pdraft, and pdraft must
give their forward pass (base logits, Markov-/RNN-adjusted logits, confidence) to float32 rounding. Nothing of
theirs is kept in the project.

Where their code comes from (each test skips, saying so, when it finds none):
- DeepSpec (deepseek-ai/DeepSpec, not published on PyPI): `PDRAFT_DEEPSPEC_SRC`, a checkout (the folder that
  holds `deepspec/`) or a git directory (exported with `git archive HEAD`).
- z-lab DFlash: `PDRAFT_ZLAB_SRC`, a checkout of z-lab/dflash (the folder that holds `dflash/model.py`) or a git
  directory; else the `dflash` package from PyPI (z-lab's own release, MIT), which CI installs with
  `pip install --no-deps dflash==0.1.0`: only its `dflash/model.py` is read, never imported as a package."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import DynamicCache, Qwen3Config

from pdraft.models import SamplingParams
from pdraft.models.checkpoint import load_drafter
from test_models_support import MASK, captured, tiny_target


def source(env: str, what: str, dest: Path, missing: str) -> Path:
    """The folder holding `what` from the reference named by $env: a checkout as it is, a git directory exported
    into dest; skips with `missing` when $env is not set."""
    given = os.environ.get(env)
    if not given:
        pytest.skip(missing)
    repo = Path(given)
    if (repo / what).exists():
        return repo
    if not repo.is_dir() or not ((repo / "HEAD").is_file() or (repo / ".git").exists()):
        pytest.fail(f"{env}={repo} is neither a checkout holding {what} nor a git directory")
    archive = subprocess.run(["git", "--git-dir", str(repo if (repo / "HEAD").is_file() else repo / ".git"),
                              "archive", "HEAD", what], capture_output=True, check=True).stdout
    subprocess.run(["tar", "x", "-C", str(dest)], input=archive, check=True)
    return dest


def zlab_model_file(dest: Path) -> Path:
    if os.environ.get("PDRAFT_ZLAB_SRC"):
        return source("PDRAFT_ZLAB_SRC", "dflash/model.py", dest, "") / "dflash" / "model.py"
    spec = importlib.util.find_spec("dflash")  # finds the installed package without running its __init__
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("PDRAFT_ZLAB_SRC is not set and the dflash package is not installed "
                    "(pip install --no-deps dflash==0.1.0)")
    return Path(next(iter(spec.submodule_search_locations))) / "model.py"


class Args(SimpleNamespace):
    def __contains__(self, key):
        return hasattr(self, key)


def deepspec_reference(root: Path, target_cfg, **model_args):
    sys.path.insert(0, str(root))
    try:
        from deepspec.modeling.dspark.qwen3.config import build_draft_config
        from deepspec.modeling.dspark.qwen3.modeling import Qwen3DSparkModel
    finally:
        sys.path.remove(str(root))
    cfg = build_draft_config(target_cfg, Args(**model_args))
    cfg._attn_implementation = "eager"
    torch.manual_seed(11)
    model = Qwen3DSparkModel(cfg).eval()
    with torch.no_grad():  # random, non-trivial norms and heads so every term matters
        for name, p in model.named_parameters():
            if not name.startswith(("embed_tokens", "lm_head")):
                p.normal_(0.0, 0.3) if p.dim() > 1 else p.normal_(1.0, 0.3)
    return model


@pytest.mark.parametrize("head,rank,conf,ids", [("vanilla", 8, 1.0, [0, 2]), ("rnn", 8, 1.0, [0, 2]),
                                                 ("gated", 8, 0.0, [0, 2]), (None, 0, 0.0, [0, 2]),
                                                 ("rnn", 8, 1.0, [-1, 1, 2])])
def test_deepspec_checkpoint_reproduces_deepspec_forward(tmp_path, head, rank, conf, ids):
    root = source("PDRAFT_DEEPSPEC_SRC", "deepspec", tmp_path,
                  "DeepSpec's code is not on PyPI, so CI cannot run this cross-check: set PDRAFT_DEEPSPEC_SRC to a "
                  "DeepSpec checkout or git directory to run it")
    target = tiny_target()
    args = dict(num_draft_layers=2, target_layer_ids=ids, block_size=4, mask_token_id=MASK, num_anchors=8,
                confidence_head_alpha=conf, confidence_head_with_markov=True, markov_rank=rank)
    if head:
        args["markov_head_type"] = head
    ref = deepspec_reference(root, target.config, **args)
    ref.initialize_embeddings_and_head(embed_tokens=target.model.embed_tokens, lm_head=target.lm_head)
    ref.save_pretrained(tmp_path / "ckpt")  # DeepSpec's own writer
    mine = load_drafter(tmp_path / "ckpt", target.config)
    mine.attach_target(target)
    assert mine.config.kind == ("dspark" if rank or conf else "dflash")

    seq = torch.randint(0, MASK, (1, 12), generator=torch.Generator().manual_seed(2))
    feats = captured(target, seq, ids)  # pdraft's capture
    sys.path.insert(0, str(root))
    try:
        from deepspec.modeling.dspark.common import extract_context_feature
    finally:
        sys.path.remove(str(root))
    with torch.no_grad():  # DeepSpec's features (-1 = hidden_states[0]), as its evaluator builds them
        theirs = extract_context_feature(target(seq, output_hidden_states=True).hidden_states, ids)
    torch.testing.assert_close(feats, theirs, rtol=0, atol=0)
    start, bs = 9, 4
    # DeepSpec's inference path (deepspec/eval/dspark/draft_ops.py): cache the context, run [anchor, mask...]
    block_ids = torch.full((1, bs), MASK)
    block_ids[0, 0] = seq[0, start]
    with torch.no_grad():
        hidden = ref._forward_backbone(target_hidden_states=feats[:, :start],
                                       noise_embedding=ref.embed_tokens(block_ids),
                                       position_ids=torch.arange(start + bs)[None], attention_mask=None,
                                       past_key_values=DynamicCache(), use_cache=True, is_causal=False)
        base = ref.compute_logits(hidden)  # [1, bs, vocab]
        ref_tokens, _ = ref.sample_draft_tokens(base, first_prev_token_ids=block_ids[:, 0], temperature=0.0,
                                                hidden_states=hidden)
    state = mine.new_state(1)
    mine.extend_context(state, feats[:, :start], torch.arange(start)[None])
    greedy = mine.propose(state, seq[:, start], torch.tensor([start]), bs)
    assert torch.equal(greedy.tokens, ref_tokens)
    sampled = mine.propose(state, seq[:, start], torch.tensor([start]), bs, SamplingParams(temperature=1.0),
                           torch.rand(1, bs, generator=torch.Generator().manual_seed(4)))
    prev = torch.cat([block_ids[:, :1], sampled.tokens[:, :-1]], dim=1)
    with torch.no_grad():
        adjusted = base if ref.markov_head is None else ref.markov_head.apply_block_logits(
            base, token_ids=prev, hidden_states=hidden)
        conf_ref = ref.predict_confidence_step(hidden, prev_token_ids=prev)
    torch.testing.assert_close(sampled.probs, torch.softmax(adjusted.float(), -1), rtol=1e-5, atol=1e-6)
    if conf_ref is None:
        assert sampled.confidence is None
    else:
        torch.testing.assert_close(sampled.confidence, conf_ref, rtol=1e-5, atol=1e-5)


def test_zlab_checkpoint_reproduces_zlab_forward(tmp_path):
    spec = importlib.util.spec_from_file_location("zlab_dflash_model", zlab_model_file(tmp_path))
    zl = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(zl)
    target = tiny_target()
    fields = {k: v for k, v in target.config.to_dict().items() if k != "layer_types"}
    cfg = Qwen3Config(**{**fields, "num_hidden_layers": 2})
    cfg.block_size, cfg.num_target_layers = 4, 4
    cfg.dflash_config = {"target_layer_ids": [1, 3], "mask_token_id": MASK}
    cfg.architectures = ["DFlashDraftModel"]
    cfg._attn_implementation = "eager"
    torch.manual_seed(12)
    ref = zl.DFlashDraftModel(cfg).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.normal_(0.0, 0.3) if p.dim() > 1 else p.normal_(1.0, 0.3)
    ref.save_pretrained(tmp_path / "ckpt")
    mine = load_drafter(tmp_path / "ckpt", target.config)
    mine.attach_target(target)
    assert mine.config.block_convention == "zlab" and mine.max_gamma() == 3

    seq = torch.randint(0, MASK, (1, 12), generator=torch.Generator().manual_seed(2))
    feats = captured(target, seq, [1, 3])
    start, bs = 8, 4
    block_ids = torch.full((1, bs), MASK)
    block_ids[0, 0] = seq[0, start]
    with torch.no_grad():  # z-lab's dflash_generate: lm_head over the last block_size - 1 outputs
        out = ref(target_hidden=feats[:, :start], noise_embedding=target.model.embed_tokens(block_ids),
                  position_ids=torch.arange(start + bs)[None], past_key_values=DynamicCache(), use_cache=True,
                  is_causal=False)
        logits = target.lm_head(out[:, 1 - bs :, :])
    state = mine.new_state(1)
    mine.extend_context(state, feats[:, :start], torch.arange(start)[None])
    p = mine.propose(state, seq[:, start], torch.tensor([start]), 3, SamplingParams(temperature=1.0))
    torch.testing.assert_close(p.probs, torch.softmax(logits.float(), -1), rtol=1e-5, atol=1e-6)
    assert torch.equal(mine.propose(state, seq[:, start], torch.tensor([start]), 3).tokens, logits.argmax(-1))
