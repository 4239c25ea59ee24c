/* The CPU backend: the reference implementation of the ops table (backend.h). Matrix products go
 * to pgd_cpu_matmul; attention and the per-row ops are vectorized (simd.h, AVX2 with scalar
 * fallbacks) and split over the thread pool when a call has enough work to pay for waking it.
 * Every op has a fixed reduction order per output row, so a token's results never depend on what
 * else shares the step or on how the work is split (batch invariance: test_cpu_ops.c). */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/kv_quant.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/pool.h"
#include "backend/cpu/quant.h"
#include "backend/cpu/simd.h"
#include "sample/device_sample.h"
#include "util/status.h"

#define ATTN_TILE 32 /* positions per softmax tile: a multiple of 8 */
/* Positions per attention segment (a multiple of ATTN_TILE): a token's context is folded one
 * segment at a time, each from a fresh softmax state, and the segments' states are merged in
 * position order, so a long context can be split over threads without changing any bit. */
#define ATTN_SEG 256
/* Most consecutive tokens of one sequence per attention work item: they share each K/V tile from
 * L1 instead of each reading it from L2/L3 (prefill attention ~1.2x at 2,048 positions). */
#define ATTN_QT 8
/* Budget of the per-segment states kept between the two passes of a split attention. */
#define ATTN_PART_BYTES (4u << 20)
/* Work, in about one float operation per unit, below which an op runs on the calling thread:
 * waking the pool costs a few microseconds. */
#define PAR_MIN_WORK 32768
#define PAR_CHUNKS_PER_THREAD 4 /* chunks per thread in a parallel op, for dynamic balance */

typedef struct cpu_state {
    int32_t max_tokens, n_head, n_kv_head, head_dim;
    void *act;                  /* (max_tokens) rows of act_row_bytes: converted activations */
    size_t act_row_bytes;
    void *panel;                /* pgd_cpu_matmul_panel_bytes(act_row_bytes, n_threads) */
    float *rope_cos, *rope_sin; /* (2, max_tokens, head_dim / 2): the two frequency sets */
    size_t rope_set;            /* max_tokens * head_dim / 2: the second set's offset */
    int32_t attn_group, attn_hdp; /* largest GQA group; head_dim rounded up to 8 */
    float *attn_scratch;        /* (n_threads, attn_stride), 64-byte aligned: attn_bufs_at */
    size_t attn_stride;
    float *attn_part;           /* ATTN_PART_BYTES: segment states of a split attention */
    int32_t *attn_first;        /* (max_split + 1): first segment item of each token */
    int32_t *attn_items;        /* (max_tokens + 1): first token of each unsplit work item */
    int max_split;              /* most tokens an attention call splits into segments */
} cpu_state;

/* A softmax state over some positions for H query heads (P = padded head_dim): the running
 * maxima, the per-lane sums of the probabilities and the unnormalized outputs. */
typedef struct attn_state {
    float *mx;   /* (H) */
    float *lsum; /* (H, 8) */
    float *acc;  /* (H, P) */
} attn_state;

static size_t up16(size_t n) { return (n + 15) / 16 * 16; } /* floats per 64-byte line */

/* Carves a state for H heads out of base (unless NULL); returns the floats it takes. */
static size_t attn_state_at(float *base, size_t H, size_t P, attn_state *s) {
    size_t a = up16(H), b = up16(H * 8);
    if (base) {
        s->mx = base;
        s->lsum = base + a;
        s->acc = base + a + b;
    }
    return a + b + up16(H * P);
}

/* One thread's attention scratch (H = heads, G = group, P = padded head_dim, T = ATTN_TILE);
 * per token of a work item: */
typedef struct attn_bufs {
    float *kt;               /* (T, P) the tile's K rows as floats (padded rows) */
    float *vt;               /* (T, P) the tile's V rows */
    float *zero;             /* (P) zeros: the K row of score lanes past the tile's end */
    float *sc;               /* (G, T) scores, then probabilities */
    float *q[ATTN_QT];       /* (H, P) queries, zero-padded (only when head_dim % 8 != 0) */
    attn_state seg[ATTN_QT]; /* the current segment's state */
    attn_state run[ATTN_QT]; /* the merged state of the segments before it */
} attn_bufs;

/* Carves thread ith's scratch (unless base is NULL); returns the stride (floats). */
static size_t attn_bufs_at(float *base, size_t H, size_t G, size_t P, attn_bufs *s) {
    size_t T = ATTN_TILE, sizes[4] = {T * P, T * P, P, G * T}, off = 0;
    float **dst[4] = {&s->kt, &s->vt, &s->zero, &s->sc};
    for (int i = 0; i < 4; i++) {
        if (base) *dst[i] = base + off;
        off += up16(sizes[i]);
    }
    for (int u = 0; u < ATTN_QT; u++) {
        if (base) s->q[u] = base + off;
        off += up16(H * P);
        off += attn_state_at(base ? base + off : NULL, H, P, &s->seg[u]);
        off += attn_state_at(base ? base + off : NULL, H, P, &s->run[u]);
    }
    return off;
}

static bool cpu_supports(pgd_op op, pgd_type type) {
    if (op == PGD_OP_MATMUL || op == PGD_OP_EMBED) return pgd_cpu_type_supported(type);
    return true;
}

static void cpu_free(pgd_backend *be) {
    cpu_state *st = be->impl;
    if (!st) return;
    free(st->act);
    free(st->panel);
    free(st->rope_cos);
    free(st->rope_sin);
    free(st->attn_scratch);
    free(st->attn_part);
    free(st->attn_first);
    free(st->attn_items);
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
    size_t half = (size_t)head_dim / 2;
    int nth = be->pool ? pgd_pool_n_threads(be->pool) : 1;
    st->attn_group = n_kv_head > 0 ? n_head / n_kv_head : 1;
    if (st->attn_group < 1) st->attn_group = 1;
    st->attn_hdp = (head_dim + 7) / 8 * 8;
    attn_bufs tmp;
    st->attn_stride = attn_bufs_at(NULL, (size_t)n_head, (size_t)st->attn_group,
                                   (size_t)st->attn_hdp, &tmp);
    st->max_split = 2 * nth;
    st->act = calloc((size_t)max_tokens * act_row_bytes + 1, 1);
    st->panel = calloc(pgd_cpu_matmul_panel_bytes(act_row_bytes, nth) + 1, 1);
    st->rope_set = (size_t)max_tokens * half;
    st->rope_cos = calloc(2 * st->rope_set + 1, sizeof(float));
    st->rope_sin = calloc(2 * st->rope_set + 1, sizeof(float));
    size_t scr_bytes = (size_t)nth * st->attn_stride * sizeof(float);
    st->attn_scratch = aligned_alloc(64, scr_bytes ? scr_bytes : 64);
    st->attn_part = aligned_alloc(64, ATTN_PART_BYTES);
    st->attn_first = calloc((size_t)st->max_split + 1, sizeof *st->attn_first);
    st->attn_items = calloc((size_t)max_tokens + 1, sizeof *st->attn_items);
    if (!st->act || !st->panel || !st->rope_cos || !st->rope_sin || !st->attn_scratch ||
        !st->attn_part || !st->attn_first || !st->attn_items) {
        cpu_free(be);
        return pgd_err_set(err, PGD_ENOMEM, "CPU backend: out of memory for %d tokens",
                           max_tokens);
    }
    memset(st->attn_scratch, 0, scr_bytes);
    return PGD_OK;
}

static void *cpu_alloc(pgd_backend *be, size_t bytes) { return calloc(bytes ? bytes : 1, 1); }
static void cpu_mem_free(pgd_backend *be, void *p) { free(p); }
static int cpu_copy(pgd_backend *be, void *dst, const void *src, size_t bytes) {
    memcpy(dst, src, bytes);
    return PGD_OK;
}
static int cpu_sync(pgd_backend *be) { return PGD_OK; }

/* ---- Parallel loops ------------------------------------------------------------------------ */

typedef void (*range_fn)(void *ctx, long lo, long hi);
typedef struct par_ctx {
    range_fn fn;
    void *ctx;
    long n, per;
} par_ctx;

static void par_chunk(void *arg, long c, int ith) {
    const par_ctx *p = arg;
    long lo = c * p->per, hi = lo + p->per < p->n ? lo + p->per : p->n;
    p->fn(p->ctx, lo, hi);
}

/* Calls fn over [0, n) units: on the calling thread when the work (n * unit_cost) would not pay
 * for waking the pool, else in chunks (whole multiples of `align` units) claimed dynamically.
 * fn must compute each unit the same way whatever range it comes in. */
static void par_for(pgd_backend *be, range_fn fn, void *ctx, long n, long unit_cost,
                    long align) {
    if (n <= 0) return;
    int nth = be->pool ? pgd_pool_n_threads(be->pool) : 1;
    if (nth == 1 || n * unit_cost < PAR_MIN_WORK) {
        fn(ctx, 0, n);
        return;
    }
    long n_chunks = (long)nth * PAR_CHUNKS_PER_THREAD;
    long per = (n + n_chunks - 1) / n_chunks;
    per = (per + align - 1) / align * align;
    par_ctx pc = {fn, ctx, n, per};
    pgd_pool_run_chunks(be->pool, par_chunk, &pc, (n + per - 1) / per);
}

/* ---- Step setup, embedding ----------------------------------------------------------------- */

typedef struct begin_ctx {
    cpu_state *st;
    const pgd_step *s;
    const pgd_rope_params *rp;
} begin_ctx;

