/* The API routes: /v1/completions, /v1/chat/completions, /v1/embeddings, /v1/messages (and
 * count_tokens), /v1/responses (and the stored ones), /tokenize, /detokenize and /v1/models.
 * A body is parsed on the I/O thread (api/), the template, tokenization and constraint
 * compilation run on the thread pool (work_cb), then submit_all hands the choices to the engine
 * through api/params.c. */
#include "server/internal.h"

/* A chat request: /v1/chat/completions or its render. */
static bool is_chat(const req_ctx *c) { return c->rt == R_CHAT || c->rt == R_CHAT_RENDER; }

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
    if (c->lora && pgd__lora_slot_of(s, c->model) != c->lora) { /* unloaded while the work ran */
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
        if (c->detached) pgd__finish_detached(s, c); /* stores the failure */
    } else {
        c->ph = c->api.stream ? PH_STREAMING : PH_RUNNING;
        if (!c->detached) pgd__run_list_add(s, c); /* streams too: a scored echo sends nothing */
        else pgd_responses_mark_running(c->dstate); /* GET /v1/responses/{id}: in_progress */
        c->t_submitted = pgd_now_s();
        if (c->api.stream && c->dialect) {
            pgd_sbuf b = {0};
            c->denv.prompt_tokens = c->prompt_tokens;
            c->dialect->stream_start(c->dstate, &b);
            pgd__out_append_sbuf(c, &b);
        } else if (c->api.stream) {
            /* echo goes out first */
            for (int i = 0; i < c->n_choices; i++)
                if (c->echo_len[i] && !c->choices[i].echo_pending) {
                    char *f = pgd_api_chunk_sse(&c->api, c->id, c->created, c->model, i,
                                                c->choices[i].text, c->echo_len[i], NULL, 0,
                                                false, NULL, NULL, NULL);
                    if (f) pgd__out_append(c, f, strlen(f));
                    free(f);
                }
        }
    }
    if (c->has_err || c->api.stream) pgd__resume(c); /* non-streaming answers wait for the finish */
    pgd__ctx_unref(c); /* the work's reference */
    pgd__run_mhd(s);
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

enum MHD_Result pgd__answer_models(server *s, req_ctx *c, struct MHD_Connection *conn,
                                     const char *method, const char *url) {
    (void)method, (void)url;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON *d = cJSON_AddArrayToObject(o, "data");
    add_model_entry(s, d, s->model_name, NULL);
    for (int i = 0; i < s->n_aliases; i++) add_model_entry(s, d, s->aliases[i], NULL);
    for (int32_t i = 0; i < s->n_loras; i++)
        if (s->lora_names[i]) add_model_entry(s, d, s->lora_names[i], s->lora_paths[i]);
    return pgd__send_cjson(c, conn, o);
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
        return pgd__send_error(c, conn, &e);
    }
    c->detached = true;
    pgd__list_push(&s->detached, c, offsetof(req_ctx, det));
    return pgd__send_json(c, conn, snap);
}

/* GET and DELETE /v1/responses/{id}, POST /v1/responses/{id}/cancel. */
enum MHD_Result pgd__answer_stored_response(server *s, req_ctx *c, struct MHD_Connection *conn,
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
        return pgd__send_error(c, conn, &e);
    }
    if (cancel ? strcmp(method, "POST") : !get && strcmp(method, "DELETE")) {
        c->allow = cancel ? "POST" : "GET, HEAD, DELETE";
        pgd_api_error_set(&e, 405, "invalid_request_error", NULL, "method_not_allowed",
                          "%s does not accept %s; use %s", url, method,
                          cancel ? "POST" : "GET or DELETE");
        return pgd__send_error(c, conn, &e);
    }
    memcpy(id, rest, n);
    id[n] = 0;
    for (req_ctx *d = cancel ? s->detached : NULL; d; d = d->det.next) {
        if (strcmp(d->id, id)) continue;
        d->cancelled = true;
        pgd_responses_mark_cancelled(d->dstate);
        for (int i = 0; i < d->n_choices; i++)
            if (d->submitted[i]) pgd_engine_abort(s->engine, d->engine_ids[i]);
        char *snap = pgd_responses_snapshot(d->dstate);
        enum MHD_Result r = pgd__send_json(c, conn, snap);
        return r;
    }
    const cJSON *stored = s->store ? pgd_resp_store_get(s->store, id) : NULL;
    if (!stored) {
        pgd_api_error_set(&e, 404, "invalid_request_error", "response_id", "not_found",
                          "no response with id '%s' is stored", id);
        return pgd__send_error(c, conn, &e);
    }
    if (cancel) {
        pgd_api_error_set(&e, 400, "invalid_request_error", "response_id", NULL,
                          "only a background response that is still running can be cancelled");
        return pgd__send_error(c, conn, &e);
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
    return pgd__send_json(c, conn, js);
}

