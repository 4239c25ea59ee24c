/* The panel16 kernels (p16_kernels.h) in AVX-512: a panel element's 16 rows are one __m512, so
 * a weight vector costs one conversion and one FMA per token where AVX2 takes two, and the 32
 * registers hold 12-token GEMM tiles. Each lane computes what the AVX2 kernels' lane computes,
 * in the same order, so the results are the same bits (tests/unit/test_matmul.c). This file
 * alone is compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq (CMakeLists.txt); matmul.c
 * calls it only where the CPU has them (pgd_cpu_avx512). */
#include "backend/cpu/matmul.h"

#if defined(PGD_AVX512_KERNELS) && defined(__AVX512F__) && defined(__AVX512BW__) &&              \
    defined(__AVX512VL__) && defined(__AVX512DQ__)
#include <immintrin.h>
#include <stdbool.h>
#include <string.h>

#include "backend/cpu/p16_layout.h"

#define INLINE static inline __attribute__((always_inline))

typedef __m512 v16;
typedef __m512 vb;
#ifndef P16_NT
#define P16_NT 12   /* tokens per GEMM tile: 12 accumulators of the 32 registers */
#endif
#define P16_ALIGN 64
INLINE v16 v16_zero(void) { return _mm512_setzero_ps(); }
INLINE v16 v16_load(const float *p) { return _mm512_load_ps(p); }
INLINE void v16_store(float *p, v16 v) { _mm512_store_ps(p, v); }
INLINE v16 v16_fma(v16 a, v16 b, v16 c) { return _mm512_fmadd_ps(a, b, c); }
INLINE v16 v16_fmab(v16 a, vb b, v16 c) { return _mm512_fmadd_ps(a, b, c); }
INLINE vb vb_bcast(const float *p) { return _mm512_set1_ps(*p); }
INLINE vb vb_set1(float v) { return _mm512_set1_ps(v); }
INLINE v16 v16_mul(v16 a, v16 b) { return _mm512_mul_ps(a, b); }
INLINE v16 v16_muls(v16 a, float f) { return _mm512_mul_ps(a, _mm512_set1_ps(f)); }
INLINE v16 v16_neg(v16 a) { return _mm512_xor_ps(a, _mm512_set1_ps(-0.0f)); }
INLINE v16 v16_f16(const void *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
INLINE v16 v16_u8(__m128i b) { return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(b)); }
INLINE v16 v16_i8(__m128i b) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)); }

/* Q8_0: the quants q[k][0..15] of element k of panel block qb widened (exact integers). */
INLINE v16 p16_w_q8(const uint8_t *qb, int k) {
    return v16_i8(_mm_loadu_si128((const __m128i *)(qb + 32 + k * 16)));
}
/* The 16 rows' quants of one element k at q: 8 bytes of nibbles (rows i and 8 + i in byte i),
 * for five-bit types then a 16-bit word with row r's fifth bit at bit r. The nibbles are split
 * in a 128-bit register (low ones, then high ones: rows 0..15) and widened once. */
INLINE __m512i p16_nib16(const uint8_t *q) {
    const __m128i b = _mm_loadl_epi64((const __m128i *)q), m4 = _mm_set1_epi8(15);
    return _mm512_cvtepu8_epi32(
        _mm_unpacklo_epi64(_mm_and_si128(b, m4), _mm_and_si128(_mm_srli_epi16(b, 4), m4)));
}
INLINE v16 p16_w_nib(const uint8_t *q, const bool five) {
    __m512i n = p16_nib16(q);
    if (five) { /* row r's bit r to bit 4 */
        uint16_t hw;
        memcpy(&hw, q + 8, 2);
        const __m512i v = _mm512_set1_epi32((int)hw << 4);
        const __m512i sh = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        n = _mm512_or_si512(n, _mm512_and_si512(_mm512_srlv_epi32(v, sh), _mm512_set1_epi32(0x10)));
    }
    return _mm512_cvtepi32_ps(n);
}
/* Q6_K: the 16 rows' q (0..63, exact) of element k (0..255) of panel super-block sb: Q4_K's
 * nibbles, and a 32-bit word with row r's two high bits at bits 2r, 2r + 1 (moved to bits 4, 5:
 * rows 0..7 from the word << 4, rows 8..15 from the word). */
INLINE v16 p16_w_q6k(const uint8_t *sb, int k) {
    const uint8_t *q = sb + P16_Q6K_Q + 12 * k;
    int32_t hw;
    memcpy(&hw, q + 8, 4);
    const __m512i pre = _mm512_setr_epi32(4, 4, 4, 4, 4, 4, 4, 4, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512i sh = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 12, 14, 16, 18, 20, 22, 24, 26);
    __m512i h = _mm512_srlv_epi32(_mm512_sllv_epi32(_mm512_set1_epi32(hw), pre), sh);
    h = _mm512_and_si512(h, _mm512_set1_epi32(0x30));
    return _mm512_cvtepi32_ps(_mm512_or_si512(p16_nib16(q), h));
}
/* Q3_K: the 16 rows' u (0..7, exact) of element k (0..255) of panel super-block sb: a 32-bit
 * word with row r's low bits at 2r, 2r + 1, and a 16-bit word with its high bit at r. */
INLINE v16 p16_w_q3k(const uint8_t *sb, int k) {
    int32_t lw;
    uint16_t hw;
    p16_q3k_words(sb, k, &lw, &hw);
    const __m512i s2 = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i s1 = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512i lo = _mm512_and_si512(_mm512_srlv_epi32(_mm512_set1_epi32(lw), s2),
                                  _mm512_set1_epi32(3));
    __m512i hi = _mm512_and_si512(_mm512_srlv_epi32(_mm512_set1_epi32((int)hw << 2), s1),
                                  _mm512_set1_epi32(4));
    return _mm512_cvtepi32_ps(_mm512_or_si512(lo, hi));
}

#define P16_GEMM_ONLY /* the GEMV and few-token kernels stay AVX2 (matmul.c) */
#include "backend/cpu/p16_kernels.h"

void pgd_p16_gemm_avx512(pgd_type t, const void *P, const float *x, float *y, size_t K,
                         size_t N, int n, long lo, long hi, const float *xs, size_t xss) {
    p16_gemm(t, P, x, y, K, N, n, lo, hi, xs, xss);
}
#endif
