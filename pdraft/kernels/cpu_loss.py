"""The drafter loss's per-row work over the vocabulary as one C loop on a CPU (issue 56): CE and TV of the draft
logits against the target's distribution, the draft's argmax, and their gradient, in three passes over a row
where torch's ops made about eighteen.

On the AVX2-only class a training step is float32, and the loss's [positions, vocabulary] tensors (2,560 x 4,096
in the quickstart: 42 MB each) were walked once per torch op: log_softmax, gather, exp, the difference with the
target's distribution (itself gathered out of its distinct rows into a new tensor), abs, sum and argmax in the
forward, and sub, sign, mul, sum, sub, mul, add, mul and scatter in the backward. Each is memory-bound, so the
loss's elementwise part cost more than its products. Here, per row:

- forward: the maximum and first argmax of the logits; exp(z - max) and its sum (into the row of p_d); then
  p_d normalised in place, TV = 1/2 sum |p_d - p_t| and m = sum p_d sign(p_d - p_t), reading p_t from the
  target's distinct rows (`t_inverse`), never a per-position copy; CE = log(sum) + max - z[target];
- backward: g = p_d (1/2 g_tv (sign(p_d - p_t) - m) + g_ce), and g[target] -= g_ce: one pass.

This is `pdraft.train.losses._CeTv`'s arithmetic (the same gradient, written out there too), in float32 with its
own exp (a degree-6 polynomial after range reduction, within 2 ulp of expf; exp of anything below -87.3 is 0) and
a different order of the sums: figures agree with the torch path to float32 rounding, and an argmax can resolve
a near-tie the other way. NaN logits give NaN losses, as torch's do. Rows are split between the run's threads
(ctypes drops the GIL during a call). Built by pdraft.kernels.cc at the PDRAFT_CPU_MARCH level (vectorised by
the compiler for that level, AVX2 on the AVX2 class); without it (no compiler, PDRAFT_CPU_KERNELS=0) `kernels()` is
None and the loss keeps its torch path (`status()` says why)."""

from __future__ import annotations

import ctypes
import functools
from concurrent.futures import ThreadPoolExecutor

import torch

from pdraft.kernels import cc

SYMBOLS = ("ce_tv_forward", "ce_tv_backward", "gather_dot", "gather_dot_backward")

