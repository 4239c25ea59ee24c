/* The capacity arithmetic behind `pagoda kv-plan` and GET /v1/kv_plan: parameter count and
 * weight bytes per GPU, KV bytes per token, tokens and users that fit, and the decode roofline
 * (a decode step streams every GPU's weight shard plus the batch's KV once). */
#include "plan/kv_plan.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "model/gguf.h"
#include "model/model.h"
#include "util/mapfile.h"

static const int64_t plan_ctx[PGD_KV_PLAN_N_CTX] = {2048, 4096, 32768, 131072};

#define GIB 1073741824.0

/* GPU presets. Memory: the published capacity, which for HBM parts is binary (an "80GB" A100 or
 * H100 is 5 stacks of 16 GiB; nvidia-smi shows 81920 MiB). Bandwidth (decimal TB/s) and dense
 * (no 2:4 sparsity) BF16 tensor-core peak from NVIDIA's datasheets for the SXM parts:
 * A100 Tensor Core GPU datasheet (2021): 40GB 1,555 GB/s, 80GB 2,039 GB/s, 312 TFLOPS BF16;
 * H100 Tensor Core GPU datasheet (2023), H100 SXM: 3.35 TB/s, 989 TFLOPS BF16 (1,979 sparse);
 * H200 Tensor Core GPU datasheet (2024), H200 SXM: 141 GB, 4.8 TB/s, 989 TFLOPS BF16. */
static const struct {
    const char *name;
    double mem_gib, bw_tbs, tflops;
} presets[] = {
    {"a100-40gb", 40, 1.555, 312},
    {"a100-80gb", 80, 2.039, 312},
    {"h100-80gb", 80, 3.35, 989},
    {"h200-141gb", 141, 4.8, 989},
};

void pgd_kv_plan_input_init(pgd_kv_plan_input *in) {
    memset(in, 0, sizeof *in);
    in->weight_dtype = PGD_KV_PLAN_BF16;
    in->kv_dtype = PGD_KV_PLAN_BF16;
    in->gpu_mem_util = 0.90;
    in->roofline_ctx = 4096;
    in->hw.n_gpus = 1;
    in->hw.tp = 1;
    in->model.config_dtype = PGD_KV_PLAN_BF16;
}

int pgd_kv_plan_gpu_preset(const char *name, pgd_kv_plan_hw *hw) {
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        if (strcasecmp(name, presets[i].name)) continue;
        snprintf(hw->name, sizeof hw->name, "%s", presets[i].name);
        hw->mem_bytes = presets[i].mem_gib * GIB;
        hw->bandwidth_bytes_s = presets[i].bw_tbs * 1e12;
        hw->flops = presets[i].tflops * 1e12;
        return 0;
    }
    return PGD_ENOENT;
}

static const struct {
    const char *name;
    pgd_kv_plan_dtype d;
    double bytes;
} dtypes[] = {
    {"f32", PGD_KV_PLAN_F32, 4},       {"fp32", PGD_KV_PLAN_F32, 4},
    {"float32", PGD_KV_PLAN_F32, 4},   {"bf16", PGD_KV_PLAN_BF16, 2},
    {"bfloat16", PGD_KV_PLAN_BF16, 2}, {"fp16", PGD_KV_PLAN_F16, 2},
    {"f16", PGD_KV_PLAN_F16, 2},       {"float16", PGD_KV_PLAN_F16, 2},
    {"fp8", PGD_KV_PLAN_FP8, 1},       {"int8", PGD_KV_PLAN_INT8, 1},
    {"int4", PGD_KV_PLAN_INT4, 0.5},   {"gguf", PGD_KV_PLAN_GGUF, 0},
    {"auto", PGD_KV_PLAN_GGUF, 0},     {"q8_0", PGD_KV_PLAN_Q8_0, 34.0 / 32},
    {"q4_0", PGD_KV_PLAN_Q4_0, 18.0 / 32},
};

int pgd_kv_plan_dtype_parse(const char *s, pgd_kv_plan_dtype *out) {
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (!strcasecmp(s, dtypes[i].name)) {
            *out = dtypes[i].d;
            return 0;
        }
    return PGD_EINVAL;
}

const char *pgd_kv_plan_dtype_name(pgd_kv_plan_dtype d) {
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (dtypes[i].d == d) return dtypes[i].name;
    return "?";
}

static double dtype_bytes(pgd_kv_plan_dtype d) {
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (dtypes[i].d == d) return dtypes[i].bytes;
    return 0;
}

static void base_name(const char *path, char *out, size_t cap) {
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/')
        n--;
    size_t s = n;
    while (s > 0 && path[s - 1] != '/')
        s--;
    size_t len = n - s;
    const char *dot = NULL;
    for (size_t i = s; i < n; i++)
        if (path[i] == '.') dot = path + i;
    if (dot && (!strncmp(dot, ".json", 5) || !strncmp(dot, ".gguf", 5)))
        len = (size_t)(dot - (path + s));
    snprintf(out, cap, "%.*s", (int)len, path + s);
}

