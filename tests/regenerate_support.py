"""Shared helpers of the engine regeneration tests (tests/test_regenerate_vllm.py, test_regenerate_llamacpp.py);
no tests here. Each engine's test exports one shrunk recipe twice, its responses by the engine and by
transformers, and holds them equal except where the target's own logits are a near-tie."""

from __future__ import annotations

from pathlib import Path

import torch

from pdraft.data.regenerate import read_done
from pdraft.recipe import load_recipe
from pdraft.runtime import make_runtime
from pdraft.targets.loader import load_target
from reliability_support import run_cli
from test_tensor_parallel import sets, shrunk_recipe


def export_beside_transformers(root: Path, name: str, label: str, prompts: int, over: list[str]) -> Path:
    """The shrunk recipe exported as `name` with the engine's settings `over` (its progress line names `label`),
    and again as "transformers" with none; returns the engine's recipe."""
    shrink = {"data": {"max_samples": prompts, "regenerate_max_new_tokens": 24, "regenerate_batch_size": 8}}
    path = shrunk_recipe(root, name, **shrink)
    res = run_cli(["export-hidden", str(path), *sets(*over)])
    assert res.code == 0, res.err[-4000:]
    assert f"regenerate ({label})" in res.err and "cache ready" in res.out, res.err[-2000:]
    res = run_cli(["export-hidden", str(shrunk_recipe(root, "transformers", **shrink))])
    assert res.code == 0, res.err[-4000:]
    return path


def responses(root: Path, name: str) -> dict[int, list[int]]:
    return {i: row["response_ids"] for i, row in read_done(root / name / "hidden" / "regenerated.jsonl").items()}


def assert_parted_at_near_ties(path: Path, ours: dict, theirs: dict, differ: list[int], near_tie: float) -> None:
    """Where the engine's response `ours[i]` parts from transformers' `theirs[i]`, transformers' own logits at
    that token must be a near-tie (gap under `near_tie`) between the two tokens: the only cause allowed."""
    from pdraft.data.prompts import load_prompts
    from pdraft.data.templates import encode_prompt

    if not differ:
        return
    r = load_recipe(path)
    target = load_target(r.target, make_runtime(r.runtime))
    records = list(load_prompts(r.data.source, r.data.split, r.data.max_samples))
    for i in differ:
        k = next(j for j, (a, b) in enumerate(zip(ours[i], theirs[i])) if a != b)
        ids = encode_prompt(target.tokenizer, records[i].prompt, r.data.chat_template) + theirs[i][:k]
        with torch.no_grad():
            logits = target.model(input_ids=torch.tensor([ids])).logits[0, -1]
        gap = float(logits[theirs[i][k]] - logits[ours[i][k]])
        print(f"prompt {i} parts at token {k}: logit gap {gap:.4f}")
        assert abs(gap) < near_tie, f"prompt {i} parts at token {k} with a logit gap of {gap}: not a near-tie"
