"""Training checkpoints that survive a kill at any moment.

A run folder holds ``step_N/`` folders and a ``latest`` file naming the newest complete one. Each
``step_N/`` is a loadable drafter (``config.json`` + ``model.safetensors`` + the resolved recipe) plus
``trainer_state.safetensors`` (optimizer and scheduler tensors) and ``trainer_state.json`` (step, data
position, RNG states, metrics). The training loop hands in the optimizer state gathered to full tensors and
keyed by parameter name, so a checkpoint loads at any world size (`pdraft.train.distributed`). A checkpoint is written into a temporary folder, fsynced, and renamed into
place; only then is ``latest`` replaced (also atomically). A kill, or a full disk, at any point therefore
leaves the previous checkpoint and ``latest`` untouched. Optimizer state is stored with safetensors and
JSON, never pickle, so resuming never unpickles anything.

Every folder written here carries pdraft's ownership marker (pdraft.paths.OWNED_MARKER) and lists the files
it holds in its ledger (pdraft.ledger), as does the run folder for `latest`. Nothing here deletes a folder
that lacks the marker, nor one holding anything its ledger does not list (a user's notes put into `final/`):
replacing such a folder is refused in one line, and pruning leaves it alone (what `train --fresh` removes is
decided in pdraft.train.fresh, with `foreign_entries`). What resuming reads back (`latest`, trainer_state.json)
goes through pdraft.readback, the state by its schema (`TRAINER_STATE`). The module depends on nothing but
torch, safetensors, pydantic, pdraft.paths, pdraft.readback and pdraft.ledger, so any training loop can use it:
the drafter's (pdraft.train) and the embedded target's build (pdraft.targets.builtin).
"""

from __future__ import annotations

import errno
import json
import os
import random
import re
import shutil
from pathlib import Path
from typing import Annotated, Any

import torch
from pydantic import Field
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from pdraft import ledger
from pdraft.errors import PdraftError
from pdraft.paths import OWNED_MARKER, fresh_dir, fsync_dir, is_owned, make_dir, mark_owned
from pdraft.readback import FileKind, Schema, load, read_text

LATEST = "latest"
STATE_TENSORS = "trainer_state.safetensors"
STATE_JSON = "trainer_state.json"
_COUNT = 1 << 62
_Byte = Annotated[int, Field(ge=0, le=255)]


class _Rng(Schema):
    python: list[Any] = Field(min_length=3, max_length=3)  # random.getstate(): (version, state, gauss)
    torch: list[_Byte] = Field(max_length=1 << 20)
    cuda: list[list[_Byte]] | None = Field(None, max_length=4096)


class _DataPosition(Schema):
    model_config = {**Schema.model_config, "extra": "forbid"}  # handed to DataCursor as keyword arguments

    epoch: int = Field(0, ge=0, le=_COUNT)
    index: int = Field(0, ge=0, le=_COUNT)


class _Optimizer(Schema):
    state: dict[str, dict[str, dict[str, Any]]]
    param_groups: list[dict[str, Any]] = Field(max_length=1 << 16)


class TrainerState(Schema):
    """trainer_state.json, what resuming reads: the step, the optimizer's tensor index and hyper-parameters,
    the scheduler, the random streams and the data position, typed and in range."""

    step: int = Field(ge=0, le=_COUNT)
    optimizer: _Optimizer
    scheduler: dict[str, Any] | None = None
    rng: _Rng
    data: _DataPosition | None = None  # the drafter trainer's data position (the embedded target's build keeps none)
    world_size: int | None = Field(None, ge=1, le=1 << 20)
    global_batch: int | None = Field(None, ge=1, le=_COUNT)


TRAINER_STATE = FileKind("trainer state", 64 << 20, TrainerState)
FINAL = "final"
METRICS_LOG = "metrics.jsonl"
_STEP = re.compile(r"^step_[0-9]+$")
_TMP = re.compile(r"^\.tmp_(step_[0-9]+|final)$")
# What pdraft writes into a checkpoint or final folder (save_drafter, save_checkpoint, calibrate-threshold), for a
# folder an older pdraft wrote before it kept a ledger; `calibration/` is calibrate-threshold's figures folder.
LEGACY_NAMES = frozenset({"config.json", "model.safetensors", "recipe.resolved.yaml", STATE_TENSORS, STATE_JSON,
                          "confidence_sts.json", "sps_table.json"})
