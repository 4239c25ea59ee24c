/* The declarative configuration table and its three sources. */
#include "server/config.h"

#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "api/reasoning.h"
#include "util/mapfile.h"
#include "util/parse.h"

/* the server's own options; the engine and model ones are util/options.h's table, which the
 * server reads first (its entries are matched, and listed in --help, before these) */
#define OFF(f) offsetof(pgd_server_config, f)

static const pgd_opt table[] = {
    {"served-model-name", 0, NULL, PGD_OPT_STR, OFF(served_model_name), NULL, 0, 0, NULL, NULL,
     PGD_CMD_SERVE,
     "model name in the API (default: the model file's base name); several, "
     "separated by "
     "commas or spaces, are all accepted as \"model\" (the first is the one "
     "answers name)"},
    {"host", 0, NULL, PGD_OPT_STR, OFF(host), "127.0.0.1", 0, 0, NULL, NULL, PGD_CMD_SERVE,
     "address to bind"},
    {"port", 'p', NULL, PGD_OPT_INT, OFF(port), "8000", 0, 65535, NULL, NULL, PGD_CMD_SERVE,
     "port to listen on (0: any free port)"},
    {"api-key", 0, NULL, PGD_OPT_KEYS, OFF(api_keys), NULL, 0, 0, NULL, "PAGODA_API_KEY",
     PGD_CMD_SERVE,
     "accepted API key (repeat for several; the variable takes a "
     "comma-separated list)"},
    {"protect-health", 0, NULL, PGD_OPT_BOOL, OFF(protect_health), "false", 0, 0, NULL, NULL,
     PGD_CMD_SERVE, "require the API key for /health and /metrics too"},
    {"tool-call-parser", 0, NULL, PGD_OPT_STR, OFF(tool_call_parser), "auto", 0, 0, NULL, NULL,
     PGD_CMD_SERVE,
     "tool calls in chat answers: hermes (<tool_call>{...}</tool_call>), "
     "llama3_json (Llama "
     "3.1's {\"name\", \"parameters\"} first), mistral ([TOOL_CALLS][{...}]), "
     "none, or auto "
     "(what the chat template asks for)"},
    {"reasoning-parser", 0, NULL, PGD_OPT_STR, OFF(reasoning_parser), "none", 0, 0, NULL, NULL,
     PGD_CMD_SERVE,
     "reasoning in chat answers, returned as reasoning_content: deepseek_r1 "
     "(the template opens "
     "<think>; reasoning up to </think>), qwen3 (when the answer opens "
     "<think>), or none"},
    {"max-loras", 0, NULL, PGD_OPT_INT, OFF(max_loras), "0", 0, 64, NULL, NULL, PGD_CMD_SERVE,
     "LoRA adapter slots (0: as many as --lora-modules names, at least 8 with "
     "--allow-runtime-lora-updating)"},
    {"allow-runtime-lora-updating", 0, NULL, PGD_OPT_BOOL, OFF(allow_runtime_lora_updating),
     "false", 0, 0, NULL, "PAGODA_ALLOW_RUNTIME_LORA_UPDATING", PGD_CMD_SERVE,
     "serve POST /v1/load_lora_adapter {\"lora_name\", \"lora_path\"} and "
     "/v1/unload_lora_adapter {\"lora_name\"} (vLLM's), to change adapters "
     "while serving"},
    {"max-waiting", 0, NULL, PGD_OPT_INT, OFF(max_waiting), "1024", 1, 1 << 20, NULL, NULL,
     PGD_CMD_SERVE, "waiting-queue bound; beyond it requests get 429 with Retry-After"},
    {"max-body-bytes", 0, NULL, PGD_OPT_SIZE, OFF(max_body_bytes), "4MiB", 1024, 1e9, NULL, NULL,
     PGD_CMD_SERVE, "largest request body (413 beyond)"},
    {"max-header-bytes", 0, NULL, PGD_OPT_INT, OFF(max_header_bytes), "32768", 4096, 1 << 20, NULL,
     NULL, PGD_CMD_SERVE, "memory for one connection's request headers"},
    {"max-tokens-limit", 0, NULL, PGD_OPT_INT, OFF(max_tokens_limit), "65536", 1, 1 << 24, NULL,
     NULL, PGD_CMD_SERVE, "largest max_tokens a request may ask for"},
    {"max-n", 0, NULL, PGD_OPT_INT, OFF(max_n), "16", 1, 128, NULL, NULL, PGD_CMD_SERVE,
     "largest n (choices per prompt)"},
    {"max-request-tokens", 0, NULL, PGD_OPT_INT, OFF(max_request_tokens), "1048576", 1, 1 << 30,
     NULL, NULL, PGD_CMD_SERVE,
     "most tokens one request may ask for over all its choices (prompts x n x "
     "max_tokens; "
     "bounds the memory a non-streamed answer takes)"},
    {"max-logprobs", 0, NULL, PGD_OPT_INT, OFF(max_logprobs), "20", 0, 20, NULL, NULL,
     PGD_CMD_SERVE, "largest logprobs / top_logprobs"},
    {"max-prompts", 0, NULL, PGD_OPT_INT, OFF(max_prompts), "64", 1, 4096, NULL, NULL,
     PGD_CMD_SERVE, "largest number of prompts in one completions request"},
    {"max-prompt-tokens", 0, NULL, PGD_OPT_INT, OFF(max_prompt_tokens), "131072", 1, 1 << 24, NULL,
     NULL, PGD_CMD_SERVE, "largest prompt in tokens before the context check"},
    {"max-connections", 0, NULL, PGD_OPT_INT, OFF(max_connections), "1024", 1, 1 << 20, NULL, NULL,
     PGD_CMD_SERVE, "concurrent connections"},
    {"connection-timeout", 0, NULL, PGD_OPT_INT, OFF(connection_timeout), "60", 1, 86400, NULL,
     NULL, PGD_CMD_SERVE, "seconds an idle or slow client may take before it is disconnected"},
    {"request-head-timeout", 0, NULL, PGD_OPT_INT, OFF(request_head_timeout), "30", 1, 3600, NULL,
     NULL, PGD_CMD_SERVE,
     "seconds a new connection has to send its whole request head, however it "
     "trickles "
     "(408 after; --connection-timeout counts only silence)"},
    {"request-body-timeout", 0, NULL, PGD_OPT_INT, OFF(request_body_timeout), "60", 1, 86400, NULL,
     NULL, PGD_CMD_SERVE, "seconds a request body may take before --request-body-min-rate applies"},
    {"request-body-min-rate", 0, NULL, PGD_OPT_INT, OFF(request_body_min_rate), "1024", 0, 1 << 30,
     NULL, NULL, PGD_CMD_SERVE,
     "bytes per second a body must average once --request-body-timeout has "
     "passed, or the "
     "connection is closed (0: no minimum)"},
    {"max-connections-per-client", 0, NULL, PGD_OPT_INT, OFF(max_connections_per_client), "256", 0,
     1 << 20, NULL, NULL, PGD_CMD_SERVE,
     "connections one client address may hold (0: no limit; 503 beyond)"},
    {"max-messages", 0, NULL, PGD_OPT_INT, OFF(max_messages), "4096", 1, 1 << 24, NULL, NULL,
     PGD_CMD_SERVE,
     "most messages in one chat request (400 beyond, before the template "
     "renders)"},
    {"max-prompt-bytes", 0, NULL, PGD_OPT_SIZE, OFF(max_prompt_bytes), "8MiB", 1024, 1e10, NULL,
     NULL, PGD_CMD_SERVE, "largest rendered chat prompt (400 beyond, before it is tokenized)"},
    {"allowed-origins", 0, NULL, PGD_OPT_STR, OFF(allowed_origins), "*", 0, 0, NULL, NULL,
     PGD_CMD_SERVE,
     "CORS: origins allowed, a JSON list ('[\"https://a.example\"]') or "
     "comma-separated; * any"},
    {"allowed-methods", 0, NULL, PGD_OPT_STR, OFF(allowed_methods), "*", 0, 0, NULL, NULL,
     PGD_CMD_SERVE, "CORS: methods a preflight allows (* all)"},
    {"allowed-headers", 0, NULL, PGD_OPT_STR, OFF(allowed_headers), "*", 0, 0, NULL, NULL,
     PGD_CMD_SERVE, "CORS: request headers a preflight allows (* any)"},
    {"allow-credentials", 0, NULL, PGD_OPT_BOOL, OFF(allow_credentials), "false", 0, 0, NULL, NULL,
     PGD_CMD_SERVE,
     "CORS: allow credentials (cookies, authorization) in cross-origin "
     "requests"},
    {"responses-store-size", 0, NULL, PGD_OPT_SIZE, OFF(responses_store_bytes), "64MiB", 0, 1e12,
     NULL, NULL, PGD_CMD_SERVE,
     "memory for stored /v1/responses answers (store: true; "
     "previous_response_id chains from "
     "them), the least recently used dropped first; 0: nothing is stored"},
    {"drain-timeout", 0, NULL, PGD_OPT_INT, OFF(drain_timeout), "30", 0, 86400, NULL, NULL,
     PGD_CMD_SERVE, "seconds SIGTERM waits for in-flight requests"},
    {"log-requests", 0, NULL, PGD_OPT_BOOL, OFF(log_requests), "true", 0, 0, NULL, NULL,
     PGD_CMD_SERVE, "one structured access-log line per request on stderr"},
    {"kv-events-config", 0, NULL, PGD_OPT_STR, OFF(kv_events_config), NULL, 0, 0, NULL, NULL,
     PGD_CMD_SERVE,
     "publish the prefix cache's block events for KV-aware routers, as vLLM's JSON: "
     "{\"enable_kv_cache_events\": true, \"publisher\": \"zmq\", \"endpoint\": "
     "\"tcp://*:5557\", \"replay_endpoint\": \"tcp://*:5558\", \"topic\": \"\", "
     "\"buffer_steps\": 10000}"},
    {"kv-cache-dir", 0, NULL, PGD_OPT_STR, OFF(kv_cache_dir), NULL, 0, 0, NULL, NULL,
     PGD_CMD_SERVE,
     "the prefix cache's disk tier (CPU backend): registered KV blocks are written behind to "
     "this directory and read back, instead of recomputed, when a prompt's prefix is there and "
     "no longer in RAM, across restarts too; entries are checksummed and keyed by the model "
     "file, KV types and block size, and a damaged or foreign one is deleted, never used"},
    {"kv-cache-disk-size", 0, NULL, PGD_OPT_SIZE, OFF(kv_cache_disk_bytes), "10GiB", 0, 1e15,
     NULL, NULL, PGD_CMD_SERVE,
     "the most bytes --kv-cache-dir keeps (e.g. 10GiB); the least recently used blocks go "
     "first"},
    {"metrics-prefix", 0, NULL, PGD_OPT_CHOICE, OFF(metrics_prefix), "pagoda", 0, 0,
     "pagoda|vllm", NULL, PGD_CMD_SERVE,
     "prefix of every /metrics name: pagoda (pagoda:num_requests_waiting, ...) or vllm "
     "(vllm:num_requests_waiting, ...: the same series under vLLM's names, for routers and "
     "dashboards that hard-code them)"},
};
#define N_OPTS (sizeof table / sizeof table[0])

