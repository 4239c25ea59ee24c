/* Register tiles for K-quant weights (Q4_K, Q5_K, Q6_K) against Q8_K activations (the int8
 * activation path): each weight chunk is unpacked once per tile and multiplied with every token
 * of the tile. Declarations here; the kernel body is kq_kernels.h, instantiated twice:
 * matmul_kq.c (AVX2: maddubs + madd, 32 elements per vector) and matmul_kq_vnni.c (AVX-512 VNNI:
 * maddubs + vpdpwssd, 64 elements per vector; compiled for AVX-512 alone, called where the CPU
 * has it).
 *
 * Bits: per (row, token) and super-block the integer sums are exact (|isum| < 2^31), and the
 * float steps are the scalar reference's, s = s + ((d * da) * isum - (dmin * da) * msum) with no
 * FMA; so every tile shape, both instruction sets, pgd_vec_dot and pgd_vec_dot_scalar give the
 * same bits: batch invariant and equal to the reference (tests/unit/test_kq_tiles.c). */
#ifndef PGD_BACKEND_CPU_KQ_TILES_H
#define PGD_BACKEND_CPU_KQ_TILES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/types.h"

/* Rows x tokens per tile, at most: AVX2 12 int accumulators of 16 registers, AVX-512 16 of 32 */
#ifndef PGD_KQ_MR_AVX2
#define PGD_KQ_MR_AVX2 4
#endif
#ifndef PGD_KQ_MT_AVX2
#define PGD_KQ_MT_AVX2 3
#endif
#ifndef PGD_KQ_MR_VNNI
#define PGD_KQ_MR_VNNI 2
#endif
#ifndef PGD_KQ_MT_VNNI
#define PGD_KQ_MT_VNNI 8
#endif

/* One tile: y[t * y_stride + r] for nr rows x nt tokens (all borrowed). */
typedef struct pgd__kq_tile {
    const uint8_t *w; /* first weight row (ggml blocks); rows w_stride bytes apart */
    size_t w_stride;
    const uint8_t *a; /* first token's Q8_K blocks (4-byte aligned); a_stride bytes apart */
    size_t a_stride;
    float *y;
    size_t y_stride;
    int64_t n;     /* elements per row, a multiple of 256 */
    bool prefetch; /* w streams from memory: prefetch the next row tile (rows nr further) */
} pgd__kq_tile;

/* t is Q4_K, Q5_K or Q6_K; 1 <= nr, nt <= the variant's MR, MT. */
void pgd__kq_tile_avx2(pgd_type t, const pgd__kq_tile *g, int nr, int nt);
void pgd__kq_tile_vnni(pgd_type t, const pgd__kq_tile *g, int nr, int nt);
/* Whether pgd__kq_tile_vnni exists in this build and the CPU has AVX-512 F, BW, VL, VNNI. */
bool pgd__kq_vnni_supported(void);

#endif
