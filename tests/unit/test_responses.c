/* The Responses dialect (src/api/responses.c) on hand-made chat objects: a Responses body into
 * the chat request, the chat.completion into the Response object, the chunks into the event
 * stream (sequence numbers, event order, deltas adding up, item ids equal to the final
 * object's), the store (previous_response_id, instructions not carried), background and
 * cancel, and the requests refused with OpenAI's error shape. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/responses.h"
#include "test.h"

static pgd_resp_store *store;

static pgd_dialect_env env_of(const char *id) {
    return (pgd_dialect_env){.model = "served", .request_id = id, .created = 123,
                             .store = store};
}

static const pgd_dialect *D = &pgd_dialect_responses;

/* begin() on body; 0 with *chat and *state, or -1 with err. */
static int begin(const char *id, const char *body, cJSON **chat, void **state,
                 pgd_api_error *err) {
    pgd_dialect_env env = env_of(id);
    *chat = NULL;
    *state = NULL;
    return D->begin(&env, body, strlen(body), chat, state, err);
}

static const cJSON *at(const cJSON *o, const char *path) { /* "a.b.0.c" */
    char buf[256];
    snprintf(buf, sizeof buf, "%s", path);
    const cJSON *x = o;
    for (char *tok = strtok(buf, "."); tok && x; tok = strtok(NULL, "."))
        x = (*tok >= '0' && *tok <= '9') ? cJSON_GetArrayItem(x, atoi(tok))
                                         : cJSON_GetObjectItemCaseSensitive(x, tok);
    return x;
}

static bool str_is(const cJSON *o, const char *path, const char *want) {
    const cJSON *x = at(o, path);
    bool ok = cJSON_IsString(x) && !strcmp(x->valuestring, want);
    if (!ok) {
        char *s = cJSON_PrintUnformatted(o);
        fprintf(stderr, "  %s != '%s' in %.600s\n", path, want, s);
        free(s);
    }
    return ok;
}

static double num(const cJSON *o, const char *path) {
    const cJSON *x = at(o, path);
    return cJSON_IsNumber(x) ? x->valuedouble : -1;
}

