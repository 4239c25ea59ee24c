/* OpenAI request parsing/validation and response bodies. Every check names the parameter and
 * the accepted range, so a client can fix its request from the message alone. */
#include "api/openai.h"

#include <math.h>
#include <stdint.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/reasoning.h"
#include "pagoda/pagoda.h"
#include "api/tool_calls.h"
#include "sample/grammar.h"
#include "sample/json_grammar.h"
#include "sample/regex.h"
#include "tokenizer/unicode.h"
#include "util/status.h"

void pgd_api_error_set(pgd_api_error *e, int status, const char *type, const char *param,
                       const char *code, const char *fmt, ...) {
    e->status = status;
    e->type = type;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    snprintf(e->code, sizeof e->code, "%s", code ? code : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
}

char *pgd_api_error_json(const pgd_api_error *e) {
    cJSON *o = cJSON_CreateObject(), *er = cJSON_AddObjectToObject(o, "error");
    cJSON_AddStringToObject(er, "message", e->message);
    cJSON_AddStringToObject(er, "type", e->type ? e->type : "invalid_request_error");
    if (e->param[0]) cJSON_AddStringToObject(er, "param", e->param);
    else cJSON_AddNullToObject(er, "param");
    if (e->code[0]) cJSON_AddStringToObject(er, "code", e->code);
    else cJSON_AddNullToObject(er, "code");
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

int pgd_api_body_check(const char *body, size_t len, pgd_api_error *err) {
    /* cJSON passes bytes through unchecked; a prompt must be text, so reject what the tokenizer
     * and the JSON responses could not represent faithfully */
    if (!pgd__utf8_valid(body, len)) {
        pgd_api_error_set(err, 400, "invalid_request_error", NULL, "invalid_utf8",
                          "the request body is not valid UTF-8");
        return -1;
    }
    if (pgd_json_has_nul_escape(body, len)) {
        pgd_api_error_set(err, 400, "invalid_request_error", NULL, "invalid_nul",
                          "a string of the request holds a NUL character (\\u0000), which Pagoda "
                          "does not take");
        return -1;
    }
    return 0;
}

cJSON *pgd_api_json_parse(const char *body, size_t len) {
    const char *end = NULL;
    cJSON *o = cJSON_ParseWithLengthOpts(body, len, &end, false);
    if (!o) return NULL;
    /* cJSON stops after the first value; anything but whitespace after it is not JSON */
    while (end && end < body + len && (*end == ' ' || *end == '\t' || *end == '\n' || *end == '\r'))
        end++;
    if (!end || end != body + len) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

static int key_cmp(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The first key found twice in one object of v (depth first), or NULL. n log n per object. */
static const char *duplicate_key(const cJSON *v) {
    if (!cJSON_IsObject(v) && !cJSON_IsArray(v)) return NULL;
    int n = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, v) n++;
    if (cJSON_IsObject(v) && n > 1) {
        const char *small[16], **keys = n <= 16 ? small : malloc((size_t)n * sizeof *keys);
        if (!keys) return NULL; /* (out of memory: the parse goes on; nothing is lost) */
        int k = 0;
        cJSON_ArrayForEach(x, v) keys[k++] = x->string ? x->string : "";
        qsort(keys, (size_t)n, sizeof *keys, key_cmp);
        const char *dup = NULL;
        for (int i = 1; i < n && !dup; i++)
            if (!strcmp(keys[i - 1], keys[i])) dup = keys[i];
        if (keys != small) free(keys);
        if (dup) return dup;
    }
    cJSON_ArrayForEach(x, v) {
        const char *d = duplicate_key(x);
        if (d) return d;
    }
    return NULL;
}

int pgd_api_json_unique_keys(const cJSON *o, pgd_api_error *err) {
    const char *d = duplicate_key(o);
    if (!d) return 0;
    pgd_api_error_set(err, 400, "invalid_request_error", NULL, "duplicate_key",
                      "the request body has the key '%.100s' twice in one object", d);
    return -1;
}

#define BAD(param, ...)                                                                          \
    do {                                                                                         \
        pgd_api_error_set(err, 400, "invalid_request_error", param, NULL, __VA_ARGS__);         \
        goto fail;                                                                               \
    } while (0)

static bool is_int(const cJSON *x) {
    return cJSON_IsNumber(x) && isfinite(x->valuedouble) &&
           x->valuedouble == floor(x->valuedouble) && fabs(x->valuedouble) < 9.007199254740992e15;
}

/* Optional number in [lo, hi]; absent or null leaves *out unchanged. */
static int get_num(const cJSON *o, const char *key, double lo, double hi, bool integer,
                   double *out, pgd_api_error *err) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!x || cJSON_IsNull(x)) return 0;
    if (!cJSON_IsNumber(x) || !isfinite(x->valuedouble)) {
        pgd_api_error_set(err, 400, "invalid_request_error", key, NULL, "'%s' must be %s", key,
                          integer ? "an integer" : "a number");
        return -1;
    }
    if (integer && !is_int(x)) {
        pgd_api_error_set(err, 400, "invalid_request_error", key, NULL,
                          "'%s' must be an integer, got %g", key, x->valuedouble);
        return -1;
    }
    if (x->valuedouble < lo || x->valuedouble > hi) {
        pgd_api_error_set(err, 400, "invalid_request_error", key, NULL,
                          "'%s' must be between %g and %g, got %g", key, lo, hi, x->valuedouble);
        return -1;
    }
    *out = x->valuedouble;
    return 0;
}

static int get_bool(const cJSON *o, const char *key, bool *out, pgd_api_error *err) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!x || cJSON_IsNull(x)) return 0;
    if (!cJSON_IsBool(x)) {
        pgd_api_error_set(err, 400, "invalid_request_error", key, NULL, "'%s' must be a boolean",
                          key);
        return -1;
    }
    *out = cJSON_IsTrue(x);
    return 0;
}

/* A token-id array prompt (of parameter key: "prompt", or an embedding's "input"). */
static int parse_ids(const cJSON *a, const char *key, const pgd_api_limits *lim,
                     pgd_api_prompt *p, pgd_api_error *err) {
    int n = cJSON_GetArraySize(a);
    if (n > lim->max_prompt_tokens) {
        pgd_api_error_set(err, 400, "invalid_request_error", key, "context_length_exceeded",
                          "the %s has %d tokens; at most %d are allowed", key, n,
                          lim->max_prompt_tokens);
        return -1;
    }
    p->ids = malloc((size_t)(n > 0 ? n : 1) * sizeof *p->ids);
    if (!p->ids) {
        pgd_api_error_set(err, 500, "server_error", NULL, NULL, "out of memory");
        return -1;
    }
    const cJSON *x;
    cJSON_ArrayForEach(x, a) {
        if (!is_int(x) || x->valuedouble < 0 || x->valuedouble >= lim->n_vocab) {
            pgd_api_error_set(err, 400, "invalid_request_error", key, NULL,
                              "token ids in '%s' must be integers in [0, %d)", key, lim->n_vocab);
            return -1;
        }
        p->ids[p->n_ids++] = (int32_t)x->valuedouble;
    }
    return 0;
}

static int add_prompt(pgd_api_request *r, const cJSON *x, const char *key,
                      const pgd_api_limits *lim, pgd_api_error *err) {
    if (r->n_prompts >= lim->max_prompts) {
        pgd_api_error_set(err, 400, "invalid_request_error", key, NULL,
                          "at most %d %ss per request", lim->max_prompts, key);
        return -1;
    }
    pgd_api_prompt *p = &r->prompts[r->n_prompts++];
    memset(p, 0, sizeof *p);
    if (cJSON_IsString(x)) {
        p->text = strdup(x->valuestring);
        if (!p->text) {
            pgd_api_error_set(err, 500, "server_error", NULL, NULL, "out of memory");
            return -1;
        }
        return 0;
    }
    if (cJSON_IsArray(x)) return parse_ids(x, key, lim, p, err);
    pgd_api_error_set(err, 400, "invalid_request_error", key, NULL,
                      "'%s' must be a string, an array of strings, an array of token ids or an "
                      "array of token-id arrays", key);
    return -1;
}

/* The prompts of o's key ("prompt", or an embedding request's "input"): a string, an array of
 * strings, an array of token ids or an array of token-id arrays; none empty. */
