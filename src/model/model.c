/* Model loading: GGUF files and Hugging Face directories (config.json + safetensors +
 * tokenizer.json) for the Llama family and Qwen2. Weights stay in the file mappings unless they
 * must be converted (F16/BF16 norms, misaligned data, --weights-f32). */
#include "model/model.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "backend/cpu/quant.h"
#include "util/mapfile.h"

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
    if (m->n_owned == m->cap_owned) {
        size_t nc = m->cap_owned ? m->cap_owned * 2 : 64;
        void **n = realloc(m->owned, nc * sizeof *n);
        if (!n) {
            free(p);
            return pgd_err_set(err, PGD_ENOMEM, "%s: out of memory", m->path);
        }
        m->owned = n;
        m->cap_owned = nc;
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
    if (il < 0) snprintf(buf, cap, "%s", gguf ? gguf_name : hf_name);
    else if (gguf) snprintf(buf, cap, "blk.%d.%s", il, gguf_name);
    else snprintf(buf, cap, "model.layers.%d.%s", il, hf_name);
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

static int check_config(pgd_model *m, pgd_err *err) {
    pgd_model_config *c = &m->cfg;
    if (c->n_vocab <= 0 || c->dim <= 0 || c->n_layer <= 0 || c->n_head <= 0 ||
        c->n_kv_head <= 0 || c->head_dim <= 0 || c->ffn_dim <= 0 || c->n_ctx <= 0 ||
        c->dim > (1 << 20) || c->n_layer > 4096 || c->n_vocab > (1 << 24) || c->head_dim > 4096 ||
        c->ffn_dim > (1 << 22) || c->n_head > 4096)
        return pgd_err_set(err, PGD_EFORMAT, "%s: invalid model dimensions", m->path);
    if (c->n_head % c->n_kv_head)
        return pgd_err_set(err, PGD_EFORMAT, "%s: %d attention heads is not a multiple of %d KV "
                           "heads", m->path, c->n_head, c->n_kv_head);
    if (c->head_dim % 2)
        return pgd_err_set(err, PGD_EFORMAT, "%s: odd head dimension %d", m->path, c->head_dim);
    if (!(c->rms_eps > 0) || !(c->rope_theta > 0))
        return pgd_err_set(err, PGD_EFORMAT, "%s: invalid norm epsilon or rope theta", m->path);
    return PGD_OK;
}

static int gguf_config(pgd_model *m, pgd_err *err) {
    pgd_gguf *g = &m->gguf;
    pgd_str arch;
    if (pgd_gguf_get_str(g, "general.architecture", &arch))
        return pgd_err_set(err, PGD_EFORMAT, "%s: no general.architecture in metadata", m->path);
    char a[32];
    if (pgd_str_eq(arch, "llama") || pgd_str_eq(arch, "mistral")) {
        m->cfg.arch = PGD_ARCH_LLAMA;
        m->cfg.rope_mode = PGD_ROPE_NORM;
    } else if (pgd_str_eq(arch, "qwen2")) {
        m->cfg.arch = PGD_ARCH_QWEN2;
        m->cfg.rope_mode = PGD_ROPE_NEOX;
    } else {
        pgd_name_buf nb;
        return pgd_err_set(err, PGD_EUNSUPPORTED, "%s: unsupported architecture '%s' (llama, "
                           "mistral and qwen2 are)", m->path, pgd_str_safe(arch, &nb));
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
    return check_config(m, err);
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

static int hf_config(pgd_model *m, const char *dir, pgd_err *err) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *txt;
    int rc = pgd_read_file(path, &txt, NULL, err);
    if (rc) return rc;
    cJSON *c = cJSON_Parse(txt);
    free(txt);
    if (!cJSON_IsObject(c)) {
        cJSON_Delete(c);
        return pgd_err_set(err, PGD_EFORMAT, "%s: not a JSON object", path);
    }
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(c, "model_type");
    const char *type = cJSON_IsString(mt) ? mt->valuestring : "";
    bool bias = false;
    if (!strcmp(type, "llama") || !strcmp(type, "mistral")) {
        m->cfg.arch = PGD_ARCH_LLAMA;
        const cJSON *ab = cJSON_GetObjectItemCaseSensitive(c, "attention_bias");
        bias = cJSON_IsTrue(ab);
    } else if (!strcmp(type, "qwen2")) {
        m->cfg.arch = PGD_ARCH_QWEN2;
        bias = true;
    } else {
        rc = pgd_err_set(err, PGD_EUNSUPPORTED, "%s: unsupported model_type '%.64s' (llama, "
                         "mistral and qwen2 are)", path, type);
        goto done;
    }
    (void)bias; /* biases are loaded when present */
    m->cfg.rope_mode = PGD_ROPE_NEOX;
    int32_t heads, kv, hd;
    if (json_int(c, "vocab_size", 0, &m->cfg.n_vocab) || json_int(c, "hidden_size", 0, &m->cfg.dim) ||
        json_int(c, "num_hidden_layers", 0, &m->cfg.n_layer) ||
        json_int(c, "num_attention_heads", 0, &heads) ||
        json_int(c, "num_key_value_heads", heads, &kv) ||
        json_int(c, "intermediate_size", 0, &m->cfg.ffn_dim) ||
        json_int(c, "max_position_embeddings", 2048, &m->cfg.n_ctx) ||
        json_int(c, "head_dim", heads ? m->cfg.dim / heads : 0, &hd)) {
        rc = pgd_err_set(err, PGD_EFORMAT, "%s: a dimension is not a non-negative integer", path);
        goto done;
    }
    m->cfg.n_head = heads;
    m->cfg.n_kv_head = kv;
    m->cfg.head_dim = hd;
    int32_t sw = 0;
    if (!json_int(c, "sliding_window", 0, &sw) && sw > 0 && sw < m->cfg.n_ctx) {
        /* Sliding-window attention is not implemented; within the window it is exact. */
        m->cfg.n_ctx = sw;
    }
    m->cfg.rms_eps = (float)json_num(c, "rms_norm_eps", 1e-6);
    /* transformers >= 4.5x nests rope settings in "rope_parameters"; older files use
     * "rope_theta" and "rope_scaling". */
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(c, "rope_parameters");
    const cJSON *rs = cJSON_IsObject(rp) ? rp : cJSON_GetObjectItemCaseSensitive(c, "rope_scaling");
    m->cfg.rope_theta = (float)json_num(cJSON_IsObject(rp) ? rp : c, "rope_theta", 10000.0);
    if ((rc = check_config(m, err))) goto done;
    if (cJSON_IsObject(rs)) {
        const cJSON *rt = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
        if (!cJSON_IsString(rt)) rt = cJSON_GetObjectItemCaseSensitive(rs, "type");
        const char *rtype = cJSON_IsString(rt) ? rt->valuestring : "default";
        if (!strcmp(rtype, "llama3")) rc = llama3_factors(m, rs, err);
        else if (!strcmp(rtype, "linear")) rc = linear_factors(m, json_num(rs, "factor", 0), err);
        else if (strcmp(rtype, "default"))
            rc = pgd_err_set(err, PGD_EUNSUPPORTED, "%s: unsupported rope scaling type '%.64s'",
                             path, rtype);
    }
done:
    cJSON_Delete(c);
    return rc;
}

/* ---- weights ---- */

static int load_weights(pgd_model *m, bool f32, pgd_err *err) {
    const pgd_model_config *c = &m->cfg;
    int64_t q_dim = (int64_t)c->n_head * c->head_dim, kv_dim = (int64_t)c->n_kv_head * c->head_dim;
    int rc;
    if ((rc = load_weight(m, -1, "token_embd.weight", "model.embed_tokens.weight", c->dim,
                          c->n_vocab, false, f32, &m->tok_embd, err)))
        return rc;
    if ((rc = load_weight(m, -1, "output.weight", "lm_head.weight", c->dim, c->n_vocab, true, f32,
                          &m->output, err)))
        return rc;
    if (!m->output.data) m->output = m->tok_embd; /* tied embeddings */
    if ((rc = load_vec(m, -1, "output_norm.weight", "model.norm.weight", c->dim, false,
                       &m->output_norm, err)))
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
        for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++)
            if ((rc = load_weight(m, il, ws[i].g, ws[i].h, ws[i].in, ws[i].out, false, f32, ws[i].w,
                                  err)))
                return rc;
        struct { const char *g, *h; int64_t n; bool opt; const float **dst; } vs[] = {
            {"attn_norm.weight", "input_layernorm.weight", c->dim, false, &l->attn_norm},
            {"ffn_norm.weight", "post_attention_layernorm.weight", c->dim, false, &l->ffn_norm},
            {"attn_q.bias", "self_attn.q_proj.bias", q_dim, true, &l->bq},
            {"attn_k.bias", "self_attn.k_proj.bias", kv_dim, true, &l->bk},
            {"attn_v.bias", "self_attn.v_proj.bias", kv_dim, true, &l->bv},
        };
        for (size_t i = 0; i < sizeof vs / sizeof vs[0]; i++)
            if ((rc = load_vec(m, il, vs[i].g, vs[i].h, vs[i].n, vs[i].opt, vs[i].dst, err)))
                return rc;
    }
    /* llama.cpp stores Llama 3 rope scaling as per-frequency divisors. */
    if (m->gguf.n_tensors && !m->cfg.rope_freq_factors) {
        const float *ff;
        if ((rc = load_vec(m, -1, "rope_freqs.weight", "", c->head_dim / 2, true, &ff, err)))
            return rc;
        if (ff) {
            float *copy = malloc((size_t)(c->head_dim / 2) * sizeof *copy);
            if ((rc = own(m, copy, err))) return rc;
            memcpy(copy, ff, (size_t)(c->head_dim / 2) * sizeof *copy);
            m->cfg.rope_freq_factors = copy;
        }
    }
    return PGD_OK;
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
    int rc;
    if (!m->path) {
        rc = pgd_err_set(err, PGD_ENOMEM, "%s: out of memory", path);
        goto fail;
    }
    if (is_dir(path)) {
        char tj[PATH_MAX], tc[PATH_MAX];
        if ((rc = hf_config(m, path, err))) goto fail;
        if ((rc = pgd_st_open_dir(&m->st, path, err))) goto fail;
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
    *out = m;
    return PGD_OK;
fail:
    pgd_model_free(m);
    return rc;
}

void pgd_model_free(pgd_model *m) {
    if (!m) return;
    for (size_t i = 0; i < m->n_owned; i++) free(m->owned[i]);
    free(m->owned);
    free(m->layers);
    if (m->tok) pgd_tokenizer_free(m->tok);
    pgd_gguf_close(&m->gguf);
    pgd_st_close(&m->st);
    free(m->path);
    free(m);
}
