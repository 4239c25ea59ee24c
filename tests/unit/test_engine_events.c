/* The engine's events (issue 34): exactly one FINISH per submitted request whatever malloc does,
 * and a poll that never waits on a step in progress.
 * - Fault injection: this test links with malloc, calloc, realloc and strdup wrapped
 *   (CMakeLists.txt); for every k, the k-th allocation after a request is submitted fails --
 *   in submit, in the step's sampler, constraints, detokenizer, outbox -- and the request either
 *   is refused at submit (no id, no event) or gets exactly one FINISH, the block pool consistent
 *   afterwards. Request kinds: prompt logprobs, logprobs, stop strings and stop ids, sampled;
 *   choices; a regex; a grammar; a JSON schema; one aborted mid-generation.
 * - Poll latency: while a step on another thread masks a grammar up to its 10^7-step work limit
 *   (about 100 ms over llama-2-tiny-random's 32,000 tokens), polls return in microseconds: a
 *   tenth of the step at most (before issue 34 they waited for the whole step).
 * Models: stories260K and llama-2-tiny-random (tests/data). */
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "engine/engine_internal.h"
#include "pagoda/pagoda.h"
#include "test.h"

/* ---- the failing allocator: the k-th allocation from test_fail_at(k) on returns NULL ---- */

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t m);
void *__real_realloc(void *p, size_t n);
char *__real_strdup(const char *s);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t n, size_t m);
void *__wrap_realloc(void *p, size_t n);
char *__wrap_strdup(const char *s);

static long fail_at = -1, n_calls; /* (atomics: the pool's threads allocate too) */

static bool fail_now(void) {
    if (__atomic_load_n(&fail_at, __ATOMIC_RELAXED) < 0) return false;
    return __atomic_fetch_add(&n_calls, 1, __ATOMIC_RELAXED) ==
           __atomic_load_n(&fail_at, __ATOMIC_RELAXED);
}
void *__wrap_malloc(size_t n) { return fail_now() ? NULL : __real_malloc(n); }
void *__wrap_calloc(size_t n, size_t m) { return fail_now() ? NULL : __real_calloc(n, m); }
void *__wrap_realloc(void *p, size_t n) { return fail_now() ? NULL : __real_realloc(p, n); }
char *__wrap_strdup(const char *s) { return fail_now() ? NULL : __real_strdup(s); }

static void test_fail_at(long k) {
    __atomic_store_n(&n_calls, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&fail_at, k, __ATOMIC_RELAXED);
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void stories_config(pgd_engine_config *c) {
    pgd_engine_config_default(c);
    c->model_path = "tests/data/models/stories260K.gguf";
    c->n_threads = 1;
}

/* ---- exactly one FINISH under allocation failure ---- */

enum { K_PLAIN, K_CHOICES, K_REGEX, K_GRAMMAR, K_SCHEMA, K_ABORT, K_COUNT };
static const char *kind_name[K_COUNT] = {"plain", "choices", "regex", "grammar", "schema",
                                         "abort"};

static void kind_params(int kind, int32_t *prompt, pgd_request_params *p) {
    static const char *stop[2] = {"zqzq", "Once upon"};
    static const int32_t stop_ids[1] = {500};
    static const char *choices[2] = {"yes", "no way"};
    prompt[0] = 1;
    for (int i = 1; i < 300; i++) prompt[i] = 3 + (i * 37) % 500;
    *p = (pgd_request_params){.prompt = prompt, .n_prompt = 12, .max_tokens = 12};
    switch (kind) {
    case K_PLAIN: /* the most per-request state without a constraint; 300 prompt events */
        p->n_prompt = 300;
        p->prompt_logprobs = true;
        p->prompt_top_logprobs = 2;
        p->logprobs = 3;
        p->stop = stop;
        p->n_stop = 2;
        p->stop_token_ids = stop_ids;
        p->n_stop_token_ids = 1;
        p->temperature = 0.8f;
        p->seed = 7;
        p->ignore_eos = true;
        break;
    case K_CHOICES:
        p->choices = choices;
        p->n_choices = 2;
        break;
    case K_REGEX: p->regex = "[a-z ]{1,12}\\."; break;
    case K_GRAMMAR: p->grammar = "root ::= \"a\" [b-z ]* \".\""; break;
    case K_SCHEMA:
        p->json_schema = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},"
                         "\"required\":[\"a\"]}";
        break;
    case K_ABORT: p->ignore_eos = true; break;
    }
}

/* One life of a request of the kind with allocation k failing: false once no allocation
 * failed (k is past the last one). */
