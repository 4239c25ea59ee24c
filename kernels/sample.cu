// Sampling on the device: temperature, top-k, top-p and min-p without sorting the vocabulary.
// src/sample/device_sample.h states the algorithm and src/sample/device_sample.c is the C
// reference this kernel mirrors pass for pass: the same formula for the probabilities (the
// scaled logit rounded before exp: no FMA contraction; CUDA's expf may differ from the host's in
// the last bit), the same radix digits and tie rule. The double sums run in another order, which
// can move a cut or a draw only where a running mass lands within rounding of its target. One
// CTA per row, no sort, all of a row's work on the device; per-row state lives in shared memory;
// the histograms are per warp (no atomics on doubles) and merged in a fixed order, so a row's
// result does not vary from run to run.
#include <cuda_runtime.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>

#include "launch.cuh"
#include "sample.h"

#define SAMPLE_THREADS 256
#define SAMPLE_WARPS (SAMPLE_THREADS / 32)
#define SCAN_ITEMS 16 // consecutive tokens per thread in one tile of an id-order scan
#define FULL_MASK 0xffffffffu

// A kept set: p > p, or p == p and id <= id (lower ids first among equal probabilities).
struct cut_t {
    float p;
    int id;
};

struct row_t {
    const float *l;
    int n;
    float inv_t, mx;
    __device__ __forceinline__ float prob(int i) const {
        return expf(__fmul_rn(l[i], inv_t) - mx);
    }
};

static __device__ __forceinline__ bool kept(float p, int i, cut_t c) {
    return p > c.p || (p == c.p && i <= c.id);
}

struct sample_smem {
    int cnt[SAMPLE_WARPS][256];     // radix histograms, one per warp
    double mass[SAMPLE_WARPS][256];
    int bin_cnt[256];               // merged
    double bin_mass[256];
    double red_d[SAMPLE_WARPS];     // block reductions and scans
    float red_f[SAMPLE_WARPS];
    int red_i[SAMPLE_WARPS];
    int hit;
    int digit, n_at, above_n, found;
    double above_w, above_m;
};

// ---- block reductions: every thread gets the result (same order everywhere) ----

// A warp's values combined lane by lane, then the warps' partials in warp order.
template <typename T, typename Op> static __device__ T block_reduce(T v, T *red, Op op) {
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(FULL_MASK, v, o));
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    T r = red[0];
    for (int w = 1; w < SAMPLE_WARPS; w++) r = op(r, red[w]);
    __syncthreads();
    return r;
}
struct fmax_op {
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct imax_op {
    __device__ int operator()(int a, int b) const { return max(a, b); }
};
struct dsum_op {
    __device__ double operator()(double a, double b) const { return a + b; }
};
static __device__ float block_max(float v, sample_smem &sm) {
    return block_reduce(v, sm.red_f, fmax_op());
}
static __device__ double block_sum(double v, sample_smem &sm) {
    return block_reduce(v, sm.red_d, dsum_op());
}
static __device__ int block_max_int(int v, sample_smem &sm) {
    return block_reduce(v, sm.red_i, imax_op());
}

// The arg-max of l, lowest index among equal maxima (pgd_argmax); 0 when nothing beats -inf.
static __device__ int block_argmax(const float *l, int n, sample_smem &sm) {
    float v = -INFINITY;
    int id = INT_MAX;
    for (int i = threadIdx.x; i < n; i += SAMPLE_THREADS)
        if (l[i] > v) {
            v = l[i];
            id = i;
        }
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(FULL_MASK, v, o);
        int oi = __shfl_xor_sync(FULL_MASK, id, o);
        if (ov > v || (ov == v && oi < id)) {
            v = ov;
            id = oi;
        }
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) {
        sm.red_f[warp] = v;
        sm.red_i[warp] = id;
    }
    __syncthreads();
    v = sm.red_f[0];
    id = sm.red_i[0];
    for (int w = 1; w < SAMPLE_WARPS; w++)
        if (sm.red_f[w] > v || (sm.red_f[w] == v && sm.red_i[w] < id)) {
            v = sm.red_f[w];
            id = sm.red_i[w];
        }
    __syncthreads();
    return id == INT_MAX ? 0 : id;
}

