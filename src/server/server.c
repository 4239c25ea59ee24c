/* `pagoda serve`: the OpenAI-compatible HTTP server.
 *
 * Threads: one I/O thread runs a libuv loop that drives libmicrohttpd in external-event-loop
 * mode (MHD's epoll descriptor watched by a uv_poll_t, its timeout by a uv_timer_t); the engine
 * runs on its own thread; tokenization and chat-template rendering run on the libuv thread pool.
 * The I/O thread never computes and the engine thread never touches a socket: the engine posts
 * events and wakes the loop with uv_async_send; connections waiting for tokens are suspended and
 * resumed from that callback.
 *
 * A request context is shared by its connection and by its engine requests (one per choice):
 * it is freed only when the connection has completed AND every engine request has finished
 * (deferred free), so neither side can touch freed memory. */
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

typedef enum { R_COMPLETIONS, R_CHAT, R_TOKENIZE, R_DETOKENIZE, R_EMBED, R_LORA_LOAD,
               R_LORA_UNLOAD, R_MESSAGES, R_COUNT_TOKENS, R_RESPONSES,
               /* answered without the engine (GET, and DELETE of a stored response) */
               R_MODELS, R_MODEL, R_HEALTH, R_METRICS, R_KV_PLAN, R_VERSION, R_STORED } route;
typedef enum { PH_RECEIVING, PH_WORKING, PH_RUNNING, PH_RESPOND, PH_STREAMING } phase;

typedef struct server server;

#define PGD_SERVER_MAX_LORAS 64

