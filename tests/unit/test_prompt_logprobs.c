/* Prompt logprobs (pgd_request_params.prompt_logprobs: completions' echo with logprobs) against
 * the unbatched path: every prompt token's event carries exactly the logprob and top
 * alternatives that pgd_logprobs gives (and the rank: 1 + the tokens scored above it) on the
 * single-sequence session's logits of the position
 * before it, whatever the engine did to get there -- prompts chunked across steps by the token
 * budget and by the logits rows a step holds, mixed with other requests' prefills and decodes,
 * preempted and recomputed, after the same prompt filled the prefix cache, with n-gram
 * speculation on. The CPU backend is batch invariant, so the values are compared for equality.
 * The generated tokens equal those of the same request without prompt logprobs.
 * Model: the real stories260K (tests/data). */
#include <stdlib.h>
#include <string.h>

#include "engine/engine_internal.h"
#include "pagoda/pagoda.h"
#include "sample/sampler.h"
#include "test_session.h"

#define STORIES "tests/data/models/stories260K.gguf"
enum { NREQ = 10, MAXP = 160, MAXTOK = 12, TOP = 3 };

static int32_t prompts[NREQ][MAXP];
static int32_t n_prompts[NREQ];

/* Per request: the prompt events (token, logprob, tops) and the generated tokens. */
typedef struct result {
    int32_t n_ev, pos[MAXP], tok[MAXP], n_top[MAXP], rank[MAXP], top_ids[MAXP][TOP];
    float lp[MAXP], top_lp[MAXP][TOP];
    int32_t n_gen, gen[MAXTOK];
    int finishes;
    bool gen_before_prompt_done; /* a generated token came before the last prompt event */
} result;

static void make_prompts(void) {
    static const int32_t lens[NREQ] = {1, 2, 37, 150, 90, 150, 9, 64, 37, 120};
    for (int r = 0; r < NREQ; r++) {
        n_prompts[r] = lens[r];
        prompts[r][0] = 1;
        for (int32_t i = 1; i < lens[r]; i++) prompts[r][i] = 3 + (i * 37 + (r % 5) * 11) % 500;
    }
    /* request 5 repeats request 3's prompt, 8 repeats 2's: the prefix cache holds them */
    memcpy(prompts[5], prompts[3], sizeof prompts[3]);
    memcpy(prompts[8], prompts[2], sizeof prompts[2]);
}

/* Runs every request through one engine; with_lp[r] says which ask for prompt logprobs. */
static void run(const pgd_engine_config *c, const bool *with_lp, result *res) {
    pgd_engine *e;
    char err[256];
    CHECK_EQ_INT(pgd_engine_create(c, &e, err, sizeof err), 0);
    memset(res, 0, NREQ * sizeof *res);
    uint64_t ids[NREQ];
    for (int r = 0; r < NREQ; r++) {
        pgd_request_params p = {.prompt = prompts[r], .n_prompt = n_prompts[r],
                                .max_tokens = MAXTOK, .ignore_eos = true,
                                .logprobs = with_lp[r] ? TOP : -1,
                                .prompt_logprobs = with_lp[r], .prompt_top_logprobs = TOP};
        CHECK_EQ_INT(pgd_engine_submit(e, &p, &ids[r], err, sizeof err), 0);
        /* the later ones arrive while the first ones run */
        if (r < 4) pgd_engine_step(e);
    }
    pgd_event ev[64];
    for (int guard = 0; pgd_engine_has_work(e) && guard < 100000; guard++) {
        pgd_engine_step(e);
        int n;
        while ((n = pgd_engine_poll(e, ev, 64, 0)) > 0)
            for (int i = 0; i < n; i++) {
                int r = (int)(ev[i].request_id - ids[0]);
                CHECK(r >= 0 && r < NREQ);
                if (r < 0 || r >= NREQ) continue;
                result *q = &res[r];
                if (ev[i].type == PGD_EVENT_FINISH) q->finishes++;
                if (ev[i].type == PGD_EVENT_TOKEN && q->n_gen < MAXTOK) {
                    q->gen[q->n_gen++] = ev[i].token;
                    if (q->n_ev < n_prompts[r]) q->gen_before_prompt_done = true;
                }
                if (ev[i].type != PGD_EVENT_PROMPT_TOKEN || q->n_ev >= MAXP) continue;
                int32_t k = q->n_ev++;
                q->pos[k] = ev[i].text_offset;
                q->tok[k] = ev[i].token;
                q->n_top[k] = ev[i].n_top;
                q->rank[k] = ev[i].rank;
                q->lp[k] = ev[i].logprob;
                for (int j = 0; j < TOP && j < ev[i].n_top; j++) {
                    q->top_ids[k][j] = ev[i].top_ids[j];
                    q->top_lp[k][j] = ev[i].top_logprobs[j];
                }
            }
    }
    CHECK_EQ_INT(pgd__engine_check(e), 0);
    pgd_engine_stats st;
    pgd_engine_get_stats(e, &st);
    printf("  %lld steps, %lld preemptions, prefix-cache hits %lld of %lld tokens\n",
           (long long)st.steps, (long long)st.num_preemptions, (long long)st.prefix_cache_hits,
           (long long)st.prefix_cache_queries);
    pgd_engine_free(e);
}

