"""EAGLE-3's checkpoint layout, the one the EAGLE authors and SpecForge publish and vLLM and SGLang load
(FORMAT.md beside this file cites the reader of every field): a Llama config with `architectures`
`LlamaForCausalLMEagle3` (`Eagle3Qwen3ForCausalLM` for the q/k-norm decoder), `draft_vocab_size`,
`target_hidden_size`, `norm_before_residual` and an `eagle_config` object whose
`eagle_aux_hidden_state_layer_ids` name the target layers; weights under `fc.`, `midlayer.`, `norm.`, `lm_head.`
plus `d2t` / `t2d` for a reduced vocabulary (pdraft's module names, so no mapping), no embedding.

Layer numbering. pdraft's id i is the output of decoder layer i. SGLang adds 1 to the ids it reads and captures
the input of that layer (python/sglang/srt/models/llama.py, qwen3.py `set_eagle3_layers_to_capture`: "we plus 1
here"), so its numbering, which SpecForge writes, is pdraft's. vLLM captures the input of layer j for id j
without adding 1 (vllm/model_executor/models/qwen2.py `_maybe_add_hidden_state(aux, idx + 1, ...)` after layer
idx), so its numbering is pdraft's + 1. This layout writes pdraft's (SGLang's) numbering; `export --format vllm`
rewrites the field (pdraft/models/eagle3/family.py). A config.json pdraft wrote also carries the ids in its
`pdraft` object, which wins; a foreign one is read in SGLang's numbering for `eagle_config` and in vLLM's for a
top-level `eagle_aux_hidden_state_layer_ids` (where vLLM reads it first). One that names none (the EAGLE
authors' own releases) takes their default from the target's depth when a target is given (`with_target`).

DeepSpec's layout (`Qwen3Eagle3Model`, deepspec/modeling/eagle3/qwen3/{config,modeling}.py @ afdfa7c; its eval.py
also evaluates an `Eagle3DraftModel` config as that class) is a second Layout below: the target's config
deep-copied with the drafter's fields, weights under `layers.0.` (pdraft's `midlayer.`), the whole target
vocabulary and copies of the target's embedding and head. FORMAT.md beside this file tables both."""

from __future__ import annotations

from pdraft.errors import PdraftError
from pdraft.models.config_base import BACKBONE_LIMITS
from pdraft.models.dims import target_dims
from pdraft.models.eagle3.config import DRAFT_VOCAB, LIMITS, STEP_DECAY, Eagle3Config
from pdraft.models.formats import (KNOWN, QWEN3_FIELDS, Layout, Places, at, backbone_fields, extras, pdraft_object,
                                   require, stated)

LLAMA_ARCH = "LlamaForCausalLMEagle3"  # vllm/model_executor/models/registry.py -> llama_eagle3.Eagle3LlamaForCausalLM
QWEN3_ARCH = "Eagle3Qwen3ForCausalLM"  # -> qwen3_eagle3.Eagle3Qwen3ForCausalLM (q_norm / k_norm in attention)
ALIASES = ("Eagle3LlamaForCausalLM",)  # the same class under vLLM's other registry name
PDRAFT_FIELDS = ("ttt_steps", "num_target_layers", "target_layer_ids")
# Switches of vLLM's llama_eagle3.py that build another network than EAGLE-3's: refused, never carried.
OTHER_NETWORKS = {"norm_before_fc": False, "fc_norm": False, "norm_output": False}
EAGLE3_KNOWN = KNOWN | {"draft_vocab_size", "target_hidden_size", "norm_before_residual", "eagle_config",
                        "eagle_aux_hidden_state_layer_ids", *OTHER_NETWORKS}


