/* The general pre-tokenizer regex engine (see pretok_regex.h): a parser for the Oniguruma
 * subset real Split patterns use, a compiler to a small backtracking program, and a matcher
 * whose memo of (branch instruction, position) states bounds the work of all the searches over
 * one subject. */
#include "tokenizer/pretok_regex.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/unicode.h"

#define RE_INF UINT32_MAX
#define RE_MAX_INSTS 200000
#define RE_MAX_REPEAT 100000 /* Oniguruma's ONIG_MAX_REPEAT_NUM */
#define RE_MAX_DEPTH 200     /* group nesting while parsing */
#define RE_MAX_LOOK_DEPTH 16 /* lookaheads inside lookaheads */

/* ---- the compiled form ---- */

/* A character set: NEG XOR (union of its items AND every set of its and_next chain). Items:
 * code point ranges, general categories, property bits and nested sets. ascii / cattab hold
 * the final answer for ASCII characters and, when catonly (no non-ASCII range anywhere in it),
 * for every other character by its category byte. */
typedef struct re_set {
    uint32_t ascii[4];
    uint32_t cattab[8];
    bool catonly, neg;
    uint32_t gc_mask;   /* bit g: category g is in the union */
    uint8_t prop_mask;  /* PGD_GCP_WS / HAN / WORDX: in the union */
    uint32_t r_off, r_n; /* ranges: re->ranges[2 r_off ..] pairs (lo, hi), sorted, disjoint */
    uint32_t s_off, s_n; /* nested sets: re->subs[s_off ..] */
    int32_t and_next;    /* -1 or the set this one is intersected with (its neg is false) */
} re_set;

enum { OP_LIT, OP_CHAR, OP_RUN, OP_SPLIT, OP_JMP, OP_ASSERT, OP_LOOK, OP_MATCH };
enum { RUN_GREEDY, RUN_LAZY, RUN_POSSESSIVE };
enum { AS_BOL, AS_EOL, AS_BOS, AS_EOS, AS_EOS_NL, AS_WORDB, AS_NWORDB };

typedef struct re_inst {
    uint8_t op;
    uint8_t mode;      /* RUN: RUN_*; LOOK: 1 if negative; ASSERT: AS_* */
    int32_t a, b;      /* LIT: code point; CHAR/RUN: set; SPLIT: first, second; JMP/LOOK: target */
    uint32_t min, max; /* RUN */
    int32_t fa, fb;    /* SPLIT: sets a branch's first character must be in (-1: no test) */
    int32_t slot;      /* SPLIT/RUN/LOOK: memo slot */
    int32_t run_slot;  /* RUN: its cache */
    bool tail;         /* RUN: after it, the main program matches whatever comes */
    bool excl;         /* RUN: what follows starts with a character outside its set */
} re_inst;

struct pgd_re {
    re_inst *prog;
    uint32_t n_prog;
    re_set *sets;
    uint32_t n_sets;
    uint32_t *ranges;
    int32_t *subs;
    uint32_t n_slots, n_runs;
    int32_t first; /* set every match's first character is in, -1 if unknown or nullable */
};

/* ---- set evaluation ---- */

static const uint32_t GC_WORD = (1u << PGD_GC_LU) | (1u << PGD_GC_LL) | (1u << PGD_GC_LT) |
                                (1u << PGD_GC_LM) | (1u << PGD_GC_LO) | (1u << PGD_GC_MN) |
                                (1u << PGD_GC_MC) | (1u << PGD_GC_ME) | (1u << PGD_GC_ND) |
                                (1u << PGD_GC_NL) | (1u << PGD_GC_PC);

static bool ranges_have(const uint32_t *r, uint32_t n, uint32_t c) {
    uint32_t lo = 0, hi = n;
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (c < r[2 * mid]) hi = mid;
        else if (c > r[2 * mid + 1]) lo = mid + 1;
        else return true;
    }
    return false;
}

static bool set_eval(const re_set *sets, const uint32_t *ranges, const int32_t *subs, int32_t si,
                     uint32_t c, unsigned cat) {
    const re_set *s = &sets[si];
    bool in = ((s->gc_mask >> (cat & PGD_GCP_GC)) & 1) || (cat & s->prop_mask) ||
              (s->r_n && ranges_have(ranges + 2 * s->r_off, s->r_n, c));
    for (uint32_t k = 0; !in && k < s->s_n; k++)
        in = set_eval(sets, ranges, subs, subs[s->s_off + k], c, cat);
    if (in && s->and_next >= 0) in = set_eval(sets, ranges, subs, s->and_next, c, cat);
    return in != s->neg;
}

static inline bool set_match(const pgd_re *re, int32_t si, uint32_t c, unsigned cat) {
    const re_set *s = &re->sets[si];
    if (c < 128) return (s->ascii[c >> 5] >> (c & 31)) & 1;
    if (s->catonly) return (s->cattab[cat >> 5] >> (cat & 31)) & 1;
    return set_eval(re->sets, re->ranges, re->subs, si, c, cat);
}

static inline bool is_word(uint32_t c, unsigned cat) {
    (void)c;
    return ((GC_WORD >> (cat & PGD_GCP_GC)) & 1) || (cat & PGD_GCP_WORDX);
}

/* ---- building ---- */

typedef struct re_node {
    uint8_t type, mode;
    int32_t val;          /* N_LIT: code point; N_SET: set; N_ASSERT: kind */
    int32_t child, next;  /* first child / body; next sibling */
    uint32_t min, max;
} re_node;

enum { N_EMPTY, N_LIT, N_SET, N_CAT, N_ALT, N_REP, N_ASSERT, N_LOOK };

typedef struct vec {
    void *p;
    size_t n, cap, size;
} vec;

static void *vec_push(vec *v) {
    if (v->n == v->cap) {
        size_t nc = v->cap ? v->cap * 2 : 16;
        void *np = realloc(v->p, nc * v->size);
        if (!np) return NULL;
        v->p = np;
        v->cap = nc;
    }
    return (char *)v->p + v->size * v->n++;
}

typedef struct builder {
    const uint32_t *pat;
    size_t i, n;
    vec nodes, sets, ranges, subs, prog, looks;
    int rc;
    char *msg;
    size_t msg_cap;
    int depth;
    int64_t atom_lit; /* the last atom: a case-insensitive literal character, else -1 */
    int32_t follow;   /* while generating a repetition: the set what follows it starts with */
} builder;

static int fail(builder *b, int rc, const char *fmt, ...) {
    if (b->rc) return -1;
    b->rc = rc;
    if (b->msg && b->msg_cap) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(b->msg, b->msg_cap, fmt, ap);
        va_end(ap);
    }
    return -1;
}

static int oom(builder *b) { return fail(b, PGD_ENOMEM, "out of memory"); }

#define NODE(b, i) (((re_node *)(b)->nodes.p)[i])
#define SET(b, i) (((re_set *)(b)->sets.p)[i])

static int32_t new_node(builder *b, int type) {
    re_node *nd = vec_push(&b->nodes);
    if (!nd) return oom(b);
    *nd = (re_node){(uint8_t)type, 0, 0, -1, -1, 0, 0};
    return (int32_t)(b->nodes.n - 1);
}

/* A set under construction: its ranges and nested sets, before they move to the pools. */
typedef struct set_build {
    vec r;    /* uint32_t pairs */
    vec subs; /* int32_t */
    uint32_t gc_mask;
    uint8_t prop_mask;
} set_build;

static int sb_range(builder *b, set_build *sb, uint32_t lo, uint32_t hi) {
    uint32_t *p = vec_push(&sb->r), *q;
    if (!p) return oom(b);
    q = vec_push(&sb->r);
    if (!q) return oom(b);
    p = (uint32_t *)sb->r.p + sb->r.n - 2;
    p[0] = lo, p[1] = hi;
    return 0;
}

static int sb_sub(builder *b, set_build *sb, int32_t s) {
    int32_t *p = vec_push(&sb->subs);
    if (!p) return oom(b);
    *p = s;
    return 0;
}

static int cmp_pair(const void *x, const void *y) {
    const uint32_t *a = x, *c = y;
    return a[0] < c[0] ? -1 : a[0] > c[0];
}

/* Adds every character that folds like one in the ranges (the class under (?i)). */
static int sb_case_close(builder *b, set_build *sb) {
    size_t n0 = sb->r.n / 2;
    for (int i = 0; i < pgd__uni_n_fold;) {
        uint32_t f = pgd__uni_unfold[i].fold;
        int j = i;
        while (j < pgd__uni_n_fold && pgd__uni_unfold[j].fold == f) j++;
        const uint32_t *r = sb->r.p;
        bool hit = false;
        for (size_t k = 0; k < n0 && !hit; k++) {
            if (f >= r[2 * k] && f <= r[2 * k + 1]) hit = true;
            for (int m = i; m < j && !hit; m++)
                if (pgd__uni_unfold[m].cp >= r[2 * k] && pgd__uni_unfold[m].cp <= r[2 * k + 1])
                    hit = true;
        }
        if (hit) {
            if (sb_range(b, sb, f, f)) return -1;
            for (int m = i; m < j; m++)
                if (sb_range(b, sb, pgd__uni_unfold[m].cp, pgd__uni_unfold[m].cp)) return -1;
        }
        i = j;
    }
    return 0;
}

