/* Speed of the CPU backend's paged attention alone (not a test): B sequences, each with one
 * decode token at position CTX - 1 (or, with PREFILL=N, one sequence whose last N tokens are a
 * prefill chunk), over NLAYER distinct K/V layers (so the cache streams from memory as in a
 * model's step), blocks of 16 slots scattered over the pool. Prints the K/V bytes read per call
 * and GB/s (decode), or GFLOP/s of QK^T and PV (prefill); median of REPS passes over the layers.
 * Build (from the repo root, after cmake --build build-bench):
 *   gcc -O2 -mavx2 -mfma -mf16c -Isrc -Iinclude bench/bench_attn.c build-bench/libpagoda.a -lm \
 *       -lpthread -o /tmp/bench_attn
 *   /tmp/bench_attn THREADS B CTX [N_HEAD N_KV HEAD_DIM KV_TYPE]   (defaults: SmolLM2-135M's
 *                                                      9 3 64, KV_TYPE 0 F32 / 1 F16 / 30 BF16)
 * Environment: NLAYER (30), REPS (9), PREFILL (0), SEQBLK=1 (blocks in order), HUGE=1 (K/V in
 * transparent huge pages). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "backend/backend.h"
#include "backend/cpu/pool.h"
#include "backend/cpu/quant.h"
#include "util/clock.h"

#define BS 16

static int env_int(const char *name, int dflt) {
    const char *v = getenv(name);
    return v ? atoi(v) : dflt;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: bench_attn THREADS B CTX [N_HEAD N_KV HEAD_DIM KV_TYPE]\n");
        return 2;
    }
    int nth = atoi(argv[1]), nseq = atoi(argv[2]), ctx = atoi(argv[3]);
    int n_head = argc > 4 ? atoi(argv[4]) : 9, n_kv = argc > 5 ? atoi(argv[5]) : 3;
    int hd = argc > 6 ? atoi(argv[6]) : 64;
    pgd_type dt = argc > 7 ? (pgd_type)atoi(argv[7]) : PGD_TYPE_F32;
    int nlayer = env_int("NLAYER", 30), reps = env_int("REPS", 9), pre = env_int("PREFILL", 0);
    if (pre > 0) nseq = 1;
    if (nth < 1 || nseq < 1 || ctx < 1 || n_kv < 1 || n_head % n_kv || hd < 1 || nlayer < 1 ||
        reps < 1 || pre > ctx || (dt != PGD_TYPE_F32 && dt != PGD_TYPE_F16 && dt != PGD_TYPE_BF16))
        return 2;
    int ntok = pre > 0 ? pre : nseq, bps = (ctx + BS - 1) / BS, nblk = bps * nseq;
    size_t kv_dim = (size_t)n_kv * hd, es = pgd_dtype_size(dt);
    size_t layer_bytes = (size_t)nblk * BS * kv_dim * es;
    pgd_pool *pool;
    pgd_err e;
    if (pgd_pool_create(nth, &pool, &e)) return 1;
    pgd_backend be = {&pgd_cpu_backend_ops, 0, pool, NULL};
    if (be.ops->init(&be, ntok, 4096, n_head, n_kv, hd, &e)) return 1;
    int32_t *bt = malloc((size_t)nblk * sizeof *bt), *pos = malloc((size_t)ntok * sizeof *pos);
    int32_t *seq = malloc((size_t)ntok * sizeof *seq), *tok = calloc((size_t)ntok, sizeof *tok);
    int64_t *slot = malloc((size_t)ntok * sizeof *slot);
    const int32_t **tables = malloc((size_t)nseq * sizeof *tables);
    float *q = malloc((size_t)ntok * n_head * hd * sizeof *q);
    float *out = malloc((size_t)ntok * n_head * hd * sizeof *out);
    void **k = malloc((size_t)nlayer * sizeof *k), **v = malloc((size_t)nlayer * sizeof *v);
    if (!bt || !pos || !seq || !tok || !slot || !tables || !q || !out || !k || !v) return 1;
    srand(1);
    for (int i = 0; i < nblk; i++) bt[i] = i;
    /* Scattered blocks, as a long-running pool has them (SEQBLK=1: in order). */
    for (int i = nblk - 1; i > 0 && !env_int("SEQBLK", 0); i--) {
        int j = rand() % (i + 1), t = bt[i];
        bt[i] = bt[j];
        bt[j] = t;
    }
    for (int s = 0; s < nseq; s++) tables[s] = bt + (size_t)s * bps;
    for (int t = 0; t < ntok; t++) {
        seq[t] = pre > 0 ? 0 : t;
        pos[t] = pre > 0 ? ctx - pre + t : ctx - 1;
        slot[t] = (int64_t)tables[seq[t]][pos[t] / BS] * BS + pos[t] % BS;
    }
    for (size_t i = 0; i < (size_t)ntok * n_head * hd; i++) q[i] = (float)rand() / RAND_MAX - 0.5f;
    for (int l = 0; l < nlayer; l++) {
        size_t hb = (layer_bytes + (2u << 20) - 1) / (2u << 20) * (2u << 20);
        k[l] = aligned_alloc(2u << 20, hb);
        v[l] = aligned_alloc(2u << 20, hb);
        if (env_int("HUGE", 0) && k[l] && v[l]) {
            madvise(k[l], hb, MADV_HUGEPAGE);
            madvise(v[l], hb, MADV_HUGEPAGE);
        }
        if (!k[l] || !v[l]) return 1;
        uint16_t *k16 = k[l], *v16 = v[l];
        float *k32 = k[l], *v32 = v[l];
        for (size_t i = 0; i < layer_bytes / es; i++) {
            float a = (float)rand() / RAND_MAX - 0.5f, b = (float)rand() / RAND_MAX - 0.5f;
            if (dt == PGD_TYPE_F32) k32[i] = a, v32[i] = b;
            else if (dt == PGD_TYPE_F16) k16[i] = pgd_fp32_to_fp16(a), v16[i] = pgd_fp32_to_fp16(b);
            else k16[i] = pgd_fp32_to_bf16(a), v16[i] = pgd_fp32_to_bf16(b);
        }
    }
    pgd_step st = {ntok, tok, pos, seq, slot, tables, 0, NULL, 0, BS, 0};
    double *t_call = malloc((size_t)reps * sizeof *t_call);
    if (!t_call) return 1;
    for (int r = -1; r < reps; r++) { /* r = -1: warm-up */
        double t0 = pgd_now_s();
        for (int l = 0; l < nlayer; l++) {
            pgd_kv_layer kl = {dt, dt, k[l], v[l], BS, (int32_t)kv_dim, 0, 0, 0};
            be.ops->attention(&be, q, &kl, out, n_head, n_kv, hd, &st);
        }
        if (r >= 0) t_call[r] = (pgd_now_s() - t0) / nlayer;
    }
    qsort(t_call, (size_t)reps, sizeof *t_call, cmp_double);
    double med = t_call[reps / 2];
    double bytes = 2.0 * nseq * ctx * kv_dim * es; /* K and V rows of every context position */
    double pairs = 0; /* (query, position) pairs */
    for (int t = 0; t < ntok; t++) pairs += pos[t] + 1;
    double flops = pairs * n_head * hd * 4.0;
    printf("%s B=%d ctx=%d prefill=%d heads %d/%d hd %d %d threads: %.1f us per layer, "
           "%.2f GB/s K/V, %.2f GFLOP/s (best %.1f us)\n", pgd_type_name(dt), nseq, ctx, pre,
           n_head, n_kv, hd, nth, med * 1e6, bytes / med / 1e9, flops / med / 1e9, t_call[0] * 1e6);
    return 0;
}