/* ---- routing ---- */

/* A route: its path (a trailing '*' matches any non-empty rest), the methods it answers (GET
 * also HEAD, whose answer MHD sends without the body) and its 405's Allow header. */
/* /tokenize and /detokenize: off the I/O thread (a chat's template renders there too). */
enum MHD_Result pgd__route_tokenize(server *s, req_ctx *c, struct MHD_Connection *conn,
                                      const char *method, const char *url) {
    (void)method, (void)url;
    return pgd__answer_after_work(s, c, conn, tokenize_work_cb, pgd__after_work_respond);
}

/* vLLM's render endpoints (/v1/completions/render, /v1/chat/completions/render: the endpoint
 * picker of llm-d tokenizes through them): what the request would be prefilled with, as vLLM's
 * GenerateRequest -- request_id, token_ids, features (null: no media), sampling_params -- one
 * object for a chat, a list of one per prompt for completions. The same template, tokenization
 * and checks as the answer's (work_cb, pgd_api_prepare); nothing is submitted. */
static void render_work_cb(uv_work_t *w) {
    req_ctx *c = w->data;
    server *s = c->s;
    pgd_api_request *r = &c->api;
    work_cb(w);
    int32_t n_ctx = pgd_engine_n_ctx(s->engine);
    pgd_api_budget bud = {.n_ctx = n_ctx, .max_request_tokens = s->cfg.max_request_tokens};
    if (c->has_err || (c->has_err = pgd_api_prepare(r, &bud, &c->err) != 0)) return;
    cJSON *list = cJSON_CreateArray();
    for (int p = 0; list && p < r->n_prompts; p++) {
        const pgd_api_prompt *pr = &r->prompts[p];
        pgd_request_params rp;
        pgd_api_engine_params(r, p * r->n, n_ctx, r->has_seed ? r->seed : 0, &rp);
        cJSON *o = cJSON_CreateObject(), *ids, *sp;
        cJSON_AddItemToArray(list, o);
        cJSON_AddStringToObject(o, "request_id", c->id);
        ids = cJSON_AddArrayToObject(o, "token_ids");
        for (int32_t i = 0; i < pr->n_ids; i++)
            cJSON_AddItemToArray(ids, cJSON_CreateNumber(pr->ids[i]));
        cJSON_AddNullToObject(o, "features");
        sp = cJSON_AddObjectToObject(o, "sampling_params");
        cJSON_AddNumberToObject(sp, "n", r->n);
        cJSON_AddNumberToObject(sp, "temperature", rp.temperature);
        cJSON_AddNumberToObject(sp, "top_p", rp.top_p);
        cJSON_AddNumberToObject(sp, "top_k", rp.top_k);
        cJSON_AddNumberToObject(sp, "min_p", rp.min_p);
        cJSON_AddNumberToObject(sp, "presence_penalty", rp.presence_penalty);
        cJSON_AddNumberToObject(sp, "frequency_penalty", rp.frequency_penalty);
        cJSON_AddNumberToObject(sp, "repetition_penalty",
                                rp.repetition_penalty > 0 ? rp.repetition_penalty : 1.0);
        cJSON_AddNumberToObject(sp, "max_tokens", rp.max_tokens);
        cJSON_AddNumberToObject(sp, "min_tokens", rp.min_tokens);
        if (r->has_seed) cJSON_AddNumberToObject(sp, "seed", (double)r->seed);
        else cJSON_AddNullToObject(sp, "seed");
        cJSON *stop = cJSON_AddArrayToObject(sp, "stop");
        for (int i = 0; i < r->n_stop; i++) cJSON_AddItemToArray(stop, cJSON_CreateString(r->stop[i]));
        cJSON *sid = cJSON_AddArrayToObject(sp, "stop_token_ids");
        for (int32_t i = 0; i < r->n_stop_ids; i++)
            cJSON_AddItemToArray(sid, cJSON_CreateNumber(r->stop_ids[i]));
        cJSON_AddBoolToObject(sp, "ignore_eos", r->ignore_eos);
        cJSON_AddBoolToObject(sp, "skip_special_tokens", !r->render_special);
        cJSON_AddBoolToObject(o, "stream", r->stream);
    }
    cJSON *out = c->rt == R_CHAT_RENDER ? cJSON_DetachItemFromArray(list, 0) : list;
    c->resp = out ? cJSON_PrintUnformatted(out) : NULL;
    if (out != list) cJSON_Delete(out);
    cJSON_Delete(list);
    if (c->resp) {
        c->status = 200;
        return;
    }
    pgd_api_error_set(&c->err, 500, "server_error", NULL, NULL, "out of memory");
    c->has_err = true;
}

