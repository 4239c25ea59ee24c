/* Row-major tiles against the CPU backend's packed layout (pgd_cpu_pack) on the same matrices,
 * alternated inside one process (not a test): on a shared machine whose speed drifts by up to 2x
 * within minutes, only such in-process alternation gives a stable ratio. Each of 41 rounds times
 * one pass over NMAT row-major matrices, then one over their packed copies; prints both rates
 * (medians) and the median ratio with its quartiles. Build (from the repo root, after
 * cmake --build build):
 *   gcc -O2 -mavx2 -mfma -mf16c -Isrc -Iinclude bench/bench_pack_ab.c build/libpagoda.a \
 *       -lcjson -lm -lpthread -o /tmp/bench_pack_ab
 *   /tmp/bench_pack_ab THREADS ROWS COLS N NMAT TYPE   (TYPE: ggml id, 1 F16, 8 Q8_0) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/matmul.h"
#include "backend/cpu/pool.h"
#include "util/clock.h"

#define ROUNDS 41

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    if (argc < 7) {
        fprintf(stderr, "usage: bench_pack_ab THREADS ROWS COLS N NMAT TYPE\n");
        return 2;
    }
    int nth = atoi(argv[1]), rows = atoi(argv[2]), cols = atoi(argv[3]), n = atoi(argv[4]),
        nmat = atoi(argv[5]);
    pgd_type ty = (pgd_type)atoi(argv[6]);
    if (nth < 1 || rows < 1 || cols < 1 || n < 1 || nmat < 1 || nmat > 256) return 2;
    pgd_err err;
    pgd_pool *pool;
    if (pgd_pool_create(nth, &pool, &err)) return 1;
    if (cols % (int)pgd_type_block_elems(ty)) return 2;
    size_t rb = (size_t)(cols / (int)pgd_type_block_elems(ty)) * pgd_type_block_bytes(ty);
    pgd_weight *w = calloc((size_t)nmat, sizeof *w), *wp = calloc((size_t)nmat, sizeof *wp);
    if (!w || !wp) return 1;
    srand(1);
    for (int m = 0; m < nmat; m++) {
        uint8_t *d = malloc(rb * (size_t)rows), *p = malloc(rb * (size_t)rows);
        if (!d || !p) return 1;
        /* random bytes, then every fp16 scale a small normal number (speed does not care) */
        for (size_t i = 0; i < rb * (size_t)rows; i++) d[i] = (uint8_t)rand();
        if (ty == PGD_TYPE_Q8_0)
            for (size_t b = 0; b < rb * (size_t)rows / 34; b++) {
                uint16_t h = (uint16_t)(0x2000 + (rand() & 0x3ff));
                memcpy(d + b * 34, &h, 2);
            }
        else if (ty == PGD_TYPE_F16)
            for (size_t i = 0; i < (size_t)cols * (size_t)rows; i++) {
                uint16_t h = (uint16_t)(0x3000 + (rand() & 0x3ff));
                memcpy(d + 2 * i, &h, 2);
            }
        w[m] = (pgd_weight){ty, cols, rows, rb, d, false};
        if (!pgd_cpu_can_pack(&w[m])) {
            fprintf(stderr, "bench_pack_ab: this build does not pack type %d at %dx%d\n", ty,
                    rows, cols);
            return 1;
        }
        pgd_cpu_pack(&w[m], p);
        wp[m] = w[m];
        wp[m].data = p;
        wp[m].panel16 = true;
    }
    float *x = malloc(sizeof(float) * (size_t)cols * (size_t)n);
    float *y = malloc(sizeof(float) * (size_t)rows * (size_t)n);
    size_t ab = pgd_cpu_matmul_act_row_bytes(&w[0]);
    void *act = malloc(ab * (size_t)n + 64), *panel = malloc(pgd_cpu_matmul_panel_bytes(ab, nth));
    if (!x || !y || !act || !panel) return 1;
    for (size_t i = 0; i < (size_t)cols * (size_t)n; i++) x[i] = (float)rand() / RAND_MAX - 0.5f;
    double ta[ROUNDS], tb[ROUNDS], ratio[ROUNDS];
    for (int it = 0; it < ROUNDS; it++) {
        double t0 = pgd_now_s();
        for (int m = 0; m < nmat; m++) pgd_cpu_matmul(pool, &w[m], x, y, n, act, ab, panel);
        double t1 = pgd_now_s();
        for (int m = 0; m < nmat; m++) pgd_cpu_matmul(pool, &wp[m], x, y, n, act, ab, panel);
        double t2 = pgd_now_s();
        ta[it] = t1 - t0;
        tb[it] = t2 - t1;
        ratio[it] = ta[it] / tb[it];
    }
    qsort(ta, ROUNDS, sizeof *ta, cmp);
    qsort(tb, ROUNDS, sizeof *tb, cmp);
    qsort(ratio, ROUNDS, sizeof *ratio, cmp);
    double bytes = (double)rb * rows * nmat;
    printf("type %d %dx%d n %d nmat %d threads %d: row-major %.2f GB/s, packed %.2f GB/s "
           "(medians), packed/row-major %.3f [quartiles %.3f %.3f]\n",
           ty, rows, cols, n, nmat, nth, bytes / ta[ROUNDS / 2] / 1e9, bytes / tb[ROUNDS / 2] / 1e9,
           ratio[ROUNDS / 2], ratio[ROUNDS / 4], ratio[3 * ROUNDS / 4]);
    return 0;
}
