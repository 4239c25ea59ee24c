/* The kernels over 16-row weight panels (layouts in p16_layout.h), written once for two vector
 * widths. The file that includes this header defines, for its instruction set:
 *   v16          the 16 rows of one panel element as F32 (AVX2: two __m256; AVX-512: __m512)
 *   vb           one float broadcast to a v16's lanes (AVX2 __m256, AVX-512 __m512)
 *   v16_zero, v16_load and v16_store (P16_ALIGN-aligned), v16_loadu and v16_storeu (not in the
 *   GEMM-only build),
 *   v16_fma(a, b, c) = a * b + c rounded once, v16_fmab(a, vb, c) likewise, vb_bcast(const
 *   float *), vb_set1(float), v16_mul, v16_muls (by a float), v16_neg, v16_f16 (16 fp16 values
 *   at p), v16_u8 and v16_i8 (16 bytes widened);
 *   the weight decoders p16_w_q8, p16_w_nib, p16_w_q6k, p16_w_q3k (each row's value the same
 *   exact integer in either width);
 *   P16_NT (tokens per GEMM tile: the accumulators the register file holds) and P16_ALIGN;
 *   and P16_GEMM_ONLY where only the GEMM (p16_gemm) is wanted.
 * Every (row, token) output is the same FMA chain, lane for lane, in either width and in every
 * tile shape, so the AVX2 and the AVX-512 kernels give the same bits (tests/unit/test_matmul.c)
 * and batch invariance holds across both. */
#ifndef PGD_BACKEND_CPU_P16_KERNELS_H
#define PGD_BACKEND_CPU_P16_KERNELS_H

#include "backend/cpu/p16_layout.h"

#define P16_KC 256 /* K slice of a GEMM pass (a multiple of 32): 16 KiB of F32 weights in L1 */
#define P16_TB 144 /* most tokens per block (a multiple of P16_NT): n splits into equal blocks */
#define P16_XG (1u << 20) /* bytes of a block's activations over a group of K slices: stay in L2 */

/* F16 panels: element k's 16 weights. Q8_0: a block's 16 scales. */
INLINE v16 p16_w_f16(const uint16_t *p, size_t k) { return v16_f16(p + k * 16); }
INLINE v16 p16_d_q8(const uint8_t *qb) { return v16_f16(qb); }

/* Q4_0..Q5_1: the 16 rows' d and offset o of panel block qb (-8d and -16d are exact). */
INLINE void p16_s_q4x(const pgd_type t, const uint8_t *qb, v16 *d, v16 *o) {
    *d = v16_f16(qb);
    *o = P16_HAS_M(t) ? v16_f16(qb + 32) : v16_muls(*d, P16_Q5(t) ? -16.0f : -8.0f);
}

/* Q4_K: group j's (0..7) d1 = d * sc and -m1 = -(dmin * mn) of the 16 rows (exact products;
 * ggml's get_scale_min_k4 on 16 rows at once). */
INLINE void p16_s_q4k(const uint8_t *sb, int j, v16 *d1, v16 *nm1) {
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
    *d1 = v16_mul(v16_f16(sb), v16_u8(sc));
    *nm1 = v16_neg(v16_mul(v16_f16(sb + 32), v16_u8(mn)));
}

/* Q6_K: group g's (0..15) d1 = d * sc of the 16 rows, and -32 d1 (exact). */
INLINE void p16_s_q6k(const uint8_t *sb, int g, v16 *d1, v16 *nm) {
    *d1 = v16_mul(v16_f16(sb), v16_i8(_mm_loadu_si128((const __m128i *)(sb + 32 + 16 * g))));
    *nm = v16_muls(*d1, -32.0f);
}

/* Q3_K: group i's (0..15) d1 = d * (sc - 32) of the 16 rows, and -4 d1 (exact); ggml's kmask
 * unpacking of the 6-bit scales on 16 rows at once (sc - 32 fits a signed byte). */
