/* The OpenAI API surface: request JSON -> a validated pgd_api_request, and the response bodies
 * (completion, chat completion, stream chunks, error objects). No I/O, no scheduling: the
 * server owns sockets, the engine owns compute. Only this layer maps problems to HTTP statuses. */
#ifndef PGD_API_OPENAI_H
#define PGD_API_OPENAI_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "api/reasoning.h"

typedef struct pgd_api_error {
    int status;         /* HTTP status */
    const char *type;   /* "invalid_request_error", "authentication_error", ... */
    char param[64];     /* offending parameter or "" */
    char code[64];      /* machine-readable code or "" */
    char message[512];
} pgd_api_error;

/* Server-side bounds on requests. */
typedef struct pgd_api_limits {
    int32_t max_n;            /* n <= max_n */
    int32_t max_logprobs;     /* logprobs / top_logprobs <= this (<= 20) */
    int32_t max_tokens_limit; /* max_tokens <= this */
    int32_t max_prompts;      /* completions: prompts per request */
    int32_t max_prompt_tokens;/* token-array prompts: ids per prompt */
    int32_t n_vocab;          /* token ids must be < n_vocab */
    bool priority_scheduling; /* requests may set "priority" (else only 0, as vLLM) */
} pgd_api_limits;

typedef struct pgd_api_prompt {
    char *text;               /* owned, or NULL when ids are given */
    int32_t *ids;             /* owned token ids (from the request, or filled by tokenization) */
    int32_t n_ids;
} pgd_api_prompt;

typedef struct pgd_api_request {
    bool chat;
    char *model;                   /* owned */
    pgd_api_prompt *prompts;       /* (n_prompts), completions; chat fills one after rendering */
    int32_t n_prompts;
    cJSON *messages, *tools;       /* chat, owned */
    int32_t max_tokens;            /* 0: until the context is full (chat default) */
    int32_t n;
    int32_t logprobs;              /* -1: none; else number of alternatives (chat: top_logprobs) */
    int32_t prompt_logprobs;       /* vLLM's extension: -1 none; else the prompt's scores with
                                      this many alternatives (not with stream) */
    bool echo, stream, include_usage, ignore_eos, add_generation_prompt;
    bool continue_final_message;   /* chat: the prompt ends inside the final assistant message */
    cJSON *template_kwargs;        /* chat_template_kwargs: more template variables, or NULL */
    bool echo_only;                /* completions: echo with max_tokens 0 -- score the prompt,
                                      generate nothing (as vLLM and OpenAI's legacy API) */
    bool no_speculation;           /* "speculative": false opts out (as in `pagoda batch`) */
    bool json_object;              /* response_format json_object or json_schema */
    char *json_schema;             /* json_schema's schema as compact JSON (owned), or NULL */
    const char *schema_param;      /* the parameter that gave it (for a 400 on it) */
    char schema_label[96];         /* how a 400 names it: "'guided_json'", ... */
    struct pgd_json_schema *schema_c; /* owned: compiled by the server off its I/O thread */
    bool tool_required;            /* tool_choice "required" or a named function (tool_name) */
    int tool_format;               /* set by the server: answers' tool calls are parsed out in
                                      this pgd_tool_format (0: none) */
    int reasoning;                 /* set by the server: chat answers' reasoning is returned
                                      apart, in this pgd_reasoning_format (0: none) */
    int prompt_think;              /* set by the server: the rendered chat prompt ends with
                                      "<think>" (1: the template opened the thinking), with
                                      "</think>" (2: it closed it), or neither (0) */
    int32_t cached_tokens;         /* set by the server: prompt tokens served from the prefix
                                      cache (usage.prompt_tokens_details.cached_tokens) */
    int32_t reasoning_tokens;      /* set by the server: generated tokens of the reasoning
                                      (usage.completion_tokens_details, with a reasoning parser) */
    bool parallel_tool_calls;      /* false: an answer returns its first call only */
    char *tool_name;               /* owned, or NULL */
    float temperature, top_p, min_p, presence_penalty, frequency_penalty, repetition_penalty;
    int32_t top_k, min_tokens;
    bool has_seed;
    uint64_t seed;
    char *stop[4];
    int32_t n_stop;
    int32_t *bias_ids;             /* (n_bias) */
    float *bias;
    int32_t n_bias;
    /* vLLM's extensions */
    int32_t *stop_ids;             /* stop_token_ids (n_stop_ids) */
    int32_t n_stop_ids;
    int32_t *allowed_ids;          /* allowed_token_ids (n_allowed) */
    int32_t n_allowed;
    bool include_stop;             /* include_stop_str_in_output */
    bool render_special;           /* skip_special_tokens: false */
    int32_t truncate_prompt;       /* truncate_prompt_tokens: keep the prompt's last N tokens (0:
                                      all; -1: as many as the context holds) */
    char *regex;                   /* guided_regex / structured_outputs.regex, or NULL */
    const char *regex_param;       /* the parameter that gave it (for a 400 on its pattern) */
    struct pgd_regex *regex_dfa;   /* owned: compiled by the server off its I/O thread */
    char *grammar;                 /* guided_grammar / structured_outputs.grammar / llama.cpp's
                                      grammar (GBNF), or NULL */
    const char *grammar_param;     /* the parameter that gave it (for a 400 on its text) */
    struct pgd_grammar *grammar_c; /* owned: compiled by the server off its I/O thread */
    char **choices;                /* guided_choice / structured_outputs.choice (n_choices) */
    int32_t n_choices;
    int32_t priority;              /* vLLM's "priority": lower is served first */
    bool embed;                    /* /v1/embeddings: prompts are its inputs */
    bool embed_base64;             /* encoding_format "base64" */
} pgd_api_request;

