/* Core-bound ceiling of the 4-row x 3-token register tile (matmul.c's tile shape), with every
 * operand in L1: the FMA peak of one core (12 independent FMA chains) against the tile on
 * F32 rows, F16 rows and an interleaved F32 panel (4 rows' 8-element steps adjacent), for a
 * row length K. Not a test; one thread, best of 20 passes of 20,000 tile calls. Build and run:
 *   gcc -O3 -mavx2 -mfma -mf16c -DK=512 bench/bench_tile_l1.c -o /tmp/tile_l1 && /tmp/tile_l1 */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

#ifndef K
#define K 512
#endif
#define CALLS 20000

static float W[4][K], P[4 * K], X[3][K + 16], out[12];
static unsigned short WH[4][K];

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* One function per operand layout, so each inner loop is compiled on its own. */
#define TILE_FN(NAME, LOAD_W)                                                                    \
    __attribute__((noinline)) static void NAME(void) {                                           \
        __m256 acc[4][3];                                                                        \
        for (int r = 0; r < 4; r++)                                                              \
            for (int t = 0; t < 3; t++) acc[r][t] = _mm256_setzero_ps();                         \
        for (int i = 0; i < K; i += 8) {                                                         \
            __m256 xv[3];                                                                        \
            for (int t = 0; t < 3; t++) xv[t] = _mm256_loadu_ps(&X[t][i]);                      \
            for (int r = 0; r < 4; r++) {                                                        \
                __m256 wv = LOAD_W;                                                              \
                for (int t = 0; t < 3; t++) acc[r][t] = _mm256_fmadd_ps(wv, xv[t], acc[r][t]);  \
            }                                                                                    \
        }                                                                                        \
        for (int r = 0; r < 4; r++)                                                              \
            for (int t = 0; t < 3; t++) out[r * 3 + t] += acc[r][t][0];                          \
    }
TILE_FN(tile_f32, _mm256_loadu_ps(&W[r][i]))
TILE_FN(tile_f16, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)&WH[r][i])))
TILE_FN(tile_panel, _mm256_loadu_ps(&P[i * 4 + r * 8]))

#define FMA12(a) a = _mm256_fmadd_ps(a, m, k);
static double peak(void) {
    const __m256 m = _mm256_set1_ps(0.9999f), k = _mm256_set1_ps(1e-4f);
    __m256 a0 = k, a1 = a0 + k, a2 = a1 + k, a3 = a2 + k, a4 = a3 + k, a5 = a4 + k, a6 = a5 + k,
           a7 = a6 + k, a8 = a7 + k, a9 = a8 + k, a10 = a9 + k, a11 = a10 + k;
    double best = 1e30;
    const long n = 20000000;
    for (int rep = 0; rep < 5; rep++) {
        double t = now();
        for (long i = 0; i < n; i++) {
            FMA12(a0) FMA12(a1) FMA12(a2) FMA12(a3) FMA12(a4) FMA12(a5)
            FMA12(a6) FMA12(a7) FMA12(a8) FMA12(a9) FMA12(a10) FMA12(a11)
            __asm__("" : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3), "+x"(a4), "+x"(a5), "+x"(a6),
                    "+x"(a7), "+x"(a8), "+x"(a9), "+x"(a10), "+x"(a11));
        }
        t = now() - t;
        if (t < best) best = t;
    }
    __m256 s = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 + a11;
    out[0] += s[0];
    return (double)n * 12 * 16 / best / 1e9;
}

int main(void) {
    static const char *names[3] = {"f32 rows", "f16 rows", "f32 interleaved panel"};
    static void (*const fns[3])(void) = {tile_f32, tile_f16, tile_panel};
    double pk = peak();
    printf("K %d: one-core FMA peak %.1f GFLOP/s\n", K, pk);
    for (int mode = 0; mode < 3; mode++) {
        double best = 1e30;
        for (int rep = 0; rep < 20; rep++) {
            double t = now();
            for (int i = 0; i < CALLS; i++) fns[mode]();
            t = now() - t;
            if (t < best) best = t;
        }
        double gf = (double)CALLS * 4 * 3 * K * 2 / best / 1e9;
        printf("  tile 4x3 %-22s %6.1f GFLOP/s (%.0f%% of peak)\n", names[mode], gf, 100 * gf / pk);
    }
    return out[0] == 12345.0f;
}
