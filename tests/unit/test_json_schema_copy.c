/* pgd_json_schema_copy: a copy of a compiled schema (what the server compiles once per request
 * and the engine copies into each choice) accepts exactly what a fresh compile accepts, byte by
 * byte, after the original is freed. The schema uses every part a copy must carry: nested
 * objects and arrays, enums of strings and numbers, a pattern (a compiled DFA), bounds,
 * lengths, a tagged union and a $ref. And when any of the copy's allocations fails it returns
 * PGD_ENOMEM and leaves the original whole (it once freed the original's arrays: the ASan
 * build reports that). This binary links with --wrap=malloc (CMakeLists.txt). */
#include <stdlib.h>
#include <string.h>

#include "sample/json_grammar.h"
#include "util/status.h"
#include "test.h"
#include "test_oom.h"

static const char *SCHEMA =
    "{\"type\":\"object\",\"properties\":{"
    "\"id\":{\"type\":\"string\",\"pattern\":\"^[A-Z]{2}-\\\\d{3}$\"},"
    "\"n\":{\"type\":\"integer\",\"minimum\":3,\"maximum\":70},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"red\",\"green\",1.5]},\"maxItems\":3},"
    "\"name\":{\"type\":\"string\",\"minLength\":2,\"maxLength\":5},"
    "\"pet\":{\"oneOf\":[{\"$ref\":\"#/$defs/cat\"},{\"$ref\":\"#/$defs/dog\"}]}},"
    "\"required\":[\"id\",\"n\",\"pet\"],\"additionalProperties\":false,"
    "\"$defs\":{\"cat\":{\"type\":\"object\",\"properties\":{\"kind\":{\"const\":\"cat\"},"
    "\"lives\":{\"type\":\"integer\"}},\"required\":[\"kind\"],\"additionalProperties\":true},"
    "\"dog\":{\"type\":\"object\",\"properties\":{\"kind\":{\"const\":\"dog\"},"
    "\"good\":{\"type\":\"boolean\"}},\"required\":[\"kind\"]}}}";

static const char *DOCS[] = {
    ("{\"id\":\"AB-123\",\"n\":42,\"tags\":[\"red\",1.5],\"name\":\"Rex\","
     "\"pet\":{\"kind\":\"dog\",\"good\":true}}"),
    "{\"id\":\"AB-12\",\"n\":42,\"pet\":{\"kind\":\"cat\"}}",  /* pattern fails at } */
    "{\"id\":\"XY-999\",\"n\":71,\"pet\":{\"kind\":\"cat\"}}", /* above the maximum */
    "{\"id\":\"XY-999\",\"n\":7,\"tags\":[\"blue\"],\"pet\":{\"kind\":\"cat\"}}",
    "{\"id\":\"XY-999\",\"n\":7,\"name\":\"R\",\"pet\":{\"kind\":\"cat\",\"lives\":9}}",
    "{\"id\":\"XY-999\",\"n\":7,\"pet\":{\"kind\":\"cat\",\"good\":true}}", /* cat: more keys */
    "{\"id\":\"XY-999\",\"n\":7,\"pet\":{\"kind\":\"cat\",\"lives\":9}}",
    "{\"n\":7,\"extra\":1}",
};

/* How far doc is accepted (bytes fed before the first refusal, or its length) and whether the
 * whole is a document. */
static void run(const pgd_json_schema *sc, const char *doc, size_t *ok_len, bool *complete) {
    pgd_json_state st;
    pgd_json_init_schema(&st, sc);
    size_t n = strlen(doc), i = 0;
    for (; i < n; i++) {
        pgd_json_state next = st;
        if (!pgd_json_feed(&next, doc + i, 1)) break;
        st = next;
    }
    *ok_len = i;
    *complete = i == n && pgd_json_complete(&st);
}

int main(void) {
    char msg[200];
    pgd_json_schema a, b, c;
    CHECK_EQ_INT(pgd_json_schema_compile(SCHEMA, strlen(SCHEMA), &a, msg, sizeof msg), PGD_OK);
    CHECK_EQ_INT(pgd_json_schema_compile(SCHEMA, strlen(SCHEMA), &b, msg, sizeof msg), PGD_OK);
    CHECK(a.n_regex == 1 && a.n_enum > 0 && a.n_var > 0);
    CHECK_EQ_INT(pgd_json_schema_copy(&c, &a), PGD_OK);
    pgd_json_schema_free(&a); /* the copy owns everything it uses */
    int complete_docs = 0;
    for (size_t d = 0; d < sizeof DOCS / sizeof DOCS[0]; d++) {
        size_t lb, lc;
        bool cb, cc;
        run(&b, DOCS[d], &lb, &cb);
        run(&c, DOCS[d], &lc, &cc);
        CHECK_EQ_INT(lc, lb);
        CHECK(cc == cb);
        complete_docs += cc;
    }
    CHECK_EQ_INT(complete_docs, 3); /* the first and the last two; the others break a rule */
    pgd_json_schema_free(&c);
    /* out of memory at every allocation of a copy of b in turn; b must stay usable */
    int failures = 0;
    for (long k = 0; k < 1000; k++) {
        test_malloc_fail_at(k);
        int rc = pgd_json_schema_copy(&c, &b);
        test_malloc_fail_at(-1);
        if (rc == PGD_OK) { /* k is past the copy's allocations: done */
            pgd_json_schema_free(&c);
            break;
        }
        CHECK_EQ_INT(rc, PGD_ENOMEM);
        failures++;
    }
    CHECK(failures >= 8); /* nodes, props and their names, enums, the DFA, variants */
    size_t len;
    bool complete;
    run(&b, DOCS[0], &len, &complete);
    CHECK(complete && len == strlen(DOCS[0]));
    pgd_json_schema_free(&b);
    return test_report("test_json_schema_copy");
}
