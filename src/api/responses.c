/* The OpenAI Responses API (POST /v1/responses) as a dialect of the chat path: a Responses body
 * (input items, instructions, function tools, text.format, previous_response_id) becomes an
 * OpenAI chat-completions request, and the chat answer (or its chunks) becomes a Response
 * object (or its event stream). Stored answers and their conversations live in resp_store.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api/responses.h"

/* The items of a response, in output order: a reasoning item when the answer thought, a
 * message when it has text or no calls, then one function_call per call. The stream opens them
 * in this order, so an item's output index (and id, which carries it) is the same in the
 * events, the final object and the stored one. */
typedef struct resp_state {
    pgd_dialect_env env;        /* copied; its strings are the server's (model) or ours (id) */
    char *id;                   /* "resp_..." (owned) */
    const char *hex;            /* id less "resp_": items are "msg_<hex>_<output index>" */
    cJSON *skel;                /* the response object less status, output and usage (owned) */
    cJSON *messages;            /* the chat messages the request ran, instructions aside */
    bool stream, store, background, cancelled, ended;
    bool running;               /* a background run has started */
    /* the answer, from the chat.completion or accumulated from the chunks */
    pgd_sbuf reasoning, content;
    cJSON *calls;               /* the chat tool_calls (owned), or NULL */
    char finish[24];            /* the chat finish_reason, "" until known */
    bool have_usage;
    double prompt_tokens, completion_tokens, cached_tokens, reasoning_tokens;
    /* streaming */
    int seq;                    /* the next event's sequence_number */
    int n_items;                /* output items opened so far */
    bool r_open, r_done, m_open, m_done;
} resp_state;

#define BAD(param, ...)                                                                          \
    do {                                                                                         \
        pgd_api_error_set(err, 400, "invalid_request_error", param, NULL, __VA_ARGS__);          \
        goto fail;                                                                               \
    } while (0)

static const cJSON *get(const cJSON *o, const char *k) {
    return cJSON_GetObjectItemCaseSensitive(o, k);
}

static bool unset(const cJSON *x) { return !x || cJSON_IsNull(x); }

static cJSON *dup_or_null(const cJSON *x) {
    return unset(x) ? cJSON_CreateNull() : cJSON_Duplicate(x, true);
}

/* ---- request ---- */

/* A message item's content (a string, or input_text/output_text parts) as one string. */
static cJSON *content_text(const cJSON *c, const char *param, pgd_api_error *err) {
    if (cJSON_IsString(c)) return cJSON_CreateString(c->valuestring);
    pgd_sbuf b = {0};
    if (!cJSON_IsArray(c)) BAD(param, "%s.content must be a string or an array of parts", param);
    const cJSON *part;
    int j = 0;
    cJSON_ArrayForEach(part, c) {
        const cJSON *ty = get(part, "type"), *tx = get(part, "text");
        if (!cJSON_IsString(ty))
            BAD(param, "%s.content[%d] must be an object with a string 'type'", param, j);
        if (strcmp(ty->valuestring, "input_text") && strcmp(ty->valuestring, "output_text"))
            BAD(param, "%s.content[%d]: '%.40s' parts are not supported (this model reads "
                "text only: input_text, output_text)", param, j, ty->valuestring);
        if (!cJSON_IsString(tx)) BAD(param, "%s.content[%d].text must be a string", param, j);
        pgd_sbuf_append(&b, tx->valuestring, strlen(tx->valuestring));
        j++;
    }
    cJSON *s = cJSON_CreateString(b.len ? b.data : "");
    pgd_sbuf_free(&b);
    return s;
fail:
    pgd_sbuf_free(&b);
    return NULL;
}

/* The last message of out when it is an assistant's that tool calls may join (no tool message
 * came after it), or NULL. */
static cJSON *open_assistant(cJSON *out) {
    cJSON *last = cJSON_GetArrayItem(out, cJSON_GetArraySize(out) - 1);
    const cJSON *role = get(last, "role");
    return cJSON_IsString(role) && !strcmp(role->valuestring, "assistant") ? last : NULL;
}

/* One input item -> chat messages appended to out. A function_call joins the assistant message
 * before it (the chat turn it came from: its text and calls); reasoning items are dropped, as
 * the chat templates drop an earlier turn's thinking. */
static int convert_item(const cJSON *it, int i, cJSON *out, pgd_api_error *err) {
    char param[32];
    snprintf(param, sizeof param, "input[%d]", i);
    if (!cJSON_IsObject(it)) BAD(param, "%s must be an object", param);
    const cJSON *ty = get(it, "type"), *role = get(it, "role");
    const char *t = cJSON_IsString(ty) ? ty->valuestring : NULL;
    if (!unset(ty) && !t) BAD(param, "%s.type must be a string", param);
    if (!t || !strcmp(t, "message")) {
        if (!cJSON_IsString(role))
            BAD(param, "%s must have a string 'role' (user, assistant, system or developer)",
                param);
        const char *r = role->valuestring;
        if (!strcmp(r, "developer")) r = "system";
        if (strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "system"))
            BAD(param, "%s.role must be user, assistant, system or developer", param);
        cJSON *c = content_text(get(it, "content"), param, err);
        if (!c) return -1;
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", r);
        cJSON_AddItemToObject(m, "content", c);
        cJSON_AddItemToArray(out, m);
        return 0;
    }
    if (!strcmp(t, "function_call")) {
        const cJSON *cid = get(it, "call_id"), *nm = get(it, "name"), *args = get(it, "arguments");
        if (!cJSON_IsString(cid) || !cJSON_IsString(nm) || !cJSON_IsString(args))
            BAD(param, "%s (a function_call) must have string 'call_id', 'name' and "
                "'arguments'", param);
        cJSON *m = open_assistant(out);
        if (!m) {
            m = cJSON_CreateObject();
            cJSON_AddStringToObject(m, "role", "assistant");
            cJSON_AddNullToObject(m, "content");
            cJSON_AddItemToArray(out, m);
        }
        cJSON *calls = (cJSON *)get(m, "tool_calls");
        if (!calls) calls = cJSON_AddArrayToObject(m, "tool_calls");
        cJSON *c = cJSON_CreateObject(), *fn = cJSON_CreateObject();
        cJSON_AddStringToObject(c, "id", cid->valuestring);
        cJSON_AddStringToObject(c, "type", "function");
        cJSON_AddStringToObject(fn, "name", nm->valuestring);
        cJSON_AddStringToObject(fn, "arguments", args->valuestring);
        cJSON_AddItemToObject(c, "function", fn);
        cJSON_AddItemToArray(calls, c);
        return 0;
    }
    if (!strcmp(t, "function_call_output")) {
        const cJSON *cid = get(it, "call_id"), *o = get(it, "output");
        if (!cJSON_IsString(cid))
            BAD(param, "%s (a function_call_output) must have a string 'call_id'", param);
        char op[48];
        snprintf(op, sizeof op, "%s.output", param);
        cJSON *c = content_text(o, op, err);
        if (!c) return -1;
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "tool");
        cJSON_AddStringToObject(m, "tool_call_id", cid->valuestring);
        cJSON_AddItemToObject(m, "content", c);
        cJSON_AddItemToArray(out, m);
        return 0;
    }
    if (!strcmp(t, "reasoning")) return 0;
    BAD(param, "%s: '%.40s' items are not supported (message, function_call, "
        "function_call_output and reasoning are)", param, t);
