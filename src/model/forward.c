/* The forward pass of the Llama family and Qwen2 for one sequence at a time, on the CPU:
 * RMSNorm -> attention (RoPE, GQA, causal softmax) -> RMSNorm -> SwiGLU MLP, residuals, LM head.
 * Matrix products and attention are split over output rows / heads across the thread pool;
 * every dot product has one fixed reduction order, so a token's result does not depend on how
 * many tokens share the call. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/pool.h"
#include "backend/cpu/quant.h"
#include "model/model.h"

static void *xcalloc(size_t n, size_t sz, bool *ok) {
    void *p = calloc(n ? n : 1, sz);
    if (!p) *ok = false;
    return p;
}

int pgd_session_init(pgd_session *s, const pgd_model *m, pgd_pool *pool, int32_t max_batch,
                     pgd_err *err) {
    memset(s, 0, sizeof *s);
    const pgd_model_config *c = &m->cfg;
    if (max_batch < 1) max_batch = 1;
    if (max_batch > c->n_ctx) max_batch = c->n_ctx;
    s->model = m;
    s->pool = pool;
    s->n_ctx = c->n_ctx;
    s->max_batch = max_batch;
    size_t B = (size_t)max_batch, q_dim = (size_t)c->n_head * c->head_dim;
    size_t kv_dim = (size_t)c->n_kv_head * c->head_dim;
    size_t widest = (size_t)c->dim > q_dim ? (size_t)c->dim : q_dim;
    if ((size_t)c->ffn_dim > widest) widest = (size_t)c->ffn_dim;
    /* Activation rows must hold the input of any weight in its dot-product format. */
    size_t act = pgd_cpu_matmul_act_row_bytes(&m->output);
    for (int il = 0; il < c->n_layer; il++) {
        const pgd_layer *l = &m->layers[il];
        const pgd_weight *lw[] = {&l->wq, &l->wk, &l->wv, &l->wo, &l->w_gate, &l->w_up, &l->w_down};
        for (size_t i = 0; i < 7; i++) {
            size_t b = pgd_cpu_matmul_act_row_bytes(lw[i]);
            if (b > act) act = b;
        }
    }
    s->act_row_bytes = act;
    bool ok = true;
    s->k_cache = xcalloc((size_t)c->n_layer * (size_t)c->n_ctx * kv_dim, sizeof(float), &ok);
    s->v_cache = xcalloc((size_t)c->n_layer * (size_t)c->n_ctx * kv_dim, sizeof(float), &ok);
    s->x = xcalloc(B * (size_t)c->dim, sizeof(float), &ok);
    s->xb = xcalloc(B * widest, sizeof(float), &ok);
    s->xb2 = xcalloc(B * (size_t)c->dim, sizeof(float), &ok);
    s->q = xcalloc(B * q_dim, sizeof(float), &ok);
    s->k = xcalloc(B * kv_dim, sizeof(float), &ok);
    s->v = xcalloc(B * kv_dim, sizeof(float), &ok);
    s->att = xcalloc(B * (size_t)c->n_head * (size_t)c->n_ctx, sizeof(float), &ok);
    s->hb = xcalloc(B * (size_t)c->ffn_dim, sizeof(float), &ok);
    s->hb2 = xcalloc(B * (size_t)c->ffn_dim, sizeof(float), &ok);
    s->act = xcalloc(B * s->act_row_bytes, 1, &ok);
    s->logits = xcalloc(B * (size_t)c->n_vocab, sizeof(float), &ok);
    s->rope_cos = xcalloc(B * (size_t)(c->head_dim / 2), sizeof(float), &ok);
    s->rope_sin = xcalloc(B * (size_t)(c->head_dim / 2), sizeof(float), &ok);
    if (!ok) {
        pgd_session_free(s);
        return pgd_err_set(err, PGD_ENOMEM, "%s: out of memory for a context of %d tokens",
                           m->path, c->n_ctx);
    }
    return PGD_OK;
}

void pgd_session_free(pgd_session *s) {
    void *bufs[] = {s->k_cache, s->v_cache, s->x, s->xb, s->xb2, s->q, s->k, s->v, s->att,
                    s->hb, s->hb2, s->act, s->logits, s->rope_cos, s->rope_sin};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    memset(s, 0, sizeof *s);
}

