/* Tool calls in a chat answer, in the formats of three of vLLM's parsers:
 *   hermes       (Qwen2.5, Hermes, and every chat template that asks for them so) each call is
 *                    <tool_call>
 *                    {"name": "<function>", "arguments": {...}}
 *                    </tool_call>
 *                and the answer's text before the first call is its content;
 *   llama3_json  (Llama 3.1-3.3's JSON tool calling) the answer starts with the calls,
 *                {"name": "<function>", "parameters": {...}}, separated by ';', after an
 *                optional <|python_tag|>; then it has no content;
 *   mistral      (Mistral 7B v0.3, Nemo, Mixtral's tool templates) the calls follow
 *                [TOOL_CALLS] as one JSON array of {"name": ..., "arguments": {...}}; the text
 *                before it is the content. Their ids are 9 letters and digits, as those
 *                templates require of the ids a conversation hands back.
 * and one format of no model's own, for a server whose template names none (vLLM's forced calls
 * without a tool parser):
 *   json         tool_choice "required": the whole answer is a JSON array of
 *                {"name": "<function>", "parameters": {...}}, at least one; a named function:
 *                the whole answer is that function's arguments object.
 * Also: the streaming hold (what of a growing text may go out as content), and the JSON Schema
 * of one call for tool_choice "required" or a named function (json_grammar.h then constrains
 * the answer to it). */
#ifndef PGD_API_TOOL_CALLS_H
#define PGD_API_TOOL_CALLS_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>

#define PGD_TOOL_CALL_OPEN "<tool_call>"
#define PGD_TOOL_CALL_CLOSE "</tool_call>"
#define PGD_PYTHON_TAG "<|python_tag|>"
#define PGD_MISTRAL_TOOL_CALLS "[TOOL_CALLS]"

typedef enum {
    PGD_TOOLS_NONE = 0,
    PGD_TOOLS_HERMES,
    PGD_TOOLS_LLAMA3,
    PGD_TOOLS_MISTRAL,
    PGD_TOOLS_JSON, /* forced calls only: never auto-detected nor named by --tool-call-parser */
} pgd_tool_format;

/* The format a chat template asks its model for (--tool-call-parser auto): hermes when it
 * mentions <tool_call>, mistral when it writes [TOOL_CALLS], llama3_json when it has Llama 3.1's
 * instruction, else none. */
pgd_tool_format pgd_tool_format_of_template(const char *tmpl);
/* What the constrained answer of tool_choice required/named is wrapped in (NULL: nothing). */
const char *pgd_tool_call_prefix(pgd_tool_format f);
const char *pgd_tool_call_suffix(pgd_tool_format f);

/* The OpenAI tool_calls array of text[0..len) (ids "call_<id>_<i>"; mistral: 9 letters and
 * digits hashed from those), or NULL when the text has
 * no call or a call whose JSON is not {"name": string, "arguments": ...} (the whole text is then
 * content, as in vLLM). *content_len: bytes of text before the first call, less trailing
 * whitespace (0: no content). */
cJSON *pgd_tool_calls_parse(pgd_tool_format f, const char *text, size_t len, const char *id,
                            size_t *content_len);

/* json, a named function: the one call of that name whose arguments are text[0..len) as the
 * model wrote them (vLLM hands the constrained text on as is, even when max_tokens cut it),
 * id "call_<id>_0". */
cJSON *pgd_tool_call_named(const char *name, const char *text, size_t len, const char *id);

/* Streaming: how many bytes of text[0..len) may be sent as content now -- up to the first call,
 * and short of an ending that could still become one ("<tool_c"; for llama3_json, all of it
 * while the start could be a call). *opened: a call has begun. known: bytes of the same text an
 * earlier call saw without an opener (0: none), so a stream's calls search only what is new; once
 * one says opened, its answer is final (the caller keeps it). */
size_t pgd_tool_calls_stream_safe(pgd_tool_format f, const char *text, size_t len, size_t known,
                                  bool *opened);

/* The JSON Schema (compact JSON, malloc'd) of {"name": ..., "arguments": ...} for the function
 * named name, or for any of tools when name is NULL: then one of the calls, told apart by the
 * name (written first), each with its own parameters. json: the function's parameters (named),
 * or vLLM's array of at least one {"name", "parameters"} of any of tools (required). NULL with
 * *why set when tools has no such function, two of the same name, or parameters that are not an
 * object's schema. */
char *pgd_tool_call_schema(pgd_tool_format f, const cJSON *tools, const char *name,
                           const char **why);

#endif
