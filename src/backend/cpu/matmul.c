/* Matrix products: output rows are split across the pool. By default every weight type runs on
 * F32 activations through register tiles (up to 4 rows x 3 tokens, each weight block loaded -
 * and for quantized types dequantized in registers - once per tile; quant_f32act.h). With int8
 * activations (pgd_cpu_int8_act) activations are first converted once per call into the weight's
 * dot-product format; Q8_0/Q4_0/Q4_1 then use integer tiles and the K-quants one pgd_vec_dot per
 * (row, token).
 *
 * Batch invariance: every (row, token) pair owns one accumulator that takes exactly the same
 * instruction sequence, block after block, whatever the tile shape it is computed in; so row t of
 * y is bit-identical for any n and any neighbouring rows (tests/unit/test_matmul.c). */
#include "backend/cpu/matmul.h"

#include <stdlib.h>
#include <string.h>

#include "backend/cpu/quant.h"
#include "backend/cpu/simd.h"
#include "backend/cpu/quant_f32act.h"
#include "util/status.h"

#ifdef __AVX2__
#include <immintrin.h>
#endif

static inline bool is_quant_type(pgd_type t) {
    return t != PGD_TYPE_F32 && t != PGD_TYPE_F16 && t != PGD_TYPE_BF16;
}

/* quant.c's activation block for Q4_0/Q4_1/Q8_0 weights: float d | int32 sum | int8 qs[32]. */
#define ACT_Q8_BYTES 40
#define Q8_0_BYTES 34
#define Q4_0_BYTES 18
#define Q4_1_BYTES 20
#define TILE_R 4 /* weight rows per register tile */
#define TILE_T 6 /* tokens per register tile (at most) */
/* Tokens whose activations stay in L2 while a thread sweeps its rows over them. */
#define ACT_L2_BYTES (192 * 1024)

static bool tiled_type(pgd_type t) {
#ifdef PGD_F32ACT_SIMD
    if (is_quant_type(t) && pgd_vec_dot_type(t) == PGD_TYPE_F32) return true;
#endif
#ifdef __AVX2__
    switch (t) {
    case PGD_TYPE_Q8_0: case PGD_TYPE_Q4_0: case PGD_TYPE_Q4_1:
    case PGD_TYPE_F32: case PGD_TYPE_F16: case PGD_TYPE_BF16: return true;
    default: return false;
    }
#else
    (void)t;
    return false;
#endif
}

/* Activation row layout: pgd_quantize_act's blocks, then for Q4_1 one float per block,
 * d * sum (the term Q4_1's offset m multiplies), so the tiles can sum it 8 blocks at a time. */
static size_t act_ds_offset(const pgd_weight *w) {
    return (pgd_vec_dot_act_bytes(w->type, w->n_in) + 31) / 32 * 32;
}

size_t pgd_cpu_matmul_act_row_bytes(const pgd_weight *w) {
    size_t b = pgd_vec_dot_act_bytes(w->type, w->n_in);
    if (w->type == PGD_TYPE_Q4_1 && pgd_vec_dot_type(w->type) == PGD_TYPE_Q8_0)
        b = act_ds_offset(w) + (size_t)(w->n_in / 32) * sizeof(float);
    return (b + 63) / 64 * 64;
}

static void quantize_row(const pgd_weight *w, const float *x, unsigned char *act) {
    pgd_quantize_act(w->type, x, act, w->n_in);
    if (w->type == PGD_TYPE_Q4_1 && pgd_vec_dot_type(w->type) == PGD_TYPE_Q8_0) {
        float *ds = (float *)(act + act_ds_offset(w));
        for (int64_t b = 0; b < w->n_in / 32; b++) {
            float d;
            int32_t sum;
            memcpy(&d, act + b * ACT_Q8_BYTES, 4);
            memcpy(&sum, act + b * ACT_Q8_BYTES + 4, 4);
            ds[b] = d * (float)sum;
        }
    }
}

/* ---- Register tiles ------------------------------------------------------------------------
 * A tile computes y[t][r] for NR rows x NT tokens. NR and NT are compile-time constants in every
 * instantiation (always_inline + constant arguments), so acc[][] lives in registers. */
#ifdef __AVX2__

typedef struct tile {
    const uint8_t *w;   /* first weight row of the tile; rows w_stride apart */
    size_t w_stride;
    const uint8_t *a;   /* first token's activation row; rows a_stride apart */
    size_t a_stride;
    float *y;           /* y[t * y_stride + r] */
    size_t y_stride;
    int64_t n;          /* elements per row */
    size_t ds_off;      /* Q4_1: offset of the d * sum floats in an activation row */
    bool prefetch;      /* w streams from memory (not a panel in L1): prefetch ahead */
} tile;

#define INLINE static inline __attribute__((always_inline))

INLINE uint16_t ld16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}
INLINE float ldf(const uint8_t *p) {
    float v;
    memcpy(&v, p, 4);
    return v;
}
/* Hides that v is a broadcast: otherwise GCC turns each per-pair vmulps of two broadcasts into
 * vmulss + vbroadcastss (same bits, one more instruction per pair). */
INLINE __m256 opaque(__m256 v) {
    __asm__("" : "+x"(v));
    return v;
}
INLINE __m256 bcast_f16(const uint8_t *p) { return _mm256_set1_ps(_cvtsh_ss(ld16(p))); }
/* 32 nibbles of a Q4 block as bytes: low nibbles (elements 0..15), then high (16..31). */
INLINE __m256i nibbles32(const uint8_t *qs) {
    __m128i t = _mm_loadu_si128((const __m128i *)qs);
    __m256i b = _mm256_set_m128i(_mm_srli_epi16(t, 4), t);
    return _mm256_and_si256(b, _mm256_set1_epi8(0xF));
}

/* Q8_0 and Q4_0 (signed weights): per (row, token) and block,
 *   acc += (d_w * d_a) * float(sum of w * a in 8 lanes)  (one FMA; products exact in int32). */
INLINE void tile_q8(const tile *g, const int NR, const int NT, const bool q4) {
    const __m256i ones = _mm256_set1_epi16(1), off = _mm256_set1_epi8(8);
    const int64_t nb = g->n / 32;
    const int bsz = q4 ? Q4_0_BYTES : Q8_0_BYTES;
    __m256 acc[TILE_R][TILE_T];
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 6
        for (int t = 0; t < NT; t++) acc[r][t] = _mm256_setzero_ps();
    const pgd_prefetch pf = pgd_prefetch_init(g->w, (size_t)NR * g->w_stride, nb);
    for (int64_t b = 0; b < nb; b++) {
        pgd_prefetch_step(&pf, b);
        __m256i aq[TILE_T];
        __m256 da[TILE_T];
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) {
            const uint8_t *ab = g->a + (size_t)t * g->a_stride + (size_t)b * ACT_Q8_BYTES;
            da[t] = opaque(_mm256_set1_ps(ldf(ab)));
            aq[t] = _mm256_loadu_si256((const __m256i *)(ab + 8));
        }
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            const uint8_t *wb = g->w + (size_t)r * g->w_stride + (size_t)b * bsz;
            __m256i wq = q4 ? _mm256_sub_epi8(nibbles32(wb + 2), off)
                            : _mm256_loadu_si256((const __m256i *)(wb + 2));
            __m256i aw = _mm256_sign_epi8(wq, wq);
            __m256 dw = bcast_f16(wb);
#pragma GCC unroll 4
            for (int t = 0; t < NT; t++) {
                __m256i p = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(aq[t], wq));
                p = _mm256_madd_epi16(p, ones);
                acc[r][t] =
                    _mm256_fmadd_ps(_mm256_mul_ps(dw, da[t]), _mm256_cvtepi32_ps(p), acc[r][t]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 6
        for (int t = 0; t < NT; t++) g->y[(size_t)t * g->y_stride + r] = pgd_hsum8(acc[r][t]);
}

/* Sum over blocks of m_w[b] * ds_a[b] for Q4_1: lane l takes blocks = l (mod 8), 8 at a time,
 * then the remaining blocks one by one in order (a fixed order for a given n). */
#define Q41_CHUNK 64 /* blocks whose offsets m are staged as floats (a multiple of 8) */

/* Q4_1 (unsigned nibbles q, value q * d + m): acc += (d_w * d_a) * float(sum q * a) per block,
 * plus the offset term sum_b m_b * (d_a * sum a)_b, vectorised over blocks in chunks. */
INLINE void tile_q4_1(const tile *g, const int NR, const int NT) {
    const __m256i ones = _mm256_set1_epi16(1);
    const int64_t nb = g->n / 32, nb8 = nb / 8 * 8;
    __m256 acc[TILE_R][TILE_T], accm[TILE_R][TILE_T];
    float tailm[TILE_R][TILE_T];
    float mf[TILE_R][Q41_CHUNK] __attribute__((aligned(32)));
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) {
            acc[r][t] = accm[r][t] = _mm256_setzero_ps();
            tailm[r][t] = 0.0f;
        }
    const pgd_prefetch pf = pgd_prefetch_init(g->w, (size_t)NR * g->w_stride, nb);
    for (int64_t b0 = 0; b0 < nb; b0 += Q41_CHUNK) {
        int64_t b1 = b0 + Q41_CHUNK < nb ? b0 + Q41_CHUNK : nb;
        for (int64_t b = b0; b < b1; b++) {
            pgd_prefetch_step(&pf, b);
            __m256i aq[TILE_T];
            __m256 da[TILE_T];
#pragma GCC unroll 4
            for (int t = 0; t < NT; t++) {
                const uint8_t *ab = g->a + (size_t)t * g->a_stride + (size_t)b * ACT_Q8_BYTES;
                da[t] = opaque(_mm256_set1_ps(ldf(ab)));
                aq[t] = _mm256_loadu_si256((const __m256i *)(ab + 8));
            }
#pragma GCC unroll 4
            for (int r = 0; r < NR; r++) {
                const uint8_t *wb = g->w + (size_t)r * g->w_stride + (size_t)b * Q4_1_BYTES;
                __m256i wq = nibbles32(wb + 4);
                __m256 dw = bcast_f16(wb);
                mf[r][b - b0] = _cvtsh_ss(ld16(wb + 2));
#pragma GCC unroll 4
                for (int t = 0; t < NT; t++) {
                    __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(wq, aq[t]), ones);
                    acc[r][t] = _mm256_fmadd_ps(_mm256_mul_ps(dw, da[t]), _mm256_cvtepi32_ps(p),
                                                acc[r][t]);
                }
            }
        }
        /* Offset term of this chunk: full groups of 8 blocks, then the tail (last chunk only). */
        int64_t g8 = (b1 < nb8 ? b1 : nb8);
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) {
            const float *ds = (const float *)(g->a + (size_t)t * g->a_stride + g->ds_off);
#pragma GCC unroll 4
            for (int r = 0; r < NR; r++) {
                __m256 m = accm[r][t];
                for (int64_t b = b0; b < g8; b += 8)
                    m = _mm256_fmadd_ps(_mm256_load_ps(&mf[r][b - b0]), _mm256_loadu_ps(ds + b), m);
                accm[r][t] = m;
                float s = tailm[r][t];
                for (int64_t b = g8 > b0 ? g8 : b0; b < b1; b++)
                    s = _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(mf[r][b - b0]), _mm_set_ss(ds[b]),
                                                   _mm_set_ss(s)));
                tailm[r][t] = s;
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++)
            g->y[(size_t)t * g->y_stride + r] =
                pgd_hsum8(acc[r][t]) + (pgd_hsum8(accm[r][t]) + tailm[r][t]);
}

