"""Triton kernels of the drafter's CE + TV terms over the vocabulary (contract and torch reference:
pdraft/kernels/loss.py and pdraft.train.losses.drafter_loss). Each program owns BLOCK_N rows and streams the
vocabulary in BLOCK_V tiles, computing the logit tiles on the fly as tl.dot products of the rows' hidden states
with tiles of the LM head (and of the Markov features with W2), so no [N, vocab] tensor ever exists; one device
function, `logit_tiles`, computes a tile for every sweep of both kernels.

Forward, two sweeps: (1) online log-sum-exp of draft and target logits and the draft logit of the target token;
(2) with the normalisers known, sum |p_d - p_t| and S = sum sign(p_d - p_t) p_d (saved for the backward).
Backward, one sweep recomputing the tiles: dz = g_ce (p_d - onehot(y)) + g_tv / 2 * p_d (sign(p_d - p_t) - S),
then dh += dz W_lm, du += dz W2^T (rows owned by the program: plain read-add-write) and dW2 += u^T dz (shared by
all programs: atomic adds). Products run in float32 with IEEE precision, as the torch reference does."""

import triton.language as tl

from pdraft.kernels.dispatch import device_function


@device_function
def program_rows(N, BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr):
    """The rows this program owns (and which of them exist), and the offsets of a vocabulary tile: int64, as
    vocab x hidden offsets can pass 2**31."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    return rows, rows < N, tl.arange(0, BLOCK_V).to(tl.int64)


@device_function
def logit_tiles(h_ptr, th_ptr, u_ptr, wlm_ptr, w2_ptr, rows, rmask, cols, vmask, D, R, s_wv, s_wd, s_w2r, s_w2v,
                HAS_U: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr,
                BLOCK_R: tl.constexpr):
    """The draft and target logits of one tile, the vocabulary columns `cols` of the rows `rows`: z = h W_lm^T
    (+ u W2 with the Markov features) and t = t_h W_lm^T, each [BLOCK_N, BLOCK_V]; every sweep of both kernels
    recomputes them this way. Masked rows and columns hold 0."""
    offs_d = tl.arange(0, BLOCK_D)
    offs_r = tl.arange(0, BLOCK_R)
    z = tl.zeros([BLOCK_N, BLOCK_V], dtype=tl.float32)
    t = tl.zeros([BLOCK_N, BLOCK_V], dtype=tl.float32)
    for d0 in range(0, D, BLOCK_D):
        dd = d0 + offs_d
        dmask = dd < D
        w = tl.load(wlm_ptr + cols[None, :] * s_wv + dd[:, None] * s_wd, mask=dmask[:, None] & vmask[None, :],
                    other=0.0).to(tl.float32)  # [BLOCK_D, BLOCK_V]
        hm = rmask[:, None] & dmask[None, :]
        hb = tl.load(h_ptr + rows[:, None] * D + dd[None, :], mask=hm, other=0.0).to(tl.float32)
        tb = tl.load(th_ptr + rows[:, None] * D + dd[None, :], mask=hm, other=0.0).to(tl.float32)
        z += tl.dot(hb, w, input_precision="ieee")
        t += tl.dot(tb, w, input_precision="ieee")
    if HAS_U:
        for r0 in range(0, R, BLOCK_R):
            rr = r0 + offs_r
            rm = rr < R
            ub = tl.load(u_ptr + rows[:, None] * R + rr[None, :], mask=rmask[:, None] & rm[None, :],
                         other=0.0).to(tl.float32)
            w2 = tl.load(w2_ptr + rr[:, None] * s_w2r + cols[None, :] * s_w2v, mask=rm[:, None] & vmask[None, :],
                         other=0.0).to(tl.float32)
            z += tl.dot(ub, w2, input_precision="ieee")
    return z, t


def ce_tv_fwd_kernel(
    h_ptr, th_ptr, u_ptr, ids_ptr, wlm_ptr, w2_ptr,
    lse_d_ptr, lse_t_ptr, ce_ptr, tv_ptr, s_ptr,
    N, D, V, R, s_wv, s_wd, s_w2r, s_w2v,
    HAS_U: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    rows, rmask, offs_v = program_rows(N, BLOCK_N, BLOCK_V)
    y = tl.load(ids_ptr + rows, mask=rmask, other=0).to(tl.int64)
    m_d = tl.full([BLOCK_N], float("-inf"), tl.float32)
    m_t = tl.full([BLOCK_N], float("-inf"), tl.float32)
    s_d = tl.zeros([BLOCK_N], dtype=tl.float32)
    s_t = tl.zeros([BLOCK_N], dtype=tl.float32)
    z_y = tl.zeros([BLOCK_N], dtype=tl.float32)
    for v0 in range(0, V, BLOCK_V):  # sweep 1: normalisers
        cols = v0 + offs_v
        vmask = cols < V
        z, t = logit_tiles(h_ptr, th_ptr, u_ptr, wlm_ptr, w2_ptr, rows, rmask, cols, vmask, D, R,
                           s_wv, s_wd, s_w2r, s_w2v, HAS_U, BLOCK_N, BLOCK_V, BLOCK_D, BLOCK_R)
        z = tl.where(vmask[None, :], z, float("-inf"))
        t = tl.where(vmask[None, :], t, float("-inf"))
        z_y += tl.sum(tl.where(cols[None, :] == y[:, None], z, 0.0), axis=1)
        new_d = tl.maximum(m_d, tl.max(z, axis=1))
        new_t = tl.maximum(m_t, tl.max(t, axis=1))
        s_d = s_d * tl.exp(m_d - new_d) + tl.sum(tl.exp(z - new_d[:, None]), axis=1)
        s_t = s_t * tl.exp(m_t - new_t) + tl.sum(tl.exp(t - new_t[:, None]), axis=1)
        m_d = new_d
        m_t = new_t
    lse_d = m_d + tl.log(s_d)
    lse_t = m_t + tl.log(s_t)
    abs_sum = tl.zeros([BLOCK_N], dtype=tl.float32)
    sgn_sum = tl.zeros([BLOCK_N], dtype=tl.float32)
    for v0 in range(0, V, BLOCK_V):  # sweep 2: |p_d - p_t| and S
        cols = v0 + offs_v
        vmask = cols < V
        z, t = logit_tiles(h_ptr, th_ptr, u_ptr, wlm_ptr, w2_ptr, rows, rmask, cols, vmask, D, R,
                           s_wv, s_wd, s_w2r, s_w2v, HAS_U, BLOCK_N, BLOCK_V, BLOCK_D, BLOCK_R)
        p_d = tl.where(vmask[None, :], tl.exp(z - lse_d[:, None]), 0.0)
        p_t = tl.where(vmask[None, :], tl.exp(t - lse_t[:, None]), 0.0)
        diff = p_d - p_t
        sgn = tl.where(diff > 0, 1.0, tl.where(diff < 0, -1.0, 0.0))
        abs_sum += tl.sum(tl.abs(diff), axis=1)
        sgn_sum += tl.sum(sgn * p_d, axis=1)
    tl.store(lse_d_ptr + rows, lse_d, mask=rmask)
    tl.store(lse_t_ptr + rows, lse_t, mask=rmask)
    tl.store(ce_ptr + rows, lse_d - z_y, mask=rmask)
    tl.store(tv_ptr + rows, 0.5 * abs_sum, mask=rmask)
    tl.store(s_ptr + rows, sgn_sum, mask=rmask)


def ce_tv_bwd_kernel(
    h_ptr, th_ptr, u_ptr, ids_ptr, wlm_ptr, w2_ptr,
    lse_d_ptr, lse_t_ptr, s_ptr, g_ce_ptr, g_tv_ptr,
    dh_ptr, du_ptr, dw2_ptr,
    N, D, V, R, s_wv, s_wd, s_w2r, s_w2v,
    HAS_U: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    rows, rmask, offs_v = program_rows(N, BLOCK_N, BLOCK_V)
    offs_d = tl.arange(0, BLOCK_D)
    offs_r = tl.arange(0, BLOCK_R)
    y = tl.load(ids_ptr + rows, mask=rmask, other=0).to(tl.int64)
    lse_d = tl.load(lse_d_ptr + rows, mask=rmask, other=0.0)
    lse_t = tl.load(lse_t_ptr + rows, mask=rmask, other=0.0)
    big_s = tl.load(s_ptr + rows, mask=rmask, other=0.0)
    g_ce = tl.load(g_ce_ptr + rows, mask=rmask, other=0.0)
    g_tv = tl.load(g_tv_ptr + rows, mask=rmask, other=0.0)
    for v0 in range(0, V, BLOCK_V):
        cols = v0 + offs_v
        vmask = cols < V
        z, t = logit_tiles(h_ptr, th_ptr, u_ptr, wlm_ptr, w2_ptr, rows, rmask, cols, vmask, D, R,
                           s_wv, s_wd, s_w2r, s_w2v, HAS_U, BLOCK_N, BLOCK_V, BLOCK_D, BLOCK_R)
        ok = rmask[:, None] & vmask[None, :]
        p_d = tl.where(ok, tl.exp(z - lse_d[:, None]), 0.0)
        p_t = tl.where(ok, tl.exp(t - lse_t[:, None]), 0.0)
        diff = p_d - p_t
        sgn = tl.where(diff > 0, 1.0, tl.where(diff < 0, -1.0, 0.0))
        onehot = tl.where(cols[None, :] == y[:, None], 1.0, 0.0)
        dz = g_ce[:, None] * (p_d - onehot) + (0.5 * g_tv)[:, None] * p_d * (sgn - big_s[:, None])
        dz = tl.where(ok, dz, 0.0)  # [BLOCK_N, BLOCK_V]
        for d0 in range(0, D, BLOCK_D):
            dd = d0 + offs_d
            dmask = dd < D
            w_t = tl.load(wlm_ptr + cols[:, None] * s_wv + dd[None, :] * s_wd, mask=vmask[:, None] & dmask[None, :],
                          other=0.0).to(tl.float32)  # [BLOCK_V, BLOCK_D]
            hm = rmask[:, None] & dmask[None, :]
            dh_ptrs = dh_ptr + rows[:, None] * D + dd[None, :]
            tl.store(dh_ptrs, tl.load(dh_ptrs, mask=hm, other=0.0) + tl.dot(dz, w_t, input_precision="ieee"),
                     mask=hm)
        if HAS_U:
            for r0 in range(0, R, BLOCK_R):
                rr = r0 + offs_r
                rm = rr < R
                w2_t = tl.load(w2_ptr + rr[None, :] * s_w2r + cols[:, None] * s_w2v,
                               mask=vmask[:, None] & rm[None, :], other=0.0).to(tl.float32)  # [BLOCK_V, BLOCK_R]
                um = rmask[:, None] & rm[None, :]
                du_ptrs = du_ptr + rows[:, None] * R + rr[None, :]
                tl.store(du_ptrs, tl.load(du_ptrs, mask=um, other=0.0) + tl.dot(dz, w2_t, input_precision="ieee"),
                         mask=um)
                u_t = tl.load(u_ptr + rows[None, :] * R + rr[:, None], mask=rm[:, None] & rmask[None, :],
                              other=0.0).to(tl.float32)  # [BLOCK_R, BLOCK_N]
                tl.atomic_add(dw2_ptr + rr[:, None] * V + cols[None, :], tl.dot(u_t, dz, input_precision="ieee"),
                              mask=rm[:, None] & vmask[None, :])