/* Parses and validates a /v1/completions (chat=false) or /v1/chat/completions body. On failure
 * fills err (status 400 with param and message) and returns -1; out is then empty. */
int pgd_api_parse(const char *body, size_t len, bool chat, const pgd_api_limits *lim,
                  pgd_api_request *out, pgd_api_error *err);
void pgd_api_request_free(pgd_api_request *r);
/* Parses a /v1/embeddings body into out (embed set, one prompt per input, max_tokens 0): input
 * (a string, an array of strings, an array of token ids or an array of token-id arrays),
 * model, encoding_format ("float" or "base64"), user; dimensions only equal to dim (the model's
 * hidden size: no shortening). 0, or -1 with a 400 in err. */
int pgd_api_parse_embeddings(const char *body, size_t len, const pgd_api_limits *lim,
                             int32_t dim, pgd_api_request *out, pgd_api_error *err);
/* Compiles r->regex (if any) into r->regex_dfa, once for all the request's choices; a pattern
 * regex.h refuses is a 400 naming its parameter. 0, or -1 with err. Slow for complex patterns
 * (the work budget bounds it): call it off the I/O thread. */
int pgd_api_compile_regex(pgd_api_request *r, pgd_api_error *err);
/* Compiles r->grammar (if any) into r->grammar_c, once for all the request's choices; a grammar
 * grammar.h refuses is a 400 naming its parameter, with the compiler's reason. 0, or -1 with
 * err. */
int pgd_api_compile_grammar(pgd_api_request *r, pgd_api_error *err);
/* Compiles r->json_schema (if any) into r->schema_c, once for all the request's choices; a
 * schema json_grammar.h refuses is a 400 naming its parameter. 0, or -1 with err. Up to ~0.1 s
 * for a schema with complex patterns: call it off the I/O thread. */
int pgd_api_compile_schema(pgd_api_request *r, pgd_api_error *err);
/* 0 when body[0..len) may be parsed: well-formed UTF-8 (no overlongs, surrogates, code points
 * past U+10FFFF), as every POST route's body must be, and no "\u0000" escape (cJSON's strings
 * end at a NUL, so the text after it would be dropped without a word). Else -1 with a 400 in
 * err. */
int pgd_api_body_check(const char *body, size_t len, pgd_api_error *err);
/* 0 when no object in o has a key twice; else -1 with a 400 naming the key. Bodies are held to
 * this rather than to cJSON's first-wins or most parsers' last-wins: a proxy that validated the
 * other reading would pass a request Pagoda reads differently. */
int pgd_api_json_unique_keys(const cJSON *o, pgd_api_error *err);
/* Parses body[0..len) as exactly one JSON value (whitespace around it only), or returns NULL. */
cJSON *pgd_api_json_parse(const char *body, size_t len);

