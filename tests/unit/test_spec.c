/* Speculative decoding inside the engine: block accounting stays exact through thousands of
 * rejected proposals (rolled back), with random submissions, aborts, stop strings, prefix
 * caching and preemption, for both proposers; and greedy speculation reproduces plain greedy
 * output token for token. Model: the real stories260K (tests/data), also as its own draft. */
#include <stdlib.h>
#include <string.h>

#include "engine/engine_internal.h"
#include "pagoda/pagoda.h"
#include "test.h"

#define MODEL "tests/data/models/stories260K.gguf"
#define MAXREQ 4096
/* thousands of rejections per mode at this length (the counts are printed) */
#define WORKLOAD_STEPS 600

static uint64_t rs = 0x5851f42d4c957f2dull;
static uint32_t rnd(uint32_t n) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (uint32_t)(rs % n);
}

static void config(pgd_engine_config *c, pgd_spec_mode mode) {
    pgd_engine_config_default(c);
    c->model_path = MODEL;
    c->n_threads = 2;
    c->speculative = mode;
    c->num_speculative_tokens = 6;
    c->draft_model_path = mode == PGD_SPEC_DRAFT ? MODEL : NULL;
}

/* A prompt that repeats itself, so n-gram lookup always finds something to propose. */
static int32_t make_prompt(int32_t *prompt, int32_t n) {
    int32_t period = 3 + (int32_t)rnd(20);
    prompt[0] = 1;
    for (int32_t i = 1; i < n; i++) prompt[i] = i <= period ? 3 + (int32_t)rnd(509) : prompt[i - period];
    return n;
}

