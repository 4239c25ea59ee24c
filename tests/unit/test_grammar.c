/* sample/grammar beyond what tests/integration/test_grammar.py checks against xgrammar:
 * - pgd_grammar_copy (the server compiles once per request, the engine copies into each choice)
 *   accepts byte for byte what a fresh compile accepts, after the original is freed; when any
 *   allocation of a copy or a compile fails it returns PGD_ENOMEM, leaving the original whole
 *   and nothing leaked (the ASan build's LSan checks). This binary links with --wrap=malloc.
 * - state keys (the engine's mask memo): inside free text every character comes back to the
 *   same key, and states that allow different bytes have different keys.
 * - the mask's work limit: a walk past PGD_GRAMMAR_MAX_WORK returns -1 with nothing allowed,
 *   while the same state's bytes are still fed exactly. */
#include <stdlib.h>
#include <string.h>

#include "sample/grammar.h"
#include "sample/json_grammar.h"
#include "tokenizer/tokenizer.h"
#include "util/status.h"
#include "test.h"
#include "test_oom.h"

/* llama.cpp's grammars/json.gbnf (tests/data/README.md), read by main */
static char JSON_GBNF[8192];

static const char *DOCS[] = {
    "{\"a\": [1, -2.5e3, true, null], \"b\": {\"c\": \"\\u00e9 \\n x\"}}",
    "{\"a\": [1, 2,]}",       /* dead at ']' */
    "{\"s\": \"caf\xc3\xa9\"}", /* a two-byte character */
    "{\"a\": 01}",            /* dead at '1' */
    "{\"a\": \"x\"",          /* a prefix */
};

/* A word per byte of doc: 'd' dead from here, 'p' alive, 'm' a whole sentence. */
static void trace(const pgd_grammar *g, pgd_grammar_scratch *sc, pgd_grammar_state *st,
                  const char *doc, char *out) {
    pgd_grammar_state_start(st, g, sc);
    size_t n = strlen(doc), i = 0;
    for (; i < n && pgd_grammar_feed(st, g, sc, doc + i, 1); i++)
        out[i] = pgd_grammar_complete(st) ? 'm' : 'p';
    for (; i < n; i++) out[i] = 'd';
    out[n] = 0;
}

static void test_copy(pgd_grammar_scratch *sc, pgd_grammar_state *st) {
    char msg[300], want[128], got[128];
    pgd_grammar g, fresh, c;
    CHECK(pgd_grammar_compile(JSON_GBNF, strlen(JSON_GBNF), &g, msg, sizeof msg) == PGD_OK);
    CHECK(pgd_grammar_compile(JSON_GBNF, strlen(JSON_GBNF), &fresh, msg, sizeof msg) == PGD_OK);
    /* every allocation of a copy failing in turn: ENOMEM, the original untouched */
    long k = 0;
    for (;; k++) {
        test_malloc_fail_at(k);
        int rc = pgd_grammar_copy(&c, &g);
        test_malloc_fail_at(-1);
        if (rc == PGD_OK) break;
        CHECK_EQ_INT(rc, PGD_ENOMEM);
    }
    CHECK(k == 6); /* the six arrays */
    pgd_grammar_free(&g);
    for (size_t d = 0; d < sizeof DOCS / sizeof DOCS[0]; d++) {
        trace(&fresh, sc, st, DOCS[d], want);
        trace(&c, sc, st, DOCS[d], got);
        CHECK(!strcmp(want, got));
    }
    trace(&c, sc, st, DOCS[0], got);
    CHECK(got[strlen(got) - 1] == 'm');
    CHECK(strchr(got, 'd') == NULL);
    trace(&c, sc, st, DOCS[1], got);
    CHECK(!strcmp(got + strlen(got) - 2, "dd"));
    trace(&c, sc, st, DOCS[4], got);
    CHECK(strchr(got, 'm') == NULL && strchr(got, 'd') == NULL);
    pgd_grammar_free(&c);
    /* a compile whose allocations fail in turn: ENOMEM, never a crash or a leak */
    for (k = 0;; k++) {
        test_malloc_fail_at(k);
        int rc = pgd_grammar_compile(JSON_GBNF, strlen(JSON_GBNF), &c, msg, sizeof msg);
        test_malloc_fail_at(-1);
        if (rc == PGD_OK) break;
        CHECK_EQ_INT(rc, PGD_ENOMEM);
    }
    CHECK(k > 10);
    pgd_grammar_free(&c);
    pgd_grammar_free(&fresh);
}

static void key_after(const pgd_grammar *g, pgd_grammar_scratch *sc, pgd_grammar_state *st,
                      const char *text, pgd_grammar_key *k) {
    pgd_grammar_state_start(st, g, sc);
    CHECK(pgd_grammar_feed(st, g, sc, text, strlen(text)));
    pgd_grammar_state_key(st, k);
}

