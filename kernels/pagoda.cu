// Pagoda's CUDA kernels: embedding gather, RMSNorm (+residual), fused dequantize-GEMV for
// F32/F16/BF16/Q8_0/Q4_0/Q4_1 weights and the other GGUF types (qblocks.h), dequantize-to-BF16
// for the cuBLASLt GEMM path, bias, RoPE (NORM/NEOX, per-token positions, frequency factors
// folded into inv_freq), paged K/V store, paged attention (flash-decoding splits, each K/V row
// loaded once per GQA group, online softmax), SiLU-gate, add, row gather, and a copy kernel that
// measures HBM bandwidth.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "kernels.h"
#include "qblocks.h"
#include "launch.cuh"

enum { T_F32 = 0, T_F16 = 1, T_Q4_0 = 2, T_Q4_1 = 3, T_Q8_0 = 8, T_BF16 = 30 };

static __device__ __forceinline__ float h2f(const uint8_t *p) {
    __half h;
    memcpy(&h, p, 2);
    return __half2float(h);
}
static __device__ __forceinline__ float bf2f(uint16_t v) { return __uint_as_float((uint32_t)v << 16); }

// Elements per block of 32 in every supported type: block b of a row -> 32 floats (tail-safe for
// the float types, whose rows need not be a multiple of 32; a K-quant or IQ4_XS row is whole
// super-blocks of 256, 8 blocks each).
static __device__ __forceinline__ void load_block(int type, const uint8_t *row, int64_t b,
                                                  int64_t n_in, float out[32]) {
    switch (type) {
    case T_Q8_0: {
        const uint8_t *p = row + b * 34;
        float d = h2f(p);
        const int8_t *q = (const int8_t *)(p + 2);
#pragma unroll
        for (int j = 0; j < 32; j++) out[j] = d * (float)q[j];
        break;
    }
    case T_Q4_0: {
        const uint8_t *p = row + b * 18;
        float d = h2f(p);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            uint8_t q = p[2 + j];
            out[j] = d * (float)((int)(q & 0xF) - 8);
            out[j + 16] = d * (float)((int)(q >> 4) - 8);
        }
        break;
    }
    case T_Q4_1: {
        const uint8_t *p = row + b * 20;
        float d = h2f(p), m = h2f(p + 2);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            uint8_t q = p[4 + j];
            out[j] = d * (float)(q & 0xF) + m;
            out[j + 16] = d * (float)(q >> 4) + m;
        }
        break;
    }
    default: {
        if (pgd_qb_is(type)) { // Q5_0 ... IQ4_XS: qblocks.h, tested on the host
            pgd_qb_sub32(type, row, b, out);
            break;
        }
        for (int j = 0; j < 32; j++) {
            int64_t i = b * 32 + j;
            if (i >= n_in) {
                out[j] = 0.0f;
                continue;
            }
            if (type == T_F32) out[j] = ((const float *)row)[i];
            else if (type == T_F16) out[j] = h2f(row + 2 * i);
            else out[j] = bf2f(((const uint16_t *)row)[i]);
        }
    }
    }
}

__global__ void k_embed(int type, const uint8_t *w, size_t row_bytes, int64_t n_rows_w,
                        int32_t vocab_lo, const int32_t *tokens, int dim, float *x) {
    pdl_enter();
    int t = blockIdx.x;
    int64_t r = (int64_t)tokens[t] - vocab_lo;
    float *xt = x + (size_t)t * dim;
    int64_t nb = (dim + 31) / 32;
    for (int64_t b = threadIdx.x; b < nb; b += blockDim.x) {
        float v[32];
        if (r < 0 || r >= n_rows_w) {
            for (int j = 0; j < 32; j++) v[j] = 0.0f;
        } else {
            load_block(type, w + (size_t)r * row_bytes, b, dim, v);
        }
        for (int j = 0; j < 32 && b * 32 + j < dim; j++) xt[b * 32 + j] = v[j];
    }
}

static __device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// silu(x) * u, the SiLU-gate (k_silu_gate, and the gated GEMV's epilogue)
static __device__ __forceinline__ float silu_mul(float x, float u) {
    return x / (1.0f + __expf(-x)) * u;
}

static __device__ float block_sum(float v) {
    __shared__ float sh[32];
    v = warp_sum(v);
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    int nw = (blockDim.x + 31) / 32;
    v = threadIdx.x < nw ? sh[threadIdx.x] : 0.0f;
    if (wid == 0) v = warp_sum(v);
    if (threadIdx.x == 0) sh[0] = v;
    __syncthreads();
    float r = sh[0];
    __syncthreads();
    return r;
}

