"""`pdraft export --format gguf` (issue 58): the GGUF drafter llama.cpp loads (`llama-server -md FILE
--spec-type draft-dflash`), written by llama.cpp's own converter from the pinned tree (pdraft.llamacpp_build:
`convert_hf_to_gguf.py`, run with pdraft's interpreter and the tree's own gguf-py), from the Hugging Face layout
that converter registers for the family, with the target's tokenizer (`--target-model-dir`). Also the target's
GGUF where it is not one already (convert_target). pdraft.hub.export.export_gguf drives it; this module imports
nothing of pdraft.hub.export.

It writes DFlash (z-lab block convention: pdraft's `zlab-dflash` folder, architecture `DFlashDraftModel`, which
conversion/qwen.py registers as `DFlashModel`) and EAGLE-3 (pdraft's vLLM layout, its layer ids also written at
the config's top level, where conversion/llama.py reads them: pdraft/hub/ENGINES.md); DFlash2 and DSpark are refused
in one line citing the converter line they would be misread at (FamilySpec.llamacpp). What llama.cpp would silently misread is
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

A vocabulary the converter's hash table does not know (tiny-stdlib's own BPE) stops it: conversion/base.py,
TextModel.get_vocab_base_pre, hashes the tokens of a fixed text and raises "BPE pre-tokenizer was not recognized"
for an unlisted hash (the table is regenerated from hub downloads by convert_hf_to_gguf_update.py; the converter
has no flag to name one). pdraft names it instead, from the tokenizer's own tokenizer.json (pre_tokenizer_name):
a ByteLevel pre-tokenizer with GPT-2's regex, no prefix space and no normalizer is llama.cpp's "gpt-2"
(src/llama-vocab.cpp: "gpt-2" -> LLAMA_VOCAB_PRE_TYPE_GPT2, whose regex_exprs are GPT-2's split). The converter
runs through a launcher that returns that name only where its own table has no entry (its answer wins wherever it
has one); any other unknown pre-tokenizer keeps the converter's error. tests/test_gguf_pretokenizer.py holds
llama.cpp's tokenization of mixed texts to the tokenizer's own."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from pdraft.children import run_bounded
from pdraft.errors import PdraftError
from pdraft.llamacpp_build import converter

DRAFTER_NAME = "drafter.gguf"
CONVERT_TIMEOUT_S = 1800.0


# The launcher: the converter, its pre-tokenizer lookup answering NAME where its own hash table raises (module
# docstring). argv: the launcher's -c, the converter's path, NAME, then the converter's own arguments.
_NAMED_PRE = """import runpy, sys
from pathlib import Path
conv, name = sys.argv[1], sys.argv[2]
sys.argv = [conv] + sys.argv[3:]
sys.path[:0] = [str(Path(conv).parent), str(Path(conv).parent / "gguf-py")]
from conversion.base import TextModel
own = TextModel.get_vocab_base_pre
def named(self, tokenizer):
    try:
        return own(self, tokenizer)
    except NotImplementedError:
        return name
TextModel.get_vocab_base_pre = named
runpy.run_path(conv, run_name="__main__")
"""
GPT2_SPLIT = {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}


def pre_tokenizer_name(tokenizer_dir: Path) -> str | None:
    """llama.cpp's name for the pre-tokenizer of `tokenizer_dir`'s tokenizer.json where pdraft can name it (GPT-2's
    byte-level split: "gpt-2"); None where it cannot (the converter's own hash table decides)."""
    try:
        data = json.loads((Path(tokenizer_dir) / "tokenizer.json").read_text())
    except (OSError, ValueError):
        return None
    pre = data.get("pre_tokenizer") or {}
    byte_level = {k: pre.get(k) for k in GPT2_SPLIT} == GPT2_SPLIT
    bpe = (data.get("model") or {}).get("type") == "BPE" and not (data.get("model") or {}).get("byte_fallback")
    return "gpt-2" if byte_level and bpe and data.get("normalizer") is None else None


def convert_hf(src: Path, out_file: Path, *, outtype: str, target_dir: Path | None = None, extra=()) -> None:
    name = pre_tokenizer_name(target_dir or src)
    launch = [sys.executable, "-c", _NAMED_PRE, str(converter()), name] if name else [sys.executable, str(converter())]
    argv = [*launch, str(src), "--outfile", str(out_file), "--outtype", outtype, *extra]
    if target_dir is not None:
        argv += ["--target-model-dir", str(target_dir)]
    env = {k: v for k, v in os.environ.items() if k != "NO_LOCAL_GGUF"}  # the tree's own gguf-py, not pip's
    done = run_bounded(argv, timeout_s=CONVERT_TIMEOUT_S, max_bytes=1 << 18, env=env)
    if done.returncode != 0 or not out_file.is_file():
        lines = [x for x in (done.stderr + done.stdout).splitlines() if x.strip()]
        last = next((x for x in reversed(lines) if "Error" in x or "error" in x), lines[-1] if lines else "no output")
        raise PdraftError(f"llama.cpp's converter failed on {src}"
                          f"{' (timed out)' if done.timed_out else ''}: {last.strip()[:300]}")


def read_fields(path: Path) -> dict:
    """The GGUF metadata pdraft holds a drafter against (gguf-py's reader, the tree's own)."""
    tree = str(converter().parent / "gguf-py")
    if tree not in sys.path:
        sys.path.insert(0, tree)
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    out = {}
    for name, f in reader.fields.items():
        if not f.data:
            continue
        parts = [f.parts[i] for i in f.data]
        values = [p.tolist()[0] if p.size == 1 else p.tolist() for p in parts]
        if f.types and f.types[0].name == "STRING":
            values = [bytes(p).decode("utf-8", "replace") for p in parts]
        out[name] = values if f.types and f.types[0].name == "ARRAY" else values[0]
    return out


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


def convert_target(target_dir: str | os.PathLike, out_file: str | os.PathLike, *, outtype: str = "f32") -> Path:
    """The target's GGUF (float32 by default: the reference llama.cpp's acceptance is compared on), written once."""
    out_file = Path(out_file)
    if not out_file.is_file():
        out_file.parent.mkdir(parents=True, exist_ok=True)
        part = out_file.with_name(out_file.name + ".part")
        convert_hf(Path(target_dir), part, outtype=outtype)
        part.rename(out_file)
    return out_file
