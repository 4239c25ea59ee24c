/* Tests for backend/cpu/quant: fp16/bf16 conversions, dequantization against an index-based
 * reference, and every weight type's dot product (AVX2 vs scalar vs float reference) with
 * explicit error bounds. */
#include "backend/cpu/quant.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef __F16C__
#include <immintrin.h>
#endif

#define TEST_RNG_SEED 0x9e3779b97f4a7c15ull
#include "test_kernels.h"
static float rnd_unit(void) { return (float)(rnd_u64() >> 40) / (float)(1 << 24); } /* [0,1) */
static float rnd_sym(float a) { return (2.0f * rnd_unit() - 1.0f) * a; }           /* (-a,a) */

static uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static float u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static void wr16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }
static uint16_t rd16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

typedef struct tinfo {
    pgd_type t;
    const char *name;
    int qk;    /* elements per block */
    int bytes; /* bytes per block */
} tinfo;

static const tinfo k_types[] = {
    {PGD_TYPE_F32, "F32", 1, 4},       {PGD_TYPE_F16, "F16", 1, 2},
    {PGD_TYPE_BF16, "BF16", 1, 2},     {PGD_TYPE_Q8_0, "Q8_0", 32, 34},
    {PGD_TYPE_Q4_0, "Q4_0", 32, 18},   {PGD_TYPE_Q4_1, "Q4_1", 32, 20},
    {PGD_TYPE_Q4_K, "Q4_K", 256, 144}, {PGD_TYPE_Q5_K, "Q5_K", 256, 176},
    {PGD_TYPE_Q6_K, "Q6_K", 256, 210}, {PGD_TYPE_Q5_0, "Q5_0", 32, 22},
    {PGD_TYPE_Q5_1, "Q5_1", 32, 24},   {PGD_TYPE_IQ4_NL, "IQ4_NL", 32, 18},
    {PGD_TYPE_Q2_K, "Q2_K", 256, 84},  {PGD_TYPE_Q3_K, "Q3_K", 256, 110},
    {PGD_TYPE_IQ4_XS, "IQ4_XS", 256, 136},
};
#define N_TYPES (int)(sizeof k_types / sizeof k_types[0])

/* ---- fp16 / bf16 ---------------------------------------------------------------------------- */

static int is_nan16(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff); }

static void check_f32_to_f16(float f, uint16_t want) {
    uint16_t got = pgd_fp32_to_fp16(f);
    CHECK(got == want, "fp32_to_fp16(%a) = 0x%04x, want 0x%04x", (double)f, got, want);
}

