/* The option machinery (parse, defaults, environment, help) and the one
 * declaration of the engine and model options every command shares. */
#include "util/options.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "util/parse.h"

#define S PGD_CMD_SERVE
#define G PGD_CMD_GENERATE
#define B PGD_CMD_BATCH
#define H PGD_CMD_BENCH
#define L PGD_CMD_LOGITS
#define P PGD_CMD_PERPLEXITY
#define EOFF(f) offsetof(pgd_engine_opts, f)

const pgd_opt pgd_engine_opt_table[] = {
    {"model", 'm', NULL, PGD_OPT_STR, EOFF(model), "models/SmolLM2-135M-Instruct.Q4_1.gguf", 0, 0,
     NULL, "PAGODA_MODEL", 0, "GGUF file or Hugging Face model directory"},
    {"threads", 't', NULL, PGD_OPT_INT, EOFF(threads), "0", 0, 1024, NULL, NULL, 0,
     "compute threads (0: all CPUs)"},
    {"ctx", 0, NULL, PGD_OPT_INT, EOFF(ctx), "0", 0, 1 << 24, NULL, NULL, S | G | L,
     "context length (0: the model's)"},
    {"max-num-batched-tokens", 0, NULL, PGD_OPT_INT, EOFF(max_num_batched_tokens), "512", 1,
     1 << 20, NULL, NULL, S | B, "token budget per engine step (= prefill chunk size)"},
    {"max-num-seqs", 0, NULL, PGD_OPT_INT, EOFF(max_num_seqs), "64", 1, 4096, NULL, NULL, S | B,
     "sequences running at once"},
    {"kv-cache-memory", 0, NULL, PGD_OPT_SIZE, EOFF(kv_cache_bytes), "512MiB", 1, 1e15, NULL, NULL,
     S | B,
     "KV cache budget (e.g. 512MiB, 4GiB); CPU only: on CUDA --gpu-memory-utilization "
     "sizes it"},
    {"kv-dtype", 0, NULL, PGD_OPT_CHOICE, EOFF(kv_dtype), "f16", 0, 0, "f32|f16|bf16|q8_0|q4_0",
     NULL, S | B | H | P | G | L,
     "KV cache element type of K and V (q8_0, q4_0: llama.cpp's blocks, CPU only)"},
    {"cache-type-k", 0, "-ctk", PGD_OPT_CHOICE, EOFF(cache_type_k), NULL, 0, 0,
     "f32|f16|bf16|q8_0|q4_0", NULL, S | B | H | P | G | L,
     "K's element type (llama.cpp's -ctk; default: --kv-dtype)"},
    {"cache-type-v", 0, "-ctv", PGD_OPT_CHOICE, EOFF(cache_type_v), NULL, 0, 0,
     "f32|f16|bf16|q8_0|q4_0", NULL, S | B | H | P | G | L,
     "V's element type (llama.cpp's -ctv; default: --kv-dtype)"},
    {"block-size", 0, NULL, PGD_OPT_INT, EOFF(block_size), "16", 1, 1024, NULL, NULL, S | B,
     "KV block size in tokens"},
    {"scheduling-policy", 0, NULL, PGD_OPT_CHOICE, EOFF(scheduling_policy), "fcfs", 0, 0,
     "fcfs|priority", NULL, S | B,
     "fcfs (first come, first served) or priority: requests are served, and "
     "preempted, in the "
     "order of their \"priority\" (lower first; ties by arrival), and a "
     "waiting request "
     "preempts running ones of a lower priority when it does not fit (vLLM's)"},
    {"no-prefix-caching", 0, NULL, PGD_OPT_BOOL, EOFF(no_prefix_caching), "false", 0, 0, NULL, NULL,
     S | B, "turn the prefix cache off"},
    {"speculative", 0, NULL, PGD_OPT_CHOICE, EOFF(speculative), "none", 0, 0, "none|ngram|draft",
     NULL, S | G | B,
     "speculative decoding: n-gram prompt lookup or a draft model (exact: the "
     "output "
     "distribution is unchanged)"},
    {"num-speculative-tokens", 0, NULL, PGD_OPT_INT, EOFF(num_speculative_tokens), "5", 1,
     PGD_SPEC_MAX_TOKENS, NULL, NULL, S | G | B, "the most tokens proposed per step"},
    {"draft-model", 0, NULL, PGD_OPT_STR, EOFF(draft_model), NULL, 0, 0, NULL, NULL, S | G | B,
     "draft model (same vocabulary) for --speculative draft"},
    {"speculative-disable-by-batch-size", 0, NULL, PGD_OPT_INT,
     EOFF(speculative_disable_by_batch_size), "0", 0, 4096, NULL, NULL, S | B,
     "no proposals while this many requests run (a large batch is "
     "compute-bound; 0: never)"},
    {"lora-modules", 0, NULL, PGD_OPT_WORDS, EOFF(lora_modules), NULL, 0, 0, NULL, NULL, S | B,
     "LoRA adapters (PEFT directories; CPU backend) served as models of their "
     "own: NAME=DIR, "
     "several separated by commas or spaces (as vLLM's); a request's "
     "\"model\": NAME runs "
     "with that adapter, one with no \"model\" or the model's own name "
     "without"},
    {"device", 0, NULL, PGD_OPT_CHOICE, EOFF(device), "cpu", 0, 0, "cpu|cuda", "PAGODA_DEVICE", 0,
     "backend"},
    {"tensor-parallel-size", 0, "-tp", PGD_OPT_INT, EOFF(tensor_parallel_size), "1", 1, 64, NULL,
     "PAGODA_TENSOR_PARALLEL", 0, "ranks the model is split across"},
    {"gpu-memory-utilization", 0, NULL, PGD_OPT_FRAC, EOFF(gpu_memory_utilization), "0.9", 0, 1,
     NULL, "PAGODA_GPU_MEMORY_UTILIZATION", 0,
     "CUDA: share (0, 1] of each GPU's memory for weights, activations and the "
     "KV cache, which "
     "gets what is left; accepted and ignored on the CPU"},
    {"load-format", 0, NULL, PGD_OPT_CHOICE, EOFF(load_format), "auto", 0, 0, "auto|dummy",
     "PAGODA_LOAD_FORMAT", 0,
     "dummy: --model is a config.json (or its folder), the weights are random; "
     "without a "
     "tokenizer.json beside it prompts must be token ids"},
    {"weights-f32", 0, NULL, PGD_OPT_BOOL, EOFF(weights_f32), "false", 0, 0, NULL, NULL,
     S | G | B | L | P, "dequantize weights to F32 at load (reference path)"},
};
const size_t pgd_engine_opt_count = sizeof pgd_engine_opt_table / sizeof pgd_engine_opt_table[0];

