"""How far llama.cpp's batched evaluation moves the target's logits from its one-token steps (issue 58): the figure
the near-tie bound (pdraft.serving.llamacpp.NEAR_TIE_GAP) is chosen from.

    python tests/engines/llamacpp_tie_drift.py [--recipe recipes/smollm2.yaml] [--per-set 2] [--max-new-tokens 64]
                                               [--batch 16] [--target-gguf FILE]

One llama-server, the target alone (its float32 GGUF by default). Per prompt, its greedy output one token per
decode step, each token with its top log-probabilities (LlamaServer.complete n_probs: one softmax, so two of them
differ by exactly their logits' difference). Then every --batch-th position again, scored at the end of one batched
evaluation, as a verify pass scores its draft: the prompt and the output up to the position, the slot's cache
holding the previous request's (cache_prompt), so --batch - 1 new tokens go through in one batch (the slot also
caches the token it generated last). The server's speculative path reports no scores for drafted tokens
(tools/server/server-context.cpp, "TODO: set result.probs"), so the verify batch is rebuilt this way.
Per position: the change of the top-2 gap (the one-token step's two best tokens, their log-probability difference
in each evaluation). Prints one row per prompt and the maximum; exits non-zero only when nothing was compared."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path


def bench_prompts(recipe, tok, per_set: int) -> list[list[int]]:
    prompts = []
    for path in recipe.bench.prompt_sets:
        for line in Path(path).read_text().splitlines()[:per_set]:
            row = json.loads(line)
            text = row.get("turns", [row.get("prompt") or row.get("question") or ""])[0]
            chat = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                           tokenize=False)
            prompts.append(tok(chat, add_special_tokens=False)["input_ids"])
    return prompts


def gap_change(single: list[tuple[int, float]], batched: list[tuple[int, float]]) -> float | None:
    """|top-2 gap in one evaluation - the same two tokens' gap in the other|; None where they are not both listed."""
    if len(single) < 2:
        return None
    (t1, l1), (t2, l2) = single[0], single[1]
    other = dict(batched)
    if t1 not in other or t2 not in other:
        return None
    return abs((l1 - l2) - (other[t1] - other[t2]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", type=Path, default=Path("recipes/smollm2.yaml"))
    ap.add_argument("--per-set", type=int, default=2, help="prompts per bench set")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16, help="tokens per batched evaluation (a verify pass: gamma + 1)")
    ap.add_argument("--target-gguf", type=Path, help="default: the recipe's target converted to float32")
    args = ap.parse_args()

    from transformers import AutoTokenizer

    from pdraft.recipe import load_recipe
    from pdraft.serving.check import _target_info
    from pdraft.engines.llamacpp import LlamaServer, ServerSpec
    from pdraft.serving.llamacpp import target_gguf

    recipe = load_recipe(args.recipe)
    target = Path(_target_info(recipe).path).resolve()
    work = Path(tempfile.mkdtemp(prefix="pdraft-tie-drift-"))
    tgt = args.target_gguf or target_gguf(target, work)
    prompts = bench_prompts(recipe, AutoTokenizer.from_pretrained(target), args.per_set)
    every = []
    with LlamaServer(ServerSpec(tgt, context=4096), work / "server.log") as server:
        for i, p in enumerate(prompts):
            single = server.complete(p, args.max_new_tokens, n_probs=8)
            server.complete(p, 1, cache_prompt=True)  # the slot now caches the prompt and the first token
            changes = []
            for k in range(args.batch, len(single.tokens), args.batch):
                batched = server.complete(p + single.tokens[:k], 1, n_probs=8, cache_prompt=True)
                if (c := gap_change(single.top[k], batched.top[0])) is not None:
                    changes.append(c)
            every += changes
            print(f"prompt {i}: {len(changes)} positions, max |change of the top-2 gap| "
                  f"{max(changes, default=0):.5f}", flush=True)
    if not every:
        print("FAIL: no position compared")
        return 1
    every.sort()
    print(f"== {len(every)} positions on {len(prompts)} prompts, batches of {args.batch}: |change of the top-2 gap| "
          f"max {every[-1]:.5f}, p99 {every[int(0.99 * (len(every) - 1))]:.5f}, median {every[len(every) // 2]:.5f} "
          f"({tgt.name})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
