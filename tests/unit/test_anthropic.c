/* The Anthropic Messages dialect (src/api/anthropic.c) on hand-made bodies and chat answers:
 * the chat request a Messages body becomes (and that pgd_api_parse takes it), the 400s,
 * the message a chat.completion becomes, the event stream of a run of chunks, and errors. */
#include <string.h>

#include "api/dialect.h"
#include "test.h"

static const pgd_dialect *D = &pgd_dialect_anthropic;
static const pgd_dialect_env ENV = {.model = "m", .request_id = "msg_0001", .created = 1};
static const pgd_api_limits LIM = {.max_n = 8, .max_logprobs = 20, .max_tokens_limit = 100000,
                                   .max_prompts = 8, .max_prompt_tokens = 1000,
                                   .n_vocab = 1000};

/* begin() on body: the chat request (NULL on an error, then *err holds it). */
static cJSON *begin(const char *body, void **st, pgd_api_error *err) {
    cJSON *chat = NULL;
    *st = NULL;
    memset(err, 0, sizeof *err);
    if (D->begin(&ENV, body, strlen(body), &chat, st, err)) {
        CHECK(!chat && !*st);
        return NULL;
    }
    /* the chat path takes what the dialect makes */
    char *js = cJSON_PrintUnformatted(chat);
    pgd_api_request r;
    pgd_api_error e2;
    int rc = pgd_api_parse(js, strlen(js), true, &LIM, &r, &e2);
    if (rc) fprintf(stderr, "pgd_api_parse refused %s: %s\n", js, e2.message);
    CHECK(rc == 0);
    if (!rc) pgd_api_request_free(&r);
    free(js);
    return chat;
}

/* The item at path "a.b.0.c" (numbers index arrays), or NULL. */
static const cJSON *at(const cJSON *o, const char *path) {
    char buf[128];
    snprintf(buf, sizeof buf, "%s", path);
    const cJSON *x = o;
    for (char *k = strtok(buf, "."); k && x; k = strtok(NULL, "."))
        x = (*k >= '0' && *k <= '9') ? cJSON_GetArrayItem(x, atoi(k))
                                     : cJSON_GetObjectItemCaseSensitive(x, k);
    return x;
}

static const char *str(const cJSON *o, const char *path) {
    return cJSON_GetStringValue(at(o, path));
}

static bool eq(const char *a, const char *b) { return a && b && !strcmp(a, b); }

