/* The CUDA backend: weights, KV pool and activations in device memory; one stream and one
 * cuBLAS/cuBLASLt handle per instance. Small batches (<= 8 rows) multiply through the fused
 * dequantize-GEMV kernel (each weight byte read once); larger ones through cuBLASLt in BF16
 * (weights dequantized to a BF16 scratch when they are not BF16) with F32 accumulation and
 * output. Built only with -DPAGODA_CUDA=ON; compiled in CI, never run there (no GPU).
 *
 * CUDA graphs: a step offered padded (pgd_step.pad_tokens: decode and speculative verification,
 * every token with logits) runs as pad_tokens rows, keyed by (padded rows, block-table stride
 * rounded up to a power of two, KV storage). The first step of a key runs eagerly (it grows
 * every lazily sized buffer), the second is captured and launched, later ones only stage their
 * metadata (begin: tokens, positions, slots, block tables into fixed device buffers) and replay
 * the graph at sync; every op in between returns at once. Attention in a graph step uses the
 * key's table stride and split count (splits past a token's position are empty and cost a
 * block exit). A buffer that moves (metadata staging grown, the BF16 weight scratch grown)
 * drops every graph. PAGODA_CUDA_GRAPHS=0 turns them off. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_check.h"
#include "sample/device_sample.h"
#include "kernels.h"
#include "qblocks.h"
#include "sample.h"
#include "util/env.h"

int pgd__cuda_failed;

_Static_assert(PGD_TYPE_F32 == 0 && PGD_TYPE_F16 == 1 && PGD_TYPE_Q4_0 == 2 &&
                   PGD_TYPE_Q4_1 == 3 && PGD_TYPE_Q8_0 == 8 && PGD_TYPE_BF16 == 30 &&
                   (int)PGD_TYPE_Q5_0 == (int)PGD_QB_Q5_0 &&
                   (int)PGD_TYPE_Q5_1 == (int)PGD_QB_Q5_1 &&
                   (int)PGD_TYPE_Q2_K == (int)PGD_QB_Q2_K &&
                   (int)PGD_TYPE_Q3_K == (int)PGD_QB_Q3_K &&
                   (int)PGD_TYPE_Q4_K == (int)PGD_QB_Q4_K &&
                   (int)PGD_TYPE_Q5_K == (int)PGD_QB_Q5_K &&
                   (int)PGD_TYPE_Q6_K == (int)PGD_QB_Q6_K &&
                   (int)PGD_TYPE_IQ4_NL == (int)PGD_QB_IQ4_NL &&
                   (int)PGD_TYPE_IQ4_XS == (int)PGD_QB_IQ4_XS,
               "kernels/pagoda.cu numbers types as ggml does");

#define GEMV_MAX_ROWS 8
#define ATTN_SPLIT_LEN 256
#define ATTN_SPLIT_MIN 16   /* positions per split, at least, when splitting for parallelism */
#define ATTN_BLOCKS_PER_SM 4 /* attention blocks a step should give each multiprocessor */
#define ATTN_PART_MIN (1 << 16) /* (token, head, split) partials kept for flash-decoding, at
                                  * least; more when one step has more (token, head) pairs */

#define PREFILL_MIN_RUN 16  /* tokens of one sequence at consecutive positions: a prefill run */
#define GRAPH_MAX 128       /* captured shapes per instance, at most */
#define GRAPH_MIN_STRIDE 16 /* block-table entries per sequence in a graph step, at least */

typedef struct graph_entry {
    int32_t pad, stride;     /* the key: rows run, table stride */
    uint64_t kv_key;
    bool warm;               /* ran once eagerly at this shape */
    bool failed;             /* capture failed: this shape always runs eagerly */
    cudaGraphExec_t exec;    /* NULL until captured */
} graph_entry;

enum { MODE_EAGER, MODE_PADDED, MODE_CAPTURE, MODE_REPLAY };

typedef struct cuda_state {
    cudaStream_t stream;
    cublasHandle_t blas;
    cublasLtHandle_t lt;
    void *lt_ws;                 /* cuBLASLt workspace */
    size_t lt_ws_bytes;
    int32_t max_tokens, n_head, n_kv_head, head_dim;
    int n_sm;                    /* multiprocessors */
    int attn_fill;               /* attention blocks per SM to split for (PAGODA_CUDA_ATTN_FILL) */
    /* step metadata, staged by begin: pinned host copy -> device */
    int32_t *h_meta, *d_meta;    /* tokens, pos, seq, logit_rows (max_tokens each), tables */
    int64_t *h_slot, *d_slot;    /* (max_tokens) */
    /* attention plan of an eager step: query tiles (2 ints each) for the tensor-core prefill
     * kernel, then the list of the other tokens (flash-decoding kernel); 3 * max_tokens ints */
    int32_t *h_att, *d_att;
    int n_tiles, n_list;
    bool tc_attn;                /* the prefill kernel may run (head_dim, PAGODA_CUDA_TC_ATTN) */
    int gemv_max;                /* matmuls of up to this many rows take the fused GEMV */
    size_t meta_cap;             /* int32 elements of h_meta / d_meta */
    int32_t *d_tokens, *d_pos, *d_seq, *d_rows, *d_tables;
    int max_pos;
    uint64_t step, tables_step;  /* tables are staged once per step */
    int tables_stride;           /* entries per sequence of the staged tables */
    int32_t *h_hi;               /* (max_tokens) host scratch: each sequence's last position */
    float *d_inv_freq;           /* (head_dim / 2) */
    float *part;                 /* attention split partials: (part_cap, head_dim + 2) */
    size_t part_cap;             /* max(ATTN_PART_MIN, max_tokens * n_head) */
    uint16_t *x_bf16;            /* (max_tokens, widest n_in) activations for the GEMM */
    size_t x_bf16_elems;
    /* x_bf16 holds the first xconv_elems floats of xconv_src in BF16, written by the op that
     * wrote them (RMSNorm, SiLU-gate) or converted by the last matmul, with no other op since
     * (Q, K and V, and gate and up, read the same x): NULL when unknown */
    const float *xconv_src;
    bool xconv_keep;             /* reuse it (PAGODA_CUDA_XCONV=0: never, for measuring) */
    size_t xconv_elems;
    /* GEMV-path matmuls of one x queued until the next op that is not one of them: Q, K and V
     * (gate and up) go in one launch (PAGODA_CUDA_GEMV_GROUP=0: one launch each) */
    pgd_k_gemv_mat gq[PGD_K_GEMV_GROUP];
    int gq_n, gq_type, gq_rows;
    int64_t gq_n_in;
    const float *gq_x;
    bool gq_on;
    uint16_t *w_bf16;            /* dequantized weight for the GEMM (grows to the largest) */
    size_t w_bf16_elems;
    /* CUDA graphs (see the top of this file) */
    bool graphs_on;
    int mode;                    /* MODE_*: how this step's ops run */
    int failed_before;           /* pgd__cuda_failed when the capture began */
    int32_t n_real, n_pad;       /* the step's token rows as called and as run */
    int32_t g_splits; /* attention splits of a graph step */
    graph_entry *cur;
    graph_entry graphs[GRAPH_MAX];
    int n_graphs;
    /* sampling (cuda_sample): rows in and token ids out, max_tokens of each */
    pgd_k_sample_row *h_srow, *d_srow;
    int32_t *h_stok, *d_stok;
} cuda_state;

