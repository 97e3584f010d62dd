"""Drafter checkpoints: `config.json` + `model.safetensors` (+ `recipe.resolved.yaml`), read and written in
the layouts the families declare (DeepSpec's `Qwen3DSparkModel`, z-lab's `DFlashDraftModel`, `DFlash2DraftModel`),
so that the reference implementations' checkpoints load here and ours load there. Which layout a config.json is
and how its fields map onto the typed configs is asked of the family registry (pdraft.models.families; each
layout lives in its family's folder, FORMATS.md cites the reference file that reads every field); this module
handles the files. Layer ids mean the same in every layout (id i = hidden_states[i + 1], -1 = the embedding
output), so they are taken as they are and checked by the one rule in `pdraft.layer_ids.check_layer_ids`; a
drafter is checked against its target by the one rule in `pdraft.models.dims.check_fits_target`. No pickle is
ever read and no code from a checkpoint is ever run; written files carry a SHA-256 of their tensor bytes so
corruption anywhere in them is caught at load time."""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from pdraft.errors import PdraftError
from pdraft.models.api import Drafter
from pdraft.models.build import make_drafter
from pdraft.models.dims import check_fits_target
from pdraft.models.families import config_to_json, layout_of, save_layout
from pdraft.models.families import layout as layout_named
from pdraft.models.formats import SHARED_KEYS
from pdraft.models.schema import MAX_CONFIG_BYTES, check_drafter_config
from pdraft.models.tensorfile import index_digest, index_shards, read_header, shapes_of
from pdraft import ledger
from pdraft.paths import RESOLVED_NAME, make_dir
from pdraft.readback import loads, parse_json, read_bytes


# ---- safetensors with a checksum --------------------------------------------------------------------------
def _data_section(blob: bytes) -> tuple[dict, bytes]:
    if len(blob) < 8:
        raise ValueError("file shorter than the safetensors header length")
    (n,) = struct.unpack("<Q", blob[:8])
    if 8 + n > len(blob):
        raise ValueError("header runs past the end of the file")
    return loads(blob[8 : 8 + n]), blob[8 + n :]


def tensors_to_bytes(tensors: dict[str, torch.Tensor]) -> bytes:
    """safetensors bytes carrying two checksums: of the tensor bytes (`pdraft_sha256`) and of the header's
    tensor index (`pdraft_index_sha256`: names, dtypes, shapes, offsets), so an edited header is caught too."""
    tensors = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    header, data = _data_section(st_save(tensors, metadata={"format": "pt"}))
    meta = {"format": "pt", "pdraft_sha256": hashlib.sha256(data).hexdigest(), "pdraft_index_sha256": index_digest(header)}
    return st_save(tensors, metadata=meta)  # metadata changes the header's length, never the data offsets


def read_safetensors(path: Path, header: dict | None = None) -> dict[str, torch.Tensor]:
    """All tensors of one file; any damage becomes a one-line PdraftError. The header is checked against the
    file first (pdraft.models.tensorfile), so only a file whose length the header accounts for is read."""
    try:
        header = header if header is not None else read_header(path)[0]
        blob = path.read_bytes()
        _, data = _data_section(blob)
        tensors = st_load(blob)
    except PdraftError:
        raise
    except Exception as err:  # safetensors raises its own error type; json and struct raise theirs
        raise PdraftError(f"cannot read {path}: truncated or corrupted safetensors ({err})") from None
    meta = header.get("__metadata__") or {}
    digest = meta.get("pdraft_sha256")
    if digest is not None and hashlib.sha256(data).hexdigest() != digest:
        raise PdraftError(f"{path} is corrupted: its tensor bytes do not match the checksum written with them")
    index = meta.get("pdraft_index_sha256")
    if index is not None and index_digest(header) != index:
        raise PdraftError(f"{path} is corrupted: its header (tensor names, dtypes, shapes or offsets) does not match "
                          f"the checksum written with it")
    return tensors


def weight_files(path: Path) -> list[Path]:
    single = path / "model.safetensors"
    if single.is_file():
        return [single]
    index = path / "model.safetensors.index.json"
    if index.is_file():  # shard names come from the file: index_shards refuses one pointing outside the folder
        return [path / n for n in index_shards(index)]
    pickles = sorted(p.name for p in path.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".ckpt"))
    if pickles:
        raise PdraftError(f"{path} holds only pickle weights ({', '.join(pickles)}); pdraft loads safetensors only, "
                          f"because unpickling can run arbitrary code", hint="convert them to model.safetensors")
    raise PdraftError(f"{path} has no model.safetensors")


def check_finite(tensors: dict[str, torch.Tensor], where) -> None:
    """Refuse weights holding NaN or infinity, naming the first such tensor: nothing a drafter computes from
    them means anything, and some paths cannot even finish (a DFlash2 selector whose codebooks are NaN walks
    to an index outside its candidates). A published checkpoint carries no checksum of pdraft's and a diverged
    run can save such weights, so every drafter is checked as it loads (one pass over the bytes, as the checksum)."""
    for name, t in tensors.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            bad = int((~torch.isfinite(t)).sum())
            raise PdraftError(f"{where}: weight '{name}' holds {bad} NaN or infinite value(s) of {t.numel()}; "
                              f"the drafter cannot be used", hint="retrain it, or take an earlier checkpoint")