static void set_precompute(builder *b, int32_t si);

/* Moves a set under construction into the pools: a new set id, or -1. */
static int32_t sb_finish(builder *b, set_build *sb, bool neg, bool icase, int32_t and_next) {
    if (icase && sb->r.n && sb_case_close(b, sb)) goto out;
    size_t nr = sb->r.n / 2;
    uint32_t *r = sb->r.p;
    if (nr) qsort(r, nr, 2 * sizeof(uint32_t), cmp_pair);
    size_t m = 0;
    for (size_t k = 0; k < nr; k++) {
        if (m && r[2 * k] <= r[2 * (m - 1) + 1] + 1 && r[2 * (m - 1) + 1] != UINT32_MAX) {
            if (r[2 * k + 1] > r[2 * (m - 1) + 1]) r[2 * (m - 1) + 1] = r[2 * k + 1];
        } else {
            r[2 * m] = r[2 * k], r[2 * m + 1] = r[2 * k + 1];
            m++;
        }
    }
    re_set s = {{0}, {0}, false, neg, sb->gc_mask, sb->prop_mask, (uint32_t)(b->ranges.n / 2),
                (uint32_t)m, (uint32_t)b->subs.n, (uint32_t)sb->subs.n, and_next};
    for (size_t k = 0; k < 2 * m; k++) {
        uint32_t *p = vec_push(&b->ranges);
        if (!p) {
            oom(b);
            goto out;
        }
        *p = r[k];
    }
    for (size_t k = 0; k < sb->subs.n; k++) {
        int32_t *p = vec_push(&b->subs);
        if (!p) {
            oom(b);
            goto out;
        }
        *p = ((int32_t *)sb->subs.p)[k];
    }
    re_set *ns = vec_push(&b->sets);
    if (!ns) {
        oom(b);
        goto out;
    }
    *ns = s;
    free(sb->r.p);
    free(sb->subs.p);
    memset(sb, 0, sizeof *sb);
    set_precompute(b, (int32_t)(b->sets.n - 1));
    return (int32_t)(b->sets.n - 1);
out:
    free(sb->r.p);
    free(sb->subs.p);
    memset(sb, 0, sizeof *sb);
    return -1;
}

static void sb_init(set_build *sb) {
    memset(sb, 0, sizeof *sb);
    sb->r.size = sizeof(uint32_t);
    sb->subs.size = sizeof(int32_t);
}

static bool set_catonly(const builder *b, int32_t si) {
    const re_set *s = &SET(b, si);
    if (s->r_n && ((const uint32_t *)b->ranges.p)[2 * (s->r_off + s->r_n - 1) + 1] >= 128)
        return false;
    for (uint32_t k = 0; k < s->s_n; k++)
        if (!SET(b, ((const int32_t *)b->subs.p)[s->s_off + k]).catonly) return false;
    return s->and_next < 0 || SET(b, s->and_next).catonly;
}

static void set_precompute(builder *b, int32_t si) {
    re_set *s = &SET(b, si);
    const uint32_t *ranges = b->ranges.p;
    const int32_t *subs = b->subs.p;
    for (uint32_t c = 0; c < 128; c++)
        if (set_eval(b->sets.p, ranges, subs, si, c, pgd__uni_gcp(c)))
            s->ascii[c >> 5] |= 1u << (c & 31);
    s->catonly = set_catonly(b, si);
    if (s->catonly)
        for (uint32_t cat = 0; cat < 256; cat++)
            if (set_eval(b->sets.p, ranges, subs, si, 0x110000, cat))
                s->cattab[cat >> 5] |= 1u << (cat & 31);
}

static int32_t set_of_cp(builder *b, uint32_t cp, bool icase) {
    set_build sb;
    sb_init(&sb);
    if (sb_range(b, &sb, cp, cp)) {
        free(sb.r.p);
        return -1;
    }
    return sb_finish(b, &sb, false, icase, -1);
}

static int32_t set_union(builder *b, int32_t x, int32_t y) {
    set_build sb;
    sb_init(&sb);
    if (sb_sub(b, &sb, x) || sb_sub(b, &sb, y)) {
        free(sb.subs.p);
        return -1;
    }
    return sb_finish(b, &sb, false, false, -1);
}

/* Can no character be in both sets? (Decided for sets whose answer depends only on the category
 * outside ASCII; false when unsure.) */
static bool sets_disjoint(const builder *b, int32_t x, int32_t y) {
    const re_set *p = &SET(b, x), *q = &SET(b, y);
    if (!p->catonly || !q->catonly) return false;
    for (int k = 0; k < 4; k++)
        if (p->ascii[k] & q->ascii[k]) return false;
    for (int k = 0; k < 8; k++)
        if (p->cattab[k] & q->cattab[k]) return false;
    return true;
}

/* ---- parsing ---- */

static int peek(const builder *b) { return b->i < b->n ? (int)b->pat[b->i] : -1; }
static bool at(const builder *b, size_t k, uint32_t c) {
    return b->i + k < b->n && b->pat[b->i + k] == c;
}

static int hexval(uint32_t c) {
    if (c >= '0' && c <= '9') return (int)(c - '0');
    if (c >= 'a' && c <= 'f') return (int)(c - 'a' + 10);
    if (c >= 'A' && c <= 'F') return (int)(c - 'A' + 10);
    return -1;
}

/* Hex digits after \x / \u: exactly `fixed` of them, or {...} when braces. */
static int parse_hex(builder *b, int fixed, bool braces, uint32_t *out) {
    uint32_t v = 0;
    if (braces) {
        b->i++; /* '{' */
        int k = 0;
        while (peek(b) >= 0 && hexval((uint32_t)peek(b)) >= 0 && k < 8) {
            v = v * 16 + (uint32_t)hexval(b->pat[b->i++]);
            k++;
        }
        if (k == 0 || peek(b) != '}')
            return fail(b, PGD_EFORMAT, "bad \\x{...} escape at character %zu", b->i);
        b->i++;
    } else {
        int k = 0;
        while (k < fixed && peek(b) >= 0 && hexval((uint32_t)peek(b)) >= 0) {
            v = v * 16 + (uint32_t)hexval(b->pat[b->i++]);
            k++;
        }
        if (k == 0) return fail(b, PGD_EFORMAT, "bad hex escape at character %zu", b->i);
    }
    if (v > 0x10FFFF) return fail(b, PGD_EFORMAT, "code point U+%X out of range", v);
    *out = v;
    return 0;
}

typedef struct prop {
    const char *name;
    uint32_t gc_mask;
    uint8_t prop_mask;
} prop;

