/* API dialects: the Anthropic Messages API and the OpenAI Responses API served through the chat
 * completions path. A dialect turns its request body into an OpenAI chat-completions request
 * (which pgd_api_parse validates and the server runs as any chat), and turns the chat answer
 * (the chat.completion object, or the stream of chat.completion.chunk objects) back into its
 * own bodies and events. No I/O and no scheduling: the server calls these on its I/O thread. */
#ifndef PGD_API_DIALECT_H
#define PGD_API_DIALECT_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "api/openai.h"

/* A growable byte buffer (SSE output). On allocation failure the append is dropped and oom is
 * set: the stream is then cut, as the server's own out_append does. */
typedef struct pgd_sbuf {
    char *data;     /* owned, NUL-terminated when len > 0 */
    size_t len, cap;
    bool oom;
} pgd_sbuf;
void pgd_sbuf_append(pgd_sbuf *b, const char *data, size_t n);
void pgd_sbuf_appendf(pgd_sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* "event: NAME\ndata: JSON\n\n" with obj printed compactly (obj borrowed). */
void pgd_sbuf_sse_event(pgd_sbuf *b, const char *name, const cJSON *obj);
void pgd_sbuf_free(pgd_sbuf *b);

struct pgd_resp_store;

/* What a dialect may read of the server. All borrowed, valid for the request's life. */
typedef struct pgd_dialect_env {
    const char *model;              /* the served model's name (the answers' default "model") */
    const char *request_id;         /* the response id the server made for this request */
    long created;                   /* unix seconds */
    struct pgd_resp_store *store;   /* the Responses API's store (NULL for other dialects) */
    bool reasoning;                 /* the server parses reasoning out (--reasoning-parser) */
    int32_t prompt_tokens;          /* the prompt's tokens: set by the server before
                                       stream_start (0 until then) */
} pgd_dialect_env;

typedef struct pgd_dialect {
    const char *name;               /* "anthropic", "responses" */
    /* Parses body[0..len) (already checked to be well-formed UTF-8) into *chat, a new OpenAI
     * chat-completions request object (taken by the caller; the server prints it and gives it
     * to pgd_api_parse), and *state (taken; freed by free_state), which the calls below keep.
     * -1 with err (its status, and a message naming the dialect's own parameter) otherwise;
     * nothing is then allocated. */
    int (*begin)(const pgd_dialect_env *env, const char *body, size_t len, cJSON **chat,
                 void **state, pgd_api_error *err);
    /* The non-streamed answer: the chat.completion object (borrowed) as the dialect's body,
     * malloc'd (NULL when out of memory). */
    char *(*complete)(void *state, const cJSON *completion);
    /* Streaming: the events that open the stream (before any chunk), appended to out. */
    void (*stream_start)(void *state, pgd_sbuf *out);
    /* One chat.completion.chunk object (borrowed; the usage chunk too: choices empty, usage
     * set) as the dialect's events, appended to out. */
    void (*stream_chunk)(void *state, const cJSON *chunk, pgd_sbuf *out);
    /* The end of the stream (where chat writes "data: [DONE]"): the closing events. */
    void (*stream_end)(void *state, pgd_sbuf *out);
    /* An error in the dialect's shape: the body of a non-streamed answer (malloc'd). */
    char *(*error_json)(const pgd_api_error *e);
    /* An error after a stream has begun (e.g. a shutdown): its events, appended to out. */
    void (*stream_error)(void *state, const pgd_api_error *e, pgd_sbuf *out);
    /* Whether the request asked for a stream. */
    bool (*streams)(const void *state);
    void (*free_state)(void *state);
} pgd_dialect;

extern const pgd_dialect pgd_dialect_anthropic;  /* src/api/anthropic.c */
extern const pgd_dialect pgd_dialect_responses;  /* src/api/responses.c */

#endif