#define ETAB pgd_engine_opt_table, pgd_engine_opt_count

/* The API keys are the one type the shared machinery leaves to this table. */
static int set_opt(pgd_server_config *c, const pgd_opt *o, const char *v, const char *src) {
    if (o->type != PGD_OPT_KEYS) return pgd_opt_set(c, o, v, src);
    /* comma-separated list; each occurrence of the flag appends */
    char *dup = strdup(v), *save = NULL;
    if (!dup) return -1;
    for (char *k = strtok_r(dup, ",", &save); k; k = strtok_r(NULL, ",", &save)) {
        if (!*k) continue;
        if (c->n_api_keys >= PGD_MAX_API_KEYS) {
            fprintf(stderr, "pagoda: at most %d API keys\n", PGD_MAX_API_KEYS);
            free(dup);
            return -1;
        }
        c->api_keys[c->n_api_keys++] = strdup(k);
    }
    free(dup);
    return 0;
}

void pgd_server_config_help(FILE *f) {
    fprintf(f, "usage: pagoda serve [options]\n\nOptions (also keys of the JSON file given with "
               "--config, without dashes; --name=value works too, and a switch that is on by "
               "default is turned off with --no-name or --name=false):\n");
    fprintf(f, "  %-30s %s\n", "--config FILE", "JSON configuration file (see configs/)");
    pgd_opt_help(f, ETAB, PGD_CMD_SERVE);
    pgd_opt_help(f, table, N_OPTS, PGD_CMD_SERVE);
}