void pgd_api_error_set(pgd_api_error *e, int status, const char *type, const char *param,
                       const char *code, const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* {"error": {"message", "type", "param", "code"}} as a malloc'd string. */
char *pgd_api_error_json(const pgd_api_error *e);

/* One generated choice, accumulated by the server from engine events. */
typedef struct pgd_api_choice {
    char *text;
    size_t text_len, text_cap;
    int32_t n_tokens;
    const char *finish_reason;     /* "stop", "length" or NULL while running */
    cJSON *logprobs;               /* built incrementally when requested, or NULL */
    int32_t n_prompt, n_cached;
    size_t emitted;                /* streaming with tool_format: bytes of text sent as content */
    size_t t_known;                /* ... bytes of the content searched without a call opener */
    bool t_opened;                 /* ... a call has begun: t_safe is final */
    size_t t_safe;
    int32_t n_reasoning;           /* with reasoning: tokens of it (-1: counted, content began) */
    size_t r_emitted;              /* streaming with reasoning: bytes of text sent as such */
    size_t r_known;                /* ... bytes scanned without a "</think>" */
    bool r_final;                  /* ... the content has started: r_span is final */
    pgd_reasoning_span r_span;
    size_t prompt_offset;          /* echo with logprobs: bytes of prompt tokens' text so far */
    cJSON *prompt_logprobs;        /* prompt_logprobs: [null, {id: {logprob, rank,
                                      decoded_token}}, ...] as vLLM writes it, or NULL */
    bool echo_pending;             /* streaming echo with logprobs: sent with the prompt's scores */
    int32_t stop_string, stop_token; /* what stopped it (the FINISH event's), -1: nothing named */
    float *embedding;              /* /v1/embeddings: this input's vector (owned), or NULL */
} pgd_api_choice;

/* Appends one token's logprobs to *lp (created on first use) in the request's format:
 * completions {"tokens", "token_logprobs", "top_logprobs", "text_offset"}, chat
 * {"content": [{"token", "logprob", "bytes", "top_logprobs"}], "refusal"}. n_top < 0 (a
 * prompt's first token, completions only): null logprob and top_logprobs. */
void pgd_api_logprobs_add(const pgd_api_request *r, cJSON **lp, const char *tok, size_t tok_len,
                          float logprob, int n_top, const char *const *top_tok,
                          const size_t *top_len, const float *top_lp, size_t text_offset);

/* Appends one prompt token's entry to *lp (created on first use) in vLLM's prompt_logprobs form:
 * null for the first token (n_top < 0), else {"<id>": {"logprob", "rank", "decoded_token"}} for
 * the token and its n_top alternatives (ranks 1..n_top). tok/top_tok: the tokens' text. */
void pgd_api_prompt_logprobs_add(cJSON **lp, int32_t id, const char *tok, size_t tok_len,
                                 float logprob, int32_t rank, int n_top, const int32_t *top_ids,
                                 const char *const *top_tok, const size_t *top_len,
                                 const float *top_lp);

/* The response of an embeddings request: choices[i].embedding (dim floats) for input i, as
 * numbers or base64 of little-endian float32. Malloc'd JSON, or NULL when out of memory. */
char *pgd_api_embeddings_json(const pgd_api_request *r, const char *model,
                              const pgd_api_choice *choices, int n, int32_t dim,
                              int32_t prompt_tokens);
/* Response bodies (malloc'd strings). */
char *pgd_api_completion_json(const pgd_api_request *r, const char *id, long created,
                              const char *model, pgd_api_choice *choices, int n_choices,
                              int32_t prompt_tokens, int32_t completion_tokens);
/* One SSE "data: {...}\n\n" frame for a streamed delta of choice index. role_first: chat's
 * first frame carries the assistant role. finish may be NULL. reasoning (chat): a
 * reasoning_content delta beside the content's. */
char *pgd_api_chunk_sse(const pgd_api_request *r, const char *id, long created,
                        const char *model, int index, const char *text, size_t text_len,
                        const char *reasoning, size_t reasoning_len, bool role_first,
                        const char *finish, const pgd_api_choice *fin_choice, cJSON *logprobs);
/* A chat choice's tool calls when the request parses them (tool_format): the calls of
 * text[0..len) (parallel_tool_calls false: the first only), their ids from the response id and
 * the choice index, *content_len the bytes of content before them, and *finish "tool_calls"
 * where it was "stop". NULL, with nothing changed, when there are none. */
cJSON *pgd_api_choice_tool_calls(const pgd_api_request *r, const char *id, int index,
                                 const char *text, size_t len, size_t *content_len,
                                 const char **finish);
/* The frame of a streamed choice's tool calls (calls: pgd_tool_calls_parse's array, or pieces
 * of one call, consumed; each gets its "index"); role_first: the choice's first delta (the
 * role, and content null). */
char *pgd_api_tool_calls_chunk_sse(const pgd_api_request *r, const char *id, long created,
                                   const char *model, int index, bool role_first, cJSON *calls,
                                   const char *finish, const pgd_api_choice *fin_choice);
char *pgd_api_usage_chunk_sse(const pgd_api_request *r, const char *id, long created,
                              const char *model, int32_t prompt_tokens,
                              int32_t completion_tokens);

#endif