static bool faulty_life(int kind, long k) {
    pgd_engine_config c;
    stories_config(&c);
    pgd_engine *e;
    char err[256];
    CHECK_EQ_INT(pgd_engine_create(&c, &e, err, sizeof err), 0);
    static int32_t prompt[300];
    pgd_request_params p;
    kind_params(kind, prompt, &p);
    uint64_t id = 0;
    test_fail_at(k);
    int rc = pgd_engine_submit(e, &p, &id, err, sizeof err);
    int n_fin = 0, n_other = 0, steps = 0;
    pgd_event ev[64];
    while (!rc && pgd_engine_has_work(e) && steps < 200) {
        pgd_engine_step(e);
        if (kind == K_ABORT && ++steps == 3) pgd_engine_abort(e, id);
        if (kind != K_PLAIN) /* (the plain kind leaves its events queued: the outbox grows) */
            for (int n; (n = pgd_engine_poll(e, ev, 64, 0)) > 0;)
                for (int i = 0; i < n; i++) {
                    n_fin += ev[i].type == PGD_EVENT_FINISH;
                    n_other += ev[i].request_id != id;
                }
    }
    bool failed = __atomic_load_n(&n_calls, __ATOMIC_RELAXED) > k;
    test_fail_at(-1);
    for (int n; (n = pgd_engine_poll(e, ev, 64, 0)) > 0;)
        for (int i = 0; i < n; i++) {
            n_fin += ev[i].type == PGD_EVENT_FINISH;
            n_other += ev[i].request_id != id;
        }
    if (rc) { /* refused: nothing was queued, nothing comes */
        CHECK(rc < 0);
        CHECK(failed);
        CHECK_EQ_INT(n_fin, 0);
    } else {
        CHECK(!pgd_engine_has_work(e));
        if (n_fin != 1)
            fprintf(stderr, "%s: allocation %ld failing: %d FINISH events\n", kind_name[kind],
                    k, n_fin);
        CHECK_EQ_INT(n_fin, 1);
    }
    CHECK_EQ_INT(n_other, 0);
    CHECK_EQ_INT(pgd__engine_check(e), 0);
    pgd_engine_free(e);
    return failed;
}

static void test_finish_survives_oom(void) {
    for (int kind = 0; kind < K_COUNT; kind++) {
        long k = 0;
        while (k < 20000 && faulty_life(kind, k)) k++;
        printf("%s: a FINISH with each of its %ld allocations failing\n", kind_name[kind], k);
        CHECK(k > 5 && k < 20000);
    }
}

/* ---- poll does not wait on a step ---- */

typedef struct {
    pgd_engine *e;
    double max_step;
    volatile bool done;
} stepper;

static void *step_thread(void *arg) {
    stepper *st = arg;
    while (pgd_engine_has_work(st->e)) {
        double t0 = now_s();
        pgd_engine_step(st->e);
        double dt = now_s() - t0;
        if (dt > st->max_step) st->max_step = dt;
    }
    st->done = true;
    return NULL;
}

static void count_finishes(const pgd_event *ev, int n, uint64_t id_slow, int *n_fin,
                           bool *slow_err) {
    for (int i = 0; i < n; i++) {
        if (ev[i].type != PGD_EVENT_FINISH) continue;
        (*n_fin)++;
        if (ev[i].request_id == id_slow)
            *slow_err = ev[i].finish_reason == PGD_FINISH_ERROR &&
                        strstr(ev[i].error, "too ambiguous");
    }
}

static void test_poll_during_slow_step(void) {
    pgd_engine_config c;
    stories_config(&c);
    c.model_path = "tests/data/models/llama-2-tiny-random.gguf"; /* 32,000 tokens to mask */
    pgd_engine *e;
    char err[256];
    CHECK_EQ_INT(pgd_engine_create(&c, &e, err, sizeof err), 0);
    int32_t prompt[64];
    size_t n_prompt;
    const char *text = "Once upon a time";
    CHECK_EQ_INT(pgd_engine_tokenize(e, text, strlen(text), true, false, prompt, 64, &n_prompt),
                 0);
    /* a grammar whose first mask runs to the work limit (test_grammar.py), and a plain request
     * whose events are there to poll */
    pgd_request_params slow = {.prompt = prompt, .n_prompt = (int32_t)n_prompt, .max_tokens = 8,
                               .grammar = "root ::= x{0,30} [^\\n]*\nx ::= [^\\n]{0,30}"};
    pgd_request_params plain = {.prompt = prompt, .n_prompt = (int32_t)n_prompt,
                                .max_tokens = 40, .ignore_eos = true};
    uint64_t id_slow, id_plain;
    CHECK_EQ_INT(pgd_engine_submit(e, &plain, &id_plain, err, sizeof err), 0);
    CHECK_EQ_INT(pgd_engine_submit(e, &slow, &id_slow, err, sizeof err), 0);
    stepper st = {.e = e};
    pthread_t t;
    CHECK_EQ_INT(pthread_create(&t, NULL, step_thread, &st), 0);
    double max_poll = 0;
    int n_polls = 0, n_fin = 0;
    bool slow_err = false;
    pgd_event ev[16];
    while (!st.done) {
        double t0 = now_s();
        int n = pgd_engine_poll(e, ev, 16, 0);
        double dt = now_s() - t0;
        if (dt > max_poll) max_poll = dt;
        n_polls++;
        count_finishes(ev, n, id_slow, &n_fin, &slow_err);
        struct timespec ts = {0, 200000};
        nanosleep(&ts, NULL);
    }
    pthread_join(t, NULL);
    for (int n; (n = pgd_engine_poll(e, ev, 16, 0)) > 0;)
        count_finishes(ev, n, id_slow, &n_fin, &slow_err);
    printf("slowest step %.1f ms; slowest of %d polls meanwhile %.3f ms\n", st.max_step * 1e3,
           n_polls, max_poll * 1e3);
    CHECK_EQ_INT(n_fin, 2);
    CHECK(slow_err);
    CHECK(st.max_step > 0.02); /* the step really was slow: the check below means something */
    CHECK(max_poll < st.max_step / 10);
    CHECK_EQ_INT(pgd__engine_check(e), 0);
    pgd_engine_free(e);
}

int main(void) {
    test_poll_during_slow_step();
    test_finish_survives_oom();
    return test_report("test_engine_events");
}
