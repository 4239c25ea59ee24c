/* The server's shared state, between its files: the request context, the server, the route
 * table's types, and the functions one file calls in another. See server.c for the threads and
 * the request context's lifetime. */
#ifndef PGD_SERVER_INTERNAL_H
#define PGD_SERVER_INTERNAL_H

#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <malloc.h>
#include <math.h>
#include <microhttpd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>
#ifdef PGD_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif
#include "api/chat.h"
#include "api/dialect.h"
#include "api/openai.h"
#include "api/params.h"
#include "api/reasoning.h"
#include "api/responses.h"
#include "api/stream.h"
#include "api/tool_calls.h"
#include "sample/json_grammar.h"
#include "model/gguf.h"
#include "pagoda/pagoda.h"
#include "plan/kv_plan.h"
#include "server/config.h"
#include "server/cors.h"
#include "server/http_guard.h"
#include "server/metrics.h"
#include "tokenizer/tokenizer.h"
#include "util/clock.h"
#include "util/parse.h"
#include "util/xalloc.h"

typedef enum { R_COMPLETIONS, R_CHAT, R_TOKENIZE, R_DETOKENIZE, R_EMBED, R_LORA_LOAD,
               R_LORA_UNLOAD, R_MESSAGES, R_COUNT_TOKENS, R_RESPONSES,
               /* answered without the engine (GET, and DELETE of a stored response) */
               R_MODELS, R_MODEL, R_HEALTH, R_METRICS, R_KV_PLAN, R_VERSION, R_STORED,
               R_SERVER_INFO, R_MODEL_INFO, R_LOAD, R_FLUSH_CACHE, R_KV_DUMP,
               /* the prompt's token ids, not an answer (vLLM's render endpoints) */
               R_COMPLETIONS_RENDER, R_CHAT_RENDER } route;
typedef enum { PH_RECEIVING, PH_WORKING, PH_RUNNING, PH_RESPOND, PH_STREAMING } phase;

typedef struct server server;
typedef struct route_def route_def;

#define PGD_SERVER_MAX_LORAS 64

/* A context's links in one of the server's lists (live, running, detached: pgd__list_*). */
typedef struct ctx_links {
    struct req_ctx *prev, *next;
} ctx_links;

typedef struct req_ctx {
    server *s;
    struct MHD_Connection *conn;
    int refs;                  /* 1 for the connection + 1 per engine request in flight */
    bool conn_done;
    route rt;
    const route_def *route;    /* its route (the table below) */
    phase ph;
    char *body;
    size_t body_len, body_cap;
    bool too_large;
    pgd_api_request api;
    bool api_parsed;
    pgd_api_error err;
    bool has_err;
    int status;
    char *resp;                /* response body for non-streaming answers */
    char id[48];
    long created;
    double t_arrival, t_first, t_last, t_submitted;
    int n_choices, n_finished;
    pgd_api_choice *choices;
    uint64_t *engine_ids;      /* (n_choices) */
    bool *submitted;           /* (n_choices) */
    bool *role_sent;
    int32_t prompt_tokens, completion_tokens;
    int32_t spec_draft_tokens, spec_accepted_tokens; /* over all choices, for the access log */
    size_t *echo_len;          /* per choice: bytes of echoed prompt at the start of text */
    /* streaming output buffer */
    char *out;
    size_t out_len, out_cap, out_off;
    bool stream_done, suspended;
    uv_work_t work;
    char method[16], path[64]; /* for the access log (JSON-safe: printable, no quotes) */
    ctx_links live;            /* in server.live: contexts whose connection is open */
    ctx_links run;             /* in server.running while PH_RUNNING */
    bool in_run_list;
    bool client_gone;          /* the liveness check saw the client leave */
    bool body_deadline_hit;    /* its body was too slow: the connection is being closed */
    int32_t lora;              /* the request's adapter (pgd_request_params.lora), 0: none */
    const char *model;         /* the model name it asked for: the server's or an adapter's */
    const char *resp_type;     /* c->resp's Content-Type; NULL: JSON */
    char *lora_name, *lora_path; /* /v1/load_lora_adapter's, while the load work runs */
    /* the Anthropic Messages and Responses APIs ride the chat path (api/dialect.h): their
     * answers and events are the chat ones converted; NULL for the OpenAI routes */
    const pgd_dialect *dialect;
    void *dstate;              /* the dialect's per-request state (owned) */
    bool detached;             /* a background response: runs on after its connection ended */
    bool counted;              /* in server->in_flight (queued work for an answer) */
    bool cancelled;            /* POST /v1/responses/{id}/cancel came */
    pgd_dialect_env denv;      /* what the dialect reads of the server (for the request's life) */
    char origin[256];          /* the request's Origin header ("" none, or too long for CORS) */
    char xrid[128];            /* X-Request-Id: the client's, or made at the first answer */
    const char *allow;         /* a 405's Allow header */
    ctx_links det;             /* in server.detached while its engine requests run */
} req_ctx;

