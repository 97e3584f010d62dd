"""The DFlash family's entry in the registry (pdraft.models.families): the backbone sampled position by
position, written in z-lab's `DFlashDraftModel` layout (z-lab block convention) or DeepSpec's
`Qwen3DSparkModel` (DeepSpec convention: DeepSpec's DFlash is a DSpark without heads)."""

from __future__ import annotations

from pdraft.errors import PdraftError
from pdraft.models.dflash.config import DFlashConfig, quickstart_over_target_head, recipe_fields
from pdraft.models.dflash.format import ZLAB
from pdraft.models.dspark.format import DEEPSPEC, deepspec_plan
from pdraft.models.family import FamilySpec, LlamaCpp
from pdraft.models.formats import EnginePlan, refuse_draft_vocab


def plan(cfg: DFlashConfig, fmt: str) -> EnginePlan:
    """z-lab convention: vLLM `method: dflash` / SGLang `DFLASH` / z-lab's folder, block_size - 1 drafts (vLLM's
    vllm/v1/spec_decode/dflash.py runs 1 + N query slots, N sampled). DeepSpec convention: vLLM's `dflash` path
    refuses `sample_from_anchor`, so it is served by the DSpark path with a zero Markov head."""
    refuse_draft_vocab(cfg, fmt)
    if fmt == "zlab-dflash":
        if cfg.block_convention != "zlab":
            raise PdraftError("cannot export a DeepSpec-convention DFlash as z-lab DFlash: DeepSpec slot j predicts "
                              "the token at anchor + j + 1, z-lab's slot j predicts anchor + j, so every draft would "
                              "shift by one position", hint="use --format vllm or --format sglang")
        # z-lab's DFlashDraftModel is what vLLM's `dflash` method and SGLang's DFLASH load
        return EnginePlan(fmt, "zlab", "DFlashDraftModel", cfg.block_size - 1,
                          served_as=(("vllm", "dflash"), ("sglang", "DFLASH")))
    if cfg.block_convention == "zlab":
        return EnginePlan(fmt, "zlab", "dflash" if fmt == "vllm" else "DFLASH", cfg.block_size - 1)
    return deepspec_plan(cfg, fmt, head="none", what="DeepSpec-convention DFlash")


def gguf_fields(cfg) -> list:
    """What llama.cpp's DFlash loop reads from the GGUF the converter wrote (conversion/qwen.py DFlashModel)."""
    return [("dflash.block_size", cfg.block_size, "common/speculative.cpp reads it, 16 when absent"),
            ("dflash.target_layers", [i + 1 for i in cfg.target_layer_ids], "llama_set_embeddings_layer_inp "
             "captures each layer's input: pdraft's id i is layer i + 1's input"),
            ("tokenizer.ggml.mask_token_id", cfg.mask_token_id, "llama_vocab_mask: the block's mask slots")]


DFLASH = FamilySpec(
    kind=DFlashConfig.kind, title="DFlash", summary="parallel block", config=DFlashConfig,
    model="pdraft.models.dflash.model:DFlashDrafter", layouts=(DEEPSPEC, ZLAB),
    default_layout=lambda cfg: "zlab" if cfg.block_convention == "zlab" else "deepspec", plan=plan,
    config_fields=recipe_fields, quickstart=quickstart_over_target_head,
    llamacpp=LlamaCpp("draft-dflash", architecture="dflash", written=gguf_fields),
)
