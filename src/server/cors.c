/* CORS, with Starlette's CORSMiddleware rules (what vLLM's server runs): see cors.h. */
#include "server/cors.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const char *const all_methods[] = {"DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST",
                                          "PUT"};
/* the CORS-safelisted request headers, always allowed (lowercase, sorted) */
static const char *const safelisted[] = {"accept", "accept-language", "content-language",
                                         "content-type"};

static char *trimmed_dup(const char *s, size_t n) {
    while (n && isspace((unsigned char)*s)) s++, n--;
    while (n && isspace((unsigned char)s[n - 1])) n--;
    char *d = malloc(n + 1);
    if (d) memcpy(d, s, n), d[n] = 0;
    return d;
}

/* A JSON array of strings or a comma-separated list into out; *all when it holds "*". */
static int parse_list(const char *what, const char *v, char **out, int *n, bool *all,
                      char *err, size_t errlen) {
    *n = 0;
    *all = false;
    if (!v) return 0;
    cJSON *j = v[strspn(v, " \t")] == '[' ? cJSON_Parse(v) : NULL;
    if (v[strspn(v, " \t")] == '[' && !cJSON_IsArray(j)) {
        cJSON_Delete(j);
        snprintf(err, errlen, "--%s: not a JSON array of strings: %.100s", what, v);
        return -1;
    }
    int k = 0;
    const char *p = v;
    for (;;) {
        char *item = NULL;
        if (j) {
            const cJSON *x = cJSON_GetArrayItem(j, k++);
            if (!x) break;
            if (!cJSON_IsString(x)) {
                cJSON_Delete(j);
                snprintf(err, errlen, "--%s: not a JSON array of strings: %.100s", what, v);
                return -1;
            }
            item = trimmed_dup(x->valuestring, strlen(x->valuestring));
        } else {
            if (!*p) break;
            size_t l = strcspn(p, ",");
            item = trimmed_dup(p, l);
            p += l + (p[l] == ',');
        }
        if (!item || *n >= PGD_CORS_MAX) {
            free(item);
            cJSON_Delete(j);
            snprintf(err, errlen, "--%s: at most %d entries", what, PGD_CORS_MAX);
            return -1;
        }
        if (!*item) {
            free(item);
            continue;
        }
        if (!strcmp(item, "*")) *all = true;
        out[(*n)++] = item;
    }
    cJSON_Delete(j);
    return 0;
}

int pgd_cors_init(pgd_cors *c, const char *origins, const char *methods, const char *headers,
                  bool credentials, char *err, size_t errlen) {
    memset(c, 0, sizeof *c);
    c->credentials = credentials;
    if (parse_list("allowed-origins", origins, c->origins, &c->n_origins, &c->all_origins, err,
                   errlen) ||
        parse_list("allowed-methods", methods, c->methods, &c->n_methods, &c->all_methods, err,
                   errlen) ||
        parse_list("allowed-headers", headers, c->headers, &c->n_headers, &c->all_headers, err,
                   errlen)) {
        pgd_cors_free(c);
        return -1;
    }
    for (int i = 0; i < c->n_headers; i++)
        for (char *q = c->headers[i]; *q; q++) *q = (char)tolower((unsigned char)*q);
    return 0;
}

void pgd_cors_free(pgd_cors *c) {
    for (int i = 0; i < c->n_origins; i++) free(c->origins[i]);
    for (int i = 0; i < c->n_methods; i++) free(c->methods[i]);
    for (int i = 0; i < c->n_headers; i++) free(c->headers[i]);
    memset(c, 0, sizeof *c);
}

static bool origin_allowed(const pgd_cors *c, const char *origin) {
    if (c->all_origins) return true;
    for (int i = 0; i < c->n_origins; i++)
        if (!strcmp(c->origins[i], origin)) return true;
    return false;
}

static bool method_allowed(const pgd_cors *c, const char *m) {
    size_t n = c->all_methods ? sizeof all_methods / sizeof all_methods[0] : (size_t)c->n_methods;
    for (size_t i = 0; i < n; i++)
        if (!strcmp(c->all_methods ? all_methods[i] : c->methods[i], m)) return true;
    return false;
}

static bool header_allowed(const pgd_cors *c, const char *h) {
    for (size_t i = 0; i < sizeof safelisted / sizeof safelisted[0]; i++)
        if (!strcmp(safelisted[i], h)) return true;
    for (int i = 0; i < c->n_headers; i++)
        if (!strcmp(c->headers[i], h)) return true;
    return false;
}