/* Launches the queued GEMVs (every op and every use of the stream comes after them). */
static void flush_gemv(cuda_state *st) {
    if (!st || !st->gq_n) return;
    int n = st->gq_n;
    st->gq_n = 0;
    CUDA_CHECK((cudaError_t)pgd_k_gemv_group(st->stream, st->gq_type, st->gq_n_in, st->gq, n,
                                             st->gq_x, st->gq_rows, 0));
}

/* Every op but matmul starts with this: the queued GEMVs go first; a replayed step's work is all
 * in its graph; an op may write the activations the GEMM converted last, so the conversion is
 * forgotten. */
#define OP_START(st)                                                                               \
    do {                                                                                        \
        flush_gemv(st);                                                                         \
        (st)->xconv_src = NULL;                                                                 \
        if ((st)->mode == MODE_REPLAY) return;                                                  \
    } while (0)

/* Where an op that writes `elems` floats of `out` should write their BF16 copy for the GEMM of
 * the next matmuls (NULL: not kept, or too large); note_bf16 records it once launched. */
static uint16_t *bf16_copy_for(const cuda_state *st, size_t elems) {
    return st->xconv_keep && elems <= st->x_bf16_elems ? st->x_bf16 : NULL;
}
static void note_bf16(cuda_state *st, const float *out, size_t elems, const uint16_t *copy) {
    st->xconv_src = copy ? out : NULL;
    st->xconv_elems = elems;
}

/* Rows an op runs on: the padded count for the step's own row count in a graph step. */
static int rows_of(const cuda_state *st, int n) {
    return st->mode != MODE_EAGER && n == st->n_real ? st->n_pad : n;
}
/* Elements of a (rows, width) buffer an elementwise op runs on. */
static size_t elems_of(const cuda_state *st, size_t n) {
    return st->mode != MODE_EAGER ? n / (size_t)st->n_real * (size_t)st->n_pad : n;
}

static void drop_graphs(cuda_state *st) {
    for (int i = 0; i < st->n_graphs; i++)
        if (st->graphs[i].exec) CUDA_CHECK(cudaGraphExecDestroy(st->graphs[i].exec));
    st->n_graphs = 0;
    st->cur = NULL;
}

static bool cuda_supports(pgd_op op, pgd_type t) {
    /* mixture-of-experts models run on the CPU backend; sliding-window models with their
     * context capped at the window; LoRA adapters on the CPU backend only */
    if (op == PGD_OP_MOE || op == PGD_OP_WINDOW || op == PGD_OP_LORA || op == PGD_OP_MLA)
        return false;
    /* Gemma 3's ops: its models run on the CPU backend */
    if (op == PGD_OP_GELU_GATE || op == PGD_OP_SCALE || op == PGD_OP_LOCAL_ROPE ||
        op == PGD_OP_SOFTCAP || op == PGD_OP_ATTN_SCALE)
        return false;
    if (op == PGD_OP_MATMUL || op == PGD_OP_EMBED) {
        /* Q5_0/Q5_1/IQ4_NL and the K-quants and IQ4_XS (kernels/qblocks.h) stay quantized
         * on the device unless PAGODA_CUDA_WIDEN=1, which widens them to F32 at load, as
         * before the kernels read them */
        const char *widen = pgd_env(PGD_ENV_CUDA_WIDEN);
        if (pgd_qb_is((int)t)) return !(widen && widen[0] == '1');
        return t == PGD_TYPE_F32 || t == PGD_TYPE_F16 || t == PGD_TYPE_BF16 ||
               t == PGD_TYPE_Q8_0 || t == PGD_TYPE_Q4_0 || t == PGD_TYPE_Q4_1;
    }
    return true;
}

int pgd_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); /* no driver / no device: not an error for a CPU fallback */
        return 0;
    }
    return n;
}

static void *cuda_alloc(pgd_backend *be, size_t bytes) {
    void *p = NULL;
    CUDA_CHECK_OR(cudaSetDevice(be->device), return NULL);
    CUDA_CHECK_OR(cudaMalloc(&p, bytes ? bytes : 1), return NULL);
    CUDA_CHECK_OR(cudaMemset(p, 0, bytes ? bytes : 1), cudaFree(p); return NULL);
    return p;
}

static void cuda_mem_free(pgd_backend *be, void *p) {
    cuda_state *st = be->impl;
    flush_gemv(st);
    if (st) st->xconv_src = NULL; /* the address may come back holding other values */
    if (p) CUDA_CHECK(cudaFree(p));
}

static int cuda_mem_info(pgd_backend *be, size_t *free_bytes, size_t *total_bytes) {
    CUDA_CHECK_OR(cudaSetDevice(be->device), return PGD_EIO);
    CUDA_CHECK_OR(cudaMemGetInfo(free_bytes, total_bytes), return PGD_EIO);
    return PGD_OK;
}

static cudaStream_t stream_of(pgd_backend *be) {
    cuda_state *st = be->impl;
    flush_gemv(st);
    return st ? st->stream : 0;
}

static int cuda_upload(pgd_backend *be, void *dst, const void *src, size_t bytes) {
    cuda_state *st = be->impl;
    if (st) st->xconv_src = NULL;
    CUDA_CHECK_OR(cudaSetDevice(be->device), return PGD_EIO);
    CUDA_CHECK_OR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_of(be)),
                  return PGD_EIO);
    CUDA_CHECK_OR(cudaStreamSynchronize(stream_of(be)), return PGD_EIO);
    return PGD_OK;
}

static int cuda_download(pgd_backend *be, void *dst, const void *src, size_t bytes) {
    CUDA_CHECK_OR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_of(be)),
                  return PGD_EIO);
    CUDA_CHECK_OR(cudaStreamSynchronize(stream_of(be)), return PGD_EIO);
    return PGD_OK;
}

/* Ends a graph step: captures and launches, or replays; a capture that failed has done none of
 * the step's work, so the step is to be run again (eagerly: the shape is marked). */
static int end_graph(cuda_state *st) {
    flush_gemv(st);
    int mode = st->mode;
    graph_entry *g = st->cur;
    st->mode = MODE_EAGER;
    st->cur = NULL;
    if (mode == MODE_CAPTURE) {
        cudaGraph_t graph = NULL;
        cudaError_t e = cudaStreamEndCapture(st->stream, &graph);
        /* g is NULL when an op dropped every graph mid-capture (a buffer grew: it also
         * synchronised, which broke the capture) */
        if (e == cudaSuccess && !pgd__cuda_failed && g)
            e = cudaGraphInstantiate(&g->exec, graph, 0);
        if (graph) CUDA_CHECK(cudaGraphDestroy(graph));
        if (e != cudaSuccess || pgd__cuda_failed || !g) {
            fprintf(stderr, "pagoda: CUDA graph capture failed (%s); the step runs again "
                    "without a graph\n", cudaGetErrorString(e));
            (void)cudaGetLastError();
            pgd__cuda_failed = st->failed_before;
            if (g) {
                g->exec = NULL;
                g->failed = true;
            }
            /* the staging copies queued before the capture finish before the retry rewrites
             * their pinned sources */
            CUDA_CHECK_OR(cudaStreamSynchronize(st->stream), return PGD_EIO);
            return PGD_EAGAIN;
        }
    }
    if (mode == MODE_CAPTURE || mode == MODE_REPLAY)
        CUDA_CHECK_OR(cudaGraphLaunch(g->exec, st->stream), return PGD_EIO);
    return PGD_OK;
}

