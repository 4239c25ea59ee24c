/* The declarative configuration table and its three sources. */
#include "server/config.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "api/reasoning.h"
#include "util/mapfile.h"
#include "util/parse.h"

typedef enum { T_STR, T_INT, T_SIZE, T_BOOL, T_KEYS, T_FRAC } opt_type;

typedef struct opt {
    const char *name;   /* flag without dashes; also the JSON key */
    char short_name;
    opt_type type;
    size_t offset;
    const char *dflt;
    double lo, hi;      /* bounds: [lo, hi] for T_INT and T_SIZE, (lo, hi] for T_FRAC */
    const char *env;    /* environment variable or NULL */
    const char *help;
} opt;

#define OFF(f) offsetof(pgd_server_config, f)

static const opt table[] = {
    {"model", 'm', T_STR, OFF(model), "models/SmolLM2-135M-Instruct.Q4_1.gguf", 0, 0, "PAGODA_MODEL",
     "GGUF file or Hugging Face model directory"},
    {"served-model-name", 0, T_STR, OFF(served_model_name), NULL, 0, 0, NULL,
     "model name in the API (default: the model file's base name); several, separated by "
     "commas or spaces, are all accepted as \"model\" (the first is the one answers name)"},
    {"host", 0, T_STR, OFF(host), "127.0.0.1", 0, 0, NULL, "address to bind"},
    {"port", 'p', T_INT, OFF(port), "8000", 0, 65535, NULL, "port to listen on (0: any free port)"},
    {"api-key", 0, T_KEYS, OFF(api_keys), NULL, 0, 0, "PAGODA_API_KEY",
     "accepted API key (repeat for several; the variable takes a comma-separated list)"},
    {"protect-health", 0, T_BOOL, OFF(protect_health), "false", 0, 0, NULL,
     "require the API key for /health and /metrics too"},
    {"threads", 't', T_INT, OFF(threads), "0", 0, 1024, NULL, "compute threads (0: all CPUs)"},
    {"ctx", 0, T_INT, OFF(ctx), "0", 0, 1 << 24, NULL, "context length (0: the model's)"},
    {"max-num-batched-tokens", 0, T_INT, OFF(max_num_batched_tokens), "512", 1, 1 << 20, NULL,
     "token budget per engine step (= prefill chunk size)"},
    {"max-num-seqs", 0, T_INT, OFF(max_num_seqs), "64", 1, 4096, NULL,
     "sequences running at once"},
    {"kv-cache-memory", 0, T_SIZE, OFF(kv_cache_bytes), "512MiB", 1, 1e15, NULL,
     "KV cache budget (e.g. 512MiB, 4GiB); CPU only: on CUDA --gpu-memory-utilization sizes it"},
    {"kv-dtype", 0, T_STR, OFF(kv_dtype), "f32", 0, 0, NULL, "KV cache type: f32, f16 or bf16"},
    {"block-size", 0, T_INT, OFF(block_size), "16", 1, 1024, NULL, "KV block size in tokens"},
    {"scheduling-policy", 0, T_STR, OFF(scheduling_policy), "fcfs", 0, 0, NULL,
     "fcfs (first come, first served) or priority: requests are served, and preempted, in the "
     "order of their \"priority\" (lower first; ties by arrival), and a waiting request "
     "preempts running ones of a lower priority when it does not fit (vLLM's)"},
    {"no-prefix-caching", 0, T_BOOL, OFF(no_prefix_caching), "false", 0, 0, NULL,
     "turn the prefix cache off"},
    {"tool-call-parser", 0, T_STR, OFF(tool_call_parser), "auto", 0, 0, NULL,
     "tool calls in chat answers: hermes (<tool_call>{...}</tool_call>), llama3_json (Llama "
     "3.1's {\"name\", \"parameters\"} first), mistral ([TOOL_CALLS][{...}]), none, or auto "
     "(what the chat template asks for)"},
    {"reasoning-parser", 0, T_STR, OFF(reasoning_parser), "none", 0, 0, NULL,
     "reasoning in chat answers, returned as reasoning_content: deepseek_r1 (the template opens "
     "<think>; reasoning up to </think>), qwen3 (when the answer opens <think>), or none"},
    {"speculative", 0, T_STR, OFF(speculative), "none", 0, 0, NULL,
     "speculative decoding: none, ngram (prompt lookup) or draft"},
    {"num-speculative-tokens", 0, T_INT, OFF(num_speculative_tokens), "5", 1, 16, NULL,
     "the most tokens proposed per step"},
    {"draft-model", 0, T_STR, OFF(draft_model), NULL, 0, 0, NULL,
     "draft model (same vocabulary) for --speculative draft"},
    {"speculative-disable-by-batch-size", 0, T_INT, OFF(speculative_disable_by_batch_size), "0",
     0, 4096, NULL,
     "no proposals while this many requests run (a large batch is compute-bound; 0: never)"},
    {"lora-modules", 0, T_STR, OFF(lora_modules), NULL, 0, 0, NULL,
     "LoRA adapters (PEFT directories; CPU backend) served as models of their own: NAME=DIR, "
     "several separated by commas or spaces (as vLLM's); a request's \"model\": NAME runs "
     "with that adapter"},
    {"max-loras", 0, T_INT, OFF(max_loras), "0", 0, 64, NULL,
     "LoRA adapter slots (0: as many as --lora-modules names, at least 8 with "
     "--allow-runtime-lora-updating)"},
    {"allow-runtime-lora-updating", 0, T_BOOL, OFF(allow_runtime_lora_updating), "false", 0, 0,
     "PAGODA_ALLOW_RUNTIME_LORA_UPDATING",
     "serve POST /v1/load_lora_adapter {\"lora_name\", \"lora_path\"} and "
     "/v1/unload_lora_adapter {\"lora_name\"} (vLLM's), to change adapters while serving"},
    {"device", 0, T_STR, OFF(device), "cpu", 0, 0, "PAGODA_DEVICE", "backend: cpu or cuda"},
    {"tensor-parallel-size", 0, T_INT, OFF(tensor_parallel_size), "1", 1, 64,
     "PAGODA_TENSOR_PARALLEL",
     "ranks the model is split across"},
    {"gpu-memory-utilization", 0, T_FRAC, OFF(gpu_memory_utilization), "0.9", 0, 1,
     "PAGODA_GPU_MEMORY_UTILIZATION", "CUDA: share (0, 1] of each GPU's memory for weights, "
     "activations and the KV cache, which gets what is left; accepted and ignored on the CPU"},
    {"load-format", 0, T_STR, OFF(load_format), "auto", 0, 0, "PAGODA_LOAD_FORMAT",
     "auto, or dummy: --model is a config.json (or its folder), the weights are random, and "
     "the tokenizer.json beside it is required"},
    {"weights-f32", 0, T_BOOL, OFF(weights_f32), "false", 0, 0, NULL,
     "dequantize weights to F32 at load"},
    {"max-waiting", 0, T_INT, OFF(max_waiting), "1024", 1, 1 << 20, NULL,
     "waiting-queue bound; beyond it requests get 429 with Retry-After"},
    {"max-body-bytes", 0, T_SIZE, OFF(max_body_bytes), "4MiB", 1024, 1e9, NULL,
     "largest request body (413 beyond)"},
    {"max-header-bytes", 0, T_INT, OFF(max_header_bytes), "32768", 4096, 1 << 20, NULL,
     "memory for one connection's request headers"},
    {"max-tokens-limit", 0, T_INT, OFF(max_tokens_limit), "65536", 1, 1 << 24, NULL,
     "largest max_tokens a request may ask for"},
    {"max-n", 0, T_INT, OFF(max_n), "16", 1, 128, NULL, "largest n (choices per prompt)"},
    {"max-request-tokens", 0, T_INT, OFF(max_request_tokens), "1048576", 1, 1 << 30, NULL,
     "most tokens one request may ask for over all its choices (prompts x n x max_tokens; "
     "bounds the memory a non-streamed answer takes)"},
    {"max-logprobs", 0, T_INT, OFF(max_logprobs), "20", 0, 20, NULL,
     "largest logprobs / top_logprobs"},
    {"max-prompts", 0, T_INT, OFF(max_prompts), "64", 1, 4096, NULL,
     "largest number of prompts in one completions request"},
    {"max-prompt-tokens", 0, T_INT, OFF(max_prompt_tokens), "131072", 1, 1 << 24, NULL,
     "largest prompt in tokens before the context check"},
    {"max-connections", 0, T_INT, OFF(max_connections), "1024", 1, 1 << 20, NULL,
     "concurrent connections"},
    {"connection-timeout", 0, T_INT, OFF(connection_timeout), "60", 1, 86400, NULL,
     "seconds an idle or slow client may take before it is disconnected"},
    {"request-head-timeout", 0, T_INT, OFF(request_head_timeout), "30", 1, 3600, NULL,
     "seconds a new connection has to send its whole request head, however it trickles "
     "(408 after; --connection-timeout counts only silence)"},
    {"request-body-timeout", 0, T_INT, OFF(request_body_timeout), "60", 1, 86400, NULL,
     "seconds a request body may take before --request-body-min-rate applies"},
    {"request-body-min-rate", 0, T_INT, OFF(request_body_min_rate), "1024", 0, 1 << 30, NULL,
     "bytes per second a body must average once --request-body-timeout has passed, or the "
     "connection is closed (0: no minimum)"},
    {"max-connections-per-client", 0, T_INT, OFF(max_connections_per_client), "256", 0,
     1 << 20, NULL,
     "connections one client address may hold (0: no limit; 503 beyond)"},
    {"max-messages", 0, T_INT, OFF(max_messages), "4096", 1, 1 << 24, NULL,
     "most messages in one chat request (400 beyond, before the template renders)"},
    {"max-prompt-bytes", 0, T_SIZE, OFF(max_prompt_bytes), "8MiB", 1024, 1e10, NULL,
     "largest rendered chat prompt (400 beyond, before it is tokenized)"},
    {"allowed-origins", 0, T_STR, OFF(allowed_origins), "*", 0, 0, NULL,
     "CORS: origins allowed, a JSON list ('[\"https://a.example\"]') or comma-separated; * any"},
    {"allowed-methods", 0, T_STR, OFF(allowed_methods), "*", 0, 0, NULL,
     "CORS: methods a preflight allows (* all)"},
    {"allowed-headers", 0, T_STR, OFF(allowed_headers), "*", 0, 0, NULL,
     "CORS: request headers a preflight allows (* any)"},
    {"allow-credentials", 0, T_BOOL, OFF(allow_credentials), "false", 0, 0, NULL,
     "CORS: allow credentials (cookies, authorization) in cross-origin requests"},
    {"responses-store-size", 0, T_SIZE, OFF(responses_store_bytes), "64MiB", 0, 1e12, NULL,
     "memory for stored /v1/responses answers (store: true; previous_response_id chains from "
     "them), the least recently used dropped first; 0: nothing is stored"},
    {"drain-timeout", 0, T_INT, OFF(drain_timeout), "30", 0, 86400, NULL,
     "seconds SIGTERM waits for in-flight requests"},
    {"log-requests", 0, T_BOOL, OFF(log_requests), "true", 0, 0, NULL,
     "one structured access-log line per request on stderr"},
};
#define N_OPTS (sizeof table / sizeof table[0])

