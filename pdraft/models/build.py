"""Building drafters: sizes derived from the target's config (`target_dims`), a fresh drafter of any kind
(`build_drafter`: dflash, dspark, dflash2), the model class for a config (`make_drafter`), and `draft_step`, one draft proposal on given
context features in a single call, for notebooks and quick checks."""

from __future__ import annotations

import torch
from torch import nn

from pdraft.errors import PdraftError
from pdraft.models.api import Proposal, SamplingParams
from pdraft.models.config import DFlashConfig, DSparkConfig, config_class
from pdraft.models.dflash2.config import DFlash2Config
from pdraft.models.dflash2.model import DFlash2Drafter, reset_dflash2_extras
from pdraft.models.drafter import DFlashDrafter
from pdraft.models.dspark import DSparkDrafter
from pdraft.layer_ids import default_layer_ids


def _get(cfg, name, default=None):
    return cfg.get(name, default) if isinstance(cfg, dict) else getattr(cfg, name, default)


def rope_theta_of(cfg) -> float:
    """RoPE base from a transformers config (v5 `rope_parameters` or v4 `rope_theta`/`rope_scaling`). Only
    plain RoPE is supported: a scaled variant would silently change every position's rotation."""
    params = _get(cfg, "rope_parameters") or {}
    scaling = _get(cfg, "rope_scaling") or {}
    kind = params.get("rope_type") or params.get("type") or scaling.get("rope_type") or scaling.get("type")
    if kind not in (None, "default"):
        raise PdraftError(f"RoPE type {kind!r} is not supported by pdraft drafters (only plain RoPE)")
    return float(params.get("rope_theta", _get(cfg, "rope_theta", 10000.0)))


