/* The Anthropic Messages API (POST /v1/messages) as a dialect of the chat path: a Messages body
 * becomes an OpenAI chat-completions request, and the chat answer (or its chunks) becomes an
 * Anthropic message (or its event stream: message_start, content blocks, message_delta,
 * message_stop). Only Anthropic's shapes live here; the server runs the request as any chat. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/dialect.h"

/* Anthropic's tool-use ids are "toolu_..."; the chat path's are "call_..." (mistral: 9 letters
 * and digits). An answer's call id X is sent as "toolu_" + X less "call_", and a conversation's
 * "toolu_" + Y goes back to the chat as Y: a tool_use and its tool_result map to one id, and a
 * mistral call comes back as the 9 characters its template checks. */
#define TOOLU "toolu_"

typedef enum { BLOCK_NONE, BLOCK_TEXT, BLOCK_THINKING } block_kind;

typedef struct anth_state {
    char *id;                  /* "msg_..." */
    char *model;               /* the request's model (answers echo it) */
    bool stream;
    /* streaming */
    int n_blocks;              /* content blocks started so far (the next one's index) */
    block_kind open;           /* the block now open (tool_use blocks close where they start) */
    char *finish;              /* the chat finish_reason, once seen */
    char *stop_sequence;       /* vLLM's stop_reason when it names a stop string */
    int32_t prompt_tokens, completion_tokens, cached_tokens;
    const pgd_dialect_env *env;  /* borrowed: the server keeps it for the request's life */
    bool calls;                /* tool_use blocks were sent */
    bool ended;                /* message_stop or an error event went out */
} anth_state;

#define BAD(param, ...)                                                                          \
    do {                                                                                         \
        pgd_api_error_set(err, 400, "invalid_request_error", param, NULL, __VA_ARGS__);          \
        goto fail;                                                                               \
    } while (0)

static bool unset(const cJSON *x) { return !x || cJSON_IsNull(x); }

static bool is_int(const cJSON *x) {
    /* (the range first: casting a double past long long's is undefined) */
    return cJSON_IsNumber(x) && x->valuedouble > -9007199254740992.0 &&
           x->valuedouble < 9007199254740992.0 &&
           x->valuedouble == (double)(long long)x->valuedouble;
}

static const cJSON *get(const cJSON *o, const char *k) {
    return cJSON_GetObjectItemCaseSensitive(o, k);
}

/* ---- request ---- */

/* The text of a string or of an array of text blocks (system, a tool_result's content) appended
 * to b; other blocks are a 400 naming param. */
static int append_text(const cJSON *v, const char *param, pgd_sbuf *b, pgd_api_error *err) {
    if (cJSON_IsString(v)) {
        pgd_sbuf_append(b, v->valuestring, strlen(v->valuestring));
        return 0;
    }
    if (!cJSON_IsArray(v)) BAD(param, "'%s' must be a string or an array of text blocks", param);
    const cJSON *blk;
    int j = 0;
    cJSON_ArrayForEach(blk, v) {
        const cJSON *ty = get(blk, "type"), *tx = get(blk, "text");
        if (!cJSON_IsObject(blk) || !cJSON_IsString(ty))
            BAD(param, "%s[%d] must be a content block with a string 'type'", param, j);
        if (strcmp(ty->valuestring, "text"))
            BAD(param, "%s[%d]: '%.40s' blocks are not supported here (this model reads text "
                "only)", param, j, ty->valuestring);
        if (!cJSON_IsString(tx)) BAD(param, "%s[%d].text must be a string", param, j);
        pgd_sbuf_append(b, tx->valuestring, strlen(tx->valuestring));
        j++;
    }
    return 0;
fail:
    return -1;
}

static cJSON *sbuf_string(pgd_sbuf *b) {
    cJSON *s = cJSON_CreateString(b->len ? b->data : "");
    pgd_sbuf_free(b);
    return s;
}

static const char *chat_tool_id(const char *id) {
    return strncmp(id, TOOLU, strlen(TOOLU)) ? id : id + strlen(TOOLU);
}

static cJSON *text_message(const char *role, pgd_sbuf *text) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", role);
    cJSON_AddItemToObject(m, "content", sbuf_string(text));
    return m;
}

/* One tool_result block -> a chat "tool" message (appended to out). is_error has no field in a
 * chat message: the content is prefixed "Error: " so the model reads it as a failure. */