LEGACY_FOLDERS = {"calibration": frozenset({"reliability.png", "threshold_sweep.png", "sps.png", "rounds.json",
                                            "report.json", "recipe.resolved.yaml"})}


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "torch": torch.get_rng_state().tolist()}
    if torch.cuda.is_available():
        state["cuda"] = [s.tolist() for s in torch.cuda.get_rng_state_all()]
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    try:  # the schema checked the types it can; the generators check the rest of what they are handed
        py = state["python"]
        random.setstate((py[0], tuple(py[1]), py[2]))
        torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))
        if state.get("cuda") and torch.cuda.is_available():
            torch.cuda.set_rng_state_all([torch.tensor(s, dtype=torch.uint8) for s in state["cuda"]])
    except (TypeError, ValueError, RuntimeError) as e:
        raise PdraftError(f"the checkpoint's random state is damaged ({type(e).__name__}: {str(e)[:80]})",
                          hint="rerun with --fresh") from None


def _flatten_optimizer(opt_state: dict) -> tuple[dict[str, torch.Tensor], dict]:
    """Split an optimizer state_dict into tensors (for safetensors) and plain JSON metadata."""
    tensors: dict[str, torch.Tensor] = {}
    meta_state: dict[str, dict] = {}
    for pid, pstate in opt_state["state"].items():
        meta_state[str(pid)] = {}
        for key, value in pstate.items():
            if torch.is_tensor(value):
                tensors[f"opt.{pid}.{key}"] = value.detach().contiguous().cpu()
                meta_state[str(pid)][key] = {"tensor": f"opt.{pid}.{key}"}
            else:
                meta_state[str(pid)][key] = {"value": value}
    return tensors, {"state": meta_state, "param_groups": opt_state["param_groups"]}


def _unflatten_optimizer(tensors: dict[str, torch.Tensor], meta: dict) -> dict:
    state = {}
    for pid, pstate in meta["state"].items():
        # Parameter names (world-size independent state) stay strings; positions (older checkpoints) are ints.
        state[int(pid) if pid.isdigit() else pid] = {k: (tensors[v["tensor"]] if "tensor" in v else v["value"]) for k, v in pstate.items()}
    return {"state": state, "param_groups": meta["param_groups"]}


def save_checkpoint(run_dir: str | Path, step: int, write_model, optimizer, scheduler, extra: dict[str, Any],
                    keep: int = 2) -> Path:
    """Write ``run_dir/step_{step}`` atomically, point ``latest`` at it, prune older ones beyond `keep`.

    `write_model(folder)` writes the loadable drafter (config, weights, resolved recipe) into `folder`.
    `optimizer` is an optimizer or an optimizer state dict (the gathered one of a distributed run)."""
    run_dir = make_dir(run_dir, "run folder")
    final = run_dir / f"step_{step}"
    tmp = run_dir / f".tmp_step_{step}"
    try:
        fresh_dir(tmp)  # a killed writer's temporary is removed; a link at its name is refused
        mark_owned(tmp)
        write_model(tmp)
        tensors, opt_meta = _flatten_optimizer(optimizer if isinstance(optimizer, dict) else optimizer.state_dict())
        ledger.write_with(tmp / STATE_TENSORS, lambda p: save_file(tensors, str(p)))
        state = {"step": step, "optimizer": opt_meta, "scheduler": scheduler.state_dict() if scheduler else None,
                 "rng": rng_state(), **extra}
        ledger.write_text(tmp / STATE_JSON, json.dumps(state))  # every file is fsynced as it is written
        ledger.record_folder(tmp)  # what `write_model` wrote by name into this new folder is pdraft's too
        fsync_dir(tmp)
        _remove_owned(final)
        os.replace(tmp, final)
        fsync_dir(run_dir)
    except BaseException as e:
        if not tmp.is_symlink():
            shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):  # the user's disk, not a bug
            kept = _kept_pointer(run_dir)
            raise PdraftError(f"disk full while writing checkpoint {final.name} in {run_dir} ({e.strerror}); "
                              + (f"the previous checkpoint {kept} is intact" if kept else "no checkpoint was kept"),
                              hint="free some space and rerun the same command to resume") from None
        raise
    ledger.write_text(run_dir / LATEST, final.name + "\n")
    _prune(run_dir, keep, final.name)
    return final


def _prune(run_dir: Path, keep: int, newest: str) -> None:
    steps = sorted((p for p in run_dir.glob("step_*") if p.is_dir() and p.name[5:].isdigit()),
                   key=lambda p: int(p.name[5:]))
    for old in steps[: max(0, len(steps) - keep - 1)]:
        if old.name != newest and is_owned(old) and not foreign_entries(old):  # else kept: not all of it is ours
            shutil.rmtree(old, ignore_errors=True)


