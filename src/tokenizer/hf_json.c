/* Loading a Hugging Face tokenizer.json (+ tokenizer_config.json): a "BPE" model whose
 * normalizer / pre_tokenizer / decoder combination is one we implement exactly; anything else
 * is refused with a message naming the part we do not know. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"
#include "util/mapfile.h"

static const char LLAMA3_RE[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char QWEN2_RE[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char TEKKEN_RE[] =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+|"
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*|"
    "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char GPT2_RE[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static const char *jstr(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static bool jtype(const cJSON *o, const char *type) {
    const char *t = jstr(o, "type");
    return t && strcmp(t, type) == 0;
}

static bool jbool(const cJSON *o, const char *key, bool dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : dflt;
}

/* Classifies the byte-level pre-tokenizer; -1 if not one we implement. */
static int byte_level_pre(const cJSON *pre) {
    if (jtype(pre, "ByteLevel")) return jbool(pre, "use_regex", true) ? PGD_PRE_GPT2 : -1;
    if (!jtype(pre, "Sequence")) return -1;
    const cJSON *seq = cJSON_GetObjectItemCaseSensitive(pre, "pretokenizers");
    if (cJSON_GetArraySize(seq) != 2) return -1;
    const cJSON *a = cJSON_GetArrayItem(seq, 0), *b = cJSON_GetArrayItem(seq, 1);
    if (!jtype(b, "ByteLevel")) return -1;
    if (jtype(a, "Digits") && jbool(a, "individual_digits", false) && jbool(b, "use_regex", true))
        return PGD_PRE_SMOLLM;
    if (jtype(a, "Split") && !jbool(b, "use_regex", true)) {
        const char *beh = jstr(a, "behavior");
        const char *re = jstr(cJSON_GetObjectItemCaseSensitive(a, "pattern"), "Regex");
        if (!re || !beh || strcmp(beh, "Isolated") != 0 || jbool(a, "invert", false)) return -1;
        if (strcmp(re, LLAMA3_RE) == 0) return PGD_PRE_LLAMA3;
        if (strcmp(re, QWEN2_RE) == 0) return PGD_PRE_QWEN2;
        if (strcmp(re, TEKKEN_RE) == 0) return PGD_PRE_TEKKEN;
        if (strcmp(re, GPT2_RE) == 0) return PGD_PRE_GPT2;
    }
    return -1;
}

/* SentencePiece normalizer: Sequence[Prepend("▁"), Replace(" ", "▁")] (or just the Replace). */
static int spm_normalizer(const cJSON *n, bool *prefix) {
    *prefix = false;
    if (!n || cJSON_IsNull(n)) return 0;
    const cJSON *seq =
        jtype(n, "Sequence") ? cJSON_GetObjectItemCaseSensitive(n, "normalizers") : NULL;
    int cnt = seq ? cJSON_GetArraySize(seq) : 1;
    for (int i = 0; i < cnt; i++) {
        const cJSON *e = seq ? cJSON_GetArrayItem(seq, i) : n;
        if (jtype(e, "Prepend")) {
            const char *p = jstr(e, "prepend");
            if (!p || strcmp(p, "\xe2\x96\x81") != 0) return -1;
            *prefix = true;
        } else if (jtype(e, "Replace")) {
            const char *c = jstr(e, "content");
            const char *s = jstr(cJSON_GetObjectItemCaseSensitive(e, "pattern"), "String");
            if (!c || !s || strcmp(s, " ") != 0 || strcmp(c, "\xe2\x96\x81") != 0) return -1;
        } else {
            return -1;
        }
    }
    return 0;
}

/* bos_token / eos_token in tokenizer_config.json: a string or {"content": ...}. */
static const char *config_token(const cJSON *cfg, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (cJSON_IsString(v)) return v->valuestring;
    if (cJSON_IsObject(v)) return jstr(v, "content");
    return NULL;
}

static int parse_file(const char *path, cJSON **out, pgd_err *err) {
    char *buf = NULL;
    size_t len = 0;
    int rc = pgd_read_file(path, &buf, &len, err);
    if (rc) return rc;
    const char *end = NULL;
    *out = cJSON_ParseWithLengthOpts(buf, len, &end, 0);
    if (!*out) {
        rc = pgd_err_set(err, PGD_EFORMAT, "%s: invalid JSON near byte %zu", path,
                         end ? (size_t)(end - buf) : (size_t)0);
        free(buf);
        return rc;
    }
    free(buf);
    return 0;
}

