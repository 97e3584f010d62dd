"""Every foreign checkpoint format pdraft reads or writes, in one place: family detection from `config.json`,
`config.json` <-> typed config for each family, and the weight names the families share or differ in. FORMATS.md
beside this file (and pdraft/models/dflash2/FORMAT.md, pdraft/hub/ENGINES.md) tables every field with the
reference or engine file that reads it; the comments here name that file at each constant.

- DeepSpec layout (architecture `Qwen3DSparkModel`): pdraft's DSpark drafters and DeepSpec-convention DFlash
  drafters. The target's config fields are kept, `num_hidden_layers` is the drafter depth, and DeepSpec's own
  fields (num_target_layers, block_size, mask_token_id, target_layer_ids, num_anchors, markov_rank,
  markov_head_type, enable_confidence_head, confidence_head_with_markov) are added.
- z-lab layout (architecture `DFlashDraftModel`): z-lab-convention DFlash drafters; `dflash_config` holds
  target_layer_ids and mask_token_id, `block_size` sits at the top level (read from `dflash_config` too).
- DFlash2 layout (architecture `DFlash2DraftModel`, the layout vLLM, SGLang and SpecForge read and write): a
  Qwen3 config with a `dflash_config` object holding the DFlash and DFlash2 fields. Its weights need no mapping
  (the backbone under the z-lab DFlash names, the convolutions and the candidate selector under pdraft's own
  parameter names, no embedding or LM head).
pdraft-only settings (kind, block convention, denoise steps, MoE sizes) live in a `pdraft` object that the
other loaders ignore. These are pure mappings between dicts and dataclasses: reading and writing the files is
pdraft.models.checkpoint, the engine layouts and serve commands are pdraft.hub.export."""

from __future__ import annotations

import torch

from pdraft.errors import PdraftError
from pdraft.models.build import target_dims
from pdraft.models.config import DFlashConfig, DSparkConfig
from pdraft.models.dflash2.config import DFlash2Config

