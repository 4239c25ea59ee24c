/* The forward pass of the Llama family and Qwen2 on the CPU, over a flattened batch of tokens
 * from several sequences with a paged KV cache:
 *   RMSNorm -> Q/K/V (+bias) -> RoPE -> K/V into their slots -> paged attention (online softmax,
 *   each K/V row loaded once per GQA group) -> O -> residual -> RMSNorm -> SwiGLU -> residual,
 *   then the LM head for the rows that need logits.
 * Batch invariance: every per-token computation (matmul rows, attention over the sequence's own
 * keys in position order) has a fixed reduction order, so a token's results never depend on what
 * else shares the step or how its prompt was chunked. */
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

/* ---- KV storage ---- */

static size_t dtype_size(pgd_type t) { return t == PGD_TYPE_F32 ? 4 : 2; }

size_t pgd_kv_cache_bytes_per_token(const pgd_model *m, pgd_type dtype) {
    return 2 * (size_t)m->cfg.n_layer * (size_t)m->cfg.n_kv_head * (size_t)m->cfg.head_dim *
           dtype_size(dtype);
}

int pgd_kv_cache_init(pgd_kv_cache *c, const pgd_model *m, pgd_type dtype, int32_t n_blocks,
                      int32_t block_size, pgd_err *err) {
    memset(c, 0, sizeof *c);
    if (dtype != PGD_TYPE_F32 && dtype != PGD_TYPE_F16 && dtype != PGD_TYPE_BF16)
        return pgd_err_set(err, PGD_EINVAL, "KV cache dtype must be F32, F16 or BF16");
    if (n_blocks < 1 || block_size < 1)
        return pgd_err_set(err, PGD_EINVAL, "KV cache needs at least one block");
    c->dtype = dtype;
    c->n_layer = m->cfg.n_layer;
    c->n_blocks = n_blocks;
    c->block_size = block_size;
    c->kv_dim = m->cfg.n_kv_head * m->cfg.head_dim;
    size_t n = (size_t)c->n_layer * (size_t)n_blocks * (size_t)block_size * (size_t)c->kv_dim;
    c->k = calloc(n, dtype_size(dtype));
    c->v = calloc(n, dtype_size(dtype));
    if (!c->k || !c->v) {
        pgd_kv_cache_free(c);
        return pgd_err_set(err, PGD_ENOMEM, "KV cache: cannot allocate %d blocks of %d tokens",
                           n_blocks, block_size);
    }
    return PGD_OK;
}

void pgd_kv_cache_free(pgd_kv_cache *c) {
    free(c->k);
    free(c->v);
    memset(c, 0, sizeof *c);
}

void pgd_kv_cache_copy_block(pgd_kv_cache *c, int32_t src, int32_t dst, int32_t n) {
    size_t es = dtype_size(c->dtype), row = (size_t)c->kv_dim * es;
    size_t per_layer = (size_t)c->n_blocks * (size_t)c->block_size * row;
    for (int il = 0; il < c->n_layer; il++) {
        size_t base = (size_t)il * per_layer;
        size_t so = base + (size_t)src * c->block_size * row;
        size_t d = base + (size_t)dst * c->block_size * row;
        memcpy((char *)c->k + d, (char *)c->k + so, (size_t)n * row);
        memcpy((char *)c->v + d, (char *)c->v + so, (size_t)n * row);
    }
}

static void store_row(pgd_type dt, void *base, size_t idx, const float *x, int n) {
    if (dt == PGD_TYPE_F32) {
        memcpy((float *)base + idx, x, (size_t)n * sizeof *x);
    } else if (dt == PGD_TYPE_F16) {
        uint16_t *d = (uint16_t *)base + idx;
        for (int i = 0; i < n; i++) d[i] = pgd_fp32_to_fp16(x[i]);
    } else {
        uint16_t *d = (uint16_t *)base + idx;
        for (int i = 0; i < n; i++) d[i] = pgd_fp32_to_bf16(x[i]);
    }
}

