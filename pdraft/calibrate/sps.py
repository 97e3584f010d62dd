"""The scheduler's cost table: the target's steps per second SPS(B) for a verification forward of B tokens,
profiled on the current device, smoothed, and stored in SGLang's `--speculative-dspark-sps-table-path` layout.

Layout (SpsCostTable in python/sglang/srt/speculative/dspark_components/dspark_sps.py): `sample_batch_tokens`
(strictly increasing ints), `sample_steps_per_sec` (same length) and `max_batch_tokens`; pdraft adds a
`pdraft` object (device, torch version, date, raw medians, context length, smoothing, and `measured_in`: the
engine that measured it, {"engine": "pdraft" or a serving engine's name, "version"}) that SGLang's msgspec
loader ignores. pdraft.policies.cost.SpsTable reads the same file, whoever measured it.

Who measures: pdraft's own verifier (`profile`, below), or a serving engine (`calibrate-threshold --engine vllm`:
pdraft.serving.api.Engine.sps_profiler returns its step times at the same `profile_points`, and `cost_table`
smooths and stores them the same way), so that a policy deployed in that engine plans with its costs.

pdraft's measurement: what the decode engine itself pays for one verify step of B tokens in total. For every B of
`profile_points` (every B up to 32, then every 8th up to max_batch_tokens: the fit needs no more), the
engine's own packed verifier on the backend decode runs (so the cost follows the
B = sum(1 + l_r) of the paper's cost model) holds `requests` requests whose KV caches hold `context` tokens;
B tokens are spread over min(B, requests) of them, and one timed step is verify + acceptance + rollback, so
mask building, packing and per-call overhead are in the figure (timing a bare B-token model forward left
them out and made short verify passes look cheaper than they are). The median over `repeats` timed steps
(after a warm-up) gives SPS(B) = 1 / median seconds, as SGLang profiles whole verify steps. The drafter's
own time per round is not in the table (it does not depend on the verify lengths). Smoothing: the table
stores 1 / T(B) of a least-squares roofline fit T(B) = max(flat, a + k B) of the step times (`roofline_fit`
says why a convex fit) at every B = 1..max_batch_tokens; the raw medians stay in the metadata with the B
they were measured at. `smooth` (isotonic non-increasing fit joined
between block centres) was the table's smoothing before and stays for callers; on a shared CPU the noise
left kinks in its slope that stopped the scheduler's early stop far too soon.
"""

from __future__ import annotations

import datetime
import json
import statistics
import time
import warnings
from pathlib import Path

import torch

from pdraft import __version__
from pdraft.calibration_files import DeviceMismatchWarning, device_mismatch, device_name
from pdraft.policies.cost import SpsTable
from pdraft.errors import PdraftError
from pdraft import ledger

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


def roofline_fit(seconds: list[float], at: list[int] | None = None, upto: int | None = None) -> list[float]:
    """Least-squares fit of T(B) = max(flat, a + k * B), k >= 0, to the step times measured at B = `at`
    (default 1..len(seconds)), evaluated at B = 1..`upto` (default the largest B measured); the knee is chosen
    by trying each measured B. Why this shape: Theta = tau * SPS(B) along Algorithm 1's admission path has a
    concave numerator (each admitted token adds a smaller a_{r,j}) and, with a convex non-decreasing step time,
    Theta = tau / T is unimodal, so the early stop halts at the global maximum of the path instead of at a
    noise dip; a flat-then-linear curve is the simplest convex one and matches both a GPU (flat until the
    batch saturates it) and a CPU (per-call overhead plus a per-token cost)."""
    n = len(seconds)
    xs = [float(b) for b in (at or range(1, n + 1))]
    every = [float(b) for b in range(1, int(upto or xs[-1]) + 1)]
    if n < 3:
        flat = sum(seconds) / n
        return [flat] * len(every)

    def line(lo: int) -> tuple[float, float]:  # least-squares a + k * B over the points lo.., k >= 0
        x, y = xs[lo:], seconds[lo:]
        mx, my = sum(x) / len(x), sum(y) / len(y)
        sxx = sum((u - mx) ** 2 for u in x)
        k = max(0.0, sum((u - mx) * (v - my) for u, v in zip(x, y)) / sxx) if sxx > 0 else 0.0
        return my - k * mx, k

    best, best_curve = float("inf"), (sum(seconds) / n, 0.0, 0.0)
    for knee in range(0, n - 1):
        flat = sum(seconds[: knee + 1]) / (knee + 1)
        a, k = line(knee)
        sse = sum((max(flat, a + k * x) - v) ** 2 for x, v in zip(xs, seconds))
        if sse < best:
            best, best_curve = sse, (flat, a, k)
    flat, a, k = best_curve
    return [max(flat, a + k * x) for x in every]


