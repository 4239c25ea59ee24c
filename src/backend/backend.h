/* The backend ops table: every computation of the forward pass, implemented once per backend
 * (CPU: src/backend/cpu/cpu_backend.c, the reference; CUDA: src/backend/cuda/). forward.c is
 * written against this table only. Buffers passed to ops are backend memory (host memory for the
 * CPU, device memory for CUDA) obtained from ops->alloc; batch metadata stays on the host and is
 * staged once per step by ops->begin. */
#ifndef PGD_BACKEND_H
#define PGD_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/types.h"
#include "util/status.h"

/* Defined in backend/cpu/pool.h and sample/device_sample.h; the ops table passes them by pointer
 * only, so this header includes nothing of backend/cpu/, model/ or sample/. */
typedef struct pgd_pool pgd_pool;
typedef struct pgd_sample_row pgd_sample_row;

typedef enum {
    PGD_OP_EMBED,        /* embedding gather (a vocab range of the table; other rows -> 0) */
    PGD_OP_RMS_NORM,     /* out = w * x / rms(x) */
    PGD_OP_ADD_RMS_NORM, /* x += d; out = w * x / rms(x)  (residual add fused) */
    PGD_OP_MATMUL,       /* y = x . W^T, W possibly quantized */
    PGD_OP_ADD_BIAS,     /* y[t] += b */
    PGD_OP_QK_NORM,      /* RMSNorm of every Q and K head, in place (Qwen3) */
    PGD_OP_ROPE,         /* NORM or NEOX, per-token positions, frequency factors */
    PGD_OP_KV_STORE,     /* K/V rows into their paged slots */
    PGD_OP_ROPE_KV_STORE,/* RoPE on Q in place, RoPE on K fused into the K/V store */
    PGD_OP_ATTENTION,    /* paged attention over block tables, prefill chunks + decodes */
    PGD_OP_SILU_GATE,    /* g = silu(g) * u */
    PGD_OP_ADD,          /* x += y */
    PGD_OP_GATHER_ROWS,  /* dst[i] = src[rows[i]] */
    PGD_OP_COPY_BLOCK,   /* KV block copy (copy-on-write) */
    PGD_OP_MOE,          /* mixture-of-experts FFN: routing, the chosen experts, their sum */
    PGD_OP_WINDOW,       /* attention over a sliding window (pgd_kv_layer.window) */
    PGD_OP_GELU_GATE,    /* g = gelu_tanh(g) * u (Gemma) */
    PGD_OP_SCALE,        /* x *= c */
    PGD_OP_LOCAL_ROPE,   /* a second set of RoPE frequencies (pgd_rope_params.inv_freq_local) */
    PGD_OP_SOFTCAP,      /* x = c tanh(x / c): the softcap op, attention's pgd_kv_layer.softcap */
    PGD_OP_ATTN_SCALE,   /* attention scores scaled by pgd_kv_layer.scale */
    PGD_OP_LORA,         /* y[t] += scale * B (A x[t]) with row t's adapter (LoRA) */
    PGD_OP_MLA,          /* multi-head latent attention's ops (mla_q, mla_kv, mla_o; DeepSeek) */
    PGD_OP_COUNT
} pgd_op;

typedef enum { PGD_DEVICE_CPU, PGD_DEVICE_CUDA } pgd_device;

/* One step's batch as ops see it: host arrays (borrowed for the step). */
typedef struct pgd_step {
    int32_t n_tokens;
    const int32_t *tokens, *pos, *seq; /* (n_tokens) */
    const int64_t *slot;               /* (n_tokens) */
    const int32_t *const *block_tables;/* (n_seqs) */
    int32_t n_logits;
    const int32_t *logit_rows;         /* (n_logits) */
    /* CUDA graphs. pad_tokens > 0: every token needs logits (n_logits == n_tokens) and the
     * caller's buffers hold pad_tokens rows, so a backend may run the step as pad_tokens rows
     * (padding: token 0 at position 0 of sequence 0, its K/V not stored, logits of row 0) to
     * replay one captured graph per padded size. 0: run the step as it is. */
    int32_t pad_tokens;
    int32_t block_size;                /* of the KV storage the step's layers use */
    uint64_t kv_key;                   /* identifies that storage (its addresses and size) */
} pgd_step;

