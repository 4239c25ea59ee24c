/* bench/gpu helper (the CMake target gpu_bench of a CUDA build; check.sh builds it):
 *   gpu_bench greedy MODEL cpu|cuda N [L]  -> prints N greedy token ids after a fixed prompt
 *                                             (L tokens: 9 by default; >= 16 takes the
 *                                             tensor-core prefill attention on CUDA)
 *   gpu_bench decode CONFIG.json B CTX STEPS -> decode tok/s at batch B with CTX-token contexts
 *   gpu_bench prefill CONFIG.json T         -> prefill tok/s for one T-token prompt
 *   gpu_bench bandwidth                     -> HBM GB/s from the copy kernel
 *   gpu_bench gemm                          -> cuBLASLt BF16 TFLOP/s (8192^3, F32 out): the
 *                                              prefill roofline
 * Dummy (random BF16) weights for CONFIG.json; one JSON object per line on stdout. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_profiler_api.h>

#include "backend/cpu/pool.h"
#include "model/model.h"
#include "sample/device_sample.h"
#include "util/clock.h"


/* Weight elements of the matrices a step multiplies by (every layer's and the LM head). */
static double matrix_params(const pgd_model_config *c) {
    return (double)c->n_vocab * c->dim +
           (double)c->n_layer * ((double)c->dim * (c->n_head + 2 * c->n_kv_head) * c->head_dim +
                                 (double)c->n_head * c->head_dim * c->dim +
                                 3.0 * (double)c->dim * c->ffn_dim);
}

/* The PAGODA_* switches set in the environment, "A=1 B=0" (the variant a figure was measured
 * with: the summary takes the medians of the default's runs). */
extern char **environ;
static const char *variant(void) {
    static char buf[512];
    size_t n = 0;
    buf[0] = 0;
    for (char **e = environ; *e; e++) {
        if (strncmp(*e, "PAGODA_", 7) || strchr(*e, '"') || strchr(*e, '\\')) continue;
        int k = snprintf(buf + n, sizeof buf - n, "%s%s", n ? " " : "", *e);
        if (k < 0 || (size_t)k >= sizeof buf - n) break;
        n += (size_t)k;
    }
    return buf;
}

