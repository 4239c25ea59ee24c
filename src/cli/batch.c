/* `pagoda batch`: offline batch inference. Reads one JSON request per line, runs them all
 * through the engine at once, writes one JSON result per line in input order, with a progress
 * bar and a summary on stderr. A bad line gets an error result; the others still run. */
#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "engine/engine_internal.h"
#include "pagoda/pagoda.h"
#include "sample/json_grammar.h"
#include "util/clock.h"
#include "util/mapfile.h"
#include "util/parse.h"

typedef struct result {
    cJSON *id;            /* the request's "id" (a copy), or null */
    char *error;          /* set for a bad line or a failed request */
    char *text;
    size_t text_len, text_cap;
    int32_t *ids;
    size_t n_ids, cap_ids;
    const char *finish;
    int32_t n_prompt, n_completion, n_cached;
    bool done;
    int32_t logprobs;     /* alternatives asked for; -1: no "logprobs" in the output */
    cJSON *lp;            /* the "logprobs" array being built */
    float *embedding;     /* an "input" line's vector (pgd_engine_dim floats), or NULL */
} result;

typedef struct pending {
    pgd_request_params p;
    int32_t *prompt;
    int32_t *bias_ids;
    float *bias;
    char *stop[16];
    char *json_schema;    /* response_format json_schema's schema, compact JSON */
    char **choices;       /* guided_choice (p.n_choices) */
    char *regex;          /* guided_regex */
    char *grammar;        /* guided_grammar */
    int32_t *stop_ids;    /* stop_token_ids (p.n_stop_token_ids) */
    int line;
} pending;

/* --lora-modules: the adapters' names and directories (pointers into spec), and the base model's
 * name (its file's or directory's base name, as the server's default) */
#define BATCH_MAX_LORAS 64
typedef struct lora_set {
    char *spec;
    const char *names[BATCH_MAX_LORAS], *paths[BATCH_MAX_LORAS];
    int n;
    char base[256];
} lora_set;

static void usage_batch(FILE *f) {
    fprintf(f,
            "usage: pagoda batch [-m MODEL] --input IN.jsonl --output OUT.jsonl [options]\n"
            "Each input line: {\"id\": ..., \"prompt\": \"...\" or [token ids], \"max_tokens\": N,\n"
            "  \"temperature\": T, \"top_p\": P, \"top_k\": K, \"seed\": S, \"stop\": [...],\n"
            "  \"ignore_eos\": false, \"min_p\": P, \"presence_penalty\": X,\n"
            "  \"frequency_penalty\": X, \"repetition_penalty\": R, \"logit_bias\": {\"id\": bias},\n"
            "  \"min_tokens\": N, \"logprobs\": N (0..20), \"speculative\": false (opt out),\n"
            "  \"priority\": P (with --scheduling-policy priority; lower first),\n"
            "  \"response_format\": {\"type\": \"json_object\"} or {\"type\": \"json_schema\",\n"
            "  \"json_schema\": {\"schema\": {...}}} (output: one JSON object, of that schema)}\n"
            "  or, for an embedding, {\"id\": ..., \"input\": \"...\" or [token ids]} (output:\n"
            "  {\"id\", \"embedding\", \"prompt_tokens\"}, as /v1/embeddings computes it)\n"
            "Each output line (input order): {\"id\", \"text\", \"token_ids\", \"finish_reason\",\n"
            "  \"prompt_tokens\", \"completion_tokens\", \"cached_tokens\"[, \"logprobs\"]} or\n"
            "  {\"id\", \"error\"}; \"logprobs\": [{\"token\", \"logprob\", \"top_logprobs\":\n"
            "  [{\"token\", \"logprob\"}]}] from the raw model distribution.\n"
            "options:\n"
            "  -t, --threads N               worker threads (default: all CPUs)\n"
            "  --max-num-batched-tokens N    token budget per step = prefill chunk (default 512)\n"
            "  --max-num-seqs N              running sequences cap (default 64)\n"
            "  --scheduling-policy fcfs|priority  priority: lines run, and are preempted, in the\n"
            "                                order of their \"priority\" (lower first; ties by\n"
            "                                line order) instead of first come, first served\n"
            "  --kv-cache-memory SIZE        KV pool budget, e.g. 512MiB, 2GiB (default 512MiB;\n"
            "                                CPU only: on CUDA --gpu-memory-utilization sizes it)\n"
            "  --block-size N                KV block size in tokens (default 16)\n"
            "  --kv-dtype f32|f16|bf16       KV cache element type (default f32)\n"
            "  --no-prefix-caching           turn the prefix cache off\n"
            "  --lora-modules NAME=DIR ...   LoRA adapters (PEFT directories; CPU backend): a\n"
            "                                line with \"model\": NAME runs with that adapter,\n"
            "                                one with no \"model\" or the model's own name (its\n"
            "                                file's base name) without; any other name is an\n"
            "                                error line\n"
            "  --weights-f32                 dequantize weights to F32 at load\n"
            "  --stagger N                   submit one request every N steps (default: all at once)\n"
            "  --stats FILE                  write the run's statistics as JSON\n"
            "  --trace FILE                  write one line per step: seconds, running, waiting,\n"
            "                                tokens in the step\n"
            "  --static-batching             baseline: admit a new batch only when the last is done\n"
            "  --no-progress                 no progress bar\n"
            "  --speculative ngram|draft     speculative decoding: n-gram prompt lookup or a draft\n"
            "                                model (exact: the output distribution is unchanged)\n"
            "  --num-speculative-tokens K    the most proposals per step, 1..16 (default 5)\n"
            "  --speculative-disable-by-batch-size N  no proposals while N or more requests run\n"
            "                                (a large batch is compute-bound; default 0: never)\n"
            "  --draft-model M               the draft model (same vocabulary) for --speculative draft\n"
            "  --device cpu|cuda             backend (default cpu)\n"
            "  --tensor-parallel-size N      ranks (default 1)\n"
            "  --gpu-memory-utilization F    CUDA: share of each GPU's memory for weights,\n"
            "                                activations and the KV cache, 0 < F <= 1 (default\n"
            "                                0.9; replaces --kv-cache-memory there); accepted and\n"
            "                                ignored on the CPU\n"
            "  --load-format auto|dummy      dummy: MODEL is a config.json (or its folder), the\n"
            "                                weights random; without a tokenizer.json beside it,\n"
            "                                prompts must be token ids and \"text\" stays empty\n");
}

