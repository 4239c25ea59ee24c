/* The CPU backend: the reference implementation of the ops table (backend.h). Matrix products go
 * to pgd_cpu_matmul, attention and the other ops are the loops forward.c used to run directly,
 * split over the thread pool. Every op has a fixed reduction order per output row, so a token's
 * results never depend on what else shares the step (batch invariance). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/pool.h"
#include "backend/cpu/quant.h"

typedef struct cpu_state {
    int32_t max_tokens, n_head, n_kv_head, head_dim;
    void *act;               /* (max_tokens) rows of act_row_bytes: converted activations */
    size_t act_row_bytes;
    void *panel;             /* pgd_cpu_matmul_panel_bytes: dequantized weight panels */
    float *rope_cos, *rope_sin; /* (max_tokens, head_dim / 2) */
    float *attn_scratch;     /* (n_threads, group * (head_dim + 2) + 2 * head_dim) */
    size_t attn_stride;
} cpu_state;

static bool cpu_supports(pgd_op op, pgd_type type) {
    if (op == PGD_OP_MATMUL || op == PGD_OP_EMBED) return pgd_cpu_type_supported(type);
    return true;
}

static void cpu_free(pgd_backend *be) {
    cpu_state *st = be->impl;
    if (!st) return;
    free(st->act);
    free(st->rope_cos);
    free(st->rope_sin);
    free(st->attn_scratch);
    free(st->panel);
    free(st);
    be->impl = NULL;
}

static int cpu_init(pgd_backend *be, int32_t max_tokens, size_t act_row_bytes, int32_t n_head,
                    int32_t n_kv_head, int32_t head_dim, pgd_err *err) {
    cpu_state *st = calloc(1, sizeof *st);
    if (!st) return pgd_err_set(err, PGD_ENOMEM, "CPU backend: out of memory");
    be->impl = st;
    st->max_tokens = max_tokens;
    st->n_head = n_head;
    st->n_kv_head = n_kv_head;
    st->head_dim = head_dim;
    st->act_row_bytes = act_row_bytes;
    size_t half = (size_t)head_dim / 2, group = (size_t)(n_head / n_kv_head);
    int nth = be->pool ? pgd_pool_n_threads(be->pool) : 1;
    st->attn_stride = group * ((size_t)head_dim + 2) + 2 * (size_t)head_dim;
    st->act = calloc((size_t)max_tokens * act_row_bytes + 1, 1);
    st->panel = malloc(pgd_cpu_matmul_panel_bytes(act_row_bytes, nth) + 1);
    st->rope_cos = calloc((size_t)max_tokens * half + 1, sizeof(float));
    st->rope_sin = calloc((size_t)max_tokens * half + 1, sizeof(float));
    st->attn_scratch = calloc((size_t)nth * st->attn_stride, sizeof(float));
    if (!st->act || !st->panel || !st->rope_cos || !st->rope_sin || !st->attn_scratch) {
        cpu_free(be);
        return pgd_err_set(err, PGD_ENOMEM, "CPU backend: out of memory for %d tokens",
                           max_tokens);
    }
    return PGD_OK;
}

static void *cpu_alloc(pgd_backend *be, size_t bytes) { return calloc(bytes ? bytes : 1, 1); }
static void cpu_mem_free(pgd_backend *be, void *p) { free(p); }
static int cpu_copy(pgd_backend *be, void *dst, const void *src, size_t bytes) {
    memcpy(dst, src, bytes);
    return PGD_OK;
}
static int cpu_sync(pgd_backend *be) { return PGD_OK; }

static int cpu_begin(pgd_backend *be, const pgd_step *s, const pgd_rope_params *rp) {
    cpu_state *st = be->impl;
    int half = rp->head_dim / 2;
    for (int t = 0; t < s->n_tokens; t++)
        for (int i = 0; i < half; i++) {
            float ang = (float)s->pos[t] * rp->inv_freq[i];
            st->rope_cos[(size_t)t * half + i] = cosf(ang);
            st->rope_sin[(size_t)t * half + i] = sinf(ang);
        }
    return PGD_OK;
}

