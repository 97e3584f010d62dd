"""Reliability, fourth hostile round (issue 60), the residue: an EAGLE-3 folder whose top-level
`target_layer_ids` contradicts the layers its engine keys name (decode, export and pull each refuse, in the one
loader), an export whose layer ids do not fit the target it names, the serving sweep's levels above the requests it
has, check-serving's scratch folder kept on failure, and stale `.tmp-*` folders of a killed target build. Contract
in reliability_support.check; the walks beside run each rule over its class of inputs."""

import json

import pytest

import reliability_support
from reliability_support import Case, check, param
from test_reliability_eagle3 import eagle3

w = reliability_support.w  # the shared world, a module fixture


# ---- class 1: EAGLE-3 layer ids stated in DeepSpec's key beside the engines' ----------------------------------------
def top_level_ids(ids, *, drop_pdraft: bool = False):
    """Give the saved EAGLE-3 config a top-level target_layer_ids (DeepSpec's key); drop_pdraft removes pdraft's
    own copy, so eagle_config (what SGLang reads) is the one engine place left."""
    def damage(folder):
        cfg = json.loads((folder / "config.json").read_text())
        cfg["target_layer_ids"] = ids
        if drop_pdraft:
            cfg["pdraft"].pop("target_layer_ids")
        (folder / "config.json").write_text(json.dumps(cfg))
    return damage


LAYERS_TWICE = r"target_layer_ids is \[0, 1, 2\] in (pdraft|eagle_config)\S* .*but \[1, 2, 3\] in the top-level target_layer_ids"
CASES = [
    Case("decode", "eagle3-top-level-target-layer-ids", "an EAGLE-3 whose top-level target_layer_ids (DeepSpec's "
         "key) name other layers than eagle_config", lambda w, t: [
             "decode", "--recipe", str(w.recipe), "--drafter", str(eagle3(w, t, top_level_ids([1, 2, 3]))),
             "--prompt", "def f"], LAYERS_TWICE),
    Case("export", "eagle3-top-level-target-layer-ids", "the same folder exported for vLLM (wrote both lists)",
         lambda w, t: ["export", str(eagle3(w, t, top_level_ids([1, 2, 3], drop_pdraft=True))), "--format", "vllm",
                       "--out", str(t / "o")], LAYERS_TWICE),
    Case("pull", "eagle3-top-level-target-layer-ids", "a published EAGLE-3 stating its layers twice, differently",
         lambda w, t: ["pull", str(eagle3(w, t, top_level_ids([1, 2, 3], drop_pdraft=True))), "--out",
                       str(t / "copy")], LAYERS_TWICE),
]


def test_a_top_level_target_layer_ids_alone_names_no_layers(tmp_path):
    """DeepSpec's key in an EAGLE-3-layout folder is checked, never read alone: no engine of that layout reads it,
    so the folder still names no layers (the refusal it had), and one that agrees with eagle_config loads."""
    from test_models_support import tiny_target_config

    from pdraft.errors import PdraftError
    from pdraft.models.build import build_drafter
    from pdraft.models.checkpoint import load_config
    from pdraft.models.eagle3.format import eagle3_config_to_json

    data = eagle3_config_to_json(build_drafter("eagle3", tiny_target_config(), seed=0).config)
    ids = list(data["pdraft"]["target_layer_ids"])
    data["target_layer_ids"] = ids
    (tmp_path / "config.json").write_text(json.dumps(data))
    assert load_config(tmp_path).target_layer_ids == ids
    del data["pdraft"]["target_layer_ids"], data["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    (tmp_path / "config.json").write_text(json.dumps(data))
    with pytest.raises(PdraftError, match="does not name the target layers it reads"):
        load_config(tmp_path)


# CASES is complete here: the generator counts test_case[...] of CASES (reliability_support.case_nodes).
@param(CASES)
def test_case(case, w, tmp_path, monkeypatch):
    check(case, w, tmp_path, monkeypatch)