static int parse_prompts(pgd_api_request *r, const cJSON *o, const char *key,
                         const pgd_api_limits *lim, pgd_api_error *err) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(o, key), *x;
    if (!p) BAD(key, "'%s' is required", key);
    int n = cJSON_IsArray(p) ? cJSON_GetArraySize(p) : 1;
    r->prompts = calloc((size_t)(n > 0 ? n : 1), sizeof *r->prompts);
    if (!r->prompts) {
        pgd_api_error_set(err, 500, "server_error", NULL, NULL, "out of memory");
        return -1;
    }
    const cJSON *first = cJSON_IsArray(p) ? cJSON_GetArrayItem(p, 0) : NULL;
    if (cJSON_IsArray(p) && n == 0) BAD(key, "'%s' must not be an empty array", key);
    if (cJSON_IsString(p) || (cJSON_IsArray(p) && cJSON_IsNumber(first))) {
        if (add_prompt(r, p, key, lim, err)) return -1;
    } else if (cJSON_IsArray(p)) {
        cJSON_ArrayForEach(x, p) if (add_prompt(r, x, key, lim, err)) return -1;
    } else {
        BAD(key, "'%s' must be a string, an array of strings, an array of token ids or an array "
            "of token-id arrays", key);
    }
    for (int i = 0; i < r->n_prompts; i++)
        if ((r->prompts[i].text && !r->prompts[i].text[0]) ||
            (!r->prompts[i].text && r->prompts[i].n_ids == 0))
            BAD(key, "the %s must not be empty", key);
    return 0;
fail:
    return -1;
}

/* A request body as a JSON object (checked: UTF-8, no NUL escapes), its "model" in r->model;
 * NULL with err set. */
static cJSON *parse_body(const char *body, size_t len, pgd_api_request *r, pgd_api_error *err) {
    if (pgd_api_body_check(body, len, err)) return NULL;
    cJSON *o = pgd_api_json_parse(body, len);
    if (!o) {
        pgd_api_error_set(err, 400, "invalid_request_error", NULL, "invalid_json",
                          "the request body is not valid JSON");
        return NULL;
    }
    if (!cJSON_IsObject(o)) BAD(NULL, "the request body must be a JSON object");
    if (pgd_api_json_unique_keys(o, err)) goto fail;
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, "model");
    if (x && !cJSON_IsNull(x) && !cJSON_IsString(x)) BAD("model", "'model' must be a string");
    if (cJSON_IsString(x) && !(r->model = strdup(x->valuestring))) {
        pgd_api_error_set(err, 500, "server_error", NULL, NULL, "out of memory");
        goto fail;
    }
    return o;
fail:
    cJSON_Delete(o);
    return NULL;
}

/* vLLM's "priority": an integer, lower served first; not 0 only under priority scheduling. */
static int get_priority(const cJSON *o, const pgd_api_limits *lim, pgd_api_request *r,
                        pgd_api_error *err) {
    double v = 0;
    if (get_num(o, "priority", INT32_MIN, INT32_MAX, true, &v, err)) return -1;
    if (v != 0 && !lim->priority_scheduling) {
        pgd_api_error_set(err, 400, "invalid_request_error", "priority", NULL, "%s",
                          "'priority' other than 0 needs a server started with "
                          "--scheduling-policy priority");
        return -1;
    }
    r->priority = (int32_t)v;
    return 0;
}

int pgd_api_parse_embeddings(const char *body, size_t len, const pgd_api_limits *lim,
                             int32_t dim, pgd_api_request *r, pgd_api_error *err) {
    memset(r, 0, sizeof *r);
    r->embed = true;
    r->n = 1;
    r->logprobs = r->prompt_logprobs = -1;
    cJSON *o = parse_body(body, len, r, err);
    if (!o) return -1;
    const cJSON *x;
    if (parse_prompts(r, o, "input", lim, err)) goto fail;
    x = cJSON_GetObjectItemCaseSensitive(o, "encoding_format");
    if (x && !cJSON_IsNull(x)) {
        if (!cJSON_IsString(x) ||
            (strcmp(x->valuestring, "float") && strcmp(x->valuestring, "base64")))
            BAD("encoding_format", "'encoding_format' must be \"float\" or \"base64\"");
        r->embed_base64 = !strcmp(x->valuestring, "base64");
    }
    x = cJSON_GetObjectItemCaseSensitive(o, "dimensions");
    if (x && !cJSON_IsNull(x) && (!is_int(x) || x->valuedouble != dim))
        BAD("dimensions", "'dimensions' must be %d: this model's embeddings cannot be shortened",
            dim);
    x = cJSON_GetObjectItemCaseSensitive(o, "user");
    if (x && !cJSON_IsNull(x) && !cJSON_IsString(x)) BAD("user", "'user' must be a string");
    if (get_priority(o, lim, r, err)) goto fail;
    static const char *const known[] = {"model", "input", "encoding_format", "dimensions", "user",
                                        "priority"};
    cJSON_ArrayForEach(x, o) {
        bool ok = false;
        for (size_t i = 0; i < sizeof known / sizeof known[0] && !ok; i++)
            ok = !strcmp(x->string, known[i]);
        if (!ok) BAD(x->string, "'%.64s' is not a parameter of /v1/embeddings", x->string);
    }
    cJSON_Delete(o);
    return 0;
fail:
    cJSON_Delete(o);
    pgd_api_request_free(r);
    return -1;
}

/* An assistant message's tool calls carry their arguments as a JSON string (OpenAI); the chat
 * templates write them with tojson, so they get the value the string holds, as vLLM's
 * _postprocess_messages does: {} for a string that is not JSON, or for arguments that are
 * neither a string, an object nor an array. A null or empty tool_calls is dropped (vLLM), so
 * the template takes the message as a plain answer. */
static void arguments_as_objects(cJSON *msg) {
    cJSON *tc, *calls = cJSON_GetObjectItemCaseSensitive(msg, "tool_calls");
    if (calls && (cJSON_IsNull(calls) || (cJSON_IsArray(calls) && !cJSON_GetArraySize(calls)))) {
        cJSON_DeleteItemFromObjectCaseSensitive(msg, "tool_calls");
        return;
    }
    cJSON_ArrayForEach(tc, (cJSON_IsArray(calls) ? calls : NULL)) {
        cJSON *f = cJSON_GetObjectItemCaseSensitive(tc, "function");
        cJSON *a = cJSON_GetObjectItemCaseSensitive(f, "arguments");
        if (!cJSON_IsObject(f) || cJSON_IsObject(a) || cJSON_IsArray(a)) continue;
        cJSON *v = cJSON_IsString(a) ? pgd_api_json_parse(a->valuestring,
                                                          strlen(a->valuestring))
                                     : NULL;
        if (!v) v = cJSON_CreateObject();
        if (a) cJSON_ReplaceItemInObjectCaseSensitive(f, "arguments", v);
        else cJSON_AddItemToObject(f, "arguments", v);
    }
}

/* A content part's text: {"type": "text" (or the Responses API's "input_text" /
 * "output_text"), "text": ...} or {"type": "refusal", "refusal": ...}, as vLLM reads them. */
static const cJSON *part_text(const cJSON *part) {
    const char *ty = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(part, "type"));
    if (!ty) return NULL;
    const char *key = !strcmp(ty, "text") || !strcmp(ty, "input_text") ||
                              !strcmp(ty, "output_text")
                          ? "text"
                      : !strcmp(ty, "refusal") ? "refusal"
                                               : NULL;
    const cJSON *t = key ? cJSON_GetObjectItemCaseSensitive(part, key) : NULL;
    return cJSON_IsString(t) ? t : NULL;
}

