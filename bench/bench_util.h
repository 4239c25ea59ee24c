/* Timing helpers of the microbenchmarks under bench/ (header only). */
#ifndef PGD_BENCH_UTIL_H
#define PGD_BENCH_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "sample/json_grammar.h"
#include "tokenizer/tokenizer.h"

static inline double bench_now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static inline int bench_cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of us[0..n) (reordered). */
static inline double bench_median(double *us, int n) {
    qsort(us, (size_t)n, sizeof *us, bench_cmp_d);
    return us[n / 2];
}

/* The mask benchmarks' setup: MODEL_OR_VOCAB.gguf [REPS] from the command line, its tokenizer
 * (*t) and vocabulary index (*v), a mask buffer and a timing buffer of *reps. 0, or the exit
 * status after a message naming prog. */
static inline int bench_mask_setup(const char *prog, int argc, char **argv, pgd_tokenizer **t,
                                   pgd_json_vocab *v, uint8_t **allow, double **us, int *reps) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL_OR_VOCAB.gguf [REPS]\n", prog);
        return 2;
    }
    *reps = argc > 2 ? atoi(argv[2]) : 51;
    if (*reps < 1 || *reps > 10000) *reps = 51;
    pgd_err err = {{0}};
    if (pgd_tokenizer_load_path(argv[1], t, &err)) {
        fprintf(stderr, "%s: %s\n", prog, err.msg);
        return 1;
    }
    int32_t n = pgd_tokenizer_n_vocab(*t);
    *allow = malloc((size_t)n);
    *us = malloc((size_t)*reps * sizeof **us);
    return !*allow || !*us || pgd_json_vocab_build(v, *t, n) ? 1 : 0;
}

#endif
