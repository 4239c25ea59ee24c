/* JSON Schema -> pgd_json_schema (json_grammar.h): the subset the recognizer enforces. Every
 * keyword is either enforced, an annotation, or refused with its name: a schema is never half
 * applied. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sample/json_grammar.h"
#include "sample/regex.h"
#include "tokenizer/unicode.h"
#include "util/status.h"
#include "util/xalloc.h"

#define MAX_REF_DEPTH 32
/* a budget on what a schema expands to ($refs are compiled where they are used), checked as it
 * grows: a 15 KB schema of nested $refs must not take seconds and gigabytes */
#define MAX_NODES 4096
#define MAX_PATTERNS 32 /* compiled 'pattern's per schema (each a DFA of up to 2 MiB) */
#define MAX_PROPS 16384
#define MAX_ENUM_BYTES (1 << 20)
#define MAX_TEXT 65535 /* bytes of one property name or enum value (the recognizer's pos) */

/* ---- exact printing ---- */

typedef struct buf {
    char *p;
    size_t n, cap;
    bool bad;
} buf;

static void put(buf *b, const char *s, size_t n) {
    if (b->bad) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = (b->n + n + 1) * 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->bad = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

/* The shortest text that reads back as d exactly (cJSON's own printing is lossy: it takes 15
 * digits when they compare equal within an epsilon); integers below 2^53 without exponent. */
static bool put_number(buf *b, double d) {
    char t[40];
    if (!isfinite(d)) return false;
    if (d == floor(d) && fabs(d) < 9007199254740992.0) {
        snprintf(t, sizeof t, "%.0f", d);
    } else {
        for (int prec = 1; prec <= 17; prec++) {
            snprintf(t, sizeof t, "%.*g", prec, d);
            if (strtod(t, NULL) == d) break;
        }
    }
    put(b, t, strlen(t));
    return true;
}

static void put_string(buf *b, const char *s) {
    put(b, "\"", 1);
    for (const unsigned char *u = (const unsigned char *)s; *u; u++) {
        char e[8];
        const char *r = *u == '"' ? "\\\"" : *u == '\\' ? "\\\\" : *u == '\n' ? "\\n"
                      : *u == '\r' ? "\\r" : *u == '\t' ? "\\t" : *u == '\b' ? "\\b"
                      : *u == '\f' ? "\\f" : NULL;
        if (!r && *u < 0x20) {
            snprintf(e, sizeof e, "\\u%04x", *u);
            r = e;
        }
        if (r) put(b, r, strlen(r));
        else put(b, (const char *)u, 1);
    }
    put(b, "\"", 1);
}

static bool put_value(buf *b, const cJSON *j) {
    if (cJSON_IsNumber(j)) return put_number(b, j->valuedouble);
    if (cJSON_IsString(j)) put_string(b, j->valuestring);
    else if (cJSON_IsTrue(j)) put(b, "true", 4);
    else if (cJSON_IsFalse(j)) put(b, "false", 5);
    else if (cJSON_IsNull(j)) put(b, "null", 4);
    else if (cJSON_IsArray(j) || cJSON_IsObject(j)) {
        bool obj = cJSON_IsObject(j);
        put(b, obj ? "{" : "[", 1);
        const cJSON *c;
        bool first = true;
        cJSON_ArrayForEach(c, j) {
            if (!first) put(b, ",", 1);
            first = false;
            if (obj) {
                put_string(b, c->string);
                put(b, ":", 1);
            }
            if (!put_value(b, c)) return false;
        }
        put(b, obj ? "}" : "]", 1);
    } else {
        return false;
    }
    return true;
}

char *pgd_json_print_exact(const cJSON *j) {
    buf b = {0};
    if (!put_value(&b, j) || b.bad) {
        free(b.p);
        return NULL;
    }
    return b.p;
}

/* ---- compiling ---- */

typedef struct ctx {
    pgd_json_schema *sc;
    const cJSON *root;
    char *msg;
    size_t msg_len;
    const cJSON *refs[MAX_REF_DEPTH]; /* the $ref targets being compiled (recursion check) */
    int n_refs;
    size_t enum_bytes;
    int64_t re_work;       /* the patterns' DFA building so far: one budget for the schema */
} ctx;

static int fail(ctx *x, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(ctx *x, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(x->msg, x->msg_len, fmt, ap);
    va_end(ap);
    return PGD_EINVAL;
}

static const char *const VALIDATION[] = {"type", "properties", "required", "additionalProperties",
                                         "items", "minItems", "maxItems", "enum", "const",
                                         "anyOf", "oneOf", "$ref", "minLength", "maxLength",
                                         "minimum", "maximum", "exclusiveMinimum",
                                         "exclusiveMaximum", "pattern", NULL};
/* annotations: they describe, they do not constrain (format is an annotation by default in
 * JSON Schema 2020-12, as in Python's jsonschema) */
static const char *const ANNOTATIONS[] = {"title", "description", "default", "examples", "format",
                                          "$schema", "$comment", "$defs", "definitions",
                                          "deprecated", "readOnly", "writeOnly", NULL};

static bool in_list(const char *const *l, const char *s) {
    for (; *l; l++)
        if (!strcmp(*l, s)) return true;
    return false;
}

static int new_node(ctx *x, int32_t *out) {
    pgd_json_schema *sc = x->sc;
    int rc = pgd_grow_i32(&sc->nodes, sc->n_nodes, &sc->cap_nodes, 16, sizeof *sc->nodes);
    if (rc) return rc;
    if (sc->n_nodes >= MAX_NODES)
        return fail(x, "the schema expands to more than %d parts ($refs count where they are "
                       "used)", MAX_NODES);
    int32_t i = sc->n_nodes++;
    pgd_json_node *nd = &sc->nodes[i];
    memset(nd, 0, sizeof *nd);
    for (int t = 0; t < PGD_JT_N; t++) nd->by_type[t] = (int16_t)i;
    nd->additional = true;
    nd->addl = nd->items = -1;
    nd->max_items = nd->max_len = INT32_MAX;
    nd->pattern = -1;
    *out = i;
    return PGD_OK;
}

static int add_enum_text(ctx *x, int32_t node, char *t, bool number);

static int add_enum(ctx *x, int32_t node, const cJSON *v) {
    if (cJSON_IsNumber(v) && !isfinite(v->valuedouble))
        return fail(x, "enum and const numbers must be finite");
    if (cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble) &&
        fabs(v->valuedouble) >= 9007199254740992.0)
        return fail(x, "enum and const numbers must be below 2^53 in magnitude or have a "
                       "fraction (larger integers are not read exactly)");
    char *t = pgd_json_print_exact(v);
    if (!t) return fail(x, "enum and const values must hold finite numbers only");
    return add_enum_text(x, node, t, cJSON_IsNumber(v));
}

/* Adds the enum value whose compact text is t (owned from here on) to node. */
static int add_enum_text(ctx *x, int32_t node, char *t, bool number) {
    pgd_json_schema *sc = x->sc;
    size_t tl = strlen(t);
    if (tl > MAX_TEXT || x->enum_bytes + tl > MAX_ENUM_BYTES) {
        free(t);
        return fail(x, "enum and const values are limited to %d bytes each and %d in all",
                    MAX_TEXT, MAX_ENUM_BYTES);
    }
    x->enum_bytes += tl;
    pgd_json_node *nd = &sc->nodes[node];
    for (int i = 0; i < nd->n_enum; i++)
        if (!strcmp(sc->enum_text[nd->enum0 + i], t)) { /* a repeated value */
            free(t);
            return PGD_OK;
        }
    if (nd->n_enum >= PGD_JSON_SCHEMA_MAX) {
        free(t);
        return fail(x, "at most %d enum values", PGD_JSON_SCHEMA_MAX);
    }
    if (sc->n_enum == sc->cap_enum) {
        int32_t cap = sc->cap_enum ? 2 * sc->cap_enum : 16;
        char **nt = realloc(sc->enum_text, (size_t)cap * sizeof *nt);
        if (nt) sc->enum_text = nt;
        uint32_t *nl = realloc(sc->enum_len, (size_t)cap * sizeof *nl);
        if (nl) sc->enum_len = nl;
        uint8_t *nn = realloc(sc->enum_num, (size_t)cap);
        if (nn) sc->enum_num = nn;
        if (!nt || !nl || !nn) {
            free(t);
            return PGD_ENOMEM;
        }
        sc->cap_enum = cap;
    }
    sc->enum_text[sc->n_enum] = t;
    sc->enum_len[sc->n_enum] = (uint32_t)tl;
    sc->enum_num[sc->n_enum] = number;
    sc->n_enum++;
    nd->n_enum++;
    return PGD_OK;
}

/* The type bits the first byte of each enum value takes (for anyOf's disjointness). */
static unsigned enum_types(const pgd_json_schema *sc, const pgd_json_node *nd) {
    unsigned m = 0;
    for (int i = 0; i < nd->n_enum; i++) {
        char c = sc->enum_text[nd->enum0 + i][0];
        m |= 1u << (c == '{' ? PGD_JT_OBJ : c == '[' ? PGD_JT_ARR : c == '"' ? PGD_JT_STR
                    : c == 't' || c == 'f' ? PGD_JT_BOOL : c == 'n' ? PGD_JT_NULL : PGD_JT_NUM);
    }
    return m;
}

/* integer and number both start with '-' or a digit: one bit for disjointness */
static unsigned first_byte_types(unsigned m) {
    return m & (1u << PGD_JT_INT) ? (m & ~(1u << PGD_JT_INT)) | (1u << PGD_JT_NUM) : m;
}

static int compile(ctx *x, const cJSON *j, int depth, int32_t *out);

/* Whether JSON value v has one of types (PGD_JT_* bits; NUM admits every number, INT the
 * integral ones). */
static bool value_has_type(const cJSON *v, unsigned types) {
    int t = cJSON_IsObject(v) ? PGD_JT_OBJ : cJSON_IsArray(v) ? PGD_JT_ARR
          : cJSON_IsString(v) ? PGD_JT_STR : cJSON_IsBool(v) ? PGD_JT_BOOL
          : cJSON_IsNull(v) ? PGD_JT_NULL : PGD_JT_NUM;
    if (types & (1u << t)) return true;
    return t == PGD_JT_NUM && (types & (1u << PGD_JT_INT)) &&
           v->valuedouble == floor(v->valuedouble);
}

static int parse_types(ctx *x, const cJSON *ty, unsigned *types) {
    static const char *const names[PGD_JT_N] = {"object", "array", "string", "number",
                                                "integer", "boolean", "null"};
    *types = 0;
    const cJSON *one = ty;
    int n = cJSON_IsArray(ty) ? cJSON_GetArraySize(ty) : 1;
    for (int i = 0; i < n; i++) {
        if (cJSON_IsArray(ty)) one = cJSON_GetArrayItem(ty, i);
        if (!cJSON_IsString(one)) return fail(x, "'type' must be a string or an array of them");
        int t = 0;
        while (t < PGD_JT_N && strcmp(one->valuestring, names[t])) t++;
        if (t == PGD_JT_N) return fail(x, "unknown type '%s'", one->valuestring);
        *types |= 1u << t;
    }
    if (!*types) return fail(x, "'type' must name at least one type");
    if (*types & (1u << PGD_JT_NUM)) *types &= ~(1u << PGD_JT_INT); /* number admits integers */
    return PGD_OK;
}

static int get_count(ctx *x, const cJSON *j, const char *key, int32_t *v) {
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!c) return PGD_OK;
    if (!cJSON_IsNumber(c) || c->valuedouble < 0 || c->valuedouble > 65535 ||
        c->valuedouble != (double)(int32_t)c->valuedouble)
        return fail(x, "'%s' must be an integer from 0 to 65535", key);
    *v = (int32_t)c->valuedouble;
    return PGD_OK;
}

