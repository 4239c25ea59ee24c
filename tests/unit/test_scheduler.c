/* The scheduler (src/engine/scheduler.c) on fake sequences, with no model: a fake step runs what
 * it schedules (computed tokens, one generated token when a chunk ends the sequence, prefix
 * cache commits) as the engine's runner and output path would.
 * - admission order: first come first served, and (priority, arrival) under priority
 *   scheduling, with a higher priority taking a lower one's slot;
 * - the token budget: decodes first, then prefill chunks that fill the budget, chunks cut to
 *   the logits rows prompt logprobs need;
 * - preemption: the most recently admitted (fcfs) or the lowest priority, back to the queue's
 *   front, its blocks freed;
 * - prefix hits: counted once at admission, undone when the head does not fit;
 * - abort (remove) in every state: waiting, preempted, mid-prefill, decoding;
 * - the disk tier's loading state: the head waits on its load while others decode;
 * - a randomized workload in both policies: every block free at the end, the pool consistent,
 *   the queue count back to zero, and under fcfs requests start in arrival order and each
 *   finishes within a bounded number of steps. */
#include <stdlib.h>
#include <string.h>

#include "engine/scheduler.h"
#include "test.h"

#define BS 4       /* block size */
#define MAXB 64    /* blocks per sequence at most */

static uint64_t rs = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(uint32_t n) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (uint32_t)(rs % n);
}

/* The scheduler's world: the block pool, the queue count the pending hook keeps. */
typedef struct world {
    pgd_kv_mgr mgr;
    pgd_sched sc;
    int32_t pending, n_admit;
    uint64_t admitted[4096]; /* ids in order of first admission */
    seq *batch[64];
} world;

static void hook_pending(void *ctx, int32_t delta) { ((world *)ctx)->pending += delta; }
static void hook_admit(void *ctx, seq *s) {
    world *w = ctx;
    if (w->n_admit < 4096) w->admitted[w->n_admit++] = s->id;
}

static void world_init(world *w, int32_t n_blocks, int32_t budget, int32_t max_seqs,
                       int32_t max_logits, bool priority) {
    memset(w, 0, sizeof *w);
    pgd_err err;
    CHECK_EQ_INT(pgd_kv_mgr_init(&w->mgr, n_blocks, BS, true, &err), 0);
    pgd_sched_config c = {.block_size = BS, .max_num_batched_tokens = budget,
                          .max_num_seqs = max_seqs, .max_logits = max_logits,
                          .priority_scheduling = priority};
    pgd_sched_hooks h = {.ctx = w, .pending = hook_pending, .admit = hook_admit};
    pgd_sched_init(&w->sc, &c, &w->mgr, &h);
}

static void world_free(world *w) {
    pgd_sched_free(&w->sc);
    pgd_kv_mgr_free(&w->mgr);
}

/* A fake request: prompt tokens from a base (equal bases share prefixes), max_tokens. */
static seq *fake(world *w, uint64_t id, int32_t n_prompt, int32_t max_tokens, int32_t priority,
                 int32_t base) {
    seq *s = calloc(1, sizeof *s);
    s->tokens = malloc((size_t)(n_prompt + max_tokens) * sizeof *s->tokens);
    for (int32_t i = 0; i < n_prompt; i++) s->tokens[i] = base + i;
    CHECK_EQ_INT(pgd_kv_seq_init(&s->kv, MAXB), 0);
    s->id = id;
    s->n_prompt = s->n_tokens = n_prompt;
    s->max_tokens = max_tokens;
    s->priority = priority;
    s->logit_row = s->embed_row = -1;
    return s;
}

static void add(world *w, seq *s) {
    w->pending++; /* (the engine counts a submission) */
    pgd_sched_add(&w->sc, s);
}

static void finish(world *w, seq *s) {
    pgd_sched_remove(&w->sc, s);
    pgd__seq_free(s);
}

/* Runs one step as the engine would after the forward pass; finished sequences go. Returns the
 * number scheduled; *used the tokens. */
static int32_t fake_step(world *w, int32_t *used) {
    int32_t ns = 0;
    *used = pgd_sched_step(&w->sc, w->batch, &ns);
    for (int32_t i = 0; i < ns; i++) {
        seq *s = w->batch[i];
        s->n_computed += s->sched_n;
        s->sched_n = 0;
        if (s->prompt_lp && s->n_computed > s->lp_pos)
            s->lp_pos = s->n_computed < s->n_prompt - 1 ? s->n_computed : s->n_prompt - 1;
        if (s->n_computed == s->n_tokens) { /* a chunk that ends the sequence: a token */
            s->tokens[s->n_tokens++] = 1000 + (int32_t)(s->id % 7);
            if (s->n_tokens - s->n_prompt >= s->max_tokens) {
                finish(w, s);
                continue;
            }
            s->n_computed = s->n_tokens - 1;
        }
        pgd_kv_commit(&w->mgr, &s->kv, s->tokens, s->n_computed);
    }
    return ns;
}

