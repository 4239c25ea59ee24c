/* Context-free grammars for constrained output, in llama.cpp's GBNF (vLLM's guided_grammar and
 * structured_outputs.grammar, whose xgrammar backend reads the same notation; llama.cpp's
 * "grammar"): the whole output must be a sentence of the rule named root.
 *
 * Syntax: rules `name ::= alternatives` (names of letters, digits, '-' and '_'); alternatives
 * separated by '|', each a sequence of: "literal" strings, [character classes] with ranges
 * and a leading '^' to negate, '.' (any character), rule names, (groups), each optionally
 * followed by *, +, ?, {m}, {m,}, {m,n}, {,n} (counts up to PGD_GRAMMAR_MAX_REPEAT); '#' starts a
 * comment. Escapes in literals and classes: \n \r \t \\ \" \[ \] \xHH \uHHHH \UHHHHHHHH. A rule
 * ends at a newline, except inside parentheses and after "::=" or '|' (llama.cpp's rule).
 *
 * A grammar with no "::=" is read in the Lark-like form vLLM converts for xgrammar: rules
 * `name: alternatives` (a leading '?' ignored), a line starting with '|' continuing the rule
 * above, 'single-quoted' literals too, "//" comments too, and the root the rule named start,
 * else the first one; the elements are otherwise GBNF's (no Lark regex terminals, [optional]
 * or %import).
 *
 * Refused at compile time, with a message: a syntax error, a rule used but never defined or
 * defined twice, no root rule, a class that matches no character, a rule reachable from root that
 * can never end (every derivation recurses forever), left recursion (direct, or through rules
 * that can match nothing), and a grammar past the size limits. So every state the matcher
 * reaches can still be completed: a masked generation never reaches a dead end.
 *
 * Matching is over the bytes of UTF-8 text, a character at a time (a character cut by a token's
 * end is matched as the set of characters its bytes so far can still become). The recognizer
 * keeps the set of parse stacks llama.cpp's grammar sampler keeps (tail calls do not grow a
 * stack); stacks are shared linked nodes, interned per step so equal ones are counted once. An
 * ambiguity that needs more than PGD_GRAMMAR_MAX_STACKS stacks at once, or a state of more than
 * PGD_GRAMMAR_MAX_NODES nodes, refuses the byte: the mask then refuses more, never accepts more. */
#ifndef PGD_SAMPLE_GRAMMAR_H
#define PGD_SAMPLE_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define PGD_GRAMMAR_MAX_LEN (64 * 1024) /* bytes of grammar text */
#define PGD_GRAMMAR_MAX_ELEMS 65536     /* elements, once repetitions are expanded */
#define PGD_GRAMMAR_MAX_REPEAT 1000     /* m and n of {m,n} */
#define PGD_GRAMMAR_MAX_STACKS 1024     /* parse stacks alive at once */
#define PGD_GRAMMAR_MAX_NODES 16384     /* stack nodes of a sequence's state */
/* stacks stepped and items expanded in one mask (pgd_grammar_allowed): about 0.1 s on one core
 * of the 2-core dev VM; a JSON string's first mask over Qwen2's 151,936 tokens takes 0.26 M */
#define PGD_GRAMMAR_MAX_WORK 10000000

typedef struct pgd_grammar {
    /* elements: -1 ends an alternative; 2c: a character of class c; 2r + 1: rule r */
    int32_t *el;
    int32_t n_el;
    int32_t *alt;       /* (n_alt) each alternative's first element */
    int32_t n_alt;
    int32_t *rule_alt;  /* (n_rules + 1) rule r's alternatives: alt[rule_alt[r] .. r + 1) */
    int32_t n_rules, root;
    uint32_t *ranges;   /* (2 n_ranges) sorted, disjoint, non-adjacent [lo, hi] code points */
    int32_t n_ranges;
    int32_t *cls;       /* (n_cls + 1) class c's ranges: ranges[2 cls[c] .. 2 cls[c + 1]) */
    uint8_t *cls_neg;   /* (n_cls) the class is every character but those */
    int32_t n_cls;
} pgd_grammar;

/* Compiles text[0..len). PGD_OK, or PGD_EINVAL with the reason in msg (or PGD_ENOMEM). */
int pgd_grammar_compile(const char *text, size_t len, pgd_grammar *out, char *msg,
                        size_t msg_len);
void pgd_grammar_free(pgd_grammar *g);
/* dst = a deep copy of src: PGD_OK or PGD_ENOMEM (dst then empty). */
int pgd_grammar_copy(pgd_grammar *dst, const pgd_grammar *src);

