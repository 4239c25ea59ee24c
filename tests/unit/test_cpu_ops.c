/* The CPU backend's non-matmul ops (cpu_backend.c, simd.h): the vectorized attention against a
 * double-precision softmax(q K^T / sqrt(d)) V over the paged K/V, the vector expf against exp,
 * exact F16/BF16 stores, the mixture-of-experts and LoRA ops against their definitions, and batch
 * invariance: a token's (or row's) result of every op is bit-identical alone, inside a batch of
 * other tokens and sequences, and on 1 or 2 threads. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/pool.h"
#include "backend/cpu/quant.h"
#include "backend/cpu/simd.h"
#include "test.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next_u64(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}
static float frand(void) { return (float)(next_u64() >> 40) / (float)(1 << 24) * 2.0f - 1.0f; }
static void fill(float *v, size_t n, float amp) {
    for (size_t i = 0; i < n; i++) v[i] = amp * frand();
}

/* Backends on a 1-thread and a 2-thread pool, sized for groups <= 4 and head_dim <= 128. */
enum { MAX_TOK = 512, INIT_HEADS = 8, INIT_KV = 2, INIT_HD = 128 };
static pgd_pool *pool1, *pool2;
static pgd_backend be1, be2;

static void mk_backend(pgd_backend *be, pgd_pool *pool) {
    pgd_err err = {0};
    *be = (pgd_backend){&pgd_cpu_backend_ops, 0, pool, NULL};
    if (be->ops->init(be, MAX_TOK, 64, INIT_HEADS, INIT_KV, INIT_HD, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
}

/* ---- expf ---------------------------------------------------------------------------------- */

static double ulps(float got, double want) {
    if (want == 0.0) return got == 0.0f ? 0.0 : INFINITY;
    int e;
    frexp(want, &e);                   /* want = m 2^e, m in [0.5, 1) */
    double ulp = ldexp(1.0, e - 24);   /* float ulp at want */
    if (ulp < ldexp(1.0, -149)) ulp = ldexp(1.0, -149);
    return fabs((double)got - want) / ulp;
}

static float exp_vec(float x) {
#ifdef __AVX2__
    float o[8];
    _mm256_storeu_ps(o, pgd_exp8(_mm256_set1_ps(x)));
    return o[3];
#else
    return pgd_expf_scalar(x);
#endif
}

static void test_expf(void) {
    /* every 997th float of [PGD_EXP_LO, 88.72], both signs: about 2.2 million values */
    double worst = 0, worst_x = 0;
    long n = 0, differ = 0;
    for (int sign = 0; sign < 2; sign++) {
        float lim = sign ? -PGD_EXP_LO : 88.72f;
        uint32_t top;
        memcpy(&top, &lim, 4);
        for (uint32_t u = 0; u <= top; u += 997) {
            float x;
            uint32_t b = u | (sign ? 0x80000000u : 0);
            memcpy(&x, &b, 4);
            float v = exp_vec(x), s = pgd_expf_scalar(x);
            if (memcmp(&v, &s, 4) != 0) differ++;
            double e = ulps(v, exp((double)x));
            if (e > worst) worst = e, worst_x = x;
            n++;
        }
    }
    printf("vector expf: max %.2f ulp (at %.9g) over %ld values\n", worst, worst_x, n);
    CHECK(worst <= 2.0);
#ifdef __FMA__
    CHECK_EQ_INT(differ, 0); /* the scalar twin is bit-identical */
#endif
    /* edges */
    float big[] = {88.7228f, 88.73f, 88.8f, 89.0f, 1000.0f, INFINITY};
    for (int i = 0; i < 6; i++) {
        float v = exp_vec(big[i]), s = pgd_expf_scalar(big[i]);
        if (i == 0) CHECK(ulps(v, exp((double)big[i])) <= 2.0 && isfinite(v));
        else CHECK(isinf(v) && v > 0);
        CHECK(memcmp(&v, &s, 4) == 0);
    }
    float small[] = {-87.34f, -88.0f, -100.0f, -1e30f, -INFINITY};
    for (int i = 0; i < 5; i++) {
        CHECK(exp_vec(small[i]) == 0.0f && pgd_expf_scalar(small[i]) == 0.0f);
        CHECK(expf(small[i]) < 1.2e-38f); /* the flushed results are all below FLT_MIN-ish */
    }
    CHECK(exp_vec(PGD_EXP_LO) > 1.17e-38f && exp_vec(PGD_EXP_LO) < 1.19e-38f);
    CHECK(exp_vec(0.0f) == 1.0f && exp_vec(-0.0f) == 1.0f);
    CHECK(isnan(exp_vec(NAN)) && isnan(pgd_expf_scalar(NAN)));
    /* silu: against double, including the saturating ends */
    double sw = 0;
    for (int i = -20000; i <= 20000; i++) {
        float x = (float)i * 0.005f;
        double want = (double)x / (1.0 + exp(-(double)x));
#ifdef __AVX2__
        float o[8];
        _mm256_storeu_ps(o, pgd_silu8(_mm256_set1_ps(x)));
        float got = o[0];
#else
        float got = pgd_silu_scalar(x);
#endif
        if (fabs(want) < 1e-30) { /* x < -64: exp(-x) overflows float near -88, result -0 */
            CHECK(fabs(got) < 1e-30);
            continue;
        }
        double e = ulps(got, want);
        if (e > sw) sw = e;
    }
    printf("silu: max %.2f ulp on [-64, 100]\n", sw);
    CHECK(sw <= 4.0);
    CHECK(pgd_silu_scalar(-1000.0f) == 0.0f && pgd_silu_scalar(1000.0f) == 1000.0f);
    /* gelu (tanh): against 0.5 x (1 + tanh(z)) in double, as x / (1 + exp(-2z)) (the same
     * function, without tanh's cancellation for negative x), vector and scalar: relative error in
     * ulps from x = -3 on; below, where the result is under 0.004 and the function is
     * ill-conditioned (|x d ln g / dx| ~ 2|z|), absolute error */
    double gw = 0, ga = 0;
    for (int i = -8000; i <= 8000; i++) {
        float x = (float)i * 0.005f;
        double z = 0.7978845608028654 * ((double)x + 0.044715 * (double)x * x * x);
        double want = (double)x / (1.0 + exp(-2.0 * z));
        CHECK(fabs(0.5 * x * (1.0 + tanh(z)) - want) <= 1e-12 + 1e-9 * fabs(want));
        float got[2] = {pgd_gelu_scalar(x), pgd_gelu_scalar(x)};
#ifdef __AVX2__
        float o[8];
        _mm256_storeu_ps(o, pgd_gelu8(_mm256_set1_ps(x)));
        got[1] = o[0];
#endif
        for (int k = 0; k < 2; k++) {
            if (x >= -3.0f) gw = fmax(gw, ulps(got[k], want));
            else ga = fmax(ga, fabs(got[k] - want));
        }
    }
    printf("gelu (tanh): max %.2f ulp on [-3, 40], max abs error %.2g below\n", gw, ga);
    CHECK(gw <= 16.0 && ga <= 1e-8);
    CHECK(pgd_gelu_scalar(-1000.0f) == 0.0f && pgd_gelu_scalar(1000.0f) == 1000.0f);
}

/* ---- Attention ----------------------------------------------------------------------------- */

enum { BS = 16, N_BLOCKS = 48 }; /* 768 slots */

typedef struct kvpool {
    pgd_type dt;
    int n_kv, hd, kv_dim;
    void *k, *v; /* (N_BLOCKS * BS, kv_dim) of dt */
} kvpool;

static float kv_get(const kvpool *p, const void *base, size_t idx) {
    if (p->dt == PGD_TYPE_F32) return ((const float *)base)[idx];
    uint16_t h = ((const uint16_t *)base)[idx];
    return p->dt == PGD_TYPE_F16 ? pgd_fp16_to_fp32(h) : pgd_bf16_to_fp32(h);
}

static void kv_set(const kvpool *p, void *base, size_t idx, float x) {
    if (p->dt == PGD_TYPE_F32) ((float *)base)[idx] = x;
    else
        ((uint16_t *)base)[idx] = p->dt == PGD_TYPE_F16 ? pgd_fp32_to_fp16(x) : pgd_fp32_to_bf16(x);
}

/* Fills every slot with random K (scaled) and V. */
static void kv_fill(kvpool *p, float kamp) {
    size_t n = (size_t)N_BLOCKS * BS * p->kv_dim;
    size_t es = pgd_dtype_size(p->dt);
    p->k = malloc(n * es);
    p->v = malloc(n * es);
    for (size_t i = 0; i < n; i++) {
        kv_set(p, p->k, i, kamp * frand());
        kv_set(p, p->v, i, frand());
    }
}

/* out (n_head * hd) for one token at pos of a sequence with block table bt, attending to
 * positions lo..pos with scores scaled by scale (0: 1/sqrt(hd)) and soft-capped at cap (0: not),
 * in double from the stored (already rounded) K/V; returns the largest |v| seen (the natural
 * output scale). */
static double attn_ref(const kvpool *p, const float *q, int n_head, const int32_t *bt, int lo,
                       int pos, double scale, double cap, double *out) {
    int hd = p->hd, group = n_head / p->n_kv;
    double vmax = 0;
    double *sc = malloc((size_t)(pos + 1) * sizeof *sc);
    for (int h = 0; h < n_head; h++) {
        int kvh = h / group;
        double m = -INFINITY, sum = 0;
        for (int j = lo; j <= pos; j++) {
            size_t idx = ((size_t)bt[j / BS] * BS + j % BS) * p->kv_dim + (size_t)kvh * hd;
            double d = 0;
            for (int i = 0; i < hd; i++) d += (double)q[h * hd + i] * kv_get(p, p->k, idx + i);
            sc[j] = d * (scale > 0 ? scale : 1.0 / sqrt((double)hd));
            if (cap > 0) sc[j] = cap * tanh(sc[j] / cap);
            if (sc[j] > m) m = sc[j];
        }
        for (int i = 0; i < hd; i++) out[h * hd + i] = 0;
        for (int j = lo; j <= pos; j++) {
            size_t idx = ((size_t)bt[j / BS] * BS + j % BS) * p->kv_dim + (size_t)kvh * hd;
            double w = exp(sc[j] - m);
            sum += w;
            for (int i = 0; i < hd; i++) {
                double v = kv_get(p, p->v, idx + i);
                out[h * hd + i] += w * v;
                if (fabs(v) > vmax) vmax = fabs(v);
            }
        }
        for (int i = 0; i < hd; i++) out[h * hd + i] /= sum;
    }
    free(sc);
    return vmax;
}

static pgd_kv_layer layer_of(const kvpool *p) {
    return (pgd_kv_layer){p->dt, p->dt, p->k, p->v, BS, p->kv_dim, 0, 0, 0};
}

/* (a) One 300-token sequence as a single prefill (contexts 1..300, 19 blocks, scattered) on 2
 * threads against the double reference: |out - ref| <= 2e-6 * max |v| for every element; with
 * no window, and with sliding windows of 1, 40 (within a tile or across two) and 257 positions
 * (across a segment boundary); the last also with Gemma's own score scale and Gemma 2's
 * soft-capping (at 3: the scores of a few units bend). */
static void test_attention_ref(void) {
    const pgd_type dts[] = {PGD_TYPE_F32, PGD_TYPE_F16, PGD_TYPE_BF16};
    const int groups[] = {1, 3, 4}, hds[] = {64, 128, 80, 36};
    enum { N = 300 };
    int32_t bt[N_BLOCKS], pos[N], seq[N], tok[N];
    int64_t slot[N];
    for (int i = 0; i < N_BLOCKS; i++) bt[i] = (i * 29 + 7) % N_BLOCKS; /* 29 is coprime */
    const int32_t *tables[1] = {bt};
    for (int t = 0; t < N; t++) {
        pos[t] = t;
        seq[t] = 0;
        tok[t] = 0;
        slot[t] = (int64_t)bt[t / BS] * BS + t % BS;
    }
    pgd_step st = {N, tok, pos, seq, slot, tables, 0, NULL, 0, 0, 0};
    double worst_all = 0;
    const int windows[] = {0, 1, 40, 257, 257};
    for (int wi = 0; wi < 5; wi++)
    for (int di = 0; di < 3; di++)
        for (int gi = 0; gi < 3; gi++)
            for (int hi = 0; hi < 4; hi++) {
                int group = groups[gi], hd = hds[hi], n_kv = gi == 1 ? 1 : 2;
                int n_head = group * n_kv;
                kvpool p = {dts[di], n_kv, hd, n_kv * hd, NULL, NULL};
                kv_fill(&p, 1.0f);
                float *q = malloc((size_t)N * n_head * hd * sizeof *q);
                float *o = malloc((size_t)N * n_head * hd * sizeof *o);
                double *r = malloc((size_t)n_head * hd * sizeof *r);
                fill(q, (size_t)N * n_head * hd, 4.0f); /* scores of a few units: peaked */
                pgd_kv_layer kl = layer_of(&p);
                int win = kl.window = windows[wi];
                if (wi == 4) kl.scale = 0.2f, kl.softcap = 3.0f;
                be2.ops->attention(&be2, q, &kl, o, n_head, n_kv, hd, &st);
                double worst = 0;
                for (int t = 0; t < N; t += (t < 40 || (t > 250 && t < 270) ? 1 : 7)) {
                    int lo = win && t >= win ? t - win + 1 : 0;
                    double vmax = attn_ref(&p, q + (size_t)t * n_head * hd, n_head, bt, lo, t,
                                           kl.scale, kl.softcap, r);
                    for (int i = 0; i < n_head * hd; i++) {
                        double e = fabs(o[(size_t)t * n_head * hd + i] - r[i]) / vmax;
                        if (!(e <= worst)) worst = e;
                    }
                }
                if (!(worst <= 2e-6))
                    fprintf(stderr, "attention %s group %d hd %d window %d: rel err %.3g\n",
                            pgd_type_name(p.dt), group, hd, win, worst);
                CHECK(worst <= 2e-6);
                if (worst > worst_all || isnan(worst)) worst_all = worst;
                free(q);
                free(o);
                free(r);
                free(p.k);
                free(p.v);
            }
    printf("attention vs double reference: max error %.3g of max |v| (F32/F16/BF16 KV, groups "
           "1/3/4, head_dim 64/128/80/36, contexts 1..300, windows none/1/40/257, soft-capped)\n",
           worst_all);
}

/* (c) Quantized KV (--kv-dtype q8_0 / q4_0, K and V apart: llama.cpp's -ctk / -ctv): every slot
 * written through kv_store, then attention over that cache equals, bit for bit, attention over
 * an F32 cache holding its dequantized rows (the kernels read the same floats; a tile of one
 * head is dequantized at a time), for a 300-token prefill across a segment boundary, and each
 * token alone on 2 threads equals its row of the batch. */
static void test_attention_quantized_kv(void) {
    const pgd_type kts[] = {PGD_TYPE_Q8_0, PGD_TYPE_Q4_0, PGD_TYPE_Q8_0, PGD_TYPE_F16};
    const pgd_type vts[] = {PGD_TYPE_Q8_0, PGD_TYPE_Q4_0, PGD_TYPE_F16, PGD_TYPE_Q4_0};
    const int hds[] = {64, 32};
    enum { N = 300, SLOTS = N_BLOCKS * BS };
    int32_t bt[N_BLOCKS], pos[N], seq[N], tok[N], all_tok[SLOTS], all_pos[SLOTS], all_seq[SLOTS];
    int64_t slot[N], all_slot[SLOTS];
    for (int i = 0; i < N_BLOCKS; i++) bt[i] = (i * 29 + 7) % N_BLOCKS;
    const int32_t *tables[1] = {bt};
    for (int t = 0; t < N; t++)
        pos[t] = t, seq[t] = 0, tok[t] = 0, slot[t] = (int64_t)bt[t / BS] * BS + t % BS;
    for (int i = 0; i < SLOTS; i++) all_tok[i] = all_pos[i] = all_seq[i] = 0, all_slot[i] = i;
    pgd_step st = {N, tok, pos, seq, slot, tables, 0, NULL, 0, 0, 0};
    pgd_step fill_all = {SLOTS, all_tok, all_pos, all_seq, all_slot, tables, 0, NULL, 0, 0, 0};
    long n_cases = 0;
    for (int ci = 0; ci < 4; ci++)
        for (int hi = 0; hi < 2; hi++) {
            int hd = hds[hi], n_kv = 2, n_head = 6, kv_dim = n_kv * hd;
            size_t krb = pgd_type_row_bytes(kts[ci], (uint64_t)kv_dim);
            size_t vrb = pgd_type_row_bytes(vts[ci], (uint64_t)kv_dim);
            float *k = malloc((size_t)SLOTS * kv_dim * 4), *v = malloc((size_t)SLOTS * kv_dim * 4);
            fill(k, (size_t)SLOTS * kv_dim, 2.0f);
            fill(v, (size_t)SLOTS * kv_dim, 1.0f);
            uint8_t *KQ = malloc(SLOTS * krb), *VQ = malloc(SLOTS * vrb);
            float *KF = malloc((size_t)SLOTS * kv_dim * 4), *VF = malloc((size_t)SLOTS * kv_dim * 4);
            pgd_kv_layer lq = {kts[ci], vts[ci], KQ, VQ, BS, kv_dim, 0, 0, 0};
            pgd_kv_layer lf = {PGD_TYPE_F32, PGD_TYPE_F32, KF, VF, BS, kv_dim, 0, 0, 0};
            be2.ops->kv_store(&be2, &lq, k, v, &fill_all);
            for (int i = 0; i < SLOTS; i++) {
                pgd_dequantize_row(kts[ci], KQ + i * krb, KF + (size_t)i * kv_dim, kv_dim);
                pgd_dequantize_row(vts[ci], VQ + i * vrb, VF + (size_t)i * kv_dim, kv_dim);
            }
            size_t row = (size_t)n_head * hd;
            float *q = malloc(N * row * 4), *oq = malloc(N * row * 4), *of = malloc(N * row * 4);
            float *oa = malloc(row * 4);
            fill(q, N * row, 2.0f);
            be2.ops->attention(&be2, q, &lq, oq, n_head, n_kv, hd, &st);
            be2.ops->attention(&be2, q, &lf, of, n_head, n_kv, hd, &st);
            CHECK(memcmp(oq, of, N * row * 4) == 0);
            long bad = 0;
            for (int t = 0; t < N; t += 13) {
                pgd_step one = {1, tok + t, pos + t, seq + t, slot + t, tables, 0, NULL, 0, 0, 0};
                be2.ops->attention(&be2, q + t * row, &lq, oa, n_head, n_kv, hd, &one);
                bad += memcmp(oa, oq + t * row, row * 4) != 0;
            }
            CHECK_EQ_INT(bad, 0);
            n_cases++;
            free(k), free(v), free(KQ), free(VQ), free(KF), free(VF);
            free(q), free(oq), free(of), free(oa);
        }
    printf("quantized KV attention: %ld cases (K/V q8_0/q8_0, q4_0/q4_0, q8_0/f16, f16/q4_0; head "
           "64 and 32) equal to the dequantized cache, bit for bit, batched and alone\n", n_cases);
}

/* (b) A mixed batch (a prefill chunk of seq 0 at 250..313, a decode of seq 1 at 700, a 30-token
 * prompt of seq 2) on 2 threads, then on 1 thread, then each token alone, then three at a time:
 * all bit-identical, with no window and with sliding windows of 20, 100 and 300 positions.
 * Alone or three on two threads, a context longer than one attention segment (256 positions) is
 * split over the threads and merged; in the batch it is folded in one item, with up to 8 tokens
 * of its sequence (some of them crossing into the second segment). */
static void test_attention_invariance(void) {
    const pgd_type dts[] = {PGD_TYPE_F32, PGD_TYPE_F16, PGD_TYPE_BF16};
    const int hds[] = {64, 36};
    enum { N = 64 + 1 + 30 };
    int32_t t0[N_BLOCKS], t1[N_BLOCKS], t2[N_BLOCKS], pos[N], seq[N], tok[N] = {0};
    int64_t slot[N];
    for (int i = 0; i < N_BLOCKS; i++) {
        t0[i] = i;
        t1[i] = N_BLOCKS - 1 - i;
        t2[i] = (i * 5 + 3) % N_BLOCKS;
    }
    const int32_t *tables[3] = {t0, t1, t2};
    int n = 0;
    for (int i = 0; i < 64; i++, n++) pos[n] = 250 + i, seq[n] = 0;
    pos[n] = 700, seq[n] = 1, n++;
    for (int i = 0; i < 30; i++, n++) pos[n] = i, seq[n] = 2;
    for (int i = 0; i < N; i++) slot[i] = (int64_t)tables[seq[i]][pos[i] / BS] * BS + pos[i] % BS;
    const int windows[] = {0, 20, 100, 300};
    for (int wi = 0; wi < 4; wi++)
    for (int di = 0; di < 3; di++)
        for (int hi = 0; hi < 2; hi++) {
            int hd = hds[hi], n_kv = 2, n_head = 6;
            kvpool p = {dts[di], n_kv, hd, n_kv * hd, NULL, NULL};
            kv_fill(&p, 2.0f); /* the pools share slots across sequences: only reads here */
            size_t row = (size_t)n_head * hd;
            float *q = malloc(N * row * sizeof *q), *o2 = malloc(N * row * sizeof *o2);
            float *o1 = malloc(N * row * sizeof *o1), *oa = malloc(row * sizeof *oa);
            fill(q, N * row, 2.0f);
            pgd_kv_layer kl = layer_of(&p);
            kl.window = windows[wi];
            pgd_step st = {N, tok, pos, seq, slot, tables, 0, NULL, 0, 0, 0};
            be2.ops->attention(&be2, q, &kl, o2, n_head, n_kv, hd, &st);
            be1.ops->attention(&be1, q, &kl, o1, n_head, n_kv, hd, &st);
            CHECK(memcmp(o1, o2, N * row * sizeof *o1) == 0);
            long bad = 0;
            for (int t = 0; t < N; t++) {
                pgd_step one = {1, tok + t, pos + t, seq + t, slot + t, tables, 0, NULL, 0, 0, 0};
                be2.ops->attention(&be2, q + t * row, &kl, oa, n_head, n_kv, hd, &one);
                if (memcmp(oa, o2 + t * row, row * sizeof *oa) != 0) bad++;
            }
            CHECK_EQ_INT(bad, 0);
            for (int t = 0; t + 3 <= N; t += 3) { /* 3 tokens: split on 2 threads */
                pgd_step three = {3, tok + t, pos + t, seq + t, slot + t, tables, 0, NULL, 0, 0, 0};
                be2.ops->attention(&be2, q + t * row, &kl, o1, n_head, n_kv, hd, &three);
                if (memcmp(o1, o2 + t * row, 3 * row * sizeof *o1) != 0) bad++;
            }
            CHECK_EQ_INT(bad, 0);
            free(q);
            free(o1);
            free(o2);
            free(oa);
            free(p.k);
            free(p.v);
        }
}

/* ---- Row ops ------------------------------------------------------------------------------- */

/* (d) Each row op on a batch of R rows (parallel on 2 threads), on 1 thread, and row by row
 * alone: bit-identical. Dims include tails that are not a multiple of 8 or 32. */
static void test_row_ops(void) {
    const int dims[] = {576, 100, 1539};
    enum { R = 64 };
    for (int di = 0; di < 3; di++) {
        int dim = dims[di];
        size_t N = (size_t)R * dim, bytes = N * sizeof(float);
        float *x = malloc(bytes), *d = malloc(bytes), *w = malloc((size_t)dim * 4);
        float *xa = malloc(bytes), *xb = malloc(bytes), *oa = malloc(bytes), *ob = malloc(bytes);
        float *oc = malloc(bytes), *xc = malloc(bytes);
        fill(x, N, 3.0f);
        fill(d, N, 1.0f);
        fill(w, (size_t)dim, 1.0f);
        /* rms_norm */
        be2.ops->rms_norm(&be2, x, w, oa, R, dim, 1e-5f);
        be1.ops->rms_norm(&be1, x, w, ob, R, dim, 1e-5f);
        for (int t = 0; t < R; t++)
            be2.ops->rms_norm(&be2, x + (size_t)t * dim, w, oc + (size_t)t * dim, 1, dim, 1e-5f);
        CHECK(memcmp(oa, ob, bytes) == 0 && memcmp(oa, oc, bytes) == 0);
        double e = 0;
        for (int t = 0; t < R; t++) {
            double ss = 0;
            for (int i = 0; i < dim; i++) ss += (double)x[t * dim + i] * x[t * dim + i];
            double sc = 1.0 / sqrt(ss / dim + 1e-5);
            for (int i = 0; i < dim; i++) {
                double want = w[i] * (x[t * dim + i] * sc);
                e = fmax(e, fabs(oa[t * dim + i] - want) / (fabs(want) + 1e-3));
            }
        }
        CHECK(e < 1e-5);
        /* add_rms_norm: x and out */
        memcpy(xa, x, bytes);
        memcpy(xb, x, bytes);
        memcpy(xc, x, bytes);
        be2.ops->add_rms_norm(&be2, xa, d, w, oa, R, dim, 1e-5f);
        be1.ops->add_rms_norm(&be1, xb, d, w, ob, R, dim, 1e-5f);
        for (int t = 0; t < R; t++)
            be2.ops->add_rms_norm(&be2, xc + (size_t)t * dim, d + (size_t)t * dim, w,
                                  oc + (size_t)t * dim, 1, dim, 1e-5f);
        CHECK(memcmp(oa, ob, bytes) == 0 && memcmp(oa, oc, bytes) == 0);
        CHECK(memcmp(xa, xb, bytes) == 0 && memcmp(xa, xc, bytes) == 0);
        /* silu_gate and gelu_gate: the batch as one flat array vs each row's slice */
        for (int gelu = 0; gelu < 2; gelu++) {
            void (*gate)(pgd_backend *, float *, const float *, size_t) =
                gelu ? be2.ops->gelu_gate : be2.ops->silu_gate;
            memcpy(xa, x, bytes);
            memcpy(xb, x, bytes);
            memcpy(xc, x, bytes);
            gate(&be2, xa, d, N);
            gate(&be1, xb, d, N);
            for (int t = 0; t < R; t++)
                gate(&be2, xc + (size_t)t * dim, d + (size_t)t * dim, (size_t)dim);
            CHECK(memcmp(xa, xb, bytes) == 0 && memcmp(xa, xc, bytes) == 0);
            e = 0;
            for (size_t i = 0; i < N; i++) {
                double z = 0.7978845608028654 * ((double)x[i] + 0.044715 * pow(x[i], 3));
                double act = gelu ? 0.5 * x[i] * (1.0 + tanh(z))
                                  : (double)x[i] / (1.0 + exp(-(double)x[i]));
                double want = act * d[i];
                e = fmax(e, fabs(xa[i] - want) / (fabs(want) + 1e-30));
            }
            CHECK(e < 1e-6);
        }
        /* add, add_bias */
        memcpy(xa, x, bytes);
        memcpy(xc, x, bytes);
        be2.ops->add(&be2, xa, d, N);
        for (int t = 0; t < R; t++)
            be1.ops->add(&be1, xc + (size_t)t * dim, d + (size_t)t * dim, (size_t)dim);
        CHECK(memcmp(xa, xc, bytes) == 0);
        for (size_t i = 0; i < N; i++) CHECK(xa[i] == x[i] + d[i]);
        be2.ops->add_bias(&be2, xa, w, R, dim);
        for (int t = 0; t < R; t++) be1.ops->add_bias(&be1, xc + (size_t)t * dim, w, 1, dim);
        CHECK(memcmp(xa, xc, bytes) == 0);
        free(x), free(d), free(w), free(xa), free(xb), free(oa), free(ob), free(oc), free(xc);
    }
}

/* RoPE (both modes) and kv_store: batch vs alone, 1 vs 2 threads; the F16/BF16 stores equal
 * the scalar conversions bit for bit on special values. */
static void test_rope_kv_store(void) {
    enum { N = 200 };
    const int hds[] = {64, 36};
    int32_t pos[N], seq[N] = {0}, tok[N] = {0}, bt[N_BLOCKS];
    int64_t slot[N];
    for (int i = 0; i < N_BLOCKS; i++) bt[i] = i;
    const int32_t *tables[1] = {bt};
    for (int t = 0; t < N; t++) pos[t] = (t * 37) % 700, slot[t] = (t * 13) % (N_BLOCKS * BS);
    pgd_step st = {N, tok, pos, seq, slot, tables, 0, NULL, 0, 0, 0};
    for (int hi = 0; hi < 2; hi++) {
        int hd = hds[hi], nh = 6, half = hd / 2;
        float inv_freq[64];
        for (int i = 0; i < half; i++) inv_freq[i] = 1.0f / powf(10000.0f, 2.0f * i / hd);
        size_t row = (size_t)nh * hd, bytes = N * row * sizeof(float);
        float *x = malloc(bytes), *a = malloc(bytes), *b = malloc(bytes), *c = malloc(bytes);
        fill(x, N * row, 2.0f);
        for (int mode = 0; mode < 2; mode++) {
            pgd_rope_params rp = {mode, hd, inv_freq, NULL, false};
            memcpy(a, x, bytes);
            memcpy(b, x, bytes);
            memcpy(c, x, bytes);
            be2.ops->begin(&be2, &st, &rp);
            be2.ops->rope(&be2, a, N, nh, &rp);
            be1.ops->begin(&be1, &st, &rp);
            be1.ops->rope(&be1, b, N, nh, &rp);
            CHECK(memcmp(a, b, bytes) == 0);
            double e = 0;
            for (int t = 0; t < N; t++) {
                pgd_step one = {1, tok + t, pos + t, seq + t, slot + t, tables, 0, NULL, 0, 0, 0};
                be2.ops->begin(&be2, &one, &rp);
                be2.ops->rope(&be2, c + t * row, 1, nh, &rp);
                for (int h = 0; h < nh; h++)
                    for (int i = 0; i < half; i++) {
                        int i0 = mode ? i : 2 * i, i1 = mode ? i + half : 2 * i + 1;
                        double ang = (double)(float)((float)pos[t] * inv_freq[i]);
                        const float *v = x + t * row + h * hd;
                        double r0 = v[i0] * cos(ang) - v[i1] * sin(ang);
                        double r1 = v[i1] * cos(ang) + v[i0] * sin(ang);
                        e = fmax(e, fabs(a[t * row + h * hd + i0] - r0));
                        e = fmax(e, fabs(a[t * row + h * hd + i1] - r1));
                    }
            }
            CHECK(memcmp(a, c, bytes) == 0);
            CHECK(e < 1e-5);
        }
        free(x), free(a), free(b), free(c);
    }
    /* kv_store: kv_dim 8k + 5 so both the vector body and the scalar tail see special values */
    const pgd_type dts[] = {PGD_TYPE_F16, PGD_TYPE_BF16, PGD_TYPE_F32};
    int kv_dim = 93;
    size_t n = (size_t)N * kv_dim;
    float *k = malloc(n * 4), *v = malloc(n * 4);
    for (size_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)next_u64();
        switch (i % 7) {
        case 0: memcpy(&k[i], &u, 4); break;            /* any bits: NaN, inf, subnormal */
        case 1: k[i] = ldexpf(frand(), -14 - (int)(i % 12)); break; /* fp16 subnormals */
        case 2: k[i] = 65504.0f + (float)(i % 40); break;           /* fp16 overflow edge */
        default: k[i] = 10.0f * frand();
        }
        v[i] = frand();
        if (i % 11 == 0) v[i] = -0.0f;
    }
    for (int di = 0; di < 3; di++) {
        size_t es = pgd_dtype_size(dts[di]), sb = (size_t)N_BLOCKS * BS * kv_dim * es;
        uint8_t *K1 = calloc(sb, 1), *V1 = calloc(sb, 1), *K2 = calloc(sb, 1), *V2 = calloc(sb, 1);
        pgd_kv_layer l1 = {dts[di], dts[di], K1, V1, BS, kv_dim, 0, 0, 0};
        pgd_kv_layer l2 = {dts[di], dts[di], K2, V2, BS, kv_dim, 0, 0, 0};
        be2.ops->kv_store(&be2, &l2, k, v, &st);
        for (int t = 0; t < N; t++) {
            pgd_step one = {1, tok + t, pos + t, seq + t, slot + t, tables, 0, NULL, 0, 0, 0};
            be1.ops->kv_store(&be1, &l1, k + (size_t)t * kv_dim, v + (size_t)t * kv_dim, &one);
        }
        CHECK(memcmp(K1, K2, sb) == 0 && memcmp(V1, V2, sb) == 0);
        long bad = 0;
        for (int t = 0; t < N; t++)
            for (int i = 0; i < kv_dim; i++) {
                size_t si = (size_t)slot[t] * kv_dim + i, xi = (size_t)t * kv_dim + i;
                if (es == 4) {
                    if (memcmp((float *)K2 + si, &k[xi], 4) != 0) bad++;
                    continue;
                }
                uint16_t want = dts[di] == PGD_TYPE_F16 ? pgd_fp32_to_fp16(k[xi])
                                                         : pgd_fp32_to_bf16(k[xi]);
                uint16_t wv = dts[di] == PGD_TYPE_F16 ? pgd_fp32_to_fp16(v[xi])
                                                       : pgd_fp32_to_bf16(v[xi]);
                if (((uint16_t *)K2)[si] != want || ((uint16_t *)V2)[si] != wv) bad++;
            }
        CHECK_EQ_INT(bad, 0);
        free(K1), free(V1), free(K2), free(V2);
    }
    free(k);
    free(v);
}

/* ---- mixture of experts ---------------------------------------------------------------- */

/* One SwiGLU expert in double precision: down(silu(gate x) * up x), element c. */
static double expert_ref(const float *wg, const float *wu, const float *wd, const float *x,
                         int D, int F, int c) {
    double y = 0;
    for (int f = 0; f < F; f++) {
        double a = 0, b = 0;
        for (int i = 0; i < D; i++) {
            a += (double)wg[(size_t)f * D + i] * x[i];
            b += (double)wu[(size_t)f * D + i] * x[i];
        }
        y += (double)wd[(size_t)c * F + f] * (a / (1 + exp(-a))) * b;
    }
    return y;
}

/* The moe op against a double-precision reference written from its definition (backend.h), with
 * a tied router row (the lower index must win), both weightings and with or without a shared
 * expert (Qwen2-MoE: sigmoid-gated, run by every token), and its batch invariance:
 * every row alone, inside the batch, on 1 and 2 threads, bit for bit. F32 experts of 16 inputs
 * (the backends' activation rows hold 64 bytes). */
static void test_moe(void) {
    enum { E = 6, D = 16, F = 16, FS = 12, R = 9 };
    float *sg = malloc(sizeof(float) * FS * D), *su = malloc(sizeof(float) * FS * D);
    float *sd = malloc(sizeof(float) * D * FS), *si = malloc(sizeof(float) * D);
    fill(sg, (size_t)FS * D, 0.5f);
    fill(su, (size_t)FS * D, 0.5f);
    fill(sd, (size_t)D * FS, 0.5f);
    fill(si, D, 0.5f);
    pgd_weight shg = {PGD_TYPE_F32, D, FS, D * sizeof(float), sg, false};
    pgd_weight shu = {PGD_TYPE_F32, D, FS, D * sizeof(float), su, false};
    pgd_weight shd = {PGD_TYPE_F32, FS, D, FS * sizeof(float), sd, false};
    pgd_weight shi = {PGD_TYPE_F32, D, 1, D * sizeof(float), si, false};
    float *wg = malloc(sizeof(float) * E * F * D), *wu = malloc(sizeof(float) * E * F * D);
    float *wd = malloc(sizeof(float) * E * D * F), *x = malloc(sizeof(float) * R * D);
    float *lg = malloc(sizeof(float) * R * E), *oa = malloc(sizeof(float) * R * D);
    float *ob = malloc(sizeof(float) * R * D), *oc = malloc(sizeof(float) * R * D);
    fill(wg, (size_t)E * F * D, 0.5f);
    fill(wu, (size_t)E * F * D, 0.5f);
    fill(wd, (size_t)E * D * F, 0.5f);
    fill(x, (size_t)R * D, 1.0f);
    fill(lg, (size_t)R * E, 2.0f);
    lg[3 * E + 1] = lg[3 * E + 4] = 5.0f; /* row 3: experts 1 and 4 tie at the top */
    lg[3 * E + 2] = 4.0f;
    pgd_weight g[E], u[E], dn[E];
    for (int e = 0; e < E; e++) {
        g[e] = (pgd_weight){PGD_TYPE_F32, D, F, D * sizeof(float), wg + (size_t)e * F * D, false};
        u[e] = (pgd_weight){PGD_TYPE_F32, D, F, D * sizeof(float), wu + (size_t)e * F * D, false};
        dn[e] = (pgd_weight){PGD_TYPE_F32, F, D, F * sizeof(float), wd + (size_t)e * D * F, false};
    }
    for (int k = 1; k <= 3; k++)
        for (int norm = 0; norm < 2; norm++) {
            bool shared = k == 2;
            pgd_moe m = {.n_expert = E, .n_used = k, .ffn_dim = F, .norm = norm, .gate = g,
                         .up = u, .down = dn};
            if (shared)
                m = (pgd_moe){.n_expert = E, .n_used = k, .ffn_dim = F, .norm = norm, .gate = g,
                              .up = u, .down = dn, .shared_ffn_dim = FS, .shared_gate = &shg,
                              .shared_up = &shu, .shared_down = &shd, .shared_inp = &shi};
            float *work = malloc(pgd_moe_work_floats(R, D, &m) * sizeof(float));
            be2.ops->moe(&be2, &m, x, lg, oa, work, R, D);
            be1.ops->moe(&be1, &m, x, lg, ob, work, R, D);
            for (int t = 0; t < R; t++)
                be2.ops->moe(&be2, &m, x + t * D, lg + t * E, oc + t * D, work, 1, D);
            CHECK(memcmp(oa, ob, sizeof(float) * R * D) == 0);
            CHECK(memcmp(oa, oc, sizeof(float) * R * D) == 0);
            double worst = 0;
            for (int t = 0; t < R; t++) {
                const float *l = lg + t * E;
                int sel[3];
                double p[3], mx = l[0], sum = 0, chosen = 0;
                for (int e = 1; e < E; e++) mx = l[e] > mx ? l[e] : mx;
                for (int e = 0; e < E; e++) sum += exp(l[e] - mx);
                for (int j = 0; j < k; j++) {
                    int best = -1;
                    for (int e = 0; e < E; e++) {
                        bool used = false;
                        for (int q = 0; q < j; q++) used |= sel[q] == e;
                        if (!used && (best < 0 || l[e] > l[best])) best = e;
                    }
                    sel[j] = best;
                    p[j] = exp(l[best] - mx) / sum;
                    chosen += p[j];
                }
                if (t == 3) CHECK(sel[0] == 1 && (k < 2 || sel[1] == 4));
                double gate = 0;
                for (int i = 0; i < D; i++) gate += (double)si[i] * x[t * D + i];
                for (int c = 0; c < D; c++) {
                    double want = 0;
                    for (int j = 0; j < k; j++) {
                        size_t e = (size_t)sel[j];
                        double y = expert_ref(wg + e * F * D, wu + e * F * D, wd + e * D * F,
                                              x + t * D, D, F, c);
                        want += (norm ? p[j] / chosen : p[j]) * y;
                    }
                    if (shared)
                        want += expert_ref(sg, su, sd, x + t * D, D, FS, c) / (1 + exp(-gate));
                    double d = fabs(oa[t * D + c] - want) / (1 + fabs(want));
                    if (d > worst) worst = d;
                }
            }
            CHECK(worst < 1e-5);
            free(work);
        }
    free(wg), free(wu), free(wd), free(x), free(lg), free(oa), free(ob), free(oc);
    free(sg), free(su), free(sd), free(si);
}

/* The LoRA op: y[t] += scale * B (A x[t]) with row t's adapter, against double precision, on
 * slices (A's columns lda apart, B's rows of a wider matrix ldb apart, as tensor parallel
 * takes them), with rows of no adapter and of an adapter that leaves the matrix alone
 * untouched; bit-identical on 1 and 2 threads and for each row alone. Sizes reach every path:
 * 32- and 8-wide output groups and the scalar tail, dot products with tails, the pool (400 rows)
 * and the calling thread alone (one row). F16 and BF16 matrices give exactly what F32 copies of
 * their values give (each element widened exactly). */
static void test_lora(void) {
    enum { IN = 200, LDA = 260, IN_LO = 30, OUT = 75, LDB = 100, OUT_LO = 20, R = 400 };
    const int ranks[2] = {5, 12};
    const pgd_type types[3] = {PGD_TYPE_F32, PGD_TYPE_F16, PGD_TYPE_BF16};
    float *a[2], *bt[2];
    uint16_t *a16[2], *bt16[2];
    float *x = malloc(sizeof(float) * R * IN), *y0 = malloc(sizeof(float) * R * OUT);
    float *ya = malloc(sizeof(float) * R * OUT), *yb = malloc(sizeof(float) * R * OUT);
    float *yc = malloc(sizeof(float) * R * OUT), *yf = malloc(sizeof(float) * R * OUT);
    float *work = malloc(sizeof(float) * R * 12);
    int32_t adapter[R];
    fill(x, (size_t)R * IN, 1.0f);
    fill(y0, (size_t)R * OUT, 1.0f);
    for (int t = 0; t < R; t++) adapter[t] = t % 4; /* none, 1, 2, 3 (no delta) */
    for (int k = 0; k < 2; k++) {
        size_t na = (size_t)ranks[k] * LDA, nb = (size_t)ranks[k] * LDB;
        a[k] = malloc(sizeof(float) * na), bt[k] = malloc(sizeof(float) * nb);
        a16[k] = malloc(2 * na), bt16[k] = malloc(2 * nb);
    }
    for (int ti = 0; ti < 3; ti++) {
        pgd_type ty = types[ti];
        pgd_lora_mat mats[3] = {{0}}, f32[3] = {{0}}; /* mats[2]: no delta on this matrix */
        for (int k = 0; k < 2; k++) {
            size_t na = (size_t)ranks[k] * LDA, nb = (size_t)ranks[k] * LDB;
            fill(a[k], na, 0.5f);
            fill(bt[k], nb, 0.5f);
            for (size_t i = 0; ty != PGD_TYPE_F32 && i < na + nb; i++) {
                float *v = i < na ? &a[k][i] : &bt[k][i - na];
                uint16_t *h = i < na ? &a16[k][i] : &bt16[k][i - na];
                *h = ty == PGD_TYPE_F16 ? pgd_fp32_to_fp16(*v) : pgd_fp32_to_bf16(*v);
                *v = ty == PGD_TYPE_F16 ? pgd_fp16_to_fp32(*h) : pgd_bf16_to_fp32(*h);
            }
            float scale = k ? 0.75f : 2.0f;
            f32[k] = (pgd_lora_mat){a[k] + IN_LO, bt[k] + OUT_LO, PGD_TYPE_F32, ranks[k], LDA,
                                    LDB, scale};
            mats[k] = ty == PGD_TYPE_F32
                          ? f32[k]
                          : (pgd_lora_mat){a16[k] + IN_LO, bt16[k] + OUT_LO, ty, ranks[k], LDA,
                                           LDB, scale};
        }
        memcpy(ya, y0, sizeof(float) * R * OUT);
        memcpy(yb, y0, sizeof(float) * R * OUT);
        memcpy(yc, y0, sizeof(float) * R * OUT);
        memcpy(yf, y0, sizeof(float) * R * OUT);
        be2.ops->lora(&be2, mats, adapter, x, ya, work, R, IN, OUT, 12);
        be1.ops->lora(&be1, mats, adapter, x, yb, work, R, IN, OUT, 12);
        for (int t = 0; t < R; t++)
            be2.ops->lora(&be2, mats, adapter + t, x + t * IN, yc + t * OUT, work, 1, IN, OUT, 12);
        be2.ops->lora(&be2, f32, adapter, x, yf, work, R, IN, OUT, 12);
        CHECK(memcmp(ya, yb, sizeof(float) * R * OUT) == 0);
        CHECK(memcmp(ya, yc, sizeof(float) * R * OUT) == 0);
        CHECK(memcmp(ya, yf, sizeof(float) * R * OUT) == 0);
        double worst = 0;
        int untouched = 0;
        for (int t = 0; t < R; t++) {
            int k = adapter[t] - 1;
            if (k < 0 || k > 1) {
                untouched += !memcmp(ya + t * OUT, y0 + t * OUT, sizeof(float) * OUT);
                continue;
            }
            const float *ak = a[k] + IN_LO, *bk = bt[k] + OUT_LO;
            double u[12];
            for (int j = 0; j < ranks[k]; j++) {
                u[j] = 0;
                for (int i = 0; i < IN; i++) u[j] += (double)ak[j * LDA + i] * x[t * IN + i];
            }
            for (int o = 0; o < OUT; o++) {
                double d = 0;
                for (int j = 0; j < ranks[k]; j++) d += (double)bk[j * LDB + o] * u[j];
                double want = y0[t * OUT + o] + mats[k].scale * d;
                double e = fabs(ya[t * OUT + o] - want) / (1 + fabs(want));
                if (e > worst) worst = e;
            }
        }
        CHECK_EQ_INT(untouched, R / 2);
        CHECK(worst < 1e-5);
    }
    for (int k = 0; k < 2; k++) free(a[k]), free(bt[k]), free(a16[k]), free(bt16[k]);
    free(x), free(y0), free(ya), free(yb), free(yc), free(yf), free(work);
}

int main(void) {
    pgd_err err = {0};
    if (pgd_pool_create(1, &pool1, &err) || pgd_pool_create(2, &pool2, &err)) return 1;
    mk_backend(&be1, pool1);
    mk_backend(&be2, pool2);
    test_expf();
    test_attention_ref();
    test_attention_invariance();
    test_attention_quantized_kv();
    test_row_ops();
    test_rope_kv_store();
    test_moe();
    test_lora();
    be1.ops->free(&be1);
    be2.ops->free(&be2);
    pgd_pool_free(pool1);
    pgd_pool_free(pool2);
    return test_report("test_cpu_ops");
}
