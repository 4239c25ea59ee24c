/* Internals shared by the tokenizer's files: the tokenizer object, its hash maps, and the
 * entry points of the BPE / SentencePiece mergers and the pre-tokenizers. Not a public API. */
#ifndef PGD_TOKENIZER_INTERNAL_H
#define PGD_TOKENIZER_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "tokenizer/tokenizer.h"

/* GGUF token types (tokenizer.ggml.token_type). */
enum {
    PGD_TOK_NORMAL = 1,
    PGD_TOK_UNKNOWN = 2,
    PGD_TOK_CONTROL = 3,
    PGD_TOK_USER = 4,
    PGD_TOK_UNUSED = 5,
    PGD_TOK_BYTE = 6,
};

typedef enum {
    PGD_TOKM_BPE, /* byte-level BPE (GPT-2 byte-to-unicode), merges by rank */
    PGD_TOKM_SPM, /* SentencePiece-style: "▁" for spaces, byte fallback <0xXX> */
} pgd_tok_model;

typedef enum {
    PGD_PRE_NONE,   /* whole fragment is one word (SentencePiece) */
    PGD_PRE_GPT2,   /* GPT-2 regex */
    PGD_PRE_SMOLLM, /* Digits(individual) then GPT-2 regex */
    PGD_PRE_LLAMA3, /* Llama 3 regex, \p{N}{1,3} */
    PGD_PRE_QWEN2,  /* Llama 3 regex with single \p{N} */
    PGD_PRE_TEKKEN, /* Mistral's Tekken regex (Nemo, Small 3, Ministral, Pixtral) */
    PGD_PRE_GENERAL, /* a pipeline (pretok_pipe.c) through the general regex engine */
} pgd_tok_pre;

typedef struct pgd_pretok pgd_pretok; /* pretok_pipe.h */

/* Open-addressing string -> id map over the token texts (the texts live in the tokenizer). */
typedef struct pgd_tok_strmap {
    int32_t *slots; /* (cap) token id or -1 */
    uint32_t cap;   /* power of two */
} pgd_tok_strmap;

/* (left id, right id) -> (rank, merged id). */
typedef struct pgd_tok_pair {
    uint64_t key; /* (left << 32 | right) + 1; 0 = empty */
    int32_t rank;
    int32_t merged;
} pgd_tok_pair;

typedef struct pgd_tok_special {
    int32_t id;
    bool always; /* matched even without parse_special (user-defined / non-special added) */
} pgd_tok_special;

struct pgd_tokenizer {
    pgd_tok_model model;
    pgd_tok_pre pre;
    pgd_pretok *pretok;    /* PGD_PRE_GENERAL: the pipeline */
    bool nfc;              /* NFC-normalise text fragments before pre-tokenizing (Qwen2) */
    bool ignore_merges;    /* a word that is a whole token is emitted as is (Llama 3) */
    bool add_space_prefix; /* SPM: prepend "▁" to each text fragment */
    bool spm_by_score;     /* SPM: merge by piece score (GGUF), else by merge rank (HF) */
    bool spm_split_words;  /* SPM: no token has "▁" after another character (see spm.c) */

    int32_t n_vocab;
    char *pool;            /* token texts, back to back, each NUL-terminated */
    uint32_t *tok_off;     /* (n_vocab) offset of the token text in pool */
    uint32_t *tok_len;     /* (n_vocab) its length in bytes */
    uint8_t *tok_type;     /* (n_vocab) PGD_TOK_* */
    float *scores;         /* (n_vocab) SPM piece scores, NULL if none */
    char *dec_pool;        /* decoded bytes of every token (byte-level undone, ▁ -> space) */
    uint32_t *dec_off;     /* (n_vocab) */
    uint32_t *dec_len;     /* (n_vocab) */
    uint32_t max_dec_len;  /* the longest decoded piece, in bytes */

    pgd_tok_strmap vocab;  /* token text -> id */
    pgd_tok_pair *pairs;   /* (pair_cap) merges */
    uint32_t pair_cap;     /* power of two, 0 if no merges */
    int32_t byte_tok[256]; /* BPE: token of the byte-level char of byte b; SPM: <0xXX>; -1 none */

    pgd_tok_special *specials; /* (n_specials) sorted by first byte, then longest first */
    int32_t n_specials;
    int32_t special_start[257]; /* specials whose text starts with byte b: [start[b], start[b+1]) */

    int32_t bos, eos, eot, unk;
    bool add_bos;
    /* a special token the tokenizer appends to a text it adds special tokens to (HF
       TemplateProcessing [$A, X], as Qwen3-Embedding's; GGUF add_eos_token: EOS), or -1 */
    int32_t append_id;
    bool *eog;            /* (n_vocab) end-of-generation flags */
    char *chat_template;  /* NUL-terminated or NULL */
};

static inline const char *pgd__tok_text(const pgd_tokenizer *t, int32_t id) {
    return t->pool + t->tok_off[id];
}

uint64_t pgd__tok_hash(const char *s, size_t n);
/* Id of the token whose text is s[0..n), or -1. */
int32_t pgd__tok_lookup(const pgd_tokenizer *t, const char *s, size_t n);
/* The merge of (a, b): rank (>= 0) and merged id, or -1 when the pair does not merge. */
int32_t pgd__tok_pair_find(const pgd_tokenizer *t, int32_t a, int32_t b, int32_t *merged);

