/* Outer-product F16 GEMM and GEMV on a row-interleaved layout, against the shipped dot-product
 * tile (not a test; the prototype behind issue 3's F16 prefill route, measured in
 * bench/RESULTS.md). Stand-alone: no project code.
 *
 * Layout: weights W (N x K, F16) packed as panels of 16 rows, k-major: P[n/16][k][16]. Every
 * y[t][n] is ONE FMA chain over k = 0..K-1 in order, in the GEMM (6 tokens x 16 rows per
 * register tile, K cut into KC slices with the 12 accumulators reloaded from y between slices:
 * an exact continuation) and in the GEMV (1 token, 4 panels at a time) alike, so the two agree
 * bit for bit (checked here) and a row's result does not depend on the batch.
 * Baseline: the shipped kernel's shape, a 4-row x 3-token dot-product tile on row-major F16
 * rows and F32 activations (8-lane accumulators, horizontal sum at the end), same loop order
 * as src/backend/cpu/matmul.c (tokens in blocks of 192 KiB, rows outer).
 *
 *   gcc -O2 -mavx2 -mfma -mf16c bench/bench_outer.c -o /tmp/bench_outer -lm
 *   /tmp/bench_outer N K T [REPS]      e.g. 2048 2048 96 / 1024 5632 96; T = 1: GEMV from memory
 * One thread; best of REPS (5) passes; prints GFLOP/s of both and the one-core FMA peak. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define KC 256

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static uint16_t f2h(float f) { return (uint16_t)_cvtss_sh(f, 0); }

/* y[t][n0..n0+16) for tokens t0..t0+NT over k in [k0, k1): one FMA chain per element. */
static inline __attribute__((always_inline)) void tile_outer(const uint16_t *p, const float *x,
                                                             size_t K, float *y, size_t N, int NT,
                                                             size_t k0, size_t k1) {
    __m256 acc[6][2];
#pragma GCC unroll 6
    for (int t = 0; t < NT; t++)
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++)
            acc[t][h] = k0 ? _mm256_loadu_ps(y + (size_t)t * N + 8 * h) : _mm256_setzero_ps();
    for (size_t k = k0; k < k1; k++) {
        __m256 w0 = _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(p + k * 16)));
        __m256 w1 = _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(p + k * 16 + 8)));
#pragma GCC unroll 6
        for (int t = 0; t < NT; t++) {
            __m256 b = _mm256_broadcast_ss(x + (size_t)t * K + k);
            acc[t][0] = _mm256_fmadd_ps(w0, b, acc[t][0]);
            acc[t][1] = _mm256_fmadd_ps(w1, b, acc[t][1]);
        }
    }
#pragma GCC unroll 6
    for (int t = 0; t < NT; t++)
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) _mm256_storeu_ps(y + (size_t)t * N + 8 * h, acc[t][h]);
}

/* tile_outer on a slice already converted to F32 (wf[k - k0][16]): no conversion per tile. */
static inline __attribute__((always_inline)) void tile_outer_f32(const float *wf, const float *x,
                                                                 size_t K, float *y, size_t N,
                                                                 int NT, size_t k0, size_t k1) {
    __m256 acc[6][2];
#pragma GCC unroll 6
    for (int t = 0; t < NT; t++)
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++)
            acc[t][h] = k0 ? _mm256_loadu_ps(y + (size_t)t * N + 8 * h) : _mm256_setzero_ps();
    for (size_t k = k0; k < k1; k++) {
        __m256 w0 = _mm256_load_ps(wf + (k - k0) * 16), w1 = _mm256_load_ps(wf + (k - k0) * 16 + 8);
#pragma GCC unroll 6
        for (int t = 0; t < NT; t++) {
            __m256 b = _mm256_broadcast_ss(x + (size_t)t * K + k);
            acc[t][0] = _mm256_fmadd_ps(w0, b, acc[t][0]);
            acc[t][1] = _mm256_fmadd_ps(w1, b, acc[t][1]);
        }
    }
#pragma GCC unroll 6
    for (int t = 0; t < NT; t++)
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) _mm256_storeu_ps(y + (size_t)t * N + 8 * h, acc[t][h]);
}