static void cpu_embed(pgd_backend *be, const pgd_weight *w, int32_t vocab_lo, const pgd_step *s,
                      float *x) {
    int dim = (int)w->n_in;
    for (int t = 0; t < s->n_tokens; t++) {
        int64_t r = (int64_t)s->tokens[t] - vocab_lo;
        float *xt = x + (size_t)t * dim;
        if (r < 0 || r >= w->n_out) memset(xt, 0, (size_t)dim * sizeof *xt);
        else pgd_dequantize_row(w->type, (const char *)w->data + (size_t)r * w->row_bytes, xt, dim);
    }
}

static void rmsnorm_row(float *out, const float *x, const float *w, int n, float eps) {
    float ss = 0.0f;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    float scale = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = 0; i < n; i++) out[i] = w[i] * (x[i] * scale);
}

static void cpu_rms_norm(pgd_backend *be, const float *x, const float *w, float *out, int n_rows,
                         int dim, float eps) {
    for (int t = 0; t < n_rows; t++)
        rmsnorm_row(out + (size_t)t * dim, x + (size_t)t * dim, w, dim, eps);
}

static void cpu_add_rms_norm(pgd_backend *be, float *x, const float *d, const float *w, float *out,
                             int n_rows, int dim, float eps) {
    for (size_t i = 0; i < (size_t)n_rows * dim; i++) x[i] += d[i];
    cpu_rms_norm(be, x, w, out, n_rows, dim, eps);
}

static void cpu_matmul(pgd_backend *be, const pgd_weight *w, const float *x, float *y, int n) {
    cpu_state *st = be->impl;
    pgd_cpu_matmul(be->pool, w, x, y, n, st->act, st->act_row_bytes, st->panel);
}

static void cpu_add_bias(pgd_backend *be, float *y, const float *b, int n_rows, int dim) {
    if (!b) return;
    for (int t = 0; t < n_rows; t++)
        for (int i = 0; i < dim; i++) y[(size_t)t * dim + i] += b[i];
}