static int load_gguf(const char *path, pgd_kv_plan_model *m, pgd_err *err) {
    pgd_gguf g;
    int rc = pgd_gguf_open(&g, path, err);
    if (rc) return rc;
    pgd_str arch;
    char a[64], key[128];
    if ((rc = pgd_gguf_get_str(&g, "general.architecture", &arch)) || arch.len >= sizeof a) {
        rc = pgd_err_set(err, PGD_EFORMAT, "%s: missing general.architecture", path);
        goto done;
    }
    snprintf(a, sizeof a, "%.*s", (int)arch.len, arch.ptr);
    struct {
        const char *suffix;
        int64_t *dst;
        bool required;
    } keys[] = {
        {"embedding_length", &m->dim, true},
        {"block_count", &m->n_layer, true},
        {"feed_forward_length", &m->ffn_dim, true},
        {"attention.head_count", &m->n_head, true},
        {"attention.head_count_kv", &m->n_kv_head, false},
        {"attention.key_length", &m->head_dim, false},
        {"context_length", &m->n_ctx, false},
        {"vocab_size", &m->n_vocab, false},
        {"expert_count", &m->n_expert, false},
        {"expert_used_count", &m->n_expert_used, false},
        {"expert_feed_forward_length", &m->moe_ffn_dim, false},
        {"expert_shared_feed_forward_length", &m->shared_ffn_dim, false},
    };
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        uint32_t v;
        snprintf(key, sizeof key, "%s.%s", a, keys[i].suffix);
        int r = pgd_gguf_get_u32(&g, key, &v);
        if (r == PGD_ENOENT && !keys[i].required) continue;
        if (r) {
            rc = pgd_err_set(err, PGD_EFORMAT, "%s: %s %s", path,
                             r == PGD_ENOENT ? "missing metadata" : "invalid metadata", key);
            goto done;
        }
        *keys[i].dst = v;
    }
    if (!m->n_kv_head) m->n_kv_head = m->n_head;
    if (!m->head_dim && m->n_head) m->head_dim = m->dim / m->n_head;
    if (m->n_expert && !m->moe_ffn_dim) m->moe_ffn_dim = m->ffn_dim; /* Mixtral */
    if (!strcmp(a, "deepseek2")) {
        /* (as model/config.c reads it: key_length is the cached row, kv_lora_rank + rope;
         * key_length_mla and value_length_mla a head's query and value, or in files from
         * before the latent cache key_length and value_length) */
        int64_t klm = 0, vlm = 0, vl = 0, shared = 0;
        struct { const char *suffix; int64_t *dst; } dk[] = {
            {"attention.kv_lora_rank", &m->kv_lora_rank},
            {"attention.q_lora_rank", &m->q_lora_rank},
            {"rope.dimension_count", &m->rope_dim}, {"attention.key_length_mla", &klm},
            {"attention.value_length_mla", &vlm}, {"attention.value_length", &vl},
            {"leading_dense_block_count", &m->n_dense}, {"expert_shared_count", &shared},
        };
        for (size_t i = 0; i < sizeof dk / sizeof dk[0]; i++) {
            uint32_t v;
            snprintf(key, sizeof key, "%s.%s", a, dk[i].suffix);
            if (!pgd_gguf_get_u32(&g, key, &v)) *dk[i].dst = v;
        }
        int64_t qk = klm && vlm ? klm : m->head_dim;
        m->qk_nope_dim = qk - m->rope_dim;
        m->v_head_dim = klm && vlm ? vlm : vl;
        m->head_dim = m->kv_lora_rank + m->rope_dim;
        m->n_kv_head = 1;
        m->shared_ffn_dim = shared * m->moe_ffn_dim;
    }
    /* qwen2moe always has a shared expert, feed_forward_length wide without its own key */
    if (m->n_expert && !m->shared_ffn_dim && !strcmp(a, "qwen2moe")) m->shared_ffn_dim = m->ffn_dim;
    const pgd_gguf_tensor *emb = pgd_gguf_find_tensor(&g, "token_embd.weight");
    if (!m->n_vocab) {
        const pgd_gguf_kv *toks = pgd_gguf_find(&g, "tokenizer.ggml.tokens");
        if (emb)
            m->n_vocab = (int64_t)emb->ne[1];
        else if (toks && toks->type == PGD_GGUF_ARRAY)
            m->n_vocab = (int64_t)toks->arr_n;
    }
    m->tied_embeddings = pgd_gguf_find_tensor(&g, "output.weight") == NULL;
    m->attn_bias = pgd_gguf_find_tensor(&g, "blk.0.attn_q.bias") != NULL;
    /* The file's own bytes per parameter, so a Q4_1 file is planned at its real size. */
    double elems = 0, bytes = 0;
    for (uint64_t i = 0; i < g.n_tensors; i++) {
        const pgd_gguf_tensor *t = &g.tensors[i];
        elems += (double)t->ne[0] * (double)t->ne[1] * (double)t->ne[2] * (double)t->ne[3];
        bytes += (double)t->nbytes;
    }
    m->file_bytes_per_param = elems > 0 ? bytes / elems : 0;
done:
    pgd_gguf_close(&g);
    return rc;
}

static int json_i64(const cJSON *c, const char *key, int64_t dflt, int64_t *out) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(c, key);
    if (!x || cJSON_IsNull(x)) {
        *out = dflt;
        return 0;
    }
    if (!cJSON_IsNumber(x) || x->valuedouble != floor(x->valuedouble) || x->valuedouble < 0 ||
        x->valuedouble > 9007199254740992.0)
        return -1;
    *out = (int64_t)x->valuedouble;
    return 0;
}

