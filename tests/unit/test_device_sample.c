/* Sampling on the backend (src/sample/device_sample.c, the CPU backend's sample op, the engine's
 * device-sampling path): the threshold algorithm keeps exactly the CPU chain's tokens with the
 * same renormalised probabilities on random rows (vocabularies of 1 to 50k, peaked, flat, with
 * exact ties); greedy is pgd_argmax; draws follow the chain's distribution; and the engine with
 * PAGODA_DEVICE_SAMPLING=1 on stories260K: greedy output equal to the default path, seeded
 * output reproducible and equal to a replay of the reference, requests with logprobs or
 * penalties served by the host chain as before. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "model/model.h"
#include "pagoda/pagoda.h"
#include "sample/device_sample.h"
#include "sample/sampler.h"
#include "test_session.h"

static uint64_t rs = 0x9e3779b97f4a7c15ull;
static uint64_t rnd64(void) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return rs;
}
static uint32_t rnd(uint32_t n) { return (uint32_t)(rnd64() % n); }
static double unif(void) { return (double)(rnd64() >> 11) * 0x1.0p-53; }
static double gauss(void) {
    double a = unif() + 1e-300, b = unif();
    return sqrt(-2 * log(a)) * cos(6.283185307179586 * b);
}

#define MAXV 50000

static float logits[MAXV];
static pgd_token_prob kept[MAXV];

static int by_id(const void *a, const void *b) {
    const pgd_token_prob *x = a, *y = b;
    return (x->id > y->id) - (x->id < y->id);
}

/* Fills logits[0..n) in one of several shapes. */
static void fill(int32_t n, int shape) {
    switch (shape) {
    case 0: /* peaked: a few large logits over a normal background */
        for (int32_t i = 0; i < n; i++) logits[i] = (float)(gauss() * 2.0);
        for (int j = 0; j < 5; j++) logits[rnd((uint32_t)n)] += 8.0f + (float)unif() * 4;
        break;
    case 1: /* flat: small noise */
        for (int32_t i = 0; i < n; i++) logits[i] = (float)(unif() * 1e-3);
        break;
    case 2: /* all equal: every probability is exactly 1 */
        for (int32_t i = 0; i < n; i++) logits[i] = 0.5f;
        break;
    case 3: /* a few levels: exact ties everywhere, the top one included */
        for (int32_t i = 0; i < n; i++) logits[i] = (float)(int)rnd(6) * 0.75f - 2.0f;
        break;
    case 4: /* wide: most probabilities underflow or are denormal */
        for (int32_t i = 0; i < n; i++) logits[i] = (float)(gauss() * 40.0);
        break;
    default: /* normal, some -inf */
        for (int32_t i = 0; i < n; i++)
            logits[i] = rnd(10) == 0 ? -INFINITY : (float)(gauss() * 3.0);
        logits[rnd((uint32_t)n)] = 1.0f;
        break;
    }
}

static pgd_sample_row random_row(int32_t n) {
    static const float temps[] = {0.05f, 0.3f, 0.7f, 1.0f, 1.5f, 4.0f};
    static const float top_ps[] = {1.0f, 1.0f, 0.95f, 0.9f, 0.5f, 0.1f, 0.999f};
    static const float min_ps[] = {0.0f, 0.0f, 0.01f, 0.05f, 0.2f, 0.9f};
    pgd_sample_row r = {.temperature = temps[rnd(6)], .top_p = top_ps[rnd(7)],
                        .min_p = min_ps[rnd(6)], .u = (float)unif()};
    switch (rnd(6)) {
    case 0: r.top_k = 0; break;
    case 1: r.top_k = 2; break;
    case 2: r.top_k = 40; break;
    case 3: r.top_k = 1 + (int32_t)rnd((uint32_t)n + 4); break;
    case 4: r.top_k = n; break;
    default: r.top_k = 1000; break;
    }
    if (rnd(5) == 0) r.top_p = 0.05f + 0.95f * (float)unif();
    if (rnd(5) == 0) r.min_p = (float)unif() * 0.3f;
    return r;
}