static void test_request(void) {
    cJSON *chat;
    void *st;
    pgd_api_error err;
    const char *body =
        "{\"model\":\"m\",\"instructions\":\"Be brief.\",\"input\":["
        "{\"role\":\"user\",\"content\":\"Weather?\"},"
        "{\"type\":\"reasoning\",\"id\":\"rs_1\",\"summary\":[]},"
        "{\"type\":\"message\",\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\","
        "\"text\":\"Let me \"},{\"type\":\"output_text\",\"text\":\"check.\"}]},"
        "{\"type\":\"function_call\",\"call_id\":\"call_1\",\"name\":\"weather\","
        "\"arguments\":\"{\\\"city\\\":\\\"Oslo\\\"}\"},"
        "{\"type\":\"function_call\",\"call_id\":\"call_2\",\"name\":\"time\",\"arguments\":\"{}\"},"
        "{\"type\":\"function_call_output\",\"call_id\":\"call_1\",\"output\":\"sunny\"},"
        "{\"type\":\"function_call_output\",\"call_id\":\"call_2\",\"output\":[{\"type\":"
        "\"input_text\",\"text\":\"noon\"}]},"
        "{\"role\":\"developer\",\"content\":[{\"type\":\"input_text\",\"text\":\"Answer now.\"}]}],"
        "\"tools\":[{\"type\":\"function\",\"name\":\"weather\",\"description\":\"d\","
        "\"parameters\":{\"type\":\"object\"},\"strict\":true},{\"type\":\"function\",\"name\":"
        "\"time\"}],\"tool_choice\":{\"type\":\"function\",\"name\":\"weather\"},"
        "\"parallel_tool_calls\":false,\"max_output_tokens\":50,\"temperature\":0.5,\"top_p\":0.9,"
        "\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"w\",\"schema\":{\"type\":"
        "\"object\"},\"strict\":true}},\"metadata\":{\"k\":\"v\"},\"user\":\"u1\","
        "\"reasoning\":{\"effort\":\"low\"},\"include\":[\"reasoning.encrypted_content\"],"
        "\"truncation\":\"auto\",\"store\":false}";
    CHECK_EQ_INT(begin("resp_req", body, &chat, &st, &err), 0);
    if (!chat) return;
    const cJSON *m = at(chat, "messages");
    CHECK_EQ_INT(cJSON_GetArraySize(m), 6);
    CHECK(str_is(m, "0.role", "system") && str_is(m, "0.content", "Be brief."));
    CHECK(str_is(m, "1.role", "user") && str_is(m, "1.content", "Weather?"));
    /* the text and both calls are one assistant turn, as the chat answer gave them */
    CHECK(str_is(m, "2.role", "assistant") && str_is(m, "2.content", "Let me check."));
    CHECK(str_is(m, "2.tool_calls.0.id", "call_1") &&
          str_is(m, "2.tool_calls.0.type", "function") &&
          str_is(m, "2.tool_calls.0.function.name", "weather") &&
          str_is(m, "2.tool_calls.0.function.arguments", "{\"city\":\"Oslo\"}"));
    CHECK(str_is(m, "2.tool_calls.1.id", "call_2"));
    CHECK(str_is(m, "3.role", "tool") && str_is(m, "3.tool_call_id", "call_1") &&
          str_is(m, "3.content", "sunny"));
    CHECK(str_is(m, "4.tool_call_id", "call_2") && str_is(m, "4.content", "noon"));
    CHECK(str_is(m, "5.role", "system") && str_is(m, "5.content", "Answer now."));
    CHECK(str_is(chat, "model", "m"));
    CHECK(str_is(chat, "tools.0.type", "function") &&
          str_is(chat, "tools.0.function.name", "weather") &&
          str_is(chat, "tools.0.function.description", "d") &&
          str_is(chat, "tools.0.function.parameters.type", "object") &&
          cJSON_IsTrue(at(chat, "tools.0.function.strict")));
    CHECK(str_is(chat, "tools.1.function.name", "time") && !at(chat, "tools.1.function.strict"));
    CHECK(str_is(chat, "tool_choice.type", "function") &&
          str_is(chat, "tool_choice.function.name", "weather"));
    CHECK(cJSON_IsFalse(at(chat, "parallel_tool_calls")));
    CHECK_EQ_INT(num(chat, "max_tokens"), 50);
    CHECK(num(chat, "temperature") == 0.5 && num(chat, "top_p") == 0.9);
    CHECK(str_is(chat, "response_format.type", "json_schema") &&
          str_is(chat, "response_format.json_schema.name", "w") &&
          str_is(chat, "response_format.json_schema.schema.type", "object"));
    CHECK(!at(chat, "stream"));
    CHECK(!D->streams(st) && !pgd_responses_background(st));
    cJSON_Delete(chat);
    D->free_state(st);

    /* a string input, stream, json_object, tool_choice strings */
    CHECK_EQ_INT(begin("resp_s", "{\"input\":\"hi\",\"stream\":true,\"text\":{\"format\":"
                                 "{\"type\":\"json_object\"}},\"tool_choice\":\"required\","
                                 "\"tools\":[{\"type\":\"function\",\"name\":\"f\"}]}",
                       &chat, &st, &err), 0);
    if (!chat) return;
    CHECK_EQ_INT(cJSON_GetArraySize(at(chat, "messages")), 1);
    CHECK(str_is(chat, "messages.0.role", "user") && str_is(chat, "messages.0.content", "hi"));
    CHECK(cJSON_IsTrue(at(chat, "stream")) && D->streams(st));
    CHECK(str_is(chat, "response_format.type", "json_object"));
    CHECK(str_is(chat, "tool_choice", "required"));
    CHECK(!at(chat, "model") && !at(chat, "max_tokens"));
    cJSON_Delete(chat);
    D->free_state(st);
    /* "tools": [] is no tools (a chat "tools" would need a tool-call parser for "auto") */
    CHECK_EQ_INT(begin("resp_s", "{\"input\":\"hi\",\"tools\":[]}", &chat, &st, &err), 0);
    if (!chat) return;
    CHECK(!at(chat, "tools") && !at(chat, "tool_choice"));
    cJSON_Delete(chat);
    D->free_state(st);
}

/* One refused request: status, the parameter named, a word of the message. */
static void refused(const char *body, int status, const char *param, const char *needle) {
    cJSON *chat;
    void *st;
    pgd_api_error err = {0};
    int rc = begin("resp_bad", body, &chat, &st, &err);
    bool ok = rc == -1 && chat == NULL && st == NULL && err.status == status &&
              !strcmp(err.param, param) && strstr(err.message, needle);
    if (!ok) fprintf(stderr, "  refused(%s): rc %d status %d param '%s' message '%s'\n", body, rc,
                     err.status, err.param, err.message);
    CHECK(ok);
    if (rc == 0) {
        cJSON_Delete(chat);
        D->free_state(st);
    }
    if (rc == -1) { /* the error body is OpenAI's shape */
        char *js = D->error_json(&err);
        cJSON *o = cJSON_Parse(js);
        CHECK((param[0] ? str_is(o, "error.param", param) : cJSON_IsNull(at(o, "error.param"))) &&
              cJSON_IsString(at(o, "error.message")) &&
              cJSON_IsString(at(o, "error.type")));
        cJSON_Delete(o);
        free(js);
    }
}

