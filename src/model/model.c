/* Model loading: GGUF files and Hugging Face directories (config.json + safetensors +
 * tokenizer.json) for the Llama family and Qwen2. Weights stay in the file mappings unless they
 * must be converted (F16/BF16 norms, misaligned data, --weights-f32). */
#include "model/model.h"

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

static int own(pgd_model *m, void *p, pgd_err *err) {
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
        int rc = own(m, f, err);
        if (rc) return rc;
        for (int64_t r = 0; r < n_out; r++)
            pgd_dequantize_row(t.type, (const char *)t.data + r * w->row_bytes, f + r * n_in, n_in);
        w->type = PGD_TYPE_F32;
        w->row_bytes = (size_t)n_in * sizeof(float);
        w->data = f;
    } else if (misaligned) {
        void *c = malloc(t.nbytes);
        int rc = own(m, c, err);
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
static void moe_add_shared(pgd_moe *moe, const pgd_layer *l, int32_t ffn_dim) {
    moe->shared_ffn_dim = ffn_dim;
    moe->shared_gate = &l->w_gate;
    moe->shared_up = &l->w_up;
    moe->shared_down = &l->w_down;
    moe->shared_inp = &l->w_shared_inp;
}

/* The moe op's view of experts ex (gate, up, down matrices) of ffn_dim columns each. */
static pgd_moe experts_moe(const pgd_model_config *c, const pgd_weight *ex, int32_t ffn_dim) {
    const int32_t E = c->n_expert;
    return (pgd_moe){.n_expert = E, .n_used = c->n_expert_used, .ffn_dim = ffn_dim,
                     .norm = c->moe_norm, .gate = ex, .up = ex + E, .down = ex + 2 * E};
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
    int rc = own(m, ex, err);
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
    l->moe = experts_moe(c, ex, F);
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
    moe_add_shared(&l->moe, l, c->ffn_dim);
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
    int rc = own(m, f, err);
    if (rc) return rc;
    if (t.type == PGD_TYPE_F32) memcpy(f, t.data, (size_t)n * sizeof *f);
    else pgd_dequantize_row(t.type, t.data, f, n);
    *out = f;
    return PGD_OK;
}

/* ---- configuration ---- */

#define PGD_MODEL_MAX_CTX (1 << 26) /* 67M positions: past every model's context (10M at most) */

static int check_config(pgd_model *m, pgd_err *err) {
    pgd_model_config *c = &m->cfg;
    if (c->n_vocab <= 0 || c->dim <= 0 || c->n_layer <= 0 || c->n_head <= 0 ||
        c->n_kv_head <= 0 || c->head_dim <= 0 || c->ffn_dim <= 0 || c->n_ctx <= 0 ||
        c->dim > (1 << 20) || c->n_layer > 4096 || c->n_vocab > (1 << 24) || c->head_dim > 4096 ||
        c->ffn_dim > (1 << 22) || c->n_head > 4096)
        return pgd_err_set(err, PGD_EFORMAT, "%s: invalid model dimensions", m->path);
    if (c->n_ctx > PGD_MODEL_MAX_CTX) /* block counts and positions stay in int32 */
        return pgd_err_set(err, PGD_EFORMAT, "%s: context length %d is past the %d Pagoda takes",
                           m->path, c->n_ctx, PGD_MODEL_MAX_CTX);
    if (c->n_head % c->n_kv_head)
        return pgd_err_set(err, PGD_EFORMAT, "%s: %d attention heads is not a multiple of %d KV "
                           "heads", m->path, c->n_head, c->n_kv_head);
    if (c->head_dim % 2)
        return pgd_err_set(err, PGD_EFORMAT, "%s: odd head dimension %d", m->path, c->head_dim);
    if (!(c->rms_eps > 0) || !(c->rope_theta > 0))
        return pgd_err_set(err, PGD_EFORMAT, "%s: invalid norm epsilon or rope theta", m->path);
    if (c->n_expert && (c->n_expert > 1024 || c->n_expert_used < 1 ||
                        c->n_expert_used > c->n_expert || c->moe_ffn_dim <= 0 ||
                        c->moe_ffn_dim > (1 << 22)))
        return pgd_err_set(err, PGD_EFORMAT, "%s: invalid experts (%d of %d, %d wide)", m->path,
                           c->n_expert_used, c->n_expert, c->moe_ffn_dim);
    return PGD_OK;
}

/* NoPE layers every `step` layers: layer il applies no RoPE when (il + 1) % step == 0, as
 * transformers' SmolLM3Config derives no_rope_layers from no_rope_layer_interval and llama.cpp
 * hard-codes for smollm3 GGUF files (step 4; the files carry no key for it). */
static int no_rope_every(pgd_model *m, int32_t step, pgd_err *err) {
    bool *nr = calloc((size_t)m->cfg.n_layer, sizeof *nr);
    int rc = own(m, nr, err);
    if (rc) return rc;
    for (int il = 0; il < m->cfg.n_layer; il++) nr[il] = step > 0 && (il + 1) % step == 0;
    m->cfg.no_rope = nr;
    return PGD_OK;
}

static int linear_factors(pgd_model *m, double factor, pgd_err *err);
static bool gemma_arch(pgd_arch a) { return a == PGD_ARCH_GEMMA2 || a == PGD_ARCH_GEMMA3; }
static int yarn_factors(pgd_model *m, double factor, double orig_ctx, double beta_fast,
                        double beta_slow, double attn_factor);
static int gemma_config(pgd_model *m, double q_scalar, double theta_local, double attn_cap,
                        double final_cap, const char *path, pgd_err *err);

/* <arch>.rope.scaling.type "linear" with its factor (Gemma 3 4B and up, some Llama fine-tunes):
 * every frequency divided by the factor, as llama.cpp reads it. Other types are refused; "none"
 * or no key is no scaling. */
static int gguf_rope_scaling(pgd_model *m, const char *a, pgd_err *err) {
    char key[128];
    pgd_str type;
    snprintf(key, sizeof key, "%s.rope.scaling.type", a);
    if (!pgd_gguf_find(&m->gguf, key)) return PGD_OK;
    if (pgd_gguf_get_str(&m->gguf, key, &type))
        return pgd_err_set(err, PGD_EFORMAT, "%s: invalid metadata %s", m->path, key);
    if (pgd_str_eq(type, "none")) return PGD_OK;
    if (pgd_str_eq(type, "yarn")) { /* (llama.cpp's keys; beta 32 and 1 unless they say) */
        float factor = 0, fast = 32, slow = 1, af = 0;
        uint32_t orig = 0;
        snprintf(key, sizeof key, "%s.rope.scaling.factor", a);
        int bad = pgd_gguf_get_f32(&m->gguf, key, &factor);
        snprintf(key, sizeof key, "%s.rope.scaling.original_context_length", a);
        bad |= pgd_gguf_get_u32(&m->gguf, key, &orig);
        const char *opt[] = {"yarn_beta_fast", "yarn_beta_slow", "attn_factor"};
        float *dst[] = {&fast, &slow, &af};
        for (int i = 0; i < 3; i++) {
            snprintf(key, sizeof key, "%s.rope.scaling.%s", a, opt[i]);
            if (pgd_gguf_find(&m->gguf, key)) bad |= pgd_gguf_get_f32(&m->gguf, key, dst[i]);
        }
        if (bad || yarn_factors(m, factor, orig, fast, slow, af))
            return pgd_err_set(err, PGD_EFORMAT, "%s: missing or invalid yarn metadata "
                               "(%s.rope.scaling.*)", m->path, a);
        return PGD_OK;
    }
    if (!pgd_str_eq(type, "linear")) {
        pgd_name_buf nb;
        return pgd_err_set(err, PGD_EUNSUPPORTED, "%s: unsupported rope scaling type '%s'",
                           m->path, pgd_str_safe(type, &nb));
    }
    float factor = 0;
    snprintf(key, sizeof key, "%s.rope.scaling.factor", a);
    if (pgd_gguf_get_f32(&m->gguf, key, &factor) || !(factor > 0 && factor <= FLT_MAX))
        return pgd_err_set(err, PGD_EFORMAT, "%s: missing or invalid metadata %s", m->path, key);
    return factor == 1.0f ? PGD_OK : linear_factors(m, factor, err);
}

static int gguf_config(pgd_model *m, pgd_err *err) {
    pgd_gguf *g = &m->gguf;
    pgd_str arch;
    if (pgd_gguf_get_str(g, "general.architecture", &arch))
        return pgd_err_set(err, PGD_EFORMAT, "%s: no general.architecture in metadata", m->path);
    char a[32];
    /* llama.cpp's converter permutes the Q/K rows of llama-like files for adjacent-pair rope
     * (smollm3 is converted as llama); Qwen files keep transformers' halves. */
    if (pgd_str_eq(arch, "llama") || pgd_str_eq(arch, "mistral")) {
        m->cfg.arch = PGD_ARCH_LLAMA;
        m->cfg.rope_mode = PGD_ROPE_NORM;
    } else if (pgd_str_eq(arch, "smollm3")) {
        m->cfg.arch = PGD_ARCH_SMOLLM3;
        m->cfg.rope_mode = PGD_ROPE_NORM;
    } else if (pgd_str_eq(arch, "qwen2") || pgd_str_eq(arch, "qwen3") ||
               pgd_str_eq(arch, "qwen2moe") || pgd_str_eq(arch, "qwen3moe")) {
        m->cfg.arch = pgd_str_eq(arch, "qwen2") || pgd_str_eq(arch, "qwen2moe") ? PGD_ARCH_QWEN2
                                                                               : PGD_ARCH_QWEN3;
        m->cfg.rope_mode = PGD_ROPE_NEOX;
    } else if (pgd_str_eq(arch, "gemma2") || pgd_str_eq(arch, "gemma3")) { /* (unpermuted) */
        m->cfg.arch = pgd_str_eq(arch, "gemma2") ? PGD_ARCH_GEMMA2 : PGD_ARCH_GEMMA3;
        m->cfg.rope_mode = PGD_ROPE_NEOX;
    } else {
        pgd_name_buf nb;
        return pgd_err_set(err, PGD_EUNSUPPORTED, "%s: unsupported architecture '%s' (llama, "
                           "mistral, qwen2, qwen2moe, qwen3, qwen3moe, smollm3, gemma2 and "
                           "gemma3 are)",
                           m->path, pgd_str_safe(arch, &nb));
    }
    snprintf(a, sizeof a, "%.*s", (int)arch.len, arch.ptr);
    struct { const char *suffix; int32_t *dst; bool required; } keys[] = {
        {"embedding_length", &m->cfg.dim, true},
        {"block_count", &m->cfg.n_layer, true},
        {"feed_forward_length", &m->cfg.ffn_dim, true},
        {"attention.head_count", &m->cfg.n_head, true},
        {"attention.head_count_kv", &m->cfg.n_kv_head, false},
        {"context_length", &m->cfg.n_ctx, true},
        {"attention.key_length", &m->cfg.head_dim, false},
        {"vocab_size", &m->cfg.n_vocab, false},
        {"expert_count", &m->cfg.n_expert, false},
        {"expert_used_count", &m->cfg.n_expert_used, false},
        {"expert_feed_forward_length", &m->cfg.moe_ffn_dim, false},
    };
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        char key[128];
        snprintf(key, sizeof key, "%s.%s", a, keys[i].suffix);
        uint32_t v;
        int rc = pgd_gguf_get_u32(g, key, &v);
        if (rc == PGD_ENOENT && !keys[i].required) continue;
        if (rc || v > INT32_MAX)
            return pgd_err_set(err, PGD_EFORMAT, "%s: %s %s", m->path,
                               rc == PGD_ENOENT ? "missing metadata" : "invalid metadata", key);
        *keys[i].dst = (int32_t)v;
    }
    if (!m->cfg.n_kv_head) m->cfg.n_kv_head = m->cfg.n_head;
    if (!m->cfg.head_dim && m->cfg.n_head) m->cfg.head_dim = m->cfg.dim / m->cfg.n_head;
    char key[128];
    bool qwen2moe = pgd_str_eq(arch, "qwen2moe");
    if ((qwen2moe || pgd_str_eq(arch, "qwen3moe")) && !m->cfg.n_expert)
        return pgd_err_set(err, PGD_EFORMAT, "%s: missing metadata %s.expert_count", m->path, a);
    if (m->cfg.n_expert) {
        /* Mixtral's experts (llama files) are as wide as feed_forward_length says; llama.cpp
         * rescales the chosen experts' weights for llama and qwen3moe unless told otherwise,
         * not for qwen2moe, whose shared expert is expert_shared_feed_forward_length wide
         * (feed_forward_length without that key, as llama.cpp reads it). */
        if (!m->cfg.moe_ffn_dim) m->cfg.moe_ffn_dim = m->cfg.ffn_dim;
        m->cfg.moe_norm = !qwen2moe;
        m->cfg.moe_shared = qwen2moe;
        snprintf(key, sizeof key, "%s.expert_shared_feed_forward_length", a);
        uint32_t v;
        if (qwen2moe && !pgd_gguf_get_u32(g, key, &v) && v > 0 && v <= INT32_MAX)
            m->cfg.ffn_dim = (int32_t)v;
        snprintf(key, sizeof key, "%s.expert_weights_norm", a);
        pgd_gguf_get_bool(g, key, &m->cfg.moe_norm);
    }
    snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", a);
    if (pgd_gguf_get_f32(g, key, &m->cfg.rms_eps))
        return pgd_err_set(err, PGD_EFORMAT, "%s: missing metadata %s", m->path, key);
    snprintf(key, sizeof key, "%s.rope.freq_base", a);
    m->cfg.rope_theta = 10000.0f;
    pgd_gguf_get_f32(g, key, &m->cfg.rope_theta);
    if (!m->cfg.n_vocab) {
        const pgd_gguf_tensor *te = pgd_gguf_find_tensor(g, "token_embd.weight");
        if (te && te->ne[1] <= INT32_MAX) m->cfg.n_vocab = (int32_t)te->ne[1];
    }
    int rc = check_config(m, err);
    if (!rc && m->cfg.arch == PGD_ARCH_SMOLLM3) rc = no_rope_every(m, 4, err);
    if (!rc) rc = gguf_rope_scaling(m, a, err);
    /* A Mistral v0.1 file may name its window (llama.cpp's converter does not write it); a
     * Gemma file must. Gemma 3 windows all layers but every sixth, Gemma 2 every other one
     * (from the first), as llama.cpp hard-codes. */
    bool gemma = gemma_arch(m->cfg.arch);
    int pattern = m->cfg.arch == PGD_ARCH_GEMMA2 ? 2 : 6;
    snprintf(key, sizeof key, "%s.attention.sliding_window", a);
    uint32_t sw = 0;
    if (!rc && gemma && (pgd_gguf_get_u32(g, key, &sw) || sw == 0 || sw > INT32_MAX))
        return pgd_err_set(err, PGD_EFORMAT, "%s: missing or invalid metadata %s", m->path, key);
    if (!rc && (m->cfg.arch == PGD_ARCH_LLAMA || gemma) && !pgd_gguf_get_u32(g, key, &sw) &&
        sw > 0 && sw <= INT32_MAX) {
        int32_t *w = calloc((size_t)m->cfg.n_layer, sizeof *w);
        if (!(rc = own(m, w, err))) {
            for (int il = 0; il < m->cfg.n_layer; il++)
                w[il] = !gemma || (il + 1) % pattern ? (int32_t)sw : 0;
            m->cfg.window = w;
        }
    }
    /* llama.cpp scales the 27B models' attention (Gemma 2: 46 layers, Gemma 3: 62) by
     * (dim / n_head)^-1/2, the others' by head_dim^-1/2: query_pre_attn_scalar, which the files
     * do not carry; Gemma 3's sliding layers' RoPE base is 10,000. Gemma 2's soft-capping is
     * in the metadata. */
    if (!rc && gemma) {
        bool big = m->cfg.n_layer == (m->cfg.arch == PGD_ARCH_GEMMA2 ? 46 : 62);
        float caps[2] = {0, 0};
        const char *cap_keys[2] = {"attn_logit_softcapping", "final_logit_softcapping"};
        for (int i = 0; i < 2 && m->cfg.arch == PGD_ARCH_GEMMA2; i++) {
            snprintf(key, sizeof key, "%s.%s", a, cap_keys[i]);
            if (pgd_gguf_get_f32(g, key, &caps[i]) || !(caps[i] > 0 && caps[i] <= FLT_MAX))
                return pgd_err_set(err, PGD_EFORMAT, "%s: missing or invalid metadata %s",
                                   m->path, key);
        }
        rc = gemma_config(m, big ? (double)m->cfg.dim / m->cfg.n_head : (double)m->cfg.head_dim,
                          m->cfg.arch == PGD_ARCH_GEMMA3 ? 10000.0 : 0, caps[0], caps[1],
                          m->path, err);
    }
    return rc;
}

