/* Engine block accounting under a seeded random workload: thousands of steps with random
 * submissions (greedy and sampled, stop strings, shared prefixes), random aborts at any point,
 * and a KV pool small enough to force preemption, first come first served and under priority
 * scheduling with random priorities. Afterwards every block is free or cached, reference counts
 * are zero and the pool is consistent; every request got exactly one finish event.
 * Priority scheduling: requests start and finish in (priority, arrival) order, a higher
 * priority preempts a lower one for a sequence slot or for KV blocks, and every output equals
 * the request's output run alone. Model: the real stories260K (tests/data). */
#include <stdlib.h>
#include <string.h>

#include "engine/engine_internal.h"
#include "pagoda/pagoda.h"
#include "test.h"

static uint64_t rs = 0x2545f4914f6cdd1dull;
static uint32_t rnd(uint32_t n) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (uint32_t)(rs % n);
}

#define MAXREQ 4096

/* The default engine configuration on the real stories260K, two threads. */
static void stories_config(pgd_engine_config *c) {
    pgd_engine_config_default(c);
    c->model_path = "tests/data/models/stories260K.gguf";
    c->n_threads = 2;
}

/* Runs 12 greedy requests through e, synchronously or on the engine thread (submitting from
 * this thread while it runs), and collects each request's tokens. */
static void run_requests(pgd_engine *e, bool threaded, int32_t out[12][40], int32_t n_out[12]) {
    uint64_t ids[12];
    char err[256];
    memset(n_out, 0, 12 * sizeof *n_out);
    if (threaded) CHECK_EQ_INT(pgd_engine_start(e, NULL, NULL), 0);
    for (int r = 0; r < 12; r++) {
        int32_t prompt[64];
        prompt[0] = 1;
        for (int i = 1; i < 10 + r * 4; i++) prompt[i] = 3 + (i * 37 + r * 11) % 500;
        pgd_request_params p = {.prompt = prompt, .n_prompt = 10 + r * 4, .max_tokens = 40,
                                .ignore_eos = true};
        CHECK_EQ_INT(pgd_engine_submit(e, &p, &ids[r], err, sizeof err), 0);
    }
    int done = 0;
    pgd_event ev[64];
    while (done < 12) {
        if (!threaded) pgd_engine_step(e);
        int n = pgd_engine_poll(e, ev, 64, threaded ? 1000 : 0);
        for (int i = 0; i < n; i++) {
            int r = (int)(ev[i].request_id - ids[0]);
            CHECK(r >= 0 && r < 12);
            if (r < 0 || r >= 12) continue;
            if (ev[i].type == PGD_EVENT_TOKEN && n_out[r] < 40) out[r][n_out[r]++] = ev[i].token;
            if (ev[i].type == PGD_EVENT_FINISH) done++;
        }
    }
    if (threaded) pgd_engine_stop(e);
}

static void test_threaded_matches_sync(void) {
    pgd_engine_config c;
    stories_config(&c);
    pgd_engine *e;
    char err[256];
    CHECK_EQ_INT(pgd_engine_create(&c, &e, err, sizeof err), 0);
    static int32_t a[12][40], b[12][40];
    int32_t na[12], nb[12];
    run_requests(e, false, a, na);
    run_requests(e, true, b, nb);
    for (int r = 0; r < 12; r++) {
        CHECK_EQ_INT(na[r], 40);
        CHECK_EQ_INT(nb[r], 40);
        CHECK(memcmp(a[r], b[r], sizeof a[r]) == 0);
    }
    CHECK_EQ_INT(pgd__engine_check(e), 0);
    pgd_engine_free(e);
}

/* Greedy request r of the priority tests: a prompt of its own, 24 tokens. */
#define PR_TOK 24
static void pr_params(int r, int32_t prompt[80], pgd_request_params *p) {
    int32_t n = 20 + r * 7;
    prompt[0] = 1;
    for (int32_t i = 1; i < n; i++) prompt[i] = 3 + (i * 53 + r * 29) % 500;
    *p = (pgd_request_params){.prompt = prompt, .n_prompt = n, .max_tokens = PR_TOK,
                              .ignore_eos = true};
}

/* Steps e until it is idle (or max_steps steps, if not negative), appending request ids (minus
 * base) in the order of their first token and of their finish, and each request's tokens. */
static void pr_run(pgd_engine *e, int max_steps, uint64_t base, int *first, int *n_first,
                   int *fin, int *n_fin, int32_t out[][PR_TOK], int32_t *n_out) {
    pgd_event ev[64];
    for (int k = 0; k != max_steps && pgd_engine_has_work(e); k++) {
        pgd_engine_step(e);
        int n;
        while ((n = pgd_engine_poll(e, ev, 64, 0)) > 0)
            for (int i = 0; i < n; i++) {
                int r = (int)(ev[i].request_id - base);
                if (ev[i].type == PGD_EVENT_TOKEN) {
                    if (n_out[r] == 0) first[(*n_first)++] = r;
                    if (n_out[r] < PR_TOK) out[r][n_out[r]++] = ev[i].token;
                }
                if (ev[i].type == PGD_EVENT_FINISH) fin[(*n_fin)++] = r;
            }
    }
}

