/* The Responses API's store (src/api/resp_store.c): put/get/replace/delete, the byte count as
 * the sum of the entries' printed sizes, least-recently-used eviction under the bound, and an
 * entry larger than the bound refused. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/responses.h"
#include "test.h"
#include "util/status.h"

/* A response object of about n bytes printed. */
static cJSON *resp(const char *id, size_t n) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", id);
    char *pad = malloc(n + 1);
    memset(pad, 'x', n);
    pad[n] = 0;
    cJSON_AddStringToObject(o, "pad", pad);
    free(pad);
    return o;
}

static size_t printed(const cJSON *x) {
    if (!x) return 0;
    char *s = cJSON_PrintUnformatted(x);
    size_t n = strlen(s);
    free(s);
    return n;
}

static size_t entry_bytes(const char *id, const cJSON *r, const cJSON *m) {
    return strlen(id) + printed(r) + printed(m);
}

static void test_put_get_replace_delete(void) {
    pgd_resp_store *st = pgd_resp_store_new(1 << 20);
    cJSON *r1 = resp("a", 10), *r2 = resp("a", 50);
    cJSON *m = cJSON_Parse("[{\"role\":\"user\",\"content\":\"hi\"}]");
    CHECK(pgd_resp_store_get(st, "a") == NULL);
    CHECK(pgd_resp_store_messages(st, "a") == NULL);
    CHECK_EQ_INT(pgd_resp_store_put(st, "a", r1, m), 0);
    CHECK(cJSON_Compare(pgd_resp_store_get(st, "a"), r1, true));
    CHECK(cJSON_Compare(pgd_resp_store_messages(st, "a"), m, true));
    CHECK(pgd_resp_store_get(st, "b") == NULL);
    CHECK_EQ_INT(pgd_resp_store_count(st), 1);
    CHECK_EQ_INT(pgd_resp_store_bytes(st), entry_bytes("a", r1, m));
    /* a copy was stored: changing the caller's object changes nothing */
    cJSON_AddStringToObject(r1, "later", "y");
    CHECK(!cJSON_Compare(pgd_resp_store_get(st, "a"), r1, true));
    /* replace, keeping the messages (NULL) */
    CHECK_EQ_INT(pgd_resp_store_put(st, "a", r2, NULL), 0);
    CHECK(cJSON_Compare(pgd_resp_store_get(st, "a"), r2, true));
    CHECK(cJSON_Compare(pgd_resp_store_messages(st, "a"), m, true));
    CHECK_EQ_INT(pgd_resp_store_count(st), 1);
    CHECK_EQ_INT(pgd_resp_store_bytes(st), entry_bytes("a", r2, m));
    /* replace with no messages at all */
    CHECK_EQ_INT(pgd_resp_store_put(st, "b", r1, NULL), 0);
    CHECK(pgd_resp_store_messages(st, "b") == NULL);
    CHECK_EQ_INT(pgd_resp_store_count(st), 2);
    CHECK_EQ_INT(pgd_resp_store_bytes(st),
                 entry_bytes("a", r2, m) + entry_bytes("b", r1, NULL));
    /* delete */
    CHECK_EQ_INT(pgd_resp_store_delete(st, "a"), 0);
    CHECK_EQ_INT(pgd_resp_store_delete(st, "a"), PGD_ENOENT);
    CHECK(pgd_resp_store_get(st, "a") == NULL);
    CHECK(pgd_resp_store_get(st, "b") != NULL);
    CHECK_EQ_INT(pgd_resp_store_count(st), 1);
    CHECK_EQ_INT(pgd_resp_store_bytes(st), entry_bytes("b", r1, NULL));
    CHECK_EQ_INT(pgd_resp_store_delete(st, "b"), 0);
    CHECK_EQ_INT(pgd_resp_store_count(st), 0);
    CHECK_EQ_INT(pgd_resp_store_bytes(st), 0);
    cJSON_Delete(r1);
    cJSON_Delete(r2);
    cJSON_Delete(m);
    pgd_resp_store_free(st);
}

/* Room for three entries of one size: the fourth evicts the least recently used, and a get or
 * a messages lookup counts as a use. */