static int tool_result(const cJSON *blk, const char *param, cJSON *out, pgd_api_error *err) {
    const cJSON *tid = get(blk, "tool_use_id"), *c = get(blk, "content");
    const cJSON *ie = get(blk, "is_error");
    if (!cJSON_IsString(tid)) BAD(param, "%s.tool_use_id must be a string", param);
    if (!unset(ie) && !cJSON_IsBool(ie)) BAD(param, "%s.is_error must be a boolean", param);
    pgd_sbuf b = {0};
    if (cJSON_IsTrue(ie)) pgd_sbuf_append(&b, "Error: ", 7);
    char cp[96];
    snprintf(cp, sizeof cp, "%s.content", param);
    if (!unset(c) && append_text(c, cp, &b, err)) {
        pgd_sbuf_free(&b);
        return -1;
    }
    cJSON *m = text_message("tool", &b);
    cJSON_AddStringToObject(m, "tool_call_id", chat_tool_id(tid->valuestring));
    cJSON_AddItemToArray(out, m);
    return 0;
fail:
    return -1;
}

/* One tool_use block -> a chat tool call (its input as the arguments' JSON string). */
static int tool_use(const cJSON *blk, const char *param, cJSON *calls, pgd_api_error *err) {
    const cJSON *id = get(blk, "id"), *nm = get(blk, "name"), *in = get(blk, "input");
    if (!cJSON_IsString(id) || !cJSON_IsString(nm))
        BAD(param, "%s must have a string 'id' and 'name'", param);
    if (!cJSON_IsObject(in)) BAD(param, "%s.input must be an object", param);
    char *args = cJSON_PrintUnformatted(in);
    cJSON *c = cJSON_CreateObject(), *fn = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "id", chat_tool_id(id->valuestring));
    cJSON_AddStringToObject(c, "type", "function");
    cJSON_AddStringToObject(fn, "name", nm->valuestring);
    cJSON_AddStringToObject(fn, "arguments", args ? args : "{}");
    cJSON_AddItemToObject(c, "function", fn);
    cJSON_AddItemToArray(calls, c);
    free(args);
    return 0;
fail:
    return -1;
}

/* messages[i] -> chat messages appended to out. A user turn's tool_result blocks become "tool"
 * messages in their place among its text; an assistant turn's text, thinking and tool_use blocks
 * become one assistant message (content, reasoning_content, tool_calls). *text_end: the turn is
 * an assistant's ending in text (a prefill when it is the last). */