/* Returns a pointer to n floats of row idx: the storage itself for F32, else tmp converted. */
static const float *load_row(pgd_type dt, const void *base, size_t idx, float *tmp, int n) {
    if (dt == PGD_TYPE_F32) return (const float *)base + idx;
    const uint16_t *s = (const uint16_t *)base + idx;
    if (dt == PGD_TYPE_F16)
        for (int i = 0; i < n; i++) tmp[i] = pgd_fp16_to_fp32(s[i]);
    else
        for (int i = 0; i < n; i++) tmp[i] = pgd_bf16_to_fp32(s[i]);
    return tmp;
}

/* ---- scratch ---- */

int pgd_fwd_init(pgd_fwd *f, const pgd_model *m, pgd_pool *pool, int32_t max_tokens,
                 int32_t max_logits, pgd_err *err) {
    memset(f, 0, sizeof *f);
    const pgd_model_config *c = &m->cfg;
    if (max_tokens < 1) max_tokens = 1;
    if (max_logits < 1) max_logits = 1;
    if (max_logits > max_tokens) max_logits = max_tokens;
    f->model = m;
    f->pool = pool;
    f->max_tokens = max_tokens;
    f->max_logits = max_logits;
    size_t B = (size_t)max_tokens, q_dim = (size_t)c->n_head * c->head_dim;
    size_t kv_dim = (size_t)c->n_kv_head * c->head_dim, half = (size_t)c->head_dim / 2;
    size_t wide = (size_t)c->dim > q_dim ? (size_t)c->dim : q_dim;
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
    f->act_row_bytes = act;
    int nth = pgd_pool_n_threads(pool);
    size_t group = (size_t)(c->n_head / c->n_kv_head);
    bool ok = true;
    f->x = xcalloc(B * (size_t)c->dim, sizeof(float), &ok);
    f->xb = xcalloc(B * wide, sizeof(float), &ok);
    f->xb2 = xcalloc(B * (size_t)c->dim, sizeof(float), &ok);
    f->q = xcalloc(B * q_dim, sizeof(float), &ok);
    f->k = xcalloc(B * kv_dim, sizeof(float), &ok);
    f->v = xcalloc(B * kv_dim, sizeof(float), &ok);
    f->hb = xcalloc(B * (size_t)c->ffn_dim, sizeof(float), &ok);
    f->hb2 = xcalloc(B * (size_t)c->ffn_dim, sizeof(float), &ok);
    f->act = xcalloc(B * f->act_row_bytes, 1, &ok);
    f->rope_cos = xcalloc(B * half, sizeof(float), &ok);
    f->rope_sin = xcalloc(B * half, sizeof(float), &ok);
    f->inv_freq = xcalloc(half, sizeof(float), &ok);
    f->attn_scratch = xcalloc((size_t)nth * (group * ((size_t)c->head_dim + 2) + 2 * (size_t)c->head_dim),
                              sizeof(float), &ok);
    f->logits = xcalloc((size_t)max_logits * (size_t)c->n_vocab, sizeof(float), &ok);
    if (!ok) {
        pgd_fwd_free(f);
        return pgd_err_set(err, PGD_ENOMEM, "%s: out of memory for %d tokens per step", m->path,
                           max_tokens);
    }
    for (size_t i = 0; i < half; i++) {
        /* As transformers computes it, in float32: inv_freq = 1 / theta^(2i/d). */
        float inv = 1.0f / powf(c->rope_theta, (float)(2 * i) / (float)c->head_dim);
        if (c->rope_freq_factors) inv /= c->rope_freq_factors[i];
        f->inv_freq[i] = inv;
    }
    return PGD_OK;
}

void pgd_fwd_free(pgd_fwd *f) {
    void *bufs[] = {f->x, f->xb, f->xb2, f->q, f->k, f->v, f->hb, f->hb2, f->act,
                    f->rope_cos, f->rope_sin, f->inv_freq, f->attn_scratch, f->logits};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    memset(f, 0, sizeof *f);
}

/* ---- ops ---- */

