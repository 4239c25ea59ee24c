/* Quantized weight formats (ggml-compatible block layouts) on the CPU: dequantization,
 * activation quantization, and dot products of a weight row with an activation vector.
 * Every dot product has one fixed reduction order whatever the caller (batch invariance). */
#ifndef PGD_BACKEND_CPU_QUANT_H
#define PGD_BACKEND_CPU_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/gguf.h"

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

/* The activation format a weight type's dot product consumes (F32 for float weights,
 * Q8_0 for Q4_0/Q4_1/Q8_0, Q8_K for the K-quants). */
pgd_type pgd_vec_dot_type(pgd_type weight_type);
/* Bytes needed to hold n activations converted to pgd_vec_dot_type(t). */
size_t pgd_vec_dot_act_bytes(pgd_type weight_type, int64_t n);
/* Converts n F32 activations into pgd_vec_dot_type(weight_type) (a copy for float weights). */
void pgd_quantize_act(pgd_type weight_type, const float *x, void *dst, int64_t n);
/* Dot product of one weight row (type t, n elements) with activations prepared by
 * pgd_quantize_act(t, ...). */
float pgd_vec_dot(pgd_type t, const void *w_row, const void *act, int64_t n);

/* Additions (tests, tools, weight conversion).
 * Activation buffers (pgd_quantize_act's dst, pgd_vec_dot's act) must be 4-byte aligned;
 * weight rows may have any alignment. */
/* fp32 -> bf16, round to nearest even, NaN kept quiet (as ggml_compute_fp32_to_bf16). */
uint16_t pgd_fp32_to_bf16(float f);
/* The portable scalar reference of pgd_vec_dot; same inputs, same contract. pgd_vec_dot may
 * differ from it only in the order its float partial sums are added (bound in test_quant.c). */
float pgd_vec_dot_scalar(pgd_type t, const void *w_row, const void *act, int64_t n);
/* Expands activations prepared by pgd_quantize_act(weight_type, ...) back to n floats
 * (d * q per element); lets tests measure the activation quantization error exactly. */
void pgd_dequantize_act(pgd_type weight_type, const void *act, float *dst, int64_t n);

#endif
