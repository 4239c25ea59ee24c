/* Loading a Hugging Face tokenizer.json (+ tokenizer_config.json): a "BPE" model whose
 * normalizer / pre_tokenizer / decoder combination is one we implement exactly; anything else
 * is refused with a message naming the part we do not know. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/pretok_pipe.h"
#include "tokenizer/tok_internal.h"
#include "tokenizer/unicode.h"
#include "util/mapfile.h"

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

/* Classifies the byte-level pre-tokenizer: one of the hand-written ones, or -1 (then the general
 * pipeline runs it). */
static int byte_level_pre(const cJSON *pre) {
    if (jtype(pre, "ByteLevel"))
        return jbool(pre, "use_regex", true) && !jbool(pre, "add_prefix_space", true) ? PGD_PRE_GPT2
                                                                                     : -1;
    if (!jtype(pre, "Sequence")) return -1;
    const cJSON *seq = cJSON_GetObjectItemCaseSensitive(pre, "pretokenizers");
    if (cJSON_GetArraySize(seq) != 2) return -1;
    const cJSON *a = cJSON_GetArrayItem(seq, 0), *b = cJSON_GetArrayItem(seq, 1);
    if (!jtype(b, "ByteLevel") || jbool(b, "add_prefix_space", true)) return -1;
    if (jtype(a, "Digits") && jbool(a, "individual_digits", false) && jbool(b, "use_regex", true))
        return PGD_PRE_SMOLLM;
    if (jtype(a, "Split") && !jbool(b, "use_regex", true)) {
        const char *beh = jstr(a, "behavior");
        const char *re = jstr(cJSON_GetObjectItemCaseSensitive(a, "pattern"), "Regex");
        if (!re || !beh || strcmp(beh, "Isolated") != 0 || jbool(a, "invert", false)) return -1;
        if (strcmp(re, pgd__re_llama3) == 0) return PGD_PRE_LLAMA3;
        if (strcmp(re, pgd__re_qwen2) == 0) return PGD_PRE_QWEN2;
        if (strcmp(re, pgd__re_tekken) == 0) return PGD_PRE_TEKKEN;
        if (strcmp(re, pgd__re_gpt2) == 0) return PGD_PRE_GPT2;
    }
    return -1;
}

/* Does the pre-tokenizer hold a ByteLevel step (then the vocabulary is byte-level)? */
static bool has_byte_level(const cJSON *pre) {
    if (jtype(pre, "ByteLevel")) return true;
    if (!jtype(pre, "Sequence")) return false;
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(pre, "pretokenizers")) {
        if (has_byte_level(e)) return true;
    }
    return false;
}

static int split_behavior(const char *s) {
    static const char *const names[] = {"Removed", "Isolated", "MergedWithPrevious",
                                        "MergedWithNext", "Contiguous"};
    static const int vals[] = {PGD_SPLIT_REMOVED, PGD_SPLIT_ISOLATED, PGD_SPLIT_MERGED_PREV,
                               PGD_SPLIT_MERGED_NEXT, PGD_SPLIT_CONTIGUOUS};
    for (int k = 0; s && k < 5; k++)
        if (strcmp(s, names[k]) == 0) return vals[k];
    return -1;
}

/* Appends the steps of pre (a Sequence is flattened) to p; a step we do not implement, or a
 * pattern the engine refuses, is a one-line error naming the file and the step. */
