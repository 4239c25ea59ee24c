/* Internal to quant.c and matmul.c: AVX2+FMA+F16C register tiles computing quantized weight rows
 * (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS) against F32
 * activations. Each 32-element group of a row is
 * dequantized in registers, bit-identically to pgd_dequantize_row, then used for every token of
 * the tile. One 8-lane accumulator per (row, token) takes the same FMA sequence, group after
 * group, whatever the tile shape: pgd_vec_dot (a 1x1 tile) and every matmul tile agree bit for
 * bit, and a row's result never depends on n or its neighbours. */
#ifndef PGD_BACKEND_CPU_QUANT_F32ACT_H
#define PGD_BACKEND_CPU_QUANT_F32ACT_H

#include <stdint.h>

/* Format pieces the scalar decoders (quant.c) and the register ones below share. */
/* Q2_K/Q3_K-style scale i (0..15) of 12 packed bytes, 6 bits less 32: low 4 bits from byte i
 * (i < 8) or the high half of byte i - 8, high 2 bits from byte 8 + i % 4 (ggml's kmask
 * unpacking, one scale at a time). */
static inline int pgd__q3k_scale(const uint8_t *sc, int i) {
    int lo = i < 8 ? sc[i] & 0xF : sc[i - 8] >> 4;
    return (lo | ((sc[8 + i % 4] >> (2 * (i / 4))) & 3) << 4) - 32;
}
/* The 16 values of IQ4_NL's (and IQ4_XS's) non-linear 4-bit grid: the format's constants. */
static const int8_t pgd__iq4nl_grid[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                           1,    13,   25,  38,  53,  69,  89,  113};

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define PGD_F32ACT_SIMD 1

#include <immintrin.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "backend/cpu/simd.h"
#include "core/types.h"

#define PGD_F32ACT_R 4 /* rows per tile, at most */
#define PGD_F32ACT_T 3 /* tokens per tile, at most (12 accumulators + the dequantized vector) */

typedef struct pgd__f32act_tile {
    const uint8_t *w; /* first weight row; rows w_stride bytes apart */
    size_t w_stride;
    const float *x;   /* first token's activations; tokens x_stride floats apart */
    size_t x_stride;
    float *y;         /* y[t * y_stride + r] */
    size_t y_stride;
    int64_t n;        /* elements per row (a multiple of the type's block) */
} pgd__f32act_tile;

#define PGD_F32ACT_INLINE static inline __attribute__((always_inline))

PGD_F32ACT_INLINE float pgd__f32act_h(const uint8_t *p) { return _cvtsh_ss(pgd_ld_u16(p)); }
/* The two fp16 values at p and p + 2 as floats in lanes 0 and 1: one 32-bit load and one
 * conversion (vpinsrw + vcvtph2ps per half cost two vector-pipe uops more). */
PGD_F32ACT_INLINE __m128 pgd__f32act_h2(const uint8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm_cvtph_ps(_mm_cvtsi32_si128(v));
}
/* 8 bytes at p, each widened to an int32 lane (unsigned / signed). */
PGD_F32ACT_INLINE __m256i pgd__f32act_u8x8(const uint8_t *p) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
}
PGD_F32ACT_INLINE __m256i pgd__f32act_i8x8(const uint8_t *p) {
    return _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p));
}

/* pgd__iq4nl_grid at the lanes' 4-bit indices: two 8-entry permutes, chosen by the index's
 * bit 3. */
PGD_F32ACT_INLINE __m256 pgd__f32act_iq4(__m256i idx) {
    const __m256 lo = _mm256_cvtepi32_ps(pgd__f32act_i8x8((const uint8_t *)pgd__iq4nl_grid));
    const __m256 hi = _mm256_cvtepi32_ps(pgd__f32act_i8x8((const uint8_t *)pgd__iq4nl_grid + 8));
    return _mm256_blendv_ps(_mm256_permutevar8x32_ps(lo, idx), _mm256_permutevar8x32_ps(hi, idx),
                            _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)));
}