static void run_until_idle(world *w, int max_steps) {
    int32_t used;
    for (int k = 0; k < max_steps && (w->sc.running.n || w->sc.waiting.n); k++)
        fake_step(w, &used);
    CHECK_EQ_INT(w->sc.running.n + w->sc.waiting.n, 0);
}

static void check_clean(world *w) {
    CHECK_EQ_INT(pgd_kv_check(&w->mgr), 0);
    CHECK_EQ_INT(w->mgr.n_free, w->mgr.n_blocks);
    for (int32_t b = 0; b < w->mgr.n_blocks; b++) CHECK_EQ_INT(w->mgr.blocks[b].ref, 0);
    CHECK_EQ_INT(w->pending, 0);
}

static void test_fcfs_order(void) {
    world w;
    world_init(&w, 64, 64, 2, 2, false);
    for (uint64_t id = 1; id <= 4; id++) add(&w, fake(&w, id, 8, 2, 0, (int32_t)id * 100));
    int32_t used;
    CHECK_EQ_INT(fake_step(&w, &used), 2); /* two slots: the first two arrivals */
    CHECK_EQ_INT(used, 16);
    CHECK_EQ_INT(w.sc.running.head->id, 1);
    CHECK_EQ_INT(w.sc.running.tail->id, 2);
    CHECK_EQ_INT(w.pending, 2);
    run_until_idle(&w, 100);
    CHECK_EQ_INT(w.n_admit, 4);
    for (int i = 0; i < 4; i++) CHECK_EQ_INT(w.admitted[i], i + 1);
    check_clean(&w);
    world_free(&w);
}

static void test_priority_order(void) {
    world w;
    world_init(&w, 64, 64, 1, 1, true);
    add(&w, fake(&w, 1, 8, 4, 3, 100));
    int32_t used;
    fake_step(&w, &used); /* 1 runs */
    add(&w, fake(&w, 2, 8, 4, 2, 200));
    add(&w, fake(&w, 3, 8, 4, -1, 300));
    add(&w, fake(&w, 4, 8, 4, 2, 400));
    /* waiting in (priority, arrival) order */
    CHECK_EQ_INT(w.sc.waiting.head->id, 3);
    CHECK_EQ_INT(w.sc.waiting.head->next->id, 2);
    CHECK_EQ_INT(w.sc.waiting.tail->id, 4);
    fake_step(&w, &used); /* 3 takes the only slot from 1 */
    CHECK_EQ_INT(w.sc.running.head->id, 3);
    CHECK_EQ_INT(w.sc.num_preemptions, 1);
    CHECK_EQ_INT(w.sc.waiting.tail->id, 1); /* the lowest priority, last */
    run_until_idle(&w, 100);
    uint64_t want[4] = {1, 3, 2, 4};
    CHECK_EQ_INT(w.n_admit, 4); /* (first admissions: 1 was admitted before 3 came) */
    for (int i = 0; i < 4; i++) CHECK_EQ_INT(w.admitted[i], want[i]);
    check_clean(&w);
    world_free(&w);
}

static void test_budget_and_chunks(void) {
    world w;
    world_init(&w, 64, 16, 8, 8, false);
    add(&w, fake(&w, 1, 40, 3, 0, 100));
    int32_t used;
    fake_step(&w, &used);
    CHECK_EQ_INT(used, 16);
    CHECK_EQ_INT(w.sc.running.head->n_computed, 16);
    add(&w, fake(&w, 2, 10, 3, 0, 500));
    fake_step(&w, &used); /* 1's next 16; 2 waits: no budget left */
    CHECK_EQ_INT(used, 16);
    CHECK_EQ_INT(w.sc.waiting.n, 1);
    fake_step(&w, &used); /* 1's last 8, then 2's first 8 */
    CHECK_EQ_INT(used, 16);
    CHECK_EQ_INT(w.sc.running.n, 2);
    CHECK_EQ_INT(w.sc.running.tail->n_computed, 8);
    fake_step(&w, &used); /* 1 decodes first (1 token), then 2's last 2 */
    CHECK_EQ_INT(used, 3);
    run_until_idle(&w, 100);
    check_clean(&w);
    world_free(&w);
    /* prompt logprobs: a chunk needs a logits row per position, so 3 rows cut it to 3 tokens */
    world_init(&w, 64, 16, 8, 3, false);
    seq *s = fake(&w, 1, 10, 1, 0, 100);
    s->prompt_lp = true;
    add(&w, s);
    fake_step(&w, &used);
    CHECK_EQ_INT(used, 3);
    fake_step(&w, &used);
    CHECK_EQ_INT(used, 3);
    CHECK_EQ_INT(pgd_sched_chunk_rows(s, 4), 4); /* positions 6..8 owe a logprob, 9 the token */
    run_until_idle(&w, 100);
    check_clean(&w);
    world_free(&w);
}

