/* Read-only memory mapping of a whole file, and the huge-page advice for anonymous mappings. */
#ifndef PGD_UTIL_MAPFILE_H
#define PGD_UTIL_MAPFILE_H

#include <stdbool.h>
#include <stddef.h>
#include "util/status.h"

typedef struct pgd_mapfile {
    const unsigned char *data; /* (size) bytes, read-only; NULL for an empty file */
    size_t size;
} pgd_mapfile;

/* Maps path read-only. On failure fills err with "PATH: reason". */
int pgd_mapfile_open(pgd_mapfile *m, const char *path, pgd_err *err);
void pgd_mapfile_close(pgd_mapfile *m);

/* Advises [p, p + n) MADV_HUGEPAGE where transparent huge pages are available (not "[never]")
 * and PAGODA_HUGEPAGES is not "0"; returns whether it did. A hint: the memory works either way.
 * The CPU weights and `pagoda bench`'s bandwidth probe both go through it, so the probe pays the
 * TLB walks the weights do. */
bool pgd_advise_hugepages(void *p, size_t n);

/* Reads a whole (small) file into a NUL-terminated malloc'd buffer; caller frees. */
int pgd_read_file(const char *path, char **out, size_t *len, pgd_err *err);

#endif
