/* GBNF grammars (grammar.h): a recursive-descent parser into rules of alternatives (groups and
 * repetitions become rules of their own, as llama.cpp rewrites them), the checks that keep every
 * reachable state completable, and the recognizer over parse stacks. */
#include "sample/grammar.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sample/json_grammar.h"
#include "tokenizer/unicode.h"
#include "util/parse.h"
#include "util/status.h"
#include "util/xalloc.h"

#define END (-1)
#define IS_REF(e) ((e) & 1)
#define EL_CHAR(c) (2 * (c))
#define EL_REF(r) (2 * (r) + 1)
#define MAX_CP 0x10FFFFu

/* ---- compiling ---- */

typedef struct ivec {
    int32_t *v;
    int32_t n, cap;
} ivec;

static int iv_push(ivec *a, int32_t x) {
    int rc = pgd_grow_i32(&a->v, a->n, &a->cap, 16, sizeof *a->v);
    if (rc) return rc;
    a->v[a->n++] = x;
    return PGD_OK;
}

typedef struct rule {
    ivec body;          /* elements, END after each alternative */
    const char *name;   /* in the text (not terminated), or NULL: a group or a repetition */
    uint32_t name_len;
    int32_t owner;      /* the named rule it was written in */
    bool defined;
} rule;

typedef struct parser {
    const char *start, *p, *end;
    char *msg;
    size_t msg_len;
    int rc;             /* first error */
    rule *rules;
    int32_t n_rules, cap_rules;
    ivec ranges, cls;   /* class c: ranges pairs [cls[c], cls[c + 1]) once closed */
    ivec neg;
    int64_t n_elems;
    int32_t cur;        /* the named rule being parsed */
    bool lark;          /* the Lark-style form (grammar.h) */
    int32_t first;      /* the first rule defined, or -1 */
} parser;

static void perr(parser *ps, const char *fmt, ...) {
    if (ps->rc) return;
    ps->rc = PGD_EINVAL;
    int line = 1, k = 0;
    for (const char *q = ps->start; ps->p && q < ps->p && q < ps->end; q++) line += *q == '\n';
    if (ps->p) k = snprintf(ps->msg, ps->msg_len, "line %d: ", line);
    if (k < 0 || (size_t)k >= ps->msg_len) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ps->msg + k, ps->msg_len - (size_t)k, fmt, ap);
    va_end(ap);
}

/* A byte of the grammar for a message: itself when printable ASCII, else its value (a message
 * goes into a JSON error body, which must stay valid UTF-8). */
typedef struct shown {
    char s[8];
} shown;
static shown show(char c) {
    shown r;
    unsigned char u = (unsigned char)c;
    if (u >= 0x20 && u < 0x7F) snprintf(r.s, sizeof r.s, "'%c'", c);
    else snprintf(r.s, sizeof r.s, "0x%02X", u);
    return r;
}

static void oom(parser *ps) {
    if (ps->rc) return;
    ps->rc = PGD_ENOMEM;
    snprintf(ps->msg, ps->msg_len, "out of memory");
}

static void push(parser *ps, ivec *a, int32_t x) {
    if (!ps->rc && iv_push(a, x)) oom(ps);
}

static bool is_word(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '-' || c == '_';
}

static void skip_space(parser *ps, bool newlines) {
    while (ps->p < ps->end) {
        char c = *ps->p;
        if (c == ' ' || c == '\t' || (newlines && (c == '\n' || c == '\r'))) {
            ps->p++;
        } else if (c == '#' || (ps->lark && c == '/' && ps->end - ps->p > 1 && ps->p[1] == '/')) {
            while (ps->p < ps->end && *ps->p != '\n' && *ps->p != '\r') ps->p++;
        } else {
            break;
        }
    }
}

static int32_t new_rule(parser *ps, const char *name, uint32_t len) {
    if (pgd_grow_i32(&ps->rules, ps->n_rules, &ps->cap_rules, 16, sizeof *ps->rules)) {
        oom(ps);
        return -1;
    }
    ps->rules[ps->n_rules] = (rule){.name = name, .name_len = len, .owner = ps->cur};
    if (name) ps->rules[ps->n_rules].owner = ps->n_rules;
    return ps->n_rules++;
}

static int32_t rule_named(parser *ps, const char *name, uint32_t len) {
    for (int32_t r = 0; r < ps->n_rules; r++)
        if (ps->rules[r].name && ps->rules[r].name_len == len &&
            !memcmp(ps->rules[r].name, name, len))
            return r;
    return new_rule(ps, name, len);
}

/* One character of a literal or a class (an escape, or a UTF-8 character), or -1. */
static int32_t parse_char(parser *ps) {
    if (ps->p >= ps->end) {
        perr(ps, "unexpected end of the grammar");
        return -1;
    }
    if (*ps->p != '\\') {
        uint32_t cp;
        int n = pgd__utf8_decode((const unsigned char *)ps->p, (size_t)(ps->end - ps->p), &cp);
        if (cp & PGD_UNI_INVALID) {
            perr(ps, "the grammar is not valid UTF-8");
            return -1;
        }
        ps->p += n;
        return (int32_t)cp;
    }
    if (ps->end - ps->p < 2) {
        perr(ps, "unexpected end of the grammar");
        return -1;
    }
    char c = ps->p[1];
    ps->p += 2;
    int digits = c == 'x' ? 2 : c == 'u' ? 4 : c == 'U' ? 8 : 0;
    if (digits) {
        uint32_t v = 0;
        for (int i = 0; i < digits; i++) {
            int h = ps->p < ps->end ? pgd_hex_digit(*ps->p) : -1;
            if (h < 0) {
                perr(ps, "\\%c needs %d hexadecimal digits", c, digits);
                return -1;
            }
            v = v * 16 + (uint32_t)h;
            ps->p++;
        }
        if (v > MAX_CP || (v >= 0xD800 && v <= 0xDFFF)) {
            perr(ps, "\\%c escape of U+%X, which is not a character", c, v);
            return -1;
        }
        return (int32_t)v;
    }
    switch (c) {
    case 'n': return '\n';
    case 'r': return '\r';
    case 't': return '\t';
    case '\\': case '"': case '\'': case '[': case ']': case '-': case '^': case '/': return c;
    default:
        perr(ps, "unknown escape: \\ then %s", show(c).s);
        return -1;
    }
}

