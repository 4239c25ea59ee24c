/* Pagoda's public C API: embed the inference engine without HTTP.
 *
 * An engine owns one model, a paged KV cache and a scheduler. Submit requests (token ids and
 * sampling parameters); every step re-forms the batch from the running requests (continuous
 * batching with chunked prefill, prefix caching and preemption by recompute) and produces
 * events: token deltas with their text, and one finish (or error) event per request.
 *
 * Two ways to drive it:
 *  - synchronously: call pgd_engine_step() in a loop and read events with pgd_engine_poll();
 *  - on its own thread: pgd_engine_start(), then submit/abort/poll from any thread; a notify
 *    callback (e.g. uv_async_send) tells the consumer that events are waiting.
 * Ownership: arrays and strings passed in are borrowed for the duration of the call (copied). */
#ifndef PAGODA_H
#define PAGODA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pgd_engine pgd_engine;

/* KV element types (pgd_type's values): Q8_0 and Q4_0 are llama.cpp's blocks of 32 (CPU). */
typedef enum {
    PGD_KV_F32 = 0,
    PGD_KV_F16 = 1,
    PGD_KV_Q4_0 = 2,
    PGD_KV_Q8_0 = 8,
    PGD_KV_BF16 = 30
} pgd_kv_dtype;

typedef enum { PGD_SPEC_NONE = 0, PGD_SPEC_NGRAM = 1, PGD_SPEC_DRAFT = 2 } pgd_spec_mode;

#define PGD_SPEC_MAX_TOKENS 16

typedef struct pgd_engine_config {
    const char *model_path;         /* GGUF file or Hugging Face directory */
    bool weights_f32;               /* dequantize weights at load (reference path) */
    int32_t n_threads;              /* 0: all online CPUs */
    int32_t n_ctx;                  /* 0: the model's context length */
    int32_t block_size;             /* KV block size in tokens (default 16) */
    size_t kv_cache_bytes;          /* KV pool budget (default 512 MiB) */
    pgd_kv_dtype kv_dtype;          /* K's and V's (default F32) */
    bool kv_split;                  /* V's is kv_dtype_v instead (llama.cpp's -ctk / -ctv) */
    pgd_kv_dtype kv_dtype_v;
    int32_t max_num_batched_tokens; /* token budget per step (default 512) */
    int32_t max_num_seqs;           /* running sequences cap (default 64) */
    bool no_prefix_caching;         /* prefix caching is on unless this is set */
    int32_t max_waiting;            /* 0: unbounded waiting queue */
    bool static_batching;           /* baseline for benchmarks: admit a new batch only when the
                                       previous one has completely finished */
    /* speculative decoding (issue 6) */
    pgd_spec_mode speculative;      /* NONE (default), NGRAM (prompt lookup) or DRAFT */
    int32_t num_speculative_tokens; /* the most proposals per step, 1..16 (0: 5) */
    const char *draft_model_path;   /* DRAFT: a smaller model with the same vocabulary */
    int32_t ngram_min, ngram_max;   /* NGRAM: n-gram lengths matched (0: 1 and 4) */
    int32_t speculative_disable_by_batch_size; /* no proposals in a step while at least this
                                       many requests run (0: never): a large batch is bound by
                                       arithmetic, where verifying proposals costs more than it
                                       saves (vLLM's option of the same name) */
    /* backends (issue 7) */
    const char *device;             /* "cpu" or "cuda"; NULL: cpu (or $PAGODA_DEVICE) */
    int32_t tensor_parallel_size;   /* ranks; 0: 1 (or $PAGODA_TENSOR_PARALLEL) */
    bool load_format_dummy;         /* model_path is a config.json (or its folder): random
                                       weights; the tokenizer.json beside it, if any */
    float gpu_memory_utilization;   /* CUDA: share (0, 1] of each GPU's memory for weights,
                                       activations and the KV pool, which gets what is left
                                       (replaces kv_cache_bytes there); 0: 0.9. CPU: unused */
    /* LoRA adapters (PEFT directories; CPU backend), loaded at create: a request's lora = k
       runs with lora_paths[k - 1]. Each is read and checked against the model (one line naming
       the adapter's file on failure) */
    const char *const *lora_paths;
    int32_t n_loras;
    int32_t max_loras;              /* adapter slots, for pgd_engine_load_lora too (at least
                                       n_loras; 0: n_loras) */
    /* vLLM's --scheduling-policy priority: requests wait, run and are preempted in the order of
       (pgd_request_params.priority, arrival) instead of first come, first served, and a waiting
       request preempts running ones of a lower priority (a larger value) when it does not fit */
    bool priority_scheduling;
    /* vLLM's --kv-events-config JSON: the prefix cache's block events published for KV-aware
       routers (src/kv/kv_events.h); NULL: none */
    const char *kv_events_config;
    /* the prefix cache's disk tier (CPU backend): registered blocks are written behind to this
       directory and read back when a prompt's prefix is there and no longer in RAM, across
       restarts too (src/kv/kv_disk.h); NULL: none. kv_cache_disk_bytes bounds the files */
    const char *kv_cache_dir;
    size_t kv_cache_disk_bytes;
} pgd_engine_config;

