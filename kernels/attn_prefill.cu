// Prefill attention on tensor cores (FlashAttention-2 style) over the paged K/V cache.
// Grid (n_tiles, n_head), 8 warps. A CTA owns up to 64 query rows: the tile's n tokens for
// max(1, 64 / n) consecutive query heads of one GQA group (the CTAs of the chunk's other heads
// exit at once), so short tiles (decodes) share each K/V block across heads and long ones fill
// the rows. Per block of 64 key positions: K/V rows gathered through the block table into shared
// memory as f16 (F16/F32 cache) or bf16 (BF16 cache); S = Q K^T (WMMA, f32 accumulate); causal
// mask and online softmax in f32, base 2 (Q pre-scaled by log2(e)/sqrt(hd)); O = O * corr + P V
// with O in WMMA accumulators. The per-row rescale multiplies O element-wise by an accumulator
// fragment loaded from a (row -> corr) tile, so no fragment layout is assumed anywhere.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <mma.h>
#include <stdint.h>
#include <string.h>

#include "kernels.h"
#include "launch.cuh"

using namespace nvcuda;

namespace {

enum { DT_F32 = 0, DT_F16 = 1, DT_BF16 = 30 };

constexpr int BM = PGD_K_QTILE_MAX; // query rows per CTA (warp pairs own 16-row strips)
constexpr int BN = 64;              // key positions per block
constexpr int NWARP = 8;
constexpr int NTHR = 32 * NWARP;
constexpr int LDS = BN + 4;  // S row stride (floats); P (16-bit) lives in the first half of it
constexpr int LDP = 2 * LDS; // P row stride (16-bit elements)
constexpr float LOG2E = 1.4426950408889634f;
static_assert(BM == 64 && BN == 64, "warp roles below assume 64 x 64 blocks and 8 warps");

// Dynamic shared memory of one CTA (byte offsets, all multiples of 128 so every WMMA pointer is
// 32-byte aligned). HDP = head_dim padded to a multiple of 32; O is staged in K+V at the end.
template <int HDP> struct Smem {
    static constexpr int LDH = HDP + 8; // Q/K/V row stride (16-bit elements): conflict-free rows
    static constexpr int LDO = HDP + 4; // O staging row stride (floats)
    static constexpr size_t q = 0;                              // (BM, LDH) Q * log2e/sqrt(hd)
    static constexpr size_t k = q + (size_t)BM * LDH * 2;       // (BN, LDH) K block
    static constexpr size_t v = k + (size_t)BN * LDH * 2;       // (BN, LDH) V block
    static constexpr size_t s = v + (size_t)BN * LDH * 2;       // (BM, LDS) f32 S, aliased by P
    static constexpr size_t c = s + (size_t)BM * LDS * 4;       // (BM / 16, 16, 16) f32 corr
    static constexpr size_t roff = c + (size_t)BM * 16 * 4;     // (BN) int64 K/V row offsets
    static constexpr size_t linv = roff + (size_t)BN * 8;       // (BM) f32 1 / l
    static constexpr size_t bytes = linv + (size_t)BM * 4;
    static_assert((size_t)BM * LDO * 4 <= s - k, "O staging must fit in K and V");
    static_assert(HDP % 32 == 0 && LDH % 8 == 0 && LDO % 4 == 0, "WMMA ldm rules");
};

template <int DT> struct Mma {
    using T = __half;
};
template <> struct Mma<DT_BF16> {
    using T = __nv_bfloat16;
};

template <typename T> __device__ __forceinline__ T to_t(float x);
template <> __device__ __forceinline__ __half to_t<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 to_t<__nv_bfloat16>(float x) {
    return __float2bfloat16_rn(x);
}
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }

