/* Matrix products: output rows are split across the pool. By default every weight type runs on
 * F32 activations through register tiles (up to 4 rows x 3 tokens, each weight block loaded -
 * and for quantized types dequantized in registers - once per tile; quant_f32act.h). With int8
 * activations (pgd_cpu_int8_act) activations are first converted once per call into the weight's
 * dot-product format; Q8_0/Q4_0/Q4_1 then use integer tiles, and Q4_K/Q5_K/Q6_K the K-quant tiles
 * of kq_tiles.h (AVX-512 VNNI where the CPU has it, else AVX2; bit-identical to each other and to
 * pgd_vec_dot).
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
#include "backend/cpu/p16_layout.h"
#include "backend/cpu/kq_tiles.h"
#include "util/env.h"
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

/* Hides that v is a broadcast: otherwise GCC turns each per-pair vmulps of two broadcasts into
 * vmulss + vbroadcastss (same bits, one more instruction per pair). */
INLINE __m256 opaque(__m256 v) {
    __asm__("" : "+x"(v));
    return v;
}
INLINE __m256 bcast_f16(const uint8_t *p) { return _mm256_set1_ps(_cvtsh_ss(pgd_ld_u16(p))); }

/* Block b of each of the NT tokens' Q8 activation rows: its scale broadcast, its 32 int8s. */
INLINE void load_act_q8(const tile *g, const int NT, int64_t b, __m256i *aq, __m256 *da) {
#pragma GCC unroll 4
    for (int t = 0; t < NT; t++) {
        const uint8_t *ab = g->a + (size_t)t * g->a_stride + (size_t)b * ACT_Q8_BYTES;
        da[t] = opaque(_mm256_set1_ps(pgd_ld_f32(ab)));
        aq[t] = _mm256_loadu_si256((const __m256i *)(ab + 8));
    }
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
        load_act_q8(g, NT, b, aq, da);
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            const uint8_t *wb = g->w + (size_t)r * g->w_stride + (size_t)b * bsz;
            __m256i wq = q4 ? _mm256_sub_epi8(pgd_nibbles32(wb + 2), off)
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
            load_act_q8(g, NT, b, aq, da);
#pragma GCC unroll 4
            for (int r = 0; r < NR; r++) {
                const uint8_t *wb = g->w + (size_t)r * g->w_stride + (size_t)b * Q4_1_BYTES;
                __m256i wq = pgd_nibbles32(wb + 4);
                __m256 dw = bcast_f16(wb);
                mf[r][b - b0] = _cvtsh_ss(pgd_ld_u16(wb + 2));
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
    if (kind == WF32) return pgd_ld_f32(p);
    if (kind == WF16) return _cvtsh_ss(pgd_ld_u16(p));
    return pgd_bf16_to_fp32(pgd_ld_u16(p));
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
typedef const tile_fn (*tile_fns)[TILE_T];
typedef struct tile_plan {
    tile_fns fns;
    int mr, mt, mr1;
} tile_plan;

/* The kernels per weight type: int8 activations, or F32 ones for the quantized types whose
 * dot takes F32 activations (pgd_vec_dot_type). */
static const tile_fns int8act_tiles[PGD_TYPE_COUNT] = {
    [PGD_TYPE_Q8_0] = tiles_q8_0, [PGD_TYPE_Q4_0] = tiles_q4_0, [PGD_TYPE_Q4_1] = tiles_q4_1,
    [PGD_TYPE_F32] = tiles_f32,   [PGD_TYPE_F16] = tiles_f16,   [PGD_TYPE_BF16] = tiles_bf16,
};
#ifdef PGD_F32ACT_SIMD
static const tile_fns f32act_tiles[PGD_TYPE_COUNT] = {
    [PGD_TYPE_Q8_0] = fa_q8_0, [PGD_TYPE_Q4_0] = fa_q4_0,     [PGD_TYPE_Q4_1] = fa_q4_1,
    [PGD_TYPE_Q4_K] = fa_q4_k, [PGD_TYPE_Q5_K] = fa_q5_k,     [PGD_TYPE_Q6_K] = fa_q6_k,
    [PGD_TYPE_Q5_0] = fa_q5_0, [PGD_TYPE_Q5_1] = fa_q5_1,     [PGD_TYPE_IQ4_NL] = fa_iq4_nl,
    [PGD_TYPE_Q2_K] = fa_q2_k, [PGD_TYPE_Q3_K] = fa_q3_k,     [PGD_TYPE_IQ4_XS] = fa_iq4_xs,
};
#endif

static bool plan_for(pgd_type t, tile_plan *p) {
    if ((unsigned)t >= PGD_TYPE_COUNT) return false;
    tile_fns fns = int8act_tiles[t];
#ifdef PGD_F32ACT_SIMD
    if (is_quant_type(t) && pgd_vec_dot_type(t) == PGD_TYPE_F32) fns = f32act_tiles[t];
#endif
    if (!fns) return false;
    *p = (tile_plan){fns, 4, 3, 4};
    return true;
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
#ifdef PGD_F32ACT_SIMD
/* ---- The panel kernels' AVX2 primitives (p16_kernels.h): a panel element's 16 rows as two
 * __m256, rows 0..7 and 8..15. */
typedef struct v16 {
    __m256 h[2];
} v16;
typedef __m256 vb;
#define P16_NT 6     /* tokens per GEMM tile: 12 accumulators of the 16 registers */
#define P16_ALIGN 32
INLINE v16 v16_zero(void) { return (v16){{_mm256_setzero_ps(), _mm256_setzero_ps()}}; }
INLINE v16 v16_load(const float *p) { return (v16){{_mm256_load_ps(p), _mm256_load_ps(p + 8)}}; }
INLINE v16 v16_loadu(const float *p) {
    return (v16){{_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}};
}
INLINE void v16_store(float *p, v16 v) {
    _mm256_store_ps(p, v.h[0]);
    _mm256_store_ps(p + 8, v.h[1]);
}
INLINE void v16_storeu(float *p, v16 v) {
    _mm256_storeu_ps(p, v.h[0]);
    _mm256_storeu_ps(p + 8, v.h[1]);
}
INLINE v16 v16_fma(v16 a, v16 b, v16 c) {
    return (v16){{_mm256_fmadd_ps(a.h[0], b.h[0], c.h[0]), _mm256_fmadd_ps(a.h[1], b.h[1], c.h[1])}};
}
INLINE v16 v16_fmab(v16 a, vb b, v16 c) {
    return (v16){{_mm256_fmadd_ps(a.h[0], b, c.h[0]), _mm256_fmadd_ps(a.h[1], b, c.h[1])}};
}
INLINE vb vb_bcast(const float *p) { return _mm256_broadcast_ss(p); }
INLINE vb vb_set1(float v) { return _mm256_set1_ps(v); }
INLINE v16 v16_cvt_i32(__m256i lo, __m256i hi) {
    return (v16){{_mm256_cvtepi32_ps(lo), _mm256_cvtepi32_ps(hi)}};
}
INLINE v16 v16_f16(const void *p) { /* 16 fp16 values */
    return (v16){{_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)),
                  _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint8_t *)p + 16)))}};
}
/* 16 bytes (one per row) widened to floats, unsigned or signed */
INLINE v16 v16_u8(__m128i b) {
    return v16_cvt_i32(_mm256_cvtepu8_epi32(b), _mm256_cvtepu8_epi32(_mm_srli_si128(b, 8)));
}
INLINE v16 v16_i8(__m128i b) {
    return v16_cvt_i32(_mm256_cvtepi8_epi32(b), _mm256_cvtepi8_epi32(_mm_srli_si128(b, 8)));
}
INLINE v16 v16_mul(v16 a, v16 b) {
    return (v16){{_mm256_mul_ps(a.h[0], b.h[0]), _mm256_mul_ps(a.h[1], b.h[1])}};
}
INLINE v16 v16_muls(v16 a, float f) {
    const __m256 b = _mm256_set1_ps(f);
    return (v16){{_mm256_mul_ps(a.h[0], b), _mm256_mul_ps(a.h[1], b)}};
}
INLINE v16 v16_neg(v16 a) {
    const __m256 sgn = _mm256_set1_ps(-0.0f);
    return (v16){{_mm256_xor_ps(a.h[0], sgn), _mm256_xor_ps(a.h[1], sgn)}};
}