/* ---- ops ---- */

static void rmsnorm(float *out, const float *x, const float *w, int n, float eps) {
    float ss = 0.0f;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    float scale = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = 0; i < n; i++) out[i] = w[i] * (x[i] * scale);
}

/* y (n, n_out) = x (n, n_in) . W^T */
static void matmul(pgd_session *s, const pgd_weight *w, const float *x, float *y, int n) {
    pgd_cpu_matmul(s->pool, w, x, y, n, s->act, s->act_row_bytes);
}

static void add_bias(float *y, const float *b, int n_rows, int dim) {
    if (!b) return;
    for (int t = 0; t < n_rows; t++)
        for (int i = 0; i < dim; i++) y[(size_t)t * dim + i] += b[i];
}

/* Rotates each head of x (n rows of n_heads * head_dim) by the angles prepared in s->rope_*. */
static void rope(const pgd_session *s, float *x, int n, int n_heads) {
    const pgd_model_config *c = &s->model->cfg;
    int hd = c->head_dim, half = hd / 2;
    for (int t = 0; t < n; t++) {
        const float *cs = s->rope_cos + (size_t)t * half, *sn = s->rope_sin + (size_t)t * half;
        for (int h = 0; h < n_heads; h++) {
            float *v = x + ((size_t)t * n_heads + h) * hd;
            for (int i = 0; i < half; i++) {
                int i0 = c->rope_mode == PGD_ROPE_NEOX ? i : 2 * i;
                int i1 = c->rope_mode == PGD_ROPE_NEOX ? i + half : 2 * i + 1;
                float a = v[i0], b = v[i1];
                v[i0] = a * cs[i] - b * sn[i];
                v[i1] = b * cs[i] + a * sn[i];
            }
        }
    }
}

static void rope_prepare(pgd_session *s, int n) {
    const pgd_model_config *c = &s->model->cfg;
    int half = c->head_dim / 2;
    for (int t = 0; t < n; t++) {
        float pos = (float)(s->n_past + t);
        for (int i = 0; i < half; i++) {
            /* As transformers computes it, in float32: inv_freq = 1 / theta^(2i/d). */
            float inv = 1.0f / powf(c->rope_theta, (float)(2 * i) / (float)c->head_dim);
            if (c->rope_freq_factors) inv /= c->rope_freq_factors[i];
            float ang = pos * inv;
            s->rope_cos[(size_t)t * half + i] = cosf(ang);
            s->rope_sin[(size_t)t * half + i] = sinf(ang);
        }
    }
}

typedef struct attn_ctx {
    pgd_session *s;
    int il, n;
} attn_ctx;

static void attn_task(void *arg, int ith, int nth) {
    attn_ctx *a = arg;
    pgd_session *s = a->s;
    const pgd_model_config *c = &s->model->cfg;
    int hd = c->head_dim, group = c->n_head / c->n_kv_head;
    size_t kv_dim = (size_t)c->n_kv_head * hd;
    const float *kc = s->k_cache + (size_t)a->il * s->n_ctx * kv_dim;
    const float *vc = s->v_cache + (size_t)a->il * s->n_ctx * kv_dim;
    float scale = 1.0f / sqrtf((float)hd);
    long lo, hi;
    pgd_split_range((long)a->n * c->n_head, ith, nth, &lo, &hi);
    for (long th = lo; th < hi; th++) {
        int t = (int)(th / c->n_head), h = (int)(th % c->n_head), kvh = h / group;
        int n_keys = s->n_past + t + 1; /* causal: keys up to and including this token */
        const float *q = s->q + ((size_t)t * c->n_head + h) * hd;
        float *att = s->att + ((size_t)t * c->n_head + h) * s->n_ctx;
        float mx = -INFINITY;
        for (int j = 0; j < n_keys; j++) {
            const float *k = kc + (size_t)j * kv_dim + (size_t)kvh * hd;
            float d = 0.0f;
            for (int i = 0; i < hd; i++) d += q[i] * k[i];
            att[j] = d * scale;
            if (att[j] > mx) mx = att[j];
        }
        float sum = 0.0f;
        for (int j = 0; j < n_keys; j++) {
            att[j] = expf(att[j] - mx);
            sum += att[j];
        }
        float inv = 1.0f / sum;
        float *out = s->xb + ((size_t)t * c->n_head + h) * hd;
        memset(out, 0, (size_t)hd * sizeof *out);
        for (int j = 0; j < n_keys; j++) {
            const float *v = vc + (size_t)j * kv_dim + (size_t)kvh * hd;
            float p = att[j] * inv;
            for (int i = 0; i < hd; i++) out[i] += p * v[i];
        }
    }
}

