/* The GGUF block types beyond Q8_0/Q4_0/Q4_1 on the CUDA backend, read 32 elements at a time:
 * Q5_0, Q5_1 and IQ4_NL (blocks of 32), and Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS (super-blocks
 * of 256 holding 8 sub-blocks of 32, each with its own scale, or two of 16). The quantized GEMV,
 * the dequantization to BF16 for cuBLASLt and the embedding gather all take a row in blocks of
 * 32 (kernels/pagoda.cu, load_block), so pgd_qb_sub32 decodes one of them.
 *
 * Host and device code: tests/unit/test_cuda_qblocks.c checks it on the host against the CPU
 * backend's dequantization, every sub-block of random blocks, in every build, so what the GPU
 * runs is the tested code. Layouts as src/backend/cpu/quant.c (ggml's block_* structs), the
 * operation order as its pgd_dequantize_row, so each value is the CPU's (up to a fused
 * multiply-add where a compiler contracts one). */
#ifndef PGD_KERNELS_QBLOCKS_H
#define PGD_KERNELS_QBLOCKS_H

#include <stdint.h>
#include <string.h>

#include "kernels.h"

enum { /* the GGUF type ids */
       PGD_QB_Q5_0 = 6,
       PGD_QB_Q5_1 = 7,
       PGD_QB_Q2_K = 10,
       PGD_QB_Q3_K = 11,
       PGD_QB_Q4_K = 12,
       PGD_QB_Q5_K = 13,
       PGD_QB_Q6_K = 14,
       PGD_QB_IQ4_NL = 20,
       PGD_QB_IQ4_XS = 23 };

static inline PGD_K_HD int pgd_qb_is(int type) {
    return type == PGD_QB_Q5_0 || type == PGD_QB_Q5_1 || type == PGD_QB_IQ4_NL ||
           (type >= PGD_QB_Q2_K && type <= PGD_QB_Q6_K) || type == PGD_QB_IQ4_XS;
}

/* Bytes of one block (32 elements) or super-block (256). */
static inline PGD_K_HD int pgd_qb_bytes(int type) {
    switch (type) {
    case PGD_QB_Q5_0: return 22;
    case PGD_QB_Q5_1: return 24;
    case PGD_QB_IQ4_NL: return 18;
    case PGD_QB_Q2_K: return 84;
    case PGD_QB_Q3_K: return 110;
    case PGD_QB_Q4_K: return 144;
    case PGD_QB_Q5_K: return 176;
    case PGD_QB_Q6_K: return 210;
    case PGD_QB_IQ4_XS: return 136;
    default: return 0;
    }
}

/* IEEE half at p (little-endian) to float, exactly (integer operations only: the same bits on
 * the host and the device). */
