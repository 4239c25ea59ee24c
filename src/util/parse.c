/* Option-value parsing shared by the CLI and the server configuration. */
#include "util/parse.h"

#include <errno.h>
#include <stdlib.h>
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
