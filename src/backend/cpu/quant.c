/* ggml-compatible quantized blocks on the CPU: fp16/bf16 conversion, dequantization, the
 * activation precision mode (F32 by default, 8-bit on request), activation quantization and
 * weight-row x activation dot products (scalar reference + AVX2/FMA).
 * Every dot product reduces in one fixed order that depends only on n (batch invariance). */
#include "backend/cpu/quant.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/simd.h"
#include "backend/cpu/quant_f32act.h"
#include "util/status.h"
#include "util/env.h"

#ifdef __AVX2__
#include <immintrin.h>
#endif

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "quant.c reads ggml blocks as little-endian memory"
#endif

/* ---- Block layouts (bytes, little-endian), exactly as ggml's ggml-common.h -------------------
 * Q4_0  18 B: fp16 d | qs[16]            value = ((nibble) - 8) * d; low nibbles = elems 0..15
 * Q4_1  20 B: fp16 d | fp16 m | qs[16]   value = nibble * d + m
 * Q8_0  34 B: fp16 d | int8 qs[32]       value = q * d
 * Q5_0  22 B: fp16 d | qh[4] | qs[16]    value = ((nibble | (bit i of qh) << 4) - 16) * d
 * Q5_1  24 B: fp16 d | fp16 m | qh[4] | qs[16]   value = (nibble | (bit i of qh) << 4) * d + m
 * IQ4_NL 18 B: fp16 d | qs[16]           value = d * kvalues_iq4nl[nibble]
 * Q2_K  84 B: scales[16] (4-bit sc | 4-bit min << 4) | qs[64] (2 bits) | fp16 d | fp16 dmin
 * Q3_K 110 B: hmask[32] | qs[64] (2 bits) | scales[12] (6-bit x 16, offset 32) | fp16 d
 * IQ4_XS 136 B: fp16 d | u16 scales_h | scales_l[4] (6-bit x 8, offset 32) | qs[128]
 * Q4_K 144 B: fp16 d | fp16 dmin | scales[12] (6-bit sc/min x 8) | qs[128]
 * Q5_K 176 B: fp16 d | fp16 dmin | scales[12] | qh[32] | qs[128]
 * Q6_K 210 B: ql[128] | qh[64] | int8 scales[16] | fp16 d
 * Q8_K 292 B: float d | int8 qs[256] | int16 bsums[16] (sum of each 16 qs)
 * Weight rows are read through memcpy so any byte alignment is accepted. */
#define Q4_0_BYTES 18
#define Q4_1_BYTES 20
#define Q8_0_BYTES 34
#define Q5_0_BYTES 22
#define Q5_1_BYTES 24
#define IQ4_NL_BYTES 18
#define Q2_K_BYTES 84
#define Q3_K_BYTES 110
#define IQ4_XS_BYTES 136
#define Q4_K_BYTES 144
#define Q5_K_BYTES 176
#define Q6_K_BYTES 210
#define Q8_K_BYTES 292

/* Activation block for Q4_0/Q4_1/Q8_0 weights: ggml's Q8_0 with a float scale (one less
 * rounding than fp16) and the integer sum of qs, which Q4_1's "+ m" term needs (ggml uses Q8_1
 * for that). Buffers from pgd_vec_dot_act_bytes hold (n / 32) of these back to back. */
typedef struct act_q8 {
    float d;        /* scale: x ~= d * qs[i] */
    int32_t sum;    /* sum of qs[0..31] */
    int8_t qs[PGD_QK];
} act_q8;

/* Q8_K offsets (the struct would be the same, written out to keep the ggml byte layout). */
#define Q8K_D 0
#define Q8K_QS 4
#define Q8K_BSUMS (4 + PGD_QK_K)

/* ---- Conversions ------------------------------------------------------------------------- */

static uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static float u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float pgd_fp16_to_fp32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t e = (h >> 10) & 0x1f;
    uint32_t m = h & 0x3ff;
    if (e == 0) {
        if (m == 0) return u2f(sign);
        /* Subnormal m * 2^-24: normalise so the leading 1 lands on bit 10. */
        e = 113;
        while (!(m & 0x400)) {
            m <<= 1;
            e--;
        }
        return u2f(sign | (e << 23) | ((m & 0x3ff) << 13));
    }
    if (e == 31) return u2f(sign | 0x7f800000u | (m << 13)); /* inf, NaN payload kept */
    return u2f(sign | ((e + 112) << 23) | (m << 13));
}

uint16_t pgd_fp32_to_fp16(float f) {
    uint32_t x = f2u(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    x &= 0x7fffffffu;
    if (x >= 0x7f800000u) {
        if (x == 0x7f800000u) return sign | 0x7c00;
        return (uint16_t)(sign | 0x7e00 | ((x >> 13) & 0x3ff)); /* quiet NaN, as F16C does */
    }
    if (x >= 0x477ff000u) return sign | 0x7c00; /* >= 65520 ties/rounds to inf */
    if (x < 0x38800000u) {                      /* below 2^-14: fp16 subnormal or zero */
        if (x <= 0x33000000u) return sign;      /* <= 2^-25: rounds (ties to even) to 0 */
        uint32_t e = x >> 23;
        uint32_t m = (x & 0x7fffffu) | 0x800000u; /* value = m * 2^(e-150) */
        uint32_t shift = 126 - e;                 /* in units of 2^-24: m >> shift; 14..24 */
        uint32_t r = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1))) r++; /* may carry into the smallest normal */
        return (uint16_t)(sign | r);
    }
    uint32_t h = ((x >> 23) - 112) << 10 | ((x >> 13) & 0x3ff);
    uint32_t rem = x & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++; /* carry into the exponent is right */
    return (uint16_t)(sign | h);
}

float pgd_bf16_to_fp32(uint16_t h) { return u2f((uint32_t)h << 16); }

uint16_t pgd_fp32_to_bf16(float f) {
    uint32_t u = f2u(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 64); /* quiet NaN */
    return (uint16_t)((u + (0x7fffu + ((u >> 16) & 1))) >> 16);
}

#define FP16(p) pgd_fp16_to_fp32(pgd_ld_u16(p))

/* ---- Geometry (own table: gguf.c owns the public one) -------------------------------------- */

