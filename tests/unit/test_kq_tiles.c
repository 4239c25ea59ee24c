/* Tests for the K-quant x Q8_K register tiles (backend/cpu/kq_tiles.h, issue 37): every tile
 * shape of the AVX2 and (where the CPU has it) AVX-512 VNNI variant gives the bits of
 * pgd_vec_dot and of the scalar reference pgd_vec_dot_scalar for Q4_K, Q5_K and Q6_K; through
 * pgd_cpu_matmul in the 8-bit activation mode, ragged shapes (rows not a multiple of the tile,
 * 1..7, 16 and 64 tokens) and batch invariance at 1, 3, 16 and 64 tokens; extreme quants and
 * activations (all bits set, |q| = 127) that would overflow a saturating step; the Q8_K
 * activation quantization against its scalar reference, NaN and infinities included. In a portable
 * build only the pgd_cpu_matmul checks run (on the scalar dot products). */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/kq_tiles.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/pool.h"
#include "backend/cpu/quant.h"

#define TEST_RNG_SEED 0x6a09e667f3bcc909ull
#include "test_kernels.h"

static float rnd_sym(float a) {
    return (2.0f * (float)(rnd_u64() >> 40) / (float)(1 << 24) - 1.0f) * a;
}
static void wr16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }

typedef struct kinfo {
    pgd_type t;
    const char *name;
    int bytes, d_off, m_off; /* block bytes; fp16 d and dmin offsets (-1: none) */
} kinfo;
static const kinfo k_types[] = {
    {PGD_TYPE_Q4_K, "Q4_K", 144, 0, 2},
    {PGD_TYPE_Q5_K, "Q5_K", 176, 0, 2},
    {PGD_TYPE_Q6_K, "Q6_K", 210, 208, -1},
};

/* mode 0: random bytes; 1: every quant, scale and high bit set (the largest products). */
static void fill_blocks(const kinfo *K, uint8_t *p, int64_t nb, int mode) {
    for (int64_t b = 0; b < nb; b++, p += K->bytes) {
        for (int i = 0; i < K->bytes; i++) p[i] = mode ? 0xFF : (uint8_t)rnd_u64();
        wr16(p + K->d_off, pgd_fp32_to_fp16(mode ? 0.01f : rnd_sym(0.02f)));
        if (K->m_off >= 0) wr16(p + K->m_off, pgd_fp32_to_fp16(mode ? 0.01f : rnd_sym(0.02f)));
    }
}

/* x: mode 0 random with outliers; 1: +-1 (every activation quantizes to +-127). */
static void fill_x(float *x, int64_t n, int mode) {
    for (int64_t i = 0; i < n; i++) {
        if (mode) {
            x[i] = (rnd_u64() & 1) ? 1.0f : -1.0f;
        } else {
            x[i] = rnd_sym(2.0f);
            if (rnd_u64() % 61 == 0) x[i] *= 30.0f;
        }
    }
}

