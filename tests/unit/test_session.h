/* The unbatched reference of the engine tests: a model, a pool and a single-sequence session
 * over it (pgd_session, model.h), opened and closed together. */
#ifndef PGD_TEST_SESSION_H
#define PGD_TEST_SESSION_H

#include "backend/cpu/pool.h"
#include "model/model.h"
#include "test.h"

typedef struct test_session {
    pgd_model *m;
    pgd_pool *pool;
    pgd_session ss;
} test_session;

/* Loads path (default options) under 2 threads with a session of max_batch tokens a call. */
static inline void test_session_open(test_session *t, const char *path, int32_t max_batch) {
    pgd_model_opts mo = {0};
    pgd_err err;
    CHECK_EQ_INT(pgd_model_load(path, &mo, &t->m, &err), 0);
    CHECK_EQ_INT(pgd_pool_create(2, &t->pool, NULL), 0);
    CHECK_EQ_INT(pgd_session_init(&t->ss, t->m, t->pool, max_batch, &err), 0);
}

static inline void test_session_close(test_session *t) {
    pgd_session_free(&t->ss);
    pgd_pool_free(t->pool);
    pgd_model_free(t->m);
}

#endif
