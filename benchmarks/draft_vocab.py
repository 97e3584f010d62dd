"""A drafter pass and a training step at Qwen3's 151,936-token vocabulary with a draft vocabulary of V_d tokens
(`drafter.draft_vocab_size`) against the whole one, for DFlash and DSpark at the published Qwen3-4B widths
(hidden 2560, MLP 9728, 32 heads, 8 key/value heads, head dim 128, five target layers; DSpark: block 7, Markov
rank 256, confidence head; DFlash: block 16) with random weights.

Each (family, V_d, phase) runs in a fresh subprocess, so its peak resident set size (ru_maxrss; the target's
embedding and head, 3.1 GB in float32, included) and its peak above the built models are its own. "pass": one proposal of a whole block after 64 context
tokens (median of 5 after one warm-up). "train": one optimizer step (AdamW) of forward_train over one sequence
with the chunked losses of pdraft.train.losses and backward. On a small CPU the drafter has `--layers` decoder
layers (default 1 of the published 5: the vocabulary-sized terms, the subject here, do not depend on the depth).

    OMP_NUM_THREADS=1 python benchmarks/draft_vocab.py                 # V_d 8192, 32768 and the whole vocabulary
    OMP_NUM_THREADS=1 python benchmarks/draft_vocab.py --seq 128 --anchors 4 --layers 5
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

VOCAB, HIDDEN = 151_936, 2560
SHAPES = {"dflash": dict(block_size=16), "dspark": dict(block_size=7, markov_rank=256, confidence_head=True)}


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: kilobytes


def child(args) -> dict:
    import torch
    from torch import nn
    from transformers import Qwen3Config

    from pdraft.models.build import build_drafter
    from pdraft.train.losses import drafter_loss, position_weights

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=9728, num_hidden_layers=36,
                      num_attention_heads=32, num_key_value_heads=8, head_dim=128)

    class Shared(nn.Module):  # the target's embedding and LM head, all a drafter reads of it
        def __init__(self):
            super().__init__()
            self.embed, self.head = nn.Embedding(VOCAB, HIDDEN), nn.Linear(HIDDEN, VOCAB, bias=False)
            nn.init.normal_(self.embed.weight, std=0.02)
            nn.init.normal_(self.head.weight, std=0.02)

        def get_input_embeddings(self):
            return self.embed

        def get_output_embeddings(self):
            return self.head

    target = Shared()
    vd = None if args.vocab == "full" else int(args.vocab)
    d = build_drafter(args.family, cfg, seed=0, mask_token_id=151669, num_hidden_layers=args.layers,
                      target_layer_ids=[1, 9, 17, 25, 33], draft_vocab_size=vd, **SHAPES[args.family])
    d.attach_target(target)
    if vd is not None:
        d.init_from_tokens(torch.randint(0, 1000, (VOCAB,)))
    feats = torch.randn(1, args.seq, 5 * HIDDEN)
    ids = torch.randint(0, VOCAB, (1, args.seq))
    base = rss_mb()
    if args.phase == "pass":
        d.eval()
        times = []
        for _ in range(6):
            state = d.new_state(1, args.seq + 64)
            d.extend_context(state, feats, torch.arange(args.seq)[None])
            t0 = time.perf_counter()
            d.propose(state, ids[:, -1], torch.tensor([args.seq]), d.max_gamma())
            times.append(time.perf_counter() - t0)
        seconds = statistics.median(times[1:])
    else:
        d.train()
        opt = torch.optim.AdamW([p for p in d.parameters() if p.requires_grad], lr=1e-4)
        anchors = torch.linspace(1, args.seq - 1 - d.max_gamma(), args.anchors).long()[None]
        last = torch.randn(1, args.seq, HIDDEN)
        t0 = time.perf_counter()
        out = d.forward_train(ids, feats, anchors, compute_logits=False)
        g = out.hidden.shape[2]
        t_idx = (anchors[:, :, None] + torch.arange(g)).clamp(max=args.seq - 1)
        k = torch.arange(g).expand(1, args.anchors, g)
        res = drafter_loss(out.hidden.flatten(0, 2), target.head.weight, last[0][t_idx[0]].flatten(0, 1),
                           out.target_ids.flatten(), position_weights(k, 4.0).flatten(),
                           u=None if out.seq_features is None else out.seq_features.flatten(0, 2), w2=out.seq_w2,
                           conf_logits=None if out.confidence_logits is None else out.confidence_logits.flatten(),
                           alpha_ce=0.1, alpha_tv=0.9, alpha_conf=1.0 if out.confidence_logits is not None else 0.0,
                           head=out.head, vocab=out.vocab)
        res.loss.backward()
        opt.step()
        seconds = time.perf_counter() - t0
    trainable = sum(p.numel() for p in d.parameters() if p.requires_grad)
    return {"family": args.family, "draft_vocab": args.vocab, "phase": args.phase, "seconds": seconds,
            "peak_mb_over_models": rss_mb() - base, "peak_mb": rss_mb(), "trainable_params": trainable}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--families", default="dflash,dspark")
    p.add_argument("--vocabs", default="8192,32768,full")
    p.add_argument("--phases", default="pass,train")
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--anchors", type=int, default=2)
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--family", default="dflash", help=argparse.SUPPRESS)
    p.add_argument("--vocab", default="full", help=argparse.SUPPRESS)
    p.add_argument("--phase", default="pass", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return
    rows = []
    for family in args.families.split(","):
        for phase in args.phases.split(","):
            for vocab in args.vocabs.split(","):
                cmd = [sys.executable, __file__, "--child", "--family", family, "--vocab", vocab, "--phase", phase,
                       "--seq", str(args.seq), "--anchors", str(args.anchors), "--layers", str(args.layers)]
                out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
                rows.append(json.loads(out.strip().splitlines()[-1]))
                print(json.dumps(rows[-1]), flush=True)
    print(f"\n{platform.processor() or platform.machine()}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}, "
          f"seq {args.seq}, {args.anchors} anchors, {args.layers} drafter layer(s)")
    print(f"{'family':7} {'phase':5} {'V_d':>7} {'seconds':>8} {'peak MB':>8} {'+ over built':>12} {'trainable':>11}")
    for r in rows:
        print(f"{r['family']:7} {r['phase']:5} {r['draft_vocab']:>7} {r['seconds']:8.3f} {r['peak_mb']:8.0f} "
              f"{r['peak_mb_over_models']:12.0f} {r['trainable_params']:11,}")


if __name__ == "__main__":
    main()
