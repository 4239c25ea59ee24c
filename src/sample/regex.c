/* Regular expressions to DFAs over UTF-8 bytes (regex.h): a recursive-descent parser builds a
 * syntax tree whose character sets are code point ranges; Thompson's construction turns it
 * into an NFA over bytes (each code point range becomes the byte-range sequences of its UTF-8
 * forms); the subset construction makes the DFA, over classes of bytes that every NFA edge
 * treats alike; states from which no match can be reached are cut away. */
#include "sample/regex.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/unicode.h"
#include "util/parse.h"
#include "util/status.h"
#include "util/xalloc.h"

#define MAX_CP 0x10FFFF
#define MAX_REPEAT 1000

/* ---- syntax tree ---- */

typedef enum { N_SET, N_CAT, N_ALT, N_REP, N_EMPTY } nkind;

typedef struct node {
    nkind k;
    int32_t a, b;         /* CAT/ALT: children; REP: child a */
    int32_t min, max;     /* REP: max -1 for no bound */
    int32_t r0, nr;       /* SET: ranges [r0, r0 + nr) of the parser's range array */
} node;

typedef struct range {
    uint32_t lo, hi;
} range;

typedef struct parser {
    const unsigned char *p, *start, *end;
    node *nodes;
    int32_t n_nodes, cap_nodes;
    range *ranges;
    int32_t n_ranges, cap_ranges;
    char *msg;
    size_t msg_len;
    int rc;               /* first error */
} parser;

