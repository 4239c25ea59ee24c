/* Tool-call parsing in the hermes format (src/api/tool_calls.c), as vLLM's hermes parser reads
 * it: calls between <tool_call> tags, an unclosed last call running to the end, content the text
 * before the first call, and no calls at all when one call's JSON is not {"name", "arguments"}.
 * Also the streaming hold and the schema of a call. */
#include <string.h>

#include "api/reasoning.h"
#include "api/tool_calls.h"
#include "sample/json_grammar.h"
#include "test.h"

static cJSON *parse(const char *t, size_t *content_len) {
    return pgd_tool_calls_parse(PGD_TOOLS_HERMES, t, strlen(t), "x", content_len);
}

static const char *fn(const cJSON *calls, int i, const char *field) {
    const cJSON *f = cJSON_GetObjectItem(cJSON_GetArrayItem(calls, i), "function");
    return cJSON_GetStringValue(cJSON_GetObjectItem(f, field));
}

static void test_parse(void) {
    size_t cl;
    cJSON *c = parse("Let me look.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n"
                     "</tool_call>\n<tool_call>{\"name\": \"g\", \"arguments\": {}}</tool_call>",
                     &cl);
    CHECK(c && cJSON_GetArraySize(c) == 2);
    CHECK_EQ_INT(cl, strlen("Let me look."));
    CHECK(!strcmp(fn(c, 0, "name"), "f") && !strcmp(fn(c, 0, "arguments"), "{\"a\":1}"));
    CHECK(!strcmp(fn(c, 1, "name"), "g") && !strcmp(fn(c, 1, "arguments"), "{}"));
    CHECK(!strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetArrayItem(c, 1), "id")),
                  "call_x_1"));
    cJSON_Delete(c);
    c = parse("<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": [1]}}", &cl); /* unclosed */
    CHECK(c && cJSON_GetArraySize(c) == 1 && cl == 0);
    cJSON_Delete(c);
    /* the closer inside a string of the call does not cut it */
    c = parse("<tool_call>{\"name\": \"f\", \"arguments\": {\"s\": \"</tool_call>\"}}</tool_call>",
              &cl);
    CHECK(c && !strcmp(fn(c, 0, "arguments"), "{\"s\":\"</tool_call>\"}"));
    cJSON_Delete(c);
    /* arguments as a string that holds an object: kept as that string */
    c = parse("<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}</tool_call>", &cl);
    CHECK(c && !strcmp(fn(c, 0, "arguments"), "{\"a\": 1}"));
    cJSON_Delete(c);
    /* numbers come back as written where a double holds them */
    c = parse("<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": 0.30000000000000004}}"
              "</tool_call>", &cl);
    CHECK(c && !strcmp(fn(c, 0, "arguments"), "{\"x\":0.30000000000000004}"));
    cJSON_Delete(c);
    static const char *const none[] = {"plain text", "<tool_call>{\"name\": \"f\"}</tool_call>",
                                       "<tool_call>{\"arguments\": {}}</tool_call>",
                                       "<tool_call>{\"name\": \"f\", \"arguments\": {</tool_call>",
                                       "<tool_call>{\"name\": 3, \"arguments\": {}}</tool_call>",
                                       "<tool_call>[1]</tool_call>", "",
                                       "<tool_call>{\"name\": \"f\", \"arguments\": {}} x",
                                       "<tool_call>{\"name\": \"f\", \"arguments\": 5}",
                                       "<tool_call>{\"name\": \"f\", \"arguments\": \"[1]\"}",
                                       "<tool_call>{\"name\": \"f\\u0000\", \"arguments\": {}}"};
    for (size_t i = 0; i < sizeof none / sizeof none[0]; i++) {
        c = parse(none[i], &cl);
        CHECK(c == NULL);
        CHECK_EQ_INT(cl, strlen(none[i])); /* all of it is content */
    }
}

static size_t safe(const char *t, bool *opened) {
    return pgd_tool_calls_stream_safe(PGD_TOOLS_HERMES, t, strlen(t), 0, opened);
}