#define G(x) (1u << PGD_GC_##x)
static const prop PROPS[] = {
    {"L", G(LU) | G(LL) | G(LT) | G(LM) | G(LO), 0},
    {"Letter", G(LU) | G(LL) | G(LT) | G(LM) | G(LO), 0},
    {"LC", G(LU) | G(LL) | G(LT), 0},
    {"L&", G(LU) | G(LL) | G(LT), 0},
    {"Cased_Letter", G(LU) | G(LL) | G(LT), 0},
    {"Lu", G(LU), 0}, {"Uppercase_Letter", G(LU), 0},
    {"Ll", G(LL), 0}, {"Lowercase_Letter", G(LL), 0},
    {"Lt", G(LT), 0}, {"Titlecase_Letter", G(LT), 0},
    {"Lm", G(LM), 0}, {"Modifier_Letter", G(LM), 0},
    {"Lo", G(LO), 0}, {"Other_Letter", G(LO), 0},
    {"M", G(MN) | G(MC) | G(ME), 0}, {"Mark", G(MN) | G(MC) | G(ME), 0},
    {"Combining_Mark", G(MN) | G(MC) | G(ME), 0},
    {"Mn", G(MN), 0}, {"Nonspacing_Mark", G(MN), 0},
    {"Mc", G(MC), 0}, {"Spacing_Mark", G(MC), 0},
    {"Me", G(ME), 0}, {"Enclosing_Mark", G(ME), 0},
    {"N", G(ND) | G(NL) | G(NO), 0}, {"Number", G(ND) | G(NL) | G(NO), 0},
    {"Nd", G(ND), 0}, {"Decimal_Number", G(ND), 0}, {"Digit", G(ND), 0},
    {"Nl", G(NL), 0}, {"Letter_Number", G(NL), 0},
    {"No", G(NO), 0}, {"Other_Number", G(NO), 0},
    {"P", G(PC) | G(PD) | G(PS) | G(PE) | G(PI) | G(PF) | G(PO), 0},
    {"Punctuation", G(PC) | G(PD) | G(PS) | G(PE) | G(PI) | G(PF) | G(PO), 0},
    {"Pc", G(PC), 0}, {"Connector_Punctuation", G(PC), 0},
    {"Pd", G(PD), 0}, {"Dash_Punctuation", G(PD), 0},
    {"Ps", G(PS), 0}, {"Open_Punctuation", G(PS), 0},
    {"Pe", G(PE), 0}, {"Close_Punctuation", G(PE), 0},
    {"Pi", G(PI), 0}, {"Initial_Punctuation", G(PI), 0},
    {"Pf", G(PF), 0}, {"Final_Punctuation", G(PF), 0},
    {"Po", G(PO), 0}, {"Other_Punctuation", G(PO), 0},
    {"S", G(SM) | G(SC) | G(SK) | G(SO), 0}, {"Symbol", G(SM) | G(SC) | G(SK) | G(SO), 0},
    {"Sm", G(SM), 0}, {"Math_Symbol", G(SM), 0},
    {"Sc", G(SC), 0}, {"Currency_Symbol", G(SC), 0},
    {"Sk", G(SK), 0}, {"Modifier_Symbol", G(SK), 0},
    {"So", G(SO), 0}, {"Other_Symbol", G(SO), 0},
    {"Z", G(ZS) | G(ZL) | G(ZP), 0}, {"Separator", G(ZS) | G(ZL) | G(ZP), 0},
    {"Zs", G(ZS), 0}, {"Space_Separator", G(ZS), 0},
    {"Zl", G(ZL), 0}, {"Line_Separator", G(ZL), 0},
    {"Zp", G(ZP), 0}, {"Paragraph_Separator", G(ZP), 0},
    {"C", G(CC) | G(CF) | G(CS) | G(CO) | G(CN), 0},
    {"Other", G(CC) | G(CF) | G(CS) | G(CO) | G(CN), 0},
    {"Cc", G(CC), 0}, {"Control", G(CC), 0},
    {"Cf", G(CF), 0}, {"Format", G(CF), 0},
    {"Cs", G(CS), 0}, {"Surrogate", G(CS), 0},
    {"Co", G(CO), 0}, {"Private_Use", G(CO), 0},
    {"Cn", G(CN), 0}, {"Unassigned", G(CN), 0},
    {"Any", 0xFFFFFFFFu, 0},
    {"Han", 0, PGD_GCP_HAN}, {"Hani", 0, PGD_GCP_HAN},
    {"White_Space", 0, PGD_GCP_WS}, {"Space", 0, PGD_GCP_WS}, {"WSpace", 0, PGD_GCP_WS},
    {"Word", GC_WORD, PGD_GCP_WORDX},
};
#undef G

/* Property names compare as Oniguruma's do: case, spaces, '-' and '_' do not matter. */
static bool prop_name_eq(const char *a, const uint32_t *n, size_t len) {
    size_t i = 0;
    for (;; a++) {
        while (*a == '_' || *a == '-' || *a == ' ') a++;
        while (i < len && (n[i] == '_' || n[i] == '-' || n[i] == ' ')) i++;
        if (!*a || i == len) return !*a && i == len;
        uint32_t x = (unsigned char)*a, y = n[i++];
        if (x >= 'A' && x <= 'Z') x += 32;
        if (y >= 'A' && y <= 'Z') y += 32;
        if (x != y) return false;
    }
}

/* \p{...} / \P{...} after the letter: adds the property (negated: a nested negated set). */
static int parse_prop(builder *b, set_build *sb, bool negated) {
    if (peek(b) != '{') return fail(b, PGD_EFORMAT, "\\p without {...} at character %zu", b->i);
    b->i++;
    if (peek(b) == '^') negated = !negated, b->i++;
    size_t start = b->i;
    while (peek(b) >= 0 && peek(b) != '}') b->i++;
    if (peek(b) != '}') return fail(b, PGD_EFORMAT, "unterminated \\p{");
    size_t len = b->i - start;
    b->i++;
    const prop *p = NULL;
    for (size_t k = 0; k < sizeof PROPS / sizeof PROPS[0] && !p; k++)
        if (prop_name_eq(PROPS[k].name, b->pat + start, len)) p = &PROPS[k];
    if (!p) {
        char name[64];
        size_t k = 0;
        for (; k < len && k < sizeof name - 1; k++)
            name[k] = b->pat[start + k] < 128 ? (char)b->pat[start + k] : '?';
        name[k] = 0;
        return fail(b, PGD_EUNSUPPORTED, "unsupported property \\p{%s}", name);
    }
    if (!negated) {
        sb->gc_mask |= p->gc_mask;
        sb->prop_mask |= p->prop_mask;
        return 0;
    }
    set_build inner;
    sb_init(&inner);
    inner.gc_mask = p->gc_mask;
    inner.prop_mask = p->prop_mask;
    int32_t s = sb_finish(b, &inner, true, false, -1);
    return s < 0 ? -1 : sb_sub(b, sb, s);
}

/* A shorthand class (\s \d \w \h and their negations) into sb. */
static int add_shorthand(builder *b, set_build *sb, uint32_t c) {
    bool neg = c == 'S' || c == 'D' || c == 'W' || c == 'H';
    set_build one;
    set_build *t = neg ? &one : sb;
    if (neg) sb_init(&one);
    switch (c | 0x20) {
    case 's': t->prop_mask |= PGD_GCP_WS; break;
    case 'd': t->gc_mask |= 1u << PGD_GC_ND; break;
    case 'w':
        t->gc_mask |= GC_WORD;
        t->prop_mask |= PGD_GCP_WORDX;
        break;
    case 'h':
        if (sb_range(b, t, '0', '9') || sb_range(b, t, 'a', 'f') || sb_range(b, t, 'A', 'F')) {
            if (neg) free(one.r.p);
            return -1;
        }
        break;
    }
    if (!neg) return 0;
    int32_t s = sb_finish(b, &one, true, false, -1);
    return s < 0 ? -1 : sb_sub(b, sb, s);
}

/* An escape after '\': *cp set to a character (returns 1), or a class item added to sb (returns
 * 2; sb NULL: not allowed), or -1. in_class: \b is a backspace. */
static int parse_escape(builder *b, bool in_class, set_build *sb, uint32_t *cp) {
    if (b->i >= b->n) return fail(b, PGD_EFORMAT, "pattern ends with a backslash");
    uint32_t c = b->pat[b->i++];
    switch (c) {
    case 't': *cp = '\t'; return 1;
    case 'n': *cp = '\n'; return 1;
    case 'r': *cp = '\r'; return 1;
    case 'f': *cp = '\f'; return 1;
    case 'v': *cp = '\v'; return 1;
    case 'a': *cp = 7; return 1;
    case 'e': *cp = 0x1B; return 1;
    case '0': { /* \0, \0o, \0oo: octal */
        uint32_t v = 0;
        for (int k = 0; k < 2 && peek(b) >= '0' && peek(b) <= '7'; k++)
            v = v * 8 + (b->pat[b->i++] - '0');
        *cp = v;
        return 1;
    }
    case 'x':
        if (parse_hex(b, 2, peek(b) == '{', cp)) return -1;
        return 1;
    case 'u':
        if (parse_hex(b, 4, false, cp)) return -1;
        return 1;
    case 'b':
        if (in_class) {
            *cp = 8;
            return 1;
        }
        break;
    case 's': case 'S': case 'd': case 'D': case 'w': case 'W': case 'h': case 'H':
        if (!sb) break;
        return add_shorthand(b, sb, c) ? -1 : 2;
    case 'p': case 'P':
        if (!sb) break;
        return parse_prop(b, sb, c == 'P') ? -1 : 2;
    default:
        if (c >= '1' && c <= '9')
            return fail(b, PGD_EUNSUPPORTED, "backreferences (\\%c) are not supported", (char)c);
        if (c < 128 && !((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))) {
            *cp = c; /* escaped punctuation, space, ... */
            return 1;
        }
        if (c >= 128) {
            *cp = c;
            return 1;
        }
    }
    return fail(b, PGD_EUNSUPPORTED, "unsupported escape \\%c", c < 128 ? (char)c : '?');
}

static int32_t parse_class(builder *b, bool icase);