typedef struct req_ctx {
    server *s;
    struct MHD_Connection *conn;
    int refs;                  /* 1 for the connection + 1 per engine request in flight */
    bool conn_done;
    route rt;
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
    struct req_ctx *live_prev, *live_next; /* server->live: contexts whose connection is open */
    struct req_ctx *run_prev, *run_next; /* in server.running while PH_RUNNING */
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
    struct req_ctx *det_prev, *det_next; /* server->detached while its engine requests run */
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

/* ---- small helpers ---- */

/* --lora-modules into slots 1..n of s->lora_names/lora_paths, and the number of slots (-1 after
 * one line on stderr). */
static int parse_lora_modules(server *s, const pgd_server_config *cfg) {
    char msg[320], *spec = cfg->lora_modules ? strdup(cfg->lora_modules) : NULL;
    const char *names[PGD_SERVER_MAX_LORAS], *paths[PGD_SERVER_MAX_LORAS];
    int n = 0, rc = 0;
    if (cfg->lora_modules && !spec) return -1;
    if (spec && pgd_parse_lora_modules(spec, s->model_name, names, paths, PGD_SERVER_MAX_LORAS,
                                       &n, msg, sizeof msg)) {
        fprintf(stderr, "pagoda: %s\n", msg);
        rc = -1;
    }
    for (int i = 0; !rc && i < n; i++)
        if (!(s->lora_names[i] = strdup(names[i])) || !(s->lora_paths[i] = strdup(paths[i])))
            rc = -1;
    free(spec);
    int want = cfg->max_loras ? cfg->max_loras : cfg->allow_runtime_lora_updating ? 8 : 0;
    s->n_static_loras = n;
    s->n_loras = n > want ? n : want;
    return rc;
}

/* Whether name is one of the base model's served names. */
static bool served_name(const server *s, const char *name) {
    if (!strcmp(name, s->model_name)) return true;
    for (int i = 0; i < s->n_aliases; i++)
        if (!strcmp(name, s->aliases[i])) return true;
    return false;
}

/* The slot of the adapter named name, 0 for none. */
static int32_t lora_slot_of(const server *s, const char *name) {
    for (int i = 0; name && i < s->n_loras; i++)
        if (s->lora_names[i] && !strcmp(name, s->lora_names[i])) return i + 1;
    return 0;
}

static void run_list_remove(server *s, req_ctx *c) {
    if (!c->in_run_list) return;
    if (c->run_prev) c->run_prev->run_next = c->run_next;
    else s->running = c->run_next;
    if (c->run_next) c->run_next->run_prev = c->run_prev;
    c->run_prev = c->run_next = NULL;
    c->in_run_list = false;
}

static void run_list_add(server *s, req_ctx *c) {
    c->run_prev = NULL;
    c->run_next = s->running;
    if (s->running) s->running->run_prev = c;
    s->running = c;
    c->in_run_list = true;
}

static void ctx_unref(req_ctx *c) {
    if (--c->refs > 0) return;
    run_list_remove(c->s, c);
    if (c->api_parsed) pgd_api_request_free(&c->api);
    for (int i = 0; i < c->n_choices; i++) {
        free(c->choices[i].text);
        free(c->choices[i].embedding);
        cJSON_Delete(c->choices[i].logprobs);
        cJSON_Delete(c->choices[i].prompt_logprobs);
    }
    free(c->choices);
    free(c->engine_ids);
    free(c->submitted);
    free(c->role_sent);
    free(c->echo_len);
    free(c->body);
    free(c->resp);
    free(c->out);
    free(c->lora_name);
    free(c->lora_path);
    if (c->dialect && c->dstate) c->dialect->free_state(c->dstate);
    free(c);
}

static void detached_remove(server *s, req_ctx *c) {
    if (!c->detached) return;
    if (c->det_prev) c->det_prev->det_next = c->det_next;
    else s->detached = c->det_next;
    if (c->det_next) c->det_next->det_prev = c->det_prev;
    c->det_prev = c->det_next = NULL;
    c->detached = false;
}

static void add_header_cb(void *r, const char *name, const char *value) {
    MHD_add_response_header(r, name, value);
}

/* The headers every answer carries: X-Request-Id (the client's, echoed as vLLM does, or the
 * request's own id), CORS for a cross-origin request, Allow on a 405. */
static void common_headers(req_ctx *c, struct MHD_Response *r) {
    if (!c) return;
    if (!c->xrid[0])
        snprintf(c->xrid, sizeof c->xrid, "%s", c->id[0] ? c->id : "req");
    if (!strcmp(c->xrid, "req")) /* no id yet (an error before parsing): one of its own */
        snprintf(c->xrid, sizeof c->xrid, "req-%016" PRIx64,
                 ((uint64_t)c->created << 24) ^ ++c->s->next_req);
    MHD_add_response_header(r, "X-Request-Id", c->xrid);
    if (c->origin[0]) pgd_cors_simple(&c->s->cors, c->origin, add_header_cb, r);
    if (c->allow && c->status == 405) MHD_add_response_header(r, "Allow", c->allow);
}

static enum MHD_Result send_body(req_ctx *c, struct MHD_Connection *conn, int status,
                                 const char *body, const char *ctype, const char *retry_after) {
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(body), (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    if (c) c->status = status;
    common_headers(c, r);
    MHD_add_response_header(r, "Content-Type", ctype);
    if (retry_after) MHD_add_response_header(r, "Retry-After", retry_after);
    enum MHD_Result ret = MHD_queue_response(conn, (unsigned)status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result send_error(req_ctx *c, struct MHD_Connection *conn, const pgd_api_error *e) {
    char *js = c && c->dialect ? c->dialect->error_json(e) : pgd_api_error_json(e);
    if (c) c->status = e->status;
    const char *retry = e->status == 429 || e->status == 503 ? "1" : NULL;
    enum MHD_Result r = send_body(c, conn, e->status, js ? js : "{}", "application/json", retry);
    free(js);
    return r;
}

static void out_append(req_ctx *c, const char *data, size_t n) {
    if (!data) return;
    if (c->out_len + n > c->out_cap) {
        size_t nc = (c->out_len + n) * 2 + 256;
        char *o = realloc(c->out, nc);
        if (!o) return;
        c->out = o;
        c->out_cap = nc;
    }
    memcpy(c->out + c->out_len, data, n);
    c->out_len += n;
}

static void out_append_sbuf(req_ctx *c, pgd_sbuf *b) {
    if (b->len) out_append(c, b->data, b->len);
    pgd_sbuf_free(b);
}

/* One streamed frame ("data: {chunk}\n\n", taken): as it is, or through the request's dialect. */
static void emit_frame(req_ctx *c, char *f) {
    if (!f) return;
    if (!c->dialect) {
        out_append(c, f, strlen(f));
    } else {
        cJSON *chunk = cJSON_Parse(f + (strncmp(f, "data: ", 6) ? 0 : 6));
        pgd_sbuf b = {0};
        if (chunk) c->dialect->stream_chunk(c->dstate, chunk, &b);
        cJSON_Delete(chunk);
        out_append_sbuf(c, &b);
    }
    free(f);
}

/* The end of a stream: chat's [DONE], or the dialect's closing events. */
static void emit_end(req_ctx *c) {
    static const char done[] = "data: [DONE]\n\n";
    if (!c->dialect) {
        out_append(c, done, sizeof done - 1);
        return;
    }
    pgd_sbuf b = {0};
    c->dialect->stream_end(c->dstate, &b);
    out_append_sbuf(c, &b);
}


static void resume(req_ctx *c) {
    if (c->suspended && !c->conn_done) {
        c->suspended = false;
        MHD_resume_connection(c->conn);
    }
}

/* ---- the MHD <-> libuv glue ---- */

static void mhd_timer_cb(uv_timer_t *t);

static void run_mhd(server *s) {
    if (!s->mhd) return;
    MHD_run(s->mhd);
    MHD_UNSIGNED_LONG_LONG to;
    if (MHD_get_timeout(s->mhd, &to) == MHD_YES)
        uv_timer_start(&s->timer, mhd_timer_cb, to > 1000 ? 1000 : to, 0);
    else
        uv_timer_start(&s->timer, mhd_timer_cb, 1000, 0);
}

static void mhd_timer_cb(uv_timer_t *t) { run_mhd(t->data); }
static void mhd_poll_cb(uv_poll_t *p, int status, int events) {
    (void)status, (void)events;
    run_mhd(p->data);
}

/* ---- engine events ---- */

static const char *finish_name(pgd_finish_reason r) {
    return r == PGD_FINISH_LENGTH ? "length" : "stop";
}

static int choice_of(req_ctx *c, uint64_t engine_id) {
    for (int i = 0; i < c->n_choices; i++)
        if (c->submitted[i] && c->engine_ids[i] == engine_id) return i;
    return -1;
}

/* The texts of an event's token and its first k alternatives (k at most ev->n_top). */
typedef struct ev_texts {
    char tok[256], tops[PGD_MAX_TOP_LOGPROBS][256];
    const char *tp[PGD_MAX_TOP_LOGPROBS];
    size_t tok_len, tl[PGD_MAX_TOP_LOGPROBS];
    int k;
} ev_texts;

static void ev_texts_get(server *s, const pgd_event *ev, int k, ev_texts *t) {
    int n = pgd_tokenizer_token_bytes(s->tok, ev->token, true, t->tok, sizeof t->tok);
    t->tok_len = n > 0 ? (size_t)n : 0;
    t->k = ev->n_top < k ? ev->n_top : k;
    for (int i = 0; i < t->k; i++) {
        int m = pgd_tokenizer_token_bytes(s->tok, ev->top_ids[i], true, t->tops[i],
                                          sizeof t->tops[i]);
        t->tp[i] = t->tops[i];
        t->tl[i] = m > 0 ? (size_t)m : 0;
    }
}

/* Appends the logprobs of the event's token to *dst; returns the bytes of the token's text. */
static size_t add_logprobs(server *s, req_ctx *c, cJSON **dst, const pgd_event *ev,
                           size_t text_offset) {
    ev_texts t;
    ev_texts_get(s, ev, c->api.logprobs, &t);
    pgd_api_logprobs_add(&c->api, dst, t.tok, t.tok_len, ev->logprob, t.k, t.tp, t.tl,
                         ev->top_logprobs, text_offset);
    return t.tok_len;
}

/* vLLM's prompt_logprobs entry of the event's prompt token. */
static void add_prompt_logprobs(server *s, req_ctx *c, pgd_api_choice *ch, const pgd_event *ev) {
    ev_texts t;
    ev_texts_get(s, ev, c->api.prompt_logprobs, &t);
    pgd_api_prompt_logprobs_add(&ch->prompt_logprobs, ev->token, t.tok, t.tok_len, ev->logprob,
                                ev->rank, t.k, ev->top_ids, t.tp, t.tl, ev->top_logprobs);
}

/* Streaming echo with logprobs: the prompt's text and scores, sent before anything generated. */
static void flush_echo(server *s, req_ctx *c, int i) {
    pgd_api_choice *ch = &c->choices[i];
    if (!ch->echo_pending) return;
    ch->echo_pending = false;
    char *f = pgd_api_chunk_sse(&c->api, c->id, c->created, c->model, i,
                                ch->text ? ch->text : "", c->echo_len[i], NULL, 0, false, NULL,
                                NULL, ch->logprobs);
    ch->logprobs = NULL; /* the frame owned it */
    if (f) out_append(c, f, strlen(f));
    free(f);
}

static void finish_request(server *s, req_ctx *c);



/* A named function without a tool format: the constrained answer is the call's arguments, so
 * they stream as they come, as OpenAI and vLLM send them (the first delta with the role, null
 * content, the call's id and name; then arguments pieces; the finish alone). Not for the
 * dialects, whose converters take whole calls, nor with reasoning, whose split comes first. */
static bool streams_named_call(const req_ctx *c) {
    return c->api.tool_format == PGD_TOOLS_JSON && c->api.tool_name && !c->dialect &&
           !c->api.reasoning && c->api.chat;
}

static void stream_named_call(req_ctx *c, int i, const char *text, size_t len, const char *fin) {
    pgd_api_choice *ch = &c->choices[i];
    pgd_api_choice_append(ch, text, len);
    if (len || !c->role_sent[i]) {
        cJSON *calls = cJSON_CreateArray(), *call = cJSON_CreateObject();
        cJSON *fn = cJSON_CreateObject();
        if (!c->role_sent[i]) { /* the id pgd_tool_call_named gives the whole answer's call */
            char cid[128];
            snprintf(cid, sizeof cid, "call_%s_%d_0", c->id, i);
            cJSON_AddStringToObject(call, "id", cid);
            cJSON_AddStringToObject(call, "type", "function");
            cJSON_AddStringToObject(fn, "name", c->api.tool_name);
        }
        char *args = strndup(text ? text : "", len);
        cJSON_AddStringToObject(fn, "arguments", args ? args : "");
        free(args);
        cJSON_AddItemToObject(call, "function", fn);
        cJSON_AddItemToArray(calls, call);
        emit_frame(c, pgd_api_tool_calls_chunk_sse(&c->api, c->id, c->created, c->model, i,
                                                   !c->role_sent[i], calls, NULL, NULL));
        c->role_sent[i] = true;
    }
    if (fin)
        emit_frame(c, pgd_api_chunk_sse(&c->api, c->id, c->created, c->model, i, "", 0, NULL, 0,
                                        false, fin, ch, NULL));
}

static void handle_event(server *s, const pgd_event *ev) {
    req_ctx *c = (req_ctx *)(uintptr_t)ev->user_data;
    int i = choice_of(c, ev->request_id);
    if (i < 0) return;
    pgd_api_choice *ch = &c->choices[i];
    if (ev->type == PGD_EVENT_PROMPT_TOKEN) { /* the prompt's scores */
        if (c->conn_done) return;
        if (c->api.echo && c->api.logprobs >= 0) /* in the echoed logprobs */
            ch->prompt_offset += add_logprobs(s, c, &ch->logprobs, ev, ch->prompt_offset);
        if (c->api.prompt_logprobs >= 0) add_prompt_logprobs(s, c, ch, ev);
        return;
    }
    if (ev->type == PGD_EVENT_FINISH) { /* before the last chunk is written */
        ch->stop_string = ev->stop_string;
        ch->stop_token = ev->stop_token;
    }
    double t = pgd_now_s();
    if (ev->type == PGD_EVENT_TOKEN) {
        if (c->t_first == 0) {
            c->t_first = t;
            pgd_metrics_observe(&s->metrics, PGD_H_TTFT, t - c->t_arrival);
        } else {
            pgd_metrics_observe(&s->metrics, PGD_H_ITL, t - c->t_last);
        }
        c->t_last = t;
        ch->n_tokens++;
    }
    if (c->conn_done && !c->detached) {
        /* the client is gone: keep accounting, drop the text */
    } else if (c->api.stream && c->ph == PH_STREAMING) {
        flush_echo(s, c, i);
        cJSON *lp = NULL;
        if (ev->type == PGD_EVENT_TOKEN && c->api.logprobs >= 0)
            add_logprobs(s, c, &lp, ev, ch->prompt_offset + (size_t)ev->text_offset);
        const char *fin = ev->type == PGD_EVENT_FINISH ? finish_name(ev->finish_reason) : NULL;
        const char *text = ev->text;
        size_t text_len = (size_t)ev->text_len;
        cJSON *calls = NULL;
        const char *rtext = NULL;
        size_t rlen = 0;
        if (streams_named_call(c)) {
            stream_named_call(c, i, text, text_len, fin);
            cJSON_Delete(lp);
            resume(c);
            text_len = 0, lp = NULL, fin = NULL; /* all sent */
        } else if (c->api.tool_format || c->api.reasoning) {
            pgd_api_delta d;
            pgd_api_stream_split(&c->api, c->id, i, ch, ev->text, (size_t)ev->text_len, &fin, &d);
            rtext = d.reasoning, rlen = d.reasoning_len;
            text = d.content, text_len = d.content_len, calls = d.calls;
        }
        if (text_len || rlen || lp || (fin && !calls) || (!c->role_sent[i] && !streams_named_call(c))) {
            emit_frame(c, pgd_api_chunk_sse(&c->api, c->id, c->created, c->model, i, text,
                                            text_len, rtext, rlen,
                                            c->api.chat && !c->role_sent[i], calls ? NULL : fin,
                                            ch, lp));
            c->role_sent[i] = true;
        }
        if (calls)
            emit_frame(c, pgd_api_tool_calls_chunk_sse(&c->api, c->id, c->created, c->model, i,
                                                       false, calls, fin, ch));
        resume(c);
    } else {
        if (ev->type == PGD_EVENT_TOKEN && c->api.logprobs >= 0)
            add_logprobs(s, c, &ch->logprobs, ev, ch->prompt_offset + (size_t)ev->text_offset);
        pgd_api_choice_append(ch, ev->text, (size_t)ev->text_len);
    }
    if (c->api.reasoning)
        pgd_api_count_reasoning(&c->api, ch, ev->type == PGD_EVENT_TOKEN,
                                ev->type == PGD_EVENT_FINISH, c->api.stream && c->ph == PH_STREAMING);
    if (ev->type != PGD_EVENT_FINISH) return;
    /* the engine measures submission -> first scheduling */
    pgd_metrics_observe(&s->metrics, PGD_H_QUEUE, ev->queue_seconds);
    c->submitted[i] = false; /* no more events for this choice */
    c->n_finished++;
    if (ev->finish_reason == PGD_FINISH_ERROR && !c->has_err) {
        pgd_api_error_set(&c->err, 500, "server_error", NULL, NULL, "request %s failed: %s",
                          c->id, ev->error);
        c->has_err = true;
    }
    ch->finish_reason = finish_name(ev->finish_reason);
    c->completion_tokens += ev->n_completion;
    if (i % (c->api.n > 0 ? c->api.n : 1) == 0) c->api.cached_tokens += ev->n_cached; /* per prompt */
    c->spec_draft_tokens += ev->n_spec_draft_tokens;
    c->spec_accepted_tokens += ev->n_spec_accepted;
    pgd_metrics_count_finish(&s->metrics, ch->finish_reason, ev->finish_reason == PGD_FINISH_ABORT);
    if (c->n_finished == c->n_choices) finish_request(s, c);
    ctx_unref(c);
}

/* c->resp, the chat.completion, becomes the dialect's body (a Responses answer with store on is
 * also stored by it). */
static void dialect_complete(req_ctx *c) {
    cJSON *obj = c->resp ? cJSON_Parse(c->resp) : NULL;
    free(c->resp);
    c->resp = obj ? c->dialect->complete(c->dstate, obj) : NULL;
    cJSON_Delete(obj);
    if (!c->resp) {
        pgd_api_error_set(&c->err, 500, "server_error", NULL, NULL, "out of memory");
        c->has_err = true;
    }
}

/* A background response ended (its connection is long gone): the dialect stores the outcome. */
static void finish_detached(server *s, req_ctx *c) {
    detached_remove(s, c);
    if (c->has_err) {
        pgd_sbuf b = {0}; /* the failed response, stored; the events go nowhere */
        c->dialect->stream_error(c->dstate, &c->err, &b);
        pgd_sbuf_free(&b);
        return;
    }
    c->resp = pgd_api_completion_json(&c->api, c->id, c->created, c->model, c->choices,
                                      c->n_choices, c->prompt_tokens, c->completion_tokens);
    dialect_complete(c);
}

static void finish_request(server *s, req_ctx *c) {
    double t = pgd_now_s();
    run_list_remove(s, c);
    pgd_metrics_observe(&s->metrics, PGD_H_E2E, t - c->t_arrival);
    if (c->detached) {
        finish_detached(s, c);
        return;
    }
    if (c->conn_done) return;
    if (c->api.stream && c->ph == PH_STREAMING) {
        if (c->api.include_usage)
            emit_frame(c, pgd_api_usage_chunk_sse(&c->api, c->id, c->created, c->model,
                                                  c->prompt_tokens, c->completion_tokens));
        emit_end(c);
        c->stream_done = true;
    } else if (!c->has_err && c->api.embed) {
        c->resp = pgd_api_embeddings_json(&c->api, c->model, c->choices, c->n_choices,
                                          pgd_engine_dim(s->engine), c->prompt_tokens);
        if (!c->resp) {
            pgd_api_error_set(&c->err, 500, "server_error", NULL, NULL, "out of memory");
            c->has_err = true;
        }
        c->status = 200;
        c->ph = PH_RESPOND;
    } else if (!c->has_err) {
        c->resp = pgd_api_completion_json(&c->api, c->id, c->created, c->model, c->choices,
                                          c->n_choices, c->prompt_tokens, c->completion_tokens);
        if (c->dialect) dialect_complete(c);
        c->status = 200;
        c->ph = PH_RESPOND;
    } else {
        c->ph = PH_RESPOND;
    }
    resume(c);
}

/* A non-streaming request's connection stays suspended until its answer is ready, so MHD cannot
 * see its client leave. Twice a second, peek at each such socket: on EOF or an error the client
 * is gone, and its engine requests are aborted (their blocks freed) as a dropped stream's are.
 * A client that half-closes its sending side while waiting counts as gone, as in vLLM. */
/* Whether a body still being read (received so far, plus n arriving) has outlived
 * --request-body-timeout while averaging under --request-body-min-rate since its head. */
static bool body_too_slow(server *s, const req_ctx *c, size_t n) {
    double dt = pgd_now_s() - c->t_arrival;
    if (dt <= s->cfg.request_body_timeout || s->cfg.request_body_min_rate <= 0) return false;
    return (double)(c->body_len + n) < dt * s->cfg.request_body_min_rate;
}

static void liveness_cb(uv_timer_t *t) {
    server *s = t->data;
    for (req_ctx *c = s->running, *next; c; c = next) {
        next = c->run_next;
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(c->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (!ci) continue;
        char b;
        ssize_t r = recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
        if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
            run_list_remove(s, c);
            c->client_gone = true;
            for (int i = 0; i < c->n_choices; i++)
                if (c->submitted[i]) pgd_engine_abort(s->engine, c->engine_ids[i]);
        }
    }
    /* a body that stopped coming (the handler, called per piece, sees only the slow ones):
     * shutting its socket makes MHD close the connection at its next read */
    for (req_ctx *c = s->live; c; c = c->live_next) {
        if (c->ph != PH_RECEIVING || c->conn_done || c->body_deadline_hit ||
            !body_too_slow(s, c, 0))
            continue;
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(c->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (!ci) continue;
        c->body_deadline_hit = true;
        pgd_metrics_count_reject(&s->metrics, PGD_REJ_BODY_TIMEOUT);
        shutdown(ci->connect_fd, SHUT_RDWR);
    }
}

/* Handles every event the engine has posted. */
static void drain_events(server *s) {
    int n;
    while ((n = pgd_engine_poll(s->engine, s->events, 256, 0)) > 0)
        for (int i = 0; i < n; i++) handle_event(s, &s->events[i]);
}

static void async_cb(uv_async_t *a) {
    server *s = a->data;
    drain_events(s);
    run_mhd(s);
}

static void engine_notify(void *arg) { uv_async_send(arg); }

/* ---- request work on the thread pool: render + tokenize ---- */

static int tokenize_into(server *s, const char *text, bool add_bos, pgd_api_prompt *p) {
    size_t len = strlen(text), cap = len + 8, n = 0;
    p->ids = malloc(cap * sizeof *p->ids);
    if (!p->ids) return PGD_ENOMEM;
    int rc = pgd_tokenizer_encode_special(s->tok, text, len, add_bos, true, p->ids, cap, &n);
    p->n_ids = (int32_t)n;
    return rc;
}

/* Tool calls: parsed out of the answer when the request has tools and the server a format; a
 * required or named call is the answer, held to the call's schema between the format's tags.
 * Without a format (vLLM without a tool parser): a required or named call is the JSON of
 * PGD_TOOLS_JSON, and tool_choice "auto" is refused (never a silent answer without tools). */
static int tool_options(server *s, pgd_api_request *r, pgd_api_error *e) {
    r->tool_format = r->chat && r->tools ? (int)s->tool_format : PGD_TOOLS_NONE;
    /* a constrained answer (JSON, choices, a required call) thinks first, as in vLLM: the
     * engine holds the constraint from the end of the reasoning (constrain_after) */
    r->reasoning = r->chat ? (int)s->reasoning_format : PGD_REASONING_NONE;
    if (r->chat && r->tools && !r->tool_required && !s->tool_format) {
        pgd_api_error_set(e, 400, "invalid_request_error", "tool_choice", NULL,
                          "\"auto\" tool choice requires --tool-call-parser to be set (the chat "
                          "template names no tool-call format Pagoda knows: start the server "
                          "with --tool-call-parser hermes, llama3_json or mistral if the model "
                          "writes calls so), or use tool_choice \"required\", a named function "
                          "or \"none\"");
        return -1;
    }
    if (!r->tool_required) return 0;
    if (!s->tool_format) r->tool_format = PGD_TOOLS_JSON;
    const char *why = NULL;
    char *schema = pgd_tool_call_schema((pgd_tool_format)r->tool_format, r->tools, r->tool_name,
                                        &why);
    if (!schema) {
        pgd_api_error_set(e, 400, "invalid_request_error", "tool_choice", NULL, "%s", why);
        return -1;
    }
    r->json_schema = schema; /* compiled off the I/O thread (work_cb) */
    r->json_object = true;
    r->schema_param = "tools";
    snprintf(r->schema_label, sizeof r->schema_label, "the function's parameters");
    return 0;
}

/* A chat request's prompt: its messages rendered by the chat template, then tokenized into pr
 * (without BOS unless add_bos: the template writes the BOS text itself where the model wants
 * it); *think (may be NULL): whether it ends by opening (1) or closing (2) the thinking, or
 * neither (0). */
/* A chat past --max-messages is refused before its template renders. */
static bool too_many_messages(server *s, const cJSON *messages, pgd_api_error *e) {
    int n = cJSON_GetArraySize(messages);
    if (n <= s->cfg.max_messages) return false;
    pgd_api_error_set(e, 400, "invalid_request_error", "messages", "too_many_messages",
                      "the request has %d messages, more than --max-messages (%d)", n,
                      s->cfg.max_messages);
    return true;
}

static int chat_prompt(server *s, const pgd_api_request *r, bool add_bos, pgd_api_prompt *pr,
                       int *think, pgd_api_error *e) {
    char *prompt = NULL, msg[512];
    pgd_chat_opts co = {.add_generation_prompt = r->add_generation_prompt,
                        .continue_final = r->continue_final_message, .kwargs = r->template_kwargs};
    if (too_many_messages(s, r->messages, e)) return -1;
    int rc = pgd_chat_render(s->tmpl, s->tok, r->messages, r->tools, &co, &prompt, msg,
                             sizeof msg);
    if (!rc && strlen(prompt) > s->cfg.max_prompt_bytes) {
        /* (before tokenizing: that, not the rendering, is the costly part) */
        pgd_api_error_set(e, 400, "invalid_request_error", "messages", "prompt_too_long",
                          "the rendered chat prompt is %zu bytes, more than --max-prompt-bytes "
                          "(%zu)", strlen(prompt), s->cfg.max_prompt_bytes);
        free(prompt);
        return -1;
    }
    if (rc) {
        pgd_api_error_set(e, 400, "invalid_request_error", "messages", NULL,
                          "the chat template failed: %s", msg);
    } else if (think) {
        *think = pgd_reasoning_prompt_state(prompt);
    }
    if (!rc && (rc = tokenize_into(s, prompt, add_bos, pr))) {
        pgd_api_error_set(e, 500, "server_error", NULL, NULL, "tokenization failed");
    }
    free(prompt);
    return rc ? -1 : 0;
}

static void work_cb(uv_work_t *w) {
    req_ctx *c = w->data;
    server *s = c->s;
    pgd_api_request *r = &c->api;
    if (pgd_api_compile_regex(r, &c->err) || pgd_api_compile_schema(r, &c->err) ||
        pgd_api_compile_grammar(r, &c->err)) {
        /* here, not on the I/O thread */
        c->has_err = true;
        return;
    }
    if (r->chat) {
        r->prompts = calloc(1, sizeof *r->prompts);
        if (!r->prompts) {
            pgd_api_error_set(&c->err, 500, "server_error", NULL, NULL, "out of memory");
            c->has_err = true;
            return;
        }
        r->n_prompts = 1;
        if (chat_prompt(s, r, false, &r->prompts[0], &r->prompt_think, &c->err))
            c->has_err = true;
        return;
    }
    for (int i = 0; i < r->n_prompts; i++) {
        pgd_api_prompt *p = &r->prompts[i];
        if (p->text && tokenize_into(s, p->text, true, p)) {
            pgd_api_error_set(&c->err, 500, "server_error", NULL, NULL, "tokenization failed");
            c->has_err = true;
            return;
        }
    }
}

static void submit_all(server *s, req_ctx *c) {
    pgd_api_request *r = &c->api;
    int32_t n_ctx = pgd_engine_n_ctx(s->engine);
    if (c->lora && lora_slot_of(s, c->model) != c->lora) { /* unloaded while the work ran */
        pgd_api_error_set(&c->err, 404, "invalid_request_error", "model", "model_not_found",
                          "the LoRA adapter '%.200s' was unloaded", c->model);
        c->has_err = true;
        return;
    }
    pgd_api_budget bud = {.n_ctx = n_ctx, .max_waiting = s->cfg.max_waiting,
                          .max_request_tokens = s->cfg.max_request_tokens};
    if (pgd_api_prepare(r, &bud, &c->err)) {
        c->has_err = true;
        return;
    }
    c->n_choices = r->n_prompts * r->n;
    c->choices = calloc((size_t)c->n_choices, sizeof *c->choices);
    for (int i = 0; c->choices && i < c->n_choices; i++)
        c->choices[i].stop_string = c->choices[i].stop_token = -1;
    c->engine_ids = calloc((size_t)c->n_choices, sizeof *c->engine_ids);
    c->submitted = calloc((size_t)c->n_choices, sizeof *c->submitted);
    c->role_sent = calloc((size_t)c->n_choices, sizeof *c->role_sent);
    c->echo_len = calloc((size_t)c->n_choices, sizeof *c->echo_len);
    if (!c->choices || !c->engine_ids || !c->submitted || !c->role_sent || !c->echo_len) {
        pgd_api_error_set(&c->err, 500, "server_error", NULL, NULL, "out of memory");
        c->has_err = true;
        return;
    }
    uint64_t seed0 = r->has_seed ? r->seed : ((uint64_t)time(NULL) << 20) ^ (s->next_req * 7919);
    for (int p = 0; p < r->n_prompts; p++) {
        pgd_api_prompt *pr = &r->prompts[p];
        c->prompt_tokens += pr->n_ids;
        for (int k = 0; k < r->n; k++) {
            int i = p * r->n + k;
            if (r->embed && !(c->choices[i].embedding =
                                  calloc((size_t)pgd_engine_dim(s->engine), sizeof(float)))) {
                for (int j = 0; j < i; j++) pgd_engine_abort(s->engine, c->engine_ids[j]);
                pgd_api_error_set(&c->err, 500, "server_error", NULL, NULL, "out of memory");
                c->has_err = true;
                c->n_choices = i;
                return;
            }
            pgd_request_params rp;
            pgd_api_engine_params(r, i, n_ctx, seed0 + (uint64_t)i, &rp);
            rp.user_data = (uint64_t)(uintptr_t)c;
            rp.embedding = c->choices[i].embedding;
            rp.lora = c->lora;
            char err[256];
            int rc = pgd_engine_submit(s->engine, &rp, &c->engine_ids[i], err, sizeof err);
            if (rc) {
                /* cancel the choices already submitted; their finish events release refs */
                for (int j = 0; j < i; j++) pgd_engine_abort(s->engine, c->engine_ids[j]);
                if (rc == PGD_ERANGE)
                    pgd_api_error_set(&c->err, 429, "rate_limit_error", NULL, "queue_full",
                                      "the server is busy (%s); retry later", err);
                else
                    pgd_api_error_set(&c->err, 400, "invalid_request_error", NULL, NULL, "%s", err);
                c->has_err = true;
                free(c->choices[i].embedding); /* (not freed with the choices that report) */
                c->choices[i].embedding = NULL;
                c->n_choices = i; /* only these will report back */
                return;
            }
            c->submitted[i] = true;
            c->refs++;
            if (r->echo) {
                /* the prompt as given, or its ids' text (HF's decode without special tokens,
                 * as vLLM echoes token-id prompts) */
                char *dec = NULL;
                size_t dl = 0;
                const char *t = pr->text;
                if (!t && s->tok &&
                    pgd_tokenizer_decode(s->tok, pr->ids, (size_t)pr->n_ids, false, &dec, &dl) == 0)
                    t = dec;
                if (t) {
                    c->echo_len[i] = strlen(t);
                    pgd_api_choice_append(&c->choices[i], t, c->echo_len[i]);
                }
                /* streamed, the echo goes out first; with logprobs, once the prompt is scored */
                c->choices[i].echo_pending = r->logprobs >= 0;
                free(dec);
            }
        }
    }
}

static void after_work_cb(uv_work_t *w, int status) {
    req_ctx *c = w->data;
    server *s = c->s;
    (void)status;
    if (!c->has_err && (!c->conn_done || c->detached) && !s->stopping) submit_all(s, c);
    for (int i = 0; c->cancelled && i < c->n_choices; i++) /* cancelled while it was queued */
        if (c->submitted[i]) pgd_engine_abort(s->engine, c->engine_ids[i]);
    if (c->has_err) {
        c->ph = PH_RESPOND;
        /* choices that were submitted before an error still report back and unref */
        for (int i = 0; i < c->n_choices; i++)
            if (c->submitted[i]) pgd_engine_abort(s->engine, c->engine_ids[i]);
        if (c->detached) finish_detached(s, c); /* stores the failure */
    } else {
        c->ph = c->api.stream ? PH_STREAMING : PH_RUNNING;
        if (!c->detached) run_list_add(s, c); /* streams too: a scored echo sends nothing */
        else pgd_responses_mark_running(c->dstate); /* GET /v1/responses/{id}: in_progress */
        c->t_submitted = pgd_now_s();
        if (c->api.stream && c->dialect) {
            pgd_sbuf b = {0};
            c->denv.prompt_tokens = c->prompt_tokens;
            c->dialect->stream_start(c->dstate, &b);
            out_append_sbuf(c, &b);
        } else if (c->api.stream) {
            /* echo goes out first */
            for (int i = 0; i < c->n_choices; i++)
                if (c->echo_len[i] && !c->choices[i].echo_pending) {
                    char *f = pgd_api_chunk_sse(&c->api, c->id, c->created, c->model, i,
                                                c->choices[i].text, c->echo_len[i], NULL, 0,
                                                false, NULL, NULL, NULL);
                    if (f) out_append(c, f, strlen(f));
                    free(f);
                }
        }
    }
    if (c->has_err || c->api.stream) resume(c); /* non-streaming answers wait for the finish */
    ctx_unref(c); /* the work's reference */
    run_mhd(s);
}

/* ---- streaming body ---- */

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    req_ctx *c = cls;
    (void)pos;
    if (c->out_off < c->out_len) {
        size_t n = c->out_len - c->out_off;
        if (n > max) n = max;
        memcpy(buf, c->out + c->out_off, n);
        c->out_off += n;
        if (c->out_off == c->out_len) c->out_off = c->out_len = 0;
        return (ssize_t)n;
    }
    if (c->stream_done) return MHD_CONTENT_READER_END_OF_STREAM;
    if (c->s->stopping) return MHD_CONTENT_READER_END_WITH_ERROR;
    /* nothing yet: park the connection until the engine posts more */
    c->suspended = true;
    MHD_suspend_connection(c->conn);
    return 0;
}

/* ---- simple endpoints ---- */

/* One entry of /v1/models into d: the model, or (root set) a LoRA adapter of it, as vLLM lists
 * its adapters (root: the adapter's directory, parent: the base model). */
static void add_model_entry(server *s, cJSON *d, const char *id, const char *root) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", id);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)s->started);
    cJSON_AddStringToObject(m, "owned_by", "pagoda");
    if (root) {
        cJSON_AddStringToObject(m, "root", root);
        cJSON_AddStringToObject(m, "parent", s->model_name);
    }
    cJSON_AddNumberToObject(m, "max_model_len", s->ready ? pgd_engine_n_ctx(s->engine) : 0);
    cJSON_AddItemToArray(d, m);
}

static enum MHD_Result answer_models(server *s, req_ctx *c, struct MHD_Connection *conn) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON *d = cJSON_AddArrayToObject(o, "data");
    add_model_entry(s, d, s->model_name, NULL);
    for (int i = 0; i < s->n_aliases; i++) add_model_entry(s, d, s->aliases[i], NULL);
    for (int32_t i = 0; i < s->n_loras; i++)
        if (s->lora_names[i]) add_model_entry(s, d, s->lora_names[i], s->lora_paths[i]);
    char *js = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    enum MHD_Result r = send_body(c, conn, 200, js ? js : "{}", "application/json", NULL);
    free(js);
    return r;
}

/* /tokenize's answer: {"tokens", "count", "max_model_len"}. */
static cJSON *tokens_json(server *s, const pgd_api_prompt *pr) {
    cJSON *out = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(out, "tokens");
    for (int i = 0; i < pr->n_ids; i++) cJSON_AddItemToArray(arr, cJSON_CreateNumber(pr->ids[i]));
    cJSON_AddNumberToObject(out, "count", pr->n_ids);
    cJSON_AddNumberToObject(out, "max_model_len", pgd_engine_n_ctx(s->engine));
    return out;
}

/* /tokenize of a chat (vLLM's form: messages, tools, add_generation_prompt,
 * continue_final_message, chat_template_kwargs): the ids a chat completion of it would take. */
static int tokenize_chat(server *s, req_ctx *c, bool add_bos, cJSON **out, pgd_api_error *e) {
    pgd_api_request r;
    if (!s->tmpl) {
        pgd_api_error_set(e, 400, "invalid_request_error", "messages", NULL,
                          "this model has no chat template");
        return -1;
    }
    if (pgd_api_parse(c->body, c->body_len, true, &s->limits, &r, e)) return -1;
    pgd_api_prompt pr = {0};
    int rc = chat_prompt(s, &r, add_bos, &pr, NULL, e);
    if (!rc) *out = tokens_json(s, &pr);
    free(pr.ids);
    pgd_api_request_free(&r);
    return rc;
}

/* /tokenize and /detokenize on the thread pool: a body of megabytes takes long to tokenize, and
 * the loop must keep streaming meanwhile. Fills c->resp (200) or c->err. */
static void tokenize_work_cb(uv_work_t *w) {
    req_ctx *c = w->data;
    server *s = c->s;
    pgd_api_error e;
    cJSON *o = NULL, *out = NULL;
    if (pgd_api_body_check(c->body ? c->body : "", c->body_len, &e)) goto err;
    o = pgd_api_json_parse(c->body ? c->body : "", c->body_len);
    if (!cJSON_IsObject(o)) {
        pgd_api_error_set(&e, 400, "invalid_request_error", NULL, "invalid_json",
                          "the request body must be a JSON object");
        goto err;
    }
    if (pgd_api_json_unique_keys(o, &e)) goto err;
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(o, "messages");
    const cJSON *ab = cJSON_GetObjectItemCaseSensitive(o, "add_special_tokens");
    if (ab && !cJSON_IsBool(ab)) {
        pgd_api_error_set(&e, 400, "invalid_request_error", "add_special_tokens", NULL,
                          "'add_special_tokens' must be a boolean");
        goto err;
    }
    if (c->rt == R_TOKENIZE && msgs && !cJSON_IsNull(msgs)) {
        /* vLLM's default for a chat: no special tokens added (the template writes them) */
        if (tokenize_chat(s, c, cJSON_IsTrue(ab), &out, &e)) goto err;
    } else if (c->rt == R_TOKENIZE) {
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(o, "prompt");
        if (!cJSON_IsString(p)) {
            pgd_api_error_set(&e, 400, "invalid_request_error", "prompt", NULL,
                              "'prompt' must be a string");
            goto err;
        }
        pgd_api_prompt pr = {0};
        if (tokenize_into(s, p->valuestring, !ab || cJSON_IsTrue(ab), &pr)) {
            free(pr.ids);
            pgd_api_error_set(&e, 500, "server_error", NULL, NULL, "tokenization failed");
            goto err;
        }
        out = tokens_json(s, &pr);
        free(pr.ids);
    } else {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "tokens"), *x;
        int n = cJSON_GetArraySize(t);
        int32_t *ids = cJSON_IsArray(t) ? malloc((size_t)(n ? n : 1) * sizeof *ids) : NULL;
        if (!ids) {
            pgd_api_error_set(&e, 400, "invalid_request_error", "tokens", NULL,
                              "'tokens' must be an array of token ids");
            goto err;
        }
        int k = 0;
        cJSON_ArrayForEach(x, t) {
            if (!cJSON_IsNumber(x) || x->valuedouble < 0 ||
                x->valuedouble >= pgd_tokenizer_n_vocab(s->tok) ||
                x->valuedouble != floor(x->valuedouble)) {
                free(ids);
                pgd_api_error_set(&e, 400, "invalid_request_error", "tokens", NULL,
                                  "'tokens' must hold token ids in [0, %d)",
                                  pgd_tokenizer_n_vocab(s->tok));
                goto err;
            }
            ids[k++] = (int32_t)x->valuedouble;
        }
        char *text = NULL;
        size_t len = 0;
        int rc = pgd_tokenizer_decode(s->tok, ids, (size_t)k, false, &text, &len);
        free(ids);
        if (rc) {
            pgd_api_error_set(&e, 500, "server_error", NULL, NULL, "detokenization failed");
            goto err;
        }
        out = cJSON_CreateObject();
        cJSON_AddStringToObject(out, "prompt", text);
        free(text);
    }
    cJSON_Delete(o);
    c->resp = cJSON_PrintUnformatted(out);
    cJSON_Delete(out);
    if (c->resp) {
        c->status = 200;
        return;
    }
    pgd_api_error_set(&e, 500, "server_error", NULL, NULL, "out of memory");
err:
    cJSON_Delete(o);
    c->err = e;
    c->has_err = true;
}

static void tokenize_after_cb(uv_work_t *w, int status) {
    req_ctx *c = w->data;
    server *s = c->s;
    (void)status;
    c->ph = PH_RESPOND;
    resume(c);
    ctx_unref(c); /* the work's reference */
    run_mhd(s);
}

/* Runs `run` on the thread pool with the connection suspended (the work holds a reference to
 * c; `after` resumes it). -1, with nothing held or suspended, when the work cannot be queued. */
static int queue_conn_work(server *s, req_ctx *c, struct MHD_Connection *conn,
                           uv_work_cb run, uv_after_work_cb after) {
    c->ph = PH_WORKING;
    c->refs++; /* held by the work item */
    s->in_flight++;
    c->counted = true;
    c->work.data = c;
    c->suspended = true;
    MHD_suspend_connection(conn);
    if (!uv_queue_work(&s->loop, &c->work, run, after)) return 0;
    c->suspended = false;
    MHD_resume_connection(conn);
    c->refs--;
    s->in_flight--;
    c->counted = false;
    c->ph = PH_RESPOND;
    return -1;
}

/* ---- LoRA adapters at run time ---- */

/* A 200 answer of plain text (vLLM answers its LoRA routes so). */
static enum MHD_Result answer_text(req_ctx *c, struct MHD_Connection *conn, const char *fmt,
                                   const char *name) {
    char txt[320];
    snprintf(txt, sizeof txt, fmt, name);
    c->status = 200;
    c->ph = PH_RESPOND;
    return send_body(c, conn, 200, txt, "text/plain; charset=utf-8", NULL);
}

static void lora_load_work_cb(uv_work_t *w) {
    req_ctx *c = w->data;
    char err[512];
    if (pgd_engine_load_lora(c->s->engine, c->lora_path, &c->lora, err, sizeof err)) {
        pgd_api_error_set(&c->err, 400, "invalid_request_error", "lora_path", NULL, "%s", err);
        c->has_err = true;
    }
}

/* The loaded adapter's name goes into the table (its engine slot is a free one). */
static void lora_load_after_cb(uv_work_t *w, int status) {
    req_ctx *c = w->data;
    server *s = c->s;
    (void)status;
    free(s->lora_loading);
    s->lora_loading = NULL;
    if (!c->has_err) {
        int k = c->lora - 1;
        free(s->lora_names[k]);
        free(s->lora_paths[k]);
        s->lora_names[k] = c->lora_name;
        s->lora_paths[k] = c->lora_path;
        char txt[320];
        snprintf(txt, sizeof txt, "Success: LoRA adapter '%s' added successfully.", c->lora_name);
        c->lora_name = c->lora_path = NULL;
        c->resp = strdup(txt);
        c->resp_type = "text/plain; charset=utf-8";
        c->status = 200;
    }
    c->ph = PH_RESPOND;
    resume(c);
    ctx_unref(c); /* the work's reference */
    run_mhd(s);
}

/* POST /v1/load_lora_adapter {"lora_name", "lora_path"} and /v1/unload_lora_adapter
 * {"lora_name"} (vLLM's, with --allow-runtime-lora-updating). A load reads the adapter on the
 * thread pool, one at a time, and its name serves once it sits in an engine slot. An unload takes
 * the name away at once; requests already running with the adapter finish with it, and the
 * engine frees it after the last one. */
static enum MHD_Result lora_update(server *s, req_ctx *c, struct MHD_Connection *conn) {
    pgd_api_error e;
    bool load = c->rt == R_LORA_LOAD;
    cJSON *o = pgd_api_body_check(c->body ? c->body : "", c->body_len, &e)
                   ? NULL
                   : pgd_api_json_parse(c->body ? c->body : "", c->body_len);
    if (o && pgd_api_json_unique_keys(o, &e)) {
        cJSON_Delete(o);
        return send_error(c, conn, &e);
    }
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(o, "lora_name");
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(o, "lora_path");
    if (!cJSON_IsString(n) || (load && !cJSON_IsString(p))) {
        cJSON_Delete(o);
        pgd_api_error_set(&e, 400, "invalid_request_error", cJSON_IsString(n) ? "lora_path"
                                                                              : "lora_name",
                          NULL, "the body must be {\"lora_name\": NAME%s}",
                          load ? ", \"lora_path\": DIR" : "");
        return send_error(c, conn, &e);
    }
    int32_t k = lora_slot_of(s, n->valuestring);
    if (!load) {
        if (!k) {
            pgd_api_error_set(&e, 404, "invalid_request_error", "lora_name", "model_not_found",
                              "The lora adapter '%.200s' cannot be found.", n->valuestring);
            cJSON_Delete(o);
            return send_error(c, conn, &e);
        }
        pgd_engine_unload_lora(s->engine, k);
        free(s->lora_names[k - 1]);
        free(s->lora_paths[k - 1]);
        s->lora_names[k - 1] = s->lora_paths[k - 1] = NULL;
        enum MHD_Result r = answer_text(c, conn, "Success: LoRA adapter '%s' removed "
                                        "successfully.", n->valuestring);
        cJSON_Delete(o);
        return r;
    }
    char why[320];
    bool taken = k || !strcmp(n->valuestring, s->model_name) ||
                 (s->lora_loading && !strcmp(n->valuestring, s->lora_loading));
    if (pgd_lora_name_check(n->valuestring, why, sizeof why) || taken) {
        if (taken)
            snprintf(why, sizeof why, "The lora adapter '%.200s' has already been loaded.",
                     n->valuestring);
        pgd_api_error_set(&e, 400, "invalid_request_error", "lora_name", NULL, "%s", why);
        cJSON_Delete(o);
        return send_error(c, conn, &e);
    }
    if (s->lora_loading) {
        pgd_api_error_set(&e, 429, "rate_limit_error", NULL, "lora_loading",
                          "the LoRA adapter '%.200s' is being loaded; retry", s->lora_loading);
        cJSON_Delete(o);
        return send_error(c, conn, &e);
    }
    c->lora_name = strdup(n->valuestring);
    c->lora_path = strdup(p->valuestring);
    s->lora_loading = strdup(n->valuestring);
    cJSON_Delete(o);
    if (!c->lora_name || !c->lora_path || !s->lora_loading) {
        free(s->lora_loading);
        s->lora_loading = NULL;
        pgd_api_error_set(&e, 500, "server_error", NULL, NULL, "out of memory");
        return send_error(c, conn, &e);
    }
    if (queue_conn_work(s, c, conn, lora_load_work_cb, lora_load_after_cb)) {
        free(s->lora_loading);
        s->lora_loading = NULL;
        pgd_api_error_set(&e, 500, "server_error", NULL, NULL, "cannot schedule the request");
        return send_error(c, conn, &e);
    }
    return MHD_YES;
}

/* GET /v1/kv_plan[?gpu=NAME]: the capacity plan for this server's model and KV budget. */
static enum MHD_Result answer_kv_plan(server *s, req_ctx *c, struct MHD_Connection *conn) {
    pgd_api_error e;
    pgd_err err = {{0}};
    pgd_kv_plan_input in;
    pgd_kv_plan_input_init(&in);
    int rc = pgd_kv_plan_model_load(s->cfg.model, &in.model, &err);
    if (!rc) {
        in.weight_dtype = in.model.file_bytes_per_param > 0 ? PGD_KV_PLAN_GGUF : in.model.config_dtype;
        rc = pgd_kv_plan_dtype_parse(s->cfg.kv_dtype, &in.kv_dtype);
        if (rc) pgd_err_set(&err, rc, "unknown KV dtype %s", s->cfg.kv_dtype);
    }
    in.kv_budget_bytes = (double)s->cfg.kv_cache_bytes;
    const char *gpu = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "gpu");
    if (!rc && gpu && (rc = pgd_kv_plan_gpu_preset(gpu, &in.hw))) {
        pgd_api_error_set(&e, 400, "invalid_request_error", "gpu", NULL,
                          "unknown GPU preset (a100-40gb, a100-80gb, h100-80gb, h200-141gb)");
        return send_error(c, conn, &e);
    }
    char *js = NULL;
    if (!rc) rc = pgd_kv_plan_json(&in, &js, &err);
    if (rc) {
        pgd_api_error_set(&e, 500, "server_error", NULL, NULL, "kv plan failed: %s", err.msg);
        return send_error(c, conn, &e);
    }
    c->status = 200;
    enum MHD_Result r = send_body(c, conn, 200, js, "application/json", NULL);
    free(js);
    return r;
}

