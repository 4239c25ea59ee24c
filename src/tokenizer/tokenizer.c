/* The tokenizer object: vocabulary storage and hash maps, loading from GGUF metadata,
 * special-token splitting and the encode driver that hands text fragments to the
 * pre-tokenizer + BPE or to the SentencePiece merger. */
#include "tokenizer/tok_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <string.h>

#include "tokenizer/pretok_pipe.h"
#include "tokenizer/unicode.h"

/* ---- hashing and maps ---- */

uint64_t pgd__tok_hash(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a, then a final mix */
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 32;
    return h;
}

static uint32_t pow2_at_least(uint64_t n) {
    uint32_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

/* Is token id's text s[0..n)? (s may be NULL when n is 0.) */
static bool tok_is(const pgd_tokenizer *t, int32_t id, const char *s, size_t n) {
    return t->tok_len[id] == n && (n == 0 || memcmp(pgd__tok_text(t, id), s, n) == 0);
}

int32_t pgd__tok_lookup(const pgd_tokenizer *t, const char *s, size_t n) {
    uint32_t mask = t->vocab.cap - 1;
    uint32_t i = (uint32_t)pgd__tok_hash(s, n) & mask;
    for (;;) {
        int32_t id = t->vocab.slots[i];
        if (id < 0) return -1;
        if (tok_is(t, id, s, n)) return id;
        i = (i + 1) & mask;
    }
}

static uint64_t pair_key(int32_t a, int32_t b) {
    return (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
}

static uint32_t pair_slot(uint64_t key, uint32_t mask) {
    uint64_t h = key * 0x9E3779B97F4A7C15ull;
    return (uint32_t)(h >> 32) & mask;
}

int32_t pgd__tok_pair_find(const pgd_tokenizer *t, int32_t a, int32_t b, int32_t *merged) {
    if (!t->pair_cap) return -1;
    uint64_t key = pair_key(a, b);
    uint32_t mask = t->pair_cap - 1;
    for (uint32_t i = pair_slot(key, mask);; i = (i + 1) & mask) {
        const pgd_tok_pair *p = &t->pairs[i];
        if (p->key == 0) return -1;
        if (p->key == key) {
            *merged = p->merged;
            return p->rank;
        }
    }
}

void *pgd__tok_scratch_get(pgd_tok_scratch *s, size_t bytes) {
    if (bytes > s->cap) {
        size_t nc = bytes + bytes / 2 + 64;
        void *nb = realloc(s->buf, nc);
        if (!nb) return NULL;
        s->buf = nb;
        s->cap = nc;
    }
    return s->buf;
}

/* ---- byte-level map ---- */

static int32_t bl_cp[256];  /* byte -> code point */
static int16_t bl_inv[324]; /* code point -> byte, -1 */
static int bl_ready;

static void bytelevel_init(void) {
    if (__atomic_load_n(&bl_ready, __ATOMIC_ACQUIRE)) return;
    int32_t cps[256];
    int16_t inv[324];
    int n = 0;
    for (int i = 0; i < 324; i++) inv[i] = -1;
    for (int b = 0; b < 256; b++) {
        bool keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
        cps[b] = keep ? b : 256 + n++;
        inv[cps[b]] = (int16_t)b;
    }
    memcpy(bl_cp, cps, sizeof cps); /* idempotent: racing initialisers write the same values */
    memcpy(bl_inv, inv, sizeof inv);
    __atomic_store_n(&bl_ready, 1, __ATOMIC_RELEASE);
}

uint32_t pgd__bytelevel_cp(unsigned char b) {
    bytelevel_init();
    return (uint32_t)bl_cp[b];
}

int pgd__bytelevel_byte(uint32_t cp) {
    bytelevel_init();
    return cp < 324 ? bl_inv[cp] : -1;
}

/* ---- construction ---- */

int pgd__tok_create(pgd_tokenizer **out, int32_t n_vocab, const pgd_str *texts,
                    const uint8_t *types, const float *scores, pgd_tok_model model,
                    const char *name, pgd_err *err) {
    if (n_vocab <= 0) return pgd_err_set(err, PGD_EFORMAT, "%s: empty vocabulary", name);
    pgd_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return pgd_err_set(err, PGD_ENOMEM, "%s: out of memory", name);
    t->model = model;
    t->n_vocab = n_vocab;
    t->bos = t->eos = t->eot = t->unk = t->append_id = -1;
    size_t total = 0;
    for (int32_t i = 0; i < n_vocab; i++) total += texts[i].len + 1;
    if (total > UINT32_MAX) {
        free(t);
        return pgd_err_set(err, PGD_EFORMAT, "%s: vocabulary texts too large", name);
    }
    t->pool = malloc(total);
    t->tok_off = malloc(sizeof(uint32_t) * (size_t)n_vocab);
    t->tok_len = malloc(sizeof(uint32_t) * (size_t)n_vocab);
    t->tok_type = malloc((size_t)n_vocab);
    t->vocab.cap = pow2_at_least((uint64_t)n_vocab * 2);
    t->vocab.slots = malloc(sizeof(int32_t) * t->vocab.cap);
    if (scores) t->scores = malloc(sizeof(float) * (size_t)n_vocab);
    if (!t->pool || !t->tok_off || !t->tok_len || !t->tok_type || !t->vocab.slots ||
        (scores && !t->scores)) {
        pgd_tokenizer_free(t);
        return pgd_err_set(err, PGD_ENOMEM, "%s: out of memory", name);
    }
    memset(t->vocab.slots, 0xFF, sizeof(int32_t) * t->vocab.cap);
    size_t off = 0;
    uint32_t mask = t->vocab.cap - 1;
    for (int32_t i = 0; i < n_vocab; i++) {
        size_t n = (size_t)texts[i].len;
        if (n) memcpy(t->pool + off, texts[i].ptr, n);
        t->pool[off + n] = 0;
        t->tok_off[i] = (uint32_t)off;
        t->tok_len[i] = (uint32_t)n;
        t->tok_type[i] = types ? types[i] : PGD_TOK_NORMAL;
        if (scores) t->scores[i] = scores[i];
        off += n + 1;
        /* a repeated text maps to its last id, as llama.cpp's token_to_id does */
        uint32_t s = (uint32_t)pgd__tok_hash(texts[i].ptr, n) & mask;
        for (;; s = (s + 1) & mask) {
            int32_t id = t->vocab.slots[s];
            if (id < 0 || tok_is(t, id, texts[i].ptr, n)) {
                t->vocab.slots[s] = i;
                break;
            }
        }
    }
    *out = t;
    return 0;
}

int pgd__tok_add_merges(pgd_tokenizer *t, const pgd_str *left, const pgd_str *right,
                        size_t n_merges, const char *name, pgd_err *err) {
    if (n_merges == 0) return 0;
    t->pair_cap = pow2_at_least((uint64_t)n_merges * 2);
    t->pairs = calloc(t->pair_cap, sizeof *t->pairs);
    if (!t->pairs) return pgd_err_set(err, PGD_ENOMEM, "%s: out of memory", name);
    char *buf = NULL;
    size_t buf_cap = 0;
    uint32_t mask = t->pair_cap - 1;
    for (size_t r = 0; r < n_merges; r++) {
        if (!left[r].len || !right[r].len) continue; /* a merge of an empty piece: malformed */
        int32_t a = pgd__tok_lookup(t, left[r].ptr, left[r].len);
        int32_t b = pgd__tok_lookup(t, right[r].ptr, right[r].len);
        size_t n = left[r].len + right[r].len;
        if (n > buf_cap) {
            buf_cap = n * 2 + 64;
            char *nb = realloc(buf, buf_cap);
            if (!nb) {
                free(buf);
                return pgd_err_set(err, PGD_ENOMEM, "%s: out of memory", name);
            }
            buf = nb;
        }
        memcpy(buf, left[r].ptr, left[r].len);
        memcpy(buf + left[r].len, right[r].ptr, right[r].len);
        int32_t m = pgd__tok_lookup(t, buf, n);
        /* HF rejects merges with pieces outside the vocabulary; we skip them (they can never
         * apply) rather than refuse a file llama.cpp would load. */
        if (a < 0 || b < 0 || m < 0) continue;
        uint64_t key = pair_key(a, b);
        for (uint32_t s = pair_slot(key, mask);; s = (s + 1) & mask) {
            if (t->pairs[s].key == key) break; /* duplicate merge: the first (lowest) rank wins */
            if (t->pairs[s].key == 0) {
                t->pairs[s].key = key;
                t->pairs[s].rank = (int32_t)r;
                t->pairs[s].merged = m;
                break;
            }
        }
    }
    free(buf);
    return 0;
}

static const char *const eog_texts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>",
    "<EOT>", "<|end_of_text|>", "</s>", "<|EOT|>", "<|return|>", "<|call|>",
};

static int special_cmp(const void *pa, const void *pb, void *ctx) {
    const pgd_tokenizer *t = ctx;
    const pgd_tok_special *a = pa, *b = pb;
    unsigned char ca = (unsigned char)pgd__tok_text(t, a->id)[0];
    unsigned char cb = (unsigned char)pgd__tok_text(t, b->id)[0];
    if (ca != cb) return ca < cb ? -1 : 1;
    if (t->tok_len[a->id] != t->tok_len[b->id])
        return t->tok_len[a->id] > t->tok_len[b->id] ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

int pgd__tok_finish(pgd_tokenizer *t, const char *name, pgd_err *err) {
    int32_t nv = t->n_vocab;
    bytelevel_init();
    /* byte tokens */
    for (int b = 0; b < 256; b++) {
        char s[8];
        int n;
        if (t->model == PGD_TOKM_BPE) {
            n = pgd__utf8_encode((uint32_t)bl_cp[b], s);
        } else {
            static const char hex[] = "0123456789ABCDEF";
            s[0] = '<', s[1] = '0', s[2] = 'x', s[3] = hex[b >> 4], s[4] = hex[b & 15], s[5] = '>';
            n = 6;
        }
        t->byte_tok[b] = pgd__tok_lookup(t, s, (size_t)n);
    }
    /* decoded bytes of every token: never longer than the text */
    size_t total = 0;
    for (int32_t i = 0; i < nv; i++) total += t->tok_len[i];
    t->dec_pool = malloc(total + 1);
    t->dec_off = malloc(sizeof(uint32_t) * (size_t)nv);
    t->dec_len = malloc(sizeof(uint32_t) * (size_t)nv);
    t->eog = calloc((size_t)nv, sizeof(bool));
    t->specials = malloc(sizeof(pgd_tok_special) * (size_t)nv);
    if (!t->dec_pool || !t->dec_off || !t->dec_len || !t->eog || !t->specials)
        return pgd_err_set(err, PGD_ENOMEM, "%s: out of memory", name);
    size_t off = 0;
    for (int32_t i = 0; i < nv; i++) {
        const unsigned char *s = (const unsigned char *)pgd__tok_text(t, i);
        size_t n = t->tok_len[i], o = off;
        uint8_t ty = t->tok_type[i];
        bool plain = ty == PGD_TOK_CONTROL || ty == PGD_TOK_UNKNOWN || ty == PGD_TOK_USER;
        if (t->model == PGD_TOKM_BPE && !plain) {
            for (size_t k = 0; k < n;) {
                uint32_t cp;
                int l = pgd__utf8_decode(s + k, n - k, &cp);
                int b = pgd__bytelevel_byte(cp);
                if (b >= 0) t->dec_pool[o++] = (char)b;
                else memcpy(t->dec_pool + o, s + k, (size_t)l), o += (size_t)l;
                k += (size_t)l;
            }
        } else if (t->model == PGD_TOKM_SPM && ty == PGD_TOK_BYTE && n == 6 && s[0] == '<') {
            t->dec_pool[o++] = (char)strtol((const char *)s + 3, NULL, 16);
        } else if (t->model == PGD_TOKM_SPM && !plain) {
            for (size_t k = 0; k < n;) {
                if (k + 3 <= n && s[k] == 0xE2 && s[k + 1] == 0x96 && s[k + 2] == 0x81) {
                    t->dec_pool[o++] = ' ';
                    k += 3;
                } else {
                    t->dec_pool[o++] = (char)s[k++];
                }
            }
        } else {
            memcpy(t->dec_pool + o, s, n);
            o += n;
        }
        t->dec_off[i] = (uint32_t)off;
        t->dec_len[i] = (uint32_t)(o - off);
        if (t->dec_len[i] > t->max_dec_len) t->max_dec_len = t->dec_len[i];
        off = o;
        if (ty == PGD_TOK_CONTROL || ty == PGD_TOK_USER || ty == PGD_TOK_UNKNOWN) {
            if (n > 0) {
                t->specials[t->n_specials].id = i;
                t->specials[t->n_specials].always = ty == PGD_TOK_USER;
                t->n_specials++;
            }
            if (ty == PGD_TOK_CONTROL || ty == PGD_TOK_USER)
                for (size_t k = 0; k < sizeof eog_texts / sizeof eog_texts[0]; k++)
                    if (strcmp((const char *)s, eog_texts[k]) == 0) t->eog[i] = true;
        }
    }
    /* SentencePiece: can words starting at a "▁" run be merged independently? */
    t->spm_split_words = t->model == PGD_TOKM_SPM;
    for (int32_t i = 0; i < nv && t->spm_split_words; i++) {
        const char *s = pgd__tok_text(t, i);
        for (uint32_t k = 1; k + 3 <= t->tok_len[i]; k++)
            if (s[k] == (char)0xE2 && s[k + 1] == (char)0x96 && s[k + 2] == (char)0x81 &&
                !(k >= 3 && s[k - 3] == (char)0xE2 && s[k - 2] == (char)0x96 &&
                  s[k - 1] == (char)0x81))
                t->spm_split_words = false;
    }
    qsort_r(t->specials, (size_t)t->n_specials, sizeof *t->specials, special_cmp, t);
    int32_t k = 0;
    for (int b = 0; b <= 256; b++) {
        while (k < t->n_specials && (unsigned char)pgd__tok_text(t, t->specials[k].id)[0] < b) k++;
        t->special_start[b] = k;
    }
    if (t->eos >= 0 && t->eos < nv) t->eog[t->eos] = true;
    if (t->eot >= 0 && t->eot < nv) t->eog[t->eot] = true;
    if (t->bos >= nv) t->bos = -1;
    if (t->eos >= nv) t->eos = -1;
    if (t->append_id >= nv) t->append_id = -1;
    if (t->add_bos && t->bos < 0) t->add_bos = false;
    return 0;
}

/* ---- GGUF ---- */

static int gguf_token_id(const pgd_gguf *g, const char *key, int32_t *out) {
    uint32_t v;
    if (pgd_gguf_get_u32(g, key, &v) == 0) *out = (int32_t)v;
    return 0;
}

int pgd_tokenizer_load_gguf(const pgd_gguf *g, pgd_tokenizer **out, pgd_err *err) {
    const char *name = g->path ? g->path : "gguf";
    pgd_str model_s, pre_s = {0};
    const pgd_gguf_kv *toks, *types_kv = NULL, *scores_kv = NULL, *merges_kv = NULL;
    pgd_tokenizer *t = NULL;
    uint8_t *types = NULL;
    float *scores = NULL;
    pgd_str *ml = NULL, *mr = NULL;
    int rc;
    *out = NULL;
    if (pgd_gguf_get_str(g, "tokenizer.ggml.model", &model_s) != 0)
        return pgd_err_set(err, PGD_EFORMAT, "%s: tokenizer.ggml.model missing (no tokenizer)",
                           name);
    pgd_tok_model model;
    if (pgd_str_eq(model_s, "gpt2")) model = PGD_TOKM_BPE;
    else if (pgd_str_eq(model_s, "llama")) model = PGD_TOKM_SPM;
    else
        return pgd_err_set(err, PGD_EUNSUPPORTED, "%s: tokenizer.ggml.model '%.*s' not supported",
                           name, (int)model_s.len, model_s.ptr);
    if (pgd_gguf_get_arr(g, "tokenizer.ggml.tokens", PGD_GGUF_STRING, &toks) != 0)
        return pgd_err_set(err, PGD_EFORMAT, "%s: tokenizer.ggml.tokens missing or not strings",
                           name);
    if (toks->arr_n == 0 || toks->arr_n > INT32_MAX)
        return pgd_err_set(err, PGD_EFORMAT, "%s: tokenizer.ggml.tokens has %llu entries", name,
                           (unsigned long long)toks->arr_n);
    int32_t nv = (int32_t)toks->arr_n;

    pgd_tok_pre pre = PGD_PRE_NONE;
    const pgd_pretok_named *named = NULL;
    if (model == PGD_TOKM_BPE) {
        pre = PGD_PRE_GPT2; /* no tokenizer.ggml.pre: GPT-2's (llama.cpp's "default" differs) */
        if (pgd_gguf_get_str(g, "tokenizer.ggml.pre", &pre_s) == 0) {
            named = pgd__pretok_named(pre_s.ptr, pre_s.len);
            if (!named)
                return pgd_err_set(err, PGD_EUNSUPPORTED,
                                   "%s: tokenizer.ggml.pre '%.*s' not supported", name,
                                   (int)pre_s.len, pre_s.ptr);
            pre = named->fast;
        }
    }

    const pgd_gguf_kv *kv = pgd_gguf_find(g, "tokenizer.ggml.token_type");
    if (kv) {
        if (kv->type != PGD_GGUF_ARRAY || kv->arr_n != toks->arr_n ||
            (kv->arr_type != PGD_GGUF_I32 && kv->arr_type != PGD_GGUF_U32))
            return pgd_err_set(err, PGD_EFORMAT, "%s: tokenizer.ggml.token_type malformed", name);
        types_kv = kv;
    }
    kv = pgd_gguf_find(g, "tokenizer.ggml.scores");
    if (kv) {
        if (kv->type != PGD_GGUF_ARRAY || kv->arr_n != toks->arr_n ||
            kv->arr_type != PGD_GGUF_F32)
            return pgd_err_set(err, PGD_EFORMAT, "%s: tokenizer.ggml.scores malformed", name);
        scores_kv = kv;
    }
    if (model == PGD_TOKM_BPE &&
        pgd_gguf_get_arr(g, "tokenizer.ggml.merges", PGD_GGUF_STRING, &merges_kv) != 0)
        return pgd_err_set(err, PGD_EFORMAT, "%s: tokenizer.ggml.merges missing", name);
    if (model == PGD_TOKM_SPM && !scores_kv)
        return pgd_err_set(err, PGD_EFORMAT, "%s: tokenizer.ggml.scores missing", name);

    types = malloc((size_t)nv);
    if (scores_kv) scores = malloc(sizeof(float) * (size_t)nv);
    if (!types || (scores_kv && !scores)) {
        rc = pgd_err_set(err, PGD_ENOMEM, "%s: out of memory", name);
        goto fail;
    }
    for (int32_t i = 0; i < nv; i++) {
        int32_t ty = PGD_TOK_NORMAL;
        if (types_kv) memcpy(&ty, (const char *)types_kv->arr_data + 4 * (size_t)i, 4);
        types[i] = (ty >= 1 && ty <= 6) ? (uint8_t)ty : PGD_TOK_NORMAL;
        if (scores) memcpy(&scores[i], (const char *)scores_kv->arr_data + 4 * (size_t)i, 4);
    }
    rc = pgd__tok_create(&t, nv, toks->arr_str, types, scores, model, name, err);
    if (rc) goto fail;
    t->pre = pre;
    if (named) {
        /* the normalizer the model's tokenizer.json has; tiktoken's rule, which llama.cpp
           applies to some: a word that is a token is not split */
        t->nfc = (named->flags & PGD_PRE_F_NFC) != 0;
        t->ignore_merges = (named->flags & PGD_PRE_F_IGNORE_MERGES) != 0;
        if (pre == PGD_PRE_GENERAL) {
            char msg[256];
            rc = pgd__pretok_build(named->steps, pgd__pretok_named_steps(named), &t->pretok, msg,
                                   sizeof msg);
            if (rc) {
                rc = pgd_err_set(err, rc, "%s: tokenizer.ggml.pre '%.*s': %s", name,
                                 (int)pre_s.len, pre_s.ptr, msg);
                goto fail;
            }
        }
    }
    t->spm_by_score = true;
    bool b;
    t->add_space_prefix = model == PGD_TOKM_SPM;
    if (pgd_gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &b) == 0 && model == PGD_TOKM_SPM)
        t->add_space_prefix = b;

    if (merges_kv) {
        size_t nm = merges_kv->arr_n;
        ml = malloc(sizeof *ml * (nm ? nm : 1));
        mr = malloc(sizeof *mr * (nm ? nm : 1));
        if (!ml || !mr) {
            rc = pgd_err_set(err, PGD_ENOMEM, "%s: out of memory", name);
            goto fail;
        }
        for (size_t i = 0; i < nm; i++) {
            pgd_str s = merges_kv->arr_str[i];
            /* "a b": the separator is the first space after the first character (a piece can
             * itself not contain a plain space in byte-level vocabularies) */
            size_t sp = 1;
            while (sp < s.len && s.ptr[sp] != ' ') sp++;
            if (sp >= s.len) {
                rc = pgd_err_set(err, PGD_EFORMAT, "%s: tokenizer.ggml.merges[%zu] has no space",
                                 name, i);
                goto fail;
            }
            ml[i] = (pgd_str){s.ptr, sp};
            mr[i] = (pgd_str){s.ptr + sp + 1, s.len - sp - 1};
        }
        rc = pgd__tok_add_merges(t, ml, mr, nm, name, err);
        if (rc) goto fail;
    }

    gguf_token_id(g, "tokenizer.ggml.bos_token_id", &t->bos);
    if (named && (named->flags & PGD_PRE_F_NO_BOS)) t->bos = -1; /* as llama.cpp (ChatGLM) */
    gguf_token_id(g, "tokenizer.ggml.eos_token_id", &t->eos);
    gguf_token_id(g, "tokenizer.ggml.eot_token_id", &t->eot);
    gguf_token_id(g, "tokenizer.ggml.unknown_token_id", &t->unk);
    if (t->unk >= nv) t->unk = -1;
    if (t->eot >= nv) t->eot = -1;
    t->add_bos = model == PGD_TOKM_SPM;
    if (pgd_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &b) == 0) t->add_bos = b;
    if (pgd_gguf_get_bool(g, "tokenizer.ggml.add_eos_token", &b) == 0 && b) t->append_id = t->eos;
    pgd_str tmpl;
    if (pgd_gguf_get_str(g, "tokenizer.chat_template", &tmpl) == 0) {
        t->chat_template = malloc(tmpl.len + 1);
        if (!t->chat_template) {
            rc = pgd_err_set(err, PGD_ENOMEM, "%s: out of memory", name);
            goto fail;
        }
        memcpy(t->chat_template, tmpl.ptr, tmpl.len);
        t->chat_template[tmpl.len] = 0;
    }
    rc = pgd__tok_finish(t, name, err);
    if (rc) goto fail;
    free(types);
    free(scores);
    free(ml);
    free(mr);
    *out = t;
    return 0;
fail:
    free(types);
    free(scores);
    free(ml);
    free(mr);
    pgd_tokenizer_free(t);
    return rc;
}