static void test_refused(void) {
    refused("[1]", 400, "", "JSON object");
    refused("{\"input\":\"x\",\"tools\":[{\"type\":\"web_search_preview\"}]}", 400, "tools",
            "'web_search_preview' tools are not supported");
    refused("{\"input\":\"x\",\"tools\":[{\"type\":\"file_search\",\"vector_store_ids\":[]}]}", 400,
            "tools", "'file_search'");
    refused("{\"input\":\"x\",\"tools\":[{\"type\":\"code_interpreter\"}]}", 400, "tools",
            "'code_interpreter'");
    refused("{\"input\":\"x\",\"tools\":[{\"type\":\"mcp\",\"server_label\":\"s\"}]}", 400, "tools",
            "'mcp'");
    refused("{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_image\",\"image_url\":"
            "\"http://x\"}]}]}", 400, "input[0]", "'input_image' parts are not supported");
    refused("{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_file\",\"file_id\":"
            "\"f\"}]}]}", 400, "input[0]", "'input_file'");
    refused("{\"input\":[{\"type\":\"item_reference\",\"id\":\"x\"}]}", 400, "input[0]",
            "'item_reference' items are not supported");
    refused("{\"input\":\"x\",\"conversation\":\"conv_1\"}", 400, "conversation", "not supported");
    refused("{\"input\":\"x\",\"tool_choice\":{\"type\":\"web_search_preview\"}}", 400,
            "tool_choice", "not supported");
    refused("{\"input\":\"x\",\"previous_response_id\":\"resp_nope\"}", 404,
            "previous_response_id", "not found");
    refused("{\"input\":\"x\",\"background\":true,\"store\":false}", 400, "background", "store");
    refused("{\"input\":\"x\",\"background\":true,\"stream\":true}", 400, "stream", "background");
    refused("{}", 400, "input", "'input'");
    refused("{\"input\":[]}", 400, "input", "'input'");
    refused("{\"input\":\"x\",\"max_output_tokens\":2.5}", 400, "max_output_tokens", "integer");
    refused("{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"n\"}}}",
            400, "text.format", "schema");
    refused("{\"input\":\"x\",\"metadata\":{\"k\":1}}", 400, "metadata", "strings");
    refused("{\"input\":\"x\",\"stream\":\"yes\"}", 400, "stream", "boolean");
    refused("{\"input\":[{\"role\":\"robot\",\"content\":\"x\"}]}", 400, "input[0]", "role");
    refused("{\"input\":[{\"type\":\"function_call\",\"name\":\"f\"}]}", 400, "input[0]",
            "call_id");
    /* the 404's code is OpenAI's */
    cJSON *chat;
    void *st;
    pgd_api_error err = {0};
    begin("resp_bad", "{\"input\":\"x\",\"previous_response_id\":\"resp_nope\"}", &chat, &st,
          &err);
    CHECK(!strcmp(err.code, "previous_response_not_found"));
}

static cJSON *completion(const char *content, const char *reasoning, const char *calls,
                         const char *finish) {
    char buf[2048];
    snprintf(buf, sizeof buf,
             "{\"id\":\"x\",\"object\":\"chat.completion\",\"choices\":[{\"index\":0,\"message\":"
             "{\"role\":\"assistant\",\"content\":%s,\"reasoning_content\":%s%s%s},"
             "\"finish_reason\":\"%s\"}],\"usage\":{\"prompt_tokens\":20,\"completion_tokens\":7,"
             "\"total_tokens\":27,\"prompt_tokens_details\":{\"cached_tokens\":16}}}",
             content, reasoning, calls ? ",\"tool_calls\":" : "", calls ? calls : "", finish);
    cJSON *o = cJSON_Parse(buf);
    CHECK(o != NULL);
    return o;
}

static const char CALLS[] =
    "[{\"id\":\"call_a\",\"type\":\"function\",\"function\":{\"name\":\"weather\","
    "\"arguments\":\"{\\\"city\\\":\\\"Oslo\\\"}\"}},{\"id\":\"call_b\",\"type\":\"function\","
    "\"function\":{\"name\":\"time\",\"arguments\":\"{}\"}}]";

/* complete() of a body: the Response object (parsed). */
static cJSON *run_complete(const char *id, const char *body, cJSON *comp) {
    cJSON *chat;
    void *st;
    pgd_api_error err;
    if (begin(id, body, &chat, &st, &err)) {
        fprintf(stderr, "  begin: %s\n", err.message);
        CHECK(0);
        cJSON_Delete(comp);
        return NULL;
    }
    char *js = D->complete(st, comp);
    cJSON *r = cJSON_Parse(js);
    free(js);
    cJSON_Delete(chat);
    cJSON_Delete(comp);
    D->free_state(st);
    return r;
}

