"""Short drafter trainings that isolate one suspect each, for a target on which drafters learn slowly: the same
1-layer DFlash, the same cache, the same anchors and batches, cross-entropy only, with one thing changed.

    PYTHONPATH=. python benchmarks/drafter_probes.py --recipe recipes/quickstart.yaml --cache runs/quickstart/hidden \
        [--set target.id=...] [--steps 200] [--probes base zero_features trainable_vocab last_layer_init]

Probes:
- base: the drafter as `pdraft train` builds it (the recipe's drafter section, kind forced to dflash);
- zero_features: the captured target layers replaced by zeros, so the drafter sees only its block's tokens: if
  it trains as well as `base`, the drafter is not using the target's hidden states;
- trainable_vocab: an untied, trainable copy of the target's embedding and LM head instead of the frozen shared
  ones: if it trains much better, the frozen vocabulary is what holds the drafter back;
- last_layer_init: the drafter's layer starts as a copy of the target's last decoder layer, its `fc` selects
  the last captured layer, and its norms are the target's (needs the capture to end at the layer before the
  last, e.g. `--set target.layer_ids=[2,3,4]` on a 6-layer target, and a cache made with those ids).

Each probe runs `pdraft.train.loop.block_loss` (the trainer's own loss and statistics) with AdamW as the trainer
sets it (betas 0.9/0.95, clip 1.0, linear warm-up over the recipe's warmup steps, constant after), no weight
decay, and reports the training cross-entropy and the held-out teacher-forced greedy tau (the validation split
`pdraft train` uses). CPU, 2 threads: about 0.2 s a step for the quickstart's drafter. Figures: docs/TARGET.md.
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pdraft.cache.reader import HiddenCache  # noqa: E402
from pdraft.models.build import build_from_recipe  # noqa: E402
from pdraft.recipe import load_recipe  # noqa: E402
from pdraft.targets.loader import load_target  # noqa: E402
from pdraft.train.batches import CacheSource, micro_generator, sample_anchors, split_validation  # noqa: E402
from pdraft.train.loop import LossSettings, TrainForward, block_loss, validate  # noqa: E402

PROBES = ("base", "zero_features", "trainable_vocab", "last_layer_init")
# What every probe trains: the recipe's drafter as a DFlash, on cross-entropy alone, its greedy-agreement figures.
CE_ONLY = ["drafter.kind=dflash", "train.alpha_tv=0", "train.confidence_target=greedy"]


def _frozen_pair(weight: torch.Tensor) -> tuple[torch.nn.Module, torch.nn.Module]:
    emb = torch.nn.Embedding.from_pretrained(weight.clone(), freeze=True)
    head = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    head.weight.data.copy_(weight)
    head.requires_grad_(False)
    return emb, head


def prepare(probe: str, drafter, target) -> torch.Tensor:
    """Apply `probe` to a freshly built, target-attached drafter; returns the LM-head weight the loss uses."""
    w_lm = target.model.get_output_embeddings().weight
    if probe == "trainable_vocab":
        emb = copy.deepcopy(target.model.get_input_embeddings()).requires_grad_(True)
        head = torch.nn.Linear(w_lm.shape[1], w_lm.shape[0], bias=False)
        head.weight.data.copy_(w_lm.data)
        drafter.add_module("probe_embedding", emb)  # registered, so the optimizer trains them
        drafter.add_module("probe_head", head)
        drafter._shared = (emb, head)
        return head.weight
    if probe == "last_layer_init":
        layer = target.model.model.layers[-1]
        ids, hidden = list(drafter.config.target_layer_ids), drafter.config.hidden_size
        if ids[-1] != len(target.model.model.layers) - 2:
            raise SystemExit(f"last_layer_init needs the capture to end at layer {len(target.model.model.layers) - 2} "
                             f"(the last layer's input); this cache has {ids}")
        drafter.layers[0].load_state_dict(layer.state_dict(), strict=False)
        with torch.no_grad():
            drafter.fc.weight.zero_()
            drafter.fc.weight[:, (len(ids) - 1) * hidden:] = torch.eye(hidden)
            drafter.hidden_norm.weight.copy_(layer.input_layernorm.weight)
            drafter.norm.weight.copy_(target.model.model.norm.weight)
    return w_lm


def run_probe(probe: str, recipe, target, source, steps: int, seed: int = 0) -> dict:
    tr = recipe.train
    torch.manual_seed(seed)
    drafter = build_from_recipe(recipe.drafter, target, seed=seed)
    drafter.attach_target(target.model)
    w_lm = prepare(probe, drafter, target)
    drafter.train()
    settings = LossSettings.from_recipe(tr, drafter)  # CE only: main() sets the recipe's alpha_tv to 0
    module = TrainForward(drafter)
    params = [p for p in module.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=tr.lr, betas=(0.9, 0.95), weight_decay=0.0)
    train_ids, val_ids = split_validation(len(source))
    order = [train_ids[i] for i in torch.randperm(len(train_ids), generator=torch.Generator().manual_seed(seed))]
    t0, curve = time.time(), []
    for step in range(1, steps + 1):
        for group in opt.param_groups:
            group["lr"] = tr.lr * min(1.0, step / max(1, tr.warmup_steps))
        idx = [order[(step * tr.batch_size + i) % len(order)] for i in range(tr.batch_size)]
        batch = source.batch(idx, torch.device("cpu"), torch.float32)
        if probe == "zero_features":
            batch.features.zero_()
        anchors, keep = sample_anchors(batch.loss_mask, tr.num_anchors, micro_generator(seed, step))
        loss, stats = block_loss(module, batch, anchors, keep, w_lm, settings)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step % 50 == 0 or step == steps:
            row = dict(step=step, ce=round(stats.ce, 3), seconds=round(time.time() - t0, 1))
            if step == steps:
                held_out = validate(module, drafter, source, val_ids, settings, w_lm, tr.batch_size, tr.num_anchors,
                                    seed, torch.device("cpu"), torch.float32)  # the trainer's own validation
                row["held_out_greedy_tau"] = round(held_out["greedy_tau_est"], 3)
            curve.append(row)
            print(f"{probe:>16} step {step:>5}  train CE {stats.ce:.3f}" +
                  (f"  held-out greedy tau {row['held_out_greedy_tau']:.3f}" if "held_out_greedy_tau" in row else ""),
                  flush=True)
    return dict(probe=probe, curve=curve)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipe", default="recipes/quickstart.yaml")
    ap.add_argument("--cache", required=True, help="a finished hidden-state cache for this recipe's target")
    ap.add_argument("--set", dest="overrides", action="append", default=[], help="recipe override KEY=VALUE")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--probes", nargs="+", default=list(PROBES[:3]), choices=PROBES)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    recipe = load_recipe(args.recipe, overrides=args.overrides + CE_ONLY)
    target = load_target(recipe.target)
    source = CacheSource(HiddenCache(args.cache, target=target, verify="none"))
    print(f"machine: {platform.machine()} CPU, {args.threads} threads; target {recipe.target.id}, "
          f"layers {list(target.layer_ids)}, cache {args.cache}")
    results = [run_probe(p, recipe, target, source, args.steps) for p in args.probes]
    print(json.dumps(results))


if __name__ == "__main__":
    main()
