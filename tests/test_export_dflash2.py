"""Exporting a DFlash2 drafter: `pdraft export --format vllm|sglang` writes the published DFlash2DraftModel
layout (the one pdraft/models/formats.py maps; FORMAT.md cites the engine files) with every weight name
and shape of the published checkpoint, prints the serve command (vLLM method `dflash`, which selects its
DFlash2 speculator from the architecture, with num_speculative_tokens = block_size - 1), refuses the z-lab DFlash
layout, and round-trips: export -> pull -> decode gives the same tokens, greedy and sampled."""

import json

import pytest
import torch
from safetensors.torch import load_file

from doubles import tiny_target
from pdraft.cli.main import main
from pdraft.decode.engine import generate
from pdraft.errors import PdraftError
from pdraft.hub import export, pull
from pdraft.models import load_drafter, save_drafter
from pdraft.models.api import SamplingParams
from pdraft.models.build import build_drafter
from test_models_dflash2 import published_weights

PROMPTS = [[3, 5, 7], [1], [9, 8, 7, 6, 5, 4, 3, 2, 1, 10, 11, 12, 13], [2, 4]]


@pytest.fixture(scope="module")
def target():
    return tiny_target(64, 32, num_layers=4)


@pytest.fixture()
def drafter_dir(tmp_path, target):
    d = build_drafter("dflash2", target.config, seed=0, mask_token_id=63, num_hidden_layers=2, block_size=6,
                      conv_group_size=8, selector_rank=8, selector_top_k=5)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # trained-looking weights: convs and selector away from their identity start
        for p in d.parameters():
            if p.dim() > 1:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return save_drafter(d, tmp_path / "d")


def test_export_writes_the_published_layout_and_the_serve_command(tmp_path, drafter_dir):
    got = export(drafter_dir, "vllm", tmp_path / "v", target="Qwen/Qwen3-4B")
    cfg = json.loads((got.path / "config.json").read_text())
    assert cfg["architectures"] == ["DFlash2DraftModel"] and cfg["model_type"] == "qwen3"
    dc = cfg["dflash_config"]
    assert (dc["conv_kernel_size"], dc["conv_group_size"], dc["selector_rank"], dc["selector_top_k"]) == (2, 8, 8, 5)
    assert dc["mask_token_id"] == 63 and dc["target_layer_ids"] and dc["block_size"] == 6
    published = dict(hidden_size=32, num_hidden_layers=2, vocab_size=64, num_attention_heads=cfg["num_attention_heads"],
                     num_key_value_heads=cfg["num_key_value_heads"], head_dim=cfg["head_dim"],
                     intermediate_size=cfg["intermediate_size"], dflash_config=dc)
    want = {k: tuple(v.shape) for k, v in published_weights(published).items()}
    assert {k: tuple(v.shape) for k, v in load_file(str(got.path / "model.safetensors")).items()} == want
    spec = json.dumps({"method": "dflash", "model": str(got.path), "num_speculative_tokens": 5})
    assert got.command == f"vllm serve Qwen/Qwen3-4B --speculative-config '{spec}'"
    s = export(drafter_dir, "sglang", tmp_path / "s", target="Qwen/Qwen3-4B")
    assert "--speculative-algorithm DFLASH" in s.command and any("SpecForge" in n for n in s.notes)
    with pytest.raises(PdraftError, match="no dynamic convolutions"):
        export(drafter_dir, "zlab-dflash", tmp_path / "z")


def test_cli_export_prints_the_serve_command(tmp_path, drafter_dir, capsys):
    assert main(["export", str(drafter_dir), "--format", "vllm", "--out", str(tmp_path / "v"),
                 "--target", "Qwen/Qwen3-4B"]) == 0
    shown = capsys.readouterr().out
    assert "vllm serve Qwen/Qwen3-4B" in shown and '"method": "dflash"' in shown


def test_export_pull_decode_is_identical(tmp_path, drafter_dir, target):
    original = load_drafter(drafter_dir, target.config)
    original.attach_target(target)
    got = export(drafter_dir, "vllm", tmp_path / "v")
    pulled_info = pull(str(got.path), out=tmp_path / "pulled", target_config=target.config)
    assert pulled_info.config == original.config
    pulled = load_drafter(pulled_info.path, target.config)
    pulled.attach_target(target)
    alone = generate(target, None, PROMPTS, max_new_tokens=16).output_ids
    for sampling in (None, SamplingParams(temperature=0.9, top_k=20)):
        kw = {} if sampling is None else {"sampling": sampling, "seed": 4}
        before = generate(target, original, PROMPTS, gamma=5, max_new_tokens=16, **kw)
        after = generate(target, pulled, PROMPTS, gamma=5, max_new_tokens=16, **kw)
        assert after.output_ids == before.output_ids
        assert [(r.verified, r.accepted) for r in after.records] == [(r.verified, r.accepted) for r in before.records]
        if sampling is None:
            assert after.output_ids == alone


def test_model_card_names_dflash2_and_its_serve_command(drafter_dir):
    from pdraft.hub.card import build_card

    card = build_card(drafter_dir, "someone/tiny-dflash2")
    assert "A DFlash2 parallel drafter" in card and "candidate selector: top-5, rank 8" in card
    assert '"method": "dflash"' in card and '"num_speculative_tokens": 5' in card
    assert "dflash2" in card.split("---")[1]  # the Hub tag