static void test_complete(void) {
    cJSON *r = run_complete("resp_c1", "{\"input\":\"hi\",\"instructions\":\"I\",\"metadata\":"
                                       "{\"a\":\"b\"},\"temperature\":0.3}",
                            completion("\"Hello!\"", "\"Thinking.\"", CALLS, "tool_calls"));
    if (!r) return;
    CHECK(str_is(r, "id", "resp_c1") && str_is(r, "object", "response") &&
          str_is(r, "status", "completed") && str_is(r, "model", "served"));
    CHECK_EQ_INT(num(r, "created_at"), 123);
    CHECK(num(r, "completed_at") >= 123);
    CHECK(cJSON_IsNull(at(r, "error")) && cJSON_IsNull(at(r, "incomplete_details")));
    CHECK(str_is(r, "instructions", "I") && str_is(r, "metadata.a", "b"));
    CHECK(num(r, "temperature") == 0.3 && num(r, "top_p") == 1);
    CHECK(str_is(r, "tool_choice", "auto") && cJSON_IsTrue(at(r, "parallel_tool_calls")));
    CHECK(str_is(r, "text.format.type", "text") && cJSON_IsTrue(at(r, "store")));
    CHECK(!at(r, "output_text"));
    const cJSON *out = at(r, "output");
    CHECK_EQ_INT(cJSON_GetArraySize(out), 4);
    CHECK(str_is(out, "0.type", "reasoning") && str_is(out, "0.id", "rs_c1_0") &&
          str_is(out, "0.content.0.type", "reasoning_text") &&
          str_is(out, "0.content.0.text", "Thinking.") && cJSON_IsArray(at(out, "0.summary")));
    CHECK(str_is(out, "1.type", "message") && str_is(out, "1.id", "msg_c1_1") &&
          str_is(out, "1.role", "assistant") && str_is(out, "1.status", "completed") &&
          str_is(out, "1.content.0.type", "output_text") &&
          str_is(out, "1.content.0.text", "Hello!") &&
          cJSON_IsArray(at(out, "1.content.0.annotations")));
    CHECK(str_is(out, "2.type", "function_call") && str_is(out, "2.id", "fc_c1_2") &&
          str_is(out, "2.call_id", "call_a") && str_is(out, "2.name", "weather") &&
          str_is(out, "2.arguments", "{\"city\":\"Oslo\"}") && str_is(out, "2.status", "completed"));
    CHECK(str_is(out, "3.call_id", "call_b") && str_is(out, "3.id", "fc_c1_3"));
    CHECK_EQ_INT(num(r, "usage.input_tokens"), 20);
    CHECK_EQ_INT(num(r, "usage.input_tokens_details.cached_tokens"), 16);
    CHECK_EQ_INT(num(r, "usage.output_tokens"), 7);
    CHECK_EQ_INT(num(r, "usage.total_tokens"), 27);
    CHECK_EQ_INT(num(r, "usage.output_tokens_details.reasoning_tokens"), 0);
    /* stored as answered, with the conversation less the instructions */
    CHECK(cJSON_Compare(pgd_resp_store_get(store, "resp_c1"), r, true));
    const cJSON *conv = pgd_resp_store_messages(store, "resp_c1");
    CHECK_EQ_INT(cJSON_GetArraySize(conv), 2);
    CHECK(str_is(conv, "0.role", "user") && str_is(conv, "0.content", "hi"));
    CHECK(str_is(conv, "1.role", "assistant") && str_is(conv, "1.content", "Hello!") &&
          str_is(conv, "1.tool_calls.1.id", "call_b"));
    cJSON_Delete(r);

    /* only calls: no message item; no reasoning: none either */
    r = run_complete("resp_c2", "{\"input\":\"hi\"}", completion("null", "null", CALLS,
                                                                  "tool_calls"));
    CHECK_EQ_INT(cJSON_GetArraySize(at(r, "output")), 2);
    CHECK(str_is(r, "output.0.type", "function_call") && str_is(r, "output.0.id", "fc_c2_0"));
    conv = pgd_resp_store_messages(store, "resp_c2");
    CHECK(cJSON_IsNull(at(conv, "1.content")));
    cJSON_Delete(r);

    /* cut by max_output_tokens: incomplete */
    r = run_complete("resp_c3", "{\"input\":\"hi\",\"max_output_tokens\":7}",
                     completion("\"Hel\"", "null", NULL, "length"));
    CHECK(str_is(r, "status", "incomplete") &&
          str_is(r, "incomplete_details.reason", "max_output_tokens") &&
          cJSON_IsNull(at(r, "completed_at")) && str_is(r, "output.0.status", "incomplete"));
    CHECK_EQ_INT(num(r, "max_output_tokens"), 7);
    CHECK_EQ_INT(cJSON_GetArraySize(at(r, "output")), 1);
    cJSON_Delete(r);

    /* store: false keeps nothing, and says so */
    r = run_complete("resp_c4", "{\"input\":\"hi\",\"store\":false}",
                     completion("\"x\"", "null", NULL, "stop"));
    CHECK(cJSON_IsFalse(at(r, "store")) && pgd_resp_store_get(store, "resp_c4") == NULL);
    cJSON_Delete(r);

    /* an empty answer is still a message (output_text "") */
    r = run_complete("resp_c5", "{\"input\":\"hi\"}", completion("\"\"", "null", NULL, "stop"));
    CHECK_EQ_INT(cJSON_GetArraySize(at(r, "output")), 1);
    CHECK(str_is(r, "output.0.content.0.text", ""));
    cJSON_Delete(r);
}