static int parse_messages(pgd_api_request *r, const cJSON *o, pgd_api_error *err) {
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(o, "messages");
    if (!m) {
        pgd_api_error_set(err, 400, "invalid_request_error", "messages", NULL,
                          "'messages' is required");
        return -1;
    }
    if (!cJSON_IsArray(m) || cJSON_GetArraySize(m) == 0) {
        pgd_api_error_set(err, 400, "invalid_request_error", "messages", NULL,
                          "'messages' must be a non-empty array");
        return -1;
    }
    /* Content stays a string, null or a list of text parts ({"type": "text", "text"} each):
     * chat.c hands it to the template in the form the template reads. */
    r->messages = cJSON_CreateArray();
    const cJSON *msg;
    int i = 0;
    cJSON_ArrayForEach(msg, m) {
        char param[48];
        snprintf(param, sizeof param, "messages[%d]", i++);
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(msg, "role");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(msg, "content");
        if (!cJSON_IsObject(msg) || !cJSON_IsString(role)) {
            pgd_api_error_set(err, 400, "invalid_request_error", param, NULL,
                              "%s must be an object with a string 'role'", param);
            return -1;
        }
        const char *rs = role->valuestring;
        if (strcmp(rs, "system") && strcmp(rs, "user") && strcmp(rs, "assistant") &&
            strcmp(rs, "developer") && strcmp(rs, "tool")) {
            pgd_api_error_set(err, 400, "invalid_request_error", param, NULL,
                              "%s.role must be one of system, developer, user, assistant, tool",
                              param);
            return -1;
        }
        /* OpenAI: an assistant's content may be null or absent (with tool calls), and vLLM
         * takes a tool message's so too */
        bool may_lack = !strcmp(rs, "assistant") || !strcmp(rs, "tool");
        cJSON *nm = cJSON_Duplicate(msg, true);
        cJSON_AddItemToArray(r->messages, nm); /* (freed with the request on failure) */
        if (!strcmp(rs, "developer")) cJSON_ReplaceItemInObject(nm, "role", cJSON_CreateString("system"));
        arguments_as_objects(nm);
        if (cJSON_IsArray(content)) {
            cJSON *parts = cJSON_CreateArray();
            const cJSON *part;
            cJSON_ArrayForEach(part, content) {
                const cJSON *tx = part_text(part);
                if (!tx) {
                    cJSON_Delete(parts);
                    pgd_api_error_set(err, 400, "invalid_request_error", param, NULL,
                                      "%s.content parts must be {\"type\": \"text\", \"text\": "
                                      "...} (this model reads text only)", param);
                    return -1;
                }
                cJSON *p = cJSON_CreateObject();
                cJSON_AddStringToObject(p, "type", "text");
                cJSON_AddStringToObject(p, "text", tx->valuestring);
                cJSON_AddItemToArray(parts, p);
            }
            cJSON_ReplaceItemInObjectCaseSensitive(nm, "content", parts);
        } else if (!content && may_lack) {
            cJSON_AddNullToObject(nm, "content"); /* the same as null */
        } else if (!cJSON_IsString(content) && !(cJSON_IsNull(content) && may_lack)) {
            pgd_api_error_set(err, 400, "invalid_request_error", param, NULL,
                              "%s.content must be a string or an array of text parts", param);
            return -1;
        }
    }
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(o, "tools");
    if (tools && !cJSON_IsNull(tools)) {
        const cJSON *t;
        bool ok = cJSON_IsArray(tools);
        cJSON_ArrayForEach(t, (ok ? tools : NULL)) {
            const cJSON *ty = cJSON_GetObjectItemCaseSensitive(t, "type");
            const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
            ok = ok && cJSON_IsString(ty) && !strcmp(ty->valuestring, "function") &&
                 cJSON_IsString(cJSON_GetObjectItemCaseSensitive(fn, "name"));
        }
        if (!ok) {
            pgd_api_error_set(err, 400, "invalid_request_error", "tools", NULL,
                              "'tools' must be an array of {\"type\": \"function\", "
                              "\"function\": {\"name\": ..., \"parameters\": ...}}");
            return -1;
        }
        r->tools = cJSON_Duplicate(tools, true);
    }
    if (cJSON_GetObjectItemCaseSensitive(o, "functions") ||
        cJSON_GetObjectItemCaseSensitive(o, "function_call")) {
        pgd_api_error_set(err, 400, "invalid_request_error", "functions", NULL,
                          "'functions' and 'function_call' (deprecated by OpenAI) are not "
                          "supported: use 'tools' and 'tool_choice'");
        return -1;
    }
    return 0;
}

/* The answer held to schema sch (named `what` in errors, under parameter param). */
static int set_schema(pgd_api_request *r, const cJSON *sch, const char *param, const char *what,
                      pgd_api_error *err) {
    r->json_object = true;
    if (!(r->json_schema = pgd_json_print_exact(sch)))
        BAD(param, "'%s' holds a number that is not finite", what);
    r->schema_param = param; /* compiled later: pgd_api_compile_schema */
    snprintf(r->schema_label, sizeof r->schema_label, "'%s'", what);
    return 0;
fail:
    return -1;
}

/* A constraint's compile status rc as the API's error: out of memory a 500, anything else a 400
 * on the parameter that gave it, with the compiler's msg after label (NULL: 'param'). -1. */
static int compile_failed(int rc, const char *param, const char *label, const char *msg,
                          pgd_api_error *err) {
    if (rc == PGD_ENOMEM)
        pgd_api_error_set(err, 500, "server_error", NULL, NULL, "out of memory");
    else if (label)
        pgd_api_error_set(err, 400, "invalid_request_error", param, NULL, "%s: %s", label, msg);
    else
        pgd_api_error_set(err, 400, "invalid_request_error", param, NULL, "'%s': %s", param, msg);
    return -1;
}

int pgd_api_compile_schema(pgd_api_request *r, pgd_api_error *err) {
    if (!r->json_schema || r->schema_c) return 0;
    char msg[200];
    pgd_json_schema *sc = calloc(1, sizeof *sc);
    /* an answer is an object (OpenAI's rule for response_format); a required call without a
     * tool-call format is vLLM's array of calls */
    int rc = sc ? pgd_json_schema_compile_root(r->json_schema, strlen(r->json_schema),
                                               r->tool_required, sc, msg, sizeof msg)
                : PGD_ENOMEM;
    if (rc) {
        free(sc);
        return compile_failed(rc, r->schema_param, r->schema_label, msg, err);
    }
    r->schema_c = sc;
    return 0;
}

/* response_format, best_of and tool_choice: each is honoured or refused, never ignored. */
static int parse_output_options(const cJSON *o, pgd_api_request *r, pgd_api_error *err) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, "response_format");
    if (x && !cJSON_IsNull(x)) {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(x, "type");
        if (!cJSON_IsObject(x) || !cJSON_IsString(ty))
            BAD("response_format", "'response_format' must be an object with a string 'type'");
        if (!strcmp(ty->valuestring, "json_object")) {
            r->json_object = true;
        } else if (!strcmp(ty->valuestring, "json_schema")) {
            const cJSON *js = cJSON_GetObjectItemCaseSensitive(x, "json_schema");
            if (!cJSON_IsObject(js))
                BAD("response_format", "'response_format.json_schema' must be an object with "
                    "a 'schema'");
            const cJSON *sch = cJSON_GetObjectItemCaseSensitive(js, "schema");
            const cJSON *nm = cJSON_GetObjectItemCaseSensitive(js, "name");
            const cJSON *strict = cJSON_GetObjectItemCaseSensitive(js, "strict");
            if (nm && !cJSON_IsString(nm))
                BAD("response_format", "'response_format.json_schema.name' must be a string");
            if (strict && !cJSON_IsBool(strict) && !cJSON_IsNull(strict))
                BAD("response_format", "'response_format.json_schema.strict' must be a boolean "
                    "(the answer always follows the schema)");
            r->json_object = true; /* without a schema: any JSON object */
            if (sch && !cJSON_IsNull(sch) &&
                set_schema(r, sch, "response_format", "response_format.json_schema.schema", err))
                return -1;
        } else if (strcmp(ty->valuestring, "text")) {
            BAD("response_format", "'response_format.type' must be 'text', 'json_object' or "
                "'json_schema'");
        }
        if (r->json_object && r->min_tokens > 0)
            BAD("min_tokens", "'min_tokens' cannot be combined with a 'json_object' "
                "response_format, whose output ends when the object closes");
    }
    double v = r->n;
    if (get_num(o, "best_of", 1, 1e9, true, &v, err)) return -1;
    if (v < r->n) BAD("best_of", "'best_of' must be at least 'n' (%d)", r->n);
    if (v > r->n)
        BAD("best_of", "'best_of' larger than 'n' is not supported: ask for n=%d and rank the "
            "choices by their logprobs", (int)v);
    x = cJSON_GetObjectItemCaseSensitive(o, "tool_choice");
    if (r->chat && x && !cJSON_IsNull(x)) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(
            cJSON_GetObjectItemCaseSensitive(x, "function"), "name");
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(x, "type");
        if (cJSON_IsString(x) && !strcmp(x->valuestring, "none")) {
            /* the model will not call a tool: the template is not shown them */
            cJSON_Delete(r->tools);
            r->tools = NULL;
        } else if (cJSON_IsString(x) && !strcmp(x->valuestring, "required")) {
            r->tool_required = true;
        } else if (cJSON_IsObject(x) && cJSON_IsString(fn) && cJSON_IsString(ty) &&
                   !strcmp(ty->valuestring, "function")) {
            if (!(r->tool_name = strdup(fn->valuestring))) goto oom;
            r->tool_required = true;
        } else if (!cJSON_IsString(x) || strcmp(x->valuestring, "auto")) {
            BAD("tool_choice", "'tool_choice' must be 'auto', 'none', 'required' or "
                "{\"type\": \"function\", \"function\": {\"name\": ...}}");
        }
        if (r->tool_required && !r->tools)
            BAD("tool_choice", "'tool_choice' asks for a tool call, but there are no 'tools'");
        if (r->tool_required && r->json_object)
            BAD("tool_choice", "a required tool call cannot be combined with 'response_format'");
        if (r->tool_required && r->n_stop)
            BAD("stop", "'stop' cannot be combined with a required tool call (a stop string "
                "could cut the call)");
    }
    r->parallel_tool_calls = true;
    if (r->chat && get_bool(o, "parallel_tool_calls", &r->parallel_tool_calls, err)) return -1;
    return 0;
