/* The body of the K-quant x Q8_K register tiles (kq_tiles.h says what they promise). Included
 * once per instruction set with KQ_W (32: AVX2, 64: AVX-512 BW + VNNI), KQ_MR and KQ_MT (rows
 * and tokens per tile, at most; tokens <= 8) and KQ_FN (the exported dispatcher's name) defined.
 *
 * A super-block (256 elements) is KQ_NC chunks of KQ_W elements. Per chunk each row's quants are
 * unpacked once into unsigned bytes (Q6_K: 0..63, its "- 32" taken off once per super-block as
 * 32 sum_g sc[g] bsums[g] from the activations' 16-element sums) and its scales into int16
 * lanes, then every token multiplies them: maddubs gives exact int16 pair sums (at most
 * 2 * 63 * 127), madd or vpdpwssd scales and adds them into int32 lanes. Per super-block each
 * (row, token)'s lanes are summed to its exact integer, and a row's tokens take the scalar code's
 * float steps side by side in one 8-lane vector (the 2-row VNNI tiles: both rows in 16 lanes). */
#include <immintrin.h>
#include <string.h>

#include "backend/cpu/kq_tiles.h"
#include "backend/cpu/simd.h"

#define KQ_INLINE static inline __attribute__((always_inline))
#define KQ_Q8K_BYTES 292 /* float d | int8 qs[256] | int16 bsums[16] */
#define KQ_Q8K_QS 4
#define KQ_Q8K_BSUMS 260
#define KQ_NC (256 / KQ_W)
#if KQ_MT > 8
#error "KQ_MT: tokens are the lanes of one __m256"
#endif
enum { KQ4, KQ5, KQ6 };

#if KQ_W == 32
typedef __m256i kv;
KQ_INLINE kv kv_zero(void) { return _mm256_setzero_si256(); }
KQ_INLINE kv kv_load(const uint8_t *p) { return _mm256_loadu_si256((const __m256i *)p); }
KQ_INLINE kv kv_maddubs(kv q, kv x) { return _mm256_maddubs_epi16(q, x); }
KQ_INLINE kv kv_dot(kv acc, kv p, kv s) { return _mm256_add_epi32(acc, _mm256_madd_epi16(p, s)); }
KQ_INLINE __m256i kv_fold8(kv v) { return v; }
KQ_INLINE kv kv_sub8(kv v, __m256i c) { return _mm256_sub_epi32(v, c); }
#else
typedef __m512i kv;
KQ_INLINE kv kv_zero(void) { return _mm512_setzero_si512(); }
KQ_INLINE kv kv_load(const uint8_t *p) { return _mm512_loadu_si512((const void *)p); }
KQ_INLINE kv kv_maddubs(kv q, kv x) { return _mm512_maddubs_epi16(q, x); }
KQ_INLINE kv kv_dot(kv acc, kv p, kv s) { return _mm512_dpwssd_epi32(acc, p, s); }
/* int32 lane l + lane 8 + l: bytes 4l..4l+3 of both 32-element halves, as the AVX2 lanes */
KQ_INLINE __m256i kv_fold8(kv v) {
    return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
}
KQ_INLINE kv kv_sub8(kv v, __m256i c) { return _mm512_sub_epi32(v, _mm512_zextsi256_si512(c)); }
KQ_INLINE kv kv_bcast256(const uint8_t *p) {
    return _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)p));
}
/* 32 int16 lanes: lanes 0..15 lo, 16..31 hi */
KQ_INLINE kv kv_halves16(int lo, int hi) {
    return _mm512_inserti64x4(_mm512_set1_epi16((short)lo), _mm256_set1_epi16((short)hi), 1);
}
#endif

/* One weight row's super-block, as the chunks need it. */
typedef struct kq_row {
    const uint8_t *blk;
    uint32_t u[4]; /* Q4_K/Q5_K: bytes 0..7 the 6-bit scales, 8..15 the mins */
    __m256i sc32;  /* Q6_K: 32 x its 16 scales, int16 (the "- 32" of each quant, by bsums) */
#if KQ_W == 64
    kv sc16;       /* the scales as int16 lanes (Q4_K/Q5_K: u's bytes; Q6_K: its 16 int8) */
#endif
} kq_row;