/* Float weights (F32, F16, BF16) with F32 activations: acc += w[i..i+8] * x[i..i+8] per pair,
 * then a scalar FMA tail for n % 8 elements. */
enum { WF32, WF16, WBF16 };
INLINE __m256 load8w(const uint8_t *p, const int kind) {
    if (kind == WF32) return _mm256_loadu_ps((const float *)p);
    if (kind == WF16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
}
INLINE float load1w(const uint8_t *p, const int kind) {
    if (kind == WF32) return ldf(p);
    if (kind == WF16) return _cvtsh_ss(ld16(p));
    return pgd_bf16_to_fp32(ld16(p));
}

INLINE void tile_float(const tile *g, const int NR, const int NT, const int kind) {
    const int esz = kind == WF32 ? 4 : 2;
    const int64_t n8 = g->n / 8 * 8;
    __m256 acc[TILE_R][TILE_T];
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 6
        for (int t = 0; t < NT; t++) acc[r][t] = _mm256_setzero_ps();
    const pgd_prefetch pf = pgd_prefetch_init(g->w, (size_t)NR * g->w_stride, g->n / 8);
    for (int64_t i = 0; i < n8; i += 8) {
        if (g->prefetch) pgd_prefetch_step(&pf, i / 8);
        /* Keep the smaller side of the tile in registers (16 ymm registers in all). */
        if (NT <= 3) {
            __m256 xv[TILE_T];
#pragma GCC unroll 6
            for (int t = 0; t < NT; t++)
                xv[t] = _mm256_loadu_ps((const float *)(g->a + (size_t)t * g->a_stride) + i);
#pragma GCC unroll 4
            for (int r = 0; r < NR; r++) {
                __m256 wv = load8w(g->w + (size_t)r * g->w_stride + (size_t)i * esz, kind);
#pragma GCC unroll 6
                for (int t = 0; t < NT; t++) acc[r][t] = _mm256_fmadd_ps(wv, xv[t], acc[r][t]);
            }
        } else {
            __m256 wv[TILE_R];
#pragma GCC unroll 4
            for (int r = 0; r < NR; r++)
                wv[r] = load8w(g->w + (size_t)r * g->w_stride + (size_t)i * esz, kind);
#pragma GCC unroll 6
            for (int t = 0; t < NT; t++) {
                __m256 xv = _mm256_loadu_ps((const float *)(g->a + (size_t)t * g->a_stride) + i);
#pragma GCC unroll 4
                for (int r = 0; r < NR; r++) acc[r][t] = _mm256_fmadd_ps(wv[r], xv, acc[r][t]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 6
        for (int t = 0; t < NT; t++) {
            const uint8_t *wr = g->w + (size_t)r * g->w_stride;
            const float *x = (const float *)(g->a + (size_t)t * g->a_stride);
            __m128 s = _mm_setzero_ps();
            for (int64_t i = n8; i < g->n; i++)
                s = _mm_fmadd_ss(_mm_set_ss(load1w(wr + (size_t)i * esz, kind)), _mm_set_ss(x[i]),
                                 s);
            /* No "+ 0" without a tail: the panel path must give the fused tiles' bits (-0.0). */
            g->y[(size_t)t * g->y_stride + r] =
                n8 == g->n ? pgd_hsum8(acc[r][t]) : pgd_hsum8(acc[r][t]) + _mm_cvtss_f32(s);
        }
}

/* One function per (type, NR, NT) so each tile shape is compiled with constant bounds. */
typedef void (*tile_fn)(const tile *g);
#define TF(NAME, BODY, R, T)                                                                     \
    static void NAME##_##R##_##T(const tile *g) { BODY(g, R, T); }
#define TF_ROW3(NAME, BODY, R) TF(NAME, BODY, R, 1) TF(NAME, BODY, R, 2) TF(NAME, BODY, R, 3)
#define TF_ROW6(NAME, BODY, R)                                                                   \
    TF_ROW3(NAME, BODY, R) TF(NAME, BODY, R, 4) TF(NAME, BODY, R, 5) TF(NAME, BODY, R, 6)
#define TILES3(NAME, BODY)                                                                       \
    TF_ROW3(NAME, BODY, 1) TF_ROW3(NAME, BODY, 2) TF_ROW3(NAME, BODY, 3) TF_ROW3(NAME, BODY, 4) \
    static const tile_fn NAME[TILE_R][TILE_T] = {{NAME##_1_1, NAME##_1_2, NAME##_1_3},         \
                                                 {NAME##_2_1, NAME##_2_2, NAME##_2_3},         \
                                                 {NAME##_3_1, NAME##_3_2, NAME##_3_3},         \
                                                 {NAME##_4_1, NAME##_4_2, NAME##_4_3}};
#define ROW6(NAME, R) {NAME##_##R##_1, NAME##_##R##_2, NAME##_##R##_3,                           \
                       NAME##_##R##_4, NAME##_##R##_5, NAME##_##R##_6}
#define TILES6(NAME, BODY)                                                                       \
    TF_ROW6(NAME, BODY, 1) TF_ROW6(NAME, BODY, 2) TF_ROW6(NAME, BODY, 3) TF_ROW6(NAME, BODY, 4) \
    static const tile_fn NAME[TILE_R][TILE_T] = {ROW6(NAME, 1), ROW6(NAME, 2), ROW6(NAME, 3),   \
                                                 ROW6(NAME, 4)};

#define Q8_0_BODY(g, R, T) tile_q8(g, R, T, false)
#define Q4_0_BODY(g, R, T) tile_q8(g, R, T, true)
#define Q4_1_BODY(g, R, T) tile_q4_1(g, R, T)
#define F32_BODY(g, R, T) tile_float(g, R, T, WF32)
#define F16_BODY(g, R, T) tile_float(g, R, T, WF16)
#define BF16_BODY(g, R, T) tile_float(g, R, T, WBF16)
TILES3(tiles_q8_0, Q8_0_BODY)
TILES3(tiles_q4_0, Q4_0_BODY)
TILES3(tiles_q4_1, Q4_1_BODY)
TILES6(tiles_f32, F32_BODY)
TILES6(tiles_f16, F16_BODY)
TILES6(tiles_bf16, BF16_BODY)

/* Quantized weights x F32 activations (quant_f32act.h): 4 rows x 3 tokens. */
#ifdef PGD_F32ACT_SIMD
#define FA_TILE(NAME, T, R, NT)                                                                  \
    static void NAME##_##R##_##NT(const tile *g) {                                               \
        pgd__f32act_tile f = {g->w, g->w_stride, (const float *)g->a, g->a_stride / sizeof(float), \
                              g->y, g->y_stride, g->n};                                          \
        pgd__f32act_tile_run(&f, T, R, NT);                                                      \
    }
#define FA_ROW(NAME, T, R) FA_TILE(NAME, T, R, 1) FA_TILE(NAME, T, R, 2) FA_TILE(NAME, T, R, 3)
#define FA_TILES(NAME, T)                                                                        \
    FA_ROW(NAME, T, 1) FA_ROW(NAME, T, 2) FA_ROW(NAME, T, 3) FA_ROW(NAME, T, 4)                  \
    static const tile_fn NAME[TILE_R][TILE_T] = {{NAME##_1_1, NAME##_1_2, NAME##_1_3},         \
                                                 {NAME##_2_1, NAME##_2_2, NAME##_2_3},         \
                                                 {NAME##_3_1, NAME##_3_2, NAME##_3_3},         \
                                                 {NAME##_4_1, NAME##_4_2, NAME##_4_3}};
FA_TILES(fa_q8_0, PGD_TYPE_Q8_0)
FA_TILES(fa_q4_0, PGD_TYPE_Q4_0)
FA_TILES(fa_q4_1, PGD_TYPE_Q4_1)
FA_TILES(fa_q4_k, PGD_TYPE_Q4_K)
FA_TILES(fa_q5_k, PGD_TYPE_Q5_K)
FA_TILES(fa_q6_k, PGD_TYPE_Q6_K)
FA_TILES(fa_q5_0, PGD_TYPE_Q5_0)
FA_TILES(fa_q5_1, PGD_TYPE_Q5_1)
FA_TILES(fa_iq4_nl, PGD_TYPE_IQ4_NL)
FA_TILES(fa_q2_k, PGD_TYPE_Q2_K)
FA_TILES(fa_q3_k, PGD_TYPE_Q3_K)
FA_TILES(fa_iq4_xs, PGD_TYPE_IQ4_XS)
#endif

/* Tile shapes per type: (rows x tokens) for n > 1, and rows for n == 1. Integer kernels reuse
 * a weight block across 3 tokens in 12 accumulators; float kernels are limited by the F16/BF16
 * conversion, so they convert 2 rows once for 6 tokens. Decode streams 4 rows at a time. */
typedef struct tile_plan {
    const tile_fn (*fns)[TILE_T];
    int mr, mt, mr1;
} tile_plan;

static bool plan_for(pgd_type t, tile_plan *p) {
#ifdef PGD_F32ACT_SIMD
    if (is_quant_type(t) && pgd_vec_dot_type(t) == PGD_TYPE_F32) {
        switch (t) {
        case PGD_TYPE_Q8_0: *p = (tile_plan){fa_q8_0, 4, 3, 4}; return true;
        case PGD_TYPE_Q4_0: *p = (tile_plan){fa_q4_0, 4, 3, 4}; return true;
        case PGD_TYPE_Q4_1: *p = (tile_plan){fa_q4_1, 4, 3, 4}; return true;
        case PGD_TYPE_Q4_K: *p = (tile_plan){fa_q4_k, 4, 3, 4}; return true;
        case PGD_TYPE_Q5_K: *p = (tile_plan){fa_q5_k, 4, 3, 4}; return true;
        case PGD_TYPE_Q6_K: *p = (tile_plan){fa_q6_k, 4, 3, 4}; return true;
        case PGD_TYPE_Q5_0: *p = (tile_plan){fa_q5_0, 4, 3, 4}; return true;
        case PGD_TYPE_Q5_1: *p = (tile_plan){fa_q5_1, 4, 3, 4}; return true;
        case PGD_TYPE_IQ4_NL: *p = (tile_plan){fa_iq4_nl, 4, 3, 4}; return true;
        case PGD_TYPE_Q2_K: *p = (tile_plan){fa_q2_k, 4, 3, 4}; return true;
        case PGD_TYPE_Q3_K: *p = (tile_plan){fa_q3_k, 4, 3, 4}; return true;
        case PGD_TYPE_IQ4_XS: *p = (tile_plan){fa_iq4_xs, 4, 3, 4}; return true;
        default: return false;
        }
    }
#endif
    switch (t) {
    case PGD_TYPE_Q8_0: *p = (tile_plan){tiles_q8_0, 4, 3, 4}; return true;
    case PGD_TYPE_Q4_0: *p = (tile_plan){tiles_q4_0, 4, 3, 4}; return true;
    case PGD_TYPE_Q4_1: *p = (tile_plan){tiles_q4_1, 4, 3, 4}; return true;
    case PGD_TYPE_F32: *p = (tile_plan){tiles_f32, 4, 3, 4}; return true;
    case PGD_TYPE_F16: *p = (tile_plan){tiles_f16, 4, 3, 4}; return true;
    case PGD_TYPE_BF16: *p = (tile_plan){tiles_bf16, 4, 3, 4}; return true;
    default: return false;
    }
}

/* Runs one row tile (fns[nt - 1] for 1..3 tokens) over tokens [t0, t1), mt at a time. */
static void sweep_tokens(const tile_fn *fns, tile *g, long t0, long t1, int mt,
                         const uint8_t *a0, float *y0, size_t y_stride) {
    const bool pf = g->prefetch;
    for (long t = t0; t < t1; t += mt) {
        int nt = t1 - t < mt ? (int)(t1 - t) : mt;
        g->a = a0 + (size_t)t * g->a_stride;
        g->y = y0 + (size_t)t * y_stride;
        fns[nt - 1](g);
        g->prefetch = false; /* the next rows are in cache after this row tile's first pass */
    }
    g->prefetch = pf;
}
#endif /* __AVX2__ */

/* ---- Weights in panels of 16 rows (panel16: F16, Q8_0, Q4_0/1, Q5_0/1, Q4_K, Q5_K, Q6_K) ----
 * Outer-product tiles: per k, the 16 rows' weights (two vectors) meet a broadcast of each token's
 * x[k]. F16: every y[t][r] is one FMA chain over k = 0..n_in-1 in order, started from +0. Q8_0:
 * per 32-element block a chain s = sum q[k] x[k] (q widened exactly) from +0, then
 * y = fma(d, s, y) block after block from +0 (the scale leaves the inner loop). The GEMM (6 tokens
 * x 16 rows over K slices converted to F32 once, the chains continued from y) and the GEMV (1
 * token, 4 panels at a time, converting in registers) run the same chains, so a row's result is
 * bit-identical at every n. Against the row-major tiles: fewer operand bytes per FMA (a weight
 * vector serves 6 tokens) and one long stream per panel in decode (bench/RESULTS.md; `PACK=1
 * bench/bench_matmul.c`). Q8_0 panel layout, per (panel, 32-element block): the 16 rows' fp16
 * scales, then q[k][16] (k-major): 544 bytes, as 16 rows' blocks take row-major.
 * Q4_K (d1 = d * sc and m1 = dmin * mn of each row's 32-element group, as pgd_dequantize_row
 * forms them): per group the chain s = sum q[k] x[k] from +0, then y = fma(d1, s, y) and
 * y = fma(-m1, xs, y), xs the token's sum of the group's 32 activations (p16_xsum, computed
 * once per call into the act scratch, so every path reads the same bits). Layout per (panel,
 * 256-element super-block), the 2,304 bytes the 16 rows' blocks take row-major: d[16] and
 * dmin[16] (fp16), the 12 packed scale bytes transposed
 * (byte b of the 16 rows, [12][16]), then per element k 8 bytes: row i's quant in byte i's low
 * nibble, row 8 + i's in its high one.
 * Q6_K (groups of 16, d1 = d * sc; quants q - 32 with q in 0..63): per group the chain of q[k]
 * x[k], then y = fma(d1, s, y) and y = fma(-32 d1, xs, y), xs the group's 16 activations.
 * Layout per (panel, super-block), 3,360 bytes as row-major: d[16] (fp16), the int8 scales
 * [16 groups][16 rows], then per k 12 bytes: 8 of low nibbles as Q4_K's, and a 32-bit word
 * holding row r's two high bits at bits 2r, 2r + 1.
 * Q4_0, Q4_1, Q5_0, Q5_1 (values d q + o, o = -8d, m, -16d, m): per 32-element block the chain
 * of q[k] x[k], then y = fma(d, s, y) and y = fma(o, xs, y). Layout per (panel, block), the
 * bytes 16 rows' blocks take: d[16] (fp16), for Q4_1/Q5_1 m[16], then per k 8 bytes of low
 * nibbles as Q4_K's, and for Q5_0/Q5_1 a 16-bit word with row r's fifth bit at bit r. */
#define P16_Q8_BLOCK (16 * 2 + 32 * 16)
#define P16_Q5(t) ((t) == PGD_TYPE_Q5_0 || (t) == PGD_TYPE_Q5_1)
#define P16_HAS_M(t) ((t) == PGD_TYPE_Q4_1 || (t) == PGD_TYPE_Q5_1)
#define P16_Q4X(t) ((t) == PGD_TYPE_Q4_0 || (t) == PGD_TYPE_Q4_1 || P16_Q5(t))
#define P16_Q4X_HDR(t) (P16_HAS_M(t) ? 64 : 32) /* bytes before a block's quants */
#define P16_Q4X_KB(t) (P16_Q5(t) ? 10 : 8)      /* bytes per element k */
#define P16_Q4X_BLOCK(t) (P16_Q4X_HDR(t) + 32 * P16_Q4X_KB(t))
#define Q6_K_BYTES 210
#define P16_Q6K_SB (16 * Q6_K_BYTES)
#define P16_Q6K_Q (32 + 256) /* offset of the quants */
#define Q4_K_BYTES 144
#define P16_Q4K_SB (16 * Q4_K_BYTES)
#define P16_Q4K_SC 64  /* offset of the transposed scale bytes */
#define P16_Q4K_Q 256  /* offset of the quants */
/* Q5_K: Q4_K's header (d, dmin, scale bytes), then per k 10 bytes: Q4_K's 8, and a 16-bit word
 * with row r's fifth bit at bit r (2,816 bytes per super-block, as row-major). */
#define Q5_K_BYTES 176
#define P16_Q5K_SB (16 * Q5_K_BYTES)
#define P16_K4(t) ((t) == PGD_TYPE_Q4_K || (t) == PGD_TYPE_Q5_K) /* Q4_K's scales */
#define P16_K4_SB(t) ((t) == PGD_TYPE_Q4_K ? P16_Q4K_SB : P16_Q5K_SB)
#define P16_K4_KB(t) ((t) == PGD_TYPE_Q4_K ? 8 : 10) /* bytes per element k */
/* Q3_K (groups of 16, d1 = d * (sc - 32); values d1 (u - 4), u = 2 low bits | high bit << 2):
 * per group the chain of u[k] x[k], then y = fma(d1, s, y) and y = fma(-4 d1, xs, y). Layout
 * per (panel, super-block), 1,760 bytes as row-major: d[16] (fp16), the 12 scale bytes
 * transposed ([12][16]), then per k 6 bytes: a 32-bit word with row r's low bits at 2r, 2r + 1,
 * and a 16-bit word with its high bit at r. */
#define Q3_K_BYTES 110
#define P16_Q3K_SB (16 * Q3_K_BYTES)
#define P16_Q3K_Q (32 + 192)
/* whether a block type has an offset term (a block sum of the activations to fold) */
#define P16_HAS_OFF(t) ((t) != PGD_TYPE_Q8_0)
#ifdef PGD_F32ACT_SIMD
#define P16_KC 256 /* K slice of a GEMM pass (a multiple of 32): 16 KiB of F32 weights in L1 */
#define P16_TB 96  /* tokens per block: their K slice (96 KiB) stays in L2 */

/* The 16 weights of element k of a panel as two F32 vectors: F16 widened; Q8_0 the quants
 * q[k][0..15] of the panel's block qb widened (exact integers), without the scales. */
INLINE void p16_w_f16(const uint16_t *p, size_t k, __m256 *w0, __m256 *w1) {
    *w0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + k * 16)));
    *w1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + k * 16 + 8)));
}
INLINE void p16_w_q8(const uint8_t *qb, int k, __m256 *w0, __m256 *w1) {
    const uint8_t *q = qb + 32 + k * 16;
    *w0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)q)));
    *w1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + 8))));
}
/* The 16 scales of a Q8_0 panel block as floats. */
INLINE void p16_d_q8(const uint8_t *qb, __m256 *d0, __m256 *d1) {
    *d0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)qb));
    *d1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(qb + 16)));
}
/* Q4_K: the 16 rows' quants of element k (0..255) of panel super-block sb (exact integers). */
/* Q4_K: group j's (0..7) d1 = d * sc and -m1 = -(dmin * mn) of the 16 rows (exact products;
 * ggml's get_scale_min_k4 on 16 rows at once). */