static void set_error(result *r, const char *msg) {
    free(r->error);
    r->error = strdup(msg);
    r->done = true;
}

/* *out = a copy of j's string key, or NULL where it is absent or null: 0, or -1 with msg. */
static int string_field(const cJSON *j, const char *key, char **out, char *msg, size_t ml) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!x || cJSON_IsNull(x)) return 0;
    if (!cJSON_IsString(x) || !(*out = strdup(x->valuestring))) {
        snprintf(msg, ml, "\"%s\" must be a string", key);
        return -1;
    }
    return 0;
}

/* vLLM's guided_choice, guided_regex, guided_grammar and stop_token_ids (the engine checks what
 * they hold). */
static int parse_vllm_fields(const cJSON *j, pending *pd, char *msg, size_t ml) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, "guided_choice"), *y;
    if (x && !cJSON_IsNull(x)) {
        int n = cJSON_IsArray(x) ? cJSON_GetArraySize(x) : 0;
        if (n < 1 || !(pd->choices = calloc((size_t)n, sizeof *pd->choices))) {
            snprintf(msg, ml, n < 1 ? "\"guided_choice\" must be an array of strings"
                                    : "out of memory");
            return -1;
        }
        cJSON_ArrayForEach(y, x) {
            if (!cJSON_IsString(y) || !(pd->choices[pd->p.n_choices++] = strdup(y->valuestring))) {
                snprintf(msg, ml, "\"guided_choice\" must be an array of strings");
                return -1;
            }
        }
        pd->p.choices = (const char *const *)pd->choices;
    }
    if (string_field(j, "guided_regex", &pd->regex, msg, ml) ||
        string_field(j, "guided_grammar", &pd->grammar, msg, ml))
        return -1;
    pd->p.regex = pd->regex;
    pd->p.grammar = pd->grammar;
    x = cJSON_GetObjectItemCaseSensitive(j, "stop_token_ids");
    if (x && !cJSON_IsNull(x)) {
        int n = cJSON_IsArray(x) ? cJSON_GetArraySize(x) : -1;
        if (n < 0 || !(pd->stop_ids = malloc((size_t)(n ? n : 1) * sizeof *pd->stop_ids))) {
            snprintf(msg, ml, n < 0 ? "\"stop_token_ids\" must be an array of token ids"
                                    : "out of memory");
            return -1;
        }
        cJSON_ArrayForEach(y, x) {
            if (!cJSON_IsNumber(y) || y->valuedouble < 0 || y->valuedouble > INT32_MAX ||
                y->valuedouble != (double)(int32_t)y->valuedouble) {
                snprintf(msg, ml, "\"stop_token_ids\" must be an array of token ids");
                return -1;
            }
            pd->stop_ids[pd->p.n_stop_token_ids++] = (int32_t)y->valuedouble;
        }
        pd->p.stop_token_ids = pd->stop_ids;
    }
    return 0;
}

/* Parses one request line into p (prompt tokenized with the engine's tokenizer). */
/* A line's "model" with --lora-modules: an adapter's name (-> its pgd_request_params.lora), the
 * base model's, or none; anything else is refused. Without adapters "model" is not read. */
