"""DFlash2 (z-lab / Inco AI): the DFlash backbone plus grouped dynamic convolutions around every sublayer and a
candidate selector that walks each position's top-K candidates (`drafter.kind: dflash2` in a recipe).
FORMAT.md says what the engines read. Building, saving and loading go through pdraft.models like every kind:

    from pdraft.models import build_drafter, load_drafter, save_drafter
    drafter = build_drafter("dflash2", target.config, mask_token_id=..., block_size=16)
"""

from pdraft.models.dflash2.config import DFlash2Config
from pdraft.models.dflash2.conv import DFlash2DecoderLayer, GroupedDynamicConv, grouped_dynamic_conv
from pdraft.models.dflash2.model import DFlash2Drafter, reset_dflash2_extras
from pdraft.models.dflash2.selector import (
    CandidateSelector,
    SelectorLossOutput,
    greedy_walk,
    sampled_walk,
    selector_loss,
    unary_candidates,
)

__all__ = [
    "DFlash2Config", "DFlash2DecoderLayer", "GroupedDynamicConv", "grouped_dynamic_conv", "DFlash2Drafter",
    "reset_dflash2_extras", "CandidateSelector",
    "SelectorLossOutput", "greedy_walk", "sampled_walk", "selector_loss", "unary_candidates",
]
