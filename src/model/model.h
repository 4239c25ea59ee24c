/* A loaded model: configuration, weights (borrowed from the file mappings, owned when
 * converted, or - CPU, one rank - copied into one anonymous mapping, in huge pages where THP is
 * on: hp_map), tokenizer, and the single-sequence forward pass of the Llama/Qwen2 family. */
#ifndef PGD_MODEL_H
#define PGD_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "core/types.h"
#include "kv/kv_cache.h"
#include "model/gguf.h"
#include "model/safetensors.h"
#include "tokenizer/tokenizer.h"
#include "util/status.h"

/* QWEN3: Qwen2 without q/k/v biases, with RMSNorm on every Q and K head (QK-norm) before RoPE.
 * SMOLLM3: Llama with some layers that apply no rotary embedding at all (NoPE). */
/* DEEPSEEK2: DeepSeek-V2/V3 (llama.cpp's deepseek2): multi-head latent attention (cfg.kv_lora_rank)
 * and experts with shared experts and grouped routing. */
typedef enum {
    PGD_ARCH_LLAMA, PGD_ARCH_QWEN2, PGD_ARCH_QWEN3, PGD_ARCH_SMOLLM3, PGD_ARCH_GEMMA2,
    PGD_ARCH_GEMMA3, PGD_ARCH_DEEPSEEK2
} pgd_arch;
/* NORM rotates adjacent pairs (x[2i], x[2i+1]) as llama.cpp does for GGUF llama files, whose
 * Q/K rows were permuted by the converter; NEOX rotates (x[i], x[i + d/2]) as transformers does. */
typedef enum { PGD_ROPE_NORM, PGD_ROPE_NEOX } pgd_rope_mode;

typedef struct pgd_model_config {
    pgd_arch arch;
    /* Hugging Face's names for it: config.json's model_type ("llama", "qwen2_moe", ...; a GGUF's
     * general.architecture mapped to it) and the class its architectures list names first */
    char model_type[32], architecture[64];
    int32_t n_vocab, dim, n_layer, n_head, n_kv_head, head_dim, ffn_dim, n_ctx;
    float rms_eps, rope_theta;
    pgd_rope_mode rope_mode;
    float *rope_freq_factors; /* (head_dim / 2) or NULL; owned; divides each frequency */
    bool *no_rope;            /* (n_layer) or NULL; owned: the layers that apply no RoPE */
    /* (n_layer) or NULL; owned: each layer's sliding attention window (Mistral v0.1; Qwen2/Qwen3
     * with use_sliding_window): a token attends to the positions p > pos - window; 0 for a layer
     * that attends to the whole context. NULL when no layer has a window. */
    int32_t *window;
    /* Gemma 2 and 3: the embedding scaled by embed_scale (0: not scaled); GELU (tanh) instead
     * of SiLU in the FFN gate; attention scores scaled by attn_scale (0: 1/sqrt(head_dim)) and,
     * Gemma 2, soft-capped at attn_softcap, its final logits at final_softcap (0: not capped).
     * Gemma 3: the layers flagged in local_rope ((n_layer) or NULL; owned: its sliding-window
     * layers) rotated with rope_theta_local and no frequency factors. */
    float embed_scale;
    bool gelu;
    float attn_scale, attn_softcap, final_softcap;
    float rope_theta_local;
    bool *local_rope;
    int32_t bos_id;           /* config.json's bos_token_id, -1 if none: the BOS of a model
                                 loaded without a tokenizer (--load-format dummy) */
    /* Mixture of experts (Mixtral, Qwen2-MoE, Qwen3-MoE; n_expert 0: every FFN is dense): each
     * token runs n_expert_used of n_expert experts of moe_ffn_dim columns, weighted by the
     * router's softmax, rescaled to sum to 1 when moe_norm; with moe_shared (Qwen2-MoE) also a
     * shared expert of ffn_dim columns, scaled by a sigmoid gate. */
    int32_t n_expert, n_expert_used, moe_ffn_dim;
    bool moe_norm, moe_shared;
    /* Multi-head latent attention (DeepSeek-V2/V3; kv_lora_rank 0: none). Queries come through a
     * q_lora_rank bottleneck (0: one q matrix), n_head heads of qk_nope_dim + rope_dim; keys and
     * values come from one kv_lora_rank latent per token (after its own RMSNorm) and one rope_dim
     * key every head shares. The cache holds exactly that: head_dim is the cached row,
     * kv_lora_rank + rope_dim, under one KV head (n_kv_head 1), and the attention runs in the
     * latent space (forward.c). v_head_dim: each head's output before o_proj. */
    int32_t q_lora_rank, kv_lora_rank, qk_nope_dim, v_head_dim;
    int32_t rope_dim;       /* rotated dimensions of a head (0: head_dim) */
    float rope_attn;        /* YaRN's factor on the rotated dimensions of q and k (0: 1) */
    /* DeepSeek's experts: the first n_dense layers dense (ffn_dim wide), the others experts plus
     * moe_shared_dim columns of shared experts (0: none) added ungated; scores the router's
     * sigmoid (moe_sigmoid, V3) or softmax, chosen, after moe_bias (n_expert, owned-or-mapped
     * per layer: pgd_moe.bias) where given, among the experts of the moe_topk_group best of
     * moe_n_group groups (0: no groups), weighted by their scores times moe_scale (0: 1). */
    int32_t n_dense, moe_shared_dim, moe_n_group, moe_topk_group;
    bool moe_sigmoid;
    float moe_scale;
} pgd_model_config;


