"""The checkpoint layouts drafters are read from and written in, and what every layout shares. A `Layout` is
one `config.json` mapping: its architecture, config.json <-> typed config, the family a parsed config.json
holds (for the name `pdraft pull` reports) and the fields it adds to the schema check. Each family declares
its layouts in its spec and keeps them beside itself: DeepSpec's `Qwen3DSparkModel` (pdraft/models/dspark/
format.py: DSpark drafters and DeepSpec-convention DFlash), z-lab's `DFlashDraftModel` (pdraft/models/dflash/
format.py) and `DFlash2DraftModel` (pdraft/models/dflash2/format.py). This module holds what they share, once:
the Qwen3 backbone fields at the top level of config.json, the `pdraft` object (pdraft-only settings that the
other loaders ignore), the keys no layout keeps as foreign extras, and `EnginePlan`, how a drafter maps onto a
serving engine (a family's spec makes it, pdraft.hub.export carries it out). Which layout a config.json is,
and the conversions, are asked of the registry (pdraft.models.families). These are pure mappings between
dicts and dataclasses: reading and writing the files is pdraft.models.checkpoint. FORMATS.md beside this file
(and each family's FORMAT.md, pdraft/hub/ENGINES.md) tables every field with the file that reads it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pdraft.errors import PdraftError
from pdraft.models.dims import target_dims

FORMAT_VERSION = 1  # the `pdraft` object's format_version; only pdraft reads it
# DeepSpec stores copies (deepspec/trainer/ckpt_manager.py saves the full state dict); pdraft uses the target's.
SHARED_KEYS = ("embed_tokens.weight", "lm_head.weight")
# Backbone fields at the top level of config.json, Qwen3 names: DeepSpec's build_draft_config
# (deepspec/modeling/dspark/qwen3/config.py), z-lab's dflash/model.py and vLLM's qwen3_dflash.py /
# qwen3_dflash2.py build their layers from them.
QWEN3_FIELDS = ("hidden_size", "vocab_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                "intermediate_size", "rms_norm_eps", "attention_bias", "hidden_act", "max_position_embeddings")
# pdraft-only settings in the `pdraft` object, which every other loader ignores.
PDRAFT_FIELDS = ("block_convention", "denoise_steps", "num_experts", "num_experts_per_tok", "moe_intermediate_size")
# Keys every layout maps or rewrites itself, so none of them is carried as a foreign extra.
KNOWN = frozenset(QWEN3_FIELDS) | {"pdraft", "dflash_config", "rope_parameters", "rope_scaling", "rope_theta",
                                   "architectures", "model_type", "num_hidden_layers", "layer_types", "block_size",
                                   "num_target_layers", "mask_token_id", "auto_map", "use_sliding_window",
                                   "sliding_window", "attention_dropout", "tie_word_embeddings", "torch_dtype", "dtype",
                                   "draft_vocab_size"}
# A parallel drafter's own LM head over its draft vocabulary is `draft_head` in pdraft (its `lm_head` is the
# target's) and `lm_head` in the files the engines read (vllm/model_executor/models/qwen3_dflash.py,
# qwen3_dspark.py: `ParallelLMHead(draft_vocab_size)`, `d2t` -> `draft_id_to_target_id`).
DRAFT_HEAD = (("lm_head.", "draft_head."),)
Schema = Mapping[str, tuple]  # config.json field -> (kind, low, high), as pdraft.models.schema checks it
# Fields a config.json may state in more than one place: name -> ((dotted path, how a refusal names it), ...).
# A reader reads each through `stated` (two places that disagree: one line naming both, stated_once), and a
# layout declares the ones it reads (Layout.stated_twice), which tests/test_reliability_walks.py states twice.
Places = tuple[tuple[str, str], ...]
# The RoPE base every layout's backbone has: transformers v4 writes it at the top level, v5 in rope_parameters.
BACKBONE_STATED: Mapping[str, Places] = {
    "rope_theta": (("rope_theta", "at the top level"), ("rope_parameters.rope_theta", "in rope_parameters"))}
# What z-lab's and DFlash2's config.json hold in `dflash_config` and may repeat at the top level (DeepSpec's the
# other way round).
IN_DFLASH_CONFIG: Mapping[str, Places] = {
    name: ((name, "at the top level"), (f"dflash_config.{name}", "in dflash_config"))
    for name in ("block_size", "mask_token_id", "target_layer_ids")}


@dataclass(frozen=True)
class Layout:
    name: str  # "deepspec" | "zlab" | "dflash2": what save_drafter(layout=...) and EnginePlan.layout say
    architecture: str  # its `architectures` entry, which identifies it
    origin: str  # who publishes checkpoints in it, for the family name `pull` reports ("deepspec", "zlab")
    to_json: Callable[[Any], dict]  # typed config -> config.json
    from_json: Callable[[dict, str], Any]  # (config.json, where) -> typed config
    kind_of: Callable[[dict], str]  # the family a parsed config.json of this layout holds
    claims: Callable[[dict], bool] = lambda data: False  # weaker evidence when no architecture names a layout
    refuses: Callable[[list], str | None] = lambda archs: None  # a near-miss architecture, with the reason
    schema: Mapping[str, Schema] = field(default_factory=dict)  # fields it adds, by object ("" = the top level)
    # Weight names of the file that are not pdraft's module names: (file prefix, module prefix) pairs, read and
    # written by pdraft.models.checkpoint (DeepSpec's EAGLE-3 `layers.0.` is pdraft's `midlayer.`).
    weight_prefixes: tuple[tuple[str, str], ...] = ()
    # Copies of the target's weights (SHARED_KEYS) that the layout's own loader needs in the file: DeepSpec's
    # `from_pretrained` would start a missing embedding at random. save_drafter writes the attached target's.
    needs_shared: tuple[str, ...] = ()
    # (config.json, target config) -> config.json completed from the target where the file leaves a setting to
    # the target's depth (the EAGLE authors' releases name no feature layers); applied when a target is known.
    with_target: Callable[[dict, Any], dict] = lambda data, target: data
    stated_in: Mapping[str, Places] = field(default_factory=dict)  # its own fields stated in several places

    def stated_twice(self) -> dict[str, Places]:
        """Every field a config.json of this layout may state in several places: the backbone's, then its own."""
        return {**BACKBONE_STATED, **self.stated_in}

    def module_name(self, name: str) -> str:
        """A weight's name in pdraft's modules, from its name in this layout's file."""
        return _swap(name, self.weight_prefixes)

    def file_name(self, name: str) -> str:
        """A weight's name in this layout's file, from its name in pdraft's modules."""
        return _swap(name, tuple((mine, theirs) for theirs, mine in self.weight_prefixes))


