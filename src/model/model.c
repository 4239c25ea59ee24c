/* Model loading: GGUF files and Hugging Face directories (config.json + safetensors +
 * tokenizer.json). The configuration is read by config.c, random weights made by dummy.c; here
 * the tensors are found, the weights loaded and placed on their devices and ranks. Weights stay
 * in the file mappings unless they must be converted (F16/BF16 norms, misaligned data,
 * --weights-f32). */
#include "model/model.h"
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

/* A tensor found in either kind of file, before it becomes a weight. */
typedef struct src_tensor {
    pgd_type type;
    uint64_t ne[4]; /* ne[0] innermost, GGUF order */
    uint32_t n_dims;
    const void *data;
    uint64_t nbytes;
} src_tensor;

int pgd__own(pgd_model *m, void *p, pgd_err *err) {
    if (!p) return pgd_err_set(err, PGD_ENOMEM, "%s: out of memory", m->path);
    if (pgd_grow(&m->owned, m->n_owned, &m->cap_owned, 64, sizeof *m->owned)) {
        free(p);
        return pgd_err_set(err, PGD_ENOMEM, "%s: out of memory", m->path);
    }
    m->owned[m->n_owned++] = p;
    return PGD_OK;
}

/* ---- tensor lookup in GGUF or safetensors, by GGUF-style and HF-style names ---- */

static bool find_src(const pgd_model *m, const char *name, src_tensor *out) {
    if (m->gguf.n_tensors) {
        const pgd_gguf_tensor *t = pgd_gguf_find_tensor(&m->gguf, name);
        if (!t) return false;
        out->type = t->type;
        memcpy(out->ne, t->ne, sizeof out->ne);
        out->n_dims = t->n_dims;
        out->data = t->data;
        out->nbytes = t->nbytes;
        return true;
    }
    const pgd_st_tensor *t = pgd_st_find(&m->st, name);
    if (!t) return false;
    out->type = t->type;
    out->n_dims = t->n_dims;
    for (int d = 0; d < 4; d++) out->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) out->ne[d] = t->shape[t->n_dims - 1 - d];
    out->data = t->data;
    out->nbytes = t->nbytes;
    return true;
}

/* GGUF name -> HF name, per layer where il >= 0. */
static void tensor_name(const pgd_model *m, char *buf, size_t cap, int il, const char *gguf_name,
                        const char *hf_name) {
    bool gguf = m->gguf.n_tensors || !m->st.n_tensors;
    char name[256];
    if (il < 0) snprintf(name, sizeof name, "%s", gguf ? gguf_name : hf_name);
    else if (gguf) snprintf(name, sizeof name, "blk.%d.%s", il, gguf_name);
    else snprintf(name, sizeof name, "model.layers.%d.%s", il, hf_name);
    if (!gguf && m->hf_prefix && !strcmp(name, "lm_head.weight"))
        snprintf(buf, cap, "%s", m->hf_head);
    else if (!gguf && m->hf_prefix && !strncmp(name, "model.", 6))
        snprintf(buf, cap, "%s%s", m->hf_prefix, name + 6);
    else snprintf(buf, cap, "%s", name);
}

/* The weight of n_out rows of n_in in t, the tensor `name` (its shape checked by the caller). */
static int weight_from(pgd_model *m, const char *name, const src_tensor *tp, int64_t n_in,
                       int64_t n_out, bool weights_f32, pgd_weight *w, pgd_err *err) {
    src_tensor t = *tp;
    if (!pgd_cpu_type_supported(t.type))
        return pgd_err_set(err, PGD_EUNSUPPORTED, "%s: tensor '%s' has type %s, which the CPU "
                           "backend does not support", m->path, name, pgd_type_name(t.type));
    w->type = t.type;
    w->n_in = n_in;
    w->n_out = n_out;
    w->row_bytes = pgd_type_row_bytes(t.type, (uint64_t)n_in);
    w->data = t.data;
    bool misaligned = ((uintptr_t)t.data & 3) != 0;
    if (weights_f32 && t.type != PGD_TYPE_F32) {
        float *f = malloc((size_t)n_in * (size_t)n_out * sizeof *f);
        int rc = pgd__own(m, f, err);
        if (rc) return rc;
        for (int64_t r = 0; r < n_out; r++)
            pgd_dequantize_row(t.type, (const char *)t.data + r * w->row_bytes, f + r * n_in, n_in);
        w->type = PGD_TYPE_F32;
        w->row_bytes = (size_t)n_in * sizeof(float);
        w->data = f;
    } else if (misaligned) {
        void *c = malloc(t.nbytes);
        int rc = pgd__own(m, c, err);
        if (rc) return rc;
        memcpy(c, t.data, t.nbytes);
        w->data = c;
    }
    return PGD_OK;
}

static int load_weight(pgd_model *m, int il, const char *gname, const char *hname, int64_t n_in,
                       int64_t n_out, bool optional, bool weights_f32, pgd_weight *w, pgd_err *err) {
    char name[256];
    tensor_name(m, name, sizeof name, il, gname, hname);
    src_tensor t;
    if (!find_src(m, name, &t)) {
        if (optional) {
            memset(w, 0, sizeof *w);
            return PGD_OK;
        }
        return pgd_err_set(err, PGD_EFORMAT, "%s: missing tensor '%s'", m->path, name);
    }
    if ((int64_t)t.ne[0] != n_in || (int64_t)t.ne[1] != n_out || t.ne[2] != 1 || t.ne[3] != 1)
        return pgd_err_set(err, PGD_EFORMAT, "%s: tensor '%s' has shape [%" PRIu64 ", %" PRIu64
                           "], expected [%" PRId64 ", %" PRId64 "]", m->path, name, t.ne[1],
                           t.ne[0], n_out, n_in);
    return weight_from(m, name, &t, n_in, n_out, weights_f32, w, err);
}

/* Points moe at layer l's shared expert (its dense FFN matrices), of ffn_dim columns. */
void pgd__moe_add_shared(pgd_moe *moe, const pgd_layer *l, int32_t ffn_dim) {
    moe->shared_ffn_dim = ffn_dim;
    moe->shared_gate = &l->w_gate;
    moe->shared_up = &l->w_up;
    moe->shared_down = &l->w_down;
    moe->shared_inp = &l->w_shared_inp;
}

/* The moe op's view of experts ex (gate, up, down matrices) of ffn_dim columns each. */
pgd_moe pgd__experts_moe(const pgd_model_config *c, const pgd_weight *ex, int32_t ffn_dim) {
    const int32_t E = c->n_expert;
    return (pgd_moe){.n_expert = E, .n_used = c->n_expert_used, .ffn_dim = ffn_dim,
                     .norm = c->moe_norm, .gate = ex, .up = ex + E, .down = ex + 2 * E,
                     .sigmoid = c->moe_sigmoid, .n_group = c->moe_n_group > 1 ? c->moe_n_group : 0,
                     .topk_group = c->moe_topk_group, .scale = c->moe_scale};
}

