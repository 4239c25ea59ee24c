/* Matrix products of (possibly quantized) weights with F32 activations on the CPU. */
#ifndef PGD_BACKEND_CPU_MATMUL_H
#define PGD_BACKEND_CPU_MATMUL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/cpu/pool.h"
#include "core/types.h"

/* Whether this build multiplies w in the panel16 layout (F16, or Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
 * Q3_K, Q4_K, Q5_K, Q6_K with F32 activations; AVX2+FMA+F16C, n_out a multiple of 16;
 * PAGODA_PACK=0 or the type's PAGODA_PACK_<TYPE>=0 say no). The layout changes a row's summation
 * order (F16: one FMA chain over k instead of 8 lanes and a tree; block types: a chain per block,
 * then its scale and offset terms), the same for every batch size. */
bool pgd_cpu_can_pack(const pgd_weight *w);
/* Writes w's rows (row-major, w->data) into dst in the panel16 layout (the same byte count). */
void pgd_cpu_pack(const pgd_weight *w, void *dst);

/* Bytes of one activation row of the scratch buffer pgd_cpu_matmul needs for weight w with
 * inputs of n_in elements (64-byte multiple). */
size_t pgd_cpu_matmul_act_row_bytes(const pgd_weight *w);

/* Bytes of the panel scratch for pgd_cpu_matmul: per thread, 4 dequantized weight rows of
 * act_row_bytes (the largest pgd_cpu_matmul_act_row_bytes of the model's weights). */
size_t pgd_cpu_matmul_panel_bytes(size_t act_row_bytes, int n_threads);

/* y (n, w->n_out) = x (n, w->n_in) . W^T, split over output rows on the pool.
 * act is scratch for n rows of act_row_bytes (>= pgd_cpu_matmul_act_row_bytes(w)); panel is
 * pgd_cpu_matmul_panel_bytes(act_row_bytes, threads) of scratch, or NULL (then quantized weights
 * are dequantized in registers once per 3 tokens instead of once per panel for all tokens).
 * Batch invariant: row t of y depends only on row t of x and W, never on n or the other rows,
 * and is the same with or without a panel. */
void pgd_cpu_matmul(pgd_pool *pool, const pgd_weight *w, const float *x, float *y, int n,
                    void *act, size_t act_row_bytes, void *panel);

/* Whether the panel16 GEMM (more tokens than the few-token kernels take) runs its AVX-512
 * version (matmul_avx512.c): in a build that has it (PGD_AVX512_KERNELS), on a CPU and OS with
 * AVX-512 F, BW, VL and DQ, unless PAGODA_AVX512=0. It gives the AVX2 kernels' bits (the same
 * FMA chain per output), so this changes speed only. The same switch lets the int8-activation
 * K-quant tiles use their AVX-512 VNNI version where the CPU has AVX512_VNNI (kq_tiles.h; also
 * the same bits). Decided once; pgd_cpu_set_avx512 overrides it (tests, benchmarks): 0 off, 1 on
 * where supported (returns whether it is on). */
bool pgd_cpu_avx512(void);
bool pgd_cpu_set_avx512(int on);
/* The AVX-512 panel16 GEMM: rows [lo, hi) of y for n tokens (p16_kernels.h's p16_gemm). */
void pgd_p16_gemm_avx512(pgd_type t, const void *P, const float *x, float *y, size_t K,
                         size_t N, int n, long lo, long hi, const float *xs, size_t xss);

#endif
