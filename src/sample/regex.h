/* Regular expressions for constrained output (vLLM's guided_regex / structured_outputs.regex):
 * a pattern compiled, once per request, into a DFA over the bytes of UTF-8 text, so the engine
 * can mask at every step the tokens whose bytes keep the output a prefix of a match.
 *
 * The whole output must match (Python's re.fullmatch, as vLLM's backends read a guided regex);
 * a leading "^" and a trailing "$" are allowed and change nothing. Syntax: literals (any UTF-8
 * text), ".", classes "[a-z0-9_]" / "[^...]" with ranges of any code points, the escapes \d \D
 * \w \W \s \S (ASCII: [0-9], [A-Za-z0-9_], [ \t\n\r\f\v]), \n \t \r \f \v \0, \xHH, \uHHHH,
 * \U00HHHHHH and escaped punctuation, groups "(...)" and "(?:...)", alternation "|", and the
 * quantifiers * + ? {n} {n,} {n,m} (a lazy "?" after one changes nothing for a full match).
 * Backreferences, lookaround, named groups, flags and possessive quantifiers are refused at
 * compile time with a message, as is a pattern whose automaton grows past the limits below or
 * that matches no string at all. "." and negated classes match any code point but the ones
 * excluded (and, for ".", "\n"), never a surrogate: the text stays well-formed UTF-8. */
#ifndef PGD_REGEX_H
#define PGD_REGEX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PGD_REGEX_MAX_LEN 4096      /* bytes of pattern */
#define PGD_REGEX_MAX_NFA 20000     /* NFA states (counted repeats are expanded) */
#define PGD_REGEX_MAX_DFA 16384     /* DFA states */
#define PGD_REGEX_MAX_TABLE (1 << 20) /* DFA states x byte classes (4 MiB of transitions) */
#define PGD_REGEX_MAX_WORK 20000000   /* NFA states visited building the DFA (tens of ms) */

typedef struct pgd_regex {
    int32_t n_states;   /* DFA states; 0 is the start */
    uint8_t cls[256];   /* each byte's class: bytes the pattern never tells apart share one */
    int32_t n_cls;
    int32_t *next;      /* (n_states * n_cls) the state after a byte of a class; -1: no match
                           can follow (pgd_regex_next) */
    uint8_t *accept;    /* (n_states) the bytes so far are a match */
    uint8_t *extend;    /* (n_states) some byte leads on (to a state a match can follow) */
    /* characters (UTF-8 lead bytes) from each state to a match, for minLength / maxLength:
       the fewest (saturating at 65535); unbounded: as many as wanted (a loop can be reached),
       else at most lmax */
    uint16_t *lmin, *lmax;
    uint8_t *unbounded;
    int64_t work;       /* what building it cost, in PGD_REGEX_MAX_WORK's units */
    /* after pgd_regex_length_sets (else NULL): bit k of lens[q * len_words ..] is set when a
       match can be reached from q in exactly k more characters, for k <= len_cap */
    uint64_t *lens;
    int32_t len_words, len_cap;
} pgd_regex;

/* Compiles pattern[0..len). PGD_OK, or PGD_EINVAL with the reason in msg (PGD_ENOMEM). */
int pgd_regex_compile(const char *pattern, size_t len, pgd_regex *out, char *msg,
                      size_t msg_len);
void pgd_regex_free(pgd_regex *re);
/* A deep copy of src into dst: PGD_OK or PGD_ENOMEM (dst then empty). */
int pgd_regex_copy(pgd_regex *dst, const pgd_regex *src);
/* Computes re->lens up to cap characters (maxLength), so that a length window is checked
 * exactly even where the match lengths have gaps ((ab)+ takes 2, 4, 6...). PGD_OK; PGD_ERANGE
 * past the work budget (lens stays NULL: callers fall back on lmin/lmax); PGD_ENOMEM. */
int pgd_regex_length_sets(pgd_regex *re, int32_t cap);
/* Whether a match can be reached from q in k more characters for some k in [lo, hi] (with
 * lens). Inline: the JSON mask asks it at every trie node of a string with a pattern. */
static inline bool pgd_regex_len_in(const pgd_regex *re, int32_t q, int64_t lo, int64_t hi) {
    if (lo < 0) lo = 0;
    if (hi > re->len_cap) hi = re->len_cap;
    if (lo > hi) return false;
    const uint64_t *l = re->lens + (size_t)q * (size_t)re->len_words;
    for (int64_t w = lo >> 6; w <= hi >> 6; w++) { /* the window's bits, a word at a time */
        uint64_t m = ~0ull;
        if (w == lo >> 6) m &= ~0ull << (lo & 63);
        if (w == hi >> 6 && (hi & 63) != 63) m &= (1ull << ((hi & 63) + 1)) - 1;
        if (l[w] & m) return true;
    }
    return false;
}
/* The state after byte b from state q (>= 0), or -1. */
static inline int32_t pgd_regex_next(const pgd_regex *re, int32_t q, uint8_t b) {
    return re->next[(size_t)q * (size_t)re->n_cls + re->cls[b]];
}
/* The state after bytes s[0..n) from state q, or -1 once no match can follow. */
int32_t pgd_regex_feed(const pgd_regex *re, int32_t q, const char *s, size_t n);

#endif
