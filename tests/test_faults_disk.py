"""Fault: the disk fills up while `pdraft train` writes its second checkpoint. Run end to end through the CLI
entry point with the trainer-state write failing with ENOSPC: the command prints one line naming the full disk
and exits 2, the first checkpoint still loads with pdraft.models.load_drafter, `latest` still names it, no
temporary folder is left, and rerunning the same command resumes from it and finishes the run."""

import errno

from pdraft.models import load_drafter
from pdraft import run_folder as ck
import reliability_support
from reliability_support import run_cli

w = reliability_support.w  # the shared world, a module fixture

FAULTS = [
    ("SIGKILL during export-hidden", "tests/test_export_hidden.py::test_killed_export_resumes_to_identical_cache",
     "the rerun resumes from the finished shards and the cache equals an uninterrupted export's"),
    ("SIGKILL during training", "tests/test_train_loop.py::test_sigkill_then_resume_equals_uninterrupted",
     "the rerun resumes from the last checkpoint and the final weights equal an uninterrupted run's, bit for bit"),
    ("full disk while writing a checkpoint (library)",
     "tests/test_train_checkpoint.py::test_failure_during_save_keeps_previous",
     "the previous checkpoint and `latest` are intact, no partial folder is left"),
    ("full disk at the second checkpoint of `pdraft train` (end to end)",
     "tests/test_faults_disk.py::test_full_disk_at_second_checkpoint",
     "one line naming the full disk, exit 2; step_1 loads with load_drafter; the rerun resumes from it and finishes"),
]


def test_full_disk_at_second_checkpoint(w, tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    argv = ["train", str(w.recipe), "--set", "train.steps=3", "--set", f"train.output_dir={run_dir}"]
    real_save = ck.save_file
    calls = []

    def full_disk(tensors, path, *a, **k):
        calls.append(path)
        if len(calls) == 2:  # the second checkpoint's trainer state
            with open(path, "wb") as f:
                f.write(b"partial")
            raise OSError(errno.ENOSPC, "No space left on device", path)
        return real_save(tensors, path, *a, **k)

    monkeypatch.setattr(ck, "save_file", full_disk)
    res = run_cli(argv)
    assert res.code == 2 and "Traceback" not in res.err, res.err[-2000:]
    lines = res.err.rstrip("\n").splitlines()
    assert len(res.error_lines) == 1 and lines[-1].startswith("error: "), res.err
    assert "disk full while writing checkpoint step_2" in lines[-1] and "step_1 is intact" in lines[-1]
    assert "No space left on device" in lines[-1]
    assert ck.latest_checkpoint(run_dir).name == "step_1"
    assert not list(run_dir.glob(".tmp_*")) and not (run_dir / "step_2").exists()
    from pdraft.targets.loader import load_target
    from pdraft.recipe import load_recipe

    target = load_target(load_recipe(w.recipe).target)
    assert load_drafter(run_dir / "step_1", target.config).config.kind == "dspark"

    monkeypatch.setattr(ck, "save_file", real_save)  # space freed: the same command resumes and finishes
    res = run_cli([*argv, "--json"])
    assert res.code == 0, res.err[-2000:]
    import json

    report = json.loads(res.out)
    assert report["resumed_from"] == 1 and report["steps"] == 3
    assert load_drafter(run_dir / "final", target.config).config.kind == "dspark"
