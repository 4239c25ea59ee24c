/* Reading PEFT LoRA adapters (lora.h). */
#include <cjson/cJSON.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "backend/cpu/quant.h"
#include "model/lora.h"
#include "util/mapfile.h"

/* PEFT's module names, in PGD_LAYER_MATRICES order. */
static const char *const k_modules[PGD_LAYER_N_MATRICES] = {
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
    "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};

/* A tensor's name as PEFT saves it: <prefix>.layers.<L>.<module>.lora_<A|B>.weight, where the
 * prefix names the language model (base_model.model.model, or a multimodal model's
 * ...language_model[.model]); anything else (embeddings, the LM head, a vision tower's layers)
 * is not an adapter of ours. Returns false when the name is not of that form. */
static bool parse_name(const char *name, int32_t *layer, int *mi, int *is_b) {
    const char *l = strstr(name, ".layers.");
    if (!l) return false;
    const char *dot = l; /* the prefix's last component must be model or language_model */
    while (dot > name && dot[-1] != '.') dot--;
    size_t plen = (size_t)(l - dot);
    if (!((plen == 5 && !strncmp(dot, "model", 5)) ||
          (plen == 14 && !strncmp(dot, "language_model", 14))))
        return false;
    const char *p = l + 8;
    char *end;
    if (*p < '0' || *p > '9') return false;
    long v = strtol(p, &end, 10);
    if (*end != '.' || v > INT32_MAX) return false;
    *layer = (int32_t)v;
    p = end + 1;
    for (int i = 0; i < PGD_LAYER_N_MATRICES; i++) {
        size_t n = strlen(k_modules[i]);
        if (strncmp(p, k_modules[i], n)) continue;
        const char *s = p + n;
        if (!strcmp(s, ".lora_A.weight") || !strcmp(s, ".lora_B.weight")) {
            *mi = i;
            *is_b = s[6] == 'B';
            return true;
        }
    }
    return false;
}

/* A tensor name made printable for a one-line error (names are long: up to 160 bytes kept). */
static const char *safe_name(const char *s, char *buf, size_t cap) {
    size_t i = 0;
    for (; s[i] && i + 4 < cap; i++) buf[i] = (unsigned char)s[i] < 0x20 ? '?' : s[i];
    strcpy(buf + i, s[i] ? "..." : "");
    return buf;
}

/* adapter_config.json: the rank and scale; what cannot be honoured is refused. */
static int read_config(const char *dir, pgd_lora *l, pgd_err *err) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    cJSON *c;
    int rc = pgd__json_object_read(path, &c, err);
    if (rc && rc != PGD_EFORMAT)
        return pgd_err_set(err, rc, "%s: cannot read (a LoRA adapter is a PEFT directory with "
                           "adapter_config.json and adapter_model.safetensors)", path);
    if (rc) return rc;
    const cJSON *pt = cJSON_GetObjectItemCaseSensitive(c, "peft_type");
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(c, "r");
    const cJSON *alpha = cJSON_GetObjectItemCaseSensitive(c, "lora_alpha");
    const cJSON *bias = cJSON_GetObjectItemCaseSensitive(c, "bias");
    /* keys whose any value but false/null/empty changes the computation */
    static const char *const must_be_off[] = {
        "use_dora", "lora_bias", "fan_in_fan_out", "modules_to_save", "rank_pattern",
        "alpha_pattern", "layer_replication", "alora_invocation_tokens", "target_parameters",
        "trainable_token_indices", "arrow_config", "use_qalora", "use_bdlora",
        "monteclora_config", "kasa_config", "velora_config"};
    if (pt && !(cJSON_IsString(pt) && !strcmp(pt->valuestring, "LORA"))) {
        rc = pgd_err_set(err, PGD_EUNSUPPORTED, "%s: peft_type is not LORA", path);
        goto done;
    }
    if (!cJSON_IsNumber(r) || r->valuedouble < 1 || r->valuedouble > PGD_LORA_MAX_RANK ||
        r->valuedouble != (double)(int32_t)r->valuedouble) {
        rc = pgd_err_set(err, PGD_EFORMAT, "%s: \"r\" must be an integer rank in 1..%d", path,
                         PGD_LORA_MAX_RANK);
        goto done;
    }
    l->rank = (int32_t)r->valuedouble;
    double a = 8; /* PEFT's default lora_alpha */
    if (alpha && !cJSON_IsNull(alpha)) {
        if (!cJSON_IsNumber(alpha) || !isfinite(alpha->valuedouble)) {
            rc = pgd_err_set(err, PGD_EFORMAT, "%s: \"lora_alpha\" is not a number", path);
            goto done;
        }
        a = alpha->valuedouble;
    }
    bool rs = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c, "use_rslora"));
    l->scale = (float)(rs ? a / sqrt((double)l->rank) : a / (double)l->rank);
    if (bias && !cJSON_IsNull(bias) &&
        !(cJSON_IsString(bias) && !strcmp(bias->valuestring, "none"))) {
        rc = pgd_err_set(err, PGD_EUNSUPPORTED, "%s: \"bias\" must be \"none\" (trained biases "
                         "are not applied)", path);
        goto done;
    }
    for (size_t i = 0; i < sizeof must_be_off / sizeof must_be_off[0]; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(c, must_be_off[i]);
        bool off = !v || cJSON_IsNull(v) || cJSON_IsFalse(v) ||
                   ((cJSON_IsObject(v) || cJSON_IsArray(v)) && !v->child);
        if (!off) {
            rc = pgd_err_set(err, PGD_EUNSUPPORTED, "%s: \"%s\" is not supported", path,
                             must_be_off[i]);
            goto done;
        }
    }