static void begin_rows(void *arg, long lo, long hi) {
    const begin_ctx *c = arg;
    int half = c->rp->head_dim / 2;
    for (int set = 0; set < (c->rp->inv_freq_local ? 2 : 1); set++) {
        const float *inv = set ? c->rp->inv_freq_local : c->rp->inv_freq;
        float *co = c->st->rope_cos + set * c->st->rope_set;
        float *si = c->st->rope_sin + set * c->st->rope_set;
        for (long t = lo; t < hi; t++)
            for (int i = 0; i < half; i++) {
                float ang = (float)c->s->pos[t] * inv[i];
                co[(size_t)t * half + i] = cosf(ang);
                si[(size_t)t * half + i] = sinf(ang);
            }
    }
}

static int cpu_begin(pgd_backend *be, const pgd_step *s, const pgd_rope_params *rp) {
    begin_ctx c = {be->impl, s, rp};
    par_for(be, begin_rows, &c, s->n_tokens, 16L * (rp->head_dim / 2), 1);
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

/* ---- RMS norm, residual adds --------------------------------------------------------------- */

/* sum x[i]^2 in one fixed order for a given n: four 8-lane accumulators over 32 elements, then 8
 * at a time into the first, a fixed tree, then the scalar tail. */
static float sum_sq(const float *x, int n) {
    int i = 0;
    float s = 0.0f;
#ifdef __AVX2__
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (; i + 32 <= n; i += 32) {
        __m256 x0 = _mm256_loadu_ps(x + i), x1 = _mm256_loadu_ps(x + i + 8);
        __m256 x2 = _mm256_loadu_ps(x + i + 16), x3 = _mm256_loadu_ps(x + i + 24);
        a0 = _mm256_fmadd_ps(x0, x0, a0);
        a1 = _mm256_fmadd_ps(x1, x1, a1);
        a2 = _mm256_fmadd_ps(x2, x2, a2);
        a3 = _mm256_fmadd_ps(x3, x3, a3);
    }
    for (; i + 8 <= n; i += 8) {
        __m256 x0 = _mm256_loadu_ps(x + i);
        a0 = _mm256_fmadd_ps(x0, x0, a0);
    }
    s = pgd_hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
#endif
    for (; i < n; i++) s += x[i] * x[i];
    return s;
}

/* out = w * (x * scale), elementwise */
static void scale_mul(float *out, const float *x, const float *w, float scale, int n) {
    int i = 0;
#ifdef __AVX2__
    __m256 vs = _mm256_set1_ps(scale);
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_loadu_ps(w + i),
                                                _mm256_mul_ps(_mm256_loadu_ps(x + i), vs)));
#endif
    for (; i < n; i++) out[i] = w[i] * (x[i] * scale);
}

/* x += y, elementwise (exact IEEE adds: vector and scalar agree) */
static void add_vec(float *x, const float *y, size_t n) {
    size_t i = 0;
#ifdef __AVX2__
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(x + i, _mm256_add_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
#endif
    for (; i < n; i++) x[i] += y[i];
}

typedef struct norm_ctx {
    float *x;
    const float *d, *w;
    float *out;
    int dim;
    float eps;
} norm_ctx;

static void norm_rows(void *arg, long lo, long hi) {
    const norm_ctx *c = arg;
    for (long t = lo; t < hi; t++) {
        float *x = c->x + (size_t)t * c->dim;
        if (c->d) add_vec(x, c->d + (size_t)t * c->dim, (size_t)c->dim);
        float scale = 1.0f / sqrtf(sum_sq(x, c->dim) / (float)c->dim + c->eps);
        scale_mul(c->out + (size_t)t * c->dim, x, c->w, scale, c->dim);
    }
}

static void cpu_rms_norm(pgd_backend *be, const float *x, const float *w, float *out, int n_rows,
                         int dim, float eps) {
    norm_ctx c = {(float *)x, NULL, w, out, dim, eps}; /* x is only read without d */
    par_for(be, norm_rows, &c, n_rows, 3L * dim, 1);
}

static void cpu_add_rms_norm(pgd_backend *be, float *x, const float *d, const float *w, float *out,
                             int n_rows, int dim, float eps) {
    norm_ctx c = {x, d, w, out, dim, eps};
    par_for(be, norm_rows, &c, n_rows, 4L * dim, 1);
}

/* Each head is a row of head_dim: the rows of q, then those of k, normalized in place
 * (scale_mul reads each element before it writes it). */
static void cpu_qk_norm(pgd_backend *be, float *q, float *k, const float *wq, const float *wk,
                        int n_rows, int n_head, int n_kv_head, int head_dim, float eps) {
    norm_ctx cq = {q, NULL, wq, q, head_dim, eps}, ck = {k, NULL, wk, k, head_dim, eps};
    par_for(be, norm_rows, &cq, (long)n_rows * n_head, 3L * head_dim, 1);
    par_for(be, norm_rows, &ck, (long)n_rows * n_kv_head, 3L * head_dim, 1);
}

static void cpu_matmul(pgd_backend *be, const pgd_weight *w, const float *x, float *y, int n) {
    cpu_state *st = be->impl;
    pgd_cpu_matmul(be->pool, w, x, y, n, st->act, st->act_row_bytes, st->panel);
}

typedef struct bias_ctx {
    float *y;
    const float *b;
    int dim;
} bias_ctx;

static void bias_rows(void *arg, long lo, long hi) {
    const bias_ctx *c = arg;
    for (long t = lo; t < hi; t++) add_vec(c->y + (size_t)t * c->dim, c->b, (size_t)c->dim);
}

static void cpu_add_bias(pgd_backend *be, float *y, const float *b, int n_rows, int dim) {
    if (!b) return;
    bias_ctx c = {y, b, dim};
    par_for(be, bias_rows, &c, n_rows, dim, 1);
}

typedef struct add_ctx {
    float *x;
    const float *y;
} add_ctx;

static void add_range(void *arg, long lo, long hi) {
    const add_ctx *c = arg;
    add_vec(c->x + lo, c->y + lo, (size_t)(hi - lo));
}

static void cpu_add(pgd_backend *be, float *x, const float *y, size_t n) {
    add_ctx c = {x, y};
    par_for(be, add_range, &c, (long)n, 1, 64);
}

/* ---- LoRA ---------------------------------------------------------------------------------- */

/* Element i of a LoRA matrix of type t (F32, F16 or BF16), widened exactly. */
static inline float lora_el(const void *p, pgd_type t, size_t i) {
    if (t == PGD_TYPE_F32) return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    return t == PGD_TYPE_F16 ? pgd_fp16_to_fp32(h) : pgd_bf16_to_fp32(h);
}

#ifdef __AVX2__
static inline __m256 lora_load8(const void *p, pgd_type t, size_t i) {
    if (t == PGD_TYPE_F32) return _mm256_loadu_ps((const float *)p + i);
    const uint16_t *q = (const uint16_t *)p + i;
    return t == PGD_TYPE_F16 ? pgd_load8_f16(q) : pgd_load8_bf16(q);
}
#endif

/* a . x (a of type t) in one fixed order whatever the caller (so a row's result never depends on
 * the batch): 32 interleaved partial sums, then 8, then a fixed tree. */
static float lora_dot(const void *a, pgd_type t, const float *x, int n) {
    int i = 0;
    float s[8];
#ifdef __AVX2__
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                     _mm256_setzero_ps()};
    for (; i + 32 <= n; i += 32)
        for (int k = 0; k < 4; k++)
            acc[k] = _mm256_fmadd_ps(lora_load8(a, t, (size_t)(i + 8 * k)),
                                     _mm256_loadu_ps(x + i + 8 * k), acc[k]);
    acc[0] = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    for (; i + 8 <= n; i += 8)
        acc[0] = _mm256_fmadd_ps(lora_load8(a, t, (size_t)i), _mm256_loadu_ps(x + i), acc[0]);
    _mm256_storeu_ps(s, acc[0]);
#else
    memset(s, 0, sizeof s);
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) s[k] += lora_el(a, t, (size_t)(i + k)) * x[i + k];
#endif
    for (int k = 0; i < n; i++, k++) s[k] += lora_el(a, t, (size_t)i) * x[i];
    return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
}

typedef struct lora_ctx {
    const pgd_lora_mat *mats;
    const int32_t *adapter;
    const float *x;
    float *y, *work;
    int n_rows, n_in, n_out, max_rank;
} lora_ctx;

static const pgd_lora_mat *lora_of(const lora_ctx *c, long t) {
    int32_t k = c->adapter[t];
    return k > 0 && c->mats[k - 1].a ? &c->mats[k - 1] : NULL;
}

/* u[t][j] = A[j] . x[t] for units i = t * max_rank + j in [lo, hi) (rows t with an adapter,
 * j below its rank): one dot product each, so a single row's spreads over the pool too. */
static void lora_down(void *arg, long lo, long hi) {
    const lora_ctx *c = arg;
    for (long i = lo; i < hi; i++) {
        long t = i / c->max_rank;
        int j = (int)(i % c->max_rank);
        const pgd_lora_mat *lm = lora_of(c, t);
        if (!lm || j >= lm->rank) continue;
        c->work[i] = lora_dot((const char *)lm->a + (size_t)j * lm->lda * pgd_dtype_size(lm->type),
                              lm->type, c->x + (size_t)t * c->n_in, c->n_in);
    }
}