static uint32_t blk_elems(pgd_type t) {
    switch (t) {
    case PGD_TYPE_F32: case PGD_TYPE_F16: case PGD_TYPE_BF16: return 1;
    case PGD_TYPE_Q4_0: case PGD_TYPE_Q4_1: case PGD_TYPE_Q8_0:
    case PGD_TYPE_Q5_0: case PGD_TYPE_Q5_1: case PGD_TYPE_IQ4_NL: return PGD_QK;
    case PGD_TYPE_Q4_K: case PGD_TYPE_Q5_K: case PGD_TYPE_Q6_K: case PGD_TYPE_Q8_K:
    case PGD_TYPE_Q2_K: case PGD_TYPE_Q3_K: case PGD_TYPE_IQ4_XS: return PGD_QK_K;
    default: return 0;
    }
}

static size_t blk_bytes(pgd_type t) {
    switch (t) {
    case PGD_TYPE_Q4_0: return Q4_0_BYTES;
    case PGD_TYPE_Q4_1: return Q4_1_BYTES;
    case PGD_TYPE_Q8_0: return Q8_0_BYTES;
    case PGD_TYPE_Q4_K: return Q4_K_BYTES;
    case PGD_TYPE_Q5_K: return Q5_K_BYTES;
    case PGD_TYPE_Q6_K: return Q6_K_BYTES;
    case PGD_TYPE_Q8_K: return Q8_K_BYTES;
    case PGD_TYPE_Q5_0: return Q5_0_BYTES;
    case PGD_TYPE_Q5_1: return Q5_1_BYTES;
    case PGD_TYPE_IQ4_NL: return IQ4_NL_BYTES;
    case PGD_TYPE_Q2_K: return Q2_K_BYTES;
    case PGD_TYPE_Q3_K: return Q3_K_BYTES;
    case PGD_TYPE_IQ4_XS: return IQ4_XS_BYTES;
    case PGD_TYPE_F32: return 4;
    default: return 2;
    }
}

/* ---- Dequantization (scalar, operation order as ggml's dequantize_row_*) -------------------- */