// Cache elements i .. i + 7 as 8 MMA-type values (16 bytes). 16-bit caches are copied as they
// are (F16 -> f16, BF16 -> bf16); F32 is rounded to f16. vec: 16-byte aligned vector loads.
template <int DT> __device__ __forceinline__ uint4 load8(const void *base, size_t i, bool vec) {
    uint4 r;
    if (DT == DT_F32) {
        const float *p = (const float *)base + i;
        float f[8];
        if (vec) {
            float4 x = *(const float4 *)p, y = *(const float4 *)(p + 4);
            f[0] = x.x, f[1] = x.y, f[2] = x.z, f[3] = x.w;
            f[4] = y.x, f[5] = y.y, f[6] = y.z, f[7] = y.w;
        } else {
#pragma unroll
            for (int j = 0; j < 8; j++) f[j] = p[j];
        }
        __half2 h[4];
#pragma unroll
        for (int j = 0; j < 4; j++) h[j] = __floats2half2_rn(f[2 * j], f[2 * j + 1]);
        memcpy(&r, h, sizeof r);
    } else {
        const uint16_t *p = (const uint16_t *)base + i;
        if (vec) {
            r = *(const uint4 *)p;
        } else {
            uint16_t u[8];
#pragma unroll
            for (int j = 0; j < 8; j++) u[j] = p[j];
            memcpy(&r, u, sizeof r);
        }
    }
    return r;
}

