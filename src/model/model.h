/* A loaded model: configuration, weights (borrowed from the file mappings or owned when
 * converted), tokenizer, and the single-sequence forward pass of the Llama/Qwen2 family. */
#ifndef PGD_MODEL_H
#define PGD_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/cpu/matmul.h"
#include "model/gguf.h"
#include "model/safetensors.h"
#include "tokenizer/tokenizer.h"
#include "util/status.h"

typedef enum { PGD_ARCH_LLAMA, PGD_ARCH_QWEN2 } pgd_arch;
/* NORM rotates adjacent pairs (x[2i], x[2i+1]) as llama.cpp does for GGUF llama files, whose
 * Q/K rows were permuted by the converter; NEOX rotates (x[i], x[i + d/2]) as transformers does. */
typedef enum { PGD_ROPE_NORM, PGD_ROPE_NEOX } pgd_rope_mode;

typedef struct pgd_model_config {
    pgd_arch arch;
    int32_t n_vocab, dim, n_layer, n_head, n_kv_head, head_dim, ffn_dim, n_ctx;
    float rms_eps, rope_theta;
    pgd_rope_mode rope_mode;
    float *rope_freq_factors; /* (head_dim / 2) or NULL; owned; divides each frequency */
} pgd_model_config;


typedef struct pgd_layer {
    const float *attn_norm;           /* (dim) */
    pgd_weight wq;                    /* (n_head * head_dim, dim) */
    pgd_weight wk, wv;                /* (n_kv_head * head_dim, dim) */
    const float *bq, *bk, *bv;        /* (n_head*head_dim), (n_kv_head*head_dim) x2, or NULL */
    pgd_weight wo;                    /* (dim, n_head * head_dim) */
    const float *ffn_norm;            /* (dim) */
    pgd_weight w_gate, w_up;          /* (ffn_dim, dim) */
    pgd_weight w_down;                /* (dim, ffn_dim) */
} pgd_layer;

typedef struct pgd_pool pgd_pool;

typedef struct pgd_model {
    char *path;                       /* owned copy of the path given to pgd_model_load */
    pgd_model_config cfg;
    pgd_weight tok_embd;              /* (n_vocab, dim) */
    pgd_weight output;                /* (n_vocab, dim); equals tok_embd when tied */
    const float *output_norm;         /* (dim) */
    pgd_layer *layers;                /* (n_layer) */
    pgd_tokenizer *tok;
    /* storage */
    pgd_gguf gguf;
    pgd_safetensors st;
    void **owned;                     /* buffers converted at load time, freed with the model */
    size_t n_owned, cap_owned;
} pgd_model;

typedef struct pgd_model_opts {
    bool weights_f32;  /* dequantize every weight to F32 at load (reference path) */
    int32_t n_ctx;     /* 0: the model's own context length */
} pgd_model_opts;

/* Loads a GGUF file or a Hugging Face model directory (detected). On failure err holds one line
 * naming the file and the problem. */
int pgd_model_load(const char *path, const pgd_model_opts *opts, pgd_model **out, pgd_err *err);
void pgd_model_free(pgd_model *m);

/* Per-sequence state for the unbatched forward pass: a contiguous KV cache and scratch buffers
 * sized once at creation for up to max_batch tokens per call (no allocation per step). */
typedef struct pgd_session {
    const pgd_model *model;  /* borrowed */
    pgd_pool *pool;          /* borrowed */
    int32_t n_ctx, max_batch, n_past;
    float *k_cache, *v_cache;/* (n_layer, n_ctx, n_kv_head * head_dim) */
    float *x, *xb, *xb2;     /* (max_batch, dim) */
    float *q;                /* (max_batch, n_head * head_dim) */
    float *k, *v;            /* (max_batch, n_kv_head * head_dim) */
    float *att;              /* (max_batch, n_head, n_ctx) */
    float *hb, *hb2;         /* (max_batch, ffn_dim) */
    void *act;               /* quantized activations, (max_batch) rows of the widest format */
    size_t act_row_bytes;
    float *logits;           /* (max_batch, n_vocab) */
    float *rope_cos, *rope_sin; /* (max_batch, head_dim / 2) for the current call */
} pgd_session;

int pgd_session_init(pgd_session *s, const pgd_model *m, pgd_pool *pool, int32_t max_batch,
                     pgd_err *err);
void pgd_session_free(pgd_session *s);

/* Runs n tokens (n <= max_batch) at positions n_past.. and advances n_past. Writes logits for
 * every token into s->logits (row i for token i) when all_logits, else only row 0 holds the
 * last token's logits. Returns PGD_ERANGE when the context would overflow. */
int pgd_session_forward(pgd_session *s, const int32_t *tokens, int32_t n, bool all_logits);

#endif