oom:
    pgd_api_error_set(err, 500, "server_error", NULL, NULL, "out of memory");
fail:
    return -1;
}

/* An array of at most max token ids in [0, n_vocab) under key (absent or null: none). */
static int get_ids(const cJSON *o, const char *key, int max, const pgd_api_limits *lim,
                   int32_t **out, int32_t *n_out, pgd_api_error *err) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key), *y;
    if (!x || cJSON_IsNull(x)) return 0;
    if (!cJSON_IsArray(x) || cJSON_GetArraySize(x) > max)
        BAD(key, "'%s' must be an array of at most %d token ids", key, max);
    if (!(*out = malloc((size_t)(cJSON_GetArraySize(x) + 1) * sizeof **out))) {
        pgd_api_error_set(err, 500, "server_error", NULL, NULL, "out of memory");
        return -1;
    }
    cJSON_ArrayForEach(y, x) {
        if (!is_int(y) || y->valuedouble < 0 || y->valuedouble >= lim->n_vocab)
            BAD(key, "'%s' must hold token ids in [0, %d)", key, lim->n_vocab);
        (*out)[(*n_out)++] = (int32_t)y->valuedouble;
    }
    return 0;
fail:
    return -1;
}

/* guided_choice: 1 to PGD_MAX_CHOICES non-empty strings of at most PGD_MAX_CHOICE_LEN bytes. */
static int set_choices(pgd_api_request *r, const cJSON *x, const char *what, pgd_api_error *err) {
    const cJSON *y;
    int n = cJSON_IsArray(x) ? cJSON_GetArraySize(x) : 0;
    if (n < 1 || n > PGD_MAX_CHOICES)
        BAD(what, "'%s' must be an array of 1 to %d strings", what, PGD_MAX_CHOICES);
    if (!(r->choices = calloc((size_t)n, sizeof *r->choices))) goto oom;
    cJSON_ArrayForEach(y, x) {
        if (!cJSON_IsString(y) || !y->valuestring[0] ||
            strlen(y->valuestring) > PGD_MAX_CHOICE_LEN)
            BAD(what, "'%s' must hold non-empty strings of at most %d bytes", what,
                PGD_MAX_CHOICE_LEN);
        if (!(r->choices[r->n_choices++] = strdup(y->valuestring))) goto oom;
    }
    return 0;
oom:
    pgd_api_error_set(err, 500, "server_error", NULL, NULL, "out of memory");
fail:
    return -1;
}

/* A string option compiled later, off the thread that parses (a regex's DFA can take tens of
 * milliseconds to build): *out = a copy of it, *param = what (for a 400 on its text). */
static int set_text(const cJSON *x, const char *what, size_t max_len, char **out,
                    const char **param, pgd_api_error *err) {
    if (!cJSON_IsString(x)) BAD(what, "'%s' must be a string", what);
    if (strlen(x->valuestring) > max_len)
        BAD(what, "'%s' is longer than %zu bytes", what, max_len);
    if (!(*out = strdup(x->valuestring))) {
        pgd_api_error_set(err, 500, "server_error", NULL, NULL, "out of memory");
        return -1;
    }
    *param = what;
    return 0;
fail:
    return -1;
}


int pgd_api_compile_regex(pgd_api_request *r, pgd_api_error *err) {
    if (!r->regex || r->regex_dfa) return 0;
    char msg[200];
    pgd_regex *re = malloc(sizeof *re);
    int rc = re ? pgd_regex_compile(r->regex, strlen(r->regex), re, msg, sizeof msg) : PGD_ENOMEM;
    if (rc) {
        free(re);
        return compile_failed(rc, r->regex_param, NULL, msg, err);
    }
    r->regex_dfa = re;
    return 0;
}

int pgd_api_compile_grammar(pgd_api_request *r, pgd_api_error *err) {
    if (!r->grammar || r->grammar_c) return 0;
    char msg[300];
    pgd_grammar *g = malloc(sizeof *g);
    int rc = g ? pgd_grammar_compile(r->grammar, strlen(r->grammar), g, msg, sizeof msg)
               : PGD_ENOMEM;
    if (rc) {
        free(g);
        return compile_failed(rc, r->grammar_param, NULL, msg, err);
    }
    r->grammar_c = g;
    return 0;
}

/* A JSON Schema given as an object or as a string holding one (vLLM takes both). */
static int set_schema_value(pgd_api_request *r, const cJSON *x, const char *what,
                            pgd_api_error *err) {
    if (cJSON_IsObject(x)) return set_schema(r, x, what, what, err);
    cJSON *parsed = cJSON_IsString(x) ? cJSON_Parse(x->valuestring) : NULL;
    int rc;
    if (!cJSON_IsObject(parsed)) {
        pgd_api_error_set(err, 400, "invalid_request_error", what, NULL,
                          "'%s' must be a JSON Schema object (or a string holding one)", what);
        rc = -1;
    } else {
        rc = set_schema(r, parsed, what, what, err);
    }
    cJSON_Delete(parsed);
    return rc;
}

/* A key that is null, absent, false, 0, "" or [] (vLLM's "not set"). */
static bool unset(const cJSON *x) {
    return !x || cJSON_IsNull(x) || cJSON_IsFalse(x) ||
           (cJSON_IsNumber(x) && x->valuedouble == 0) ||
           (cJSON_IsString(x) && !x->valuestring[0]) ||
           (cJSON_IsArray(x) && cJSON_GetArraySize(x) == 0);
}

/* vLLM's sampling and structured-output extensions: honoured, or refused by name (a client
 * written for vLLM must not get an unconstrained answer it did not ask for). */
