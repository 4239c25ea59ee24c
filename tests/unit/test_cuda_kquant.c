/* The CUDA backend's K-quant decode (kernels/kquant.h, pgd_kq_sub32: the code load_block runs on
 * the GPU for Q4_K, Q5_K and Q6_K weights) against the CPU backend's pgd_dequantize_row: every
 * 32-element sub-block of rows of random super-blocks, with normal, subnormal, negative and zero
 * scales. Host code: runs in every build, GPU or not. */
#include <math.h>
#include <string.h>

#include "../../kernels/kquant.h"
#include "backend/cpu/quant.h"
#include "test.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint8_t rbyte(void) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint8_t)(rng >> 56);
}

/* an fp16 scale: kind 0 normal (up to ~0.01), 1 subnormal, 2 negative normal, 3 zero */
static void put_scale(uint8_t *p, int kind) {
    uint16_t h;
    if (kind == 1) h = (uint16_t)(1 + rbyte() % 0x3FF);
    else if (kind == 3) h = 0;
    else h = pgd_fp32_to_fp16(0.01f * (float)(1 + rbyte()) / 256.0f);
    if (kind == 2) h |= 0x8000u;
    memcpy(p, &h, 2);
}

static void check_type(pgd_type t, int bytes, const char *name) {
    enum { SUPER = 6, N = SUPER * 256 };
    static uint8_t row[SUPER * 256];
    static float ref[N];
    long exact = 0, close = 0, bad = 0;
    for (int round = 0; round < 64; round++) {
        for (int i = 0; i < SUPER * bytes; i++) row[i] = rbyte();
        for (int s = 0; s < SUPER; s++) {
            uint8_t *p = row + s * bytes;
            int kind = (round + s) % 4;
            if (t == PGD_TYPE_Q6_K) {
                put_scale(p + 208, kind);
            } else {
                put_scale(p, kind);
                put_scale(p + 2, (kind + 1) % 4);
            }
        }
        pgd_dequantize_row(t, row, ref, N);
        for (int b = 0; b < N / 32; b++) {
            float got[32];
            pgd_kq_sub32((int)t, row, b, got);
            for (int l = 0; l < 32; l++) {
                float r = ref[b * 32 + l];
                if (memcmp(&got[l], &r, 4) == 0) exact++;
                /* a contracted multiply-add on one side only: within an ulp of the product */
                else if (fabsf(got[l] - r) <= 1e-5f * (1.0f + fabsf(r))) close++;
                else if (bad++ < 5)
                    fprintf(stderr, "%s: sub-block %d element %d: %.9g, CPU %.9g\n", name, b, l,
                            got[l], r);
            }
        }
    }
    printf("%s: %ld values equal to the CPU's bits, %ld within rounding, %ld wrong\n", name, exact,
           close, bad);
    CHECK_EQ_INT(bad, 0);
    CHECK(exact > 0);
}

int main(void) {
    CHECK(pgd_kq_is(PGD_TYPE_Q4_K) && pgd_kq_is(PGD_TYPE_Q5_K) && pgd_kq_is(PGD_TYPE_Q6_K));
    CHECK(!pgd_kq_is(PGD_TYPE_Q4_0) && !pgd_kq_is(PGD_TYPE_Q8_0) && !pgd_kq_is(PGD_TYPE_Q3_K));
    CHECK_EQ_INT(pgd_type_block_bytes(PGD_TYPE_Q4_K), PGD_KQ_Q4_K_BYTES);
    CHECK_EQ_INT(pgd_type_block_bytes(PGD_TYPE_Q5_K), PGD_KQ_Q5_K_BYTES);
    CHECK_EQ_INT(pgd_type_block_bytes(PGD_TYPE_Q6_K), PGD_KQ_Q6_K_BYTES);
    /* the half decoder on every finite bit pattern against the CPU's */
    long wrong = 0;
    for (uint32_t h = 0; h < 0x10000u; h++) {
        if ((h & 0x7C00u) == 0x7C00u) continue; /* inf and NaN */
        uint8_t b[2] = {(uint8_t)h, (uint8_t)(h >> 8)};
        float a = pgd_kq_h2f(b), c = pgd_fp16_to_fp32((uint16_t)h);
        wrong += memcmp(&a, &c, 4) != 0;
    }
    CHECK_EQ_INT(wrong, 0);
    check_type(PGD_TYPE_Q4_K, PGD_KQ_Q4_K_BYTES, "Q4_K");
    check_type(PGD_TYPE_Q5_K, PGD_KQ_Q5_K_BYTES, "Q5_K");
    check_type(PGD_TYPE_Q6_K, PGD_KQ_Q6_K_BYTES, "Q6_K");
    return test_report("test_cuda_kquant");
}
