/* A fixed thread pool created once: pgd_pool_run executes fn(ctx, ith, nth) on every thread
 * (the caller is thread 0) and returns when all have finished; pgd_pool_run_chunks shares
 * chunks of work dynamically. No allocation per run. */
#ifndef PGD_BACKEND_CPU_POOL_H
#define PGD_BACKEND_CPU_POOL_H

#include "util/status.h"

typedef struct pgd_pool pgd_pool;
typedef void (*pgd_pool_fn)(void *ctx, int ith, int nth);

int pgd_pool_create(int n_threads, pgd_pool **out, pgd_err *err);
void pgd_pool_run(pgd_pool *p, pgd_pool_fn fn, void *ctx);
/* Calls fn(ctx, chunk, ith) once for every chunk in [0, n_chunks), on whichever threads are
 * free (the caller included), and returns when all have finished. Results must not depend on
 * which thread runs a chunk. ctx is borrowed for the duration of the call. */
typedef void (*pgd_pool_chunk_fn)(void *ctx, long chunk, int ith);
void pgd_pool_run_chunks(pgd_pool *p, pgd_pool_chunk_fn fn, void *ctx, long n_chunks);
int pgd_pool_n_threads(const pgd_pool *p);
void pgd_pool_free(pgd_pool *p);

/* Splits [0, n) into nth near-equal contiguous ranges; writes thread ith's range. */
static inline void pgd_split_range(long n, int ith, int nth, long *lo, long *hi) {
    long per = n / nth, rem = n % nth;
    *lo = ith * per + (ith < rem ? ith : rem);
    *hi = *lo + per + (ith < rem ? 1 : 0);
}

#endif
