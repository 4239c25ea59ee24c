/* The logits-processor chain, sampling from its distribution with a per-sequence
 * xoshiro256** generator, and raw-distribution log-probabilities (order and semantics in
 * sampler.h). */
#include "sample/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- RNG ---- */

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t next_u64(uint64_t s[4]) {
    uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return r;
}

double pgd_sampler_uniform(pgd_sampler *s) { return (double)(next_u64(s->rng) >> 11) * 0x1.0p-53; }
float pgd_sampler_uniform_f32(pgd_sampler *s) {
    float u = (float)pgd_sampler_uniform(s);
    return u >= 1.0f ? 0x1.fffffep-1f : u;
}

/* ---- set-up ---- */

int pgd_sampler_scratch_init(pgd_sampler_scratch *sc, int32_t n_vocab, const int32_t *eog,
                             int32_t n_eog, pgd_err *err) {
    memset(sc, 0, sizeof *sc);
    if (n_vocab < 1) return pgd_err_set(err, PGD_EINVAL, "sampler: empty vocabulary");
    sc->n_vocab = n_vocab;
    sc->work = malloc((size_t)n_vocab * sizeof *sc->work);
    sc->cand = malloc((size_t)n_vocab * sizeof *sc->cand);
    sc->count = calloc((size_t)n_vocab, sizeof *sc->count);
    sc->seen = calloc((size_t)n_vocab, sizeof *sc->seen);
    if (!sc->work || !sc->cand || !sc->count || !sc->seen) {
        pgd_sampler_scratch_free(sc);
        return pgd_err_set(err, PGD_ENOMEM, "sampler: out of memory");
    }
    sc->eog = eog;
    sc->n_eog = n_eog;
    return PGD_OK;
}

void pgd_sampler_scratch_free(pgd_sampler_scratch *sc) {
    free(sc->work);
    free(sc->cand);
    free(sc->count);
    free(sc->seen);
    memset(sc, 0, sizeof *sc);
}

int pgd_sampler_init(pgd_sampler *s, const pgd_sampler_params *p, pgd_sampler_scratch *sc,
                     pgd_err *err) {
    memset(s, 0, sizeof *s);
    if (!(p->temperature >= 0) || !(p->top_p > 0 && p->top_p <= 1) || p->top_k < 0 ||
        !(p->min_p >= 0 && p->min_p <= 1) || !(p->repetition_penalty >= 0) ||
        !isfinite(p->presence_penalty) || !isfinite(p->frequency_penalty) || p->n_bias < 0 ||
        p->min_tokens < 0 || !isfinite(p->temperature))
        return pgd_err_set(err, PGD_EINVAL, "sampler: temperature must be >= 0, top_p in (0, 1], "
                           "top_k >= 0, min_p in [0, 1], repetition_penalty >= 0, "
                           "min_tokens >= 0");
    for (int32_t i = 0; i < p->n_bias; i++)
        if (p->bias_ids[i] < 0 || p->bias_ids[i] >= sc->n_vocab || !isfinite(p->bias[i]))
            return pgd_err_set(err, PGD_EINVAL, "sampler: logit_bias token id %d is outside the "
                               "vocabulary or its bias is not finite", p->bias_ids[i]);
    s->params = *p;
    s->sc = sc;
    if (p->n_bias > 0) {
        s->bias_ids = malloc((size_t)p->n_bias * sizeof *s->bias_ids);
        s->bias = malloc((size_t)p->n_bias * sizeof *s->bias);
        if (!s->bias_ids || !s->bias) {
            pgd_sampler_free(s);
            return pgd_err_set(err, PGD_ENOMEM, "sampler: out of memory");
        }
        memcpy(s->bias_ids, p->bias_ids, (size_t)p->n_bias * sizeof *s->bias_ids);
        memcpy(s->bias, p->bias, (size_t)p->n_bias * sizeof *s->bias);
    }
    s->params.bias_ids = s->bias_ids;
    s->params.bias = s->bias;
    uint64_t x = p->seed;
    for (int i = 0; i < 4; i++) s->rng[i] = splitmix64(&x);
    return PGD_OK;
}

void pgd_sampler_free(pgd_sampler *s) {
    free(s->bias_ids);
    free(s->bias);
    s->bias_ids = NULL;
    s->bias = NULL;
    s->params.n_bias = 0;
}

/* ---- helpers ---- */