static int compile_object(ctx *x, const cJSON *j, int depth, int32_t node) {
    pgd_json_schema *sc = x->sc;
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(j, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(j, "required");
    const cJSON *addl = cJSON_GetObjectItemCaseSensitive(j, "additionalProperties");
    if (props && !cJSON_IsObject(props)) return fail(x, "'properties' must be an object");
    int n = props ? cJSON_GetArraySize(props) : 0;
    if (n > PGD_JSON_SCHEMA_MAX)
        return fail(x, "at most %d properties in one object", PGD_JSON_SCHEMA_MAX);
    if (sc->n_props + n > MAX_PROPS)
        return fail(x, "the schema expands to more than %d properties", MAX_PROPS);
    /* this object's properties are contiguous: reserved before its children add theirs */
    if (sc->n_props + n > sc->cap_props) {
        int32_t cap = (sc->n_props + n) * 2 + 16;
        pgd_json_prop *np = realloc(sc->props, (size_t)cap * sizeof *np);
        if (!np) return PGD_ENOMEM;
        sc->props = np;
        sc->cap_props = cap;
    }
    int32_t p0 = sc->n_props;
    sc->n_props += n;
    if (n) memset(&sc->props[p0], 0, (size_t)n * sizeof *sc->props); /* (props NULL when 0) */
    sc->nodes[node].prop0 = p0;
    sc->nodes[node].n_props = n;
    int i = 0;
    const cJSON *p;
    cJSON_ArrayForEach(p, props) {
        const char *name = p->string;
        for (const unsigned char *u = (const unsigned char *)name; *u; u++)
            if (*u < 0x20 || *u == '"' || *u == '\\')
                return fail(x, "property names with quotes, backslashes or control characters "
                               "are not supported");
        if (strlen(name) > MAX_TEXT)
            return fail(x, "property names are limited to %d bytes", MAX_TEXT);
        for (int k = 0; k < i; k++)
            if (!strcmp(sc->props[p0 + k].name, name))
                return fail(x, "property '%s' appears twice", name);
        int32_t child;
        int rc = compile(x, p, depth + 1, &child);
        if (rc) return rc;
        pgd_json_prop *pp = &x->sc->props[p0 + i]; /* (props may have moved) */
        if (!(pp->name = strdup(name))) return PGD_ENOMEM;
        pp->len = (uint32_t)strlen(name);
        pp->node = child;
        i++;
    }
    if (req) {
        if (!cJSON_IsArray(req)) return fail(x, "'required' must be an array of names");
        const cJSON *r;
        cJSON_ArrayForEach(r, req) {
            if (!cJSON_IsString(r)) return fail(x, "'required' must be an array of names");
            int k = 0;
            while (k < n && strcmp(sc->props[p0 + k].name, r->valuestring)) k++;
            if (k == n)
                return fail(x, "required property '%s' is not in 'properties'", r->valuestring);
            sc->nodes[node].required |= 1ull << k;
        }
    }
    /* xgrammar's strict mode, vLLM's default: an object that declares its properties takes
     * no others unless additionalProperties says so; one that declares none takes any */
    if (cJSON_IsFalse(addl) || (!addl && props)) {
        sc->nodes[node].additional = false;
    } else if (addl && !cJSON_IsTrue(addl)) {
        int32_t child;
        int rc = compile(x, addl, depth + 1, &child);
        if (rc) return rc;
        sc->nodes[node].addl = child;
    }
    return PGD_OK;
}

/* A pair of counts (minItems/maxItems, minLength/maxLength) into *lo, *hi: 0 and INT32_MAX
 * when absent; refused when lo exceeds hi. */
static int get_range(ctx *x, const cJSON *j, const char *lo_key, const char *hi_key,
                     int32_t *lo, int32_t *hi) {
    int32_t l = 0, h = INT32_MAX;
    int rc = get_count(x, j, lo_key, &l);
    if (!rc) rc = get_count(x, j, hi_key, &h);
    if (rc) return rc;
    if (l > h) return fail(x, "'%s' (%d) exceeds '%s' (%d)", lo_key, l, hi_key, h);
    *lo = l;
    *hi = h;
    return PGD_OK;
}

static int compile_array(ctx *x, const cJSON *j, int depth, int32_t node) {
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(j, "items");
    if (items) {
        if (cJSON_IsArray(items)) return fail(x, "'items' as an array (tuples) is not supported");
        int32_t child;
        int rc = compile(x, items, depth + 1, &child);
        if (rc) return rc;
        x->sc->nodes[node].items = child;
    }
    return get_range(x, j, "minItems", "maxItems", &x->sc->nodes[node].min_items,
                     &x->sc->nodes[node].max_items);
}

/* minLength / maxLength, and pattern: a regular expression (regex.h) the whole string must
 * match, as vLLM's grammar backends read it (JSON Schema's own rule, a match anywhere in the
 * string, lets more through: every answer held so is valid for it too). */
static int compile_string(ctx *x, const cJSON *j, int32_t node) {
    int rc = get_range(x, j, "minLength", "maxLength", &x->sc->nodes[node].min_len,
                       &x->sc->nodes[node].max_len);
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "pattern");
    if (rc || !p) return rc;
    if (!cJSON_IsString(p)) return fail(x, "'pattern' must be a string");
    pgd_json_schema *sc = x->sc;
    if (sc->n_regex >= MAX_PATTERNS)
        return fail(x, "more than %d 'pattern's ($refs count where they are used)",
                    MAX_PATTERNS);
    if (!sc->regex && !(sc->regex = calloc(MAX_PATTERNS, sizeof *sc->regex))) return PGD_ENOMEM;
    char why[160];
    rc = pgd_regex_compile(p->valuestring, strlen(p->valuestring), &sc->regex[sc->n_regex], why,
                           sizeof why);
    if (rc == PGD_ENOMEM) return rc;
    size_t cut = strnlen(p->valuestring, 64); /* the pattern, cut between characters */
    int shown = (int)(cut - pgd__utf8_incomplete_tail(p->valuestring, cut));
    if (rc) return fail(x, "'pattern' %.*s: %s", shown, p->valuestring, why);
    const pgd_regex *re = &sc->regex[sc->n_regex++];
    pgd_json_node *nd = &sc->nodes[node];
    nd->pattern = sc->n_regex - 1;
    if ((x->re_work += re->work) > PGD_REGEX_MAX_WORK)
        return fail(x, "the schema's patterns are too complex together (their DFAs take too "
                       "long to build)");
    /* with a maxLength, the exact lengths each state can still take (else the fewest and most
     * are exact on their own) */
    if (nd->max_len < INT32_MAX) {
        rc = pgd_regex_length_sets(&sc->regex[nd->pattern], nd->max_len);
        if (rc == PGD_ENOMEM) return rc;
    }
    if (re->lens ? !pgd_regex_len_in(re, 0, nd->min_len, nd->max_len)
                 : re->lmin[0] > nd->max_len || (!re->unbounded[0] && re->lmax[0] < nd->min_len))
        return fail(x, "'pattern' %.*s matches no string of %d to %d characters", shown,
                    p->valuestring, nd->min_len, nd->max_len);
    return PGD_OK;
}