static void test_request(void) {
    void *st;
    pgd_api_error err;
    cJSON *c = begin("{\"model\":\"m\",\"max_tokens\":50,\"system\":[{\"type\":\"text\",\"text\":"
                     "\"Be \"},{\"type\":\"text\",\"text\":\"brief.\",\"cache_control\":{\"type\":"
                     "\"ephemeral\"}}],\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],"
                     "\"stop_sequences\":[\"END\"],\"temperature\":0.5,\"top_p\":0.9,\"top_k\":"
                     "40,\"metadata\":{\"user_id\":\"u1\"},\"some_future_field\":{\"x\":1}}",
                     &st, &err);
    CHECK(c != NULL);
    CHECK(eq(str(c, "model"), "m"));
    CHECK(eq(str(c, "messages.0.role"), "system") && eq(str(c, "messages.0.content"), "Be brief."));
    CHECK(eq(str(c, "messages.1.role"), "user") && eq(str(c, "messages.1.content"), "Hi"));
    CHECK_EQ_INT(cJSON_GetArraySize(at(c, "messages")), 2);
    CHECK_EQ_INT(cJSON_GetNumberValue(at(c, "max_tokens")), 50);
    CHECK(eq(str(c, "stop.0"), "END"));
    CHECK(cJSON_GetNumberValue(at(c, "temperature")) == 0.5);
    CHECK(cJSON_GetNumberValue(at(c, "top_p")) == 0.9);
    CHECK_EQ_INT(cJSON_GetNumberValue(at(c, "top_k")), 40);
    CHECK(eq(str(c, "user"), "u1"));
    CHECK(!at(c, "stream") && !at(c, "continue_final_message") && !at(c, "some_future_field"));
    CHECK(!D->streams(st));
    cJSON_Delete(c);
    D->free_state(st);

    /* a conversation with a tool round trip: ids map "toolu_X" -> "X" on both sides */
    c = begin("{\"model\":\"m\",\"max_tokens\":9,\"stream\":true,\"messages\":["
              "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Weather?\"}]},"
              "{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\",\"thinking\":\"hm\","
              "\"signature\":\"s\"},{\"type\":\"redacted_thinking\",\"data\":\"x\"},"
              "{\"type\":\"text\",\"text\":\"Looking.\"},{\"type\":\"tool_use\",\"id\":"
              "\"toolu_abc\",\"name\":\"get\",\"input\":{\"city\":\"Paris\"}}]},"
              "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":"
              "\"toolu_abc\",\"content\":[{\"type\":\"text\",\"text\":\"18C\"}]},{\"type\":"
              "\"tool_result\",\"tool_use_id\":\"other\",\"content\":\"boom\",\"is_error\":true},"
              "{\"type\":\"text\",\"text\":\"Thanks\"}]}],"
              "\"tools\":[{\"name\":\"get\",\"description\":\"d\",\"input_schema\":{\"type\":"
              "\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}],"
              "\"tool_choice\":{\"type\":\"auto\",\"disable_parallel_tool_use\":true},"
              "\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":2048}}",
              &st, &err);
    CHECK(c != NULL);
    CHECK(D->streams(st));
    CHECK(cJSON_IsTrue(at(c, "stream")));
    CHECK(eq(str(c, "messages.0.content"), "Weather?"));
    CHECK(eq(str(c, "messages.1.role"), "assistant"));
    CHECK(eq(str(c, "messages.1.content"), "Looking."));
    CHECK(eq(str(c, "messages.1.reasoning_content"), "hm"));
    CHECK(eq(str(c, "messages.1.tool_calls.0.id"), "abc"));
    CHECK(eq(str(c, "messages.1.tool_calls.0.type"), "function"));
    CHECK(eq(str(c, "messages.1.tool_calls.0.function.name"), "get"));
    CHECK(eq(str(c, "messages.1.tool_calls.0.function.arguments"), "{\"city\":\"Paris\"}"));
    CHECK(eq(str(c, "messages.2.role"), "tool") && eq(str(c, "messages.2.tool_call_id"), "abc"));
    CHECK(eq(str(c, "messages.2.content"), "18C"));
    CHECK(eq(str(c, "messages.3.tool_call_id"), "other"));
    CHECK(eq(str(c, "messages.3.content"), "Error: boom"));
    CHECK(eq(str(c, "messages.4.role"), "user") && eq(str(c, "messages.4.content"), "Thanks"));
    CHECK_EQ_INT(cJSON_GetArraySize(at(c, "messages")), 5);
    CHECK(eq(str(c, "tools.0.type"), "function") && eq(str(c, "tools.0.function.name"), "get"));
    CHECK(eq(str(c, "tools.0.function.description"), "d"));
    CHECK(eq(str(c, "tools.0.function.parameters.type"), "object"));
    CHECK(eq(str(c, "tool_choice"), "auto"));
    CHECK(cJSON_IsFalse(at(c, "parallel_tool_calls")));
    CHECK(cJSON_IsTrue(at(c, "chat_template_kwargs.enable_thinking")));
    cJSON_Delete(c);
    D->free_state(st);

    /* tool_choice any / tool / none; an assistant turn of calls only has null content */
    c = begin("{\"model\":\"m\",\"max_tokens\":9,\"messages\":[{\"role\":\"user\",\"content\":"
              "\"x\"},{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"t1\","
              "\"name\":\"f\",\"input\":{}}]},{\"role\":\"user\",\"content\":[{\"type\":"
              "\"tool_result\",\"tool_use_id\":\"t1\"}]}],\"tools\":[{\"name\":\"f\","
              "\"input_schema\":{\"type\":\"object\"}}],\"tool_choice\":{\"type\":\"any\"},"
              "\"thinking\":{\"type\":\"disabled\"}}",
              &st, &err);
    CHECK(c && eq(str(c, "tool_choice"), "required"));
    CHECK(c && cJSON_IsNull(at(c, "messages.1.content")));
    CHECK(c && eq(str(c, "messages.1.tool_calls.0.id"), "t1"));
    CHECK(c && eq(str(c, "messages.2.content"), "") && eq(str(c, "messages.2.role"), "tool"));
    CHECK(c && !at(c, "parallel_tool_calls"));
    CHECK(c && cJSON_IsFalse(at(c, "chat_template_kwargs.enable_thinking")));
    cJSON_Delete(c);
    D->free_state(st);
    c = begin("{\"model\":\"m\",\"max_tokens\":9,\"messages\":[{\"role\":\"user\",\"content\":"
              "\"x\"}],\"tools\":[{\"name\":\"f\",\"input_schema\":{}}],\"tool_choice\":{"
              "\"type\":\"tool\",\"name\":\"f\"}}",
              &st, &err);
    CHECK(c && eq(str(c, "tool_choice.type"), "function"));
    CHECK(c && eq(str(c, "tool_choice.function.name"), "f"));
    cJSON_Delete(c);
    D->free_state(st);
    c = begin("{\"model\":\"m\",\"max_tokens\":9,\"messages\":[{\"role\":\"user\",\"content\":"
              "\"x\"}],\"tools\":[{\"name\":\"f\",\"input_schema\":{}}],\"tool_choice\":{"
              "\"type\":\"none\"}}",
              &st, &err);
    CHECK(c && eq(str(c, "tool_choice"), "none"));
    cJSON_Delete(c);
    D->free_state(st);

    /* a final assistant turn is a prefill */
    c = begin("{\"model\":\"m\",\"max_tokens\":9,\"messages\":[{\"role\":\"user\",\"content\":"
              "\"x\"},{\"role\":\"assistant\",\"content\":\"The answer is (\"}]}",
              &st, &err);
    CHECK(c && cJSON_IsTrue(at(c, "continue_final_message")));
    CHECK(c && cJSON_IsFalse(at(c, "add_generation_prompt")));
    cJSON_Delete(c);
    D->free_state(st);
    /* ... but not one that ends in a call: a new turn follows it */
    c = begin("{\"model\":\"m\",\"max_tokens\":9,\"messages\":[{\"role\":\"user\",\"content\":"
              "\"x\"},{\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
              "{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"f\",\"input\":{}},{\"type\":"
              "\"text\",\"text\":\"b\"}]}]}",
              &st, &err);
    CHECK(c && !at(c, "continue_final_message") && eq(str(c, "messages.1.content"), "ab"));
    cJSON_Delete(c);
    D->free_state(st);
}