static double json_num(const cJSON *o, const char *key, double dflt) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(x) ? x->valuedouble : dflt;
}

static int json_int(const cJSON *o, const char *key, int32_t dflt, int32_t *out) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!x || cJSON_IsNull(x)) {
        *out = dflt;
        return PGD_OK;
    }
    if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble > INT32_MAX ||
        x->valuedouble != (double)(int64_t)x->valuedouble)
        return PGD_EFORMAT;
    *out = (int32_t)x->valuedouble;
    return PGD_OK;
}

/* Llama 3 rope scaling as transformers computes it, expressed as per-frequency divisors (the
 * form llama.cpp stores in rope_freqs.weight). */
static int llama3_factors(pgd_model *m, const cJSON *rs, pgd_err *err) {
    double factor = json_num(rs, "factor", 8), lo = json_num(rs, "low_freq_factor", 1);
    double hi = json_num(rs, "high_freq_factor", 4);
    double old_ctx = json_num(rs, "original_max_position_embeddings", 8192);
    if (!(factor > 0) || !(lo > 0) || !(hi > lo) || !(old_ctx > 0))
        return pgd_err_set(err, PGD_EFORMAT, "%s/config.json: invalid llama3 rope_scaling", m->path);
    int n = m->cfg.head_dim / 2;
    float *f = malloc((size_t)n * sizeof *f);
    int rc = own(m, f, err);
    if (rc) return rc;
    double lo_wavelen = old_ctx / lo, hi_wavelen = old_ctx / hi;
    for (int i = 0; i < n; i++) {
        float inv = 1.0f / powf(m->cfg.rope_theta, (float)(2 * i) / (float)m->cfg.head_dim);
        double wavelen = 2 * M_PI / inv;
        if (wavelen < hi_wavelen) f[i] = 1.0f;
        else if (wavelen > lo_wavelen) f[i] = (float)factor;
        else {
            double smooth = (old_ctx / wavelen - lo) / (hi - lo);
            f[i] = (float)(1.0 / ((1 - smooth) / factor + smooth));
        }
    }
    m->cfg.rope_freq_factors = f;
    return PGD_OK;
}

