/* Output constraints (structured output): one interface, a small ops table (mask, accept, start,
 * free), over four kinds -- a JSON object or a JSON Schema, a list of choices, a regular
 * expression, a grammar. The engine holds one pgd_constraint pointer per sequence and never asks
 * which kind it is. A constraint reads tokens as bytes (pgd_json_vocab) and works on the engine
 * thread, with the engine's scratch (pgd_constraint_env); created on any thread. */
#ifndef PGD_SAMPLE_CONSTRAINT_H
#define PGD_SAMPLE_CONSTRAINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sample/grammar.h"
#include "sample/json_grammar.h"
#include "sample/regex.h"

/* What a constraint reads and writes with besides itself: the engine's, shared by every
 * request, used on the engine thread only. */
typedef struct pgd_constraint_env {
    pgd_json_vocab *vocab;            /* every token's bytes and its eog flag */
    const int32_t *eog;               /* (n_eog) end-of-generation token ids */
    int32_t n_eog;
    int32_t n_vocab;                  /* the length of a mask */
    pgd_grammar_scratch *gr_scratch;  /* a grammar's feeding and masking */
    pgd_grammar_key *gr_key;          /* the key of the grammar state being masked */
} pgd_constraint_env;

/* What a token did to a constraint. */
typedef enum {
    PGD_CONSTRAINT_MORE = 0, /* taken; the output goes on */
    PGD_CONSTRAINT_DONE,     /* taken, and the output is whole: generation stops */
    PGD_CONSTRAINT_REFUSED,  /* not allowed (only from logits with no finite value) */
} pgd_constraint_step;

typedef struct pgd_constraint pgd_constraint;

/* A mask's answer besides 0 (allow written) and -1 (past the work limit: allow all 0): the
 * constraint holds nothing back at this token (allow left as it was). */
#define PGD_CONSTRAINT_FREE 1

typedef struct pgd_constraint_ops {
    /* allow[0..n_vocab) = 1 for the tokens that may come next (end-of-generation tokens where
     * the output may end), else 0: 0, -1 past the work limit (allow then all 0), or
     * PGD_CONSTRAINT_FREE. */
    int (*mask)(pgd_constraint *c, const pgd_constraint_env *env, uint8_t *allow);
    /* The same for tokens read less a leading space (a SentencePiece first piece, whose space
     * the text drops); a token left with no text is refused. Not memoized. */
    int (*mask_drop_space)(pgd_constraint *c, const pgd_constraint_env *env, uint8_t *allow);
    /* Moves c over token id, whose text adds t[0..n). */
    pgd_constraint_step (*accept)(pgd_constraint *c, const pgd_constraint_env *env, int32_t id,
                                  const char *t, size_t n);
    /* Readies c on the engine thread before its first mask (NULL: nothing to do). */
    void (*start)(pgd_constraint *c, pgd_grammar_scratch *sc);
    void (*free)(pgd_constraint *c);
} pgd_constraint_ops;

struct pgd_constraint {
    const pgd_constraint_ops *ops;
};

static inline int pgd_constraint_mask(pgd_constraint *c, const pgd_constraint_env *env,
                                      uint8_t *allow) {
    return c->ops->mask(c, env, allow);
}
static inline int pgd_constraint_mask_drop_space(pgd_constraint *c, const pgd_constraint_env *env,
                                                 uint8_t *allow) {
    return c->ops->mask_drop_space(c, env, allow);
}
static inline pgd_constraint_step pgd_constraint_accept(pgd_constraint *c,
                                                        const pgd_constraint_env *env, int32_t id,
                                                        const char *t, size_t n) {
    return c->ops->accept(c, env, id, t, n);
}
static inline void pgd_constraint_start(pgd_constraint *c, pgd_grammar_scratch *sc) {
    if (c->ops->start) c->ops->start(c, sc);
}
/* Frees c and everything it owns. NULL: no-op. */
static inline void pgd_constraint_free(pgd_constraint *c) {
    if (c) c->ops->free(c);
}

/* The constructors: PGD_OK and *out (the caller's), or a negative status with *out NULL and the
 * request's error line in why (whylen bytes). What they are given is borrowed and copied. */

/* Any JSON object (schema and compiled NULL), or a document of a JSON Schema: its text, or
 * compiled already (compiled wins); prefix and suffix (or NULL): text the document must come
 * right after and right before. */
int pgd_constraint_json_new(const char *schema, const pgd_json_schema *compiled,
                            const char *prefix, const char *suffix, pgd_constraint **out,
                            char *why, size_t whylen);
/* One of choices[0..n) (each 1 or more bytes). */
int pgd_constraint_choice_new(const char *const *choices, int32_t n, pgd_constraint **out);
/* A match of a regular expression: its pattern, or compiled already (compiled wins). Keeps a
 * memo of masks of n_vocab bytes. */
int pgd_constraint_regex_new(const char *pattern, const pgd_regex *compiled, int32_t n_vocab,
                             pgd_constraint **out, char *why, size_t whylen);
/* A sentence of a grammar: its text, or compiled already (compiled wins). Starts on the engine
 * thread (pgd_constraint_start). Keeps a memo of masks of n_vocab bytes. */
int pgd_constraint_grammar_new(const char *text, const pgd_grammar *compiled, int32_t n_vocab,
                               pgd_constraint **out, char *why, size_t whylen);

/* "Think first, then constrain" (vLLM's reasoning with structured output): wraps inner (taken:
 * freed with the wrapper, or on failure) so that it holds nothing back while the answer thinks,
 * and applies from the token after the one that completes `after` (the reasoning's end,
 * "</think>"). think_tok >= 0: the thinking has not begun, and the answer may open it with that
 * token (any other first token starts the constraint at once); -1: it thinks from the start. */
int pgd_constraint_think_first_new(pgd_constraint *inner, const char *after, int32_t think_tok,
                                   pgd_constraint **out);

/* The masks of a constraint's last PGD_MASK_MEMO states (a pattern like [a-z ]+ stays in a few,
 * and its mask walks most of the vocabulary), each under its state's key: words that are equal
 * exactly when the states are (a regex's state number; a grammar's pgd_grammar_key). */
#define PGD_MASK_MEMO 4
typedef struct pgd_mask_memo {
    int32_t n_vocab, key_max, next; /* next: the slot the next put overwrites (the oldest) */
    uint8_t *mask[PGD_MASK_MEMO];   /* (n_vocab) each */
    int32_t *key;                   /* (PGD_MASK_MEMO, 1 + key_max): length (0: empty), words */
} pgd_mask_memo;

/* PGD_OK or PGD_ENOMEM (m is then freed with pgd_mask_memo_free as well). */
int pgd_mask_memo_init(pgd_mask_memo *m, int32_t n_vocab, int32_t key_max);
void pgd_mask_memo_free(pgd_mask_memo *m);
/* allow = the mask kept under key[0..n): true; false when none is (or n is 0: no key). */
bool pgd_mask_memo_get(const pgd_mask_memo *m, const int32_t *key, int32_t n, uint8_t *allow);
/* Keeps allow under key[0..n) over the oldest entry; n 0 (no key): keeps nothing. */
void pgd_mask_memo_put(pgd_mask_memo *m, const int32_t *key, int32_t n, const uint8_t *allow);

#endif