# ---- save / load ------------------------------------------------------------------------------------------
def save_drafter(drafter: Drafter, path: str | os.PathLike, *, layout: str | None = None,
                 include_shared: bool = False, recipe_yaml: str | None = None,
                 state_dict: dict[str, torch.Tensor] | None = None) -> Path:
    """Write config.json + model.safetensors (+ recipe.resolved.yaml). layout: one of the drafter's family's
    layouts ("deepspec" | "zlab" | "dflash2"); by default the family's own choice (DFlash2: dflash2; DFlash:
    zlab for the z-lab convention, else deepspec; DSpark: deepspec). include_shared also stores copies of the
    attached target's embedding and LM head under DeepSpec's names (as DeepSpec's own checkpoints do), for
    loaders that expect them in the file; pdraft itself never reads them back. `state_dict` replaces
    `drafter.state_dict()` (a distributed run hands in the weights gathered from its shards)."""
    cfg = drafter.config
    name = save_layout(cfg, layout)
    written = layout_named(name)
    # Saving checks what loading checks: the config's own rules (a field changed since construction) and the
    # schema load_config runs on the config.json written, so nothing is saved that would be refused at load.
    cfg.validate()
    data = config_to_json(cfg, name)  # before any file: a layout that cannot hold this drafter refuses here
    check_drafter_config(data, "the config.json to write")
    path = make_dir(path, "drafter folder")
    state = dict(drafter.state_dict() if state_dict is None else state_dict)
    drafter.check_weights(state, str(path))  # never write a drafter the loader would refuse
    tensors = {written.file_name(k): v for k, v in state.items()}
    if include_shared or written.needs_shared:
        embed, head = drafter._target()
        for key, mod in zip(SHARED_KEYS, (embed, head)):
            if key not in tensors and (include_shared or key in written.needs_shared):  # never over an own head
                tensors[key] = mod.weight
    data["torch_dtype"] = str(next(drafter.parameters()).dtype).removeprefix("torch.")
    ledger.write_bytes(path / "model.safetensors", tensors_to_bytes(tensors))  # listed for push and --fresh
    ledger.write_text(path / "config.json", json.dumps(data, indent=2, sort_keys=True) + "\n")
    if recipe_yaml is not None:
        ledger.write_text(path / RESOLVED_NAME, recipe_yaml)
    return path


def load_config(path: str | os.PathLike, target_config=None):
    """The typed config of the drafter checkpoint folder `path`, of the family its config.json is in; with
    `target_config`, what the file leaves to the target (an EAGLE release's feature layers) is taken from it."""
    return _read_config(path, target_config)[1]


def _read_config(path: str | os.PathLike, target_config=None):
    """(the layout of the folder's config.json, the typed config)."""
    cfg_path = Path(path) / "config.json"
    if not cfg_path.is_file():
        raise PdraftError(f"{path} is not a drafter checkpoint: no config.json")
    # Within its size limit and nesting bound, then the schema's types and ranges, before any field is converted.
    data = parse_json(read_bytes(cfg_path, "drafter config", MAX_CONFIG_BYTES), str(cfg_path))
    if not isinstance(data, dict):
        raise PdraftError(f"{cfg_path} does not hold a JSON object")
    check_drafter_config(data, str(cfg_path))
    known = layout_of(data, str(cfg_path))
    if target_config is not None:
        data = known.with_target(data, target_config)
    return known, known.from_json(data, str(cfg_path))


def load_drafter(path: str | os.PathLike, target_config=None, *, dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "cpu") -> Drafter:
    """Load a drafter checkpoint of any family pdraft knows, written by pdraft or in a published layout (the
    family from config.json). With `target_config`, every size is checked against the target first. Call
    `attach_target` on the result before drafting."""
    path = Path(path)
    if not path.is_dir():
        raise PdraftError(f"drafter checkpoint folder {path} does not exist")
    known, cfg = _read_config(path, target_config)
    if target_config is not None:
        check_fits_target(cfg, target_config)
    # Names and shapes from the headers against those of the config, built on the meta device (no memory),
    # before a byte of weights is read or a real module allocated.
    headers = [(f, read_header(f)[0]) for f in weight_files(path)]
    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in make_drafter(cfg).state_dict().items()}

    def name_of(key: str) -> str | None:
        """The module name of a file's weight; None for a copy of the target's that the drafter does not have
        (DeepSpec stores them; an own head, EAGLE-3's or a draft vocabulary's, is the drafter's own)."""
        mine = known.module_name(key)
        return None if mine not in expected and key in SHARED_KEYS else mine

    found: dict[str, tuple[int, ...]] = {}
    for _, header in headers:
        found.update({name_of(k): v for k, v in shapes_of(header).items()})
    found.pop(None, None)
    for name, want in expected.items():
        if name not in found:
            raise PdraftError(f"{path}: weight '{name}' is missing from the checkpoint")
        if found[name] != want:
            raise PdraftError(f"{path}: weight '{name}' has shape {found[name]}, the config implies {want}")
    extra = sorted(set(found) - set(expected))
    if extra:
        raise PdraftError(f"{path}: unexpected weight '{extra[0]}' ({len(extra)} unexpected in all); the config "
                          f"does not describe this checkpoint")
    tensors: dict[str, torch.Tensor] = {}
    for f, header in headers:
        tensors.update({name_of(k): v for k, v in read_safetensors(f, header).items()})
    tensors.pop(None, None)
    check_finite(tensors, path)
    drafter = make_drafter(cfg)
    drafter.check_weights(tensors, str(path))  # before load_state_dict, which would cast a float map silently
    drafter.load_state_dict(tensors, strict=True)
    return drafter.to(device=device, dtype=dtype)


__all__ = ["save_drafter", "load_drafter", "load_config", "read_safetensors", "weight_files", "check_finite"]
