/* The output-constraint interface (sample/constraint.h) over a toy vocabulary: each kind's mask,
 * drop-space mask and accept through the ops table; the regex's and grammar's masks equal the
 * walks they memoize, hit or miss; the shared mask memo's keys and eviction; the constructors'
 * error lines; the think-first wrapper (free while thinking, the end tag found across tokens). */
#include <stdlib.h>
#include <string.h>

#include "sample/constraint.h"
#include "util/status.h"
#include "test.h"

enum { EOS, A, B, AB, SP_A, LBRACE, RBRACE, SP, C, N_TOK };
static const char *const texts[N_TOK] = {NULL, "a", "b", "ab", " a", "{", "}", " ", "c"};

static pgd_json_vocab vocab;
static int32_t eog_ids[1] = {EOS};
static pgd_grammar_key gr_key;
static pgd_constraint_env env;

static void setup(void) {
    vocab.n = N_TOK;
    vocab.text = malloc(N_TOK * sizeof *vocab.text);
    vocab.len = malloc(N_TOK * sizeof *vocab.len);
    vocab.eog = calloc(N_TOK, 1);
    for (int i = 0; i < N_TOK; i++) {
        vocab.text[i] = texts[i];
        vocab.len[i] = texts[i] ? (uint32_t)strlen(texts[i]) : 0;
    }
    vocab.eog[EOS] = 1;
    CHECK(pgd_json_vocab_index(&vocab) == PGD_OK);
    env = (pgd_constraint_env){.vocab = &vocab, .eog = eog_ids, .n_eog = 1, .n_vocab = N_TOK,
                               .gr_scratch = pgd_grammar_scratch_new(vocab.max_len),
                               .gr_key = &gr_key};
    CHECK(env.gr_scratch != NULL);
}

/* The mask as a bit string, token 0 first: "0110..." */
static const char *bits(const uint8_t *a) {
    static char s[N_TOK + 1];
    for (int i = 0; i < N_TOK; i++) s[i] = a[i] ? '1' : '0';
    s[N_TOK] = 0;
    return s;
}

static pgd_constraint_step take(pgd_constraint *c, int32_t id) {
    return pgd_constraint_accept(c, &env, id, texts[id] ? texts[id] : "", vocab.len[id]);
}

static void test_choice(void) {
    const char *const ch[] = {"ab", "b"};
    pgd_constraint *c;
    uint8_t a[N_TOK];
    CHECK(pgd_constraint_choice_new(ch, 2, &c) == PGD_OK);
    CHECK(pgd_constraint_mask(c, &env, a) == 0);
    CHECK(!strcmp(bits(a), "011100000"));          /* a, b, ab */
    CHECK(pgd_constraint_mask_drop_space(c, &env, a) == 0);
    CHECK(!strcmp(bits(a), "011110000"));          /* " a" read as "a"; " " alone refused */
    CHECK_EQ_INT(take(c, A), PGD_CONSTRAINT_MORE);
    CHECK(pgd_constraint_mask(c, &env, a) == 0);
    CHECK(!strcmp(bits(a), "001000000"));
    CHECK_EQ_INT(take(c, B), PGD_CONSTRAINT_DONE); /* "ab": no choice goes on */
    pgd_constraint_free(c);

    const char *const ch2[] = {"a", "ab"};
    CHECK(pgd_constraint_choice_new(ch2, 2, &c) == PGD_OK);
    CHECK_EQ_INT(take(c, A), PGD_CONSTRAINT_MORE);
    CHECK(pgd_constraint_mask(c, &env, a) == 0);
    CHECK(!strcmp(bits(a), "101000000"));          /* the end (a choice already) or b */
    CHECK_EQ_INT(take(c, EOS), PGD_CONSTRAINT_DONE);
    pgd_constraint_free(c);

    CHECK(pgd_constraint_choice_new(ch2, 2, &c) == PGD_OK);
    CHECK_EQ_INT(take(c, C), PGD_CONSTRAINT_REFUSED);
    pgd_constraint_free(c);
}

