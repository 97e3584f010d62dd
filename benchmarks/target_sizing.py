"""Sizing the embedded target: for candidate Qwen3 shapes (random weights, the builder's layout: head_dim 64,
query heads = hidden / 64, half as many key-value heads, MLP 3x hidden, tied embeddings), the time of one
target decoding step at batch 1 (TPOT of the target alone), a 1-layer DSpark drafter's round at block 16
(the quickstart's drafter: Markov rank 64, confidence head) split into draft and verify, and the training
throughput that sets the build time. pdraft's own engine (`pdraft.decode.engine.generate`) does the timing.
Acceptance is not measured here (random weights): with `other` the per-round bookkeeping (acceptance, cache
rollback, masks, Python), the implied speedup is tau * TPOT / (draft + verify + other), i.e. break-even at
tau = round / step (the `round/step` column) and 1.5x at tau = 1.5 * round / step.

    OMP_NUM_THREADS=1 python benchmarks/target_sizing.py [--shapes 256x4,256x8,384x6,512x4] [--vocab 4096]

Figures (2026-11-30, torch 2.13.0 CPU, 1 thread, the shared 2-core machine at load 7-9: absolute times moved
2-3x between runs, so read the ratios; three runs, round/step and draft/step per run):

    shape  params  fp16 MB  round/step (runs 1-3)  draft/step (runs 1-3)  train tok/s vs 256x4 (runs 2-3)
    256x4   4.2M    8.4     2.61 2.78 2.83          1.06 1.36 1.11          1
    256x8   7.3M   14.7     2.56 2.26 2.01          0.70 0.68 0.52          0.57 0.61
    384x6  12.2M   24.4     2.01 2.35 2.42          0.53 0.72 0.72          0.29 0.46
    512x4  14.7M   29.4     2.41 1.99 3.16          0.87 0.59 1.00          0.31 0.42

(run 1 had no `other` column: its round/step counts draft + verify only.) Verifying 17 tokens costs 1.4-1.9
target steps for every shape, so at batch 1 on a CPU speculation breaks even at tau ~2 and 1.5x needs tau
~3-4; a deeper target mainly shrinks the draft's share (about 1.1 of a step at 256x4, 0.5-0.7 at 256x8).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from pdraft.decode.engine import generate  # noqa: E402
from pdraft.models import build_drafter  # noqa: E402


def make_target(hidden: int, layers: int, vocab: int, mlp_mult: int = 3):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    heads = hidden // 64
    cfg = Qwen3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=mlp_mult * hidden,
                      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=max(1, heads // 2),
                      head_dim=64, max_position_embeddings=4096, tie_word_embeddings=True, initializer_range=0.3)
    return Qwen3ForCausalLM(cfg).float().eval()


def train_tokens_per_second(model, batch: int = 8, seq: int = 256, steps: int = 3) -> float:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, model.config.vocab_size, (batch, seq + 1))  # [batch, seq+1]
    model.train()
    times = []
    for _ in range(steps + 1):  # the first step warms up
        t = time.perf_counter()
        logits = model(input_ids=ids[:, :-1]).logits  # [batch, seq, vocab]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t)
    model.eval()
    return batch * seq / statistics.median(times[1:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="256x4,256x8,384x6,512x4", help="comma list of HIDDENxLAYERS")
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--gamma", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s), vocab {args.vocab}, gamma {args.gamma}, "
          f"prompt {args.prompt_len}, {args.new_tokens} new tokens, medians of {args.repeats}")
    print(f"{'shape':>8} {'params':>7} {'fp16 MB':>8} {'step ms':>8} {'draft ms':>9} {'verify ms':>10} "
          f"{'other ms':>9} {'round/step':>10} {'train tok/s':>11}")
    g = torch.Generator().manual_seed(0)
    for shape in args.shapes.split(","):
        hidden, layers = (int(x) for x in shape.split("x"))
        target = make_target(hidden, layers, args.vocab)
        params = sum(p.numel() for p in target.parameters())
        prompts = torch.randint(4, args.vocab, (1, args.prompt_len), generator=g).tolist()
        drafter = build_drafter("dspark", target.config, seed=0, mask_token_id=3, num_hidden_layers=1,
                                block_size=args.gamma, markov_rank=64, confidence_head=True)
        drafter.attach_target(target)
        drafter.eval()
        generate(target, drafter, prompts, gamma=args.gamma, max_new_tokens=8)  # warm-up
        step, draft, verify, other = [], [], [], []
        for _ in range(args.repeats):
            base = generate(target, None, prompts, max_new_tokens=args.new_tokens).summary()
            spec = generate(target, drafter, prompts, gamma=args.gamma, max_new_tokens=args.new_tokens).summary()
            step.append(base.tpot_s)
            draft.append(spec.draft_s_per_round)
            verify.append(spec.verify_s_per_round)
            other.append(spec.bookkeeping_s / spec.batched_rounds)
        s, d, v, o = (1000 * statistics.median(x) for x in (step, draft, verify, other))
        tps = train_tokens_per_second(target)
        print(f"{shape:>8} {params / 1e6:6.1f}M {2 * params / 1e6:8.1f} {s:8.2f} {d:9.2f} {v:10.2f} "
              f"{o:9.2f} {(d + v + o) / s:10.2f} {tps:11.0f}", flush=True)


if __name__ == "__main__":
    main()
