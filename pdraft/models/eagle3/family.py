"""The EAGLE-3 family's entry in the registry (pdraft.models.families): the autoregressive baseline (one pass per
draft), its recipe keys (the draft vocabulary, the training-time-test steps), the loss it learns by default
(EAGLE-3's: the KL divergence from the target's distribution, each step weighted 0.8^(k-1)), the
`LlamaForCausalLMEagle3` layout and the engines' `eagle3` / `EAGLE3` methods."""

from __future__ import annotations

import math


from pdraft.errors import PdraftError
from pdraft.models.eagle3.config import LIMITS, STEP_DECAY, TTT_STEPS, Eagle3Config
from pdraft.models.eagle3.format import DEEPSPEC_EAGLE3_LAYOUT, EAGLE3_LAYOUT
from pdraft.models.family import MAX_GAMMA, FamilySpec, LlamaCpp
from pdraft.models.formats import EnginePlan

DRAFTER_FIELDS = {
    "ttt_steps": (int, LIMITS["ttt_steps"].recipe_field(TTT_STEPS, f"EAGLE-3: training-time-test steps, each fed the drafter's own previous output (EAGLE-3 and SpecForge: {TTT_STEPS}); decoding drafts any gamma up to {MAX_GAMMA}.")),
}
# Backbone keys of the recipe that describe another network than EAGLE-3's: set to anything but what EAGLE-3 is,
# they are refused, never ignored. block_size is not one of them: an autoregressive drafter has no block.
FIXED = {"num_layers": 1, "denoise_steps": 1, "num_experts": 0}
SHARED = ("hidden_size",)  # the embedding is the target's, so the width is the target's


def recipe_check(d) -> None:
    """A backbone key the recipe sets to another value than EAGLE-3's is refused; one left at its default takes
    EAGLE-3's value, so the resolved recipe says what is built."""
    for key, value in FIXED.items():
        if key in d.model_fields_set and getattr(d, key) != value:
            raise ValueError(f"drafter.{key}: EAGLE-3 has {value} here (one decoder layer, one pass per draft, a "
                             f"dense MLP), got {getattr(d, key)}")
        if getattr(d, key) != value:
            setattr(d, key, value)
    for key in SHARED:
        if getattr(d, key) is not None:
            raise ValueError(f"drafter.{key}: EAGLE-3 shares the target's token embedding, so its width is the "
                             f"target's; drop drafter.{key}")


def config_fields(section) -> dict:
    out = dict(num_hidden_layers=section.num_layers, draft_vocab_size=section.draft_vocab_size,
               ttt_steps=section.ttt_steps)
    for name in ("intermediate_size", "num_attention_heads", "num_key_value_heads"):
        if getattr(section, name) is not None:
            out[name] = getattr(section, name)
    return out


def _vllm_layer_ids(data: dict, cfg: Eagle3Config) -> dict:
    """vLLM numbers eagle_aux_hidden_state_layer_ids one above pdraft (format.py's docstring): rewrite them."""
    data["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [i + 1 for i in cfg.target_layer_ids]
    return {}


def _llamacpp_layer_ids(data: dict, cfg: Eagle3Config) -> dict:
    """llama.cpp's converter reads eagle_aux_hidden_state_layer_ids only at the config's top level and falls back to
    [2, n/2, n-3] without it (conversion/llama.py:77-81): the vLLM layout nests them in eagle_config, so converted
    as is a quickstart EAGLE-3 on layers [0, 1, 2] got target_layers [2, 2, 1]. Written at the top level too, in
    the same numbering (llama.cpp captures each listed layer's input, as vLLM does)."""
    return {**data, "eagle_aux_hidden_state_layer_ids": [i + 1 for i in cfg.target_layer_ids]}


def _gguf_fields(cfg: Eagle3Config) -> list:
    """What llama.cpp's EAGLE-3 loop reads from the GGUF the converter wrote (conversion/llama.py)."""
    return [("eagle3.target_layers", [i + 1 for i in cfg.target_layer_ids], "llama_set_embeddings_layer_inp "
             "captures each layer's input: pdraft's id i is layer i + 1's input; the converter's default is "
             "[2, n/2, n-3] (conversion/llama.py:77-81)")]


def plan(cfg: Eagle3Config, fmt: str) -> EnginePlan:
    """vLLM `method: eagle3` (vllm/config/speculative.py; Eagle3LlamaForCausalLM from llama_eagle3.py) or SGLang
    `EAGLE3` as a chain (`--speculative-eagle-topk 1`, python/sglang/srt/server_args.py), both with
    num_speculative_tokens = ttt_steps, the chain length training covered (any value up to 32 serves: the bench
    says which gamma pays)."""
    if fmt == "zlab-dflash":
        raise PdraftError("cannot export an EAGLE-3 drafter as z-lab DFlash: it drafts one token per pass from its "
                          "own KV cache, DFlashDraftModel a parallel block", hint="use --format vllm or --format sglang")
    n = cfg.ttt_steps
    if fmt == "vllm":
        p = EnginePlan(fmt, "eagle3", "eagle3", n, complete=_vllm_layer_ids)
        p.notes.append(f"eagle_config.eagle_aux_hidden_state_layer_ids written in vLLM's numbering "
                       f"{[i + 1 for i in cfg.target_layer_ids]} (it captures the input of layer j; pdraft's ids "
                       f"{cfg.target_layer_ids} are layer outputs)")
        return p
    flags = ("--speculative-num-steps", str(n), "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens",
             str(n + 1))
    return EnginePlan(fmt, "eagle3", "EAGLE3", n, flags=flags)


EAGLE3 = FamilySpec(
    kind=Eagle3Config.kind, title="EAGLE-3", config=Eagle3Config, drafting="autoregressive",
    summary="autoregressive: one pass per draft over its own KV cache, fused low/mid/high target layers",
    model="pdraft.models.eagle3.model:Eagle3Drafter", layouts=(EAGLE3_LAYOUT, DEEPSPEC_EAGLE3_LAYOUT), default_layout=lambda cfg: "eagle3",
    plan=plan, drafter_fields=DRAFTER_FIELDS, recipe_check=recipe_check, config_fields=config_fields,
    loss_defaults={"alpha_kl": 1.0, "loss_decay": 1.0 / math.log(1.0 / STEP_DECAY)},
    llamacpp=LlamaCpp("draft-eagle3", architecture="eagle3", source="vllm", prepare=_llamacpp_layer_ids,
                      written=_gguf_fields),
)
