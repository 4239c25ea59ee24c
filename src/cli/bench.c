/* `pagoda bench`: llama-bench-style throughput (pp = prefill of a prompt, tg = decode one token
 * at a time, batchB = B sequences decoding together, one token each per step) with a
 * memory-bandwidth probe and a peak FLOP/s probe, so each figure is reported as a fraction of its
 * hardware roofline. */
#include <immintrin.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/cpu/matmul.h"
#include "backend/cpu/pool.h"
#include "cli/cli.h"
#include "model/lora.h"
#include "model/model.h"
#include "util/clock.h"
#include "util/mapfile.h"
#include "util/options.h"

#define MAX_BATCHES 16
#define BATCH_STEPS 16 /* decode steps per batched measurement */
#define BATCH_BLOCK 16 /* KV block size of the batched measurement */

typedef struct bench_opts {
    pgd_engine_opts eng;   /* the engine and model options bench takes (util/options.h) */
    const char *model;     /* eng.model */
    const char *lora;      /* --lora: every sequence runs with this adapter */
    pgd_type kv_type, v_type; /* --kv-dtype, or K's and V's apart (-ctk, -ctv) */
    long n_prompt, n_gen, threads, reps;
    long depth;            /* -d: pp and tg start after this many context tokens */
    long batches[MAX_BATCHES];
    int n_batches;
    bool json;
} bench_opts;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: pagoda bench [-m MODEL] [-p 512] [-n 128] [-d 0] [-t THREADS] [-r REPS]\n"
            "                    [--batch 1,4,16,64] [--json] [--lora DIR]\n"
            "                    [engine and model options]\n"
            "Measures pp (prefill tokens/s of a -p token prompt), tg (decode tokens/s, -n)\n"
            "and batched decode tokens/s (B sequences in their own paged KV blocks, each step\n"
            "one token per sequence with its logits, %d steps from position 0), median of -r\n"
            "runs (default 5), with the\n"
            "memory bandwidth (read-only sum over 1 GiB, best of 12) and peak FP32 FLOP/s (FMA\n"
            "loop on every thread, best of 5) of this machine, and each figure's fraction of\n"
            "its roofline.\n"
            "  -d DEPTH         pp and tg run after a DEPTH-token context (llama-bench's -d):\n"
            "                   their rooflines add the attention over it (its FLOPs to pp's,\n"
            "                   its K/V bytes to each tg step's)\n"
            "  --lora DIR       every sequence runs with this LoRA adapter (the rooflines stay\n"
            "                   the base model's)\n"
            "--load-format dummy: MODEL is a config.json (or its folder; e.g.\n"
            "configs/models/Llama-3-8B.json), random BF16 weights of its real shapes, no download\n"
            "and no tokenizer needed. --gpu-memory-utilization: loading fails if the weights\n"
            "exceed it (bench allocates exactly the KV its tests need).\n"
            "Engine and model options (the same as pagoda serve's):\n",
            BATCH_STEPS);
    pgd_opt_help(f, pgd_engine_opt_table, pgd_engine_opt_count, PGD_CMD_BENCH);
}

static int parse_batches(const char *s, bench_opts *o) {
    o->n_batches = 0;
    while (*s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 1 || v > 4096 || o->n_batches == MAX_BATCHES) return -1;
        o->batches[o->n_batches++] = v;
        s = end;
        if (*s == ',') s++;
        else if (*s) return -1;
    }
    return 0;
}