/* (a) The kept set and its probabilities against pgd_sampler_dist_compute. */
static void test_kept_set(void) {
    static const int32_t sizes[] = {1, 2, 3, 5, 17, 100, 256, 1000, 4099, 32000, 50000};
    pgd_sampler_scratch sc;
    CHECK_EQ_INT(pgd_sampler_scratch_init(&sc, MAXV, NULL, 0, NULL), 0);
    int cases = 0, bad_set = 0, bad_p = 0, tie_cuts = 0;
    double worst = 0;
    for (int it = 0; it < 1500; it++) {
        int32_t n = sizes[it % 11];
        if (n >= 4099 && it % 5 != 0) n = 2 + (int32_t)rnd(600); /* keep the run short */
        fill(n, (int)rnd(6));
        pgd_sample_row r = random_row(n);
        sc.n_vocab = n;
        pgd_sampler s;
        pgd_sampler_params sp = {.temperature = r.temperature, .top_p = r.top_p,
                                 .top_k = r.top_k, .min_p = r.min_p, .seed = 1};
        CHECK_EQ_INT(pgd_sampler_init(&s, &sp, &sc, NULL), 0);
        pgd_sampler_dist d;
        pgd_sampler_dist_compute(&s, logits, NULL, 0, 0, &d);
        pgd_sampler_free(&s);
        qsort(d.cand, (size_t)d.n, sizeof *d.cand, by_id);
        int32_t nk = pgd_device_sample_kept(logits, n, &r, kept);
        cases++;
        bool same = nk == d.n;
        for (int32_t i = 0; same && i < nk; i++) same = kept[i].id == d.cand[i].id;
        if (!same) {
            if (bad_set++ < 5)
                fprintf(stderr, "kept set differs: n=%d T=%g k=%d p=%g min_p=%g: %d vs %d\n", n,
                        r.temperature, r.top_k, r.top_p, r.min_p, nk, d.n);
            continue;
        }
        /* a cut inside a run of equal probabilities: a dropped token ties the smallest kept */
        if (r.temperature > 0 && r.top_k != 1 && nk < n) {
            float inv_t = 1.0f / r.temperature, mx = -INFINITY, lo = INFINITY;
            for (int32_t i = 0; i < n; i++) {
                float w = logits[i] * inv_t;
                if (w > mx) mx = w;
            }
            for (int32_t i = 0; i < nk; i++) {
                float w = logits[kept[i].id] * inv_t, q = expf(w - mx);
                if (q < lo) lo = q;
            }
            for (int32_t i = 0, j = 0; i < n; i++) {
                if (j < nk && kept[j].id == i) {
                    j++;
                    continue;
                }
                float w = logits[i] * inv_t;
                if (expf(w - mx) == lo) {
                    tie_cuts++;
                    break;
                }
            }
        }
        for (int32_t i = 0; i < nk; i++) {
            double e = fabs((double)kept[i].p - d.cand[i].p) / d.cand[i].p;
            if (e > worst) worst = e;
            if (e > 1e-5) bad_p++;
        }
    }
    sc.n_vocab = MAXV;
    pgd_sampler_scratch_free(&sc);
    printf("kept sets: %d cases (%d cut inside a run of ties), %d differ; probabilities: worst "
           "relative difference %.2e\n", cases, tie_cuts, bad_set, worst);
    CHECK(tie_cuts > 50);
    CHECK_EQ_INT(bad_set, 0);
    CHECK_EQ_INT(bad_p, 0);
}

