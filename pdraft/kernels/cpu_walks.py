"""The sequential walks of DSpark's Markov head and DFlash2's candidate selector as small C loops, compiled once
per machine with the system's C compiler and called through ctypes (issue 38).

Both walks are sequential by design: draft k depends on draft k - 1. In torch each step is a few operations
(a row of W1, a product, an argmax), and on a CPU a block of 16 steps costs a fifth of a DSpark pass in
per-operation overhead alone; DFlash2's walk needs a whole K x K lattice of edge scores (two codebook
gathers, a product, a copy to the host) to read 16 rows of it. Here each walk is one call:

- `markov_walk`: position k's logits U_k + W1[x_{k-1}] W2 over the draft vocabulary and their first argmax x_k
  (x_0 = the anchor; a draft id becomes a target id through d2t before it indexes W1), as
  pdraft.models.dspark.model's torch walk computes them, and the confidence head's logit of each position
  (its part in h_k computed before the walk, its part in W1[x_{k-1}] inside), as the Triton kernel does.
- `selector_walk`: step l's edge scores out of the candidate picked at l - 1 (the anchor at l = 0),
  unary[l, c] + sum_r P[pred, r] wh[l, r] S[cand[l, c], r], and their first argmax, as
  pdraft.models.dflash2.selector's `edge_scores` and `greedy_walk` do, without forming the other K - 1 rows.

Sums run in float32 in a fixed order, which need not be the order of torch's products: a logit can differ in its
last bits from the torch path, so a near-tie can resolve the other way (the draft is a proposal; what is emitted
is the target's). The library is built once per machine by pdraft.kernels.cc. Without a compiler, or with
PDRAFT_CPU_KERNELS=0, `kernels()` is None and the callers keep their torch walks; `status()` says which it is."""

from __future__ import annotations

import ctypes
import functools

import torch

from pdraft.kernels import cc
from pdraft.kernels.cc import ENV, disabled
from pdraft.kernels.cc import ptr as _ptr
from pdraft.kernels.cc import ptr_or_null as _ptr_or_null