static int cuda_sync(pgd_backend *be) {
    cuda_state *st = be->impl;
    if (st && st->mode != MODE_EAGER) {
        int rc = end_graph(st);
        if (rc) return rc;
    }
    CUDA_CHECK_OR(cudaStreamSynchronize(stream_of(be)), return PGD_EIO);
    if (pgd__cuda_failed) return PGD_EIO;
    return PGD_OK;
}

static void cuda_free(pgd_backend *be) {
    cuda_state *st = be->impl;
    if (!st) return;
    cudaSetDevice(be->device);
    flush_gemv(st);
    if (st->stream) CUDA_CHECK(cudaStreamSynchronize(st->stream));
    drop_graphs(st);
    void *dev[] = {st->lt_ws, st->d_meta, st->d_att, st->d_slot, st->d_inv_freq, st->part,
                   st->x_bf16, st->w_bf16};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        if (dev[i]) CUDA_CHECK(cudaFree(dev[i]));
    if (st->h_meta) CUDA_CHECK(cudaFreeHost(st->h_meta));
    if (st->h_slot) CUDA_CHECK(cudaFreeHost(st->h_slot));
    if (st->h_att) CUDA_CHECK(cudaFreeHost(st->h_att));
    free(st->h_hi);
    if (st->d_srow) CUDA_CHECK(cudaFree(st->d_srow));
    if (st->d_stok) CUDA_CHECK(cudaFree(st->d_stok));
    if (st->h_srow) CUDA_CHECK(cudaFreeHost(st->h_srow));
    if (st->h_stok) CUDA_CHECK(cudaFreeHost(st->h_stok));
    if (st->lt) CUBLAS_CHECK(cublasLtDestroy(st->lt));
    if (st->blas) CUBLAS_CHECK(cublasDestroy(st->blas));
    if (st->stream) CUDA_CHECK(cudaStreamDestroy(st->stream));
    free(st);
    be->impl = NULL;
}

static void set_meta_views(cuda_state *st);

/* Grows the metadata staging to `need` int32s (twice that, for headroom). The new buffers are
 * allocated before the old ones go, and the first `keep` int32s of the device copy (this step's
 * staged metadata) move with it; on failure nothing changes. */
static int grow_meta(cuda_state *st, size_t need, size_t keep) {
    if (need <= st->meta_cap) return PGD_OK;
    size_t cap = need * 2;
    int32_t *h = NULL, *d = NULL;
    CUDA_CHECK_OR(cudaMallocHost((void **)&h, cap * sizeof(int32_t)), return PGD_ENOMEM);
    CUDA_CHECK_OR(cudaMalloc((void **)&d, cap * sizeof(int32_t)), cudaFreeHost(h);
                  return PGD_ENOMEM);
    if (st->d_meta) {
        /* the old buffers may still be read by queued work */
        CUDA_CHECK_OR(cudaStreamSynchronize(st->stream), cudaFree(d); cudaFreeHost(h);
                      return PGD_EIO);
        if (keep)
            CUDA_CHECK_OR(cudaMemcpy(d, st->d_meta, keep * sizeof(int32_t),
                                     cudaMemcpyDeviceToDevice),
                          cudaFree(d); cudaFreeHost(h); return PGD_EIO);
        CUDA_CHECK(cudaFree(st->d_meta));
    }
    if (st->h_meta) CUDA_CHECK(cudaFreeHost(st->h_meta));
    drop_graphs(st); /* they read the old buffers */
    st->h_meta = h;
    st->d_meta = d;
    st->meta_cap = cap;
    set_meta_views(st);
    return PGD_OK;
}

static int cuda_init(pgd_backend *be, int32_t max_tokens, size_t act_row_bytes, int32_t n_head,
                     int32_t n_kv_head, int32_t head_dim, pgd_err *err) {
    cuda_state *st = calloc(1, sizeof *st);
    if (!st) return pgd_err_set(err, PGD_ENOMEM, "CUDA backend: out of memory");
    be->impl = st;
    st->max_tokens = max_tokens;
    st->n_head = n_head;
    st->n_kv_head = n_kv_head;
    st->head_dim = head_dim;
    st->lt_ws_bytes = 32u << 20;
    /* act_row_bytes >= 4 * widest n_in (F32 rows): bounds the BF16 activations. */
    st->x_bf16_elems = (size_t)max_tokens * (act_row_bytes / 2 + 32);
    CUDA_CHECK_OR(cudaSetDevice(be->device), goto fail);
    CUDA_CHECK_OR(cudaStreamCreateWithFlags(&st->stream, cudaStreamNonBlocking), goto fail);
    CUBLAS_CHECK_OR(cublasCreate(&st->blas), goto fail);
    CUBLAS_CHECK_OR(cublasSetStream(st->blas, st->stream), goto fail);
    CUBLAS_CHECK_OR(cublasLtCreate(&st->lt), goto fail);
    CUDA_CHECK_OR(cudaMalloc(&st->lt_ws, st->lt_ws_bytes), goto fail);
    /* cuBLAS and cuBLASLt share the workspace (one stream orders them); a set workspace also
     * keeps cuBLAS from allocating while a graph is captured. */
    CUBLAS_CHECK_OR(cublasSetWorkspace(st->blas, st->lt_ws, st->lt_ws_bytes), goto fail);
    const char *g = pgd_env(PGD_ENV_CUDA_GRAPHS);
    st->graphs_on = !(g && g[0] == '0');
    CUDA_CHECK_OR(cudaMalloc((void **)&st->d_slot, (size_t)max_tokens * sizeof(int64_t)), goto fail);
    CUDA_CHECK_OR(cudaMallocHost((void **)&st->h_slot, (size_t)max_tokens * sizeof(int64_t)),
                  goto fail);
    CUDA_CHECK_OR(cudaMalloc((void **)&st->d_att, (size_t)max_tokens * 3 * sizeof(int32_t)),
                  goto fail);
    CUDA_CHECK_OR(cudaMallocHost((void **)&st->h_att, (size_t)max_tokens * 3 * sizeof(int32_t)),
                  goto fail);
    const char *xc = pgd_env(PGD_ENV_CUDA_XCONV);
    st->xconv_keep = !(xc && xc[0] == '0');
    const char *gg = pgd_env(PGD_ENV_CUDA_GEMV_GROUP);
    st->gq_on = !(gg && gg[0] == '0');
    const char *gm = pgd_env(PGD_ENV_CUDA_GEMV_MAX); /* 0..GEMV_MAX_ROWS, for measuring */
    st->gemv_max = gm && *gm ? atoi(gm) : GEMV_MAX_ROWS;
    if (st->gemv_max < 0 || st->gemv_max > GEMV_MAX_ROWS) st->gemv_max = GEMV_MAX_ROWS;
    const char *tc = pgd_env(PGD_ENV_CUDA_TC_ATTN);
    st->tc_attn = head_dim % 16 == 0 && head_dim <= 256 && !(tc && tc[0] == '0');
    CUDA_CHECK_OR(cudaMalloc((void **)&st->d_inv_freq, (size_t)(head_dim / 2 + 1) * sizeof(float)),
                  goto fail);
    /* Every (token, head) pair of the largest step needs one partial (one split): a prefill
     * step of 8192 tokens x 32 heads needs 262,144 (136 MB at head_dim 128). */
    st->part_cap = (size_t)max_tokens * (size_t)n_head;
    if (st->part_cap < ATTN_PART_MIN) st->part_cap = ATTN_PART_MIN;
    CUDA_CHECK_OR(cudaMalloc((void **)&st->part, st->part_cap * (head_dim + 2) * sizeof(float)),
                  goto fail);
    CUDA_CHECK_OR(cudaMalloc((void **)&st->x_bf16, st->x_bf16_elems * 2), goto fail);
    size_t srow_bytes = (size_t)max_tokens * sizeof(pgd_k_sample_row);
    CUDA_CHECK_OR(cudaMallocHost((void **)&st->h_srow, srow_bytes), goto fail);
    CUDA_CHECK_OR(cudaMalloc((void **)&st->d_srow, srow_bytes), goto fail);
    CUDA_CHECK_OR(cudaMallocHost((void **)&st->h_stok, (size_t)max_tokens * sizeof(int32_t)),
                  goto fail);
    CUDA_CHECK_OR(cudaMalloc((void **)&st->d_stok, (size_t)max_tokens * sizeof(int32_t)),
                  goto fail);
    if (grow_meta(st, (size_t)max_tokens * 4 + (size_t)max_tokens * 64, 0)) goto fail;
    st->h_hi = malloc((size_t)max_tokens * sizeof *st->h_hi);
    if (!st->h_hi) goto fail;
    CUDA_CHECK_OR(cudaDeviceGetAttribute(&st->n_sm, cudaDevAttrMultiProcessorCount, be->device),
                  goto fail);
    /* Programmatic dependent launch (kernels/launch.cuh) where the device has it (9.0+):
     * process-wide, so a node's devices are taken to be of one kind (tensor parallel inits
     * every device with the same answer). PAGODA_CUDA_PDL=0 turns it off, for measuring. */
    int cc_major = 0;
    CUDA_CHECK_OR(cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor,
                                         be->device),
                  goto fail);
    const char *pdl = pgd_env(PGD_ENV_CUDA_PDL);
    pgd_k_set_pdl(cc_major >= 9 && !(pdl && pdl[0] == '0'));
    const char *af = pgd_env(PGD_ENV_CUDA_ATTN_FILL); /* 0: one split per 256 positions */
    st->attn_fill = af && *af ? atoi(af) : ATTN_BLOCKS_PER_SM;
    if (st->attn_fill < 0) st->attn_fill = 0;
    return PGD_OK;