/* ---- the API dialects: Anthropic Messages, Responses (api/dialect.h) ---- */

/* The dialect's body into c->api, through the chat request it becomes. A stream gets the usage
 * chunk (the dialects' closing events carry usage); a background response and count_tokens
 * do not stream. */
static int dialect_parse(server *s, req_ctx *c, pgd_api_error *e) {
    const char *body = c->body ? c->body : "";
    size_t len = c->body_len;
    if (pgd_api_body_check(body, len, e)) return -1;
    char *patched = NULL;
    if (c->rt == R_COUNT_TOKENS) { /* a Messages request less max_tokens, which it needs not */
        cJSON *o = pgd_api_json_parse(body, len);
        if (cJSON_IsObject(o) && !cJSON_GetObjectItemCaseSensitive(o, "max_tokens")) {
            cJSON_AddNumberToObject(o, "max_tokens", 1);
            if ((patched = cJSON_PrintUnformatted(o))) body = patched, len = strlen(patched);
        }
        cJSON_Delete(o);
    }
    c->denv = (pgd_dialect_env){.model = s->model_name, .request_id = c->id,
                                .created = c->created,
                                .store = c->rt == R_RESPONSES ? s->store : NULL,
                                .reasoning = s->reasoning_format != PGD_REASONING_NONE};
    cJSON *chat = NULL;
    int rc = c->dialect->begin(&c->denv, body, len, &chat, &c->dstate, e);
    free(patched);
    if (rc) return -1;
    if (c->rt == R_COUNT_TOKENS || (c->rt == R_RESPONSES && pgd_responses_background(c->dstate)))
        cJSON_DeleteItemFromObjectCaseSensitive(chat, "stream");
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(chat, "stream"))) {
        cJSON_DeleteItemFromObjectCaseSensitive(chat, "stream_options");
        cJSON *so = cJSON_AddObjectToObject(chat, "stream_options");
        cJSON_AddBoolToObject(so, "include_usage", true);
    }
    char *js = cJSON_PrintUnformatted(chat);
    cJSON_Delete(chat);
    if (!js) {
        pgd_api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
        return -1;
    }
    rc = pgd_api_parse(js, strlen(js), true, &s->limits, &c->api, e);
    free(js);
    return rc;
}