/* Paged K/V storage of one layer as ops see it (backend memory). */
typedef struct pgd_kv_layer {
    pgd_type dtype;      /* K's element type: F32, F16, BF16, or (CPU) Q8_0 or Q4_0 */
    pgd_type vtype;      /* V's (llama.cpp's -ctk / -ctv choose them apart) */
    void *k, *v;         /* (n_slots) rows of kv_dim elements of dtype / vtype, each
                            pgd_type_row_bytes(type, kv_dim) long: a quantized row is its
                            heads' blocks in order (head_dim a multiple of the block); v == k
                            (and vtype == dtype) for a latent cache, whose rows are both:
                            stores and copies then write them once */
    int32_t block_size;
    int32_t kv_dim;      /* row width of the storage (n_kv_head * head_dim of this rank) */
    /* Attention only: a token at position pos attends to positions p > pos - window (a
     * sliding-window layer; supports(PGD_OP_WINDOW) says whether the backend can), 0: to all.
     * Scores are q.k times scale (0: 1/sqrt(head_dim)), then softcap * tanh(score / softcap)
     * when softcap > 0 (Gemma 2; supports(PGD_OP_SOFTCAP)). */
    int32_t window;
    float scale, softcap;
} pgd_kv_layer;

typedef struct pgd_rope_params {
    int mode;              /* 0: NORM (adjacent pairs), 1: NEOX (halves) = pgd_rope_mode */
    int32_t head_dim;
    const float *inv_freq; /* host (head_dim / 2): 1 / (theta^(2i/d) * freq_factor[i]) */
    /* host (head_dim / 2) or NULL: a second set (Gemma 3's sliding-window layers), staged by
     * begin beside the first; rope ops rotate by it when `local` is set. */
    const float *inv_freq_local;
    bool local;
} pgd_rope_params;

/* One mixture-of-experts FFN layer as the moe op sees it (Mixtral, Qwen2-MoE, Qwen3-MoE). */
typedef struct pgd_moe {
    int32_t n_expert, n_used;    /* experts, and how many of them each token runs */
    int32_t ffn_dim;             /* FFN columns of each expert (this rank's) */
    bool norm;                   /* the chosen experts' probabilities rescaled to sum to 1 */
    const pgd_weight *gate, *up; /* (n_expert) matrices of (ffn_dim, dim) */
    const pgd_weight *down;      /* (n_expert) matrices of (dim, ffn_dim) */
    /* Qwen2-MoE's shared expert, which every token runs, scaled by sigmoid(shared_inp . x)
     * (DeepSeek's: shared_inp NULL, not scaled); NULL gates: none. */
    int32_t shared_ffn_dim;      /* its FFN columns (this rank's) */
    const pgd_weight *shared_gate, *shared_up, *shared_down, *shared_inp; /* inp: (1, dim) */
    /* DeepSeek's routing (all zero elsewhere): scores sigmoid(router) instead of the softmax;
     * the choice by score + bias[i] (bias NULL: the score), only among the experts of the
     * topk_group groups (n_group equal runs of experts; 0: no groups) whose best score (sigmoid:
     * sum of the best two) is highest; the chosen scores (rescaled when norm) times scale
     * (0: 1) weight them. */
    bool sigmoid;
    const float *bias;           /* (n_expert) or NULL */
    int32_t n_group, topk_group;
    float scale;
} pgd_moe;

/* Floats of scratch the moe op takes for n_rows rows of dim elements (backend memory). */
static inline size_t pgd_moe_work_floats(int32_t n_rows, int32_t dim, const pgd_moe *e) {
    size_t f = (size_t)(e->ffn_dim > e->shared_ffn_dim ? e->ffn_dim : e->shared_ffn_dim);
    return (size_t)n_rows * (2 * (size_t)dim + 2 * f + 4 * (size_t)e->n_used + 1) +
           4 * (size_t)e->n_expert + (size_t)e->n_group + 17;
}

/* One LoRA adapter's delta on one matrix, on one rank's slice of it, as the lora op sees it
 * (src/model/lora.h): y += scale * B (A x). NULL a: the adapter leaves the matrix alone. */
typedef struct pgd_lora_mat {
    const void *a;   /* A: (rank) rows, lda elements apart; the rank's first input column */
    const void *bt;  /* B transposed: (rank) rows, ldb elements apart; the rank's first output */
    pgd_type type;   /* of A's and B's elements: F32, F16 or BF16 */
    int32_t rank, lda, ldb;
    float scale;
} pgd_lora_mat;

typedef struct pgd_backend pgd_backend;

/* Every entry may assume supports() said yes for its op and weight type. Ops are enqueued in
 * order; results are visible to later ops and, after ops->sync, to download. */
