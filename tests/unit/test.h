/* A minimal test harness for the C unit tests: CHECK macros count failures and keep going;
 * test_report prints "N passed, N failed" and returns the exit code for ctest. */
#ifndef PGD_TEST_H
#define PGD_TEST_H

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

static long pgd_test_passed, pgd_test_failed;

#define CHECK(cond)                                                                              \
    do {                                                                                         \
        if (cond) pgd_test_passed++;                                                             \
        else {                                                                                   \
            pgd_test_failed++;                                                                   \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);            \
        }                                                                                        \
    } while (0)

#define CHECK_EQ_INT(a, b)                                                                       \
    do {                                                                                         \
        long long va_ = (long long)(a), vb_ = (long long)(b);                                    \
        if (va_ == vb_) pgd_test_passed++;                                                       \
        else {                                                                                   \
            pgd_test_failed++;                                                                   \
            fprintf(stderr, "%s:%d: CHECK failed: %s == %s (%lld != %lld)\n", __FILE__,         \
                    __LINE__, #a, #b, va_, vb_);                                                 \
        }                                                                                        \
    } while (0)

static inline int test_report(const char *name) {
    printf("%s: %ld passed, %ld failed\n", name, pgd_test_passed, pgd_test_failed);
    return pgd_test_failed ? 1 : 0;
}

#endif
