"""How well a DFlash2 drafter's selector can do at T=1 on the quickstart's held-out training sequences, taken apart
(issue 42; docs/DRAFTERS.md quotes the output). Teacher-forced on the cache's validation split (the sequences
`pdraft train` validates on, the same anchors), at every supervised position of the first `--positions` draft
slots, from the gold predecessor as training sees it:

- mass: the target's T=1 probability on the drafter's served top-K candidates (an upper bound of any K-way q's
  acceptance at that position);
- tv: total variation between the selector's softmax over those K and the target's renormalised over them (the
  shape; `selector_tv` in training takes it over the loss candidates, the gold injected);
- accept: sum over the K of min(p, q), q the selector's T=1 softmax: the position's T=1 acceptance given a
  correct prefix. No timing.

    PYTHONPATH=. python benchmarks/selector_fit.py RECIPE --cache HIDDEN_DIR DRAFTER [DRAFTER ...]
"""

from __future__ import annotations

import argparse

import torch


@torch.no_grad()
def fit(drafter, source, val_ids, w_lm, num_anchors: int, seed: int, positions: int) -> dict:
    from pdraft.train.batches import micro_generator, sample_anchors, supervised_mask

    g = drafter.train_gamma()
    sums = torch.zeros(3, positions, dtype=torch.float64)  # mass, tv, accept per draft slot
    count = torch.zeros(positions, dtype=torch.float64)
    dtype = next(drafter.parameters()).dtype
    for i in range(0, len(val_ids), 8):  # validate()'s batches and anchors
        batch = source.batch(val_ids[i: i + 8], "cpu", dtype)
        anchors, keep = sample_anchors(batch.loss_mask.cpu(), num_anchors, micro_generator(seed + 1, i))
        sup = supervised_mask(anchors, keep, batch.loss_mask, g)  # [b, N, G]
        out = drafter.forward_train(batch.input_ids, batch.features, anchors, compute_logits=False)
        b, s = batch.input_ids.shape
        t_idx = (anchors[:, :, None] + torch.arange(g)).clamp(max=s - 1)  # [b, N, G], the TV loss's rows
        t_hidden = batch.last_hidden[torch.arange(b)[:, None, None], t_idx]  # [b, N, G, H]
        for k in range(min(positions, g)):
            m = sup[:, :, k]
            if not m.any():
                continue
            h = out.hidden[:, :, k][m].float()  # [M, d]
            cand, unary = drafter.candidates(h)  # [M, K]
            p = torch.softmax(t_hidden[:, :, k][m].float() @ w_lm.float().t(), -1)  # [M, vocab]
            p_k = p.gather(-1, cand)  # [M, K]
            q = torch.softmax(drafter.candidate_selector.pair_scores(out.prev_ids[:, :, k][m], cand, unary, h), -1)
            mass = p_k.sum(-1)
            sums[0, k] += float(mass.sum())
            sums[1, k] += float((0.5 * (q - p_k / mass[:, None]).abs().sum(-1)).sum())
            sums[2, k] += float(torch.minimum(p_k, q).sum())
            count[k] += int(m.sum())
    per = sums / count.clamp_min(1)
    total = sums.sum(1) / count.sum()
    return {"positions": int(count.sum()), "mass": float(total[0]), "tv": float(total[1]), "accept": float(total[2]),
            "accept_per_slot": [round(float(x), 3) for x in per[2]]}


def main() -> None:
    from pdraft.decode.inputs import load_attached_drafter
    from pdraft.recipe import load_recipe
    from pdraft.runtime import make_runtime
    from pdraft.targets.loader import load_target
    from pdraft.train.batches import split_validation
    from pdraft.train.loop import training_source

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("recipe")
    ap.add_argument("drafters", nargs="+")
    ap.add_argument("--cache", required=True, help="the hidden-state cache the drafters were trained on")
    ap.add_argument("--positions", type=int, default=8, help="draft slots measured (gamma)")
    args = ap.parse_args()
    r = load_recipe(args.recipe, [f"data.cache_dir={args.cache}"])
    rt = make_runtime(r.runtime)
    target = load_target(r.target, rt)
    source = training_source(r, target)
    _, val_ids = split_validation(len(source))
    w_lm = target.lm_head_weight()
    for folder in args.drafters:
        drafter = load_attached_drafter(folder, target.model)
        res = fit(drafter, source, val_ids, w_lm, r.train.num_anchors, rt.seed, args.positions)
        print(f"{folder}: {res}")


if __name__ == "__main__":
    main()