static inline PGD_K_HD float pgd_qb_h2f(const uint8_t *p) {
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

/* IQ4_NL's (and IQ4_XS's) non-linear grid, value i (0..15): -127, -104, -83, -65, -49, -35,
 * -22, -10, 1, 13, 25, 38, 53, 69, 89, 113, as bytes of two constants (no table in memory for
 * the device to load). */
static inline PGD_K_HD int pgd_qb_iq4(int i) {
    const uint64_t lo = 0xF6EADDCFBFAD9881ull, hi = 0x7159453526190D01ull;
    return (int)(int8_t)(uint8_t)((i < 8 ? lo : hi) >> (8 * (i & 7)));
}

/* Scale and min j (0..7) of a Q4_K/Q5_K super-block's 12 packed bytes (ggml's
 * get_scale_min_k4). */
static inline PGD_K_HD void pgd_qb_scale_min(int j, const uint8_t *q, int *sc, int *mn) {
    if (j < 4) {
        *sc = q[j] & 63;
        *mn = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* Scale i (0..15) of a Q3_K super-block: 6 bits, offset 32. */
static inline PGD_K_HD int pgd_qb_q3k_scale(const uint8_t *sc, int i) {
    int lo = i < 8 ? sc[i] & 0xF : sc[i - 8] >> 4;
    return (lo | ((sc[8 + i % 4] >> (2 * (i / 4))) & 3) << 4) - 32;
}

/* Elements [32 b, 32 b + 32) of a row of type (pgd_qb_is) into out. */
static inline PGD_K_HD void pgd_qb_sub32(int type, const uint8_t *row, int64_t b, float out[32]) {
    const int bytes = pgd_qb_bytes(type);
    if (type == PGD_QB_Q5_0 || type == PGD_QB_Q5_1 || type == PGD_QB_IQ4_NL) {
        /* one block: fp16 d | (Q5_1: fp16 m) | (Q5_0/1: qh[4]) | qs[16]; elements l and l + 16
         * are the low and high nibbles of qs[l], Q5's fifth bits bits l and l + 16 of qh */
        const uint8_t *p = row + b * bytes;
        const float d = pgd_qb_h2f(p);
        if (type == PGD_QB_IQ4_NL) {
            for (int l = 0; l < 16; l++) {
                out[l] = d * (float)pgd_qb_iq4(p[2 + l] & 0xF);
                out[l + 16] = d * (float)pgd_qb_iq4(p[2 + l] >> 4);
            }
            return;
        }
        const int q51 = type == PGD_QB_Q5_1;
        const float m = q51 ? pgd_qb_h2f(p + 2) : 0.0f;
        const uint8_t *h = p + (q51 ? 4 : 2), *qs = p + (q51 ? 8 : 6);
        const uint32_t qh = (uint32_t)h[0] | (uint32_t)h[1] << 8 | (uint32_t)h[2] << 16 |
                            (uint32_t)h[3] << 24;
        for (int l = 0; l < 16; l++) {
            int x0 = (int)((qs[l] & 0xF) | ((qh >> l) & 1) << 4);
            int x1 = (int)((qs[l] >> 4) | ((qh >> (l + 16)) & 1) << 4);
            if (q51) {
                out[l] = (float)x0 * d + m;
                out[l + 16] = (float)x1 * d + m;
            } else {
                out[l] = (float)(x0 - 16) * d;
                out[l + 16] = (float)(x1 - 16) * d;
            }
        }
        return;
    }
    const int j = (int)(b & 7); /* sub-block within the super-block */
    const uint8_t *p = row + (b >> 3) * bytes;
    switch (type) {
    case PGD_QB_Q6_K: {
        /* ql[128] | qh[64] | int8 scales[16] | fp16 d; a half of 128 elements is four runs of
         * 32: low nibbles of ql[0..31], of ql[32..63], high nibbles of the same, each with two
         * bits of qh[0..31] (shift 2 * run), two scales of 16 a run */
        const float d = pgd_qb_h2f(p + 208);
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
    case PGD_QB_Q4_K:
    case PGD_QB_Q5_K: {
        /* Q4_K: fp16 d | fp16 dmin | scales[12] | qs[128]; Q5_K: the same with qh[32] before
         * qs. Sub-blocks 2i and 2i + 1 are the low and high nibbles of qs[32 i .. 32 i + 31];
         * Q5_K's fifth bit of sub-block j is bit j of qh[l]. */
        const int q5 = type == PGD_QB_Q5_K;
        const float d = pgd_qb_h2f(p), dmin = pgd_qb_h2f(p + 2);
        int sc, mn;
        pgd_qb_scale_min(j, p + 4, &sc, &mn);
        const float dl = d * (float)sc, ml = dmin * (float)mn;
        const uint8_t *qs = p + (q5 ? 48 : 16) + 32 * (j >> 1), *qh = p + 16;
        const int hi = j & 1;
        for (int l = 0; l < 32; l++) {
            int q = hi ? qs[l] >> 4 : qs[l] & 0xF;
            if (q5 && (qh[l] >> j & 1)) q += 16;
            out[l] = dl * (float)q - ml;
        }
        return;
    }
    case PGD_QB_Q2_K:
    case PGD_QB_Q3_K: {
        /* Q2_K: scales[16] (4-bit sc | 4-bit min << 4) | qs[64] | fp16 d | fp16 dmin; Q3_K:
         * hmask[32] | qs[64] | scales[12] | fp16 d. Sub-block j is 2 bits at shift 2 (j % 4) of
         * qs[32 (j / 4) + l], two groups of 16 with scales 2j and 2j + 1; Q3_K takes 4 off
         * where bit j of hmask[l] is clear. */
        const int q3 = type == PGD_QB_Q3_K;
        const uint8_t *q = p + (q3 ? 32 : 16) + 32 * (j >> 2);
        const int sh = 2 * (j & 3);
        const float d = pgd_qb_h2f(p + (q3 ? 108 : 80)), dmin = q3 ? 0.0f : pgd_qb_h2f(p + 82);
        for (int g = 0; g < 2; g++) {
            const int i = 2 * j + g;
            float *o = out + 16 * g;
            const uint8_t *qg = q + 16 * g;
            if (q3) {
                const float dl = d * (float)pgd_qb_q3k_scale(p + 96, i);
                const uint8_t *hm = p + 16 * g;
                for (int l = 0; l < 16; l++)
                    o[l] = dl * (float)(((qg[l] >> sh) & 3) - ((hm[l] >> j) & 1 ? 0 : 4));
            } else {
                const float dl = d * (float)(p[i] & 0xF), ml = dmin * (float)(p[i] >> 4);
                for (int l = 0; l < 16; l++) o[l] = dl * (float)((qg[l] >> sh) & 3) - ml;
            }
        }
        return;
    }
    default: { /* IQ4_XS: fp16 d | u16 scales_h | scales_l[4] | qs[128] */
        const float d = pgd_qb_h2f(p);
        const int sh = p[2] | p[3] << 8;
        const int ls = ((p[4 + j / 2] >> (4 * (j % 2))) & 0xF) | ((sh >> (2 * j)) & 3) << 4;
        const float dl = d * (float)(ls - 32);
        const uint8_t *qs = p + 8 + 16 * j;
        for (int l = 0; l < 16; l++) {
            out[l] = dl * (float)pgd_qb_iq4(qs[l] & 0xF);
            out[l + 16] = dl * (float)pgd_qb_iq4(qs[l] >> 4);
        }
        return;
    }
    }
}

#endif