static void rmsnorm(float *out, const float *x, const float *w, int n, float eps) {
    float ss = 0.0f;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    float scale = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = 0; i < n; i++) out[i] = w[i] * (x[i] * scale);
}

static void matmul(pgd_fwd *f, const pgd_weight *w, const float *x, float *y, int n) {
    pgd_cpu_matmul(f->pool, w, x, y, n, f->act, f->act_row_bytes);
}

static void add_bias(float *y, const float *b, int n_rows, int dim) {
    if (!b) return;
    for (int t = 0; t < n_rows; t++)
        for (int i = 0; i < dim; i++) y[(size_t)t * dim + i] += b[i];
}

/* Rotates each head of x (n rows of n_heads * head_dim) by the angles in f->rope_*. */
static void rope(const pgd_fwd *f, float *x, int n, int n_heads) {
    const pgd_model_config *c = &f->model->cfg;
    int hd = c->head_dim, half = hd / 2;
    bool neox = c->rope_mode == PGD_ROPE_NEOX;
    for (int t = 0; t < n; t++) {
        const float *cs = f->rope_cos + (size_t)t * half, *sn = f->rope_sin + (size_t)t * half;
        for (int h = 0; h < n_heads; h++) {
            float *v = x + ((size_t)t * n_heads + h) * hd;
            for (int i = 0; i < half; i++) {
                int i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
                float a = v[i0], b = v[i1];
                v[i0] = a * cs[i] - b * sn[i];
                v[i1] = b * cs[i] + a * sn[i];
            }
        }
    }
}

typedef struct attn_ctx {
    pgd_fwd *f;
    const pgd_kv_cache *kv;
    const pgd_batch *b;
    int il;
} attn_ctx;

/* One (token, KV head) pair per work item: the K/V rows of the token's sequence are read once
 * and serve every query head of the group, with an online softmax in position order. */
static void attn_task(void *arg, int ith, int nth) {
    attn_ctx *a = arg;
    pgd_fwd *f = a->f;
    const pgd_kv_cache *kv = a->kv;
    const pgd_batch *b = a->b;
    const pgd_model_config *c = &f->model->cfg;
    int hd = c->head_dim, group = c->n_head / c->n_kv_head, bs = kv->block_size;
    size_t kv_dim = (size_t)kv->kv_dim;
    size_t layer_off = (size_t)a->il * (size_t)kv->n_blocks * (size_t)bs * kv_dim;
    float scale = 1.0f / sqrtf((float)hd);
    float *scr = f->attn_scratch + (size_t)ith * ((size_t)group * (hd + 2) + 2 * (size_t)hd);
    float *acc = scr, *mx = scr + (size_t)group * hd, *sum = mx + group;
    float *ktmp = sum + group, *vtmp = ktmp + hd;
    long lo, hi;
    pgd_split_range((long)b->n_tokens * c->n_kv_head, ith, nth, &lo, &hi);
    for (long w = lo; w < hi; w++) {
        int t = (int)(w / c->n_kv_head), kvh = (int)(w % c->n_kv_head);
        const int32_t *bt = b->block_tables[b->seq[t]];
        const float *q = f->q + ((size_t)t * c->n_head + (size_t)kvh * group) * hd;
        for (int g = 0; g < group; g++) {
            mx[g] = -INFINITY;
            sum[g] = 0.0f;
        }
        memset(acc, 0, (size_t)group * hd * sizeof *acc);
        for (int j = 0; j <= b->pos[t]; j++) {
            size_t slot = (size_t)bt[j / bs] * bs + (size_t)(j % bs);
            size_t idx = layer_off + slot * kv_dim + (size_t)kvh * hd;
            const float *k = load_row(kv->dtype, kv->k, idx, ktmp, hd);
            const float *v = load_row(kv->dtype, kv->v, idx, vtmp, hd);
            for (int g = 0; g < group; g++) {
                const float *qg = q + (size_t)g * hd;
                float s = 0.0f;
                for (int i = 0; i < hd; i++) s += qg[i] * k[i];
                s *= scale;
                float *ag = acc + (size_t)g * hd;
                if (s > mx[g]) {
                    float corr = expf(mx[g] - s);
                    sum[g] *= corr;
                    for (int i = 0; i < hd; i++) ag[i] *= corr;
                    mx[g] = s;
                }
                float p = expf(s - mx[g]);
                sum[g] += p;
                for (int i = 0; i < hd; i++) ag[i] += p * v[i];
            }
        }
        for (int g = 0; g < group; g++) {
            float *out = f->xb + ((size_t)t * c->n_head + (size_t)kvh * group + g) * hd;
            float inv = 1.0f / sum[g];
            for (int i = 0; i < hd; i++) out[i] = acc[(size_t)g * hd + i] * inv;
        }
    }
}