/* Each of n requests run alone: the reference outputs. */
static void pr_reference(int n, int32_t ref[][PR_TOK]) {
    pgd_engine_config c;
    stories_config(&c);
    pgd_engine *e;
    char err[256];
    CHECK_EQ_INT(pgd_engine_create(&c, &e, err, sizeof err), 0);
    for (int r = 0; r < n; r++) {
        int32_t prompt[80], n_out[1] = {0};
        int first[1], fin[1], nf = 0, nn = 0;
        pgd_request_params p;
        pr_params(r, prompt, &p);
        uint64_t id;
        CHECK_EQ_INT(pgd_engine_submit(e, &p, &id, err, sizeof err), 0);
        pr_run(e, -1, id, first, &nf, fin, &nn, ref + r, n_out);
        CHECK_EQ_INT(n_out[0], PR_TOK);
    }
    pgd_engine_free(e);
}

/* One sequence slot: a request of priority 3 is running when four more arrive; the one of
 * priority -1 preempts it at once, and the rest follow in (priority, arrival) order. */
static void test_priority_slots(const int32_t ref[][PR_TOK]) {
    pgd_engine_config c;
    stories_config(&c);
    c.max_num_seqs = 1;
    c.priority_scheduling = true;
    pgd_engine *e;
    char err[256];
    CHECK_EQ_INT(pgd_engine_create(&c, &e, err, sizeof err), 0);
    static const int32_t prio[5] = {3, 5, -1, 5, 0};
    static int32_t out[5][PR_TOK];
    int32_t n_out[5] = {0}, prompt[80];
    int first[5], fin[5], nf = 0, nn = 0;
    uint64_t base = 0;
    for (int r = 0; r < 5; r++) {
        pgd_request_params p;
        pr_params(r, prompt, &p);
        p.priority = prio[r];
        uint64_t id;
        CHECK_EQ_INT(pgd_engine_submit(e, &p, &id, err, sizeof err), 0);
        if (r == 0) { /* request 0 starts and decodes a few tokens */
            base = id;
            pr_run(e, 4, base, first, &nf, fin, &nn, out, n_out);
            CHECK(n_out[0] > 0);
        }
    }
    pr_run(e, -1, base, first, &nf, fin, &nn, out, n_out);
    static const int want_first[5] = {0, 2, 4, 1, 3}, want_fin[5] = {2, 4, 0, 1, 3};
    CHECK_EQ_INT(nf, 5);
    CHECK_EQ_INT(nn, 5);
    for (int i = 0; i < 5; i++) {
        CHECK_EQ_INT(first[i], want_first[i]);
        CHECK_EQ_INT(fin[i], want_fin[i]);
        CHECK_EQ_INT(n_out[i], PR_TOK);
        CHECK(memcmp(out[i], ref[i], sizeof out[i]) == 0);
    }
    pgd_engine_stats st;
    pgd_engine_get_stats(e, &st);
    CHECK_EQ_INT(st.num_preemptions, 1);
    CHECK_EQ_INT(pgd__engine_check(e), 0);
    pgd_engine_free(e);
}

/* KV blocks: six requests of priority 1 fill a small pool (10 blocks of 16 tokens); a request
 * of priority 0 arriving later starts at the next step, preempting lower ones for its blocks.
 * First come, first served makes it wait, and refuses a priority. Returns its finish rank. */
static int test_priority_blocks(const int32_t ref[][PR_TOK], bool priority) {
    pgd_engine_config c;
    stories_config(&c);
    c.kv_cache_bytes = 10 * 16 * 1280;
    c.priority_scheduling = priority;
    pgd_engine *e;
    char err[256];
    CHECK_EQ_INT(pgd_engine_create(&c, &e, err, sizeof err), 0);
    static int32_t out[7][PR_TOK];
    int32_t n_out[7] = {0}, prompt[80];
    int first[7], fin[7], nf = 0, nn = 0;
    uint64_t base = 0, id;
    pgd_request_params p;
    for (int r = 0; r < 6; r++) {
        pr_params(r, prompt, &p);
        p.priority = priority;
        CHECK_EQ_INT(pgd_engine_submit(e, &p, &id, err, sizeof err), 0);
        if (!r) base = id;
    }
    pr_run(e, 3, base, first, &nf, fin, &nn, out, n_out);
    pgd_engine_stats st;
    pgd_engine_get_stats(e, &st);
    CHECK(st.num_waiting > 0); /* the pool is full */
    pr_params(6, prompt, &p);
    p.priority = 1;
    if (!priority) CHECK(pgd_engine_submit(e, &p, &id, err, sizeof err) != 0);
    p.priority = 0;
    CHECK_EQ_INT(pgd_engine_submit(e, &p, &id, err, sizeof err), 0);
    CHECK_EQ_INT((int)(id - base), 6);
    pr_run(e, 1, base, first, &nf, fin, &nn, out, n_out);
    CHECK((n_out[6] > 0) == priority); /* its whole prompt fits in one step's budget */
    pr_run(e, -1, base, first, &nf, fin, &nn, out, n_out);
    pgd_engine_get_stats(e, &st);
    CHECK(st.num_preemptions > 0 || !priority);
    CHECK_EQ_INT(nn, 7);
    int rank = -1;
    for (int i = 0; i < 7; i++) {
        CHECK_EQ_INT(n_out[i], PR_TOK);
        CHECK(memcmp(out[i], ref[i], sizeof out[i]) == 0);
        if (fin[i] == 6) rank = i;
    }
    CHECK_EQ_INT(pgd__engine_check(e), 0);
    pgd_engine_free(e);
    return rank;
}