fail:
    return -1;
}

/* tools[] -> the chat's tools (into chat) and the echoed list (into echo). */
static int convert_tools(const cJSON *tools, cJSON *chat, cJSON *echo, pgd_api_error *err) {
    if (!cJSON_IsArray(tools)) BAD("tools", "'tools' must be an array");
    if (cJSON_GetArraySize(tools) == 0) return 0; /* (the agents SDK sends []: no tools) */
    cJSON *ct = cJSON_CreateArray();
    cJSON_AddItemToObject(chat, "tools", ct);
    const cJSON *t;
    int i = 0;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *ty = get(t, "type"), *nm = get(t, "name"), *d = get(t, "description");
        const cJSON *p = get(t, "parameters"), *s = get(t, "strict");
        if (!cJSON_IsObject(t) || !cJSON_IsString(ty))
            BAD("tools", "tools[%d] must be an object with a string 'type'", i);
        if (strcmp(ty->valuestring, "function"))
            BAD("tools", "tools[%d]: '%.40s' tools are not supported (this server runs function "
                "tools only)", i, ty->valuestring);
        if (!cJSON_IsString(nm)) BAD("tools", "tools[%d].name must be a string", i);
        if (!unset(d) && !cJSON_IsString(d))
            BAD("tools", "tools[%d].description must be a string", i);
        if (!unset(p) && !cJSON_IsObject(p))
            BAD("tools", "tools[%d].parameters must be an object", i);
        if (!unset(s) && !cJSON_IsBool(s)) BAD("tools", "tools[%d].strict must be a boolean", i);
        cJSON *c = cJSON_CreateObject();
        cJSON_AddStringToObject(c, "type", "function");
        cJSON *fn = cJSON_AddObjectToObject(c, "function");
        cJSON_AddStringToObject(fn, "name", nm->valuestring);
        if (!unset(d)) cJSON_AddStringToObject(fn, "description", d->valuestring);
        if (!unset(p)) cJSON_AddItemToObject(fn, "parameters", cJSON_Duplicate(p, true));
        if (!unset(s)) cJSON_AddBoolToObject(fn, "strict", cJSON_IsTrue(s));
        cJSON_AddItemToArray(ct, c);
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "type", "function");
        cJSON_AddStringToObject(e, "name", nm->valuestring);
        cJSON_AddItemToObject(e, "description", dup_or_null(d));
        cJSON_AddItemToObject(e, "parameters", dup_or_null(p));
        cJSON_AddItemToObject(e, "strict", dup_or_null(s));
        cJSON_AddItemToArray(echo, e);
        i++;
    }
    return 0;
fail:
    return -1;
}

static int convert_tool_choice(const cJSON *x, cJSON *chat, pgd_api_error *err) {
    if (cJSON_IsString(x)) {
        const char *s = x->valuestring;
        if (strcmp(s, "auto") && strcmp(s, "none") && strcmp(s, "required"))
            BAD("tool_choice", "'tool_choice' must be 'auto', 'none', 'required' or "
                "{\"type\": \"function\", \"name\": ...}");
        cJSON_AddStringToObject(chat, "tool_choice", s);
        return 0;
    }
    const cJSON *ty = get(x, "type"), *nm = get(x, "name");
    if (!cJSON_IsObject(x) || !cJSON_IsString(ty))
        BAD("tool_choice", "'tool_choice' must be a string or an object with a string 'type'");
    if (strcmp(ty->valuestring, "function"))
        BAD("tool_choice", "'tool_choice' of type '%.40s' is not supported (this server runs "
            "function tools only)", ty->valuestring);
    if (!cJSON_IsString(nm)) BAD("tool_choice", "'tool_choice.name' must be a string");
    cJSON *c = cJSON_AddObjectToObject(chat, "tool_choice");
    cJSON_AddStringToObject(c, "type", "function");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(c, "function"), "name", nm->valuestring);
    return 0;
fail:
    return -1;
}