static bool same(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

#ifdef __AVX2__
/* Direct calls of every (rows, tokens) shape of one variant. */
static void check_tiles(const kinfo *K, int64_t n, int mode, bool vnni) {
    const int nrow = vnni ? PGD_KQ_MR_VNNI : PGD_KQ_MR_AVX2;
    const int ntok = vnni ? PGD_KQ_MT_VNNI : PGD_KQ_MT_AVX2;
    const int64_t nb = n / 256;
    const size_t rb = (size_t)(nb * K->bytes);
    const size_t ab = (pgd_vec_dot_act_bytes(K->t, n) + 63) / 64 * 64;
    uint8_t *w = malloc(rb * nrow + 1), *wd = w + 1; /* rows need not be aligned */
    uint8_t *act = aligned_alloc(64, ab * (size_t)ntok);
    float *x = malloc(sizeof(float) * (size_t)n), *y = malloc(sizeof(float) * 64);
    fill_blocks(K, wd, nb * nrow, mode);
    for (int t = 0; t < ntok; t++) {
        fill_x(x, n, mode);
        pgd_quantize_act(K->t, x, act + (size_t)t * ab, n);
    }
    int bad = 0, far = 0;
    for (int nr = 1; nr <= nrow; nr++)
        for (int nt = 1; nt <= ntok; nt++) {
            pgd__kq_tile g = {wd, rb, act, ab, y, (size_t)nrow, n, true};
            if (vnni) pgd__kq_tile_vnni(K->t, &g, nr, nt);
            else pgd__kq_tile_avx2(K->t, &g, nr, nt);
            for (int t = 0; t < nt; t++)
                for (int r = 0; r < nr; r++) {
                    const uint8_t *row = wd + (size_t)r * rb;
                    const void *a = act + (size_t)t * ab;
                    const float got = y[t * nrow + r];
                    bad += !same(got, pgd_vec_dot(K->t, row, a, n));
                    far += !same(got, pgd_vec_dot_scalar(K->t, row, a, n));
                }
        }
    CHECK(bad == 0, "%s %s n=%lld mode %d: %d tile outputs differ from pgd_vec_dot", K->name,
          vnni ? "VNNI" : "AVX2", (long long)n, mode, bad);
    CHECK(far == 0, "%s %s n=%lld mode %d: %d tile outputs differ from the scalar reference",
          K->name, vnni ? "VNNI" : "AVX2", (long long)n, mode, far);
    free(w), free(act), free(x), free(y);
}
#endif

static void run(pgd_pool *pool, const pgd_weight *w, const float *x, float *y, int n) {
    const size_t arb = pgd_cpu_matmul_act_row_bytes(w);
    void *act = aligned_alloc(64, arb * (size_t)n);
    void *panel = malloc(pgd_cpu_matmul_panel_bytes(arb, pgd_pool_n_threads(pool)));
    pgd_cpu_matmul(pool, w, x, y, n, act, arb, panel);
    free(panel);
    free(act);
}

/* pgd_cpu_matmul: 64 tokens at once against each token alone, batches at several offsets, and
 * every output against pgd_vec_dot (bits) and the scalar reference (bound). */
static void check_matmul(pgd_pool *pool, const kinfo *K, int64_t n_in, int64_t n_out, int mode) {
    enum { NT = 64 };
    const int64_t nb = n_in / 256;
    const size_t rb = (size_t)(nb * K->bytes);
    uint8_t *wd = malloc(rb * (size_t)n_out);
    float *x = malloc(sizeof(float) * (size_t)(NT * n_in));
    float *y_all = malloc(sizeof(float) * (size_t)(NT * n_out));
    float *y = malloc(sizeof(float) * (size_t)(NT * n_out));
    void *act = malloc(pgd_vec_dot_act_bytes(K->t, n_in));
    fill_blocks(K, wd, nb * n_out, mode);
    fill_x(x, NT * n_in, mode);
    pgd_weight w = {K->t, n_in, n_out, rb, wd, false};
    run(pool, &w, x, y_all, NT);
    int bad_batch = 0;
    const int sizes[] = {1, 2, 3, 4, 5, 6, 7, 16};
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++)
        for (int o = 0; o + sizes[si] <= NT; o += sizes[si] == 1 ? 1 : 13) {
            run(pool, &w, x + (size_t)o * n_in, y, sizes[si]);
            bad_batch += memcmp(y, y_all + (size_t)o * n_out,
                                sizeof(float) * (size_t)(sizes[si] * n_out)) != 0;
        }
    int bad = 0, far = 0;
    for (int t = 0; t < NT; t += 3) {
        pgd_quantize_act(K->t, x + (size_t)t * n_in, act, n_in);
        for (int64_t r = 0; r < n_out; r++) {
            const uint8_t *row = wd + (size_t)r * rb;
            const float got = y_all[(size_t)t * n_out + r];
            bad += !same(got, pgd_vec_dot(K->t, row, act, n_in));
            far += !same(got, pgd_vec_dot_scalar(K->t, row, act, n_in));
        }
    }
    CHECK(bad_batch == 0, "%s %lldx%lld mode %d: %d batches differ from 64 tokens at once",
          K->name, (long long)n_out, (long long)n_in, mode, bad_batch);
    CHECK(bad == 0, "%s %lldx%lld mode %d: %d outputs differ from pgd_vec_dot", K->name,
          (long long)n_out, (long long)n_in, mode, bad);
    CHECK(far == 0, "%s %lldx%lld mode %d: %d outputs differ from the scalar reference", K->name,
          (long long)n_out, (long long)n_in, mode, far);
    free(wd), free(x), free(y_all), free(y), free(act);
}