/* The router and experts of MoE layer il. A GGUF file stacks each kind of expert matrix in one
 * 3-D tensor (ffn_gate_exps, ...: [n_in, n_out, n_expert]), each expert a view of its slice;
 * Mixtral GGUFs converted before llama.cpp stacked them (early 2024) name each expert's
 * (ffn_gate.E, ...), as a Hugging Face checkpoint does (Mixtral: block_sparse_moe.experts.E.w1
 * (gate), w3 (up), w2 (down); Qwen: mlp.experts.E.gate_proj, up_proj, down_proj). */
static int load_experts(pgd_model *m, int il, bool f32, pgd_layer *l, pgd_err *err) {
    const pgd_model_config *c = &m->cfg;
    const int32_t E = c->n_expert, F = c->moe_ffn_dim;
    bool gguf = m->gguf.n_tensors != 0;
    char name[256];
    src_tensor t;
    bool mixtral = !gguf && c->arch == PGD_ARCH_LLAMA; /* HF names: Mixtral's, else Qwen's */
    pgd_weight *ex = calloc(3 * (size_t)E, sizeof *ex);
    int rc = pgd__own(m, ex, err);
    if (rc) return rc;
    if ((rc = load_weight(m, il, "ffn_gate_inp.weight",
                          mixtral ? "block_sparse_moe.gate.weight" : "mlp.gate.weight", c->dim, E,
                          false, f32, &l->w_router, err)))
        return rc;
    struct { const char *g, *gs, *h, *hm; int64_t in, out; } parts[3] = {
        {"ffn_gate_exps.weight", "ffn_gate.%d.weight", "mlp.experts.%d.gate_proj.weight",
         "block_sparse_moe.experts.%d.w1.weight", c->dim, F},
        {"ffn_up_exps.weight", "ffn_up.%d.weight", "mlp.experts.%d.up_proj.weight",
         "block_sparse_moe.experts.%d.w3.weight", c->dim, F},
        {"ffn_down_exps.weight", "ffn_down.%d.weight", "mlp.experts.%d.down_proj.weight",
         "block_sparse_moe.experts.%d.w2.weight", F, c->dim},
    };
    for (int p = 0; p < 3; p++) {
        pgd_weight *w = ex + (size_t)p * E;
        tensor_name(m, name, sizeof name, il, parts[p].g, "");
        bool split = !gguf || !find_src(m, name, &t);
        if (split) {
            char sn[128];
            snprintf(sn, sizeof sn, parts[p].gs, 0);
            tensor_name(m, name, sizeof name, il, sn, "");
            if (gguf && !find_src(m, name, &t)) /* neither form: name the stacked one */
                return pgd_err_set(err, PGD_EFORMAT, "%s: missing tensor 'blk.%d.%s'", m->path,
                                   il, parts[p].g);
            for (int e = 0; e < E; e++) {
                char gn[128], hn[128];
                snprintf(gn, sizeof gn, parts[p].gs, e);
                snprintf(hn, sizeof hn, mixtral ? parts[p].hm : parts[p].h, e);
                if ((rc = load_weight(m, il, gn, hn, parts[p].in, parts[p].out, false, f32, &w[e],
                                      err)))
                    return rc;
            }
            continue;
        }
        if ((int64_t)t.ne[0] != parts[p].in || (int64_t)t.ne[1] != parts[p].out ||
            (int64_t)t.ne[2] != E || t.ne[3] != 1)
            return pgd_err_set(err, PGD_EFORMAT, "%s: tensor '%s' has shape [%" PRIu64 ", %"
                               PRIu64 ", %" PRIu64 "], expected [%d, %" PRId64 ", %" PRId64 "]",
                               m->path, name, t.ne[2], t.ne[1], t.ne[0], E, parts[p].out,
                               parts[p].in);
        size_t bytes = pgd_type_row_bytes(t.type, t.ne[0]) * (size_t)parts[p].out;
        for (int e = 0; e < E; e++) {
            src_tensor te = t;
            te.ne[2] = 1;
            te.data = (const char *)t.data + (size_t)e * bytes;
            te.nbytes = bytes;
            if ((rc = weight_from(m, name, &te, parts[p].in, parts[p].out, f32, &w[e], err)))
                return rc;
        }
    }
    l->experts = ex;
    l->moe = pgd__experts_moe(c, ex, F);
    if (!c->moe_shared) return PGD_OK;
    struct { const char *g, *h; int64_t in, out; pgd_weight *w; } sh[] = {
        {"ffn_gate_inp_shexp.weight", "mlp.shared_expert_gate.weight", c->dim, 1,
         &l->w_shared_inp},
        {"ffn_gate_shexp.weight", "mlp.shared_expert.gate_proj.weight", c->dim, c->ffn_dim,
         &l->w_gate},
        {"ffn_up_shexp.weight", "mlp.shared_expert.up_proj.weight", c->dim, c->ffn_dim, &l->w_up},
        {"ffn_down_shexp.weight", "mlp.shared_expert.down_proj.weight", c->ffn_dim, c->dim,
         &l->w_down},
    };
    for (size_t i = 0; i < sizeof sh / sizeof sh[0]; i++)
        if ((rc = load_weight(m, il, sh[i].g, sh[i].h, sh[i].in, sh[i].out, false, f32, sh[i].w,
                              err)))
            return rc;
    pgd__moe_add_shared(&l->moe, l, c->ffn_dim);
    return PGD_OK;
}

/* Loads a 1-D vector of n elements as F32 (converted into an owned buffer when needed). */
static int load_vec(pgd_model *m, int il, const char *gname, const char *hname, int64_t n,
                    bool optional, const float **out, pgd_err *err) {
    char name[256];
    tensor_name(m, name, sizeof name, il, gname, hname);
    src_tensor t;
    *out = NULL;
    if (!find_src(m, name, &t)) {
        if (optional) return PGD_OK;
        return pgd_err_set(err, PGD_EFORMAT, "%s: missing tensor '%s'", m->path, name);
    }
    if ((int64_t)t.ne[0] != n || t.ne[1] != 1 || t.ne[2] != 1 || t.ne[3] != 1)
        return pgd_err_set(err, PGD_EFORMAT, "%s: tensor '%s' has %" PRIu64 " elements, expected %"
                           PRId64, m->path, name, t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3], n);
    if (t.type == PGD_TYPE_F32 && ((uintptr_t)t.data & 3) == 0) {
        *out = t.data;
        return PGD_OK;
    }
    if (!pgd_cpu_type_supported(t.type))
        return pgd_err_set(err, PGD_EUNSUPPORTED, "%s: tensor '%s' has unsupported type %s",
                           m->path, name, pgd_type_name(t.type));
    float *f = malloc((size_t)n * sizeof *f);
    int rc = pgd__own(m, f, err);
    if (rc) return rc;
    if (t.type == PGD_TYPE_F32) memcpy(f, t.data, (size_t)n * sizeof *f);
    else pgd_dequantize_row(t.type, t.data, f, n);
    *out = f;
    return PGD_OK;
}