/* y[t][o] += scale * (B u[t])[o] for outputs o in [lo, hi), every row t with an adapter: per
 * output, the sum over j of u[t][j] B[o][j] in increasing j, then the scale. 32 or 8 outputs at
 * a time from the transposed B, each lane summing in that same order, so the grouping (and the
 * range) never changes a result; the last n_out % 8 one at a time in the same order. A range
 * of outputs reads its part of B once for all the rows. */
static void lora_up(void *arg, long lo, long hi) {
    const lora_ctx *c = arg;
    for (long t = 0; t < c->n_rows; t++) {
        const pgd_lora_mat *lm = lora_of(c, t);
        if (!lm) continue;
        const float *u = c->work + (size_t)t * c->max_rank;
        float *y = c->y + (size_t)t * c->n_out;
        long o = lo;
#ifdef __AVX2__
        __m256 sc = _mm256_set1_ps(lm->scale);
        for (; o + 32 <= hi; o += 32) { /* four independent chains */
            __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                             _mm256_setzero_ps()};
            for (int j = 0; j < lm->rank; j++) {
                __m256 uj = _mm256_set1_ps(u[j]);
                size_t bj = (size_t)j * lm->ldb + (size_t)o;
                for (int k = 0; k < 4; k++)
                    acc[k] = _mm256_fmadd_ps(uj, lora_load8(lm->bt, lm->type, bj + 8 * (size_t)k),
                                             acc[k]);
            }
            for (int k = 0; k < 4; k++)
                _mm256_storeu_ps(y + o + 8 * k,
                                 _mm256_fmadd_ps(acc[k], sc, _mm256_loadu_ps(y + o + 8 * k)));
        }
        for (; o + 8 <= hi; o += 8) {
            __m256 acc = _mm256_setzero_ps();
            for (int j = 0; j < lm->rank; j++)
                acc = _mm256_fmadd_ps(_mm256_set1_ps(u[j]),
                                      lora_load8(lm->bt, lm->type, (size_t)j * lm->ldb + (size_t)o),
                                      acc);
            _mm256_storeu_ps(y + o, _mm256_fmadd_ps(acc, sc, _mm256_loadu_ps(y + o)));
        }
#endif
        for (; o < hi; o++) {
            float acc = 0;
            for (int j = 0; j < lm->rank; j++)
                acc = fmaf(u[j], lora_el(lm->bt, lm->type, (size_t)j * lm->ldb + (size_t)o), acc);
            y[o] = fmaf(acc, lm->scale, y[o]);
        }
    }
}

static void cpu_lora(pgd_backend *be, const pgd_lora_mat *mats, const int32_t *adapter,
                     const float *x, float *y, float *work, int n_rows, int n_in, int n_out,
                     int max_rank) {
    lora_ctx c = {mats, adapter, x, y, work, n_rows, n_in, n_out, max_rank};
    par_for(be, lora_down, &c, (long)n_rows * max_rank, n_in, 1);
    par_for(be, lora_up, &c, n_out, (long)max_rank * n_rows, 32);
}

/* ---- RoPE ---------------------------------------------------------------------------------- */

typedef struct rope_ctx {
    const float *cos, *sin; /* the staged angles of the set rotated by */
    float *x;
    int n_heads, hd;
    bool neox;
    int stride, off;        /* a head's rotated part at x + head * stride + off (0, 0: hd, 0) */
} rope_ctx;

/* Each pair (a, b) -> (a cos - b sin, b cos + a sin), the second product fused into the first
 * in both the vector lanes and the scalar tail, so every pair is rotated the same way. */
static void rope_rows(void *arg, long lo, long hi) {
    const rope_ctx *c = arg;
    int hd = c->hd, half = hd / 2;
    for (long t = lo; t < hi; t++) {
        const float *cs = c->cos + (size_t)t * half;
        const float *sn = c->sin + (size_t)t * half;
        for (int h = 0; h < c->n_heads; h++) {
            float *v = c->x + ((size_t)t * c->n_heads + h) * (c->stride ? c->stride : hd) + c->off;
            int i = 0;
            if (c->neox) {
#ifdef __AVX2__
                for (; i + 8 <= half; i += 8) {
                    __m256 a = _mm256_loadu_ps(v + i), b = _mm256_loadu_ps(v + half + i);
                    __m256 co = _mm256_loadu_ps(cs + i), si = _mm256_loadu_ps(sn + i);
                    _mm256_storeu_ps(v + i, _mm256_fmsub_ps(a, co, _mm256_mul_ps(b, si)));
                    _mm256_storeu_ps(v + half + i, _mm256_fmadd_ps(b, co, _mm256_mul_ps(a, si)));
                }
#endif
                for (; i < half; i++) {
                    float a = v[i], b = v[i + half];
                    v[i] = PGD_FMAF(a, cs[i], -(b * sn[i]));
                    v[i + half] = PGD_FMAF(b, cs[i], a * sn[i]);
                }
            } else {
#ifdef __AVX2__
                /* 4 pairs per vector: [a0 b0 a1 b1 ..] * [c0 c0 c1 c1 ..] fused with
                 * [b0 a0 b1 a1 ..] * [-s0 s0 -s1 s1 ..] */
                const __m256 sign = _mm256_setr_ps(-0.0f, 0.0f, -0.0f, 0.0f, -0.0f, 0.0f, -0.0f,
                                                   0.0f);
                for (; i + 4 <= half; i += 4) {
                    __m128 c4 = _mm_loadu_ps(cs + i), s4 = _mm_loadu_ps(sn + i);
                    __m256 cd = _mm256_set_m128(_mm_unpackhi_ps(c4, c4), _mm_unpacklo_ps(c4, c4));
                    __m256 sd = _mm256_set_m128(_mm_unpackhi_ps(s4, s4), _mm_unpacklo_ps(s4, s4));
                    __m256 ab = _mm256_loadu_ps(v + 2 * i);
                    __m256 ba = _mm256_permute_ps(ab, 0xB1);
                    __m256 r = _mm256_fmadd_ps(ab, cd, _mm256_mul_ps(ba, _mm256_xor_ps(sd, sign)));
                    _mm256_storeu_ps(v + 2 * i, r);
                }
#endif
                for (; i < half; i++) {
                    float a = v[2 * i], b = v[2 * i + 1];
                    v[2 * i] = PGD_FMAF(a, cs[i], b * -sn[i]);
                    v[2 * i + 1] = PGD_FMAF(b, cs[i], a * sn[i]);
                }
            }
        }
    }
}

/* Rotates each head of x (n rows of n_heads * head_dim) by the angles staged in begin. */
static void cpu_rope(pgd_backend *be, float *x, int n, int n_heads, const pgd_rope_params *rp) {
    const cpu_state *st = be->impl;
    size_t off = rp->local ? st->rope_set : 0;
    rope_ctx c = {st->rope_cos + off, st->rope_sin + off, x, n_heads, rp->head_dim,
                  rp->mode == 1, 0, 0};
    par_for(be, rope_rows, &c, n, 2L * n_heads * rp->head_dim, 1);
}

/* ---- KV store ------------------------------------------------------------------------------ */

/* One K or V row of n elements into storage of type dt at row (its bytes). */
static void store_row(pgd_type dt, void *row, const float *x, int n) {
    if (dt == PGD_TYPE_F32) {
        memcpy(row, x, (size_t)n * sizeof *x);
        return;
    }
    if (dt == PGD_TYPE_Q8_0 || dt == PGD_TYPE_Q4_0) {
        pgd_kv_quantize_row(dt, x, row, n);
        return;
    }
    uint16_t *d = row;
    int i = 0;
    if (dt == PGD_TYPE_F16) {
#ifdef __AVX2__
        for (; i + 8 <= n; i += 8) pgd_store8_f16(d + i, _mm256_loadu_ps(x + i));
#endif
        for (; i < n; i++) d[i] = pgd_fp32_to_fp16(x[i]);
    } else {
#ifdef __AVX2__
        for (; i + 8 <= n; i += 8) pgd_store8_bf16(d + i, _mm256_loadu_ps(x + i));
#endif
        for (; i < n; i++) d[i] = pgd_fp32_to_bf16(x[i]);
    }
}

typedef struct kv_store_ctx {
    const pgd_kv_layer *kv;
    const float *k, *v;
    const pgd_step *s;
} kv_store_ctx;

static void kv_store_rows(void *arg, long lo, long hi) {
    const kv_store_ctx *c = arg;
    const pgd_kv_layer *kv = c->kv;
    size_t kv_dim = (size_t)kv->kv_dim;
    size_t krb = pgd_type_row_bytes(kv->dtype, kv_dim), vrb = pgd_type_row_bytes(kv->vtype, kv_dim);
    for (long t = lo; t < hi; t++) {
        size_t slot = (size_t)c->s->slot[t];
        store_row(kv->dtype, (char *)kv->k + slot * krb, c->k + (size_t)t * kv_dim, (int)kv_dim);
        if (kv->v != kv->k) /* (a latent cache's V is its K: pgd_kv_layer) */
            store_row(kv->vtype, (char *)kv->v + slot * vrb, c->v + (size_t)t * kv_dim,
                      (int)kv_dim);
    }
}

static void cpu_kv_store(pgd_backend *be, const pgd_kv_layer *kv, const float *k, const float *v,
                         const pgd_step *s) {
    kv_store_ctx c = {kv, k, v, s};
    par_for(be, kv_store_rows, &c, s->n_tokens, 2L * kv->kv_dim, 1);
}

