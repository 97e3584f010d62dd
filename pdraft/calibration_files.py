"""Finding and reading the files calibrate-threshold writes next to a drafter: the STS calibration
(`confidence_sts.json`, per-position temperatures) and the scheduler's cost table (`sps_table.json`), plus the
device name a table records, and which of them a verification policy reads (`policy_files`, as its registry
entry says). The calibration's schema (`STS_FILE`) is here, once: decode, bench, export (into
SGLang's layout), push, pull and the model card all read the file through `read_calibration`, so a
temperature that is text, null, NaN, negative or infinite is refused by each in the same line (the cost
table's schema is pdraft.policies.cost's). A leaf: the decoder reads these files without importing the
calibration code that writes them (pdraft.calibrate), which itself runs the decoder."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import torch
from pydantic import Field

from pdraft.errors import PdraftError
from pdraft.models.family import MAX_GAMMA
from pdraft.paths import regular_file_inside
from pdraft.policies import CALIBRATION, COST_TABLE, PolicySpec
from pdraft.policies.cost import SpsTable
from pdraft.readback import FileKind, Schema, load
from pdraft.runtime import cpu_model

CALIBRATION_NAME = "confidence_sts.json"
SPS_NAME = "sps_table.json"
MAX_TEMPERATURE = 1e6  # the fit's grid ends at 16; SGLang divides logits by it


class StsCalibration(Schema):
    """SGLang's DSparkStsCalibration layout (python/sglang/srt/speculative/dspark_components/dspark_sts.py:
    temperatures, dataset, num_samples, ece_before, ece_after) plus pdraft's own `pdraft` object. An ECE is
    null where calibrate-threshold had no sample for a position (SGLang's lists hold numbers only: export leaves
    such a list out)."""

    temperatures: list[Annotated[float, Field(gt=0, le=MAX_TEMPERATURE)]] = Field(min_length=1, max_length=MAX_GAMMA)
    dataset: str = ""
    num_samples: int = Field(0, ge=0, le=1 << 62)
    ece_before: list[Annotated[float, Field(ge=0, le=1)] | None] | None = Field(None, max_length=MAX_GAMMA)
    ece_after: list[Annotated[float, Field(ge=0, le=1)] | None] | None = Field(None, max_length=MAX_GAMMA)
    pdraft: dict[str, Any] | None = None


STS_FILE = FileKind("calibration file", 4 << 20, StsCalibration)


class DeviceMismatchWarning(UserWarning):
    """A cost table measured on another device type: its SPS curve says little about this one."""


def device_name(device: torch.device | str | None = None) -> str:
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU {cpu_model()}"


def find_calibration(drafter_dir: str | Path) -> Path | None:
    """The calibration file calibrate-threshold wrote next to a drafter, or None."""
    path = Path(drafter_dir) / CALIBRATION_NAME
    if not path.is_file():
        return None
    # Picked up without being asked for: a link to a file elsewhere is refused, never read as the drafter's.
    return regular_file_inside(drafter_dir, CALIBRATION_NAME, what="drafter folder")


def read_calibration(path: str | Path, *, inside: str | None = "drafter folder",
                     blob: bytes | None = None) -> StsCalibration:
    """A calibration file (pdraft's or SGLang's) checked by its schema: read within its size limit, nesting
    bounded, every temperature a finite number > 0 (`inside`: the folder it belongs to, whose links are refused;
    None for a path the user named; `blob`: its bytes, already read)."""
    return load(path, STS_FILE, inside=inside, blob=blob)


def load_calibration(path: str | Path, *, inside: str | None = "drafter folder") -> list[float]:
    """Per-position STS temperatures from a calibration file (pdraft's or SGLang's)."""
    return list(read_calibration(path, inside=inside).temperatures)


def find_sps_table(drafter_dir: str | Path) -> Path | None:
    """The cost table calibrate-threshold wrote next to a drafter, or None."""
    path = Path(drafter_dir) / SPS_NAME
    if not path.is_file():
        return None
    # Picked up without being asked for: a link to a file elsewhere is refused, never read as the drafter's.
    return regular_file_inside(drafter_dir, SPS_NAME, what="drafter folder")


def device_mismatch(path: str | Path, measured: str | None, device: torch.device | str | None = None) -> str | None:
    """A one-line warning when pdraft measured the table at `path` on the device named `measured` (its
    `pdraft.device`, read with the table) and that is not `device` (default: the device pdraft would run on);
    None when they match or the table records no device (e.g. SGLang's)."""
    here = device_name(device)
    if measured and measured != here:
        return (f"cost table {path} was measured on {measured} but this run uses {here}: scheduling will follow "
                f"the other device's throughput curve; re-profile with calibrate-threshold on this device")
    return None


def policy_files(spec: PolicySpec, drafter_dir: str | Path | None, *, sps_table: str | Path | None = None,
                 device=None, warn: Callable[[str], None] | None = None
                 ) -> tuple[list[float] | None, SpsTable | None, dict]:
    """(STS temperatures, cost table, provenance) that the policy `spec` reads for the drafter in `drafter_dir`:
    which files a policy reads, and which of them it cannot run without, is its registry entry's
    (pdraft.policies, `files`); an explicit table path (`sps_table`: DecodeSettings.sps_table, `--sps-table`)
    wins over the one found. Provenance names the files used."""
    used: dict = {"mode": spec.name}
    temps = sps = None
    if CALIBRATION in spec.files:
        found = find_calibration(drafter_dir) if drafter_dir else None
        if found is not None:
            temps = load_calibration(found)
            used["calibration"] = str(found)
        elif spec.files[CALIBRATION]:
            raise PdraftError(f"{spec.title} needs a confidence calibration: run `pdraft calibrate-threshold` "
                              f"for this drafter")
    if COST_TABLE in spec.files:
        path = Path(sps_table) if sps_table else (find_sps_table(drafter_dir) if drafter_dir else None)
        if path is not None:  # a table found beside the drafter is part of its folder: a link there is refused
            sps = SpsTable.load(path, inside=None if sps_table else "drafter folder")
            mismatch = device_mismatch(path, sps.device, device)
            if mismatch:
                (warn or (lambda m: warnings.warn(m, stacklevel=3)))(mismatch)
            used["sps_table"] = str(path)
        elif spec.files[COST_TABLE]:
            raise PdraftError(f"{spec.title} needs a cost table: run `pdraft calibrate-threshold` for this "
                              f"drafter, or pass --sps-table SPS_JSON")
    return temps, sps, used