/* kv_b_proj of latent-attention layer il into the per-head F32 matrices the absorbed attention
 * multiplies by (pgd_layer.w_uk_t, w_uv): from a Hugging Face kv_b_proj or a GGUF attn_kv_b
 * ((n_head * (nope + v), r): each head's nope K rows, then its v V rows), or the split GGUF
 * pair llama.cpp's converter writes now, attn_k_b ([n_head, r, nope]: K's rows transposed) and
 * attn_v_b ([n_head, v, r]). */
static int load_kv_b(pgd_model *m, int il, pgd_layer *l, pgd_err *err) {
    const pgd_model_config *c = &m->cfg;
    const int64_t H = c->n_head, r = c->kv_lora_rank, nope = c->qk_nope_dim, v = c->v_head_dim;
    char name[256], vname[256];
    src_tensor t, tv;
    float *uk = malloc((size_t)(H * r * nope) * sizeof *uk);
    int rc = pgd__own(m, uk, err);
    if (rc) return rc;
    float *uv = malloc((size_t)(H * v * r) * sizeof *uv);
    if ((rc = pgd__own(m, uv, err))) return rc;
    l->w_uk_t = uk;
    l->w_uv = uv;
    tensor_name(m, name, sizeof name, il, "attn_k_b.weight", "");
    tensor_name(m, vname, sizeof vname, il, "attn_v_b.weight", "");
    if (m->gguf.n_tensors && find_src(m, name, &t)) {
        if (!find_src(m, vname, &tv))
            return pgd_err_set(err, PGD_EFORMAT, "%s: missing tensor '%s'", m->path, vname);
        if (t.ne[0] != (uint64_t)nope || t.ne[1] != (uint64_t)r || t.ne[2] != (uint64_t)H ||
            tv.ne[0] != (uint64_t)r || tv.ne[1] != (uint64_t)v || tv.ne[2] != (uint64_t)H ||
            t.ne[3] != 1 || tv.ne[3] != 1 || !pgd_cpu_type_supported(t.type) ||
            !pgd_cpu_type_supported(tv.type) || !pgd_type_row_bytes(t.type, (uint64_t)nope) ||
            !pgd_type_row_bytes(tv.type, (uint64_t)r))
            return pgd_err_set(err, PGD_EFORMAT, "%s: tensors '%s' and '%s' are not [%" PRId64
                               ", %" PRId64 ", %" PRId64 "] and [%" PRId64 ", %" PRId64 ", %"
                               PRId64 "] of a supported type", m->path, name, vname, H, r, nope,
                               H, v, r);
        size_t kb = pgd_type_row_bytes(t.type, (uint64_t)nope);
        size_t vb = pgd_type_row_bytes(tv.type, (uint64_t)r);
        for (int64_t i = 0; i < H * r; i++)
            pgd_dequantize_row(t.type, (const char *)t.data + (size_t)i * kb, uk + i * nope, nope);
        for (int64_t i = 0; i < H * v; i++)
            pgd_dequantize_row(tv.type, (const char *)tv.data + (size_t)i * vb, uv + i * r, r);
        return PGD_OK;
    }
    pgd_weight kvb;
    if ((rc = load_weight(m, il, "attn_kv_b.weight", "self_attn.kv_b_proj.weight", r,
                          H * (nope + v), false, false, &kvb, err)))
        return rc;
    float *row = malloc((size_t)r * sizeof *row);
    if (!row) return pgd_err_set(err, PGD_ENOMEM, "%s: out of memory", m->path);
    for (int64_t h = 0; h < H; h++)
        for (int64_t i = 0; i < nope + v; i++) {
            pgd_dequantize_row(kvb.type, (const char *)kvb.data +
                                             (size_t)(h * (nope + v) + i) * kvb.row_bytes,
                               row, r);
            if (i < nope)
                for (int64_t j = 0; j < r; j++) uk[(h * r + j) * nope + i] = row[j];
            else
                memcpy(uv + (h * v + i - nope) * r, row, (size_t)r * sizeof *row);
        }
    free(row);
    return PGD_OK;
}

/* Latent attention's matrices and norms of layer il (model.h, pgd_layer). */
static int load_mla(pgd_model *m, int il, bool f32, pgd_layer *l, pgd_err *err) {
    const pgd_model_config *c = &m->cfg;
    const int64_t H = c->n_head, qk = c->qk_nope_dim + c->rope_dim, qr = c->q_lora_rank;
    const int64_t r = c->kv_lora_rank;
    int rc;
    if (qr) {
        if ((rc = load_weight(m, il, "attn_q_a.weight", "self_attn.q_a_proj.weight", c->dim, qr,
                              false, f32, &l->wq_a, err)) ||
            (rc = load_vec(m, il, "attn_q_a_norm.weight", "self_attn.q_a_layernorm.weight", qr,
                           false, &l->q_a_norm, err)) ||
            (rc = load_weight(m, il, "attn_q_b.weight", "self_attn.q_b_proj.weight", qr, H * qk,
                              false, f32, &l->wq_b, err)))
            return rc;
    } else if ((rc = load_weight(m, il, "attn_q.weight", "self_attn.q_proj.weight", c->dim,
                                 H * qk, false, f32, &l->wq, err))) {
        return rc;
    }
    if ((rc = load_weight(m, il, "attn_kv_a_mqa.weight", "self_attn.kv_a_proj_with_mqa.weight",
                          c->dim, r + c->rope_dim, false, f32, &l->wkv_a, err)) ||
        (rc = load_vec(m, il, "attn_kv_a_norm.weight", "self_attn.kv_a_layernorm.weight", r,
                       false, &l->kv_a_norm, err)) ||
        (rc = load_kv_b(m, il, l, err)))
        return rc;
    return load_weight(m, il, "attn_output.weight", "self_attn.o_proj.weight",
                       H * c->v_head_dim, c->dim, false, f32, &l->wo, err);
}

/* DeepSeek's expert layer il past the router and experts (load_experts): the routing bias
 * (V3's e_score_correction_bias; none in V2) and the shared experts, run ungated. */
static int load_deepseek_moe(pgd_model *m, int il, bool f32, pgd_layer *l, pgd_err *err) {
    const pgd_model_config *c = &m->cfg;
    int rc = load_vec(m, il, "exp_probs_b.bias", "mlp.gate.e_score_correction_bias", c->n_expert,
                      true, &l->moe.bias, err);
    if (rc || !c->moe_shared_dim) return rc;
    struct { const char *g, *h; int64_t in, out; pgd_weight *w; } sh[] = {
        {"ffn_gate_shexp.weight", "mlp.shared_experts.gate_proj.weight", c->dim,
         c->moe_shared_dim, &l->w_gate},
        {"ffn_up_shexp.weight", "mlp.shared_experts.up_proj.weight", c->dim, c->moe_shared_dim,
         &l->w_up},
        {"ffn_down_shexp.weight", "mlp.shared_experts.down_proj.weight", c->moe_shared_dim,
         c->dim, &l->w_down},
    };
    for (size_t i = 0; i < sizeof sh / sizeof sh[0]; i++)
        if ((rc = load_weight(m, il, sh[i].g, sh[i].h, sh[i].in, sh[i].out, false, f32, sh[i].w,
                              err)))
            return rc;
    pgd__moe_add_shared(&l->moe, l, c->moe_shared_dim);
    l->moe.shared_inp = NULL; /* (not gated) */
    return PGD_OK;
}

