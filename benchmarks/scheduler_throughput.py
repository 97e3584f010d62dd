"""Hardware-aware prefix scheduler vs full-block verification, side by side in one run.

For each batch size R and draft length gamma, batch-decode the same prompts four ways: target alone,
full-block verification, the scheduler (paper Algorithm 1) driven by the fitted STS calibration and the
profiled cost table found next to the drafter, and the same scheduler with the measured per-round time
outside verification (`VerifyConfig.knobs["round_overhead_s"]`, taken from a first full-block run of that
configuration). The contenders take turns within each repeat; the figures are medians over repeats, in
tokens per wall second of decoding (pdraft.metrics, the single definition) and in tokens per CPU
second of this process, which other processes on a shared machine disturb far less. Also reported: tau,
verify tokens per round (the B the cost table is indexed by), rounds, verify and other milliseconds per
round, verification utilization, token acceptance, and whether each contender's greedy output is token-
identical to the target's (under sampling, from one extra greedy run each; the distribution itself is
checked by the chi-square tests in tests/test_decode_sampling.py).

    python benchmarks/scheduler_throughput.py RECIPE --drafter DIR [--batch-sizes 16,32] [--gammas 8,16]
    python benchmarks/scheduler_throughput.py --demo DIR --temperature 1.0 --batch-sizes 16,32 --gammas 8,16

`--demo DIR` first builds a tiny random Qwen3 target (final norm sharpened so its output is peaked), trains
a tiny DSpark drafter (block 16) on the target's own responses (data.regenerate, as real training does) to
snippets of one half of the stdlib's modules, and runs calibrate-threshold (at --temperature) on snippets of
the other half, so the chain is measured from scratch on a CPU. Its numbers say nothing about real targets.
Greedy, that target's output is so regular that the drafter is accepted ~99% of the time and verifying
everything is right (a correct scheduler then verifies everything too); at temperature 1 acceptance decays
along the block, the regime the scheduler is for. `--reprofile N` re-measures the cost table first.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402


def stdlib_prompts(path: Path, files: list[Path], per_file: int = 1, chars: int = 160) -> Path:
    """`per_file` prompts per file: `chars` characters of its source, 1000 apart, after the first 200 (past the
    licence header). Varied text on every Python installation: the drafter must generalise, not memorise."""
    with open(path, "w", encoding="utf-8") as f:
        for file in files:
            text = file.read_text(encoding="utf-8", errors="replace")
            for k in range(per_file):
                start = 200 + 1000 * k
                if len(text) >= start + chars:
                    f.write(json.dumps({"turns": [text[start : start + chars]]}) + "\n")
    return path


def build_demo(root: Path, steps: int, block_size: int = 16, sps_max_batch_tokens: int = 544,
               temperature: float = 0.0) -> tuple[Path, Path]:
    """Tiny target + trained tiny DSpark drafter + calibration; returns (recipe, drafter folder)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from test_data_tinytarget import make_tiny_target

    from pdraft.cache.export_hidden import export_hidden
    from pdraft.calibrate.pipeline import calibrate
    from pdraft.recipe import load_recipe
    from pdraft.runtime import make_runtime
    from pdraft.targets.loader import load_target
    from pdraft.train.loop import train, training_source

    root.mkdir(parents=True, exist_ok=True)
    target_dir = root / "target"
    if not (target_dir / "config.json").exists():
        make_tiny_target(target_dir, hidden=256, layers=4, norm_scale=12.0)  # peaked: something to learn
    import sysconfig

    sources = sorted(p for p in Path(sysconfig.get_paths()["stdlib"]).glob("*.py") if p.stat().st_size > 2000)
    # Disjoint files: the drafter trains on one half; calibration (last 32) and this benchmark (first ones)
    # use the other.
    data = stdlib_prompts(root / "train_prompts.jsonl", sources[0::2], per_file=3)
    held_out = stdlib_prompts(root / "prompts.jsonl", sources[1::2][:64])
    body = {
        "output_dir": str(root / "run"),
        "target": {"id": str(target_dir), "num_layer_ids": 2},
        "data": {"source": str(data), "shard_tokens": 2048, "cache_dir": str(root / "cache"), "regenerate": True,
                 "regenerate_max_new_tokens": 48},
        "drafter": {"kind": "dspark", "num_layers": 1, "block_size": block_size, "markov_rank": 16, "mask_token_id": 0},
        "train": {"output_dir": str(root / "train"), "steps": steps, "batch_size": 8, "lr": 1e-2,
                  "warmup_steps": 5, "num_anchors": 16, "checkpoint_every": steps, "eval_every": steps,
                  "log_every": 10},
        "calibrate": {"prompts": str(held_out), "num_prompts": 32, "temperature": temperature, "max_new_tokens": 32, "min_samples": 20,
                      "sps_max_batch_tokens": sps_max_batch_tokens, "sps_repeats": 3},
        "runtime": {"threads": 1, "device": "cpu"},
    }
    recipe_path = root / "recipe.yaml"
    recipe_path.write_text(json.dumps(body))
    r = load_recipe(recipe_path, [])
    drafter = Path(r.train.output_dir) / "final"
    if not (drafter / "config.json").exists():
        target = load_target(r.target, make_runtime(r.runtime))
        if not (Path(r.data.cache_dir) / "manifest.json").exists():
            export_hidden(r, target)
        train(r, target, training_source(r, target), run_dir=Path(r.train.output_dir))
    if not (drafter / "confidence_sts.json").exists():
        calibrate(r, drafter, log=lambda m: print(m, file=sys.stderr))
    return recipe_path, drafter