/* quant.c's unpack_k4_scales_fast (ggml's utmp trick): the same values as get_scale_min_k4. */
KQ_INLINE void kq_scales(const uint8_t *scales, uint32_t u[4]) {
    const uint32_t k1 = 0x3f3f3f3fu, k2 = 0x0f0f0f0fu, k3 = 0x03030303u;
    memcpy(u, scales, 12);
    u[3] = ((u[2] >> 4) & k2) | (((u[1] >> 6) & k3) << 4);
    const uint32_t mins_lo = u[1] & k1;
    u[1] = (u[2] & k2) | (((u[0] >> 6) & k3) << 4);
    u[2] = mins_lo;
    u[0] &= k1;
}

KQ_INLINE void kq_row_init(kq_row *r, const uint8_t *blk, const int K) {
    r->blk = blk;
    if (K != KQ6) kq_scales(blk + 4, r->u);
    if (K == KQ6)
        r->sc32 = _mm256_slli_epi16(
            _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk + 192))), 5);
#if KQ_W == 64
    if (K != KQ6)
        r->sc16 = _mm512_castsi256_si512(
            _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)r->u)));
    else
        r->sc16 = _mm512_castsi256_si512(
            _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk + 192))));
#endif
}

/* Chunk c's quants as unsigned bytes, in activation order, and its scales as int16 lanes. */
KQ_INLINE void kq_chunk(const kq_row *r, const int K, const int c, kv *q, kv *s) {
    const uint8_t *w = r->blk;
#if KQ_W == 32
    const __m256i m4 = _mm256_set1_epi8(0xF);
    if (K != KQ6) {
        /* sub-block c: the low (c even) or high nibbles of qs[32 (c / 2) ..] */
        const __m256i bits = kv_load(w + (K == KQ5 ? 48 : 16) + 32 * (c / 2));
        __m256i v = _mm256_and_si256(c & 1 ? _mm256_srli_epi16(bits, 4) : bits, m4);
        if (K == KQ5) { /* fifth bit: bit c of qh[l], moved to bit 4 (shifts stay in-byte) */
            const __m256i hb = kv_load(w + 16);
            const __m256i h = c <= 4 ? _mm256_slli_epi16(hb, 4 - c) : _mm256_srli_epi16(hb, c - 4);
            v = _mm256_or_si256(v, _mm256_and_si256(h, _mm256_set1_epi8(0x10)));
        }
        *q = v;
        *s = _mm256_set1_epi16(((const uint8_t *)r->u)[c]);
    } else {
        /* group k of half h: ql[64 h + 32 (k & 1)] nibble k >> 1, bits 2k of qh[32 h ..] */
        const int h = c / 4, k = c % 4;
        const __m256i l = kv_load(w + 64 * h + 32 * (k & 1));
        const __m256i lo = _mm256_and_si256(k < 2 ? l : _mm256_srli_epi16(l, 4), m4);
        const __m256i hb = kv_load(w + 128 + 32 * h);
        const __m256i hs = k == 0   ? _mm256_slli_epi16(hb, 4)
                           : k == 1 ? _mm256_slli_epi16(hb, 2)
                           : k == 2 ? hb
                                    : _mm256_srli_epi16(hb, 2);
        *q = _mm256_or_si256(lo, _mm256_and_si256(hs, _mm256_set1_epi8(0x30)));
        const int8_t *sc = (const int8_t *)(w + 192);
        *s = _mm256_set_m128i(_mm_set1_epi16(sc[2 * c + 1]), _mm_set1_epi16(sc[2 * c]));
    }
#else
    const __m512i m4 = _mm512_set1_epi8(0xF);
    if (K != KQ6) {
        /* sub-blocks 2c (low nibbles of qs[32 c ..]) and 2c + 1 (high nibbles) */
        const uint8_t *qs = w + (K == KQ5 ? 48 : 16) + 32 * c;
        const __m256i bits = _mm256_loadu_si256((const __m256i *)qs);
        __m512i v = _mm512_and_si512(
            _mm512_inserti64x4(_mm512_castsi256_si512(bits), _mm256_srli_epi16(bits, 4), 1), m4);
        if (K == KQ5) {
            const __m512i hb = kv_bcast256(w + 16);
            const __m512i mk = _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << (2 * c))),
                                                  _mm256_set1_epi8((char)(2 << (2 * c))), 1);
            v = _mm512_mask_add_epi8(v, _mm512_test_epi8_mask(hb, mk), v, _mm512_set1_epi8(16));
        }
        *q = v;
        *s = _mm512_permutexvar_epi16(kv_halves16(2 * c, 2 * c + 1), r->sc16);
    } else {
        /* groups 2 (c & 1) and 2 (c & 1) + 1 of half c / 2: ql[64 h .. 64 h + 63] is both */
        const int h = c / 2;
        const __m512i l = kv_load(w + 64 * h);
        const __m512i lo = _mm512_and_si512(c & 1 ? _mm512_srli_epi16(l, 4) : l, m4);
        const __m512i hb = kv_bcast256(w + 128 + 32 * h);
        const __m512i hs = c & 1 ? _mm512_srlv_epi16(hb, kv_halves16(0, 2))
                                 : _mm512_sllv_epi16(hb, kv_halves16(4, 2));
        *q = _mm512_or_si512(lo, _mm512_and_si512(hs, _mm512_set1_epi8(0x30)));
        /* int16 lane i: 16-element group 4c + i / 8 */
        const __m512i idx = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_set_m128i(_mm_set1_epi16((short)(4 * c + 1)),
                                                    _mm_set1_epi16((short)(4 * c)))),
            _mm256_set_m128i(_mm_set1_epi16((short)(4 * c + 3)),
                             _mm_set1_epi16((short)(4 * c + 2))),
            1);
        *s = _mm512_permutexvar_epi16(idx, r->sc16);
    }