/* YaRN, as transformers' _compute_yarn_parameters (truncated correction range) and llama.cpp's
 * rope_yarn compute it: frequency i is interpolated (divided by factor) below the dimension
 * where a wavelength spans beta_slow rotations over the original context, extrapolated (kept)
 * above the one where it spans beta_fast, ramped linearly between; cos and sin are multiplied by
 * the attention factor (attn_factor, or 0.1 ln(factor) + 1 when attn_factor is 0), which here
 * scales the attention scores by its square instead (cfg.attn_scale). Returns PGD_EFORMAT for
 * invalid parameters (the caller names them). */
static int yarn_factors(pgd_model *m, double factor, double orig_ctx, double beta_fast,
                        double beta_slow, double attn_factor) {
    pgd_model_config *c = &m->cfg;
    if (!(factor >= 1 && factor <= 1e6) || !(orig_ctx >= 1 && orig_ctx <= 1e9) ||
        !(beta_fast > 0 && beta_fast <= 1e6) || !(beta_slow > 0 && beta_slow <= 1e6) ||
        !(attn_factor >= 0 && attn_factor <= 1e3) || !(c->rope_theta > 1))
        return PGD_EFORMAT;
    int n = c->head_dim / 2, dim = c->head_dim;
    double base = c->rope_theta;
    /* the dimension (of dim) where a wavelength spans r rotations over orig_ctx positions */
#define YARN_DIM(r) ((double)dim * log(orig_ctx / ((r) * 6.283185307179586)) / (2 * log(base)))
    double lo = floor(YARN_DIM(beta_fast)), hi = ceil(YARN_DIM(beta_slow));
#undef YARN_DIM
    if (lo < 0) lo = 0;
    if (hi > dim - 1) hi = dim - 1;
    if (lo == hi) hi += 0.001;
    float *f = malloc((size_t)n * sizeof *f);
    int rc = own(m, f, NULL);
    if (rc) return rc;
    for (int i = 0; i < n; i++) {
        double ramp = ((double)i - lo) / (hi - lo);
        double ext = 1 - (ramp < 0 ? 0 : ramp > 1 ? 1 : ramp); /* extrapolated share */
        f[i] = (float)(1.0 / ((1.0 / factor) * (1 - ext) + ext));
    }
    c->rope_freq_factors = f;
    double af = attn_factor > 0 ? attn_factor : factor <= 1 ? 1.0 : 0.1 * log(factor) + 1.0;
    double scale = c->attn_scale > 0 ? c->attn_scale : 1.0 / sqrt((double)c->head_dim);
    c->attn_scale = (float)(scale * af * af);
    return PGD_OK;
}