static int convert_message(const cJSON *msg, int i, cJSON *out, bool *text_end,
                           pgd_api_error *err) {
    char param[32];
    snprintf(param, sizeof param, "messages[%d]", i);
    const cJSON *role = get(msg, "role"), *content = get(msg, "content");
    pgd_sbuf text = {0}, thinking = {0};
    cJSON *calls = NULL;
    if (!cJSON_IsObject(msg) || !cJSON_IsString(role))
        BAD(param, "%s must be an object with a string 'role'", param);
    bool user = !strcmp(role->valuestring, "user");
    if (!user && strcmp(role->valuestring, "assistant"))
        BAD(param, "%s.role must be 'user' or 'assistant' (the system prompt goes in 'system')",
            param);
    *text_end = false;
    if (cJSON_IsString(content)) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", role->valuestring);
        cJSON_AddStringToObject(m, "content", content->valuestring);
        cJSON_AddItemToArray(out, m);
        *text_end = !user;
        return 0;
    }
    if (!cJSON_IsArray(content))
        BAD(param, "%s.content must be a string or an array of content blocks", param);
    calls = cJSON_CreateArray();
    bool has_text = false;
    const cJSON *blk;
    int j = 0;
    cJSON_ArrayForEach(blk, content) {
        char bp[64];
        snprintf(bp, sizeof bp, "%s.content[%d]", param, j++);
        const cJSON *ty = get(blk, "type");
        if (!cJSON_IsObject(blk) || !cJSON_IsString(ty))
            BAD(bp, "%s must be a content block with a string 'type'", bp);
        const char *t = ty->valuestring;
        if (!strcmp(t, "text")) {
            const cJSON *tx = get(blk, "text");
            if (!cJSON_IsString(tx)) BAD(bp, "%s.text must be a string", bp);
            pgd_sbuf_append(&text, tx->valuestring, strlen(tx->valuestring));
            has_text = true;
        } else if (!strcmp(t, "image") || !strcmp(t, "document")) {
            BAD(bp, "%s: '%s' blocks are not supported (this model reads text only)", bp, t);
        } else if (user && !strcmp(t, "tool_result")) {
            if (has_text) { /* text before a result keeps its place */
                cJSON_AddItemToArray(out, text_message("user", &text));
                has_text = false;
            }
            if (tool_result(blk, bp, out, err)) goto fail;
        } else if (!user && !strcmp(t, "tool_use")) {
            if (tool_use(blk, bp, calls, err)) goto fail;
        } else if (!user && !strcmp(t, "thinking")) {
            const cJSON *th = get(blk, "thinking");
            if (!cJSON_IsString(th)) BAD(bp, "%s.thinking must be a string", bp);
            pgd_sbuf_append(&thinking, th->valuestring, strlen(th->valuestring));
        } else if (!user && !strcmp(t, "redacted_thinking")) {
            /* encrypted by another server: nothing a template can show */
        } else {
            BAD(bp, "%s: '%.40s' blocks are not supported in a%s message", bp, t,
                user ? " user" : "n assistant");
        }
    }
    if (user) {
        if (has_text || cJSON_GetArraySize(content) == 0)
            cJSON_AddItemToArray(out, text_message("user", &text));
        pgd_sbuf_free(&text);
        cJSON_Delete(calls);
        return 0;
    }
    *text_end = has_text && !cJSON_GetArraySize(calls); /* (a turn with calls is no prefill) */
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", "assistant");
    if (has_text || !cJSON_GetArraySize(calls))
        cJSON_AddItemToObject(m, "content", sbuf_string(&text));
    else cJSON_AddNullToObject(m, "content");
    pgd_sbuf_free(&text);
    if (thinking.len) cJSON_AddItemToObject(m, "reasoning_content", sbuf_string(&thinking));
    pgd_sbuf_free(&thinking);
    if (cJSON_GetArraySize(calls)) cJSON_AddItemToObject(m, "tool_calls", calls);
    else cJSON_Delete(calls);
    cJSON_AddItemToArray(out, m);
    return 0;
fail:
    pgd_sbuf_free(&text);
    pgd_sbuf_free(&thinking);
    cJSON_Delete(calls);
    return -1;
}

static int convert_tools(const cJSON *o, cJSON *chat, pgd_api_error *err) {
    const cJSON *tools = get(o, "tools"), *t;
    if (unset(tools)) return 0;
    if (!cJSON_IsArray(tools)) BAD("tools", "'tools' must be an array");
    cJSON *arr = cJSON_AddArrayToObject(chat, "tools");
    int i = 0;
    cJSON_ArrayForEach(t, tools) {
        char p[32];
        snprintf(p, sizeof p, "tools[%d]", i++);
        const cJSON *ty = get(t, "type"), *nm = get(t, "name"), *d = get(t, "description");
        const cJSON *sch = get(t, "input_schema");
        if (!cJSON_IsObject(t)) BAD(p, "%s must be an object", p);
        if (!unset(ty) && !(cJSON_IsString(ty) && !strcmp(ty->valuestring, "custom")))
            BAD(p, "%s: tools of type '%.40s' (Anthropic's server tools) are not supported; "
                "give a client tool's 'name' and 'input_schema'", p,
                cJSON_IsString(ty) ? ty->valuestring : "?");
        if (!cJSON_IsString(nm) || !nm->valuestring[0])
            BAD(p, "%s.name must be a non-empty string", p);
        if (!unset(d) && !cJSON_IsString(d)) BAD(p, "%s.description must be a string", p);
        if (!cJSON_IsObject(sch)) BAD(p, "%s.input_schema must be an object (a JSON Schema)", p);
        cJSON *ct = cJSON_CreateObject(), *fn = cJSON_CreateObject();
        cJSON_AddStringToObject(ct, "type", "function");
        cJSON_AddStringToObject(fn, "name", nm->valuestring);
        if (cJSON_IsString(d)) cJSON_AddStringToObject(fn, "description", d->valuestring);
        cJSON_AddItemToObject(fn, "parameters", cJSON_Duplicate(sch, true));
        cJSON_AddItemToObject(ct, "function", fn);
        cJSON_AddItemToArray(arr, ct);
    }
    return 0;
fail:
    return -1;
}

