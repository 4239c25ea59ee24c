/* The server's transport: libmicrohttpd driven by the I/O thread's libuv loop, request heads
 * checked, bodies read, the route looked up and its handler called once the request is read,
 * answers and SSE frames buffered, connections suspended while the engine works and resumed when
 * it posts, the liveness check and the access log. No route's meaning lives here. */
#include "server/internal.h"

/* ---- the MHD <-> libuv glue ---- */
static void mhd_timer_cb(uv_timer_t *t);

static ctx_links *links_of(req_ctx *c, size_t links) { return (ctx_links *)((char *)c + links); }

void pgd__list_push(req_ctx **head, req_ctx *c, size_t links) {
    ctx_links *l = links_of(c, links);
    l->prev = NULL;
    l->next = *head;
    if (*head) links_of(*head, links)->prev = c;
    *head = c;
}

void pgd__list_unlink(req_ctx **head, req_ctx *c, size_t links) {
    ctx_links *l = links_of(c, links);
    if (l->prev) links_of(l->prev, links)->next = l->next;
    else *head = l->next;
    if (l->next) links_of(l->next, links)->prev = l->prev;
    l->prev = l->next = NULL;
}

void pgd__run_list_remove(server *s, req_ctx *c) {
    if (!c->in_run_list) return;
    pgd__list_unlink(&s->running, c, offsetof(req_ctx, run));
    c->in_run_list = false;
}

void pgd__run_list_add(server *s, req_ctx *c) {
    pgd__list_push(&s->running, c, offsetof(req_ctx, run));
    c->in_run_list = true;
}

void pgd__ctx_unref(req_ctx *c) {
    if (--c->refs > 0) return;
    pgd__run_list_remove(c->s, c);
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
    c->s->n_contexts--;
    free(c);
}