/* Checks the prompt events of request r against the session's logits of its prompt. */
static void check_prompt(pgd_session *ss, int r, const result *q) {
    int32_t n = n_prompts[r], nv = ss->model->cfg.n_vocab;
    CHECK_EQ_INT(q->n_ev, n);
    CHECK(!q->gen_before_prompt_done);
    if (q->n_ev != n) return;
    ss->n_past = 0;
    CHECK_EQ_INT(pgd_session_forward(ss, prompts[r], n, true), 0);
    int bad = 0;
    for (int32_t i = 0; i < n; i++) {
        bad += q->pos[i] != i || q->tok[i] != prompts[r][i];
        if (i == 0) {
            bad += q->n_top[0] != -1;
            continue;
        }
        int32_t tid[TOP];
        float tlp[TOP];
        float want = pgd_logprobs(ss->logits + (size_t)(i - 1) * nv, nv, prompts[r][i], TOP, tid,
                                  tlp);
        const float *lg = ss->logits + (size_t)(i - 1) * nv;
        int32_t above = 0;
        for (int32_t t = 0; t < nv; t++) above += lg[t] > lg[prompts[r][i]];
        bad += q->n_top[i] != TOP || q->lp[i] != want || q->rank[i] != above + 1;
        for (int j = 0; j < TOP; j++)
            bad += q->top_ids[i][j] != tid[j] || q->top_lp[i][j] != tlp[j];
    }
    CHECK_EQ_INT(bad, 0);
}

static void check_config(const char *what, pgd_engine_config *c, pgd_session *ss) {
    printf("%s\n", what);
    static result plain[NREQ], scored[NREQ];
    bool none[NREQ] = {0}, lp[NREQ];
    for (int r = 0; r < NREQ; r++) lp[r] = r != 6; /* one request without, sharing the steps */
    run(c, none, plain);
    run(c, lp, scored);
    for (int r = 0; r < NREQ; r++) {
        CHECK_EQ_INT(plain[r].finishes, 1);
        CHECK_EQ_INT(scored[r].finishes, 1);
        CHECK_EQ_INT(plain[r].n_ev, 0);
        CHECK_EQ_INT(scored[r].n_gen, MAXTOK);
        CHECK(memcmp(plain[r].gen, scored[r].gen, sizeof plain[r].gen) == 0);
        if (lp[r]) check_prompt(ss, r, &scored[r]);
        else CHECK_EQ_INT(scored[r].n_ev, 0);
    }
}

/* max_tokens 0: the prompt alone -- its scores when asked, then a LENGTH finish with nothing
 * generated; a prompt as long as the context fits. */
