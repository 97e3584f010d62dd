"""`export`: write a drafter in the layout a serving engine loads, and the exact command that serves it. What each
engine reads, and the file that reads it, is listed in pdraft/hub/ENGINES.md; in short:

- vLLM `method: dspark`  -> `Qwen3DSparkModel` (DeepSpec layout): vanilla Markov head only
  (vllm/model_executor/models/qwen3_dspark.py), `num_speculative_tokens` = block_size because the anchor is
  the first prediction slot (vllm/v1/worker/gpu/spec_decode/dspark/speculator.py).
- vLLM `method: dflash`  -> z-lab `DFlashDraftModel` with `dflash_config`; the anchor is the bonus token and
  `num_speculative_tokens` = block_size - 1 (vllm/v1/spec_decode/dflash.py: 1 + N query slots, N sampled).
- SGLang `DSPARK` -> `Qwen3DSparkModel` with vanilla/gated/RNN heads (python/sglang/srt/models/dspark.py),
  gamma = block_size (`--speculative-dspark-block-size`), plus the STS calibration and SPS cost table in the
  layouts of dspark_components/dspark_sts.py and dspark_sps.py.
- SGLang `DFLASH` and z-lab -> `DFlashDraftModel` (python/sglang/srt/speculative/dflash_utils.py reads
  block_size, dflash_config.target_layer_ids and mask_token_id).
- DFlash2 -> `DFlash2DraftModel` (pdraft/models/dflash2/format.py and FORMAT.md) on vLLM's `dflash`
  method: vLLM has no `dflash2` method name; its `dflash` speculator factory picks DFlash2Speculator
  (vllm/v1/worker/gpu/spec_decode/dflash2/speculator.py) for that architecture, and the conv's block is
  1 + num_speculative_tokens (qwen3_dflash2.py, DFlash2Qwen3DecoderLayer), so num_speculative_tokens =
  block_size - 1 reproduces training. SGLang: `DFLASH` with the same folder (SpecForge's dflash2.py says its
  names are SGLang's; SGLang's own DFlash2 loader was not readable, so that command is unverified).

A DeepSpec-convention DFlash (or a DSpark without a sequential head) has no engine method of its own: vLLM's
`dflash` path refuses `sample_from_anchor`, and both `dspark` paths require markov_rank > 0. It is written as
`Qwen3DSparkModel` with a rank-1 Markov head whose weights are zero: the transition bias is exactly 0, so every
draft and probability equals the original's (pdraft loads the export back and decodes identically; tested).
Conversions that would change behaviour are refused with the reason: an MoE backbone or denoise_steps > 1
(the engines build a dense Qwen3 MLP and run one backbone pass), gated/RNN heads on vLLM, a DeepSpec-
convention DFlash or any DSpark as z-lab DFlash (slot j predicts anchor + j + 1 there, anchor + j in z-lab).

Which layout and method a drafter gets is its family's decision (FamilySpec.plan, in each family's folder);
this module applies the checks every family shares, writes the folder and prints the command."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
from dataclasses import dataclass
from pathlib import Path

import torch

from pdraft.calibration_files import read_calibration
from pdraft.errors import PdraftError
from pdraft.layer_ids import check_layer_ids
from pdraft.policies.cost import SpsTable
from pdraft.models.checkpoint import load_drafter, tensors_to_bytes
from pdraft.models.families import FAMILIES, config_to_json, layout
from pdraft.models.formats import EnginePlan
from pdraft import ledger
from pdraft.io_plan import Input, Output, check_io
from pdraft.paths import RESOLVED_NAME, atomic_write_text, read_regular, regular_file_inside, staged_dir
from pdraft.recipe import read_resolved
from pdraft.typed_yaml import MAX_RECIPE_BYTES

FORMATS = ("vllm", "sglang", "zlab-dflash", "gguf")  # gguf: llama.cpp, through its converter (pdraft.hub.gguf)
TARGET_PLACEHOLDER = "<TARGET_MODEL>"
SGLANG_STS_NAME, SGLANG_SPS_NAME = "sglang_sts.json", "sglang_sps_table.json"
CALIBRATION_GLOBS = ("calibration.json", "sts.json", "*calibration*.json", "*sts*.json")
SPS_GLOBS = ("sps_table.json", "*sps*.json")


@dataclass
class Exported:
    path: Path
    fmt: str
    files: list[str]
    command: str
    notes: list[str]

    def to_dict(self) -> dict:
        return {"path": str(self.path), "format": self.fmt, "files": self.files, "command": self.command,
                "notes": self.notes}


def find_one(folder: Path, patterns) -> Path | None:
    """First file matching the patterns in order (exact names first); None if none does."""
    for pat in patterns:
        hits = sorted(p for p in folder.glob(pat) if p.is_file() and p.name not in ("config.json",))
        hits = [p for p in hits if p.name not in (SGLANG_STS_NAME, SGLANG_SPS_NAME) or pat == p.name]
        if hits:  # a link is refused, never followed: it could point at a token file outside the folder
            return regular_file_inside(folder, hits[0].name, what="drafter folder")
    return None


def plan(cfg, fmt: str) -> EnginePlan:
    """The layout and method for `fmt`, or a one-line PdraftError saying why the engine cannot run it as trained:
    first what no engine runs for any family, then the family's own plan."""
    if fmt not in FORMATS:
        raise PdraftError(f"unknown export format {fmt!r}: expected one of {', '.join(FORMATS)}")
    engine = {"vllm": "vLLM", "sglang": "SGLang", "zlab-dflash": "z-lab DFlash"}[fmt]
    try:  # a drafter pdraft wrote before the rule may read the last layer; decode runs it, no engine can
        check_layer_ids(cfg.target_layer_ids, cfg.num_target_layers, legacy_last=False)
    except PdraftError as e:
        raise PdraftError(f"cannot export to {engine}: {e.message}", hint="retrain the drafter with "
                          "target.layer_ids below the last layer") from None
    if getattr(cfg, "denoise_steps", 1) > 1:  # the parallel backbone's settings (pdraft.models.dflash.config)
        raise PdraftError(f"cannot export to {engine}: the drafter was trained with denoise_steps="
                          f"{cfg.denoise_steps} and the engine runs one backbone pass per proposal, which would "
                          f"draft differently from training")
    if getattr(cfg, "is_moe", False):
        raise PdraftError(f"cannot export to {engine}: the drafter has a mixture-of-experts backbone "
                          f"({cfg.num_experts} experts) and the engine's drafter builds a dense Qwen3 MLP")
    return FAMILIES.of(cfg).plan(cfg, fmt)