/* One operand of a class (up to "&&" or "]"): items into sb. */
static int parse_class_items(builder *b, set_build *sb, bool icase, bool first) {
    for (bool start = first;; start = false) {
        int c = peek(b);
        if (c < 0) return fail(b, PGD_EFORMAT, "unterminated character class");
        if (c == ']' && !start) return 0;
        if (c == '&' && at(b, 1, '&')) return 0;
        if (c == '[') {
            if (at(b, 1, ':'))
                return fail(b, PGD_EUNSUPPORTED, "POSIX bracket expressions are not supported");
            b->i++;
            int32_t s = parse_class(b, icase);
            if (s < 0 || sb_sub(b, sb, s)) return -1;
            continue;
        }
        uint32_t lo;
        b->i++;
        if (c == '\\') {
            int k = parse_escape(b, true, sb, &lo);
            if (k < 0) return -1;
            if (k == 2) continue;
        } else {
            lo = (uint32_t)c;
        }
        uint32_t hi = lo;
        if (peek(b) == '-' && b->i + 1 < b->n && b->pat[b->i + 1] != ']' &&
            !(b->pat[b->i + 1] == '&' && at(b, 2, '&'))) {
            b->i++;
            int d = peek(b);
            if (d == '[') return fail(b, PGD_EFORMAT, "bad range in character class");
            b->i++;
            if (d == '\\') {
                set_build dummy;
                sb_init(&dummy);
                int k = parse_escape(b, true, &dummy, &hi);
                free(dummy.r.p);
                free(dummy.subs.p);
                if (k < 0) return -1;
                if (k == 2) return fail(b, PGD_EFORMAT, "a range ends in a class escape");
            } else {
                hi = (uint32_t)d;
            }
            if (hi < lo) return fail(b, PGD_EFORMAT, "empty range in character class");
        }
        if (sb_range(b, sb, lo, hi)) return -1;
    }
}

/* After '[': the class up to its ']', a set id or -1. */
static int32_t parse_class(builder *b, bool icase) {
    if (++b->depth > RE_MAX_DEPTH) return fail(b, PGD_EUNSUPPORTED, "classes nested too deep");
    bool neg = false;
    if (peek(b) == '^') neg = true, b->i++;
    /* operands separated by &&: parsed left to right, chained right to left */
    vec ops = {NULL, 0, 0, sizeof(set_build)};
    bool first = true;
    int32_t result = -1;
    for (;;) {
        set_build *sb = vec_push(&ops);
        if (!sb) {
            oom(b);
            goto out;
        }
        sb_init(sb);
        if (parse_class_items(b, sb, icase, first)) goto out;
        first = false;
        if (peek(b) == '&') {
            b->i += 2;
            continue;
        }
        b->i++; /* ']' */
        break;
    }
    int32_t chain = -1;
    for (size_t k = ops.n; k-- > 1;) {
        chain = sb_finish(b, &((set_build *)ops.p)[k], false, icase, chain);
        if (chain < 0) goto out;
    }
    result = sb_finish(b, &((set_build *)ops.p)[0], neg, icase, chain);
out:
    for (size_t k = 0; k < ops.n; k++) {
        free(((set_build *)ops.p)[k].r.p);
        free(((set_build *)ops.p)[k].subs.p);
    }
    free(ops.p);
    b->depth--;
    return b->rc ? -1 : result;
}

static int32_t parse_alt(builder *b, bool icase, bool dotall);

/* A quantifier {n}, {n,}, {n,m}, {,m} at b->i ('{' there): 1 with *mn, *mx, or 0 when the brace
 * is not a valid interval (then it is a literal '{', as in Oniguruma). */
static int parse_interval(builder *b, uint32_t *mn, uint32_t *mx) {
    size_t i = b->i + 1;
    uint64_t lo = 0, hi;
    bool have_lo = false, have_hi = false;
    while (i < b->n && b->pat[i] >= '0' && b->pat[i] <= '9') {
        lo = lo * 10 + (b->pat[i++] - '0');
        have_lo = true;
        if (lo > RE_MAX_REPEAT)
            return fail(b, PGD_EUNSUPPORTED, "repeat count over %d", RE_MAX_REPEAT);
    }
    if (i < b->n && b->pat[i] == '}') {
        if (!have_lo) return 0;
        hi = lo;
    } else if (i < b->n && b->pat[i] == ',') {
        i++;
        hi = 0;
        while (i < b->n && b->pat[i] >= '0' && b->pat[i] <= '9') {
            hi = hi * 10 + (b->pat[i++] - '0');
            have_hi = true;
            if (hi > RE_MAX_REPEAT)
                return fail(b, PGD_EUNSUPPORTED, "repeat count over %d", RE_MAX_REPEAT);
        }
        if (i >= b->n || b->pat[i] != '}' || (!have_lo && !have_hi)) return 0;
        if (!have_hi) hi = RE_INF;
    } else {
        return 0;
    }
    if (hi != RE_INF && hi < lo) return fail(b, PGD_EFORMAT, "bad interval {%llu,%llu}",
                                             (unsigned long long)lo, (unsigned long long)hi);
    b->i = i + 1;
    *mn = (uint32_t)lo;
    *mx = hi == RE_INF ? RE_INF : (uint32_t)hi;
    return 1;
}

/* Flags of (?imx-imx) / (?imx-imx:...), at b->i just after "(?": returns ':' or ')' with the new
 * flags, or -1. */
static int parse_flags(builder *b, bool *icase, bool *dotall) {
    bool on = true;
    for (;;) {
        int c = peek(b);
        if (c < 0) return fail(b, PGD_EFORMAT, "unterminated group");
        b->i++;
        if (c == ':' || c == ')') return c;
        if (c == '-') on = false;
        else if (c == 'i') *icase = on;
        else if (c == 'm') *dotall = on;
        else return fail(b, PGD_EUNSUPPORTED, "unsupported group option '%c'", c < 128 ? c : '?');
    }
}

/* An atom with its quantifiers; *done set at '|', ')' or the end. Returns a node or -1; -2 for
 * "nothing here" (a (?i) that changed the flags: the caller continues). */
static int32_t parse_atom(builder *b, bool *icase, bool *dotall) {
    int c = peek(b);
    int32_t nd = -1;
    b->atom_lit = -1;
    b->i++;
    switch (c) {
    case '(': {
        if (++b->depth > RE_MAX_DEPTH) return fail(b, PGD_EUNSUPPORTED, "groups nested too deep");
        bool gi = *icase, gd = *dotall;
        int look = -1;
        if (peek(b) == '?') {
            b->i++;
            int d = peek(b);
            if (d == ':') {
                b->i++;
            } else if (d == '=' || d == '!') {
                b->i++;
                look = d == '!';
            } else if (d == '<' && (at(b, 1, '=') || at(b, 1, '!'))) {
                return fail(b, PGD_EUNSUPPORTED, "lookbehind is not supported");
            } else if (d == '>') {
                return fail(b, PGD_EUNSUPPORTED, "atomic groups (?>...) are not supported");
            } else if (d == '#') {
                while (peek(b) >= 0 && peek(b) != ')') b->i++;
                if (peek(b) < 0) return fail(b, PGD_EFORMAT, "unterminated comment");
                b->i++;
                b->depth--;
                return -2;
            } else if (d == '<' || d == '\'' || d == 'P') { /* named group: capture ignored */
                if (d == 'P') b->i++;
                uint32_t close = peek(b) == '\'' ? '\'' : '>';
                b->i++;
                while (peek(b) >= 0 && (uint32_t)peek(b) != close) b->i++;
                if (peek(b) < 0) return fail(b, PGD_EFORMAT, "unterminated group name");
                b->i++;
            } else {
                int e = parse_flags(b, &gi, &gd);
                if (e < 0) return -1;
                if (e == ')') { /* (?i): the rest of the enclosing group, as (?i:...) */
                    b->depth--;
                    *icase = gi, *dotall = gd;
                    return -2;
                }
            }
        }
        int32_t body = parse_alt(b, gi, gd);
        if (body < 0) return -1;
        if (peek(b) != ')') return fail(b, PGD_EFORMAT, "missing ')'");
        b->i++;
        b->depth--;
        if (look >= 0) {
            if (b->depth >= RE_MAX_LOOK_DEPTH)
                return fail(b, PGD_EUNSUPPORTED, "lookaheads nested too deep");
            nd = new_node(b, N_LOOK);
            if (nd < 0) return -1;
            NODE(b, nd).child = body;
            NODE(b, nd).mode = (uint8_t)look;
            return nd; /* not quantifiable (Oniguruma allows it; no real pattern does) */
        }
        nd = body;
        break;
    }
    case '[': {
        int32_t s = parse_class(b, *icase);
        if (s < 0) return -1;
        nd = new_node(b, N_SET);
        if (nd < 0) return -1;
        NODE(b, nd).val = s;
        break;
    }
    case '.': {
        set_build sb;
        sb_init(&sb);
        if (!*dotall && sb_range(b, &sb, '\n', '\n')) return -1;
        int32_t s = sb_finish(b, &sb, !*dotall, false, -1);
        if (s < 0) return -1;
        if (*dotall) {
            SET(b, s).gc_mask = 0xFFFFFFFFu; /* any: every category (invalid bytes are Cn) */
            memset(SET(b, s).ascii, 0, sizeof SET(b, s).ascii);
            memset(SET(b, s).cattab, 0, sizeof SET(b, s).cattab);
            set_precompute(b, s);
        }
        nd = new_node(b, N_SET);
        if (nd < 0) return -1;
        NODE(b, nd).val = s;
        break;
    }
    case '^': case '$': {
        nd = new_node(b, N_ASSERT);
        if (nd < 0) return -1;
        NODE(b, nd).val = c == '^' ? AS_BOL : AS_EOL;
        return nd;
    }
    case '\\': {
        int e = peek(b);
        int kind = e == 'A' ? AS_BOS : e == 'z' ? AS_EOS : e == 'Z' ? AS_EOS_NL
                 : e == 'b' ? AS_WORDB : e == 'B' ? AS_NWORDB : -1;
        if (kind >= 0) {
            b->i++;
            nd = new_node(b, N_ASSERT);
            if (nd < 0) return -1;
            NODE(b, nd).val = kind;
            return nd;
        }
        if (e == 'G' || e == 'K' || e == 'R' || e == 'X' || e == 'k' || e == 'g' || e == 'N' ||
            e == 'O' || e == 'y' || e == 'Y')
            return fail(b, PGD_EUNSUPPORTED, "unsupported escape \\%c", (char)e);
        set_build sb;
        sb_init(&sb);
        uint32_t cp;
        int k = parse_escape(b, false, &sb, &cp);
        if (k < 0) {
            free(sb.r.p);
            free(sb.subs.p);
            return -1;
        }
        if (k == 2) {
            int32_t s = sb_finish(b, &sb, false, false, -1);
            if (s < 0) return -1;
            nd = new_node(b, N_SET);
            if (nd < 0) return -1;
            NODE(b, nd).val = s;
            break;
        }
        free(sb.r.p);
        free(sb.subs.p);
        c = (int)cp;
        goto literal;
    }
    case '*': case '+': case '?':
        return fail(b, PGD_EFORMAT, "quantifier '%c' with nothing to repeat", c);
    default:
    literal:
        if (*icase) b->atom_lit = c;
        if (*icase) {
            uint32_t orbit[8];
            if (pgd__uni_case_orbit((uint32_t)c, orbit, 8) > 1) {
                int32_t s = set_of_cp(b, (uint32_t)c, true);
                if (s < 0) return -1;
                nd = new_node(b, N_SET);
                if (nd < 0) return -1;
                NODE(b, nd).val = s;
                break;
            }
        }
        nd = new_node(b, N_LIT);
        if (nd < 0) return -1;
        NODE(b, nd).val = c;
        break;
    }
    /* quantifiers */
    for (;;) {
        int q = peek(b);
        uint32_t mn = 0, mx = 0;
        if (q == '*') mn = 0, mx = RE_INF;
        else if (q == '+') mn = 1, mx = RE_INF;
        else if (q == '?') mn = 0, mx = 1;
        else if (q == '{') {
            int r = parse_interval(b, &mn, &mx);
            if (r < 0) return -1;
            if (r == 0) break;
            b->i--; /* parse_interval moved past '}'; the shared step below moves past it */
        } else break;
        b->i++;
        b->atom_lit = -1;
        uint8_t mode = RUN_GREEDY;
        /* Ruby syntax: x{n}? is (?:x{n})? (a fixed count has no lazy form), and x{n,m}+ is
           (?:x{n,m})+ (intervals have no possessive form): the next turn reads those */
        if (peek(b) == '?' && !(q == '{' && mn == mx)) mode = RUN_LAZY, b->i++;
        else if (peek(b) == '+' && q != '{') mode = RUN_POSSESSIVE, b->i++;
        int32_t r = new_node(b, N_REP);
        if (r < 0) return -1;
        NODE(b, r).child = nd;
        NODE(b, r).min = mn;
        NODE(b, r).max = mx;
        NODE(b, r).mode = mode;
        nd = r;
    }
    return nd;
}