/* Dequantizes group g (elements 32g .. 32g+31) of a row of type t into w[0..3]. The float
 * operations are those of pgd_dequantize_row (products of fp16 scales and small integers are
 * exact, so an FMA rounds exactly where its separate multiply-add rounds). */
PGD_F32ACT_INLINE void pgd__f32act_deq32(const pgd_type t, const uint8_t *row, int64_t g,
                                         __m256 w[4]) {
    const __m256i m4 = _mm256_set1_epi32(0xF);
    switch (t) {
    case PGD_TYPE_Q8_0: {
        const uint8_t *b = row + g * 34;
        __m256 d = _mm256_broadcastss_ps(pgd__f32act_h2(b));
        for (int k = 0; k < 4; k++)
            w[k] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(pgd__f32act_i8x8(b + 2 + 8 * k)));
        return;
    }
    case PGD_TYPE_Q4_0: case PGD_TYPE_Q4_1: case PGD_TYPE_Q5_0: case PGD_TYPE_Q5_1: {
        /* d [m] [qh: bit i is element i's fifth bit] qs[16]; without m, q less 8 (16) */
        const bool hm = t == PGD_TYPE_Q4_1 || t == PGD_TYPE_Q5_1;
        const bool q5 = t == PGD_TYPE_Q5_0 || t == PGD_TYPE_Q5_1;
        const uint8_t *b = row + g * (18 + 2 * hm + 4 * q5), *qs = b + 2 + 2 * hm + 4 * q5;
        const __m128 dm = pgd__f32act_h2(b); /* d, and m when hm */
        __m256 d = _mm256_broadcastss_ps(dm);
        __m256i v0 = pgd__f32act_u8x8(qs), v1 = pgd__f32act_u8x8(qs + 8);
        __m256i q[4] = {_mm256_and_si256(v0, m4), _mm256_and_si256(v1, m4),
                        _mm256_srli_epi32(v0, 4), _mm256_srli_epi32(v1, 4)};
        if (q5) {
            uint32_t qh32;
            memcpy(&qh32, b + 2 + 2 * hm, 4);
            const __m256i qh = _mm256_set1_epi32((int)qh32), one = _mm256_set1_epi32(1);
            const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            for (int k = 0; k < 4; k++) {
                __m256i h = _mm256_srlv_epi32(qh, _mm256_add_epi32(lane, _mm256_set1_epi32(8 * k)));
                q[k] = _mm256_or_si256(q[k], _mm256_slli_epi32(_mm256_and_si256(h, one), 4));
            }
        }
        if (hm) {
            __m256 m = _mm256_broadcastss_ps(_mm_movehdup_ps(dm));
            for (int k = 0; k < 4; k++) w[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q[k]), d, m);
        } else {
            const __m256i off = _mm256_set1_epi32(q5 ? 16 : 8);
            for (int k = 0; k < 4; k++)
                w[k] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(q[k], off)), d);
        }
        return;
    }
    case PGD_TYPE_IQ4_NL: case PGD_TYPE_IQ4_XS: {
        const uint8_t *qs;
        float dl;
        if (t == PGD_TYPE_IQ4_NL) {
            const uint8_t *b = row + g * 18;
            qs = b + 2;
            dl = pgd__f32act_h(b);
        } else { /* dl = d * (6-bit scale - 32), rounded once as in pgd_dequantize_row */
            const uint8_t *b = row + (g >> 3) * 136;
            const int ib = (int)(g & 7);
            uint16_t sh;
            memcpy(&sh, b + 2, 2);
            int ls = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 0xF) | ((sh >> (2 * ib)) & 3) << 4;
            qs = b + 8 + 16 * ib;
            dl = pgd__f32act_h(b) * (float)(ls - 32);
        }
        __m256 d = _mm256_set1_ps(dl);
        __m256i v0 = pgd__f32act_u8x8(qs), v1 = pgd__f32act_u8x8(qs + 8);
        __m256i q[4] = {_mm256_and_si256(v0, m4), _mm256_and_si256(v1, m4),
                        _mm256_srli_epi32(v0, 4), _mm256_srli_epi32(v1, 4)};
        for (int k = 0; k < 4; k++) w[k] = _mm256_mul_ps(d, pgd__f32act_iq4(q[k]));
        return;
    }
    case PGD_TYPE_Q2_K: case PGD_TYPE_Q3_K: {
        /* Group j of 8 in a super-block: half j / 4, 2-bit shift 2 (j % 4); elements 0..15 take
         * scale 2j, 16..31 scale 2j + 1 (quant.c's order). */
        const bool q3 = t == PGD_TYPE_Q3_K;
        const uint8_t *b = row + (g >> 3) * (q3 ? 110 : 84);
        const int j = (int)(g & 7), half = j >> 2;
        const uint8_t *qs = b + (q3 ? 32 : 16) + 32 * half;
        const __m128i sh = _mm_cvtsi32_si128(2 * (j & 3));
        const __m256i m2 = _mm256_set1_epi32(3);
        const float d = pgd__f32act_h(b + (q3 ? 108 : 80));
        __m256 dl[2], ml[2];
        for (int s = 0; s < 2; s++) {
            if (q3) {
                dl[s] = _mm256_set1_ps(d * (float)pgd__q3k_scale(b + 96, 2 * j + s));
                ml[s] = _mm256_setzero_ps(); /* unused */
            } else {
                const int sc = b[2 * j + s];
                dl[s] = _mm256_set1_ps(d * (float)(sc & 0xF));
                ml[s] = _mm256_set1_ps(-(pgd__f32act_h(b + 82) * (float)(sc >> 4)));
            }
        }
        const __m128i hsh = _mm_cvtsi32_si128(j); /* Q3_K: hmask bit 4 half + j % 4 = j */
        for (int k = 0; k < 4; k++) {
            __m256i q = _mm256_and_si256(_mm256_srl_epi32(pgd__f32act_u8x8(qs + 8 * k), sh), m2);
            if (q3) { /* minus 4 where the hmask bit is clear */
                __m256i h = _mm256_and_si256(_mm256_srl_epi32(pgd__f32act_u8x8(b + 8 * k), hsh),
                                             _mm256_set1_epi32(1));
                q = _mm256_sub_epi32(q, _mm256_slli_epi32(_mm256_xor_si256(h, _mm256_set1_epi32(1)),
                                                          2));
            }
            w[k] = q3 ? _mm256_mul_ps(dl[k >> 1], _mm256_cvtepi32_ps(q)) /* -0 kept */
                      : _mm256_fmadd_ps(dl[k >> 1], _mm256_cvtepi32_ps(q), ml[k >> 1]);
        }
        return;
    }
    case PGD_TYPE_Q4_K: case PGD_TYPE_Q5_K: {
        const bool q5 = t == PGD_TYPE_Q5_K;
        const uint8_t *b = row + (g >> 3) * (q5 ? 176 : 144);
        const int j = (int)(g & 7);
        const uint8_t *sc6 = b + 4, *qs = b + (q5 ? 48 : 16) + 32 * (j >> 1);
        int sc, mn; /* ggml's get_scale_min_k4 */
        if (j < 4) {
            sc = sc6[j] & 63;
            mn = sc6[j + 4] & 63;
        } else {
            sc = (sc6[j + 4] & 0xF) | ((sc6[j - 4] >> 6) << 4);
            mn = (sc6[j + 4] >> 4) | ((sc6[j] >> 6) << 4);
        }
        __m256 d = _mm256_set1_ps(pgd__f32act_h(b) * (float)sc);
        __m256 nm = _mm256_set1_ps(-(pgd__f32act_h(b + 2) * (float)mn));
        const __m128i sh = _mm_cvtsi32_si128(4 * (j & 1)), hsh = _mm_cvtsi32_si128(j);
        for (int k = 0; k < 4; k++) {
            __m256i q = _mm256_and_si256(_mm256_srl_epi32(pgd__f32act_u8x8(qs + 8 * k), sh), m4);
            if (q5) {
                __m256i h = _mm256_srl_epi32(pgd__f32act_u8x8(b + 16 + 8 * k), hsh);
                q = _mm256_or_si256(q, _mm256_slli_epi32(_mm256_and_si256(h, _mm256_set1_epi32(1)),
                                                         4));
            }
            w[k] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(q), nm);
        }
        return;
    }
    case PGD_TYPE_Q6_K: {
        const uint8_t *b = row + (g >> 3) * 210;
        const int c = (int)((g >> 2) & 1), k4 = (int)(g & 3);
        const uint8_t *ql = b + 64 * c + 32 * (k4 & 1), *qh = b + 128 + 32 * c;
        const int8_t *sc = (const int8_t *)(b + 192 + 8 * c + 2 * k4);
        float d = pgd__f32act_h(b + 208);
        __m256 ds0 = _mm256_set1_ps(d * (float)sc[0]), ds1 = _mm256_set1_ps(d * (float)sc[1]);
        const __m128i sh = _mm_cvtsi32_si128(4 * (k4 >> 1)), hsh = _mm_cvtsi32_si128(2 * k4);
        const __m256i m2 = _mm256_set1_epi32(3), o32 = _mm256_set1_epi32(32);
        for (int k = 0; k < 4; k++) {
            __m256i lo = _mm256_and_si256(_mm256_srl_epi32(pgd__f32act_u8x8(ql + 8 * k), sh), m4);
            __m256i hi = _mm256_and_si256(_mm256_srl_epi32(pgd__f32act_u8x8(qh + 8 * k), hsh), m2);
            __m256i q = _mm256_sub_epi32(_mm256_or_si256(lo, _mm256_slli_epi32(hi, 4)), o32);
            w[k] = _mm256_mul_ps(k < 2 ? ds0 : ds1, _mm256_cvtepi32_ps(q));
        }
        return;
    }
    default: for (int k = 0; k < 4; k++) w[k] = _mm256_setzero_ps(); return;
    }
}

