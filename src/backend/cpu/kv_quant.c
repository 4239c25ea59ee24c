/* KV rows quantized as they are stored (kv_quant.h). */
#include "backend/cpu/kv_quant.h"

#include <math.h>
#include <string.h>

#include "backend/cpu/quant.h"

/* x (n, a multiple of 32) as Q8_0 blocks, as ggml's reference quantizer writes them: per 32
 * elements an fp16 d = max|x| / 127 and int8 round(x / d). */
static void quantize_q8_0(const float *x, unsigned char *y, int n) {
    for (int b = 0; b < n; b += 32, y += 34) {
        float amax = 0.0f;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[b + i]));
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        uint16_t h = pgd_fp32_to_fp16(d);
        memcpy(y, &h, 2);
        for (int i = 0; i < 32; i++) y[2 + i] = (unsigned char)(int8_t)roundf(x[b + i] * id);
    }
}

/* x (n, a multiple of 32) as Q4_0 blocks, as ggml's reference quantizer writes them: d = the
 * element of largest magnitude / -8, each element min(15, (int)(x / d + 8.5)), element i in the
 * low nibble of byte i and element i + 16 in its high nibble. */
static void quantize_q4_0(const float *x, unsigned char *y, int n) {
    for (int b = 0; b < n; b += 32, y += 18) {
        float amax = 0.0f, mx = 0.0f;
        for (int i = 0; i < 32; i++)
            if (fabsf(x[b + i]) > amax) amax = fabsf(x[b + i]), mx = x[b + i];
        float d = mx / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        uint16_t h = pgd_fp32_to_fp16(d);
        memcpy(y, &h, 2);
        for (int i = 0; i < 16; i++) {
            int q0 = (int)(int8_t)(x[b + i] * id + 8.5f), q1 = (int)(int8_t)(x[b + 16 + i] * id + 8.5f);
            q0 = q0 < 15 ? q0 : 15;
            q1 = q1 < 15 ? q1 : 15;
            y[2 + i] = (unsigned char)(q0 | (q1 << 4));
        }
    }
}

void pgd_kv_quantize_row(pgd_type t, const float *x, void *dst, int n) {
    if (t == PGD_TYPE_Q8_0) quantize_q8_0(x, dst, n);
    else quantize_q4_0(x, dst, n);
}
