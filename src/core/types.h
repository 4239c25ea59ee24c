/* The element types of tensors (ggml's, with their GGUF values) and the weight descriptor: the
 * vocabulary that the loaders (model/) and the kernels (backend/) share. Below both layers, it
 * includes nothing of theirs; the block geometry table is in types.c. */
#ifndef PGD_CORE_TYPES_H
#define PGD_CORE_TYPES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ggml tensor types (values as in the GGUF file). */
typedef enum {
    PGD_TYPE_F32 = 0,
    PGD_TYPE_F16 = 1,
    PGD_TYPE_Q4_0 = 2,
    PGD_TYPE_Q4_1 = 3,
    PGD_TYPE_Q5_0 = 6,
    PGD_TYPE_Q5_1 = 7,
    PGD_TYPE_Q8_0 = 8,
    PGD_TYPE_Q8_1 = 9,
    PGD_TYPE_Q2_K = 10,
    PGD_TYPE_Q3_K = 11,
    PGD_TYPE_Q4_K = 12,
    PGD_TYPE_Q5_K = 13,
    PGD_TYPE_Q6_K = 14,
    PGD_TYPE_Q8_K = 15,
    PGD_TYPE_IQ4_NL = 20,
    PGD_TYPE_IQ4_XS = 23,
    PGD_TYPE_BF16 = 30,
    PGD_TYPE_COUNT = 40,
} pgd_type;

/* Per-type block geometry: elements per block and bytes per block (0 if unknown type). */
uint32_t pgd_type_block_elems(pgd_type t);
uint32_t pgd_type_block_bytes(pgd_type t);
const char *pgd_type_name(pgd_type t);
/* The type named name (as pgd_type_name, any case): 0, or -1 for none. */
int pgd_type_from_name(const char *name, pgd_type *out);
/* Byte offsets of a block's fp16 scale d and second fp16 m (Q4_1/Q5_1's min, the K-quants'
 * dmin), -1 where it has none (float types: both; Q8_K's scale is an F32: none). */
void pgd_type_scale_offsets(pgd_type t, int *d, int *m);
/* Bytes of a row of n elements; 0 if n is not a multiple of the block size or type unknown. */
uint64_t pgd_type_row_bytes(pgd_type t, uint64_t n);

/* Bytes of one element of a KV or activation dtype (F32, F16 or BF16). */
static inline size_t pgd_dtype_size(pgd_type t) { return t == PGD_TYPE_F32 ? 4 : 2; }

/* A 2-D weight: n_out rows of n_in elements, each row row_bytes long (row-major), unless
 * panel16: then data holds panels of 16 rows, each k-major, as pgd_cpu_pack writes them (F16:
 * element k of rows 16p..16p+15 at halves 16p * n_in + 16k + r; the block types: per panel and
 * block, the 16 rows' scale fields, then per element k the 16 rows' quants; the layouts are in
 * backend/cpu/p16_layout.h). The same bytes as row-major. */
typedef struct pgd_weight {
    pgd_type type;
    int64_t n_in, n_out;
    size_t row_bytes;
    const void *data;
    bool panel16;
} pgd_weight;

/* The most tensor-parallel ranks: a model's shards and each rank's KV storage. */
#define PGD_MAX_TP 8

#endif