/* begin() refuses body with a 400 whose param is param and message holds what. */
static void refused(const char *body, const char *param, const char *what) {
    void *st;
    pgd_api_error err;
    cJSON *c = begin(body, &st, &err);
    CHECK(c == NULL);
    cJSON_Delete(c);
    if (st) D->free_state(st);
    CHECK_EQ_INT(err.status, 400);
    if (!eq(err.param, param) || !strstr(err.message, what))
        fprintf(stderr, "for %s: param '%s', message '%s'\n", body, err.param, err.message);
    CHECK(eq(err.param, param));
    CHECK(strstr(err.message, what) != NULL);
}

#define MSGS "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]"
static void test_refused(void) {
    refused("[1]", "", "JSON object");
    refused("{\"model\":\"m\"," MSGS "}", "max_tokens", "required");
    refused("{\"model\":\"m\",\"max_tokens\":\"5\"," MSGS "}", "max_tokens", "integer");
    refused("{\"model\":\"m\",\"max_tokens\":0," MSGS "}", "max_tokens", "at least 1");
    refused("{\"model\":\"m\",\"max_tokens\":1.5," MSGS "}", "max_tokens", "integer");
    refused("{\"model\":\"m\",\"max_tokens\":1e300," MSGS "}", "max_tokens", "integer");
    refused("{\"max_tokens\":5," MSGS "}", "model", "required");
    refused("{\"model\":7,\"max_tokens\":5," MSGS "}", "model", "string");
    refused("{\"model\":\"m\",\"max_tokens\":5}", "messages", "required");
    refused("{\"model\":\"m\",\"max_tokens\":5,\"messages\":[]}", "messages", "non-empty");
    refused("{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"system\",\"content\":"
            "\"x\"}]}",
            "messages[0]", "'user' or 'assistant'");
    refused("{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{"
            "\"type\":\"image\",\"source\":{\"type\":\"base64\",\"media_type\":\"image/png\","
            "\"data\":\"AA==\"}}]}]}",
            "messages[0].content[0]", "'image'");
    refused("{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{"
            "\"type\":\"document\",\"source\":{}}]}]}",
            "messages[0].content[0]", "'document'");
    refused("{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{"
            "\"type\":\"tool_result\",\"tool_use_id\":\"a\",\"content\":[{\"type\":\"image\"}]}"
            "]}]}",
            "messages[0].content[0].content", "'image'");
    refused("{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{"
            "\"type\":\"tool_use\",\"id\":\"a\",\"name\":\"f\",\"input\":{}}]}]}",
            "messages[0].content[0]", "'tool_use'");
    refused("{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"assistant\",\"content\":"
            "[{\"type\":\"tool_use\",\"id\":\"a\",\"name\":\"f\",\"input\":[]}]}]}",
            "messages[0].content[0]", "input must be an object");
    refused("{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":5}]}",
            "messages[0]", "string or an array");
    refused("{\"model\":\"m\",\"max_tokens\":5,\"system\":5," MSGS "}", "system", "string");
    refused("{\"model\":\"m\",\"max_tokens\":5,\"system\":[{\"type\":\"image\"}]," MSGS "}",
            "system", "'image'");
    refused("{\"model\":\"m\",\"max_tokens\":5,\"stop_sequences\":\"x\"," MSGS "}",
            "stop_sequences", "array");
    refused("{\"model\":\"m\",\"max_tokens\":5,\"stop_sequences\":[\"a\",\"b\",\"c\",\"d\",\"e\"],"
            MSGS "}",
            "stop_sequences", "at most 4");
    refused("{\"model\":\"m\",\"max_tokens\":5,\"temperature\":1.5," MSGS "}", "temperature",
            "between 0 and 1");
    refused("{\"model\":\"m\",\"max_tokens\":5,\"temperature\":\"hot\"," MSGS "}", "temperature",
            "number");
    refused("{\"model\":\"m\",\"max_tokens\":5,\"top_k\":-1," MSGS "}", "top_k", "non-negative");
    refused("{\"model\":\"m\",\"max_tokens\":5,\"stream\":\"yes\"," MSGS "}", "stream", "boolean");
    refused("{\"model\":\"m\",\"max_tokens\":5,\"metadata\":{\"user_id\":3}," MSGS "}", "metadata",
            "user_id");
    refused("{\"model\":\"m\",\"max_tokens\":5,\"thinking\":{\"type\":\"enabled\"}," MSGS "}",
            "thinking", "budget_tokens");
    refused("{\"model\":\"m\",\"max_tokens\":5,\"thinking\":{\"type\":\"enabled\",\"budget_tokens\""
            ":100}," MSGS "}",
            "thinking", "1024");
    refused("{\"model\":\"m\",\"max_tokens\":5,\"thinking\":{\"type\":\"much\"}," MSGS "}",
            "thinking", "'enabled'");
    refused("{\"model\":\"m\",\"max_tokens\":5,\"tools\":{}," MSGS "}", "tools", "array");
    refused("{\"model\":\"m\",\"max_tokens\":5,\"tools\":[{\"name\":\"f\"}]," MSGS "}", "tools[0]",
            "input_schema");
    refused("{\"model\":\"m\",\"max_tokens\":5,\"tools\":[{\"type\":\"web_search_20250305\","
            "\"name\":\"web_search\"}]," MSGS "}",
            "tools[0]", "web_search_20250305");
    refused("{\"model\":\"m\",\"max_tokens\":5,\"tool_choice\":\"auto\"," MSGS "}", "tool_choice",
            "object");
    refused("{\"model\":\"m\",\"max_tokens\":5,\"tool_choice\":{\"type\":\"any\"}," MSGS "}",
            "tool_choice", "no 'tools'");
    refused("{\"model\":\"m\",\"max_tokens\":5,\"tools\":[{\"name\":\"f\",\"input_schema\":{}}],"
            "\"tool_choice\":{\"type\":\"tool\"}," MSGS "}",
            "tool_choice", "'name'");
    refused("{\"model\":\"m\",\"max_tokens\":5,\"tools\":[{\"name\":\"f\",\"input_schema\":{}}],"
            "\"tool_choice\":{\"type\":\"any\"},\"stop_sequences\":[\"x\"]," MSGS "}",
            "stop_sequences", "forced tool call");
    refused("{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"},"
            "{\"role\":\"assistant\",\"content\":\"ends with space \"}]}",
            "messages", "trailing whitespace");
}