static int cmp_range(const void *a, const void *b) {
    uint32_t x = ((const uint32_t *)a)[0], y = ((const uint32_t *)b)[0];
    return x < y ? -1 : x > y;
}

/* A class of the (lo, hi) pairs pr[0 .. 2n) (sorted and merged here): its index, or -1. */
static int32_t add_class(parser *ps, uint32_t *pr, int32_t n, bool neg) {
    if (n > 1) qsort(pr, (size_t)n, 2 * sizeof *pr, cmp_range);
    int32_t m = 0;
    for (int32_t i = 0; i < n; i++) {
        if (m && pr[2 * i] <= pr[2 * m - 1] + 1) {
            if (pr[2 * i + 1] > pr[2 * m - 1]) pr[2 * m - 1] = pr[2 * i + 1];
        } else {
            pr[2 * m] = pr[2 * i];
            pr[2 * m + 1] = pr[2 * i + 1];
            m++;
        }
    }
    if (ps->cls.n == 0) push(ps, &ps->cls, 0);
    for (int32_t i = 0; i < 2 * m; i++) push(ps, &ps->ranges, (int32_t)pr[i]);
    push(ps, &ps->cls, ps->ranges.n / 2);
    push(ps, &ps->neg, neg);
    return ps->rc ? -1 : ps->cls.n - 2;
}

/* The class of one character. */
static int32_t char_class(parser *ps, uint32_t cp) {
    uint32_t pr[2] = {cp, cp};
    return add_class(ps, pr, 1, false);
}

static bool count_elems(parser *ps, int64_t n) {
    ps->n_elems += n;
    if (ps->n_elems > PGD_GRAMMAR_MAX_ELEMS) {
        perr(ps, "the grammar is too large once its repetitions are expanded (more than %d "
             "elements)", PGD_GRAMMAR_MAX_ELEMS);
        return false;
    }
    return true;
}

/* seq[start..) repeated min..max times (max < 0: no bound), as llama.cpp rewrites it:
 * x{2,4} is x x R1, R1 ::= x R2 | "", R2 ::= x | "";  x{1,} is x R, R ::= x R | "". */
static void repeat(parser *ps, ivec *seq, int32_t start, int32_t min, int32_t max) {
    int32_t n = seq->n - start;
    if (n == 0 || ps->rc) return; /* an empty literal: nothing to repeat */
    int32_t *x = malloc((size_t)n * sizeof *x);
    if (!x) {
        oom(ps);
        return;
    }
    memcpy(x, seq->v + start, (size_t)n * sizeof *x);
    seq->n = start;
    int64_t copies = (int64_t)min + (max < 0 ? 1 : max - min);
    if (!count_elems(ps, copies * (n + 3))) goto out;
    for (int32_t k = 0; k < min; k++)
        for (int32_t i = 0; i < n; i++) push(ps, seq, x[i]);
    if (max < 0) {
        int32_t r = new_rule(ps, NULL, 0);
        if (r < 0) goto out;
        for (int32_t i = 0; i < n; i++) push(ps, &ps->rules[r].body, x[i]);
        push(ps, &ps->rules[r].body, EL_REF(r));
        push(ps, &ps->rules[r].body, END);
        push(ps, &ps->rules[r].body, END);
        ps->rules[r].defined = true;
        push(ps, seq, EL_REF(r));
    } else if (max > min) {
        int32_t next = -1;
        for (int32_t k = max - min; k > 0; k--) {
            int32_t r = new_rule(ps, NULL, 0);
            if (r < 0) goto out;
            for (int32_t i = 0; i < n; i++) push(ps, &ps->rules[r].body, x[i]);
            if (next >= 0) push(ps, &ps->rules[r].body, EL_REF(next));
            push(ps, &ps->rules[r].body, END);
            push(ps, &ps->rules[r].body, END);
            ps->rules[r].defined = true;
            next = r;
        }
        push(ps, seq, EL_REF(next));
    }
out:
    free(x);
}

static int32_t parse_count(parser *ps) {
    int64_t v = 0;
    const char *from = ps->p;
    while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9' && v <= PGD_GRAMMAR_MAX_REPEAT)
        v = v * 10 + (*ps->p++ - '0');
    if (ps->p == from) return -1;
    if (v > PGD_GRAMMAR_MAX_REPEAT) {
        perr(ps, "repetition counts are limited to %d", PGD_GRAMMAR_MAX_REPEAT);
        return -2;
    }
    return (int32_t)v;
}

/* {m}, {m,}, {m,n}, {,n} after the '{': false on an error. */
static bool parse_braces(parser *ps, int32_t *min, int32_t *max) {
    skip_space(ps, true);
    *min = parse_count(ps);
    if (*min == -2) return false;
    if (*min == -1 && ps->p < ps->end && *ps->p == ',') *min = 0; /* {,n}: llama.cpp's 0..n */
    if (*min < 0) {
        perr(ps, "expected a count after '{'");
        return false;
    }
    skip_space(ps, true);
    *max = *min;
    if (ps->p < ps->end && *ps->p == ',') {
        ps->p++;
        skip_space(ps, true);
        *max = parse_count(ps);
        if (*max == -2) return false;
        skip_space(ps, true);
    }
    if (ps->p >= ps->end || *ps->p != '}') {
        perr(ps, "expected '}'");
        return false;
    }
    ps->p++;
    if (*max >= 0 && *max < *min) {
        perr(ps, "bad repetition range {%d,%d}", *min, *max);
        return false;
    }
    return true;
}

static void parse_alternates(parser *ps, int32_t r, bool nested);

/* A class after its '['. */
static int32_t parse_class(parser *ps) {
    bool neg = ps->p < ps->end && *ps->p == '^';
    if (neg) ps->p++;
    ivec pr = {0};
    while (!ps->rc && ps->p < ps->end && *ps->p != ']') {
        int32_t lo = parse_char(ps), hi = lo;
        if (lo >= 0 && ps->end - ps->p >= 2 && ps->p[0] == '-' && ps->p[1] != ']') {
            ps->p++;
            hi = parse_char(ps);
            if (hi >= 0 && hi < lo) perr(ps, "bad character range");
        }
        push(ps, &pr, lo);
        push(ps, &pr, hi);
    }
    int32_t c = -1;
    if (ps->p >= ps->end) perr(ps, "unterminated character class");
    if (!ps->rc) {
        ps->p++;
        c = add_class(ps, (uint32_t *)pr.v, pr.n / 2, neg);
    }
    free(pr.v);
    return c;
}

