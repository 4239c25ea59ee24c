/* The operations routes: /health, /metrics, /version, /v1/kv_plan, and vLLM's runtime LoRA
 * load and unload. */
#include "server/internal.h"

static void lora_load_work_cb(uv_work_t *w) {
    req_ctx *c = w->data;
    char err[512];
    if (pgd_engine_load_lora(c->s->engine, c->lora_path, &c->lora, err, sizeof err)) {
        pgd_api_error_set(&c->err, 400, "invalid_request_error", "lora_path", NULL, "%s", err);
        c->has_err = true;
    } else if (pgd_engine_set_lora_name(c->s->engine, c->lora, c->lora_name)) {
        pgd_engine_unload_lora(c->s->engine, c->lora);
        pgd_api_error_set(&c->err, 500, "server_error", NULL, NULL, "out of memory");
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
    pgd__resume(c);
    pgd__ctx_unref(c); /* the work's reference */
    pgd__run_mhd(s);
}

/* POST /v1/load_lora_adapter {"lora_name", "lora_path"} and /v1/unload_lora_adapter
 * {"lora_name"} (vLLM's, with --allow-runtime-lora-updating). A load reads the adapter on the
 * thread pool, one at a time, and its name serves once it sits in an engine slot. An unload takes
 * the name away at once; requests already running with the adapter finish with it, and the
 * engine frees it after the last one. */
enum MHD_Result pgd__lora_update(server *s, req_ctx *c, struct MHD_Connection *conn,
                                   const char *method, const char *url) {
    (void)method, (void)url;
    pgd_api_error e;
    bool load = c->rt == R_LORA_LOAD;
    cJSON *o = pgd_api_body_check(c->body ? c->body : "", c->body_len, &e)
                   ? NULL
                   : pgd_api_json_parse(c->body ? c->body : "", c->body_len);
    if (o && pgd_api_json_unique_keys(o, &e)) {
        cJSON_Delete(o);
        return pgd__send_error(c, conn, &e);
    }
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(o, "lora_name");
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(o, "lora_path");
    if (!cJSON_IsString(n) || (load && !cJSON_IsString(p))) {
        cJSON_Delete(o);
        pgd_api_error_set(&e, 400, "invalid_request_error", cJSON_IsString(n) ? "lora_path"
                                                                              : "lora_name",
                          NULL, "the body must be {\"lora_name\": NAME%s}",
                          load ? ", \"lora_path\": DIR" : "");
        return pgd__send_error(c, conn, &e);
    }
    int32_t k = pgd__lora_slot_of(s, n->valuestring);
    if (!load) {
        if (!k) {
            pgd_api_error_set(&e, 404, "invalid_request_error", "lora_name", "model_not_found",
                              "The lora adapter '%.200s' cannot be found.", n->valuestring);
            cJSON_Delete(o);
            return pgd__send_error(c, conn, &e);
        }
        pgd_engine_unload_lora(s->engine, k);
        free(s->lora_names[k - 1]);
        free(s->lora_paths[k - 1]);
        s->lora_names[k - 1] = s->lora_paths[k - 1] = NULL;
        enum MHD_Result r = pgd__answer_text(c, conn, "Success: LoRA adapter '%s' removed "
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
        return pgd__send_error(c, conn, &e);
    }
    if (s->lora_loading) {
        pgd_api_error_set(&e, 429, "rate_limit_error", NULL, "lora_loading",
                          "the LoRA adapter '%.200s' is being loaded; retry", s->lora_loading);
        cJSON_Delete(o);
        return pgd__send_error(c, conn, &e);
    }
    c->lora_name = strdup(n->valuestring);
    c->lora_path = strdup(p->valuestring);
    s->lora_loading = strdup(n->valuestring);
    cJSON_Delete(o);
    if (!c->lora_name || !c->lora_path || !s->lora_loading) {
        free(s->lora_loading);
        s->lora_loading = NULL;
        pgd_api_error_set(&e, 500, "server_error", NULL, NULL, "out of memory");
        return pgd__send_error(c, conn, &e);
    }
    if (pgd__queue_conn_work(s, c, conn, lora_load_work_cb, lora_load_after_cb)) {
        free(s->lora_loading);
        s->lora_loading = NULL;
        pgd_api_error_set(&e, 500, "server_error", NULL, NULL, "cannot schedule the request");
        return pgd__send_error(c, conn, &e);
    }
    return MHD_YES;
}

/* GET /v1/kv_plan[?gpu=NAME]: the capacity plan for this server's model and KV budget. */
enum MHD_Result pgd__answer_kv_plan(server *s, req_ctx *c, struct MHD_Connection *conn,
                                      const char *method, const char *url) {
    (void)method, (void)url;
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
        return pgd__send_error(c, conn, &e);
    }
    char *js = NULL;
    if (!rc) rc = pgd_kv_plan_json(&in, &js, &err);
    if (rc) {
        pgd_api_error_set(&e, 500, "server_error", NULL, NULL, "kv plan failed: %s", err.msg);
        return pgd__send_error(c, conn, &e);
    }
    return pgd__send_json(c, conn, js);
}

/* The routes answered without the engine, once their request has been read. */
enum MHD_Result pgd__answer_health(server *s, req_ctx *c, struct MHD_Connection *conn,
                                     const char *method, const char *url) {
    (void)method, (void)url;
    return pgd__send_body(c, conn, s->ready ? 200 : 503,
                     s->ready ? "{\"status\":\"ok\"}"
                              : (s->load_failed ? "{\"status\":\"failed\"}"
                                                : "{\"status\":\"loading\"}"),
                     "application/json", s->ready ? NULL : "5");
}

enum MHD_Result pgd__answer_metrics(server *s, req_ctx *c, struct MHD_Connection *conn,
                                      const char *method, const char *url) {
    (void)method, (void)url;
    /* The engine's gauges first, then the events it posted before them: a request the gauges
     * no longer count as running is in the finish counters of the same page. */
    pgd_engine_stats st;
    if (s->ready) {
        pgd_engine_get_stats(s->engine, &st);
        pgd__drain_events(s);
    }
    char *txt = pgd_metrics_render(&s->metrics, s->ready ? &st : NULL, s->model_name,
                                   (const char *const *)s->lora_names, s->n_loras);
    enum MHD_Result r = pgd__send_body(c, conn, 200, txt ? txt : "",
                                  "text/plain; version=0.0.4; charset=utf-8", NULL);
    free(txt);
    return r;
}

enum MHD_Result pgd__answer_version(server *s, req_ctx *c, struct MHD_Connection *conn,
                                      const char *method, const char *url) {
    (void)s, (void)method, (void)url;
    return pgd__send_body(c, conn, 200, "{\"version\":\"" PGD_VERSION "\"}", "application/json",
                     NULL);
}

/* ---- SGLang's worker contract (sglang-router, vllm-router) ----
 * What a router reads to register this server and route to it: /server_info and /model_info
 * (with their older /get_ names), the model id from served_model_name; /get_load for its
 * power-of-two policy; /flush_cache. The fields are those sglang-router 0.3's ServerInfo and
 * model-info structs read. */

/* The fields both describe the model by. */
static cJSON *model_fields(server *s) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "model_path", s->cfg.model);
    cJSON_AddStringToObject(o, "tokenizer_path", s->cfg.model);
    cJSON_AddStringToObject(o, "served_model_name", s->model_name);
    cJSON_AddBoolToObject(o, "is_generation", true);
    if (s->ready) {
        cJSON_AddStringToObject(o, "model_type", pgd_engine_model_type(s->engine));
        const char *a = pgd_engine_architecture(s->engine);
        cJSON *arr = cJSON_AddArrayToObject(o, "architectures");
        if (*a) cJSON_AddItemToArray(arr, cJSON_CreateString(a));
    }
    return o;
}