static int load_file(pgd_server_config *c, const char *path) {
    char *txt;
    pgd_err err;
    if (pgd_read_file(path, &txt, NULL, &err)) {
        fprintf(stderr, "pagoda: %s\n", err.msg);
        return -1;
    }
    cJSON *j = cJSON_Parse(txt);
    free(txt);
    if (!cJSON_IsObject(j)) {
        fprintf(stderr, "pagoda: %s: not a JSON object\n", path);
        cJSON_Delete(j);
        return -1;
    }
    const cJSON *x;
    int rc = 0;
    cJSON_ArrayForEach(x, j) {
        const pgd_opt *eo = pgd_opt_find(ETAB, x->string);
        const pgd_opt *o = eo ? eo : pgd_opt_find(table, N_OPTS, x->string);
        if (!o || (eo && eo->cmds && !(eo->cmds & PGD_CMD_SERVE))) {
            fprintf(stderr, "pagoda: %s: unknown option '%s'\n", path, x->string);
            rc = -1;
            break;
        }
        char buf[64];
        const char *v = NULL;
        if (cJSON_IsString(x)) v = x->valuestring;
        else if (cJSON_IsBool(x)) v = cJSON_IsTrue(x) ? "true" : "false";
        else if (cJSON_IsNumber(x)) snprintf(buf, sizeof buf, "%.17g", x->valuedouble), v = buf;
        if (o->type == PGD_OPT_KEYS) {
            fprintf(stderr, "pagoda: %s: API keys belong in PAGODA_API_KEY, not in a file\n", path);
            rc = -1;
            break;
        }
        if (!v || (eo ? pgd_opt_set(&c->engine, o, v, path) : set_opt(c, o, v, path))) {
            if (!v) fprintf(stderr, "pagoda: %s: '%s' has the wrong type\n", path, x->string);
            rc = -1;
            break;
        }
    }
    cJSON_Delete(j);
    return rc;
}

