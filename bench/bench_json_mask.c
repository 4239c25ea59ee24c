/* Cost of the JSON output mask (not a test): pgd_json_allowed over a real vocabulary in the
 * states a JSON object passes through, free and then held to a small schema (a name, an integer
 * age, a colour out of an enum), median of REPS calls each, in microseconds and as the share of
 * the vocabulary allowed. Build (from the repo root, after cmake --build build):
 *   gcc -O2 -Isrc -Iinclude bench/bench_json_mask.c build/libpagoda.a -lcjson -lm -lpthread \
 *       -o /tmp/bench_json_mask
 *   /tmp/bench_json_mask MODEL_OR_VOCAB.gguf [REPS]
 * Figures in bench/RESULTS.md ("JSON output"). */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "sample/json_grammar.h"
#include "tokenizer/tokenizer.h"

int main(int argc, char **argv) {
    pgd_tokenizer *t;
    pgd_json_vocab v;
    uint8_t *allow;
    double *us;
    int reps, rc = bench_mask_setup("bench_json_mask", argc, argv, &t, &v, &allow, &us, &reps);
    if (rc) return rc;
    int32_t n = v.n;
    /* the states: the document so far (free, then under the schema) */
    static const char *const docs[] = {"", "{", "{\"name", "{\"name\"", "{\"name\": ",
                                       "{\"name\": \"Fel", "{\"age\": 1", "{\"a\": [1, 2",
                                       "{\"a\": {\"b\": tr", NULL,
                                       "", "{", "{\"na", "{\"name\": \"Fel",
                                       "{\"name\": \"Felix\", ", "{\"name\": \"Felix\", \"age\": 1",
                                       "{\"name\": \"Felix\", \"age\": 1, \"color\": \"bl"};
    static const char schema_text[] =
        "{\"type\": \"object\", \"properties\": {\"name\": {\"type\": \"string\", "
        "\"maxLength\": 32}, \"age\": {\"type\": \"integer\", \"minimum\": 0, \"maximum\": 30}, "
        "\"color\": {\"enum\": [\"black\", \"blue\", "
        "\"white\"]}}, \"required\": [\"name\", \"age\", \"color\"], "
        "\"additionalProperties\": false}";
    pgd_json_schema sc;
    char msg[200];
    if (pgd_json_schema_compile(schema_text, strlen(schema_text), &sc, msg, sizeof msg)) {
        fprintf(stderr, "bench_json_mask: %s\n", msg);
        return 1;
    }
    printf("vocab %d tokens (%s)\n%-48s %10s %10s\n", n, argv[1], "state", "us/call", "allowed");
    bool schema = false;
    for (size_t d = 0; d < sizeof docs / sizeof docs[0]; d++) {
        if (!docs[d]) {
            schema = true;
            printf("held to %s\n", schema_text);
            continue;
        }
        pgd_json_state st;
        if (schema) pgd_json_init_schema(&st, &sc);
        else pgd_json_init(&st, true);
        if (!pgd_json_feed(&st, docs[d], strlen(docs[d]))) return 1;
        int32_t k = 0;
        for (int r = 0; r < reps; r++) {
            double t0 = bench_now_us();
            k = pgd_json_allowed(&st, &v, allow);
            us[r] = bench_now_us() - t0;
        }
        qsort(us, (size_t)reps, sizeof *us, bench_cmp_d);
        char label[64];
        snprintf(label, sizeof label, "'%s'", docs[d]);
        printf("%-48s %10.1f %9.1f%%\n", label, us[reps / 2], 100.0 * k / n);
    }
    free(us);
    free(allow);
    pgd_json_vocab_free(&v);
    pgd_json_schema_free(&sc);
    pgd_tokenizer_free(t);
    return 0;
}
