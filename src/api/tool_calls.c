/* Tool-call parsing and the tool-call schema of tool_calls.h. */
#include "api/tool_calls.h"

#include "sample/json_grammar.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *find(const char *h, size_t n, const char *needle) {
    return memmem(h, n, needle, strlen(needle)); /* (GNU, as the engine's stop strings) */
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

/* The JSON value at p (after whitespace), read as far as it goes: *stop just past it. NULL when
 * there is none (cJSON would cut a string at a \u0000 escape: none either). */
static cJSON *read_value(const char *p, const char *end, const char **stop) {
    p = skip_space(p, end);
    if (pgd_json_has_nul_escape(p, (size_t)(end - p))) return NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(p, (size_t)(end - p), stop, false);
    if (j && *stop) return j;
    cJSON_Delete(j);
    return NULL;
}

/* An OpenAI tool call of function name with arguments a (JSON text), id "call_<id>_<index>"
 * (mistral: 9 letters and digits hashed from that). */
static cJSON *call_object(pgd_tool_format f, const char *name, const char *a, const char *id,
                          int index) {
    char cid[96];
    snprintf(cid, sizeof cid, "call_%s_%d", id, index);
    if (f == PGD_TOOLS_MISTRAL) { /* 9 base-62 digits of the FNV-1a hash of that */
        static const char digits[] = "0123456789abcdefghijklmnopqrstuvwxyz"
                                     "ABCDEFGHIJKLMNOPQRSTUVWXYZ";
        uint64_t h = 14695981039346656037ull;
        for (const char *p = cid; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
        for (int i = 0; i < 9; i++, h /= 62) cid[i] = digits[h % 62];
        cid[9] = 0;
    }
    cJSON *c = cJSON_CreateObject(), *fn = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "id", cid);
    cJSON_AddStringToObject(c, "type", "function");
    cJSON_AddStringToObject(fn, "name", name);
    cJSON_AddStringToObject(fn, "arguments", a);
    cJSON_AddItemToObject(c, "function", fn);
    return c;
}

/* The key of a call's arguments in format f's JSON. */
static const char *args_key(pgd_tool_format f) {
    return f == PGD_TOOLS_LLAMA3 || f == PGD_TOOLS_JSON ? "parameters" : "arguments";
}

/* {"name": string, "arguments" (hermes, mistral) or "parameters" (llama3_json, json): an
 * object, or a string holding one} -> an OpenAI tool call; NULL for any other shape. */
static cJSON *make_call(const cJSON *j, pgd_tool_format f, const char *id, int index) {
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(j, "name");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(j, "arguments");
    if (f == PGD_TOOLS_LLAMA3 && !args) args = cJSON_GetObjectItemCaseSensitive(j, "parameters");
    if (f == PGD_TOOLS_JSON) args = cJSON_GetObjectItemCaseSensitive(j, "parameters");
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
        return NULL;
    }
    cJSON *c = call_object(f, name->valuestring, a, id, index);
    free(a);
    return c;
}

cJSON *pgd_tool_call_named(const char *name, const char *text, size_t len, const char *id) {
    char *a = malloc(len + 1);
    if (!a) return NULL;
    memcpy(a, text, len);
    a[len] = 0;
    cJSON *calls = cJSON_CreateArray();
    cJSON_AddItemToArray(calls, call_object(PGD_TOOLS_JSON, name, a, id, 0));
    free(a);
    return calls;
}

/* mistral, json: the calls from p on, one JSON array of them and then only whitespace; NULL
 * when malformed. */
static cJSON *read_array(pgd_tool_format f, const char *p, const char *end, const char *id) {
    const char *stop = NULL;
    cJSON *a = read_value(p, end, &stop), *calls = cJSON_CreateArray(), *j;
    bool ok = cJSON_IsArray(a) && cJSON_GetArraySize(a) > 0 && skip_space(stop, end) == end;
    int n = 0;
    cJSON_ArrayForEach(j, a) {
        cJSON *c = ok ? make_call(j, f, id, n++) : NULL;
        if (!c) ok = false;
        else cJSON_AddItemToArray(calls, c);
    }
    cJSON_Delete(a);
    if (ok) return calls;
    cJSON_Delete(calls);
    return NULL;
}

