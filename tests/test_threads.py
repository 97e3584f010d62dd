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
    assert env[threads.BUSY] == ("1" if want[0] == "OMP_WAIT_POLICY" else "0")
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


def _probe_at(ms_by_threads):
    """A probe whose duration depends on torch's thread count, as the run's own work does."""
    import time

    import torch

    return lambda: time.sleep(ms_by_threads(torch.get_num_threads()) / 1e3)


@pytest.mark.parametrize("one_ms,every_ms,busy,want", [
    (8.0, 8.3, "0", ("every", "tie")),  # within TIE on a quiet host: every core, whichever read faster
    (8.3, 8.0, "0", ("every", "tie")),
    (8.3, 8.0, "1", ("one", "tie")),  # within TIE beside a neighbour read at start: one thread
    (8.0, 16.0, "0", ("one", "measured")),  # a clear difference decides, whatever the load
    (16.0, 8.0, "1", ("every", "measured")),
])
def test_auto_threads_keep_the_clear_winner_and_settle_a_tie_by_the_load(monkeypatch, one_ms, every_ms, busy, want):
    """Issue 59: a probe difference smaller than TIE flipped the bench's threads between runs of the same
    drafters; now a tie is settled by the load read at start, a clear difference still picks the faster count."""
    import os

    import torch

    cores = len(os.sched_getaffinity(0))
    if cores < 2:
        pytest.skip("one core: nothing to choose")
    monkeypatch.setenv(threads.BUSY, busy)
    before = torch.get_num_threads()
    try:
        choice = threads.choose(_probe_at(lambda t: one_ms if t == 1 else every_ms), "auto")
        assert (choice.threads, choice.how) == ((1 if want[0] == "one" else cores), want[1])
        assert torch.get_num_threads() == choice.threads and choice.measured
        assert set(choice.timings_ms) == {1, cores}
        assert choice.timings_ms[1] == pytest.approx(one_ms, rel=0.25)
        assert ("a tie" in choice.describe()) == (want[1] == "tie")
    finally:
        torch.set_num_threads(before)


def test_the_switch_cost_stays_out_of_the_timings(monkeypatch):
    """The first call after a thread switch pays for it (the pool resized): it is not timed, so a switch that
    costs more than the work itself cannot decide the choice."""
    import os

    import torch

    cores = len(os.sched_getaffinity(0))
    if cores < 2:
        pytest.skip("one core: nothing to choose")
    monkeypatch.setenv(threads.BUSY, "0")
    last = {"t": None}

    def ms(t):
        switched, last["t"] = last["t"] != t, t
        return (40.0 if switched else 0.0) + (10.0 if t == 1 else 5.0)

    before = torch.get_num_threads()
    try:
        choice = threads.choose(_probe_at(ms), "auto")
        assert choice.threads == cores and choice.how == "measured"
        assert choice.timings_ms[cores] == pytest.approx(5.0, abs=2.5)
    finally:
        torch.set_num_threads(before)
