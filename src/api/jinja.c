/* The Jinja interpreter for chat templates (see jinja.h): a lexer that reproduces jinja2's
 * whitespace rules (trim_blocks, lstrip_blocks, -/+ markers), a recursive-descent parser into an
 * AST the template owns, and a tree-walking evaluator over refcounted Python-like values.
 *
 * Errors inside parse and render unwind with longjmp to the API function: an interpreter raises
 * from hundreds of places, and threading a status through every expression would triple the
 * code. It stays leak-free because every heap object of a render is on one intrusive list that
 * the API function frees after the jump (the parser likewise owns everything in its arena).
 *
 * Not supported (a clear parse or render error): include/import/extends, call blocks, recursive
 * loops, *args and **kwargs, macro varargs/kwargs/caller, loop.changed, the filters batch, slice,
 * groupby, urlize, xmlattr, wordwrap, striptags, random, and tojson(ensure_ascii=True). Case
 * mapping covers Latin, Greek and Cyrillic; JSON numbers that are integral become ints. */
#include "api/jinja.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/unicode.h"

#define MAX_SRC         (16u << 20) /* template source bytes */
#define MAX_PARSE_DEPTH 256         /* AST depth the parser builds (bounds every recursion) */
#define MAX_VALUE_DEPTH 200         /* nesting of lists/dicts (context and template-built) */
#define MAX_ARGS        16          /* positional (and separately keyword) arguments of a call */
#define MAX_RANGE       10000000    /* elements range() may produce */

#define DEF_MAX_OUTPUT     (16u << 20)
#define DEF_MAX_MEMORY     (256u << 20)
#define DEF_MAX_STEPS      50000000u
#define DEF_MAX_CALL_DEPTH 32

/* ================================================================================ values == */

typedef enum {
    T_UNDEF, /* jinja2's default Undefined: prints "", iterates empty, fails on use */
    T_NONE,
    T_BOOL,
    T_INT,
    T_FLOAT,
    T_STR,
    T_LIST, /* list or tuple (jlist.tuple) */
    T_DICT,
    T_NS,    /* namespace(): a dict with identity that `set ns.x = ...` mutates */
    T_LOOP,  /* the loop variable of a for */
    T_MACRO, /* a {% macro %}: points at its AST node */
    T_FUNC,  /* a builtin global function (raise_exception, range, ...) */
} vtype;

enum { K_STR, K_LIST, K_DICT, K_LOOP, K_SB };

/* Header of every heap object of a render. rc < 0: immortal (owned by the template's arena,
 * shared by concurrent renders and therefore never written). */
typedef struct jobj {
    struct jobj *prev, *next; /* the render's list of live objects */
    int32_t rc;
    uint8_t kind;
    size_t bytes; /* accounted against max_memory */
} jobj;

typedef struct jstr {
    jobj h;
    size_t len;
    char s[]; /* (len + 1) bytes, NUL-terminated; any bytes (UTF-8 expected) */
} jstr;

struct jlist;
struct jdict;
struct jloop;
struct node;

typedef struct jv {
    uint8_t t; /* vtype */
    union {
        bool b;
        int64_t i;
        double f;
        jstr *s;
        struct jlist *l;
        struct jdict *d; /* T_DICT, T_NS */
        struct jloop *lp;
        const struct node *m; /* T_MACRO */
        int fn;               /* T_FUNC */
        const char *hint;     /* T_UNDEF: the name that was missing (NUL-terminated) or NULL */
    } u;
} jv;

typedef struct jlist {
    jobj h;
    size_t n, cap;
    jv *v; /* (cap) */
    int depth;
    bool tuple;
} jlist;

typedef struct jdict {
    jobj h;
    size_t n, cap;
    jv *k, *v;      /* (cap) keys and values in insertion order */
    uint32_t *hidx; /* (hcap) open-addressing index of string keys: entry+1, 0 = empty */
    size_t hcap;
    int depth;
} jdict;

typedef struct jloop {
    jobj h;
    jlist *items; /* the (filtered) sequence iterated; owned reference */
    int64_t index0;
    int depth0;
} jloop;

/* A string builder (output buffers, joins); p is a separate allocation so growing it never
 * moves the object. */
typedef struct sb {
    jobj h;
    char *p; /* (cap) */
    size_t n, cap;
} sb;

enum { F_RAISE, F_RANGE, F_NAMESPACE, F_STRFTIME, F_DICT };

typedef struct frame {
    struct frame *parent;
    struct jdict *vars;
} frame;

typedef struct R {
    jmp_buf jb;
    pgd_err *err;
    jobj *objs; /* every live heap object */
    size_t mem, max_mem, max_out;
    uint64_t steps, max_steps;
    int call_depth, max_call_depth, loop_depth;
    int line;   /* line of the node being evaluated, for messages */
    sb *out;    /* where output goes now */
    frame *fr;  /* innermost scope */
    frame *top; /* template-level scope (macros resolve free names here) */
    int ctl;    /* CTL_BREAK / CTL_CONTINUE pending */
    time_t now;
} R;

enum { CTL_NONE, CTL_BREAK, CTL_CONTINUE };

static _Noreturn void failv(R *r, int code, bool with_line, const char *fmt, va_list ap) {
    if (r->err) {
        char msg[sizeof r->err->msg];
        vsnprintf(msg, sizeof msg, fmt, ap);
        if (with_line && r->line > 0)
            pgd_err_set(r->err, code, "line %d: %s", r->line, msg);
        else
            pgd_err_set(r->err, code, "%s", msg);
    }
    longjmp(r->jb, code);
}

static _Noreturn __attribute__((format(printf, 3, 4))) void fail(R *r, int code, const char *fmt,
                                                                 ...) {
    va_list ap;
    va_start(ap, fmt);
    failv(r, code, true, fmt, ap);
}

#define TYPE_ERR(r, ...) fail(r, PGD_EINVAL, __VA_ARGS__)

static void step(R *r) {
    if (++r->steps > r->max_steps)
        fail(r, PGD_ERANGE, "template exceeded %llu evaluation steps",
             (unsigned long long)r->max_steps);
}

static void account(R *r, size_t add) {
    if (add > r->max_mem - r->mem)
        fail(r, PGD_ERANGE, "template needs more than %zu bytes of memory", r->max_mem);
    r->mem += add;
}

static void *obj_new(R *r, uint8_t kind, size_t bytes) {
    account(r, bytes);
    jobj *o = malloc(bytes);
    if (!o) {
        r->mem -= bytes;
        fail(r, PGD_ENOMEM, "out of memory");
    }
    o->rc = 1;
    o->kind = kind;
    o->bytes = bytes;
    o->prev = NULL;
    o->next = r->objs;
    if (r->objs) r->objs->prev = o;
    r->objs = o;
    return o;
}

/* Frees o and the arrays it owns, without touching the objects it references. */
static void obj_destroy(R *r, jobj *o) {
    if (o->prev)
        o->prev->next = o->next;
    else
        r->objs = o->next;
    if (o->next) o->next->prev = o->prev;
    r->mem -= o->bytes;
    switch (o->kind) {
    case K_LIST: free(((jlist *)o)->v); break;
    case K_DICT:
        free(((jdict *)o)->k);
        free(((jdict *)o)->v);
        free(((jdict *)o)->hidx);
        break;
    case K_SB: free(((sb *)o)->p); break;
    default: break;
    }
    free(o);
}

static jobj *jv_obj(jv v) {
    switch (v.t) {
    case T_STR: return &v.u.s->h;
    case T_LIST: return &v.u.l->h;
    case T_DICT:
    case T_NS: return &v.u.d->h;
    case T_LOOP: return &v.u.lp->h;
    default: return NULL;
    }
}

static jv ref(jv v) {
    jobj *o = jv_obj(v);
    if (o && o->rc >= 0) o->rc++;
    return v;
}

static void unref(R *r, jv v);

static void obj_unref(R *r, jobj *o) {
    if (o->rc < 0 || --o->rc > 0) return;
    switch (o->kind) {
    case K_LIST: {
        jlist *l = (jlist *)o;
        for (size_t i = 0; i < l->n; i++) unref(r, l->v[i]);
        break;
    }
    case K_DICT: {
        jdict *d = (jdict *)o;
        for (size_t i = 0; i < d->n; i++) {
            unref(r, d->k[i]);
            unref(r, d->v[i]);
        }
        break;
    }
    case K_LOOP: obj_unref(r, &((jloop *)o)->items->h); break;
    default: break;
    }
    obj_destroy(r, o);
}

static void unref(R *r, jv v) {
    jobj *o = jv_obj(v);
    if (o) obj_unref(r, o);
}

static jv v_undef(const char *hint) { return (jv){.t = T_UNDEF, .u.hint = hint}; }
static jv v_none(void) { return (jv){.t = T_NONE}; }
static jv v_bool(bool b) { return (jv){.t = T_BOOL, .u.b = b}; }
static jv v_int(int64_t i) { return (jv){.t = T_INT, .u.i = i}; }
static jv v_float(double f) { return (jv){.t = T_FLOAT, .u.f = f}; }

static jv str_alloc(R *r, size_t len) {
    if (len > r->max_out)
        fail(r, PGD_ERANGE, "a string of %zu bytes exceeds the output limit of %zu", len,
             r->max_out);
    jstr *s = obj_new(r, K_STR, sizeof(jstr) + len + 1);
    s->len = len;
    s->s[len] = 0;
    return (jv){.t = T_STR, .u.s = s};
}

static jv v_str(R *r, const char *p, size_t n) {
    jv v = str_alloc(r, n);
    if (n) memcpy(v.u.s->s, p, n);
    return v;
}

static jv v_cstr(R *r, const char *p) { return v_str(r, p, strlen(p)); }

static jv v_list(R *r, size_t cap) {
    jlist *l = obj_new(r, K_LIST, sizeof(jlist));
    l->n = l->cap = 0;
    l->v = NULL;
    l->depth = 1;
    l->tuple = false;
    if (cap) {
        account(r, cap * sizeof(jv));
        l->h.bytes += cap * sizeof(jv);
        l->v = malloc(cap * sizeof(jv));
        if (!l->v) fail(r, PGD_ENOMEM, "out of memory");
        l->cap = cap;
    }
    return (jv){.t = T_LIST, .u.l = l};
}

static int v_depth(jv v) {
    if (v.t == T_LIST) return v.u.l->depth;
    if (v.t == T_DICT || v.t == T_NS) return v.u.d->depth;
    return 0;
}

static void note_depth(R *r, int *depth, jv child) {
    int d = v_depth(child) + 1;
    if (d > MAX_VALUE_DEPTH) {
        unref(r, child);
        fail(r, PGD_ERANGE, "a value nests deeper than %d levels", MAX_VALUE_DEPTH);
    }
    if (d > *depth) *depth = d;
}

/* Appends x (taken) to l. */
static void list_push(R *r, jlist *l, jv x) {
    note_depth(r, &l->depth, x);
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 4;
        account(r, (nc - l->cap) * sizeof(jv));
        jv *nv = realloc(l->v, nc * sizeof(jv));
        if (!nv) {
            unref(r, x);
            fail(r, PGD_ENOMEM, "out of memory");
        }
        l->h.bytes += (nc - l->cap) * sizeof(jv);
        l->v = nv;
        l->cap = nc;
    }
    l->v[l->n++] = x;
}

static jv v_dict(R *r) {
    jdict *d = obj_new(r, K_DICT, sizeof(jdict));
    memset((char *)d + sizeof(jobj), 0, sizeof(jdict) - sizeof(jobj));
    d->depth = 1;
    return (jv){.t = T_DICT, .u.d = d};
}

static uint64_t hash_bytes(const char *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)p[i]) * 1099511628211ull;
    return h;
}

static bool py_eq(const jv a, const jv b);

static void dict_reindex(R *r, jdict *d, size_t hcap) {
    account(r, hcap * sizeof(uint32_t));
    uint32_t *h = calloc(hcap, sizeof(uint32_t));
    if (!h) fail(r, PGD_ENOMEM, "out of memory");
    r->mem -= d->hcap * sizeof(uint32_t);
    d->h.bytes += (hcap - d->hcap) * sizeof(uint32_t);
    free(d->hidx);
    d->hidx = h;
    d->hcap = hcap;
    for (size_t i = 0; i < d->n; i++) {
        if (d->k[i].t != T_STR) continue;
        size_t j = hash_bytes(d->k[i].u.s->s, d->k[i].u.s->len) & (hcap - 1);
        while (h[j]) j = (j + 1) & (hcap - 1);
        h[j] = (uint32_t)i + 1;
    }
}

/* Index of the entry with string key p[0..n), or -1. */
static long dict_find_str(const jdict *d, const char *p, size_t n) {
    if (d->hidx) {
        size_t j = hash_bytes(p, n) & (d->hcap - 1);
        while (d->hidx[j]) {
            size_t i = d->hidx[j] - 1;
            if (d->k[i].u.s->len == n && !memcmp(d->k[i].u.s->s, p, n)) return (long)i;
            j = (j + 1) & (d->hcap - 1);
        }
        return -1;
    }
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].t == T_STR && d->k[i].u.s->len == n && !memcmp(d->k[i].u.s->s, p, n))
            return (long)i;
    return -1;
}

static long dict_find(const jdict *d, jv key) {
    if (key.t == T_STR) return dict_find_str(d, key.u.s->s, key.u.s->len);
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].t != T_STR && py_eq(d->k[i], key)) return (long)i;
    return -1;
}

/* Sets d[key] = val, both taken. An existing key keeps its position (as Python dicts do). */
static void dict_set(R *r, jdict *d, jv key, jv val) {
    long i = dict_find(d, key);
    if (i >= 0) {
        note_depth(r, &d->depth, val);
        unref(r, key);
        unref(r, d->v[i]);
        d->v[i] = val;
        return;
    }
    note_depth(r, &d->depth, val);
    if (d->n == d->cap) {
        size_t nc = d->cap ? d->cap * 2 : 4;
        account(r, 2 * (nc - d->cap) * sizeof(jv));
        d->h.bytes += 2 * (nc - d->cap) * sizeof(jv);
        jv *nk = realloc(d->k, nc * sizeof(jv));
        if (nk) d->k = nk;
        jv *nv = nk ? realloc(d->v, nc * sizeof(jv)) : NULL;
        if (nv) d->v = nv;
        if (!nk || !nv) {
            unref(r, key);
            unref(r, val);
            fail(r, PGD_ENOMEM, "out of memory");
        }
        d->cap = nc;
    }
    d->k[d->n] = key;
    d->v[d->n] = val;
    d->n++;
    if (d->n > 8 && d->n * 2 > d->hcap)
        dict_reindex(r, d, d->hcap ? d->hcap * 4 : 32);
    else if (d->hidx && key.t == T_STR) {
        size_t j = hash_bytes(key.u.s->s, key.u.s->len) & (d->hcap - 1);
        while (d->hidx[j]) j = (j + 1) & (d->hcap - 1);
        d->hidx[j] = (uint32_t)d->n;
    }
}

static jv *dict_get(const jdict *d, const char *name) {
    long i = dict_find_str(d, name, strlen(name));
    return i >= 0 ? &d->v[i] : NULL;
}

static sb *sb_new(R *r, size_t cap) {
    sb *b = obj_new(r, K_SB, sizeof(sb));
    b->n = 0;
    b->cap = 0;
    b->p = NULL;
    if (cap) {
        account(r, cap);
        b->p = malloc(cap);
        if (!b->p) fail(r, PGD_ENOMEM, "out of memory");
        b->cap = cap;
        b->h.bytes += cap;
    }
    return b;
}

static void sb_put(R *r, sb *b, const char *p, size_t n) {
    if (!n) return;
    if (n > r->max_out - b->n)
        fail(r, PGD_ERANGE, "rendered text exceeds the limit of %zu bytes", r->max_out);
    if (b->n + n > b->cap) {
        size_t nc = b->cap ? b->cap : 64;
        while (nc < b->n + n) nc *= 2;
        account(r, nc - b->cap);
        char *np = realloc(b->p, nc);
        if (!np) fail(r, PGD_ENOMEM, "out of memory");
        b->h.bytes += nc - b->cap;
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
}

static void sb_puts(R *r, sb *b, const char *s) { sb_put(r, b, s, strlen(s)); }
static void sb_putc(R *r, sb *b, char c) { sb_put(r, b, &c, 1); }

/* Turns b into a string value (b is released). */
static jv sb_take(R *r, sb *b) {
    jv s = v_str(r, b->p ? b->p : "", b->n);
    obj_unref(r, &b->h);
    return s;
}

/* ============================================================================== unicode == */

/* Byte length of the UTF-8 character at p (1 for an invalid byte, never past end). */
static size_t u8_len(const char *p, const char *end) {
    unsigned char c = (unsigned char)*p;
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    if ((size_t)(end - p) < n) return 1;
    for (size_t i = 1; i < n; i++)
        if (((unsigned char)p[i] & 0xC0) != 0x80) return 1;
    return n;
}

static uint32_t u8_decode(const char *p, size_t n) {
    const unsigned char *s = (const unsigned char *)p;
    switch (n) {
    case 2: return ((uint32_t)(s[0] & 0x1F) << 6) | (s[1] & 0x3F);
    case 3: return ((uint32_t)(s[0] & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
    case 4:
        return ((uint32_t)(s[0] & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
               ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
    default: return s[0];
    }
}

static bool cp_space(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
           c == 0x202F || c == 0x205F || c == 0x3000;
}

/* Byte length of the whitespace character at p (Python's str.isspace / re's \s), 0 if none. */
static size_t ws_len(const char *p, const char *end) {
    if (p >= end) return 0;
    size_t n = u8_len(p, end);
    return cp_space(u8_decode(p, n)) ? n : 0;
}

static const char *skip_ws(const char *p, const char *end) {
    size_t n;
    while ((n = ws_len(p, end))) p += n;
    return p;
}

/* End of p[0..n) with trailing whitespace removed (Python's rstrip()). */
static size_t rstrip_len(const char *p, size_t n) {
    size_t keep = 0, i = 0;
    while (i < n) {
        size_t w = ws_len(p + i, p + n);
        if (w)
            i += w;
        else {
            i += u8_len(p + i, p + n);
            keep = i;
        }
    }
    return keep;
}

static size_t u8_count(const char *p, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i += u8_len(p + i, p + n)) c++;
    return c;
}

static bool is_ascii(const char *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)p[i] >= 0x80) return false;
    return true;
}

/* ========================================================= str(), repr() and json.dumps == */

/* Python's repr() of a float (the shortest text that reads back as the same double). */
static void fmt_float(double f, char *buf, size_t cap, bool json) {
    if (isnan(f)) {
        snprintf(buf, cap, json ? "NaN" : "nan");
        return;
    }
    if (isinf(f)) {
        snprintf(buf, cap, json ? (f > 0 ? "Infinity" : "-Infinity") : (f > 0 ? "inf" : "-inf"));
        return;
    }
    char e[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(e, sizeof e, "%.*e", prec - 1, f);
        if (strtod(e, NULL) == f) break;
    }
    /* e is "-d.ddde[+-]XX": split into sign, digits and exponent. */
    char digits[24];
    size_t nd = 0;
    const char *p = e;
    bool neg = *p == '-';
    if (neg) p++;
    for (; *p && *p != 'e'; p++)
        if (*p != '.') digits[nd++] = *p;
    int exp = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;
    size_t o = 0;
    char out[64];
    if (neg) out[o++] = '-';
    if (exp >= -5 && exp < 16) { /* repr switches to exponent form outside [1e-5 .. 1e16) */
        if (exp < -4) goto sci;
        if (exp < 0) {
            out[o++] = '0';
            out[o++] = '.';
            for (int i = 0; i < -exp - 1; i++) out[o++] = '0';
            for (size_t i = 0; i < nd; i++) out[o++] = digits[i];
        } else {
            for (int i = 0; i <= exp; i++) out[o++] = (size_t)i < nd ? digits[i] : '0';
            out[o++] = '.';
            if ((size_t)exp + 1 < nd)
                for (size_t i = (size_t)exp + 1; i < nd; i++) out[o++] = digits[i];
            else
                out[o++] = '0';
        }
        out[o] = 0;
        snprintf(buf, cap, "%s", out);
        return;
    }
sci:
    out[o++] = digits[0];
    if (nd > 1) {
        out[o++] = '.';
        for (size_t i = 1; i < nd; i++) out[o++] = digits[i];
    }
    out[o] = 0;
    snprintf(buf, cap, "%se%c%02d", out, exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
}

/* Python's str.isprintable() for one code point, closely enough for repr(). */
static bool cp_printable(uint32_t c) {
    if (c < 0x20 || c == 0x7F || (c >= 0x80 && c <= 0xA0) || c == 0xAD) return false;
    if (c == 0x1680 || (c >= 0x2000 && c <= 0x200F) || (c >= 0x2028 && c <= 0x202F) ||
        (c >= 0x205F && c <= 0x206F) || c == 0x3000 || c == 0xFEFF ||
        (c >= 0xD800 && c <= 0xDFFF) || (c >= 0xFFF9 && c <= 0xFFFB) || c == 0x061C ||
        c == 0x180E || (c >= 0xE000 && c <= 0xF8FF))
        return false;
    return true;
}

static void repr_str(R *r, sb *b, const char *p, size_t n) {
    bool sq = memchr(p, '\'', n) != NULL, dq = memchr(p, '"', n) != NULL;
    char q = sq && !dq ? '"' : '\'';
    sb_putc(r, b, q);
    const char *end = p + n;
    while (p < end) {
        size_t l = u8_len(p, end);
        uint32_t c = u8_decode(p, l);
        char tmp[16];
        if (c == (uint32_t)q || c == '\\') {
            tmp[0] = '\\';
            tmp[1] = (char)c;
            sb_put(r, b, tmp, 2);
        } else if (c == '\n')
            sb_puts(r, b, "\\n");
        else if (c == '\r')
            sb_puts(r, b, "\\r");
        else if (c == '\t')
            sb_puts(r, b, "\\t");
        else if (l == 1 && (unsigned char)*p >= 0x80) { /* invalid byte: best effort */
            snprintf(tmp, sizeof tmp, "\\x%02x", (unsigned char)*p);
            sb_puts(r, b, tmp);
        } else if (!cp_printable(c)) {
            if (c < 0x100)
                snprintf(tmp, sizeof tmp, "\\x%02x", c);
            else if (c < 0x10000)
                snprintf(tmp, sizeof tmp, "\\u%04x", c);
            else
                snprintf(tmp, sizeof tmp, "\\U%08x", c);
            sb_puts(r, b, tmp);
        } else
            sb_put(r, b, p, l);
        p += l;
    }
    sb_putc(r, b, q);
}

static void to_str_into(R *r, sb *b, jv v, bool repr);

static void repr_into(R *r, sb *b, jv v) { to_str_into(r, b, v, true); }

/* Python's str(v) (repr=false) or repr(v) appended to b. */
static void to_str_into(R *r, sb *b, jv v, bool repr) {
    char buf[64];
    switch (v.t) {
    case T_UNDEF: break;
    case T_NONE: sb_puts(r, b, "None"); break;
    case T_BOOL: sb_puts(r, b, v.u.b ? "True" : "False"); break;
    case T_INT:
        snprintf(buf, sizeof buf, "%lld", (long long)v.u.i);
        sb_puts(r, b, buf);
        break;
    case T_FLOAT:
        fmt_float(v.u.f, buf, sizeof buf, false);
        sb_puts(r, b, buf);
        break;
    case T_STR:
        if (repr)
            repr_str(r, b, v.u.s->s, v.u.s->len);
        else
            sb_put(r, b, v.u.s->s, v.u.s->len);
        break;
    case T_LIST:
        sb_putc(r, b, v.u.l->tuple ? '(' : '[');
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i) sb_puts(r, b, ", ");
            repr_into(r, b, v.u.l->v[i]);
        }
        if (v.u.l->tuple && v.u.l->n == 1) sb_putc(r, b, ',');
        sb_putc(r, b, v.u.l->tuple ? ')' : ']');
        break;
    case T_NS:
        sb_puts(r, b, "<Namespace ");
        /* fall through */
    case T_DICT:
        sb_putc(r, b, '{');
        for (size_t i = 0; i < v.u.d->n; i++) {
            if (i) sb_puts(r, b, ", ");
            repr_into(r, b, v.u.d->k[i]);
            sb_puts(r, b, ": ");
            repr_into(r, b, v.u.d->v[i]);
        }
        sb_putc(r, b, '}');
        if (v.t == T_NS) sb_putc(r, b, '>');
        break;
    case T_LOOP:
        snprintf(buf, sizeof buf, "<LoopContext %lld/%zu>", (long long)v.u.lp->index0 + 1,
                 v.u.lp->items->n);
        sb_puts(r, b, buf);
        break;
    case T_MACRO: sb_puts(r, b, "<Macro>"); break;
    case T_FUNC: sb_puts(r, b, "<function>"); break;
    }
}

/* str(v) as a new string value (a string is returned as a new reference to itself). */
static jv to_str(R *r, jv v) {
    if (v.t == T_STR) return ref(v);
    if (v.t == T_UNDEF) return v_str(r, "", 0);
    sb *b = sb_new(r, 0);
    to_str_into(r, b, v, false);
    return sb_take(r, b);
}

static const char *type_name(jv v) {
    switch (v.t) {
    case T_UNDEF: return "Undefined";
    case T_NONE: return "NoneType";
    case T_BOOL: return "bool";
    case T_INT: return "int";
    case T_FLOAT: return "float";
    case T_STR: return "str";
    case T_LIST: return v.u.l->tuple ? "tuple" : "list";
    case T_DICT: return "dict";
    case T_NS: return "Namespace";
    case T_LOOP: return "LoopContext";
    case T_MACRO: return "Macro";
    default: return "function";
    }
}

typedef struct json_opts {
    const char *indent; /* NULL: one line */
    const char *item_sep, *key_sep;
    bool sort_keys;
} json_opts;

static void json_str(R *r, sb *b, const char *p, size_t n) {
    sb_putc(r, b, '"');
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        const char *esc = NULL;
        char tmp[8];
        switch (c) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        default:
            if (c < 0x20) {
                snprintf(tmp, sizeof tmp, "\\u%04x", c);
                esc = tmp;
            }
        }
        if (esc) {
            sb_put(r, b, p + run, i - run);
            sb_puts(r, b, esc);
            run = i + 1;
        }
    }
    sb_put(r, b, p + run, n - run);
    sb_putc(r, b, '"');
}