def eagle3_config_to_json(cfg: Eagle3Config) -> dict:
    """config.json as vLLM's llama_eagle3.py / qwen3_eagle3.py and SGLang's llama_eagle3.py read it."""
    out = dict(cfg.extra)
    eagle = dict(out.pop("eagle_config", None) or {})  # foreign eagle_config keys, kept verbatim
    eagle.update(eagle_aux_hidden_state_layer_ids=list(cfg.target_layer_ids), use_aux_hidden_state=True)
    theta = cfg.rope_theta
    out.update(architectures=[QWEN3_ARCH if cfg.qk_norm else LLAMA_ARCH], model_type="qwen3" if cfg.qk_norm else "llama",
               hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
               num_attention_heads=cfg.num_attention_heads, num_key_value_heads=cfg.num_key_value_heads,
               head_dim=cfg.head_dim, num_hidden_layers=cfg.num_hidden_layers, rms_norm_eps=cfg.rms_norm_eps,
               hidden_act=cfg.hidden_act, max_position_embeddings=cfg.max_position_embeddings,
               vocab_size=cfg.vocab_size, draft_vocab_size=cfg.draft_vocab_size,
               target_hidden_size=cfg.target_hidden_size, norm_before_residual=cfg.norm_before_residual,
               attention_bias=False, tie_word_embeddings=False, rope_theta=theta,
               rope_parameters={"rope_type": "default", "rope_theta": theta}, eagle_config=eagle)
    out.pop("rope_scaling", None)
    pd = pdraft_object(cfg, names=("ttt_steps", "num_target_layers"))
    pd["target_layer_ids"] = list(cfg.target_layer_ids)
    out["pdraft"] = pd
    return out


# Where an EAGLE-3 config.json names its target layers, pdraft's object first (module docstring: numbering).
LAYER_IDS: Places = (
    ("pdraft.target_layer_ids", "in pdraft.target_layer_ids"),
    ("eagle_config.eagle_aux_hidden_state_layer_ids",
     "in eagle_config.eagle_aux_hidden_state_layer_ids (SGLang's numbering)"),
    ("eagle_aux_hidden_state_layer_ids",
     "in the top-level eagle_aux_hidden_state_layer_ids (vLLM's numbering, each minus 1)"),
    # DeepSpec's key (its Qwen3Eagle3Model reads it, pdraft's numbering). No EAGLE-3-layout engine reads it, so it
    # never names the layers alone; beside a place the engines read, it must agree (issue 60).
    ("target_layer_ids", "in the top-level target_layer_ids (DeepSpec's key, pdraft's numbering)"))
ENGINE_PLACES = 3  # LAYER_IDS[:3] are what vLLM, SGLang or pdraft read; the rest are only checked against them


def _layer_ids(data: dict, where: str) -> list[int]:
    """The target layer ids in pdraft's numbering (module docstring), refused in one line when two places state
    different layers (pdraft.models.formats.stated_once), a top-level `target_layer_ids` included: vLLM reads the
    top-level eagle_aux_hidden_state_layer_ids, then eagle_config's (vllm/v1/worker/gpu_model_runner.py
    `_get_eagle3_aux_layers_from_config`), SGLang eagle_config's, DeepSpec `target_layer_ids`, so a folder whose
    places disagree runs other layers in each. pdraft's own `export --format vllm` writes vLLM's
    numbering into eagle_config beside its `pdraft` object: that pair agrees."""
    ours, eagle = (at(data, path) or None for path, _ in LAYER_IDS[:2])  # an empty list names no layers
    vllm_export = ours is not None and eagle is not None and list(eagle) == [int(i) + 1 for i in ours]

    def pdraft_terms(path: str, value):
        if not value:
            return None
        if path == LAYER_IDS[2][0]:
            return [int(i) - 1 for i in value]
        return list(ours) if path == LAYER_IDS[1][0] and vllm_export else list(value)

    ids = stated(data, where, "target_layer_ids", LAYER_IDS, pdraft_terms)
    if ids is not None and any(at(data, path) for path, _ in LAYER_IDS[:ENGINE_PLACES]):
        return ids
    raise PdraftError(f"{where} does not name the target layers it reads (eagle_config."
                      f"eagle_aux_hidden_state_layer_ids): the engines then capture hidden_states [2, L//2, L-3] of "
                      f"an L-layer target, which pdraft cannot know from the drafter alone",
                      hint="add \"eagle_config\": {\"eagle_aux_hidden_state_layer_ids\": [1, L//2 - 1, L - 4]} "
                           "(SGLang's numbering, that default) to its config.json")