/* ---- weights ---- */

/* *v (n) replaced by an owned copy of v + add. */
static int adjust_vec(pgd_model *m, const float **v, int64_t n, float add, pgd_err *err) {
    float *f = malloc((size_t)n * sizeof *f);
    int rc = pgd__own(m, f, err);
    if (rc) return rc;
    for (int64_t i = 0; i < n; i++) f[i] = (*v)[i] + add;
    *v = f;
    return PGD_OK;
}

/* Gemma's norms of layer l: HF checkpoints store each gain as its offset from 1 (llama.cpp's
 * converter adds the 1). */
static int gemma_norms(pgd_model *m, pgd_layer *l, pgd_err *err) {
    const pgd_model_config *c = &m->cfg;
    if (m->gguf.n_tensors) return PGD_OK;
    struct { const float **v; int64_t n; } ns[] = {
        {&l->attn_norm, c->dim}, {&l->ffn_norm, c->dim}, {&l->post_attn_norm, c->dim},
        {&l->post_ffn_norm, c->dim}, {&l->q_norm, c->head_dim}, {&l->k_norm, c->head_dim},
    };
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
        int rc = *ns[i].v ? adjust_vec(m, ns[i].v, ns[i].n, 1.0f, err) : PGD_OK;
        if (rc) return rc;
    }
    return PGD_OK;
}

static int load_weights(pgd_model *m, bool f32, pgd_err *err) {
    const pgd_model_config *c = &m->cfg;
    int64_t q_dim = (int64_t)c->n_head * c->head_dim, kv_dim = (int64_t)c->n_kv_head * c->head_dim;
    bool gemma = pgd__gemma_arch(c->arch);
    /* QK-norm gains: required there, absent elsewhere */
    bool qk = c->arch == PGD_ARCH_QWEN3 || c->arch == PGD_ARCH_GEMMA3;
    int rc;
    if ((rc = load_weight(m, -1, "token_embd.weight", "model.embed_tokens.weight", c->dim,
                          c->n_vocab, false, f32, &m->tok_embd, err)))
        return rc;
    /* (no LM head: tied embeddings, unless config.json says otherwise) */
    if ((rc = load_weight(m, -1, "output.weight", "lm_head.weight", c->dim, c->n_vocab,
                          !m->hf_untied, f32, &m->output, err)))
        return rc;
    if (!m->output.data) m->output = m->tok_embd; /* tied embeddings */
    if ((rc = load_vec(m, -1, "output_norm.weight", "model.norm.weight", c->dim, false,
                       &m->output_norm, err)))
        return rc;
    if (gemma && !m->gguf.n_tensors && /* (see gemma_norms) */
        (rc = adjust_vec(m, &m->output_norm, c->dim, 1.0f, err)))
        return rc;
    m->layers = calloc((size_t)c->n_layer, sizeof *m->layers);
    if (!m->layers) return pgd_err_set(err, PGD_ENOMEM, "%s: out of memory", m->path);
    for (int il = 0; il < c->n_layer; il++) {
        pgd_layer *l = &m->layers[il];
        struct { const char *g, *h; int64_t in, out; pgd_weight *w; } ws[] = {
            {"attn_q.weight", "self_attn.q_proj.weight", c->dim, q_dim, &l->wq},
            {"attn_k.weight", "self_attn.k_proj.weight", c->dim, kv_dim, &l->wk},
            {"attn_v.weight", "self_attn.v_proj.weight", c->dim, kv_dim, &l->wv},
            {"attn_output.weight", "self_attn.o_proj.weight", q_dim, c->dim, &l->wo},
            {"ffn_gate.weight", "mlp.gate_proj.weight", c->dim, c->ffn_dim, &l->w_gate},
            {"ffn_up.weight", "mlp.up_proj.weight", c->dim, c->ffn_dim, &l->w_up},
            {"ffn_down.weight", "mlp.down_proj.weight", c->ffn_dim, c->dim, &l->w_down},
        };
        /* an MoE layer has experts in place of the last three; a latent-attention layer its own
         * matrices in place of the first four (load_mla) and, DeepSeek, the first n_dense
         * layers are dense */
        bool moe = c->n_expert && il >= c->n_dense, mla = c->kv_lora_rank > 0;
        size_t n_ws = moe ? 4 : sizeof ws / sizeof ws[0];
        for (size_t i = mla ? 4 : 0; i < n_ws; i++)
            if ((rc = load_weight(m, il, ws[i].g, ws[i].h, ws[i].in, ws[i].out, false, f32, ws[i].w,
                                  err)))
                return rc;
        if (mla && (rc = load_mla(m, il, f32, l, err))) return rc;
        if (moe && (rc = load_experts(m, il, f32, l, err))) return rc;
        if (moe && c->arch == PGD_ARCH_DEEPSEEK2 && (rc = load_deepseek_moe(m, il, f32, l, err)))
            return rc;
        /* Gemma's post_attention_layernorm normalizes the attention's output; its FFN's input
         * norm is pre_feedforward_layernorm. */
        struct { const char *g, *h; int64_t n; bool opt; const float **dst; } vs[] = {
            {"attn_norm.weight", "input_layernorm.weight", c->dim, false, &l->attn_norm},
            {"ffn_norm.weight", gemma ? "pre_feedforward_layernorm.weight"
                                      : "post_attention_layernorm.weight", c->dim, false,
             &l->ffn_norm},
            {"attn_q.bias", "self_attn.q_proj.bias", q_dim, true, &l->bq},
            {"attn_k.bias", "self_attn.k_proj.bias", kv_dim, true, &l->bk},
            {"attn_v.bias", "self_attn.v_proj.bias", kv_dim, true, &l->bv},
            {"attn_q_norm.weight", "self_attn.q_norm.weight", c->head_dim, !qk, &l->q_norm},
            {"attn_k_norm.weight", "self_attn.k_norm.weight", c->head_dim, !qk, &l->k_norm},
            /* Gemma only (the last two) */
            {"post_attention_norm.weight", "post_attention_layernorm.weight", c->dim, false,
             &l->post_attn_norm},
            {"post_ffw_norm.weight", "post_feedforward_layernorm.weight", c->dim, false,
             &l->post_ffn_norm},
        };
        size_t n_vs = sizeof vs / sizeof vs[0] - (gemma ? 0 : 2);
        if (mla) n_vs = 2; /* (no q/k/v biases or QK-norm) */
        for (size_t i = 0; i < n_vs; i++)
            if ((rc = load_vec(m, il, vs[i].g, vs[i].h, vs[i].n, vs[i].opt, vs[i].dst, err)))
                return rc;
        if (gemma && (rc = gemma_norms(m, l, err))) return rc;
        if (!l->q_norm != !l->k_norm)
            return pgd_err_set(err, PGD_EFORMAT, "%s: layer %d has a %s norm but no %s norm",
                               m->path, il, l->q_norm ? "Q" : "K", l->q_norm ? "K" : "Q");
        l->no_rope = c->no_rope && c->no_rope[il];
        l->window = c->window ? c->window[il] : 0;
        l->local_rope = c->local_rope && c->local_rope[il];
    }
    /* llama.cpp stores Llama 3 rope scaling as per-frequency divisors. */
    int rh = (c->rope_dim ? c->rope_dim : c->head_dim) / 2; /* (rotated pairs) */
    if (m->gguf.n_tensors) {
        const float *ff;
        if ((rc = load_vec(m, -1, "rope_freqs.weight", "", rh, true, &ff, err)))
            return rc;
        if (ff && m->cfg.rope_freq_factors) { /* with linear scaling too: both apply (llama.cpp) */
            for (int i = 0; i < rh; i++) m->cfg.rope_freq_factors[i] *= ff[i];
        } else if (ff) {
            float *copy = malloc((size_t)rh * sizeof *copy);
            if ((rc = pgd__own(m, copy, err))) return rc;
            memcpy(copy, ff, (size_t)rh * sizeof *copy);
            m->cfg.rope_freq_factors = copy;
        }
    }
    return PGD_OK;
}

