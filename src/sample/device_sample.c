/* The sort-free sampler of one row (algorithm in device_sample.h): the reference that the CPU
 * backend runs and that kernels/sample.cu mirrors pass for pass (same probabilities, same radix
 * digits, same tie rule; only the order of the double sums differs). */
#include "sample/device_sample.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "backend/cpu/pool.h"

/* A kept set: p > p, or p == p and id <= id (see device_sample.h). */
typedef struct cut {
    float p;
    int32_t id;
} cut;

typedef struct row_ctx {
    const float *l;
    int32_t n;
    float inv_t, mx;
} row_ctx;

/* As pgd_sampler_dist_compute computes it: the scaled logit rounded to float, then exp. */
static inline float prob(const row_ctx *r, int32_t i) {
    float w = r->l[i] * r->inv_t;
    return expf(w - r->mx);
}

static inline bool kept(float p, int32_t i, cut c) { return p > c.p || (p == c.p && i <= c.id); }

static inline uint32_t fbits(float x) {
    uint32_t b;
    memcpy(&b, &x, sizeof b);
    return b;
}

static inline float bitsf(uint32_t b) {
    float x;
    memcpy(&x, &b, sizeof x);
    return x;
}

typedef struct selection {
    float v;         /* the threshold probability */
    int32_t above_n; /* kept tokens with p > v */
    double above_m;  /* and their mass */
    int32_t n_at;    /* kept tokens with p == v */
} selection;

/* The largest v (a bit pattern; p > 0, so the order of the patterns is the order of the values)
 * with weight(kept, p >= v) >= target, weight a count or the mass. False when the kept total
 * falls short of target. */
static bool radix_select(const row_ctx *r, cut c, bool by_mass, double target, selection *s) {
    uint32_t prefix = 0;
    double above_w = 0, above_m = 0;
    int32_t above_n = 0, n_at = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        int32_t cnt[256] = {0};
        double mass[256] = {0};
        uint32_t hi = shift == 24 ? 0 : ~0u << (shift + 8);
        for (int32_t i = 0; i < r->n; i++) {
            float p = prob(r, i);
            if (!(p > 0) || !kept(p, i, c)) continue;
            uint32_t b = fbits(p);
            if ((b & hi) != prefix) continue;
            int d = (int)(b >> shift) & 255;
            cnt[d]++;
            mass[d] += p;
        }
        /* Below the first digit the bins re-sum the mass of the digit chosen above in another
         * order; should they fall short of the target by rounding, the lowest one is taken. */
        int d = -1, low = -1;
        double low_w = 0, low_m = 0;
        int32_t low_n = 0;
        for (int j = 255; j >= 0; j--) {
            if (!cnt[j]) continue;
            double w = by_mass ? mass[j] : (double)cnt[j];
            if (above_w + w >= target) {
                d = j;
                break;
            }
            low = j;
            low_w = above_w;
            low_m = above_m;
            low_n = above_n;
            above_w += w;
            above_m += mass[j];
            above_n += cnt[j];
        }
        if (d < 0) {
            if (shift == 24 || low < 0) return false;
            d = low;
            above_w = low_w;
            above_m = low_m;
            above_n = low_n;
        }
        prefix |= (uint32_t)d << shift;
        n_at = cnt[d];
    }
    *s = (selection){bitsf(prefix), above_n, above_m, n_at};
    return true;
}

/* The id of the m-th (from 1) kept token with p == v, in id order. */
static int32_t nth_tie(const row_ctx *r, cut c, float v, int32_t m) {
    for (int32_t i = 0; i < r->n; i++) {
        float p = prob(r, i);
        if (p == v && kept(p, i, c) && --m == 0) return i;
    }
    return INT32_MAX; /* not reached: m <= the ties counted by radix_select */
}

static double kept_mass(const row_ctx *r, cut c) {
    double m = 0;
    for (int32_t i = 0; i < r->n; i++) {
        float p = prob(r, i);
        if (p > 0 && kept(p, i, c)) m += p;
    }
    return m;
}

/* The kept set of a sampled row and its mass; false for a greedy one (T == 0, top_k == 1, or
 * no finite maximum: nothing has probability > 0). */
