/* The NCCL communicator: one process, one thread per GPU, one NCCL communicator per rank (made
 * by ncclCommInitAll). The all-reduce is NCCL's, on the rank's own stream in order with its ops;
 * the gather of the LM head's vocab slices copies each rank's block straight into rank 0's host
 * logits and meets at pthread barriers, as the in-process one does (comm.c). */
#include <nccl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_check.h"
#include "comm/comm.h"

typedef struct nccl_impl {
    ncclComm_t *comms;          /* (n_ranks): rank r's communicator, on rank r's device */
    pgd_backend **be;           /* (n_ranks) borrowed: each rank's instance, for its stream */
    pthread_barrier_t bar;
    bool bar_ok;
    float *full;                /* rank 0's host output of the current gather_cols */
    int *failed;                /* (n_ranks): each rank's status in the current gather_cols */
} nccl_impl;

static int nccl_barrier(pgd_comm *c, int rank) {
    nccl_impl *p = c->impl;
    (void)rank;
    pthread_barrier_wait(&p->bar);
    return PGD_OK;
}

/* Enqueues the sum on the rank's stream and returns; the stream orders it after the ops that
 * wrote buf and before those that read it. The stream is read now, not at create: a backend
 * instance owns it from its init on. */
static int nccl_all_reduce_sum(pgd_comm *c, int rank, float *buf, size_t n) {
    nccl_impl *p = c->impl;
    if (rank < 0 || rank >= c->n_ranks) return PGD_EINVAL;
    pgd_backend *be = p->be[rank];
    cudaStream_t s = (cudaStream_t)pgd_cuda_stream(be);
    if (!s) return PGD_EINVAL; /* the rank's backend is not initialised */
    CUDA_CHECK_OR(cudaSetDevice(be->device), return PGD_EIO);
    NCCL_CHECK_OR(ncclAllReduce(buf, buf, n, ncclFloat, ncclSum, p->comms[rank], s),
                  return PGD_EIO);
    return PGD_OK;
}

/* local is device memory of the rank (rows, cols_local); rank 0's full is host memory (rows,
 * full_cols). Every rank copies its block into full at column col_off and waits for the copy;
 * the second barrier makes rank 0 return only when every block is in. Every rank reaches both
 * barriers whatever fails, and all return the same status. */
static int nccl_gather_cols(pgd_comm *c, int rank, const float *local, int rows, int cols_local,
                            int col_off, float *full, int full_cols) {
    nccl_impl *p = c->impl;
    /* Rank 0 writes p->full only here: the others read it between this call's two barriers,
     * so they are done with the previous value before rank 0 can pass the next first one. */
    if (rank == 0) p->full = full;
    pthread_barrier_wait(&p->bar);
    int rc = PGD_OK;
    pgd_backend *be = p->be[rank];
    cudaStream_t s = (cudaStream_t)pgd_cuda_stream(be);
    if (!p->full || !s || rows < 0 || cols_local < 0 || col_off < 0 ||
        col_off + cols_local > full_cols) {
        rc = PGD_EINVAL;
    } else if (rows > 0 && cols_local > 0) {
        size_t width = (size_t)cols_local * sizeof(float);
        CUDA_CHECK_OR(cudaSetDevice(be->device), rc = PGD_EIO);
        if (!rc)
            CUDA_CHECK_OR(cudaMemcpy2DAsync(p->full + col_off, (size_t)full_cols * sizeof(float),
                                            local, width, width, (size_t)rows,
                                            cudaMemcpyDeviceToHost, s),
                          rc = PGD_EIO);
        /* Waited even after a failed enqueue: the stream may hold earlier work. */
        CUDA_CHECK_OR(cudaStreamSynchronize(s), rc = PGD_EIO);
    }
    p->failed[rank] = rc;
    pthread_barrier_wait(&p->bar);
    /* A rank's slot is rewritten only after the next first barrier, which this rank has not
     * reached yet: reading every slot here is race-free. */
    for (int r = 0; r < c->n_ranks && !rc; r++) rc = p->failed[r];
    return rc;
}

