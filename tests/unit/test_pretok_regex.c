/* The general pre-tokenizer regex engine (src/tokenizer/pretok_regex.c) and its pipelines:
 * constructs, leftmost-first priority, case-insensitivity, lookahead, anchors, Oniguruma's
 * find_iter rule for empty matches, Split behaviors, refusals, and bounded work on hostile input
 * (the engine's step count grows linearly with the input; no timing is asserted). The expected
 * values are Oniguruma's (HF tokenizers' engine): tests/integration/test_pretok_general.py checks
 * the same engine against it on whole corpora. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "tokenizer/pretok_pipe.h"
#include "tokenizer/pretok_regex.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

/* Matches of pattern in text, joined as "m1|m2|..." (find_iter; empty matches as ""). */
typedef struct collect {
    const char *text;
    const uint32_t *off;
    char out[4096];
    size_t n;
    int count;
} collect;

static int on_match(void *ctx, uint32_t s, uint32_t e) {
    collect *c = ctx;
    size_t a = c->off[s], b = c->off[e];
    if (c->count++ && c->n < sizeof c->out - 1) c->out[c->n++] = '|';
    if (c->n + (b - a) < sizeof c->out - 1) {
        memcpy(c->out + c->n, c->text + a, b - a);
        c->n += b - a;
    }
    c->out[c->n] = 0;
    return 0;
}

/* Runs find_iter; returns its step count (or -1 on a compile error) and the matches in c. */
static long long matches(const char *pattern, const char *text, size_t len, collect *c) {
    pgd_re *re;
    char msg[200];
    if (pgd__re_compile(pattern, strlen(pattern), &re, msg, sizeof msg) != 0) {
        fprintf(stderr, "  compile '%s': %s\n", pattern, msg);
        return -1;
    }
    uint32_t *cp = malloc(sizeof(uint32_t) * (len + 1));
    uint32_t *off = malloc(sizeof(uint32_t) * (len + 1));
    uint8_t *cat = malloc(len + 1);
    uint32_t m = pgd__re_decode(text, len, false, cp, cat, off);
    pgd_re_subject subj = {cp, cat, m};
    pgd_re_scratch sc;
    memset(&sc, 0, sizeof sc);
    memset(c, 0, sizeof *c);
    c->text = text;
    c->off = off;
    int rc = pgd__re_find_iter(re, &subj, &sc, on_match, c);
    long long steps = rc ? -1 : (long long)sc.steps;
    pgd__re_scratch_free(&sc);
    pgd__re_free(re);
    free(cp);
    free(off);
    free(cat);
    return steps;
}

static bool expect(const char *pattern, const char *text, const char *want) {
    collect c;
    if (matches(pattern, text, strlen(text), &c) < 0) return false;
    if (strcmp(c.out, want) != 0) {
        fprintf(stderr, "  /%s/ on \"%s\": got \"%s\", want \"%s\"\n", pattern, text, c.out, want);
        return false;
    }
    return true;
}

