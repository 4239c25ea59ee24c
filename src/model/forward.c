/* The forward pass of the Llama family, Qwen2/Qwen3, SmolLM3 and their mixtures of experts
 * (Mixtral, Qwen2-MoE, Qwen3-MoE), written once against the backend ops table (backend.h), over
 * a flattened batch of tokens from several sequences with a paged KV cache:
 *   RMSNorm -> Q/K/V (+bias) (-> QK-norm) -> RoPE (not on NoPE layers) -> K/V into their slots
 *   -> paged attention -> O ->
 *   [all-reduce] -> residual + RMSNorm -> SwiGLU -> down (an MoE layer: router -> the moe op)
 *   -> [all-reduce] -> residual,
 *   then the LM head for the rows that need logits ([gather of the vocab slices]).
 * Tensor parallel: one thread per rank runs this program on its shard (model.h, pgd_shard);
 * with one rank nothing is sharded and no collective runs.
 * Batch invariance: every per-token computation (matmul rows, attention over the sequence's own
 * keys in position order) has a fixed reduction order, so a token's results never depend on what
 * else shares the step or how its prompt was chunked. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/matmul.h"
#include "backend/cpu/pool.h"
#include "backend/cpu/quant.h"
#include "comm/comm.h"
#include "model/lora.h"
#include "model/model.h"
#include "sample/device_sample.h"
#include "util/clock.h"
#include "util/env.h"

/* ---- scratch ---- */

/* PAGODA_PROFILE=1: wall time per op of the layer program, summed over every step and printed
 * by pgd_fwd_free (CPU backend only: a device backend's ops return before their work is done). */
enum { PR_EMBED, PR_NORM, PR_Q, PR_K, PR_V, PR_ROPE_KV, PR_ATTN, PR_O, PR_GATE, PR_UP, PR_ACT,
       PR_DOWN, PR_ROUTER, PR_MOE, PR_REDUCE, PR_HEAD, PR_LORA, PR_N };
static const char *const pr_name[PR_N] = {
    "embed", "rms_norm", "matmul q", "matmul k", "matmul v", "rope+kv store", "attention",
    "matmul o", "matmul gate", "matmul up", "silu*up", "matmul down", "matmul router", "experts",
    "all-reduce", "lm head", "lora"};

typedef struct pgd_fwd_rank {
    struct pgd_fwd *f;
    int rank;
    pgd_backend be;          /* this rank's instance: pool / stream, op scratch */
    pgd_pool *own_pool;      /* ranks > 0 on the CPU: their own threads */
    float *x, *xb, *xb2;     /* (max_tokens, dim); xb is (max_tokens, max(dim, q_dim)) */
    float *xb3;              /* (max_tokens, dim) with post-block norms (Gemma), or NULL */
    float *q;                /* (max_tokens, n_head * head_dim) of this rank */
    float *k, *v;            /* (max_tokens, n_kv_head * head_dim) of this rank */
    float *hb, *hb2;         /* (max_tokens, ffn_dim) of this rank */
    float *router;           /* (max_tokens, n_expert): router logits (MoE models) */
    /* latent attention: the queries as projected (n_head * (qk_nope_dim + rope_dim)) and the
     * q LoRA's bottleneck (q_lora_rank), per token, then (at max_tokens rows on) its norm */
    float *qf, *qa;
    float *moe_work;         /* the moe op's scratch for max_tokens rows */
    float *logits;           /* (max_logits, n_vocab of this rank); == f->logits when shared */
    /* LoRA (pgd_fwd_set_lora): per layer and matrix, each adapter's slice of this rank;
     * whether any adapter changes it; the step's adapter of each token; the op's scratch */
    pgd_lora_mat *lora_mats;  /* (n_layer, PGD_LAYER_N_MATRICES, n_loras) host */
    bool *lora_on;            /* (n_layer, PGD_LAYER_N_MATRICES) */
    int32_t *lora_tok;        /* (max_tokens) host */
    float *lora_work;         /* (max_tokens, lora_max_rank) */
    int32_t lora_max_rank;
    pthread_t thread;
    bool started;
    int rc;
    bool prof;               /* PAGODA_PROFILE */
    long prof_steps, prof_calls[PR_N];
    double prof_s[PR_N], prof_step_s; /* per op; whole steps */
} pgd_fwd_rank;

/* Runs `call`, timing it under k when the rank profiles. */
#define TIMED(r, k, call)                                                                       \
    do {                                                                                        \
        if (!(r)->prof) {                                                                       \
            call;                                                                               \
            break;                                                                              \
        }                                                                                       \
        double t0_ = pgd_now_s();                                                                \
        call;                                                                                   \
        (r)->prof_s[k] += pgd_now_s() - t0_;                                                     \
        (r)->prof_calls[k]++;                                                                   \
    } while (0)