static void test_stream_safe(void) {
    bool opened;
    CHECK_EQ_INT(safe("Hello", &opened), 5);
    CHECK(!opened);
    /* held: an ending that may start the opener, and the whitespace before it (which the
     * content drops when a call follows) */
    CHECK_EQ_INT(safe("Hello <tool_c", &opened), 5);
    CHECK(!opened);
    CHECK_EQ_INT(safe("a <b", &opened), 4); /* not the opener's start */
    CHECK_EQ_INT(safe("a <", &opened), 1);
    CHECK_EQ_INT(safe("Ok.\n", &opened), 3);
    CHECK_EQ_INT(safe("ab<tool_call>{", &opened), 2);
    CHECK(opened);
    /* a stream's calls, each told what the last one saw: the same answers as a whole scan of
     * each prefix, up to the first that opens (an opener split across the pieces included) */
    static const char *const texts[] = {"Sure. \n\n<tool_call>\n{\"a\"", "x<tool_cal<tool_call>",
                                        "no call at all, just text <tool_c"};
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        size_t len = strlen(texts[i]), known = 0;
        for (size_t n = 0; n <= len; n++) {
            bool o1, o2;
            size_t a = pgd_tool_calls_stream_safe(PGD_TOOLS_HERMES, texts[i], n, known, &o1);
            size_t b = pgd_tool_calls_stream_safe(PGD_TOOLS_HERMES, texts[i], n, 0, &o2);
            CHECK(a == b && o1 == o2);
            known = n;
            if (o1) break;
        }
    }
}

static void test_schema(void) {
    cJSON *tools = cJSON_Parse(
        "[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": "
        "\"object\", \"properties\": {\"p\": {\"$ref\": \"#/$defs/P\"}}, \"$defs\": {\"P\": "
        "{\"type\": \"integer\"}}}}}, {\"type\": \"function\", \"function\": {\"name\": \"g\"}}]");
    const char *why = NULL;
    char *one = pgd_tool_call_schema(PGD_TOOLS_HERMES, tools, "f", &why);
    char *any = pgd_tool_call_schema(PGD_TOOLS_HERMES, tools, NULL, &why);
    CHECK(one && any && !pgd_tool_call_schema(PGD_TOOLS_HERMES, tools, "h", &why) && why);
    pgd_json_schema sc;
    char msg[200];
    /* f's $ref resolves once its $defs sit at the root of the call's schema */
    CHECK(one && pgd_json_schema_compile(one, strlen(one), &sc, msg, sizeof msg) == 0);
    pgd_json_state st;
    pgd_json_init_schema(&st, &sc);
    const char *ok = "{\"name\": \"f\", \"arguments\": {\"p\": 3}}";
    CHECK(pgd_json_feed(&st, ok, strlen(ok)) && pgd_json_complete(&st));
    pgd_json_init_schema(&st, &sc);
    CHECK(!pgd_json_feed(&st, "{\"name\": \"g\"", 12)); /* not the named function */
    pgd_json_init_schema(&st, &sc);
    CHECK(!pgd_json_feed(&st, "{\"name\": \"f\", \"arguments\": {\"p\": 1.5}}", 35));
    pgd_json_schema_free(&sc);
    CHECK(any && pgd_json_schema_compile(any, strlen(any), &sc, msg, sizeof msg) == 0);
    pgd_json_init_schema(&st, &sc);
    const char *g = "{\"name\": \"g\", \"arguments\": {\"z\": [1]}}";
    CHECK(pgd_json_feed(&st, g, strlen(g)) && pgd_json_complete(&st));
    pgd_json_init_schema(&st, &sc); /* each function's own parameters, once its name is read */
    const char *f = "{\"name\": \"f\", \"arguments\": {\"p\": 1.5}}";
    CHECK(!pgd_json_feed(&st, f, strlen(f)));
    pgd_json_init_schema(&st, &sc); /* the name first */
    CHECK(!pgd_json_feed(&st, "{\"arguments\"", 12));
    pgd_json_schema_free(&sc);
    free(one);
    free(any);
    cJSON_Delete(tools);
}

static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    return buf;
}