/* One alternative into rule r's body. */
static void parse_sequence(parser *ps, int32_t r, bool nested) {
    ivec seq = {0};
    int32_t last = -1; /* where the last element (what a repetition repeats) starts */
    while (!ps->rc && ps->p < ps->end) {
        char c = *ps->p;
        if (c == '"' || (c == '\'' && ps->lark)) {
            ps->p++;
            last = seq.n;
            while (!ps->rc && ps->p < ps->end && *ps->p != c) {
                int32_t cp = parse_char(ps);
                if (cp >= 0 && count_elems(ps, 1))
                    push(ps, &seq, EL_CHAR(char_class(ps, (uint32_t)cp)));
            }
            if (ps->p >= ps->end) perr(ps, "unterminated string");
            ps->p++;
        } else if (c == '[') {
            ps->p++;
            last = seq.n;
            int32_t k = parse_class(ps);
            if (k >= 0 && count_elems(ps, 1)) push(ps, &seq, EL_CHAR(k));
        } else if (c == '.') {
            ps->p++;
            last = seq.n;
            int32_t k = add_class(ps, NULL, 0, true);
            if (k >= 0 && count_elems(ps, 1)) push(ps, &seq, EL_CHAR(k));
        } else if (is_word(c)) {
            const char *name = ps->p;
            while (ps->p < ps->end && is_word(*ps->p)) ps->p++;
            int32_t k = rule_named(ps, name, (uint32_t)(ps->p - name));
            last = seq.n;
            if (k >= 0 && count_elems(ps, 1)) push(ps, &seq, EL_REF(k));
        } else if (c == '(') {
            ps->p++;
            skip_space(ps, true);
            int32_t k = new_rule(ps, NULL, 0);
            if (k < 0) break;
            parse_alternates(ps, k, true);
            if (ps->rc) break;
            ps->rules[k].defined = true;
            if (ps->p >= ps->end || *ps->p != ')') {
                perr(ps, "expected ')'");
                break;
            }
            ps->p++;
            last = seq.n;
            if (count_elems(ps, 1)) push(ps, &seq, EL_REF(k));
        } else if (c == '*' || c == '+' || c == '?' || c == '{') {
            ps->p++;
            if (last < 0) {
                perr(ps, "nothing to repeat before '%c'", c);
                break;
            }
            int32_t min = c == '+', max = c == '?' ? 1 : -1;
            if (c == '{' && !parse_braces(ps, &min, &max)) break;
            repeat(ps, &seq, last, min, max);
        } else {
            break;
        }
        skip_space(ps, nested);
    }
    for (int32_t i = 0; i < seq.n; i++) push(ps, &ps->rules[r].body, seq.v[i]);
    push(ps, &ps->rules[r].body, END);
    free(seq.v);
}

static void parse_alternates(parser *ps, int32_t r, bool nested) {
    parse_sequence(ps, r, nested);
    while (!ps->rc && ps->p < ps->end && *ps->p == '|') {
        ps->p++;
        skip_space(ps, true);
        parse_sequence(ps, r, nested);
    }
}

static void parse_rule(parser *ps) {
    if (ps->lark && ps->p < ps->end && *ps->p == '?') ps->p++; /* Lark's inlining: no matter */
    const char *name = ps->p;
    while (ps->p < ps->end && is_word(*ps->p)) ps->p++;
    uint32_t len = (uint32_t)(ps->p - name);
    if (!len) {
        perr(ps, "expected a rule name");
        return;
    }
    skip_space(ps, false);
    const char *def = ps->lark ? ":" : "::=";
    size_t dl = strlen(def);
    if ((size_t)(ps->end - ps->p) < dl || memcmp(ps->p, def, dl)) {
        perr(ps, ps->lark ? "expected ':' (Lark) or '::=' (GBNF) after '%.*s'"
                          : "expected '::=' after '%.*s'", (int)len, name);
        return;
    }
    ps->p += dl;
    skip_space(ps, true);
    int32_t r = rule_named(ps, name, len);
    if (r < 0) return;
    if (ps->rules[r].defined) {
        perr(ps, "rule '%.*s' is defined twice", (int)len, name);
        return;
    }
    ps->rules[r].defined = true;
    if (ps->first < 0) ps->first = r;
    ps->cur = r;
    for (;;) {
        parse_alternates(ps, r, false);
        if (ps->rc) return;
        if (ps->p < ps->end && *ps->p == '\r') ps->p++;
        if (ps->p < ps->end && *ps->p == '\n') ps->p++;
        else if (ps->p < ps->end)
            perr(ps, "unexpected %s in rule '%.*s'", show(*ps->p).s, (int)len, name);
        skip_space(ps, true);
        /* Lark: a line that starts with '|' goes on with the rule's alternatives */
        if (ps->rc || !ps->lark || ps->p >= ps->end || *ps->p != '|') break;
        ps->p++;
        skip_space(ps, true);
    }
}

static const rule *owner_of(const parser *ps, int32_t r) { return &ps->rules[ps->rules[r].owner]; }

/* The class matches some character of [lo, hi] (which holds no surrogate but at its ends). */
static bool cls_meets(const pgd_grammar *g, int32_t c, uint32_t lo, uint32_t hi) {
    const uint32_t *r = g->ranges + 2 * g->cls[c];
    int32_t n = g->cls[c + 1] - g->cls[c];
    if (!g->cls_neg[c]) {
        for (int32_t i = 0; i < n; i++)
            if (r[2 * i] <= hi && r[2 * i + 1] >= lo) return true;
        return false;
    }
    for (int32_t i = 0; i < n; i++) /* merged ranges: one covers it, or none does */
        if (r[2 * i] <= lo && r[2 * i + 1] >= hi) return false;
    return true;
}

/* Left recursion: a cycle through the rules each alternative can start with (its first
 * elements, past rules that can match nothing). DFS colours: 1 open, 2 done. */
static int32_t left_cycle(const pgd_grammar *g, const uint8_t *nullable, uint8_t *colour,
                          int32_t r, int32_t depth) {
    if (colour[r] == 1) return r;
    if (colour[r] == 2 || depth > g->n_rules) return -1;
    colour[r] = 1;
    for (int32_t a = g->rule_alt[r]; a < g->rule_alt[r + 1]; a++)
        for (int32_t i = g->alt[a]; g->el[i] != END && IS_REF(g->el[i]); i++) {
            int32_t hit = left_cycle(g, nullable, colour, g->el[i] >> 1, depth + 1);
            if (hit >= 0) return hit;
            if (!nullable[g->el[i] >> 1]) break;
        }
    colour[r] = 2;
    return -1;
}

