"""A round's pieces under the old fixed runtime and under the measured one, on a quiet host and beside a busy
neighbour, side by side in one run (issue 38, "threads by measurement").

    python benchmarks/neighbour.py [--drafters runs/quickstart/{dspark,dflash2,dflash}/final] [--repeats 30]

For each host state (quiet; then with `python -c 'while True: pass'` running beside it) and each runtime it
starts a fresh process (the OpenMP wait policy is read once, when torch loads) that times, as medians of
`--repeats` calls: one target step, a verify pass of 17 tokens, each drafter's gamma-16 pass, and TPOT of
pdraft's target alone on the first held-out code prompt. Runtimes:

    old       OMP_WAIT_POLICY=PASSIVE, 2 threads, every product through torch's default (MKL): main before issue 38
    measured  bounded spin (pdraft.threads), threads chosen on the run's own work, products through the backend
              measured fastest (pdraft.gemm): what `runtime.threads: auto` does

With --bench it also runs the whole `pdraft bench` of the recipe on --drafters (trained ones: tau depends on
the weights), T=0 on the code set, `--bench-repeats` timed repeats (the median-TPOT repeat kept), once on the quiet
host and once beside the busy neighbour, under the measured runtime (what the CLI runs) and under the old one,
and prints each drafter's speedup over the faster target-alone baseline and its TPOT side by side:

    python benchmarks/neighbour.py --drafters runs/quickstart/{dflash,dspark,dflash2,eagle3}/final --bench

Without --drafters it builds random drafters of the quickstart's shapes (a pass's cost does not depend on its
weights). The figures are per host state; compare the runtimes within a row group, not across machines.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNTIMES = {
    "old": {"OMP_WAIT_POLICY": "PASSIVE"},
    "measured": {},
}


def probe(args) -> dict:
    """Runs in the child: the pieces under this process's runtime."""
    if args.runtime == "measured":
        from pdraft.threads import apply_wait_policy

        apply_wait_policy()
    import torch

    from pdraft import gemm
    from pdraft.data.prompts import load_prompts
    from pdraft.data.templates import encode_prompt, eos_ids
    from pdraft.decode import backend as backends
    from pdraft.decode.engine import generate
    from pdraft.decode.inputs import load_attached_drafter
    from pdraft.metrics import summarize
    from pdraft.models.build import build_from_recipe
    from pdraft.recipe import load_recipe
    from pdraft.runtime import make_runtime
    from pdraft.targets.loader import load_target

    if args.runtime == "old":
        gemm.FastLinear.measure = lambda self: None  # every product stays on torch's default path
    r = load_recipe(args.recipe)
    target = load_target(r.target, make_runtime(r.runtime))
    model = target.model
    backend = backends.resolve("auto", model)
    if args.runtime == "old":
        torch.set_num_threads(2)
        choice = "2 (fixed)"
    else:
        choice = backends.tune_cpu(model, target.layer_ids, backend, 17, "auto").describe()
    text = load_prompts(r.bench.prompt_sets[0], max_samples=1)[0].prompt
    prompt = encode_prompt(target.tokenizer, text, r.decode.chat_template, r.decode.enable_thinking)
    context = prompt + generate(model, None, [prompt], max_new_tokens=64).output_ids[0]
    runner = backends.target_runner(model, target.layer_ids, backend, room=40)
    feats = runner.prefill([context])
    anchor, pos = torch.tensor([context[-1]]), torch.tensor([len(context) - 1])
    drop = torch.tensor([-1])

    def median_ms(f) -> float:
        for _ in range(3):
            f()
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            f()
            times.append(time.perf_counter() - start)
        return 1000 * statistics.median(times)

    out = {"threads": choice, "gemm": gemm.summary(backends.gemm_plans(model)) if args.runtime != "old" else "mkl"}
    with torch.no_grad():
        for width in (1, 17):
            drafts = torch.arange(1, width).unsqueeze(0) % model.config.vocab_size
            out[f"verify{width}"] = median_ms(lambda: (runner.verify(anchor, pos, drafts, torch.tensor([width - 1])),
                                                      runner.commit(drop)))
        drafters = {Path(p).parent.name: load_attached_drafter(p, model) for p in args.drafters}
        for kind in ([] if args.drafters else ["dflash", "dspark", "dflash2"]):
            d = build_from_recipe(r.drafter.model_copy(update={"kind": kind}), target, seed=0)
            d.attach_target(model)
            drafters[kind] = d.eval()
        for name, d in drafters.items():
            state = d.new_state(1, len(context) + 64)
            d.extend_context(state, feats.hidden, feats.positions, feats.valid, feats.ids)
            gamma = min(16, d.max_gamma())
            out[f"{name} pass"] = median_ms(lambda: d.propose(state, anchor, pos, gamma))
    eos = eos_ids(model, target.tokenizer)
    tpots = [summarize(generate(model, None, [prompt], max_new_tokens=64, eos_token_ids=eos).records).tpot_s
             for _ in range(max(3, args.repeats // 10))]
    out["target alone TPOT"] = 1000 * statistics.median(tpots)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default=str(ROOT / "recipes/quickstart.yaml"))
    ap.add_argument("--drafters", nargs="*", default=[])
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--bench", action="store_true", help="also the whole pdraft bench, quiet and busy (see above)")
    ap.add_argument("--bench-repeats", type=int, default=3)
    ap.add_argument("--skip-pieces", action="store_true", help="only the --bench part")
    ap.add_argument("--out", type=Path, default=Path("runs/neighbour"), help="where the bench reports go")
    ap.add_argument("--old-checkout", type=Path, help="with --bench: run the old runtime's bench from this checkout "
                    "(e.g. a worktree of main before issue 38, ebaaa90), so that 'old' is that code, not only its "
                    "wait policy and threads")
    ap.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--runtime", choices=sorted(RUNTIMES), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.probe:
        print(json.dumps(probe(args)))
        return 0
    if not args.skip_pieces:
        pieces(args)
    if args.bench:
        whole_bench(args)
    return 0


def whole_bench(args) -> None:
    """`pdraft bench` quiet and beside a busy neighbour, under both runtimes: speedup and TPOT per contender."""
    rows = {}
    for host in ("quiet", "busy neighbour"):
        neighbour = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if host != "quiet" else None
        try:
            for name, env in RUNTIMES.items():
                child_env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
                child_env.update(env)
                if name == "old" and args.old_checkout is not None:
                    child_env["PYTHONPATH"] = str(args.old_checkout.resolve())
                out = (args.out / f"{host.split()[0]}-{name}").resolve()
                recipe = args.recipe
                if name == "old" and args.old_checkout is not None:  # its own recipe: it may not read today's keys
                    recipe = str((args.old_checkout / "recipes" / "quickstart.yaml").resolve())
                cmd = [sys.executable, "-m", "pdraft", "bench", str(Path(recipe).resolve()), "--prompt-set", "builtin:code",
                       "--temperature", "0", "--repeats", str(args.bench_repeats), "--out", str(out), "--no-ngram"]
                if name == "old":
                    cmd += ["--set", "runtime.threads=2"]
                for d in args.drafters:
                    cmd += ["--drafter", str(Path(d).resolve())]
                old_code = name == "old" and args.old_checkout is not None  # `python -m` puts the cwd first
                done = subprocess.run(cmd, env=child_env, capture_output=True, text=True,
                                      cwd=args.old_checkout if old_code else None)
                if done.returncode != 0:
                    raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
                report = json.loads((out / "bench.json").read_text())
                for run in report["runs"]:
                    key = (run["drafter"], run.get("gamma"))
                    rows.setdefault(key, {})[(host, name)] = (run.get("speedup"), run["summary"]["tpot_s"] * 1000)
        finally:
            if neighbour is not None:
                neighbour.kill()
                neighbour.wait()
    cols = [(h, n) for h in ("quiet", "busy neighbour") for n in RUNTIMES]
    old = f"the code at {args.old_checkout}" if args.old_checkout else "today's code under the old wait policy"
    print(f"\n# pdraft bench, code, T=0, median-TPOT repeat of {args.bench_repeats}; speedup (TPOT ms); old = {old}; "
          f"load {os.getloadavg()[0]:.2f} at the end")
    print("| contender | gamma | " + " | ".join(f"{h}, {n}" for h, n in cols) + " |")
    print("|" + " --- |" * (2 + len(cols)))
    for (drafter, gamma), cells in rows.items():
        shown = [("-" if c not in cells else
                  (f"{cells[c][0]:.2f}x" if cells[c][0] is not None else "") + f" ({cells[c][1]:.2f})") for c in cols]
        print(f"| {drafter} | {gamma if gamma is not None else '-'} | " + " | ".join(shown) + " |")
    if args.json:
        prior = json.loads(args.json.read_text()) if args.json.exists() else {}
        prior["bench"] = [{"contender": d, "gamma": g, **{f"{h} / {n}": v for (h, n), v in c.items()}}
                          for (d, g), c in rows.items()]
        args.json.write_text(json.dumps(prior, indent=1))


def pieces(args) -> None:
    results = {}
    for host in ("quiet", "busy neighbour"):
        neighbour = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if host != "quiet" else None
        try:
            for name, env in RUNTIMES.items():
                child_env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
                child_env.update(env, PYTHONPATH=str(ROOT))
                cmd = [sys.executable, __file__, "--probe", "--runtime", name, "--recipe", args.recipe,
                       "--repeats", str(args.repeats), "--drafters", *args.drafters]
                done = subprocess.run(cmd, env=child_env, capture_output=True, text=True, check=True)
                results[(host, name)] = json.loads(done.stdout.strip().splitlines()[-1])
        finally:
            if neighbour is not None:
                neighbour.kill()
                neighbour.wait()
    print(f"# {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f} at the end; ms, medians of {args.repeats} "
          "(in target steps of the same row)")
    keys = [k for k in next(iter(results.values())) if k not in ("threads", "gemm")]
    print("| host | runtime | threads | products | " + " | ".join(keys) + " |")
    print("|" + " --- |" * (4 + len(keys)))
    for (host, name), res in results.items():
        step = res["verify1"]
        cells = [f"{res[k]:.2f}" + ("" if k in ("verify1", "target alone TPOT") else f" ({res[k] / step:.2f})")
                 for k in keys]
        print(f"| {host} | {name} | {res['threads']} | {res['gemm']} | " + " | ".join(cells) + " |")
    if args.json:
        args.json.write_text(json.dumps({f"{h} / {n}": v for (h, n), v in results.items()}, indent=1))


if __name__ == "__main__":
    raise SystemExit(main())