static int linear_factors(pgd_model *m, double factor, pgd_err *err) {
    if (!(factor > 0))
        return pgd_err_set(err, PGD_EFORMAT, "%s/config.json: invalid rope scaling factor", m->path);
    int n = m->cfg.head_dim / 2;
    float *f = malloc((size_t)n * sizeof *f);
    int rc = own(m, f, err);
    if (rc) return rc;
    for (int i = 0; i < n; i++) f[i] = (float)factor;
    m->cfg.rope_freq_factors = f;
    return PGD_OK;
}

/* SmolLM3's no_rope_layers: one flag per layer, 1 where the layer applies RoPE (transformers'
 * name says the opposite); without it, a NoPE layer every no_rope_layer_interval layers. */
static int smollm3_no_rope(pgd_model *m, const cJSON *c, const char *path, pgd_err *err) {
    const cJSON *nr = cJSON_GetObjectItemCaseSensitive(c, "no_rope_layers");
    if (!nr || cJSON_IsNull(nr)) {
        int32_t step;
        if (json_int(c, "no_rope_layer_interval", 4, &step) || step < 1)
            return pgd_err_set(err, PGD_EFORMAT, "%s: invalid no_rope_layer_interval", path);
        return no_rope_every(m, step, err);
    }
    if (!cJSON_IsArray(nr) || cJSON_GetArraySize(nr) != m->cfg.n_layer)
        return pgd_err_set(err, PGD_EFORMAT, "%s: no_rope_layers must list %d flags", path,
                           m->cfg.n_layer);
    int rc = no_rope_every(m, 0, err);
    if (rc) return rc;
    int il = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, nr) {
        if (!cJSON_IsNumber(x) || (x->valuedouble != 0 && x->valuedouble != 1))
            return pgd_err_set(err, PGD_EFORMAT, "%s: no_rope_layers holds a value other than 0 "
                               "or 1", path);
        m->cfg.no_rope[il++] = x->valuedouble == 0;
    }
    return PGD_OK;
}

/* Sliding-window attention as transformers applies it. Mistral and Mixtral window every layer when
 * sliding_window is set (Mistral: 4096 without the key, as MistralConfig; a mistral config with
 * layer_types follows it, as transformers reads Ministral's). The Qwen family and SmolLM3 window
 * only with use_sliding_window, on the layers layer_types calls "sliding_attention" or, without
 * that list, those from max_window_layers on (Qwen2, Qwen3) or all of them (Qwen3-MoE);
 * transformers' own defaults for Qwen2-MoE and SmolLM3 are not followed (no released checkpoint
 * uses them): refused. Gemma windows the layers layer_types names or, without it, all but every
 * sliding_window_pattern-th (Gemma 3, 6 by default) or every other one from the first (Gemma 2). */
static int hf_sliding_window(pgd_model *m, const cJSON *c, const char *type, const char *path,
                             pgd_err *err) {
    bool every = !strcmp(type, "mistral") || !strcmp(type, "mixtral");
    bool gemma2 = !strcmp(type, "gemma2"), gemma = gemma2 || !strcmp(type, "gemma3_text");
    bool qwen = !every && !gemma && strcmp(type, "llama"); /* the use_sliding_window family */
    const char *nk = gemma ? "sliding_window_pattern" : "max_window_layers";
    bool mistral = !strcmp(type, "mistral");
    int32_t sw, from;
    /* (MistralConfig's window is 4096 without the key; null is none) */
    bool absent = !cJSON_GetObjectItemCaseSensitive(c, "sliding_window");
    if (json_int(c, "sliding_window", mistral && absent ? 4096 : 0, &sw) ||
        json_int(c, nk, gemma ? 6 : 28, &from) ||
        (gemma && from < 1))
        return pgd_err_set(err, PGD_EFORMAT, "%s: sliding_window or %s is not a %s integer",
                           path, nk, gemma ? "positive" : "non-negative");
    if (gemma2) from = 2; /* (every other layer, from the first: no key for it) */
    if (gemma && sw == 0)
        return pgd_err_set(err, PGD_EUNSUPPORTED, "%s: a %s config without sliding_window", path,
                           type);
    if (sw == 0 || (!every && !qwen && !gemma) ||
        (qwen && !cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c, "use_sliding_window"))))
        return PGD_OK;
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(c, "layer_types");
    /* (transformers reads a mistral config with layer_types as Ministral's) */
    bool listed = (!every || mistral) && lt && !cJSON_IsNull(lt);
    if (qwen && !listed && (!strcmp(type, "qwen2_moe") || !strcmp(type, "smollm3")))
        return pgd_err_set(err, PGD_EUNSUPPORTED, "%s: use_sliding_window without layer_types "
                           "(%s)", path, type);
    if (listed && (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != m->cfg.n_layer))
        return pgd_err_set(err, PGD_EFORMAT, "%s: layer_types must name %d layers", path,
                           m->cfg.n_layer);
    int32_t *w = calloc((size_t)m->cfg.n_layer, sizeof *w);
    int rc = own(m, w, err);
    if (rc) return rc;
    m->cfg.window = w;
    for (int il = 0; il < m->cfg.n_layer; il++) {
        bool on = gemma ? (il + 1) % from != 0
                        : every || !strcmp(type, "qwen3_moe") || il >= from;
        if (listed) {
            const cJSON *x = cJSON_GetArrayItem(lt, il);
            const char *v = cJSON_IsString(x) ? x->valuestring : "";
            if (strcmp(v, "sliding_attention") && strcmp(v, "full_attention"))
                return pgd_err_set(err, PGD_EUNSUPPORTED, "%s: layer_types[%d] is neither "
                                   "sliding_attention nor full_attention", path, il);
            on = !strcmp(v, "sliding_attention");
        }
        w[il] = on ? sw : 0;
    }
    return PGD_OK;
}