static int parse_args(int argc, char **argv, bench_opts *o) {
    long nproc = sysconf(_SC_NPROCESSORS_ONLN);
    *o = (bench_opts){.n_prompt = 512, .n_gen = 128, .reps = 5, .batches = {1, 4, 16, 64},
                      .n_batches = 4};
    if (pgd_engine_opts_init(&o->eng, PGD_CMD_BENCH)) return -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            exit(0);
        } else if (!strcmp(a, "--json")) {
            o->json = true;
            continue;
        }
        int orc = pgd_opt_parse_arg(&o->eng, pgd_engine_opt_table, pgd_engine_opt_count,
                                    PGD_CMD_BENCH, argc, argv, &i);
        if (orc < 0) return -1;
        if (orc) continue;
        if (!v) goto bad;
        int rc = 0;
        if (!strcmp(a, "--lora")) o->lora = v;
        else if (!strcmp(a, "-p")) rc = pgd_cli_parse_long(v, 0, 1 << 16, &o->n_prompt);
        else if (!strcmp(a, "-n")) rc = pgd_cli_parse_long(v, 0, 1 << 16, &o->n_gen);
        else if (!strcmp(a, "-d")) rc = pgd_cli_parse_long(v, 0, 1 << 20, &o->depth);
        else if (!strcmp(a, "-r")) rc = pgd_cli_parse_long(v, 1, 1000, &o->reps);
        else if (!strcmp(a, "--batch")) rc = parse_batches(v, o);
        else goto bad;
        if (rc != 0) {
            fprintf(stderr, "pagoda bench: bad value '%s' for %s\n", v, a);
            return -1;
        }
        i++;
        continue;
    bad:
        fprintf(stderr, "pagoda bench: unknown or incomplete option '%s'\n", a);
        usage(stderr);
        return -1;
    }
    o->model = o->eng.model;
    o->threads = o->eng.threads ? o->eng.threads : nproc > 0 ? nproc : 1;
    pgd_kv_dtype k, v;
    pgd_engine_opts_kv_types(&o->eng, &k, &v);
    o->kv_type = (pgd_type)k;
    o->v_type = (pgd_type)v;
    return 0;
}

/* ---- Hardware probes ------------------------------------------------------------------------ */

typedef struct bw_ctx {
    const float *buf; /* (n) */
    size_t n;
    float sums[1024];
} bw_ctx;

/* The probes measure the CPU's AVX2 limits whatever the build's baseline (PAGODA_PORTABLE too);
 * run_bench refuses in one line on a CPU without AVX2 and FMA. */
#define PROBE_TARGET __attribute__((target("avx2,fma")))

/* Each thread reads its part of the buffer in blocks of BW_STREAMS x BW_RUN cache lines, as
 * BW_STREAMS concurrent sequential streams BW_RUN lines apart (one line from each in turn), each
 * prefetched BW_PF lines ahead: the pattern of the decode kernels (4 panels of one matrix, a few
 * KiB to a few hundred apart, prefetched in software). Streams 128 MiB apart without prefetch
 * read ~17 GB/s on the 2-core machine where this reads ~24 and the 1.1B decode moved 23-30
 * (bench/RESULTS.md): a roofline a kernel can beat is not one. */
#define BW_STREAMS 4
#define BW_RUN 1024 /* lines: 64 KiB */
#define BW_PF 4
PROBE_TARGET static void bw_task(void *arg, int ith, int nth) {
    bw_ctx *c = arg;
    long lo, hi;
    pgd_split_range((long)(c->n / (16 * BW_STREAMS * BW_RUN)), ith, nth, &lo, &hi);
    __m256 s[2 * BW_STREAMS];
    for (int k = 0; k < 2 * BW_STREAMS; k++) s[k] = _mm256_setzero_ps();
    for (long b = lo; b < hi; b++) {
        const float *blk = c->buf + (size_t)b * 16 * BW_STREAMS * BW_RUN;
        for (long i = 0; i < BW_RUN; i++) {
            for (int k = 0; k < BW_STREAMS; k++) {
                const float *q = blk + ((size_t)k * BW_RUN + (size_t)i) * 16;
                _mm_prefetch((const char *)(q + 16 * BW_PF), _MM_HINT_T0);
                s[2 * k] = _mm256_add_ps(s[2 * k], _mm256_load_ps(q));
                s[2 * k + 1] = _mm256_add_ps(s[2 * k + 1], _mm256_load_ps(q + 8));
            }
        }
    }
    for (int k = 1; k < 2 * BW_STREAMS; k++) s[0] = _mm256_add_ps(s[0], s[k]);
    float out[8];
    _mm256_storeu_ps(out, s[0]);
    if (ith < 1024) c->sums[ith] = out[0];
}

/* Read bandwidth in bytes/s: every thread sums its part of a 1 GiB buffer; best of 12 (other
 * tenants of a shared machine take bandwidth at moments: the best reading is the machine). */