def _export_tensors(drafter, cfg, p: EnginePlan) -> tuple[dict, dict]:
    """(config.json dict, tensors) for plan `p`: the layout's config.json and the drafter's weights, completed
    with what the engine needs beyond the layout (p.complete: config fields, all-zero weights)."""
    data = config_to_json(cfg, p.layout)
    # Under the layout's own weight names (a draft vocabulary's head is `lm_head` there); tensors_to_bytes detaches
    # and copies to the CPU, nothing mutates them.
    written = layout(p.layout)
    tensors = {written.file_name(k): v for k, v in drafter.state_dict().items()}
    dtype = next(drafter.parameters()).dtype
    data["torch_dtype"] = str(dtype).removeprefix("torch.")
    for name, shape in (p.complete(data, cfg) if p.complete else {}).items():
        tensors[name] = torch.zeros(shape, dtype=dtype)
    return data, tensors


def _sglang_sts(src: Path, block_size: int, notes: list[str]) -> bytes:
    """The calibration in SGLang's DSparkStsCalibration layout (temperatures, dataset, num_samples, ece_before,
    ece_after; python/sglang/srt/speculative/dspark_components/dspark_sts.py, a msgspec struct whose ECE lists
    are list[float] defaulting to []), read by the schema decode reads it with (pdraft.calibration_files), so a
    file decode refuses is never exported; refuses files SGLang would apply to the wrong positions."""
    cal = read_calibration(src)
    temps = list(cal.temperatures)
    if len(temps) != block_size:
        raise PdraftError(f"{src} has {len(temps)} temperatures but SGLang applies one per drafted position "
                          f"(gamma = block_size = {block_size})", hint="calibrate with gamma equal to the block size")
    out = {"temperatures": temps, "dataset": cal.dataset, "num_samples": cal.num_samples}
    for key in ("ece_before", "ece_after"):
        values = getattr(cal, key)
        if values is None:
            continue
        # calibrate/sts.py writes null ECE for a position without samples. SGLang only reports these lists (the
        # temperatures drive decoding) and would refuse a null in list[float]; writing 0 or NaN would state a
        # measurement nobody made, so a list with a gap is left out (SGLang's default []) and said so.
        if all(x is not None for x in values):
            out[key] = list(values)
        else:
            notes.append(f"{key} not exported: position(s) {[i for i, x in enumerate(values) if x is None]} of "
                         f"{src.name} had no samples (null ECE), and SGLang reads the list as numbers only")
    return (json.dumps(out, indent=2, allow_nan=False) + "\n").encode()