INLINE void p16_s_q4k(const uint8_t *sb, int j, __m256 d1[2], __m256 nm1[2]) {
    const uint8_t *b = sb + P16_Q4K_SC;
#define P16_LD(i) _mm_loadu_si128((const __m128i *)(b + 16 * (i)))
    const __m128i m6 = _mm_set1_epi8(63), m4 = _mm_set1_epi8(15), hi2 = _mm_set1_epi8(0x30);
    __m128i sc, mn;
    if (j < 4) {
        sc = _mm_and_si128(P16_LD(j), m6);
        mn = _mm_and_si128(P16_LD(j + 4), m6);
    } else { /* (byte >> 6) << 4 as (byte >> 2) & 0x30: the 16-bit shift's spill is masked */
        __m128i a = P16_LD(j + 4);
        sc = _mm_or_si128(_mm_and_si128(a, m4),
                          _mm_and_si128(_mm_srli_epi16(P16_LD(j - 4), 2), hi2));
        mn = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(a, 4), m4),
                          _mm_and_si128(_mm_srli_epi16(P16_LD(j), 2), hi2));
    }
#undef P16_LD
    const __m256 sgn = _mm256_set1_ps(-0.0f);
    for (int h = 0; h < 2; h++) {
        __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sb + 16 * h)));
        __m256 dm = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sb + 32 + 16 * h)));
        __m256 fs = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(h ? _mm_srli_si128(sc, 8) : sc));
        __m256 fm = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(h ? _mm_srli_si128(mn, 8) : mn));
        d1[h] = _mm256_mul_ps(d, fs);
        nm1[h] = _mm256_xor_ps(_mm256_mul_ps(dm, fm), sgn);
    }
}
/* Q6_K: the 16 rows' q (0..63, exact) of element k (0..255) of panel super-block sb. */
INLINE void p16_w_q6k(const uint8_t *sb, int k, __m256 *w0, __m256 *w1) {
    const uint8_t *q = sb + P16_Q6K_Q + 12 * k;
    __m256i n = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)q));
    int32_t hw;
    memcpy(&hw, q + 8, 4);
    const __m256i v = _mm256_set1_epi32(hw), m30 = _mm256_set1_epi32(0x30);
    /* row r's bits 2r, 2r + 1 to bits 4, 5: rows 0..7 from v << 4, rows 8..15 from v */
    __m256i hlo = _mm256_and_si256(
        _mm256_srlv_epi32(_mm256_slli_epi32(v, 4), _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)),
        m30);
    __m256i hhi = _mm256_and_si256(
        _mm256_srlv_epi32(v, _mm256_setr_epi32(12, 14, 16, 18, 20, 22, 24, 26)), m30);
    *w0 = _mm256_cvtepi32_ps(_mm256_or_si256(_mm256_and_si256(n, _mm256_set1_epi32(15)), hlo));
    *w1 = _mm256_cvtepi32_ps(_mm256_or_si256(_mm256_srli_epi32(n, 4), hhi));
}
/* Q6_K: group g's (0..15) d1 = d * sc of the 16 rows, and -32 d1 (exact). */
INLINE void p16_s_q6k(const uint8_t *sb, int g, __m256 d1[2], __m256 nm[2]) {
    const __m128i sc = _mm_loadu_si128((const __m128i *)(sb + 32 + 16 * g));
    for (int h = 0; h < 2; h++) {
        __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sb + 16 * h)));
        d1[h] = _mm256_mul_ps(
            d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(h ? _mm_srli_si128(sc, 8) : sc)));
        nm[h] = _mm256_mul_ps(d1[h], _mm256_set1_ps(-32.0f));
    }
}

