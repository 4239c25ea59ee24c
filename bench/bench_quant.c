/* Quick speed check of the CPU dot kernels (not a test): a 4096x4096 matrix-vector product per
 * weight type, single thread, median of 5, reported as GB/s of weight bytes streamed
 * (thread CPU time, so other processes on a shared machine distort it less).
 * Build (from the repo root):
 *   gcc -std=c11 -O2 -mavx2 -mfma -mf16c -D_GNU_SOURCE -Isrc -Iinclude \
 *       bench/bench_quant.c src/backend/cpu/quant.c src/util/status.c -lm -o /tmp/bench_quant */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cpu/quant.h"

static const struct {
    const char *name;
    pgd_type t;
    int qk, bytes, scale_off[2];
} k_types[] = {
    {"F32", PGD_TYPE_F32, 1, 4, {-1, -1}},      {"F16", PGD_TYPE_F16, 1, 2, {-1, -1}},
    {"BF16", PGD_TYPE_BF16, 1, 2, {-1, -1}},    {"Q8_0", PGD_TYPE_Q8_0, 32, 34, {0, -1}},
    {"Q4_0", PGD_TYPE_Q4_0, 32, 18, {0, -1}},   {"Q4_1", PGD_TYPE_Q4_1, 32, 20, {0, 2}},
    {"Q4_K", PGD_TYPE_Q4_K, 256, 144, {0, 2}},  {"Q5_K", PGD_TYPE_Q5_K, 256, 176, {0, 2}},
    {"Q6_K", PGD_TYPE_Q6_K, 256, 210, {208, -1}},
};

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts); /* CPU time: the build box is shared */
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(void) {
    enum { ROWS = 4096, COLS = 4096, REPS = 5 };
    float *x = malloc(COLS * sizeof(float)), *y = malloc(ROWS * sizeof(float));
    srand(1);
    for (int i = 0; i < COLS; i++) x[i] = (float)rand() / RAND_MAX - 0.5f;
    printf("%-5s %10s %10s %12s\n", "type", "avx2 GB/s", "ms/matvec", "scalar GB/s");
    for (size_t k = 0; k < sizeof k_types / sizeof k_types[0]; k++) {
        size_t row_bytes = (size_t)(COLS / k_types[k].qk) * (size_t)k_types[k].bytes;
        unsigned char *w = malloc(row_bytes * ROWS);
        for (size_t i = 0; i < row_bytes * ROWS; i++) w[i] = (unsigned char)rand();
        size_t nblk = row_bytes * ROWS / (size_t)k_types[k].bytes;
        for (size_t b = 0; b < nblk; b++) { /* finite values / scales */
            unsigned char *p = w + b * (size_t)k_types[k].bytes;
            float v = ((float)rand() / RAND_MAX - 0.5f) * (k_types[k].qk == 1 ? 1.0f : 0.01f);
            uint16_t h = k_types[k].t == PGD_TYPE_BF16 ? pgd_fp32_to_bf16(v) : pgd_fp32_to_fp16(v);
            if (k_types[k].t == PGD_TYPE_F32) memcpy(p, &v, 4);
            if (k_types[k].qk == 1 && k_types[k].t != PGD_TYPE_F32) memcpy(p, &h, 2);
            for (int s = 0; s < 2; s++)
                if (k_types[k].scale_off[s] >= 0) memcpy(p + k_types[k].scale_off[s], &h, 2);
        }
        void *act = malloc(pgd_vec_dot_act_bytes(k_types[k].t, COLS));
        double t_avx[REPS], t_sc[3];
        for (int r = 0; r < REPS; r++) {
            double t0 = now();
            pgd_quantize_act(k_types[k].t, x, act, COLS);
            for (int i = 0; i < ROWS; i++)
                y[i] = pgd_vec_dot(k_types[k].t, w + i * row_bytes, act, COLS);
            t_avx[r] = now() - t0;
        }
        for (int r = 0; r < 3; r++) {
            double t0 = now();
            pgd_quantize_act(k_types[k].t, x, act, COLS);
            for (int i = 0; i < ROWS; i++)
                y[i] = pgd_vec_dot_scalar(k_types[k].t, w + i * row_bytes, act, COLS);
            t_sc[r] = now() - t0;
        }
        qsort(t_avx, REPS, sizeof(double), cmp_d);
        qsort(t_sc, 3, sizeof(double), cmp_d);
        double gb = (double)(row_bytes * ROWS) / 1e9;
        printf("%-5s %10.2f %10.2f %12.2f   (y[0]=%g)\n", k_types[k].name, gb / t_avx[REPS / 2],
               1e3 * t_avx[REPS / 2], gb / t_sc[1], (double)y[0]);
        free(w);
        free(act);
    }
    free(x);
    free(y);
    return 0;
}