static void prof_print(const pgd_fwd_rank *r) {
    if (r->prof_steps == 0 || r->prof_step_s <= 0) return;
    double total = r->prof_step_s, ops = 0;
    fprintf(stderr, "pagoda profile (rank %d): %ld steps, %.3f ms\n", r->rank, r->prof_steps,
            total * 1e3);
    fprintf(stderr, "  %-14s %10s %10s %10s %7s\n", "op", "calls", "ms", "us/call", "share");
    for (int k = 0; k < PR_N; k++) {
        if (!r->prof_calls[k]) continue;
        ops += r->prof_s[k];
        fprintf(stderr, "  %-14s %10ld %10.3f %10.2f %6.1f%%\n", pr_name[k], r->prof_calls[k],
                r->prof_s[k] * 1e3, r->prof_s[k] * 1e6 / (double)r->prof_calls[k],
                100.0 * r->prof_s[k] / total);
    }
    fprintf(stderr, "  %-14s %10s %10.3f %10s %6.1f%%\n", "the rest", "", (total - ops) * 1e3, "",
            100.0 * (total - ops) / total);
}

typedef struct pgd_fwd_sync {
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    uint64_t gen;            /* step counter: a rank runs when it sees a new value */
    int n_done;
    bool quit;
    pgd_kv_cache *kv;        /* the step being run (borrowed) */
    const pgd_batch *b;
} pgd_fwd_sync;

static int forward_rank(pgd_fwd *f, pgd_fwd_rank *r, pgd_kv_cache *kv, const pgd_batch *b);

static void *rank_main(void *arg) {
    pgd_fwd_rank *r = arg;
    pgd_fwd_sync *s = r->f->sync;
    uint64_t seen = 0;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (!s->quit && s->gen == seen) pthread_cond_wait(&s->go, &s->mu);
        if (s->quit) {
            pthread_mutex_unlock(&s->mu);
            return NULL;
        }
        seen = s->gen;
        pgd_kv_cache *kv = s->kv;
        const pgd_batch *b = s->b;
        pthread_mutex_unlock(&s->mu);
        int rc = forward_rank(r->f, r, kv, b);
        pthread_mutex_lock(&s->mu);
        r->rc = rc;
        if (++s->n_done == r->f->n_ranks - 1) pthread_cond_signal(&s->done);
        pthread_mutex_unlock(&s->mu);
    }
}

static void *balloc(pgd_backend *be, size_t n, size_t sz, bool *ok) {
    void *p = be->ops->alloc(be, (n ? n : 1) * sz);
    if (!p) *ok = false;
    return p;
}

/* Bytes of an activation row for w's input: the CPU's dot-product format (8-bit blocks with
 * PAGODA_INT8_ACT=1, smaller than F32), or F32 on a device backend, which bounds its BF16 copies
 * of the activations by it (cuda_init): with 8-bit sizes a Q8_0 or K-quant model's GEMM input
 * overran that scratch. */
