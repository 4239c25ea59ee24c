/* Monotonic wall time, for timing and deadlines. */
#ifndef PGD_UTIL_CLOCK_H
#define PGD_UTIL_CLOCK_H

#include <time.h>

/* Seconds on CLOCK_MONOTONIC (an arbitrary origin: only differences mean anything). */
static inline double pgd_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#endif