void pgd_tokenizer_free(pgd_tokenizer *t) {
    if (!t) return;
    pgd__pretok_free(t->pretok);
    free(t->pool);
    free(t->tok_off);
    free(t->tok_len);
    free(t->tok_type);
    free(t->scores);
    free(t->dec_pool);
    free(t->dec_off);
    free(t->dec_len);
    free(t->vocab.slots);
    free(t->pairs);
    free(t->specials);
    free(t->eog);
    free(t->chat_template);
    free(t);
}

int32_t pgd_tokenizer_n_vocab(const pgd_tokenizer *t) { return t->n_vocab; }
int32_t pgd_tokenizer_bos(const pgd_tokenizer *t) { return t->bos; }
int32_t pgd_tokenizer_eos(const pgd_tokenizer *t) { return t->eos; }
bool pgd_tokenizer_add_bos(const pgd_tokenizer *t) { return t->add_bos; }
bool pgd_tokenizer_is_eog(const pgd_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_vocab && t->eog[id];
}
const char *pgd_tokenizer_chat_template(const pgd_tokenizer *t) { return t->chat_template; }

/* ---- encoding ---- */

typedef struct encode_ctx {
    const pgd_tokenizer *t;
    const unsigned char *text;
    pgd_tok_out *o;
    pgd_tok_scratch *bpe_sc;
} encode_ctx;