/* Constraints compiled ahead of submit, which the engine copies instead of compiling their text
 * again (a server compiles once per request, off its I/O thread, for all its choices). Opaque to
 * this API: Pagoda's own front-ends build them (src/sample's compilers); an embedder passes the
 * text (json_schema, regex, grammar) and leaves these NULL. */
typedef struct pgd_json_schema pgd_json_schema;
typedef struct pgd_regex pgd_regex;
typedef struct pgd_grammar pgd_grammar;

typedef struct pgd_request_params {
    const int32_t *prompt;          /* token ids (copied) */
    int32_t n_prompt;
    int32_t max_tokens;             /* >= 0; 0: the prompt only (its prompt_logprobs, the
                                       prefix cache), then FINISH with LENGTH */
    float temperature;              /* 0: greedy */
    float top_p;                    /* (0, 1]; 0 means 1 */
    int32_t top_k;                  /* 0: off */
    uint64_t seed;
    bool ignore_eos;
    const char *const *stop;        /* stop strings (copied); the text ends before the match */
    int32_t n_stop;
    uint64_t user_data;             /* returned in every event */
    /* the full sampler (issue 6); zero values mean "off" */
    float min_p;                    /* [0, 1] */
    float presence_penalty;         /* [-2, 2], OpenAI semantics */
    float frequency_penalty;        /* [-2, 2], OpenAI semantics */
    float repetition_penalty;       /* > 0; 0 or 1 = off (HF/vLLM semantics) */
    const int32_t *logit_bias_ids;  /* (n_logit_bias) token ids (copied) */
    const float *logit_bias;        /* (n_logit_bias) added to those logits, [-100, 100] */
    int32_t n_logit_bias;
    int32_t min_tokens;             /* no end-of-generation before this many tokens */
    int32_t logprobs;               /* report the chosen token's logprob and this many top
                                       alternatives (0..20); -1 = no logprobs at all */
    bool no_speculation;            /* opt out of speculative decoding */
    /* also score the prompt: one PGD_EVENT_PROMPT_TOKEN per prompt token, in order, before the
       first generated token, each with prompt_top_logprobs (0..20) alternatives. The request
       takes no prefix-cache hit (the cached positions' logits were never kept), as in vLLM */
    bool prompt_logprobs;
    int32_t prompt_top_logprobs;
    /* output constrained to one JSON object (OpenAI response_format json_object); needs a
       tokenizer; the generation stops when the object closes */
    bool json_object;
    /* the same, held to this JSON Schema (the text of the schema object; compiled, not kept;
       OpenAI response_format json_schema): json_grammar.h says what it supports */
    const char *json_schema;
    /* with json_schema: the schema compiled already (opaque, above), which the engine copies;
       NULL: the engine compiles the text */
    const pgd_json_schema *json_schema_c;
    /* embeddings (max_tokens 0): the last prompt token's final hidden state (after the model's
       final norm: last-token pooling), L2-normalized, written into embedding (pgd_engine_dim
       floats, the caller's, untouched by the engine after this request's FINISH) before its
       FINISH event */
    float *embedding;
    /* with json_schema: text the document must come right after / right before (a tool call's
       "<tool_call>\n" ... "\n</tool_call>"), or NULL */
    const char *json_prefix, *json_suffix;
    /* vLLM's extensions (zero values: off) */
    const int32_t *stop_token_ids;  /* (n_stop_token_ids) the generation also ends (STOP) at
                                       these tokens, which are masked, as end-of-generation
                                       tokens are, while output < min_tokens (copied) */
    int32_t n_stop_token_ids;
    bool include_stop;              /* include_stop_str_in_output: a matched stop string stays
                                       in the text, and a stop token's text is added */
    bool render_special;            /* skip_special_tokens false: control tokens' text too */
    const int32_t *allowed_token_ids; /* (n_allowed_token_ids) only these may be sampled
                                       (copied) */
    int32_t n_allowed_token_ids;
    /* guided_choice: the output is exactly one of these strings (copied; 1..PGD_MAX_CHOICES of
       1..PGD_MAX_CHOICE_LEN bytes), ending (STOP) when it is one that no other continues, or at
       an end-of-generation token once it is one; needs a tokenizer */
    const char *const *choices;
    int32_t n_choices;
    /* guided_regex: the output is a whole match of this pattern (src/sample/regex.h; compiled
       per request), ending (STOP) when no byte can extend the match, or at an
       end-of-generation token once it is one; needs a tokenizer */
    const char *regex;
    /* with regex: its DFA compiled already (opaque, above), which the engine copies; NULL: the
       engine compiles regex */
    const pgd_regex *regex_dfa;
    /* guided_grammar: the output is a sentence of this GBNF grammar's root rule
       (src/sample/grammar.h), ending (STOP) when no byte can extend it, or at an
       end-of-generation token once it is one; needs a tokenizer */
    const char *grammar;
    /* or the grammar compiled already (opaque, above), which the engine copies (grammar is
       then not read) */
    const pgd_grammar *grammar_c;
    /* a reasoning model's thinking before a constrained answer (JSON, choices, a regex or a
       grammar), as vLLM applies a grammar only once the reasoning has ended: the constraint
       holds from the token after the one that completes this text ("</think>"); until then
       sampling is free */
    const char *constrain_after;
    /* with constrain_after, thinking the model may open or not (qwen3): the first token is
       either the token whose text is exactly this ("<think>"), and the constraint then waits for
       constrain_after, or one the constraint allows, and it holds from there */
    const char *think_open;
    /* the LoRA adapter to run with: 0 none (the base model), k: the adapter in slot k (the
       configuration's lora_paths[k - 1], or pgd_engine_load_lora's). Prefix-cache hits are only
       between requests of the same adapter (the same load of it) */
    int32_t lora;
    /* with priority_scheduling: lower values are served first (ties by arrival); any value is
       allowed. Without it, only 0 (vLLM's rule) */
    int32_t priority;
} pgd_request_params;