SOURCE = r"""
#include <math.h>
#include <stdint.h>
#include <string.h>

/* Eight floats as one vector of the compiler's (GCC and Clang vector extensions): one 256-bit register at
   x86-64-v3 and above, two 128-bit ones at v2 or on ARM. Comparisons give lanes of -1 (true) or 0. */
typedef float vf __attribute__((vector_size(32)));
typedef int32_t vi __attribute__((vector_size(32)));
#define W 8

static inline vf ld(const float *p) { vf v; memcpy(&v, p, sizeof v); return v; }
static inline void st(float *p, vf v) { memcpy(p, &v, sizeof v); }
static inline vf sel(vi m, vf a, vf b) { return (vf)(((vi)a & m) | ((vi)b & ~m)); }
static inline float hsum(vf v) { float s = 0.0f; for (int k = 0; k < W; k++) s += v[k]; return s; }

/* exp(x) for x <= 0 (log-softmax arguments): x = n ln2 + r, |r| <= ln2 / 2, exp(r) by Cephes' degree-6
   polynomial, 2^n through the exponent bits (n rounded by adding 1.5 * 2^23, whose low bits then hold it);
   0 below -87.3. Within 1e-7 relative of exp near 0 (tests/test_cpu_loss.py). */
#define EXP_BODY(T, KEEP, SELECT, BITS, FROM_BITS)                                                  \
    const T lo = x - x - 87.3f;                                                                     \
    KEEP;                                                                                           \
    x = SELECT;                                                                                     \
    const T t = x * 1.44269504088896341f + 12582912.0f;                                             \
    const T n = t - 12582912.0f;                                                                    \
    const T r = (x - n * 0.693359375f) + n * 2.12194440e-4f;                                        \
    T p = r * 1.9875691500e-4f + 1.3981999507e-3f;                                                  \
    p = p * r + 8.3334519073e-3f;                                                                   \
    p = p * r + 4.1665795894e-2f;                                                                   \
    p = p * r + 1.6666665459e-1f;                                                                   \
    p = p * r + 5.0000001201e-1f;                                                                   \
    p = p * r * r + r + 1.0f;

static inline vf vexp_neg(vf x) {
    EXP_BODY(vf, const vi keep = x > lo, sel(keep, x, lo), , )
    const vi e = ((vi)t - 0x4b400000 + 127) << 23;
    return (vf)((vi)(p * (vf)e) & keep);
}

static inline float exp_neg(float x) {
    EXP_BODY(float, const int keep = x > lo, keep ? x : lo, , )
    union { float f; int32_t i; } tb, e;
    tb.f = t;
    e.i = (tb.i - 0x4b400000 + 127) << 23;
    return keep ? p * e.f : 0.0f;
}

/* Rows [r0, r1) of z [n, V] (float32, contiguous): p_d [n, V] out (may be z itself), ce, tv, m [n] out, best [n]
   out (the first argmax of z; a NaN row gives NaN figures and the first NaN's index, as torch's argmax). p_t's
   row of position i is pt + inv[i] * V. */
void ce_tv_forward(const float *z, const float *restrict pt, const int64_t *restrict inv,
                   const int64_t *restrict ids, float *pd, float *restrict ce, float *restrict tv,
                   float *restrict m, int64_t *restrict best, int64_t r0, int64_t r1, int64_t V) {
    const int64_t body = V - V % W;
    const vf zero = {0};
    for (int64_t i = r0; i < r1; i++) {
        const float *zi = z + i * V;
        float *di = pd + i * V;
        const float *ti = pt + inv[i] * V;
        /* pass 1: the maximum, and whether any NaN */
        vf mx = zero - INFINITY;
        vi nan = (vi)zero;
        for (int64_t v = 0; v < body; v += W) {
            const vf x = ld(zi + v);
            nan |= x != x;
            mx = sel(x > mx, x, mx);
        }
        float top = -INFINITY;
        int any_nan = 0;
        for (int k = 0; k < W; k++) { top = mx[k] > top ? mx[k] : top; any_nan |= nan[k] != 0; }
        for (int64_t v = body; v < V; v++) { any_nan |= zi[v] != zi[v]; top = zi[v] > top ? zi[v] : top; }
        if (any_nan) {  /* torch: NaN losses; argmax ranks the first NaN highest */
            int64_t at = 0;
            while (zi[at] == zi[at]) at++;
            for (int64_t v = 0; v < V; v++) di[v] = NAN;
            ce[i] = tv[i] = m[i] = NAN;
            best[i] = at;
            continue;
        }
        int64_t at = 0;
        while (zi[at] != top) at++;  /* the first index of the maximum */
        const float zt = zi[ids[i]];
        /* pass 2: exp(z - max) into p_d, and its sum */
        vf acc = zero;
        for (int64_t v = 0; v < body; v += W) {
            const vf e = vexp_neg(ld(zi + v) - top);
            st(di + v, e);
            acc += e;
        }
        float sum = hsum(acc);
        for (int64_t v = body; v < V; v++) { const float e = exp_neg(zi[v] - top); di[v] = e; sum += e; }
        /* pass 3: p_d normalised in place; TV and m = sum p_d sign(p_d - p_t) */
        const float inv_sum = 1.0f / sum;
        vf l1 = zero, ms = zero;
        for (int64_t v = 0; v < body; v += W) {
            const vf p = ld(di + v) * inv_sum, d = p - ld(ti + v);
            st(di + v, p);
            const vi pos = d > zero, neg = d < zero;
            l1 += sel(pos, d, -d);
            ms += (vf)(((vi)p & pos) | ((vi)(-p) & neg));
        }
        float l1s = hsum(l1), mss = hsum(ms);
        for (int64_t v = body; v < V; v++) {
            const float p = di[v] * inv_sum, d = p - ti[v];
            di[v] = p;
            l1s += fabsf(d);
            mss += d > 0.0f ? p : (d < 0.0f ? -p : 0.0f);
        }
        ce[i] = logf(sum) + top - zt;
        tv[i] = 0.5f * l1s;
        m[i] = mss;
        best[i] = at;
    }
}

/* Rows [r0, r1) of the gradient g [n, V] = p_d (1/2 g_tv (s - m) + g_ce), s = sign(p_d - p_t), g[ids] -= g_ce;
   g may be p_d itself. */
void ce_tv_backward(const float *pd, const float *restrict pt, const int64_t *restrict inv,
                    const int64_t *restrict ids, const float *restrict m, const float *restrict g_ce,
                    const float *restrict g_tv, float *g, int64_t r0, int64_t r1, int64_t V) {
    const int64_t body = V - V % W;
    const vf zero = {0};
    for (int64_t i = r0; i < r1; i++) {
        const float *di = pd + i * V, *ti = pt + inv[i] * V;
        float *gi = g + i * V;
        const float half = 0.5f * g_tv[i], c = g_ce[i], mi = m[i];
        const vf one = zero + 1.0f;
        for (int64_t v = 0; v < body; v += W) {
            const vf p = ld(di + v), d = p - ld(ti + v);
            const vf s = (vf)(((vi)one & (d > zero)) | ((vi)(-one) & (d < zero)));
            st(gi + v, p * (half * (s - mi) + c));
        }
        for (int64_t v = body; v < V; v++) {
            const float d = di[v] - ti[v];
            const float s = d > 0.0f ? 1.0f : (d < 0.0f ? -1.0f : 0.0f);
            gi[v] = di[v] * (half * (s - mi) + c);
        }
        gi[ids[i]] -= c;
    }
}

/* Rows [r0, r1) of out [M, K] = x[m] . table[idx[m, k]] (x [M, D], table [V, D], all contiguous float32): DFlash2's
   selector scores its candidates so, without forming the [M, K, D] rows a gather would copy out. */
void gather_dot(const float *restrict x, const float *restrict table, const int64_t *restrict idx,
                float *restrict out, int64_t K, int64_t r0, int64_t r1, int64_t D) {
    const int64_t body = D - D % W;
    const vf zero = {0};
    for (int64_t m = r0; m < r1; m++) {
        const float *xm = x + m * D;
        for (int64_t k = 0; k < K; k++) {
            const float *row = table + idx[m * K + k] * D;
            vf acc = zero;
            for (int64_t d = 0; d < body; d += W) acc += ld(xm + d) * ld(row + d);
            float s = hsum(acc);
            for (int64_t d = body; d < D; d++) s += xm[d] * row[d];
            out[m * K + k] = s;
        }
    }
}

/* The gradients of gather_dot for g [M, K]: grad_x [M, D] (rows [r0, r1), when grad_x) = sum_k g[m, k]
   table[idx[m, k]]; grad_table [V, D] (when grad_table; every row m, by one caller: rows may repeat) +=
   g[m, k] x[m]. */
void gather_dot_backward(const float *restrict x, const float *restrict table, const int64_t *restrict idx,
                         const float *restrict g, float *restrict grad_x, float *restrict grad_table, int64_t K,
                         int64_t r0, int64_t r1, int64_t D) {
    const int64_t body = D - D % W;
    for (int64_t m = r0; m < r1; m++) {
        const float *xm = x + m * D;
        float *gx = grad_x ? grad_x + m * D : 0;
        if (gx) memset(gx, 0, (size_t)D * sizeof(float));
        for (int64_t k = 0; k < K; k++) {
            const float c = g[m * K + k];
            const int64_t id = idx[m * K + k];
            if (gx) {
                const float *row = table + id * D;
                for (int64_t d = 0; d < body; d += W) st(gx + d, ld(gx + d) + ld(row + d) * c);
                for (int64_t d = body; d < D; d++) gx[d] += row[d] * c;
            }
            if (grad_table) {
                float *gt = grad_table + id * D;
                for (int64_t d = 0; d < body; d += W) st(gt + d, ld(gt + d) + ld(xm + d) * c);
                for (int64_t d = body; d < D; d++) gt[d] += xm[d] * c;
            }
        }
    }
}
"""