static int line_lora(const cJSON *j, const lora_set *ls, int32_t *lora, char *msg, size_t ml) {
    *lora = 0;
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(j, "model");
    if (!ls->n || !m || cJSON_IsNull(m)) return 0;
    if (cJSON_IsString(m)) {
        if (!strcmp(m->valuestring, ls->base)) return 0;
        for (int i = 0; i < ls->n; i++)
            if (!strcmp(m->valuestring, ls->names[i])) {
                *lora = i + 1;
                return 0;
            }
    }
    snprintf(msg, ml, "\"model\" must be '%.64s' or one of the adapters --lora-modules names",
             ls->base);
    return -1;
}

static int parse_line(pgd_engine *e, const lora_set *ls, cJSON *j, pending *pd, result *r,
                      char *msg, size_t ml) {
    memset(&pd->p, 0, sizeof pd->p);
    pd->p.max_tokens = 16;
    pd->p.temperature = 1.0f;
    pd->p.top_p = 1.0f;
    cJSON *x;
    if ((x = cJSON_GetObjectItemCaseSensitive(j, "id"))) r->id = cJSON_Duplicate(x, true);
    if (line_lora(j, ls, &pd->p.lora, msg, ml)) return -1;
    cJSON *pr = cJSON_GetObjectItemCaseSensitive(j, "prompt");
    bool embed = !pr && (pr = cJSON_GetObjectItemCaseSensitive(j, "input")) != NULL;
    const char *key = embed ? "input" : "prompt";
    cJSON_ArrayForEach(x, j) /* an embedding line has nothing else to say */
        if (embed && strcmp(x->string, "id") && strcmp(x->string, "input") &&
            strcmp(x->string, "model") && strcmp(x->string, "priority")) {
            snprintf(msg, ml, "an embedding line (\"input\") takes no \"%.64s\"", x->string);
            return -1;
        }
    if (embed && !(r->embedding = calloc((size_t)pgd_engine_dim(e), sizeof(float)))) {
        snprintf(msg, ml, "out of memory");
        return -1;
    }
    if (cJSON_IsString(pr)) {
        size_t len = strlen(pr->valuestring), cap = len + 8, n = 0;
        pd->prompt = malloc(cap * sizeof *pd->prompt);
        if (!pd->prompt ||
            pgd_engine_tokenize(e, pr->valuestring, len, true, true, pd->prompt, cap, &n)) {
            if (pgd_engine_has_tokenizer(e)) snprintf(msg, ml, "cannot tokenize the %s", key);
            else snprintf(msg, ml, "the model has no tokenizer: give \"%s\" as token ids", key);
            return -1;
        }
        pd->p.n_prompt = (int32_t)n;
    } else if (cJSON_IsArray(pr)) {
        int n = cJSON_GetArraySize(pr);
        pd->prompt = malloc((size_t)(n > 0 ? n : 1) * sizeof *pd->prompt);
        if (!pd->prompt) {
            snprintf(msg, ml, "out of memory");
            return -1;
        }
        int i = 0;
        cJSON_ArrayForEach(x, pr) {
            if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble > 2147483647.0 ||
                x->valuedouble != (double)(int32_t)x->valuedouble) {
                snprintf(msg, ml, "\"%s\" must be a string or an array of token ids", key);
                return -1;
            }
            pd->prompt[i++] = (int32_t)x->valuedouble;
        }
        pd->p.n_prompt = n;
    } else {
        snprintf(msg, ml, "\"%s\" must be a string or an array of token ids", key);
        return -1;
    }
    pd->p.prompt = pd->prompt;
    double mt = 16, temp = 1.0, tp = 1.0, tk = 0, seed = (double)pd->line, minp = 0, pres = 0,
           freq = 0, rep = 1, mint = 0, lps = -1, prio = 0;
    const struct { const char *key; double lo, hi; bool integer; double *dst; } nums[] = {
        {"max_tokens", 1, 1e7, true, &mt},
        {"temperature", 0, 100, false, &temp},
        {"top_p", 0, 1, false, &tp},
        {"top_k", 0, 1e9, true, &tk},
        {"seed", 0, 9007199254740991.0, true, &seed},
        {"min_p", 0, 1, false, &minp},
        {"presence_penalty", -2, 2, false, &pres},
        {"frequency_penalty", -2, 2, false, &freq},
        {"repetition_penalty", 0.01, 100, false, &rep},
        {"min_tokens", 0, 1e7, true, &mint},
        {"logprobs", 0, 20, true, &lps},
        {"priority", INT32_MIN, INT32_MAX, true, &prio},
    };
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++) {
        x = cJSON_GetObjectItemCaseSensitive(j, nums[i].key);
        if (!x || cJSON_IsNull(x)) continue;
        if (!cJSON_IsNumber(x) || x->valuedouble < nums[i].lo || x->valuedouble > nums[i].hi ||
            (nums[i].integer && x->valuedouble != (double)(int64_t)x->valuedouble)) {
            snprintf(msg, ml, "\"%s\" must be a %s in [%g, %g]", nums[i].key,
                     nums[i].integer ? "whole number" : "number", nums[i].lo, nums[i].hi);
            return -1;
        }
        *nums[i].dst = x->valuedouble;
    }
    pd->p.max_tokens = embed ? 0 : (int32_t)mt; /* an embedding runs the input only */
    pd->p.embedding = r->embedding;
    pd->p.temperature = (float)temp;
    pd->p.top_p = (float)tp;
    pd->p.top_k = (int32_t)tk;
    pd->p.seed = (uint64_t)seed;
    pd->p.min_p = (float)minp;
    pd->p.presence_penalty = (float)pres;
    pd->p.frequency_penalty = (float)freq;
    pd->p.repetition_penalty = (float)rep;
    pd->p.min_tokens = (int32_t)mint;
    pd->p.logprobs = (int32_t)lps;
    pd->p.priority = (int32_t)prio;
    r->logprobs = (int32_t)lps;
    x = cJSON_GetObjectItemCaseSensitive(j, "logit_bias");
    if (x && !cJSON_IsNull(x)) {
        int nb = cJSON_IsObject(x) ? cJSON_GetArraySize(x) : -1;
        if (nb < 0) {
            snprintf(msg, ml, "\"logit_bias\" must be an object of token id -> bias");
            return -1;
        }
        pd->bias_ids = malloc((size_t)(nb ? nb : 1) * sizeof *pd->bias_ids);
        pd->bias = malloc((size_t)(nb ? nb : 1) * sizeof *pd->bias);
        if (!pd->bias_ids || !pd->bias) {
            snprintf(msg, ml, "out of memory");
            return -1;
        }
        cJSON *y;
        int k = 0;
        cJSON_ArrayForEach(y, x) {
            char *end;
            long id = strtol(y->string, &end, 10);
            if (*end || end == y->string || id < 0 || id > INT32_MAX || !cJSON_IsNumber(y) ||
                y->valuedouble < -100 || y->valuedouble > 100) {
                snprintf(msg, ml, "\"logit_bias\" maps token ids to numbers in [-100, 100]");
                return -1;
            }
            pd->bias_ids[k] = (int32_t)id;
            pd->bias[k++] = (float)y->valuedouble;
        }
        pd->p.logit_bias_ids = pd->bias_ids;
        pd->p.logit_bias = pd->bias;
        pd->p.n_logit_bias = k;
    }
    x = cJSON_GetObjectItemCaseSensitive(j, "response_format");
    if (x && !cJSON_IsNull(x)) {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(x, "type");
        const cJSON *sch = cJSON_GetObjectItemCaseSensitive(
            cJSON_GetObjectItemCaseSensitive(x, "json_schema"), "schema");
        if (!cJSON_IsString(ty) ||
            (strcmp(ty->valuestring, "text") && strcmp(ty->valuestring, "json_object") &&
             strcmp(ty->valuestring, "json_schema"))) {
            snprintf(msg, ml, "\"response_format\" must be {\"type\": \"text\"}, "
                              "{\"type\": \"json_object\"} or {\"type\": \"json_schema\", "
                              "\"json_schema\": {\"schema\": ...}}");
            return -1;
        }
        pd->p.json_object = strcmp(ty->valuestring, "text") != 0;
        if (!strcmp(ty->valuestring, "json_schema") && sch) { /* the engine compiles it */
            if (!(pd->json_schema = pgd_json_print_exact(sch))) {
                snprintf(msg, ml, "the schema holds a number that is not finite");
                return -1;
            }
            pd->p.json_schema = pd->json_schema;
        }
    }
    x = cJSON_GetObjectItemCaseSensitive(j, "speculative");
    if (x && !cJSON_IsBool(x)) {
        snprintf(msg, ml, "\"speculative\" must be a boolean");
        return -1;
    }
    pd->p.no_speculation = cJSON_IsFalse(x);
    x = cJSON_GetObjectItemCaseSensitive(j, "ignore_eos");
    if (x && !cJSON_IsBool(x)) {
        snprintf(msg, ml, "\"ignore_eos\" must be a boolean");
        return -1;
    }
    pd->p.ignore_eos = cJSON_IsTrue(x);
    x = cJSON_GetObjectItemCaseSensitive(j, "stop");
    if (cJSON_IsString(x)) {
        pd->stop[0] = strdup(x->valuestring);
        pd->p.n_stop = 1;
    } else if (cJSON_IsArray(x)) {
        cJSON *y;
        cJSON_ArrayForEach(y, x) {
            if (!cJSON_IsString(y) || pd->p.n_stop >= 16) {
                snprintf(msg, ml, "\"stop\" must be a string or up to 16 strings");
                return -1;
            }
            pd->stop[pd->p.n_stop++] = strdup(y->valuestring);
        }
    } else if (x && !cJSON_IsNull(x)) {
        snprintf(msg, ml, "\"stop\" must be a string or up to 16 strings");
        return -1;
    }
    for (int i = 0; i < pd->p.n_stop; i++)
        if (!pd->stop[i]) {
            snprintf(msg, ml, "out of memory");
            return -1;
        }
    pd->p.stop = (const char *const *)pd->stop;
    return parse_vllm_fields(j, pd, msg, ml);
}