/* Two case-insensitive literals that a single character's full case folding spells (U+00DF
 * folds to "ss", U+FB01 to "fi", ...): Oniguruma matches that character too; this engine folds
 * one character to one, so it refuses the pattern rather than split differently. */
static bool multi_fold_pair(uint32_t a, uint32_t c) {
    static const char pairs[][2] = {{'s', 's'}, {'s', 't'}, {'f', 'f'}, {'f', 'i'}, {'f', 'l'}};
    a = pgd__uni_fold_cp(a), c = pgd__uni_fold_cp(c);
    for (size_t k = 0; k < sizeof pairs / sizeof pairs[0]; k++)
        if (a == (uint32_t)pairs[k][0] && c == (uint32_t)pairs[k][1]) return true;
    return false;
}

static int32_t parse_seq(builder *b, bool icase, bool dotall) {
    int32_t cat = new_node(b, N_CAT), last = -1;
    int64_t prev_lit = -1;
    if (cat < 0) return -1;
    for (;;) {
        int c = peek(b);
        if (c < 0 || c == '|' || c == ')') return cat;
        bool ni = icase, nd = dotall;
        int32_t a = parse_atom(b, &ni, &nd);
        if (a == -1) return -1;
        if (a >= 0 && prev_lit >= 0 && b->atom_lit >= 0 &&
            multi_fold_pair((uint32_t)prev_lit, (uint32_t)b->atom_lit))
            return fail(b, PGD_EUNSUPPORTED,
                        "case-insensitive '%c%c' (a multi-character case folding) is not "
                        "supported", (char)prev_lit, (char)b->atom_lit);
        prev_lit = a >= 0 ? b->atom_lit : -1;
        if (a == -2) {
            if (ni == icase && nd == dotall) continue; /* a comment */
            /* (?i) mid-sequence: the rest of the enclosing group under the new flags */
            a = parse_alt(b, ni, nd);
            if (a < 0) return -1;
        }
        if (last < 0) NODE(b, cat).child = a;
        else NODE(b, last).next = a;
        last = a;
    }
}

static int32_t parse_alt(builder *b, bool icase, bool dotall) {
    int32_t alt = new_node(b, N_ALT), last = -1;
    if (alt < 0) return -1;
    for (;;) {
        int32_t s = parse_seq(b, icase, dotall);
        if (s < 0) return -1;
        if (last < 0) NODE(b, alt).child = s;
        else NODE(b, last).next = s;
        last = s;
        if (peek(b) != '|') return alt;
        b->i++;
    }
}

/* ---- analysis ---- */

static bool nullable(builder *b, int32_t nd) {
    const re_node *n = &NODE(b, nd);
    switch (n->type) {
    case N_LIT: case N_SET: return false;
    case N_CAT:
        for (int32_t c = n->child; c >= 0; c = NODE(b, c).next)
            if (!nullable(b, c)) return false;
        return true;
    case N_ALT:
        for (int32_t c = n->child; c >= 0; c = NODE(b, c).next)
            if (nullable(b, c)) return true;
        return n->child < 0;
    case N_REP: return n->min == 0 || nullable(b, n->child);
    default: return true;
    }
}

/* The set the first character of every non-empty match of nd is in (whether nd can also match
 * empty is nullable()'s to say); -1 when unknown. */
static int32_t first_set(builder *b, int32_t nd) {
    const re_node n = NODE(b, nd);
    switch (n.type) {
    case N_LIT: return set_of_cp(b, (uint32_t)n.val, false);
    case N_SET: return n.val;
    case N_REP: return n.max == 0 ? -1 : first_set(b, n.child);
    case N_CAT: {
        /* the children up to the first that cannot be empty */
        int32_t acc = -1;
        for (int32_t c = n.child; c >= 0; c = NODE(b, c).next) {
            int t = NODE(b, c).type;
            if (t == N_ASSERT || t == N_LOOK) continue;
            int32_t f = first_set(b, c);
            if (f < 0) return -1;
            acc = acc < 0 ? f : set_union(b, acc, f);
            if (acc < 0 || !nullable(b, c)) return acc;
        }
        return acc;
    }
    case N_ALT: {
        int32_t acc = -1;
        for (int32_t c = n.child; c >= 0; c = NODE(b, c).next) {
            if (NODE(b, c).type == N_CAT && NODE(b, c).child < 0) continue; /* empty branch */
            int32_t f = first_set(b, c);
            if (f < 0) return -1;
            acc = acc < 0 ? f : set_union(b, acc, f);
            if (acc < 0) return -1;
        }
        return acc;
    }
    default: return -1;
    }
}

/* Is nd exactly one character (a LIT, a SET, or an alternation of them), as a RUN can repeat
 * it? Its set, or -1. */
static int32_t single_set(builder *b, int32_t nd) {
    while (NODE(b, nd).type == N_CAT) {
        int32_t c = NODE(b, nd).child;
        if (c < 0 || NODE(b, c).next >= 0) return -1;
        nd = c;
    }
    if (NODE(b, nd).type == N_SET) return NODE(b, nd).val;
    if (NODE(b, nd).type == N_LIT) return set_of_cp(b, (uint32_t)NODE(b, nd).val, false);
    if (NODE(b, nd).type != N_ALT || NODE(b, nd).child < 0) return -1;
    int32_t acc = -1;
    for (int32_t c = NODE(b, nd).child; c >= 0; c = NODE(b, c).next) {
        int32_t one = single_set(b, c);
        if (one < 0) return -1;
        acc = acc < 0 ? one : set_union(b, acc, one);
        if (acc < 0) return -1;
    }
    return acc;
}