def _sglang_sps(src: Path) -> bytes:
    """The cost table in SGLang's SpsCostTable layout, read by the schema decode reads it with
    (pdraft.policies.cost), with the invariant SGLang's __post_init__ adds (max_batch_tokens covers the
    largest probe)."""
    table = SpsTable.load(src, inside="drafter folder")
    xs, ys, top = table.batch_tokens, table.steps_per_sec, table.max_batch_tokens
    if top < xs[-1]:
        raise PdraftError(f"{src}: SGLang needs max_batch_tokens >= the largest probe ({xs[-1]}), found {top}")
    return (json.dumps({"sample_batch_tokens": xs, "sample_steps_per_sec": ys, "max_batch_tokens": top},
                       indent=2, allow_nan=False) + "\n").encode()


def resolved_of(folder: Path) -> tuple[bytes, dict] | None:
    """(bytes, parsed) of the drafter's recipe.resolved.yaml, read by the recipe's own schema (pdraft.recipe.
    read_resolved: one line for a file that is not a recipe); None when the folder has none."""
    if not (folder / RESOLVED_NAME).is_file():
        return None
    blob = read_regular(folder, RESOLVED_NAME, what="drafter folder", limit=MAX_RECIPE_BYTES)
    return blob, read_resolved(blob, f"{folder / RESOLVED_NAME}").model_dump(mode="json")


def recipe_target(recipe) -> str:
    """target_of for an already parsed recipe: a local folder (absolute), the embedded target's cache folder when
    it has been built (both hold a plain Qwen3 config.json + safetensors an engine loads), or a Hub id; the
    placeholder only when none of these resolves."""
    target = str((recipe.get("target") or {}).get("id") or "")
    if not target:
        return TARGET_PLACEHOLDER
    if target.startswith("builtin:"):
        from pdraft.targets.builtin.cache import normalise_name, target_dir

        try:
            folder = target_dir(normalise_name(target.removeprefix("builtin:")))
        except Exception:  # noqa: BLE001 - an unknown name: nothing an engine could load
            return TARGET_PLACEHOLDER
        return str(folder) if (folder / "config.json").is_file() else TARGET_PLACEHOLDER
    local = Path(target).expanduser()
    if (local / "config.json").is_file():
        return str(local.resolve())
    if "/" in target and not local.is_absolute() and not target.startswith("."):
        return target  # a Hub id
    return TARGET_PLACEHOLDER


def check_export_target(cfg, tgt: str) -> None:
    """The one place export knows the target: where `tgt` (--target, else the recipe's) is a local folder, the
    drafter's feature layers must be layers that target has, below its last (the engine captures them from it;
    plan() checked them only against the depth the drafter records, which a foreign or edited config may not
    hold), and the drafter must fit it (pdraft.models.dims.check_fits_target). A Hub id or the placeholder is not
    read: export reaches no network."""
    folder = Path(tgt).expanduser()
    if tgt == TARGET_PLACEHOLDER or not (folder / "config.json").is_file():
        return
    from pdraft.models.dims import check_fits_target, target_dims
    from pdraft.targets.loader import read_target_config

    target_config = read_target_config(folder, tgt)
    try:
        check_layer_ids(cfg.target_layer_ids, target_dims(target_config)["num_target_layers"], legacy_last=False)
        check_fits_target(cfg, target_config)
    except PdraftError as e:
        raise PdraftError(f"cannot export for the target {tgt}: {e.message}", hint="export with the target the "
                          "drafter was trained on (--target), or retrain it for this one") from None