#endif
}

/* The totals of NT <= 8 vectors of 8 int32 lanes, lane t for v[t] (exact; lanes past NT: 0). */
KQ_INLINE __m256i kq_hsum(const __m256i *v, const int NT) {
    const __m256i z = _mm256_setzero_si256();
    const __m256i h0 = _mm256_hadd_epi32(v[0], NT > 1 ? v[1] : z);
    const __m256i h1 = NT > 2 ? _mm256_hadd_epi32(v[2], NT > 3 ? v[3] : z) : z;
    const __m256i g0 = _mm256_hadd_epi32(h0, h1); /* tokens 0..3: low halves | high halves */
    if (NT <= 4)
        return _mm256_zextsi128_si256(
            _mm_add_epi32(_mm256_castsi256_si128(g0), _mm256_extracti128_si256(g0, 1)));
    const __m256i h2 = _mm256_hadd_epi32(v[4], NT > 5 ? v[5] : z);
    const __m256i h3 = NT > 6 ? _mm256_hadd_epi32(v[6], NT > 7 ? v[7] : z) : z;
    const __m256i g1 = _mm256_hadd_epi32(h2, h3);
    return _mm256_add_epi32(_mm256_permute2x128_si256(g0, g1, 0x20),
                            _mm256_permute2x128_si256(g0, g1, 0x31));
}

#if KQ_W == 64
/* Two rows' sums in one vector (the 2-row VNNI tiles): v[r][t] -> lane 8 r + t, the exact
 * total of v[r][t]'s 16 lanes, by an add network (no hadd): pairs, quads of tokens per 128-bit
 * lane, then across the 128-bit lanes. Tokens past NT are zero. */