/* Q8_0: the quants q[k][0..15] of element k of panel block qb widened (exact integers). */
INLINE v16 p16_w_q8(const uint8_t *qb, int k) {
    const uint8_t *q = qb + 32 + k * 16;
    return v16_cvt_i32(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)q)),
                       _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + 8))));
}
/* The 16 rows' quants of one element k at q: 8 bytes of nibbles (rows i and 8 + i in byte i),
 * for five-bit types then a 16-bit word with row r's fifth bit at bit r (Q4_0..Q5_1, Q4_K,
 * Q5_K). */
INLINE v16 p16_w_nib(const uint8_t *q, const bool five) {
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
    return v16_cvt_i32(lo, hi);
}
/* Q6_K: the 16 rows' q (0..63, exact) of element k (0..255) of panel super-block sb. */
INLINE v16 p16_w_q6k(const uint8_t *sb, int k) {
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
    return v16_cvt_i32(_mm256_or_si256(_mm256_and_si256(n, _mm256_set1_epi32(15)), hlo),
                       _mm256_or_si256(_mm256_srli_epi32(n, 4), hhi));
}
/* Q3_K: the 16 rows' u (0..7, exact) of element k (0..255) of panel super-block sb. */
INLINE v16 p16_w_q3k(const uint8_t *sb, int k) {
    int32_t lw;
    uint16_t hw;
    p16_q3k_words(sb, k, &lw, &hw);
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
    return v16_cvt_i32(u0, u1);
}

