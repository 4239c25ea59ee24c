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
#include "server/internal.h"

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
bool pgd__served_name(const server *s, const char *name) {
    if (!strcmp(name, s->model_name)) return true;
    for (int i = 0; i < s->n_aliases; i++)
        if (!strcmp(name, s->aliases[i])) return true;
    return false;
}

/* The slot of the adapter named name, 0 for none. */
int32_t pgd__lora_slot_of(const server *s, const char *name) {
    for (int i = 0; name && i < s->n_loras; i++)
        if (s->lora_names[i] && !strcmp(name, s->lora_names[i])) return i + 1;
    return 0;
}

/* ---- lifecycle ---- */

static void load_work_cb(uv_work_t *w) {
    server *s = w->data;
    pgd_engine_config ec; /* the options table's, as generate, batch and bench make it */
    pgd_engine_opts_config(&s->cfg.engine, &ec);
    ec.max_waiting = s->cfg.max_waiting;
    ec.lora_paths = (const char *const *)s->lora_paths;
    ec.n_loras = s->n_static_loras;
    ec.max_loras = s->n_loras;
    ec.kv_events_config = s->cfg.kv_events_config;
    ec.kv_cache_dir = s->cfg.kv_cache_dir;
    ec.kv_cache_disk_bytes = s->cfg.kv_cache_disk_bytes;
    if (pgd_engine_create(&ec, &s->engine, s->load_error, sizeof s->load_error)) return;
    for (int i = 0; i < s->n_static_loras; i++) /* (KV events carry the served names) */
        if (pgd_engine_set_lora_name(s->engine, i + 1, s->lora_names[i])) {
            snprintf(s->load_error, sizeof s->load_error, "out of memory");
            pgd_engine_free(s->engine);
            s->engine = NULL;
            return;
        }
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
    s->metrics.block_size = s->cfg.block_size;
    s->metrics.cache_dtype = s->cfg.kv_dtype;
    s->metrics.prefix_caching = !s->cfg.no_prefix_caching;
    if (pgd_engine_start(s->engine, pgd__engine_notify, &s->async)) {
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
void pgd__answer_unfinished(server *s) {
    int n = 0;
    for (req_ctx *c = s->live; c; c = c->live.next) {
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
            pgd__out_append_sbuf(c, &b);
            c->stream_done = true;
        } else if (streaming) {
            char *js = pgd_api_error_json(&c->err);
            static const char pre[] = "data: ", post[] = "\n\ndata: [DONE]\n\n";
            pgd__out_append(c, pre, sizeof pre - 1);
            if (js) pgd__out_append(c, js, strlen(js));
            pgd__out_append(c, post, sizeof post - 1);
            free(js);
            c->stream_done = true;
        } else {
            c->ph = PH_RESPOND;
        }
        pgd__resume(c);
        n++;
    }
    int target = s->in_flight - n;
    double t0 = pgd_now_s();
    while (n && s->in_flight > target && pgd_now_s() - t0 < 1.0) {
        MHD_run(s->mhd);
        if (s->in_flight > target) usleep(2000);
    }
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
    s->metrics.prefix = s->cfg.metrics_prefix;
    uv_loop_init(&s->loop);
    struct sockaddr_storage addr;
    memset(&addr, 0, sizeof addr);
    if (uv_ip4_addr(cfg->host, cfg->port, (struct sockaddr_in *)&addr) &&
        uv_ip6_addr(cfg->host, cfg->port, (struct sockaddr_in6 *)&addr)) {
        fprintf(stderr, "pagoda: --host '%s' is not an IP address\n", cfg->host);
        return 1;
    }
    /* MHD listens on nothing: the guard accepts, checks every request head and relays each
     * connection to MHD through a socketpair (MHD_add_connection); its logger drops what MHD
     * says of TCP options on that Unix socket. STRICT_FOR_CLIENT 1: Host required. */
    unsigned flags = MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG |
                     MHD_USE_NO_LISTEN_SOCKET;
    s->mhd = MHD_start_daemon(flags, 0, NULL, NULL, pgd__handler, s,
                              MHD_OPTION_EXTERNAL_LOGGER, pgd_http_guard_mhd_log, NULL,
                              MHD_OPTION_NOTIFY_COMPLETED, pgd__completed_cb, s,
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
                                             pgd__guard_pass, s, &s->metrics, &s->guard)
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
    uv_poll_start(&s->poll, UV_READABLE, pgd__mhd_poll_cb);
    uv_timer_init(&s->loop, &s->timer);
    s->timer.data = s;
    uv_timer_init(&s->loop, &s->drain_timer);
    uv_timer_init(&s->loop, &s->liveness_timer);
    s->liveness_timer.data = s;
    uv_timer_start(&s->liveness_timer, pgd__liveness_cb, 500, 500);
    s->drain_timer.data = s;
    uv_async_init(&s->loop, &s->async, pgd__async_cb);
    s->async.data = s;
    uv_signal_init(&s->loop, &s->sigterm);
    uv_signal_init(&s->loop, &s->sigint);
    s->sigterm.data = s->sigint.data = s;
    uv_signal_start(&s->sigterm, signal_cb, SIGTERM);
    uv_signal_start(&s->sigint, signal_cb, SIGINT);
    signal(SIGPIPE, SIG_IGN);
    s->load_work.data = s;
    s->loading = uv_queue_work(&s->loop, &s->load_work, load_work_cb, load_done_cb) == 0;
    pgd__run_mhd(s);
    uv_run(&s->loop, UV_RUN_DEFAULT);
    /* shutdown: engine first (no more events), then HTTP, then the loop's handles */
    if (s->engine) pgd_engine_stop(s->engine);
    for (req_ctx *c = s->detached; c; c = c->det.next) /* background responses end here */
        for (int i = 0; i < c->n_choices; i++)
            if (c->submitted[i]) pgd_engine_abort(s->engine, c->engine_ids[i]);
    pgd__answer_unfinished(s);
    /* MHD refuses to stop with suspended connections (it aborts the process): pgd__resume them all;
     * stopping then closes them, which aborts their engine requests */
    s->stopping = true;
    for (req_ctx *c = s->live; c; c = c->live.next)
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
                for (int i = 0; i < n; i++) pgd__handle_event(s, &s->events[i]);
            if (!pgd_engine_has_work(s->engine)) break;
            pgd_engine_step(s->engine);
        }
    }
    uv_walk(&s->loop, close_walk_cb, NULL);
    uv_run(&s->loop, UV_RUN_DEFAULT);
    uv_loop_close(&s->loop);
    int code = s->exit_code;
    if (!code) fprintf(stderr, "{\"event\":\"stopped\",\"contexts_left\":%d}\n", s->n_contexts);
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