struct server {
    pgd_server_config cfg;
    uv_loop_t loop;
    uv_poll_t poll;
    uv_timer_t timer, drain_timer, liveness_timer;
    req_ctx *running;          /* requests whose engine work runs (the liveness check) */
    uv_async_t async;
    uv_signal_t sigterm, sigint;
    uv_work_t load_work;
    struct MHD_Daemon *mhd;
    pgd_http_guard *guard;     /* the listening socket and the first heads (http_guard.h) */
    pgd_engine *engine;
    pgd_tokenizer *tok;
    pgd_jinja_tmpl *tmpl;      /* the model's chat template, or NULL */
    pgd_api_limits limits;
    char model_name[256];
    /* --served-model-name's further names (vLLM's: each is accepted as "model"; the first,
     * model_name, is what answers say) */
    char *aliases[8];
    int n_aliases;
    /* LoRA adapters by engine slot - 1 (NULL: free), owned; changed on the loop thread only
     * (--lora-modules at start, then /v1/load_lora_adapter and /v1/unload_lora_adapter) */
    char *lora_names[PGD_SERVER_MAX_LORAS], *lora_paths[PGD_SERVER_MAX_LORAS];
    int n_loras;               /* slots */
    int n_static_loras;        /* --lora-modules' (slots 1..n) */
    char *lora_loading;        /* the name a load work item is reading, or NULL */
    char load_error[512];
    volatile bool ready;
    bool draining, load_failed;
    pgd_tool_format tool_format; /* of the chat answers' tool calls (--tool-call-parser) */
    pgd_reasoning_format reasoning_format; /* of the chat answers (--reasoning-parser) */
    bool loading;              /* the load work is queued or running (it writes s->engine) */
    int in_flight;             /* requests accepted and not yet answered */
    int n_contexts;            /* request contexts allocated and not yet freed (the refcounts'
                                  check: 0 once every answer is done) */
    struct req_ctx *live;      /* every context whose connection has not completed */
    bool stopping;             /* shutting down: close connections instead of waiting */
    uint64_t next_req;
    pgd_metrics metrics;
    pgd_event *events;         /* (256) poll buffer */
    pgd_resp_store *store;     /* /v1/responses' stored answers (NULL: --responses-store-size 0) */
    struct req_ctx *detached;  /* background responses still running */
    pgd_cors cors;             /* --allowed-origins, --allowed-methods, ... */
    long started;              /* unix seconds: /v1/models' "created" */
    int exit_code;
};

/* The routes: path ("*" ends a prefix), the methods it takes (405 with Allow otherwise), how it is
 * served, and its handler, called once the request (and any body) is read. */
enum {
    ROUTE_PUBLIC = 1 << 0,     /* no API key needed (unless --protect-health) */
    ROUTE_NO_ENGINE = 1 << 1,  /* answered while the model loads or the server drains; any body
                                  is ignored */
    ROUTE_LORA_ADMIN = 1 << 2, /* exists only with --allow-runtime-lora-updating (as vLLM's) */
};

/* A route's handler, called once the request (and any body) is read. */
typedef enum MHD_Result route_fn(server *s, req_ctx *c, struct MHD_Connection *conn,
                                 const char *method, const char *url);

struct route_def {
    const char *path;
    route rt;
    const char *methods, *allow;
    unsigned flags;
    route_fn *handler;
};