typedef struct pgd_layer {
    const float *attn_norm;           /* (dim) */
    pgd_weight wq;                    /* (n_head * head_dim, dim) */
    pgd_weight wk, wv;                /* (n_kv_head * head_dim, dim) */
    const float *bq, *bk, *bv;        /* (n_head*head_dim), (n_kv_head*head_dim) x2, or NULL */
    const float *q_norm, *k_norm;     /* (head_dim) each, or NULL: QK-norm gains (Qwen3) */
    bool no_rope;                     /* a NoPE layer (SmolLM3): Q and K are not rotated */
    int32_t window;                   /* sliding attention window (cfg.window), 0: none */
    bool local_rope;                  /* rotated with cfg.rope_theta_local (Gemma 3) */
    /* Gemma: RMSNorm gains of the attention's and of the FFN's output, applied before each is
     * added to the residual stream; NULL elsewhere. */
    const float *post_attn_norm, *post_ffn_norm; /* (dim) each */
    pgd_weight wo;                    /* (dim, n_head * head_dim) */
    const float *ffn_norm;            /* (dim) */
    pgd_weight w_gate, w_up;          /* (ffn_dim, dim) */
    pgd_weight w_down;                /* (dim, ffn_dim) */
    /* A mixture-of-experts layer (moe.n_expert > 0) has these instead of w_gate/w_up/w_down
     * (left empty but for a shared expert's matrices): the router and, in `experts` (owned by
     * the model), every expert's gate matrices, then their up, then their down matrices, which
     * moe's arrays point into. */
    pgd_weight w_router;              /* (n_expert, dim) */
    pgd_weight w_shared_inp;          /* (1, dim): the shared expert's gate, or empty */
    pgd_weight *experts;              /* (3 * n_expert) */
    pgd_moe moe;
    /* Multi-head latent attention (cfg.kv_lora_rank > 0) in place of wq/wk/wv (wq: the single
     * query matrix without q LoRA, (n_head * (qk_nope_dim + rope_dim), dim)); r = kv_lora_rank. */
    pgd_weight wq_a;                  /* (q_lora_rank, dim), or empty */
    pgd_weight wq_b;                  /* (n_head * (qk_nope_dim + rope_dim), q_lora_rank) */
    const float *q_a_norm;            /* (q_lora_rank) */
    pgd_weight wkv_a;                 /* (r + rope_dim, dim): latent, then the shared rope key */
    const float *kv_a_norm;           /* (r) */
    /* kv_b_proj split per head, F32 (owned): K's part transposed, so a head's query moves into
     * the latent space (absorbed), and V's, which takes the attention's latent output back. */
    const float *w_uk_t;              /* (n_head, r, qk_nope_dim) */
    const float *w_uv;                /* (n_head, v_head_dim, r) */
} pgd_layer;

