/* Out-of-memory injection for the unit tests that link with -Wl,--wrap=malloc (CMakeLists.txt):
 * test_malloc_fail_at(k) makes the k-th malloc from now return NULL (k < 0: none fails). */
#ifndef PGD_TEST_OOM_H
#define PGD_TEST_OOM_H

#include <stddef.h>

void *__real_malloc(size_t n);
void *__wrap_malloc(size_t n);
static long test_fail_at = -1, test_n_calls;
void *__wrap_malloc(size_t n) {
    if (test_fail_at >= 0 && test_n_calls++ == test_fail_at) return NULL;
    return __real_malloc(n);
}

static inline void test_malloc_fail_at(long k) {
    test_fail_at = k;
    test_n_calls = 0;
}

#endif