static int set_opt(pgd_server_config *c, const opt *o, const char *v, const char *src) {
    char *base = (char *)c + o->offset;
    switch (o->type) {
    case T_STR: {
        char **p = (char **)base;
        free(*p);
        *p = v ? strdup(v) : NULL;
        return 0;
    }
    case T_KEYS: {
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
    case T_BOOL: {
        bool *b = (bool *)base;
        /* any case: vLLM's environment variables are written True */
        if (!v || !strcasecmp(v, "true") || !strcmp(v, "1")) *b = true;
        else if (!strcasecmp(v, "false") || !strcmp(v, "0")) *b = false;
        else goto bad;
        return 0;
    }
    case T_INT: {
        char *end;
        errno = 0;
        long x = strtol(v, &end, 10);
        if (errno || *end || end == v || x < o->lo || x > o->hi) goto bad;
        *(int *)base = (int)x;
        return 0;
    }
    case T_FRAC: {
        char *end;
        errno = 0;
        double x = strtod(v, &end);
        if (errno || *end || end == v || !(x > o->lo && x <= o->hi)) goto bad;
        *(float *)base = (float)x;
        return 0;
    }
    case T_SIZE: {
        size_t x;
        if (pgd_parse_size(v, &x) || (double)x < o->lo || (double)x > o->hi) goto bad;
        *(size_t *)base = x;
        return 0;
    }
    }
bad:
    fprintf(stderr, "pagoda: invalid value '%s' for %s (from %s)%s\n", v ? v : "", o->name, src,
            o->type == T_INT    ? "; see --help for the range"
            : o->type == T_FRAC ? "; a fraction in (0, 1]"
                                : "");
    return -1;
}

static const opt *find_long(const char *name) {
    for (size_t i = 0; i < N_OPTS; i++)
        if (!strcmp(table[i].name, name)) return &table[i];
    return NULL;
}

void pgd_server_config_help(FILE *f) {
    fprintf(f, "usage: pagoda serve [options]\n\nOptions (also keys of the JSON file given with "
               "--config, without dashes; --name=value works too, and a switch that is on by "
               "default is turned off with --no-name or --name=false):\n");
    fprintf(f, "  %-30s %s\n", "--config FILE", "JSON configuration file (see configs/)");
    for (size_t i = 0; i < N_OPTS; i++) {
        const opt *o = &table[i];
        char flag[64];
        snprintf(flag, sizeof flag, "%s%c%s--%s%s", o->short_name ? "-" : "",
                 o->short_name ? o->short_name : ' ', o->short_name ? ", " : "", o->name,
                 o->type == T_BOOL ? "" : " V");
        fprintf(f, "  %-30s %s", flag + (o->short_name ? 0 : 1), o->help);
        if (o->dflt) fprintf(f, " [%s]", o->dflt);
        if (o->env) fprintf(f, " (env %s)", o->env);
        fputc('\n', f);
    }
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
        const opt *o = find_long(x->string);
        if (!o) {
            fprintf(stderr, "pagoda: %s: unknown option '%s'\n", path, x->string);
            rc = -1;
            break;
        }
        char buf[64];
        const char *v = NULL;
        if (cJSON_IsString(x)) v = x->valuestring;
        else if (cJSON_IsBool(x)) v = cJSON_IsTrue(x) ? "true" : "false";
        else if (cJSON_IsNumber(x)) snprintf(buf, sizeof buf, "%.17g", x->valuedouble), v = buf;
        if (o->type == T_KEYS) {
            fprintf(stderr, "pagoda: %s: API keys belong in PAGODA_API_KEY, not in a file\n", path);
            rc = -1;
            break;
        }
        if (!v || set_opt(c, o, v, path)) {
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
    for (size_t i = 0; i < N_OPTS; i++) {
        const char *e = table[i].env ? getenv(table[i].env) : NULL;
        if (e && *e && set_opt(c, &table[i], e, table[i].env)) return -1;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--config")) {
            i++;
            continue;
        }
        const opt *o = NULL;
        const char *v = NULL;
        bool given = false; /* the value came with the name: --name=value, or --no-name */
        if (a[0] == '-' && a[1] == '-') {
            char name[64];
            const char *eq = strchr(a + 2, '=');
            size_t nl = eq ? (size_t)(eq - (a + 2)) : strlen(a + 2);
            if (nl < sizeof name) {
                memcpy(name, a + 2, nl);
                name[nl] = 0;
                o = find_long(name);
                if (o && eq) {
                    v = eq + 1;
                    given = true;
                } else if (!o && !eq && !strncmp(name, "no-", 3)) {
                    /* --no-log-requests: a boolean that defaults to true, turned off */
                    o = find_long(name + 3);
                    if (o && o->type != T_BOOL) o = NULL;
                    v = "false";
                    given = true;
                }
            }
        } else if (a[0] == '-' && a[1] && !a[2]) {
            for (size_t k = 0; k < N_OPTS && !o; k++)
                if (table[k].short_name == a[1]) o = &table[k];
        }
        if (!o) {
            fprintf(stderr, "pagoda: unknown option '%s' (see pagoda serve --help)\n", a);
            return -1;
        }
        if (!given && o->type != T_BOOL) {
            if (i + 1 >= argc) {
                fprintf(stderr, "pagoda: option %s needs a value\n", a);
                return -1;
            }
            v = argv[++i];
        }
        if (o->offset == OFF(lora_modules) && !given) { /* vLLM's form: a=DIR b=DIR */
            char *joined = pgd_join_option_values(argc, argv, &i);
            if (!joined) return -1;
            int rc = set_opt(c, o, joined, "the command line");
            free(joined);
            if (rc) return -1;
            continue;
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
    if (strcmp(c->scheduling_policy, "fcfs") && strcmp(c->scheduling_policy, "priority")) {
        fprintf(stderr, "pagoda: --scheduling-policy must be fcfs or priority\n");
        return -1;
    }
    if (strcmp(c->speculative, "none") && strcmp(c->speculative, "ngram") &&
        strcmp(c->speculative, "draft")) {
        fprintf(stderr, "pagoda: --speculative must be none, ngram or draft\n");
        return -1;
    }
    if (!strcmp(c->speculative, "draft") && !c->draft_model) {
        fprintf(stderr, "pagoda: --speculative draft needs --draft-model\n");
        return -1;
    }
    if (strcmp(c->load_format, "auto") && strcmp(c->load_format, "dummy")) {
        fprintf(stderr, "pagoda: invalid value '%s' for --load-format (auto or dummy)\n",
                c->load_format);
        return -1;
    }
    if (strcmp(c->device, "cpu") && strcmp(c->device, "cuda")) {
        fprintf(stderr, "pagoda: invalid value '%s' for --device (cpu or cuda)\n", c->device);
        return -1;
    }
    if (strcmp(c->kv_dtype, "f32") && strcmp(c->kv_dtype, "f16") && strcmp(c->kv_dtype, "bf16")) {
        fprintf(stderr, "pagoda: --kv-dtype must be f32, f16 or bf16\n");
        return -1;
    }
    return 0;
}

void pgd_server_config_free(pgd_server_config *c) {
    for (size_t i = 0; i < N_OPTS; i++)
        if (table[i].type == T_STR) free(*(char **)((char *)c + table[i].offset));
    for (int i = 0; i < c->n_api_keys; i++) free(c->api_keys[i]);
    free(c->config_file);
    memset(c, 0, sizeof *c);
}
