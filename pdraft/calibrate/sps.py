"""The scheduler's cost table: the target's steps per second SPS(B) for a verification forward of B tokens,
profiled on the current device, smoothed, and stored in SGLang's `--speculative-dspark-sps-table-path` layout.

Layout (SpsCostTable in python/sglang/srt/speculative/dspark_components/dspark_sps.py): `sample_batch_tokens`
(strictly increasing ints), `sample_steps_per_sec` (same length) and `max_batch_tokens`; pdraft adds a
`pdraft` object (device, torch version, date, raw medians, context length, smoothing) that SGLang's msgspec
loader ignores. pdraft.decode.scheduler.SpsTable reads the same file.

Measurement: for every B = 1..max_batch_tokens, one sequence whose KV cache already holds `context` tokens
runs a forward of B new tokens, the cache is cropped back, and the median over `repeats` timed forwards
(after a warm-up) gives SPS(B) = 1 / median seconds. SGLang profiles whole verify steps of R requests; one
sequence of B tokens is a simplification that ignores the extra KV reads of many requests, so on a GPU the
table is optimistic for large batches of long contexts. Smoothing: an isotonic (pool-adjacent-violators)
non-increasing fit, because a wider forward is never truly faster and a dip would make the scheduler's
early stop (paper Algorithm 1) halt at a spurious local optimum; isotonic regression keeps the least-squares
closest such curve, where a running minimum would bias every later value down to the luckiest outlier.
Its constant blocks are then joined linearly between their centres (see `smooth`), so that the curve
decreases steadily instead of in plateaus and cliffs that trap the early stop.
"""

from __future__ import annotations

import datetime
import json
import platform
import statistics
import time
import warnings
from pathlib import Path

import torch

from pdraft.decode.scheduler import SpsTable
from pdraft.errors import PdraftError
from pdraft.paths import atomic_write_text

SPS_NAME = "sps_table.json"


class DeviceMismatchWarning(UserWarning):
    """A cost table measured on another device type: its SPS curve says little about this one."""


def device_name(device: torch.device | str | None = None) -> str:
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"CPU {cpu}"


