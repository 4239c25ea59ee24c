/* Cost of GBNF grammar output (not a test): for each grammar, pgd_grammar_compile (once per
 * request) and pgd_grammar_allowed (the mask before every sample) at the states after a few
 * prefixes, beside the baselines that constrain the same language another way: the hand-written
 * JSON machine (pgd_json_allowed, response_format json_object) for llama.cpp's json.gbnf, and the
 * regex DFA (pgd_json_vocab_walk_dfa, guided_regex) for the regular ones. Medians of REPS calls,
 * in microseconds, with the share of the vocabulary allowed. Build (from the repo root, after
 * cmake --build build):
 *   gcc -O2 -Isrc -Iinclude bench/bench_grammar_mask.c build/libpagoda.a -lcjson -lm -lpthread \
 *       -o /tmp/bench_grammar_mask
 *   /tmp/bench_grammar_mask MODEL_OR_VOCAB.gguf [REPS]      (from the repo root)
 * Figures in bench/RESULTS.md ("GBNF grammars"). */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "sample/grammar.h"
#include "sample/json_grammar.h"
#include "sample/regex.h"
#include "tokenizer/tokenizer.h"

/* llama.cpp's grammars/json.gbnf (tests/data/README.md), read by main */
static char JSON_GBNF[8192];

static const struct {
    const char *name, *grammar, *regex; /* regex: the same language, or NULL */
    const char *prefixes[3];
} cases[] = {
    {"json.gbnf", JSON_GBNF, NULL, {"", "{\"name\": \"Ad", "{\"a\": [1, 2.5"}},
    {"date", "root ::= [0-9]{4} \"-\" [0-9]{2} \"-\" [0-9]{2}", "[0-9]{4}-[0-9]{2}-[0-9]{2}",
     {"", "2024-0", "2024-01-3"}},
    {"choice", "root ::= \"yes\" | \"no\" | \"maybe\"", "(yes|no|maybe)", {"", "ma", "n"}},
    {"list", "root ::= item+\nitem ::= \"- \" [^\\n]+ \"\\n\"", "(- [^\\n]+\\n)+",
     {"", "- eggs", "- eggs\n- mi"}},
    {"arithmetic",
     "root ::= expr\nexpr ::= term ((\"+\" | \"-\") term)*\nterm ::= factor ((\"*\" | \"/\") "
     "factor)*\nfactor ::= number | \"(\" expr \")\" | \"-\" factor\nnumber ::= [0-9]+ (\".\" "
     "[0-9]+)?",
     NULL, {"", "(1+2", "((3*4)-"}},
    /* hundreds of stacks over a broad class: the mask stops at PGD_GRAMMAR_MAX_WORK */
    {"ambiguous", "root ::= x{0,30} [^\\n]*\nx ::= [^\\n]{0,30}", NULL,
     {"", "abc", "abcdefgh"}},
};

int main(int argc, char **argv) {
    pgd_tokenizer *t;
    pgd_json_vocab v;
    uint8_t *allow;
    double *us;
    int reps, rc = bench_mask_setup("bench_grammar_mask", argc, argv, &t, &v, &allow, &us, &reps);
    if (rc) return rc;
    FILE *f = fopen("tests/data/grammars/json.gbnf", "rb");
    size_t jl = f ? fread(JSON_GBNF, 1, sizeof JSON_GBNF - 1, f) : 0;
    if (f) fclose(f);
    if (jl == 0) {
        fprintf(stderr, "tests/data/grammars/json.gbnf: cannot read it (run from the repo root)\n");
        return 1;
    }
    int32_t n = v.n;
    pgd_grammar_scratch *sc = pgd_grammar_scratch_new(v.max_len);
    pgd_grammar_state st;
    if (!sc || pgd_grammar_state_init(&st)) return 1;
    printf("vocabulary %s: %d tokens; medians of %d calls, microseconds\n", argv[1], n, reps);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        pgd_grammar g;
        char msg[300];
        for (int r = 0; r < reps; r++) {
            double t0 = bench_now_us();
            if (pgd_grammar_compile(cases[c].grammar, strlen(cases[c].grammar), &g, msg,
                                    sizeof msg)) {
                fprintf(stderr, "%s: %s\n", cases[c].name, msg);
                return 1;
            }
            us[r] = bench_now_us() - t0;
            if (r + 1 < reps) pgd_grammar_free(&g);
        }
        printf("%-10s compile %.1f (%d rules, %d elements)\n", cases[c].name,
               bench_median(us, reps), g.n_rules, g.n_el);
        pgd_regex re;
        bool has_re = cases[c].regex &&
                      !pgd_regex_compile(cases[c].regex, strlen(cases[c].regex), &re, msg,
                                         sizeof msg);
        for (int k = 0; k < 3; k++) {
            const char *p = cases[c].prefixes[k];
            pgd_grammar_state_start(&st, &g, sc);
            if (!pgd_grammar_feed(&st, &g, sc, p, strlen(p))) {
                printf("  \"%s\": dead\n", p);
                continue;
            }
            int32_t n_ok = 0;
            for (int r = 0; r < reps; r++) {
                double t0 = bench_now_us();
                n_ok = pgd_grammar_allowed(&st, &g, sc, &v, allow);
                us[r] = bench_now_us() - t0;
            }
            if (n_ok < 0)
                printf("  \"%s\": grammar %.1f (past the work limit, %d stacks)", p,
                       bench_median(us, reps), st.n_top);
            else
                printf("  \"%s\": grammar %.1f (%.1f%%, %d stacks)", p, bench_median(us, reps),
                       100.0 * n_ok / n, st.n_top);
            if (has_re) {
                int32_t q = pgd_regex_feed(&re, 0, p, strlen(p));
                for (int r = 0; r < reps && q >= 0; r++) {
                    double t0 = bench_now_us();
                    n_ok = pgd_json_vocab_walk_dfa(&v, &re, q, allow);
                    us[r] = bench_now_us() - t0;
                }
                printf(" | regex %.1f (%.1f%%)", bench_median(us, reps), 100.0 * n_ok / n);
            }
            if (cases[c].grammar == JSON_GBNF) {
                pgd_json_state js;
                pgd_json_init(&js, true);
                if (pgd_json_feed(&js, p, strlen(p))) {
                    for (int r = 0; r < reps; r++) {
                        double t0 = bench_now_us();
                        n_ok = pgd_json_allowed(&js, &v, allow);
                        us[r] = bench_now_us() - t0;
                    }
                    printf(" | json_object %.1f (%.1f%%)", bench_median(us, reps),
                           100.0 * n_ok / n);
                }
            }
            printf("\n");
        }
        if (has_re) pgd_regex_free(&re);
        pgd_grammar_free(&g);
    }
    pgd_grammar_state_free(&st);
    pgd_grammar_scratch_free(sc);
    pgd_json_vocab_free(&v);
    pgd_tokenizer_free(t);
    free(allow);
    free(us);
    return 0;
}
