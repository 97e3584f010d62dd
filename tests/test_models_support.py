"""Shared tiny target and drafters for the drafter-model tests: a 4-layer Qwen3 with a 97-token vocabulary,
its captured hidden states, and drafters built for it."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from pdraft.models import build_drafter
from pdraft.targets.capture import capture_layers, stack_captured

VOCAB, MASK = 97, 96


def tiny_target_config(**kw) -> Qwen3Config:
    base = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2, head_dim=8, intermediate_size=64, rope_theta=10000.0)
    base.update(kw)
    return Qwen3Config(**base)


def tiny_target(seed: int = 0) -> Qwen3ForCausalLM:
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(tiny_target_config()).eval()


@pytest.fixture(scope="module")
def target() -> Qwen3ForCausalLM:
    """tiny_target() as a module fixture. A test module takes it with `target = test_models_support.target` (an
    assignment, not `from test_models_support import target`, which linters read as an unused import)."""
    return tiny_target()


def tiny_drafter(kind: str, target, seed: int = 1, **kw):
    base = dict(mask_token_id=MASK, block_size=4, num_hidden_layers=2, markov_rank=8, seed=seed)
    if kind in ("dflash", "dflash2"):  # no sequential head
        base.pop("markov_rank")
    base.update(kw)
    d = build_drafter(kind, target.config, **base)
    d.attach_target(target)
    return d


def captured(target, ids: torch.Tensor, layer_ids) -> torch.Tensor:
    """[batch, seq, len(layer_ids) * hidden] target features for `ids`."""
    with torch.no_grad(), capture_layers(target, layer_ids) as cap:
        target(ids)
    return stack_captured(cap, layer_ids)
