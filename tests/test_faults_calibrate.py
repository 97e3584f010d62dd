"""Fault: `pdraft calibrate-threshold` is SIGKILLed mid-run, in a subprocess through the console entry point, at
two moments: while collecting rounds (nothing written yet) and in the middle of writing the calibration file
(its bytes written to the temporary file, before the rename). Neither kill leaves a calibration file behind,
and rerunning the same command completes with a calibration file byte-identical to an uninterrupted run's
(calibration is deterministic: fixed seeds, greedy collection, a fixed temperature grid). The SPS cost table is
left out (--skip-sps): it holds measured timings, which no two runs share."""

import os
import subprocess
import sys
import textwrap

import pytest

import reliability_support
from reliability_support import ROOT, TESTS, run_cli

w = reliability_support.w  # the shared world, a module fixture

FAULTS = [
    ("SIGKILL during calibrate-threshold, while collecting rounds",
     "tests/test_faults_calibrate.py::test_sigkill_then_rerun_equals_uninterrupted[collect]",
     "no calibration file is left; the rerun's calibration file equals an uninterrupted run's, byte for byte"),
    ("SIGKILL during calibrate-threshold, while writing the calibration file",
     "tests/test_faults_calibrate.py::test_sigkill_then_rerun_equals_uninterrupted[write]",
     "the file is never half-written (atomic rename); the rerun's file equals an uninterrupted run's"),
]
CAL = "confidence_sts.json"

# The child runs the real CLI; a hook SIGKILLs it at the chosen moment.
CHILD = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, {tests!r})
    moment = {moment!r}
    if moment == "collect":
        import pdraft.decode.engine as E  # pdraft.calibrate.collect imports generate from here at call time
        real = E.generate
        def generate(*a, **k):
            real(*a, **k)
            os.kill(os.getpid(), signal.SIGKILL)  # after the first batch of rounds
        E.generate = generate
    else:
        real_replace = os.replace
        def replace(src, dst, *a, **k):
            if str(dst).endswith({cal!r}):
                os.kill(os.getpid(), signal.SIGKILL)  # the bytes are in the temporary file, not yet renamed
            return real_replace(src, dst, *a, **k)
        os.replace = replace
    from pdraft.cli.main import main
    sys.exit(main({argv!r}))
""")


@pytest.fixture(scope="module")
def reference(w, tmp_path_factory):
    out = tmp_path_factory.mktemp("cal-ref")
    res = run_cli(argv(w, out))
    assert res.code == 0, res.err[-2000:]
    return (out / CAL).read_bytes()


def argv(w, out):
    return ["calibrate-threshold", str(w.recipe), "--drafter", str(w.dspark), "--out", str(out), "--skip-sps"]


@pytest.mark.parametrize("moment", ["collect", "write"])
def test_sigkill_then_rerun_equals_uninterrupted(w, reference, tmp_path, moment):
    out = tmp_path / "out"
    script = CHILD.format(tests=str(TESTS), moment=moment, cal=CAL, argv=argv(w, out))
    res = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert res.returncode == -9, res.stderr[-2000:]
    assert not (out / CAL).exists()
    if moment == "write":
        assert list(out.glob(f".tmp-{CAL}.*"))  # killed exactly mid-write: the bytes were in the temporary file
    again = run_cli(argv(w, out))
    assert again.code == 0, again.err[-2000:]
    assert (out / CAL).read_bytes() == reference
