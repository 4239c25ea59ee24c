/* Launchers of the CUDA kernels (kernels/pagoda.cu), callable from C. All run on `stream`;
 * pointers are device memory; `type` values are pgd_type (ggml numbering). Each returns the
 * launch status (cudaError_t as int). */
#ifndef PGD_KERNELS_H
#define PGD_KERNELS_H

#include <stddef.h>
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
    /* flash-decoding: a token at position p spreads its p + 1 positions over its first
     * pgd_k_splits_used() splits of pgd_k_split_len() positions (the last one shorter) */
    int n_splits, split_len;
    float *part;               /* (n_list, n_head, n_splits, hd + 2) scratch */
    /* pgd_k_attention: the tokens it computes, tok_list[0 .. n_list) (device), or all n_tokens
     * when tok_list is NULL (then n_list is ignored) */
    const int32_t *tok_list;
    int n_list;
} pgd_k_attn;

#ifdef __CUDACC__
#define PGD_K_HD __host__ __device__
#else
#define PGD_K_HD
#endif
/* A token at position p spreads its p + 1 positions evenly over its first splits, at least
 * split_len positions each: len = max(split_len, ceil((p + 1) / n_splits)) positions a split,
 * in the first ceil((p + 1) / len) <= n_splits of them. So a graph step, whose split count is
 * fixed for the longest context its block tables hold, gives a shorter context all its splits
 * (fewer positions each) rather than a run of empty ones for the combine to walk.
 * (tests/unit/test_attn_splits.c) */
static inline PGD_K_HD int pgd_k_split_len(int n_splits, int split_len, int p) {
    int len = (p + n_splits) / n_splits; /* ceil((p + 1) / n_splits) */
    return len > split_len ? len : split_len;
}
static inline PGD_K_HD int pgd_k_splits_used(int len, int p) { return (p + len) / len; }

/* Launch the kernels with programmatic dependent launch (kernels/launch.cuh): only on devices
 * of compute capability 9.0 and later, and only where the kernels that run were compiled for
 * compute_90 or later (otherwise it stays off, with a line on stderr). Process-wide; set before
 * the first launch, with the device current. */
void pgd_k_set_pdl(int on);

int pgd_k_embed(pgd_stream s, int type, const void *w, size_t row_bytes, int64_t n_rows_w,
                int32_t vocab_lo, const int32_t *tokens, int n, int dim, float *x);
/* out_bf16 and g_bf16 (may be NULL): the result in BF16 as well, for the GEMM that reads it */
int pgd_k_rms_norm(pgd_stream s, float *x, const float *d, const float *w, float *out,
                   uint16_t *out_bf16, int n_rows, int dim, float eps);
/* Fused dequantize-GEMV for small n (<= 8 tokens per launch) of up to PGD_K_GEMV_GROUP matrices
 * of one type and n_in that read the same x (n, n_in): m[i].y (n, m[i].n_out) = x . m[i].W^T, in
 * one launch where the 16-bit kernel takes them (else one launch each).
 * gated: m is gate and up of one n_out; m[0].y receives silu(gate) * up (k_silu_gate's
 * formula), m[1].y up; cudaErrorNotSupported where the 16-bit kernel does not take them. */
#define PGD_K_GEMV_GROUP 4
typedef struct pgd_k_gemv_mat {
    const void *w;
    size_t row_bytes;
    int64_t n_out;
    float *y;
} pgd_k_gemv_mat;
int pgd_k_gemv_group(pgd_stream s, int type, int64_t n_in, const pgd_k_gemv_mat *m, int n_mats,
                     const float *x, int n, int gated);
/* Dequantizes W (n_out rows) to BF16 (n_out, n_in). */
int pgd_k_dequant_bf16(pgd_stream s, int type, const void *w, size_t row_bytes, int64_t n_in,
                       int64_t n_out, uint16_t *dst);
int pgd_k_f32_to_bf16(pgd_stream s, const float *x, uint16_t *dst, size_t n);
int pgd_k_add_bias(pgd_stream s, float *y, const float *b, int n_rows, int dim);
/* Qwen3's QK-norm in place: each head of q (n, n_head * hd) and k (n, n_kv_head * hd) becomes
 * w * x / rms(x), wq for q's heads and wk for k's. */
int pgd_k_qk_norm(pgd_stream s, float *q, float *k, const float *wq, const float *wk, int n,
                  int n_head, int n_kv_head, int hd, float eps);
int pgd_k_rope(pgd_stream s, float *x, int n_rows, int n_heads, int hd, int neox,
               const int32_t *pos, const float *inv_freq);
int pgd_k_kv_store(pgd_stream s, int dtype, void *k, void *v, int kv_dim, const float *kin,
                   const float *vin, const int64_t *slot, int n);
/* RoPE on q (n, n_head, hd) in place; K rows (n, n_kv_head * hd) roped into the cache (rows of
 * kv_dim elements) at their slots with the V rows (a slot < 0: a padding row, only its Q is
 * roped). */
int pgd_k_rope_kv_store(pgd_stream s, float *q, const float *k_in, const float *v_in, int n,
                        int n_head, int n_kv_head, int hd, int neox, const int32_t *pos,
                        const float *inv_freq, int dtype, void *k, void *v, int kv_dim,
                        const int64_t *slot);
int pgd_k_attention(pgd_stream s, const pgd_k_attn *a);
int pgd_k_silu_gate(pgd_stream s, float *g, const float *u, size_t n, uint16_t *g_bf16);
int pgd_k_add(pgd_stream s, float *x, const float *y, size_t n);
int pgd_k_gather_rows(pgd_stream s, const float *src, float *dst, int dim, const int32_t *rows,
                      int n);
/* dst[i] = src[i] over n 16-byte words: the HBM bandwidth probe. */
int pgd_k_copy(pgd_stream s, const void *src, void *dst, size_t n_words16);

/* Prefill attention on tensor cores (kernels/attn_prefill.cu). A query tile is a run of step
 * tokens tok0 .. tok0 + n - 1 of one sequence at consecutive positions pos[tok0] + i; each
 * query attends causally to its sequence's paged K/V at positions 0 .. its own. Writes
 * a->out rows of the tiles' tokens only; uses q, k, v, kv_dtype, kv_dim, block_size, pos, seq,
 * tables, table_stride, n_head, n_kv_head, hd of `a` (not the split fields). `tiles` is device
 * memory. head_dim must be a multiple of 16 and at most 256 (else cudaErrorInvalidValue). */
typedef struct pgd_k_qtile {
    int32_t tok0, n;
} pgd_k_qtile;
#define PGD_K_QTILE_MAX 64 /* tokens per query tile, at most */
int pgd_k_attention_prefill(pgd_stream s, const pgd_k_attn *a, const pgd_k_qtile *tiles,
                            int n_tiles);

#ifdef __cplusplus
}
#endif
#endif