/* The integers a bounded number's integer part can reach: at most 15 bytes with the sign. */
#define REACH_POS 999999999999999.0 /* 10^15 - 1 */
#define REACH_NEG -99999999999999.0 /* -(10^14 - 1) */

/* minimum / maximum / exclusiveMinimum / exclusiveMaximum (numbers, JSON Schema 2020-12). */
static int compile_bounds(ctx *x, const cJSON *j, int32_t node, unsigned types) {
    static const char *const kw[4] = {"minimum", "exclusiveMinimum", "maximum",
                                      "exclusiveMaximum"};
    pgd_json_node *nd = &x->sc->nodes[node];
    nd->lo = -INFINITY;
    nd->hi = INFINITY;
    for (int i = 0; i < 4; i++) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, kw[i]);
        if (!c) continue;
        if (!cJSON_IsNumber(c) || !isfinite(c->valuedouble))
            return fail(x, "'%s' must be a finite number", kw[i]);
        double v = c->valuedouble;
        bool excl = i & 1;
        nd->bounded = true;
        if (i < 2 && (v > nd->lo || (v == nd->lo && excl))) nd->lo = v, nd->lo_excl = excl;
        if (i >= 2 && (v < nd->hi || (v == nd->hi && excl))) nd->hi = v, nd->hi_excl = excl;
    }
    if (!nd->bounded) return PGD_OK;
    /* the integers within; the integer parts v of fractions within, but for v itself when an
     * exclusive bound is v (the recognizer's frac_ok): v >= lo, v + 1 <= hi when positive, and
     * -(v + 1) >= lo, -v <= hi when negative */
    double r[6] = {nd->lo_excl ? floor(nd->lo) + 1 : ceil(nd->lo),
                   nd->hi_excl ? ceil(nd->hi) - 1 : floor(nd->hi),
                   fmax(0, ceil(nd->lo)), floor(nd->hi) - 1, fmax(0, ceil(-nd->hi)),
                   floor(-nd->lo) - 1};
    int64_t *dst[6] = {&nd->ilo, &nd->ihi, &nd->fplo, &nd->fphi, &nd->fnlo, &nd->fnhi};
    for (int i = 0; i < 6; i++) /* within what 15 bytes reach: -(10^14 - 1) .. 10^15 - 1 */
        *dst[i] = (int64_t)fmin(fmax(r[i], i < 2 ? REACH_NEG - 1 : -1), REACH_POS + 1);
    bool ints = nd->ilo <= nd->ihi && nd->ihi >= (int64_t)REACH_NEG &&
                nd->ilo <= (int64_t)REACH_POS;
    bool fracs = (types & (1u << PGD_JT_NUM)) &&
                 ((nd->fplo <= nd->fphi && nd->fplo <= (int64_t)REACH_POS) ||
                  (nd->fnlo <= nd->fnhi && nd->fnlo <= -(int64_t)REACH_NEG));
    if (!ints && !fracs && !(types & ~((1u << PGD_JT_NUM) | (1u << PGD_JT_INT))))
        return fail(x, "no number of at most 15 integer digits, without an exponent, that "
                       "Pagoda writes lies within the bounds ('minimum', 'maximum' and their "
                       "exclusive forms)");
    return PGD_OK;
}