/* Hand-made rows where the cut falls inside a run of equal probabilities. */
static void test_ties(void) {
    /* ids 0..9 all equal: top_k 4 keeps 0..3 */
    for (int i = 0; i < 10; i++) logits[i] = 1.0f;
    pgd_sample_row r = {.temperature = 1, .top_p = 1, .top_k = 4};
    CHECK_EQ_INT(pgd_device_sample_kept(logits, 10, &r, kept), 4);
    CHECK_EQ_INT(kept[3].id, 3);
    /* top_p 0.45 of 10 equal tokens: the fewest reaching 4.5 of 10 are 5 */
    r = (pgd_sample_row){.temperature = 1, .top_p = 0.45f};
    CHECK_EQ_INT(pgd_device_sample_kept(logits, 10, &r, kept), 5);
    CHECK_EQ_INT(kept[4].id, 4);
    /* one larger token then ties: top_k 3 keeps it and the two lowest ids of the rest */
    logits[7] = 3.0f;
    r = (pgd_sample_row){.temperature = 1, .top_p = 1, .top_k = 3};
    CHECK_EQ_INT(pgd_device_sample_kept(logits, 10, &r, kept), 3);
    CHECK(kept[0].id == 0 && kept[1].id == 1 && kept[2].id == 7);
    /* top_k then top_p inside the same run: k = 6 keeps 7, 0..4; top_p then trims to 7, 0, 1 */
    r = (pgd_sample_row){.temperature = 1, .top_p = 0.7f, .top_k = 6};
    int32_t n = pgd_device_sample_kept(logits, 10, &r, kept);
    float e = expf(-2.0f); /* each tie's probability relative to token 7 */
    double total = 1 + 5 * (double)e, cum = 1;
    int32_t want = 1;
    while (cum < 0.7 * total) {
        cum += e;
        want++;
    }
    CHECK_EQ_INT(n, want);
    CHECK_EQ_INT(kept[n - 1].id, 7);
    /* min_p at exactly a tie's probability keeps the ties (p >= min_p * p_max) */
    r = (pgd_sample_row){.temperature = 1, .top_p = 1, .min_p = e};
    CHECK_EQ_INT(pgd_device_sample_kept(logits, 10, &r, kept), 10);
    r.min_p = nextafterf(e, 1.0f);
    CHECK_EQ_INT(pgd_device_sample_kept(logits, 10, &r, kept), 1);
    /* vocabulary of one */
    r = (pgd_sample_row){.temperature = 1, .top_p = 0.5f, .top_k = 3, .min_p = 0.5f, .u = 0.9f};
    CHECK_EQ_INT(pgd_device_sample_row(logits, 1, &r), 0);
}

/* (b) Greedy rows are pgd_argmax, ties to the lowest id. */
static void test_greedy(void) {
    for (int it = 0; it < 300; it++) {
        int32_t n = 1 + (int32_t)rnd(3000);
        fill(n, (int)rnd(6));
        pgd_sample_row r = random_row(n);
        if (it % 2) r.temperature = 0;
        else r.top_k = 1;
        CHECK_EQ_INT(pgd_device_sample_row(logits, n, &r), pgd_argmax(logits, n));
    }
    float t[6] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    pgd_sample_row r = {.temperature = 1, .top_p = 1, .u = 0.5f};
    CHECK_EQ_INT(pgd_device_sample_row(t, 6, &r), 0); /* nothing finite: the arg-max */
    t[4] = 2;
    t[2] = 2;
    CHECK_EQ_INT(pgd_device_sample_row(t, 6, &r), 4); /* two kept tokens of mass 1: r = 1 */
    r.u = 0.25f;
    CHECK_EQ_INT(pgd_device_sample_row(t, 6, &r), 2);
    r.temperature = 0;
    r.u = 0.75f;
    CHECK_EQ_INT(pgd_device_sample_row(t, 6, &r), 2);
}

/* Counts of n draws against the chain's probabilities: each within 5 standard deviations of its
 * binomial count, never a token the chain drops. Returns the largest deviation in deviations. */
static double check_binomial(const long *count, const double *want, int nv, long n) {
    double worst = 0;
    for (int i = 0; i < nv && n > 0; i++) {
        double f = (double)count[i] / (double)n, sd = sqrt(want[i] * (1 - want[i]) / (double)n);
        if (want[i] == 0) CHECK_EQ_INT(count[i], 0);
        else CHECK(fabs(f - want[i]) <= 5 * sd);
        if (sd > 0 && fabs(f - want[i]) / sd > worst) worst = fabs(f - want[i]) / sd;
    }
    return worst;
}

