/* Test tool: exposes sample/json_grammar to tests/integration/test_json_output.py.
 * Reads lines "MODE HEX" from stdin (MODE: o = the document must be an object, a = any value;
 * HEX: the document's bytes in hexadecimal, possibly empty) and prints one word a line:
 * "complete" (a whole JSON document), "prefix" (every byte accepted, the document not whole)
 * or "reject". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sample/json_grammar.h"

static int hexval(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

int main(void) {
    size_t cap = 1 << 20;
    char *line = malloc(cap), *doc = malloc(cap / 2);
    if (!line || !doc) return 1;
    while (fgets(line, (int)cap, stdin)) {
        size_t l = strcspn(line, "\r\n"), n = 0;
        if (l < 2 || (line[0] != 'o' && line[0] != 'a') || line[1] != ' ') {
            fprintf(stderr, "pgd_json_tool: bad line\n");
            return 2;
        }
        for (size_t i = 2; i + 1 < l; i += 2) {
            int hi = hexval(line[i]), lo = hexval(line[i + 1]);
            if (hi < 0 || lo < 0) {
                fprintf(stderr, "pgd_json_tool: bad hex\n");
                return 2;
            }
            doc[n++] = (char)(hi << 4 | lo);
        }
        pgd_json_state st;
        pgd_json_init(&st, line[0] == 'o');
        const char *r = !pgd_json_feed(&st, doc, n)  ? "reject"
                        : pgd_json_complete(&st)    ? "complete"
                                                    : "prefix";
        puts(r);
        fflush(stdout);
    }
    free(line);
    free(doc);
    return 0;
}
