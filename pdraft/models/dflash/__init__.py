"""DFlash (arXiv:2602.06036), `drafter.kind: dflash`: the KV-injection backbone sampled position by position.
Its config (config.py, DFlashConfig) and model (model.py, DFlashDrafter) are also the backbone DSpark and DFlash2
extend from their folders; family.py is its registry entry, format.py z-lab's `DFlashDraftModel` layout (its
DeepSpec layout is DSpark's, pdraft/models/dspark/format.py: DeepSpec's DFlash is a DSpark without heads).
Nothing is imported here, so that reading the family registry stays torch-free."""