/* 6-bit scale and min j (0..7) of a K-quant super-block (ggml's get_scale_min_k4). */
static void scale_min_k4(int j, const uint8_t *q, uint8_t *sc, uint8_t *mn) {
    if (j < 4) {
        *sc = q[j] & 63;
        *mn = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *mn = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

static void unpack_k4_scales(const uint8_t *scales, uint8_t sc[8], uint8_t mn[8]) {
    for (int j = 0; j < 8; j++) scale_min_k4(j, scales, &sc[j], &mn[j]);
}

/* Elements l, l + 32, l + 64 and l + 96 of a Q6_K half-block (ql: its 64 low-nibble bytes, qh:
 * its 32 bytes of high bit pairs) as signed values, -32..31. */
static inline void q6k_unpack4(const uint8_t *ql, const uint8_t *qh, int l, int q[4]) {
    q[0] = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) - 32;
    q[1] = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
    q[2] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
    q[3] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
}

void pgd_dequantize_row(pgd_type t, const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    float *y = dst;
    uint32_t qk = blk_elems(t);
    PGD_ASSERT(qk != 0 && n % qk == 0);
    int64_t nb = n / qk;
    switch (t) {
    case PGD_TYPE_F32: memcpy(dst, src, (size_t)n * 4); return;
    case PGD_TYPE_F16:
        for (int64_t i = 0; i < n; i++) y[i] = FP16(p + 2 * i);
        return;
    case PGD_TYPE_BF16:
        for (int64_t i = 0; i < n; i++) y[i] = pgd_bf16_to_fp32(pgd_ld_u16(p + 2 * i));
        return;
    case PGD_TYPE_Q4_0:
        for (int64_t b = 0; b < nb; b++, p += Q4_0_BYTES, y += PGD_QK) {
            float d = FP16(p);
            for (int l = 0; l < 16; l++) {
                y[l] = (float)((p[2 + l] & 0xF) - 8) * d;
                y[l + 16] = (float)((p[2 + l] >> 4) - 8) * d;
            }
        }
        return;
    case PGD_TYPE_Q4_1:
        for (int64_t b = 0; b < nb; b++, p += Q4_1_BYTES, y += PGD_QK) {
            float d = FP16(p), m = FP16(p + 2);
            for (int l = 0; l < 16; l++) {
                y[l] = (float)(p[4 + l] & 0xF) * d + m;
                y[l + 16] = (float)(p[4 + l] >> 4) * d + m;
            }
        }
        return;
    case PGD_TYPE_Q8_0:
        for (int64_t b = 0; b < nb; b++, p += Q8_0_BYTES, y += PGD_QK) {
            float d = FP16(p);
            for (int l = 0; l < PGD_QK; l++) y[l] = (float)(int8_t)p[2 + l] * d;
        }
        return;
    case PGD_TYPE_Q5_0: case PGD_TYPE_Q5_1: {
        const bool q51 = t == PGD_TYPE_Q5_1;
        const size_t bytes = q51 ? Q5_1_BYTES : Q5_0_BYTES;
        for (int64_t b = 0; b < nb; b++, p += bytes, y += PGD_QK) {
            float d = FP16(p), m = q51 ? FP16(p + 2) : 0.0f;
            uint32_t qh;
            memcpy(&qh, p + (q51 ? 4 : 2), 4);
            const uint8_t *qs = p + (q51 ? 8 : 6);
            for (int l = 0; l < 16; l++) {
                int x0 = (int)((qs[l] & 0xF) | ((qh >> l) & 1) << 4);
                int x1 = (int)((qs[l] >> 4) | ((qh >> (l + 16)) & 1) << 4);
                if (q51) {
                    y[l] = (float)x0 * d + m;
                    y[l + 16] = (float)x1 * d + m;
                } else {
                    y[l] = (float)(x0 - 16) * d;
                    y[l + 16] = (float)(x1 - 16) * d;
                }
            }
        }
        return;
    }
    case PGD_TYPE_IQ4_NL:
        for (int64_t b = 0; b < nb; b++, p += IQ4_NL_BYTES, y += PGD_QK) {
            float d = FP16(p);
            for (int l = 0; l < 16; l++) {
                y[l] = d * (float)pgd__iq4nl_grid[p[2 + l] & 0xF];
                y[l + 16] = d * (float)pgd__iq4nl_grid[p[2 + l] >> 4];
            }
        }
        return;
    case PGD_TYPE_IQ4_XS:
        for (int64_t b = 0; b < nb; b++, p += IQ4_XS_BYTES) {
            float d = FP16(p);
            uint16_t sh = pgd_ld_u16(p + 2);
            const uint8_t *qs = p + 8;
            for (int ib = 0; ib < 8; ib++, qs += 16, y += 32) {
                int ls = ((p[4 + ib / 2] >> (4 * (ib % 2))) & 0xF) | ((sh >> (2 * ib)) & 3) << 4;
                float dl = d * (float)(ls - 32);
                for (int l = 0; l < 16; l++) {
                    y[l] = dl * (float)pgd__iq4nl_grid[qs[l] & 0xF];
                    y[l + 16] = dl * (float)pgd__iq4nl_grid[qs[l] >> 4];
                }
            }
        }
        return;
    case PGD_TYPE_Q2_K: case PGD_TYPE_Q3_K: {
        /* Per 128-element half: 4 shifts x (16 + 16) elements, one scale per 16. */
        const bool q3 = t == PGD_TYPE_Q3_K;
        for (int64_t b = 0; b < nb; b++, p += q3 ? Q3_K_BYTES : Q2_K_BYTES) {
            const uint8_t *qs = p + (q3 ? 32 : 16), *hm = p;
            float d = FP16(p + (q3 ? 108 : 80)), dmin = q3 ? 0.0f : FP16(p + 82);
            for (int i = 0; i < 16; i++, y += 16) {
                const int half = i / 8, shift = 2 * ((i / 2) % 4), off = 16 * (i % 2);
                const uint8_t *q = qs + 32 * half + off;
                if (q3) {
                    float dl = d * (float)pgd__q3k_scale(p + 96, i);
                    const uint8_t m = (uint8_t)(1u << (4 * half + shift / 2));
                    for (int l = 0; l < 16; l++)
                        y[l] = dl * (float)(((q[l] >> shift) & 3) - (hm[off + l] & m ? 0 : 4));
                } else {
                    float dl = d * (float)(p[i] & 0xF), ml = dmin * (float)(p[i] >> 4);
                    for (int l = 0; l < 16; l++) y[l] = dl * (float)((q[l] >> shift) & 3) - ml;
                }
            }
        }
        return;
    }
    case PGD_TYPE_Q4_K:
    case PGD_TYPE_Q5_K: {
        const bool q5 = t == PGD_TYPE_Q5_K; /* a fifth bit per element from the qh bytes */
        for (int64_t b = 0; b < nb; b++, p += q5 ? Q5_K_BYTES : Q4_K_BYTES) {
            float d = FP16(p), dmin = FP16(p + 2);
            uint8_t sc[8], mn[8];
            unpack_k4_scales(p + 4, sc, mn);
            const uint8_t *qh = p + 16, *q = p + (q5 ? 48 : 16);
            for (int j = 0; j < 4; j++, q += 32) {
                float d1 = d * sc[2 * j], m1 = dmin * mn[2 * j];
                float d2 = d * sc[2 * j + 1], m2 = dmin * mn[2 * j + 1];
                uint8_t u1 = (uint8_t)(1u << (2 * j)), u2 = (uint8_t)(2u << (2 * j));
                for (int l = 0; l < 32; l++)
                    *y++ = d1 * (float)((q[l] & 0xF) + (q5 && (qh[l] & u1) ? 16 : 0)) - m1;
                for (int l = 0; l < 32; l++)
                    *y++ = d2 * (float)((q[l] >> 4) + (q5 && (qh[l] & u2) ? 16 : 0)) - m2;
            }
        }
        return;
    }
    case PGD_TYPE_Q6_K:
        for (int64_t b = 0; b < nb; b++, p += Q6_K_BYTES) {
            float d = FP16(p + 208);
            const uint8_t *ql = p, *qh = p + 128;
            const int8_t *sc = (const int8_t *)(p + 192);
            for (int c = 0; c < 2; c++, y += 128, ql += 64, qh += 32, sc += 8) {
                for (int l = 0; l < 32; l++) {
                    int is = l / 16;
                    int q[4];
                    q6k_unpack4(ql, qh, l, q);
                    y[l] = d * (float)sc[is] * (float)q[0];
                    y[l + 32] = d * (float)sc[is + 2] * (float)q[1];
                    y[l + 64] = d * (float)sc[is + 4] * (float)q[2];
                    y[l + 96] = d * (float)sc[is + 6] * (float)q[3];
                }
            }
        }
        return;
    case PGD_TYPE_Q8_K:
        for (int64_t b = 0; b < nb; b++, p += Q8_K_BYTES, y += PGD_QK_K) {
            float d = pgd_ld_f32(p + Q8K_D);
            for (int l = 0; l < PGD_QK_K; l++) y[l] = d * (float)(int8_t)p[Q8K_QS + l];
        }
        return;
    default: PGD_ASSERT(!"pgd_dequantize_row: unsupported type");
    }
}

bool pgd_cpu_type_supported(pgd_type t) {
    switch (t) {
    case PGD_TYPE_F32: case PGD_TYPE_F16: case PGD_TYPE_BF16:
    case PGD_TYPE_Q4_0: case PGD_TYPE_Q4_1: case PGD_TYPE_Q8_0:
    case PGD_TYPE_Q4_K: case PGD_TYPE_Q5_K: case PGD_TYPE_Q6_K:
    case PGD_TYPE_Q5_0: case PGD_TYPE_Q5_1: case PGD_TYPE_IQ4_NL:
    case PGD_TYPE_Q2_K: case PGD_TYPE_Q3_K: case PGD_TYPE_IQ4_XS: return true;
    default: return false;
    }
}

/* ---- Activation quantization ------------------------------------------------------------- */

/* -1: not read yet; 0: F32 activations; 1: 8-bit activations for every quantized type;
 * 2 (the default): 8-bit activations for the K-quants only. A relaxed atomic: the pool's
 * workers read it while the engine thread may be the first to resolve it. */
enum { INT8_UNREAD = -1, INT8_OFF = 0, INT8_ALL = 1, INT8_KQUANTS = 2 };
static atomic_int g_int8_act = INT8_UNREAD;

void pgd_cpu_set_int8_act(bool on) {
    atomic_store_explicit(&g_int8_act, on ? INT8_ALL : INT8_OFF, memory_order_relaxed);
}

int pgd_cpu_int8_act_mode(void) {
    int v = atomic_load_explicit(&g_int8_act, memory_order_relaxed);
    if (v == INT8_UNREAD) {
        const char *e = pgd_env(PGD_ENV_INT8_ACT);
        v = e == NULL || e[0] == '\0' ? INT8_KQUANTS : strcmp(e, "0") ? INT8_ALL : INT8_OFF;
        int expected = INT8_UNREAD; /* a setter that ran meanwhile wins */
        if (!atomic_compare_exchange_strong(&g_int8_act, &expected, v)) v = expected;
    }
    return v;
}

bool pgd_cpu_int8_act(void) { return pgd_cpu_int8_act_mode() == INT8_ALL; }

const char *pgd_cpu_int8_act_name(void) {
    int v = pgd_cpu_int8_act_mode();
    return v == INT8_ALL ? "int8" : v == INT8_OFF ? "F32" : "int8 (K-quants), F32 (others)";
}

pgd_type pgd_vec_dot_type(pgd_type wt) {
    int mode = pgd_cpu_int8_act_mode();
    if (mode == INT8_OFF) return PGD_TYPE_F32;
    if (mode == INT8_KQUANTS)
        return wt == PGD_TYPE_Q4_K || wt == PGD_TYPE_Q5_K || wt == PGD_TYPE_Q6_K ? PGD_TYPE_Q8_K
                                                                                 : PGD_TYPE_F32;
    switch (wt) {
    case PGD_TYPE_Q4_0: case PGD_TYPE_Q4_1: case PGD_TYPE_Q8_0: return PGD_TYPE_Q8_0;
    case PGD_TYPE_Q4_K: case PGD_TYPE_Q5_K: case PGD_TYPE_Q6_K: return PGD_TYPE_Q8_K;
    default: return PGD_TYPE_F32;
    }
}

size_t pgd_vec_dot_act_bytes(pgd_type wt, int64_t n) {
    switch (pgd_vec_dot_type(wt)) {
    case PGD_TYPE_Q8_0: return (size_t)(n / PGD_QK) * sizeof(act_q8);
    case PGD_TYPE_Q8_K: return (size_t)(n / PGD_QK_K) * Q8_K_BYTES;
    default: return (size_t)n * sizeof(float);
    }
}

/* Symmetric 8-bit: d = amax / 127, q = round-to-nearest-even(x / d) clamped to [-127, 127]
 * (never -128, so the AVX2 kernels' sign tricks cannot overflow). NaN maps to 0. */
static float q8_scale(const float *x, int n, float *id) {
    float amax = 0.0f;
    for (int i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        if (a > amax) amax = a;
    }
    float d = amax / 127.0f;
    *id = d != 0.0f ? 1.0f / d : 0.0f;
    return d;
}
static int8_t q8_round(float v) {
    if (!(v >= -127.0f)) v = v != v ? 0.0f : -127.0f;
    if (v > 127.0f) v = 127.0f;
    return (int8_t)lrintf(v);
}

/* One Q8_K block (256 activations), scalar. */
static void quantize_q8k_block(const float *x, uint8_t *y) {
    float id;
    float d = q8_scale(x, PGD_QK_K, &id);
    memcpy(y + Q8K_D, &d, 4);
    for (int g = 0; g < PGD_QK_K / 16; g++) {
        int16_t s = 0;
        for (int l = 0; l < 16; l++) {
            int8_t q = q8_round(x[16 * g + l] * id);
            y[Q8K_QS + 16 * g + l] = (uint8_t)q;
            s = (int16_t)(s + q);
        }
        memcpy(y + Q8K_BSUMS + 2 * g, &s, 2);
    }
}

#ifdef __AVX2__
/* The same block in AVX2, bit for bit: the maximum is exact in any order (a NaN never wins, as
 * in q8_scale), x * id is the same product, NaN maps to 0 and the clamp comes before rounding
 * to nearest even (vcvtps2dq in the default rounding mode, as lrintf). */
static void quantize_q8k_block_avx2(const float *x, uint8_t *y) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    for (int i = 0; i < PGD_QK_K; i += 8) /* max(a, m) gives m when a is NaN */
        m = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)), m);
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    memcpy(y + Q8K_D, &d, 4);
    const __m256 vid = _mm256_set1_ps(id);
    const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
    for (int g = 0; g < PGD_QK_K / 16; g++) {
        __m256i q[2];
        for (int h = 0; h < 2; h++) {
            __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + 16 * g + 8 * h), vid);
            v = _mm256_and_ps(v, _mm256_cmp_ps(v, v, _CMP_ORD_Q)); /* NaN -> 0 */
            v = _mm256_min_ps(_mm256_max_ps(v, lo), hi);
            q[h] = _mm256_cvtps_epi32(v);
        }
        /* 16 int32 -> 16 int16 -> 16 int8, in order */
        __m256i w = _mm256_permute4x64_epi64(_mm256_packs_epi32(q[0], q[1]), 0xD8);
        __m128i b = _mm_packs_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
        _mm_storeu_si128((__m128i *)(y + Q8K_QS + 16 * g), b);
        __m128i s = _mm_add_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
        s = _mm_add_epi16(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
        s = _mm_add_epi16(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
        s = _mm_add_epi16(s, _mm_srli_epi32(s, 16));
        const int16_t s16 = (int16_t)_mm_cvtsi128_si32(s);
        memcpy(y + Q8K_BSUMS + 2 * g, &s16, 2);
    }
}
#endif

