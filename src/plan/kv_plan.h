/* The KV-cache capacity planner: from a model's architecture numbers (read from GGUF metadata
 * or a HF config.json, never the weights) and a GPU deployment, how much memory the weights
 * take per GPU, how many KV tokens and concurrent users fit, and the decode roofline.
 * Pure arithmetic: no allocation except the JSON string, no global state. */
#ifndef PGD_PLAN_KV_PLAN_H
#define PGD_PLAN_KV_PLAN_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "util/status.h"

/* Element types for weights and KV. GGUF means "as stored in the model file": the effective
 * bytes per parameter come from the file's tensor sizes (pgd_kv_plan_model.file_bytes_per_param).
 */
typedef enum {
    PGD_KV_PLAN_F32,
    PGD_KV_PLAN_BF16,
    PGD_KV_PLAN_F16,
    PGD_KV_PLAN_FP8,
    PGD_KV_PLAN_INT8,
    PGD_KV_PLAN_INT4,
    PGD_KV_PLAN_GGUF,
    PGD_KV_PLAN_Q8_0, /* llama.cpp's KV blocks (--kv-dtype q8_0): 34 bytes per 32 elements */
    PGD_KV_PLAN_Q4_0, /* 18 bytes per 32 */
} pgd_kv_plan_dtype;

/* Architecture numbers of a decoder-only transformer (Llama / Mistral / Qwen2 family). */
typedef struct pgd_kv_plan_model {
    char name[128]; /* file or config base name, for the report */
    int64_t n_layer, dim, n_head, n_kv_head, head_dim, ffn_dim, n_vocab;
    int64_t n_ctx;                  /* max_position_embeddings / context_length; 0 if unknown */
    /* Mixture of experts (Mixtral, Qwen3-MoE): each FFN is n_expert experts of moe_ffn_dim
     * (plus a router), n_expert_used of them per token; n_expert 0: dense. */
    int64_t n_expert, n_expert_used, moe_ffn_dim;
    int64_t shared_ffn_dim;         /* Qwen2-MoE's shared expert (every token runs it), or 0;
                                       DeepSeek's shared experts, all of them */
    int64_t n_dense;                /* DeepSeek: the first n_dense layers are dense (ffn_dim) */
    /* Multi-head latent attention (DeepSeek-V2/V3; kv_lora_rank 0: none): head_dim is then the
     * cached row, kv_lora_rank + rope_dim, under one KV head, replicated on every GPU (each
     * rank attends with all of the latent); q_lora_rank 0: one q matrix. */
    int64_t kv_lora_rank, rope_dim, q_lora_rank, qk_nope_dim, v_head_dim;
    bool tied_embeddings;           /* LM head shares the token-embedding table */
    bool attn_bias;                 /* Q/K/V biases (Qwen2) */
    double file_bytes_per_param;    /* > 0 when read from a GGUF: tensor bytes / tensor elements */
    pgd_kv_plan_dtype config_dtype; /* dtype named by config.json's torch_dtype (default BF16) */
} pgd_kv_plan_model;

/* One GPU type and the deployment. Figures are per GPU. */
typedef struct pgd_kv_plan_hw {
    char name[32];
    double mem_bytes;         /* HBM capacity */
    double bandwidth_bytes_s; /* HBM bandwidth; 0: no roofline */
    double flops;             /* dense BF16 peak FLOP/s; 0: no compute roof */
    int32_t n_gpus;           /* total GPUs; n_gpus / tp data-parallel replicas */
    int32_t tp;               /* tensor-parallel size; must divide n_gpus */
} pgd_kv_plan_hw;

#define PGD_KV_PLAN_N_CTX 4    /* 2k, 4k, 32k, 128k */
#define PGD_KV_PLAN_N_BATCH 11 /* batch sizes 1, 2, 4, ... 1024 for the ops:byte table */

typedef struct pgd_kv_plan_input {
    pgd_kv_plan_model model;
    pgd_kv_plan_hw hw;
    pgd_kv_plan_dtype weight_dtype, kv_dtype;
    double gpu_mem_util;    /* share of HBM the server may use (vLLM's default 0.90) */
    double reserve_bytes;   /* per GPU, for activations / CUDA context (default 0) */
    double kv_budget_bytes; /* > 0: KV budget per GPU given directly (a server's own
                               --kv-cache-memory); memory, util and reserve are then unused */
    int64_t roofline_ctx;   /* context (tokens per sequence) for the ops:byte table */
} pgd_kv_plan_input;