static bool takes(const pgd_opt *o, unsigned cmd) {
    return !o->cmds || !cmd || (o->cmds & cmd);
}

static bool is_choice(const char *choices, const char *v) {
    size_t n = strlen(v);
    for (const char *p = choices; *p;) {
        const char *bar = strchr(p, '|');
        size_t l = bar ? (size_t)(bar - p) : strlen(p);
        if (l == n && !strncmp(p, v, n)) return true;
        p += l + (bar ? 1 : 0);
    }
    return false;
}

int pgd_opt_set(void *base, const pgd_opt *o, const char *v, const char *src) {
    char *at = (char *)base + o->offset;
    switch (o->type) {
    case PGD_OPT_CHOICE:
        if (!v || !is_choice(o->choices, v)) goto bad;
        /* fall through */
    case PGD_OPT_STR:
    case PGD_OPT_WORDS: {
        char **p = (char **)at;
        char *d = v ? strdup(v) : NULL;
        if (v && !d) goto bad;
        free(*p);
        *p = d;
        return 0;
    }
    case PGD_OPT_BOOL: {
        bool *b = (bool *)at;
        /* any case: vLLM's environment variables are written True */
        if (!v || !strcasecmp(v, "true") || !strcmp(v, "1"))
            *b = true;
        else if (!strcasecmp(v, "false") || !strcmp(v, "0"))
            *b = false;
        else
            goto bad;
        return 0;
    }
    case PGD_OPT_INT: {
        char *end;
        errno = 0;
        long x = v ? strtol(v, &end, 10) : 0;
        if (!v || errno || *end || end == v || x < o->lo || x > o->hi) goto bad;
        *(int *)at = (int)x;
        return 0;
    }
    case PGD_OPT_FRAC: {
        char *end;
        errno = 0;
        double x = v ? strtod(v, &end) : 0;
        if (!v || errno || *end || end == v || !(x > o->lo && x <= o->hi)) goto bad;
        *(float *)at = (float)x;
        return 0;
    }
    case PGD_OPT_SIZE: {
        size_t x;
        if (!v || pgd_parse_size(v, &x) || (double)x < o->lo || (double)x > o->hi) goto bad;
        *(size_t *)at = x;
        return 0;
    }
    case PGD_OPT_KEYS:
        break;
    }
bad:
    fprintf(stderr, "pagoda: invalid value '%s' for --%s (from %s)", v ? v : "", o->name, src);
    if (o->type == PGD_OPT_INT || o->type == PGD_OPT_SIZE)
        fprintf(stderr, "; %.0f to %.0f", o->lo, o->hi);
    else if (o->type == PGD_OPT_FRAC)
        fprintf(stderr, "; a fraction in (%g, %g]", o->lo, o->hi);
    else if (o->type == PGD_OPT_CHOICE)
        fprintf(stderr, "; one of %s", o->choices);
    fputc('\n', stderr);
    return -1;
}