fail:
    cuda_free(be);
    return pgd_err_set(err, PGD_EIO, "CUDA backend: cannot initialise device %d (see above)",
                       be->device);
}

static void set_meta_views(cuda_state *st) {
    int32_t M = st->max_tokens;
    st->d_tokens = st->d_meta;
    st->d_pos = st->d_meta + M;
    st->d_seq = st->d_meta + 2 * M;
    st->d_rows = st->d_meta + 3 * M;
    st->d_tables = st->d_meta + 4 * M;
}

/* Uploads the block tables (entries covering positions 0..max pos of each sequence, `stride`
 * entries per sequence, zero beyond) once per step. Called by begin in a graph step (the key's
 * stride) and by the first layer's attention otherwise. */
static int fill_tables(pgd_backend *be, const pgd_step *s, int bs, int stride) {
    cuda_state *st = be->impl;
    if (st->tables_step == st->step) return PGD_OK;
    int n_seqs = 0;
    for (int t = 0; t < s->n_tokens; t++)
        if (s->seq[t] + 1 > n_seqs) n_seqs = s->seq[t] + 1;
    size_t M = (size_t)st->max_tokens;
    /* Grows the staging (rare: longer contexts than seen so far), keeping this step's staged
     * metadata (the first 4 M int32s). */
    int rc = grow_meta(st, 4 * M + (size_t)n_seqs * stride, 4 * M);
    if (rc) return rc;
    for (int i = 0; i < n_seqs; i++) st->h_hi[i] = -1; /* n_seqs <= n_tokens <= max_tokens */
    for (int t = 0; t < s->n_tokens; t++)
        if (s->pos[t] > st->h_hi[s->seq[t]]) st->h_hi[s->seq[t]] = s->pos[t];
    int32_t *tab = st->h_meta + 4 * M;
    for (int i = 0; i < n_seqs; i++) {
        int hi = st->h_hi[i];
        int nb = hi < 0 ? 0 : hi / bs + 1;
        memset(tab + (size_t)i * stride, 0, (size_t)stride * 4);
        if (nb) memcpy(tab + (size_t)i * stride, s->block_tables[i], (size_t)nb * 4);
    }
    CUDA_CHECK_OR(cudaMemcpyAsync(st->d_tables, tab, (size_t)n_seqs * stride * 4,
                                  cudaMemcpyHostToDevice, st->stream),
                  return PGD_EIO);
    st->tables_step = st->step;
    st->tables_stride = stride;
    return PGD_OK;
}

/* The graph of (pad, stride, kv_key), added (not warm) when new; NULL when the table is full. */
static graph_entry *graph_for(cuda_state *st, int32_t pad, int32_t stride, uint64_t kv_key) {
    for (int i = 0; i < st->n_graphs; i++) {
        graph_entry *g = &st->graphs[i];
        if (g->pad == pad && g->stride == stride && g->kv_key == kv_key) return g;
    }
    if (st->n_graphs == GRAPH_MAX) return NULL;
    graph_entry *g = &st->graphs[st->n_graphs++];
    *g = (graph_entry){.pad = pad, .stride = stride, .kv_key = kv_key};
    return g;
}

/* Flash-decoding splits for `ctx` positions and `rows` tokens of n_head heads (n_kv_head KV
 * heads: a block per token, KV head and split): ATTN_SPLIT_LEN positions per split; more splits
 * (down to ATTN_SPLIT_MIN positions) when there are too few (token, KV head) pairs to give each
 * multiprocessor attn_fill blocks (small-batch decode); fewer (longer ones) when the
 * partials would not fit part_cap. Each token spreads its own context over them
 * (pgd_k_split_len in kernels/kernels.h: at least ATTN_SPLIT_MIN positions a split). */
static int32_t split_count(const cuda_state *st, int ctx, int rows, int n_head, int n_kv_head) {
    long cap = (long)(st->part_cap / ((size_t)rows * (size_t)n_head));
    if (cap < 1) cap = 1; /* part_cap >= max_tokens * n_head (init) */
    long n = (ctx + ATTN_SPLIT_LEN - 1) / ATTN_SPLIT_LEN;
    long pairs = (long)rows * (n_kv_head > 0 ? n_kv_head : 1);
    long want = ((long)st->attn_fill * st->n_sm + pairs - 1) / pairs;
    long most = (ctx + ATTN_SPLIT_MIN - 1) / ATTN_SPLIT_MIN;
    if (want > most) want = most;
    if (want > n) n = want;
    if (n > cap) n = cap;
    return (int32_t)n;
}