void pgd_quantize_act_scalar(pgd_type wt, const float *x, void *dst, int64_t n) {
    if (pgd_vec_dot_type(wt) == PGD_TYPE_Q8_K) {
        PGD_ASSERT(n % PGD_QK_K == 0);
        for (int64_t b = 0; b < n / PGD_QK_K; b++)
            quantize_q8k_block(x + b * PGD_QK_K, (uint8_t *)dst + b * Q8_K_BYTES);
        return;
    }
    pgd_quantize_act(wt, x, dst, n);
}

void pgd_quantize_act(pgd_type wt, const float *x, void *dst, int64_t n) {
    switch (pgd_vec_dot_type(wt)) {
    case PGD_TYPE_Q8_0: {
        PGD_ASSERT(n % PGD_QK == 0);
        act_q8 *y = dst;
        for (int64_t b = 0; b < n / PGD_QK; b++, x += PGD_QK) {
            act_q8 blk;
            float id;
            blk.d = q8_scale(x, PGD_QK, &id);
            blk.sum = 0;
            for (int l = 0; l < PGD_QK; l++) {
                blk.qs[l] = q8_round(x[l] * id);
                blk.sum += blk.qs[l];
            }
            memcpy(&y[b], &blk, sizeof blk);
        }
        return;
    }
    case PGD_TYPE_Q8_K: {
        PGD_ASSERT(n % PGD_QK_K == 0);
        uint8_t *y = dst;
        for (int64_t b = 0; b < n / PGD_QK_K; b++, x += PGD_QK_K, y += Q8_K_BYTES)
#ifdef __AVX2__
            quantize_q8k_block_avx2(x, y);
#else
            quantize_q8k_block(x, y);
#endif
        return;
    }
    default: memcpy(dst, x, (size_t)n * sizeof(float)); return;
    }
}

