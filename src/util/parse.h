/* Parsing of human-written option values. */
#ifndef PGD_UTIL_PARSE_H
#define PGD_UTIL_PARSE_H

#include <stddef.h>

/* The value of hexadecimal digit c (either case), or -1. */
static inline int pgd_hex_digit(int c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                          : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* "512MiB", "2GiB", "64k", "1048576" (suffixes K/KiB/KB, M/MiB/MB, G/GiB/GB are powers of 1024,
 * case-insensitive) -> bytes. Returns 0, or -1 for anything else, a negative value or more
 * than 1e15 bytes. */
int pgd_parse_size(const char *s, size_t *out);

/* vLLM's form of a list option, `--lora-modules a=DIR b=DIR`: argv[*i] and the arguments after
 * it up to the next option (one starting with '-'), joined with commas into a new string, *i
 * left on the last one taken. NULL when out of memory. */
char *pgd_join_option_values(int argc, char **argv, int *i);
/* Whether name can name a LoRA adapter: 1 to 200 printable bytes without spaces, quotes or
 * backslashes (it goes into JSON and logs as it is). Returns 0, or -1 with one line in msg. */
int pgd_lora_name_check(const char *name, char *msg, size_t ml);
/* vLLM's --lora-modules list, "NAME=DIR,NAME=DIR...", split in place in spec: up to max names
 * and directories (pointers into spec) into names/paths, their count in *n. Names are printable
 * without spaces, quotes or backslashes (they go into JSON and logs as they are), distinct, and
 * not `reserved` (the base model's name; NULL: none). Returns 0, or -1 with one line in msg. */
int pgd_parse_lora_modules(char *spec, const char *reserved, const char **names,
                           const char **paths, int max, int *n, char *msg, size_t ml);

#endif