/* previous_response_id: the stored conversation comes first, the old instructions do not; the
 * new response's conversation holds all three turns. */
static void test_chain(void) {
    cJSON *r = run_complete("resp_t1", "{\"input\":\"one\",\"instructions\":\"old\"}",
                            completion("\"A1\"", "null", NULL, "stop"));
    cJSON_Delete(r);
    cJSON *chat;
    void *st;
    pgd_api_error err;
    CHECK_EQ_INT(begin("resp_t2", "{\"input\":\"two\",\"previous_response_id\":\"resp_t1\","
                                  "\"instructions\":\"new\"}", &chat, &st, &err), 0);
    if (!chat) return;
    const cJSON *m = at(chat, "messages");
    CHECK_EQ_INT(cJSON_GetArraySize(m), 4);
    CHECK(str_is(m, "0.role", "system") && str_is(m, "0.content", "new"));
    CHECK(str_is(m, "1.content", "one") && str_is(m, "2.role", "assistant") &&
          str_is(m, "2.content", "A1") && str_is(m, "3.content", "two"));
    cJSON *comp = completion("\"A2\"", "null", NULL, "stop");
    char *js = D->complete(st, comp);
    r = cJSON_Parse(js);
    CHECK(str_is(r, "previous_response_id", "resp_t1") && str_is(r, "instructions", "new"));
    const cJSON *conv = pgd_resp_store_messages(store, "resp_t2");
    CHECK_EQ_INT(cJSON_GetArraySize(conv), 4);
    CHECK(str_is(conv, "0.content", "one") && str_is(conv, "3.content", "A2"));
    free(js);
    cJSON_Delete(r);
    cJSON_Delete(comp);
    cJSON_Delete(chat);
    D->free_state(st);
}

/* ---- streams ---- */

typedef struct { cJSON *ev[128]; char name[128][64]; int n; } events;

static void parse_sse(const char *s, events *e) {
    e->n = 0;
    while (s && *s && e->n < 128) {
        const char *end = strstr(s, "\n\n");
        CHECK(end != NULL && !strncmp(s, "event: ", 7));
        if (!end || strncmp(s, "event: ", 7)) return;
        const char *nl = strchr(s, '\n');
        snprintf(e->name[e->n], sizeof e->name[0], "%.*s", (int)(nl - s - 7), s + 7);
        CHECK(!strncmp(nl + 1, "data: ", 6));
        char *data = strndup(nl + 7, (size_t)(end - nl - 7));
        e->ev[e->n++] = cJSON_Parse(data);
        free(data);
        s = end + 2;
    }
}

static void events_free(events *e) {
    for (int i = 0; i < e->n; i++) cJSON_Delete(e->ev[i]);
    e->n = 0;
}

static cJSON *chunk(const char *delta, const char *finish) {
    char buf[2048];
    snprintf(buf, sizeof buf, "{\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"choices\":"
             "[{\"index\":0,\"delta\":%s,\"finish_reason\":%s}],\"usage\":null}", delta,
             finish ? finish : "null");
    return cJSON_Parse(buf);
}

static const char USAGE_CHUNK[] =
    "{\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{"
    "\"prompt_tokens\":20,\"completion_tokens\":7,\"total_tokens\":27,\"prompt_tokens_details\":"
    "{\"cached_tokens\":16}}}";

/* Streams the chunks (JSON texts, NULL-ended) through a request of body; returns its events. */
static void run_stream(const char *id, const char *body, const char *const *chunks, events *ev) {
    cJSON *chat;
    void *st;
    pgd_api_error err;
    ev->n = 0;
    if (begin(id, body, &chat, &st, &err)) {
        CHECK(0);
        return;
    }
    pgd_sbuf out = {0};
    D->stream_start(st, &out);
    for (int i = 0; chunks[i]; i++) {
        cJSON *c = cJSON_Parse(chunks[i]);
        CHECK(c != NULL);
        D->stream_chunk(st, c, &out);
        cJSON_Delete(c);
    }
    D->stream_end(st, &out);
    D->stream_end(st, &out); /* (a second end adds nothing) */
    CHECK(!out.oom);
    parse_sse(out.data, ev);
    pgd_sbuf_free(&out);
    cJSON_Delete(chat);
    D->free_state(st);
}

