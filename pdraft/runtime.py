"""The one runtime every command uses: which device and dtype, how many CPU threads, which attention
kernel, and seeding. Built from the recipe's `runtime` section, so that `decode`, `train` and `bench` always
agree on where and how they compute.

Defaults: CUDA when present, else CPU; bfloat16 on GPU, float32 on CPU (bf16 matmuls are slow on most CPUs
and the embedded target is tiny). `OMP_WAIT_POLICY=PASSIVE` is set before torch is imported by the CLI,
because with the default policy idle OpenMP threads spin and a 2-core machine slows 4-10x whenever another
process is busy.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from datetime import timedelta

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from pdraft.errors import PdraftError  # noqa: E402

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class Runtime:
    device: torch.device
    dtype: torch.dtype
    seed: int
    threads: int | None
    attn_implementation: str
    cache_dir: str | None
    offline: bool

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    def describe(self) -> str:
        where = torch.cuda.get_device_name(self.device) if self.is_cuda else f"CPU ({torch.get_num_threads()} threads)"
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
    if device.type == "cuda" and device.index is None and "LOCAL_RANK" in os.environ:
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise PdraftError(f"runtime.device is {name!r} but no CUDA device is available", hint="use auto or cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise PdraftError(f"runtime.device is {name!r} but only {torch.cuda.device_count()} CUDA device(s) exist")
    return device


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
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


def make_runtime(section=None) -> Runtime:
    """Build the runtime from a recipe `runtime` section (or the defaults), apply threads and seed."""
    if section is None:
        from pdraft.recipe import RuntimeSection

        section = RuntimeSection()
    device = resolve_device(section.device)
    dtype = resolve_dtype(section.dtype, device)
    if section.threads:
        torch.set_num_threads(section.threads)
    seed_everything(section.seed)
    attn = "sdpa" if section.attn_implementation == "auto" else section.attn_implementation
    if attn == "flash_attention_2" and device.type != "cuda":
        raise PdraftError("runtime.attn_implementation flash_attention_2 needs a CUDA device", hint="use auto or sdpa on CPU")
    return Runtime(device=device, dtype=dtype, seed=section.seed, threads=section.threads,
                   attn_implementation=attn, cache_dir=section.cache_dir, offline=is_offline(section.offline))


# Process-group membership under torchrun. It lives here, below every package, because export-hidden (cache)
# and training (train) both join the group; pdraft.train.distributed builds the training world on top.

def env_rank() -> int:
    """This process's rank under torchrun (0 without it): who may print before the group exists."""
    return int(os.environ.get("RANK", "0"))


def env_world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def join_group(device: torch.device, timeout: timedelta | None = None, backend: str | None = None) -> None:
    """Join torchrun's process group once (NCCL on CUDA, Gloo otherwise); a no-op in a single process."""
    if env_world_size() <= 1 or dist.is_initialized():
        return
    backend = backend or ("nccl" if device.type == "cuda" else "gloo")
    kwargs = {"timeout": timeout} if timeout is not None else {}
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, **kwargs)


def leave_group() -> None:
    """Leave the process group at the end of a command (torch warns about a group left open)."""
    if dist.is_initialized():
        dist.destroy_process_group()