/* The index of the property of object node b named name, or -1. */
static int prop_index(const pgd_json_schema *sc, int32_t b, const char *name) {
    const pgd_json_node *n = &sc->nodes[b];
    for (int i = 0; i < n->n_props; i++)
        if (!strcmp(sc->props[n->prop0 + i].name, name)) return i;
    return -1;
}

/* Is property i of object node b required, with one string value? (Its text, or NULL.) */
static const char *tag_of(const pgd_json_schema *sc, int32_t b, int i) {
    const pgd_json_node *n = &sc->nodes[b];
    if (i < 0 || !(n->required & (1ull << i))) return NULL;
    int32_t v = sc->props[n->prop0 + i].node;
    if (v < 0 || sc->nodes[v].n_enum != 1) return NULL;
    const char *t = sc->enum_text[sc->nodes[v].enum0];
    return t[0] == '"' ? t : NULL;
}

/* A tagged union of the object branches obj[0..n): the first property of obj[0] that every
 * branch requires with one string value, distinct across them (Pydantic's discriminated unions,
 * a tool call's name). */
static int tagged_union(ctx *x, const int32_t *obj, int n, const char *kw, int32_t *out) {
    pgd_json_schema *sc = x->sc;
    const pgd_json_node *b0 = &sc->nodes[obj[0]];
    int tag = -1;
    for (int p = 0; p < b0->n_props && tag < 0; p++) {
        const char *name = sc->props[b0->prop0 + p].name;
        bool ok = true;
        for (int k = 0; k < n && ok; k++) {
            const char *t = tag_of(sc, obj[k], prop_index(sc, obj[k], name));
            ok = t != NULL;
            for (int m = 0; m < k && ok; m++)
                ok = strcmp(t, tag_of(sc, obj[m], prop_index(sc, obj[m], name))) != 0;
        }
        if (ok) tag = p;
    }
    if (tag < 0)
        return fail(x, "'%s' object branches must be told apart by a property each requires "
                       "with one string value (a const), of the same name in all", kw);
    const char *name = sc->props[b0->prop0 + tag].name;
    int32_t u, e;
    int rc = new_node(x, &u);
    if (!rc) rc = new_node(x, &e);
    if (rc) return rc;
    sc->nodes[e].enum0 = sc->n_enum;
    for (int k = 0; k < n && !rc; k++) {
        char *t = strdup(tag_of(sc, obj[k], prop_index(sc, obj[k], name)));
        rc = t ? add_enum_text(x, e, t, false) : PGD_ENOMEM;
    }
    if (rc) return rc;
    if (sc->n_props + 1 > sc->cap_props || sc->n_var + n > sc->cap_var) {
        int32_t cp = (sc->n_props + 1) * 2 + 16, cv = (sc->n_var + n) * 2 + 16;
        pgd_json_prop *np = realloc(sc->props, (size_t)cp * sizeof *np);
        if (np) sc->props = np, sc->cap_props = cp;
        int32_t *vn = realloc(sc->var_node, (size_t)cv * sizeof *vn);
        if (vn) sc->var_node = vn;
        uint8_t *vp = realloc(sc->var_prop, (size_t)cv);
        if (vp) sc->var_prop = vp;
        if (!np || !vn || !vp) return PGD_ENOMEM;
        sc->cap_var = cv;
    }
    pgd_json_prop *tp = &sc->props[sc->n_props];
    if (!(tp->name = strdup(name))) return PGD_ENOMEM;
    tp->len = (uint32_t)strlen(name);
    tp->node = e;
    pgd_json_node *un = &sc->nodes[u];
    un->types = 1u << PGD_JT_OBJ;
    un->prop0 = sc->n_props++;
    un->n_props = 1;
    un->required = 1;
    un->additional = false;
    un->var0 = sc->n_var;
    un->n_var = n;
    for (int k = 0; k < n; k++) {
        sc->var_node[sc->n_var] = obj[k];
        sc->var_prop[sc->n_var++] = (uint8_t)prop_index(sc, obj[k], name);
    }
    *out = u;
    return PGD_OK;
}

