/* Streaming a Q8_0-shaped matrix (rows of n_in / 32 blocks of 34 bytes) four rows at a time, as
 * the CPU decode tile reads it: row-major (4 concurrent streams, row_bytes apart) vs 4-row
 * interleaved (one stream), both with the tile's software prefetch of the next 4-row group, and
 * a plain linear read without prefetch for reference. One thread, best of REPS passes, weight
 * GB/s. Use matrices larger than the L3 (e.g. 160000 x 576, 40000 x 2048) to measure DRAM.
 *   gcc -O2 -mavx2 -o /tmp/bench_row_streams bench/bench_row_streams.c
 *   /tmp/bench_row_streams ROWS N_IN REPS [EXTRA_PREFETCH_BYTES] */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BLOCK 34 /* Q8_0: an F16 scale and 32 int8 */

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* One pass over the matrix in 4-row groups; interleaved: block b of the group's 4 rows are
 * adjacent. Returns the folded loads so the compiler keeps them. */
static __m256i pass_tiles(const uint8_t *w, long rows, long nb, int interleaved, long pf_extra) {
    __m256i acc = _mm256_setzero_si256();
    long rb = nb * BLOCK;
    for (long r0 = 0; r0 < rows; r0 += 4) {
        const uint8_t *tile = w + r0 * rb;
        size_t step = (size_t)(4 * rb) / (size_t)nb;
        const char *pf = (const char *)tile + 4 * rb + pf_extra;
        for (long b = 0; b < nb; b++) {
            _mm_prefetch(pf + b * step, _MM_HINT_T0);
            _mm_prefetch(pf + b * step + step / 2, _MM_HINT_T0);
            for (int k = 0; k < 4; k++) {
                const uint8_t *p = interleaved ? tile + b * 4 * BLOCK + k * BLOCK
                                               : tile + k * rb + b * BLOCK;
                acc = _mm256_add_epi8(acc, _mm256_loadu_si256((const __m256i *)(p + 2)));
            }
        }
    }
    return acc;
}

static __m256i pass_linear(const uint8_t *w, size_t bytes) {
    __m256i acc = _mm256_setzero_si256();
    const __m256i *q = (const __m256i *)w;
    for (size_t i = 0; i < bytes / 32; i++) acc = _mm256_add_epi8(acc, _mm256_load_si256(q + i));
    return acc;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s ROWS N_IN REPS [EXTRA_PREFETCH_BYTES]\n", argv[0]);
        return 2;
    }
    long rows = atol(argv[1]) / 4 * 4, nb = atol(argv[2]) / 32, pf_extra = argc > 4 ? atol(argv[4]) : 0;
    int reps = atoi(argv[3]);
    if (rows < 4 || nb < 1 || reps < 1) return 2;
    size_t bytes = (size_t)rows * (size_t)(nb * BLOCK);
    uint8_t *w = aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
    if (!w) return 1;
    memset(w, 1, bytes);
    double best[3] = {1e30, 1e30, 1e30};
    __m256i acc = _mm256_setzero_si256();
    for (int r = 0; r < reps; r++)
        for (int mode = 0; mode < 3; mode++) {
            double t = now();
            __m256i a = mode == 2 ? pass_linear(w, bytes) : pass_tiles(w, rows, nb, mode, pf_extra);
            t = now() - t;
            acc = _mm256_xor_si256(acc, a);
            if (t < best[mode]) best[mode] = t;
        }
    uint8_t o[32];
    _mm256_storeu_si256((__m256i *)o, acc);
    printf("rows %ld n_in %ld (%.1f MB): row-major %.2f GB/s, interleaved %.2f GB/s, linear %.2f "
           "GB/s (%d)\n",
           rows, nb * 32, bytes / 1e6, bytes / best[0] / 1e9, bytes / best[1] / 1e9,
           bytes / best[2] / 1e9, o[0]);
    free(w);
    return 0;
}
