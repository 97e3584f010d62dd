"""`pdraft export --format gguf` (issue 58): the GGUF drafter llama.cpp loads (`llama-server -md FILE
--spec-type draft-dflash`), written by llama.cpp's own converter from the pinned tree (pdraft.engines.llamacpp:
`convert_hf_to_gguf.py`, run with pdraft's interpreter and the tree's own gguf-py), from the Hugging Face layout
that converter registers for the family, with the target's tokenizer (`--target-model-dir`). pdraft.hub.export.export_gguf drives it; this module imports
nothing of pdraft.hub.export.

It writes DFlash (z-lab block convention: pdraft's `zlab-dflash` folder, architecture `DFlashDraftModel`, which
conversion/qwen.py registers as `DFlashModel`), DFlash2 (pdraft's vLLM layout, its selector fields read back),
DSpark (pdraft's vLLM layout with `sample_from_anchor` written: conversion/qwen.py DSparkModel) and EAGLE-3
(pdraft's vLLM layout, its layer ids also written at the config's top level, where conversion/llama.py reads them:
pdraft/hub/ENGINES.md); each family declares what it needs in FamilySpec.llamacpp. What llama.cpp would silently misread is
refused, each rule citing the tree's line, and the written file is read back and held against the drafter:

- layer ids: the converter writes `dflash.target_layers` = [i + 1 for i in dflash_config.target_layer_ids]
  (conversion/qwen.py, DFlashModel.set_gguf_parameters) and the loop captures the INPUT of each listed target
  layer (common/speculative.cpp, llama_set_embeddings_layer_inp), i.e. transformers' hidden_states[i + 1], which
  is pdraft's id i (pdraft/layer_ids.py; -1, the embeddings, is layer 0's input). The last target layer has no
  next layer whose input it is: pdraft.hub.export's plan refuses it (check_layer_ids);
- block size: `dflash.block_size`, which the converter defaults to 16 when absent (conversion/qwen.py) and the
  loop defaults to 16 when unreadable (common/speculative.cpp); read back and compared;
- mask token: `tokenizer.ggml.mask_token_id`, written only when dflash_config.mask_token_id is set
  (conversion/qwen.py, DFlashModel.set_vocab), read by llama_vocab_mask (common/speculative.cpp); read back;
- sample_from_anchor: the DFlash path drafts from block slot 1 on (common/speculative.cpp, "greedily read the
  predicted block at ... positions 1..n_block_tokens-1"): a DeepSpec-convention DFlash is refused by the z-lab
  plan (pdraft.models.dflash.family);
- draft vocabulary: z-lab's DFlashDraftModel has no d2t (pdraft.models.formats.refuse_draft_vocab).
The converter itself, and how it is run (the pre-tokenizer it cannot name), is pdraft.engines.llamacpp's.
"""

from __future__ import annotations

from pdraft.errors import PdraftError

DRAFTER_NAME = "drafter.gguf"


def architecture(kind: str) -> str | None:
    """The GGUF architecture llama.cpp's converter writes for a family, as the family declares it
    (FamilySpec.llamacpp); None where pdraft does not write that family's GGUF yet."""
    from pdraft.models.families import FAMILIES

    served = FAMILIES.get(kind).llamacpp if kind in FAMILIES.kinds else None
    return served.architecture if served is not None else None


def written_kinds() -> list[str]:
    from pdraft.models.families import FAMILIES

    return [k for k in FAMILIES.kinds if architecture(k) is not None]


def check_written(fields: dict, cfg) -> None:
    """The written GGUF against the drafter: one line naming the first field llama.cpp would read otherwise (the
    family declares them: FamilySpec.llamacpp.written)."""
    from pdraft.models.families import FAMILIES

    arch, want = fields.get("general.architecture"), architecture(cfg.kind)
    if arch != want:
        raise PdraftError(f"the converter wrote architecture {arch!r}, not {want!r} (convert_hf_to_gguf.py's "
                          f"registration for the {cfg.kind} export)")
    for key, want, why in FAMILIES.get(cfg.kind).llamacpp.written(cfg):
        got = fields.get(key)
        if got != want:
            raise PdraftError(f"the GGUF's {key} is {got!r} but the drafter was trained with {want!r} ({why})")