static size_t act_row_bytes(const pgd_backend *be, const pgd_weight *w) {
    if (be->ops->host_memory) return pgd_cpu_matmul_act_row_bytes(w);
    return (size_t)w->n_in * sizeof(float);
}

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
    f->n_ranks = m->n_ranks;
    /* (latent attention rotates rope_dim of a head) */
    int32_t rot = c->rope_dim ? c->rope_dim : c->head_dim;
    size_t B = (size_t)max_tokens, half = (size_t)rot / 2;
    int rc = PGD_OK;
    bool ok = true;
    f->inv_freq = calloc(half ? half : 1, sizeof(float));
    if (c->rope_theta_local > 0 && !(f->inv_freq_local = calloc(half ? half : 1, sizeof(float))))
        goto nomem;
    f->logits = calloc((size_t)max_logits * (size_t)c->n_vocab, sizeof(float));
    f->ranks = calloc((size_t)f->n_ranks, sizeof *f->ranks);
    f->sync = calloc(1, sizeof *f->sync);
    if (!f->inv_freq || !f->logits || !f->ranks || !f->sync) goto nomem;
    for (size_t i = 0; i < half; i++) {
        /* As transformers computes it, in float32: inv_freq = 1 / theta^(2i/d). */
        float inv = 1.0f / powf(c->rope_theta, (float)(2 * i) / (float)rot);
        if (c->rope_freq_factors) inv /= c->rope_freq_factors[i];
        f->inv_freq[i] = inv;
        if (f->inv_freq_local) /* (Gemma 3's sliding layers: no frequency factors) */
            f->inv_freq_local[i] = 1.0f / powf(c->rope_theta_local,
                                               (float)(2 * i) / (float)c->head_dim);
    }
    int nth = pool ? pgd_pool_n_threads(pool) : 1;
    const char *pe = pgd_env(PGD_ENV_PROFILE);
    bool prof = pe && *pe && strcmp(pe, "0") != 0;
    for (int ri = 0; ri < f->n_ranks; ri++) {
        const pgd_shard *sh = &m->shards[ri];
        pgd_fwd_rank *r = &f->ranks[ri];
        r->f = f;
        r->rank = ri;
        r->prof = prof && sh->be.ops->host_memory; /* the CPU backend's ops finish on return */
        r->be = sh->be;
        r->be.impl = NULL;
        r->be.pool = pool;
        if (ri > 0 && sh->be.ops->host_memory) {
            /* Thread counts never change results (work is split over output rows only). */
            int per = nth / f->n_ranks > 0 ? nth / f->n_ranks : 1;
            if ((rc = pgd_pool_create(per, &r->own_pool, err))) goto fail;
            r->be.pool = r->own_pool;
        }
        /* Activation rows must hold the input of any weight in its dot-product format. */
        size_t act = act_row_bytes(&sh->be, &sh->output);
        for (int il = 0; il < c->n_layer; il++) {
            const pgd_layer *l = &sh->layers[il];
            const pgd_weight *lw[] = PGD_LAYER_MATRICES(l);
            for (size_t i = 0; i < PGD_LAYER_N_MATRICES; i++) {
                size_t bb = act_row_bytes(&sh->be, lw[i]);
                if (bb > act) act = bb;
            }
            const pgd_weight *routers[] = {&l->w_router, &l->w_shared_inp, &l->wq_a, &l->wq_b,
                                           &l->wkv_a};
            for (size_t i = 0; i < sizeof routers / sizeof routers[0]; i++) {
                size_t bb = routers[i]->data ? act_row_bytes(&sh->be, routers[i]) : 0;
                if (bb > act) act = bb;
            }
            for (int i = 0; l->experts && i < 3 * l->moe.n_expert; i++) {
                size_t bb = act_row_bytes(&sh->be, &l->experts[i]);
                if (bb > act) act = bb;
            }
        }
        if ((rc = r->be.ops->init(&r->be, max_tokens, act, sh->n_head, sh->n_kv_head,
                                  c->head_dim, err)))
            goto fail;
        size_t q_dim = (size_t)sh->n_head * c->head_dim;
        size_t kv_dim = (size_t)sh->n_kv_head * c->head_dim;
        size_t wide = (size_t)c->dim > q_dim ? (size_t)c->dim : q_dim;
        pgd_backend *be = &r->be;
        r->x = balloc(be, B * (size_t)c->dim, sizeof(float), &ok);
        r->xb = balloc(be, B * wide, sizeof(float), &ok);
        r->xb2 = balloc(be, B * (size_t)c->dim, sizeof(float), &ok);
        if (m->layers[0].post_attn_norm) /* Gemma: the normalized output of a block */
            r->xb3 = balloc(be, B * (size_t)c->dim, sizeof(float), &ok);
        r->q = balloc(be, B * q_dim, sizeof(float), &ok);
        r->k = balloc(be, B * kv_dim, sizeof(float), &ok);
        r->v = balloc(be, B * kv_dim, sizeof(float), &ok);
        if (!c->n_expert || c->n_dense) { /* an MoE layer's FFNs run inside the moe op */
            r->hb = balloc(be, B * (size_t)sh->ffn_dim, sizeof(float), &ok);
            r->hb2 = balloc(be, B * (size_t)sh->ffn_dim, sizeof(float), &ok);
        }
        if (c->n_expert) { /* (DeepSeek's first n_dense layers are dense) */
            r->router = balloc(be, B * (size_t)c->n_expert, sizeof(float), &ok);
            r->moe_work = balloc(be, pgd_moe_work_floats((int32_t)B, c->dim,
                                                         &sh->layers[c->n_dense].moe),
                                 sizeof(float), &ok);
        }
        if (c->kv_lora_rank) {
            r->qf = balloc(be, B * (size_t)sh->n_head * (size_t)(c->qk_nope_dim + c->rope_dim),
                           sizeof(float), &ok);
            r->qa = balloc(be, 2 * B * (size_t)(c->q_lora_rank ? c->q_lora_rank : 1),
                           sizeof(float), &ok);
        }
        if (f->n_ranks == 1 && be->ops->host_memory) r->logits = f->logits;
        else r->logits = balloc(be, (size_t)max_logits * (size_t)sh->n_vocab, sizeof(float), &ok);
        if (!ok) goto nomem;
    }
    if (f->n_ranks > 1) {
        size_t wide_all = B * (size_t)c->dim;
        if (m->device == PGD_DEVICE_CPU) {
            rc = pgd_comm_inproc_create(f->n_ranks, wide_all, &f->comm, err);
        } else {
#ifdef PGD_HAVE_CUDA
            /* After every rank's init: the collectives run on the ranks' streams. */
            pgd_backend *bes[PGD_MAX_TP];
            PGD_ASSERT(f->n_ranks <= PGD_MAX_TP);
            for (int ri = 0; ri < f->n_ranks; ri++) bes[ri] = &f->ranks[ri].be;
            rc = pgd_comm_nccl_create(f->n_ranks, bes, &f->comm, err);
#else
            rc = pgd_err_set(err, PGD_EUNSUPPORTED, "%s: tensor parallel on %s needs a CUDA "
                             "build (NCCL)", m->path, m->shards[0].be.ops->name);
#endif
        }
        if (rc) goto fail;
        pthread_mutex_init(&f->sync->mu, NULL);
        pthread_cond_init(&f->sync->go, NULL);
        pthread_cond_init(&f->sync->done, NULL);
        for (int ri = 1; ri < f->n_ranks; ri++) {
            if (pthread_create(&f->ranks[ri].thread, NULL, rank_main, &f->ranks[ri])) {
                rc = pgd_err_set(err, PGD_ENOMEM, "cannot start the thread of rank %d", ri);
                goto fail;
            }
            f->ranks[ri].started = true;
        }
    }
    return PGD_OK;