/* ---- placement: devices and tensor-parallel shards ---- */

static int track(pgd_shard *sh, void *p) {
    int rc = pgd_grow(&sh->mem, sh->n_mem, &sh->cap_mem, 64, sizeof *sh->mem);
    if (rc) return rc;
    sh->mem[sh->n_mem++] = p;
    return PGD_OK;
}

/* Puts bytes of host data where the shard's backend computes: the pointer itself on the CPU
 * (a tmp buffer becomes the model's), an uploaded copy on a device (a tmp buffer is freed). */
static int place(pgd_model *m, pgd_shard *sh, const void *host, size_t bytes, bool tmp,
                 const void **out, pgd_err *err) {
    pgd_backend *be = &sh->be;
    if (be->ops->host_memory) {
        *out = host;
        return tmp ? pgd__own(m, (void *)host, err) : PGD_OK;
    }
    void *d = be->ops->alloc(be, bytes);
    int rc = d ? track(sh, d) : PGD_ENOMEM;
    if (rc) {
        if (d) be->ops->mem_free(be, d);
        if (tmp) free((void *)host);
        return pgd_err_set(err, PGD_ENOMEM, "%s: out of %s memory for the weights of rank %d",
                           m->path, be->ops->name, sh->rank);
    }
    rc = be->ops->upload(be, d, host, bytes);
    if (tmp) free((void *)host);
    *out = d;
    return rc ? pgd_err_set(err, rc, "%s: upload to %s failed", m->path, be->ops->name) : PGD_OK;
}

/* The sub-matrix rows [r0, r0 + nr) x columns [c0, c0 + nc) of w. Row ranges are views; column
 * ranges on quantization-block boundaries copy whole blocks; others are dequantized to F32 (exact
 * weights, F32 activations: correct, slower). Types the backend cannot multiply become F32. */
static int shard_weight(pgd_model *m, pgd_shard *sh, const pgd_weight *w, int64_t r0, int64_t nr,
                        int64_t c0, int64_t nc, pgd_weight *out, pgd_err *err) {
    *out = *w;
    out->n_out = nr;
    out->n_in = nc;
    const char *src = (const char *)w->data + (size_t)r0 * w->row_bytes;
    uint32_t bel = pgd_type_block_elems(w->type), bb = pgd_type_block_bytes(w->type);
    bool f32 = !sh->be.ops->supports(PGD_OP_MATMUL, w->type) || bel == 0;
    if (!f32 && c0 == 0 && nc == w->n_in)
        return place(m, sh, src, (size_t)nr * w->row_bytes, false, &out->data, err);
    if (!f32 && c0 % bel == 0 && nc % bel == 0) {
        size_t off = (size_t)(c0 / bel) * bb, len = (size_t)(nc / bel) * bb;
        char *buf = malloc((size_t)nr * len + 1);
        if (!buf) return pgd_err_set(err, PGD_ENOMEM, "%s: out of memory", m->path);
        for (int64_t r = 0; r < nr; r++)
            memcpy(buf + (size_t)r * len, src + (size_t)r * w->row_bytes + off, len);
        out->row_bytes = len;
        return place(m, sh, buf, (size_t)nr * len, true, &out->data, err);
    }
    float *buf = malloc((size_t)nr * (size_t)nc * sizeof *buf + 1);
    float *row = malloc((size_t)w->n_in * sizeof *row);
    if (!buf || !row) {
        free(buf);
        free(row);
        return pgd_err_set(err, PGD_ENOMEM, "%s: out of memory", m->path);
    }
    for (int64_t r = 0; r < nr; r++) {
        pgd_dequantize_row(w->type, src + (size_t)r * w->row_bytes, row, w->n_in);
        memcpy(buf + (size_t)r * nc, row + c0, (size_t)nc * sizeof *buf);
    }
    free(row);
    out->type = PGD_TYPE_F32;
    out->row_bytes = (size_t)nc * sizeof(float);
    return place(m, sh, buf, (size_t)nr * (size_t)nc * sizeof(float), true, &out->data, err);
}

static int shard_vec(pgd_model *m, pgd_shard *sh, const float *v, int64_t off, int64_t n,
                     const float **out, pgd_err *err) {
    if (!v) {
        *out = NULL;
        return PGD_OK;
    }
    const void *p;
    int rc = place(m, sh, v + off, (size_t)n * sizeof *v, false, &p, err);
    *out = p;
    return rc;
}

/* A rank's experts: the router whole, each expert's FFN columns [moe_lo, moe_lo + moe_dim) as
 * a dense FFN's (gate and up by rows, down by columns). */
static int shard_experts(pgd_model *m, pgd_shard *sh, const pgd_layer *l, pgd_layer *d,
                         pgd_err *err) {
    const int64_t E = l->moe.n_expert, dim = m->cfg.dim;
    pgd_weight *ex = calloc(3 * (size_t)E, sizeof *ex);
    int rc = pgd__own(m, ex, err);
    if (rc || (rc = shard_weight(m, sh, &l->w_router, 0, E, 0, dim, &d->w_router, err)))
        return rc;
    for (int64_t e = 0; e < E; e++)
        if ((rc = shard_weight(m, sh, &l->moe.gate[e], sh->moe_lo, sh->moe_dim, 0, dim, &ex[e],
                               err)) ||
            (rc = shard_weight(m, sh, &l->moe.up[e], sh->moe_lo, sh->moe_dim, 0, dim, &ex[E + e],
                               err)) ||
            (rc = shard_weight(m, sh, &l->moe.down[e], 0, dim, sh->moe_lo, sh->moe_dim,
                               &ex[2 * E + e], err)))
            return rc;
    d->experts = ex;
    d->moe = pgd__experts_moe(&m->cfg, ex, sh->moe_dim);
    if (!l->moe.shared_gate) return PGD_OK;
    if ((rc = shard_weight(m, sh, &l->w_shared_inp, 0, 1, 0, dim, &d->w_shared_inp, err)))
        return rc;
    pgd__moe_add_shared(&d->moe, d, sh->ffn_dim);
    return PGD_OK;
}

