/* Parsing of human-written option values. */
#ifndef PGD_UTIL_PARSE_H
#define PGD_UTIL_PARSE_H

#include <stddef.h>

/* "512MiB", "2GiB", "64k", "1048576" (suffixes K/KiB/KB, M/MiB/MB, G/GiB/GB are powers of 1024,
 * case-insensitive) -> bytes. Returns 0, or -1 for anything else, a negative value or more
 * than 1e15 bytes. */
int pgd_parse_size(const char *s, size_t *out);

#endif
