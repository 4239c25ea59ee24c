/* Random blocks of a GGUF block type with valid scales: random bytes (quants, packed sub-block
 * scales, high bits) and the given fp16 scale d (and second scale m: Q4_1/Q5_1's min, the
 * K-quants' dmin) at the type's offsets, so no block holds an fp16 infinity or NaN. Shared by
 * test_cuda_qblocks.c and test_backend_ops.c. */
#ifndef PGD_TEST_QBLOCK_RAND_H
#define PGD_TEST_QBLOCK_RAND_H

#include <stdint.h>
#include <string.h>

#include "model/gguf.h"

/* One block at blk: random bytes from *rng (an LCG), then d and m. */
static void qb_rand_block(pgd_type t, uint8_t *blk, uint64_t *rng, uint16_t d, uint16_t m) {
    size_t bytes = pgd_type_block_bytes(t);
    for (size_t i = 0; i < bytes; i++) {
        *rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
        blk[i] = (uint8_t)(*rng >> 56);
    }
    int od, om;
    pgd_type_scale_offsets(t, &od, &om);
    if (od >= 0) memcpy(blk + od, &d, 2);
    if (om >= 0) memcpy(blk + om, &m, 2);
}

#endif