static int load_hf_config(const char *path, pgd_kv_plan_model *m, pgd_err *err) {
    /* Multimodal configs nest the language model's numbers under text_config: the ones the
     * loader serves come unwrapped with the defaults it fills in, others (Ministral 3's) are read
     * as they are. */
    cJSON *c;
    bool wrapped;
    int rc = pgd_hf_config_read(path, true, &c, &wrapped, err);
    if (rc) return rc;
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(c, "text_config");
    const cJSON *src = cJSON_IsObject(tc) ? tc : c;
    int64_t heads = 0;
    const char *bad = NULL;
    if (json_i64(src, "num_hidden_layers", 0, &m->n_layer))
        bad = "num_hidden_layers";
    else if (json_i64(src, "hidden_size", 0, &m->dim))
        bad = "hidden_size";
    else if (json_i64(src, "num_attention_heads", 0, &heads))
        bad = "num_attention_heads";
    else if (json_i64(src, "num_key_value_heads", heads, &m->n_kv_head))
        bad = "num_key_value_heads";
    else if (json_i64(src, "head_dim", heads ? m->dim / heads : 0, &m->head_dim))
        bad = "head_dim";
    else if (json_i64(src, "intermediate_size", 0, &m->ffn_dim))
        bad = "intermediate_size";
    else if (json_i64(src, "vocab_size", 0, &m->n_vocab))
        bad = "vocab_size";
    else if (json_i64(src, "max_position_embeddings", 0, &m->n_ctx))
        bad = "max_position_embeddings";
    m->n_head = heads;
    if (!bad) {
        const char *need[] = {"num_hidden_layers", "hidden_size", "num_attention_heads",
                              "intermediate_size", "vocab_size"};
        for (size_t i = 0; i < sizeof need / sizeof need[0] && !bad; i++)
            if (!cJSON_GetObjectItemCaseSensitive(src, need[i])) bad = need[i];
        if (bad) {
            rc = pgd_err_set(err, PGD_EFORMAT, "%s: missing \"%s\"", path, bad);
            cJSON_Delete(c);
            return rc;
        }
    }
    if (bad) {
        rc = pgd_err_set(err, PGD_EFORMAT, "%s: \"%s\" must be a non-negative integer", path, bad);
        cJSON_Delete(c);
        return rc;
    }
    /* Experts: Mixtral's num_local_experts of intermediate_size, Qwen3-MoE's num_experts (or
     * num_local_experts, as transformers 5 writes it) of moe_intermediate_size, Qwen2-MoE's
     * with a shared expert, as the model loader reads them (an expert model_type must have
     * them: checked below). */
    const cJSON *mtype = cJSON_GetObjectItemCaseSensitive(src, "model_type");
    const char *mts = cJSON_IsString(mtype) ? mtype->valuestring : "";
    bool moe_type = !strcmp(mts, "mixtral") || !strcmp(mts, "qwen2_moe") ||
                    !strcmp(mts, "qwen3_moe");
    if ((moe_type || cJSON_GetObjectItemCaseSensitive(src, "num_experts_per_tok")) &&
        (json_i64(src, "num_local_experts", 0, &m->n_expert) ||
         (!m->n_expert && json_i64(src, "num_experts", 0, &m->n_expert)) ||
         json_i64(src, "num_experts_per_tok", 0, &m->n_expert_used) ||
         json_i64(src, "moe_intermediate_size", m->ffn_dim, &m->moe_ffn_dim) ||
         json_i64(src, "shared_expert_intermediate_size", 0, &m->shared_ffn_dim))) {
        rc = pgd_err_set(err, PGD_EFORMAT, "%s: an expert count or size is not a non-negative "
                         "integer", path);
        cJSON_Delete(c);
        return rc;
    }
    if (moe_type && (!m->n_expert || (!strcmp(mts, "qwen2_moe") && !m->shared_ffn_dim))) {
        rc = pgd_err_set(err, PGD_EFORMAT, "%s: a %s config needs its expert counts%s", path,
                         mts, m->n_expert ? " and shared_expert_intermediate_size" : "");
        cJSON_Delete(c);
        return rc;
    }
    if (!strcmp(mts, "deepseek_v2") || !strcmp(mts, "deepseek_v3")) {
        /* transformers' DeepseekV2Config / DeepseekV3Config defaults, as the loader reads them */
        bool v3 = !strcmp(mts, "deepseek_v3");
        const cJSON *qr = cJSON_GetObjectItemCaseSensitive(src, "q_lora_rank");
        int64_t shared = 0;
        if ((qr && cJSON_IsNull(qr) ? (m->q_lora_rank = 0, 0)
                                    : json_i64(src, "q_lora_rank", 1536, &m->q_lora_rank)) ||
            json_i64(src, "kv_lora_rank", 512, &m->kv_lora_rank) ||
            json_i64(src, "qk_rope_head_dim", 64, &m->rope_dim) ||
            json_i64(src, "qk_nope_head_dim", 128, &m->qk_nope_dim) ||
            json_i64(src, "v_head_dim", 128, &m->v_head_dim) ||
            json_i64(src, "n_routed_experts", v3 ? 256 : 64, &m->n_expert) ||
            json_i64(src, "num_experts_per_tok", v3 ? 8 : 0, &m->n_expert_used) ||
            json_i64(src, "moe_intermediate_size", v3 ? 2048 : 1407, &m->moe_ffn_dim) ||
            json_i64(src, "n_shared_experts", v3 ? 1 : 2, &shared) ||
            json_i64(src, "first_k_dense_replace", v3 ? 3 : 0, &m->n_dense) ||
            shared > (1 << 10)) {
            rc = pgd_err_set(err, PGD_EFORMAT, "%s: a latent attention or expert size is not a "
                             "non-negative integer", path);
            cJSON_Delete(c);
            return rc;
        }
        m->head_dim = m->kv_lora_rank + m->rope_dim;
        m->n_kv_head = 1;
        m->shared_ffn_dim = shared * m->moe_ffn_dim;
    }
    const cJSON *tie = cJSON_GetObjectItemCaseSensitive(c, "tie_word_embeddings");
    if (!tie) tie = cJSON_GetObjectItemCaseSensitive(src, "tie_word_embeddings");
    m->tied_embeddings = cJSON_IsTrue(tie);
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(src, "model_type");
    const cJSON *ab = cJSON_GetObjectItemCaseSensitive(src, "attention_bias");
    m->attn_bias =
        ab ? cJSON_IsTrue(ab)
           : (cJSON_IsString(mt) && (!strcmp(mt->valuestring, "qwen2") ||
                                     !strcmp(mt->valuestring, "qwen2_moe")));
    const cJSON *td = cJSON_GetObjectItemCaseSensitive(c, "torch_dtype");
    if (!td) td = cJSON_GetObjectItemCaseSensitive(c, "dtype"); /* transformers 5 */
    if (!cJSON_IsString(td) || pgd_kv_plan_dtype_parse(td->valuestring, &m->config_dtype))
        m->config_dtype = PGD_KV_PLAN_BF16;
    cJSON_Delete(c);
    return 0;
}

