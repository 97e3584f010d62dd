"""DFlash2's checkpoint layout, `DFlash2DraftModel` (the layout vLLM, SGLang and SpecForge read and write;
FORMAT.md beside this file cites every field): a Qwen3 config with a `dflash_config` object holding the DFlash
and DFlash2 fields. Its weights are the backbone under the z-lab DFlash names, the convolutions and the candidate
selector under pdraft's own parameter names, no embedding or LM head; a drafter with a draft vocabulary (pdraft's
own, which no engine serves) adds `draft_vocab_size`, `lm_head.weight` [V_d, H], `d2t` and `t2d` as DFlash's."""

from __future__ import annotations

from pdraft.errors import PdraftError
from pdraft.models.dflash2.config import LIMITS, DFlash2Config
from pdraft.models.formats import (DRAFT_HEAD, IN_DFLASH_CONFIG, KNOWN, Layout, backbone_fields, either, extras,
                                   pdraft_object, qwen3_json)

DFLASH2_ARCH = "DFlash2DraftModel"  # vllm/model_executor/models/registry.py -> qwen3_dflash2.DFlash2Qwen3ForCausalLM
# The DFlash2 fields of `dflash_config` beyond DFlash's target_layer_ids / mask_token_id (vLLM's qwen3_dflash2.py,
# SpecForge's dflash2.py).
SELECTOR_FIELDS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
OPTIONAL_FIELDS = ("input_embedding_scale", "output_multiplier", "final_logit_softcapping")


def dflash2_config_to_json(cfg: DFlash2Config) -> dict:
    """config.json as vLLM's qwen3_dflash2.py / SpecForge's dflash2.py read it."""
    out = qwen3_json(cfg)
    dc = dict(cfg.extra.get("dflash_config") or {})  # foreign dflash_config keys, kept verbatim
    dc.update({"target_layer_ids": list(cfg.target_layer_ids), "mask_token_id": cfg.mask_token_id,
               "block_size": cfg.block_size})
    dc.update({name: getattr(cfg, name) for name in SELECTOR_FIELDS})
    dc.update({name: getattr(cfg, name) for name in OPTIONAL_FIELDS if name != "final_logit_softcapping"})
    if cfg.final_logit_softcapping is not None:
        dc["final_logit_softcapping"] = cfg.final_logit_softcapping
    out.update(architectures=[DFLASH2_ARCH], dflash_config=dc, pdraft=pdraft_object(cfg, names=()))
    return out


def dflash2_config_from_json(data: dict, where: str = "config.json") -> DFlash2Config:
    """A DFlash2Config from a published DFlash2 config.json. The DFlash2 fields are required (a DFlash2 head must
    never be run as a plain DFlash one); the three optional scales default to the engines' defaults."""
    archs = data.get("architectures") or []
    if DFLASH2_ARCH not in archs:
        raise PdraftError(f"{where}: architectures {archs} is not a DFlash2 drafter (expected {DFLASH2_ARCH})")
    dc = data.get("dflash_config")
    if not isinstance(dc, dict):
        raise PdraftError(f"{where} misses the 'dflash_config' object")
    fields = backbone_fields(data, where, required=("num_target_layers",))
    either(data, "target_layer_ids", where, required=False)  # a top-level copy must agree with dflash_config's
    for name in ("target_layer_ids",) + SELECTOR_FIELDS:
        if dc.get(name) is None:
            raise PdraftError(f"{where} misses field 'dflash_config.{name}'")
    block, mask_id = either(data, "block_size", where), either(data, "mask_token_id", where)
    fields.update(num_target_layers=int(data["num_target_layers"]), target_layer_ids=list(dc["target_layer_ids"]),
                  mask_token_id=int(mask_id), block_size=int(block))
    fields.update({name: int(dc[name]) for name in SELECTOR_FIELDS})
    fields["input_embedding_scale"] = float(dc.get("input_embedding_scale", 1.0))
    fields["output_multiplier"] = float(dc.get("output_multiplier", 1.0))
    cap = dc.get("final_logit_softcapping")
    fields["final_logit_softcapping"] = float(cap) if cap else None  # vLLM: 0 or null = off
    fields["extra"] = extras(data)
    ours = {"target_layer_ids", "mask_token_id", "block_size", *SELECTOR_FIELDS, *OPTIONAL_FIELDS}
    foreign = {k: v for k, v in dc.items() if k not in ours}
    # Keys that would make this a different network than the one pdraft builds are refused, not carried.
    if foreign.get("causal") or foreign.get("attention_mode", "gqa") != "gqa":
        raise PdraftError(f"{where}: dflash_config {foreign} describes a causal or MLA drafter; pdraft builds the "
                          f"bidirectional GQA DFlash2 only")
    if foreign:
        fields["extra"]["dflash_config"] = foreign
    return DFlash2Config(**fields)


DFLASH2_LAYOUT = Layout(
    name="dflash2", architecture=DFLASH2_ARCH, origin="zlab", to_json=dflash2_config_to_json,
    from_json=dflash2_config_from_json, kind_of=lambda data: DFlash2Config.kind, stated_in=IN_DFLASH_CONFIG,
    weight_prefixes=DRAFT_HEAD,  # a draft vocabulary's own head is `lm_head` in the file, as DFlash's
    # vllm/model_executor/models/qwen3_dflash2.py reads these from dflash_config
    schema={"dflash_config.": {**{name: limit.schema_entry() for name, limit in LIMITS.items()},
                               "input_embedding_scale": ("num", 0, 1e6), "output_multiplier": ("num", 0, 1e6),
                               "final_logit_softcapping": ("num", 0, 1e6)}},
)

__all__ = ["DFLASH2_LAYOUT", "DFLASH2_ARCH", "dflash2_config_to_json", "dflash2_config_from_json"]
