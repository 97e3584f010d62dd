"""The DSpark family's entry in the registry (pdraft.models.families): its recipe keys (the sequential and
confidence heads), their config fields, the TV loss it learns by default, its confidence head, DeepSpec's
`Qwen3DSparkModel` layout and the engines' DSpark paths."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from pdraft.errors import PdraftError
from pdraft.models.dflash.config import quickstart_over_target_head, recipe_fields
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


DSPARK = FamilySpec(
    kind=DSparkConfig.kind, title="DSpark", summary="plus sequential and confidence heads", config=DSparkConfig,
    model="pdraft.models.dspark.model:DSparkDrafter", layouts=(DEEPSPEC,), default_layout=lambda cfg: "deepspec",
    plan=plan, drafter_fields=DRAFTER_FIELDS, config_fields=config_fields,
    loss_defaults={"alpha_tv": 1.0}, confidence_field="confidence_head", default=True,
    quickstart=quickstart_over_target_head,
    llamacpp=LlamaCpp("draft-dspark", unwritten=(
        "conversion/qwen.py:924 converts Qwen3DSparkModel/DSparkSpeculator, inferring sample_from_anchor from the "
        "config's shape (qwen.py:942: true unless transformer_layer_config or aux_hidden_state_layer_ids is "
        "present) and taking only markov_head_type 'vanilla' (qwen.py:961): pdraft's block convention, gated and "
        "RNN heads are not written and read back against it yet, and a wrong sample_from_anchor drafts every token "
        "one slot off; tried through pdraft's vLLM layout, the quickstart DSpark converted with the right fields but "
        "llama.cpp accepted 3 where pdraft accepted 5 in 1 of 14 rounds, not yet explained")),
)