/* Q4_0..Q5_1: the 16 rows' q (exact integers) of element k (0..31) of panel block qb. */
/* The 16 rows' quants of one element k at q: 8 bytes of nibbles (rows i and 8 + i in byte i),
 * for five-bit types then a 16-bit word with row r's fifth bit at bit r. */
INLINE void p16_w_nib(const uint8_t *q, const bool five, __m256 *w0, __m256 *w1) {
    __m256i n = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)q));
    __m256i lo = _mm256_and_si256(n, _mm256_set1_epi32(15)), hi = _mm256_srli_epi32(n, 4);
    if (five) { /* row r's bit r to bit 4: rows 0..7 from v << 4, rows 8..15 from v */
        uint16_t hw;
        memcpy(&hw, q + 8, 2);
        const __m256i v = _mm256_set1_epi32(hw), m10 = _mm256_set1_epi32(0x10);
        const __m256i sh = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_srlv_epi32(_mm256_slli_epi32(v, 4), sh),
                                                  m10));
        const __m256i sh4 = _mm256_add_epi32(sh, _mm256_set1_epi32(4));
        hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_srlv_epi32(v, sh4), m10));
    }
    *w0 = _mm256_cvtepi32_ps(lo);
    *w1 = _mm256_cvtepi32_ps(hi);
}
INLINE void p16_w_q4x(const pgd_type t, const uint8_t *qb, int k, __m256 *w0, __m256 *w1) {
    p16_w_nib(qb + P16_Q4X_HDR(t) + P16_Q4X_KB(t) * k, P16_Q5(t), w0, w1);
}
/* Q4_0..Q5_1: the 16 rows' d and offset o of panel block qb (-8d and -16d are exact). */
INLINE void p16_s_q4x(const pgd_type t, const uint8_t *qb, __m256 d[2], __m256 o[2]) {
    for (int h = 0; h < 2; h++) {
        d[h] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(qb + 16 * h)));
        o[h] = P16_HAS_M(t) ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(qb + 32 + 16 * h)))
                            : _mm256_mul_ps(d[h], _mm256_set1_ps(P16_Q5(t) ? -16.0f : -8.0f));
    }
}

/* Q3_K: the 16 rows' u (0..7, exact) of element k (0..255) of panel super-block sb. */
INLINE void p16_w_q3k(const uint8_t *sb, int k, __m256 *w0, __m256 *w1) {
    const uint8_t *q = sb + P16_Q3K_Q + 6 * k;
    int32_t lw;
    uint16_t hw;
    memcpy(&lw, q, 4);
    memcpy(&hw, q + 4, 2);
    const __m256i l = _mm256_set1_epi32(lw), h = _mm256_set1_epi32(hw);
    const __m256i m3 = _mm256_set1_epi32(3), m4 = _mm256_set1_epi32(4);
    const __m256i s2 = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
    const __m256i s1 = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256i u0 = _mm256_or_si256(_mm256_and_si256(_mm256_srlv_epi32(l, s2), m3),
                                 _mm256_and_si256(_mm256_srlv_epi32(_mm256_slli_epi32(h, 2), s1),
                                                  m4));
    __m256i u1 = _mm256_or_si256(
        _mm256_and_si256(_mm256_srlv_epi32(l, _mm256_add_epi32(s2, _mm256_set1_epi32(16))), m3),
        _mm256_and_si256(_mm256_srlv_epi32(h, _mm256_add_epi32(s1, _mm256_set1_epi32(6))), m4));
    *w0 = _mm256_cvtepi32_ps(u0);
    *w1 = _mm256_cvtepi32_ps(u1);
}
/* Q3_K: group i's (0..15) d1 = d * (sc - 32) of the 16 rows, and -4 d1 (exact); ggml's kmask
 * unpacking of the 6-bit scales on 16 rows at once. */
INLINE void p16_s_q3k(const uint8_t *sb, int i, __m256 d1[2], __m256 nm[2]) {
    const uint8_t *b = sb + 32;
    const __m128i m4 = _mm_set1_epi8(15), m3 = _mm_set1_epi8(3);
#define P16_LD(i) _mm_loadu_si128((const __m128i *)(b + 16 * (i)))
    __m128i lo = i < 8 ? _mm_and_si128(P16_LD(i), m4)
                       : _mm_and_si128(_mm_srli_epi16(P16_LD(i - 8), 4), m4);
    __m128i hi = _mm_and_si128(_mm_srli_epi16(P16_LD(8 + i % 4), 2 * (i / 4)), m3);
#undef P16_LD
    __m128i sc = _mm_or_si128(lo, _mm_slli_epi16(hi, 4)); /* 0..63, bytes */
    for (int h = 0; h < 2; h++) {
        __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sb + 16 * h)));
        __m256i v = _mm256_sub_epi32(_mm256_cvtepu8_epi32(h ? _mm_srli_si128(sc, 8) : sc),
                                     _mm256_set1_epi32(32));
        d1[h] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(v));
        nm[h] = _mm256_mul_ps(d1[h], _mm256_set1_ps(-4.0f));
    }
}
/* Elements per block of a block-quantized panel: a chain runs over one block. */
#define P16_BL(t) ((t) == PGD_TYPE_Q6_K || (t) == PGD_TYPE_Q3_K ? 16 : 32)
/* The sum of a block's activations, in one fixed order (the offset terms). */
INLINE float p16_xsum(const pgd_type t, const float *x) {
    __m256 a = _mm256_add_ps(_mm256_loadu_ps(x), _mm256_loadu_ps(x + 8));
    if (P16_BL(t) == 32)
        a = _mm256_add_ps(a, _mm256_add_ps(_mm256_loadu_ps(x + 16), _mm256_loadu_ps(x + 24)));
    return pgd_hsum8(a);
}

/* Block-quantized panels (Q8_0, Q4_K, Q6_K) by block (P16_BL elements): block blk's 16 rows'
 * weights at element k of the block, where its bytes start, and how many 64-byte lines it
 * streams. */
INLINE void p16_w_blk(const pgd_type t, const uint8_t *p, size_t blk, int k, __m256 *w0,
                      __m256 *w1) {
    if (t == PGD_TYPE_Q8_0) p16_w_q8(p + blk * P16_Q8_BLOCK, k, w0, w1);
    else if (P16_Q4X(t)) p16_w_q4x(t, p + blk * P16_Q4X_BLOCK(t), k, w0, w1);
    else if (P16_K4(t))
        p16_w_nib(p + blk / 8 * P16_K4_SB(t) + P16_Q4K_Q +
                      ((blk % 8) * 32 + (size_t)k) * P16_K4_KB(t),
                  t == PGD_TYPE_Q5_K, w0, w1);
    else if (t == PGD_TYPE_Q6_K)
        p16_w_q6k(p + blk / 16 * P16_Q6K_SB, (int)(blk % 16) * 16 + k, w0, w1);
    else p16_w_q3k(p + blk / 16 * P16_Q3K_SB, (int)(blk % 16) * 16 + k, w0, w1);
}
INLINE const uint8_t *p16_blk_bytes(const pgd_type t, const uint8_t *p, size_t blk) {
    return t == PGD_TYPE_Q8_0   ? p + blk * P16_Q8_BLOCK
           : P16_Q4X(t)         ? p + blk * P16_Q4X_BLOCK(t)
           : P16_K4(t) ? p + blk / 8 * P16_K4_SB(t) + P16_Q4K_Q + blk % 8 * 32 * P16_K4_KB(t)
           : t == PGD_TYPE_Q6_K ? p + blk / 16 * P16_Q6K_SB + P16_Q6K_Q + blk % 16 * 192
                                : p + blk / 16 * P16_Q3K_SB + P16_Q3K_Q + blk % 16 * 96;
}
#define P16_BLK_LINES(t)                                                                         \
    ((t) == PGD_TYPE_Q8_0 ? (P16_Q8_BLOCK + 63) / 64                                             \
     : P16_Q4X(t)         ? (P16_Q4X_BLOCK(t) + 63) / 64                                         \
     : P16_K4(t)          ? P16_K4_KB(t) / 2                                                     \
     : (t) == PGD_TYPE_Q6_K ? 3                                                                  \
                            : 2)