int pgd_server_config_load(pgd_server_config *c, int argc, char **argv) {
    memset(c, 0, sizeof *c);
    if (pgd_opt_defaults(&c->engine, ETAB, PGD_CMD_SERVE)) return -1;
    for (size_t i = 0; i < N_OPTS; i++)
        if (table[i].dflt && set_opt(c, &table[i], table[i].dflt, "defaults")) return -1;
    /* --config first, so that flags override the file */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            pgd_server_config_help(stdout);
            return 1;
        }
        if (!strcmp(argv[i], "--config")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "pagoda: --config needs a file\n");
                return -1;
            }
            if (load_file(c, argv[i + 1])) return -1;
            c->config_file = strdup(argv[i + 1]);
        }
    }
    if (pgd_opt_env(&c->engine, ETAB, PGD_CMD_SERVE) ||
        pgd_opt_env(c, table, N_OPTS, PGD_CMD_SERVE))
        return -1;
    for (size_t i = 0; i < N_OPTS; i++) { /* the API keys, which pgd_opt_env leaves here */
        const char *e = table[i].type == PGD_OPT_KEYS ? pgd_opt_env_value(&table[i]) : NULL;
        if (e && set_opt(c, &table[i], e, table[i].env)) return -1;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--config")) {
            i++;
            continue;
        }
        int rc = pgd_opt_parse_arg(&c->engine, ETAB, PGD_CMD_SERVE, argc, argv, &i);
        if (!rc) rc = pgd_opt_parse_arg(c, table, N_OPTS, PGD_CMD_SERVE, argc, argv, &i);
        if (rc < 0) return -1;
        if (rc) continue;
        /* --api-key V / --api-key=V, the type the shared parser leaves here */
        const pgd_opt *o = NULL;
        const char *v = NULL;
        for (size_t k = 0; k < N_OPTS && !o; k++) {
            size_t nl = strlen(table[k].name);
            if (table[k].type != PGD_OPT_KEYS || strncmp(a, "--", 2) ||
                strncmp(a + 2, table[k].name, nl))
                continue;
            if (!a[2 + nl]) o = &table[k], v = i + 1 < argc ? argv[++i] : NULL;
            else if (a[2 + nl] == '=') o = &table[k], v = a + 3 + nl;
        }
        if (!o) {
            fprintf(stderr, "pagoda: unknown option '%s' (see pagoda serve --help)\n", a);
            return -1;
        }
        if (!v) {
            fprintf(stderr, "pagoda: option %s needs a value\n", a);
            return -1;
        }
        if (set_opt(c, o, v, "the command line")) return -1;
    }
    if (strcmp(c->tool_call_parser, "auto") && strcmp(c->tool_call_parser, "hermes") &&
        strcmp(c->tool_call_parser, "llama3_json") && strcmp(c->tool_call_parser, "mistral") &&
        strcmp(c->tool_call_parser, "none")) {
        fprintf(stderr, "pagoda: --tool-call-parser must be auto, hermes, llama3_json, mistral or "
                        "none\n");
        return -1;
    }
    if (pgd_reasoning_format_of(c->reasoning_parser) < 0) {
        fprintf(stderr, "pagoda: --reasoning-parser must be deepseek_r1, qwen3 or none\n");
        return -1;
    }
    if (!strcmp(c->speculative, "draft") && !c->draft_model) {
        fprintf(stderr, "pagoda: --speculative draft needs --draft-model\n");
        return -1;
    }
    return 0;
}

void pgd_server_config_free(pgd_server_config *c) {
    pgd_opt_free(&c->engine, ETAB);
    pgd_opt_free(c, table, N_OPTS);
    for (int i = 0; i < c->n_api_keys; i++) free(c->api_keys[i]);
    free(c->config_file);
    memset(c, 0, sizeof *c);
}