/* ---- code generation ---- */

#define INST(b, i) (((re_inst *)(b)->prog.p)[i])

static int32_t emit(builder *b, re_inst in) {
    if (b->prog.n >= RE_MAX_INSTS)
        return fail(b, PGD_EUNSUPPORTED, "pattern too large (over %d instructions)", RE_MAX_INSTS);
    re_inst *p = vec_push(&b->prog);
    if (!p) return oom(b);
    *p = in;
    return (int32_t)(b->prog.n - 1);
}

static re_inst mk(int op) {
    re_inst in;
    memset(&in, 0, sizeof in);
    in.op = (uint8_t)op;
    in.a = in.b = in.fa = in.fb = in.slot = in.run_slot = -1;
    return in;
}

static int gen(builder *b, int32_t nd);

static int gen_rep(builder *b, int32_t nd) {
    const re_node n = NODE(b, nd);
    int32_t s = single_set(b, n.child);
    if (b->rc) return -1;
    if (s >= 0) {
        re_inst in = mk(OP_RUN);
        in.a = s, in.min = n.min, in.max = n.max, in.mode = n.mode;
        in.excl = b->follow >= 0 && sets_disjoint(b, s, b->follow);
        return emit(b, in) < 0 ? -1 : 0;
    }
    if (n.mode == RUN_POSSESSIVE)
        return fail(b, PGD_EUNSUPPORTED,
                    "possessive quantifiers are supported on one-character atoms only");
    if (n.max == RE_INF && nullable(b, n.child))
        return fail(b, PGD_EUNSUPPORTED,
                    "a group repeated without bound that can match the empty string");
    bool lazy = n.mode == RUN_LAZY;
    for (uint32_t k = 0; k < n.min; k++)
        if (gen(b, n.child)) return -1;
    if (n.max == RE_INF) {
        int32_t split = emit(b, mk(OP_SPLIT));
        if (split < 0 || gen(b, n.child)) return -1;
        re_inst j = mk(OP_JMP);
        j.a = split;
        if (emit(b, j) < 0) return -1;
        int32_t out = (int32_t)b->prog.n;
        INST(b, split).a = lazy ? out : split + 1;
        INST(b, split).b = lazy ? split + 1 : out;
        return 0;
    }
    /* x{0,k}: k optional copies, each one's skip leaving the whole repetition */
    uint32_t opt = n.max - n.min;
    int32_t *splits = malloc(sizeof(int32_t) * (opt ? opt : 1));
    if (!splits) return oom(b);
    for (uint32_t k = 0; k < opt; k++) {
        splits[k] = emit(b, mk(OP_SPLIT));
        if (splits[k] < 0 || gen(b, n.child)) {
            free(splits);
            return -1;
        }
    }
    int32_t out = (int32_t)b->prog.n;
    for (uint32_t k = 0; k < opt; k++) {
        INST(b, splits[k]).a = lazy ? out : splits[k] + 1;
        INST(b, splits[k]).b = lazy ? splits[k] + 1 : out;
    }
    free(splits);
    return 0;
}

static int gen(builder *b, int32_t nd) {
    const re_node n = NODE(b, nd);
    switch (n.type) {
    case N_LIT: {
        re_inst in = mk(OP_LIT);
        in.a = n.val;
        return emit(b, in) < 0 ? -1 : 0;
    }
    case N_SET: {
        re_inst in = mk(OP_CHAR);
        in.a = n.val;
        return emit(b, in) < 0 ? -1 : 0;
    }
    case N_CAT:
        for (int32_t c = n.child; c >= 0; c = NODE(b, c).next) {
            /* what follows a repetition inside the sequence, when something after it must
               consume a character */
            b->follow = -1;
            if (NODE(b, c).type == N_REP) {
                int32_t acc = -1;
                for (int32_t d = NODE(b, c).next; d >= 0; d = NODE(b, d).next) {
                    int t = NODE(b, d).type;
                    if (t == N_ASSERT || t == N_LOOK) {
                        acc = -1;
                        break;
                    }
                    int32_t f = first_set(b, d);
                    if (f < 0) {
                        acc = -1;
                        break;
                    }
                    acc = acc < 0 ? f : set_union(b, acc, f);
                    if (acc < 0) break;
                    if (!nullable(b, d)) {
                        b->follow = acc;
                        break;
                    }
                }
            }
            int rc = gen(b, c);
            b->follow = -1;
            if (rc) return -1;
        }
        return 0;
    case N_ALT: {
        if (n.child < 0) return 0;
        if (NODE(b, n.child).next < 0) return gen(b, n.child);
        /* SPLIT(b1, next) b1 JMP(out) SPLIT(b2, next) b2 JMP(out) ... bk; each SPLIT knows
           the first characters of its branch (fa) and of all the branches after it (fb), so
           that where only one side can start, it is no choice (no memo, no frame) */
        vec jumps = {NULL, 0, 0, sizeof(int32_t)};
        for (int32_t c = n.child; c >= 0; c = NODE(b, c).next) {
            int32_t split = -1;
            if (NODE(b, c).next >= 0) {
                split = emit(b, mk(OP_SPLIT));
                if (split < 0) goto alt_fail;
                INST(b, split).fa = nullable(b, c) ? -1 : first_set(b, c);
                int32_t rest = -1;
                for (int32_t d = NODE(b, c).next; d >= 0; d = NODE(b, d).next) {
                    int32_t f = nullable(b, d) ? -1 : first_set(b, d);
                    if (f < 0) {
                        rest = -1;
                        break;
                    }
                    rest = rest < 0 ? f : set_union(b, rest, f);
                    if (rest < 0) break;
                }
                INST(b, split).fb = rest;
                if (b->rc) goto alt_fail;
            }
            if (gen(b, c)) goto alt_fail;
            if (split >= 0) {
                int32_t *j = vec_push(&jumps);
                if (!j) {
                    oom(b);
                    goto alt_fail;
                }
                *j = emit(b, mk(OP_JMP));
                if (*j < 0) goto alt_fail;
                INST(b, split).a = split + 1;
                INST(b, split).b = (int32_t)b->prog.n;
            }
        }
        for (size_t k = 0; k < jumps.n; k++)
            INST(b, ((int32_t *)jumps.p)[k]).a = (int32_t)b->prog.n;
        free(jumps.p);
        return 0;
    alt_fail:
        free(jumps.p);
        return -1;
    }
    case N_REP: return gen_rep(b, nd);
    case N_ASSERT: {
        re_inst in = mk(OP_ASSERT);
        in.mode = (uint8_t)n.val;
        return emit(b, in) < 0 ? -1 : 0;
    }
    case N_LOOK: {
        re_inst in = mk(OP_LOOK);
        in.mode = n.mode;
        in.b = nd; /* the body's node until the bodies are generated */
        int32_t ip = emit(b, in);
        if (ip < 0) return -1;
        int32_t *l = vec_push(&b->looks);
        if (!l) return oom(b);
        *l = ip;
        return 0;
    }
    default: return 0;
    }
}

static int compile_cps(builder *b, pgd_re **out) {
    b->nodes.size = sizeof(re_node);
    b->sets.size = sizeof(re_set);
    b->ranges.size = sizeof(uint32_t);
    b->subs.size = sizeof(int32_t);
    b->prog.size = sizeof(re_inst);
    b->looks.size = sizeof(int32_t);
    pgd__uni_gcp_init();
    int32_t root = parse_alt(b, false, false);
    if (root >= 0 && b->i < b->n) fail(b, PGD_EFORMAT, "unmatched ')' at character %zu", b->i);
    if (b->rc) return b->rc;
    int32_t first = nullable(b, root) ? -1 : first_set(b, root);
    if (b->rc) return b->rc;
    if (gen(b, root) || emit(b, mk(OP_MATCH)) < 0) return b->rc;
    size_t main_end = b->prog.n; /* the lookahead bodies come after */
    for (size_t k = 0; k < b->looks.n; k++) { /* bodies after the main program */
        int32_t ip = ((int32_t *)b->looks.p)[k];
        int32_t body = INST(b, ip).b;
        INST(b, ip).a = (int32_t)b->prog.n;
        INST(b, ip).b = -1;
        if (gen(b, NODE(b, body).child) || emit(b, mk(OP_MATCH)) < 0) return b->rc;
    }
    /* a RUN after which the main program matches whatever comes: jumps and runs that may be
       empty up to its MATCH (then its first length succeeds) */
    for (size_t k = 0; k < b->prog.n; k++) {
        if (INST(b, k).op != OP_RUN) continue;
        size_t j = k + 1;
        for (int hops = 0; hops < 64 && j < b->prog.n; hops++) {
            if (INST(b, j).op == OP_JMP) j = (size_t)INST(b, j).a;
            else if (INST(b, j).op == OP_RUN && INST(b, j).min == 0) j++;
            else break;
        }
        INST(b, k).tail = j < main_end && INST(b, j).op == OP_MATCH;
    }
    /* memo slots: the states that can have a choice (every SPLIT and LOOK, the RUNs that may
       try more than one length); cache slots: every RUN */
    uint32_t slots = 0, runs = 0;
    for (size_t k = 0; k < b->prog.n; k++) {
        re_inst *in = &INST(b, k);
        bool choice = in->op == OP_RUN && !in->tail && !in->excl && in->min != in->max &&
                      in->mode != RUN_POSSESSIVE;
        if (in->op == OP_SPLIT || in->op == OP_LOOK || choice) in->slot = (int32_t)slots++;
        if (in->op == OP_RUN) in->run_slot = (int32_t)runs++;
    }
    pgd_re *re = calloc(1, sizeof *re);
    if (!re) return oom(b);
    re->prog = b->prog.p, re->n_prog = (uint32_t)b->prog.n;
    re->sets = b->sets.p, re->n_sets = (uint32_t)b->sets.n;
    re->ranges = b->ranges.p;
    re->subs = b->subs.p;
    re->n_slots = slots, re->n_runs = runs;
    re->first = first;
    b->prog.p = b->sets.p = b->ranges.p = b->subs.p = NULL;
    *out = re;
    return 0;
}