static inline float silu(float x) { return x / (1.0f + expf(-x)); }

int pgd_session_forward(pgd_session *s, const int32_t *tokens, int32_t n, bool all_logits) {
    const pgd_model *m = s->model;
    const pgd_model_config *c = &m->cfg;
    if (n < 1 || n > s->max_batch) return PGD_EINVAL;
    if (s->n_past + n > s->n_ctx) return PGD_ERANGE;
    for (int t = 0; t < n; t++)
        if (tokens[t] < 0 || tokens[t] >= c->n_vocab) return PGD_EINVAL;
    int dim = c->dim, hd = c->head_dim;
    size_t q_dim = (size_t)c->n_head * hd, kv_dim = (size_t)c->n_kv_head * hd;

    for (int t = 0; t < n; t++)
        pgd_dequantize_row(m->tok_embd.type,
                           (const char *)m->tok_embd.data + (size_t)tokens[t] * m->tok_embd.row_bytes,
                           s->x + (size_t)t * dim, dim);
    rope_prepare(s, n);

    for (int il = 0; il < c->n_layer; il++) {
        const pgd_layer *l = &m->layers[il];
        for (int t = 0; t < n; t++)
            rmsnorm(s->xb2 + (size_t)t * dim, s->x + (size_t)t * dim, l->attn_norm, dim, c->rms_eps);
        matmul(s, &l->wq, s->xb2, s->q, n);
        matmul(s, &l->wk, s->xb2, s->k, n);
        matmul(s, &l->wv, s->xb2, s->v, n);
        add_bias(s->q, l->bq, n, (int)q_dim);
        add_bias(s->k, l->bk, n, (int)kv_dim);
        add_bias(s->v, l->bv, n, (int)kv_dim);
        rope(s, s->q, n, c->n_head);
        rope(s, s->k, n, c->n_kv_head);
        float *kc = s->k_cache + ((size_t)il * s->n_ctx + s->n_past) * kv_dim;
        float *vc = s->v_cache + ((size_t)il * s->n_ctx + s->n_past) * kv_dim;
        memcpy(kc, s->k, (size_t)n * kv_dim * sizeof(float));
        memcpy(vc, s->v, (size_t)n * kv_dim * sizeof(float));
        attn_ctx ac = {s, il, n};
        pgd_pool_run(s->pool, attn_task, &ac);
        matmul(s, &l->wo, s->xb, s->xb2, n);
        for (size_t i = 0; i < (size_t)n * dim; i++) s->x[i] += s->xb2[i];

        for (int t = 0; t < n; t++)
            rmsnorm(s->xb2 + (size_t)t * dim, s->x + (size_t)t * dim, l->ffn_norm, dim, c->rms_eps);
        matmul(s, &l->w_gate, s->xb2, s->hb, n);
        matmul(s, &l->w_up, s->xb2, s->hb2, n);
        for (size_t i = 0; i < (size_t)n * c->ffn_dim; i++) s->hb[i] = silu(s->hb[i]) * s->hb2[i];
        matmul(s, &l->w_down, s->hb, s->xb2, n);
        for (size_t i = 0; i < (size_t)n * dim; i++) s->x[i] += s->xb2[i];
    }

    int first = all_logits ? 0 : n - 1, n_out = all_logits ? n : 1;
    for (int t = 0; t < n_out; t++)
        rmsnorm(s->xb2 + (size_t)t * dim, s->x + (size_t)(first + t) * dim, m->output_norm, dim,
                c->rms_eps);
    matmul(s, &m->output, s->xb2, s->logits, n_out);
    s->n_past += n;
    return PGD_OK;
}