static inline float silu(float x) { return x / (1.0f + expf(-x)); }

int pgd_model_forward(pgd_fwd *f, pgd_kv_cache *kv, const pgd_batch *b) {
    const pgd_model *m = f->model;
    const pgd_model_config *c = &m->cfg;
    int n = b->n_tokens;
    if (n < 1 || n > f->max_tokens || b->n_logits < 0 || b->n_logits > f->max_logits)
        return PGD_EINVAL;
    int64_t n_slots = (int64_t)kv->n_blocks * kv->block_size;
    for (int t = 0; t < n; t++)
        if (b->tokens[t] < 0 || b->tokens[t] >= c->n_vocab || b->pos[t] < 0 || b->slot[t] < 0 ||
            b->slot[t] >= n_slots)
            return PGD_EINVAL;
    for (int i = 0; i < b->n_logits; i++)
        if (b->logit_rows[i] < 0 || b->logit_rows[i] >= n) return PGD_EINVAL;
    int dim = c->dim, hd = c->head_dim, half = hd / 2;
    size_t q_dim = (size_t)c->n_head * hd, kv_dim = (size_t)c->n_kv_head * hd;

    for (int t = 0; t < n; t++) {
        pgd_dequantize_row(m->tok_embd.type,
                           (const char *)m->tok_embd.data + (size_t)b->tokens[t] * m->tok_embd.row_bytes,
                           f->x + (size_t)t * dim, dim);
        for (int i = 0; i < half; i++) {
            float ang = (float)b->pos[t] * f->inv_freq[i];
            f->rope_cos[(size_t)t * half + i] = cosf(ang);
            f->rope_sin[(size_t)t * half + i] = sinf(ang);
        }
    }

    size_t layer_elems = (size_t)kv->n_blocks * (size_t)kv->block_size * kv_dim;
    for (int il = 0; il < c->n_layer; il++) {
        const pgd_layer *l = &m->layers[il];
        for (int t = 0; t < n; t++)
            rmsnorm(f->xb2 + (size_t)t * dim, f->x + (size_t)t * dim, l->attn_norm, dim, c->rms_eps);
        matmul(f, &l->wq, f->xb2, f->q, n);
        matmul(f, &l->wk, f->xb2, f->k, n);
        matmul(f, &l->wv, f->xb2, f->v, n);
        add_bias(f->q, l->bq, n, (int)q_dim);
        add_bias(f->k, l->bk, n, (int)kv_dim);
        add_bias(f->v, l->bv, n, (int)kv_dim);
        rope(f, f->q, n, c->n_head);
        rope(f, f->k, n, c->n_kv_head);
        for (int t = 0; t < n; t++) {
            size_t idx = (size_t)il * layer_elems + (size_t)b->slot[t] * kv_dim;
            store_row(kv->dtype, kv->k, idx, f->k + (size_t)t * kv_dim, (int)kv_dim);
            store_row(kv->dtype, kv->v, idx, f->v + (size_t)t * kv_dim, (int)kv_dim);
        }
        attn_ctx ac = {f, kv, b, il};
        pgd_pool_run(f->pool, attn_task, &ac);
        matmul(f, &l->wo, f->xb, f->xb2, n);
        for (size_t i = 0; i < (size_t)n * dim; i++) f->x[i] += f->xb2[i];

        for (int t = 0; t < n; t++)
            rmsnorm(f->xb2 + (size_t)t * dim, f->x + (size_t)t * dim, l->ffn_norm, dim, c->rms_eps);
        matmul(f, &l->w_gate, f->xb2, f->hb, n);
        matmul(f, &l->w_up, f->xb2, f->hb2, n);
        for (size_t i = 0; i < (size_t)n * c->ffn_dim; i++) f->hb[i] = silu(f->hb[i]) * f->hb2[i];
        matmul(f, &l->w_down, f->hb, f->xb2, n);
        for (size_t i = 0; i < (size_t)n * dim; i++) f->x[i] += f->xb2[i];
    }

    if (b->n_logits == 0) return PGD_OK;
    for (int i = 0; i < b->n_logits; i++)
        rmsnorm(f->xb2 + (size_t)i * dim, f->x + (size_t)b->logit_rows[i] * dim, m->output_norm,
                dim, c->rms_eps);
    matmul(f, &m->output, f->xb2, f->logits, b->n_logits);
    return PGD_OK;
}

