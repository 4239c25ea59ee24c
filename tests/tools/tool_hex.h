/* The test tools' input lines carry text as hexadecimal (any bytes, cut characters too). */
#ifndef PGD_TOOL_HEX_H
#define PGD_TOOL_HEX_H

#include <string.h>

#include "util/parse.h"

/* Decodes hex s (a trailing newline ignored) into buf (cap bytes); the length, or -1. */
static inline long tool_unhex(const char *s, char *buf, size_t cap) {
    size_t n = strlen(s);
    while (n && (s[n - 1] == '\n' || s[n - 1] == '\r')) n--;
    if (n % 2 || n / 2 > cap) return -1;
    for (size_t i = 0; i < n / 2; i++) {
        int h = pgd_hex_digit(s[2 * i]), l = pgd_hex_digit(s[2 * i + 1]);
        if (h < 0 || l < 0) return -1;
        buf[i] = (char)(h * 16 + l);
    }
    return (long)(n / 2);
}

#endif