int pgd_kv_plan_model_load(const char *path, pgd_kv_plan_model *out, pgd_err *err) {
    memset(out, 0, sizeof *out);
    out->config_dtype = PGD_KV_PLAN_BF16;
    struct stat st;
    if (stat(path, &st)) return pgd_err_set(err, PGD_ENOENT, "%s: no such file or directory", path);
    base_name(path, out->name, sizeof out->name);
    if (S_ISDIR(st.st_mode)) {
        char cfg[4096];
        if ((size_t)snprintf(cfg, sizeof cfg, "%s/config.json", path) >= sizeof cfg)
            return pgd_err_set(err, PGD_EINVAL, "%s: path too long", path);
        return load_hf_config(cfg, out, err);
    }
    unsigned char magic[4] = {0};
    FILE *f = fopen(path, "rb");
    if (!f) return pgd_err_set(err, PGD_EIO, "%s: cannot open", path);
    size_t n = fread(magic, 1, 4, f);
    fclose(f);
    if (n == 4 && !memcmp(magic, "GGUF", 4)) return load_gguf(path, out, err);
    return load_hf_config(path, out, err);
}

static int check_model(const pgd_kv_plan_model *m, pgd_err *err) {
    /* Bounds keep every product below 2^62 in int64. */
    struct {
        const char *name;
        int64_t v, hi;
    } f[] = {
        {"layers", m->n_layer, 4096},         {"hidden size", m->dim, 1 << 20},
        {"attention heads", m->n_head, 4096}, {"KV heads", m->n_kv_head, 4096},
        {"head dim", m->head_dim, 4096},      {"FFN size", m->ffn_dim, 1 << 22},
        {"vocab size", m->n_vocab, 1 << 24},
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (f[i].v <= 0 || f[i].v > f[i].hi)
            return pgd_err_set(err, PGD_EINVAL, "%s: %s %lld out of range [1, %lld]", m->name,
                               f[i].name, (long long)f[i].v, (long long)f[i].hi);
    if (m->n_expert && (m->n_expert > 1024 || m->n_expert_used < 1 ||
                        m->n_expert_used > m->n_expert || m->moe_ffn_dim < 1 ||
                        m->moe_ffn_dim > (1 << 22) || m->shared_ffn_dim > (1 << 22)))
        return pgd_err_set(err, PGD_EINVAL, "%s: invalid experts (%lld of %lld, %lld wide)",
                           m->name, (long long)m->n_expert_used, (long long)m->n_expert,
                           (long long)m->moe_ffn_dim);
    if (m->kv_lora_rank && (m->kv_lora_rank > (1 << 16) || m->rope_dim < 1 ||
                            m->rope_dim > 4096 || m->qk_nope_dim < 1 || m->qk_nope_dim > 4096 ||
                            m->v_head_dim < 1 || m->v_head_dim > 4096 || m->q_lora_rank < 0 ||
                            m->q_lora_rank > (1 << 16) || m->n_dense < 0 ||
                            m->n_dense > m->n_layer))
        return pgd_err_set(err, PGD_EINVAL, "%s: invalid latent attention dimensions", m->name);
    if (m->n_head % m->n_kv_head)
        return pgd_err_set(err, PGD_EINVAL,
                           "%s: %lld attention heads are not a multiple of %lld "
                           "KV heads",
                           m->name, (long long)m->n_head, (long long)m->n_kv_head);
    return 0;
}

/* Weight bytes one GPU reads in a decode step of B sequences: an MoE model's layers read every
 * expert some sequence chose, E (1 - (1 - K/E)^B) of them when the K of E are drawn at random
 * (a real router is not uniform: an estimate). */
static double streamed_bytes(const pgd_kv_plan *p, double B) {
    const pgd_kv_plan_model *m = &p->in.model;
    if (!m->n_expert) return p->streamed_bytes_per_gpu;
    double e = (double)m->n_expert, k = (double)m->n_expert_used;
    return p->streamed_bytes_per_gpu + (e * (1.0 - pow(1.0 - k / e, B)) - k) *
                                           p->expert_bytes_per_gpu;
}

/* Step time of one decode step of B sequences at context c on one GPU of a replica: the larger
 * of streaming (weight shard + KV) at HBM bandwidth and the FLOPs at peak. */
static double step_seconds(const pgd_kv_plan *p, double B, double c, bool *compute_bound) {
    const pgd_kv_plan_model *m = &p->in.model;
    int32_t tp = p->in.hw.tp;
    double bytes = streamed_bytes(p, B) + B * c * p->kv_bytes_per_token_per_gpu;
    double norms = (double)(2 * m->n_layer * m->dim + m->dim);
    double flops =
        B * (2.0 * ((double)p->n_params_streamed - norms) / tp +
             4.0 * (double)m->n_layer * (double)(m->n_head / tp) * (double)m->head_dim * c);
    double tm = bytes / p->in.hw.bandwidth_bytes_s;
    double tc = p->in.hw.flops > 0 ? flops / p->in.hw.flops : 0;
    if (compute_bound) *compute_bound = tc > tm;
    return tc > tm ? tc : tm;
}

static double ops_per_byte(const pgd_kv_plan *p, double B, double c) {
    const pgd_kv_plan_model *m = &p->in.model;
    int32_t tp = p->in.hw.tp;
    double norms = (double)(2 * m->n_layer * m->dim + m->dim);
    double flops =
        B * (2.0 * ((double)p->n_params_streamed - norms) / tp +
             4.0 * (double)m->n_layer * (double)(m->n_head / tp) * (double)m->head_dim * c);
    return flops / (streamed_bytes(p, B) + B * c * p->kv_bytes_per_token_per_gpu);
}

int pgd_kv_plan_compute(const pgd_kv_plan_input *in, pgd_kv_plan *p, pgd_err *err) {
    memset(p, 0, sizeof *p);
    p->in = *in;
    const pgd_kv_plan_model *m = &in->model;
    const pgd_kv_plan_hw *hw = &in->hw;
    int rc = check_model(m, err);
    if (rc) return rc;
    if (hw->n_gpus < 1 || hw->tp < 1 || hw->n_gpus % hw->tp)
        return pgd_err_set(err, PGD_EINVAL,
                           "tensor-parallel size %d must divide the GPU count %d "
                           "(both >= 1)",
                           hw->tp, hw->n_gpus);
    if (m->n_head % hw->tp || (m->n_kv_head % hw->tp && hw->tp % m->n_kv_head))
        return pgd_err_set(err, PGD_EINVAL,
                           "tensor-parallel size %d must divide the %lld attention "
                           "heads and divide or be a multiple of the %lld KV heads",
                           hw->tp, (long long)m->n_head, (long long)m->n_kv_head);
    if (in->kv_budget_bytes <= 0 && !(hw->mem_bytes > 0))
        return pgd_err_set(err, PGD_EINVAL,
                           "GPU memory must be positive (--gpu or --gpu-memory-gb)");
    if (!(in->gpu_mem_util > 0 && in->gpu_mem_util <= 1))
        return pgd_err_set(err, PGD_EINVAL, "GPU memory utilization %g must be in (0, 1]",
                           in->gpu_mem_util);
    if (hw->bandwidth_bytes_s < 0 || hw->flops < 0 || in->reserve_bytes < 0 ||
        isnan(hw->bandwidth_bytes_s) || isnan(hw->flops))
        return pgd_err_set(err, PGD_EINVAL, "bandwidth, FLOP/s and reserve must not be negative");
    if (in->roofline_ctx < 1 || in->roofline_ctx > (1 << 24))
        return pgd_err_set(err, PGD_EINVAL, "roofline context %lld out of range",
                           (long long)in->roofline_ctx);
    if (in->kv_dtype == PGD_KV_PLAN_GGUF)
        return pgd_err_set(err, PGD_EINVAL,
                           "the KV dtype must be f32, bf16, fp16, fp8, int8 or int4");
    if (in->weight_dtype == PGD_KV_PLAN_GGUF) {
        if (!(m->file_bytes_per_param > 0))
            return pgd_err_set(err, PGD_EINVAL, "weight dtype 'gguf' needs a GGUF model file");
        p->weight_bytes_per_param = m->file_bytes_per_param;
    } else {
        p->weight_bytes_per_param = dtype_bytes(in->weight_dtype);
    }
    p->kv_bytes_per_elem = dtype_bytes(in->kv_dtype);

    /* Parameters: attention (Q, K, V, O [+ Q/K/V biases]), SwiGLU MLP, two RMSNorms per layer;
     * token embedding, LM head unless tied, final norm. */
    int64_t q_dim = m->n_head * m->head_dim, kv_dim = m->n_kv_head * m->head_dim;
    int64_t attn =
        2 * m->dim * q_dim + 2 * m->dim * kv_dim + (m->attn_bias ? q_dim + 2 * kv_dim : 0);
    if (m->kv_lora_rank) { /* q (through its LoRA), kv_a, kv_b, o and the two LoRA norms */
        int64_t qk = m->n_head * (m->qk_nope_dim + m->rope_dim), r = m->kv_lora_rank;
        attn = (m->q_lora_rank ? m->dim * m->q_lora_rank + m->q_lora_rank * qk + m->q_lora_rank
                               : m->dim * qk) +
               m->dim * (r + m->rope_dim) + r + r * m->n_head * (m->qk_nope_dim + m->v_head_dim) +
               m->n_head * m->v_head_dim * m->dim;
    }
    /* An MoE layer's FFN: a router and n_expert SwiGLU experts, n_expert_used of them read
     * (DeepSeek: the layers after the first n_dense, which are dense). */
    int64_t n_moe = m->n_expert ? m->n_layer - m->n_dense : 0;
    p->n_params_expert = n_moe * 3 * m->dim * m->moe_ffn_dim;
    int64_t ffn = m->n_expert ? m->dim * m->n_expert : 3 * m->dim * m->ffn_dim;
    if (m->n_expert && m->shared_ffn_dim)
        ffn += 3 * m->dim * m->shared_ffn_dim + (m->kv_lora_rank ? 0 : m->dim); /* (gate) */
    int64_t per_layer = attn + ffn + 2 * m->dim;
    int64_t embed = m->n_vocab * m->dim;
    int64_t norms = 2 * m->dim * m->n_layer + m->dim; /* replicated on every GPU under TP */
    p->n_params = (m->n_layer - n_moe) * (attn + 3 * m->dim * m->ffn_dim + 2 * m->dim) +
                  n_moe * per_layer + embed + (m->tied_embeddings ? 0 : embed) + m->dim +
                  m->n_expert * p->n_params_expert;
    /* Decode gathers B rows of an untied input embedding; everything else is read whole. */
    p->n_params_streamed = p->n_params - (m->tied_embeddings ? 0 : embed) -
                           (m->n_expert - m->n_expert_used) * p->n_params_expert;
    int32_t tp = hw->tp;
    double bpp = p->weight_bytes_per_param;
    p->weight_bytes_total = (double)p->n_params * bpp;
    /* Megatron-style sharding: every matrix, embedding and LM head split tp ways (vLLM's
     * VocabParallelEmbedding); norms replicated. */
    p->weight_bytes_per_gpu = ((double)(p->n_params - norms) / tp + (double)norms) * bpp;
    p->streamed_bytes_per_gpu = ((double)(p->n_params_streamed - norms) / tp + (double)norms) * bpp;
    p->expert_bytes_per_gpu = (double)p->n_params_expert / tp * bpp;

    p->kv_bytes_per_token =
        2.0 * (double)(m->n_layer * m->n_kv_head * m->head_dim) * p->kv_bytes_per_elem;
    /* With tp > KV heads each KV head is replicated so every GPU holds one. */
    int64_t kvh_gpu = m->n_kv_head >= tp ? m->n_kv_head / tp : 1;
    p->kv_bytes_per_token_per_gpu =
        2.0 * (double)(m->n_layer * kvh_gpu * m->head_dim) * p->kv_bytes_per_elem;
    if (m->kv_lora_rank) /* the latent cache: one row per token, K and V at once, on every GPU */
        p->kv_bytes_per_token = p->kv_bytes_per_token_per_gpu =
            (double)(m->n_layer * m->head_dim) * p->kv_bytes_per_elem;

    p->kv_budget_bytes_per_gpu =
        in->kv_budget_bytes > 0
            ? in->kv_budget_bytes
            : hw->mem_bytes * in->gpu_mem_util - in->reserve_bytes - p->weight_bytes_per_gpu;
    p->n_replicas = hw->n_gpus / tp;
    int64_t tok_rep =
        p->kv_budget_bytes_per_gpu > 0
            ? (int64_t)floor(p->kv_budget_bytes_per_gpu / p->kv_bytes_per_token_per_gpu)
            : 0;
    p->max_kv_tokens = tok_rep * p->n_replicas;
    for (int i = 0; i < PGD_KV_PLAN_N_CTX; i++) {
        p->ctx[i] = plan_ctx[i];
        p->max_users[i] = tok_rep / plan_ctx[i] * p->n_replicas;
    }

    p->has_roofline = hw->bandwidth_bytes_s > 0;
    if (p->has_roofline) {
        for (int i = 0; i < PGD_KV_PLAN_N_CTX; i++) {
            pgd_kv_plan_roof *r = &p->roof[i];
            double c = (double)plan_ctx[i];
            r->per_user_tok_s = 1.0 / step_seconds(p, 1, c, NULL);
            r->max_batch = tok_rep / plan_ctx[i];
            if (r->max_batch > 0)
                r->aggregate_tok_s = (double)r->max_batch * p->n_replicas /
                                     step_seconds(p, (double)r->max_batch, c, &r->compute_bound);
        }
        p->crossover_ops_per_byte = hw->flops / hw->bandwidth_bytes_s;
    }
    for (int i = 0; i < PGD_KV_PLAN_N_BATCH; i++) {
        p->batch[i] = (int64_t)1 << i;
        p->ops_per_byte[i] = ops_per_byte(p, (double)p->batch[i], (double)in->roofline_ctx);
    }
    return 0;
}

static const char *dtype_label(const pgd_kv_plan *p, pgd_kv_plan_dtype d) {
    return d == PGD_KV_PLAN_GGUF ? "gguf (as stored)" : pgd_kv_plan_dtype_name(d);
}

int pgd_kv_plan_to_json(const pgd_kv_plan *p, char **json_out, pgd_err *err) {
    const pgd_kv_plan_model *m = &p->in.model;
    const pgd_kv_plan_hw *hw = &p->in.hw;
    char k[32];
    cJSON *o = cJSON_CreateObject();
    cJSON *mo = cJSON_AddObjectToObject(o, "model");
    cJSON_AddStringToObject(mo, "name", m->name);
    cJSON_AddNumberToObject(mo, "num_layers", (double)m->n_layer);
    cJSON_AddNumberToObject(mo, "hidden_size", (double)m->dim);
    cJSON_AddNumberToObject(mo, "num_attention_heads", (double)m->n_head);
    cJSON_AddNumberToObject(mo, "num_key_value_heads", (double)m->n_kv_head);
    cJSON_AddNumberToObject(mo, "head_dim", (double)m->head_dim);
    cJSON_AddNumberToObject(mo, "intermediate_size", (double)m->ffn_dim);
    cJSON_AddNumberToObject(mo, "vocab_size", (double)m->n_vocab);
    cJSON_AddBoolToObject(mo, "tie_word_embeddings", m->tied_embeddings);
    cJSON_AddNumberToObject(mo, "max_position_embeddings", (double)m->n_ctx);
    cJSON_AddNumberToObject(mo, "num_parameters", (double)p->n_params);
    cJSON_AddNumberToObject(mo, "num_active_parameters", (double)p->n_params_streamed);
    cJSON_AddNumberToObject(mo, "num_experts", (double)m->n_expert);
    cJSON_AddNumberToObject(mo, "num_experts_per_tok", (double)m->n_expert_used);
    cJSON_AddNumberToObject(mo, "kv_lora_rank", (double)m->kv_lora_rank);
    cJSON_AddNumberToObject(mo, "qk_rope_head_dim", (double)m->rope_dim);
    cJSON_AddNumberToObject(mo, "moe_intermediate_size", (double)m->moe_ffn_dim);
    cJSON *ho = cJSON_AddObjectToObject(o, "hardware");
    cJSON_AddStringToObject(ho, "gpu", hw->name[0] ? hw->name : "custom");
    cJSON_AddNumberToObject(ho, "memory_bytes_per_gpu", hw->mem_bytes);
    cJSON_AddNumberToObject(ho, "bandwidth_bytes_per_s", hw->bandwidth_bytes_s);
    cJSON_AddNumberToObject(ho, "bf16_flops", hw->flops);
    cJSON_AddNumberToObject(ho, "num_gpus", hw->n_gpus);
    cJSON_AddNumberToObject(ho, "tensor_parallel_size", hw->tp);
    cJSON_AddNumberToObject(ho, "replicas", p->n_replicas);
    cJSON_AddNumberToObject(ho, "gpu_memory_utilization", p->in.gpu_mem_util);
    cJSON_AddNumberToObject(ho, "reserve_bytes_per_gpu", p->in.reserve_bytes);
    cJSON_AddStringToObject(o, "weight_dtype", dtype_label(p, p->in.weight_dtype));
    cJSON_AddStringToObject(o, "kv_dtype", pgd_kv_plan_dtype_name(p->in.kv_dtype));
    cJSON_AddNumberToObject(o, "weight_bytes_per_param", p->weight_bytes_per_param);
    cJSON_AddNumberToObject(o, "weight_bytes_total", p->weight_bytes_total);
    cJSON_AddNumberToObject(o, "weight_bytes_per_gpu", p->weight_bytes_per_gpu);
    cJSON_AddNumberToObject(o, "weight_bytes_streamed_per_gpu", p->streamed_bytes_per_gpu);
    cJSON_AddNumberToObject(o, "kv_bytes_per_token", p->kv_bytes_per_token);
    cJSON_AddNumberToObject(o, "kv_bytes_per_token_per_gpu", p->kv_bytes_per_token_per_gpu);
    cJSON_AddNumberToObject(o, "kv_budget_bytes_per_gpu", p->kv_budget_bytes_per_gpu);
    cJSON_AddBoolToObject(o, "weights_fit", p->kv_budget_bytes_per_gpu > 0);
    cJSON_AddNumberToObject(o, "max_kv_tokens", (double)p->max_kv_tokens);
    cJSON *uo = cJSON_AddObjectToObject(o, "max_users");
    for (int i = 0; i < PGD_KV_PLAN_N_CTX; i++) {
        snprintf(k, sizeof k, "%lld", (long long)p->ctx[i]);
        cJSON_AddNumberToObject(uo, k, (double)p->max_users[i]);
    }
    if (p->has_roofline) {
        cJSON *ro = cJSON_AddObjectToObject(o, "decode_roofline_tok_s");
        for (int i = 0; i < PGD_KV_PLAN_N_CTX; i++) {
            const pgd_kv_plan_roof *r = &p->roof[i];
            snprintf(k, sizeof k, "%lld", (long long)p->ctx[i]);
            cJSON *e = cJSON_AddObjectToObject(ro, k);
            cJSON_AddNumberToObject(e, "batch_1_per_user", r->per_user_tok_s);
            cJSON_AddNumberToObject(e, "max_batch_per_replica", (double)r->max_batch);
            cJSON_AddNumberToObject(e, "aggregate_at_max_batch", r->aggregate_tok_s);
            cJSON_AddNumberToObject(
                e, "per_user_at_max_batch",
                r->max_batch ? r->aggregate_tok_s / (double)r->max_batch / p->n_replicas : 0);
            cJSON_AddStringToObject(e, "bound", r->compute_bound ? "compute" : "memory");
        }
        cJSON_AddNumberToObject(o, "crossover_ops_per_byte", p->crossover_ops_per_byte);
    } else {
        cJSON_AddNullToObject(o, "decode_roofline_tok_s");
        cJSON_AddNullToObject(o, "crossover_ops_per_byte");
    }
    cJSON *ob = cJSON_AddObjectToObject(o, "ops_per_byte");
    cJSON_AddNumberToObject(ob, "context", (double)p->in.roofline_ctx);
    cJSON *bb = cJSON_AddObjectToObject(ob, "by_batch");
    for (int i = 0; i < PGD_KV_PLAN_N_BATCH; i++) {
        snprintf(k, sizeof k, "%lld", (long long)p->batch[i]);
        cJSON_AddNumberToObject(bb, k, p->ops_per_byte[i]);
    }
    char *js = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!js) return pgd_err_set(err, PGD_ENOMEM, "out of memory printing the plan");
    *json_out = js;
    return 0;
}

