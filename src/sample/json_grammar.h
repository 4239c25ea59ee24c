/* JSON-constrained decoding (OpenAI response_format {"type": "json_object"}): a byte-level
 * recognizer of RFC 8259 JSON and the per-step mask of the tokens that keep the output a prefix
 * of a JSON object.
 *
 * The recognizer is a pushdown automaton small enough to copy per candidate token
 * (pgd_json_state, under 64 bytes): the mask runs every vocabulary token's decoded bytes through
 * a copy of the sequence's state and keeps the tokens that are accepted. Strings must be
 * well-formed UTF-8 (as the rest of Pagoda's text), so a constrained answer is always valid JSON
 * for strict parsers once complete.
 *
 * Bounds that real JSON never meets but a weak model in a loop would (each makes the mask refuse
 * more, never accept more): nesting depth PGD_JSON_MAX_DEPTH, PGD_JSON_MAX_WS whitespace bytes
 * in a row, PGD_JSON_MAX_NUM bytes in a number. */
#ifndef PGD_SAMPLE_JSON_GRAMMAR_H
#define PGD_SAMPLE_JSON_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PGD_JSON_MAX_DEPTH 32
#define PGD_JSON_MAX_WS 48
#define PGD_JSON_MAX_NUM 40

typedef struct pgd_json_state {
    uint8_t mode, phase;  /* what comes next; a number's or a string's sub-state */
    uint8_t key;          /* the string being read is an object key */
    uint8_t need, lo, hi; /* UTF-8: continuation bytes left, range of the next one */
    uint8_t hex;          /* \uXXXX: hex digits left */
    uint8_t lit, lit_pos; /* literal (true/false/null) and the bytes of it read */
    uint8_t ws, num_len;  /* whitespace run, number length */
    uint8_t object_only;  /* the top-level value must be an object */
    int16_t depth;
    uint8_t stack[PGD_JSON_MAX_DEPTH]; /* 1: object, 0: array */
} pgd_json_state;

/* A state before any byte. object_only: the document must be an object (json_object mode);
 * else any JSON value. */
void pgd_json_init(pgd_json_state *st, bool object_only);
/* Feeds s[0..n); false when some byte cannot continue a JSON document (st is then undefined:
 * feed a copy). */
bool pgd_json_feed(pgd_json_state *st, const char *s, size_t n);
/* The bytes fed so far are a whole JSON document (trailing whitespace allowed). */
bool pgd_json_complete(const pgd_json_state *st);

/* Each token's decoded bytes, as the detokenizer renders them (control tokens: none), which
 * tokens end a generation, and an index for the mask. Built once per engine: the caller fills
 * n, text, len and eog (malloc'd), then calls pgd_json_vocab_index. */
typedef struct pgd_json_vocab {
    int32_t n;            /* ids 0..n: the model's vocabulary (may exceed the tokenizer's) */
    const char **text;    /* (n) borrowed from the tokenizer; NULL: renders as nothing */
    uint32_t *len;        /* (n) */
    uint8_t *eog;         /* (n) end-of-generation token */
    /* index: the tokens that can be text (not empty, not end-of-generation) in a trie; those
     * without a quote that a string (between characters) accepts; those with a quote */
    int32_t *sorted;      /* (n_text) text token ids in byte order of their text */
    int32_t n_text;
    struct pgd_json_node *nodes; /* (n_nodes) the trie of the texts in depth-first order */
    int32_t n_nodes;
    pgd_json_state *stack;/* (max_len + 1) the walk's states by depth (scratch) */
    uint8_t *plain;       /* (n) 1: no quote, accepted inside any string */
    int32_t n_plain;
    int32_t *quoted;     /* (n_quoted) the text tokens with a quote */
    int32_t n_quoted;
} pgd_json_vocab;

/* Builds the index from n, text, len and eog; PGD_OK or PGD_ENOMEM. */
int pgd_json_vocab_index(pgd_json_vocab *v);
/* Frees every array of v (text, len and eog included). */
void pgd_json_vocab_free(pgd_json_vocab *v);

/* allow[0..v->n) = 1 for the tokens that may come next in state st, else 0; returns how many
 * are allowed. A complete document allows only end-of-generation tokens (no trailing
 * whitespace loop); an incomplete one allows none of them, nor a token that renders as
 * nothing. Inside a string the precomputed plain tokens are taken as they are and those with a
 * quote tried; elsewhere the trie is walked, each shared prefix fed once and a refused byte skipping
 * its whole subtree. Uses v's scratch: one caller at a time. */
int32_t pgd_json_allowed(const pgd_json_state *st, pgd_json_vocab *v, uint8_t *allow);

#endif
