"""DFlash (arXiv:2602.06036): the KV-injection backbone of pdraft.models.drafter sampled position by position
(`drafter.kind: dflash`). Its config and model are the shared backbone's (pdraft.models.config.DFlashConfig,
pdraft.models.drafter.DFlashDrafter); this folder holds its family spec and z-lab's `DFlashDraftModel` layout.
Nothing is imported here, so that reading the family registry stays torch-free."""
