"""Reliability of the EAGLE-3 family: recipes that describe another network than EAGLE-3's, EAGLE-3 checkpoints
that are not EAGLE-3 (several decoder layers, no fused target layers, another norm layout), that miss their
vocabulary map or their target layers, that were made for another target, and exports no engine could run,
given to `recipe check`, `decode`, `bench`, `pull` and `export`: each fails with one line and exit code 2 and
changes nothing (contract in reliability_support.check)."""

import json

import reliability_support
from reliability_support import Case, check, param, write

w = reliability_support.w  # the shared world, a module fixture


def eagle3(w, t, damage=None, other: bool = False):
    """A saved EAGLE-3 drafter of the world's target (or of the other target) in the case folder, damaged."""
    from transformers import AutoConfig

    from pdraft.models import build_drafter, save_drafter

    cfg = AutoConfig.from_pretrained(w.other_target if other else w.target)
    folder = save_drafter(build_drafter("eagle3", cfg, seed=0, draft_vocab_size=40, ttt_steps=3), t / "eagle3")
    if damage is not None:
        damage(folder)
    return folder


def edit(**fields):
    """Set config.json fields ("eagle_config__x" reaches into an object; None removes the field)."""
    def damage(folder):
        cfg = json.loads((folder / "config.json").read_text())
        for key, value in fields.items():
            node, *rest = key.split("__")
            where, name = (cfg[node], rest[0]) if rest else (cfg, key)
            if value is None:
                where.pop(name, None)
            else:
                where[name] = value
        write(folder / "config.json", json.dumps(cfg))
    return damage


def without_weight(name):
    def damage(folder):
        from safetensors.torch import load_file, save_file

        tensors = load_file(str(folder / "model.safetensors"))
        tensors.pop(name)
        save_file(tensors, str(folder / "model.safetensors"))
    return damage


def decode(drafter, *extra):
    return lambda w, t: ["decode", "--recipe", str(w.recipe), "--drafter", str(drafter(w, t)), "--prompt", "def f",
                         *extra]


def recipe_check(*sets):
    return lambda w, t: ["recipe", "check", str(w.recipe), "--set", "drafter.kind=eagle3",
                         *[x for s in sets for x in ("--set", s)]]


CASES = [
    Case("recipe check", "eagle3-two-layers", "drafter.kind eagle3 with drafter.num_layers 2",
         recipe_check("drafter.num_layers=2"), r"drafter\.num_layers: EAGLE-3 has 1 here"),
    Case("recipe check", "eagle3-own-width", "drafter.kind eagle3 with its own hidden size",
         recipe_check("drafter.hidden_size=64"), r"drafter\.hidden_size: EAGLE-3 shares the target's token embedding"),
    Case("recipe check", "eagle3-moe", "drafter.kind eagle3 with a mixture-of-experts MLP",
         recipe_check("drafter.num_experts=4"), r"drafter\.num_experts: EAGLE-3 has 0 here"),
    Case("recipe check", "eagle3-zero-ttt", "drafter.ttt_steps 0", recipe_check("drafter.ttt_steps=0"),
         r"drafter\.ttt_steps"),
    Case("recipe check", "eagle3-ttt-100", "drafter.ttt_steps 100 (past the gamma ceiling)",
         recipe_check("drafter.ttt_steps=100"), r"drafter\.ttt_steps"),
    Case("recipe check", "eagle3-zero-vocab", "drafter.draft_vocab_size 0", recipe_check("drafter.draft_vocab_size=0"),
         r"drafter\.draft_vocab_size"),
    Case("recipe check", "eagle3-kl-negative", "train.alpha_kl -1", recipe_check("train.alpha_kl=-1"), r"train\.alpha_kl"),
    Case("decode", "eagle3-two-decoder-layers", "an EAGLE-3 config.json with 2 decoder layers",
         decode(lambda w, t: eagle3(w, t, edit(num_hidden_layers=2))), r"EAGLE-3 has one"),
    Case("decode", "eagle3-no-fused-layers", "an EAGLE-3 config.json with use_aux_hidden_state false (EAGLE-1/2)",
         decode(lambda w, t: eagle3(w, t, edit(eagle_config__use_aux_hidden_state=False))), r"EAGLE-1/2 drafter"),
    Case("decode", "eagle3-norm-before-fc", "an EAGLE-3 config.json with norm_before_fc true",
         decode(lambda w, t: eagle3(w, t, edit(norm_before_fc=True))), r"builds another network than EAGLE-3's"),
    Case("decode", "eagle3-vocab-past-target", "draft_vocab_size larger than the vocabulary",
         decode(lambda w, t: eagle3(w, t, edit(draft_vocab_size=100_000))), r"exceeds the vocabulary"),
    Case("decode", "eagle3-no-d2t", "an EAGLE-3 with a reduced vocabulary but no d2t weight",
         decode(lambda w, t: eagle3(w, t, without_weight("d2t"))), r"weight 'd2t' is missing"),
    Case("decode", "eagle3-no-lm-head", "an EAGLE-3 without its own lm_head",
         decode(lambda w, t: eagle3(w, t, without_weight("lm_head.weight"))), r"weight 'lm_head\.weight' is missing"),
    Case("decode", "eagle3-other-target", "an EAGLE-3 made for another target (hidden 48 vs 32)",
         decode(lambda w, t: eagle3(w, t, other=True)), r"drafter does not fit the target"),
    Case("decode", "eagle3-gamma-33", "--gamma 33 with an EAGLE-3 (past the ceiling of 32)",
         decode(eagle3, "--gamma", "33"), r"--gamma 33: expected a value less than or equal to 32"),
    Case("bench", "eagle3-layer-ids-shuffled", "an EAGLE-3 whose target layers are not increasing",
         lambda w, t: ["bench", str(w.recipe), "--drafter", str(eagle3(w, t, edit(pdraft__target_layer_ids=[2, 0],
                                                                                     eagle_config__eagle_aux_hidden_state_layer_ids=[2, 0])))],
         r"target_layer_ids .*increasing"),
    Case("pull", "eagle3-no-layer-ids", "a published EAGLE-3 folder that names no target layers",
         lambda w, t: ["pull", str(eagle3(w, t, edit(pdraft=None, eagle_config={"use_aux_hidden_state": True})))],
         r"does not name the target layers it reads"),
    Case("pull", "eagle3-own-width", "a published EAGLE-3 whose target_hidden_size differs from its width",
         lambda w, t: ["pull", str(eagle3(w, t, edit(target_hidden_size=64)))], r"target_hidden_size 64 differs"),
    Case("export", "eagle3-as-zlab", "--format zlab-dflash for an EAGLE-3",
         lambda w, t: ["export", str(eagle3(w, t)), "--format", "zlab-dflash", "--out", str(t / "o")],
         r"cannot export an EAGLE-3 drafter as z-lab DFlash"),
]


@param(CASES)
def test_case(case, w, tmp_path, monkeypatch):
    check(case, w, tmp_path, monkeypatch)
