"""Finding and reading the files calibrate-threshold writes next to a drafter: the STS calibration
(`confidence_sts.json`, per-position temperatures) and the scheduler's cost table (`sps_table.json`), plus the
device name a table records. A leaf: the decoder reads these files without importing the calibration code that
writes them (pdraft.calibrate), which itself runs the decoder."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from pdraft.errors import PdraftError
from pdraft.paths import regular_file_inside
from pdraft.runtime import cpu_model

CALIBRATION_NAME = "confidence_sts.json"
SPS_NAME = "sps_table.json"


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


def load_calibration(path: str | Path) -> list[float]:
    """Per-position STS temperatures from a calibration file (pdraft's or SGLang's)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise PdraftError(f"calibration file {path} does not exist", hint="fit it with calibrate-threshold") from None
    except (OSError, json.JSONDecodeError) as e:
        raise PdraftError(f"cannot read calibration file {path}: {e}") from None
    temps = data.get("temperatures") if isinstance(data, dict) else None
    if not isinstance(temps, list) or not temps:
        raise PdraftError(f"calibration file {path} has no 'temperatures' list")
    try:
        temps = [float(t) for t in temps]
    except (TypeError, ValueError):
        raise PdraftError(f"calibration file {path}: temperatures must be numbers") from None
    if any(not (t > 0 and math.isfinite(t)) for t in temps):
        raise PdraftError(f"calibration file {path}: temperatures must all be finite and > 0, got {temps}")
    return temps


def find_sps_table(drafter_dir: str | Path) -> Path | None:
    """The cost table calibrate-threshold wrote next to a drafter, or None."""
    path = Path(drafter_dir) / SPS_NAME
    if not path.is_file():
        return None
    # Picked up without being asked for: a link to a file elsewhere is refused, never read as the drafter's.
    return regular_file_inside(drafter_dir, SPS_NAME, what="drafter folder")


def device_mismatch(path: str | Path, device: torch.device | str | None = None) -> str | None:
    """A one-line warning when pdraft measured the table at `path` on another device than `device` (default: the
    device pdraft would run on); None when they match or the table has no pdraft metadata (e.g. SGLang's)."""
    try:
        meta = json.loads(Path(path).read_text()).get("pdraft") or {}
    except (OSError, json.JSONDecodeError, AttributeError):
        return None
    measured = meta.get("device")
    here = device_name(device)
    if measured and measured != here:
        return (f"cost table {path} was measured on {measured} but this run uses {here}: scheduling will follow "
                f"the other device's throughput curve; re-profile with calibrate-threshold on this device")
    return None