typedef struct pgd_backend_ops {
    const char *name;
    bool host_memory; /* buffers are plain host memory (no upload/download needed) */
    bool (*supports)(pgd_op op, pgd_type type);
    /* Per-instance state: scratch sized for max_tokens rows of act_row_bytes activations,
     * n_head/n_kv_head heads of head_dim for attention. Called once; free releases it. */
    int (*init)(pgd_backend *be, int32_t max_tokens, size_t act_row_bytes, int32_t n_head,
                int32_t n_kv_head, int32_t head_dim, pgd_err *err);
    void (*free)(pgd_backend *be);
    /* Memory: alloc returns zeroed backend memory or NULL. */
    void *(*alloc)(pgd_backend *be, size_t bytes);
    void (*mem_free)(pgd_backend *be, void *p);
    int (*upload)(pgd_backend *be, void *dst, const void *src, size_t bytes);
    int (*download)(pgd_backend *be, void *dst, const void *src, size_t bytes);
    int (*sync)(pgd_backend *be);
    /* Stages a step's metadata (positions, slots, block tables, RoPE angles). */
    int (*begin)(pgd_backend *be, const pgd_step *s, const pgd_rope_params *rp);

    void (*embed)(pgd_backend *be, const pgd_weight *w, int32_t vocab_lo, const pgd_step *s,
                  float *x);
    /* out = w * x / rms(x) per row (add_rms_norm first adds d into x); out overlaps neither x
     * nor d (the CUDA kernel declares them restrict). */
    void (*rms_norm)(pgd_backend *be, const float *x, const float *w, float *out, int n_rows,
                     int dim, float eps);
    void (*add_rms_norm)(pgd_backend *be, float *x, const float *d, const float *w, float *out,
                         int n_rows, int dim, float eps);
    void (*matmul)(pgd_backend *be, const pgd_weight *w, const float *x, float *y, int n_rows);
    void (*add_bias)(pgd_backend *be, float *y, const float *b, int n_rows, int dim);
    /* Qwen3's QK-norm: every head_dim slice of q (n_rows, n_head * head_dim) and of k (n_rows,
     * n_kv_head * head_dim) becomes wq (resp. wk) * x / rms(x), in place. */
    void (*qk_norm)(pgd_backend *be, float *q, float *k, const float *wq, const float *wk,
                    int n_rows, int n_head, int n_kv_head, int head_dim, float eps);
    void (*rope)(pgd_backend *be, float *x, int n_rows, int n_heads, const pgd_rope_params *rp);
    void (*kv_store)(pgd_backend *be, const pgd_kv_layer *kv, const float *k, const float *v,
                     const pgd_step *s);
    /* rope(q, n_head heads), then K roped (k itself need not change) and stored with V as
     * kv_store does: one pass over the step's Q/K/V instead of three. */
    void (*rope_kv_store)(pgd_backend *be, float *q, float *k, const float *v, int n_head,
                          int n_kv_head, const pgd_kv_layer *kv, const pgd_step *s,
                          const pgd_rope_params *rp);
    /* out (n_tokens, n_head * hd) = softmax(q k^T / sqrt(hd)) v for each token over positions
     * 0..pos of its sequence (pos - kv->window + 1..pos with a window); query head h reads KV
     * head h / (n_head / n_kv_head). */
    void (*attention)(pgd_backend *be, const float *q, const pgd_kv_layer *kv, float *out,
                      int n_head, int n_kv_head, int head_dim, const pgd_step *s);
    void (*silu_gate)(pgd_backend *be, float *g, const float *u, size_t n);
    /* g = gelu(g) * u with transformers' gelu_pytorch_tanh; NULL where supports() says no. */
    void (*gelu_gate)(pgd_backend *be, float *g, const float *u, size_t n);
    /* x *= c; NULL where supports() says no. */
    void (*scale)(pgd_backend *be, float *x, float c, size_t n);
    /* x = c * tanh(x / c) (Gemma 2's final logits); NULL where supports() says no. */
    void (*softcap)(pgd_backend *be, float *x, float c, size_t n);
    /* Mixture of experts: row t of x (n_rows, dim) runs the e->n_used experts whose
     * softmax(router[t]) (router: (n_rows, n_expert) logits) is largest, ties to the lower
     * index, each weighted by that probability (rescaled when e->norm); out[t] = the sum, over
     * the chosen experts in increasing index, of p * down(silu(gate x) * up x), plus, with a
     * shared expert, sigmoid(shared_inp . x) times its own down(silu(gate x) * up x). work holds
     * pgd_moe_work_floats(n_rows, dim, e) floats. NULL where supports(PGD_OP_MOE) says no. */
    void (*moe)(pgd_backend *be, const pgd_moe *e, const float *x, const float *router,
                float *out, float *work, int n_rows, int dim);
    void (*add)(pgd_backend *be, float *x, const float *y, size_t n);
    /* Multi-head latent attention (supports(PGD_OP_MLA); NULL where not), r = kv_lora_rank:
     * mla_q: row t of qf (n_rows, n_head * (nope + rope)) becomes, per head h, the absorbed
     * query q[t, h] = (w_uk_t[h] (r, nope) . q_nope, rope(q_rope) * rope_attn^2) in q (n_rows,
     * n_head * (r + rope)); mla_kv: rows of kv (n_rows, r + rope) get their first r normalized
     * by norm_w (eps) and their last rope rotated, in place, then stored as K (the latent is V
     * too: kv->v == kv->k); mla_o: out[t, h] (v of n_rows, n_head * v) = w_uv[h] (v, r) . the
     * first r of o[t, h] (o: n_rows, n_head * (r + rope)). Each row alone, in a fixed order. */
    void (*mla_q)(pgd_backend *be, const float *w_uk_t, const float *qf, float *q, int n_rows,
                  int n_head, int nope, int rope, int r, float rope_attn,
                  const pgd_rope_params *rp);
    void (*mla_kv)(pgd_backend *be, float *kv_rows, const float *norm_w, float eps, int n_rows,
                   int r, int rope, const pgd_kv_layer *kv, const pgd_step *s,
                   const pgd_rope_params *rp);
    void (*mla_o)(pgd_backend *be, const float *w_uv, const float *o, float *out, int n_rows,
                  int n_head, int r, int rope, int v);
    /* LoRA: for every row t of x (n_rows, n_in) with adapter[t] = k > 0 (host) and mats[k - 1].a
     * set, y[t] (of n_out) += scale * B (A x[t]) of mats[k - 1]; other rows are left alone. work
     * holds n_rows * max_rank floats (max_rank: the largest mats[].rank). Each row's result depends
     * on that row only, in a fixed order (batch invariance). NULL where supports() says no. */
    void (*lora)(pgd_backend *be, const pgd_lora_mat *mats, const int32_t *adapter,
                 const float *x, float *y, float *work, int n_rows, int n_in, int n_out,
                 int max_rank);
    /* dst (n, dim) = src rows s->logit_rows[0..n) */
    void (*gather_rows)(pgd_backend *be, const float *src, float *dst, int dim, const pgd_step *s);
    /* Copies the first n slots of block src to block dst of one layer's K and V. */
    void (*copy_block)(pgd_backend *be, const pgd_kv_layer *kv, int32_t src, int32_t dst,
                       int32_t n);
    /* Device memory of be->device (no init needed): bytes free now and in total, counting every
     * process's allocations. NULL for host-memory backends, whose KV pool has a fixed budget. */
    int (*mem_info)(pgd_backend *be, size_t *free_bytes, size_t *total_bytes);
    /* Samples a token from each row of logits (n_rows, n_vocab; backend memory, valid after the
     * ops that wrote it) with rows[i] (host) into out[i] (host), by the sort-free algorithm of
     * src/sample/device_sample.h; synchronous. Only the token ids cross to the host. */
    int (*sample)(pgd_backend *be, const float *logits, int n_rows, int n_vocab,
                  const pgd_sample_row *rows, int32_t *out);
} pgd_backend_ops;