static bool row_cut(const float *logits, int32_t n, const pgd_sample_row *p, row_ctx *r, cut *out,
                    double *mass) {
    if (p->temperature == 0 || p->top_k == 1) return false;
    r->l = logits;
    r->n = n;
    r->inv_t = 1.0f / p->temperature;
    r->mx = -INFINITY;
    for (int32_t i = 0; i < n; i++) {
        float w = logits[i] * r->inv_t;
        if (w > r->mx) r->mx = w;
    }
    if (!isfinite(r->mx)) return false;
    cut c = {0.0f, -1}; /* p > 0 */
    selection s;
    if (p->top_k > 0 && radix_select(r, c, false, (double)p->top_k, &s)) {
        int32_t need = p->top_k - s.above_n; /* 1 .. s.n_at */
        c = (cut){s.v, need == s.n_at ? INT32_MAX : nth_tie(r, c, s.v, need)};
    }
    double m = kept_mass(r, c);
    if (p->top_p < 1.0f) {
        double target = (double)p->top_p * m;
        if (radix_select(r, c, true, target, &s)) {
            /* the fewest tokens at v that reach the target (the CPU adds them one at a time) */
            double v = s.v, guess = ceil((target - s.above_m) / v);
            int32_t k = guess < 1 ? 1 : guess > s.n_at ? s.n_at : (int32_t)guess;
            while (k > 1 && s.above_m + (double)(k - 1) * v >= target) k--;
            while (k < s.n_at && s.above_m + (double)k * v < target) k++;
            int32_t id = k < s.n_at ? nth_tie(r, c, s.v, k) : s.v == c.p ? c.id : INT32_MAX;
            c = (cut){s.v, id};
        }
    }
    if (p->min_p > 0) {
        float thr = p->min_p * expf(0.0f);
        if (thr > c.p) c = (cut){thr, INT32_MAX};
    }
    if (p->top_p < 1.0f || p->min_p > 0) m = kept_mass(r, c);
    *out = c;
    *mass = m;
    return true;
}

int32_t pgd_device_sample_row(const float *logits, int32_t n_vocab, const pgd_sample_row *p) {
    row_ctx r;
    cut c;
    double m;
    if (!row_cut(logits, n_vocab, p, &r, &c, &m)) return pgd_argmax(logits, n_vocab);
    double target = (double)p->u * m, acc = 0;
    int32_t last = -1;
    for (int32_t i = 0; i < n_vocab; i++) {
        float q = prob(&r, i);
        if (!(q > 0) || !kept(q, i, c)) continue;
        acc += q;
        last = i;
        if (target < acc) return i;
    }
    return last; /* rounding: the last kept token (there is one: the arg-max) */
}

int32_t pgd_device_sample_kept(const float *logits, int32_t n_vocab, const pgd_sample_row *p,
                               pgd_token_prob *out) {
    row_ctx r;
    cut c;
    double m;
    if (!row_cut(logits, n_vocab, p, &r, &c, &m)) {
        out[0] = (pgd_token_prob){pgd_argmax(logits, n_vocab), 1.0f};
        return 1;
    }
    int32_t n = 0;
    for (int32_t i = 0; i < n_vocab; i++) {
        float q = prob(&r, i);
        if (q > 0 && kept(q, i, c)) out[n++] = (pgd_token_prob){i, (float)(q / m)};
    }
    return n;
}

typedef struct rows_ctx {
    const float *logits;
    int n_vocab;
    const pgd_sample_row *rows;
    int32_t *out;
} rows_ctx;

static void sample_chunk(void *arg, long i, int ith) {
    const rows_ctx *c = arg;
    (void)ith;
    c->out[i] = pgd_device_sample_row(c->logits + (size_t)i * (size_t)c->n_vocab, c->n_vocab,
                                      &c->rows[i]);
}

void pgd_device_sample_rows(struct pgd_pool *pool, const float *logits, int n_rows, int n_vocab,
                            const pgd_sample_row *rows, int32_t *out) {
    rows_ctx c = {logits, n_vocab, rows, out};
    if (pool && n_rows > 1) pgd_pool_run_chunks(pool, sample_chunk, &c, n_rows);
    else
        for (long i = 0; i < n_rows; i++) sample_chunk(&c, i, 0);
}