typedef struct pgd_kv_plan_roof {
    double per_user_tok_s;  /* batch 1 at this context */
    int64_t max_batch;      /* users that fit at this context (per replica) */
    double aggregate_tok_s; /* all replicas at max_batch; 0 if max_batch is 0 */
    bool compute_bound;     /* at max_batch the FLOP roof, not bandwidth, sets the step */
} pgd_kv_plan_roof;

typedef struct pgd_kv_plan {
    pgd_kv_plan_input in; /* copy of the input, dtypes resolved */
    double weight_bytes_per_param, kv_bytes_per_elem;
    int64_t n_params;          /* all parameters */
    int64_t n_params_streamed; /* read once per decode step of one sequence (its multiply-adds):
                                  all but an untied input embedding and the unchosen experts */
    int64_t n_params_expert;   /* one expert of every layer (MoE; 0 otherwise) */
    double weight_bytes_total, weight_bytes_per_gpu;
    double streamed_bytes_per_gpu;     /* weight bytes each GPU reads per decode step (of one
                                          sequence: an MoE step of B reads more experts) */
    double expert_bytes_per_gpu;       /* one expert of every layer, this GPU's share */
    double kv_bytes_per_token;         /* whole model: 2 * layers * KV heads * head dim * bytes */
    double kv_bytes_per_token_per_gpu; /* KV heads split over tp (replicated when tp > heads) */
    double kv_budget_bytes_per_gpu;    /* may be negative: the weights do not fit */
    int32_t n_replicas;
    int64_t max_kv_tokens; /* all replicas */
    int64_t ctx[PGD_KV_PLAN_N_CTX];
    int64_t max_users[PGD_KV_PLAN_N_CTX]; /* all replicas */
    bool has_roofline;
    pgd_kv_plan_roof roof[PGD_KV_PLAN_N_CTX];
    double crossover_ops_per_byte; /* flops / bandwidth: above this a step is compute-bound */
    int64_t batch[PGD_KV_PLAN_N_BATCH];
    double ops_per_byte[PGD_KV_PLAN_N_BATCH]; /* decode step at roofline_ctx */
} pgd_kv_plan;

/* Fills in with the defaults: BF16 weights and KV, 1 GPU, tp 1, util 0.90, roofline at 4096. */
void pgd_kv_plan_input_init(pgd_kv_plan_input *in);

/* Reads the architecture of a GGUF file, a HF model directory (its config.json) or a HF
 * config.json file; only metadata is read. path is borrowed. */
int pgd_kv_plan_model_load(const char *path, pgd_kv_plan_model *out, pgd_err *err);

/* Fills hw (memory, bandwidth, FLOP/s, name) from a preset name: a100-40gb, a100-80gb,
 * h100-80gb, h200-141gb. Leaves n_gpus and tp alone. PGD_ENOENT for an unknown name. */
int pgd_kv_plan_gpu_preset(const char *name, pgd_kv_plan_hw *hw);

/* "bf16", "fp16"/"f16", "fp8", "int8", "int4", "f32"/"fp32", "gguf"/"auto" (case-insensitive). */
int pgd_kv_plan_dtype_parse(const char *s, pgd_kv_plan_dtype *out);
const char *pgd_kv_plan_dtype_name(pgd_kv_plan_dtype d);

/* Computes the plan into the caller's *out (in is borrowed and copied into out->in). PGD_EINVAL
 * for an inconsistent input (non-positive sizes, tp not dividing the GPU count or the attention
 * heads, GGUF dtype without file figures); err then names the problem. Weights that do not fit
 * are not an error: kv_budget_bytes_per_gpu is negative and nothing fits. */
int pgd_kv_plan_compute(const pgd_kv_plan_input *in, pgd_kv_plan *out, pgd_err *err);

/* The plan as one JSON object (keys weight_bytes_per_gpu, kv_bytes_per_token, max_kv_tokens,
 * max_users keyed by context length, decode_roofline_tok_s, ...). *json_out is malloc'd; the
 * caller frees it with free(). */
int pgd_kv_plan_to_json(const pgd_kv_plan *p, char **json_out, pgd_err *err);
/* compute + to_json in one call: what the server's GET /v1/kv_plan uses. For the server's own
 * model and memory: pgd_kv_plan_input_init, pgd_kv_plan_model_load(model path), weight_dtype =
 * PGD_KV_PLAN_GGUF for a GGUF file, kv_dtype from --kv-dtype, kv_budget_bytes = --kv-cache-memory
 * (no bandwidth given: "decode_roofline_tok_s" is null). Thread-safe: no shared state. */
int pgd_kv_plan_json(const pgd_kv_plan_input *in, char **json_out, pgd_err *err);

/* A readable report. */
void pgd_kv_plan_print(const pgd_kv_plan *p, FILE *f);

#endif
