/* The rejection rule of speculative sampling, the n-gram proposer and the adaptation of k. */
#include <string.h>

#include "spec/spec.h"

int32_t pgd_spec_verify_token(pgd_sampler *s, pgd_sampler_dist *p, int32_t x, const float *q,
                              bool *accepted) {
    float px = pgd_sampler_dist_prob(p, x), qx = q ? q[x] : 1.0f;
    /* accept with probability min(1, p(x) / q(x)); no draw when that is 0 or 1 */
    if (px > 0 && (qx <= 0 || px >= qx || pgd_sampler_uniform(s) * qx < px)) {
        *accepted = true;
        return x;
    }
    *accepted = false;
    /* residual normalize(max(0, p - q)) over p's candidates (q has no mass outside them that
     * matters: max(0, 0 - q) = 0) */
    double sum = 0;
    int32_t n = 0;
    for (int32_t i = 0; i < p->n; i++) {
        int32_t id = p->cand[i].id;
        float r = p->cand[i].p - (q ? q[id] : (id == x ? 1.0f : 0.0f));
        if (r > 0) {
            p->cand[n++] = (pgd_token_prob){id, r};
            sum += r;
        }
    }
    if (n == 0 || !(sum > 0)) return pgd_sampler_draw(s, p); /* rounding only: p == q */
    for (int32_t i = 0; i < n; i++) p->cand[i].p = (float)(p->cand[i].p / sum);
    p->n = n;
    return pgd_sampler_draw(s, p);
}

int32_t pgd_spec_ngram_propose(const int32_t *tokens, int32_t n_tokens, int32_t n_min,
                               int32_t n_max, int32_t k, int32_t *out) {
    if (k <= 0 || n_min < 1) return 0;
    for (int32_t n = n_max; n >= n_min; n--) {
        if (n >= n_tokens) continue;
        const int32_t *suf = tokens + n_tokens - n;
        /* most recent earlier occurrence: start j with j + n < n_tokens (never the suffix
         * itself), scanning backwards */
        for (int32_t j = n_tokens - n - 1; j >= 0; j--) {
            if (tokens[j] != suf[0] || memcmp(tokens + j, suf, (size_t)n * sizeof *suf)) continue;
            int32_t from = j + n, m = n_tokens - from < k ? n_tokens - from : k;
            memcpy(out, tokens + from, (size_t)m * sizeof *out);
            return m;
        }
    }
    return 0;
}

void pgd_spec_adapt_init(pgd_spec_adapt *a, int32_t k_max) {
    memset(a, 0, sizeof *a);
    a->k_max = k_max < 1 ? 1 : k_max;
    a->k = a->k_max;
}

int32_t pgd_spec_adapt_want(pgd_spec_adapt *a) {
    if (a->pause > 0) {
        a->pause--;
        return 0;
    }
    return a->k;
}

/* Grow by one after a fully accepted run; otherwise ask for one more than was accepted. After
 * three rejected runs in a row, pause 2, 4, .. up to 32 steps: a request whose proposals keep
 * failing costs almost nothing extra. */
void pgd_spec_adapt_update(pgd_spec_adapt *a, int32_t n_proposed, int32_t n_accepted) {
    if (n_proposed <= 0) return;
    if (n_accepted >= n_proposed) a->k = a->k < a->k_max ? a->k + 1 : a->k_max;
    else a->k = n_accepted + 1 < a->k_max ? n_accepted + 1 : a->k_max;
    if (n_accepted == 0) {
        a->n_fail++;
        if (a->n_fail >= 3) {
            int sh = a->n_fail - 2 < 5 ? a->n_fail - 2 : 5;
            a->pause = 1 << sh;
        }
    } else {
        a->n_fail = 0;
    }
}