INLINE void p16_s_q3k(const uint8_t *sb, int i, v16 *d1, v16 *nm) {
    const uint8_t *b = sb + 32;
    const __m128i m4 = _mm_set1_epi8(15), m3 = _mm_set1_epi8(3);
#define P16_LD(i) _mm_loadu_si128((const __m128i *)(b + 16 * (i)))
    __m128i lo = i < 8 ? _mm_and_si128(P16_LD(i), m4)
                       : _mm_and_si128(_mm_srli_epi16(P16_LD(i - 8), 4), m4);
    __m128i hi = _mm_and_si128(_mm_srli_epi16(P16_LD(8 + i % 4), 2 * (i / 4)), m3);
#undef P16_LD
    __m128i sc = _mm_sub_epi8(_mm_or_si128(lo, _mm_slli_epi16(hi, 4)), _mm_set1_epi8(32));
    *d1 = v16_mul(v16_f16(sb), v16_i8(sc));
    *nm = v16_muls(*d1, -4.0f);
}

/* Block-quantized panels by block (P16_BL elements): block blk's 16 rows' weights at element k
 * of the block. */
INLINE v16 p16_w_blk(const pgd_type t, const uint8_t *p, size_t blk, int k) {
    if (t == PGD_TYPE_Q8_0) return p16_w_q8(p + blk * P16_Q8_BLOCK, k);
    if (P16_Q4X(t)) return p16_w_nib(p + blk * P16_Q4X_BLOCK(t) + P16_Q4X_HDR(t) +
                                         P16_Q4X_KB(t) * k, P16_Q5(t));
    if (P16_K4(t))
        return p16_w_nib(p + blk / 8 * P16_K4_SB(t) + P16_Q4K_Q +
                             ((blk % 8) * 32 + (size_t)k) * P16_K4_KB(t),
                         t == PGD_TYPE_Q5_K);
    if (t == PGD_TYPE_Q6_K) return p16_w_q6k(p + blk / 16 * P16_Q6K_SB, (int)(blk % 16) * 16 + k);
    return p16_w_q3k(p + blk / 16 * P16_Q3K_SB, (int)(blk % 16) * 16 + k);
}
/* Block blk's per-row factors: Q8_0 the scales (nm unused), Q4_K d1 and -m1, Q6_K d1, -32 d1,
 * Q4_0..Q5_1 d and the offset. */
