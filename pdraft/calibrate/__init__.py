"""Confidence calibration and the scheduler's cost table (`pdraft calibrate-threshold`): calibration data from
full-verification decoding (collect), calibration metrics (metrics), Sequential Temperature Scaling and its
SGLang-layout file (sts), the static-threshold sweep (sweep), the SPS(B) profile (sps), figures and tables
(report) and the whole run (run). decode and bench find the two files next to a drafter with
`find_calibration` / `find_sps_table` and read them with `load_calibration` / `load_sps_table`."""

from pdraft.calibrate.sps import SPS_NAME, DeviceMismatchWarning, find_sps_table, load_sps_table
from pdraft.calibrate.sts import CALIBRATION_NAME, find_calibration, load_calibration

__all__ = ["CALIBRATION_NAME", "SPS_NAME", "DeviceMismatchWarning", "find_calibration", "find_sps_table",
           "load_calibration", "load_sps_table"]
