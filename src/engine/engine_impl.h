/* The engine's state (struct pgd_engine) and the functions its files share. A step is
 * schedule (scheduler.c), run (runner.c: the flattened batch, the device-sampling plan, the
 * forward pass), postprocess (output.c: sampling, constraints, stop strings, detokenization,
 * logprobs, events); engine.c holds the public API, the inbox and outbox, the thread and the
 * stats; request.c makes the request record. Internal to src/engine. */
#ifndef PGD_ENGINE_IMPL_H
#define PGD_ENGINE_IMPL_H

#include <pthread.h>

#include "backend/cpu/pool.h"
#include "engine/request.h"
#include "engine/seq_out.h"
#include "engine/scheduler.h"
#include "kv/kv.h"
#include "model/lora.h"
#include "model/model.h"
#include "pagoda/pagoda.h"
#include "sample/device_sample.h"
#include "sample/grammar.h"
#include "sample/json_grammar.h"
#include "sample/sampler.h"
#include "spec/spec.h"

struct pgd_engine {
    pgd_engine_config cfg;
    pgd_model *model;
    pgd_pool *pool;
    pgd_fwd fwd;
    /* LoRA slots 1..n_loras (loras[k - 1], NULL: free): each one's prefix-cache namespace
     * (never reused: a new load is a new namespace), the sequences holding it, and whether it
     * was unloaded (retired). lora_mu guards this bookkeeping only, never over compute (submit
     * and unload take it on the I/O thread); a slot's weights change under fwd_mu, which the
     * engine thread holds over each forward pass: a load (a pool thread) installs under it, and
     * a retired slot no sequence holds is freed by the engine thread between steps (lora_gc). */
    pthread_mutex_t lora_mu, fwd_mu;
    bool lora_gc;              /* (atomic) a retired slot may be free to collect */
    struct pgd_lora **loras;
    uint32_t *lora_ns;
    int32_t *lora_users;
    bool *lora_retired;
    int32_t n_loras;
    char **lora_names;         /* (n_loras) served names, for KV events; under lora_mu */
    uint32_t next_ns;
    pgd_kv_cache kv;
    pgd_kv_mgr mgr;
    struct pgd_kv_publisher *kv_pub; /* KV events (cfg.kv_events_config), or NULL */
    /* the disk tier (cfg.kv_cache_dir), or NULL (kv_tier.c); disk_wake (under in_mu): its
     * thread finished a load or freed a staging slot. The one load in flight fills dl_n blocks
     * (dl_blocks, a reference held on each) of sequence dl_seq from its table's dl_first */
    struct pgd_kv_disk *disk;
    bool disk_wake;
    int32_t *dl_blocks;        /* (max_blocks_per_seq) */
    uint64_t *dl_hashes;       /* (max_blocks_per_seq) */
    int32_t dl_n, dl_first;
    int32_t n_ctx, max_blocks_per_seq;
    pgd_sampler_scratch sample_scratch; /* shared by every sequence's sampler */
    int32_t *eog;                   /* (n_eog) end-of-generation token ids */
    int32_t n_eog;
    pgd_json_vocab json_vocab;      /* tokens' bytes for the JSON mask (with a tokenizer) */
    pgd_grammar_scratch *gr_scratch; /* every grammar request's feeding and masking (with a
                                        tokenizer; the engine thread alone) */
    pgd_grammar_key gr_key;         /* the key of the state being masked */
    uint8_t *json_allow;            /* (n_vocab) this step's mask */
    /* speculative decoding */
    pgd_spec_mode spec_mode;
    int32_t spec_k, ngram_min, ngram_max;
    pgd_draft draft;                /* DRAFT mode */
    bool spec_broken;               /* test hook: accept every proposal (breaks exactness;
                                       pgd__engine_spec_always_accept) */

    pgd_sched sched;                /* the waiting and running requests */
    uint64_t next_id;