// One block per row: x += d (when d), then out = w * x / rms(x). Each thread holds RMS_VEC
// elements in registers, all loaded before any store (a decode step normalizes one row: the block
// is latency-bound, so its loads are issued together); rows longer than RMS_VEC * blockDim.x
// finish in a plain loop. ob, when not NULL, receives out in BF16 as well (the next matmuls'
// GEMM input).
#define RMS_VEC 4
__global__ void k_rms_norm(float *x, const float *__restrict__ d, const float *__restrict__ w,
                           float *__restrict__ out, __nv_bfloat16 *__restrict__ ob, int dim,
                           float eps) {
    pdl_enter();
    float *xr = x + (size_t)blockIdx.x * dim;
    const float *dr = d ? d + (size_t)blockIdx.x * dim : nullptr;
    float *o = out + (size_t)blockIdx.x * dim;
    __nv_bfloat16 *obr = ob ? ob + (size_t)blockIdx.x * dim : nullptr;
    float v[RMS_VEC], ss = 0.0f;
#pragma unroll
    for (int k = 0; k < RMS_VEC; k++) {
        int i = threadIdx.x + k * blockDim.x;
        v[k] = i < dim ? (dr ? xr[i] + dr[i] : xr[i]) : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < RMS_VEC; k++) {
        int i = threadIdx.x + k * blockDim.x;
        if (dr && i < dim) xr[i] = v[k];
        ss += v[k] * v[k];
    }
    int rest = RMS_VEC * blockDim.x;
    for (int i = threadIdx.x + rest; i < dim; i += blockDim.x) {
        float a = xr[i];
        if (dr) {
            a += dr[i];
            xr[i] = a;
        }
        ss += a * a;
    }
    ss = block_sum(ss);
    float scale = rsqrtf(ss / (float)dim + eps);
#pragma unroll
    for (int k = 0; k < RMS_VEC; k++) {
        int i = threadIdx.x + k * blockDim.x;
        if (i < dim) {
            float r = w[i] * (v[k] * scale);
            o[i] = r;
            if (obr) obr[i] = __float2bfloat16(r);
        }
    }
    for (int i = threadIdx.x + rest; i < dim; i += blockDim.x) {
        float r = w[i] * (xr[i] * scale);
        o[i] = r;
        if (obr) obr[i] = __float2bfloat16(r);
    }
}

// Qwen3's QK-norm: one warp per head (a row of hd), in place. Rows [0, n * n_head) are the
// heads of q, the rest those of k; each lane reads its elements, the warp sums their squares, and
// each lane writes back the elements it read (so in place is safe without a barrier).
#define QKN_WARPS 4
__global__ void k_qk_norm(float *q, float *k, const float *__restrict__ wq,
                          const float *__restrict__ wk, int n_q_rows, int n_rows, int hd,
                          float eps) {
    pdl_enter();
    int r = blockIdx.x * QKN_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (r >= n_rows) return;
    bool is_q = r < n_q_rows;
    float *x = is_q ? q + (size_t)r * hd : k + (size_t)(r - n_q_rows) * hd;
    const float *w = is_q ? wq : wk;
    float ss = 0.0f;
    for (int i = lane; i < hd; i += 32) ss += x[i] * x[i];
    float scale = rsqrtf(warp_sum(ss) / (float)hd + eps);
    for (int i = lane; i < hd; i += 32) x[i] = w[i] * (x[i] * scale);
}

// Fused dequantize-GEMV: one warp per output row, lanes stride over blocks of 32 weights, each
// weight byte read once for up to 8 tokens.
#define GEMV_MAX_N 8
__global__ void k_gemv(int type, const uint8_t *w, size_t row_bytes, int64_t n_in, int64_t n_out,
                       const float *x, float *y, int n) {
    pdl_enter();
    int64_t row = (int64_t)blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (row >= n_out) return;
    const uint8_t *wr = w + (size_t)row * row_bytes;
    float acc[GEMV_MAX_N];
#pragma unroll
    for (int t = 0; t < GEMV_MAX_N; t++) acc[t] = 0.0f;
    int64_t nb = (n_in + 31) / 32;
    for (int64_t b = lane; b < nb; b += 32) {
        float v[32];
        load_block(type, wr, b, n_in, v);
        for (int t = 0; t < n; t++) {
            const float *xt = x + (size_t)t * n_in + b * 32;
            float s = 0.0f;
            int lim = (int)((n_in - b * 32) < 32 ? (n_in - b * 32) : 32);
            for (int j = 0; j < lim; j++) s += v[j] * xt[j];
            acc[t] += s;
        }
    }
    for (int t = 0; t < n; t++) {
        float s = warp_sum(acc[t]);
        if (lane == 0) y[(size_t)t * n_out + row] = s;
    }
}

// The same for 16-bit float weights with rows of a multiple of 8 elements: each lane reads 16
// bytes (8 weights) at a time, a warp 512 contiguous bytes per load instruction, 4 loads in
// flight per lane; decode is a stream of the weights, so the loads bypass L1.
static __device__ __forceinline__ void unpack8(uint4 u, bool f16, float w[8]) {
    uint32_t v[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        if (f16) {
            __half2 h;
            memcpy(&h, &v[i], 4);
            float2 f = __half22float2(h);
            w[2 * i] = f.x;
            w[2 * i + 1] = f.y;
        } else {
            w[2 * i] = __uint_as_float(v[i] << 16);
            w[2 * i + 1] = __uint_as_float(v[i] & 0xFFFF0000u);
        }
    }
}