// ---- weights of the id-order scans ----

struct kept_weight {
    row_t r;
    cut_t c;
    __device__ __forceinline__ double operator()(int i) const {
        float p = r.prob(i);
        return p > 0.0f && kept(p, i, c) ? (double)p : 0.0;
    }
};

struct tie_weight {
    row_t r;
    cut_t c;
    float v;
    __device__ __forceinline__ double operator()(int i) const {
        float p = r.prob(i);
        return p == v && kept(p, i, c) ? 1.0 : 0.0;
    }
};

// The first token, in id order, where the running weight passes target (running > target), or
// -1 when the total never does. Tiles of SAMPLE_THREADS * SCAN_ITEMS tokens: each thread sums its
// SCAN_ITEMS consecutive tokens, a block scan places them, and only the tile that holds the
// crossing is walked token by token.
template <class W>
static __device__ int first_past(int n, const W &weight, double target, sample_smem &sm) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    double run = 0.0;
    for (int t0 = 0; t0 < n; t0 += SAMPLE_THREADS * SCAN_ITEMS) {
        int i0 = t0 + tid * SCAN_ITEMS;
        double own = 0.0;
        for (int k = 0; k < SCAN_ITEMS && i0 + k < n; k++) own += weight(i0 + k);
        double incl = own;
        for (int o = 1; o < 32; o <<= 1) {
            double t = __shfl_up_sync(FULL_MASK, incl, o);
            if (lane >= o) incl += t;
        }
        double excl = __shfl_up_sync(FULL_MASK, incl, 1);
        if (lane == 0) excl = 0.0;
        if (lane == 31) sm.red_d[warp] = incl;
        if (tid == 0) sm.hit = INT_MAX;
        __syncthreads();
        double base = 0.0, total = 0.0;
        for (int w = 0; w < SAMPLE_WARPS; w++) {
            if (w == warp) base = total;
            total += sm.red_d[w];
        }
        if (run + total > target) { // the same decision in every thread: run, total are shared
            double acc = run + base + excl;
            for (int k = 0; k < SCAN_ITEMS && i0 + k < n; k++) {
                double w = weight(i0 + k);
                if (w <= 0.0) continue;
                acc += w;
                if (target < acc) {
                    atomicMin(&sm.hit, i0 + k);
                    break;
                }
            }
            __syncthreads();
            int h = sm.hit;
            if (h != INT_MAX) {
                __syncthreads();
                return h;
            }
        }
        run += total;
        __syncthreads();
    }
    return -1;
}

// ---- radix select ----

struct sel_t {
    bool found;
    float v;         // the threshold probability
    int above_n;     // kept tokens with p > v
    double above_m;  // and their mass
    int n_at;        // kept tokens with p == v
};