static cJSON *parse_body(char *s) { /* s taken */
    cJSON *o = cJSON_Parse(s);
    CHECK(o != NULL);
    free(s);
    return o;
}

static void *state_for(const char *extra) {
    char body[512];
    snprintf(body, sizeof body, "{\"model\":\"m\",\"max_tokens\":9%s," MSGS "}", extra);
    void *st;
    pgd_api_error err;
    cJSON *c = begin(body, &st, &err);
    CHECK(c != NULL);
    cJSON_Delete(c);
    return st;
}

static void test_complete(void) {
    void *st = state_for("");
    cJSON *comp = cJSON_Parse(
        "{\"id\":\"msg_0001\",\"object\":\"chat.completion\",\"model\":\"m\",\"choices\":[{"
        "\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"Hello\","
        "\"reasoning_content\":\"think\",\"tool_calls\":[{\"id\":\"call_msg_0001_0_0\",\"type\":"
        "\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"n\\\":"
        "12345678901234567890}\"}}]},\"finish_reason\":\"tool_calls\",\"stop_reason\":null}],"
        "\"usage\":{\"prompt_tokens\":20,\"completion_tokens\":7,\"total_tokens\":27,"
        "\"prompt_tokens_details\":{\"cached_tokens\":16}}}");
    char *s = D->complete(st, comp);
    /* the arguments' digits as written, not rounded through a double */
    CHECK(s && strstr(s, "\"input\":{\"n\":12345678901234567890}"));
    cJSON *m = parse_body(s);
    CHECK(eq(str(m, "id"), "msg_0001") && eq(str(m, "type"), "message"));
    CHECK(eq(str(m, "role"), "assistant") && eq(str(m, "model"), "m"));
    CHECK_EQ_INT(cJSON_GetArraySize(at(m, "content")), 3);
    CHECK(eq(str(m, "content.0.type"), "thinking") && eq(str(m, "content.0.thinking"), "think"));
    CHECK(eq(str(m, "content.0.signature"), ""));
    CHECK(eq(str(m, "content.1.type"), "text") && eq(str(m, "content.1.text"), "Hello"));
    CHECK(eq(str(m, "content.2.type"), "tool_use") && eq(str(m, "content.2.name"), "f"));
    CHECK(eq(str(m, "content.2.id"), "toolu_msg_0001_0_0"));
    CHECK(cJSON_IsObject(at(m, "content.2.input")));
    CHECK(eq(str(m, "stop_reason"), "tool_use") && cJSON_IsNull(at(m, "stop_sequence")));
    /* Anthropic's input_tokens leave out the cache's: the three add up to the prompt */
    CHECK_EQ_INT(cJSON_GetNumberValue(at(m, "usage.input_tokens")), 4);
    CHECK_EQ_INT(cJSON_GetNumberValue(at(m, "usage.cache_read_input_tokens")), 16);
    CHECK_EQ_INT(cJSON_GetNumberValue(at(m, "usage.cache_creation_input_tokens")), 0);
    CHECK_EQ_INT(cJSON_GetNumberValue(at(m, "usage.output_tokens")), 7);
    cJSON_Delete(m);
    cJSON_Delete(comp);

    /* the stop reasons: a stop string (vLLM's stop_reason), max_tokens, end_turn */
    static const struct {
        const char *finish, *sr, *want, *seq;
    } cases[] = {{"stop", "\"END\"", "stop_sequence", "END"},
                 {"stop", "null", "end_turn", NULL},
                 {"stop", "2", "end_turn", NULL},
                 {"length", "null", "max_tokens", NULL}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char buf[512];
        snprintf(buf, sizeof buf,
                 "{\"choices\":[{\"message\":{\"role\":\"assistant\",\"content\":\"\"},"
                 "\"finish_reason\":\"%s\",\"stop_reason\":%s}],\"usage\":{"
                 "\"prompt_tokens\":3,\"completion_tokens\":0}}",
                 cases[i].finish, cases[i].sr);
        comp = cJSON_Parse(buf);
        m = parse_body(D->complete(st, comp));
        CHECK(eq(str(m, "stop_reason"), cases[i].want));
        if (cases[i].seq) CHECK(eq(str(m, "stop_sequence"), cases[i].seq));
        else CHECK(cJSON_IsNull(at(m, "stop_sequence")));
        CHECK_EQ_INT(cJSON_GetArraySize(at(m, "content")), 0); /* empty text: no block */
        CHECK_EQ_INT(cJSON_GetNumberValue(at(m, "usage.input_tokens")), 3);
        CHECK_EQ_INT(cJSON_GetNumberValue(at(m, "usage.cache_read_input_tokens")), 0);
        cJSON_Delete(m);
        cJSON_Delete(comp);
    }
    /* a named tool_choice's call ends with finish_reason "stop" on the chat path (as OpenAI):
     * Anthropic's stop_reason is tool_use all the same */
    comp = cJSON_Parse("{\"choices\":[{\"message\":{\"role\":\"assistant\",\"content\":null,"
                       "\"tool_calls\":[{\"id\":\"call_x\",\"type\":\"function\",\"function\":{"
                       "\"name\":\"f\",\"arguments\":\"{}\"}}]},\"finish_reason\":\"stop\","
                       "\"stop_reason\":null}],\"usage\":{\"prompt_tokens\":3,"
                       "\"completion_tokens\":2}}");
    m = parse_body(D->complete(st, comp));
    CHECK(eq(str(m, "stop_reason"), "tool_use") && eq(str(m, "content.0.id"), "toolu_x"));
    CHECK_EQ_INT(cJSON_GetArraySize(at(m, "content")), 1);
    cJSON_Delete(m);
    cJSON_Delete(comp);
    D->free_state(st);
}