// Warp roles. Load phases: all 256 threads stride over elements. S = Q K^T: warp w computes
// rows 16 * (w / 2) .. +15, key columns 32 * (w % 2) .. +31 (two 16x16 tiles). Softmax: warp w
// owns rows 8 w .. 8 w + 7, four lanes per row, lane q reading columns q, q + 4, ..., q + 60;
// it keeps the row's running max m and sum l in registers (the same in the 4 lanes).
// O += P V: warp w owns rows 16 * (w / 2) .. +15, head columns HDP / 2 * (w % 2) .. +HDP / 2 - 1.
template <int HDP, int DT>
__global__ void __launch_bounds__(NTHR, HDP > 128 ? 1 : 2)
    k_attn_prefill(pgd_k_attn a, const pgd_k_qtile *tiles, int vec) {
    pdl_enter();
    using T = typename Mma<DT>::T;
    using L = Smem<HDP>;
    constexpr int LDH = L::LDH, LDO = L::LDO, CH = HDP / 8, NF = HDP / 32;
    extern __shared__ __align__(128) unsigned char smem[];
    T *qs = (T *)(smem + L::q), *ks = (T *)(smem + L::k), *vs = (T *)(smem + L::v);
    float *ss = (float *)(smem + L::s), *cs = (float *)(smem + L::c);
    T *ps = (T *)(smem + L::s);
    long long *roff = (long long *)(smem + L::roff);
    float *linv = (float *)(smem + L::linv), *os = (float *)(smem + L::k);

    const pgd_k_qtile tile = tiles[blockIdx.x];
    const int n = tile.n, tok0 = tile.tok0;
    const int G = a.n_head / a.n_kv_head, h = blockIdx.y, g = h % G, kvh = h / G;
    if (n <= 0 || n > BM) return; // outside the contract: nothing sane to write
    const int gpc = min(G, BM / n); // query heads per CTA
    if (g % gpc) return;            // this head is computed by the CTA of head h - g % gpc
    // rows r < nrows are (head h + r / n, token tok0 + r % n); the rest are zero padding
    const int nrows = min(gpc, G - g) * n;
    const int hd = a.hd, pos0 = a.pos[tok0], kmax = pos0 + n - 1;
    const int32_t *bt = a.tables + (size_t)a.seq[tok0] * a.table_stride;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int bs = a.block_size;
    // element offset of position p's K/V row for this KV head; -1 past the tile's last position
    // (the block table may hold nothing there)
    auto kv_off = [&](int p) -> long long {
        if (p > kmax) return -1;
        long long slot = (long long)bt[p / bs] * bs + p % bs;
        return slot * a.kv_dim + (long long)kvh * hd;
    };

    const float qscale = rsqrtf((float)hd) * LOG2E;
    for (int i = tid; i < BM * HDP; i += NTHR) {
        int r = i / HDP, d = i % HDP;
        float x = 0.0f;
        if (r < nrows && d < hd)
            x = a.q[((size_t)(tok0 + r % n) * a.n_head + h + r / n) * hd + d] * qscale;
        qs[r * LDH + d] = to_t<T>(x);
    }
    if (tid < BN) roff[tid] = kv_off(tid);

    // softmax row of this lane; padding rows see every key of the block range (no all-masked
    // row, so no NaN), their output is never written
    const int sr = warp * 8 + (lane >> 2), sq = lane & 3;
    const int qpos = sr < nrows ? pos0 + sr % n : kmax;
    float m = -INFINITY, l = 0.0f;

    const int rs = warp >> 1, ch = warp & 1;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> o[NF];
#pragma unroll
    for (int f = 0; f < NF; f++) wmma::fill_fragment(o[f], 0.0f);
    __syncthreads();

    for (int kb0 = 0; kb0 <= kmax; kb0 += BN) {
        // gather the block's K/V rows; rows past kmax and columns past hd are zero (P V must
        // never meet NaN garbage, even at P = 0)
        for (int i = tid; i < BN * CH; i += NTHR) {
            int j = i / CH, c = i % CH;
            long long off = roff[j];
            uint4 kq = make_uint4(0, 0, 0, 0), vq = kq;
            if (off >= 0 && c * 8 < hd) {
                kq = load8<DT>(a.k, (size_t)off + c * 8, vec);
                vq = load8<DT>(a.v, (size_t)off + c * 8, vec);
            }
            *(uint4 *)(ks + j * LDH + c * 8) = kq;
            *(uint4 *)(vs + j * LDH + c * 8) = vq;
        }
        __syncthreads();
        if (tid < BN) roff[tid] = kv_off(kb0 + BN + tid); // next block; read after 3 barriers

        { // S = Q K^T (K row-major (key, dim) read as col-major K^T)
            wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> qa;
            wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> kb[2];
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> sacc[2];
            wmma::fill_fragment(sacc[0], 0.0f);
            wmma::fill_fragment(sacc[1], 0.0f);
#pragma unroll 2
            for (int kk = 0; kk < HDP / 16; kk++) {
                wmma::load_matrix_sync(qa, qs + rs * 16 * LDH + kk * 16, LDH);
#pragma unroll
                for (int u = 0; u < 2; u++) {
                    wmma::load_matrix_sync(kb[u], ks + (ch * 32 + u * 16) * LDH + kk * 16, LDH);
                    wmma::mma_sync(sacc[u], qa, kb[u], sacc[u]);
                }
            }
#pragma unroll
            for (int u = 0; u < 2; u++)
                wmma::store_matrix_sync(ss + rs * 16 * LDS + ch * 32 + u * 16, sacc[u], LDS,
                                        wmma::mem_row_major);
        }
        __syncthreads();

        { // causal mask, online softmax; P over S (same row, read before written)
            float sv[BN / 4], mx = -INFINITY;
#pragma unroll
            for (int j = 0; j < BN / 4; j++) {
                int c = sq + 4 * j;
                float x = kb0 + c <= qpos ? ss[sr * LDS + c] : -INFINITY;
                sv[j] = x;
                mx = fmaxf(mx, x);
            }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            float mn = fmaxf(m, mx), mu = mn == -INFINITY ? 0.0f : mn;
            float corr = exp2f(m - mu), sum = 0.0f; // m = -inf (first block): corr = 0
            __syncwarp(); // the row's 4 lanes have read S before P overwrites it
#pragma unroll
            for (int j = 0; j < BN / 4; j++) {
                T p = to_t<T>(exp2f(sv[j] - mu));
                ps[sr * LDP + sq + 4 * j] = p;
                sum += to_f(p); // the rounded weights, so that they sum to exactly l
            }
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            l = l * corr + sum;
            m = mn;
            float *ct = cs + (sr >> 4) * 256 + (sr & 15) * 16;
#pragma unroll
            for (int j = 0; j < 4; j++) ct[sq + 4 * j] = corr;
        }
        __syncthreads();

        { // O = O * corr + P V
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> cf;
            wmma::load_matrix_sync(cf, cs + rs * 256, 16, wmma::mem_row_major);
#pragma unroll
            for (int f = 0; f < NF; f++)
#pragma unroll
                for (int e = 0; e < cf.num_elements; e++) o[f].x[e] *= cf.x[e];
            wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> pa;
            wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> vb;
#pragma unroll 1
            for (int kk = 0; kk < BN / 16; kk++) {
                wmma::load_matrix_sync(pa, ps + rs * 16 * LDP + kk * 16, LDP);
#pragma unroll
                for (int f = 0; f < NF; f++) {
                    wmma::load_matrix_sync(vb, vs + kk * 16 * LDH + ch * (HDP / 2) + f * 16,
                                           LDH);
                    wmma::mma_sync(o[f], pa, vb, o[f]);
                }
            }
        }
        __syncthreads(); // K, V, P and corr are rewritten by the next block
    }

    if (sq == 0) linv[sr] = 1.0f / l;
#pragma unroll
    for (int f = 0; f < NF; f++) // K/V are dead (last barrier of the loop): stage O there
        wmma::store_matrix_sync(os + rs * 16 * LDO + ch * (HDP / 2) + f * 16, o[f], LDO,
                                wmma::mem_row_major);
    __syncthreads();
    for (int i = tid; i < nrows * HDP; i += NTHR) {
        int r = i / HDP, d = i % HDP;
        if (d < hd)
            a.out[((size_t)(tok0 + r % n) * a.n_head + h + r / n) * hd + d] =
                os[r * LDO + d] * linv[r];
    }
}

