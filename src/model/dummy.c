/* --load-format dummy: a model of a config.json's shapes with random weights (PAGODA_DUMMY_TYPE
 * picks their type), for benchmarks and tests of models too large to download. */
#include "model/model_impl.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include "backend/cpu/matmul.h"
#include "backend/cpu/quant.h"
#include "util/mapfile.h"
#include "util/xalloc.h"
#include "util/env.h"
#include <sys/mman.h>

/* ---- --load-format dummy: shapes from a config.json, random weights ---- */

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* PAGODA_DUMMY_TYPE: the weight types of a dummy model. A type name (BF16 unless set; F32, F16,
 * Q8_0, Q4_K, IQ4_XS...) for every matrix, or Q4_K_M: Q6_K for V, down and the LM head and Q4_K
 * for the rest, as llama.cpp's Q4_K_M roughly (it gives V and down Q6_K in about half the
 * layers).
 * types[0] is the main type, types[1] that of V, down and the head. */
static int dummy_types(const pgd_model *m, pgd_type types[2], pgd_err *err) {
    const char *env = pgd_env(PGD_ENV_DUMMY_TYPE);
    types[0] = types[1] = PGD_TYPE_BF16;
    if (!env || !*env) return PGD_OK;
    if (!strcasecmp(env, "Q4_K_M")) {
        types[0] = PGD_TYPE_Q4_K;
        types[1] = PGD_TYPE_Q6_K;
        return PGD_OK;
    }
    if (pgd_type_from_name(env, &types[0]) || !pgd_cpu_type_supported(types[0]))
        return pgd_err_set(err, PGD_EINVAL, "%s: PAGODA_DUMMY_TYPE=%.32s is not a weight type "
                           "(F32, F16, BF16, Q8_0, Q4_0, Q4_K, IQ4_XS, ... or Q4_K_M)", m->path,
                           env);
    types[1] = types[0];
    return PGD_OK;
}

/* A buffer of bytes dummy values of type t: floats uniform in +-0.02, or blocks of random
 * quants with small scales (1e-4: a K-quant weight is at most ~0.1). */
static void *dummy_fill(pgd_type t, size_t bytes, uint64_t *st) {
    unsigned char *buf = malloc(bytes ? bytes : 1);
    if (!buf) return NULL;
    if (t == PGD_TYPE_F32 || t == PGD_TYPE_F16 || t == PGD_TYPE_BF16) {
        size_t es = t == PGD_TYPE_F32 ? 4 : 2;
        for (size_t i = 0; i < bytes / es; i++) {
            float v = ((float)(splitmix(st) >> 40) / (float)(1 << 24) * 2.0f - 1.0f) * 0.02f;
            uint16_t h = t == PGD_TYPE_F16 ? pgd_fp32_to_fp16(v) : pgd_fp32_to_bf16(v);
            if (es == 4) memcpy(buf + 4 * i, &v, 4);
            else memcpy(buf + 2 * i, &h, 2);
        }
        return buf;
    }
    for (size_t i = 0; i < bytes; i += 8) {
        uint64_t r = splitmix(st);
        memcpy(buf + i, &r, bytes - i < 8 ? bytes - i : 8);
    }
    const uint16_t scale = pgd_fp32_to_fp16(1e-4f);
    int od, om;
    pgd_type_scale_offsets(t, &od, &om);
    for (size_t b = 0, bb = pgd_type_block_bytes(t); b + bb <= bytes; b += bb) {
        if (od >= 0) memcpy(buf + b + od, &scale, 2);
        if (om >= 0) memcpy(buf + b + om, &scale, 2);
    }
    return buf;
}

/* Every weight of a dummy model views one shared buffer per weight type, of random values (the
 * shapes and bytes are real; the values do not matter to a benchmark). Norms are 1. */
