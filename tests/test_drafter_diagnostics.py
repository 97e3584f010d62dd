"""The two diagnostics behind docs/TARGET.md's account of why drafters stall on a target: the n-gram predictability
of a cache's responses (benchmarks/response_ngrams.py) and the single-suspect drafter probes
(benchmarks/drafter_probes.py)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from pdraft.cache.export_hidden import export_hidden
from pdraft.recipe import load_recipe
from pdraft.runtime import make_runtime
from pdraft.targets.loader import load_target
from test_data_tinytarget import make_tiny_target, write_chat_jsonl

ROOT = Path(__file__).resolve().parents[1]


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_ngram_top1_counts_only_response_tokens_and_backs_off_to_the_commonest():
    ngrams = _script("response_ngrams")
    # Training responses: after 5 comes 6 and 9 is the commonest response token. The prompt (mask 0) has 5 -> 7
    # twice, which would outvote 5 -> 6 if prompt tokens were counted as predictions.
    train = [([5, 7, 5, 7, 5, 6, 9, 9, 9, 4], [False] * 4 + [True] * 6)] * 3
    held_out = [([1, 5, 6, 4], [False, True, True, True])]
    acc, n = ngrams.ngram_top1(train, held_out, 1)
    # 5 after 1 (unseen: back off to 9, wrong), 6 after 5 (right), 4 after 6 (counted 6 -> 9, wrong).
    assert n == 3 and acc == pytest.approx(1 / 3)
    acc0, _ = ngrams.ngram_top1(train, [([9, 9], [True, True])], 1)
    assert acc0 == 1.0  # first token: no context, the commonest; second: 9 -> 9 was counted twice, 9 -> 4 once
    acc2, _ = ngrams.ngram_top1(train, held_out, 2)
    assert acc2 == pytest.approx(0.0)  # too short a context, then (1, 5) unseen, then (5, 6) -> 9, not 4


@pytest.fixture(scope="module")
def probe_env(tmp_path_factory):
    root = tmp_path_factory.mktemp("probes")
    target = make_tiny_target(root / "t", norm_scale=12.0)
    data = write_chat_jsonl(root / "d.jsonl", 24)
    body = {
        "output_dir": str(root / "run"),
        "target": {"id": str(target), "layer_ids": [1, 2]},  # ends at the last layer's input (4 layers)
        "data": {"source": str(data), "shard_tokens": 512, "cache_dir": str(root / "cache")},
        "drafter": {"kind": "dflash", "num_layers": 1, "block_size": 4, "mask_token_id": 0},
        "train": {"batch_size": 4, "lr": 3e-3, "warmup_steps": 2, "num_anchors": 4},
        "runtime": {"threads": 1},
    }
    path = root / "r.yaml"
    path.write_text(json.dumps(body))
    recipe = load_recipe(path)
    target_obj = load_target(recipe.target, make_runtime(recipe.runtime))
    export_hidden(recipe, target_obj)
    return path, recipe, target_obj


def test_probes_change_only_their_suspect(probe_env):
    from pdraft.models.build import build_from_recipe

    probes = _script("drafter_probes")
    _, recipe, target = probe_env
    last = target.model.model.layers[-1]

    drafter = build_from_recipe(recipe.drafter, target, seed=0)
    drafter.attach_target(target.model)
    w = probes.prepare("last_layer_init", drafter, target)
    assert w is target.model.get_output_embeddings().weight
    assert torch.equal(drafter.layers[0].self_attn.q_proj.weight, last.self_attn.q_proj.weight)
    assert torch.equal(drafter.layers[0].mlp.down_proj.weight, last.mlp.down_proj.weight)
    hidden = drafter.config.hidden_size
    assert torch.equal(drafter.fc.weight[:, -hidden:], torch.eye(hidden))
    assert not drafter.fc.weight[:, :-hidden].any()

    drafter = build_from_recipe(recipe.drafter, target, seed=0)
    drafter.attach_target(target.model)
    w = probes.prepare("trainable_vocab", drafter, target)
    trainable = {id(p) for p in drafter.parameters() if p.requires_grad}
    assert id(w) in trainable and id(drafter._shared[0].weight) in trainable
    assert torch.equal(w, target.model.get_output_embeddings().weight)
    assert not target.model.get_output_embeddings().weight.requires_grad  # the target's own stays frozen


def test_probe_script_runs_every_probe_and_reports_held_out_tau(probe_env):
    import subprocess
    import sys

    path, recipe, _ = probe_env
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "drafter_probes.py"), "--recipe", str(path), "--cache",
         recipe.data.cache_dir, "--steps", "3", "--threads", "1", "--probes", "base", "zero_features",
         "trainable_vocab", "last_layer_init"],
        check=True, capture_output=True, text=True, cwd=ROOT).stdout
    results = json.loads(out.strip().splitlines()[-1])
    assert [r["probe"] for r in results] == ["base", "zero_features", "trainable_vocab", "last_layer_init"]
    for r in results:
        last = r["curve"][-1]
        assert last["step"] == 3 and last["ce"] == last["ce"] and last["held_out_greedy_tau"] >= 1.0
