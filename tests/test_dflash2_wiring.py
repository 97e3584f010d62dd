"""DFlash2 wired into pdraft: the recipe kind and its fields, the build from a recipe (z-lab block forced), the
checkpoint family detection (DFlash2DraftModel before the z-lab DFlash fallback), save/load through
pdraft.models, and `pdraft pull` of a published-layout folder."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

from pdraft.errors import PdraftError
from pdraft.hub import pull
from pdraft.models import DFlash2Drafter, load_drafter, save_drafter
from pdraft.models.build import build_drafter, build_from_recipe, draft_step
from pdraft.models.checkpoint import load_config
from pdraft.models.dflash2.config import DFlash2Config
from pdraft.models.families import FAMILIES, config_class, config_from_dict, detect_family
from pdraft.recipe import load_recipe
from test_models_dflash2 import PUBLISHED, published_weights
from test_models_support import MASK, tiny_target, tiny_target_config


@pytest.fixture(scope="module", name="target")
def _target():
    return tiny_target()


def write_published(folder):
    folder.mkdir(parents=True)
    save_file(published_weights(PUBLISHED), str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(PUBLISHED))
    return folder


def test_kind_is_known_to_the_family_registry():
    assert "dflash2" in FAMILIES.kinds and config_class("dflash2") is DFlash2Config
    cfg = build_drafter("dflash2", tiny_target_config(), mask_token_id=MASK, block_size=4, num_hidden_layers=1,
                        conv_group_size=8, selector_rank=4, selector_top_k=3).config
    assert DFlash2Config.from_dict(cfg.to_dict()) == cfg
    assert config_from_dict(cfg.to_dict()) == cfg  # the generic entry dispatches on kind
    from pdraft.models.dflash.config import DFlashConfig
    with pytest.raises(PdraftError, match="a dflash2 config is not a dflash config"):
        DFlashConfig.from_dict(cfg.to_dict())  # a class reads its own kind only


def test_recipe_kind_and_fields(tmp_path):
    r = load_recipe(None, ["drafter.kind=dflash2", "drafter.selector_top_k=8", "drafter.conv_kernel_size=3",
                           "train.alpha_selector=0.5"])
    assert r.drafter.kind == "dflash2" and r.drafter.block_convention == "zlab"  # forced, and said so
    assert (r.drafter.selector_top_k, r.drafter.conv_kernel_size, r.train.alpha_selector) == (8, 3, 0.5)
    with pytest.raises(PdraftError, match="zlab"):
        load_recipe(None, ["drafter.kind=dflash2", "drafter.block_convention=deepspec"])
    with pytest.raises(PdraftError, match="denoise_steps"):
        load_recipe(None, ["drafter.kind=dflash2", "drafter.denoise_steps=2"])
    with pytest.raises(PdraftError, match="conv_kernel_size"):
        load_recipe(None, ["drafter.kind=dflash2", "drafter.block_size=2", "drafter.conv_kernel_size=3"])
    with pytest.raises(PdraftError, match="selector_rank"):
        load_recipe(None, ["drafter.kind=dflash2", "drafter.selector_rank=0"])


def test_build_from_recipe_forces_the_zlab_block(target):
    r = load_recipe(None, ["drafter.kind=dflash2", "drafter.num_layers=1", "drafter.block_size=4",
                           f"drafter.mask_token_id={MASK}", "drafter.conv_group_size=8", "drafter.selector_rank=4",
                           "drafter.selector_top_k=5"])
    fake = SimpleNamespace(config=tiny_target_config(), tokenizer=None, layer_ids=[1])
    d = build_from_recipe(r.drafter, fake, seed=0)
    assert isinstance(d, DFlash2Drafter)
    c = d.config
    assert (c.block_convention, c.block_size, c.num_gamma, c.selector_top_k, c.selector_rank) == ("zlab", 4, 3, 5, 4)
    # SpecForge's starting point: identity convs, a successor codebook at zero
    assert all(float(layer.attention_conv.kernel_projection.weight.detach().abs().sum()) == 0 for layer in d.layers)
    assert float(d.candidate_selector.successor_codebook.detach().abs().sum()) == 0


def test_family_detection_puts_dflash2_before_the_zlab_fallback():
    assert detect_family(PUBLISHED) == "dflash2"
    zlab = {k: v for k, v in PUBLISHED.items() if k != "architectures"}
    assert detect_family(zlab) == "zlab"  # a bare dflash_config is still the z-lab DFlash fallback


def test_save_and_load_through_pdraft_models(tmp_path, target):
    d = build_drafter("dflash2", tiny_target_config(), mask_token_id=MASK, block_size=5, num_hidden_layers=2,
                      conv_group_size=8, selector_rank=4, selector_top_k=6, seed=3)
    out = save_drafter(d, tmp_path / "d", recipe_yaml="name: x\n")
    data = json.loads((out / "config.json").read_text())
    assert data["architectures"] == ["DFlash2DraftModel"] and data["pdraft"]["kind"] == "dflash2"
    back = load_drafter(out, tiny_target_config())
    assert back.config == d.config
    assert all(torch.equal(a, b) for a, b in zip(d.state_dict().values(), back.state_dict().values()))
    with pytest.raises(PdraftError, match="cannot be saved in the zlab layout"):
        save_drafter(d, tmp_path / "z", layout="zlab")


def test_pull_recognises_a_published_dflash2_folder(tmp_path, target):
    src = write_published(tmp_path / "src")
    got = pull(str(src), out=tmp_path / "out", target_config=tiny_target_config())
    assert got.family == "zlab-dflash2" and got.config.kind == "dflash2"
    assert got.to_dict()["max_gamma"] == 5 and got.to_dict()["block_convention"] == "zlab"
    d = load_drafter(got.path, tiny_target_config())
    assert isinstance(d, DFlash2Drafter) and load_config(got.path) == d.config
    d.attach_target(target)
    assert draft_step(d, torch.randn(1, 4, d.fc.in_features), 3).tokens.shape == (1, 5)


def test_pull_refuses_a_published_dflash2_that_misses_a_selector_field(tmp_path):
    src = write_published(tmp_path / "src")
    data = json.loads((src / "config.json").read_text())
    del data["dflash_config"]["selector_rank"]
    (src / "config.json").write_text(json.dumps(data))
    with pytest.raises(PdraftError, match="selector_rank"):
        pull(str(src))
