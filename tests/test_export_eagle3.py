"""Exporting and pulling EAGLE-3 drafters: `pdraft export --format vllm|sglang` writes the LlamaForCausalLMEagle3
layout with the engines' names (`midlayer.`, `fc.`, `norm.`, `lm_head.`, `d2t`, `t2d`, no embedding), the target
layers in each engine's own numbering (vLLM's one above pdraft's, SGLang's pdraft's) and the serve commands
(`"method": "eagle3"`, SGLang's EAGLE3 chain), refuses z-lab's layout, and round-trips: export -> pull -> decode
gives the same tokens. `pdraft pull` reads published checkpoints in that layout (a SpecForge-style folder, with
the target's embedding and an `auto_map` it never runs) without remote code."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from doubles import tiny_target
from pdraft.cli.main import main
from pdraft.decode.engine import generate
from pdraft.errors import PdraftError
from pdraft.hub import export, pull
from pdraft.models import load_drafter, save_drafter
from pdraft.models.api import SamplingParams
from pdraft.models.build import build_drafter

PROMPTS = [[3, 5, 7], [1], [9, 8, 7, 6, 5, 4, 3, 2, 1, 10, 11, 12, 13], [2, 4]]
NAMES = {"fc.weight", "midlayer.self_attn.q_proj.weight", "midlayer.self_attn.k_proj.weight",
         "midlayer.self_attn.v_proj.weight", "midlayer.self_attn.o_proj.weight", "midlayer.mlp.gate_proj.weight",
         "midlayer.mlp.up_proj.weight", "midlayer.mlp.down_proj.weight", "midlayer.hidden_norm.weight",
         "midlayer.input_layernorm.weight", "midlayer.post_attention_layernorm.weight", "norm.weight",
         "lm_head.weight", "d2t", "t2d"}


@pytest.fixture(scope="module")
def target():
    return tiny_target(64, 32, num_layers=4)


@pytest.fixture()
def drafter_dir(tmp_path, target):
    d = build_drafter("eagle3", target.config, seed=0, draft_vocab_size=48, ttt_steps=5)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in d.parameters():
            if p.dim() > 1:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    d.attach_target(target)
    d.init_from_tokens(torch.randint(0, 50, (64,), generator=g))
    return save_drafter(d, tmp_path / "d")


def test_export_writes_each_engines_layout_and_serve_command(tmp_path, drafter_dir):
    got = export(drafter_dir, "vllm", tmp_path / "v", target="Qwen/Qwen3-4B")
    cfg = json.loads((got.path / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["model_type"] == "llama"
    assert (cfg["draft_vocab_size"], cfg["vocab_size"], cfg["target_hidden_size"]) == (48, 64, 32)
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]  # vLLM: pdraft's [0, 1, 2] + 1
    assert cfg["pdraft"]["target_layer_ids"] == [0, 1, 2]
    tensors = load_file(str(got.path / "model.safetensors"))
    assert set(tensors) == NAMES and tensors["d2t"].dtype == torch.int64 and tensors["t2d"].dtype == torch.bool
    assert tensors["lm_head.weight"].shape == (48, 32) and tensors["midlayer.self_attn.q_proj.weight"].shape[1] == 64
    spec = json.dumps({"method": "eagle3", "model": str(got.path), "num_speculative_tokens": 5})
    assert got.command == f"vllm serve Qwen/Qwen3-4B --speculative-config '{spec}'"
    assert any("vLLM's numbering" in n for n in got.notes)
    s = export(drafter_dir, "sglang", tmp_path / "s", target="Qwen/Qwen3-4B")
    scfg = json.loads((s.path / "config.json").read_text())
    assert scfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2]  # SGLang adds 1 itself
    assert ("--speculative-algorithm EAGLE3" in s.command and "--speculative-num-steps 5" in s.command
            and "--speculative-eagle-topk 1" in s.command and "--speculative-num-draft-tokens 6" in s.command)
    with pytest.raises(PdraftError, match="one token per pass"):
        export(drafter_dir, "zlab-dflash", tmp_path / "z")


@pytest.mark.parametrize("fmt", ["vllm", "sglang"])
def test_export_pull_decode_round_trip(tmp_path, drafter_dir, target, fmt):
    got = export(drafter_dir, fmt, tmp_path / fmt)
    pulled = pull(str(got.path))
    assert pulled.family == "pdraft-eagle3" and pulled.config.target_layer_ids == [0, 1, 2]
    a = load_drafter(drafter_dir, target.config)
    b = load_drafter(pulled.path, target.config)
    for d in (a, b):
        d.attach_target(target)
    for sampling in (None, SamplingParams(temperature=0.9)):
        x = generate(target, a, PROMPTS, gamma=5, sampling=sampling, max_new_tokens=12, seed=3)
        y = generate(target, b, PROMPTS, gamma=5, sampling=sampling, max_new_tokens=12, seed=3)
        assert x.output_ids == y.output_ids and [r.accepted for r in x.records] == [r.accepted for r in y.records]


def test_pull_reads_a_specforge_checkpoint_without_remote_code(tmp_path, drafter_dir, target):
    """The folder SpecForge writes: its config.json (layer ids in SGLang's numbering, an auto_map pdraft never
    runs), the target's embedding in the weights, no pdraft object."""
    folder = tmp_path / "specforge"
    folder.mkdir()
    mine = json.loads((drafter_dir / "config.json").read_text())
    cfg = {k: v for k, v in mine.items() if k != "pdraft"}
    cfg["auto_map"] = {"AutoModel": "modeling_eagle3.Eagle3Model"}
    (folder / "config.json").write_text(json.dumps(cfg))
    (folder / "modeling_eagle3.py").write_text("raise SystemExit('remote code must never run')\n")
    tensors = {k: v.clone() for k, v in load_file(str(drafter_dir / "model.safetensors")).items()}
    tensors["embed_tokens.weight"] = target.get_input_embeddings().weight.detach().clone()
    save_file(tensors, str(folder / "model.safetensors"))
    got = pull(str(folder), out=tmp_path / "installed", target_config=target.config)
    assert got.family == "eagle-eagle3" and "modeling_eagle3.py" in got.ignored
    assert got.config.target_layer_ids == [0, 1, 2] and got.config.draft_vocab_size == 48
    a, b = load_drafter(drafter_dir, target.config), load_drafter(got.path, target.config)
    for d in (a, b):
        d.attach_target(target)
    assert generate(target, a, PROMPTS, gamma=4, max_new_tokens=10).output_ids == \
        generate(target, b, PROMPTS, gamma=4, max_new_tokens=10).output_ids


