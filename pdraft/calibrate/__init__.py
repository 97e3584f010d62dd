"""Confidence calibration and the scheduler's cost table (`pdraft calibrate-threshold`): calibration data from
full-verification decoding (collect), calibration scores (scores: ECE, AUC, Brier), Sequential Temperature
Scaling and its SGLang-layout file (sts), the static-threshold sweep (threshold_sweep), the SPS(B) profile (sps),
figures and tables (report) and the whole run (pipeline). decode and bench find the two files next to a drafter and read them through
the leaf module pdraft.calibration_files, which this package re-exports."""

from pdraft.calibrate.sps import load_sps_table
from pdraft.calibration_files import (CALIBRATION_NAME, SPS_NAME, DeviceMismatchWarning, find_calibration,
                                      find_sps_table, load_calibration)

__all__ = ["CALIBRATION_NAME", "SPS_NAME", "DeviceMismatchWarning", "find_calibration", "find_sps_table",
           "load_calibration", "load_sps_table"]