#include "backend/cpu/p16_kernels.h"

/* The sum of a block's activations, in one fixed order (the offset terms). */
INLINE float p16_xsum(const pgd_type t, const float *x) {
    __m256 a = _mm256_add_ps(_mm256_loadu_ps(x), _mm256_loadu_ps(x + 8));
    if (P16_BL(t) == 32)
        a = _mm256_add_ps(a, _mm256_add_ps(_mm256_loadu_ps(x + 16), _mm256_loadu_ps(x + 24)));
    return pgd_hsum8(a);
}
#endif

#ifdef PGD_F32ACT_SIMD
/* The block types with a panel layout, and the variable that turns each off. */
static const struct {
    pgd_type t;
    pgd_env_var env;
} k_p16_fmts[] = {
    {PGD_TYPE_Q8_0, PGD_ENV_PACK_Q8_0}, {PGD_TYPE_Q4_0, PGD_ENV_PACK_Q4_Q5},
    {PGD_TYPE_Q4_1, PGD_ENV_PACK_Q4_Q5}, {PGD_TYPE_Q5_0, PGD_ENV_PACK_Q4_Q5},
    {PGD_TYPE_Q5_1, PGD_ENV_PACK_Q4_Q5}, {PGD_TYPE_Q3_K, PGD_ENV_PACK_Q3_K},
    {PGD_TYPE_Q4_K, PGD_ENV_PACK_Q4_K}, {PGD_TYPE_Q5_K, PGD_ENV_PACK_Q5_K},
    {PGD_TYPE_Q6_K, PGD_ENV_PACK_Q6_K},
};
#endif

