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

/* One call's JSON -> an OpenAI tool call, or NULL. */
static cJSON *one_call(const char *s, size_t n, const char *id, int index) {
    cJSON *j = cJSON_ParseWithLength(s, n);
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(j, "name");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(j, "arguments");
    if (!cJSON_IsObject(j) || !cJSON_IsString(name) || !args) {
        cJSON_Delete(j);
        return NULL;
    }
    char *a = pgd_json_print_exact(args); /* (NULL: a number past the range of doubles) */
    if (!a) {
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
        const char *body = p + strlen(PGD_TOOL_CALL_OPEN);
        const char *close = find(body, (size_t)(end - body), PGD_TOOL_CALL_CLOSE);
        const char *stop = close ? close : end; /* an unclosed last call runs to the end */
        cJSON *c = one_call(body, (size_t)(stop - body), id, n++);
        if (!c) {
            cJSON_Delete(calls);
            return NULL;
        }
        cJSON_AddItemToArray(calls, c);
        if (!close) break;
        const char *after = close + strlen(PGD_TOOL_CALL_CLOSE);
        p = find(after, (size_t)(end - after), PGD_TOOL_CALL_OPEN);
    }
    size_t k = (size_t)(first - text);
    while (k > 0 && is_space(text[k - 1])) k--;
    *content_len = k;
    return calls;
}

size_t pgd_tool_calls_stream_safe(const char *text, size_t len, bool *opened) {
    const char *o = find(text, len, PGD_TOOL_CALL_OPEN);
    *opened = o != NULL;
    if (o) return (size_t)(o - text);
    size_t k = strlen(PGD_TOOL_CALL_OPEN);
    for (size_t h = k - 1; h > 0; h--) /* the longest ending that starts the opener */
        if (h <= len && !memcmp(text + len - h, PGD_TOOL_CALL_OPEN, h)) return len - h;
    return len;
}

char *pgd_tool_call_schema(const cJSON *tools, const char *name, const char **why) {
    cJSON *names = cJSON_CreateArray();
    const cJSON *params = NULL, *t;
    int n = 0;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(f, "name");
        if (!cJSON_IsString(fn)) continue;
        if (name && strcmp(fn->valuestring, name)) continue;
        cJSON_AddItemToArray(names, cJSON_CreateString(fn->valuestring));
        params = cJSON_GetObjectItemCaseSensitive(f, "parameters");
        n++;
    }
    if (n == 0) {
        *why = name ? "'tool_choice' names a function that is not in 'tools'"
                    : "'tools' has no function with a name";
        cJSON_Delete(names);
        return NULL;
    }
    cJSON *s = cJSON_CreateObject(), *props = cJSON_CreateObject(), *nm = cJSON_CreateObject();
    cJSON_AddStringToObject(s, "type", "object");
    cJSON_AddItemToObject(nm, "enum", names);
    cJSON_AddItemToObject(props, "name", nm);
    if (n == 1 && params) {
        cJSON_AddItemToObject(props, "arguments", cJSON_Duplicate(params, true));
        static const char *const defs[] = {"$defs", "definitions"}; /* where its $refs point */
        for (int i = 0; i < 2; i++) {
            const cJSON *d = cJSON_GetObjectItemCaseSensitive(params, defs[i]);
            if (d) cJSON_AddItemToObject(s, defs[i], cJSON_Duplicate(d, true));
        }
    } else {
        cJSON *any = cJSON_CreateObject();
        cJSON_AddStringToObject(any, "type", "object");
        cJSON_AddItemToObject(props, "arguments", any);
    }
    cJSON_AddItemToObject(s, "properties", props);
    cJSON *req = cJSON_CreateArray();
    cJSON_AddItemToArray(req, cJSON_CreateString("name"));
    cJSON_AddItemToArray(req, cJSON_CreateString("arguments"));
    cJSON_AddItemToObject(s, "required", req);
    cJSON_AddFalseToObject(s, "additionalProperties");
    char *text = pgd_json_print_exact(s);
    cJSON_Delete(s);
    if (!text) *why = "the function's parameters hold a number that is not finite";
    return text;
}