/* text.format -> response_format; the echoed "text" gets the format with its defaults. */
static int convert_text(const cJSON *x, cJSON *chat, cJSON *echo, pgd_api_error *err) {
    if (!cJSON_IsObject(x)) BAD("text", "'text' must be an object");
    const cJSON *f = get(x, "format"), *v = get(x, "verbosity");
    if (!unset(v)) cJSON_AddItemToObject(echo, "verbosity", cJSON_Duplicate(v, true));
    if (unset(f)) return 0;
    const cJSON *ty = get(f, "type");
    if (!cJSON_IsObject(f) || !cJSON_IsString(ty))
        BAD("text.format", "'text.format' must be an object with a string 'type'");
    const char *t = ty->valuestring;
    cJSON *ef = cJSON_CreateObject();
    cJSON_ReplaceItemInObjectCaseSensitive(echo, "format", ef);
    cJSON_AddStringToObject(ef, "type", t);
    if (!strcmp(t, "text")) return 0;
    if (!strcmp(t, "json_object")) {
        cJSON_AddStringToObject(cJSON_AddObjectToObject(chat, "response_format"), "type",
                                "json_object");
        return 0;
    }
    if (strcmp(t, "json_schema"))
        BAD("text.format", "'text.format.type' must be 'text', 'json_schema' or 'json_object'");
    const cJSON *nm = get(f, "name"), *sch = get(f, "schema"), *st = get(f, "strict");
    const cJSON *d = get(f, "description");
    if (!cJSON_IsString(nm)) BAD("text.format", "'text.format.name' must be a string");
    if (!cJSON_IsObject(sch)) BAD("text.format", "'text.format.schema' must be an object");
    if (!unset(st) && !cJSON_IsBool(st))
        BAD("text.format", "'text.format.strict' must be a boolean");
    if (!unset(d) && !cJSON_IsString(d))
        BAD("text.format", "'text.format.description' must be a string");
    cJSON *rf = cJSON_AddObjectToObject(chat, "response_format");
    cJSON_AddStringToObject(rf, "type", "json_schema");
    cJSON *js = cJSON_AddObjectToObject(rf, "json_schema");
    cJSON_AddStringToObject(js, "name", nm->valuestring);
    cJSON_AddItemToObject(js, "schema", cJSON_Duplicate(sch, true));
    if (!unset(st)) cJSON_AddBoolToObject(js, "strict", cJSON_IsTrue(st));
    if (!unset(d)) {
        cJSON_AddStringToObject(js, "description", d->valuestring);
        cJSON_AddStringToObject(ef, "description", d->valuestring);
    }
    cJSON_AddStringToObject(ef, "name", nm->valuestring);
    cJSON_AddItemToObject(ef, "schema", cJSON_Duplicate(sch, true));
    cJSON_AddBoolToObject(ef, "strict", cJSON_IsTrue(st));
    return 0;
fail:
    return -1;
}

static int get_bool(const cJSON *o, const char *k, bool *out, pgd_api_error *err) {
    const cJSON *x = get(o, k);
    if (unset(x)) return 0;
    if (!cJSON_IsBool(x)) BAD(k, "'%s' must be a boolean", k);
    *out = cJSON_IsTrue(x);
    return 0;
fail:
    return -1;
}

/* A number parameter passed to the chat as chat_key (its range is checked there, under the
 * same name for temperature and top_p); echoed as given or def. */
static int pass_number(const cJSON *o, const char *k, const char *chat_key, bool integer,
                       const double *def, cJSON *chat, cJSON *skel, pgd_api_error *err) {
    const cJSON *x = get(o, k);
    if (unset(x)) {
        if (def) cJSON_AddNumberToObject(skel, k, *def);
        else cJSON_AddNullToObject(skel, k);
        return 0;
    }
    if (!cJSON_IsNumber(x) || (integer && x->valuedouble != (double)(long long)x->valuedouble))
        BAD(k, "'%s' must be %s", k, integer ? "an integer" : "a number");
    if (integer && x->valuedouble < 1) BAD(k, "'%s' must be at least 1", k);
    cJSON_AddNumberToObject(chat, chat_key, x->valuedouble);
    cJSON_AddNumberToObject(skel, k, x->valuedouble);
    return 0;
fail:
    return -1;
}

static int check_metadata(const cJSON *m, pgd_api_error *err) {
    if (!cJSON_IsObject(m)) BAD("metadata", "'metadata' must be an object of strings");
    const cJSON *x;
    int n = 0;
    cJSON_ArrayForEach(x, m) {
        if (++n > 16) BAD("metadata", "'metadata' holds at most 16 keys");
        if (strlen(x->string) > 64) BAD("metadata", "'metadata' keys are at most 64 characters");
        if (!cJSON_IsString(x) || strlen(x->valuestring) > 512)
            BAD("metadata", "'metadata' values must be strings of at most 512 characters");
    }
    return 0;
fail:
    return -1;
}

static void state_free(void *p) {
    resp_state *st = p;
    if (!st) return;
    free(st->id);
    cJSON_Delete(st->skel);
    cJSON_Delete(st->messages);
    cJSON_Delete(st->calls);
    pgd_sbuf_free(&st->reasoning);
    pgd_sbuf_free(&st->content);
    free(st);
}

/* Parameters refused because nothing here can honour them (built-in state and prompts). */
static const char *const refused[] = {"conversation", "prompt"};

