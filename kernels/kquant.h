/* K-quant weights (GGUF Q4_K, Q5_K, Q6_K) on the CUDA backend, read 32 elements at a time: the
 * quantized GEMV, the dequantization to BF16 for cuBLASLt and the embedding gather all take a
 * row in blocks of 32 (kernels/pagoda.cu, load_block), and a K-quant super-block of 256 holds 8
 * such sub-blocks, each with its own scale (and min). Host and device code: the decode is
 * checked on the host against the CPU backend's dequantization, every sub-block of random
 * super-blocks, in every build (tests/unit/test_cuda_kquant.c), so what the GPU runs is the
 * tested code. Layouts as src/backend/cpu/quant.c (ggml's block_q4_K, block_q5_K, block_q6_K);
 * the operation order as its pgd_dequantize_row, so each value is the CPU's (up to a fused
 * multiply-add where the compiler contracts one). */
#ifndef PGD_KERNELS_KQUANT_H
#define PGD_KERNELS_KQUANT_H

#include <stdint.h>
#include <string.h>

#include "kernels.h"

enum { PGD_KQ_Q4_K = 12, PGD_KQ_Q5_K = 13, PGD_KQ_Q6_K = 14 }; /* the GGUF type ids */
enum { PGD_KQ_Q4_K_BYTES = 144, PGD_KQ_Q5_K_BYTES = 176, PGD_KQ_Q6_K_BYTES = 210 };

static inline PGD_K_HD int pgd_kq_is(int type) {
    return type == PGD_KQ_Q4_K || type == PGD_KQ_Q5_K || type == PGD_KQ_Q6_K;
}

/* IEEE half at p (little-endian) to float, exactly (integer operations only: the same bits on
 * the host and the device). */
static inline PGD_K_HD float pgd_kq_h2f(const uint8_t *p) {
    uint32_t h = (uint32_t)p[0] | (uint32_t)p[1] << 8;
    uint32_t sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, man = h & 0x3FFu, bits;
    float f;
    if (e == 0) { /* zero and subnormals: man * 2^-24, exact in float */
        f = (float)man * 5.9604644775390625e-8f;
        return sign ? -f : f;
    }
    bits = e == 31 ? sign | 0x7F800000u | man << 13 : sign | (e + 112) << 23 | man << 13;
    memcpy(&f, &bits, 4);
    return f;
}

/* Scale and min j (0..7) of a Q4_K/Q5_K super-block's 12 packed bytes (ggml's
 * get_scale_min_k4). */
static inline PGD_K_HD void pgd_kq_scale_min(int j, const uint8_t *q, int *sc, int *mn) {
    if (j < 4) {
        *sc = q[j] & 63;
        *mn = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* Elements [32 b, 32 b + 32) of a row of type (Q4_K, Q5_K or Q6_K) into out. */
static inline PGD_K_HD void pgd_kq_sub32(int type, const uint8_t *row, int64_t b, float out[32]) {
    const int j = (int)(b & 7); /* sub-block within the super-block */
    if (type == PGD_KQ_Q6_K) {
        /* ql[128] | qh[64] | int8 scales[16] | fp16 d; a half of 128 elements is four runs of
         * 32: low nibbles of ql[0..31], of ql[32..63], high nibbles of the same, each with two
         * bits of qh[0..31] (shift 2 * run), two scales of 16 a run */
        const uint8_t *p = row + (b >> 3) * PGD_KQ_Q6_K_BYTES;
        const float d = pgd_kq_h2f(p + 208);
        const int half = j >> 2, run = j & 3;
        const uint8_t *ql = p + 64 * half + (run & 1) * 32, *qh = p + 128 + 32 * half;
        const int8_t *sc = (const int8_t *)(p + 192) + 8 * half + 2 * run;
        const int hi = run >> 1, sh = 2 * run;
        for (int l = 0; l < 32; l++) {
            int lo = hi ? ql[l] >> 4 : ql[l] & 0xF;
            int q = (lo | (((qh[l] >> sh) & 3) << 4)) - 32;
            out[l] = d * (float)sc[l >> 4] * (float)q;
        }
        return;
    }
    /* Q4_K: fp16 d | fp16 dmin | scales[12] | qs[128]; Q5_K: the same with qh[32] before qs.
     * Sub-blocks 2i and 2i + 1 are the low and high nibbles of qs[32 i .. 32 i + 31]; Q5_K's
     * fifth bit of sub-block j is bit j of qh[l]. */
    const int q5 = type == PGD_KQ_Q5_K;
    const uint8_t *p = row + (b >> 3) * (q5 ? PGD_KQ_Q5_K_BYTES : PGD_KQ_Q4_K_BYTES);
    const float d = pgd_kq_h2f(p), dmin = pgd_kq_h2f(p + 2);
    int sc, mn;
    pgd_kq_scale_min(j, p + 4, &sc, &mn);
    const float dl = d * (float)sc, ml = dmin * (float)mn;
    const uint8_t *qs = p + (q5 ? 48 : 16) + 32 * (j >> 1), *qh = p + 16;
    const int hi = j & 1;
    for (int l = 0; l < 32; l++) {
        int q = hi ? qs[l] >> 4 : qs[l] & 0xF;
        if (q5 && (qh[l] >> j & 1)) q += 16;
        out[l] = dl * (float)q - ml;
    }
}

#endif