/* The calls of text[0..len) from p on, each a JSON value followed by sep (a closer and then
 * anything up to the next opener, for hermes) or by the end; NULL when one is malformed. */
static cJSON *read_calls(pgd_tool_format f, const char *p, const char *end, const char *id) {
    if (f == PGD_TOOLS_MISTRAL || f == PGD_TOOLS_JSON) return read_array(f, p, end, id);
    cJSON *calls = cJSON_CreateArray();
    for (int n = 0; p; n++) {
        const char *stop = NULL;
        cJSON *j = read_value(p, end, &stop);
        cJSON *c = j ? make_call(j, f, id, n) : NULL;
        cJSON_Delete(j);
        if (!c) {
            cJSON_Delete(calls);
            return NULL;
        }
        cJSON_AddItemToArray(calls, c);
        const char *after = skip_space(stop, end);
        size_t lc = strlen(PGD_TOOL_CALL_CLOSE);
        if (after == end) {
            p = NULL; /* the last call (for hermes: unclosed) */
        } else if (f == PGD_TOOLS_HERMES && (size_t)(end - after) >= lc &&
                   !memcmp(after, PGD_TOOL_CALL_CLOSE, lc)) {
            const char *o = find(after + lc, (size_t)(end - after - lc), PGD_TOOL_CALL_OPEN);
            p = o ? o + strlen(PGD_TOOL_CALL_OPEN) : NULL;
        } else if (f == PGD_TOOLS_LLAMA3 && *after == ';') {
            p = after + 1;
        } else { /* text after the JSON that is not the separator */
            cJSON_Delete(calls);
            return NULL;
        }
    }
    return calls;
}

/* llama3_json: where the calls start (past whitespace and a textual <|python_tag|>), or NULL
 * when the answer does not start with one (its calls come first or not at all). */
static const char *llama3_start(const char *text, const char *end) {
    const char *p = skip_space(text, end);
    size_t k = strlen(PGD_PYTHON_TAG);
    if ((size_t)(end - p) >= k && !memcmp(p, PGD_PYTHON_TAG, k)) p = skip_space(p + k, end);
    return p < end && *p == '{' ? p : NULL;
}

/* The text that opens the calls, where content may come before it (hermes, mistral). */
static const char *opener_of(pgd_tool_format f) {
    return f == PGD_TOOLS_HERMES ? PGD_TOOL_CALL_OPEN
         : f == PGD_TOOLS_MISTRAL ? PGD_MISTRAL_TOOL_CALLS
                                  : NULL;
}

cJSON *pgd_tool_calls_parse(pgd_tool_format f, const char *text, size_t len, const char *id,
                            size_t *content_len) {
    const char *end = text + len;
    *content_len = len;
    const char *opener = opener_of(f);
    const char *first = opener ? find(text, len, opener)
                      : f == PGD_TOOLS_LLAMA3 ? llama3_start(text, end)
                      : f == PGD_TOOLS_JSON   ? text /* the whole answer is the calls */
                                              : NULL;
    if (!first) return NULL;
    const char *body = opener ? first + strlen(opener) : first;
    cJSON *calls = read_calls(f, body, end, id);
    if (calls) *content_len = opener ? trim_end(text, (size_t)(first - text)) : 0;
    return calls;
}

size_t pgd_tool_calls_stream_safe(pgd_tool_format f, const char *text, size_t len, size_t known,
                                  bool *opened) {
    *opened = false;
    if (f == PGD_TOOLS_JSON) { /* the whole answer is the calls: nothing is content */
        *opened = true;
        return 0;
    }
    if (f == PGD_TOOLS_LLAMA3) { /* calls come first: hold the start until it tells */
        const char *end = text + len, *p = skip_space(text, end);
        size_t rest = (size_t)(end - p), k = strlen(PGD_PYTHON_TAG);
        if (rest == 0 || (rest < k && !memcmp(p, PGD_PYTHON_TAG, rest))) return 0;
        *opened = llama3_start(text, end) != NULL ||
                  (rest >= k && !memcmp(p, PGD_PYTHON_TAG, k));
        return *opened ? 0 : len;
    }
    const char *opener = opener_of(f);
    if (!opener) return len;
    size_t k = strlen(opener), safe = len;
    size_t from = known > len ? len : known; /* an opener may straddle what was seen */
    from = from > k - 1 ? from - (k - 1) : 0;
    const char *o = find(text + from, len - from, opener);
    *opened = o != NULL;
    if (o) return trim_end(text, (size_t)(o - text));
    for (size_t h = k - 1; h > 0; h--) /* the longest ending that starts the opener */
        if (h <= len && !memcmp(text + len - h, opener, h)) {
            safe = len - h;
            break;
        }
    /* and the whitespace before it: the content ends short of it when a call follows */
    return trim_end(text, safe);
}