/* (c) Draws with many u follow the chain's probabilities; u walks the kept tokens in id order. */
static void test_draws(void) {
    const float L[10] = {1.0f, 3.0f, 2.0f, -1.0f, 0.5f, 2.5f, -2.0f, 0.0f, 2.0f, 1.5f};
    pgd_sampler_scratch sc;
    CHECK_EQ_INT(pgd_sampler_scratch_init(&sc, 10, NULL, 0, NULL), 0);
    pgd_sampler s;
    pgd_sampler_params sp = {.temperature = 0.8f, .top_p = 0.95f, .top_k = 7, .min_p = 0.03f,
                             .seed = 42};
    CHECK_EQ_INT(pgd_sampler_init(&s, &sp, &sc, NULL), 0);
    pgd_sampler_dist d;
    pgd_sampler_dist_compute(&s, L, NULL, 0, 0, &d);
    double want[10] = {0};
    for (int32_t i = 0; i < d.n; i++) want[d.cand[i].id] = d.cand[i].p;
    enum { N = 400000 };
    static long count[10];
    pgd_sample_row r = {.temperature = sp.temperature, .top_p = sp.top_p, .min_p = sp.min_p,
                        .top_k = sp.top_k};
    for (int i = 0; i < N; i++) {
        r.u = pgd_sampler_uniform_f32(&s);
        count[pgd_device_sample_row(L, 10, &r)]++;
    }
    double worst = check_binomial(count, want, 10, N);
    printf("draws: %d, %d kept tokens, largest deviation %.2f standard deviations (bound 5)\n", N,
           d.n, worst);
    /* u = 0: the lowest kept id; u just below 1: the highest */
    int32_t lo = 10, hi = -1;
    for (int32_t i = 0; i < d.n; i++) {
        if (d.cand[i].id < lo) lo = d.cand[i].id;
        if (d.cand[i].id > hi) hi = d.cand[i].id;
    }
    r.u = 0;
    CHECK_EQ_INT(pgd_device_sample_row(L, 10, &r), lo);
    r.u = 0x1.fffffep-1f;
    CHECK_EQ_INT(pgd_device_sample_row(L, 10, &r), hi);
    pgd_sampler_free(&s);
    pgd_sampler_scratch_free(&sc);
}

/* The backend op (CPU: the reference over the pool; CUDA, where a device exists: the kernel)
 * against the reference row by row, and the distribution of its draws. The kernel's expf may
 * differ from the host's in the last bit, which would reorder nearly equal probabilities: the
 * logits here sit on a grid of 1/8 (equal ones tie exactly on both, others differ by 13% or
 * more), so only a cut or a draw that lands within rounding of a boundary may differ. */
static void test_backend_op(const pgd_backend_ops *ops, int device, pgd_pool *pool) {
    enum { ROWS = 48, NV = 32000, DRAW_ROWS = 4096, DRAW_CALLS = 50, DNV = 10 };
    pgd_backend be = {.ops = ops, .device = device, .pool = pool};
    pgd_err err = {{0}};
    CHECK(ops->sample != NULL);
    if (!ops->sample || ops->init(&be, DRAW_ROWS, 4 * 64, 1, 1, 64, &err)) {
        CHECK(!"backend initialises");
        return;
    }
    static float lg[(size_t)ROWS * NV], dl[(size_t)DRAW_ROWS * DNV];
    static pgd_sample_row rows[DRAW_ROWS];
    static int32_t out[DRAW_ROWS];
    for (int i = 0; i < ROWS; i++) {
        for (int32_t j = 0; j < NV; j++)
            lg[(size_t)i * NV + j] = rnd(50) == 0 ? -INFINITY : roundf((float)gauss() * 24) / 8;
        rows[i] = random_row(NV);
        if (i % 8 == 3) rows[i].temperature = 0;
        if (i % 8 == 5) rows[i].u = 0;
        if (i % 8 == 7) rows[i].u = 0x1.fffffep-1f;
    }
    float *d = ops->alloc(&be, sizeof lg);
    CHECK(d != NULL);
    int same = 0, greedy_bad = 0;
    if (d && ops->upload(&be, d, lg, sizeof lg) == 0 &&
        ops->sample(&be, d, ROWS, NV, rows, out) == 0) {
        for (int i = 0; i < ROWS; i++) {
            int32_t want = pgd_device_sample_row(lg + (size_t)i * NV, NV, &rows[i]);
            same += out[i] == want;
            if (rows[i].temperature == 0 || rows[i].top_k == 1) greedy_bad += out[i] != want;
        }
    } else {
        CHECK(!"upload and sample");
    }
    printf("%s op: %d of %d rows equal the reference\n", ops->name, same, ROWS);
    CHECK_EQ_INT(greedy_bad, 0);
    CHECK(ops->host_memory ? same == ROWS : same >= ROWS - 2);
    if (d) ops->mem_free(&be, d);
    /* draws: DRAW_CALLS x DRAW_ROWS rows of one distribution, u from one generator */
    const float L[DNV] = {1.0f, 3.0f, 2.0f, -1.0f, 0.5f, 2.5f, -2.0f, 0.0f, 2.0f, 1.5f};
    pgd_sampler_scratch sc;
    CHECK_EQ_INT(pgd_sampler_scratch_init(&sc, DNV, NULL, 0, NULL), 0);
    pgd_sampler s;
    pgd_sampler_params sp = {.temperature = 1.2f, .top_p = 0.9f, .top_k = 8, .min_p = 0.02f,
                             .seed = 7};
    CHECK_EQ_INT(pgd_sampler_init(&s, &sp, &sc, NULL), 0);
    pgd_sampler_dist dist;
    pgd_sampler_dist_compute(&s, L, NULL, 0, 0, &dist);
    double want[DNV] = {0};
    for (int32_t i = 0; i < dist.n; i++) want[dist.cand[i].id] = dist.cand[i].p;
    for (int i = 0; i < DRAW_ROWS; i++) memcpy(dl + (size_t)i * DNV, L, sizeof L);
    float *dd = ops->alloc(&be, sizeof dl);
    long count[DNV] = {0}, n = 0;
    if (dd && ops->upload(&be, dd, dl, sizeof dl) == 0)
        for (int c = 0; c < DRAW_CALLS; c++) {
            for (int i = 0; i < DRAW_ROWS; i++) {
                rows[i] = (pgd_sample_row){.temperature = sp.temperature, .top_p = sp.top_p,
                                           .min_p = sp.min_p, .top_k = sp.top_k,
                                           .u = pgd_sampler_uniform_f32(&s)};
            }
            if (ops->sample(&be, dd, DRAW_ROWS, DNV, rows, out)) break;
            for (int i = 0; i < DRAW_ROWS; i++) count[out[i]]++;
            n += DRAW_ROWS;
        }
    CHECK_EQ_INT(n, (long)DRAW_ROWS * DRAW_CALLS);
    double worst = check_binomial(count, want, DNV, n);
    printf("%s op: %ld draws, largest deviation %.2f standard deviations (bound 5)\n", ops->name,
           n, worst);
    if (dd) ops->mem_free(&be, dd);
    pgd_sampler_free(&s);
    pgd_sampler_scratch_free(&sc);
    ops->free(&be);
}