enum MHD_Result pgd__answer_server_info(server *s, req_ctx *c, struct MHD_Connection *conn,
                                         const char *method, const char *url) {
    (void)method, (void)url;
    cJSON *o = model_fields(s);
    cJSON_AddNumberToObject(o, "tp_size", s->cfg.tensor_parallel_size ? s->cfg.tensor_parallel_size
                                                                       : 1);
    cJSON_AddNumberToObject(o, "dp_size", 1);
    cJSON_AddStringToObject(o, "load_balance_method", "round_robin");
    cJSON_AddStringToObject(o, "disaggregation_mode", "null");
    cJSON_AddNumberToObject(o, "max_running_requests", s->cfg.max_num_seqs);
    cJSON_AddNumberToObject(o, "max_prefill_tokens", s->cfg.max_num_batched_tokens);
    cJSON_AddNumberToObject(o, "max_waiting_requests", s->cfg.max_waiting);
    if (s->ready) {
        pgd_engine_stats st;
        pgd_engine_get_stats(s->engine, &st);
        cJSON_AddNumberToObject(o, "context_length", pgd_engine_n_ctx(s->engine));
        cJSON_AddNumberToObject(o, "max_total_num_tokens",
                                (double)st.kv_blocks_total * s->cfg.block_size);
        cJSON_AddNumberToObject(o, "page_size", s->cfg.block_size);
    }
    cJSON_AddStringToObject(o, "version", PGD_VERSION);
    return pgd__send_cjson(c, conn, o);
}

