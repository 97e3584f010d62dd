"""What `pdraft train --fresh` removes from a run folder: the checkpoints, `latest`, metrics log and final
drafter pdraft wrote (recognised by name and by pdraft's ownership marker), and, inside each of those
folders, only what pdraft wrote there (the files its ledger lists: pdraft.run_folder.foreign_entries). A
hidden-state cache sharing the folder is left alone; a run folder holding anything else, a checkpoint or
final folder holding a file pdraft did not write there (a user's notes put into `final/`), or the working
folder itself, is refused with one line before anything is deleted."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from pdraft.cache import format as fmt
from pdraft.errors import PdraftError
from pdraft.locks import LOCK_NAME
from pdraft.paths import is_owned, is_working_folder
from pdraft.recipe import RESOLVED_NAME
from pdraft.ledger import LEDGER_NAME, forget
from pdraft.run_folder import _STEP, _TMP, FINAL, LATEST, METRICS_LOG, foreign_entries


def _cache_entry(folder: Path, name: str) -> bool:
    """A hidden-state cache's file at the top of `folder`, or a subfolder holding a cache (`hidden/` when
    train.output_dir is the recipe's output_dir): left alone by --fresh, never deleted nor refused."""
    if name == fmt.MANIFEST_NAME or name.startswith(fmt.TMP_PREFIX) or \
            (name.startswith("shard-") and name.endswith(".safetensors")):
        return True
    if name == RESOLVED_NAME:  # export-hidden saves its resolved recipe beside the manifest
        return _cache_entry(folder, fmt.MANIFEST_NAME) and (folder / fmt.MANIFEST_NAME).is_file()
    manifest = folder / name / fmt.MANIFEST_NAME
    try:
        data = fmt.parse_manifest(manifest) if manifest.is_file() else None
    except PdraftError:
        return False
    return isinstance(data, dict) and data.get("format") == fmt.FORMAT_NAME


def clear_run(run_dir: str | Path, world=None) -> list[str]:
    """`train --fresh`: delete the checkpoints, `latest`, metrics log and final drafter pdraft wrote in
    `run_dir`, and nothing else; returns the names removed. Refused with one line, before anything is
    deleted, when the folder is the working folder (or above it) or holds an entry pdraft did not write
    there. Hidden-state cache files (a cache sharing the folder) are left untouched. With a distributed
    `world`, every rank checks (so all refuse alike) before the main rank deletes."""
    ours = _owned_entries(Path(run_dir))
    if world is not None:
        world.barrier()
    if world is None or world.is_main:
        for entry in sorted(ours, key=lambda e: e != LATEST):  # `latest` first: it must never name a deleted step
            path = Path(run_dir) / entry
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
            forget(path)
    if world is not None:
        world.barrier()
    return ours


def _owned_entries(run_dir: Path) -> list[str]:
    if not os.path.lexists(run_dir):
        return []
    if is_working_folder(run_dir):
        raise PdraftError(f"--fresh would clear {run_dir}, the working folder (or a folder above it or the home "
                          f"folder); refusing", hint="set train.output_dir to a folder of its own, e.g. runs/NAME")
    if run_dir.is_symlink() or not run_dir.is_dir():
        raise PdraftError(f"train.output_dir {run_dir} is not a plain folder (a file or a link); refusing --fresh")
    ours, foreign = [], []
    for entry in sorted(os.listdir(run_dir)):
        path = run_dir / entry
        if entry in (LOCK_NAME, LEDGER_NAME) or _cache_entry(run_dir, entry):
            continue
        if _STEP.match(entry) or entry == FINAL:
            if not is_owned(path):
                foreign.append(entry)
                continue
            inside = foreign_entries(path)
            (foreign.extend(f"{entry}/{e}" for e in inside) if inside else ours.append(entry))
        elif _TMP.match(entry) and path.is_dir() and not path.is_symlink():
            ours.append(entry)  # a killed writer's temporary: it may predate the marker
        elif entry in (LATEST, METRICS_LOG) and path.is_file() and not path.is_symlink():
            ours.append(entry)
        else:
            foreign.append(entry)
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise PdraftError(f"--fresh refused: {run_dir} holds entries pdraft did not write there ({shown}); nothing "
                          f"was deleted", hint="move them elsewhere, or give the run its own train.output_dir")
    return ours