static int parse_vllm_options(const cJSON *o, pgd_api_request *r, const pgd_api_limits *lim,
                              pgd_api_error *err) {
    if (get_ids(o, "stop_token_ids", 64, lim, &r->stop_ids, &r->n_stop_ids, err) ||
        get_ids(o, "allowed_token_ids", lim->n_vocab, lim, &r->allowed_ids, &r->n_allowed, err) ||
        get_priority(o, lim, r, err))
        return -1;
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, "allowed_token_ids");
    if (cJSON_IsArray(x) && r->n_allowed == 0)
        BAD("allowed_token_ids", "'allowed_token_ids' must not be empty");
    bool skip = true, spaces = true;
    if (get_bool(o, "include_stop_str_in_output", &r->include_stop, err) ||
        get_bool(o, "skip_special_tokens", &skip, err) ||
        get_bool(o, "spaces_between_special_tokens", &spaces, err))
        return -1;
    r->render_special = !skip; /* (spaces_between_special_tokens: no effect, as with HF's fast
                                   tokenizers, which vLLM uses) */
    double v = 0;
    if (get_num(o, "truncate_prompt_tokens", -1, 1e9, true, &v, err)) return -1;
    if (v == 0 && cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(o, "truncate_prompt_tokens")))
        BAD("truncate_prompt_tokens", "'truncate_prompt_tokens' must be -1 or at least 1");
    r->truncate_prompt = (int32_t)v;
    /* structured output: one kind at most */
    const cJSON *gj = cJSON_GetObjectItemCaseSensitive(o, "guided_json");
    const cJSON *gc = cJSON_GetObjectItemCaseSensitive(o, "guided_choice");
    const cJSON *gr = cJSON_GetObjectItemCaseSensitive(o, "guided_regex");
    const cJSON *gg = cJSON_GetObjectItemCaseSensitive(o, "guided_grammar");
    const cJSON *lg = cJSON_GetObjectItemCaseSensitive(o, "grammar"); /* llama.cpp's */
    const cJSON *lj = cJSON_GetObjectItemCaseSensitive(o, "json_schema"); /* llama.cpp's */
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(o, "structured_outputs");
    bool gc_set = gc && !cJSON_IsNull(gc); /* an empty list of choices is an error */
    bool gr_set = gr && !cJSON_IsNull(gr); /* "" too: the empty answer */
    int kinds = r->json_object + !unset(gj) + gc_set + gr_set + !unset(gg) + !unset(lg) +
                !unset(lj);
    const cJSON *sj = NULL, *sc = NULL, *sr = NULL, *sg = NULL, *y;
    if (!unset(so)) {
        if (!cJSON_IsObject(so))
            BAD("structured_outputs", "'structured_outputs' must be an object");
        cJSON_ArrayForEach(y, so) {
            if (unset(y)) continue;
            if (!strcmp(y->string, "json")) sj = y;
            else if (!strcmp(y->string, "choice")) sc = y;
            else if (!strcmp(y->string, "regex")) sr = y;
            else if (!strcmp(y->string, "grammar")) sg = y;
            else if (!strcmp(y->string, "json_object") && !cJSON_IsBool(y))
                BAD("structured_outputs", "'structured_outputs.json_object' must be a boolean");
            else if (strcmp(y->string, "json_object"))
                BAD("structured_outputs", "'structured_outputs.%s' is not supported (json, "
                    "json_object, choice, regex and grammar are)", y->string);
            kinds++;
        }
    }
    if (kinds > 1)
        BAD(NULL, "ask for one kind of structured output: response_format, guided_json, "
            "guided_choice, guided_regex, guided_grammar, grammar, json_schema or one key of "
            "structured_outputs");
    if (!unset(gj) && set_schema_value(r, gj, "guided_json", err)) return -1;
    if (!unset(lj) && set_schema_value(r, lj, "json_schema", err)) return -1;
    if (sj && set_schema_value(r, sj, "structured_outputs.json", err)) return -1;
    if (so && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(so, "json_object")))
        r->json_object = true;
    if (gc_set && set_choices(r, gc, "guided_choice", err)) return -1;
    if (sc && set_choices(r, sc, "structured_outputs.choice", err)) return -1;
    const cJSON *re = gr_set ? gr : sr, *gm = !unset(gg) ? gg : !unset(lg) ? lg : sg;
    const char *re_what = gr_set ? "guided_regex" : "structured_outputs.regex";
    const char *gm_what = !unset(gg)   ? "guided_grammar"
                          : !unset(lg) ? "grammar"
                                       : "structured_outputs.grammar";
    if (re && set_text(re, re_what, PGD_REGEX_MAX_LEN, &r->regex, &r->regex_param, err))
        return -1;
    if (gm && set_text(gm, gm_what, PGD_GRAMMAR_MAX_LEN, &r->grammar, &r->grammar_param, err))
        return -1;
    if ((r->json_object || r->n_choices || r->regex || r->grammar) && r->min_tokens > 0)
        BAD("min_tokens", "'min_tokens' cannot be combined with structured output, which ends "
            "where it is whole");
    if ((r->json_object || r->n_choices || r->regex || r->grammar) && r->tool_required)
        BAD("tool_choice", "a required tool call cannot be combined with structured output");
    /* vLLM's other extensions that change what is generated: refused where set */
    static const char *const refused[] = {
        "guided_whitespace_pattern", "bad_words",
        "use_beam_search", "logits_processors", "return_tokens_as_token_ids", "structural_tag",
        "vllm_xargs", "kv_transfer_params"};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++)
        if (!unset(cJSON_GetObjectItemCaseSensitive(o, refused[i])))
            BAD(refused[i], "'%s' (a vLLM extension) is not supported", refused[i]);
    x = cJSON_GetObjectItemCaseSensitive(o, "length_penalty");
    if (x && !cJSON_IsNull(x) && !(cJSON_IsNumber(x) && x->valuedouble == 1))
        BAD("length_penalty", "'length_penalty' applies to beam search, which is not supported");
    return 0;
fail:
    return -1;
}

/* vLLM's chat_template_kwargs and continue_final_message (as transformers' arguments of those
 * names): the first must be an object that leaves messages and tools alone; the second needs a
 * final assistant message and cannot be asked for with add_generation_prompt. */
static int parse_template_options(pgd_api_request *r, const cJSON *o, pgd_api_error *err) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, "chat_template_kwargs");
    if (x && !cJSON_IsNull(x)) {
        if (!cJSON_IsObject(x) || cJSON_GetObjectItemCaseSensitive(x, "messages") ||
            cJSON_GetObjectItemCaseSensitive(x, "tools")) {
            pgd_api_error_set(err, 400, "invalid_request_error", "chat_template_kwargs", NULL,
                              "'chat_template_kwargs' must be an object that does not set "
                              "'messages' or 'tools'");
            return -1;
        }
        if (!(r->template_kwargs = cJSON_Duplicate(x, true))) {
            pgd_api_error_set(err, 500, "server_error", NULL, NULL, "out of memory");
            return -1;
        }
    }
    if (get_bool(o, "continue_final_message", &r->continue_final_message, err)) return -1;
    if (!r->continue_final_message) return 0;
    const char *why = NULL;
    const cJSON *last = cJSON_GetArrayItem(r->messages, cJSON_GetArraySize(r->messages) - 1);
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(last, "role");
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "add_generation_prompt")) ||
        cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(r->template_kwargs,
                                                      "add_generation_prompt")))
        why = "'continue_final_message' and 'add_generation_prompt' cannot both be true";
    else if (!cJSON_IsString(role) || strcmp(role->valuestring, "assistant"))
        why = "'continue_final_message' needs a final assistant message to continue";
    if (why) {
        pgd_api_error_set(err, 400, "invalid_request_error", "continue_final_message", NULL,
                          "%s", why);
        return -1;
    }
    r->add_generation_prompt = false;
    return 0;
}

