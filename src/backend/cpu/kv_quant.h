/* The quantized KV cache's writer (--kv-dtype q8_0 / q4_0): a row of K or V into llama.cpp's
 * blocks, exactly as ggml's reference quantizers (quantize_row_q8_0_ref, quantize_row_q4_0_ref)
 * write them; the attention reads them back with pgd_dequantize_row. */
#ifndef PGD_CPU_KV_QUANT_H
#define PGD_CPU_KV_QUANT_H

#include "core/types.h"

/* n (a multiple of 32) floats as Q8_0 or Q4_0 blocks (34 or 18 bytes per 32) at dst. */
void pgd_kv_quantize_row(pgd_type t, const float *x, void *dst, int n);

#endif
