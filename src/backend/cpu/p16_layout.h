/* The CPU backend's 16-row weight panels: their byte layouts (written by pgd_cpu_pack in
 * matmul.c) and the sizes the kernels of p16_kernels.h step by. Shared by the AVX2 kernels
 * (matmul.c) and the AVX-512 ones (matmul_avx512.c), which read the same panels. */
#ifndef PGD_BACKEND_CPU_P16_LAYOUT_H
#define PGD_BACKEND_CPU_P16_LAYOUT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/types.h"

/* ---- Weights in panels of 16 rows (panel16: F16, Q8_0, Q4_0/1, Q5_0/1, Q4_K, Q5_K, Q6_K) ----
 * Outer-product tiles: per k, the 16 rows' weights (two vectors) meet a broadcast of each token's
 * x[k]. F16: every y[t][r] is one FMA chain over k = 0..n_in-1 in order, started from +0. Q8_0:
 * per 32-element block a chain s = sum q[k] x[k] (q widened exactly) from +0, then
 * y = fma(d, s, y) block after block from +0 (the scale leaves the inner loop). The GEMM (6 tokens
 * x 16 rows over K slices converted to F32 once, the chains continued from y) and the GEMV (1
 * token, 4 panels at a time, converting in registers) run the same chains, so a row's result is
 * bit-identical at every n. Against the row-major tiles: fewer operand bytes per FMA (a weight
 * vector serves 6 tokens) and one long stream per panel in decode (bench/RESULTS.md; `PACK=1
 * bench/bench_matmul.c`). Q8_0 panel layout, per (panel, 32-element block): the 16 rows' fp16
 * scales, then q[k][16] (k-major): 544 bytes, as 16 rows' blocks take row-major.
 * Q4_K (d1 = d * sc and m1 = dmin * mn of each row's 32-element group, as pgd_dequantize_row
 * forms them): per group the chain s = sum q[k] x[k] from +0, then y = fma(d1, s, y) and
 * y = fma(-m1, xs, y), xs the token's sum of the group's 32 activations (p16_xsum, computed
 * once per call into the act scratch, so every path reads the same bits). Layout per (panel,
 * 256-element super-block), the 2,304 bytes the 16 rows' blocks take row-major: d[16] and
 * dmin[16] (fp16), the 12 packed scale bytes transposed
 * (byte b of the 16 rows, [12][16]), then per element k 8 bytes: row i's quant in byte i's low
 * nibble, row 8 + i's in its high one.
 * Q6_K (groups of 16, d1 = d * sc; quants q - 32 with q in 0..63): per group the chain of q[k]
 * x[k], then y = fma(d1, s, y) and y = fma(-32 d1, xs, y), xs the group's 16 activations.
 * Layout per (panel, super-block), 3,360 bytes as row-major: d[16] (fp16), the int8 scales
 * [16 groups][16 rows], then per k 12 bytes: 8 of low nibbles as Q4_K's, and a 32-bit word
 * holding row r's two high bits at bits 2r, 2r + 1.
 * Q4_0, Q4_1, Q5_0, Q5_1 (values d q + o, o = -8d, m, -16d, m): per 32-element block the chain
 * of q[k] x[k], then y = fma(d, s, y) and y = fma(o, xs, y). Layout per (panel, block), the
 * bytes 16 rows' blocks take: d[16] (fp16), for Q4_1/Q5_1 m[16], then per k 8 bytes of low
 * nibbles as Q4_K's, and for Q5_0/Q5_1 a 16-bit word with row r's fifth bit at bit r. */
#define P16_Q8_BLOCK (16 * 2 + 32 * 16)
#define P16_Q5(t) ((t) == PGD_TYPE_Q5_0 || (t) == PGD_TYPE_Q5_1)
#define P16_HAS_M(t) ((t) == PGD_TYPE_Q4_1 || (t) == PGD_TYPE_Q5_1)
#define P16_Q4X(t) ((t) == PGD_TYPE_Q4_0 || (t) == PGD_TYPE_Q4_1 || P16_Q5(t))
#define P16_Q4X_HDR(t) (P16_HAS_M(t) ? 64 : 32) /* bytes before a block's quants */
#define P16_Q4X_KB(t) (P16_Q5(t) ? 10 : 8)      /* bytes per element k */
#define P16_Q4X_BLOCK(t) (P16_Q4X_HDR(t) + 32 * P16_Q4X_KB(t))
#define Q6_K_BYTES 210
#define P16_Q6K_SB (16 * Q6_K_BYTES)
#define P16_Q6K_Q (32 + 256) /* offset of the quants */
#define Q4_K_BYTES 144
#define P16_Q4K_SB (16 * Q4_K_BYTES)
#define P16_Q4K_SC 64  /* offset of the transposed scale bytes */
#define P16_Q4K_Q 256  /* offset of the quants */
/* Q5_K: Q4_K's header (d, dmin, scale bytes), then per k 10 bytes: Q4_K's 8, and a 16-bit word
 * with row r's fifth bit at bit r (2,816 bytes per super-block, as row-major). */