/* tool_choice: auto, any (-> required), tool (-> the named function), none;
 * disable_parallel_tool_use -> parallel_tool_calls false. *forced: a call is required. */
static int convert_tool_choice(const cJSON *o, cJSON *chat, bool *forced, pgd_api_error *err) {
    const cJSON *tc = get(o, "tool_choice");
    *forced = false;
    if (unset(tc)) return 0;
    const cJSON *ty = get(tc, "type"), *dp = get(tc, "disable_parallel_tool_use");
    if (!cJSON_IsObject(tc) || !cJSON_IsString(ty))
        BAD("tool_choice", "'tool_choice' must be an object with a string 'type'");
    const char *t = ty->valuestring;
    if (!unset(dp) && !cJSON_IsBool(dp))
        BAD("tool_choice", "'tool_choice.disable_parallel_tool_use' must be a boolean");
    if (!strcmp(t, "auto") || !strcmp(t, "none")) {
        cJSON_AddStringToObject(chat, "tool_choice", t);
    } else if (!strcmp(t, "any")) {
        cJSON_AddStringToObject(chat, "tool_choice", "required");
        *forced = true;
    } else if (!strcmp(t, "tool")) {
        const cJSON *nm = get(tc, "name");
        if (!cJSON_IsString(nm))
            BAD("tool_choice", "'tool_choice' of type 'tool' needs a string 'name'");
        cJSON *c = cJSON_AddObjectToObject(chat, "tool_choice");
        cJSON_AddStringToObject(c, "type", "function");
        cJSON_AddStringToObject(cJSON_AddObjectToObject(c, "function"), "name", nm->valuestring);
        *forced = true;
    } else {
        BAD("tool_choice", "'tool_choice.type' must be 'auto', 'any', 'tool' or 'none'");
    }
    if (*forced && unset(get(o, "tools")))
        BAD("tool_choice", "'tool_choice' asks for a tool call, but there are no 'tools'");
    if (cJSON_IsTrue(dp)) cJSON_AddFalseToObject(chat, "parallel_tool_calls");
    return 0;
fail:
    return -1;
}

/* The sampling options and limits: max_tokens (required), stop_sequences, temperature, top_p,
 * top_k, metadata, stream, thinking. */
static int convert_options(const cJSON *o, cJSON *chat, bool forced, anth_state *st,
                           pgd_api_error *err) {
    const cJSON *x = get(o, "max_tokens");
    if (unset(x)) BAD("max_tokens", "'max_tokens' is required");
    if (!is_int(x) || x->valuedouble < 1)
        BAD("max_tokens", "'max_tokens' must be an integer of at least 1");
    cJSON_AddNumberToObject(chat, "max_tokens", x->valuedouble);
    x = get(o, "stop_sequences");
    if (!unset(x)) {
        if (!cJSON_IsArray(x))
            BAD("stop_sequences", "'stop_sequences' must be an array of strings");
        if (cJSON_GetArraySize(x) > 4) BAD("stop_sequences", "at most 4 'stop_sequences'");
        const cJSON *s;
        cJSON_ArrayForEach(s, x) {
            if (!cJSON_IsString(s) || !s->valuestring[0] || strlen(s->valuestring) > 64)
                BAD("stop_sequences", "'stop_sequences' must be non-empty strings of at most "
                    "64 bytes");
        }
        if (cJSON_GetArraySize(x)) {
            if (forced)
                BAD("stop_sequences", "'stop_sequences' cannot be combined with a forced tool "
                    "call (tool_choice 'any' or 'tool'): a stop sequence could cut the call");
            cJSON_AddItemToObject(chat, "stop", cJSON_Duplicate(x, true));
        }
    }
    static const char *const unit[] = {"temperature", "top_p"};
    for (int i = 0; i < 2; i++) {
        x = get(o, unit[i]);
        if (unset(x)) continue;
        if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble > 1)
            BAD(unit[i], "'%s' must be a number between 0 and 1", unit[i]);
        cJSON_AddNumberToObject(chat, unit[i], x->valuedouble);
    }
    x = get(o, "top_k");
    if (!unset(x)) {
        if (!is_int(x) || x->valuedouble < 0)
            BAD("top_k", "'top_k' must be a non-negative integer");
        if (x->valuedouble > 0) cJSON_AddNumberToObject(chat, "top_k", x->valuedouble);
    }
    x = get(o, "metadata");
    if (!unset(x)) {
        const cJSON *u = get(x, "user_id");
        if (!cJSON_IsObject(x) || (!unset(u) && !cJSON_IsString(u)))
            BAD("metadata", "'metadata' must be an object whose 'user_id' is a string");
        if (cJSON_IsString(u)) cJSON_AddStringToObject(chat, "user", u->valuestring);
    }
    x = get(o, "stream");
    if (!unset(x)) {
        if (!cJSON_IsBool(x)) BAD("stream", "'stream' must be a boolean");
        st->stream = cJSON_IsTrue(x);
        if (st->stream) cJSON_AddTrueToObject(chat, "stream");
    }
    /* thinking: the templates that can think (Qwen3, SmolLM3) read enable_thinking, as
     * llama.cpp maps it; budget_tokens is checked as Anthropic does but not enforced apart from
     * max_tokens (its "< max_tokens" rule is not checked: count_tokens has no max_tokens) */
    x = get(o, "thinking");
    if (!unset(x)) {
        const cJSON *ty = get(x, "type"), *bt = get(x, "budget_tokens");
        if (!cJSON_IsObject(x) || !cJSON_IsString(ty))
            BAD("thinking", "'thinking' must be an object with a string 'type'");
        bool on = strcmp(ty->valuestring, "disabled") != 0;
        if (!strcmp(ty->valuestring, "enabled")) {
            if (!is_int(bt) || bt->valuedouble < 1024)
                BAD("thinking", "'thinking.budget_tokens' must be an integer of at least 1024");
        } else if (on && strcmp(ty->valuestring, "adaptive")) {
            BAD("thinking", "'thinking.type' must be 'enabled', 'adaptive' or 'disabled'");
        }
        cJSON_AddBoolToObject(cJSON_AddObjectToObject(chat, "chat_template_kwargs"),
                              "enable_thinking", on);
    }
    return 0;