/* The matrices of layer pointer L, as an initializer: `pgd_weight *w[] = PGD_LAYER_MATRICES(l);`
 * (const or not, as L is). */
#define PGD_LAYER_N_MATRICES 7
#define PGD_LAYER_MATRICES(L) \
    {&(L)->wq, &(L)->wk, &(L)->wv, &(L)->wo, &(L)->w_gate, &(L)->w_up, &(L)->w_down}

typedef struct pgd_pool pgd_pool;
struct pgd_comm;

/* One tensor-parallel rank's slice of the weights, in its backend's memory. Column-parallel
 * (Q/K/V, gate/up, their biases) take a contiguous range of output rows; row-parallel (o_proj,
 * down_proj) a range of input columns; the embedding and the LM head a range of vocab rows.
 * With one CPU rank every weight is the model's own (nothing is copied). */
typedef struct pgd_shard {
    int32_t rank;
    int32_t n_head, n_kv_head;        /* this rank's heads: [rank * n_head, (rank+1) * n_head) */
    int32_t ffn_lo, ffn_dim;          /* FFN columns [ffn_lo, ffn_lo + ffn_dim) */
    int32_t moe_lo, moe_dim;          /* each expert's FFN columns [moe_lo, moe_lo + moe_dim) */
    int32_t vocab_lo, n_vocab;        /* vocab rows [vocab_lo, vocab_lo + n_vocab) */
    pgd_weight tok_embd;              /* (n_vocab, dim) */
    pgd_weight output;                /* (n_vocab, dim) */
    const float *output_norm;         /* (dim) */
    pgd_layer *layers;                /* (n_layer); == model->layers when not copied */
    pgd_backend be;                   /* memory only (no init): where the weights live */
    void **mem;                       /* backend allocations freed with the model */
    size_t n_mem, cap_mem;
} pgd_shard;

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
    /* A multimodal checkpoint's text model (config.json's text_config): its HF tensors' "model."
     * is hf_prefix and lm_head.weight is hf_head; both NULL for a plain checkpoint. */
    bool hf_wrapped;
    bool hf_untied;                   /* config.json says tie_word_embeddings: false */
    const char *hf_prefix, *hf_head;
    void **owned;                     /* buffers converted at load time, freed with the model */
    size_t n_owned, cap_owned;
    void *hp_map;                     /* CPU: the matrices' own mapping (THP), or NULL */
    size_t hp_bytes;
    /* execution */
    pgd_device device;                /* where the shards live */
    int32_t n_ranks;                  /* tensor-parallel size (1: no sharding) */
    pgd_shard *shards;                /* (n_ranks) */
} pgd_model;

typedef enum { PGD_LOAD_AUTO = 0, PGD_LOAD_DUMMY } pgd_load_format;

typedef struct pgd_model_opts {
    bool weights_f32;  /* dequantize every weight to F32 at load (reference path) */
    int32_t n_ctx;     /* 0: the model's own context length */
    /* Added with the backends (issue 7). Zero values keep the old behaviour: CPU, one rank. When
     * device/tensor_parallel are 0 the environment variables PAGODA_DEVICE (cpu|cuda) and
     * PAGODA_TENSOR_PARALLEL are read, so tests and benchmarks reach every path before the
     * CLI flags are wired. */
    int32_t device;           /* 0: default (env or CPU), 1 + pgd_device otherwise */
    int32_t tensor_parallel;  /* ranks; 0: default (env or 1) */
    pgd_load_format load_format; /* DUMMY: path is a config.json (or its folder); random weights */
    uint64_t dummy_seed;
    float gpu_memory_utilization; /* CUDA: (0, 1] of each GPU's memory the process may use (0:
                                     0.9); loading fails if the weights alone exceed it */
} pgd_model_opts;