/* tile_outer_f32 for 6 tokens whose activations are packed k-major (xp[k][6]). */
static inline __attribute__((always_inline)) void tile_outer_pk(const float *wf, const float *xp,
                                                                float *y, size_t N, size_t k0,
                                                                size_t k1) {
    __m256 acc[6][2];
#pragma GCC unroll 6
    for (int t = 0; t < 6; t++)
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++)
            acc[t][h] = k0 ? _mm256_loadu_ps(y + (size_t)t * N + 8 * h) : _mm256_setzero_ps();
    for (size_t k = k0; k < k1; k++) {
        __m256 w0 = _mm256_load_ps(wf + (k - k0) * 16), w1 = _mm256_load_ps(wf + (k - k0) * 16 + 8);
#pragma GCC unroll 6
        for (int t = 0; t < 6; t++) {
            __m256 b = _mm256_broadcast_ss(xp + k * 6 + t);
            acc[t][0] = _mm256_fmadd_ps(w0, b, acc[t][0]);
            acc[t][1] = _mm256_fmadd_ps(w1, b, acc[t][1]);
        }
    }
#pragma GCC unroll 6
    for (int t = 0; t < 6; t++)
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) _mm256_storeu_ps(y + (size_t)t * N + 8 * h, acc[t][h]);
}

/* gemm_outer with each 16-row x KC slice converted to F32 once (16 KiB, in L1) for all tokens:
 * the same FMAs in the same order (F16 -> F32 is exact), so the same bits. */
static void gemm_outer_cvt(const uint16_t *P, const float *X, float *Y, size_t N, size_t K,
                           size_t T) {
    static float wf[KC * 16] __attribute__((aligned(64)));
    /* Activations of each 6-token group packed k-major (xp[k][6]): one broadcast stream. */
    float *Xp = aligned_alloc(64, (T * K * 4 + 63) / 64 * 64);
    if (!Xp) return;
    for (size_t g = 0; g + 6 <= T; g += 6)
        for (size_t k = 0; k < K; k++)
            for (int j = 0; j < 6; j++) Xp[g * K + k * 6 + j] = X[(g + j) * K + k];
    for (size_t k0 = 0; k0 < K; k0 += KC) {
        size_t k1 = k0 + KC < K ? k0 + KC : K;
        for (size_t n = 0; n < N; n += 16) {
            const uint16_t *p = P + n * K + k0 * 16;
            for (size_t i = 0; i < (k1 - k0) * 16; i += 8)
                _mm256_store_ps(wf + i, _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(p + i))));
            size_t t = 0;
            for (; t + 6 <= T; t += 6) tile_outer_pk(wf, Xp + t * K, Y + t * N + n, N, k0, k1);
            for (; t < T; t++) tile_outer_f32(wf, X + t * K, K, Y + t * N + n, N, 1, k0, k1);
        }
    }
    free(Xp);
}

/* Panels outer, then K slices, then token tiles: a panel's y tile (T x 16 floats) stays in L1
 * across the slices and its weight slice (KC x 16 F16, 8 KiB) across the token tiles. */
static void gemm_outer(const uint16_t *P, const float *X, float *Y, size_t N, size_t K, size_t T) {
    for (size_t n = 0; n < N; n += 16) {
        const uint16_t *p = P + n * K;
        for (size_t k0 = 0; k0 < K; k0 += KC) {
            size_t k1 = k0 + KC < K ? k0 + KC : K;
            size_t t = 0;
            for (; t + 6 <= T; t += 6) tile_outer(p, X + t * K, K, Y + t * N + n, N, 6, k0, k1);
            for (; t < T; t++) tile_outer(p, X + t * K, K, Y + t * N + n, N, 1, k0, k1);
        }
    }
}