static int compile(const uint32_t *cps, size_t n, pgd_re **out, char *msg, size_t msg_cap) {
    builder b;
    memset(&b, 0, sizeof b);
    b.pat = cps, b.n = n, b.msg = msg, b.msg_cap = msg_cap;
    b.follow = -1;
    *out = NULL;
    int rc = compile_cps(&b, out);
    free(b.nodes.p);
    free(b.sets.p);
    free(b.ranges.p);
    free(b.subs.p);
    free(b.prog.p);
    free(b.looks.p);
    return rc;
}

int pgd__re_compile(const char *pattern, size_t len, pgd_re **out, char *msg, size_t msg_cap) {
    uint32_t *cps = malloc(sizeof(uint32_t) * (len + 1));
    if (!cps) {
        if (msg && msg_cap) snprintf(msg, msg_cap, "out of memory");
        return PGD_ENOMEM;
    }
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        int l = pgd__utf8_decode((const unsigned char *)pattern + i, len - i, &cps[n]);
        if (cps[n] & PGD_UNI_INVALID) {
            free(cps);
            if (msg && msg_cap) snprintf(msg, msg_cap, "pattern is not valid UTF-8");
            return PGD_EFORMAT;
        }
        n++;
        i += (size_t)l;
    }
    int rc = compile(cps, n, out, msg, msg_cap);
    free(cps);
    return rc;
}

int pgd__re_compile_literal(const char *s, size_t len, pgd_re **out, char *msg, size_t msg_cap) {
    char *esc = malloc(2 * len + 1);
    if (!esc) {
        if (msg && msg_cap) snprintf(msg, msg_cap, "out of memory");
        return PGD_ENOMEM;
    }
    size_t k = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        bool alnum = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
        if (c < 128 && !alnum)
            esc[k++] = '\\';
        if (c == '\n') c = 'n', esc[k - 1] = '\\';
        esc[k++] = (char)c;
    }
    int rc = pgd__re_compile(esc, k, out, msg, msg_cap);
    free(esc);
    return rc;
}

void pgd__re_free(pgd_re *re) {
    if (!re) return;
    free(re->prog);
    free(re->sets);
    free(re->ranges);
    free(re->subs);
    free(re);
}

/* ---- matching ---- */

enum { M_UNKNOWN = 0, M_FAIL = 1, M_OK = 2 };

typedef struct frame {
    uint32_t ip, pos, k, e; /* branch instruction, its position, next alternative, run end */
} frame;

typedef struct run_cache {
    uint32_t lo, hi;   /* [lo, hi) all in the set; hi is n or a character outside it */
    uint32_t flo, fhi; /* continuations at positions [flo, fhi] are known to fail */
} run_cache;

typedef struct matcher {
    uint64_t steps;
    const pgd_re *re;
    const uint32_t *cp;
    const uint8_t *cat;
    uint32_t n;
    uint8_t *memo; /* 2 bits per (position, slot) */
    run_cache *runs;
    pgd_tok_scratch *fsc;
    frame *fr;
    size_t sp, cap;
} matcher;

static inline unsigned memo_get(const matcher *m, int32_t slot, uint32_t pos) {
    size_t i = (size_t)pos * m->re->n_slots + (size_t)slot;
    return (m->memo[i >> 2] >> ((i & 3) * 2)) & 3;
}

static inline void memo_set(matcher *m, int32_t slot, uint32_t pos, unsigned v) {
    size_t i = (size_t)pos * m->re->n_slots + (size_t)slot;
    uint8_t *p = &m->memo[i >> 2];
    *p = (uint8_t)((*p & ~(3u << ((i & 3) * 2))) | (v << ((i & 3) * 2)));
}

static int push(matcher *m, frame f) {
    if (m->sp == m->cap) {
        size_t nc = m->cap ? m->cap * 2 : 256;
        frame *nf = pgd__tok_scratch_get(m->fsc, nc * sizeof(frame));
        if (!nf) return PGD_ENOMEM;
        m->fr = nf;
        m->cap = nc;
    }
    m->fr[m->sp++] = f;
    return 0;
}

static bool assert_ok(const matcher *m, unsigned kind, uint32_t pos) {
    switch (kind) {
    case AS_BOL: return pos == 0 || m->cp[pos - 1] == '\n';
    case AS_EOL: return pos == m->n || m->cp[pos] == '\n';
    case AS_BOS: return pos == 0;
    case AS_EOS: return pos == m->n;
    case AS_EOS_NL: return pos == m->n || (pos + 1 == m->n && m->cp[pos] == '\n');
    default: {
        bool a = pos > 0 && is_word(m->cp[pos - 1], m->cat[pos - 1]);
        bool z = pos < m->n && is_word(m->cp[pos], m->cat[pos]);
        return (a != z) == (kind == AS_WORDB);
    }
    }
}

/* End of the run of in's set from pos (not yet capped by max), from the run cache. */
static uint32_t run_end(matcher *m, const re_inst *in, uint32_t pos) {
    run_cache *rc = &m->runs[in->run_slot];
    if (rc->lo <= pos && pos <= rc->hi) return rc->hi;
    uint32_t e = pos;
    while (e < m->n && set_match(m->re, in->a, m->cp[e], m->cat[e])) {
        e++;
        if (e == rc->lo && rc->lo <= rc->hi) { /* ran into the cached run: it ends there */
            e = rc->hi;
            break;
        }
    }
    rc->lo = pos, rc->hi = e;
    return e;
}

/* The next continuation position of the RUN frame f, or UINT32_MAX when it has none left. */
static uint32_t run_next(matcher *m, frame *f, const re_inst *in) {
    const run_cache *rc = &m->runs[in->run_slot];
    uint32_t lo = f->pos + in->min;
    if (in->mode == RUN_LAZY) {
        while (f->k <= f->e && f->k >= rc->flo && f->k <= rc->fhi && rc->flo <= rc->fhi)
            f->k = rc->fhi + 1;
        if (f->k > f->e) return UINT32_MAX;
        return f->k++;
    }
    if (f->k == UINT32_MAX || f->k < lo) return UINT32_MAX;
    while (f->k >= lo && rc->flo <= rc->fhi && f->k >= rc->flo && f->k <= rc->fhi) {
        if (rc->flo == 0 || rc->flo - 1 < lo) return UINT32_MAX;
        f->k = rc->flo - 1;
    }
    if (f->k < lo) return UINT32_MAX;
    uint32_t k = f->k;
    f->k = in->mode == RUN_POSSESSIVE || k == lo ? UINT32_MAX : k - 1;
    return k;
}

/* All the continuations [lo, hi] of a run failed: remember them. */
static void run_failed(matcher *m, const re_inst *in, uint32_t lo, uint32_t hi) {
    run_cache *rc = &m->runs[in->run_slot];
    if (in->mode == RUN_POSSESSIVE) lo = hi; /* only the longest was tried */
    if (rc->flo <= rc->fhi && lo <= rc->fhi + 1 && hi + 1 >= rc->flo) {
        if (lo < rc->flo) rc->flo = lo;
        if (hi > rc->fhi) rc->fhi = hi;
    } else {
        rc->flo = lo, rc->fhi = hi;
    }
}

static int look_eval(matcher *m, const re_inst *in, uint32_t pos);

/* Runs the program from (ip, pos): the end of the first match in priority order (main program)
 * or of any (body: a lookahead's, whose branch states are then remembered as succeeding), -1
 * when there is none, PGD_ENOMEM (negative, below -1) when frames could not grow. */