/* Parses "cpu" / "cuda" into opts->device; PGD_EINVAL otherwise. */
int pgd_model_opts_set_device(pgd_model_opts *opts, const char *name);

/* Loads a GGUF file or a Hugging Face model directory (detected). On failure err holds one line
 * naming the file and the problem. */
int pgd_model_load(const char *path, const pgd_model_opts *opts, pgd_model **out, pgd_err *err);
void pgd_model_free(pgd_model *m);

/* One forward step over a flattened batch that mixes prefill chunks and decode tokens of
 * several sequences. Token i belongs to sequence seq[i] at position pos[i] and writes its K/V
 * into slot[i]; it attends to positions 0..pos[i] of its sequence through that sequence's block
 * table. All arrays are borrowed for the call. */
typedef struct pgd_batch {
    int32_t n_tokens;
    const int32_t *tokens;        /* (n_tokens) */
    const int32_t *pos;           /* (n_tokens) */
    const int32_t *seq;           /* (n_tokens) index into block_tables */
    const int64_t *slot;          /* (n_tokens) */
    const int32_t *const *block_tables; /* (n_seqs) each covering positions 0..max pos */
    int32_t n_logits;
    const int32_t *logit_rows;    /* (n_logits) token indices whose logits are computed */
    /* Sampling on the backend (sample NULL: off): logit row i is sampled with sample[i] into
     * sampled[i] (src/sample/device_sample.h) and the logits stay on the backend, unless
     * need_logits asks for them in f->logits too (rows the caller samples on the host). */
    const pgd_sample_row *sample; /* (n_logits) */
    int32_t *sampled;             /* (n_logits) out */
    bool need_logits;
    /* (n_logits, dim) host out, or NULL: each logit row's final hidden state (after the output
       norm, the LM head's input): embeddings */
    float *hidden;
    /* (n_seqs) or NULL (none): each sequence's LoRA adapter, 0 for none, k for the forward's
       adapter slot k (pgd_fwd_set_lora) */
    const int32_t *seq_lora;
} pgd_batch;

/* Scratch for pgd_model_forward, sized once for up to max_tokens tokens and max_logits logit
 * rows per step (no allocation per step). With several ranks, one thread per rank (rank 0 is the
 * caller) runs the same layer program on its shard; activations meet in all-reduces. */
struct pgd_fwd_rank;
struct pgd_fwd_sync;
typedef struct pgd_fwd {
    const pgd_model *model;  /* borrowed */
    pgd_pool *pool;          /* borrowed: rank 0's threads */
    int32_t max_tokens, max_logits;
    float *inv_freq;         /* (head_dim / 2) host */
    float *inv_freq_local;   /* (head_dim / 2) host, or NULL: cfg.rope_theta_local's */
    float *logits;           /* (max_logits, n_vocab) host */
    int32_t n_ranks;
    struct pgd_fwd_rank *ranks;  /* (n_ranks) owned: backend instance + activations per rank */
    struct pgd_comm *comm;       /* owned; NULL with one rank */
    struct pgd_fwd_sync *sync;   /* owned; rank threads and their step hand-off */
    int32_t n_loras;             /* LoRA slots a batch's sequences may use (seq_lora) */
} pgd_fwd;

int pgd_fwd_init(pgd_fwd *f, const pgd_model *m, pgd_pool *pool, int32_t max_tokens,
                 int32_t max_logits, pgd_err *err);
