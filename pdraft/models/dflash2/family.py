"""The DFlash2 family's entry in the registry (pdraft.models.families): its recipe keys (convolutions,
candidate selector, the selector's loss weight), the cross-check that keeps a recipe's block servable (the
rule itself is DFlash2Config's, `served_block_problem`), the `DFlash2DraftModel` layout and the engines' `dflash` / `DFLASH` methods, and the quickstart's extra block slot."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from pdraft.errors import PdraftError
from pdraft.models.dflash.config import quickstart_over_target_head, recipe_fields
from pdraft.models.dflash.family import gguf_fields
from pdraft.models.dflash2.config import (BLOCK_CONVENTION, LIMITS, SELECTOR_TARGETS, DFlash2Config,
                                          served_block_problem)
from pdraft.models.dflash2.format import DFLASH2_LAYOUT
from pdraft.models.family import MAX_GAMMA, FamilySpec, LlamaCpp
from pdraft.models.formats import EnginePlan

DRAFTER_FIELDS = {
    "conv_kernel_size": (int, LIMITS["conv_kernel_size"].recipe_field(2, "DFlash2: taps of each grouped dynamic convolution (2 in the published drafters); at most block_size.")),
    "conv_group_size": (int, LIMITS["conv_group_size"].recipe_field(16, "DFlash2: channels sharing one dynamic coefficient per tap; must divide the drafter's hidden size.")),
    "selector_rank": (int, LIMITS["selector_rank"].recipe_field(256, "DFlash2: rank r of the candidate selector's predecessor/successor codebooks and hidden projection.")),
    "selector_top_k": (int, LIMITS["selector_top_k"].recipe_field(16, "DFlash2: unary candidates per draft position the selector walks (K).")),
}
TRAIN_FIELDS = {
    "alpha_selector": (float, Field(1.0, description="DFlash2: weight of the selector's K-way cross-entropy (teacher-forced on the gold predecessor); ignored by other kinds.", ge=0.0, le=1e6)),
    "selector_target": (Literal[SELECTOR_TARGETS], Field("token", description="DFlash2: the selector's K-way label: token (the gold token, one-hot) or distribution (the target's own distribution over the K loss candidates, from its last hidden state and LM head, softmax at T=1: trains the shape that sampled decoding draws from); ignored by other kinds.")),
}


def recipe_check(d) -> None:
    """The engines serve the z-lab block only: the recipe's convention is forced to it (so the resolved copy says
    what was built) unless the recipe asks for another, which is refused; then the block must be servable."""
    if "block_convention" in d.model_fields_set and d.block_convention != BLOCK_CONVENTION:
        raise ValueError("drafter.kind dflash2 uses the zlab block convention (anchor + masks); drop "
                         "drafter.block_convention or set it to zlab")
    if d.block_convention != BLOCK_CONVENTION:
        d.block_convention = BLOCK_CONVENTION
    problem = served_block_problem(d.block_convention, d.block_size, d.denoise_steps, d.num_experts,
                                   d.conv_kernel_size)
    if problem:
        raise ValueError(f"drafter.{problem[0]}: {problem[1]}")


def config_fields(section) -> dict:
    return dict(recipe_fields(section), block_convention=BLOCK_CONVENTION, conv_kernel_size=section.conv_kernel_size,
                conv_group_size=section.conv_group_size, selector_rank=section.selector_rank,
                selector_top_k=section.selector_top_k)


def quickstart(section) -> list[str]:
    """DFlash2's block holds the anchor, so where the recipe's block is DeepSpec's (block_size drafts) it gets
    one more slot and drafts up to the same gamma as the other families; like DFlash and DSpark it runs over the
    target's head there (no engine serves a DFlash2 draft vocabulary: `plan`)."""
    out = []
    if section.block_convention == "deepspec" and section.block_size < MAX_GAMMA:
        out.append(f"drafter.block_size={section.block_size + 1}")
    return out + quickstart_over_target_head(section)


