/* Tool calls in a chat answer, in the format of vLLM's "hermes" parser (Qwen2.5, Hermes, and
 * every chat template that asks for them so): each call is
 *     <tool_call>
 *     {"name": "<function>", "arguments": {...}}
 *     </tool_call>
 * and the answer's text before the first call is its content. Also: the streaming hold (what of
 * a growing text may go out as content), and the JSON Schema of one call for tool_choice
 * "required" or a named function (json_grammar.h then constrains the answer to it). */
#ifndef PGD_API_TOOL_CALLS_H
#define PGD_API_TOOL_CALLS_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>

#define PGD_TOOL_CALL_OPEN "<tool_call>"
#define PGD_TOOL_CALL_CLOSE "</tool_call>"
/* what the constrained answer of tool_choice required/named is wrapped in */
#define PGD_TOOL_CALL_PREFIX PGD_TOOL_CALL_OPEN "\n"
#define PGD_TOOL_CALL_SUFFIX "\n" PGD_TOOL_CALL_CLOSE

/* The OpenAI tool_calls array of text[0..len) (ids "call_<id>_<i>"), or NULL when the text has
 * no call or a call whose JSON is not {"name": string, "arguments": ...} (the whole text is then
 * content, as in vLLM). *content_len: bytes of text before the first call, less trailing
 * whitespace (0: no content). */
cJSON *pgd_tool_calls_parse(const char *text, size_t len, const char *id, size_t *content_len);

/* Streaming: how many bytes of text[0..len) may be sent as content now -- up to the first call,
 * and short of an ending that could still become one ("<tool_c"). *opened: a call has begun. */
size_t pgd_tool_calls_stream_safe(const char *text, size_t len, bool *opened);

/* The JSON Schema (compact JSON, malloc'd) of {"name": ..., "arguments": ...} for the function
 * named name, or for any of tools when name is NULL: then one of the calls, told apart by the
 * name (written first), each with its own parameters. NULL with *why set when tools has no such
 * function, two of the same name, or parameters that are not an object's schema. */
char *pgd_tool_call_schema(const cJSON *tools, const char *name, const char **why);

#endif