static void random_workload(pgd_spec_mode mode) {
    pgd_engine_config c;
    config(&c, mode);
    c.kv_cache_bytes = 48 * 16 * 1280; /* 48 blocks of 16 tokens: preemption */
    c.max_num_batched_tokens = 64;
    c.max_num_seqs = 16;
    pgd_engine *e;
    char err[256];
    CHECK_EQ_INT(pgd_engine_create(&c, &e, err, sizeof err), 0);
    static int finishes[MAXREQ + 1];
    static bool submitted[MAXREQ + 1], no_spec[MAXREQ + 1];
    memset(finishes, 0, sizeof finishes);
    memset(submitted, 0, sizeof submitted);
    memset(no_spec, 0, sizeof no_spec);
    int64_t fin_draft = 0, fin_accepted = 0; /* per-request counts from FINISH events */
    int32_t prompt[400];
    const char *stops[] = {"Lily", "."};
    int n_sub = 0, n_fin = 0;
    pgd_event ev[128];
    for (int step = 0; step < WORKLOAD_STEPS || pgd_engine_has_work(e); step++) {
        if (step < WORKLOAD_STEPS && rnd(5) == 0 && n_sub < MAXREQ) {
            int32_t n = make_prompt(prompt, 1 + (int32_t)rnd(200));
            pgd_request_params p = {.prompt = prompt, .n_prompt = n,
                                    .max_tokens = 1 + (int32_t)rnd(120),
                                    .temperature = rnd(3) ? 1.0f : 0.0f, .top_p = 1,
                                    .seed = rnd(1000), .ignore_eos = rnd(2),
                                    .stop = stops, .n_stop = (int32_t)rnd(3),
                                    .no_speculation = rnd(10) == 0, .logprobs = -1};
            if (rnd(4) == 0) p.top_p = 0.9f;
            uint64_t id;
            if (pgd_engine_submit(e, &p, &id, err, sizeof err) == 0) {
                CHECK(id <= MAXREQ);
                submitted[id] = true;
                no_spec[id] = p.no_speculation;
                n_sub++;
            }
        }
        if (step < WORKLOAD_STEPS && rnd(10) == 0 && n_sub > 0) pgd_engine_abort(e, 1 + rnd((uint32_t)n_sub));
        pgd_engine_step(e);
        int n;
        while ((n = pgd_engine_poll(e, ev, 128, 0)) > 0)
            for (int i = 0; i < n; i++)
                if (ev[i].type == PGD_EVENT_FINISH) {
                    finishes[ev[i].request_id]++;
                    n_fin++;
                    CHECK(ev[i].n_spec_accepted >= 0 &&
                          ev[i].n_spec_accepted <= ev[i].n_spec_draft_tokens);
                    if (no_spec[ev[i].request_id]) CHECK_EQ_INT(ev[i].n_spec_draft_tokens, 0);
                    fin_draft += ev[i].n_spec_draft_tokens;
                    fin_accepted += ev[i].n_spec_accepted;
                }
        if (step % 10 == 0) CHECK_EQ_INT(pgd__engine_check(e), 0);
    }
    CHECK_EQ_INT(pgd__engine_check(e), 0);
    pgd_engine_stats st;
    pgd_engine_get_stats(e, &st);
    CHECK_EQ_INT(st.kv_blocks_used, 0);
    CHECK_EQ_INT(st.num_running + st.num_waiting, 0);
    CHECK(st.num_preemptions > 0);
    int64_t rejected = st.spec_draft_tokens - st.spec_accepted_tokens;
    CHECK(rejected > 500); /* hundreds of rollbacks per mode (about 760 and 1,240 at 600 steps) */
    CHECK(st.spec_accepted_tokens > 100);
    int64_t per_pos = 0;
    for (int k = 0; k < PGD_SPEC_MAX_TOKENS; k++) per_pos += st.spec_accepted_per_pos[k];
    CHECK_EQ_INT(per_pos, st.spec_accepted_tokens);
    /* every request, aborted ones included, reports its share exactly once */
    CHECK_EQ_INT(fin_draft, st.spec_draft_tokens);
    CHECK_EQ_INT(fin_accepted, st.spec_accepted_tokens);
    for (int id = 1; id <= MAXREQ; id++) CHECK_EQ_INT(finishes[id], submitted[id] ? 1 : 0);
    CHECK_EQ_INT(n_fin, n_sub);
    printf("%s: %d requests, %lld verifications, %lld proposed, %lld accepted, %lld rejected, "
           "%lld preemptions, %lld steps\n", mode == PGD_SPEC_NGRAM ? "ngram" : "draft", n_sub,
           (long long)st.spec_drafts, (long long)st.spec_draft_tokens,
           (long long)st.spec_accepted_tokens, (long long)rejected,
           (long long)st.num_preemptions, (long long)st.steps);
    pgd_engine_free(e);
}

/* Runs n greedy requests to completion; out[r] gets request r's tokens. */
static void run_greedy(pgd_spec_mode mode, int n, int32_t out[][64], int32_t *n_out,
                       int64_t *accepted, int32_t disable_by, int64_t *drafted) {
    pgd_engine_config c;
    config(&c, mode);
    c.max_num_batched_tokens = 48;
    c.speculative_disable_by_batch_size = disable_by;
    pgd_engine *e;
    char err[256];
    CHECK_EQ_INT(pgd_engine_create(&c, &e, err, sizeof err), 0);
    uint64_t first = 0;
    rs = 0x1234567ull;
    for (int r = 0; r < n; r++) {
        int32_t prompt[300];
        int32_t np = make_prompt(prompt, 2 + (int32_t)rnd(250));
        pgd_request_params p = {.prompt = prompt, .n_prompt = np, .max_tokens = 64,
                                .ignore_eos = r % 3 != 0, .logprobs = -1,
                                .repetition_penalty = r % 4 == 1 ? 1.3f : 0,
                                .presence_penalty = r % 4 == 2 ? 0.5f : 0};
        uint64_t id;
        CHECK_EQ_INT(pgd_engine_submit(e, &p, &id, err, sizeof err), 0);
        if (r == 0) first = id;
        n_out[r] = 0;
    }
    pgd_event ev[128];
    while (pgd_engine_has_work(e)) {
        pgd_engine_step(e);
        int m;
        while ((m = pgd_engine_poll(e, ev, 128, 0)) > 0)
            for (int i = 0; i < m; i++) {
                int r = (int)(ev[i].request_id - first);
                if (ev[i].type == PGD_EVENT_TOKEN && n_out[r] < 64) out[r][n_out[r]++] = ev[i].token;
            }
    }
    CHECK_EQ_INT(pgd__engine_check(e), 0);
    pgd_engine_stats st;
    pgd_engine_get_stats(e, &st);
    *accepted = st.spec_accepted_tokens;
    if (drafted) *drafted = st.spec_draft_tokens;
    pgd_engine_free(e);
}