/* The schema of a call of function f: {"name": f's name, "arguments" (llama3_json, json:
 * "parameters"): its parameters}. The
 * parameters' $defs are moved to root (where their $refs point), which must not have them
 * yet. NULL with *why on a parameters schema that is not an object's. */
static cJSON *call_variant(pgd_tool_format fmt, const cJSON *f, cJSON *root, const char **why) {
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
    cJSON_AddItemToObject(props, args_key(fmt), args);
    cJSON_AddItemToObject(v, "properties", props);
    cJSON *req = cJSON_CreateArray();
    cJSON_AddItemToArray(req, cJSON_CreateString("name"));
    cJSON_AddItemToArray(req, cJSON_CreateString(args_key(fmt)));
    cJSON_AddItemToObject(v, "required", req);
    cJSON_AddFalseToObject(v, "additionalProperties");
    return v;
}

char *pgd_tool_call_schema(pgd_tool_format fmt, const cJSON *tools, const char *name,
                           const char **why) {
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
        cJSON *v = *why ? NULL : call_variant(fmt, f, root, why);
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
         * the name, written first; json: the named function's parameters are the root, and
         * for "required" vLLM's array of calls is */
        if (fmt == PGD_TOOLS_JSON && name) {
            cJSON *v = cJSON_DetachItemFromArray(alts, 0), *e;
            cJSON *args = cJSON_DetachItemFromObjectCaseSensitive(
                cJSON_GetObjectItemCaseSensitive(v, "properties"), args_key(fmt));
            while (args && (e = args->child)) {
                cJSON_DetachItemViaPointer(args, e);
                cJSON_AddItemToObject(root, e->string, e);
            }
            cJSON_Delete(args);
            cJSON_Delete(v);
        } else if (fmt == PGD_TOOLS_JSON) {
            cJSON *items = cJSON_CreateObject();
            cJSON_AddItemToObject(items, "anyOf", alts);
            alts = NULL;
            cJSON_AddStringToObject(root, "type", "array");
            cJSON_AddNumberToObject(root, "minItems", 1);
            cJSON_AddItemToObject(root, "items", items);
        } else if (n == 1) {
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

pgd_tool_format pgd_tool_format_of_template(const char *tmpl) {
    if (!tmpl) return PGD_TOOLS_NONE;
    if (strstr(tmpl, PGD_TOOL_CALL_OPEN)) return PGD_TOOLS_HERMES;
    if (strstr(tmpl, PGD_MISTRAL_TOOL_CALLS)) return PGD_TOOLS_MISTRAL;
    /* Llama 3.1-3.3's instruction for JSON tool calls */
    if (strstr(tmpl, "\"parameters\": dictionary of argument name")) return PGD_TOOLS_LLAMA3;
    return PGD_TOOLS_NONE;
}

const char *pgd_tool_call_prefix(pgd_tool_format f) {
    return f == PGD_TOOLS_HERMES ? PGD_TOOL_CALL_OPEN "\n"
         : f == PGD_TOOLS_MISTRAL ? PGD_MISTRAL_TOOL_CALLS "["
                                  : NULL;
}

const char *pgd_tool_call_suffix(pgd_tool_format f) {
    return f == PGD_TOOLS_HERMES ? "\n" PGD_TOOL_CALL_CLOSE : f == PGD_TOOLS_MISTRAL ? "]" : NULL;
}