class Loss:
    """The loaded library: `forward` and `backward` over whole tensors, rows split between the threads."""

    def __init__(self, lib: ctypes.CDLL):
        self.lib = lib
        lib.ce_tv_forward.restype = lib.ce_tv_backward.restype = None
        lib.ce_tv_forward.argtypes = [ctypes.c_void_p] * 9 + [ctypes.c_int64] * 3
        lib.ce_tv_backward.argtypes = [ctypes.c_void_p] * 8 + [ctypes.c_int64] * 3
        lib.gather_dot.restype = lib.gather_dot_backward.restype = None
        lib.gather_dot.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 4
        lib.gather_dot_backward.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int64] * 4

    def _rows(self, call, n: int, *args) -> None:
        """call(*args[:-1], r0, r1, args[-1]) over rows [0, n), split between the threads."""
        parts = max(1, min(torch.get_num_threads(), n // 64))
        if parts == 1:
            call(*args[:-1], 0, n, args[-1])
            return
        edges = [n * k // parts for k in range(parts + 1)]
        pool = _pool(parts)
        for f in [pool.submit(call, *args[:-1], edges[k], edges[k + 1], args[-1]) for k in range(parts)]:
            f.result()

    def forward(self, z: torch.Tensor, p_rows: torch.Tensor, inverse: torch.Tensor, ids: torch.Tensor):
        """z [n, V] float32 logits, p_rows [U, V] float32 (the target's distinct rows), inverse [n] and ids [n]
        int64, all contiguous -> (p_d [n, V], ce [n], tv [n], m [n], argmax [n])."""
        n, vocab = z.shape
        p_d = torch.empty_like(z)
        ce, tv, m = (torch.empty(n, dtype=torch.float32) for _ in range(3))
        best = torch.empty(n, dtype=torch.int64)
        self._rows(self.lib.ce_tv_forward, n, z.data_ptr(), p_rows.data_ptr(), inverse.data_ptr(), ids.data_ptr(),
                   p_d.data_ptr(), ce.data_ptr(), tv.data_ptr(), m.data_ptr(), best.data_ptr(), vocab)
        return p_d, ce, tv, m, best

    def backward(self, p_d, p_rows, inverse, ids, m, g_ce, g_tv) -> torch.Tensor:
        """The gradient of the logits [n, V], written into p_d's own storage (the backward runs once)."""
        n, vocab = p_d.shape
        g_ce, g_tv = g_ce.float().contiguous(), g_tv.float().contiguous()
        self._rows(self.lib.ce_tv_backward, n, p_d.data_ptr(), p_rows.data_ptr(), inverse.data_ptr(),
                   ids.data_ptr(), m.data_ptr(), g_ce.data_ptr(), g_tv.data_ptr(), p_d.data_ptr(), vocab)
        return p_d


    def gather_dot(self, x: torch.Tensor, table: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """x [M, D], table [V, D] float32 and idx [M, K] int64, contiguous -> [M, K] float32."""
        m, k = idx.shape
        out = torch.empty(m, k, dtype=torch.float32)
        self._rows(self.lib.gather_dot, m, x.data_ptr(), table.data_ptr(), idx.data_ptr(), out.data_ptr(), k,
                   x.shape[1])
        return out

    def gather_dot_backward(self, x, table, idx, g, want_x: bool, want_table: bool):
        """(grad_x [M, D] or None, grad_table [V, D] or None) of gather_dot for g [M, K]: grad_x split between
        the threads, grad_table accumulated by one (its rows repeat)."""
        m, k = idx.shape
        g = g.float().contiguous()
        grad_x = torch.empty_like(x) if want_x else None
        grad_table = torch.zeros_like(table) if want_table else None
        if want_x:
            self._rows(self.lib.gather_dot_backward, m, x.data_ptr(), table.data_ptr(), idx.data_ptr(),
                       g.data_ptr(), grad_x.data_ptr(), None, k, x.shape[1])
        if want_table:
            self.lib.gather_dot_backward(x.data_ptr(), table.data_ptr(), idx.data_ptr(), g.data_ptr(), None,
                                         grad_table.data_ptr(), k, 0, m, x.shape[1])
        return grad_x, grad_table


class _GatherDot(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, table, idx):
        ctx.save_for_backward(x, table, idx)
        return kernels().gather_dot(x, table, idx)

    @staticmethod
    def backward(ctx, g):
        x, table, idx = ctx.saved_tensors
        grad_x, grad_table = kernels().gather_dot_backward(x, table, idx, g, ctx.needs_input_grad[0],
                                                           ctx.needs_input_grad[1])
        return grad_x, grad_table, None


def gather_dot(x: torch.Tensor, table: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """x [..., D] . table[idx] for idx [..., K] -> [..., K] float32, differentiable in x and table: through the
    compiled loop on a CPU in float32 (the [..., K, D] rows a gather forms are never formed), else as a gather and
    an einsum (torch's path, which the tests hold the loop to)."""
    lead, k, d = idx.shape[:-1], idx.shape[-1], table.shape[-1]
    if x.device.type != "cpu" or x.dtype != torch.float32 or table.dtype != torch.float32 \
            or torch.compiler.is_compiling() or kernels() is None:
        return torch.einsum("...d,...kd->...k", x.float(), torch.nn.functional.embedding(idx, table).float())
    out = _GatherDot.apply(x.reshape(-1, d).contiguous(), table.contiguous(), idx.reshape(-1, k).contiguous())
    return out.view(*lead, k)


@functools.cache
def _pool(n: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=n, thread_name_prefix="pdraft-loss")


@functools.cache  # one library object per process and level
def load(level: str | None = None) -> tuple[Loss | None, str]:
    built = cc.build("loss", SOURCE, SYMBOLS, level or cc.march())
    return (None if built.lib is None else Loss(built.lib)), built.why


def kernels() -> Loss | None:
    """The compiled loss rows, or None (no compiler, a failed build, or PDRAFT_CPU_KERNELS=0)."""
    return None if cc.disabled() else load()[0]


def status() -> str:
    return f"{cc.ENV}=0: the loss runs in torch" if cc.disabled() else load()[1]


__all__ = ["SYMBOLS", "Loss", "gather_dot", "kernels", "load", "status"]