static void test_fp16(void) {
    /* Every half: exact widening (against F16C when present) and a round trip. */
    for (uint32_t h = 0; h < 65536; h++) {
        float f = pgd_fp16_to_fp32((uint16_t)h);
        uint16_t back = pgd_fp32_to_fp16(f);
        if (is_nan16((uint16_t)h)) {
            CHECK(isnan(f), "half 0x%04x should widen to NaN", h);
            /* NaN comes back quiet with its top payload bits. */
            CHECK(back == (h | 0x200), "NaN 0x%04x -> 0x%04x", h, back);
            continue;
        }
        CHECK(back == h, "round trip 0x%04x -> %a -> 0x%04x", h, (double)f, back);
#ifdef __F16C__
        CHECK(f2u(f) == f2u(_cvtsh_ss((unsigned short)h)), "widen 0x%04x", h);
#endif
    }
    /* Hand-checked edges: max, overflow ties, subnormal rounding, ties to even. */
    check_f32_to_f16(65504.0f, 0x7bff);
    check_f32_to_f16(65519.996f, 0x7bff);
    check_f32_to_f16(65520.0f, 0x7c00);           /* tie between 65504 and inf -> even (inf) */
    check_f32_to_f16(-1e10f, 0xfc00);
    check_f32_to_f16(INFINITY, 0x7c00);
    check_f32_to_f16(-0.0f, 0x8000);
    check_f32_to_f16(ldexpf(1, -24), 0x0001);     /* smallest subnormal */
    check_f32_to_f16(ldexpf(1, -25), 0x0000);     /* tie 0 / 2^-24 -> even (0) */
    check_f32_to_f16(u2f(f2u(ldexpf(1, -25)) + 1), 0x0001);
    check_f32_to_f16(ldexpf(3, -25), 0x0002);     /* 1.5 * 2^-24 tie -> 2 (even) */
    check_f32_to_f16(ldexpf(5, -25), 0x0002);     /* 2.5 * 2^-24 tie -> 2 (even) */
    check_f32_to_f16(ldexpf(1, -14), 0x0400);     /* smallest normal */
    check_f32_to_f16(ldexpf(2047, -25), 0x0400);  /* largest subnormal + half ulp: tie -> 0x400 */
    check_f32_to_f16(1.0f + ldexpf(1, -11), 0x3c00); /* tie -> even */
    check_f32_to_f16(1.0f + ldexpf(3, -11), 0x3c02); /* tie -> even (up) */
    CHECK(is_nan16(pgd_fp32_to_fp16(NAN)), "NaN stays NaN");
    CHECK(is_nan16(pgd_fp32_to_fp16(u2f(0x7f800001u))), "sNaN with low payload stays NaN");
    CHECK(isinf(pgd_fp16_to_fp32(0x7c00)) && pgd_fp16_to_fp32(0xfc00) < 0, "inf widens");
    CHECK(pgd_fp16_to_fp32(0x0001) == ldexpf(1, -24), "subnormal widens");

#ifdef __F16C__
    /* Narrowing against F16C (round to nearest even) on a stride through all 2^32 patterns
     * plus dense random samples around the subnormal/normal range. */
    for (uint64_t u = 0; u < (1ull << 32); u += 4093) {
        float f = u2f((uint32_t)u);
        uint16_t want = _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
        CHECK(pgd_fp32_to_fp16(f) == want, "0x%08x -> 0x%04x want 0x%04x", (uint32_t)u,
              pgd_fp32_to_fp16(f), want);
    }
    for (int i = 0; i < 300000; i++) {
        float f = ldexpf(rnd_sym(2.0f), (int)(rnd_u64() % 48) - 30);
        uint16_t want = _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
        CHECK(pgd_fp32_to_fp16(f) == want, "%a", (double)f);
    }
#endif

    /* bf16: exact widening, RNE narrowing, NaN kept NaN. */
    CHECK(pgd_bf16_to_fp32(0x3f80) == 1.0f, "bf16 1.0");
    CHECK(pgd_fp32_to_bf16(1.0f) == 0x3f80, "1.0 -> bf16");
    CHECK(pgd_fp32_to_bf16(u2f(0x3f808000u)) == 0x3f80, "tie -> even (down)");
    CHECK(pgd_fp32_to_bf16(u2f(0x3f818000u)) == 0x3f82, "tie -> even (up)");
    CHECK(pgd_fp32_to_bf16(u2f(0x3f808001u)) == 0x3f81, "above tie -> up");
    CHECK(pgd_fp32_to_bf16(u2f(0x7f7fffffu)) == 0x7f80, "FLT_MAX rounds to inf");
    CHECK(isnan(pgd_bf16_to_fp32(pgd_fp32_to_bf16(u2f(0x7f800001u)))), "sNaN stays NaN");
    for (uint32_t h = 0; h < 65536; h++) {
        float f = pgd_bf16_to_fp32((uint16_t)h);
        CHECK(f2u(f) == h << 16, "bf16 widen 0x%04x", h);
        if (!isnan(f)) CHECK(pgd_fp32_to_bf16(f) == h, "bf16 round trip 0x%04x", h);
    }
}

/* ---- random blocks ------------------------------------------------------------------------ */

/* Random weights of type t: random quant bytes, finite random scales of magnitude ~scale.
 * mode 0: random; 1: every quant bit set; 2: every quant bit clear (scales still random). */
