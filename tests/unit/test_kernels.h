/* Helpers shared by the kernel tests (test_quant.c, test_matmul.c): a CHECK that prints a
 * formatted message for the first 30 failures, and a seeded splitmix64 generator. Define
 * TEST_RNG_SEED before including to pick the stream. */
#ifndef PGD_TEST_KERNELS_H
#define PGD_TEST_KERNELS_H

#include <stdint.h>
#include <stdio.h>

static int g_fail = 0;
static int g_checks = 0;
#define CHECK(cond, ...)                                                                          \
    do {                                                                                          \
        g_checks++;                                                                               \
        if (!(cond)) {                                                                            \
            if (g_fail < 30) {                                                                    \
                fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond);          \
                fprintf(stderr, __VA_ARGS__);                                                     \
                fprintf(stderr, "\n");                                                            \
            }                                                                                     \
            g_fail++;                                                                             \
        }                                                                                         \
    } while (0)

static uint64_t g_rng = TEST_RNG_SEED;
static uint64_t rnd_u64(void) {
    uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

#endif