/* ---- the single-sequence session ---- */

#define SESSION_BLOCK 16

int pgd_session_init(pgd_session *s, const pgd_model *m, pgd_pool *pool, int32_t max_batch,
                     pgd_err *err) {
    memset(s, 0, sizeof *s);
    const pgd_model_config *c = &m->cfg;
    if (max_batch < 1) max_batch = 1;
    if (max_batch > c->n_ctx) max_batch = c->n_ctx;
    s->model = m;
    s->n_ctx = c->n_ctx;
    s->max_batch = max_batch;
    int32_t n_blocks = (c->n_ctx + SESSION_BLOCK - 1) / SESSION_BLOCK;
    int rc = pgd_kv_cache_init(&s->kv, m, PGD_TYPE_F32, n_blocks, SESSION_BLOCK, err);
    if (rc) return rc;
    if ((rc = pgd_fwd_init(&s->fwd, m, pool, max_batch, max_batch, err))) {
        pgd_session_free(s);
        return rc;
    }
    s->block_table = malloc((size_t)n_blocks * sizeof *s->block_table);
    s->pos = malloc((size_t)max_batch * sizeof *s->pos);
    s->seq = calloc((size_t)max_batch, sizeof *s->seq);
    s->rows = malloc((size_t)max_batch * sizeof *s->rows);
    s->slot = malloc((size_t)max_batch * sizeof *s->slot);
    if (!s->block_table || !s->pos || !s->seq || !s->rows || !s->slot) {
        pgd_session_free(s);
        return pgd_err_set(err, PGD_ENOMEM, "%s: out of memory", m->path);
    }
    for (int32_t i = 0; i < n_blocks; i++) s->block_table[i] = i;
    s->logits = s->fwd.logits;
    return PGD_OK;
}

void pgd_session_free(pgd_session *s) {
    pgd_kv_cache_free(&s->kv);
    pgd_fwd_free(&s->fwd);
    free(s->block_table);
    free(s->pos);
    free(s->seq);
    free(s->rows);
    free(s->slot);
    memset(s, 0, sizeof *s);
}

int pgd_session_forward(pgd_session *s, const int32_t *tokens, int32_t n, bool all_logits) {
    if (n < 1 || n > s->max_batch) return PGD_EINVAL;
    if (s->n_past + n > s->n_ctx) return PGD_ERANGE;
    for (int32_t i = 0; i < n; i++) {
        s->pos[i] = s->n_past + i;
        s->slot[i] = s->n_past + i; /* identity block table: slot == position */
        s->rows[i] = i;
    }
    const int32_t *tables[1] = {s->block_table};
    pgd_batch b = {
        .n_tokens = n, .tokens = tokens, .pos = s->pos, .seq = s->seq, .slot = s->slot,
        .block_tables = tables, .n_logits = all_logits ? n : 1,
        .logit_rows = all_logits ? s->rows : &s->rows[n - 1],
    };
    int rc = pgd_model_forward(&s->fwd, &s->kv, &b);
    if (rc == PGD_OK) s->n_past += n;
    return rc;
}