static double probe_bandwidth(pgd_pool *pool) {
    size_t bytes = (size_t)1 << 30;
    float *buf = aligned_alloc((size_t)2 << 20, bytes);
    if (!buf) return 0;
    /* In transparent huge pages where the CPU backend's weights are (model.c): the probe must
     * not pay TLB walks the model does not, nor skip those it does. */
    (void)pgd_advise_hugepages(buf, bytes);
    memset(buf, 0, bytes);
    bw_ctx c = {.buf = buf, .n = bytes / sizeof(float)};
    double best = 0;
    for (int r = 0; r < 13; r++) {
        double t = pgd_now_s();
        pgd_pool_run(pool, bw_task, &c);
        t = pgd_now_s() - t;
        if (r > 0 && (double)bytes / t > best) best = (double)bytes / t; /* run 0 warms up */
    }
    free(buf);
    return best;
}

typedef struct flops_ctx {
    long iters;
    float sink[1024];
} flops_ctx;

/* 10 independent FMA chains (more than latency x throughput = 2 x 4 on current cores), kept in
 * registers: named variables and a local trip count, so the loop is 10 FMAs and a branch. */
PROBE_TARGET static void flops_task(void *arg, int ith, int nth) {
    (void)nth;
    flops_ctx *c = arg;
    const long iters = c->iters;
    const __m256 m = _mm256_set1_ps(0.9999f), k = _mm256_set1_ps(1e-4f);
    __m256 a0 = _mm256_set1_ps(1e-3f * (float)ith), a1 = _mm256_add_ps(a0, k),
           a2 = _mm256_add_ps(a1, k), a3 = _mm256_add_ps(a2, k), a4 = _mm256_add_ps(a3, k),
           a5 = _mm256_add_ps(a4, k), a6 = _mm256_add_ps(a5, k), a7 = _mm256_add_ps(a6, k),
           a8 = _mm256_add_ps(a7, k), a9 = _mm256_add_ps(a8, k);
    for (long it = 0; it < iters; it++) {
        a0 = _mm256_fmadd_ps(a0, m, k);
        a1 = _mm256_fmadd_ps(a1, m, k);
        a2 = _mm256_fmadd_ps(a2, m, k);
        a3 = _mm256_fmadd_ps(a3, m, k);
        a4 = _mm256_fmadd_ps(a4, m, k);
        a5 = _mm256_fmadd_ps(a5, m, k);
        a6 = _mm256_fmadd_ps(a6, m, k);
        a7 = _mm256_fmadd_ps(a7, m, k);
        a8 = _mm256_fmadd_ps(a8, m, k);
        a9 = _mm256_fmadd_ps(a9, m, k);
    }
    __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                             _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)));
    s = _mm256_add_ps(s, _mm256_add_ps(a8, a9));
    float out[8];
    _mm256_storeu_ps(out, s);
    if (ith < 1024) c->sink[ith] = out[0];
}

/* flops_task in 512-bit FMAs, for CPUs whose panel GEMM runs AVX-512 (pgd_cpu_avx512). */
__attribute__((target("avx512f"))) static void flops_task512(void *arg, int ith, int nth) {
    (void)nth;
    flops_ctx *c = arg;
    const long iters = c->iters;
    const __m512 m = _mm512_set1_ps(0.9999f), k = _mm512_set1_ps(1e-4f);
    __m512 a0 = _mm512_set1_ps(1e-3f * (float)ith), a1 = _mm512_add_ps(a0, k),
           a2 = _mm512_add_ps(a1, k), a3 = _mm512_add_ps(a2, k), a4 = _mm512_add_ps(a3, k),
           a5 = _mm512_add_ps(a4, k), a6 = _mm512_add_ps(a5, k), a7 = _mm512_add_ps(a6, k),
           a8 = _mm512_add_ps(a7, k), a9 = _mm512_add_ps(a8, k);
    for (long it = 0; it < iters; it++) {
        a0 = _mm512_fmadd_ps(a0, m, k);
        a1 = _mm512_fmadd_ps(a1, m, k);
        a2 = _mm512_fmadd_ps(a2, m, k);
        a3 = _mm512_fmadd_ps(a3, m, k);
        a4 = _mm512_fmadd_ps(a4, m, k);
        a5 = _mm512_fmadd_ps(a5, m, k);
        a6 = _mm512_fmadd_ps(a6, m, k);
        a7 = _mm512_fmadd_ps(a7, m, k);
        a8 = _mm512_fmadd_ps(a8, m, k);
        a9 = _mm512_fmadd_ps(a9, m, k);
    }
    __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                             _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)));
    s = _mm512_add_ps(s, _mm512_add_ps(a8, a9));
    if (ith < 1024) c->sink[ith] = _mm512_reduce_add_ps(s);
}

