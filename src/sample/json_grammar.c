/* The JSON recognizer and token mask of json_grammar.h. */
#include "sample/json_grammar.h"
#include "sample/regex.h"
#include "tokenizer/unicode.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer.h"
#include "util/status.h"

enum {
    J_VALUE,     /* a value */
    J_ARR_FIRST, /* a value or ']' (after '[') */
    J_OBJ_FIRST, /* a key or '}' (after '{') */
    J_KEY,       /* a key (after ',' in an object) */
    J_COLON,     /* ':' (after a key) */
    J_AFTER,     /* ',' or the container's closer (after a value in a container) */
    J_DONE,      /* the document is complete: whitespace only */
    J_STRING,
    J_NUMBER,
    J_LITERAL,
    J_ENUM,      /* one of a schema's enum values, byte by byte */
    J_PREFIX,    /* the schema's prefix, byte by byte, before the document */
    J_SUFFIX,    /* its suffix, after the document */
};

/* number phases: after '-', after a leading '0', in the integer digits, after '.', in the
 * fraction, after 'e', after the exponent's sign, in the exponent */
enum { N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP };

static const char *const LITERALS[3] = {"true", "false", "null"};

void pgd_json_init(pgd_json_state *st, bool object_only) {
    memset(st, 0, sizeof *st);
    st->mode = J_VALUE;
    st->object_only = object_only;
    st->vnode = st->snode = st->nnode = -1;
    st->sre = -1;
}

void pgd_json_init_schema(pgd_json_state *st, const pgd_json_schema *sc) {
    pgd_json_init(st, false); /* the root's node holds the type */
    st->sc = sc;
    st->vnode = (int16_t)sc->root;
    if (sc->prefix && sc->prefix[0]) st->mode = J_PREFIX;
}

static bool feed_byte(pgd_json_state *st, unsigned char c);

/* *dst = *src, without the frames past the open containers (a copy per trie node and token) */
static inline void state_copy(pgd_json_state *dst, const pgd_json_state *src) {
    int d = !src->sc ? 0 : src->depth < PGD_JSON_SCHEMA_DEPTH ? src->depth : PGD_JSON_SCHEMA_DEPTH;
    memcpy(dst, src, offsetof(pgd_json_state, frame) + (size_t)d * sizeof src->frame[0]);
}

