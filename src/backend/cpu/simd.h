/* Vector helpers for the CPU backend's non-matmul ops (cpu_backend.c): AVX2 + FMA + F16C under
 * __AVX2__, each paired with a scalar twin that computes the same function, so row tails and the
 * non-AVX2 build agree with the vector lanes. The twins are bit-identical to their vector
 * versions where FMA is available (fmaf is then one instruction, as the vector FMA). */
#ifndef PGD_BACKEND_CPU_SIMD_H
#define PGD_BACKEND_CPU_SIMD_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __AVX2__
#include <immintrin.h>
#endif

/* Unaligned little-endian loads from packed weight and activation blocks (scales, F16/BF16
 * words, floats): memcpy compiles to one mov. */
static inline __attribute__((always_inline)) uint16_t pgd_ld_u16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}
static inline __attribute__((always_inline)) int16_t pgd_ld_i16(const uint8_t *p) {
    int16_t v;
    memcpy(&v, p, 2);
    return v;
}
static inline __attribute__((always_inline)) float pgd_ld_f32(const uint8_t *p) {
    float v;
    memcpy(&v, p, 4);
    return v;
}

#ifdef __AVX2__
/* Software prefetch for the matmul tiles. A tile streams NR contiguous weight rows
 * (tile_bytes); each of its `steps` loop iterations prefetches its share of the next tile's
 * bytes. The hardware prefetchers alone leave a tile's short row streams mostly demand-missed:
 * on this project's 2-core Zen 3, decode matmuls of SmolLM2 shape ran ~2x and of 1.1B shape
 * ~1.6x faster with it (bench/RESULTS.md); prefetching further ahead (4-16 KiB) was no better. */
typedef struct pgd_prefetch {
    uintptr_t p; /* an address, not a pointer: past a matrix's last tile it points at nothing */
    size_t step;
    int two;     /* step > 64: two hints per step */
} pgd_prefetch;
static inline __attribute__((always_inline)) pgd_prefetch pgd_prefetch_init(const void *tile,
                                                                           size_t tile_bytes,
                                                                           int64_t steps) {
    size_t step = steps > 0 ? tile_bytes / (size_t)steps : 0;
    pgd_prefetch f = {(uintptr_t)tile + tile_bytes, step, step > 64};
    return f;
}
/* One hint per step, two (step / 2 apart) for steps over 64 bytes: every cache line of a step
 * of up to 128 bytes. A hint never faults, so tiles past a matrix's end cost only the hint.
 * always_inline: GCC 12 otherwise may judge an out-of-line copy pure (a prefetch has no
 * visible effect) and delete every call to it. */
static inline __attribute__((always_inline)) void pgd_prefetch_step(const pgd_prefetch *f,
                                                                    int64_t i) {
    uintptr_t q = f->p + (size_t)i * f->step;
    _mm_prefetch((const char *)q, _MM_HINT_T0);
    if (f->two) _mm_prefetch((const char *)(q + f->step / 2), _MM_HINT_T0);
}
#endif

#ifdef __FMA__
#define PGD_FMAF(a, b, c) fmaf(a, b, c)
#else
#define PGD_FMAF(a, b, c) ((a) * (b) + (c)) /* fmaf would be a slow libm call */
#endif

/* exp(x), Cephes' expf scheme: n = round(x / ln2), r = x - n ln2 in two FMA steps (ln2 split
 * as C1 + C2), e^r by a degree-7 polynomial (degree 5 on r beyond 1 + r), times 2^n. Within
 * 2 ulp of exp on [PGD_EXP_LO, 88.72] (test_cpu_ops.c measures it); x > 88.72 and +inf give inf,
 * NaN stays NaN. Results that would fall below ~1.18e-38 (x < PGD_EXP_LO, so also -inf) are
 * flushed to 0: softmax and silu have no use for subnormals, and producing them can cost a
 * microcode assist per lane. */
#define PGD_EXP_LO (-87.33f) /* exp(-87.33) = 1.183e-38, just above FLT_MIN */
#define PGD_EXP_HI 88.8f     /* past log(FLT_MAX) = 88.7228: the scaling overflows to inf */
#define PGD_EXP_LOG2E 1.44269504088896341f
#define PGD_EXP_C1 0.693359375f   /* ln2 = C1 + C2; C1 has 9 significant bits */
#define PGD_EXP_C2 -2.12194440e-4f
#define PGD_EXP_P0 1.9875691500e-4f
#define PGD_EXP_P1 1.3981999507e-3f
#define PGD_EXP_P2 8.3334519073e-3f
#define PGD_EXP_P3 4.1665795894e-2f
#define PGD_EXP_P4 1.6666665459e-1f
#define PGD_EXP_P5 5.0000001201e-1f

static inline float pgd_expf_scalar(float x) {
    if (x != x) return x + x;
    if (x < PGD_EXP_LO) return 0.0f;
    if (x > PGD_EXP_HI) x = PGD_EXP_HI;
    float n = rintf(x * PGD_EXP_LOG2E);
    float r = PGD_FMAF(-n, PGD_EXP_C1, x);
    r = PGD_FMAF(-n, PGD_EXP_C2, r);
    float z = r * r, p = PGD_EXP_P0;
    p = PGD_FMAF(p, r, PGD_EXP_P1);
    p = PGD_FMAF(p, r, PGD_EXP_P2);
    p = PGD_FMAF(p, r, PGD_EXP_P3);
    p = PGD_FMAF(p, r, PGD_EXP_P4);
    p = PGD_FMAF(p, r, PGD_EXP_P5);
    p = PGD_FMAF(p, z, r);
    p = p + 1.0f;
    /* p * 2^n is a normal number or overflows, so the scaling is exact (or inf) either way. */
    return ldexpf(p, (int)n);
}

