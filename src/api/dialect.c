/* The byte buffer the API dialects write their events into (api/dialect.h). */
#include "api/dialect.h"
#include "util/xalloc.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void pgd_sbuf_append(pgd_sbuf *b, const char *data, size_t n) {
    if (b->oom || !data) return;
    if (pgd_bytes_append(&b->data, &b->len, &b->cap, data, n)) b->oom = true;
}

void pgd_sbuf_appendf(pgd_sbuf *b, const char *fmt, ...) {
    char small[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof small) {
        pgd_sbuf_append(b, small, (size_t)n);
        return;
    }
    char *big = malloc((size_t)n + 1);
    if (!big) {
        b->oom = true;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    pgd_sbuf_append(b, big, (size_t)n);
    free(big);
}

void pgd_sbuf_sse_event(pgd_sbuf *b, const char *name, const cJSON *obj) {
    char *js = cJSON_PrintUnformatted(obj);
    if (!js) {
        b->oom = true;
        return;
    }
    pgd_sbuf_appendf(b, "event: %s\ndata: ", name);
    pgd_sbuf_append(b, js, strlen(js));
    pgd_sbuf_append(b, "\n\n", 2);
    free(js);
}

void pgd_sbuf_free(pgd_sbuf *b) {
    free(b->data);
    *b = (pgd_sbuf){0};
}