KQ_INLINE __m512i kq_red2(__m512i a, __m512i b) { /* per 128 bits: a0+a2, b0+b2, a1+a3, b1+b3 */
    return _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
}
KQ_INLINE __m512i kq_red4(__m512i ab, __m512i cd) { /* per 128 bits: the a, b, c, d partials */
    return _mm512_add_epi32(_mm512_unpacklo_epi64(ab, cd), _mm512_unpackhi_epi64(ab, cd));
}
KQ_INLINE __m512i kq_row8(const kv *v, const int NT) { /* 128-bit lanes: t0..3 | t4..7, twice */
    const __m512i z = _mm512_setzero_si512();
    const __m512i a = kq_red4(kq_red2(v[0], NT > 1 ? v[1] : z),
                              NT > 2 ? kq_red2(v[2], NT > 3 ? v[3] : z) : z);
    const __m512i b = NT > 4 ? kq_red4(kq_red2(v[4], NT > 5 ? v[5] : z),
                                       NT > 6 ? kq_red2(v[6], NT > 7 ? v[7] : z) : z)
                             : z;
    return _mm512_add_epi32(_mm512_shuffle_i32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                            _mm512_shuffle_i32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
}
KQ_INLINE __m512i kq_hsum2x8(const kv *v0, const kv *v1, const int NT) {
    const __m512i e0 = kq_row8(v0, NT), e1 = kq_row8(v1, NT);
    return _mm512_add_epi32(_mm512_shuffle_i32x4(e0, e1, _MM_SHUFFLE(2, 0, 2, 0)),
                            _mm512_shuffle_i32x4(e0, e1, _MM_SHUFFLE(3, 1, 3, 1)));
}
KQ_INLINE __m512 kq_ps2(__m256 lo, __m256 hi) {
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(lo)),
                                               _mm256_castps_pd(hi), 1));
}
#endif