def plan(cfg: DFlash2Config, fmt: str) -> EnginePlan:
    """vLLM has no `dflash2` method name: its `dflash` speculator factory picks DFlash2Speculator
    (vllm/v1/worker/gpu/spec_decode/dflash2/speculator.py) for this architecture, and the conv's block is
    1 + num_speculative_tokens (qwen3_dflash2.py, DFlash2Qwen3DecoderLayer), so num_speculative_tokens =
    block_size - 1 reproduces training. SGLang: `DFLASH` with the same folder."""
    if fmt == "zlab-dflash":
        raise PdraftError("cannot export a DFlash2 drafter as z-lab DFlash: DFlashDraftModel has no dynamic "
                          "convolutions or candidate selector, so its drafts would differ",
                          hint="use --format vllm or --format sglang (both load DFlash2DraftModel)")
    if cfg.reduced_vocab:
        raise PdraftError(f"cannot export to {fmt}: this DFlash2 drafter drafts over its own {cfg.draft_vocab_size}-"
                          f"token vocabulary, and no engine maps DFlash2 candidates through d2t (vLLM's "
                          f"qwen3_dflash2.py compute_candidates takes the top-K of lm_head's logits as target ids)",
                          hint="train it with drafter.draft_vocab_size=null to serve it in an engine")
    out = EnginePlan(fmt, "dflash2", "dflash" if fmt == "vllm" else "DFLASH", cfg.block_size - 1)
    if fmt == "sglang":
        out.notes.append("SGLang's DFlash2 loader was not available to check against: the DFLASH command follows "
                         "SpecForge's statement that its DFlash2DraftModel names are SGLang's")
    return out


def _llamacpp_config(data: dict, cfg: DFlash2Config) -> dict:
    """pdraft's vLLM layout (DFlash2DraftModel) as llama.cpp's converter reads it: conversion/qwen.py:721 converts
    it with the DFlash converter, which writes the convolution and selector fields from `dflash_config` (qwen.py:770-
    774; the layout holds them there), and llama.cpp serves it as DFlash2 when dflash.selector_top_k > 0. What its
    loader refuses at load time is refused here in one line: the selector's lattice is kept in the hidden state's
    floats, K candidates and K x K transition scores a position (src/models/dflash.cpp:149; its other rule, line
    146, the convolution's groups dividing the hidden size, DFlash2Config holds already)."""
    k, hidden = cfg.selector_top_k, cfg.hidden_size
    if k * (k + 1) > hidden:
        raise PdraftError(f"llama.cpp keeps DFlash2's selector lattice in the drafter's hidden state: selector_top_k "
                          f"{k} needs {k * (k + 1)} floats a position, the hidden size is {hidden} "
                          "(src/models/dflash.cpp:149 refuses it at load)", hint=f"train it with "
                          f"drafter.selector_top_k <= {int(((4 * hidden + 1) ** 0.5 - 1) // 2)} to serve it with "
                          "llama.cpp, or export --format vllm")
    return data


def _gguf_fields(cfg: DFlash2Config) -> list:
    """What llama.cpp's DFlash2 loop reads from the GGUF the converter wrote (conversion/qwen.py DFlashModel):
    DFlash's fields and the selector's."""
    served = "llama.cpp serves DFlash2 only where dflash.selector_top_k > 0, plain DFlash otherwise"
    return gguf_fields(cfg) + [
        ("dflash.conv_kernel_size", cfg.conv_kernel_size, served),
        ("dflash.conv_group_size", cfg.conv_group_size, served),
        ("dflash.selector_rank", cfg.selector_rank, served),
        ("dflash.selector_top_k", cfg.selector_top_k, served)]


DFLASH2 = FamilySpec(
    kind=DFlash2Config.kind, title="DFlash2", config=DFlash2Config,
    summary="z-lab DFlash plus dynamic convolutions and a candidate selector; always the zlab block convention",
    model="pdraft.models.dflash2.model:DFlash2Drafter", layouts=(DFLASH2_LAYOUT,), default_layout=lambda cfg: "dflash2",
    plan=plan, drafter_fields=DRAFTER_FIELDS, train_fields=TRAIN_FIELDS, recipe_check=recipe_check,
    config_fields=config_fields, quickstart=quickstart,
    llamacpp=LlamaCpp("draft-dflash", architecture="dflash", source="vllm", prepare=_llamacpp_config,
                      written=_gguf_fields),
)
