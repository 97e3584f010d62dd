"""The `config.json` of DFlash2 checkpoints in the layout vLLM, SGLang and SpecForge read and write: a Qwen3
config with `architectures: ["DFlash2DraftModel"]` and a `dflash_config` object holding the DFlash and DFlash2
fields. The weights need no mapping (`model.safetensors` holds the backbone under the z-lab DFlash names, the
convolutions and the candidate selector under pdraft's own parameter names, no embedding or LM head), so
reading and writing the files is pdraft.models.checkpoint's `load_drafter` / `save_drafter`, which call this
mapping for a DFlash2 config (this module imports nothing above it, so checkpoint can). FORMAT.md in this
folder cites the engine file that reads every field and weight."""

from __future__ import annotations

from pdraft.errors import PdraftError
from pdraft.models.dflash2.config import DFlash2Config

ARCHITECTURE = "DFlash2DraftModel"  # vllm/model_executor/models/registry.py -> qwen3_dflash2.DFlash2Qwen3ForCausalLM
FORMAT_VERSION = 1
# Backbone fields written at the top level of config.json, Qwen3 names (qwen3_dflash.py builds its layers from them).
_QWEN3_FIELDS = ("hidden_size", "vocab_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                 "intermediate_size", "rms_norm_eps", "attention_bias", "hidden_act", "max_position_embeddings")
# The DFlash2 fields of `dflash_config` beyond DFlash's target_layer_ids / mask_token_id.
_SELECTOR_FIELDS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
_OPTIONAL_FIELDS = ("input_embedding_scale", "output_multiplier", "final_logit_softcapping")


# ---- config.json <-> DFlash2Config -------------------------------------------------------------------------
def config_to_json(cfg: DFlash2Config) -> dict:
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
        architectures=[ARCHITECTURE], model_type="qwen3", num_hidden_layers=cfg.num_hidden_layers,
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


def config_from_json(data: dict, where: str = "config.json") -> DFlash2Config:
    """A DFlash2Config from a published DFlash2 config.json. The DFlash2 fields are required (a DFlash2 head must
    never be run as a plain DFlash one); the three optional scales default to the engines' defaults."""
    archs = data.get("architectures") or []
    if ARCHITECTURE not in archs:
        raise PdraftError(f"{where}: architectures {archs} is not a DFlash2 drafter (expected {ARCHITECTURE})")
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


__all__ = ["ARCHITECTURE", "config_to_json", "config_from_json"]
