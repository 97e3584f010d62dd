"""The DSpark family's entry in the registry (pdraft.models.families): its recipe keys (the sequential and
confidence heads), their config fields, the TV loss it learns by default, its confidence head, DeepSpec's
`Qwen3DSparkModel` layout and the engines' DSpark paths."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from pdraft.errors import PdraftError
from pdraft.models.dflash.config import quickstart_over_target_head, recipe_fields
from pdraft.models.dflash.family import gguf_fields
from pdraft.models.dspark.config import MARKOV_RANK, DSparkConfig
from pdraft.models.dspark.format import DEEPSPEC, deepspec_plan
from pdraft.models.family import FamilySpec, LlamaCpp
from pdraft.models.formats import EnginePlan

DRAFTER_FIELDS = {
    "sequential_head": (Literal["markov", "gated", "rnn", "none"], Field("markov", description="DSpark sequential head: Markov transition bias W1[x]W2, DeepSpec's gated Markov, the RNN head (eq. 6), or none.")),
    "markov_rank": (int, MARKOV_RANK.recipe_field(256, "Rank r of the Markov head B(x,.) = W1[x] W2.")),
    "confidence_head": (bool, Field(True, description="DSpark confidence head predicting each position's survival.")),
    "confidence_uses_markov": (bool, Field(True, description="Feed the Markov embedding W1[x_{k-1}] to the confidence head (paper eq. 7).")),
}


def config_fields(section) -> dict:
    return dict(recipe_fields(section), sequential_head=section.sequential_head, markov_rank=section.markov_rank,
                confidence_head=section.confidence_head, confidence_with_markov=section.confidence_uses_markov)


def plan(cfg: DSparkConfig, fmt: str) -> EnginePlan:
    """vLLM `method: dspark` (vanilla Markov head only, num_speculative_tokens = block_size: the anchor is the
    first prediction slot, vllm/v1/worker/gpu/spec_decode/dspark/speculator.py) or SGLang `DSPARK`."""
    if fmt == "zlab-dflash":
        raise PdraftError("cannot export a DSpark drafter as z-lab DFlash: z-lab's DFlashDraftModel has no "
                          "sequential or confidence head, so its drafts would differ", hint="use --format vllm "
                          "or --format sglang")
    return deepspec_plan(cfg, fmt, head=cfg.sequential_head, what="DSpark without a sequential head")


def _llamacpp_config(data: dict, cfg: DSparkConfig) -> dict:
    """pdraft's vLLM layout, as llama.cpp's converter must read it (conversion/qwen.py:924, DSparkModel):
    - `sample_from_anchor` written, not inferred from the config's shape (qwen.py:942: true unless
      transformer_layer_config or aux_hidden_state_layer_ids is present): DeepSpec's block drafts from the anchor's
      slot on; read back as dflash.sample_from_anchor;
    - the Markov head: the vLLM layout writes only the vanilla head, which is all the converter takes
      (markov_head_type, qwen.py:961); the gated and RNN heads are refused before (pdraft.models.dspark.format);
    - a draft vocabulary is refused: the graph scatters the Markov bias through d2t (src/models/dflash.cpp,
      build_dspark_markov_head), which no served DSpark here has been held to yet."""
    if cfg.draft_vocab_size:
        raise PdraftError(f"this DSpark drafts over a {cfg.draft_vocab_size}-token draft vocabulary, which pdraft "
                          "has not yet held llama.cpp's DSpark graph to (its Markov bias is scattered through d2t: "
                          "src/models/dflash.cpp, build_dspark_markov_head)", hint="train it with "
                          "drafter.draft_vocab_size=null to serve it with llama.cpp, or export --format vllm")
    return {**data, "sample_from_anchor": cfg.block_convention == "deepspec"}


def _gguf_fields(cfg: DSparkConfig) -> list:
    """What llama.cpp's DSpark loop reads from the GGUF the converter wrote (conversion/qwen.py DSparkModel, then
    DFlashModel.set_gguf_parameters): DFlash's fields and the anchor slot."""
    return gguf_fields(cfg) + [
        ("dflash.sample_from_anchor", cfg.block_convention == "deepspec", "common/speculative.cpp drafts from "
         "block slot 0 when true, from slot 1 (a bonus anchor) when false: every draft one slot off otherwise")]


DSPARK = FamilySpec(
    kind=DSparkConfig.kind, title="DSpark", summary="plus sequential and confidence heads", config=DSparkConfig,
    model="pdraft.models.dspark.model:DSparkDrafter", layouts=(DEEPSPEC,), default_layout=lambda cfg: "deepspec",
    plan=plan, drafter_fields=DRAFTER_FIELDS, config_fields=config_fields,
    loss_defaults={"alpha_tv": 1.0}, confidence_field="confidence_head", default=True,
    quickstart=quickstart_over_target_head,
    llamacpp=LlamaCpp("draft-dspark", architecture="dflash", source="vllm", prepare=_llamacpp_config,
                      written=_gguf_fields),
)