static void json_newline(R *r, sb *b, const json_opts *o, int level) {
    sb_putc(r, b, '\n');
    for (int i = 0; i < level; i++) sb_puts(r, b, o->indent);
}

/* Stable sort of a[0..n) by Python's < (of each element's attribute path when path is
 * non-NULL); reverse sorts descending keeping equal elements in order, as sorted() does. */
static void sort_jv(R *r, jv *a, size_t n, const jstr *path, bool ci, bool reverse);

/* Python's json.dumps(v, ensure_ascii=False, ...) appended to b. */
static void json_into(R *r, sb *b, jv v, const json_opts *o, int level) {
    char buf[64];
    switch (v.t) {
    case T_NONE: sb_puts(r, b, "null"); return;
    case T_BOOL: sb_puts(r, b, v.u.b ? "true" : "false"); return;
    case T_INT:
    case T_FLOAT: to_str_into(r, b, v, false); return;
    case T_STR: json_str(r, b, v.u.s->s, v.u.s->len); return;
    case T_LIST:
        if (!v.u.l->n) {
            sb_puts(r, b, "[]");
            return;
        }
        sb_putc(r, b, '[');
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i) sb_puts(r, b, o->item_sep);
            if (o->indent) json_newline(r, b, o, level + 1);
            json_into(r, b, v.u.l->v[i], o, level + 1);
        }
        if (o->indent) json_newline(r, b, o, level);
        sb_putc(r, b, ']');
        return;
    case T_DICT: {
        jdict *d = v.u.d;
        if (!d->n) {
            sb_puts(r, b, "{}");
            return;
        }
        /* Entry order: insertion, or sorted by key (all keys must then compare). */
        jv keys = v_list(r, d->n);
        for (size_t i = 0; i < d->n; i++) list_push(r, keys.u.l, ref(d->k[i]));
        if (o->sort_keys) sort_jv(r, keys.u.l->v, d->n, NULL, false, false);
        sb_putc(r, b, '{');
        for (size_t i = 0; i < d->n; i++) {
            jv k = keys.u.l->v[i];
            if (i) sb_puts(r, b, o->item_sep);
            if (o->indent) json_newline(r, b, o, level + 1);
            switch (k.t) {
            case T_STR: json_str(r, b, k.u.s->s, k.u.s->len); break;
            case T_INT:
            case T_FLOAT:
                if (k.t == T_FLOAT)
                    fmt_float(k.u.f, buf, sizeof buf, true);
                else
                    snprintf(buf, sizeof buf, "%lld", (long long)k.u.i);
                json_str(r, b, buf, strlen(buf));
                break;
            case T_BOOL: json_str(r, b, k.u.b ? "true" : "false", k.u.b ? 4 : 5); break;
            case T_NONE: json_str(r, b, "null", 4); break;
            default:
                TYPE_ERR(r, "keys must be str, int, float, bool or None, not %s", type_name(k));
            }
            sb_puts(r, b, o->key_sep);
            json_into(r, b, d->v[dict_find(d, k)], o, level + 1);
        }
        unref(r, keys);
        if (o->indent) json_newline(r, b, o, level);
        sb_putc(r, b, '}');
        return;
    }
    default: TYPE_ERR(r, "Object of type %s is not JSON serializable", type_name(v));
    }
}

/* ============================================================================ cJSON → jv == */

static jv from_cjson(R *r, const cJSON *c, int depth) {
    if (depth > MAX_VALUE_DEPTH)
        fail(r, PGD_ERANGE, "a value nests deeper than %d levels", MAX_VALUE_DEPTH);
    if (cJSON_IsNull(c)) return v_none();
    if (cJSON_IsFalse(c)) return v_bool(false);
    if (cJSON_IsTrue(c)) return v_bool(true);
    if (cJSON_IsString(c)) return v_cstr(r, c->valuestring ? c->valuestring : "");
    if (cJSON_IsNumber(c)) {
        /* cJSON keeps only the double: integral values within int64 become ints. */
        double d = c->valuedouble;
        if (d == floor(d) && fabs(d) < 9.2e18) return v_int((int64_t)d);
        return v_float(d);
    }
    if (cJSON_IsArray(c)) {
        jv l = v_list(r, 0);
        for (const cJSON *e = c->child; e; e = e->next)
            list_push(r, l.u.l, from_cjson(r, e, depth + 1));
        return l;
    }
    if (cJSON_IsObject(c)) {
        jv d = v_dict(r);
        for (const cJSON *e = c->child; e; e = e->next) {
            jv k = v_cstr(r, e->string ? e->string : "");
            dict_set(r, d.u.d, k, from_cjson(r, e, depth + 1));
        }
        return d;
    }
    return v_none(); /* cJSON_Raw / invalid */
}

/* ======================================================================= lexer + parser == */

typedef enum {
    TK_EOF,
    TK_DATA,
    TK_VBEGIN,
    TK_VEND,
    TK_BBEGIN,
    TK_BEND,
    TK_NAME,
    TK_STRING,
    TK_INT,
    TK_FLOAT,
    TK_OP,
} tkind;

typedef enum {
    OP_ADD,
    OP_SUB,
    OP_DIV,
    OP_FLOORDIV,
    OP_MUL,
    OP_MOD,
    OP_POW,
    OP_TILDE,
    OP_LBRACKET,
    OP_RBRACKET,
    OP_LPAREN,
    OP_RPAREN,
    OP_LBRACE,
    OP_RBRACE,
    OP_EQ,
    OP_NE,
    OP_GT,
    OP_GTEQ,
    OP_LT,
    OP_LTEQ,
    OP_ASSIGN,
    OP_DOT,
    OP_COLON,
    OP_PIPE,
    OP_COMMA,
    OP_SEMICOLON,
    OP_IN,
    OP_NOTIN, /* the last two only in N_CMP */
} optype;

static const char *const op_text[] = {
    "+",  "-",  "/", "//", "*", "%",  "**", "~", "[", "]", "(", ")", "{",  "}",
    "==", "!=", ">", ">=", "<", "<=", "=",  ".", ":", "|", ",", ";", "in", "not in",
};

typedef struct tok {
    uint8_t kind, op;
    size_t off;    /* byte offset in the (normalized) source, for line/column */
    const char *s; /* DATA: text; NAME: identifier; STRING: decoded value (arena) */
    size_t n;
    int64_t i;
    double f;
} tok;

typedef enum {
    N_BODY,
    N_DATA,
    N_OUTPUT,
    N_IF,
    N_FOR,
    N_SET,
    N_SETBLOCK,
    N_MACRO,
    N_BREAK,
    N_CONTINUE,
    N_FILTERBLOCK,
    N_WITH,
    N_CONST,
    N_NAME,
    N_LIST,
    N_TUPLE,
    N_DICT,
    N_ATTR,
    N_ITEM,
    N_SLICE,
    N_CALL,
    N_FILTER,
    N_TEST,
    N_BINOP,
    N_NEG,
    N_POS,
    N_NOT,
    N_AND,
    N_OR,
    N_CMP,
    N_COND,
    N_CONCAT,
} nkind;

typedef struct node {
    uint8_t kind, op;
    bool neg; /* N_TEST: "is not" */
    int line;
    int fid; /* N_FILTER / N_TEST: resolved builtin */
    struct node *a, *b, *c, *d;
    struct node **kids; /* (n) body statements, items, positional args, dict keys, cmp rhs */
    size_t n;
    struct node **kids2; /* (nnames) keyword-argument values, dict values, macro defaults */
    jstr **names;        /* (nnames) keyword names, for/set targets, macro params */
    size_t nnames;
    jstr *name;   /* N_NAME, N_ATTR, N_FILTER, N_TEST, N_MACRO; N_SET: namespace of ns.attr */
    jstr *attr;   /* N_SET / N_SETBLOCK: attribute of ns.attr */
    uint8_t *ops; /* (n) N_CMP operators */
    jv cval;      /* N_CONST value, N_DATA text (immortal) */
    size_t off;   /* source offset, for messages */
} node;

typedef struct ablk {
    struct ablk *next;
    max_align_t data[];
} ablk;

struct pgd_jinja_tmpl {
    ablk *blocks; /* every allocation of the template */
    node *root;
};

typedef struct P {
    jmp_buf jb;
    pgd_err *err;
    pgd_jinja_tmpl *t;
    const char *src; /* normalized copy (arena) */
    size_t len;
    tok *toks; /* (cap) malloc'd, freed by the API function */
    size_t n, cap, pos;
    int depth, loop_depth;
} P;

static int line_of(const P *p, size_t off, int *col) {
    int line = 1;
    size_t ls = 0;
    for (size_t i = 0; i < off && i < p->len; i++)
        if (p->src[i] == '\n') {
            line++;
            ls = i + 1;
        }
    if (col) *col = (int)(off - ls) + 1;
    return line;
}

static _Noreturn __attribute__((format(printf, 4, 5))) void pfail(P *p, int code, size_t off,
                                                                  const char *fmt, ...) {
    if (p->err) {
        char msg[sizeof p->err->msg];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        int col, line = line_of(p, off, &col);
        pgd_err_set(p->err, code, "template line %d col %d: %s", line, col, msg);
    }
    longjmp(p->jb, code);
}

static void *aalloc(P *p, size_t n) {
    ablk *b = calloc(1, sizeof(ablk) + n);
    if (!b) pfail(p, PGD_ENOMEM, 0, "out of memory");
    b->next = p->t->blocks;
    p->t->blocks = b;
    return b->data;
}

static jstr *imm_str(P *p, const char *s, size_t n) {
    jstr *j = aalloc(p, sizeof(jstr) + n + 1);
    j->h.rc = -1;
    j->h.kind = K_STR;
    j->len = n;
    if (n) memcpy(j->s, s, n);
    j->s[n] = 0;
    return j;
}

static void push_tok(P *p, tok t) {
    if (p->n == p->cap) {
        size_t nc = p->cap ? p->cap * 2 : 256;
        tok *nt = realloc(p->toks, nc * sizeof(tok));
        if (!nt) pfail(p, PGD_ENOMEM, t.off, "out of memory");
        p->toks = nt;
        p->cap = nc;
    }
    p->toks[p->n++] = t;
}

static void push_data(P *p, size_t from, size_t to) {
    if (to > from)
        push_tok(p, (tok){.kind = TK_DATA, .off = from, .s = p->src + from, .n = to - from});
}

static bool at(const P *p, size_t i, const char *lit) {
    size_t n = strlen(lit);
    return i <= p->len && p->len - i >= n && !memcmp(p->src + i, lit, n);
}

/* Emits the text src[from..tag) before a tag, applying jinja2's rules: "-" strips all
 * whitespace before the tag; otherwise, for block and comment tags (lstrip_blocks), spaces
 * between the start of the line and the tag go. */
static void emit_text(P *p, size_t from, size_t tag, char sign, bool is_var, bool line_starting) {
    size_t end = tag;
    if (sign == '-')
        end = from + rstrip_len(p->src + from, tag - from);
    else if (sign != '+' && !is_var) {
        size_t l = tag;
        while (l > from && p->src[l - 1] != '\n') l--;
        bool nl = l > from;
        if ((nl || line_starting) && l < tag && skip_ws(p->src + l, p->src + tag) == p->src + tag)
            end = l;
    }
    push_data(p, from, end);
}

/* Python's unicode-escape decoding of a string literal body. */
static void decode_string(P *p, tok *t, const char *s, size_t n) {
    char *out = aalloc(p, n + 1), *o = out;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\\' || i + 1 == n) {
            *o++ = s[i];
            continue;
        }
        char c = s[++i];
        uint32_t cp;
        int want = 0;
        switch (c) {
        case '\n': break;
        case '\\': *o++ = '\\'; break;
        case '\'': *o++ = '\''; break;
        case '"': *o++ = '"'; break;
        case 'a': *o++ = '\a'; break;
        case 'b': *o++ = '\b'; break;
        case 'f': *o++ = '\f'; break;
        case 'n': *o++ = '\n'; break;
        case 'r': *o++ = '\r'; break;
        case 't': *o++ = '\t'; break;
        case 'v': *o++ = '\v'; break;
        case 'x': want = 2; break;
        case 'u': want = 4; break;
        case 'U': want = 8; break;
        case 'N': pfail(p, PGD_EUNSUPPORTED, t->off, "\\N{...} escapes are not supported");
        default:
            if (c >= '0' && c <= '7') {
                cp = 0;
                for (int k = 0; k < 3 && i < n && s[i] >= '0' && s[i] <= '7'; k++)
                    cp = cp * 8 + (uint32_t)(s[i++] - '0');
                i--;
                o += pgd__utf8_encode(cp, o);
            } else {
                *o++ = '\\';
                *o++ = c;
            }
        }
        if (want) {
            cp = 0;
            for (int k = 0; k < want; k++) {
                char h = i + 1 < n ? s[++i] : 0;
                int d = h >= '0' && h <= '9'   ? h - '0'
                        : h >= 'a' && h <= 'f' ? h - 'a' + 10
                        : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                               : -1;
                if (d < 0) pfail(p, PGD_EFORMAT, t->off, "truncated \\%c escape in a string", c);
                cp = cp * 16 + (uint32_t)d;
            }
            if (cp > 0x10FFFF)
                pfail(p, PGD_EFORMAT, t->off, "illegal Unicode character in a string");
            o += pgd__utf8_encode(cp, o); /* at most 4 bytes from >= 4 source bytes */
        }
    }
    *o = 0;
    t->s = out;
    t->n = (size_t)(o - out);
}

static bool is_digit(char c) { return c >= '0' && c <= '9'; }
static bool is_name0(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (unsigned char)c >= 0x80;
}
static bool is_name1(char c) { return is_name0(c) || is_digit(c); }

/* Digits with single underscores between them; returns the end (== i if none). */
static size_t scan_digits(const P *p, size_t i, int base) {
    size_t j = i;
    for (;;) {
        char c = j < p->len ? p->src[j] : 0;
        bool ok = base == 10   ? is_digit(c)
                  : base == 16 ? (is_digit(c) || ((c | 32) >= 'a' && (c | 32) <= 'f'))
                  : base == 8  ? (c >= '0' && c <= '7')
                               : (c == '0' || c == '1');
        if (ok)
            j++;
        else if (c == '_' && j > i && j + 1 < p->len) {
            char d = p->src[j + 1];
            bool ok2 = base == 10   ? is_digit(d)
                       : base == 16 ? (is_digit(d) || ((d | 32) >= 'a' && (d | 32) <= 'f'))
                       : base == 8  ? (d >= '0' && d <= '7')
                                    : (d == '0' || d == '1');
            if (!ok2) break;
            j++;
        } else
            break;
    }
    return j;
}

static size_t copy_digits(const char *s, size_t n, char *buf, size_t cap) {
    size_t o = 0;
    for (size_t i = 0; i < n && o + 1 < cap; i++)
        if (s[i] != '_') buf[o++] = s[i];
    buf[o] = 0;
    return o;
}

/* Tokens inside {{ }} or {% %} from *pos until the closing tag (inclusive). */
static void lex_tag(P *p, size_t *pos, bool block, bool *line_starting) {
    char bal[64];
    int nbal = 0;
    size_t i = *pos;
    const char *src = p->src;
    for (;;) {
        if (i >= p->len) pfail(p, PGD_EFORMAT, i, "unexpected end of template");
        if (nbal == 0) {
            size_t e = 0;
            if (block) {
                if (at(p, i, "+%}"))
                    e = i + 3;
                else if (at(p, i, "-%}"))
                    e = (size_t)(skip_ws(src + i + 3, src + p->len) - src);
                else if (at(p, i, "%}"))
                    e = i + 2 + (at(p, i + 2, "\n") ? 1 : 0);
            } else {
                if (at(p, i, "-}}"))
                    e = (size_t)(skip_ws(src + i + 3, src + p->len) - src);
                else if (at(p, i, "}}"))
                    e = i + 2;
            }
            if (e) {
                push_tok(p, (tok){.kind = block ? TK_BEND : TK_VEND, .off = i});
                *line_starting = src[e - 1] == '\n';
                *pos = e;
                return;
            }
        }
        size_t w = ws_len(src + i, src + p->len);
        if (w) {
            i += w;
            continue;
        }
        char c = src[i];
        tok t = {.off = i};
        if (is_digit(c)) {
            /* float: digits ((. digits)? e[+-]digits | . digits), not right after a '.' */
            size_t d = scan_digits(p, i, 10), fe = 0;
            if (!(i > 0 && src[i - 1] == '.')) {
                size_t j = d;
                bool frac = false;
                if (j < p->len && src[j] == '.' && j + 1 < p->len && is_digit(src[j + 1])) {
                    j = scan_digits(p, j + 1, 10);
                    frac = true;
                }
                if (j < p->len && (src[j] | 32) == 'e') {
                    size_t k = j + 1;
                    if (k < p->len && (src[k] == '+' || src[k] == '-')) k++;
                    size_t ke = k < p->len && is_digit(src[k]) ? scan_digits(p, k, 10) : k;
                    if (ke > k)
                        fe = ke;
                    else if (frac)
                        fe = j;
                } else if (frac)
                    fe = j;
            }
            char buf[128];
            if (fe) {
                copy_digits(src + i, fe - i, buf, sizeof buf);
                t.kind = TK_FLOAT;
                t.f = strtod(buf, NULL);
                i = fe;
            } else {
                int base = 10;
                size_t s0 = i, e;
                if (c == '0' && i + 1 < p->len && strchr("bBoOxX", src[i + 1]) && src[i + 1]) {
                    char b = (char)(src[i + 1] | 32);
                    base = b == 'b' ? 2 : b == 'o' ? 8 : 16;
                    s0 = i + 2;
                    /* the regex allows a leading underscore after the prefix */
                    size_t s1 = s0 < p->len && src[s0] == '_' ? s0 + 1 : s0;
                    e = scan_digits(p, s1, base);
                    if (e == s1) pfail(p, PGD_EFORMAT, i, "invalid number literal");
                } else if (c == '0') {
                    e = i + 1;
                    while (e + 1 < p->len &&
                           (src[e] == '0' || (src[e] == '_' && src[e + 1] == '0')))
                        e++;
                    if (src[e - 1] == '_') e--;
                } else
                    e = d;
                copy_digits(src + s0, e - s0, buf, sizeof buf);
                errno = 0;
                unsigned long long v = strtoull(buf, NULL, base);
                if (errno || v > INT64_MAX || e - s0 > 100)
                    pfail(p, PGD_EUNSUPPORTED, i, "integer literal too large");
                t.kind = TK_INT;
                t.i = (int64_t)v;
                i = e;
            }
        } else if (is_name0(c)) {
            size_t j = i;
            while (j < p->len && is_name1(src[j])) j++;
            t.kind = TK_NAME;
            t.s = src + i;
            t.n = j - i;
            i = j;
        } else if (c == '\'' || c == '"') {
            size_t j = i + 1;
            while (j < p->len && src[j] != c) j += src[j] == '\\' ? 2 : 1;
            if (j >= p->len)
                pfail(p, PGD_EFORMAT, i, "unexpected char %c (unterminated string)", c);
            t.kind = TK_STRING;
            decode_string(p, &t, src + i + 1, j - i - 1);
            i = j + 1;
        } else {
            static const char *const two[] = {"//", "**", "==", "!=", ">=", "<="};
            static const uint8_t two_op[] = {OP_FLOORDIV, OP_POW, OP_EQ, OP_NE, OP_GTEQ, OP_LTEQ};
            static const char one[] = "+-/*%~[](){}><=.:|,;";
            static const uint8_t one_op[] = {
                OP_ADD,      OP_SUB,    OP_DIV,    OP_MUL,    OP_MOD,    OP_TILDE,    OP_LBRACKET,
                OP_RBRACKET, OP_LPAREN, OP_RPAREN, OP_LBRACE, OP_RBRACE, OP_GT,       OP_LT,
                OP_ASSIGN,   OP_DOT,    OP_COLON,  OP_PIPE,   OP_COMMA,  OP_SEMICOLON};
            t.kind = TK_OP;
            int found = 0;
            for (int k = 0; k < 6 && !found; k++)
                if (at(p, i, two[k])) {
                    t.op = two_op[k];
                    i += 2;
                    found = 1;
                }
            const char *q = found ? NULL : memchr(one, c, sizeof one - 1);
            if (!found && !q) {
                if ((unsigned char)c < 0x20 || (unsigned char)c >= 0x7f)
                    pfail(p, PGD_EFORMAT, i, "unexpected char 0x%02x", (unsigned char)c);
                pfail(p, PGD_EFORMAT, i, "unexpected char '%c'", c);
            }
            if (!found) {
                t.op = one_op[q - one];
                i++;
            }
            if (t.op == OP_LPAREN || t.op == OP_LBRACKET || t.op == OP_LBRACE) {
                if (nbal == (int)sizeof bal)
                    pfail(p, PGD_ERANGE, t.off, "brackets nest too deeply");
                bal[nbal++] = t.op == OP_LPAREN ? ')' : t.op == OP_LBRACKET ? ']' : '}';
            } else if (t.op == OP_RPAREN || t.op == OP_RBRACKET || t.op == OP_RBRACE) {
                char cl = op_text[t.op][0];
                if (!nbal) pfail(p, PGD_EFORMAT, t.off, "unexpected '%c'", cl);
                if (bal[nbal - 1] != cl)
                    pfail(p, PGD_EFORMAT, t.off, "unexpected '%c', expected '%c'", cl,
                          bal[nbal - 1]);
                nbal--;
            }
        }
        push_tok(p, t);
    }
}

