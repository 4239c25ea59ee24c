/* Test tool: exposes sample/grammar to tests/integration/test_grammar.py.
 *   pgd_grammar_tool GRAMMAR_FILE
 * compiles the grammar; exits 3 printing the compiler's message when it is refused. Then reads
 * lines of HEX text and prints one word a line: "match" (the text is a whole sentence of the
 * grammar; "match+" when longer ones start with it too), "prefix" (some continuation makes
 * one) or "dead".
 *   pgd_grammar_tool mask MODEL_OR_VOCAB GRAMMAR_FILE
 * reads the same lines and prints, for each text that is a match or a prefix, how many tokens
 * of the vocabulary pgd_grammar_allowed allows next, after checking its mask token by token
 * against the definition (the state fed the token's bytes stays alive); exits 1 at the first
 * difference. mask-drop: the same for pgd_grammar_allowed_drop_space, each token's bytes less
 * a leading space (a token of no bytes then refused).
 *   pgd_grammar_tool compile
 * reads lines of HEX grammar texts (a fuzzer's) and prints for each "refused: MESSAGE" or
 * "ok N", N the bytes of the grammar's own text that a state started at its root takes one at
 * a time before the first it refuses (so every grammar that compiles is also matched). */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sample/grammar.h"
#include "sample/json_grammar.h"
#include "tokenizer/tokenizer.h"
#include "tool_hex.h"

static int compile_many(void) {
    static char line[2 * PGD_GRAMMAR_MAX_LEN + 4], src[PGD_GRAMMAR_MAX_LEN + 2];
    pgd_grammar_scratch *sc = pgd_grammar_scratch_new(16);
    pgd_grammar_state st;
    if (!sc || pgd_grammar_state_init(&st)) return 2;
    while (fgets(line, sizeof line, stdin)) {
        long n = tool_unhex(line, src, sizeof src);
        if (n < 0) return 2;
        pgd_grammar g;
        char msg[300] = "";
        if (pgd_grammar_compile(src, (size_t)n, &g, msg, sizeof msg)) {
            printf("refused: %s\n", msg);
            continue;
        }
        pgd_grammar_state_start(&st, &g, sc);
        long k = 0;
        while (k < n && pgd_grammar_feed(&st, &g, sc, src + k, 1)) k++;
        printf("ok %ld\n", k);
        pgd_grammar_free(&g);
    }
    pgd_grammar_state_free(&st);
    pgd_grammar_scratch_free(sc);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 2 && !strcmp(argv[1], "compile")) return compile_many();
    bool drop = argc == 4 && !strcmp(argv[1], "mask-drop");
    bool mask = argc == 4 && (!strcmp(argv[1], "mask") || drop);
    if (argc != 2 && !mask) {
        fprintf(stderr, "usage: pgd_grammar_tool [mask MODEL] GRAMMAR_FILE < lines of hex\n");
        return 2;
    }
    static char src[PGD_GRAMMAR_MAX_LEN + 2], line[1 << 17], text[1 << 16];
    FILE *f = fopen(argv[argc - 1], "rb");
    if (!f) return 2;
    size_t sl = fread(src, 1, sizeof src, f);
    fclose(f);
    pgd_grammar g;
    char msg[300];
    if (pgd_grammar_compile(src, sl, &g, msg, sizeof msg)) {
        printf("%s\n", msg);
        return 3;
    }
    pgd_json_vocab v = {0};
    pgd_tokenizer *tok = NULL;
    uint8_t *allow = NULL;
    if (mask) {
        pgd_err err = {0};
        if (pgd_tokenizer_load_path(argv[2], &tok, &err) ||
            pgd_json_vocab_build(&v, tok, pgd_tokenizer_n_vocab(tok)) ||
            !(allow = malloc((size_t)v.n))) {
            fprintf(stderr, "%s: cannot load the vocabulary\n", argv[2]);
            return 2;
        }
    }
    pgd_grammar_scratch *sc = pgd_grammar_scratch_new(mask ? v.max_len : 16);
    pgd_grammar_state st0, st, t;
    if (!sc || pgd_grammar_state_init(&st0) || pgd_grammar_state_init(&st) ||
        pgd_grammar_state_init(&t))
        return 2;
    pgd_grammar_state_start(&st0, &g, sc);
    int rc = 0;
    while (fgets(line, sizeof line, stdin)) {
        long n = tool_unhex(line, text, sizeof text);
        if (n < 0) return 2;
        /* then fed the text a byte at a time: every cut of a character */
        pgd_grammar_state_assign(&st, &st0);
        bool alive = true;
        for (long i = 0; i < n && alive; i++) alive = pgd_grammar_feed(&st, &g, sc, text + i, 1);
        if (!mask) {
            printf("%s\n", !alive ? "dead"
                           : pgd_grammar_complete(&st) ? (pgd_grammar_extends(&st) ? "match+"
                                                                                   : "match")
                                                       : "prefix");
            continue;
        }
        if (!alive) continue;
        int32_t n_ok = drop ? pgd_grammar_allowed_drop_space(&st, &g, sc, &v, allow)
                            : pgd_grammar_allowed(&st, &g, sc, &v, allow);
        int32_t count = 0;
        for (int32_t id = 0; id < v.n && !rc; id++) {
            bool want = false;
            const char *tt = v.text[id];
            size_t tl = (size_t)v.len[id];
            if (drop && tl > 0 && tt[0] == ' ') tt++, tl--;
            if (!v.eog[id] && tl > 0) {
                pgd_grammar_state_assign(&t, &st);
                want = pgd_grammar_feed(&t, &g, sc, tt, tl);
            }
            if (want != (allow[id] != 0)) {
                fprintf(stderr, "token %d: mask %d, definition %d\n", id, allow[id], want);
                rc = 1;
            }
            count += want;
        }
        if (rc) break;
        if (count != n_ok) {
            fprintf(stderr, "count %d != %d\n", n_ok, count);
            rc = 1;
            break;
        }
        printf("%d\n", n_ok);
    }
    free(allow);
    if (mask) pgd_json_vocab_free(&v);
    if (tok) pgd_tokenizer_free(tok);
    pgd_grammar_state_free(&st0);
    pgd_grammar_state_free(&st);
    pgd_grammar_state_free(&t);
    pgd_grammar_scratch_free(sc);
    pgd_grammar_free(&g);
    return rc;
}