/* /v1/messages/count_tokens: the prompt the same /v1/messages request would be prefilled with. */
static void count_tokens_work_cb(uv_work_t *w) {
    req_ctx *c = w->data;
    pgd_api_prompt pr = {0};
    if (chat_prompt(c->s, &c->api, false, &pr, NULL, &c->err)) {
        c->has_err = true;
    } else {
        char buf[64];
        snprintf(buf, sizeof buf, "{\"input_tokens\":%d}", pr.n_ids);
        if ((c->resp = strdup(buf))) c->status = 200;
        else pgd_api_error_set(&c->err, 500, "server_error", NULL, NULL, "out of memory");
        c->has_err = !c->resp;
    }
    free(pr.ids);
}

/* background: true: the answer is the response as it stands (queued); the request runs on
 * detached from its connection, and its outcome goes into the store. */
static enum MHD_Result start_background(server *s, req_ctx *c, struct MHD_Connection *conn) {
    pgd_api_error e;
    char *snap = pgd_responses_snapshot(c->dstate);
    c->refs++; /* held by the work item */
    c->ph = PH_WORKING;
    c->work.data = c;
    if (!snap || uv_queue_work(&s->loop, &c->work, work_cb, after_work_cb)) {
        c->refs--;
        c->ph = PH_RESPOND;
        free(snap);
        pgd_api_error_set(&e, 500, "server_error", NULL, NULL, "cannot schedule the request");
        return send_error(c, conn, &e);
    }
    c->detached = true;
    c->det_next = s->detached;
    if (s->detached) s->detached->det_prev = c;
    s->detached = c;
    c->status = 200;
    enum MHD_Result r = send_body(c, conn, 200, snap, "application/json", NULL);
    free(snap);
    return r;
}