static void test_llama3(void) {
    size_t cl;
    const char *one = " {\"name\": \"f\", \"parameters\": {\"a\": 1}}";
    cJSON *c = pgd_tool_calls_parse(PGD_TOOLS_LLAMA3, one, strlen(one), "x", &cl);
    CHECK(c && cJSON_GetArraySize(c) == 1 && cl == 0);
    CHECK(c && !strcmp(fn(c, 0, "arguments"), "{\"a\":1}"));
    cJSON_Delete(c);
    const char *two = "<|python_tag|>{\"name\": \"f\", \"parameters\": {}}; "
                      "{\"name\": \"g\", \"arguments\": {\"b\": true}}";
    c = pgd_tool_calls_parse(PGD_TOOLS_LLAMA3, two, strlen(two), "x", &cl);
    CHECK(c && cJSON_GetArraySize(c) == 2 && !strcmp(fn(c, 1, "name"), "g"));
    cJSON_Delete(c);
    static const char *const none[] = {"Hello {\"name\": \"f\", \"parameters\": {}}",
                                       "{\"name\": \"f\", \"parameters\": {}} and more",
                                       "{\"a\": 1}", "",
                                       ("<tool_call>{\"name\": \"f\", "
                                        "\"arguments\": {}}</tool_call>")};
    for (size_t i = 0; i < sizeof none / sizeof none[0]; i++) {
        c = pgd_tool_calls_parse(PGD_TOOLS_LLAMA3, none[i], strlen(none[i]), "x", &cl);
        CHECK(c == NULL && cl == strlen(none[i]));
    }
    bool opened;
    static const struct { const char *t; size_t safe; bool opened; } cases[] = {
        {"", 0, false}, {"  ", 0, false}, {"<|pyth", 0, false}, {" {", 0, true},
        {"<|python_tag|>", 0, true}, {"Hello", 5, false}, {"<|x", 3, false}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t n = pgd_tool_calls_stream_safe(PGD_TOOLS_LLAMA3, cases[i].t, strlen(cases[i].t),
                                              0, &opened);
        CHECK(n == cases[i].safe && opened == cases[i].opened);
    }
    /* the chat templates ask for these formats */
    static const struct { const char *file; pgd_tool_format f; } tmpl[] = {
        {"tests/data/chat-templates/Qwen-Qwen2.5-7B-Instruct.jinja", PGD_TOOLS_HERMES},
        {"tests/data/chat-templates/meta-llama-Llama-3.1-8B-Instruct.jinja", PGD_TOOLS_LLAMA3},
        {"tests/data/chat-templates/meta-llama-Llama-3.2-3B-Instruct.jinja", PGD_TOOLS_LLAMA3},
        {"tests/data/chat-templates/mistralai-Mistral-Nemo-Instruct-2407.jinja",
         PGD_TOOLS_MISTRAL},
        {"tests/data/chat-templates/google-gemma-2-2b-it.jinja", PGD_TOOLS_NONE}};
    for (size_t i = 0; i < sizeof tmpl / sizeof tmpl[0]; i++) {
        const char *t = read_text(tmpl[i].file);
        CHECK(t && pgd_tool_format_of_template(t) == tmpl[i].f);
    }
}

/* One scan: want_r / want_c are the reasoning and content texts ("-": none; content runs to
 * the end of t). */
static void scan_case(pgd_reasoning_format f, const char *t, bool done, const char *want_r,
                      const char *want_c) {
    pgd_reasoning_span sp;
    size_t n = strlen(t);
    pgd_reasoning_scan(f, t, n, done, 0, &sp);
    bool r_ok = strcmp(want_r, "-") ? sp.thinking && sp.r_end - sp.r_off == strlen(want_r) &&
                                          !memcmp(t + sp.r_off, want_r, strlen(want_r))
                                    : !sp.thinking;
    bool c_ok = strcmp(want_c, "-") ? sp.content && !strcmp(t + sp.c_off, want_c) : !sp.content;
    if (!r_ok || !c_ok)
        fprintf(stderr, "reasoning scan of '%s' (format %d, done %d)\n", t, f, done);
    CHECK(r_ok && c_ok);
}