int32_t pgd_argmax(const float *logits, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (logits[i] > logits[best]) best = i;
    return best;
}

/* A total order: larger probability first, lower id first among equals (deterministic). */
static inline bool better(pgd_token_prob a, pgd_token_prob b) {
    return a.p > b.p || (a.p == b.p && a.id < b.id);
}

static int cmp_desc(const void *a, const void *b) {
    const pgd_token_prob *x = a, *y = b;
    return better(*x, *y) ? -1 : better(*y, *x) ? 1 : 0;
}

/* Rearranges c[0..n) so that its m best elements come first, in no particular order
 * (quickselect, expected O(n)). */
static void select_top(pgd_token_prob *c, int32_t n, int32_t m) {
    if (m <= 0 || m >= n) return;
    int32_t lo = 0, hi = n - 1, k = m - 1;
    while (lo < hi) {
        pgd_token_prob piv = c[lo + (hi - lo) / 2];
        int32_t i = lo, j = hi;
        while (i <= j) {
            while (better(c[i], piv)) i++;
            while (better(piv, c[j])) j--;
            if (i <= j) {
                pgd_token_prob t = c[i];
                c[i] = c[j];
                c[j] = t;
                i++;
                j--;
            }
        }
        if (k <= j) hi = j;
        else if (k >= i) lo = i;
        else break;
    }
}

/* ---- the chain ---- */

void pgd_sampler_dist_compute(pgd_sampler *s, const float *logits, const int32_t *hist,
                              int32_t n_prompt, int32_t n_hist, pgd_sampler_dist *d) {
    const pgd_sampler_params *p = &s->params;
    pgd_sampler_scratch *sc = s->sc;
    int32_t nv = sc->n_vocab;
    float *w = sc->work;
    memcpy(w, logits, (size_t)nv * sizeof *w);
    /* 0. allowed tokens */
    if (s->allow)
        for (int32_t i = 0; i < nv; i++)
            if (!s->allow[i]) w[i] = -INFINITY;
    /* 1. logit bias */
    for (int32_t i = 0; i < p->n_bias; i++) w[p->bias_ids[i]] += p->bias[i];
    /* 2. penalties */
    float rep = p->repetition_penalty;
    if (rep > 0 && rep != 1) {
        for (int32_t i = 0; i < n_hist; i++) {
            int32_t t = hist[i];
            if (sc->seen[t]) continue;
            sc->seen[t] = 1;
            w[t] = w[t] > 0 ? w[t] / rep : w[t] * rep;
        }
        for (int32_t i = 0; i < n_hist; i++) sc->seen[hist[i]] = 0;
    }
    if (p->frequency_penalty != 0 || p->presence_penalty != 0) {
        for (int32_t i = n_prompt; i < n_hist; i++) sc->count[hist[i]]++;
        for (int32_t i = n_prompt; i < n_hist; i++) {
            int32_t t = hist[i];
            if (!sc->count[t]) continue;
            w[t] -= (float)sc->count[t] * p->frequency_penalty + p->presence_penalty;
            sc->count[t] = 0;
        }
    }
    /* 3. min_tokens */
    if (n_hist - n_prompt < p->min_tokens)
        for (int32_t i = 0; i < sc->n_eog; i++) w[sc->eog[i]] = -INFINITY;
    d->cand = sc->cand;
    /* 4. temperature (0: greedy) */
    if (p->temperature == 0 || p->top_k == 1) {
        sc->cand[0] = (pgd_token_prob){pgd_argmax(w, nv), 1.0f};
        d->n = 1;
        d->sorted = true;
        return;
    }
    float inv_t = 1.0f / p->temperature, mx = -INFINITY;
    for (int32_t i = 0; i < nv; i++) {
        w[i] *= inv_t;
        if (w[i] > mx) mx = w[i];
    }
    int32_t n = 0;
    double sum = 0;
    for (int32_t i = 0; i < nv; i++) {
        float e = expf(w[i] - mx);
        if (e > 0) {
            sc->cand[n++] = (pgd_token_prob){i, e};
            sum += e;
        }
    }
    if (n == 0) {
        /* no finite weight (NaN logits, or a +Inf one: corrupt weights): the arg-max, as greedy
         * would pick, rather than an id nobody wrote */
        sc->cand[0] = (pgd_token_prob){pgd_argmax(w, nv), 1.0f};
        d->n = 1;
        d->sorted = true;
        return;
    }
    pgd_token_prob *c = sc->cand;
    bool sorted = false;
    /* 5. top-k */
    if (p->top_k > 0 && p->top_k < n) {
        select_top(c, n, p->top_k);
        n = p->top_k;
        sum = 0;
        for (int32_t i = 0; i < n; i++) sum += c[i].p;
    }
    /* 6. top-p: sort a growing prefix until it holds the mass (usually a few hundred tokens) */
    if (p->top_p < 1.0f) {
        double target = (double)p->top_p * sum;
        for (int32_t m = n < 64 ? n : 64;; m = m * 4 < n ? m * 4 : n) {
            select_top(c, n, m);
            qsort(c, (size_t)m, sizeof *c, cmp_desc);
            double cum = 0;
            int32_t cut = -1;
            for (int32_t i = 0; i < m; i++) {
                cum += c[i].p;
                if (cum >= target) {
                    cut = i + 1;
                    break;
                }
            }
            if (cut > 0 || m == n) {
                if (cut > 0) n = cut;
                sorted = true;
                break;
            }
        }
        sum = 0;
        for (int32_t i = 0; i < n; i++) sum += c[i].p;
    }
    /* 7. min-p, relative to the most likely token left */
    if (p->min_p > 0) {
        float pmax = 0;
        for (int32_t i = 0; i < n; i++)
            if (c[i].p > pmax) pmax = c[i].p;
        float thr = p->min_p * pmax;
        int32_t k = 0;
        sum = 0;
        for (int32_t i = 0; i < n; i++)
            if (c[i].p >= thr) {
                c[k++] = c[i];
                sum += c[i].p;
            }
        n = k;
    }
    for (int32_t i = 0; i < n; i++) c[i].p = (float)(c[i].p / sum);
    d->n = n;
    d->sorted = sorted;
}