def eagle3_config_from_json(data: dict, where: str = "config.json") -> Eagle3Config:
    """An Eagle3Config from an EAGLE-3 config.json (the EAGLE authors', SpecForge's, vLLM's or pdraft's)."""
    archs = data.get("architectures") or []
    if not any(a in archs for a in (LLAMA_ARCH, QWEN3_ARCH, *ALIASES)):
        raise PdraftError(f"{where}: architectures {archs} is not an EAGLE-3 drafter (expected {LLAMA_ARCH})")
    eagle = data.get("eagle_config") or {}
    if eagle.get("use_aux_hidden_state") is False:
        raise PdraftError(f"{where}: eagle_config.use_aux_hidden_state is false (an EAGLE-1/2 drafter without the "
                          f"fused target layers); pdraft builds EAGLE-3")
    for name, plain in OTHER_NETWORKS.items():
        if bool(data.get(name, eagle.get(name, plain))) != plain:
            raise PdraftError(f"{where}: {name} = true builds another network than EAGLE-3's (vLLM llama_eagle3.py)")
    if int(data.get("num_hidden_layers", 1)) != 1:
        raise PdraftError(f"{where}: {data['num_hidden_layers']} decoder layers; EAGLE-3 has one (`midlayer.`), the "
                          f"only depth pdraft builds")
    pd = data.get("pdraft") or {}
    fields = backbone_fields(data, where)
    fields.pop("attention_bias", None)
    require(data, ("vocab_size",), where)
    vocab = int(data["vocab_size"])
    target_hidden = data.get("target_hidden_size")
    if target_hidden is not None and int(target_hidden) != fields["hidden_size"]:
        raise PdraftError(f"{where}: target_hidden_size {target_hidden} differs from hidden_size "
                          f"{fields['hidden_size']}; pdraft shares the target's embedding, so the widths are one")
    if data.get("attention_bias"):
        raise PdraftError(f"{where}: attention biases are not supported (no published EAGLE-3 drafter has them)")
    qk_norm = QWEN3_ARCH in archs
    depth = pd.get("num_target_layers")
    fields.update(target_layer_ids=_layer_ids(data, where), num_target_layers=int(depth) if depth else None,
                  draft_vocab_size=int(data.get("draft_vocab_size") or vocab), qk_norm=qk_norm,
                  norm_before_residual=bool(data.get("norm_before_residual", False)),
                  ttt_steps=int(pd.get("ttt_steps", 7)), extra=extras(data, EAGLE3_KNOWN))
    foreign = {k: v for k, v in eagle.items() if k not in ("eagle_aux_hidden_state_layer_ids", "use_aux_hidden_state")}
    if foreign:
        fields["extra"]["eagle_config"] = foreign
    return Eagle3Config(**fields)