/* GET and DELETE /v1/responses/{id}, POST /v1/responses/{id}/cancel. */
static enum MHD_Result answer_stored_response(server *s, req_ctx *c, struct MHD_Connection *conn,
                                              const char *method, const char *url) {
    pgd_api_error e;
    const char *rest = url + strlen("/v1/responses/");
    size_t n = strcspn(rest, "/");
    bool cancel = !strcmp(rest + n, "/cancel");
    bool get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    char id[128];
    if (n == 0 || n >= sizeof id || (rest[n] && !cancel)) {
        pgd_api_error_set(&e, 404, "invalid_request_error", NULL, "not_found", "no route %s %s",
                          method, url);
        return send_error(c, conn, &e);
    }
    if (cancel ? strcmp(method, "POST") : !get && strcmp(method, "DELETE")) {
        c->allow = cancel ? "POST" : "GET, HEAD, DELETE";
        pgd_api_error_set(&e, 405, "invalid_request_error", NULL, "method_not_allowed",
                          "%s does not accept %s; use %s", url, method,
                          cancel ? "POST" : "GET or DELETE");
        return send_error(c, conn, &e);
    }
    memcpy(id, rest, n);
    id[n] = 0;
    for (req_ctx *d = cancel ? s->detached : NULL; d; d = d->det_next) {
        if (strcmp(d->id, id)) continue;
        d->cancelled = true;
        pgd_responses_mark_cancelled(d->dstate);
        for (int i = 0; i < d->n_choices; i++)
            if (d->submitted[i]) pgd_engine_abort(s->engine, d->engine_ids[i]);
        char *snap = pgd_responses_snapshot(d->dstate);
        c->status = snap ? 200 : 500;
        enum MHD_Result r = send_body(c, conn, c->status, snap ? snap : "{}", "application/json",
                                      NULL);
        free(snap);
        return r;
    }
    const cJSON *stored = s->store ? pgd_resp_store_get(s->store, id) : NULL;
    if (!stored) {
        pgd_api_error_set(&e, 404, "invalid_request_error", "response_id", "not_found",
                          "no response with id '%s' is stored", id);
        return send_error(c, conn, &e);
    }
    if (cancel) {
        pgd_api_error_set(&e, 400, "invalid_request_error", "response_id", NULL,
                          "only a background response that is still running can be cancelled");
        return send_error(c, conn, &e);
    }
    char *js = NULL;
    if (get) {
        js = cJSON_PrintUnformatted(stored);
    } else {
        pgd_resp_store_delete(s->store, id);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "id", id);
        cJSON_AddStringToObject(o, "object", "response");
        cJSON_AddBoolToObject(o, "deleted", true);
        js = cJSON_PrintUnformatted(o);
        cJSON_Delete(o);
    }
    c->status = js ? 200 : 500;
    enum MHD_Result r = send_body(c, conn, c->status, js ? js : "{}", "application/json", NULL);
    free(js);
    return r;
}

/* ---- routing ---- */

/* A route: its path (a trailing '*' matches any non-empty rest), the methods it answers (GET
 * also HEAD, whose answer MHD sends without the body) and its 405's Allow header. */
typedef struct route_def {
    const char *path;
    route rt;
    const char *methods, *allow;
} route_def;

static const route_def routes[] = {
    {"/v1/completions", R_COMPLETIONS, "POST", "POST"},
    {"/v1/chat/completions", R_CHAT, "POST", "POST"},
    {"/v1/embeddings", R_EMBED, "POST", "POST"},
    {"/v1/messages", R_MESSAGES, "POST", "POST"},
    {"/v1/messages/count_tokens", R_COUNT_TOKENS, "POST", "POST"},
    {"/v1/responses", R_RESPONSES, "POST", "POST"},
    {"/v1/responses/*", R_STORED, "GET, DELETE, POST", "GET, HEAD, DELETE, POST"},
    {"/tokenize", R_TOKENIZE, "POST", "POST"},
    {"/detokenize", R_DETOKENIZE, "POST", "POST"},
    {"/v1/models", R_MODELS, "GET", "GET, HEAD"},
    {"/v1/models/*", R_MODEL, "GET", "GET, HEAD"},
    {"/health", R_HEALTH, "GET", "GET, HEAD"},
    {"/metrics", R_METRICS, "GET", "GET, HEAD"},
    {"/version", R_VERSION, "GET", "GET, HEAD"},
    {"/v1/kv_plan", R_KV_PLAN, "GET", "GET, HEAD"},
    {"/v1/load_lora_adapter", R_LORA_LOAD, "POST", "POST"},
    {"/v1/unload_lora_adapter", R_LORA_UNLOAD, "POST", "POST"},
};

static const route_def *find_route(const char *url) {
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
        const char *p = routes[i].path;
        size_t n = strlen(p);
        if (p[n - 1] == '*' ? !strncmp(url, p, n - 1) && url[n - 1] : !strcmp(url, p))
            return &routes[i];
    }
    return NULL;
}

/* Whether method is one of the list's ("GET, DELETE"); GET lets HEAD in. */
static bool method_in(const char *list, const char *method) {
    const char *m = strcmp(method, "HEAD") ? method : "GET";
    size_t n = strlen(m);
    for (const char *p = strstr(list, m); p; p = strstr(p + 1, m))
        if ((p == list || p[-1] == ' ') && (p[n] == 0 || p[n] == ',')) return true;
    return false;
}

/* A CORS preflight's answer (Starlette's: 200 "OK", or 400 naming what it refuses). */
typedef struct header_list {
    const char *name[8], *value[8];
    char store[8][512];
    int n;
} header_list;
static void collect_header_cb(void *ctx, const char *name, const char *value) {
    header_list *h = ctx;
    if (h->n == 8) return;
    snprintf(h->store[h->n], sizeof h->store[h->n], "%s", value);
    h->name[h->n] = name;
    h->value[h->n] = h->store[h->n];
    h->n++;
}
static enum MHD_Result answer_preflight(server *s, req_ctx *c, struct MHD_Connection *conn,
                                        const char *origin, const char *req_method) {
    header_list h = {.n = 0};
    char txt[96];
    const char *req_headers =
        MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Access-Control-Request-Headers");
    int st = pgd_cors_preflight(&s->cors, origin, req_method, req_headers, collect_header_cb, &h,
                                txt, sizeof txt);
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(txt), txt, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    for (int i = 0; i < h.n; i++) MHD_add_response_header(r, h.name[i], h.value[i]);
    MHD_add_response_header(r, "Content-Type", "text/plain; charset=utf-8");
    c->origin[0] = 0; /* (its CORS headers are the preflight's) */
    c->status = st;
    common_headers(c, r);
    enum MHD_Result ret = MHD_queue_response(conn, (unsigned)st, r);
    MHD_destroy_response(r);
    return ret;
}

/* GET /v1/models/{id}: the model or an adapter, as /v1/models lists them (OpenAI's 404 else). */
static enum MHD_Result answer_model(server *s, req_ctx *c, struct MHD_Connection *conn,
                                    const char *id) {
    pgd_api_error e;
    cJSON *d = cJSON_CreateArray();
    if (served_name(s, id)) add_model_entry(s, d, id, NULL);
    for (int32_t i = 0; i < s->n_loras && !cJSON_GetArraySize(d); i++)
        if (s->lora_names[i] && !strcmp(id, s->lora_names[i]))
            add_model_entry(s, d, s->lora_names[i], s->lora_paths[i]);
    char *js = cJSON_GetArraySize(d) ? cJSON_PrintUnformatted(cJSON_GetArrayItem(d, 0)) : NULL;
    cJSON_Delete(d);
    if (!js) {
        pgd_api_error_set(&e, 404, "invalid_request_error", "model", "model_not_found",
                          "The model '%.200s' does not exist", id);
        return send_error(c, conn, &e);
    }
    enum MHD_Result r = send_body(c, conn, 200, js, "application/json", NULL);
    free(js);
    return r;
}