def isotonic_non_increasing(values: list[float]) -> list[float]:
    """Least-squares non-increasing fit (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, weight]
    for v in values:
        blocks.append([float(v), 1.0])
        while len(blocks) > 1 and blocks[-2][0] < blocks[-1][0]:
            (m1, w1), (m2, w2) = blocks[-2], blocks[-1]
            blocks[-2:] = [[(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2]]
    return [m for m, w in blocks for _ in range(int(w))]


def smooth(values: list[float]) -> list[float]:
    """Isotonic non-increasing fit, then linear interpolation between the centres of its constant blocks.
    The plateaus-and-drops of a bare isotonic fit make Theta = tau * SPS(B) rise along a plateau and fall at
    each drop, so the scheduler's early stop would halt at the first drop (the "SPS cliff" trap of paper
    section 5.2); the interpolated curve is still non-increasing but decreases steadily between centres."""
    iso = isotonic_non_increasing(values)
    knots: list[tuple[float, float]] = []  # (centre index, block value)
    start = 0
    for i in range(1, len(iso) + 1):
        if i == len(iso) or iso[i] != iso[start]:
            knots.append(((start + i - 1) / 2.0, iso[start]))
            start = i
    if len(knots) < 2:
        return iso
    out = []
    for x in range(len(iso)):
        if x <= knots[0][0]:
            out.append(knots[0][1])
        elif x >= knots[-1][0]:
            out.append(knots[-1][1])
        else:
            j = next(k for k in range(1, len(knots)) if knots[k][0] >= x)
            (x0, y0), (x1, y1) = knots[j - 1], knots[j]
            out.append(y0 + (y1 - y0) * (x - x0) / (x1 - x0))
    return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def measure(model: torch.nn.Module, max_batch_tokens: int, *, repeats: int = 5, context: int = 128,
            vocab_size: int | None = None, seed: int = 0, on_progress=None) -> list[float]:
    """Median seconds of a B-token forward over a `context`-token KV cache, for B = 1..max_batch_tokens."""
    from transformers import DynamicCache

    param = next(model.parameters())
    device = param.device
    vocab = int(vocab_size or model.config.vocab_size)
    limit = int(getattr(model.config, "max_position_embeddings", 1 << 30))
    if context + max_batch_tokens > limit:
        context = max(1, limit - max_batch_tokens)
        if context + max_batch_tokens > limit:
            raise PdraftError(f"cannot profile {max_batch_tokens}-token batches: the target's context is {limit} "
                              "tokens", hint="lower calibrate.sps_max_batch_tokens")
    g = torch.Generator().manual_seed(seed)
    prefix = torch.randint(0, vocab, (1, context), generator=g).to(device)  # [1, context]
    cache = DynamicCache(config=model.config)
    model(input_ids=prefix, cache=cache, use_cache=True, logits_to_keep=1)
    tokens = torch.randint(0, vocab, (1, max_batch_tokens), generator=g).to(device)  # [1, max_batch_tokens]

    def step(b: int) -> float:
        ids = tokens[:, :b]
        positions = torch.arange(context, context + b, device=device).unsqueeze(0)  # [1, b]
        _sync(device)
        t0 = time.perf_counter()
        # All logits, as a verify pass needs them for every drafted position.
        model(input_ids=ids, position_ids=positions, cache=cache, use_cache=True, logits_to_keep=0)
        _sync(device)
        elapsed = time.perf_counter() - t0
        cache.crop(-b)  # drop the b new tokens (transformers 5 crops by a negative count)
        return elapsed

    for b in (1, max_batch_tokens, 1):  # warm-up: allocator, kernels, caches
        step(b)
    medians = []
    for b in range(1, max_batch_tokens + 1):
        medians.append(statistics.median(step(b) for _ in range(repeats)))
        if on_progress is not None:
            on_progress(b, max_batch_tokens)
    return medians


def profile(model: torch.nn.Module, max_batch_tokens: int, *, repeats: int = 5, context: int = 128,
            target: str = "", on_progress=None) -> dict:
    """Measure, smooth and return the cost table as a dict in SGLang's layout plus pdraft metadata."""
    seconds = measure(model, max_batch_tokens, repeats=repeats, context=context, on_progress=on_progress)
    raw = [1.0 / s for s in seconds]
    device = next(model.parameters()).device
    return {
        "sample_batch_tokens": list(range(1, max_batch_tokens + 1)),
        "sample_steps_per_sec": smooth(raw),
        "max_batch_tokens": int(max_batch_tokens),
        "pdraft": {
            "device": device_name(device),
            "device_type": device.type,
            "torch_version": torch.__version__,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "target": target,
            "context_tokens": int(context),
            "repeats": int(repeats),
            "statistic": "median seconds per forward, steps/s = 1 / median",
            "smoothing": "isotonic non-increasing (pool adjacent violators), linear between block centres",
            "raw_steps_per_sec": raw,
        },
    }


def save_sps_table(data: dict, path: str | Path) -> Path:
    SpsTable.from_dict(data)  # refuse to write a table the scheduler could not read
    path = Path(path)
    atomic_write_text(path, json.dumps(data, indent=2) + "\n")
    return path


def find_sps_table(drafter_dir: str | Path) -> Path | None:
    """The cost table calibrate-threshold wrote next to a drafter, or None."""
    path = Path(drafter_dir) / SPS_NAME
    return path if path.is_file() else None


def load_sps_table(path: str | Path, device: torch.device | str | None = None) -> SpsTable:
    """SpsTable from a file; warns (DeviceMismatchWarning) when pdraft measured it on another device than
    `device` (default: the device pdraft would run on). Tables without pdraft metadata (e.g. SGLang's) load
    silently."""
    table = SpsTable.load(path)
    msg = device_mismatch(path, device)
    if msg:
        warnings.warn(msg, DeviceMismatchWarning, stacklevel=2)
    return table


def device_mismatch(path: str | Path, device: torch.device | str | None = None) -> str | None:
    try:
        meta = json.loads(Path(path).read_text()).get("pdraft") or {}
    except (OSError, json.JSONDecodeError, AttributeError):
        return None
    measured = meta.get("device")
    here = device_name(device)
    if measured and measured != here:
        return (f"cost table {path} was measured on {measured} but this run uses {here}: scheduling will follow "
                f"the other device's throughput curve; re-profile with calibrate-threshold on this device")
    return None