static char *chunk_text(const char *delta, const char *finish) {
    cJSON *c = chunk(delta, finish);
    char *s = cJSON_PrintUnformatted(c);
    cJSON_Delete(c);
    return s;
}

/* Checks every stream invariant: the name is the data's type, sequence numbers 0, 1, ...,
 * created first and the closing event last, deltas adding up to each item's final text, and
 * every item's id and index equal to the final response's. */
static void check_stream(events *ev, const char *last) {
    CHECK(ev->n >= 3);
    if (ev->n < 3) return;
    for (int i = 0; i < ev->n; i++) {
        CHECK(str_is(ev->ev[i], "type", ev->name[i]));
        CHECK_EQ_INT(num(ev->ev[i], "sequence_number"), i);
    }
    CHECK(!strcmp(ev->name[0], "response.created") && !strcmp(ev->name[1], "response.in_progress"));
    CHECK(str_is(ev->ev[0], "response.status", "in_progress"));
    CHECK_EQ_INT(cJSON_GetArraySize(at(ev->ev[0], "response.output")), 0);
    CHECK(!strcmp(ev->name[ev->n - 1], last));
    const cJSON *fin = at(ev->ev[ev->n - 1], "response");
    const cJSON *out = at(fin, "output");
    char acc[16][1024] = {{0}};
    int added = 0, done = 0;
    for (int i = 2; i < ev->n - 1; i++) {
        const cJSON *e = ev->ev[i];
        const char *n = ev->name[i];
        int k = (int)num(e, "output_index");
        CHECK(k >= 0 && k < cJSON_GetArraySize(out) && k < 16);
        if (k < 0 || k >= 16) continue;
        const cJSON *item = cJSON_GetArrayItem(out, k);
        const cJSON *iid = at(item, "id");
        if (at(e, "item_id")) CHECK(str_is(e, "item_id", iid ? iid->valuestring : "?"));
        if (at(e, "item")) CHECK(str_is(e, "item.id", iid ? iid->valuestring : "?"));
        if (!strcmp(n, "response.output_item.added")) {
            CHECK_EQ_INT(k, added++); /* items open in output order */
            CHECK(str_is(e, "item.status", "in_progress"));
        } else if (!strcmp(n, "response.output_item.done")) {
            CHECK_EQ_INT(k, done++);
            CHECK(cJSON_Compare(at(e, "item"), item, true)); /* the final item as it is */
        } else if (!strcmp(n, "response.output_text.delta") ||
                   !strcmp(n, "response.reasoning_text.delta") ||
                   !strcmp(n, "response.function_call_arguments.delta")) {
            strncat(acc[k], at(e, "delta")->valuestring, sizeof acc[k] - strlen(acc[k]) - 1);
        } else if (!strcmp(n, "response.output_text.done")) {
            CHECK(str_is(e, "text", acc[k]) && str_is(item, "content.0.text", acc[k]));
            CHECK(cJSON_IsArray(at(e, "logprobs")));
        } else if (!strcmp(n, "response.reasoning_text.done")) {
            CHECK(str_is(e, "text", acc[k]) && str_is(item, "content.0.text", acc[k]));
        } else if (!strcmp(n, "response.function_call_arguments.done")) {
            CHECK(str_is(e, "arguments", acc[k]) && str_is(item, "arguments", acc[k]));
        }
    }
    CHECK_EQ_INT(added, cJSON_GetArraySize(out));
    CHECK_EQ_INT(done, cJSON_GetArraySize(out));
}

static int find_event(const events *ev, const char *name, int from) {
    for (int i = from; i < ev->n; i++)
        if (!strcmp(ev->name[i], name)) return i;
    return -1;
}