/* Rule flags by fixpoint: productive (some alternative of productive parts: it can end) or
 * nullable (some alternative of nullable rules only). */
static void fixpoint(const pgd_grammar *g, uint8_t *flag, bool nullable) {
    for (bool changed = true; changed;) {
        changed = false;
        for (int32_t r = 0; r < g->n_rules; r++) {
            if (flag[r]) continue;
            for (int32_t a = g->rule_alt[r]; a < g->rule_alt[r + 1] && !flag[r]; a++) {
                bool ok = true;
                for (int32_t i = g->alt[a]; g->el[i] != END && ok; i++)
                    ok = IS_REF(g->el[i]) ? flag[g->el[i] >> 1] != 0 : !nullable;
                if (ok) flag[r] = 1, changed = true;
            }
        }
    }
}

/* seen[r] = 1 for the rules reachable from r (stack: n_rules entries of scratch). */
static void reach(const pgd_grammar *g, uint8_t *seen, int32_t *stack, int32_t r) {
    int32_t n = 0;
    seen[r] = 1;
    stack[n++] = r;
    while (n) {
        r = stack[--n];
        for (int32_t a = g->rule_alt[r]; a < g->rule_alt[r + 1]; a++)
            for (int32_t i = g->alt[a]; g->el[i] != END; i++)
                if (IS_REF(g->el[i]) && !seen[g->el[i] >> 1]) {
                    seen[g->el[i] >> 1] = 1;
                    stack[n++] = g->el[i] >> 1;
                }
    }
}

/* The checks of grammar.h on the flattened grammar. */
static void check(parser *ps, pgd_grammar *g) {
    for (int32_t c = 0; c < g->n_cls && !ps->rc; c++)
        if (!cls_meets(g, c, 0, 0xD7FF) && !cls_meets(g, c, 0xE000, MAX_CP))
            perr(ps, "a character class matches no character");
    uint8_t *flags = calloc((size_t)g->n_rules, 4);
    int32_t *stack = malloc((size_t)g->n_rules * sizeof *stack);
    if (!flags || !stack) {
        free(flags);
        free(stack);
        oom(ps);
        return;
    }
    uint8_t *seen = flags, *prod = flags + g->n_rules, *null = prod + g->n_rules;
    uint8_t *colour = null + g->n_rules;
    reach(g, seen, stack, g->root);
    free(stack);
    fixpoint(g, prod, false);
    fixpoint(g, null, true);
    for (int32_t r = 0; r < g->n_rules && !ps->rc; r++) {
        const rule *o = owner_of(ps, r);
        if (seen[r] && !prod[r])
            perr(ps, "rule '%.*s' can never end: every alternative recurses", (int)o->name_len,
                 o->name);
    }
    for (int32_t r = 0; r < g->n_rules && !ps->rc; r++) {
        if (!seen[r]) continue;
        int32_t hit = left_cycle(g, null, colour, r, 0);
        if (hit >= 0)
            perr(ps, "rule '%.*s' is left-recursive", (int)owner_of(ps, hit)->name_len,
                 owner_of(ps, hit)->name);
    }
    free(flags);
}

void pgd_grammar_free(pgd_grammar *g) {
    free(g->el);
    free(g->alt);
    free(g->rule_alt);
    free(g->ranges);
    free(g->cls);
    free(g->cls_neg);
    memset(g, 0, sizeof *g);
}

/* The rules' bodies into g's flat arrays. */
static void flatten(parser *ps, pgd_grammar *g) {
    int64_t n_el = 0, n_alt = 0;
    for (int32_t r = 0; r < ps->n_rules; r++) {
        n_el += ps->rules[r].body.n;
        for (int32_t i = 0; i < ps->rules[r].body.n; i++) n_alt += ps->rules[r].body.v[i] == END;
    }
    g->n_rules = ps->n_rules;
    g->el = malloc((size_t)(n_el + 1) * sizeof *g->el);
    g->alt = malloc((size_t)(n_alt + 1) * sizeof *g->alt);
    g->rule_alt = malloc((size_t)(ps->n_rules + 1) * sizeof *g->rule_alt);
    g->n_cls = ps->cls.n ? ps->cls.n - 1 : 0;
    g->cls = malloc((size_t)(g->n_cls + 1) * sizeof *g->cls);
    g->cls_neg = malloc((size_t)g->n_cls + 1);
    g->n_ranges = ps->ranges.n / 2;
    g->ranges = malloc((size_t)(ps->ranges.n + 1) * sizeof *g->ranges);
    if (!g->el || !g->alt || !g->rule_alt || !g->cls || !g->cls_neg || !g->ranges) {
        oom(ps);
        return;
    }
    for (int32_t r = 0; r < ps->n_rules; r++) {
        const ivec *b = &ps->rules[r].body;
        g->rule_alt[r] = g->n_alt;
        for (int32_t i = 0; i < b->n; i++) {
            if (i == 0 || b->v[i - 1] == END) g->alt[g->n_alt++] = g->n_el;
            g->el[g->n_el++] = b->v[i];
        }
    }
    g->rule_alt[ps->n_rules] = g->n_alt;
    g->cls[0] = 0;
    for (int32_t c = 0; c < g->n_cls; c++) {
        g->cls[c + 1] = ps->cls.v[c + 1];
        g->cls_neg[c] = (uint8_t)ps->neg.v[c];
    }
    for (int32_t i = 0; i < ps->ranges.n; i++) g->ranges[i] = (uint32_t)ps->ranges.v[i];
}