SOURCE = r"""
#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

static inline float bf16_to_f32(uint16_t x) {
    union { uint32_t u; float f; } v;
    v.u = (uint32_t)x << 16;
    return v.f;
}

/* The running first maximum of a row over one more tile l [n] starting at column t0 (t0 == 0: the first tile);
   NaN counts as largest, as argmax. Vectorised: the tile's maximum in 16 lanes, then its first position only if
   it beats the running one; a tile holding a NaN takes the scalar rule (16 steps of V = 4096: 0.19 -> ~0.1 ms). */
static inline void tile_argmax(const float *restrict l, int64_t n, int64_t t0, float *top, int64_t *best) {
    int has_nan = 0;
    float m = l[0];
#if defined(__AVX512F__)
    int64_t v = 0;
    __m512 mx = _mm512_set1_ps(-INFINITY);
    __mmask16 nan_lanes = 0;
    for (; v + 16 <= n; v += 16) {
        __m512 x = _mm512_loadu_ps(l + v);
        nan_lanes |= _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
        mx = _mm512_max_ps(mx, x);
    }
    has_nan = nan_lanes != 0;
    m = _mm512_reduce_max_ps(mx);
    for (; v < n; v++) { if (l[v] != l[v]) has_nan = 1; else if (l[v] > m) m = l[v]; }
#else
    has_nan = 1;  /* no vectors: the scalar rule below */
#endif
    if (has_nan) {
        for (int64_t v = 0; v < n; v++)
            if ((t0 == 0 && v == 0) || l[v] > *top || (l[v] != l[v] && *top == *top)) { *top = l[v]; *best = t0 + v; }
        return;
    }
    if (t0 != 0 && !(m > *top)) return;  /* an earlier tile holds the first maximum (or a NaN) */
    for (int64_t v = 0; v < n; v++)
        if (l[v] == m) { *top = m; *best = t0 + v; return; }
}

/* Position k's row of the base logits into l [n] (from column t0), widened from bfloat16 where base_bf16. */
static inline void load_base(const void *restrict base, int base_bf16, int64_t row, int64_t V, int64_t t0, int64_t n,
                             float *restrict l) {
    if (base_bf16) {
        const uint16_t *restrict b16 = (const uint16_t *)base + row * V + t0;
        int64_t v = 0;
#if defined(__AVX512F__)
        for (; v + 16 <= n; v += 16)  /* sixteen at a time: a bfloat16 is the top half of its float32 */
            _mm512_storeu_ps(l + v, _mm512_castsi512_ps(_mm512_slli_epi32(
                _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(b16 + v))), 16)));
#endif
        for (; v < n; v++) l[v] = bf16_to_f32(b16[v]);
    } else {
        memcpy(l, (const float *)base + row * V + t0, (size_t)n * sizeof(float));
    }
}

/* The confidence head's part from h_k: conf_bias + <h, conf_wh>. */
static inline float conf_from_hidden(const float *restrict h, const float *restrict conf_wh, int64_t d, float bias) {
    for (int64_t j = 0; j < d; j++) bias += h[j] * conf_wh[j];
    return bias;
}

/* base [b, g, V] f32 (bf16 when base_bf16: a bfloat16 head's logits, widened exactly as read), w1 [Vt, r] f32, w2t [r, V] f32, anchors [b] (target ids), d2t [V] or NULL -> logits
   [b, g, V] f32, tokens [b, g] (draft ids). With conf_out, the confidence logits too: conf_out[k] = conf_bias +
   <h_k, conf_wh> (+ <W1[x_{k-1}], conf_w1> when conf_w1 is given), hidden [b, g, d].
   The logits row is built in tiles of TILE entries that stay in L1 while all r rows of W2 are added to them,
   eight rows at a time, and the tile's argmax is taken before the next tile: 0.19 ms against 0.30 for a
   row-at-a-time loop over the whole vocabulary (16 steps, r = 64, V = 4096, issue 38). */
#define TILE 512
void markov_walk(const void *restrict base, int base_bf16, const float *restrict w1, const float *restrict w2t,
                 const int64_t *restrict anchors, const int64_t *restrict d2t, int64_t b, int64_t g, int64_t V,
                 int64_t r, float *restrict logits, int64_t *restrict tokens, const float *restrict hidden,
                 int64_t d, const float *restrict conf_wh, float conf_bias, const float *restrict conf_w1,
                 float *restrict conf_out) {
    for (int64_t i = 0; i < b; i++) {
        int64_t prev = anchors[i];
        for (int64_t k = 0; k < g; k++) {
            float *restrict lk = logits + (i * g + k) * V;
            const float *restrict u = w1 + prev * r;
            if (conf_out) {
                float c = conf_from_hidden(hidden + (i * g + k) * d, conf_wh, d, conf_bias);
                if (conf_w1) for (int64_t j = 0; j < r; j++) c += u[j] * conf_w1[j];
                conf_out[i * g + k] = c;
            }
            int64_t best = 0;
            float top = 0.0f;
            for (int64_t t0 = 0; t0 < V; t0 += TILE) {
                const int64_t n = V - t0 < TILE ? V - t0 : TILE;
                float *restrict l = lk + t0;
                load_base(base, base_bf16, i * g + k, V, t0, n, l);
                int64_t j = 0;
                for (; j + 8 <= r; j += 8) {
                    const float *restrict w = w2t + j * V + t0;
                    const float u0 = u[j], u1 = u[j + 1], u2 = u[j + 2], u3 = u[j + 3];
                    const float u4 = u[j + 4], u5 = u[j + 5], u6 = u[j + 6], u7 = u[j + 7];
                    for (int64_t v = 0; v < n; v++)
                        l[v] += ((u0 * w[v] + u1 * w[V + v]) + (u2 * w[2 * V + v] + u3 * w[3 * V + v]))
                              + ((u4 * w[4 * V + v] + u5 * w[5 * V + v]) + (u6 * w[6 * V + v] + u7 * w[7 * V + v]));
                }
                for (; j < r; j++) {
                    const float uj = u[j];
                    const float *restrict row = w2t + j * V + t0;
                    for (int64_t v = 0; v < n; v++) l[v] += uj * row[v];
                }
                tile_argmax(l, n, t0, &top, &best);
            }
            tokens[i * g + k] = best;
            prev = d2t ? best + d2t[best] : best;
        }
    }
}

/* The same walk with bfloat16 weights (a bfloat16 drafter's, whose values are exactly those): w1 [Vt, r] bf16,
   w2v [V / 64, r / 2, 64, 2] bf16 (vnni_layout: W2's rows in pairs, interleaved as AVX-512 BF16 dot products read
   them, chunk by chunk of 64 columns; r even). Each 16 logits take r / 2 dot-product steps over half the bytes of
   the float32 walk's W2 (0.5 MB against 1 MB at r = 64, V = 4096: what sixteen steps stream through L2). Products of
   bfloat16 values are exact in float32; the sums run in their own order (pairs, DAZ/FTZ), so a logit can differ in
   its last bits from the float32 walk's. */
#if defined(__AVX512BF16__)
int vnni_available(void) { return 1; }
void markov_walk_vnni(const void *restrict base, int base_bf16, const uint16_t *restrict w1,
                      const uint16_t *restrict w2v, const int64_t *restrict anchors, const int64_t *restrict d2t,
                      int64_t b, int64_t g, int64_t V, int64_t r, float *restrict logits, int64_t *restrict tokens,
                      const float *restrict hidden, int64_t d, const float *restrict conf_wh, float conf_bias,
                      const float *restrict conf_w1, float *restrict conf_out) {
    for (int64_t i = 0; i < b; i++) {
        int64_t prev = anchors[i];
        for (int64_t k = 0; k < g; k++) {
            float *restrict lk = logits + (i * g + k) * V;
            const uint16_t *restrict u = w1 + prev * r;
            if (conf_out) {
                float c = conf_from_hidden(hidden + (i * g + k) * d, conf_wh, d, conf_bias);
                if (conf_w1) for (int64_t j = 0; j < r; j++) c += bf16_to_f32(u[j]) * conf_w1[j];
                conf_out[i * g + k] = c;
            }
            int64_t best = 0;
            float top = 0.0f;
            for (int64_t t0 = 0; t0 < V; t0 += TILE) {
                const int64_t n = V - t0 < TILE ? V - t0 : TILE;
                float *restrict l = lk + t0;
                load_base(base, base_bf16, i * g + k, V, t0, n, l);
                for (int64_t v = 0; v < n; v += 64) {  /* 64 columns: four sets of 16 accumulators */
                    const int64_t left = n - v < 64 ? n - v : 64;
                    const __mmask64 keep = left == 64 ? ~0ull : (1ull << left) - 1ull;  /* bit c: column v + c */
                    const __mmask16 k0 = (__mmask16)keep, k1 = (__mmask16)(keep >> 16);
                    const __mmask16 k2 = (__mmask16)(keep >> 32), k3 = (__mmask16)(keep >> 48);
                    __m512 a0 = _mm512_maskz_loadu_ps(k0, l + v), a1 = _mm512_maskz_loadu_ps(k1, l + v + 16);
                    __m512 a2 = _mm512_maskz_loadu_ps(k2, l + v + 32), a3 = _mm512_maskz_loadu_ps(k3, l + v + 48);
                    /* this chunk's r / 2 pairs of rows, contiguous (vnni_layout pads V to whole chunks) */
                    const uint16_t *restrict w = w2v + (t0 + v) / 64 * (r / 2) * 128;
                    for (int64_t j = 0; j < r / 2; j++, w += 128) {
                        int32_t pair;  /* u[2j] and u[2j + 1] as one 32-bit lane (memcpy: no aliasing) */
                        memcpy(&pair, u + 2 * j, sizeof pair);
                        __m512bh uu = (__m512bh)_mm512_set1_epi32(pair);
                        a0 = _mm512_dpbf16_ps(a0, uu, (__m512bh)_mm512_loadu_si512(w));
                        a1 = _mm512_dpbf16_ps(a1, uu, (__m512bh)_mm512_loadu_si512(w + 32));
                        a2 = _mm512_dpbf16_ps(a2, uu, (__m512bh)_mm512_loadu_si512(w + 64));
                        a3 = _mm512_dpbf16_ps(a3, uu, (__m512bh)_mm512_loadu_si512(w + 96));
                    }
                    _mm512_mask_storeu_ps(l + v, k0, a0); _mm512_mask_storeu_ps(l + v + 16, k1, a1);
                    _mm512_mask_storeu_ps(l + v + 32, k2, a2); _mm512_mask_storeu_ps(l + v + 48, k3, a3);
                }
                tile_argmax(l, n, t0, &top, &best);
            }
            tokens[i * g + k] = best;
            prev = d2t ? best + d2t[best] : best;
        }
    }
}
#else
int vnni_available(void) { return 0; }
void markov_walk_vnni(const void *base, int base_bf16, const uint16_t *w1, const uint16_t *w2v,
                      const int64_t *anchors, const int64_t *d2t, int64_t b, int64_t g, int64_t V, int64_t r,
                      float *logits, int64_t *tokens, const float *hidden, int64_t d, const float *conf_wh,
                      float conf_bias, const float *conf_w1, float *conf_out) {
    (void)base; (void)base_bf16; (void)w1; (void)w2v; (void)anchors; (void)d2t; (void)b; (void)g; (void)V; (void)r;
    (void)logits; (void)tokens; (void)hidden; (void)d; (void)conf_wh; (void)conf_bias; (void)conf_w1; (void)conf_out;
}
#endif

/* cand [b, L, K] target ids, unary [b, L, K] f32, wh [b, L, r] f32, pred_book / succ_book [vocab, r] f32,
   anchors [b] -> picks [b, L] (candidate indices). */
void selector_walk(const int64_t *restrict cand, const float *restrict unary, const float *restrict wh,
                   const float *restrict pred_book, const float *restrict succ_book, const int64_t *restrict anchors,
                   int64_t b, int64_t L, int64_t K, int64_t r, int64_t *restrict picks) {
    float gate[r];  /* a variable-length array: r floats on the stack */
    for (int64_t i = 0; i < b; i++) {
        int64_t prev = anchors[i];
        for (int64_t l = 0; l < L; l++) {
            const float *restrict p = pred_book + prev * r;
            const float *restrict w = wh + (i * L + l) * r;
            for (int64_t j = 0; j < r; j++) gate[j] = p[j] * w[j];
            const int64_t *restrict c = cand + (i * L + l) * K;
            const float *restrict u = unary + (i * L + l) * K;
            int64_t best = 0;
            float top = 0.0f;
            for (int64_t k = 0; k < K; k++) {
                const float *restrict s = succ_book + c[k] * r;
                float acc = 0.0f;
                int64_t j = 0;
#if defined(__AVX512F__)
                /* sixteen lanes, then their sum: a chain of scalar additions waits on each one (57 -> ~10 us for
                   16 steps x 16 candidates x rank 256) */
                __m512 lanes = _mm512_setzero_ps();
                for (; j + 16 <= r; j += 16)
                    lanes = _mm512_fmadd_ps(_mm512_loadu_ps(gate + j), _mm512_loadu_ps(s + j), lanes);
                acc = _mm512_reduce_add_ps(lanes);
#endif
                for (; j < r; j++) acc += gate[j] * s[j];
                float score = u[k] + acc;
                if (k == 0 || score > top || (score != score && top == top)) { top = score; best = k; }
            }
            picks[i * L + l] = best;
            prev = c[best];
        }
    }
}
"""


