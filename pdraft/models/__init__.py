"""Parallel drafters (DFlash, DSpark, DFlash2): configs, models, the runtime API the decoding engine uses, and
checkpoints in the DeepSpec, z-lab and DFlash2 layouts. Usable from Python without the CLI:

    from pdraft.models import build_drafter, load_drafter, draft_step
"""

from pdraft.models.api import Drafter, DraftState, Proposal, SamplingParams
from pdraft.models.build import build_drafter, draft_step, make_drafter, target_dims
from pdraft.models.checkpoint import load_config, load_drafter, save_drafter
from pdraft.models.config import DFlashConfig, DSparkConfig
from pdraft.models.dflash2 import DFlash2Config, DFlash2Drafter
from pdraft.models.drafter import DFlashDrafter, TrainOutput
from pdraft.models.dspark import DSparkDrafter
from pdraft.models.sampling import probs_from_logits, sample

__all__ = [
    "Drafter", "DraftState", "Proposal", "SamplingParams", "build_drafter", "draft_step", "make_drafter",
    "target_dims", "DFlashConfig", "DSparkConfig", "DFlashDrafter", "DSparkDrafter", "DFlash2Config", "DFlash2Drafter", "TrainOutput",
    "probs_from_logits", "sample", "load_config", "load_drafter", "save_drafter",
]