/* Gemma 2 and 3: the embedding scaled by sqrt(hidden_size), a GELU (tanh) gate, RMSNorm gains
 * stored as offsets from 1 in HF checkpoints (added at load), post-attention and post-FFN norms,
 * attention scaled by q_scalar^-1/2. Gemma 2: attention scores and final logits soft-capped
 * (attn_cap, final_cap; 0: not). Gemma 3: QK-norm, and the sliding layers rotated with their
 * own RoPE base (theta_local) and without the global layers' scaling. Called once the windows
 * are known (cfg.window): a layer with one is a sliding layer. */
static int gemma_config(pgd_model *m, double q_scalar, double theta_local, double attn_cap,
                        double final_cap, const char *path, pgd_err *err) {
    pgd_model_config *c = &m->cfg;
    bool g3 = c->arch == PGD_ARCH_GEMMA3;
    float scale = q_scalar > 0 ? (float)(1.0 / sqrt(q_scalar)) : 0;
    if (!(scale > 0 && scale <= FLT_MAX) ||
        (g3 && !(theta_local > 0 && theta_local <= FLT_MAX)) ||
        !(attn_cap >= 0 && attn_cap <= FLT_MAX) || !(final_cap >= 0 && final_cap <= FLT_MAX))
        return pgd_err_set(err, PGD_EFORMAT, "%s: invalid query_pre_attn_scalar, local RoPE "
                           "base or soft-capping", path);
    c->embed_scale = (float)sqrt((double)c->dim);
    c->gelu = true;
    c->attn_scale = scale;
    c->attn_softcap = (float)attn_cap;
    c->final_softcap = (float)final_cap;
    if (!g3) return PGD_OK;
    c->rope_theta_local = (float)theta_local;
    bool *lr = calloc((size_t)c->n_layer, sizeof *lr);
    int rc = own(m, lr, err);
    if (rc) return rc;
    for (int il = 0; il < c->n_layer; il++) lr[il] = c->window && c->window[il];
    c->local_rope = lr;
    return PGD_OK;
}

/* A number of config.json: dflt without the key, if_null for null, -1 (which gemma_config
 * refuses) for anything but a number. */
static double num_of(const cJSON *c, const char *key, double dflt, double if_null) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(c, key);
    return !x ? dflt : cJSON_IsNull(x) ? if_null : cJSON_IsNumber(x) ? x->valuedouble : -1;
}

/* transformers' Gemma settings Pagoda does not implement: Gemma 3 with soft-capping, the
 * bidirectional attention of embedding variants, activations other than GELU (tanh). */
static int hf_gemma_checks(const cJSON *c, bool g3, const char *path, pgd_err *err) {
    const char *caps[] = {"final_logit_softcapping", "attn_logit_softcapping"};
    for (size_t i = 0; i < 2 && g3; i++) {
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(c, caps[i]);
        if (x && !cJSON_IsNull(x))
            return pgd_err_set(err, PGD_EUNSUPPORTED, "%s: %s is not supported", path, caps[i]);
    }
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c, "use_bidirectional_attention")))
        return pgd_err_set(err, PGD_EUNSUPPORTED, "%s: use_bidirectional_attention is not "
                           "supported", path);
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(c, "hidden_activation");
    if (!act) act = cJSON_GetObjectItemCaseSensitive(c, "hidden_act");
    if (act && !(cJSON_IsString(act) && !strcmp(act->valuestring, "gelu_pytorch_tanh")))
        return pgd_err_set(err, PGD_EUNSUPPORTED, "%s: hidden_activation must be "
                           "gelu_pytorch_tanh", path);
    return PGD_OK;
}

/* Experts of a Mixtral, Qwen2-MoE or Qwen3-MoE config.json. Mixtral's are intermediate_size
 * wide and always rescaled; Qwen's are moe_intermediate_size wide, rescaled when norm_topk_prob,
 * and every layer has them unless mlp_only_layers or decoder_sparse_step say otherwise (which
 * Pagoda refuses: no released checkpoint uses them); Qwen2-MoE adds a shared expert of
 * shared_expert_intermediate_size, which then is the dense FFN width. transformers 5 writes
 * num_local_experts where Qwen's own configs say num_experts. */
static int hf_moe_config(pgd_model *m, const cJSON *c, bool mixtral, const char *path,
                         pgd_err *err) {
    pgd_model_config *mc = &m->cfg;
    int32_t step = 1;
    if (json_int(c, "num_local_experts", 0, &mc->n_expert) ||
        (!mc->n_expert && json_int(c, "num_experts", 0, &mc->n_expert)) ||
        json_int(c, "num_experts_per_tok", 0, &mc->n_expert_used) ||
        json_int(c, mixtral ? "intermediate_size" : "moe_intermediate_size", 0,
                 &mc->moe_ffn_dim) ||
        json_int(c, "decoder_sparse_step", 1, &step))
        return pgd_err_set(err, PGD_EFORMAT, "%s: an expert count or size is not a non-negative "
                           "integer", path);
    const cJSON *ntp = cJSON_GetObjectItemCaseSensitive(c, "norm_topk_prob");
    mc->moe_norm = mixtral || cJSON_IsTrue(ntp);
    const cJSON *dense = cJSON_GetObjectItemCaseSensitive(c, "mlp_only_layers");
    if (step != 1 || (cJSON_IsArray(dense) && cJSON_GetArraySize(dense) > 0))
        return pgd_err_set(err, PGD_EUNSUPPORTED, "%s: dense layers among the expert layers "
                           "(mlp_only_layers, decoder_sparse_step) are not supported", path);
    if (!mc->n_expert)
        return pgd_err_set(err, PGD_EFORMAT, "%s: no experts (num_experts)", path);
    if (mixtral || mc->arch != PGD_ARCH_QWEN2) return PGD_OK;
    int32_t shared = 0; /* Qwen2-MoE: every layer has a shared expert */
    if (json_int(c, "shared_expert_intermediate_size", 0, &shared) || shared < 1)
        return pgd_err_set(err, PGD_EFORMAT, "%s: qwen2_moe needs a positive "
                           "shared_expert_intermediate_size", path);
    mc->moe_shared = true;
    mc->ffn_dim = shared;
    return PGD_OK;
}