enum MHD_Result pgd__answer_model_info(server *s, req_ctx *c, struct MHD_Connection *conn,
                                        const char *method, const char *url) {
    (void)method, (void)url;
    cJSON *o = model_fields(s);
    if (s->ready) {
        cJSON_AddNumberToObject(o, "max_context_length", pgd_engine_n_ctx(s->engine));
        cJSON_AddNumberToObject(o, "vocab_size", pgd_engine_n_vocab(s->engine));
    }
    return pgd__send_cjson(c, conn, o);
}

/* One data-parallel rank's load: requests (running and waiting), waiting ones, KV tokens held. */
enum MHD_Result pgd__answer_load(server *s, req_ctx *c, struct MHD_Connection *conn,
                                  const char *method, const char *url) {
    (void)method, (void)url;
    pgd_engine_stats st = {0};
    if (s->ready) pgd_engine_get_stats(s->engine, &st);
    cJSON *a = cJSON_CreateArray(), *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "dp_rank", 0);
    cJSON_AddNumberToObject(o, "num_reqs", st.num_running + st.num_waiting);
    cJSON_AddNumberToObject(o, "num_waiting_reqs", st.num_waiting);
    cJSON_AddNumberToObject(o, "num_tokens", (double)st.kv_blocks_used * s->cfg.block_size);
    cJSON_AddItemToArray(a, o);
    return pgd__send_cjson(c, conn, a);
}

/* POST /flush_cache: the prefix cache's unreferenced blocks dropped before the next step. */
enum MHD_Result pgd__flush_cache(server *s, req_ctx *c, struct MHD_Connection *conn,
                                 const char *method, const char *url) {
    (void)method, (void)url;
    pgd_engine_flush_cache(s->engine);
    return pgd__send_body(c, conn, 200, "Cache flushed.\n", "text/plain; charset=utf-8", NULL);
}

/* GET /debug/kv_cache: the prefix cache's registered blocks and the KV event sequence number
 * they stand at (pgd_engine_kv_dump), taken between two steps on a pool thread. */
static void kv_dump_work_cb(uv_work_t *w) {
    req_ctx *c = w->data;
    char *json = NULL;
    int rc = pgd_engine_kv_dump(c->s->engine, &json, 30000);
    if (rc) {
        pgd_api_error_set(&c->err, 503, "server_error", NULL, NULL, "%s",
                          rc == PGD_ENOMEM ? "out of memory" : "the engine did not answer");
        c->has_err = true;
    }
    c->resp = json;
    if (!rc) c->status = 200;
}

enum MHD_Result pgd__kv_dump(server *s, req_ctx *c, struct MHD_Connection *conn,
                             const char *method, const char *url) {
    (void)method, (void)url;
    return pgd__answer_after_work(s, c, conn, kv_dump_work_cb, pgd__after_work_respond);
}