int pgd_api_parse(const char *body, size_t len, bool chat, const pgd_api_limits *lim,
                  pgd_api_request *r, pgd_api_error *err) {
    memset(r, 0, sizeof *r);
    r->chat = chat;
    r->n = 1;
    r->logprobs = r->prompt_logprobs = -1;
    r->temperature = 1.0f;
    r->top_p = 1.0f;
    r->max_tokens = chat ? 0 : 16;
    r->add_generation_prompt = true;
    cJSON *o = parse_body(body, len, r, err);
    if (!o) return -1;
    const cJSON *x;

    if (chat) {
        if (parse_messages(r, o, err)) goto fail;
    } else {
        if (parse_prompts(r, o, "prompt", lim, err)) goto fail;
        const cJSON *sfx = cJSON_GetObjectItemCaseSensitive(o, "suffix");
        if (sfx && !cJSON_IsNull(sfx) && !(cJSON_IsString(sfx) && !sfx->valuestring[0]))
            BAD("suffix", "'suffix' (fill-in-the-middle) is not supported by this model");
        if (get_bool(o, "echo", &r->echo, err)) goto fail;
    }

    double v;
    v = r->max_tokens;
    if (get_num(o, "max_tokens", r->echo ? 0 : 1, lim->max_tokens_limit, true, &v, err))
        goto fail;
    r->echo_only = r->echo && v == 0; /* (chat has no echo) */
    if (chat && get_num(o, "max_completion_tokens", 1, lim->max_tokens_limit, true, &v, err))
        goto fail;
    r->max_tokens = (int32_t)v;
    v = 1;
    if (get_num(o, "n", 1, lim->max_n, true, &v, err)) goto fail;
    r->n = (int32_t)v;
    struct { const char *key; double lo, hi; float *dst; } fl[] = {
        {"temperature", 0, 2, &r->temperature},   {"top_p", 0, 1, &r->top_p},
        {"min_p", 0, 1, &r->min_p},               {"presence_penalty", -2, 2, &r->presence_penalty},
        {"frequency_penalty", -2, 2, &r->frequency_penalty},
        {"repetition_penalty", 0.01, 10, &r->repetition_penalty},
    };
    for (size_t i = 0; i < sizeof fl / sizeof fl[0]; i++) {
        v = *fl[i].dst;
        if (get_num(o, fl[i].key, fl[i].lo, fl[i].hi, false, &v, err)) goto fail;
        *fl[i].dst = (float)v;
    }
    if (r->top_p == 0) BAD("top_p", "'top_p' must be greater than 0");
    v = 0;
    if (get_num(o, "top_k", -1, 1e9, true, &v, err)) goto fail;
    r->top_k = v < 0 ? 0 : (int32_t)v; /* -1 means off, as in vLLM */
    v = 0;
    if (get_num(o, "min_tokens", 0, lim->max_tokens_limit, true, &v, err)) goto fail;
    r->min_tokens = (int32_t)v;
    /* max_tokens 0: chat's "up to the context", or the prompt alone with echo */
    if ((r->max_tokens > 0 || r->echo_only) && r->min_tokens > r->max_tokens)
        BAD("min_tokens", "'min_tokens' (%d) must not exceed 'max_tokens' (%d)", r->min_tokens,
            r->max_tokens);
    x = cJSON_GetObjectItemCaseSensitive(o, "seed");
    if (x && !cJSON_IsNull(x)) {
        if (!is_int(x))
            BAD("seed", "'seed' must be an integer of magnitude below 2^53 (where JSON numbers "
                        "stop being exact)");
        r->has_seed = true;
        r->seed = (uint64_t)(int64_t)x->valuedouble;
    }
    if (get_bool(o, "stream", &r->stream, err) || get_bool(o, "ignore_eos", &r->ignore_eos, err))
        goto fail;
    if (chat && get_bool(o, "add_generation_prompt", &r->add_generation_prompt, err)) goto fail;
    if (chat && parse_template_options(r, o, err)) goto fail;
    bool spec = true;
    if (get_bool(o, "speculative", &spec, err)) goto fail;
    r->no_speculation = !spec;
    x = cJSON_GetObjectItemCaseSensitive(o, "stream_options");
    if (x && !cJSON_IsNull(x)) {
        if (!cJSON_IsObject(x)) BAD("stream_options", "'stream_options' must be an object");
        if (!r->stream) BAD("stream_options", "'stream_options' is only allowed with stream=true");
        if (get_bool(x, "include_usage", &r->include_usage, err)) goto fail;
    }
    /* logprobs: completions take an integer; chat a boolean plus top_logprobs */
    x = cJSON_GetObjectItemCaseSensitive(o, "logprobs");
    if (chat) {
        bool lp = false;
        if (get_bool(o, "logprobs", &lp, err)) goto fail;
        v = 0;
        if (get_num(o, "top_logprobs", 0, lim->max_logprobs, true, &v, err)) goto fail;
        if (v > 0 && !lp) BAD("top_logprobs", "'top_logprobs' requires 'logprobs': true");
        r->logprobs = lp ? (int32_t)v : -1;
    } else if (x && !cJSON_IsNull(x)) {
        v = 0;
        if (get_num(o, "logprobs", 0, lim->max_logprobs, true, &v, err)) goto fail;
        r->logprobs = (int32_t)v;
    }
    v = -1;
    if (get_num(o, "prompt_logprobs", 0, lim->max_logprobs, true, &v, err)) goto fail;
    r->prompt_logprobs = (int32_t)v;
    if (r->prompt_logprobs >= 0 && r->stream)
        BAD("prompt_logprobs", "'prompt_logprobs' is not supported with stream=true (as in vLLM)");
    x = cJSON_GetObjectItemCaseSensitive(o, "stop");
    if (cJSON_IsString(x)) {
        if (!x->valuestring[0]) BAD("stop", "stop strings must not be empty");
        if (strlen(x->valuestring) > 64) BAD("stop", "stop strings are limited to 64 bytes");
        if (!(r->stop[r->n_stop++] = strdup(x->valuestring))) goto oom;
    } else if (cJSON_IsArray(x)) {
        if (cJSON_GetArraySize(x) > 4) BAD("stop", "at most 4 stop sequences");
        const cJSON *y;
        cJSON_ArrayForEach(y, x) {
            if (!cJSON_IsString(y) || !y->valuestring[0] || strlen(y->valuestring) > 64)
                BAD("stop", "'stop' must be a string or up to 4 non-empty strings of at most 64 "
                    "bytes");
            if (!(r->stop[r->n_stop++] = strdup(y->valuestring))) goto oom;
        }
    } else if (x && !cJSON_IsNull(x)) {
        BAD("stop", "'stop' must be a string or an array of strings");
    }
    x = cJSON_GetObjectItemCaseSensitive(o, "logit_bias");
    if (x && !cJSON_IsNull(x)) {
        if (!cJSON_IsObject(x)) BAD("logit_bias", "'logit_bias' must be an object");
        int n = cJSON_GetArraySize(x);
        if (n > 300) BAD("logit_bias", "at most 300 entries in 'logit_bias'");
        r->bias_ids = malloc((size_t)(n ? n : 1) * sizeof *r->bias_ids);
        r->bias = malloc((size_t)(n ? n : 1) * sizeof *r->bias);
        if (!r->bias_ids || !r->bias) goto oom;
        const cJSON *y;
        cJSON_ArrayForEach(y, x) {
            char *end;
            long id = strtol(y->string, &end, 10);
            if (*end || end == y->string || id < 0 || id >= lim->n_vocab)
                BAD("logit_bias", "'logit_bias' keys must be token ids in [0, %d)", lim->n_vocab);
            if (!cJSON_IsNumber(y) || y->valuedouble < -100 || y->valuedouble > 100)
                BAD("logit_bias", "'logit_bias' values must be numbers in [-100, 100]");
            r->bias_ids[r->n_bias] = (int32_t)id;
            r->bias[r->n_bias++] = (float)y->valuedouble;
        }
    }
    x = cJSON_GetObjectItemCaseSensitive(o, "user");
    if (x && !cJSON_IsNull(x) && !cJSON_IsString(x)) BAD("user", "'user' must be a string");
    if (parse_output_options(o, r, err) || parse_vllm_options(o, r, lim, err)) goto fail;
    cJSON_Delete(o);
    return 0;
oom:
    pgd_api_error_set(err, 500, "server_error", NULL, NULL, "out of memory");
fail:
    cJSON_Delete(o);
    pgd_api_request_free(r);
    return -1;
}

void pgd_api_request_free(pgd_api_request *r) {
    free(r->model);
    for (int i = 0; i < r->n_prompts; i++) {
        free(r->prompts[i].text);
        free(r->prompts[i].ids);
    }
    free(r->prompts);
    cJSON_Delete(r->messages);
    cJSON_Delete(r->tools);
    cJSON_Delete(r->template_kwargs);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->bias_ids);
    free(r->bias);
    free(r->json_schema);
    free(r->tool_name);
    free(r->stop_ids);
    free(r->allowed_ids);
    for (int i = 0; i < r->n_choices; i++) free(r->choices[i]);
    free(r->choices);
    free(r->regex);
    if (r->regex_dfa) pgd_regex_free(r->regex_dfa);
    free(r->regex_dfa);
    free(r->grammar);
    if (r->grammar_c) pgd_grammar_free(r->grammar_c);
    free(r->grammar_c);
    if (r->schema_c) pgd_json_schema_free(r->schema_c);
    free(r->schema_c);
    memset(r, 0, sizeof *r);
}

/* ---- responses ---- */

/* vLLM's stop_reason beside a finish_reason: the stop string or stop token id that ended the
 * choice, null for anything else (an end-of-generation token, max_tokens, a constraint; a
 * choice still running, c NULL). */
