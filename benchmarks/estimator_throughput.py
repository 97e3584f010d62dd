"""The online acceptance estimator against full-block verification at one batch size, side by side in one run.

For each drafter, decode the same prompts (the first N/2 of each of the recipe's bench prompt sets, so N in
all, in one batch) with `--verify full` and `--verify estimator`, taking turns within each repeat, and print
medians over repeats of total tokens per wall second of decoding and per CPU second of this process
(which other processes on a shared machine disturb far less), the estimator's mean verify length (drafts
sent to the target per request-round) against the full block's, tau, and whether the two outputs are token-
identical (greedy). The target alone is decoded too, for the speedup. Timings on a shared machine are noisy:
compare the ratios of one run, and give the load (`uptime`) with the figures.

    python benchmarks/estimator_throughput.py recipes/quickstart.yaml --drafter runs/quickstart/dspark/final \\
        --drafter runs/quickstart/dflash/final --batch-size 16 --gamma 16 --repeats 3
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
    from pdraft.decode.settings import DecodeSettings
    from pdraft.models.api import SamplingParams
    from pdraft.recipe import load_recipe
    from pdraft.runtime import make_runtime
    from pdraft.targets.loader import load_target

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("recipe")
    ap.add_argument("--drafter", action="append", required=True)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--gamma", type=int, default=None, help="default: each drafter's largest")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--max-new-tokens", type=int, default=None, help="default: the recipe's bench.max_new_tokens")
    args = ap.parse_args()

    r = load_recipe(args.recipe, [])
    loaded = load_target(r.target, make_runtime(r.runtime))
    eos = eos_ids(loaded.model, loaded.tokenizer)
    sets = r.bench.prompt_sets
    per_set = -(-args.batch_size // len(sets))
    texts = [c.prompt for source in sets for c in load_prompts(source, split="train", max_samples=per_set)]
    prompts = encode(loaded.tokenizer, texts[: args.batch_size], raw=not r.decode.chat_template,
                     context=loaded.max_context)  # as bench encodes its prompt sets
    fields = {"sampling": SamplingParams(args.temperature)}
    if args.max_new_tokens:
        fields["max_new_tokens"] = args.max_new_tokens
    base = DecodeSettings.from_recipe(r, "bench").replace(**fields)
    print(f"{len(prompts)} prompts in one batch, {base.max_new_tokens} new tokens each, T={args.temperature}")

    def timed(drafter, settings, verify=None):
        t0, c0 = time.perf_counter(), time.process_time()
        out = generate(loaded.model, drafter, prompts, settings, verify=verify, eos_token_ids=eos)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        drafted = [rec for rec in out.records if rec.gamma > 0]
        mean_l = sum(rec.verified for rec in drafted) / max(len(drafted), 1)
        tokens = sum(map(len, out.output_ids))
        return tokens / wall, mean_l, out.summary().tau, tokens / cpu, out.output_ids

    runs = [timed(None, base) for _ in range(args.repeats)]
    alone, alone_cpu = statistics.median(x[0] for x in runs), statistics.median(x[3] for x in runs)
    print(f"target alone: {alone:.1f} tokens/s, {alone_cpu:.1f} tokens/CPU-s")
    for path in args.drafter:
        drafter = load_attached_drafter(Path(path), loaded.model)
        gamma = args.gamma or drafter.max_gamma()
        name = f"{Path(path).parent.name}/{Path(path).name} ({drafter.config.kind})"
        figures = {}
        for _ in range(args.repeats):
            for mode in ("full", "estimator"):
                settings = base.replace(verify=mode, gamma=gamma)
                verify, _ = settings.build_verify(drafter_dir=path)
                figures.setdefault(mode, []).append(timed(drafter, settings, verify))
        (full, est) = (figures["full"], figures["estimator"])
        med = {m: [statistics.median(x[i] for x in figures[m]) for i in range(4)] for m in figures}
        # Sampled, a different length draws a token from a different rule (same law): only greedy must agree.
        same = all(a[4] == b[4] for a, b in zip(full, est)) if args.temperature == 0 else "n/a (sampled)"
        print(f"{name} gamma {gamma}: full {med['full'][0]:.1f} tok/s (l {med['full'][1]:.2f}, "
              f"tau {med['full'][2]:.2f}); estimator {med['estimator'][0]:.1f} tok/s (l {med['estimator'][1]:.2f}, "
              f"tau {med['estimator'][2]:.2f}); estimator/full {med['estimator'][0] / med['full'][0]:.3f}; "
              f"speedup over target alone {med['full'][0] / alone:.2f} / {med['estimator'][0] / alone:.2f}; "
              f"per CPU-s full {med['full'][3]:.1f}, estimator {med['estimator'][3]:.1f} "
              f"(ratio {med['estimator'][3] / med['full'][3]:.3f}, speedups {med['full'][3] / alone_cpu:.2f} / "
              f"{med['estimator'][3] / alone_cpu:.2f}); "
              f"identical outputs: {same}; per repeat full {[round(x[0], 1) for x in full]} "
              f"estimator {[round(x[0], 1) for x in est]}")


if __name__ == "__main__":
    main()