static void test_regex(void) {
    pgd_constraint *c;
    char why[256];
    uint8_t a[N_TOK], want[N_TOK];
    CHECK(pgd_constraint_regex_new("a+b", NULL, N_TOK, &c, why, sizeof why) == PGD_OK);
    pgd_regex re;
    char msg[200];
    CHECK(pgd_regex_compile("a+b", 3, &re, msg, sizeof msg) == PGD_OK);
    for (int round = 0; round < 2; round++) { /* a miss, then the memo's hit */
        memset(a, 7, sizeof a);
        CHECK(pgd_constraint_mask(c, &env, a) == 0);
        memset(want, 7, sizeof want);
        pgd_json_vocab_walk_dfa(&vocab, &re, 0, want);
        CHECK(!memcmp(a, want, sizeof a));
        CHECK(!strcmp(bits(a), "010100000"));      /* a, ab */
    }
    CHECK(pgd_constraint_mask_drop_space(c, &env, a) == 0);
    CHECK(!strcmp(bits(a), "010110000"));
    CHECK_EQ_INT(take(c, A), PGD_CONSTRAINT_MORE);
    CHECK(pgd_constraint_mask(c, &env, a) == 0);
    CHECK(!strcmp(bits(a), "011100000"));
    CHECK_EQ_INT(take(c, C), PGD_CONSTRAINT_REFUSED);
    CHECK_EQ_INT(take(c, B), PGD_CONSTRAINT_DONE); /* a match no byte extends */
    pgd_regex_free(&re);
    pgd_constraint_free(c);

    CHECK(pgd_constraint_regex_new("a*", NULL, N_TOK, &c, why, sizeof why) == PGD_OK);
    CHECK(pgd_constraint_mask(c, &env, a) == 0);
    CHECK(!strcmp(bits(a), "110000000"));          /* the empty match may end */
    CHECK_EQ_INT(take(c, EOS), PGD_CONSTRAINT_DONE);
    pgd_constraint_free(c);

    CHECK(pgd_constraint_regex_new("(", NULL, N_TOK, &c, why, sizeof why) < 0);
    CHECK(c == NULL && !strncmp(why, "regular expression: ", 20));
}

static void test_grammar(void) {
    pgd_constraint *c;
    char why[256];
    uint8_t a[N_TOK];
    CHECK(pgd_constraint_grammar_new("root ::= \"a\"+ \"b\"?", NULL, N_TOK, &c, why,
                                     sizeof why) == PGD_OK);
    pgd_constraint_start(c, env.gr_scratch);
    CHECK(pgd_constraint_mask(c, &env, a) == 0);
    CHECK(!strcmp(bits(a), "010100000"));
    CHECK(pgd_constraint_mask_drop_space(c, &env, a) == 0);
    CHECK(!strcmp(bits(a), "010110000"));
    CHECK_EQ_INT(take(c, A), PGD_CONSTRAINT_MORE);
    for (int round = 0; round < 2; round++) { /* a miss, then the memo's hit */
        CHECK(pgd_constraint_mask(c, &env, a) == 0);
        CHECK(!strcmp(bits(a), "111100000"));      /* complete: the end too */
    }
    CHECK_EQ_INT(take(c, A), PGD_CONSTRAINT_MORE);
    CHECK(pgd_constraint_mask(c, &env, a) == 0);   /* the same state: memoized */
    CHECK(!strcmp(bits(a), "111100000"));
    CHECK_EQ_INT(take(c, C), PGD_CONSTRAINT_REFUSED);
    CHECK_EQ_INT(take(c, B), PGD_CONSTRAINT_DONE);
    pgd_constraint_free(c);

    CHECK(pgd_constraint_grammar_new("root ::= (", NULL, N_TOK, &c, why, sizeof why) < 0);
    CHECK(c == NULL && !strncmp(why, "grammar: ", 9));
}

static void test_json(void) {
    pgd_constraint *c;
    char why[256];
    uint8_t a[N_TOK];
    CHECK(pgd_constraint_json_new(NULL, NULL, NULL, NULL, &c, why, sizeof why) == PGD_OK);
    CHECK(pgd_constraint_mask(c, &env, a) == 0);
    CHECK(a[LBRACE] && !a[A] && !a[EOS] && !a[RBRACE]);
    CHECK_EQ_INT(take(c, LBRACE), PGD_CONSTRAINT_MORE);
    CHECK_EQ_INT(take(c, EOS), PGD_CONSTRAINT_REFUSED);
    CHECK_EQ_INT(take(c, RBRACE), PGD_CONSTRAINT_DONE);
    pgd_constraint_free(c);

    CHECK(pgd_constraint_json_new("{\"type\": \"object\"}", NULL, NULL, NULL, &c, why,
                                  sizeof why) == PGD_OK);
    CHECK_EQ_INT(take(c, LBRACE), PGD_CONSTRAINT_MORE);
    CHECK_EQ_INT(take(c, RBRACE), PGD_CONSTRAINT_DONE);
    pgd_constraint_free(c);

    CHECK(pgd_constraint_json_new("{", NULL, NULL, NULL, &c, why, sizeof why) < 0);
    CHECK(c == NULL && !strncmp(why, "JSON schema: ", 13));
}