FORMAT_VERSION = 1  # the `pdraft` object's format_version; only pdraft reads it
# DeepSpec stores copies (deepspec/trainer/ckpt_manager.py saves the full state dict); pdraft uses the target's.
SHARED_KEYS = ("embed_tokens.weight", "lm_head.weight")
# DeepSpec: deepspec/modeling/dspark/qwen3/modeling.py (Qwen3DSparkModel), vllm/model_executor/models/qwen3_dspark.py,
# python/sglang/srt/models/dspark.py. z-lab: dflash/model.py (DFlashDraftModel), vllm/v1/spec_decode/dflash.py,
# python/sglang/srt/speculative/dflash_utils.py.
DEEPSPEC_ARCH, ZLAB_ARCH = "Qwen3DSparkModel", "DFlashDraftModel"
DFLASH2_ARCH = "DFlash2DraftModel"  # vllm/model_executor/models/registry.py -> qwen3_dflash2.DFlash2Qwen3ForCausalLM
# markov_head_type names: deepspec/modeling/dspark/markov_head.py (vanilla | gated | rnn); vLLM reads vanilla only.
HEAD_TO_DEEPSPEC = {"markov": "vanilla", "gated": "gated", "rnn": "rnn"}
HEAD_FROM_DEEPSPEC = {v: k for k, v in HEAD_TO_DEEPSPEC.items()}
# Backbone fields at the top level of config.json, Qwen3 names: DeepSpec's build_draft_config
# (deepspec/modeling/dspark/qwen3/config.py), z-lab's dflash/model.py and vLLM's qwen3_dflash.py /
# qwen3_dflash2.py build their layers from them.
_QWEN3_FIELDS = ("hidden_size", "vocab_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                 "intermediate_size", "rms_norm_eps", "attention_bias", "hidden_act", "max_position_embeddings")
# pdraft-only settings in the `pdraft` object, which every other loader ignores.
_PDRAFT_FIELDS = ("block_convention", "denoise_steps", "num_experts", "num_experts_per_tok",
                  "moe_intermediate_size")
# The DFlash2 fields of `dflash_config` beyond DFlash's target_layer_ids / mask_token_id (vLLM's qwen3_dflash2.py,
# SpecForge's dflash2.py; FORMAT.md beside pdraft/models/dflash2/model.py).
_SELECTOR_FIELDS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
_OPTIONAL_FIELDS = ("input_embedding_scale", "output_multiplier", "final_logit_softcapping")


# ---- DeepSpec / z-lab config.json <-> DFlashConfig / DSparkConfig -------------------------------------------------
def config_to_json(cfg: DFlashConfig, layout: str) -> dict:
    if layout == "dflash2":
        return dflash2_config_to_json(cfg)
    out = dict(cfg.extra)
    out.update({name: getattr(cfg, name) for name in _QWEN3_FIELDS})
    out.update(
        model_type="qwen3",
        num_hidden_layers=cfg.num_hidden_layers,
        num_target_layers=cfg.num_target_layers,
        block_size=cfg.block_size,
        layer_types=["full_attention"] * cfg.num_hidden_layers,
        use_sliding_window=False,
        sliding_window=None,
        attention_dropout=0.0,
        tie_word_embeddings=False,
        rope_theta=cfg.rope_theta,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
    )
    out.pop("rope_scaling", None)
    if layout == "zlab":
        out["architectures"] = [ZLAB_ARCH]
        out["dflash_config"] = {"target_layer_ids": list(cfg.target_layer_ids), "mask_token_id": cfg.mask_token_id}
    else:
        out["architectures"] = [DEEPSPEC_ARCH]
        out["mask_token_id"] = cfg.mask_token_id
        out["target_layer_ids"] = list(cfg.target_layer_ids)
        out.setdefault("num_anchors", 512)  # a DeepSpec training setting its loader requires; unused here
        seq = cfg.sequential_head if isinstance(cfg, DSparkConfig) else "none"
        out["markov_rank"] = cfg.markov_rank if seq != "none" else 0
        if seq != "none":
            out["markov_head_type"] = HEAD_TO_DEEPSPEC[seq]
        else:
            out.pop("markov_head_type", None)
        out["enable_confidence_head"] = cfg.has_confidence
        if cfg.has_confidence:
            out["confidence_head_with_markov"] = bool(cfg.confidence_with_markov)
        else:
            out.pop("confidence_head_with_markov", None)
    pd = {name: getattr(cfg, name) for name in _PDRAFT_FIELDS}
    pd.update(format_version=FORMAT_VERSION, kind=cfg.kind, model_type=cfg.model_type)
    if isinstance(cfg, DSparkConfig) and cfg.sequential_head == "none":
        pd["markov_rank"] = cfg.markov_rank  # DeepSpec writes 0 for "no head"; keep ours for an exact round trip
    out["pdraft"] = pd
    return out


def _require(data: dict, names, where: str) -> None:
    for name in names:
        if name not in data or data[name] is None:
            raise PdraftError(f"{where} misses field '{name}'")


def detect_family(data: dict) -> str:
    """"deepspec", "dflash2" or "zlab" from config.json's architectures (or a `dflash_config` object). DFlash2 is
    recognised before the z-lab fallback: its config also has a `dflash_config`, and running a DFlash2 head as a
    plain DFlash one would silently drop its convolutions and selector."""
    archs = data.get("architectures") or []
    if DFLASH2_ARCH in archs:
        return "dflash2"
    if DEEPSPEC_ARCH in archs:
        return "deepspec"
    if ZLAB_ARCH in archs or "dflash_config" in data:
        return "zlab"
    if any("DSpark" in a for a in archs):
        raise PdraftError(f"drafter architecture {archs} is not supported (only Qwen3-style drafters)")
    raise PdraftError(f"config.json is not a DFlash/DSpark drafter: architectures {archs} (expected "
                      f"{DEEPSPEC_ARCH} or {ZLAB_ARCH})")


def zlab_default_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """z-lab's rule when dflash_config has no target_layer_ids: one id per draft layer, spread over 1..L-3."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    span = num_target_layers - 4
    return [int(round(1 + i * span / (num_draft_layers - 1))) for i in range(num_draft_layers)]


def config_from_json(data: dict, where: str = "config.json") -> DFlashConfig:
    family = detect_family(data)
    if family == "dflash2":
        return dflash2_config_from_json(data, where)
    _require(data, ("hidden_size", "vocab_size", "num_hidden_layers", "num_attention_heads", "intermediate_size"),
             where)
    if any(t != "full_attention" for t in (data.get("layer_types") or [])):
        raise PdraftError(f"{where}: sliding-window drafter layers are not supported ({data['layer_types']})")
    dims = target_dims({**data, "num_hidden_layers": data.get("num_target_layers", 1)})
    pd = data.get("pdraft") or {}
    fields = {k: v for k, v in dims.items() if k != "num_target_layers"}
    fields["num_hidden_layers"] = int(data["num_hidden_layers"])
    if family == "deepspec":
        _require(data, ("num_target_layers", "block_size", "target_layer_ids", "mask_token_id", "markov_rank",
                        "enable_confidence_head"), where)
        rank, conf = int(data["markov_rank"]), bool(data["enable_confidence_head"])
        if rank > 0:
            _require(data, ("markov_head_type",), where)
        if conf:
            _require(data, ("confidence_head_with_markov",), where)
        kind = pd.get("kind") or ("dspark" if rank > 0 or conf else "dflash")
        ids, mask_id = data["target_layer_ids"], data["mask_token_id"]
        fields["block_convention"] = "deepspec"
        if kind == "dspark":
            head = str(data.get("markov_head_type", "")).lower() if rank > 0 else "none"
            if head not in HEAD_FROM_DEEPSPEC and head != "none":
                raise PdraftError(f"{where}: unknown markov_head_type {data['markov_head_type']!r}")
            fields.update(sequential_head=HEAD_FROM_DEEPSPEC.get(head, "none"),
                          markov_rank=rank or int(pd.get("markov_rank", 256)),
                          confidence_head=conf,
                          confidence_with_markov=bool(data.get("confidence_head_with_markov", False)) and conf)
    else:
        dc = data.get("dflash_config") or {}
        kind = pd.get("kind", "dflash")
        block = data.get("block_size", dc.get("block_size"))
        if block is None:
            raise PdraftError(f"{where} misses field 'block_size' (looked at the top level and in dflash_config)")
        mask_id = dc.get("mask_token_id", data.get("mask_token_id"))
        if mask_id is None:
            raise PdraftError(f"{where} misses field 'dflash_config.mask_token_id'")
        _require(data, ("num_target_layers",), where)
        ids = dc.get("target_layer_ids") or zlab_default_layer_ids(int(data["num_target_layers"]),
                                                                   int(data["num_hidden_layers"]))
        data = {**data, "block_size": block}
        fields["block_convention"] = "zlab"
    fields.update(num_target_layers=int(data["num_target_layers"]), block_size=int(data["block_size"]),
                  target_layer_ids=ids, mask_token_id=int(mask_id))
    for name in _PDRAFT_FIELDS:
        if name in pd:
            fields[name] = pd[name]
    known = set(_QWEN3_FIELDS) | {"pdraft", "dflash_config", "rope_parameters", "rope_scaling", "rope_theta",
                                  "architectures", "model_type", "num_hidden_layers", "layer_types",
                                  "target_layer_ids", "mask_token_id", "block_size", "num_target_layers",
                                  "markov_rank", "markov_head_type", "enable_confidence_head",
                                  "confidence_head_with_markov", "auto_map", "use_sliding_window", "sliding_window",
                                  "attention_dropout", "tie_word_embeddings", "torch_dtype", "dtype"}
    fields["extra"] = {k: v for k, v in data.items() if k not in known}
    if fields["extra"].get("num_anchors") == 512:  # the default we write; keep configs round-tripping exactly
        del fields["extra"]["num_anchors"]
    return (DSparkConfig if kind == "dspark" else DFlashConfig)(**fields)



# ---- DFlash2 config.json <-> DFlash2Config (pdraft/models/dflash2/FORMAT.md cites every field) --------------------
def dflash2_config_to_json(cfg: DFlash2Config) -> dict:
    """config.json as vLLM's qwen3_dflash2.py / SpecForge's dflash2.py read it."""
    out = dict(cfg.extra)
    out.update({name: getattr(cfg, name) for name in _QWEN3_FIELDS})
    dc = dict(cfg.extra.get("dflash_config") or {})  # foreign dflash_config keys, kept verbatim
    dc.update({"target_layer_ids": list(cfg.target_layer_ids), "mask_token_id": cfg.mask_token_id,
          "block_size": cfg.block_size})
    dc.update({name: getattr(cfg, name) for name in _SELECTOR_FIELDS})
    dc.update({name: getattr(cfg, name) for name in _OPTIONAL_FIELDS if name != "final_logit_softcapping"})
    if cfg.final_logit_softcapping is not None:
        dc["final_logit_softcapping"] = cfg.final_logit_softcapping
    out.update(
        architectures=[DFLASH2_ARCH], model_type="qwen3", num_hidden_layers=cfg.num_hidden_layers,
        num_target_layers=cfg.num_target_layers, block_size=cfg.block_size,
        layer_types=["full_attention"] * cfg.num_hidden_layers, use_sliding_window=False, sliding_window=None,
        attention_dropout=0.0, tie_word_embeddings=False, rope_theta=cfg.rope_theta,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta}, dflash_config=dc,
        pdraft={"format_version": FORMAT_VERSION, "kind": cfg.kind, "model_type": cfg.model_type},
    )
    out.pop("rope_scaling", None)
    return out


def _rope_theta(data: dict, where: str) -> float:
    params = data.get("rope_parameters") or {}
    kind = params.get("rope_type") or params.get("type") or (data.get("rope_scaling") or {}).get("rope_type")
    if kind not in (None, "default"):
        raise PdraftError(f"{where}: RoPE type {kind!r} is not supported by pdraft drafters (only plain RoPE)")
    return float(params.get("rope_theta", data.get("rope_theta", 10000.0)))


def dflash2_config_from_json(data: dict, where: str = "config.json") -> DFlash2Config:
    """A DFlash2Config from a published DFlash2 config.json. The DFlash2 fields are required (a DFlash2 head must
    never be run as a plain DFlash one); the three optional scales default to the engines' defaults."""
    archs = data.get("architectures") or []
    if DFLASH2_ARCH not in archs:
        raise PdraftError(f"{where}: architectures {archs} is not a DFlash2 drafter (expected {DFLASH2_ARCH})")
    dc = data.get("dflash_config")
    if not isinstance(dc, dict):
        raise PdraftError(f"{where} misses the 'dflash_config' object")
    for name in ("hidden_size", "vocab_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                 "num_target_layers"):
        if data.get(name) is None:
            raise PdraftError(f"{where} misses field '{name}'")
    for name in ("target_layer_ids", "mask_token_id") + _SELECTOR_FIELDS:
        if dc.get(name, data.get(name) if name == "mask_token_id" else None) is None:
            raise PdraftError(f"{where} misses field 'dflash_config.{name}'")
    if any(t != "full_attention" for t in (data.get("layer_types") or [])):
        raise PdraftError(f"{where}: sliding-window drafter layers are not supported ({data['layer_types']})")
    block = data.get("block_size", dc.get("block_size"))
    if block is None:
        raise PdraftError(f"{where} misses field 'block_size' (looked at the top level and in dflash_config)")
    heads = int(data["num_attention_heads"])
    fields = dict(
        hidden_size=int(data["hidden_size"]), vocab_size=int(data["vocab_size"]),
        num_target_layers=int(data["num_target_layers"]), target_layer_ids=list(dc["target_layer_ids"]),
        mask_token_id=int(dc.get("mask_token_id", data.get("mask_token_id"))), num_attention_heads=heads,
        num_key_value_heads=int(data.get("num_key_value_heads") or heads),
        head_dim=int(data.get("head_dim") or int(data["hidden_size"]) // heads),
        intermediate_size=int(data["intermediate_size"]), num_hidden_layers=int(data["num_hidden_layers"]),
        block_size=int(block), rms_norm_eps=float(data.get("rms_norm_eps", 1e-6)),
        rope_theta=_rope_theta(data, where), attention_bias=bool(data.get("attention_bias", False)),
        hidden_act=str(data.get("hidden_act", "silu")),
        max_position_embeddings=int(data.get("max_position_embeddings") or 40960),
    )
    fields.update({name: int(dc[name]) for name in _SELECTOR_FIELDS})
    fields["input_embedding_scale"] = float(dc.get("input_embedding_scale", 1.0))
    fields["output_multiplier"] = float(dc.get("output_multiplier", 1.0))
    cap = dc.get("final_logit_softcapping")
    fields["final_logit_softcapping"] = float(cap) if cap else None  # vLLM: 0 or null = off
    known = set(_QWEN3_FIELDS) | {"pdraft", "dflash_config", "rope_parameters", "rope_scaling", "rope_theta",
                                  "architectures", "model_type", "num_hidden_layers", "layer_types", "block_size",
                                  "num_target_layers", "mask_token_id", "auto_map", "use_sliding_window",
                                  "sliding_window", "attention_dropout", "tie_word_embeddings", "torch_dtype",
                                  "dtype"}
    fields["extra"] = {k: v for k, v in data.items() if k not in known}
    ours = {"target_layer_ids", "mask_token_id", "block_size", *_SELECTOR_FIELDS, *_OPTIONAL_FIELDS}
    foreign = {k: v for k, v in dc.items() if k not in ours}
    # Keys that would make this a different network than the one pdraft builds are refused, not carried.
    if foreign.get("causal") or foreign.get("attention_mode", "gqa") != "gqa":
        raise PdraftError(f"{where}: dflash_config {foreign} describes a causal or MLA drafter; pdraft builds the "
                          f"bidirectional GQA DFlash2 only")
    if foreign:
        fields["extra"]["dflash_config"] = foreign
    return DFlash2Config(**fields)


# ---- what the serving engines need beyond the checkpoint (pdraft/hub/export.py picks the layout) ---------------
def to_engine_layout(data: dict, tensors: dict, cfg: DFlashConfig, layout: str, *, zero_markov: bool,
                     dtype: torch.dtype) -> None:
    """Complete `data` (config.json) and `tensors` in place for a serving engine. zero_markov: write a rank-1
    Markov head whose weights are all zero (transition bias exactly 0, drafts unchanged), because the engines'
    DSpark paths require markov_rank > 0 (vllm/model_executor/models/qwen3_dspark.py,
    python/sglang/srt/models/dspark.py)."""
    if zero_markov:
        # Both engines read markov_rank/markov_head_type from the top level; pdraft then reads it back as a DSpark
        # with a zero Markov head, whose drafts equal the original's. The pdraft object would contradict it.
        data.pop("pdraft", None)
        data.update(markov_rank=1, markov_head_type="vanilla")
        zeros = torch.zeros(cfg.vocab_size, 1, dtype=dtype)
        # DeepSpec's names (deepspec/modeling/dspark/markov_head.py), which vLLM's qwen3_dspark.py loads as they are.
        tensors["markov_head.markov_w1.weight"] = zeros.clone()  # [vocab, 1]
        tensors["markov_head.markov_w2.weight"] = zeros.clone()  # [vocab, 1]
        if not cfg.has_confidence:
            data["enable_confidence_head"] = False
    if layout == "deepspec":
        data["sample_from_anchor"] = True  # vLLM's DSpark speculator reads it (default True); stated, not implied


# ---- the family name `pdraft pull` reports ---------------------------------------------------------------
def family_of(data: dict) -> str:
    """pdraft/DeepSpec/z-lab and dflash/dspark from a parsed config.json (as load_config will read it)."""
    layout = detect_family(data)
    pd = data.get("pdraft") or {}
    if layout == "deepspec":
        dspark = int(data.get("markov_rank") or 0) > 0 or bool(data.get("enable_confidence_head"))
        kind = pd.get("kind") or ("dspark" if dspark else "dflash")
    elif layout == "dflash2":  # DFlash2DraftModel: the z-lab DFlash family's successor
        layout, kind = "zlab", "dflash2"
    else:
        kind = pd.get("kind", "dflash")
    if pd:
        return f"pdraft-{kind}"
    return f"{layout}-{kind}"


__all__ = ["DEEPSPEC_ARCH", "ZLAB_ARCH", "DFLASH2_ARCH", "SHARED_KEYS", "FORMAT_VERSION", "HEAD_TO_DEEPSPEC",
           "HEAD_FROM_DEEPSPEC", "detect_family", "family_of", "config_to_json", "config_from_json",
           "dflash2_config_to_json", "dflash2_config_from_json", "zlab_default_layer_ids", "to_engine_layout"]
