"""The OpenMP wait policy pdraft chooses at start (pdraft.threads): a bounded spin on a quiet host, PASSIVE where
other work already keeps cores busy, the user's own setting kept, and the reading of /proc/stat it rests on."""

import subprocess
import sys

import pytest

from pdraft import threads


@pytest.mark.parametrize("busy,want", [(0.0, ("GOMP_SPINCOUNT", threads.BOUNDED_SPIN)), (0.3, ("GOMP_SPINCOUNT", threads.BOUNDED_SPIN)),
                                       (0.9, ("OMP_WAIT_POLICY", "PASSIVE")), (None, ("GOMP_SPINCOUNT", threads.BOUNDED_SPIN))])
def test_the_policy_follows_the_load_read_at_start(monkeypatch, busy, want):
    env = {}
    monkeypatch.setattr(threads, "busy_cores", lambda: busy)
    threads.apply_wait_policy(env)
    assert env[want[0]] == want[1] and threads.NOTE in env
    assert ("OMP_WAIT_POLICY" in env) == (want[0] == "OMP_WAIT_POLICY")


@pytest.mark.parametrize("given", [{"OMP_WAIT_POLICY": "ACTIVE"}, {"GOMP_SPINCOUNT": "7"}])
def test_a_policy_already_set_is_kept(given):
    env = dict(given)
    threads.apply_wait_policy(env, busy=1.5)
    assert env == given


def test_busy_cores_reads_a_neighbour():
    """A process spinning beside the reading shows as about one busy core (at least half of one on a shared
    host); the reading is None where /proc/stat cannot be read."""
    if threads.busy_cores() is None:
        pytest.skip("no /proc/stat here")
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        import time

        time.sleep(0.3)  # the interpreter started and spins
        assert threads.busy_cores(interval=0.3) >= 0.5
    finally:
        spinner.kill()
        spinner.wait()
    assert threads.busy_cores(stat="/nonexistent/stat") is None
