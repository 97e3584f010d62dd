"""How a decode run executes, chosen once from the one setting `decode.compile` (auto | on | off) and the device:

    off    the reference: transformers' own forward on a DynamicCache (pdraft.decode.target_runner) and the
           drafter's eager pass. Runs any causal LM; every fast path is tested against it.
    auto   static caches (pdraft.decode.static_target, pdraft.models.context_cache) wherever the target's
           family is covered, else the reference; compiled on CUDA only (`torch.compile`, CUDA graphs per
           (batch, width) bucket). On a CPU the static path runs eagerly, because compiling costs tens of seconds
           per graph on a small CPU, more than a quickstart's whole decode saves (docs/PERFORMANCE.md).
    on     static caches and compiled passes on every device; an error if the target's family is not covered.

Compiled code lives as long as the process, in one entry per (target, feature layers) and per drafter, so
the same compiled code serves every later request and every later generate() call (bench excludes its
compile time from TPOT for that reason and reports it separately). On CUDA the target step and the drafter
pass are compiled with mode "reduce-overhead" (inductor's CUDA graph trees: one graph per distinct input
shape, i.e. per (batch, width) bucket) over the padded grid, whose every shape is static, with the caches'
buffers marked static so graphs write them in place. That CUDA path is written and its pieces CPU-tested;
it has NOT been measured on a GPU.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from pdraft.decode.settings import COMPILE_MODES
from pdraft.decode.static_target import LeanTarget, StaticVerifier, unsupported_reason, windowed_attention
from pdraft.decode.target_runner import make_verifier
from pdraft.errors import PdraftError


@dataclass(frozen=True)
class Backend:
    """What one decode run runs on (`resolve`)."""

    mode: str  # the setting: auto | on | off
    static: bool  # static target KV cache and context cache, the target's lean forward
    compiled: bool  # torch.compile of the target step and the drafter pass
    graphs: bool  # CUDA graphs (compiled on CUDA), over the padded grid
    why: str  # one line for reports

    @property
    def name(self) -> str:
        return "reference eager" if not self.static else ("static compiled" + (" + CUDA graphs" if self.graphs else "")
                                                          if self.compiled else "static eager")


def check_decodable(config, target_id: str) -> None:
    """Refuse, from the target's config and before its weights load, a target no decode path can run: both the
    static path and the reference path verify drafts under a full causal mask, so a sliding-window layer would
    attend where the target does not (transformers' own forward crashed or diverged on it)."""
    reason = windowed_attention(config)
    if reason is not None:
        raise PdraftError(f"target {target_id!r} uses {reason}; pdraft's decode paths (static and reference) verify "
                          f"with a full causal mask and cannot run it",
                          hint="decode, bench, calibrate-threshold and the quickstart need a full-attention target")


def resolve(mode: str, model: torch.nn.Module) -> Backend:
    """The backend of `mode` (DecodeSettings.compile, checked there) for `model` on its device."""
    if mode not in COMPILE_MODES:
        raise ValueError(f"unknown decode.compile {mode!r}")
    cuda = next(model.parameters()).device.type == "cuda"
    if mode == "off":
        return Backend(mode, False, False, False, "decode.compile off: the reference path")
    reason = unsupported_reason(model)
    if reason is not None:
        if mode == "on":
            raise PdraftError(f"decode.compile on: the static path cannot run this target ({reason})",
                              hint="use decode.compile: auto or off")
        return Backend(mode, False, False, False, f"auto: reference path ({reason})")
    if mode == "on":
        return Backend(mode, True, True, cuda, "decode.compile on")
    if cuda:
        return Backend(mode, True, True, True, "auto on CUDA: static caches, compiled, CUDA graphs")
    return Backend(mode, True, False, False, "auto on CPU: static caches, eager (compiling does not pay back)")


@dataclass
class _Compiled:
    """One target's (or drafter's) compiled callables and the time their compilations took."""

    fn: object
    compile_s: float = 0.0
    shapes: set = field(default_factory=set)


# What a backend builds for a model or a drafter lives in the object's own __dict__ under this name (not a weak
# mapping: the entries refer back to the object, so they would keep it alive), and goes with it.
_ENTRY = "_pdraft_backend"


def _entries(obj) -> dict:
    return obj.__dict__.setdefault(_ENTRY, {})


# torch.compile's backend off CUDA. Tests set "aot_eager" (the same Dynamo graph, functionalised by AOTAutograd,
# run without inductor's C++ code generation, which takes minutes per graph on a small shared CPU).
CPU_COMPILER = "inductor"


def _compile(fn, graphs: bool):
    if graphs:  # one CUDA graph per distinct input shape: the padded grid's (batch, width)
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 256)
        return torch.compile(fn, mode="reduce-overhead", dynamic=False)
    return torch.compile(fn, dynamic=True, backend=CPU_COMPILER)