int pgd_kv_plan_json(const pgd_kv_plan_input *in, char **json_out, pgd_err *err) {
    pgd_kv_plan p;
    int rc = pgd_kv_plan_compute(in, &p, err);
    return rc ? rc : pgd_kv_plan_to_json(&p, json_out, err);
}

static void print_bytes(FILE *f, double b) {
    if (b >= GIB || b <= -GIB)
        fprintf(f, "%.2f GiB", b / GIB);
    else if (b >= 1048576.0 || b <= -1048576.0)
        fprintf(f, "%.2f MiB", b / 1048576.0);
    else
        fprintf(f, "%.2f KiB", b / 1024.0);
}

void pgd_kv_plan_print(const pgd_kv_plan *p, FILE *f) {
    const pgd_kv_plan_model *m = &p->in.model;
    const pgd_kv_plan_hw *hw = &p->in.hw;
    fprintf(f,
            "model       %s: %lld layers, hidden %lld, %lld heads / %lld KV heads x %lld, "
            "FFN %lld, vocab %lld%s, %.3f B parameters, context %lld\n",
            m->name, (long long)m->n_layer, (long long)m->dim, (long long)m->n_head,
            (long long)m->n_kv_head, (long long)m->head_dim, (long long)m->ffn_dim,
            (long long)m->n_vocab, m->tied_embeddings ? " (tied)" : "", (double)p->n_params / 1e9,
            (long long)m->n_ctx);
    if (m->n_expert)
        fprintf(f, "experts     %lld per layer of FFN %lld, %lld per token: %.3f B active "
                "parameters\n", (long long)m->n_expert, (long long)m->moe_ffn_dim,
                (long long)m->n_expert_used, (double)p->n_params_streamed / 1e9);
    if (m->kv_lora_rank)
        fprintf(f, "latent      multi-head latent attention: a token caches its %lld-wide latent "
                "and %lld-wide rope key per layer, not K and V per head\n",
                (long long)m->kv_lora_rank, (long long)m->rope_dim);
    fprintf(f, "hardware    %d x %s: ", hw->n_gpus, hw->name[0] ? hw->name : "custom GPU");
    if (p->in.kv_budget_bytes > 0)
        fprintf(f, "KV budget given directly");
    else
        print_bytes(f, hw->mem_bytes);
    fprintf(f, ", %.3f TB/s, %.0f TFLOP/s BF16; tensor parallel %d -> %d replica%s\n",
            hw->bandwidth_bytes_s / 1e12, hw->flops / 1e12, hw->tp, p->n_replicas,
            p->n_replicas == 1 ? "" : "s");
    fprintf(f, "weights     %s (%.3f B/param): ", dtype_label(p, p->in.weight_dtype),
            p->weight_bytes_per_param);
    print_bytes(f, p->weight_bytes_total);
    fprintf(f, " total, ");
    print_bytes(f, p->weight_bytes_per_gpu);
    fprintf(f, " per GPU\n");
    fprintf(f, "KV cache    %s: %.0f bytes per token (", pgd_kv_plan_dtype_name(p->in.kv_dtype),
            p->kv_bytes_per_token);
    print_bytes(f, p->kv_bytes_per_token);
    fprintf(f, "), %.0f per GPU\n", p->kv_bytes_per_token_per_gpu);
    fprintf(f, "KV budget   ");
    print_bytes(f, p->kv_budget_bytes_per_gpu);
    if (p->in.kv_budget_bytes > 0)
        fprintf(f, " per GPU (given)\n");
    else
        fprintf(f, " per GPU = memory x %.2f - reserve %.0f B - weights\n", p->in.gpu_mem_util,
                p->in.reserve_bytes);
    if (p->kv_budget_bytes_per_gpu <= 0) fprintf(f, "            the weights do not fit\n");
    fprintf(f, "tokens fit  %lld\n\n", (long long)p->max_kv_tokens);
    fprintf(f, "%8s %8s %18s %12s %18s %8s\n", "context", "users", "batch-1 tok/s/user",
            "max batch", "aggregate tok/s", "bound");
    for (int i = 0; i < PGD_KV_PLAN_N_CTX; i++) {
        const pgd_kv_plan_roof *r = &p->roof[i];
        fprintf(f, "%8lld %8lld", (long long)p->ctx[i], (long long)p->max_users[i]);
        if (p->has_roofline)
            fprintf(f, " %18.1f %12lld %18.1f %8s", r->per_user_tok_s, (long long)r->max_batch,
                    r->aggregate_tok_s,
                    r->max_batch ? (r->compute_bound ? "compute" : "memory") : "-");
        if (m->n_ctx && p->ctx[i] > m->n_ctx)
            fprintf(f, "  (beyond the model's %lld)", (long long)m->n_ctx);
        fprintf(f, "\n");
    }
    fprintf(f, "\nops:byte of a decode step at context %lld", (long long)p->in.roofline_ctx);
    if (p->has_roofline) fprintf(f, " (the GPU's crossover: %.1f)", p->crossover_ops_per_byte);
    fprintf(f, "\n");
    for (int i = 0; i < PGD_KV_PLAN_N_BATCH; i++)
        fprintf(f, "  batch %5lld: %8.1f%s\n", (long long)p->batch[i], p->ops_per_byte[i],
                p->has_roofline && p->ops_per_byte[i] >= p->crossover_ops_per_byte
                    ? "  compute-bound"
                    : "");
    fprintf(f, "\nAssumes: ideal tensor parallelism (no communication), weights sharded evenly "
               "(norms replicated), no activation memory beyond the reserve, roofline = max(bytes "
               "/ bandwidth, FLOPs / BF16 peak) per decode step (FP8/INT8 math would double the\n"
               "peak), every sequence of a batch at the full context.\n");
}
