/* Tool-call parsing and the tool-call schema of tool_calls.h. */
#include "api/tool_calls.h"

#include "sample/json_grammar.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *find(const char *h, size_t n, const char *needle) {
    size_t k = strlen(needle);
    for (size_t i = 0; i + k <= n; i++)
        if (!memcmp(h + i, needle, k)) return h + i;
    return NULL;
}

static bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

/* n less the whitespace text[0..n) ends with */
static size_t trim_end(const char *text, size_t n) {
    while (n > 0 && is_space(text[n - 1])) n--;
    return n;
}

static const char *skip_space(const char *p, const char *end) {
    while (p < end && is_space(*p)) p++;
    return p;
}

/* One call's JSON at body -> an OpenAI tool call, or NULL; *next: just past the call's closer,
 * or NULL when the text ends with the call (unclosed) or holds nothing but the call after it.
 * The JSON value is read first, so a closer inside one of its strings does not cut it. */
static cJSON *one_call(const char *body, const char *end, const char *id, int index,
                       const char **next) {
    const char *stop = NULL;
    body = skip_space(body, end);
    if (pgd_json_has_nul_escape(body, (size_t)(end - body))) return NULL; /* cJSON cuts at NUL */
    cJSON *j = cJSON_ParseWithLengthOpts(body, (size_t)(end - body), &stop, false);
    if (!j || !stop) {
        cJSON_Delete(j);
        return NULL;
    }
    const char *after = skip_space(stop, end);
    size_t lc = strlen(PGD_TOOL_CALL_CLOSE);
    if (after == end) {
        *next = NULL;
    } else if ((size_t)(end - after) >= lc && !memcmp(after, PGD_TOOL_CALL_CLOSE, lc)) {
        *next = after + lc;
    } else { /* text after the JSON that is not the closer */
        cJSON_Delete(j);
        return NULL;
    }
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(j, "name");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(j, "arguments");
    /* arguments: an object, or a string that holds one (some models write them so) */
    char *a = NULL;
    if (cJSON_IsObject(args)) {
        a = pgd_json_print_exact(args); /* (NULL: a number past the range of doubles) */
    } else if (cJSON_IsString(args)) {
        cJSON *inner = cJSON_Parse(args->valuestring);
        if (cJSON_IsObject(inner)) a = strdup(args->valuestring);
        cJSON_Delete(inner);
    }
    if (!cJSON_IsObject(j) || !cJSON_IsString(name) || !a) {
        free(a);
        cJSON_Delete(j);
        return NULL;
    }
    char cid[96];
    snprintf(cid, sizeof cid, "call_%s_%d", id, index);
    cJSON *c = cJSON_CreateObject(), *f = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "id", cid);
    cJSON_AddStringToObject(c, "type", "function");
    cJSON_AddStringToObject(f, "name", name->valuestring);
    cJSON_AddStringToObject(f, "arguments", a);
    cJSON_AddItemToObject(c, "function", f);
    free(a);
    cJSON_Delete(j);
    return c;
}

cJSON *pgd_tool_calls_parse(const char *text, size_t len, const char *id, size_t *content_len) {
    const char *end = text + len, *first = find(text, len, PGD_TOOL_CALL_OPEN);
    *content_len = len;
    if (!first) return NULL;
    cJSON *calls = cJSON_CreateArray();
    int n = 0;
    for (const char *p = first; p;) {
        const char *next = NULL;
        cJSON *c = one_call(p + strlen(PGD_TOOL_CALL_OPEN), end, id, n++, &next);
        if (!c) {
            cJSON_Delete(calls);
            return NULL;
        }
        cJSON_AddItemToArray(calls, c);
        if (!next) break;
        p = find(next, (size_t)(end - next), PGD_TOOL_CALL_OPEN);
    }
    *content_len = trim_end(text, (size_t)(first - text));
    return calls;
}

size_t pgd_tool_calls_stream_safe(const char *text, size_t len, bool *opened) {
    const char *o = find(text, len, PGD_TOOL_CALL_OPEN);
    *opened = o != NULL;
    if (o) return trim_end(text, (size_t)(o - text));
    size_t k = strlen(PGD_TOOL_CALL_OPEN), safe = len;
    for (size_t h = k - 1; h > 0; h--) /* the longest ending that starts the opener */
        if (h <= len && !memcmp(text + len - h, PGD_TOOL_CALL_OPEN, h)) {
            safe = len - h;
            break;
        }
    /* and the whitespace before it: the content ends short of it when a call follows */
    return trim_end(text, safe);
}

