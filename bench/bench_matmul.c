/* Speed of pgd_cpu_matmul alone (not a test): y = x . W^T for a ROWS x COLS weight of one type
 * and N tokens, over NMAT distinct random matrices (8 by default, so decode shapes stream from
 * memory), on THREADS pool threads; best of REPS passes, wall time. Prints weight GB/s and
 * GFLOP/s (2 flops per multiply-add). NOPANEL=1 passes no panel scratch (the fused tiles at
 * every n), to compare the prefill paths. Build (from the repo root, after cmake --build build):
 *   gcc -O2 -mavx2 -mfma -mf16c -Isrc -Iinclude bench/bench_matmul.c build/libpagoda.a -lm \
 *       -lpthread -o /tmp/bench_matmul
 *   /tmp/bench_matmul THREADS ROWS COLS N TYPE    (TYPE: ggml id, 0 F32, 1 F16, 2 Q4_0, 3 Q4_1,
 *                                                  8 Q8_0, 12 Q4_K, 13 Q5_K, 14 Q6_K)
 * Environment: NMAT, REPS (20), NOPANEL, PAGODA_INT8_ACT, HUGE=1 (weights in transparent huge
 * pages), PACK=1 (F16 weights in the CPU backend's 16-row panels, as the model loader stores
 * them; without it the row-major tiles). */
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "backend/cpu/matmul.h"
#include "backend/cpu/quant.h"
#include "util/clock.h"

static int env_int(const char *name, int dflt) {
    const char *v = getenv(name);
    return v ? atoi(v) : dflt;
}

int main(int argc, char **argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: bench_matmul THREADS ROWS COLS N TYPE\n");
        return 2;
    }
    int nth = atoi(argv[1]), rows = atoi(argv[2]), cols = atoi(argv[3]), n = atoi(argv[4]);
    pgd_type ty = (pgd_type)atoi(argv[5]);
    int nmat = env_int("NMAT", 8), reps = env_int("REPS", 20);
    if (nmat < 1 || nmat > 64 || reps < 1 || n < 1) return 2;
    pgd_pool *pool;
    pgd_err e;
    if (pgd_pool_create(nth, &pool, &e)) return 1;
    size_t rb = pgd_type_row_bytes(ty, (uint64_t)cols);
    pgd_weight w[64];
    srand(1);
    for (int m = 0; m < nmat; m++) {
        size_t sz = (rb * (size_t)rows + (2u << 20) - 1) / (2u << 20) * (2u << 20);
        unsigned char *d = aligned_alloc(2u << 20, sz);
        if (!d) return 1;
        if (env_int("HUGE", 0) && madvise(d, sz, MADV_HUGEPAGE)) perror("madvise");
        for (size_t i = 0; i < rb * (size_t)rows; i++) d[i] = (unsigned char)rand();
        w[m] = (pgd_weight){ty, cols, rows, rb, d, false}; /* random scales: speed does not care */
        if (env_int("PACK", 0) && pgd_cpu_can_pack(&w[m])) { /* F16 in 16-row panels */
            unsigned char *p = aligned_alloc(2u << 20, sz);
            if (!p) return 1;
            if (env_int("HUGE", 0) && madvise(p, sz, MADV_HUGEPAGE)) perror("madvise");
            pgd_cpu_pack(&w[m], p);
            free(d);
            w[m].data = p;
            w[m].panel16 = true;
        }
    }
    float *x = malloc(sizeof(float) * (size_t)cols * n), *y = malloc(sizeof(float) * (size_t)rows * n);
    size_t ab = pgd_cpu_matmul_act_row_bytes(&w[0]);
    void *act = malloc(ab * (size_t)n + 64), *panel = malloc(pgd_cpu_matmul_panel_bytes(ab, nth));
    if (!x || !y || !act || !panel) return 1;
    for (size_t i = 0; i < (size_t)cols * n; i++) x[i] = (float)rand() / (float)RAND_MAX;
    if (env_int("NOPANEL", 0)) panel = NULL;
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t = pgd_now_s();
        for (int m = 0; m < nmat; m++)
            pgd_cpu_matmul(pool, &w[m], x, y, n, act, ab, panel);
        t = pgd_now_s() - t;
        if (t < best) best = t;
    }
    double bytes = (double)rb * rows * nmat;
    printf("type %d rows %d cols %d n %d threads %d: %.2f GB/s %.1f GFLOP/s %.3f ms/matrix\n",
           ty, rows, cols, n, nth, bytes / best / 1e9, 2.0 * rows * cols * (double)n * nmat / best / 1e9,
           best / nmat * 1e3);
    return 0;
}
