/* The test tools' input lines carry text as hexadecimal (any bytes, cut characters too). */
#ifndef PGD_TOOL_HEX_H
#define PGD_TOOL_HEX_H

#include <string.h>

static inline int tool_hexval(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Decodes hex s (a trailing newline ignored) into buf (cap bytes); the length, or -1. */
static inline long tool_unhex(const char *s, char *buf, size_t cap) {
    size_t n = strlen(s);
    while (n && (s[n - 1] == '\n' || s[n - 1] == '\r')) n--;
    if (n % 2 || n / 2 > cap) return -1;
    for (size_t i = 0; i < n / 2; i++) {
        int h = tool_hexval(s[2 * i]), l = tool_hexval(s[2 * i + 1]);
        if (h < 0 || l < 0) return -1;
        buf[i] = (char)(h * 16 + l);
    }
    return (long)(n / 2);
}

#endif