nomem:
    rc = pgd_err_set(err, PGD_ENOMEM, "%s: out of memory for %d tokens per step", m->path,
                     max_tokens);
fail:
    pgd_fwd_free(f);
    return rc;
}

void pgd_fwd_free(pgd_fwd *f) {
    if (f->sync && f->n_ranks > 1) {
        bool any = false;
        for (int ri = 1; ri < f->n_ranks; ri++) any |= f->ranks && f->ranks[ri].started;
        if (any) {
            pthread_mutex_lock(&f->sync->mu);
            f->sync->quit = true;
            pthread_cond_broadcast(&f->sync->go);
            pthread_mutex_unlock(&f->sync->mu);
            for (int ri = 1; ri < f->n_ranks; ri++)
                if (f->ranks[ri].started) pthread_join(f->ranks[ri].thread, NULL);
        }
        if (f->comm) {
            pthread_mutex_destroy(&f->sync->mu);
            pthread_cond_destroy(&f->sync->go);
            pthread_cond_destroy(&f->sync->done);
        }
    }
    for (int ri = 0; f->ranks && ri < f->n_ranks; ri++) {
        pgd_fwd_rank *r = &f->ranks[ri];
        pgd_backend *be = &r->be;
        if (r->prof) prof_print(r);
        if (!be->ops) continue;
        float *bufs[] = {r->x, r->xb, r->xb2, r->xb3, r->q, r->k, r->v, r->hb, r->hb2, r->router,
                         r->moe_work, r->qf, r->qa, r->logits != f->logits ? r->logits : NULL,
                         r->lora_work};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
            if (bufs[i]) be->ops->mem_free(be, bufs[i]);
        if (be->impl) be->ops->free(be);
        if (r->own_pool) pgd_pool_free(r->own_pool);
        free(r->lora_mats);
        free(r->lora_on);
        free(r->lora_tok);
    }
    pgd_comm_free(f->comm);
    free(f->ranks);
    free(f->sync);
    free(f->inv_freq);
    free(f->inv_freq_local);
    free(f->logits);
    memset(f, 0, sizeof *f);
}

/* Rank r's slice of adapter l's delta on matrix mi of layer il: column-parallel matrices
 * (Q/K/V, gate/up) take B's rows of the rank's outputs, row-parallel ones (O, down) A's columns
 * of its inputs, whose partial products the all-reduce then sums as it does W's. */
static pgd_lora_mat lora_slice(const pgd_model *m, const pgd_shard *sh, const pgd_lora *l,
                               int il, int mi) {
    const pgd_model_config *c = &m->cfg;
    const pgd_lora_matrix *lm = &l->m[il * PGD_LAYER_N_MATRICES + mi];
    pgd_lora_mat o = {0};
    int64_t n_out, n_in; /* the full matrix: A's and B's row strides */
    if (!lm->a || !pgd_lora_matrix_shape(m, il, mi, &n_out, &n_in)) return o;
    int64_t q_lo = (int64_t)sh->rank * sh->n_head * c->head_dim;
    int64_t kv_lo = (int64_t)sh->rank * sh->n_kv_head * c->head_dim;
    int64_t out_lo[] = {q_lo, kv_lo, kv_lo, 0, sh->ffn_lo, sh->ffn_lo, 0};
    int64_t in_lo[] = {0, 0, 0, q_lo, 0, 0, sh->ffn_lo};
    size_t es = pgd_dtype_size(lm->type);
    o.a = (const char *)lm->a + (size_t)in_lo[mi] * es;
    o.bt = (const char *)lm->bt + (size_t)out_lo[mi] * es;
    o.type = lm->type;
    o.rank = l->rank;
    o.lda = (int32_t)n_in;
    o.ldb = (int32_t)n_out;
    o.scale = l->scale;
    return o;
}

int pgd_fwd_reserve_loras(pgd_fwd *f, int32_t n, pgd_err *err) {
    const pgd_model *m = f->model;
    PGD_ASSERT(f->n_loras == 0);
    if (n <= 0) return PGD_OK;
    if (m->cfg.kv_lora_rank)
        return pgd_err_set(err, PGD_EUNSUPPORTED, "%s: LoRA adapters on latent attention "
                           "(DeepSeek) are not supported", m->path);
    size_t nlm = (size_t)m->cfg.n_layer * PGD_LAYER_N_MATRICES;
    for (int ri = 0; ri < f->n_ranks; ri++) {
        pgd_fwd_rank *r = &f->ranks[ri];
        if (!r->be.ops->supports(PGD_OP_LORA, PGD_TYPE_F32) || !r->be.ops->host_memory)
            return pgd_err_set(err, PGD_EUNSUPPORTED, "LoRA adapters run on the CPU backend "
                               "only, not on %s", r->be.ops->name);
        r->lora_mats = calloc(nlm * (size_t)n, sizeof *r->lora_mats);
        r->lora_on = calloc(nlm, sizeof *r->lora_on);
        r->lora_tok = calloc((size_t)f->max_tokens, sizeof *r->lora_tok);
        if (!r->lora_mats || !r->lora_on || !r->lora_tok)
            return pgd_err_set(err, PGD_ENOMEM, "LoRA: out of memory");
    }
    f->n_loras = n;
    return PGD_OK;
}