/* Chooses how a graph step runs (st->mode) and stages its tables; PGD_OK leaves st->mode
 * MODE_EAGER when the step runs as it is. */
static int begin_graph(pgd_backend *be, const pgd_step *s) {
    cuda_state *st = be->impl;
    int32_t P = s->pad_tokens, bs = s->block_size;
    int32_t stride = GRAPH_MIN_STRIDE;
    while (stride < st->max_pos / bs + 1) stride *= 2;
    int rc = fill_tables(be, s, bs, stride); /* may drop every graph (staging grown) */
    if (rc) return rc;
    graph_entry *g = graph_for(st, P, stride, s->kv_key);
    if (!g || g->failed) return PGD_OK; /* eagerly, with the tables as staged */
    st->g_splits = split_count(st, stride * bs, P, st->n_head, st->n_kv_head);
    st->n_pad = P;
    st->cur = g;
    if (g->exec) {
        st->mode = MODE_REPLAY;
    } else if (g->warm) {
        st->failed_before = pgd__cuda_failed;
        CUDA_CHECK_OR(cudaStreamBeginCapture(st->stream, cudaStreamCaptureModeThreadLocal),
                      return PGD_EIO);
        st->mode = MODE_CAPTURE;
    } else {
        g->warm = true;
        st->mode = MODE_PADDED;
    }
    return PGD_OK;
}

/* Splits an eager step's tokens between the attention kernels: runs of PREFILL_MIN_RUN or more
 * tokens of one sequence at consecutive positions (prefill chunks) in query tiles of
 * PGD_K_QTILE_MAX for the tensor-core kernel, every other token (decodes, short runs) listed
 * for the flash-decoding kernel. */
static int plan_attention(cuda_state *st, const pgd_step *s) {
    int n = s->n_tokens, nt = 0, nl = 0, M = st->max_tokens;
    int32_t *tiles = st->h_att, *list = st->h_att + 2 * M;
    for (int t = 0; t < n;) {
        int e = t + 1;
        while (e < n && s->seq[e] == s->seq[t] && s->pos[e] == s->pos[e - 1] + 1) e++;
        if (st->tc_attn && e - t >= PREFILL_MIN_RUN) {
            for (int a = t; a < e; a += PGD_K_QTILE_MAX) {
                tiles[2 * nt] = a;
                tiles[2 * nt + 1] = e - a < PGD_K_QTILE_MAX ? e - a : PGD_K_QTILE_MAX;
                nt++;
            }
        } else {
            for (int a = t; a < e; a++) list[nl++] = a;
        }
        t = e;
    }
    st->n_tiles = nt;
    st->n_list = nl;
    if (nt == 0) return PGD_OK; /* every token in the flash-decoding kernel: no list needed */
    CUDA_CHECK_OR(cudaMemcpyAsync(st->d_att, tiles, (size_t)nt * 2 * 4, cudaMemcpyHostToDevice,
                                  st->stream),
                  return PGD_EIO);
    if (nl)
        CUDA_CHECK_OR(cudaMemcpyAsync(st->d_att + 2 * M, list, (size_t)nl * 4,
                                      cudaMemcpyHostToDevice, st->stream),
                      return PGD_EIO);
    return PGD_OK;
}

static int cuda_begin(pgd_backend *be, const pgd_step *s, const pgd_rope_params *rp) {
    cuda_state *st = be->impl;
    /* A rank's thread may not have this device current (tensor parallel: one thread per GPU). */
    CUDA_CHECK_OR(cudaSetDevice(be->device), return PGD_EIO);
    int n = s->n_tokens, max_pos = 0;
    for (int t = 0; t < n; t++)
        if (s->pos[t] > max_pos) max_pos = s->pos[t];
    st->max_pos = max_pos;
    st->step++;
    flush_gemv(st);
    st->xconv_src = NULL; /* a failed capture's conversion never ran */
    st->mode = MODE_EAGER;
    st->cur = NULL;
    st->n_real = st->n_pad = n;
    /* A graph step: padded rows are token 0 at position 0 of sequence 0, slot -1 (not stored),
     * logits of row 0; sequence 0 always exists and its position 0 is always in its table. */
    bool graph = st->graphs_on && s->pad_tokens >= n && s->pad_tokens <= st->max_tokens &&
                 s->n_logits == n && s->block_size > 0;
    int32_t P = graph ? s->pad_tokens : n;
    int32_t *h = st->h_meta, M = st->max_tokens;
    memcpy(h, s->tokens, (size_t)n * 4);
    memcpy(h + M, s->pos, (size_t)n * 4);
    memcpy(h + 2 * M, s->seq, (size_t)n * 4);
    if (s->n_logits) memcpy(h + 3 * M, s->logit_rows, (size_t)s->n_logits * 4);
    memcpy(st->h_slot, s->slot, (size_t)n * 8);
    for (int32_t t = n; t < P; t++) {
        h[t] = h[M + t] = h[2 * M + t] = h[3 * M + t] = 0;
        st->h_slot[t] = -1;
    }
    cudaStream_t sm = st->stream;
    /* The pinned staging buffers are rewritten next step only after this step's sync. */
    CUDA_CHECK_OR(cudaMemcpyAsync(st->d_meta, h, (size_t)4 * M * 4, cudaMemcpyHostToDevice, sm),
                  return PGD_EIO);
    CUDA_CHECK_OR(cudaMemcpyAsync(st->d_slot, st->h_slot, (size_t)P * 8, cudaMemcpyHostToDevice, sm),
                  return PGD_EIO);
    CUDA_CHECK_OR(cudaMemcpyAsync(st->d_inv_freq, rp->inv_freq, (size_t)(rp->head_dim / 2) * 4,
                                  cudaMemcpyHostToDevice, sm),
                  return PGD_EIO);
    set_meta_views(st);
    int rc = graph ? begin_graph(be, s) : PGD_OK;
    if (rc || st->mode != MODE_EAGER) return rc;
    return plan_attention(st, s);
}

static void cuda_embed(pgd_backend *be, const pgd_weight *w, int32_t vocab_lo, const pgd_step *s,
                       float *x) {
    cuda_state *st = be->impl;
    OP_START(st);
    CUDA_CHECK((cudaError_t)pgd_k_embed(st->stream, w->type, w->data, w->row_bytes, w->n_out,
                                        vocab_lo, st->d_tokens, rows_of(st, s->n_tokens),
                                        (int)w->n_in, x));
}

static void cuda_rms_norm(pgd_backend *be, const float *x, const float *w, float *out, int n_rows,
                          int dim, float eps) {
    cuda_state *st = be->impl;
    OP_START(st);
    size_t elems = (size_t)rows_of(st, n_rows) * (size_t)dim;
    uint16_t *ob = bf16_copy_for(st, elems);
    CUDA_CHECK((cudaError_t)pgd_k_rms_norm(st->stream, (float *)x, NULL, w, out, ob,
                                           rows_of(st, n_rows), dim, eps));
    note_bf16(st, out, elems, ob);
}

