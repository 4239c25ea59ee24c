/* Collective communication between the ranks of a tensor-parallel group, one thread per rank.
 * The in-process communicator (comm.c) works on host memory for the CPU backend; the NCCL one
 * (src/backend/cuda/nccl_comm.c) on device memory. Every rank calls each collective in the same
 * order; a call returns when the result is in place on that rank, or, for NCCL's all-reduce,
 * ordered on that rank's stream before the rank's next ops. */
#ifndef PGD_COMM_H
#define PGD_COMM_H

#include <stddef.h>

#include "util/status.h"

typedef struct pgd_comm pgd_comm;

typedef struct pgd_comm_ops {
    /* buf (n floats) = the sum of every rank's buf; the result is bitwise the same on every
     * rank. In-process: added in rank order 0, 1, ..., n_ranks-1 for every element, so it is
     * also the same on every run and for every n. NCCL: the order follows the algorithm NCCL
     * picks (ring, tree, NVLS; by n and topology), so it may change with n (with the batch)
     * and between runs. NCCL returns once the sum is enqueued on the rank's stream (later ops
     * on that stream see it); the in-process one when it is in buf. */
    int (*all_reduce_sum)(pgd_comm *c, int rank, float *buf, size_t n);
    /* Each rank holds (rows, cols_local) in local; rank 0's full (rows, full_cols) receives every
     * rank's block at column col_off. Other ranks' full may be NULL. In-process: local and full
     * in host memory. NCCL: local in the rank's device memory, full in host memory; rank 0
     * returns when every block is in full. */
    int (*gather_cols)(pgd_comm *c, int rank, const float *local, int rows, int cols_local,
                       int col_off, float *full, int full_cols);
    int (*barrier)(pgd_comm *c, int rank);
    void (*free)(pgd_comm *c);
} pgd_comm_ops;

struct pgd_comm {
    const pgd_comm_ops *ops;
    int n_ranks;
    void *impl;
};

/* In-process communicator for n_ranks threads; max_elems bounds one all-reduce. */
int pgd_comm_inproc_create(int n_ranks, size_t max_elems, pgd_comm **out, pgd_err *err);

struct pgd_backend;
/* NCCL communicator over n_ranks GPUs, one thread per rank (CUDA builds only; defined in
 * src/backend/cuda/nccl_comm.c). rank_backends[r] (borrowed, must outlive the communicator) is
 * rank r's CUDA instance: its device ordinal names the GPU (all distinct); its stream, read at
 * each call, carries the rank's collectives, so every instance is initialised before the first
 * collective (pgd_fwd_init creates the communicator after every rank's init). */
int pgd_comm_nccl_create(int n_ranks, struct pgd_backend *const *rank_backends, pgd_comm **out,
                         pgd_err *err);
static inline void pgd_comm_free(pgd_comm *c) {
    if (c) c->ops->free(c);
}

#endif
