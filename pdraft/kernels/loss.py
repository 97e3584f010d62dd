"""The CE and TV terms of the drafter loss (paper 3.3) as one fused Triton forward and backward over the
vocabulary, never holding an [N, vocab] tensor (kernels: pdraft/kernels/loss_triton.py). `ce_tv` returns the
per-position terms as a differentiable pair; pdraft.train.losses.drafter_loss(..., fused=True) weights them and
adds the confidence BCE exactly as its chunked torch path does, which is the reference these kernels are tested
against. Gradients flow to the drafter hidden states h, the sequential-head features u and W2; the LM head and
the target's hidden states are frozen, as in training."""

from __future__ import annotations

import torch

from pdraft.errors import PdraftError
from pdraft.kernels.dispatch import jit, launching, next_pow2

BLOCK_N = 16  # rows per program; tl.dot needs every dimension >= 16


def _blocks(d: int, v: int, r: int) -> dict:
    return dict(BLOCK_N=BLOCK_N, BLOCK_V=max(16, min(next_pow2(v), 64)), BLOCK_D=max(16, min(next_pow2(d), 64)),
                BLOCK_R=max(16, min(next_pow2(r), 32)))


class _CeTv(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, u, w2, w_lm, t_hidden, target_ids):
        import triton

        from pdraft.kernels.loss_triton import ce_tv_fwd_kernel

        n, d = h.shape
        v = w_lm.shape[0]
        r = 1 if u is None else u.shape[1]
        dev = h.device
        h_, th = h.detach().contiguous(), t_hidden.detach().contiguous()
        u_ = torch.zeros(1, device=dev) if u is None else u.detach().contiguous()
        w2_ = torch.zeros(1, 1, device=dev) if w2 is None else w2.detach()
        wl = w_lm.detach()
        ids = target_ids.contiguous()
        lse_d, lse_t, ce, tv, big_s = (torch.empty(n, dtype=torch.float32, device=dev) for _ in range(5))
        grid = (triton.cdiv(n, BLOCK_N),)
        with launching():
            jit(ce_tv_fwd_kernel)[grid](h_, th, u_, ids, wl, w2_, lse_d, lse_t, ce, tv, big_s,
                                        n, d, v, r, wl.stride(0), wl.stride(1), w2_.stride(0), w2_.stride(1),
                                        HAS_U=u is not None, **_blocks(d, v, r))
        ctx.save_for_backward(h_, th, u_, ids, wl, w2_, lse_d, lse_t, big_s)
        ctx.has_u = u is not None
        return ce, tv

    @staticmethod
    def backward(ctx, g_ce, g_tv):
        import triton

        from pdraft.kernels.loss_triton import ce_tv_bwd_kernel

        h, th, u, ids, wl, w2, lse_d, lse_t, big_s = ctx.saved_tensors
        n, d = h.shape
        v = wl.shape[0]
        r = u.shape[1] if ctx.has_u else 1
        dev = h.device
        dh = torch.zeros(n, d, dtype=torch.float32, device=dev)
        du = torch.zeros(n, r, dtype=torch.float32, device=dev)
        dw2 = torch.zeros(r, v, dtype=torch.float32, device=dev)
        with launching():
            jit(ce_tv_bwd_kernel)[(triton.cdiv(n, BLOCK_N),)](
                h, th, u, ids, wl, w2, lse_d, lse_t, big_s, g_ce.float().contiguous(), g_tv.float().contiguous(),
                dh, du, dw2,
                n, d, v, r, wl.stride(0), wl.stride(1), w2.stride(0), w2.stride(1),
                HAS_U=ctx.has_u, **_blocks(d, v, r))
        if not ctx.has_u:
            return dh.to(h.dtype), None, None, None, None, None
        return dh.to(h.dtype), du.to(u.dtype), dw2.to(w2.dtype), None, None, None


def ce_tv(h, w_lm, t_hidden, target_ids, u=None, w2=None) -> tuple[torch.Tensor, torch.Tensor]:
    """h [N, hidden], w_lm [vocab, hidden], t_hidden [N, hidden], target_ids [N], u [N, r] and w2 [r, vocab]
    (or None) -> (ce [N], tv [N]) float32, differentiable in h, u and w2. Triton only: callers decide with
    pdraft.kernels.dispatch.use_triton and otherwise use the chunked torch path."""
    if (u is None) != (w2 is None):
        raise PdraftError("ce_tv: give both u and w2, or neither")
    n, d = h.shape
    if tuple(w_lm.shape[1:]) != (d,) or tuple(t_hidden.shape) != (n, d) or tuple(target_ids.shape) != (n,):
        raise PdraftError(f"ce_tv: shapes h {tuple(h.shape)}, w_lm {tuple(w_lm.shape)}, t_hidden "
                          f"{tuple(t_hidden.shape)}, target_ids {tuple(target_ids.shape)} do not agree")
    if u is not None and (u.shape[0] != n or tuple(w2.shape) != (u.shape[1], w_lm.shape[0])):
        raise PdraftError(f"ce_tv: u {tuple(u.shape)} / w2 {tuple(w2.shape)} do not match N {n}, vocab "
                          f"{w_lm.shape[0]}")
    return _CeTv.apply(h, u, w2, w_lm, t_hidden, target_ids)