/* The server's lists of contexts, by the member holding their links (offsetof(req_ctx, run),
 * ...): c goes to the front of *head; c leaves *head. */
void pgd__list_push(struct req_ctx **head, struct req_ctx *c, size_t links);
void pgd__list_unlink(struct req_ctx **head, struct req_ctx *c, size_t links);

/* transport.c: libmicrohttpd and libuv glue, request bodies, auth, headers, SSE buffering,
 * suspend/resume, the access log */
void pgd__run_list_remove(server *s, req_ctx *c);
void pgd__run_list_add(server *s, req_ctx *c);
void pgd__ctx_unref(req_ctx *c);
void pgd__detached_remove(server *s, req_ctx *c);
enum MHD_Result pgd__send_body(req_ctx *c, struct MHD_Connection *conn, int status,
                               const char *body, const char *ctype, const char *retry_after);
enum MHD_Result pgd__send_error(req_ctx *c, struct MHD_Connection *conn, const pgd_api_error *e);
enum MHD_Result pgd__send_json(req_ctx *c, struct MHD_Connection *conn, char *js);
enum MHD_Result pgd__send_cjson(req_ctx *c, struct MHD_Connection *conn, cJSON *o);
void pgd__out_append(req_ctx *c, const char *data, size_t n);
void pgd__out_append_sbuf(req_ctx *c, pgd_sbuf *b);
void pgd__emit_frame(req_ctx *c, char *f);
void pgd__emit_end(req_ctx *c);
void pgd__resume(req_ctx *c);
void pgd__run_mhd(server *s);
void pgd__mhd_poll_cb(uv_poll_t *p, int status, int events);
void pgd__liveness_cb(uv_timer_t *t);
int pgd__queue_conn_work(server *s, req_ctx *c, struct MHD_Connection *conn, uv_work_cb run,
                         uv_after_work_cb after);
/* The after callback of work that filled c's answer (resp and status, or err). */
void pgd__after_work_respond(uv_work_t *w, int status);
enum MHD_Result pgd__answer_after_work(server *s, req_ctx *c, struct MHD_Connection *conn,
                                       uv_work_cb run, uv_after_work_cb after);
enum MHD_Result pgd__answer_text(req_ctx *c, struct MHD_Connection *conn, const char *fmt,
                                 const char *name);
enum MHD_Result pgd__handler(void *cls, struct MHD_Connection *conn, const char *url,
                             const char *method, const char *version, const char *upload,
                             size_t *upload_size, void **con_cls);
void pgd__completed_cb(void *cls, struct MHD_Connection *conn, void **con_cls,
                       enum MHD_RequestTerminationCode toe);
void pgd__guard_pass(void *arg, int fd, const struct sockaddr *addr, socklen_t addrlen);

/* events.c: engine events into answers (streamed chunks, whole bodies, the dialects' events) */
void pgd__handle_event(server *s, const pgd_event *ev);
void pgd__finish_detached(server *s, req_ctx *c);
void pgd__drain_events(server *s);
void pgd__async_cb(uv_async_t *a);
void pgd__engine_notify(void *arg);

/* openai_routes.c: the API routes (completions, chat, embeddings, Messages, Responses, tokenize,
 * models) */
route_fn pgd__answer_models, pgd__answer_stored_response, pgd__route_tokenize, pgd__route_generate,
         pgd__answer_model;

/* admin.c: the operations routes (health, metrics, version, kv_plan, LoRA load/unload) */
route_fn pgd__kv_dump, pgd__lora_update, pgd__answer_kv_plan, pgd__answer_health, pgd__answer_metrics,
         pgd__answer_version;
/* admin.c: SGLang's worker contract */
route_fn pgd__answer_server_info, pgd__answer_model_info, pgd__answer_load, pgd__flush_cache;

/* routes.c: the route table */
const route_def *pgd__find_route(const char *url);
bool pgd__method_in(const char *list, const char *method);

/* server.c: start, model load, drain and shutdown */
bool pgd__served_name(const server *s, const char *name);
int32_t pgd__lora_slot_of(const server *s, const char *name);
void pgd__answer_unfinished(server *s);

#endif