static void constructs(void) {
    /* leftmost-first alternation, not longest */
    CHECK(expect("a|ab", "ab", "a"));
    CHECK(expect("ab|a", "ab", "ab"));
    CHECK(expect("(a|ab)(c|bcd)(d*)", "abcd", "abcd"));
    CHECK(expect("(?:ab|a)(?:bc|b)?", "abc", "ab"));
    /* quantifiers: greedy, lazy, possessive, intervals */
    CHECK(expect("a+", "aaa baa", "aaa|aa"));
    CHECK(expect("a+?", "aaa", "a|a|a"));
    CHECK(expect("a{2}", "aaaaa", "aa|aa"));
    CHECK(expect("a{2,3}", "aaaaaaa", "aaa|aaa"));
    CHECK(expect("a{2,}", "a aa aaaa", "aa|aaaa"));
    CHECK(expect("a{,2}b", "aaab", "aab"));
    CHECK(expect("a{2,3}?", "aaaa", "aa|aa"));
    CHECK(expect("a{2}?", "aab", "aa|")); /* Ruby: (?:a{2})?, no lazy form */
    CHECK(expect("[ab]++b", "aabb", ""));  /* the run keeps every b: nothing is left for b */
    CHECK(expect("[ab]+b", "aabb", "aabb"));
    CHECK(expect("x{", "x{", "x{")); /* not an interval: literal */
    CHECK(expect("\\d{1,3}", "1234567", "123|456|7"));
    /* classes */
    CHECK(expect("[a-c]+", "abcdcba", "abc|cba"));
    CHECK(expect("[^a-c]+", "abcdcba", "d"));
    CHECK(expect("[a-z&&[^aeiou]]+", "strength", "str|ngth"));
    CHECK(expect("[]a]+", "a]b", "a]"));
    CHECK(expect("[a-]+", "a-b", "a-"));
    CHECK(expect("[^(\\s|[.,!?])]+", "hi, you (x)!", "hi|you|x"));
    CHECK(expect("\\p{L}+", "h\xc3\xa9llo w\xc3\xb6rld 42", "h\xc3\xa9llo|w\xc3\xb6rld"));
    CHECK(expect("\\p{N}+", "x\xe2\x85\xab y\xc2\xbd 42", "\xe2\x85\xab|\xc2\xbd|42"));
    CHECK(expect("\\P{L}+", "ab12cd", "12"));
    CHECK(expect("[\\p{^L}]+", "ab12cd", "12"));
    CHECK(expect("\\p{Lu}\\p{Ll}*", "HelloWorld", "Hello|World"));
    CHECK(expect("\\p{Han}+", "\xe4\xb8\xad\xe6\x96\x87" "abc\xe3\x81\x82",
                 "\xe4\xb8\xad\xe6\x96\x87"));
    CHECK(expect("[\\x{4E00}-\\x{9FFF}]+", "a\xe4\xb8\xad", "\xe4\xb8\xad"));
    CHECK(expect("\\x41\\u00e9", "A\xc3\xa9", "A\xc3\xa9"));
    CHECK(expect("\\s+", "a \t\n\xc2\xa0" "b", " \t\n\xc2\xa0"));
    CHECK(expect("\\d+", "a12\xd9\xa3" "b", "12\xd9\xa3"));
    CHECK(expect("\\h+", "xff09g", "ff09"));
    CHECK(expect("\\w+", "a_1\xc2\xb2 b", "a_1\xc2\xb2|b")); /* Oniguruma's \w has U+00B2 */
    CHECK(expect(".", "a\nb", "a|b"));
    CHECK(expect("(?m:.)+", "a\nb", "a\nb"));
    CHECK(expect("\\.\\*\\+\\?\\(\\)\\[\\]\\{\\}\\|\\\\", ".*+?()[]{}|\\", ".*+?()[]{}|\\"));
    /* case-insensitive: ASCII, the long s and the Kelvin sign */
    CHECK(expect("(?i:'s|'ll)", "it'S we'LL x'\xc5\xbf", "'S|'LL|'\xc5\xbf"));
    CHECK(expect("(?i)k", "kK\xe2\x84\xaax", "k|K|\xe2\x84\xaa"));
    CHECK(expect("(?i:[a-c])+", "ABCabcD", "ABCabc"));
    CHECK(expect("a(?i)b|c", "aBC", "aB")); /* Oniguruma: a(?i:b|c) */
    CHECK(expect("x(?i)y(?-i)z|w", "xYz xYZ W w", "xYz"));
    CHECK(expect("(?i:a)b", "Ab AB", "Ab"));
    /* lookahead */
    CHECK(expect("\\s+(?!\\S)|\\s+", "a   b  ", "  | |  "));
    CHECK(expect("\\d(?=px)", "1px 2em", "1"));
    CHECK(expect("\\d{1,3}(?=(?:\\d{3})*\\b)", "1234567", "1|234|567"));
    CHECK(expect("(?=(\\d{3})+(?!\\d))", "1234567", "|"));
    /* anchors: ^ and $ are line anchors (Ruby) */
    CHECK(expect("^a", "a\na", "a|a"));
    CHECK(expect("a$", "a\na", "a|a"));
    CHECK(expect("\\Aa|a\\z", "a\na", "a|a"));
    CHECK(expect("\\s+$", "x  \ny \t", "  | \t"));
    CHECK(expect("\\ba", "a ba a", "a|a"));
    CHECK(expect("a\\B", "ab a", "a"));
    /* find_iter: an empty match right where the last match ended is skipped */
    CHECK(expect("a*", "baa", "|aa"));
    CHECK(expect("x*", "ab", "||"));
    /* groups: named, comments */
    CHECK(expect("(?<d>\\d)+(?#digits)", "a12b", "12"));
}