static void test_stream(void) {
    char *c[16];
    int n = 0;
    c[n++] = chunk_text("{\"role\":\"assistant\"}", NULL);
    c[n++] = chunk_text("{\"reasoning_content\":\"Think\"}", NULL);
    c[n++] = chunk_text("{\"reasoning_content\":\"ing.\"}", NULL);
    c[n++] = chunk_text("{\"reasoning_content\":\" Done.\",\"content\":\"Hel\"}", NULL);
    c[n++] = chunk_text("{\"content\":\"\"}", NULL);
    c[n++] = chunk_text("{\"content\":\"lo!\"}", NULL);
    char calls[1024];
    snprintf(calls, sizeof calls, "{\"tool_calls\":%s}", CALLS);
    c[n++] = chunk_text(calls, "\"tool_calls\"");
    c[n++] = strdup(USAGE_CHUNK);
    c[n] = NULL;
    events ev;
    run_stream("resp_s1", "{\"input\":\"hi\",\"stream\":true}", (const char *const *)c, &ev);
    check_stream(&ev, "response.completed");
    const cJSON *fin = at(ev.ev[ev.n - 1], "response");
    CHECK(str_is(fin, "status", "completed"));
    CHECK(str_is(fin, "output.0.content.0.text", "Thinking. Done."));
    CHECK(str_is(fin, "output.1.content.0.text", "Hello!"));
    CHECK(str_is(fin, "output.2.call_id", "call_a") && str_is(fin, "output.3.name", "time"));
    CHECK_EQ_INT(num(fin, "usage.input_tokens_details.cached_tokens"), 16);
    CHECK_EQ_INT(num(fin, "usage.output_tokens"), 7);
    /* the reasoning closes before the message opens, the message before the calls */
    int rdone = find_event(&ev, "response.reasoning_text.done", 0);
    int madd = find_event(&ev, "response.output_item.added", rdone);
    int mdone = find_event(&ev, "response.output_text.done", 0);
    int fadd = find_event(&ev, "response.function_call_arguments.delta", 0);
    CHECK(rdone > 0 && madd > rdone && mdone > madd && fadd > mdone);
    CHECK(str_is(ev.ev[2], "item.type", "reasoning"));
    CHECK(str_is(ev.ev[3], "type", "response.content_part.added") &&
          str_is(ev.ev[3], "part.type", "reasoning_text"));
    CHECK(str_is(ev.ev[madd], "item.type", "message"));
    CHECK(str_is(ev.ev[madd + 1], "part.type", "output_text"));
    /* the stored object is the one the stream ended with */
    CHECK(cJSON_Compare(pgd_resp_store_get(store, "resp_s1"), fin, true));
    /* and the non-streamed answer has the same items (ids, texts, statuses) */
    cJSON *r = run_complete("resp_s1", "{\"input\":\"hi\"}",
                            completion("\"Hello!\"", "\"Thinking. Done.\"", CALLS, "tool_calls"));
    CHECK(cJSON_Compare(at(r, "output"), at(fin, "output"), true));
    CHECK(cJSON_Compare(at(r, "usage"), at(fin, "usage"), true));
    cJSON_Delete(r);
    events_free(&ev);
    for (int i = 0; i < n; i++) free(c[i]);

    /* plain text cut by max_output_tokens: incomplete */
    n = 0;
    c[n++] = chunk_text("{\"role\":\"assistant\",\"content\":\"\"}", NULL);
    c[n++] = chunk_text("{\"content\":\"A\"}", NULL);
    c[n++] = chunk_text("{\"content\":\"B\"}", NULL);
    c[n++] = chunk_text("{}", "\"length\"");
    c[n++] = strdup(USAGE_CHUNK);
    c[n] = NULL;
    run_stream("resp_s2", "{\"input\":\"hi\",\"stream\":true,\"max_output_tokens\":2}",
               (const char *const *)c, &ev);
    check_stream(&ev, "response.incomplete");
    fin = at(ev.ev[ev.n - 1], "response");
    CHECK(str_is(fin, "status", "incomplete") && str_is(fin, "output.0.content.0.text", "AB") &&
          str_is(fin, "output.0.status", "incomplete") &&
          str_is(fin, "incomplete_details.reason", "max_output_tokens"));
    const char *types[] = {"response.created", "response.in_progress",
                           "response.output_item.added", "response.content_part.added",
                           "response.output_text.delta", "response.output_text.delta",
                           "response.output_text.done", "response.content_part.done",
                           "response.output_item.done", "response.incomplete"};
    CHECK_EQ_INT(ev.n, 10);
    for (int i = 0; i < ev.n && i < 10; i++) CHECK(!strcmp(ev.name[i], types[i]));
    events_free(&ev);
    for (int i = 0; i < n; i++) free(c[i]);

    /* an empty answer still opens and closes its message */
    n = 0;
    c[n++] = chunk_text("{\"role\":\"assistant\",\"content\":\"\"}", NULL);
    c[n++] = chunk_text("{}", "\"stop\"");
    c[n++] = strdup(USAGE_CHUNK);
    c[n] = NULL;
    run_stream("resp_s3", "{\"input\":\"hi\",\"stream\":true}", (const char *const *)c, &ev);
    check_stream(&ev, "response.completed");
    CHECK_EQ_INT(cJSON_GetArraySize(at(ev.ev[ev.n - 1], "response.output")), 1);
    events_free(&ev);
    for (int i = 0; i < n; i++) free(c[i]);
}

