/* Greedy / temperature / top-k / top-p sampling with a per-sequence xoshiro256** generator. */
#include "sample/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

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

int pgd_sampler_init_with(pgd_sampler *s, const pgd_sampler_params *p, int32_t n_vocab,
                          pgd_token_prob *scratch, pgd_err *err) {
    memset(s, 0, sizeof *s);
    if (n_vocab < 1) return pgd_err_set(err, PGD_EINVAL, "sampler: empty vocabulary");
    if (!(p->temperature >= 0) || !(p->top_p > 0 && p->top_p <= 1) || p->top_k < 0)
        return pgd_err_set(err, PGD_EINVAL, "sampler: temperature must be >= 0, top_p in (0, 1], "
                           "top_k >= 0");
    s->params = *p;
    s->n_vocab = n_vocab;
    uint64_t x = p->seed;
    for (int i = 0; i < 4; i++) s->rng[i] = splitmix64(&x);
    s->cand = scratch;
    return PGD_OK;
}

int pgd_sampler_init(pgd_sampler *s, const pgd_sampler_params *p, int32_t n_vocab, pgd_err *err) {
    pgd_token_prob *c = malloc((size_t)(n_vocab > 0 ? n_vocab : 1) * sizeof *c);
    if (!c) return pgd_err_set(err, PGD_ENOMEM, "sampler: out of memory");
    int rc = pgd_sampler_init_with(s, p, n_vocab, c, err);
    if (rc) {
        free(c);
        return rc;
    }
    s->owns_cand = true;
    return PGD_OK;
}

void pgd_sampler_free(pgd_sampler *s) {
    if (s->owns_cand) free(s->cand);
    s->cand = NULL;
    s->owns_cand = false;
}

int32_t pgd_argmax(const float *logits, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (logits[i] > logits[best]) best = i;
    return best;
}

static int cmp_desc(const void *a, const void *b) {
    const pgd_token_prob *x = a, *y = b;
    if (x->p != y->p) return x->p < y->p ? 1 : -1;
    return x->id < y->id ? -1 : x->id > y->id; /* deterministic order among equal values */
}

int32_t pgd_sampler_sample(pgd_sampler *s, const float *logits) {
    const pgd_sampler_params *p = &s->params;
    int32_t n = s->n_vocab;
    if (p->temperature == 0.0f || p->top_k == 1) return pgd_argmax(logits, n);
    for (int32_t i = 0; i < n; i++) s->cand[i] = (pgd_token_prob){i, logits[i] / p->temperature};
    qsort(s->cand, (size_t)n, sizeof *s->cand, cmp_desc);
    int32_t k = p->top_k > 0 && p->top_k < n ? p->top_k : n;
    float mx = s->cand[0].p;
    double sum = 0;
    for (int32_t i = 0; i < k; i++) {
        s->cand[i].p = expf(s->cand[i].p - mx);
        sum += s->cand[i].p;
    }
    /* top-p: the smallest prefix whose probability mass reaches top_p */
    if (p->top_p < 1.0f) {
        double cum = 0;
        for (int32_t i = 0; i < k; i++) {
            cum += s->cand[i].p / sum;
            if (cum >= p->top_p) {
                k = i + 1;
                break;
            }
        }
        sum = 0;
        for (int32_t i = 0; i < k; i++) sum += s->cand[i].p;
    }
    double r = pgd_sampler_uniform(s) * sum, acc = 0;
    for (int32_t i = 0; i < k; i++) {
        acc += s->cand[i].p;
        if (r < acc) return s->cand[i].id;
    }
    return s->cand[k - 1].id;
}