/* The rule of reasoning.h, case by case (vLLM's deepseek_r1 and qwen3 parsers). */
static void test_reasoning(void) {
    pgd_reasoning_format r1 = PGD_REASONING_DEEPSEEK_R1, q3 = PGD_REASONING_QWEN3;
    CHECK_EQ_INT(pgd_reasoning_format_of("deepseek_r1"), r1);
    CHECK_EQ_INT(pgd_reasoning_format_of("qwen3"), q3);
    CHECK_EQ_INT(pgd_reasoning_format_of("none"), PGD_REASONING_NONE);
    CHECK_EQ_INT(pgd_reasoning_format_of("r1"), -1);
    scan_case(PGD_REASONING_NONE, "<think>a</think>b", true, "-", "<think>a</think>b");
    /* deepseek_r1: the template opened it */
    scan_case(r1, "abc</think>xyz", true, "abc", "xyz");
    scan_case(r1, "<think>abc</think>xyz", true, "abc", "xyz");
    scan_case(r1, " \n<think>abc</think>", true, "abc", "");
    scan_case(r1, "abc", true, "abc", "-");
    scan_case(r1, "", true, "", "-");
    scan_case(r1, "a</think>b</think>c", true, "a", "b</think>c");
    scan_case(r1, "x<think>y</think>z", true, "x<think>y", "z"); /* only an opening one drops */
    scan_case(r1, "abc</thi", false, "abc", "-");              /* may be the tag: held */
    scan_case(r1, "abc</thi", true, "abc</thi", "-");
    scan_case(r1, "abc<", false, "abc", "-");                   /* "</think>"'s start */
    scan_case(r1, "abc<x", false, "abc<x", "-");
    scan_case(r1, "abc</think", false, "abc", "-");
    scan_case(r1, "\n<thi", false, "-", "-");                  /* may open: undecided */
    scan_case(r1, "  ", false, "-", "-");
    scan_case(r1, "\n<thx", false, "\n<thx", "-");
    /* qwen3: the model opens it, or there is none */
    scan_case(q3, "hello", true, "-", "hello");
    scan_case(q3, "<think>a</think>b", true, "a", "b");
    scan_case(q3, "\n<think>a", true, "a", "-");
    scan_case(q3, "<think>a</th", false, "a", "-");
    scan_case(q3, " <th", false, "-", "-");
    scan_case(q3, " <th", true, "-", " <th");
    scan_case(q3, "x<think>a</think>", true, "-", "x<think>a</think>");
    scan_case(q3, "<think></think>", true, "", "");
    /* a stream's later scan searches from what an earlier one saw, less a tag's length: the
     * tag split across the two is found */
    pgd_reasoning_span sp;
    const char *grown = "abc</think>x";
    pgd_reasoning_scan(r1, grown, strlen(grown), false, strlen("abc</thi"), &sp);
    CHECK(sp.thinking && sp.r_end == 3 && sp.content && sp.c_off == 11);
}

/* mistral: [TOOL_CALLS] then one array of calls (vLLM's mistral parser); 9-character ids. */
static void test_mistral(void) {
    size_t cl;
    const char *two = "Sure. [TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {\"a\": 1}}, "
                      "{\"name\": \"g\", \"arguments\": {}}]\n";
    cJSON *c = pgd_tool_calls_parse(PGD_TOOLS_MISTRAL, two, strlen(two), "cmpl-1_0", &cl);
    CHECK(c && cJSON_GetArraySize(c) == 2 && cl == 5 && !strcmp(fn(c, 1, "name"), "g"));
    CHECK(c && !strcmp(fn(c, 0, "arguments"), "{\"a\":1}"));
    const char *id0 = c ? cJSON_GetObjectItem(cJSON_GetArrayItem(c, 0), "id")->valuestring : "";
    const char *id1 = c ? cJSON_GetObjectItem(cJSON_GetArrayItem(c, 1), "id")->valuestring : "";
    CHECK(strlen(id0) == 9 && strspn(id0, "0123456789abcdefghijklmnopqrstuvwxyz"
                                          "ABCDEFGHIJKLMNOPQRSTUVWXYZ") == 9);
    CHECK(strlen(id1) == 9 && strcmp(id0, id1) != 0);
    cJSON_Delete(c);
    static const char *const none[] = {"[TOOL_CALLS] {\"name\": \"f\", \"arguments\": {}}",
                                       "[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {}}] x",
                                       "[TOOL_CALLS] []", "[TOOL_CALLS] [{\"name\": 1}]",
                                       "no calls"};
    for (size_t i = 0; i < sizeof none / sizeof none[0]; i++) {
        c = pgd_tool_calls_parse(PGD_TOOLS_MISTRAL, none[i], strlen(none[i]), "x", &cl);
        CHECK(c == NULL && cl == strlen(none[i]));
    }
    bool opened;
    static const struct { const char *t; size_t safe; bool opened; } cases[] = {
        {"Hi [TOOL_", 2, false}, {"Hi [TOOL_CALLS][", 2, true}, {"Hi [x", 5, false}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t n = pgd_tool_calls_stream_safe(PGD_TOOLS_MISTRAL, cases[i].t, strlen(cases[i].t),
                                              0, &opened);
        CHECK(n == cases[i].safe && opened == cases[i].opened);
    }
    CHECK(!strcmp(pgd_tool_call_prefix(PGD_TOOLS_MISTRAL), "[TOOL_CALLS]["));
    CHECK(!strcmp(pgd_tool_call_suffix(PGD_TOOLS_MISTRAL), "]"));
}

int main(void) {
    test_reasoning();
    test_mistral();
    test_parse();
    test_llama3();
    test_stream_safe();
    test_schema();
    return test_report("test_tool_calls");
}
