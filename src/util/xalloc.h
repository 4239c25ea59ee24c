/* Growth of the heap arrays that parsers, loaders and scratch structs append to: one doubling
 * rule instead of a realloc block at every push site. Not for hot paths (it may allocate). */
#ifndef PGD_UTIL_XALLOC_H
#define PGD_UTIL_XALLOC_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "util/status.h"

/* Makes room for element n of the array whose address is arr (a T **: the array is borrowed
 * and may move), which holds *cap elements of elem bytes: when n == *cap, reallocates it to
 * twice *cap elements (first when *cap is 0). Returns 0, or PGD_ENOMEM (the size overflowing
 * too) with the array and *cap unchanged, still the caller's to free. */
static inline int pgd_grow(void *arr, size_t n, size_t *cap, size_t first, size_t elem) {
    if (n < *cap) return PGD_OK;
    size_t nc = *cap ? 2 * *cap : first;
    if (nc < *cap || nc > SIZE_MAX / elem) return PGD_ENOMEM;
    void *old;
    memcpy(&old, arr, sizeof old); /* arr is a T **, read as the void * it converts to */
    void *p = realloc(old, nc * elem);
    if (!p) return PGD_ENOMEM;
    memcpy(arr, &p, sizeof p);
    *cap = nc;
    return PGD_OK;
}

/* pgd_grow for arrays counted in int32_t (the grammar, regex and schema compilers). */
static inline int pgd_grow_i32(void *arr, int32_t n, int32_t *cap, int32_t first, size_t elem) {
    if (n < *cap) return PGD_OK;
    if (*cap > INT32_MAX / 2) return PGD_ENOMEM;
    size_t c = (size_t)*cap;
    int rc = pgd_grow(arr, (size_t)n, &c, (size_t)first, elem);
    if (!rc) *cap = (int32_t)c;
    return rc;
}

/* Appends data[0..n) to the byte buffer *buf (*len bytes used of *cap), kept NUL-terminated
 * (the terminator not counted in *len) and grown to about twice what it needs: PGD_OK, or
 * PGD_ENOMEM with the buffer unchanged. */
static inline int pgd_bytes_append(char **buf, size_t *len, size_t *cap, const char *data,
                                   size_t n) {
    if (n > SIZE_MAX / 4 - *len) return PGD_ENOMEM;
    if (*len + n + 1 > *cap) {
        size_t nc = (*len + n + 1) * 2 + 64;
        char *p = realloc(*buf, nc);
        if (!p) return PGD_ENOMEM;
        *buf = p;
        *cap = nc;
    }
    if (n) memcpy(*buf + *len, data, n);
    *len += n;
    (*buf)[*len] = 0;
    return PGD_OK;
}

/* One allocation for several arrays set up together and freed together (a struct's scratch):
 * array i is slices[i].bytes long (each starts 64-byte aligned within the block, which is
 * zeroed) and its address goes into the pointer at slices[i].dst (a T **, written as the void *
 * it converts to). Returns the block -- freeing it frees every array -- or NULL (out of memory,
 * or sizes that overflow) with the pointers untouched. */
typedef struct pgd_slice {
    void *dst;
    size_t bytes;
} pgd_slice;

static inline void *pgd_alloc_slices(const pgd_slice *slices, size_t n) {
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        size_t b = (slices[i].bytes + 63) & ~(size_t)63;
        if (b < slices[i].bytes || total > SIZE_MAX - b) return NULL;
        total += b;
    }
    char *block = calloc(1, total ? total : 1);
    if (!block) return NULL;
    for (size_t i = 0, off = 0; i < n; i++) {
        void *p = block + off;
        memcpy(slices[i].dst, &p, sizeof p);
        off += (slices[i].bytes + 63) & ~(size_t)63;
    }
    return block;
}

#endif
