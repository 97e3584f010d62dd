"""Finding the files a run's verification policy reads next to a drafter: `calibrate-threshold` writes the STS
calibration (`confidence_sts.json`) and the cost table (`sps_table.json`) beside the drafter, and decode and
bench pick them up automatically, so a calibrated drafter is used calibrated without extra flags. Which files
a policy reads, and which of them it cannot run without, is its registry entry's (pdraft.policies,
`files`); an explicit table path (DecodeSettings.sps_table) wins over the one found. The policy itself (mode,
threshold, verifier, overhead) is resolved and checked once in pdraft.decode.settings."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path

from pdraft.calibration_files import device_mismatch, find_calibration, find_sps_table, load_calibration
from pdraft.policies import CALIBRATION, COST_TABLE, policy_spec
from pdraft.policies.base import VerifyConfig
from pdraft.policies.cost import SpsTable
from pdraft.decode.settings import DecodeSettings
from pdraft.errors import PdraftError


def build_verify(settings: DecodeSettings, *, drafter_dir: str | Path | None = None, device=None,
                 warn: Callable[[str], None] | None = None) -> tuple[VerifyConfig, dict]:
    """(VerifyConfig, provenance) of `settings` for the drafter in `drafter_dir`. Provenance names the files
    used."""
    spec = policy_spec(settings.verify)
    used: dict = {"mode": settings.verify}
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
        path = Path(settings.sps_table) if settings.sps_table else (find_sps_table(drafter_dir) if drafter_dir
                                                                   else None)
        if path is not None:  # a table found beside the drafter is part of its folder: a link there is refused
            sps = SpsTable.load(path, inside=None if settings.sps_table else "drafter folder")
            mismatch = device_mismatch(path, sps.device, device)
            if mismatch:
                (warn or (lambda m: warnings.warn(m, stacklevel=2)))(mismatch)
            used["sps_table"] = str(path)
        elif spec.files[COST_TABLE]:
            raise PdraftError(f"{spec.title} needs a cost table: run `pdraft calibrate-threshold` for this "
                              f"drafter, or pass --scheduler SPS_JSON")
    return settings.verify_config(temps, sps), used