_CLOCK = [0.0]  # seconds spent compiling in this process, over every entry


def compile_clock() -> float:
    """Seconds this process has spent compiling so far: the engine reads it around each pass and takes the
    difference out of the pass's time (and reports it as compile time)."""
    return _CLOCK[0]


class _Timed:
    """Calls `compiled.fn`; a call with a shape signature not seen before is timed as compilation (its first
    run included: compiling is lazy, and the first run is where it happens)."""

    def __init__(self, compiled: _Compiled, signature):
        self.compiled, self.signature = compiled, signature

    def __call__(self, *args, **kwargs):
        sig = self.signature(*args, **kwargs)
        if sig in self.compiled.shapes:
            return self.compiled.fn(*args, **kwargs)
        start = time.perf_counter()
        out = self.compiled.fn(*args, **kwargs)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        spent = time.perf_counter() - start
        self.compiled.compile_s += spent
        _CLOCK[0] += spent
        self.compiled.shapes.add(sig)
        return out


def _step_signature(ids, positions, slots, index, grid_positions, keys, values, logits=True, attend=None):
    return ids.shape[0], tuple(grid_positions.shape), tuple(keys.shape), logits, attend is None


def target_runner(model: torch.nn.Module, layer_ids: Sequence[int] | None, backend: Backend, *, packed: bool = True,
                  room: int = 0):
    """The target side of one decode run: the reference runner, or a StaticVerifier whose step is eager or
    compiled (cached per model and feature layers, so it compiles once per process). `room` = new tokens the
    run may add past its longest prompt (sizes the static cache once)."""
    if not backend.static:
        return make_verifier(model, layer_ids, packed=packed)
    key = (tuple(layer_ids or ()), backend.compiled, backend.graphs)
    per_model = _entries(model)
    if key not in per_model:
        # Eager: q/k/v and gate/up as one matmul each (a copy of those weights, for the small targets a CPU
        # runs); compiled code reads the model's own weights.
        lean = LeanTarget(model, layer_ids, fuse=not backend.compiled)
        compiled = _Compiled(_compile(lean.forward, backend.graphs)) if backend.compiled else None
        if backend.graphs:  # graphs write the caches in place: their buffers must keep their addresses
            lean.on_new_cache = _mark_static
        per_model[key] = (lean, compiled)
    lean, compiled = per_model[key]
    step = _Timed(compiled, _step_signature) if compiled is not None else None
    # Packed verification needs a data-dependent token count; graphs need fixed shapes: the padded grid.
    return StaticVerifier(lean, step, room=room, padded=backend.graphs or not packed)


def _mark_static(cache) -> None:
    torch._dynamo.mark_static_address(cache.keys)
    torch._dynamo.mark_static_address(cache.values)


def drafter_pass(drafter, backend: Backend):
    """The drafter's propose for this run: the drafter's own, or compiled once per drafter for the process where
    its family declares a compilable pass (pdraft.models.api.Drafter.compilable_pass: the parallel backbone;
    EAGLE-3's chain, the n-gram lookup and test doubles run as they are)."""
    if not backend.compiled or not drafter.compilable_pass:
        return drafter.propose
    entries = _entries(drafter)
    if backend.graphs not in entries:
        entries[backend.graphs] = _Compiled(_compile(drafter.propose, backend.graphs))

    def signature(state, anchors, positions, gamma, sampling=None, uniforms=None):
        return anchors.shape[0], tuple(state.keys.shape), int(gamma), uniforms is None

    return _Timed(entries[backend.graphs], signature)


def gemm_plans(model: torch.nn.Module) -> list:
    """The measured product plans (pdraft.gemm.FastLinear) of every static runner built for `model`."""
    return [p for lean, _ in _entries(model).values() for p in lean.gemm_plans()]