static int on_piece(void *vctx, const char *piece, size_t len) {
    encode_ctx *c = vctx;
    return pgd__bpe_word(c->t, (const unsigned char *)piece, len, c->o, c->bpe_sc);
}

typedef struct encode_state {
    pgd_pretok_scratch pre_sc;
    pgd_tok_scratch bpe_sc, norm_sc;
} encode_state;

int pgd__pretok_split(const pgd_tokenizer *t, const char *s, size_t n, pgd_pretok_fn fn,
                      void *ctx, pgd_pretok_scratch *sc) {
    if (t->pre == PGD_PRE_GENERAL) return pgd__pretok_run(t->pretok, s, n, fn, ctx, sc);
    return pgd__pretok_fast(t->pre, s, n, fn, ctx, &sc->fast);
}

static int encode_fragment(const pgd_tokenizer *t, const char *s, size_t n, pgd_tok_out *o,
                           encode_state *st) {
    if (n == 0) return 0;
    if (t->model == PGD_TOKM_SPM) {
        /* SentencePiece normalisation: dummy prefix, spaces -> U+2581 */
        size_t spaces = 0;
        for (size_t i = 0; i < n; i++) spaces += s[i] == ' ';
        size_t len = n + 2 * spaces + (t->add_space_prefix ? 3 : 0);
        char *b = pgd__tok_scratch_get(&st->norm_sc, len);
        if (!b) return PGD_ENOMEM;
        size_t k = 0;
        if (t->add_space_prefix) b[k++] = (char)0xE2, b[k++] = (char)0x96, b[k++] = (char)0x81;
        for (size_t i = 0; i < n; i++) {
            if (s[i] == ' ') b[k++] = (char)0xE2, b[k++] = (char)0x96, b[k++] = (char)0x81;
            else b[k++] = s[i];
        }
        return pgd__spm_encode(t, b, k, o, &st->bpe_sc);
    }
    char *norm = NULL;
    if (t->nfc && !pgd__uni_is_nfc_quick(s, n)) {
        size_t nl;
        if (pgd__uni_nfc(s, n, &norm, &nl) != 0) return PGD_ENOMEM;
        s = norm;
        n = nl;
    }
    encode_ctx c = {t, (const unsigned char *)s, o, &st->bpe_sc};
    int rc = pgd__pretok_split(t, s, n, on_piece, &c, &st->pre_sc);
    free(norm);
    return rc;
}

