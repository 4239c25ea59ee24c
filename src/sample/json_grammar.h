/* JSON-constrained decoding (OpenAI response_format {"type": "json_object"} and
 * {"type": "json_schema"}): a byte-level recognizer of RFC 8259 JSON, optionally held to a
 * compiled JSON Schema (pgd_json_schema, json_schema.c), and the per-step mask of the tokens that
 * keep the output a prefix of an accepted document.
 *
 * The recognizer is a pushdown automaton small enough to copy per candidate token
 * (pgd_json_state, a few hundred bytes): the mask runs the vocabulary's decoded bytes through
 * copies of the sequence's state and keeps the tokens that are accepted. Strings must be
 * well-formed UTF-8 (as the rest of Pagoda's text) and \u escapes of surrogates come in pairs,
 * so a constrained answer is valid JSON for strict parsers once complete (a number's range is
 * not checked: 1e400 is JSON, if not a double).
 *
 * With a schema, the recognizer refuses every byte that no valid completion could follow (a key
 * that is no property, a ',' with no property left, a '}' before the required ones, a value of
 * the wrong type, an enum value no candidate starts with), so a masked generation never reaches
 * a dead end. It produces one form of each value: keys of a schema's objects without escapes
 * (as the schema writes its properties), enum and const values as compact JSON whose numbers
 * read back exactly (pgd_json_print_exact), integers without fraction or exponent.
 *
 * Bounds that real JSON never meets but a weak model in a loop would (each makes the mask refuse
 * more, never accept more): nesting depth PGD_JSON_MAX_DEPTH, PGD_JSON_MAX_NUM bytes in a
 * number, and whitespace between tokens as llama.cpp's JSON grammars bound it (its
 * `space ::= | " " | "\n"{1,2} [ \t]{0,20}`): nothing, one space, or one or two newlines and
 * up to PGD_JSON_MAX_INDENT spaces or tabs, so an answer stays compact (no '\r', no run of
 * blank lines). */
#ifndef PGD_SAMPLE_JSON_GRAMMAR_H
#define PGD_SAMPLE_JSON_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PGD_JSON_MAX_DEPTH 32
#define PGD_JSON_MAX_INDENT 20
#define PGD_JSON_MAX_NUM 40

#define PGD_JSON_SCHEMA_DEPTH 16 /* containers a schema may nest (deeper values: any JSON) */
#define PGD_JSON_SCHEMA_MAX 64   /* properties of one object, values of one enum */

/* JSON Schema types, as bits (NUM admits integers) */
enum { PGD_JT_OBJ, PGD_JT_ARR, PGD_JT_STR, PGD_JT_NUM, PGD_JT_INT, PGD_JT_BOOL, PGD_JT_NULL,
       PGD_JT_N };

typedef struct pgd_json_prop {
    char *name;             /* owned; no character JSON would escape */
    uint32_t len;
    int32_t node;           /* schema of its value (-1: any) */
} pgd_json_prop;

typedef struct pgd_json_node {
    uint8_t types;          /* PGD_JT_* bits; 0 for an enum node */
    int16_t by_type[PGD_JT_N]; /* anyOf: the branch taking each type (disjoint), else itself */
    int32_t prop0, n_props; /* object: props[prop0 .. + n_props) */
    uint64_t required;      /* bits of those props */
    bool additional;        /* other keys allowed, their values of schema addl (-1: any) */
    int32_t addl;
    int32_t items;          /* array: schema of the items (-1: any) */
    int32_t min_items, max_items;
    int32_t min_len, max_len; /* string: characters (code points), minLength / maxLength */
    int32_t pattern;        /* string: its pattern, regex[pattern] (a whole match), or -1 */
    /* number or integer: minimum / maximum (exclusive ones folded in) as the integers allowed,
       within +-(10^15 - 1), and as given (for a fraction: -inf / inf when absent) */
    bool bounded;
    int64_t ilo, ihi;
    int64_t fplo, fphi, fnlo, fnhi; /* magnitudes of a fraction's integer part, by sign */
    double lo, hi;
    bool lo_excl, hi_excl;
    int32_t enum0, n_enum;  /* enum / const: enum_text[enum0 .. + n_enum) */
    /* a union of objects told apart by a tag (a required property of one string value, the
       same name in each, written first): the node has that one property, whose enum holds the
       tags; once a tag is read, the object goes on as variant k's node (var_node[var0 + k]) */
    int32_t var0, n_var;
} pgd_json_node;