/* Block blk's per-row factors: Q8_0 the scales (nm unused), Q4_K d1 and -m1, Q6_K d1, -32 d1,
 * Q4_0..Q5_1 d and the offset. */
INLINE void p16_blk_scales(const pgd_type t, const uint8_t *p, size_t blk, __m256 d[2],
                           __m256 nm[2]) {
    if (t == PGD_TYPE_Q8_0) {
        p16_d_q8(p + blk * P16_Q8_BLOCK, &d[0], &d[1]);
        nm[0] = nm[1] = _mm256_setzero_ps();
    } else if (P16_Q4X(t)) {
        p16_s_q4x(t, p + blk * P16_Q4X_BLOCK(t), d, nm);
    } else if (P16_K4(t)) {
        p16_s_q4k(p + blk / 8 * P16_K4_SB(t), (int)(blk % 8), d, nm);
    } else if (t == PGD_TYPE_Q6_K) {
        p16_s_q6k(p + blk / 16 * P16_Q6K_SB, (int)(blk % 16), d, nm);
    } else {
        p16_s_q3k(p + blk / 16 * P16_Q3K_SB, (int)(blk % 16), d, nm);
    }
}
/* The end of a block's chain s: y = fma(d, s, y); all but Q8_0 then y = fma(nm, xs, y). */
INLINE __m256 p16_fold(const pgd_type t, __m256 d, __m256 nm, __m256 s, __m256 y, float xs) {
    y = _mm256_fmadd_ps(d, s, y);
    return P16_HAS_OFF(t) ? _mm256_fmadd_ps(nm, _mm256_set1_ps(xs), y) : y;
}

/* Elements [k0, k1) of one panel as F32, wf[k - k0][16] (F16 weights; Q8_0/Q4_K quants), and
 * for the block types their blocks' factors, ds[(k - k0) / P16_BL][32]: the 16 scales (Q8_0) or
 * d1, then the 16 offset factors nm (Q4_K, Q6_K). */
static void p16_slice(pgd_type t, const uint8_t *panel, size_t k0, size_t k1, float *wf,
                      float *ds) {
    for (size_t k = k0; k < k1; k++) {
        __m256 w0, w1;
        if (t == PGD_TYPE_F16) {
            p16_w_f16((const uint16_t *)panel, k, &w0, &w1);
        } else {
            const size_t bl = P16_BL(t);
            p16_w_blk(t, panel, k / bl, (int)(k % bl), &w0, &w1);
            if (k % bl == 0) {
                __m256 d[2], nm[2];
                p16_blk_scales(t, panel, k / bl, d, nm);
                float *o = ds + (k - k0) / bl * 32;
                _mm256_store_ps(o, d[0]);
                _mm256_store_ps(o + 8, d[1]);
                _mm256_store_ps(o + 16, nm[0]);
                _mm256_store_ps(o + 24, nm[1]);
            }
        }
        _mm256_store_ps(wf + (k - k0) * 16, w0);
        _mm256_store_ps(wf + (k - k0) * 16 + 8, w1);
    }
}

/* GEMM tile: NT tokens x 16 rows over [k0, k1) of a slice converted by p16_slice; y holds the
 * running sums between slices. F16: one chain over the slice, continued from y. Q8_0, Q4_K: a
 * chain per 32-element block from +0, then p16_fold. */
INLINE void p16_tile(const float *wf, const float *ds, const float *x, size_t K, float *y,
                     size_t N, const int NT, size_t k0, size_t k1, const pgd_type t,
                     const float *xs, size_t xss) {
    const bool q8 = t != PGD_TYPE_F16; /* block-quantized */
    const size_t bl = P16_BL(t);
    for (size_t b0 = k0; b0 < k1; b0 += q8 ? bl : k1 - k0) {
        const size_t b1 = q8 ? b0 + bl : k1;
        __m256 s[6][2];
#pragma GCC unroll 6
        for (int u = 0; u < NT; u++)
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++)
                s[u][h] = !q8 && k0 ? _mm256_loadu_ps(y + (size_t)u * N + 8 * h)
                                    : _mm256_setzero_ps();
        for (size_t k = b0; k < b1; k++) {
            __m256 w0 = _mm256_load_ps(wf + (k - k0) * 16);
            __m256 w1 = _mm256_load_ps(wf + (k - k0) * 16 + 8);
#pragma GCC unroll 6
            for (int u = 0; u < NT; u++) {
                __m256 b = _mm256_broadcast_ss(x + (size_t)u * K + k);
                s[u][0] = _mm256_fmadd_ps(w0, b, s[u][0]);
                s[u][1] = _mm256_fmadd_ps(w1, b, s[u][1]);
            }
        }
        const float *d = ds + (b0 - k0) / bl * 32;
#pragma GCC unroll 6
        for (int u = 0; u < NT; u++) {
            const float xsu = q8 && P16_HAS_OFF(t) ? xs[(size_t)u * xss + b0 / bl] : 0.0f;
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                float *yt = y + (size_t)u * N + 8 * h;
                __m256 a = s[u][h];
                if (q8)
                    a = p16_fold(t, _mm256_load_ps(d + 8 * h), _mm256_load_ps(d + 16 + 8 * h), a,
                                 b0 ? _mm256_loadu_ps(yt) : _mm256_setzero_ps(), xsu);
                _mm256_storeu_ps(yt, a);
            }
        }
    }
}

typedef void (*p16_fn)(const float *, const float *, const float *, size_t, float *, size_t,
                       size_t, size_t, const float *, size_t);
#define P16_T(NAME, NT, T)                                                                       \
    static void NAME##_##NT(const float *wf, const float *ds, const float *x, size_t K, float *y, \
                            size_t N, size_t k0, size_t k1, const float *xs, size_t xss) {       \
        p16_tile(wf, ds, x, K, y, N, NT, k0, k1, T, xs, xss);                                    \
    }