static int encode(const pgd_tokenizer *t, const char *text, size_t len, bool add_bos,
                  int32_t append, bool parse_special, int32_t *out, size_t cap, size_t *n_out);

int pgd_tokenizer_pieces(const pgd_tokenizer *t, const char *text, size_t len,
                         int (*fn)(void *ctx, const char *piece, size_t len), void *ctx) {
    pgd_pretok_scratch sc;
    memset(&sc, 0, sizeof sc);
    int rc = pgd__pretok_split(t, text, len, fn, ctx, &sc);
    pgd__pretok_scratch_free(&sc);
    return rc;
}

bool pgd_tokenizer_byte_level(const pgd_tokenizer *t) { return t->model == PGD_TOKM_BPE; }

int pgd_tokenizer_use_general_pretok(pgd_tokenizer *t, pgd_err *err) {
    if (t->pre == PGD_PRE_GENERAL || t->pre == PGD_PRE_NONE) return 0;
    char msg[256];
    pgd_pretok *p;
    int rc = pgd__pretok_for_fast(t->pre, &p, msg, sizeof msg);
    if (rc) return pgd_err_set(err, rc, "general pre-tokenizer: %s", msg);
    t->pretok = p;
    t->pre = PGD_PRE_GENERAL;
    return 0;
}