static bool is_ws(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
static bool is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

/* The schema node n, or NULL for any JSON (no schema, or n < 0). */
static const pgd_json_node *node_at(const pgd_json_state *st, int n) {
    return st->sc && n >= 0 ? &st->sc->nodes[n] : NULL;
}

/* The schema node of the innermost open container. */
static int container_node(const pgd_json_state *st) {
    int d = st->depth - 1;
    return st->sc && d >= 0 && d < PGD_JSON_SCHEMA_DEPTH ? st->frame[d].node : -1;
}

static uint64_t low_bits(int n) { return n >= 64 ? ~0ull : (1ull << n) - 1; }

static void value_end(pgd_json_state *st) {
    st->mode = st->depth ? J_AFTER : st->sc && st->sc->suffix && st->sc->suffix[0] ? J_SUFFIX
                                                                                  : J_DONE;
    st->pos = 0;
}

/* A byte of the schema's prefix or suffix. */
static bool literal_byte(pgd_json_state *st, const char *lit, unsigned char c, uint8_t then) {
    if ((unsigned char)lit[st->pos] != c) return false;
    if (!lit[++st->pos]) {
        st->mode = then;
        st->pos = 0;
    }
    return true;
}

static bool push(pgd_json_state *st, uint8_t object, int node) {
    int d = st->depth;
    if (d >= PGD_JSON_MAX_DEPTH) return false;
    if (d < PGD_JSON_SCHEMA_DEPTH) {
        st->frame[d] = (struct pgd_json_frame){.node = (int16_t)node};
    } else if (node >= 0) {
        return false; /* deeper than a schema may nest (refused when compiled) */
    }
    st->stack[st->depth++] = object;
    st->mode = object ? J_OBJ_FIRST : J_ARR_FIRST;
    const pgd_json_node *nd = node_at(st, node);
    if (!object) st->vnode = nd ? (int16_t)nd->items : -1;
    return true;
}

static void pop(pgd_json_state *st) {
    st->depth--;
    value_end(st);
}

/* A string starts: a key, or a value of schema node (-1: any) whose lengths it keeps. */
static void string_start(pgd_json_state *st, bool key, int node) {
    const pgd_json_node *vn = key ? NULL : node_at(st, node);
    st->snode = vn && (vn->min_len > 0 || vn->max_len < INT32_MAX || vn->pattern >= 0)
                    ? (int16_t)node
                    : -1;
    st->sre = vn && vn->pattern >= 0 ? 0 : -1;
    st->slen = 0;
    st->mode = J_STRING;
    st->key = key;
    st->phase = 0; /* 1: after a backslash */
    st->need = 0;
    st->hex = 0;
    st->surr = 0;
    st->kmatch = 0;
    st->cand = 0;
    st->pos = 0;
    const pgd_json_node *nd = key ? node_at(st, container_node(st)) : NULL;
    if (nd) { /* the candidates: the properties not seen yet (all of them, for a free key) */
        st->kmatch = !nd->additional;
        st->cand = low_bits(nd->n_props) & (st->kmatch ? ~st->frame[st->depth - 1].seen : ~0ull);
    }
}

/* A tagged union's tag (value k of its enum) was read: the object goes on as variant k, the
 * tag's property seen. */
static void tag_read(pgd_json_state *st, int k) {
    int d = st->depth - 1;
    const pgd_json_schema *sc = st->sc;
    int u = d >= 0 && d < PGD_JSON_SCHEMA_DEPTH ? st->frame[d].node : -1;
    if (u < 0 || !sc->nodes[u].n_var || sc->props[sc->nodes[u].prop0].node != st->enode) return;
    int v = sc->nodes[u].var0 + k;
    st->frame[d].node = (int16_t)sc->var_node[v];
    st->frame[d].seen = 1ull << sc->var_prop[v];
}

/* Enum candidates: a value complete at pos that nothing else can follow ends the value. */
static void enum_check_end(pgd_json_state *st) {
    const pgd_json_schema *sc = st->sc;
    const pgd_json_node *nd = &sc->nodes[st->enode];
    for (uint64_t m = st->cand; m; m &= m - 1) {
        int b = __builtin_ctzll(m), i = nd->enum0 + b;
        if (sc->enum_len[i] == st->pos && !sc->enum_num[i]) {
            tag_read(st, b);
            value_end(st);
            return;
        }
    }
}

static bool enum_start(pgd_json_state *st, int node, unsigned char c) {
    const pgd_json_schema *sc = st->sc;
    const pgd_json_node *nd = &sc->nodes[node];
    uint64_t cand = 0;
    for (int i = 0; i < nd->n_enum; i++)
        if ((unsigned char)sc->enum_text[nd->enum0 + i][0] == c) cand |= 1ull << i;
    if (!cand) return false;
    st->mode = J_ENUM;
    st->enode = (int16_t)node;
    st->cand = cand;
    st->pos = 1;
    enum_check_end(st);
    return true;
}

static bool enum_byte(pgd_json_state *st, unsigned char c) {
    const pgd_json_schema *sc = st->sc;
    const pgd_json_node *nd = &sc->nodes[st->enode];
    uint64_t next = 0;
    bool num_done = false;
    for (uint64_t m = st->cand; m; m &= m - 1) {
        int b = __builtin_ctzll(m), i = nd->enum0 + b;
        if (sc->enum_len[i] > st->pos && (unsigned char)sc->enum_text[i][st->pos] == c)
            next |= 1ull << b;
        else if (sc->enum_len[i] == st->pos && sc->enum_num[i])
            num_done = true;
    }
    if (next) {
        st->cand = next;
        st->pos++;
        enum_check_end(st);
        return true;
    }
    if (!num_done) return false;
    value_end(st); /* a number ends at the byte after it, which the state after it reads */
    return feed_byte(st, c);
}

/* Bounded numbers (minimum / maximum): their integer part has at most this many digits with
 * the sign (as a schema's integers: below 2^53, so read back exactly). */
#define BOUNDED_DIGITS 15

/* Do the magnitudes [a, b] of the number being read hold one it can still become? As an integer
 * within [ilo, ihi], or (a number, not an integer) as the integer part of a fraction frac_ok
 * takes: [fplo, fphi] when positive, [fnlo, fnhi] when negative. */
static bool reaches(const pgd_json_state *st, const pgd_json_node *nd, int64_t a, int64_t b) {
    int64_t x = st->nneg ? -b : a, y = st->nneg ? -a : b;
    if (x <= nd->ihi && y >= nd->ilo) return true;
    if (st->int_only) return false;
    return st->nneg ? a <= nd->fnhi && b >= nd->fnlo : a <= nd->fphi && b >= nd->fplo;
}

/* Can the number being read, whose integer part so far is k digits of magnitude nval (k = 0:
 * '-' alone), still end within its node's bounds? Some integer part starting with those digits,
 * at most BOUNDED_DIGITS bytes with the sign, must be reachable (reaches). */
static bool int_prefix_ok(const pgd_json_state *st, int k) {
    if (st->nnode < 0) return true;
    const pgd_json_node *nd = &st->sc->nodes[st->nnode];
    int maxd = BOUNDED_DIGITS - st->nneg;
    int64_t p = 1;
    if (k == 0) { /* '-': "-0" and every magnitude of up to maxd digits */
        for (int i = 0; i < maxd; i++) p *= 10;
        return reaches(st, nd, 0, p - 1);
    }
    if (st->nval == 0) return reaches(st, nd, 0, 0); /* "0" or "-0": no digit can follow */
    for (int m = 0; k + m <= maxd; m++, p *= 10)
        if (reaches(st, nd, st->nval * p, st->nval * p + p - 1)) return true; /* m more digits */
    return false;
}

/* A '.' after the integer part v: the value will lie in [v, v + 1) (or (-(v + 1), -v]). Taken
 * when all of that is within the bounds, or all but an end an exclusive bound leaves out; 0 if
 * not. As a double the value may round onto either end (v < 10^15: steps of at most 1/8), so
 * an exclusive bound at an end restricts the first fraction digit instead: FRAC_NZ (1-9: at
 * least 0.1 away from v) or FRAC_NOT9 (0-8: at least 0.1 away from v + 1). */
enum { FRAC_OK = 1, FRAC_NZ = 2, FRAC_NOT9 = 4 };
static int frac_ok(const pgd_json_state *st) {
    if (st->nnode < 0) return FRAC_OK;
    const pgd_json_node *nd = &st->sc->nodes[st->nnode];
    double v = (double)st->nval;
    /* the ends of the value's range: near (the integer part) and far (one past it) */
    double near = st->nneg ? -v : v, far = st->nneg ? -(v + 1) : v + 1;
    double lo = st->nneg ? far : near, hi = st->nneg ? near : far;
    if (lo < nd->lo || hi > nd->hi) return 0;
    int f = FRAC_OK;
    bool near_excl = st->nneg ? nd->hi_excl && near == nd->hi : nd->lo_excl && near == nd->lo;
    bool far_excl = st->nneg ? nd->lo_excl && far == nd->lo : nd->hi_excl && far == nd->hi;
    if (near_excl) f |= FRAC_NZ;
    if (far_excl) f |= FRAC_NOT9;
    return f;
}

/* The type a value starting with c has among types (PGD_JT_*), or -1. */
static int type_of(unsigned char c, unsigned types) {
    int t = c == '{' ? PGD_JT_OBJ : c == '[' ? PGD_JT_ARR : c == '"' ? PGD_JT_STR
          : c == 't' || c == 'f' ? PGD_JT_BOOL : c == 'n' ? PGD_JT_NULL : -1;
    if (c == '-' || is_digit(c)) t = types & (1u << PGD_JT_NUM) ? PGD_JT_NUM : PGD_JT_INT;
    return t >= 0 && (types & (1u << t)) ? t : -1;
}

static bool value_start(pgd_json_state *st, unsigned char c) {
    if (st->depth == 0 && st->object_only && c != '{') return false;
    int d = st->depth - 1;
    if (st->sc && d >= 0 && d < PGD_JSON_SCHEMA_DEPTH && !st->stack[d]) st->frame[d].count++;
    int target = -1;
    st->int_only = 0;
    const pgd_json_node *nd = node_at(st, st->vnode);
    if (nd) {
        if (nd->n_enum) return enum_start(st, st->vnode, c);
        int t = type_of(c, nd->types);
        if (t < 0) return false;
        target = nd->by_type[t];
        if (target != st->vnode && st->sc->nodes[target].n_enum) return enum_start(st, target, c);
        st->int_only = t == PGD_JT_INT;
    }
    switch (c) {
    case '{': return push(st, 1, target);
    case '[': return push(st, 0, target);
    case '"': string_start(st, false, target); return true;
    case '-':
    case '0': case '1': case '2': case '3': case '4': case '5': case '6': case '7': case '8':
    case '9':
        st->mode = J_NUMBER;
        st->phase = c == '-' ? N_MINUS : c == '0' ? N_ZERO : N_INT;
        st->num_len = 1;
        st->nneg = c == '-';
        st->nfrac = 0;
        st->nval = c == '-' ? 0 : c - '0';
        st->nnode = nd && st->sc->nodes[target].bounded ? (int16_t)target : -1;
        return int_prefix_ok(st, c != '-');
    case 't': case 'f': case 'n':
        st->mode = J_LITERAL;
        st->lit = c == 't' ? 0 : c == 'f' ? 1 : 2;
        st->lit_pos = 1;
        return true;
    default: return false;
    }
}

/* A byte of a key's text (not its closing quote) against the object's properties. No escape in
 * a key of an object a schema holds: "\u0061" is the key "a", which would need decoding to match
 * (and to catch as a duplicate). */
static bool key_byte(pgd_json_state *st, unsigned char c) {
    if (c == '\\') return false;
    if (!st->cand) return !st->kmatch;
    const pgd_json_node *nd = node_at(st, container_node(st));
    uint64_t next = 0;
    for (uint64_t m = st->cand; m; m &= m - 1) {
        int b = __builtin_ctzll(m);
        const pgd_json_prop *p = &st->sc->props[nd->prop0 + b];
        if (p->len > st->pos && (unsigned char)p->name[st->pos] == c) next |= 1ull << b;
    }
    if (!next && st->kmatch) return false;
    st->cand = next;
    st->pos++;
    return true;
}

/* The closing quote of a key: which property it names, and so the schema of its value. */
static bool key_end(pgd_json_state *st) {
    st->mode = J_COLON;
    const pgd_json_node *nd = node_at(st, container_node(st));
    if (!nd) {
        st->vnode = -1;
        return true;
    }
    for (uint64_t m = st->cand; m; m &= m - 1) {
        int b = __builtin_ctzll(m);
        const pgd_json_prop *p = &st->sc->props[nd->prop0 + b];
        if (p->len != st->pos) continue;
        uint64_t *seen = &st->frame[st->depth - 1].seen;
        if (*seen & (1ull << b)) return false; /* a property twice */
        *seen |= 1ull << b;
        st->vnode = (int16_t)p->node;
        return true;
    }
    if (st->kmatch) return false;
    st->vnode = (int16_t)nd->addl;
    return true;
}

static bool is_hex(unsigned char c) {
    return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

static unsigned hex_val(unsigned char c) {
    return is_digit(c) ? c - '0' : (c | 0x20) - 'a' + 10;
}

/* A string with a pattern: its DFA over the decoded bytes b[0..n) (false: no match can follow;
 * the state is then left as it was). */
/* With minLength / maxLength: from DFA state q, after chars characters (the one being read
 * included), a match can still end within them (lmin and lmax count the ones after it). */
static bool re_len_ok(const pgd_regex *re, const pgd_json_node *nd, int64_t chars, int32_t q) {
    if (re->lens) /* exact: some match length falls in the window */
        return pgd_regex_len_in(re, q, nd->min_len - chars, nd->max_len - chars);
    return chars + re->lmin[q] <= nd->max_len &&
           (re->unbounded[q] || chars + re->lmax[q] >= nd->min_len);
}

static bool re_feed(pgd_json_state *st, const unsigned char *b, int n) {
    if (st->sre < 0) return true;
    const pgd_json_node *nd = &st->sc->nodes[st->snode];
    const pgd_regex *re = &st->sc->regex[nd->pattern];
    int32_t q = st->sre;
    for (int i = 0; i < n && q >= 0; i++) q = pgd_regex_next(re, q, b[i]);
    if (q < 0 || !re_len_ok(re, nd, st->slen, q)) return false;
    st->sre = q;
    return true;
}

/* Under a pattern: the single-byte character c can be the one being read (an escape's). */
static bool re_char_ok(const pgd_json_state *st, unsigned c) {
    const pgd_json_node *nd = &st->sc->nodes[st->snode];
    const pgd_regex *re = &st->sc->regex[nd->pattern];
    int32_t q = pgd_regex_next(re, st->sre, (uint8_t)c);
    return q >= 0 && re_len_ok(re, nd, st->slen, q);
}

/* Under a pattern, some character among [lo, hi] and the control characters (the ones a \\u
 * escape may write there: the others are written as themselves) keeps a match possible. An
 * escape is taken only where one can end well, so the mask never leads to a dead end. */
static bool re_any_control(const pgd_json_state *st, unsigned lo, unsigned hi) {
    for (unsigned c = lo; c <= hi && c < 0x20; c++)
        if (re_char_ok(st, c)) return true;
    return false;
}

/* Code point cp as UTF-8 into the DFA. */
static bool re_feed_cp(pgd_json_state *st, uint32_t cp) {
    char b[4];
    int n = pgd__utf8_encode(cp, b);
    return re_feed(st, (const unsigned char *)b, n);
}

/* The last digit of a \uXXXX escape: a high surrogate must be followed by a low one's escape,
 * and a low one must follow a high one (UTF-8 has no lone surrogates; strict parsers refuse
 * them). The character goes to the pattern's DFA once whole. */
static bool escape_end(pgd_json_state *st) {
    unsigned v = st->hexval;
    bool high = v >= 0xD800 && v <= 0xDBFF, low = v >= 0xDC00 && v <= 0xDFFF;
    if (st->surr) {
        st->surr = 0;
        return low && re_feed_cp(st, 0x10000 + ((uint32_t)(st->hsurr - 0xD800) << 10) +
                                         (v - 0xDC00));
    }
    if (low) return false;
    st->surr = high;
    if (high) {
        st->hsurr = (uint16_t)v;
        return true;
    }
    return re_feed_cp(st, v);
}

static bool string_byte(pgd_json_state *st, unsigned char c) {
    bool between = !st->need && !st->hex && st->phase == 0; /* not inside a character/escape */
    if (st->surr && between) { /* a low surrogate's "\u" must come */
        if (c != '\\') return false;
        st->phase = 1;
        return true;
    }
    if (between && c == '"') {
        if (st->key) return key_end(st);
        if (st->snode >= 0 && st->slen < st->sc->nodes[st->snode].min_len) return false;
        if (st->sre >= 0 && !st->sc->regex[st->sc->nodes[st->snode].pattern].accept[st->sre])
            return false; /* the pattern is not matched whole */
        value_end(st);
        return true;
    }
    if (between) { /* a character starts (a surrogate pair's second escape does not) */
        if (st->snode >= 0 && st->slen >= st->sc->nodes[st->snode].max_len) return false;
        if (st->slen < UINT16_MAX) st->slen++;
    }
    if (st->key && st->sc && container_node(st) >= 0 && !key_byte(st, c)) return false;
    if (st->need) { /* a continuation byte of a multi-byte character */
        if (c < st->lo || c > st->hi || !re_feed(st, &c, 1)) return false;
        st->need--;
        st->lo = 0x80;
        st->hi = 0xBF;
        return true;
    }
    if (st->hex) {
        if (!is_hex(c)) return false;
        st->hexval = (uint16_t)(st->hexval << 4 | hex_val(c));
        st->hex--;
        unsigned lo = (unsigned)st->hexval << (4 * st->hex), hi = lo | ((1u << (4 * st->hex)) - 1);
        if (st->sre >= 0 && !re_any_control(st, lo, hi)) return false;
        return st->hex ? true : escape_end(st);
    }
    if (st->phase == 1) { /* after a backslash */
        st->phase = 0;
        if (c == 'u') {
            if (st->sre >= 0 && !re_any_control(st, 0, 0x1F)) return false;
            st->hex = 4;
            st->hexval = 0;
            return true;
        }
        static const char esc[] = "\"\\/bfnrt", dec[] = "\"\\/\b\f\n\r\t";
        const char *e = c ? strchr(esc, c) : NULL;
        if (st->surr || !e) return false;
        unsigned char d = (unsigned char)dec[e - esc];
        return re_feed(st, &d, 1); /* the escaped character */
    }
    if (c == '\\') {
        if (st->sre >= 0 && !re_char_ok(st, '"') && !re_char_ok(st, '\\') &&
            !re_char_ok(st, '/') && !re_any_control(st, 0, 0x1F))
            return false; /* no escape could go on */
        st->phase = 1;
        return true;
    }
    if (c < 0x20) return false; /* control characters must be escaped */
    if (!re_feed(st, &c, 1)) return false;
    if (c < 0x80) return true;
    /* a lead byte; UTF-8's narrowed second-byte ranges exclude overlongs, surrogates and code
     * points past U+10FFFF */
    st->lo = 0x80;
    st->hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) st->need = 1;
    else if (c >= 0xE0 && c <= 0xEF) st->need = 2;
    else if (c >= 0xF0 && c <= 0xF4) st->need = 3;
    else return false;
    if (c == 0xE0) st->lo = 0xA0;
    else if (c == 0xED) st->hi = 0x9F;
    else if (c == 0xF0) st->lo = 0x90;
    else if (c == 0xF4) st->hi = 0x8F;
    return true;
}

static bool in_bounds(const pgd_json_node *nd, int64_t v) { return v >= nd->ilo && v <= nd->ihi; }

static bool number_can_end(uint8_t phase) {
    return phase == N_ZERO || phase == N_INT || phase == N_FRAC || phase == N_EXP;
}

/* A number byte; *ended: c is not part of the number, which is complete (c is then fed to the
 * state after it). The length bound never strands a number: a byte that must be followed by a
 * digit ('-', '.', 'e', a sign) is taken only while there is room for what it needs. */
static bool number_byte(pgd_json_state *st, unsigned char c, bool *ended) {
    uint8_t next;
    int nz = 0;
    bool digit = is_digit(c), e = (c == 'e' || c == 'E') && !st->int_only;
    if (st->nnode >= 0) e = false; /* bounds: no exponent */
    switch (st->phase) {
    case N_MINUS: if (c == '0') next = N_ZERO; else if (digit) next = N_INT; else return false;
        break;
    case N_ZERO:
    case N_INT:
    case N_FRAC:
        if (digit && st->phase != N_ZERO) next = st->phase;
        else if (c == '.' && st->phase != N_FRAC && !st->int_only && (nz = frac_ok(st)))
            next = N_DOT;
        else if (e) next = N_E;
        else if (digit) return false; /* a leading zero */
        else if (c == '.' || c == 'e' || c == 'E') return false; /* an integer's schema */
        else if (st->nnode >= 0 && st->phase != N_FRAC &&
                 !in_bounds(&st->sc->nodes[st->nnode], st->nneg ? -st->nval : st->nval)) {
            return false; /* the integer is out of bounds: only more digits can come */
        } else {
            *ended = true;
            return true;
        }
        break;
    case N_DOT: if (!digit) return false; next = N_FRAC; break;
    case N_E:
        if (c == '+' || c == '-') next = N_ESIGN;
        else if (digit) next = N_EXP;
        else return false;
        break;
    case N_ESIGN: if (!digit) return false; next = N_EXP; break;
    default: /* N_EXP */
        if (!digit) {
            *ended = true;
            return true;
        }
        next = N_EXP;
        break;
    }
    if (st->phase == N_DOT && (((st->nfrac & FRAC_NZ) && c == '0') ||
                               ((st->nfrac & FRAC_NOT9) && c == '9')))
        return false; /* the first fraction digit under an exclusive bound at an end */
    if (number_can_end(st->phase)) {
        /* an integer a schema asks for stays below 2^53, where it reads back exactly */
        if (st->num_len >= (st->int_only ? 15 : PGD_JSON_MAX_NUM)) return false;
        if (!number_can_end(next) && st->num_len >= PGD_JSON_MAX_NUM - 2) return false;
    }
    st->num_len++;
    if (next == N_DOT) st->nfrac = (uint8_t)nz;
    if (digit && (next == N_ZERO || next == N_INT) && st->nnode >= 0) { /* a bounded one's */
        st->nval = st->phase == N_MINUS ? c - '0' : st->nval * 10 + (c - '0');
        st->phase = next;
        return int_prefix_ok(st, st->num_len - st->nneg);
    }
    st->phase = next;
    return true;
}

/* Whitespace between tokens, llama.cpp's bounded rule (json-schema-to-grammar's space):
 * nothing, one space, or one or two newlines and then up to PGD_JSON_MAX_INDENT spaces or
 * tabs. st->ws: 0 none yet, WS_SPACE, WS_NL1, WS_NL2, then WS_NL2 + the indent so far. */
enum { WS_SPACE = 1, WS_NL1, WS_NL2 };

static bool ws_byte(pgd_json_state *st, unsigned char c) {
    if (c == '\n') {
        if (st->ws != 0 && st->ws != WS_NL1) return false;
        st->ws = st->ws ? WS_NL2 : WS_NL1;
        return true;
    }
    if (c == ' ' && st->ws == 0) {
        st->ws = WS_SPACE;
        return true;
    }
    if ((c != ' ' && c != '\t') || st->ws < WS_NL1 || st->ws >= WS_NL2 + PGD_JSON_MAX_INDENT)
        return false;
    st->ws = st->ws == WS_NL1 ? WS_NL2 + 1 : st->ws + 1;
    return true;
}

static bool feed_byte(pgd_json_state *st, unsigned char c) {
    if (st->mode == J_STRING) return string_byte(st, c);
    if (st->mode == J_ENUM) return enum_byte(st, c);
    if (st->mode == J_PREFIX) return literal_byte(st, st->sc->prefix, c, J_VALUE);
    if (st->mode == J_SUFFIX) return literal_byte(st, st->sc->suffix, c, J_DONE);
    if (st->mode == J_LITERAL) {
        const char *l = LITERALS[st->lit];
        if ((unsigned char)l[st->lit_pos] != c) return false;
        if (!l[++st->lit_pos]) value_end(st);
        return true;
    }
    if (st->mode == J_NUMBER) {
        bool ended = false;
        if (!number_byte(st, c, &ended)) return false;
        if (!ended) return true;
        value_end(st); /* c follows the number: it is read in the state after it */
    }
    if (is_ws(c)) return ws_byte(st, c);
    st->ws = 0;
    const pgd_json_node *nd = st->depth > 0 ? node_at(st, container_node(st)) : NULL;
    switch (st->mode) {
    case J_VALUE: return value_start(st, c);
    case J_ARR_FIRST:
        if (c == ']') {
            if (nd && nd->min_items > 0) return false;
            pop(st);
            return true;
        }
        if (nd && nd->max_items == 0) return false;
        return value_start(st, c);
    case J_OBJ_FIRST:
        if (c == '}') {
            if (nd && nd->required) return false;
            pop(st);
            return true;
        }
        if (c != '"' || (nd && !nd->additional && nd->n_props == 0)) return false;
        string_start(st, true, -1);
        return true;
    case J_KEY:
        if (c != '"') return false;
        string_start(st, true, -1);
        return true;
    case J_COLON:
        if (c != ':') return false;
        st->mode = J_VALUE;
        return true;
    case J_AFTER: {
        int d = st->depth - 1;
        bool obj = st->stack[d];
        if (c == ',') {
            if (obj) { /* a ',' needs a key that can still come */
                if (nd && !nd->additional && (st->frame[d].seen | ~low_bits(nd->n_props)) == ~0ull)
                    return false;
                st->mode = J_KEY;
            } else {
                if (nd && st->frame[d].count >= nd->max_items) return false;
                st->mode = J_VALUE;
                st->vnode = nd ? (int16_t)nd->items : -1;
            }
            return true;
        }
        if (c != (obj ? '}' : ']')) return false;
        if (nd && obj && (nd->required & ~st->frame[d].seen)) return false;
        if (nd && !obj && st->frame[d].count < nd->min_items) return false;
        pop(st);
        return true;
    }
    default: return false; /* J_DONE: nothing but whitespace */
    }
}

bool pgd_json_feed(pgd_json_state *st, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!feed_byte(st, (unsigned char)s[i])) return false;
    return true;
}

