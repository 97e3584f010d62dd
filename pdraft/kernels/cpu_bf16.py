"""Two bfloat16 loops of a decode pass as C over AVX-512 (BF16), compiled once per machine (pdraft.kernels.cc;
issue 38): a product of a few rows by a fixed weight, and RMSNorm.

**The product.**
On the Intel Xeon with AMX these machines have, every bfloat16 `F.linear` through oneDNN costs 20-40 us at one
row whatever the weight's size (a fixed cost per call: the kernel's setup, its threads), against 3-12 us for this
loop on one thread over the target's products (256 x 256 to 1536 x 256). A target step is 17 such products, so in
bfloat16 the target alone ran slower than in float32 (MKL's one-row product is 5-14 us). The loop reads each
weight row once per output row, so it only pays at one or two rows; `pdraft.gemm.FastLinear` offers it beside
MKL and oneDNN and keeps whichever measures fastest at each row count.

Sums run in float32 (products of bfloat16 pairs are exact in float32), sixteen lanes at a time, and the output is
rounded to the nearest bfloat16 (ties to even) after the bias is added: the same arithmetic as oneDNN's, in an
order of its own, so a value can differ in its last bit from another backend's (pdraft.gemm's docstring says what
the target's output means then).

**RMSNorm.** In bfloat16, transformers' order (float32 statistics, the normalised row rounded to bfloat16, then
times the weight, rounded again) is four torch calls of 3-10 us each on a row of 256, and a target step or a
verify pass runs 17 of them; `rms_norm` is one call of about 1 us per row. `weight_last` chooses that order, or
the fused one (the weight multiplied in float32, one rounding: `F.rms_norm` on bfloat16 input, what the drafters
use without gradients). The sum of squares runs sixteen lanes at a time, so the statistic can differ in its last
float32 bit from torch's; each row is normalised on its own, so a row's output does not depend on the rows
beside it (a one-token step and a many-token verify normalise a token alike).

Without AVX-512 BF16 (or a compiler, or with PDRAFT_CPU_KERNELS=0) `kernels()` is None, and `status()` says
why (pdraft.kernels.cc: every compiled loop is probed, never assumed)."""

from __future__ import annotations

import ctypes
import functools

import torch

from pdraft.kernels import cc

AMX_ROWS = 32  # the most rows amx_linear takes in one call (two A tiles)