done:
    cJSON_Delete(c);
    return rc;
}

/* Tensor t (rows x cols of F32, F16 or BF16) as a new buffer of elements of type `as`: the
 * file's bytes when `as` is t's type, else widened to F32. */
static void *copy_tensor(const pgd_st_tensor *t, pgd_type as) {
    size_t rows = (size_t)t->shape[0], cols = (size_t)t->shape[1];
    void *f = malloc(rows * cols * pgd_dtype_size(as));
    if (!f) return NULL;
    if (as == t->type) { /* (the mapping may be misaligned for the type: copied bytewise) */
        memcpy(f, t->data, rows * cols * pgd_dtype_size(as));
        return f;
    }
    size_t es = pgd_dtype_size(t->type);
    for (size_t i = 0; i < rows; i++)
        pgd_dequantize_row(t->type, (const char *)t->data + i * cols * es, (float *)f + i * cols,
                           (int64_t)cols);
    return f;
}

/* A new (cols, rows) copy of the (rows, cols) matrix b of es-byte elements, or NULL. */
static void *transposed(const void *b, size_t rows, size_t cols, size_t es) {
    char *t = malloc(rows * cols * es);
    if (!t) return NULL;
    for (size_t i = 0; i < rows; i++)
        for (size_t j = 0; j < cols; j++)
            memcpy(t + (j * rows + i) * es, (const char *)b + (i * cols + j) * es, es);
    return t;
}

/* llama.cpp's converter stores a llama file's Q/K rows of each head as (pairs, 2) instead of
 * (2, halves); B's rows (rank elements of es bytes) follow the model's (pgd_rope_mode NORM). */
static int permute_rows(void *b, int32_t n_head, int32_t head_dim, int32_t rank, size_t es) {
    size_t row = (size_t)rank * es, half = (size_t)head_dim / 2;
    char *tmp = malloc((size_t)head_dim * row);
    if (!tmp) return PGD_ENOMEM;
    for (int32_t h = 0; h < n_head; h++) {
        char *hb = (char *)b + (size_t)h * head_dim * row;
        memcpy(tmp, hb, (size_t)head_dim * row);
        for (size_t i = 0; i < half; i++)
            for (size_t j = 0; j < 2; j++)
                memcpy(hb + (2 * i + j) * row, tmp + (j * half + i) * row, row);
    }
    free(tmp);
    return PGD_OK;
}

bool pgd_lora_matrix_shape(const pgd_model *m, int32_t il, int mi, int64_t *n_out,
                           int64_t *n_in) {
    const pgd_model_config *c = &m->cfg;
    int64_t q = (int64_t)c->n_head * c->head_dim, kv = (int64_t)c->n_kv_head * c->head_dim;
    if (mi >= 4 && m->layers[il].moe.n_expert) return false;
    int64_t outs[] = {q, kv, kv, c->dim, c->ffn_dim, c->ffn_dim, c->dim};
    int64_t ins[] = {c->dim, c->dim, c->dim, q, c->dim, c->dim, c->ffn_dim};
    *n_out = outs[mi];
    *n_in = ins[mi];
    return true;
}