/* The composition of the three ops: on the CPU each is one parallel pass already, and K is
 * roped in place, so results are those of rope + rope + kv_store. */
static void cpu_rope_kv_store(pgd_backend *be, float *q, float *k, const float *v, int n_head,
                              int n_kv_head, const pgd_kv_layer *kv, const pgd_step *s,
                              const pgd_rope_params *rp) {
    cpu_rope(be, q, s->n_tokens, n_head, rp);
    cpu_rope(be, k, s->n_tokens, n_kv_head, rp);
    cpu_kv_store(be, kv, k, v, s);
}

/* ---- multi-head latent attention (DeepSeek) ------------------------------------------------ */

typedef struct mla_ctx {
    const float *w;        /* (n_head, n_out, n_in) */
    const float *x;        /* head h of row t at x + t * xs + h * xh */
    float *y;              /* head h of row t at y + t * ys + h * yh */
    int n_head, n_in, n_out, xs, xh, ys, yh;
    int tail;              /* elements copied after the n_out products (x's, from n_in on) */
    float tail_scale;
} mla_ctx;

/* Unit u = (row u / n_head, head u % n_head): n_out fixed-order dot products (lora_dot), then
 * the tail copied, so a row's values never depend on the step. */
static void mla_heads(void *arg, long lo, long hi) {
    const mla_ctx *c = arg;
    for (long u = lo; u < hi; u++) {
        long t = u / c->n_head, h = u % c->n_head;
        const float *x = c->x + (size_t)t * c->xs + (size_t)h * c->xh;
        const float *w = c->w + (size_t)h * c->n_out * c->n_in;
        float *y = c->y + (size_t)t * c->ys + (size_t)h * c->yh;
        for (int j = 0; j < c->n_out; j++)
            y[j] = lora_dot(w + (size_t)j * c->n_in, PGD_TYPE_F32, x, c->n_in);
        for (int j = 0; j < c->tail; j++) y[c->n_out + j] = x[c->n_in + j] * c->tail_scale;
    }
}

static void cpu_mla_q(pgd_backend *be, const float *w_uk_t, const float *qf, float *q, int n,
                      int n_head, int nope, int rope, int r, float rope_attn,
                      const pgd_rope_params *rp) {
    const cpu_state *st = be->impl;
    float af = rope_attn > 0 ? rope_attn : 1.0f;
    /* (YaRN's factor multiplies q's and k's rotated parts; both on q here: the same scores) */
    mla_ctx c = {w_uk_t, qf, q, n_head, nope, r, n_head * (nope + rope), nope + rope,
                 n_head * (r + rope), r + rope, rope, af * af};
    par_for(be, mla_heads, &c, (long)n * n_head, 2L * nope * r, 1);
    rope_ctx rc = {st->rope_cos, st->rope_sin, q, n_head, rope, rp->mode == 1, r + rope, r};
    par_for(be, rope_rows, &rc, n, 2L * n_head * rope, 1);
}

typedef struct mla_norm_ctx {
    float *x;
    const float *w;
    int dim, stride;
    float eps;
} mla_norm_ctx;

static void mla_norm_rows(void *arg, long lo, long hi) {
    const mla_norm_ctx *c = arg;
    for (long t = lo; t < hi; t++) { /* in place: scale_mul reads each element before writing */
        float *x = c->x + (size_t)t * c->stride;
        float scale = 1.0f / sqrtf(sum_sq(x, c->dim) / (float)c->dim + c->eps);
        scale_mul(x, x, c->w, scale, c->dim);
    }
}

static void cpu_mla_kv(pgd_backend *be, float *kv_rows, const float *norm_w, float eps, int n,
                       int r, int rope, const pgd_kv_layer *kv, const pgd_step *s,
                       const pgd_rope_params *rp) {
    const cpu_state *st = be->impl;
    mla_norm_ctx nc = {kv_rows, norm_w, r, r + rope, eps};
    par_for(be, mla_norm_rows, &nc, n, 3L * r, 1);
    rope_ctx rc = {st->rope_cos, st->rope_sin, kv_rows, 1, rope, rp->mode == 1, r + rope, r};
    par_for(be, rope_rows, &rc, n, 2L * rope, 1);
    cpu_kv_store(be, kv, kv_rows, kv_rows, s);
}

static void cpu_mla_o(pgd_backend *be, const float *w_uv, const float *o, float *out, int n,
                      int n_head, int r, int rope, int v) {
    mla_ctx c = {w_uv, o, out, n_head, r, v, n_head * (r + rope), r + rope, n_head * v, v, 0, 0};
    par_for(be, mla_heads, &c, (long)n * n_head, 2L * r * v, 1);
}

/* ---- Attention ----------------------------------------------------------------------------- */

typedef struct attn_ctx {
    cpu_state *st;
    const float *q;
    const pgd_kv_layer *kv;
    float *out;
    int n_head, n_kv_head, hd, hdp;
    const pgd_step *s;
    int window;     /* kv->window: a token at pos attends to positions > pos - window; 0: all */
    float scale;    /* of q.k */
    float softcap;  /* kv->softcap: scores become softcap * tanh(score / softcap); 0: not */
    bool split;     /* one item per (token, segment), merged by a second pass */
    long n_items;   /* unsplit: work items (st->attn_items) */
    size_t pstride; /* floats of one segment state in st->attn_part */
} attn_ctx;

/* The first position the token at pos attends to. */
static inline int attn_lo(const attn_ctx *a, int pos) {
    return a->window > 0 && pos >= a->window ? pos - a->window + 1 : 0;
}

/* One head's slice of a K or V row (at row, its bytes) as hdp floats: the storage itself for
 * F32 rows that need no padding, else converted (F16C / shifts; a quantized row's blocks
 * dequantized) into buf and zero-padded. */
static const float *kv_row(pgd_type dt, const void *row, float *buf, int hd, int hdp) {
    if (dt == PGD_TYPE_F32 && hd == hdp) return row;
    int i = 0;
    if (dt == PGD_TYPE_F32) {
        memcpy(buf, row, (size_t)hd * sizeof *buf);
        i = hd;
    } else if (dt == PGD_TYPE_Q8_0 || dt == PGD_TYPE_Q4_0) {
        pgd_dequantize_row(dt, row, buf, hd);
        i = hd;
    } else if (dt == PGD_TYPE_F16) {
        const uint16_t *s = row;
#ifdef __AVX2__
        for (; i + 8 <= hd; i += 8) _mm256_storeu_ps(buf + i, pgd_load8_f16(s + i));
#endif
        for (; i < hd; i++) buf[i] = pgd_fp16_to_fp32(s[i]);
    } else {
        const uint16_t *s = row;
#ifdef __AVX2__
        for (; i + 8 <= hd; i += 8) _mm256_storeu_ps(buf + i, pgd_load8_bf16(s + i));
#endif
        for (; i < hd; i++) buf[i] = pgd_bf16_to_fp32(s[i]);
    }
    for (; i < hdp; i++) buf[i] = 0.0f;
    return buf;
}

#ifdef __AVX2__
/* 8 elements i .. i + 7 of a K/V row of element type DT (0 F32, 1 F16, 2 BF16) as floats: the
 * conversions are exact, so a kernel gives the same bits on converted or direct rows. */
static inline __attribute__((always_inline)) __m256 kv_load8(int DT, const void *row, int i) {
    if (DT == 0) return _mm256_loadu_ps((const float *)row + i);
    if (DT == 1) return pgd_load8_f16((const uint16_t *)row + i);
    return pgd_load8_bf16((const uint16_t *)row + i);
}
#endif

/* Scores of R (<= 3) query rows against 4 K rows (positions j0 .. j0 + 3 of the tile):
 * sc[r * ATTN_TILE + j0 + p] = scale * (q_r . k_p). Each K load serves the R rows; every score is
 * one 8-lane FMA chain over the head's dims, then the lanes summed in the tree of pgd_hsum8x8, so
 * a score's bits depend on neither R nor the position's place in the tile. */
#ifdef __AVX2__
static inline __attribute__((always_inline)) void scores_blk(int R, int DT, const float *q,
                                                             int hdp, const void *const *k,
                                                             __m256 vscale, float *sc) {
    __m256 acc[3][4];
#pragma GCC unroll 3
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int p = 0; p < 4; p++) acc[r][p] = _mm256_setzero_ps();
    for (int i = 0; i < hdp; i += 8) {
        __m256 qv[3];
#pragma GCC unroll 3
        for (int r = 0; r < R; r++) qv[r] = _mm256_loadu_ps(q + (size_t)r * hdp + i);
#pragma GCC unroll 4
        for (int p = 0; p < 4; p++) {
            __m256 kv = kv_load8(DT, k[p], i);
#pragma GCC unroll 3
            for (int r = 0; r < R; r++) acc[r][p] = _mm256_fmadd_ps(qv[r], kv, acc[r][p]);
        }
    }
#pragma GCC unroll 3
    for (int r = 0; r < R; r++) {
        __m256 u = _mm256_hadd_ps(_mm256_hadd_ps(acc[r][0], acc[r][1]),
                                  _mm256_hadd_ps(acc[r][2], acc[r][3]));
        __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1));
        _mm_storeu_ps(sc + (size_t)r * ATTN_TILE, _mm_mul_ps(s4, _mm256_castps256_ps128(vscale)));
    }
}
#endif