template <int HDP, int DT>
int launch(pgd_stream s, const pgd_k_attn *a, const pgd_k_qtile *tiles, int n_tiles, int vec) {
    const size_t shm = Smem<HDP>::bytes;
    cudaError_t e = cudaFuncSetAttribute(k_attn_prefill<HDP, DT>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shm);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); // not sticky: keep it from failing the caller's fallback launch
        return (int)e;
    }
    dim3 grid((unsigned)n_tiles, (unsigned)a->n_head);
    return (int)klaunch(k_attn_prefill<HDP, DT>, grid, NTHR, shm, s, *a, tiles, vec);
}

template <int HDP>
int launch_dt(pgd_stream s, const pgd_k_attn *a, const pgd_k_qtile *tiles, int n_tiles,
              int vec) {
    switch (a->kv_dtype) {
    case DT_F32: return launch<HDP, DT_F32>(s, a, tiles, n_tiles, vec);
    case DT_F16: return launch<HDP, DT_F16>(s, a, tiles, n_tiles, vec);
    default: return launch<HDP, DT_BF16>(s, a, tiles, n_tiles, vec);
    }
}

} // namespace

extern "C" int pgd_k_attention_prefill(pgd_stream s, const pgd_k_attn *a,
                                       const pgd_k_qtile *tiles, int n_tiles) {
    int hd = a->hd;
    if (hd < 16 || hd > 256 || hd % 16 || a->n_kv_head <= 0 || a->n_head <= 0 ||
        a->n_head % a->n_kv_head || a->n_head > 65535 || a->block_size <= 0)
        return (int)cudaErrorInvalidValue;
    if (a->kv_dtype != DT_F32 && a->kv_dtype != DT_F16 && a->kv_dtype != DT_BF16)
        return (int)cudaErrorInvalidValue;
    if (n_tiles <= 0) return (int)cudaSuccess;
    // row offsets are multiples of 16 elements when kv_dim is: 16-byte loads from aligned bases
    int vec = ((uintptr_t)a->k % 16 == 0 && (uintptr_t)a->v % 16 == 0 && a->kv_dim % 16 == 0);
    if (hd <= 64) return launch_dt<64>(s, a, tiles, n_tiles, vec);
    if (hd <= 96) return launch_dt<96>(s, a, tiles, n_tiles, vec);
    if (hd <= 128) return launch_dt<128>(s, a, tiles, n_tiles, vec);
    return launch_dt<256>(s, a, tiles, n_tiles, vec);
}
