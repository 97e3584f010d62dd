"""Hardware-aware prefix scheduler vs full-block verification, side by side in one run.

At a batch size R where verifying every drafted token costs more than it earns (the cost table says
SPS(R * (gamma + 1)) * expected tokens is below what shorter verification would give), batch-decode the same
prompts three ways: target alone, full-block verification, and the scheduler (paper Algorithm 1) driven by
the fitted STS calibration and the profiled SPS table found next to the drafter. Reports tokens per second,
tau, verified tokens per round and verification utilization (pdraft.bench.metrics, the single definition),
and checks that both speculative outputs are token-identical to the target's greedy output.

    python benchmarks/scheduler_throughput.py RECIPE --drafter DIR [--batch-size 16] [--max-new-tokens 32]
    python benchmarks/scheduler_throughput.py --demo /tmp/sched-demo      # self-contained CPU run

`--demo DIR` first builds a tiny random Qwen3 target (final norm sharpened so its greedy output is peaked),
trains a tiny DSpark drafter for a minute on the target's own greedy responses (data.regenerate, as real
training does), and runs calibrate-threshold, so the whole chain is
measured from scratch on a CPU. Its numbers say nothing about real targets: on a CPU and a tiny target the SPS
curve is nearly flat for small B, where the scheduler has nothing to save; read the printed cost table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402


def build_demo(root: Path, steps: int, block_size: int = 16, sps_max_batch_tokens: int = 544) -> tuple[Path, Path]:
    """Tiny target + trained tiny DSpark drafter + calibration; returns (recipe, drafter folder)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from test_data_tinytarget import make_tiny_target, write_chat_jsonl
    from transformers import AutoModelForCausalLM

    from pdraft.cache.export import export_hidden
    from pdraft.calibrate.run import calibrate
    from pdraft.cli.train import training_source
    from pdraft.recipe import load_recipe
    from pdraft.runtime import make_runtime
    from pdraft.target.loader import load_target
    from pdraft.train.loop import train

    root.mkdir(parents=True, exist_ok=True)
    target_dir = root / "target"
    if not (target_dir / "config.json").exists():
        make_tiny_target(target_dir, hidden=256, layers=4)
        model = AutoModelForCausalLM.from_pretrained(target_dir)
        with torch.no_grad():
            model.model.norm.weight.mul_(12.0)  # peaked next-token distributions: something to learn
        model.save_pretrained(target_dir)
    data = write_chat_jsonl(root / "prompts.jsonl", 64)
    body = {
        "output_dir": str(root / "run"),
        "target": {"id": str(target_dir), "num_layer_ids": 2},
        "data": {"source": str(data), "shard_tokens": 2048, "cache_dir": str(root / "cache"), "regenerate": True,
                 "regenerate_max_new_tokens": 48},
        "drafter": {"kind": "dspark", "num_layers": 1, "block_size": block_size, "markov_rank": 16, "mask_token_id": 0},
        "train": {"output_dir": str(root / "train"), "steps": steps, "batch_size": 8, "lr": 1e-2,
                  "warmup_steps": 5, "num_anchors": 16, "checkpoint_every": steps, "eval_every": steps,
                  "log_every": 10},
        "calibrate": {"prompts": str(data), "num_prompts": 32, "max_new_tokens": 32, "min_samples": 20,
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


def timed(fn, repeats: int):
    runs = [fn() for _ in range(repeats)]
    return runs[0], statistics.median(r.summary().tokens_per_s for r in runs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("recipe", nargs="?", help="YAML recipe (target, prompts)")
    ap.add_argument("--drafter", type=Path, help="calibrated DSpark drafter folder")
    ap.add_argument("--demo", type=Path, help="build, train and calibrate a tiny target + drafter here first")
    ap.add_argument("--demo-steps", type=int, default=150)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--gamma", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)

    from pdraft.bench.metrics import summarize
    from pdraft.calibrate import find_calibration, find_sps_table, load_calibration, load_sps_table
    from pdraft.data.prompts import load_prompts
    from pdraft.decode import prompts as P
    from pdraft.decode.engine import generate
    from pdraft.decode.scheduler import VerifyConfig
    from pdraft.recipe import load_recipe
    from pdraft.runtime import make_runtime
    from pdraft.target.loader import load_target

    if args.demo:
        recipe_path, drafter_dir = build_demo(args.demo, args.demo_steps)
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
    drafter = P.load_attached_drafter(drafter_dir, model)
    gamma = args.gamma or drafter.max_gamma()
    temps, sps = load_calibration(cal), load_sps_table(sps_path)
    # The first prompts of the set: calibrate-threshold fitted on the last ones.
    texts = [c.prompt for c in load_prompts(r.calibrate.prompts)][: args.batch_size]
    ids = P.encode(target.tokenizer, texts, raw=not r.decode.chat_template)
    eos = P.eos_ids(model, target.tokenizer)
    common = dict(max_new_tokens=args.max_new_tokens, eos_token_ids=eos)

    base, base_tps = timed(lambda: generate(model, None, ids, **common), args.repeats)
    full, full_tps = timed(lambda: generate(model, drafter, ids, gamma=gamma, **common), args.repeats)
    sched_cfg = VerifyConfig(mode="scheduler", sps=sps, confidence_temperatures=temps)
    sched, sched_tps = timed(lambda: generate(model, drafter, ids, gamma=gamma, verify=sched_cfg, **common),
                             args.repeats)

    rows = {}
    for name, res, tps in (("target only", base, base_tps), ("full block", full, full_tps),
                           ("scheduler", sched, sched_tps)):
        s = summarize(res.records)
        rounds = len({rec.round for rec in res.records})
        rows[name] = {"tokens_per_s": tps, "tau": s.tau, "verified_per_round": (sum(x.verified for x in res.records)
                                                                            / max(len(res.records), 1)),
                      "verify_tokens_per_batch_round": sum(x.verified + 1 for x in res.records) / max(rounds, 1),
                      "utilization": s.verification_utilization, "token_acceptance": s.token_acceptance,
                      "greedy_identical": res.output_ids == base.output_ids}
    R = len(ids)
    cost = {"batch": R, "gamma": gamma, "sps_at_R": sps(R), "sps_at_full_block": sps(R * (gamma + 1)),
            "table_max_batch_tokens": sps.max_batch_tokens, "device": json.loads(sps_path.read_text())
            .get("pdraft", {}).get("device")}
    report = {"rows": rows, "cost_table": cost, "drafter": str(drafter_dir), "max_new_tokens": args.max_new_tokens,
              "repeats": args.repeats, "torch": torch.__version__}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"batch {R}, gamma {gamma}, {args.max_new_tokens} new tokens, median of {args.repeats}; cost table on "
              f"{cost['device']}: SPS({R}) = {cost['sps_at_R']:.1f}, SPS({R * (gamma + 1)}) = "
              f"{cost['sps_at_full_block']:.1f} steps/s")
        print(f"{'':12} {'tok/s':>8} {'tau':>6} {'verified/round':>15} {'B/round':>8} {'util':>6} {'accept':>7} "
              f"{'greedy==target':>15}")
        for name, x in rows.items():
            def f(v, spec):
                return format(v, spec) if v is not None else "-"
            print(f"{name:12} {f(x['tokens_per_s'], '8.1f')} {f(x['tau'], '6.2f')} "
                  f"{f(x['verified_per_round'], '15.2f')} {f(x['verify_tokens_per_batch_round'], '8.1f')} "
                  f"{f(x['utilization'], '6.0%')} {f(x['token_acceptance'], '7.0%')} {str(x['greedy_identical']):>15}")
    ok = rows["full block"]["greedy_identical"] and rows["scheduler"]["greedy_identical"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
