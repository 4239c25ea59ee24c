/* The sampler (src/sample) and the verification rule (src/spec): each logits processor's
 * effect on small hand-made logit vectors, sampling frequencies, log-probabilities, the
 * rejection rule's output distribution, n-gram proposals and the adaptation of k. */
#include <math.h>
#include <string.h>

#include "sample/sampler.h"
#include "spec/spec.h"
#include "test.h"

#define NV 8
static const int32_t EOG[] = {7};

static pgd_sampler_scratch sc;

static void init(pgd_sampler *s, pgd_sampler_params p) {
    if (p.top_p == 0) p.top_p = 1;
    CHECK_EQ_INT(pgd_sampler_init(s, &p, &sc, NULL), 0);
}

static int near(double a, double b, double tol) { return fabs(a - b) <= tol; }

/* The distribution d as a dense vector. */
static void dense(const pgd_sampler_dist *d, double *out) {
    for (int i = 0; i < NV; i++) out[i] = 0;
    for (int i = 0; i < d->n; i++) out[d->cand[i].id] = d->cand[i].p;
}

static void softmax(const float *l, double *out, float t) {
    double mx = -1e30, sum = 0;
    for (int i = 0; i < NV; i++) mx = l[i] / t > mx ? l[i] / t : mx;
    for (int i = 0; i < NV; i++) sum += out[i] = exp(l[i] / t - mx);
    for (int i = 0; i < NV; i++) out[i] /= sum;
}

static const float L[NV] = {1.0f, 3.0f, 2.0f, -1.0f, 0.5f, 2.5f, -2.0f, 0.0f};

static void test_greedy_and_bias(void) {
    pgd_sampler s;
    pgd_sampler_dist d;
    init(&s, (pgd_sampler_params){.temperature = 0});
    pgd_sampler_dist_compute(&s, L, NULL, 0, 0, &d);
    CHECK_EQ_INT(d.n, 1);
    CHECK_EQ_INT(d.cand[0].id, 1);
    CHECK(d.cand[0].p == 1.0f);
    pgd_sampler_free(&s);
    /* bias moves the arg-max: 2 + 1.5 > 3 */
    int32_t ids[] = {2, 1};
    float b[] = {1.5f, -0.25f};
    init(&s, (pgd_sampler_params){.temperature = 0, .bias_ids = ids, .bias = b, .n_bias = 2});
    CHECK_EQ_INT(pgd_sampler_sample(&s, L, NULL, 0, 0), 2);
    /* the bias is copied: the caller's arrays may change */
    ids[0] = 0;
    CHECK_EQ_INT(pgd_sampler_sample(&s, L, NULL, 0, 0), 2);
    pgd_sampler_free(&s);
    /* ties: the lowest id */
    float t[NV] = {0, 5, 5, 0, 0, 0, 0, 0};
    CHECK_EQ_INT(pgd_argmax(t, NV), 1);
    /* bias out of the vocabulary is rejected */
    int32_t bad[] = {NV};
    float bb[] = {1};
    pgd_sampler_params bp = {.top_p = 1, .bias_ids = bad, .bias = bb, .n_bias = 1};
    CHECK(pgd_sampler_init(&s, &bp, &sc, NULL) != 0);
}

