"""Memory planned before it is spent (issue 45, class 9): what one level of the serving sweep holds, estimated from
the target's config before the level runs, against what the machine has available. A level of C requests in
flight holds, on the device the target runs on:

- the target's static KV cache: 2 (keys, values) x layers x C rows x KV heads x capacity x head dim x the dtype's
  bytes, the capacity being the longest prompt plus the token budget (pdraft.decode.engine.generate);
- the verify pass's logits and the probabilities made from them: C x (gamma + 1) x vocab x 4 bytes, twice;
- the drafter's distributions, q and its copy over the target's vocabulary: C x gamma x vocab x 4 bytes, twice;
- the drafter's own context or KV cache, counted as one more layer of the target's KV cache;
- with the generate() baseline, its static padded batch of C rows: an attention mask of C x capacity x capacity
  x 4 bytes at the prefill (transformers builds the 4D mask of a padded batch).

These are the terms that grow with C; the weights are already loaded and counted by what is available. A level
whose estimate passes FRACTION of the available memory is refused before the sweep runs anything, in one line
with both figures and the largest level that fits (4096 requests of a tiny target asked 4.7 GB of a small
machine before the first round). The figure is an estimate of the dominant allocations, not a measurement.

The plan covers every batch a bench forms: each serving level's C rows, and the gamma sweep's static batches
(min(batch size, prompts per set) rows, planned at the sweep's largest gamma). What is available is what this
process may really take, the smallest of (issue 60: a sweep sized from the host's MemAvailable ran a memory-
limited job past its limit): the host's MemAvailable; the room left under the cgroup's memory limit (v2
memory.max, v1 memory.limit_in_bytes, less what the group holds beyond its reclaimable file cache); and the
room under the process's RLIMIT_AS and RLIMIT_DATA (less its virtual and data sizes now)."""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

from pdraft.decode.static_target import capacity_for
from pdraft.errors import PdraftError

FRACTION = 0.8  # of the available memory a level may plan to hold: the rest is for activations and the allocator


def human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    return f"{n:.1f} TB"


def level_bytes(config, dtype_bytes: int, rows: int, capacity: int, gamma: int, generate_baseline: bool = False
                ) -> dict[str, int]:
    """The dominant allocations of one level (module docstring), by what they are."""
    layers = int(config.num_hidden_layers)
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or int(config.hidden_size) // heads)
    vocab = int(config.vocab_size)
    layer_kv = 2 * rows * kv_heads * capacity * head_dim * dtype_bytes
    return {"target KV cache": layers * layer_kv,
            "verify logits": 2 * rows * (gamma + 1) * vocab * 4,
            "draft distributions": 2 * rows * gamma * vocab * 4,
            "drafter context": layer_kv if gamma else 0,
            "generate() padded batch": rows * capacity * capacity * 4 if generate_baseline else 0}


def _read_int(path: str) -> int | None:
    try:
        with open(path, encoding="ascii") as f:
            text = f.read().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() else None  # "max" (no limit) and anything unreadable: None


def _stat_field(path: str, key: str) -> int:
    try:
        with open(path, encoding="ascii") as f:
            for line in f:
                name, _, value = line.partition(" ")
                if name == key and value.strip().isdigit():
                    return int(value)
    except (OSError, UnicodeDecodeError):
        pass
    return 0


NO_LIMIT = 1 << 60  # cgroup v1 writes "no limit" as a page-rounded 2**63 - 1


def cgroup_room(root: str = "/sys/fs/cgroup") -> int | None:
    """Bytes this process's cgroup may still take (its limit less what it holds beyond reclaimable file cache),
    None without a limit. cgroup v2 (memory.max) first, then v1 (memory/memory.limit_in_bytes)."""
    for limit_file, used_file, stat_file, inactive in (
            ("memory.max", "memory.current", "memory.stat", "inactive_file"),
            ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes", "memory/memory.stat",
             "total_inactive_file")):
        limit = _read_int(f"{root}/{limit_file}")
        if limit is None or limit >= NO_LIMIT:
            continue
        used = _read_int(f"{root}/{used_file}") or 0
        held = max(0, used - _stat_field(f"{root}/{stat_file}", inactive))
        return max(0, limit - held)
    return None