void pgd_fwd_free(pgd_fwd *f);
/* LoRA adapters (src/model/lora.h) for the batches this forward runs: reserve n slots once, then
 * put an adapter (borrowed) into slot k (1..n), or NULL to empty it, between steps; a sequence
 * with seq_lora = k runs with slot k's adapter (none while the slot is empty). Refused where a
 * backend has no lora op. */
struct pgd_lora;
int pgd_fwd_reserve_loras(pgd_fwd *f, int32_t n, pgd_err *err);
int pgd_fwd_set_lora(pgd_fwd *f, int32_t k, const struct pgd_lora *l, pgd_err *err);
/* One slot holding l: pgd_fwd_reserve_loras(f, 1) and pgd_fwd_set_lora(f, 1, l). */
int pgd_fwd_use_lora(pgd_fwd *f, const struct pgd_lora *l, pgd_err *err);
/* Runs the batch; logits of batch->logit_rows[i] land in f->logits row i (with batch->sample:
 * their sampled tokens in batch->sampled, the logits only when need_logits). The logits of a token
 * are bit-identical whatever else shares its batch and however its sequence was chunked.
 * Returns PGD_EINVAL for a malformed batch (token id, position or size out of range). */
int pgd_model_forward(pgd_fwd *f, pgd_kv_cache *kv, const pgd_batch *b);

/* A single sequence over its own small paged cache: the unbatched path used by `pagoda logits`
 * and as the reference for the engine. Same pgd_model_forward underneath. */
typedef struct pgd_session {
    const pgd_model *model;  /* borrowed */
    int32_t n_ctx, max_batch, n_past;
    pgd_kv_cache kv;         /* blocks 0..n_ctx/block_size, used in order */
    pgd_fwd fwd;
    int32_t *block_table;    /* (n_blocks): the identity */
    int32_t *pos, *seq, *rows; /* (max_batch) */
    int64_t *slot;           /* (max_batch) */
    float *logits;           /* = fwd.logits */
    int32_t lora;            /* the sequence's adapter (pgd_batch.seq_lora), 0: none */
} pgd_session;

int pgd_session_init(pgd_session *s, const pgd_model *m, pgd_pool *pool, int32_t max_batch,
                     pgd_err *err);
/* As pgd_session_init with a K/V cache of kv_type (F32, F16 or BF16) instead of F32. */
int pgd_session_init_kv2(pgd_session *s, const pgd_model *m, pgd_pool *pool, int32_t max_batch,
                         pgd_type kv_type, pgd_type v_type, pgd_err *err);
int pgd_session_init_kv(pgd_session *s, const pgd_model *m, pgd_pool *pool, int32_t max_batch,
                        pgd_type kv_type, pgd_err *err);
void pgd_session_free(pgd_session *s);

/* Runs n tokens (n <= max_batch) at positions n_past.. and advances n_past. Writes logits for
 * every token into s->logits (row i for token i) when all_logits, else only row 0 holds the
 * last token's logits. Returns PGD_ERANGE when the context would overflow. */
int pgd_session_forward(pgd_session *s, const int32_t *tokens, int32_t n, bool all_logits);

/* Reads a Hugging Face config.json (any name) into *out (owned by the caller). For an image+text
 * model_type (gemma3, mistral3) that is the text model's config, as the loader reads it: its
 * text_config with the keys it leaves out at their transformers defaults (*wrapped set); a
 * text_config the loader would refuse is an error, or with lenient the config as it is. */
struct cJSON;
int pgd_hf_config_read(const char *path, bool lenient, struct cJSON **out, bool *wrapped,
                       pgd_err *err);
/* Reads path (a small file) as one JSON object into *out (owned by the caller). PGD_EFORMAT:
 * not a JSON object; otherwise pgd_read_file's status, with its message. */
int pgd__json_object_read(const char *path, struct cJSON **out, pgd_err *err);

#endif