static int build_shard(pgd_model *m, pgd_shard *sh, int rank, int n_ranks, pgd_err *err) {
    const pgd_model_config *c = &m->cfg;
    int hd = c->head_dim, rc;
    sh->rank = rank;
    sh->n_head = c->n_head / n_ranks;
    sh->n_kv_head = c->n_kv_head / n_ranks;
    /* FFN columns are split in whole quantization blocks of down_proj when they divide evenly. */
    int64_t unit = pgd_type_block_elems(m->layers[0].w_down.type);
    if (unit < 1 || c->ffn_dim % unit || c->ffn_dim / unit < n_ranks) unit = 1;
    long lo, hi;
    pgd_split_range(c->ffn_dim / unit, rank, n_ranks, &lo, &hi);
    sh->ffn_lo = (int32_t)(lo * unit);
    sh->ffn_dim = (int32_t)((hi - lo) * unit);
    if (c->n_expert) { /* each expert's columns alike (DeepSeek: the first expert layer's) */
        unit = pgd_type_block_elems(m->layers[c->n_dense].experts[2 * c->n_expert].type);
        if (unit < 1 || c->moe_ffn_dim % unit || c->moe_ffn_dim / unit < n_ranks) unit = 1;
        pgd_split_range(c->moe_ffn_dim / unit, rank, n_ranks, &lo, &hi);
        sh->moe_lo = (int32_t)(lo * unit);
        sh->moe_dim = (int32_t)((hi - lo) * unit);
    }
    pgd_split_range(c->n_vocab, rank, n_ranks, &lo, &hi);
    sh->vocab_lo = (int32_t)lo;
    sh->n_vocab = (int32_t)(hi - lo);
    if (n_ranks == 1 && sh->be.ops->host_memory) {
        /* The CPU multiplies every type the loader accepts: the model's weights serve as is. */
        sh->tok_embd = m->tok_embd;
        sh->output = m->output;
        sh->output_norm = m->output_norm;
        sh->layers = m->layers;
        return PGD_OK;
    }
    sh->layers = calloc((size_t)c->n_layer, sizeof *sh->layers);
    if (!sh->layers) return pgd_err_set(err, PGD_ENOMEM, "%s: out of memory", m->path);
    if ((rc = shard_weight(m, sh, &m->tok_embd, sh->vocab_lo, sh->n_vocab, 0, c->dim,
                           &sh->tok_embd, err)))
        return rc;
    if (m->output.data == m->tok_embd.data && m->output.type == m->tok_embd.type)
        sh->output = sh->tok_embd;
    else if ((rc = shard_weight(m, sh, &m->output, sh->vocab_lo, sh->n_vocab, 0, c->dim,
                                &sh->output, err)))
        return rc;
    if ((rc = shard_vec(m, sh, m->output_norm, 0, c->dim, &sh->output_norm, err))) return rc;
    int64_t q0 = (int64_t)rank * sh->n_head * hd, nq = (int64_t)sh->n_head * hd;
    int64_t k0 = (int64_t)rank * sh->n_kv_head * hd, nk = (int64_t)sh->n_kv_head * hd;
    for (int il = 0; il < c->n_layer; il++) {
        const pgd_layer *l = &m->layers[il];
        pgd_layer *d = &sh->layers[il];
        if ((rc = shard_weight(m, sh, &l->wq, q0, nq, 0, c->dim, &d->wq, err)) ||
            (rc = shard_weight(m, sh, &l->wk, k0, nk, 0, c->dim, &d->wk, err)) ||
            (rc = shard_weight(m, sh, &l->wv, k0, nk, 0, c->dim, &d->wv, err)) ||
            (rc = shard_weight(m, sh, &l->wo, 0, c->dim, q0, nq, &d->wo, err)) ||
            ((!l->moe.n_expert || l->moe.shared_gate) &&
             ((rc = shard_weight(m, sh, &l->w_gate, sh->ffn_lo, sh->ffn_dim, 0, c->dim,
                                 &d->w_gate, err)) ||
              (rc = shard_weight(m, sh, &l->w_up, sh->ffn_lo, sh->ffn_dim, 0, c->dim, &d->w_up,
                                 err)) ||
              (rc = shard_weight(m, sh, &l->w_down, 0, c->dim, sh->ffn_lo, sh->ffn_dim,
                                 &d->w_down, err)))) ||
            (rc = shard_vec(m, sh, l->attn_norm, 0, c->dim, &d->attn_norm, err)) ||
            (rc = shard_vec(m, sh, l->ffn_norm, 0, c->dim, &d->ffn_norm, err)) ||
            (rc = shard_vec(m, sh, l->bq, q0, nq, &d->bq, err)) ||
            (rc = shard_vec(m, sh, l->bk, k0, nk, &d->bk, err)) ||
            (rc = shard_vec(m, sh, l->bv, k0, nk, &d->bv, err)) ||
            (rc = shard_vec(m, sh, l->q_norm, 0, hd, &d->q_norm, err)) ||
            (rc = shard_vec(m, sh, l->k_norm, 0, hd, &d->k_norm, err)))
            return rc;
        d->no_rope = l->no_rope;
        d->window = l->window;
        d->local_rope = l->local_rope;
        if ((rc = shard_vec(m, sh, l->post_attn_norm, 0, c->dim, &d->post_attn_norm, err)) ||
            (rc = shard_vec(m, sh, l->post_ffn_norm, 0, c->dim, &d->post_ffn_norm, err)))
            return rc;
        if (l->moe.n_expert && (rc = shard_experts(m, sh, l, d, err))) return rc;
    }
    return PGD_OK;
}

int pgd_model_opts_set_device(pgd_model_opts *opts, const char *name) {
    if (!strcmp(name, "cpu")) opts->device = 1 + PGD_DEVICE_CPU;
    else if (!strcmp(name, "cuda")) opts->device = 1 + PGD_DEVICE_CUDA;
    else return PGD_EINVAL;
    return PGD_OK;
}

/* CPU, one rank: the matrices move from the file mapping into one anonymous mapping, those the
 * CPU multiplies in 16-row panels written so (pgd_cpu_pack), and the file mapping's pages are
 * released. The mapping is advised into transparent huge pages (2 MiB) where they are on:
 * decode streams every weight once per token; with 4 KiB pages each page costs a TLB walk (a
 * two-level one under a hypervisor) and the hardware prefetchers stop at every page boundary:
 * the 1.1B Q8_0 bench model decoded 15-20% faster this way (bench/RESULTS.md). Where THP is
 * off ("never") or PAGODA_HUGEPAGES=0, the same copy runs in 4 KiB pages: on the default model
 * the panels, not the pages, are the speed (decode 1.43x over row-major, huge pages 1.00x). If
 * the mapping fails the weights stay in the file, row-major. */