static void test_stream_error(void) {
    cJSON *chat;
    void *st;
    pgd_api_error err;
    CHECK_EQ_INT(begin("resp_e1", "{\"input\":\"hi\",\"stream\":true}", &chat, &st, &err), 0);
    if (!chat) return;
    pgd_sbuf out = {0};
    D->stream_start(st, &out);
    cJSON *c = chunk("{\"content\":\"par\"}", NULL);
    D->stream_chunk(st, c, &out);
    cJSON_Delete(c);
    pgd_api_error e;
    pgd_api_error_set(&e, 503, "server_error", NULL, "shutting_down", "the server shut down");
    D->stream_error(st, &e, &out);
    D->stream_end(st, &out); /* (nothing after the failure) */
    events ev;
    parse_sse(out.data, &ev);
    CHECK(!strcmp(ev.name[ev.n - 1], "response.failed"));
    const cJSON *r = at(ev.ev[ev.n - 1], "response");
    CHECK(str_is(r, "status", "failed") && str_is(r, "error.code", "server_error") &&
          str_is(r, "error.message", "the server shut down"));
    CHECK(str_is(r, "output.0.content.0.text", "par") && str_is(r, "output.0.status",
                                                                   "incomplete"));
    for (int i = 0; i < ev.n; i++) CHECK_EQ_INT(num(ev.ev[i], "sequence_number"), i);
    CHECK(str_is(pgd_resp_store_get(store, "resp_e1"), "status", "failed"));
    events_free(&ev);
    pgd_sbuf_free(&out);
    cJSON_Delete(chat);
    D->free_state(st);
}

static void test_background(void) {
    cJSON *chat;
    void *st;
    pgd_api_error err;
    CHECK_EQ_INT(begin("resp_b1", "{\"input\":\"hi\",\"background\":true}", &chat, &st, &err), 0);
    if (!chat) return;
    CHECK(pgd_responses_background(st) && !D->streams(st));
    char *js = pgd_responses_snapshot(st);
    cJSON *r = cJSON_Parse(js);
    free(js);
    CHECK(str_is(r, "status", "queued") && cJSON_IsTrue(at(r, "background")));
    CHECK_EQ_INT(cJSON_GetArraySize(at(r, "output")), 0);
    CHECK(cJSON_Compare(pgd_resp_store_get(store, "resp_b1"), r, true));
    cJSON_Delete(r);
    pgd_responses_mark_running(st);
    CHECK(str_is(pgd_resp_store_get(store, "resp_b1"), "status", "in_progress"));
    CHECK(pgd_resp_store_messages(store, "resp_b1") != NULL); /* (kept from the snapshot) */
    js = pgd_responses_snapshot(st);
    r = cJSON_Parse(js);
    free(js);
    CHECK(str_is(r, "status", "in_progress"));
    cJSON_Delete(r);
    pgd_responses_mark_cancelled(st);
    js = pgd_responses_snapshot(st);
    r = cJSON_Parse(js);
    free(js);
    CHECK(str_is(r, "status", "cancelled"));
    CHECK(str_is(pgd_resp_store_get(store, "resp_b1"), "status", "cancelled"));
    cJSON_Delete(r);
    cJSON *comp = completion("\"partial\"", "null", NULL, "stop");
    js = D->complete(st, comp);
    r = cJSON_Parse(js);
    free(js);
    CHECK(str_is(r, "status", "cancelled") && cJSON_IsNull(at(r, "completed_at")));
    CHECK(str_is(r, "output.0.content.0.text", "partial"));
    CHECK(cJSON_Compare(pgd_resp_store_get(store, "resp_b1"), r, true));
    cJSON_Delete(r);
    cJSON_Delete(comp);
    cJSON_Delete(chat);
    D->free_state(st);

    /* a background run that completes is stored completed */
    r = run_complete("resp_b2", "{\"input\":\"hi\",\"background\":true}",
                     completion("\"done\"", "null", NULL, "stop"));
    CHECK(str_is(pgd_resp_store_get(store, "resp_b2"), "status", "completed"));
    cJSON_Delete(r);

    /* without a store (--responses-store-size 0): background is refused, store echoes false */
    pgd_resp_store *keep = store;
    store = NULL;
    refused("{\"input\":\"hi\",\"background\":true}", 400, "background", "store");
    refused("{\"input\":\"x\",\"previous_response_id\":\"resp_c1\"}", 404,
            "previous_response_id", "not found");
    r = run_complete("resp_b3", "{\"input\":\"hi\"}", completion("\"x\"", "null", NULL, "stop"));
    CHECK(cJSON_IsFalse(at(r, "store")));
    cJSON_Delete(r);
    store = keep;
}

int main(void) {
    store = pgd_resp_store_new(1 << 20);
    test_request();
    test_refused();
    test_complete();
    test_chain();
    test_stream();
    test_stream_error();
    test_background();
    pgd_resp_store_free(store);
    return test_report("test_responses");
}