/* y[t][r] = sum_i w_r[i] * x_t[i] for NR rows x NT tokens; t, NR and NT are compile-time
 * constants in every instantiation. Per (row, token): acc = fma(w8, x8, acc) for each 8 elements
 * in order, then one fixed horizontal tree. */
PGD_F32ACT_INLINE void pgd__f32act_tile_run(const pgd__f32act_tile *g, const pgd_type t,
                                            const int NR, const int NT) {
    const int64_t ng = g->n / 32;
    __m256 acc[PGD_F32ACT_R][PGD_F32ACT_T];
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 3
        for (int j = 0; j < NT; j++) acc[r][j] = _mm256_setzero_ps();
    const pgd_prefetch pf = pgd_prefetch_init(g->w, (size_t)NR * g->w_stride, ng);
    for (int64_t gi = 0; gi < ng; gi++) {
        pgd_prefetch_step(&pf, gi);
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            __m256 w[4];
            pgd__f32act_deq32(t, g->w + (size_t)r * g->w_stride, gi, w);
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++)
#pragma GCC unroll 3
                for (int j = 0; j < NT; j++)
                    acc[r][j] = _mm256_fmadd_ps(
                        w[k], _mm256_loadu_ps(g->x + (size_t)j * g->x_stride + gi * 32 + 8 * k),
                        acc[r][j]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 3
        for (int j = 0; j < NT; j++)
            g->y[(size_t)j * g->y_stride + r] = pgd_hsum8(acc[r][j]);
}

#endif /* __AVX2__ && __FMA__ && __F16C__ */
#endif