int pgd_grammar_compile(const char *text, size_t len, pgd_grammar *out, char *msg,
                        size_t msg_len) {
    memset(out, 0, sizeof *out);
    parser ps = {.start = text, .p = text, .end = text + len, .msg = msg, .msg_len = msg_len,
                 .first = -1};
    if (len > PGD_GRAMMAR_MAX_LEN) {
        snprintf(msg, msg_len, "the grammar is longer than %d bytes", PGD_GRAMMAR_MAX_LEN);
        return PGD_EINVAL;
    }
    /* no "::=" anywhere: the Lark-style form, as vLLM tells them apart */
    ps.lark = !memmem(text, len, "::=", 3);
    skip_space(&ps, true);
    while (!ps.rc && ps.p < ps.end) parse_rule(&ps);
    int32_t root = -1;
    const char *want = ps.lark ? "start" : "root";
    for (int32_t r = 0; r < ps.n_rules && !ps.rc; r++) {
        const rule *u = &ps.rules[r];
        if (!u->defined) {
            ps.p = NULL;
            perr(&ps, "rule '%.*s' is used but not defined", (int)u->name_len, u->name);
        }
        if (u->name && u->name_len == strlen(want) && !memcmp(u->name, want, u->name_len))
            root = r;
    }
    if (!ps.rc && root < 0 && ps.lark) root = ps.first; /* Lark: start, or the first rule */
    if (!ps.rc && root < 0) {
        snprintf(msg, msg_len, ps.lark ? "the grammar has no rules" :
                 "the grammar has no rule named 'root'");
        ps.rc = PGD_EINVAL;
    }
    if (!ps.rc) {
        out->root = root;
        flatten(&ps, out);
    }
    if (!ps.rc) {
        ps.p = NULL;
        check(&ps, out);
    }
    for (int32_t r = 0; r < ps.n_rules; r++) free(ps.rules[r].body.v);
    free(ps.rules);
    free(ps.ranges.v);
    free(ps.cls.v);
    free(ps.neg.v);
    if (ps.rc) pgd_grammar_free(out);
    return ps.rc;
}

static void *dup_array(const void *src, size_t n) {
    void *p = malloc(n ? n : 1);
    if (p && n) memcpy(p, src, n);
    return p;
}

int pgd_grammar_copy(pgd_grammar *dst, const pgd_grammar *src) {
    *dst = *src;
    dst->el = dup_array(src->el, (size_t)src->n_el * sizeof *src->el);
    dst->alt = dup_array(src->alt, (size_t)src->n_alt * sizeof *src->alt);
    dst->rule_alt = dup_array(src->rule_alt, (size_t)(src->n_rules + 1) * sizeof *src->rule_alt);
    dst->ranges = dup_array(src->ranges, (size_t)src->n_ranges * 2 * sizeof *src->ranges);
    dst->cls = dup_array(src->cls, (size_t)(src->n_cls + 1) * sizeof *src->cls);
    dst->cls_neg = dup_array(src->cls_neg, (size_t)src->n_cls);
    if (!dst->el || !dst->alt || !dst->rule_alt || !dst->ranges || !dst->cls || !dst->cls_neg) {
        pgd_grammar_free(dst);
        return PGD_ENOMEM;
    }
    return PGD_OK;
}

/* ---- matching ---- */

/* The state after d bytes of the walk (or of one fed byte): tops[top0 .. + n_top) over nodes
 * [0, n_nodes) of the scratch. */
typedef struct level {
    int32_t top0, n_top, n_nodes;
    int32_t tend;  /* where the next level's tops go, when past top0 + n_top (tops_end) */
    uint32_t acc;
    uint8_t need, ulen, can_end;
    uint8_t root;  /* in a walk: level 0's very stacks again (its tops are level 0's; the
                      levels between keep theirs, below tend and n_nodes) */
    uint8_t cut_root; /* in a walk: a cut character that started at a root level */
} level;

static int32_t tops_end(const level *L) {
    return L->tend > L->top0 + L->n_top ? L->tend : L->top0 + L->n_top;
}

#define HASH_CAP 16384 /* (pos, parent) entries of one step: at most half full */
#define WORK_CAP 16384
#define ARENA_CAP (4 * PGD_GRAMMAR_MAX_NODES)
#define TOPS_CAP 65536

struct pgd_grammar_scratch {
    int32_t max_len;
    int32_t *pos, *par;  /* (ARENA_CAP) nodes */
    uint32_t *seen;      /* (ARENA_CAP) the step that made the node a top */
    int32_t *map;        /* (ARENA_CAP) compaction */
    int32_t *tops;       /* (TOPS_CAP) */
    level *lev;          /* (max_len + 2) */
    /* one step's interned (pos, parent, kind) -> node: kind 0 a node, 1 an item expanded */
    int32_t *hpos, *hpar, *hval;
    uint32_t *hstamp;
    int32_t h_used;
    int32_t *wpos, *wpar;/* (WORK_CAP) items to expand */
    uint32_t stamp;
    const pgd_grammar *g;/* during a walk */
    int64_t work;        /* items expanded and stacks tested since the walk began */
    bool drop_space;     /* in a walk: a leading space is no byte of the text */
    /* in a walk, what byte b does to level 0's stacks: LOOP_UNKNOWN, LOOP_SAME (they come back
     * as they were: free text in a class under a repetition), LOOP_OTHER or LOOP_DEAD */
    int8_t loop[256];
    /* the same for whole multi-byte characters from level 0 (direct-mapped by code point;
     * valid where cp_stamp is this walk's) */
    uint32_t *cp_stamp, *cp_of;
    int8_t *cp_val;
    uint32_t walk;
};

#define CP_CACHE 32768

enum { LOOP_UNKNOWN, LOOP_SAME, LOOP_OTHER, LOOP_DEAD };

pgd_grammar_scratch *pgd_grammar_scratch_new(int32_t max_len) {
    pgd_grammar_scratch *sc = calloc(1, sizeof *sc);
    if (!sc) return NULL;
    sc->max_len = max_len < 1 ? 1 : max_len;
    sc->pos = malloc(ARENA_CAP * sizeof *sc->pos);
    sc->par = malloc(ARENA_CAP * sizeof *sc->par);
    sc->seen = calloc(ARENA_CAP, sizeof *sc->seen);
    sc->map = malloc(ARENA_CAP * sizeof *sc->map);
    sc->tops = malloc(TOPS_CAP * sizeof *sc->tops);
    sc->lev = calloc((size_t)sc->max_len + 2, sizeof *sc->lev);
    sc->hpos = malloc(HASH_CAP * sizeof *sc->hpos);
    sc->hpar = malloc(HASH_CAP * sizeof *sc->hpar);
    sc->hval = malloc(HASH_CAP * sizeof *sc->hval);
    sc->hstamp = calloc(HASH_CAP, sizeof *sc->hstamp);
    sc->wpos = malloc(WORK_CAP * sizeof *sc->wpos);
    sc->wpar = malloc(WORK_CAP * sizeof *sc->wpar);
    sc->cp_stamp = calloc(CP_CACHE, sizeof *sc->cp_stamp);
    sc->cp_of = malloc(CP_CACHE * sizeof *sc->cp_of);
    sc->cp_val = malloc(CP_CACHE);
    if (!sc->cp_stamp || !sc->cp_of || !sc->cp_val || !sc->pos || !sc->par || !sc->seen ||
        !sc->map || !sc->tops || !sc->lev || !sc->hpos || !sc->hpar || !sc->hval || !sc->hstamp ||
        !sc->wpos || !sc->wpar) {
        pgd_grammar_scratch_free(sc);
        return NULL;
    }
    return sc;
}