static void add_stop_reason(cJSON *ch, const pgd_api_request *r, const pgd_api_choice *c) {
    if (c && c->stop_string >= 0 && c->stop_string < r->n_stop)
        cJSON_AddStringToObject(ch, "stop_reason", r->stop[c->stop_string]);
    else if (c && c->stop_token >= 0)
        cJSON_AddNumberToObject(ch, "stop_reason", c->stop_token);
    else
        cJSON_AddNullToObject(ch, "stop_reason");
}

static cJSON *string_n(const char *s, size_t n) {
    char *c = malloc(n + 1);
    if (!c) return cJSON_CreateString("");
    memcpy(c, s, n);
    c[n] = 0;
    cJSON *j = cJSON_CreateString(c);
    free(c);
    return j;
}

/* OpenAI's usage, with the prompt tokens the prefix cache served (prompt_tokens_details, as
 * OpenAI and vLLM's --enable-prompt-tokens-details report them). */
static void add_usage(cJSON *o, const pgd_api_request *r, int32_t prompt, int32_t completion) {
    cJSON *u = cJSON_AddObjectToObject(o, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", completion);
    cJSON_AddNumberToObject(u, "total_tokens", prompt + completion);
    cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", r->cached_tokens);
    if (r->reasoning) /* OpenAI's field; counted only where reasoning is parsed out */
        cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "completion_tokens_details"),
                                "reasoning_tokens", r->reasoning_tokens);
}

/* Base64 (RFC 4648, padded) of n bytes, malloc'd; NULL when out of memory. */
static char *base64(const unsigned char *b, size_t n) {
    static const char a[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char *o = malloc((n + 2) / 3 * 4 + 1), *p = o;
    if (!o) return NULL;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)b[i] << 16 | (i + 1 < n ? (uint32_t)b[i + 1] << 8 : 0) |
                     (i + 2 < n ? b[i + 2] : 0);
        *p++ = a[v >> 18];
        *p++ = a[(v >> 12) & 63];
        *p++ = i + 1 < n ? a[(v >> 6) & 63] : '=';
        *p++ = i + 2 < n ? a[v & 63] : '=';
    }
    *p = 0;
    return o;
}

char *pgd_api_embeddings_json(const pgd_api_request *r, const char *model,
                              const pgd_api_choice *choices, int n, int32_t dim,
                              int32_t prompt_tokens) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(o, "data");
    bool ok = o && data;
    for (int i = 0; ok && i < n; i++) {
        cJSON *e = cJSON_CreateObject();
        ok = e && cJSON_AddItemToArray(data, e);
        if (!ok) break;
        cJSON_AddStringToObject(e, "object", "embedding");
        cJSON_AddNumberToObject(e, "index", i);
        if (r->embed_base64) { /* the floats' bytes, little-endian (as x86 and OpenAI) */
            char *b = base64((const unsigned char *)choices[i].embedding,
                             (size_t)dim * sizeof(float));
            ok = b && cJSON_AddStringToObject(e, "embedding", b);
            free(b);
            continue;
        }
        cJSON *v = cJSON_AddArrayToObject(e, "embedding");
        for (int32_t k = 0; v && k < dim; k++)
            cJSON_AddItemToArray(v, cJSON_CreateNumber(choices[i].embedding[k]));
        ok = v != NULL;
    }
    if (ok) {
        cJSON_AddStringToObject(o, "model", model);
        cJSON *u = cJSON_AddObjectToObject(o, "usage");
        cJSON_AddNumberToObject(u, "prompt_tokens", prompt_tokens);
        cJSON_AddNumberToObject(u, "total_tokens", prompt_tokens);
    }
    char *s = ok ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return s;
}

char *pgd_api_completion_json(const pgd_api_request *r, const char *id, long created,
                              const char *model, pgd_api_choice *choices, int n_choices,
                              int32_t prompt_tokens, int32_t completion_tokens) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "object", r->chat ? "chat.completion" : "text_completion");
    cJSON_AddNumberToObject(o, "created", (double)created);
    cJSON_AddStringToObject(o, "model", model);
    cJSON *arr = cJSON_AddArrayToObject(o, "choices");
    for (int i = 0; i < n_choices; i++) {
        pgd_api_choice *c = &choices[i];
        cJSON *ch = cJSON_CreateObject();
        cJSON_AddNumberToObject(ch, "index", i);
        const char *finish = c->finish_reason ? c->finish_reason : "stop";
        if (r->chat) {
            cJSON *m = cJSON_AddObjectToObject(ch, "message");
            cJSON_AddStringToObject(m, "role", "assistant");
            const char *text = c->text ? c->text : "";
            pgd_reasoning_span sp;
            pgd_reasoning_scan((pgd_reasoning_format)r->reasoning, text, c->text_len, true, 0,
                               &sp);
            size_t c_off = sp.content ? sp.c_off : c->text_len, content_len = c->text_len - c_off;
            cJSON *calls = pgd_api_choice_tool_calls(r, id, i, text + c_off, content_len,
                                                     &content_len, &finish);
            /* vLLM: null for no content (with reasoning or calls) */
            if (content_len == 0 && (calls || r->reasoning)) cJSON_AddNullToObject(m, "content");
            else cJSON_AddItemToObject(m, "content", string_n(text + c_off, content_len));
            if (sp.thinking)
                cJSON_AddItemToObject(m, "reasoning_content",
                                      string_n(text + sp.r_off, sp.r_end - sp.r_off));
            else if (r->reasoning)
                cJSON_AddNullToObject(m, "reasoning_content");
            cJSON_AddNullToObject(m, "refusal");
            if (calls) cJSON_AddItemToObject(m, "tool_calls", calls);
        } else {
            cJSON_AddItemToObject(ch, "text", string_n(c->text ? c->text : "", c->text_len));
        }
        if (c->logprobs) {
            cJSON_AddItemToObject(ch, "logprobs", c->logprobs);
            c->logprobs = NULL;
        } else {
            cJSON_AddNullToObject(ch, "logprobs");
        }
        cJSON_AddStringToObject(ch, "finish_reason", finish);
        add_stop_reason(ch, r, c);
        if (c->prompt_logprobs && !r->chat) { /* vLLM: per choice; chat: once, at the top */
            cJSON_AddItemToObject(ch, "prompt_logprobs", c->prompt_logprobs);
            c->prompt_logprobs = NULL;
        }
        cJSON_AddItemToArray(arr, ch);
    }
    if (r->chat && n_choices > 0 && choices[0].prompt_logprobs) {
        cJSON_AddItemToObject(o, "prompt_logprobs", choices[0].prompt_logprobs);
        choices[0].prompt_logprobs = NULL;
    }
    add_usage(o, r, prompt_tokens, completion_tokens);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

static char *sse(cJSON *o) {
    char *js = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!js) return NULL;
    size_t n = strlen(js);
    char *out = malloc(n + 9);
    if (out) {
        memcpy(out, "data: ", 6);
        memcpy(out + 6, js, n);
        memcpy(out + 6 + n, "\n\n", 3);
    }
    free(js);
    return out;
}

static cJSON *chunk_base(const pgd_api_request *r, const char *id, long created, const char *model) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "object", r->chat ? "chat.completion.chunk" : "text_completion");
    cJSON_AddNumberToObject(o, "created", (double)created);
    cJSON_AddStringToObject(o, "model", model);
    return o;
}

char *pgd_api_chunk_sse(const pgd_api_request *r, const char *id, long created,
                        const char *model, int index, const char *text, size_t text_len,
                        const char *reasoning, size_t reasoning_len, bool role_first,
                        const char *finish, const pgd_api_choice *fin_choice, cJSON *logprobs) {
    cJSON *o = chunk_base(r, id, created, model);
    cJSON *arr = cJSON_AddArrayToObject(o, "choices"), *ch = cJSON_CreateObject();
    cJSON_AddNumberToObject(ch, "index", index);
    if (r->chat) {
        cJSON *d = cJSON_AddObjectToObject(ch, "delta");
        if (role_first) cJSON_AddStringToObject(d, "role", "assistant");
        if (reasoning_len)
            cJSON_AddItemToObject(d, "reasoning_content", string_n(reasoning, reasoning_len));
        if (!text_len && role_first && !reasoning_len && r->tool_required)
            cJSON_AddNullToObject(d, "content"); /* the answer is a call: no content, as OpenAI */
        else if (text_len || (role_first && !reasoning_len))
            cJSON_AddItemToObject(d, "content", string_n(text, text_len));
    } else {
        cJSON_AddItemToObject(ch, "text", string_n(text, text_len));
    }
    if (logprobs) cJSON_AddItemToObject(ch, "logprobs", logprobs);
    else cJSON_AddNullToObject(ch, "logprobs");
    if (finish) cJSON_AddStringToObject(ch, "finish_reason", finish);
    else cJSON_AddNullToObject(ch, "finish_reason");
    add_stop_reason(ch, r, finish ? fin_choice : NULL); /* null before the end, as vLLM */
    cJSON_AddItemToArray(arr, ch);
    /* chat chunks carry "usage": null until the last one, as OpenAI sends them; the completion
     * chunk's schema (CreateCompletionResponse) has a non-nullable usage, so it is left out */
    if (r->include_usage && r->chat) cJSON_AddNullToObject(o, "usage");
    return sse(o);
}

