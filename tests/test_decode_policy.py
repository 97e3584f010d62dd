"""decode and bench pick up the calibration and the cost table that calibrate-threshold wrote next to the
drafter; an explicit table wins; a table from another device warns naming both devices."""

import json

import pytest

from pdraft.calibration_files import device_name
from pdraft.decode.settings import DecodeSettings
from pdraft.errors import PdraftError

TABLE = {"sample_batch_tokens": [1, 8, 16], "sample_steps_per_sec": [100.0, 90.0, 50.0], "max_batch_tokens": 16}


def write(folder, sps=True, sts=True, device=None):
    device = device or device_name("cpu")
    folder.mkdir(parents=True, exist_ok=True)
    if sps:
        (folder / "sps_table.json").write_text(json.dumps({**TABLE, "pdraft": {"device": device}}))
    if sts:
        (folder / "confidence_sts.json").write_text(json.dumps(
            {"temperatures": [1.5, 2.0], "dataset": "x", "num_samples": 10, "ece_before": [0.1, 0.1],
             "ece_after": [0.01, 0.02]}))
    return folder


def test_full_needs_nothing(tmp_path):
    cfg, used = DecodeSettings(verify="full").build_verify(drafter_dir=tmp_path)
    assert cfg.mode == "full" and used == {"mode": "full"}


def test_scheduler_picks_up_both_files(tmp_path):
    d = write(tmp_path / "drafter")
    seen = []
    cfg, used = DecodeSettings(verify="scheduler").build_verify(drafter_dir=d, device="cpu", warn=seen.append)
    assert not seen
    assert cfg.mode == "scheduler" and cfg.confidence_temperatures == [1.5, 2.0]
    assert cfg.sps.max_batch_tokens == 16 and used["sps_table"].endswith("sps_table.json")


def test_threshold_uses_calibration(tmp_path):
    d = write(tmp_path / "drafter", sps=False)
    cfg, _ = DecodeSettings(verify="threshold", knobs={"threshold": 0.4}).build_verify(drafter_dir=d)
    assert cfg.knobs == {"threshold": 0.4} and cfg.confidence_temperatures == [1.5, 2.0]


def test_explicit_table_wins_and_missing_table_is_an_error(tmp_path):
    d = write(tmp_path / "drafter", sps=False)
    with pytest.raises(PdraftError, match="needs a cost table"):
        DecodeSettings(verify="scheduler").build_verify(drafter_dir=d)
    other = tmp_path / "t.json"
    other.write_text(json.dumps(TABLE))
    cfg, used = DecodeSettings(verify="scheduler", sps_table=str(other)).build_verify(drafter_dir=d)
    assert used["sps_table"] == str(other)


def test_table_from_another_device_warns_with_both_names(tmp_path):
    d = write(tmp_path / "drafter", device="NVIDIA H200")
    seen = []
    DecodeSettings(verify="scheduler").build_verify(drafter_dir=d, device="cpu", warn=seen.append)
    assert len(seen) == 1 and "NVIDIA H200" in seen[0] and "this run uses" in seen[0]
