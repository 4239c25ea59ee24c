/* Argument helpers shared by the subcommands. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

const char *pgd_cli_default_model(void) {
    const char *e = getenv("PAGODA_MODEL");
    return e && *e ? e : "models/SmolLM2-135M-Instruct.Q4_1.gguf";
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

int pgd_cli_parse_load_format(const char *cmd, const char *s, bool *dummy) {
    if (!strcmp(s, "auto") || !strcmp(s, "dummy")) {
        *dummy = !strcmp(s, "dummy");
        return 0;
    }
    fprintf(stderr, "%s: invalid value '%s' for --load-format (auto or dummy)\n", cmd, s);
    return -1;
}

int pgd_cli_parse_kv_dtype(const char *s, pgd_kv_dtype *out) {
    if (!strcmp(s, "f32")) *out = PGD_KV_F32;
    else if (!strcmp(s, "f16")) *out = PGD_KV_F16;
    else if (!strcmp(s, "bf16")) *out = PGD_KV_BF16;
    else return -1;
    return 0;
}

int pgd_cli_parse_gpu_util(const char *cmd, const char *s, float *out) {
    float v;
    if (pgd_cli_parse_float(s, 0, 1, &v) || !(v > 0)) {
        fprintf(stderr, "%s: invalid value '%s' for --gpu-memory-utilization (a fraction, "
                        "0 < F <= 1)\n", cmd, s);
        return -1;
    }
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