def _swap(name: str, prefixes: tuple[tuple[str, str], ...]) -> str:
    for old, new in prefixes:
        if name.startswith(old):
            return new + name[len(old):]
    return name


@dataclass
class EnginePlan:
    """How one drafter maps onto one engine: the checkpoint layout, the engine method and its draft count."""

    fmt: str  # the export format: vllm | sglang | zlab-dflash
    layout: str  # the Layout.name written
    method: str  # vllm: dspark|dflash|eagle3 (dflash also serves DFlash2); sglang: DSPARK|DFLASH|EAGLE3; zlab-dflash: DFlashDraftModel
    num_speculative: int  # vLLM num_speculative_tokens / SGLang gamma (block size) / z-lab drafts per block
    notes: list[str] = field(default_factory=list)
    # (config.json, changed in place; the typed config) -> {weight name: shape} of all-zero weights to add:
    # what an engine needs beyond the layout (a rank-1 zero Markov head so DSpark's path loads a DFlash).
    complete: Callable[[dict, Any], dict[str, tuple[int, ...]]] | None = None
    # A format that is no engine's own (z-lab's folder): the (engine format, method) pairs that serve it.
    served_as: tuple[tuple[str, str], ...] = ()
    flags: tuple[str, ...] = ()  # further SGLang launch flags the method needs (EAGLE3's chain: steps, top-k 1)


def refuse_draft_vocab(cfg, fmt: str) -> None:
    """One line where an engine would serve a draft vocabulary over the target's head: SGLang's DSpark and DFlash
    models skip `lm_head.` and draft with the target's LM head (python/sglang/srt/models/dspark.py
    `_DSPARK_SKIPPED_WEIGHT_PREFIXES`, `compute_base_logits`), and z-lab's DFlashDraftModel has no head of its
    own; only vLLM's qwen3_dflash.py / qwen3_dspark.py read `draft_vocab_size` and `d2t`. The parallel
    families' plans ask it (EAGLE-3's engines read its d2t in both formats)."""
    if getattr(cfg, "reduced_vocab", False) and fmt != "vllm":
        raise PdraftError(f"cannot export to {fmt}: this {cfg.kind} drafter drafts over its own {cfg.draft_vocab_size}-"
                          f"token vocabulary, and {fmt}'s loader drafts with the target's LM head (no "
                          f"draft_vocab_size, no d2t)", hint="use --format vllm")


def require(data: dict, names, where: str) -> None:
    for name in names:
        if name not in data or data[name] is None:
            raise PdraftError(f"{where} misses field '{name}'")