fail:
    return -1;
}

static void state_free(void *p) {
    anth_state *st = p;
    if (!st) return;
    free(st->id);
    free(st->model);
    free(st->finish);
    free(st->stop_sequence);
    free(st);
}

static int anth_begin(const pgd_dialect_env *env, const char *body, size_t len, cJSON **chat_out,
                      void **state, pgd_api_error *err) {
    *chat_out = NULL;
    *state = NULL;
    cJSON *o = pgd_api_json_parse(body, len), *chat = cJSON_CreateObject();
    anth_state *st = calloc(1, sizeof *st);
    if (st) st->env = env;
    if (!chat || !st) goto oom;
    if (!cJSON_IsObject(o)) BAD(NULL, "the body must be a JSON object");
    if (pgd_api_json_unique_keys(o, err)) goto fail;
    const cJSON *model = get(o, "model");
    if (unset(model)) BAD("model", "'model' is required");
    if (!cJSON_IsString(model)) BAD("model", "'model' must be a string");
    cJSON_AddStringToObject(chat, "model", model->valuestring);
    cJSON *msgs = cJSON_AddArrayToObject(chat, "messages");
    const cJSON *sys = get(o, "system");
    if (!unset(sys)) {
        pgd_sbuf b = {0};
        if (append_text(sys, "system", &b, err)) {
            pgd_sbuf_free(&b);
            goto fail;
        }
        if (b.len) cJSON_AddItemToArray(msgs, text_message("system", &b));
        pgd_sbuf_free(&b);
    }
    const cJSON *m = get(o, "messages"), *msg;
    if (unset(m)) BAD("messages", "'messages' is required");
    if (!cJSON_IsArray(m) || !cJSON_GetArraySize(m))
        BAD("messages", "'messages' must be a non-empty array");
    int i = 0;
    bool text_end = false;
    cJSON_ArrayForEach(msg, m) {
        if (convert_message(msg, i++, msgs, &text_end, err)) goto fail;
    }
    if (text_end) {
        /* a final assistant turn is a prefill: the answer continues it */
        const cJSON *last = cJSON_GetArrayItem(msgs, cJSON_GetArraySize(msgs) - 1);
        const char *t = cJSON_GetStringValue(get(last, "content"));
        size_t n = t ? strlen(t) : 0;
        if (n && strchr(" \t\n\r", t[n - 1]))
            BAD("messages", "the final assistant content cannot end with trailing whitespace");
        if (n) cJSON_AddTrueToObject(chat, "continue_final_message");
        if (n) cJSON_AddFalseToObject(chat, "add_generation_prompt");
    }
    bool forced;
    if (convert_tools(o, chat, err) || convert_tool_choice(o, chat, &forced, err) ||
        convert_options(o, chat, forced, st, err))
        goto fail;
    const char *rid = env && env->request_id ? env->request_id : "";
    size_t idn = strlen(rid) + 5;
    if (!(st->id = malloc(idn)) || !(st->model = strdup(model->valuestring))) goto oom;
    snprintf(st->id, idn, "%s%s", strncmp(rid, "msg_", 4) ? "msg_" : "", rid);
    cJSON_Delete(o);
    *chat_out = chat;
    *state = st;
    return 0;
oom:
    pgd_api_error_set(err, 500, "api_error", NULL, NULL, "out of memory");
fail:
    cJSON_Delete(o);
    cJSON_Delete(chat);
    state_free(st);
    return -1;
}