cJSON *pgd_api_choice_tool_calls(const pgd_api_request *r, const char *id, int index,
                                 const char *text, size_t len, size_t *content_len,
                                 const char **finish) {
    if (!r->tool_format) return NULL;
    char cid[96];
    snprintf(cid, sizeof cid, "%s_%d", id, index);
    size_t cl = 0;
    /* a named function without a format: the answer is its arguments, as the model wrote them */
    cJSON *calls = r->tool_format == PGD_TOOLS_JSON && r->tool_name
                       ? pgd_tool_call_named(r->tool_name, text, len, cid)
                       : pgd_tool_calls_parse((pgd_tool_format)r->tool_format, text, len, cid,
                                              &cl);
    if (!calls) return NULL;
    while (!r->parallel_tool_calls && cJSON_GetArraySize(calls) > 1)
        cJSON_DeleteItemFromArray(calls, cJSON_GetArraySize(calls) - 1);
    *content_len = cl;
    /* vLLM (and OpenAI): "tool_calls" for calls the model chose or was required to make,
     * "stop" for a named function's */
    if (*finish && !strcmp(*finish, "stop") && !r->tool_name) *finish = "tool_calls";
    return calls;
}

char *pgd_api_tool_calls_chunk_sse(const pgd_api_request *r, const char *id, long created,
                                   const char *model, int index, bool role_first, cJSON *calls,
                                   const char *finish, const pgd_api_choice *fin_choice) {
    cJSON *o = chunk_base(r, id, created, model);
    cJSON *arr = cJSON_AddArrayToObject(o, "choices"), *ch = cJSON_CreateObject();
    cJSON_AddNumberToObject(ch, "index", index);
    cJSON *d = cJSON_AddObjectToObject(ch, "delta");
    if (role_first) { /* OpenAI's first delta of a call: the role, no content */
        cJSON_AddStringToObject(d, "role", "assistant");
        cJSON_AddNullToObject(d, "content");
    }
    int k = 0;
    cJSON *c;
    cJSON_ArrayForEach(c, calls) cJSON_AddNumberToObject(c, "index", k++);
    cJSON_AddItemToObject(d, "tool_calls", calls);
    cJSON_AddNullToObject(ch, "logprobs");
    if (finish) cJSON_AddStringToObject(ch, "finish_reason", finish);
    else cJSON_AddNullToObject(ch, "finish_reason");
    add_stop_reason(ch, r, finish ? fin_choice : NULL); /* null before the end, as vLLM */
    cJSON_AddItemToArray(arr, ch);
    if (r->include_usage) cJSON_AddNullToObject(o, "usage");
    return sse(o);
}

char *pgd_api_usage_chunk_sse(const pgd_api_request *r, const char *id, long created,
                              const char *model, int32_t prompt_tokens,
                              int32_t completion_tokens) {
    cJSON *o = chunk_base(r, id, created, model);
    cJSON_AddArrayToObject(o, "choices");
    add_usage(o, r, prompt_tokens, completion_tokens);
    return sse(o);
}

/* ---- logprobs ---- */


/* A token's text as a JSON string; a piece of a multi-byte character is written as
 * "bytes:\\xNN..." the way OpenAI reports such tokens. */
static cJSON *token_string(const char *t, size_t n) {
    if (pgd__utf8_valid(t, n)) return string_n(t, n);
    char buf[6 + 4 * 64 + 1];
    size_t k = 0;
    k += (size_t)snprintf(buf, sizeof buf, "bytes:");
    for (size_t i = 0; i < n && i < 64; i++)
        k += (size_t)snprintf(buf + k, sizeof buf - k, "\\x%02x", (unsigned char)t[i]);
    return cJSON_CreateString(buf);
}

static cJSON *bytes_array(const char *t, size_t n) {
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber((unsigned char)t[i]));
    return a;
}

void pgd_api_prompt_logprobs_add(cJSON **lp, int32_t id, const char *tok, size_t tok_len,
                                 float logprob, int32_t rank, int n_top, const int32_t *top_ids,
                                 const char *const *top_tok, const size_t *top_len,
                                 const float *top_lp) {
    if (!*lp) *lp = cJSON_CreateArray();
    if (n_top < 0) {
        cJSON_AddItemToArray(*lp, cJSON_CreateNull());
        return;
    }
    cJSON *e = cJSON_CreateObject();
    for (int i = -1; i < n_top; i++) { /* the token, then its alternatives (unless it is one) */
        int32_t t = i < 0 ? id : top_ids[i];
        char key[16];
        snprintf(key, sizeof key, "%d", (int)t);
        if (cJSON_GetObjectItemCaseSensitive(e, key)) continue;
        cJSON *x = cJSON_AddObjectToObject(e, key);
        cJSON_AddNumberToObject(x, "logprob", i < 0 ? logprob : top_lp[i]);
        cJSON_AddNumberToObject(x, "rank", i < 0 ? rank : i + 1);
        cJSON_AddItemToObject(x, "decoded_token", i < 0 ? token_string(tok, tok_len)
                                                        : token_string(top_tok[i], top_len[i]));
    }
    cJSON_AddItemToArray(*lp, e);
}

void pgd_api_logprobs_add(const pgd_api_request *r, cJSON **lp, const char *tok, size_t tok_len,
                          float logprob, int n_top, const char *const *top_tok,
                          const size_t *top_len, const float *top_lp, size_t text_offset) {
    if (!*lp) {
        *lp = cJSON_CreateObject();
        if (r->chat) {
            cJSON_AddArrayToObject(*lp, "content");
            cJSON_AddNullToObject(*lp, "refusal");
        } else {
            cJSON_AddArrayToObject(*lp, "tokens");
            cJSON_AddArrayToObject(*lp, "token_logprobs");
            cJSON_AddArrayToObject(*lp, "top_logprobs");
            cJSON_AddArrayToObject(*lp, "text_offset");
        }
    }
    if (r->chat) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddItemToObject(e, "token", token_string(tok, tok_len));
        cJSON_AddNumberToObject(e, "logprob", logprob);
        cJSON_AddItemToObject(e, "bytes", bytes_array(tok, tok_len));
        cJSON *tops = cJSON_AddArrayToObject(e, "top_logprobs");
        for (int i = 0; i < n_top; i++) {
            cJSON *t = cJSON_CreateObject();
            cJSON_AddItemToObject(t, "token", token_string(top_tok[i], top_len[i]));
            cJSON_AddNumberToObject(t, "logprob", top_lp[i]);
            cJSON_AddItemToObject(t, "bytes", bytes_array(top_tok[i], top_len[i]));
            cJSON_AddItemToArray(tops, t);
        }
        cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(*lp, "content"), e);
        return;
    }
    cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(*lp, "tokens"), token_string(tok, tok_len));
    cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(*lp, "token_logprobs"),
                         n_top < 0 ? cJSON_CreateNull() : cJSON_CreateNumber(logprob));
    cJSON *tops = n_top < 0 ? cJSON_CreateNull() : cJSON_CreateObject();
    for (int i = 0; i < n_top; i++) {
        cJSON *k = token_string(top_tok[i], top_len[i]);
        if (!cJSON_GetObjectItemCaseSensitive(tops, k->valuestring))
            cJSON_AddNumberToObject(tops, k->valuestring, top_lp[i]);
        cJSON_Delete(k);
    }
    cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(*lp, "top_logprobs"), tops);
    cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(*lp, "text_offset"),
                         cJSON_CreateNumber((double)text_offset));
}