static int begin(const pgd_dialect_env *env, const char *body, size_t len, cJSON **chat_out,
                 void **state, pgd_api_error *err) {
    cJSON *o = pgd_api_json_parse(body, len), *chat = NULL;
    resp_state *st = NULL;
    if (!cJSON_IsObject(o)) {
        pgd_api_error_set(err, 400, "invalid_request_error", NULL, "invalid_json",
                          "the body must be a JSON object");
        goto fail;
    }
    if (pgd_api_json_unique_keys(o, err)) goto fail;
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++)
        if (!unset(get(o, refused[i])))
            BAD(refused[i], "'%s' is not supported by this server", refused[i]);
    const cJSON *tl = get(o, "top_logprobs");
    if (!unset(tl) && !(cJSON_IsNumber(tl) && tl->valuedouble == 0))
        BAD("top_logprobs", "'top_logprobs' is not supported by this server's Responses API");
    st = calloc(1, sizeof *st);
    chat = cJSON_CreateObject();
    if (!st || !chat || !(st->id = strdup(env->request_id))) goto oom;
    st->env = *env;
    st->env.request_id = st->id;
    st->hex = strncmp(st->id, "resp_", 5) ? st->id : st->id + 5;
    st->store = true;
    if (get_bool(o, "stream", &st->stream, err) || get_bool(o, "store", &st->store, err) ||
        get_bool(o, "background", &st->background, err))
        goto fail;
    if (st->background && !st->store)
        BAD("background", "'background': true needs 'store': true (the answer is fetched from "
            "the store)");
    if (st->background && !env->store)
        BAD("background", "'background' needs the response store, which this server has "
            "turned off (--responses-store-size 0)");
    if (st->background && st->stream)
        BAD("stream", "'stream' cannot be combined with 'background' on this server: fetch the "
            "answer with GET /v1/responses/{id}");
    bool stored = st->store && env->store;

    const cJSON *model = get(o, "model");
    if (!unset(model) && !cJSON_IsString(model)) BAD("model", "'model' must be a string");
    if (cJSON_IsString(model)) cJSON_AddStringToObject(chat, "model", model->valuestring);

    /* the conversation: instructions (not stored), the previous response's, the input's */
    cJSON *msgs = cJSON_AddArrayToObject(chat, "messages");
    const cJSON *ins = get(o, "instructions");
    if (!unset(ins) && !cJSON_IsString(ins)) BAD("instructions", "'instructions' must be a string");
    if (!(st->messages = cJSON_CreateArray())) goto oom;
    const cJSON *prev = get(o, "previous_response_id");
    if (!unset(prev)) {
        if (!cJSON_IsString(prev)) BAD("previous_response_id", "'previous_response_id' must be a "
                                       "string");
        const cJSON *pm = NULL;
        if (!env->store || !pgd_resp_store_get(env->store, prev->valuestring)) {
            pgd_api_error_set(err, 404, "invalid_request_error", "previous_response_id",
                              "previous_response_not_found",
                              "Previous response with id '%.100s' not found.", prev->valuestring);
            goto fail;
        }
        pm = pgd_resp_store_messages(env->store, prev->valuestring);
        const cJSON *m;
        cJSON_ArrayForEach(m, pm) cJSON_AddItemToArray(st->messages, cJSON_Duplicate(m, true));
    }
    const cJSON *in = get(o, "input");
    if (cJSON_IsString(in)) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "user");
        cJSON_AddStringToObject(m, "content", in->valuestring);
        cJSON_AddItemToArray(st->messages, m);
    } else if (cJSON_IsArray(in) && cJSON_GetArraySize(in) > 0) {
        const cJSON *it;
        int i = 0;
        cJSON_ArrayForEach(it, in) if (convert_item(it, i++, st->messages, err)) goto fail;
    } else {
        BAD("input", "'input' must be a string or a non-empty array of input items");
    }
    if (cJSON_GetArraySize(st->messages) == 0)
        BAD("input", "'input' holds no message (reasoning items alone are dropped)");
    if (cJSON_IsString(ins)) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "system");
        cJSON_AddStringToObject(m, "content", ins->valuestring);
        cJSON_AddItemToArray(msgs, m);
    }
    const cJSON *m;
    cJSON_ArrayForEach(m, st->messages) cJSON_AddItemToArray(msgs, cJSON_Duplicate(m, true));

    /* the echoed object, in OpenAI's key order; status, output and usage are set per answer */
    static const double one = 1.0;
    cJSON *sk = st->skel = cJSON_CreateObject();
    if (!sk) goto oom;
    cJSON_AddStringToObject(sk, "id", st->id);
    cJSON_AddStringToObject(sk, "object", "response");
    cJSON_AddNumberToObject(sk, "created_at", (double)env->created);
    cJSON_AddStringToObject(sk, "status", "in_progress");
    cJSON_AddBoolToObject(sk, "background", st->background);
    cJSON_AddNullToObject(sk, "completed_at");
    cJSON_AddNullToObject(sk, "error");
    cJSON_AddNullToObject(sk, "incomplete_details");
    cJSON_AddItemToObject(sk, "instructions", dup_or_null(ins));
    if (pass_number(o, "max_output_tokens", "max_tokens", true, NULL, chat, sk, err))
        goto fail;
    const cJSON *mtc = get(o, "max_tool_calls");
    if (!unset(mtc) && !cJSON_IsNumber(mtc))
        BAD("max_tool_calls", "'max_tool_calls' must be an integer");
    cJSON_AddItemToObject(sk, "max_tool_calls", dup_or_null(mtc));
    cJSON_AddStringToObject(sk, "model", cJSON_IsString(model) && model->valuestring[0]
                                             ? model->valuestring : env->model);
    cJSON_AddArrayToObject(sk, "output");
    bool ptc = true;
    if (get_bool(o, "parallel_tool_calls", &ptc, err)) goto fail;
    if (!unset(get(o, "parallel_tool_calls"))) cJSON_AddBoolToObject(chat, "parallel_tool_calls",
                                                                     ptc);
    cJSON_AddBoolToObject(sk, "parallel_tool_calls", ptc);
    cJSON_AddItemToObject(sk, "previous_response_id", dup_or_null(prev));
    const cJSON *rs = get(o, "reasoning");
    if (!unset(rs) && !cJSON_IsObject(rs)) BAD("reasoning", "'reasoning' must be an object");
    cJSON *er = cJSON_AddObjectToObject(sk, "reasoning");
    cJSON_AddItemToObject(er, "effort", dup_or_null(get(rs, "effort")));
    cJSON_AddItemToObject(er, "summary", dup_or_null(get(rs, "summary")));
    cJSON_AddBoolToObject(sk, "store", stored);
    if (pass_number(o, "temperature", "temperature", false, &one, chat, sk, err)) goto fail;
    cJSON *text = cJSON_AddObjectToObject(sk, "text");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(text, "format"), "type", "text");
    if (!unset(get(o, "text")) && convert_text(get(o, "text"), chat, text, err)) goto fail;
    const cJSON *tc = get(o, "tool_choice");
    if (!unset(tc) && convert_tool_choice(tc, chat, err)) goto fail;
    cJSON_AddItemToObject(sk, "tool_choice", unset(tc) ? cJSON_CreateString("auto")
                                                       : cJSON_Duplicate(tc, true));
    cJSON *tools = cJSON_AddArrayToObject(sk, "tools");
    if (!unset(get(o, "tools")) && convert_tools(get(o, "tools"), chat, tools, err)) goto fail;
    cJSON_AddNumberToObject(sk, "top_logprobs", 0);
    if (pass_number(o, "top_p", "top_p", false, &one, chat, sk, err)) goto fail;
    const cJSON *tr = get(o, "truncation");
    if (!unset(tr) && !(cJSON_IsString(tr) && (!strcmp(tr->valuestring, "auto") ||
                                               !strcmp(tr->valuestring, "disabled"))))
        BAD("truncation", "'truncation' must be 'auto' or 'disabled'");
    cJSON_AddStringToObject(sk, "truncation", cJSON_IsString(tr) ? tr->valuestring : "disabled");
    const cJSON *user = get(o, "user");
    if (!unset(user) && !cJSON_IsString(user)) BAD("user", "'user' must be a string");
    if (cJSON_IsString(user)) cJSON_AddStringToObject(sk, "user", user->valuestring);
    const cJSON *md = get(o, "metadata");
    if (!unset(md) && check_metadata(md, err)) goto fail;
    cJSON_AddItemToObject(sk, "metadata", unset(md) ? cJSON_CreateObject()
                                                    : cJSON_Duplicate(md, true));
    const cJSON *inc = get(o, "include");
    if (!unset(inc) && !cJSON_IsArray(inc)) BAD("include", "'include' must be an array");
    if (st->stream) cJSON_AddBoolToObject(chat, "stream", true);
    cJSON_Delete(o);
    *chat_out = chat;
    *state = st;
    return 0;