static void test_preemption_choice(bool priority) {
    world w;
    /* 3 sequences of 8-token prompts in 6 blocks of 4: each needs a third block to decode */
    world_init(&w, 6, 64, 8, 8, priority);
    for (uint64_t id = 1; id <= 3; id++)
        add(&w, fake(&w, id, 8, 6, priority ? (int32_t)(id == 2 ? 5 : 0) : 0, (int32_t)id * 100));
    int32_t used;
    fake_step(&w, &used);
    CHECK_EQ_INT(w.sc.running.n, 3);
    fake_step(&w, &used); /* decodes: 1 needs a block; the victim is the tail */
    uint64_t victim = priority ? 2 : 3;  /* the lowest priority; else the latest admitted */
    CHECK(w.sc.num_preemptions >= 1);
    CHECK_EQ_INT(w.sc.waiting.head->id, victim);
    CHECK_EQ_INT(w.sc.waiting.head->n_computed, 0);
    CHECK_EQ_INT(w.sc.waiting.head->kv.n_blocks, 0);
    run_until_idle(&w, 200);
    check_clean(&w);
    world_free(&w);
}

static void test_prefix_hits(void) {
    world w;
    world_init(&w, 16, 64, 8, 8, false);
    /* (max_tokens 2: a sequence's blocks are committed after a step it survives) */
    add(&w, fake(&w, 1, 17, 2, 0, 100));
    run_until_idle(&w, 10);
    int64_t q0 = w.mgr.stats.prefix_queries, h0 = w.mgr.stats.prefix_hits;
    CHECK_EQ_INT(h0, 0);
    /* the same 16 tokens and more: 4 full blocks cached, never the last token's */
    seq *s = fake(&w, 2, 20, 2, 0, 100);
    add(&w, s);
    int32_t used;
    fake_step(&w, &used);
    CHECK_EQ_INT(used, 4);
    CHECK_EQ_INT(s->n_cached, 16);
    CHECK_EQ_INT(w.mgr.stats.prefix_hits - h0, 16);
    CHECK_EQ_INT(w.mgr.stats.prefix_queries - q0, 20);
    run_until_idle(&w, 10);
    check_clean(&w);
    world_free(&w);
    /* the head does not fit (the blocks are held by a running request): its lookup is undone,
     * counters included, at every step until it is admitted, once */
    world_init(&w, 8, 64, 8, 8, false);
    add(&w, fake(&w, 1, 8, 2, 0, 100));
    run_until_idle(&w, 10);               /* 100..107 cached in two blocks */
    add(&w, fake(&w, 2, 24, 8, 0, 900)); /* 6 blocks, then 7 and 8 as it decodes */
    fake_step(&w, &used);
    seq *t = fake(&w, 3, 13, 1, 0, 100);
    add(&w, t);
    q0 = w.mgr.stats.prefix_queries;
    h0 = w.mgr.stats.prefix_hits;
    fake_step(&w, &used); /* 2 decodes into a 7th block; 3 finds 1 block cached, no free one */
    CHECK_EQ_INT(w.sc.waiting.n, 1);
    CHECK_EQ_INT(w.mgr.stats.prefix_queries, q0);
    CHECK_EQ_INT(w.mgr.stats.prefix_hits, h0);
    CHECK_EQ_INT(t->kv.n_blocks, 0);
    CHECK_EQ_INT(t->n_computed, 0);
    run_until_idle(&w, 100);
    CHECK_EQ_INT(w.mgr.stats.prefix_queries - q0, 13);
    check_clean(&w);
    world_free(&w);
}

/* The disk tier's loading state (the engine's kv_tier.c, faked): the head whose prefix is "on
 * disk" reserves the blocks after its RAM hit, takes a reference on them as the load does, and
 * waits; running sequences keep decoding and nobody behind it is admitted; once the load
 * finishes (some blocks good) the sequence registers them and lets go, and its admission finds
 * them as an ordinary prefix hit, counted once. A sequence aborted mid-load leaves the load's
 * blocks to the load. */
