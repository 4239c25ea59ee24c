/* Launchers of the CUDA kernels (kernels/pagoda.cu), callable from C. All run on `stream`;
 * pointers are device memory; `type` values are pgd_type (ggml numbering). Each returns the
 * launch status (cudaError_t as int). */
#ifndef PGD_KERNELS_H
#define PGD_KERNELS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct CUstream_st *pgd_stream;

/* Paged attention geometry for one step. */
typedef struct pgd_k_attn {
    const float *q;            /* (n_tokens, n_head, hd) */
    float *out;                /* (n_tokens, n_head, hd) */
    const void *k, *v;         /* (slots, kv_dim) of kv_dtype */
    int kv_dtype, kv_dim, block_size;
    const int32_t *pos, *seq;  /* (n_tokens) */
    const int32_t *tables;     /* (n_seqs, table_stride) */
    int table_stride;
    int n_tokens, n_head, n_kv_head, hd;
    int n_splits, split_len;   /* flash-decoding: positions per split */
    float *part;               /* (n_tokens, n_head, n_splits, hd + 2) scratch */
} pgd_k_attn;

int pgd_k_embed(pgd_stream s, int type, const void *w, size_t row_bytes, int64_t n_rows_w,
                int32_t vocab_lo, const int32_t *tokens, int n, int dim, float *x);
int pgd_k_rms_norm(pgd_stream s, float *x, const float *d, const float *w, float *out, int n_rows,
                   int dim, float eps);
/* Fused dequantize-GEMV for small n (<= 8 per launch): y (n, n_out) = x (n, n_in) . W^T. */
int pgd_k_gemv(pgd_stream s, int type, const void *w, size_t row_bytes, int64_t n_in,
               int64_t n_out, const float *x, float *y, int n);
/* Dequantizes W (n_out rows) to BF16 (n_out, n_in). */
int pgd_k_dequant_bf16(pgd_stream s, int type, const void *w, size_t row_bytes, int64_t n_in,
                       int64_t n_out, uint16_t *dst);
int pgd_k_f32_to_bf16(pgd_stream s, const float *x, uint16_t *dst, size_t n);
int pgd_k_add_bias(pgd_stream s, float *y, const float *b, int n_rows, int dim);
int pgd_k_rope(pgd_stream s, float *x, int n_rows, int n_heads, int hd, int neox,
               const int32_t *pos, const float *inv_freq);
int pgd_k_kv_store(pgd_stream s, int dtype, void *k, void *v, int kv_dim, const float *kin,
                   const float *vin, const int64_t *slot, int n);
int pgd_k_attention(pgd_stream s, const pgd_k_attn *a);
int pgd_k_silu_gate(pgd_stream s, float *g, const float *u, size_t n);
int pgd_k_add(pgd_stream s, float *x, const float *y, size_t n);
int pgd_k_gather_rows(pgd_stream s, const float *src, float *dst, int dim, const int32_t *rows,
                      int n);
/* dst[i] = src[i] over n 16-byte words: the HBM bandwidth probe. */
int pgd_k_copy(pgd_stream s, const void *src, void *dst, size_t n_words16);

#ifdef __cplusplus
}
#endif
#endif