# SGLang's verify mode is an environment variable, not a flag: SGLANG_RAGGED_VERIFY_MODE, read by
# python/sglang/srt/speculative/ragged_verify.py (read_ragged_verify_mode: static | cap-accept | compact, default
# static). python/sglang/srt/models/dspark.py (build_confidence_head) builds no confidence head in static mode, so
# the STS file and SPS table do nothing there; in the other two modes it builds the head whatever the config's
# enable_confidence_head says (that field is only checked for presence) and then needs its weights.
SGLANG_VERIFY_ENV = "SGLANG_RAGGED_VERIFY_MODE"
SGLANG_CONFIDENCE_MODE = "compact"  # verifies only the scheduled prefix (cap-accept runs the full block)


def serve_command(p: EnginePlan, model: str, target: str, sts: str | None = None, sps: str | None = None,
                  confidence: bool = False) -> str:
    """The command that serves `model` as plan `p` says; for SGLang DSPARK, `confidence` (the drafter has a
    confidence head) selects the confidence-driven verify mode, otherwise the static mode that needs no head."""
    q = shlex.quote
    if p.fmt == "vllm":
        spec = json.dumps({"method": p.method, "model": model, "num_speculative_tokens": p.num_speculative})
        return f"vllm serve {q(target)} --speculative-config {q(spec)}"
    algo = p.method
    cmd = (f"python -m sglang.launch_server --model-path {q(target)} --speculative-algorithm {algo} "
           f"--speculative-draft-model-path {q(model)}")
    if algo == "DSPARK":
        mode = SGLANG_CONFIDENCE_MODE if confidence else "static"
        cmd = f"{SGLANG_VERIFY_ENV}={mode} {cmd} --speculative-dspark-block-size {p.num_speculative}"
        if confidence and sts:
            cmd += f" --speculative-dspark-confidence-sts-path {q(sts)}"
        if confidence and sps:
            cmd += f" --speculative-dspark-sps-table-path {q(sps)}"
    if p.flags:  # what the method needs beyond the draft model (EAGLE3: a chain of num_speculative steps)
        cmd += " " + " ".join(q(f) for f in p.flags)
    return cmd


def export_gguf(drafter_dir: str | os.PathLike, out: str | os.PathLike, *, target: str | None) -> Exported:
    """Write `drafter_dir` as `out`/drafter.gguf: the family's source export (FamilySpec.llamacpp.source: z-lab's
    folder for DFlash, whose plan refuses what it must; vLLM's layout for EAGLE-3), its config.json adjusted where
    the converter reads otherwise (llamacpp.prepare), through llama.cpp's own converter, the written fields read
    back against the drafter (pdraft.hub.gguf.check_written)."""
    import tempfile

    from pdraft.engines.llamacpp import convert_hf, read_fields
    from pdraft.hub.gguf import DRAFTER_NAME, architecture, check_written, written_kinds
    from pdraft.models.families import FAMILIES

    src = Path(drafter_dir)
    cfg = load_drafter(src).config
    served = FAMILIES.get(cfg.kind).llamacpp
    if architecture(cfg.kind) is None:
        why = served.unwritten if served is not None and served.unwritten else "llama.cpp serves no such drafter"
        raise PdraftError(f"cannot export a {cfg.kind} drafter to GGUF yet ({', '.join(written_kinds())} only, issue "
                          f"58): {why}", hint="use --format vllm")
    resolved = resolved_of(src)
    tgt = target or (recipe_target(resolved[1]) if resolved else TARGET_PLACEHOLDER)
    target_dir = Path(tgt).expanduser()
    if not (target_dir / "config.json").is_file():
        raise PdraftError(f"GGUF export needs the target's folder for its tokenizer (--target-model-dir), got "
                          f"{tgt!r}", hint="pass --target with the target's Hugging Face folder")
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise PdraftError(f"{out} is not empty", hint="give a new or empty folder")
    n_draft = FAMILIES.get(cfg.kind).plan(cfg, served.source).num_speculative
    with tempfile.TemporaryDirectory(prefix="pdraft-gguf-") as tmp:
        hf = export(src, served.source, Path(tmp) / "hf", target=str(target_dir))  # its plan refuses what it must
        if served.prepare is not None:
            config = hf.path / "config.json"
            atomic_write_text(config, json.dumps(served.prepare(json.loads(config.read_text()), cfg), indent=2))
        out.mkdir(parents=True, exist_ok=True)
        gguf_file = out / DRAFTER_NAME
        convert_hf(hf.path, gguf_file, outtype="f32", target_dir=target_dir.resolve())
    try:
        check_written(read_fields(gguf_file), cfg)
    except PdraftError:
        gguf_file.unlink()
        raise
    command = (f"llama-server -m <TARGET_GGUF> -md {gguf_file} --spec-type {served.spec_type} "
               f"--spec-draft-n-max {n_draft}")
    notes = [f"target layers {[i + 1 for i in cfg.target_layer_ids]} in llama.cpp's numbering (each layer's input)",
             "serve it over the target's own GGUF (convert a Hugging Face target with pdraft.engines.llamacpp.convert_target)"]
    return Exported(path=out, fmt="gguf", files=[DRAFTER_NAME], command=command, notes=notes)