/* Peak FP32 FLOP/s on all threads, in the widest FMAs the matmuls use (AVX2: 16 flops per
 * instruction; AVX-512 where the panel GEMM runs it: 32); best of 5. */
static double probe_flops(pgd_pool *pool) {
    flops_ctx c = {.iters = 20 * 1000 * 1000};
    const bool wide = pgd_cpu_avx512();
    double best = 0;
    for (int r = 0; r < 5; r++) {
        double t = pgd_now_s();
        pgd_pool_run(pool, wide ? flops_task512 : flops_task, &c);
        t = pgd_now_s() - t;
        double f = (double)c.iters * 10 * (wide ? 32 : 16) * pgd_pool_n_threads(pool) / t;
        if (f > best) best = f;
    }
    return best;
}

/* ---- Model figures ------------------------------------------------------------------------ */

typedef struct model_cost {
    double layer_params, head_params; /* multiply-adds per token: layers, LM head */
    double layer_bytes, head_bytes;   /* weight bytes read per forward call, but experts' */
    /* Mixture of experts: the bytes of one expert of every layer, and the experts of a layer a
     * step of B tokens reads: E (1 - (1 - K/E)^B) when each token's K of E are drawn at random
     * (K for one token; the router of a real model is not uniform, so this is an estimate). */
    double expert_bytes;
    int32_t n_expert, n_used;
} model_cost;

/* Weight bytes a forward step of b tokens reads. */
static double step_bytes(const model_cost *c, long b) {
    double bytes = c->layer_bytes + c->head_bytes;
    if (!c->n_expert) return bytes;
    double e = c->n_expert, miss = pow(1.0 - (double)c->n_used / e, (double)b);
    return bytes + e * (1.0 - miss) * c->expert_bytes;
}

static void add_weight(const pgd_weight *w, double *params, double *bytes) {
    *params += (double)w->n_in * (double)w->n_out;
    *bytes += (double)w->row_bytes * (double)w->n_out;
}

static model_cost cost_of(const pgd_model *m) {
    model_cost c = {0};
    for (int il = 0; il < m->cfg.n_layer; il++) {
        const pgd_layer *l = &m->layers[il];
        const pgd_weight *ws[] = {&l->wq, &l->wk, &l->wv, &l->wo, &l->w_gate, &l->w_up,
                                  &l->w_down};
        for (int i = 0; i < 7; i++) add_weight(ws[i], &c.layer_params, &c.layer_bytes);
        /* latent attention: its q/kv_a matrices and kv_b's two F32 halves (absorbed) */
        const pgd_weight *mla[] = {&l->wq_a, &l->wq_b, &l->wkv_a};
        for (int i = 0; i < 3; i++) add_weight(mla[i], &c.layer_params, &c.layer_bytes);
        if (l->w_uk_t) {
            const pgd_model_config *mc = &m->cfg;
            double n = (double)mc->n_head * mc->kv_lora_rank * (mc->qk_nope_dim + mc->v_head_dim);
            c.layer_params += n;
            c.layer_bytes += n * sizeof(float);
        }
        if (!l->moe.n_expert) continue;
        add_weight(&l->w_router, &c.layer_params, &c.layer_bytes);
        add_weight(&l->w_shared_inp, &c.layer_params, &c.layer_bytes);
        double params = 0, bytes = 0; /* every expert of the layer */
        for (int i = 0; i < 3 * l->moe.n_expert; i++) add_weight(&l->experts[i], &params, &bytes);
        c.layer_params += params * l->moe.n_used / l->moe.n_expert;
        c.expert_bytes += bytes / l->moe.n_expert;
        c.n_expert = l->moe.n_expert;
        c.n_used = l->moe.n_used;
    }
    add_weight(&m->output, &c.head_params, &c.head_bytes);
    return c;
}