SOURCE = r"""
#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__AVX512BF16__)
#include <immintrin.h>

static inline uint16_t to_bf16(float f, const uint16_t *bias_at) {
    union { uint32_t u; float f; } v;
    v.f = f;
    if (bias_at) { union { uint32_t u; float f; } b; b.u = (uint32_t)*bias_at << 16; v.f += b.f; }
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40u);  /* NaN stays NaN */
    return (uint16_t)((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);
}

static inline __m512bh load(const uint16_t *p, int64_t left) {
    if (left >= 32) return (__m512bh)_mm512_loadu_si512(p);
    return (__m512bh)_mm512_maskz_loadu_epi16((__mmask32)((1ull << left) - 1ull), p);
}

int gemv_available(void) { return 1; }

/* y [M, N] = x [M, K] w[N, K]^T (+ bias [N]); all bfloat16, row-major and contiguous; float32 sums. Four weight
   rows at a time share each 32-wide slice of x. */
void gemv_bf16(const uint16_t *restrict x, const uint16_t *restrict w, const uint16_t *restrict bias,
               uint16_t *restrict y, int64_t M, int64_t N, int64_t K) {
    for (int64_t m = 0; m < M; m++) {
        const uint16_t *xm = x + m * K;
        uint16_t *ym = y + m * N;
        int64_t n = 0;
        for (; n + 4 <= N; n += 4) {
            const uint16_t *w0 = w + n * K;
            __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
            for (int64_t k = 0; k < K; k += 32) {
                __m512bh xv = load(xm + k, K - k);
                a0 = _mm512_dpbf16_ps(a0, load(w0 + k, K - k), xv);
                a1 = _mm512_dpbf16_ps(a1, load(w0 + K + k, K - k), xv);
                a2 = _mm512_dpbf16_ps(a2, load(w0 + 2 * K + k, K - k), xv);
                a3 = _mm512_dpbf16_ps(a3, load(w0 + 3 * K + k, K - k), xv);
            }
            ym[n] = to_bf16(_mm512_reduce_add_ps(a0), bias ? bias + n : 0);
            ym[n + 1] = to_bf16(_mm512_reduce_add_ps(a1), bias ? bias + n + 1 : 0);
            ym[n + 2] = to_bf16(_mm512_reduce_add_ps(a2), bias ? bias + n + 2 : 0);
            ym[n + 3] = to_bf16(_mm512_reduce_add_ps(a3), bias ? bias + n + 3 : 0);
        }
        for (; n < N; n++) {
            const uint16_t *wn = w + n * K;
            __m512 a = _mm512_setzero_ps();
            for (int64_t k = 0; k < K; k += 32) a = _mm512_dpbf16_ps(a, load(wn + k, K - k), load(xm + k, K - k));
            ym[n] = to_bf16(_mm512_reduce_add_ps(a), bias ? bias + n : 0);
        }
    }
}

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#include <sys/syscall.h>
#include <unistd.h>

/* Linux hands a process the AMX tile state only once it asks (arch_prctl ARCH_REQ_XCOMP_PERM, XTILEDATA). */
int amx_available(void) { return syscall(SYS_arch_prctl, 0x1023, 18) == 0; }

typedef struct { uint8_t palette, start; uint8_t pad[14]; uint16_t colsb[16]; uint8_t rows[16]; } tile_config;

/* The weight [N, K] as AMX's B operand: for each 16-column block of the output (N padded with zero rows to a
   multiple of 64) and each 32-wide slice of K, 16 rows of k pairs x 16 columns x 2; K % 32 == 0. */
void amx_pack(const uint16_t *restrict w, uint16_t *restrict packed, int64_t N, int64_t K, int64_t Np) {
    memset(packed, 0, (size_t)Np * (size_t)K * 2);
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++)
            packed[(((n / 16) * (K / 32) + k / 32) * 16 + (k % 32) / 2) * 32 + (n % 16) * 2 + k % 2] = w[n * K + k];
}

/* 16 float32 columns of one output row, plus the bias, rounded to bfloat16 (ties to even) and stored. */
static inline void store_row(const float *acc, const uint16_t *bias, uint16_t *out, int64_t left) {
    __mmask16 keep = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);
    __m512 v = _mm512_loadu_ps(acc);
    if (bias) v = _mm512_add_ps(v, _mm512_castsi512_ps(_mm512_slli_epi32(
                      _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(keep, bias)), 16)));
    _mm256_mask_storeu_epi16(out, keep, (__m256i)_mm512_cvtneps_pbh(v));
}

/* y [M, N] = x [M, K] W^T (+ bias), M <= 32, x bfloat16 with rows K apart. Up to 16 rows: one A tile against
   four 16-column blocks at a time (C tiles 0-3); 17 to 32: two A tiles (rows 0-15, 16-) against two blocks, so
   every B tile loaded serves both. */
void amx_linear(const uint16_t *restrict x, const uint16_t *restrict packed, const uint16_t *restrict bias,
                uint16_t *restrict y, int64_t M, int64_t N, int64_t K, int64_t Np) {
    float acc[4][256];
    int64_t slices = K / 32, tile = slices * 512;  /* bf16 values of one column block's packed weight */
    int wide = M > 16;
    int top = wide ? 16 : (int)M, low = wide ? (int)(M - 16) : 0;
    tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < (wide ? 8 : 7); t++) cfg.colsb[t] = 64;  /* an unused tile stays unconfigured (0 x 0) */
    if (!wide) {
        for (int t = 0; t < 5; t++) cfg.rows[t] = (uint8_t)top;
        cfg.rows[5] = cfg.rows[6] = 16;
    } else {
        cfg.rows[0] = cfg.rows[1] = cfg.rows[4] = 16;
        cfg.rows[2] = cfg.rows[3] = cfg.rows[5] = (uint8_t)low;
        cfg.rows[6] = cfg.rows[7] = 16;
    }
    _tile_loadconfig(&cfg);
    int64_t step = wide ? 2 : 4;
    for (int64_t nb = 0; nb < Np / 16; nb += step) {
        const uint16_t *b = packed + nb * tile;
        _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
        if (!wide) {
            for (int64_t s = 0; s < slices; s++) {
                _tile_loadd(4, x + s * 32, K * 2);
                _tile_loadd(5, b + s * 512, 64); _tile_dpbf16ps(0, 4, 5);
                _tile_loadd(6, b + tile + s * 512, 64); _tile_dpbf16ps(1, 4, 6);
                _tile_loadd(5, b + 2 * tile + s * 512, 64); _tile_dpbf16ps(2, 4, 5);
                _tile_loadd(6, b + 3 * tile + s * 512, 64); _tile_dpbf16ps(3, 4, 6);
            }
        } else {
            for (int64_t s = 0; s < slices; s++) {
                _tile_loadd(4, x + s * 32, K * 2);
                _tile_loadd(5, x + 16 * K + s * 32, K * 2);
                _tile_loadd(6, b + s * 512, 64);
                _tile_loadd(7, b + tile + s * 512, 64);
                _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7);
                _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);
            }
        }
        _tile_stored(0, acc[0], 64); _tile_stored(1, acc[1], 64); _tile_stored(2, acc[2], 64); _tile_stored(3, acc[3], 64);
        for (int t = 0; t < 4; t++) {
            int64_t n0 = (nb + (wide ? t % 2 : t)) * 16, r0 = wide ? (t / 2) * 16 : 0;
            int rows = wide ? (t < 2 ? top : low) : top;
            if (n0 >= N) continue;
            for (int r = 0; r < rows; r++)
                store_row(acc[t] + r * 16, bias ? bias + n0 : 0, y + (r0 + r) * N + n0, N - n0);
        }
    }
    _tile_release();
}
#else
int amx_available(void) { return 0; }
void amx_pack(const uint16_t *w, uint16_t *packed, int64_t N, int64_t K, int64_t Np) { (void)w; (void)packed; (void)N; (void)K; (void)Np; }
void amx_linear(const uint16_t *x, const uint16_t *packed, const uint16_t *bias, uint16_t *y, int64_t M, int64_t N,
                int64_t K, int64_t Np) { (void)x; (void)packed; (void)bias; (void)y; (void)M; (void)N; (void)K; (void)Np; }
#endif

/* y [M, D] = RMSNorm(x [M, D]) * weight [D]; bfloat16 in and out, float32 statistics. weight_last: the normalised
   row is rounded to bfloat16 before the weight multiplies it (transformers' order); else one rounding at the end. */
void rms_norm_bf16(const uint16_t *restrict x, const uint16_t *restrict weight, uint16_t *restrict y, int64_t M,
                   int64_t D, float eps, int weight_last) {
    for (int64_t m = 0; m < M; m++) {
        const uint16_t *xm = x + m * D;
        uint16_t *ym = y + m * D;
        __m512 acc = _mm512_setzero_ps();
        int64_t j = 0;
        for (; j + 16 <= D; j += 16) {
            __m512 v = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(xm + j))), 16));
            acc = _mm512_fmadd_ps(v, v, acc);
        }
        float ss = _mm512_reduce_add_ps(acc);
        for (; j < D; j++) { union { uint32_t u; float f; } v; v.u = (uint32_t)xm[j] << 16; ss += v.f * v.f; }
        float r = 1.0f / sqrtf(ss / (float)D + eps);
        for (j = 0; j < D; j++) {
            union { uint32_t u; float f; } v, w;
            v.u = (uint32_t)xm[j] << 16;
            w.u = (uint32_t)weight[j] << 16;
            if (weight_last) {
                union { uint32_t u; float f; } n;
                n.u = (uint32_t)to_bf16(v.f * r, 0) << 16;
                ym[j] = to_bf16(n.f * w.f, 0);
            } else {
                ym[j] = to_bf16(v.f * r * w.f, 0);
            }
        }
    }
}

static inline __m512 widen16(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

static inline __m512 widen16_from(__m256bh v) {  /* sixteen bfloat16 values in a register, widened */
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)v), 16));
}

static inline void topk_insert(float *bv, int64_t *bi, int64_t n, float v, int64_t j) {
    int64_t pos = n;  /* bv[0..n) sorted best first; v goes after any equal value (ties to the lower index) */
    while (pos > 0 && bv[pos - 1] < v) { bv[pos] = bv[pos - 1]; bi[pos] = bi[pos - 1]; pos--; }
    bv[pos] = v;
    bi[pos] = j;
}

/* The k largest of each row of x [M, V] (bfloat16), best first, ties to the lower index, NaN never chosen:
   values (float32, exactly the bfloat16 values) and ids (int64), [M, k] each; k <= V. Past the first k, sixteen
   values at a time are compared with the row's current k-th best and only those above it are inserted. */
void topk_bf16(const uint16_t *restrict x, float *restrict values, int64_t *restrict ids, int64_t M, int64_t V,
               int64_t k) {
    for (int64_t m = 0; m < M; m++) {
        const uint16_t *row = x + m * V;
        float *bv = values + m * k;
        int64_t *bi = ids + m * k, n = 0, j = 0;
        for (; j < V && n < k; j++) {
            union { uint32_t u; float f; } v;
            v.u = (uint32_t)row[j] << 16;
            if (v.f == v.f) topk_insert(bv, bi, n++, v.f, j);
        }
        for (; j + 16 <= V; j += 16) {
            __mmask16 hit = _mm512_cmp_ps_mask(widen16(row + j), _mm512_set1_ps(bv[k - 1]), _CMP_GT_OQ);
            while (hit) {
                int64_t at = j + __builtin_ctz(hit);
                union { uint32_t u; float f; } v;
                hit &= (__mmask16)(hit - 1);
                v.u = (uint32_t)row[at] << 16;
                if (v.f > bv[k - 1]) topk_insert(bv, bi, k - 1, v.f, at);
            }
        }
        for (; j < V; j++) {
            union { uint32_t u; float f; } v;
            v.u = (uint32_t)row[j] << 16;
            if (v.f > bv[k - 1]) topk_insert(bv, bi, k - 1, v.f, j);
        }
        for (; n < k; n++) { bv[n] = -INFINITY; bi[n] = 0; }  /* fewer than k numbers in the row */
    }
}

/* A drafter block's attention inputs in one pass over its q|k|v product, bfloat16 (pdraft.models.layers
   InjectedAttention): qkv [B, S, (H + 2G) D] -> q [B, H, S, D], each head normed (RMSNorm, weight qw) and rotated;
   k and v [B, G, T + S, D]: the cached context's ctx_k / ctx_v [B, G, T, D] (strides cb, cg; rows contiguous)
   followed by the block's keys (normed with kw, rotated) and values. cos and sin_signed [B, S, D]: rotated(x)[j] =
   x[j] cos[j] + x[(j + D/2) mod D] sin_signed[j]. The normed value is rounded to bfloat16 as the norm's output
   is, the rotation summed in float32 and rounded once. */
static inline void norm_rope_row(const uint16_t *restrict x, const uint16_t *restrict w, float eps,
                                 const uint16_t *restrict c, const uint16_t *restrict sn, int64_t D,
                                 uint16_t *restrict out) {
    float n[512];  /* head_dim <= 512 (checked by the caller) */
    const int64_t half = D / 2;
    if (half % 16 == 0) {  /* sixteen lanes throughout: the sum of squares, the norm, the two halves' rotation */
        __m512 acc = _mm512_setzero_ps();
        for (int64_t j = 0; j < D; j += 16) { __m512 v = widen16(x + j); acc = _mm512_fmadd_ps(v, v, acc); }
        const __m512 r = _mm512_set1_ps(1.0f / sqrtf(_mm512_reduce_add_ps(acc) / (float)D + eps));
        for (int64_t j = 0; j < D; j += 16)
            _mm512_storeu_ps(n + j, widen16_from(_mm512_cvtneps_pbh(
                _mm512_mul_ps(_mm512_mul_ps(widen16(x + j), r), widen16(w + j)))));
        for (int64_t j = 0; j < D; j += 16) {
            const int64_t other = j < half ? j + half : j - half;
            __m512 y = _mm512_fmadd_ps(_mm512_loadu_ps(n + other), widen16(sn + j),
                                       _mm512_mul_ps(_mm512_loadu_ps(n + j), widen16(c + j)));
            _mm256_storeu_si256((__m256i *)(out + j), (__m256i)_mm512_cvtneps_pbh(y));
        }
        return;
    }
    float ss = 0.0f;
    for (int64_t j = 0; j < D; j++) { union { uint32_t u; float f; } v; v.u = (uint32_t)x[j] << 16; ss += v.f * v.f; }
    const float r = 1.0f / sqrtf(ss / (float)D + eps);
    for (int64_t j = 0; j < D; j++) {
        union { uint32_t u; float f; } v, ww, nn;
        v.u = (uint32_t)x[j] << 16;
        ww.u = (uint32_t)w[j] << 16;
        nn.u = (uint32_t)to_bf16(v.f * r * ww.f, 0) << 16;
        n[j] = nn.f;
    }
    for (int64_t j = 0; j < D; j++) {
        union { uint32_t u; float f; } cc, ss2;
        cc.u = (uint32_t)c[j] << 16;
        ss2.u = (uint32_t)sn[j] << 16;
        out[j] = to_bf16(n[j] * cc.f + n[j < half ? j + half : j - half] * ss2.f, 0);
    }
}

void qkv_block_bf16(const uint16_t *restrict qkv, const uint16_t *restrict qw, const uint16_t *restrict kw, float eps,
                    const uint16_t *restrict cosv, const uint16_t *restrict sinv, const uint16_t *restrict ctx_k,
                    const uint16_t *restrict ctx_v, int64_t ckb, int64_t ckg, int64_t cvb, int64_t cvg,
                    uint16_t *restrict q, uint16_t *restrict k, uint16_t *restrict v, int64_t B, int64_t S,
                    int64_t H, int64_t G, int64_t D, int64_t T) {
    const int64_t width = (H + 2 * G) * D, L = T + S;
    for (int64_t b = 0; b < B; b++) {
        for (int64_t g = 0; g < G; g++) {
            if (T > 0) {
                memcpy(k + ((b * G + g) * L) * D, ctx_k + b * ckb + g * ckg, (size_t)(T * D) * sizeof(uint16_t));
                memcpy(v + ((b * G + g) * L) * D, ctx_v + b * cvb + g * cvg, (size_t)(T * D) * sizeof(uint16_t));
            }
        }
        for (int64_t i = 0; i < S; i++) {
            const uint16_t *row = qkv + (b * S + i) * width;
            const uint16_t *c = cosv + (b * S + i) * D, *sn = sinv + (b * S + i) * D;
            for (int64_t h = 0; h < H; h++)
                norm_rope_row(row + h * D, qw, eps, c, sn, D, q + ((b * H + h) * S + i) * D);
            for (int64_t g = 0; g < G; g++) {
                norm_rope_row(row + (H + g) * D, kw, eps, c, sn, D, k + ((b * G + g) * L + T + i) * D);
                memcpy(v + ((b * G + g) * L + T + i) * D, row + (H + G + g) * D, (size_t)D * sizeof(uint16_t));
            }
        }
    }
}

/* DFlash2's dynamic convolution with its coefficients formed on the way: out[b, i, c] = res[b, i, c] (when res) +
   sum over t < taps, t <= i of coeff(b, i, t, c) x[b, i - t, c], coeff = bf16(base[t, c] + delta[b, i, t, c / gs])
   (the coefficient rounded as torch's bfloat16 addition rounds it), the sum rounded once to bfloat16 and then
   added to res; x, res and out [B, S, D] contiguous, base [taps, D] contiguous, delta addressed by its strides
   (db, ds, dt: batch, position, tap; groups contiguous). Each row of B is one block of S positions. */
void dyn_conv_bf16(const uint16_t *restrict x, const uint16_t *restrict delta, const uint16_t *restrict base,
                   const uint16_t *restrict res, uint16_t *restrict out, int64_t B, int64_t S, int64_t D, int64_t taps,
                   int64_t gs, int64_t db, int64_t ds, int64_t dt) {
    for (int64_t b = 0; b < B; b++) {
        for (int64_t i = 0; i < S; i++) {
            const uint16_t *di = delta + b * db + i * ds;
            const uint16_t *xi = x + (b * S + i) * D;
            const uint16_t *ri = res ? res + (b * S + i) * D : 0;
            uint16_t *oi = out + (b * S + i) * D;
            const int64_t reach = i + 1 < taps ? i + 1 : taps;
            int64_t c = 0;
            if (gs % 16 == 0) {
                for (; c + 16 <= D; c += 16) {
                    __m512 acc = _mm512_setzero_ps();
                    for (int64_t t = 0; t < reach; t++) {
                        union { uint32_t u; float f; } dv;
                        dv.u = (uint32_t)di[t * dt + c / gs] << 16;
                        __m512 k = _mm512_add_ps(widen16(base + t * D + c), _mm512_set1_ps(dv.f));
                        k = widen16_from(_mm512_cvtneps_pbh(k));
                        acc = _mm512_fmadd_ps(k, widen16(xi - t * D + c), acc);
                    }
                    if (ri) acc = _mm512_add_ps(widen16(ri + c), widen16_from(_mm512_cvtneps_pbh(acc)));
                    _mm256_storeu_si256((__m256i *)(oi + c), (__m256i)_mm512_cvtneps_pbh(acc));
                }
            }
            for (; c < D; c++) {
                float acc = 0.0f;
                for (int64_t t = 0; t < reach; t++) {
                    union { uint32_t u; float f; } bv, dv, kv, xv;
                    bv.u = (uint32_t)base[t * D + c] << 16;
                    dv.u = (uint32_t)di[t * dt + c / gs] << 16;
                    kv.u = (uint32_t)to_bf16(bv.f + dv.f, 0) << 16;
                    xv.u = (uint32_t)xi[c - t * D] << 16;
                    acc += kv.f * xv.f;
                }
                if (ri) {
                    union { uint32_t u; float f; } rv, av;
                    rv.u = (uint32_t)ri[c] << 16;
                    av.u = (uint32_t)to_bf16(acc, 0) << 16;
                    acc = rv.f + av.f;
                }
                oi[c] = to_bf16(acc, 0);
            }
        }
    }
}
#else
int gemv_available(void) { return 0; }
int amx_available(void) { return 0; }
void amx_pack(const uint16_t *w, uint16_t *packed, int64_t N, int64_t K, int64_t Np) { (void)w; (void)packed; (void)N; (void)K; (void)Np; }
void amx_linear(const uint16_t *x, const uint16_t *packed, const uint16_t *bias, uint16_t *y, int64_t M, int64_t N,
                int64_t K, int64_t Np) { (void)x; (void)packed; (void)bias; (void)y; (void)M; (void)N; (void)K; (void)Np; }
void dyn_conv_bf16(const uint16_t *x, const uint16_t *delta, const uint16_t *base, const uint16_t *res, uint16_t *out,
                   int64_t B, int64_t S, int64_t D, int64_t taps, int64_t gs, int64_t db, int64_t ds, int64_t dt) {
    (void)x; (void)delta; (void)base; (void)res; (void)out; (void)B; (void)S; (void)D; (void)taps; (void)gs; (void)db;
    (void)ds; (void)dt;
}
void qkv_block_bf16(const uint16_t *qkv, const uint16_t *qw, const uint16_t *kw, float eps, const uint16_t *cosv,
                    const uint16_t *sinv, const uint16_t *ctx_k, const uint16_t *ctx_v, int64_t ckb, int64_t ckg,
                    int64_t cvb, int64_t cvg, uint16_t *q, uint16_t *k, uint16_t *v, int64_t B, int64_t S, int64_t H,
                    int64_t G, int64_t D, int64_t T) {
    (void)qkv; (void)qw; (void)kw; (void)eps; (void)cosv; (void)sinv; (void)ctx_k; (void)ctx_v; (void)ckb; (void)ckg;
    (void)cvb; (void)cvg; (void)q; (void)k; (void)v; (void)B; (void)S; (void)H; (void)G; (void)D; (void)T;
}
void topk_bf16(const uint16_t *x, float *values, int64_t *ids, int64_t M, int64_t V, int64_t k) {
    (void)x; (void)values; (void)ids; (void)M; (void)V; (void)k;
}
void rms_norm_bf16(const uint16_t *x, const uint16_t *weight, uint16_t *y, int64_t M, int64_t D, float eps,
                   int weight_last) { (void)x; (void)weight; (void)y; (void)M; (void)D; (void)eps; (void)weight_last; }
void gemv_bf16(const uint16_t *x, const uint16_t *w, const uint16_t *bias, uint16_t *y, int64_t M, int64_t N,
               int64_t K) { (void)x; (void)w; (void)bias; (void)y; (void)M; (void)N; (void)K; }
#endif
"""