// The largest v (a bit pattern: p > 0, so patterns order as values) with weight(kept, p >= v)
// >= target, weight the count (by_mass false) or the mass. Four passes of 8-bit digits, most
// significant first: each histograms the kept tokens whose higher digits match those chosen.
static __device__ sel_t radix_select(const row_t &r, cut_t c, bool by_mass, double target,
                                     sample_smem &sm) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    unsigned prefix = 0;
    double above_w = 0.0, above_m = 0.0;
    int above_n = 0, n_at = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int j = tid; j < SAMPLE_WARPS * 256; j += SAMPLE_THREADS) {
            (&sm.cnt[0][0])[j] = 0;
            (&sm.mass[0][0])[j] = 0.0;
        }
        __syncthreads();
        unsigned hi = shift == 24 ? 0u : ~0u << (shift + 8);
        for (int base = warp * 32; base < r.n; base += SAMPLE_THREADS) {
            int i = base + lane, d = -1;
            float p = 0.0f;
            if (i < r.n) {
                p = r.prob(i);
                unsigned b = __float_as_uint(p);
                if (p > 0.0f && kept(p, i, c) && (b & hi) == prefix) d = (int)(b >> shift) & 255;
            }
            unsigned valid = __ballot_sync(FULL_MASK, d >= 0);
            if (!valid) continue;
            // lanes with the same digit: the lowest adds their count and mass (in lane order)
            unsigned peers = __match_any_sync(FULL_MASK, d);
            double m = 0.0;
            if (by_mass)
                for (unsigned v = valid; v; v &= v - 1) {
                    int src = __ffs(v) - 1;
                    double t = __shfl_sync(FULL_MASK, (double)p, src);
                    if ((peers >> src) & 1u) m += t;
                }
            if (d >= 0 && lane == __ffs(peers) - 1) {
                sm.cnt[warp][d] += __popc(peers);
                sm.mass[warp][d] += m;
            }
        }
        __syncthreads();
        for (int j = tid; j < 256; j += SAMPLE_THREADS) {
            int cn = 0;
            double ms = 0.0;
            for (int w = 0; w < SAMPLE_WARPS; w++) {
                cn += sm.cnt[w][j];
                ms += sm.mass[w][j];
            }
            sm.bin_cnt[j] = cn;
            sm.bin_mass[j] = ms;
        }
        __syncthreads();
        if (warp == 0) {
            // lane L holds bins 255 - 8L down to 248 - 8L: lanes in descending digit order
            int j0 = 255 - 8 * lane;
            double lw = 0.0, lm = 0.0;
            int ln = 0;
            for (int k = 0; k < 8; k++) {
                lm += sm.bin_mass[j0 - k];
                ln += sm.bin_cnt[j0 - k];
            }
            lw = by_mass ? lm : (double)ln;
            double iw = lw, im = lm;
            int in = ln;
            for (int o = 1; o < 32; o <<= 1) {
                double tw = __shfl_up_sync(FULL_MASK, iw, o), tm = __shfl_up_sync(FULL_MASK, im, o);
                int tn = __shfl_up_sync(FULL_MASK, in, o);
                if (lane >= o) {
                    iw += tw;
                    im += tm;
                    in += tn;
                }
            }
            double ew = __shfl_up_sync(FULL_MASK, iw, 1), em = __shfl_up_sync(FULL_MASK, im, 1);
            int en = __shfl_up_sync(FULL_MASK, in, 1);
            if (lane == 0) {
                ew = 0.0;
                em = 0.0;
                en = 0;
            }
            unsigned cross = __ballot_sync(FULL_MASK, ln > 0 && above_w + iw >= target);
            unsigned nonempty = __ballot_sync(FULL_MASK, ln > 0);
            // Below the first digit the bins re-sum the mass of the digit chosen above in
            // another order: should they fall short by rounding, the lowest bin is taken.
            int owner = cross ? __ffs(cross) - 1
                      : shift != 24 && nonempty ? 31 - __clz(nonempty) : -1;
            if (lane == 0) sm.found = owner >= 0;
            if (lane == owner) {
                double aw = above_w + ew, am = above_m + em;
                int an = above_n + en, d = -1, low = -1;
                double low_w = 0.0, low_m = 0.0;
                int low_n = 0;
                for (int k = 0; k < 8; k++) {
                    int j = j0 - k, cn = sm.bin_cnt[j];
                    if (!cn) continue;
                    double w = by_mass ? sm.bin_mass[j] : (double)cn;
                    if (cross && aw + w >= target) {
                        d = j;
                        break;
                    }
                    low = j;
                    low_w = aw;
                    low_m = am;
                    low_n = an;
                    aw += w;
                    am += sm.bin_mass[j];
                    an += cn;
                }
                if (d < 0) { // rounding, or no crossing at all: the lowest nonempty bin
                    d = low;
                    aw = low_w;
                    am = low_m;
                    an = low_n;
                }
                sm.digit = d;
                sm.above_w = aw;
                sm.above_m = am;
                sm.above_n = an;
                sm.n_at = sm.bin_cnt[d];
            }
        }
        __syncthreads();
        if (!sm.found) {
            sel_t none = {false, 0.0f, 0, 0.0, 0};
            __syncthreads();
            return none;
        }
        prefix |= (unsigned)sm.digit << shift;
        above_w = sm.above_w;
        above_m = sm.above_m;
        above_n = sm.above_n;
        n_at = sm.n_at;
        __syncthreads();
    }
    sel_t s = {true, __uint_as_float(prefix), above_n, above_m, n_at};
    return s;
}