def profile_points(max_batch_tokens: int, dense: int = 32, stride: int = 8) -> list[int]:
    """The B the profile measures: every B up to `dense`, then every `stride`-th, and the largest. The stored
    table holds the roofline fit at every B = 1..max_batch_tokens; a fit of two lines needs no more points,
    and the step time at large B is what the profile spent most of its time on (about 7x less measuring at
    the quickstart's 336 tokens)."""
    points = list(range(1, min(dense, max_batch_tokens) + 1))
    points += list(range(dense + stride, max_batch_tokens, stride))
    return points + ([max_batch_tokens] if points[-1] != max_batch_tokens else [])


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def measure(model: torch.nn.Module, max_batch_tokens: int, *, repeats: int = 5, context: int = 128,
            vocab_size: int | None = None, seed: int = 0, requests: int = 8, on_progress=None,
            compile: str = "auto", points: list[int] | None = None) -> list[float]:
    """Median seconds of the engine's verify step over B tokens in total, for B in `points` (default
    1..max_batch_tokens): the
    decode loop's own packed verifier, on the backend decode runs with `compile` (pdraft.decode.backend: the
    reference runner or the static cache), holds `requests` requests of `context` tokens;
    B tokens are spread as evenly as possible over min(B, requests) of them (the others sit the step out, as
    finished requests do), and one step is verify + greedy acceptance + the rollback of every verified token,
    so mask building, packing, logits and per-call overhead are all in the figure."""
    from pdraft.decode import backend as backends
    from pdraft.decode.acceptance import accept

    param = next(model.parameters())
    device = param.device
    vocab = int(vocab_size or model.config.vocab_size)
    limit = int(getattr(model.config, "max_position_embeddings", 1 << 30))
    requests = max(1, int(requests))
    longest = -(-max_batch_tokens // min(requests, max_batch_tokens))  # widest row at the largest B
    context = fit_context(context, max_batch_tokens, requests, limit)
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(0, vocab, (requests, context), generator=g).tolist()
    runner = backends.target_runner(model, None, backends.resolve(compile, model), room=longest + 1)
    runner.prefill(prompts)
    anchors = torch.tensor([p[-1] for p in prompts], device=device)  # [requests]
    anchor_positions = torch.full((requests,), context - 1, dtype=torch.long, device=device)
    drafts = torch.randint(0, vocab, (requests, longest - 1), generator=g).to(device)  # [requests, L]
    drop = torch.full((requests,), -1, dtype=torch.long, device=device)

    def lengths_for(b: int) -> torch.Tensor:
        rows = min(b, requests)
        lengths = torch.full((requests,), -1, dtype=torch.long)
        for r in range(rows):
            lengths[r] = b // rows + (1 if r < b % rows else 0) - 1  # each row verifies 1 + l tokens
        return lengths.to(device)

    def step(b: int) -> float:
        lengths = lengths_for(b)
        width = int(lengths.max())
        _sync(device)
        t0 = time.perf_counter()
        logits, _ = runner.verify(anchors, anchor_positions, drafts[:, :width], lengths)  # [requests, L+1, V]
        accept(logits, drafts[:, :width], None, lengths.clamp(min=0), None)
        runner.commit(drop)  # roll every verified token back: the cache returns to `context` tokens
        _sync(device)
        return time.perf_counter() - t0

    for b in (1, max_batch_tokens, 1):  # warm-up: allocator, kernels, caches
        step(b)
    medians = []
    for b in points or range(1, max_batch_tokens + 1):
        medians.append(statistics.median(step(b) for _ in range(repeats)))
        if on_progress is not None:
            on_progress(b, max_batch_tokens)
    return medians


def fit_context(context: int, max_batch_tokens: int, requests: int, limit: int) -> int:
    """The KV context a profile can hold: `context` cut so that it plus the widest row at the largest B
    (max_batch_tokens over min(requests, max_batch_tokens) rows) fits the target's `limit` positions."""
    longest = -(-max_batch_tokens // min(max(1, requests), max_batch_tokens))
    if context + longest > limit:
        context = max(2, limit - longest)
        if context + longest > limit:
            raise PdraftError(f"cannot profile {max_batch_tokens}-token batches: the target's context is {limit} "
                              "tokens", hint="lower calibrate.sps_max_batch_tokens")
    return context


def profile(model: torch.nn.Module, max_batch_tokens: int, *, repeats: int = 5, context: int = 128,
            target: str = "", requests: int = 8, on_progress=None, compile: str = "auto") -> dict:
    """Measure with pdraft's own verifier, smooth and return the cost table as a dict in SGLang's layout plus
    pdraft metadata."""
    points = profile_points(max_batch_tokens)
    seconds = measure(model, max_batch_tokens, repeats=repeats, context=context, requests=requests,
                      on_progress=on_progress, compile=compile, points=points)
    device = next(model.parameters()).device
    return cost_table(seconds, points, max_batch_tokens, device=device_name(device), device_type=device.type, meta={
        "target": target, "context_tokens": int(context), "requests": int(requests), "repeats": int(repeats),
        "measured_in": {"engine": "pdraft", "version": __version__},
        "measured": "engine verify step (packed verify + accept + rollback), B tokens in total",
        "compile": compile})


def cost_table(seconds: list[float], points: list[int], max_batch_tokens: int, *, device: str, device_type: str,
               meta: dict) -> dict:
    """The table SGLang and pdraft.policies.cost.SpsTable read from the median step `seconds` measured at the B of
    `points`, by whichever engine measured them (`meta["measured_in"]` names it: pdraft's own verifier or a serving
    engine, pdraft.serving.api.Engine.sps_profiler): the roofline fit at every B = 1..max_batch_tokens, the raw
    medians and `meta` in the `pdraft` object."""
    return {
        "sample_batch_tokens": list(range(1, max_batch_tokens + 1)),
        "sample_steps_per_sec": [1.0 / t for t in roofline_fit(seconds, points, max_batch_tokens)],
        "max_batch_tokens": int(max_batch_tokens),
        "pdraft": {
            "device": device,
            "device_type": device_type,
            "torch_version": torch.__version__,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            **meta,
            "statistic": "median seconds per verify step, steps/s = 1 / median",
            "smoothing": "least-squares roofline of the step time, max(flat, a + k B) (roofline_fit)",
            "measured_batch_tokens": list(points),
            "raw_steps_per_sec": [1.0 / s for s in seconds],  # at measured_batch_tokens
        },
    }


def save_sps_table(data: dict, path: str | Path) -> Path:
    SpsTable.from_dict(data)  # refuse to write a table the scheduler could not read
    path = Path(path)
    ledger.write_text(path, json.dumps(data, indent=2) + "\n")
    return path


def load_sps_table(path: str | Path, device: torch.device | str | None = None) -> SpsTable:
    """SpsTable from a file; warns (DeviceMismatchWarning) when pdraft measured it on another device than
    `device` (default: the device pdraft would run on). Tables without pdraft metadata (e.g. SGLang's) load
    silently."""
    table = SpsTable.load(path)
    msg = device_mismatch(path, table.device, device)
    if msg:
        warnings.warn(msg, DeviceMismatchWarning, stacklevel=2)
    return table