void pgd_dequantize_act(pgd_type wt, const void *act, float *dst, int64_t n) {
    switch (pgd_vec_dot_type(wt)) {
    case PGD_TYPE_Q8_0: {
        const act_q8 *a = act;
        for (int64_t b = 0; b < n / PGD_QK; b++)
            for (int l = 0; l < PGD_QK; l++) dst[b * PGD_QK + l] = a[b].d * (float)a[b].qs[l];
        return;
    }
    case PGD_TYPE_Q8_K: pgd_dequantize_row(PGD_TYPE_Q8_K, act, dst, n); return;
    default: memcpy(dst, act, (size_t)n * sizeof(float)); return;
    }
}

/* ---- Scalar dot products -----------------------------------------------------------------
 * Integer products within a block are exact; each block adds one float term to a single
 * accumulator, block after block. Float weights: one accumulator, element after element. */

static float dot_f32_scalar(const uint8_t *w, const float *x, int64_t n) {
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) s += pgd_ld_f32(w + 4 * i) * x[i];
    return s;
}
static float dot_f16_scalar(const uint8_t *w, const float *x, int64_t n) {
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) s += FP16(w + 2 * i) * x[i];
    return s;
}
static float dot_bf16_scalar(const uint8_t *w, const float *x, int64_t n) {
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) s += pgd_bf16_to_fp32(pgd_ld_u16(w + 2 * i)) * x[i];
    return s;
}

/* Q8_0, Q4_0 and Q4_1 (t, a compile-time constant in each caller): Q4_0's nibbles less 8; Q4_1's
 * unsigned, plus its m times the activations' sum. */
static inline __attribute__((always_inline)) float dot_q32_scalar(const uint8_t *w,
                                                                  const act_q8 *a, int64_t nb,
                                                                  const pgd_type t) {
    const int bsz = t == PGD_TYPE_Q8_0 ? Q8_0_BYTES : t == PGD_TYPE_Q4_0 ? Q4_0_BYTES : Q4_1_BYTES;
    float s = 0.0f;
    for (int64_t b = 0; b < nb; b++, w += bsz, a++) {
        int32_t isum = 0;
        if (t == PGD_TYPE_Q8_0) {
            for (int l = 0; l < PGD_QK; l++) isum += (int8_t)w[2 + l] * a->qs[l];
        } else {
            const uint8_t *q = w + (t == PGD_TYPE_Q4_0 ? 2 : 4);
            const int off = t == PGD_TYPE_Q4_0 ? 8 : 0;
            for (int l = 0; l < 16; l++)
                isum += ((q[l] & 0xF) - off) * a->qs[l] + ((q[l] >> 4) - off) * a->qs[l + 16];
        }
        if (t == PGD_TYPE_Q4_1)
            s += FP16(w) * a->d * (float)isum + FP16(w + 2) * a->d * (float)a->sum;
        else
            s += FP16(w) * a->d * (float)isum;
    }
    return s;
}

/* sum_j mn[j] * (sum of the 32 activations of sub-block j), from Q8_K's 16-element bsums. */
static int32_t k4_min_sum(const uint8_t *act, const uint8_t mn[8]) {
    int32_t s = 0;
    for (int j = 0; j < 8; j++)
        s += mn[j] * (pgd_ld_i16(act + Q8K_BSUMS + 4 * j) + pgd_ld_i16(act + Q8K_BSUMS + 4 * j + 2));
    return s;
}

/* The float steps of a K-quant super-block, shared by every K-quant dot product with Q8_K
 * activations (scalar, AVX2, and the tiles of kq_kernels.h lane by lane):
 * s + ((d * da) * isum - (dmin * da) * msum). One statement per operation, so that no compiler
 * contracts any of them into an FMA. Q6_K passes dmin = 0 and msum = 0: the difference is then
 * (d * da) * isum exactly (x - 0 * y is x for finite y; +0 stays +0). */
static inline __attribute__((always_inline)) float kq_step(float s, float d, float dmin, float da,
                                                          int32_t isum, int32_t msum) {
    const float dd = d * da;
    const float dm = dmin * da;
    const float a = dd * (float)isum;
    const float m = dm * (float)msum;
    const float t = a - m;
    return s + t;
}

/* Q4_K and Q5_K (Q5_K: each element's fifth bit from the 32 high-bit bytes after the scales). */
static inline __attribute__((always_inline)) float dot_k45_scalar(const uint8_t *w,
                                                                  const uint8_t *a, int64_t nb,
                                                                  const bool q5) {
    const int bsz = q5 ? Q5_K_BYTES : Q4_K_BYTES;
    float s = 0.0f;
    for (int64_t b = 0; b < nb; b++, w += bsz, a += Q8_K_BYTES) {
        float da = pgd_ld_f32(a + Q8K_D);
        uint8_t sc[8], mn[8];
        unpack_k4_scales(w + 4, sc, mn);
        const uint8_t *qh = w + 16, *q = w + (q5 ? 48 : 16);
        const int8_t *x = (const int8_t *)(a + Q8K_QS);
        int32_t isum = 0;
        for (int j = 0; j < 4; j++, q += 32, x += 64) {
            int32_t s0 = 0, s1 = 0;
            for (int l = 0; l < 32; l++) {
                int h0 = q5 ? ((qh[l] >> (2 * j)) & 1) << 4 : 0;
                int h1 = q5 ? ((qh[l] >> (2 * j + 1)) & 1) << 4 : 0;
                s0 += ((q[l] & 0xF) | h0) * x[l];
                s1 += ((q[l] >> 4) | h1) * x[l + 32];
            }
            isum += sc[2 * j] * s0 + sc[2 * j + 1] * s1;
        }
        s = kq_step(s, FP16(w), FP16(w + 2), da, isum, k4_min_sum(a, mn));
    }
    return s;
}

static float dot_q6_k_scalar(const uint8_t *w, const uint8_t *a, int64_t nb) {
    float s = 0.0f;
    for (int64_t b = 0; b < nb; b++, w += Q6_K_BYTES, a += Q8_K_BYTES) {
        const uint8_t *ql = w, *qh = w + 128;
        const int8_t *sc = (const int8_t *)(w + 192);
        const int8_t *x = (const int8_t *)(a + Q8K_QS);
        int32_t isum = 0;
        for (int c = 0; c < 2; c++, ql += 64, qh += 32, sc += 8, x += 128) {
            for (int l = 0; l < 32; l++) {
                int is = l / 16;
                int q[4];
                q6k_unpack4(ql, qh, l, q);
                isum += sc[is] * q[0] * x[l] + sc[is + 2] * q[1] * x[l + 32] +
                        sc[is + 4] * q[2] * x[l + 64] + sc[is + 6] * q[3] * x[l + 96];
            }
        }
        s = kq_step(s, FP16(w + 208), 0.0f, pgd_ld_f32(a + Q8K_D), isum, 0);
    }
    return s;
}

