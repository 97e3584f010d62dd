"""Building drafters: a fresh drafter of any registered family (`build_drafter`, sized for the target by
pdraft.models.dims.target_dims; `build_from_recipe` from a recipe's drafter section), the model for a config
(`make_drafter`: its family's model class), and `draft_step`, one draft proposal on given context features in
a single call, for notebooks and quick checks."""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from pdraft.errors import PdraftError
from pdraft.layer_ids import default_layer_ids
from pdraft.models.api import Drafter, Proposal, SamplingParams
from pdraft.models.dims import target_dims
from pdraft.models.families import FAMILIES, config_class


def init_weights(module: nn.Module, std: float = 0.02) -> None:
    """Normal(0, std) weights, zero biases, unit norms: the transformers initialisation DeepSpec uses."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, 0.0, std)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)


def make_drafter(config) -> Drafter:
    """The (uninitialised) model for a config: its family's model class."""
    return FAMILIES.of(config).model_class()(config)


def build_drafter(kind: str, target_config, *, seed: int | None = None, **overrides) -> Drafter:
    """A freshly initialised drafter of family `kind` (pdraft.models.families: dflash, dspark, dflash2) sized
    for `target_config`. Any config field may be overridden; `mask_token_id` has no default (pick an id the
    target never emits, e.g. an unused special token) and must be given. Target layer ids default to
    `default_layer_ids(target layers, n)`: one id per drafter layer, as DeepSpec and z-lab choose them, or the
    number a family's config names (`feature_layers`: EAGLE-3's low, mid and high)."""
    cls = config_class(kind)
    if "mask_token_id" in {f.name for f in dataclasses.fields(cls)} and "mask_token_id" not in overrides:
        raise PdraftError("build_drafter needs mask_token_id (a token id the target never generates)")
    fields = target_dims(target_config)
    fields.update(overrides)
    if fields.get("target_layer_ids") is None:  # only then: a recipe's ids are never second-guessed (nor refused)
        ids = getattr(cls, "feature_layers", None) or int(fields.get("num_hidden_layers", 5))  # EAGLE-3: its three
        fields["target_layer_ids"] = default_layer_ids(fields["num_target_layers"], ids)
    drafter = make_drafter(cls(**fields))
    if seed is not None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            _init(drafter)
    else:
        _init(drafter)
    return drafter


def _init(drafter: Drafter) -> None:
    init_weights(drafter)
    drafter.init_extras()  # what the family starts elsewhere than N(0, 0.02) (DFlash2: identity convs)


def draft_step(drafter: Drafter, target_hidden: torch.Tensor, anchor_ids, gamma: int | None = None,
               sampling: SamplingParams | None = None, uniforms: torch.Tensor | None = None,
               context_ids: torch.Tensor | None = None) -> Proposal:
    """One proposal from scratch: target_hidden [batch, t, m * hidden] (or [t, m * hidden]) are the captured
    target layers of the t committed tokens before the anchor, at positions 0..t-1, and context_ids [batch, t]
    (or [t]) those tokens (EAGLE-3 needs them; the parallel families do not); anchor_ids [batch] (or an int) is
    the token at position t. gamma defaults to the drafter's maximum; uniforms [batch, gamma] drive the draws
    when sampling (None: fresh ones)."""
    if target_hidden.dim() == 2:
        target_hidden = target_hidden[None]
    b, t = target_hidden.shape[:2]
    dev = next(drafter.parameters()).device
    anchors = torch.as_tensor(anchor_ids, dtype=torch.long, device=dev).reshape(-1).expand(b)
    if context_ids is not None:
        context_ids = torch.as_tensor(context_ids, dtype=torch.long, device=dev).reshape(-1, t).expand(b, t)
    state = drafter.new_state(b)
    drafter.extend_context(state, target_hidden.to(dev), torch.arange(t, device=dev).expand(b, t),
                           token_ids=context_ids)
    return drafter.propose(state, anchors, torch.full((b,), t, dtype=torch.long, device=dev),
                           gamma or drafter.max_gamma(), sampling, uniforms)


def start_from_target(drafter: Drafter, target_model: nn.Module) -> list[str]:
    """Start a fresh drafter's decoder layers from the target's top decoder layers (drafter layer i from target
    layer L - n + i, n = the drafter's layers) and its final norm from the target's, wherever a parameter of the
    same name and shape exists (a llama or Qwen3 target's q/k/v/o, MLP and norms), so a drafter begins as the
    target's last layers rather than noise. A family without a `layers` stack (EAGLE-3) is left as it is.
    Returns the drafter parameter names it set."""
    layers = getattr(drafter, "layers", None)
    inner = getattr(target_model, "model", target_model)
    t_layers, t_norm = getattr(inner, "layers", None), getattr(inner, "norm", None)
    if layers is None or t_layers is None:
        return []
    copied: list[str] = []
    offset = len(t_layers) - len(layers)
    pairs = [(f"layers.{i}.", layer, t_layers[offset + i]) for i, layer in enumerate(layers) if offset + i >= 0]
    if t_norm is not None and isinstance(getattr(drafter, "norm", None), nn.Module):
        pairs.append(("norm.", drafter.norm, t_norm))
    with torch.no_grad():
        for prefix, mine, theirs in pairs:
            source = dict(theirs.named_parameters())
            for name, p in mine.named_parameters():
                q = source.get(name)
                if q is not None and q.shape == p.shape:
                    p.copy_(q.to(p.dtype))
                    copied.append(prefix + name)
    return copied


def mask_token_for(section, tokenizer) -> int:
    """The recipe's mask token, else the tokenizer's own mask token; never a guess."""
    if section.mask_token_id is not None:
        return int(section.mask_token_id)
    mask = getattr(tokenizer, "mask_token_id", None)
    if mask is None:
        raise PdraftError("the target's tokenizer defines no mask token: set drafter.mask_token_id to a token id "
                          "the target never generates (Qwen3: 151669)")
    return int(mask)


def build_from_recipe(section, target, seed: int | None = None) -> Drafter:
    """A fresh drafter for a loaded `Target` from a recipe `drafter` section: the config fields its family
    takes from the section (FamilySpec.config_fields), the mask token where the family has one, and the target
    layer ids from the target (recipe `target.layer_ids` or spread evenly), so drafter and capture always
    agree."""
    spec = FAMILIES.get(section.kind)
    overrides = dict(spec.config_fields(section), target_layer_ids=list(target.layer_ids))
    if "mask_token_id" in {f.name for f in dataclasses.fields(spec.config)}:
        overrides["mask_token_id"] = mask_token_for(section, target.tokenizer)
    return build_drafter(section.kind, target.config, seed=seed, **overrides)
