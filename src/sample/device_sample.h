/* Sampling without a sort, for rows that need only temperature, top-k, top-p and min-p: the C
 * reference of the backend op pgd_backend_ops.sample, which kernels/sample.cu mirrors step by
 * step. The kept set equals pgd_sampler_dist_compute's; each cut is a threshold on the
 * probability found by a radix select over the float bit patterns.
 *
 * The algorithm, for one row with T > 0: p_i = exp(l_i / T - max). The kept set is always
 * "p_i > p_cut, or p_i == p_cut and i <= id_cut" (a threshold on the order of the CPU chain:
 * larger probability first, lower id first among equals), starting from p_i > 0:
 *   top-k   the k-th largest p is the largest bit pattern v with count(kept, p >= v) >= k;
 *           of the tokens at v, the lowest ids fill the k.
 *   top-p   v = the largest bit pattern with mass(kept, p >= v) >= top_p * mass(kept); the
 *           fewest tokens at v, lowest ids first, that bring the mass to the target.
 *   min-p   p >= min_p * p_max, where p_max = exp(0) = 1 (the most likely token survives top-k
 *           and top-p).
 * Each radix select is four passes of 8-bit digits, most significant first, each histogramming
 * the count and mass of the kept tokens that match the digits chosen so far. The draw walks the
 * kept tokens in id order, r = u * kept mass, and takes the token where the running mass passes
 * r: the CPU draws in descending-probability order, so one u may give another token there, from
 * the same distribution. T == 0 or top_k == 1: the arg-max (pgd_argmax). */
#ifndef PGD_SAMPLE_DEVICE_SAMPLE_H
#define PGD_SAMPLE_DEVICE_SAMPLE_H

#include <stdint.h>

#include "sample/sampler.h"

/* One row's parameters. kernels/sample.h declares the same layout as pgd_k_sample_row
 * (checked in src/backend/cuda/cuda_backend.c). */
typedef struct pgd_sample_row {
    float temperature; /* >= 0; 0: greedy */
    float top_p;       /* (0, 1]; 1: off */
    float min_p;       /* [0, 1]; 0: off */
    float u;           /* uniform in [0, 1): the draw (unused when greedy) */
    int32_t top_k;     /* >= 0; 0: off */
} pgd_sample_row;

/* The token sampled from logits (n_vocab floats) under p. */
int32_t pgd_device_sample_row(const float *logits, int32_t n_vocab, const pgd_sample_row *p);

/* The kept set, for tests: out[0..n) (n_vocab entries of room) receives the kept tokens in id
 * order with their probabilities renormalised to sum to 1, as pgd_sampler_dist_compute gives
 * them; returns n. Greedy: the arg-max with probability 1. */
int32_t pgd_device_sample_kept(const float *logits, int32_t n_vocab, const pgd_sample_row *p,
                               pgd_token_prob *out);

struct pgd_pool;
/* pgd_device_sample_row for rows 0..n_rows of logits (n_rows, n_vocab) into out, over pool's
 * threads (pool may be NULL: the caller's thread). */
void pgd_device_sample_rows(struct pgd_pool *pool, const float *logits, int n_rows, int n_vocab,
                            const pgd_sample_row *rows, int32_t *out);

#endif