/* anyOf / oneOf: branches whose values start differently (so the first byte picks one, and
 * oneOf's "exactly one" holds too), where objects may be several if a tag tells them apart. */
static int compile_union(ctx *x, const cJSON *alts, const char *kw, int depth, int32_t *out) {
    if (!cJSON_IsArray(alts) || cJSON_GetArraySize(alts) == 0)
        return fail(x, "'%s' must be a non-empty array of schemas", kw);
    if (cJSON_GetArraySize(alts) > PGD_JSON_SCHEMA_MAX)
        return fail(x, "at most %d '%s' branches", PGD_JSON_SCHEMA_MAX, kw);
    int32_t node, br[PGD_JSON_SCHEMA_MAX], obj[PGD_JSON_SCHEMA_MAX];
    int nb = 0, no = 0, rc;
    const cJSON *a;
    cJSON_ArrayForEach(a, alts) {
        if ((rc = compile(x, a, depth, &br[nb]))) return rc;
        if (br[nb] < 0) return fail(x, "a '%s' branch that takes any value is not supported", kw);
        const pgd_json_node *bn = &x->sc->nodes[br[nb]];
        if (!bn->n_enum && bn->types == (1u << PGD_JT_OBJ) && !bn->n_var) obj[no++] = br[nb];
        nb++;
    }
    int32_t tagged = -1;
    if (no >= 2 && (rc = tagged_union(x, obj, no, kw, &tagged))) return rc;
    if ((rc = new_node(x, &node))) return rc;
    unsigned seen = 0;
    for (int i = 0; i < nb; i++) {
        const pgd_json_node *bn = &x->sc->nodes[br[i]];
        bool in_tagged = tagged >= 0 && !bn->n_enum && bn->types == (1u << PGD_JT_OBJ) &&
                         !bn->n_var;
        if (in_tagged && (seen & (1u << PGD_JT_OBJ))) continue; /* the union stands for all */
        int32_t b = in_tagged ? tagged : br[i];
        bn = &x->sc->nodes[b];
        unsigned bt = bn->n_enum ? enum_types(x->sc, bn) : bn->types;
        if (first_byte_types(bt) & first_byte_types(seen))
            return fail(x, "'%s' branches must take different types (an object and null, a "
                           "string and a number, ...) or be objects with a tag", kw);
        seen |= bt;
        pgd_json_node *u = &x->sc->nodes[node];
        for (int t = 0; t < PGD_JT_N; t++)
            if (bt & (1u << t)) u->by_type[t] = bn->n_enum ? (int16_t)b : bn->by_type[t];
        u->types |= (uint8_t)bt;
    }
    *out = node;
    return PGD_OK;
}