static int add_pre_steps(pgd_pretok *p, const cJSON *pre, const char *path, pgd_err *err) {
    const char *type = jstr(pre, "type");
    if (!type) return pgd_err_set(err, PGD_EFORMAT, "%s: pre_tokenizer step without a type", path);
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *e;
        cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(pre, "pretokenizers")) {
            int rc = add_pre_steps(p, e, path, err);
            if (rc) return rc;
        }
        return 0;
    }
    pgd_pretok_step_spec sp;
    memset(&sp, 0, sizeof sp);
    if (strcmp(type, "Split") == 0) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(pre, "pattern");
        const char *re = jstr(pat, "Regex"), *str = jstr(pat, "String");
        int beh = split_behavior(jstr(pre, "behavior"));
        if ((!re && !str) || beh < 0)
            return pgd_err_set(err, PGD_EFORMAT, "%s: pre_tokenizer Split without a pattern or "
                                                 "a known behavior", path);
        sp.kind = PGD_STEP_SPLIT;
        sp.pattern = re ? re : str;
        sp.literal = !re;
        sp.behavior = (uint8_t)beh;
        sp.invert = jbool(pre, "invert", false);
    } else if (strcmp(type, "Digits") == 0) {
        sp.kind = PGD_STEP_DIGITS;
        sp.flag = jbool(pre, "individual_digits", false);
    } else if (strcmp(type, "Punctuation") == 0) {
        const char *b = jstr(pre, "behavior");
        int beh = b ? split_behavior(b) : PGD_SPLIT_ISOLATED;
        if (beh < 0)
            return pgd_err_set(err, PGD_EFORMAT, "%s: Punctuation behavior '%s' unknown", path,
                               jstr(pre, "behavior"));
        sp.kind = PGD_STEP_PUNCT;
        sp.behavior = (uint8_t)beh;
    } else if (strcmp(type, "ByteLevel") == 0) {
        sp.kind = PGD_STEP_BYTELEVEL;
        sp.flag = jbool(pre, "add_prefix_space", true);
        sp.use_regex = jbool(pre, "use_regex", true);
    } else if (strcmp(type, "WhitespaceSplit") == 0) {
        sp.kind = PGD_STEP_WS_SPLIT;
    } else if (strcmp(type, "Whitespace") == 0) {
        /* \w+|[^\w\s]+ through the Rust regex crate, not Oniguruma: its \w is Unicode's, with
           the joiners U+200C/U+200D and without the Latin-1 superscripts and fractions */
        sp.kind = PGD_STEP_SPLIT;
        sp.pattern = "[\\x{200C}\\x{200D}[\\w&&[^\\x{B2}\\x{B3}\\x{B9}\\x{BC}-\\x{BE}]]]+|"
                     "[^\\s\\x{200C}\\x{200D}[\\w&&[^\\x{B2}\\x{B3}\\x{B9}\\x{BC}-\\x{BE}]]]+";
        sp.behavior = PGD_SPLIT_REMOVED;
        sp.invert = true;
    } else if (strcmp(type, "CharDelimiterSplit") == 0) {
        const char *d = jstr(pre, "delimiter");
        uint32_t cp;
        if (!d || !*d || pgd__utf8_seq_len((unsigned char)d[0]) != (int)strlen(d) ||
            (pgd__utf8_decode((const unsigned char *)d, strlen(d), &cp), cp & PGD_UNI_INVALID))
            return pgd_err_set(err, PGD_EFORMAT, "%s: CharDelimiterSplit needs one character",
                               path);
        sp.kind = PGD_STEP_CHAR_DELIM;
        sp.delim = cp;
    } else {
        return pgd_err_set(err, PGD_EUNSUPPORTED, "%s: pre_tokenizer type '%s' not supported",
                           path, type);
    }
    char msg[200];
    int rc = pgd__pretok_add(p, &sp, msg, sizeof msg);
    if (rc) {
        if (sp.kind == PGD_STEP_SPLIT && !sp.literal)
            return pgd_err_set(err, rc, "%s: pre_tokenizer Split pattern '%.80s': %s", path,
                               sp.pattern, msg);
        return pgd_err_set(err, rc, "%s: pre_tokenizer %s: %s", path, type, msg);
    }
    return 0;
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
    pgd_pretok *pipe = NULL;
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
    bool byte_level = jtype(dec, "ByteLevel") || has_byte_level(pre);
    pgd_tok_model kind = byte_level ? PGD_TOKM_BPE : PGD_TOKM_SPM;
    int pre_kind = PGD_PRE_NONE;
    bool nfc = false, prefix = false;
    if (byte_level) {
        pre_kind = byte_level_pre(pre);
        if (pre_kind < 0) { /* the general engine: Split patterns, Digits, ByteLevel, ... */
            pre_kind = PGD_PRE_GENERAL;
            if (pgd__pretok_new(&pipe)) {
                rc = pgd_err_set(err, PGD_ENOMEM, "%s: out of memory", path);
                goto fail;
            }
            if (!pre || cJSON_IsNull(pre)) {
                rc = pgd_err_set(err, PGD_EUNSUPPORTED, "%s: a ByteLevel decoder without a "
                                                        "pre_tokenizer is not supported", path);
                goto fail;
            }
            rc = add_pre_steps(pipe, pre, path, err);
            if (rc) goto fail;
            if (pgd__pretok_n_bytelevel(pipe) != 1) {
                rc = pgd_err_set(err, PGD_EUNSUPPORTED,
                                 "%s: a byte-level pre_tokenizer needs exactly one ByteLevel "
                                 "step (it has %d)", path, pgd__pretok_n_bytelevel(pipe));
                goto fail;
            }
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
    t->pretok = pipe;
    pipe = NULL;
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
    pgd__pretok_free(pipe);
    pgd_tokenizer_free(t);
    free(texts);
    free(types);
    free(ml);
    free(mr);
    cJSON_Delete(root);
    cJSON_Delete(cfg);
    return rc;
}