def rlimit_room() -> int | None:
    """Bytes left under RLIMIT_AS (less the virtual size now) and RLIMIT_DATA (less the data size now), None when
    neither is set."""
    try:
        import resource
    except ImportError:  # not POSIX
        return None
    sizes = {"VmSize": 0, "VmData": 0}
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in sizes:
                    sizes[key] = int(value.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    rooms = []
    for limit, used in ((resource.RLIMIT_AS, sizes["VmSize"]), (getattr(resource, "RLIMIT_DATA", None), sizes["VmData"])):
        if limit is None:
            continue
        soft, _ = resource.getrlimit(limit)
        if soft != resource.RLIM_INFINITY:
            rooms.append(max(0, soft - used))
    return min(rooms) if rooms else None


def host_available() -> int | None:
    """The host's MemAvailable (Linux), else the free physical pages, else None."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def available_bytes(device: torch.device) -> int | None:
    """Memory free for new allocations on `device` (CUDA: the driver's free figure; CPU: the smallest of the
    host's MemAvailable, the cgroup's room and the rlimits' room), None when the platform says nothing."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    known = [x for x in (host_available(), cgroup_room(), rlimit_room()) if x is not None]
    return min(known) if known else None


def check_levels(config, dtype_bytes: int, device: torch.device, levels: Sequence[int], prompts: Sequence[Sequence[int]],
                 max_new_tokens: int, max_positions: int, gamma: int, *, generate_baseline: bool = False,
                 available: int | None = None, name: str = "bench.concurrency") -> None:
    """Refuse, before anything runs, the first level whose plan passes FRACTION of the available memory. `name`
    is the setting that formed the batches (the serving sweep's levels, the gamma sweep's batch size)."""
    available = available_bytes(device) if available is None else available
    if available is None or not prompts:
        return
    capacity = capacity_for(min(max(len(p) for p in prompts) + max_new_tokens, max_positions), max_positions)
    budget = FRACTION * available

    def need(c: int) -> dict[str, int]:  # C rows: a level keeps C requests in flight
        return level_bytes(config, dtype_bytes, c, capacity, gamma, generate_baseline)

    for level in sorted(levels):
        parts = need(level)
        total = sum(parts.values())
        if total > budget:
            fits = [c for c in range(1, level) if sum(need(c).values()) <= budget]
            largest = f"the largest level that fits is {max(fits)}" if fits else "no level fits"
            shown = ", ".join(f"{k} {human(v)}" for k, v in parts.items() if v)
            raise PdraftError(f"{name} {level}: the level would hold about {human(total)} ({shown}; capacity "
                              f"{capacity} positions, gamma {gamma}), more than {FRACTION:.0%} of the "
                              f"{human(available)} available on {device.type}; {largest}",
                              hint="lower the concurrency levels, bench.max_new_tokens or the gammas")


def check_bench_batches(target_model, levels: Sequence[int], prompts: Sequence[Sequence[int]], settings, gamma: int,
                        *, name: str = "bench.concurrency") -> None:
    """check_levels for a bench's batches of `levels` rows (the serving sweep's levels, the gamma sweep's batch) on
    the loaded target, with the bench's settings (new tokens, the generate() baseline)."""
    param = next(target_model.parameters())
    positions = int(getattr(target_model.config, "max_position_embeddings", 0) or 2**31)
    check_levels(target_model.config, param.element_size(), param.device, levels, prompts,
                 settings.decode.max_new_tokens, positions, gamma, generate_baseline=settings.generate_baseline,
                 name=name)


__all__ = ["FRACTION", "check_bench_batches", "level_bytes", "available_bytes", "cgroup_room", "rlimit_room", "check_levels", "human"]