static int compile_ref(ctx *x, const cJSON *ref, int depth, int32_t *out) {
    if (!cJSON_IsString(ref)) return fail(x, "'$ref' must be a string");
    const char *r = ref->valuestring, *name = NULL, *sect = NULL;
    if (!strncmp(r, "#/$defs/", 8)) sect = "$defs", name = r + 8;
    else if (!strncmp(r, "#/definitions/", 14)) sect = "definitions", name = r + 14;
    else if (!strcmp(r, "#")) return fail(x, "a recursive '$ref' (\"#\") is not supported");
    else return fail(x, "'$ref' must point into #/$defs or #/definitions, got '%s'", r);
    if (strchr(name, '/') || strchr(name, '~') || strchr(name, '%'))
        return fail(x, "'$ref' '%s': nested or escaped paths are not supported", r);
    const cJSON *defs = cJSON_GetObjectItemCaseSensitive(x->root, sect), *t = NULL, *d;
    cJSON_ArrayForEach(d, defs) {
        if (strcmp(d->string, name)) continue;
        if (t) return fail(x, "'%s' has '%s' twice", sect, name);
        t = d;
    }
    if (!t) return fail(x, "'$ref' '%s' points at nothing", r);
    for (int i = 0; i < x->n_refs; i++)
        if (x->refs[i] == t) return fail(x, "a recursive '$ref' ('%s') is not supported", r);
    if (x->n_refs == MAX_REF_DEPTH) return fail(x, "'$ref's nested too deep");
    x->refs[x->n_refs++] = t;
    int rc = compile(x, t, depth, out);
    x->n_refs--;
    return rc;
}