typedef struct result {
    const char *test;
    long tokens;        /* per measured unit (prompt, generated tokens, batch) */
    double tps;         /* median tokens/s */
    double bytes;       /* bytes the unit must read (0: not counted) */
    double flops;       /* flops the unit must compute (0: not counted) */
    long depth;         /* context tokens before the measured ones (-d) */
    double roof_tps;    /* roofline tokens/s: set by set_roofline once the probes are final */
    const char *bound;  /* "bandwidth" or "compute" */
} result;

/* A unit's roofline time is the longer of reading its bytes and computing its flops. */
static void set_roofline(result *r, double bw, double peak) {
    double t_bw = r->bytes / bw, t_fl = r->flops / peak;
    r->roof_tps = (double)r->tokens / (t_bw > t_fl ? t_bw : t_fl);
    r->bound = t_bw > t_fl ? "bandwidth" : "compute";
}

/* Batched decode: for each B, B sequences with their own blocks of a paged KV cache step
 * together BATCH_STEPS times from position 0, every step one token per sequence with its
 * logits, as the engine's decode steps run. Fills one result per batch size. */
static int batched_decode(const pgd_model *m, const pgd_lora *lora, pgd_pool *pool,
                          const bench_opts *o, long max_b,
                          const model_cost *mc, result *res, int *n_res, double *times) {
    pgd_err err = {{0}};
    const int32_t per_seq = (BATCH_STEPS + BATCH_BLOCK - 1) / BATCH_BLOCK;
    pgd_kv_cache kv;
    pgd_fwd f;
    bool have_kv = false, have_fwd = false;
    int rc = 1;
    int32_t *tok = malloc(sizeof *tok * (size_t)max_b), *pos = malloc(sizeof *pos * (size_t)max_b);
    int32_t *seq = malloc(sizeof *seq * (size_t)max_b), *rows = malloc(sizeof *rows * (size_t)max_b);
    int32_t *seq_lora = malloc(sizeof *seq_lora * (size_t)max_b);
    int64_t *slot = malloc(sizeof *slot * (size_t)max_b);
    int32_t *blocks = malloc(sizeof *blocks * (size_t)(max_b * per_seq));
    const int32_t **tables = malloc(sizeof *tables * (size_t)max_b);
    if (!tok || !pos || !seq || !rows || !slot || !blocks || !tables || !seq_lora) {
        fprintf(stderr, "pagoda bench: out of memory\n");
        goto out;
    }
    if (pgd_kv_cache_init2(&kv, m, o->kv_type, o->v_type, (int32_t)(max_b * per_seq), BATCH_BLOCK,
                           &err) ||
        !(have_kv = true) ||
        pgd_fwd_init(&f, m, pool, (int32_t)max_b, (int32_t)max_b, &err) || !(have_fwd = true) ||
        (lora && pgd_fwd_use_lora(&f, lora, &err))) {
        fprintf(stderr, "pagoda bench: %s\n", err.msg);
        goto out;
    }
    for (long j = 0; j < max_b; j++) {
        for (int32_t k = 0; k < per_seq; k++) blocks[j * per_seq + k] = (int32_t)(j * per_seq + k);
        tables[j] = blocks + j * per_seq;
        seq[j] = (int32_t)j;
        seq_lora[j] = lora ? 1 : 0;
        rows[j] = (int32_t)j;
        tok[j] = (int32_t)((j * 7919 + 13) % m->cfg.n_vocab);
    }
    for (int bi = 0; bi < o->n_batches; bi++) {
        long b = o->batches[bi];
        pgd_batch batch = {.n_tokens = (int32_t)b, .tokens = tok, .pos = pos, .seq = seq,
                           .slot = slot, .block_tables = tables, .n_logits = (int32_t)b,
                           .logit_rows = rows, .seq_lora = seq_lora};
        for (long r = 0; r < o->reps; r++) {
            double t = pgd_now_s();
            for (int32_t step = 0; step < BATCH_STEPS; step++) {
                for (long j = 0; j < b; j++) {
                    pos[j] = step;
                    slot[j] = (int64_t)tables[j][step / BATCH_BLOCK] * BATCH_BLOCK +
                              step % BATCH_BLOCK;
                }
                if (pgd_model_forward(&f, &kv, &batch) != 0) {
                    fprintf(stderr, "pagoda bench: batched forward failed\n");
                    goto out;
                }
            }
            times[r] = pgd_now_s() - t;
        }
        double t = median(times, (int)o->reps) / BATCH_STEPS;
        /* A step reads the weights once (an MoE model: the experts its tokens chose) and
         * computes every sequence's logits. */
        res[(*n_res)++] = (result){
            .test = "batch", .tokens = b, .tps = (double)b / t, .bytes = step_bytes(mc, b),
            .flops = 2.0 * (mc->layer_params + mc->head_params) * (double)b};
    }
    rc = 0;
out:
    if (have_fwd) pgd_fwd_free(&f);
    if (have_kv) pgd_kv_cache_free(&kv);
    free(tok);
    free(pos);
    free(seq);
    free(seq_lora);
    free(rows);
    free(slot);
    free(blocks);
    free(tables);
    return rc;
}