/* The routes answered without the engine, once their request has been read. */
static enum MHD_Result answer_get(server *s, req_ctx *c, struct MHD_Connection *conn,
                                  const char *method, const char *url) {
    switch (c->rt) {
    case R_HEALTH:
        return send_body(c, conn, s->ready ? 200 : 503,
                         s->ready ? "{\"status\":\"ok\"}"
                                  : (s->load_failed ? "{\"status\":\"failed\"}"
                                                    : "{\"status\":\"loading\"}"),
                         "application/json", s->ready ? NULL : "5");
    case R_METRICS: {
        /* The engine's gauges first, then the events it posted before them: a request the
         * gauges no longer count as running is in the finish counters of the same page. */
        pgd_engine_stats st;
        if (s->ready) {
            pgd_engine_get_stats(s->engine, &st);
            drain_events(s);
        }
        char *txt = pgd_metrics_render(&s->metrics, s->ready ? &st : NULL, s->model_name,
                                       (const char *const *)s->lora_names, s->n_loras);
        enum MHD_Result r = send_body(c, conn, 200, txt ? txt : "",
                                      "text/plain; version=0.0.4; charset=utf-8", NULL);
        free(txt);
        return r;
    }
    case R_VERSION:
        return send_body(c, conn, 200, "{\"version\":\"" PGD_VERSION "\"}", "application/json",
                         NULL);
    case R_MODELS: return answer_models(s, c, conn);
    case R_MODEL: return answer_model(s, c, conn, url + strlen("/v1/models/"));
    case R_KV_PLAN: return answer_kv_plan(s, c, conn);
    default: return answer_stored_response(s, c, conn, method, url);
    }
}

/* ---- the access handler ---- */

/* MHD_get_connection_values callback: counts the Content-Length headers whose value differs
 * from the first one's. */
struct cl_scan {
    const char *first;
    int differ;
};
static enum MHD_Result scan_content_length(void *cls, enum MHD_ValueKind kind, const char *key,
                                           const char *value) {
    struct cl_scan *sc = cls;
    (void)kind;
    if (!key || strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH)) return MHD_YES;
    if (!sc->first) sc->first = value ? value : "";
    else if (strcmp(sc->first, value ? value : "")) sc->differ++;
    return MHD_YES;
}

/* MHD_get_connection_values_n callback: what the guard checks of a first head, for the later
 * requests of a kept-alive connection, which MHD reads itself: bytes no header name has,
 * control bytes in values, repeated credentials, and the framing headers. (A NUL cutting a
 * value is not seen here: MHD 0.9.75 reports the length up to the NUL; the length check stays
 * for a version that reports the real one.) */
struct head_scan {
    int bad_byte, n_auth, n_xkey;
    const char *te;
};
static enum MHD_Result scan_head(void *cls, enum MHD_ValueKind kind, const char *key,
                                 size_t key_size, const char *value, size_t value_size) {
    struct head_scan *h = cls;
    (void)kind;
    if (!key) return MHD_YES;
    if (strlen(key) != key_size || (value && strlen(value) != value_size)) h->bad_byte++;
    for (size_t i = 0; i < key_size; i++) {
        unsigned char c = (unsigned char)key[i];
        if (c <= 0x20 || c >= 0x7f || strchr("\"(),/:;<=>?@[\\]{}", c)) h->bad_byte++;
    }
    for (size_t i = 0; value && i < value_size; i++)
        if (((unsigned char)value[i] < 0x20 && value[i] != '\t') || value[i] == 0x7f)
            h->bad_byte++;
    if (!strcasecmp(key, "Authorization")) h->n_auth++;
    if (!strcasecmp(key, "x-api-key")) h->n_xkey++;
    if (!strcasecmp(key, "Transfer-Encoding")) h->te = value ? value : "";
    return MHD_YES;
}

/* A refusal that closes the connection: what follows its head cannot be trusted to frame
 * the next request. */
static enum MHD_Result refuse_and_close(req_ctx *c, struct MHD_Connection *conn, int status,
                                        pgd_reject_reason why, const char *msg) {
    pgd_api_error e;
    pgd_api_error_set(&e, status, "invalid_request_error", NULL, "bad_request", "%s", msg);
    pgd_metrics_count_reject(&c->s->metrics, why);
    char *js = pgd_api_error_json(&e);
    const char *body = js ? js : "{}";
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(body), (void *)body, MHD_RESPMEM_MUST_COPY);
    free(js);
    if (!r) return MHD_NO;
    c->status = status;
    common_headers(c, r);
    MHD_add_response_header(r, "Content-Type", "application/json");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
    enum MHD_Result ret = MHD_queue_response(conn, (unsigned)status, r);
    MHD_destroy_response(r);
    return ret;
}

/* The key from "Authorization: Bearer KEY" (OpenAI's) or "x-api-key: KEY" (Anthropic's). */
static bool authorized(server *s, struct MHD_Connection *conn) {
    if (s->cfg.n_api_keys == 0) return true;
    const char *h = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization");
    const char *x = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "x-api-key");
    const char *given = h && !strncasecmp(h, "Bearer ", 7) ? h + 7 : x; /* scheme: any case */
    if (!given) return false;
    for (int i = 0; i < s->cfg.n_api_keys; i++) {
        /* constant-time compare of equal-length keys */
        const char *k = s->cfg.api_keys[i], *g = given;
        size_t kl = strlen(k), gl = strlen(g);
        unsigned diff = kl != gl;
        for (size_t j = 0; j < kl && j < gl; j++) diff |= (unsigned char)(k[j] ^ g[j]);
        if (!diff) return true;
    }
    return false;
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *conn, const char *url,
                               const char *method, const char *version, const char *upload,
                               size_t *upload_size, void **con_cls) {
    server *s = cls;
    (void)version;
    req_ctx *c = *con_cls;
    pgd_api_error e;
    if (!c) {
        c = calloc(1, sizeof *c);
        if (!c) return MHD_NO;
        c->s = s;
        c->conn = conn;
        c->model = s->model_name;
        c->refs = 1;
        c->live_next = s->live;
        if (s->live) s->live->live_prev = c;
        s->live = c;
        c->t_arrival = pgd_now_s();
        c->created = (long)time(NULL);
        c->status = 0;
        snprintf(c->method, sizeof c->method, "%s", method);
        snprintf(c->path, sizeof c->path, "%s", url);
        for (char *p = c->method; *p; p++) if (*p < 0x20 || *p == '"' || *p == '\\' || *p > 0x7e) *p = '?';
        for (char *p = c->path; *p; p++) if (*p < 0x20 || *p == '"' || *p == '\\' || *p > 0x7e) *p = '?';
        *con_cls = c;
        struct head_scan hs = {0, 0, 0, NULL};
        MHD_get_connection_values_n(conn, MHD_HEADER_KIND, scan_head, &hs);
        if (hs.bad_byte)
            return refuse_and_close(c, conn, 400, PGD_REJ_MALFORMED,
                                    "a NUL, control or separator byte in a header");
        if (hs.n_auth > 1 || hs.n_xkey > 1)
            return refuse_and_close(c, conn, 400, PGD_REJ_MALFORMED,
                                    "more than one Authorization or x-api-key header");
        if (hs.te && MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Length"))
            return refuse_and_close(c, conn, 400, PGD_REJ_SMUGGLING,
                                    "both Content-Length and Transfer-Encoding (RFC 9112 6.1)");
        if (hs.te && strcasecmp(hs.te, "chunked"))
            return refuse_and_close(c, conn, 501, PGD_REJ_CODING,
                                    "the only transfer coding accepted is a lone 'chunked'");
        const char *origin = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Origin");
        if (origin && strlen(origin) < sizeof c->origin) snprintf(c->origin, sizeof c->origin, "%s", origin);
        const char *xrid = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "X-Request-Id");
        if (xrid && *xrid && strlen(xrid) < sizeof c->xrid) { /* echoed: printable ASCII only */
            snprintf(c->xrid, sizeof c->xrid, "%s", xrid);
            for (char *p = c->xrid; *p; p++) if (*p < 0x20 || *p > 0x7e) *p = '?';
        }
        const char *acrm = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                                       "Access-Control-Request-Method");
        if (pgd_cors_is_preflight(method, origin, acrm)) {
            return answer_preflight(s, c, conn, origin, acrm);
        }
        const route_def *rd = find_route(url);
        if (rd && (rd->rt == R_LORA_LOAD || rd->rt == R_LORA_UNLOAD) &&
            !s->cfg.allow_runtime_lora_updating)
            rd = NULL; /* (vLLM's routes exist only when allowed too) */
        if (!rd) {
            pgd_api_error_set(&e, 404, "invalid_request_error", NULL, "not_found",
                              "no route %s %s", method, url);
            return send_error(c, conn, &e);
        }
        c->rt = rd->rt;
        c->dialect = rd->rt == R_MESSAGES || rd->rt == R_COUNT_TOKENS ? &pgd_dialect_anthropic
                     : rd->rt == R_RESPONSES                          ? &pgd_dialect_responses
                                                                      : NULL;
        if (!method_in(rd->methods, method)) {
            c->allow = rd->allow;
            pgd_api_error_set(&e, 405, "invalid_request_error", NULL, "method_not_allowed",
                              "%s does not accept %s; use %s", url, method, rd->methods);
            return send_error(c, conn, &e);
        }
        bool public_route = rd->rt == R_HEALTH || rd->rt == R_METRICS || rd->rt == R_VERSION;
        if ((!public_route || s->cfg.protect_health) && !authorized(s, conn)) {
            pgd_api_error_set(&e, 401, "authentication_error", NULL, "invalid_api_key",
                              "missing or incorrect API key (send 'Authorization: Bearer KEY' "
                              "or 'x-api-key: KEY')");
            return send_error(c, conn, &e);
        }
        /* answered once the request is read (any body ignored): a response queued before
         * that would close the connection */
        c->ph = PH_RECEIVING;
        if (rd->rt >= R_MODELS) return MHD_YES;
        if (!s->ready || s->draining) {
            pgd_api_error_set(&e, 503, "server_error", NULL, s->draining ? "shutting_down" : "loading",
                              s->draining ? "the server is shutting down"
                                          : "the model is still loading");
            return send_error(c, conn, &e);
        }
        /* A body Pagoda cannot read is refused before it is read (RFC 9110 15.5.16); a gzip
         * body would otherwise be "not valid UTF-8". */
        const char *enc = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Encoding");
        if (enc && *enc && strcasecmp(enc, "identity")) {
            pgd_api_error_set(&e, 415, "invalid_request_error", NULL, "unsupported_media_type",
                              "Content-Encoding '%.60s' is not supported: send the body "
                              "uncompressed", enc);
            return send_error(c, conn, &e);
        }
        /* Two different Content-Lengths: which one frames the body is ambiguous (request
         * smuggling behind a proxy that picked the other), so neither is taken (RFC 9112 6.3). */
        struct cl_scan sc = {NULL, 0};
        MHD_get_connection_values(conn, MHD_HEADER_KIND, scan_content_length, &sc);
        if (sc.differ) {
            pgd_api_error_set(&e, 400, "invalid_request_error", NULL, "bad_content_length",
                              "the request has Content-Length headers that disagree");
            return send_error(c, conn, &e);
        }
        /* A declared length past the limit is refused before the body is read (a client that
         * sent "Expect: 100-continue" then gets no 100 and never sends it). */
        const char *cl = sc.first;
        if (cl) {
            char *end;
            errno = 0;
            unsigned long long n = strtoull(cl, &end, 10);
            if (end != cl && (errno == ERANGE || n > (unsigned long long)s->cfg.max_body_bytes)) {
                pgd_api_error_set(&e, 413, "invalid_request_error", NULL, "request_too_large",
                                  "the request body exceeds %zu bytes", s->cfg.max_body_bytes);
                return send_error(c, conn, &e);
            }
        }
        return MHD_YES;
    }
    if (c->ph == PH_RECEIVING) {
        if (*upload_size && body_too_slow(s, c, *upload_size)) {
            if (!c->body_deadline_hit) pgd_metrics_count_reject(&s->metrics, PGD_REJ_BODY_TIMEOUT);
            c->body_deadline_hit = true;
            return MHD_NO; /* (closes: MHD 0.9.75 takes no answer while a body is read) */
        }
        if (*upload_size) {
            if (!c->too_large && c->body_len + *upload_size > s->cfg.max_body_bytes) {
                c->too_large = true;
            } else if (!c->too_large) {
                if (c->body_len + *upload_size + 1 > c->body_cap) {
                    size_t nc = (c->body_len + *upload_size + 1) * 2;
                    if (nc > s->cfg.max_body_bytes + 1) nc = s->cfg.max_body_bytes + 1;
                    char *b = realloc(c->body, nc);
                    if (!b) return MHD_NO;
                    c->body = b;
                    c->body_cap = nc;
                }
                memcpy(c->body + c->body_len, upload, *upload_size);
                c->body_len += *upload_size;
                c->body[c->body_len] = 0;
            }
            *upload_size = 0;
            return MHD_YES;
        }
        if (c->rt >= R_MODELS) return answer_get(s, c, conn, method, url);
        if (c->too_large) {
            pgd_api_error_set(&e, 413, "invalid_request_error", NULL, "request_too_large",
                              "the request body exceeds %zu bytes", s->cfg.max_body_bytes);
            return send_error(c, conn, &e);
        }
        if (c->rt == R_LORA_LOAD || c->rt == R_LORA_UNLOAD) return lora_update(s, c, conn);
        if (c->rt == R_TOKENIZE || c->rt == R_DETOKENIZE) {
            if (queue_conn_work(s, c, conn, tokenize_work_cb, tokenize_after_cb)) {
                pgd_api_error_set(&e, 500, "server_error", NULL, NULL,
                                  "cannot schedule the request");
                return send_error(c, conn, &e);
            }
            return MHD_YES;
        }
        if (c->dialect)
            snprintf(c->id, sizeof c->id, "%s_%016" PRIx64 "%08x",
                     c->rt == R_RESPONSES ? "resp" : "msg",
                     ((uint64_t)c->created << 24) ^ ++s->next_req, (unsigned)rand());
        if (c->dialect ? dialect_parse(s, c, &e)
            : c->rt == R_EMBED
                ? pgd_api_parse_embeddings(c->body ? c->body : "", c->body_len, &s->limits,
                                           pgd_engine_dim(s->engine), &c->api, &e)
                : pgd_api_parse(c->body ? c->body : "", c->body_len, c->rt == R_CHAT,
                                &s->limits, &c->api, &e))
            return send_error(c, conn, &e);
        c->api_parsed = true;
        c->model = s->model_name;
        if ((c->lora = lora_slot_of(s, c->api.model))) c->model = c->api.model;
        if (c->api.model && !c->lora && !served_name(s, c->api.model)) {
            pgd_api_error_set(&e, 404, "invalid_request_error", "model", "model_not_found",
                              "the model '%.200s' does not exist; this server serves '%s'%s",
                              c->api.model, s->model_name,
                              s->n_loras ? " and the LoRA adapters /v1/models lists" : "");
            return send_error(c, conn, &e);
        }
        if ((c->rt == R_CHAT || c->dialect) && !s->tmpl) {
            pgd_api_error_set(&e, 400, "invalid_request_error", "messages", NULL,
                              "this model has no chat template; use /v1/completions");
            return send_error(c, conn, &e);
        }
        if (c->rt == R_COUNT_TOKENS) {
            if (queue_conn_work(s, c, conn, count_tokens_work_cb, tokenize_after_cb)) {
                pgd_api_error_set(&e, 500, "server_error", NULL, NULL,
                                  "cannot schedule the request");
                return send_error(c, conn, &e);
            }
            return MHD_YES;
        }
        if ((c->rt == R_CHAT || c->dialect) && too_many_messages(s, c->api.messages, &e)) {
            pgd_metrics_count_reject(&s->metrics, PGD_REJ_OVERSIZED);
            return send_error(c, conn, &e);
        }
        if (tool_options(s, &c->api, &e)) return send_error(c, conn, &e);
        if (!c->dialect)
            snprintf(c->id, sizeof c->id, "%s-%016" PRIx64,
                     c->rt == R_CHAT ? "chatcmpl" : c->rt == R_EMBED ? "embd" : "cmpl",
                     ((uint64_t)c->created << 24) ^ ++s->next_req);
        if (c->rt == R_RESPONSES && pgd_responses_background(c->dstate))
            return start_background(s, c, conn);
        if (queue_conn_work(s, c, conn, work_cb, after_work_cb)) {
            pgd_api_error_set(&e, 500, "server_error", NULL, NULL, "cannot schedule the request");
            return send_error(c, conn, &e);
        }
        return MHD_YES;
    }
    if (s->stopping) return MHD_NO; /* shutdown: close instead of suspending again */
    if (c->ph == PH_WORKING || c->ph == PH_RUNNING) {
        /* resumed early (should not happen): wait again */
        c->suspended = true;
        MHD_suspend_connection(conn);
        return MHD_YES;
    }
    if (c->ph == PH_STREAMING) {
        if (c->status) return MHD_YES; /* response already queued */
        struct MHD_Response *r =
            MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_reader, c, NULL);
        if (!r) return MHD_NO;
        common_headers(c, r);
        /* (the charset, as OpenAI's: without it HTTP clients read the events as Latin-1) */
        MHD_add_response_header(r, "Content-Type", "text/event-stream; charset=utf-8");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        c->status = 200;
        enum MHD_Result ret = MHD_queue_response(conn, 200, r);
        MHD_destroy_response(r);
        return ret;
    }
    /* PH_RESPOND */
    if (c->status && c->resp == NULL && !c->has_err) return MHD_YES;
    if (c->has_err) return send_error(c, conn, &c->err);
    return send_body(c, conn, c->status ? c->status : 200, c->resp ? c->resp : "{}",
                     c->resp_type ? c->resp_type : "application/json", NULL);
}

