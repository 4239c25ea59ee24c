/* Engine internals exposed to tests only. */
#ifndef PGD_ENGINE_INTERNAL_H
#define PGD_ENGINE_INTERNAL_H

#include "pagoda/pagoda.h"

/* 0 when the block pool is consistent (free list, counts, prefix map) and, when no request is
 * in flight, every block is free or cached with a zero reference count; else negative.
 * Engine thread (or synchronous use) only. */
int pgd__engine_check(pgd_engine *e);

#endif