def test_pull_reads_an_eagle_authors_release_with_their_default_layers(tmp_path):
    """SafeAILab's EAGLE-3 releases (yuhuili/EAGLE3-*): a Llama config.json with no head_dim and no feature layers
    at all, weights `fc.`, `midlayer.`, `norm.`, `lm_head.`, `d2t`, `t2d` (their pytorch_model.bin converted to
    safetensors: pdraft never unpickles). With the target known, the layers are their trainer's default for its
    depth L (the inputs of layers 2, L//2, L-3: pdraft's [1, L//2 - 1, L - 4]); without it, one line says what to add."""
    deep = tiny_target(64, 32, num_layers=8)
    d = build_drafter("eagle3", deep.config, seed=0, draft_vocab_size=48, target_layer_ids=[1, 3, 4])
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in d.parameters():
            if p.dim() > 1:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    d.attach_target(deep)
    d.init_from_tokens(torch.randint(0, 50, (64,), generator=g))
    folder = tmp_path / "release"
    folder.mkdir()
    save_file({k: v.contiguous() for k, v in d.state_dict().items()}, str(folder / "model.safetensors"))
    assert set(load_file(str(folder / "model.safetensors"))) == NAMES
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLMEagle3"], "bos_token_id": 0, "eos_token_id": 1, "hidden_act": "silu",
        "hidden_size": 32, "initializer_range": 0.02, "intermediate_size": 64, "max_position_embeddings": 2048,
        "model_type": "llama", "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 1,
        "pad_token_id": 0, "rms_norm_eps": 1e-6, "rope_theta": d.config.rope_theta, "tie_word_embeddings": False,
        "torch_dtype": "float16", "transformers_version": "4.28.1", "use_cache": True, "vocab_size": 64,
        "draft_vocab_size": 48}))
    with pytest.raises(PdraftError, match="does not name the target layers"):
        pull(str(folder), out=tmp_path / "blind")
    got = pull(str(folder), out=tmp_path / "installed", target_config=deep.config)
    assert got.family == "eagle-eagle3" and got.config.target_layer_ids == [1, 3, 4]
    mine = load_drafter(got.path, deep.config)
    mine.attach_target(deep)
    assert generate(deep, mine, PROMPTS, gamma=4, max_new_tokens=10).output_ids == \
        generate(deep, d.eval(), PROMPTS, gamma=4, max_new_tokens=10).output_ids


def test_cli_export_and_pull_print_the_chain(tmp_path, drafter_dir, capsys):
    assert main(["export", str(drafter_dir), "--format", "vllm", "--out", str(tmp_path / "v")]) == 0
    assert '"method": "eagle3"' in capsys.readouterr().out
    assert main(["pull", str(tmp_path / "v")]) == 0
    assert "a chain of one pass per draft, up to gamma 32" in " ".join(capsys.readouterr().out.split())