static int dummy_weights(pgd_model *m, uint64_t seed, pgd_err *err) {
    const pgd_model_config *c = &m->cfg;
    int64_t q_dim = (int64_t)c->n_head * c->head_dim, kv_dim = (int64_t)c->n_kv_head * c->head_dim;
    pgd_type types[2];
    int rc = dummy_types(m, types, err);
    if (rc) return rc;
    /* every (n_in, n_out) a matrix has: each buffer holds the largest of them in its type */
    const int64_t E = c->n_expert, mf = c->moe_ffn_dim, sf = c->moe_shared_dim;
    /* latent attention (DeepSeek): its q (through q LoRA or not), kv_a and o */
    const int64_t qr = c->q_lora_rank, mq = (int64_t)c->n_head * (c->qk_nope_dim + c->rope_dim);
    const int64_t mla = c->kv_lora_rank > 0, r = c->kv_lora_rank + c->rope_dim;
    const int64_t shapes[][2] = {{c->dim, c->n_vocab}, {c->dim, q_dim}, {c->dim, kv_dim},
                                 {q_dim, c->dim},      {c->dim, c->ffn_dim}, {c->ffn_dim, c->dim},
                                 {c->dim, E},          {c->dim, E ? mf : 0}, {E ? mf : 0, c->dim},
                                 {c->dim, 1},          {c->dim, sf},      {sf, c->dim},
                                 {c->dim, qr},         {qr, qr ? mq : 0},  {c->dim, mla ? mq : 0},
                                 {c->dim, mla ? r : 0},
                                 {(int64_t)c->n_head * c->v_head_dim, mla ? c->dim : 0}};
    void *bufs[2] = {NULL, NULL};
    uint64_t st = seed ? seed : 42;
    for (int k = 0; k < (types[1] != types[0] ? 2 : 1); k++) {
        size_t need = 0;
        for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
            if (shapes[i][0] <= 0 || shapes[i][1] <= 0) continue; /* no such matrix */
            uint64_t rb = pgd_type_row_bytes(types[k], (uint64_t)shapes[i][0]);
            if (!rb)
                return pgd_err_set(err, PGD_EINVAL, "%s: PAGODA_DUMMY_TYPE %s needs rows that "
                                   "are multiples of %u elements, and this model has rows of "
                                   "%" PRId64, m->path, pgd_type_name(types[k]),
                                   pgd_type_block_elems(types[k]), shapes[i][0]);
            if (rb * (uint64_t)shapes[i][1] > need) need = rb * (size_t)shapes[i][1];
        }
        if ((rc = pgd__own(m, bufs[k] = dummy_fill(types[k], need, &st), err))) return rc;
    }
    if (!bufs[1]) bufs[1] = bufs[0]; /* one type */
    int n_ones = c->dim > c->head_dim ? c->dim : c->head_dim;
    if (c->q_lora_rank > n_ones) n_ones = c->q_lora_rank;
    float *ones = malloc((size_t)n_ones * sizeof *ones);
    if ((rc = pgd__own(m, ones, err))) return rc;
    for (int i = 0; i < n_ones; i++) ones[i] = 1.0f;
#define DWK(w, in, out, k)                                                                       \
    ((w) = (pgd_weight){types[k], (in), (out),                                                   \
                        (size_t)pgd_type_row_bytes(types[k], (uint64_t)(in)), bufs[k], false})