void pgd_grammar_scratch_free(pgd_grammar_scratch *sc) {
    if (!sc) return;
    free(sc->pos);
    free(sc->par);
    free(sc->seen);
    free(sc->map);
    free(sc->tops);
    free(sc->lev);
    free(sc->hpos);
    free(sc->hpar);
    free(sc->hval);
    free(sc->hstamp);
    free(sc->wpos);
    free(sc->wpar);
    free(sc->cp_stamp);
    free(sc->cp_of);
    free(sc->cp_val);
    free(sc);
}

static void new_step(pgd_grammar_scratch *sc) {
    if (++sc->stamp == 0) {
        memset(sc->hstamp, 0, HASH_CAP * sizeof *sc->hstamp);
        memset(sc->seen, 0, ARENA_CAP * sizeof *sc->seen);
        sc->stamp = 1;
    }
    sc->h_used = 0;
}

/* The entry of (pos, par, kind) in this step's table: its index, with *fresh set when it was
 * added (value -1); -1 when the table is full. */
static int32_t hslot(pgd_grammar_scratch *sc, int32_t pos, int32_t par, int kind, bool *fresh) {
    uint32_t h = ((uint32_t)pos * 0x9E3779B1u) ^ ((uint32_t)(par + 1) * 0x85EBCA77u) ^
                 (uint32_t)kind;
    h ^= h >> 15;
    int32_t pk = 2 * pos + kind;
    for (uint32_t i = h & (HASH_CAP - 1);; i = (i + 1) & (HASH_CAP - 1)) {
        if (sc->hstamp[i] != sc->stamp) {
            if (2 * (sc->h_used + 1) > HASH_CAP) return -1;
            sc->h_used++;
            sc->hstamp[i] = sc->stamp;
            sc->hpos[i] = pk;
            sc->hpar[i] = par;
            sc->hval[i] = -1;
            *fresh = true;
            return (int32_t)i;
        }
        if (sc->hpos[i] == pk && sc->hpar[i] == par) {
            *fresh = false;
            return (int32_t)i;
        }
    }
}

/* The node (pos, par) of this step (hint: an existing node that is it), made if new; -1 when
 * a table is full. */
static int32_t intern(pgd_grammar_scratch *sc, level *N, int32_t pos, int32_t par, int32_t hint) {
    bool fresh;
    int32_t i = hslot(sc, pos, par, 0, &fresh);
    if (i < 0) return -1;
    if (sc->hval[i] >= 0) return sc->hval[i];
    int32_t id = hint;
    if (id < 0) {
        if (N->n_nodes >= ARENA_CAP) return -1;
        id = N->n_nodes++;
        sc->pos[id] = pos;
        sc->par[id] = par;
    }
    sc->hval[i] = id;
    return id;
}

static bool add_top(pgd_grammar_scratch *sc, level *N, int32_t id) {
    if (sc->seen[id] == sc->stamp) return true;
    sc->seen[id] = sc->stamp;
    if (N->n_top >= PGD_GRAMMAR_MAX_STACKS || N->top0 + N->n_top >= TOPS_CAP) return false;
    sc->tops[N->top0 + N->n_top++] = id;
    return true;
}

/* Adds to N the stacks that continue at element pos over stack par, each made to stop at a
 * character: rules are expanded into their alternatives (a rule last in its sequence is a tail
 * call: nothing pushed), an alternative's end pops to the element after the rule. False when a
 * table is full. */
static bool expand(pgd_grammar_scratch *sc, const pgd_grammar *g, level *N, int32_t pos0,
                   int32_t par0) {
    int32_t nw = 0;
    sc->wpos[nw] = pos0;
    sc->wpar[nw++] = par0;
    while (nw) {
        nw--;
        sc->work++;
        int32_t pos = sc->wpos[nw], par = sc->wpar[nw];
        bool fresh;
        if (hslot(sc, pos, par, 1, &fresh) < 0) return false;
        if (!fresh) continue; /* expanded already this step */
        int32_t e = g->el[pos];
        if (e == END) {
            if (par < 0) {
                N->can_end = 1;
                continue;
            }
            /* the node par is the stack (pos[par], par[par]): reuse it */
            if (intern(sc, N, sc->pos[par], sc->par[par], par) < 0 || nw >= WORK_CAP)
                return false;
            sc->wpos[nw] = sc->pos[par];
            sc->wpar[nw++] = sc->par[par];
            continue;
        }
        if (!IS_REF(e)) {
            int32_t id = intern(sc, N, pos, par, -1);
            if (id < 0 || !add_top(sc, N, id)) return false;
            continue;
        }
        int32_t r = e >> 1, np = par;
        if (g->el[pos + 1] != END && (np = intern(sc, N, pos + 1, par, -1)) < 0) return false;
        for (int32_t a = g->rule_alt[r]; a < g->rule_alt[r + 1]; a++) {
            if (nw >= WORK_CAP) return false;
            sc->wpos[nw] = g->alt[a];
            sc->wpar[nw++] = np;
        }
    }
    return true;
}