static void lex(P *p) {
    const char *src = p->src;
    size_t pos = 0;
    bool line_starting = true;
    while (pos < p->len) {
        size_t q = pos;
        while (q + 1 < p->len &&
               !(src[q] == '{' && (src[q + 1] == '{' || src[q + 1] == '%' || src[q + 1] == '#')))
            q++;
        if (q + 1 >= p->len) {
            push_data(p, pos, p->len);
            break;
        }
        char kind = src[q + 1], sign = 0;
        size_t after = q + 2;
        if (after < p->len && (src[after] == '-' || src[after] == '+')) sign = src[after++];
        /* {% raw %}: "{%" sign ws* "raw" ws* ("-%}" ws* | "%}") -- no trim_blocks newline */
        if (kind == '%') {
            const char *r0 = skip_ws(src + after, src + p->len);
            size_t ri = (size_t)(r0 - src);
            if (at(p, ri, "raw")) {
                size_t re = (size_t)(skip_ws(src + ri + 3, src + p->len) - src), be = 0;
                if (at(p, re, "-%}"))
                    be = (size_t)(skip_ws(src + re + 3, src + p->len) - src);
                else if (at(p, re, "%}"))
                    be = re + 2;
                if (be) {
                    emit_text(p, pos, q, sign, false, line_starting);
                    bool ls = src[be - 1] == '\n';
                    /* find "{%" sign? ws* "endraw" ws* ("+%}" | "-%}" ws* | "%}" "\n"?) */
                    if (be == p->len) return; /* jinja2's lexer just stops there */
                    for (size_t k = be;; k++) {
                        if (k + 1 >= p->len)
                            pfail(p, PGD_EFORMAT, q, "Missing end of raw directive");
                        if (!(src[k] == '{' && src[k + 1] == '%')) continue;
                        size_t a2 = k + 2;
                        char s2 = 0;
                        if (a2 < p->len && (src[a2] == '-' || src[a2] == '+')) s2 = src[a2++];
                        size_t ei = (size_t)(skip_ws(src + a2, src + p->len) - src);
                        if (!at(p, ei, "endraw")) continue;
                        size_t ee = (size_t)(skip_ws(src + ei + 6, src + p->len) - src), end = 0;
                        if (at(p, ee, "+%}"))
                            end = ee + 3;
                        else if (at(p, ee, "-%}"))
                            end = (size_t)(skip_ws(src + ee + 3, src + p->len) - src);
                        else if (at(p, ee, "%}"))
                            end = ee + 2 + (at(p, ee + 2, "\n") ? 1 : 0);
                        if (!end) continue;
                        emit_text(p, be, k, s2, false, ls);
                        pos = end;
                        line_starting = src[end - 1] == '\n';
                        break;
                    }
                    continue;
                }
            }
        }
        emit_text(p, pos, q, sign, kind == '{', line_starting);
        line_starting = false;
        if (kind == '#') {
            if (after == p->len) break; /* "{#" at the very end: jinja2's lexer just stops */
            size_t k = after, end = 0;
            for (; k < p->len && !end; k++) {
                if (at(p, k, "+#}"))
                    end = k + 3;
                else if (at(p, k, "-#}"))
                    end = (size_t)(skip_ws(src + k + 3, src + p->len) - src);
                else if (at(p, k, "#}"))
                    end = k + 2 + (at(p, k + 2, "\n") ? 1 : 0);
            }
            if (!end) pfail(p, PGD_EFORMAT, q, "Missing end of comment tag");
            pos = end;
            line_starting = src[end - 1] == '\n';
            continue;
        }
        push_tok(p, (tok){.kind = kind == '%' ? TK_BBEGIN : TK_VBEGIN, .off = q});
        pos = after;
        lex_tag(p, &pos, kind == '%', &line_starting);
    }
    push_tok(p, (tok){.kind = TK_EOF, .off = p->len});
}

/* Builtin filters and tests, resolved at parse time (jinja2 also rejects unknown ones when it
 * compiles the template). */
enum {
    FL_ABS,
    FL_ATTR,
    FL_CAPITALIZE,
    FL_CENTER,
    FL_DEFAULT,
    FL_DICTSORT,
    FL_ESCAPE,
    FL_FIRST,
    FL_FLOAT,
    FL_FORMAT,
    FL_INDENT,
    FL_INT,
    FL_ITEMS,
    FL_JOIN,
    FL_LAST,
    FL_LENGTH,
    FL_LIST,
    FL_LOWER,
    FL_MAP,
    FL_MAX,
    FL_MIN,
    FL_REJECT,
    FL_REJECTATTR,
    FL_REPLACE,
    FL_REVERSE,
    FL_ROUND,
    FL_SAFE,
    FL_SELECT,
    FL_SELECTATTR,
    FL_SORT,
    FL_STRING,
    FL_SUM,
    FL_TITLE,
    FL_TOJSON,
    FL_TRIM,
    FL_UNIQUE,
    FL_UPPER,
    FL_WORDCOUNT,
    FL_PPRINT,
    FL_TRUNCATE,
};
static const struct {
    const char *name;
    int id;
} filter_names[] = {
    {"abs", FL_ABS},
    {"attr", FL_ATTR},
    {"capitalize", FL_CAPITALIZE},
    {"center", FL_CENTER},
    {"default", FL_DEFAULT},
    {"d", FL_DEFAULT},
    {"dictsort", FL_DICTSORT},
    {"escape", FL_ESCAPE},
    {"e", FL_ESCAPE},
    {"forceescape", FL_ESCAPE},
    {"first", FL_FIRST},
    {"float", FL_FLOAT},
    {"format", FL_FORMAT},
    {"indent", FL_INDENT},
    {"int", FL_INT},
    {"items", FL_ITEMS},
    {"join", FL_JOIN},
    {"last", FL_LAST},
    {"length", FL_LENGTH},
    {"count", FL_LENGTH},
    {"list", FL_LIST},
    {"lower", FL_LOWER},
    {"map", FL_MAP},
    {"max", FL_MAX},
    {"min", FL_MIN},
    {"reject", FL_REJECT},
    {"rejectattr", FL_REJECTATTR},
    {"replace", FL_REPLACE},
    {"reverse", FL_REVERSE},
    {"round", FL_ROUND},
    {"safe", FL_SAFE},
    {"select", FL_SELECT},
    {"selectattr", FL_SELECTATTR},
    {"sort", FL_SORT},
    {"string", FL_STRING},
    {"sum", FL_SUM},
    {"title", FL_TITLE},
    {"tojson", FL_TOJSON},
    {"trim", FL_TRIM},
    {"unique", FL_UNIQUE},
    {"upper", FL_UPPER},
    {"wordcount", FL_WORDCOUNT},
    {"pprint", FL_PPRINT},
    {"truncate", FL_TRUNCATE},
};

enum {
    TS_DEFINED,
    TS_UNDEFINED,
    TS_NONE,
    TS_BOOLEAN,
    TS_FALSE,
    TS_TRUE,
    TS_INTEGER,
    TS_FLOAT,
    TS_NUMBER,
    TS_STRING,
    TS_MAPPING,
    TS_ITERABLE,
    TS_SEQUENCE,
    TS_CALLABLE,
    TS_SAMEAS,
    TS_ESCAPED,
    TS_IN,
    TS_EQ,
    TS_NE,
    TS_LT,
    TS_LE,
    TS_GT,
    TS_GE,
    TS_EVEN,
    TS_ODD,
    TS_DIVISIBLEBY,
    TS_LOWER,
    TS_UPPER,
    TS_FILTER,
    TS_TEST,
};
static const struct {
    const char *name;
    int id;
} test_names[] = {
    {"defined", TS_DEFINED},
    {"undefined", TS_UNDEFINED},
    {"none", TS_NONE},
    {"boolean", TS_BOOLEAN},
    {"false", TS_FALSE},
    {"true", TS_TRUE},
    {"integer", TS_INTEGER},
    {"float", TS_FLOAT},
    {"number", TS_NUMBER},
    {"string", TS_STRING},
    {"mapping", TS_MAPPING},
    {"iterable", TS_ITERABLE},
    {"sequence", TS_SEQUENCE},
    {"callable", TS_CALLABLE},
    {"sameas", TS_SAMEAS},
    {"escaped", TS_ESCAPED},
    {"in", TS_IN},
    {"eq", TS_EQ},
    {"equalto", TS_EQ},
    {"==", TS_EQ},
    {"ne", TS_NE},
    {"!=", TS_NE},
    {"lt", TS_LT},
    {"lessthan", TS_LT},
    {"<", TS_LT},
    {"le", TS_LE},
    {"<=", TS_LE},
    {"gt", TS_GT},
    {"greaterthan", TS_GT},
    {">", TS_GT},
    {"ge", TS_GE},
    {">=", TS_GE},
    {"even", TS_EVEN},
    {"odd", TS_ODD},
    {"divisibleby", TS_DIVISIBLEBY},
    {"lower", TS_LOWER},
    {"upper", TS_UPPER},
    {"filter", TS_FILTER},
    {"test", TS_TEST},
};

static int find_filter(const char *s) {
    for (size_t i = 0; i < sizeof filter_names / sizeof filter_names[0]; i++)
        if (!strcmp(filter_names[i].name, s)) return filter_names[i].id;
    return -1;
}

static int find_test(const char *s) {
    for (size_t i = 0; i < sizeof test_names / sizeof test_names[0]; i++)
        if (!strcmp(test_names[i].name, s)) return test_names[i].id;
    return -1;
}

static tok *cur(P *p) { return &p->toks[p->pos]; }
static tok *peek(P *p, size_t k) { return &p->toks[p->pos + k < p->n ? p->pos + k : p->n - 1]; }
static void advance(P *p) {
    if (p->pos + 1 < p->n) p->pos++;
}

static bool tok_is_name(const tok *t, const char *s) {
    return t->kind == TK_NAME && t->n == strlen(s) && !memcmp(t->s, s, t->n);
}
static bool tok_is_op(const tok *t, int op) { return t->kind == TK_OP && t->op == op; }

static const char *tok_desc(const tok *t, char *buf, size_t cap) {
    switch (t->kind) {
    case TK_EOF: return "end of template";
    case TK_DATA: return "template data";
    case TK_VBEGIN: return "begin of print statement";
    case TK_VEND: return "end of print statement";
    case TK_BBEGIN: return "begin of statement block";
    case TK_BEND: return "end of statement block";
    case TK_NAME: snprintf(buf, cap, "'%.*s'", (int)(t->n < 40 ? t->n : 40), t->s); return buf;
    case TK_STRING: return "string";
    case TK_INT: return "integer";
    case TK_FLOAT: return "float";
    default: snprintf(buf, cap, "'%s'", op_text[t->op]); return buf;
    }
}

static _Noreturn void unexpected(P *p, const char *what) {
    char b[64];
    pfail(p, PGD_EFORMAT, cur(p)->off, "expected %s, got %s", what, tok_desc(cur(p), b, sizeof b));
}

static void expect_op(P *p, int op) {
    if (!tok_is_op(cur(p), op)) {
        char w[16];
        snprintf(w, sizeof w, "'%s'", op_text[op]);
        unexpected(p, w);
    }
    advance(p);
}

static void expect_kind(P *p, int kind, const char *what) {
    if (cur(p)->kind != kind) unexpected(p, what);
    advance(p);
}

static bool accept_op(P *p, int op) {
    if (!tok_is_op(cur(p), op)) return false;
    advance(p);
    return true;
}

static bool accept_name(P *p, const char *s) {
    if (!tok_is_name(cur(p), s)) return false;
    advance(p);
    return true;
}

static jstr *expect_name(P *p) {
    tok *t = cur(p);
    if (t->kind != TK_NAME) unexpected(p, "a name");
    advance(p);
    return imm_str(p, t->s, t->n);
}

static node *mk(P *p, int kind, const tok *t) {
    node *n = aalloc(p, sizeof(node));
    n->kind = (uint8_t)kind;
    n->off = t->off;
    n->line = line_of(p, t->off, NULL);
    return n;
}

/* A growable array of node pointers in the arena (old copies stay in the arena). */
typedef struct nvec {
    node **v;
    size_t n, cap;
} nvec;

static void nvec_push(P *p, nvec *a, node *x) {
    if (a->n == a->cap) {
        size_t nc = a->cap ? a->cap * 2 : 8;
        node **nv = aalloc(p, nc * sizeof(node *));
        if (a->n) memcpy(nv, a->v, a->n * sizeof(node *));
        a->v = nv;
        a->cap = nc;
    }
    a->v[a->n++] = x;
}

static void enter(P *p) {
    if (++p->depth > MAX_PARSE_DEPTH)
        pfail(p, PGD_ERANGE, cur(p)->off, "template nests deeper than %d levels", MAX_PARSE_DEPTH);
}

static node *parse_expr(P *p, bool with_condexpr);
static node *parse_unary(P *p, bool with_filter);
static node *parse_primary(P *p);
static node *parse_postfix(P *p, node *n);

/* Call arguments after '(' up to ')'. */
static void parse_args(P *p, node *n) {
    expect_op(p, OP_LPAREN);
    nvec pos = {0}, kw = {0};
    jstr *names[MAX_ARGS];
    size_t nk = 0;
    while (!tok_is_op(cur(p), OP_RPAREN)) {
        if (pos.n || nk) {
            expect_op(p, OP_COMMA);
            if (tok_is_op(cur(p), OP_RPAREN)) break;
        }
        if (tok_is_op(cur(p), OP_MUL) || tok_is_op(cur(p), OP_POW))
            pfail(p, PGD_EUNSUPPORTED, cur(p)->off,
                  "*args and **kwargs in calls are not supported");
        if (cur(p)->kind == TK_NAME && tok_is_op(peek(p, 1), OP_ASSIGN)) {
            if (nk == MAX_ARGS) pfail(p, PGD_EUNSUPPORTED, cur(p)->off, "too many arguments");
            names[nk++] = expect_name(p);
            advance(p);
            nvec_push(p, &kw, parse_expr(p, true));
        } else {
            if (nk)
                pfail(p, PGD_EFORMAT, cur(p)->off, "positional argument follows keyword argument");
            if (pos.n == MAX_ARGS) pfail(p, PGD_EUNSUPPORTED, cur(p)->off, "too many arguments");
            nvec_push(p, &pos, parse_expr(p, true));
        }
    }
    advance(p);
    n->kids = pos.v;
    n->n = pos.n;
    n->kids2 = kw.v;
    n->nnames = nk;
    if (nk) {
        n->names = aalloc(p, nk * sizeof(jstr *));
        memcpy(n->names, names, nk * sizeof(jstr *));
    }
}

/* name ('.' name)*, joined (a filter's or a test's name; each join keeps at most 255 bytes). */
static jstr *expect_dotted_name(P *p) {
    jstr *name = expect_name(p);
    while (accept_op(p, OP_DOT)) {
        jstr *part = expect_name(p);
        char buf[256];
        snprintf(buf, sizeof buf, "%s.%s", name->s, part->s);
        name = imm_str(p, buf, strlen(buf));
    }
    return name;
}

/* filter_name ('(' args ')')? applied to input (NULL inside {% filter %}). */
static node *parse_filter(P *p, node *input) {
    tok *t = cur(p);
    node *f = mk(p, N_FILTER, t);
    f->a = input;
    f->name = expect_dotted_name(p); /* dotted names are never builtin filters */
    f->fid = find_filter(f->name->s); /* unknown: checked by check_names */
    if (tok_is_op(cur(p), OP_LPAREN)) parse_args(p, f);
    return f;
}

static node *parse_filter_expr(P *p, node *n) {
    int d0 = p->depth; /* each round of the loop deepens the tree */
    for (;;) {
        enter(p);
        tok *t = cur(p);
        if (tok_is_op(t, OP_PIPE)) {
            advance(p);
            n = parse_filter(p, n);
        } else if (tok_is_name(t, "is")) {
            advance(p);
            node *x = mk(p, N_TEST, t);
            x->a = n;
            x->neg = accept_name(p, "not");
            x->name = expect_dotted_name(p);
            x->fid = find_test(x->name->s); /* unknown: checked by check_names */
            tok *c = cur(p);
            if (tok_is_op(c, OP_LPAREN))
                parse_args(p, x);
            else if ((c->kind == TK_NAME || c->kind == TK_STRING || c->kind == TK_INT ||
                      c->kind == TK_FLOAT || tok_is_op(c, OP_LBRACKET) ||
                      tok_is_op(c, OP_LBRACE)) &&
                     !tok_is_name(c, "else") && !tok_is_name(c, "or") && !tok_is_name(c, "and")) {
                if (tok_is_name(c, "is"))
                    pfail(p, PGD_EFORMAT, c->off, "You cannot chain multiple tests with is");
                node *arg = parse_postfix(p, parse_primary(p));
                x->kids = aalloc(p, sizeof(node *));
                x->kids[0] = arg;
                x->n = 1;
            }
            n = x;
        } else if (tok_is_op(t, OP_LPAREN)) {
            node *c = mk(p, N_CALL, t);
            c->a = n;
            parse_args(p, c);
            n = c;
        } else {
            p->depth = d0;
            return n;
        }
    }
}

static node *parse_subscribed(P *p) {
    tok *t = cur(p);
    node *args[3] = {NULL, NULL, NULL};
    if (tok_is_op(t, OP_COLON))
        advance(p);
    else {
        node *e = parse_expr(p, true);
        if (!tok_is_op(cur(p), OP_COLON)) return e;
        advance(p);
        args[0] = e;
    }
    if (!tok_is_op(cur(p), OP_COLON) && !tok_is_op(cur(p), OP_RBRACKET) &&
        !tok_is_op(cur(p), OP_COMMA))
        args[1] = parse_expr(p, true);
    if (accept_op(p, OP_COLON))
        if (!tok_is_op(cur(p), OP_RBRACKET) && !tok_is_op(cur(p), OP_COMMA))
            args[2] = parse_expr(p, true);
    node *s = mk(p, N_SLICE, t);
    s->b = args[0];
    s->c = args[1];
    s->d = args[2];
    return s;
}

static node *parse_postfix(P *p, node *n) {
    int d0 = p->depth; /* each round of the loop deepens the tree */
    for (;;) {
        enter(p);
        tok *t = cur(p);
        if (tok_is_op(t, OP_DOT)) {
            advance(p);
            tok *a = cur(p);
            if (a->kind == TK_NAME) {
                node *x = mk(p, N_ATTR, t);
                x->a = n;
                x->name = expect_name(p);
                n = x;
            } else if (a->kind == TK_INT) {
                node *x = mk(p, N_ITEM, t);
                x->a = n;
                x->b = mk(p, N_CONST, a);
                x->b->cval = v_int(a->i);
                advance(p);
                n = x;
            } else
                unexpected(p, "name or number");
        } else if (tok_is_op(t, OP_LBRACKET)) {
            advance(p);
            nvec args = {0};
            while (!tok_is_op(cur(p), OP_RBRACKET)) {
                if (args.n) expect_op(p, OP_COMMA);
                if (tok_is_op(cur(p), OP_RBRACKET)) break;
                nvec_push(p, &args, parse_subscribed(p));
            }
            advance(p);
            if (!args.n) pfail(p, PGD_EFORMAT, t->off, "expected a subscript");
            node *key = args.v[0];
            if (args.n > 1) {
                key = mk(p, N_TUPLE, t);
                key->kids = args.v;
                key->n = args.n;
            }
            if (key->kind == N_SLICE) {
                key->a = n;
                n = key;
            } else {
                node *x = mk(p, N_ITEM, t);
                x->a = n;
                x->b = key;
                n = x;
            }
        } else if (tok_is_op(t, OP_LPAREN)) {
            node *c = mk(p, N_CALL, t);
            c->a = n;
            parse_args(p, c);
            n = c;
        } else {
            p->depth = d0;
            return n;
        }
    }
}

/* Comma-separated expressions; a single one without a comma is returned as itself. */
static node *parse_tuple(P *p, bool with_condexpr, bool explicit_parens, const char *extra_end) {
    tok *t0 = cur(p);
    nvec items = {0};
    bool is_tuple = false;
    for (;;) {
        if (items.n) expect_op(p, OP_COMMA);
        tok *t = cur(p);
        if (t->kind == TK_VEND || t->kind == TK_BEND || tok_is_op(t, OP_RPAREN) ||
            (extra_end && tok_is_name(t, extra_end)))
            break;
        nvec_push(p, &items, parse_expr(p, with_condexpr));
        if (tok_is_op(cur(p), OP_COMMA))
            is_tuple = true;
        else
            break;
    }
    if (!is_tuple) {
        if (items.n) return items.v[0];
        if (!explicit_parens) unexpected(p, "an expression");
    }
    node *n = mk(p, N_TUPLE, t0);
    n->kids = items.v;
    n->n = items.n;
    return n;
}

static node *parse_primary(P *p) {
    enter(p);
    tok *t = cur(p);
    node *n;
    switch (t->kind) {
    case TK_NAME:
        n = mk(p, N_CONST, t);
        if (tok_is_name(t, "true") || tok_is_name(t, "True"))
            n->cval = v_bool(true);
        else if (tok_is_name(t, "false") || tok_is_name(t, "False"))
            n->cval = v_bool(false);
        else if (tok_is_name(t, "none") || tok_is_name(t, "None"))
            n->cval = v_none();
        else {
            n->kind = N_NAME;
            n->name = imm_str(p, t->s, t->n);
        }
        advance(p);
        break;
    case TK_STRING: {
        /* adjacent literals concatenate */
        size_t len = 0, k = p->pos;
        for (; p->toks[k].kind == TK_STRING; k++) len += p->toks[k].n;
        jstr *s = imm_str(p, "", 0);
        if (k > p->pos + 1) {
            s = aalloc(p, sizeof(jstr) + len + 1);
            s->h.rc = -1;
            s->h.kind = K_STR;
            s->len = 0;
            for (; p->pos < k; p->pos++) {
                memcpy(s->s + s->len, p->toks[p->pos].s, p->toks[p->pos].n);
                s->len += p->toks[p->pos].n;
            }
            s->s[s->len] = 0;
        } else {
            s = imm_str(p, t->s, t->n);
            advance(p);
        }
        n = mk(p, N_CONST, t);
        n->cval = (jv){.t = T_STR, .u.s = s};
        break;
    }
    case TK_INT:
    case TK_FLOAT:
        n = mk(p, N_CONST, t);
        n->cval = t->kind == TK_INT ? v_int(t->i) : v_float(t->f);
        advance(p);
        break;
    case TK_OP:
        if (t->op == OP_LPAREN) {
            advance(p);
            n = parse_tuple(p, true, true, NULL);
            if (n->kind == N_TUPLE) n->op = 1; /* parenthesized */
            expect_op(p, OP_RPAREN);
            break;
        }
        if (t->op == OP_LBRACKET || t->op == OP_LBRACE) {
            bool dict = t->op == OP_LBRACE;
            int close = dict ? OP_RBRACE : OP_RBRACKET;
            advance(p);
            nvec keys = {0}, vals = {0};
            while (!tok_is_op(cur(p), close)) {
                if (keys.n) expect_op(p, OP_COMMA);
                if (tok_is_op(cur(p), close)) break;
                nvec_push(p, &keys, parse_expr(p, true));
                if (dict) {
                    expect_op(p, OP_COLON);
                    nvec_push(p, &vals, parse_expr(p, true));
                }
            }
            advance(p);
            n = mk(p, dict ? N_DICT : N_LIST, t);
            n->kids = keys.v;
            n->n = keys.n;
            n->kids2 = vals.v;
            n->nnames = vals.n;
            break;
        }
        /* fall through */
    default: {
        char b[64];
        pfail(p, PGD_EFORMAT, t->off, "unexpected %s", tok_desc(t, b, sizeof b));
    }
    }
    p->depth--;
    return n;
}

static node *parse_unary(P *p, bool with_filter) {
    enter(p);
    tok *t = cur(p);
    node *n;
    if (tok_is_op(t, OP_SUB) || tok_is_op(t, OP_ADD)) {
        advance(p);
        n = mk(p, t->op == OP_SUB ? N_NEG : N_POS, t);
        n->a = parse_unary(p, false);
    } else
        n = parse_primary(p);
    n = parse_postfix(p, n);
    if (with_filter) n = parse_filter_expr(p, n);
    p->depth--;
    return n;
}

static node *binop(P *p, const tok *t, int op, node *a, node *b) {
    node *n = mk(p, N_BINOP, t);
    n->op = (uint8_t)op;
    n->a = a;
    n->b = b;
    return n;
}