static __device__ __forceinline__ void prefetch_l2(const void *p) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

static __device__ __forceinline__ uint4 ld_stream16(const uint4 *p) {
    uint4 u;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
        : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w)
        : "l"(p));
    return u;
}

// Up to PGD_K_GEMV_GROUP matrices that read the same x (Q, K and V; gate and up) in one grid:
// matrix m owns the blocks from first[m] (one launch instead of several, and no wave tail
// between them). NT tokens is a template bound: the token loop has no runtime exit, so the four
// loads of a group are issued before the FMAs that use them.
#define GEMV16_LOADS 4
#define GEMV16_ROWS 4 /* rows per block: one warp each */
struct gemv16_group {
    const uint4 *w[PGD_K_GEMV_GROUP];
    float *y[PGD_K_GEMV_GROUP];
    int64_t n_out[PGD_K_GEMV_GROUP];
    unsigned first[PGD_K_GEMV_GROUP];
    int n;
};
// GATED: the group is gate and up (same n_out) and each warp computes row r of both, then writes
// silu(gate) * up over the gate row (silu_mul, as k_silu_gate) and up as it is: the SiLU-gate
// kernel of a decode step folded into the matmuls before it.
template <int NT, bool GATED>
__global__ void k_gemv16(bool f16, gemv16_group g, int64_t n_in, const float *x, int t0) {
    const uint4 *w = g.w[0];
    float *y = g.y[0];
    int64_t n_out = g.n_out[0];
    unsigned b0 = 0;
#pragma unroll
    for (int m = 1; m < PGD_K_GEMV_GROUP; m++) {
        if (!GATED && m < g.n && blockIdx.x >= g.first[m]) {
            w = g.w[m];
            y = g.y[m];
            n_out = g.n_out[m];
            b0 = g.first[m];
        }
    }
    int64_t row = (int64_t)(blockIdx.x - b0) * GEMV16_ROWS + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (row >= n_out) return;
    int64_t n8 = n_in / 8;
    constexpr int R = GATED ? 2 : 1; /* weight rows per warp */
    const uint4 *wr[R];
    wr[0] = w + row * n8;
    if (GATED) wr[R - 1] = g.w[1] + row * n8;
    // Before the kernel ahead has finished (PDL): the first loads' lines into L2, one hint per
    // 128-byte line (weights: no kernel writes them).
    if ((lane & 7) == 0) {
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int k = 0; k < GEMV16_LOADS; k++)
                if (lane + 32 * k < n8) prefetch_l2(wr[r] + lane + 32 * k);
    }
    pdl_enter();
    float acc[R][NT];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = 0.0f;
    for (int64_t c0 = lane; c0 < n8; c0 += 32 * GEMV16_LOADS) {
        uint4 u[R][GEMV16_LOADS];
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int k = 0; k < GEMV16_LOADS; k++) {
                int64_t c = c0 + 32 * k;
                u[r][k] = c < n8 ? ld_stream16(wr[r] + c) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
        for (int k = 0; k < GEMV16_LOADS; k++) {
            int64_t c = c0 + 32 * k;
            if (c < n8) {
#pragma unroll
                for (int r = 0; r < R; r++) {
                    float wf[8];
                    unpack8(u[r][k], f16, wf);
#pragma unroll
                    for (int t = 0; t < NT; t++) {
                        const float4 *xv = (const float4 *)(x + (size_t)t * n_in + c * 8);
                        float4 a = xv[0], b = xv[1];
                        acc[r][t] += wf[0] * a.x + wf[1] * a.y + wf[2] * a.z + wf[3] * a.w +
                                     wf[4] * b.x + wf[5] * b.y + wf[6] * b.z + wf[7] * b.w;
                    }
                }
            }
        }
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        float s = warp_sum(acc[0][t]);
        size_t at = (size_t)(t0 + t) * n_out + row;
        if (GATED) {
            float su = warp_sum(acc[R - 1][t]);
            if (lane == 0) {
                y[at] = silu_mul(s, su);
                g.y[1][at] = su;
            }
        } else if (lane == 0) {
            y[at] = s;
        }
    }
}

__global__ void k_dequant_bf16(int type, const uint8_t *w, size_t row_bytes, int64_t n_in,
                               int64_t n_out, __nv_bfloat16 *dst) {
    pdl_enter();
    int64_t nb = (n_in + 31) / 32;
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= nb * n_out) return;
    int64_t row = i / nb, b = i % nb;
    float v[32];
    load_block(type, w + (size_t)row * row_bytes, b, n_in, v);
    for (int j = 0; j < 32 && b * 32 + j < n_in; j++)
        dst[row * n_in + b * 32 + j] = __float2bfloat16(v[j]);
}

__global__ void k_f32_to_bf16(const float *x, __nv_bfloat16 *d, size_t n) {
    pdl_enter();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) d[i] = __float2bfloat16(x[i]);
}

