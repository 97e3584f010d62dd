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
- confidence: BCE of the confidence logit against the soft label ``1 - TV`` (detached).

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


def position_weights(block_positions: torch.Tensor, decay: float) -> torch.Tensor:
    """w_k = exp(-(k-1)/decay) for 1-based block position k; `block_positions` is 0-based."""
    return torch.exp(-block_positions.float() / float(decay))


def _chunk_terms(h, u, t_rows, t_inverse, target_ids, conf_logits, w_lm, w2, greedy_label=False):
    """t_rows [U, hidden]: the distinct target positions of the chunk; t_inverse [chunk]: the row each position
    reads (None: t_rows is per position)."""
    w = w_lm.float()  # once per chunk, inside the checkpoint: the copy is not kept for the backward
    draft = h.float() @ w.t()  # [chunk, vocab]
    if u is not None:
        draft = draft + u.float() @ w2.float()
    with torch.no_grad():
        p_rows = torch.softmax(t_rows.float() @ w.t(), dim=-1)  # [U, vocab]
        best_rows = p_rows.argmax(-1)  # [U]
        p_t = p_rows if t_inverse is None else p_rows[t_inverse]  # [chunk, vocab]
        best_t = best_rows if t_inverse is None else best_rows[t_inverse]  # [chunk]
    ce, tv = _CeTv.apply(draft, p_t, target_ids)  # [chunk] each
    agree = (draft.detach().argmax(-1) == best_t).float()  # [chunk]
    # Paper eq. 8 labels confidence with the sampling acceptance 1 - TV; for greedy serving the acceptance
    # of a position is whether the two argmaxes agree, which 1 - TV of the softened distributions is not.
    accept, conf = _confidence(ce, tv, conf_logits, agree if greedy_label else None)
    return ce, tv, conf, accept, agree


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
) -> LossOutput:
    from pdraft.kernels.dispatch import use_triton

    if confidence_label not in ("tv", "greedy"):
        raise ValueError(f"confidence_label must be 'tv' or 'greedy', got {confidence_label!r}")
    greedy_label = confidence_label == "greedy"
    if fused and use_triton(h.device) and not greedy_label:  # the fused kernel has no argmax: greedy uses chunks
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
    ce_all, tv_all, conf_all, acc_all, agree_all = [], [], [], [], []
    for start in range(0, n, piece):
        sl = slice(start, start + piece)
        if t_index is None:
            t_rows, t_inverse = t_hidden[sl], None
        else:
            rows, t_inverse = torch.unique(t_index[sl], return_inverse=True)  # [U], [chunk]
            t_rows = t_hidden[rows]
        args = (h[sl], None if u is None else u[sl], t_rows, t_inverse, target_ids[sl],
                None if conf_logits is None else conf_logits[sl], w_lm, w2, greedy_label)
        if recompute and torch.is_grad_enabled() and (h.requires_grad or (u is not None and u.requires_grad)):
            terms = checkpoint(_chunk_terms, *args, use_reentrant=False)
        else:
            terms = _chunk_terms(*args)
        for bucket, term in zip((ce_all, tv_all, conf_all, acc_all, agree_all), terms):
            bucket.append(term)
    ce, tv, conf, accept, agree = (torch.cat(b) for b in (ce_all, tv_all, conf_all, acc_all, agree_all))
    out = _combine(ce, tv, conf, accept, weights, conf_logits, alpha_ce, alpha_tv, alpha_conf)
    out.agree = agree
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