/* A left-associative chain `sub (op sub)*` over the operators ops[0..n_ops). */
static node *parse_binops(P *p, node *(*sub)(P *), const uint8_t *ops, int n_ops) {
    int d0 = p->depth; /* each round of the loop deepens the tree */
    node *n = sub(p);
    for (;;) {
        tok *t = cur(p);
        if (t->kind != TK_OP || !memchr(ops, t->op, (size_t)n_ops)) break;
        enter(p);
        advance(p);
        n = binop(p, t, t->op, n, sub(p));
    }
    p->depth = d0;
    return n;
}

static node *parse_filtered_unary(P *p) { return parse_unary(p, true); }

static node *parse_pow(P *p) {
    static const uint8_t ops[] = {OP_POW};
    return parse_binops(p, parse_filtered_unary, ops, (int)sizeof ops);
}

static node *parse_math2(P *p) {
    static const uint8_t ops[] = {OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD};
    return parse_binops(p, parse_pow, ops, (int)sizeof ops);
}

static node *parse_concat(P *p) {
    tok *t0 = cur(p);
    node *first = parse_math2(p);
    if (!tok_is_op(cur(p), OP_TILDE)) return first;
    nvec v = {0};
    nvec_push(p, &v, first);
    while (accept_op(p, OP_TILDE)) nvec_push(p, &v, parse_math2(p));
    node *n = mk(p, N_CONCAT, t0);
    n->kids = v.v;
    n->n = v.n;
    return n;
}

static node *parse_math1(P *p) {
    static const uint8_t ops[] = {OP_ADD, OP_SUB};
    return parse_binops(p, parse_concat, ops, (int)sizeof ops);
}

static node *parse_compare(P *p) {
    tok *t0 = cur(p);
    node *first = parse_math1(p);
    nvec rhs = {0};
    uint8_t ops[64];
    for (;;) {
        tok *t = cur(p);
        int op;
        if (t->kind == TK_OP && (t->op == OP_EQ || t->op == OP_NE || t->op == OP_LT ||
                                 t->op == OP_LTEQ || t->op == OP_GT || t->op == OP_GTEQ)) {
            op = t->op;
            advance(p);
        } else if (tok_is_name(t, "in")) {
            op = OP_IN;
            advance(p);
        } else if (tok_is_name(t, "not") && tok_is_name(peek(p, 1), "in")) {
            op = OP_NOTIN;
            advance(p);
            advance(p);
        } else
            break;
        if (rhs.n == sizeof ops) pfail(p, PGD_EUNSUPPORTED, t->off, "comparison chain too long");
        ops[rhs.n] = (uint8_t)op;
        nvec_push(p, &rhs, parse_math1(p));
    }
    if (!rhs.n) return first;
    node *n = mk(p, N_CMP, t0);
    n->a = first;
    n->kids = rhs.v;
    n->n = rhs.n;
    n->ops = aalloc(p, rhs.n);
    memcpy(n->ops, ops, rhs.n);
    return n;
}

static node *parse_not(P *p) {
    tok *t = cur(p);
    if (tok_is_name(t, "not")) {
        enter(p);
        advance(p);
        node *n = mk(p, N_NOT, t);
        n->a = parse_not(p);
        p->depth--;
        return n;
    }
    return parse_compare(p);
}

/* A left-associative chain `sub (kw sub)*` of kind `kind` ("and", "or"). */
static node *parse_chain(P *p, const char *kw, int kind, node *(*sub)(P *)) {
    int d0 = p->depth; /* each round of the loop deepens the tree */
    node *n = sub(p);
    for (tok *t; tok_is_name(t = cur(p), kw);) {
        enter(p);
        advance(p);
        node *x = mk(p, kind, t);
        x->a = n;
        x->b = sub(p);
        n = x;
    }
    p->depth = d0;
    return n;
}

static node *parse_and(P *p) { return parse_chain(p, "and", N_AND, parse_not); }

static node *parse_or(P *p) { return parse_chain(p, "or", N_OR, parse_and); }

static node *parse_expr(P *p, bool with_condexpr) {
    int d0 = p->depth; /* each round of the loop deepens the tree */
    enter(p);
    node *n = parse_or(p);
    if (with_condexpr)
        for (tok *t; tok_is_name(t = cur(p), "if");) {
            enter(p);
            advance(p);
            node *x = mk(p, N_COND, t);
            x->b = n;
            x->a = parse_or(p);
            if (accept_name(p, "else")) x->c = parse_expr(p, true);
            n = x;
        }
    p->depth = d0;
    return n;
}

/* Assignment targets: a name, names separated by commas (optionally parenthesized) or, when
 * ns_ok, name.attr. Fills n->names (and n->name/n->attr for ns.attr). */
static void parse_target(P *p, node *n, bool ns_ok, const char *extra_end) {
    tok *t = cur(p);
    if (ns_ok && t->kind == TK_NAME && tok_is_op(peek(p, 1), OP_DOT)) {
        n->name = expect_name(p);
        advance(p);
        n->attr = expect_name(p);
        return;
    }
    bool paren = accept_op(p, OP_LPAREN);
    jstr *names[MAX_ARGS];
    size_t k = 0;
    for (;;) {
        if (k == MAX_ARGS) pfail(p, PGD_EUNSUPPORTED, cur(p)->off, "too many assignment targets");
        tok *nt = cur(p);
        if (nt->kind != TK_NAME || tok_is_name(nt, "true") || tok_is_name(nt, "false") ||
            tok_is_name(nt, "none"))
            pfail(p, PGD_EFORMAT, nt->off, "can't assign to this target");
        names[k++] = expect_name(p);
        if (!accept_op(p, OP_COMMA)) break;
        tok *c = cur(p);
        if ((paren && tok_is_op(c, OP_RPAREN)) || (extra_end && tok_is_name(c, extra_end)) ||
            tok_is_op(c, OP_ASSIGN) || c->kind == TK_BEND) {
            if (k == 1) k = 1; /* "x," is a one-element tuple target */
            break;
        }
    }
    if (paren) expect_op(p, OP_RPAREN);
    n->names = aalloc(p, k * sizeof(jstr *));
    memcpy(n->names, names, k * sizeof(jstr *));
    n->nnames = k;
}

static node *parse_body(P *p, const char *const *ends);

static void end_block(P *p) { expect_kind(p, TK_BEND, "end of statement block"); }

/* The end of a tag that opens a body; jinja2 allows a Python-style ':' before it. */
static void begin_body(P *p) {
    accept_op(p, OP_COLON);
    end_block(p);
}

/* Parses body until one of ends; returns the end tag's name and consumes it (not its '%}'). */
static node *parse_until(P *p, const char *const *ends, const char **which) {
    node *b = parse_body(p, ends);
    tok *t = cur(p);
    *which = NULL;
    for (size_t i = 0; ends[i]; i++)
        if (tok_is_name(t, ends[i])) *which = ends[i];
    advance(p);
    return b;
}

static node *parse_statement(P *p) {
    tok *bt = cur(p); /* the BBEGIN */
    advance(p);
    tok *t = cur(p);
    if (t->kind != TK_NAME) unexpected(p, "a statement name");
    const char *which;
    node *n;
    enter(p);
    if (tok_is_name(t, "if")) {
        advance(p);
        n = mk(p, N_IF, bt);
        node *ifn = n;
        for (;;) {
            ifn->a = parse_tuple(p, false, false, NULL);
            begin_body(p);
            static const char *const ends[] = {"elif", "else", "endif", NULL};
            ifn->c = parse_until(p, ends, &which);
            if (!strcmp(which, "elif")) {
                node *e = mk(p, N_IF, cur(p));
                ifn->d = e;
                ifn = e;
                continue;
            }
            if (!strcmp(which, "else")) {
                begin_body(p);
                static const char *const ends2[] = {"endif", NULL};
                ifn->d = parse_until(p, ends2, &which);
            }
            break;
        }
    } else if (tok_is_name(t, "for")) {
        advance(p);
        n = mk(p, N_FOR, bt);
        parse_target(p, n, false, "in");
        if (!accept_name(p, "in")) unexpected(p, "'in'");
        n->a = parse_tuple(p, false, false, "recursive");
        if (accept_name(p, "if")) n->b = parse_expr(p, true);
        if (tok_is_name(cur(p), "recursive"))
            pfail(p, PGD_EUNSUPPORTED, cur(p)->off, "recursive loops are not supported");
        begin_body(p);
        static const char *const ends[] = {"endfor", "else", NULL};
        p->loop_depth++;
        n->c = parse_until(p, ends, &which);
        p->loop_depth--;
        if (!strcmp(which, "else")) {
            begin_body(p);
            static const char *const ends2[] = {"endfor", NULL};
            n->d = parse_until(p, ends2, &which);
        }
    } else if (tok_is_name(t, "set")) {
        advance(p);
        n = mk(p, N_SET, bt);
        parse_target(p, n, true, NULL);
        if (accept_op(p, OP_ASSIGN))
            n->b = parse_tuple(p, true, false, NULL);
        else {
            n->kind = N_SETBLOCK;
            if (tok_is_op(cur(p), OP_PIPE))
                pfail(p, PGD_EUNSUPPORTED, cur(p)->off, "filtered set blocks are not supported");
            begin_body(p);
            static const char *const ends[] = {"endset", NULL};
            n->c = parse_until(p, ends, &which);
        }
    } else if (tok_is_name(t, "macro")) {
        advance(p);
        n = mk(p, N_MACRO, bt);
        n->name = expect_name(p);
        expect_op(p, OP_LPAREN);
        jstr *names[MAX_ARGS];
        node *defs[MAX_ARGS];
        size_t k = 0;
        while (!tok_is_op(cur(p), OP_RPAREN)) {
            if (k) expect_op(p, OP_COMMA);
            if (tok_is_op(cur(p), OP_RPAREN)) break;
            if (k == MAX_ARGS) pfail(p, PGD_EUNSUPPORTED, cur(p)->off, "too many macro parameters");
            names[k] = expect_name(p);
            defs[k] = accept_op(p, OP_ASSIGN) ? parse_expr(p, true) : NULL;
            if (!defs[k] && k && defs[k - 1])
                pfail(p, PGD_EFORMAT, cur(p)->off, "non-default argument follows default argument");
            k++;
        }
        advance(p);
        n->names = aalloc(p, (k + 1) * sizeof(jstr *));
        n->kids2 = aalloc(p, (k + 1) * sizeof(node *));
        if (k) {
            memcpy(n->names, names, k * sizeof(jstr *));
            memcpy(n->kids2, defs, k * sizeof(node *));
        }
        n->nnames = k;
        begin_body(p);
        static const char *const ends[] = {"endmacro", NULL};
        int saved = p->loop_depth;
        p->loop_depth = 0;
        n->c = parse_until(p, ends, &which);
        p->loop_depth = saved;
    } else if (tok_is_name(t, "break") || tok_is_name(t, "continue")) {
        if (!p->loop_depth)
            pfail(p, PGD_EFORMAT, t->off, "'%.*s' outside of a loop", (int)t->n, t->s);
        n = mk(p, tok_is_name(t, "break") ? N_BREAK : N_CONTINUE, bt);
        advance(p);
    } else if (tok_is_name(t, "filter")) {
        advance(p);
        n = mk(p, N_FILTERBLOCK, bt);
        node *f = parse_filter(p, NULL);
        while (accept_op(p, OP_PIPE)) f = parse_filter(p, f);
        n->a = f;
        begin_body(p);
        static const char *const ends[] = {"endfilter", NULL};
        n->c = parse_until(p, ends, &which);
    } else if (tok_is_name(t, "with")) {
        advance(p);
        n = mk(p, N_WITH, bt);
        jstr *names[MAX_ARGS];
        node *vals[MAX_ARGS];
        size_t k = 0;
        while (cur(p)->kind != TK_BEND) {
            if (k) expect_op(p, OP_COMMA);
            if (k == MAX_ARGS) pfail(p, PGD_EUNSUPPORTED, cur(p)->off, "too many with targets");
            names[k] = expect_name(p);
            expect_op(p, OP_ASSIGN);
            vals[k++] = parse_expr(p, true);
        }
        n->names = aalloc(p, (k + 1) * sizeof(jstr *));
        n->kids2 = aalloc(p, (k + 1) * sizeof(node *));
        if (k) {
            memcpy(n->names, names, k * sizeof(jstr *));
            memcpy(n->kids2, vals, k * sizeof(node *));
        }
        n->nnames = k;
        begin_body(p);
        static const char *const ends[] = {"endwith", NULL};
        n->c = parse_until(p, ends, &which);
    } else if (tok_is_name(t, "generation") || tok_is_name(t, "block")) {
        /* HF's {% generation %} marks assistant text; {% block %} without inheritance renders
         * in place. Both are their body. */
        bool gen = tok_is_name(t, "generation");
        advance(p);
        if (!gen) expect_name(p);
        if (!gen && accept_name(p, "scoped")) {
        }
        begin_body(p);
        static const char *const ends_g[] = {"endgeneration", NULL}, *const ends_b[] = {"endblock",
                                                                                        NULL};
        n = parse_until(p, gen ? ends_g : ends_b, &which);
        if (!gen && cur(p)->kind == TK_NAME) advance(p);
    } else {
        pfail(p, PGD_EUNSUPPORTED, t->off, "unsupported or unknown tag '%.*s'",
              (int)(t->n < 40 ? t->n : 40), t->s);
    }
    end_block(p);
    p->depth--;
    return n;
}

/* Rejects unknown filters and tests as jinja2's compiler does: everywhere except in "soft"
 * frames (if tests and bodies, conditional expressions), where only reaching them fails. */
static void check_names(P *p, const node *n, bool soft) {
    if (!n) return;
    if ((n->kind == N_FILTER || n->kind == N_TEST) && n->fid < 0 && !soft)
        pfail(p, PGD_EUNSUPPORTED, n->off, "No %s named '%s'.",
              n->kind == N_FILTER ? "filter" : "test", n->name->s);
    bool in_soft = soft, body_soft = soft;
    switch (n->kind) {
    case N_IF:
    case N_COND: in_soft = body_soft = true; break;
    case N_FOR: body_soft = false; break; /* the iterable stays in the outer frame */
    case N_MACRO:
    case N_SETBLOCK:
    case N_FILTERBLOCK: in_soft = body_soft = false; break;
    case N_WITH: body_soft = false; break;
    default: break;
    }
    bool kids2_nodes = n->kind == N_CALL || n->kind == N_FILTER || n->kind == N_TEST ||
                       n->kind == N_DICT || n->kind == N_MACRO || n->kind == N_WITH;
    if (n->kind == N_FOR) {
        check_names(p, n->a, soft);
        check_names(p, n->b, false);
    } else {
        check_names(p, n->a, in_soft);
        check_names(p, n->b, in_soft);
    }
    check_names(p, n->c, body_soft);
    check_names(p, n->d, body_soft);
    for (size_t i = 0; i < n->n; i++) check_names(p, n->kids[i], in_soft);
    if (kids2_nodes)
        for (size_t i = 0; i < n->nnames; i++) check_names(p, n->kids2[i], in_soft);
}

static node *parse_body(P *p, const char *const *ends) {
    node *body = mk(p, N_BODY, cur(p));
    nvec v = {0};
    for (;;) {
        tok *t = cur(p);
        if (t->kind == TK_EOF) {
            if (ends) {
                char w[128];
                size_t o = 0;
                for (size_t i = 0; ends[i] && o < sizeof w - 40; i++)
                    o += (size_t)snprintf(w + o, sizeof w - o, "%s'%s'", i ? " or " : "", ends[i]);
                pfail(p, PGD_EFORMAT, t->off, "unexpected end of template, expected %s", w);
            }
            break;
        }
        if (t->kind == TK_DATA) {
            node *d = mk(p, N_DATA, t);
            d->cval = (jv){.t = T_STR, .u.s = imm_str(p, t->s, t->n)};
            nvec_push(p, &v, d);
            advance(p);
        } else if (t->kind == TK_VBEGIN) {
            advance(p);
            node *o = mk(p, N_OUTPUT, t);
            o->a = parse_tuple(p, true, false, NULL);
            expect_kind(p, TK_VEND, "end of print statement");
            nvec_push(p, &v, o);
        } else if (t->kind == TK_BBEGIN) {
            tok *nt = peek(p, 1);
            bool is_end = false;
            for (size_t i = 0; ends && ends[i]; i++)
                if (tok_is_name(nt, ends[i])) is_end = true;
            if (is_end) {
                advance(p);
                break;
            }
            if (nt->kind == TK_NAME && nt->n > 3 &&
                (!memcmp(nt->s, "end", 3) || tok_is_name(nt, "elif") || tok_is_name(nt, "else")))
                pfail(p, PGD_EFORMAT, nt->off, "unexpected '%.*s'", (int)(nt->n < 40 ? nt->n : 40),
                      nt->s);
            nvec_push(p, &v, parse_statement(p));
        } else {
            char b[64];
            pfail(p, PGD_EFORMAT, t->off, "unexpected %s", tok_desc(t, b, sizeof b));
        }
    }
    body->kids = v.v;
    body->n = v.n;
    return body;
}

/* ============================================================================ evaluator == */

static jv eval(R *r, const node *n);
static void exec(R *r, const node *n);

static bool truthy(jv v) {
    switch (v.t) {
    case T_UNDEF:
    case T_NONE: return false;
    case T_BOOL: return v.u.b;
    case T_INT: return v.u.i != 0;
    case T_FLOAT: return v.u.f != 0;
    case T_STR: return v.u.s->len != 0;
    case T_LIST: return v.u.l->n != 0;
    case T_DICT: return v.u.d->n != 0;
    default: return true;
    }
}

static bool is_num(jv v) { return v.t == T_INT || v.t == T_FLOAT || v.t == T_BOOL; }
static bool is_intlike(jv v) { return v.t == T_INT || v.t == T_BOOL; }
static int64_t as_int(jv v) { return v.t == T_BOOL ? v.u.b : v.u.i; }
static double as_f(jv v) { return v.t == T_FLOAT ? v.u.f : (double)as_int(v); }

static bool py_eq(const jv a, const jv b) {
    if (is_num(a) && is_num(b)) {
        if (is_intlike(a) && is_intlike(b)) return as_int(a) == as_int(b);
        return as_f(a) == as_f(b);
    }
    if (a.t != b.t) return false;
    switch (a.t) {
    case T_UNDEF:
    case T_NONE: return true;
    case T_STR: return a.u.s->len == b.u.s->len && !memcmp(a.u.s->s, b.u.s->s, a.u.s->len);
    case T_LIST:
        if (a.u.l->tuple != b.u.l->tuple || a.u.l->n != b.u.l->n) return false;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!py_eq(a.u.l->v[i], b.u.l->v[i])) return false;
        return true;
    case T_DICT:
        if (a.u.d->n != b.u.d->n) return false;
        for (size_t i = 0; i < a.u.d->n; i++) {
            long j = dict_find(b.u.d, a.u.d->k[i]);
            if (j < 0 || !py_eq(a.u.d->v[i], b.u.d->v[j])) return false;
        }
        return true;
    case T_NS: return a.u.d == b.u.d;
    case T_LOOP: return a.u.lp == b.u.lp;
    case T_MACRO: return a.u.m == b.u.m;
    case T_FUNC: return a.u.fn == b.u.fn;
    default: return false;
    }
}

static int lower_ascii(int c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }

/* Python's a < b as -1/0/1; TypeError for types Python cannot order. ci: compare strings
 * case-insensitively (jinja's sort/unique/min/max default). */
static int cmp_ci(R *r, jv a, jv b, bool ci) {
    if (is_num(a) && is_num(b)) {
        if (is_intlike(a) && is_intlike(b))
            return (as_int(a) > as_int(b)) - (as_int(a) < as_int(b));
        double x = as_f(a), y = as_f(b);
        return (x > y) - (x < y);
    }
    if (a.t == T_STR && b.t == T_STR) {
        size_t n = a.u.s->len < b.u.s->len ? a.u.s->len : b.u.s->len;
        for (size_t i = 0; i < n; i++) {
            int x = (unsigned char)a.u.s->s[i], y = (unsigned char)b.u.s->s[i];
            if (ci) {
                x = lower_ascii(x);
                y = lower_ascii(y);
            }
            if (x != y) return x < y ? -1 : 1;
        }
        return (a.u.s->len > b.u.s->len) - (a.u.s->len < b.u.s->len);
    }
    if (a.t == T_LIST && b.t == T_LIST && a.u.l->tuple == b.u.l->tuple) {
        size_t n = a.u.l->n < b.u.l->n ? a.u.l->n : b.u.l->n;
        for (size_t i = 0; i < n; i++)
            if (!py_eq(a.u.l->v[i], b.u.l->v[i])) return cmp_ci(r, a.u.l->v[i], b.u.l->v[i], ci);
        return (a.u.l->n > b.u.l->n) - (a.u.l->n < b.u.l->n);
    }
    TYPE_ERR(r, "'<' not supported between instances of '%s' and '%s'", type_name(a), type_name(b));
}

static jv attr_path(R *r, jv item, const jstr *path);

static void reverse_jv(jv *a, size_t n) {
    for (size_t i = 0; i < n / 2; i++) {
        jv t = a[i];
        a[i] = a[n - 1 - i];
        a[n - 1 - i] = t;
    }
}

static void sort_jv(R *r, jv *a, size_t n, const jstr *path, bool ci, bool reverse) {
    if (n < 2) return;
    if (reverse) reverse_jv(a, n);
    /* Merge sort (stable, like Python's) on indices. The scratch space lives in list objects,
     * so a comparison that raises leaks nothing. A jv slot holds two size_t. */
    jv scratch = v_list(r, n), keys = v_list(r, n);
    size_t *idx = (size_t *)(void *)scratch.u.l->v, *buf = idx + n;
    for (size_t i = 0; i < n; i++)
        list_push(r, keys.u.l, path ? attr_path(r, a[i], path) : ref(a[i]));
    for (size_t i = 0; i < n; i++) idx[i] = i;
    const jv *kv = keys.u.l->v;
    for (size_t w = 1; w < n; w *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * w) {
            size_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            size_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi)
                buf[k++] = cmp_ci(r, kv[idx[j]], kv[idx[i]], ci) < 0 ? idx[j++] : idx[i++];
            while (i < mid) buf[k++] = idx[i++];
            while (j < hi) buf[k++] = idx[j++];
        }
        memcpy(idx, buf, n * sizeof(size_t));
    }
    for (size_t i = 0; i < n; i++) unref(r, keys.u.l->v[i]);
    jv *out = keys.u.l->v;
    for (size_t i = 0; i < n; i++) out[i] = a[idx[i]];
    memcpy(a, out, n * sizeof(jv));
    keys.u.l->n = 0; /* its slots were scratch; the references moved back into a */
    unref(r, keys);
    unref(r, scratch);
    if (reverse) reverse_jv(a, n);
}

/* ------------------------------------------------------------------ strings and case --- */

/* Simple case mapping for ASCII, Latin-1, Latin Extended-A, Greek and Cyrillic (Python maps
 * all of Unicode; templates only ever case-map role names and keywords). */
static uint32_t cp_upper(uint32_t c) {
    if (c >= 'a' && c <= 'z') return c - 32;
    if (c < 0x80) return c;
    if ((c >= 0xE0 && c <= 0xFE && c != 0xF7)) return c - 32;
    if (c == 0xFF) return 0x178;
    if (c >= 0x100 && c <= 0x17F && c != 0x130 && c != 0x131 && c != 0x138 && c != 0x149 &&
        c != 0x17F) {
        bool odd_lower = (c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E);
        if (odd_lower ? (c & 1) == 0 : (c & 1) == 1) return c - 1;
        return c;
    }
    if (c >= 0x3B1 && c <= 0x3C9 && c != 0x3C2) return c - 32;
    if (c == 0x3C2) return 0x3A3;
    if (c >= 0x430 && c <= 0x44F) return c - 32;
    if (c >= 0x450 && c <= 0x45F) return c - 80;
    return c;
}

static uint32_t cp_lower(uint32_t c) {
    if (c >= 'A' && c <= 'Z') return c + 32;
    if (c < 0x80) return c;
    if ((c >= 0xC0 && c <= 0xDE && c != 0xD7)) return c + 32;
    if (c == 0x178) return 0xFF;
    if (c >= 0x100 && c <= 0x17F && c != 0x130 && c != 0x131 && c != 0x138 && c != 0x149 &&
        c != 0x17F) {
        bool odd_lower = (c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E);
        if (odd_lower ? (c & 1) == 1 : (c & 1) == 0) return c + 1;
        return c;
    }
    if (c >= 0x391 && c <= 0x3A9 && c != 0x3A2) return c + 32;
    if (c >= 0x410 && c <= 0x42F) return c + 32;
    if (c >= 0x400 && c <= 0x40F) return c + 80;
    return c;
}

