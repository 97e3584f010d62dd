"""The one runtime every command uses: which device and dtype, how many CPU threads, which attention
kernel, seeding, and the process group under torchrun. Built from the recipe's `runtime` section, so that
`decode`, `train` and `bench` always agree on where and how they compute.

Under torchrun this module is the one place that reads torchrun's environment (`torchrun_env`: garbage,
partial or contradictory RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE / MASTER_ADDR / MASTER_PORT is one
error naming the variable), joins the group with bounded waits that say whom they wait for (`join_group`,
`wait_for_peers`, `runtime.dist_timeout_s`), and lays the processes out in tensor-parallel groups of
`target.tensor_parallel` consecutive ranks with data-parallel groups across them (`Layout`).

Defaults: CUDA when present, else CPU; bfloat16 on GPU; on a CPU bfloat16 where it has bf16 units (AVX512-BF16
or AMX, read from the CPU's flags at run time: `cpu_has_bf16`), else float32 (emulated bf16 matmuls are slower
than fp32 ones). The OpenMP wait policy is a bounded spin, set before torch is imported (pdraft.threads: a
sleeping policy pays a wake-up per operation, an unbounded spin is ruinous beside a busy process), and a decode
run's thread count is measured (`runtime.threads: auto`, pdraft.threads.choose).
"""

from __future__ import annotations

import os
import random
import re
import socket
import sys
import threading
import time
from dataclasses import dataclass
from datetime import timedelta

from pdraft.threads import apply_wait_policy  # noqa: E402  (imports no torch)

