/* The CUDA backend's decode of the block types beyond Q8_0/Q4_0/Q4_1 (kernels/qblocks.h,
 * pgd_qb_sub32: the code load_block runs on the GPU for Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q4_K,
 * Q5_K, Q6_K and IQ4_XS weights) against the CPU backend's pgd_dequantize_row: every 32-element
 * sub-block of rows of random blocks, with normal, subnormal, negative and zero scales. Host
 * code: runs in every build, GPU or not. */
#include <math.h>
#include <string.h>

#include "../../kernels/qblocks.h"
#include "backend/cpu/quant.h"
#include "test.h"
#include "test_qblock_rand.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;

/* an fp16 scale: kind 0 normal (up to ~0.01), 1 subnormal, 2 negative normal, 3 zero */
static uint16_t scale(int kind) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    uint32_t r = (uint32_t)(rng >> 40);
    if (kind == 1) return (uint16_t)(1 + r % 0x3FF);
    if (kind == 3) return 0;
    uint16_t h = pgd_fp32_to_fp16(0.01f * (float)(1 + r % 256) / 256.0f);
    return kind == 2 ? (uint16_t)(h | 0x8000u) : h;
}

static void check_type(pgd_type t) {
    enum { N = 6 * 256 };
    static uint8_t row[N / 32 * 136];
    static float ref[N];
    const int bel = (int)pgd_type_block_elems(t), bytes = (int)pgd_type_block_bytes(t);
    CHECK_EQ_INT(pgd_qb_bytes((int)t), bytes);
    long exact = 0, close = 0, bad = 0;
    for (int round = 0; round < 64; round++) {
        for (int s = 0; s < N / bel; s++)
            qb_rand_block(t, row + s * bytes, &rng, scale((round + s) % 4),
                          scale((round + s + 1) % 4));
        pgd_dequantize_row(t, row, ref, N);
        for (int b = 0; b < N / 32; b++) {
            float got[32];
            pgd_qb_sub32((int)t, row, b, got);
            for (int l = 0; l < 32; l++) {
                float r = ref[b * 32 + l];
                if (memcmp(&got[l], &r, 4) == 0) exact++;
                /* a contracted multiply-add on one side only: within an ulp of the product */
                else if (fabsf(got[l] - r) <= 1e-5f * (1.0f + fabsf(r))) close++;
                else if (bad++ < 5)
                    fprintf(stderr, "%s: sub-block %d element %d: %.9g, CPU %.9g\n",
                            pgd_type_name(t), b, l, got[l], r);
            }
        }
    }
    /* the scale offsets (pgd_type_scale_offsets) are where the scales are: zero there, and
     * every value is zero */
    qb_rand_block(t, row, &rng, 0, 0);
    pgd_dequantize_row(t, row, ref, bel);
    long nonzero = 0;
    for (int l = 0; l < bel; l++) nonzero += ref[l] != 0.0f;
    CHECK_EQ_INT(nonzero, 0);
    printf("%-6s: %ld values equal to the CPU's bits, %ld within rounding, %ld wrong\n",
           pgd_type_name(t), exact, close, bad);
    CHECK_EQ_INT(bad, 0);
    CHECK(exact > 0);
}

int main(void) {
    const pgd_type types[] = {PGD_TYPE_Q5_0, PGD_TYPE_Q5_1, PGD_TYPE_IQ4_NL,
                              PGD_TYPE_Q2_K, PGD_TYPE_Q3_K, PGD_TYPE_Q4_K,
                              PGD_TYPE_Q5_K, PGD_TYPE_Q6_K, PGD_TYPE_IQ4_XS};
    const pgd_type not_here[] = {PGD_TYPE_F32,  PGD_TYPE_F16,  PGD_TYPE_BF16,
                                 PGD_TYPE_Q4_0, PGD_TYPE_Q4_1, PGD_TYPE_Q8_0};
    for (size_t i = 0; i < sizeof not_here / sizeof *not_here; i++)
        CHECK(!pgd_qb_is((int)not_here[i])); /* load_block's own cases */
    /* the half decoder on every finite bit pattern against the CPU's */
    long wrong = 0;
    for (uint32_t h = 0; h < 0x10000u; h++) {
        if ((h & 0x7C00u) == 0x7C00u) continue; /* inf and NaN */
        uint8_t b[2] = {(uint8_t)h, (uint8_t)(h >> 8)};
        float a = pgd_qb_h2f(b), c = pgd_fp16_to_fp32((uint16_t)h);
        wrong += memcmp(&a, &c, 4) != 0;
    }
    CHECK_EQ_INT(wrong, 0);
    for (size_t i = 0; i < sizeof types / sizeof *types; i++) {
        CHECK(pgd_qb_is((int)types[i]));
        check_type(types[i]);
    }
    return test_report("test_cuda_qblocks");
}
