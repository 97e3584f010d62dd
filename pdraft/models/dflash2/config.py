"""The typed configuration of a DFlash2 drafter (pdraft/models/formats.py maps it onto the engines'
`config.json`). DFlash2 is the z-lab DFlash backbone (block = anchor + masks, one backbone pass, full target
vocabulary) plus the grouped dynamic convolutions and the candidate selector, so `DFlash2Config` extends `DFlashConfig` and pins the
settings the engines cannot represent (z-lab convention, one denoise pass, a dense MLP)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from pdraft.errors import PdraftError
from pdraft.models.config import DFlashConfig


@dataclass
class DFlash2Config(DFlashConfig):
    """A DFlash2 drafter. Defaults are those of the published drafters (2 taps, groups of 16 channels, rank 256,
    top-16 candidates)."""

    block_convention: str = "zlab"  # the only one the engines serve: slot 0 is the anchor, slots 1.. draft
    conv_kernel_size: int = 2  # taps of each dynamic convolution (tap 0 = the position itself)
    conv_group_size: int = 16  # channels sharing one dynamic coefficient per tap; divides hidden_size
    selector_rank: int = 256  # r of the predecessor / successor codebooks and of the hidden projection
    selector_top_k: int = 16  # K unary candidates per draft position
    input_embedding_scale: float = 1.0  # the block's token embeddings are multiplied by this
    output_multiplier: float = 1.0  # the unary candidate logits are multiplied by this ...
    final_logit_softcapping: float | None = None  # ... then softcapped, cap * tanh(x / cap); None = off

    kind = "dflash2"
    model_type = "pdraft_dflash2"

    @property
    def num_conv_groups(self) -> int:
        return self.hidden_size // self.conv_group_size

    def validate(self) -> None:
        super().validate()

        def bad(msg: str):
            raise PdraftError(f"invalid dflash2 drafter config: {msg}")

        if self.block_convention != "zlab":
            bad(f"DFlash2 uses the zlab block convention (block = anchor + masks), got {self.block_convention!r}")
        if self.denoise_steps != 1:
            bad(f"DFlash2 drafts in one backbone pass (denoise_steps 1), got {self.denoise_steps}")
        if self.is_moe:
            bad("DFlash2 drafters have a dense MLP (no engine serves a mixture-of-experts DFlash2)")
        if self.conv_group_size < 1 or self.hidden_size % self.conv_group_size:
            bad(f"conv_group_size {self.conv_group_size} must divide hidden_size {self.hidden_size}")
        if not 1 <= self.conv_kernel_size <= self.block_size:
            bad(f"conv_kernel_size must be 1..block_size ({self.block_size}), got {self.conv_kernel_size}")
        if self.selector_rank < 1:
            bad(f"selector_rank must be >= 1, got {self.selector_rank}")
        if not 1 <= self.selector_top_k <= self.vocab_size:
            bad(f"selector_top_k must be 1..vocab_size ({self.vocab_size}), got {self.selector_top_k}")
        # vLLM takes the top-K of the raw head logits and scales them afterwards: that equals the top-K of the
        # scaled logits only for a positive multiplier (softcapping is monotone), so a negative one is refused.
        if not self.output_multiplier > 0:
            bad(f"output_multiplier must be > 0, got {self.output_multiplier}")
        if self.final_logit_softcapping is not None and not self.final_logit_softcapping > 0:
            bad(f"final_logit_softcapping must be > 0 or null, got {self.final_logit_softcapping}")

    @classmethod
    def from_dict(cls, data: dict) -> DFlash2Config:
        """The inverse of `to_dict` (pdraft's own field names, not the engines' layout)."""
        data = dict(data)
        kind = data.pop("kind", cls.kind)
        data.pop("model_type", None)
        if kind != cls.kind:
            raise PdraftError(f"a {kind} config is not a dflash2 config")
        fields = dataclasses.fields(cls)
        unknown = sorted(set(data) - {f.name for f in fields})
        if unknown:
            raise PdraftError(f"unknown dflash2 drafter config field(s): {', '.join(unknown)}")
        missing = [f.name for f in fields if f.default is dataclasses.MISSING
                   and f.default_factory is dataclasses.MISSING and f.name not in data]
        if missing:
            raise PdraftError(f"dflash2 drafter config misses field(s): {', '.join(missing)}")
        return cls(**data)


__all__ = ["DFlash2Config"]