static void cuda_add_rms_norm(pgd_backend *be, float *x, const float *d, const float *w,
                              float *out, int n_rows, int dim, float eps) {
    cuda_state *st = be->impl;
    OP_START(st);
    size_t elems = (size_t)rows_of(st, n_rows) * (size_t)dim;
    uint16_t *ob = bf16_copy_for(st, elems);
    CUDA_CHECK((cudaError_t)pgd_k_rms_norm(st->stream, x, d, w, out, ob, rows_of(st, n_rows), dim,
                                           eps));
    note_bf16(st, out, elems, ob);
}

/* y (n, n_out) row-major = x (n, n_in) . W^T: column-major C (n_out x n) = W^T-view (n_out x
 * n_in, lda n_in, op T) * X (n_in x n, ldb n_in). */
static void gemm_bf16(pgd_backend *be, const void *w_bf16, const uint16_t *x_bf16, float *y,
                      int64_t n_in, int64_t n_out, int n) {
    cuda_state *st = be->impl;
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasOperation_t tA = CUBLAS_OP_T, tB = CUBLAS_OP_N;
    float alpha = 1.0f, beta = 0.0f;
    cublasLtMatmulHeuristicResult_t h;
    int found = 0;
    CUBLAS_CHECK_OR(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), goto done);
    CUBLAS_CHECK_OR(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &tA, sizeof tA),
                    goto done);
    CUBLAS_CHECK_OR(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tB, sizeof tB),
                    goto done);
    CUBLAS_CHECK_OR(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, (uint64_t)n_in, (uint64_t)n_out,
                                               n_in), goto done);
    CUBLAS_CHECK_OR(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, (uint64_t)n_in, (uint64_t)n, n_in),
                    goto done);
    CUBLAS_CHECK_OR(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, (uint64_t)n_out, (uint64_t)n,
                                               n_out), goto done);
    CUBLAS_CHECK_OR(cublasLtMatmulPreferenceCreate(&pref), goto done);
    CUBLAS_CHECK_OR(cublasLtMatmulPreferenceSetAttribute(
                        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &st->lt_ws_bytes,
                        sizeof st->lt_ws_bytes), goto done);
    CUBLAS_CHECK_OR(cublasLtMatmulAlgoGetHeuristic(st->lt, op, la, lb, lc, lc, pref, 1, &h, &found),
                    goto done);
    if (!found) {
        pgd__cuda_failed = 1;
        fprintf(stderr, "%s:%d: cuBLASLt: no algorithm for %lld x %lld x %d\n", __FILE__, __LINE__,
                (long long)n_out, (long long)n_in, n);
        goto done;
    }
    CUBLAS_CHECK(cublasLtMatmul(st->lt, op, &alpha, w_bf16, la, x_bf16, lb, &beta, y, lc, y, lc,
                                &h.algo, st->lt_ws, st->lt_ws_bytes, st->stream));
done:
    /* Descriptors are host objects; creating them per call costs microseconds next to a GEMM
     * that only runs for prefill-sized batches. */
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (op) cublasLtMatmulDescDestroy(op);
}

static void cuda_matmul(pgd_backend *be, const pgd_weight *w, const float *x, float *y, int n) {
    cuda_state *st = be->impl;
    if (st->mode == MODE_REPLAY) return; /* keeps the conversion: a matmul writes only y */
    if (y == st->xconv_src) st->xconv_src = NULL;
    n = rows_of(st, n);
    /* The fused GEMV for one row, and for up to gemv_max rows of weights the GEMM would first
     * dequantize (a BF16 matrix goes straight to cuBLASLt: the GEMV's per-token activation
     * loads made 8 rows take 2.3x one row's time on an H200, cuBLASLt 1.1x). */
    if (n <= st->gemv_max && (n == 1 || w->type != PGD_TYPE_BF16)) {
        if (st->gq_n && (x != st->gq_x || n != st->gq_rows || (int)w->type != st->gq_type ||
                         w->n_in != st->gq_n_in || st->gq_n == PGD_K_GEMV_GROUP))
            flush_gemv(st);
        st->gq[st->gq_n++] = (pgd_k_gemv_mat){w->data, w->row_bytes, w->n_out, y};
        st->gq_x = x;
        st->gq_rows = n;
        st->gq_type = (int)w->type;
        st->gq_n_in = w->n_in;
        if (!st->gq_on) flush_gemv(st);
        return;
    }
    flush_gemv(st);
    if (w->type == PGD_TYPE_F32) {
        float alpha = 1.0f, beta = 0.0f;
        CUBLAS_CHECK(cublasSgemm(st->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)w->n_out, n, (int)w->n_in,
                                 &alpha, w->data, (int)w->n_in, x, (int)w->n_in, &beta, y,
                                 (int)w->n_out));
        return;
    }
    size_t xn = (size_t)n * (size_t)w->n_in;
    if (xn > st->x_bf16_elems) {
        pgd__cuda_failed = 1;
        fprintf(stderr, "%s:%d: activation scratch too small\n", __FILE__, __LINE__);
        return;
    }
    if (x != st->xconv_src || xn != st->xconv_elems) {
        st->xconv_src = NULL; /* until the conversion is queued */
        CUDA_CHECK_OR((cudaError_t)pgd_k_f32_to_bf16(st->stream, x, st->x_bf16, xn),
                      pgd__cuda_failed = 1; return);
        st->xconv_src = st->xconv_keep ? x : NULL;
        st->xconv_elems = xn;
    }
    const void *wb = w->data;
    if (w->type != PGD_TYPE_BF16) {
        size_t wn = (size_t)w->n_in * (size_t)w->n_out;
        if (wn > st->w_bf16_elems && st->mode == MODE_CAPTURE) {
            /* no synchronisation or allocation under capture: fail it; the step runs again
             * eagerly and grows the scratch then */
            pgd__cuda_failed = 1;
            return;
        }
        if (wn > st->w_bf16_elems) {
            /* Grows once, at the first large step, to the largest weight (never while a graph
             * is captured: each shape runs eagerly first). */
            CUDA_CHECK(cudaStreamSynchronize(st->stream));
            drop_graphs(st);
            if (st->w_bf16) CUDA_CHECK(cudaFree(st->w_bf16));
            st->w_bf16 = NULL;
            st->w_bf16_elems = 0;
            CUDA_CHECK_OR(cudaMalloc((void **)&st->w_bf16, wn * 2), pgd__cuda_failed = 1; return);
            st->w_bf16_elems = wn;
        }
        CUDA_CHECK((cudaError_t)pgd_k_dequant_bf16(st->stream, w->type, w->data, w->row_bytes,
                                                   w->n_in, w->n_out, st->w_bf16));
        wb = st->w_bf16;
    }
    gemm_bf16(be, wb, st->x_bf16, y, w->n_in, w->n_out, n);
}

static void cuda_add_bias(pgd_backend *be, float *y, const float *b, int n_rows, int dim) {
    cuda_state *st = be->impl;
    OP_START(st);
    if (b) CUDA_CHECK((cudaError_t)pgd_k_add_bias(st->stream, y, b, rows_of(st, n_rows), dim));
}

