"""CPU threads and the OpenMP wait policy, chosen by measurement rather than fixed (issue 38).

A decode round on a CPU is hundreds of small operations. With two threads, every operation that runs in
parallel ends with the second thread waiting for the next one: under `OMP_WAIT_POLICY=PASSIVE` it sleeps at
once and each later operation pays a wake-up (a small matrix product costs up to three times its one-thread
time), while an unbounded spin keeps a core busy, which is ruinous beside another busy process. Neither fixed
setting is right, so:

- **The wait policy** is a bounded spin (`GOMP_SPINCOUNT`, `BOUNDED_SPIN` iterations, tens of microseconds):
  threads stay awake across the gaps inside a pass and sleep between rounds and requests; but where other work
  already keeps at least `BUSY_CORES` of the machine's cores busy when pdraft starts (read from /proc/stat over
  `SAMPLE_S`, while pdraft itself sleeps), `OMP_WAIT_POLICY=PASSIVE`: a spinning thread there fights the
  neighbour for its core (on the 2-core AMD machine beside `python -c 'while True: pass'`, transformers'
  `generate()` at 6.18 ms a token against 4.83 under PASSIVE, medians of 3). Set before torch is imported
  (`apply_wait_policy`, called by the CLI and by pdraft.runtime); a user's own `OMP_WAIT_POLICY` or
  `GOMP_SPINCOUNT` is kept as it is, and the choice and what it read are in `wait_policy()`.
- **The thread count** of a decode run (`runtime.threads: auto`, the default) is measured: `choose` times the
  run's own work (a target step and a verify pass of the run's width) at one thread and at every core, in
  alternating blocks, and keeps the faster, unless the two are within `TIE` of each other: then the count the
  host's load at start points to, every core on a quiet host and one thread beside a neighbour (a tie read off a
  noisy host must not flip the run's threads from one run to the next; issue 59 saw the same drafters bench at
  1.39x and 1.82x on two runs whose probes differed by 7%; on the Intel AVX-512-without-bf16 class, DFlash2's
  TPOT at gamma 16 was 1.90-2.47 ms on 2 threads against 2.16-2.79 on 1 on a quiet host, four pinned benches,
  and 2.51 against 2.24 beside a one-core spinning neighbour, whose probe read a 7.6% tie). The choice, its
  timings and whether it was a tie go into bench.json and the table footer. Training and export, whose products
  are large, use every core.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

BOUNDED_SPIN = "100000"  # libgomp spin iterations before a waiting thread sleeps (PASSIVE: 0; default: 300000)
BUSY_CORES = 0.5  # cores other work keeps busy at start from which waiting threads sleep at once (PASSIVE)
SAMPLE_S = 0.05  # how long the start-up reading of /proc/stat lasts
TIE = 0.10  # thread counts whose probe medians differ by less than this share count as equally fast
BLOCK = 3  # timed probe calls per block; each block starts with an untimed call after the thread switch
NOTE = "PDRAFT_WAIT_POLICY_NOTE"  # what pdraft read when it chose the policy; inherited by its child processes
BUSY = "PDRAFT_BUSY_AT_START"  # "1" where other work kept BUSY_CORES busy when pdraft started (apply_wait_policy)


def busy_cores(interval: float = SAMPLE_S, stat: str = "/proc/stat") -> float | None:
    """Cores kept busy by other work over `interval` seconds while this process sleeps (Linux /proc/stat: the
    machine's busy jiffies over all jiffies, times its cores), or None where /proc/stat cannot be read."""
    def sample():
        with open(stat) as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        return sum(fields[:8]) - idle, sum(fields[:8])

    try:
        busy0, total0 = sample()
        time.sleep(interval)
        busy1, total1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    if total1 <= total0:
        return None
    return (busy1 - busy0) / (total1 - total0) * (os.cpu_count() or 1)


def apply_wait_policy(environ=None, busy: float | None = None) -> None:
    """Choose the wait policy unless the user or an earlier call did: PASSIVE when other work keeps `BUSY_CORES`
    busy (`busy`, else read by `busy_cores`), the bounded spin otherwise; must run before torch is first
    imported."""
    env = os.environ if environ is None else environ
    if env.get("OMP_WAIT_POLICY") or env.get("GOMP_SPINCOUNT"):
        return
    busy = busy_cores() if busy is None else busy
    env[BUSY] = "1" if busy is not None and busy >= BUSY_CORES else "0"
    if busy is not None and busy >= BUSY_CORES:
        env["OMP_WAIT_POLICY"] = "PASSIVE"
        env[NOTE] = f"other work kept {busy:.1f} cores busy at start"
    else:
        env["GOMP_SPINCOUNT"] = BOUNDED_SPIN
        env[NOTE] = "a quiet host at start" if busy is not None else "no /proc/stat to read the host's load"


def wait_policy() -> str:
    """The policy this process's OpenMP runtime read at start, in words (and, where pdraft chose it, why)."""
    policy, spin = os.environ.get("OMP_WAIT_POLICY", ""), os.environ.get("GOMP_SPINCOUNT", "")
    why = f": {os.environ[NOTE]}" if os.environ.get(NOTE) else ""
    if policy:
        return f"OMP_WAIT_POLICY={policy}" + (f", GOMP_SPINCOUNT={spin}" if spin else "") + why
    return (f"bounded spin (GOMP_SPINCOUNT={spin}{why})" if spin else "OpenMP default")


@dataclass
class ThreadChoice:
    threads: int
    how: str  # "measured" | "tie" (measured, within TIE: see choose) | "recipe" | "default"
    policy: str
    timings_ms: dict[int, float] = field(default_factory=dict)  # threads -> median probe time

    def describe(self) -> str:
        times = ", ".join(f"{t}: {ms:.2f} ms" for t, ms in sorted(self.timings_ms.items()))
        how = f"measured, a tie within {TIE:.0%}" if self.how == "tie" else self.how
        return f"{self.threads} thread{'s' if self.threads > 1 else ''} ({how}{'; ' + times if times else ''})" \
               f", {self.policy}"

    def as_dict(self) -> dict:
        return {"threads": self.threads, "how": self.how, "wait_policy": self.policy,
                "probe_ms": {str(k): round(v, 3) for k, v in self.timings_ms.items()}}

    @property
    def measured(self) -> bool:
        return self.how in ("measured", "tie")


def choose(probe: Callable[[], object], setting: int | str | None, *, repeats: int = 5) -> ThreadChoice:
    """Set torch's threads for a decode run: a number from the recipe as it is; None keeps torch's default;
    "auto" times `probe` (the run's own work) at one thread and at every core in `repeats` blocks each,
    alternating which goes first, and keeps the faster median; where the two are within `TIE`, one thread if
    other work kept cores busy when pdraft started (`BUSY`, read by apply_wait_policy), else every core."""
    import torch

    if setting not in ("auto", None):
        torch.set_num_threads(int(setting))
        return ThreadChoice(int(setting), "recipe", wait_policy())
    cores = torch.get_num_threads() if setting is None else max(1, len(os.sched_getaffinity(0)))
    if setting is None or cores == 1:
        return ThreadChoice(cores, "default", wait_policy())
    candidates = [1, cores]
    times: dict[int, list[float]] = {t: [] for t in candidates}
    for block in range(repeats):
        for t in (candidates if block % 2 == 0 else candidates[::-1]):
            torch.set_num_threads(t)
            probe()  # the switch's own cost (the thread pool resized, caches cold) stays out of the timings
            for _ in range(BLOCK):
                start = time.perf_counter()
                probe()
                times[t].append(time.perf_counter() - start)
    medians = {t: statistics.median(v) * 1e3 for t, v in times.items()}
    one, every = medians[1], medians[cores]
    if abs(one - every) < TIE * min(one, every):  # beside a neighbour read at start, one thread; else every core
        best, how = (1 if os.environ.get(BUSY) == "1" else cores), "tie"
    else:
        best, how = min(medians, key=medians.get), "measured"
    torch.set_num_threads(best)
    return ThreadChoice(best, how, wait_policy(), medians)
