/* Declarative options (Redis's config table): one declaration per option gives
 * its name, type, default, bounds, environment variable and help, and where the
 * value lands. Flags, a JSON config file, the environment and --help all come
 * from declarations; the environment is read here only. The engine and model
 * options that serve, generate, batch and bench share are declared once, in
 * pgd_engine_opt_table, so a flag means the same in every command. */
#ifndef PGD_UTIL_OPTIONS_H
#define PGD_UTIL_OPTIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "pagoda/pagoda.h"

typedef enum {
    PGD_OPT_STR,    /* char * (strdup'd) */
    PGD_OPT_CHOICE, /* char *, one of the '|'-separated names in choices */
    PGD_OPT_WORDS,  /* char *: vLLM's list form, the arguments up to the next
                       option joined */
    PGD_OPT_INT,    /* int in [lo, hi] */
    PGD_OPT_SIZE,   /* size_t in [lo, hi], "512MiB" etc. */
    PGD_OPT_FRAC,   /* float in (lo, hi] */
    PGD_OPT_BOOL,   /* bool: a switch; true/false/1/0 from a file or the environment
                     */
    PGD_OPT_KEYS,   /* left to the table's owner (server/config.c's API keys) */
} pgd_opt_type;

/* Commands an option applies to (pgd_opt.cmds; 0: all). */
enum {
    PGD_CMD_SERVE = 1u << 0,
    PGD_CMD_GENERATE = 1u << 1,
    PGD_CMD_BATCH = 1u << 2,
    PGD_CMD_BENCH = 1u << 3,
    PGD_CMD_LOGITS = 1u << 4,
    PGD_CMD_PERPLEXITY = 1u << 5,
};

typedef struct pgd_opt {
    const char *name;  /* flag without dashes; also the JSON key */
    char short_name;   /* -x, or 0 */
    const char *alias; /* another whole flag ("-tp"), or NULL */
    pgd_opt_type type;
    size_t offset;       /* where the value lands in the table's struct */
    const char *dflt;    /* NULL: zero */
    double lo, hi;       /* bounds: [lo, hi] for INT and SIZE, (lo, hi] for FRAC */
    const char *choices; /* CHOICE: "f32|f16|bf16" */
    const char *env;     /* environment variable or NULL */
    unsigned cmds;       /* PGD_CMD_* bits; 0: every command */
    const char *help;
} pgd_opt;

/* Sets the option o of the struct at base from the text v (NULL for a switch
 * given bare). Returns 0, or -1 after one line on stderr naming the flag, the
 * value and src. Borrowed: v. */
int pgd_opt_set(void *base, const pgd_opt *o, const char *v, const char *src);
const pgd_opt *pgd_opt_find(const pgd_opt *t, size_t n, const char *name);
/* Defaults, then the environment variables the table names (the only getenv of
 * options). */
int pgd_opt_defaults(void *base, const pgd_opt *t, size_t n, unsigned cmd);
/* The option's environment variable, when it is set and not empty; NULL otherwise. */
const char *pgd_opt_env_value(const pgd_opt *o);
int pgd_opt_env(void *base, const pgd_opt *t, size_t n, unsigned cmd);
/* One line per option of cmd: flag, help, [default], (env VAR). */
void pgd_opt_help(FILE *f, const pgd_opt *t, size_t n, unsigned cmd);
/* Whether argv[*i] is an option of t that cmd takes (-x, --name V, --name=V,
 * -alias V, --no-name for a switch): 1 when it was, set, with *i on the last
 * argument taken; 0 when it is not one of them; -1 after one line on stderr (a
 * bad or missing value). */
int pgd_opt_parse_arg(void *base, const pgd_opt *t, size_t n, unsigned cmd, int argc, char **argv,
                      int *i);
/* Frees the strings the table set. */
void pgd_opt_free(void *base, const pgd_opt *t, size_t n);

/* The engine and model options. server/config.h embeds these fields under their
 * own names, so the server's code reads cfg->kv_dtype as before while the
 * shared table writes cfg->engine. */
#define PGD_ENGINE_OPTS_FIELDS                                                                     \
    char *model, *kv_dtype, *scheduling_policy, *speculative, *draft_model, *lora_modules;         \
    char *cache_type_k, *cache_type_v;                                                             \
    char *device, *load_format;                                                                    \
    int threads, ctx, max_num_batched_tokens, max_num_seqs, block_size;                            \
    int num_speculative_tokens, speculative_disable_by_batch_size, tensor_parallel_size;           \
    size_t kv_cache_bytes;                                                                         \
    float gpu_memory_utilization;                                                                  \
    bool no_prefix_caching, weights_f32;

typedef struct pgd_engine_opts {
    PGD_ENGINE_OPTS_FIELDS
} pgd_engine_opts;

extern const pgd_opt pgd_engine_opt_table[];
extern const size_t pgd_engine_opt_count;

/* Defaults and the environment for cmd's options: 0 or -1 (after one line).
 * Free with pgd_engine_opts_free. */
int pgd_engine_opts_init(pgd_engine_opts *eo, unsigned cmd);
void pgd_engine_opts_free(pgd_engine_opts *eo);
/* K's and V's element types: -ctk / -ctv, each defaulting to --kv-dtype (the names are checked
 * when set; pgd_kv_dtype's values are pgd_type's). */
void pgd_engine_opts_kv_types(const pgd_engine_opts *eo, pgd_kv_dtype *k, pgd_kv_dtype *v);
/* The engine configuration the options give (pgd_engine_config_default first).
 * The strings are borrowed from eo; lora_paths are left to the caller
 * (--lora-modules needs parsing). */
void pgd_engine_opts_config(const pgd_engine_opts *eo, pgd_engine_config *ec);

#endif
