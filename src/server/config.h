/* Server configuration from one declarative table: CLI flags, an optional JSON config file
 * (--config FILE, keys are the flag names without dashes) and the environment variables the
 * table names (PAGODA_API_KEY for secrets, PAGODA_MODEL, ...). --help is generated from the same
 * table. Precedence: flags > environment > config file > defaults. */
#ifndef PGD_SERVER_CONFIG_H
#define PGD_SERVER_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "util/options.h"

#define PGD_MAX_API_KEYS 16

typedef struct pgd_server_config {
    /* the engine and model options (util/options.h's table), under their own names too */
    union {
        struct {
            PGD_ENGINE_OPTS_FIELDS
        };
        pgd_engine_opts engine;
    };
    char *host, *served_model_name, *config_file, *tool_call_parser;
    char *reasoning_parser;
    int max_loras;          /* adapter slots (0: the --lora-modules, or 8 with runtime loading) */
    bool allow_runtime_lora_updating; /* /v1/load_lora_adapter and /v1/unload_lora_adapter */
    int port, max_waiting;
    size_t max_body_bytes;
    size_t responses_store_bytes; /* --responses-store-size */
    char *allowed_origins, *allowed_methods, *allowed_headers; /* CORS lists (cors.h) */
    bool allow_credentials;
    int max_tokens_limit, max_n, max_logprobs, max_prompts, max_prompt_tokens;
    int max_request_tokens; /* prompts x n x max_tokens of one request, at most */
    int max_connections, connection_timeout, drain_timeout, max_header_bytes;
    int request_head_timeout, request_body_timeout; /* seconds (http_guard.h, server.c) */
    int request_body_min_rate;      /* bytes/s a body must average after its timeout */
    int max_connections_per_client; /* per client address (0: no limit) */
    int max_messages;               /* messages in one chat request */
    size_t max_prompt_bytes;        /* a rendered chat prompt, at most */
    bool protect_health, log_requests;
    char *kv_events_config; /* vLLM's --kv-events-config JSON, or NULL */
    char *kv_cache_dir;     /* --kv-cache-dir: the prefix cache's disk tier, or NULL */
    size_t kv_cache_disk_bytes; /* --kv-cache-disk-size */
    char *metrics_prefix;   /* /metrics names: "pagoda" or "vllm" */
    char *api_keys[PGD_MAX_API_KEYS];
    int n_api_keys;
} pgd_server_config;

/* Fills c from defaults, the config file, the environment and argv (argv[0] is "serve").
 * Returns 0, 1 after printing --help, or -1 after printing a one-line error. */
int pgd_server_config_load(pgd_server_config *c, int argc, char **argv);
void pgd_server_config_free(pgd_server_config *c);
void pgd_server_config_help(FILE *f);

#endif
