/* Option-value parsing shared by the CLI and the server configuration. */
#include "util/parse.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

int pgd_parse_size(const char *s, size_t *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || !(v >= 0)) return -1;
    double mul = 1;
    if (!strcasecmp(end, "kib") || !strcasecmp(end, "k") || !strcasecmp(end, "kb")) mul = 1024.0;
    else if (!strcasecmp(end, "mib") || !strcasecmp(end, "m") || !strcasecmp(end, "mb")) mul = 1048576.0;
    else if (!strcasecmp(end, "gib") || !strcasecmp(end, "g") || !strcasecmp(end, "gb")) mul = 1073741824.0;
    else if (*end) return -1;
    if (v * mul > 1e15) return -1;
    *out = (size_t)(v * mul);
    return 0;
}

char *pgd_join_option_values(int argc, char **argv, int *i) {
    size_t n = strlen(argv[*i]) + 1;
    int j = *i + 1;
    for (; j < argc && argv[j][0] != '-'; j++) n += strlen(argv[j]) + 1;
    char *joined = malloc(n);
    if (!joined) return NULL;
    strcpy(joined, argv[*i]);
    for (; *i + 1 < j; (*i)++) strcat(strcat(joined, ","), argv[*i + 1]);
    return joined;
}

int pgd_lora_name_check(const char *name, char *msg, size_t ml) {
    size_t n = strlen(name);
    for (const char *p = name; *p; p++)
        if ((unsigned char)*p <= 0x20 || *p == '"' || *p == '\\' || *p == 0x7f) {
            snprintf(msg, ml, "the name '%.200s' has a space, quote, backslash or control "
                     "character", name);
            return -1;
        }
    if (n == 0 || n > 200) {
        snprintf(msg, ml, "a LoRA adapter's name is 1 to 200 bytes");
        return -1;
    }
    return 0;
}

int pgd_parse_lora_modules(char *spec, const char *reserved, const char **names,
                           const char **paths, int max, int *n, char *msg, size_t ml) {
    *n = 0;
    char *save = NULL;
    for (char *m = strtok_r(spec, ",", &save); m; m = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(m, '=');
        if (!eq || eq == m || !eq[1]) {
            snprintf(msg, ml, "--lora-modules: '%.200s' is not NAME=DIR", m);
            return -1;
        }
        *eq = 0;
        char why[280];
        if (pgd_lora_name_check(m, why, sizeof why)) {
            snprintf(msg, ml, "--lora-modules: %s", why);
            return -1;
        }
        bool taken = reserved && !strcmp(m, reserved);
        for (int i = 0; i < *n; i++) taken |= !strcmp(m, names[i]);
        if (taken) {
            snprintf(msg, ml, "--lora-modules: the name '%.200s' is taken (by the model or "
                     "another adapter)", m);
            return -1;
        }
        if (*n == max) {
            snprintf(msg, ml, "--lora-modules: at most %d adapters", max);
            return -1;
        }
        names[*n] = m;
        paths[(*n)++] = eq + 1;
    }
    return 0;
}