static void test_temperature_topk_topp_minp(void) {
    pgd_sampler s;
    pgd_sampler_dist d;
    double got[NV], want[NV];
    /* temperature only: the softmax of l / T */
    init(&s, (pgd_sampler_params){.temperature = 0.7f});
    pgd_sampler_dist_compute(&s, L, NULL, 0, 0, &d);
    CHECK_EQ_INT(d.n, NV);
    dense(&d, got);
    softmax(L, want, 0.7f);
    for (int i = 0; i < NV; i++) CHECK(near(got[i], want[i], 1e-6));
    pgd_sampler_free(&s);
    /* top-k 3: ids 1, 5, 2 renormalized */
    init(&s, (pgd_sampler_params){.temperature = 1, .top_k = 3});
    pgd_sampler_dist_compute(&s, L, NULL, 0, 0, &d);
    dense(&d, got);
    double z = exp(3) + exp(2.5) + exp(2);
    CHECK_EQ_INT(d.n, 3);
    CHECK(near(got[1], exp(3) / z, 1e-6) && near(got[5], exp(2.5) / z, 1e-6) &&
          near(got[2], exp(2) / z, 1e-6));
    pgd_sampler_free(&s);
    /* top-p: probabilities at T=1 are about .39 (1), .24 (5), .14 (2), .05 (0), ...:
     * 0.6 needs ids 1 and 5 (.63); 0.64 needs 2 as well */
    softmax(L, want, 1);
    init(&s, (pgd_sampler_params){.temperature = 1, .top_p = 0.6f});
    pgd_sampler_dist_compute(&s, L, NULL, 0, 0, &d);
    CHECK_EQ_INT(d.n, 2);
    CHECK(d.sorted && d.cand[0].id == 1 && d.cand[1].id == 5);
    CHECK(near(d.cand[0].p, want[1] / (want[1] + want[5]), 1e-6));
    pgd_sampler_free(&s);
    init(&s, (pgd_sampler_params){.temperature = 1, .top_p = (float)(want[1] + want[5]) + 0.01f});
    pgd_sampler_dist_compute(&s, L, NULL, 0, 0, &d);
    CHECK_EQ_INT(d.n, 3);
    pgd_sampler_free(&s);
    /* min-p 0.3: keep p >= 0.3 * p(1): ids 1 (1), 5 (e^-.5 = .61), 2 (e^-1 = .37), not 0 (.14) */
    init(&s, (pgd_sampler_params){.temperature = 1, .min_p = 0.3f});
    pgd_sampler_dist_compute(&s, L, NULL, 0, 0, &d);
    dense(&d, got);
    CHECK_EQ_INT(d.n, 3);
    CHECK(got[1] > 0 && got[5] > 0 && got[2] > 0 && got[0] == 0);
    pgd_sampler_free(&s);
    /* order: top-k 4 then top-p 0.9 of the renormalized four (1 .45, 5 .27, 2 .17, 0 .06+):
     * 0.9 needs all but id 0 -> 3 */
    init(&s, (pgd_sampler_params){.temperature = 1, .top_k = 4, .top_p = 0.85f});
    pgd_sampler_dist_compute(&s, L, NULL, 0, 0, &d);
    CHECK_EQ_INT(d.n, 3);
    pgd_sampler_free(&s);
}

static void test_penalties_and_min_tokens(void) {
    pgd_sampler s;
    /* prompt [1], output [5, 5, 2] */
    int32_t hist[] = {1, 5, 5, 2};
    /* repetition 2 on prompt + output: 1: 3 -> 1.5, 5: 2.5 -> 1.25, 2: 2 -> 1; negatives
     * are multiplied: put 3 (-1) in the history -> -2 */
    int32_t h2[] = {1, 5, 5, 2, 3};
    init(&s, (pgd_sampler_params){.temperature = 0, .repetition_penalty = 2});
    pgd_sampler_dist d;
    pgd_sampler_dist_compute(&s, L, h2, 1, 5, &d);
    CHECK(sc.work[1] == 1.5f && sc.work[5] == 1.25f && sc.work[2] == 1.0f && sc.work[3] == -2.0f);
    CHECK(sc.work[0] == 1.0f && sc.work[4] == 0.5f); /* untouched */
    CHECK_EQ_INT(d.cand[0].id, 1);
    pgd_sampler_free(&s);
    /* frequency 0.5 and presence 0.25 on output counts only: 5 -> 2.5 - 1 - .25, 2 -> 2 - .75,
     * 1 (prompt only) untouched */
    init(&s, (pgd_sampler_params){.temperature = 0, .frequency_penalty = 0.5f,
                                  .presence_penalty = 0.25f});
    pgd_sampler_dist_compute(&s, L, hist, 1, 4, &d);
    CHECK(sc.work[5] == 1.25f && sc.work[2] == 1.25f && sc.work[1] == 3.0f);
    /* counts are left zeroed */
    int zero = 1;
    for (int i = 0; i < NV; i++) zero &= sc.count[i] == 0 && sc.seen[i] == 0;
    CHECK(zero);
    pgd_sampler_free(&s);
    /* negative presence pulls repeated tokens up */
    init(&s, (pgd_sampler_params){.temperature = 0, .presence_penalty = -2});
    CHECK_EQ_INT(pgd_sampler_sample(&s, L, hist, 1, 4), 5);
    pgd_sampler_free(&s);
    /* min_tokens: EOG (7) masked while the output is shorter */
    float le[NV] = {0, 0, 0, 0, 0, 0, 0, 9};
    init(&s, (pgd_sampler_params){.temperature = 0, .min_tokens = 2});
    CHECK_EQ_INT(pgd_sampler_sample(&s, le, hist, 3, 4), 0); /* 1 output token: masked */
    CHECK_EQ_INT(pgd_sampler_sample(&s, le, hist, 2, 4), 7); /* 2 output tokens: free */
    pgd_sampler_free(&s);
    init(&s, (pgd_sampler_params){.temperature = 1, .min_tokens = 5});
    pgd_sampler_dist_compute(&s, le, hist, 1, 4, &d);
    CHECK(pgd_sampler_dist_prob(&d, 7) == 0 && d.n == NV - 1);
    pgd_sampler_free(&s);
}