static void nccl_free(pgd_comm *c) {
    if (!c) return;
    nccl_impl *p = c->impl;
    if (p) {
        /* Each destroy is local until the last one, which finalises the whole clique (NCCL
         * runs the intra-process barrier on its own threads), so one thread may destroy all. */
        for (int r = 0; p->comms && r < c->n_ranks; r++)
            if (p->comms[r]) NCCL_CHECK_OR(ncclCommDestroy(p->comms[r]), (void)0);
        if (p->bar_ok) pthread_barrier_destroy(&p->bar);
        free(p->comms);
        free(p->be);
        free(p->failed);
        free(p);
    }
    free(c);
}

static const pgd_comm_ops nccl_ops = {
    .all_reduce_sum = nccl_all_reduce_sum,
    .gather_cols = nccl_gather_cols,
    .barrier = nccl_barrier,
    .free = nccl_free,
};

int pgd_comm_nccl_create(int n_ranks, pgd_backend *const *rank_backends, pgd_comm **out,
                         pgd_err *err) {
    *out = NULL;
    if (n_ranks < 1 || !rank_backends)
        return pgd_err_set(err, PGD_EINVAL, "NCCL communicator: %d ranks", n_ranks);
    for (int r = 0; r < n_ranks; r++) {
        if (!rank_backends[r])
            return pgd_err_set(err, PGD_EINVAL, "NCCL communicator: no backend for rank %d", r);
        /* NCCL hangs when one device holds two ranks of a communicator. */
        for (int q = 0; q < r; q++)
            if (rank_backends[q]->device == rank_backends[r]->device)
                return pgd_err_set(err, PGD_EINVAL, "NCCL communicator: ranks %d and %d are "
                                   "both on GPU %d", q, r, rank_backends[r]->device);
    }
    pgd_comm *c = calloc(1, sizeof *c);
    nccl_impl *p = calloc(1, sizeof *p);
    if (!c || !p) {
        free(c);
        free(p);
        return pgd_err_set(err, PGD_ENOMEM, "NCCL communicator: out of memory");
    }
    c->ops = &nccl_ops;
    c->n_ranks = n_ranks;
    c->impl = p;
    int rc = PGD_OK;
    int *devs = calloc((size_t)n_ranks, sizeof *devs);
    p->comms = calloc((size_t)n_ranks, sizeof *p->comms);
    p->be = calloc((size_t)n_ranks, sizeof *p->be);
    p->failed = calloc((size_t)n_ranks, sizeof *p->failed);
    if (!devs || !p->comms || !p->be || !p->failed) {
        rc = pgd_err_set(err, PGD_ENOMEM, "NCCL communicator: out of memory");
        goto fail;
    }
    if (pthread_barrier_init(&p->bar, NULL, (unsigned)n_ranks)) {
        rc = pgd_err_set(err, PGD_ENOMEM, "NCCL communicator: cannot create a barrier");
        goto fail;
    }
    p->bar_ok = true;
    for (int r = 0; r < n_ranks; r++) {
        p->be[r] = rank_backends[r];
        devs[r] = rank_backends[r]->device;
    }
    NCCL_CHECK_OR(ncclCommInitAll(p->comms, n_ranks, devs), rc = PGD_EIO);
    if (rc) {
        /* A clique that failed to come up is aborted, not destroyed: a destroy would wait
         * at NCCL's intra-process barrier for peers that may never get there. */
        for (int r = 0; r < n_ranks; r++)
            if (p->comms[r]) NCCL_CHECK_OR(ncclCommAbort(p->comms[r]), (void)0);
        for (int r = 0; r < n_ranks; r++) p->comms[r] = NULL;
        rc = pgd_err_set(err, PGD_EIO, "NCCL communicator: cannot set up %d GPUs (see above)",
                         n_ranks);
        goto fail;
    }
    free(devs);
    *out = c;
    return PGD_OK;
fail:
    nccl_free(c);
    free(devs);
    return rc;
}