/* NR rows x NT tokens of weight kind K. */
KQ_INLINE void kq_tile(const pgd__kq_tile *g, const int K, const int NR, const int NT) {
    const int bsz = K == KQ4 ? 144 : K == KQ5 ? 176 : 210;
    const int64_t nb = g->n / 256;
    __m256 acc[KQ_MR]; /* lane t: token t's sum, scalar float steps per super-block */
#pragma GCC unroll 8
    for (int r = 0; r < NR; r++) acc[r] = _mm256_setzero_ps();
#if KQ_W == 64
    __m512 acc2 = _mm512_setzero_ps(); /* NR == 2: lane 8 r + t */
#endif
    for (int64_t b = 0; b < nb; b++) {
        kq_row rw[KQ_MR];
        const uint8_t *x[KQ_MT]; /* each token's Q8_K block b */
#pragma GCC unroll 8
        for (int r = 0; r < NR; r++) {
            const uint8_t *blk = g->w + (size_t)r * g->w_stride + (size_t)b * bsz;
            if (g->prefetch) { /* the same block of the next row tile */
                const char *nx = (const char *)blk + (size_t)NR * g->w_stride;
                _mm_prefetch(nx, _MM_HINT_T0);
                _mm_prefetch(nx + 64, _MM_HINT_T0);
                _mm_prefetch(nx + 128, _MM_HINT_T0);
                if (K != KQ4) _mm_prefetch(nx + 192, _MM_HINT_T0);
            }
            kq_row_init(&rw[r], blk, K);
        }
#pragma GCC unroll 8
        for (int t = 0; t < NT; t++)
            x[t] = g->a + (size_t)t * g->a_stride + (size_t)b * KQ_Q8K_BYTES;
        kv sumi[KQ_MR][KQ_MT];
#pragma GCC unroll 8
        for (int r = 0; r < NR; r++)
#pragma GCC unroll 8
            for (int t = 0; t < NT; t++) sumi[r][t] = kv_zero();
#pragma GCC unroll 8
        for (int c = 0; c < KQ_NC; c++) {
#pragma GCC unroll 8
            for (int r = 0; r < NR; r++) {
                kv q, s;
                kq_chunk(&rw[r], K, c, &q, &s);
#pragma GCC unroll 8
                for (int t = 0; t < NT; t++) {
                    const kv p = kv_maddubs(q, kv_load(x[t] + KQ_Q8K_QS + KQ_W * c));
                    sumi[r][t] = kv_dot(sumi[r][t], p, s);
                }
            }
        }
        if (K == KQ6) { /* Q6_K's quants are q - 32: less 32 sum_g sc[g] bsums[g], exactly */
#pragma GCC unroll 8
            for (int t = 0; t < NT; t++) {
                const __m256i bs = _mm256_loadu_si256((const __m256i *)(x[t] + KQ_Q8K_BSUMS));
#pragma GCC unroll 8
                for (int r = 0; r < NR; r++)
                    sumi[r][t] = kv_sub8(sumi[r][t], _mm256_madd_epi16(rw[r].sc32, bs));
            }
        }
        /* Token lanes: the activation scales, and (Q4_K/Q5_K) P[k] lane t = the pair
         * (bs[2k], bs[2k + 1]) of token t's 32-element sums bs[j] = bsums[2j] + bsums[2j + 1]. */
        float daf[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        __m256i bs8[4]; /* token t in the low half, t + 4 in the high half */
#pragma GCC unroll 8
        for (int t = 0; t < NT; t++) daf[t] = pgd_ld_f32(x[t]);
        const __m256 da = _mm256_loadu_ps(daf);
        __m256i P[4];
        if (K != KQ6) {
#pragma GCC unroll 4
            for (int t = 0; t < 4; t++) {
                __m128i lo = _mm_setzero_si128(), hi = _mm_setzero_si128();
                if (t < NT)
                    lo = _mm_hadd_epi16(
                        _mm_loadu_si128((const __m128i *)(x[t] + KQ_Q8K_BSUMS)),
                        _mm_loadu_si128((const __m128i *)(x[t] + KQ_Q8K_BSUMS + 16)));
                if (t + 4 < NT)
                    hi = _mm_hadd_epi16(
                        _mm_loadu_si128((const __m128i *)(x[t + 4] + KQ_Q8K_BSUMS)),
                        _mm_loadu_si128((const __m128i *)(x[t + 4] + KQ_Q8K_BSUMS + 16)));
                bs8[t] = NT > 4 ? _mm256_set_m128i(hi, lo) : _mm256_zextsi128_si256(lo);
            }
            const __m256i l01 = _mm256_unpacklo_epi32(bs8[0], bs8[1]);
            const __m256i l23 = _mm256_unpacklo_epi32(bs8[2], bs8[3]);
            const __m256i h01 = _mm256_unpackhi_epi32(bs8[0], bs8[1]);
            const __m256i h23 = _mm256_unpackhi_epi32(bs8[2], bs8[3]);
            P[0] = _mm256_unpacklo_epi64(l01, l23);
            P[1] = _mm256_unpackhi_epi64(l01, l23);
            P[2] = _mm256_unpacklo_epi64(h01, h23);
            P[3] = _mm256_unpackhi_epi64(h01, h23);
        }
        /* Per (row, token), as quant.c's kq_step, lane by lane:
         * s = s + ((d * da) * (float)isum - (dmin * da) * (float)msum), no FMA. */
#if KQ_W == 64
        if (NR == 2) { /* both rows in one 16-lane vector */
            const uint8_t *b0 = rw[0].blk, *b1 = rw[1].blk;
            const int doff = K == KQ6 ? 208 : 0;
            const __m512 da2 = kq_ps2(da, da);
            const __m512 dd = _mm512_mul_ps(
                kq_ps2(_mm256_set1_ps(_cvtsh_ss(pgd_ld_u16(b0 + doff))),
                       _mm256_set1_ps(_cvtsh_ss(pgd_ld_u16(b1 + doff)))),
                da2);
            __m512 term = _mm512_mul_ps(dd, _mm512_cvtepi32_ps(kq_hsum2x8(sumi[0], sumi[1], NT)));
            if (K != KQ6) {
                const __m512i mins = _mm512_inserti64x4(
                    _mm512_castsi256_si512(_mm256_broadcastsi128_si256(
                        _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)&rw[0].u[2])))),
                    _mm256_broadcastsi128_si256(
                        _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)&rw[1].u[2]))),
                    1);
                __m512i msum = _mm512_madd_epi16(_mm512_broadcast_i64x4(P[0]),
                                                 _mm512_shuffle_epi32(mins, 0x00));
                msum = _mm512_add_epi32(msum, _mm512_madd_epi16(_mm512_broadcast_i64x4(P[1]),
                                                                _mm512_shuffle_epi32(mins, 0x55)));
                msum = _mm512_add_epi32(msum, _mm512_madd_epi16(_mm512_broadcast_i64x4(P[2]),
                                                                _mm512_shuffle_epi32(mins, 0xAA)));
                msum = _mm512_add_epi32(msum, _mm512_madd_epi16(_mm512_broadcast_i64x4(P[3]),
                                                                _mm512_shuffle_epi32(mins, 0xFF)));
                const __m512 dm = _mm512_mul_ps(
                    kq_ps2(_mm256_set1_ps(_cvtsh_ss(pgd_ld_u16(b0 + 2))),
                           _mm256_set1_ps(_cvtsh_ss(pgd_ld_u16(b1 + 2)))),
                    da2);
                term = _mm512_sub_ps(term, _mm512_mul_ps(dm, _mm512_cvtepi32_ps(msum)));
            }
            acc2 = _mm512_add_ps(acc2, term);
            continue;
        }
