"""DFlash2 (z-lab / Inco AI): the DFlash backbone plus grouped dynamic convolutions around every sublayer and a
candidate selector that walks each position's top-K candidates. Self-contained for now: the decode engine,
trainer, recipe and CLI do not use it yet (FORMAT.md says what the engines read).

    from pdraft.models.dflash2 import build_dflash2, save_dflash2, load_dflash2
"""

from pdraft.models.dflash2.config import DFlash2Config
from pdraft.models.dflash2.conv import DFlash2DecoderLayer, GroupedDynamicConv, grouped_dynamic_conv
from pdraft.models.dflash2.layout import config_from_json, config_to_json, load_dflash2, save_dflash2
from pdraft.models.dflash2.model import DFlash2Drafter, build_dflash2
from pdraft.models.dflash2.selector import (
    CandidateSelector,
    SelectorLossOutput,
    greedy_walk,
    sampled_walk,
    selector_loss,
    unary_candidates,
)

__all__ = [
    "DFlash2Config", "DFlash2DecoderLayer", "GroupedDynamicConv", "grouped_dynamic_conv", "config_from_json",
    "config_to_json", "load_dflash2", "save_dflash2", "DFlash2Drafter", "build_dflash2", "CandidateSelector",
    "SelectorLossOutput", "greedy_walk", "sampled_walk", "selector_loss", "unary_candidates",
]