/* Level d + 1 from level d and byte b: false when no stack takes it. */
static bool step(pgd_grammar_scratch *sc, const pgd_grammar *g, int32_t d, uint8_t b) {
    static const uint32_t umin[5] = {0, 0, 0x80, 0x800, 0x10000};
    static const uint32_t umax[5] = {0, 0x7F, 0x7FF, 0xFFFF, MAX_CP};
    const level *L = &sc->lev[d];
    level *N = &sc->lev[d + 1];
    *N = (level){.top0 = tops_end(L), .n_nodes = L->n_nodes};
    uint32_t acc;
    uint8_t need, ulen;
    if (L->need == 0) {
        if (b < 0x80) acc = b, need = 0, ulen = 1;
        else if (b >= 0xC2 && b <= 0xDF) acc = b & 0x1F, need = 1, ulen = 2;
        else if (b >= 0xE0 && b <= 0xEF) acc = b & 0x0F, need = 2, ulen = 3;
        else if (b >= 0xF0 && b <= 0xF4) acc = b & 0x07, need = 3, ulen = 4;
        else return false;
    } else {
        if ((b & 0xC0) != 0x80) return false;
        acc = L->acc << 6 | (b & 0x3F);
        need = (uint8_t)(L->need - 1);
        ulen = L->ulen;
    }
    /* the characters these bytes can still become */
    uint32_t lo = acc << (6 * need), hi = lo | ((1u << (6 * need)) - 1);
    if (lo < umin[ulen]) lo = umin[ulen];
    if (hi > umax[ulen]) hi = umax[ulen];
    if (hi >= 0xD800 && lo <= 0xDFFF) {
        if (lo >= 0xD800 && hi <= 0xDFFF) return false;
        if (hi <= 0xDFFF) hi = 0xD7FF;
        else if (lo >= 0xD800) lo = 0xE000;
    }
    if (lo > hi) return false;
    N->acc = acc;
    N->need = need;
    N->ulen = ulen;
    const int32_t *lt = sc->tops + L->top0;
    sc->work += L->n_top;
    if (need) { /* the same stacks, those whose next character can still be it */
        for (int32_t i = 0; i < L->n_top; i++)
            if (cls_meets(g, g->el[sc->pos[lt[i]]] >> 1, lo, hi)) {
                if (N->top0 + N->n_top >= TOPS_CAP) return false;
                sc->tops[N->top0 + N->n_top++] = lt[i];
            }
        return N->n_top > 0;
    }
    new_step(sc);
    for (int32_t i = 0; i < L->n_top; i++) {
        int32_t t = lt[i];
        if (cls_meets(g, g->el[sc->pos[t]] >> 1, lo, lo) &&
            !expand(sc, g, N, sc->pos[t] + 1, sc->par[t]))
            return false;
    }
    return N->n_top > 0 || N->can_end;
}

/* Level src's stacks renumbered into level 0 with only the nodes they reach (a node's parent
 * is always older: numbered lower). */
static void compact(pgd_grammar_scratch *sc, int32_t src) {
    level L = sc->lev[src];
    for (int32_t k = 0; k < L.n_nodes; k++) sc->map[k] = -1;
    for (int32_t i = 0; i < L.n_top; i++)
        for (int32_t k = sc->tops[L.top0 + i]; k >= 0 && sc->map[k] == -1; k = sc->par[k])
            sc->map[k] = -2;
    int32_t j = 0;
    for (int32_t k = 0; k < L.n_nodes; k++) {
        if (sc->map[k] != -2) continue;
        sc->map[k] = j;
        sc->pos[j] = sc->pos[k];
        sc->par[j] = sc->par[k] < 0 ? -1 : sc->map[sc->par[k]];
        j++;
    }
    for (int32_t i = 0; i < L.n_top; i++) sc->tops[i] = sc->map[sc->tops[L.top0 + i]];
    L.top0 = 0;
    L.n_nodes = j;
    sc->lev[0] = L;
}

static void load(pgd_grammar_scratch *sc, const pgd_grammar_state *st) {
    memcpy(sc->pos, st->pos, (size_t)st->n_nodes * sizeof *sc->pos);
    memcpy(sc->par, st->par, (size_t)st->n_nodes * sizeof *sc->par);
    memcpy(sc->tops, st->top, (size_t)st->n_top * sizeof *sc->tops);
    sc->lev[0] = (level){.n_top = st->n_top, .n_nodes = st->n_nodes, .acc = st->acc,
                         .need = st->need, .ulen = st->ulen, .can_end = st->can_end};
}

static bool save(const pgd_grammar_scratch *sc, pgd_grammar_state *st) {
    const level *L = &sc->lev[0];
    if (L->n_nodes > PGD_GRAMMAR_MAX_NODES) return false;
    const pgd_grammar_state view = {.pos = sc->pos, .par = sc->par, .n_nodes = L->n_nodes,
                                    .top = sc->tops, .n_top = L->n_top, .can_end = L->can_end,
                                    .need = L->need, .ulen = L->ulen, .acc = L->acc};
    pgd_grammar_state_assign(st, &view);
    return true;
}

void pgd_grammar_state_free(pgd_grammar_state *st) {
    free(st->pos);
    free(st->par);
    free(st->top);
    memset(st, 0, sizeof *st);
}

int pgd_grammar_state_init(pgd_grammar_state *st) {
    memset(st, 0, sizeof *st);
    st->pos = malloc(PGD_GRAMMAR_MAX_NODES * sizeof *st->pos);
    st->par = malloc(PGD_GRAMMAR_MAX_NODES * sizeof *st->par);
    st->top = malloc(PGD_GRAMMAR_MAX_STACKS * sizeof *st->top);
    if (!st->pos || !st->par || !st->top) {
        pgd_grammar_state_free(st);
        return PGD_ENOMEM;
    }
    return PGD_OK;
}

void pgd_grammar_state_start(pgd_grammar_state *st, const pgd_grammar *g, pgd_grammar_scratch *sc) {
    sc->lev[0] = (level){0};
    level *N = &sc->lev[1];
    *N = (level){0};
    new_step(sc);
    bool ok = true;
    for (int32_t a = g->rule_alt[g->root]; a < g->rule_alt[g->root + 1] && ok; a++)
        ok = expand(sc, g, N, g->alt[a], -1);
    compact(sc, 1);
    if (!ok || !save(sc, st)) { /* a root past the limits: nothing is accepted */
        st->n_top = st->n_nodes = 0;
        st->can_end = false;
        st->need = 0;
    }
}

void pgd_grammar_state_assign(pgd_grammar_state *dst, const pgd_grammar_state *src) {
    memcpy(dst->pos, src->pos, (size_t)src->n_nodes * sizeof *dst->pos);
    memcpy(dst->par, src->par, (size_t)src->n_nodes * sizeof *dst->par);
    memcpy(dst->top, src->top, (size_t)src->n_top * sizeof *dst->top);
    dst->n_nodes = src->n_nodes;
    dst->n_top = src->n_top;
    dst->can_end = src->can_end;
    dst->need = src->need;
    dst->ulen = src->ulen;
    dst->acc = src->acc;
}