int pgd_tokenizer_encode(const pgd_tokenizer *t, const char *text, size_t len, bool add_bos,
                         bool parse_special, int32_t *out, size_t cap, size_t *n_out) {
    return encode(t, text, len, add_bos, -1, parse_special, out, cap, n_out);
}

int pgd_tokenizer_encode_special(const pgd_tokenizer *t, const char *text, size_t len,
                                 bool add_special, bool parse_special, int32_t *out, size_t cap,
                                 size_t *n_out) {
    return encode(t, text, len, add_special && t->add_bos, add_special ? t->append_id : -1,
                  parse_special, out, cap, n_out);
}

static int encode(const pgd_tokenizer *t, const char *text, size_t len, bool add_bos,
                  int32_t append, bool parse_special, int32_t *out, size_t cap, size_t *n_out) {
    pgd_tok_out o = {out, out ? cap : 0, 0};
    encode_state st;
    memset(&st, 0, sizeof st);
    int rc = 0;
    if (add_bos && t->bos >= 0) pgd__tok_emit(&o, t->bos);
    size_t frag = 0, pos = 0;
    while (pos < len) {
        unsigned char c = (unsigned char)text[pos];
        int32_t match = -1;
        for (int32_t k = t->special_start[c]; k < t->special_start[c + 1]; k++) {
            const pgd_tok_special *sp = &t->specials[k];
            if (!sp->always && !parse_special) continue;
            size_t l = t->tok_len[sp->id];
            if (l <= len - pos && memcmp(text + pos, pgd__tok_text(t, sp->id), l) == 0) {
                match = sp->id; /* longest first within the bucket */
                break;
            }
        }
        if (match < 0) {
            pos++;
            continue;
        }
        rc = encode_fragment(t, text + frag, pos - frag, &o, &st);
        if (rc) goto done;
        pgd__tok_emit(&o, match);
        pos += t->tok_len[match];
        frag = pos;
    }
    rc = encode_fragment(t, text + frag, len - frag, &o, &st);
    if (!rc && append >= 0) pgd__tok_emit(&o, append);
done:
    pgd__pretok_scratch_free(&st.pre_sc);
    free(st.bpe_sc.buf);
    free(st.norm_sc.buf);
    if (rc) return rc;
    *n_out = o.n;
    return o.n > cap ? PGD_ERANGE : 0;
}

int pgd_tokenizer_load_path(const char *path, pgd_tokenizer **out, pgd_err *err) {
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        char tj[4096], tc[4096];
        snprintf(tj, sizeof tj, "%s/tokenizer.json", path);
        snprintf(tc, sizeof tc, "%s/tokenizer_config.json", path);
        return pgd_tokenizer_load_hf(tj, stat(tc, &st) == 0 ? tc : NULL, out, err);
    }
    pgd_gguf g;
    int rc = pgd_gguf_open(&g, path, err);
    if (rc) return rc;
    rc = pgd_tokenizer_load_gguf(&g, out, err);
    pgd_gguf_close(&g);
    return rc;
}
