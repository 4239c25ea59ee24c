/* Launcher of the sampling kernel (kernels/sample.cu), callable from C: the sort-free
 * temperature / top-k / top-p / min-p sampler of src/sample/device_sample.h, one CTA per row.
 * Returns the launch status (cudaError_t as int). */
#ifndef PGD_KERNELS_SAMPLE_H
#define PGD_KERNELS_SAMPLE_H

#include <stdint.h>

#include "kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The layout of pgd_sample_row (src/sample/device_sample.h; asserted equal in
 * src/backend/cuda/cuda_backend.c): the kernels include no header outside kernels/. */
typedef struct pgd_k_sample_row {
    float temperature; /* >= 0; 0: greedy */
    float top_p;       /* (0, 1]; 1: off */
    float min_p;       /* [0, 1]; 0: off */
    float u;           /* uniform in [0, 1): the draw */
    int32_t top_k;     /* >= 0; 0: off */
} pgd_k_sample_row;

/* out[i] = the token sampled from logits row i (n_rows, n_vocab) with rows[i]. logits, rows and
 * out are device memory. */
int pgd_k_sample(pgd_stream s, const float *logits, int n_rows, int n_vocab,
                 const pgd_k_sample_row *rows, int32_t *out);

#ifdef __cplusplus
}
#endif
#endif
