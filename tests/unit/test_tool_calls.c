/* Tool-call parsing in the hermes format (src/api/tool_calls.c), as vLLM's hermes parser reads
 * it: calls between <tool_call> tags, an unclosed last call running to the end, content the text
 * before the first call, and no calls at all when one call's JSON is not {"name", "arguments"}.
 * Also the streaming hold and the schema of a call. */
#include <string.h>

#include "api/tool_calls.h"
#include "sample/json_grammar.h"
#include "test.h"

static cJSON *parse(const char *t, size_t *content_len) {
    return pgd_tool_calls_parse(t, strlen(t), "x", content_len);
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

static void test_stream_safe(void) {
    bool opened;
    CHECK_EQ_INT(pgd_tool_calls_stream_safe("Hello", 5, &opened), 5);
    CHECK(!opened);
    /* held: an ending that may start the opener, and the whitespace before it (which the
     * content drops when a call follows) */
    CHECK_EQ_INT(pgd_tool_calls_stream_safe("Hello <tool_c", 13, &opened), 5);
    CHECK(!opened);
    CHECK_EQ_INT(pgd_tool_calls_stream_safe("a <b", 4, &opened), 4); /* not the opener's start */
    CHECK_EQ_INT(pgd_tool_calls_stream_safe("a <", 3, &opened), 1);
    CHECK_EQ_INT(pgd_tool_calls_stream_safe("Ok.\n", 4, &opened), 3);
    CHECK_EQ_INT(pgd_tool_calls_stream_safe("ab<tool_call>{", 14, &opened), 2);
    CHECK(opened);
}

static void test_schema(void) {
    cJSON *tools = cJSON_Parse(
        "[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": "
        "\"object\", \"properties\": {\"p\": {\"$ref\": \"#/$defs/P\"}}, \"$defs\": {\"P\": "
        "{\"type\": \"integer\"}}}}}, {\"type\": \"function\", \"function\": {\"name\": \"g\"}}]");
    const char *why = NULL;
    char *one = pgd_tool_call_schema(tools, "f", &why);
    char *any = pgd_tool_call_schema(tools, NULL, &why);
    CHECK(one && any && !pgd_tool_call_schema(tools, "h", &why) && why);
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

int main(void) {
    test_parse();
    test_stream_safe();
    test_schema();
    return test_report("test_tool_calls");
}