static void refusals(void) {
    static const struct {
        const char *pattern, *needle;
        int rc;
    } cases[] = {
        {"(?<=a)b", "lookbehind", PGD_EUNSUPPORTED},
        {"(a)\\1", "backreferences", PGD_EUNSUPPORTED},
        {"(?>a)", "atomic", PGD_EUNSUPPORTED},
        {"(?:a*)*", "empty string", PGD_EUNSUPPORTED},
        {"(?:ab)++", "possessive", PGD_EUNSUPPORTED},
        {"(?i:ss)", "multi-character", PGD_EUNSUPPORTED},
        {"\\p{Greek}", "\\p{Greek}", PGD_EUNSUPPORTED},
        {"[[:alpha:]]", "POSIX", PGD_EUNSUPPORTED},
        {"\\G", "\\G", PGD_EUNSUPPORTED},
        {"(?x)a", "option", PGD_EUNSUPPORTED},
        {"[z-a]", "empty range", PGD_EFORMAT},
        {"(a", "missing ')'", PGD_EFORMAT},
        {"a)", "unmatched", PGD_EFORMAT},
        {"*a", "nothing to repeat", PGD_EFORMAT},
        {"[ab", "unterminated", PGD_EFORMAT},
        {"a{3,2}", "bad interval", PGD_EFORMAT},
        {"\\x{110000}", "out of range", PGD_EFORMAT},
        {"a\\", "backslash", PGD_EFORMAT},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        pgd_re *re = NULL;
        char msg[200] = "";
        int rc = pgd__re_compile(cases[k].pattern, strlen(cases[k].pattern), &re, msg, sizeof msg);
        bool ok = rc == cases[k].rc && strstr(msg, cases[k].needle) != NULL && re == NULL;
        if (!ok) fprintf(stderr, "  '%s': rc %d, \"%s\"\n", cases[k].pattern, rc, msg);
        CHECK(ok);
        pgd__re_free(re);
    }
    pgd_re *re = NULL;
    char msg[100];
    CHECK(pgd__re_compile("\xff", 1, &re, msg, sizeof msg) == PGD_EFORMAT); /* not UTF-8 */
}

/* Pieces of a pipeline joined with '|'. */
typedef struct pieces {
    char out[2048];
    size_t n;
    int count;
} pieces;

static int on_piece(void *ctx, const char *p, size_t len) {
    pieces *c = ctx;
    if (c->count++) c->out[c->n++] = '|';
    memcpy(c->out + c->n, p, len);
    c->n += len;
    c->out[c->n] = 0;
    return 0;
}

static bool split_is(const char *pattern, const char *behavior, bool invert, const char *text,
                     const char *want) {
    pgd_split_regex *r;
    pgd_err err = {{0}};
    if (pgd_split_regex_new(pattern, behavior, invert, &r, &err) != 0) {
        fprintf(stderr, "  %s\n", err.msg);
        return false;
    }
    pieces p;
    memset(&p, 0, sizeof p);
    pgd_split_regex_run(r, text, strlen(text), on_piece, &p);
    pgd_split_regex_free(r);
    if (strcmp(p.out, want) != 0) {
        fprintf(stderr, "  Split(/%s/, %s, invert=%d) on \"%s\": got \"%s\", want \"%s\"\n",
                pattern, behavior, invert, text, p.out, want);
        return false;
    }
    return true;
}

static void behaviors(void) {
    /* HF's SplitDelimiterBehavior on "a-b--c" with the delimiter "-" (the docs' examples) */
    CHECK(split_is("-", "Removed", false, "a-b--c", "a|b|c"));
    CHECK(split_is("-", "Isolated", false, "a-b--c", "a|-|b|-|-|c"));
    CHECK(split_is("-", "MergedWithPrevious", false, "a-b--c", "a-|b-|-|c"));
    CHECK(split_is("-", "MergedWithNext", false, "a-b--c", "a|-b|-|-c"));
    CHECK(split_is("-", "Contiguous", false, "a-b--c", "a|-|b|--|c"));
    CHECK(split_is("-", "Removed", true, "a-b--c", "-|-|-"));
    CHECK(split_is("\\p{L}+", "Contiguous", true, "ab, cd!", "ab|, |cd|!"));
    CHECK(split_is("x*", "Isolated", false, "ab", "a|b"));
}