def foreign_entries(folder: str | Path, legacy: frozenset = LEGACY_NAMES) -> list[str]:
    """The paths inside the pdraft-owned `folder` (relative to it) that pdraft did not write there: files its
    ledger does not list, or lists at another size (the ledger's record of each file), and sub-folders without
    a ledger of their own. A folder without a ledger (an older pdraft's) is judged by the names pdraft writes
    there, `legacy`. Empty: the whole folder is pdraft's to delete."""
    folder = Path(folder)
    files = ledger.read_ledger(folder)
    # A checkpoint an older pdraft wrote, calibrated since by this one, has a ledger listing the calibration only.
    older = files is None or not {"config.json", "model.safetensors"} & set(files)
    out = []
    for entry in sorted(os.listdir(folder)):
        path = folder / entry
        if entry in (OWNED_MARKER, ledger.LEDGER_NAME):
            continue
        if path.is_dir() and not path.is_symlink():
            if ledger.read_ledger(path) is not None or (files is None and entry in LEGACY_FOLDERS):
                out += [f"{entry}/{inner}" for inner in foreign_entries(path, LEGACY_FOLDERS.get(entry, frozenset()))]
            else:
                out.append(f"{entry}/")
        elif files is not None and entry in files:
            if files[entry].get("bytes", os.lstat(path).st_size) != os.lstat(path).st_size:
                out.append(entry)  # not what pdraft wrote there any more
        elif not older or entry not in legacy or path.is_symlink():
            out.append(entry)
    return out


def check_replaceable(folder: str | Path) -> None:
    """Refuse, in one line, to replace or delete `folder` unless pdraft wrote it and everything in it."""
    folder = Path(folder)
    if not os.path.lexists(folder):
        return
    if not is_owned(folder):
        raise PdraftError(f"{folder} exists but was not written by pdraft (it has no {OWNED_MARKER} "
                          f"marker); refusing to replace it", hint="move it elsewhere and rerun")
    foreign = foreign_entries(folder)
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise PdraftError(f"{folder} holds files pdraft did not write there ({shown}); refusing to replace it, "
                          f"nothing was deleted", hint="move them elsewhere and rerun")


def _remove_owned(folder: Path) -> None:
    """Delete `folder` so a new one can take its place, only if pdraft wrote it (see the module docstring)."""
    check_replaceable(folder)
    if os.path.lexists(folder):
        shutil.rmtree(folder)


def install_dir(tmp: str | Path, final: str | Path) -> Path:
    """Mark the filled folder `tmp` as pdraft's and rename it to `final`, replacing an older `final` only if
    pdraft wrote that one (a user's folder of the same name is refused, not deleted)."""
    tmp, final = Path(tmp), Path(final)
    mark_owned(tmp)
    ledger.record_folder(tmp)
    _remove_owned(final)
    os.replace(tmp, final)
    fsync_dir(final.parent)
    return final


def _kept_pointer(run_dir: Path) -> str | None:
    """What `latest` names, for the disk-full message only: read within its bound, None when it is unreadable
    (that message is about the disk, not the pointer)."""
    try:
        return read_text(run_dir / LATEST, "the latest pointer", 256, inside="run folder").strip() or None
    except PdraftError:
        return None


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    run_dir = Path(run_dir)
    pointer = run_dir / LATEST
    if not pointer.exists():
        return None
    name = read_text(pointer, "the latest pointer", 256, inside="run folder").strip()
    if not _STEP.match(name):  # `latest` names a checkpoint of this folder, never a path elsewhere
        raise PdraftError(f"{pointer} names {name[:40]!r}, not a checkpoint of this run folder",
                          hint="rerun with --fresh to start over")
    path = run_dir / name
    if not (path / STATE_JSON).exists():
        raise PdraftError(f"{pointer} names {name!r}, which is missing or incomplete", hint="rerun with --fresh to start over")
    return path


def read_trainer_state(ckpt: str | Path) -> tuple[dict[str, Any], dict]:
    """(the JSON state: step, data, rng, scheduler, ...; the optimizer state dict) of a checkpoint."""
    ckpt = Path(ckpt)
    try:  # the JSON state by its schema (size, nesting, types and ranges: pdraft.readback)
        state = load(ckpt / STATE_JSON, TRAINER_STATE, inside="checkpoint").model_dump(exclude_unset=True)
    except PdraftError as e:
        raise PdraftError(f"checkpoint {ckpt} is unreadable: {e.message}", hint="rerun with --fresh") from None
    try:
        tensors = load_file(str(ckpt / STATE_TENSORS))
        return state, _unflatten_optimizer(tensors, state["optimizer"])
    except (OSError, ValueError, KeyError, TypeError, SafetensorError) as e:  # a truncated or damaged state file
        raise PdraftError(f"checkpoint {ckpt} is unreadable ({type(e).__name__})", hint="rerun with --fresh") from None


def load_trainer_state(ckpt: str | Path, optimizer, scheduler) -> dict[str, Any]:
    """Restore optimizer, scheduler and RNG state from a checkpoint; return the JSON state (step, data, ...)."""
    state, opt_state = read_trainer_state(ckpt)
    optimizer.load_state_dict(opt_state)
    if scheduler is not None and state.get("scheduler") is not None:
        scheduler.load_state_dict(state["scheduler"])
    set_rng_state(state["rng"])
    return state