static void fill_blocks(const tinfo *ti, uint8_t *buf, int64_t nb, float scale, int mode) {
    for (int64_t i = 0; i < nb * ti->bytes; i++)
        buf[i] = mode == 0 ? (uint8_t)rnd_u64() : mode == 1 ? 0xff : 0x00;
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *p = buf + b * ti->bytes;
        switch (ti->t) {
        case PGD_TYPE_F32: {
            float v = rnd_sym(1.0f);
            memcpy(p, &v, 4);
            break;
        }
        case PGD_TYPE_F16: wr16(p, pgd_fp32_to_fp16(rnd_sym(1.0f))); break;
        case PGD_TYPE_BF16: wr16(p, pgd_fp32_to_bf16(rnd_sym(1.0f))); break;
        case PGD_TYPE_Q8_0: case PGD_TYPE_Q4_0: case PGD_TYPE_Q5_0: case PGD_TYPE_IQ4_NL:
        case PGD_TYPE_IQ4_XS: wr16(p, pgd_fp32_to_fp16(rnd_sym(scale))); break;
        case PGD_TYPE_Q4_1:
        case PGD_TYPE_Q4_K:
        case PGD_TYPE_Q5_K:
        case PGD_TYPE_Q5_1:
            wr16(p, pgd_fp32_to_fp16(rnd_sym(scale)));
            wr16(p + 2, pgd_fp32_to_fp16(rnd_sym(scale)));
            break;
        case PGD_TYPE_Q6_K: wr16(p + 208, pgd_fp32_to_fp16(rnd_sym(scale))); break;
        case PGD_TYPE_Q3_K: wr16(p + 108, pgd_fp32_to_fp16(rnd_sym(scale))); break;
        case PGD_TYPE_Q2_K:
            wr16(p + 80, pgd_fp32_to_fp16(rnd_sym(scale)));
            wr16(p + 82, pgd_fp32_to_fp16(rnd_sym(scale)));
            break;
        default: break;
        }
        if (mode != 0 && ti->t == PGD_TYPE_Q6_K) /* keep the int8 scales random */
            for (int j = 0; j < 16; j++) p[192 + j] = (uint8_t)rnd_u64();
        if (mode != 0 && (ti->t == PGD_TYPE_Q4_K || ti->t == PGD_TYPE_Q5_K))
            for (int j = 0; j < 12; j++) p[4 + j] = (uint8_t)rnd_u64();
    }
}

/* The same weights with every quant set to 0 ("z" below): what is left is the offset term
 * (Q4_0: -8d, Q4_1: +m, K-quants: -dmin*min, Q6_K: -32*d*sc); F32/F16/BF16/Q8_0 give 0. */
static void zero_quants(const tinfo *ti, uint8_t *buf, int64_t nb) {
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *p = buf + b * ti->bytes;
        switch (ti->t) {
        case PGD_TYPE_F32: case PGD_TYPE_F16: case PGD_TYPE_BF16: memset(p, 0, ti->bytes); break;
        case PGD_TYPE_Q8_0: memset(p + 2, 0, 32); break;
        case PGD_TYPE_Q4_0: memset(p + 2, 0, 16); break;
        case PGD_TYPE_Q4_1: memset(p + 4, 0, 16); break;
        case PGD_TYPE_Q4_K: memset(p + 16, 0, 128); break;
        case PGD_TYPE_Q5_K: memset(p + 16, 0, 160); break;
        case PGD_TYPE_Q6_K: memset(p, 0, 192); break;
        case PGD_TYPE_Q5_0: memset(p + 2, 0, 20); break;
        case PGD_TYPE_Q5_1: memset(p + 4, 0, 20); break;
        case PGD_TYPE_Q2_K: memset(p + 16, 0, 64); break;
        case PGD_TYPE_Q3_K: memset(p, 0, 96); break; /* high bits clear: -4 * d * sc */
        case PGD_TYPE_IQ4_NL: case PGD_TYPE_IQ4_XS: memset(p, 0, ti->bytes); break; /* no offset */
        default: break;
        }
    }
}

/* ---- dequantization against an index-based reference -------------------------------------- */