int pgd_tokenizer_load_hf(const char *path, const char *config_path, pgd_tokenizer **out,
                          pgd_err *err) {
    cJSON *root = NULL, *cfg = NULL;
    pgd_str *texts = NULL, *ml = NULL, *mr = NULL;
    uint8_t *types = NULL;
    pgd_tokenizer *t = NULL;
    int rc;
    *out = NULL;
    rc = parse_file(path, &root, err);
    if (rc) return rc;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if (!cJSON_IsObject(model)) {
        rc = pgd_err_set(err, PGD_EFORMAT, "%s: model missing", path);
        goto fail;
    }
    if (jstr(model, "type") && !jtype(model, "BPE")) {
        rc = pgd_err_set(err, PGD_EUNSUPPORTED, "%s: model.type '%s' not supported (only BPE)",
                         path, jstr(model, "type"));
        goto fail;
    }
    if (!cJSON_IsObject(vocab)) {
        rc = pgd_err_set(err, PGD_EFORMAT, "%s: model.vocab missing", path);
        goto fail;
    }
    if (!cJSON_IsArray(merges)) {
        rc = pgd_err_set(err, PGD_EFORMAT, "%s: model.merges missing", path);
        goto fail;
    }

    /* which tokenizer is it? */
    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    const cJSON *dec = cJSON_GetObjectItemCaseSensitive(root, "decoder");
    bool byte_level = jtype(dec, "ByteLevel") || jtype(pre, "ByteLevel") ||
                      (jtype(pre, "Sequence") && byte_level_pre(pre) >= 0);
    pgd_tok_model kind = byte_level ? PGD_TOKM_BPE : PGD_TOKM_SPM;
    int pre_kind = PGD_PRE_NONE;
    bool nfc = false, prefix = false;
    if (byte_level) {
        pre_kind = byte_level_pre(pre);
        if (pre_kind < 0) {
            char *p = cJSON_PrintUnformatted(pre);
            rc = pgd_err_set(err, PGD_EUNSUPPORTED, "%s: pre_tokenizer not supported: %.200s",
                             path, p ? p : "?");
            free(p);
            goto fail;
        }
        if (jtype(norm, "NFC")) nfc = true;
        else if (norm && !cJSON_IsNull(norm)) {
            rc = pgd_err_set(err, PGD_EUNSUPPORTED, "%s: normalizer '%s' not supported", path,
                             jstr(norm, "type") ? jstr(norm, "type") : "?");
            goto fail;
        }
    } else {
        if (spm_normalizer(norm, &prefix) != 0) {
            rc = pgd_err_set(err, PGD_EUNSUPPORTED, "%s: normalizer '%s' not supported", path,
                             jstr(norm, "type") ? jstr(norm, "type") : "?");
            goto fail;
        }
        if (jtype(pre, "Metaspace")) {
            const char *ps = jstr(pre, "prepend_scheme");
            prefix = ps ? strcmp(ps, "never") != 0 : jbool(pre, "add_prefix_space", true);
        } else if (pre && !cJSON_IsNull(pre)) {
            rc = pgd_err_set(err, PGD_EUNSUPPORTED, "%s: pre_tokenizer '%s' not supported", path,
                             jstr(pre, "type") ? jstr(pre, "type") : "?");
            goto fail;
        }
    }

    /* vocabulary: ids from model.vocab and added_tokens; holes become empty unused tokens */
    int64_t max_id = -1;
    for (const cJSON *e = vocab->child; e; e = e->next) {
        /* ids past 2^24 (no real vocabulary comes near) would size the tables past reason */
        if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble >= (1 << 24)) {
            rc = pgd_err_set(err, PGD_EFORMAT, "%s: model.vocab entry '%.64s' has a bad id", path,
                             e->string ? e->string : "");
            goto fail;
        }
        if (e->valueint > max_id) max_id = e->valueint;
    }
    const cJSON *a;
    cJSON_ArrayForEach(a, added) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(a, "id");
        if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble >= (1 << 24) ||
            !jstr(a, "content")) {
            rc = pgd_err_set(err, PGD_EFORMAT, "%s: added_tokens entry without id/content", path);
            goto fail;
        }
        if (id->valueint > max_id) max_id = id->valueint;
    }
    if (max_id < 0) {
        rc = pgd_err_set(err, PGD_EFORMAT, "%s: model.vocab is empty", path);
        goto fail;
    }
    int32_t nv = (int32_t)max_id + 1;
    texts = calloc((size_t)nv, sizeof *texts);
    types = malloc((size_t)nv);
    if (!texts || !types) {
        rc = pgd_err_set(err, PGD_ENOMEM, "%s: out of memory", path);
        goto fail;
    }
    memset(types, PGD_TOK_UNUSED, (size_t)nv);
    const char *unk = jstr(model, "unk_token");
    for (const cJSON *e = vocab->child; e; e = e->next) {
        int32_t id = e->valueint;
        texts[id] = (pgd_str){e->string, strlen(e->string)};
        types[id] = PGD_TOK_NORMAL;
        if (unk && strcmp(e->string, unk) == 0) types[id] = PGD_TOK_UNKNOWN;
        else if (kind == PGD_TOKM_SPM && texts[id].len == 6 && strncmp(e->string, "<0x", 3) == 0 &&
                 e->string[5] == '>')
            types[id] = PGD_TOK_BYTE;
    }
    cJSON_ArrayForEach(a, added) {
        int32_t id = cJSON_GetObjectItemCaseSensitive(a, "id")->valueint;
        const char *c = jstr(a, "content");
        texts[id] = (pgd_str){c, strlen(c)};
        if (types[id] != PGD_TOK_UNKNOWN)
            types[id] = jbool(a, "special", false) ? PGD_TOK_CONTROL : PGD_TOK_USER;
    }
    rc = pgd__tok_create(&t, nv, texts, types, NULL, kind, path, err);
    if (rc) goto fail;
    t->pre = (pgd_tok_pre)pre_kind;
    t->nfc = nfc;
    t->add_space_prefix = prefix;
    t->spm_by_score = false;
    t->ignore_merges = jbool(model, "ignore_merges", false);

    size_t nm = (size_t)cJSON_GetArraySize(merges);
    ml = malloc(sizeof *ml * (nm + 1));
    mr = malloc(sizeof *mr * (nm + 1));
    if (!ml || !mr) {
        rc = pgd_err_set(err, PGD_ENOMEM, "%s: out of memory", path);
        goto fail;
    }
    size_t i = 0;
    cJSON_ArrayForEach(a, merges) {
        if (cJSON_IsString(a)) {
            const char *s = a->valuestring, *sp = strchr(s[0] ? s + 1 : s, ' ');
            if (!sp) {
                rc = pgd_err_set(err, PGD_EFORMAT, "%s: model.merges[%zu] has no space", path, i);
                goto fail;
            }
            ml[i] = (pgd_str){s, (size_t)(sp - s)};
            mr[i] = (pgd_str){sp + 1, strlen(sp + 1)};
        } else if (cJSON_GetArraySize(a) == 2 && cJSON_IsString(cJSON_GetArrayItem(a, 0)) &&
                   cJSON_IsString(cJSON_GetArrayItem(a, 1))) {
            const char *l = cJSON_GetArrayItem(a, 0)->valuestring;
            const char *r = cJSON_GetArrayItem(a, 1)->valuestring;
            ml[i] = (pgd_str){l, strlen(l)};
            mr[i] = (pgd_str){r, strlen(r)};
        } else {
            rc = pgd_err_set(err, PGD_EFORMAT, "%s: model.merges[%zu] is not \"a b\" or [a, b]",
                             path, i);
            goto fail;
        }
        i++;
    }
    rc = pgd__tok_add_merges(t, ml, mr, nm, path, err);
    if (rc) goto fail;

    /* BOS from the post-processor: TemplateProcessing whose single template starts with a
     * special token (Llama 2 / 3 style); one after the text ($A) is appended (Qwen3-Embedding's
     * end of text, on which its embeddings pool) */
    const cJSON *post = cJSON_GetObjectItemCaseSensitive(root, "post_processor");
    const cJSON *posts =
        jtype(post, "Sequence") ? cJSON_GetObjectItemCaseSensitive(post, "processors") : NULL;
    for (int k = 0; k < (posts ? cJSON_GetArraySize(posts) : 1); k++) {
        const cJSON *pp = posts ? cJSON_GetArrayItem(posts, k) : post;
        if (!jtype(pp, "TemplateProcessing")) continue;
        const cJSON *single = cJSON_GetObjectItemCaseSensitive(pp, "single");
        const cJSON *first = cJSON_GetArrayItem(single, 0);
        const cJSON *st = cJSON_GetObjectItemCaseSensitive(first, "SpecialToken");
        const char *id = jstr(st, "id");
        if (id) {
            t->bos = pgd__tok_lookup(t, id, strlen(id));
            t->add_bos = t->bos >= 0;
        }
        int n_single = cJSON_GetArraySize(single);
        const cJSON *last = cJSON_GetArrayItem(single, n_single - 1);
        id = jstr(cJSON_GetObjectItemCaseSensitive(last, "SpecialToken"), "id");
        if (n_single >= 2 && id && cJSON_GetObjectItemCaseSensitive(
                                       cJSON_GetArrayItem(single, n_single - 2), "Sequence"))
            t->append_id = pgd__tok_lookup(t, id, strlen(id));
    }
    if (config_path) {
        rc = parse_file(config_path, &cfg, err);
        if (rc) goto fail;
        const char *s;
        if ((s = config_token(cfg, "bos_token"))) t->bos = pgd__tok_lookup(t, s, strlen(s));
        if ((s = config_token(cfg, "eos_token"))) t->eos = pgd__tok_lookup(t, s, strlen(s));
        if ((s = config_token(cfg, "unk_token"))) t->unk = pgd__tok_lookup(t, s, strlen(s));
        const cJSON *ab = cJSON_GetObjectItemCaseSensitive(cfg, "add_bos_token");
        if (cJSON_IsBool(ab)) t->add_bos = cJSON_IsTrue(ab);
        const char *tmpl = jstr(cfg, "chat_template");
        if (tmpl) {
            t->chat_template = strdup(tmpl);
            if (!t->chat_template) {
                rc = pgd_err_set(err, PGD_ENOMEM, "%s: out of memory", config_path);
                goto fail;
            }
        }
    }
    if (t->unk < 0 && unk) t->unk = pgd__tok_lookup(t, unk, strlen(unk));
    rc = pgd__tok_finish(t, path, err);
    if (rc) goto fail;
    *out = t;
    t = NULL;
fail:
    pgd_tokenizer_free(t);
    free(texts);
    free(types);
    free(ml);
    free(mr);
    cJSON_Delete(root);
    cJSON_Delete(cfg);
    return rc;
}
