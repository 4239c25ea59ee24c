/* Test tool: exposes sample/regex to tests/integration/test_regex.py.
 *   pgd_regex_tool PATTERN_HEX
 * compiles the pattern (its bytes in hexadecimal); exits 3 printing the compiler's message when
 * it is refused. Then reads lines of HEX text and prints one word a line: "match" (the text is a
 * whole match), "prefix" (some continuation makes one) or "dead".
 *   pgd_regex_tool mask MODEL_OR_VOCAB PATTERN_HEX
 * reads the same lines and prints, for each text that is a match or a prefix, how many tokens
 * of the vocabulary pgd_json_vocab_walk_dfa allows next, after checking its mask token by token
 * against the definition (the DFA fed the token's bytes stays alive); exits 1 at the first
 * difference. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sample/json_grammar.h"
#include "sample/regex.h"
#include "tokenizer/tokenizer.h"
#include "tool_hex.h"

int main(int argc, char **argv) {
    bool mask = argc == 4 && !strcmp(argv[1], "mask");
    if (argc != 2 && !mask) {
        fprintf(stderr, "usage: pgd_regex_tool [mask MODEL] PATTERN_HEX < lines of hex\n");
        return 2;
    }
    static char pat[2 * PGD_REGEX_MAX_LEN + 2], line[1 << 17], text[1 << 16];
    long pl = tool_unhex(argv[argc - 1], pat, sizeof pat);
    if (pl < 0) return 2;
    pgd_regex re;
    char msg[200];
    if (pgd_regex_compile(pat, (size_t)pl, &re, msg, sizeof msg)) {
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
    int rc = 0;
    while (fgets(line, sizeof line, stdin)) {
        long n = tool_unhex(line, text, sizeof text);
        if (n < 0) return 2;
        int32_t q = pgd_regex_feed(&re, 0, text, (size_t)n);
        if (!mask) {
            printf("%s\n", q < 0 ? "dead" : re.accept[q] ? "match" : "prefix");
            continue;
        }
        if (q < 0) continue;
        int32_t n_ok = pgd_json_vocab_walk_dfa(&v, &re, q, allow), count = 0;
        for (int32_t id = 0; id < v.n; id++) {
            bool want = !v.eog[id] && v.len[id] > 0 &&
                        pgd_regex_feed(&re, q, v.text[id], v.len[id]) >= 0;
            if (want != (allow[id] != 0)) {
                fprintf(stderr, "token %d: mask %d, definition %d\n", id, allow[id], want);
                rc = 1;
                break;
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
    pgd_regex_free(&re);
    return rc;
}