/* A backend instance. The ops table is shared and constant; impl is the backend's own state. */
struct pgd_backend {
    const pgd_backend_ops *ops;
    int device;                /* device ordinal (CUDA), 0 for the CPU */
    pgd_pool *pool;            /* CPU: the thread pool ops run on (borrowed) */
    void *impl;                /* owned by the backend, released by ops->free */
};

extern const pgd_backend_ops pgd_cpu_backend_ops;

/* CUDA: number of visible devices (0 in a CPU-only build or without a GPU; never fails). */
int pgd_cuda_device_count(void);
/* The CUDA ops table, or NULL in a CPU-only build. */
const pgd_backend_ops *pgd_cuda_backend_ops(void);
/* CUDA ceilings for the benchmarks (a negative value in a CPU-only build or on failure): GB/s of
 * the copy kernel (bytes read + written, device to device, `iters` copies of `bytes`), and TFLOP/s
 * of cuBLASLt's BF16 GEMM (m x k weights times n x k activations, F32 out) as the GEMM path runs
 * it. */
double pgd_cuda_copy_bandwidth(int device, size_t bytes, int iters);
double pgd_cuda_gemm_tflops(int device, int m, int n, int k, int iters);
/* CUDA: the cudaStream_t an initialised CUDA instance runs its ops on (NULL otherwise); the NCCL
 * communicator enqueues its collectives there, in order with the ops. */
void *pgd_cuda_stream(const pgd_backend *be);

#endif
