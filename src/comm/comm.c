/* The in-process communicator: ranks are threads of one process sharing host memory. Each
 * collective publishes the ranks' pointers, meets at a barrier, then every rank computes its
 * share of the result reading all ranks' inputs (fixed rank order per element). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/pool.h"
#include "comm/comm.h"

#define MAX_RANKS 64

typedef struct inproc {
    pthread_barrier_t bar;
    size_t max_elems;
    float *scratch;                     /* (max_elems): the reduced values */
    float *bufs[MAX_RANKS];             /* published per collective */
    const float *local[MAX_RANKS];
    int cols[MAX_RANKS], off[MAX_RANKS];
    float *full;
} inproc;

static int barrier(pgd_comm *c, int rank) {
    inproc *p = c->impl;
    pthread_barrier_wait(&p->bar);
    return PGD_OK;
}

static int all_reduce_sum(pgd_comm *c, int rank, float *buf, size_t n) {
    inproc *p = c->impl;
    if (n > p->max_elems) return PGD_EINVAL; /* every rank sees the same n: all return */
    p->bufs[rank] = buf;
    pthread_barrier_wait(&p->bar);
    long lo, hi;
    pgd_split_range((long)n, rank, c->n_ranks, &lo, &hi);
    for (long i = lo; i < hi; i++) {
        float s = p->bufs[0][i];
        for (int r = 1; r < c->n_ranks; r++) s += p->bufs[r][i];
        p->scratch[i] = s;
    }
    pthread_barrier_wait(&p->bar);
    memcpy(buf, p->scratch, n * sizeof *buf);
    /* The next collective's first barrier keeps scratch until every rank has copied it. */
    return PGD_OK;
}

static int gather_cols(pgd_comm *c, int rank, const float *local, int rows, int cols_local,
                       int col_off, float *full, int full_cols) {
    inproc *p = c->impl;
    if (rank == 0) p->full = full;
    pthread_barrier_wait(&p->bar);
    for (int r = 0; r < rows; r++)
        memcpy(p->full + (size_t)r * full_cols + col_off, local + (size_t)r * cols_local,
               (size_t)cols_local * sizeof *local);
    pthread_barrier_wait(&p->bar);
    return PGD_OK;
}

static void inproc_free(pgd_comm *c) {
    inproc *p = c->impl;
    if (p) {
        pthread_barrier_destroy(&p->bar);
        free(p->scratch);
        free(p);
    }
    free(c);
}

static const pgd_comm_ops inproc_ops = {
    .all_reduce_sum = all_reduce_sum,
    .gather_cols = gather_cols,
    .barrier = barrier,
    .free = inproc_free,
};

int pgd_comm_inproc_create(int n_ranks, size_t max_elems, pgd_comm **out, pgd_err *err) {
    *out = NULL;
    if (n_ranks < 1 || n_ranks > MAX_RANKS)
        return pgd_err_set(err, PGD_EINVAL, "communicator: %d ranks (1..%d)", n_ranks, MAX_RANKS);
    pgd_comm *c = calloc(1, sizeof *c);
    inproc *p = calloc(1, sizeof *p);
    float *scr = calloc(max_elems ? max_elems : 1, sizeof *scr);
    if (!c || !p || !scr) {
        free(c);
        free(p);
        free(scr);
        return pgd_err_set(err, PGD_ENOMEM, "communicator: out of memory");
    }
    pthread_barrier_init(&p->bar, NULL, (unsigned)n_ranks);
    p->max_elems = max_elems;
    p->scratch = scr;
    c->ops = &inproc_ops;
    c->n_ranks = n_ranks;
    c->impl = p;
    *out = c;
    return PGD_OK;
}