#ifdef __AVX2__
static inline __attribute__((always_inline)) void scores_rows(int R, int DT, const float *q,
                                                              int hdp, const void *const *k,
                                                              __m256 vscale, float *sc) {
    if (R == 3) scores_blk(3, DT, q, hdp, k, vscale, sc);
    else if (R == 2) scores_blk(2, DT, q, hdp, k, vscale, sc);
    else scores_blk(1, DT, q, hdp, k, vscale, sc);
}
#endif

/* sc[g * ATTN_TILE + j] = scale * (q_g . k_j) for the group's G query rows (q: (G, hdp)) and
 * j < n (n <= ATTN_TILE); sc[.. + j] = -inf for j in [n, round8(n)). kp has round8(n) entries,
 * those past n pointing at zeros. */
static void tile_scores(const float *q, int G, int DT, const void *const *kp, int n, int hdp,
                        float scale, float *sc) {
    int nr = (n + 7) / 8 * 8;
#ifdef __AVX2__
    const __m256 vscale = _mm256_set1_ps(scale);
    for (int g = 0; g < G; g += 3) {
        int R = G - g < 3 ? G - g : 3;
        const float *qg = q + (size_t)g * hdp;
        float *sg = sc + (size_t)g * ATTN_TILE;
        for (int j0 = 0; j0 < nr; j0 += 4) {
            if (DT == 0) scores_rows(R, 0, qg, hdp, kp + j0, vscale, sg + j0);
            else if (DT == 1) scores_rows(R, 1, qg, hdp, kp + j0, vscale, sg + j0);
            else scores_rows(R, 2, qg, hdp, kp + j0, vscale, sg + j0);
        }
    }
    for (int g = 0; g < G; g++)
        for (int j = n; j < nr; j++) sc[(size_t)g * ATTN_TILE + j] = -INFINITY;
#else
    for (int g = 0; g < G; g++)
        for (int j = 0; j < nr; j++) {
            float d = 0.0f;
            for (int i = 0; i < hdp; i++) d += q[(size_t)g * hdp + i] * ((const float *)kp[j])[i];
            sc[(size_t)g * ATTN_TILE + j] = j < n ? d * scale : -INFINITY;
        }
#endif
}

/* x[0 .. n) = c tanh(x / c), by tanh(y) = 1 - 2 / (1 + exp(2y)), vector and tail alike
 * (padded), so a score's value does not depend on where it falls. */
static void softcap_row(float *x, long n, float c) {
    float inv = 1.0f / c;
    long i = 0;
#ifdef __AVX2__
    const __m256 vi = _mm256_set1_ps(2.0f * inv), vc = _mm256_set1_ps(c);
    const __m256 one = _mm256_set1_ps(1.0f), two = _mm256_set1_ps(2.0f);
    for (; i < n; i += 8) {
        float t[8] = {0};
        int r = n - i < 8 ? (int)(n - i) : 8;
        memcpy(t, x + i, (size_t)r * sizeof *t);
        __m256 e = pgd_exp8(_mm256_mul_ps(_mm256_loadu_ps(t), vi));
        __m256 th = _mm256_sub_ps(one, _mm256_div_ps(two, _mm256_add_ps(one, e)));
        _mm256_storeu_ps(t, _mm256_mul_ps(vc, th));
        memcpy(x + i, t, (size_t)r * sizeof *t);
    }
#else
    for (; i < n; i++) x[i] = c * (1.0f - 2.0f / (1.0f + pgd_expf_scalar(2.0f * inv * x[i])));
#endif
}

/* One query row over one tile: folds the tile's scores sc[0 .. round8(n)) into the running
 * maximum *mx and the per-lane probability sums lsum (8), leaving the probabilities in sc; acc
 * (hdp) is rescaled by exp(old max - new max) once per tile, only when the maximum grows. */
static void tile_softmax(float *sc, int n, int hdp, float *mx, float *lsum, float *acc) {
    int nr = (n + 7) / 8 * 8;
#ifdef __AVX2__
    __m256 vm = _mm256_loadu_ps(sc);
    for (int j = 8; j < nr; j += 8) vm = _mm256_max_ps(vm, _mm256_loadu_ps(sc + j));
    float tmax = pgd_hmax8(vm);
#else
    float tmax = sc[0];
    for (int j = 1; j < nr; j++) tmax = sc[j] > tmax ? sc[j] : tmax;
#endif
    if (tmax > *mx) {
        float corr = pgd_expf_scalar(*mx - tmax); /* 0 for the first tile (mx = -inf) */
        for (int i = 0; i < hdp; i++) acc[i] *= corr;
        for (int l = 0; l < 8; l++) lsum[l] *= corr;
        *mx = tmax;
    }
    float m = *mx;
#ifdef __AVX2__
    __m256 vmx = _mm256_set1_ps(m), ls = _mm256_loadu_ps(lsum);
    for (int j = 0; j < nr; j += 8) {
        __m256 p = pgd_exp8(_mm256_sub_ps(_mm256_loadu_ps(sc + j), vmx));
        ls = _mm256_add_ps(ls, p);
        _mm256_storeu_ps(sc + j, p);
    }
    _mm256_storeu_ps(lsum, ls);
#else
    for (int j = 0; j < nr; j++) {
        sc[j] = pgd_expf_scalar(sc[j] - m);
        lsum[j % 8] += sc[j];
    }
#endif
}

/* acc_r[i .. i + 8C) += sum_{j < n} p_r[j] v_j[i ..] for R (<= 3) rows (p_r = sc + r *
 * ATTN_TILE, acc_r = acc + r * hdp): each V load serves the R rows; every element is one FMA
 * chain in position order, whatever R and C. */
#ifdef __AVX2__
static inline __attribute__((always_inline)) void pv_blk(int R, int C, int DT, const float *sc,
                                                         int n, const void *const *vp, int i,
                                                         int hdp, float *acc) {
    __m256 a[3][4];
#pragma GCC unroll 3
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) a[r][c] = _mm256_loadu_ps(acc + (size_t)r * hdp + i + 8 * c);
    for (int j = 0; j < n; j++) {
        __m256 p[3];
#pragma GCC unroll 3
        for (int r = 0; r < R; r++) p[r] = _mm256_broadcast_ss(sc + (size_t)r * ATTN_TILE + j);
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) {
            __m256 vv = kv_load8(DT, vp[j], i + 8 * c);
#pragma GCC unroll 3
            for (int r = 0; r < R; r++) a[r][c] = _mm256_fmadd_ps(p[r], vv, a[r][c]);
        }
    }
#pragma GCC unroll 3
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) _mm256_storeu_ps(acc + (size_t)r * hdp + i + 8 * c, a[r][c]);
}
#endif

/* acc (G, hdp) += P (G, n) . V (n, hdp) for the tile (P in sc rows of ATTN_TILE). */
#ifdef __AVX2__
static inline __attribute__((always_inline)) void pv_rows(int R, int DT, const float *sc, int n,
                                                          const void *const *vp, int hdp,
                                                          float *acc) {
    int i = 0;
    for (; i + 32 <= hdp; i += 32) {
        if (R == 3) pv_blk(3, 4, DT, sc, n, vp, i, hdp, acc);
        else if (R == 2) pv_blk(2, 4, DT, sc, n, vp, i, hdp, acc);
        else pv_blk(1, 4, DT, sc, n, vp, i, hdp, acc);
    }
    for (; i < hdp; i += 8) {
        if (R == 3) pv_blk(3, 1, DT, sc, n, vp, i, hdp, acc);
        else if (R == 2) pv_blk(2, 1, DT, sc, n, vp, i, hdp, acc);
        else pv_blk(1, 1, DT, sc, n, vp, i, hdp, acc);
    }
}
#endif

static void tile_pv(const float *sc, int G, int DT, int n, const void *const *vp, int hdp,
                    float *acc) {
#ifdef __AVX2__
    for (int g = 0; g < G; g += 3) {
        int R = G - g < 3 ? G - g : 3;
        const float *sg = sc + (size_t)g * ATTN_TILE;
        float *ag = acc + (size_t)g * hdp;
        if (DT == 0) pv_rows(R, 0, sg, n, vp, hdp, ag);
        else if (DT == 1) pv_rows(R, 1, sg, n, vp, hdp, ag);
        else pv_rows(R, 2, sg, n, vp, hdp, ag);
    }
#else
    for (int g = 0; g < G; g++)
        for (int j = 0; j < n; j++)
            for (int i = 0; i < hdp; i++)
                acc[(size_t)g * hdp + i] += sc[(size_t)g * ATTN_TILE + j] *
                                            ((const float *)vp[j])[i];
#endif
}

/* Reads one word of every 64-byte line of n K and V rows (slots row[], krb and vrb bytes a
 * row) in address order. A KV head's slice of each row (a third of it for
 * SmolLM2) read tile by tile is a strided pattern the hardware prefetchers do not follow: from
 * DRAM half the rate of whole rows read in order, which stream and leave the tile in cache for
 * the heads (bench/RESULTS.md). */
static void touch_rows(const char *k, const char *v, const size_t *row, int n, size_t krb,
                       size_t vrb) {
    uint32_t x = 0;
    for (int j = 0; j < n; j++) {
        const char *kr = k + row[j] * krb, *vr = v + row[j] * vrb;
        for (size_t o = 0; o < krb || o < vrb; o += 64) {
            uint32_t u = 0, w = 0;
            if (o < krb) memcpy(&u, kr + o, sizeof u);
            if (o < vrb) memcpy(&w, vr + o, sizeof w);
            x |= u ^ w;
        }
    }
    __asm__ volatile("" : : "r"(x)); /* keeps the loads */
}