static void test_memo(void) {
    pgd_mask_memo m;
    uint8_t a[3], got[3];
    CHECK(pgd_mask_memo_init(&m, 3, 2) == PGD_OK);
    int32_t k[2] = {0, 0};
    CHECK(!pgd_mask_memo_get(&m, k, 1, got)); /* empty slots match no key, 0 included */
    for (int32_t i = 0; i < PGD_MASK_MEMO + 1; i++) {
        k[0] = i;
        memset(a, i, sizeof a);
        pgd_mask_memo_put(&m, k, 1, a);
    }
    k[0] = 0;
    CHECK(!pgd_mask_memo_get(&m, k, 1, got)); /* the oldest went */
    for (int32_t i = 1; i <= PGD_MASK_MEMO; i++) {
        k[0] = i;
        CHECK(pgd_mask_memo_get(&m, k, 1, got) && got[0] == i && got[2] == i);
    }
    k[1] = 1;
    CHECK(!pgd_mask_memo_get(&m, k, 2, got)); /* a longer key is another key */
    pgd_mask_memo_put(&m, k, 0, a);           /* no key: kept nowhere */
    CHECK(!pgd_mask_memo_get(&m, k, 0, got));
    pgd_mask_memo_free(&m);
}

/* "Think first": nothing held back from the opening token to the end tag ("}}" here, split
 * over two tokens), then the inner constraint; a first token other than the opener starts the
 * constraint at once; -1 thinks from the start; an overlong tag is refused and frees inner. */
static void test_think_first(void) {
    const char *ch[] = {"ab"};
    uint8_t a[N_TOK];
    pgd_constraint *in, *c;
    CHECK(pgd_constraint_choice_new(ch, 1, &in) == PGD_OK);
    CHECK(pgd_constraint_think_first_new(in, "}}", LBRACE, &c) == PGD_OK);
    CHECK(pgd_constraint_mask(c, &env, a) == 0);
    CHECK(!strcmp(bits(a), "010101000"));            /* a, ab, or the opener */
    CHECK_EQ_INT(take(c, LBRACE), PGD_CONSTRAINT_MORE);
    CHECK(pgd_constraint_mask(c, &env, a) == PGD_CONSTRAINT_FREE);
    CHECK_EQ_INT(take(c, C), PGD_CONSTRAINT_MORE);   /* refused by "ab", not while thinking */
    CHECK_EQ_INT(take(c, RBRACE), PGD_CONSTRAINT_MORE);
    CHECK(pgd_constraint_mask(c, &env, a) == PGD_CONSTRAINT_FREE);
    CHECK_EQ_INT(take(c, RBRACE), PGD_CONSTRAINT_MORE); /* "}}" complete: on from here */
    CHECK(pgd_constraint_mask(c, &env, a) == 0);
    CHECK(!strcmp(bits(a), "010100000"));
    CHECK_EQ_INT(take(c, AB), PGD_CONSTRAINT_DONE);
    pgd_constraint_free(c);

    CHECK(pgd_constraint_choice_new(ch, 1, &in) == PGD_OK);
    CHECK(pgd_constraint_think_first_new(in, "}}", LBRACE, &c) == PGD_OK);
    CHECK_EQ_INT(take(c, A), PGD_CONSTRAINT_MORE);   /* no thinking: "a" of "ab" */
    CHECK(pgd_constraint_mask(c, &env, a) == 0);
    CHECK(!strcmp(bits(a), "001000000"));
    CHECK_EQ_INT(take(c, C), PGD_CONSTRAINT_REFUSED);
    pgd_constraint_free(c);

    CHECK(pgd_constraint_choice_new(ch, 1, &in) == PGD_OK);
    CHECK(pgd_constraint_think_first_new(in, "}", -1, &c) == PGD_OK);
    CHECK(pgd_constraint_mask(c, &env, a) == PGD_CONSTRAINT_FREE);
    CHECK_EQ_INT(take(c, LBRACE), PGD_CONSTRAINT_MORE); /* no opener: "{" is thinking text */
    CHECK_EQ_INT(take(c, RBRACE), PGD_CONSTRAINT_MORE);
    CHECK(pgd_constraint_mask(c, &env, a) == 0);
    pgd_constraint_free(c);

    char longtag[40];
    memset(longtag, 'x', sizeof longtag - 1);
    longtag[sizeof longtag - 1] = 0;
    CHECK(pgd_constraint_choice_new(ch, 1, &in) == PGD_OK);
    CHECK(pgd_constraint_think_first_new(in, longtag, -1, &c) == PGD_EINVAL && !c);
}

int main(void) {
    setup();
    test_choice();
    test_regex();
    test_grammar();
    test_json();
    test_memo();
    test_think_first();
    pgd_grammar_scratch_free(env.gr_scratch);
    pgd_json_vocab_free(&vocab);
    return test_report("test_constraint");
}
