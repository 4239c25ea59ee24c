/* General pre-tokenizer pipelines: Hugging Face's Sequence of pre-tokenizers (Split with a regex
 * or string pattern and any behavior / invert, Digits, Punctuation, WhitespaceSplit, Whitespace,
 * CharDelimiterSplit, ByteLevel) run through the regex engine of pretok_regex.c, each step on
 * every piece the previous one left, as HF's PreTokenizedString::split does; and the table of
 * GGUF `tokenizer.ggml.pre` names (llama.cpp's) with the pipelines their models' tokenizer.json
 * files have. */
#ifndef PGD_TOKENIZER_PRETOK_PIPE_H
#define PGD_TOKENIZER_PRETOK_PIPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tokenizer/tok_internal.h"

/* HF's SplitDelimiterBehavior. */
typedef enum {
    PGD_SPLIT_REMOVED,
    PGD_SPLIT_ISOLATED,
    PGD_SPLIT_MERGED_PREV,
    PGD_SPLIT_MERGED_NEXT,
    PGD_SPLIT_CONTIGUOUS,
} pgd_split_behavior;

typedef enum {
    PGD_STEP_SPLIT,      /* pattern (regex, or literal when `literal`), behavior, invert */
    PGD_STEP_DIGITS,     /* flag: individual_digits */
    PGD_STEP_PUNCT,      /* Punctuation(behavior) */
    PGD_STEP_BYTELEVEL,  /* flag: add_prefix_space; use_regex: the GPT-2 pattern first */
    PGD_STEP_WS_SPLIT,   /* WhitespaceSplit */
    PGD_STEP_CHAR_DELIM, /* CharDelimiterSplit(delim) */
} pgd_step_kind;

typedef struct pgd_pretok_step_spec {
    uint8_t kind;     /* pgd_step_kind */
    uint8_t behavior; /* pgd_split_behavior */
    bool invert;
    bool flag;
    bool use_regex;
    bool literal;
    uint32_t delim;
    const char *pattern;
    size_t pattern_len; /* 0: strlen(pattern) */
} pgd_pretok_step_spec;

int pgd__pretok_new(pgd_pretok **out);
/* Appends a step; a pattern that does not compile gives its status with the reason in msg. */
int pgd__pretok_add(pgd_pretok *p, const pgd_pretok_step_spec *spec, char *msg, size_t msg_cap);
int pgd__pretok_n_steps(const pgd_pretok *p);
int pgd__pretok_n_bytelevel(const pgd_pretok *p);
void pgd__pretok_free(pgd_pretok *p);

/* Runs the pipeline over s[0..n): fn(ctx, piece, len) for every piece in order (bytes: a piece
 * may hold a space ByteLevel(add_prefix_space) put in front of it, so it need not lie in s). */
int pgd__pretok_run(const pgd_pretok *p, const char *s, size_t n, pgd_pretok_fn fn, void *ctx,
                    pgd_pretok_scratch *sc);

/* The GGUF `tokenizer.ggml.pre` names Pagoda knows. fast: the hand-written pre-tokenizer, or
 * PGD_PRE_GENERAL with steps. */
enum {
    PGD_PRE_F_NFC = 1,           /* the model's tokenizer.json has an NFC normalizer */
    PGD_PRE_F_IGNORE_MERGES = 2, /* llama.cpp applies ignore_merges to it */
    PGD_PRE_F_NO_BOS = 4,        /* llama.cpp drops its BOS token (ChatGLM / GLM-4) */
};
typedef struct pgd_pretok_named {
    const char *names; /* '|'-separated */
    pgd_tok_pre fast;
    uint8_t flags;
    pgd_pretok_step_spec steps[8];
} pgd_pretok_named;
const pgd_pretok_named *pgd__pretok_named(const char *name, size_t len);
int pgd__pretok_named_steps(const pgd_pretok_named *nm); /* how many of its steps are used */
/* The pipeline of a hand-written pre-tokenizer (what it is equivalent to), for the general
 * engine to run instead (pgd_tokenizer_use_general_pretok) and for the tests that prove them
 * equal. */
int pgd__pretok_for_fast(pgd_tok_pre fast, pgd_pretok **out, char *msg, size_t msg_cap);
int pgd__pretok_build(const pgd_pretok_step_spec *steps, int n, pgd_pretok **out, char *msg,
                      size_t msg_cap);

/* Patterns shared with hf_json.c's recognition of the hand-written ones. */
extern const char pgd__re_gpt2[], pgd__re_llama3[], pgd__re_qwen2[], pgd__re_tekken[];

#endif