void pgd__detached_remove(server *s, req_ctx *c) {
    if (!c->detached) return;
    pgd__list_unlink(&s->detached, c, offsetof(req_ctx, det));
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

enum MHD_Result pgd__send_body(req_ctx *c, struct MHD_Connection *conn, int status,
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

enum MHD_Result pgd__send_error(req_ctx *c, struct MHD_Connection *conn, const pgd_api_error *e) {
    char *js = c && c->dialect ? c->dialect->error_json(e) : pgd_api_error_json(e);
    if (c) c->status = e->status;
    const char *retry = e->status == 429 || e->status == 503 ? "1" : NULL;
    enum MHD_Result r = pgd__send_body(c, conn, e->status, js ? js : "{}", "application/json", retry);
    free(js);
    return r;
}

/* A 200 with the JSON body js (taken: freed), or a 500 when js is NULL (out of memory). */
enum MHD_Result pgd__send_json(req_ctx *c, struct MHD_Connection *conn, char *js) {
    if (!js) {
        pgd_api_error e;
        pgd_api_error_set(&e, 500, "server_error", NULL, NULL, "out of memory");
        return pgd__send_error(c, conn, &e);
    }
    c->status = 200;
    enum MHD_Result r = pgd__send_body(c, conn, 200, js, "application/json", NULL);
    free(js);
    return r;
}

/* pgd__send_json of the object o (taken: deleted). */
enum MHD_Result pgd__send_cjson(req_ctx *c, struct MHD_Connection *conn, cJSON *o) {
    char *js = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return pgd__send_json(c, conn, js);
}

void pgd__out_append(req_ctx *c, const char *data, size_t n) {
    if (data) pgd_bytes_append(&c->out, &c->out_len, &c->out_cap, data, n);
}

void pgd__out_append_sbuf(req_ctx *c, pgd_sbuf *b) {
    if (b->len) pgd__out_append(c, b->data, b->len);
    pgd_sbuf_free(b);
}

/* One streamed frame ("data: {chunk}\n\n", taken): as it is, or through the request's dialect. */
void pgd__emit_frame(req_ctx *c, char *f) {
    if (!f) return;
    if (!c->dialect) {
        pgd__out_append(c, f, strlen(f));
    } else {
        cJSON *chunk = cJSON_Parse(f + (strncmp(f, "data: ", 6) ? 0 : 6));
        pgd_sbuf b = {0};
        if (chunk) c->dialect->stream_chunk(c->dstate, chunk, &b);
        cJSON_Delete(chunk);
        pgd__out_append_sbuf(c, &b);
    }
    free(f);
}

/* The end of a stream: chat's [DONE], or the dialect's closing events. */
void pgd__emit_end(req_ctx *c) {
    static const char done[] = "data: [DONE]\n\n";
    if (!c->dialect) {
        pgd__out_append(c, done, sizeof done - 1);
        return;
    }
    pgd_sbuf b = {0};
    c->dialect->stream_end(c->dstate, &b);
    pgd__out_append_sbuf(c, &b);
}

void pgd__resume(req_ctx *c) {
    if (c->suspended && !c->conn_done) {
        c->suspended = false;
        MHD_resume_connection(c->conn);
    }
}

void pgd__run_mhd(server *s) {
    if (!s->mhd) return;
    MHD_run(s->mhd);
    MHD_UNSIGNED_LONG_LONG to;
    if (MHD_get_timeout(s->mhd, &to) == MHD_YES)
        uv_timer_start(&s->timer, mhd_timer_cb, to > 1000 ? 1000 : to, 0);
    else
        uv_timer_start(&s->timer, mhd_timer_cb, 1000, 0);
}

static void mhd_timer_cb(uv_timer_t *t) { pgd__run_mhd(t->data); }

void pgd__mhd_poll_cb(uv_poll_t *p, int status, int events) {
    (void)status, (void)events;
    pgd__run_mhd(p->data);
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

void pgd__liveness_cb(uv_timer_t *t) {
    server *s = t->data;
    for (req_ctx *c = s->running, *next; c; c = next) {
        next = c->run.next;
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(c->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (!ci) continue;
        char b;
        ssize_t r = recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
        if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
            pgd__run_list_remove(s, c);
            c->client_gone = true;
            for (int i = 0; i < c->n_choices; i++)
                if (c->submitted[i]) pgd_engine_abort(s->engine, c->engine_ids[i]);
        }
    }
    /* a body that stopped coming (the pgd__handler, called per piece, sees only the slow ones):
     * shutting its socket makes MHD close the connection at its next read */
    for (req_ctx *c = s->live; c; c = c->live.next) {
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

/* Runs `run` on the thread pool with the connection suspended (the work holds a reference to
 * c; `after` resumes it). -1, with nothing held or suspended, when the work cannot be queued. */
int pgd__queue_conn_work(server *s, req_ctx *c, struct MHD_Connection *conn,
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

/* The after callback of work that filled c's answer (resp and status, or err): sends it. */
void pgd__after_work_respond(uv_work_t *w, int status) {
    req_ctx *c = w->data;
    server *s = c->s;
    (void)status;
    c->ph = PH_RESPOND;
    pgd__resume(c);
    pgd__ctx_unref(c); /* the work's reference */
    pgd__run_mhd(s);
}

/* pgd__queue_conn_work, or a 500 when the work cannot be queued. */
enum MHD_Result pgd__answer_after_work(server *s, req_ctx *c, struct MHD_Connection *conn,
                                       uv_work_cb run, uv_after_work_cb after) {
    if (!pgd__queue_conn_work(s, c, conn, run, after)) return MHD_YES;
    pgd_api_error e;
    pgd_api_error_set(&e, 500, "server_error", NULL, NULL, "cannot schedule the request");
    return pgd__send_error(c, conn, &e);
}

/* ---- LoRA adapters at run time ---- */

/* A 200 answer of plain text (vLLM answers its LoRA routes so). */
enum MHD_Result pgd__answer_text(req_ctx *c, struct MHD_Connection *conn, const char *fmt,
                                   const char *name) {
    char txt[320];
    snprintf(txt, sizeof txt, fmt, name);
    c->status = 200;
    c->ph = PH_RESPOND;
    return pgd__send_body(c, conn, 200, txt, "text/plain; charset=utf-8", NULL);
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

/* ---- the access pgd__handler ---- */

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

/* MHD_get_connection_values_n callback: a second line of defence behind the guard, which checks
 * every request head before MHD reads it (http_guard.c): bytes no header name has, control
 * bytes in values, repeated credentials, and the framing headers. (A NUL cutting a value is not
 * seen here: MHD 0.9.75 reports the length up to the NUL; the guard refuses it.) */
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

enum MHD_Result pgd__handler(void *cls, struct MHD_Connection *conn, const char *url,
                               const char *method, const char *version, const char *upload,
                               size_t *upload_size, void **con_cls) {
    server *s = cls;
    (void)version;
    req_ctx *c = *con_cls;
    pgd_api_error e;
    if (!c) {
        c = calloc(1, sizeof *c);
        if (!c) return MHD_NO;
        s->n_contexts++;
        c->s = s;
        c->conn = conn;
        c->model = s->model_name;
        c->refs = 1;
        pgd__list_push(&s->live, c, offsetof(req_ctx, live));
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
        const route_def *rd = pgd__find_route(url);
        if (rd && (rd->flags & ROUTE_LORA_ADMIN) && !s->cfg.allow_runtime_lora_updating)
            rd = NULL; /* (vLLM's routes exist only when allowed too) */
        if (!rd) {
            pgd_api_error_set(&e, 404, "invalid_request_error", NULL, "not_found",
                              "no route %s %s", method, url);
            return pgd__send_error(c, conn, &e);
        }
        c->rt = rd->rt;
        c->route = rd;
        c->dialect = rd->rt == R_MESSAGES || rd->rt == R_COUNT_TOKENS ? &pgd_dialect_anthropic
                     : rd->rt == R_RESPONSES                          ? &pgd_dialect_responses
                                                                      : NULL;
        if (!pgd__method_in(rd->methods, method)) {
            c->allow = rd->allow;
            pgd_api_error_set(&e, 405, "invalid_request_error", NULL, "method_not_allowed",
                              "%s does not accept %s; use %s", url, method, rd->methods);
            return pgd__send_error(c, conn, &e);
        }
        if ((!(rd->flags & ROUTE_PUBLIC) || s->cfg.protect_health) && !authorized(s, conn)) {
            pgd_api_error_set(&e, 401, "authentication_error", NULL, "invalid_api_key",
                              "missing or incorrect API key (send 'Authorization: Bearer KEY' "
                              "or 'x-api-key: KEY')");
            return pgd__send_error(c, conn, &e);
        }
        /* answered once the request is read (any body ignored): a response queued before
         * that would close the connection */
        c->ph = PH_RECEIVING;
        if (rd->flags & ROUTE_NO_ENGINE) return MHD_YES;
        if (!s->ready || s->draining) {
            pgd_api_error_set(&e, 503, "server_error", NULL, s->draining ? "shutting_down" : "loading",
                              s->draining ? "the server is shutting down"
                                          : "the model is still loading");
            return pgd__send_error(c, conn, &e);
        }
        /* A body Pagoda cannot read is refused before it is read (RFC 9110 15.5.16); a gzip
         * body would otherwise be "not valid UTF-8". */
        const char *enc = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Encoding");
        if (enc && *enc && strcasecmp(enc, "identity")) {
            pgd_api_error_set(&e, 415, "invalid_request_error", NULL, "unsupported_media_type",
                              "Content-Encoding '%.60s' is not supported: send the body "
                              "uncompressed", enc);
            return pgd__send_error(c, conn, &e);
        }
        /* Two different Content-Lengths: which one frames the body is ambiguous (request
         * smuggling behind a proxy that picked the other), so neither is taken (RFC 9112 6.3). */
        struct cl_scan sc = {NULL, 0};
        MHD_get_connection_values(conn, MHD_HEADER_KIND, scan_content_length, &sc);
        if (sc.differ) {
            pgd_api_error_set(&e, 400, "invalid_request_error", NULL, "bad_content_length",
                              "the request has Content-Length headers that disagree");
            return pgd__send_error(c, conn, &e);
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
                return pgd__send_error(c, conn, &e);
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
        if (c->route->flags & ROUTE_NO_ENGINE) return c->route->handler(s, c, conn, method, url);
        if (c->too_large) {
            pgd_api_error_set(&e, 413, "invalid_request_error", NULL, "request_too_large",
                              "the request body exceeds %zu bytes", s->cfg.max_body_bytes);
            return pgd__send_error(c, conn, &e);
        }
        return c->route->handler(s, c, conn, method, url);
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
    if (c->has_err) return pgd__send_error(c, conn, &c->err);
    return pgd__send_body(c, conn, c->status ? c->status : 200, c->resp ? c->resp : "{}",
                     c->resp_type ? c->resp_type : "application/json", NULL);
}

/* term: MHD's termination code, or -1 when the connection ended while choices still ran (the
 * client left, or the drain timed out): then 499 (nginx's "client closed request") or 503, and
 * the tokens generated so far (the finish events that count them come after the abort). */
static void log_request(server *s, req_ctx *c, int term) {
    if (!s->cfg.log_requests) return;
    double t = pgd_now_s();
    /* has_err with engine requests still out: the shutdown's 503 (pgd__answer_unfinished) */
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

void pgd__completed_cb(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    server *s = cls;
    req_ctx *c = *con_cls;
    if (!c) return;
    *con_cls = NULL;
    c->conn_done = true;
    pgd__list_unlink(&s->live, c, offsetof(req_ctx, live));
    pgd__run_list_remove(s, c); /* its connection is gone: the liveness check must not touch it */
    bool aborted = false;
    for (int i = 0; !c->detached && i < c->n_choices; i++)
        if (c->submitted[i]) {
            pgd_engine_abort(s->engine, c->engine_ids[i]); /* the client left: free its blocks */
            aborted = true;
        }
    log_request(s, c, aborted ? -1 : (int)toe);
    if (c->counted) s->in_flight--;
    bool big = c->body_cap >= (1u << 20);
    pgd__ctx_unref(c);
    /* A large body's parse and render left megabytes in the allocator's arenas (the thread
     * pool's among them): given back, at most once a second, so that RSS follows the load. */
    static double last_trim;
    if (big && pgd_now_s() - last_trim > 1.0) {
        malloc_trim(0);
        last_trim = pgd_now_s();
    }
}

/* A connection whose first head passed the guard: MHD reads it from here (refusing it past
 * --max-connections or --max-connections-per-client, and closing it then). */
void pgd__guard_pass(void *arg, int fd, const struct sockaddr *addr, socklen_t addrlen) {
    server *s = arg;
    if (MHD_add_connection(s->mhd, fd, addr, addrlen) != MHD_YES) {
        pgd_metrics_count_reject(&s->metrics, PGD_REJ_PER_CLIENT);
        return;
    }
    pgd__run_mhd(s);
}