const pgd_opt *pgd_opt_find(const pgd_opt *t, size_t n, const char *name) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(t[i].name, name)) return &t[i];
    return NULL;
}

int pgd_opt_defaults(void *base, const pgd_opt *t, size_t n, unsigned cmd) {
    for (size_t i = 0; i < n; i++)
        if (t[i].dflt && takes(&t[i], cmd) && pgd_opt_set(base, &t[i], t[i].dflt, "defaults"))
            return -1;
    return 0;
}

const char *pgd_opt_env_value(const pgd_opt *o) {
    const char *e = o->env ? getenv(o->env) : NULL;
    return e && *e ? e : NULL;
}

int pgd_opt_env(void *base, const pgd_opt *t, size_t n, unsigned cmd) {
    for (size_t i = 0; i < n; i++) {
        const char *e = takes(&t[i], cmd) ? pgd_opt_env_value(&t[i]) : NULL;
        if (e && t[i].type != PGD_OPT_KEYS && pgd_opt_set(base, &t[i], e, t[i].env))
            return -1;
    }
    return 0;
}

void pgd_opt_help(FILE *f, const pgd_opt *t, size_t n, unsigned cmd) {
    for (size_t i = 0; i < n; i++) {
        const pgd_opt *o = &t[i];
        if (!takes(o, cmd)) continue;
        char flag[96];
        const char *val = o->type == PGD_OPT_BOOL     ? ""
                          : o->type == PGD_OPT_CHOICE ? o->choices
                          : o->type == PGD_OPT_WORDS  ? "NAME=DIR ..."
                                                      : "V";
        snprintf(flag, sizeof flag, "%s%c%s--%s%s%s%s%s", o->short_name ? "-" : "",
                 o->short_name ? o->short_name : ' ', o->short_name ? ", " : "", o->name,
                 o->alias ? ", " : "", o->alias ? o->alias : "", *val ? " " : "", val);
        const char *fl = flag + (o->short_name ? 0 : 1);
        if (strlen(fl) > 29)
            fprintf(f, "  %s\n  %-30s %s", fl, "", o->help);
        else
            fprintf(f, "  %-30s %s", fl, o->help);
        if (o->dflt) fprintf(f, " [%s]", o->dflt);
        if (o->env) fprintf(f, " (env %s)", o->env);
        fputc('\n', f);
    }
}

int pgd_opt_parse_arg(void *base, const pgd_opt *t, size_t n, unsigned cmd, int argc, char **argv,
                      int *i) {
    const char *a = argv[*i];
    const pgd_opt *o = NULL;
    const char *v = NULL;
    bool given = false; /* the value came with the name: --name=value, or --no-name */
    if (a[0] == '-' && a[1] == '-') {
        char name[64];
        const char *eq = strchr(a + 2, '=');
        size_t nl = eq ? (size_t)(eq - (a + 2)) : strlen(a + 2);
        if (nl >= sizeof name) return 0;
        memcpy(name, a + 2, nl);
        name[nl] = 0;
        o = pgd_opt_find(t, n, name);
        if (o && eq) {
            v = eq + 1;
            given = true;
        } else if (!o && !eq && !strncmp(name, "no-", 3)) {
            /* --no-log-requests: a switch that defaults to true, turned off */
            o = pgd_opt_find(t, n, name + 3);
            if (o && o->type != PGD_OPT_BOOL) o = NULL;
            v = "false";
            given = true;
        }
    } else if (a[0] == '-' && a[1] && !a[2]) {
        for (size_t k = 0; k < n && !o; k++)
            if (t[k].short_name == a[1]) o = &t[k];
    } else if (a[0] == '-') {
        for (size_t k = 0; k < n && !o; k++)
            if (t[k].alias && !strcmp(t[k].alias, a)) o = &t[k];
    }
    if (!o || !takes(o, cmd)) return 0;
    if (o->type == PGD_OPT_KEYS) return 0;
    if (!given && o->type != PGD_OPT_BOOL) {
        if (*i + 1 >= argc) {
            fprintf(stderr, "pagoda: option %s needs a value\n", a);
            return -1;
        }
        ++*i;
        if (o->type == PGD_OPT_WORDS) { /* vLLM's form: a=DIR b=DIR */
            char *joined = pgd_join_option_values(argc, argv, i);
            if (!joined) return -1;
            int rc = pgd_opt_set(base, o, joined, "the command line");
            free(joined);
            return rc ? -1 : 1;
        }
        v = argv[*i];
    }
    return pgd_opt_set(base, o, v, "the command line") ? -1 : 1;
}