int32_t pgd_sampler_draw(pgd_sampler *s, const pgd_sampler_dist *d) {
    if (d->n == 1) return d->cand[0].id;
    double total = 0;
    for (int32_t i = 0; i < d->n; i++) total += d->cand[i].p;
    double r = pgd_sampler_uniform(s) * total, acc = 0;
    for (int32_t i = 0; i < d->n; i++) {
        acc += d->cand[i].p;
        if (r < acc) return d->cand[i].id;
    }
    for (int32_t i = d->n - 1; i > 0; i--) /* rounding: the last candidate with mass */
        if (d->cand[i].p > 0) return d->cand[i].id;
    return d->cand[0].id;
}

int32_t pgd_sampler_sample(pgd_sampler *s, const float *logits, const int32_t *hist,
                           int32_t n_prompt, int32_t n_hist) {
    pgd_sampler_dist d;
    pgd_sampler_dist_compute(s, logits, hist, n_prompt, n_hist, &d);
    return pgd_sampler_draw(s, &d);
}

float pgd_sampler_dist_prob(const pgd_sampler_dist *d, int32_t id) {
    for (int32_t i = 0; i < d->n; i++)
        if (d->cand[i].id == id) return d->cand[i].p;
    return 0;
}

/* ---- log-probabilities ---- */

float pgd_logprobs(const float *logits, int32_t n_vocab, int32_t id, int32_t n_top,
                   int32_t *top_ids, float *top_logprobs) {
    float mx = logits[pgd_argmax(logits, n_vocab)];
    double sum = 0;
    for (int32_t i = 0; i < n_vocab; i++) sum += exp((double)logits[i] - mx);
    double lse = mx + log(sum);
    if (n_top > 20) n_top = 20;
    if (n_top > n_vocab) n_top = n_vocab;
    int32_t have = 0;
    for (int32_t i = 0; i < n_vocab && n_top > 0; i++) {
        float l = logits[i];
        if (have == n_top && !(l > top_logprobs[have - 1])) continue;
        int32_t j = have < n_top ? have++ : have - 1;
        while (j > 0 && l > top_logprobs[j - 1]) { /* insertion; earlier ids win ties */
            top_logprobs[j] = top_logprobs[j - 1];
            top_ids[j] = top_ids[j - 1];
            j--;
        }
        top_logprobs[j] = l;
        top_ids[j] = i;
    }
    for (int32_t i = 0; i < have; i++) top_logprobs[i] = (float)(top_logprobs[i] - lse);
    return (float)(logits[id] - lse);
}
