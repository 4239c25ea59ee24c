/* Read rate of the two orders in which attention can walk a paged K/V cache (not a test): for each
 * tile of 32 positions, either the whole K rows then the whole V rows in address order ("rows"),
 * or per KV head its slice of every row of the tile ("slices", what the heads' kernels read).
 * Same bytes either way; 30 layers of CTX positions, blocks of 16 slots scattered; best of 7
 * passes, one thread. Build:
 *   gcc -O2 -mavx2 -Isrc bench/bench_kv_read.c -o /tmp/bench_kv_read
 *   /tmp/bench_kv_read rows|slices [CTX N_KV HEAD_DIM]     (defaults 2048 3 64: SmolLM2-135M;
 *                                                     HEAD_DIM a multiple of 32) */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/clock.h"

#define BS 16
#define TILE 32
#define NLAYER 30

/* Adds the n floats at p (a multiple of 32) into the 4 accumulators. */
static inline void sum_into(const float *p, int n, __m256 *a0, __m256 *a1, __m256 *a2,
                            __m256 *a3) {
    for (int i = 0; i < n; i += 32) {
        *a0 = _mm256_add_ps(*a0, _mm256_loadu_ps(p + i));
        *a1 = _mm256_add_ps(*a1, _mm256_loadu_ps(p + i + 8));
        *a2 = _mm256_add_ps(*a2, _mm256_loadu_ps(p + i + 16));
        *a3 = _mm256_add_ps(*a3, _mm256_loadu_ps(p + i + 24));
    }
}

int main(int argc, char **argv) {
    if (argc < 2 || (strcmp(argv[1], "rows") && strcmp(argv[1], "slices"))) {
        fprintf(stderr, "usage: bench_kv_read rows|slices [CTX N_KV HEAD_DIM]\n");
        return 2;
    }
    int whole = !strcmp(argv[1], "rows");
    int ctx = argc > 2 ? atoi(argv[2]) : 2048, nkv = argc > 3 ? atoi(argv[3]) : 3;
    int hd = argc > 4 ? atoi(argv[4]) : 64;
    if (ctx < TILE || ctx % TILE || nkv < 1 || hd < 32 || hd % 32) return 2;
    size_t kvd = (size_t)nkv * hd, nblk = (size_t)ctx / BS, lb = nblk * BS * kvd * sizeof(float);
    int *bt = malloc(nblk * sizeof *bt);
    float *k[NLAYER], *v[NLAYER];
    if (!bt) return 1;
    for (size_t i = 0; i < nblk; i++) bt[i] = (int)i;
    srand(1);
    for (size_t i = nblk - 1; i > 0; i--) {
        size_t j = (size_t)rand() % (i + 1);
        int t = bt[i];
        bt[i] = bt[j];
        bt[j] = t;
    }
    for (int l = 0; l < NLAYER; l++) {
        k[l] = malloc(lb);
        v[l] = malloc(lb);
        if (!k[l] || !v[l]) return 1;
        for (size_t i = 0; i < lb / sizeof(float); i++) k[l][i] = v[l][i] = 1e-3f;
    }
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    double best = 1e30;
    for (int r = 0; r < 7; r++) {
        double t0 = pgd_now_s();
        for (int l = 0; l < NLAYER; l++)
            for (int j0 = 0; j0 < ctx; j0 += TILE)
                for (int h = 0; h < (whole ? 1 : nkv); h++)
                    for (int m = 0; m < 2; m++)
                        for (int p = j0; p < j0 + TILE; p++) {
                            size_t row = ((size_t)bt[p / BS] * BS + (size_t)(p % BS)) * kvd;
                            const float *base = m ? v[l] : k[l];
                            if (whole) sum_into(base + row, (int)kvd, &a0, &a1, &a2, &a3);
                            else sum_into(base + row + (size_t)h * hd, hd, &a0, &a1, &a2, &a3);
                        }
        double t = pgd_now_s() - t0;
        if (t < best) best = t;
    }
    float o[8];
    _mm256_storeu_ps(o, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    printf("%s: ctx %d, %d KV heads x %d: %.2f GB/s (checksum %g)\n", argv[1], ctx, nkv, hd,
           2.0 * (double)lb * NLAYER / best / 1e9, (double)o[0]);
    return 0;
}