typedef struct pgd_json_schema {
    pgd_json_node *nodes;
    int32_t n_nodes, cap_nodes;
    pgd_json_prop *props;
    int32_t n_props, cap_props;
    char **enum_text;       /* owned compact JSON of each enum value */
    uint32_t *enum_len;
    uint8_t *enum_num;      /* the value is a number (ends only at the byte after it) */
    int32_t n_enum, cap_enum;
    struct pgd_regex *regex;/* (n_regex) compiled patterns */
    int32_t n_regex;
    int32_t *var_node;      /* tagged unions' variants (their object nodes) */
    uint8_t *var_prop;      /* the tag's property index in each variant */
    int32_t n_var, cap_var;
    int32_t root;
    /* owned text the document must come right after and right before (tool calls), or NULL;
       set by the caller after compiling */
    char *prefix, *suffix;
} pgd_json_schema;

typedef struct pgd_json_state {
    uint8_t mode, phase;  /* what comes next; a number's or a string's sub-state */
    uint8_t key;          /* the string being read is an object key */
    uint8_t need, lo, hi; /* UTF-8: continuation bytes left, range of the next one */
    uint8_t hex;          /* \uXXXX: hex digits left */
    uint8_t surr;         /* a high surrogate's escape was read: a low one's must follow */
    uint16_t hexval;      /* the escape's value so far */
    uint8_t lit, lit_pos; /* literal (true/false/null) and the bytes of it read */
    uint8_t ws, num_len;  /* the whitespace so far (json_grammar.c's ws_byte), number length */
    uint8_t object_only;  /* the top-level value must be an object */
    int16_t depth;
    uint8_t stack[PGD_JSON_MAX_DEPTH]; /* 1: object, 0: array */
    /* with a schema (sc not NULL) */
    const pgd_json_schema *sc;
    int16_t vnode;        /* schema node of the next value (-1: any JSON) */
    int16_t enode;        /* J_ENUM: the node matched against */
    uint8_t int_only;     /* the number being read must be an integer */
    uint8_t nneg;         /* the number being read is negative */
    uint8_t nfrac;        /* its fraction's first digit: frac_ok's restrictions */
    int16_t nnode;        /* its node with bounds (-1: none) */
    int16_t snode;        /* the string being read: its node with lengths or a pattern (-1:
                             none) */
    uint16_t slen;        /* its characters so far (saturating) */
    int32_t sre;          /* its pattern's DFA state over the decoded text (-1: no pattern) */
    uint16_t hsurr;       /* a high surrogate's escaped value, until its low one's */
    int64_t nval;         /* the number's integer digits so far, as a magnitude */
    uint8_t kmatch;       /* the key being read must be one of the object's properties */
    uint16_t pos;         /* bytes read of the key or enum value */
    uint64_t cand;        /* properties / enum values the bytes so far still match */
    /* each open container (the first depth are live; last, so that a copy can stop there) */
    struct pgd_json_frame {
        uint64_t seen;    /* an object's properties so far */
        int16_t node;     /* its schema node (-1: any) */
        uint16_t count;   /* an array's items so far */
    } frame[PGD_JSON_SCHEMA_DEPTH];
} pgd_json_state;

/* A state before any byte. object_only: the document must be an object (json_object mode);
 * else any JSON value. */
void pgd_json_init(pgd_json_state *st, bool object_only);
/* A state before any byte of a document held to schema sc (borrowed; its root is an object's
 * or, from pgd_json_schema_compile_root, an array's schema). */
void pgd_json_init_schema(pgd_json_state *st, const pgd_json_schema *sc);

/* Compiles a JSON Schema (the text of the "schema" object of OpenAI's json_schema
 * response_format). Supported: type (one or several), properties, required,
 * additionalProperties (boolean or schema), items, minItems, maxItems, minLength, maxLength,
 * minimum, maximum, exclusiveMinimum, exclusiveMaximum, enum, const, anyOf and
 * oneOf whose branches take disjoint types, $ref into #/$defs or #/definitions (not recursive,
 * no escaped paths; $id only at the root); enum/const beside type keep the values of that type.
 * Annotations (title, description, default, examples, format, $schema, ...) are ignored. Any
 * other keyword is refused, as are a root that is not an object, nesting deeper than
 * PGD_JSON_SCHEMA_DEPTH, more than PGD_JSON_SCHEMA_MAX properties or enum values in one place, a
 * required property that is not in properties, a keyword twice, text that is not UTF-8 or holds
 * \u0000, enum numbers that are not finite or are integers past 2^53, and a schema that expands
 * ($refs are compiled where used) past a budget of nodes, properties and enum bytes. On failure
 * returns PGD_EINVAL (or PGD_ENOMEM) with the reason in msg. */
int pgd_json_schema_compile(const char *text, size_t len, pgd_json_schema *out, char *msg,
                            size_t msg_len);
/* The same, where array_ok also takes a root that is an array's schema (vLLM's forced tool
 * calls without a tool-call format: a list of calls). */
int pgd_json_schema_compile_root(const char *text, size_t len, bool array_ok,
                                 pgd_json_schema *out, char *msg, size_t msg_len);
