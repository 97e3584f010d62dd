"""DFlash2 (z-lab / Inco AI): the DFlash backbone plus grouped dynamic convolutions around every sublayer and a
candidate selector that walks each position's top-K candidates (`drafter.kind: dflash2` in a recipe).
FORMAT.md says what the engines read. Nothing is imported here, so that reading the family registry stays
torch-free; building, saving and loading go through pdraft.models like every family:

    from pdraft.models import build_drafter, load_drafter, save_drafter
    drafter = build_drafter("dflash2", target.config, mask_token_id=..., block_size=16)
"""