    /* step buffers, sized once */
    void *step_block;                           /* one allocation: the arrays below to hidden,
                                                   step_ev and eog (pgd_alloc_slices) */
    int32_t *b_tokens, *b_pos, *b_seq;          /* (max_num_batched_tokens) */
    int32_t *b_rows;                            /* (max_logits) */
    int32_t max_logits;                         /* logit rows per step */
    /* sampling on the backend (PAGODA_DEVICE_SAMPLING): rows whose chain is temperature, top-k,
     * top-p and min-p only are sampled there; the logits come to the host only for the rest */
    bool device_sampling;
    pgd_sample_row *b_sample;                   /* (max_logits) */
    int32_t *b_sampled;                         /* (max_logits) */
    int64_t *b_slot;                            /* (max_num_batched_tokens) */
    const int32_t **b_tables;                   /* (max_num_seqs) */
    int32_t *b_lora;                            /* (max_num_seqs) their adapters */
    seq **b_seqs;                               /* (max_num_seqs) sequences in this step */
    /* prompt logprobs of this step, by logits row, computed on the pool before postprocess */
    struct lp_row {
        int32_t token, n_top, rank;
        float logprob;
        int32_t top_ids[PGD_MAX_TOP_LOGPROBS];
        float top_logprobs[PGD_MAX_TOP_LOGPROBS];
    } *lp_rows;                                 /* (max_logits) */
    float *hidden;                              /* (max_logits, dim): embeddings' rows */
    int32_t *lp_todo;                           /* (max_logits) rows to score */

    /* inbox: submissions and aborts from other threads */
    pthread_mutex_t in_mu;
    seq_list incoming;
    uint64_t *aborts;
    size_t n_aborts, cap_aborts;
    bool flush_cache;          /* (in_mu) pgd_engine_flush_cache asked: done at the next step */
    /* pgd_engine_kv_dump: requests are serialized by dump_mu; the engine thread answers
     * between steps (dump_req != dump_done, under in_mu) into dump_out, signalling dump_cv */
    pthread_mutex_t dump_mu;
    pthread_cond_t dump_cv;
    uint64_t dump_req, dump_done;
    char *dump_out;
    int32_t n_pending;         /* incoming + waiting, for the queue bound */

    /* this step's events, built with no lock held and published at its end in one short
     * critical section (publish); a full buffer is published early, so it never drops one */
    pgd_event *step_ev;                         /* (cap_step_ev) */
    int32_t n_step_ev, cap_step_ev;

    /* outbox, under out_mu: events not yet polled, and the FINISH slots reserved for requests
     * submitted and not finished (cap_events >= n_events + n_fin_reserved always: a FINISH
     * always has room, so exactly one per request arrives whatever malloc does) */
    pthread_mutex_t out_mu;
    pthread_cond_t out_cv;
    pgd_event *events;
    size_t n_events, cap_events, n_fin_reserved;
    pgd_engine_stats stats_pub; /* stats as of the last publish, for pgd_engine_get_stats */

    /* thread */
    pthread_t thread;
    bool thread_running;
    volatile bool stop_thread;
    pthread_cond_t in_cv;
    void (*notify)(void *);
    void *notify_arg;

    pgd_engine_stats stats;    /* the engine thread's; copied to stats_pub when publishing */
};


/* engine.c */
/* The next event of this step (its header zeroed); never fails. Engine thread. */
pgd_event *pgd__step_event(pgd_engine *e);
/* A finished sequence lets go of its LoRA adapter. */
void pgd__lora_release(pgd_engine *e, seq *s);

/* runner.c */
/* Up to cap proposals for s after its last token (the scheduler's propose hook). */
int32_t pgd__propose(void *ctx, seq *s, int32_t cap);
/* Flattens the step's ns sequences (b_seqs) into the batch and runs the forward pass: 0 or
 * the forward's status; *n_tokens the batch's tokens. */
int pgd__run(pgd_engine *e, int32_t ns, int32_t *n_tokens);

/* kv_tier.c: the disk tier's side in the engine */
/* Opens cfg.kv_cache_dir (after the KV storage and manager exist). */
int pgd__disk_open(pgd_engine *e, pgd_err *err);
/* The scheduler's disk_lookup hook. */
bool pgd__disk_lookup(void *ctx, seq *s);
/* Takes a finished load's blocks into the RAM cache and stages registered blocks for writing
 * while staging slots are free. Engine thread, between steps. */
void pgd__disk_pump(pgd_engine *e);
/* Whether the engine has nothing to do but wait for a load (the queue's head is loading and
 * nothing runs). */
bool pgd__disk_stalled(const pgd_engine *e);
/* Writes every registered block not yet on disk, then closes the store (shutdown, after the
 * engine thread stopped). */
void pgd__disk_close(pgd_engine *e);

/* output.c */
/* The prompt logprobs of this step's sequences, on the pool (before postprocess). */
void pgd__score_prompts(pgd_engine *e, int32_t ns);
/* After the forward pass (rc its status): each scheduled sequence takes its tokens, its
 * events go to the step buffer, finished ones are finished. */
void pgd__postprocess(pgd_engine *e, int32_t ns, int rc);
/* Takes s out of the scheduler, releases what it holds, emits its FINISH and frees it. */
void pgd__finish(pgd_engine *e, seq *s, pgd_finish_reason why, const char *error);

#endif