def tune_cpu(model: torch.nn.Module, layer_ids: Sequence[int] | None, backend: Backend, width: int, setting,
             drafters: Sequence[torch.nn.Module] = ()):
    """The threads of a decode run on a CPU, by measurement when `setting` (runtime.threads) is "auto"
    (pdraft.threads.choose), timed on the run's own work: one target step and one verify pass of `width` tokens
    after a 128-token context (shorter where the target's positions end sooner), on the backend the run uses. The static path's products are then re-timed at the
    chosen threads (pdraft.gemm), since which backend is faster depends on them, and so are the plans of the
    `drafters` already loaded (decode loads its drafter first, to know the verify width: issue 59 found them timed
    at the default threads). -> a pdraft.threads.ThreadChoice (None on CUDA, where neither applies)."""
    from pdraft import threads

    if next(model.parameters()).device.type != "cpu":
        return None
    runner = target_runner(model, layer_ids, backend, room=width + 1)
    vocab = int(model.config.vocab_size)
    room = int(getattr(model.config, "max_position_embeddings", None) or 1 << 30) - width - 2  # a small target's
    context = [i % vocab for i in range(3, 3 + max(2, min(128, room)))]  # positions end before 128 tokens
    runner.prefill([context])
    anchor, pos = torch.tensor([context[-1]]), torch.tensor([len(context) - 1])
    drafts = torch.arange(1, width, dtype=torch.long).remainder(vocab).unsqueeze(0)  # [1, width - 1]
    drop = torch.tensor([-1])

    def probe():
        for w in (1, width):
            runner.verify(anchor, pos, drafts[:, : w - 1], torch.tensor([w - 1]))
            runner.commit(drop)

    with torch.no_grad():
        choice = threads.choose(probe, setting)
        if choice.measured:
            from pdraft.models.layers import product_plans

            plans = runner.lean.gemm_plans() if isinstance(runner, StaticVerifier) else []
            for plan in [*plans, *(p for d in drafters for p in product_plans(d))]:
                plan.measure()
    return choice


def cpu_runtime(model, layer_ids, decode, threads, width: int, drafters: Sequence[torch.nn.Module] = ()) -> dict:
    """The run's threads chosen on its own work (`tune_cpu`: `runtime.threads: auto` measures) and what ran, for
    bench.json, the bench footer and decode's statistics: dtype, threads, wait policy, the products' backends
    (every baseline of a bench runs in the same process, dtype and threads)."""
    from pdraft import gemm
    from pdraft.kernels import cpu_bf16, cpu_walks
    from pdraft.runtime import cpu_class

    b = resolve(decode.compile, model)
    choice = tune_cpu(model, layer_ids, b, width, threads, drafters)
    plans = gemm_plans(model) if b.static else []
    cpu = next(model.parameters()).device.type == "cpu"
    return {"dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
            "threads": choice.as_dict() if choice else {"threads": None, "how": "cuda", "wait_policy": None},
            "gemm": gemm.summary(plans) if plans else "torch default", "backend": b.name,
            "torch_threads": torch.get_num_threads(),
            "walks": ("compiled" if cpu_walks.kernels() is not None else "torch") if cpu else "device",
            "walks_status": cpu_walks.status() if cpu else "on the model's device: torch",
            "bf16_loops": cpu_bf16.status() if cpu else "on the model's device: torch",
            "cpu_class": cpu_class() if cpu else None}


def runtime_line(rt: dict) -> str:
    """What ran, in one line: the CPU class, dtype, threads (and how they were chosen), the wait policy, the products' backend."""
    from pdraft import threads

    th = rt.get("threads") or {}
    probe = ", ".join(f"{k} thread(s) {v:.2f} ms" for k, v in (th.get("probe_ms") or {}).items())
    where = f"{rt['cpu_class']}, " if rt.get("cpu_class") else ""
    how = f"measured, a tie within {threads.TIE:.0%}" if th.get("how") == "tie" else th.get("how")
    return (f"runtime: {where}{rt.get('dtype')}, {th.get('threads')} thread(s) ({how}"
            + (f": probe {probe}" if probe else "") + f"), {th.get('wait_policy')}, products: {rt.get('gemm')}"
            + (f", sequential walks: {rt['walks']}" if rt.get("walks") else ""))
