/* A model's configuration: a GGUF's metadata or a Hugging Face config.json (also a multimodal
 * wrapper's text_config) into pgd_model_config -- the architecture, shapes, RoPE and its scaling
 * (linear, llama3, YaRN), sliding windows, Gemma's and the MoE models' fields. */
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
    if (c->kv_lora_rank &&
        (c->kv_lora_rank > (1 << 16) || c->qk_nope_dim <= 0 || c->qk_nope_dim > 4096 ||
         c->v_head_dim <= 0 || c->v_head_dim > 4096 || c->rope_dim <= 0 || c->rope_dim % 2 ||
         c->rope_dim > 4096 || c->q_lora_rank < 0 || c->q_lora_rank > (1 << 16) ||
         c->head_dim != c->kv_lora_rank + c->rope_dim || c->n_kv_head != 1 ||
         c->v_head_dim > c->head_dim)) /* (W_UV's output reuses the query's rows) */
        return pgd_err_set(err, PGD_EFORMAT, "%s: invalid latent attention dimensions", m->path);
    if (c->n_expert && (c->n_dense < 0 || c->n_dense > c->n_layer || c->moe_shared_dim < 0 ||
                        c->moe_shared_dim > (1 << 22) || c->moe_n_group < 0 ||
                        (c->moe_n_group > 1 && (c->n_expert % c->moe_n_group ||
                                                c->moe_topk_group < 1 ||
                                                c->moe_topk_group > c->moe_n_group ||
                                                c->moe_topk_group * (c->n_expert / c->moe_n_group) <
                                                    c->n_expert_used)) ||
                        !(c->moe_scale >= 0 && c->moe_scale <= 1e6)))
        return pgd_err_set(err, PGD_EFORMAT, "%s: invalid expert routing (dense layers, shared "
                           "experts, groups or scale)", m->path);
    return PGD_OK;
}

/* NoPE layers every `step` layers: layer il applies no RoPE when (il + 1) % step == 0, as
 * transformers' SmolLM3Config derives no_rope_layers from no_rope_layer_interval and llama.cpp
 * hard-codes for smollm3 GGUF files (step 4; the files carry no key for it). */
static int no_rope_every(pgd_model *m, int32_t step, pgd_err *err) {
    bool *nr = calloc((size_t)m->cfg.n_layer, sizeof *nr);
    int rc = pgd__own(m, nr, err);
    if (rc) return rc;
    for (int il = 0; il < m->cfg.n_layer; il++) nr[il] = step > 0 && (il + 1) % step == 0;
    m->cfg.no_rope = nr;
    return PGD_OK;
}

static int linear_factors(pgd_model *m, double factor, pgd_err *err);

bool pgd__gemma_arch(pgd_arch a) { return a == PGD_ARCH_GEMMA2 || a == PGD_ARCH_GEMMA3; }

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

void pgd__model_names(pgd_model_config *c, const char *model_type, const char *architecture) {
    static const struct {
        const char *type, *cls;
    } classes[] = {
        {"llama", "LlamaForCausalLM"},         {"mistral", "MistralForCausalLM"},
        {"mixtral", "MixtralForCausalLM"},     {"qwen2", "Qwen2ForCausalLM"},
        {"qwen2_moe", "Qwen2MoeForCausalLM"},  {"qwen3", "Qwen3ForCausalLM"},
        {"qwen3_moe", "Qwen3MoeForCausalLM"},  {"smollm3", "SmolLM3ForCausalLM"},
        {"gemma2", "Gemma2ForCausalLM"},       {"gemma3_text", "Gemma3ForCausalLM"},
        {"deepseek_v2", "DeepseekV2ForCausalLM"}, {"deepseek_v3", "DeepseekV3ForCausalLM"},
    };
    snprintf(c->model_type, sizeof c->model_type, "%s", model_type);
    for (size_t i = 0; !architecture && i < sizeof classes / sizeof classes[0]; i++)
        if (!strcmp(model_type, classes[i].type)) architecture = classes[i].cls;
    snprintf(c->architecture, sizeof c->architecture, "%s", architecture ? architecture : "");
}