/* What a sequence keeps between steps: its parse stacks (nodes of (element, parent)) and the
 * bytes of a character cut by the last token. */
typedef struct pgd_grammar_state {
    int32_t *pos, *par; /* (PGD_GRAMMAR_MAX_NODES) node k: at element pos[k], then par[k] */
    int32_t n_nodes;
    int32_t *top;       /* (PGD_GRAMMAR_MAX_STACKS) each stack's top node (a character next) */
    int32_t n_top;
    bool can_end;       /* the bytes so far are a whole sentence */
    uint8_t need, ulen; /* a cut character: continuation bytes left, of a ulen-byte one */
    uint32_t acc;       /* its bits so far */
} pgd_grammar_state;

/* Scratch for feeding and masking, shared by the sequences of one engine (one caller at a
 * time): allocated once, so neither allocates. */
typedef struct pgd_grammar_scratch pgd_grammar_scratch;

/* A scratch for tokens of at most max_len bytes; NULL when out of memory. */
pgd_grammar_scratch *pgd_grammar_scratch_new(int32_t max_len);
void pgd_grammar_scratch_free(pgd_grammar_scratch *sc);

/* Allocates st's arrays (empty: nothing is accepted until pgd_grammar_state_start). PGD_OK or
 * PGD_ENOMEM (st then empty). Needs no scratch: any thread may call it. */
int pgd_grammar_state_init(pgd_grammar_state *st);
/* st = the state before any byte of a sentence of g (borrowed: it must outlive st's use).
 * Allocates nothing. A root past the limits leaves st accepting nothing. */
void pgd_grammar_state_start(pgd_grammar_state *st, const pgd_grammar *g, pgd_grammar_scratch *sc);
/* dst = src (both initialized). */
void pgd_grammar_state_assign(pgd_grammar_state *dst, const pgd_grammar_state *src);
void pgd_grammar_state_free(pgd_grammar_state *st);
/* Feeds s[0..n) to st; false (st unchanged) when some byte cannot continue a sentence. */
bool pgd_grammar_feed(pgd_grammar_state *st, const pgd_grammar *g, pgd_grammar_scratch *sc,
                      const char *s, size_t n);
/* The bytes so far are a whole sentence / some byte can follow them. */
static inline bool pgd_grammar_complete(const pgd_grammar_state *st) {
    return st->can_end && st->need == 0;
}
static inline bool pgd_grammar_extends(const pgd_grammar_state *st) { return st->n_top > 0; }

/* A state as words for a mask memo (a request keeps the masks of its last few states: in free
 * text, `[^\n]+` or a JSON string, every character comes back to the same stacks, and the walk
 * over a broad class visits most of the vocabulary's trie). Equal keys: equal states, so equal
 * masks; a state too large for a key is not memoized. */
#define PGD_GRAMMAR_KEY_MAX 256
typedef struct pgd_grammar_key {
    int32_t n;                      /* words of w; 0: no key (the state is too large) */
    int32_t w[PGD_GRAMMAR_KEY_MAX];
} pgd_grammar_key;
void pgd_grammar_state_key(const pgd_grammar_state *st, pgd_grammar_key *k);
static inline bool pgd_grammar_key_equal(const pgd_grammar_key *a, const pgd_grammar_key *b) {
    return a->n > 0 && a->n == b->n && !memcmp(a->w, b->w, (size_t)a->n * sizeof *a->w);
}

struct pgd_json_vocab;
/* allow[0..v->n) = 1 for the text tokens whose bytes can follow st, else 0 (end-of-generation
 * tokens: 0; the caller adds them where pgd_grammar_complete); returns how many. The vocabulary's
 * trie is walked, a refused byte skipping its whole subtree. A walk past PGD_GRAMMAR_MAX_WORK (an
 * ambiguity that keeps hundreds of stacks over a broad class) stops: -1, allow all 0, so that
 * one request cannot hold a shared engine for seconds a token. */
int32_t pgd_grammar_allowed(const pgd_grammar_state *st, const pgd_grammar *g,
                            pgd_grammar_scratch *sc, struct pgd_json_vocab *v, uint8_t *allow);
/* The same for tokens read less a leading space (a SentencePiece first piece, whose space the
 * text drops): a token that is a space alone is refused (it adds no text). */
int32_t pgd_grammar_allowed_drop_space(const pgd_grammar_state *st, const pgd_grammar *g,
                                       pgd_grammar_scratch *sc, struct pgd_json_vocab *v,
                                       uint8_t *allow);

#endif
