"""One schema check for every `config.json` pdraft reads (its own drafters', DeepSpec's, z-lab's, a target's),
run on the parsed JSON before any field is converted or any module built: each field pdraft reads has a
type and a range, so a string block size or a string where the `pdraft` object belongs is one line naming the
field instead of an exception from `int()` deep in loading, and absurd sizes (a vocabulary of 1e9, a million
experts, 100k layers) are refused before they are allocated. The ranges are far above any released model
(largest vocabularies about 260k, widest MLPs about 50k, deepest stacks about 130 layers) and far below what
would exhaust a machine. Sizes are checked against the target and against the weight files' own shapes
elsewhere (pdraft.models.dims.check_fits_target, the meta-device comparison in load_drafter and the target
loader). The fields a checkpoint layout adds come from the layout (each family's format.py), so a new layout
brings its own ranges; FORMATS.md lists the fields and the engine files that read them. A drafter setting the
recipe also sets takes the recipe key's range, the one `Limit` both read (pdraft.models.dflash.config.LIMITS and the
families' own), so a config.json never loads a drafter the recipe would refuse to build. RoPE's objects
(`rope_parameters`, `rope_scaling`) are checked like the layouts' objects: a string where the object belongs, or
a string theta, is one line before the RoPE base is read."""

from __future__ import annotations

import math

from pdraft.errors import PdraftError
from pdraft.models.dflash.config import CONVENTIONS, LIMITS
from pdraft.models.families import FAMILIES

MAX_CONFIG_BYTES = 16 << 20

# field -> (kind, low, high[, off]); kinds: "int", "num", "bool", "str", "list", "dict"; `off`, a value accepted
# besides the range (a Limit's "not set"); None is allowed for every field (an absent or null field is the
# loader's concern, which names what it misses).
COMMON = {
    "hidden_size": ("int", 1, 1 << 16),
    "vocab_size": ("int", 1, 1 << 22),
    "num_hidden_layers": ("int", 1, 1024),
    "num_attention_heads": ("int", 1, 1024),
    "num_key_value_heads": ("int", 1, 1024),
    "head_dim": ("int", 1, 4096),
    "intermediate_size": ("int", 1, 1 << 18),
    "max_position_embeddings": ("int", 1, 1 << 24),
    "rms_norm_eps": ("num", 0, 1),
    "rope_theta": ("num", 0, 1e12),
    "attention_bias": ("bool", None, None),
    "tie_word_embeddings": ("bool", None, None),
    "architectures": ("list", 0, 16),
    "layer_types": ("list", 0, 1024),
    "model_type": ("str", None, None),
    "rope_parameters": ("dict", None, None),
    "rope_scaling": ("dict", None, None),
}
# RoPE's objects, as transformers v5 (`rope_parameters`) and v4 (`rope_scaling`) write them.
ROPE = {"rope_type": ("str", None, None), "type": ("str", None, None), "rope_theta": ("num", 0, 1e12),
        "factor": ("num", 0, 1e6)}
ROPE_OBJECTS = ("rope_parameters.", "rope_scaling.")


def _with_layouts(prefix: str, base: dict) -> dict:
    """`base` plus what every registered layout adds for the object at `prefix` ("" = the top level)."""
    out = dict(base)
    for layout in FAMILIES.layouts:
        out.update(layout.schema.get(prefix, {}))
    return out


# target_layer_ids are left to the one layer-id rule, pdraft.layer_ids.check_layer_ids.
TOP = ("num_hidden_layers", "block_size", "mask_token_id", "hidden_size", "intermediate_size",
        "num_attention_heads", "num_key_value_heads")  # the backbone settings at config.json's top level
DRAFTER = _with_layouts("", {
    **COMMON,
    **{name: LIMITS[name].schema_entry() for name in TOP},
    "num_target_layers": ("int", 1, 1024),
    "pdraft": ("dict", None, None),
})
PDRAFT = _with_layouts("pdraft.", {
    "kind": ("str", None, None),
    "model_type": ("str", None, None),
    "block_convention": ("str", None, None),
    "format_version": ("int", 0, 1000),
    **{name: LIMITS[name].schema_entry() for name in LIMITS if name not in TOP},
})
# The other objects layouts put into config.json (z-lab's and DFlash2's `dflash_config`, ...).
OBJECTS = {prefix: _with_layouts(prefix, {}) for layout in FAMILIES.layouts for prefix in layout.schema
           if prefix not in ("", "pdraft.")}