/* The SSE text as its events: [{"event": name, "data": {...}}, ...]; each frame exactly
 * "event: NAME\ndata: JSON\n\n" with data.type == NAME. */
static cJSON *events_of(const char *s) {
    cJSON *arr = cJSON_CreateArray();
    while (s && *s) {
        const char *nl = strchr(s, '\n');
        CHECK(!strncmp(s, "event: ", 7) && nl);
        if (!nl || strncmp(nl + 1, "data: ", 6)) {
            CHECK(0);
            break;
        }
        const char *end = strstr(nl + 7, "\n\n");
        CHECK(end != NULL);
        if (!end) break;
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)(nl - s - 7), s + 7);
        cJSON *d = cJSON_ParseWithLength(nl + 7, (size_t)(end - nl - 7));
        CHECK(d && eq(str(d, "type"), name));
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "event", name);
        cJSON_AddItemToObject(e, "data", d);
        cJSON_AddItemToArray(arr, e);
        s = end + 2;
    }
    return arr;
}

static void chunk(void *st, pgd_sbuf *out, const char *json) {
    cJSON *c = cJSON_Parse(json);
    CHECK(c != NULL);
    D->stream_chunk(st, c, out);
    cJSON_Delete(c);
}

#define CHUNK(delta, fin, sr)                                                                    \
    "{\"id\":\"msg_0001\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,"       \
    "\"delta\":" delta ",\"finish_reason\":" fin ",\"stop_reason\":" sr "}],\"usage\":null}"