int pgd_fwd_set_lora(pgd_fwd *f, int32_t k, const pgd_lora *l, pgd_err *err) {
    const pgd_model *m = f->model;
    PGD_ASSERT(k >= 1 && k <= f->n_loras);
    int32_t n = f->n_loras, nm = PGD_LAYER_N_MATRICES;
    size_t nlm = (size_t)m->cfg.n_layer * nm;
    for (int ri = 0; ri < f->n_ranks; ri++) {
        pgd_fwd_rank *r = &f->ranks[ri];
        if (l && l->rank > r->lora_max_rank) { /* the op's scratch grows with the largest rank */
            bool ok = true;
            float *w = balloc(&r->be, (size_t)f->max_tokens * (size_t)l->rank, sizeof(float),
                              &ok);
            if (!ok) return pgd_err_set(err, PGD_ENOMEM, "%s: out of memory", l->path);
            if (r->lora_work) r->be.ops->mem_free(&r->be, r->lora_work);
            r->lora_work = w;
            r->lora_max_rank = l->rank;
        }
        memset(r->lora_on, 0, nlm * sizeof *r->lora_on);
        for (size_t i = 0; i < nlm; i++) {
            pgd_lora_mat *lm = &r->lora_mats[i * (size_t)n];
            lm[k - 1] = l ? lora_slice(m, &m->shards[ri], l, (int)(i / (size_t)nm),
                                       (int)(i % (size_t)nm))
                          : (pgd_lora_mat){0};
            for (int32_t j = 0; j < n; j++) r->lora_on[i] |= lm[j].a != NULL;
        }
    }
    return PGD_OK;
}

int pgd_fwd_use_lora(pgd_fwd *f, const pgd_lora *l, pgd_err *err) {
    int rc = pgd_fwd_reserve_loras(f, 1, err);
    return rc ? rc : pgd_fwd_set_lora(f, 1, l, err);
}

/* ---- the layer program ---- */

static int all_reduce(pgd_fwd *f, pgd_fwd_rank *r, float *buf, size_t n) {
    if (f->n_ranks == 1) return PGD_OK;
    return f->comm->ops->all_reduce_sum(f->comm, r->rank, buf, n);
}

/* CUDA graphs: the padded size a step may run as (backend.h, pgd_step.pad_tokens), or 0. Steps
 * where every token needs logits (decode, speculative verification) of up to
 * PGD_GRAPH_MAX_TOKENS tokens are offered as the next power of two that the scratch holds; a
 * backend without graphs ignores it. One rank only: collectives are not captured. */
#define PGD_GRAPH_MAX_TOKENS 256
static int32_t graph_pad(const pgd_fwd *f, const pgd_batch *b) {
    if (f->n_ranks != 1 || b->n_logits != b->n_tokens) return 0;
    int32_t p = 1;
    while (p < b->n_tokens) p *= 2;
    return p <= PGD_GRAPH_MAX_TOKENS && p <= f->max_tokens && p <= f->max_logits ? p : 0;
}

/* The graph key of a rank's KV storage: every layer's K/V address follows from these. */
static uint64_t kv_key(const pgd_kv_cache *kv, int rank) {
    uint64_t v[] = {(uint64_t)(uintptr_t)kv->rk[rank], (uint64_t)(uintptr_t)kv->rv[rank],
                    (uint64_t)kv->n_blocks, (uint64_t)kv->block_size, (uint64_t)kv->dtype};
    uint64_t h = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        h ^= v[i] + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
        h *= 0xBF58476D1CE4E5B9ull;
        h ^= h >> 31;
    }
    return h;
}

static int forward_rank_once(pgd_fwd *f, pgd_fwd_rank *r, pgd_kv_cache *kv, const pgd_batch *b);

/* A backend that could not capture a step's graph has done none of its work and answers
 * PGD_EAGAIN at sync; it then runs the step without one, so one more try is enough. */
static int forward_rank(pgd_fwd *f, pgd_fwd_rank *r, pgd_kv_cache *kv, const pgd_batch *b) {
    double t0 = r->prof ? pgd_now_s() : 0;
    int rc = forward_rank_once(f, r, kv, b);
    if (rc == PGD_EAGAIN) rc = forward_rank_once(f, r, kv, b);
    if (r->prof) {
        r->prof_step_s += pgd_now_s() - t0;
        r->prof_steps++;
    }
    return rc;
}

/* A block's reduced output xb2 as the residual stream takes it: normalized into xb3 with the
 * gains w (Gemma's post-attention and post-FFN norms), or xb2 itself when w is NULL. */
