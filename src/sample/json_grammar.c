/* The JSON recognizer and token mask of json_grammar.h. */
#include "sample/json_grammar.h"

#include <stdlib.h>
#include <string.h>

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
};

/* number phases: after '-', after a leading '0', in the integer digits, after '.', in the
 * fraction, after 'e', after the exponent's sign, in the exponent */
enum { N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP };

static const char *const LITERALS[3] = {"true", "false", "null"};

void pgd_json_init(pgd_json_state *st, bool object_only) {
    memset(st, 0, sizeof *st);
    st->mode = J_VALUE;
    st->object_only = object_only;
}

static bool is_ws(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
static bool is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

static void value_end(pgd_json_state *st) { st->mode = st->depth == 0 ? J_DONE : J_AFTER; }

static bool push(pgd_json_state *st, uint8_t object) {
    if (st->depth >= PGD_JSON_MAX_DEPTH) return false;
    st->stack[st->depth++] = object;
    st->mode = object ? J_OBJ_FIRST : J_ARR_FIRST;
    return true;
}

static void pop(pgd_json_state *st) {
    st->depth--;
    value_end(st);
}

static void string_start(pgd_json_state *st, bool key) {
    st->mode = J_STRING;
    st->key = key;
    st->phase = 0; /* 1: after a backslash */
    st->need = 0;
    st->hex = 0;
}

static bool value_start(pgd_json_state *st, unsigned char c) {
    if (st->depth == 0 && st->object_only && c != '{') return false;
    switch (c) {
    case '{': return push(st, 1);
    case '[': return push(st, 0);
    case '"': string_start(st, false); return true;
    case '-': st->mode = J_NUMBER; st->phase = N_MINUS; st->num_len = 1; return true;
    case '0': st->mode = J_NUMBER; st->phase = N_ZERO; st->num_len = 1; return true;
    case 't': case 'f': case 'n':
        st->mode = J_LITERAL;
        st->lit = c == 't' ? 0 : c == 'f' ? 1 : 2;
        st->lit_pos = 1;
        return true;
    default:
        if (c < '1' || c > '9') return false;
        st->mode = J_NUMBER;
        st->phase = N_INT;
        st->num_len = 1;
        return true;
    }
}

static bool string_byte(pgd_json_state *st, unsigned char c) {
    if (st->need) { /* a continuation byte of a multi-byte character */
        if (c < st->lo || c > st->hi) return false;
        st->need--;
        st->lo = 0x80;
        st->hi = 0xBF;
        return true;
    }
    if (st->hex) {
        if (!(is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'))) return false;
        st->hex--;
        return true;
    }
    if (st->phase == 1) { /* after a backslash */
        st->phase = 0;
        if (c == 'u') {
            st->hex = 4;
            return true;
        }
        return c && strchr("\"\\/bfnrt", c) != NULL;
    }
    if (c == '"') {
        if (st->key) st->mode = J_COLON;
        else value_end(st);
        return true;
    }
    if (c == '\\') {
        st->phase = 1;
        return true;
    }
    if (c < 0x20) return false; /* control characters must be escaped */
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

/* A number byte; *ended: c is not part of the number, which is complete (c is then fed to the
 * state after it). */
static bool number_byte(pgd_json_state *st, unsigned char c, bool *ended) {
    uint8_t next;
    bool digit = is_digit(c), e = c == 'e' || c == 'E';
    switch (st->phase) {
    case N_MINUS: if (c == '0') next = N_ZERO; else if (digit) next = N_INT; else return false;
        break;
    case N_ZERO:
    case N_INT:
    case N_FRAC:
        if (digit && st->phase != N_ZERO) next = st->phase;
        else if (c == '.' && st->phase != N_FRAC) next = N_DOT;
        else if (e) next = N_E;
        else if (digit) return false; /* a leading zero */
        else {
            *ended = true;
            return true;
        }
        break;
    case N_DOT: if (!digit) return false; next = N_FRAC; break;
    case N_E: if (c == '+' || c == '-') next = N_ESIGN; else if (digit) next = N_EXP; else return false;
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
    if (st->num_len >= PGD_JSON_MAX_NUM) return false;
    st->num_len++;
    st->phase = next;
    return true;
}

static bool feed_byte(pgd_json_state *st, unsigned char c) {
    if (st->mode == J_STRING) return string_byte(st, c);
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
    if (is_ws(c)) {
        if (st->ws >= PGD_JSON_MAX_WS) return false;
        st->ws++;
        return true;
    }
    st->ws = 0;
    switch (st->mode) {
    case J_VALUE: return value_start(st, c);
    case J_ARR_FIRST:
        if (c == ']') {
            pop(st);
            return true;
        }
        return value_start(st, c);
    case J_OBJ_FIRST:
        if (c == '}') {
            pop(st);
            return true;
        }
        if (c != '"') return false;
        string_start(st, true);
        return true;
    case J_KEY:
        if (c != '"') return false;
        string_start(st, true);
        return true;
    case J_COLON:
        if (c != ':') return false;
        st->mode = J_VALUE;
        return true;
    case J_AFTER: {
        bool obj = st->stack[st->depth - 1];
        if (c == ',') {
            st->mode = obj ? J_KEY : J_VALUE;
            return true;
        }
        if (c != (obj ? '}' : ']')) return false;
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
typedef struct pgd_json_node {
    int32_t skip, tok;
    uint16_t depth, n_tok;
    uint8_t byte;
} pgd_json_node;

static const pgd_json_vocab *g_sort_vocab; /* qsort's comparator context (index build only) */

static int cmp_text(const void *a, const void *b) {
    const pgd_json_vocab *v = g_sort_vocab;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    uint32_t lx = v->len[x], ly = v->len[y];
    int c = memcmp(v->text[x], v->text[y], lx < ly ? lx : ly);
    if (c) return c;
    if (lx != ly) return lx < ly ? -1 : 1;
    return (x > y) - (x < y);
}

/* The trie of sorted's texts in depth-first order, built from the sorted list: each text shares
 * its longest common prefix with the one before it. */
static int build_trie(pgd_json_vocab *v, uint32_t max_len) {
    size_t total = 1;
    for (int32_t i = 0; i < v->n_text; i++) total += v->len[v->sorted[i]];
    if (total > INT32_MAX) return PGD_ENOMEM;
    v->nodes = malloc(total * sizeof *v->nodes);
    int32_t *path = malloc((max_len + 1) * sizeof *path); /* node index by depth */
    if (!v->nodes || !path) {
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
        for (; depth > (int32_t)lcp; depth--) v->nodes[path[depth]].skip = nn; /* subtrees done */
        for (; depth < (int32_t)l; depth++) {
            pgd_json_node *nd = &v->nodes[nn];
            *nd = (pgd_json_node){.skip = -1, .tok = -1, .depth = (uint16_t)(depth + 1),
                                  .byte = (uint8_t)s[depth]};
            path[depth + 1] = nn++;
        }
        pgd_json_node *end = &v->nodes[path[l]];
        if (end->tok < 0) end->tok = i;
        if (end->n_tok < UINT16_MAX) end->n_tok++;
        prev = s;
        prev_len = l;
    }
    for (; depth > 0; depth--) v->nodes[path[depth]].skip = nn;
    v->n_nodes = nn;
    free(path);
    return PGD_OK;
}

int pgd_json_vocab_index(pgd_json_vocab *v) {
    int32_t n = v->n;
    uint32_t max_len = 0;
    v->sorted = malloc((size_t)(n ? n : 1) * sizeof *v->sorted);
    v->plain = calloc((size_t)(n ? n : 1), 1);
    v->quoted = malloc((size_t)(n ? n : 1) * sizeof *v->quoted);
    if (!v->sorted || !v->plain || !v->quoted) return PGD_ENOMEM;
    v->n_text = v->n_plain = v->n_quoted = 0;
    pgd_json_state in_str;
    pgd_json_init(&in_str, false);
    string_start(&in_str, false);
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
            v->n_plain++;
        }
    }
    g_sort_vocab = v;
    qsort(v->sorted, (size_t)v->n_text, sizeof *v->sorted, cmp_text);
    g_sort_vocab = NULL;
    v->stack = malloc((max_len + 1) * sizeof *v->stack);
    if (!v->stack) return PGD_ENOMEM;
    return build_trie(v, max_len);
}

void pgd_json_vocab_free(pgd_json_vocab *v) {
    free(v->text);
    free(v->len);
    free(v->eog);
    free(v->sorted);
    free(v->nodes);
    free(v->stack);
    free(v->plain);
    free(v->quoted);
    memset(v, 0, sizeof *v);
}

static bool token_ok(const pgd_json_state *st, const pgd_json_vocab *v, int32_t id) {
    pgd_json_state t = *st;
    return pgd_json_feed(&t, v->text[id], v->len[id]);
}

int32_t pgd_json_allowed(const pgd_json_state *st, pgd_json_vocab *v, uint8_t *allow) {
    int32_t n_ok = 0;
    if (pgd_json_complete(st)) {
        for (int32_t id = 0; id < v->n; id++) n_ok += allow[id] = v->eog[id];
        return n_ok;
    }
    if (st->mode == J_STRING && !st->need && !st->hex && !st->phase) {
        /* inside a string, between characters: the tokens without a quote as precomputed, those
         * with one tried */
        memcpy(allow, v->plain, (size_t)v->n);
        n_ok = v->n_plain;
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
    memset(allow, 0, (size_t)v->n);
    v->stack[0] = *st;
    for (int32_t i = 0; i < v->n_nodes;) {
        const pgd_json_node *nd = &v->nodes[i];
        pgd_json_state *t = &v->stack[nd->depth];
        *t = v->stack[nd->depth - 1];
        if (!feed_byte(t, nd->byte)) {
            i = nd->skip;
            continue;
        }
        for (int32_t k = 0; k < nd->n_tok; k++) allow[v->sorted[nd->tok + k]] = 1;
        n_ok += nd->n_tok;
        i++;
    }
    return n_ok;
}
