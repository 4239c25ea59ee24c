/* util/xalloc.h: the doubling rule, the first capacity, and a refused growth leaving the array
 * and its capacity as they were; byte-buffer appends; one-block slices. */
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

/* Appends keep the buffer NUL-terminated and whole across growth; an impossible size is refused
 * with the buffer unchanged. */
static void test_bytes_append(void) {
    char *b = NULL;
    size_t len = 0, cap = 0;
    for (int i = 0; i < 100; i++) CHECK(pgd_bytes_append(&b, &len, &cap, "abc", 3) == PGD_OK);
    CHECK(len == 300 && cap > 300 && strlen(b) == 300 && !memcmp(b + 297, "abc", 3));
    CHECK(pgd_bytes_append(&b, &len, &cap, "", 0) == PGD_OK && len == 300 && b[300] == 0);
    volatile size_t huge = SIZE_MAX / 2; /* (opaque to the compiler: refused before any copy) */
    CHECK(pgd_bytes_append(&b, &len, &cap, "x", huge) == PGD_ENOMEM && len == 300);
    free(b);
}

/* Slices: each 64-byte aligned within one zeroed block, disjoint, in order; overflowing sizes
 * refused with the pointers untouched. */
static void test_slices(void) {
    int32_t *a = NULL;
    double *d = NULL;
    char *c = NULL;
    const pgd_slice sl[] = {{&a, 5 * sizeof *a}, {&d, 3 * sizeof *d}, {&c, 1}};
    void *blk = pgd_alloc_slices(sl, 3);
    CHECK(blk && (void *)a == blk);
    CHECK((char *)d - (char *)a == 64 && c - (char *)d == 64);
    CHECK(a[4] == 0 && d[2] == 0.0 && c[0] == 0);
    a[4] = 7, d[2] = 1.5, c[0] = 'x'; /* (ASan: each within the block) */
    free(blk);
    int32_t *x = (int32_t *)&sl; /* any non-NULL marker */
    const pgd_slice big[] = {{&x, SIZE_MAX - 10}, {&x, 100}};
    CHECK(pgd_alloc_slices(big, 2) == NULL && x == (int32_t *)&sl);
}

int main(void) {
    test_grow_size();
    test_grow_i32();
    test_bytes_append();
    test_slices();
    return test_report("test_xalloc");
}