/* ---- answers ---- */

/* The chat finish_reason (and vLLM's stop_reason beside it) as Anthropic's stop_reason. An
 * answer that ends in calls is "tool_use" whatever the finish_reason: the chat path says "stop"
 * for a named tool_choice's call, as OpenAI does, where Anthropic says tool_use. */
static const char *stop_reason_of(const char *finish, const char *stop_sequence, bool calls) {
    if (calls) return "tool_use";
    if (!finish) return "end_turn";
    if (!strcmp(finish, "length")) return "max_tokens";
    if (!strcmp(finish, "tool_calls")) return "tool_use";
    return stop_sequence ? "stop_sequence" : "end_turn";
}

static cJSON *usage_json(int32_t prompt, int32_t completion, int32_t cached) {
    /* Anthropic's input_tokens leave out what the cache served: total input is the sum of
     * input_tokens, cache_creation_input_tokens and cache_read_input_tokens */
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "input_tokens", prompt - cached);
    cJSON_AddNumberToObject(u, "cache_creation_input_tokens", 0);
    cJSON_AddNumberToObject(u, "cache_read_input_tokens", cached);
    cJSON_AddNumberToObject(u, "output_tokens", completion);
    return u;
}

static cJSON *message_base(const anth_state *st) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", st->id);
    cJSON_AddStringToObject(o, "type", "message");
    cJSON_AddStringToObject(o, "role", "assistant");
    cJSON_AddStringToObject(o, "model", st->model);
    cJSON_AddArrayToObject(o, "content");
    return o;
}

static int32_t count(const cJSON *x) {
    return cJSON_IsNumber(x) ? (int32_t)x->valuedouble : 0;
}

static void usage_of(const cJSON *completion, int32_t *prompt, int32_t *out, int32_t *cached) {
    const cJSON *u = get(completion, "usage");
    *prompt = count(get(u, "prompt_tokens"));
    *out = count(get(u, "completion_tokens"));
    *cached = count(get(get(u, "prompt_tokens_details"), "cached_tokens"));
}

static cJSON *tool_use_block(const cJSON *call, bool with_input) {
    const cJSON *fn = get(call, "function");
    const char *id = cJSON_GetStringValue(get(call, "id"));
    const char *args = cJSON_GetStringValue(get(fn, "arguments"));
    const char *name = cJSON_GetStringValue(get(fn, "name"));
    char tid[160];
    id = id ? id : "";
    snprintf(tid, sizeof tid, TOOLU "%s", strncmp(id, "call_", 5) ? id : id + 5);
    cJSON *b = cJSON_CreateObject();
    cJSON_AddStringToObject(b, "type", "tool_use");
    cJSON_AddStringToObject(b, "id", tid);
    cJSON_AddStringToObject(b, "name", name ? name : "");
    cJSON *in = with_input && args ? cJSON_Parse(args) : NULL;
    if (cJSON_IsObject(in)) {
        cJSON_Delete(in);
        /* the arguments as the model wrote them (cJSON would round long numbers) */
        cJSON_AddItemToObject(b, "input", cJSON_CreateRaw(args));
    } else {
        cJSON_Delete(in);
        cJSON_AddObjectToObject(b, "input");
    }
    return b;
}