static int32_t perr(parser *ps, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int32_t perr(parser *ps, const char *fmt, ...) {
    if (!ps->rc) {
        ps->rc = PGD_EINVAL;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(ps->msg, ps->msg_len, fmt, ap);
        va_end(ap);
    }
    return -1;
}

static int32_t oom(parser *ps) {
    if (!ps->rc) {
        ps->rc = PGD_ENOMEM;
        snprintf(ps->msg, ps->msg_len, "out of memory");
    }
    return -1;
}

static int32_t mk(parser *ps, node n) {
    if (ps->rc) return -1;
    if (pgd_grow_i32(&ps->nodes, ps->n_nodes, &ps->cap_nodes, 64, sizeof *ps->nodes))
        return oom(ps);
    ps->nodes[ps->n_nodes] = n;
    return ps->n_nodes++;
}

static void add_range(parser *ps, uint32_t lo, uint32_t hi) {
    if (ps->rc) return;
    if (pgd_grow_i32(&ps->ranges, ps->n_ranges, &ps->cap_ranges, 64, sizeof *ps->ranges)) {
        oom(ps);
        return;
    }
    ps->ranges[ps->n_ranges++] = (range){lo, hi};
}

static int cmp_range(const void *a, const void *b) {
    const range *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Makes ranges [r0, n_ranges) a SET node: sorted, merged, negated if asked, without the
 * surrogates (never valid in UTF-8). */
static int32_t mk_set(parser *ps, int32_t r0, bool negate) {
    if (ps->rc) return -1;
    range *r = ps->ranges + r0;
    int32_t n = ps->n_ranges - r0, m = 0;
    qsort(r, (size_t)n, sizeof *r, cmp_range);
    for (int32_t i = 0; i < n; i++) {
        if (m && r[i].lo <= r[m - 1].hi + 1) {
            if (r[i].hi > r[m - 1].hi) r[m - 1].hi = r[i].hi;
        } else {
            r[m++] = r[i];
        }
    }
    ps->n_ranges = r0 + m;
    if (negate) {
        range tmp[2 * 64 + 2];
        range *c = m < 64 ? tmp : malloc((size_t)(m + 1) * sizeof *c);
        if (!c) return oom(ps);
        int32_t k = 0;
        uint32_t from = 0;
        for (int32_t i = 0; i < m; i++) {
            if (r[i].lo > from) c[k++] = (range){from, r[i].lo - 1};
            from = r[i].hi + 1;
        }
        if (from <= MAX_CP) c[k++] = (range){from, MAX_CP};
        ps->n_ranges = r0;
        for (int32_t i = 0; i < k; i++) add_range(ps, c[i].lo, c[i].hi);
        if (c != tmp) free(c);
        if (ps->rc) return -1;
        r = ps->ranges + r0;
        m = ps->n_ranges - r0;
    }
    /* cut [D800, DFFF] out */
    int32_t n0 = m;
    for (int32_t i = 0; i < n0; i++) {
        range x = ps->ranges[r0 + i];
        if (x.hi < 0xD800 || x.lo > 0xDFFF) continue;
        ps->ranges[r0 + i].hi = x.lo < 0xD800 ? 0xD7FF : x.lo; /* emptied below if need be */
        if (x.lo >= 0xD800) ps->ranges[r0 + i] = (range){1, 0};
        if (x.hi > 0xDFFF) add_range(ps, 0xE000, x.hi);
        if (ps->rc) return -1;
    }
    return mk(ps, (node){.k = N_SET, .r0 = r0, .nr = ps->n_ranges - r0});
}

static bool at_end(const parser *ps) { return ps->p >= ps->end; }

/* One UTF-8 character of the pattern, or -1 (malformed). */
static int32_t utf8_char(parser *ps) {
    uint32_t c;
    int n = pgd__utf8_decode(ps->p, (size_t)(ps->end - ps->p), &c);
    if (c & PGD_UNI_INVALID) return perr(ps, "the pattern is not valid UTF-8");
    ps->p += n;
    return (int32_t)c;
}

/* ASCII \d \w \s (upper case: their complements, applied by the caller). */
static void class_ranges(parser *ps, int c) {
    switch (c | 0x20) {
    case 'd': add_range(ps, '0', '9'); break;
    case 'w':
        add_range(ps, '0', '9');
        add_range(ps, 'A', 'Z');
        add_range(ps, '_', '_');
        add_range(ps, 'a', 'z');
        break;
    default: /* s */
        add_range(ps, '\t', '\r'); /* \t \n \v \f \r */
        add_range(ps, ' ', ' ');
    }
}

/* After a backslash: a code point (>= 0), or -2 for a class escape (\d \w \s and upper case,
 * returned in *cls), or -1 on error. in_class: "\b" is a backspace there. */
static int32_t escape(parser *ps, bool in_class, int *cls) {
    if (at_end(ps)) return perr(ps, "the pattern ends with a lone backslash");
    int c = *ps->p++;
    switch (c) {
    case 'd': case 'D': case 'w': case 'W': case 's': case 'S': *cls = c; return -2;
    case 'n': return '\n';
    case 't': return '\t';
    case 'r': return '\r';
    case 'f': return '\f';
    case 'v': return '\v';
    case 'a': return '\a';
    case '0':
        if (!at_end(ps) && *ps->p >= '0' && *ps->p <= '7')
            return perr(ps, "octal escapes are not supported");
        return 0;
    case 'x': case 'u': case 'U': {
        int n = c == 'x' ? 2 : c == 'u' ? 4 : 8;
        uint32_t v = 0;
        for (int i = 0; i < n; i++) {
            int h = at_end(ps) ? -1 : pgd_hex_digit(*ps->p);
            if (h < 0) return perr(ps, "\\%c needs %d hex digits", c, n);
            v = v << 4 | (uint32_t)h;
            ps->p++;
        }
        if (v > MAX_CP || (v >= 0xD800 && v <= 0xDFFF))
            return perr(ps, "\\%c escape of an invalid code point", c);
        return (int32_t)v;
    }
    case 'b':
        if (in_class) return '\b';
        return perr(ps, "word boundaries (\\b) are not supported");
    default:
        if (c >= '1' && c <= '9') return perr(ps, "backreferences are not supported");
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
            return perr(ps, "unsupported escape \\%c", c);
        if (c >= 0x80) {
            ps->p--;
            return utf8_char(ps);
        }
        return c; /* escaped punctuation */
    }
}

static int32_t parse_alt(parser *ps, int depth);

static int32_t parse_class(parser *ps) {
    bool negate = !at_end(ps) && *ps->p == '^';
    if (negate) ps->p++;
    int32_t r0 = ps->n_ranges;
    bool first = true;
    for (;;) {
        if (at_end(ps)) return perr(ps, "unterminated character class");
        if (*ps->p == ']' && !first) {
            ps->p++;
            break;
        }
        first = false;
        int32_t lo;
        int cls = 0;
        if (*ps->p == '\\') {
            ps->p++;
            lo = escape(ps, true, &cls);
        } else {
            lo = utf8_char(ps);
        }
        if (lo == -1) return -1;
        if (lo == -2) { /* \d inside a class; \D and friends: their complement */
            int32_t s0 = ps->n_ranges;
            class_ranges(ps, cls);
            if (cls >= 'A' && cls <= 'Z') {
                int32_t set = mk_set(ps, s0, true); /* complement, merged into this class */
                if (set < 0) return -1;
                ps->n_nodes--; /* only its ranges are kept */
            }
            continue;
        }
        uint32_t hi = (uint32_t)lo;
        if (ps->end - ps->p >= 2 && ps->p[0] == '-' && ps->p[1] != ']') {
            ps->p++;
            int32_t h;
            if (*ps->p == '\\') {
                ps->p++;
                h = escape(ps, true, &cls);
                if (h == -2) return perr(ps, "a class escape cannot end a range");
            } else {
                h = utf8_char(ps);
            }
            if (h < 0) return -1;
            if ((uint32_t)h < (uint32_t)lo) return perr(ps, "bad character range");
            hi = (uint32_t)h;
        }
        add_range(ps, (uint32_t)lo, hi);
    }
    return mk_set(ps, r0, negate);
}

static int32_t parse_atom(parser *ps, int depth) {
    int c = *ps->p;
    if (c == '(') {
        ps->p++;
        if (!at_end(ps) && *ps->p == '?') {
            if (ps->end - ps->p >= 2 && ps->p[1] == ':') ps->p += 2;
            else return perr(ps, "only (...) and (?:...) groups are supported");
        }
        int32_t n = parse_alt(ps, depth + 1);
        if (n < 0) return -1;
        if (at_end(ps) || *ps->p != ')') return perr(ps, "missing )");
        ps->p++;
        return n;
    }
    if (c == '[') {
        ps->p++;
        return parse_class(ps);
    }
    if (c == '.') {
        ps->p++;
        int32_t r0 = ps->n_ranges;
        add_range(ps, '\n', '\n');
        return mk_set(ps, r0, true);
    }
    if (c == '^' || c == '$') {
        /* anchors: only where they change nothing for a full match */
        bool ok = c == '^' ? ps->p == ps->start : ps->p + 1 == ps->end;
        if (!ok) return perr(ps, "'%c' is supported only at the %s of the pattern", c,
                             c == '^' ? "start" : "end");
        ps->p++;
        return mk(ps, (node){.k = N_EMPTY});
    }
    if (c == '*' || c == '+' || c == '?') return perr(ps, "nothing to repeat before '%c'", c);
    if (c == ')') return perr(ps, "unbalanced )");
    int32_t r0 = ps->n_ranges, cp;
    int cls = 0;
    if (c == '\\') {
        ps->p++;
        if (!at_end(ps) && (*ps->p == 'A' || *ps->p == 'Z')) {
            bool ok = *ps->p == 'A' ? ps->p - 1 == ps->start : ps->p + 1 == ps->end;
            if (!ok) return perr(ps, "\\%c is supported only at the %s of the pattern", *ps->p,
                                 *ps->p == 'A' ? "start" : "end");
            ps->p++;
            return mk(ps, (node){.k = N_EMPTY});
        }
        cp = escape(ps, false, &cls);
        if (cp == -2) {
            class_ranges(ps, cls);
            return mk_set(ps, r0, cls >= 'A' && cls <= 'Z');
        }
    } else {
        cp = utf8_char(ps);
    }
    if (cp < 0) return -1;
    add_range(ps, (uint32_t)cp, (uint32_t)cp);
    return mk_set(ps, r0, false);
}

/* "{n}", "{n,}" or "{n,m}" at p: true with the bounds (p past it); false: not a quantifier. */
static bool counted(parser *ps, int32_t *min, int32_t *max) {
    const unsigned char *s = ps->p + 1;
    long a = 0, b;
    bool lead = s < ps->end && *s >= '0' && *s <= '9';
    if (!lead && !(s < ps->end && *s == ','))
        return false; /* "{,n}" is {0,n} and "{,}" {0,}, as in Python; "{" and "{}" literal */
    for (; s < ps->end && *s >= '0' && *s <= '9'; s++)
        if (a <= MAX_REPEAT) a = a * 10 + (*s - '0'); /* past the limit: refused below */
    b = a;
    if (s < ps->end && *s == ',') {
        s++;
        b = -1;
        if (s < ps->end && *s >= '0' && *s <= '9') {
            b = 0;
            for (; s < ps->end && *s >= '0' && *s <= '9'; s++)
                if (b <= MAX_REPEAT) b = b * 10 + (*s - '0');
        }
    }
    if (s >= ps->end || *s != '}') return false;
    ps->p = s + 1;
    *min = (int32_t)(a > MAX_REPEAT ? MAX_REPEAT + 1 : a);
    *max = (int32_t)(b > MAX_REPEAT ? MAX_REPEAT + 1 : b);
    return true;
}

static int32_t parse_rep(parser *ps, int depth) {
    int32_t n = parse_atom(ps, depth);
    while (n >= 0 && !at_end(ps)) {
        int c = *ps->p;
        int32_t min, max;
        if (c == '*') min = 0, max = -1, ps->p++;
        else if (c == '+') min = 1, max = -1, ps->p++;
        else if (c == '?') min = 0, max = 1, ps->p++;
        else if (c == '{' && counted(ps, &min, &max)) {
            if (min > MAX_REPEAT || max > MAX_REPEAT)
                return perr(ps, "repeat counts above %d are not supported", MAX_REPEAT);
            if (max >= 0 && max < min) return perr(ps, "bad repeat range {%d,%d}", min, max);
        } else break;
        if (!at_end(ps) && *ps->p == '?') ps->p++; /* lazy: the same language */
        else if (!at_end(ps) && *ps->p == '+')
            return perr(ps, "possessive quantifiers are not supported");
        n = mk(ps, (node){.k = N_REP, .a = n, .min = min, .max = max});
    }
    return n;
}

static int32_t parse_cat(parser *ps, int depth) {
    int32_t n = -1;
    while (!ps->rc && !at_end(ps) && *ps->p != '|' && *ps->p != ')') {
        int32_t m = parse_rep(ps, depth);
        if (m < 0) return -1;
        n = n < 0 ? m : mk(ps, (node){.k = N_CAT, .a = n, .b = m});
    }
    return n < 0 ? mk(ps, (node){.k = N_EMPTY}) : n;
}

static int32_t parse_alt(parser *ps, int depth) {
    if (depth > 64) return perr(ps, "groups nested deeper than 64");
    int32_t n = parse_cat(ps, depth);
    while (n >= 0 && !at_end(ps) && *ps->p == '|') {
        ps->p++;
        int32_t m = parse_cat(ps, depth);
        if (m < 0) return -1;
        n = mk(ps, (node){.k = N_ALT, .a = n, .b = m});
    }
    return n;
}

/* ---- NFA (Thompson) ---- */

enum { S_BYTE, S_SPLIT, S_EPS, S_MATCH };

typedef struct nstate {
    uint8_t kind, lo, hi;
    int32_t out, out1;    /* -1: none; while dangling, the next dangling slot's code */
} nstate;

typedef struct frag {
    int32_t start, out;   /* out: the first dangling slot's code (state * 2 + which), or -1 */
} frag;

typedef struct nfa {
    nstate *s;
    int32_t n, cap;
    parser *ps;
} nfa;

static int32_t nadd(nfa *a, nstate st) {
    if (a->ps->rc) return -1;
    if (a->n >= PGD_REGEX_MAX_NFA)
        return perr(a->ps, "the pattern is too large (its automaton passes %d states)",
                    PGD_REGEX_MAX_NFA);
    if (pgd_grow_i32(&a->s, a->n, &a->cap, 256, sizeof *a->s)) return oom(a->ps);
    a->s[a->n] = st;
    return a->n++;
}

static int32_t *slot(nfa *a, int32_t code) {
    return code & 1 ? &a->s[code >> 1].out1 : &a->s[code >> 1].out;
}

static void patch(nfa *a, int32_t list, int32_t target) {
    while (list >= 0) {
        int32_t *sl = slot(a, list);
        list = *sl;
        *sl = target;
    }
}

static int32_t append(nfa *a, int32_t l1, int32_t l2) {
    if (l1 < 0) return l2;
    int32_t last = l1;
    for (int32_t nx; (nx = *slot(a, last)) >= 0;) last = nx;
    *slot(a, last) = l2;
    return l1;
}

/* A chain of byte ranges lo[i]..hi[i] (i < n), as an alternative of the fragment f being built:
 * f->start is a SPLIT chain, f->out the dangling ends. */
static void add_seq(nfa *a, frag *f, const uint8_t *lo, const uint8_t *hi, int n) {
    int32_t first = -1, prev = -1;
    for (int i = 0; i < n; i++) {
        int32_t st = nadd(a, (nstate){.kind = S_BYTE, .lo = lo[i], .hi = hi[i], .out = -1,
                                      .out1 = -1});
        if (st < 0) return;
        if (prev >= 0) a->s[prev].out = st;
        else first = st;
        prev = st;
    }
    a->s[prev].out = f->out; /* dangling */
    f->out = prev * 2;
    if (f->start < 0) {
        f->start = first;
        return;
    }
    int32_t sp = nadd(a, (nstate){.kind = S_SPLIT, .out = first, .out1 = f->start});
    if (sp >= 0) f->start = sp;
}

/* The code points lo..hi as byte-range sequences (split until each position's bytes range
 * freely: the standard UTF-8 range decomposition). */
static void add_cp_range(nfa *a, frag *f, uint32_t lo, uint32_t hi) {
    static const uint32_t bound[] = {0x7F, 0x7FF, 0xFFFF};
    for (int i = 0; i < 3; i++)
        if (lo <= bound[i] && hi > bound[i]) {
            add_cp_range(a, f, lo, bound[i]);
            add_cp_range(a, f, bound[i] + 1, hi);
            return;
        }
    char bl[4], bh[4];
    int n = pgd__utf8_encode(lo, bl);
    for (int i = 1; i < n; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if (lo & m) {
                add_cp_range(a, f, lo, lo | m);
                add_cp_range(a, f, (lo | m) + 1, hi);
                return;
            }
            if ((hi & m) != m) {
                add_cp_range(a, f, lo, (hi & ~m) - 1);
                add_cp_range(a, f, hi & ~m, hi);
                return;
            }
        }
    }
    pgd__utf8_encode(hi, bh);
    add_seq(a, f, (const uint8_t *)bl, (const uint8_t *)bh, n);
}

/* The left spine of a CAT or ALT chain (nested to the left as the parser builds them), in order:
 * emitted by a loop, so a long pattern does not recurse once per character. */
static int32_t spine(const parser *ps, int32_t ni, nkind k, int32_t *out, int32_t cap) {
    int32_t n = 0;
    for (int32_t x = ni; ps->nodes[x].k == k; x = ps->nodes[x].a) n++;
    if (n + 1 > cap) return n + 1;
    int32_t x = ni;
    for (int32_t i = n; i > 0; i--, x = ps->nodes[x].a) out[i] = ps->nodes[x].b;
    out[0] = x;
    return n + 1;
}

static frag emit(nfa *a, int32_t ni);

static frag emit_chain(nfa *a, int32_t ni, nkind k) {
    frag f = {-1, -1};
    int32_t buf[64] = {0}, *items = buf, n = spine(a->ps, ni, k, buf, 64);
    if (n > 64) {
        if (!(items = calloc((size_t)n, sizeof *items))) {
            oom(a->ps);
            return f;
        }
        spine(a->ps, ni, k, items, n);
    }
    f = emit(a, items[0]);
    for (int32_t i = 1; i < n && !a->ps->rc; i++) {
        frag y = emit(a, items[i]);
        if (a->ps->rc) break;
        if (k == N_CAT) {
            patch(a, f.out, y.start);
            f.out = y.out;
        } else {
            int32_t sp = nadd(a, (nstate){.kind = S_SPLIT, .out = f.start, .out1 = y.start});
            if (sp < 0) break;
            f = (frag){sp, append(a, f.out, y.out)};
        }
    }
    if (items != buf) free(items);
    return f;
}

static frag emit(nfa *a, int32_t ni) {
    frag f = {-1, -1};
    if (a->ps->rc) return f;
    node nd = a->ps->nodes[ni];
    switch (nd.k) {
    case N_SET:
        for (int32_t i = 0; i < nd.nr && !a->ps->rc; i++) {
            range r = a->ps->ranges[nd.r0 + i];
            if (r.lo <= r.hi) add_cp_range(a, &f, r.lo, r.hi);
        }
        if (f.start < 0 && !a->ps->rc) { /* an empty set: a byte range no byte is in */
            f.start = nadd(a, (nstate){.kind = S_BYTE, .lo = 1, .hi = 0, .out = -1, .out1 = -1});
            f.out = f.start * 2;
        }
        return f;
    case N_EMPTY:
        f.start = nadd(a, (nstate){.kind = S_EPS, .out = -1, .out1 = -1});
        f.out = f.start * 2;
        return f;
    case N_CAT:
    case N_ALT:
        return emit_chain(a, ni, nd.k);
    case N_REP: {
        /* min copies, then a star or max - min optional copies */
        int32_t e = nadd(a, (nstate){.kind = S_EPS, .out = -1, .out1 = -1});
        f = (frag){e, e * 2};
        for (int32_t i = 0; i < nd.min && !a->ps->rc; i++) {
            frag x = emit(a, nd.a);
            patch(a, f.out, x.start);
            f.out = x.out;
        }
        if (nd.max < 0) { /* a star: loop back */
            frag x = emit(a, nd.a);
            int32_t sp = nadd(a, (nstate){.kind = S_SPLIT, .out = x.start, .out1 = -1});
            if (sp < 0) return f;
            patch(a, f.out, sp);
            patch(a, x.out, sp);
            f.out = sp * 2 + 1;
            return f;
        }
        /* max - min optional copies nested, (x(x(x)?)?)?, rather than x?x?x?: the same
         * language, but after k copies the NFA is at one place, not at any of k (so the DFA's
         * sets stay small: [^\n]{0,200} compiles 80x faster) */
        int32_t exits = -1;
        for (int32_t i = 0; i < nd.max - nd.min && !a->ps->rc; i++) {
            frag x = emit(a, nd.a);
            int32_t sp = nadd(a, (nstate){.kind = S_SPLIT, .out = x.start, .out1 = -1});
            if (sp < 0) break;
            patch(a, f.out, sp);
            exits = append(a, exits, sp * 2 + 1);
            f.out = x.out;
        }
        f.out = append(a, exits, f.out);
        return f;
    }
    }
    return f;
}

/* ---- DFA (subset construction) ---- */

typedef struct dfa {
    nfa *a;
    int32_t *mark;         /* (a->n) closure generation per NFA state */
    int32_t gen;
    int32_t *stack;        /* (a->n) DFS scratch */
    int32_t *tmp;          /* (a->n) a closure being built */
    int32_t *pool;         /* every DFA state's NFA set, back to back */
    size_t n_pool, cap_pool;
    int32_t *off, *len;    /* (n_states) each set in pool */
    int32_t *table;        /* hash of sets -> DFA state, (ht_size) */
    uint32_t ht_size;
    pgd_regex *re;
    int32_t cap_states;
    int64_t work;          /* NFA states visited, sorted and compared so far (the budget) */
} dfa;

static uint32_t hash_set(const int32_t *s, int32_t n) {
    uint32_t h = 2166136261u;
    for (int32_t i = 0; i < n; i++) h = (h ^ (uint32_t)s[i]) * 16777619u;
    return h;
}

static int cmp_i32(const void *x, const void *y) {
    int32_t a = *(const int32_t *)x, b = *(const int32_t *)y;
    return (a > b) - (a < b);
}

/* The epsilon closure of starts[0..n): its BYTE and MATCH states, sorted, into d->tmp. */
static int32_t closure(dfa *d, const int32_t *starts, int32_t n) {
    nfa *a = d->a;
    int32_t sp = 0, k = 0;
    d->gen++;
    for (int32_t i = 0; i < n; i++)
        if (starts[i] >= 0 && d->mark[starts[i]] != d->gen) {
            d->mark[starts[i]] = d->gen;
            d->stack[sp++] = starts[i];
        }
    while (sp > 0) {
        int32_t x = d->stack[--sp];
        const nstate *st = &a->s[x];
        if (st->kind == S_BYTE || st->kind == S_MATCH) {
            d->tmp[k++] = x;
            continue;
        }
        int32_t nx[2] = {st->out, st->kind == S_SPLIT ? st->out1 : -1};
        for (int j = 0; j < 2; j++)
            if (nx[j] >= 0 && d->mark[nx[j]] != d->gen) {
                d->mark[nx[j]] = d->gen;
                d->stack[sp++] = nx[j];
            }
    }
    qsort(d->tmp, (size_t)k, sizeof *d->tmp, cmp_i32);
    int lg = 1;
    while ((1 << lg) < k) lg++;
    d->work += n + (int64_t)k * lg;
    return k;
}

/* The DFA state of set d->tmp[0..k): found, or added; -1 past the limit or out of memory. */
static int32_t state_of(dfa *d, int32_t k) {
    uint32_t h = hash_set(d->tmp, k) & (d->ht_size - 1);
    for (;; h = (h + 1) & (d->ht_size - 1)) {
        int32_t id = d->table[h];
        if (id < 0) break;
        if (d->len[id] == k && !memcmp(d->pool + d->off[id], d->tmp, (size_t)k * sizeof *d->tmp))
            return id;
    }
    pgd_regex *re = d->re;
    if (re->n_states >= PGD_REGEX_MAX_DFA ||
        (int64_t)(re->n_states + 1) * re->n_cls > PGD_REGEX_MAX_TABLE)
        return perr(d->a->ps, "the pattern is too complex (its DFA passes %d states or %d "
                    "transitions)", PGD_REGEX_MAX_DFA, PGD_REGEX_MAX_TABLE);
    if (re->n_states == d->cap_states) {
        int32_t nc = d->cap_states ? d->cap_states * 2 : 64;
        int32_t *nx = realloc(re->next, (size_t)nc * (size_t)re->n_cls * sizeof *nx);
        if (nx) re->next = nx;
        uint8_t *ac = nx ? realloc(re->accept, (size_t)nc) : NULL;
        if (ac) re->accept = ac;
        int32_t *of = ac ? realloc(d->off, (size_t)nc * sizeof *of) : NULL;
        if (of) d->off = of;
        int32_t *ln = of ? realloc(d->len, (size_t)nc * sizeof *ln) : NULL;
        if (!ln) return oom(d->a->ps);
        d->len = ln;
        d->cap_states = nc;
    }
    if (d->n_pool + (size_t)k > d->cap_pool) {
        size_t nc = (d->n_pool + (size_t)k) * 2;
        int32_t *np = realloc(d->pool, nc * sizeof *np);
        if (!np) return oom(d->a->ps);
        d->pool = np;
        d->cap_pool = nc;
    }
    int32_t id = re->n_states++;
    memcpy(d->pool + d->n_pool, d->tmp, (size_t)k * sizeof *d->tmp);
    d->off[id] = (int32_t)d->n_pool;
    d->len[id] = k;
    d->n_pool += (size_t)k;
    re->accept[id] = 0;
    for (int32_t i = 0; i < k; i++) re->accept[id] |= d->a->s[d->tmp[i]].kind == S_MATCH;
    d->table[h] = id;
    d->work += k;
    return id;
}

static int char_cost(uint8_t b) { return (b & 0xC0) != 0x80; } /* a lead byte starts one */

/* Reversed edges (one per state and byte class), grouped by target: src[cnt[t] .. cnt[t + 1])
 * are the states with an edge into t, each with the byte class's representative byte. */
typedef struct redges {
    int32_t *cnt, *src;
    uint8_t *byte;
} redges;

static int reverse_edges(const pgd_regex *re, const uint8_t *rep, redges *r) {
    int n_rep = re->n_cls;
    int32_t n = re->n_states;
    size_t n_edges = 0;
    r->cnt = calloc((size_t)n + 1, sizeof *r->cnt);
    if (!r->cnt) return PGD_ENOMEM;
    for (int32_t s = 0; s < n; s++)
        for (int c = 0; c < n_rep; c++) {
            int32_t t = re->next[(size_t)s * n_rep + c];
            if (t >= 0) r->cnt[t + 1]++, n_edges++;
        }
    for (int32_t t = 0; t < n; t++) r->cnt[t + 1] += r->cnt[t];
    r->src = malloc((n_edges ? n_edges : 1) * sizeof *r->src);
    r->byte = malloc(n_edges ? n_edges : 1);
    if (!r->src || !r->byte) return PGD_ENOMEM;
    for (int32_t s = 0; s < n; s++)
        for (int c = 0; c < n_rep; c++) {
            int32_t t = re->next[(size_t)s * n_rep + c];
            if (t < 0) continue;
            r->byte[r->cnt[t]] = rep[c];
            r->src[r->cnt[t]++] = s;
        }
    for (int32_t t = n; t > 0; t--) r->cnt[t] = r->cnt[t - 1]; /* back to starts */
    r->cnt[0] = 0;
    return PGD_OK;
}

static void redges_free(redges *r) {
    free(r->cnt);
    free(r->src);
    free(r->byte);
}

/* States from which a match can be reached (BFS over reversed edges from the accepting ones);
 * every edge into another becomes -1. */
static int prune(pgd_regex *re, const uint8_t *rep) {
    int32_t n = re->n_states;
    redges r = {0};
    int32_t *q = malloc((size_t)n * sizeof *q);
    uint8_t *live = calloc((size_t)n, 1);
    int rc = PGD_ENOMEM;
    if (!q || !live || reverse_edges(re, rep, &r)) goto done;
    int32_t qh = 0, qt = 0;
    for (int32_t s = 0; s < n; s++)
        if (re->accept[s]) live[s] = 1, q[qt++] = s;
    while (qh < qt) {
        int32_t t = q[qh++];
        for (int32_t i = r.cnt[t]; i < r.cnt[t + 1]; i++)
            if (!live[r.src[i]]) live[r.src[i]] = 1, q[qt++] = r.src[i];
    }
    re->extend = calloc((size_t)n, 1);
    if (!re->extend) goto done;
    for (int32_t s = 0; s < n; s++)
        for (int c = 0; c < re->n_cls; c++) {
            int32_t *t = &re->next[(size_t)s * re->n_cls + c];
            if (*t >= 0 && !live[*t]) *t = -1;
            if (*t >= 0) re->extend[s] = 1;
        }
    rc = live[0] ? PGD_OK : PGD_EINVAL;
done:
    redges_free(&r);
    free(q);
    free(live);
    return rc;
}

/* lmin (fewest characters to a match: a 0-1 BFS over reversed edges, a lead byte costing 1),
 * unbounded and lmax (Kahn's order over the forward edges: a state whose successors all leave
 * that order has a longest way, the rest reach a loop), after prune. */
static int lengths(pgd_regex *re, const uint8_t *rep) {
    int32_t n = re->n_states;
    redges r = {0};
    int32_t *dq = malloc((size_t)n * sizeof *dq), *outdeg = calloc((size_t)n, sizeof *outdeg);
    uint32_t *dist = malloc((size_t)n * sizeof *dist);
    re->lmin = malloc((size_t)n * sizeof *re->lmin);
    re->lmax = calloc((size_t)n, sizeof *re->lmax);
    re->unbounded = malloc((size_t)n);
    int rc = PGD_ENOMEM;
    if (!dq || !outdeg || !dist || !re->lmin || !re->lmax || !re->unbounded ||
        reverse_edges(re, rep, &r))
        goto done;
    /* shortest paths (costs 0 and 1) by a FIFO worklist in a ring of n, each state in it at
     * most once at a time (the queue then never holds more than n) */
    uint8_t *inq = calloc((size_t)n, 1);
    if (!inq) goto done;
    int32_t head = 0, len = 0;
    for (int32_t s = 0; s < n; s++) {
        dist[s] = re->accept[s] ? 0 : UINT32_MAX;
        if (re->accept[s]) dq[(head + len++) % n] = s, inq[s] = 1;
    }
    while (len > 0) {
        int32_t t = dq[head];
        head = (head + 1) % n;
        len--;
        inq[t] = 0;
        for (int32_t i = r.cnt[t]; i < r.cnt[t + 1]; i++) {
            uint32_t d = dist[t] + (uint32_t)char_cost(r.byte[i]);
            int32_t s = r.src[i];
            if (d >= dist[s]) continue;
            dist[s] = d;
            if (!inq[s]) dq[(head + len++) % n] = s, inq[s] = 1;
        }
    }
    free(inq);
    for (int32_t s = 0; s < n; s++) re->lmin[s] = (uint16_t)(dist[s] > 65535 ? 65535 : dist[s]);
    /* Kahn: the states whose successors are all settled, last first */
    for (int32_t t = 0; t < n; t++)
        for (int32_t i = r.cnt[t]; i < r.cnt[t + 1]; i++) outdeg[r.src[i]]++;
    int32_t qt = 0;
    for (int32_t s = 0; s < n; s++) {
        re->unbounded[s] = 1;
        if (!outdeg[s]) dq[qt++] = s;
    }
    for (int32_t qh = 0; qh < qt; qh++) {
        int32_t s = dq[qh];
        re->unbounded[s] = 0;
        uint32_t best = 0; /* live: a match is reachable, so accept or a successor's way */
        for (int c = 0; c < re->n_cls; c++) {
            int32_t t = re->next[(size_t)s * re->n_cls + c];
            if (t < 0) continue;
            uint32_t l = re->lmax[t] + (uint32_t)char_cost(rep[c]);
            if (l > best) best = l;
        }
        re->lmax[s] = (uint16_t)(best > 65535 ? 65535 : best);
        for (int32_t i = r.cnt[s]; i < r.cnt[s + 1]; i++)
            if (--outdeg[r.src[i]] == 0) dq[qt++] = r.src[i];
    }
    rc = PGD_OK;
done:
    redges_free(&r);
    free(dq);
    free(outdeg);
    free(dist);
    return rc;
}

static int build_dfa(dfa *d, int32_t start) {
    nfa *a = d->a;
    /* byte classes: bytes no NFA edge tells apart share one representative */
    uint8_t cut[257] = {0}, cls_of[256], rep[256];
    int n_rep = 0;
    for (int32_t i = 0; i < a->n; i++)
        if (a->s[i].kind == S_BYTE && a->s[i].lo <= a->s[i].hi) {
            cut[a->s[i].lo] = 1;
            cut[a->s[i].hi + 1] = 1;
        }
    for (int b = 0; b < 256; b++) {
        if (b == 0 || cut[b]) rep[n_rep++] = (uint8_t)b;
        cls_of[b] = (uint8_t)(n_rep - 1);
    }
    memcpy(d->re->cls, cls_of, sizeof cls_of);
    d->re->n_cls = n_rep;
    int32_t k = closure(d, &start, 1);
    if (state_of(d, k) < 0) return -1;
    /* each state's transitions in one pass over its set: every byte state's target goes to the
     * bucket of each class its range covers (bucket c: items[at[c] .. at[c + 1])) */
    int32_t *at = malloc((size_t)(n_rep + 1) * sizeof *at), *items = NULL;
    size_t cap_items = 0;
    if (!at) return oom(a->ps);
    for (int32_t s = 0; s < d->re->n_states && !a->ps->rc; s++) {
        int32_t off = d->off[s], len = d->len[s];
        memset(at, 0, (size_t)(n_rep + 1) * sizeof *at);
        size_t total = 0;
        for (int32_t i = 0; i < len; i++) {
            const nstate *st = &a->s[d->pool[off + i]];
            if (st->kind != S_BYTE || st->lo > st->hi) continue;
            for (int c = cls_of[st->lo]; c <= cls_of[st->hi]; c++) at[c + 1]++, total++;
        }
        d->work += len + (int64_t)total;
        if (total > cap_items) {
            int32_t *ni = realloc(items, total * 2 * sizeof *ni);
            if (!ni) {
                oom(a->ps);
                break;
            }
            items = ni;
            cap_items = total * 2;
        }
        for (int c = 0; c < n_rep; c++) at[c + 1] += at[c];
        for (int32_t i = 0; i < len; i++) { /* at[c] moves to the end of bucket c */
            const nstate *st = &a->s[d->pool[off + i]];
            if (st->kind != S_BYTE || st->lo > st->hi) continue;
            for (int c = cls_of[st->lo]; c <= cls_of[st->hi]; c++) items[at[c]++] = st->out;
        }
        for (int c = 0; c < n_rep && !a->ps->rc; c++) {
            int32_t b0 = c ? at[c - 1] : 0, ns = at[c] - b0;
            int32_t kk = ns ? closure(d, items + b0, ns) : 0;
            int32_t t = kk ? state_of(d, kk) : -1;
            d->re->next[(size_t)s * n_rep + c] = t; /* (state_of may move next: index again) */
        }
        if (d->work > PGD_REGEX_MAX_WORK)
            perr(a->ps, "the pattern is too complex (its DFA takes too long to build)");
    }
    free(at);
    free(items);
    if (a->ps->rc) return -1;
    int rc = prune(d->re, rep);
    if (rc == PGD_ENOMEM) return oom(a->ps);
    if (rc) return perr(a->ps, "the pattern matches no string");
    if (lengths(d->re, rep)) return oom(a->ps);
    return 0;
}

int pgd_regex_compile(const char *pattern, size_t len, pgd_regex *out, char *msg,
                      size_t msg_len) {
    memset(out, 0, sizeof *out);
    parser ps = {.p = (const unsigned char *)pattern, .start = (const unsigned char *)pattern,
                 .end = (const unsigned char *)pattern + len, .msg = msg, .msg_len = msg_len};
    if (msg_len) msg[0] = 0;
    if (len > PGD_REGEX_MAX_LEN) {
        snprintf(msg, msg_len, "the pattern is longer than %d bytes", PGD_REGEX_MAX_LEN);
        return PGD_EINVAL;
    }
    int32_t root = parse_alt(&ps, 0);
    if (root >= 0 && !at_end(&ps)) root = perr(&ps, "unbalanced )");
    nfa a = {.ps = &ps};
    dfa d = {.a = &a, .re = out};
    if (root >= 0) {
        frag f = emit(&a, root);
        int32_t m = nadd(&a, (nstate){.kind = S_MATCH, .out = -1, .out1 = -1});
        if (!ps.rc) {
            patch(&a, f.out, m);
            d.mark = calloc((size_t)a.n, sizeof *d.mark);
            d.stack = malloc((size_t)a.n * sizeof *d.stack);
            d.tmp = malloc((size_t)a.n * sizeof *d.tmp);
            d.ht_size = 2 * PGD_REGEX_MAX_DFA * 2;
            d.table = malloc(d.ht_size * sizeof *d.table);
            if (!d.mark || !d.stack || !d.tmp || !d.table) oom(&ps);
            else {
                memset(d.table, 0xFF, d.ht_size * sizeof *d.table);
                build_dfa(&d, f.start);
                out->work = d.work;
            }
        }
    }
    free(d.mark);
    free(d.stack);
    free(d.tmp);
    free(d.table);
    free(d.pool);
    free(d.off);
    free(d.len);
    free(a.s);
    free(ps.nodes);
    free(ps.ranges);
    if (ps.rc) pgd_regex_free(out);
    return ps.rc;
}

int pgd_regex_length_sets(pgd_regex *re, int32_t cap) {
    int32_t n = re->n_states, w = cap / 64 + 1;
    uint8_t rep[256];
    for (int b = 255; b >= 0; b--) rep[re->cls[b]] = (uint8_t)b; /* each class's first byte */
    redges r = {0};
    uint64_t *lens = NULL;
    int32_t *q = NULL;
    uint8_t *inq = NULL;
    int rc = PGD_ENOMEM;
    if (reverse_edges(re, rep, &r)) goto done;
    /* the budget first (edges x lengths x words, as a double: it can pass 2^63), then the sets */
    if ((double)r.cnt[n] * ((double)cap + 1) * (double)w > PGD_REGEX_MAX_WORK) {
        rc = PGD_ERANGE;
        goto done;
    }
    lens = calloc((size_t)n * (size_t)w, sizeof *lens);
    q = malloc((size_t)n * sizeof *q);
    inq = calloc((size_t)n, 1);
    if (!lens || !q || !inq) goto done;
    /* a worklist: a state whose set grew passes it on, shifted by the edge's cost, to the
     * states with an edge into it (sets only grow, so it ends) */
    int32_t head = 0, len = 0;
    for (int32_t s = 0; s < n; s++)
        if (re->accept[s]) lens[(size_t)s * w] = 1, q[(head + len++) % n] = s, inq[s] = 1;
    while (len > 0) {
        int32_t t = q[head];
        head = (head + 1) % n;
        len--;
        inq[t] = 0;
        const uint64_t *lt = lens + (size_t)t * w;
        for (int32_t i = r.cnt[t]; i < r.cnt[t + 1]; i++) {
            int32_t s = r.src[i];
            uint64_t *ls = lens + (size_t)s * w, grew = 0;
            int shift = char_cost(r.byte[i]);
            for (int32_t k = 0; k < w; k++) {
                uint64_t v = shift ? lt[k] << 1 | (k ? lt[k - 1] >> 63 : 0) : lt[k];
                if (k == w - 1 && (cap + 1) % 64) v &= (1ull << ((cap + 1) % 64)) - 1;
                grew |= v & ~ls[k];
                ls[k] |= v;
            }
            if (grew && !inq[s]) q[(head + len++) % n] = s, inq[s] = 1;
        }
    }
    re->lens = lens;
    re->len_words = w;
    re->len_cap = cap;
    lens = NULL;
    rc = PGD_OK;
done:
    redges_free(&r);
    free(lens);
    free(q);
    free(inq);
    return rc;
}

static void *dup_bytes(const void *p, size_t n, bool *ok) {
    if (!p) return NULL;
    void *d = malloc(n ? n : 1);
    if (!d) {
        *ok = false;
        return NULL;
    }
    memcpy(d, p, n);
    return d;
}

int pgd_regex_copy(pgd_regex *dst, const pgd_regex *src) {
    size_t n = (size_t)src->n_states;
    bool ok = true;
    *dst = *src;
    dst->next = dup_bytes(src->next, n * (size_t)src->n_cls * sizeof *src->next, &ok);
    dst->accept = dup_bytes(src->accept, n, &ok);
    dst->extend = dup_bytes(src->extend, n, &ok);
    dst->lmin = dup_bytes(src->lmin, n * sizeof *src->lmin, &ok);
    dst->lmax = dup_bytes(src->lmax, n * sizeof *src->lmax, &ok);
    dst->unbounded = dup_bytes(src->unbounded, n, &ok);
    dst->lens = dup_bytes(src->lens, n * (size_t)src->len_words * sizeof *src->lens, &ok);
    if (ok) return PGD_OK;
    pgd_regex_free(dst);
    return PGD_ENOMEM;
}

void pgd_regex_free(pgd_regex *re) {
    free(re->next);
    free(re->accept);
    free(re->extend);
    free(re->lmin);
    free(re->lmax);
    free(re->unbounded);
    free(re->lens);
    memset(re, 0, sizeof *re);
}

int32_t pgd_regex_feed(const pgd_regex *re, int32_t q, const char *s, size_t n) {
    for (size_t i = 0; i < n && q >= 0; i++) q = pgd_regex_next(re, q, (uint8_t)s[i]);
    return q;
}