static const float *post_norm(pgd_fwd_rank *r, const float *w, int n) {
    if (!w) return r->xb2;
    const pgd_model_config *c = &r->f->model->cfg;
    TIMED(r, PR_NORM, r->be.ops->rms_norm(&r->be, r->xb2, w, r->xb3, n, c->dim, c->rms_eps));
    return r->xb3;
}

/* Fills r->lora_tok from the batch's sequences; false when no token of the step has an adapter. */
static bool lora_tokens(const pgd_fwd *f, pgd_fwd_rank *r, const pgd_batch *b) {
    if (!f->n_loras || !b->seq_lora) return false;
    bool any = false;
    for (int32_t i = 0; i < b->n_tokens; i++) {
        int32_t k = b->seq_lora[b->seq[i]];
        r->lora_tok[i] = k > 0 && k <= f->n_loras ? k : 0;
        any |= r->lora_tok[i] > 0;
    }
    return any;
}

/* y (n, n_out) += the step's adapters' deltas on matrix mi of layer il, x (n, n_in) its input. */
static void lora_apply(const pgd_fwd *f, pgd_fwd_rank *r, int il, int mi, const float *x,
                       float *y, int n, int n_in, int n_out) {
    int nm = PGD_LAYER_N_MATRICES;
    if (!r->lora_on[il * nm + mi]) return;
    TIMED(r, PR_LORA,
          r->be.ops->lora(&r->be, &r->lora_mats[((size_t)il * nm + mi) * f->n_loras],
                          r->lora_tok, x, y, r->lora_work, n, n_in, n_out, r->lora_max_rank));
}

/* Multi-head latent attention (DeepSeek-V2/V3), absorbed for every token, prefill and decode
 * alike: each head's query moves into the latent space (q_nope . W_UK), the attention runs over
 * the latent cache's rows (latent + rotated key) as one KV head of kv_lora_rank + rope_dim, its
 * latent output goes back through W_UV, then o_proj. A step thus reads the cache once, and one
 * path for every token keeps a token's logits independent of how its prompt was chunked or
 * batched; prefill pays n_head * kv_lora_rank wide scores instead of expanding K and V (a
 * choice for invariance over prefill speed). Leaves o_proj's output in xb2. */
static void mla_attention(pgd_fwd_rank *r, const pgd_layer *l, pgd_kv_cache *kv, int il,
                          const pgd_step *s, const pgd_rope_params *rp, int n) {
    const pgd_model_config *c = &r->f->model->cfg;
    pgd_backend *be = &r->be;
    const pgd_backend_ops *o = be->ops;
    int H = r->f->model->shards[r->rank].n_head, R = c->kv_lora_rank, rope = c->rope_dim;
    if (c->q_lora_rank) {
        float *qn = r->qa + (size_t)r->f->max_tokens * (size_t)c->q_lora_rank;
        TIMED(r, PR_Q, o->matmul(be, &l->wq_a, r->xb, r->qa, n));
        TIMED(r, PR_NORM, o->rms_norm(be, r->qa, l->q_a_norm, qn, n, c->q_lora_rank, c->rms_eps));
        TIMED(r, PR_Q, o->matmul(be, &l->wq_b, qn, r->qf, n));
    } else {
        TIMED(r, PR_Q, o->matmul(be, &l->wq, r->xb, r->qf, n));
    }
    TIMED(r, PR_K, o->matmul(be, &l->wkv_a, r->xb, r->k, n));
    pgd_kv_layer kl = pgd_kv_cache_layer(kv, r->rank, il);
    kl.scale = c->attn_scale;
    TIMED(r, PR_ROPE_KV, o->mla_q(be, l->w_uk_t, r->qf, r->q, n, H, c->qk_nope_dim, rope, R,
                                  c->rope_attn, rp));
    TIMED(r, PR_ROPE_KV, o->mla_kv(be, r->k, l->kv_a_norm, c->rms_eps, n, R, rope, &kl, s, rp));
    TIMED(r, PR_ATTN, o->attention(be, r->q, &kl, r->xb, H, 1, c->head_dim, s));
    TIMED(r, PR_V, o->mla_o(be, l->w_uv, r->xb, r->q, n, H, R, rope, c->v_head_dim));
    TIMED(r, PR_O, o->matmul(be, &l->wo, r->q, r->xb2, n));
}

