"""TPOT with and without drafting, side by side in one run on this machine, and the split of a round's wall
time into draft, verify and bookkeeping (everything that is neither drafter nor target compute: acceptance,
cache rollback, masks, Python). Medians over repeats.

Rows: the target alone (the same loop with gamma = 0); an oracle test double that proposes the target's own
greedy continuation with a chosen miss rate (near-free drafting, so it shows the engine's ceiling and its
bookkeeping); and, when pdraft.models provides real drafters, a random-weight DFlash drafter (realistic draft
cost, acceptance near 0). The target is a random-weight Qwen3 sized like the embedded default unless
--target points at a real one.

    OMP_WAIT_POLICY=PASSIVE PYTHONPATH=. python benchmarks/decode_tpot.py [--target PATH] [--gamma 8]
"""

from __future__ import annotations

import argparse
import os
import statistics

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from pdraft.bench.report import machine_info  # noqa: E402
from tests.doubles import DoubleConfig, OracleDrafter, tiny_target  # noqa: E402
from pdraft.decode.engine import generate  # noqa: E402


def machine() -> str:
    m = machine_info()
    return (f"{m['cpu']}; {m['cpu_count']} CPUs; torch {m['torch']}, {m['torch_threads']} thread(s); "
            f"python {m['python']}")


def measure(target, drafter, prompts, gamma, new_tokens, repeats):
    rows = []
    for _ in range(repeats):
        res = generate(target, drafter, prompts, gamma=gamma, max_new_tokens=new_tokens)
        s = res.summary()
        per_round = (s.draft_s_per_round, s.verify_s_per_round, s.bookkeeping_s / s.batched_rounds)  # batched: once
        rows.append((s.tpot_s, *per_round, s.tau, res))
    med = [statistics.median(r[i] for r in rows) for i in range(5)]
    return med, rows[-1][5]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", help="HF target folder; default: random-weight Qwen3 (hidden 256, 4 layers)")
    ap.add_argument("--gamma", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--miss-rate", type=float, default=0.3, help="oracle double: chance each draft is wrong")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    if args.target:
        from transformers import AutoModelForCausalLM

        target = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32).eval()
    else:
        target = tiny_target(vocab_size=8192, hidden_size=256, num_layers=4, context=1024, init_std=0.3)
    cfg = target.config
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, cfg.vocab_size, (args.batch, args.prompt_len), generator=g).tolist()
    layers = [0, cfg.num_hidden_layers - 1]

    generate(target, None, prompts, max_new_tokens=4)  # warm-up
    base, base_res = measure(target, None, prompts, None, args.new_tokens, args.repeats)
    refs = [p + o for p, o in zip(prompts, base_res.output_ids)]
    candidates = [("oracle double (miss %.0f%%)" % (100 * args.miss_rate),
                   OracleDrafter(DoubleConfig(cfg.vocab_size, cfg.hidden_size, layers, block_size=args.gamma),
                                 refs, miss_rate=args.miss_rate))]
    try:
        from pdraft.models import build_drafter

        real = build_drafter("dflash", cfg, seed=0, mask_token_id=cfg.vocab_size - 1, num_hidden_layers=1,
                             block_size=args.gamma)
        real.attach_target(target)
        candidates.append(("DFlash 1 layer, random weights", real.eval()))
    except ImportError:
        print("(pdraft.models has no real drafters in this build: DFlash row skipped)")

    print(machine())
    print(f"target: {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, vocab {cfg.vocab_size}; "
          f"prompt {args.prompt_len} tokens, {args.new_tokens} new, batch {args.batch}, gamma {args.gamma}; "
          f"medians of {args.repeats}")
    header = (f"{'drafter':34} {'TPOT ms':>8} {'speedup':>8} {'tau':>6} {'draft ms':>9} {'verify ms':>10} "
              f"{'other ms':>9} {'other %':>8}")
    print(header)
    print("-" * len(header))

    def row(name, med):
        tpot, draft, verify, other, tau = med
        total = draft + verify + other
        print(f"{name:34} {1000 * tpot:8.2f} {base[0] / tpot:8.2f} {tau:6.2f} {1000 * draft:9.2f} "
              f"{1000 * verify:10.2f} {1000 * other:9.2f} {100 * other / total:7.1f}%")

    row("none (target alone)", base)
    for name, drafter in candidates:
        med, res = measure(target, drafter, prompts, args.gamma, args.new_tokens, args.repeats)
        same = res.output_ids == base_res.output_ids
        row(name + ("" if same else "  OUTPUT DIFFERS!"), med)
    print("per-round times; other = bookkeeping (acceptance, cache rollback, masks, Python)")


if __name__ == "__main__":
    main()