/* deepseek2 metadata as llama.cpp's converter writes it: attention.key_length is the cached row
 * (kv_lora_rank + rope), key_length_mla/value_length_mla a head's query and value (files from
 * before the latent cache: key_length/value_length are those); experts after
 * leading_dense_block_count dense layers, expert_shared_count shared ones; routing by
 * expert_gating_func (2: sigmoid; 1 or none: softmax), in expert_group_count groups, weights
 * times expert_weights_scale; under YaRN, scores times (1 + yarn_log_multiplier ln factor)^2 (the
 * file's multiplier is 0.1 mscale_all_dim). */
static int gguf_deepseek_config(pgd_model *m, const char *a, pgd_err *err) {
    pgd_gguf *g = &m->gguf;
    pgd_model_config *c = &m->cfg;
    char key[128];
    uint32_t kl = 0, vl = 0, klm = 0, vlm = 0, r = 0, qr = 0, rope = 0, dense = 0, shared = 0;
    uint32_t groups = 0, used = 0, gating = 0;
    struct { const char *suffix; uint32_t *dst; bool required; } keys[] = {
        {"attention.kv_lora_rank", &r, true},
        {"attention.q_lora_rank", &qr, false},
        {"rope.dimension_count", &rope, true},
        {"attention.key_length", &kl, true},
        {"attention.value_length", &vl, true},
        {"attention.key_length_mla", &klm, false},
        {"attention.value_length_mla", &vlm, false},
        {"leading_dense_block_count", &dense, false},
        {"expert_shared_count", &shared, false},
        {"expert_group_count", &groups, false},
        {"expert_group_used_count", &used, false},
        {"expert_gating_func", &gating, false},
    };
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        snprintf(key, sizeof key, "%s.%s", a, keys[i].suffix);
        int rc = pgd_gguf_get_u32(g, key, keys[i].dst);
        if (rc == PGD_ENOENT && !keys[i].required) continue;
        if (rc || *keys[i].dst > (1u << 22))
            return pgd_err_set(err, PGD_EFORMAT, "%s: %s %s", m->path,
                               rc == PGD_ENOENT ? "missing metadata" : "invalid metadata", key);
    }
    bool mla_keys = klm && vlm;
    uint32_t qk = mla_keys ? klm : kl, v = mla_keys ? vlm : vl;
    if (qk <= rope || rope < 2 || r < 1 || gating > 2)
        return pgd_err_set(err, PGD_EFORMAT, "%s: invalid latent attention metadata (%s.attention."
                           "key_length%s, rope.dimension_count, kv_lora_rank, expert_gating_func)",
                           m->path, a, mla_keys ? "_mla" : "");
    c->kv_lora_rank = (int32_t)r;
    c->q_lora_rank = (int32_t)qr;
    c->rope_dim = (int32_t)rope;
    c->qk_nope_dim = (int32_t)(qk - rope);
    c->v_head_dim = (int32_t)v;
    c->head_dim = (int32_t)(r + rope);
    c->n_kv_head = 1;
    c->n_dense = (int32_t)dense;
    c->moe_shared_dim = (int32_t)shared * c->moe_ffn_dim;
    c->moe_sigmoid = gating == 2;
    if (c->moe_sigmoid) pgd__model_names(c, "deepseek_v3", NULL);
    c->moe_n_group = (int32_t)groups;
    c->moe_topk_group = (int32_t)used;
    c->moe_norm = false;
    snprintf(key, sizeof key, "%s.expert_weights_norm", a);
    pgd_gguf_get_bool(g, key, &c->moe_norm);
    snprintf(key, sizeof key, "%s.expert_weights_scale", a);
    c->moe_scale = 0;
    if (pgd_gguf_find(g, key) && pgd_gguf_get_f32(g, key, &c->moe_scale))
        return pgd_err_set(err, PGD_EFORMAT, "%s: invalid metadata %s", m->path, key);
    if (c->n_dense >= c->n_layer) c->n_expert = 0;
    double scale = 1.0 / sqrt((double)qk);
    float log_mul = 0, factor = 1;
    snprintf(key, sizeof key, "%s.rope.scaling.yarn_log_multiplier", a);
    if (pgd_gguf_find(g, key) && pgd_gguf_get_f32(g, key, &log_mul))
        return pgd_err_set(err, PGD_EFORMAT, "%s: invalid metadata %s", m->path, key);
    snprintf(key, sizeof key, "%s.rope.scaling.factor", a);
    if (log_mul && !pgd_gguf_get_f32(g, key, &factor) && factor > 1) {
        double ms = 1.0 + log_mul * log(factor);
        scale *= ms * ms;
    }
    c->attn_scale = (float)scale;
    c->rope_attn = 1.0f; /* (YaRN's own factor, when the file names one: gguf_rope_scaling) */
    return PGD_OK;
}