static void append(result *r, const pgd_event *ev) {
    if (ev->text_len > 0) {
        if (r->text_len + (size_t)ev->text_len + 1 > r->text_cap) {
            size_t nc = (r->text_cap + (size_t)ev->text_len + 1) * 2;
            char *t = realloc(r->text, nc);
            if (!t) return;
            r->text = t;
            r->text_cap = nc;
        }
        memcpy(r->text + r->text_len, ev->text, (size_t)ev->text_len);
        r->text_len += (size_t)ev->text_len;
        r->text[r->text_len] = 0;
    }
    if (ev->type == PGD_EVENT_TOKEN) {
        if (r->n_ids == r->cap_ids) {
            size_t nc = r->cap_ids ? r->cap_ids * 2 : 64;
            int32_t *n = realloc(r->ids, nc * sizeof *n);
            if (!n) return;
            r->ids = n;
            r->cap_ids = nc;
        }
        r->ids[r->n_ids++] = ev->token;
        if (r->logprobs >= 0) {
            if (!r->lp) r->lp = cJSON_CreateArray();
            cJSON *o = cJSON_CreateObject();
            cJSON_AddNumberToObject(o, "token", ev->token);
            cJSON_AddNumberToObject(o, "logprob", ev->logprob);
            cJSON *top = cJSON_AddArrayToObject(o, "top_logprobs");
            for (int i = 0; i < ev->n_top; i++) {
                cJSON *t = cJSON_CreateObject();
                cJSON_AddNumberToObject(t, "token", ev->top_ids[i]);
                cJSON_AddNumberToObject(t, "logprob", ev->top_logprobs[i]);
                cJSON_AddItemToArray(top, t);
            }
            cJSON_AddItemToArray(r->lp, o);
        }
    }
}

