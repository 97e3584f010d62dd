"""A bfloat16 product of a few rows by a fixed weight as one C loop over AVX-512 BF16 dot products, compiled once
per machine (pdraft.kernels.cc; issue 38).

On the Intel Xeon with AMX these machines have, every bfloat16 `F.linear` through oneDNN costs 20-40 us at one
row whatever the weight's size (a fixed cost per call: the kernel's setup, its threads), against 3-12 us for this
loop on one thread over the target's products (256 x 256 to 1536 x 256). A target step is 17 such products, so in
bfloat16 the target alone ran slower than in float32 (MKL's one-row product is 5-14 us). The loop reads each
weight row once per output row, so it only pays at one or two rows; `pdraft.gemm.FastLinear` offers it beside
MKL and oneDNN and keeps whichever measures fastest at each row count.

Sums run in float32 (products of bfloat16 pairs are exact in float32), sixteen lanes at a time, and the output is
rounded to the nearest bfloat16 (ties to even) after the bias is added: the same arithmetic as oneDNN's, in an
order of its own, so a value can differ in its last bit from another backend's (pdraft.gemm's docstring says what
the target's output means then). Without AVX-512 BF16 (or a compiler, or with PDRAFT_CPU_KERNELS=0) `kernels()`
is None."""

from __future__ import annotations

import ctypes

import torch

from pdraft.kernels import cc

SOURCE = r"""
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
#else
int gemv_available(void) { return 0; }
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


def _load() -> tuple[Gemv | None, str]:
    lib, why = cc.build("gemv", SOURCE)
    if lib is None:
        return None, why
    gemv = Gemv(lib)
    if not gemv.lib.gemv_available():
        return None, "this CPU (or compiler) has no AVX-512 BF16: bfloat16 products stay in torch"
    return gemv, why


def kernels() -> Gemv | None:
    """The compiled bfloat16 product, or None (no AVX-512 BF16, no compiler, or PDRAFT_CPU_KERNELS=0)."""
    return None if cc.disabled() else _load()[0]


def status() -> str:
    return f"{cc.ENV}=0: bfloat16 products stay in torch" if cc.disabled() else _load()[1]


__all__ = ["Gemv", "kernels", "status"]