#define PGD_MAX_CHOICES 256
#define PGD_MAX_CHOICE_LEN 4096

typedef enum {
    PGD_EVENT_TOKEN = 1,
    PGD_EVENT_FINISH = 2,
    /* with prompt_logprobs: prompt token number text_offset (0..n_prompt-1), token its id,
       logprob its log-probability given the tokens before it; the first has none (n_top -1) */
    PGD_EVENT_PROMPT_TOKEN = 3,
} pgd_event_type;

typedef enum {
    PGD_FINISH_STOP = 1,   /* end-of-generation token or a stop string */
    PGD_FINISH_LENGTH = 2, /* max_tokens or the context length */
    PGD_FINISH_ABORT = 3,  /* cancelled */
    PGD_FINISH_ERROR = 4,  /* rejected or failed; error holds the reason */
} pgd_finish_reason;

#define PGD_EVENT_TEXT_MAX 384
#define PGD_MAX_TOP_LOGPROBS 20

typedef struct pgd_event {
    pgd_event_type type;
    uint64_t request_id, user_data;
    int32_t token;                   /* TOKEN: the sampled token id */
    float logprob;                   /* TOKEN, when requested: log-probability of token */
    int32_t n_top;                   /* TOKEN: number of alternatives below (-1: no logprob) */
    int32_t rank;                    /* PROMPT_TOKEN: token's rank by logprob (1: the top) */
    int32_t top_ids[PGD_MAX_TOP_LOGPROBS];
    float top_logprobs[PGD_MAX_TOP_LOGPROBS];
    int32_t text_len;                /* TOKEN/FINISH: bytes of text completed by this event */
    /* TOKEN: bytes of the generated text before this token's own (where its text starts,
       whatever is held back for stop strings; the logprobs' text_offset) */
    int32_t text_offset;
    char text[PGD_EVENT_TEXT_MAX];   /* complete UTF-8 only; FINISH carries held-back text */
    pgd_finish_reason finish_reason; /* FINISH */
    int32_t n_prompt, n_completion, n_cached; /* FINISH: token counts (cached = prefix hits) */
    /* FINISH: this request's proposed and accepted speculative tokens (its share of the
       spec_draft_tokens / spec_accepted_tokens stats; aborted requests included) */
    int32_t n_spec_draft_tokens, n_spec_accepted;
    double queue_seconds;            /* FINISH: from submission to first scheduling */
    /* FINISH with STOP: what stopped it (vLLM's stop_reason): stop string number stop_string
       of the request's, or stop token stop_token (one of stop_token_ids); -1 and -1 for an
       end-of-generation token or a constraint completed */
    int32_t stop_string, stop_token;
    char error[160];                 /* FINISH with PGD_FINISH_ERROR */
} pgd_event;