def export(drafter_dir: str | os.PathLike, fmt: str, out: str | os.PathLike, *, target: str | None = None) -> Exported:
    """Write `drafter_dir` in the layout `fmt` loads into `out` (a new or empty folder; written in a temporary
    folder and renamed, like pull) and return the exact serve command."""
    src = Path(drafter_dir)
    check_io("export", [Input("the drafter", src)], [Output("--out", Path(out), "folder")])
    if fmt == "gguf":  # written by llama.cpp's own converter from the z-lab folder (export_gguf)
        return export_gguf(src, out, target=target)
    drafter = load_drafter(src)  # validates names, shapes and checksums
    cfg = drafter.config
    p = plan(cfg, fmt)
    resolved = resolved_of(src)
    tgt = target or (recipe_target(resolved[1]) if resolved else TARGET_PLACEHOLDER)
    check_export_target(cfg, tgt)
    data, tensors = _export_tensors(drafter, cfg, p)
    extra: dict[str, bytes] = {}
    if resolved is not None:
        extra[RESOLVED_NAME] = resolved[0]
    cal, sps = find_one(src, CALIBRATION_GLOBS), find_one(src, SPS_GLOBS)
    if fmt == "sglang" and p.method == "DSPARK":
        if cal is not None and cfg.has_confidence:
            extra[SGLANG_STS_NAME] = _sglang_sts(cal, cfg.block_size, p.notes)
        elif cal is not None:
            p.notes.append(f"{cal.name} ignored: the drafter has no confidence head to calibrate")
        if sps is not None:
            extra[SGLANG_SPS_NAME] = _sglang_sps(sps)
    elif cal is not None or sps is not None:
        p.notes.append("calibration/cost-table files are not read by this engine's loader and were not exported")
    with staged_dir(out) as (out, tmp):
        ledger.write_bytes(tmp / "model.safetensors", tensors_to_bytes(tensors))
        ledger.write_text(tmp / "config.json", json.dumps(data, indent=2, sort_keys=True) + "\n")
        for name, blob in extra.items():
            ledger.write_bytes(tmp / name, blob)
    files = sorted(p_.name for p_ in out.iterdir() if p_.name != ledger.LEDGER_NAME)
    sts_path = str(out / SGLANG_STS_NAME) if SGLANG_STS_NAME in files else None
    sps_path = str(out / SGLANG_SPS_NAME) if SGLANG_SPS_NAME in files else None
    if p.served_as:  # a format no engine calls its own (z-lab's folder): the engines that load it
        command = "\n".join(serve_command(dataclasses.replace(p, fmt=f, method=m), str(out), tgt) for f, m in p.served_as)
    else:
        command = serve_command(p, str(out), tgt, sts_path, sps_path, confidence=cfg.has_confidence)
    if fmt == "sglang" and p.method == "DSPARK" and not cfg.has_confidence:
        p.notes.append(f"no confidence head: served in SGLang's static verify mode ({SGLANG_VERIFY_ENV}=static); "
                       f"its cap-accept/compact modes build a confidence head and would fail on the missing "
                       f"weights")
    if tgt == TARGET_PLACEHOLDER:
        p.notes.append(f"replace {TARGET_PLACEHOLDER} with the target's Hub id or folder (the recipe's target is "
                       f"not one an engine can load)")
    return Exported(path=out, fmt=fmt, files=files, command=command, notes=p.notes)