bool pgd_grammar_feed(pgd_grammar_state *st, const pgd_grammar *g, pgd_grammar_scratch *sc,
                      const char *s, size_t n) {
    load(sc, st);
    for (size_t i = 0; i < n; i++) {
        if (!step(sc, g, 0, (uint8_t)s[i])) return false;
        compact(sc, 1);
    }
    return save(sc, st);
}

void pgd_grammar_state_key(const pgd_grammar_state *st, pgd_grammar_key *k) {
    k->n = 0;
    int32_t n = 3 + 2 * st->n_nodes + st->n_top;
    if (n > PGD_GRAMMAR_KEY_MAX) return;
    k->w[0] = st->n_nodes;
    k->w[1] = st->n_top;
    /* a whole last character (need 0) leaves nothing of itself in the state */
    k->w[2] = st->need ? (int32_t)(st->can_end | st->need << 1 | st->ulen << 3 | st->acc << 6)
                       : st->can_end;
    memcpy(k->w + 3, st->pos, (size_t)st->n_nodes * sizeof *k->w);
    memcpy(k->w + 3 + st->n_nodes, st->par, (size_t)st->n_nodes * sizeof *k->w);
    memcpy(k->w + 3 + 2 * st->n_nodes, st->top, (size_t)st->n_top * sizeof *k->w);
    k->n = n;
}

/* Level n holds level 0's stacks again, in the same order (their tops are new nodes of the
 * same element over the same parents). */
static bool same_as_root(const pgd_grammar_scratch *sc, const level *n) {
    const level *z = &sc->lev[0];
    if (n->n_top != z->n_top || n->can_end != z->can_end || n->need != z->need ||
        (n->need && (n->acc != z->acc || n->ulen != z->ulen)))
        return false;
    for (int32_t i = 0; i < n->n_top; i++) {
        int32_t a = sc->tops[z->top0 + i], b = sc->tops[n->top0 + i];
        if (sc->pos[a] != sc->pos[b] || sc->par[a] != sc->par[b]) return false;
    }
    return true;
}

/* N = level 0's stacks, above the tops and nodes of the levels below it (still live). */
static void make_root(pgd_grammar_scratch *sc, level *N, int32_t tend, int32_t n_nodes) {
    *N = sc->lev[0];
    N->tend = tend;
    N->n_nodes = n_nodes;
}

/* The walk's step. A level that comes back to level 0's stacks (free text: a character of a
 * class under a repetition; after a cut character too) is made level 0's again, and from such
 * a level a byte known to bring them back costs a table look-up, so a trie subtree of free
 * text is walked at memory speed rather than a parse step per byte. */
static bool walk_step(void *ctx, int32_t depth, uint8_t b) {
    pgd_grammar_scratch *sc = ctx;
    if (sc->work > PGD_GRAMMAR_MAX_WORK) return false;
    const level *L = &sc->lev[depth - 1];
    level *N = &sc->lev[depth];
    if (depth == 1 && b == ' ' && sc->drop_space) { /* the text goes on as it was */
        make_root(sc, N, tops_end(L), L->n_nodes);
        return true;
    }
    if (L->root && sc->loop[b] == LOOP_SAME) {
        make_root(sc, N, tops_end(L), L->n_nodes);
        return true;
    }
    if (L->root && sc->loop[b] == LOOP_DEAD) return false;
    /* the last byte of a character begun at a root level: its code point (the bytes before
     * it left a range of valid characters, so any continuation byte makes one) */
    int8_t *cv = NULL;
    if (L->cut_root && L->need == 1 && (b & 0xC0) == 0x80) {
        uint32_t cp = L->acc << 6 | (b & 0x3F), k = cp & (CP_CACHE - 1);
        if (sc->cp_stamp[k] != sc->walk || sc->cp_of[k] != cp) {
            sc->cp_stamp[k] = sc->walk;
            sc->cp_of[k] = cp;
            sc->cp_val[k] = LOOP_UNKNOWN;
        }
        cv = &sc->cp_val[k];
        if (*cv == LOOP_SAME) {
            make_root(sc, N, tops_end(L), L->n_nodes);
            return true;
        }
        if (*cv == LOOP_DEAD) return false;
    }
    bool ok = step(sc, sc->g, depth - 1, b); /* (N->root and cut_root 0) */
    bool same = ok && same_as_root(sc, N);
    int8_t *memo = L->root ? &sc->loop[b] : cv;
    if (memo && *memo == LOOP_UNKNOWN) *memo = !ok ? LOOP_DEAD : same ? LOOP_SAME : LOOP_OTHER;
    if (same) make_root(sc, N, tops_end(N), N->n_nodes);
    else if (ok && N->need) N->cut_root = L->root || L->cut_root;
    return ok;
}

static int32_t allowed(const pgd_grammar_state *st, const pgd_grammar *g,
                       pgd_grammar_scratch *sc, pgd_json_vocab *v, uint8_t *allow,
                       bool drop_space) {
    load(sc, st);
    sc->g = g;
    sc->work = 0;
    sc->drop_space = drop_space;
    sc->lev[0].root = 1;
    memset(sc->loop, LOOP_UNKNOWN, sizeof sc->loop);
    if (++sc->walk == 0) { /* stamps wrapped: none is this walk's */
        memset(sc->cp_stamp, 0, CP_CACHE * sizeof *sc->cp_stamp);
        sc->walk = 1;
    }
    if (v->max_len > sc->max_len) { /* a scratch made for a shorter vocabulary: none */
        memset(allow, 0, (size_t)v->n);
        return 0;
    }
    int32_t n = pgd_json_vocab_walk(v, walk_step, sc, allow);
    if (sc->work > PGD_GRAMMAR_MAX_WORK) {
        memset(allow, 0, (size_t)v->n);
        return -1;
    }
    for (int32_t id = 0; drop_space && id < v->n; id++) /* a space alone: no text at all */
        if (allow[id] && v->len[id] == 1 && v->text[id][0] == ' ') allow[id] = 0, n--;
    return n;
}

int32_t pgd_grammar_allowed(const pgd_grammar_state *st, const pgd_grammar *g,
                            pgd_grammar_scratch *sc, pgd_json_vocab *v, uint8_t *allow) {
    return allowed(st, g, sc, v, allow, false);
}

int32_t pgd_grammar_allowed_drop_space(const pgd_grammar_state *st, const pgd_grammar *g,
                                       pgd_grammar_scratch *sc, struct pgd_json_vocab *v,
                                       uint8_t *allow) {
    return allowed(st, g, sc, v, allow, true);
}