def target_dims(target_config) -> dict:
    """The fields a drafter copies from its target (a transformers config or its dict)."""
    if not isinstance(target_config, dict) and hasattr(target_config, "get_text_config"):
        target_config = target_config.get_text_config()
    elif isinstance(target_config, dict) and "text_config" in target_config:
        target_config = target_config["text_config"]
    need = ("hidden_size", "vocab_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
    missing = [n for n in need if _get(target_config, n) is None]
    if missing:
        raise PdraftError(f"target config misses field(s): {', '.join(missing)}")
    heads = int(_get(target_config, "num_attention_heads"))
    hidden = int(_get(target_config, "hidden_size"))
    return dict(
        hidden_size=hidden,
        vocab_size=int(_get(target_config, "vocab_size")),
        num_target_layers=int(_get(target_config, "num_hidden_layers")),
        num_attention_heads=heads,
        num_key_value_heads=int(_get(target_config, "num_key_value_heads") or heads),
        head_dim=int(_get(target_config, "head_dim") or hidden // heads),
        intermediate_size=int(_get(target_config, "intermediate_size")),
        rms_norm_eps=float(_get(target_config, "rms_norm_eps", 1e-6)),
        rope_theta=rope_theta_of(target_config),
        attention_bias=bool(_get(target_config, "attention_bias", False)),
        max_position_embeddings=int(_get(target_config, "max_position_embeddings", 40960) or 40960),
    )


def init_weights(module: nn.Module, std: float = 0.02) -> None:
    """Normal(0, std) weights, zero biases, unit norms: the transformers initialisation DeepSpec uses."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, 0.0, std)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)


def make_drafter(config: DFlashConfig) -> DFlashDrafter:
    """The (uninitialised) model for a config."""
    if isinstance(config, DFlash2Config):
        return DFlash2Drafter(config)
    return DSparkDrafter(config) if isinstance(config, DSparkConfig) else DFlashDrafter(config)


def build_drafter(kind: str, target_config, *, seed: int | None = None, **overrides) -> DFlashDrafter:
    """A freshly initialised drafter of `kind` ("dflash" | "dspark" | "dflash2") sized for `target_config`. Any config
    field may be overridden; `mask_token_id` has no default (pick an id the target never emits, e.g. an unused
    special token) and must be given. Target layer ids default to `default_layer_ids(target layers, depth)`:
    one id per drafter layer, as DeepSpec and z-lab choose them."""
    cls = config_class(kind)
    if "mask_token_id" not in overrides:
        raise PdraftError("build_drafter needs mask_token_id (a token id the target never generates)")
    fields = target_dims(target_config)
    fields.update(overrides)
    depth = int(fields.get("num_hidden_layers", 5))
    fields.setdefault("target_layer_ids", default_layer_ids(fields["num_target_layers"], depth))
    drafter = make_drafter(cls(**fields))
    if seed is not None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            _init(drafter)
    else:
        _init(drafter)
    return drafter


def _init(drafter: DFlashDrafter) -> None:
    init_weights(drafter)
    if isinstance(drafter, DFlash2Drafter):  # identity convs, unary-only selector (SpecForge's starting point)
        reset_dflash2_extras(drafter)


def build_dflash2(target_config, *, seed: int | None = None, **overrides) -> DFlash2Drafter:
    """A fresh DFlash2 drafter (build_drafter("dflash2", ...)); `mask_token_id` must be given."""
    return build_drafter("dflash2", target_config, seed=seed, **overrides)


def draft_step(drafter: DFlashDrafter, target_hidden: torch.Tensor, anchor_ids, gamma: int | None = None,
               sampling: SamplingParams | None = None, uniforms: torch.Tensor | None = None) -> Proposal:
    """One proposal from scratch: target_hidden [batch, t, m * hidden] (or [t, m * hidden]) are the captured
    target layers of the t committed tokens before the anchor, at positions 0..t-1; anchor_ids [batch] (or an
    int) is the token at position t. gamma defaults to the drafter's maximum; uniforms [batch, gamma] drive the
    draws when sampling (None: fresh ones)."""
    if target_hidden.dim() == 2:
        target_hidden = target_hidden[None]
    b, t = target_hidden.shape[:2]
    dev = drafter.fc.weight.device
    anchors = torch.as_tensor(anchor_ids, dtype=torch.long, device=dev).reshape(-1).expand(b)
    state = drafter.new_state(b)
    drafter.extend_context(state, target_hidden.to(dev), torch.arange(t, device=dev).expand(b, t))
    return drafter.propose(state, anchors, torch.full((b,), t, dtype=torch.long, device=dev),
                           gamma or drafter.max_gamma(), sampling, uniforms)


def mask_token_for(section, tokenizer) -> int:
    """The recipe's mask token, else the tokenizer's own mask token; never a guess."""
    if section.mask_token_id is not None:
        return int(section.mask_token_id)
    mask = getattr(tokenizer, "mask_token_id", None)
    if mask is None:
        raise PdraftError("the target's tokenizer defines no mask token: set drafter.mask_token_id to a token id "
                          "the target never generates (Qwen3: 151669)")
    return int(mask)


def build_from_recipe(section, target, seed: int | None = None) -> DFlashDrafter:
    """A fresh drafter for a loaded `Target` from a recipe `drafter` section. Target layer ids come from the
    target (recipe `target.layer_ids` or spread evenly), so drafter and capture always agree."""
    overrides = dict(
        num_hidden_layers=section.num_layers, block_size=section.block_size,
        block_convention=section.block_convention, denoise_steps=section.denoise_steps,
        mask_token_id=mask_token_for(section, target.tokenizer), target_layer_ids=list(target.layer_ids),
        num_experts=section.num_experts, num_experts_per_tok=section.experts_top_k,
    )
    for name in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads"):
        if getattr(section, name) is not None:
            overrides[name] = getattr(section, name)
    if section.moe_intermediate_size is not None:
        overrides["moe_intermediate_size"] = section.moe_intermediate_size
    if section.kind == "dflash2":  # the engines serve the z-lab block only (recipe.py forces it too)
        overrides.update(block_convention="zlab", conv_kernel_size=section.conv_kernel_size,
                         conv_group_size=section.conv_group_size, selector_rank=section.selector_rank,
                         selector_top_k=section.selector_top_k)
    if section.kind == "dspark":
        overrides.update(sequential_head=section.sequential_head, markov_rank=section.markov_rank,
                         confidence_head=section.confidence_head,
                         confidence_with_markov=section.confidence_uses_markov)
    return build_drafter(section.kind, target.config, seed=seed, **overrides)
