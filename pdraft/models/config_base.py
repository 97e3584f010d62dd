"""What every drafter family's typed config inherits, as transformers' configs inherit PretrainedConfig's: the
round trip through a dict (`to_dict` / `from_dict`, pdraft's own field names; the checkpoint layouts map those
onto each engine's config.json) and the range check of every setting that has a `Limit` (the one range the
recipe key and the config.json schema read, pdraft.models.family), both written here once. A family's config
is a dataclass subclass that adds its fields, `kind`, `model_type` and `limits` (its settings' Limits), and
extends `validate` with the rules that tie fields together (heads divisible by kv heads, a block the engines
serve); it never writes a range the Limits hold. Torch-free (the recipe reads the configs)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar, NoReturn

from pdraft.errors import PdraftError
from pdraft.models.family import Limit

# The settings every family's config has, one range each by config.json field name: the transformer's shape
# (config.json's top level, where pdraft.models.schema reads these for every layout) and the draft vocabulary.
# Each family's `limits` starts from these, so no family writes these ranges again (issue 43: EAGLE-3 checked
# only >= 1 and built a hidden size the schema then refused at load).
BACKBONE_LIMITS = {
    "num_hidden_layers": Limit(1, 64),
    "hidden_size": Limit(8, 1 << 16),
    "intermediate_size": Limit(8, 1 << 18),
    "num_attention_heads": Limit(1, 1024),
    "num_key_value_heads": Limit(1, 1024),
    "draft_vocab_size": Limit(1, 1 << 22),
}


@dataclass
class DrafterConfig:
    kind: ClassVar[str] = "drafter"
    model_type: ClassVar[str] = "pdraft_drafter"
    limits: ClassVar[Mapping[str, Limit]] = {}  # field -> its one range (None and the Limit's `off` pass)

    def __post_init__(self) -> None:
        self.validate()

    def bad(self, msg: str) -> NoReturn:
        raise PdraftError(f"invalid {self.kind} drafter config: {msg}")

    def validate(self) -> None:
        """Every limited field within its Limit; subclasses add their cross-field rules after calling this."""
        for name, limit in self.limits.items():
            value = getattr(self, name)
            if value is None or (limit.off is not None and value == limit.off):
                continue
            if isinstance(value, bool) or not isinstance(value, int):  # the schema reads every Limit as "int"
                self.bad(f"{name} must be a whole number, got {value!r}")
            if not limit.low <= value <= limit.high:
                self.bad(f"{name} must be {limit.low}..{limit.high}, got {value}")

    def to_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for name, value in out.items():  # copies: the dict never aliases the config's lists and dicts
            if isinstance(value, (list, dict)):
                out[name] = type(value)(value)
        out["kind"] = self.kind
        out["model_type"] = self.model_type
        return out

    @classmethod
    def from_dict(cls, data: dict):
        """The inverse of `to_dict` for this config class; pdraft.models.families.config_from_dict picks the
        class by the dict's kind."""
        data = dict(data)
        kind = data.pop("kind", cls.kind)
        data.pop("model_type", None)
        if kind != cls.kind:
            raise PdraftError(f"a {kind} config is not a {cls.kind} config")
        fields = dataclasses.fields(cls)
        unknown = sorted(set(data) - {f.name for f in fields})
        if unknown:
            raise PdraftError(f"unknown {kind} drafter config field(s): {', '.join(unknown)}")
        missing = [f.name for f in fields if f.default is dataclasses.MISSING
                   and f.default_factory is dataclasses.MISSING and f.name not in data]
        if missing:
            raise PdraftError(f"{kind} drafter config misses field(s): {', '.join(missing)}")
        return cls(**data)


__all__ = ["BACKBONE_LIMITS", "DrafterConfig"]
