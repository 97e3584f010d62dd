"""Drafter checkpoints: bit-exact save/load, DeepSpec- and z-lab-layout checkpoints written here by hand in the
reference layouts (their field and weight names, embedding/LM-head copies in DeepSpec's, none in z-lab's), and
the one-line errors for mismatched targets, damaged files, missing fields and pickle weights."""

import json

import pytest
import torch
from safetensors.torch import save_file

from pdraft.errors import PdraftError
from pdraft.models import DFlashConfig, DSparkConfig, SamplingParams, draft_step
from pdraft.models.checkpoint import load_config, load_drafter, save_drafter
import test_models_support
from test_models_support import MASK, captured, tiny_drafter, tiny_target_config

target = test_models_support.target  # tiny_target(), a module fixture

T1 = SamplingParams(temperature=1.0)


@pytest.fixture(scope="module")
def seq():
    return torch.randint(0, MASK, (2, 11), generator=torch.Generator().manual_seed(7))


def same_outputs(a, b, target, seq):
    hidden = captured(target, seq, a.config.target_layer_ids)
    out_a = a.forward_train(seq, hidden, torch.tensor([[2, 8], [5, 9]]))
    out_b = b.forward_train(seq, hidden, torch.tensor([[2, 8], [5, 9]]))
    assert torch.equal(out_a.base_logits, out_b.base_logits)
    assert torch.equal(out_a.logits, out_b.logits)
    if out_a.confidence_logits is not None:
        assert torch.equal(out_a.confidence_logits, out_b.confidence_logits)
    pa = draft_step(a, hidden[:, :8], seq[:, 8], sampling=T1, uniforms=torch.rand(2, a.max_gamma(), generator=torch.Generator().manual_seed(0)))
    pb = draft_step(b, hidden[:, :8], seq[:, 8], sampling=T1, uniforms=torch.rand(2, a.max_gamma(), generator=torch.Generator().manual_seed(0)))
    assert torch.equal(pa.tokens, pb.tokens) and torch.equal(pa.probs, pb.probs)


@pytest.mark.parametrize("kind,kw", [
    ("dflash", {}),
    ("dflash", {"block_convention": "zlab", "denoise_steps": 2}),
    ("dspark", {"sequential_head": "rnn", "num_experts": 4, "num_experts_per_tok": 2, "denoise_steps": 3}),
    ("dspark", {"sequential_head": "gated", "confidence_with_markov": False}),
    ("dspark", {"sequential_head": "none", "confidence_with_markov": False, "confidence_head": False}),
])
def test_round_trip_is_bit_exact(tmp_path, target, seq, kind, kw):
    d = tiny_drafter(kind, target, **kw)
    save_drafter(d, tmp_path, recipe_yaml="drafter: {}\n")
    loaded = load_drafter(tmp_path, target.config)
    assert loaded.config == d.config and type(loaded) is type(d)
    assert loaded.config.to_dict() == d.config.to_dict()
    assert type(loaded.config).from_dict(d.config.to_dict()) == d.config
    sd_a, sd_b = d.state_dict(), loaded.state_dict()
    assert sd_a.keys() == sd_b.keys() and all(torch.equal(sd_a[k], sd_b[k]) for k in sd_a)
    assert (tmp_path / "recipe.resolved.yaml").read_text() == "drafter: {}\n"
    loaded.attach_target(target)
    same_outputs(d, loaded, target, seq)
    data = json.loads((tmp_path / "config.json").read_text())
    assert data["architectures"] == (["DFlashDraftModel"] if kw.get("block_convention") == "zlab"
                                     else ["Qwen3DSparkModel"])
    assert data["pdraft"]["denoise_steps"] == kw.get("denoise_steps", 1)


def deepspec_config(target_cfg, **fields) -> dict:
    """config.json as DeepSpec's build_draft_config writes it: the target's config, then its own fields."""
    data = target_cfg.to_dict()
    data.update(architectures=["Qwen3DSparkModel"], num_target_layers=target_cfg.num_hidden_layers,
                tie_word_embeddings=False, num_anchors=256)
    data.update(fields)
    data["layer_types"] = ["full_attention"] * data["num_hidden_layers"]
    return data


def test_deepspec_layout_loads(tmp_path, target, seq):
    d = tiny_drafter("dspark", target, sequential_head="markov", confidence_with_markov=True)
    cfg = deepspec_config(target.config, num_hidden_layers=2, block_size=4, mask_token_id=MASK,
                          target_layer_ids=d.config.target_layer_ids, markov_rank=8, markov_head_type="vanilla",
                          enable_confidence_head=True, confidence_head_with_markov=True)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    tensors = {k: v.clone() for k, v in d.state_dict().items()}
    # DeepSpec saves the whole model, frozen copies of the target's embedding and LM head included
    tensors["embed_tokens.weight"] = target.model.embed_tokens.weight.detach().clone()
    tensors["lm_head.weight"] = target.lm_head.weight.detach().clone()
    save_file(tensors, str(tmp_path / "model.safetensors"))
    loaded = load_drafter(tmp_path, target.config)
    assert isinstance(loaded.config, DSparkConfig) and loaded.config.block_convention == "deepspec"
    assert loaded.config.sequential_head == "markov" and loaded.config.has_confidence
    assert loaded.config.extra["num_anchors"] == 256
    loaded.attach_target(target)
    same_outputs(d, loaded, target, seq)