/* The schema of a call of function f: {"name": f's name, "arguments": its parameters}. The
 * parameters' $defs are moved to root (where their $refs point), which must not have them
 * yet. NULL with *why on a parameters schema that is not an object's. */
static cJSON *call_variant(const cJSON *f, cJSON *root, const char **why) {
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(f, "name");
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(f, "parameters");
    const cJSON *pty = cJSON_GetObjectItemCaseSensitive(params, "type");
    if (params && !cJSON_IsTrue(params) &&
        (!cJSON_IsObject(params) ||
         (pty && !(cJSON_IsString(pty) && !strcmp(pty->valuestring, "object"))))) {
        *why = "a function's 'parameters' must be an object schema (arguments are an object)";
        return NULL;
    }
    cJSON *args = cJSON_IsObject(params) ? cJSON_Duplicate(params, true) : cJSON_CreateObject();
    if (!pty) cJSON_AddStringToObject(args, "type", "object"); /* {}, true, properties alone */
    static const char *const defs[] = {"$defs", "definitions"};
    for (int i = 0; i < 2; i++) {
        cJSON *d = cJSON_DetachItemFromObjectCaseSensitive(args, defs[i]), *e;
        cJSON *to = cJSON_GetObjectItemCaseSensitive(root, defs[i]);
        if (d && !to) to = cJSON_AddObjectToObject(root, defs[i]);
        while (d && (e = d->child)) {
            cJSON_DetachItemViaPointer(d, e);
            if (cJSON_GetObjectItemCaseSensitive(to, e->string)) {
                cJSON_Delete(e);
                cJSON_Delete(d);
                cJSON_Delete(args);
                *why = "two tools' parameters define the same name in $defs";
                return NULL;
            }
            cJSON_AddItemToObject(to, e->string, e);
        }
        cJSON_Delete(d);
    }
    cJSON *v = cJSON_CreateObject(), *props = cJSON_CreateObject(), *nm = cJSON_CreateObject();
    cJSON_AddStringToObject(v, "type", "object");
    cJSON_AddStringToObject(nm, "const", fn->valuestring);
    cJSON_AddItemToObject(props, "name", nm);
    cJSON_AddItemToObject(props, "arguments", args);
    cJSON_AddItemToObject(v, "properties", props);
    cJSON *req = cJSON_CreateArray();
    cJSON_AddItemToArray(req, cJSON_CreateString("name"));
    cJSON_AddItemToArray(req, cJSON_CreateString("arguments"));
    cJSON_AddItemToObject(v, "required", req);
    cJSON_AddFalseToObject(v, "additionalProperties");
    return v;
}

char *pgd_tool_call_schema(const cJSON *tools, const char *name, const char **why) {
    *why = NULL;
    cJSON *root = cJSON_CreateObject(), *alts = cJSON_CreateArray();
    const cJSON *t;
    int n = 0;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(f, "name");
        if (!cJSON_IsString(fn) || (name && strcmp(fn->valuestring, name))) continue;
        const cJSON *u;
        cJSON_ArrayForEach(u, tools) {
            if (u == t) break;
            const cJSON *un = cJSON_GetObjectItemCaseSensitive(
                cJSON_GetObjectItemCaseSensitive(u, "function"), "name");
            if (cJSON_IsString(un) && !strcmp(un->valuestring, fn->valuestring))
                *why = "two tools have the same name";
        }
        cJSON *v = *why ? NULL : call_variant(f, root, why);
        if (!v) break;
        cJSON_AddItemToArray(alts, v);
        n++;
    }
    if (!*why && n == 0)
        *why = name ? "'tool_choice' names a function that is not in 'tools'"
                    : "'tools' has no function with a name";
    if (!*why && n > PGD_JSON_SCHEMA_MAX)
        *why = "'tool_choice' \"required\" takes at most 64 tools";
    char *text = NULL;
    if (!*why) {
        /* one function: its call's schema is the root; several: one of them, told apart by
         * the name, written first */
        if (n == 1) {
            cJSON *v = cJSON_DetachItemFromArray(alts, 0), *e;
            while ((e = v->child)) {
                cJSON_DetachItemViaPointer(v, e);
                cJSON_AddItemToObject(root, e->string, e);
            }
            cJSON_Delete(v);
        } else {
            cJSON_AddItemToObject(root, "oneOf", alts);
            alts = NULL;
        }
        text = pgd_json_print_exact(root);
        if (!text) *why = "the function's parameters hold a number that is not finite";
    }
    cJSON_Delete(alts);
    cJSON_Delete(root);
    return text;
}