static void weights_to_own_mapping(pgd_model *m) {
    const pgd_model_config *c = &m->cfg;
    size_t n = 0, per_layer = PGD_LAYER_N_MATRICES + 5 + 3 * (size_t)c->n_expert;
    pgd_weight **ws = malloc((2 + (size_t)c->n_layer * per_layer) * sizeof *ws);
    if (!ws) return; /* the weights then stay in the file */
    ws[n++] = &m->tok_embd;
    if (m->output.data && m->output.data != m->tok_embd.data) ws[n++] = &m->output;
    for (int il = 0; il < c->n_layer; il++) {
        pgd_layer *l = &m->layers[il];
        pgd_weight *lw[] = PGD_LAYER_MATRICES(l);
        for (size_t i = 0; i < PGD_LAYER_N_MATRICES; i++)
            if (lw[i]->data) ws[n++] = lw[i];
        if (l->w_router.data) ws[n++] = &l->w_router;
        if (l->w_shared_inp.data) ws[n++] = &l->w_shared_inp;
        pgd_weight *mla[] = {&l->wq_a, &l->wq_b, &l->wkv_a};
        for (size_t i = 0; i < sizeof mla / sizeof mla[0]; i++)
            if (mla[i]->data) ws[n++] = mla[i];
        for (int i = 0; l->experts && i < 3 * l->moe.n_expert; i++) ws[n++] = &l->experts[i];
    }
    const size_t huge = (size_t)2 << 20;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) total += (ws[i]->row_bytes * (size_t)ws[i]->n_out + 63) / 64 * 64;
    size_t cap = total + huge;
    unsigned char *raw = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) {
        free(ws);
        return;
    }
    unsigned char *base = (unsigned char *)(((uintptr_t)raw + huge - 1) & ~(uintptr_t)(huge - 1));
    (void)pgd_advise_hugepages(base, total); /* a hint: without it the copy still works */
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        size_t bytes = ws[i]->row_bytes * (size_t)ws[i]->n_out;
        /* F16, Q8_0 and Q4_K matrices the CPU multiplies in panels of 16 rows are stored so (the
         * embedding table stays row-major: the token lookup reads its rows). */
        if (ws[i] != &m->tok_embd && pgd_cpu_can_pack(ws[i])) {
            pgd_cpu_pack(ws[i], base + off);
            ws[i]->panel16 = true;
        } else {
            memcpy(base + off, ws[i]->data, bytes);
        }
        if (ws[i] == &m->tok_embd && m->output.data == m->tok_embd.data)
            m->output.data = base + off;
        ws[i]->data = base + off;
        off += (bytes + 63) / 64 * 64;
    }
    free(ws);
    m->hp_map = raw;
    m->hp_bytes = cap;
    /* Pages of the file mapping that held the matrices are no longer ours to keep resident (a
     * private read-only mapping: anything still read through it faults back in from the file). */
    if (m->gguf.map.data)
        (void)madvise((void *)m->gguf.map.data, m->gguf.map.size, MADV_DONTNEED);
}

/* A window no shorter than the context changes nothing and is dropped. A backend without
 * windowed attention gets the context capped at the shortest window instead, within which full
 * attention is exact (said on stderr). */
static void settle_windows(pgd_model *m, const pgd_backend_ops *ops) {
    pgd_model_config *c = &m->cfg;
    if (!c->window) return;
    int32_t least = 0;
    for (int il = 0; il < c->n_layer; il++) {
        if (c->window[il] >= c->n_ctx) c->window[il] = 0;
        if (c->window[il] && (!least || c->window[il] < least)) least = c->window[il];
    }
    if (least && !ops->supports(PGD_OP_WINDOW, PGD_TYPE_F32)) {
        fprintf(stderr, "pagoda: %s: the %s backend has no sliding-window attention; context "
                "capped at the %d-token window\n", m->path, ops->name, least);
        c->n_ctx = least;
        memset(c->window, 0, (size_t)c->n_layer * sizeof *c->window);
    }
    for (int il = 0; il < c->n_layer; il++) m->layers[il].window = c->window[il];
}

static int place_model(pgd_model *m, const pgd_model_opts *opts, pgd_err *err) {
    const pgd_model_config *c = &m->cfg;
    pgd_model_opts o = *opts; /* (PAGODA_DEVICE and the like are the options table's) */
    int tp = o.tensor_parallel ? o.tensor_parallel : 1;
    const pgd_backend_ops *ops = &pgd_cpu_backend_ops;
    m->device = PGD_DEVICE_CPU;
    if (o.device == 1 + PGD_DEVICE_CUDA) {
        if (!pgd_cuda_backend_ops())
            return pgd_err_set(err, PGD_EUNSUPPORTED, "--device cuda: this build has no CUDA "
                               "backend (configure with -DPAGODA_CUDA=ON)");
        int n_dev = pgd_cuda_device_count();
        if (n_dev == 0) {
            fprintf(stderr, "pagoda: no CUDA device; using the CPU backend\n");
        } else if (tp > n_dev) {
            return pgd_err_set(err, PGD_EINVAL, "--tensor-parallel-size %d: only %d CUDA "
                               "device(s)", tp, n_dev);
        } else {
            ops = pgd_cuda_backend_ops();
            m->device = PGD_DEVICE_CUDA;
        }
    }
    if (tp < 1 || tp > PGD_MAX_TP)
        return pgd_err_set(err, PGD_EINVAL, "--tensor-parallel-size %d: must be 1..%d", tp,
                           PGD_MAX_TP);
    if (c->kv_lora_rank && (!ops->supports(PGD_OP_MLA, PGD_TYPE_F32) || tp != 1))
        return pgd_err_set(err, PGD_EUNSUPPORTED, "%s: latent attention (DeepSeek) runs on the "
                           "CPU backend with one rank only (--device cpu, no tensor parallel), "
                           "not on %s with %d ranks", m->path, ops->name, tp);
    if (c->n_head % tp || c->n_kv_head % tp)
        return pgd_err_set(err, PGD_EINVAL, "--tensor-parallel-size %d does not divide the %d "
                           "attention heads and %d KV heads of %s", tp, c->n_head, c->n_kv_head,
                           m->path);
    if (c->ffn_dim < tp || c->n_vocab < tp || (c->n_expert && c->moe_ffn_dim < tp))
        return pgd_err_set(err, PGD_EINVAL, "--tensor-parallel-size %d: model too small", tp);
    if (c->n_expert && !ops->supports(PGD_OP_MOE, PGD_TYPE_F32))
        return pgd_err_set(err, PGD_EUNSUPPORTED, "%s: mixture-of-experts models run on the CPU "
                           "backend only (--device cpu), not on %s", m->path, ops->name);
    if (pgd__gemma_arch(c->arch) && !(ops->supports(PGD_OP_GELU_GATE, PGD_TYPE_F32) &&
                                 ops->supports(PGD_OP_SCALE, PGD_TYPE_F32) &&
                                 ops->supports(PGD_OP_LOCAL_ROPE, PGD_TYPE_F32) &&
                                 ops->supports(PGD_OP_SOFTCAP, PGD_TYPE_F32)))
        return pgd_err_set(err, PGD_EUNSUPPORTED, "%s: Gemma models run on the CPU backend only "
                           "(--device cpu), not on %s", m->path, ops->name);
    if (c->attn_scale && !ops->supports(PGD_OP_ATTN_SCALE, PGD_TYPE_F32))
        return pgd_err_set(err, PGD_EUNSUPPORTED, "%s: YaRN rope scaling runs on the CPU backend "
                           "only (--device cpu), not on %s", m->path, ops->name);
    settle_windows(m, ops);
    /* (a dummy model's weights all view one buffer, which the caches would serve: the copy
     * gives each its pgd__own bytes, so CPU benchmarks read as much memory as a real model) */
    if (ops == &pgd_cpu_backend_ops && tp == 1 && !o.weights_f32) weights_to_own_mapping(m);
    m->shards = calloc((size_t)tp, sizeof *m->shards);
    if (!m->shards) return pgd_err_set(err, PGD_ENOMEM, "%s: out of memory", m->path);
    m->n_ranks = tp;
    for (int r = 0; r < tp; r++) {
        m->shards[r].be.ops = ops;
        m->shards[r].be.device = r;
        int rc = build_shard(m, &m->shards[r], r, tp, err);
        if (rc) return rc;
    }
    float util = o.gpu_memory_utilization > 0 ? o.gpu_memory_utilization : 0.9f;
    for (int r = 0; r < tp && ops->mem_info; r++) {
        size_t free_b, total;
        if (ops->mem_info(&m->shards[r].be, &free_b, &total)) continue; /* reported already */
        if ((double)(total - free_b) > (double)util * (double)total)
            return pgd_err_set(err, PGD_ENOMEM, "%s: GPU %d holds %.2f GiB with the weights "
                               "loaded, more than --gpu-memory-utilization %.2f of its %.2f GiB",
                               m->path, r, (double)(total - free_b) / 1073741824.0, util,
                               (double)total / 1073741824.0);
    }
    return PGD_OK;
}