static int forward_rank_once(pgd_fwd *f, pgd_fwd_rank *r, pgd_kv_cache *kv, const pgd_batch *b) {
    const pgd_model *m = f->model;
    const pgd_model_config *c = &m->cfg;
    const pgd_shard *sh = &m->shards[r->rank];
    pgd_backend *be = &r->be;
    const pgd_backend_ops *o = be->ops;
    int n = b->n_tokens, dim = c->dim, rc;
    int q_dim = sh->n_head * c->head_dim, kv_dim = sh->n_kv_head * c->head_dim;
    pgd_step s = {
        .n_tokens = n, .tokens = b->tokens, .pos = b->pos, .seq = b->seq, .slot = b->slot,
        .block_tables = b->block_tables, .n_logits = b->n_logits, .logit_rows = b->logit_rows,
        .pad_tokens = graph_pad(f, b), .block_size = kv->block_size, .kv_key = kv_key(kv, r->rank),
    };
    pgd_rope_params rp = {.mode = c->rope_mode == PGD_ROPE_NEOX,
                          .head_dim = c->rope_dim ? c->rope_dim : c->head_dim,
                          .inv_freq = f->inv_freq, .inv_freq_local = f->inv_freq_local};
    pgd_rope_params rp_local = rp;
    rp_local.local = true;
    if ((rc = o->begin(be, &s, &rp))) return rc;
    bool lora = lora_tokens(f, r, b);

    TIMED(r, PR_EMBED, o->embed(be, &sh->tok_embd, sh->vocab_lo, &s, r->x));
    TIMED(r, PR_REDUCE, rc = all_reduce(f, r, r->x, (size_t)n * dim));
    if (rc) return rc;
    if (c->embed_scale) o->scale(be, r->x, c->embed_scale, (size_t)n * dim); /* Gemma */
    /* The last block's output, to be added to the residual stream x: xb2, or its post-block
     * norm in xb3 (Gemma). */
    const float *out = r->xb2;
    for (int il = 0; il < c->n_layer; il++) {
        const pgd_layer *l = &sh->layers[il];
        /* xb: the normalized input of the block; xb2: the (reduced) output of the last one. */
        const float *an = l->attn_norm, *fn = l->ffn_norm;
        if (il == 0) TIMED(r, PR_NORM, o->rms_norm(be, r->x, an, r->xb, n, dim, c->rms_eps));
        else TIMED(r, PR_NORM, o->add_rms_norm(be, r->x, out, an, r->xb, n, dim, c->rms_eps));
        if (c->kv_lora_rank) {
            mla_attention(r, l, kv, il, &s, &rp, n);
        } else {
            TIMED(r, PR_Q, o->matmul(be, &l->wq, r->xb, r->q, n));
            TIMED(r, PR_K, o->matmul(be, &l->wk, r->xb, r->k, n));
            TIMED(r, PR_V, o->matmul(be, &l->wv, r->xb, r->v, n));
            if (l->bq) o->add_bias(be, r->q, l->bq, n, q_dim);
            if (l->bk) o->add_bias(be, r->k, l->bk, n, kv_dim);
            if (l->bv) o->add_bias(be, r->v, l->bv, n, kv_dim);
            if (lora) { /* after the biases, as PEFT adds the delta to the base layer's output */
                lora_apply(f, r, il, 0, r->xb, r->q, n, dim, q_dim);
                lora_apply(f, r, il, 1, r->xb, r->k, n, dim, kv_dim);
                lora_apply(f, r, il, 2, r->xb, r->v, n, dim, kv_dim);
            }
            if (l->q_norm)
                TIMED(r, PR_NORM, o->qk_norm(be, r->q, r->k, l->q_norm, l->k_norm, n, sh->n_head,
                                             sh->n_kv_head, c->head_dim, c->rms_eps));
            pgd_kv_layer kl = pgd_kv_cache_layer(kv, r->rank, il);
            kl.window = l->window;
            kl.scale = c->attn_scale;
            kl.softcap = c->attn_softcap;
            if (l->no_rope) /* SmolLM3's NoPE layers: positions only through the causal mask */
                TIMED(r, PR_ROPE_KV, o->kv_store(be, &kl, r->k, r->v, &s));
            else
                TIMED(r, PR_ROPE_KV, o->rope_kv_store(be, r->q, r->k, r->v, sh->n_head,
                                                      sh->n_kv_head, &kl, &s,
                                                      l->local_rope ? &rp_local : &rp));
            TIMED(r, PR_ATTN,
                  o->attention(be, r->q, &kl, r->xb, sh->n_head, sh->n_kv_head, c->head_dim, &s));
            TIMED(r, PR_O, o->matmul(be, &l->wo, r->xb, r->xb2, n));
            if (lora) lora_apply(f, r, il, 3, r->xb, r->xb2, n, q_dim, dim);
        }
        TIMED(r, PR_REDUCE, rc = all_reduce(f, r, r->xb2, (size_t)n * dim));
        if (rc) return rc;
        out = post_norm(r, l->post_attn_norm, n);
        TIMED(r, PR_NORM, o->add_rms_norm(be, r->x, out, fn, r->xb, n, dim, c->rms_eps));
        if (l->moe.n_expert) {
            TIMED(r, PR_ROUTER, o->matmul(be, &l->w_router, r->xb, r->router, n));
            TIMED(r, PR_MOE, o->moe(be, &l->moe, r->xb, r->router, r->xb2, r->moe_work, n, dim));
        } else {
            TIMED(r, PR_GATE, o->matmul(be, &l->w_gate, r->xb, r->hb, n));
            TIMED(r, PR_UP, o->matmul(be, &l->w_up, r->xb, r->hb2, n));
            if (lora) {
                lora_apply(f, r, il, 4, r->xb, r->hb, n, dim, sh->ffn_dim);
                lora_apply(f, r, il, 5, r->xb, r->hb2, n, dim, sh->ffn_dim);
            }
            if (c->gelu) TIMED(r, PR_ACT, o->gelu_gate(be, r->hb, r->hb2, (size_t)n * sh->ffn_dim));
            else TIMED(r, PR_ACT, o->silu_gate(be, r->hb, r->hb2, (size_t)n * sh->ffn_dim));
            TIMED(r, PR_DOWN, o->matmul(be, &l->w_down, r->hb, r->xb2, n));
            if (lora) lora_apply(f, r, il, 6, r->hb, r->xb2, n, sh->ffn_dim, dim);
        }
        TIMED(r, PR_REDUCE, rc = all_reduce(f, r, r->xb2, (size_t)n * dim));
        if (rc) return rc;
        out = post_norm(r, l->post_ffn_norm, n);
    }
    o->add(be, r->x, out, (size_t)n * dim);

    if (b->n_logits == 0) return o->sync(be);
    o->gather_rows(be, r->x, r->xb, dim, &s);
    o->rms_norm(be, r->xb, sh->output_norm, r->xb2, b->n_logits, dim, c->rms_eps);
    TIMED(r, PR_HEAD, o->matmul(be, &sh->output, r->xb2, r->logits, b->n_logits));
    if (c->final_softcap > 0) /* Gemma 2 */
        o->softcap(be, r->logits, c->final_softcap, (size_t)b->n_logits * (size_t)sh->n_vocab);
    if ((rc = o->sync(be))) return rc;
    size_t hidden_bytes = (size_t)b->n_logits * (size_t)dim * sizeof(float);
    if (b->hidden && r->rank == 0 && /* x is whole on every rank */
        (rc = o->download(be, b->hidden, r->xb2, hidden_bytes)))
        return rc;
    if (f->n_ranks > 1) {
        rc = f->comm->ops->gather_cols(f->comm, r->rank, r->logits, b->n_logits, sh->n_vocab,
                                       sh->vocab_lo, r->rank == 0 ? f->logits : NULL,
                                       c->n_vocab);
        /* the vocabulary slices meet on the host: rank 0 samples there with the reference */
        if (!rc && b->sample && r->rank == 0)
            pgd_device_sample_rows(be->pool, f->logits, b->n_logits, c->n_vocab, b->sample,
                                   b->sampled);
        return rc;
    }
    if (b->sample) { /* only the token ids leave the backend */
        rc = o->sample(be, r->logits, b->n_logits, c->n_vocab, b->sample, b->sampled);
        if (rc || !b->need_logits) return rc;
    }
    if (r->logits != f->logits)
        return o->download(be, f->logits, r->logits,
                           (size_t)b->n_logits * (size_t)c->n_vocab * sizeof(float));
    return PGD_OK;
}

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
    if (kv->n_ranks != f->n_ranks) return PGD_EINVAL;
    if (f->n_ranks == 1) return forward_rank(f, &f->ranks[0], kv, b);

    pgd_fwd_sync *s = f->sync;
    pthread_mutex_lock(&s->mu);
    s->kv = kv;
    s->b = b;
    s->n_done = 0;
    s->gen++;
    pthread_cond_broadcast(&s->go);
    pthread_mutex_unlock(&s->mu);
    int rc = forward_rank(f, &f->ranks[0], kv, b);
    pthread_mutex_lock(&s->mu);
    while (s->n_done < f->n_ranks - 1) pthread_cond_wait(&s->done, &s->mu);
    pthread_mutex_unlock(&s->mu);
    for (int ri = 1; ri < f->n_ranks; ri++)
        if (!rc) rc = f->ranks[ri].rc;
    return rc;
}

