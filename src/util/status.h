/* Status codes and the error message buffer every fallible call fills.
 * A fallible function returns 0 or a negative PGD_E* code; when it fails it writes one line
 * into the caller's pgd_err (naming the file and what is wrong) if err is not NULL. */
#ifndef PGD_UTIL_STATUS_H
#define PGD_UTIL_STATUS_H

#include <stddef.h>

enum {
    PGD_OK = 0,
    PGD_EINVAL = -1,      /* bad argument or bad request */
    PGD_ENOMEM = -2,      /* allocation failed */
    PGD_EIO = -3,         /* open/read/mmap failed */
    PGD_EFORMAT = -4,     /* malformed file contents */
    PGD_EUNSUPPORTED = -5,/* well-formed but not supported (architecture, tensor type) */
    PGD_ERANGE = -6,      /* a value out of range */
    PGD_ENOENT = -7,      /* missing file, key or tensor */
    PGD_EAGAIN = -8,      /* nothing done; the same call may succeed when repeated */
};

typedef struct pgd_err {
    char msg[512]; /* one line, no trailing newline */
} pgd_err;

/* Writes a formatted one-line message into err (if non-NULL) and returns code. */
int pgd_err_set(pgd_err *err, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
const char *pgd_status_str(int code);

#define PGD_ASSERT(cond)                                                                         \
    do {                                                                                         \
        if (!(cond)) pgd__assert_fail(#cond, __FILE__, __LINE__);                                \
    } while (0)
_Noreturn void pgd__assert_fail(const char *expr, const char *file, int line);

#endif