static void pipelines(void) {
    /* falcon: Punctuation(Contiguous), ByteLevel(GPT-2 regex), Digits, [0-9]{3} after the byte
       map: "1234567" in the byte view is 1234567, cut 123|456|7 */
    const pgd_pretok_named *nm = pgd__pretok_named("falcon", 6);
    CHECK(nm != NULL && nm->fast == PGD_PRE_GENERAL);
    pgd_pretok *p = NULL;
    char msg[200];
    CHECK(nm &&
          pgd__pretok_build(nm->steps, pgd__pretok_named_steps(nm), &p, msg, sizeof msg) == 0);
    if (p) {
        pgd_pretok_scratch sc;
        memset(&sc, 0, sizeof sc);
        pieces out;
        memset(&out, 0, sizeof out);
        const char *t = "x=1234567;; ok";
        pgd__pretok_run(p, t, strlen(t), on_piece, &out, &sc);
        CHECK(strcmp(out.out, "x|=|123|456|7|;;| ok") == 0);
        if (strcmp(out.out, "x|=|123|456|7|;;| ok") != 0)
            fprintf(stderr, "  falcon: %s\n", out.out);
        pgd__pretok_scratch_free(&sc);
        pgd__pretok_free(p);
    }
    CHECK(pgd__pretok_named("deepseek-v3", 11) != NULL);
    CHECK(pgd__pretok_named("gpt-4o", 6) != NULL);
    CHECK(pgd__pretok_named("llama-bpe", 9)->fast == PGD_PRE_LLAMA3);
    CHECK(pgd__pretok_named("kimi-k2", 7) == NULL);
    CHECK(pgd__pretok_named("gpt", 3) == NULL);
    /* ByteLevel(add_prefix_space): a space before each piece that does not start with one */
    pgd_pretok_step_spec st[2];
    memset(st, 0, sizeof st);
    st[0].kind = PGD_STEP_SPLIT, st[0].pattern = ",", st[0].behavior = PGD_SPLIT_REMOVED;
    st[1].kind = PGD_STEP_BYTELEVEL, st[1].flag = true;
    CHECK(pgd__pretok_build(st, 2, &p, msg, sizeof msg) == 0);
    pgd_pretok_scratch sc;
    memset(&sc, 0, sizeof sc);
    pieces out;
    memset(&out, 0, sizeof out);
    pgd__pretok_run(p, "a,b, c", 6, on_piece, &out, &sc);
    CHECK(strcmp(out.out, " a| b| c") == 0);
    pgd__pretok_scratch_free(&sc);
    pgd__pretok_free(p);
}

/* The step count on n characters of a hostile input, for a pattern. */
static long long steps_on(const char *pattern, const char *unit, size_t n) {
    size_t ul = strlen(unit);
    char *s = malloc(n * ul + 2);
    for (size_t k = 0; k < n; k++) memcpy(s + k * ul, unit, ul);
    s[n * ul] = 0;
    collect c;
    long long st = matches(pattern, s, n * ul, &c);
    free(s);
    return st;
}

static void bounded_work(void) {
    static const struct {
        const char *pattern, *unit;
    } cases[] = {
        {"(?:a+)+b", "a"},          {"(?:a|a)*b", "a"},         {"(?:a|aa)*c", "a"},
        {"(x+x+)+y", "x"},          {"(.*a){12}", "a"},         {"\\s+$", " "},
        {"\\s+(?!\\S)|\\s+", " "},  {"(?:\\w+\\s?)*$", "ab "},  {"\\s*[\\r\\n]+", " "},
        {"\\d{1,3}(?=(?:\\d{3})*\\b)", "1"}, {"(?=(\\d{3})+(?!\\d))", "1"},
        {"(?:\\p{L}\\p{M}*(?: \\p{L}\\p{M}*)*)+x", "a "}, {"(?:a+?)+?b", "a"},
        {"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
         "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+", " "},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        long long a = steps_on(cases[k].pattern, cases[k].unit, 20000);
        long long b = steps_on(cases[k].pattern, cases[k].unit, 80000);
        /* linear: four times the input, about four times the steps (never sixteen) */
        bool ok = a > 0 && b > 0 && b <= 5 * a + 1000 && b <= 400 * 80000LL;
        if (!ok)
            fprintf(stderr, "  /%s/: %lld steps on 20k, %lld on 80k\n", cases[k].pattern, a, b);
        CHECK(ok);
    }
    /* and a megabyte finishes */
    CHECK(steps_on("(?:a+)+b", "a", 1000000) > 0);
}

int main(void) {
    constructs();
    refusals();
    behaviors();
    pipelines();
    bounded_work();
    return test_report("test_pretok_regex");
}
