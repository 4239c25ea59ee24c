/* Test tool: exposes sample/json_grammar to tests/integration/test_json_output.py.
 * Reads lines "MODE HEX" from stdin (MODE: o = the document must be an object, a = any value;
 * HEX: the document's bytes in hexadecimal, possibly empty) and prints one word a line:
 * "complete" (a whole JSON document), "prefix" (every byte accepted, the document not whole)
 * or "reject".
 *   pgd_json_tool schema SCHEMA.json
 * the same, each document held to the JSON Schema in SCHEMA.json (MODE ignored); exits 3 with
 * the compiler's message when the schema is refused.
 *   pgd_json_tool mask MODEL_OR_VOCAB [SCHEMA.json]
 * reads the same lines (MODE o, or the schema) and prints, for each document that is a prefix, how many tokens
 * of the vocabulary pgd_json_allowed allows next, after checking its mask token by token against
 * the definition (a copy of the state fed the token's bytes); exits 1 at the first difference. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sample/json_grammar.h"
#include "tokenizer/tokenizer.h"
#include "tool_hex.h"

static pgd_json_vocab g_vocab;
static uint8_t *g_allow;
static pgd_tokenizer *g_tok;

static int load_vocab(const char *path) {
    pgd_tokenizer *t;
    pgd_err err = {{0}};
    if (pgd_tokenizer_load_path(path, &t, &err)) {
        fprintf(stderr, "pgd_json_tool: %s\n", err.msg);
        return -1;
    }
    g_tok = t; /* stays loaded: the vocabulary's text borrows from it */
    g_allow = malloc((size_t)pgd_tokenizer_n_vocab(t));
    if (!g_allow) return -1;
    return pgd_json_vocab_build(&g_vocab, t, pgd_tokenizer_n_vocab(t)) ? -1 : 0;
}

/* The mask by its definition, compared with pgd_json_allowed's; prints the allowed count. */
static int check_mask(const pgd_json_state *st) {
    const pgd_json_vocab *v = &g_vocab;
    int32_t n_ok = pgd_json_allowed(st, &g_vocab, g_allow), want_n = 0;
    bool done = pgd_json_complete(st);
    for (int32_t id = 0; id < v->n; id++) {
        pgd_json_state t = *st;
        bool want = done ? v->eog[id]
                         : v->len[id] && !v->eog[id] && pgd_json_feed(&t, v->text[id], v->len[id]);
        want_n += want;
        if (want != (g_allow[id] != 0)) {
            fprintf(stderr, "pgd_json_tool: token %d (%.*s): mask %d, definition %d\n", id,
                    (int)v->len[id], v->text[id] ? v->text[id] : "", g_allow[id], want);
            return -1;
        }
    }
    if (want_n != n_ok) {
        fprintf(stderr, "pgd_json_tool: count %d, definition %d\n", n_ok, want_n);
        return -1;
    }
    printf("%d\n", n_ok);
    return 0;
}

static pgd_json_schema g_schema;
static bool g_has_schema;

static int load_schema(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    static char text[1 << 20];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    char msg[200];
    if (pgd_json_schema_compile(text, n, &g_schema, msg, sizeof msg)) {
        printf("refused: %s\n", msg);
        return 3;
    }
    g_has_schema = true;
    return 0;
}

int main(int argc, char **argv) {
    bool mask = argc >= 3 && !strcmp(argv[1], "mask");
    if (mask && load_vocab(argv[2])) return 1;
    const char *schema = mask && argc == 4 ? argv[3]
                         : argc == 3 && !strcmp(argv[1], "schema") ? argv[2] : NULL;
    int rc = schema ? load_schema(schema) : 0;
    if (rc) return rc;
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
            int hi = pgd_hex_digit(line[i]), lo = pgd_hex_digit(line[i + 1]);
            if (hi < 0 || lo < 0) {
                fprintf(stderr, "pgd_json_tool: bad hex\n");
                return 2;
            }
            doc[n++] = (char)(hi << 4 | lo);
        }
        pgd_json_state st;
        if (g_has_schema) pgd_json_init_schema(&st, &g_schema);
        else pgd_json_init(&st, line[0] == 'o');
        if (mask) {
            if (!pgd_json_feed(&st, doc, n)) puts("reject");
            else if (check_mask(&st)) return 1;
            fflush(stdout);
            continue;
        }
        const char *r = !pgd_json_feed(&st, doc, n)  ? "reject"
                        : pgd_json_complete(&st)    ? "complete"
                                                    : "prefix";
        puts(r);
        fflush(stdout);
    }
    free(line);
    free(doc);
    if (g_has_schema) pgd_json_schema_free(&g_schema);
    if (g_tok) {
        pgd_json_vocab_free(&g_vocab);
        free(g_allow);
        pgd_tokenizer_free(g_tok);
    }
    return 0;
}
