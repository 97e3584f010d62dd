"""The files that travel with a drafter's config and weights, which push uploads and pull copies: the resolved
recipe, the STS calibration, the SPS cost table and the bench report. Which kind a file is follows from its
name (the globs of pdraft.hub.export and pdraft.hub.card, exact names first), and each kind is read by the one
schema every other reader of it uses (pdraft.recipe.read_resolved, pdraft.calibration_files.read_calibration,
pdraft.policies.cost.SpsTable, pdraft.bench_file.BENCH_REPORT), so a sidecar decode would refuse is neither
published nor taken in by a pull."""

from __future__ import annotations

from fnmatch import fnmatch
from pathlib import Path

from pdraft.bench_file import BENCH_REPORT
from pdraft.calibration_files import read_calibration
from pdraft.errors import PdraftError
from pdraft.hub.card import BENCH_GLOBS
from pdraft.hub.export import CALIBRATION_GLOBS, SGLANG_SPS_NAME, SGLANG_STS_NAME, SPS_GLOBS
from pdraft.paths import RESOLVED_NAME
from pdraft.policies.cost import SpsTable
from pdraft.readback import load, read_bytes
from pdraft.recipe import read_resolved
from pdraft.typed_yaml import MAX_RECIPE_BYTES

RECIPE, CALIBRATION, COST_TABLE, BENCH = "resolved recipe", "calibration", "SPS table", "bench report"
GLOBS = {RECIPE: (RESOLVED_NAME,), CALIBRATION: CALIBRATION_GLOBS, COST_TABLE: SPS_GLOBS, BENCH: BENCH_GLOBS}


def kind_of(name: str) -> str | None:
    """The companion kind a top-level file name is (the first kind whose globs match), or None."""
    if name in ("config.json", SGLANG_STS_NAME, SGLANG_SPS_NAME) or "/" in name:
        return None  # the config is the drafter's own; the SGLang copies are export's output, not a source
    for kind, globs in GLOBS.items():
        if any(fnmatch(name, g) for g in globs):
            return kind
    return None


def check(path: Path, kind: str, *, blob: bytes | None = None, inside: str | None = None) -> None:
    """Read the file at `path` (or its bytes `blob`) as `kind`, by that kind's one schema; a one-line
    PdraftError naming the file and the first problem otherwise. `inside`: the folder kind whose links are
    refused."""
    if kind == RECIPE:
        read_resolved(blob if blob is not None else read_bytes(path, kind, MAX_RECIPE_BYTES, inside=inside),
                      str(path))
    elif kind == CALIBRATION:
        read_calibration(path, inside=inside, blob=blob)
    elif kind == COST_TABLE:
        SpsTable.load(path, inside=inside, blob=blob)
    elif kind == BENCH:
        load(path, BENCH_REPORT, inside=inside, blob=blob)
    else:
        raise ValueError(f"unknown companion kind {kind!r}")


def check_folder(folder: Path, names: list[str], where: str) -> None:
    """Every companion file among `names` (top-level names in `folder`, links already checked by the caller),
    read by its schema; the first bad one is one line naming `where`."""
    for name in names:
        kind = kind_of(name)
        if kind is None:
            continue
        try:
            check(folder / name, kind)
        except PdraftError as e:
            raise PdraftError(f"{where}: {name} is not a valid {kind} ({e.message})",
                              hint="remove it from the drafter folder or regenerate it with pdraft") from None


__all__ = ["RECIPE", "CALIBRATION", "COST_TABLE", "BENCH", "GLOBS", "kind_of", "check", "check_folder"]
