"""Typed configurations of the drafter kinds (DFlash2's, `DFlash2Config`, lives in models/dflash2/config.py and
registers here by kind). `DFlashConfig` describes the KV-injection backbone every kind shares; `DSparkConfig`
adds the sequential head (Markov, gated Markov, RNN or none) and the confidence head. Sizes default to the target's (the drafter shares the target's embedding and LM head, so
its hidden size and vocabulary must equal the target's). `to_dict`/`from_dict` round-trip every field; the
checkpoint module maps these dicts onto the DeepSpec and z-lab `config.json` layouts."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from pdraft.errors import PdraftError
from pdraft.layer_ids import check_layer_ids

KINDS = ("dflash", "dspark", "dflash2")  # dflash2: pdraft/models/dflash2/ (its config registers itself)
CONVENTIONS = ("deepspec", "zlab")
SEQUENTIAL_HEADS = ("markov", "gated", "rnn", "none")  # "gated" is DeepSpec's gated Markov variant
MAX_BLOCK_SIZE = 32
_CLASSES: dict[str, type] = {}  # kind -> config class, filled by DFlashConfig and its subclasses


@dataclass
class DFlashConfig:
    """A DFlash drafter. Field names follow transformers' Qwen3 config where one exists."""

    hidden_size: int
    vocab_size: int
    num_target_layers: int  # decoder layers of the target
    target_layer_ids: list[int]  # id i = transformers hidden_states[i + 1], -1 = embeddings (pdraft/layer_ids.py)
    mask_token_id: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    num_hidden_layers: int = 5  # drafter depth
    block_size: int = 16
    # "deepspec": the anchor is the first prediction position, block_size inputs give block_size drafts.
    # "zlab": the anchor is the bonus token, the block drafts block_size - 1 tokens after it.
    block_convention: str = "deepspec"
    denoise_steps: int = 1  # backbone passes per proposal; > 1 refines the block iteratively
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    attention_bias: bool = False
    hidden_act: str = "silu"
    max_position_embeddings: int = 40960
    num_experts: int = 0  # 0 or 1 = dense MLP
    num_experts_per_tok: int = 2
    moe_intermediate_size: int = 0  # 0 = intermediate_size
    extra: dict = field(default_factory=dict)  # target config fields kept verbatim for DeepSpec-layout export

    kind = "dflash"
    model_type = "pdraft_dflash"

    def __init_subclass__(cls, **kwargs):
        # Each kind's config class registers under its `kind`, so a kind living in its own folder
        # (models/dflash2/config.py subclasses this one) is found by `config_class` without this module
        # importing it back. pdraft.models imports every kind, so the table is full once the package is.
        super().__init_subclass__(**kwargs)
        _CLASSES[cls.kind] = cls

    def __post_init__(self) -> None:
        self.validate()

    @property
    def has_confidence(self) -> bool:
        return False

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    @property
    def num_gamma(self) -> int:
        """Most draft tokens one proposal yields (max_gamma)."""
        return self.block_size if self.block_convention == "deepspec" else self.block_size - 1

    def validate(self) -> None:
        def bad(msg: str):
            raise PdraftError(f"invalid {self.kind} drafter config: {msg}")

        if not 1 <= self.block_size <= MAX_BLOCK_SIZE:
            bad(f"block_size must be 1..{MAX_BLOCK_SIZE}, got {self.block_size}")
        if self.block_convention not in CONVENTIONS:
            bad(f"block_convention must be one of {CONVENTIONS}, got {self.block_convention!r}")
        if self.block_convention == "zlab" and self.block_size < 2:
            bad("the zlab convention needs block_size >= 2 (the anchor takes one slot)")
        if self.denoise_steps < 1:
            bad(f"denoise_steps must be >= 1, got {self.denoise_steps}")
        if self.num_hidden_layers < 1:
            bad(f"num_hidden_layers must be >= 1, got {self.num_hidden_layers}")
        for name in ("hidden_size", "vocab_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                     "intermediate_size", "num_target_layers"):
            if int(getattr(self, name)) < 1:
                bad(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_attention_heads % self.num_key_value_heads:
            bad(f"num_attention_heads ({self.num_attention_heads}) must be a multiple of num_key_value_heads "
                f"({self.num_key_value_heads})")
        try:  # the one layer-id rule; a drafter pdraft wrote with the last layer still loads (with a warning)
            self.target_layer_ids = check_layer_ids(self.target_layer_ids, int(self.num_target_layers),
                                                    where="target_layer_ids")
        except PdraftError as e:
            bad(e.message)
        if not 0 <= self.mask_token_id < self.vocab_size:
            bad(f"mask_token_id {self.mask_token_id} is outside the vocabulary (size {self.vocab_size})")
        if self.num_experts < 0:
            bad(f"num_experts must be >= 0, got {self.num_experts}")
        if self.is_moe and not 1 <= self.num_experts_per_tok <= self.num_experts:
            bad(f"num_experts_per_tok must be 1..{self.num_experts}, got {self.num_experts_per_tok}")
        if self.hidden_act != "silu":
            bad(f"only the silu activation is supported, got {self.hidden_act!r}")

    def to_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["target_layer_ids"] = list(self.target_layer_ids)
        out["extra"] = dict(self.extra)
        out["kind"] = self.kind
        out["model_type"] = self.model_type
        return out

    @classmethod
    def from_dict(cls, data: dict) -> DFlashConfig:
        data = dict(data)
        kind = data.pop("kind", cls.kind)
        data.pop("model_type", None)
        target = config_class(kind)
        names = {f.name for f in dataclasses.fields(target)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise PdraftError(f"unknown {kind} drafter config field(s): {', '.join(unknown)}")
        required = [f.name for f in dataclasses.fields(target)
                    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        missing = [n for n in required if n not in data]
        if missing:
            raise PdraftError(f"{kind} drafter config misses field(s): {', '.join(missing)}")
        return target(**data)


_CLASSES[DFlashConfig.kind] = DFlashConfig


@dataclass
class DSparkConfig(DFlashConfig):
    """A DSpark drafter: the DFlash backbone plus a sequential head and a confidence head."""

    sequential_head: str = "markov"  # "markov" (W1[x] W2), "gated", "rnn" (paper eq. 6) or "none"
    markov_rank: int = 256  # r: width of W1 rows (and of the RNN state)
    confidence_head: bool = True
    confidence_with_markov: bool = True  # eq. 7 input [h_k; W1[x_{k-1}]] instead of h_k alone

    kind = "dspark"
    model_type = "pdraft_dspark"

    @property
    def has_confidence(self) -> bool:
        return bool(self.confidence_head)

    @property
    def has_sequential_head(self) -> bool:
        return self.sequential_head != "none"

    def validate(self) -> None:
        super().validate()
        if self.sequential_head not in SEQUENTIAL_HEADS:
            raise PdraftError(f"invalid dspark drafter config: sequential_head must be one of {SEQUENTIAL_HEADS}, "
                              f"got {self.sequential_head!r}")
        if self.has_sequential_head and self.markov_rank < 1:
            raise PdraftError(f"invalid dspark drafter config: markov_rank must be >= 1, got {self.markov_rank}")
        if self.confidence_head and self.confidence_with_markov and not self.has_sequential_head:
            raise PdraftError("invalid dspark drafter config: confidence_with_markov needs a sequential head "
                              "(it reads the head's W1 embedding)")


def config_class(kind: str) -> type[DFlashConfig]:
    if kind in _CLASSES:
        return _CLASSES[kind]
    raise PdraftError(f"unknown drafter kind {kind!r}: expected one of {KINDS}")