static void test_keys(pgd_grammar_scratch *sc, pgd_grammar_state *st) {
    char msg[300];
    pgd_grammar g;
    static pgd_grammar_key a, b, c, d;
    CHECK(pgd_grammar_compile(JSON_GBNF, strlen(JSON_GBNF), &g, msg, sizeof msg) == PGD_OK);
    key_after(&g, sc, st, "{\"name\": \"A", &a);
    key_after(&g, sc, st, "{\"name\": \"Ada Lovelace, caf\xc3\xa9", &b);
    key_after(&g, sc, st, "{\"name\": \"A\\n\\u00e9", &c);
    CHECK(a.n > 0 && pgd_grammar_key_equal(&a, &b) && pgd_grammar_key_equal(&a, &c));
    key_after(&g, sc, st, "{\"name\": \"caf\xc3", &d); /* a cut character: its own state */
    CHECK(!pgd_grammar_key_equal(&a, &d));
    key_after(&g, sc, st, "{\"x\": {\"name\": \"A", &d); /* one level deeper: not the same */
    CHECK(!pgd_grammar_key_equal(&a, &d));
    key_after(&g, sc, st, "{\"name\": ", &d);
    CHECK(!pgd_grammar_key_equal(&a, &d));
    pgd_grammar_free(&g);
    const char *list = "root ::= item+\nitem ::= \"- \" [^\\n]+ \"\\n\"";
    CHECK(pgd_grammar_compile(list, strlen(list), &g, msg, sizeof msg) == PGD_OK);
    key_after(&g, sc, st, "- e", &a); /* the first item: root's own */
    key_after(&g, sc, st, "- eggs", &b);
    CHECK(a.n > 0 && pgd_grammar_key_equal(&a, &b));
    key_after(&g, sc, st, "- eggs\n- m", &a); /* the later ones: the repetition's */
    key_after(&g, sc, st, "- eggs\n- milk\n- jam and honey", &b);
    CHECK(a.n > 0 && pgd_grammar_key_equal(&a, &b));
    pgd_grammar_free(&g);
}

static void test_work_limit(void) {
    pgd_tokenizer *t = NULL;
    pgd_err err = {{0}};
    pgd_json_vocab v = {0};
    if (pgd_tokenizer_load_path("tests/data/vocab/ggml-vocab-llama-spm.gguf", &t, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        CHECK(0);
        return;
    }
    CHECK(pgd_json_vocab_build(&v, t, pgd_tokenizer_n_vocab(t)) == PGD_OK);
    uint8_t *allow = malloc((size_t)v.n);
    pgd_grammar_scratch *sc = pgd_grammar_scratch_new(v.max_len);
    pgd_grammar_state st;
    CHECK(allow && sc && pgd_grammar_state_init(&st) == PGD_OK);
    char msg[300];
    pgd_grammar g;
    const char *amb = "root ::= x{0,30} [^\\n]*\nx ::= [^\\n]{0,30}";
    CHECK(pgd_grammar_compile(amb, strlen(amb), &g, msg, sizeof msg) == PGD_OK);
    pgd_grammar_state_start(&st, &g, sc);
    CHECK(pgd_grammar_feed(&st, &g, sc, "abcdefgh", 8));
    CHECK(st.n_top > 100);
    CHECK_EQ_INT(pgd_grammar_allowed(&st, &g, sc, &v, allow), -1);
    int32_t n_allowed = 0;
    for (int32_t i = 0; i < v.n; i++) n_allowed += allow[i];
    CHECK_EQ_INT(n_allowed, 0);
    CHECK(pgd_grammar_feed(&st, &g, sc, "ij", 2) && pgd_grammar_complete(&st));
    CHECK(!pgd_grammar_feed(&st, &g, sc, "\n", 1));
    pgd_grammar_free(&g);
    /* the same vocabulary under a plain grammar: a walk within the limit */
    const char *plain = "root ::= [^\\n]*";
    CHECK(pgd_grammar_compile(plain, strlen(plain), &g, msg, sizeof msg) == PGD_OK);
    pgd_grammar_state_start(&st, &g, sc);
    CHECK(pgd_grammar_allowed(&st, &g, sc, &v, allow) > v.n / 2);
    pgd_grammar_free(&g);
    pgd_grammar_state_free(&st);
    pgd_grammar_scratch_free(sc);
    free(allow);
    pgd_json_vocab_free(&v);
    pgd_tokenizer_free(t);
}

int main(void) {
    FILE *f = fopen("tests/data/grammars/json.gbnf", "rb");
    size_t n = f ? fread(JSON_GBNF, 1, sizeof JSON_GBNF - 1, f) : 0;
    if (f) fclose(f);
    if (n == 0) {
        fprintf(stderr, "tests/data/grammars/json.gbnf: cannot read it\n");
        return 1;
    }
    pgd_grammar_scratch *sc = pgd_grammar_scratch_new(64);
    pgd_grammar_state st;
    CHECK(sc && pgd_grammar_state_init(&st) == PGD_OK);
    test_copy(sc, &st);
    test_keys(sc, &st);
    pgd_grammar_state_free(&st);
    pgd_grammar_scratch_free(sc);
    test_work_limit();
    return test_report("test_grammar");
}