void pgd_opt_free(void *base, const pgd_opt *t, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (t[i].type == PGD_OPT_STR || t[i].type == PGD_OPT_CHOICE || t[i].type == PGD_OPT_WORDS) {
            char **p = (char **)((char *)base + t[i].offset);
            free(*p);
            *p = NULL;
        }
}

int pgd_engine_opts_init(pgd_engine_opts *eo, unsigned cmd) {
    memset(eo, 0, sizeof *eo);
    if (pgd_opt_defaults(eo, pgd_engine_opt_table, pgd_engine_opt_count, cmd) ||
        pgd_opt_env(eo, pgd_engine_opt_table, pgd_engine_opt_count, cmd))
        return -1;
    return 0;
}

void pgd_engine_opts_free(pgd_engine_opts *eo) {
    pgd_opt_free(eo, pgd_engine_opt_table, pgd_engine_opt_count);
}

static pgd_kv_dtype kv_dtype_named(const char *name) {
    return name && !strcmp(name, "f32")    ? PGD_KV_F32
           : name && !strcmp(name, "bf16") ? PGD_KV_BF16
           : name && !strcmp(name, "q8_0") ? PGD_KV_Q8_0
           : name && !strcmp(name, "q4_0") ? PGD_KV_Q4_0
                                           : PGD_KV_F16;
}

void pgd_engine_opts_kv_types(const pgd_engine_opts *eo, pgd_kv_dtype *k, pgd_kv_dtype *v) {
    *k = kv_dtype_named(eo->cache_type_k ? eo->cache_type_k : eo->kv_dtype);
    *v = kv_dtype_named(eo->cache_type_v ? eo->cache_type_v : eo->kv_dtype);
}

void pgd_engine_opts_config(const pgd_engine_opts *eo, pgd_engine_config *ec) {
    pgd_engine_config_default(ec);
    ec->model_path = eo->model;
    ec->weights_f32 = eo->weights_f32;
    ec->n_threads = eo->threads;
    ec->n_ctx = eo->ctx;
    if (eo->block_size) ec->block_size = eo->block_size;
    if (eo->kv_cache_bytes) ec->kv_cache_bytes = eo->kv_cache_bytes;
    pgd_engine_opts_kv_types(eo, &ec->kv_dtype, &ec->kv_dtype_v);
    ec->kv_split = ec->kv_dtype_v != ec->kv_dtype;
    if (eo->max_num_batched_tokens) ec->max_num_batched_tokens = eo->max_num_batched_tokens;
    if (eo->max_num_seqs) ec->max_num_seqs = eo->max_num_seqs;
    ec->no_prefix_caching = eo->no_prefix_caching;
    ec->priority_scheduling = eo->scheduling_policy && !strcmp(eo->scheduling_policy, "priority");
    ec->speculative = !eo->speculative                    ? PGD_SPEC_NONE
                      : !strcmp(eo->speculative, "ngram") ? PGD_SPEC_NGRAM
                      : !strcmp(eo->speculative, "draft") ? PGD_SPEC_DRAFT
                                                          : PGD_SPEC_NONE;
    if (eo->num_speculative_tokens) ec->num_speculative_tokens = eo->num_speculative_tokens;
    ec->draft_model_path = eo->draft_model;
    ec->speculative_disable_by_batch_size = eo->speculative_disable_by_batch_size;
    ec->device = eo->device;
    ec->tensor_parallel_size = eo->tensor_parallel_size;
    ec->load_format_dummy = eo->load_format && !strcmp(eo->load_format, "dummy");
    if (eo->gpu_memory_utilization > 0) ec->gpu_memory_utilization = eo->gpu_memory_utilization;
}
