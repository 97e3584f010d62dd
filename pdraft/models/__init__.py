"""Drafters of every registered family (DFlash, DSpark, DFlash2, EAGLE-3; pdraft.models.families lists them): configs,
models, the runtime API the decoding engine uses, and checkpoints in the layouts the families read and write.
Usable from Python without the CLI:

    from pdraft.models import build_drafter, load_drafter, draft_step

The names below are imported on first use, so that importing a torch-free part of this package (the family
registry, the configs, the layouts, which the recipe reads) does not import torch.
"""

from pdraft.lazy import load

_LAZY = (
    "pdraft.models.api:Drafter", "pdraft.models.api:DraftState", "pdraft.models.api:Proposal",
    "pdraft.models.api:SamplingParams", "pdraft.models.build:build_drafter", "pdraft.models.build:draft_step",
    "pdraft.models.build:make_drafter", "pdraft.models.dims:target_dims", "pdraft.models.checkpoint:load_config",
    "pdraft.models.checkpoint:load_drafter", "pdraft.models.checkpoint:save_drafter",
    "pdraft.models.dflash.config:DFlashConfig", "pdraft.models.dspark.config:DSparkConfig",
    "pdraft.models.dflash2.config:DFlash2Config", "pdraft.models.dflash.model:DFlashDrafter",
    "pdraft.models.api:TrainOutput", "pdraft.models.dspark.model:DSparkDrafter",
    "pdraft.models.dflash2.model:DFlash2Drafter", "pdraft.models.eagle3.config:Eagle3Config",
    "pdraft.models.eagle3.model:Eagle3Drafter", "pdraft.models.families:FAMILIES",
    "pdraft.models.sampling:probs_from_logits", "pdraft.models.sampling:sample",
)
_WHERE = {path.partition(":")[2]: path for path in _LAZY}
__all__ = list(_WHERE)


def __getattr__(name: str):
    if name in _WHERE:
        return load(_WHERE[name])
    raise AttributeError(f"module 'pdraft.models' has no attribute {name!r}")
