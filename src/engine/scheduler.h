/* The scheduler: the waiting and running queues, admission, the token budget and prefill
 * chunking, priority, and preemption by recompute. Each step re-forms the batch under a token
 * budget: running decodes first (preempting the most recently admitted sequence when a block is
 * missing), then prefill chunks of partially prefilled sequences, then waiting requests in
 * arrival order while blocks, budget, logits rows and the sequence cap allow. Priority
 * scheduling orders both lists by (priority, arrival) instead, preempts the lowest priority,
 * and lets a request take room from lower ones.
 *
 * It sees request records and block counts only: KV through kv/, everything else (speculative
 * proposals, the draft model's KV, the grammar start, block copies, the inbox's queue count,
 * the disk tier's lookup) through hooks, so tests/unit/test_scheduler.c drives it with fake sequences and no model.
 * Engine thread only. */
#ifndef PGD_ENGINE_SCHEDULER_H
#define PGD_ENGINE_SCHEDULER_H

#include "engine/request.h"
#include "kv/kv.h"

typedef struct pgd_sched_config {
    int32_t block_size;
    int32_t max_num_batched_tokens; /* the token budget of a step */
    int32_t max_num_seqs;           /* running sequences at most */
    int32_t max_logits;             /* logits rows of a step (>= max_num_seqs) */
    int32_t spec_disable_by_batch_size; /* no proposals from this many running on; 0: never */
    bool priority_scheduling, static_batching;
} pgd_sched_config;

/* What the scheduler asks of the rest of the engine; any hook may be NULL (nothing to do). */
typedef struct pgd_sched_hooks {
    void *ctx;
    /* up to cap speculative proposals for s, written at s->tokens[s->n_tokens..]: their count */
    int32_t (*propose)(void *ctx, seq *s, int32_t cap);
    /* the proposals just made for s found no blocks: forget them */
    void (*unpropose)(void *ctx, seq *s);
    /* s's KV was released (preempted or removed): release what mirrors it (the draft's) */
    void (*release)(void *ctx, seq *s);
    /* s is scheduled for the first time */
    void (*admit)(void *ctx, seq *s);
    /* copy-on-write: the blocks in cp must be copied in the KV storage before the step runs */
    void (*copy_blocks)(void *ctx, const pgd_kv_copy *cp);
    /* the disk tier: the waiting s holds its RAM prefix hit (s->n_computed tokens); true when
     * it found the blocks after it on disk and started loading them (s->loading: s keeps its
     * blocks and waits; the engine clears s->loading and releases them once they are in the
     * RAM cache) */
    bool (*disk_lookup)(void *ctx, seq *s);
    /* the count of queued requests (waiting) changed by delta */
    void (*pending)(void *ctx, int32_t delta);
} pgd_sched_hooks;

typedef struct pgd_sched {
    pgd_sched_config cfg;
    pgd_sched_hooks hooks;
    pgd_kv_mgr *mgr;                /* borrowed */
    seq_list waiting, running;
    bool admitting;                 /* static batching: the current batch is still being filled */
    int64_t num_preemptions, prompt_tokens_total; /* counters for the engine's stats */
} pgd_sched;

/* Appends s to l (the engine's inbox uses it too). */
void pgd_seq_list_push_back(seq_list *l, seq *s);
/* mgr and hooks are borrowed (hooks copied). */
void pgd_sched_init(pgd_sched *sc, const pgd_sched_config *c, pgd_kv_mgr *mgr,
                    const pgd_sched_hooks *hooks);
/* Frees every queued record (pgd__seq_free); their blocks are not released. */
void pgd_sched_free(pgd_sched *sc);
/* Queues s (taken) behind the waiting requests (in its place, by priority). */
void pgd_sched_add(pgd_sched *sc, seq *s);
/* The queued record with this id, or NULL. */
seq *pgd_sched_find(pgd_sched *sc, uint64_t id);
/* Takes s out of its queue and releases its blocks; the caller frees it. */
void pgd_sched_remove(pgd_sched *sc, seq *s);
/* Forms this step's batch: its sequences in sched[0..*n_sched) (room for max_num_seqs), each
 * with sched_n tokens from n_computed (and n_draft proposals), their blocks reserved. Returns
 * the tokens scheduled; 0 with nothing running or nothing that fits. */
int32_t pgd_sched_step(pgd_sched *sc, seq **sched, int32_t *n_sched);
/* Logits rows a chunk of n tokens from s->n_computed needs (the runner's flattening agrees). */
int32_t pgd_sched_chunk_rows(const seq *s, int32_t n);

#endif