/* Quantized weights with F32 activations: each block dequantized (pgd_dequantize_row), then
 * one accumulator, element after element. */
static float dot_deq_scalar(pgd_type t, const uint8_t *w, const float *x, int64_t n) {
    const uint32_t qk = blk_elems(t);
    const size_t bytes = blk_bytes(t);
    float buf[PGD_QK_K];
    float s = 0.0f;
    for (int64_t b = 0; b < n / qk; b++, w += bytes, x += qk) {
        pgd_dequantize_row(t, w, buf, qk);
        for (uint32_t i = 0; i < qk; i++) s += buf[i] * x[i];
    }
    return s;
}

float pgd_vec_dot_scalar(pgd_type t, const void *w_row, const void *act, int64_t n) {
    uint32_t qk = blk_elems(t);
    PGD_ASSERT(pgd_cpu_type_supported(t) && n % qk == 0);
    int64_t nb = n / qk;
    if (qk > 1 && pgd_vec_dot_type(t) == PGD_TYPE_F32) return dot_deq_scalar(t, w_row, act, n);
    switch (t) {
    case PGD_TYPE_F32: return dot_f32_scalar(w_row, act, n);
    case PGD_TYPE_F16: return dot_f16_scalar(w_row, act, n);
    case PGD_TYPE_BF16: return dot_bf16_scalar(w_row, act, n);
    case PGD_TYPE_Q8_0: return dot_q32_scalar(w_row, act, nb, PGD_TYPE_Q8_0);
    case PGD_TYPE_Q4_0: return dot_q32_scalar(w_row, act, nb, PGD_TYPE_Q4_0);
    case PGD_TYPE_Q4_1: return dot_q32_scalar(w_row, act, nb, PGD_TYPE_Q4_1);
    case PGD_TYPE_Q4_K: return dot_k45_scalar(w_row, act, nb, false);
    case PGD_TYPE_Q5_K: return dot_k45_scalar(w_row, act, nb, true);
    case PGD_TYPE_Q6_K: return dot_q6_k_scalar(w_row, act, nb);
    default: return 0.0f;
    }
}

/* ---- AVX2 + FMA dot products ---------------------------------------------------------------
 * Same integers per block as the scalar code; the float terms go into 8-lane accumulators
 * (fixed lane assignment, fixed final tree), so only the float summation order differs. */
#ifdef __AVX2__

/* Hardware fp16 -> fp32 (exact, so bit-identical to pgd_fp16_to_fp32; per-block scales are on
 * the hot path, where the software conversion's branches cost ~30% on Q4_0). */
#ifdef __F16C__
#define FP16X(p) _cvtsh_ss(pgd_ld_u16(p))
#else
#define FP16X(p) FP16(p)
#endif

/* Float weights: four 8-lane accumulators over 32 elements, then 8 at a time, then a scalar
 * tail; the combination order is fixed. `load` turns 8 weights into 8 floats. */
#define DOT_FLOAT_AVX2(NAME, ESZ, LOAD, SCALAR_ELEM)                                            \
    static float NAME(const uint8_t *w, const float *x, int64_t n) {                             \
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                              \
        int64_t i = 0;                                                                           \
        for (; i + 32 <= n; i += 32) {                                                           \
            a0 = _mm256_fmadd_ps(LOAD(w + (i + 0) * ESZ), _mm256_loadu_ps(x + i + 0), a0);      \
            a1 = _mm256_fmadd_ps(LOAD(w + (i + 8) * ESZ), _mm256_loadu_ps(x + i + 8), a1);      \
            a2 = _mm256_fmadd_ps(LOAD(w + (i + 16) * ESZ), _mm256_loadu_ps(x + i + 16), a2);    \
            a3 = _mm256_fmadd_ps(LOAD(w + (i + 24) * ESZ), _mm256_loadu_ps(x + i + 24), a3);    \
        }                                                                                        \
        for (; i + 8 <= n; i += 8)                                                               \
            a0 = _mm256_fmadd_ps(LOAD(w + i * ESZ), _mm256_loadu_ps(x + i), a0);                 \
        float tail = 0.0f;                                                                       \
        for (; i < n; i++) tail += SCALAR_ELEM(w + i * ESZ) * x[i];                              \
        return pgd_hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3))) + tail;        \
    }

static __m256 load8_f32(const uint8_t *p) { return _mm256_loadu_ps((const float *)p); }
static __m256 load8_f16(const uint8_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}
static __m256 load8_bf16(const uint8_t *p) {
    __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
}
static float elem_bf16(const uint8_t *p) { return pgd_bf16_to_fp32(pgd_ld_u16(p)); }
static float elem_f16(const uint8_t *p) { return FP16X(p); }

DOT_FLOAT_AVX2(dot_f32_avx2, 4, load8_f32, pgd_ld_f32)
DOT_FLOAT_AVX2(dot_f16_avx2, 2, load8_f16, elem_f16)
DOT_FLOAT_AVX2(dot_bf16_avx2, 2, load8_bf16, elem_bf16)

/* 8 int32 lanes of pairwise sums of x[i] * y[i], x and y signed bytes (y never -128). */
static __m256i mul_sum_i8(__m256i x, __m256i y) {
    __m256i ax = _mm256_sign_epi8(x, x);
    __m256i sy = _mm256_sign_epi8(y, x);
    return _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), _mm256_set1_epi16(1));
}
/* 8 int32 lanes of pairwise sums of x[i] * y[i], x unsigned <= 63, y signed. */
static __m256i mul_sum_u8_i8(__m256i x, __m256i y) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(x, y), _mm256_set1_epi16(1));
}
static __m256i act_qs(const act_q8 *a) { return _mm256_loadu_si256((const __m256i *)a->qs); }

/* A Q8_0 block's 32 int8 weights, or a Q4_0 block's nibbles less 8. */
static inline __attribute__((always_inline)) __m256i q8_block(const uint8_t *w, const bool q4) {
    return q4 ? _mm256_sub_epi8(pgd_nibbles32(w + 2), _mm256_set1_epi8(8))
              : _mm256_loadu_si256((const __m256i *)(w + 2));
}