TARGET = {
    **COMMON,
    # mixture-of-experts targets, under the names transformers' configs use
    "num_experts": ("int", 0, 4096),
    "num_local_experts": ("int", 0, 4096),
    "n_routed_experts": ("int", 0, 4096),
    "num_experts_per_tok": ("int", 0, 64),
    "moe_intermediate_size": ("int", 1, 1 << 18),
    "text_config": ("dict", None, None),
}
_KIND_NAMES = {"int": "a whole number", "num": "a number", "bool": "true or false", "str": "text",
               "list": "a list", "dict": "a JSON object"}
_ENUMS = {("pdraft", "kind"): FAMILIES.kinds, ("pdraft", "block_convention"): CONVENTIONS}


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _check(data: dict, schema: dict, where: str, prefix: str = "") -> None:
    for name, (kind, low, high, *off) in schema.items():
        value = data.get(name)
        if value is None or (off and off[0] is not None and value == off[0] and type(value) is int):
            continue
        key = f"{prefix}{name}"
        ok = {"int": isinstance(value, int) and not isinstance(value, bool),
              "num": isinstance(value, (int, float)) and not isinstance(value, bool)
              and math.isfinite(value),
              "bool": isinstance(value, bool), "str": isinstance(value, str),
              "list": isinstance(value, list), "dict": isinstance(value, dict)}[kind]
        if not ok:
            raise PdraftError(f"{where}: {key} is {_shown(value)}, expected {_KIND_NAMES[kind]}")
        size = len(value) if kind == "list" else value if kind in ("int", "num") else None
        if size is not None and low is not None and not low <= size <= high:
            what = "entries" if kind == "list" else "a value"
            raise PdraftError(f"{where}: {key} is {_shown(value) if kind != 'list' else f'a list of {size}'}, "
                              f"expected {what} in {low}..{high:g}")
        allowed = _ENUMS.get((prefix.rstrip("."), name))
        if allowed and value not in allowed:
            raise PdraftError(f"{where}: {key} is {_shown(value)}, expected one of {', '.join(allowed)}")
    for name in ("architectures", "layer_types"):
        if isinstance(data.get(name), list) and not all(isinstance(v, str) for v in data[name]):
            raise PdraftError(f"{where}: {prefix}{name} must be a list of text")


def check_drafter_config(data: dict, where: str = "config.json") -> None:
    """Types and ranges of a drafter config.json (any registered layout), its `pdraft` object and the layouts'
    objects (`dflash_config`) included; raises a one-line PdraftError naming the first bad field."""
    _check(data, DRAFTER, where)
    _check(data.get("pdraft") or {}, PDRAFT, where, "pdraft.")
    for prefix, schema in OBJECTS.items():
        _check(data.get(prefix.rstrip(".")) or {}, schema, where, prefix)
    for prefix in ROPE_OBJECTS:
        _check(data.get(prefix.rstrip(".")) or {}, ROPE, where, prefix)
    mask = data.get("mask_token_id", (data.get("dflash_config") or {}).get("mask_token_id"))
    vocab = data.get("vocab_size")
    if isinstance(vocab, int) and isinstance(mask, int) and mask >= vocab:
        raise PdraftError(f"{where}: mask_token_id {mask} is not below vocab_size {vocab}")


def check_target_config(data: dict, where: str = "config.json") -> None:
    """Types and ranges of a target's config.json (and of its `text_config`, for multimodal wrappers)."""
    for part, prefix in ((data, ""), (data.get("text_config"), "text_config.")):
        if not isinstance(part, dict):
            continue
        _check(part, TARGET, where, prefix)
        for inner in ROPE_OBJECTS:  # a per-layer-type rope_parameters (Gemma 3) holds objects, not a theta
            _check(part.get(inner.rstrip(".")) or {}, ROPE, where, prefix + inner)