static void test_lru_eviction(void) {
    cJSON *r[6];
    char ids[6][8];
    for (int i = 0; i < 6; i++) {
        snprintf(ids[i], sizeof ids[i], "r%d", i);
        r[i] = resp(ids[i], 100);
    }
    size_t one = entry_bytes("r0", r[0], NULL);
    pgd_resp_store *st = pgd_resp_store_new(3 * one + one / 2);
    for (int i = 0; i < 3; i++) CHECK_EQ_INT(pgd_resp_store_put(st, ids[i], r[i], NULL), 0);
    CHECK_EQ_INT(pgd_resp_store_count(st), 3);
    CHECK(pgd_resp_store_get(st, "r0") != NULL); /* r1 is now the least recent */
    CHECK_EQ_INT(pgd_resp_store_put(st, ids[3], r[3], NULL), 0);
    CHECK_EQ_INT(pgd_resp_store_count(st), 3);
    CHECK(pgd_resp_store_get(st, "r1") == NULL);
    CHECK(pgd_resp_store_get(st, "r0") && pgd_resp_store_get(st, "r2") &&
          pgd_resp_store_get(st, "r3"));
    /* order now (most recent first): r3 r2 r0; a messages lookup of r0 makes r2 the oldest */
    pgd_resp_store_messages(st, "r0");
    CHECK_EQ_INT(pgd_resp_store_put(st, ids[4], r[4], NULL), 0);
    CHECK(pgd_resp_store_get(st, "r2") == NULL);
    CHECK(pgd_resp_store_get(st, "r0") != NULL);
    /* replacing an entry makes it the most recent and frees its old bytes first */
    CHECK_EQ_INT(pgd_resp_store_put(st, "r3", r[3], NULL), 0); /* order: r3 r0 r4 */
    CHECK_EQ_INT(pgd_resp_store_count(st), 3);
    CHECK_EQ_INT(pgd_resp_store_put(st, ids[5], r[5], NULL), 0);
    CHECK(pgd_resp_store_get(st, "r4") == NULL);
    CHECK(pgd_resp_store_get(st, "r3") && pgd_resp_store_get(st, "r0") &&
          pgd_resp_store_get(st, "r5"));
    CHECK(pgd_resp_store_bytes(st) <= 3 * one + one / 2);
    CHECK_EQ_INT(pgd_resp_store_bytes(st), 3 * one);
    /* a bigger entry evicts as many as it needs */
    cJSON *big = resp("big", 3 * one);
    CHECK_EQ_INT(pgd_resp_store_put(st, "big", big, NULL), 0);
    CHECK(pgd_resp_store_bytes(st) <= 3 * one + one / 2);
    CHECK_EQ_INT(pgd_resp_store_count(st), 1);
    CHECK(pgd_resp_store_get(st, "big") != NULL);
    cJSON_Delete(big);
    for (int i = 0; i < 6; i++) cJSON_Delete(r[i]);
    pgd_resp_store_free(st);
}

/* An entry larger than the whole bound is refused, and drops the id's older entry (which
 * would be stale); the others stay. Messages count against the bound too. */
static void test_bound(void) {
    cJSON *small = resp("s", 10), *huge = resp("h", 5000);
    pgd_resp_store *st = pgd_resp_store_new(1000);
    CHECK_EQ_INT(pgd_resp_store_put(st, "x", small, NULL), 0);
    CHECK_EQ_INT(pgd_resp_store_put(st, "y", small, NULL), 0);
    CHECK_EQ_INT(pgd_resp_store_put(st, "x", huge, NULL), PGD_ERANGE);
    CHECK(pgd_resp_store_get(st, "x") == NULL);
    CHECK(pgd_resp_store_get(st, "y") != NULL);
    CHECK_EQ_INT(pgd_resp_store_count(st), 1);
    CHECK_EQ_INT(pgd_resp_store_bytes(st), entry_bytes("y", small, NULL));
    cJSON *msgs = cJSON_CreateArray();
    cJSON_AddItemToArray(msgs, resp("m", 990));
    CHECK_EQ_INT(pgd_resp_store_put(st, "z", small, msgs), PGD_ERANGE);
    CHECK(pgd_resp_store_get(st, "z") == NULL);
    /* many entries: the table grows, every one is found, the bound holds throughout */
    pgd_resp_store *big = pgd_resp_store_new(50000);
    int found = 0, bound_ok = 1;
    for (int i = 0; i < 3000; i++) {
        char id[16];
        snprintf(id, sizeof id, "k%d", i);
        pgd_resp_store_put(big, id, small, NULL);
        bound_ok &= pgd_resp_store_bytes(big) <= 50000;
    }
    CHECK(bound_ok);
    size_t n = pgd_resp_store_count(big);
    for (int i = 0; i < 3000; i++) {
        char id[16];
        snprintf(id, sizeof id, "k%d", i);
        found += pgd_resp_store_get(big, id) != NULL;
    }
    CHECK_EQ_INT(found, (long long)n);
    CHECK(n > 1000 && n < 3000); /* (about 50000 / 33 bytes) */
    char last[16];
    snprintf(last, sizeof last, "k%d", 2999);
    CHECK(pgd_resp_store_get(big, last) != NULL);  /* the newest stay, */
    CHECK(pgd_resp_store_get(big, "k0") == NULL);  /* the oldest went */
    pgd_resp_store_free(big);
    cJSON_Delete(msgs);
    cJSON_Delete(small);
    cJSON_Delete(huge);
    pgd_resp_store_free(st);
}

int main(void) {
    test_put_get_replace_delete();
    test_lru_eviction();
    test_bound();
    return test_report("test_resp_store");
}