static void test_backend_ops(void) {
    pgd_pool *pool;
    CHECK_EQ_INT(pgd_pool_create(2, &pool, NULL), 0);
    test_backend_op(&pgd_cpu_backend_ops, 0, pool);
    if (pgd_cuda_backend_ops() && pgd_cuda_device_count() > 0)
        test_backend_op(pgd_cuda_backend_ops(), 0, pool);
    pgd_pool_free(pool);
}

/* pgd_model_forward with batch->sample: one rank (the backend's op; the logits stay where
 * they are unless need_logits) and two (gathered on the host, sampled there by rank 0) give the
 * reference's token for each row of the logits. */
static void test_forward(int tp) {
    pgd_err err = {{0}};
    pgd_model_opts mo = {.n_ctx = 64, .tensor_parallel = tp};
    pgd_model *m;
    CHECK_EQ_INT(pgd_model_load("tests/data/models/stories260K.gguf", &mo, &m, &err), 0);
    pgd_pool *pool;
    CHECK_EQ_INT(pgd_pool_create(2, &pool, NULL), 0);
    pgd_kv_cache kv;
    CHECK_EQ_INT(pgd_kv_cache_init(&kv, m, PGD_TYPE_F32, 8, 16, &err), 0);
    pgd_fwd f;
    CHECK_EQ_INT(pgd_fwd_init(&f, m, pool, 32, 8, &err), 0);
    enum { N = 24 };
    int32_t tok[N], pos[N], seq[N], rows[3] = {7, 15, 23}, t0[4] = {0, 1, 2, 3};
    int32_t t1[4] = {4, 5, 6, 7}, t2[4] = {2, 6, 5, 0}, sampled[3];
    int64_t slot[N];
    const int32_t *tables[3] = {t0, t1, t2};
    for (int i = 0; i < N; i++) {
        seq[i] = i / 8;
        pos[i] = i % 8;
        tok[i] = 1 + (i * 97) % (m->cfg.n_vocab - 1);
        slot[i] = (int64_t)tables[seq[i]][0] * 16 + pos[i];
    }
    pgd_sample_row sr[3] = {{.temperature = 0.9f, .top_p = 0.9f, .top_k = 40, .u = 0.37f},
                            {.temperature = 0},
                            {.temperature = 1.3f, .top_p = 1, .min_p = 0.02f, .u = 0.81f}};
    pgd_batch b = {.n_tokens = N, .tokens = tok, .pos = pos, .seq = seq, .slot = slot,
                   .block_tables = tables, .n_logits = 3, .logit_rows = rows, .sample = sr,
                   .sampled = sampled, .need_logits = true};
    CHECK_EQ_INT(pgd_model_forward(&f, &kv, &b), 0);
    int32_t nv = m->cfg.n_vocab;
    for (int i = 0; i < 3; i++)
        CHECK_EQ_INT(sampled[i], pgd_device_sample_row(f.logits + (size_t)i * nv, nv, &sr[i]));
    CHECK_EQ_INT(sampled[1], pgd_argmax(f.logits + nv, nv));
    pgd_fwd_free(&f);
    pgd_kv_cache_free(&kv);
    pgd_pool_free(pool);
    pgd_model_free(m);
}

