/* Quantized weight formats (ggml-compatible block layouts) on the CPU: dequantization,
 * activation quantization, and dot products of a weight row with an activation vector.
 * Every dot product has one fixed reduction order whatever the caller (batch invariance). */
#ifndef PGD_BACKEND_CPU_QUANT_H
#define PGD_BACKEND_CPU_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/types.h"

#define PGD_QK 32   /* elements per block of Q4_0, Q4_1, Q8_0 */
#define PGD_QK_K 256 /* elements per super-block of the K-quants */

/* Conversions. */
float pgd_fp16_to_fp32(uint16_t h);
uint16_t pgd_fp32_to_fp16(float f);
float pgd_bf16_to_fp32(uint16_t h);

/* Dequantizes n elements (n a multiple of the type's block size) of a row of type t. */
void pgd_dequantize_row(pgd_type t, const void *src, float *dst, int64_t n);
/* True if t is a weight type the CPU backend computes on. */
bool pgd_cpu_type_supported(pgd_type t);

/* Activation precision for quantized weights (Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K).
 * Default: F32 activations. Each weight block is dequantized in registers (bit-identical to
 * pgd_dequantize_row) and multiplied with the float activations, so a dot product differs from
 * an F32 dot product on the dequantized weights only by float summation order.
 * "int8 activations" (llama.cpp's scheme): activations are quantized to 8 bits per block (Q8_0
 * with sums for Q4_0/Q4_1/Q8_0, Q8_K for the K-quants) and integer dot products are used. The
 * kernels are faster (per kernel, one thread: 1.1-1.6x at n = 128, 1.6-3x at n = 1; see
 * bench/RESULTS.md), but the activation rounding costs
 * accuracy on models with activation outliers (SmolLM2-135M Q4_1, teacher-forced against
 * transformers in F32 on the same dequantized weights: 96.5% arg-max agreement with 8-bit
 * activations, 100% of 433 positions with F32 activations).
 * The default (issue 37) is 8-bit activations for the K-quants (Q4_K, Q5_K, Q6_K), whose
 * integer tiles are faster and whose KL divergence then equals llama.cpp's on the same file
 * (bench/RESULTS.md), and F32 for the others (Q4_0/Q4_1/Q8_0, whose F32 path prefills faster).
 * PAGODA_INT8_ACT=0 (F32 everywhere, the reference) or =1 (8-bit for every quantized type) in
 * the environment, read at the first query, or pgd_cpu_set_int8_act (0 or 1) override it.
 * Choose before sizing scratch with pgd_cpu_matmul_act_row_bytes and before any matmul: it must
 * not change while weights are in use (the activation layout depends on it). Thread-safe to
 * read. */
void pgd_cpu_set_int8_act(bool on);
bool pgd_cpu_int8_act(void);         /* 8-bit activations for every quantized type */
const char *pgd_cpu_int8_act_name(void); /* "F32", "int8" or the default's mixed name */
int pgd_cpu_int8_act_mode(void);         /* 0 F32, 1 every quantized type, 2 the K-quants */

/* The activation format a weight type's dot product consumes: F32 for every type by default;
 * with int8 activations, Q8_0 for Q4_0/Q4_1/Q8_0 and Q8_K for the K-quants. */
pgd_type pgd_vec_dot_type(pgd_type weight_type);
/* Bytes needed to hold n activations converted to pgd_vec_dot_type(t). */
size_t pgd_vec_dot_act_bytes(pgd_type weight_type, int64_t n);
/* Converts n F32 activations into pgd_vec_dot_type(weight_type) (a copy for float weights). */
void pgd_quantize_act(pgd_type weight_type, const float *x, void *dst, int64_t n);
/* The portable scalar reference of pgd_quantize_act; the same bytes (Q8_K: tests compare). */
void pgd_quantize_act_scalar(pgd_type weight_type, const float *x, void *dst, int64_t n);
/* Dot product of one weight row (type t, n elements) with activations prepared by
 * pgd_quantize_act(t, ...). */
float pgd_vec_dot(pgd_type t, const void *w_row, const void *act, int64_t n);

/* Additions (tests, tools, weight conversion).
 * Activation buffers (pgd_quantize_act's dst, pgd_vec_dot's act) must be 4-byte aligned;
 * weight rows may have any alignment. */
/* fp32 -> bf16, round to nearest even, NaN kept quiet (as ggml_compute_fp32_to_bf16). */
uint16_t pgd_fp32_to_bf16(float f);
/* The portable scalar reference of pgd_vec_dot; same inputs, same contract. pgd_vec_dot may
 * differ from it only in the order its float partial sums are added and, with F32 activations,
 * in fusing each product into its addition (bounds in test_quant.c). With F32 activations,
 * pgd_vec_dot is bit-identical to the corresponding entry of pgd_cpu_matmul. The K-quants with
 * Q8_K activations differ in nothing: pgd_vec_dot, this and pgd_cpu_matmul's K-quant tiles
 * (kq_tiles.h) give the same bits. */
float pgd_vec_dot_scalar(pgd_type t, const void *w_row, const void *act, int64_t n);
/* Expands activations prepared by pgd_quantize_act(weight_type, ...) back to n floats
 * (d * q per element); lets tests measure the activation quantization error exactly. */
void pgd_dequantize_act(pgd_type weight_type, const void *act, float *dst, int64_t n);

#endif
