/* A chat answer as it streams: the generated text split into reasoning, content and tool calls
 * (the reasoning parser's and the tool-call format's rules, api/reasoning.h and
 * api/tool_calls.h), held back where a tag or a call may be starting, and the reasoning's tokens
 * counted for usage. The server feeds it engine events; no I/O here. */
#ifndef PGD_API_STREAM_H
#define PGD_API_STREAM_H

#include <stdbool.h>
#include <stddef.h>

#include "api/openai.h"

/* Appends n bytes of t to the choice's text (on out of memory the text stays as it was). */
void pgd_api_choice_append(pgd_api_choice *ch, const char *t, size_t n);

/* What a streamed chat choice sends now. */
typedef struct pgd_api_delta {
    const char *reasoning; /* reasoning_content to send (reasoning_len bytes) */
    size_t reasoning_len;
    const char *content;   /* content to send (content_len bytes), stopping where a call begins
                              or may begin */
    size_t content_len;
    cJSON *calls;          /* at the end, the calls parsed out of the held text (finish then
                              "tool_calls"), or NULL: the held text went out as content */
} pgd_api_delta;

/* Choice i of request r (its id: the calls' ids) takes n more bytes of t; *fin: the finish
 * reason when this is the choice's last piece, else NULL (set to "tool_calls" when calls were
 * parsed). For a request with a reasoning parser or a tool format. */
void pgd_api_stream_split(const pgd_api_request *r, const char *id, int i, pgd_api_choice *ch,
                          const char *t, size_t n, const char **fin, pgd_api_delta *d);

/* With a reasoning parser: counts a generated token (token) into the choice's reasoning until
 * the content begins, then adds them to r->reasoning_tokens once (usage's
 * completion_tokens_details.reasoning_tokens); done: the answer has ended. scanned: a stream's
 * split has scanned the text already (its span is reused, not rescanned). */
void pgd_api_count_reasoning(pgd_api_request *r, pgd_api_choice *ch, bool token, bool done,
                             bool scanned);

#endif