typedef struct fake_disk {
    uint64_t on_disk;  /* the id whose blocks are on disk */
    int32_t blocks[MAXB], n, first;
    seq *loading;
} fake_disk;
static fake_disk fdisk;

static bool hook_disk_lookup(void *ctx, seq *s) {
    world *w = ctx;
    if (s->id != fdisk.on_disk || fdisk.loading) return false;
    int32_t n_ram = s->kv.n_blocks, n_full = (s->n_tokens - 1) / BS;
    if (n_ram >= n_full) return false;
    pgd_kv_copy cp;
    CHECK_EQ_INT(pgd_kv_reserve(&w->mgr, &s->kv, s->n_computed, n_full * BS, &cp), 0);
    CHECK_EQ_INT(cp.n, 0);
    fdisk.n = n_full - n_ram;
    fdisk.first = n_ram;
    for (int32_t i = 0; i < fdisk.n; i++) {
        fdisk.blocks[i] = s->kv.table[n_ram + i];
        pgd_kv_block_ref(&w->mgr, fdisk.blocks[i]);
    }
    s->loading = true;
    fdisk.loading = s;
    return true;
}

/* The load ends with n_ok good blocks; s: the sequence if still queued. */
static void disk_load_done(world *w, seq *s, int32_t n_ok) {
    if (s) {
        int32_t keep = (fdisk.first + n_ok) * BS;
        pgd_kv_truncate(&w->mgr, &s->kv, keep);
        pgd_kv_commit(&w->mgr, &s->kv, s->tokens, keep);
        pgd_kv_release(&w->mgr, &s->kv);
        s->n_computed = 0;
        s->loading = false;
        s->disk_done = true;
    }
    for (int32_t i = fdisk.n - 1; i >= 0; i--) pgd_kv_block_unref(&w->mgr, fdisk.blocks[i]);
    fdisk.n = 0;
    fdisk.loading = NULL;
}

static void test_disk_loading(void) {
    world w;
    world_init(&w, 32, 64, 8, 8, false);
    w.sc.hooks.disk_lookup = hook_disk_lookup;
    memset(&fdisk, 0, sizeof fdisk);
    seq *r = fake(&w, 1, 4, 30, 0, 100);
    add(&w, r);
    int32_t used;
    fake_step(&w, &used);
    fdisk.on_disk = 2;
    seq *s = fake(&w, 2, 17, 2, 0, 500); /* 4 full blocks before its last token */
    seq *x = fake(&w, 3, 4, 2, 0, 900);
    add(&w, s);
    add(&w, x);
    int64_t q0 = w.mgr.stats.prefix_queries, h0 = w.mgr.stats.prefix_hits;
    for (int k = 0; k < 3; k++) { /* r decodes; s waits on its load, x behind it */
        int32_t ns = fake_step(&w, &used);
        CHECK_EQ_INT(ns, 1);
        CHECK(w.batch[0] == r);
        CHECK(s->loading && s->state == SEQ_WAITING && x->state == SEQ_WAITING);
        CHECK_EQ_INT(s->kv.n_blocks, 4);
        CHECK_EQ_INT(w.mgr.stats.prefix_queries, q0); /* (counted at admission) */
    }
    disk_load_done(&w, s, 3); /* the fourth block failed its check: recomputed */
    CHECK_EQ_INT(s->kv.n_blocks, 0);
    CHECK_EQ_INT(pgd_kv_check(&w.mgr), 0);
    CHECK_EQ_INT(w.mgr.n_cached, 3);
    fake_step(&w, &used);
    CHECK(s->state == SEQ_RUNNING && x->state == SEQ_RUNNING);
    CHECK_EQ_INT(s->n_cached, 12);
    CHECK_EQ_INT(w.mgr.stats.prefix_hits - h0, 12);
    CHECK_EQ_INT(w.mgr.stats.prefix_queries - q0, 17 + 4);
    run_until_idle(&w, 100);
    check_clean(&w);
    /* aborted while loading: its blocks stay held by the load until it ends */
    fdisk.on_disk = 4;
    seq *a = fake(&w, 4, 17, 2, 0, 700);
    add(&w, a);
    fake_step(&w, &used);
    CHECK(a->loading);
    finish(&w, a);
    CHECK_EQ_INT(w.mgr.n_free, w.mgr.n_blocks - 4);
    disk_load_done(&w, NULL, 4);
    check_clean(&w);
    world_free(&w);
}