#define P16_TILES(NAME, T)                                                                       \
    P16_T(NAME, 1, T) P16_T(NAME, 2, T) P16_T(NAME, 3, T) P16_T(NAME, 4, T)                      \
    P16_T(NAME, 5, T) P16_T(NAME, 6, T)                                                          \
    static const p16_fn NAME[6] = {NAME##_1, NAME##_2, NAME##_3, NAME##_4, NAME##_5, NAME##_6};
P16_TILES(p16_tiles_f16, PGD_TYPE_F16)
P16_TILES(p16_tiles_q8, PGD_TYPE_Q8_0)
P16_TILES(p16_tiles_q4k, PGD_TYPE_Q4_K)
P16_TILES(p16_tiles_q6k, PGD_TYPE_Q6_K)
P16_TILES(p16_tiles_q40, PGD_TYPE_Q4_0)
P16_TILES(p16_tiles_q41, PGD_TYPE_Q4_1)
P16_TILES(p16_tiles_q50, PGD_TYPE_Q5_0)
P16_TILES(p16_tiles_q51, PGD_TYPE_Q5_1)
P16_TILES(p16_tiles_q5k, PGD_TYPE_Q5_K)
P16_TILES(p16_tiles_q3k, PGD_TYPE_Q3_K)

static size_t p16_panel_bytes(pgd_type t, size_t K) {
    return t == PGD_TYPE_F16    ? 16 * K * 2
           : t == PGD_TYPE_Q8_0 ? (K / 32) * P16_Q8_BLOCK
           : P16_Q4X(t)         ? (K / 32) * P16_Q4X_BLOCK(t)
           : P16_K4(t)          ? (K / 256) * P16_K4_SB(t)
           : t == PGD_TYPE_Q6_K ? (K / 256) * P16_Q6K_SB
                                : (K / 256) * P16_Q3K_SB;
}

/* Q8_0 decode prefetches each panel's stream this far ahead, one hint per 64-byte line: 4
 * streams 4 lines ahead is the pattern that reads fastest on the 2-core machine (`pagoda
 * bench`'s probe). Q8_0 panels 1.07-1.3x over the hardware prefetchers alone; F16 panels,
 * which a core streams twice as fast, measured no gain and take none (bench/RESULTS.md). */
#define P16_PF_BYTES 256

/* One token, NP panels (16 * NP rows from row n): 2 * NP independent chains. */
INLINE void p16_gemv_np(const pgd_type t, const int NP, const uint8_t *p, size_t pb,
                        const float *x, float *y, size_t K, const float *xs) {
    __m256 a[8];
#pragma GCC unroll 8
    for (int i = 0; i < 2 * NP; i++) a[i] = _mm256_setzero_ps();
    if (t == PGD_TYPE_F16) {
        for (size_t k = 0; k < K; k++) {
            __m256 b = _mm256_broadcast_ss(x + k);
#pragma GCC unroll 4
            for (int q = 0; q < NP; q++) {
                __m256 w0, w1;
                p16_w_f16((const uint16_t *)(p + q * pb), k, &w0, &w1);
                a[2 * q] = _mm256_fmadd_ps(w0, b, a[2 * q]);
                a[2 * q + 1] = _mm256_fmadd_ps(w1, b, a[2 * q + 1]);
            }
        }
    } else {
        const int bl = P16_BL(t);
        for (size_t blk = 0; blk < K / (size_t)bl; blk++) {
            __m256 sq[8];
#pragma GCC unroll 8
            for (int i = 0; i < 2 * NP; i++) sq[i] = _mm256_setzero_ps();
            for (int k = 0; k < bl; k++) {
                __m256 b = _mm256_broadcast_ss(x + blk * bl + (size_t)k);
                if (k < P16_BLK_LINES(t)) /* a block's lines, one per k */
#pragma GCC unroll 4
                    for (int q = 0; q < NP; q++)
                        _mm_prefetch((const char *)(p16_blk_bytes(t, p + q * pb, blk) +
                                                    P16_PF_BYTES + 64 * (size_t)k),
                                     _MM_HINT_T0);
#pragma GCC unroll 4
                for (int q = 0; q < NP; q++) {
                    __m256 w0, w1;
                    p16_w_blk(t, p + q * pb, blk, k, &w0, &w1);
                    sq[2 * q] = _mm256_fmadd_ps(w0, b, sq[2 * q]);
                    sq[2 * q + 1] = _mm256_fmadd_ps(w1, b, sq[2 * q + 1]);
                }
            }
            const float xsb = P16_HAS_OFF(t) ? xs[blk] : 0.0f;
#pragma GCC unroll 4
            for (int q = 0; q < NP; q++) {
                __m256 d[2], nm[2];
                p16_blk_scales(t, p + q * pb, blk, d, nm);
                a[2 * q] = p16_fold(t, d[0], nm[0], sq[2 * q], a[2 * q], xsb);
                a[2 * q + 1] = p16_fold(t, d[1], nm[1], sq[2 * q + 1], a[2 * q + 1], xsb);
            }
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < 2 * NP; i++) _mm256_storeu_ps(y + 8 * i, a[i]);
}

/* One token, rows [lo, hi) (multiples of 16): 4 panels at a time (4 long streams), then the
 * remaining panels one by one. A row's chain is the same either way. */
INLINE void p16_gemv_t(const pgd_type t, const uint8_t *P, const float *x, float *y, size_t K,
                       long lo, long hi, const float *xs) {
    const size_t pb = p16_panel_bytes(t, K);
    long n = lo;
    for (; n + 64 <= hi; n += 64)
        p16_gemv_np(t, 4, P + (size_t)(n / 16) * pb, pb, x, y + n, K, xs);
    for (; n < hi; n += 16) p16_gemv_np(t, 1, P + (size_t)(n / 16) * pb, pb, x, y + n, K, xs);
}

/* NT <= 4 tokens, NP panels (16 * NP rows; NP * NT <= 4: 8 independent FMA chains at most,
 * enough to hide the FMA latency in 16 registers): p16_gemv_np's chains for each token, every
 * weight converted once for all NT. A Q8_0 block's partial sums are folded into y at the
 * block's end (the running sum goes through memory, exactly), so each row gets gemv's bits. */
INLINE void p16_few_panels(const pgd_type t, const int NT, const int NP, const uint8_t *p,
                           size_t pb, const float *x, size_t K, float *y, size_t N,
                           const float *xs, size_t xss) {
    if (t == PGD_TYPE_F16) {
        __m256 a[4][4][2];
#pragma GCC unroll 4
        for (int q = 0; q < NP; q++)
#pragma GCC unroll 4
            for (int u = 0; u < NT; u++) a[q][u][0] = a[q][u][1] = _mm256_setzero_ps();
        for (size_t k = 0; k < K; k++) {
#pragma GCC unroll 4
            for (int q = 0; q < NP; q++) {
                __m256 w0, w1;
                p16_w_f16((const uint16_t *)(p + q * pb), k, &w0, &w1);
#pragma GCC unroll 4
                for (int u = 0; u < NT; u++) {
                    __m256 b = _mm256_broadcast_ss(x + (size_t)u * K + k);
                    a[q][u][0] = _mm256_fmadd_ps(w0, b, a[q][u][0]);
                    a[q][u][1] = _mm256_fmadd_ps(w1, b, a[q][u][1]);
                }
            }
        }
#pragma GCC unroll 4
        for (int q = 0; q < NP; q++)
#pragma GCC unroll 4
            for (int u = 0; u < NT; u++) {
                _mm256_storeu_ps(y + (size_t)u * N + 16 * q, a[q][u][0]);
                _mm256_storeu_ps(y + (size_t)u * N + 16 * q + 8, a[q][u][1]);
            }
        return;
    }
    const int bl = P16_BL(t);
    for (size_t blk = 0; blk < K / (size_t)bl; blk++) {
        __m256 sq[4][4][2];
#pragma GCC unroll 4
        for (int q = 0; q < NP; q++)
#pragma GCC unroll 4
            for (int u = 0; u < NT; u++) sq[q][u][0] = sq[q][u][1] = _mm256_setzero_ps();
        for (int k = 0; k < bl; k++) {
            if (k < P16_BLK_LINES(t))
#pragma GCC unroll 4
                for (int q = 0; q < NP; q++)
                    _mm_prefetch((const char *)(p16_blk_bytes(t, p + q * pb, blk) +
                                                P16_PF_BYTES + 64 * (size_t)k),
                                 _MM_HINT_T0);
#pragma GCC unroll 4
            for (int q = 0; q < NP; q++) {
                __m256 w0, w1;
                p16_w_blk(t, p + q * pb, blk, k, &w0, &w1);
#pragma GCC unroll 4
                for (int u = 0; u < NT; u++) {
                    __m256 b = _mm256_broadcast_ss(x + (size_t)u * K + blk * bl + (size_t)k);
                    sq[q][u][0] = _mm256_fmadd_ps(w0, b, sq[q][u][0]);
                    sq[q][u][1] = _mm256_fmadd_ps(w1, b, sq[q][u][1]);
                }
            }
        }
        float xsb[4];
#pragma GCC unroll 4
        for (int u = 0; u < NT; u++)
            xsb[u] = P16_HAS_OFF(t) ? xs[(size_t)u * xss + blk] : 0.0f;
#pragma GCC unroll 4
        for (int q = 0; q < NP; q++) {
            __m256 d[2], nm[2], z = _mm256_setzero_ps();
            p16_blk_scales(t, p + q * pb, blk, d, nm);
#pragma GCC unroll 4
            for (int u = 0; u < NT; u++) {
                float *yu = y + (size_t)u * N + 16 * q;
                _mm256_storeu_ps(yu, p16_fold(t, d[0], nm[0], sq[q][u][0],
                                              blk ? _mm256_loadu_ps(yu) : z, xsb[u]));
                _mm256_storeu_ps(yu + 8, p16_fold(t, d[1], nm[1], sq[q][u][1],
                                                  blk ? _mm256_loadu_ps(yu + 8) : z, xsb[u]));
            }
        }
    }
}

#define P16_FEW_FN(T, NT, NP, NAME)                                                              \
    static void NAME(const uint8_t *p, size_t pb, const float *x, size_t K, float *y,           \
                     size_t N, const float *xs, size_t xss) {                                    \
        p16_few_panels(T, NT, NP, p, pb, x, K, y, N, xs, xss);                                   \
    }
#define P16_FEW_SET(T, N)                                                                        \
    P16_FEW_FN(T, 1, 1, p16_few_##N##_1) P16_FEW_FN(T, 2, 1, p16_few_##N##_2)                    \
    P16_FEW_FN(T, 3, 1, p16_few_##N##_3) P16_FEW_FN(T, 4, 1, p16_few_##N##_4)                    \
    P16_FEW_FN(T, 2, 2, p16_pair_##N##_2)                                                        \
    static const p16_few_fn p16_few_##N[5] = {p16_few_##N##_1, p16_few_##N##_2,                 \
                                              p16_few_##N##_3, p16_few_##N##_4,                 \
                                              p16_pair_##N##_2};                                \
    static void p16_gemv_##N(const uint8_t *P, const float *x, float *y, size_t K, long lo,     \
                             long hi, const float *xs) {                                         \
        p16_gemv_t(T, P, x, y, K, lo, hi, xs);                                                   \
    }
typedef void (*p16_few_fn)(const uint8_t *, size_t, const float *, size_t, float *, size_t,
                           const float *, size_t);
/* [nt - 1]: nt tokens over one panel; [4]: 2 tokens over two panels */
P16_FEW_SET(PGD_TYPE_F16, f16)
P16_FEW_SET(PGD_TYPE_Q8_0, q8)
P16_FEW_SET(PGD_TYPE_Q4_K, q4k)
P16_FEW_SET(PGD_TYPE_Q6_K, q6k)
P16_FEW_SET(PGD_TYPE_Q4_0, q40)
P16_FEW_SET(PGD_TYPE_Q4_1, q41)
P16_FEW_SET(PGD_TYPE_Q5_0, q50)
P16_FEW_SET(PGD_TYPE_Q5_1, q51)
P16_FEW_SET(PGD_TYPE_Q5_K, q5k)
P16_FEW_SET(PGD_TYPE_Q3_K, q3k)

/* The panel types' kernels: tiles of the GEMM, few-token functions, the one-token GEMV. */
typedef struct p16_kernels {
    const p16_fn *tiles;
    const p16_few_fn *few;
    void (*gemv)(const uint8_t *, const float *, float *, size_t, long, long, const float *);
} p16_kernels;
static p16_kernels p16_kernels_of(pgd_type t) {
#define P16_K(N) (p16_kernels){p16_tiles_##N, p16_few_##N, p16_gemv_##N}
    switch (t) {
    case PGD_TYPE_F16: return P16_K(f16);
    case PGD_TYPE_Q8_0: return P16_K(q8);
    case PGD_TYPE_Q4_K: return P16_K(q4k);
    case PGD_TYPE_Q6_K: return P16_K(q6k);
    case PGD_TYPE_Q4_0: return P16_K(q40);
    case PGD_TYPE_Q4_1: return P16_K(q41);
    case PGD_TYPE_Q5_0: return P16_K(q50);
    case PGD_TYPE_Q5_K: return P16_K(q5k);
    case PGD_TYPE_Q3_K: return P16_K(q3k);
    default: return P16_K(q51);
    }
#undef P16_K
}

/* A few tokens (n <= P16_FEW_MAX; F16: P16_FEW_MAX_F16), rows [lo, hi) (multiples of 16):
 * groups of up to 4 tokens stream the panels (two at a time for 2 tokens), converting each
 * weight once per group. For so few tokens p16_gemm's conversion of every panel slice to F32 in
 * memory costs more than its tiles save: a Q8_0 768 x 2,048 matrix took 4.1x gemv's time at 2
 * tokens that way, 1.8x here. Up to 24 tokens (6 groups) this stays ahead of p16_gemm for the
 * block types (in-process A/B, bench/bench_pack_ab.c: 1536 x 576 Q4_1 at 16 tokens 1.08x the
 * row-major tiles against p16_gemm's 0.84x; Q8_0 at 12: 1.25x against 0.87x). F16 panels
 * convert cheaply, and past 3 tokens p16_gemm is as fast or faster (bench/RESULTS.md). */
#define P16_FEW_MAX 24
#define P16_FEW_MAX_F16 3
/* the 5-bit types and Q3_K decode costlier per group: past 8 tokens the GEMM's one conversion per
 * slice wins (4096 x 4096 at 16 tokens: Q5_0 1.02x the row-major tiles against 0.78x, Q3_K
 * 0.87x against 0.74x) */
#define P16_FEW_MAX_SLOW 8
#define P16_FEW_MAX_OF(t)                                                                        \
    ((t) == PGD_TYPE_F16 ? P16_FEW_MAX_F16                                                       \
     : P16_Q5(t) || (t) == PGD_TYPE_Q5_K || (t) == PGD_TYPE_Q3_K ? P16_FEW_MAX_SLOW              \
                                                                : P16_FEW_MAX)
static void p16_few(pgd_type t, const uint8_t *P, const float *x, float *y, size_t K, size_t N,
                    int n, long lo, long hi, const float *xs, size_t xss) {
    const size_t pb = p16_panel_bytes(t, K);
    const p16_few_fn *fns = p16_kernels_of(t).few, pair = fns[4];
    for (int t0 = 0; t0 < n; t0 += 4) {
        int nt = n - t0 < 4 ? n - t0 : 4;
        const float *xt = x + (size_t)t0 * K;
        float *yt = y + (size_t)t0 * N;
        long r = lo;
        const float *xst = xs + (size_t)t0 * xss;
        if (nt == 2) /* two panels a call: 8 chains, as the others have */
            for (; r + 32 <= hi; r += 32)
                pair(P + (size_t)(r / 16) * pb, pb, xt, K, yt + r, N, xst, xss);
        for (; r < hi; r += 16)
            fns[nt - 1](P + (size_t)(r / 16) * pb, pb, xt, K, yt + r, N, xst, xss);
    }
}

/* n tokens, rows [lo, hi) (multiples of 16): token blocks, then panels, then K slices (each
 * converted to F32 once), then token tiles of up to 6. */
static void p16_gemm(pgd_type t, const uint8_t *P, const float *x, float *y, size_t K, size_t N,
                     int n, long lo, long hi, const float *xs, size_t xss) {
    static _Thread_local float wf[P16_KC * 16] __attribute__((aligned(32)));
    static _Thread_local float ds[P16_KC / 16 * 32] __attribute__((aligned(32)));
    /* Equal slices of at most P16_KC, multiples of 32 (576 = 288 + 288, not 256 + 256 + 64: a
     * short slice pays the accumulators' reload and store for few FMAs). */
    const size_t ns = (K + P16_KC - 1) / P16_KC, kc = ((K + ns - 1) / ns + 31) / 32 * 32;
    const size_t pb = p16_panel_bytes(t, K);
    for (long t0 = 0; t0 < n; t0 += P16_TB) {
        long t1 = t0 + P16_TB < n ? t0 + P16_TB : n;
        for (long r = lo; r < hi; r += 16) {
            const uint8_t *p = P + (size_t)(r / 16) * pb;
            for (size_t k0 = 0; k0 < K; k0 += kc) {
                size_t k1 = k0 + kc < K ? k0 + kc : K;
                p16_slice(t, p, k0, k1, wf, ds);
                for (long tt = t0; tt < t1; tt += 6) {
                    int nt = t1 - tt < 6 ? (int)(t1 - tt) : 6;
                    const float *xt = x + (size_t)tt * K;
                    float *yt = y + (size_t)tt * N + r;
                    p16_kernels_of(t).tiles[nt - 1](wf, ds, xt, K, yt, N, k0, k1,
                                                    xs + (size_t)tt * xss, xss);
                }
            }
        }
    }
}
#endif

#ifdef PGD_F32ACT_SIMD
/* The block types with a panel layout, and the variable that turns each off. */
static const struct {
    pgd_type t;
    const char *env;
} k_p16_fmts[] = {
    {PGD_TYPE_Q8_0, "PAGODA_PACK_Q8_0"}, {PGD_TYPE_Q4_0, "PAGODA_PACK_Q4_Q5"},
    {PGD_TYPE_Q4_1, "PAGODA_PACK_Q4_Q5"}, {PGD_TYPE_Q5_0, "PAGODA_PACK_Q4_Q5"},
    {PGD_TYPE_Q5_1, "PAGODA_PACK_Q4_Q5"}, {PGD_TYPE_Q3_K, "PAGODA_PACK_Q3_K"},
    {PGD_TYPE_Q4_K, "PAGODA_PACK_Q4_K"}, {PGD_TYPE_Q5_K, "PAGODA_PACK_Q5_K"},
    {PGD_TYPE_Q6_K, "PAGODA_PACK_Q6_K"},
};
#endif

bool pgd_cpu_can_pack(const pgd_weight *w) {
#ifdef PGD_F32ACT_SIMD
    const char *env = getenv("PAGODA_PACK");
    if (env && env[0] == '0') return false;
    if (w->panel16 || w->n_out % 16 || w->n_in <= 0) return false;
    if (w->type == PGD_TYPE_F16) {
        env = getenv("PAGODA_PACK_F16");
        return !(env && env[0] == '0') && w->row_bytes == (size_t)w->n_in * 2;
    }
    for (size_t i = 0; i < sizeof k_p16_fmts / sizeof k_p16_fmts[0]; i++) {
        if (k_p16_fmts[i].t != w->type) continue;
        env = getenv(k_p16_fmts[i].env);
        const uint64_t rb = pgd_type_row_bytes(w->type, (uint64_t)w->n_in); /* 0: no blocks */
        return !(env && env[0] == '0') && pgd_vec_dot_type(w->type) == PGD_TYPE_F32 &&
               rb != 0 && w->row_bytes == rb;
    }
    return false;
#else
    (void)w;
    return false;
#endif
}

/* Row r's block ib (one 32-element block; Q4_K, Q6_K: a 256-element super-block) into panel
 * block o, as the layouts above say (o starts zeroed). */
static void pack_row_block(pgd_type t, const uint8_t *ib, uint8_t *o, int r) {
    const int lo_byte = r & 7, lo_shift = 4 * (r >> 3); /* low nibble bytes: rows i, 8 + i */
    if (t == PGD_TYPE_Q8_0) {
        memcpy(o + 2 * r, ib, 2);
        for (int k = 0; k < 32; k++) o[32 + k * 16 + r] = ib[2 + k];
    } else if (P16_K4(t)) { /* Q5_K: qh[32] before the nibbles, bit j of qh[l] */
        const bool q5 = t == PGD_TYPE_Q5_K;
        memcpy(o + 2 * r, ib, 2);          /* d */
        memcpy(o + 32 + 2 * r, ib + 2, 2); /* dmin */
        for (int i = 0; i < 12; i++) o[P16_Q4K_SC + 16 * i + r] = ib[4 + i];
        for (int k = 0; k < 256; k++) { /* group j = k / 32: bytes 32 (j / 2), nibble j & 1 */
            const int j = k / 32, l = k % 32;
            int q = (ib[(q5 ? 48 : 16) + 32 * (j / 2) + l] >> (4 * (j & 1))) & 15;
            uint8_t *qk = o + P16_Q4K_Q + (size_t)P16_K4_KB(t) * k;
            qk[lo_byte] |= (uint8_t)(q << lo_shift);
            if (q5) qk[8 + r / 8] |= (uint8_t)(((ib[16 + l] >> j) & 1) << (r % 8));
        }
    } else if (t == PGD_TYPE_Q6_K) {
        memcpy(o + 2 * r, ib + 208, 2); /* d */
        for (int g = 0; g < 16; g++) o[32 + 16 * g + r] = ib[192 + g];
        for (int e = 0; e < 256; e++) { /* ggml's ql/qh indexing */
            const int c = e / 128, k = (e % 128) / 32, l = e % 32;
            int lo = (ib[64 * c + l + 32 * (k & 1)] >> (4 * (k >> 1))) & 15;
            int hi = (ib[128 + 32 * c + l] >> (2 * k)) & 3;
            uint8_t *q = o + P16_Q6K_Q + 12 * e;
            q[lo_byte] |= (uint8_t)(lo << lo_shift);
            q[8 + r / 4] |= (uint8_t)(hi << (2 * (r % 4)));
        }
    } else if (t == PGD_TYPE_Q3_K) {
        memcpy(o + 2 * r, ib + 108, 2); /* d */
        for (int i = 0; i < 12; i++) o[32 + 16 * i + r] = ib[96 + i];
        for (int e = 0; e < 256; e++) { /* ggml's order: half, shift, 16 + 16 */
            const int half = e / 128, s = (e % 128) / 32, hs = (e % 32) / 16, l = e % 16;
            int q2 = (ib[32 + 32 * half + 16 * hs + l] >> (2 * s)) & 3;
            int hb = (ib[16 * hs + l] >> (4 * half + s)) & 1;
            uint8_t *q = o + P16_Q3K_Q + 6 * e;
            q[r / 4] |= (uint8_t)(q2 << (2 * (r % 4)));
            q[4 + r / 8] |= (uint8_t)(hb << (r % 8));
        }
    } else { /* Q4_0, Q4_1, Q5_0, Q5_1: d [m] [qh] qs */
        const int qs_at = 2 + 2 * P16_HAS_M(t) + 4 * P16_Q5(t);
        memcpy(o + 2 * r, ib, 2);
        if (P16_HAS_M(t)) memcpy(o + 32 + 2 * r, ib + 2, 2);
        uint32_t qh = 0;
        if (P16_Q5(t)) memcpy(&qh, ib + 2 + 2 * P16_HAS_M(t), 4);
        for (int e = 0; e < 32; e++) {
            uint8_t *q = o + P16_Q4X_HDR(t) + P16_Q4X_KB(t) * e;
            int nib = e < 16 ? ib[qs_at + e] & 15 : ib[qs_at + e - 16] >> 4;
            q[lo_byte] |= (uint8_t)(nib << lo_shift);
            if (P16_Q5(t)) q[8 + r / 8] |= (uint8_t)(((qh >> e) & 1) << (r % 8));
        }
    }
}

void pgd_cpu_pack(const pgd_weight *w, void *dst) {
    const size_t K = (size_t)w->n_in;
    if (w->type == PGD_TYPE_F16) {
        const uint16_t *src = w->data;
        uint16_t *out = dst;
        for (int64_t p = 0; p < w->n_out / 16; p++)
            for (int r = 0; r < 16; r++) {
                const uint16_t *row = src + ((size_t)p * 16 + (size_t)r) * K;
                uint16_t *o = out + (size_t)p * 16 * K + (size_t)r;
                for (size_t k = 0; k < K; k++) o[k * 16] = row[k];
            }
        return;
    }
    /* block types: panel block bytes = 16 row blocks; each row block packed by its type */
    const size_t rb = pgd_type_block_bytes(w->type);
    PGD_ASSERT(rb != 0);
    const size_t nb = w->row_bytes / rb;
    for (int64_t p = 0; p < w->n_out / 16; p++)
        for (size_t b = 0; b < nb; b++) {
            uint8_t *o = (uint8_t *)dst + ((size_t)p * nb + b) * 16 * rb;
            memset(o, 0, 16 * rb); /* the quants are or'ed in */
            for (int r = 0; r < 16; r++)
                pack_row_block(w->type, (const uint8_t *)w->data +
                                            ((size_t)p * 16 + (size_t)r) * w->row_bytes + b * rb,
                               o, r);
        }
}

/* ---- Pool tasks ---------------------------------------------------------------------------- */

typedef struct matmul_ctx {
    const pgd_weight *w;
    const float *x;       /* (n, w->n_in) */
    unsigned char *act;   /* (n) rows of act_row_bytes */
    size_t act_row_bytes;
    float *panel;         /* per thread: TILE_R rows of act_row_bytes (NULL: none) */
    float *y;             /* (n, w->n_out) */
    int n;
    long chunk_rows;      /* output rows per chunk of work (a multiple of 4) */
} matmul_ctx;

static void quant_chunk(void *arg, long t, int ith) {
    (void)ith;
    matmul_ctx *c = arg;
    quantize_row(c->w, c->x + (size_t)t * c->w->n_in, c->act + (size_t)t * c->act_row_bytes);
}

#ifdef PGD_F32ACT_SIMD
/* Panels with an offset term (all but F16 and Q8_0): token t's block sums into its act row. */
static void xsum_chunk(void *arg, long t, int ith) {
    (void)ith;
    matmul_ctx *c = arg;
    const pgd_type ty = c->w->type;
    const size_t bl = P16_BL(ty), nb = (size_t)c->w->n_in / bl;
    const float *x = c->x + (size_t)t * c->w->n_in;
    float *xs = (float *)(c->act + (size_t)t * c->act_row_bytes);
    for (size_t b = 0; b < nb; b++) xs[b] = p16_xsum(ty, x + b * bl);
}
#endif

/* Panel rows are act_row_bytes + PANEL_PAD apart: with power-of-two row lengths the rows of a
 * panel and of x would otherwise share L1 sets (4 KiB aliasing), costing ~20% of the tile. */
#define PANEL_PAD 64
static size_t panel_stride(size_t act_row_bytes) { return act_row_bytes + PANEL_PAD; }

#ifdef PGD_F32ACT_SIMD
/* Quantized weights x F32 activations for many tokens: each TILE_R-row panel is dequantized
 * once into the thread's F32 scratch (pgd__f32act_deq32: the same floats the fused tiles make
 * in registers) and then multiplied by every token with the F32 tiles, whose per-(row, token)
 * FMA sequence and horizontal tree are those of the fused tiles: the results are bit-identical
 * to the fused path, so a row's output still does not depend on n. */
#define PANEL_MIN_TOKENS 4 /* below this the fused tiles (3 tokens per dequantization) win */
#ifndef PGD_PANEL_MIN_TB
#define PGD_PANEL_MIN_TB 24
#endif
#define PANEL_MIN_TB PGD_PANEL_MIN_TB /* tokens per panel dequantization, at least (a multiple of 3) */

static void deq_panel(pgd_type t, const uint8_t *w, size_t w_stride, int nr, int64_t n,
                      float *panel, size_t p_stride) {
    for (int r = 0; r < nr; r++) {
        const uint8_t *row = w + (size_t)r * w_stride;
        float *out = panel + (size_t)r * p_stride;
        switch (t) { /* constant type per call, so each case inlines its own dequantizer */
#define DEQ_CASE(T)                                                                              \
    case T:                                                                                      \
        for (int64_t g = 0; g < n / 32; g++) {                                                   \
            __m256 v[4];                                                                         \
            pgd__f32act_deq32(T, row, g, v);                                                     \
            for (int k = 0; k < 4; k++) _mm256_storeu_ps(out + g * 32 + 8 * k, v[k]);            \
        }                                                                                        \
        break;
            DEQ_CASE(PGD_TYPE_Q8_0) DEQ_CASE(PGD_TYPE_Q4_0) DEQ_CASE(PGD_TYPE_Q4_1)
            DEQ_CASE(PGD_TYPE_Q4_K) DEQ_CASE(PGD_TYPE_Q5_K) DEQ_CASE(PGD_TYPE_Q6_K)
            DEQ_CASE(PGD_TYPE_Q5_0) DEQ_CASE(PGD_TYPE_Q5_1) DEQ_CASE(PGD_TYPE_IQ4_NL)
            DEQ_CASE(PGD_TYPE_Q2_K) DEQ_CASE(PGD_TYPE_Q3_K) DEQ_CASE(PGD_TYPE_IQ4_XS)
#undef DEQ_CASE
        default: PGD_ASSERT(!"deq_panel: type without F32-activation tiles");
        }
    }
}

static void matmul_rows_panel(const matmul_ctx *c, long lo, long hi, int ith) {
    const pgd_weight *w = c->w;
    const size_t stride = (size_t)w->n_in * sizeof(float);
    PGD_ASSERT(c->act_row_bytes >= stride);
    const size_t ps = panel_stride(c->act_row_bytes);
    float *panel = (float *)((unsigned char *)c->panel + (size_t)ith * TILE_R * ps);
    const int mr = TILE_R, mt = 3;
    tile g = {.w = (const uint8_t *)panel, .w_stride = ps, .a_stride = stride,
              .y_stride = (size_t)w->n_out, .n = w->n_in};
    long tb = (long)(ACT_L2_BYTES / stride) / mt * mt;
    if (tb < PANEL_MIN_TB) tb = PANEL_MIN_TB; /* amortize each panel's dequantization */
    for (long t0 = 0; t0 < c->n; t0 += tb) {
        long t1 = t0 + tb < c->n ? t0 + tb : c->n;
        for (long r = lo; r < hi; r += mr) {
            int nr = hi - r < mr ? (int)(hi - r) : mr;
            deq_panel(w->type, (const uint8_t *)w->data + (size_t)r * w->row_bytes, w->row_bytes,
                      nr, w->n_in, panel, ps / sizeof(float));
            sweep_tokens(tiles_f32[nr - 1], &g, t0, t1, mt, (const uint8_t *)c->x, c->y + r,
                         (size_t)w->n_out);
        }
    }
}
#endif

/* Rows [lo, hi) of y for all n tokens. Chunks split output rows, never the reduction. */
static void matmul_rows(const matmul_ctx *c, long lo, long hi, int ith) {
    const pgd_weight *w = c->w;
    const unsigned char *base = w->data;
#ifdef PGD_F32ACT_SIMD
    if (w->panel16) {
        const float *xs = (const float *)c->act; /* p16_xsum of each block, per token */
        const size_t xss = c->act_row_bytes / sizeof(float);
        if (c->n == 1)
            p16_kernels_of(w->type).gemv(w->data, c->x, c->y, (size_t)w->n_in, lo, hi, xs);
        else if (c->n <= P16_FEW_MAX_OF(w->type))
            p16_few(w->type, w->data, c->x, c->y, (size_t)w->n_in, (size_t)w->n_out, c->n, lo,
                    hi, xs, xss);
        else p16_gemm(w->type, w->data, c->x, c->y, (size_t)w->n_in, (size_t)w->n_out, c->n, lo,
                      hi, xs, xss);
        return;
    }
#endif
#ifdef PGD_F32ACT_SIMD
    if (c->panel && c->n >= PANEL_MIN_TOKENS && is_quant_type(w->type) &&
        pgd_vec_dot_type(w->type) == PGD_TYPE_F32) {
        matmul_rows_panel(c, lo, hi, ith);
        return;
    }
#else
    (void)ith;
#endif
#ifdef __AVX2__
    tile_plan pl;
    if (plan_for(w->type, &pl)) {
        const bool is_float = pgd_vec_dot_type(w->type) == PGD_TYPE_F32;
        tile g = {.w_stride = w->row_bytes,
                  .a_stride = is_float ? (size_t)w->n_in * sizeof(float) : c->act_row_bytes,
                  .y_stride = (size_t)w->n_out,
                  .n = w->n_in,
                  .ds_off = act_ds_offset(w),
                  .prefetch = true};
        /* Float weights read x directly: no conversion pass. */
        const unsigned char *a0 = is_float ? (const unsigned char *)c->x : c->act;
        const int mr = c->n == 1 ? pl.mr1 : pl.mr, mt = pl.mt;
        long tb = (long)(ACT_L2_BYTES / g.a_stride) / mt * mt;
        if (tb < mt) tb = mt;
        for (long t0 = 0; t0 < c->n; t0 += tb) {
            long t1 = t0 + tb < c->n ? t0 + tb : c->n;
            for (long r = lo; r < hi; r += mr) {
                int nr = hi - r < mr ? (int)(hi - r) : mr;
                g.w = base + (size_t)r * w->row_bytes;
                sweep_tokens(pl.fns[nr - 1], &g, t0, t1, mt, a0, c->y + r, (size_t)w->n_out);
            }
        }
        return;
    }
#endif
    for (long r = lo; r < hi; r++) {
        const void *row = base + (size_t)r * w->row_bytes;
        for (int t = 0; t < c->n; t++)
            c->y[(size_t)t * w->n_out + r] =
                pgd_vec_dot(w->type, row, c->act + (size_t)t * c->act_row_bytes, w->n_in);
    }
}

static void matmul_chunk(void *arg, long chunk, int ith) {
    matmul_ctx *c = arg;
    long lo = chunk * c->chunk_rows, hi = lo + c->chunk_rows;
    if (hi > c->w->n_out) hi = (long)c->w->n_out;
    matmul_rows(c, lo, hi, ith);
}

size_t pgd_cpu_matmul_panel_bytes(size_t act_row_bytes, int n_threads) {
    return (size_t)n_threads * TILE_R * panel_stride(act_row_bytes);
}

void pgd_cpu_matmul(pgd_pool *pool, const pgd_weight *w, const float *x, float *y, int n,
                    void *act, size_t act_row_bytes, void *panel) {
    PGD_ASSERT(act_row_bytes >= pgd_cpu_matmul_act_row_bytes(w));
    int nth = pgd_pool_n_threads(pool);
    /* About 8 chunks per thread (dynamic balance on a shared machine), at least 16 rows each. */
    long rows = (long)((w->n_out + 8 * nth - 1) / (8 * nth));
    if (rows < 16) rows = 16;
    rows = (rows + TILE_R - 1) / TILE_R * TILE_R;
    if (w->panel16) { /* whole panels; in decode whole groups of 4 (4 streams) */
        const long g = n == 1 ? 64 : 16;
        rows = (rows + g - 1) / g * g;
    }
    matmul_ctx c = {w, x, act, act_row_bytes, panel, y, n, rows};
    if (!(tiled_type(w->type) && pgd_vec_dot_type(w->type) == PGD_TYPE_F32)) {
        if (n > 1) pgd_pool_run_chunks(pool, quant_chunk, &c, n);
        else quant_chunk(&c, 0, 0);
    }
#ifdef PGD_F32ACT_SIMD
    if (w->panel16 && w->type != PGD_TYPE_F16 && P16_HAS_OFF(w->type)) {
        if (n > 1) pgd_pool_run_chunks(pool, xsum_chunk, &c, n);
        else xsum_chunk(&c, 0, 0);
    }
#endif
    pgd_pool_run_chunks(pool, matmul_chunk, &c, (long)((w->n_out + rows - 1) / rows));
}