/* Compiles schema j for a value whose container nesting is depth; *out: its node, or -1 for
 * any JSON. */
static int compile(ctx *x, const cJSON *j, int depth, int32_t *out) {
    *out = -1;
    if (cJSON_IsTrue(j)) return PGD_OK;
    if (cJSON_IsFalse(j)) return fail(x, "a false schema accepts nothing");
    if (!cJSON_IsObject(j)) return fail(x, "a schema must be an object or true");
    const cJSON *k;
    int n_valid = 0;
    cJSON_ArrayForEach(k, j) {
        for (const cJSON *e = j->child; e != k; e = e->next)
            if (!strcmp(e->string, k->string))
                return fail(x, "the schema has the keyword '%s' twice", k->string);
        if (in_list(VALIDATION, k->string)) n_valid++;
        else if (!strcmp(k->string, "$id") && j != x->root)
            return fail(x, "'$id' below the root (it changes how $refs resolve) is not "
                           "supported");
        else if (!strcmp(k->string, "$id")) continue; /* the root's: it names the document */
        else if (!in_list(ANNOTATIONS, k->string))
            return fail(x, "the JSON Schema keyword '%s' is not supported", k->string);
    }
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(j, "$ref");
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(j, "enum");
    const cJSON *cn = cJSON_GetObjectItemCaseSensitive(j, "const");
    const cJSON *any = cJSON_GetObjectItemCaseSensitive(j, "anyOf");
    const cJSON *one = cJSON_GetObjectItemCaseSensitive(j, "oneOf");
    if (ref) {
        if (n_valid > 1) return fail(x, "'$ref' beside other keywords is not supported");
        return compile_ref(x, ref, depth, out);
    }
    if (any || one) {
        if (n_valid > 1)
            return fail(x, "'%s' beside other keywords is not supported", any ? "anyOf" : "oneOf");
        return compile_union(x, any ? any : one, any ? "anyOf" : "oneOf", depth, out);
    }
    if (n_valid == 0) return PGD_OK; /* annotations only: any JSON */
    int32_t node;
    int rc = new_node(x, &node);
    if (rc) return rc;
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(j, "type");
    unsigned types = (1u << PGD_JT_N) - 1 - (1u << PGD_JT_INT); /* no type: any */
    if (ty && (rc = parse_types(x, ty, &types))) return rc;
    if (en || cn) { /* the values themselves, those of the type when one is given */
        if (en && cn) return fail(x, "'enum' and 'const' together are not supported");
        if (n_valid > 1 + (ty != NULL))
            return fail(x, "'%s' beside keywords other than 'type' is not supported",
                        en ? "enum" : "const");
        if (en && (!cJSON_IsArray(en) || cJSON_GetArraySize(en) == 0))
            return fail(x, "'enum' must be a non-empty array");
        x->sc->nodes[node].enum0 = x->sc->n_enum;
        const cJSON *v;
        if (cn) {
            if (value_has_type(cn, types)) rc = add_enum(x, node, cn);
        } else {
            cJSON_ArrayForEach(v, en) if (value_has_type(v, types) && (rc = add_enum(x, node, v)))
                break;
        }
        if (rc) return rc;
        if (x->sc->nodes[node].n_enum == 0)
            return fail(x, "no '%s' value has the schema's type", en ? "enum" : "const");
        *out = node;
        return PGD_OK;
    }
    x->sc->nodes[node].types = (uint8_t)types;
    if ((types & ((1u << PGD_JT_OBJ) | (1u << PGD_JT_ARR))) && depth >= PGD_JSON_SCHEMA_DEPTH)
        return fail(x, "the schema nests objects and arrays deeper than %d",
                    PGD_JSON_SCHEMA_DEPTH);
    if ((types & (1u << PGD_JT_OBJ)) && (rc = compile_object(x, j, depth, node))) return rc;
    if ((types & (1u << PGD_JT_ARR)) && (rc = compile_array(x, j, depth, node))) return rc;
    const unsigned nums = (1u << PGD_JT_NUM) | (1u << PGD_JT_INT);
    if ((rc = compile_string(x, j, node)) ||
        ((types & nums) && (rc = compile_bounds(x, j, node, types))))
        return rc;
    *out = node;
    return PGD_OK;
}

bool pgd_json_has_nul_escape(const char *b, size_t n) {
    for (size_t i = 0; i + 1 < n; i++) {
        if (b[i] != '\\') continue;
        if (b[i + 1] == 'u' && i + 5 < n && !memcmp(b + i + 2, "0000", 4)) return true;
        i++; /* the escaped character */
    }
    return false;
}

int pgd_json_schema_compile(const char *text, size_t len, pgd_json_schema *out, char *msg,
                            size_t msg_len) {
    return pgd_json_schema_compile_root(text, len, false, out, msg, msg_len);
}

