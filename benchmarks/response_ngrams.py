"""How predictable a target's own responses are, before any drafter is trained: the held-out top-1 of n-gram
counting models over the response tokens of a hidden-state cache (the sequences `pdraft train` would read).

    PYTHONPATH=. python benchmarks/response_ngrams.py runs/quickstart/hidden [--orders 1 2 3 4]

An order-n model predicts each response token from the n tokens before it, by the most frequent continuation
counted on the training sequences (falling back to the most frequent response token). The split is
`pdraft train`'s own (`split_validation`: every k-th sequence validates), so the figure stands beside the
drafter's validation line. A drafter's first draft position reads the same context and more (the target's
hidden states), so it should end above these figures; one that stays below them after training has not yet
learnt what a counting table picks up from the same tokens. CPU only, a few seconds.

Figures: docs/TARGET.md ("Why drafters stall on the candidate").
"""

from __future__ import annotations

import argparse
import collections
import json
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pdraft.cache.reader import HiddenCache  # noqa: E402
from pdraft.train.batches import split_validation  # noqa: E402


def response_tokens(cache: HiddenCache, indices: list[int]) -> list[tuple[list[int], list[bool]]]:
    out = []
    for i in indices:
        item = cache[i]
        out.append((item["input_ids"].tolist(), item["loss_mask"].bool().tolist()))
    return out


def ngram_top1(train, held_out, order: int) -> tuple[float, int]:
    """Held-out top-1 of an order-`order` counting model over response tokens; (accuracy, tokens)."""
    table: dict[tuple, collections.Counter] = collections.defaultdict(collections.Counter)
    unigram: collections.Counter = collections.Counter()
    for ids, mask in train:
        for t in range(len(ids)):
            if mask[t]:
                unigram[ids[t]] += 1
                if t >= order:
                    table[tuple(ids[t - order:t])][ids[t]] += 1
    fallback = unigram.most_common(1)[0][0]
    hits = total = 0
    for ids, mask in held_out:
        for t in range(len(ids)):
            if not mask[t]:
                continue
            total += 1
            seen = table.get(tuple(ids[t - order:t])) if t >= order else None
            guess = seen.most_common(1)[0][0] if seen else fallback
            hits += guess == ids[t]
    return hits / max(1, total), total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cache", help="a finished hidden-state cache folder (pdraft export-hidden)")
    ap.add_argument("--orders", type=int, nargs="+", default=[1, 2, 3, 4])
    args = ap.parse_args()
    cache = HiddenCache(args.cache, verify="none")
    train_ids, val_ids = split_validation(len(cache))
    train, held_out = response_tokens(cache, train_ids), response_tokens(cache, val_ids)
    per_seq = sum(sum(m) for _, m in train + held_out) / max(1, len(train) + len(held_out))
    print(f"machine: {platform.machine()} {platform.processor() or ''} (CPU; no timing here)")
    print(f"cache {args.cache}: {len(train)} training / {len(held_out)} held-out sequences, "
          f"{per_seq:.1f} response tokens each")
    rows = {}
    for order in args.orders:
        acc, n = ngram_top1(train, held_out, order)
        rows[order] = round(acc, 4)
        print(f"order {order}: held-out top-1 {acc:.3f} over {n} response tokens")
    print(json.dumps({"cache": str(args.cache), "top1_by_order": rows}))


if __name__ == "__main__":
    main()