__global__ void k_add_bias(float *y, const float *b, int n_rows, int dim) {
    pdl_enter();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (size_t)n_rows * dim) y[i] += b[i % dim];
}

// The rotation of pair i (of hd / 2) of one head at position p: its two element indices and
// rotated values. k_rope and k_rope_kv_store both use it, so they agree bit for bit.
struct rope_pair {
    int i0, i1;
    float r0, r1;
};
static __device__ __forceinline__ rope_pair rotate(const float *head, int i, int hd, int neox,
                                                   float p, const float *inv_freq) {
    int half = hd / 2;
    float ang = p * inv_freq[i];
    float cs = cosf(ang), sn = sinf(ang);
    rope_pair r;
    r.i0 = neox ? i : 2 * i;
    r.i1 = neox ? i + half : 2 * i + 1;
    float a = head[r.i0], b = head[r.i1];
    r.r0 = a * cs - b * sn;
    r.r1 = b * cs + a * sn;
    return r;
}

__global__ void k_rope(float *x, int n_heads, int hd, int neox, const int32_t *pos,
                       const float *inv_freq) {
    pdl_enter();
    int t = blockIdx.x, half = hd / 2;
    for (int k = threadIdx.x; k < n_heads * half; k += blockDim.x) {
        int h = k / half, i = k % half;
        float *v = x + ((size_t)t * n_heads + h) * hd;
        rope_pair r = rotate(v, i, hd, neox, (float)pos[t], inv_freq);
        v[r.i0] = r.r0;
        v[r.i1] = r.r1;
    }
}

static __device__ __forceinline__ void store_elem(int dt, void *base, size_t i, float v) {
    if (dt == T_F32) ((float *)base)[i] = v;
    else if (dt == T_F16) ((__half *)base)[i] = __float2half(v);
    else ((__nv_bfloat16 *)base)[i] = __float2bfloat16(v);
}
__global__ void k_kv_store(int dt, void *k, void *v, int kv_dim, const float *kin,
                           const float *vin, const int64_t *slot) {
    pdl_enter();
    int t = blockIdx.x;
    if (slot[t] < 0) return; // a padding row of a graph-sized step
    size_t base = (size_t)slot[t] * kv_dim;
    for (int i = threadIdx.x; i < kv_dim; i += blockDim.x) {
        store_elem(dt, k, base + i, kin[(size_t)t * kv_dim + i]);
        store_elem(dt, v, base + i, vin[(size_t)t * kv_dim + i]);
    }
}

// RoPE on Q in place and on K on its way into the cache, V stored beside it: one block per
// token, the rotation as k_rope computes it (same angle and operation order).
// Grid (tokens, n_head + 2 * n_kv_head): block y ropes query head y, then K head y - n_head
// (stored), then copies V head y - n_head - n_kv_head; a thread per rotated pair. (One block per
// token walked every head in turn: a decode step's single block was latency-bound.)
__global__ void k_rope_kv_store(float *q, const float *kin, const float *vin, int n_head,
                                int n_kv_head, int hd, int neox, const int32_t *pos,
                                const float *inv_freq, int dt, void *k, void *v, int kv_dim,
                                const int64_t *slot) {
    pdl_enter();
    int t = blockIdx.x, y = blockIdx.y, half = hd / 2;
    float p = (float)pos[t];
    if (y < n_head) {
        float *x = q + ((size_t)t * n_head + y) * hd;
        for (int i = threadIdx.x; i < half; i += blockDim.x) {
            rope_pair r = rotate(x, i, hd, neox, p, inv_freq);
            x[r.i0] = r.r0;
            x[r.i1] = r.r1;
        }
        return;
    }
    if (slot[t] < 0) return; // a padding row of a graph-sized step
    size_t base = (size_t)slot[t] * kv_dim;
    int h = y - n_head;
    if (h < n_kv_head) {
        const float *x = kin + ((size_t)t * n_kv_head + h) * hd;
        for (int i = threadIdx.x; i < half; i += blockDim.x) {
            rope_pair r = rotate(x, i, hd, neox, p, inv_freq);
            store_elem(dt, k, base + (size_t)h * hd + r.i0, r.r0);
            store_elem(dt, k, base + (size_t)h * hd + r.i1, r.r1);
        }
        return;
    }
    h -= n_kv_head;
    for (int i = threadIdx.x; i < hd; i += blockDim.x)
        store_elem(dt, v, base + (size_t)h * hd + i, vin[(size_t)t * kv_dim + (size_t)h * hd + i]);
}

