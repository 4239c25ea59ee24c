/* Engine events into answers, on the I/O thread: tokens into streamed chunks (through the
 * dialect for the Messages and Responses APIs) or into the whole body, logprobs, echo, the
 * finish and the usage; a request's context is released when its last choice finishes. */
#include "server/internal.h"

static void finish_request(server *s, req_ctx *c);

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
    if (f) pgd__out_append(c, f, strlen(f));
    free(f);
}

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
        pgd__emit_frame(c, pgd_api_tool_calls_chunk_sse(&c->api, c->id, c->created, c->model, i,
                                                   !c->role_sent[i], calls, NULL, NULL));
        c->role_sent[i] = true;
    }
    if (fin)
        pgd__emit_frame(c, pgd_api_chunk_sse(&c->api, c->id, c->created, c->model, i, "", 0, NULL, 0,
                                        false, fin, ch, NULL));
}

void pgd__handle_event(server *s, const pgd_event *ev) {
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
            pgd__resume(c);
            text_len = 0, lp = NULL, fin = NULL; /* all sent */
        } else if (c->api.tool_format || c->api.reasoning) {
            pgd_api_delta d;
            pgd_api_stream_split(&c->api, c->id, i, ch, ev->text, (size_t)ev->text_len, &fin, &d);
            rtext = d.reasoning, rlen = d.reasoning_len;
            text = d.content, text_len = d.content_len, calls = d.calls;
        }
        if (text_len || rlen || lp || (fin && !calls) || (!c->role_sent[i] && !streams_named_call(c))) {
            pgd__emit_frame(c, pgd_api_chunk_sse(&c->api, c->id, c->created, c->model, i, text,
                                            text_len, rtext, rlen,
                                            c->api.chat && !c->role_sent[i], calls ? NULL : fin,
                                            ch, lp));
            c->role_sent[i] = true;
        }
        if (calls)
            pgd__emit_frame(c, pgd_api_tool_calls_chunk_sse(&c->api, c->id, c->created, c->model, i,
                                                       false, calls, fin, ch));
        pgd__resume(c);
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
    pgd__ctx_unref(c);
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
void pgd__finish_detached(server *s, req_ctx *c) {
    pgd__detached_remove(s, c);
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
    pgd__run_list_remove(s, c);
    pgd_metrics_observe(&s->metrics, PGD_H_E2E, t - c->t_arrival);
    if (c->detached) {
        pgd__finish_detached(s, c);
        return;
    }
    if (c->conn_done) return;
    if (c->api.stream && c->ph == PH_STREAMING) {
        if (c->api.include_usage)
            pgd__emit_frame(c, pgd_api_usage_chunk_sse(&c->api, c->id, c->created, c->model,
                                                  c->prompt_tokens, c->completion_tokens));
        pgd__emit_end(c);
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
    pgd__resume(c);
}

/* Handles every event the engine has posted. */
void pgd__drain_events(server *s) {
    int n;
    while ((n = pgd_engine_poll(s->engine, s->events, 256, 0)) > 0)
        for (int i = 0; i < n; i++) pgd__handle_event(s, &s->events[i]);
}

void pgd__async_cb(uv_async_t *a) {
    server *s = a->data;
    pgd__drain_events(s);
    pgd__run_mhd(s);
}

void pgd__engine_notify(void *arg) { uv_async_send(arg); }