bool pgd_cpu_can_pack(const pgd_weight *w) {
#ifdef PGD_F32ACT_SIMD
    const char *env = pgd_env(PGD_ENV_PACK);
    if (env && env[0] == '0') return false;
    if (w->panel16 || w->n_out % 16 || w->n_in <= 0) return false;
    if (w->type == PGD_TYPE_F16) {
        env = pgd_env(PGD_ENV_PACK_F16);
        return !(env && env[0] == '0') && w->row_bytes == (size_t)w->n_in * 2;
    }
    for (size_t i = 0; i < sizeof k_p16_fmts / sizeof k_p16_fmts[0]; i++) {
        if (k_p16_fmts[i].t != w->type) continue;
        env = pgd_env(k_p16_fmts[i].env);
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

/* ---- Instruction set of the panel kernels ---------------------------------------------- */

static bool avx512_supported(void) {
#ifdef PGD_AVX512_KERNELS
    /* libgcc's and compiler-rt's checks include the OS's saving of the zmm state (XCR0) */
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#else
    return false;
#endif
}

static int g_avx512 = -1; /* -1: not decided yet */

bool pgd_cpu_set_avx512(int on) {
    const bool v = on && avx512_supported();
    __atomic_store_n(&g_avx512, v ? 1 : 0, __ATOMIC_RELAXED);
    return v;
}

bool pgd_cpu_avx512(void) {
    int v = __atomic_load_n(&g_avx512, __ATOMIC_RELAXED);
    if (v < 0) {
        const char *env = pgd_env(PGD_ENV_AVX512);
        v = pgd_cpu_set_avx512(!(env && env[0] == '0'));
    }
    return v;
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

#ifdef __AVX2__
/* Q4_K/Q5_K/Q6_K with Q8_K activations (int8 mode). */
static bool kq_int8(const pgd_weight *w) {
    return (w->type == PGD_TYPE_Q4_K || w->type == PGD_TYPE_Q5_K || w->type == PGD_TYPE_Q6_K) &&
           pgd_vec_dot_type(w->type) == PGD_TYPE_Q8_K;
}

static int g_kq_vnni = -1; /* -1: not decided yet */

/* The VNNI tiles where the build and CPU have them, unless AVX-512 is turned off (the same
 * switch as the panel GEMM's: PAGODA_AVX512=0 or pgd_cpu_set_avx512(0)); same bits either way. */
static bool kq_use_vnni(void) {
    int v = __atomic_load_n(&g_kq_vnni, __ATOMIC_RELAXED);
    if (v < 0) {
        v = pgd__kq_vnni_supported();
        __atomic_store_n(&g_kq_vnni, v, __ATOMIC_RELAXED);
    }
    return v && pgd_cpu_avx512();
}

/* The K-quant tiles over rows [lo, hi): activations in L2-sized token blocks, each row tile
 * swept over a block's tokens mt at a time (the weights stream once per block). */
static void matmul_rows_kq(const matmul_ctx *c, long lo, long hi) {
    const pgd_weight *w = c->w;
    /* with 1 or 2 tokens the AVX2 tiles are faster (the VNNI tiles' unpacking and per-block
     * sums dominate; bench/RESULTS.md); same bits either way */
    const bool vnni = c->n >= 3 && kq_use_vnni();
    const int mr = vnni ? PGD_KQ_MR_VNNI : PGD_KQ_MR_AVX2;
    const int mt = vnni ? PGD_KQ_MT_VNNI : PGD_KQ_MT_AVX2;
    pgd__kq_tile g = {.w_stride = w->row_bytes, .a_stride = c->act_row_bytes,
                      .y_stride = (size_t)w->n_out, .n = w->n_in};
    long tb = (long)(ACT_L2_BYTES / g.a_stride) / mt * mt;
    if (tb < mt) tb = mt;
    for (long t0 = 0; t0 < c->n; t0 += tb) {
        const long t1 = t0 + tb < c->n ? t0 + tb : c->n;
        for (long r = lo; r < hi; r += mr) {
            const int nr = hi - r < mr ? (int)(hi - r) : mr;
            g.w = (const uint8_t *)w->data + (size_t)r * w->row_bytes;
            g.prefetch = true; /* the next rows are in cache after this row tile's first pass */
            for (long t = t0; t < t1; t += mt) {
                const int nt = t1 - t < mt ? (int)(t1 - t) : mt;
                g.a = c->act + (size_t)t * g.a_stride;
                g.y = c->y + (size_t)t * g.y_stride + r;
                if (vnni) pgd__kq_tile_vnni(w->type, &g, nr, nt);
                else pgd__kq_tile_avx2(w->type, &g, nr, nt);
                g.prefetch = false;
            }
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
#ifdef PGD_AVX512_KERNELS
        /* the GEMM's tiles are bound by FMAs and take AVX-512's wider ones; the GEMV and the
         * few-token kernels are bound by decoding the quants, which 512-bit vectors do on two
         * execution ports instead of three: they stay AVX2 (bench/RESULTS.md) */
        if (c->n > P16_FEW_MAX_OF(w->type) && pgd_cpu_avx512())
            pgd_p16_gemm_avx512(w->type, w->data, c->x, c->y, (size_t)w->n_in,
                                (size_t)w->n_out, c->n, lo, hi, xs, xss);
        else
#endif
            p16_rows(w->type, w->data, c->x, c->y, (size_t)w->n_in, (size_t)w->n_out, c->n, lo,
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
    if (kq_int8(w)) {
        matmul_rows_kq(c, lo, hi);
        return;
    }
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