void pgd_cors_simple(const pgd_cors *c, const char *origin, pgd_header_fn add, void *ctx) {
    if (!origin) return; /* not a cross-origin request */
    if (!c->all_origins && origin_allowed(c, origin)) {
        add(ctx, "Access-Control-Allow-Origin", origin);
        add(ctx, "Vary", "Origin");
    } else if (c->all_origins) {
        /* Starlette echoes the origin to a request with cookies only; "*" otherwise */
        add(ctx, "Access-Control-Allow-Origin", "*");
    }
    if (c->credentials && origin_allowed(c, origin))
        add(ctx, "Access-Control-Allow-Credentials", "true");
}

bool pgd_cors_is_preflight(const char *method, const char *origin, const char *req_method) {
    return method && !strcmp(method, "OPTIONS") && origin && req_method;
}

int pgd_cors_preflight(const pgd_cors *c, const char *origin, const char *req_method,
                       const char *req_headers, pgd_header_fn add, void *ctx, char *body,
                       size_t bodylen) {
    bool explicit_origin = !c->all_origins || c->credentials;
    bool bad_origin = !origin_allowed(c, origin), bad_method = !method_allowed(c, req_method);
    bool bad_headers = false;
    if (explicit_origin) {
        if (!bad_origin) add(ctx, "Access-Control-Allow-Origin", origin);
        add(ctx, "Vary", "Origin");
    } else {
        add(ctx, "Access-Control-Allow-Origin", "*");
    }
    char methods[128] = "";
    size_t nm = c->all_methods ? sizeof all_methods / sizeof all_methods[0] : (size_t)c->n_methods;
    for (size_t i = 0; i < nm; i++) {
        size_t l = strlen(methods);
        snprintf(methods + l, sizeof methods - l, "%s%s", i ? ", " : "",
                 c->all_methods ? all_methods[i] : c->methods[i]);
    }
    add(ctx, "Access-Control-Allow-Methods", methods);
    add(ctx, "Access-Control-Max-Age", "600");
    if (c->all_headers && req_headers) {
        add(ctx, "Access-Control-Allow-Headers", req_headers);
    } else {
        if (req_headers) { /* each requested header, lowercased, must be allowed */
            const char *p = req_headers;
            while (*p && !bad_headers) {
                size_t l = strcspn(p, ",");
                char h[128];
                char *t = trimmed_dup(p, l);
                snprintf(h, sizeof h, "%s", t ? t : "");
                free(t);
                for (char *q = h; *q; q++) *q = (char)tolower((unsigned char)*q);
                if (!header_allowed(c, h)) bad_headers = true;
                p += l + (p[l] == ',');
            }
        }
        if (!c->all_headers) { /* the sorted union of the safelisted and the allowed */
            char list[1024] = "";
            const char *all[4 + PGD_CORS_MAX];
            int n = 0;
            for (size_t i = 0; i < sizeof safelisted / sizeof safelisted[0]; i++)
                all[n++] = safelisted[i];
            for (int i = 0; i < c->n_headers; i++)
                if (!header_allowed(&(pgd_cors){0}, c->headers[i])) all[n++] = c->headers[i];
            for (int i = 1; i < n; i++) /* insertion sort: a few entries */
                for (int j = i; j > 0 && strcmp(all[j - 1], all[j]) > 0; j--) {
                    const char *t = all[j];
                    all[j] = all[j - 1], all[j - 1] = t;
                }
            for (int i = 0; i < n; i++) {
                size_t l = strlen(list);
                snprintf(list + l, sizeof list - l, "%s%s", i ? ", " : "", all[i]);
            }
            add(ctx, "Access-Control-Allow-Headers", list);
        }
    }
    if (c->credentials) add(ctx, "Access-Control-Allow-Credentials", "true");
    if (!bad_origin && !bad_method && !bad_headers) {
        snprintf(body, bodylen, "OK");
        return 200;
    }
    snprintf(body, bodylen, "Disallowed CORS %s%s%s%s%s", bad_origin ? "origin" : "",
             bad_origin && (bad_method || bad_headers) ? ", " : "", bad_method ? "method" : "",
             bad_method && bad_headers ? ", " : "", bad_headers ? "headers" : "");
    return 400;
}