#endif
#pragma GCC unroll 8
        for (int r = 0; r < NR; r++) {
            const uint8_t *blk = rw[r].blk;
            __m256i v[KQ_MT];
#pragma GCC unroll 8
            for (int t = 0; t < NT; t++) v[t] = kv_fold8(sumi[r][t]);
            const __m256i isum = kq_hsum(v, NT);
            const float d = _cvtsh_ss(pgd_ld_u16(blk + (K == KQ6 ? 208 : 0)));
            const __m256 dd = _mm256_mul_ps(_mm256_set1_ps(d), da);
            __m256 term = _mm256_mul_ps(dd, _mm256_cvtepi32_ps(isum));
            if (K != KQ6) {
                const __m256i mins16 = _mm256_broadcastsi128_si256(
                    _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)&rw[r].u[2])));
                __m256i msum = _mm256_madd_epi16(P[0], _mm256_shuffle_epi32(mins16, 0x00));
                msum = _mm256_add_epi32(
                    msum, _mm256_madd_epi16(P[1], _mm256_shuffle_epi32(mins16, 0x55)));
                msum = _mm256_add_epi32(
                    msum, _mm256_madd_epi16(P[2], _mm256_shuffle_epi32(mins16, 0xAA)));
                msum = _mm256_add_epi32(
                    msum, _mm256_madd_epi16(P[3], _mm256_shuffle_epi32(mins16, 0xFF)));
                const __m256 dm = _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(pgd_ld_u16(blk + 2))), da);
                term = _mm256_sub_ps(term, _mm256_mul_ps(dm, _mm256_cvtepi32_ps(msum)));
            }
            acc[r] = _mm256_add_ps(acc[r], term);
        }
    }
#if KQ_W == 64
    if (NR == 2) {
        float out[16];
        _mm512_storeu_ps(out, acc2);
#pragma GCC unroll 8
        for (int t = 0; t < NT; t++) {
            g->y[(size_t)t * g->y_stride] = out[t];
            g->y[(size_t)t * g->y_stride + 1] = out[8 + t];
        }
        return;
    }
#endif
#pragma GCC unroll 8
    for (int r = 0; r < NR; r++) {
        float out[8];
        _mm256_storeu_ps(out, acc[r]);
#pragma GCC unroll 8
        for (int t = 0; t < NT; t++) g->y[(size_t)t * g->y_stride + r] = out[t];
    }
}