static void cuda_qk_norm(pgd_backend *be, float *q, float *k, const float *wq, const float *wk,
                         int n_rows, int n_head, int n_kv_head, int head_dim, float eps) {
    cuda_state *st = be->impl;
    OP_START(st);
    CUDA_CHECK((cudaError_t)pgd_k_qk_norm(st->stream, q, k, wq, wk, rows_of(st, n_rows), n_head,
                                          n_kv_head, head_dim, eps));
}

static void cuda_rope(pgd_backend *be, float *x, int n_rows, int n_heads,
                      const pgd_rope_params *rp) {
    cuda_state *st = be->impl;
    OP_START(st);
    CUDA_CHECK((cudaError_t)pgd_k_rope(st->stream, x, rows_of(st, n_rows), n_heads, rp->head_dim,
                                       rp->mode == 1, st->d_pos, st->d_inv_freq));
}

static void cuda_kv_store(pgd_backend *be, const pgd_kv_layer *kv, const float *k, const float *v,
                          const pgd_step *s) {
    cuda_state *st = be->impl;
    OP_START(st);
    CUDA_CHECK((cudaError_t)pgd_k_kv_store(st->stream, kv->dtype, kv->k, kv->v, kv->kv_dim, k, v,
                                           st->d_slot, rows_of(st, s->n_tokens)));
}

static void cuda_rope_kv_store(pgd_backend *be, float *q, float *k, const float *v, int n_head,
                               int n_kv_head, const pgd_kv_layer *kv, const pgd_step *s,
                               const pgd_rope_params *rp) {
    cuda_state *st = be->impl;
    OP_START(st);
    CUDA_CHECK((cudaError_t)pgd_k_rope_kv_store(st->stream, q, k, v, rows_of(st, s->n_tokens),
                                                n_head, n_kv_head, rp->head_dim, rp->mode == 1,
                                                st->d_pos, st->d_inv_freq, kv->dtype, kv->k,
                                                kv->v, kv->kv_dim, st->d_slot));
}

static void cuda_attention(pgd_backend *be, const float *q, const pgd_kv_layer *kv, float *out,
                           int n_head, int n_kv_head, int head_dim, const pgd_step *s) {
    cuda_state *st = be->impl;
    /* supports(PGD_OP_WINDOW / PGD_OP_SOFTCAP) say no; the scale is the default one */
    PGD_ASSERT(kv->window == 0 && kv->softcap == 0 && kv->scale == 0);
    OP_START(st);
    if (fill_tables(be, s, kv->block_size, st->max_pos / kv->block_size + 1)) {
        pgd__cuda_failed = 1;
        return;
    }
    int n_tok = rows_of(st, s->n_tokens);
    int32_t n_splits = st->mode == MODE_EAGER /* else the graph key's */
                           ? split_count(st, st->max_pos + 1, n_tok, n_head, n_kv_head)
                           : st->g_splits;
    pgd_k_attn a = {
        .q = q, .out = out, .k = kv->k, .v = kv->v, .kv_dtype = kv->dtype, .kv_dim = kv->kv_dim,
        .block_size = kv->block_size, .pos = st->d_pos, .seq = st->d_seq, .tables = st->d_tables,
        .table_stride = st->tables_stride, .n_tokens = n_tok, .n_head = n_head,
        .n_kv_head = n_kv_head, .hd = head_dim, .n_splits = n_splits, .split_len = ATTN_SPLIT_MIN,
        .part = st->part,
    };
    /* the tensor-core kernel takes head sizes of a multiple of 16 up to 256: others run every
     * token in the flash-decoding kernel (no list: all of them) */
    if (st->mode == MODE_EAGER && st->n_tiles > 0 && head_dim % 16 == 0 && head_dim <= 256) {
        CUDA_CHECK((cudaError_t)pgd_k_attention_prefill(st->stream, &a,
                                                        (const pgd_k_qtile *)st->d_att,
                                                        st->n_tiles));
        a.tok_list = st->d_att + 2 * st->max_tokens;
        a.n_list = st->n_list;
    }
    CUDA_CHECK((cudaError_t)pgd_k_attention(st->stream, &a));
}

static void cuda_silu_gate(pgd_backend *be, float *g, const float *u, size_t n) {
    cuda_state *st = be->impl;
    /* Gate and up still queued as the GEMVs writing g and u: one launch computes both and the
     * gate (a decode step's SiLU-gate kernel folded into its matmuls); the launcher refuses
     * (NotSupported) matrices of different n_out or not 16-bit, which then run as queued. */
    if (st->gq_n == 2 && st->gq[0].y == g && st->gq[1].y == u &&
        elems_of(st, n) == (size_t)st->gq_rows * (size_t)st->gq[0].n_out) {
        int e = pgd_k_gemv_group(st->stream, st->gq_type, st->gq_n_in, st->gq, 2, st->gq_x,
                                 st->gq_rows, 1);
        if (e != (int)cudaErrorNotSupported) {
            st->gq_n = 0;
            st->xconv_src = NULL;
            CUDA_CHECK((cudaError_t)e);
            return;
        }
    }
    OP_START(st);
    size_t elems = elems_of(st, n);
    uint16_t *gb = bf16_copy_for(st, elems);
    CUDA_CHECK((cudaError_t)pgd_k_silu_gate(st->stream, g, u, elems, gb));
    note_bf16(st, g, elems, gb);
}

static void cuda_add(pgd_backend *be, float *x, const float *y, size_t n) {
    cuda_state *st = be->impl;
    OP_START(st);
    CUDA_CHECK((cudaError_t)pgd_k_add(st->stream, x, y, elems_of(st, n)));
}

static void cuda_gather_rows(pgd_backend *be, const float *src, float *dst, int dim,
                             const pgd_step *s) {
    cuda_state *st = be->impl;
    OP_START(st);
    if (s->n_logits)
        CUDA_CHECK((cudaError_t)pgd_k_gather_rows(st->stream, src, dst, dim, st->d_rows,
                                                  rows_of(st, s->n_logits)));
}

static void cuda_copy_block(pgd_backend *be, const pgd_kv_layer *kv, int32_t src, int32_t dst,
                            int32_t n) {
    size_t row = (size_t)kv->kv_dim * pgd_dtype_size(kv->dtype);
    size_t so = (size_t)src * kv->block_size * row, d = (size_t)dst * kv->block_size * row;
    cudaStream_t sm = stream_of(be);
    CUDA_CHECK(cudaSetDevice(be->device));
    CUDA_CHECK(cudaMemcpyAsync((char *)kv->k + d, (char *)kv->k + so, (size_t)n * row,
                               cudaMemcpyDeviceToDevice, sm));
    CUDA_CHECK(cudaMemcpyAsync((char *)kv->v + d, (char *)kv->v + so, (size_t)n * row,
                               cudaMemcpyDeviceToDevice, sm));
    CUDA_CHECK(cudaStreamSynchronize(sm));
}

/* The kernels include nothing outside kernels/: their row type must be pgd_sample_row's layout. */
_Static_assert(sizeof(pgd_sample_row) == sizeof(pgd_k_sample_row) &&
                   offsetof(pgd_sample_row, temperature) ==
                       offsetof(pgd_k_sample_row, temperature) &&
                   offsetof(pgd_sample_row, top_p) == offsetof(pgd_k_sample_row, top_p) &&
                   offsetof(pgd_sample_row, min_p) == offsetof(pgd_k_sample_row, min_p) &&
                   offsetof(pgd_sample_row, u) == offsetof(pgd_k_sample_row, u) &&
                   offsetof(pgd_sample_row, top_k) == offsetof(pgd_k_sample_row, top_k),
               "pgd_sample_row (src/sample/device_sample.h) and pgd_k_sample_row "
               "(kernels/sample.h) differ");