/* silu(x) = x / (1 + exp(-x)); large |x| gives x or -0, never NaN. */
static inline float pgd_silu_scalar(float x) { return x / (1.0f + pgd_expf_scalar(-x)); }

/* gelu_pytorch_tanh: 0.5 x (1 + tanh(z)), z = sqrt(2/pi) (x + 0.044715 x^3), computed as
 * x / (1 + exp(-2z)) (the same function: 1 + tanh(z) = 2 / (1 + exp(-2z))). */
#define PGD_GELU_K (-2.0f * 0.7978845608028654f)
#define PGD_GELU_C 0.044715f
static inline float pgd_gelu_scalar(float x) {
    float z = PGD_GELU_K * (x + PGD_GELU_C * x * x * x);
    return x / (1.0f + pgd_expf_scalar(z));
}

#ifdef __AVX2__

static inline __m256 pgd_exp8(__m256 x) {
    const __m256 lo = _mm256_set1_ps(PGD_EXP_LO);
    __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ); /* false for NaN */
    /* min/max return their second operand when either is NaN: NaN passes through. */
    x = _mm256_max_ps(lo, _mm256_min_ps(_mm256_set1_ps(PGD_EXP_HI), x));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(PGD_EXP_LOG2E)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(PGD_EXP_C1), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(PGD_EXP_C2), r);
    __m256 z = _mm256_mul_ps(r, r), p = _mm256_set1_ps(PGD_EXP_P0);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(PGD_EXP_P1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(PGD_EXP_P2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(PGD_EXP_P3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(PGD_EXP_P4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(PGD_EXP_P5));
    p = _mm256_fmadd_ps(p, z, r);
    p = _mm256_add_ps(p, _mm256_set1_ps(1.0f));
    /* 2^n as 2^n1 * 2^n2 with n1, n2 in [-63, 64]: n reaches 128 near the top of the range,
     * which has no float exponent; both products are exact until the last one overflows. */
    __m256i ni = _mm256_cvtps_epi32(n);
    __m256i n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
    const __m256i bias = _mm256_set1_epi32(127);
    __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
    __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
    p = _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
    return _mm256_andnot_ps(under, p);
}

static inline __m256 pgd_silu8(__m256 x) {
    __m256 e = pgd_exp8(_mm256_sub_ps(_mm256_setzero_ps(), x));
    return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

/* pgd_gelu_scalar's arithmetic, 8 lanes (the same operations in the same order). */
static inline __m256 pgd_gelu8(__m256 x) {
    __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
    __m256 in = _mm256_add_ps(x, _mm256_mul_ps(_mm256_set1_ps(PGD_GELU_C), x3));
    __m256 e = pgd_exp8(_mm256_mul_ps(_mm256_set1_ps(PGD_GELU_K), in));
    return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

/* 32 nibbles of a Q4 block as bytes: low nibbles (elements 0..15), then high (16..31). */
static inline __attribute__((always_inline)) __m256i pgd_nibbles32(const uint8_t *qs) {
    __m128i t = _mm_loadu_si128((const __m128i *)qs);
    __m256i b = _mm256_set_m128i(_mm_srli_epi16(t, 4), t);
    return _mm256_and_si256(b, _mm256_set1_epi8(0xF));
}

/* Sum of the 8 lanes in a fixed tree: ((0+4) + (2+6)) + ((1+5) + (3+7)). */
static inline float pgd_hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float pgd_hmax8(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Lane j of the result is the sum of the 8 lanes of a_j, each by the same tree, so a sum does
 * not depend on which of the 8 slots it was computed in. */
static inline __m256 pgd_hsum8x8(__m256 a0, __m256 a1, __m256 a2, __m256 a3, __m256 a4,
                                 __m256 a5, __m256 a6, __m256 a7) {
    __m256 t0 = _mm256_hadd_ps(a0, a1), t1 = _mm256_hadd_ps(a2, a3);
    __m256 t2 = _mm256_hadd_ps(a4, a5), t3 = _mm256_hadd_ps(a6, a7);
    __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    /* u0 = [a0..a3 low-half sums | a0..a3 high-half sums], u1 likewise for a4..a7 */
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20),
                         _mm256_permute2f128_ps(u0, u1, 0x31));
}

static inline __m256 pgd_load8_f16(const uint16_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}
static inline __m256 pgd_load8_bf16(const uint16_t *p) {
    __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
}
/* Round to nearest even, as pgd_fp32_to_fp16 (which matches F16C bit for bit). */
static inline void pgd_store8_f16(uint16_t *p, __m256 v) {
    _mm_storeu_si128((__m128i *)p, _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
}
/* 8 floats to bf16 as pgd_fp32_to_bf16: round to nearest even, NaN made quiet. */
static inline __m128i pgd_cvt8_bf16(__m256 v) {
    __m256i u = _mm256_castps_si256(v);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
    r = _mm256_srli_epi32(r, 16);
    __m256i q = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(64));
    __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                     _mm256_set1_epi32(0x7f800000));
    r = _mm256_blendv_epi8(r, q, nan);
    /* 8 x 32-bit values below 65536 -> 8 x 16 bits */
    __m256i pk = _mm256_packus_epi32(r, r); /* [r0-3 r0-3 | r4-7 r4-7] */
    pk = _mm256_permute4x64_epi64(pk, 0x08);  /* [r0-3 r4-7 ...] */
    return _mm256_castsi256_si128(pk);
}
static inline void pgd_store8_bf16(uint16_t *p, __m256 v) {
    _mm_storeu_si128((__m128i *)p, pgd_cvt8_bf16(v));
}

#endif /* __AVX2__ */

#endif