int pgd__gguf_config(pgd_model *m, pgd_err *err) {
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
    } else if (pgd_str_eq(arch, "deepseek2")) { /* (adjacent pairs, unpermuted: llama.cpp's) */
        m->cfg.arch = PGD_ARCH_DEEPSEEK2;
        m->cfg.rope_mode = PGD_ROPE_NORM;
    } else {
        pgd_name_buf nb;
        return pgd_err_set(err, PGD_EUNSUPPORTED, "%s: unsupported architecture '%s' (llama, "
                           "mistral, qwen2, qwen2moe, qwen3, qwen3moe, smollm3, gemma2, "
                           "gemma3 and deepseek2 are)",
                           m->path, pgd_str_safe(arch, &nb));
    }
    static const struct {
        const char *gguf, *hf;
    } types[] = {{"qwen2moe", "qwen2_moe"}, {"qwen3moe", "qwen3_moe"}, {"gemma3", "gemma3_text"},
                 {"deepseek2", "deepseek_v2"}};
    pgd_name_buf tb;
    const char *ty = pgd_str_safe(arch, &tb);
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (pgd_str_eq(arch, types[i].gguf)) ty = types[i].hf;
    pgd__model_names(&m->cfg, ty, NULL);
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
    if (m->cfg.arch == PGD_ARCH_DEEPSEEK2) {
        int drc = gguf_deepseek_config(m, a, err);
        if (drc) return drc;
    }
    int rc = check_config(m, err);
    if (!rc && m->cfg.arch == PGD_ARCH_SMOLLM3) rc = no_rope_every(m, 4, err);
    if (!rc) rc = gguf_rope_scaling(m, a, err);
    /* A Mistral v0.1 file may name its window (llama.cpp's converter does not write it); a
     * Gemma file must. Gemma 3 windows all layers but every sixth, Gemma 2 every other one
     * (from the first), as llama.cpp hard-codes. */
    bool gemma = pgd__gemma_arch(m->cfg.arch);
    int pattern = m->cfg.arch == PGD_ARCH_GEMMA2 ? 2 : 6;
    snprintf(key, sizeof key, "%s.attention.sliding_window", a);
    uint32_t sw = 0;
    if (!rc && gemma && (pgd_gguf_get_u32(g, key, &sw) || sw == 0 || sw > INT32_MAX))
        return pgd_err_set(err, PGD_EFORMAT, "%s: missing or invalid metadata %s", m->path, key);
    if (!rc && (m->cfg.arch == PGD_ARCH_LLAMA || gemma) && !pgd_gguf_get_u32(g, key, &sw) &&
        sw > 0 && sw <= INT32_MAX) {
        int32_t *w = calloc((size_t)m->cfg.n_layer, sizeof *w);
        if (!(rc = pgd__own(m, w, err))) {
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
    int rc = pgd__own(m, f, err);
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
    int dim = c->rope_dim ? c->rope_dim : c->head_dim, n = dim / 2;
    double base = c->rope_theta;
    /* the dimension (of dim) where a wavelength spans r rotations over orig_ctx positions */
#define YARN_DIM(r) ((double)dim * log(orig_ctx / ((r) * 6.283185307179586)) / (2 * log(base)))
    double lo = floor(YARN_DIM(beta_fast)), hi = ceil(YARN_DIM(beta_slow));
#undef YARN_DIM
    if (lo < 0) lo = 0;
    if (hi > dim - 1) hi = dim - 1;
    if (lo == hi) hi += 0.001;
    float *f = malloc((size_t)n * sizeof *f);
    int rc = pgd__own(m, f, NULL);
    if (rc) return rc;
    for (int i = 0; i < n; i++) {
        double ramp = ((double)i - lo) / (hi - lo);
        double ext = 1 - (ramp < 0 ? 0 : ramp > 1 ? 1 : ramp); /* extrapolated share */
        f[i] = (float)(1.0 / ((1.0 / factor) * (1 - ext) + ext));
    }
    c->rope_freq_factors = f;
    double af = attn_factor > 0 ? attn_factor : factor <= 1 ? 1.0 : 0.1 * log(factor) + 1.0;
    if (c->kv_lora_rank) {
        /* latent attention: on the rotated parts only, and 1 unless named (llama.cpp cancels
         * ggml's own for deepseek2; a config.json's comes from deepseek_yarn_af); the scores'
         * scale is the config's (hf_deepseek_config, gguf_deepseek_config) */
        c->rope_attn = attn_factor > 0 ? (float)attn_factor : 1.0f;
        return PGD_OK;
    }
    double scale = c->attn_scale > 0 ? c->attn_scale : 1.0 / sqrt((double)c->head_dim);
    c->attn_scale = (float)(scale * af * af);
    return PGD_OK;
}

static int linear_factors(pgd_model *m, double factor, pgd_err *err) {
    if (!(factor > 0))
        return pgd_err_set(err, PGD_EFORMAT, "%s/config.json: invalid rope scaling factor", m->path);
    int n = m->cfg.head_dim / 2;
    float *f = malloc((size_t)n * sizeof *f);
    int rc = pgd__own(m, f, err);
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
 * transformers' pgd__own defaults for Qwen2-MoE and SmolLM3 are not followed (no released checkpoint
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
    int rc = pgd__own(m, w, err);
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
 * pgd__own RoPE base (theta_local) and without the global layers' scaling. Called once the windows
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
    int rc = pgd__own(m, lr, err);
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

/* YaRN's get_mscale as transformers' DeepSeek code computes it. */
static double yarn_mscale(double factor, double mscale) {
    return factor <= 1 ? 1.0 : 0.1 * mscale * log(factor) + 1.0;
}

/* DeepSeek-V2/V3 (deepseek_v2, deepseek_v3) as transformers reads them, with its classes'
 * defaults: latent attention's shapes (q_lora_rank null: one q matrix), the softmax scale
 * qk_head_dim^-1/2 times get_mscale(factor, mscale_all_dim)^2 under YaRN, whose attention
 * factor (mscale / mscale_all_dim) multiplies the rotated parts only; then experts from
 * first_k_dense_replace on, with n_shared_experts * moe_intermediate_size shared columns.
 * V2 routes by the softmax, in groups only under topk_method group_limited_greedy, never
 * renormalized (DeepseekV2TopkRouter ignores norm_topk_prob); V3 by the sigmoid plus
 * e_score_correction_bias, always in groups (noaux_tc), renormalized when norm_topk_prob. Both
 * scale the weights by routed_scaling_factor. V3's rope_interleave false rotates halves. */
static int hf_deepseek_config(pgd_model *m, const cJSON *c, bool v3, const char *path,
                              pgd_err *err) {
    pgd_model_config *mc = &m->cfg;
    int32_t shared;
    const cJSON *qr = cJSON_GetObjectItemCaseSensitive(c, "q_lora_rank");
    if ((qr && cJSON_IsNull(qr) ? (mc->q_lora_rank = 0, 0)
                                : json_int(c, "q_lora_rank", 1536, &mc->q_lora_rank)) ||
        json_int(c, "kv_lora_rank", 512, &mc->kv_lora_rank) ||
        json_int(c, "qk_nope_head_dim", 128, &mc->qk_nope_dim) ||
        json_int(c, "qk_rope_head_dim", 64, &mc->rope_dim) ||
        json_int(c, "v_head_dim", 128, &mc->v_head_dim) ||
        json_int(c, "n_routed_experts", v3 ? 256 : 64, &mc->n_expert) ||
        json_int(c, "num_experts_per_tok", v3 ? 8 : 0, &mc->n_expert_used) ||
        json_int(c, "moe_intermediate_size", v3 ? 2048 : 1407, &mc->moe_ffn_dim) ||
        json_int(c, "n_shared_experts", v3 ? 1 : 2, &shared) ||
        json_int(c, "first_k_dense_replace", v3 ? 3 : 0, &mc->n_dense) ||
        json_int(c, "n_group", v3 ? 8 : 0, &mc->moe_n_group) ||
        json_int(c, "topk_group", v3 ? 4 : 0, &mc->moe_topk_group))
        return pgd_err_set(err, PGD_EFORMAT, "%s: a latent attention or expert size is not a "
                           "non-negative integer", path);
    if (mc->kv_lora_rank < 1 || mc->rope_dim < 2)
        return pgd_err_set(err, PGD_EFORMAT, "%s: kv_lora_rank and qk_rope_head_dim must be "
                           "positive", path);
    mc->head_dim = mc->kv_lora_rank + mc->rope_dim; /* the cached row (model.h) */
    mc->n_kv_head = 1;
    mc->moe_shared_dim = (int32_t)((int64_t)shared * mc->moe_ffn_dim > INT32_MAX
                                       ? -1 : shared * mc->moe_ffn_dim);
    mc->moe_scale = (float)json_num(c, "routed_scaling_factor", v3 ? 2.5 : 1.0);
    mc->moe_sigmoid = v3;
    mc->moe_norm = v3 && !cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(c, "norm_topk_prob"));
    const cJSON *tm = cJSON_GetObjectItemCaseSensitive(c, "topk_method");
    const char *method = cJSON_IsString(tm) ? tm->valuestring : "greedy";
    if (!v3 && strcmp(method, "greedy") && strcmp(method, "group_limited_greedy"))
        return pgd_err_set(err, PGD_EUNSUPPORTED, "%s: topk_method '%.32s' is not supported "
                           "(greedy and group_limited_greedy are)", path, method);
    if (!v3 && strcmp(method, "group_limited_greedy")) mc->moe_n_group = mc->moe_topk_group = 0;
    if (!v3 && !mc->n_expert_used)
        return pgd_err_set(err, PGD_EFORMAT, "%s: no num_experts_per_tok", path);
    if (mc->n_dense > mc->n_layer) mc->n_dense = mc->n_layer;
    if (mc->n_dense == mc->n_layer) mc->n_expert = 0; /* all dense */
    mc->rope_mode = v3 && cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(c, "rope_interleave"))
                        ? PGD_ROPE_NEOX : PGD_ROPE_NORM;
    double scale = 1.0 / sqrt((double)(mc->qk_nope_dim + mc->rope_dim));
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(c, "rope_parameters");
    if (!cJSON_IsObject(rp)) rp = cJSON_GetObjectItemCaseSensitive(c, "rope_scaling");
    const cJSON *rt = cJSON_GetObjectItemCaseSensitive(rp, "rope_type");
    if (!cJSON_IsString(rt)) rt = cJSON_GetObjectItemCaseSensitive(rp, "type");
    const char *rtype = cJSON_IsString(rt) ? rt->valuestring : "default";
    if (strcmp(rtype, "default") && strcmp(rtype, "yarn"))
        return pgd_err_set(err, PGD_EUNSUPPORTED, "%s: rope scaling '%.32s' with latent "
                           "attention is not supported (yarn is)", path, rtype);
    if (!strcmp(rtype, "yarn")) {
        double f = json_num(rp, "factor", 1);
        double ms_all = json_num(rp, "mscale_all_dim", 0);
        if (ms_all) scale *= yarn_mscale(f, ms_all) * yarn_mscale(f, ms_all);
    }
    mc->attn_scale = (float)scale;
    return PGD_OK;
}

