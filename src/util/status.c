/* Status strings, error buffers and the always-on assertion. */
#include "util/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

int pgd_err_set(pgd_err *err, int code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        /* one line, whatever a file's strings quoted into it hold (a model type "a\nb"): control
         * characters, and the line breaks U+0085, U+2028 and U+2029, become '?' */
        char *w = err->msg;
        for (const char *r = err->msg; *r;) {
            const unsigned char *u = (const unsigned char *)r;
            size_t skip = u[0] == 0xC2 && u[1] == 0x85                                  ? 2
                          : u[0] == 0xE2 && u[1] == 0x80 && (u[2] == 0xA8 || u[2] == 0xA9) ? 3
                          : u[0] < 0x20 || u[0] == 0x7f                                  ? 1
                                                                                        : 0;
            if (skip) {
                *w++ = '?';
                r += skip;
            } else {
                *w++ = *r++;
            }
        }
        *w = '\0';
    }
    return code;
}

const char *pgd_status_str(int code) {
    switch (code) {
    case PGD_OK: return "ok";
    case PGD_EINVAL: return "invalid argument";
    case PGD_ENOMEM: return "out of memory";
    case PGD_EIO: return "i/o error";
    case PGD_EFORMAT: return "malformed input";
    case PGD_EUNSUPPORTED: return "unsupported";
    case PGD_ERANGE: return "out of range";
    case PGD_ENOENT: return "not found";
    case PGD_EAGAIN: return "try again";
    default: return "unknown error";
    }
}

_Noreturn void pgd__assert_fail(const char *expr, const char *file, int line) {
    fprintf(stderr, "pagoda: assertion failed: %s (%s:%d)\n", expr, file, line);
    abort();
}