/* ---- the single-sequence session ---- */

#define SESSION_BLOCK 16

int pgd_session_init(pgd_session *s, const pgd_model *m, pgd_pool *pool, int32_t max_batch,
                     pgd_err *err) {
    return pgd_session_init_kv(s, m, pool, max_batch, PGD_TYPE_F32, err);
}

int pgd_session_init_kv(pgd_session *s, const pgd_model *m, pgd_pool *pool, int32_t max_batch,
                        pgd_type kv_type, pgd_err *err) {
    return pgd_session_init_kv2(s, m, pool, max_batch, kv_type, kv_type, err);
}

int pgd_session_init_kv2(pgd_session *s, const pgd_model *m, pgd_pool *pool, int32_t max_batch,
                         pgd_type kv_type, pgd_type v_type, pgd_err *err) {
    memset(s, 0, sizeof *s);
    const pgd_model_config *c = &m->cfg;
    if (max_batch < 1) max_batch = 1;
    if (max_batch > c->n_ctx) max_batch = c->n_ctx;
    s->model = m;
    s->n_ctx = c->n_ctx;
    s->max_batch = max_batch;
    int32_t n_blocks = (c->n_ctx + SESSION_BLOCK - 1) / SESSION_BLOCK;
    int rc = pgd_kv_cache_init2(&s->kv, m, kv_type, v_type, n_blocks, SESSION_BLOCK, err);
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
        .logit_rows = all_logits ? s->rows : &s->rows[n - 1], .seq_lora = &s->lora,
    };
    int rc = pgd_model_forward(&s->fwd, &s->kv, &b);
    if (rc == PGD_OK) s->n_past += n;
    return rc;
}