/* Folds positions [max(p0, lo[u]), p1[u]) (tile-aligned p0; p1[u] > lo[u]) of tokens tok[0 ..
 * m) of one sequence (queries q[u]) into the states z[u] (reset first): for each tile the K/V
 * rows are read (and converted) once per KV head and serve every query head of its GQA group in
 * each token; the softmax runs online over tiles in position order. A token's arithmetic is the
 * same whatever else is in tok[] (a row outside its own range is computed from real rows and
 * then masked; tiles wholly outside it are skipped). */
static void attn_segment(const attn_ctx *a, const attn_bufs *s, int m, const int *tok,
                         const float *const *q, int p0, const int *lo, const int *p1,
                         const attn_state *z) {
    const pgd_kv_layer *kv = a->kv;
    int hd = a->hd, hdp = a->hdp, n_head = a->n_head, n_kv_head = a->n_kv_head;
    int group = n_head / n_kv_head, bs = kv->block_size;
    size_t kv_dim = (size_t)kv->kv_dim;
    float scale = a->scale;
    const pgd_step *st = a->s;
    int t = tok[m - 1], pe = p0;
    const int32_t *bt = st->block_tables[st->seq[t]];
    /* The run holding its sequence's last token in the step (a decode; the run a prefill chunk
     * processes first, longest first) finds the context in DRAM and leaves it in cache for the
     * sequence's other runs. */
    bool touch = t + 1 == st->n_tokens || st->seq[t + 1] != st->seq[t];
    int ps = INT_MAX; /* the first tile any token attends to */
    for (int u = 0; u < m; u++) {
        int tl = lo[u] > p0 ? lo[u] / ATTN_TILE * ATTN_TILE : p0;
        if (tl < ps) ps = tl;
        for (int h = 0; h < n_head; h++) z[u].mx[h] = -INFINITY;
        memset(z[u].lsum, 0, (size_t)n_head * 8 * sizeof *z[u].lsum);
        memset(z[u].acc, 0, (size_t)n_head * hdp * sizeof *z[u].acc);
        if (p1[u] > pe) pe = p1[u];
    }
    const void *kp[ATTN_TILE], *vp[ATTN_TILE];
    size_t rows[ATTN_TILE]; /* the tile's slots */
    size_t krb = pgd_type_row_bytes(kv->dtype, kv_dim), vrb = pgd_type_row_bytes(kv->vtype, kv_dim);
    size_t khb = pgd_type_row_bytes(kv->dtype, (uint64_t)hd);
    size_t vhb = pgd_type_row_bytes(kv->vtype, (uint64_t)hd);
    /* F32/F16/BF16 rows whose head_dim is a multiple of 8 are read in place (AVX2 converts
     * F16/BF16 as it loads: kernel element types kdt, vdt); others, and quantized rows, are
     * converted (dequantized) and zero-padded into the thread's tile (kv_row), which the
     * kernels read as F32: one tile of one head at a time, never the context. */
#ifdef __AVX2__
    bool kdir = hd == hdp && pgd_type_block_elems(kv->dtype) == 1;
    bool vdir = hd == hdp && pgd_type_block_elems(kv->vtype) == 1;
    int kdt = !kdir || kv->dtype == PGD_TYPE_F32 ? 0 : kv->dtype == PGD_TYPE_F16 ? 1 : 2;
    int vdt = !vdir || kv->vtype == PGD_TYPE_F32 ? 0 : kv->vtype == PGD_TYPE_F16 ? 1 : 2;
#else
    bool kdir = kv->dtype == PGD_TYPE_F32 && hd == hdp;
    bool vdir = kv->vtype == PGD_TYPE_F32 && hd == hdp;
    int kdt = 0, vdt = 0;
#endif
    const char *kb = (const char *)kv->k, *vb = (const char *)kv->v;
    for (int j0 = ps; j0 < pe; j0 += ATTN_TILE) {
        int n = pe - j0 < ATTN_TILE ? pe - j0 : ATTN_TILE;
        for (int j = 0, blk = j0 / bs, o = j0 % bs; j < n; j++) { /* no division per row */
            rows[j] = (size_t)bt[blk] * bs + (size_t)o;
            if (++o == bs) o = 0, blk++;
        }
        if (touch) touch_rows(kv->k, kv->v, rows, n, krb, vrb);
        for (int kvh = 0; kvh < n_kv_head; kvh++) {
            for (int j = 0; j < n; j++) {
                const char *kr = kb + rows[j] * krb + (size_t)kvh * khb;
                const char *vr = vb + rows[j] * vrb + (size_t)kvh * vhb;
                kp[j] = kdir ? (const void *)kr
                             : kv_row(kv->dtype, kr, s->kt + (size_t)j * hdp, hd, hdp);
                vp[j] = vdir ? (const void *)vr
                             : kv_row(kv->vtype, vr, s->vt + (size_t)j * hdp, hd, hdp);
            }
            for (int j = n; j < (n + 7) / 8 * 8; j++) kp[j] = vp[j] = s->zero;
            int h0 = kvh * group;
            for (int u = 0; u < m; u++) {
                int nu = p1[u] - j0 < n ? p1[u] - j0 : n;
                if (nu <= 0 || j0 + n <= lo[u]) continue;
                const attn_state *zu = &z[u];
                tile_scores(q[u] + (size_t)h0 * hdp, group, kdt, kp, nu, hdp, scale, s->sc);
                if (a->softcap > 0)
                    for (int g = 0; g < group; g++)
                        softcap_row(s->sc + (size_t)g * ATTN_TILE, nu, a->softcap);
                for (int g = 0; g < group; g++) /* positions before the window */
                    for (int j = 0; j < lo[u] - j0; j++)
                        s->sc[(size_t)g * ATTN_TILE + j] = -INFINITY;
                for (int g = 0; g < group; g++)
                    tile_softmax(s->sc + (size_t)g * ATTN_TILE, nu, hdp, &zu->mx[h0 + g],
                                 zu->lsum + (size_t)(h0 + g) * 8,
                                 zu->acc + (size_t)(h0 + g) * hdp);
                tile_pv(s->sc, group, vdt, nu, vp, hdp, zu->acc + (size_t)h0 * hdp);
            }
        }
    }
}

/* Merges segment state z into the running state r (the segments in position order): the same
 * arithmetic whether z was just computed on this thread or kept from the first pass. */
static void attn_merge(attn_state *r, const attn_state *z, int n_head, int hdp, bool first) {
    size_t na = (size_t)n_head * hdp;
    if (first) {
        memcpy(r->mx, z->mx, (size_t)n_head * sizeof *r->mx);
        memcpy(r->lsum, z->lsum, (size_t)n_head * 8 * sizeof *r->lsum);
        memcpy(r->acc, z->acc, na * sizeof *r->acc);
        return;
    }
    for (int h = 0; h < n_head; h++) {
        float m = r->mx[h] > z->mx[h] ? r->mx[h] : z->mx[h];
        float c1 = pgd_expf_scalar(r->mx[h] - m), c2 = pgd_expf_scalar(z->mx[h] - m);
        r->mx[h] = m;
        for (int l = 0; l < 8; l++)
            r->lsum[(size_t)h * 8 + l] = r->lsum[(size_t)h * 8 + l] * c1 +
                                         z->lsum[(size_t)h * 8 + l] * c2;
        float *ra = r->acc + (size_t)h * hdp;
        const float *za = z->acc + (size_t)h * hdp;
        for (int i = 0; i < hdp; i++) ra[i] = ra[i] * c1 + za[i] * c2;
    }
}

/* Token t's output rows from its merged state. */
static void attn_finish(const attn_ctx *a, const attn_state *r, int t) {
    for (int h = 0; h < a->n_head; h++) {
        float *o = a->out + ((size_t)t * a->n_head + h) * a->hd;
        const float *l = r->lsum + (size_t)h * 8;
        float sum = ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
        float inv = 1.0f / sum;
        for (int i = 0; i < a->hd; i++) o[i] = r->acc[(size_t)h * a->hdp + i] * inv;
    }
}

/* Thread ith's scratch, and the queries of tokens t0 .. t0 + m - 1 (zero-padded into the
 * scratch if need be). */
static void attn_setup(const attn_ctx *a, int ith, int t0, int m, attn_bufs *s,
                       const float **q) {
    attn_bufs_at(a->st->attn_scratch + (size_t)ith * a->st->attn_stride, (size_t)a->n_head,
                 (size_t)a->st->attn_group, (size_t)a->hdp, s);
    for (int u = 0; u < m; u++) {
        q[u] = a->q + (size_t)(t0 + u) * a->n_head * a->hd;
        if (a->hd == a->hdp) continue;
        for (int h = 0; h < a->n_head; h++) {
            memcpy(s->q[u] + (size_t)h * a->hdp, q[u] + (size_t)h * a->hd,
                   (size_t)a->hd * sizeof *q[u]);
            memset(s->q[u] + (size_t)h * a->hdp + a->hd, 0,
                   (size_t)(a->hdp - a->hd) * sizeof *q[u]);
        }
        q[u] = s->q[u];
    }
    memset(s->zero, 0, (size_t)a->hdp * sizeof *s->zero);
}