def test_deepspec_dflash_is_dspark_without_heads(tmp_path, target, seq):
    d = tiny_drafter("dflash", target)
    cfg = deepspec_config(target.config, num_hidden_layers=2, block_size=4, mask_token_id=MASK,
                          target_layer_ids=d.config.target_layer_ids, markov_rank=0,
                          enable_confidence_head=False)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    save_file(dict(d.state_dict()), str(tmp_path / "model.safetensors"))
    loaded = load_drafter(tmp_path, target.config)
    assert type(loaded.config) is DFlashConfig and loaded.max_gamma() == 4
    loaded.attach_target(target)
    same_outputs(d, loaded, target, seq)


@pytest.mark.parametrize("block_in_dflash_config", [False, True])
def test_zlab_layout_loads(tmp_path, target, seq, block_in_dflash_config):
    d = tiny_drafter("dflash", target, block_convention="zlab")
    cfg = target.config.to_dict()
    dflash_config = {"target_layer_ids": d.config.target_layer_ids, "mask_token_id": MASK}
    cfg.update(architectures=["DFlashDraftModel"], num_hidden_layers=2, num_target_layers=4,
               layer_types=["full_attention"] * 2, dflash_config=dflash_config,
               auto_map={"AutoModel": "dflash.DFlashDraftModel"})
    if block_in_dflash_config:
        dflash_config["block_size"] = 4
    else:
        cfg["block_size"] = 4
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    save_file(dict(d.state_dict()), str(tmp_path / "model.safetensors"))  # no embedding, no LM head
    loaded = load_drafter(tmp_path, target.config)
    assert loaded.config.block_convention == "zlab" and loaded.max_gamma() == 3
    loaded.attach_target(target)
    same_outputs(d, loaded, target, seq)


@pytest.fixture
def saved(tmp_path, target):
    d = tiny_drafter("dspark", target)
    save_drafter(d, tmp_path)
    return tmp_path


def one_line_error(fn) -> str:
    with pytest.raises(PdraftError) as info:
        fn()
    assert "\n" not in info.value.one_line()
    return info.value.message


@pytest.mark.parametrize("change,expect", [
    ({"hidden_size": 48, "head_dim": 12}, "does not fit the target: hidden size 32 vs the target's 48"),
    ({"vocab_size": 120}, "does not fit the target: vocabulary 97 vs the target's 120"),
    ({"num_hidden_layers": 3}, "does not fit the target: 4 target layers vs the target's 3"),
])
def test_mismatched_target(saved, change, expect):
    assert expect in one_line_error(lambda: load_drafter(saved, tiny_target_config(**change)))


def test_layer_id_out_of_range(saved):
    cfg = json.loads((saved / "config.json").read_text())
    cfg["target_layer_ids"] = [0, 7]
    (saved / "config.json").write_text(json.dumps(cfg))
    assert "target layer id 7" in one_line_error(lambda: load_drafter(saved, tiny_target_config()))


def test_truncated_safetensors(saved):
    blob = (saved / "model.safetensors").read_bytes()
    (saved / "model.safetensors").write_bytes(blob[: len(blob) // 2])
    assert "truncated or corrupted" in one_line_error(lambda: load_drafter(saved))


def test_bit_flip_in_tensor_bytes(saved):
    blob = bytearray((saved / "model.safetensors").read_bytes())
    blob[-100] ^= 0x10
    (saved / "model.safetensors").write_bytes(bytes(blob))
    assert "corrupted" in one_line_error(lambda: load_drafter(saved))


def test_bit_flip_in_header(saved):
    blob = bytearray((saved / "model.safetensors").read_bytes())
    blob[20] ^= 0x40
    (saved / "model.safetensors").write_bytes(bytes(blob))
    one_line_error(lambda: load_drafter(saved))


@pytest.mark.parametrize("field", ["mask_token_id", "target_layer_ids", "hidden_size", "markov_head_type"])
def test_missing_config_field(saved, field):
    cfg = json.loads((saved / "config.json").read_text())
    del cfg[field]
    (saved / "config.json").write_text(json.dumps(cfg))
    assert f"'{field}'" in one_line_error(lambda: load_drafter(saved))


def test_pickle_weights_refused(tmp_path, saved):
    (saved / "model.safetensors").rename(saved / "pytorch_model.bin")
    assert "pickle" in one_line_error(lambda: load_drafter(saved))


def test_weight_shape_mismatch_named(saved):
    cfg = json.loads((saved / "config.json").read_text())
    cfg["markov_rank"] = 16
    (saved / "config.json").write_text(json.dumps(cfg))
    assert "markov_head.markov_w1.weight" in one_line_error(lambda: load_drafter(saved))


def test_embedding_layer_id_loads(saved):
    cfg = json.loads((saved / "config.json").read_text())
    cfg["target_layer_ids"] = [-1, 2]
    (saved / "config.json").write_text(json.dumps(cfg))
    assert load_config(saved).target_layer_ids == [-1, 2]


@pytest.mark.parametrize("ids, message", [([2, 0], "not in increasing order"), ("023", "list of integers"),
                                          (["0", "2"], "must be integers")])
def test_refused_layer_ids_in_config_json(saved, ids, message):
    cfg = json.loads((saved / "config.json").read_text())
    cfg["target_layer_ids"] = ids
    (saved / "config.json").write_text(json.dumps(cfg))
    assert message in one_line_error(lambda: load_config(saved))