def eagle_default_layers(data: dict, target_config) -> dict:
    """config.json with the feature layers the EAGLE authors' releases leave to the target's depth L: their
    trainer and decoder capture the *input* of decoder layers 2, L//2 and L-3 (SafeAILab/EAGLE
    eagle/model/modeling_llama_kv.py `LlamaModel.forward`: `idx == 2 or idx == len(self.layers)//2 or idx ==
    len(self.layers) - 3`), so pdraft's ids (layer outputs) [1, L//2 - 1, L - 4]; vLLM's default
    (`get_eagle3_aux_layers_from_config`: 2, L//2, L-3 in its input numbering) is the same three layers."""
    named = (data.get("pdraft") or {}).get("target_layer_ids") or data.get("eagle_aux_hidden_state_layer_ids") or \
        (data.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if named:
        return data
    depth = target_dims(target_config)["num_target_layers"]
    eagle = dict(data.get("eagle_config") or {})
    eagle["eagle_aux_hidden_state_layer_ids"] = [1, depth // 2 - 1, depth - 4]  # SGLang's numbering = pdraft's
    return {**data, "eagle_config": eagle}


EAGLE3_LAYOUT = Layout(
    name="eagle3", architecture=LLAMA_ARCH, origin="eagle", to_json=eagle3_config_to_json,
    from_json=eagle3_config_from_json, kind_of=lambda data: Eagle3Config.kind, with_target=eagle_default_layers,
    stated_in={"target_layer_ids": LAYER_IDS},
    claims=lambda data: any(a in (data.get("architectures") or []) for a in (QWEN3_ARCH, *ALIASES)),
    schema={"": {"draft_vocab_size": BACKBONE_LIMITS["draft_vocab_size"].schema_entry(), "target_hidden_size": ("int", 1, 1 << 16),
                 "norm_before_residual": ("bool", None, None), "eagle_config": ("dict", None, None),
                 "eagle_aux_hidden_state_layer_ids": ("list", 1, 64)},  # target_layer_ids: the layer-id rule's
            "eagle_config.": {"eagle_aux_hidden_state_layer_ids": ("list", 1, 64),
                              "use_aux_hidden_state": ("bool", None, None)},
            "pdraft.": {"ttt_steps": LIMITS["ttt_steps"].schema_entry(), "num_target_layers": ("int", 1, 1024),
                        "target_layer_ids": ("list", 1, 64)}},
)

# ---- DeepSpec's Qwen3Eagle3Model ----------------------------------------------------------------------
DEEPSPEC_ARCH = "Qwen3Eagle3Model"  # deepspec/modeling/eagle3/qwen3/config.py build_draft_config
DEEPSPEC_ALIAS = "Eagle3DraftModel"  # DeepSpec's eval.py EVALUATORS: evaluated as Qwen3Eagle3Model
# What DeepSpec adds to the target's config (build_draft_config); the rest of the copy is kept as extras.
DEEPSPEC_FIELDS = ("target_layer_ids", "ttt_length", "draft_num_hidden_layers", "num_target_layers")
DEEPSPEC_KNOWN = KNOWN | set(DEEPSPEC_FIELDS) | {"eagle_config", "draft_vocab_size"}


def deepspec_eagle3_config_to_json(cfg: Eagle3Config) -> dict:
    """config.json as DeepSpec's build_draft_config writes it (the target's Qwen3 fields, then the drafter's)
    and Qwen3Eagle3Model.__init__ reads it. Only a drafter DeepSpec's class can be is written: the whole
    vocabulary (its lm_head is [V, H], no d2t), q/k norms (Qwen3Eagle3Attention always has them), the raw
    hidden state as the residual, and a known target depth."""
    why = ("a reduced draft vocabulary (Qwen3Eagle3Model's lm_head covers the whole target vocabulary)"
           if cfg.reduced_vocab else "no q/k norms (Qwen3Eagle3Attention always applies them)" if not cfg.qk_norm
           else "norm_before_residual (DeepSpec's layer keeps the raw hidden state as the residual)"
           if cfg.norm_before_residual else "no recorded target depth (num_target_layers)"
           if cfg.num_target_layers is None else None)
    if why:
        raise PdraftError(f"cannot write this EAGLE-3 drafter in DeepSpec's {DEEPSPEC_ARCH} layout: it has {why}",
                          hint="write it in the eagle3 layout (pdraft export --format vllm|sglang)")
    out = {k: v for k, v in cfg.extra.items() if k != "eagle_config"}
    out.update({name: getattr(cfg, name) for name in QWEN3_FIELDS})
    theta = cfg.rope_theta
    out.update(architectures=[DEEPSPEC_ARCH], model_type="qwen3", num_hidden_layers=1, draft_num_hidden_layers=1,
               layer_types=["full_attention"], num_target_layers=int(cfg.num_target_layers),
               target_layer_ids=list(cfg.target_layer_ids), ttt_length=cfg.ttt_steps,
               step_loss_decay=float(cfg.extra.get("step_loss_decay", STEP_DECAY)), tie_word_embeddings=False,
               use_sliding_window=False, sliding_window=None, attention_dropout=0.0, rope_theta=theta,
               rope_parameters={"rope_type": "default", "rope_theta": theta})
    out.pop("rope_scaling", None)
    out["pdraft"] = pdraft_object(cfg, names=())
    return out


def deepspec_eagle3_config_from_json(data: dict, where: str = "config.json") -> Eagle3Config:
    """An Eagle3Config from DeepSpec's config.json: Qwen3Eagle3Model's one decoder layer with q/k norms, the
    target's own sizes, norm and RoPE, the whole vocabulary, feature layers in pdraft's numbering
    (deepspec/modeling/eagle3/common.py extract_eagle3_context_feature reads hidden_states[id + 1])."""
    require(data, ("target_layer_ids", "ttt_length", "num_target_layers"), where)  # Qwen3Eagle3Model.__init__
    depth = int(data.get("draft_num_hidden_layers", data.get("num_hidden_layers", 1)))
    if depth != 1 or int(data.get("num_hidden_layers", 1)) != 1:
        raise PdraftError(f"{where}: {depth} draft decoder layers; DeepSpec's own evaluator "
                          f"(deepspec/eval/eagle3/evaluator.py) decodes only draft_num_hidden_layers == 1, the one "
                          f"depth pdraft builds")
    if data.get("attention_bias"):
        raise PdraftError(f"{where}: attention biases are not supported (no published EAGLE-3 drafter has them)")
    vocab = int(data["vocab_size"])
    if int(data.get("draft_vocab_size") or vocab) != vocab:
        raise PdraftError(f"{where}: draft_vocab_size in a {DEEPSPEC_ARCH} config; DeepSpec's EAGLE-3 drafts over "
                          f"the whole vocabulary and pdraft would read it without its d2t mapping")
    fields = backbone_fields(data, where)
    fields.pop("attention_bias", None)
    fields.update(target_layer_ids=[int(i) for i in data["target_layer_ids"]],
                  num_target_layers=int(data["num_target_layers"]), draft_vocab_size=vocab, qk_norm=True,
                  norm_before_residual=False, ttt_steps=int(data["ttt_length"]),
                  extra=extras(data, DEEPSPEC_KNOWN))
    return Eagle3Config(**fields)


DEEPSPEC_EAGLE3_LAYOUT = Layout(
    name="deepspec-eagle3", architecture=DEEPSPEC_ARCH, origin="deepspec", to_json=deepspec_eagle3_config_to_json,
    from_json=deepspec_eagle3_config_from_json, kind_of=lambda data: Eagle3Config.kind,
    claims=lambda data: DEEPSPEC_ALIAS in (data.get("architectures") or []),
    weight_prefixes=(("layers.0.", "midlayer."),), needs_shared=("embed_tokens.weight",),
    schema={"": {"ttt_length": LIMITS["ttt_steps"].schema_entry(), "draft_num_hidden_layers": ("int", 1, 1024),
                 "step_loss_decay": ("num", 0, 1e6)}},
)

__all__ = ["EAGLE3_LAYOUT", "DEEPSPEC_EAGLE3_LAYOUT", "DEEPSPEC_ARCH", "DEEPSPEC_ALIAS", "eagle_default_layers",
           "deepspec_eagle3_config_to_json", "deepspec_eagle3_config_from_json", "LLAMA_ARCH", "QWEN3_ARCH", "DRAFT_VOCAB", "eagle3_config_to_json",
           "eagle3_config_from_json"]
