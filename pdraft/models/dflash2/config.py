"""The typed configuration of a DFlash2 drafter (pdraft/models/dflash2/format.py maps it onto the engines'
`config.json`). DFlash2 is the z-lab DFlash backbone (block = anchor + masks, one backbone pass, full target
vocabulary) plus the grouped dynamic convolutions and the candidate selector, so `DFlash2Config` extends
`DFlashConfig` and pins the settings the engines cannot represent (z-lab convention, one denoise pass, a dense
MLP). Those pins are written once, in `served_block_problem`, which the recipe's cross-check asks too."""

from __future__ import annotations

from dataclasses import dataclass

from pdraft.models.dflash.config import LIMITS as BACKBONE_LIMITS
from pdraft.models.dflash.config import DFlashConfig
from pdraft.models.family import MAX_GAMMA, Limit

BLOCK_CONVENTION = "zlab"  # the only one the engines serve: slot 0 is the anchor, slots 1.. draft
# One range per DFlash2 setting, for its recipe key and its config.json field (`dflash_config`). The selector's
# top-K bounds memory: its K x K lattice per draft position costs batch x block x K^2 floats (K = 4096 was
# 5.9 GB at batch 2), so K stops at 1,024, 64 times the published drafters' 16.
LIMITS = {
    "conv_kernel_size": Limit(1, MAX_GAMMA),
    "conv_group_size": Limit(1, 4096),
    "selector_rank": Limit(1, 4096),
    "selector_top_k": Limit(1, 1024),
}
# train.selector_target: the selector's K-way label, the gold token or the target's distribution over the K.
SELECTOR_TARGETS = ("token", "distribution")


def served_block_problem(block_convention: str, block_size: int, denoise_steps: int, num_experts: int,
                         conv_kernel_size: int) -> tuple[str, str] | None:
    """(field, why) for the first way a DFlash2 block differs from what the engines serve (vLLM's
    qwen3_dflash2.py: the z-lab block, one backbone pass, a dense MLP, taps within the block), else None."""
    if block_convention != BLOCK_CONVENTION:
        return "block_convention", (f"DFlash2 uses the zlab block convention (block = anchor + masks), got "
                                    f"{block_convention!r}")
    if block_size < 2:
        return "block_size", f"DFlash2 drafts block_size - 1 tokens: block_size must be >= 2, got {block_size}"
    if denoise_steps != 1:
        return "denoise_steps", f"DFlash2 drafts in one backbone pass (denoise_steps 1), got {denoise_steps}"
    if num_experts > 1:
        return "num_experts", "DFlash2 drafters have a dense MLP (no engine serves a mixture-of-experts DFlash2)"
    if not 1 <= conv_kernel_size <= block_size:
        return "conv_kernel_size", f"conv_kernel_size must be 1..block_size ({block_size}), got {conv_kernel_size}"
    return None


@dataclass
class DFlash2Config(DFlashConfig):
    """A DFlash2 drafter. Defaults are those of the published drafters (2 taps, groups of 16 channels, rank 256,
    top-16 candidates)."""

    block_convention: str = BLOCK_CONVENTION
    conv_kernel_size: int = 2  # taps of each dynamic convolution (tap 0 = the position itself)
    conv_group_size: int = 16  # channels sharing one dynamic coefficient per tap; divides hidden_size
    selector_rank: int = 256  # r of the predecessor / successor codebooks and of the hidden projection
    selector_top_k: int = 16  # K unary candidates per draft position
    input_embedding_scale: float = 1.0  # the block's token embeddings are multiplied by this
    output_multiplier: float = 1.0  # the unary candidate logits are multiplied by this ...
    final_logit_softcapping: float | None = None  # ... then softcapped, cap * tanh(x / cap); None = off

    kind = "dflash2"
    model_type = "pdraft_dflash2"
    limits = {**BACKBONE_LIMITS, **LIMITS}

    def validate(self) -> None:
        super().validate()
        bad = self.bad
        problem = served_block_problem(self.block_convention, self.block_size, self.denoise_steps, self.num_experts,
                                       self.conv_kernel_size)
        if problem:
            bad(problem[1])
        if self.hidden_size % self.conv_group_size:
            bad(f"conv_group_size {self.conv_group_size} must divide hidden_size {self.hidden_size}")
        drafted = self.draft_vocab_size or self.vocab_size  # the candidates come from the draft vocabulary
        if self.selector_top_k > drafted:
            bad(f"selector_top_k must be 1..{'draft_vocab_size' if self.reduced_vocab else 'vocab_size'} "
                f"({drafted}), got {self.selector_top_k}")
        # vLLM takes the top-K of the raw head logits and scales them afterwards: that equals the top-K of the
        # scaled logits only for a positive multiplier (softcapping is monotone), so a negative one is refused.
        if not self.output_multiplier > 0:
            bad(f"output_multiplier must be > 0, got {self.output_multiplier}")
        if self.final_logit_softcapping is not None and not self.final_logit_softcapping > 0:
            bad(f"final_logit_softcapping must be > 0 or null, got {self.final_logit_softcapping}")

    def card_heads(self) -> str:
        return (f"; dynamic convs: {self.conv_kernel_size} taps, groups of {self.conv_group_size}; candidate "
                f"selector: top-{self.selector_top_k}, rank {self.selector_rank}")


__all__ = ["DFlash2Config", "BLOCK_CONVENTION", "served_block_problem"]