#define Q5_K_BYTES 176
#define P16_Q5K_SB (16 * Q5_K_BYTES)
#define P16_K4(t) ((t) == PGD_TYPE_Q4_K || (t) == PGD_TYPE_Q5_K) /* Q4_K's scales */
#define P16_K4_SB(t) ((t) == PGD_TYPE_Q4_K ? P16_Q4K_SB : P16_Q5K_SB)
#define P16_K4_KB(t) ((t) == PGD_TYPE_Q4_K ? 8 : 10) /* bytes per element k */
/* Q3_K (groups of 16, d1 = d * (sc - 32); values d1 (u - 4), u = 2 low bits | high bit << 2):
 * per group the chain of u[k] x[k], then y = fma(d1, s, y) and y = fma(-4 d1, xs, y). Layout
 * per (panel, super-block), 1,760 bytes as row-major: d[16] (fp16), the 12 scale bytes
 * transposed ([12][16]), then per k 6 bytes: a 32-bit word with row r's low bits at 2r, 2r + 1,
 * and a 16-bit word with its high bit at r. */
#define Q3_K_BYTES 110
#define P16_Q3K_SB (16 * Q3_K_BYTES)
#define P16_Q3K_Q (32 + 192)
/* whether a block type has an offset term (a block sum of the activations to fold) */
#define P16_HAS_OFF(t) ((t) != PGD_TYPE_Q8_0)

/* Elements per block of a block-quantized panel: a chain runs over one block. */
#define P16_BL(t) ((t) == PGD_TYPE_Q6_K || (t) == PGD_TYPE_Q3_K ? 16 : 32)

static inline size_t p16_panel_bytes(pgd_type t, size_t K) {
    return t == PGD_TYPE_F16    ? 16 * K * 2
           : t == PGD_TYPE_Q8_0 ? (K / 32) * P16_Q8_BLOCK
           : P16_Q4X(t)         ? (K / 32) * P16_Q4X_BLOCK(t)
           : P16_K4(t)          ? (K / 256) * P16_K4_SB(t)
           : t == PGD_TYPE_Q6_K ? (K / 256) * P16_Q6K_SB
                                : (K / 256) * P16_Q3K_SB;
}

/* Where block blk's quants start in a panel, and how many 64-byte lines they take (the
 * prefetch distance is counted in them). */
static inline const uint8_t *p16_blk_bytes(const pgd_type t, const uint8_t *p, size_t blk) {
    return t == PGD_TYPE_Q8_0   ? p + blk * P16_Q8_BLOCK
           : P16_Q4X(t)         ? p + blk * P16_Q4X_BLOCK(t)
           : P16_K4(t) ? p + blk / 8 * P16_K4_SB(t) + P16_Q4K_Q + blk % 8 * 32 * P16_K4_KB(t)
           : t == PGD_TYPE_Q6_K ? p + blk / 16 * P16_Q6K_SB + P16_Q6K_Q + blk % 16 * 192
                                : p + blk / 16 * P16_Q3K_SB + P16_Q3K_Q + blk % 16 * 96;
}
/* Q3_K: element k's two bit words in panel super-block sb (see the layout above). */
static inline void p16_q3k_words(const uint8_t *sb, int k, int32_t *lw, uint16_t *hw) {
    const uint8_t *q = sb + P16_Q3K_Q + 6 * k;
    memcpy(lw, q, 4);
    memcpy(hw, q + 4, 2);
}
#define P16_BLK_LINES(t)                                                                         \
    ((t) == PGD_TYPE_Q8_0 ? (P16_Q8_BLOCK + 63) / 64                                             \
     : P16_Q4X(t)         ? (P16_Q4X_BLOCK(t) + 63) / 64                                         \
     : P16_K4(t)          ? P16_K4_KB(t) / 2                                                     \
     : (t) == PGD_TYPE_Q6_K ? 3                                                                  \
                            : 2)

/* A few tokens (n <= P16_FEW_MAX; F16: P16_FEW_MAX_F16) stream the panels in groups of up to 4
 * tokens, converting each weight once per group (p16_few). For so few tokens p16_gemm's
 * conversion of every panel slice to F32 in memory costs more than its tiles save: a Q8_0 768 x
 * 2,048 matrix took 4.1x gemv's time at 2 tokens that way, 1.8x here. Up to 24 tokens (6
 * groups) this stays ahead of p16_gemm for the block types (in-process A/B,
 * bench/bench_pack_ab.c: 1536 x 576 Q4_1 at 16 tokens 1.08x the row-major tiles against
 * p16_gemm's 0.84x; Q8_0 at 12: 1.25x against 0.87x). F16 panels convert cheaply, and past 3
 * tokens p16_gemm is as fast or faster (bench/RESULTS.md). */
#define P16_FEW_MAX 24
#define P16_FEW_MAX_F16 3
/* the 5-bit types and Q3_K decode costlier per group: past 8 tokens the GEMM's one conversion per
 * slice wins (4096 x 4096 at 16 tokens: Q5_0 1.02x the row-major tiles against 0.78x, Q3_K
 * 0.87x against 0.74x) */
#define P16_FEW_MAX_SLOW 8
#define P16_FEW_MAX_OF(t)                                                                        \
    ((t) == PGD_TYPE_F16 ? P16_FEW_MAX_F16                                                       \
     : P16_Q5(t) || (t) == PGD_TYPE_Q5_K || (t) == PGD_TYPE_Q3_K ? P16_FEW_MAX_SLOW              \
                                                                : P16_FEW_MAX)

#endif