/* Q8_0 and Q4_0 (signed weights): two blocks per iteration into two accumulators (hides FMA
 * latency); odd tail into acc0. */
static inline __attribute__((always_inline)) float dot_q8_avx2(const uint8_t *w, const act_q8 *a,
                                                               int64_t nb, const bool q4) {
    const int bsz = q4 ? Q4_0_BYTES : Q8_0_BYTES;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2, w += 2 * bsz, a += 2) {
        __m256i p0 = mul_sum_i8(q8_block(w, q4), act_qs(a));
        __m256i p1 = mul_sum_i8(q8_block(w + bsz, q4), act_qs(a + 1));
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(FP16X(w) * a[0].d), _mm256_cvtepi32_ps(p0), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_set1_ps(FP16X(w + bsz) * a[1].d), _mm256_cvtepi32_ps(p1),
                               acc1);
    }
    if (b < nb) {
        __m256i p0 = mul_sum_i8(q8_block(w, q4), act_qs(a));
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(FP16X(w) * a[0].d), _mm256_cvtepi32_ps(p0), acc0);
    }
    return pgd_hsum8(_mm256_add_ps(acc0, acc1));
}

/* The "+ m" term m * d_act * sum(q_act) goes into a scalar accumulator, block by block. */
static float dot_q4_1_avx2(const uint8_t *w, const act_q8 *a, int64_t nb) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;
    float accm = 0.0f;
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2, w += 2 * Q4_1_BYTES, a += 2) {
        __m256i p0 = mul_sum_u8_i8(pgd_nibbles32(w + 4), act_qs(a));
        __m256i p1 = mul_sum_u8_i8(pgd_nibbles32(w + Q4_1_BYTES + 4), act_qs(a + 1));
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(FP16X(w) * a[0].d), _mm256_cvtepi32_ps(p0), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_set1_ps(FP16X(w + Q4_1_BYTES) * a[1].d),
                               _mm256_cvtepi32_ps(p1), acc1);
        accm += FP16X(w + 2) * a[0].d * (float)a[0].sum;
        accm += FP16X(w + Q4_1_BYTES + 2) * a[1].d * (float)a[1].sum;
    }
    if (b < nb) {
        __m256i p0 = mul_sum_u8_i8(pgd_nibbles32(w + 4), act_qs(a));
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(FP16X(w) * a[0].d), _mm256_cvtepi32_ps(p0), acc0);
        accm += FP16X(w + 2) * a[0].d * (float)a[0].sum;
    }
    return pgd_hsum8(_mm256_add_ps(acc0, acc1)) + accm;
}

/* The 8 scales and 8 mins of a K-quant super-block with 32-bit word ops (ggml's utmp trick);
 * same values as unpack_k4_scales: bytes 0..7 of the result are the scales, 8..15 the mins. */
static void unpack_k4_scales_fast(const uint8_t *scales, uint32_t u[4]) {
    const uint32_t k1 = 0x3f3f3f3fu, k2 = 0x0f0f0f0fu, k3 = 0x03030303u;
    memcpy(u, scales, 12);
    u[3] = ((u[2] >> 4) & k2) | (((u[1] >> 6) & k3) << 4);
    uint32_t mins_lo = u[1] & k1;
    u[1] = (u[2] & k2) | (((u[0] >> 6) & k3) << 4);
    u[2] = mins_lo;
    u[0] &= k1;
}

/* The exact sum of 8 int32 lanes. */
static int32_t hsum_i32(__m256i v) {
    __m128i p = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    p = _mm_add_epi32(p, _mm_shuffle_epi32(p, _MM_SHUFFLE(1, 0, 3, 2)));
    p = _mm_add_epi32(p, _mm_shuffle_epi32(p, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(p);
}

/* sum_j mins[j] * (bsums[2j] + bsums[2j+1]): the same integer k4_min_sum computes. */
static int32_t k4_min_sum_avx2(const uint8_t *act, const uint32_t u[4]) {
    __m128i mins = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)&u[2]));
    __m128i b0 = _mm_loadu_si128((const __m128i *)(act + Q8K_BSUMS));
    __m128i b1 = _mm_loadu_si128((const __m128i *)(act + Q8K_BSUMS + 16));
    __m128i p = _mm_madd_epi16(mins, _mm_hadd_epi16(b0, b1));
    p = _mm_add_epi32(p, _mm_shuffle_epi32(p, _MM_SHUFFLE(1, 0, 3, 2)));
    p = _mm_add_epi32(p, _mm_shuffle_epi32(p, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(p);
}

/* Q4_K and Q5_K: per 64 elements, two sub-blocks of 32 with their own 6-bit scale (Q5_K: a
 * fifth bit per element from its 32 high-bit bytes); the mins term comes from Q8_K's bsums
 * exactly as in the scalar code. */
static inline __attribute__((always_inline)) float dot_k45_avx2(const uint8_t *w, const uint8_t *a,
                                                                int64_t nb, const bool q5) {
    const __m256i m4 = _mm256_set1_epi8(0xF), b16 = _mm256_set1_epi8(16);
    const int bsz = q5 ? Q5_K_BYTES : Q4_K_BYTES;
    float s = 0.0f;
    for (int64_t b = 0; b < nb; b++, w += bsz, a += Q8_K_BYTES) {
        float da = pgd_ld_f32(a + Q8K_D);
        uint32_t u[4];
        unpack_k4_scales_fast(w + 4, u);
        const uint8_t *sc = (const uint8_t *)u;
        const uint8_t *q = w + (q5 ? 48 : 16), *x = a + Q8K_QS;
        const __m256i hbits = q5 ? _mm256_loadu_si256((const __m256i *)(w + 16))
                                 : _mm256_setzero_si256();
        __m256i sumi = _mm256_setzero_si256();
        for (int j = 0; j < 4; j++, q += 32, x += 64) {
            __m256i bits = _mm256_loadu_si256((const __m256i *)q);
            __m256i lo = _mm256_and_si256(bits, m4);
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
            if (q5) {
                __m256i mk0 = _mm256_set1_epi8((char)(1 << (2 * j)));
                __m256i mk1 = _mm256_set1_epi8((char)(2 << (2 * j)));
                __m256i h0 = _mm256_cmpeq_epi8(_mm256_and_si256(hbits, mk0), mk0);
                __m256i h1 = _mm256_cmpeq_epi8(_mm256_and_si256(hbits, mk1), mk1);
                /* 16 where the element's fifth bit is set */
                lo = _mm256_or_si256(lo, _mm256_and_si256(h0, b16));
                hi = _mm256_or_si256(hi, _mm256_and_si256(h1, b16));
            }
            __m256i p0 = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)x));
            __m256i p1 = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(x + 32)));
            p0 = _mm256_madd_epi16(_mm256_set1_epi16(sc[2 * j]), p0);
            p1 = _mm256_madd_epi16(_mm256_set1_epi16(sc[2 * j + 1]), p1);
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p0, p1));
        }
        s = kq_step(s, FP16X(w), FP16X(w + 2), da, hsum_i32(sumi), k4_min_sum_avx2(a, u));
    }
    return s;
}