static void test_greedy_exact(void) {
    enum { N = 24 };
    static int32_t a[N][64], b[N][64], d[N][64];
    int32_t na[N], nb[N], nd[N];
    int64_t acc_a, acc_b, acc_d;
    run_greedy(PGD_SPEC_NONE, N, a, na, &acc_a, 0, NULL);
    run_greedy(PGD_SPEC_NGRAM, N, b, nb, &acc_b, 0, NULL);
    run_greedy(PGD_SPEC_DRAFT, N, d, nd, &acc_d, 0, NULL);
    for (int r = 0; r < N; r++) {
        CHECK_EQ_INT(nb[r], na[r]);
        CHECK_EQ_INT(nd[r], na[r]);
        CHECK(memcmp(a[r], b[r], (size_t)na[r] * sizeof a[r][0]) == 0);
        CHECK(memcmp(a[r], d[r], (size_t)na[r] * sizeof a[r][0]) == 0);
    }
    CHECK_EQ_INT(acc_a, 0);
    CHECK(acc_b > 20);
    CHECK(acc_d > 100);

    /* --speculative-disable-by-batch-size: 1 turns every proposal off; 4 only while 4 or more
     * requests run (the last few still speculate). Outputs never change. */
    static int32_t o1[N][64], o4[N][64];
    int32_t n1[N], n4[N];
    int64_t acc1, acc4, dr1, dr4, dr_all;
    run_greedy(PGD_SPEC_NGRAM, N, o1, n1, &acc1, 1, &dr1);
    run_greedy(PGD_SPEC_NGRAM, N, o4, n4, &acc4, 4, &dr4);
    run_greedy(PGD_SPEC_NGRAM, N, b, nb, &acc_b, 0, &dr_all);
    CHECK_EQ_INT(dr1, 0);
    CHECK_EQ_INT(acc1, 0);
    CHECK(dr4 > 0 && dr4 < dr_all);
    for (int r = 0; r < N; r++) {
        CHECK_EQ_INT(n1[r], na[r]);
        CHECK_EQ_INT(n4[r], na[r]);
        CHECK(memcmp(a[r], o1[r], (size_t)na[r] * sizeof a[r][0]) == 0);
        CHECK(memcmp(a[r], o4[r], (size_t)na[r] * sizeof a[r][0]) == 0);
    }
}

static void test_bad_config(void) {
    pgd_engine_config c;
    config(&c, PGD_SPEC_DRAFT);
    c.draft_model_path = NULL;
    pgd_engine *e;
    char err[256];
    CHECK(pgd_engine_create(&c, &e, err, sizeof err) != 0);
    config(&c, PGD_SPEC_NGRAM);
    c.num_speculative_tokens = PGD_SPEC_MAX_TOKENS + 1;
    CHECK(pgd_engine_create(&c, &e, err, sizeof err) != 0);
}

int main(void) {
    test_bad_config();
    test_greedy_exact();
    random_workload(PGD_SPEC_NGRAM);
    random_workload(PGD_SPEC_DRAFT);
    return test_report("test_spec");
}