/* ---- the engine ---- */

#define STORIES "tests/data/models/stories260K.gguf"
#define NREQ 9
#define MAXTOK 40

/* Runs reqs through a fresh engine with PAGODA_DEVICE_SAMPLING=mode (NULL: unset) and collects
 * each request's tokens and, for the first token of each, its number of top logprobs. */
static void run_engine(const char *mode, const pgd_request_params *reqs, int n,
                       int32_t out[][MAXTOK], int32_t *n_out, int32_t *n_top) {
    if (mode) setenv("PAGODA_DEVICE_SAMPLING", mode, 1);
    else unsetenv("PAGODA_DEVICE_SAMPLING");
    pgd_engine_config c;
    pgd_engine_config_default(&c);
    c.model_path = STORIES;
    c.n_threads = 2;
    pgd_engine *e;
    char err[256];
    CHECK_EQ_INT(pgd_engine_create(&c, &e, err, sizeof err), 0);
    unsetenv("PAGODA_DEVICE_SAMPLING");
    uint64_t ids[NREQ];
    for (int r = 0; r < n; r++) {
        CHECK_EQ_INT(pgd_engine_submit(e, &reqs[r], &ids[r], err, sizeof err), 0);
        n_out[r] = 0;
        n_top[r] = -1;
    }
    int done = 0;
    pgd_event ev[64];
    while (done < n) {
        pgd_engine_step(e);
        int k;
        while ((k = pgd_engine_poll(e, ev, 64, 0)) > 0)
            for (int i = 0; i < k; i++) {
                int r = (int)(ev[i].request_id - ids[0]);
                if (r < 0 || r >= n) continue;
                if (ev[i].type == PGD_EVENT_FINISH) done++;
                if (ev[i].type != PGD_EVENT_TOKEN || n_out[r] >= MAXTOK) continue;
                if (n_out[r] == 0) n_top[r] = ev[i].n_top;
                out[r][n_out[r]++] = ev[i].token;
            }
    }
    pgd_engine_free(e);
}

static int32_t prompts[NREQ][48];

static pgd_request_params request(int r, float temperature) {
    int32_t n = 6 + 4 * r;
    prompts[r][0] = 1;
    for (int32_t i = 1; i < n; i++) prompts[r][i] = 3 + (i * 53 + r * 17) % 500;
    return (pgd_request_params){.prompt = prompts[r], .n_prompt = n, .max_tokens = MAXTOK,
                                .temperature = temperature, .top_p = 1, .seed = 1000 + r,
                                .ignore_eos = true, .logprobs = -1};
}

/* The device path of one request replayed on a single-sequence session: every token from the
 * reference with u from the request's own generator. */
static void replay(const pgd_request_params *q, int32_t *out) {
    test_session t;
    test_session_open(&t, STORIES, 64);
    pgd_model *m = t.m;
    pgd_session *ss = &t.ss;
    pgd_sampler_scratch sc;
    CHECK_EQ_INT(pgd_sampler_scratch_init(&sc, m->cfg.n_vocab, NULL, 0, NULL), 0);
    pgd_sampler rng;
    pgd_sampler_params sp = {.temperature = q->temperature, .top_p = 1, .seed = q->seed};
    CHECK_EQ_INT(pgd_sampler_init(&rng, &sp, &sc, NULL), 0);
    pgd_sample_row row = {.temperature = q->temperature, .top_p = q->top_p, .min_p = q->min_p,
                          .top_k = q->top_k};
    CHECK_EQ_INT(pgd_session_forward(ss, q->prompt, q->n_prompt, false), 0);
    for (int i = 0; i < q->max_tokens; i++) {
        if (row.temperature > 0 && row.top_k != 1) row.u = pgd_sampler_uniform_f32(&rng);
        out[i] = pgd_device_sample_row(ss->logits, m->cfg.n_vocab, &row);
        if (i + 1 < q->max_tokens) CHECK_EQ_INT(pgd_session_forward(ss, &out[i], 1, false), 0);
    }
    pgd_sampler_free(&rng);
    pgd_sampler_scratch_free(&sc);
    test_session_close(&t);
}