/* One work item = up to ATTN_QT consecutive tokens of one sequence (every head), their segments
 * folded and merged in order; or, split, one (token, segment) whose state goes to st->attn_part
 * for attn_merge_item. Segments start at multiples of ATTN_SEG whatever the batch and the split,
 * so a token's output is the same in any batch. */
static void attn_item(void *arg, long chunk, int ith) {
    const attn_ctx *a = arg;
    attn_bufs s;
    const float *q[ATTN_QT];
    if (a->split) {
        const int32_t *first = a->st->attn_first;
        int t = 0;
        while (first[t + 1] <= chunk) t++;
        int n_pos = a->s->pos[t] + 1, lo = attn_lo(a, n_pos - 1);
        int p0 = (lo / ATTN_SEG + (int)(chunk - first[t])) * ATTN_SEG;
        int p1 = n_pos - p0 < ATTN_SEG ? n_pos : p0 + ATTN_SEG;
        attn_setup(a, ith, t, 1, &s, q);
        attn_state z = {NULL, NULL, NULL};
        attn_state_at(a->st->attn_part + (size_t)chunk * a->pstride, (size_t)a->n_head,
                      (size_t)a->hdp, &z);
        attn_segment(a, &s, 1, &t, q, p0, &lo, &p1, &z);
        return;
    }
    /* The longest items (last tokens of a prefill chunk) go first, for a better balance. */
    const int32_t *items = a->st->attn_items;
    long w = a->n_items - 1 - chunk;
    int t0 = items[w], m = items[w + 1] - t0, pe = 0, ps = INT_MAX;
    attn_setup(a, ith, t0, m, &s, q);
    for (int u = 0; u < m; u++) {
        int n_pos = a->s->pos[t0 + u] + 1, sl = attn_lo(a, n_pos - 1) / ATTN_SEG * ATTN_SEG;
        if (n_pos > pe) pe = n_pos;
        if (sl < ps) ps = sl;
    }
    for (int p0 = ps; p0 < pe; p0 += ATTN_SEG) {
        /* the tokens with positions in this segment */
        int tok[ATTN_QT], lo[ATTN_QT], p1[ATTN_QT], k = 0;
        const float *qa[ATTN_QT];
        attn_state za[ATTN_QT];
        for (int u = 0; u < m; u++) {
            int n_pos = a->s->pos[t0 + u] + 1;
            lo[k] = attn_lo(a, n_pos - 1);
            if (n_pos <= p0 || p0 + ATTN_SEG <= lo[k]) continue;
            tok[k] = t0 + u;
            p1[k] = n_pos - p0 < ATTN_SEG ? n_pos : p0 + ATTN_SEG;
            qa[k] = q[u];
            za[k++] = s.seg[u];
        }
        attn_segment(a, &s, k, tok, qa, p0, lo, p1, za);
        for (int i = 0; i < k; i++) { /* the token's first segment starts its running state */
            int u = tok[i] - t0;
            attn_merge(&s.run[u], &s.seg[u], a->n_head, a->hdp, p0 <= lo[i]);
        }
    }
    for (int u = 0; u < m; u++) attn_finish(a, &s.run[u], t0 + u);
}

/* Second pass of a split attention: token `chunk`'s segment states merged in order. */
static void attn_merge_item(void *arg, long chunk, int ith) {
    const attn_ctx *a = arg;
    attn_bufs s;
    attn_bufs_at(a->st->attn_scratch + (size_t)ith * a->st->attn_stride, (size_t)a->n_head,
                 (size_t)a->st->attn_group, (size_t)a->hdp, &s);
    const int32_t *first = a->st->attn_first;
    for (int i = first[chunk]; i < first[chunk + 1]; i++) {
        attn_state z = {NULL, NULL, NULL};
        attn_state_at(a->st->attn_part + (size_t)i * a->pstride, (size_t)a->n_head,
                      (size_t)a->hdp, &z);
        attn_merge(&s.run[0], &z, a->n_head, a->hdp, i == first[chunk]);
    }
    attn_finish(a, &s.run[0], (int)chunk);
}

static void cpu_attention(pgd_backend *be, const float *q, const pgd_kv_layer *kv, float *out,
                          int n_head, int n_kv_head, int head_dim, const pgd_step *s) {
    cpu_state *st = be->impl;
    int hdp = (head_dim + 7) / 8 * 8, nt = s->n_tokens;
    PGD_ASSERT(n_head <= st->n_head && n_head / n_kv_head <= st->attn_group &&
               hdp <= st->attn_hdp);
    attn_state tmp;
    float scale = kv->scale > 0 ? kv->scale : 1.0f / sqrtf((float)head_dim);
    attn_ctx ac = {st, q, kv, out, n_head, n_kv_head, head_dim, hdp, s, kv->window, scale,
                   kv->softcap, false, 0,
                   attn_state_at(NULL, (size_t)n_head, (size_t)hdp, &tmp)};
    int nth = be->pool ? pgd_pool_n_threads(be->pool) : 1;
    /* Tokens that cannot be shared evenly over the threads (a single decode, 3 on 2 threads):
     * split the long contexts into segments, if their states fit the budget. */
    long n_items = nt;
    if (nth > 1 && nt < st->max_split && nt % nth != 0) {
        st->attn_first[0] = 0;
        for (int t = 0; t < nt; t++) /* token t's segments: positions lo .. pos[t] */
            st->attn_first[t + 1] = st->attn_first[t] + s->pos[t] / ATTN_SEG + 1 -
                                    attn_lo(&ac, s->pos[t]) / ATTN_SEG;
        long n = st->attn_first[nt];
        if (n > nt && (size_t)n * ac.pstride * sizeof(float) <= ATTN_PART_BYTES) {
            ac.split = true;
            n_items = n;
        }
    }
    if (!ac.split) { /* runs of up to qt tokens of one sequence, enough of them for the threads */
        int32_t *items = st->attn_items;
        int qt = nt / (nth * PAR_CHUNKS_PER_THREAD);
        qt = qt < 1 ? 1 : qt > ATTN_QT ? ATTN_QT : qt;
        n_items = 0;
        for (int t = 0; t < nt; t++)
            if (t == 0 || s->seq[t] != s->seq[t - 1] || t - items[n_items - 1] == qt)
                items[n_items++] = t;
        items[n_items] = nt;
        ac.n_items = n_items;
    }
    if (!be->pool) {
        for (long c = 0; c < n_items; c++) attn_item(&ac, c, 0);
        return;
    }
    pgd_pool_run_chunks(be->pool, attn_item, &ac, n_items);
    if (ac.split) pgd_pool_run_chunks(be->pool, attn_merge_item, &ac, nt);
}

/* ---- SiLU gate ----------------------------------------------------------------------------- */

typedef struct silu_ctx {
    float *g;
    const float *u;
    bool gelu; /* gelu_pytorch_tanh instead of silu */
} silu_ctx;

#ifdef __AVX2__
static inline __m256 act8(bool gelu, __m256 x) { return gelu ? pgd_gelu8(x) : pgd_silu8(x); }
#endif

/* g = act(g) * u; the tail goes through the vector code too (padded), so every element is
 * computed the same way wherever it falls. */
static void silu_range(void *arg, long lo, long hi) {
    const silu_ctx *c = arg;
    float *g = c->g;
    const float *u = c->u;
    long i = lo;
#ifdef __AVX2__
    for (; i + 8 <= hi; i += 8)
        _mm256_storeu_ps(g + i, _mm256_mul_ps(act8(c->gelu, _mm256_loadu_ps(g + i)),
                                              _mm256_loadu_ps(u + i)));
    if (i < hi) {
        float tg[8] = {0}, tu[8] = {0};
        int r = (int)(hi - i);
        memcpy(tg, g + i, (size_t)r * sizeof *tg);
        memcpy(tu, u + i, (size_t)r * sizeof *tu);
        _mm256_storeu_ps(tg, _mm256_mul_ps(act8(c->gelu, _mm256_loadu_ps(tg)),
                                           _mm256_loadu_ps(tu)));
        memcpy(g + i, tg, (size_t)r * sizeof *tg);
    }
#else
    for (; i < hi; i++) g[i] = (c->gelu ? pgd_gelu_scalar(g[i]) : pgd_silu_scalar(g[i])) * u[i];
#endif
}

static void cpu_silu_gate(pgd_backend *be, float *g, const float *u, size_t n) {
    silu_ctx c = {g, u, false};
    par_for(be, silu_range, &c, (long)n, 8, 64);
}

static void cpu_gelu_gate(pgd_backend *be, float *g, const float *u, size_t n) {
    silu_ctx c = {g, u, true};
    par_for(be, silu_range, &c, (long)n, 8, 64);
}

typedef struct scale_ctx {
    float *x;
    float c;
} scale_ctx;

static void scale_range(void *arg, long lo, long hi) {
    const scale_ctx *c = arg;
    for (long i = lo; i < hi; i++) c->x[i] *= c->c;
}

static void cpu_scale(pgd_backend *be, float *x, float c, size_t n) {
    scale_ctx sc = {x, c};
    par_for(be, scale_range, &sc, (long)n, 8, 64);
}

static void softcap_range(void *arg, long lo, long hi) {
    const scale_ctx *c = arg;
    softcap_row(c->x + lo, hi - lo, c->c);
}

static void cpu_softcap(pgd_backend *be, float *x, float c, size_t n) {
    scale_ctx sc = {x, c};
    par_for(be, softcap_range, &sc, (long)n, 16, 8);
}

/* ---- mixture of experts ------------------------------------------------------------------ */