/* Empirical frequencies of n draws against the distribution: max abs error. */
static double freq_err(pgd_sampler *s, const float *l, int n, const double *want) {
    int cnt[NV] = {0};
    for (int i = 0; i < n; i++) cnt[pgd_sampler_sample(s, l, NULL, 0, 0)]++;
    double e = 0;
    for (int i = 0; i < NV; i++) e = fmax(e, fabs(cnt[i] / (double)n - want[i]));
    return e;
}

static void test_sampling_frequencies_and_seed(void) {
    pgd_sampler s, s2;
    double want[NV];
    softmax(L, want, 1);
    init(&s, (pgd_sampler_params){.temperature = 1, .seed = 42});
    CHECK(freq_err(&s, L, 200000, want) < 0.005);
    pgd_sampler_free(&s);
    /* same seed, same draws; another seed, other draws */
    init(&s, (pgd_sampler_params){.temperature = 1, .seed = 7});
    init(&s2, (pgd_sampler_params){.temperature = 1, .seed = 7});
    int same = 1;
    for (int i = 0; i < 100; i++)
        same &= pgd_sampler_sample(&s, L, NULL, 0, 0) == pgd_sampler_sample(&s2, L, NULL, 0, 0);
    CHECK(same);
    pgd_sampler_free(&s);
    pgd_sampler_free(&s2);
}

static void test_logprobs(void) {
    double p[NV];
    softmax(L, p, 1);
    int32_t ids[20];
    float lp[20];
    float chosen = pgd_logprobs(L, NV, 4, 3, ids, lp);
    CHECK(near(chosen, log(p[4]), 1e-5));
    CHECK(ids[0] == 1 && ids[1] == 5 && ids[2] == 2);
    CHECK(near(lp[0], log(p[1]), 1e-5) && near(lp[2], log(p[2]), 1e-5));
    /* ties: lower id first */
    float t[NV] = {1, 2, 2, 0, 0, 0, 0, 0};
    pgd_logprobs(t, NV, 0, 2, ids, lp);
    CHECK(ids[0] == 1 && ids[1] == 2);
}

/* The rejection rule reproduces p whatever the (deterministic or sampled) proposal. */
static void test_verify_distribution(void) {
    pgd_sampler s;
    double want[NV];
    softmax(L, want, 1);
    init(&s, (pgd_sampler_params){.temperature = 1, .seed = 3});
    int cnt[NV] = {0}, n = 200000, n_acc = 0;
    for (int i = 0; i < n; i++) {
        pgd_sampler_dist d;
        pgd_sampler_dist_compute(&s, L, NULL, 0, 0, &d);
        bool acc;
        cnt[pgd_spec_verify_token(&s, &d, 5, NULL, &acc)]++; /* always propose 5 */
        n_acc += acc;
    }
    double e = 0;
    for (int i = 0; i < NV; i++) e = fmax(e, fabs(cnt[i] / (double)n - want[i]));
    CHECK(e < 0.005);
    CHECK(near(n_acc / (double)n, want[5], 0.005)); /* acceptance rate = p(x) */
    /* a sampled draft q (uniform), proposals drawn from q */
    float q[NV];
    for (int i = 0; i < NV; i++) q[i] = 1.0f / NV;
    memset(cnt, 0, sizeof cnt);
    for (int i = 0; i < n; i++) {
        pgd_sampler_dist d;
        int32_t x = (int32_t)(pgd_sampler_uniform(&s) * NV);
        pgd_sampler_dist_compute(&s, L, NULL, 0, 0, &d);
        bool acc;
        cnt[pgd_spec_verify_token(&s, &d, x, q, &acc)]++;
    }
    e = 0;
    for (int i = 0; i < NV; i++) e = fmax(e, fabs(cnt[i] / (double)n - want[i]));
    CHECK(e < 0.005);
    pgd_sampler_free(&s);
    /* greedy: accept only the arg-max; otherwise the arg-max replaces the proposal */
    init(&s, (pgd_sampler_params){.temperature = 0});
    pgd_sampler_dist d;
    bool acc;
    pgd_sampler_dist_compute(&s, L, NULL, 0, 0, &d);
    CHECK(pgd_spec_verify_token(&s, &d, 1, NULL, &acc) == 1 && acc);
    pgd_sampler_dist_compute(&s, L, NULL, 0, 0, &d);
    CHECK(pgd_spec_verify_token(&s, &d, 2, NULL, &acc) == 1 && !acc);
    pgd_sampler_free(&s);
}