// Paged attention. Grid (n_tokens * n_kv_head, n_splits), 4 warps. Each warp walks positions of
// the block's split (j = start + warp, + 4, ...), loads each K/V row once and scores it for every
// query head of the GQA group; lanes own hd/32 dimensions. Online softmax per warp, merged in
// shared memory, then per split into `part`; k_attn_combine merges the splits.
#define ATT_WARPS 4
#define ATT_MAXG 16 /* GQA group size, at most */
#define ATT_MAXD 8 /* head_dim / 32, at most (head_dim <= 256) */
// GM >= the GQA group size and ND >= head_dim / 32 are compile-time bounds, so the per-head
// arrays live in registers (runtime bounds put them in local memory). DT, the KV cache's type, is
// one too: K/V elements are loaded as raw bits and converted where they are used, so a warp's
// loads are all in flight together (a conversion chosen at run time next to each load kept one
// load in flight: ~7 us per 4 positions on an H200).
template <int DT> struct kv_elem {
    typedef unsigned short raw;
    static __device__ __forceinline__ float f(raw h) {
        return DT == T_F16 ? __half2float(__ushort_as_half(h)) : __uint_as_float((unsigned)h << 16);
    }
};
template <> struct kv_elem<T_F32> {
    typedef float raw;
    static __device__ __forceinline__ float f(raw x) { return x; }
};
static __device__ __forceinline__ int split_len_of(const pgd_k_attn &a, int p) {
    return pgd_k_split_len(a.n_splits, a.split_len, p);
}

template <int GM, int ND, int DT> __global__ void k_attention(pgd_k_attn a) {
    pdl_enter();
    typedef typename kv_elem<DT>::raw raw;
    const raw *K = (const raw *)a.k, *V = (const raw *)a.v;
    int w = blockIdx.x, split = blockIdx.y;
    int idx = w / a.n_kv_head, kvh = w % a.n_kv_head;
    int t = a.tok_list ? a.tok_list[idx] : idx;
    int G = a.n_head / a.n_kv_head, hd = a.hd;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int p = a.pos[t], len = split_len_of(a, p);
    int start = split * len, end = min(p + 1, start + len);
    if (start > p) return; /* past the token's context: k_attn_combine stops before it */
    const int32_t *bt = a.tables + (size_t)a.seq[t] * a.table_stride;
    float scale = rsqrtf((float)hd);
    float q[GM][ND], acc[GM][ND], m[GM], l[GM];
#pragma unroll
    for (int g = 0; g < GM && g < G; g++) {
        const float *qg = a.q + ((size_t)t * a.n_head + (size_t)kvh * G + g) * hd;
#pragma unroll
        for (int d = 0; d < ND; d++) {
            int i = d * 32 + lane;
            q[g][d] = i < hd ? qg[i] * scale : 0.0f;
            acc[g][d] = 0.0f;
        }
        m[g] = -INFINITY;
        l[g] = 0.0f;
    }
    // A warp takes positions j, j + ATT_WARPS, ... in that order; U of them are loaded before
    // the first is scored (U loads in flight: one position at a time left a decode step's warps
    // waiting on memory), fewer when the per-head arrays already fill the registers.
    constexpr int U = GM * ND <= 32 ? 4 : GM * ND <= 64 ? 2 : 1;
    for (int j0 = start + warp; j0 < end; j0 += ATT_WARPS * U) {
        raw kr[U][ND], vr[U][ND];
        size_t base[U]; /* every position's table entry first, then all the K/V loads */
#pragma unroll
        for (int u = 0; u < U; u++) {
            int j = j0 + u * ATT_WARPS;
            base[u] = j < end ? ((size_t)bt[j / a.block_size] * a.block_size +
                                 (size_t)(j % a.block_size)) * a.kv_dim + (size_t)kvh * hd
                              : 0;
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            int j = j0 + u * ATT_WARPS;
#pragma unroll
            for (int d = 0; d < ND; d++) {
                int i = d * 32 + lane;
                bool in = j < end && i < hd;
                kr[u][d] = in ? K[base[u] + i] : (raw)0;
                vr[u][d] = in ? V[base[u] + i] : (raw)0;
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (j0 + u * ATT_WARPS >= end) break; // the same for the whole warp
#pragma unroll
            for (int g = 0; g < GM && g < G; g++) {
                float s = 0.0f;
#pragma unroll
                for (int d = 0; d < ND; d++) s += q[g][d] * kv_elem<DT>::f(kr[u][d]);
                s = warp_sum(s);
                float mn = fmaxf(m[g], s), corr = __expf(m[g] - mn), pr = __expf(s - mn);
                l[g] = l[g] * corr + pr;
#pragma unroll
                for (int d = 0; d < ND; d++)
                    acc[g][d] = acc[g][d] * corr + pr * kv_elem<DT>::f(vr[u][d]);
                m[g] = mn;
            }
        }
    }
    // merge the warps: shared (ATT_WARPS, G, hd + 2)
    extern __shared__ float sh[];
    int stride = hd + 2;
#pragma unroll
    for (int g = 0; g < GM && g < G; g++) {
        float *o = sh + ((size_t)warp * G + g) * stride;
#pragma unroll
        for (int d = 0; d < ND; d++) {
            int i = d * 32 + lane;
            if (i < hd) o[i] = acc[g][d];
        }
        if (lane == 0) {
            o[hd] = m[g];
            o[hd + 1] = l[g];
        }
    }
    __syncthreads();
    for (int k = threadIdx.x; k < G * hd; k += blockDim.x) {
        int g = k / hd, i = k % hd;
        float M = -INFINITY;
        for (int wv = 0; wv < ATT_WARPS; wv++) M = fmaxf(M, sh[((size_t)wv * G + g) * stride + hd]);
        float L = 0.0f, A = 0.0f;
        for (int wv = 0; wv < ATT_WARPS; wv++) {
            const float *o = sh + ((size_t)wv * G + g) * stride;
            float f = o[hd] == -INFINITY ? 0.0f : __expf(o[hd] - M);
            L += o[hd + 1] * f;
            A += o[i] * f;
        }
        float *dst = a.part +
                     (((size_t)idx * a.n_head + (size_t)kvh * G + g) * a.n_splits + split) * stride;
        dst[i] = A;
        if (i == 0) {
            dst[hd] = M;
            dst[hd + 1] = L;
        }
    }
}

// One block per (token, head). The splits' maxima are loaded by all threads at once into shared
// memory (n_splits floats), the first warp turns them into weights exp(m_s - M) (a warp max),
// then every thread sums its dimensions over the splits in split order with 16 splits' loads in
// flight (a serial walk over the splits left the kernel waiting on one load at a time).
__global__ void k_attn_combine(pgd_k_attn a) {
    pdl_enter();
    extern __shared__ float wts[];
    int th = blockIdx.x; // list index * n_head + head
    int hd = a.hd, stride = hd + 2;
    int idx = th / a.n_head, h = th % a.n_head;
    int t = a.tok_list ? a.tok_list[idx] : idx;
    int p = a.pos[t], len = split_len_of(a, p), S = pgd_k_splits_used(len, p);
    const float *pp = a.part + (size_t)th * a.n_splits * stride;
    for (int s = threadIdx.x; s < S; s += blockDim.x) wts[s] = pp[(size_t)s * stride + hd];
    __syncthreads();
    if (threadIdx.x < 32) {
        float M = -INFINITY;
        for (int s = threadIdx.x; s < S; s += 32) M = fmaxf(M, wts[s]);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
        for (int s = threadIdx.x; s < S; s += 32)
            wts[s] = wts[s] == -INFINITY ? 0.0f : __expf(wts[s] - M);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        float L = 0.0f, A = 0.0f;
#pragma unroll 16
        for (int s = 0; s < S; s++) {
            const float *o = pp + (size_t)s * stride;
            float f = wts[s];
            L += o[hd + 1] * f;
            A += o[i] * f;
        }
        a.out[((size_t)t * a.n_head + h) * hd + i] = A / L;
    }
}

// gb, when not NULL, receives the result in BF16 as well (the next matmul's GEMM input).
__global__ void k_silu_gate(float *g, const float *u, size_t n, __nv_bfloat16 *gb) {
    pdl_enter();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float r = silu_mul(g[i], u[i]);
        g[i] = r;
        if (gb) gb[i] = __float2bfloat16(r);
    }
}

