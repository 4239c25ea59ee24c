/* Cost of regular-expression output (not a test): for each pattern, pgd_regex_compile (the DFA a
 * guided_regex request builds once) and pgd_json_vocab_walk_dfa (the mask before every sample)
 * at the states after a few prefixes; then the JSON mask inside a string held to a `pattern`
 * (where the plain-token fast path is off). Medians of REPS calls, in microseconds, with the
 * share of the vocabulary allowed. Build (from the repo root, after cmake --build build):
 *   gcc -O2 -Isrc -Iinclude bench/bench_regex_mask.c build/libpagoda.a -lcjson -lm -lpthread \
 *       -o /tmp/bench_regex_mask
 *   /tmp/bench_regex_mask MODEL_OR_VOCAB.gguf [REPS]
 * Figures in bench/RESULTS.md ("Regular expressions"). */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "sample/json_grammar.h"
#include "sample/regex.h"
#include "tokenizer/tokenizer.h"

int main(int argc, char **argv) {
    pgd_tokenizer *t;
    pgd_json_vocab v;
    uint8_t *allow;
    double *us;
    int reps, rc = bench_mask_setup("bench_regex_mask", argc, argv, &t, &v, &allow, &us, &reps);
    if (rc) return rc;
    int32_t n = v.n;
    static const struct { const char *pattern, *prefixes[3]; } cases[] = {
        {"\\d{4}-\\d{2}-\\d{2}", {"", "2024-0", "2024-01-3"}},
        {"(yes|no|maybe)", {"", "ma", "yes"}},
        {"\\(\\d{3}\\) \\d{3}-\\d{4}", {"", "(555) 1", "(555) 123-456"}},
        {"[a-z0-9._%+-]+@[a-z0-9.-]+\\.[a-z]{2,4}", {"", "john.doe", "john@example.c"}},
        {"[A-Z][a-z]+( [A-Z][a-z]+){0,3}", {"", "New", "New York Ci"}},
        {"[^\\n]{0,200}", {"", "Once upon a time", "a"}},
        {"(a|b)*a(a|b){8}", {"", "ab", "abba"}},
    };
    printf("vocabulary %s: %d tokens; medians of %d calls, microseconds\n", argv[1], n, reps);
    printf("%-42s %8s %6s | mask after each prefix (share allowed)\n", "pattern", "compile",
           "states");
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        pgd_regex re;
        char msg[200];
        for (int r = 0; r < reps; r++) {
            double t0 = bench_now_us();
            if (pgd_regex_compile(cases[c].pattern, strlen(cases[c].pattern), &re, msg,
                                  sizeof msg)) {
                fprintf(stderr, "%s: %s\n", cases[c].pattern, msg);
                return 1;
            }
            us[r] = bench_now_us() - t0;
            if (r + 1 < reps) pgd_regex_free(&re);
        }
        printf("%-42s %8.1f %6d |", cases[c].pattern, bench_median(us, reps), re.n_states);
        for (int k = 0; k < 3; k++) {
            const char *p = cases[c].prefixes[k];
            int32_t q = pgd_regex_feed(&re, 0, p, strlen(p));
            if (q < 0) {
                printf(" [dead]");
                continue;
            }
            int32_t n_ok = 0;
            for (int r = 0; r < reps; r++) {
                double t0 = bench_now_us();
                n_ok = pgd_json_vocab_walk_dfa(&v, &re, q, allow);
                us[r] = bench_now_us() - t0;
            }
            printf(" \"%s\": %.1f (%.1f%%)", p, bench_median(us, reps), 100.0 * n_ok / n);
        }
        printf("\n");
        pgd_regex_free(&re);
    }
    /* a JSON string held to a pattern: the trie walk with JSON states */
    static const char *const schemas[] = {
        "{\"type\":\"object\",\"properties\":{\"d\":{\"type\":\"string\","
        "\"pattern\":\"^\\\\d{4}-\\\\d{2}-\\\\d{2}$\"}},\"required\":[\"d\"]}",
        "{\"type\":\"object\",\"properties\":{\"d\":{\"type\":\"string\","
        "\"pattern\":\"[^\\\\n]*\",\"maxLength\":200}},\"required\":[\"d\"]}",
        "{\"type\":\"object\",\"properties\":{\"d\":{\"type\":\"string\","
        "\"maxLength\":200}},\"required\":[\"d\"]}"};
    static const char *const names[] = {"date pattern", "[^\\n]* pattern, maxLength 200",
                                        "maxLength 200, no pattern"};
    for (int s = 0; s < 3; s++) {
        pgd_json_schema sc;
        char msg[200];
        if (pgd_json_schema_compile(schemas[s], strlen(schemas[s]), &sc, msg, sizeof msg)) {
            fprintf(stderr, "schema: %s\n", msg);
            return 1;
        }
        pgd_json_state st;
        pgd_json_init_schema(&st, &sc);
        const char *doc = "{\"d\": \"2024-0";
        if (!pgd_json_feed(&st, doc, strlen(doc))) return 1;
        int32_t n_ok = 0;
        for (int r = 0; r < reps; r++) {
            double t0 = bench_now_us();
            n_ok = pgd_json_allowed(&st, &v, allow);
            us[r] = bench_now_us() - t0;
        }
        printf("JSON, %-34s at %s: %.1f us (%.1f%%)\n", names[s], doc, bench_median(us, reps),
               100.0 * n_ok / n);
        pgd_json_schema_free(&sc);
    }
    pgd_json_vocab_free(&v);
    pgd_tokenizer_free(t);
    free(allow);
    free(us);
    return 0;
}