INLINE void p16_blk_scales(const pgd_type t, const uint8_t *p, size_t blk, v16 *d, v16 *nm) {
    if (t == PGD_TYPE_Q8_0) {
        *d = p16_d_q8(p + blk * P16_Q8_BLOCK);
        *nm = v16_zero();
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
INLINE v16 p16_fold(const pgd_type t, v16 d, v16 nm, v16 s, v16 y, float xs) {
    y = v16_fma(d, s, y);
    return P16_HAS_OFF(t) ? v16_fmab(nm, vb_set1(xs), y) : y;
}

/* Elements [k0, k1) of one panel as F32, wf[k - k0][16] (F16 weights; the block types' quants),
 * and for the block types their blocks' factors, ds[(k - k0) / P16_BL][32]: the 16 scales
 * (Q8_0) or d1, then the 16 offset factors nm. */
static void p16_slice(pgd_type t, const uint8_t *panel, size_t k0, size_t k1, float *wf,
                      float *ds) {
    for (size_t k = k0; k < k1; k++) {
        v16 w;
        if (t == PGD_TYPE_F16) {
            w = p16_w_f16((const uint16_t *)panel, k);
        } else {
            const size_t bl = P16_BL(t);
            w = p16_w_blk(t, panel, k / bl, (int)(k % bl));
            if (k % bl == 0) {
                v16 d, nm;
                p16_blk_scales(t, panel, k / bl, &d, &nm);
                float *o = ds + (k - k0) / bl * 32;
                v16_store(o, d);
                v16_store(o + 16, nm);
            }
        }
        v16_store(wf + (k - k0) * 16, w);
    }
}

/* GEMM tile: NT tokens x 16 rows over [k0, k1) of a slice converted by p16_slice; y (16 floats a
 * token, p16_gemm's scratch) holds the running sums between slices. F16: one chain over the
 * slice, continued from y. Block types: a chain per block from +0, then p16_fold. */
INLINE void p16_tile(const float *wf, const float *ds, const float *x, size_t K, float *y,
                     const int NT, size_t k0, size_t k1, const pgd_type t, const float *xs,
                     size_t xss) {
    const bool q8 = t != PGD_TYPE_F16; /* block-quantized */
    const size_t bl = P16_BL(t);
    for (size_t b0 = k0; b0 < k1; b0 += q8 ? bl : k1 - k0) {
        const size_t b1 = q8 ? b0 + bl : k1;
        v16 s[P16_NT];
#pragma GCC unroll 12
        for (int u = 0; u < NT; u++)
            s[u] = !q8 && k0 ? v16_load(y + 16 * u) : v16_zero();
        for (size_t k = b0; k < b1; k++) {
            const v16 w = v16_load(wf + (k - k0) * 16);
#pragma GCC unroll 12
            for (int u = 0; u < NT; u++) s[u] = v16_fmab(w, vb_bcast(x + (size_t)u * K + k), s[u]);
        }
        const float *d = ds + (b0 - k0) / bl * 32;
#pragma GCC unroll 12
        for (int u = 0; u < NT; u++) {
            const float xsu = q8 && P16_HAS_OFF(t) ? xs[(size_t)u * xss + b0 / bl] : 0.0f;
            float *yt = y + 16 * u;
            v16 a = s[u];
            if (q8)
                a = p16_fold(t, v16_load(d), v16_load(d + 16), a,
                             b0 ? v16_load(yt) : v16_zero(), xsu);
            v16_store(yt, a);
        }
    }
}

typedef void (*p16_fn)(const float *, const float *, const float *, size_t, float *, size_t,
                       size_t, const float *, size_t);
#define P16_T(NAME, NT, T)                                                                       \
    static void NAME##_##NT(const float *wf, const float *ds, const float *x, size_t K, float *y, \
                            size_t k0, size_t k1, const float *xs, size_t xss) {                 \
        p16_tile(wf, ds, x, K, y, NT, k0, k1, T, xs, xss);                                       \
    }
#if P16_NT == 6
#define P16_TILES(NAME, T)                                                                       \
    P16_T(NAME, 1, T) P16_T(NAME, 2, T) P16_T(NAME, 3, T) P16_T(NAME, 4, T)                      \
    P16_T(NAME, 5, T) P16_T(NAME, 6, T)                                                          \
    static const p16_fn NAME[6] = {NAME##_1, NAME##_2, NAME##_3, NAME##_4, NAME##_5, NAME##_6};
#elif P16_NT == 8
#define P16_TILES(NAME, T)                                                                       \
    P16_T(NAME, 1, T) P16_T(NAME, 2, T) P16_T(NAME, 3, T) P16_T(NAME, 4, T)                      \
    P16_T(NAME, 5, T) P16_T(NAME, 6, T) P16_T(NAME, 7, T) P16_T(NAME, 8, T)                      \
    static const p16_fn NAME[8] = {NAME##_1, NAME##_2, NAME##_3, NAME##_4,                       \
                                   NAME##_5, NAME##_6, NAME##_7, NAME##_8};
#elif P16_NT == 12
#define P16_TILES(NAME, T)                                                                       \
    P16_T(NAME, 1, T) P16_T(NAME, 2, T) P16_T(NAME, 3, T) P16_T(NAME, 4, T)                      \
    P16_T(NAME, 5, T) P16_T(NAME, 6, T) P16_T(NAME, 7, T) P16_T(NAME, 8, T)                      \
    P16_T(NAME, 9, T) P16_T(NAME, 10, T) P16_T(NAME, 11, T) P16_T(NAME, 12, T)                   \
    static const p16_fn NAME[12] = {NAME##_1, NAME##_2, NAME##_3,  NAME##_4,                     \
                                    NAME##_5, NAME##_6, NAME##_7,  NAME##_8,                     \
                                    NAME##_9, NAME##_10, NAME##_11, NAME##_12};
#else
#error "P16_NT: 6, 8 or 12"
#endif
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

#ifndef P16_GEMM_ONLY /* the GEMV and the few-token kernels: matmul.c's AVX2 build only */
/* Q8_0 decode prefetches each panel's stream this far ahead, one hint per 64-byte line: 4
 * streams 4 lines ahead is the pattern that reads fastest on the 2-core machine (`pagoda
 * bench`'s probe). Q8_0 panels 1.07-1.3x over the hardware prefetchers alone; F16 panels,
 * which a core streams twice as fast, measured no gain and take none (bench/RESULTS.md). */
#define P16_PF_BYTES 256

/* Element k of block blk of NP panels pb bytes apart: the block's first lines, one per k, are
 * the ones to prefetch P16_PF_BYTES ahead. */
INLINE void p16_prefetch(const pgd_type t, const int NP, const uint8_t *p, size_t pb, size_t blk,
                         int k) {
    if (k >= P16_BLK_LINES(t)) return;
#pragma GCC unroll 4
    for (int q = 0; q < NP; q++)
        _mm_prefetch((const char *)(p16_blk_bytes(t, p + q * pb, blk) + P16_PF_BYTES +
                                    64 * (size_t)k),
                     _MM_HINT_T0);
}

/* One token, NP panels (16 * NP rows from row n): NP chains of 16 rows each. */
INLINE void p16_gemv_np(const pgd_type t, const int NP, const uint8_t *p, size_t pb,
                        const float *x, float *y, size_t K, const float *xs) {
    v16 a[4];
#pragma GCC unroll 4
    for (int i = 0; i < NP; i++) a[i] = v16_zero();
    if (t == PGD_TYPE_F16) {
        for (size_t k = 0; k < K; k++) {
            const vb b = vb_bcast(x + k);
#pragma GCC unroll 4
            for (int q = 0; q < NP; q++)
                a[q] = v16_fmab(p16_w_f16((const uint16_t *)(p + q * pb), k), b, a[q]);
        }
    } else {
        const int bl = P16_BL(t);
        for (size_t blk = 0; blk < K / (size_t)bl; blk++) {
            v16 sq[4];
#pragma GCC unroll 4
            for (int i = 0; i < NP; i++) sq[i] = v16_zero();
            for (int k = 0; k < bl; k++) {
                const vb b = vb_bcast(x + blk * bl + (size_t)k);
                p16_prefetch(t, NP, p, pb, blk, k);
#pragma GCC unroll 4
                for (int q = 0; q < NP; q++)
                    sq[q] = v16_fmab(p16_w_blk(t, p + q * pb, blk, k), b, sq[q]);
            }
            const float xsb = P16_HAS_OFF(t) ? xs[blk] : 0.0f;
#pragma GCC unroll 4
            for (int q = 0; q < NP; q++) {
                v16 d, nm;
                p16_blk_scales(t, p + q * pb, blk, &d, &nm);
                a[q] = p16_fold(t, d, nm, sq[q], a[q], xsb);
            }
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < NP; i++) v16_storeu(y + 16 * i, a[i]);
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

/* NT <= 4 tokens, NP panels (16 * NP rows; NP * NT <= 4: 8 independent AVX2 FMA chains at most,
 * enough to hide the FMA latency in 16 registers): p16_gemv_np's chains for each token, every
 * weight converted once for all NT. A block's partial sums are folded into y at the block's end
 * (the running sum goes through memory, exactly), so each row gets gemv's bits. */
INLINE void p16_few_panels(const pgd_type t, const int NT, const int NP, const uint8_t *p,
                           size_t pb, const float *x, size_t K, float *y, size_t N,
                           const float *xs, size_t xss) {
    if (t == PGD_TYPE_F16) {
        v16 a[4][4];
#pragma GCC unroll 4
        for (int q = 0; q < NP; q++)
#pragma GCC unroll 4
            for (int u = 0; u < NT; u++) a[q][u] = v16_zero();
        for (size_t k = 0; k < K; k++) {
#pragma GCC unroll 4
            for (int q = 0; q < NP; q++) {
                const v16 w = p16_w_f16((const uint16_t *)(p + q * pb), k);
#pragma GCC unroll 4
                for (int u = 0; u < NT; u++)
                    a[q][u] = v16_fmab(w, vb_bcast(x + (size_t)u * K + k), a[q][u]);
            }
        }
#pragma GCC unroll 4
        for (int q = 0; q < NP; q++)
#pragma GCC unroll 4
            for (int u = 0; u < NT; u++) v16_storeu(y + (size_t)u * N + 16 * q, a[q][u]);
        return;
    }
    const int bl = P16_BL(t);
    for (size_t blk = 0; blk < K / (size_t)bl; blk++) {
        v16 sq[4][4];
#pragma GCC unroll 4
        for (int q = 0; q < NP; q++)
#pragma GCC unroll 4
            for (int u = 0; u < NT; u++) sq[q][u] = v16_zero();
        for (int k = 0; k < bl; k++) {
            p16_prefetch(t, NP, p, pb, blk, k);
#pragma GCC unroll 4
            for (int q = 0; q < NP; q++) {
                const v16 w = p16_w_blk(t, p + q * pb, blk, k);
#pragma GCC unroll 4
                for (int u = 0; u < NT; u++)
                    sq[q][u] = v16_fmab(w, vb_bcast(x + (size_t)u * K + blk * bl + (size_t)k),
                                        sq[q][u]);
            }
        }
        float xsb[4];
#pragma GCC unroll 4
        for (int u = 0; u < NT; u++)
            xsb[u] = P16_HAS_OFF(t) ? xs[(size_t)u * xss + blk] : 0.0f;
#pragma GCC unroll 4
        for (int q = 0; q < NP; q++) {
            v16 d, nm;
            p16_blk_scales(t, p + q * pb, blk, &d, &nm);
#pragma GCC unroll 4
            for (int u = 0; u < NT; u++) {
                float *yu = y + (size_t)u * N + 16 * q;
                v16_storeu(yu, p16_fold(t, d, nm, sq[q][u], blk ? v16_loadu(yu) : v16_zero(),
                                        xsb[u]));
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

#endif /* P16_GEMM_ONLY */

/* The panel types' kernels: tiles of the GEMM, few-token functions, the one-token GEMV. */
typedef struct p16_kernels {
    const p16_fn *tiles;
#ifndef P16_GEMM_ONLY
    const p16_few_fn *few;
    void (*gemv)(const uint8_t *, const float *, float *, size_t, long, long, const float *);
#endif
} p16_kernels;
static p16_kernels p16_kernels_of(pgd_type t) {
#ifdef P16_GEMM_ONLY
#define P16_K(N) (p16_kernels){p16_tiles_##N}
#else
#define P16_K(N) (p16_kernels){p16_tiles_##N, p16_few_##N, p16_gemv_##N}
#endif
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

#ifndef P16_GEMM_ONLY
/* A few tokens, rows [lo, hi) (multiples of 16): groups of up to 4 tokens stream the panels
 * (two at a time for 2 tokens). */
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
        if (nt == 2) /* two panels a call: 8 AVX2 chains, as the others have */
            for (; r + 32 <= hi; r += 32)
                pair(P + (size_t)(r / 16) * pb, pb, xt, K, yt + r, N, xst, xss);
        for (; r < hi; r += 16)
            fns[nt - 1](P + (size_t)(r / 16) * pb, pb, xt, K, yt + r, N, xst, xss);
    }
}

#endif

/* n tokens, rows [lo, hi) (multiples of 16): equal token blocks of at most P16_TB, then groups
 * of K slices (P16_XG bytes of the block's activations, which stay in L2 while every panel
 * reads them), then panels, then the group's K slices (each converted to F32 once), then token
 * tiles of up to P16_NT. A panel's outputs collect in yb, 16 floats a token, and go to y once a
 * group: with the tiles storing to y itself, N floats apart, N = 8192 ran at 0.7x the speed of
 * N = 8000 (bench/RESULTS.md). Each output's chain still runs over k in order. */
static void p16_gemm(pgd_type t, const uint8_t *P, const float *x, float *y, size_t K, size_t N,
                     int n, long lo, long hi, const float *xs, size_t xss) {
    static _Thread_local float wf[P16_KC * 16] __attribute__((aligned(P16_ALIGN)));
    static _Thread_local float ds[P16_KC / 16 * 32] __attribute__((aligned(P16_ALIGN)));
    static _Thread_local float yb[P16_TB * 16] __attribute__((aligned(P16_ALIGN)));
    /* Equal slices of at most P16_KC, multiples of 32 (576 = 288 + 288, not 256 + 256 + 64: a
     * short slice pays the accumulators' reload and store for few FMAs). */
    const size_t ns = (K + P16_KC - 1) / P16_KC, kc = ((K + ns - 1) / ns + 31) / 32 * 32;
    const size_t pb = p16_panel_bytes(t, K);
    const p16_fn *tiles = p16_kernels_of(t).tiles;
    /* equal blocks: 128 tokens in one, not 96 + 32 (each block converts every panel again) */
    const long nb = (n + P16_TB - 1) / P16_TB;
    const long tb = ((n + nb - 1) / nb + P16_NT - 1) / P16_NT * P16_NT;
    size_t gk = P16_XG / ((size_t)tb * sizeof(float)) / kc * kc; /* a group's elements */
    if (gk < kc) gk = kc;
    for (long t0 = 0; t0 < n; t0 += tb) {
        const long t1 = t0 + tb < n ? t0 + tb : n;
        for (size_t g0 = 0; g0 < K; g0 += gk) {
            const size_t g1 = g0 + gk < K ? g0 + gk : K;
            for (long r = lo; r < hi; r += 16) {
                const uint8_t *p = P + (size_t)(r / 16) * pb;
                if (g0) /* the sums so far (the first group's tiles start from +0) */
                    for (long u = t0; u < t1; u++)
                        memcpy(yb + (u - t0) * 16, y + (size_t)u * N + r, 16 * sizeof(float));
                for (size_t k0 = g0; k0 < g1; k0 += kc) {
                    const size_t k1 = k0 + kc < g1 ? k0 + kc : g1;
                    p16_slice(t, p, k0, k1, wf, ds);
                    for (long tt = t0; tt < t1; tt += P16_NT) {
                        const int nt = t1 - tt < P16_NT ? (int)(t1 - tt) : P16_NT;
                        tiles[nt - 1](wf, ds, x + (size_t)tt * K, K, yb + (tt - t0) * 16, k0, k1,
                                      xs + (size_t)tt * xss, xss);
                    }
                }
                for (long u = t0; u < t1; u++)
                    memcpy(y + (size_t)u * N + r, yb + (u - t0) * 16, 16 * sizeof(float));
            }
        }
    }
}

#ifndef P16_GEMM_ONLY
/* Rows [lo, hi) of y = x . W^T for n tokens of a panel16 weight P: the GEMV, the few-token
 * kernels or the GEMM, by n. xs: each token's block sums (p16_xsum), xss floats apart. */
static void p16_rows(pgd_type t, const uint8_t *P, const float *x, float *y, size_t K, size_t N,
                     int n, long lo, long hi, const float *xs, size_t xss) {
    if (n == 1) p16_kernels_of(t).gemv(P, x, y, K, lo, hi, xs);
    else if (n <= P16_FEW_MAX_OF(t)) p16_few(t, P, x, y, K, N, n, lo, hi, xs, xss);
    else p16_gemm(t, P, x, y, K, N, n, lo, hi, xs, xss);
}

#endif /* P16_GEMM_ONLY */

#endif