/* The attention factor transformers' _compute_yarn_parameters gives a DeepSeek config: its
 * attention_factor, else get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim) when
 * both are set, else get_mscale(factor). */
static double deepseek_yarn_af(const cJSON *rs) {
    double f = json_num(rs, "factor", 1), af = num_of(rs, "attention_factor", 0, 0);
    double ms = json_num(rs, "mscale", 0), ms_all = json_num(rs, "mscale_all_dim", 0);
    if (af > 0) return af;
    return ms && ms_all ? yarn_mscale(f, ms) / yarn_mscale(f, ms_all) : yarn_mscale(f, 1);
}

/* Experts of a Mixtral, Qwen2-MoE or Qwen3-MoE config.json. Mixtral's are intermediate_size
 * wide and always rescaled; Qwen's are moe_intermediate_size wide, rescaled when norm_topk_prob,
 * and every layer has them unless mlp_only_layers or decoder_sparse_step say otherwise (which
 * Pagoda refuses: no released checkpoint uses them); Qwen2-MoE adds a shared expert of
 * shared_expert_intermediate_size, which then is the dense FFN width. transformers 5 writes
 * num_local_experts where Qwen's pgd__own configs say num_experts. */
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
int pgd__hf_config_file(pgd_model *m, const char *path, pgd_err *err) {
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
    } else if (!strcmp(type, "deepseek_v2") || !strcmp(type, "deepseek_v3")) {
        m->cfg.arch = PGD_ARCH_DEEPSEEK2;
    } else if (!strcmp(type, "gemma3_text") || !strcmp(type, "gemma2")) {
        m->cfg.arch = !strcmp(type, "gemma2") ? PGD_ARCH_GEMMA2 : PGD_ARCH_GEMMA3;
        if ((rc = hf_gemma_checks(c, m->cfg.arch == PGD_ARCH_GEMMA3, path, err))) goto done;
    } else {
        rc = pgd_err_set(err, PGD_EUNSUPPORTED, "%s: unsupported model_type '%.64s' (llama, "
                         "mistral, mixtral, qwen2, qwen2_moe, qwen3, qwen3_moe, smollm3, gemma2, "
                         "gemma3_text, deepseek_v2 and deepseek_v3 are)", path, type);
        goto done;
    }
    const cJSON *archs = cJSON_GetObjectItemCaseSensitive(c, "architectures");
    const cJSON *a0 = cJSON_IsArray(archs) ? cJSON_GetArrayItem(archs, 0) : NULL;
    pgd__model_names(&m->cfg, type, cJSON_IsString(a0) ? a0->valuestring : NULL);
    m->hf_untied = cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(c, "tie_word_embeddings"));
    /* q/k/v biases (Qwen2, attention_bias) are loaded when the checkpoint has them */
    m->cfg.rope_mode = PGD_ROPE_NEOX; /* (DeepSeek's: hf_deepseek_config) */
    int32_t heads, kv, hd;
    if (json_int(c, "vocab_size", 0, &m->cfg.n_vocab) || json_int(c, "hidden_size", 0, &m->cfg.dim) ||
        json_int(c, "num_hidden_layers", 0, &m->cfg.n_layer) ||
        json_int(c, "num_attention_heads", 0, &heads) ||
        json_int(c, "num_key_value_heads", heads, &kv) ||
        json_int(c, "intermediate_size", 0, &m->cfg.ffn_dim) ||
        json_int(c, "max_position_embeddings", 2048, &m->cfg.n_ctx) ||
        json_int(c, "head_dim", pgd__gemma_arch(m->cfg.arch) ? 256 /* Gemma{2,3}Config's */
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
    if (m->cfg.arch == PGD_ARCH_DEEPSEEK2 &&
        (rc = hf_deepseek_config(m, c, !strcmp(type, "deepseek_v3"), path, err)))
        goto done;
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
    bool gemma = pgd__gemma_arch(m->cfg.arch);
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
                             m->cfg.kv_lora_rank ? deepseek_yarn_af(rs)
                                                 : num_of(rs, "attention_factor", 0, 0)))
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

int pgd__hf_config(pgd_model *m, const char *dir, pgd_err *err) {
    char path[PATH_MAX];
    if ((size_t)snprintf(path, sizeof path, "%s/config.json", dir) >= sizeof path)
        return pgd_err_set(err, PGD_EINVAL, "%s: path too long", dir);
    return pgd__hf_config_file(m, path, err);
}