static __device__ double kept_mass(const row_t &r, cut_t c, sample_smem &sm) {
    double m = 0.0;
    for (int i = threadIdx.x; i < r.n; i += SAMPLE_THREADS) {
        float p = r.prob(i);
        if (p > 0.0f && kept(p, i, c)) m += p;
    }
    return block_sum(m, sm);
}

// The id of the m-th (from 1) kept token with p == v, in id order.
static __device__ int nth_tie(const row_t &r, cut_t c, float v, int m, sample_smem &sm) {
    tie_weight w = {r, c, v};
    int id = first_past(r.n, w, (double)m - 0.5, sm);
    return id < 0 ? INT_MAX : id; // not reached: m <= the ties radix_select counted
}

__global__ void __launch_bounds__(SAMPLE_THREADS)
    k_sample(const float *logits, int n, const pgd_k_sample_row *rows, int32_t *out) {
    pdl_enter();
    __shared__ sample_smem sm;
    const float *l = logits + (size_t)blockIdx.x * n;
    const pgd_k_sample_row p = rows[blockIdx.x];
    row_t r = {l, n, 0.0f, 0.0f};
    bool greedy = p.temperature == 0.0f || p.top_k == 1;
    if (!greedy) {
        r.inv_t = 1.0f / p.temperature;
        float mx = -INFINITY;
        for (int i = threadIdx.x; i < n; i += SAMPLE_THREADS) {
            float w = __fmul_rn(l[i], r.inv_t);
            if (w > mx) mx = w;
        }
        r.mx = block_max(mx, sm);
        greedy = !isfinite(r.mx); // nothing has probability > 0
    }
    if (greedy) {
        int id = block_argmax(l, n, sm);
        if (threadIdx.x == 0) out[blockIdx.x] = id;
        return;
    }
    cut_t c = {0.0f, -1}; // p > 0
    if (p.top_k > 0) {
        sel_t s = radix_select(r, c, false, (double)p.top_k, sm);
        if (s.found) {
            int need = p.top_k - s.above_n; // 1 .. s.n_at
            cut_t k = {s.v, need == s.n_at ? INT_MAX : nth_tie(r, c, s.v, need, sm)};
            c = k;
        }
    }
    double m = kept_mass(r, c, sm);
    if (p.top_p < 1.0f) {
        double target = (double)p.top_p * m;
        sel_t s = radix_select(r, c, true, target, sm);
        if (s.found) {
            // the fewest tokens at v that reach the target (the CPU adds them one at a time)
            double v = s.v, guess = ceil((target - s.above_m) / v);
            int k = guess < 1.0 ? 1 : guess > (double)s.n_at ? s.n_at : (int)guess;
            while (k > 1 && s.above_m + (double)(k - 1) * v >= target) k--;
            while (k < s.n_at && s.above_m + (double)k * v < target) k++;
            int id = k < s.n_at ? nth_tie(r, c, s.v, k, sm) : s.v == c.p ? c.id : INT_MAX;
            cut_t t = {s.v, id};
            c = t;
        }
    }
    if (p.min_p > 0.0f) {
        float thr = p.min_p * expf(0.0f); // p_max: the most likely token is always kept
        if (thr > c.p) {
            cut_t t = {thr, INT_MAX};
            c = t;
        }
    }
    if (p.top_p < 1.0f || p.min_p > 0.0f) m = kept_mass(r, c, sm);
    kept_weight w = {r, c};
    int id = first_past(n, w, (double)p.u * m, sm);
    if (id < 0) { // rounding: the last kept token (there is one: the arg-max)
        int last = -1;
        for (int i = threadIdx.x; i < n; i += SAMPLE_THREADS)
            if (w(i) > 0.0) last = i;
        id = block_max_int(last, sm);
    }
    if (threadIdx.x == 0) out[blockIdx.x] = id;
}

extern "C" int pgd_k_sample(pgd_stream s, const float *logits, int n_rows, int n_vocab,
                            const pgd_k_sample_row *rows, int32_t *out) {
    if (n_rows <= 0) return (int)cudaSuccess;
    return (int)klaunch(k_sample, n_rows, SAMPLE_THREADS, 0, s, logits, n_vocab, rows, out);
}