oom:
    pgd_api_error_set(err, 500, "server_error", NULL, NULL, "out of memory");
fail:
    cJSON_Delete(o);
    cJSON_Delete(chat);
    state_free(st);
    return -1;
}

/* ---- answer ---- */

static void item_id(const resp_state *st, const char *prefix, int index, char *out, size_t n) {
    snprintf(out, n, "%s_%s_%d", prefix, st->hex, index);
}

/* An output item's object with its id (prefix, index) and type. */
static cJSON *item_new(const resp_state *st, const char *prefix, int index, const char *type) {
    char id[160];
    item_id(st, prefix, index, id, sizeof id);
    cJSON *it = cJSON_CreateObject();
    cJSON_AddStringToObject(it, "id", id);
    cJSON_AddStringToObject(it, "type", type);
    return it;
}

static cJSON *reasoning_item(const resp_state *st, int index, const char *status, bool whole) {
    cJSON *it = item_new(st, "rs", index, "reasoning");
    cJSON_AddArrayToObject(it, "summary");
    cJSON *c = cJSON_AddArrayToObject(it, "content");
    if (whole) {
        cJSON *p = cJSON_CreateObject();
        cJSON_AddStringToObject(p, "type", "reasoning_text");
        cJSON_AddStringToObject(p, "text", st->reasoning.len ? st->reasoning.data : "");
        cJSON_AddItemToArray(c, p);
    }
    cJSON_AddStringToObject(it, "status", status);
    return it;
}

static cJSON *text_part(const char *text) {
    cJSON *p = cJSON_CreateObject();
    cJSON_AddStringToObject(p, "type", "output_text");
    cJSON_AddStringToObject(p, "text", text);
    cJSON_AddArrayToObject(p, "annotations");
    cJSON_AddArrayToObject(p, "logprobs");
    return p;
}

static cJSON *message_item(const resp_state *st, int index, const char *status, bool whole) {
    cJSON *it = item_new(st, "msg", index, "message");
    cJSON_AddStringToObject(it, "status", status);
    cJSON_AddStringToObject(it, "role", "assistant");
    cJSON *c = cJSON_AddArrayToObject(it, "content");
    if (whole) cJSON_AddItemToArray(c, text_part(st->content.len ? st->content.data : ""));
    return it;
}

/* A chat tool call as a function_call item (arguments "" while it is being added). */
static cJSON *call_item(const resp_state *st, int index, const cJSON *call, const char *status,
                        bool whole) {
    char id[160];
    item_id(st, "fc", index, id, sizeof id);
    const cJSON *fn = get(call, "function"), *cid = get(call, "id");
    const cJSON *nm = get(fn, "name"), *args = get(fn, "arguments");
    cJSON *it = cJSON_CreateObject();
    cJSON_AddStringToObject(it, "id", id);
    cJSON_AddStringToObject(it, "type", "function_call");
    cJSON_AddStringToObject(it, "status", status);
    cJSON_AddStringToObject(it, "arguments", whole && cJSON_IsString(args) ? args->valuestring
                                                                           : "");
    cJSON_AddStringToObject(it, "call_id", cJSON_IsString(cid) ? cid->valuestring : id);
    cJSON_AddStringToObject(it, "name", cJSON_IsString(nm) ? nm->valuestring : "");
    return it;
}

static bool cut(const resp_state *st) { return !strcmp(st->finish, "length"); }

/* Which items the answer has (the order of the comment at the top). */
static bool has_reasoning(const resp_state *st) { return st->reasoning.len > 0; }
static bool has_message(const resp_state *st) {
    return st->content.len > 0 || cJSON_GetArraySize(st->calls) == 0;
}

