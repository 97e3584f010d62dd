"""Small-row matrix products on a CPU, with the backend chosen by measurement on this machine (issue 38).

A decode round multiplies a few rows (1 for a target step, gamma + 1 for a verify pass, gamma for a drafter's
LM head) by weights that stay fixed for the run. On a CPU, torch's default fp32 path (MKL) repacks the weight on
every call and grows almost linearly with the rows at small row counts, while oneDNN with the weight packed once
(`torch.ops.mkldnn._linear_pointwise` over `_reorder_linear_weight`) is nearly flat in the rows for wide
weights such as an LM head, and slower for the small square ones (a fixed cost per call). Which one wins depends
on the CPU, the shape, the row count and the threads, so nothing here is assumed: `FastLinear` times both,
interleaved call by call, for each row bucket (one row; a few; many) when it is built, and keeps the faster.

In bfloat16 (runtime.dtype auto on a CPU with bf16 units) torch's default path is oneDNN too, but it reorders the
weight into the kernel's blocked layout on every call: packed once, a product at 1 to 17 rows costs about 20 us
where the default costs 25-45 (and 30-80 for the 4096-row head), measured in the same way. That is still a fixed
cost per call, which at one row made a bfloat16 target step slower than a float32 one; a third backend, a
compiled AVX-512 BF16 loop (pdraft.kernels.cpu_bf16, where the CPU has it), does one row in 3-12 us, and a
fourth, the same library's AMX tiles on one thread (weight packed once), 2-17 us at 5 to 17 rows for the target's
products where oneDNN takes 22-30 (and above 32 rows, a prefill's, hands over to oneDNN).

Only passes without gradients use it (decode, bench, calibration); training keeps `nn.Linear`. On CUDA, or where
this torch has no oneDNN linear, it is plain `F.linear`. Two backends may round the same row differently (a
different order of the sums), and so may one backend at different row counts (MKL's one-row path is a matrix
-vector product): what "the target's output" means on the fast decode path is its output under the plan chosen
for the run, the convention of serving engines, whose batched and single-row kernels differ too
(docs/PERFORMANCE.md).
"""

from __future__ import annotations

import statistics
import time
import weakref
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from pdraft.kernels import cpu_bf16

BUCKETS = ((1, 1), (2, 8), (9, 1 << 30))  # (first, last) rows of each bucket
PROBE_ROWS = (1, 5, 17)  # the row count each bucket is timed at
PROBE_CALLS = 24  # timed calls per backend and bucket (after 4 warm-ups), interleaved
# Past this many rows nothing was measured (the last bucket is timed at 17): torch's default product runs. A
# training-sized product without gradients (DFlash2's candidate logits, 2,600 x 4,096 x 256) took oneDNN's packed
# float32 path on the AVX2-only class at a third of MKL's speed (issue 56).
UNMEASURED_ROWS = 512

_plans: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # nn.Linear -> FastLinear


def onednn_available() -> bool:
    return hasattr(torch.ops.mkldnn, "_linear_pointwise") and hasattr(torch.ops.mkldnn, "_reorder_linear_weight") \
        and torch.backends.mkldnn.is_available()


def _bucket(rows: int) -> int:
    return 0 if rows <= 1 else 1 if rows <= 8 else 2


