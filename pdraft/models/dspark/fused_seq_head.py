"""DSpark's sequential head over a whole block: the plain torch reference, the launcher of the fused Triton
kernel (pdraft/kernels/seq_head_triton.py; it lives here, beside the drafter, because it reads the drafter's heads
and builds its Proposal, and pdraft.kernels stays below pdraft.models), and `fused_sample_block`, which DSparkDrafter.sample_block calls when
its `use_fused_kernel` switch is on. Position k's logits are U_k + W1[x_{k-1}] W2 (x_0 = the anchor); they are
shaped by temperature, top-k and top-p exactly as pdraft.models.sampling.probs_from_logits does, and the token
is drawn by inverse-CDF sampling from a given uniform number u_k: the first index whose cumulative
probability exceeds u_k (clamped to the last index with non-zero probability, which absorbs the float
rounding of a total just under 1). Passing the uniforms in, instead of drawing inside, is what lets the
kernel and the reference draw the same tokens; the distribution drawn from is unchanged, so `probs` stays the
exact distribution of each token. The confidence logit is c_k = conf_base_k + <conf_w1, W1[x_{k-1}]>, where
conf_base_k = w_h . h_k + b is computed outside (it does not depend on the sampled tokens).

Only the plain Markov head (and no head) is fused: the gated and RNN heads keep the eager loop."""

from __future__ import annotations

import torch

from pdraft.errors import PdraftError
from pdraft.kernels.dispatch import jit, launching, next_pow2, use_triton
from pdraft.models.api import Proposal
from pdraft.models.dspark.heads import MarkovHead
from pdraft.models.sampling import inverse_cdf, is_greedy, probs_from_logits, top_probability


def sequential_head_reference(base, anchor_ids, uniforms, sampling, *, w1=None, w2=None, conf_base=None,
                              conf_w1=None) -> Proposal:
    """The plain torch loop. base [batch, gamma, vocab] base logits U_k; anchor_ids [batch]; uniforms [batch,
    gamma] (ignored when greedy); w1 [vocab, r] and w2 [r, vocab] (None: no sequential head); conf_base
    [batch, gamma] (None: no confidence head); conf_w1 [r] or None. Returns tokens [batch, gamma], probs
    [batch, gamma, vocab] float32 (None when greedy) and confidence logits [batch, gamma] (or None)."""
    b, gamma, _ = base.shape
    greedy = is_greedy(sampling)
    prev = anchor_ids.reshape(b).long()
    tokens, probs, conf, top = [], [], [], []
    for k in range(gamma):
        logits = base[:, k].float()  # [batch, vocab]
        emb = None
        if w1 is not None:
            emb = w1[prev].float()  # [batch, r]
            logits = logits + emb @ w2.float()
        if conf_base is not None:
            c = conf_base[:, k].float()
            if conf_w1 is not None:
                c = c + emb @ conf_w1.float()
            conf.append(c)
        if greedy:
            tok, p = logits.argmax(-1), None
        else:
            p = probs_from_logits(logits, sampling)
            tok = inverse_cdf(p, uniforms[:, k].float())
            probs.append(p)
        top.append(top_probability(logits, p))
        tokens.append(tok)
        prev = tok
    return Proposal(tokens=torch.stack(tokens, 1), probs=torch.stack(probs, 1) if probs else None,
                    confidence=torch.stack(conf, 1) if conf else None, top_prob=torch.stack(top, 1))


def sequential_head(base, anchor_ids, uniforms, sampling, *, w1=None, w2=None, conf_base=None,
                    conf_w1=None) -> Proposal:
    """Same contract as `sequential_head_reference`; runs the fused kernel where `use_triton` allows."""
    if not use_triton(base.device):
        return sequential_head_reference(base, anchor_ids, uniforms, sampling, w1=w1, w2=w2, conf_base=conf_base,
                                         conf_w1=conf_w1)
    return _launch(base, anchor_ids, uniforms, sampling, w1, w2, conf_base, conf_w1)