/* One function per (kind, rows, tokens): constant bounds keep the accumulators in registers. */
typedef void (*kq_fn)(const pgd__kq_tile *g);
#define KQ_F(K, R, T)                                                                            \
    static void kq_##K##_##R##_##T(const pgd__kq_tile *g) { kq_tile(g, K, R, T); }
#define KQ_NAME(K, R, T) kq_##K##_##R##_##T
#if KQ_MT == 3
#define KQ_ROW(K, R) KQ_F(K, R, 1) KQ_F(K, R, 2) KQ_F(K, R, 3)
#define KQ_ROWT(K, R) {KQ_NAME(K, R, 1), KQ_NAME(K, R, 2), KQ_NAME(K, R, 3)}
#elif KQ_MT == 4
#define KQ_ROW(K, R) KQ_F(K, R, 1) KQ_F(K, R, 2) KQ_F(K, R, 3) KQ_F(K, R, 4)
#define KQ_ROWT(K, R) {KQ_NAME(K, R, 1), KQ_NAME(K, R, 2), KQ_NAME(K, R, 3), KQ_NAME(K, R, 4)}
#elif KQ_MT == 6
#define KQ_ROW(K, R)                                                                             \
    KQ_F(K, R, 1) KQ_F(K, R, 2) KQ_F(K, R, 3) KQ_F(K, R, 4) KQ_F(K, R, 5) KQ_F(K, R, 6)
#define KQ_ROWT(K, R)                                                                            \
    {KQ_NAME(K, R, 1), KQ_NAME(K, R, 2), KQ_NAME(K, R, 3), KQ_NAME(K, R, 4), KQ_NAME(K, R, 5),   \
     KQ_NAME(K, R, 6)}
#elif KQ_MT == 8
#define KQ_ROW(K, R)                                                                             \
    KQ_F(K, R, 1) KQ_F(K, R, 2) KQ_F(K, R, 3) KQ_F(K, R, 4) KQ_F(K, R, 5) KQ_F(K, R, 6)          \
    KQ_F(K, R, 7) KQ_F(K, R, 8)
#define KQ_ROWT(K, R)                                                                            \
    {KQ_NAME(K, R, 1), KQ_NAME(K, R, 2), KQ_NAME(K, R, 3), KQ_NAME(K, R, 4), KQ_NAME(K, R, 5),   \
     KQ_NAME(K, R, 6), KQ_NAME(K, R, 7), KQ_NAME(K, R, 8)}
#else
#error "KQ_MT: 3, 4, 6 or 8"
#endif
#if KQ_MR == 2
#define KQ_KIND(K)                                                                               \
    KQ_ROW(K, 1) KQ_ROW(K, 2)                                                                    \
    static const kq_fn kq_tab_##K[KQ_MR][KQ_MT] = {KQ_ROWT(K, 1), KQ_ROWT(K, 2)};
#elif KQ_MR == 4
#define KQ_KIND(K)                                                                               \
    KQ_ROW(K, 1) KQ_ROW(K, 2) KQ_ROW(K, 3) KQ_ROW(K, 4)                                          \
    static const kq_fn kq_tab_##K[KQ_MR][KQ_MT] = {KQ_ROWT(K, 1), KQ_ROWT(K, 2),                 \
                                                   KQ_ROWT(K, 3), KQ_ROWT(K, 4)};
#else
#error "KQ_MR: 2 or 4"
#endif
KQ_KIND(KQ4)
KQ_KIND(KQ5)
KQ_KIND(KQ6)

void KQ_FN(pgd_type t, const pgd__kq_tile *g, int nr, int nt) {
    const kq_fn(*tab)[KQ_MT] = t == PGD_TYPE_Q4_K ? kq_tab_KQ4 : t == PGD_TYPE_Q5_K ? kq_tab_KQ5
                                                                                  : kq_tab_KQ6;
    tab[nr - 1][nt - 1](g);
}