/* One token, 4 panels (64 rows) at a time: 8 independent chains, k in order. */
static void gemv_outer(const uint16_t *P, const float *x, float *y, size_t N, size_t K) {
    size_t n = 0;
    for (; n + 64 <= N; n += 64) {
        const uint16_t *p = P + n * K;
        __m256 a[8];
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) a[i] = _mm256_setzero_ps();
        for (size_t k = 0; k < K; k++) {
            __m256 b = _mm256_broadcast_ss(x + k);
#pragma GCC unroll 4
            for (int q = 0; q < 4; q++)
#pragma GCC unroll 2
                for (int h = 0; h < 2; h++) {
                    const uint16_t *w = p + q * 16 * K + k * 16 + 8 * h;
                    a[2 * q + h] = _mm256_fmadd_ps(
                        _mm256_cvtph_ps(_mm_load_si128((const __m128i *)w)), b, a[2 * q + h]);
                }
        }
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) _mm256_storeu_ps(y + n + 8 * i, a[i]);
    }
    for (; n < N; n += 16) tile_outer(P + n * K, x, K, y + n, N, 1, 0, K);
}

static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* The shipped shape: 4 rows x 3 tokens, 8-lane accumulators along k, rows outer. */
static inline __attribute__((always_inline)) void tile_dot(const uint16_t *W, const float *X,
                                                           float *Y, size_t N, size_t K, int NT) {
    __m256 acc[4][3];
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++)
#pragma GCC unroll 3
        for (int j = 0; j < NT; j++) acc[r][j] = _mm256_setzero_ps();
    for (size_t k = 0; k < K; k += 8) {
        __m256 xv[3];
#pragma GCC unroll 3
        for (int j = 0; j < NT; j++) xv[j] = _mm256_loadu_ps(X + (size_t)j * K + k);
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            __m256 w = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(W + (size_t)r * K + k)));
#pragma GCC unroll 3
            for (int j = 0; j < NT; j++) acc[r][j] = _mm256_fmadd_ps(w, xv[j], acc[r][j]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++)
#pragma GCC unroll 3
        for (int j = 0; j < NT; j++) Y[(size_t)j * N + r] = hsum8(acc[r][j]);
}

static void gemm_dot(const uint16_t *W, const float *X, float *Y, size_t N, size_t K, size_t T) {
    size_t tb = (192 * 1024) / (K * 4) / 3 * 3;
    if (tb < 3) tb = 3;
    for (size_t t0 = 0; t0 < T; t0 += tb) {
        size_t t1 = t0 + tb < T ? t0 + tb : T;
        for (size_t n = 0; n < N; n += 4) {
            size_t t = t0;
            for (; t + 3 <= t1; t += 3) tile_dot(W + n * K, X + t * K, Y + t * N + n, N, K, 3);
            for (; t < t1; t++) tile_dot(W + n * K, X + t * K, Y + t * N + n, N, K, 1);
        }
    }
}