static int64_t run(matcher *m, uint32_t ip, uint32_t pos, bool body) {
    const pgd_re *re = m->re;
    const size_t base = m->sp;
    for (;;) {
        const re_inst *in = &re->prog[ip];
        m->steps++;
        switch (in->op) {
        case OP_LIT:
            if (pos < m->n && m->cp[pos] == (uint32_t)in->a) {
                pos++, ip++;
                continue;
            }
            goto backtrack;
        case OP_CHAR:
            if (pos < m->n && set_match(re, in->a, m->cp[pos], m->cat[pos])) {
                pos++, ip++;
                continue;
            }
            goto backtrack;
        case OP_JMP: ip = (uint32_t)in->a; continue;
        case OP_ASSERT:
            if (assert_ok(m, in->mode, pos)) {
                ip++;
                continue;
            }
            goto backtrack;
        case OP_LOOK: {
            int r = look_eval(m, in, pos);
            if (r < 0) return r;
            if (r != (in->mode != 0)) {
                ip++;
                continue;
            }
            goto backtrack;
        }
        case OP_MATCH: goto success;
        case OP_SPLIT: {
            /* where only one side can start here, it is no choice */
            if (in->fa >= 0 && !(pos < m->n && set_match(re, in->fa, m->cp[pos], m->cat[pos]))) {
                ip = (uint32_t)in->b;
                continue;
            }
            if (in->fb >= 0 && !(pos < m->n && set_match(re, in->fb, m->cp[pos], m->cat[pos]))) {
                ip = (uint32_t)in->a;
                continue;
            }
            goto branch;
        }
        case OP_RUN: {
            uint32_t e = run_end(m, in, pos);
            if (in->max != RE_INF && e - pos > in->max) e = pos + in->max;
            if (e - pos < in->min) goto backtrack;
            /* one length to try: none shorter or longer is allowed, or the match ends right
               after the run (then the first length tried succeeds) */
            if (in->slot < 0 || e == pos + in->min) {
                pos = in->mode == RUN_LAZY ? pos + in->min : e;
                ip++;
                continue;
            }
            goto branch;
        }
        }
        continue;
    branch: { /* a state with a choice: memoized, alternatives on the frame stack */
            unsigned st = memo_get(m, in->slot, pos);
            if (st == M_FAIL) goto backtrack;
            if (st == M_OK) goto success;
            memo_set(m, in->slot, pos, M_FAIL); /* final unless a match passes through it */
            frame f = {ip, pos, 0, 0};
            if (in->op == OP_RUN) {
                uint32_t e = run_end(m, in, pos);
                if (in->max != RE_INF && e - pos > in->max) e = pos + in->max;
                f.e = e;
                f.k = in->mode == RUN_LAZY ? pos + in->min : e;
            }
            if (push(m, f)) return PGD_ENOMEM;
            goto backtrack;
        }
    backtrack:
        for (;;) {
            if (m->sp == base) return -1;
            m->steps++;
            frame *f = &m->fr[m->sp - 1];
            const re_inst *b = &re->prog[f->ip];
            if (b->op == OP_SPLIT) {
                uint32_t p = f->pos;
                if (f->k == 0) {
                    f->k = 1;
                    if (b->fa < 0 || (p < m->n && set_match(re, b->fa, m->cp[p], m->cat[p]))) {
                        ip = (uint32_t)b->a, pos = p;
                        break;
                    }
                }
                if (f->k == 1) {
                    f->k = 2;
                    ip = (uint32_t)b->b, pos = p;
                    break;
                }
                m->sp--;
                continue;
            }
            uint32_t k = run_next(m, f, b);
            if (k != UINT32_MAX) {
                ip = f->ip + 1, pos = k;
                break;
            }
            run_failed(m, b, f->pos + b->min, f->e);
            m->sp--;
        }
    }
success:
    /* the branch states on the way: a body's reach its end (remember it); the main program's
     * must stay open for later searches (they are not failures) */
    for (size_t k = base; k < m->sp; k++)
        memo_set(m, re->prog[m->fr[k].ip].slot, m->fr[k].pos, body ? M_OK : M_UNKNOWN);
    m->sp = base;
    return pos;
}

/* A lookahead's body at pos: 1 matches, 0 not, or negative (no memory); memoized per position. */
static int look_eval(matcher *m, const re_inst *in, uint32_t pos) {
    unsigned st = memo_get(m, in->slot, pos);
    if (st != M_UNKNOWN) return st == M_OK;
    int64_t r = run(m, (uint32_t)in->a, pos, true);
    if (r < -1) return (int)r;
    memo_set(m, in->slot, pos, r >= 0 ? M_OK : M_FAIL);
    return r >= 0;
}

static int matcher_init(matcher *m, const pgd_re *re, const pgd_re_subject *s, pgd_re_scratch *sc) {
    memset(m, 0, sizeof *m);
    m->re = re, m->cp = s->cp, m->cat = s->cat, m->n = s->n;
    size_t bits = ((size_t)s->n + 1) * re->n_slots * 2;
    size_t bytes = (bits + 7) / 8 + 1;
    m->memo = pgd__tok_scratch_get(&sc->memo, bytes);
    m->runs = pgd__tok_scratch_get(&sc->runs, sizeof(run_cache) * (re->n_runs + 1));
    if (!m->memo || !m->runs) return PGD_ENOMEM;
    memset(m->memo, 0, bytes);
    for (uint32_t k = 0; k < re->n_runs; k++) m->runs[k] = (run_cache){1, 0, 1, 0};
    m->fsc = &sc->frames;
    m->fr = sc->frames.buf;
    m->cap = sc->frames.cap / sizeof(frame);
    return 0;
}

/* The leftmost match at or after start: 1 (bounds in *ms, *me), 0, or negative. */
static int search(matcher *m, uint32_t start, uint32_t *ms, uint32_t *me) {
    const pgd_re *re = m->re;
    for (uint32_t s = start; s <= m->n; s++) {
        if (re->first >= 0 && (s == m->n || !set_match(re, re->first, m->cp[s], m->cat[s])))
            continue;
        int64_t r = run(m, 0, s, false);
        if (r < -1) return (int)r;
        if (r >= 0) {
            *ms = s, *me = (uint32_t)r;
            return 1;
        }
    }
    return 0;
}

int pgd__re_search(const pgd_re *re, const pgd_re_subject *subj, uint32_t start,
                   pgd_re_scratch *sc, uint32_t *ms, uint32_t *me) {
    matcher m;
    if (matcher_init(&m, re, subj, sc)) return PGD_ENOMEM;
    int r = search(&m, start, ms, me);
    sc->steps += m.steps;
    return r;
}

int pgd__re_find_iter(const pgd_re *re, const pgd_re_subject *subj, pgd_re_scratch *sc,
                      pgd_re_match_fn fn, void *ctx) {
    matcher m;
    if (matcher_init(&m, re, subj, sc)) return PGD_ENOMEM;
    uint32_t last_end = 0, last_match = 0;
    bool have_last = false;
    while (last_end <= subj->n) {
        uint32_t s = 0, e = 0;
        int r = search(&m, last_end, &s, &e);
        if (r < 0) {
            sc->steps += m.steps;
            return r;
        }
        if (r == 0) break;
        if (s == e && have_last && last_match == e) { /* no empty match right after a match */
            last_end++;
            continue;
        }
        last_end = e, last_match = e, have_last = true;
        int rc = fn(ctx, s, e);
        if (rc) {
            sc->steps += m.steps;
            return rc;
        }
    }
    sc->steps += m.steps;
    return 0;
}

void pgd__re_scratch_free(pgd_re_scratch *sc) {
    free(sc->memo.buf);
    free(sc->frames.buf);
    free(sc->runs.buf);
    memset(sc, 0, sizeof *sc);
}

uint32_t pgd__re_decode(const char *s, size_t n, bool byte_level, uint32_t *cp, uint8_t *cat,
                        uint32_t *off) {
    const unsigned char *u = (const unsigned char *)s;
    uint32_t m = 0;
    pgd__uni_gcp_init();
    if (byte_level) {
        uint32_t map[256];
        uint8_t mcat[256];
        for (int b = 0; b < 256; b++) {
            map[b] = pgd__bytelevel_cp((unsigned char)b);
            mcat[b] = (uint8_t)pgd__uni_gcp_ready(map[b]);
        }
        for (size_t i = 0; i < n; i++) {
            off[i] = (uint32_t)i;
            cp[i] = map[u[i]];
            cat[i] = mcat[u[i]];
        }
        off[n] = (uint32_t)n;
        return (uint32_t)n;
    }
    for (size_t i = 0; i < n;) {
        off[m] = (uint32_t)i;
        uint32_t c;
        if (u[i] < 0x80) {
            c = u[i];
            i++;
        } else {
            i += (size_t)pgd__utf8_decode(u + i, n - i, &c);
        }
        cp[m] = c;
        cat[m] = (uint8_t)((c & PGD_UNI_INVALID) ? 0 : pgd__uni_gcp_ready(c));
        m++;
    }
    off[m] = (uint32_t)n;
    return m;
}
