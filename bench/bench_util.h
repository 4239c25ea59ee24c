/* Timing helpers of the microbenchmarks under bench/ (header only). */
#ifndef PGD_BENCH_UTIL_H
#define PGD_BENCH_UTIL_H

#include <stdlib.h>
#include <time.h>

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

#endif