/* An item the answer was still writing when it was cut (max_output_tokens), cancelled or
 * failed is "incomplete". */
static const char *reasoning_status(const resp_state *st) {
    if (st->content.len || cJSON_GetArraySize(st->calls)) return "completed"; /* it ended */
    return !st->finish[0] || st->cancelled || cut(st) ? "incomplete" : "completed";
}

static const char *message_status(const resp_state *st) {
    return !st->finish[0] || st->cancelled || cut(st) ? "incomplete" : "completed";
}

static cJSON *build_output(const resp_state *st) {
    cJSON *out = cJSON_CreateArray();
    int k = 0;
    if (has_reasoning(st)) cJSON_AddItemToArray(out, reasoning_item(st, k++, reasoning_status(st),
                                                                    true));
    if (has_message(st)) cJSON_AddItemToArray(out, message_item(st, k++, message_status(st), true));
    const cJSON *c;
    cJSON_ArrayForEach(c, st->calls) cJSON_AddItemToArray(out, call_item(st, k++, c, "completed",
                                                                          true));
    return out;
}

static cJSON *usage_obj(const resp_state *st) {
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "input_tokens", st->prompt_tokens);
    cJSON *d = cJSON_AddObjectToObject(u, "input_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", st->cached_tokens);
    cJSON_AddNumberToObject(d, "cache_write_tokens", 0);
    cJSON_AddNumberToObject(u, "output_tokens", st->completion_tokens);
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "output_tokens_details"),
                            "reasoning_tokens", st->reasoning_tokens);
    cJSON_AddNumberToObject(u, "total_tokens", st->prompt_tokens + st->completion_tokens);
    return u;
}

/* The response object as it stands: status, and (final) the output, usage and outcome. */
static cJSON *response_obj(const resp_state *st, const char *status, bool final,
                           const pgd_api_error *e) {
    cJSON *r = cJSON_Duplicate(st->skel, true);
    if (!r) return NULL;
    cJSON_ReplaceItemInObjectCaseSensitive(r, "status", cJSON_CreateString(status));
    if (!strcmp(status, "completed"))
        cJSON_ReplaceItemInObjectCaseSensitive(r, "completed_at",
                                               cJSON_CreateNumber((double)time(NULL)));
    if (e) {
        cJSON *er = cJSON_CreateObject();
        cJSON_AddStringToObject(er, "code", "server_error");
        cJSON_AddStringToObject(er, "message", e->message);
        cJSON_ReplaceItemInObjectCaseSensitive(r, "error", er);
    }
    if (!strcmp(status, "incomplete")) {
        cJSON *d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "reason", "max_output_tokens");
        cJSON_ReplaceItemInObjectCaseSensitive(r, "incomplete_details", d);
    }
    if (final) {
        cJSON_ReplaceItemInObjectCaseSensitive(r, "output", build_output(st));
        if (st->have_usage) cJSON_AddItemToObject(r, "usage", usage_obj(st));
    }
    return r;
}

static const char *final_status(const resp_state *st) {
    return st->cancelled ? "cancelled" : cut(st) ? "incomplete" : "completed";
}

/* The conversation this response continues: the request's messages and the answer. */
static cJSON *conversation(const resp_state *st) {
    cJSON *msgs = cJSON_Duplicate(st->messages, true);
    if (!msgs) return NULL;
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", "assistant");
    bool calls = cJSON_GetArraySize(st->calls) > 0;
    if (st->content.len || !calls)
        cJSON_AddStringToObject(m, "content", st->content.len ? st->content.data : "");
    else cJSON_AddNullToObject(m, "content");
    if (calls) {
        cJSON *c = cJSON_Duplicate(st->calls, true), *x;
        cJSON_ArrayForEach(x, c) cJSON_DeleteItemFromObjectCaseSensitive(x, "index");
        cJSON_AddItemToObject(m, "tool_calls", c);
    }
    cJSON_AddItemToArray(msgs, m);
    return msgs;
}

/* With store on: r (borrowed) into the store, with messages (taken; NULL keeps the entry's). A
 * full store evicts older entries; an answer larger than the whole store is not kept. */
static void store_put(const resp_state *st, const cJSON *r, cJSON *messages) {
    if (st->store && st->env.store && r)
        pgd_resp_store_put(st->env.store, st->id, r, messages);
    cJSON_Delete(messages);
}

static void set_usage(resp_state *st, const cJSON *u) {
    const cJSON *pt = get(u, "prompt_tokens"), *ct = get(u, "completion_tokens");
    const cJSON *cached = get(get(u, "prompt_tokens_details"), "cached_tokens");
    const cJSON *rt = get(get(u, "completion_tokens_details"), "reasoning_tokens");
    if (!cJSON_IsObject(u)) return;
    st->have_usage = true;
    st->prompt_tokens = cJSON_IsNumber(pt) ? pt->valuedouble : 0;
    st->completion_tokens = cJSON_IsNumber(ct) ? ct->valuedouble : 0;
    st->cached_tokens = cJSON_IsNumber(cached) ? cached->valuedouble : 0;
    st->reasoning_tokens = cJSON_IsNumber(rt) ? rt->valuedouble : 0;
}

static void set_finish(resp_state *st, const cJSON *f) {
    if (cJSON_IsString(f)) snprintf(st->finish, sizeof st->finish, "%s", f->valuestring);
}

static char *finish_and_print(resp_state *st, const char *status, const pgd_api_error *e) {
    cJSON *r = response_obj(st, status, true, e);
    store_put(st, r, conversation(st));
    char *js = r ? cJSON_PrintUnformatted(r) : NULL;
    cJSON_Delete(r);
    return js;
}