def _launch(base, anchor_ids, uniforms, sampling, w1, w2, conf_base, conf_w1) -> Proposal:
    from pdraft.kernels.seq_head_triton import seq_head_kernel

    b, gamma, vocab = base.shape
    dev = base.device
    if (w1 is None) != (w2 is None):
        raise PdraftError("sequential_head: give both w1 and w2, or neither")
    greedy = is_greedy(sampling)
    base = base.float().contiguous()  # [batch, gamma, vocab]
    rank = 1 if w1 is None else int(w1.shape[1])
    if w1 is not None and (tuple(w1.shape) != (vocab, rank) or tuple(w2.shape) != (rank, vocab)):
        raise PdraftError(f"sequential_head: w1 {tuple(w1.shape)} / w2 {tuple(w2.shape)} do not match vocab {vocab}")
    dummy = torch.zeros(1, device=dev)
    w1_ = dummy if w1 is None else w1.contiguous()
    w2_ = dummy if w2 is None else w2  # any strides: a Linear's weight transposed is used as is
    anchors = anchor_ids.reshape(b).to(dev).long().contiguous()
    u = dummy if greedy else uniforms.to(dev).float().contiguous()  # [batch, gamma]
    cb = dummy if conf_base is None else conf_base.to(dev).float().contiguous()
    cw = dummy if conf_w1 is None else conf_w1.to(dev).contiguous()
    tokens = torch.empty(b, gamma, dtype=torch.long, device=dev)
    probs = dummy if greedy else torch.empty(b, gamma, vocab, dtype=torch.float32, device=dev)
    conf = dummy if conf_base is None else torch.empty(b, gamma, dtype=torch.float32, device=dev)
    top_k = int(sampling.top_k) if not greedy else 0
    top_p = float(sampling.top_p) if not greedy else 1.0
    kernel = jit(seq_head_kernel)
    with launching():
        kernel[(b,)](
            base, w1_, w2_, anchors, u, cb, cw, tokens, probs, conf,
            gamma, vocab, rank,
            w2_.stride(0) if w2 is not None else 0, w2_.stride(1) if w2 is not None else 0,
            float(sampling.temperature) if not greedy else 1.0, top_k, top_p,
            GREEDY=greedy, TOP_K=0 < top_k < vocab, TOP_P=top_p < 1.0,
            HEAD=w1 is not None, CONF=conf_base is not None, CONF_EMB=conf_w1 is not None,
            BLOCK_V=min(next_pow2(vocab), 512), BLOCK_R=min(next_pow2(rank), 16),
        )
    # The kernel keeps no logits, so a greedy block has no top probability (the estimator then goes without it).
    return Proposal(tokens=tokens, probs=None if greedy else probs,
                    confidence=None if conf_base is None else conf, top_prob=None if greedy else probs.amax(-1))


# ---- the DSpark drafter hook -------------------------------------------------------------------------------
def fusable(drafter) -> bool:
    """Whether `drafter`'s heads are ones the kernel implements (plain Markov head or none)."""
    head = drafter.markov_head  # the kernel reads the target's head over the whole vocabulary
    return (head is None or type(head) is MarkovHead) and not drafter.config.reduced_vocab


def drafter_inputs(drafter, hidden: torch.Tensor) -> dict:
    """The kernel's weight arguments read from a DSparkDrafter, for hidden [batch, gamma, d]."""
    head, conf_head = drafter.markov_head, drafter.confidence_head
    out = {"w1": None, "w2": None, "conf_base": None, "conf_w1": None}
    if head is not None:
        out["w1"] = head.markov_w1.weight  # [vocab, r]
        out["w2"] = head.markov_w2.weight.t()  # [r, vocab], a strided view: no copy
    if conf_head is not None:
        weight, bias = conf_head.proj.weight[0], conf_head.proj.bias  # [d (+ r)], [1]
        d = hidden.shape[-1]
        out["conf_base"] = (torch.nn.functional.linear(hidden, weight[None, :d].to(hidden.dtype),
                                                       bias.to(hidden.dtype))[..., 0]).float()  # [batch, gamma]
        if drafter.config.confidence_with_markov:
            out["conf_w1"] = weight[d:]
    return out


def fused_sample_block(drafter, hidden, anchor_ids, sampling, uniforms) -> Proposal:
    """DSparkDrafter.sample_block through `sequential_head`, drawing from the same `uniforms` [batch, gamma]
    as the eager loop (None when greedy), so both give the same tokens."""
    base = drafter.lm_head(hidden)  # [batch, gamma, vocab]
    if uniforms is not None:
        uniforms = uniforms.to(base.device)
    return sequential_head(base, anchor_ids, uniforms, sampling, **drafter_inputs(drafter, hidden))
