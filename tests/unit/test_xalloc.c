/* util/xalloc.h: the doubling rule, the first capacity, and a refused growth leaving the array
 * and its capacity as they were. */
#include <stdint.h>
#include <stdlib.h>

#include "test.h"
#include "util/xalloc.h"

static void test_grow_size(void) {
    double *a = NULL;
    size_t n = 0, cap = 0;
    for (int i = 0; i < 100; i++) {
        CHECK_EQ_INT(pgd_grow(&a, n, &cap, 8, sizeof *a), PGD_OK);
        a[n++] = i;
    }
    CHECK_EQ_INT(cap, 128); /* 8, 16, 32, 64, 128 */
    for (size_t i = 0; i < n; i++) CHECK(a[i] == (double)i);
    CHECK_EQ_INT(pgd_grow(&a, 5, &cap, 8, sizeof *a), PGD_OK); /* room already: nothing moves */
    CHECK_EQ_INT(cap, 128);
    /* a size past SIZE_MAX is refused before realloc sees it */
    size_t huge = SIZE_MAX / 16 + 1;
    double *keep = a;
    CHECK_EQ_INT(pgd_grow(&a, huge, &huge, 8, sizeof *a), PGD_ENOMEM);
    CHECK(a == keep);
    CHECK_EQ_INT(huge, SIZE_MAX / 16 + 1);
    free(a);
}

static void test_grow_i32(void) {
    int32_t *v = NULL, n = 0, cap = 0;
    for (int32_t i = 0; i < 17; i++) {
        CHECK_EQ_INT(pgd_grow_i32(&v, n, &cap, 16, sizeof *v), PGD_OK);
        v[n++] = i;
    }
    CHECK_EQ_INT(cap, 32);
    CHECK_EQ_INT(v[16], 16);
    int32_t big = INT32_MAX / 2 + 1;
    CHECK_EQ_INT(pgd_grow_i32(&v, big, &big, 16, sizeof *v), PGD_ENOMEM); /* 2 * cap overflows */
    CHECK_EQ_INT(big, INT32_MAX / 2 + 1);
    CHECK_EQ_INT(v[0], 0);
    free(v);
}

int main(void) {
    test_grow_size();
    test_grow_i32();
    return test_report("test_xalloc");
}