class Gemv:
    """The loaded library; `bind(weight, bias)` gives the product by that weight (arguments converted once)."""

    def __init__(self, lib: ctypes.CDLL):
        self.lib = lib
        lib.gemv_bf16.restype = None
        lib.gemv_bf16.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3
        lib.gemv_available.restype = ctypes.c_int
        lib.amx_available.restype = ctypes.c_int
        lib.amx_pack.restype = lib.amx_linear.restype = None
        lib.amx_pack.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int64] * 3
        lib.amx_linear.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 4
        self.amx = bool(lib.amx_available())
        lib.rms_norm_bf16.restype = None
        lib.rms_norm_bf16.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 2 + [ctypes.c_float, ctypes.c_int]
        lib.topk_bf16.restype = None
        lib.qkv_block_bf16.restype = None
        lib.dyn_conv_bf16.restype = None
        lib.dyn_conv_bf16.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 8
        lib.qkv_block_bf16.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_float] + [ctypes.c_void_p] * 4 \
            + [ctypes.c_int64] * 4 + [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 6
        lib.topk_bf16.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 3

    def bind_amx(self, weight: torch.Tensor, bias: torch.Tensor | None):
        """Like `bind`, through the AMX tiles (weight [N, K] packed once, K a multiple of 32), for x of at most
        AMX_ROWS rows; None where this CPU or its kernel gives no AMX or K does not fit."""
        n, width = weight.shape
        if not self.amx or width % 32 or width == 0:
            return None
        padded = -(-n // 64) * 64
        packed = torch.empty(padded * width, dtype=torch.bfloat16)
        dense = weight.detach().contiguous()
        self.lib.amx_pack(dense.data_ptr(), packed.data_ptr(), n, width, padded)
        bias = None if bias is None else bias.detach().contiguous()
        call, b_at = self.lib.amx_linear, None if bias is None else bias.data_ptr()

        def product(x: torch.Tensor) -> torch.Tensor:
            out = torch.empty(x.shape[0], n, dtype=torch.bfloat16)
            call(x.data_ptr(), packed.data_ptr(), b_at, out.data_ptr(), x.shape[0], n, width, padded)
            return out

        product.kept = (packed, bias)
        return product

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float, weight_last: bool) -> torch.Tensor:
        """x [..., D] and weight [D] bfloat16 CPU tensors (x contiguous) -> RMSNorm(x) * weight, bfloat16."""
        out = torch.empty_like(x)
        width = x.shape[-1]
        self.lib.rms_norm_bf16(x.data_ptr(), weight.data_ptr(), out.data_ptr(), x.numel() // width, width, eps,
                               int(weight_last))
        return out

    def topk(self, x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """x [..., V] (bfloat16, contiguous), k <= V -> (values float32, ids int64) [..., k], best first, ties to
        the lower index."""
        values = torch.empty(*x.shape[:-1], k, dtype=torch.float32)
        ids = torch.empty(*x.shape[:-1], k, dtype=torch.int64)
        self.lib.topk_bf16(x.data_ptr(), values.data_ptr(), ids.data_ptr(), x.numel() // x.shape[-1], x.shape[-1], k)
        return values, ids

    def bind(self, weight: torch.Tensor, bias: torch.Tensor | None):
        """weight [N, K], bias [N] or None (bfloat16 CPU tensors, kept alive by the returned function) -> a
        function x [M, K] (bfloat16, contiguous) -> x weight^T + bias [M, N]."""
        weight = weight.detach().contiguous()
        bias = None if bias is None else bias.detach().contiguous()
        call, n, width = self.lib.gemv_bf16, weight.shape[0], weight.shape[1]
        w_at, b_at = weight.data_ptr(), None if bias is None else bias.data_ptr()

        def product(x: torch.Tensor) -> torch.Tensor:
            out = torch.empty(x.shape[0], n, dtype=torch.bfloat16)
            call(x.data_ptr(), w_at, b_at, out.data_ptr(), x.shape[0], n, width)
            return out

        product.kept = (weight, bias)  # the pointers above stay valid while the function lives
        return product


SYMBOLS = ("gemv_available", "gemv_bf16", "amx_available", "amx_pack", "amx_linear", "rms_norm_bf16", "topk_bf16",
           "qkv_block_bf16", "dyn_conv_bf16")


@functools.cache  # one library object per process and level: kernels() is asked on the hot path
def load(level: str | None = None) -> tuple[Gemv | None, str]:
    """(the bfloat16 loops built for `level` (default: PDRAFT_CPU_MARCH's), or None) and one line saying which and
    why. They need AVX-512 BF16: a build without it steps aside (`gemv_available` is 0 there)."""
    built = cc.build("bf16", SOURCE, SYMBOLS, level or cc.march())
    if built.lib is None:
        return None, built.why
    built.lib.gemv_available.restype = ctypes.c_int
    if not built.lib.gemv_available():
        return None, f"no AVX-512 BF16 in this CPU or the {built.march} build: bfloat16 products stay in torch"
    return Gemv(built.lib), built.why

def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, *, weight_last: bool) -> torch.Tensor | None:
    """RMSNorm(x) * weight through the compiled loop, or None where it does not apply (not bfloat16 on a CPU, a
    gradient to take, a torch.compile trace, or no compiled loops): the caller then runs its torch code."""
    if x.dtype != torch.bfloat16 or weight.dtype != torch.bfloat16 or x.device.type != "cpu" \
            or torch.is_grad_enabled() or torch.compiler.is_compiling():
        return None
    compiled = kernels()
    return None if compiled is None else compiled.rms_norm(x.contiguous(), weight, eps, weight_last)


def topk(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(values as float32, ids) of the k largest of x's last dimension through the compiled loop, best first and
    ties to the lower index (torch.topk leaves the order of ties open), or None where it does not apply (not
    bfloat16 on a CPU, a gradient to take, a trace, no compiled loops, k out of range). A NaN is never chosen
    (torch ranks it highest): a drafter's candidates only, which the verify judges whatever they are."""
    if x.dtype != torch.bfloat16 or x.device.type != "cpu" or x.requires_grad or torch.compiler.is_compiling() \
            or not 0 < k <= x.shape[-1]:
        return None
    compiled = kernels()
    if compiled is None:
        return None
    return compiled.topk(x.contiguous(), k)


def dyn_conv(x: torch.Tensor, delta: torch.Tensor, base: torch.Tensor, group_size: int,
             residual: torch.Tensor | None = None) -> torch.Tensor | None:
    """DFlash2's one-block-a-row dynamic convolution with its coefficients base + delta formed inside the loop
    (pdraft.models.dflash2.conv): x [B, S, D]; delta [B, S, taps, groups] (groups contiguous); base [taps, D];
    residual [B, S, D] or None (added after the convolution's rounding, as `x + conv` rounds) -> [B, S, D], or
    None where it does not apply (not all bfloat16 on a CPU, a gradient, a trace, no compiled loops, or groups
    not contiguous)."""
    tensors = (x, delta, base) + (() if residual is None else (residual,))
    if torch.is_grad_enabled() or torch.compiler.is_compiling() or delta.stride(-1) != 1 or any(
            t.dtype != torch.bfloat16 or t.device.type != "cpu" for t in tensors):
        return None
    compiled = kernels()
    if compiled is None:
        return None
    x, base = x.contiguous(), base.contiguous()
    residual = None if residual is None else residual.contiguous()
    out = torch.empty_like(x)
    b, s, d = x.shape
    compiled.lib.dyn_conv_bf16(x.data_ptr(), delta.data_ptr(), base.data_ptr(),
                               None if residual is None else residual.data_ptr(), out.data_ptr(), b, s, d,
                               delta.shape[2], group_size, delta.stride(0), delta.stride(1), delta.stride(2))
    return out


def qkv_block(qkv: torch.Tensor, heads: int, kv_heads: int, q_norm, k_norm, cos: torch.Tensor, sin: torch.Tensor,
              ctx_k: torch.Tensor, ctx_v: torch.Tensor):
    """A drafter block's attention inputs from its q|k|v product in one compiled loop: qkv [B, S, (H + 2G) D];
    q_norm / k_norm the per-head RMSNorm modules; cos / sin the pass's rotary tables (pdraft.models.layers.Rope:
    [B, 1, S, D], the sine signed); ctx_k / ctx_v [B, G, T, D] the cached context -> (q [B, H, S, D], k and v
    [B, G, T + S, D]: the context followed by the block), or None where it does not apply (not all bfloat16 on a
    CPU, a gradient, a trace, no compiled loops, or a layout it does not read)."""
    tensors = (qkv, q_norm.weight, k_norm.weight, cos, sin, ctx_k, ctx_v)
    if torch.is_grad_enabled() or torch.compiler.is_compiling() or any(
            t.dtype != torch.bfloat16 or t.device.type != "cpu" for t in tensors):
        return None
    b, s, width = qkv.shape
    d = width // (heads + 2 * kv_heads)
    t = ctx_k.shape[2]
    if d > 512 or d % 2 or ctx_k.stride(-1) != 1 or ctx_k.stride(-2) != d or ctx_v.stride(-1) != 1 \
            or ctx_v.stride(-2) != d or not (cos.is_contiguous() and sin.is_contiguous()) \
            or cos.shape[0] != b or cos.shape[-2:] != (s, d) or q_norm.eps != k_norm.eps:
        return None
    compiled = kernels()
    if compiled is None:
        return None
    qkv = qkv.contiguous()
    q = torch.empty(b, heads, s, d, dtype=torch.bfloat16)
    k = torch.empty(b, kv_heads, t + s, d, dtype=torch.bfloat16)
    v = torch.empty(b, kv_heads, t + s, d, dtype=torch.bfloat16)
    compiled.lib.qkv_block_bf16(qkv.data_ptr(), q_norm.weight.data_ptr(), k_norm.weight.data_ptr(),
                                float(q_norm.eps), cos.data_ptr(), sin.data_ptr(), ctx_k.data_ptr(), ctx_v.data_ptr(),
                                ctx_k.stride(0), ctx_k.stride(1), ctx_v.stride(0), ctx_v.stride(1), q.data_ptr(),
                                k.data_ptr(), v.data_ptr(), b, s, heads, kv_heads, d, t)
    return q, k, v


def kernels() -> Gemv | None:
    """The compiled bfloat16 product, or None (no AVX-512 BF16, no compiler, or PDRAFT_CPU_KERNELS=0)."""
    return None if cc.disabled() else load()[0]


def status() -> str:
    return f"{cc.ENV}=0: bfloat16 products stay in torch" if cc.disabled() else load()[1]


__all__ = ["SYMBOLS", "Gemv", "dyn_conv", "kernels", "load", "qkv_block", "rms_norm", "status", "topk"]
