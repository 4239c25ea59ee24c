/* Cross-origin resource sharing as vLLM serves it (Starlette's CORSMiddleware behind its
 * --allowed-origins, --allowed-methods, --allowed-headers and --allow-credentials, each "*" by
 * default but credentials): the headers of a simple response, and the answer to a preflight. */
#ifndef PGD_SERVER_CORS_H
#define PGD_SERVER_CORS_H

#include <stdbool.h>
#include <stddef.h>

#define PGD_CORS_MAX 32 /* entries per list */

typedef struct pgd_cors {
    bool all_origins, all_methods, all_headers, credentials;
    char *origins[PGD_CORS_MAX], *methods[PGD_CORS_MAX], *headers[PGD_CORS_MAX]; /* owned */
    int n_origins, n_methods, n_headers;
} pgd_cors;

/* Reads the three lists, each a JSON array of strings (vLLM's syntax: '["https://a.b"]') or a
 * comma-separated list ("*" allows any). 0, or -1 with a one-line reason in err. */
int pgd_cors_init(pgd_cors *c, const char *origins, const char *methods, const char *headers,
                  bool credentials, char *err, size_t errlen);
void pgd_cors_free(pgd_cors *c);

/* Receives one response header. */
typedef void (*pgd_header_fn)(void *ctx, const char *name, const char *value);

/* The headers of an answer to a request that sent Origin (origin may be NULL: none). */
void pgd_cors_simple(const pgd_cors *c, const char *origin, pgd_header_fn add, void *ctx);

/* Whether the request is a preflight: OPTIONS with Origin and Access-Control-Request-Method. */
bool pgd_cors_is_preflight(const char *method, const char *origin, const char *req_method);

/* A preflight's answer: its headers through add, its plain-text body in body, and the status
 * (200, or 400 "Disallowed CORS origin, method, headers" naming what was refused). */
int pgd_cors_preflight(const pgd_cors *c, const char *origin, const char *req_method,
                       const char *req_headers, pgd_header_fn add, void *ctx, char *body,
                       size_t bodylen);

#endif
