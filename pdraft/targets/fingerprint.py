"""What identifies a target: its sizes, a hash of its config.json without the fields that change with the tool
that saved it, and a hash of a sample of its weights. The hidden-state cache records it in its manifest and
regeneration in its metadata, so that both refuse, in one line, to be reused for another target."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from pdraft.errors import PdraftError
from pdraft.models.schema import MAX_CONFIG_BYTES
from pdraft.readback import parse_json, read_bytes

# Fields of config.json that change with the tool that saved it, not with the model.
_VOLATILE_CONFIG_KEYS = {"transformers_version", "_name_or_path", "torch_dtype", "dtype", "use_cache",
                         "_attn_implementation", "attn_implementation"}
_WEIGHT_SAMPLE_BYTES = 1 << 20


def config_fingerprint(config_dict: dict) -> str:
    clean = {k: v for k, v in config_dict.items() if k not in _VOLATILE_CONFIG_KEYS}
    return hashlib.sha256(json.dumps(clean, sort_keys=True, default=str).encode()).hexdigest()


def weights_fingerprint(folder: str | Path) -> str | None:
    """sha256 over each safetensors file's name, size and first MiB: cheap, and it tells apart two models
    with the same config but different weights (a fine-tune, another seed) without reading gigabytes."""
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        return None
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode())
        h.update(str(f.stat().st_size).encode())
        with open(f, "rb") as handle:
            h.update(handle.read(_WEIGHT_SAMPLE_BYTES))
    return h.hexdigest()


def target_fingerprint(target) -> dict[str, Any]:
    """What identifies a target for the cache: sizes, config hash and a weights sample hash."""
    cfg_path = Path(target.path) / "config.json"
    try:  # within the config's size limit, nesting bounded (pdraft.readback)
        cfg = parse_json(read_bytes(cfg_path, "config.json", MAX_CONFIG_BYTES), str(cfg_path))
    except PdraftError:
        cfg = target.config.to_dict()
    return {
        "model_type": str(getattr(target.config, "model_type", "")),
        "hidden_size": target.hidden_size,
        "vocab_size": target.vocab_size,
        "num_layers": target.num_layers,
        "config_sha256": config_fingerprint(cfg),
        "weights_sha256": weights_fingerprint(target.path),
    }