static int read_tensors(const char *dir, const pgd_model *m, pgd_lora *l, pgd_err *err) {
    char path[PATH_MAX];
    struct stat sb;
    snprintf(path, sizeof path, "%s/adapter_model.bin", dir);
    bool has_bin = stat(path, &sb) == 0;
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    if (stat(path, &sb) != 0 && has_bin)
        return pgd_err_set(err, PGD_EUNSUPPORTED, "%s/adapter_model.bin: pickled weights are not "
                           "read; save the adapter as safetensors (PEFT's default)", dir);
    pgd_safetensors st;
    int rc = pgd_st_open_file(&st, path, err);
    if (rc) return rc;
    int32_t nl = m->cfg.n_layer, nm = PGD_LAYER_N_MATRICES;
    const pgd_st_tensor **ab = calloc((size_t)nl * nm * 2, sizeof *ab); /* [il][mi][A, B] */
    char nb[168];
    if (!ab) {
        rc = pgd_err_set(err, PGD_ENOMEM, "%s: out of memory", path);
        goto done;
    }
    for (size_t i = 0; i < st.n_tensors; i++) {
        const pgd_st_tensor *t = &st.tensors[i];
        int32_t il;
        int mi, is_b;
        if (!parse_name(t->name, &il, &mi, &is_b)) {
            rc = pgd_err_set(err, PGD_EUNSUPPORTED, "%s: tensor '%s' is not a LoRA matrix of a "
                             "q/k/v/o_proj or gate/up/down_proj layer (the only ones applied)",
                             path, safe_name(t->name, nb, sizeof nb));
            goto done;
        }
        int64_t n_out, n_in;
        if (il >= nl || !pgd_lora_matrix_shape(m, il, mi, &n_out, &n_in)) {
            rc = pgd_err_set(err, PGD_EUNSUPPORTED, "%s: tensor '%s': the model has no such "
                             "matrix", path, safe_name(t->name, nb, sizeof nb));
            goto done;
        }
        uint64_t want0 = is_b ? (uint64_t)n_out : (uint64_t)l->rank;
        uint64_t want1 = is_b ? (uint64_t)l->rank : (uint64_t)n_in;
        if (t->n_dims != 2 || t->shape[0] != want0 || t->shape[1] != want1) {
            rc = pgd_err_set(err, PGD_EFORMAT, "%s: tensor '%s' should have shape [%" PRIu64
                             ", %" PRIu64 "] (rank %d, this model's matrix)", path,
                             safe_name(t->name, nb, sizeof nb), want0, want1, l->rank);
            goto done;
        }
        const pgd_st_tensor **slot = &ab[((size_t)il * nm + mi) * 2 + is_b];
        if (*slot) {
            rc = pgd_err_set(err, PGD_EFORMAT, "%s: tensor '%s' appears twice", path,
                             safe_name(t->name, nb, sizeof nb));
            goto done;
        }
        *slot = t;
    }
    l->n_layer = nl;
    l->m = calloc((size_t)nl * nm, sizeof *l->m);
    if (!l->m) {
        rc = pgd_err_set(err, PGD_ENOMEM, "%s: out of memory", path);
        goto done;
    }
    for (int32_t k = 0; k < nl * nm; k++) {
        const pgd_st_tensor *ta = ab[2 * k], *tb = ab[2 * k + 1];
        if (!ta && !tb) continue;
        if (!ta || !tb) {
            rc = pgd_err_set(err, PGD_EFORMAT, "%s: layer %d's %s has a lora_%s but no lora_%s",
                             path, k / nm, k_modules[k % nm], ta ? "A" : "B", ta ? "B" : "A");
            goto done;
        }
        pgd_lora_matrix *lm = &l->m[k];
        lm->type = ta->type == tb->type ? ta->type : PGD_TYPE_F32;
        size_t es = pgd_dtype_size(lm->type);
        lm->a = copy_tensor(ta, lm->type);
        void *b = copy_tensor(tb, lm->type);
        int mi = k % nm;
        if (b && m->cfg.rope_mode == PGD_ROPE_NORM && mi <= 1 &&
            permute_rows(b, mi == 0 ? m->cfg.n_head : m->cfg.n_kv_head, m->cfg.head_dim,
                         l->rank, es))
            free(b), b = NULL;
        lm->bt = b ? transposed(b, (size_t)tb->shape[0], (size_t)l->rank, es) : NULL;
        free(b);
        if (!lm->a || !lm->bt) {
            rc = pgd_err_set(err, PGD_ENOMEM, "%s: out of memory", path);
            goto done;
        }
        l->n_matrices++;
    }
    if (!l->n_matrices)
        rc = pgd_err_set(err, PGD_EFORMAT, "%s: no LoRA matrices in the file", path);
done:
    free(ab);
    pgd_st_close(&st);
    return rc;
}

int pgd_lora_load(const char *dir, const pgd_model *m, pgd_lora **out, pgd_err *err) {
    *out = NULL;
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return pgd_err_set(err, PGD_ENOENT, "%s: not a LoRA adapter directory (PEFT's "
                           "adapter_config.json and adapter_model.safetensors)", dir);
    pgd_lora *l = calloc(1, sizeof *l);
    if (!l || !(l->path = strdup(dir))) {
        free(l);
        return pgd_err_set(err, PGD_ENOMEM, "%s: out of memory", dir);
    }
    int rc = read_config(dir, l, err);
    if (!rc) rc = read_tensors(dir, m, l, err);
    if (rc) {
        pgd_lora_free(l);
        return rc;
    }
    *out = l;
    return PGD_OK;
}

void pgd_lora_free(pgd_lora *l) {
    if (!l) return;
    for (int32_t k = 0; l->m && k < l->n_layer * PGD_LAYER_N_MATRICES; k++) {
        free(l->m[k].a);
        free(l->m[k].bt);
    }
    free(l->m);
    free(l->path);
    free(l);
}