#define DW(w, in, out) DWK(w, in, out, 0)
    DW(m->tok_embd, c->dim, c->n_vocab);
    DWK(m->output, c->dim, c->n_vocab, 1);
    m->output_norm = ones;
    m->layers = calloc((size_t)c->n_layer, sizeof *m->layers);
    if (!m->layers) return pgd_err_set(err, PGD_ENOMEM, "%s: out of memory", m->path);
    for (int il = 0; il < c->n_layer; il++) {
        pgd_layer *l = &m->layers[il];
        bool moe = c->n_expert && il >= c->n_dense;
        if (mla) { /* (kv_b's per-head F32 halves: each layer its own, as loaded models have) */
            const int64_t H = c->n_head, kr = c->kv_lora_rank;
            size_t uk = (size_t)(H * kr * c->qk_nope_dim), uv = (size_t)(H * c->v_head_dim * kr);
            float *w;
            if ((rc = pgd__own(m, w = dummy_fill(PGD_TYPE_F32, (uk + uv) * sizeof *w, &st), err)))
                return rc;
            l->w_uk_t = w;
            l->w_uv = w + uk;
            if (qr) {
                DW(l->wq_a, c->dim, qr);
                DW(l->wq_b, qr, mq);
                l->q_a_norm = ones;
            } else {
                DW(l->wq, c->dim, mq);
            }
            DW(l->wkv_a, c->dim, r);
            l->kv_a_norm = ones;
            DW(l->wo, H * c->v_head_dim, c->dim);
        } else {
            DW(l->wq, c->dim, q_dim);
            DW(l->wk, c->dim, kv_dim);
            DWK(l->wv, c->dim, kv_dim, 1);
            DW(l->wo, q_dim, c->dim);
        }
        if (!moe || c->moe_shared) { /* a dense FFN, or Qwen2-MoE's shared expert */
            DW(l->w_gate, c->dim, c->ffn_dim);
            DW(l->w_up, c->dim, c->ffn_dim);
            DWK(l->w_down, c->ffn_dim, c->dim, 1);
        } else if (sf) { /* DeepSeek's shared experts */
            DW(l->w_gate, c->dim, sf);
            DW(l->w_up, c->dim, sf);
            DWK(l->w_down, sf, c->dim, 1);
        }
        l->attn_norm = l->ffn_norm = ones;
        if (c->arch == PGD_ARCH_QWEN3) l->q_norm = l->k_norm = ones;
        l->no_rope = c->no_rope && c->no_rope[il];
        l->window = c->window ? c->window[il] : 0;
        l->local_rope = c->local_rope && c->local_rope[il];
        if (pgd__gemma_arch(c->arch)) l->post_attn_norm = l->post_ffn_norm = ones;
        if (c->arch == PGD_ARCH_GEMMA3) l->q_norm = l->k_norm = ones;
        if (!moe) continue;
        l->experts = calloc(3 * (size_t)E, sizeof *l->experts);
        if ((rc = pgd__own(m, l->experts, err))) return rc;
        DW(l->w_router, c->dim, E);
        for (int e = 0; e < E; e++) {
            DW(l->experts[e], c->dim, c->moe_ffn_dim);
            DW(l->experts[E + e], c->dim, c->moe_ffn_dim);
            DW(l->experts[2 * E + e], c->moe_ffn_dim, c->dim);
        }
        l->moe = pgd__experts_moe(c, l->experts, c->moe_ffn_dim);
        if (c->moe_shared) {
            DW(l->w_shared_inp, c->dim, 1);
            pgd__moe_add_shared(&l->moe, l, c->ffn_dim);
        } else if (sf) {
            pgd__moe_add_shared(&l->moe, l, (int32_t)sf);
            l->moe.shared_inp = NULL; /* (DeepSeek's: not gated) */
        }
    }
#undef DW
#undef DWK
    return PGD_OK;
}

/* -m names a config.json (any file name) or its folder. A tokenizer.json beside it is loaded
 * (text in and out, as for the real model); without one the model runs on token ids only. */
int pgd__load_dummy(pgd_model *m, const pgd_model_opts *opts, pgd_err *err) {
    char dir[PATH_MAX], cfg[PATH_MAX + 16], tj[PATH_MAX + 32], tc[PATH_MAX + 32];
    struct stat st;
    snprintf(dir, sizeof dir, "%s", m->path);
    if (stat(m->path, &st) == 0 && S_ISDIR(st.st_mode)) {
        snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    } else {
        snprintf(cfg, sizeof cfg, "%s", m->path);
        char *slash = strrchr(dir, '/');
        if (!slash) snprintf(dir, sizeof dir, ".");
        else if (slash == dir) dir[1] = 0;
        else *slash = 0;
    }
    int rc = pgd__hf_config_file(m, cfg, err);
    if (rc) return rc;
    snprintf(tj, sizeof tj, "%s/tokenizer.json", dir);
    snprintf(tc, sizeof tc, "%s/tokenizer_config.json", dir);
    if (stat(tj, &st) == 0) {
        if ((rc = pgd_tokenizer_load_hf(tj, stat(tc, &st) == 0 ? tc : NULL, &m->tok, err)))
            return rc;
        if (pgd_tokenizer_n_vocab(m->tok) > m->cfg.n_vocab)
            return pgd_err_set(err, PGD_EFORMAT, "%s: tokenizer has %d tokens but the config "
                               "only %d", tj, pgd_tokenizer_n_vocab(m->tok), m->cfg.n_vocab);
    }
    if (opts->n_ctx > 0 && opts->n_ctx < m->cfg.n_ctx) m->cfg.n_ctx = opts->n_ctx;
    return dummy_weights(m, opts->dummy_seed, err);
}