class FastLinear:
    """x [..., in] -> x @ weight.T + bias through the backend measured fastest for x's row count."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, *, measure: bool = True):
        self.weight, self.bias = weight.detach(), None if bias is None else bias.detach()
        self.version = weight._version
        self.backends: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {"mkl": self._mkl}
        if weight.device.type == "cpu" and weight.dtype in (torch.float32, torch.bfloat16) and onednn_available():
            try:
                self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight, PROBE_ROWS[-1])
                self.backends["onednn"] = self._onednn
            except RuntimeError:  # a torch built without it for this shape: MKL only
                pass
        if weight.device.type == "cpu" and weight.dtype == torch.bfloat16 and cpu_bf16.kernels() is not None:
            self.compiled = cpu_bf16.kernels().bind(self.weight, self.bias)
            self.backends["gemv"] = self._gemv
            self.tiles = cpu_bf16.kernels().bind_amx(self.weight, self.bias)
            if self.tiles is not None:
                self.backends["amx"] = self._amx
        self.choice = ["mkl"] * len(BUCKETS)
        self.timings: dict[str, list[float]] = {}
        if measure and len(self.backends) > 1:
            self.measure()

    def _mkl(self, x: torch.Tensor) -> torch.Tensor:
        # Flattened to rows first: torch's matmul does not fold a 3-d input whose size-1 batch dimension has a
        # stride other than rows x width (a slice such as hidden[:, 1:17]) and takes a batched product over a
        # copied weight instead, 1.2 ms against 0.09 for the 4096 x 256 bf16 head at 16 rows (issue 38).
        flat = x.reshape(-1, x.shape[-1])
        out = F.linear(flat, self.weight, self.bias)
        return out.view(*x.shape[:-1], out.shape[-1])

    def _onednn(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        out = torch.ops.mkldnn._linear_pointwise(flat, self.packed, self.bias, "none", [], "")
        return out.view(*x.shape[:-1], out.shape[-1])

    def _gemv(self, x: torch.Tensor) -> torch.Tensor:
        out = self.compiled(x.reshape(-1, x.shape[-1]).contiguous())
        return out if x.dim() == 2 else out.view(*x.shape[:-1], out.shape[-1])

    def _amx(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        if flat.shape[0] > cpu_bf16.AMX_ROWS:  # one thread's tiles pay at a verify's rows, not at a prefill's
            return (self._onednn if "onednn" in self.backends else self._mkl)(x)
        out = self.tiles(flat.contiguous())
        return out if x.dim() == 2 else out.view(*x.shape[:-1], out.shape[-1])

    @torch.no_grad()
    def measure(self) -> None:
        """Time every backend at each bucket's probe row count, interleaved, and keep the fastest (median)."""
        for b, rows in enumerate(PROBE_ROWS):
            x = torch.randn(rows, self.weight.shape[1], dtype=self.weight.dtype)
            times: dict[str, list[float]] = {k: [] for k in self.backends}
            for _ in range(4):
                for f in self.backends.values():
                    f(x)
            for _ in range(PROBE_CALLS):
                for name, f in self.backends.items():
                    start = time.perf_counter()
                    f(x)
                    times[name].append(time.perf_counter() - start)
            medians = {k: statistics.median(v) for k, v in times.items()}
            self.choice[b] = min(medians, key=medians.get)
            self.timings[str(rows)] = [round(medians[k] * 1e6, 1) for k in self.backends]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():  # traced (decode.compile on): the plain product, which the compiler
            return self._mkl(x)  # lowers and packs itself; an opaque packed weight would not lower
        rows = x.numel() // x.shape[-1]
        if rows > UNMEASURED_ROWS:
            return self._mkl(x)
        return self.backends[self.choice[_bucket(rows)]](x)

    def describe(self) -> str:
        return "/".join(self.choice)


def for_linear(module: nn.Linear) -> FastLinear:
    """The FastLinear of an nn.Linear whose weights stay fixed (a loaded target's projection or LM head): built
    and measured once per module and kept while its weight is unchanged, so the target's runner and a drafter
    sharing the target's LM head use one plan."""
    plan = _plans.get(module)
    if plan is None or plan.version != module.weight._version or plan.weight.data_ptr() != module.weight.data_ptr():
        plan = _plans[module] = FastLinear(module.weight, module.bias)
    return plan


def fused(weight: torch.Tensor, bias: torch.Tensor | None) -> FastLinear:
    """A FastLinear over a concatenated weight built for one run (the static target's q|k|v and gate|up)."""
    return FastLinear(weight, bias)


def summary(plans) -> str:
    """'onednn' / 'mkl' / 'mixed' over the plans' choices, for the report's footer."""
    chosen = {c for p in plans for c in p.choice}
    return chosen.pop() if len(chosen) == 1 else "mixed (" + ", ".join(sorted(chosen)) + ")"