static void progress(int done, int total, long tokens, double t0, bool final) {
    double dt = pgd_now_s() - t0;
    int w = 30, fill = total ? done * w / total : w;
    fprintf(stderr, "\r[");
    for (int i = 0; i < w; i++) fputc(i < fill ? '#' : '.', stderr);
    fprintf(stderr, "] %d/%d requests, %ld tokens, %.1f tokens/s%s", done, total, tokens,
            dt > 0 ? (double)tokens / dt : 0.0, final ? "\n" : "");
}

int pgd_cli_batch(int argc, char **argv) {
    pgd_engine_config ec;
    pgd_engine_config_default(&ec);
    ec.model_path = pgd_cli_default_model();
    const char *in_path = NULL, *out_path = NULL, *stats_path = NULL, *trace_path = NULL;
    FILE *trace = NULL;
    long stagger = 0;
    bool show_progress = true;
    lora_set ls = {0};
    char lmsg[320];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long l;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage_batch(stdout);
            return 0;
        } else if (!strcmp(a, "--no-prefix-caching")) {
            ec.no_prefix_caching = true;
            continue;
        } else if (!strcmp(a, "--weights-f32")) {
            ec.weights_f32 = true;
            continue;
        } else if (!strcmp(a, "--static-batching")) {
            ec.static_batching = true;
            continue;
        } else if (!strcmp(a, "--no-progress")) {
            show_progress = false;
            continue;
        } else if (!v) {
            fprintf(stderr, "pagoda: option %s needs a value\n", a);
            return 2;
        }
        i++;
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) ec.model_path = v;
        else if (!strcmp(a, "--lora-modules")) {
            /* vLLM's form, NAME=DIR NAME=DIR up to the next option, or comma-separated */
            free(ls.spec);
            if (!(ls.spec = pgd_join_option_values(argc, argv, &i))) return 1;
        }
        else if (!strcmp(a, "--input")) in_path = v;
        else if (!strcmp(a, "--output")) out_path = v;
        else if (!strcmp(a, "--stats")) stats_path = v;
        else if (!strcmp(a, "--trace")) trace_path = v;
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            if (pgd_cli_parse_long(v, 1, 1024, &l)) goto bad;
            ec.n_threads = (int32_t)l;
        } else if (!strcmp(a, "--max-num-batched-tokens")) {
            if (pgd_cli_parse_long(v, 1, 1 << 20, &l)) goto bad;
            ec.max_num_batched_tokens = (int32_t)l;
        } else if (!strcmp(a, "--scheduling-policy")) {
            if (strcmp(v, "fcfs") && strcmp(v, "priority")) goto bad;
            ec.priority_scheduling = !strcmp(v, "priority");
        } else if (!strcmp(a, "--max-num-seqs")) {
            if (pgd_cli_parse_long(v, 1, 4096, &l)) goto bad;
            ec.max_num_seqs = (int32_t)l;
        } else if (!strcmp(a, "--block-size")) {
            if (pgd_cli_parse_long(v, 1, 1024, &l)) goto bad;
            ec.block_size = (int32_t)l;
        } else if (!strcmp(a, "--stagger")) {
            if (pgd_cli_parse_long(v, 0, 1 << 20, &stagger)) goto bad;
        } else if (!strcmp(a, "--kv-cache-memory")) {
            if (pgd_parse_size(v, &ec.kv_cache_bytes)) goto bad;
        } else if (!strcmp(a, "--speculative")) {
            if (!strcmp(v, "ngram")) ec.speculative = PGD_SPEC_NGRAM;
            else if (!strcmp(v, "draft")) ec.speculative = PGD_SPEC_DRAFT;
            else if (!strcmp(v, "none")) ec.speculative = PGD_SPEC_NONE;
            else goto bad;
        } else if (!strcmp(a, "--num-speculative-tokens")) {
            if (pgd_cli_parse_long(v, 1, PGD_SPEC_MAX_TOKENS, &l)) goto bad;
            ec.num_speculative_tokens = (int32_t)l;
        } else if (!strcmp(a, "--draft-model")) {
            ec.draft_model_path = v;
        } else if (!strcmp(a, "--speculative-disable-by-batch-size")) {
            if (pgd_cli_parse_long(v, 0, 4096, &l)) goto bad;
            ec.speculative_disable_by_batch_size = (int32_t)l;
        } else if (!strcmp(a, "--device")) {
            if (strcmp(v, "cpu") && strcmp(v, "cuda")) goto bad;
            ec.device = v;
        } else if (!strcmp(a, "--tensor-parallel-size")) {
            if (pgd_cli_parse_long(v, 1, 64, &l)) goto bad;
            ec.tensor_parallel_size = (int32_t)l;
        } else if (!strcmp(a, "--load-format")) {
            if (pgd_cli_parse_load_format("pagoda", v, &ec.load_format_dummy)) return 2;
        } else if (!strcmp(a, "--gpu-memory-utilization")) {
            if (pgd_cli_parse_gpu_util("pagoda", v, &ec.gpu_memory_utilization)) return 2;
        } else if (!strcmp(a, "--kv-dtype")) {
            if (pgd_cli_parse_kv_dtype(v, &ec.kv_dtype)) goto bad;
        } else {
            fprintf(stderr, "pagoda: unknown option '%s' (see --help)\n", a);
            return 2;
        }
        continue;
    bad:
        fprintf(stderr, "pagoda: invalid value '%s' for %s\n", v, a);
        return 2;
    }
    if (!in_path || !out_path) {
        usage_batch(stderr);
        free(ls.spec);
        return 2;
    }
    const char *bn = strrchr(ec.model_path, '/');
    snprintf(ls.base, sizeof ls.base, "%s", bn && bn[1] ? bn + 1 : ec.model_path);
    if (ls.spec && pgd_parse_lora_modules(ls.spec, ls.base, ls.names, ls.paths, BATCH_MAX_LORAS,
                                          &ls.n, lmsg, sizeof lmsg)) {
        fprintf(stderr, "pagoda: %s\n", lmsg);
        free(ls.spec);
        return 2;
    }
    ec.lora_paths = ls.paths;
    ec.n_loras = ls.n;
    char *input = NULL;
    size_t in_len = 0;
    pgd_err perr = {{0}};
    if (pgd_read_file(in_path, &input, &in_len, &perr)) {
        fprintf(stderr, "pagoda: %s\n", perr.msg);
        free(ls.spec);
        return 1;
    }
    FILE *out = fopen(out_path, "w");
    if (!out) {
        perror(out_path);
        free(input);
        free(ls.spec);
        return 1;
    }
    char err[512];
    pgd_engine *e = NULL;
    if (pgd_engine_create(&ec, &e, err, sizeof err)) {
        fprintf(stderr, "pagoda: %s\n", err);
        fclose(out);
        free(input);
        free(ls.spec);
        return 1;
    }
    /* a test hook (tests/integration/test_spec.py): a verifier that accepts every proposal */
    const char *broken = getenv("PAGODA_TEST_SPEC_ALWAYS_ACCEPT");
    if (broken && !strcmp(broken, "1")) pgd__engine_spec_always_accept(e, true);
    /* split lines (blank lines are skipped, not counted) */
    int n_lines = 0, cap_lines = 64;
    char **lines = malloc((size_t)cap_lines * sizeof *lines);
    for (char *p = input, *nl; lines && p < input + in_len; p = nl + 1) {
        nl = memchr(p, '\n', (size_t)(input + in_len - p));
        if (!nl) nl = input + in_len;
        *nl = 0;
        char *q = p;
        while (*q == ' ' || *q == '\t' || *q == '\r') q++;
        if (!*q) continue;
        if (n_lines == cap_lines) {
            char **nls = realloc(lines, (size_t)cap_lines * 2 * sizeof *nls);
            if (!nls) break;
            lines = nls;
            cap_lines *= 2;
        }
        lines[n_lines++] = p;
    }
    result *res = calloc((size_t)(n_lines ? n_lines : 1), sizeof *res);
    pending *pend = calloc((size_t)(n_lines ? n_lines : 1), sizeof *pend);
    int exit_code = 1;
    if (!lines || !res || !pend) {
        fprintf(stderr, "pagoda: out of memory\n");
        goto done;
    }
    int n_valid = 0;
    for (int i = 0; i < n_lines; i++) {
        pend[i].line = i;
        cJSON *j = cJSON_Parse(lines[i]);
        char msg[256];
        if (!cJSON_IsObject(j)) set_error(&res[i], "the line is not a JSON object");
        else if (parse_line(e, &ls, j, &pend[i], &res[i], msg, sizeof msg))
            set_error(&res[i], msg);
        else n_valid++;
        cJSON_Delete(j);
    }
    if (trace_path && !(trace = fopen(trace_path, "w"))) {
        perror(trace_path);
        goto done;
    }
    double t0 = pgd_now_s(), last_draw = 0;
    int next = 0, n_done = 0;
    long steps = 0, tokens = 0;
    pgd_event ev[256];
    while (n_done < n_valid) {
        /* submit: everything at once, or one request every `stagger` steps */
        while (next < n_lines && (stagger == 0 || steps >= (long)next * stagger)) {
            pending *pd = &pend[next];
            result *r = &res[next];
            next++;
            if (r->done) continue;
            pd->p.user_data = (uint64_t)pd->line;
            uint64_t rid;
            if (pgd_engine_submit(e, &pd->p, &rid, err, sizeof err)) {
                set_error(r, err);
                n_done++;
            }
            if (stagger) break;
        }
        if (n_done >= n_valid) break;
        int step_tokens = pgd_engine_step(e);
        steps++;
        if (trace) {
            pgd_engine_stats ts;
            pgd_engine_get_stats(e, &ts);
            fprintf(trace, "%.6f %d %d %d\n", pgd_now_s() - t0, ts.last_step_seqs, ts.num_waiting,
                    step_tokens);
        }
        int n;
        while ((n = pgd_engine_poll(e, ev, 256, 0)) > 0)
            for (int i = 0; i < n; i++) {
                result *r = &res[ev[i].user_data];
                append(r, &ev[i]);
                if (ev[i].type == PGD_EVENT_TOKEN) tokens++;
                if (ev[i].type != PGD_EVENT_FINISH) continue;
                static const char *names[] = {"", "stop", "length", "abort", "error"};
                r->finish = names[ev[i].finish_reason];
                r->n_prompt = ev[i].n_prompt;
                r->n_completion = ev[i].n_completion;
                r->n_cached = ev[i].n_cached;
                if (ev[i].finish_reason == PGD_FINISH_ERROR) set_error(r, ev[i].error);
                r->done = true;
                n_done++;
            }
        if (show_progress && pgd_now_s() - last_draw > 0.2) {
            progress(n_done, n_valid, tokens, t0, false);
            last_draw = pgd_now_s();
        }
    }
    double dt = pgd_now_s() - t0;
    if (show_progress) progress(n_done, n_valid, tokens, t0, true);
    for (int i = 0; i < n_lines; i++) {
        result *r = &res[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddItemToObject(o, "id", r->id ? r->id : cJSON_CreateNull());
        r->id = NULL;
        if (r->error) {
            cJSON *eo = cJSON_AddObjectToObject(o, "error");
            cJSON_AddStringToObject(eo, "message", r->error);
        } else if (r->embedding) {
            cJSON *v = cJSON_AddArrayToObject(o, "embedding");
            for (int32_t k = 0; v && k < pgd_engine_dim(e); k++)
                cJSON_AddItemToArray(v, cJSON_CreateNumber(r->embedding[k]));
            cJSON_AddNumberToObject(o, "prompt_tokens", r->n_prompt);
        } else {
            cJSON_AddStringToObject(o, "text", r->text ? r->text : "");
            cJSON *ids = cJSON_AddArrayToObject(o, "token_ids");
            for (size_t k = 0; k < r->n_ids; k++) cJSON_AddItemToArray(ids, cJSON_CreateNumber(r->ids[k]));
            cJSON_AddStringToObject(o, "finish_reason", r->finish ? r->finish : "");
            cJSON_AddNumberToObject(o, "prompt_tokens", r->n_prompt);
            cJSON_AddNumberToObject(o, "completion_tokens", r->n_completion);
            cJSON_AddNumberToObject(o, "cached_tokens", r->n_cached);
            if (r->logprobs >= 0) {
                cJSON_AddItemToObject(o, "logprobs", r->lp ? r->lp : cJSON_CreateArray());
                r->lp = NULL;
            }
        }
        char *txt = cJSON_PrintUnformatted(o);
        if (txt) fprintf(out, "%s\n", txt);
        free(txt);
        cJSON_Delete(o);
    }
    int n_failed = 0;
    for (int i = 0; i < n_lines; i++) n_failed += res[i].error != NULL;
    pgd_engine_stats st;
    pgd_engine_get_stats(e, &st);
    double hit = st.prefix_cache_queries ? 100.0 * st.prefix_cache_hits / st.prefix_cache_queries : 0;
    fprintf(stderr, "requests: %d (%d failed), prompt tokens: %lld, generated tokens: %lld, "
            "time: %.2f s, %.1f generated tokens/s, %.1f total tokens/s\n", n_lines,
            n_failed, (long long)st.prompt_tokens_total,
            (long long)st.generation_tokens_total, dt, st.generation_tokens_total / dt,
            (st.prefill_tokens_total + st.generation_tokens_total) / dt);
    fprintf(stderr, "prefix cache: %.1f%% of %lld prompt tokens hit; prefilled tokens: %lld; "
            "preemptions: %lld; steps: %lld\n", hit, (long long)st.prefix_cache_queries,
            (long long)st.prefill_tokens_total, (long long)st.num_preemptions, (long long)st.steps);
    if (st.spec_drafts)
        fprintf(stderr, "speculation: %lld proposed, %lld accepted (%.1f%%), %.2f accepted per "
                "verification\n", (long long)st.spec_draft_tokens,
                (long long)st.spec_accepted_tokens,
                100.0 * (double)st.spec_accepted_tokens / (double)st.spec_draft_tokens,
                (double)st.spec_accepted_tokens / (double)st.spec_drafts);
    if (stats_path) {
        FILE *sf = fopen(stats_path, "w");
        if (sf) {
            fprintf(sf, "{\"requests\": %d, \"prompt_tokens\": %lld, \"generation_tokens\": %lld, "
                    "\"prefill_tokens\": %lld, \"prefix_cache_queries\": %lld, "
                    "\"prefix_cache_hits\": %lld, \"preemptions\": %lld, \"steps\": %lld, "
                    "\"seconds\": %.6f, \"kv_blocks_total\": %d, \"kv_blocks_used\": %d, "
                    "\"spec_drafts\": %lld, \"spec_draft_tokens\": %lld, "
                    "\"spec_accepted_tokens\": %lld, \"spec_accepted_per_pos\": [",
                    n_lines, (long long)st.prompt_tokens_total,
                    (long long)st.generation_tokens_total, (long long)st.prefill_tokens_total,
                    (long long)st.prefix_cache_queries, (long long)st.prefix_cache_hits,
                    (long long)st.num_preemptions, (long long)st.steps, dt, st.kv_blocks_total,
                    st.kv_blocks_used, (long long)st.spec_drafts,
                    (long long)st.spec_draft_tokens, (long long)st.spec_accepted_tokens);
            for (int k = 0; k < PGD_SPEC_MAX_TOKENS; k++)
                fprintf(sf, "%s%lld", k ? ", " : "", (long long)st.spec_accepted_per_pos[k]);
            fprintf(sf, "]}\n");
            fclose(sf);
        }
    }
    exit_code = 0;
done:
    for (int i = 0; res && i < n_lines; i++) {
        cJSON_Delete(res[i].id);
        free(res[i].error);
        free(res[i].text);
        free(res[i].embedding);
        free(res[i].ids);
        cJSON_Delete(res[i].lp);
    }
    for (int i = 0; pend && i < n_lines; i++) {
        free(pend[i].prompt);
        free(pend[i].bias_ids);
        free(pend[i].bias);
        for (int k = 0; k < pend[i].p.n_stop; k++) free(pend[i].stop[k]);
        free(pend[i].json_schema);
        for (int32_t k = 0; k < pend[i].p.n_choices; k++) free(pend[i].choices[k]);
        free(pend[i].choices);
        free(pend[i].regex);
        free(pend[i].grammar);
        free(pend[i].stop_ids);
    }
    if (trace) fclose(trace);
    free(res);
    free(pend);
    free(lines);
    free(input);
    if (fclose(out) != 0) exit_code = 1;
    pgd_engine_free(e);
    free(ls.spec); /* after the engine: the adapter paths point into it */
    return exit_code;
}
