"""DeepSpec's checkpoint layout, `Qwen3DSparkModel` (FORMATS.md beside pdraft/models/formats.py cites every
field): pdraft's DSpark drafters and DeepSpec-convention DFlash drafters, since DeepSpec's DFlash is this
architecture with the Markov and confidence heads off. The target's config fields are kept, `num_hidden_layers`
is the drafter depth, and DeepSpec's own fields (num_target_layers, block_size, mask_token_id, target_layer_ids,
num_anchors, markov_rank, markov_head_type, enable_confidence_head, confidence_head_with_markov) are added;
pdraft-only settings go into the `pdraft` object. Also the engine plans of this layout: vLLM's and SGLang's
DSpark paths (`deepspec_plan`), which the DFlash family uses for its DeepSpec-convention drafters too."""

from __future__ import annotations

from pdraft.errors import PdraftError
from pdraft.models.dflash.config import DFlashConfig
from pdraft.models.dspark.config import MARKOV_RANK, DSparkConfig
from pdraft.models.formats import (DRAFT_HEAD, IN_DFLASH_CONFIG, KNOWN, EnginePlan, Layout, backbone_fields, either,
                                   extras, pdraft_object, pdraft_settings, qwen3_json, refuse_draft_vocab, require,
                                   stated)

# deepspec/modeling/dspark/qwen3/modeling.py (Qwen3DSparkModel), vllm/model_executor/models/qwen3_dspark.py,
# python/sglang/srt/models/dspark.py.
DEEPSPEC_ARCH = "Qwen3DSparkModel"
# markov_head_type names: deepspec/modeling/dspark/markov_head.py (vanilla | gated | rnn); vLLM reads vanilla only.
HEAD_TO_DEEPSPEC = {"markov": "vanilla", "gated": "gated", "rnn": "rnn"}
HEAD_FROM_DEEPSPEC = {v: k for k, v in HEAD_TO_DEEPSPEC.items()}
_DEEPSPEC_KEYS = {"target_layer_ids", "markov_rank", "markov_head_type", "enable_confidence_head",
                  "confidence_head_with_markov"}
NUM_ANCHORS = 512  # a DeepSpec training setting its loader requires; unused here
# DeepSpec's 0 at the top level means "no head"; pdraft then keeps the rank in its object (to_json), and a rank
# stated in both places must agree.
STATED = {**IN_DFLASH_CONFIG,
          "markov_rank": (("markov_rank", "at the top level"), ("pdraft.markov_rank", "in pdraft"))}


def _rank_in_pdraft_terms(path: str, value):
    return (int(value) or None) if path == "markov_rank" and value is not None else value


def to_json(cfg: DFlashConfig) -> dict:
    out = qwen3_json(cfg)
    out["architectures"] = [DEEPSPEC_ARCH]
    out["mask_token_id"] = cfg.mask_token_id
    out["target_layer_ids"] = list(cfg.target_layer_ids)
    out.setdefault("num_anchors", NUM_ANCHORS)
    seq = getattr(cfg, "sequential_head", "none")  # a DFlash drafter: DeepSpec's DFlash, no head
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
    pd = pdraft_object(cfg)
    if seq == "none" and hasattr(cfg, "markov_rank"):
        pd["markov_rank"] = cfg.markov_rank  # DeepSpec writes 0 for "no head"; keep ours for an exact round trip
    out["pdraft"] = pd
    return out


def kind_of(data: dict) -> str:
    """dspark when config.json says so (pdraft's object) or has a head, else DeepSpec's DFlash."""
    pd = data.get("pdraft") or {}
    heads = int(data.get("markov_rank") or 0) > 0 or bool(data.get("enable_confidence_head"))
    return pd.get("kind") or ("dspark" if heads else "dflash")


