"""Peak memory of the drafter losses (CE + TV + confidence) against the chunk size, for one configuration.

Each chunk size runs in a fresh subprocess (CPU: peak resident set size minus the process's size before the
loss; CUDA: torch.cuda.max_memory_allocated), so one run cannot inherit another's allocator pool. The
"unchunked" row uses one chunk for every position, which is what a naive implementation holds.

    python benchmarks/loss_memory.py                      # vocab 32000, hidden 1024, 4096 positions
    python benchmarks/loss_memory.py --vocab 151936 --hidden 2560 --positions 3584 --device cuda
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def child(args) -> dict:
    import torch

    from pdraft.train.losses import drafter_loss

    torch.manual_seed(0)
    dev = torch.device(args.device)
    n, d, v, r = args.positions, args.hidden, args.vocab, args.rank
    h = torch.randn(n, d, device=dev, requires_grad=True)
    u = torch.randn(n, r, device=dev, requires_grad=True)
    w2 = torch.randn(r, v, device=dev, requires_grad=True) * 0.01
    w_lm = torch.randn(v, d, device=dev) * 0.02
    t_hidden = torch.randn(n, d, device=dev)
    ids = torch.randint(0, v, (n,), device=dev)
    conf = torch.randn(n, device=dev, requires_grad=True)
    weights = torch.ones(n, device=dev)
    if dev.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    out = drafter_loss(h, w_lm, t_hidden, ids, weights, u=u, w2=w2, conf_logits=conf, alpha_ce=0.1,
                       alpha_tv=0.9, alpha_conf=1.0, chunk_size=args.chunk)
    out.loss.backward()
    if dev.type == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
    return {"chunk": args.chunk, "peak_bytes": peak, "loss": float(out.loss)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--positions", type=int, default=4096, help="supervised block positions in one micro-batch")
    p.add_argument("--rank", type=int, default=256)
    p.add_argument("--device", default="cpu")
    p.add_argument("--chunks", default="0,2048,512,128", help="0 = unchunked (all positions at once)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--chunk", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return
    rows = []
    for chunk in [int(c) for c in args.chunks.split(",")]:
        size = chunk or args.positions
        cmd = [sys.executable, __file__, "--child", "--chunk", str(size), "--vocab", str(args.vocab), "--hidden",
               str(args.hidden), "--positions", str(args.positions), "--rank", str(args.rank), "--device", args.device]
        # glibc raises its mmap threshold after large frees, after which freed chunks stay in the heap and
        # inflate the resident size; a fixed threshold makes the CPU figure the allocator-independent peak.
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "1048576"}
        res = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
        row = json.loads(res.stdout.strip().splitlines()[-1])
        row["label"] = "unchunked" if chunk == 0 else str(chunk)
        rows.append(row)
    full_logits = args.positions * args.vocab * 4
    print(f"machine: {platform.processor() or platform.machine()}, device {args.device}; vocab {args.vocab}, "
          f"hidden {args.hidden}, positions {args.positions}, rank {args.rank}")
    print(f"one float32 [positions x vocab] tensor = {full_logits / 2**20:.0f} MiB")
    print(f"{'chunk':>10} {'peak MiB':>10} {'x one logits tensor':>20}  loss")
    for row in rows:
        print(f"{row['label']:>10} {row['peak_bytes'] / 2**20:>10.0f} {row['peak_bytes'] / full_logits:>20.2f}  {row['loss']:.6f}")


if __name__ == "__main__":
    main()