/* Rotates each head of x (n rows of n_heads * head_dim) by the angles staged in begin. */
static void cpu_rope(pgd_backend *be, float *x, int n, int n_heads, const pgd_rope_params *rp) {
    cpu_state *st = be->impl;
    int hd = rp->head_dim, half = hd / 2;
    bool neox = rp->mode == 1;
    for (int t = 0; t < n; t++) {
        const float *cs = st->rope_cos + (size_t)t * half, *sn = st->rope_sin + (size_t)t * half;
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

static void cpu_kv_store(pgd_backend *be, const pgd_kv_layer *kv, const float *k, const float *v,
                         const pgd_step *s) {
    size_t kv_dim = (size_t)kv->kv_dim;
    for (int t = 0; t < s->n_tokens; t++) {
        size_t idx = (size_t)s->slot[t] * kv_dim;
        store_row(kv->dtype, kv->k, idx, k + (size_t)t * kv_dim, (int)kv_dim);
        store_row(kv->dtype, kv->v, idx, v + (size_t)t * kv_dim, (int)kv_dim);
    }
}

typedef struct attn_ctx {
    cpu_state *st;
    const float *q;
    const pgd_kv_layer *kv;
    float *out;
    int n_head, n_kv_head, hd;
    const pgd_step *s;
} attn_ctx;

/* One (token, KV head) pair per work item: the K/V rows of the token's sequence are read once
 * and serve every query head of the group, with an online softmax in position order. */
static void attn_task(void *arg, int ith, int nth) {
    attn_ctx *a = arg;
    const pgd_kv_layer *kv = a->kv;
    const pgd_step *b = a->s;
    int hd = a->hd, n_head = a->n_head, n_kv_head = a->n_kv_head, group = n_head / n_kv_head;
    int bs = kv->block_size;
    size_t kv_dim = (size_t)kv->kv_dim;
    float scale = 1.0f / sqrtf((float)hd);
    float *scr = a->st->attn_scratch + (size_t)ith * a->st->attn_stride;
    float *acc = scr, *mx = scr + (size_t)group * hd, *sum = mx + group;
    float *ktmp = sum + group, *vtmp = ktmp + hd;
    long lo, hi;
    pgd_split_range((long)b->n_tokens * n_kv_head, ith, nth, &lo, &hi);
    for (long w = lo; w < hi; w++) {
        int t = (int)(w / n_kv_head), kvh = (int)(w % n_kv_head);
        const int32_t *bt = b->block_tables[b->seq[t]];
        const float *q = a->q + ((size_t)t * n_head + (size_t)kvh * group) * hd;
        for (int g = 0; g < group; g++) {
            mx[g] = -INFINITY;
            sum[g] = 0.0f;
        }
        memset(acc, 0, (size_t)group * hd * sizeof *acc);
        for (int j = 0; j <= b->pos[t]; j++) {
            size_t slot = (size_t)bt[j / bs] * bs + (size_t)(j % bs);
            size_t idx = slot * kv_dim + (size_t)kvh * hd;
            const float *k = load_row(kv->dtype, kv->k, idx, ktmp, hd);
            const float *v = load_row(kv->dtype, kv->v, idx, vtmp, hd);
            for (int g = 0; g < group; g++) {
                const float *qg = q + (size_t)g * hd;
                float sc = 0.0f;
                for (int i = 0; i < hd; i++) sc += qg[i] * k[i];
                sc *= scale;
                float *ag = acc + (size_t)g * hd;
                if (sc > mx[g]) {
                    float corr = expf(mx[g] - sc);
                    sum[g] *= corr;
                    for (int i = 0; i < hd; i++) ag[i] *= corr;
                    mx[g] = sc;
                }
                float p = expf(sc - mx[g]);
                sum[g] += p;
                for (int i = 0; i < hd; i++) ag[i] += p * v[i];
            }
        }
        for (int g = 0; g < group; g++) {
            float *o = a->out + ((size_t)t * n_head + (size_t)kvh * group + g) * hd;
            float inv = 1.0f / sum[g];
            for (int i = 0; i < hd; i++) o[i] = acc[(size_t)g * hd + i] * inv;
        }
    }
}

static void cpu_attention(pgd_backend *be, const float *q, const pgd_kv_layer *kv, float *out,
                          int n_head, int n_kv_head, int head_dim, const pgd_step *s) {
    attn_ctx ac = {be->impl, q, kv, out, n_head, n_kv_head, head_dim, s};
    if (be->pool) pgd_pool_run(be->pool, attn_task, &ac);
    else attn_task(&ac, 0, 1);
}

static inline float silu(float x) { return x / (1.0f + expf(-x)); }

static void cpu_silu_gate(pgd_backend *be, float *g, const float *u, size_t n) {
    for (size_t i = 0; i < n; i++) g[i] = silu(g[i]) * u[i];
}

static void cpu_add(pgd_backend *be, float *x, const float *y, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] += y[i];
}

static void cpu_gather_rows(pgd_backend *be, const float *src, float *dst, int dim,
                            const pgd_step *s) {
    for (int i = 0; i < s->n_logits; i++)
        memmove(dst + (size_t)i * dim, src + (size_t)s->logit_rows[i] * dim,
                (size_t)dim * sizeof *dst);
}

static void cpu_copy_block(pgd_backend *be, const pgd_kv_layer *kv, int32_t src, int32_t dst,
                           int32_t n) {
    size_t row = (size_t)kv->kv_dim * pgd_dtype_size(kv->dtype);
    size_t so = (size_t)src * kv->block_size * row, d = (size_t)dst * kv->block_size * row;
    memcpy((char *)kv->k + d, (char *)kv->k + so, (size_t)n * row);
    memcpy((char *)kv->v + d, (char *)kv->v + so, (size_t)n * row);
}

const pgd_backend_ops pgd_cpu_backend_ops = {
    .name = "cpu",
    .host_memory = true,
    .supports = cpu_supports,
    .init = cpu_init,
    .free = cpu_free,
    .alloc = cpu_alloc,
    .mem_free = cpu_mem_free,
    .upload = cpu_copy,
    .download = cpu_copy,
    .sync = cpu_sync,
    .begin = cpu_begin,
    .embed = cpu_embed,
    .rms_norm = cpu_rms_norm,
    .add_rms_norm = cpu_add_rms_norm,
    .matmul = cpu_matmul,
    .add_bias = cpu_add_bias,
    .rope = cpu_rope,
    .kv_store = cpu_kv_store,
    .attention = cpu_attention,
    .silu_gate = cpu_silu_gate,
    .add = cpu_add,
    .gather_rows = cpu_gather_rows,
    .copy_block = cpu_copy_block,
};

#ifndef PGD_HAVE_CUDA
int pgd_cuda_device_count(void) { return 0; }
const pgd_backend_ops *pgd_cuda_backend_ops(void) { return NULL; }
#endif