static char *anth_complete(void *state, const cJSON *completion) {
    anth_state *st = state;
    const cJSON *ch = cJSON_GetArrayItem(get(completion, "choices"), 0);
    const cJSON *msg = get(ch, "message");
    cJSON *o = message_base(st), *content = cJSON_GetObjectItemCaseSensitive(o, "content");
    const char *r = cJSON_GetStringValue(get(msg, "reasoning_content"));
    if (r && r[0]) {
        cJSON *b = cJSON_CreateObject();
        cJSON_AddStringToObject(b, "type", "thinking");
        cJSON_AddStringToObject(b, "thinking", r);
        cJSON_AddStringToObject(b, "signature", "");
        cJSON_AddItemToArray(content, b);
    }
    const char *t = cJSON_GetStringValue(get(msg, "content"));
    if (t && t[0]) {
        cJSON *b = cJSON_CreateObject();
        cJSON_AddStringToObject(b, "type", "text");
        cJSON_AddStringToObject(b, "text", t);
        cJSON_AddItemToArray(content, b);
    }
    const cJSON *call;
    cJSON_ArrayForEach(call, get(msg, "tool_calls")) {
        cJSON_AddItemToArray(content, tool_use_block(call, true));
    }
    const char *finish = cJSON_GetStringValue(get(ch, "finish_reason"));
    const char *seq = cJSON_GetStringValue(get(ch, "stop_reason"));
    const char *sr = stop_reason_of(finish, seq, cJSON_GetArraySize(get(msg, "tool_calls")) > 0);
    cJSON_AddStringToObject(o, "stop_reason", sr);
    if (!strcmp(sr, "stop_sequence")) cJSON_AddStringToObject(o, "stop_sequence", seq);
    else cJSON_AddNullToObject(o, "stop_sequence");
    int32_t prompt, out, cached;
    usage_of(completion, &prompt, &out, &cached);
    cJSON_AddItemToObject(o, "usage", usage_json(prompt, out, cached));
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

/* ---- streaming ---- */

static cJSON *typed(const char *type) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", type);
    return o;
}

static void emit(pgd_sbuf *out, cJSON *o) { /* o taken; its "type" names the event */
    pgd_sbuf_sse_event(out, cJSON_GetStringValue(get(o, "type")), o);
    cJSON_Delete(o);
}

static void block_start(anth_state *st, pgd_sbuf *out, cJSON *block) { /* block taken */
    cJSON *e = typed("content_block_start");
    cJSON_AddNumberToObject(e, "index", st->n_blocks);
    cJSON_AddItemToObject(e, "content_block", block);
    emit(out, e);
}

static void block_delta(anth_state *st, pgd_sbuf *out, const char *type, const char *key,
                        const char *val) {
    cJSON *e = typed("content_block_delta");
    cJSON_AddNumberToObject(e, "index", st->n_blocks);
    cJSON *d = cJSON_AddObjectToObject(e, "delta");
    cJSON_AddStringToObject(d, "type", type);
    cJSON_AddStringToObject(d, key, val);
    emit(out, e);
}

/* Ends the open block (a thinking block gets its signature first, as Anthropic sends it). */
static void block_stop(anth_state *st, pgd_sbuf *out) {
    if (st->open == BLOCK_NONE) return;
    if (st->open == BLOCK_THINKING) block_delta(st, out, "signature_delta", "signature", "");
    cJSON *e = typed("content_block_stop");
    cJSON_AddNumberToObject(e, "index", st->n_blocks);
    emit(out, e);
    st->open = BLOCK_NONE;
    st->n_blocks++;
}

/* Text of kind k: opens a block of that kind first where another (or none) is open. */
static void block_text(anth_state *st, pgd_sbuf *out, block_kind k, const char *s) {
    if (!s || !s[0]) return;
    if (st->open != k) {
        block_stop(st, out);
        cJSON *b = typed(k == BLOCK_TEXT ? "text" : "thinking");
        cJSON_AddStringToObject(b, k == BLOCK_TEXT ? "text" : "thinking", "");
        if (k == BLOCK_THINKING) cJSON_AddStringToObject(b, "signature", "");
        block_start(st, out, b);
        st->open = k;
    }
    if (k == BLOCK_TEXT) block_delta(st, out, "text_delta", "text", s);
    else block_delta(st, out, "thinking_delta", "thinking", s);
}