apply_wait_policy()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from pdraft.errors import PdraftError  # noqa: E402

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class Runtime:
    device: torch.device
    dtype: torch.dtype
    seed: int
    threads: int | str | None  # a number, "auto" (a decode run measures: pdraft.threads) or None (torch's own)
    attn_implementation: str
    cache_dir: str | None
    offline: bool
    dist_timeout_s: float = 600.0  # runtime.dist_timeout_s: rendezvous, collectives, a silent peer

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    def describe(self) -> str:
        where = torch.cuda.get_device_name(self.device) if self.is_cuda \
            else f"CPU ({cpu_class()}; {torch.get_num_threads()} threads)"
        return f"{where}, {str(self.dtype).removeprefix('torch.')}, torch {torch.__version__}"

    def generator(self, offset: int = 0) -> torch.Generator:
        """A generator on the compute device, seeded from the run seed (offset separates streams)."""
        g = torch.Generator(device=self.device)
        g.manual_seed(self.seed + offset)
        return g


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else what the platform module knows."""
    import platform

    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            found = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), None)
    except OSError:
        found = None
    return found or platform.processor() or platform.machine()


def resolve_device(name: str) -> torch.device:
    """`auto` = CUDA when present. Under torchrun (LOCAL_RANK set) an unindexed CUDA device becomes this
    process's GPU, cuda:LOCAL_RANK, so that each process loads its target onto its own GPU."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    env = torchrun_env()
    if device.type == "cuda" and device.index is None and env.distributed:
        device = torch.device("cuda", env.local_rank)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise PdraftError(f"runtime.device is {name!r} but no CUDA device is available", hint="use auto or cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise PdraftError(f"runtime.device is {name!r} but only {torch.cuda.device_count()} CUDA device(s) exist")
    return device


HELD_TO_AVX2 = {"ATEN_CPU_CAPABILITY": ("default", "avx2"), "ONEDNN_MAX_CPU_ISA": ("sse41", "avx", "avx2"),
                "MKL_ENABLE_INSTRUCTIONS": ("sse4_2", "avx", "avx2")}  # what holds torch below AVX-512


def held_below_avx512(environ=None) -> list[str]:
    """The settings in force that hold torch's CPU kernels below AVX-512 (`NAME=value`), so that an AVX-512
    machine runs as the AVX2-only class does (issue 56): with any of them pdraft counts no bf16 units either."""
    environ = os.environ if environ is None else environ
    return [f"{k}={environ[k]}" for k, low in HELD_TO_AVX2.items() if environ.get(k, "").strip().lower() in low]


def cpu_flags_line() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return ""


def cpu_has_bf16(flags: str | None = None, environ=None) -> bool:
    """Whether this CPU computes bf16 products in hardware (the avx512_bf16 or amx_bf16 flag of /proc/cpuinfo,
    read at run time; `flags` for tests) and torch is not held below AVX-512 (`held_below_avx512`). Without them
    oneDNN emulates bf16, 10-50x slower than float32 on the AVX2-only class."""
    words = set((cpu_flags_line() if flags is None else flags).split())
    return bool(words & {"avx512_bf16", "amx_bf16"}) and not held_below_avx512(environ)


def cpu_class(flags: str | None = None, model: str | None = None, environ=None) -> str:
    """This machine's CPU class in a few words, as every timing names it: the vendor's model name and the widest
    vector and matrix units torch may use here (AMX, AVX-512 BF16, AVX-512, AVX2), e.g. "AMD EPYC, AVX2 only"."""
    import platform

    if model is None:
        model = ""
        try:
            with open("/proc/cpuinfo", encoding="utf-8") as f:
                model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
        except OSError:
            pass
    words = set((cpu_flags_line() if flags is None else flags).split())
    model = model or platform.processor() or platform.machine()
    held = held_below_avx512(environ)
    if held:
        units = "held to AVX2 (" + ", ".join(held) + ")"
    elif "amx_bf16" in words:
        units = "AVX-512 with AMX"
    elif "avx512_bf16" in words:
        units = "AVX-512 with avx512_bf16, no AMX"
    elif "avx512f" in words:
        units = "AVX-512 without bf16 units"
    elif "avx2" in words:
        units = "AVX2 only"
    else:
        units = "no AVX2"
    return f"{model}, {units}"


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """`auto`: bfloat16 on CUDA and on CPUs with bf16 units (`cpu_has_bf16`), float32 otherwise."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" or cpu_has_bf16() else torch.float32
    return _DTYPES[name]


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)  # seeds every CUDA device too


def env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().upper() in ("1", "ON", "YES", "TRUE")


def is_offline(offline: bool | None = None) -> bool:
    """Explicit argument first, then HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE read now (not at import time)."""
    if offline is not None:
        return offline
    return env_true("HF_HUB_OFFLINE") or env_true("TRANSFORMERS_OFFLINE")


def make_runtime(section) -> Runtime:
    """Build the runtime from a recipe `runtime` section (pdraft.recipe.RuntimeSection(): the defaults), apply
    threads and seed. The section is handed in, never imported: the runtime sits below the recipe."""
    torchrun_env()  # a broken torchrun environment stops every command before it loads anything
    device = resolve_device(section.device)
    dtype = resolve_dtype(section.dtype, device)
    if isinstance(section.threads, int):  # "auto": a decode run measures (pdraft.threads); None: torch's own
        torch.set_num_threads(section.threads)
    seed_everything(section.seed)
    attn = "sdpa" if section.attn_implementation == "auto" else section.attn_implementation
    if attn == "flash_attention_2" and device.type != "cuda":
        raise PdraftError("runtime.attn_implementation flash_attention_2 needs a CUDA device", hint="use auto or sdpa on CPU")
    return Runtime(device=device, dtype=dtype, seed=section.seed, threads=section.threads,
                   attn_implementation=attn, cache_dir=section.cache_dir, offline=is_offline(section.offline),
                   dist_timeout_s=float(section.dist_timeout_s))




# ---- torchrun's environment, read and checked in one place ------------------------------------------------

TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
MAX_WORLD_SIZE = 1 << 20
_HOST = re.compile(r"^[A-Za-z0-9._:%\[\]-]{1,253}$")
_ENV_HINT = "start pdraft with torchrun, which sets them all, or unset them for a single process"


@dataclass(frozen=True)
class TorchrunEnv:
    """The validated torchrun variables of this process (a single process without them)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    master_addr: str | None = None
    master_port: int | None = None

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def endpoint(self) -> str:
        return f"{self.master_addr}:{self.master_port}"


def _env_error(message: str) -> PdraftError:
    return PdraftError(f"torchrun environment: {message}", hint=_ENV_HINT)


def torchrun_env(environ=None) -> TorchrunEnv:
    """RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE and, with several processes, MASTER_ADDR and MASTER_PORT,
    each a well-formed value consistent with the others, or one PdraftError naming the variable. None of them
    set (an empty value counts as unset) is a single process. Read anew at each call: it is cheap, and a test
    or a launcher may change the environment between commands run in one process."""
    env = os.environ if environ is None else environ
    raw = {k: env.get(k) for k in TORCHRUN_VARIABLES if env.get(k, "").strip() != ""}
    ints: dict[str, int] = {}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        if name in raw:
            if not re.fullmatch(r"\d+", raw[name]):
                raise _env_error(f"{name}={raw[name][:80]!r} is not a non-negative integer")
            if len(raw[name]) > 9 or int(raw[name]) > MAX_WORLD_SIZE:
                raise _env_error(f"{name}={raw[name][:80]} is beyond {MAX_WORLD_SIZE:,} processes")
            ints[name] = int(raw[name])
    if "WORLD_SIZE" not in ints:
        partial = [n for n in ("RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE") if n in ints]
        if partial:
            raise _env_error(f"{partial[0]}={raw[partial[0]]} is set but WORLD_SIZE is not")
        return TorchrunEnv()
    world = ints["WORLD_SIZE"]
    if not 1 <= world <= MAX_WORLD_SIZE:
        raise _env_error(f"WORLD_SIZE={world} is not between 1 and {MAX_WORLD_SIZE}")
    if "RANK" not in ints and world > 1:
        raise _env_error(f"WORLD_SIZE={world} is set but RANK is not")
    rank = ints.get("RANK", 0)
    if rank >= world:
        raise _env_error(f"RANK={rank} is not below WORLD_SIZE={world}")
    local_world = ints.get("LOCAL_WORLD_SIZE", world)
    if not 1 <= local_world <= world:
        raise _env_error(f"LOCAL_WORLD_SIZE={local_world} is not between 1 and WORLD_SIZE={world}")
    local_rank = ints.get("LOCAL_RANK", rank % local_world)
    if local_rank >= local_world:
        raise _env_error(f"LOCAL_RANK={local_rank} is not below LOCAL_WORLD_SIZE={local_world}")
    if local_rank > rank:
        raise _env_error(f"LOCAL_RANK={local_rank} exceeds RANK={rank} (a process's rank on its node cannot pass "
                         "its global rank)")
    if world == 1:
        return TorchrunEnv(rank, world, local_rank, local_world)
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        if name not in raw:
            raise _env_error(f"WORLD_SIZE={world} but {name} is not set (where the processes meet)")
    if not _HOST.match(raw["MASTER_ADDR"]):
        raise _env_error(f"MASTER_ADDR={raw['MASTER_ADDR'][:80]!r} is not a host name or address")
    port = raw["MASTER_PORT"]
    if not re.fullmatch(r"\d{1,5}", port) or not 1 <= int(port) <= 65535:
        raise _env_error(f"MASTER_PORT={port[:80]!r} is not a port number (1-65535)")
    return TorchrunEnv(rank, world, local_rank, local_world, raw["MASTER_ADDR"], int(port))


def env_rank() -> int:
    """This process's rank under torchrun (0 without it): who may print and write before the group exists."""
    return torchrun_env().rank


def env_world_size() -> int:
    return torchrun_env().world_size


# ---- the layout: tensor-parallel groups of N consecutive ranks, data-parallel groups across them --------------

@dataclass(frozen=True)
class Layout:
    """How `world_size` processes split for a target sharded `tensor_parallel` ways: ranks d*N .. d*N+N-1 form
    tensor-parallel group d (they hold one copy of the target between them and see the same data), and the
    ranks with the same position t in their group form data-parallel group t (the drafter's DDP/FSDP group).
    This is transformers' own mesh order (..., dp, tp: tp innermost), so its shards meet ours."""

    rank: int = 0
    world_size: int = 1
    tensor_parallel: int = 1

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tensor_parallel

    @property
    def dp_rank(self) -> int:
        return self.rank // self.tensor_parallel

    @property
    def dp_size(self) -> int:
        return self.world_size // self.tensor_parallel

    @property
    def writes(self) -> bool:
        """The one process of its tensor-parallel group that writes what the group computed."""
        return self.tp_rank == 0

    def tp_group_ranks(self, d: int | None = None) -> list[int]:
        d = self.dp_rank if d is None else d
        return list(range(d * self.tensor_parallel, (d + 1) * self.tensor_parallel))

    def dp_group_ranks(self, t: int | None = None) -> list[int]:
        t = self.tp_rank if t is None else t
        return list(range(t, self.world_size, self.tensor_parallel))


def layout(tensor_parallel: int = 1) -> Layout:
    """The layout of this process, or one line when target.tensor_parallel does not divide the processes."""
    env = torchrun_env()
    if tensor_parallel < 1 or env.world_size % tensor_parallel:
        raise PdraftError(f"target.tensor_parallel {tensor_parallel} does not divide the {env.world_size} "
                          f"process(es) (WORLD_SIZE)",
                          hint=f"start a multiple of {tensor_parallel} processes (torchrun --nproc_per_node), or "
                               "change target.tensor_parallel")
    return Layout(env.rank, env.world_size, tensor_parallel)


# ---- joining the group, and every wait for peers bounded and said -------------------------------------------

DEFAULT_DIST_TIMEOUT_S = 600.0
_SAY_EVERY_S = 30.0  # how often a waiting process says again whom it waits for
_BEAT_EVERY_S = 2.0
_group: dict = {}  # this process's store, its prefix, its heartbeat thread and how many waits it made


def _say(message: str) -> None:
    sys.stderr.write(message + "\n")
    sys.stderr.flush()


def _ranks(ranks: list[int]) -> str:
    shown = ", ".join(map(str, ranks[:16])) + (f" and {len(ranks) - 16} more" if len(ranks) > 16 else "")
    return f"rank{'s' if len(ranks) > 1 else ''} {shown}"


def _connect(env: TorchrunEnv, timeout_s: float):
    """The rendezvous store at MASTER_ADDR:MASTER_PORT: torchrun's agent hosts it (TORCHELASTIC_USE_AGENT_STORE),
    else rank 0 does. A process that cannot reach it says so every _SAY_EVERY_S until timeout_s."""
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    timeout = timedelta(seconds=timeout_s)
    if env.rank == 0 and not agent:
        try:
            return dist.TCPStore(env.master_addr, env.master_port, None, True, timeout, wait_for_workers=False,
                                 multi_tenant=True)
        except (RuntimeError, OSError) as e:
            raise PdraftError(f"rank 0 cannot listen at MASTER_ADDR:MASTER_PORT {env.endpoint} "
                              f"({str(e).splitlines()[0][:160] if str(e) else type(e).__name__})",
                              hint="is that port already in use? pick another MASTER_PORT") from None
    start = time.monotonic()
    said = start
    while True:
        # A plain socket probe first: torch's own client retries log a C++ stack trace per attempt.
        try:
            with socket.create_connection((env.master_addr, env.master_port), timeout=2.0):
                pass
            store = dist.TCPStore(env.master_addr, env.master_port, None, False, timeout)
            return store
        except (RuntimeError, OSError):
            now = time.monotonic()
            if now - start > timeout_s:
                raise PdraftError(f"rank {env.rank}: nothing answered at MASTER_ADDR:MASTER_PORT {env.endpoint} "
                                  f"within runtime.dist_timeout_s={timeout_s:g} s (WORLD_SIZE={env.world_size})",
                                  hint="start rank 0 (and every other process), or check MASTER_ADDR and "
                                       "MASTER_PORT") from None
            if now - said >= _SAY_EVERY_S or (said == start and now - start >= 1.0):
                said = now
                _say(f"rank {env.rank}: waiting for rank 0 to open {env.endpoint} "
                     f"({now - start:.0f} s of {timeout_s:g} s)")
            time.sleep(0.25)


def _arrive(store, key: str, rank: int) -> None:
    """Say in the store that `rank` reached `key`: a counter to poll, and a list of who, to name the missing."""
    store.append(f"{key}/ranks", f"{rank} ")
    store.add(key, 1)


def _missing(store, key: str, world_size: int) -> list[int]:
    arrived = {int(r) for r in store.get(f"{key}/ranks").split()}
    return [r for r in range(world_size) if r not in arrived]


def _wait_all(store, key: str, env: TorchrunEnv, timeout_s: float, what: str, check_alive: bool) -> None:
    """Wait until every rank `_arrive`d at `key`, saying whom we wait for every _SAY_EVERY_S (and once after a
    second). Without check_alive the wait ends after timeout_s; with it a peer is waited for as long as its
    heartbeat goes on, and one silent for timeout_s ends the wait. One poll is one request to the store;
    naming the missing and reading their heartbeats are one request each, every few seconds."""
    start = time.monotonic()
    said = checked = start
    beats: dict[int, tuple[bytes, float]] = {}
    while store.add(key, 0) < env.world_size:
        now = time.monotonic()
        if check_alive and now - checked >= _BEAT_EVERY_S * 2:
            checked = now
            missing = _missing(store, key, env.world_size)
            for r, beat in zip(missing, store.multi_get([f"beat/{r}" for r in missing]) if missing else []):
                if r not in beats or beats[r][0] != beat:
                    beats[r] = (beat, now)
                elif now - beats[r][1] > timeout_s:
                    raise PdraftError(f"rank {env.rank}: rank {r} stopped answering while we wait {what} (silent "
                                      f"for {now - beats[r][1]:.0f} s; runtime.dist_timeout_s={timeout_s:g})",
                                      hint="look at that process's output: it died or hangs")
        elif not check_alive and now - start > timeout_s:
            missing = _missing(store, key, env.world_size)
            raise PdraftError(f"rank {env.rank}: {_ranks(missing)} of WORLD_SIZE={env.world_size} did not join at "
                              f"{env.endpoint} within runtime.dist_timeout_s={timeout_s:g} s",
                              hint="start every process (torchrun --nnodes N --nproc_per_node M on each node), "
                                   "or raise runtime.dist_timeout_s")
        if now - said >= _SAY_EVERY_S or (said == start and now - start >= 1.0):
            said = now
            _say(f"rank {env.rank}: waiting for {_ranks(_missing(store, key, env.world_size))} {what} "
                 f"({now - start:.0f} s)")
        time.sleep(0.05 if now - start < 1.0 else 0.25)


def _heartbeat(store, rank: int, stop: threading.Event) -> None:
    while not stop.wait(_BEAT_EVERY_S):
        try:
            store.add(f"beat/{rank}", 1)
        except RuntimeError:  # the store went away with rank 0: the waits report it
            return


def join_group(device: torch.device, timeout: timedelta | float | None = None, backend: str | None = None) -> None:
    """Join torchrun's process group once (NCCL on CUDA, Gloo otherwise); a no-op in a single process.

    Every process first meets the others in the rendezvous store, saying every _SAY_EVERY_S whom it still
    waits for, and gives up after `timeout` (runtime.dist_timeout_s) with one line naming the missing ranks;
    the same timeout then bounds every collective. A heartbeat thread lets `wait_for_peers` tell a slow peer
    from a dead one."""
    env = torchrun_env()
    if not env.distributed or dist.is_initialized():
        return
    timeout_s = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout or DEFAULT_DIST_TIMEOUT_S)
    backend = backend or ("nccl" if device.type == "cuda" else "gloo")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    base = _connect(env, timeout_s)
    joins = _group.get("joins", 0) + 1  # a process may join, leave and join again (tests, quickstart)
    prefix = f"pdraft/{os.environ.get('TORCHELASTIC_RUN_ID', '')}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', 0)}/{joins}"
    store = dist.PrefixStore(prefix, base)
    store.add(f"beat/{env.rank}", 0)  # exists from now on, for the waits that read every heartbeat at once
    _arrive(store, "joined", env.rank)
    _wait_all(store, "joined", env, timeout_s, f"to join at {env.endpoint} (WORLD_SIZE={env.world_size})",
              check_alive=False)
    dist.init_process_group(backend, store=dist.PrefixStore("pg", store), rank=env.rank,
                            world_size=env.world_size, timeout=timedelta(seconds=timeout_s))
    stop = threading.Event()
    # Its own connection to the store, so that the heartbeat never queues behind a wait of the main thread.
    beat = threading.Thread(target=_heartbeat, args=(dist.PrefixStore(prefix, base.clone()), env.rank, stop),
                            daemon=True, name="pdraft-heartbeat")
    beat.start()
    _group.update(store=store, base=base, stop=stop, thread=beat, timeout_s=timeout_s, waits=0, joins=joins)


def wait_for_peers(what: str) -> None:
    """Every process calls it at the same point; it returns once all have. Meant for waits on work that
    takes as long as it takes (another process's share of an export): a waiting process says whom it waits
    for every _SAY_EVERY_S, and a peer whose heartbeat stops for runtime.dist_timeout_s ends it with one line.
    Nothing to wait for in a single process."""
    env = torchrun_env()
    if not env.distributed:
        return
    if "store" not in _group:  # a group someone else made (benchmarks): a plain barrier is all there is
        if dist.is_initialized():
            dist.barrier()
        return
    store = _group["store"]
    _group["waits"] += 1
    key = f"wait/{_group['waits']}"
    _arrive(store, key, env.rank)
    _wait_all(store, key, env, _group["timeout_s"], f"to finish {what}", check_alive=True)


def leave_group() -> None:
    """Leave the process group at the end of a command (torch warns about a group left open)."""
    if "stop" in _group:
        _group["stop"].set()
        _group["thread"].join(timeout=2 * _BEAT_EVERY_S)
    if dist.is_initialized():
        dist.destroy_process_group()
    joins = _group.get("joins", 0)
    _group.clear()
    _group["joins"] = joins