static void test_abort_everywhere(void) {
    world w;
    /* waiting, never admitted */
    world_init(&w, 8, 8, 1, 1, false);
    add(&w, fake(&w, 1, 12, 8, 0, 100));
    add(&w, fake(&w, 2, 4, 4, 0, 200));
    int32_t used;
    fake_step(&w, &used);
    finish(&w, pgd_sched_find(&w.sc, 2));
    CHECK_EQ_INT(w.pending, 0);
    /* running mid-prefill (8 of 12) */
    seq *s = pgd_sched_find(&w.sc, 1);
    CHECK_EQ_INT(s->n_computed, 8);
    finish(&w, s);
    check_clean(&w);
    /* decoding */
    add(&w, fake(&w, 3, 4, 8, 0, 300));
    fake_step(&w, &used);
    fake_step(&w, &used);
    s = pgd_sched_find(&w.sc, 3);
    CHECK(s && s->n_tokens > s->n_prompt);
    finish(&w, s);
    check_clean(&w);
    world_free(&w);
    /* preempted, back in the queue with its blocks freed */
    world_init(&w, 4, 64, 8, 8, false);
    add(&w, fake(&w, 4, 7, 6, 0, 400));
    add(&w, fake(&w, 5, 7, 6, 0, 500));
    for (int k = 0; k < 4 && w.sc.num_preemptions == 0; k++) fake_step(&w, &used);
    CHECK_EQ_INT(w.sc.num_preemptions, 1);
    s = w.sc.waiting.head;
    CHECK(s && s->kv.n_blocks == 0);
    if (s) finish(&w, s);
    run_until_idle(&w, 100);
    check_clean(&w);
    world_free(&w);
}

/* Random arrivals, lengths, shared prefixes, priorities and aborts over a pool small enough to
 * preempt often. */
static void test_random(bool priority) {
    for (int round = 0; round < 20; round++) {
        world w;
        /* (one draw per statement: the same workload whatever the compiler's argument order) */
        int32_t budget = 8 + (int32_t)rnd(40);
        int32_t max_seqs = 1 + (int32_t)rnd(8);
        int32_t n_blocks = 24 + (int32_t)rnd(40);
        int32_t max_logits = max_seqs + (int32_t)rnd(8);
        world_init(&w, n_blocks, budget, max_seqs, max_logits, priority);
        int n_req = 0, n_done_steps_max = 0;
        int arrive[256] = {0};
        uint64_t next = 1;
        int step = 0;
        for (; step < 20000 && (n_req < 60 || w.sc.running.n || w.sc.waiting.n); step++) {
            if (n_req < 60 && rnd(3) == 0) {
                int32_t np = 1 + (int32_t)rnd(40);
                int32_t mt = 1 + (int32_t)rnd(16);
                int32_t prio = priority ? (int32_t)rnd(4) : 0;
                seq *s = fake(&w, next, np, mt, prio, 100 * (int32_t)rnd(4));
                s->prompt_lp = rnd(8) == 0;
                arrive[next] = step;
                next++;
                n_req++;
                add(&w, s);
            }
            if (rnd(25) == 0 && next > 1) { /* abort a random request, wherever it is */
                seq *s = pgd_sched_find(&w.sc, 1 + rnd((uint32_t)(next - 1)));
                if (s) finish(&w, s);
            }
            int32_t used;
            int32_t ns = fake_step(&w, &used);
            CHECK(used <= budget);
            CHECK(ns <= max_seqs);
            CHECK(w.sc.running.n <= max_seqs);
            if (step % 97 == 0) CHECK_EQ_INT(pgd_kv_check(&w.mgr), 0);
            /* no one waits forever: whatever waits was queued a bounded time ago */
            if (!priority && w.sc.waiting.head) {
                int waited = step - arrive[w.sc.waiting.head->id];
                if (waited > n_done_steps_max) n_done_steps_max = waited;
            }
        }
        CHECK(step < 20000);
        CHECK(n_done_steps_max < 2000);
        CHECK_EQ_INT(w.sc.running.n + w.sc.waiting.n, 0);
        if (!priority) /* fcfs: first admissions in arrival order */
            for (int i = 1; i < w.n_admit; i++) CHECK(w.admitted[i] > w.admitted[i - 1]);
        check_clean(&w);
        world_free(&w);
    }
}

int main(void) {
    test_fcfs_order();
    test_priority_order();
    test_budget_and_chunks();
    test_preemption_choice(false);
    test_preemption_choice(true);
    test_prefix_hits();
    test_abort_everywhere();
    test_disk_loading();
    test_random(false);
    test_random(true);
    return test_report("test_scheduler");
}