int pgd_json_schema_compile_root(const char *text, size_t len, bool array_ok,
                                 pgd_json_schema *out, char *msg, size_t msg_len) {
    memset(out, 0, sizeof *out);
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(text, len, &end, false);
    while (j && end && end < text + len && (*end == ' ' || *end == '\n' || *end == '\t' ||
                                            *end == '\r'))
        end++;
    if (j && end != text + len) { /* more than one value */
        cJSON_Delete(j);
        j = NULL;
    }
    ctx x = {.sc = out, .root = j, .msg = msg, .msg_len = msg_len};
    int rc = !j                           ? fail(&x, "the schema is not valid JSON")
             : !pgd__utf8_valid(text, len) ? fail(&x, "the schema is not valid UTF-8")
             : pgd_json_has_nul_escape(text, len)
                 ? fail(&x, "the schema holds a NUL character (\\u0000)")
                 : compile(&x, j, 0, &out->root);
    if (!rc) {
        const pgd_json_node *r = out->root >= 0 ? &out->nodes[out->root] : NULL;
        if (!r || r->n_enum ||
            (r->types != (1u << PGD_JT_OBJ) && (!array_ok || r->types != (1u << PGD_JT_ARR))))
            rc = fail(&x, "the schema's root must be an object schema ({\"type\": \"object\", "
                          "...})");
    }
    cJSON_Delete(j);
    if (rc == PGD_ENOMEM) snprintf(msg, msg_len, "out of memory");
    if (rc) pgd_json_schema_free(out);
    return rc;
}

/* A malloc'd copy of n elements of size sz at src (NULL for none); false when out of memory. */
static bool dup_array(void *dst, const void *src, size_t n, size_t sz) {
    void *p = NULL;
    if (src && n) {
        if (!(p = malloc(n * sz))) return false;
        memcpy(p, src, n * sz);
    }
    memcpy(dst, &p, sizeof p);
    return true;
}

int pgd_json_schema_copy(pgd_json_schema *dst, const pgd_json_schema *src) {
    memset(dst, 0, sizeof *dst);
    pgd_json_schema c = *src; /* the counts and the root; every array is copied below */
    c.prefix = c.suffix = NULL;
    c.nodes = NULL;
    c.props = NULL;
    c.enum_text = NULL;
    c.enum_len = NULL;
    c.enum_num = NULL;
    c.regex = NULL;
    c.var_node = NULL;
    c.var_prop = NULL;
    c.n_props = c.n_enum = c.n_regex = 0; /* what pgd_json_schema_free may free so far */
    c.cap_nodes = src->n_nodes;
    c.cap_props = src->n_props;
    c.cap_enum = src->n_enum;
    c.cap_var = src->n_var;
    bool ok = dup_array(&c.nodes, src->nodes, (size_t)src->n_nodes, sizeof *src->nodes) &&
              dup_array(&c.enum_len, src->enum_len, (size_t)src->n_enum, sizeof *src->enum_len) &&
              dup_array(&c.enum_num, src->enum_num, (size_t)src->n_enum, sizeof *src->enum_num) &&
              dup_array(&c.var_node, src->var_node, (size_t)src->n_var, sizeof *src->var_node) &&
              dup_array(&c.var_prop, src->var_prop, (size_t)src->n_var, sizeof *src->var_prop) &&
              dup_array(&c.props, src->props, (size_t)src->n_props, sizeof *src->props);
    for (int32_t i = 0; ok && i < src->n_props; i++) /* each name, counted once copied */
        ok = (c.props[i].name = strdup(src->props[i].name)) != NULL && ++c.n_props;
    if (ok && src->n_enum) ok = (c.enum_text = calloc((size_t)src->n_enum, sizeof(char *)));
    for (int32_t i = 0; ok && i < src->n_enum; i++)
        ok = (c.enum_text[i] = strdup(src->enum_text[i])) != NULL && ++c.n_enum;
    if (ok && src->n_regex) ok = (c.regex = calloc((size_t)src->n_regex, sizeof *c.regex));
    for (int32_t i = 0; ok && i < src->n_regex; i++)
        ok = pgd_regex_copy(&c.regex[i], &src->regex[i]) == PGD_OK && ++c.n_regex;
    if (!ok) {
        pgd_json_schema_free(&c);
        return PGD_ENOMEM;
    }
    *dst = c;
    return PGD_OK;
}

void pgd_json_schema_free(pgd_json_schema *sc) {
    for (int32_t i = 0; i < sc->n_props; i++) free(sc->props[i].name);
    for (int32_t i = 0; i < sc->n_enum; i++) free(sc->enum_text[i]);
    free(sc->nodes);
    free(sc->props);
    free(sc->enum_text);
    free(sc->enum_len);
    free(sc->enum_num);
    for (int32_t i = 0; i < sc->n_regex; i++) pgd_regex_free(&sc->regex[i]);
    free(sc->regex);
    free(sc->var_node);
    free(sc->var_prop);
    free(sc->prefix);
    free(sc->suffix);
    memset(sc, 0, sizeof *sc);
}
