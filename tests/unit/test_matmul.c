/* Tests for backend/cpu/matmul: batch invariance (a token's output row is bit-identical whatever
 * the batch size and its neighbours), agreement of every weight type's matmul with the scalar
 * reference dot product within test_quant.c's bound, and thread counts that split rows unevenly. */
#include "backend/cpu/matmul.h"

#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/pool.h"
#include "backend/cpu/quant.h"

#define TEST_RNG_SEED 0x2545f4914f6cdd1dull
#include "test_kernels.h"
static float rnd_sym(float a) {
    return (2.0f * (float)(rnd_u64() >> 40) / (float)(1 << 24) - 1.0f) * a;
}
static void wr16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }

typedef struct tinfo {
    pgd_type t;
    const char *name;
    int qk, bytes;
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

/* Random blocks with finite scales (as test_quant.c's fill_blocks, mode 0). */
static void fill_blocks(const tinfo *ti, uint8_t *p, int64_t nb, float scale) {
    for (int64_t i = 0; i < nb * ti->bytes; i++) p[i] = (uint8_t)rnd_u64();
    for (int64_t b = 0; b < nb; b++, p += ti->bytes) {
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
        case PGD_TYPE_Q4_1: case PGD_TYPE_Q4_K: case PGD_TYPE_Q5_K: case PGD_TYPE_Q5_1:
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
    }
}

/* Weights with every quant zeroed: the offset term (see test_quant.c's zero_quants). */
static void zero_quants(const tinfo *ti, uint8_t *p, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, p += ti->bytes) {
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

enum { N_TOK = 64 };

static bool is_kquant(pgd_type t) {
    return t == PGD_TYPE_Q4_K || t == PGD_TYPE_Q5_K || t == PGD_TYPE_Q6_K;
}

static void run(pgd_pool *pool, const pgd_weight *w, const float *x, float *y, int n) {
    size_t arb = pgd_cpu_matmul_act_row_bytes(w);
    void *act = aligned_alloc(64, arb * (size_t)n);
    /* With a panel: n >= 4 dequantizes panels, n < 4 uses the fused tiles, so the batch-size
     * comparisons below also prove the two paths bit-identical. */
    void *panel = malloc(pgd_cpu_matmul_panel_bytes(arb, pgd_pool_n_threads(pool)));
    pgd_cpu_matmul(pool, w, x, y, n, act, arb, panel);
    free(panel);
    free(act);
}

static void check_type(pgd_pool *pool, const tinfo *T, int64_t n_in, int64_t n_out) {
    int64_t nb = n_in / T->qk;
    size_t row_bytes = (size_t)(nb * T->bytes);
    /* One spare byte in front: weight rows need not be aligned. */
    uint8_t *buf = malloc(row_bytes * (size_t)n_out + 1), *wdata = buf + 1;
    uint8_t *wz = malloc(row_bytes);
    fill_blocks(T, wdata, nb * n_out, 0.02f);
    pgd_weight w = {T->t, n_in, n_out, row_bytes, wdata, false};

    float *x = malloc(sizeof(float) * (size_t)(N_TOK * n_in));
    for (int64_t i = 0; i < N_TOK * n_in; i++) {
        x[i] = rnd_sym(2.0f);
        if (rnd_u64() % 61 == 0) x[i] *= 30.0f;
    }
    size_t ysz = sizeof(float) * (size_t)(N_TOK * n_out);
    float *y_all = malloc(ysz), *y = malloc(ysz);
    run(pool, &w, x, y_all, N_TOK);

    /* Batch invariance: alone, and in batches of 3 and 16 at several offsets. */
    int bad1 = 0;
    for (int t = 0; t < N_TOK; t++) {
        run(pool, &w, x + t * n_in, y, 1);
        bad1 += memcmp(y, y_all + t * n_out, sizeof(float) * (size_t)n_out) != 0;
    }
    CHECK(bad1 == 0, "%s %lldx%lld: %d of %d rows differ at n=1", T->name, (long long)n_out,
          (long long)n_in, bad1, N_TOK);
    const int sizes[] = {3, 16, 5, 63, 2, 4, 6, 7};
    const int offs[] = {0, 1, 7, 13, 30, 48};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
        for (size_t oi = 0; oi < sizeof offs / sizeof offs[0]; oi++) {
            int b = sizes[si], o = offs[oi];
            if (o + b > N_TOK) continue;
            run(pool, &w, x + o * n_in, y, b);
            CHECK(memcmp(y, y_all + o * n_out, sizeof(float) * (size_t)(b * n_out)) == 0,
                  "%s %lldx%lld: batch %d at offset %d differs from n=%d", T->name,
                  (long long)n_out, (long long)n_in, b, o, N_TOK);
        }

    /* Against the scalar reference: |y - scalar| <= 2 (nb + 8) eps M (test_quant.c's bound). */
    size_t abytes = pgd_vec_dot_act_bytes(T->t, n_in);
    void *act = malloc(abytes);
    float *wf = malloc(sizeof(float) * (size_t)n_in), *zf = malloc(sizeof(float) * (size_t)n_in);
    float *af = malloc(sizeof(float) * (size_t)n_in);
    int nbad = 0, nsame = 0, nvd = 0;
    const bool f32act = pgd_vec_dot_type(T->t) == PGD_TYPE_F32;
    /* Float terms summed per product: blocks with 8-bit activations, elements with F32. */
    const int64_t nterms = f32act ? n_in : nb;
    for (int t = 0; t < N_TOK; t += 5) {
        pgd_quantize_act(T->t, x + t * n_in, act, n_in);
        pgd_dequantize_act(T->t, act, af, n_in);
        for (int64_t r = 0; r < n_out; r++) {
            const uint8_t *row = wdata + (size_t)r * row_bytes;
            memcpy(wz, row, row_bytes);
            zero_quants(T, wz, nb);
            pgd_dequantize_row(T->t, row, wf, n_in);
            pgd_dequantize_row(T->t, wz, zf, n_in);
            double M = 0;
            for (int64_t i = 0; i < n_in; i++)
                M += (fabs((double)wf[i] - zf[i]) + fabs((double)zf[i])) * fabs((double)af[i]);
            double tol = 2.0 * (double)(nterms + 8) * FLT_EPSILON * M + 1e-35;
            float ref = pgd_vec_dot_scalar(T->t, row, act, n_in);
            float got = y_all[t * n_out + r];
            /* F32 activations: pgd_vec_dot is the 1x1 tile of the same kernel, bit for bit;
             * K-quants with 8-bit activations: the K-quant tiles (AVX2 and AVX-512 VNNI) take
             * pgd_vec_dot's exact integers and float steps, bit for bit. */
            if ((f32act && T->qk > 1) || (!f32act && is_kquant(T->t))) {
                float one = pgd_vec_dot(T->t, row, act, n_in);
                nsame += memcmp(&one, &got, sizeof got) == 0;
                nvd++;
            }
            if (!(fabs((double)got - ref) <= tol)) {
                if (nbad++ < 3)
                    fprintf(stderr, "%s row %lld tok %d: %.9g scalar %.9g tol %.3g\n", T->name,
                            (long long)r, t, (double)got, (double)ref, tol);
            }
        }
    }
    CHECK(nbad == 0, "%s %lldx%lld: %d products outside the bound", T->name, (long long)n_out,
          (long long)n_in, nbad);
    CHECK(nsame == nvd, "%s %lldx%lld: %d of %d matmul results differ from pgd_vec_dot", T->name,
          (long long)n_out, (long long)n_in, nvd - nsame, nvd);
    free(buf), free(wz), free(x), free(y_all), free(y), free(act), free(wf), free(zf), free(af);
}

/* Weights in the panel16 layout (F16, Q8_0; when this build packs them): every token's row is
 * bit-identical at n = 1 and in batches of every size and offset, and agrees with the
 * row-major path (a different summation order) within 1e-5 x sqrt(n_in) x the weights' scale. */
static void check_panel16(pgd_pool *pool, const tinfo *T, int64_t n_in, int64_t n_out,
                          int ntok) {
    int64_t nb = n_in / T->qk;
    size_t rb = (size_t)(nb * T->bytes);
    uint8_t *wr = malloc(rb * (size_t)n_out), *wp = malloc(rb * (size_t)n_out);
    float *x = malloc(sizeof(float) * (size_t)(ntok * n_in));
    float *y1 = malloc(sizeof(float) * (size_t)(ntok * n_out));
    float *yb = malloc(sizeof(float) * (size_t)(ntok * n_out));
    float *yr = malloc(sizeof(float) * (size_t)n_out);
    const float scale = T->qk == 1 ? 1.0f : 0.02f; /* Q8_0: |d * q| <= 0.02 * 127 */
    fill_blocks(T, wr, nb * n_out, scale);
    for (int64_t i = 0; i < ntok * n_in; i++) x[i] = rnd_sym(1.0f);
    pgd_weight w = {T->t, n_in, n_out, rb, wr, false};
    if (!pgd_cpu_can_pack(&w)) goto out; /* a build without the layout (portable, int8 mode) */
    pgd_cpu_pack(&w, wp);
    pgd_weight wpk = w;
    wpk.data = wp;
    wpk.panel16 = true;
    int badb = 0, badr = 0;
    for (int t = 0; t < ntok; t++) run(pool, &wpk, x + t * n_in, y1 + t * n_out, 1);
    /* few-token kernels up to 24 tokens (5-bit, Q3_K: 8; F16: 3), the GEMM past; 150 and 289
     * tokens: 2 and 3 token blocks (of at most 144), which with K past ~2,800 also split K into
     * groups (only ntok tokens are tried) */
    const int sizes[] = {2, 3, 4, 5, 6, 7, 8, 9, 13, 24, 25, 63, 150, 289};
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++)
        for (int o = 0; o + sizes[si] <= ntok; o += 17) {
            run(pool, &wpk, x + o * n_in, yb, sizes[si]);
            badb += memcmp(yb, y1 + o * n_out, sizeof(float) * (size_t)(sizes[si] * n_out)) != 0;
        }
    /* |w| bound: F16 1; Q8_0 |d q| <= 0.02 * 128 (and Q4_0..Q5_1 below it); Q4_K/Q5_K
     * |d sc q - dmin mn| <= 0.02 * 63 * 32;
     * Q6_K |d sc (q - 32)| <= 0.02 * 128 * 32; Q3_K |d (sc - 32) (u - 4)| <= 0.02 * 32 * 4 */
    const double wmax = T->qk == 1              ? 1.0
                        : T->qk == 32             ? 0.02 * 128
                        : T->t == PGD_TYPE_Q6_K   ? 0.02 * 128 * 32
                        : T->t == PGD_TYPE_Q3_K   ? 0.02 * 32 * 4
                                                  : 0.02 * 63 * 32;
    for (int t = 0; t < ntok; t += 9) {
        run(pool, &w, x + t * n_in, yr, 1);
        for (int64_t r = 0; r < n_out; r++)
            badr += fabs((double)yr[r] - y1[t * n_out + r]) > 1e-5 * sqrt((double)n_in) * wmax;
    }
    CHECK(badb == 0, "%s panel16 %lldx%lld: %d batches differ from n = 1", T->name,
          (long long)n_out, (long long)n_in, badb);
    CHECK(badr == 0, "%s panel16 %lldx%lld: %d outputs off the row-major path", T->name,
          (long long)n_out, (long long)n_in, badr);
out:
    free(wr), free(wp), free(x), free(y1), free(yb), free(yr);
}

static int run_all(void) {
    pgd_err err;
    for (int nth = 1; nth <= 3; nth++) {
        pgd_pool *pool;
        if (pgd_pool_create(nth, &pool, &err) != 0) {
            fprintf(stderr, "pool: %s\n", err.msg);
            return 1;
        }
        for (int ti = 0; ti < N_TYPES; ti++) {
            const tinfo *T = &k_types[ti];
            /* Ragged shapes: rows not a multiple of the tile, blocks not a multiple of 8 (Q4_1's
             * offset term), float lengths not a multiple of 8; and one long row (> 64 blocks). */
            int64_t n_in = T->qk == 1 ? 771 : T->qk == 32 ? 32 * 19 : 256 * 3;
            check_type(pool, T, n_in, 37);
            if (nth == 2) check_type(pool, T, T->qk == 1 ? 2056 : 4096 + (T->qk == 32) * 96, 9);
        }
        for (int ti = 0; ti < N_TYPES; ti++) {
            const pgd_type pt = k_types[ti].t;
            if (pt == PGD_TYPE_F32 || pt == PGD_TYPE_BF16 || pt == PGD_TYPE_Q2_K ||
                pt == PGD_TYPE_IQ4_NL || pt == PGD_TYPE_IQ4_XS)
                continue; /* no panel layout */
            check_panel16(pool, &k_types[ti], 96, 128, N_TOK); /* one K slice; rows uneven */
            check_panel16(pool, &k_types[ti], 64, 80, N_TOK); /* decode: 4-panel group + 1 */
            check_panel16(pool, &k_types[ti], 608, 208, N_TOK); /* K slices 224, 224, 160 */
            /* Q4_K (K a multiple of 256): 3 and 6 K slices, one 4-panel group + 1 */
            check_panel16(pool, &k_types[ti], 768, 208, N_TOK);
            check_panel16(pool, &k_types[ti], 1280 + 256, 48, N_TOK);
            check_panel16(pool, &k_types[ti], 256, 80, N_TOK);
            /* 17 K slices in 2 groups at 150 and 289 tokens (2 and 3 token blocks): the GEMM's
             * y scratch carried over the group boundary, 2 panels per thread's chunk */
            if (nth == 2) check_panel16(pool, &k_types[ti], 17 * 256, 272, 300);
        }
        pgd_pool_free(pool);
    }
    return 0;
}

int main(void) {
    /* Both activation modes: 8-bit (llama.cpp's Q8_0 / Q8_K) and the default F32. 8-bit with
     * the AVX2 K-quant tiles, then with the AVX-512 VNNI ones where the CPU has them (both are
     * checked bit for bit against pgd_vec_dot). */
    pgd_cpu_set_int8_act(true);
    pgd_cpu_set_avx512(0);
    if (run_all()) return 1;
    if (pgd_cpu_set_avx512(1) && run_all()) return 1;
    /* F32 activations with the AVX2 panel GEMM, then with the AVX-512 one where the CPU has it:
     * check_panel16 compares its batches of 25 and 63 tokens (the GEMM) bit for bit with n = 1
     * (the AVX2 GEMV), so the two instruction sets must give the same bits. */
    pgd_cpu_set_int8_act(false);
    pgd_cpu_set_avx512(0);
    if (run_all()) return 1;
    const bool avx512 = pgd_cpu_set_avx512(1);
    if (avx512 && run_all()) return 1;
    printf("test_matmul: %d checks, %d failed (AVX-512 panel GEMM %s)\n", g_checks, g_fail,
           avx512 ? "tested" : "not on this CPU or build: not tested");
    return g_fail ? 1 : 0;
}