static void k4_scale(const uint8_t *s, int j, int *sc, int *mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

static const int8_t k_iq4nl_grid[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                        1,    13,   25,  38,  53,  69,  89,  113};

/* Q3_K's 16 scales as ggml unpacks them: 12 bytes as three words, kmask shuffles. */
static int q3k_scale_ref(const uint8_t *s, int i) {
    uint32_t aux[4], tmp;
    memcpy(aux, s, 12);
    tmp = aux[2];
    aux[2] = ((aux[0] >> 4) & 0x0f0f0f0fu) | (((tmp >> 4) & 0x03030303u) << 4);
    aux[3] = ((aux[1] >> 4) & 0x0f0f0f0fu) | (((tmp >> 6) & 0x03030303u) << 4);
    aux[0] = (aux[0] & 0x0f0f0f0fu) | (((tmp >> 0) & 0x03030303u) << 4);
    aux[1] = (aux[1] & 0x0f0f0f0fu) | (((tmp >> 2) & 0x03030303u) << 4);
    int8_t sc[16];
    memcpy(sc, aux, 16);
    return sc[i] - 32;
}

/* Element i of one block, computed from the ggml layout by index, in ggml's operation order. */
static float ref_elem(pgd_type t, const uint8_t *p, int i) {
    switch (t) {
    case PGD_TYPE_Q5_0: case PGD_TYPE_Q5_1: {
        const int o = t == PGD_TYPE_Q5_1 ? 2 : 0;
        uint32_t qh = (uint32_t)p[2 + o] | (uint32_t)p[3 + o] << 8 | (uint32_t)p[4 + o] << 16 |
                      (uint32_t)p[5 + o] << 24;
        int q = (i < 16 ? p[6 + o + i] & 15 : p[6 + o + i - 16] >> 4) | (int)((qh >> i) & 1) << 4;
        if (o) return (float)q * pgd_fp16_to_fp32(rd16(p)) + pgd_fp16_to_fp32(rd16(p + 2));
        return (float)(q - 16) * pgd_fp16_to_fp32(rd16(p));
    }
    case PGD_TYPE_IQ4_NL: {
        int q = i < 16 ? p[2 + i] & 15 : p[2 + i - 16] >> 4;
        return pgd_fp16_to_fp32(rd16(p)) * (float)k_iq4nl_grid[q];
    }
    case PGD_TYPE_IQ4_XS: {
        int ib = i / 32, l = i % 32;
        int ls = ((p[4 + ib / 2] >> (4 * (ib % 2))) & 15) | ((rd16(p + 2) >> (2 * ib)) & 3) << 4;
        const uint8_t *qs = p + 8 + 16 * ib;
        int q = l < 16 ? qs[l] & 15 : qs[l - 16] >> 4;
        return pgd_fp16_to_fp32(rd16(p)) * (float)(ls - 32) * (float)k_iq4nl_grid[q];
    }
    case PGD_TYPE_Q2_K: case PGD_TYPE_Q3_K: {
        /* 128-element halves; in each, 2-bit shift s covers 32 elements, 16 per scale */
        int half = i / 128, s = (i % 128) / 32, hs = (i % 32) / 16, l = i % 16;
        const bool q3 = t == PGD_TYPE_Q3_K;
        int q = (p[(q3 ? 32 : 16) + 32 * half + 16 * hs + l] >> (2 * s)) & 3;
        int is = 8 * half + 2 * s + hs;
        if (q3) {
            if (!((p[16 * hs + l] >> (4 * half + s)) & 1)) q -= 4;
            return pgd_fp16_to_fp32(rd16(p + 108)) * (float)q3k_scale_ref(p + 96, is) * (float)q;
        }
        float dl = pgd_fp16_to_fp32(rd16(p + 80)) * (float)(p[is] & 15);
        float ml = pgd_fp16_to_fp32(rd16(p + 82)) * (float)(p[is] >> 4);
        return dl * (float)q - ml;
    }
    case PGD_TYPE_F32:
        return u2f((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                   (uint32_t)p[3] << 24);
    case PGD_TYPE_F16: return pgd_fp16_to_fp32(rd16(p));
    case PGD_TYPE_BF16: return pgd_bf16_to_fp32(rd16(p));
    case PGD_TYPE_Q8_0: return (float)(int8_t)p[2 + i] * pgd_fp16_to_fp32(rd16(p));
    case PGD_TYPE_Q4_0: {
        int q = i < 16 ? p[2 + i] & 15 : p[2 + i - 16] >> 4;
        return (float)(q - 8) * pgd_fp16_to_fp32(rd16(p));
    }
    case PGD_TYPE_Q4_1: {
        int q = i < 16 ? p[4 + i] & 15 : p[4 + i - 16] >> 4;
        return (float)q * pgd_fp16_to_fp32(rd16(p)) + pgd_fp16_to_fp32(rd16(p + 2));
    }
    case PGD_TYPE_Q4_K:
    case PGD_TYPE_Q5_K: {
        int sub = i / 32, l = i % 32, sc, mn;
        k4_scale(p + 4, sub, &sc, &mn);
        const uint8_t *qs = p + (t == PGD_TYPE_Q4_K ? 16 : 48);
        int q = (qs[32 * (sub / 2) + l] >> (4 * (sub & 1))) & 15;
        if (t == PGD_TYPE_Q5_K) q |= ((p[16 + l] >> sub) & 1) << 4;
        float d1 = pgd_fp16_to_fp32(rd16(p)) * (float)sc;
        float m1 = pgd_fp16_to_fp32(rd16(p + 2)) * (float)mn;
        return d1 * (float)q - m1;
    }
    case PGD_TYPE_Q6_K: {
        int c = i / 128, k = (i % 128) / 32, l = i % 32;
        int lo = (p[64 * c + l + 32 * (k & 1)] >> (4 * (k >> 1))) & 15;
        int hi = (p[128 + 32 * c + l] >> (2 * k)) & 3;
        int8_t sc = (int8_t)p[192 + 8 * c + 2 * k + l / 16];
        return pgd_fp16_to_fp32(rd16(p + 208)) * (float)sc * (float)((lo | hi << 4) - 32);
    }
    default: return NAN;
    }
}

static void test_dequant(void) {
    for (int ti = 0; ti < N_TYPES; ti++) {
        const tinfo *T = &k_types[ti];
        for (int mode = 0; mode < 3; mode++) {
            int64_t nb = T->qk == 1 ? 37 : 5;
            int64_t n = nb * T->qk;
            uint8_t *w = malloc((size_t)(nb * T->bytes) + 1);
            float *y = malloc((size_t)n * sizeof(float));
            /* Offset by one byte: weight rows may be unaligned. */
            fill_blocks(T, w + 1, nb, 0.05f, mode);
            pgd_dequantize_row(T->t, w + 1, y, n);
            for (int64_t i = 0; i < n; i++) {
                float want = ref_elem(T->t, w + 1 + (i / T->qk) * T->bytes, (int)(i % T->qk));
                CHECK(f2u(y[i]) == f2u(want), "%s mode %d elem %lld: %a want %a", T->name, mode,
                      (long long)i, (double)y[i], (double)want);
            }
            free(w);
            free(y);
        }
    }
    /* F16 round trip from floats that are exactly representable. */
    uint16_t h[64];
    float x[64], y[64];
    for (int i = 0; i < 64; i++) {
        x[i] = pgd_fp16_to_fp32(pgd_fp32_to_fp16(rnd_sym(100.0f)));
        h[i] = pgd_fp32_to_fp16(x[i]);
    }
    pgd_dequantize_row(PGD_TYPE_F16, h, y, 64);
    CHECK(memcmp(x, y, sizeof x) == 0, "F16 row round trip");
}

/* ---- activation quantization -------------------------------------------------------------- */

/* Elements per activation scale for weight type t (0: float activations, no quantization). */
static int act_block(pgd_type t) {
    pgd_type a = pgd_vec_dot_type(t);
    return a == PGD_TYPE_Q8_0 ? 32 : a == PGD_TYPE_Q8_K ? 256 : 0;
}

static void test_quantize_act(void) {
    const pgd_type wts[] = {PGD_TYPE_Q4_0, PGD_TYPE_Q4_K, PGD_TYPE_F16};
    for (int k = 0; k < 3; k++) {
        int64_t n = 1024;
        float x[1024], back[1024];
        for (int i = 0; i < n; i++) x[i] = rnd_sym(3.0f) * (i % 97 == 0 ? 50.0f : 1.0f);
        for (int i = 512; i < 768; i++) x[i] = 0.0f; /* an all-zero block: d = 0, no NaN */
        void *a = malloc(pgd_vec_dot_act_bytes(wts[k], n));
        pgd_quantize_act(wts[k], x, a, n);
        pgd_dequantize_act(wts[k], a, back, n);
        int qk = act_block(wts[k]);
        if (qk == 0) qk = 1;
        for (int64_t b = 0; b < n / qk; b++) {
            float amax = 0;
            for (int i = 0; i < qk; i++) amax = fmaxf(amax, fabsf(x[b * qk + i]));
            /* |x - d q| <= d / 2 with d = amax / 127, plus the float rounding of d and d * q. */
            float bound = qk == 1 ? 0.0f : amax / 127.0f * 0.5f * (1.0f + 4 * FLT_EPSILON);
            for (int i = 0; i < qk; i++)
                CHECK(fabsf(x[b * qk + i] - back[b * qk + i]) <= bound, "act quant error at %lld",
                      (long long)(b * qk + i));
        }
        free(a);
    }
    /* Non-finite activations must not crash or produce out-of-range codes. */
    float bad[32] = {NAN, INFINITY, -INFINITY, 1.0f};
    void *a = malloc(pgd_vec_dot_act_bytes(PGD_TYPE_Q8_0, 32));
    pgd_quantize_act(PGD_TYPE_Q8_0, bad, a, 32);
    free(a);
}

/* ---- dot products ----------------------------------------------------------------------------
 * Notation: w = dequantized weights, a = dequantized activations (d_act * q_act), x = the F32
 * activations, z = weights with quants zeroed (offset term), nb = float terms in the reduction
 * (blocks, or elements for float weights), M = sum_i (|w_i - z_i| + |z_i|) * |a_i|.
 * Every float term a kernel adds (d_w * d_act * integer, or the offset term) has magnitude at
 * most M restricted to its block, and each is produced with <= 4 roundings (fp16 scale product,
 * int -> float, multiply, subtract) before being summed with nb - 1 more additions in some
 * order. Standard summation analysis (first order, unit roundoff u = eps / 2) gives
 *   |kernel - sum_i w_i a_i| <= (nb + 4) * u * M  <=  (nb + 8) * eps * M / 2,
 * whatever the (fixed) order; we assert (nb + 8) * eps * M for each kernel against the exact
 * (double) reference, and 2 * (nb + 8) * eps * M between AVX2 and scalar. The activation
 * quantization error against x is bounded by |x_i - a_i| <= d_act(block) / 2:
 *   |kernel - sum_i w_i x_i| <= sum_i |w_i| * d_act(i) / 2 * (1 + 4 eps) + (nb + 8) * eps * M. */

static double g_worst_avx_vs_scalar = 0; /* max |avx - scalar| / (eps * M), for the log */
static double g_worst_f32act = 0;         /* the same for quantized weights x F32 activations */

static void check_dot(const tinfo *T, int64_t n, int mode, float wscale, float xscale) {
    int64_t nb = n / T->qk;
    size_t wbytes = (size_t)(nb * T->bytes);
    uint8_t *w = malloc(wbytes + 3), *wz = malloc(wbytes);
    float *x = malloc((size_t)n * 4), *wf = malloc((size_t)n * 4), *zf = malloc((size_t)n * 4);
    float *af = malloc((size_t)n * 4);
    size_t abytes = pgd_vec_dot_act_bytes(T->t, n);
    void *act = malloc(abytes);

    fill_blocks(T, w, nb, wscale, mode);
    memcpy(wz, w, wbytes);
    zero_quants(T, wz, nb);
    for (int64_t i = 0; i < n; i++) {
        x[i] = rnd_sym(xscale);
        if (rnd_u64() % 61 == 0) x[i] *= 30.0f; /* outliers, as real activations have */
        if (mode == 1) x[i] = (i & 1) ? xscale : -xscale; /* quantize to +-127: worst case sums */
    }
    pgd_quantize_act(T->t, x, act, n);
    pgd_dequantize_row(T->t, w, wf, n);
    pgd_dequantize_row(T->t, wz, zf, n);
    pgd_dequantize_act(T->t, act, af, n);

    double ref = 0, refx = 0, M = 0, qerr = 0;
    const int qka = act_block(T->t);
    for (int64_t i = 0; i < n; i++) {
        ref += (double)wf[i] * af[i];
        refx += (double)wf[i] * x[i];
        M += (fabs((double)wf[i] - zf[i]) + fabs((double)zf[i])) * fabs((double)af[i]);
    }
    if (qka)
        for (int64_t b = 0; b < n / qka; b++) {
            float amax = 0;
            for (int i = 0; i < qka; i++) amax = fmaxf(amax, fabsf(x[b * qka + i]));
            double dact = amax / 127.0 * 0.5 * (1 + 4 * FLT_EPSILON);
            for (int i = 0; i < qka; i++) qerr += fabs((double)wf[b * qka + i]) * dact;
        }

    float sc = pgd_vec_dot_scalar(T->t, w, act, n);
    float av = pgd_vec_dot(T->t, w, act, n);
    /* Float terms summed: one per block with 8-bit activations; one per element with F32
     * activations (each a product of the exactly dequantized weight, so the same analysis). */
    int64_t nterms = qka ? nb : n;
    double tol = (double)(nterms + 8) * FLT_EPSILON * M + 1e-35;
    CHECK(fabs(sc - ref) <= tol, "%s n=%lld mode %d: scalar %.9g ref %.9g tol %.3g", T->name,
          (long long)n, mode, (double)sc, ref, tol);
    CHECK(fabs(av - ref) <= tol, "%s n=%lld mode %d: avx %.9g ref %.9g tol %.3g", T->name,
          (long long)n, mode, (double)av, ref, tol);
    CHECK(fabs((double)av - sc) <= 2 * tol, "%s n=%lld: avx %.9g scalar %.9g", T->name,
          (long long)n, (double)av, (double)sc);
    CHECK(fabs(sc - refx) <= qerr + tol, "%s n=%lld: scalar %.9g vs float x %.9g, bound %.3g",
          T->name, (long long)n, (double)sc, refx, qerr + tol);
    if (!qka && T->qk > 1) {
        /* F32 activations: the AVX2 kernel's 8 lanes each sum n / 8 products, then a 3-level
         * tree, so it meets a bound 8x tighter than the sequential scalar reference. */
        double tol8 = (double)(n / 8 + 8) * FLT_EPSILON * M + 1e-35;
        CHECK(fabs(av - ref) <= tol8, "%s n=%lld mode %d: f32-act avx %.9g ref %.9g tol %.3g",
              T->name, (long long)n, mode, (double)av, ref, tol8);
    }
    if (M > 0) {
        double r = fabs((double)av - sc) / (FLT_EPSILON * M);
        double *worst = qka || T->qk == 1 ? &g_worst_avx_vs_scalar : &g_worst_f32act;
        if (r > *worst) *worst = r;
    }

    /* Same row, same activations -> same bits: repeated calls, and a misaligned copy. */
    memmove(w + 3, w, wbytes);
    float av2 = pgd_vec_dot(T->t, w + 3, act, n);
    float sc2 = pgd_vec_dot_scalar(T->t, w + 3, act, n);
    CHECK(f2u(av2) == f2u(av) && f2u(sc2) == f2u(sc), "%s: result depends on alignment", T->name);

    free(w), free(wz), free(x), free(wf), free(zf), free(af), free(act);
}

static void test_dot(void) {
    const int64_t mult[] = {1, 2, 3, 5, 8, 17, 64};
    for (int ti = 0; ti < N_TYPES; ti++) {
        const tinfo *T = &k_types[ti];
        for (int m = 0; m < (int)(sizeof mult / sizeof mult[0]); m++) {
            /* Float weights: ragged lengths around the 8- and 32-wide AVX2 loops too. */
            int64_t n = T->qk == 1 ? mult[m] * 33 + (m & 1) * 7 : mult[m] * T->qk;
            for (int trial = 0; trial < 3; trial++) check_dot(T, n, 0, 0.02f, 2.0f);
            check_dot(T, n, 1, 0.02f, 1.0f);
            check_dot(T, n, 2, 0.02f, 1.0f);
        }
        check_dot(T, 4096 / T->qk * T->qk, 0, 1e-4f, 1e3f); /* other magnitudes */
        check_dot(T, (T->qk == 1 ? 4097 : 4096), 0, 3.0f, 1e-3f);
    }
}

int main(void) {
    test_fp16();
    test_dequant();
    /* Both activation modes: int8 (llama.cpp's Q8_0 / Q8_K) and the default F32. */
    pgd_cpu_set_int8_act(true);
    CHECK(pgd_vec_dot_type(PGD_TYPE_Q4_1) == PGD_TYPE_Q8_0, "int8 mode: Q4_1 -> Q8_0");
    CHECK(pgd_vec_dot_type(PGD_TYPE_Q6_K) == PGD_TYPE_Q8_K, "int8 mode: Q6_K -> Q8_K");
    /* no integer kernels for these: they keep F32 activations in int8 mode too */
    CHECK(pgd_vec_dot_type(PGD_TYPE_Q5_0) == PGD_TYPE_F32, "int8 mode: Q5_0 -> F32");
    CHECK(pgd_vec_dot_type(PGD_TYPE_Q3_K) == PGD_TYPE_F32, "int8 mode: Q3_K -> F32");
    test_quantize_act();
    test_dot();
    pgd_cpu_set_int8_act(false);
    for (int ti = 0; ti < N_TYPES; ti++)
        CHECK(pgd_vec_dot_type(k_types[ti].t) == PGD_TYPE_F32, "F32 mode: %s", k_types[ti].name);
    test_quantize_act();
    test_dot();
    printf("test_quant: %d checks, %d failed; worst |avx - scalar| = %.2f eps*M (int8 act), "
           "%.2f eps*M (quant x F32 act)\n",
           g_checks, g_fail, g_worst_avx_vs_scalar, g_worst_f32act);
    return g_fail ? 1 : 0;
}
