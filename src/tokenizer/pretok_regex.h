/* The general pre-tokenizer regex engine: the Oniguruma (Ruby syntax) subset that Hugging Face
 * tokenizers' Split patterns use, with the leftmost-first (Perl-style backtracking) semantics of
 * Oniguruma's search and of the find_iter HF's Split runs -- over code points whose Unicode
 * categories are looked up once per subject.
 *
 * Supported: literals and escapes (\t \n \r \f \v \a \e \xHH \x{H..} \uHHHH, escaped
 * punctuation), . (any character but \n; (?m) makes it any), classes [...] and [^...] with
 * ranges, nested classes and && intersection, \s \S \d \D \w \W \h \H, \p{..} \P{..} \p{^..}
 * (general categories by short or long name, L& / LC, Any, Han, White_Space/Space, Alphabetic
 * is not), alternation, groups (capturing, (?:..), named), (?i) (?-i) (?m) flags and their
 * scoped forms (?i:..), quantifiers ? * + {n} {n,} {n,m} {,m}, lazy (??, *?, +?, {n,m}?) and
 * possessive on one-character atoms (?+, *+, ++), lookahead (?=..) (?!..), anchors ^ $ (line
 * anchors, as in Ruby) \A \z \Z \b \B. Refused with a message: backreferences, lookbehind,
 * atomic groups, \G \K \R \X, POSIX brackets, (?x), and a repetition whose body can match the
 * empty string without bound (the memo below relies on every loop consuming).
 *
 * Bounded work: a memo of failed (branch instruction, position) states, kept for the whole
 * subject (a state's outcome does not depend on where the search began, and the engine keeps no
 * captures), a success memo inside lookahead bodies, and per-run caches; so all the searches of
 * one find_iter together visit each (branch instruction, position) once -- time linear in the
 * subject for a given pattern, never exponential, whatever the input. Memory: the memo, two bits
 * per branch instruction and position, in caller-owned scratch reused between calls. */
#ifndef PGD_TOKENIZER_PRETOK_REGEX_H
#define PGD_TOKENIZER_PRETOK_REGEX_H

#include <stddef.h>
#include <stdint.h>

#include "tokenizer/tok_internal.h"

typedef struct pgd_re pgd_re; /* compiled, immutable: share it between threads */

/* Compiles pattern[0..len) (UTF-8). On failure returns PGD_EUNSUPPORTED (a construct outside
 * the subset), PGD_EFORMAT (a malformed pattern) or PGD_ENOMEM, with a one-line reason in msg. */
int pgd__re_compile(const char *pattern, size_t len, pgd_re **out, char *msg, size_t msg_cap);
/* Compiles a pattern that matches the text s[0..len) literally (HF's Split String pattern). */
int pgd__re_compile_literal(const char *s, size_t len, pgd_re **out, char *msg, size_t msg_cap);
void pgd__re_free(pgd_re *re);

/* A subject: n code points (invalid UTF-8 bytes as PGD_UNI_INVALID | byte) and each one's
 * pgd__uni_gcp byte. The engine reads only [0, n): lookaheads and anchors stop at its ends. */
typedef struct pgd_re_subject {
    const uint32_t *cp;
    const uint8_t *cat;
    uint32_t n;
} pgd_re_subject;

/* pgd_re_scratch (tok_internal.h): the searches' memo, frames and caches; grown as needed,
 * kept between calls. */
void pgd__re_scratch_free(pgd_re_scratch *sc);

/* Every match of re in the subject in order, as Oniguruma's find_iter gives them to HF's Split:
 * leftmost-first matches, searching on from the end of the last one; an empty match right where
 * the previous match ended is skipped (the search moves one character on). Calls fn(ctx, start,
 * end) (code point indices) for each; stops at fn's first non-zero return and returns it, or
 * PGD_ENOMEM. */
typedef int (*pgd_re_match_fn)(void *ctx, uint32_t start, uint32_t end);
int pgd__re_find_iter(const pgd_re *re, const pgd_re_subject *subj, pgd_re_scratch *sc,
                      pgd_re_match_fn fn, void *ctx);

/* The first match at or after start: its bounds in *ms, *me; 1 if found, 0 if none, or
 * PGD_ENOMEM. (The memo is rebuilt for each call: for tests.) */
int pgd__re_search(const pgd_re *re, const pgd_re_subject *subj, uint32_t start,
                   pgd_re_scratch *sc, uint32_t *ms, uint32_t *me);

/* Decodes s[0..n) into code points, their categories and byte offsets (off: n_cps + 1 entries;
 * cp/cat/off hold n + 1). Returns the number of code points. byte_level: each byte is one
 * character, the one GPT-2's byte-to-unicode map gives it (what HF's patterns see after a
 * ByteLevel step). */
uint32_t pgd__re_decode(const char *s, size_t n, bool byte_level, uint32_t *cp, uint8_t *cat,
                        uint32_t *off);

#endif
