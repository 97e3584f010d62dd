"""Choosing the verification policy of a run from the user's settings and what sits next to the drafter:
`calibrate-threshold` writes the STS calibration (`confidence_sts.json`) and the scheduler's cost table
(`sps_table.json`) beside the drafter, and decode and bench pick both up automatically, so a calibrated
drafter is used calibrated without extra flags. An explicit table path wins over the one found."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path

from pdraft.calibration_files import device_mismatch, find_calibration, find_sps_table, load_calibration
from pdraft.decode.scheduler import SpsTable, VerifyConfig
from pdraft.errors import PdraftError


def build_verify(mode: str, *, threshold: float = 0.0, sps_path: str | Path | None = None,
                 drafter_dir: str | Path | None = None, device=None,
                 warn: Callable[[str], None] | None = None, packed: bool = True,
                 round_overhead_s: float = 0.0) -> tuple[VerifyConfig, dict]:
    """(VerifyConfig, provenance) for mode full | threshold | scheduler. Provenance names the files used."""
    used: dict = {"mode": mode}
    if mode == "full":
        return VerifyConfig(packed=packed), used
    temps = None
    found = find_calibration(drafter_dir) if drafter_dir else None
    if found is not None:
        temps = load_calibration(found)
        used["calibration"] = str(found)
    if mode == "threshold":
        return VerifyConfig(mode="threshold", threshold=threshold, confidence_temperatures=temps, packed=packed), used
    if mode != "scheduler":
        raise PdraftError(f"unknown verification mode {mode!r}: use full, threshold or scheduler")
    path = Path(sps_path) if sps_path else (find_sps_table(drafter_dir) if drafter_dir else None)
    if path is None:
        raise PdraftError("the prefix scheduler needs a cost table: run `pdraft calibrate-threshold` for this "
                          "drafter, or pass --scheduler SPS_JSON")
    sps = SpsTable.load(path)
    mismatch = device_mismatch(path, device)
    if mismatch:
        (warn or (lambda m: warnings.warn(m, stacklevel=2)))(mismatch)
    used["sps_table"] = str(path)
    return VerifyConfig(mode="scheduler", sps=sps, confidence_temperatures=temps, packed=packed,
                        round_overhead_s=round_overhead_s), used