class Walks:
    """The loaded library; each method checks its tensors and calls the loop."""

    def __init__(self, lib: ctypes.CDLL):
        self.lib = lib
        lib.markov_walk.restype = None
        lib.markov_walk_vnni.restype = None
        lib.vnni_available.restype = ctypes.c_int
        self.vnni = bool(lib.vnni_available())
        lib.selector_walk.restype = None

    def markov_walk(self, base: torch.Tensor, anchors: torch.Tensor, w1: torch.Tensor, w2t: torch.Tensor,
                    d2t: torch.Tensor | None, confidence: tuple | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """base [b, g, V] float32 or bfloat16; anchors [b] target ids; w1 [Vt, r], w2t [r, V] float32 contiguous
        (or, where `vnni`, w1 bfloat16 [Vt, r] and `vnni_layout(W2^T)`: the AVX-512 BF16 walk); d2t [V] long
        or None; confidence: None (no confidence head) or (hidden [b, g, d], w_h [d], bias (a float), w_1 [r] or
        None: the head reads h_k alone) -> (draft ids [b, g], logits [b, g, V], confidence logits [b, g] or None)."""
        b, g, vocab = base.shape
        half = base.dtype == torch.bfloat16  # widened as the loop reads it
        base = base.detach().contiguous() if half else _f32(base)
        anchors = anchors.reshape(b).long().contiguous()
        logits = torch.empty(b, g, vocab, dtype=torch.float32)
        tokens = torch.empty(b, g, dtype=torch.long)
        d2t = None if d2t is None else d2t.long().contiguous()
        conf = hidden = wh = we = None
        bias = 0.0
        if confidence is not None:
            hidden, wh, bias, we = confidence
            hidden, wh, bias = _f32(hidden), _f32(wh), float(bias)
            we = None if we is None else _f32(we)
            if we is not None and we.shape[0] < w1.shape[1]:  # the vnni layout's zero column, read as nothing
                we = torch.cat([we, we.new_zeros(w1.shape[1] - we.shape[0])])
            conf = torch.empty(b, g, dtype=torch.float32)
        vnni = w1.dtype == torch.bfloat16  # w1 [Vt, r] and w2t in vnni_layout's chunks, both bfloat16
        walk = self.lib.markov_walk_vnni if vnni else self.lib.markov_walk
        if vnni and not self.vnni:
            raise RuntimeError("internal: bfloat16 walk weights on a CPU without AVX-512 BF16")
        weights = (w1.contiguous(), w2t.contiguous()) if vnni else (_f32(w1), _f32(w2t))
        walk(_ptr(base), ctypes.c_int(int(half)), _ptr(weights[0]), _ptr(weights[1]), _ptr(anchors), _ptr_or_null(d2t),
                             ctypes.c_int64(b), ctypes.c_int64(g), ctypes.c_int64(vocab), ctypes.c_int64(w1.shape[1]),
                             _ptr(logits), _ptr(tokens), _ptr_or_null(hidden),
                             ctypes.c_int64(0 if hidden is None else hidden.shape[-1]), _ptr_or_null(wh),
                             ctypes.c_float(bias), _ptr_or_null(we), _ptr_or_null(conf))
        return tokens, logits, conf

    def selector_walk(self, cand: torch.Tensor, unary: torch.Tensor, wh: torch.Tensor, pred_book: torch.Tensor,
                      succ_book: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
        """cand [b, L, K] target ids; unary [b, L, K]; wh [b, L, r]; the codebooks [vocab, r] float32 contiguous;
        anchors [b] -> the picked candidate index of every step [b, L]."""
        b, length, k = cand.shape
        rank = wh.shape[-1]
        cand = cand.long().contiguous()
        anchors = anchors.reshape(b).long().contiguous()
        unary, wh = _f32(unary), _f32(wh)
        picks = torch.empty(b, length, dtype=torch.long)
        self.lib.selector_walk(_ptr(cand), _ptr(unary), _ptr(wh), _ptr(_f32(pred_book)), _ptr(_f32(succ_book)),
                               _ptr(anchors), ctypes.c_int64(b), ctypes.c_int64(length), ctypes.c_int64(k),
                               ctypes.c_int64(rank), _ptr(picks))
        return picks


def vnni_layout(w1: torch.Tensor, w2t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(w1 [Vt, r], W2^T [r, V]) -> bfloat16 (w1 [Vt, r'], W2 [V' / 64, r' / 2, 64, 2]) for the AVX-512 BF16 walk:
    r' = r rounded up to even with a zero column / row and V' = V up to whole chunks of 64 with zero columns
    (which add nothing), each chunk's rows in pairs and contiguous, so that a chunk's 64 logits read one 4 KB
    run of memory (r = 64) rather than 32 rows a vocabulary apart."""
    rank, vocab = w1.shape[1], w2t.shape[1]
    if rank % 2:
        w1 = torch.cat([w1, w1.new_zeros(w1.shape[0], 1)], dim=1)
        w2t = torch.cat([w2t, w2t.new_zeros(1, vocab)], dim=0)
    pad = -vocab % 64
    if pad:
        w2t = torch.cat([w2t, w2t.new_zeros(w2t.shape[0], pad)], dim=1)
    chunks = w2t.shape[1] // 64
    w2v = w2t.detach().to(torch.bfloat16).reshape(-1, 2, chunks, 64).permute(2, 0, 3, 1).contiguous()
    return w1.detach().to(torch.bfloat16).contiguous(), w2v


def _f32(x: torch.Tensor) -> torch.Tensor:
    return x.detach().to(torch.float32).contiguous()


SYMBOLS = ("markov_walk", "markov_walk_vnni", "vnni_available", "selector_walk")


@functools.cache  # one library object per process and level: kernels() is asked on the hot path
def load(level: str | None = None) -> tuple[Walks | None, str]:
    """(the walks built for `level` (default: PDRAFT_CPU_MARCH's), or None) and one line saying which and why."""
    built = cc.build("walks", SOURCE, SYMBOLS, level or cc.march())
    return (None if built.lib is None else Walks(built.lib)), built.why


def kernels() -> Walks | None:
    """The compiled walks, or None (no compiler, a failed build, a level this CPU cannot run, or
    PDRAFT_CPU_KERNELS=0)."""
    return None if disabled() else load()[0]


def status() -> str:
    """One line: whether the walks run compiled or in torch, and why."""
    return f"{ENV}=0: the walks run in torch" if disabled() else load()[1]


__all__ = ["ENV", "SYMBOLS", "Walks", "disabled", "kernels", "load", "status", "vnni_layout"]