/* pgd_quantize_act's Q8_K blocks (AVX2 where built) against the scalar reference, byte for byte:
 * random rows with outliers, halves (ties to even), zeros, NaN, infinities, huge and tiny. */
static void check_quantize(void) {
    enum { N = 256 * 9 };
    static float x[N];
    static uint8_t a[N / 256 * 292], b[N / 256 * 292];
    int bad = 0;
    for (int round = 0; round < 40; round++) {
        fill_x(x, N, round & 1);
        for (int i = 0; i < 256; i++) x[256 + i] = (float)(i % 255 - 127) + 0.5f; /* ties */
        x[256] = 127.0f;
        memset(x + 512, 0, 256 * sizeof(float));                                 /* all zero */
        x[768 + round % 256] = NAN;
        x[1024 + round % 256] = round & 1 ? INFINITY : -INFINITY;
        for (int i = 0; i < 256; i++) x[1280 + i] *= 1e37f;                      /* huge */
        for (int i = 0; i < 256; i++) x[1536 + i] *= 1e-40f;                     /* subnormal */
        x[1792 + round % 256] = -NAN;
        x[1793 + round % 200] = 3e38f;
        pgd_quantize_act(PGD_TYPE_Q4_K, x, a, N);
        pgd_quantize_act_scalar(PGD_TYPE_Q4_K, x, b, N);
        bad += memcmp(a, b, sizeof a) != 0;
    }
    CHECK(bad == 0, "Q8_K quantization: %d of 40 rounds differ from the scalar reference", bad);
}

static int run_all(bool vnni) {
    pgd_err err;
    pgd_pool *pool;
#ifdef __AVX2__
    for (size_t k = 0; k < sizeof k_types / sizeof *k_types; k++)
        for (int mode = 0; mode < 2; mode++) {
            check_tiles(&k_types[k], 256, mode, false);
            check_tiles(&k_types[k], 256 * 11, mode, false);
            if (vnni) {
                check_tiles(&k_types[k], 256, mode, true);
                check_tiles(&k_types[k], 256 * 11, mode, true);
            }
        }
#else
    (void)vnni;
#endif
    for (int nth = 1; nth <= 2; nth++) {
        if (pgd_pool_create(nth, &pool, &err) != 0) {
            fprintf(stderr, "pool: %s\n", err.msg);
            return 1;
        }
        for (size_t k = 0; k < sizeof k_types / sizeof *k_types; k++)
            for (int mode = 0; mode < 2; mode++) {
                check_matmul(pool, &k_types[k], 256 * 3, 37, mode);
                if (nth == 2 && mode == 0) check_matmul(pool, &k_types[k], 256 * 22, 21, mode);
            }
        pgd_pool_free(pool);
    }
    return 0;
}

int main(void) {
    pgd_cpu_set_int8_act(true);
    check_quantize();
    /* AVX2 tiles (AVX-512 off), then the VNNI ones where the build and CPU have them */
    pgd_cpu_set_avx512(0);
    if (run_all(false)) return 1;
    const bool vnni = pgd__kq_vnni_supported() && pgd_cpu_set_avx512(1);
    if (vnni && run_all(true)) return 1;
    printf("test_kq_tiles: %d checks, %d failed (VNNI tiles %s)\n", g_checks, g_fail,
           vnni ? "tested" : "not on this CPU or build: not tested");
    return g_fail ? 1 : 0;
}
