"""How peaked the quickstart target's next-token distribution is where a drafter must match it: the target's own
continuations of held-out prompts, greedy and sampled at T=1 (pdraft's target-alone loop, seeded), and at every
response position the target's softmax: mean top-1 probability, top-16 mass and entropy (nats). Greedy acceptance
counts argmax agreement, T=1 acceptance 1 - TV: on a flat distribution the first is easy and the second is not
(issue 42; docs/DRAFTERS.md#greedy-or-sampled-regeneration quotes the output). No timing.

    PYTHONPATH=. python benchmarks/target_flatness.py [--recipe recipes/quickstart.yaml] [--prompts builtin:code]
        [--num-prompts 12] [--max-new-tokens 64] [--k 16]
"""

from __future__ import annotations

import argparse

import torch


def flatness(model, prompts: list[list[int]], outputs: list[list[int]], k: int) -> dict:
    """Mean top-1 probability, top-k mass and entropy of the model's softmax over every response position."""
    top1 = topk = ent = 0.0
    n = 0
    for p, o in zip(prompts, outputs):
        if not o:
            continue
        ids = torch.tensor([list(p) + list(o)])
        with torch.no_grad():
            probs = torch.softmax(model(ids).logits[0, len(p) - 1:-1].float(), -1)  # [response, vocab]
        ordered = probs.sort(-1, descending=True).values
        top1 += float(ordered[:, 0].sum())
        topk += float(ordered[:, :k].sum())
        ent += float(-(probs * probs.clamp_min(1e-30).log()).sum())
        n += probs.shape[0]
    return {"positions": n, "top1": top1 / max(n, 1), f"top{k}_mass": topk / max(n, 1), "entropy": ent / max(n, 1)}


def main() -> None:
    from pdraft.data.prompts import load_prompts
    from pdraft.data.templates import encode_prompt, eos_ids
    from pdraft.decode.engine import generate
    from pdraft.models.api import SamplingParams
    from pdraft.recipe import load_recipe
    from pdraft.runtime import cpu_model, make_runtime
    from pdraft.targets.loader import load_target

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipe", default="recipes/quickstart.yaml")
    ap.add_argument("--prompts", default="builtin:code")
    ap.add_argument("--num-prompts", type=int, default=12)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--k", type=int, default=16)
    args = ap.parse_args()
    r = load_recipe(args.recipe)
    target = load_target(r.target, make_runtime(r.runtime))
    prompts = [encode_prompt(target.tokenizer, c.prompt, r.decode.chat_template)
               for c in load_prompts(args.prompts, max_samples=args.num_prompts)]
    print(f"{target.id} on {cpu_model()}; {len(prompts)} prompts of {args.prompts}, {args.max_new_tokens} new tokens")
    for temperature in (0.0, 1.0):
        out = generate(target.model, None, prompts, max_new_tokens=args.max_new_tokens,
                       eos_token_ids=eos_ids(target.model, target.tokenizer),
                       sampling=SamplingParams(temperature=temperature), seed=0)
        f = flatness(target.model, prompts, out.output_ids, args.k)
        print(f"continuations at T={temperature:g}: {f['positions']} positions; mean top-1 probability "
              f"{f['top1']:.3f}, top-{args.k} mass {f[f'top{args.k}_mass']:.3f}, entropy {f['entropy']:.2f} nats")


if __name__ == "__main__":
    main()
