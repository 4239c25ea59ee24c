/* `pagoda` built for tests/integration/test_server_faults.py: the same command line, linked with
 * malloc, calloc, realloc, strdup and pgd_engine_submit wrapped (-Wl,--wrap), so that every
 * PGD_FAULT_EVERY-th allocation the engine makes while it takes a request fails -- the record,
 * its sampler, stop strings, constraint, detokenizer. (The engine thread allocates nothing while
 * it steps: everything a request needs is made at submit.) At exit it reports, as a JSON line on
 * stderr, how many allocations submit made and how many of them failed. Test-only. */
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pagoda/pagoda.h"

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t m);
void *__real_realloc(void *p, size_t n);
char *__real_strdup(const char *s);
int __real_pgd_engine_submit(pgd_engine *e, const pgd_request_params *p, uint64_t *id,
                             char *err, size_t errlen);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t n, size_t m);
void *__wrap_realloc(void *p, size_t n);
char *__wrap_strdup(const char *s);
int __wrap_pgd_engine_submit(pgd_engine *e, const pgd_request_params *p, uint64_t *id,
                             char *err, size_t errlen);

static _Thread_local int in_submit;
static atomic_long n_calls, n_failed;
static long every = -1;

static bool fail_now(void) {
    if (!in_submit) return false;
    if (every < 0) {
        const char *v = getenv("PGD_FAULT_EVERY");
        every = v ? atol(v) : 0;
    }
    if (every <= 0 || atomic_fetch_add(&n_calls, 1) % every != every - 1) return false;
    atomic_fetch_add(&n_failed, 1);
    return true;
}

void *__wrap_malloc(size_t n) { return fail_now() ? NULL : __real_malloc(n); }
void *__wrap_calloc(size_t n, size_t m) { return fail_now() ? NULL : __real_calloc(n, m); }
void *__wrap_realloc(void *p, size_t n) { return fail_now() ? NULL : __real_realloc(p, n); }
char *__wrap_strdup(const char *s) { return fail_now() ? NULL : __real_strdup(s); }

int __wrap_pgd_engine_submit(pgd_engine *e, const pgd_request_params *p, uint64_t *id,
                             char *err, size_t errlen) {
    in_submit++;
    int rc = __real_pgd_engine_submit(e, p, id, err, errlen);
    in_submit--;
    return rc;
}

__attribute__((destructor)) static void report(void) {
    fprintf(stderr, "{\"event\":\"faults\",\"allocations\":%ld,\"failed\":%ld}\n",
            atomic_load(&n_calls), atomic_load(&n_failed));
}