def machine() -> dict:
    from pdraft.calibration_files import device_name

    return {"device": device_name("cpu"), "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "load_average": [round(x, 2) for x in os.getloadavg()], "torch": torch.__version__}


def run_config(model, drafter, ids, gamma, common, sps, temps, repeats, sampling=None):
    """Target alone, full block, the scheduler with the cost table alone (the paper's Theta) and with the
    round overhead measured from a first full-block run; the contenders take turns in each repeat (the order
    rotates), so a change of machine load hits all alike. Throughput is reported twice: generated tokens per
    wall second of decoding (pdraft.metrics) and per CPU second of this process (time.process_time
    around the call, prefill included), which other processes on a shared machine disturb far less. With
    sampling, every run uses the same seed; greedy identity is checked by one extra greedy run per
    contender. Returns rows keyed by contender name."""
    from pdraft.metrics import summarize
    from pdraft.decode.engine import generate
    from pdraft.policies.base import VerifyConfig

    base = generate(model, None, ids, **common)  # greedy reference (and warm-up)
    warm = generate(model, drafter, ids, gamma=gamma, sampling=sampling, **common)
    w = warm.summary()
    overhead = (w.decode_s - w.verify_s) / max(w.batched_rounds, 1)  # s per round outside the verify step
    contenders = {
        "target only": dict(drafter=None),
        "full block": dict(drafter=drafter, gamma=gamma),
        "scheduler": dict(drafter=drafter, gamma=gamma,
                          verify=VerifyConfig(mode="scheduler", sps=sps, confidence_temperatures=temps)),
        "scheduler+ovh": dict(drafter=drafter, gamma=gamma,
                              verify=VerifyConfig(mode="scheduler", sps=sps, confidence_temperatures=temps,
                                                  knobs={"round_overhead_s": overhead})),
    }
    names = list(contenders)
    runs: dict[str, list] = {n: [] for n in names}
    cpu: dict[str, list] = {n: [] for n in names}
    for rep in range(repeats):
        for k in range(len(names)):
            name = names[(k + rep) % len(names)]
            c = dict(contenders[name])
            t0 = time.process_time()
            res = generate(model, c.pop("drafter"), ids, **c, sampling=sampling, seed=rep, **common)
            cpu[name].append(sum(map(len, res.output_ids)) / (time.process_time() - t0))
            runs[name].append(res)
    rows = {}
    for name in names:
        tps = [r.summary().tokens_per_s for r in runs[name]]
        records = _renumbered(runs[name])
        s = summarize(records)
        n_runs = len(runs[name])
        if sampling is None:
            identical = all(r.output_ids == base.output_ids for r in runs[name])
        else:
            c = dict(contenders[name])
            identical = generate(model, c.pop("drafter"), ids, **c, **common).output_ids == base.output_ids
        rows[name] = {
            "tokens_per_s": statistics.median(tps), "tokens_per_s_runs": tps,
            "tokens_per_cpu_s": statistics.median(cpu[name]), "tokens_per_cpu_s_runs": cpu[name],
            "tau": s.tau, "rounds": s.batched_rounds / n_runs,
            "verify_tokens_per_round": sum(x.verified + 1 for x in records) / max(s.batched_rounds, 1),
            "utilization": s.verification_utilization, "token_acceptance": s.token_acceptance,
            "verify_ms_per_round": 1e3 * s.verify_s_per_round if s.verify_s_per_round else None,
            "other_ms_per_round": 1e3 * (s.decode_s - s.verify_s) / max(s.batched_rounds, 1),
            "greedy_identical": identical,
        }
    rows["scheduler+ovh"]["round_overhead_ms"] = 1e3 * overhead
    return rows


def _renumbered(results) -> list:
    """All runs' round records as one stream: round numbers offset per run, so that each batched round of
    each run counts once in pdraft.metrics.summarize."""
    out, offset = [], 0
    for r in results:
        out += [dataclasses.replace(rec, round=rec.round + offset) for rec in r.records]
        offset += 1 + max((rec.round for rec in r.records), default=0)
    return out


def print_config(R, gamma, rows, sps):
    full = rows["full block"]
    print(f"\nbatch {R}, gamma {gamma}: SPS({R}) = {sps(R):.1f}, SPS({R * (gamma + 1)}) = "
          f"{sps(R * (gamma + 1)):.1f} steps/s (cost table)")
    print(f"{'':14} {'tok/s':>8} {'tok/cpu-s':>9} {'tau':>6} {'B/round':>8} {'rounds':>6} {'verify ms':>9} {'other ms':>8} "
          f"{'util':>6} {'accept':>7} {'greedy==target':>15}")

    def f(v, spec):
        return format(v, spec) if v is not None else "-"

    for name, x in rows.items():
        print(f"{name:14} {f(x['tokens_per_s'], '8.1f')} {f(x['tokens_per_cpu_s'], '9.1f')} {f(x['tau'], '6.2f')} "
              f"{f(x['verify_tokens_per_round'], '8.1f')} {x['rounds']:>6.1f} {f(x['verify_ms_per_round'], '9.2f')} "
              f"{f(x['other_ms_per_round'], '8.2f')} {f(x['utilization'], '6.0%')} "
              f"{f(x['token_acceptance'], '7.0%')} {str(x['greedy_identical']):>15}")
    for name in ("scheduler", "scheduler+ovh"):
        print(f"{name} / full block: {rows[name]['tokens_per_s'] / full['tokens_per_s']:.3f}x wall, "
              f"{rows[name]['tokens_per_cpu_s'] / full['tokens_per_cpu_s']:.3f}x CPU")


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("recipe", nargs="?", help="YAML recipe (target, prompts)")
    ap.add_argument("--drafter", type=Path, help="calibrated DSpark drafter folder")
    ap.add_argument("--demo", type=Path, help="build, train and calibrate a tiny target + drafter here first")
    ap.add_argument("--demo-steps", type=int, default=300)
    ap.add_argument("--demo-block-size", type=int, default=16)
    ap.add_argument("--demo-sps-max-tokens", type=int, default=544, help="largest B the demo's cost table covers")
    ap.add_argument("--batch-sizes", type=ints, default=[8, 16, 32], help="comma-separated, e.g. 8,16,32")
    ap.add_argument("--gammas", type=ints, default=None, help="comma-separated; default: the drafter's largest")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--temperature", type=float, default=0.0, help="sampling temperature of the timed runs "
                    "(0 = greedy); greedy identity is checked either way")
    ap.add_argument("--json", type=Path, help="also write the full report here")
    ap.add_argument("--reprofile", type=int, default=0, metavar="REPEATS",
                    help="first re-measure the cost table next to the drafter (what calibrate-threshold does, "
                         "same B range) with this many repeats; 0 = use the table as it is")
    args = ap.parse_args()
    torch.set_num_threads(1)

    from pdraft.calibrate import find_calibration, find_sps_table, load_calibration, load_sps_table
    from pdraft.data.prompts import load_prompts
    from pdraft.data.templates import eos_ids
    from pdraft.decode import inputs as P
    from pdraft.recipe import load_recipe
    from pdraft.runtime import make_runtime
    from pdraft.targets.loader import load_target

    if args.demo:
        recipe_path, drafter_dir = build_demo(args.demo, args.demo_steps, args.demo_block_size,
                                              args.demo_sps_max_tokens, args.temperature)
    else:
        if not args.recipe or not args.drafter:
            ap.error("give RECIPE and --drafter, or --demo DIR")
        recipe_path, drafter_dir = Path(args.recipe), args.drafter
    cal, sps_path = find_calibration(drafter_dir), find_sps_table(drafter_dir)
    if cal is None or sps_path is None:
        print(f"{drafter_dir} has no calibration or cost table: run pdraft calibrate-threshold first", file=sys.stderr)
        return 2
    r = load_recipe(recipe_path, [])
    target = load_target(r.target, make_runtime(r.runtime))
    model = target.model
    if args.reprofile:
        from pdraft.calibrate.sps import profile, save_sps_table

        old = load_sps_table(sps_path)
        context = int(json.loads(sps_path.read_text()).get("pdraft", {}).get("context_tokens", 128))
        print(f"re-profiling the cost table, B = 1..{old.max_batch_tokens}, {context}-token cache, {args.reprofile} "
              "repeats", file=sys.stderr)
        save_sps_table(profile(model, old.max_batch_tokens, repeats=args.reprofile, context=context,
                               target=str(r.target.id)), sps_path)
    drafter = P.load_attached_drafter(drafter_dir, model)
    gammas = args.gammas or [drafter.max_gamma()]
    temps, sps = load_calibration(cal), load_sps_table(sps_path)
    table_meta = json.loads(sps_path.read_text()).get("pdraft", {})
    # The first prompts of the set: calibrate-threshold fitted on the last ones.
    texts = [c.prompt for c in load_prompts(r.calibrate.prompts)]
    eos = eos_ids(model, target.tokenizer)
    common = dict(max_new_tokens=args.max_new_tokens, eos_token_ids=eos)
    from pdraft.models.api import SamplingParams

    sampling = SamplingParams(temperature=args.temperature) if args.temperature > 0 else None
    report = {"machine_start": machine(), "drafter": str(drafter_dir), "max_new_tokens": args.max_new_tokens,
              "temperature": args.temperature, "calibration": str(cal),
              "repeats": args.repeats, "cost_table": {"path": str(sps_path), "device": table_meta.get("device"),
                                                       "max_batch_tokens": sps.max_batch_tokens}, "configs": []}
    m = report["machine_start"]
    print(f"{m['device']}, {m['cpus']} CPUs, torch {m['torch']} on {m['torch_threads']} thread, load average "
          f"{m['load_average']}; cost table from {table_meta.get('device')}; {args.max_new_tokens} new tokens, "
          f"median of {args.repeats} interleaved repeats, temperature {args.temperature}")
    ok = True
    for R in args.batch_sizes:
        if R > len(texts):
            print(f"skipping batch {R}: only {len(texts)} prompts", file=sys.stderr)
            continue
        ids = P.encode(target.tokenizer, texts[:R], raw=not r.decode.chat_template)
        for gamma in gammas:
            if R * (gamma + 1) > sps.max_batch_tokens:
                print(f"skipping batch {R}, gamma {gamma}: a full block of {R * (gamma + 1)} tokens is past the cost "
                      f"table's {sps.max_batch_tokens}", file=sys.stderr)
                continue
            rows = run_config(model, drafter, ids, gamma, common, sps, temps, args.repeats, sampling)
            print_config(R, gamma, rows, sps)
            ok = ok and all(x["greedy_identical"] for x in rows.values())
            report["configs"].append({"batch": R, "gamma": gamma, "rows": rows})
    report["machine_end"] = machine()
    print(f"\nload average at the end: {report['machine_end']['load_average']}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