/* The generating routes: completions, chat, embeddings, and the dialects that ride chat
 * (Messages, count_tokens, Responses). The body is parsed here; the template, tokenization and
 * constraint compilation run on the thread pool (work_cb), then submit_all hands the choices to
 * the engine. */
enum MHD_Result pgd__route_generate(server *s, req_ctx *c, struct MHD_Connection *conn,
                                      const char *method, const char *url) {
    (void)method, (void)url;
    pgd_api_error e;
    if (c->dialect)
        snprintf(c->id, sizeof c->id, "%s_%016" PRIx64 "%08x",
                 c->rt == R_RESPONSES ? "resp" : "msg",
                 ((uint64_t)c->created << 24) ^ ++s->next_req, (unsigned)rand());
    if (c->dialect ? dialect_parse(s, c, &e)
        : c->rt == R_EMBED
            ? pgd_api_parse_embeddings(c->body ? c->body : "", c->body_len, &s->limits,
                                       pgd_engine_dim(s->engine), &c->api, &e)
            : pgd_api_parse(c->body ? c->body : "", c->body_len, is_chat(c),
                            &s->limits, &c->api, &e))
        return pgd__send_error(c, conn, &e);
    c->api_parsed = true;
    c->model = s->model_name;
    if ((c->lora = pgd__lora_slot_of(s, c->api.model))) c->model = c->api.model;
    if (c->api.model && !c->lora && !pgd__served_name(s, c->api.model)) {
        pgd_api_error_set(&e, 404, "invalid_request_error", "model", "model_not_found",
                          "the model '%.200s' does not exist; this server serves '%s'%s",
                          c->api.model, s->model_name,
                          s->n_loras ? " and the LoRA adapters /v1/models lists" : "");
        return pgd__send_error(c, conn, &e);
    }
    if ((is_chat(c) || c->dialect) && !s->tmpl) {
        pgd_api_error_set(&e, 400, "invalid_request_error", "messages", NULL,
                          "this model has no chat template; use /v1/completions");
        return pgd__send_error(c, conn, &e);
    }
    if (c->rt == R_COUNT_TOKENS)
        return pgd__answer_after_work(s, c, conn, count_tokens_work_cb, pgd__after_work_respond);
    if ((is_chat(c) || c->dialect) && too_many_messages(s, c->api.messages, &e)) {
        pgd_metrics_count_reject(&s->metrics, PGD_REJ_OVERSIZED);
        return pgd__send_error(c, conn, &e);
    }
    if (tool_options(s, &c->api, &e)) return pgd__send_error(c, conn, &e);
    if (!c->dialect)
        snprintf(c->id, sizeof c->id, "%s-%016" PRIx64,
                 is_chat(c) ? "chatcmpl" : c->rt == R_EMBED ? "embd" : "cmpl",
                 ((uint64_t)c->created << 24) ^ ++s->next_req);
    if (c->rt == R_RESPONSES && pgd_responses_background(c->dstate))
        return start_background(s, c, conn);
    if (c->rt == R_COMPLETIONS_RENDER || c->rt == R_CHAT_RENDER)
        return pgd__answer_after_work(s, c, conn, render_work_cb, pgd__after_work_respond);
    return pgd__answer_after_work(s, c, conn, work_cb, after_work_cb);
}

/* GET /v1/models/{id}: the model or an adapter, as /v1/models lists them (OpenAI's 404 else). */
enum MHD_Result pgd__answer_model(server *s, req_ctx *c, struct MHD_Connection *conn,
                                    const char *method, const char *url) {
    (void)method;
    const char *id = url + strlen("/v1/models/");
    pgd_api_error e;
    cJSON *d = cJSON_CreateArray();
    if (pgd__served_name(s, id)) add_model_entry(s, d, id, NULL);
    for (int32_t i = 0; i < s->n_loras && !cJSON_GetArraySize(d); i++)
        if (s->lora_names[i] && !strcmp(id, s->lora_names[i]))
            add_model_entry(s, d, s->lora_names[i], s->lora_paths[i]);
    char *js = cJSON_GetArraySize(d) ? cJSON_PrintUnformatted(cJSON_GetArrayItem(d, 0)) : NULL;
    cJSON_Delete(d);
    if (!js) {
        pgd_api_error_set(&e, 404, "invalid_request_error", "model", "model_not_found",
                          "The model '%.200s' does not exist", id);
        return pgd__send_error(c, conn, &e);
    }
    enum MHD_Result r = pgd__send_json(c, conn, js);
    return r;
}
