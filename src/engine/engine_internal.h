/* Engine internals exposed to tests only (and test hooks the command line forwards). */
#ifndef PGD_ENGINE_INTERNAL_H
#define PGD_ENGINE_INTERNAL_H

#include "pagoda/pagoda.h"

/* 0 when the block pool is consistent (free list, counts, prefix map) and, when no request is
 * in flight, every block is free or cached with a zero reference count; else negative.
 * Engine thread (or synchronous use) only. */
int pgd__engine_check(pgd_engine *e);

/* Test hook: accept every speculative proposal unverified (breaks exactness). Lets
 * tests/integration/test_spec.py show that its statistics catch a broken verifier; `pagoda
 * batch` turns it on for PAGODA_TEST_SPEC_ALWAYS_ACCEPT=1 (the engine reads no environment
 * for it). Before the first step. */
void pgd__engine_spec_always_accept(pgd_engine *e, bool on);

#endif