__global__ void k_add(float *x, const float *y, size_t n) {
    pdl_enter();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i];
}

__global__ void k_gather_rows(const float *src, float *dst, int dim, const int32_t *rows) {
    pdl_enter();
    int r = blockIdx.x;
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        dst[(size_t)r * dim + i] = src[(size_t)rows[r] * dim + i];
}

__global__ void k_copy(const int4 *src, int4 *dst, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = src[i];
}

static unsigned blocks(size_t n, unsigned bs) { return (unsigned)((n + bs - 1) / bs); }
#define LAUNCHED() ((int)cudaGetLastError())

int pgd_k_pdl;

extern "C" {

void pgd_k_set_pdl(int on) {
    // Only where the code that runs has pdl_wait() in it: a build for sm_80 alone runs its
    // compute_80 code on a 9.0 device, and kernels launched with the attribute but no
    // griddepcontrol.wait would read their inputs before the kernel ahead has written them.
    cudaFuncAttributes fa;
    if (on && cudaFuncGetAttributes(&fa, k_embed) != cudaSuccess) {
        (void)cudaGetLastError();
        fa.ptxVersion = 0;
    }
    if (on && fa.ptxVersion < 90) {
        fprintf(stderr, "pagoda: CUDA programmatic dependent launch off: the kernels running "
                "were built for compute_%d, not 90 or later\n", fa.ptxVersion);
        on = 0;
    }
    pgd_k_pdl = on;
}

int pgd_k_embed(pgd_stream s, int type, const void *w, size_t row_bytes, int64_t n_rows_w,
                int32_t vocab_lo, const int32_t *tokens, int n, int dim, float *x) {
    return (int)klaunch(k_embed, n, 128, 0, s, type, (const uint8_t *)w, row_bytes, n_rows_w,
                        vocab_lo, tokens, dim, x);
}

int pgd_k_rms_norm(pgd_stream s, float *x, const float *d, const float *w, float *out,
                   uint16_t *out_bf16, int n_rows, int dim, float eps) {
    int threads = (dim + RMS_VEC - 1) / RMS_VEC;
    threads = threads < 32 ? 32 : threads > 1024 ? 1024 : (threads + 31) / 32 * 32;
    return (int)klaunch(k_rms_norm, n_rows, threads, 0, s, x, d, w, out,
                        (__nv_bfloat16 *)out_bf16, dim, eps);
}

int pgd_k_qk_norm(pgd_stream s, float *q, float *k, const float *wq, const float *wk, int n,
                  int n_head, int n_kv_head, int hd, float eps) {
    int n_q = n * n_head, rows = n_q + n * n_kv_head;
    if (rows <= 0) return (int)cudaSuccess;
    return (int)klaunch(k_qk_norm, (rows + QKN_WARPS - 1) / QKN_WARPS, 32 * QKN_WARPS, 0, s, q, k,
                        wq, wk, n_q, rows, hd, eps);
}

static bool gemv16_ok(int type, const void *w, size_t row_bytes, int64_t n_in) {
    return (type == T_BF16 || type == T_F16) && n_in % 8 == 0 && row_bytes == (size_t)n_in * 2 &&
           ((uintptr_t)w & 15) == 0;
}

int pgd_k_gemv_group(pgd_stream s, int type, int64_t n_in, const pgd_k_gemv_mat *m, int n_mats,
                     const float *x, int n, int gated) {
    if (n_mats < 1 || n_mats > PGD_K_GEMV_GROUP) return (int)cudaErrorInvalidValue;
    bool g16 = ((uintptr_t)x & 15) == 0;
    for (int i = 0; i < n_mats; i++) g16 = g16 && gemv16_ok(type, m[i].w, m[i].row_bytes, n_in);
    if (gated && (!g16 || n_mats != 2 || m[0].n_out != m[1].n_out))
        return (int)cudaErrorNotSupported;
    if (!g16) {
        for (int i = 0; i < n_mats; i++)
            for (int t0 = 0; t0 < n; t0 += GEMV_MAX_N) {
                int nt = n - t0 < GEMV_MAX_N ? n - t0 : GEMV_MAX_N;
                // y rows are (n, n_out): offset the token block; k_gemv writes y[t * n_out + row]
                cudaError_t e = klaunch(k_gemv, blocks((size_t)m[i].n_out, 4), 128, 0, s, type,
                                        (const uint8_t *)m[i].w, m[i].row_bytes, n_in, m[i].n_out,
                                        x + (size_t)t0 * n_in, m[i].y + (size_t)t0 * m[i].n_out,
                                        nt);
                if (e != cudaSuccess) return (int)e;
            }
        return (int)cudaSuccess;
    }
    gemv16_group g = {};
    unsigned nb = 0;
    for (int i = 0; i < n_mats; i++) {
        g.w[i] = (const uint4 *)m[i].w;
        g.y[i] = m[i].y;
        g.n_out[i] = m[i].n_out;
        g.first[i] = nb;
        nb += blocks((size_t)m[i].n_out, GEMV16_ROWS);
    }
    g.n = n_mats;
    if (gated) nb = blocks((size_t)m[0].n_out, GEMV16_ROWS); /* one warp: both rows */
    bool f16 = type == T_F16;
    for (int t0 = 0; t0 < n; t0 += GEMV_MAX_N) {
        int nt = n - t0 < GEMV_MAX_N ? n - t0 : GEMV_MAX_N;
        const float *xt = x + (size_t)t0 * n_in;
        cudaError_t e = cudaErrorInvalidValue;
        switch (nt) {
#define GEMV16_CASE(N)                                                                             \
    case N:                                                                                        \
        e = klaunch(gated ? k_gemv16<N, true> : k_gemv16<N, false>, nb, 32 * GEMV16_ROWS, 0, s,    \
                    f16, g, n_in, xt, t0);                                                         \
        break;
            GEMV16_CASE(1) GEMV16_CASE(2) GEMV16_CASE(3) GEMV16_CASE(4)
            GEMV16_CASE(5) GEMV16_CASE(6) GEMV16_CASE(7) GEMV16_CASE(8)
#undef GEMV16_CASE
        }
        if (e != cudaSuccess) return (int)e;
    }
    return (int)cudaSuccess;
}

int pgd_k_dequant_bf16(pgd_stream s, int type, const void *w, size_t row_bytes, int64_t n_in,
                       int64_t n_out, uint16_t *dst) {
    size_t n = (size_t)((n_in + 31) / 32) * (size_t)n_out;
    return (int)klaunch(k_dequant_bf16, blocks(n, 256), 256, 0, s, type, (const uint8_t *)w,
                        row_bytes, n_in, n_out, (__nv_bfloat16 *)dst);
}

int pgd_k_f32_to_bf16(pgd_stream s, const float *x, uint16_t *dst, size_t n) {
    return (int)klaunch(k_f32_to_bf16, blocks(n, 256), 256, 0, s, x, (__nv_bfloat16 *)dst, n);
}

int pgd_k_add_bias(pgd_stream s, float *y, const float *b, int n_rows, int dim) {
    return (int)klaunch(k_add_bias, blocks((size_t)n_rows * dim, 256), 256, 0, s, y, b, n_rows,
                        dim);
}

int pgd_k_rope(pgd_stream s, float *x, int n_rows, int n_heads, int hd, int neox,
               const int32_t *pos, const float *inv_freq) {
    return (int)klaunch(k_rope, n_rows, 128, 0, s, x, n_heads, hd, neox, pos, inv_freq);
}

int pgd_k_kv_store(pgd_stream s, int dtype, void *k, void *v, int kv_dim, const float *kin,
                   const float *vin, const int64_t *slot, int n) {
    return (int)klaunch(k_kv_store, n, 128, 0, s, dtype, k, v, kv_dim, kin, vin, slot);
}

int pgd_k_rope_kv_store(pgd_stream s, float *q, const float *k_in, const float *v_in, int n,
                        int n_head, int n_kv_head, int hd, int neox, const int32_t *pos,
                        const float *inv_freq, int dtype, void *k, void *v, int kv_dim,
                        const int64_t *slot) {
    if (n <= 0) return (int)cudaSuccess;
    int threads = (hd / 2 + 31) / 32 * 32;
    if (threads < 32) threads = 32;
    dim3 grid((unsigned)n, (unsigned)(n_head + 2 * n_kv_head));
    return (int)klaunch(k_rope_kv_store, grid, threads, 0, s, q, k_in, v_in, n_head, n_kv_head,
                        hd, neox, pos, inv_freq, dtype, k, v, kv_dim, slot);
}

int pgd_k_attention(pgd_stream s, const pgd_k_attn *a) {
    int G = a->n_head / a->n_kv_head;
    if (G > ATT_MAXG || a->hd > 32 * ATT_MAXD) return (int)cudaErrorInvalidValue;
    int n = a->tok_list ? a->n_list : a->n_tokens;
    if (n == 0) return (int)cudaSuccess;
    dim3 grid((unsigned)(n * a->n_kv_head), (unsigned)a->n_splits);
    size_t shm = (size_t)ATT_WARPS * G * (a->hd + 2) * sizeof(float);
    int nd = (a->hd + 31) / 32;
    /* (ATT_WARPS, G, hd + 2) floats: over the default 48 KiB for large groups and heads */
#define ATT_DT(GM, ND, DT)                                                                         \
    do {                                                                                           \
        if (shm > 48 * 1024) {                                                                     \
            cudaError_t e_ = cudaFuncSetAttribute(k_attention<GM, ND, DT>,                         \
                                                  cudaFuncAttributeMaxDynamicSharedMemorySize,     \
                                                  (int)shm);                                       \
            if (e_ != cudaSuccess) return (int)e_;                                                 \
        }                                                                                          \
        cudaError_t l_ = klaunch(k_attention<GM, ND, DT>, grid, 32 * ATT_WARPS, shm, s, *a);      \
        if (l_ != cudaSuccess) return (int)l_;                                                     \
    } while (0)
#define ATT_LAUNCH(GM, ND)                                                                         \
    do {                                                                                           \
        if (a->kv_dtype == T_F32) ATT_DT(GM, ND, T_F32);                                           \
        else if (a->kv_dtype == T_F16) ATT_DT(GM, ND, T_F16);                                      \
        else ATT_DT(GM, ND, T_BF16);                                                               \
    } while (0)
#define ATT_ND(GM)                                                                                 \
    if (nd <= 1) ATT_LAUNCH(GM, 1);                                                                \
    else if (nd <= 2) ATT_LAUNCH(GM, 2);                                                           \
    else if (nd <= 4) ATT_LAUNCH(GM, 4);                                                           \
    else ATT_LAUNCH(GM, 8);
    if (G <= 1) { ATT_ND(1) }
    else if (G <= 2) { ATT_ND(2) }
    else if (G <= 4) { ATT_ND(4) }
    else if (G <= 8) { ATT_ND(8) }
    else { ATT_ND(16) }
#undef ATT_ND
#undef ATT_LAUNCH
#undef ATT_DT
    return (int)klaunch(k_attn_combine, n * a->n_head, 128, (size_t)a->n_splits * sizeof(float),
                        s, *a);
}

int pgd_k_silu_gate(pgd_stream s, float *g, const float *u, size_t n, uint16_t *g_bf16) {
    return (int)klaunch(k_silu_gate, blocks(n, 256), 256, 0, s, g, u, n,
                        (__nv_bfloat16 *)g_bf16);
}

int pgd_k_add(pgd_stream s, float *x, const float *y, size_t n) {
    return (int)klaunch(k_add, blocks(n, 256), 256, 0, s, x, y, n);
}

int pgd_k_gather_rows(pgd_stream s, const float *src, float *dst, int dim, const int32_t *rows,
                      int n) {
    return (int)klaunch(k_gather_rows, n, 128, 0, s, src, dst, dim, rows);
}

int pgd_k_copy(pgd_stream s, const void *src, void *dst, size_t n_words16) {
    k_copy<<<1024, 512, 0, s>>>((const int4 *)src, (int4 *)dst, n_words16);
    return LAUNCHED();
}

} // extern "C"