void pgd_json_schema_free(pgd_json_schema *sc);
/* dst = a deep copy of src (without its prefix and suffix): one compile serves many sequences.
 * PGD_OK or PGD_ENOMEM (dst then empty). */
int pgd_json_schema_copy(pgd_json_schema *dst, const pgd_json_schema *src);

struct cJSON;
/* v as compact JSON whose numbers read back exactly (the shortest such text; cJSON's own
 * printing rounds to 15 digits), malloc'd; NULL for a number that is not finite, or out of
 * memory. Enum values are matched in this form, and the server hands schemas on in it. */
char *pgd_json_print_exact(const struct cJSON *v);
/* Is there a \u0000 escape in the JSON text b[0..n)? (cJSON's strings end at a NUL.) */
bool pgd_json_has_nul_escape(const char *b, size_t n);
/* Feeds s[0..n); false when some byte cannot continue a JSON document (st is then undefined:
 * feed a copy). */
bool pgd_json_feed(pgd_json_state *st, const char *s, size_t n);
/* The bytes fed so far are a whole JSON document (trailing whitespace allowed). */
bool pgd_json_complete(const pgd_json_state *st);

/* Each token's decoded bytes, as the detokenizer renders them (control tokens: none), which
 * tokens end a generation, and an index for the mask. Built once per engine
 * (pgd_json_vocab_build). */
typedef struct pgd_json_vocab {
    int32_t n;            /* ids 0..n: the model's vocabulary (may exceed the tokenizer's) */
    const char **text;    /* (n) borrowed from the tokenizer; NULL: renders as nothing */
    uint32_t *len;        /* (n) */
    uint8_t *eog;         /* (n) end-of-generation token */
    /* index: the tokens that can be text (not empty, not end-of-generation) in a trie; those
     * without a quote that a string (between characters) accepts; those with a quote */
    int32_t *sorted;      /* (n_text) text token ids in byte order of their text */
    int32_t n_text, max_len; /* max_len: the longest text's bytes (the trie's depth) */
    struct pgd_json_trie *trie; /* (n_trie) the trie of the texts in depth-first order */
    int32_t n_trie;
    pgd_json_state *stack;/* (max_len + 1) the walk's states by depth (scratch) */
    int32_t *dfa_stack;   /* (max_len + 1) the same for pgd_json_vocab_walk_dfa */
    int32_t *char_stack;  /* (max_len + 1) characters so far by depth (a pattern's string) */
    uint8_t *plain;       /* (n) 1: no quote, accepted inside any string */
    uint16_t *nchar;      /* (n) a plain token's characters (for maxLength) */
    int32_t *long_first;  /* (n_plain) the plain tokens, most characters first */
    int32_t n_plain;
    int32_t *quoted;     /* (n_quoted) the text tokens with a quote */
    int32_t n_quoted;
    int32_t *escaped;    /* (n_escaped) the plain tokens with a backslash */
    int32_t n_escaped;
} pgd_json_vocab;

/* Builds the index from n, text, len and eog; PGD_OK or PGD_ENOMEM. */
int pgd_json_vocab_index(pgd_json_vocab *v);
struct pgd_tokenizer;
/* All of v for a model of n_vocab ids (past the tokenizer's: nothing) with tokenizer t, which
 * must outlive v (text borrows from it); PGD_OK or PGD_ENOMEM. */
int pgd_json_vocab_build(pgd_json_vocab *v, const struct pgd_tokenizer *t, int32_t n_vocab);
/* allow[id] = 1 (the rest left as they are) for every text token whose text is a prefix of
 * r[0..n), the empty text excepted: the tokens that can come next when the output must go on
 * with r (vLLM's guided_choice). O(n log n_text). */
void pgd_json_vocab_allow_prefixes(const pgd_json_vocab *v, const char *r, size_t n,
                                   uint8_t *allow);
/* allow[0..v->n) = 1 for the text tokens whose bytes regex re's DFA (regex.h) takes from state
 * q without reaching -1, else 0; returns how many. The trie is walked, a refused byte skipping
 * its whole subtree. Uses v's scratch. */
int32_t pgd_json_vocab_walk_dfa(pgd_json_vocab *v, const struct pgd_regex *re, int32_t q,
                                uint8_t *allow);
/* allow[0..v->n) = 1 for the text tokens whose every prefix step() takes, else 0; returns how
 * many. step(ctx, d, b) makes the walk's state at depth d (bytes) from the one at depth d - 1
 * (depth 0: the caller's) and byte b, false when b is refused: the trie is walked in depth-first
 * order, a refused byte skipping its whole subtree. */
int32_t pgd_json_vocab_walk(const pgd_json_vocab *v, bool (*step)(void *ctx, int32_t d, uint8_t b),
                            void *ctx, uint8_t *allow);
/* The lowest id of a text token whose text is exactly t[0..n), or -1. */
int32_t pgd_json_vocab_find(const pgd_json_vocab *v, const char *t, size_t n);
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