def qwen3_json(cfg) -> dict:
    """The part of config.json every layout writes: the config's foreign extras, the Qwen3 backbone fields and
    the full-attention, untied, plain-RoPE boilerplate the engines build the drafter's layers from."""
    out = dict(cfg.extra)
    out.update({name: getattr(cfg, name) for name in QWEN3_FIELDS})
    out.update(model_type="qwen3", num_hidden_layers=cfg.num_hidden_layers, num_target_layers=cfg.num_target_layers,
               block_size=cfg.block_size, layer_types=["full_attention"] * cfg.num_hidden_layers,
               use_sliding_window=False, sliding_window=None, attention_dropout=0.0, tie_word_embeddings=False,
               rope_theta=cfg.rope_theta, rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta})
    out.pop("rope_scaling", None)
    if getattr(cfg, "reduced_vocab", False):
        out["draft_vocab_size"] = cfg.draft_vocab_size
    return out


def pdraft_object(cfg, names=PDRAFT_FIELDS) -> dict:
    """The `pdraft` object: `names` of the config (the pdraft-only settings), the format version and the kind."""
    out = {name: getattr(cfg, name) for name in names}
    out.update(format_version=FORMAT_VERSION, kind=cfg.kind, model_type=cfg.model_type)
    return out


def backbone_fields(data: dict, where: str, required=()) -> dict:
    """The backbone fields of a drafter's config.json (sizes, norm, RoPE, activation), as typed-config fields;
    `required` names further fields that must be present."""
    require(data, ("hidden_size", "vocab_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                   *required), where)
    if any(t != "full_attention" for t in (data.get("layer_types") or [])):
        raise PdraftError(f"{where}: sliding-window drafter layers are not supported ({data['layer_types']})")
    for name, places in BACKBONE_STATED.items():  # target_dims reads one of the places: they must agree
        stated(data, where, name, places)
    dims = target_dims({**data, "num_hidden_layers": data.get("num_target_layers", 1)}, where)
    fields = {k: v for k, v in dims.items() if k != "num_target_layers"}
    fields.update(num_hidden_layers=int(data["num_hidden_layers"]), hidden_act=str(data.get("hidden_act", "silu")))
    if data.get("draft_vocab_size") is not None:  # absent = the whole vocabulary (vLLM's default)
        fields["draft_vocab_size"] = int(data["draft_vocab_size"])
    return fields


def stated_once(where: str, name: str, stated: list[tuple[str, object]]):
    """The one value of `name` a config states in several places ([("in PLACE", value)]; None = not stated there,
    values already in pdraft's terms), refused in one line naming both places when two disagree: which one an
    engine reads differs, so picking one would run the drafter with another setting than its own."""
    given = [(place, value) for place, value in stated if value is not None]
    for place, value in given[1:]:
        if value != given[0][1]:
            raise PdraftError(f"{where}: {name} is {given[0][1]} {given[0][0]} but {value} {place}; a drafter has "
                              f"one {name}", hint="make the two agree, or remove one")
    return given[0][1] if given else None


def at(data: dict, path: str):
    """The value at a dotted path of a parsed config.json ("dflash_config.block_size"); None where it is absent."""
    node: Any = data
    for part in path.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def stated(data: dict, where: str, name: str, places: Places, convert: Callable[[str, Any], Any] = lambda path, v: v):
    """The one value of `name` over `places` (stated_once), each place's value passed through convert(path, value)
    into pdraft's terms (None: not stated there)."""
    return stated_once(where, name, [(label, convert(path, at(data, path))) for path, label in places])


def either(data: dict, name: str, where: str, required: bool = True):
    """A field z-lab's and DFlash2's config.json may hold at the top level or in `dflash_config` (IN_DFLASH_CONFIG):
    the one value (stated_once) or, if `required`, refused when neither has it."""
    value = stated(data, where, name, IN_DFLASH_CONFIG[name])
    if value is None and required:
        raise PdraftError(f"{where} misses field '{name}' (looked at the top level and in dflash_config)")
    return value


def pdraft_settings(data: dict) -> dict:
    """The pdraft-only settings a config.json's `pdraft` object holds."""
    pd = data.get("pdraft") or {}
    return {name: pd[name] for name in PDRAFT_FIELDS if name in pd}


def extras(data: dict, known=KNOWN) -> dict:
    """Foreign fields, kept verbatim so that a config round-trips."""
    return {k: v for k, v in data.items() if k not in known}


__all__ = ["FORMAT_VERSION", "SHARED_KEYS", "DRAFT_HEAD", "QWEN3_FIELDS", "PDRAFT_FIELDS", "KNOWN", "Layout", "EnginePlan",
           "Places", "BACKBONE_STATED", "IN_DFLASH_CONFIG", "at", "stated", "stated_once", "require", "refuse_draft_vocab",
           "qwen3_json", "pdraft_object", "backbone_fields", "either", "pdraft_settings", "extras"]