static void anth_stream_start(void *state, pgd_sbuf *out) {
    anth_state *st = state;
    cJSON *m = message_base(st);
    cJSON_AddNullToObject(m, "stop_reason");
    cJSON_AddNullToObject(m, "stop_sequence");
    /* what the cache served is known at the end only: message_delta carries the split */
    cJSON_AddItemToObject(m, "usage", usage_json(st->env ? st->env->prompt_tokens : 0, 0, 0));
    cJSON *e = typed("message_start");
    cJSON_AddItemToObject(e, "message", m);
    emit(out, e);
    emit(out, typed("ping"));
}

static void anth_stream_chunk(void *state, const cJSON *chunk, pgd_sbuf *out) {
    anth_state *st = state;
    if (st->ended) return;
    const cJSON *ch = cJSON_GetArrayItem(get(chunk, "choices"), 0);
    const cJSON *d = get(ch, "delta");
    block_text(st, out, BLOCK_THINKING, cJSON_GetStringValue(get(d, "reasoning_content")));
    block_text(st, out, BLOCK_TEXT, cJSON_GetStringValue(get(d, "content")));
    const cJSON *call;
    cJSON_ArrayForEach(call, get(d, "tool_calls")) {
        /* the chat path sends each call whole: one start, its input in one delta, one stop */
        block_stop(st, out);
        block_start(st, out, tool_use_block(call, false));
        st->calls = true;
        const char *args = cJSON_GetStringValue(get(get(call, "function"), "arguments"));
        block_delta(st, out, "input_json_delta", "partial_json", args ? args : "{}");
        cJSON *e = typed("content_block_stop");
        cJSON_AddNumberToObject(e, "index", st->n_blocks++);
        emit(out, e);
    }
    const char *fin = cJSON_GetStringValue(get(ch, "finish_reason"));
    if (fin && !st->finish) {
        st->finish = strdup(fin);
        const char *seq = cJSON_GetStringValue(get(ch, "stop_reason"));
        if (seq) st->stop_sequence = strdup(seq);
    }
    const cJSON *u = get(chunk, "usage");
    if (cJSON_IsObject(u)) usage_of(chunk, &st->prompt_tokens, &st->completion_tokens,
                                    &st->cached_tokens);
}

static void anth_stream_end(void *state, pgd_sbuf *out) {
    anth_state *st = state;
    if (st->ended) return;
    block_stop(st, out);
    cJSON *e = typed("message_delta");
    cJSON *d = cJSON_AddObjectToObject(e, "delta");
    const char *sr = stop_reason_of(st->finish, st->stop_sequence, st->calls);
    cJSON_AddStringToObject(d, "stop_reason", sr);
    if (!strcmp(sr, "stop_sequence"))
        cJSON_AddStringToObject(d, "stop_sequence", st->stop_sequence);
    else
        cJSON_AddNullToObject(d, "stop_sequence");
    cJSON_AddItemToObject(e, "usage", usage_json(st->prompt_tokens, st->completion_tokens,
                                                 st->cached_tokens));
    emit(out, e);
    emit(out, typed("message_stop"));
    st->ended = true;
}

/* ---- errors ---- */

/* Anthropic's error type for an HTTP status. */
static const char *error_type(int status) {
    switch (status) {
    case 401: return "authentication_error";
    case 402: return "billing_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: case 529: return "overloaded_error";
    case 504: return "timeout_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
    }
}

static cJSON *error_obj(const pgd_api_error *e) {
    cJSON *o = typed("error"), *x = cJSON_AddObjectToObject(o, "error");
    cJSON_AddStringToObject(x, "type", error_type(e->status));
    cJSON_AddStringToObject(x, "message", e->message);
    return o;
}

static char *anth_error_json(const pgd_api_error *e) {
    cJSON *o = error_obj(e);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

static void anth_stream_error(void *state, const pgd_api_error *e, pgd_sbuf *out) {
    anth_state *st = state;
    if (st && st->ended) return;
    emit(out, error_obj(e));
    if (st) st->ended = true;
}

static bool anth_streams(const void *state) { return ((const anth_state *)state)->stream; }

const pgd_dialect pgd_dialect_anthropic = {
    .name = "anthropic",
    .begin = anth_begin,
    .complete = anth_complete,
    .stream_start = anth_stream_start,
    .stream_chunk = anth_stream_chunk,
    .stream_end = anth_stream_end,
    .error_json = anth_error_json,
    .stream_error = anth_stream_error,
    .streams = anth_streams,
    .free_state = state_free,
};
