"""The embedded target's products at 1, 5 and 17 rows, backend by backend (issue 38): MKL through F.linear,
x @ W^T over a transposed copy, W @ x^T, oneDNN without and with the weight packed once. Medians of 100 calls
(after 10 warm-ups), microseconds. Run it once per wait policy, since the policy is read when torch loads:

    OMP_WAIT_POLICY=PASSIVE python benchmarks/small_gemm.py 2
    GOMP_SPINCOUNT=100000 python benchmarks/small_gemm.py 2
    OMP_WAIT_POLICY=PASSIVE python benchmarks/small_gemm.py 1

pdraft.gemm makes the same comparison (MKL against packed oneDNN) per product when a decode run starts.
"""

import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

SHAPES = [(4096, 256), (512, 256), (256, 256), (1536, 256), (256, 768)]  # head, q|k|v, o, gate|up, down


def median_us(f, n=100):
    for _ in range(10):
        f()
    times = []
    for _ in range(n):
        start = time.perf_counter()
        f()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def main() -> None:
    torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else torch.get_num_threads())
    policy = os.environ.get("OMP_WAIT_POLICY") or f"spin {os.environ.get('GOMP_SPINCOUNT', 'default')}"
    for n, k in SHAPES:
        w = torch.randn(n, k)
        wt = w.t().contiguous()
        packed = torch.ops.mkldnn._reorder_linear_weight(w, 17)
        cells = []
        for m in (1, 5, 17):
            x = torch.randn(m, k)
            calls = {"mkl": lambda: F.linear(x, w), "x@Wt": lambda: torch.mm(x, wt),
                     "W@xT": lambda: torch.mm(w, x.t()).t(),
                     "onednn": lambda: torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], ""),
                     "onednn packed": lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")}
            cells.append(f"M{m}: " + " ".join(f"{name} {median_us(f):.0f}" for name, f in calls.items()))
        print(f"{torch.get_num_threads()} threads, {policy}, [{n}x{k}]  " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