static bool cp_cased(uint32_t c) { return cp_upper(c) != c || cp_lower(c) != c; }

enum { CASE_UPPER, CASE_LOWER, CASE_TITLE, CASE_CAPITALIZE, CASE_SWAP, CASE_JTITLE };

/* Python's upper/lower/title/capitalize/swapcase, and jinja's title filter (CASE_JTITLE:
 * words start after whitespace, '-', '(', '{', '[' or '<'). */
static jv str_case(R *r, jv s, int mode) {
    sb *b = sb_new(r, s.u.s->len + 4);
    const char *p = s.u.s->s, *end = p + s.u.s->len;
    bool prev_cased = false, first = true;
    while (p < end) {
        size_t l = u8_len(p, end);
        uint32_t c = u8_decode(p, l), o = c;
        if (l == 1 && (unsigned char)*p >= 0x80) { /* invalid byte: copy */
            sb_put(r, b, p, 1);
            p++;
            continue;
        }
        switch (mode) {
        case CASE_UPPER: o = cp_upper(c); break;
        case CASE_LOWER: o = cp_lower(c); break;
        case CASE_SWAP: o = cp_upper(c) != c ? cp_upper(c) : cp_lower(c); break;
        case CASE_CAPITALIZE: o = first ? cp_upper(c) : cp_lower(c); break;
        case CASE_TITLE:
            o = prev_cased ? cp_lower(c) : cp_upper(c);
            prev_cased = cp_cased(c);
            break;
        case CASE_JTITLE:
            o = prev_cased ? cp_lower(c) : cp_upper(c);
            prev_cased = !(cp_space(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<');
            break;
        }
        first = false;
        char enc[4];
        if (o == c)
            sb_put(r, b, p, l);
        else
            sb_put(r, b, enc, (size_t)pgd__utf8_encode(o, enc));
        p += l;
    }
    return sb_take(r, b);
}

/* Byte offsets of the code points of s (n + 1 entries, the last is len) in a scratch list. */
static size_t *cp_offsets(R *r, const jstr *s, size_t *n, jv *holder) {
    size_t cnt = u8_count(s->s, s->len);
    *holder = v_list(r, cnt / 2 + 1);
    size_t *off = (size_t *)(void *)holder->u.l->v, k = 0;
    for (size_t i = 0; i < s->len; i += u8_len(s->s + i, s->s + s->len)) off[k++] = i;
    off[k] = s->len;
    *n = cnt;
    return off;
}

/* Characters of a strip() set: NULL = whitespace. */
static bool in_chars(uint32_t c, const jstr *chars) {
    if (!chars) return cp_space(c);
    const char *p = chars->s, *end = p + chars->len;
    while (p < end) {
        size_t l = u8_len(p, end);
        if (u8_decode(p, l) == c) return true;
        p += l;
    }
    return false;
}

static jv str_strip(R *r, jv s, const jstr *chars, bool left, bool right) {
    const char *p = s.u.s->s, *end = p + s.u.s->len;
    const char *a = p, *b = end;
    if (left)
        while (a < b) {
            size_t l = u8_len(a, b);
            if (!in_chars(u8_decode(a, l), chars)) break;
            a += l;
        }
    if (right) {
        /* scan forward remembering the end of the last character not in the set */
        const char *q = a, *keep = a;
        while (q < b) {
            size_t l = u8_len(q, b);
            bool in = in_chars(u8_decode(q, l), chars);
            q += l;
            if (!in) keep = q;
        }
        b = keep;
    }
    if (a == p && b == end) return ref(s);
    return v_str(r, a, (size_t)(b - a));
}

static const char *memfind(const char *h, size_t hn, const char *n, size_t nn) {
    if (!nn) return h;
    if (nn > hn) return NULL;
    for (size_t i = 0; i + nn <= hn; i++)
        if (h[i] == n[0] && !memcmp(h + i, n, nn)) return h + i;
    return NULL;
}

static const char *memrfind(const char *h, size_t hn, const char *n, size_t nn) {
    if (nn > hn) return NULL;
    for (size_t i = hn - nn + 1; i-- > 0;)
        if (!memcmp(h + i, n, nn)) return h + i;
    return NULL;
}

static jv str_replace(R *r, jv s, jv old, jv nw, int64_t count) {
    const jstr *S = s.u.s, *O = old.u.s, *N = nw.u.s;
    sb *b = sb_new(r, S->len);
    if (!O->len) { /* Python inserts new between every character (and at both ends) */
        const char *p = S->s, *end = p + S->len;
        int64_t done = 0;
        for (;;) {
            if (count < 0 || done < count) {
                sb_put(r, b, N->s, N->len);
                done++;
            }
            if (p >= end) break;
            size_t l = u8_len(p, end);
            sb_put(r, b, p, l);
            p += l;
        }
        return sb_take(r, b);
    }
    size_t i = 0;
    int64_t done = 0;
    while (i < S->len && (count < 0 || done < count)) {
        const char *f = memfind(S->s + i, S->len - i, O->s, O->len);
        if (!f) break;
        sb_put(r, b, S->s + i, (size_t)(f - S->s) - i);
        sb_put(r, b, N->s, N->len);
        i = (size_t)(f - S->s) + O->len;
        done++;
    }
    sb_put(r, b, S->s + i, S->len - i);
    return sb_take(r, b);
}

/* Python's str.split / rsplit (sep NULL: runs of whitespace). */
static jv str_split(R *r, jv s, const jstr *sep, int64_t maxsplit, bool from_right) {
    const char *p = s.u.s->s;
    size_t n = s.u.s->len;
    jv out = v_list(r, 0);
    if (sep && !sep->len) TYPE_ERR(r, "empty separator");
    if (!from_right) {
        size_t i = 0;
        int64_t done = 0;
        if (!sep) {
            for (;;) {
                while (i < n && ws_len(p + i, p + n)) i += ws_len(p + i, p + n);
                if (i >= n) break;
                if (maxsplit >= 0 && done >= maxsplit) {
                    list_push(r, out.u.l, v_str(r, p + i, rstrip_len(p + i, n - i)));
                    break;
                }
                size_t j = i;
                while (j < n && !ws_len(p + j, p + n)) j += u8_len(p + j, p + n);
                list_push(r, out.u.l, v_str(r, p + i, j - i));
                done++;
                i = j;
            }
            return out;
        }
        for (;;) {
            const char *f =
                (maxsplit < 0 || done < maxsplit) ? memfind(p + i, n - i, sep->s, sep->len) : NULL;
            if (!f) {
                list_push(r, out.u.l, v_str(r, p + i, n - i));
                return out;
            }
            list_push(r, out.u.l, v_str(r, p + i, (size_t)(f - p) - i));
            i = (size_t)(f - p) + sep->len;
            done++;
        }
    }
    /* from the right: collect pieces backwards, then reverse */
    size_t e = n;
    int64_t done = 0;
    if (!sep) {
        for (;;) {
            while (e > 0 && cp_space((unsigned char)p[e - 1])) e--; /* ASCII whitespace only */
            if (!e) break;
            if (maxsplit >= 0 && done >= maxsplit) {
                size_t a = 0;
                while (a < e && ws_len(p + a, p + e)) a += ws_len(p + a, p + e);
                list_push(r, out.u.l, v_str(r, p + a, e - a));
                break;
            }
            size_t b = e;
            while (b > 0 && !cp_space((unsigned char)p[b - 1])) b--;
            list_push(r, out.u.l, v_str(r, p + b, e - b));
            done++;
            e = b;
        }
    } else {
        for (;;) {
            const char *f =
                (maxsplit < 0 || done < maxsplit) ? memrfind(p, e, sep->s, sep->len) : NULL;
            if (!f) {
                list_push(r, out.u.l, v_str(r, p, e));
                break;
            }
            size_t fi = (size_t)(f - p);
            list_push(r, out.u.l, v_str(r, p + fi + sep->len, e - fi - sep->len));
            e = fi;
            done++;
        }
    }
    jlist *l = out.u.l;
    for (size_t i = 0; i < l->n / 2; i++) {
        jv t = l->v[i];
        l->v[i] = l->v[l->n - 1 - i];
        l->v[l->n - 1 - i] = t;
    }
    return out;
}

static jv str_concat(R *r, const jstr *a, const jstr *b) {
    jv s = str_alloc(r, a->len + b->len);
    memcpy(s.u.s->s, a->s, a->len);
    memcpy(s.u.s->s + a->len, b->s, b->len);
    return s;
}

/* ---------------------------------------------------------------- access and iteration --- */

static _Noreturn void undefined_err(R *r, jv v) {
    if (v.u.hint) fail(r, PGD_EINVAL, "'%s' is undefined", v.u.hint);
    fail(r, PGD_EINVAL, "undefined value used");
}

static jv loop_attr(R *r, const jloop *lp, const char *name) {
    int64_t n = (int64_t)lp->items->n, i = lp->index0;
    if (!strcmp(name, "index")) return v_int(i + 1);
    if (!strcmp(name, "index0")) return v_int(i);
    if (!strcmp(name, "first")) return v_bool(i == 0);
    if (!strcmp(name, "last")) return v_bool(i == n - 1);
    if (!strcmp(name, "length")) return v_int(n);
    if (!strcmp(name, "revindex")) return v_int(n - i);
    if (!strcmp(name, "revindex0")) return v_int(n - i - 1);
    if (!strcmp(name, "depth")) return v_int(lp->depth0 + 1);
    if (!strcmp(name, "depth0")) return v_int(lp->depth0);
    if (!strcmp(name, "previtem")) return i > 0 ? ref(lp->items->v[i - 1]) : v_undef("previtem");
    if (!strcmp(name, "nextitem"))
        return i + 1 < n ? ref(lp->items->v[i + 1]) : v_undef("nextitem");
    (void)r;
    return v_undef(NULL);
}

/* obj.name (jinja2 getattr: an attribute, else the item). */
static jv getattr_v(R *r, jv obj, const char *name) {
    switch (obj.t) {
    case T_UNDEF: undefined_err(r, obj);
    case T_DICT:
    case T_NS: {
        jv *v = dict_get(obj.u.d, name);
        return v ? ref(*v) : v_undef(NULL);
    }
    case T_LOOP: return loop_attr(r, obj.u.lp, name);
    default: return v_undef(NULL);
    }
}

static bool index_of(int64_t i, size_t n, size_t *out) {
    if (i < 0) i += (int64_t)n;
    if (i < 0 || (uint64_t)i >= n) return false;
    *out = (size_t)i;
    return true;
}

/* obj[key] (jinja2 getitem: the item, else for a string key the attribute). */
static jv getitem_v(R *r, jv obj, jv key) {
    size_t k;
    switch (obj.t) {
    case T_UNDEF: undefined_err(r, obj);
    case T_DICT:
    case T_NS: {
        long i = dict_find(obj.u.d, key);
        return i >= 0 ? ref(obj.u.d->v[i]) : v_undef(NULL);
    }
    case T_LIST:
        if (is_intlike(key) && index_of(as_int(key), obj.u.l->n, &k)) return ref(obj.u.l->v[k]);
        return v_undef(NULL);
    case T_STR:
        if (is_intlike(key)) {
            const jstr *s = obj.u.s;
            if (is_ascii(s->s, s->len))
                return index_of(as_int(key), s->len, &k) ? v_str(r, s->s + k, 1) : v_undef(NULL);
            jv h;
            size_t n, *off = cp_offsets(r, s, &n, &h);
            jv out = index_of(as_int(key), n, &k) ? v_str(r, s->s + off[k], off[k + 1] - off[k])
                                                  : v_undef(NULL);
            unref(r, h);
            return out;
        }
        return v_undef(NULL);
    case T_LOOP:
        if (key.t == T_STR) return loop_attr(r, obj.u.lp, key.u.s->s);
        return v_undef(NULL);
    default: return v_undef(NULL);
    }
}

/* Python's slice.indices(): fills start and step and returns the element count. */
static size_t slice_indices(R *r, jv js, jv je, jv jst, size_t len, int64_t *start, int64_t *step) {
    int64_t n = (int64_t)len, st = 1, a, b;
    for (int i = 0; i < 3; i++) {
        jv x = i == 0 ? js : i == 1 ? je : jst;
        if (x.t != T_NONE && !is_intlike(x))
            TYPE_ERR(r, "slice indices must be integers or None or have an __index__ method");
    }
    if (is_intlike(jst)) st = as_int(jst);
    if (st == 0) TYPE_ERR(r, "slice step cannot be zero");
    int64_t lower = st < 0 ? -1 : 0, upper = st < 0 ? n - 1 : n;
    if (!is_intlike(js))
        a = st < 0 ? upper : lower;
    else {
        a = as_int(js);
        if (a < 0)
            a = a + n < lower ? lower : a + n;
        else if (a > upper)
            a = upper;
    }
    if (!is_intlike(je))
        b = st < 0 ? lower : upper;
    else {
        b = as_int(je);
        if (b < 0)
            b = b + n < lower ? lower : b + n;
        else if (b > upper)
            b = upper;
    }
    *start = a;
    *step = st;
    if (st > 0) return b > a ? (size_t)((b - a - 1) / st + 1) : 0;
    return a > b ? (size_t)((a - b - 1) / (-st) + 1) : 0;
}

static jv slice_v(R *r, jv obj, jv a, jv b, jv c) {
    int64_t start, st;
    if (obj.t == T_UNDEF) undefined_err(r, obj);
    if (obj.t == T_LIST) {
        size_t cnt = slice_indices(r, a, b, c, obj.u.l->n, &start, &st);
        jv out = v_list(r, cnt);
        out.u.l->tuple = obj.u.l->tuple;
        for (size_t i = 0; i < cnt; i++)
            list_push(r, out.u.l, ref(obj.u.l->v[start + (int64_t)i * st]));
        return out;
    }
    if (obj.t == T_STR) {
        const jstr *s = obj.u.s;
        if (is_ascii(s->s, s->len)) {
            size_t cnt = slice_indices(r, a, b, c, s->len, &start, &st);
            if (st == 1) return v_str(r, s->s + start, cnt);
            jv out = str_alloc(r, cnt);
            for (size_t i = 0; i < cnt; i++) out.u.s->s[i] = s->s[start + (int64_t)i * st];
            return out;
        }
        jv h;
        size_t n, *off = cp_offsets(r, s, &n, &h);
        size_t cnt = slice_indices(r, a, b, c, n, &start, &st);
        sb *bld = sb_new(r, 0);
        for (size_t i = 0; i < cnt; i++) {
            size_t k = (size_t)(start + (int64_t)i * st);
            sb_put(r, bld, s->s + off[k], off[k + 1] - off[k]);
        }
        unref(r, h);
        return sb_take(r, bld);
    }
    return v_undef(NULL);
}

/* The elements `for x in v` visits, as a list (new reference). */
static jv iter_list(R *r, jv v) {
    switch (v.t) {
    case T_UNDEF: return v_list(r, 0);
    case T_LIST: return ref(v);
    case T_DICT: {
        jv l = v_list(r, v.u.d->n);
        for (size_t i = 0; i < v.u.d->n; i++) list_push(r, l.u.l, ref(v.u.d->k[i]));
        return l;
    }
    case T_STR: {
        jv l = v_list(r, 0);
        const char *p = v.u.s->s, *end = p + v.u.s->len;
        while (p < end) {
            size_t n = u8_len(p, end);
            list_push(r, l.u.l, v_str(r, p, n));
            p += n;
        }
        return l;
    }
    case T_LOOP: return ref((jv){.t = T_LIST, .u.l = v.u.lp->items});
    default: TYPE_ERR(r, "'%s' object is not iterable", type_name(v));
    }
}

static bool py_in(R *r, jv x, jv container) {
    switch (container.t) {
    case T_STR:
        if (x.t != T_STR)
            TYPE_ERR(r, "'in <string>' requires string as left operand, not %s", type_name(x));
        return memfind(container.u.s->s, container.u.s->len, x.u.s->s, x.u.s->len) != NULL;
    case T_LIST:
        for (size_t i = 0; i < container.u.l->n; i++)
            if (py_eq(container.u.l->v[i], x)) return true;
        return false;
    case T_DICT: return dict_find(container.u.d, x) >= 0;
    case T_UNDEF: return false;
    default: TYPE_ERR(r, "argument of type '%s' is not iterable", type_name(container));
    }
}

static size_t py_len(R *r, jv v) {
    switch (v.t) {
    case T_UNDEF: return 0;
    case T_STR: return u8_count(v.u.s->s, v.u.s->len);
    case T_LIST: return v.u.l->n;
    case T_DICT:
    case T_NS: return v.u.d->n;
    case T_LOOP: return v.u.lp->items->n;
    default: TYPE_ERR(r, "object of type '%s' has no len()", type_name(v));
    }
}

/* ------------------------------------------------------------------------- arithmetic --- */

static _Noreturn void binop_type_err(R *r, int op, jv a, jv b) {
    if (a.t == T_UNDEF) undefined_err(r, a);
    if (b.t == T_UNDEF) undefined_err(r, b);
    if (op == OP_ADD && a.t == T_STR)
        TYPE_ERR(r, "can only concatenate str (not \"%s\") to str", type_name(b));
    if (op == OP_ADD && a.t == T_LIST)
        TYPE_ERR(r, "can only concatenate %s (not \"%s\") to %s", type_name(a), type_name(b),
                 type_name(a));
    TYPE_ERR(r, "unsupported operand type(s) for %s: '%s' and '%s'", op_text[op], type_name(a),
             type_name(b));
}

static jv repeat(R *r, jv seq, int64_t times) {
    if (times < 0) times = 0;
    if (seq.t == T_STR) {
        size_t n = seq.u.s->len;
        if (n && (uint64_t)times > r->max_out / n)
            fail(r, PGD_ERANGE, "a string exceeds the output limit of %zu bytes", r->max_out);
        jv out = str_alloc(r, n * (size_t)times);
        for (int64_t i = 0; i < times; i++) memcpy(out.u.s->s + (size_t)i * n, seq.u.s->s, n);
        return out;
    }
    size_t n = seq.u.l->n;
    if (n && (uint64_t)times > r->max_mem / (n * sizeof(jv)))
        fail(r, PGD_ERANGE, "template needs more than %zu bytes of memory", r->max_mem);
    jv out = v_list(r, n * (size_t)times);
    out.u.l->tuple = seq.u.l->tuple;
    for (int64_t t = 0; t < times; t++)
        for (size_t i = 0; i < n; i++) list_push(r, out.u.l, ref(seq.u.l->v[i]));
    return out;
}

static jv py_format(R *r, jv fmt, jv args);

static double py_fmod(double a, double b) {
    double m = fmod(a, b);
    if (m != 0 && ((m < 0) != (b < 0))) m += b;
    return m;
}

static jv arith(R *r, int op, jv a, jv b) {
    if (is_num(a) && is_num(b)) {
        bool ints = is_intlike(a) && is_intlike(b);
        int64_t x = ints ? as_int(a) : 0, y = ints ? as_int(b) : 0, z;
        double fx = as_f(a), fy = as_f(b);
        switch (op) {
        case OP_ADD:
            if (!ints) return v_float(fx + fy);
            if (__builtin_add_overflow(x, y, &z)) break;
            return v_int(z);
        case OP_SUB:
            if (!ints) return v_float(fx - fy);
            if (__builtin_sub_overflow(x, y, &z)) break;
            return v_int(z);
        case OP_MUL:
            if (!ints) return v_float(fx * fy);
            if (__builtin_mul_overflow(x, y, &z)) break;
            return v_int(z);
        case OP_DIV:
            if (fy == 0) TYPE_ERR(r, "division by zero");
            return v_float(fx / fy);
        case OP_FLOORDIV:
            if (ints) {
                if (y == 0) TYPE_ERR(r, "integer division or modulo by zero");
                if (x == INT64_MIN && y == -1) break;
                int64_t q = x / y;
                if ((x % y != 0) && ((x < 0) != (y < 0))) q--;
                return v_int(q);
            }
            if (fy == 0) TYPE_ERR(r, "float floor division by zero");
            return v_float(floor(fx / fy));
        case OP_MOD:
            if (ints) {
                if (y == 0) TYPE_ERR(r, "integer division or modulo by zero");
                if (y == -1) return v_int(0);
                int64_t m = x % y;
                if (m != 0 && ((m < 0) != (y < 0))) m += y;
                return v_int(m);
            }
            if (fy == 0) TYPE_ERR(r, "float modulo");
            return v_float(py_fmod(fx, fy));
        case OP_POW:
            if (ints && y >= 0) {
                int64_t res = 1, base = x;
                bool ovf = false;
                for (int64_t e = y; e > 0 && !ovf; e >>= 1) {
                    if (e & 1) ovf |= __builtin_mul_overflow(res, base, &res);
                    if (e > 1) ovf |= __builtin_mul_overflow(base, base, &base);
                }
                if (ovf) break;
                return v_int(res);
            }
            if (fx == 0 && fy < 0) TYPE_ERR(r, "0.0 cannot be raised to a negative power");
            return v_float(pow(fx, fy));
        }
        fail(r, PGD_ERANGE, "integer overflow in '%s'", op_text[op]);
    }
    if (op == OP_ADD) {
        if (a.t == T_STR && b.t == T_STR) return str_concat(r, a.u.s, b.u.s);
        if (a.t == T_LIST && b.t == T_LIST && a.u.l->tuple == b.u.l->tuple) {
            jv out = v_list(r, a.u.l->n + b.u.l->n);
            out.u.l->tuple = a.u.l->tuple;
            for (size_t i = 0; i < a.u.l->n; i++) list_push(r, out.u.l, ref(a.u.l->v[i]));
            for (size_t i = 0; i < b.u.l->n; i++) list_push(r, out.u.l, ref(b.u.l->v[i]));
            return out;
        }
    }
    if (op == OP_MUL) {
        if ((a.t == T_STR || a.t == T_LIST) && is_intlike(b)) return repeat(r, a, as_int(b));
        if ((b.t == T_STR || b.t == T_LIST) && is_intlike(a)) return repeat(r, b, as_int(a));
    }
    if (op == OP_MOD && a.t == T_STR) return py_format(r, a, b);
    binop_type_err(r, op, a, b);
}

/* Python's printf-style "fmt % args" for %s %r %d %i %f %x %% (flags and width too). */
static jv py_format(R *r, jv fmt, jv args) {
    const jv *av = &args;
    size_t an = 1, ai = 0;
    if (args.t == T_LIST && args.u.l->tuple) {
        av = args.u.l->v;
        an = args.u.l->n;
    }
    bool mapping = args.t == T_DICT;
    sb *b = sb_new(r, fmt.u.s->len + 16);
    const char *p = fmt.u.s->s, *end = p + fmt.u.s->len;
    while (p < end) {
        const char *pc = memchr(p, '%', (size_t)(end - p));
        if (!pc) {
            sb_put(r, b, p, (size_t)(end - p));
            break;
        }
        sb_put(r, b, p, (size_t)(pc - p));
        p = pc + 1;
        if (p < end && *p == '%') {
            sb_putc(r, b, '%');
            p++;
            continue;
        }
        jv arg = v_none();
        bool have = false;
        if (p < end && *p == '(' && mapping) {
            const char *q = memchr(p, ')', (size_t)(end - p));
            if (!q) TYPE_ERR(r, "incomplete format key");
            long i = dict_find_str(args.u.d, p + 1, (size_t)(q - p - 1));
            if (i < 0) TYPE_ERR(r, "format key not found");
            arg = args.u.d->v[i];
            have = true;
            p = q + 1;
        }
        char spec[32];
        size_t sn = 0;
        spec[sn++] = '%';
        while (p < end && strchr("-+ #0", *p) && sn < 8) spec[sn++] = *p++;
        while (p < end && is_digit(*p) && sn < 16) spec[sn++] = *p++;
        if (p < end && *p == '.') {
            spec[sn++] = *p++;
            while (p < end && is_digit(*p) && sn < 24) spec[sn++] = *p++;
        }
        if (p >= end) TYPE_ERR(r, "incomplete format");
        char conv = *p++;
        if (!have) {
            if (mapping && an == 1 && ai == 0)
                arg = args;
            else if (ai >= an)
                TYPE_ERR(r, "not enough arguments for format string");
            else
                arg = av[ai++];
            if (!mapping) have = true;
        }
        char out[128];
        switch (conv) {
        case 's':
        case 'r': {
            sb *t = sb_new(r, 0);
            to_str_into(r, t, arg, conv == 'r');
            jv s = sb_take(r, t);
            spec[sn++] = 's';
            spec[sn] = 0;
            if (sn == 2)
                sb_put(r, b, s.u.s->s, s.u.s->len);
            else {
                int need = snprintf(NULL, 0, spec, s.u.s->s);
                if (need > 0 && (size_t)need < sizeof out) {
                    snprintf(out, sizeof out, spec, s.u.s->s);
                    sb_puts(r, b, out);
                } else
                    sb_put(r, b, s.u.s->s, s.u.s->len);
            }
            unref(r, s);
            break;
        }
        case 'd':
        case 'i':
        case 'x':
        case 'X':
        case 'o':
            if (!is_num(arg))
                TYPE_ERR(r, "%%%c format: a number is required, not %s", conv, type_name(arg));
            memcpy(spec + sn, "ll", 2);
            sn += 2;
            spec[sn++] = conv == 'i' ? 'd' : conv;
            spec[sn] = 0;
            snprintf(out, sizeof out, spec,
                     (long long)(arg.t == T_FLOAT ? (int64_t)arg.u.f : as_int(arg)));
            sb_puts(r, b, out);
            break;
        case 'f':
        case 'F':
        case 'e':
        case 'E':
        case 'g':
        case 'G':
            if (!is_num(arg)) TYPE_ERR(r, "must be real number, not %s", type_name(arg));
            spec[sn++] = conv;
            spec[sn] = 0;
            snprintf(out, sizeof out, spec, as_f(arg));
            sb_puts(r, b, out);
            break;
        default: TYPE_ERR(r, "unsupported format character '%c'", conv);
        }
    }
    if (!mapping && ai < an) TYPE_ERR(r, "not all arguments converted during string formatting");
    return sb_take(r, b);
}

/* ------------------------------------------------------------------------- call args --- */

typedef struct args {
    size_t n, nk;
    jv pos[MAX_ARGS];
    const jstr *kn[MAX_ARGS];
    jv kv[MAX_ARGS];
} args;

static void eval_args(R *r, const node *n, args *a) {
    a->n = a->nk = 0;
    for (size_t i = 0; i < n->n; i++) a->pos[a->n++] = eval(r, n->kids[i]);
    for (size_t i = 0; i < n->nnames; i++) {
        a->kn[a->nk] = n->names[i];
        a->kv[a->nk++] = eval(r, n->kids2[i]);
    }
}

static void free_args(R *r, args *a) {
    for (size_t i = 0; i < a->n; i++) unref(r, a->pos[i]);
    for (size_t i = 0; i < a->nk; i++) unref(r, a->kv[i]);
    a->n = a->nk = 0;
}

/* Argument i of a call: positional i, else the keyword name; NULL if not given. */
static const jv *argp(const args *a, size_t i, const char *name) {
    if (i < a->n) return &a->pos[i];
    for (size_t k = 0; k < a->nk; k++)
        if (!strcmp(a->kn[k]->s, name)) return &a->kv[k];
    return NULL;
}

static const jv *kwarg(const args *a, const char *name) {
    for (size_t k = 0; k < a->nk; k++)
        if (!strcmp(a->kn[k]->s, name)) return &a->kv[k];
    return NULL;
}

static bool arg_bool(const args *a, size_t i, const char *name, bool def) {
    const jv *v = argp(a, i, name);
    return v ? truthy(*v) : def;
}

static int64_t arg_int(R *r, const args *a, size_t i, const char *name, int64_t def) {
    const jv *v = argp(a, i, name);
    if (!v || v->t == T_NONE) return def;
    if (!is_intlike(*v))
        TYPE_ERR(r, "argument '%s' must be an integer, not %s", name, type_name(*v));
    return as_int(*v);
}

/* A string argument (NULL if absent or None); TypeError for other types. */
static const jstr *arg_str(R *r, const args *a, size_t i, const char *name) {
    const jv *v = argp(a, i, name);
    if (!v || v->t == T_NONE) return NULL;
    if (v->t != T_STR) TYPE_ERR(r, "argument '%s' must be str, not %s", name, type_name(*v));
    return v->u.s;
}

/* ----------------------------------------------------------------------------- tests --- */

static bool str_is(R *r, jv v, bool want_lower) {
    jv s = to_str(r, v);
    bool cased = false, ok = true;
    const char *p = s.u.s->s, *end = p + s.u.s->len;
    while (p < end) {
        size_t l = u8_len(p, end);
        uint32_t c = u8_decode(p, l);
        if (cp_cased(c)) {
            cased = true;
            if (want_lower ? cp_lower(c) != c : cp_upper(c) != c) ok = false;
        }
        p += l;
    }
    unref(r, s);
    return cased && ok;
}

static int test_arity(int tid) {
    switch (tid) {
    case TS_SAMEAS:
    case TS_IN:
    case TS_EQ:
    case TS_NE:
    case TS_LT:
    case TS_LE:
    case TS_GT:
    case TS_GE:
    case TS_DIVISIBLEBY: return 1;
    default: return 0;
    }
}

static bool apply_test(R *r, int tid, jv v, const jv *arg, size_t nargs) {
    if ((int)nargs != test_arity(tid)) {
        const char *name = "?";
        for (size_t i = 0; i < sizeof test_names / sizeof test_names[0]; i++)
            if (test_names[i].id == tid) name = test_names[i].name;
        TYPE_ERR(r, "test '%s' takes %d argument(s) but %zu were given", name, test_arity(tid),
                 nargs);
    }
    jv none = v_none();
    const jv a = arg ? *arg : none;
    switch (tid) {
    case TS_DEFINED: return v.t != T_UNDEF;
    case TS_UNDEFINED: return v.t == T_UNDEF;
    case TS_NONE: return v.t == T_NONE;
    case TS_BOOLEAN: return v.t == T_BOOL;
    case TS_FALSE: return v.t == T_BOOL && !v.u.b;
    case TS_TRUE: return v.t == T_BOOL && v.u.b;
    case TS_INTEGER: return v.t == T_INT;
    case TS_FLOAT: return v.t == T_FLOAT;
    case TS_NUMBER: return is_num(v);
    case TS_STRING: return v.t == T_STR;
    case TS_MAPPING: return v.t == T_DICT;
    case TS_ITERABLE:
        return v.t == T_STR || v.t == T_LIST || v.t == T_DICT || v.t == T_UNDEF || v.t == T_LOOP;
    case TS_SEQUENCE: return v.t == T_STR || v.t == T_LIST || v.t == T_DICT;
    case TS_CALLABLE: return v.t == T_MACRO || v.t == T_FUNC;
    case TS_SAMEAS:
        if (v.t != a.t) return false;
        if (jv_obj(v)) return jv_obj(v) == jv_obj(a);
        return py_eq(v, a);
    case TS_ESCAPED: return false;
    case TS_IN: return py_in(r, v, a);
    case TS_EQ: return py_eq(v, a);
    case TS_NE: return !py_eq(v, a);
    case TS_LT: return cmp_ci(r, v, a, false) < 0;
    case TS_LE: return cmp_ci(r, v, a, false) <= 0;
    case TS_GT: return cmp_ci(r, v, a, false) > 0;
    case TS_GE: return cmp_ci(r, v, a, false) >= 0;
    case TS_EVEN:
    case TS_ODD: {
        jv m = arith(r, OP_MOD, v, v_int(2));
        bool even = !truthy(m);
        return tid == TS_EVEN ? even : !even;
    }
    case TS_DIVISIBLEBY: return !truthy(arith(r, OP_MOD, v, a));
    case TS_LOWER: return str_is(r, v, true);
    case TS_UPPER: return str_is(r, v, false);
    case TS_FILTER: return v.t == T_STR && find_filter(v.u.s->s) >= 0;
    case TS_TEST: return v.t == T_STR && find_test(v.u.s->s) >= 0;
    }
    return false;
}

/* --------------------------------------------------------------------------- filters --- */

static jv apply_filter(R *r, int fid, jv v, args *a);

/* item.attribute for jinja's attribute= arguments: dotted paths, integer parts index. */
static jv attr_path(R *r, jv item, const jstr *path) {
    jv cur = ref(item);
    const char *p = path->s, *end = p + path->len;
    while (p <= end) {
        const char *dot = memchr(p, '.', (size_t)(end - p));
        if (!dot) dot = end;
        jv key;
        char *e;
        char num[32];
        size_t kl = (size_t)(dot - p);
        if (kl && kl < sizeof num && is_digit(*p)) {
            memcpy(num, p, kl);
            num[kl] = 0;
            long long iv = strtoll(num, &e, 10);
            key = *e ? v_str(r, p, kl) : v_int(iv);
        } else
            key = v_str(r, p, kl);
        jv next = getitem_v(r, cur, key);
        unref(r, key);
        unref(r, cur);
        cur = next;
        if (dot == end) break;
        p = dot + 1;
    }
    return cur;
}

static void put_sep(R *r, sb *b, bool *first, const jstr *sep) {
    if (!*first && sep) sb_put(r, b, sep->s, sep->len);
    *first = false;
}

/* select/reject/selectattr/rejectattr: a[off] names the test, the rest are its argument. */
static jv select_filter(R *r, jv v, args *a, bool attr, bool keep_if) {
    size_t off = attr ? 1 : 0;
    const jstr *path = NULL;
    if (attr) {
        if (!a->n || a->pos[0].t != T_STR)
            TYPE_ERR(r, "selectattr/rejectattr need an attribute name");
        path = a->pos[0].u.s;
    }
    int tid = -1;
    if (a->n > off) {
        if (a->pos[off].t != T_STR) TYPE_ERR(r, "the test name must be a string");
        tid = find_test(a->pos[off].u.s->s);
        if (tid < 0) TYPE_ERR(r, "No test named '%s'.", a->pos[off].u.s->s);
    }
    const jv *targ = a->n > off + 1 ? &a->pos[off + 1] : NULL;
    jv items = iter_list(r, v), out = v_list(r, 0);
    for (size_t i = 0; i < items.u.l->n; i++) {
        jv x = items.u.l->v[i];
        jv t = attr ? attr_path(r, x, path) : ref(x);
        bool ok =
            tid < 0 ? truthy(t) : apply_test(r, tid, t, targ, a->n > off + 1 ? a->n - off - 1 : 0);
        unref(r, t);
        if (ok == keep_if) list_push(r, out.u.l, ref(x));
    }
    unref(r, items);
    return out;
}

static jv map_filter(R *r, jv v, args *a) {
    jv items = iter_list(r, v), out = v_list(r, items.u.l->n);
    const jv *attr = kwarg(a, "attribute");
    if (attr) {
        if (attr->t != T_STR) TYPE_ERR(r, "map: attribute must be a string");
        const jv *def = kwarg(a, "default");
        for (size_t i = 0; i < items.u.l->n; i++) {
            jv x = attr_path(r, items.u.l->v[i], attr->u.s);
            if (x.t == T_UNDEF && def) x = ref(*def);
            list_push(r, out.u.l, x);
        }
    } else {
        if (!a->n || a->pos[0].t != T_STR) TYPE_ERR(r, "map needs a filter name or attribute=");
        int fid = find_filter(a->pos[0].u.s->s);
        if (fid < 0) TYPE_ERR(r, "No filter named '%s'.", a->pos[0].u.s->s);
        args sub = {.n = a->n - 1, .nk = a->nk};
        memcpy(sub.pos, a->pos + 1, sub.n * sizeof(jv));
        memcpy(sub.kn, a->kn, a->nk * sizeof(jstr *));
        memcpy(sub.kv, a->kv, a->nk * sizeof(jv));
        for (size_t i = 0; i < items.u.l->n; i++)
            list_push(r, out.u.l, apply_filter(r, fid, items.u.l->v[i], &sub));
    }
    unref(r, items);
    return out;
}

/* Python's int(str) (whitespace, sign, underscores, base prefixes); false if not a number. */
static bool parse_pyint(const jstr *s, int base, int64_t *out) {
    const char *p = s->s, *end = p + s->len;
    p = skip_ws(p, end);
    size_t n = rstrip_len(p, (size_t)(end - p));
    char buf[80];
    size_t o = 0;
    bool neg = false;
    if (n && (*p == '+' || *p == '-')) {
        neg = *p == '-';
        p++;
        n--;
    }
    if (n >= 2 && p[0] == '0' &&
        ((base == 16 && (p[1] | 32) == 'x') || (base == 8 && (p[1] | 32) == 'o') ||
         (base == 2 && (p[1] | 32) == 'b'))) {
        p += 2;
        n -= 2;
    }
    if (!n || n >= sizeof buf) return false;
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        if (c == '_' && i > 0 && i + 1 < n && p[i - 1] != '_') continue;
        int d = is_digit(c)                          ? c - '0'
                : (c | 32) >= 'a' && (c | 32) <= 'z' ? (c | 32) - 'a' + 10
                                                     : 99;
        if (d >= base) return false;
        buf[o++] = c;
    }
    buf[o] = 0;
    errno = 0;
    unsigned long long v = strtoull(buf, NULL, base);
    if (errno || v > (unsigned long long)INT64_MAX + neg) return false;
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return true;
}

static bool parse_pyfloat(const jstr *s, double *out) {
    const char *p = skip_ws(s->s, s->s + s->len);
    size_t n = rstrip_len(p, (size_t)(s->s + s->len - p));
    char buf[80];
    size_t o = 0;
    if (!n || n >= sizeof buf) return false;
    for (size_t i = 0; i < n; i++)
        if (p[i] != '_') buf[o++] = p[i];
    buf[o] = 0;
    char *e;
    errno = 0;
    double d = strtod(buf, &e);
    if (*e || (buf[0] == '0' && (buf[1] | 32) == 'x')) return false;
    *out = d;
    return true;
}

static jv html_escape(R *r, jv v) {
    jv s = to_str(r, v);
    sb *b = sb_new(r, s.u.s->len);
    for (size_t i = 0; i < s.u.s->len; i++) {
        char c = s.u.s->s[i];
        switch (c) {
        case '&': sb_puts(r, b, "&amp;"); break;
        case '<': sb_puts(r, b, "&lt;"); break;
        case '>': sb_puts(r, b, "&gt;"); break;
        case '"': sb_puts(r, b, "&#34;"); break;
        case '\'': sb_puts(r, b, "&#39;"); break;
        default: sb_putc(r, b, c);
        }
    }
    unref(r, s);
    return sb_take(r, b);
}

static jv tojson_filter(R *r, jv v, args *a) {
    json_opts o = {.indent = NULL, .item_sep = ", ", .key_sep = ": "};
    char ind[64];
    const jv *ea = argp(a, 0, "ensure_ascii"), *in = argp(a, 1, "indent"),
             *se = argp(a, 2, "separators"), *sk = argp(a, 3, "sort_keys");
    if (ea && truthy(*ea)) TYPE_ERR(r, "tojson: ensure_ascii=True is not supported");
    if (in && in->t != T_NONE) {
        if (is_intlike(*in)) {
            int64_t k = as_int(*in);
            if (k < 0) k = 0;
            if (k > (int64_t)sizeof ind - 1) TYPE_ERR(r, "tojson: indent too large");
            memset(ind, ' ', (size_t)k);
            ind[k] = 0;
        } else if (in->t == T_STR && in->u.s->len < sizeof ind)
            snprintf(ind, sizeof ind, "%s", in->u.s->s);
        else
            TYPE_ERR(r, "tojson: bad indent");
        o.indent = ind;
        o.item_sep = ",";
    }
    if (se && se->t != T_NONE) {
        if (se->t != T_LIST || se->u.l->n != 2 || se->u.l->v[0].t != T_STR ||
            se->u.l->v[1].t != T_STR)
            TYPE_ERR(r, "tojson: separators must be a pair of strings");
        o.item_sep = se->u.l->v[0].u.s->s;
        o.key_sep = se->u.l->v[1].u.s->s;
    }
    o.sort_keys = sk && truthy(*sk);
    sb *b = sb_new(r, 0);
    json_into(r, b, v, &o, 0);
    return sb_take(r, b);
}

static jv minmax(R *r, jv v, args *a, bool want_max) {
    bool cs = arg_bool(a, 0, "case_sensitive", false);
    const jstr *attr = arg_str(r, a, 1, "attribute");
    jv items = iter_list(r, v), best = v_undef(NULL), bestk = v_undef(NULL);
    for (size_t i = 0; i < items.u.l->n; i++) {
        jv x = items.u.l->v[i];
        jv k = attr ? attr_path(r, x, attr) : ref(x);
        if (best.t == T_UNDEF ||
            (want_max ? cmp_ci(r, k, bestk, !cs) > 0 : cmp_ci(r, k, bestk, !cs) < 0)) {
            unref(r, bestk);
            bestk = k;
            best = x;
        } else
            unref(r, k);
    }
    best = ref(best);
    unref(r, bestk);
    unref(r, items);
    return best;
}

static jv apply_filter(R *r, int fid, jv v, args *a) {
    switch (fid) {
    case FL_ABS:
        if (v.t == T_INT) {
            if (v.u.i == INT64_MIN) fail(r, PGD_ERANGE, "integer overflow in abs");
            return v_int(v.u.i < 0 ? -v.u.i : v.u.i);
        }
        if (v.t == T_BOOL) return v_int(v.u.b);
        if (v.t == T_FLOAT) return v_float(fabs(v.u.f));
        TYPE_ERR(r, "bad operand type for abs(): '%s'", type_name(v));
    case FL_ATTR: {
        const jstr *name = arg_str(r, a, 0, "name");
        if (!name) TYPE_ERR(r, "attr needs a name");
        if (v.t == T_NS || v.t == T_LOOP) return getattr_v(r, v, name->s);
        if (v.t == T_UNDEF) undefined_err(r, v);
        return v_undef(NULL);
    }
    case FL_CAPITALIZE:
    case FL_LOWER:
    case FL_UPPER:
    case FL_TITLE: {
        jv s = to_str(r, v);
        jv out = str_case(r, s,
                          fid == FL_CAPITALIZE ? CASE_CAPITALIZE
                          : fid == FL_LOWER    ? CASE_LOWER
                          : fid == FL_UPPER    ? CASE_UPPER
                                               : CASE_JTITLE);
        unref(r, s);
        return out;
    }
    case FL_CENTER: {
        jv s = to_str(r, v);
        int64_t w = arg_int(r, a, 0, "width", 80), n = (int64_t)u8_count(s.u.s->s, s.u.s->len);
        if (w <= n) return s;
        if (w > (int64_t)r->max_out) fail(r, PGD_ERANGE, "center width too large");
        int64_t pad = w - n, left = pad / 2 + (pad & w & 1);
        sb *b = sb_new(r, (size_t)w);
        for (int64_t i = 0; i < left; i++) sb_putc(r, b, ' ');
        sb_put(r, b, s.u.s->s, s.u.s->len);
        for (int64_t i = 0; i < pad - left; i++) sb_putc(r, b, ' ');
        unref(r, s);
        return sb_take(r, b);
    }
    case FL_DEFAULT: {
        const jv *d = argp(a, 0, "default_value");
        if (v.t == T_UNDEF || (arg_bool(a, 1, "boolean", false) && !truthy(v)))
            return d ? ref(*d) : v_str(r, "", 0);
        return ref(v);
    }
    case FL_DICTSORT: {
        if (v.t != T_DICT) TYPE_ERR(r, "dictsort needs a mapping");
        bool cs = arg_bool(a, 0, "case_sensitive", false), rev = arg_bool(a, 2, "reverse", false);
        const jstr *by = arg_str(r, a, 1, "by");
        bool by_value = by && !strcmp(by->s, "value");
        if (by && !by_value && strcmp(by->s, "key"))
            TYPE_ERR(r, "You can only sort by either \"key\" or \"value\"");
        jv out = v_list(r, v.u.d->n);
        for (size_t i = 0; i < v.u.d->n; i++) {
            jv pair = v_list(r, 2);
            pair.u.l->tuple = true;
            list_push(r, pair.u.l, ref(v.u.d->k[i]));
            list_push(r, pair.u.l, ref(v.u.d->v[i]));
            list_push(r, out.u.l, pair);
        }
        jv path = v_cstr(r, by_value ? "1" : "0");
        sort_jv(r, out.u.l->v, out.u.l->n, path.u.s, !cs, rev);
        unref(r, path);
        return out;
    }
    case FL_ESCAPE: return html_escape(r, v);
    case FL_FIRST:
    case FL_LAST: {
        if (v.t == T_UNDEF) return v_undef(NULL);
        jv items = iter_list(r, v);
        jv out = items.u.l->n ? ref(items.u.l->v[fid == FL_FIRST ? 0 : items.u.l->n - 1])
                              : v_undef(NULL);
        unref(r, items);
        return out;
    }
    case FL_FLOAT: {
        const jv *d = argp(a, 0, "default");
        double f;
        if (is_num(v)) return v_float(as_f(v));
        if (v.t == T_STR && parse_pyfloat(v.u.s, &f)) return v_float(f);
        return d ? ref(*d) : v_float(0.0);
    }
    case FL_FORMAT: {
        jv s = to_str(r, v), fa;
        if (a->nk) {
            fa = v_dict(r);
            for (size_t i = 0; i < a->nk; i++)
                dict_set(r, fa.u.d, v_cstr(r, a->kn[i]->s), ref(a->kv[i]));
        } else {
            fa = v_list(r, a->n);
            fa.u.l->tuple = true;
            for (size_t i = 0; i < a->n; i++) list_push(r, fa.u.l, ref(a->pos[i]));
        }
        jv out = py_format(r, s, fa);
        unref(r, fa);
        unref(r, s);
        return out;
    }
    case FL_INDENT: {
        jv s = to_str(r, v);
        const jv *w = argp(a, 0, "width");
        bool first = arg_bool(a, 1, "first", false), blank = arg_bool(a, 2, "blank", false);
        char ind[256];
        if (w && w->t == T_STR)
            snprintf(ind, sizeof ind, "%s", w->u.s->s);
        else {
            int64_t k = w ? (is_intlike(*w) ? as_int(*w) : -1) : 4;
            if (k < 0 || k >= (int64_t)sizeof ind) TYPE_ERR(r, "indent: bad width");
            memset(ind, ' ', (size_t)k);
            ind[k] = 0;
        }
        /* s + "\n", split into lines, rejoin with indentation (jinja's quirk included) */
        sb *b = sb_new(r, s.u.s->len + 64);
        if (first) sb_puts(r, b, ind);
        const char *p = s.u.s->s, *end = p + s.u.s->len;
        bool first_line = true;
        for (;;) {
            const char *nl = p;
            while (nl < end && *nl != '\n' && *nl != '\r') nl++;
            if (!first_line) {
                sb_putc(r, b, '\n');
                if (blank || nl > p) sb_puts(r, b, ind);
            }
            sb_put(r, b, p, (size_t)(nl - p));
            first_line = false;
            if (nl >= end) break;
            p = nl + (nl[0] == '\r' && nl + 1 < end && nl[1] == '\n' ? 2 : 1);
            if (p >= end) break;
        }
        unref(r, s);
        return sb_take(r, b);
    }
    case FL_INT: {
        int64_t base = arg_int(r, a, 1, "base", 10), i;
        double f;
        if (v.t == T_INT) return ref(v);
        if (v.t == T_BOOL) return v_int(v.u.b);
        if (v.t == T_FLOAT && isfinite(v.u.f) && fabs(v.u.f) < 9.2e18) return v_int((int64_t)v.u.f);
        if (v.t == T_STR) {
            if (base >= 2 && base <= 36 && parse_pyint(v.u.s, (int)base, &i)) return v_int(i);
            if (parse_pyfloat(v.u.s, &f) && isfinite(f) && fabs(f) < 9.2e18)
                return v_int((int64_t)f);
        }
        const jv *d = argp(a, 0, "default");
        return d ? ref(*d) : v_int(0);
    }
    case FL_ITEMS: {
        if (v.t == T_UNDEF) return v_list(r, 0);
        if (v.t != T_DICT) TYPE_ERR(r, "Can only get item pairs from a mapping.");
        jv out = v_list(r, v.u.d->n);
        for (size_t i = 0; i < v.u.d->n; i++) {
            jv pair = v_list(r, 2);
            pair.u.l->tuple = true;
            list_push(r, pair.u.l, ref(v.u.d->k[i]));
            list_push(r, pair.u.l, ref(v.u.d->v[i]));
            list_push(r, out.u.l, pair);
        }
        return out;
    }
    case FL_JOIN: {
        const jv *d = argp(a, 0, "d");
        const jstr *attr = arg_str(r, a, 1, "attribute");
        jv sep = d ? to_str(r, *d) : v_str(r, "", 0);
        jv items = iter_list(r, v);
        sb *b = sb_new(r, 0);
        bool first = true;
        for (size_t i = 0; i < items.u.l->n; i++) {
            put_sep(r, b, &first, sep.u.s);
            jv x = attr ? attr_path(r, items.u.l->v[i], attr) : ref(items.u.l->v[i]);
            to_str_into(r, b, x, false);
            unref(r, x);
        }
        unref(r, items);
        unref(r, sep);
        return sb_take(r, b);
    }
    case FL_LENGTH: return v_int((int64_t)py_len(r, v));
    case FL_LIST: {
        if (v.t == T_LIST && !v.u.l->tuple) return ref(v);
        jv items = iter_list(r, v);
        if (!items.u.l->tuple) return items;
        jv out = v_list(r, items.u.l->n);
        for (size_t i = 0; i < items.u.l->n; i++) list_push(r, out.u.l, ref(items.u.l->v[i]));
        unref(r, items);
        return out;
    }
    case FL_MAP: return map_filter(r, v, a);
    case FL_MAX:
    case FL_MIN: return minmax(r, v, a, fid == FL_MAX);
    case FL_REJECT: return select_filter(r, v, a, false, false);
    case FL_SELECT: return select_filter(r, v, a, false, true);
    case FL_REJECTATTR: return select_filter(r, v, a, true, false);
    case FL_SELECTATTR: return select_filter(r, v, a, true, true);
    case FL_REPLACE: {
        const jv *o = argp(a, 0, "old"), *n = argp(a, 1, "new");
        if (!o || !n) TYPE_ERR(r, "replace needs old and new");
        jv s = to_str(r, v), os = to_str(r, *o), ns = to_str(r, *n);
        jv out = str_replace(r, s, os, ns, arg_int(r, a, 2, "count", -1));
        unref(r, s);
        unref(r, os);
        unref(r, ns);
        return out;
    }
    case FL_REVERSE: {
        if (v.t == T_STR) {
            jv items = iter_list(r, v);
            sb *b = sb_new(r, v.u.s->len);
            for (size_t i = items.u.l->n; i-- > 0;)
                sb_put(r, b, items.u.l->v[i].u.s->s, items.u.l->v[i].u.s->len);
            unref(r, items);
            return sb_take(r, b);
        }
        jv items = iter_list(r, v), out = v_list(r, items.u.l->n);
        for (size_t i = items.u.l->n; i-- > 0;) list_push(r, out.u.l, ref(items.u.l->v[i]));
        unref(r, items);
        return out;
    }
    case FL_ROUND: {
        int64_t prec = arg_int(r, a, 0, "precision", 0);
        const jstr *method = arg_str(r, a, 1, "method");
        if (!is_num(v)) TYPE_ERR(r, "round needs a number, not %s", type_name(v));
        double x = as_f(v), m = pow(10.0, (double)prec);
        if (!method || !strcmp(method->s, "common")) {
            if (is_intlike(v) && prec >= 0) return v_int(as_int(v));
            double y = x * m, fl = floor(y), diff = y - fl;
            double rr = diff > 0.5 ? fl + 1 : diff < 0.5 ? fl : (fmod(fl, 2) == 0 ? fl : fl + 1);
            return v_float(rr / m);
        }
        if (!strcmp(method->s, "ceil")) return v_float(ceil(x * m) / m);
        if (!strcmp(method->s, "floor")) return v_float(floor(x * m) / m);
        TYPE_ERR(r, "method must be common, ceil or floor");
    }
    case FL_SAFE:
    case FL_STRING: return to_str(r, v);
    case FL_PPRINT: {
        sb *b = sb_new(r, 0);
        repr_into(r, b, v);
        return sb_take(r, b);
    }
    case FL_SORT:
    case FL_UNIQUE: {
        bool rev = fid == FL_SORT && arg_bool(a, 0, "reverse", false);
        bool cs = arg_bool(a, fid == FL_SORT ? 1 : 0, "case_sensitive", false);
        const jstr *attr = arg_str(r, a, fid == FL_SORT ? 2 : 1, "attribute");
        jv items = iter_list(r, v), out = v_list(r, items.u.l->n);
        if (fid == FL_UNIQUE) {
            jv seen = v_list(r, 0);
            for (size_t i = 0; i < items.u.l->n; i++) {
                jv x = items.u.l->v[i], k = attr ? attr_path(r, x, attr) : ref(x);
                if (!cs && k.t == T_STR) {
                    jv lk = str_case(r, k, CASE_LOWER);
                    unref(r, k);
                    k = lk;
                }
                if (py_in(r, k, seen))
                    unref(r, k);
                else {
                    list_push(r, seen.u.l, k);
                    list_push(r, out.u.l, ref(x));
                }
            }
            unref(r, seen);
            unref(r, items);
            return out;
        }
        for (size_t i = 0; i < items.u.l->n; i++) list_push(r, out.u.l, ref(items.u.l->v[i]));
        unref(r, items);
        sort_jv(r, out.u.l->v, out.u.l->n, attr, !cs, rev);
        return out;
    }
    case FL_SUM: {
        const jstr *attr = arg_str(r, a, 0, "attribute");
        const jv *st = argp(a, 1, "start");
        jv acc = st ? ref(*st) : v_int(0), items = iter_list(r, v);
        for (size_t i = 0; i < items.u.l->n; i++) {
            jv x = attr ? attr_path(r, items.u.l->v[i], attr) : ref(items.u.l->v[i]);
            jv n = arith(r, OP_ADD, acc, x);
            unref(r, acc);
            unref(r, x);
            acc = n;
        }
        unref(r, items);
        return acc;
    }
    case FL_TOJSON: return tojson_filter(r, v, a);
    case FL_TRIM: {
        jv s = to_str(r, v);
        const jstr *chars = arg_str(r, a, 0, "chars");
        jv out = str_strip(r, s, chars, true, true);
        unref(r, s);
        return out;
    }
    case FL_WORDCOUNT: {
        jv s = to_str(r, v);
        int64_t n = 0;
        bool in = false;
        for (size_t i = 0; i < s.u.s->len; i++) {
            unsigned char c = (unsigned char)s.u.s->s[i];
            bool w = is_name1((char)c);
            if (w && !in) n++;
            in = w;
        }
        unref(r, s);
        return v_int(n);
    }
    case FL_TRUNCATE: {
        jv s = to_str(r, v);
        int64_t len = arg_int(r, a, 0, "length", 255), lee = arg_int(r, a, 3, "leeway", 5);
        bool kill = arg_bool(a, 1, "killwords", false);
        const jstr *end = arg_str(r, a, 2, "end");
        jv endv = end ? v_str(r, end->s, end->len) : v_cstr(r, "...");
        int64_t n = (int64_t)u8_count(s.u.s->s, s.u.s->len),
                el = (int64_t)u8_count(endv.u.s->s, endv.u.s->len);
        if (n <= len + lee) {
            unref(r, endv);
            return s;
        }
        jv cut = slice_v(r, s, v_none(), v_int(len - el), v_none());
        if (!kill) {
            const char *sp = memrfind(cut.u.s->s, cut.u.s->len, " ", 1);
            if (sp) {
                jv c2 = v_str(r, cut.u.s->s, (size_t)(sp - cut.u.s->s));
                unref(r, cut);
                cut = c2;
            }
        }
        jv out = str_concat(r, cut.u.s, endv.u.s);
        unref(r, cut);
        unref(r, endv);
        unref(r, s);
        return out;
    }
    }
    TYPE_ERR(r, "unsupported filter");
}

/* --------------------------------------------------------------------------- methods --- */

static bool affix_match(R *r, jv s, const jv *what, bool suffix) {
    if (!what) TYPE_ERR(r, "startswith/endswith need an argument");
    const jv *cands = what;
    size_t nc = 1;
    if (what->t == T_LIST && what->u.l->tuple) {
        cands = what->u.l->v;
        nc = what->u.l->n;
    }
    for (size_t i = 0; i < nc; i++) {
        if (cands[i].t != T_STR)
            TYPE_ERR(r, "startswith/endswith first arg must be str or a tuple of str, not %s",
                     type_name(cands[i]));
        const jstr *x = cands[i].u.s;
        if (x->len <= s.u.s->len &&
            !memcmp(s.u.s->s + (suffix ? s.u.s->len - x->len : 0), x->s, x->len))
            return true;
    }
    return false;
}

static jv str_method(R *r, jv s, const char *m, args *a, bool *found) {
    *found = true;
    const jstr *S = s.u.s;
    if (!strcmp(m, "startswith") || !strcmp(m, "endswith"))
        return v_bool(affix_match(r, s, argp(a, 0, "prefix"), m[0] == 'e'));
    if (!strcmp(m, "strip") || !strcmp(m, "lstrip") || !strcmp(m, "rstrip"))
        return str_strip(r, s, arg_str(r, a, 0, "chars"), m[0] != 'r', m[0] != 'l');
    if (!strcmp(m, "split") || !strcmp(m, "rsplit"))
        return str_split(r, s, arg_str(r, a, 0, "sep"), arg_int(r, a, 1, "maxsplit", -1),
                         m[0] == 'r');
    if (!strcmp(m, "upper")) return str_case(r, s, CASE_UPPER);
    if (!strcmp(m, "lower")) return str_case(r, s, CASE_LOWER);
    if (!strcmp(m, "title")) return str_case(r, s, CASE_TITLE);
    if (!strcmp(m, "capitalize")) return str_case(r, s, CASE_CAPITALIZE);
    if (!strcmp(m, "swapcase")) return str_case(r, s, CASE_SWAP);
    if (!strcmp(m, "replace")) {
        const jstr *o = arg_str(r, a, 0, "old"), *n = arg_str(r, a, 1, "new");
        if (!o || !n) TYPE_ERR(r, "replace expected 2 string arguments");
        return str_replace(r, s, *argp(a, 0, "old"), *argp(a, 1, "new"),
                           arg_int(r, a, 2, "count", -1));
    }
    if (!strcmp(m, "find") || !strcmp(m, "rfind") || !strcmp(m, "index") || !strcmp(m, "rindex") ||
        !strcmp(m, "count")) {
        const jstr *sub = arg_str(r, a, 0, "sub");
        if (!sub) TYPE_ERR(r, "%s expected a string argument", m);
        if (!strcmp(m, "count")) {
            int64_t c = 0;
            if (!sub->len) return v_int((int64_t)u8_count(S->s, S->len) + 1);
            for (const char *p = S->s, *f;
                 (f = memfind(p, S->len - (size_t)(p - S->s), sub->s, sub->len)); p = f + sub->len)
                c++;
            return v_int(c);
        }
        const char *f = m[0] == 'r' ? memrfind(S->s, S->len, sub->s, sub->len)
                                    : memfind(S->s, S->len, sub->s, sub->len);
        if (!f) {
            if (!strcmp(m, "index") || !strcmp(m, "rindex")) TYPE_ERR(r, "substring not found");
            return v_int(-1);
        }
        return v_int((int64_t)u8_count(S->s, (size_t)(f - S->s)));
    }
    if (!strcmp(m, "join")) {
        const jv *it = argp(a, 0, "iterable");
        if (!it) TYPE_ERR(r, "join() takes exactly one argument");
        jv items = iter_list(r, *it);
        sb *b = sb_new(r, 0);
        bool first = true;
        for (size_t i = 0; i < items.u.l->n; i++) {
            if (items.u.l->v[i].t != T_STR)
                TYPE_ERR(r, "sequence item %zu: expected str instance, %s found", i,
                         type_name(items.u.l->v[i]));
            put_sep(r, b, &first, S);
            sb_put(r, b, items.u.l->v[i].u.s->s, items.u.l->v[i].u.s->len);
        }
        unref(r, items);
        return sb_take(r, b);
    }
    if (!strcmp(m, "splitlines")) {
        bool keep = arg_bool(a, 0, "keepends", false);
        jv out = v_list(r, 0);
        size_t i = 0;
        while (i < S->len) {
            size_t j = i;
            while (j < S->len && S->s[j] != '\n' && S->s[j] != '\r' && S->s[j] != '\v' &&
                   S->s[j] != '\f' && !(S->s[j] >= 0x1c && S->s[j] <= 0x1e))
                j++;
            size_t e = j < S->len
                           ? j + (S->s[j] == '\r' && j + 1 < S->len && S->s[j + 1] == '\n' ? 2 : 1)
                           : j;
            list_push(r, out.u.l, v_str(r, S->s + i, (keep ? e : j) - i));
            i = e;
        }
        return out;
    }
    if (!strcmp(m, "removeprefix") || !strcmp(m, "removesuffix")) {
        const jstr *x = arg_str(r, a, 0, "prefix");
        if (!x) TYPE_ERR(r, "%s expected a string", m);
        bool suf = m[6] == 's';
        if (x->len <= S->len && !memcmp(S->s + (suf ? S->len - x->len : 0), x->s, x->len))
            return v_str(r, S->s + (suf ? 0 : x->len), S->len - x->len);
        return ref(s);
    }
    if (!strcmp(m, "isdigit") || !strcmp(m, "isnumeric") || !strcmp(m, "isdecimal") ||
        !strcmp(m, "isalpha") || !strcmp(m, "isalnum") || !strcmp(m, "isspace")) {
        if (!S->len) return v_bool(false);
        for (size_t i = 0; i < S->len; i++) {
            char c = S->s[i];
            bool ok = m[2] == 'd' || m[2] == 'n' ? is_digit(c)
                      : m[2] == 's'              ? cp_space((unsigned char)c)
                      : m[4] == 'p'              ? ((c | 32) >= 'a' && (c | 32) <= 'z')
                                    : is_digit(c) || ((c | 32) >= 'a' && (c | 32) <= 'z');
            if (!ok) return v_bool(false);
        }
        return v_bool(true);
    }
    if (!strcmp(m, "islower") || !strcmp(m, "isupper")) return v_bool(str_is(r, s, m[2] == 'l'));
    if (!strcmp(m, "format")) {
        /* "{}" / "{0}" / "{name}" replacement fields with no format spec */
        sb *b = sb_new(r, S->len);
        size_t auto_i = 0;
        for (size_t i = 0; i < S->len; i++) {
            char c = S->s[i];
            if ((c == '{' || c == '}') && i + 1 < S->len && S->s[i + 1] == c) {
                sb_putc(r, b, c);
                i++;
                continue;
            }
            if (c != '{') {
                if (c == '}') TYPE_ERR(r, "Single '}' encountered in format string");
                sb_putc(r, b, c);
                continue;
            }
            const char *close = memchr(S->s + i, '}', S->len - i);
            if (!close) TYPE_ERR(r, "Single '{' encountered in format string");
            const char *f = S->s + i + 1;
            size_t fl = (size_t)(close - f);
            const jv *val = NULL;
            if (!fl) {
                if (auto_i >= a->n) TYPE_ERR(r, "Replacement index %zu out of range", auto_i);
                val = &a->pos[auto_i++];
            } else if (is_digit(*f)) {
                size_t k = (size_t)strtoul(f, NULL, 10);
                if (k >= a->n) TYPE_ERR(r, "Replacement index %zu out of range", k);
                val = &a->pos[k];
            } else {
                for (size_t k = 0; k < a->nk; k++)
                    if (a->kn[k]->len == fl && !memcmp(a->kn[k]->s, f, fl)) val = &a->kv[k];
                if (!val) TYPE_ERR(r, "format: missing key '%.*s'", (int)(fl < 40 ? fl : 40), f);
            }
            to_str_into(r, b, *val, false);
            i = (size_t)(close - S->s);
        }
        return sb_take(r, b);
    }
    if (!strcmp(m, "center") || !strcmp(m, "ljust") || !strcmp(m, "rjust") || !strcmp(m, "zfill")) {
        int64_t w = arg_int(r, a, 0, "width", 0), n = (int64_t)u8_count(S->s, S->len);
        if (w <= n) return ref(s);
        if (w > (int64_t)r->max_out) fail(r, PGD_ERANGE, "width too large");
        const jstr *fc = arg_str(r, a, 1, "fillchar");
        const char *fill = fc ? fc->s : m[0] == 'z' ? "0" : " ";
        size_t fl = fc ? fc->len : 1;
        int64_t pad = w - n, left = m[0] == 'l'                  ? 0
                                    : m[0] == 'r' || m[0] == 'z' ? pad
                                                                 : pad / 2 + (pad & w & 1);
        sb *b = sb_new(r, (size_t)w);
        size_t skip = 0;
        if (m[0] == 'z' && S->len && (S->s[0] == '+' || S->s[0] == '-')) {
            sb_putc(r, b, S->s[0]);
            skip = 1;
        }
        for (int64_t i = 0; i < left; i++) sb_put(r, b, fill, fl);
        sb_put(r, b, S->s + skip, S->len - skip);
        for (int64_t i = 0; i < pad - left; i++) sb_put(r, b, fill, fl);
        return sb_take(r, b);
    }
    if (!strcmp(m, "partition") || !strcmp(m, "rpartition")) {
        const jstr *sep = arg_str(r, a, 0, "sep");
        if (!sep || !sep->len) TYPE_ERR(r, "empty separator");
        const char *f = m[0] == 'r' ? memrfind(S->s, S->len, sep->s, sep->len)
                                    : memfind(S->s, S->len, sep->s, sep->len);
        jv out = v_list(r, 3);
        out.u.l->tuple = true;
        if (!f) {
            bool rp = m[0] == 'r';
            list_push(r, out.u.l, rp ? v_str(r, "", 0) : ref(s));
            list_push(r, out.u.l, v_str(r, "", 0));
            list_push(r, out.u.l, rp ? ref(s) : v_str(r, "", 0));
            return out;
        }
        list_push(r, out.u.l, v_str(r, S->s, (size_t)(f - S->s)));
        list_push(r, out.u.l, v_str(r, sep->s, sep->len));
        list_push(r, out.u.l, v_str(r, f + sep->len, S->len - (size_t)(f - S->s) - sep->len));
        return out;
    }
    *found = false;
    return v_none();
}

static jv dict_method(R *r, jv d, const char *m, args *a, bool *found) {
    *found = true;
    const jdict *D = d.u.d;
    if (!strcmp(m, "items") || !strcmp(m, "keys") || !strcmp(m, "values")) {
        jv out = v_list(r, D->n);
        for (size_t i = 0; i < D->n; i++) {
            if (m[0] == 'k')
                list_push(r, out.u.l, ref(D->k[i]));
            else if (m[0] == 'v')
                list_push(r, out.u.l, ref(D->v[i]));
            else {
                jv pair = v_list(r, 2);
                pair.u.l->tuple = true;
                list_push(r, pair.u.l, ref(D->k[i]));
                list_push(r, pair.u.l, ref(D->v[i]));
                list_push(r, out.u.l, pair);
            }
        }
        return out;
    }
    if (!strcmp(m, "get")) {
        const jv *k = argp(a, 0, "key"), *def = argp(a, 1, "default");
        if (!k) TYPE_ERR(r, "get expected at least 1 argument");
        long i = dict_find(D, *k);
        return i >= 0 ? ref(D->v[i]) : def ? ref(*def) : v_none();
    }
    if (!strcmp(m, "copy")) {
        jv out = v_dict(r);
        for (size_t i = 0; i < D->n; i++) dict_set(r, out.u.d, ref(D->k[i]), ref(D->v[i]));
        return out;
    }
    if (!strcmp(m, "pop") || !strcmp(m, "update") || !strcmp(m, "setdefault") ||
        !strcmp(m, "clear") || !strcmp(m, "popitem"))
        TYPE_ERR(r, "access to attribute '%s' of 'dict' object is unsafe.", m);
    *found = false;
    return v_none();
}

static jv list_method(R *r, jv l, const char *m, args *a, bool *found) {
    *found = true;
    const jlist *L = l.u.l;
    if (!strcmp(m, "index") || !strcmp(m, "count")) {
        const jv *x = argp(a, 0, "value");
        if (!x) TYPE_ERR(r, "%s expected 1 argument", m);
        int64_t c = 0;
        for (size_t i = 0; i < L->n; i++)
            if (py_eq(L->v[i], *x)) {
                if (m[0] == 'i') return v_int((int64_t)i);
                c++;
            }
        if (m[0] == 'i') TYPE_ERR(r, "value is not in list");
        return v_int(c);
    }
    if (!strcmp(m, "append") || !strcmp(m, "pop") || !strcmp(m, "extend") || !strcmp(m, "insert") ||
        !strcmp(m, "remove") || !strcmp(m, "sort") || !strcmp(m, "reverse") || !strcmp(m, "clear"))
        TYPE_ERR(r, "access to attribute '%s' of '%s' object is unsafe.", m, type_name(l));
    *found = false;
    return v_none();
}

/* ---------------------------------------------------------------------- calls, macros --- */

static jv call_macro(R *r, const node *m, args *a) {
    if (a->n > m->nnames)
        TYPE_ERR(r, "macro '%s' takes not more than %zu argument(s)", m->name->s, m->nnames);
    for (size_t k = 0; k < a->nk; k++) {
        bool ok = false;
        for (size_t i = 0; i < m->nnames; i++) ok |= !strcmp(m->names[i]->s, a->kn[k]->s);
        if (!ok) TYPE_ERR(r, "macro '%s' takes no keyword argument '%s'", m->name->s, a->kn[k]->s);
    }
    if (r->call_depth >= r->max_call_depth)
        fail(r, PGD_ERANGE, "macro calls nest deeper than %d", r->max_call_depth);
    r->call_depth++;
    frame f = {.parent = r->top, .vars = v_dict(r).u.d};
    frame *saved_fr = r->fr;
    sb *saved_out = r->out;
    int saved_line = r->line;
    r->fr = &f;
    for (size_t i = 0; i < m->nnames; i++) {
        const jv *v = argp(a, i, m->names[i]->s);
        jv val = v ? ref(*v) : m->kids2[i] ? eval(r, m->kids2[i]) : v_undef(m->names[i]->s);
        dict_set(r, f.vars, ref((jv){.t = T_STR, .u.s = m->names[i]}), val);
    }
    r->out = sb_new(r, 0);
    exec(r, m->c);
    jv out = sb_take(r, r->out);
    r->out = saved_out;
    r->fr = saved_fr;
    r->line = saved_line;
    obj_unref(r, &f.vars->h);
    r->call_depth--;
    return out;
}

static jv call_func(R *r, int fn, args *a) {
    switch (fn) {
    case F_RAISE: {
        const jv *m = argp(a, 0, "message");
        jv s = m ? to_str(r, *m) : v_str(r, "", 0);
        /* exactly the template's message: the server returns it to the client */
        if (r->err) pgd_err_set(r->err, PGD_EINVAL, "%s", s.u.s->s);
        longjmp(r->jb, PGD_EINVAL);
    }
    case F_RANGE: {
        int64_t start = 0, stop, st = 1;
        for (size_t i = 0; i < a->n; i++)
            if (!is_intlike(a->pos[i]))
                TYPE_ERR(r, "'%s' object cannot be interpreted as an integer",
                         type_name(a->pos[i]));
        if (a->n == 1)
            stop = as_int(a->pos[0]);
        else if (a->n == 2 || a->n == 3) {
            start = as_int(a->pos[0]);
            stop = as_int(a->pos[1]);
            if (a->n == 3) st = as_int(a->pos[2]);
        } else
            TYPE_ERR(r, "range expected 1 to 3 arguments, got %zu", a->n);
        if (st == 0) TYPE_ERR(r, "range() arg 3 must not be zero");
        double cnt = st > 0 ? ceil(((double)stop - (double)start) / (double)st)
                            : ceil(((double)start - (double)stop) / (double)-st);
        if (cnt < 0) cnt = 0;
        if (cnt > MAX_RANGE) fail(r, PGD_ERANGE, "range() of more than %d items", MAX_RANGE);
        jv out = v_list(r, (size_t)cnt);
        for (size_t i = 0; i < (size_t)cnt; i++)
            list_push(r, out.u.l, v_int(start + (int64_t)i * st));
        return out;
    }
    case F_NAMESPACE:
    case F_DICT: {
        jv d = v_dict(r);
        if (a->n > 1) TYPE_ERR(r, "expected at most 1 positional argument, got %zu", a->n);
        if (a->n) {
            jv src = a->pos[0];
            if (src.t == T_DICT || src.t == T_NS) {
                for (size_t i = 0; i < src.u.d->n; i++)
                    dict_set(r, d.u.d, ref(src.u.d->k[i]), ref(src.u.d->v[i]));
            } else {
                jv items = iter_list(r, src);
                for (size_t i = 0; i < items.u.l->n; i++) {
                    jv pr = items.u.l->v[i];
                    if (pr.t != T_LIST || pr.u.l->n != 2)
                        TYPE_ERR(r, "dictionary update sequence element has wrong length");
                    dict_set(r, d.u.d, ref(pr.u.l->v[0]), ref(pr.u.l->v[1]));
                }
                unref(r, items);
            }
        }
        for (size_t i = 0; i < a->nk; i++)
            dict_set(r, d.u.d, ref((jv){.t = T_STR, .u.s = (jstr *)a->kn[i]}), ref(a->kv[i]));
        if (fn == F_NAMESPACE) d.t = T_NS;
        return d;
    }
    case F_STRFTIME: {
        const jv *f = argp(a, 0, "format");
        if (!f || f->t != T_STR) TYPE_ERR(r, "strftime_now needs a format string");
        if (f->u.s->len > 256) TYPE_ERR(r, "strftime_now: format too long");
        struct tm tm;
        time_t now = r->now;
        if (!localtime_r(&now, &tm)) TYPE_ERR(r, "strftime_now: bad time");
        char buf[2048];
        size_t n = strftime(buf, sizeof buf, f->u.s->s, &tm);
        return v_str(r, buf, n);
    }
    }
    TYPE_ERR(r, "unknown function");
}

static jv call_value(R *r, jv fn, args *a) {
    if (fn.t == T_MACRO) return call_macro(r, fn.u.m, a);
    if (fn.t == T_FUNC) return call_func(r, fn.u.fn, a);
    if (fn.t == T_UNDEF) undefined_err(r, fn);
    TYPE_ERR(r, "'%s' object is not callable", type_name(fn));
}

static jv eval_call(R *r, const node *n) {
    const node *f = n->a;
    args a;
    jv res;
    if (f->kind == N_ATTR) {
        jv obj = eval(r, f->a);
        if (obj.t == T_UNDEF) undefined_err(r, obj);
        eval_args(r, n, &a);
        const char *m = f->name->s;
        bool found = false;
        if (obj.t == T_STR)
            res = str_method(r, obj, m, &a, &found);
        else if (obj.t == T_DICT)
            res = dict_method(r, obj, m, &a, &found);
        else if (obj.t == T_LIST)
            res = list_method(r, obj, m, &a, &found);
        else if (obj.t == T_LOOP && !strcmp(m, "cycle")) {
            if (!a.n) TYPE_ERR(r, "no items for cycling given");
            res = ref(a.pos[obj.u.lp->index0 % (int64_t)a.n]);
            found = true;
        }
        if (!found) {
            jv fn = getattr_v(r, obj, m);
            if (fn.t == T_UNDEF)
                TYPE_ERR(r, "'%s' object has no attribute '%s'", type_name(obj), m);
            res = call_value(r, fn, &a);
            unref(r, fn);
        }
        unref(r, obj);
    } else {
        jv fn = eval(r, f);
        eval_args(r, n, &a);
        res = call_value(r, fn, &a);
        unref(r, fn);
    }
    free_args(r, &a);
    return res;
}

/* ------------------------------------------------------------------------ expressions --- */

static jv lookup(R *r, const jstr *name) {
    for (frame *f = r->fr; f; f = f->parent) {
        long i = dict_find_str(f->vars, name->s, name->len);
        if (i >= 0) return ref(f->vars->v[i]);
    }
    static const struct {
        const char *name;
        int fn;
    } builtins[] = {
        {"raise_exception", F_RAISE}, {"range", F_RANGE}, {"namespace", F_NAMESPACE},
        {"strftime_now", F_STRFTIME}, {"dict", F_DICT},
    };
    for (size_t i = 0; i < sizeof builtins / sizeof builtins[0]; i++)
        if (!strcmp(builtins[i].name, name->s)) return (jv){.t = T_FUNC, .u.fn = builtins[i].fn};
    return v_undef(name->s);
}

static jv eval(R *r, const node *n) {
    step(r);
    r->line = n->line;
    switch (n->kind) {
    case N_CONST: return ref(n->cval);
    case N_NAME: return lookup(r, n->name);
    case N_LIST:
    case N_TUPLE: {
        jv l = v_list(r, n->n);
        l.u.l->tuple = n->kind == N_TUPLE;
        for (size_t i = 0; i < n->n; i++) list_push(r, l.u.l, eval(r, n->kids[i]));
        return l;
    }
    case N_DICT: {
        jv d = v_dict(r);
        for (size_t i = 0; i < n->n; i++) {
            jv k = eval(r, n->kids[i]);
            if (k.t != T_STR && k.t != T_INT && k.t != T_BOOL && k.t != T_NONE && k.t != T_FLOAT &&
                !(k.t == T_LIST && k.u.l->tuple))
                TYPE_ERR(r, "unhashable type: '%s'", type_name(k));
            dict_set(r, d.u.d, k, eval(r, n->kids2[i]));
        }
        return d;
    }
    case N_ATTR: {
        jv o = eval(r, n->a);
        jv v = getattr_v(r, o, n->name->s);
        unref(r, o);
        if (v.t == T_UNDEF && !v.u.hint) v.u.hint = n->name->s;
        return v;
    }
    case N_ITEM: {
        jv o = eval(r, n->a), k = eval(r, n->b);
        jv v = getitem_v(r, o, k);
        unref(r, o);
        unref(r, k);
        if (v.t == T_UNDEF && !v.u.hint && n->b->kind == N_CONST && n->b->cval.t == T_STR)
            v.u.hint = n->b->cval.u.s->s;
        return v;
    }
    case N_SLICE: {
        jv o = eval(r, n->a);
        jv a = n->b ? eval(r, n->b) : v_none(), b = n->c ? eval(r, n->c) : v_none(),
           c = n->d ? eval(r, n->d) : v_none();
        jv v = slice_v(r, o, a, b, c);
        unref(r, o);
        return v;
    }
    case N_CALL: return eval_call(r, n);
    case N_FILTER: {
        if (n->fid < 0) TYPE_ERR(r, "No filter named '%s' found.", n->name->s);
        jv v = eval(r, n->a);
        args a;
        eval_args(r, n, &a);
        jv out = apply_filter(r, n->fid, v, &a);
        free_args(r, &a);
        unref(r, v);
        return out;
    }
    case N_TEST: {
        if (n->fid < 0) TYPE_ERR(r, "No test named '%s' found.", n->name->s);
        jv v = eval(r, n->a);
        args a;
        eval_args(r, n, &a);
        bool res = apply_test(r, n->fid, v, a.n ? &a.pos[0] : NULL, a.n);
        free_args(r, &a);
        unref(r, v);
        return v_bool(res != n->neg);
    }
    case N_BINOP: {
        jv a = eval(r, n->a), b = eval(r, n->b);
        jv v = arith(r, n->op, a, b);
        unref(r, a);
        unref(r, b);
        return v;
    }
    case N_NEG:
    case N_POS: {
        jv a = eval(r, n->a);
        if (a.t == T_FLOAT) return v_float(n->kind == N_NEG ? -a.u.f : a.u.f);
        if (is_intlike(a)) {
            if (n->kind == N_POS) return v_int(as_int(a));
            if (as_int(a) == INT64_MIN) fail(r, PGD_ERANGE, "integer overflow in '-'");
            return v_int(-as_int(a));
        }
        if (a.t == T_UNDEF) undefined_err(r, a);
        TYPE_ERR(r, "bad operand type for unary %c: '%s'", n->kind == N_NEG ? '-' : '+',
                 type_name(a));
    }
    case N_NOT: {
        jv a = eval(r, n->a);
        bool t = truthy(a);
        unref(r, a);
        return v_bool(!t);
    }
    case N_AND:
    case N_OR: {
        jv a = eval(r, n->a);
        if (truthy(a) == (n->kind == N_OR)) return a;
        unref(r, a);
        return eval(r, n->b);
    }
    case N_CMP: {
        jv left = eval(r, n->a);
        bool res = true;
        for (size_t i = 0; i < n->n && res; i++) {
            jv right = eval(r, n->kids[i]);
            switch (n->ops[i]) {
            case OP_EQ: res = py_eq(left, right); break;
            case OP_NE: res = !py_eq(left, right); break;
            case OP_LT: res = cmp_ci(r, left, right, false) < 0; break;
            case OP_LTEQ: res = cmp_ci(r, left, right, false) <= 0; break;
            case OP_GT: res = cmp_ci(r, left, right, false) > 0; break;
            case OP_GTEQ: res = cmp_ci(r, left, right, false) >= 0; break;
            case OP_IN: res = py_in(r, left, right); break;
            case OP_NOTIN: res = !py_in(r, left, right); break;
            }
            unref(r, left);
            left = right;
        }
        unref(r, left);
        return v_bool(res);
    }
    case N_COND: {
        jv t = eval(r, n->a);
        bool c = truthy(t);
        unref(r, t);
        if (c) return eval(r, n->b);
        return n->c ? eval(r, n->c) : v_undef(NULL);
    }
    case N_CONCAT: {
        sb *b = sb_new(r, 0);
        for (size_t i = 0; i < n->n; i++) {
            jv x = eval(r, n->kids[i]);
            to_str_into(r, b, x, false);
            unref(r, x);
        }
        return sb_take(r, b);
    }
    default: TYPE_ERR(r, "internal error: node %d is not an expression", n->kind);
    }
}

/* ------------------------------------------------------------------------- statements --- */

/* Binds names (one, or several unpacked from v) in the current frame; v is taken. */
static void bind(R *r, jdict *vars, jstr *const *names, size_t nn, jv v) {
    if (nn == 1) {
        dict_set(r, vars, ref((jv){.t = T_STR, .u.s = names[0]}), v);
        return;
    }
    jv items = iter_list(r, v);
    unref(r, v);
    if (items.u.l->n != nn) {
        if (items.u.l->n > nn) TYPE_ERR(r, "too many values to unpack (expected %zu)", nn);
        TYPE_ERR(r, "not enough values to unpack (expected %zu, got %zu)", nn, items.u.l->n);
    }
    for (size_t i = 0; i < nn; i++)
        dict_set(r, vars, ref((jv){.t = T_STR, .u.s = names[i]}), ref(items.u.l->v[i]));
    unref(r, items);
}

static void assign(R *r, const node *n, jv v) {
    if (n->attr) {
        jv ns = lookup(r, n->name);
        if (ns.t != T_NS) {
            unref(r, ns);
            TYPE_ERR(r, "cannot assign attribute on non-namespace object");
        }
        dict_set(r, ns.u.d, ref((jv){.t = T_STR, .u.s = n->attr}), v);
        unref(r, ns);
        return;
    }
    bind(r, r->fr->vars, n->names, n->nnames, v);
}

static jv capture(R *r, const node *body) {
    sb *saved = r->out;
    r->out = sb_new(r, 0);
    exec(r, body);
    jv s = sb_take(r, r->out);
    r->out = saved;
    return s;
}

static jv apply_filter_chain(R *r, const node *f, jv v) {
    if (f->fid < 0) TYPE_ERR(r, "No filter named '%s' found.", f->name->s);
    jv in = f->a ? apply_filter_chain(r, f->a, v) : ref(v);
    args a;
    eval_args(r, f, &a);
    jv out = apply_filter(r, f->fid, in, &a);
    free_args(r, &a);
    unref(r, in);
    return out;
}

static void exec_for(R *r, const node *n) {
    jv it = eval(r, n->a);
    jv items = iter_list(r, it);
    unref(r, it);
    if (n->b) { /* {% for x in xs if cond %}: filter first, so loop.length counts what remains */
        jv kept = v_list(r, 0);
        for (size_t i = 0; i < items.u.l->n; i++) {
            step(r);
            frame f = {.parent = r->fr, .vars = v_dict(r).u.d};
            bind(r, f.vars, n->names, n->nnames, ref(items.u.l->v[i]));
            r->fr = &f;
            jv c = eval(r, n->b);
            r->fr = f.parent;
            if (truthy(c)) list_push(r, kept.u.l, ref(items.u.l->v[i]));
            unref(r, c);
            obj_unref(r, &f.vars->h);
        }
        unref(r, items);
        items = kept;
    }
    if (!items.u.l->n) {
        unref(r, items);
        if (n->d) exec(r, n->d);
        return;
    }
    jloop *lp = obj_new(r, K_LOOP, sizeof(jloop));
    lp->items = items.u.l; /* takes the reference */
    lp->index0 = 0;
    lp->depth0 = r->loop_depth;
    jv loopv = {.t = T_LOOP, .u.lp = lp};
    static const char loop_s[] = "loop";
    r->loop_depth++;
    for (size_t i = 0; i < lp->items->n; i++) {
        step(r);
        lp->index0 = (int64_t)i;
        frame f = {.parent = r->fr, .vars = v_dict(r).u.d};
        jv ln = v_str(r, loop_s, 4);
        dict_set(r, f.vars, ln, ref(loopv));
        bind(r, f.vars, n->names, n->nnames, ref(lp->items->v[i]));
        r->fr = &f;
        exec(r, n->c);
        r->fr = f.parent;
        obj_unref(r, &f.vars->h);
        int ctl = r->ctl;
        r->ctl = CTL_NONE;
        if (ctl == CTL_BREAK) break;
    }
    r->loop_depth--;
    unref(r, loopv);
}

static void exec(R *r, const node *n) {
    switch (n->kind) {
    case N_BODY:
        for (size_t i = 0; i < n->n && !r->ctl; i++) exec(r, n->kids[i]);
        return;
    case N_DATA: sb_put(r, r->out, n->cval.u.s->s, n->cval.u.s->len); return;
    case N_OUTPUT: {
        jv v = eval(r, n->a);
        to_str_into(r, r->out, v, false);
        unref(r, v);
        return;
    }
    case N_IF: {
        step(r);
        r->line = n->line;
        jv c = eval(r, n->a);
        bool t = truthy(c);
        unref(r, c);
        if (t)
            exec(r, n->c);
        else if (n->d)
            exec(r, n->d);
        return;
    }
    case N_FOR: exec_for(r, n); return;
    case N_SET: assign(r, n, eval(r, n->b)); return;
    case N_SETBLOCK: assign(r, n, capture(r, n->c)); return;
    case N_MACRO:
        dict_set(r, r->fr->vars, ref((jv){.t = T_STR, .u.s = n->name}),
                 (jv){.t = T_MACRO, .u.m = n});
        return;
    case N_BREAK: r->ctl = CTL_BREAK; return;
    case N_CONTINUE: r->ctl = CTL_CONTINUE; return;
    case N_FILTERBLOCK: {
        jv body = capture(r, n->c);
        jv out = apply_filter_chain(r, n->a, body);
        unref(r, body);
        to_str_into(r, r->out, out, false);
        unref(r, out);
        return;
    }
    case N_WITH: {
        frame f = {.parent = r->fr, .vars = v_dict(r).u.d};
        for (size_t i = 0; i < n->nnames; i++) /* values see the outer scope only */
            dict_set(r, f.vars, ref((jv){.t = T_STR, .u.s = n->names[i]}), eval(r, n->kids2[i]));
        r->fr = &f;
        exec(r, n->c);
        r->fr = f.parent;
        obj_unref(r, &f.vars->h);
        return;
    }
    default: {
        jv v = eval(r, n); /* not reached: statements only */
        unref(r, v);
    }
    }
}

/* ================================================================================== API == */

int pgd_jinja_parse(const char *src, size_t len, pgd_jinja_tmpl **out, pgd_err *err) {
    *out = NULL;
    if (!src && len) return pgd_err_set(err, PGD_EINVAL, "template: NULL source");
    if (len > MAX_SRC)
        return pgd_err_set(err, PGD_ERANGE, "template of %zu bytes exceeds %u", len, MAX_SRC);
    pgd_jinja_tmpl *t = calloc(1, sizeof *t);
    P *p = calloc(1, sizeof *p);
    if (!t || !p) {
        free(t);
        free(p);
        return pgd_err_set(err, PGD_ENOMEM, "out of memory");
    }
    p->t = t;
    p->err = err;
    int code = setjmp(p->jb);
    if (!code) {
        /* newlines normalized to \n and one trailing newline dropped, as jinja2's lexer does */
        char *s = aalloc(p, len + 1);
        size_t n = 0;
        for (size_t i = 0; i < len; i++) {
            if (src[i] == '\r') {
                s[n++] = '\n';
                if (i + 1 < len && src[i + 1] == '\n') i++;
            } else
                s[n++] = src[i];
        }
        if (n && s[n - 1] == '\n') n--;
        s[n] = 0;
        p->src = s;
        p->len = n;
        lex(p);
        p->pos = 0;
        t->root = parse_body(p, NULL);
        check_names(p, t->root, false);
    }
    free(p->toks);
    free(p);
    if (code) {
        pgd_jinja_free(t);
        return code;
    }
    *out = t;
    return 0;
}

void pgd_jinja_free(pgd_jinja_tmpl *t) {
    if (!t) return;
    for (ablk *b = t->blocks, *next; b; b = next) {
        next = b->next;
        free(b);
    }
    free(t);
}

int pgd_jinja_render(const pgd_jinja_tmpl *t, const cJSON *ctx, const pgd_jinja_opts *opts,
                     char **out, size_t *out_len, pgd_err *err) {
    *out = NULL;
    if (out_len) *out_len = 0;
    if (!t) return pgd_err_set(err, PGD_EINVAL, "template: NULL");
    if (ctx && !cJSON_IsObject(ctx))
        return pgd_err_set(err, PGD_EINVAL, "template variables must be a JSON object");
    /* on the heap: jmp_buf is large and the render may run on a small thread stack */
    R *r = calloc(1, sizeof *r);
    if (!r) return pgd_err_set(err, PGD_ENOMEM, "out of memory");
    pgd_jinja_opts o = opts ? *opts : (pgd_jinja_opts){0};
    r->err = err;
    r->max_out = o.max_output ? o.max_output : DEF_MAX_OUTPUT;
    r->max_mem = o.max_memory ? o.max_memory : DEF_MAX_MEMORY;
    r->max_steps = o.max_steps ? o.max_steps : DEF_MAX_STEPS;
    r->max_call_depth = o.max_call_depth > 0 ? o.max_call_depth : DEF_MAX_CALL_DEPTH;
    r->now = o.now ? o.now : time(NULL);
    frame root = {0}, top = {0};
    int code = setjmp(r->jb);
    if (!code) {
        jv vars = ctx ? from_cjson(r, ctx, 0) : v_dict(r);
        root.vars = vars.u.d;
        top.parent = &root;
        top.vars = v_dict(r).u.d;
        r->fr = r->top = &top;
        sb *main_out = sb_new(r, 4096);
        r->out = main_out;
        exec(r, t->root);
        char *s = malloc(main_out->n + 1);
        if (!s) fail(r, PGD_ENOMEM, "out of memory");
        if (main_out->n) memcpy(s, main_out->p, main_out->n);
        s[main_out->n] = 0;
        *out = s;
        if (out_len) *out_len = main_out->n;
    }
    while (r->objs) obj_destroy(r, r->objs);
    free(r);
    return code;
}

/* ====================================================== content format (vLLM's detection) == */

#define CF_MAX_VARS 32

typedef struct cf_walk {
    const char *vars[CF_MAX_VARS]; /* the variables of interest found so far */
    int n;
    const char *key;  /* phase 3: loops over var[key]; else loops over / assignments of var */
    int kind;         /* N_SET (phase 1) or N_FOR (phases 2, 3) */
    int verdict;      /* phase 3: 1 a loop over a message's content, -1 a target that is not a
                         plain name where one is read (vLLM's assertion: it falls back) */
    bool grew;
} cf_walk;

/* n reads variable v (key NULL) or v[key] / v.key, possibly through filters, tests and
 * slices (vLLM's _is_var_or_elems_access). */
static bool cf_reads(const node *n, const char *v, const char *key) {
    while (n && (n->kind == N_FILTER || n->kind == N_TEST || n->kind == N_SLICE)) n = n->a;
    if (!n) return false;
    if (!key) return n->kind == N_NAME && !strcmp(n->name->s, v);
    const node *o = n->a;
    if (!o || o->kind != N_NAME || strcmp(o->name->s, v)) return false;
    if (n->kind == N_ATTR) return !strcmp(n->name->s, key);
    return n->kind == N_ITEM && n->b && n->b->kind == N_CONST && n->b->cval.t == T_STR &&
           !strcmp(n->b->cval.u.s->s, key);
}

static void cf_add(cf_walk *w, const char *name) {
    for (int i = 0; i < w->n; i++)
        if (!strcmp(w->vars[i], name)) return;
    if (w->n < CF_MAX_VARS) w->vars[w->n++] = name, w->grew = true;
}

/* Visits every node of the tree (pre-order), noting the assignments (N_SET) or loops (N_FOR)
 * that read a variable of w->vars. */
static void cf_visit(cf_walk *w, const node *n, const char **found, int *n_found) {
    if (!n || w->verdict) return;
    if (n->kind == w->kind) {
        const node *rhs = n->kind == N_SET ? n->b : n->a;
        bool hit = false;
        for (int i = 0; i < w->n && !hit; i++) hit = rhs && cf_reads(rhs, w->vars[i], w->key);
        if (hit || (w->key && rhs && rhs->kind == N_NAME && !strcmp(rhs->name->s, "content"))) {
            if (n->nnames != 1 || n->attr) { /* a tuple or namespace target */
                w->verdict = -1;
                return;
            }
            if (w->key) {
                w->verdict = 1;
                return;
            }
            if (*n_found < CF_MAX_VARS) found[(*n_found)++] = n->names[0]->s;
        }
    }
    const node *kids[4] = {n->a, n->b, n->c, n->d};
    for (int i = 0; i < 4; i++) cf_visit(w, kids[i], found, n_found);
    for (size_t i = 0; i < n->n; i++) cf_visit(w, n->kids ? n->kids[i] : NULL, found, n_found);
    for (size_t i = 0; n->kids2 && i < n->nnames; i++) cf_visit(w, n->kids2[i], found, n_found);
}

bool pgd_jinja_iterates_content(const pgd_jinja_tmpl *t) {
    if (!t || !t->root) return false;
    /* 1: "messages" and every variable assigned from it (or from one of those) */
    cf_walk lists = {.vars = {"messages"}, .n = 1, .kind = N_SET};
    const char *found[CF_MAX_VARS];
    int n_found;
    do {
        lists.grew = false;
        n_found = 0;
        cf_visit(&lists, t->root, found, &n_found);
        if (lists.verdict) return false;
        for (int i = 0; i < n_found; i++) cf_add(&lists, found[i]);
    } while (lists.grew);
    /* 2: the targets of loops over them: the messages */
    cf_walk msgs = {.kind = N_FOR};
    memcpy(msgs.vars, lists.vars, sizeof lists.vars);
    msgs.n = lists.n;
    n_found = 0;
    cf_visit(&msgs, t->root, found, &n_found);
    if (msgs.verdict) return false;
    /* 3: a loop over a message's content, or over a variable named content */
    cf_walk parts = {.kind = N_FOR, .key = "content"};
    for (int i = 0; i < n_found; i++) cf_add(&parts, found[i]);
    cf_visit(&parts, t->root, NULL, &n_found);
    return parts.verdict == 1;
}