static void test_ngram_and_adapt(void) {
    int32_t out[8];
    /* ... 1 2 3 [9 9] ... 1 2 3: the 3-gram matches, proposes 9 9 4 */
    int32_t t[] = {1, 2, 3, 9, 9, 4, 5, 1, 2, 3};
    CHECK_EQ_INT(pgd_spec_ngram_propose(t, 10, 1, 4, 3, out), 3);
    CHECK(out[0] == 9 && out[1] == 9 && out[2] == 4);
    /* the most recent earlier occurrence wins */
    int32_t u[] = {7, 1, 7, 2, 7};
    CHECK_EQ_INT(pgd_spec_ngram_propose(u, 5, 1, 2, 2, out), 2);
    CHECK(out[0] == 2 && out[1] == 7);
    /* proposals stop at the end of the sequence */
    int32_t v[] = {4, 5, 4};
    CHECK_EQ_INT(pgd_spec_ngram_propose(v, 3, 1, 3, 5, out), 2);
    CHECK(out[0] == 5 && out[1] == 4);
    /* no match; n_min above the only match */
    int32_t w[] = {1, 2, 3};
    CHECK_EQ_INT(pgd_spec_ngram_propose(w, 3, 1, 3, 5, out), 0);
    CHECK_EQ_INT(pgd_spec_ngram_propose(u, 5, 2, 2, 2, out), 0);
    /* adaptation: shrink to accepted + 1, grow after full acceptance, pause after 3 misses */
    pgd_spec_adapt a;
    pgd_spec_adapt_init(&a, 5);
    CHECK_EQ_INT(pgd_spec_adapt_want(&a), 5);
    pgd_spec_adapt_update(&a, 5, 1);
    CHECK_EQ_INT(pgd_spec_adapt_want(&a), 2);
    pgd_spec_adapt_update(&a, 2, 2);
    CHECK_EQ_INT(pgd_spec_adapt_want(&a), 3);
    for (int i = 0; i < 3; i++) pgd_spec_adapt_update(&a, 1, 0);
    CHECK_EQ_INT(pgd_spec_adapt_want(&a), 0);
    CHECK_EQ_INT(pgd_spec_adapt_want(&a), 0);
    CHECK_EQ_INT(pgd_spec_adapt_want(&a), 1);
}

/* Logits no weight is finite for (all NaN; a +Inf among finite ones: what corrupt weights give)
 * sample the arg-max, an id in the vocabulary, under temperature, top-k, top-p and min-p alike
 * (the candidate list was left empty and an unwritten id returned: ASan SEGV in the logprobs). */
static void test_non_finite_logits(void) {
    float nan_l[NV], inf_l[NV];
    for (int i = 0; i < NV; i++) {
        nan_l[i] = NAN;
        inf_l[i] = L[i];
    }
    inf_l[4] = INFINITY;
    pgd_sampler_params ps[] = {{.temperature = 0.8f, .seed = 1},
                               {.temperature = 1.0f, .top_k = 3, .seed = 2},
                               {.temperature = 1.0f, .top_p = 0.5f, .min_p = 0.1f, .seed = 3}};
    for (size_t k = 0; k < sizeof ps / sizeof ps[0]; k++) {
        pgd_sampler s;
        init(&s, ps[k]);
        int32_t a = pgd_sampler_sample(&s, nan_l, NULL, 0, 0);
        CHECK(a >= 0 && a < NV);
        CHECK_EQ_INT(pgd_sampler_sample(&s, inf_l, NULL, 0, 0), 4);
        pgd_sampler_free(&s);
    }
}

int main(void) {
    CHECK_EQ_INT(pgd_sampler_scratch_init(&sc, NV, EOG, 1, NULL), 0);
    test_non_finite_logits();
    test_greedy_and_bias();
    test_temperature_topk_topp_minp();
    test_penalties_and_min_tokens();
    test_sampling_frequencies_and_seed();
    test_logprobs();
    test_verify_distribution();
    test_ngram_and_adapt();
    pgd_sampler_scratch_free(&sc);
    return test_report("sampler");
}
