"""Trees against chains at the same gamma: tau, verify time per round and tokens per second, side by side.

For each drafter, each prompt set of the recipe's bench (its first N prompts, in batches of B) and each gamma,
decode with the chain and with every tree shape given (`--tree 32x4 --tree 32x2 ...`), taking turns within each
repeat, and print tau, tau tree / chain, the verify pass's median milliseconds per drafting round, tokens per
wall second (medians over repeats) and, greedy, whether the tree's output equals the chain's token for token.
Timings on a shared machine are noisy: read the ratios of one run, and give the load (`uptime`) with them.

    python benchmarks/tree_tau.py recipes/quickstart.yaml --drafter runs/quickstart/dflash/final \\
        --gamma 8 --gamma 16 --tree 32x4 --tree 32x2 --num-prompts 8 --batch-size 1 --repeats 1
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    from pdraft.data.prompts import load_prompts
    from pdraft.data.templates import eos_ids
    from pdraft.decode.engine import generate
    from pdraft.decode.inputs import encode, load_attached_drafter
    from pdraft.decode.settings import DecodeSettings, parse_tree
    from pdraft.metrics import join_batches, summarize
    from pdraft.models.api import SamplingParams
    from pdraft.recipe import load_recipe
    from pdraft.runtime import make_runtime
    from pdraft.targets.loader import load_target

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("recipe")
    ap.add_argument("--drafter", action="append", required=True)
    ap.add_argument("--gamma", type=int, action="append", required=True)
    ap.add_argument("--tree", action="append", required=True, help="32 or 32x4 (repeatable)")
    ap.add_argument("--prompt-set", action="append", default=None, help="default: the recipe's bench prompt sets")
    ap.add_argument("--num-prompts", type=int, default=8, help="prompts per set")
    ap.add_argument("--batch-size", type=int, default=8, help="prompts decoded together")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--max-new-tokens", type=int, default=None, help="default: the recipe's bench.max_new_tokens")
    args = ap.parse_args()

    r = load_recipe(args.recipe, [])
    loaded = load_target(r.target, make_runtime(r.runtime))
    eos = eos_ids(loaded.model, loaded.tokenizer)
    fields = {"sampling": SamplingParams(args.temperature)}
    if args.max_new_tokens:
        fields["max_new_tokens"] = args.max_new_tokens
    base = DecodeSettings.from_recipe(r, "bench").replace(**fields)
    trees = [parse_tree(t) for t in args.tree]
    print(f"{args.num_prompts} prompts per set in batches of {args.batch_size}, {base.max_new_tokens} new tokens, "
          f"T={args.temperature}; "
          f"load {os.getloadavg()[0]:.1f}")

    def run(drafter, prompts, settings):
        batches, outputs, wall = [], [], 0.0
        for start in range(0, len(prompts), args.batch_size):
            chunk = prompts[start:start + args.batch_size]
            t0 = time.perf_counter()
            out = generate(loaded.model, drafter, chunk, settings, eos_token_ids=eos)
            wall += time.perf_counter() - t0
            batches.append((out.records, len(chunk)))
            outputs += out.output_ids
        s = summarize(join_batches(batches))
        return s.tau, s.verify_s_per_round, sum(map(len, outputs)) / wall, outputs

    for source in args.prompt_set or r.bench.prompt_sets:
        texts = [c.prompt for c in load_prompts(source, split="train", max_samples=args.num_prompts)]
        prompts = encode(loaded.tokenizer, texts, raw=not r.decode.chat_template, context=loaded.max_context)
        alone = statistics.median(run(None, prompts, base)[2] for _ in range(args.repeats))
        print(f"\n{source}: target alone {alone:.1f} tokens/s")
        print(f"{'drafter':32} {'γ':>3} {'shape':>6} {'tau':>6} {'x chain':>8} {'verify ms':>9} {'tok/s':>7} "
              f"{'speedup':>7} same")
        for path in args.drafter:
            drafter = load_attached_drafter(Path(path), loaded.model)
            name = f"{Path(path).parent.name}/{Path(path).name} ({drafter.config.kind})"
            for gamma in args.gamma:
                if gamma > drafter.max_gamma():
                    continue
                shapes = [None] + trees
                figures = {shape: [] for shape in shapes}
                for _ in range(args.repeats):
                    for shape in shapes:  # taking turns: a stall of the machine hits every shape alike
                        figures[shape].append(run(drafter, prompts, base.replace(gamma=gamma, tree=shape)))
                chain_tau = figures[None][0][0]
                chain_out = figures[None][0][3]
                for shape in shapes:
                    runs = figures[shape]
                    tau = runs[0][0]
                    verify = statistics.median(x[1] for x in runs if x[1] is not None) * 1000
                    tps = statistics.median(x[2] for x in runs)
                    label = "chain" if shape is None else f"{shape[0]}x{shape[1]}"
                    same = "-" if args.temperature > 0 else ("yes" if runs[0][3] == chain_out else "NO")
                    print(f"{name:32} {gamma:>3} {label:>6} {tau:6.3f} {tau / chain_tau:8.3f} {verify:9.2f} "
                          f"{tps:7.1f} {tps / alone:7.2f} {same}")


if __name__ == "__main__":
    main()
