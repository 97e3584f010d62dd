"""Where a training step goes on this machine (issue 56): for each family, the milliseconds a step spends in the
data path, the drafter's forward (with its family term), the shared loss over the vocabulary, the backward and
the optimizer, as `pdraft train` runs them on the quickstart's own cache, with and without the compiled CPU loops
(PDRAFT_CPU_KERNELS=0), each setting in a process of its own, interleaved, medians over the repeats.

    python benchmarks/train_phases.py --output-dir runs/quickstart --steps 30 --repeats 3

It needs the cache export-hidden wrote (`pdraft export-hidden recipes/quickstart.yaml`, or a quickstart's
runs/quickstart/hidden). Prints one row per family and setting and writes the JSON beside it (--json). The CPU
class (pdraft.runtime.cpu_class) heads the output: name it beside every figure you quote."""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PHASES = ("data", "drafter forward", "loss forward", "backward", "optimizer")


def one_run(kind: str, steps: int, output_dir: str, extra: list[str]) -> dict:
    """Train `steps` steps of `kind` in this process, timing each phase (the trainer's own functions, wrapped)."""
    import torch

    from pdraft.decode.session import target_alone_loop
    from pdraft.lifecycle import kind_overrides
    from pdraft.recipe import load_recipe
    from pdraft.runtime import make_runtime
    from pdraft.targets.loader import load_target
    from pdraft.train import loop

    recipe = ROOT / "recipes" / "quickstart.yaml"
    run_dir = Path(tempfile.mkdtemp(prefix=f"pdraft-phases-{kind}-"))
    overrides = kind_overrides(load_recipe(recipe), kind) + [
        f"output_dir={output_dir}", f"train.steps={steps}", f"train.output_dir={run_dir}",
        "train.eval_every=1000000", "train.checkpoint_every=1000000", "train.log_every=1000000", *extra]
    r = load_recipe(recipe, overrides)
    target = load_target(r.target, make_runtime(r.runtime))
    source = loop.training_source(r, target, loop_for=target_alone_loop)
    spent: collections.Counter = collections.Counter()

    def timed(name, f):
        def wrapper(*a, **k):
            t = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                spent[name] += time.perf_counter() - t
        return wrapper

    type(source).batch = timed("data", type(source).batch)
    loop.TrainForward.forward = timed("drafter forward", loop.TrainForward.forward)
    loop.drafter_loss = timed("loss forward", loop.drafter_loss)
    torch.Tensor.backward = timed("backward", torch.Tensor.backward)
    torch.optim.AdamW.step = timed("optimizer", torch.optim.AdamW.step)
    t0 = time.perf_counter()
    loop.train(r, target, source, run_dir=run_dir, fresh=True)
    wall = time.perf_counter() - t0
    shutil.rmtree(run_dir, ignore_errors=True)
    return {"step_ms": 1e3 * wall / steps, **{p: 1e3 * spent[p] / steps for p in PHASES},
            "threads": torch.get_num_threads()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--output-dir", default="runs/quickstart", help="the quickstart output_dir holding hidden/")
    ap.add_argument("--kinds", default="dflash,dspark,dflash2,eagle3")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--one", nargs=2, metavar=("KIND", "STEPS"), help=argparse.SUPPRESS)
    ap.add_argument("--set", action="append", default=[], help="a recipe override for every run")
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one_run(args.one[0], int(args.one[1]), args.output_dir, args.set)))
        return
    from pdraft.runtime import cpu_class

    settings = {"compiled loops": {}, "torch only (PDRAFT_CPU_KERNELS=0)": {"PDRAFT_CPU_KERNELS": "0"}}
    print(f"CPU class: {cpu_class()}")
    rows: dict = {}
    for kind in args.kinds.split(","):
        for _ in range(args.repeats):
            for name, env in settings.items():  # interleaved: a drift of the host hits both alike
                cmd = [sys.executable, __file__, "--one", kind, str(args.steps), "--output-dir", args.output_dir]
                cmd += [x for s in args.set for x in ("--set", s)]
                done = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True, check=True)
                rows.setdefault((kind, name), []).append(json.loads(done.stdout.strip().splitlines()[-1]))
    result = []
    print(f"{'family':8s} {'setting':36s} {'step ms':>8s} " + " ".join(f"{p:>16s}" for p in PHASES))
    for (kind, name), runs in rows.items():
        med = {k: statistics.median(r[k] for r in runs) for k in ("step_ms", *PHASES)}
        result.append({"kind": kind, "setting": name, "repeats": len(runs), **med})
        print(f"{kind:8s} {name:36s} {med['step_ms']:8.1f} " + " ".join(f"{med[p]:16.1f}" for p in PHASES))
    if args.json:
        args.json.write_text(json.dumps({"cpu_class": cpu_class(), "steps": args.steps, "rows": result},
                                        indent=2) + "\n")


if __name__ == "__main__":
    main()