def from_json(data: dict, where: str = "config.json") -> DFlashConfig:
    fields = backbone_fields(data, where)
    require(data, ("num_target_layers", "block_size", "target_layer_ids", "mask_token_id", "markov_rank",
                   "enable_confidence_head"), where)
    rank, conf = int(data["markov_rank"]), bool(data["enable_confidence_head"])
    if rank > 0:
        require(data, ("markov_head_type",), where)
    if conf:
        require(data, ("confidence_head_with_markov",), where)
    stated_rank = stated(data, where, "markov_rank", STATED["markov_rank"], _rank_in_pdraft_terms)
    kind = kind_of(data)
    fields["block_convention"] = "deepspec"
    if kind == "dspark":
        head = str(data.get("markov_head_type", "")).lower() if rank > 0 else "none"
        if head not in HEAD_FROM_DEEPSPEC and head != "none":
            raise PdraftError(f"{where}: unknown markov_head_type {data['markov_head_type']!r}")
        fields.update(sequential_head=HEAD_FROM_DEEPSPEC.get(head, "none"),
                      markov_rank=int(stated_rank or 256),
                      confidence_head=conf,
                      confidence_with_markov=bool(data.get("confidence_head_with_markov", False)) and conf)
    for name in IN_DFLASH_CONFIG:  # a dflash_config copy must agree
        either(data, name, where)
    fields.update(num_target_layers=int(data["num_target_layers"]), block_size=int(data["block_size"]),
                  target_layer_ids=data["target_layer_ids"], mask_token_id=int(data["mask_token_id"]))
    fields.update(pdraft_settings(data))
    fields["extra"] = extras(data, KNOWN | _DEEPSPEC_KEYS)
    if fields["extra"].get("num_anchors") == NUM_ANCHORS:  # the default we write; keep configs round-tripping
        del fields["extra"]["num_anchors"]
    return (DSparkConfig if kind == "dspark" else DFlashConfig)(**fields)


def _refuses(archs: list) -> str | None:
    if any("DSpark" in a for a in archs):
        return f"drafter architecture {archs} is not supported (only Qwen3-style drafters)"
    return None


DEEPSPEC = Layout(
    weight_prefixes=DRAFT_HEAD,
    name="deepspec", architecture=DEEPSPEC_ARCH, origin="deepspec", to_json=to_json, from_json=from_json,
    kind_of=kind_of, refuses=_refuses, stated_in=STATED,
    schema={"": {"markov_rank": MARKOV_RANK.schema_entry(), "markov_head_type": ("str", None, None),
                 "enable_confidence_head": ("bool", None, None), "confidence_head_with_markov": ("bool", None, None)},
            "pdraft.": {"markov_rank": MARKOV_RANK.schema_entry()}},
)


# ---- what the serving engines need beyond the checkpoint (pdraft/hub/export.py carries the plan out) --------
def _sample_from_anchor(data: dict, cfg) -> dict:
    data["sample_from_anchor"] = True  # vLLM's DSpark speculator reads it (default True); stated, not implied
    return {}


def _zero_markov(data: dict, cfg) -> dict:
    """A rank-1 Markov head whose weights are all zero (transition bias exactly 0, drafts unchanged), because
    the engines' DSpark paths require markov_rank > 0 (vllm/model_executor/models/qwen3_dspark.py,
    python/sglang/srt/models/dspark.py). Both read markov_rank/markov_head_type from the top level; pdraft then
    reads the folder back as a DSpark with a zero Markov head, whose drafts equal the original's, so the pdraft
    object, which would contradict it, is dropped."""
    data.pop("pdraft", None)
    data.update(markov_rank=1, markov_head_type="vanilla")
    if not cfg.has_confidence:
        data["enable_confidence_head"] = False
    _sample_from_anchor(data, cfg)
    # DeepSpec's names (deepspec/modeling/dspark/markov_head.py), which vLLM's qwen3_dspark.py loads as they are.
    # W1 embeds the previous token (target ids), W2 writes the draft vocabulary (qwen3_dspark.py DSparkMarkovHead).
    return {"markov_head.markov_w1.weight": (cfg.vocab_size, 1),
            "markov_head.markov_w2.weight": (cfg.draft_vocab_size or cfg.vocab_size, 1)}


def deepspec_plan(cfg, fmt: str, head: str, what: str) -> EnginePlan:
    """vLLM `method: dspark` / SGLang `DSPARK` for a drafter written in this layout; `head` is its sequential
    head ("none" for a DFlash), `what` names such a drafter in the note about the zero Markov head."""
    refuse_draft_vocab(cfg, fmt)
    if fmt == "vllm" and head in ("gated", "rnn"):
        raise PdraftError(f"cannot export to vLLM: its Qwen3DSparkModel implements only the vanilla Markov head, "
                          f"and this drafter has a {head!r} head", hint="use --format sglang")
    plan = EnginePlan(fmt, "deepspec", "dspark" if fmt == "vllm" else "DSPARK", cfg.block_size,
                      complete=_sample_from_anchor)
    if head == "none":
        plan.complete = _zero_markov
        plan.notes.append(f"{what}: written as Qwen3DSparkModel with a rank-1 all-zero Markov head (bias exactly 0, "
                          f"drafts unchanged) because the engine's DSpark path requires markov_rank > 0")
    return plan


__all__ = ["DEEPSPEC", "DEEPSPEC_ARCH", "HEAD_TO_DEEPSPEC", "HEAD_FROM_DEEPSPEC", "deepspec_plan"]