static char *complete(void *state, const cJSON *completion) {
    resp_state *st = state;
    const cJSON *ch = cJSON_GetArrayItem(get(completion, "choices"), 0);
    const cJSON *msg = get(ch, "message");
    const cJSON *c = get(msg, "content"), *r = get(msg, "reasoning_content");
    const cJSON *calls = get(msg, "tool_calls");
    if (cJSON_IsString(r)) pgd_sbuf_append(&st->reasoning, r->valuestring, strlen(r->valuestring));
    if (cJSON_IsString(c)) pgd_sbuf_append(&st->content, c->valuestring, strlen(c->valuestring));
    if (cJSON_IsArray(calls) && cJSON_GetArraySize(calls) > 0)
        st->calls = cJSON_Duplicate(calls, true);
    set_finish(st, get(ch, "finish_reason"));
    set_usage(st, get(completion, "usage"));
    st->ended = true;
    return finish_and_print(st, final_status(st), NULL);
}

/* ---- stream ---- */

static cJSON *ev_new(resp_state *st, const char *type) {
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "type", type);
    cJSON_AddNumberToObject(e, "sequence_number", st->seq++);
    return e;
}

static void ev_send(pgd_sbuf *out, cJSON *e) {
    const cJSON *ty = get(e, "type");
    pgd_sbuf_sse_event(out, ty->valuestring, e);
    cJSON_Delete(e);
}

/* An event about output item index (its id, output index and content index 0). */
static cJSON *ev_item(resp_state *st, const char *type, const char *prefix, int index) {
    char id[160];
    item_id(st, prefix, index, id, sizeof id);
    cJSON *e = ev_new(st, type);
    cJSON_AddStringToObject(e, "item_id", id);
    cJSON_AddNumberToObject(e, "output_index", index);
    cJSON_AddNumberToObject(e, "content_index", 0);
    return e;
}

static void ev_item_added(resp_state *st, pgd_sbuf *out, const char *type, cJSON *item,
                          int index) {
    cJSON *e = ev_new(st, type);
    cJSON_AddNumberToObject(e, "output_index", index);
    cJSON_AddItemToObject(e, "item", item);
    ev_send(out, e);
}

static cJSON *reasoning_part(const char *text) {
    cJSON *p = cJSON_CreateObject();
    cJSON_AddStringToObject(p, "type", "reasoning_text");
    cJSON_AddStringToObject(p, "text", text);
    return p;
}

static void stream_start(void *state, pgd_sbuf *out) {
    resp_state *st = state;
    static const char *const types[] = {"response.created", "response.in_progress"};
    for (int i = 0; i < 2; i++) {
        cJSON *e = ev_new(st, types[i]);
        cJSON_AddItemToObject(e, "response", response_obj(st, "in_progress", false, NULL));
        ev_send(out, e);
    }
}

/* Output item k (item: a reasoning or a message, kind "rs" or "msg") added, with its first,
 * empty part. */
static void open_item(resp_state *st, pgd_sbuf *out, cJSON *item, const char *kind, int k,
                      cJSON *part) {
    ev_item_added(st, out, "response.output_item.added", item, k);
    cJSON *e = ev_item(st, "response.content_part.added", kind, k);
    cJSON_AddItemToObject(e, "part", part);
    ev_send(out, e);
}

static void open_reasoning(resp_state *st, pgd_sbuf *out) {
    int k = st->n_items++;
    st->r_open = true;
    open_item(st, out, reasoning_item(st, k, "in_progress", false), "rs", k, reasoning_part(""));
}

/* next: the content or a call begins (the reasoning has ended), else the answer has. */
static void close_reasoning(resp_state *st, pgd_sbuf *out, bool next) {
    if (!st->r_open) return;
    const char *text = st->reasoning.len ? st->reasoning.data : "";
    st->r_open = false;
    st->r_done = true;
    cJSON *e = ev_item(st, "response.reasoning_text.done", "rs", 0);
    cJSON_AddStringToObject(e, "text", text);
    ev_send(out, e);
    e = ev_item(st, "response.content_part.done", "rs", 0);
    cJSON_AddItemToObject(e, "part", reasoning_part(text));
    ev_send(out, e);
    ev_item_added(st, out, "response.output_item.done", reasoning_item(st, 0, next ? "completed"
                                                                           : reasoning_status(st),
                                                                      true), 0);
}

static int message_index(const resp_state *st) { return st->r_done || st->r_open ? 1 : 0; }

static void open_message(resp_state *st, pgd_sbuf *out, bool next) {
    close_reasoning(st, out, next);
    int k = st->n_items++;
    st->m_open = true;
    open_item(st, out, message_item(st, k, "in_progress", false), "msg", k, text_part(""));
}

static void close_message(resp_state *st, pgd_sbuf *out) {
    if (!st->m_open) return;
    int k = message_index(st);
    const char *text = st->content.len ? st->content.data : "";
    st->m_open = false;
    st->m_done = true;
    cJSON *e = ev_item(st, "response.output_text.done", "msg", k);
    cJSON_AddStringToObject(e, "text", text);
    cJSON_AddArrayToObject(e, "logprobs");
    ev_send(out, e);
    e = ev_item(st, "response.content_part.done", "msg", k);
    cJSON_AddItemToObject(e, "part", text_part(text));
    ev_send(out, e);
    ev_item_added(st, out, "response.output_item.done", message_item(st, k, message_status(st),
                                                                    true), k);
}

static void reasoning_delta(resp_state *st, const char *d, pgd_sbuf *out) {
    size_t n = strlen(d);
    /* the reasoning comes before any content or call (pgd_reasoning_scan's order): the item
     * opened first, at output index 0 */
    if (!n || st->r_done || st->m_open || st->m_done || st->calls) return;
    if (!st->r_open) open_reasoning(st, out);
    pgd_sbuf_append(&st->reasoning, d, n);
    cJSON *e = ev_item(st, "response.reasoning_text.delta", "rs", 0);
    cJSON_AddStringToObject(e, "delta", d);
    ev_send(out, e);
}