/* Builds a tokenizer from parallel arrays (used by both loaders). Takes nothing: copies texts.
 * merges_l/merges_r: (n_merges) token texts of each merge, in rank order (may be 0).
 * name is used in error messages. On success the remaining fields (bos, eos, flags ...) are
 * set by the caller, then pgd__tok_finish() must be called. */
int pgd__tok_create(pgd_tokenizer **out, int32_t n_vocab, const pgd_str *texts,
                    const uint8_t *types, const float *scores, pgd_tok_model model,
                    const char *name, pgd_err *err);
int pgd__tok_add_merges(pgd_tokenizer *t, const pgd_str *left, const pgd_str *right,
                        size_t n_merges, const char *name, pgd_err *err);
/* Builds the byte tables, special-token index, decoded texts and EOG flags. */
int pgd__tok_finish(pgd_tokenizer *t, const char *name, pgd_err *err);

/* Output sink for the encoders: counts every id, stores the first cap. */
typedef struct pgd_tok_out {
    int32_t *ids;
    size_t cap;
    size_t n;
} pgd_tok_out;

static inline void pgd__tok_emit(pgd_tok_out *o, int32_t id) {
    if (o->n < o->cap) o->ids[o->n] = id;
    o->n++;
}

/* Scratch memory for one encode call, sized by the fragment length. */
typedef struct pgd_tok_scratch {
    void *buf;
    size_t cap;
} pgd_tok_scratch;
void *pgd__tok_scratch_get(pgd_tok_scratch *s, size_t bytes);

/* Byte-level BPE on one pre-tokenized word (raw bytes). */
int pgd__bpe_word(const pgd_tokenizer *t, const unsigned char *w, size_t n, pgd_tok_out *o,
                  pgd_tok_scratch *sc);
/* Rank-merge BPE over the UTF-8 characters of s (SentencePiece vocabulary from tokenizer.json). */
int pgd__bpe_chars(const pgd_tokenizer *t, const char *s, size_t n, pgd_tok_out *o,
                   pgd_tok_scratch *sc);
/* SentencePiece on one normalised fragment ("▁" already in place). */
int pgd__spm_encode(const pgd_tokenizer *t, const char *s, size_t n, pgd_tok_out *o,
                    pgd_tok_scratch *sc);

/* Scratch of the general regex engine's searches (pretok_regex.c). */
typedef struct pgd_re_scratch {
    pgd_tok_scratch memo, frames, runs;
    uint64_t steps; /* instructions run and alternatives taken, summed over calls (for tests) */
} pgd_re_scratch;

/* Scratch of the pre-tokenizers for one encode call: grown as needed, reused for every
 * fragment and piece, freed by pgd__pretok_scratch_free. */
typedef struct pgd_pretok_scratch {
    pgd_tok_scratch fast;               /* the hand-written splitters' code points and flags */
    pgd_tok_scratch text, chars, pieces; /* the pipeline's text, its decoded view, pieces */
    pgd_re_scratch re;
} pgd_pretok_scratch;
void pgd__pretok_scratch_free(pgd_pretok_scratch *sc);

/* Splits s[0..n) into pre-tokens with t's pre-tokenizer; calls fn(ctx, piece, len) for each
 * piece in order. */
typedef int (*pgd_pretok_fn)(void *ctx, const char *piece, size_t len);
int pgd__pretok_split(const pgd_tokenizer *t, const char *s, size_t n, pgd_pretok_fn fn,
                      void *ctx, pgd_pretok_scratch *sc);
/* The hand-written splitters (pretok.c). */
int pgd__pretok_fast(pgd_tok_pre pre, const char *s, size_t n, pgd_pretok_fn fn, void *ctx,
                     pgd_tok_scratch *sc);

/* GPT-2 byte-to-unicode map: the code point standing for byte b, and its inverse. */
uint32_t pgd__bytelevel_cp(unsigned char b);
int pgd__bytelevel_byte(uint32_t cp); /* -1 if cp is not in the map */

/* The mergers' binary heap: *n elements of `size` bytes at h, before(x, y) when x comes out
 * first. Always inlined, so each caller's constant size and comparator make it a typed heap (no
 * calls through the pointer). push: h has room for one more; pop: the first element into *top,
 * *n >= 1. */
typedef bool (*pgd__heap_before)(const void *x, const void *y);
static inline __attribute__((always_inline)) void pgd__heap_push(void *h, size_t *n, const void *x,
                                                                size_t size,
                                                                pgd__heap_before before) {
    unsigned char *e = h;
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!before(x, e + p * size)) break;
        memcpy(e + i * size, e + p * size, size);
        i = p;
    }
    memcpy(e + i * size, x, size);
}
static inline __attribute__((always_inline)) void pgd__heap_pop(void *h, size_t *n, void *top,
                                                               size_t size,
                                                               pgd__heap_before before) {
    unsigned char *e = h;
    memcpy(top, e, size);
    const unsigned char *last = e + --*n * size; /* past the heap now: never overwritten below */
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const void *best = last;
        if (l < *n && before(e + l * size, best)) m = l, best = e + l * size;
        if (r < *n && before(e + r * size, best)) m = r;
        if (m == i) break;
        memcpy(e + i * size, e + m * size, size);
        i = m;
    }
    if (*n > 0) memcpy(e + i * size, last, size);
}

#endif