/* Q6_K: q in 0..63 via maddubs, minus 32 * (pair sums of the activations), times the int8
 * scale of each 16 elements (ggml's scheme). */
static float dot_q6_k_avx2(const uint8_t *w, const uint8_t *a, int64_t nb) {
    const __m256i m4 = _mm256_set1_epi8(0xF), m2 = _mm256_set1_epi8(3);
    const __m256i m32 = _mm256_set1_epi8(32);
    float s0 = 0.0f;
    for (int64_t b = 0; b < nb; b++, w += Q6_K_BYTES, a += Q8_K_BYTES) {
        const uint8_t *ql = w, *qh = w + 128, *x = a + Q8K_QS;
        const int8_t *sc = (const int8_t *)(w + 192);
        __m256i sumi = _mm256_setzero_si256();
        for (int c = 0; c < 2; c++, ql += 64, qh += 32, sc += 8, x += 128) {
            __m256i l1 = _mm256_loadu_si256((const __m256i *)ql);
            __m256i l2 = _mm256_loadu_si256((const __m256i *)(ql + 32));
            __m256i h = _mm256_loadu_si256((const __m256i *)qh);
            /* high 2 bits of element groups 0..3, already shifted to bits 4..5 */
            __m256i h0 = _mm256_slli_epi16(_mm256_and_si256(h, m2), 4);
            __m256i h1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2), m2), 4);
            __m256i h2 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 4), m2), 4);
            __m256i h3 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 6), m2), 4);
            __m256i q[4];
            q[0] = _mm256_or_si256(_mm256_and_si256(l1, m4), h0);
            q[1] = _mm256_or_si256(_mm256_and_si256(l2, m4), h1);
            q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4), h2);
            q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l2, 4), m4), h3);
            for (int k = 0; k < 4; k++) {
                __m256i xv = _mm256_loadu_si256((const __m256i *)(x + 32 * k));
                __m256i p = _mm256_sub_epi16(_mm256_maddubs_epi16(q[k], xv),
                                             _mm256_maddubs_epi16(m32, xv));
                __m256i s =
                    _mm256_set_m128i(_mm_set1_epi16(sc[2 * k + 1]), _mm_set1_epi16(sc[2 * k]));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(s, p));
            }
        }
        s0 = kq_step(s0, FP16X(w + 208), 0.0f, pgd_ld_f32(a + Q8K_D), hsum_i32(sumi), 0);
    }
    return s0;
}

#endif /* __AVX2__ */

float pgd_vec_dot(pgd_type t, const void *w_row, const void *act, int64_t n) {
#ifdef __AVX2__
    uint32_t qk = blk_elems(t);
    PGD_ASSERT(pgd_cpu_type_supported(t) && n % qk == 0);
    int64_t nb = n / qk;
#ifdef PGD_F32ACT_SIMD
    if (qk > 1 && pgd_vec_dot_type(t) == PGD_TYPE_F32) {
        float y;
        pgd__f32act_tile g = {.w = w_row, .x = act, .y = &y, .n = n};
        switch (t) {
        case PGD_TYPE_Q8_0: pgd__f32act_tile_run(&g, PGD_TYPE_Q8_0, 1, 1); break;
        case PGD_TYPE_Q4_0: pgd__f32act_tile_run(&g, PGD_TYPE_Q4_0, 1, 1); break;
        case PGD_TYPE_Q4_1: pgd__f32act_tile_run(&g, PGD_TYPE_Q4_1, 1, 1); break;
        case PGD_TYPE_Q4_K: pgd__f32act_tile_run(&g, PGD_TYPE_Q4_K, 1, 1); break;
        case PGD_TYPE_Q5_K: pgd__f32act_tile_run(&g, PGD_TYPE_Q5_K, 1, 1); break;
        case PGD_TYPE_Q6_K: pgd__f32act_tile_run(&g, PGD_TYPE_Q6_K, 1, 1); break;
        case PGD_TYPE_Q5_0: pgd__f32act_tile_run(&g, PGD_TYPE_Q5_0, 1, 1); break;
        case PGD_TYPE_Q5_1: pgd__f32act_tile_run(&g, PGD_TYPE_Q5_1, 1, 1); break;
        case PGD_TYPE_IQ4_NL: pgd__f32act_tile_run(&g, PGD_TYPE_IQ4_NL, 1, 1); break;
        case PGD_TYPE_Q2_K: pgd__f32act_tile_run(&g, PGD_TYPE_Q2_K, 1, 1); break;
        case PGD_TYPE_Q3_K: pgd__f32act_tile_run(&g, PGD_TYPE_Q3_K, 1, 1); break;
        default: pgd__f32act_tile_run(&g, PGD_TYPE_IQ4_XS, 1, 1); break;
        }
        return y;
    }
#else
    if (qk > 1 && pgd_vec_dot_type(t) == PGD_TYPE_F32) return pgd_vec_dot_scalar(t, w_row, act, n);
#endif
    switch (t) {
    case PGD_TYPE_F32: return dot_f32_avx2(w_row, act, n);
    case PGD_TYPE_F16: return dot_f16_avx2(w_row, act, n);
    case PGD_TYPE_BF16: return dot_bf16_avx2(w_row, act, n);
    case PGD_TYPE_Q8_0: return dot_q8_avx2(w_row, act, nb, false);
    case PGD_TYPE_Q4_0: return dot_q8_avx2(w_row, act, nb, true);
    case PGD_TYPE_Q4_1: return dot_q4_1_avx2(w_row, act, nb);
    case PGD_TYPE_Q4_K: return dot_k45_avx2(w_row, act, nb, false);
    case PGD_TYPE_Q5_K: return dot_k45_avx2(w_row, act, nb, true);
    case PGD_TYPE_Q6_K: return dot_q6_k_avx2(w_row, act, nb);
    default: return 0.0f;
    }
#else
    return pgd_vec_dot_scalar(t, w_row, act, n);
#endif
}