typedef struct pgd_engine_stats {
    int32_t num_running, num_waiting;
    int32_t kv_blocks_total, kv_blocks_used, kv_blocks_cached;
    double kv_usage_perc, kv_fragmentation_perc;
    int64_t prefix_cache_queries, prefix_cache_hits; /* tokens */
    int64_t num_preemptions, prompt_tokens_total, generation_tokens_total, prefill_tokens_total;
    int64_t steps;
    int32_t last_step_seqs, last_step_tokens;
    /* speculative decoding: verifications with proposals, proposed tokens, accepted ones, and
       accepted ones by position in the proposal (vLLM's spec_decode_num_* counters) */
    int64_t spec_drafts, spec_draft_tokens, spec_accepted_tokens;
    int64_t spec_accepted_per_pos[PGD_SPEC_MAX_TOKENS];
    /* LoRA: bit k - 1 set when adapter k (pgd_request_params.lora; the first 64) has running /
       waiting requests */
    uint64_t lora_running, lora_waiting;
    /* KV events (kv_events_config): batches published, skipped on the PUB socket (a send
       backlog; still in the replay buffer) and lost (gone unsent, or not recorded) */
    int64_t kv_events_batches, kv_events_overflow, kv_events_lost;
    /* the disk tier (kv_cache_dir; kv_disk false: none): blocks read back and used, lookups
       past RAM that found nothing, bytes read and written, entries evicted for room, damaged
       or foreign entries dropped, writes failed, blocks never written (no staging room before
       they left RAM), and what is on disk now */
    bool kv_disk;
    int64_t kv_disk_hits, kv_disk_misses, kv_disk_bytes_read, kv_disk_bytes_written;
    int64_t kv_disk_evictions, kv_disk_corrupt, kv_disk_write_errors, kv_disk_writes_dropped;
    int64_t kv_disk_entries, kv_disk_bytes;
} pgd_engine_stats;

/* Fills c with the defaults. */
void pgd_engine_config_default(pgd_engine_config *c);
/* Loads the model and sizes the KV pool. On failure writes one line into err (errlen bytes). */
int pgd_engine_create(const pgd_engine_config *c, pgd_engine **out, char *err, size_t errlen);
void pgd_engine_free(pgd_engine *e);

/* Tokenizes text with the engine's tokenizer (BOS per model metadata when add_bos, special
 * tokens parsed when parse_special). Writes up to cap ids; *n_out gets the count needed. */
int pgd_engine_tokenize(pgd_engine *e, const char *text, size_t len, bool add_bos,
                        bool parse_special, int32_t *out, size_t cap, size_t *n_out);