static void test_engine(void) {
    static int32_t a[NREQ][MAXTOK], b[NREQ][MAXTOK], ref[MAXTOK];
    int32_t na[NREQ], nb[NREQ], ta[NREQ], tb[NREQ];
    pgd_request_params reqs[NREQ];
    /* greedy: the device path gives the default path's tokens */
    for (int r = 0; r < NREQ; r++) reqs[r] = request(r, 0);
    run_engine(NULL, reqs, NREQ, a, na, ta);
    run_engine("1", reqs, NREQ, b, nb, tb);
    for (int r = 0; r < NREQ; r++) {
        CHECK_EQ_INT(na[r], MAXTOK);
        CHECK_EQ_INT(nb[r], MAXTOK);
        CHECK(memcmp(a[r], b[r], sizeof a[r]) == 0);
    }
    /* seeded sampling with every knob: the same tokens run to run, and those of the reference
     * replayed alone (the engine sampled on the backend, whatever shared the step) */
    for (int r = 0; r < NREQ; r++) {
        reqs[r] = request(r, 0.7f + 0.1f * (float)(r % 4));
        reqs[r].top_k = r % 3 ? 40 : 0;
        reqs[r].top_p = r % 2 ? 0.9f : 1.0f;
        reqs[r].min_p = r % 4 == 1 ? 0.05f : 0.0f;
    }
    run_engine("1", reqs, NREQ, a, na, ta);
    run_engine("1", reqs, NREQ, b, nb, tb);
    int differ_from_host = 0;
    for (int r = 0; r < NREQ; r++) {
        CHECK_EQ_INT(na[r], MAXTOK);
        CHECK(memcmp(a[r], b[r], sizeof a[r]) == 0);
        replay(&reqs[r], ref);
        CHECK(memcmp(a[r], ref, sizeof ref) == 0);
        CHECK_EQ_INT(ta[r], 0); /* no logprobs asked: none reported */
    }
    /* requests the backend cannot sample (logprobs, penalties, min_tokens, logit bias) share
     * steps with ones it can: theirs come from the host chain, token for token as without
     * device sampling; the others still equal their replay */
    static const int32_t bias_ids[] = {13, 29};
    static const float bias[] = {2.0f, -3.0f};
    reqs[1].logprobs = 3;
    reqs[3].repetition_penalty = 1.3f;
    reqs[4].frequency_penalty = 0.5f;
    reqs[4].presence_penalty = 0.25f;
    reqs[6].min_tokens = 30;
    reqs[7].logit_bias_ids = bias_ids;
    reqs[7].logit_bias = bias;
    reqs[7].n_logit_bias = 2;
    run_engine("0", reqs, NREQ, a, na, ta);
    run_engine("1", reqs, NREQ, b, nb, tb);
    const bool host[NREQ] = {[1] = true, [3] = true, [4] = true, [6] = true, [7] = true};
    for (int r = 0; r < NREQ; r++) {
        CHECK_EQ_INT(nb[r], MAXTOK);
        CHECK_EQ_INT(tb[r], r == 1 ? 3 : 0);
        if (host[r]) {
            CHECK(memcmp(a[r], b[r], sizeof a[r]) == 0);
        } else {
            replay(&reqs[r], ref);
            CHECK(memcmp(b[r], ref, sizeof ref) == 0);
            differ_from_host += memcmp(a[r], b[r], sizeof a[r]) != 0;
        }
    }
    /* the host and the backend draw in different orders: over 40 tokens, some request differs
     * (a check that the switch switches) */
    CHECK(differ_from_host > 0);
}

int main(void) {
    test_kept_set();
    test_ties();
    test_greedy();
    test_draws();
    test_backend_ops();
    test_forward(1);
    test_forward(2);
    test_engine();
    return test_report("test_device_sample");
}
