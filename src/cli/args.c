/* Argument helpers shared by the subcommands; the engine and model options themselves are
 * util/options.h's table. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "model/model.h"
#include "util/options.h"

const char *pgd_cli_default_model(void) {
    const pgd_opt *o = pgd_opt_find(pgd_engine_opt_table, pgd_engine_opt_count, "model");
    const char *e = pgd_opt_env_value(o);
    return e ? e : o->dflt;
}

void pgd_cli_model_opts(const pgd_engine_opts *eo, pgd_model_opts *mo) {
    memset(mo, 0, sizeof *mo);
    mo->weights_f32 = eo->weights_f32;
    mo->n_ctx = eo->ctx;
    mo->tensor_parallel = eo->tensor_parallel_size;
    mo->load_format = eo->load_format && !strcmp(eo->load_format, "dummy") ? PGD_LOAD_DUMMY
                                                                            : PGD_LOAD_AUTO;
    mo->gpu_memory_utilization = eo->gpu_memory_utilization;
    if (eo->device) pgd_model_opts_set_device(mo, eo->device); /* the table checked the name */
}
int pgd_cli_parse_long(const char *s, long lo, long hi, long *out) {
    if (!s || !*s) return -1;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

int pgd_cli_parse_float(const char *s, float lo, float hi, float *out) {
    if (!s || !*s) return -1;
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || *end || !isfinite(v) || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

int pgd_cli_parse_ids(const char *s, int32_t **ids, size_t *n) {
    size_t cap = 16, cnt = 0;
    int32_t *a = malloc(cap * sizeof *a);
    if (!a) return -1;
    const char *p = s;
    for (;;) {
        while (*p == ' ' || *p == ',' || *p == '\t' || *p == '\n') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX) {
            free(a);
            return -1;
        }
        if (cnt == cap) {
            int32_t *na = realloc(a, cap * 2 * sizeof *a);
            if (!na) {
                free(a);
                return -1;
            }
            a = na;
            cap *= 2;
        }
        a[cnt++] = (int32_t)v;
        p = end;
    }
    *ids = a;
    *n = cnt;
    return 0;
}