/* term: MHD's termination code, or -1 when the connection ended while choices still ran (the
 * client left, or the drain timed out): then 499 (nginx's "client closed request") or 503, and
 * the tokens generated so far (the finish events that count them come after the abort). */
static void log_request(server *s, req_ctx *c, int term) {
    if (!s->cfg.log_requests) return;
    double t = pgd_now_s();
    /* has_err with engine requests still out: the shutdown's 503 (answer_unfinished) */
    int status = c->client_gone ? 499
                 : term == -1   ? (s->stopping || c->has_err ? 503 : 499)
                                : c->status;
    int completion = c->completion_tokens;
    if (term == -1) {
        int sum = 0;
        for (int i = 0; i < c->n_choices; i++) sum += c->choices[i].n_tokens;
        if (sum > completion) completion = sum;
    }
    /* acceptance is null, not NaN (invalid JSON), when nothing was proposed */
    char acc[32] = "null";
    if (c->spec_draft_tokens > 0)
        snprintf(acc, sizeof acc, "%.4f", (double)c->spec_accepted_tokens / c->spec_draft_tokens);
    fprintf(stderr,
            "{\"event\":\"request\",\"id\":\"%s\",\"method\":\"%s\",\"path\":\"%s\",\"status\":%d,"
            "\"prompt_tokens\":%d,\"completion_tokens\":%d,\"ttft_ms\":%.1f,\"total_ms\":%.1f,"
            "\"spec_draft_tokens\":%d,\"spec_accepted_tokens\":%d,\"spec_acceptance\":%s,"
            "\"client_closed\":%s}\n",
            c->id[0] ? c->id : "-", c->method, c->path, status, c->prompt_tokens, completion,
            c->t_first ? 1000 * (c->t_first - c->t_arrival) : 0.0, 1000 * (t - c->t_arrival),
            c->spec_draft_tokens, c->spec_accepted_tokens, acc,
            term == MHD_REQUEST_TERMINATED_COMPLETED_OK && !c->client_gone ? "false" : "true");
}

static void completed_cb(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    server *s = cls;
    req_ctx *c = *con_cls;
    if (!c) return;
    *con_cls = NULL;
    c->conn_done = true;
    if (c->live_prev) c->live_prev->live_next = c->live_next;
    else s->live = c->live_next;
    if (c->live_next) c->live_next->live_prev = c->live_prev;
    c->live_prev = c->live_next = NULL;
    run_list_remove(s, c); /* its connection is gone: the liveness check must not touch it */
    bool aborted = false;
    for (int i = 0; !c->detached && i < c->n_choices; i++)
        if (c->submitted[i]) {
            pgd_engine_abort(s->engine, c->engine_ids[i]); /* the client left: free its blocks */
            aborted = true;
        }
    log_request(s, c, aborted ? -1 : (int)toe);
    if (c->counted) s->in_flight--;
    bool big = c->body_cap >= (1u << 20);
    ctx_unref(c);
    /* A large body's parse and render left megabytes in the allocator's arenas (the thread
     * pool's among them): given back, at most once a second, so that RSS follows the load. */
    static double last_trim;
    if (big && pgd_now_s() - last_trim > 1.0) {
        malloc_trim(0);
        last_trim = pgd_now_s();
    }
}

/* ---- lifecycle ---- */

static void load_work_cb(uv_work_t *w) {
    server *s = w->data;
    pgd_engine_config ec;
    pgd_engine_config_default(&ec);
    ec.model_path = s->cfg.model;
    ec.weights_f32 = s->cfg.weights_f32;
    ec.n_threads = s->cfg.threads;
    ec.n_ctx = s->cfg.ctx;
    ec.block_size = s->cfg.block_size;
    ec.kv_cache_bytes = s->cfg.kv_cache_bytes;
    ec.kv_dtype = !strcmp(s->cfg.kv_dtype, "f16") ? PGD_KV_F16
                  : !strcmp(s->cfg.kv_dtype, "bf16") ? PGD_KV_BF16 : PGD_KV_F32;
    ec.max_num_batched_tokens = s->cfg.max_num_batched_tokens;
    ec.max_num_seqs = s->cfg.max_num_seqs;
    ec.no_prefix_caching = s->cfg.no_prefix_caching;
    ec.priority_scheduling = s->limits.priority_scheduling;
    ec.max_waiting = s->cfg.max_waiting;
    ec.speculative = !strcmp(s->cfg.speculative, "ngram")   ? PGD_SPEC_NGRAM
                     : !strcmp(s->cfg.speculative, "draft") ? PGD_SPEC_DRAFT
                                                            : PGD_SPEC_NONE;
    ec.num_speculative_tokens = s->cfg.num_speculative_tokens;
    ec.draft_model_path = s->cfg.draft_model;
    ec.speculative_disable_by_batch_size = s->cfg.speculative_disable_by_batch_size;
    ec.device = s->cfg.device;
    ec.tensor_parallel_size = s->cfg.tensor_parallel_size;
    ec.load_format_dummy = !strcmp(s->cfg.load_format, "dummy");
    ec.gpu_memory_utilization = s->cfg.gpu_memory_utilization;
    ec.lora_paths = (const char *const *)s->lora_paths;
    ec.n_loras = s->n_static_loras;
    ec.max_loras = s->n_loras;
    if (pgd_engine_create(&ec, &s->engine, s->load_error, sizeof s->load_error)) return;
    /* every endpoint takes or returns text: a dummy model needs the tokenizer beside its config */
    if (!pgd_engine_has_tokenizer(s->engine)) {
        snprintf(s->load_error, sizeof s->load_error, "%.300s: --load-format dummy found no "
                 "tokenizer.json beside the config, and the server needs one (pagoda generate "
                 "--ids and pagoda bench run without)", s->cfg.model);
        pgd_engine_free(s->engine);
        s->engine = NULL;
        return;
    }
    /* the server's own tokenizer handle, for the thread pool (tokenizers are immutable); a
     * dummy model's comes from the folder of its config.json */
    char tok_path[4096];
    snprintf(tok_path, sizeof tok_path, "%s", s->cfg.model);
    struct stat sb;
    if (ec.load_format_dummy && !(stat(tok_path, &sb) == 0 && S_ISDIR(sb.st_mode))) {
        char *slash = strrchr(tok_path, '/');
        if (!slash) snprintf(tok_path, sizeof tok_path, ".");
        else if (slash == tok_path) tok_path[1] = 0;
        else *slash = 0;
    }
    pgd_err err = {{0}};
    int rc = pgd_tokenizer_load_path(tok_path, &s->tok, &err);
    if (rc) {
        snprintf(s->load_error, sizeof s->load_error, "%s", err.msg);
        pgd_engine_free(s->engine);
        s->engine = NULL;
        return;
    }
    const char *tmpl = pgd_tokenizer_chat_template(s->tok);
    if (tmpl && pgd_jinja_parse(tmpl, strlen(tmpl), &s->tmpl, &err))
        fprintf(stderr, "{\"event\":\"warning\",\"message\":\"the chat template does not parse; "
                        "chat completions are off\"}\n");
    s->limits.n_vocab = pgd_tokenizer_n_vocab(s->tok);
    s->reasoning_format = (pgd_reasoning_format)pgd_reasoning_format_of(s->cfg.reasoning_parser);
    const char *tp = s->cfg.tool_call_parser;
    s->tool_format = !strcmp(tp, "hermes")        ? PGD_TOOLS_HERMES
                     : !strcmp(tp, "llama3_json") ? PGD_TOOLS_LLAMA3
                     : !strcmp(tp, "mistral")     ? PGD_TOOLS_MISTRAL
                     : !strcmp(tp, "auto")        ? pgd_tool_format_of_template(tmpl)
                                                  : PGD_TOOLS_NONE;
}