static void test_prompt_only(pgd_session *ss) {
    pgd_engine_config c;
    pgd_engine_config_default(&c);
    c.model_path = STORIES;
    c.n_threads = 2;
    c.max_num_seqs = 4;
    c.max_num_batched_tokens = 32;
    pgd_engine *e;
    char err[256];
    CHECK_EQ_INT(pgd_engine_create(&c, &e, err, sizeof err), 0);
    static int32_t full[512];
    int32_t n_ctx = pgd_engine_n_ctx(e);
    CHECK(n_ctx <= 512);
    for (int32_t i = 0; i < n_ctx; i++) full[i] = 3 + (i * 29) % 500;
    struct { const int32_t *p; int32_t n; bool lp; } q[4] = {
        {prompts[2], n_prompts[2], true}, {prompts[2], n_prompts[2], false},
        {prompts[0], 1, true}, {full, n_ctx, false}};
    uint64_t ids[4];
    int32_t n_ev[4] = {0}, n_tok[4] = {0}, fin[4] = {0}, n_comp[4] = {0}, bad = 0;
    for (int r = 0; r < 4; r++) {
        pgd_request_params p = {.prompt = q[r].p, .n_prompt = q[r].n, .max_tokens = 0,
                                .logprobs = -1, .prompt_logprobs = q[r].lp,
                                .prompt_top_logprobs = TOP};
        CHECK_EQ_INT(pgd_engine_submit(e, &p, &ids[r], err, sizeof err), 0);
    }
    int32_t nv = ss->model->cfg.n_vocab;
    ss->n_past = 0;
    CHECK_EQ_INT(pgd_session_forward(ss, prompts[2], n_prompts[2], true), 0);
    pgd_event ev[64];
    for (int guard = 0; pgd_engine_has_work(e) && guard < 10000; guard++) {
        pgd_engine_step(e);
        int n;
        while ((n = pgd_engine_poll(e, ev, 64, 0)) > 0)
            for (int i = 0; i < n; i++) {
                int r = (int)(ev[i].request_id - ids[0]);
                if (r < 0 || r >= 4) continue;
                if (ev[i].type == PGD_EVENT_TOKEN) n_tok[r]++;
                if (ev[i].type == PGD_EVENT_FINISH) {
                    fin[r] = ev[i].finish_reason;
                    n_comp[r] = ev[i].n_completion;
                }
                if (ev[i].type != PGD_EVENT_PROMPT_TOKEN) continue;
                int32_t k = ev[i].text_offset;
                n_ev[r]++;
                if (r == 0 && k > 0) { /* the scores of request 0, as the session gives them */
                    int32_t tid[TOP];
                    float tlp[TOP];
                    bad += ev[i].logprob != pgd_logprobs(ss->logits + (size_t)(k - 1) * nv, nv,
                                                         prompts[2][k], TOP, tid, tlp);
                }
            }
    }
    CHECK_EQ_INT(bad, 0);
    for (int r = 0; r < 4; r++) {
        CHECK_EQ_INT(n_tok[r], 0);
        CHECK_EQ_INT(fin[r], PGD_FINISH_LENGTH);
        CHECK_EQ_INT(n_comp[r], 0);
        CHECK_EQ_INT(n_ev[r], q[r].lp ? q[r].n : 0);
    }
    CHECK_EQ_INT(pgd__engine_check(e), 0);
    pgd_engine_free(e);
}

int main(void) {
    make_prompts();
    test_session t;
    test_session_open(&t, STORIES, MAXP);
    pgd_session *ss = &t.ss;
    test_prompt_only(ss);

    pgd_engine_config c;
    pgd_engine_config_default(&c);
    c.model_path = STORIES;
    c.n_threads = 2;
    c.max_num_seqs = 4; /* 4 logits rows a step: a scored prompt goes 4 positions at a time */
    c.max_num_batched_tokens = 32;
    check_config("few logits rows, prefix caching on", &c, ss);
    c.max_num_seqs = 16;
    c.max_num_batched_tokens = 48;
    c.kv_cache_bytes = 14 * 16 * 1280; /* 14 blocks of 16 tokens: preemption */
    check_config("small KV pool (preemption)", &c, ss);
    pgd_engine_config_default(&c);
    c.model_path = STORIES;
    c.n_threads = 2;
    c.max_num_seqs = 3;
    c.max_num_batched_tokens = 40;
    c.speculative = PGD_SPEC_NGRAM;
    c.num_speculative_tokens = 3;
    check_config("n-gram speculation", &c, ss);
    test_session_close(&t);
    return test_report("test_prompt_logprobs");
}