int pgd_cli_bench(int argc, char **argv) {
    bench_opts o;
    if (parse_args(argc, argv, &o) != 0) {
        pgd_engine_opts_free(&o.eng);
        return 2;
    }
    pgd_err err = {{0}};
    pgd_model *m = NULL;
    pgd_pool *pool = NULL;
    pgd_session s;
    pgd_lora *lora = NULL;
    bool have_session = false;
    int rc = 1;
    int32_t *tokens = NULL;
    double *times = NULL;
    long max_batch = o.n_prompt > 1 ? o.n_prompt : 1;
    long n_ctx = max_batch > o.n_gen ? max_batch : o.n_gen;
    if (n_ctx < BATCH_STEPS) n_ctx = BATCH_STEPS;
    n_ctx += o.depth;
    /* the context is filled in chunks of up to 512 tokens */
    if (o.depth > max_batch) max_batch = o.depth < 512 ? o.depth : 512;
    pgd_model_opts mo;
    pgd_cli_model_opts(&o.eng, &mo);
    mo.n_ctx = (int32_t)(n_ctx + 8);
    if (pgd_model_load(o.model, &mo, &m, &err) != 0) {
        fprintf(stderr, "pagoda bench: %s\n", err.msg);
        goto done;
    }
    if (m->cfg.n_ctx < n_ctx) {
        fprintf(stderr, "pagoda bench: the model's context (%d) is shorter than %ld tokens\n",
                m->cfg.n_ctx, n_ctx);
        goto done;
    }
    if (pgd_pool_create((int)o.threads, &pool, &err) != 0 ||
        pgd_session_init_kv2(&s, m, pool, (int32_t)max_batch, o.kv_type, o.v_type, &err) != 0 ||
        !(have_session = true) || (o.lora && pgd_lora_load(o.lora, m, &lora, &err)) ||
        (lora && pgd_fwd_use_lora(&s.fwd, lora, &err))) {
        fprintf(stderr, "pagoda bench: %s\n", err.msg);
        goto done;
    }
    s.lora = lora ? 1 : 0;
    tokens = malloc(sizeof *tokens * (size_t)max_batch);
    if (!tokens) goto done;
    uint64_t rng = 0x853c49e6748fea9bull;
    for (long i = 0; i < max_batch; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        tokens[i] = (int32_t)((rng >> 33) % (uint64_t)m->cfg.n_vocab);
    }

    /* On a GPU its own ceilings (the copy kernel, cuBLASLt's BF16 GEMM at 8192^3), else the
     * CPU's probes. */
    double bw = -1, peak = -1;
    bool gpu = m->device == PGD_DEVICE_CUDA;
    if (gpu) {
        if (!o.json) fprintf(stderr, "measuring GPU 0's copy bandwidth and BF16 GEMM peak...\n");
        bw = pgd_cuda_copy_bandwidth(0, (size_t)2 << 30, 20) * 1e9;
        peak = pgd_cuda_gemm_tflops(0, 8192, 8192, 8192, 20) * 1e12;
        if (!(bw > 0 && peak > 0)) {
            fprintf(stderr, "pagoda bench: the GPU probes failed\n");
            goto done;
        }
    } else {
        __builtin_cpu_init();
        if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
            fprintf(stderr, "pagoda bench: the bandwidth and FLOP/s probes need a CPU with AVX2 "
                            "and FMA\n");
            goto done;
        }
        if (!o.json) fprintf(stderr, "probing memory bandwidth and peak FLOP/s...\n");
        bw = probe_bandwidth(pool);
        peak = probe_flops(pool);
    }
    model_cost mc = cost_of(m);
    double tg_bytes = step_bytes(&mc, 1);
    times = calloc((size_t)o.reps, sizeof *times);
    result res[2 + MAX_BATCHES];
    int n_res = 0;
    if (!times) goto done;

    /* One untimed warm-up call: page in the weights, settle the threads. */
    s.n_past = 0;
    if (pgd_session_forward(&s, tokens, 1, false) != 0) goto done;
    /* The -d context, once: each repetition restarts at its end (positions before it keep their
     * K/V). Its attention costs per measured token: FLOPs (QK^T and PV) and K/V bytes read. */
    s.n_past = 0;
    for (long i = 0; i < o.depth; i += max_batch) {
        int32_t n = (int32_t)(o.depth - i < max_batch ? o.depth - i : max_batch);
        if (pgd_session_forward(&s, tokens, n, false) != 0) {
            fprintf(stderr, "pagoda bench: filling the %ld-token context failed\n", o.depth);
            goto done;
        }
    }
    const pgd_model_config *cfg = &m->cfg;
    double depth_flops = 4.0 * cfg->n_layer * cfg->n_head * cfg->head_dim * (double)o.depth;
    double depth_bytes =
        (double)pgd_kv_cache_bytes_per_token2(m, s.kv.dtype, s.kv.vtype) * (double)o.depth;

    if (o.n_prompt > 0) {
        for (long r = 0; r < o.reps; r++) {
            s.n_past = (int32_t)o.depth;
            double t = pgd_now_s();
            pgd_session_forward(&s, tokens, (int32_t)o.n_prompt, false);
            times[r] = pgd_now_s() - t;
        }
        double t = median(times, (int)o.reps);
        /* Compute roofline: 2 flops per multiply-add, LM head for the last token only. */
        double flops = 2.0 * (mc.layer_params * (double)o.n_prompt + mc.head_params) +
                       depth_flops * (double)o.n_prompt;
        res[n_res++] = (result){.test = "pp", .tokens = o.n_prompt,
                                .tps = (double)o.n_prompt / t, .flops = flops, .depth = o.depth};
    }
    if (o.n_gen > 0) {
        for (long r = 0; r < o.reps; r++) {
            s.n_past = (int32_t)o.depth;
            double t = pgd_now_s();
            for (long i = 0; i < o.n_gen; i++)
                pgd_session_forward(&s, &tokens[i % max_batch], 1, false);
            times[r] = pgd_now_s() - t;
        }
        double t = median(times, (int)o.reps);
        res[n_res++] = (result){.test = "tg", .tokens = o.n_gen, .tps = (double)o.n_gen / t,
                                .bytes = (double)o.n_gen * (tg_bytes + depth_bytes),
                                .depth = o.depth};
    }
    long max_b = 0;
    for (int bi = 0; bi < o.n_batches; bi++)
        if (o.batches[bi] > max_b) max_b = o.batches[bi];
    if (max_b > 0 &&
        batched_decode(m, lora, pool, &o, max_b, &mc, res, &n_res, times) != 0)
        goto done;
    /* The CPU's probes again after the tests: other tenants of a shared machine take bandwidth
     * and cores at moments, and the roofline is the machine's best reading of either. */
    double bw1 = bw, peak1 = peak;
    if (!gpu) {
        bw1 = probe_bandwidth(pool);
        peak1 = probe_flops(pool);
    }
    const double bw0 = bw, peak0 = peak;
    if (bw1 > bw) bw = bw1;
    if (peak1 > peak) peak = peak1;
    for (int i = 0; i < n_res; i++) set_roofline(&res[i], bw, peak);

    const char *wtype = pgd_type_name(m->layers[0].wq.type);
    const char *htype = pgd_type_name(m->output.type);
    double params = mc.layer_params + mc.head_params;
    if (o.json) {
        printf("{\"model\":\"%s\",\"weight_type\":\"%s\",\"head_type\":\"%s\",\"params\":%.0f,"
               "\"weight_bytes_per_step\":%.0f,\"threads\":%ld,\"reps\":%ld,"
               "\"device\":\"%s\",\"kv_type\":\"%s\",\"bandwidth_gbs\":%.3f,\"peak_gflops\":%.3f,"
               "\"bandwidth_gbs_before_after\":[%.3f,%.3f],"
               "\"peak_gflops_before_after\":[%.3f,%.3f],\"cpu_fma\":\"%s\",\"results\":[",
               m->path, wtype, htype, params, tg_bytes, o.threads, o.reps, gpu ? "cuda" : "cpu",
               pgd_type_name(o.kv_type), bw / 1e9, peak / 1e9, bw0 / 1e9, bw1 / 1e9, peak0 / 1e9,
               peak1 / 1e9, pgd_cpu_avx512() ? "avx512" : "avx2");
        for (int i = 0; i < n_res; i++)
            printf("%s{\"test\":\"%s%ld\",\"tokens_per_s\":%.3f,\"roofline_tokens_per_s\":%.3f,"
                   "\"fraction\":%.4f,\"bound\":\"%s\",\"depth\":%ld%s}",
                   i ? "," : "", res[i].test, res[i].tokens, res[i].tps, res[i].roof_tps,
                   res[i].tps / res[i].roof_tps, res[i].bound, res[i].depth,
                   strcmp(res[i].test, "batch") ? "" : ",\"sequences\":true");
        printf("]}\n");
    } else {
        printf("model: %s (%s weights, %s head, %.1fM params, %.1f MB read per step; %s K/V)\n",
               m->path, wtype, htype, params / 1e6, tg_bytes / 1e6, pgd_type_name(o.kv_type));
        if (gpu)
            printf("machine: GPU 0, copy bandwidth %.1f GB/s (read + write), BF16 GEMM peak %.1f "
                   "TFLOP/s (cuBLASLt, 8192^3)\n",
                   bw / 1e9, peak / 1e12);
        else
            printf("machine: %ld threads, read bandwidth %.2f GB/s, peak FP32 %.1f GFLOP/s (%s "
                   "FMA; the better of the probes before and after the tests: %.2f / %.2f GB/s, "
                   "best of 12 each; %.1f / %.1f GFLOP/s, best of 5 each)\n",
                   o.threads, bw / 1e9, peak / 1e9, pgd_cpu_avx512() ? "AVX-512" : "AVX2",
                   bw0 / 1e9, bw1 / 1e9, peak0 / 1e9, peak1 / 1e9);
        printf("| %-12s | %12s | %14s | %8s | %-9s |\n", "test", "t/s (median)", "roofline t/s",
               "fraction", "bound");
        printf("|--------------|--------------|----------------|----------|-----------|\n");
        for (int i = 0; i < n_res; i++) {
            char name[40];
            if (res[i].depth)
                snprintf(name, sizeof name, "%s%ld@d%ld", res[i].test, res[i].tokens,
                         res[i].depth);
            else snprintf(name, sizeof name, "%s%ld", res[i].test, res[i].tokens);
            printf("| %-12s | %12.2f | %14.2f | %7.1f%% | %-9s |\n", name, res[i].tps,
                   res[i].roof_tps, 100.0 * res[i].tps / res[i].roof_tps, res[i].bound);
        }
        if (o.n_batches)
            printf("batchB: B sequences decoding together, tokens/s over %d steps from position "
                   "0, median of %ld\n",
                   BATCH_STEPS, o.reps);
    }
    rc = 0;
done:
    free(times);
    free(tokens);
    if (have_session) pgd_session_free(&s);
    pgd_lora_free(lora);
    pgd_pool_free(pool);
    pgd_model_free(m);
    pgd_engine_opts_free(&o.eng);
    return rc;
}