/* Multimodal checkpoints whose text model Pagoda serves alone (images are not read): config.json
 * nests the text model's config in text_config, whose missing keys take the defaults of its
 * transformers class (Gemma3TextConfig, MistralConfig), as transformers fills them in. */
static const struct { const char *outer, *inner, *defaults; } wrapped_configs[] = {
    {"gemma3", "gemma3_text",
     "{\"vocab_size\": 262208, \"hidden_size\": 2304, \"intermediate_size\": 9216, "
     "\"num_hidden_layers\": 26, \"num_attention_heads\": 8, \"num_key_value_heads\": 4, "
     "\"head_dim\": 256, \"hidden_activation\": \"gelu_pytorch_tanh\", "
     "\"max_position_embeddings\": 131072, \"rms_norm_eps\": 1e-6, \"rope_theta\": 1000000, "
     "\"rope_local_base_freq\": 10000, \"query_pre_attn_scalar\": 256, "
     "\"sliding_window\": 4096, \"sliding_window_pattern\": 6}"},
    {"mistral3", "mistral",
     "{\"vocab_size\": 32000, \"hidden_size\": 4096, \"intermediate_size\": 14336, "
     "\"num_hidden_layers\": 32, \"num_attention_heads\": 32, \"num_key_value_heads\": 8, "
     "\"max_position_embeddings\": 131072, \"rms_norm_eps\": 1e-6, \"rope_theta\": 10000, "
     "\"sliding_window\": 4096}"},
};

/* *out = the text model's config of a multimodal config.json `outer` (wrapped_configs[w]): a
 * copy of its text_config with the defaults added. */
static int unwrap_config(const cJSON *outer, size_t w, const char *path, cJSON **out,
                         pgd_err *err) {
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(outer, "text_config");
    const cJSON *tt = cJSON_GetObjectItemCaseSensitive(tc, "model_type");
    if (!cJSON_IsObject(tc) || (tt && !(cJSON_IsString(tt) &&
                                        !strcmp(tt->valuestring, wrapped_configs[w].inner))))
        return pgd_err_set(err, PGD_EUNSUPPORTED, "%s: a %s config needs a %s text_config",
                           path, wrapped_configs[w].outer, wrapped_configs[w].inner);
    cJSON *c = cJSON_Duplicate(tc, true), *d = cJSON_Parse(wrapped_configs[w].defaults);
    cJSON *x;
    bool ok = c && d;
    cJSON_ArrayForEach(x, d) {
        if (!ok || cJSON_GetObjectItemCaseSensitive(c, x->string)) continue;
        ok = cJSON_AddItemToObject(c, x->string, cJSON_Duplicate(x, true));
    }
    if (ok) {
        cJSON_DeleteItemFromObjectCaseSensitive(c, "model_type");
        ok = cJSON_AddStringToObject(c, "model_type", wrapped_configs[w].inner) != NULL;
    }
    /* transformers 5 ties the LM head by the outer config's tie_word_embeddings */
    if (ok && cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(outer, "tie_word_embeddings"))) {
        cJSON_DeleteItemFromObjectCaseSensitive(c, "tie_word_embeddings");
        ok = cJSON_AddFalseToObject(c, "tie_word_embeddings") != NULL;
    }
    cJSON_Delete(d);
    if (!ok) {
        cJSON_Delete(c);
        return pgd_err_set(err, PGD_ENOMEM, "%s: out of memory", path);
    }
    *out = c;
    return PGD_OK;
}

int pgd__json_object_read(const char *path, cJSON **out, pgd_err *err) {
    char *txt = NULL;
    size_t len = 0;
    *out = NULL;
    int rc = pgd_read_file(path, &txt, &len, err);
    if (rc) return rc;
    cJSON *c = cJSON_ParseWithLength(txt, len);
    free(txt);
    if (!cJSON_IsObject(c)) {
        cJSON_Delete(c);
        return pgd_err_set(err, PGD_EFORMAT, "%s: not a JSON object", path);
    }
    *out = c;
    return PGD_OK;
}

int pgd_hf_config_read(const char *path, bool lenient, cJSON **out, bool *wrapped,
                       pgd_err *err) {
    *out = NULL;
    *wrapped = false;
    cJSON *c;
    int rc = pgd__json_object_read(path, &c, err);
    if (rc) return rc;
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(c, "model_type");
    for (size_t w = 0; w < sizeof wrapped_configs / sizeof wrapped_configs[0]; w++) {
        if (!cJSON_IsString(mt) || strcmp(mt->valuestring, wrapped_configs[w].outer)) continue;
        cJSON *inner = NULL;
        pgd_err quiet;
        rc = unwrap_config(c, w, path, &inner, lenient ? &quiet : err);
        if (rc && lenient && rc != PGD_ENOMEM) break; /* read as it is */
        cJSON_Delete(c);
        if (rc) return rc;
        c = inner;
        *wrapped = true;
        break;
    }
    *out = c;
    return PGD_OK;
}