static int die(const pgd_err *e) {
    fprintf(stderr, "gpu_bench: %s\n", e->msg);
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    pgd_err err = {0};
    pgd_pool *pool;
    pgd_pool_create(4, &pool, &err);
    if (!strcmp(argv[1], "bandwidth")) {
        double gbs = pgd_cuda_copy_bandwidth(0, (size_t)2 << 30, 20);
        printf("{\"bench\":\"bandwidth\",\"GBps\":%.1f}\n", gbs);
        return gbs > 0 ? 0 : 1;
    }
    if (!strcmp(argv[1], "gemm")) {
        double tf = pgd_cuda_gemm_tflops(0, 8192, 8192, 8192, 20);
        printf("{\"bench\":\"gemm\",\"TFLOPs\":%.1f}\n", tf);
        return tf > 0 ? 0 : 1;
    }
    if (argc < 4) return 2;
    pgd_model_opts mo = {0};
    bool greedy = !strcmp(argv[1], "greedy");
    if (greedy) pgd_model_opts_set_device(&mo, argv[3]);
    else {
        mo.load_format = PGD_LOAD_DUMMY;
        pgd_model_opts_set_device(&mo, "cuda");
        mo.n_ctx = 4096;
    }
    pgd_model *m;
    if (pgd_model_load(argv[2], &mo, &m, &err)) return die(&err);
    /* The loader falls back to the CPU where it finds no CUDA device: here that would compare
     * the CPU with itself (or time an 8B model on the CPU), so it is a failure. */
    if (mo.device == 1 + PGD_DEVICE_CUDA && m->device != PGD_DEVICE_CUDA) {
        fprintf(stderr, "gpu_bench: asked for cuda but the model is on the CPU\n");
        return 1;
    }
    int nv = m->cfg.n_vocab;
    if (greedy) {
        int n = atoi(argv[4]), L = argc > 5 ? atoi(argv[5]) : 9;
        if (L < 1 || L > 256) return 2;
        pgd_session s;
        if (pgd_session_init(&s, m, pool, 256, &err)) return die(&err);
        int32_t prompt[256] = {1, 450, 4996, 17354, 1701, 432, 17204, 975, 278};
        for (int i = 9; i < L; i++) prompt[i] = (int32_t)((i * 7919 + 13) % 30000);
        for (int i = 0; i < L; i++) prompt[i] %= nv;
        int rc = pgd_session_forward(&s, prompt, L, false);
        printf("{\"bench\":\"greedy\",\"device\":\"%s\",\"tokens\":[", argv[3]);
        for (int g = 0; g < n && !rc; g++) {
            int32_t best = 0;
            for (int v = 1; v < nv; v++)
                if (s.logits[v] > s.logits[best]) best = v;
            printf("%s%d", g ? "," : "", best);
            rc = pgd_session_forward(&s, &best, 1, false);
        }
        printf("]}\n");
        return rc ? 1 : 0;
    }
    const int bs = 16;
    if (!strcmp(argv[1], "prefill")) {
        int T = atoi(argv[3]);
        pgd_kv_cache kv;
        pgd_fwd f;
        int nb = T / bs + 2;
        if (pgd_kv_cache_init(&kv, m, PGD_TYPE_BF16, nb, bs, &err) ||
            pgd_fwd_init(&f, m, pool, T, 1, &err))
            return die(&err);
        int32_t *tok = malloc(T * 4), *pos = malloc(T * 4), *seq = calloc(T, 4), *tab = malloc(nb * 4);
        int64_t *slot = malloc(T * 8);
        for (int i = 0; i < nb; i++) tab[i] = i;
        for (int i = 0; i < T; i++) tok[i] = (i * 7919) % nv, pos[i] = i, slot[i] = i;
        const int32_t *tables[1] = {tab};
        int32_t last = T - 1;
        pgd_batch b = {.n_tokens = T, .tokens = tok, .pos = pos, .seq = seq, .slot = slot,
                       .block_tables = tables, .n_logits = 1, .logit_rows = &last};
        pgd_model_forward(&f, &kv, &b); /* warm-up */
        double t0 = pgd_now_s();
        int reps = 3, rc = 0;
        for (int r = 0; r < reps; r++) rc |= pgd_model_forward(&f, &kv, &b);
        double dt = (pgd_now_s() - t0) / reps;
        /* matmuls (the LM head for one row) + causal attention (QK^T and PV) */
        const pgd_model_config *c = &m->cfg;
        double head = (double)c->n_vocab * c->dim;
        double flops = 2.0 * ((matrix_params(c) - head) * T + head) +
                       4.0 * c->n_layer * (double)c->n_head * c->head_dim * T * (T + 1) / 2.0;
        printf("{\"bench\":\"prefill\",\"tokens\":%d,\"tok_s\":%.1f,\"ms\":%.2f,"
               "\"gflop\":%.1f,\"variant\":\"%s\",\"rc\":%d}\n", T, T / dt, dt * 1e3,
               flops / 1e9, variant(), rc);
        return rc ? 1 : 0;
    }
    int B = atoi(argv[3]), ctx = atoi(argv[4]), steps = argc > 5 ? atoi(argv[5]) : 32;
    int per_seq = (ctx + steps) / bs + 2, nb = B * per_seq;
    pgd_kv_cache kv;
    pgd_fwd f;
    int max_tok = B > 512 ? B : 512;
    if (pgd_kv_cache_init(&kv, m, PGD_TYPE_BF16, nb, bs, &err) ||
        pgd_fwd_init(&f, m, pool, max_tok, B, &err))
        return die(&err);
    int32_t **tabs = malloc(B * sizeof *tabs);
    for (int s = 0; s < B; s++) {
        tabs[s] = malloc(per_seq * 4);
        for (int i = 0; i < per_seq; i++) tabs[s][i] = s * per_seq + i;
    }
    int32_t *tok = malloc(max_tok * 4), *pos = malloc(max_tok * 4), *seq = malloc(max_tok * 4),
            *rows = malloc(max_tok * 4);
    int64_t *slot = malloc(max_tok * 8);
    /* fill every sequence's context with 512-token prefill chunks */
    for (int s = 0; s < B; s++)
        for (int p0 = 0; p0 < ctx; p0 += 512) {
            int n = ctx - p0 < 512 ? ctx - p0 : 512;
            for (int i = 0; i < n; i++) {
                tok[i] = (p0 + i) % nv, pos[i] = p0 + i, seq[i] = s;
                slot[i] = (int64_t)tabs[s][(p0 + i) / bs] * bs + (p0 + i) % bs;
            }
            rows[0] = n - 1;
            pgd_batch b = {.n_tokens = n, .tokens = tok, .pos = pos, .seq = seq, .slot = slot,
                           .block_tables = (const int32_t *const *)tabs, .n_logits = 1,
                           .logit_rows = rows};
            if (pgd_model_forward(&f, &kv, &b)) return 1;
        }
    double t0 = 0;
    int rc = 0;
    /* greedy sampling on the device, as the server samples: only the token ids come back, and
     * each sequence's next input is its sampled token */
    pgd_sample_row *srow = calloc(B, sizeof *srow);
    int32_t *next = malloc(B * 4);
    for (int s = 0; s < B; s++) next[s] = (s + 3) % nv;
    for (int st = -2; st < steps; st++) { /* two warm-up steps */
        if (st == 0) {
            t0 = pgd_now_s();
            /* a profiler started with --profile-from-start off sees the timed steps only */
            if (cudaProfilerStart() != cudaSuccess) rc = 1;
        }
        int p = ctx + st + 2;
        for (int s = 0; s < B; s++) {
            tok[s] = next[s], pos[s] = p, seq[s] = s, rows[s] = s;
            slot[s] = (int64_t)tabs[s][p / bs] * bs + p % bs;
        }
        pgd_batch b = {.n_tokens = B, .tokens = tok, .pos = pos, .seq = seq, .slot = slot,
                       .block_tables = (const int32_t *const *)tabs, .n_logits = B,
                       .logit_rows = rows, .sample = srow, .sampled = next};
        rc |= pgd_model_forward(&f, &kv, &b);
    }
    double dt = pgd_now_s() - t0;
    if (cudaProfilerStop() != cudaSuccess) rc = 1;
    size_t wbytes = (size_t)(2.0 * matrix_params(&m->cfg)); /* BF16 */
    printf("{\"bench\":\"decode\",\"batch\":%d,\"ctx\":%d,\"steps\":%d,\"tok_s\":%.1f,"
           "\"step_ms\":%.3f,\"weight_bytes\":%zu,\"variant\":\"%s\",\"rc\":%d}\n",
           B, ctx, steps, B * steps / dt, dt / steps * 1e3, wbytes, variant(), rc);
    return rc ? 1 : 0;
}