static void test_stream(void) {
    void *st = state_for(",\"stream\":true");
    pgd_sbuf out = {0};
    D->stream_start(st, &out);
    chunk(st, &out, CHUNK("{\"role\":\"assistant\",\"content\":\"\"}", "null", "null"));
    chunk(st, &out, CHUNK("{\"reasoning_content\":\"Let \"}", "null", "null"));
    chunk(st, &out, CHUNK("{\"reasoning_content\":\"me.\"}", "null", "null"));
    chunk(st, &out, CHUNK("{\"content\":\"He\"}", "null", "null"));
    chunk(st, &out, CHUNK("{\"content\":\"llo\"}", "null", "null"));
    chunk(st, &out, CHUNK("{\"tool_calls\":[{\"index\":0,\"id\":\"call_a\",\"type\":\"function\","
                          "\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"x\\\":1}\"}},{"
                          "\"index\":1,\"id\":\"call_b\",\"type\":\"function\",\"function\":{"
                          "\"name\":\"g\",\"arguments\":\"{}\"}}]}",
                          "\"tool_calls\"", "null"));
    chunk(st, &out, "{\"id\":\"msg_0001\",\"choices\":[],\"usage\":{\"prompt_tokens\":30,"
                    "\"completion_tokens\":12,\"prompt_tokens_details\":{\"cached_tokens\":8}}}");
    D->stream_end(st, &out);
    CHECK(!out.oom);
    cJSON *ev = events_of(out.data);
    static const char *const want[] = {
        "message_start",       "ping",
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_delta",
        "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_stop",
        "message_delta",       "message_stop"};
    int n = (int)(sizeof want / sizeof want[0]);
    CHECK_EQ_INT(cJSON_GetArraySize(ev), n);
    for (int i = 0; i < n && i < cJSON_GetArraySize(ev); i++) {
        const char *got = str(cJSON_GetArrayItem(ev, i), "event");
        if (!eq(got, want[i])) fprintf(stderr, "event %d: %s, want %s\n", i, got, want[i]);
        CHECK(eq(got, want[i]));
    }
    const cJSON *e0 = at(ev, "0.data.message");
    CHECK(eq(str(e0, "id"), "msg_0001") && eq(str(e0, "role"), "assistant"));
    CHECK(cJSON_IsArray(at(e0, "content")) && cJSON_GetArraySize(at(e0, "content")) == 0);
    CHECK(cJSON_IsNull(at(e0, "stop_reason")) && cJSON_IsNumber(at(e0, "usage.input_tokens")));
    /* thinking: index 0, its deltas, then a signature_delta before its stop */
    CHECK(eq(str(ev, "2.data.content_block.type"), "thinking"));
    CHECK(eq(str(ev, "2.data.content_block.thinking"), ""));
    CHECK_EQ_INT(cJSON_GetNumberValue(at(ev, "2.data.index")), 0);
    CHECK(eq(str(ev, "3.data.delta.type"), "thinking_delta"));
    CHECK(eq(str(ev, "3.data.delta.thinking"), "Let "));
    CHECK(eq(str(ev, "4.data.delta.thinking"), "me."));
    CHECK(eq(str(ev, "5.data.delta.type"), "signature_delta"));
    CHECK_EQ_INT(cJSON_GetNumberValue(at(ev, "6.data.index")), 0);
    /* text: index 1 */
    CHECK(eq(str(ev, "7.data.content_block.type"), "text"));
    CHECK_EQ_INT(cJSON_GetNumberValue(at(ev, "7.data.index")), 1);
    CHECK(eq(str(ev, "8.data.delta.type"), "text_delta") && eq(str(ev, "8.data.delta.text"), "He"));
    CHECK(eq(str(ev, "9.data.delta.text"), "llo"));
    CHECK_EQ_INT(cJSON_GetNumberValue(at(ev, "10.data.index")), 1);
    /* the calls: indexes 2 and 3, empty input at the start and the JSON in one delta */
    CHECK(eq(str(ev, "11.data.content_block.type"), "tool_use"));
    CHECK(eq(str(ev, "11.data.content_block.id"), "toolu_a"));
    CHECK(eq(str(ev, "11.data.content_block.name"), "f"));
    CHECK(cJSON_IsObject(at(ev, "11.data.content_block.input")) &&
          !at(ev, "11.data.content_block.input")->child);
    CHECK(eq(str(ev, "12.data.delta.type"), "input_json_delta"));
    CHECK(eq(str(ev, "12.data.delta.partial_json"), "{\"x\":1}"));
    CHECK_EQ_INT(cJSON_GetNumberValue(at(ev, "13.data.index")), 2);
    CHECK(eq(str(ev, "14.data.content_block.id"), "toolu_b"));
    CHECK_EQ_INT(cJSON_GetNumberValue(at(ev, "14.data.index")), 3);
    CHECK_EQ_INT(cJSON_GetNumberValue(at(ev, "16.data.index")), 3);
    CHECK(eq(str(ev, "17.data.delta.stop_reason"), "tool_use"));
    CHECK(cJSON_IsNull(at(ev, "17.data.delta.stop_sequence")));
    CHECK_EQ_INT(cJSON_GetNumberValue(at(ev, "17.data.usage.output_tokens")), 12);
    CHECK_EQ_INT(cJSON_GetNumberValue(at(ev, "17.data.usage.input_tokens")), 22);
    CHECK_EQ_INT(cJSON_GetNumberValue(at(ev, "17.data.usage.cache_read_input_tokens")), 8);
    cJSON_Delete(ev);
    pgd_sbuf_free(&out);
    D->free_state(st);

    /* a stop sequence, text only; nothing after the end */
    st = state_for(",\"stream\":true,\"stop_sequences\":[\"##\"]");
    D->stream_start(st, &out);
    chunk(st, &out, CHUNK("{\"role\":\"assistant\",\"content\":\"\"}", "null", "null"));
    chunk(st, &out, CHUNK("{\"content\":\"ab\"}", "null", "null"));
    chunk(st, &out, CHUNK("{}", "\"stop\"", "\"##\""));
    chunk(st, &out, "{\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2}}");
    D->stream_end(st, &out);
    size_t len = out.len;
    D->stream_end(st, &out);
    pgd_api_error e = {.status = 503};
    snprintf(e.message, sizeof e.message, "late");
    D->stream_error(st, &e, &out);
    CHECK_EQ_INT(out.len, len);
    ev = events_of(out.data);
    CHECK_EQ_INT(cJSON_GetArraySize(ev), 7);
    CHECK(eq(str(ev, "4.event"), "content_block_stop"));
    CHECK(eq(str(ev, "5.data.delta.stop_reason"), "stop_sequence"));
    CHECK(eq(str(ev, "5.data.delta.stop_sequence"), "##"));
    CHECK_EQ_INT(cJSON_GetNumberValue(at(ev, "5.data.usage.input_tokens")), 5);
    cJSON_Delete(ev);
    pgd_sbuf_free(&out);
    D->free_state(st);

    /* a call under finish_reason "stop" (a named tool_choice): tool_use */
    st = state_for(",\"stream\":true");
    D->stream_start(st, &out);
    chunk(st, &out, CHUNK("{\"tool_calls\":[{\"index\":0,\"id\":\"call_a\",\"type\":\"function\","
                          "\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]}",
                          "\"stop\"", "null"));
    D->stream_end(st, &out);
    ev = events_of(out.data);
    CHECK_EQ_INT(cJSON_GetArraySize(ev), 7);
    CHECK(eq(str(ev, "5.data.delta.stop_reason"), "tool_use"));
    cJSON_Delete(ev);
    pgd_sbuf_free(&out);
    D->free_state(st);

    /* an empty answer: no block at all; max_tokens */
    st = state_for(",\"stream\":true");
    D->stream_start(st, &out);
    chunk(st, &out, CHUNK("{\"role\":\"assistant\",\"content\":\"\"}", "null", "null"));
    chunk(st, &out, CHUNK("{}", "\"length\"", "null"));
    D->stream_end(st, &out);
    ev = events_of(out.data);
    CHECK_EQ_INT(cJSON_GetArraySize(ev), 4);
    CHECK(eq(str(ev, "2.event"), "message_delta"));
    CHECK(eq(str(ev, "2.data.delta.stop_reason"), "max_tokens"));
    cJSON_Delete(ev);
    pgd_sbuf_free(&out);
    D->free_state(st);

    /* an error mid-stream: one error event, and no closing events after it */
    st = state_for(",\"stream\":true");
    D->stream_start(st, &out);
    chunk(st, &out, CHUNK("{\"content\":\"a\"}", "null", "null"));
    D->stream_error(st, &e, &out);
    D->stream_end(st, &out);
    ev = events_of(out.data);
    CHECK_EQ_INT(cJSON_GetArraySize(ev), 5);
    CHECK(eq(str(ev, "4.event"), "error"));
    CHECK(eq(str(ev, "4.data.error.type"), "overloaded_error"));
    CHECK(eq(str(ev, "4.data.error.message"), "late"));
    cJSON_Delete(ev);
    pgd_sbuf_free(&out);
    D->free_state(st);
}

static void test_errors(void) {
    static const struct {
        int status;
        const char *type;
    } map[] = {{400, "invalid_request_error"}, {401, "authentication_error"},
               {403, "permission_error"},      {404, "not_found_error"},
               {413, "request_too_large"},     {429, "rate_limit_error"},
               {500, "api_error"},             {503, "overloaded_error"},
               {529, "overloaded_error"},      {405, "invalid_request_error"}};
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++) {
        pgd_api_error e;
        pgd_api_error_set(&e, map[i].status, "whatever_error", "p", NULL, "msg %d", map[i].status);
        cJSON *o = parse_body(D->error_json(&e));
        CHECK(eq(str(o, "type"), "error"));
        CHECK(eq(str(o, "error.type"), map[i].type));
        char want[32];
        snprintf(want, sizeof want, "msg %d", map[i].status);
        CHECK(eq(str(o, "error.message"), want));
        cJSON_Delete(o);
    }
}

int main(void) {
    test_request();
    test_refused();
    test_complete();
    test_stream();
    test_errors();
    return test_report("test_anthropic");
}
