"""The drafter losses of paper section 3.3, computed in chunks over positions so that peak memory stays
proportional to the chunk, not to (positions x vocabulary).

For every predicted position the draft logits are ``h @ W_lm^T (+ u @ W2)``, where ``h`` is the drafter's
hidden state, ``W_lm`` the target's frozen LM head, and ``u @ W2`` DSpark's sequential-head bias (the Markov
embedding ``W1[x_{k-1}]`` or the RNN output ``tanh(W_o z_k)``, both rank-r). The target's logits are
recomputed from its last hidden state with the same frozen head, so the hidden-state cache never stores a
vocabulary-sized tensor. Terms, each weighted per position by ``w_k = exp(-(k-1)/decay)``:

- CE: cross-entropy of the draft logits against the target's token;
- TV: total variation ``1/2 ||p_d - p_t||_1`` (DeepSpec's "l1" term is twice this; pdraft uses TV, so
  ``alpha_tv`` equals DeepSpec's ``l1_loss_alpha`` times 2);
- confidence: BCE of the confidence logit against the soft label ``1 - TV`` (detached);
- KL: ``KL(p_t || p_d)``, the target's distribution against the draft's (EAGLE-3's loss, as a soft
  cross-entropy less the target's entropy, which the gradient does not see).

A drafter with its own output head over a reduced vocabulary (EAGLE-3: ``head`` [V_d, hidden] and ``vocab``
[V_d], the target id of each row) gets its logits from that head, and the terms are taken in the target's
vocabulary with ``p_d = 0`` outside the drafter's: TV counts the target's mass there, CE and KL (which would be
infinite there) are taken on the target's distribution restricted to the drafter's vocabulary and renormalised, as
EAGLE-3 trains, and skip the positions whose target token it cannot draft.

When the positions span several chunks, each chunk runs under activation checkpointing: its full-vocabulary
tensors are freed after the forward and recomputed in the backward, so at most one chunk's worth exists at a
time. When they fit one chunk nothing is recomputed (the one chunk's tensors are the peak either way, and the
recomputation cost a third of a CPU training step).

Blocks from nearby anchors overlap, so many predicted positions read the same target position (the quickstart's
16 anchors x 20 slots cover each response token about three times). With `t_index` the target's hidden states
come once per target position and the target's distribution (a vocabulary-sized matmul and softmax, no
gradient) is computed once per distinct position of a chunk and shared by the positions that read it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


SLICE = 1024  # positions per loss slice when nothing is recomputed (see drafter_loss)


@dataclass
class LossOutput:
    loss: torch.Tensor  # scalar, differentiable
    ce: torch.Tensor  # weighted means (detached)
    tv: torch.Tensor
    conf: torch.Tensor
    accept: torch.Tensor  # [N] 1 - TV per position (detached): the acceptance the losses imply
    agree: torch.Tensor | None = None  # [N] 1.0 where the draft's argmax equals the target's: greedy acceptance
    kl: torch.Tensor | None = None  # weighted mean of KL(p_t || p_d) (detached); None when alpha_kl = 0


def position_weights(block_positions: torch.Tensor, decay: float) -> torch.Tensor:
    """w_k = exp(-(k-1)/decay) for 1-based block position k; `block_positions` is 0-based."""
    return torch.exp(-block_positions.float() / float(decay))


def _chunk_terms(h, u, t_rows, t_inverse, target_ids, conf_logits, w_lm, w2, greedy_label=False, head=None,
                 vocab=None, kl=False, products=torch.float32):
    """t_rows [U, hidden]: the distinct target positions of the chunk; t_inverse [chunk]: the row each position
    reads (None: t_rows is per position). head [V_d, hidden]: the drafter's own output head (None: w_lm); vocab
    [V_d]: the target id of each of its rows (None: the whole vocabulary in order); kl: also KL(p_t || p_d);
    products: the dtype of the head products (their logits are taken on in float32)."""
    w = w_lm.to(products)  # once per chunk, inside the checkpoint: the copy is not kept for the backward
    draft = (h.to(products) @ (w if head is None else head.to(products)).t()).float()  # [chunk, V_d]
    if u is not None:
        draft = draft + (u.to(products) @ w2.to(products)).float()
    with torch.no_grad():
        p_rows = torch.softmax((t_rows.to(products) @ w.t()).float(), dim=-1)  # [U, vocab]
        best_rows = p_rows.argmax(-1)  # [U]
        best_t = best_rows if t_inverse is None else best_rows[t_inverse]  # [chunk]
    if vocab is None and not kl and draft.device.type == "cpu" and rows_loop() is not None:
        # one compiled pass per row over the target's distinct rows (pdraft.kernels.cpu_loss): no p_t copy
        inverse = t_inverse if t_inverse is not None else torch.arange(draft.shape[0], device=draft.device)
        ce, tv, best = _CeTvRows.apply(draft, p_rows, inverse, target_ids)  # [chunk] each
        agree = (best == best_t).float()  # [chunk]
        accept, conf = _confidence(ce, tv, conf_logits, agree if greedy_label else None)
        return ce, tv, conf, accept, agree, torch.zeros_like(ce)
    with torch.no_grad():
        p_t = p_rows if t_inverse is None else p_rows[t_inverse]  # [chunk, vocab]
    if vocab is None and not kl:  # the written-out gradient (also through a drafter's own full-vocabulary head)
        ce, tv = _CeTv.apply(draft, p_t, target_ids)  # [chunk] each
        agree = (draft.detach().argmax(-1) == best_t).float()  # [chunk]
        accept, conf = _confidence(ce, tv, conf_logits, agree if greedy_label else None)
        return ce, tv, conf, accept, agree, torch.zeros_like(ce)
    with torch.no_grad():
        p_in, outside, idx, inside = p_t, None, target_ids, None  # the target's mass where the drafter drafts
        if vocab is not None:
            p_in = p_t[:, vocab]  # [chunk, V_d]
            outside = (1.0 - p_in.sum(-1)).clamp_min(0.0)  # [chunk]
            rows = torch.full((p_t.shape[-1],), -1, dtype=torch.long, device=vocab.device)
            rows[vocab] = torch.arange(vocab.shape[0], device=vocab.device)
            idx = rows[target_ids]
            inside = (idx >= 0).float()
            idx = idx.clamp_min(0)
    logp_d = torch.log_softmax(draft, dim=-1)
    ce = -logp_d.gather(-1, idx[:, None]).squeeze(-1)  # [chunk]
    tv = 0.5 * (logp_d.exp() - p_in).abs().sum(-1)  # [chunk]
    kl_terms = None
    if kl:
        p_r = p_in / p_in.sum(-1, keepdim=True).clamp_min(1e-30)  # restricted and renormalised (no-op in full)
        kl_terms = (torch.xlogy(p_r, p_r) - p_r * logp_d).sum(-1)  # [chunk]
    if vocab is not None:
        tv = tv + 0.5 * outside
        ce = ce * inside
        kl_terms = None if kl_terms is None else kl_terms * inside
    best = draft.detach().argmax(-1)
    agree = ((best if vocab is None else vocab[best]) == best_t).float()  # [chunk]
    # Paper eq. 8 labels confidence with the sampling acceptance 1 - TV; for greedy serving the acceptance
    # of a position is whether the two argmaxes agree, which 1 - TV of the softened distributions is not.
    accept, conf = _confidence(ce, tv, conf_logits, agree if greedy_label else None)
    return ce, tv, conf, accept, agree, (torch.zeros_like(ce) if kl_terms is None else kl_terms)


class _CeTv(torch.autograd.Function):
    """CE and TV of draft logits against the target's distribution, with the gradient written out: autograd's
    chain through log_softmax, exp, sub, abs and gather walks the [chunk, vocab] tensors about ten times in the
    backward, this one four (d ce / d z = p_d - onehot(t); d tv / d z = 1/2 p_d (s - <p_d, s>) with
    s = sign(p_d - p_t)), and keeps p_d only. Tested against autograd (tests/test_train_losses.py)."""

    @staticmethod
    def forward(ctx, logits, p_t, target_ids):  # [chunk, vocab], [chunk, vocab] (no gradient), [chunk]
        logp = torch.log_softmax(logits, dim=-1)
        ce = -logp.gather(-1, target_ids[:, None]).squeeze(-1)  # [chunk]
        p_d = logp.exp_()  # [chunk, vocab], in place: log p_d is not needed again
        tv = 0.5 * (p_d - p_t).abs_().sum(-1)  # [chunk]
        ctx.save_for_backward(p_d, p_t, target_ids)
        return ce, tv

    @staticmethod
    def backward(ctx, g_ce, g_tv):
        p_d, p_t, target_ids = ctx.saved_tensors
        s = torch.sign(p_d - p_t)  # [chunk, vocab]
        m = (p_d * s).sum(-1, keepdim=True)  # [chunk, 1]
        g = s.sub_(m).mul_(0.5 * g_tv[:, None]).add_(g_ce[:, None]).mul_(p_d)
        g.scatter_add_(-1, target_ids[:, None], -g_ce[:, None])
        return g, None, None


def rows_loop():
    """The compiled loss rows (pdraft.kernels.cpu_loss), or None where the torch path runs."""
    from pdraft.kernels import cpu_loss

    return cpu_loss.kernels()


class _CeTvRows(torch.autograd.Function):
    """`_CeTv` through the compiled rows on a CPU: the target's distribution read from its distinct rows
    (`inverse`), the draft's argmax computed on the way (returned, without gradient)."""

    @staticmethod
    def forward(ctx, logits, p_rows, inverse, target_ids):  # [chunk, V], [U, V], [chunk], [chunk]
        p_rows, inverse, target_ids = p_rows.contiguous(), inverse.contiguous(), target_ids.contiguous()
        p_d, ce, tv, m, best = rows_loop().forward(logits.detach().float().contiguous(), p_rows, inverse, target_ids)
        ctx.save_for_backward(p_d, p_rows, inverse, target_ids, m)
        ctx.mark_non_differentiable(best)
        ctx.dtype = logits.dtype
        return ce, tv, best

    @staticmethod
    def backward(ctx, g_ce, g_tv, _):
        p_d, p_rows, inverse, target_ids, m = ctx.saved_tensors
        g_ce = torch.zeros_like(m) if g_ce is None else g_ce
        g_tv = torch.zeros_like(m) if g_tv is None else g_tv
        g = rows_loop().backward(p_d, p_rows, inverse, target_ids, m, g_ce, g_tv)  # in p_d's storage: runs once
        return g.to(ctx.dtype), None, None, None


