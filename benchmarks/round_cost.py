"""What a speculative round costs on this machine, piece by piece and backend by backend, side by side in one
process (issue 30): the target's step and its verify pass over gamma + 1 tokens, each drafter's pass, and
TPOT of pdraft's target-alone loop against transformers' `model.generate()` at batch 1 and 8 on the held-out
code prompts; optionally a whole bench run, from which it prints issue 30's "Done when" figures.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/round_cost.py --drafters runs/quickstart/{dspark,dflash2}/final \
        [--backends off,auto] [--gammas 4,8,12,16,20] [--repeats 30] [--bench --bench-repeats 3] [--json OUT]

Backends (pdraft.decode.backend): `off` = the reference (transformers' forward on a DynamicCache), `auto` =
the static caches (eager on a CPU), `on` = static and compiled (torch.compile; its compile time is printed and
kept out of the figures). Piece timings are medians over `--repeats` calls, the backends interleaved call by
call so that the load of a shared machine falls on all of them alike; the context is the first held-out code
prompt followed by the target's own 64-token greedy continuation. Ratios are what to compare across
machines: the absolute milliseconds of a shared 2-core CPU move with its load (`uptime` is printed).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from pdraft.bench.hf_generate import measure_generate  # noqa: E402
from pdraft.bench.report import machine_info  # noqa: E402
from pdraft.data.prompts import load_prompts  # noqa: E402
from pdraft.data.templates import encode_prompt, eos_ids  # noqa: E402
from pdraft.decode import backend as backends  # noqa: E402
from pdraft.decode.engine import generate  # noqa: E402
from pdraft.decode.inputs import load_attached_drafter  # noqa: E402
from pdraft.metrics import summarize  # noqa: E402
from pdraft.recipe import load_recipe  # noqa: E402
from pdraft.runtime import make_runtime  # noqa: E402
from pdraft.targets.loader import load_target  # noqa: E402


CLOCK = [time.perf_counter]  # --clock cpu: process CPU seconds, which a busy shared machine disturbs less


def interleaved(calls: dict, repeats: int, warmup: int = 3) -> dict:
    """name -> median seconds of calls[name](), the names taking turns call by call."""
    for f in calls.values():
        for _ in range(warmup):
            f()
    times = {k: [] for k in calls}
    clock = CLOCK[0]
    for _ in range(repeats):
        for name, f in calls.items():
            start = clock()
            f()
            times[name].append(clock() - start)
    return {k: statistics.median(v) for k, v in times.items()}


def target_pieces(model, layer_ids, context, gammas, modes, repeats) -> dict:
    """{mode: {width: seconds}}: the verify pass over `width` tokens after `context`, rolled back each call."""
    runners = {}
    for mode in modes:
        b = backends.resolve(mode, model)
        runners[mode] = backends.target_runner(model, layer_ids, b, room=max(gammas) + 2)
        runners[mode].prefill([context])
    g = torch.Generator().manual_seed(0)
    out = {mode: {} for mode in modes}
    anchor, pos = torch.tensor([context[-1]]), torch.tensor([len(context) - 1])
    for width in [1] + [g_ + 1 for g_ in gammas]:
        drafts = torch.randint(0, model.config.vocab_size, (1, width - 1), generator=g)
        lengths, drop = torch.tensor([width - 1]), torch.tensor([-1])

        def call(runner):
            return lambda: (runner.verify(anchor, pos, drafts, lengths), runner.commit(drop))

        for mode, t in interleaved({m: call(r) for m, r in runners.items()}, repeats).items():
            out[mode][width] = t
    return out


def matmul_floor(model, widths, repeats) -> dict:
    """{width: seconds} of the target's weight matmuls alone (every projection, MLP and the LM head, no
    attention, norms or anything else) over `width` tokens: what no framework can take away. Their ratio is the
    floor of verify(width) / step on this machine."""
    import torch.nn.functional as F

    weights = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
    out = {}
    for w in widths:
        x = torch.randn(w, model.config.hidden_size)
        inter = torch.randn(w, model.config.intermediate_size)

        def call(x=x, inter=inter):
            for weight in weights:
                F.linear(inter if weight.shape[1] == inter.shape[1] else x, weight)

        out[w] = interleaved({"f": call}, repeats)["f"]
    return out


def drafter_pieces(drafter, model, layer_ids, context, gammas, modes, repeats) -> dict:
    """{mode: {gamma: seconds}}: one greedy proposal after `context` (the drafter's state filled from the
    target's features of the context), the backends interleaved."""
    runner = backends.target_runner(model, layer_ids, backends.resolve("off", model))
    feats = runner.prefill([context])
    state = drafter.new_state(1, len(context) + 64)
    drafter.extend_context(state, feats.hidden, feats.positions, feats.valid)
    anchor, pos = torch.tensor([context[-1]]), torch.tensor([len(context) - 1])
    passes = {mode: backends.drafter_pass(drafter, backends.resolve(mode, model)) for mode in modes}
    out = {mode: {} for mode in modes}
    for gamma in [g for g in gammas if g <= drafter.max_gamma()]:
        calls = {mode: (lambda f=f: f(state, anchor, pos, gamma)) for mode, f in passes.items()}
        for mode, t in interleaved(calls, repeats).items():
            out[mode][gamma] = t
    return out


def tpot_rows(model, prompts, eos, pad, modes, batch, new_tokens, repeats) -> dict:
    """{name: (median TPOT seconds, outputs)} for generate() and pdraft's target alone per backend, the runs
    interleaved repeat by repeat."""
    calls = {"transformers generate()": lambda: measure_generate(model, prompts, batch_size=batch,
                                                                 max_new_tokens=new_tokens, eos_token_ids=eos,
                                                                 pad_token_id=pad)}
    for mode in modes:
        def alone(mode=mode):
            outs, recs = [], []
            from pdraft.metrics import join_batches
            batches = []
            for start in range(0, len(prompts), batch):
                res = generate(model, None, prompts[start:start + batch], max_new_tokens=new_tokens,
                               eos_token_ids=eos, compile=mode)
                outs.extend(res.output_ids)
                batches.append((res.records, len(res.output_ids)))
            recs = join_batches(batches)
            return outs, recs
        calls[f"pdraft target alone ({mode})"] = alone
    tpots = {k: [] for k in calls}
    outputs = {}
    for name, f in calls.items():  # warm-up
        f()
    for _ in range(repeats):
        for name, f in calls.items():
            outs, recs = f()
            tpots[name].append(summarize(recs).tpot_s)
            outputs[name] = outs
    return {k: (statistics.median(v), outputs[k]) for k, v in tpots.items()}


def done_when(report: dict) -> list[str]:
    """Issue 30's figures from a bench report: target alone vs generate(), verify(gamma 16) and 1-layer draft
    in target steps, the best speedup of DSpark and DFlash2 on held-out code."""
    lines = []
    for domain in [d["name"] for d in report["domains"]]:
        rows = [r for r in report["runs"] if r["domain"] == domain]
        alone = next(r for r in rows if r["kind"] == "target")
        gen = next((r for r in rows if r["kind"] == "generate"), None)
        lines.append(f"[{domain}] target alone TPOT {1000 * alone['summary']['tpot_s']:.2f} ms"
                     + (f" vs generate() {1000 * gen['summary']['tpot_s']:.2f} ms (ratio "
                        f"{alone['summary']['tpot_s'] / gen['summary']['tpot_s']:.2f}, outputs "
                        f"{'identical' if gen.get('same_as_target') else 'DIFFERENT'})" if gen else "")
                     + f"; speedups vs {alone['baseline']}")
        for r in rows:
            if r["kind"] in ("target", "generate"):
                continue
            lines.append(f"  {r['drafter']:28} gamma {r['gamma']:2}: tau {r['summary']['tau']:.2f}  draft/step "
                         f"{r['draft_per_step']:.2f}  verify/step {r['verify_per_step']:.2f}  round/step "
                         f"{r['round_per_step']:.2f}  speedup {r['speedup']:.2f}x  vs ideal {r['speedup_vs_ideal']:.2f}")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default="recipes/quickstart.yaml")
    ap.add_argument("--drafters", nargs="*", default=[])
    ap.add_argument("--backends", default="off,auto")
    ap.add_argument("--gammas", default="4,8,12,16,20")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--tpot-repeats", type=int, default=3)
    ap.add_argument("--tpot-prompts", type=int, default=12)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--skip-pieces", action="store_true")
    ap.add_argument("--skip-tpot", action="store_true")
    ap.add_argument("--bench", action="store_true", help="also one bench run of --drafters (bench.repeats = "
                                                          "--bench-repeats) and issue 30's figures from it")
    ap.add_argument("--bench-repeats", type=int, default=3)
    ap.add_argument("--bench-compile", default="auto")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall", help="piece timings in wall or process CPU "
                                                                           "seconds")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: the recipe's)")
    args = ap.parse_args(argv)
    if args.clock == "cpu":
        CLOCK[0] = time.process_time
    r = load_recipe(args.recipe)
    target = load_target(r.target, make_runtime(r.runtime))
    if args.threads:
        torch.set_num_threads(args.threads)
    model = target.model
    modes = args.backends.split(",")
    gammas = [int(g) for g in args.gammas.split(",")]
    eos = eos_ids(model, target.tokenizer)
    pad = target.tokenizer.pad_token_id if target.tokenizer.pad_token_id is not None else min(eos)
    texts = [c.prompt for c in load_prompts(r.bench.prompt_sets[0], max_samples=args.tpot_prompts)]
    prompts = [encode_prompt(target.tokenizer, t, r.decode.chat_template, r.decode.enable_thinking) for t in texts]
    m = machine_info()
    out: dict = {"machine": m, "uptime": os.getloadavg(), "args": vars(args) | {"json": str(args.json)}}
    print(f"# {m['cpu']}, {m['cpu_count']} CPUs, torch {m['torch']} ({m['torch_threads']} threads), "
          f"load {os.getloadavg()[0]:.2f}; {m['date']}")
    if not args.skip_pieces:
        context = prompts[0] + generate(model, None, [prompts[0]], max_new_tokens=64, compile="off").output_ids[0]
        pieces = target_pieces(model, target.layer_ids, context, gammas, modes, args.repeats)
        out["target"] = pieces
        print(f"target verify pass (context {len(context)} tokens), ms; in target steps of the same backend:")
        for mode in modes:
            step = pieces[mode][1]
            print(f"  {mode:5} step {1000 * step:.2f}  " + "  ".join(
                f"w{w} {1000 * t:.2f} ({t / step:.2f})" for w, t in pieces[mode].items() if w > 1))
        floor = matmul_floor(model, [1] + [g + 1 for g in gammas], args.repeats)
        out["matmul_floor"] = floor
        print("  weight matmuls alone, ms (the floor of verify / step): " + "  ".join(
            f"w{w} {1000 * t:.2f} ({t / floor[1]:.2f})" for w, t in floor.items()))
        out["drafters"] = {}
        for path in args.drafters:
            drafter = load_attached_drafter(path, model)
            d = drafter_pieces(drafter, model, target.layer_ids, context, gammas, modes, args.repeats)
            out["drafters"][path] = d
            for mode in modes:
                step = pieces[mode][1]
                print(f"  {Path(path).parent.name:8} {mode:5} draft " + "  ".join(
                    f"g{g} {1000 * t:.2f} ({t / step:.2f})" for g, t in d[mode].items()))
        if backends.compile_clock():
            print(f"  compiling took {backends.compile_clock():.1f} s (kept out of the figures)")
    if not args.skip_tpot:
        out["tpot"] = {}
        for batch in [int(b) for b in args.batches.split(",")]:
            rows = tpot_rows(model, prompts, eos, pad, modes, batch, r.bench.max_new_tokens, args.tpot_repeats)
            ref = rows["transformers generate()"]
            out["tpot"][batch] = {k: v[0] for k, v in rows.items()}
            print(f"TPOT at batch {batch} ({len(prompts)} code prompts, {r.bench.max_new_tokens} tokens, median of "
                  f"{args.tpot_repeats}): " + "; ".join(
                      f"{k} {1000 * t:.2f} ms ({t / ref[0]:.2f} x generate, outputs "
                      f"{'identical' if o == ref[1] else 'DIFFERENT'})" for k, (t, o) in rows.items()))
    if args.bench:
        from pdraft.bench.session import bench_recipe

        rb = load_recipe(args.recipe, [f"bench.repeats={args.bench_repeats}", f"decode.compile={args.bench_compile}"])
        res = bench_recipe(rb, args.drafters, target=target, out_dir=(args.json.parent if args.json else Path("."))
                           / "round_cost_bench")
        out["bench_report"] = str(res.report_path)
        out["done_when"] = done_when(res.report)
        print("\n".join(out["done_when"]))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