/* Rows through the pinned staging, one CTA per row (kernels/sample.cu), token ids back: n_rows
 * ints cross the bus instead of n_rows * n_vocab floats. Runs eagerly after the step's sync. */
static int cuda_sample(pgd_backend *be, const float *logits, int n_rows, int n_vocab,
                       const pgd_sample_row *rows, int32_t *out) {
    cuda_state *st = be->impl;
    flush_gemv(st);
    if (n_rows <= 0) return PGD_OK;
    if (n_rows > st->max_tokens) return PGD_EINVAL;
    size_t rb = (size_t)n_rows * sizeof *st->h_srow, tb = (size_t)n_rows * sizeof *out;
    CUDA_CHECK_OR(cudaSetDevice(be->device), return PGD_EIO);
    memcpy(st->h_srow, rows, rb); /* the last call synchronised: the staging is free */
    CUDA_CHECK_OR(cudaMemcpyAsync(st->d_srow, st->h_srow, rb, cudaMemcpyHostToDevice, st->stream),
                  return PGD_EIO);
    CUDA_CHECK_OR((cudaError_t)pgd_k_sample(st->stream, logits, n_rows, n_vocab, st->d_srow,
                                            st->d_stok),
                  return PGD_EIO);
    CUDA_CHECK_OR(cudaMemcpyAsync(st->h_stok, st->d_stok, tb, cudaMemcpyDeviceToHost, st->stream),
                  return PGD_EIO);
    CUDA_CHECK_OR(cudaStreamSynchronize(st->stream), return PGD_EIO);
    memcpy(out, st->h_stok, tb);
    return PGD_OK;
}

static const pgd_backend_ops cuda_ops = {
    .name = "cuda",
    .host_memory = false,
    .supports = cuda_supports,
    .init = cuda_init,
    .free = cuda_free,
    .alloc = cuda_alloc,
    .mem_free = cuda_mem_free,
    .upload = cuda_upload,
    .download = cuda_download,
    .sync = cuda_sync,
    .begin = cuda_begin,
    .embed = cuda_embed,
    .rms_norm = cuda_rms_norm,
    .add_rms_norm = cuda_add_rms_norm,
    .qk_norm = cuda_qk_norm,
    .matmul = cuda_matmul,
    .add_bias = cuda_add_bias,
    .rope = cuda_rope,
    .kv_store = cuda_kv_store,
    .rope_kv_store = cuda_rope_kv_store,
    .attention = cuda_attention,
    .silu_gate = cuda_silu_gate,
    .add = cuda_add,
    .gather_rows = cuda_gather_rows,
    .copy_block = cuda_copy_block,
    .mem_info = cuda_mem_info,
    .sample = cuda_sample,
};

const pgd_backend_ops *pgd_cuda_backend_ops(void) { return &cuda_ops; }

void *pgd_cuda_stream(const pgd_backend *be) {
    cuda_state *st = be->impl;
    flush_gemv(st);
    return st ? (void *)st->stream : NULL;
}

/* Bandwidth probe for bench/gpu: copies bytes device-to-device `iters` times with the copy
 * kernel and returns GB/s (read + write), or a negative value on failure. */
double pgd_cuda_copy_bandwidth(int device, size_t bytes, int iters) {
    void *a = NULL, *b = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    float ms = 0.0f;
    double r = -1.0;
    CUDA_CHECK_OR(cudaSetDevice(device), return -1.0);
    CUDA_CHECK_OR(cudaMalloc(&a, bytes), goto done);
    CUDA_CHECK_OR(cudaMalloc(&b, bytes), goto done);
    CUDA_CHECK_OR(cudaEventCreate(&e0), goto done);
    CUDA_CHECK_OR(cudaEventCreate(&e1), goto done);
    CUDA_CHECK_OR((cudaError_t)pgd_k_copy(0, a, b, bytes / 16), goto done);
    CUDA_CHECK_OR(cudaEventRecord(e0, 0), goto done);
    for (int i = 0; i < iters; i++) CUDA_CHECK_OR((cudaError_t)pgd_k_copy(0, a, b, bytes / 16), goto done);
    CUDA_CHECK_OR(cudaEventRecord(e1, 0), goto done);
    CUDA_CHECK_OR(cudaEventSynchronize(e1), goto done);
    CUDA_CHECK_OR(cudaEventElapsedTime(&ms, e0, e1), goto done);
    r = 2.0 * (double)bytes * iters / (ms * 1e-3) / 1e9;
done:
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    if (a) cudaFree(a);
    if (b) cudaFree(b);
    return r;
}

/* cuBLASLt BF16 GEMM throughput for bench/gpu (the prefill roofline): y (n x m) = x (n x k) .
 * W^T (W: m x k) with F32 accumulation and output, as the backend's GEMM path runs it, `iters`
 * times after one warm-up; TFLOP/s, or a negative value on failure. */
double pgd_cuda_gemm_tflops(int device, int m, int n, int k, int iters) {
    pgd_backend be = {.ops = &cuda_ops, .device = device};
    pgd_err err = {{0}};
    void *w = NULL, *x = NULL;
    float *y = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    float ms = 0.0f;
    double r = -1.0;
    if (cuda_init(&be, 1, 64, 1, 1, 16, &err)) return -1.0;
    cuda_state *st = be.impl;
    CUDA_CHECK_OR(cudaMalloc(&w, (size_t)m * k * 2), goto done);
    CUDA_CHECK_OR(cudaMalloc(&x, (size_t)n * k * 2), goto done);
    CUDA_CHECK_OR(cudaMalloc((void **)&y, (size_t)m * n * 4), goto done);
    CUDA_CHECK_OR(cudaMemsetAsync(w, 0x3c, (size_t)m * k * 2, st->stream), goto done);
    CUDA_CHECK_OR(cudaMemsetAsync(x, 0x3c, (size_t)n * k * 2, st->stream), goto done);
    CUDA_CHECK_OR(cudaEventCreate(&e0), goto done);
    CUDA_CHECK_OR(cudaEventCreate(&e1), goto done);
    gemm_bf16(&be, w, x, y, k, m, n);
    CUDA_CHECK_OR(cudaEventRecord(e0, st->stream), goto done);
    for (int i = 0; i < iters; i++) gemm_bf16(&be, w, x, y, k, m, n);
    CUDA_CHECK_OR(cudaEventRecord(e1, st->stream), goto done);
    CUDA_CHECK_OR(cudaEventSynchronize(e1), goto done);
    CUDA_CHECK_OR(cudaEventElapsedTime(&ms, e0, e1), goto done);
    if (!pgd__cuda_failed && ms > 0) r = 2.0 * m * n * (double)k * iters / (ms * 1e-3) / 1e12;
done:
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    if (w) cudaFree(w);
    if (x) cudaFree(x);
    if (y) cudaFree(y);
    cuda_free(&be);
    return r;
}