/* Reads the model configuration from a Hugging Face config.json file (any name). */
static int hf_config_file(pgd_model *m, const char *path, pgd_err *err) {
    cJSON *c;
    int rc = pgd_hf_config_read(path, false, &c, &m->hf_wrapped, err);
    if (rc) return rc;
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(c, "model_type");
    const char *type = cJSON_IsString(mt) ? mt->valuestring : "";
    if (!strcmp(type, "llama") || !strcmp(type, "mistral")) {
        m->cfg.arch = PGD_ARCH_LLAMA;
    } else if (!strcmp(type, "smollm3")) {
        m->cfg.arch = PGD_ARCH_SMOLLM3;
    } else if (!strcmp(type, "qwen2") || !strcmp(type, "qwen3") || !strcmp(type, "qwen2_moe") ||
               !strcmp(type, "qwen3_moe")) {
        m->cfg.arch = !strncmp(type, "qwen2", 5) ? PGD_ARCH_QWEN2 : PGD_ARCH_QWEN3;
    } else if (!strcmp(type, "mixtral")) {
        m->cfg.arch = PGD_ARCH_LLAMA;
    } else if (!strcmp(type, "gemma3_text") || !strcmp(type, "gemma2")) {
        m->cfg.arch = !strcmp(type, "gemma2") ? PGD_ARCH_GEMMA2 : PGD_ARCH_GEMMA3;
        if ((rc = hf_gemma_checks(c, m->cfg.arch == PGD_ARCH_GEMMA3, path, err))) goto done;
    } else {
        rc = pgd_err_set(err, PGD_EUNSUPPORTED, "%s: unsupported model_type '%.64s' (llama, "
                         "mistral, mixtral, qwen2, qwen2_moe, qwen3, qwen3_moe, smollm3, gemma2 "
                         "and gemma3_text are)", path, type);
        goto done;
    }
    m->hf_untied = cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(c, "tie_word_embeddings"));
    /* q/k/v biases (Qwen2, attention_bias) are loaded when the checkpoint has them */
    m->cfg.rope_mode = PGD_ROPE_NEOX;
    int32_t heads, kv, hd;
    if (json_int(c, "vocab_size", 0, &m->cfg.n_vocab) || json_int(c, "hidden_size", 0, &m->cfg.dim) ||
        json_int(c, "num_hidden_layers", 0, &m->cfg.n_layer) ||
        json_int(c, "num_attention_heads", 0, &heads) ||
        json_int(c, "num_key_value_heads", heads, &kv) ||
        json_int(c, "intermediate_size", 0, &m->cfg.ffn_dim) ||
        json_int(c, "max_position_embeddings", 2048, &m->cfg.n_ctx) ||
        json_int(c, "head_dim", gemma_arch(m->cfg.arch) ? 256 /* Gemma{2,3}Config's */
                                   : heads ? m->cfg.dim / heads : 0, &hd)) {
        rc = pgd_err_set(err, PGD_EFORMAT, "%s: a dimension is not a non-negative integer", path);
        goto done;
    }
    m->cfg.n_head = heads;
    m->cfg.n_kv_head = kv;
    m->cfg.head_dim = hd;
    if (!strcmp(type, "mixtral") || !strcmp(type, "qwen2_moe") || !strcmp(type, "qwen3_moe")) {
        rc = hf_moe_config(m, c, !strcmp(type, "mixtral"), path, err);
        if (rc) goto done;
    }
    m->cfg.rms_eps = (float)json_num(c, "rms_norm_eps", 1e-6);
    if (json_int(c, "bos_token_id", -1, &m->cfg.bos_id)) m->cfg.bos_id = -1; /* e.g. a list */
    /* transformers >= 4.5x nests rope settings in "rope_parameters"; older files use
     * "rope_theta" and "rope_scaling". */
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(c, "rope_parameters");
    /* (Gemma 3's, per layer type: the global layers' here, the sliding layers' base below) */
    const cJSON *rp_local = cJSON_GetObjectItemCaseSensitive(rp, "sliding_attention");
    if (cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(rp, "full_attention")))
        rp = cJSON_GetObjectItemCaseSensitive(rp, "full_attention");
    const cJSON *rs = cJSON_IsObject(rp) ? rp : cJSON_GetObjectItemCaseSensitive(c, "rope_scaling");
    bool gemma = gemma_arch(m->cfg.arch);
    m->cfg.rope_theta = (float)json_num(cJSON_IsObject(rp) ? rp : c, "rope_theta",
                                        m->cfg.arch == PGD_ARCH_GEMMA3 ? 1000000.0 : 10000.0);
    if ((rc = check_config(m, err))) goto done;
    if (m->cfg.arch == PGD_ARCH_SMOLLM3 && (rc = smollm3_no_rope(m, c, path, err))) goto done;
    if ((rc = hf_sliding_window(m, c, type, path, err))) goto done;
    /* (Gemma 2 soft-caps at transformers' 50 and 30 without the keys, not at all with null) */
    if (gemma && (rc = gemma_config(m, num_of(c, "query_pre_attn_scalar", 256.0, 256.0),
                                    cJSON_IsObject(rp_local)
                                        ? num_of(rp_local, "rope_theta", 10000.0, 10000.0)
                                        : num_of(c, "rope_local_base_freq", 10000.0, 10000.0),
                                    num_of(c, "attn_logit_softcapping", 50.0, 0),
                                    num_of(c, "final_logit_softcapping", 30.0, 0), path, err)))
        goto done;
    if (cJSON_IsObject(rs)) {
        const cJSON *rt = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
        if (!cJSON_IsString(rt)) rt = cJSON_GetObjectItemCaseSensitive(rs, "type");
        const char *rtype = cJSON_IsString(rt) ? rt->valuestring : "default";
        if (!strcmp(rtype, "llama3")) rc = llama3_factors(m, rs, err);
        else if (!strcmp(rtype, "linear")) rc = linear_factors(m, json_num(rs, "factor", 0), err);
        else if (!strcmp(rtype, "yarn")) {
            if (yarn_factors(m, json_num(rs, "factor", 0),
                             num_of(rs, "original_max_position_embeddings", m->cfg.n_ctx, -1),
                             num_of(rs, "beta_fast", 32, 32), num_of(rs, "beta_slow", 1, 1),
                             num_of(rs, "attention_factor", 0, 0)))
                rc = pgd_err_set(err, PGD_EFORMAT, "%s: invalid yarn rope_scaling", path);
        }
        else if (strcmp(rtype, "default"))
            rc = pgd_err_set(err, PGD_EUNSUPPORTED, "%s: unsupported rope scaling type '%.64s'",
                             path, rtype);
    }
done:
    cJSON_Delete(c);
    return rc;
}

static int hf_config(pgd_model *m, const char *dir, pgd_err *err) {
    char path[PATH_MAX];
    if ((size_t)snprintf(path, sizeof path, "%s/config.json", dir) >= sizeof path)
        return pgd_err_set(err, PGD_EINVAL, "%s: path too long", dir);
    return hf_config_file(m, path, err);
}

/* ---- weights ---- */