/* 10 independent FMA chains in named registers (more than latency x throughput). */
static double peak_gflops(void) {
    const __m256 m = _mm256_set1_ps(0.9999f), c = _mm256_set1_ps(1e-4f);
    __m256 a0 = _mm256_set1_ps(0.f), a1 = _mm256_set1_ps(1.f), a2 = _mm256_set1_ps(2.f),
           a3 = _mm256_set1_ps(3.f), a4 = _mm256_set1_ps(4.f), a5 = _mm256_set1_ps(5.f),
           a6 = _mm256_set1_ps(6.f), a7 = _mm256_set1_ps(7.f), a8 = _mm256_set1_ps(8.f),
           a9 = _mm256_set1_ps(9.f);
    long iters = 100000000;
    double t = now();
    for (long it = 0; it < iters; it++) {
        a0 = _mm256_fmadd_ps(a0, m, c), a1 = _mm256_fmadd_ps(a1, m, c);
        a2 = _mm256_fmadd_ps(a2, m, c), a3 = _mm256_fmadd_ps(a3, m, c);
        a4 = _mm256_fmadd_ps(a4, m, c), a5 = _mm256_fmadd_ps(a5, m, c);
        a6 = _mm256_fmadd_ps(a6, m, c), a7 = _mm256_fmadd_ps(a7, m, c);
        a8 = _mm256_fmadd_ps(a8, m, c), a9 = _mm256_fmadd_ps(a9, m, c);
    }
    t = now() - t;
    float s = hsum8(_mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                                  _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7))));
    s += hsum8(_mm256_add_ps(a8, a9));
    if (s == 12345.f) puts("");
    return (double)iters * 10 * 16 / t / 1e9;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s N K T [REPS]\n", argv[0]);
        return 2;
    }
    size_t N = (size_t)atol(argv[1]), K = (size_t)atol(argv[2]), T = (size_t)atol(argv[3]);
    int reps = argc > 4 ? atoi(argv[4]) : 5;
    if (N % 64 || K % 8 || !T) {
        fprintf(stderr, "N must be a multiple of 64, K of 8\n");
        return 2;
    }
    uint16_t *W = aligned_alloc(1 << 21, (N * K * 2 + (1 << 21) - 1) >> 21 << 21),
             *P = aligned_alloc(1 << 21, (N * K * 2 + (1 << 21) - 1) >> 21 << 21);
    float *X = aligned_alloc(64, T * K * 4), *Y = aligned_alloc(64, T * N * 4),
          *Z = aligned_alloc(64, T * N * 4);
    if (!W || !P || !X || !Y || !Z) return 1;
    /* Transparent huge pages, as the CPU backend's weights (a hint; THP may be off). */
    (void)madvise(W, N * K * 2, MADV_HUGEPAGE);
    (void)madvise(P, N * K * 2, MADV_HUGEPAGE);
    srand(1);
    for (size_t i = 0; i < N * K; i++) W[i] = f2h((float)rand() / RAND_MAX - 0.5f);
    for (size_t i = 0; i < T * K; i++) X[i] = (float)rand() / RAND_MAX - 0.5f;
    for (size_t n = 0; n < N; n++)
        for (size_t k = 0; k < K; k++) P[(n / 16) * 16 * K + k * 16 + n % 16] = W[n * K + k];

    /* Batch invariance of the outer-product pair: GEMM rows == GEMV of each token alone. */
    gemm_outer(P, X, Y, N, K, T);
    size_t bad = 0;
    double err = 0, ref2 = 0;
    for (size_t t = 0; t < T && t < 8; t++) {
        gemv_outer(P, X + t * K, Z, N, K);
        for (size_t n = 0; n < N; n++) bad += memcmp(&Z[n], &Y[t * N + n], 4) != 0;
    }
    gemm_outer_cvt(P, X, Z, N, K, T);
    for (size_t i = 0; i < T * N; i++) bad += memcmp(&Z[i], &Y[i], 4) != 0;
    gemm_dot(W, X, Z, N, K, T);
    for (size_t i = 0; i < T * N; i++) {
        err += (Z[i] - Y[i]) * (double)(Z[i] - Y[i]);
        ref2 += (double)Z[i] * Z[i];
    }
    printf("outer GEMM vs GEMV and vs the converted-slice GEMM: %zu differ (bitwise); outer vs "
           "dot-tile rel. RMS %.2e\n", bad, sqrt(err / ref2));

    double flop = 2.0 * (double)N * K * T, best_o = 1e9, best_d = 1e9, best_c = 1e9;
    for (int r = 0; r < reps; r++) {
        if (T > 1) {
            double tc = now();
            gemm_outer_cvt(P, X, Y, N, K, T);
            tc = now() - tc;
            if (tc < best_c) best_c = tc;
        }
        double t = now();
        if (T == 1) gemv_outer(P, X, Y, N, K);
        else gemm_outer(P, X, Y, N, K, T);
        t = now() - t;
        if (t < best_o) best_o = t;
        t = now();
        gemm_dot(W, X, Z, N, K, T);
        t = now() - t;
        if (t < best_d) best_d = t;
    }
    double pk = peak_gflops();
    printf("N %zu K %zu T %zu: outer %.1f GFLOP/s (%.1f GB/s of weights), outer on F32 slices + packed "
           "activations %.1f, dot tile %.1f GFLOP/s (%.1f GB/s); one-core FMA peak %.1f GFLOP/s\n",
           N, K, T, flop / best_o / 1e9, (double)N * K * 2 / best_o / 1e9,
           T > 1 ? flop / best_c / 1e9 : 0.0, flop / best_d / 1e9,
           (double)N * K * 2 / best_d / 1e9, pk);
    return bad != 0;
}