static void load_done_cb(uv_work_t *w, int status) {
    server *s = w->data;
    (void)status;
    s->loading = false;
    if (!s->engine) {
        fprintf(stderr, "pagoda: %s\n", s->load_error);
        s->load_failed = true;
        s->exit_code = 1;
        uv_stop(&s->loop);
        return;
    }
    if (pgd_engine_start(s->engine, engine_notify, &s->async)) {
        fprintf(stderr, "pagoda: cannot start the engine thread\n");
        s->exit_code = 1;
        uv_stop(&s->loop);
        return;
    }
    s->ready = true;
    fprintf(stderr, "{\"event\":\"ready\",\"model\":\"%s\",\"context\":%d}\n", s->model_name,
            pgd_engine_n_ctx(s->engine));
#ifdef PGD_HAVE_SYSTEMD
    sd_notify(0, "READY=1");
#endif
}

static void close_walk_cb(uv_handle_t *h, void *arg) {
    (void)arg;
    if (!uv_is_closing(h)) uv_close(h, NULL);
}

static void drain_check_cb(uv_timer_t *t) {
    server *s = t->data;
    static double started;
    if (started == 0) started = pgd_now_s();
    /* a SIGTERM while the model loads waits for the load: the pool thread is writing s->engine,
     * which the shutdown path reads and frees */
    if (s->loading) return;
    if (s->in_flight <= 0 || pgd_now_s() - started > s->cfg.drain_timeout) {
        if (s->in_flight > 0)
            fprintf(stderr, "{\"event\":\"drain_timeout\",\"in_flight\":%d}\n", s->in_flight);
        uv_stop(&s->loop);
    }
}

static void signal_cb(uv_signal_t *sig, int signum) {
    server *s = sig->data;
    if (s->draining) return;
    s->draining = true;
    fprintf(stderr, "{\"event\":\"draining\",\"signal\":%d,\"in_flight\":%d}\n", signum,
            s->in_flight);
#ifdef PGD_HAVE_SYSTEMD
    sd_notify(0, "STOPPING=1");
#endif
    /* stop accepting: close the listening socket; connections already open get 503 for new
     * requests and their in-flight ones finish */
    if (s->guard) pgd_http_guard_quiesce(s->guard);
    uv_timer_start(&s->drain_timer, drain_check_cb, 0, 50);
}

/* After the drain timed out: each non-streaming request still waiting for its answer gets a 503
 * error object, and each stream (whose 200 went out with its first event) ends with an error
 * event and [DONE], as OpenAI ends a stream that fails; their connections are resumed to send
 * them, for up to a second, not closed bare. */
static void answer_unfinished(server *s) {
    int n = 0;
    for (req_ctx *c = s->live; c; c = c->live_next) {
        bool waiting = c->ph == PH_RUNNING && c->suspended;
        bool streaming = c->ph == PH_STREAMING && !c->stream_done;
        if (c->conn_done || (!waiting && !streaming)) continue;
        pgd_api_error_set(&c->err, 503, "server_error", NULL, "shutting_down",
                          "the server shut down before the answer was ready (the drain "
                          "timeout, %d s, passed)", s->cfg.drain_timeout);
        c->has_err = true;
        if (streaming && c->dialect) {
            pgd_sbuf b = {0};
            c->dialect->stream_error(c->dstate, &c->err, &b);
            out_append_sbuf(c, &b);
            c->stream_done = true;
        } else if (streaming) {
            char *js = pgd_api_error_json(&c->err);
            static const char pre[] = "data: ", post[] = "\n\ndata: [DONE]\n\n";
            out_append(c, pre, sizeof pre - 1);
            if (js) out_append(c, js, strlen(js));
            out_append(c, post, sizeof post - 1);
            free(js);
            c->stream_done = true;
        } else {
            c->ph = PH_RESPOND;
        }
        resume(c);
        n++;
    }
    int target = s->in_flight - n;
    double t0 = pgd_now_s();
    while (n && s->in_flight > target && pgd_now_s() - t0 < 1.0) {
        MHD_run(s->mhd);
        if (s->in_flight > target) usleep(2000);
    }
}

/* A connection whose first head passed the guard: MHD reads it from here (refusing it past
 * --max-connections or --max-connections-per-client, and closing it then). */
static void guard_pass(void *arg, int fd, const struct sockaddr *addr, socklen_t addrlen) {
    server *s = arg;
    if (MHD_add_connection(s->mhd, fd, addr, addrlen) != MHD_YES) {
        pgd_metrics_count_reject(&s->metrics, PGD_REJ_PER_CLIENT);
        return;
    }
    run_mhd(s);
}

int pgd_serve(const pgd_server_config *cfg) {
    server *s = calloc(1, sizeof *s);
    if (!s) return 1;
    s->cfg = *cfg;
    s->events = calloc(256, sizeof *s->events);
    const char *base = strrchr(cfg->model, '/');
    base = base && base[1] ? base + 1 : cfg->model;
    /* --served-model-name: one name, or several separated by commas or spaces */
    const char *names = cfg->served_model_name ? cfg->served_model_name : base;
    size_t l0 = cfg->served_model_name ? strcspn(names, ", ") : strlen(names);
    snprintf(s->model_name, sizeof s->model_name, "%.*s", (int)l0, names);
    for (const char *p = names + l0; cfg->served_model_name && *p;) {
        p += strspn(p, ", ");
        size_t l = strcspn(p, ", ");
        if (l && s->n_aliases < 8 && (s->aliases[s->n_aliases] = strndup(p, l))) s->n_aliases++;
        p += l;
    }
    for (char *p = s->model_name; *p; p++) /* safe inside JSON logs and Prometheus labels */
        if ((unsigned char)*p < 0x20 || *p == '"' || *p == '\\') *p = '_';
    if (parse_lora_modules(s, cfg)) {
        for (int i = 0; i < PGD_SERVER_MAX_LORAS; i++)
            free(s->lora_names[i]), free(s->lora_paths[i]);
        free(s->events);
        free(s);
        return 2;
    }
    s->limits = (pgd_api_limits){.max_n = cfg->max_n, .max_logprobs = cfg->max_logprobs,
                                 .max_tokens_limit = cfg->max_tokens_limit,
                                 .max_prompts = cfg->max_prompts,
                                 .max_prompt_tokens = cfg->max_prompt_tokens, .n_vocab = 1,
                                 .priority_scheduling =
                                     !strcmp(cfg->scheduling_policy, "priority")};
    char cors_err[256];
    if (pgd_cors_init(&s->cors, cfg->allowed_origins, cfg->allowed_methods, cfg->allowed_headers,
                      cfg->allow_credentials, cors_err, sizeof cors_err)) {
        fprintf(stderr, "pagoda: %s\n", cors_err);
        return 2;
    }
    s->started = (long)time(NULL);
    if (cfg->responses_store_bytes &&
        !(s->store = pgd_resp_store_new(cfg->responses_store_bytes))) {
        fprintf(stderr, "pagoda: out of memory\n");
        return 1;
    }
    pgd_metrics_init(&s->metrics,
                     strcmp(cfg->speculative, "none") ? cfg->num_speculative_tokens : 0);
    uv_loop_init(&s->loop);
    struct sockaddr_storage addr;
    memset(&addr, 0, sizeof addr);
    if (uv_ip4_addr(cfg->host, cfg->port, (struct sockaddr_in *)&addr) &&
        uv_ip6_addr(cfg->host, cfg->port, (struct sockaddr_in6 *)&addr)) {
        fprintf(stderr, "pagoda: --host '%s' is not an IP address\n", cfg->host);
        return 1;
    }
    /* MHD listens on nothing: the guard accepts, checks each connection's first head and
     * hands it over (MHD_add_connection). STRICT_FOR_CLIENT 1 (Host required, no spaces in
     * URLs) covers the later requests of a kept-alive connection, which MHD reads itself. */
    unsigned flags = MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG |
                     MHD_USE_NO_LISTEN_SOCKET;
    s->mhd = MHD_start_daemon(flags, 0, NULL, NULL, handler, s,
                              MHD_OPTION_NOTIFY_COMPLETED, completed_cb, s,
                              MHD_OPTION_CONNECTION_LIMIT, (unsigned)cfg->max_connections,
                              MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)cfg->connection_timeout,
                              MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)cfg->max_header_bytes,
                              MHD_OPTION_PER_IP_CONNECTION_LIMIT,
                              (unsigned)cfg->max_connections_per_client,
                              MHD_OPTION_STRICT_FOR_CLIENT, (int)1, MHD_OPTION_END);
    pgd_http_guard_cfg gc = {.head_timeout_ms = cfg->request_head_timeout * 1000,
                             .max_pending = cfg->max_connections,
                             .max_per_client = cfg->max_connections_per_client,
                             .max_head_bytes = (size_t)cfg->max_header_bytes,
                             .max_body_bytes = cfg->max_body_bytes};
    int gerr = s->mhd ? pgd_http_guard_start(&s->loop, (struct sockaddr *)&addr, &gc,
                                             guard_pass, s, &s->metrics, &s->guard)
                      : -1;
    if (gerr) {
        fprintf(stderr, "pagoda: cannot listen on %s:%d%s%s\n", cfg->host, cfg->port,
                gerr < -1 ? ": " : "", gerr < -1 ? strerror(-gerr) : "");
        if (s->mhd) MHD_stop_daemon(s->mhd);
        return 1;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->mhd, MHD_DAEMON_INFO_EPOLL_FD);
    fprintf(stderr, "{\"event\":\"listening\",\"host\":\"%s\",\"port\":%d}\n", cfg->host,
            pgd_http_guard_port(s->guard));
    uv_poll_init(&s->loop, &s->poll, di->epoll_fd);
    s->poll.data = s;
    uv_poll_start(&s->poll, UV_READABLE, mhd_poll_cb);
    uv_timer_init(&s->loop, &s->timer);
    s->timer.data = s;
    uv_timer_init(&s->loop, &s->drain_timer);
    uv_timer_init(&s->loop, &s->liveness_timer);
    s->liveness_timer.data = s;
    uv_timer_start(&s->liveness_timer, liveness_cb, 500, 500);
    s->drain_timer.data = s;
    uv_async_init(&s->loop, &s->async, async_cb);
    s->async.data = s;
    uv_signal_init(&s->loop, &s->sigterm);
    uv_signal_init(&s->loop, &s->sigint);
    s->sigterm.data = s->sigint.data = s;
    uv_signal_start(&s->sigterm, signal_cb, SIGTERM);
    uv_signal_start(&s->sigint, signal_cb, SIGINT);
    signal(SIGPIPE, SIG_IGN);
    s->load_work.data = s;
    s->loading = uv_queue_work(&s->loop, &s->load_work, load_work_cb, load_done_cb) == 0;
    run_mhd(s);
    uv_run(&s->loop, UV_RUN_DEFAULT);
    /* shutdown: engine first (no more events), then HTTP, then the loop's handles */
    if (s->engine) pgd_engine_stop(s->engine);
    for (req_ctx *c = s->detached; c; c = c->det_next) /* background responses end here */
        for (int i = 0; i < c->n_choices; i++)
            if (c->submitted[i]) pgd_engine_abort(s->engine, c->engine_ids[i]);
    answer_unfinished(s);
    /* MHD refuses to stop with suspended connections (it aborts the process): resume them all;
     * stopping then closes them, which aborts their engine requests */
    s->stopping = true;
    for (req_ctx *c = s->live; c; c = c->live_next)
        if (c->suspended) {
            c->suspended = false;
            MHD_resume_connection(c->conn);
        }
    MHD_run(s->mhd);
    MHD_stop_daemon(s->mhd); /* completes every connection, aborting their requests */
    s->mhd = NULL;
    pgd_http_guard_close(s->guard); /* (freed by its handles' close callbacks below) */
    if (s->engine) {
        /* let the engine report those aborts so every request context is released */
        for (;;) {
            int n;
            while ((n = pgd_engine_poll(s->engine, s->events, 256, 0)) > 0)
                for (int i = 0; i < n; i++) handle_event(s, &s->events[i]);
            if (!pgd_engine_has_work(s->engine)) break;
            pgd_engine_step(s->engine);
        }
    }
    uv_walk(&s->loop, close_walk_cb, NULL);
    uv_run(&s->loop, UV_RUN_DEFAULT);
    uv_loop_close(&s->loop);
    int code = s->exit_code;
    if (!code) fprintf(stderr, "{\"event\":\"stopped\"}\n");
    pgd_engine_free(s->engine);
    if (s->tok) pgd_tokenizer_free(s->tok);
    if (s->tmpl) pgd_jinja_free(s->tmpl);
    free(s->events);
    for (int i = 0; i < s->n_loras; i++) free(s->lora_names[i]), free(s->lora_paths[i]);
    free(s->lora_loading);
    pgd_metrics_free(&s->metrics);
    if (s->store) pgd_resp_store_free(s->store);
    pgd_cors_free(&s->cors);
    for (int i = 0; i < s->n_aliases; i++) free(s->aliases[i]);
    free(s);
    return code;
}