static void test_random_workload(bool priority) {
    pgd_engine_config c;
    stories_config(&c);
    c.kv_cache_bytes = 48 * 16 * 1280; /* 48 blocks of 16 tokens (1,280 bytes per token) */
    c.max_num_batched_tokens = 48;
    c.max_num_seqs = 16;
    c.priority_scheduling = priority;
    pgd_engine *e;
    char err[256];
    CHECK_EQ_INT(pgd_engine_create(&c, &e, err, sizeof err), 0);
    static int finishes[MAXREQ + 1];
    static bool submitted[MAXREQ + 1];
    memset(finishes, 0, sizeof finishes);
    memset(submitted, 0, sizeof submitted);
    int32_t prompt[400];
    const char *stops[] = {"Lily", "."};
    int n_sub = 0, n_abort = 0, n_fin = 0, n_tok = 0;
    pgd_event ev[128];
    for (int step = 0; step < 2000; step++) {
        if (rnd(6) == 0 && n_sub < MAXREQ) {
            int32_t n = 1 + (int32_t)rnd(200);
            prompt[0] = 1;
            for (int32_t i = 1; i < n; i++) prompt[i] = i < 64 ? 300 + i : 3 + (int32_t)rnd(509);
            pgd_request_params p = {.prompt = prompt, .n_prompt = n,
                                    .max_tokens = 1 + (int32_t)rnd(100),
                                    .temperature = rnd(2) ? 0.0f : 0.8f, .top_p = 0.9f,
                                    .seed = rnd(1000), .ignore_eos = rnd(2),
                                    .stop = stops, .n_stop = (int32_t)rnd(3),
                                    .priority = priority ? (int32_t)rnd(5) - 2 : 0};
            uint64_t id;
            if (pgd_engine_submit(e, &p, &id, err, sizeof err) == 0) {
                CHECK(id <= MAXREQ);
                submitted[id] = true;
                n_sub++;
            }
        }
        if (rnd(8) == 0 && n_sub > 0) {
            pgd_engine_abort(e, 1 + rnd((uint32_t)n_sub)); /* may hit finished ones: ignored */
            n_abort++;
        }
        pgd_engine_step(e);
        int n;
        while ((n = pgd_engine_poll(e, ev, 128, 0)) > 0)
            for (int i = 0; i < n; i++) {
                if (ev[i].type == PGD_EVENT_FINISH) {
                    finishes[ev[i].request_id]++;
                    n_fin++;
                } else {
                    n_tok++;
                }
            }
        if (step % 50 == 0) CHECK_EQ_INT(pgd__engine_check(e), 0);
    }
    /* drain */
    while (pgd_engine_has_work(e)) {
        pgd_engine_step(e);
        int n;
        while ((n = pgd_engine_poll(e, ev, 128, 0)) > 0)
            for (int i = 0; i < n; i++)
                if (ev[i].type == PGD_EVENT_FINISH) {
                    finishes[ev[i].request_id]++;
                    n_fin++;
                }
    }
    CHECK_EQ_INT(pgd__engine_check(e), 0);
    pgd_engine_stats st;
    pgd_engine_get_stats(e, &st);
    CHECK_EQ_INT(st.kv_blocks_used, 0);
    CHECK_EQ_INT(st.num_running, 0);
    CHECK_EQ_INT(st.num_waiting, 0);
    CHECK(st.num_preemptions > 0);
    CHECK(st.prefix_cache_hits > 0);
    for (int id = 1; id <= MAXREQ; id++) CHECK_EQ_INT(finishes[id], submitted[id] ? 1 : 0);
    CHECK_EQ_INT(n_fin, n_sub);
    printf("engine random workload (%s): %d requests, %d abort calls, %d tokens, "
           "%lld preemptions, %lld prefix-hit tokens, %lld steps\n",
           priority ? "priority" : "fcfs", n_sub, n_abort, n_tok,
           (long long)st.num_preemptions, (long long)st.prefix_cache_hits, (long long)st.steps);
    pgd_engine_free(e);
}

int main(void) {
    test_threaded_matches_sync();
    static int32_t ref[7][PR_TOK];
    pr_reference(7, ref);
    test_priority_slots(ref);
    int rank_prio = test_priority_blocks(ref, true), rank_fcfs = test_priority_blocks(ref, false);
    printf("a late request of a higher priority finishes %d of 7 (first come first served: %d)\n",
           rank_prio + 1, rank_fcfs + 1);
    CHECK(rank_prio >= 0 && rank_prio < rank_fcfs);
    test_random_workload(false);
    test_random_workload(true);
    return test_report("test_engine");
}