int32_t pgd_engine_n_ctx(const pgd_engine *e);
/* The model's vocabulary: token ids are below it. */
int32_t pgd_engine_n_vocab(const pgd_engine *e);
/* The model's Hugging Face names: config.json's model_type ("llama", "qwen2_moe", ...; a GGUF's
 * architecture mapped to it) and its class ("LlamaForCausalLM"; "" when unknown). */
const char *pgd_engine_model_type(const pgd_engine *e);
const char *pgd_engine_architecture(const pgd_engine *e);
/* The model's hidden size: the length of an embedding. */
int32_t pgd_engine_dim(const pgd_engine *e);
bool pgd_engine_add_bos(const pgd_engine *e);
/* False for a model loaded without a tokenizer (--load-format dummy with no tokenizer.json):
 * then requests are token ids, events carry no text, no token ends a generation, and
 * pgd_engine_tokenize accepts only the empty text (BOS alone, from config.json). */
bool pgd_engine_has_tokenizer(const pgd_engine *e);

/* Queues a request; *id receives its id. Fails (negative, err filled) when the request can
 * never fit: prompt + max_tokens beyond the context or the whole KV pool, empty prompt, bad
 * parameters, or a full waiting queue (PGD_ERANGE there). */
int pgd_engine_submit(pgd_engine *e, const pgd_request_params *p, uint64_t *id, char *err,
                      size_t errlen);
/* Cancels a request at any time; its blocks are released at the next step. */
void pgd_engine_abort(pgd_engine *e, uint64_t id);

/* Runs one step (synchronous use only). Returns the number of tokens computed, 0 when idle. */
int pgd_engine_step(pgd_engine *e);
bool pgd_engine_has_work(pgd_engine *e);
/* Moves up to max events into out; waits up to timeout_ms (0: don't wait) for at least one. */
int pgd_engine_poll(pgd_engine *e, pgd_event *out, int max, int timeout_ms);

/* Runs the step loop on a thread of its own; notify (may be NULL) is called from the engine
 * thread whenever events are queued. */
int pgd_engine_start(pgd_engine *e, void (*notify)(void *), void *notify_arg);
/* Stops the thread (in-flight requests stay queued; call before pgd_engine_free). */
void pgd_engine_stop(pgd_engine *e);

void pgd_engine_get_stats(pgd_engine *e, pgd_engine_stats *s);
/* Drops the prefix cache's unreferenced blocks before the next step (SGLang's /flush_cache);
 * blocks that running sequences hold stay. Any thread; returns at once. */
void pgd_engine_flush_cache(pgd_engine *e);

/* LoRA adapters at run time (vLLM's /v1/load_lora_adapter), from any thread: reads the PEFT
 * directory at path (on the caller's thread) and puts it into a free slot between two steps;
 * *lora gets the slot (pgd_request_params.lora). Fails (err filled: the file's problem, or
 * every one of max_loras slots taken) without touching the running requests. */
int pgd_engine_load_lora(pgd_engine *e, const char *path, int32_t *lora, char *err,
                         size_t errlen);
/* Retires slot lora: requests submitted with it still finish with it, new ones are refused; the
 * adapter is freed and the slot reused once the last finishes. PGD_ENOENT if the slot holds
 * none. */
int pgd_engine_unload_lora(pgd_engine *e, int32_t lora);
/* The name slot lora's adapter is served as (vLLM's lora_name), which KV events carry; copied. */
int pgd_engine_set_lora_name(pgd_engine *e, int32_t lora, const char *name);

/* The prefix cache's registered blocks as the engine thread sees them between two steps, as
 * JSON: {"seq": the last KV event batch published (-1: none or events off), "block_size",
 * "blocks": [{"block_hash", "parent_block_hash" (null: first), "token_ids", "lora_id",
 * "lora_name", "ref"}]}, with every event up to seq describing exactly this set. Blocks the
 * calling thread (never the I/O thread's) up to timeout_ms; *json is the caller's to free.
 * PGD_EAGAIN on timeout or when the engine thread is not running. */
int pgd_engine_kv_dump(pgd_engine *e, char **json, int timeout_ms);

#ifdef __cplusplus
}
#endif
#endif
