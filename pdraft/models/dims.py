"""What a drafter takes from its target, torch-free: the sizes it copies (`target_dims`, from a transformers
config or its config.json dict, a multimodal wrapper's `text_config` included), the RoPE base
(`rope_theta_of`; only plain RoPE), and `check_fits_target`, the one rule that a drafter was built for a given
target. Checkpoint loading, decoding, bench, calibration, pull and `drafter.init_from` all call that rule;
the checkpoint layouts (pdraft.models.formats) read a drafter's own config.json through `target_dims` too."""

from __future__ import annotations

from pdraft.errors import PdraftError
from pdraft.layer_ids import check_layer_ids


def _get(cfg, name, default=None):
    return cfg.get(name, default) if isinstance(cfg, dict) else getattr(cfg, name, default)


def text_config(target_config):
    """The language model's part of a target config (a transformers config or its dict)."""
    if not isinstance(target_config, dict) and hasattr(target_config, "get_text_config"):
        return target_config.get_text_config()
    if isinstance(target_config, dict) and "text_config" in target_config:
        return target_config["text_config"]
    return target_config


def rope_theta_of(cfg, where: str | None = None) -> float:
    """RoPE base from a transformers config (v5 `rope_parameters` or v4 `rope_theta`/`rope_scaling`). Only
    plain RoPE is supported: a scaled variant would silently change every position's rotation."""
    params = _get(cfg, "rope_parameters") or {}
    scaling = _get(cfg, "rope_scaling") or {}
    kind = params.get("rope_type") or params.get("type") or scaling.get("rope_type") or scaling.get("type")
    if kind not in (None, "default"):
        raise PdraftError(f"{where + ': ' if where else ''}RoPE type {kind!r} is not supported by pdraft drafters "
                          f"(only plain RoPE)")
    return float(params.get("rope_theta", _get(cfg, "rope_theta", 10000.0)))


def target_dims(target_config, where: str | None = None) -> dict:
    """The fields a drafter copies from its target (a transformers config or its dict)."""
    target_config = text_config(target_config)
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
        rope_theta=rope_theta_of(target_config, where),
        attention_bias=bool(_get(target_config, "attention_bias", False)),
        max_position_embeddings=int(_get(target_config, "max_position_embeddings", 40960) or 40960),
    )


def check_fits_target(drafter_config, target_config) -> None:
    """The drafter was built for this target: the same vocabulary and hidden size (it shares the target's
    embedding and LM head; a drafter with its own width states the target's as `target_hidden_size`), the same
    depth when it records one, feature layers the target has, and a mask token inside its vocabulary. Raises a
    one-line PdraftError naming the first mismatch. `drafter_config` is any drafter's config (the n-gram
    baseline's and test doubles' included), so only `vocab_size`, `hidden_size` and `target_layer_ids` are
    required of it."""
    target, d = text_config(target_config), drafter_config

    def bad(what: str):
        raise PdraftError(f"drafter does not fit the target: {what}")

    vocab, layers = int(_get(target, "vocab_size")), int(_get(target, "num_hidden_layers"))
    if int(d.vocab_size) != vocab:
        bad(f"vocabulary {d.vocab_size} vs the target's {vocab}")
    hidden = int(getattr(d, "target_hidden_size", None) or d.hidden_size)
    if hidden != int(_get(target, "hidden_size")):
        bad(f"hidden size {hidden} vs the target's {_get(target, 'hidden_size')}")
    recorded = getattr(d, "num_target_layers", None)
    if recorded is not None and int(recorded) != layers:
        bad(f"{recorded} target layers vs the target's {layers}")
    try:
        check_layer_ids(d.target_layer_ids, layers)
    except PdraftError as e:
        bad(e.message)
    mask = getattr(d, "mask_token_id", None)
    if mask is not None and int(mask) >= vocab:
        bad(f"mask_token_id {mask} is not below the target's vocabulary size {vocab}")


__all__ = ["target_dims", "rope_theta_of", "text_config", "check_fits_target"]
