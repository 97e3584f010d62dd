"""z-lab's checkpoint layout, `DFlashDraftModel` (z-lab/dflash `dflash/model.py`; vLLM's
vllm/v1/spec_decode/dflash.py and SGLang's python/sglang/srt/speculative/dflash_utils.py read it): z-lab-
convention DFlash drafters. A Qwen3 config whose `dflash_config` object holds target_layer_ids and
mask_token_id; `block_size` sits at the top level (read from `dflash_config` too). pdraft-only settings go into
the `pdraft` object. FORMATS.md beside pdraft/models/formats.py cites every field."""

from __future__ import annotations

from pdraft.errors import PdraftError
from pdraft.models.dflash.config import LIMITS, DFlashConfig
from pdraft.models.formats import (DRAFT_HEAD, IN_DFLASH_CONFIG, KNOWN, Layout, backbone_fields, either, extras,
                                   pdraft_object, pdraft_settings, qwen3_json, require)

ZLAB_ARCH = "DFlashDraftModel"


def to_json(cfg: DFlashConfig) -> dict:
    out = qwen3_json(cfg)
    out["architectures"] = [ZLAB_ARCH]
    out["dflash_config"] = {"target_layer_ids": list(cfg.target_layer_ids), "mask_token_id": cfg.mask_token_id}
    out["pdraft"] = pdraft_object(cfg)
    return out


def zlab_default_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """z-lab's rule when dflash_config has no target_layer_ids: one id per draft layer, spread over 1..L-3."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    span = num_target_layers - 4
    return [int(round(1 + i * span / (num_draft_layers - 1))) for i in range(num_draft_layers)]


def kind_of(data: dict) -> str:
    return (data.get("pdraft") or {}).get("kind", "dflash")


def from_json(data: dict, where: str = "config.json") -> DFlashConfig:
    fields = backbone_fields(data, where)
    if kind_of(data) != DFlashConfig.kind:  # pdraft writes no other kind in this layout (save_drafter refuses it)
        raise PdraftError(f"{where}: the z-lab layout ({ZLAB_ARCH}) holds DFlash drafters only, not "
                          f"{kind_of(data)!r}")
    dc = data.get("dflash_config") or {}
    block, mask_id = either(data, "block_size", where), either(data, "mask_token_id", where)
    require(data, ("num_target_layers",), where)
    ids = either(data, "target_layer_ids", where, required=False) or zlab_default_layer_ids(int(data["num_target_layers"]),
                                                               int(data["num_hidden_layers"]))
    fields.update(block_convention="zlab", num_target_layers=int(data["num_target_layers"]), block_size=int(block),
                  target_layer_ids=ids, mask_token_id=int(mask_id))
    fields.update(pdraft_settings(data))
    fields["extra"] = extras(data, KNOWN | {"target_layer_ids"})
    return DFlashConfig(**fields)


ZLAB = Layout(
    weight_prefixes=DRAFT_HEAD,
    name="zlab", architecture=ZLAB_ARCH, origin="zlab", to_json=to_json, from_json=from_json, kind_of=kind_of,
    claims=lambda data: "dflash_config" in data,  # a bare dflash_config: the z-lab fallback (after DFlash2's arch)
    stated_in=IN_DFLASH_CONFIG,
    schema={"": {"dflash_config": ("dict", None, None)},
            "dflash_config.": {name: LIMITS[name].schema_entry() for name in ("mask_token_id", "block_size")}},
)

__all__ = ["ZLAB", "ZLAB_ARCH", "zlab_default_layer_ids"]