bool pgd_json_complete(const pgd_json_state *st) {
    if (st->mode == J_DONE) return true;
    /* a top-level number ends with the input ("12"), where it has a whole form */
    return st->mode == J_NUMBER && st->depth == 0 &&
           (st->phase == N_ZERO || st->phase == N_INT || st->phase == N_FRAC ||
            st->phase == N_EXP);
}

/* A trie node: the byte on the edge into it, its depth (bytes from the root), the index just
 * past its subtree, and the tokens whose text ends here (sorted[tok..tok + n_tok)). */
typedef struct pgd_json_trie {
    int32_t skip, tok;
    uint16_t depth, n_tok;
    uint8_t byte;
} pgd_json_trie;

typedef struct text_ref {
    const char *text;
    uint32_t len;
    int32_t id;
} text_ref;

static int cmp_text(const void *a, const void *b) {
    const text_ref *x = a, *y = b;
    int c = memcmp(x->text, y->text, x->len < y->len ? x->len : y->len);
    if (c) return c;
    if (x->len != y->len) return x->len < y->len ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* v->sorted: the text tokens in byte order of their texts (ties by id). */
static int sort_texts(pgd_json_vocab *v) {
    text_ref *r = malloc((size_t)(v->n_text ? v->n_text : 1) * sizeof *r);
    if (!r) return PGD_ENOMEM;
    for (int32_t i = 0; i < v->n_text; i++) {
        int32_t id = v->sorted[i];
        r[i] = (text_ref){v->text[id], v->len[id], id};
    }
    qsort(r, (size_t)v->n_text, sizeof *r, cmp_text);
    for (int32_t i = 0; i < v->n_text; i++) v->sorted[i] = r[i].id;
    free(r);
    return PGD_OK;
}

/* The trie of sorted's texts in depth-first order, built from the sorted list: each text shares
 * its longest common prefix with the one before it. */
static int build_trie(pgd_json_vocab *v, uint32_t max_len) {
    size_t total = 1;
    for (int32_t i = 0; i < v->n_text; i++) total += v->len[v->sorted[i]];
    if (total > INT32_MAX) return PGD_ENOMEM;
    v->trie = malloc(total * sizeof *v->trie);
    int32_t *path = malloc((max_len + 1) * sizeof *path); /* node index by depth */
    if (!v->trie || !path) {
        free(path);
        return PGD_ENOMEM;
    }
    int32_t nn = 0, depth = 0;
    const char *prev = NULL;
    uint32_t prev_len = 0;
    for (int32_t i = 0; i < v->n_text; i++) {
        int32_t id = v->sorted[i];
        const char *s = v->text[id];
        uint32_t l = v->len[id], lcp = 0;
        while (lcp < l && lcp < prev_len && s[lcp] == prev[lcp]) lcp++;
        for (; depth > (int32_t)lcp; depth--) v->trie[path[depth]].skip = nn; /* subtrees done */
        for (; depth < (int32_t)l; depth++) {
            pgd_json_trie *nd = &v->trie[nn];
            *nd = (pgd_json_trie){.skip = -1, .tok = -1, .depth = (uint16_t)(depth + 1),
                                  .byte = (uint8_t)s[depth]};
            path[depth + 1] = nn++;
        }
        pgd_json_trie *end = &v->trie[path[l]];
        if (end->tok < 0) end->tok = i;
        if (end->n_tok < UINT16_MAX) end->n_tok++;
        prev = s;
        prev_len = l;
    }
    for (; depth > 0; depth--) v->trie[path[depth]].skip = nn;
    v->n_trie = nn;
    free(path);
    return PGD_OK;
}

/* v->long_first: the plain tokens by character count, most first (a counting sort). */
static int sort_long_first(pgd_json_vocab *v) {
    size_t *start = calloc(UINT16_MAX + 2, sizeof *start);
    v->long_first = malloc((size_t)(v->n_plain ? v->n_plain : 1) * sizeof *v->long_first);
    if (!start || !v->long_first) {
        free(start);
        return PGD_ENOMEM;
    }
    for (int32_t id = 0; id < v->n; id++)
        if (v->plain[id]) start[UINT16_MAX - v->nchar[id] + 1]++;
    for (size_t k = 1; k <= UINT16_MAX + 1; k++) start[k] += start[k - 1];
    for (int32_t id = 0; id < v->n; id++)
        if (v->plain[id]) v->long_first[start[UINT16_MAX - v->nchar[id]]++] = id;
    free(start);
    return PGD_OK;
}

int pgd_json_vocab_index(pgd_json_vocab *v) {
    int32_t n = v->n;
    uint32_t max_len = 0;
    v->sorted = malloc((size_t)(n ? n : 1) * sizeof *v->sorted);
    v->plain = calloc((size_t)(n ? n : 1), 1);
    v->nchar = calloc((size_t)(n ? n : 1), sizeof *v->nchar);
    v->quoted = malloc((size_t)(n ? n : 1) * sizeof *v->quoted);
    v->escaped = malloc((size_t)(n ? n : 1) * sizeof *v->escaped);
    if (!v->sorted || !v->plain || !v->nchar || !v->quoted || !v->escaped) return PGD_ENOMEM;
    v->n_text = v->n_plain = v->n_quoted = v->n_escaped = 0;
    pgd_json_state in_str;
    pgd_json_init(&in_str, false);
    string_start(&in_str, false, -1);
    for (int32_t id = 0; id < n; id++) {
        if (!v->len[id] || v->eog[id] || v->len[id] > UINT16_MAX) continue;
        v->sorted[v->n_text++] = id;
        if (v->len[id] > max_len) max_len = v->len[id];
        /* a token without a quote stays inside a string, where what it is accepted after
         * does not depend on the key or the depth: one answer for every string */
        if (memchr(v->text[id], '"', v->len[id])) {
            v->quoted[v->n_quoted++] = id;
            continue;
        }
        pgd_json_state t = in_str;
        if (pgd_json_feed(&t, v->text[id], v->len[id])) {
            v->plain[id] = 1;
            v->nchar[id] = t.slen;
            v->n_plain++;
            if (memchr(v->text[id], '\\', v->len[id])) v->escaped[v->n_escaped++] = id;
        }
    }
    if (sort_texts(v) || sort_long_first(v)) return PGD_ENOMEM;
    v->max_len = (int32_t)max_len;
    v->stack = malloc((max_len + 1) * sizeof *v->stack);
    v->dfa_stack = malloc((max_len + 1) * sizeof *v->dfa_stack);
    v->char_stack = malloc((max_len + 1) * sizeof *v->char_stack);
    if (!v->stack || !v->dfa_stack || !v->char_stack) return PGD_ENOMEM;
    return build_trie(v, max_len);
}

/* The first position of v->sorted whose text is not below r[0..n) in cmp_text's order. */
static int32_t lower_bound(const pgd_json_vocab *v, const char *r, size_t n) {
    int32_t lo = 0, hi = v->n_text;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo) / 2, id = v->sorted[mid];
        size_t l = v->len[id];
        int c = memcmp(v->text[id], r, l < n ? l : n);
        if (c < 0 || (c == 0 && l < n)) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

int32_t pgd_json_vocab_find(const pgd_json_vocab *v, const char *t, size_t n) {
    int32_t i = lower_bound(v, t, n);
    if (n == 0 || i == v->n_text) return -1;
    int32_t id = v->sorted[i];
    return v->len[id] == n && !memcmp(v->text[id], t, n) ? id : -1;
}

void pgd_json_vocab_allow_prefixes(const pgd_json_vocab *v, const char *r, size_t n,
                                   uint8_t *allow) {
    for (size_t l = 1; l <= n; l++) {
        int32_t i = lower_bound(v, r, l);
        /* no text starts with r[0..l): none starts with a longer prefix either */
        if (i == v->n_text || v->len[v->sorted[i]] < l || memcmp(v->text[v->sorted[i]], r, l))
            break;
        for (; i < v->n_text && v->len[v->sorted[i]] == l &&
               !memcmp(v->text[v->sorted[i]], r, l); i++)
            allow[v->sorted[i]] = 1;
    }
}

int pgd_json_vocab_build(pgd_json_vocab *v, const struct pgd_tokenizer *t, int32_t n_vocab) {
    memset(v, 0, sizeof *v);
    v->n = n_vocab;
    v->text = calloc((size_t)(n_vocab ? n_vocab : 1), sizeof *v->text);
    v->len = calloc((size_t)(n_vocab ? n_vocab : 1), sizeof *v->len);
    v->eog = calloc((size_t)(n_vocab ? n_vocab : 1), 1);
    if (!v->text || !v->len || !v->eog) return PGD_ENOMEM;
    for (int32_t id = 0; id < n_vocab; id++) { /* (ids past the tokenizer's: no text) */
        size_t l;
        v->text[id] = pgd_tokenizer_piece(t, id, &l);
        v->len[id] = (uint32_t)l;
        v->eog[id] = id < pgd_tokenizer_n_vocab(t) && pgd_tokenizer_is_eog(t, id);
    }
    return pgd_json_vocab_index(v);
}

void pgd_json_vocab_free(pgd_json_vocab *v) {
    free(v->text);
    free(v->len);
    free(v->eog);
    free(v->sorted);
    free(v->trie);
    free(v->stack);
    free(v->dfa_stack);
    free(v->char_stack);
    free(v->escaped);
    free(v->plain);
    free(v->nchar);
    free(v->long_first);
    free(v->quoted);
    memset(v, 0, sizeof *v);
}

static bool token_ok(const pgd_json_state *st, const pgd_json_vocab *v, int32_t id) {
    pgd_json_state t;
    state_copy(&t, st);
    return pgd_json_feed(&t, v->text[id], v->len[id]);
}

/* The trie walk behind every mask (pgd_json_vocab_walk's contract). Inlined into each caller, so
 * step is a direct call on the per-token mask path. */
static inline __attribute__((always_inline)) int32_t
trie_walk(const pgd_json_vocab *v, bool (*step)(void *ctx, int32_t d, uint8_t b), void *ctx,
          uint8_t *allow) {
    int32_t n_ok = 0;
    memset(allow, 0, (size_t)v->n);
    for (int32_t i = 0; i < v->n_trie;) {
        const pgd_json_trie *nd = &v->trie[i];
        if (!step(ctx, nd->depth, nd->byte)) {
            i = nd->skip;
            continue;
        }
        for (int32_t k = 0; k < nd->n_tok; k++) allow[v->sorted[nd->tok + k]] = 1;
        n_ok += nd->n_tok;
        i++;
    }
    return n_ok;
}

typedef struct dfa_walk {
    const pgd_regex *re;
    int32_t *ds; /* (max_len + 1) the DFA state after each depth's byte */
} dfa_walk;

static bool dfa_step(void *ctx, int32_t d, uint8_t b) {
    dfa_walk *w = ctx;
    int32_t t = pgd_regex_next(w->re, w->ds[d - 1], b);
    if (t < 0) return false;
    w->ds[d] = t;
    return true;
}

int32_t pgd_json_vocab_walk_dfa(pgd_json_vocab *v, const pgd_regex *re, int32_t q,
                                uint8_t *allow) {
    dfa_walk w = {re, v->dfa_stack};
    w.ds[0] = q;
    return trie_walk(v, dfa_step, &w, allow);
}

int32_t pgd_json_vocab_walk(const pgd_json_vocab *v, bool (*step)(void *ctx, int32_t d, uint8_t b),
                            void *ctx, uint8_t *allow) {
    return trie_walk(v, step, ctx, allow);
}

/* Inside a string held to a pattern, between characters: the trie walked with the pattern's DFA
 * and the character count, as string_byte would take each byte (a subtree is cut where the DFA
 * refuses, or no match can end within minLength/maxLength); a quote, a backslash or a control
 * byte ends a path: the few tokens with one are tried whole. */
typedef struct pattern_walk {
    const pgd_regex *re;
    const pgd_json_node *sn;
    int32_t *ds, *cs; /* (max_len + 1) the DFA state and the character count after each depth */
} pattern_walk;

static bool pattern_step(void *ctx, int32_t d, uint8_t b) {
    pattern_walk *w = ctx;
    int32_t t = b == '"' || b == '\\' || b < 0x20 ? -1 : pgd_regex_next(w->re, w->ds[d - 1], b);
    int32_t c = w->cs[d - 1] + ((b & 0xC0) != 0x80);
    if (t < 0 || !re_len_ok(w->re, w->sn, c, t)) return false;
    w->ds[d] = t;
    w->cs[d] = c;
    return true;
}

static int32_t pattern_string_mask(const pgd_json_state *st, pgd_json_vocab *v, uint8_t *allow) {
    const pgd_json_node *sn = &st->sc->nodes[st->snode];
    pattern_walk w = {&st->sc->regex[sn->pattern], sn, v->dfa_stack, v->char_stack};
    w.ds[0] = st->sre;
    w.cs[0] = st->slen;
    int32_t n_ok = trie_walk(v, pattern_step, &w, allow);
    for (int32_t i = 0; i < v->n_quoted + v->n_escaped; i++) {
        int32_t id = i < v->n_quoted ? v->quoted[i] : v->escaped[i - v->n_quoted];
        if (!allow[id] && token_ok(st, v, id)) {
            allow[id] = 1;
            n_ok++;
        }
    }
    return n_ok;
}

/* The general step: the parser state at depth d is the one at d - 1 fed byte b. */
static bool state_step(void *ctx, int32_t d, uint8_t b) {
    pgd_json_state *stack = ctx;
    state_copy(&stack[d], &stack[d - 1]);
    return feed_byte(&stack[d], b);
}

int32_t pgd_json_allowed(const pgd_json_state *st, pgd_json_vocab *v, uint8_t *allow) {
    int32_t n_ok = 0;
    if (pgd_json_complete(st)) {
        for (int32_t id = 0; id < v->n; id++) n_ok += allow[id] = v->eog[id];
        return n_ok;
    }
    if (st->mode == J_STRING && !st->need && !st->hex && !st->phase && !st->surr &&
        st->sre >= 0)
        return pattern_string_mask(st, v, allow);
    if (st->mode == J_STRING && !st->need && !st->hex && !st->phase && !st->surr &&
        !(st->key && st->sc)) {
        /* inside a string, between characters: the tokens without a quote as precomputed (that
         * fit in a maxLength), those with one tried */
        int32_t room = st->snode >= 0 ? st->sc->nodes[st->snode].max_len - st->slen : INT32_MAX;
        memcpy(allow, v->plain, (size_t)v->n);
        n_ok = v->n_plain;
        for (int32_t i = 0; i < v->n_plain && v->nchar[v->long_first[i]] > room; i++, n_ok--)
            allow[v->long_first[i]] = 0; /* past maxLength */
        for (int32_t i = 0; i < v->n_quoted; i++) {
            int32_t id = v->quoted[i];
            if (token_ok(st, v, id)) {
                allow[id] = 1;
                n_ok++;
            }
        }
        return n_ok;
    }
    /* elsewhere few bytes can come next: walk the trie, skipping each refused subtree */
    state_copy(&v->stack[0], st);
    return trie_walk(v, state_step, v->stack, allow);
}