/* Where a multimodal checkpoint keeps its text model: "language_model.model." and
 * "language_model.lm_head" as released (transformers 4), "model.language_model." and "lm_head"
 * as transformers 5 saves it. */
static int find_text_model(pgd_model *m, const char *dir, pgd_err *err) {
    static const char *const layouts[][2] = {
        {"language_model.model.", "language_model.lm_head.weight"},
        {"model.language_model.", "lm_head.weight"},
    };
    for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++) {
        char name[128];
        snprintf(name, sizeof name, "%sembed_tokens.weight", layouts[i][0]);
        if (!pgd_st_find(&m->st, name)) continue;
        m->hf_prefix = layouts[i][0];
        m->hf_head = layouts[i][1];
        return PGD_OK;
    }
    return pgd_err_set(err, PGD_EFORMAT, "%s: no language model weights (language_model.model.* "
                       "or model.language_model.*)", dir);
}

static bool is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

int pgd_model_load(const char *path, const pgd_model_opts *opts, pgd_model **out, pgd_err *err) {
    *out = NULL;
    pgd_model_opts dflt = {0};
    if (!opts) opts = &dflt;
    pgd_model *m = calloc(1, sizeof *m);
    if (!m) return pgd_err_set(err, PGD_ENOMEM, "%s: out of memory", path);
    m->path = strdup(path);
    m->cfg.bos_id = -1;
    int rc;
    if (!m->path) {
        rc = pgd_err_set(err, PGD_ENOMEM, "%s: out of memory", path);
        goto fail;
    }
    if (opts->load_format == PGD_LOAD_DUMMY) {
        if ((rc = pgd__load_dummy(m, opts, err)) || (rc = place_model(m, opts, err))) goto fail;
        *out = m;
        return PGD_OK;
    }
    if (is_dir(path)) {
        char tj[PATH_MAX], tc[PATH_MAX];
        if ((rc = pgd__hf_config(m, path, err))) goto fail;
        if ((rc = pgd_st_open_dir(&m->st, path, err))) goto fail;
        if (m->hf_wrapped && (rc = find_text_model(m, path, err))) goto fail;
        snprintf(tj, sizeof tj, "%s/tokenizer.json", path);
        snprintf(tc, sizeof tc, "%s/tokenizer_config.json", path);
        struct stat st;
        if (stat(tj, &st) != 0) {
            rc = pgd_err_set(err, PGD_ENOENT, "%s: missing tokenizer (tokenizer.json)", path);
            goto fail;
        }
        if ((rc = pgd_tokenizer_load_hf(tj, stat(tc, &st) == 0 ? tc : NULL, &m->tok, err)))
            goto fail;
    } else {
        if ((rc = pgd_gguf_open(&m->gguf, m->path, err))) goto fail;
        if ((rc = pgd__gguf_config(m, err))) goto fail;
        if (!pgd_gguf_find(&m->gguf, "tokenizer.ggml.tokens")) {
            rc = pgd_err_set(err, PGD_EFORMAT, "%s: missing tokenizer (no tokenizer.ggml.tokens)",
                             path);
            goto fail;
        }
        if ((rc = pgd_tokenizer_load_gguf(&m->gguf, &m->tok, err))) goto fail;
    }
    if (opts->n_ctx > 0 && opts->n_ctx < m->cfg.n_ctx) m->cfg.n_ctx = opts->n_ctx;
    if ((rc = load_weights(m, opts->weights_f32, err))) goto fail;
    if (pgd_tokenizer_n_vocab(m->tok) > m->cfg.n_vocab) {
        rc = pgd_err_set(err, PGD_EFORMAT, "%s: tokenizer has %d tokens but the model only %d",
                         path, pgd_tokenizer_n_vocab(m->tok), m->cfg.n_vocab);
        goto fail;
    }
    if ((rc = place_model(m, opts, err))) goto fail;
    *out = m;
    return PGD_OK;
fail:
    pgd_model_free(m);
    return rc;
}

void pgd_model_free(pgd_model *m) {
    if (!m) return;
    for (int r = 0; m->shards && r < m->n_ranks; r++) {
        pgd_shard *sh = &m->shards[r];
        for (size_t i = 0; i < sh->n_mem; i++) sh->be.ops->mem_free(&sh->be, sh->mem[i]);
        free(sh->mem);
        if (sh->layers != m->layers) free(sh->layers);
    }
    free(m->shards);
    for (size_t i = 0; i < m->n_owned; i++) free(m->owned[i]);
    if (m->hp_map) munmap(m->hp_map, m->hp_bytes);
    free(m->owned);
    free(m->layers);
    if (m->tok) pgd_tokenizer_free(m->tok);
    pgd_gguf_close(&m->gguf);
    pgd_st_close(&m->st);
    free(m->path);
    free(m);
}