static void content_delta(resp_state *st, const char *d, pgd_sbuf *out) {
    size_t n = strlen(d);
    if (!n || st->m_done || st->calls) return; /* (calls come last: content cannot follow) */
    if (!st->m_open) open_message(st, out, true);
    pgd_sbuf_append(&st->content, d, n);
    cJSON *e = ev_item(st, "response.output_text.delta", "msg", message_index(st));
    cJSON_AddStringToObject(e, "delta", d);
    cJSON_AddArrayToObject(e, "logprobs");
    ev_send(out, e);
}

/* Whole calls (the chat stream sends them at the end): each one's item and arguments. */
static void calls_delta(resp_state *st, const cJSON *calls, pgd_sbuf *out) {
    close_reasoning(st, out, true);
    close_message(st, out);
    if (!st->calls && !(st->calls = cJSON_CreateArray())) return;
    const cJSON *c;
    cJSON_ArrayForEach(c, calls) {
        int k = st->n_items++;
        cJSON_AddItemToArray(st->calls, cJSON_Duplicate(c, true));
        ev_item_added(st, out, "response.output_item.added", call_item(st, k, c, "in_progress",
                                                                      false), k);
        const cJSON *fn = get(c, "function"), *args = get(fn, "arguments"), *nm = get(fn, "name");
        const char *a = cJSON_IsString(args) ? args->valuestring : "";
        char id[160];
        item_id(st, "fc", k, id, sizeof id);
        cJSON *e = ev_new(st, "response.function_call_arguments.delta");
        cJSON_AddStringToObject(e, "item_id", id);
        cJSON_AddNumberToObject(e, "output_index", k);
        cJSON_AddStringToObject(e, "delta", a);
        ev_send(out, e);
        e = ev_new(st, "response.function_call_arguments.done");
        cJSON_AddStringToObject(e, "item_id", id);
        cJSON_AddNumberToObject(e, "output_index", k);
        cJSON_AddStringToObject(e, "name", cJSON_IsString(nm) ? nm->valuestring : "");
        cJSON_AddStringToObject(e, "arguments", a);
        ev_send(out, e);
        ev_item_added(st, out, "response.output_item.done", call_item(st, k, c, "completed", true),
                      k);
    }
}

static void stream_chunk(void *state, const cJSON *chunk, pgd_sbuf *out) {
    resp_state *st = state;
    if (st->ended) return;
    const cJSON *u = get(chunk, "usage");
    if (cJSON_IsObject(u)) set_usage(st, u);
    const cJSON *ch = cJSON_GetArrayItem(get(chunk, "choices"), 0);
    if (!ch) return;
    set_finish(st, get(ch, "finish_reason")); /* first: a call's chunk carries it */
    const cJSON *d = get(ch, "delta");
    const cJSON *r = get(d, "reasoning_content"), *c = get(d, "content"), *tc = get(d, "tool_calls");
    if (cJSON_IsString(r)) reasoning_delta(st, r->valuestring, out);
    if (cJSON_IsString(c)) content_delta(st, c->valuestring, out);
    if (cJSON_IsArray(tc) && cJSON_GetArraySize(tc) > 0) calls_delta(st, tc, out);
}

static void stream_end(void *state, pgd_sbuf *out) {
    resp_state *st = state;
    if (st->ended) return;
    close_reasoning(st, out, false);
    if (has_message(st) && !st->m_done && !st->m_open) open_message(st, out, false);
    close_message(st, out);
    st->ended = true;
    const char *status = final_status(st);
    cJSON *r = response_obj(st, status, true, NULL);
    store_put(st, r, conversation(st));
    cJSON *e = ev_new(st, !strcmp(status, "completed")    ? "response.completed"
                          : !strcmp(status, "incomplete") ? "response.incomplete"
                                                          : "response.failed");
    cJSON_AddItemToObject(e, "response", r);
    ev_send(out, e);
}

static void stream_error(void *state, const pgd_api_error *err, pgd_sbuf *out) {
    resp_state *st = state;
    if (st->ended) return;
    st->ended = true;
    cJSON *r = response_obj(st, st->cancelled ? "cancelled" : "failed", true,
                            st->cancelled ? NULL : err);
    store_put(st, r, conversation(st));
    cJSON *e = ev_new(st, "response.failed");
    cJSON_AddItemToObject(e, "response", r);
    ev_send(out, e);
}

static char *error_json(const pgd_api_error *e) { return pgd_api_error_json(e); }

static bool streams(const void *state) { return ((const resp_state *)state)->stream; }

const pgd_dialect pgd_dialect_responses = {
    .name = "responses",
    .begin = begin,
    .complete = complete,
    .stream_start = stream_start,
    .stream_chunk = stream_chunk,
    .stream_end = stream_end,
    .error_json = error_json,
    .stream_error = stream_error,
    .streams = streams,
    .free_state = state_free,
};

/* ---- background ---- */

bool pgd_responses_background(const void *state) {
    return ((const resp_state *)state)->background;
}

static const char *pending_status(const resp_state *st) {
    return st->cancelled ? "cancelled" : st->running ? "in_progress" : "queued";
}

char *pgd_responses_snapshot(void *state) {
    resp_state *st = state;
    cJSON *r = response_obj(st, pending_status(st), false, NULL);
    store_put(st, r, st->messages ? cJSON_Duplicate(st->messages, true) : NULL);
    char *js = r ? cJSON_PrintUnformatted(r) : NULL;
    cJSON_Delete(r);
    return js;
}

void pgd_responses_mark_running(void *state) {
    resp_state *st = state;
    if (st->running || st->cancelled || st->ended) return;
    st->running = true;
    cJSON *r = response_obj(st, pending_status(st), false, NULL);
    store_put(st, r, NULL); /* (the conversation the snapshot stored stays) */
    cJSON_Delete(r);
}

void pgd_responses_mark_cancelled(void *state) { ((resp_state *)state)->cancelled = true; }