/* o[0..n) += p * y[0..n) */
static void add_scaled(float *o, const float *y, float p, size_t n) {
    for (size_t c = 0; c < n; c++) o[c] += p * y[c];
}

/* Routing, then one expert at a time: its rows gathered, the three products on the pool, the
 * weighted results added into their rows. A row's sum runs over its experts in increasing index
 * whatever else is in the step, and each product is batch invariant (pgd_cpu_matmul), so the op
 * is too. */
static void cpu_moe(pgd_backend *be, const pgd_moe *e, const float *x, const float *router,
                    float *out, float *work, int n, int dim) {
    const int E = e->n_expert, K = e->n_used, F = e->ffn_dim;
    const size_t D = (size_t)dim, nk = (size_t)n * (size_t)K;
    const size_t FW = (size_t)(F > e->shared_ffn_dim ? F : e->shared_ffn_dim);
    float *xe = work, *ye = xe + (size_t)n * D, *g = ye + (size_t)n * D;
    float *u = g + (size_t)n * FW, *sw = u + (size_t)n * FW, *lw = sw + nk;
    int32_t *sel = (int32_t *)(lw + nk);   /* (n, K) chosen experts of each row */
    int32_t *rows = sel + nk;              /* (n * K) rows grouped by expert, each group in order */
    int32_t *start = rows + nk;            /* (E + 1) where each expert's group starts */
    int32_t *fill = start + E + 1;         /* (E) the next free place of each group */
    float *sg = (float *)(fill + E);       /* (n) shared-expert gate logits */
    float *sc = sg + n, *ch = sc + E;      /* (E) a row's scores, and what it is chosen by */
    float *gs = ch + E;                    /* (n_group) its groups' scores */
    memset(start, 0, (size_t)(E + 1) * sizeof *start);
    /* DeepSeek's routing chooses by the scores themselves (plus its bias), in its groups; the
     * others by the router's logits, which order the softmax's probabilities alike. */
    bool deepseek = e->sigmoid || e->bias || e->n_group || e->scale;
    for (int t = 0; t < n; t++) {
        const float *l = router + (size_t)t * (size_t)E;
        int32_t *st = sel + (size_t)t * K;
        float *pw = sw + (size_t)t * K, mx = l[0], sum = 0.0f, chosen = 0.0f;
        for (int i = 1; i < E; i++) mx = l[i] > mx ? l[i] : mx;
        if (!e->sigmoid) {
            for (int i = 0; i < E; i++) sum += expf(l[i] - mx);
            for (int i = 0; i < E; i++) sc[i] = expf(l[i] - mx) / sum;
        } else {
            for (int i = 0; i < E; i++) sc[i] = 1.0f / (1.0f + expf(-l[i]));
        }
        for (int i = 0; i < E; i++) ch[i] = !deepseek ? l[i] : e->bias ? sc[i] + e->bias[i] : sc[i];
        if (e->n_group > 1 && e->topk_group < e->n_group) {
            /* a group's score: its best (softmax, V2) or its best two summed (sigmoid, V3);
             * the experts outside the topk_group best groups (ties to the lower) are out */
            int gsz = E / e->n_group;
            for (int gi = 0; gi < e->n_group; gi++) {
                const float *c = ch + (size_t)gi * gsz;
                float b1 = -INFINITY, b2 = -INFINITY;
                for (int i = 0; i < gsz; i++) {
                    if (c[i] > b1) {
                        b2 = b1;
                        b1 = c[i];
                    } else if (c[i] > b2) {
                        b2 = c[i];
                    }
                }
                gs[gi] = e->sigmoid && gsz > 1 ? b1 + b2 : b1;
            }
            for (int gi = 0; gi < e->n_group; gi++) {
                int better = 0; /* groups ranked before gi */
                for (int o = 0; o < e->n_group; o++)
                    better += gs[o] > gs[gi] || (gs[o] == gs[gi] && o < gi);
                if (better >= e->topk_group)
                    for (int i = 0; i < gsz; i++) ch[(size_t)gi * gsz + i] = -INFINITY;
            }
        }
        for (int j = 0; j < K; j++) { /* the j-th largest not taken yet, lowest index */
            int best = -1;
            for (int i = 0; i < E; i++) {
                bool taken = false;
                for (int q = 0; q < j && !taken; q++) taken = st[q] == i;
                if (!taken && (best < 0 || ch[i] > ch[best])) best = i;
            }
            st[j] = best;
            pw[j] = sc[best];
            chosen += pw[j];
            start[best + 1]++;
        }
        if (e->norm) /* (transformers' DeepSeek-V3 adds 1e-20 to a sigmoid's sum) */
            for (int j = 0; j < K; j++) pw[j] /= e->sigmoid ? chosen + 1e-20f : chosen;
        if (e->scale)
            for (int j = 0; j < K; j++) pw[j] *= e->scale;
    }
    for (int i = 0; i < E; i++) start[i + 1] += start[i];
    memcpy(fill, start, (size_t)E * sizeof *fill);
    for (int t = 0; t < n; t++)
        for (int j = 0; j < K; j++) {
            int32_t at = fill[sel[(size_t)t * K + j]]++;
            rows[at] = t;
            lw[at] = sw[(size_t)t * K + j];
        }
    memset(out, 0, (size_t)n * D * sizeof *out);
    for (int i = 0; i < E; i++) {
        int m = start[i + 1] - start[i];
        if (!m) continue;
        const int32_t *r = rows + start[i];
        for (int k = 0; k < m; k++)
            memcpy(xe + (size_t)k * D, x + (size_t)r[k] * D, D * sizeof *xe);
        cpu_matmul(be, &e->gate[i], xe, g, m);
        cpu_matmul(be, &e->up[i], xe, u, m);
        cpu_silu_gate(be, g, u, (size_t)m * (size_t)F);
        cpu_matmul(be, &e->down[i], g, ye, m);
        for (int k = 0; k < m; k++)
            add_scaled(out + (size_t)r[k] * D, ye + (size_t)k * D, lw[start[i] + k], D);
    }
    if (!e->shared_gate) return;
    if (e->shared_inp) cpu_matmul(be, e->shared_inp, x, sg, n);
    cpu_matmul(be, e->shared_gate, x, g, n);
    cpu_matmul(be, e->shared_up, x, u, n);
    cpu_silu_gate(be, g, u, (size_t)n * (size_t)e->shared_ffn_dim);
    cpu_matmul(be, e->shared_down, g, ye, n);
    for (int t = 0; t < n; t++)
        add_scaled(out + (size_t)t * D, ye + (size_t)t * D,
                   e->shared_inp ? 1.0f / (1.0f + expf(-sg[t])) : 1.0f, D);
}

static void cpu_gather_rows(pgd_backend *be, const float *src, float *dst, int dim,
                            const pgd_step *s) {
    for (int i = 0; i < s->n_logits; i++)
        memmove(dst + (size_t)i * dim, src + (size_t)s->logit_rows[i] * dim,
                (size_t)dim * sizeof *dst);
}

static void cpu_copy_block(pgd_backend *be, const pgd_kv_layer *kv, int32_t src, int32_t dst,
                           int32_t n) {
    size_t krb = pgd_type_row_bytes(kv->dtype, (uint64_t)kv->kv_dim);
    size_t vrb = pgd_type_row_bytes(kv->vtype, (uint64_t)kv->kv_dim);
    size_t so = (size_t)src * kv->block_size, d = (size_t)dst * kv->block_size;
    memcpy((char *)kv->k + d * krb, (char *)kv->k + so * krb, (size_t)n * krb);
    if (kv->v != kv->k) memcpy((char *)kv->v + d * vrb, (char *)kv->v + so * vrb, (size_t)n * vrb);
}

/* The reference itself (src/sample/device_sample.c), one row per pool chunk. */
static int cpu_sample(pgd_backend *be, const float *logits, int n_rows, int n_vocab,
                      const pgd_sample_row *rows, int32_t *out) {
    pgd_device_sample_rows(be->pool, logits, n_rows, n_vocab, rows, out);
    return PGD_OK;
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
    .qk_norm = cpu_qk_norm,
    .matmul = cpu_matmul,
    .add_bias = cpu_add_bias,
    .rope = cpu_rope,
    .kv_store = cpu_kv_store,
    .rope_kv_store = cpu_rope_kv_store,
    .attention = cpu_attention,
    .gelu_gate = cpu_gelu_gate,
    .scale = cpu_scale,
    .softcap = cpu_softcap,
    .silu_gate = cpu_silu_gate,
    .moe = cpu_moe,
    .lora = cpu_lora,
    .add = cpu_add,
    .mla_q = cpu_mla_q,
    .mla_kv = cpu_mla_kv,
    .mla_o = cpu_mla_o,
    .gather_rows = cpu_gather_rows,
    .copy_block = cpu_copy_block,
    .sample = cpu_sample,
};

#ifndef PGD_HAVE_CUDA
int pgd_cuda_device_count(void) { return 0; }
const pgd_backend_ops *pgd_cuda_backend_ops(void) { return NULL; }
void *pgd_cuda_stream(const pgd_backend *be) {
    (void)be;
    return NULL;
}
double pgd_cuda_copy_bandwidth(int device, size_t bytes, int iters) {
    (void)device, (void)bytes, (void)iters;
    return -1.0;
}
double pgd_cuda_gemm_tflops(int device, int m, int n, int k, int iters) {
    (void)device, (void)m, (void)n, (void)k, (void)iters;
    return -1.0;
}
#endif