/* *v (n) replaced by an owned copy of v + add. */
static int adjust_vec(pgd_model *m, const float **v, int64_t n, float add, pgd_err *err) {
    float *f = malloc((size_t)n * sizeof *f);
    int rc = own(m, f, err);
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
    bool gemma = gemma_arch(c->arch);
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
        /* an MoE layer has experts in place of the last three */
        size_t n_ws = c->n_expert ? 4 : sizeof ws / sizeof ws[0];
        for (size_t i = 0; i < n_ws; i++)
            if ((rc = load_weight(m, il, ws[i].g, ws[i].h, ws[i].in, ws[i].out, false, f32, ws[i].w,
                                  err)))
                return rc;
        if (c->n_expert && (rc = load_experts(m, il, f32, l, err))) return rc;
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
    if (m->gguf.n_tensors) {
        const float *ff;
        if ((rc = load_vec(m, -1, "rope_freqs.weight", "", c->head_dim / 2, true, &ff, err)))
            return rc;
        if (ff && m->cfg.rope_freq_factors) { /* with linear scaling too: both apply (llama.cpp) */
            for (int i = 0; i < c->head_dim / 2; i++) m->cfg.rope_freq_factors[i] *= ff[i];
        } else if (ff) {
            float *copy = malloc((size_t)(c->head_dim / 2) * sizeof *copy);
            if ((rc = own(m, copy, err))) return rc;
            memcpy(copy, ff, (size_t)(c->head_dim / 2) * sizeof *copy);
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
        return tmp ? own(m, (void *)host, err) : PGD_OK;
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
    int rc = own(m, ex, err);
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
    d->moe = experts_moe(&m->cfg, ex, sh->moe_dim);
    if (!l->moe.shared_gate) return PGD_OK;
    if ((rc = shard_weight(m, sh, &l->w_shared_inp, 0, 1, 0, dim, &d->w_shared_inp, err)))
        return rc;
    moe_add_shared(&d->moe, d, sh->ffn_dim);
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
    if (c->n_expert) { /* each expert's columns alike */
        unit = pgd_type_block_elems(m->layers[0].experts[2 * c->n_expert].type);
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
    size_t n = 0, per_layer = PGD_LAYER_N_MATRICES + 2 + 3 * (size_t)c->n_expert;
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
    if (c->n_head % tp || c->n_kv_head % tp)
        return pgd_err_set(err, PGD_EINVAL, "--tensor-parallel-size %d does not divide the %d "
                           "attention heads and %d KV heads of %s", tp, c->n_head, c->n_kv_head,
                           m->path);
    if (c->ffn_dim < tp || c->n_vocab < tp || (c->n_expert && c->moe_ffn_dim < tp))
        return pgd_err_set(err, PGD_EINVAL, "--tensor-parallel-size %d: model too small", tp);
    if (c->n_expert && !ops->supports(PGD_OP_MOE, PGD_TYPE_F32))
        return pgd_err_set(err, PGD_EUNSUPPORTED, "%s: mixture-of-experts models run on the CPU "
                           "backend only (--device cpu), not on %s", m->path, ops->name);
    if (gemma_arch(c->arch) && !(ops->supports(PGD_OP_GELU_GATE, PGD_TYPE_F32) &&
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
     * gives each its own bytes, so CPU benchmarks read as much memory as a real model) */
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
    const int64_t E = c->n_expert, mf = c->moe_ffn_dim;
    const int64_t shapes[][2] = {{c->dim, c->n_vocab}, {c->dim, q_dim}, {c->dim, kv_dim},
                                 {q_dim, c->dim},      {c->dim, c->ffn_dim}, {c->ffn_dim, c->dim},
                                 {c->dim, E},          {c->dim, E ? mf : 0}, {E ? mf : 0, c->dim},
                                 {c->dim, 1}};
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
        if ((rc = own(m, bufs[k] = dummy_fill(types[k], need, &st), err))) return rc;
    }
    if (!bufs[1]) bufs[1] = bufs[0]; /* one type */
    int n_ones = c->dim > c->head_dim ? c->dim : c->head_dim;
    float *ones = malloc((size_t)n_ones * sizeof *ones);
    if ((rc = own(m, ones, err))) return rc;
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
        DW(l->wq, c->dim, q_dim);
        DW(l->wk, c->dim, kv_dim);
        DWK(l->wv, c->dim, kv_dim, 1);
        DW(l->wo, q_dim, c->dim);
        if (!c->n_expert || c->moe_shared) { /* a dense FFN, or Qwen2-MoE's shared expert */
            DW(l->w_gate, c->dim, c->ffn_dim);
            DW(l->w_up, c->dim, c->ffn_dim);
            DWK(l->w_down, c->ffn_dim, c->dim, 1);
        }
        l->attn_norm = l->ffn_norm = ones;
        if (c->arch == PGD_ARCH_QWEN3) l->q_norm = l->k_norm = ones;
        l->no_rope = c->no_rope && c->no_rope[il];
        l->window = c->window ? c->window[il] : 0;
        l->local_rope = c->local_rope && c->local_rope[il];
        if (gemma_arch(c->arch)) l->post_attn_norm = l->post_ffn_norm = ones;
        if (c->arch == PGD_ARCH_GEMMA3) l->q_norm = l->k_norm = ones;
        if (!c->n_expert) continue;
        l->experts = calloc(3 * (size_t)E, sizeof *l->experts);
        if ((rc = own(m, l->experts, err))) return rc;
        DW(l->w_router, c->dim, E);
        for (int e = 0; e < E; e++) {
            DW(l->experts[e], c->dim, c->moe_ffn_dim);
            DW(l->experts[E + e], c->dim, c->moe_ffn_dim);
            DW(l->experts[2 * E + e], c->moe_ffn_dim, c->dim);
        }
        l->moe = experts_moe(c, l->experts, c->moe_ffn_dim);
        if (c->moe_shared) {
            DW(l->w_shared_inp, c->dim, 1);
            moe_add_shared(&l->moe, l, c->ffn_dim);
        }
    }
#undef DW
#undef DWK
    return PGD_OK;
}

/* -m names a config.json (any file name) or its folder. A tokenizer.json beside it is loaded
 * (text in and out, as for the real model); without one the model runs on token ids only. */
static int load_dummy(pgd_model *m, const pgd_model_opts *opts, pgd_err *err) {
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
    int rc = hf_config_file(m, cfg, err);
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
        if ((rc = load_dummy(m, opts, err)) || (rc = place_model(m, opts, err))) goto fail;
        *out = m;
        return PGD_OK;
    }
    if (is_dir(path)) {
        char tj[PATH_MAX], tc[PATH_MAX];
        if ((rc = hf_config(m, path, err))) goto fail;
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
        if ((rc = gguf_config(m, err))) goto fail;
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