def _confidence(ce, tv, conf_logits, label=None):
    """(accept, conf): accept = 1 - TV clamped to [0, 1] (detached); conf = BCE of the confidence logits against
    `label` (default: accept), or zeros when there are no confidence logits."""
    accept = (1.0 - tv.detach()).clamp(0.0, 1.0)
    if conf_logits is None:
        return accept, torch.zeros_like(ce)
    label = accept if label is None else label
    return accept, F.binary_cross_entropy_with_logits(conf_logits.float(), label, reduction="none")


def drafter_loss(
    h: torch.Tensor,  # [N, hidden] drafter hidden states at predicted positions
    w_lm: torch.Tensor,  # [vocab, hidden] frozen LM head
    # [N, hidden] target last hidden state (post-norm) at the same positions, or with `t_index` [T, hidden]
    # the target positions they read
    t_hidden: torch.Tensor,
    target_ids: torch.Tensor,  # [N] target tokens
    weights: torch.Tensor,  # [N] position weights (0 for padding)
    *,
    t_index: torch.Tensor | None = None,  # [N] long: the row of t_hidden position i reads; None = row i
    u: torch.Tensor | None = None,  # [N, r] sequential-head features
    w2: torch.Tensor | None = None,  # [r, vocab]
    conf_logits: torch.Tensor | None = None,  # [N]
    alpha_ce: float = 1.0,
    alpha_tv: float = 0.0,
    alpha_conf: float = 0.0,
    chunk_size: int = 4096,
    fused: bool = False,  # CE + TV in one Triton forward/backward (pdraft.kernels.loss) where Triton can run
    confidence_label: str = "tv",  # "tv": 1 - TV (sampling, paper eq. 8); "greedy": argmax agreement
    head: torch.Tensor | None = None,  # [V_d, hidden] the drafter's own output head (None: w_lm)
    vocab: torch.Tensor | None = None,  # [V_d] long: the target id of each head row (None: the vocabulary in order)
    alpha_kl: float = 0.0,
    # The dtype of the head products (the drafter's logits, the target's distribution and their gradient); the
    # softmax, the terms and their sums stay float32. bfloat16 under a bf16 CPU runtime, as autocast runs the
    # drafter's own products: 3x faster than float32 for the [positions, vocab] logits on such a CPU, and the
    # rounding of the bf16 target's own LM head at decode time.
    products: torch.dtype = torch.float32,
) -> LossOutput:
    from pdraft.kernels.dispatch import use_triton

    if confidence_label not in ("tv", "greedy"):
        raise ValueError(f"confidence_label must be 'tv' or 'greedy', got {confidence_label!r}")
    greedy_label = confidence_label == "greedy"
    plain = head is None and vocab is None and not alpha_kl  # what the fused kernel computes
    if fused and use_triton(h.device) and not greedy_label and plain:  # no argmax in the kernel: greedy uses chunks
        per_position = t_hidden if t_index is None else t_hidden[t_index]
        return _fused_loss(h, w_lm, per_position, target_ids, weights, u, w2, conf_logits, alpha_ce, alpha_tv,
                           alpha_conf)
    n = h.shape[0]
    recompute = n > chunk_size  # one chunk holds its tensors for the backward at the same peak: no recompute
    # Without recomputation the positions still go in slices of at most SLICE: the same peak, but every
    # [slice, vocab] tensor stays under glibc's 32 MB mmap threshold, so the allocator reuses its heap instead
    # of mapping and zero-filling fresh pages every step (a 2,560-position tensor cost ~10% of a CPU step in
    # page faults).
    piece = chunk_size if recompute else min(chunk_size, SLICE)
    buckets: tuple[list, ...] = ([], [], [], [], [], [])  # ce, tv, conf, accept, agree, kl
    for start in range(0, n, piece):
        sl = slice(start, start + piece)
        if t_index is None:
            t_rows, t_inverse = t_hidden[sl], None
        else:
            rows, t_inverse = torch.unique(t_index[sl], return_inverse=True)  # [U], [chunk]
            t_rows = t_hidden[rows]
        args = (h[sl], None if u is None else u[sl], t_rows, t_inverse, target_ids[sl],
                None if conf_logits is None else conf_logits[sl], w_lm, w2, greedy_label, head, vocab, alpha_kl > 0,
                products)
        if recompute and torch.is_grad_enabled() and (h.requires_grad or (u is not None and u.requires_grad)):
            terms = checkpoint(_chunk_terms, *args, use_reentrant=False)
        else:
            terms = _chunk_terms(*args)
        for bucket, term in zip(buckets, terms):
            bucket.append(term)
    ce, tv, conf, accept, agree, kl = (torch.cat(b) for b in buckets)
    out = _combine(ce, tv, conf, accept, weights, conf_logits, alpha_ce, alpha_tv, alpha_conf)
    out.agree = agree
    if alpha_kl:
        kl_m = (kl * weights).sum() / weights.sum().clamp_min(1e-6)
        out.loss = out.loss + alpha_kl * kl_m
        out.kl = kl_m.detach()
    return out


def _fused_loss(h, w_lm, t_hidden, target_ids, weights, u, w2, conf_logits, alpha_ce, alpha_tv, alpha_conf):
    from pdraft.kernels.loss import ce_tv

    ce, tv = ce_tv(h, w_lm, t_hidden, target_ids, u, w2)  # [N] each, never [N, vocab]
    accept, conf = _confidence(ce, tv, conf_logits)
    return _combine(ce, tv, conf, accept, weights, conf_logits, alpha_ce, alpha_tv, alpha_conf)


def _combine(ce, tv, conf, accept, weights, conf_logits, alpha_ce, alpha_tv, alpha_conf) -> LossOutput:
    wsum = weights.sum().clamp_min(1e-6)
    ce_m, tv_m, conf_m = ((x * weights).sum() / wsum for x in (ce, tv, conf))
    loss = alpha_ce * ce_m + alpha_tv * tv_m + (alpha_conf * conf_m if conf_logits is not None else 0.0)
    return LossOutput(loss=loss, ce=ce_m.detach(), tv=tv_m.detach(), conf=conf_m.detach(), accept=accept)
