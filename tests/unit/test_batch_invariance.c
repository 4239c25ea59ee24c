/* Batch invariance of the whole forward pass (issue 3): the logits of a token are bit-identical
 * whether it is computed alone, one token per step, or inside steps of 3, 16 or 64 tokens that
 * mix prefill chunks of its own sequence with tokens of other sequences. Each step computes the
 * logits of every token it holds, through pgd_model_forward over a paged KV cache, as the engine
 * does. Models: the test models under tests/data, and the default SmolLM2-135M Q4_1 model (real
 * quantized weights) when models/ has it, with an F32 KV cache and (SmolLM2) the quantized KV
 * types Q8_0 and Q4_0, K and V alike and apart. Both activation modes are covered by ctest running
 * this binary as is (F32 activations) and again with PAGODA_INT8_ACT=1 (CMakeLists.txt). Models
 * named on the command line are checked instead, with F32 and F16 KV (test_deepseek.py runs the
 * tiny DeepSeek models so: their latent cache). */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/cpu/pool.h"
#include "model/model.h"
#include "test.h"

enum { BLOCK = 8, MAX_SEQS = 16, MAX_LEN = 16 };

typedef struct workload {
    int n_seqs, len[MAX_SEQS];
    int32_t tok[MAX_SEQS][MAX_LEN];
} workload;

/* Runs every token of w through steps of at most b tokens, in sequence-major order (long
 * prefill chunks) or position-major order (one token of each sequence per round, as decode
 * steps), and stores each token's logits at out[(seq * MAX_LEN + pos) * n_vocab]. */
static int run(const pgd_model *m, pgd_pool *pool, const workload *w, int b, bool seq_major,
               pgd_type kt, pgd_type vt, float *out) {
    pgd_err err = {{0}};
    const int per_seq = (MAX_LEN + BLOCK - 1) / BLOCK, nv = m->cfg.n_vocab;
    pgd_kv_cache kv;
    pgd_fwd f;
    if (pgd_kv_cache_init2(&kv, m, kt, vt, MAX_SEQS * per_seq, BLOCK, &err)) return -1;
    if (pgd_fwd_init(&f, m, pool, b, b, &err)) {
        pgd_kv_cache_free(&kv);
        return -1;
    }
    int32_t blocks[MAX_SEQS * 2];
    const int32_t *tables[MAX_SEQS];
    for (int j = 0; j < MAX_SEQS * per_seq; j++) blocks[j] = MAX_SEQS * per_seq - 1 - j;
    for (int s = 0; s < MAX_SEQS; s++) tables[s] = blocks + s * per_seq;
    /* the order tokens are fed in */
    int order_s[MAX_SEQS * MAX_LEN], order_p[MAX_SEQS * MAX_LEN], n = 0;
    if (seq_major) {
        for (int s = 0; s < w->n_seqs; s++)
            for (int p = 0; p < w->len[s]; p++) order_s[n] = s, order_p[n++] = p;
    } else {
        for (int p = 0; p < MAX_LEN; p++)
            for (int s = 0; s < w->n_seqs; s++)
                if (p < w->len[s]) order_s[n] = s, order_p[n++] = p;
    }
    int32_t tok[64], pos[64], seq[64], rows[64];
    int64_t slot[64];
    int rc = 0;
    for (int i0 = 0; i0 < n && !rc; i0 += b) {
        int nb = n - i0 < b ? n - i0 : b;
        for (int i = 0; i < nb; i++) {
            int s = order_s[i0 + i], p = order_p[i0 + i];
            tok[i] = w->tok[s][p];
            pos[i] = p;
            seq[i] = s;
            rows[i] = i;
            slot[i] = (int64_t)tables[s][p / BLOCK] * BLOCK + p % BLOCK;
        }
        pgd_batch batch = {.n_tokens = nb, .tokens = tok, .pos = pos, .seq = seq, .slot = slot,
                           .block_tables = tables, .n_logits = nb, .logit_rows = rows};
        rc = pgd_model_forward(&f, &kv, &batch);
        for (int i = 0; i < nb && !rc; i++)
            memcpy(out + ((size_t)seq[i] * MAX_LEN + (size_t)pos[i]) * nv,
                   f.logits + (size_t)i * nv, sizeof(float) * (size_t)nv);
    }
    pgd_fwd_free(&f);
    pgd_kv_cache_free(&kv);
    return rc;
}

static void check_model(const char *path, int n_seqs, int max_len, pgd_type kt, pgd_type vt) {
    pgd_err err = {{0}};
    pgd_model_opts mo = {.n_ctx = 64};
    pgd_model *m;
    pgd_pool *pool;
    if (pgd_model_load(path, &mo, &m, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        CHECK(!"model loads");
        return;
    }
    CHECK_EQ_INT(pgd_pool_create(2, &pool, &err), 0);
    workload w = {.n_seqs = n_seqs};
    uint64_t rs = 0x9e3779b97f4a7c15ull;
    for (int s = 0; s < n_seqs; s++) {
        rs = rs * 6364136223846793005ull + 1442695040888963407ull;
        w.len[s] = 1 + (int)((rs >> 33) % (uint64_t)max_len);
        for (int p = 0; p < w.len[s]; p++) {
            rs = rs * 6364136223846793005ull + 1442695040888963407ull;
            w.tok[s][p] = (int32_t)((rs >> 33) % (uint64_t)m->cfg.n_vocab);
        }
    }
    size_t sz = sizeof(float) * (size_t)MAX_SEQS * MAX_LEN * (size_t)m->cfg.n_vocab;
    float *ref = calloc(1, sz), *got = calloc(1, sz);
    CHECK(ref && got);
    /* reference: one token per step */
    CHECK_EQ_INT(run(m, pool, &w, 1, true, kt, vt, ref), 0);
    const int sizes[] = {3, 16, 64};
    for (int si = 0; si < 3; si++)
        for (int major = 0; major < 2; major++) {
            memset(got, 0, sz);
            CHECK_EQ_INT(run(m, pool, &w, sizes[si], major, kt, vt, got), 0);
            int bad = 0, total = 0;
            for (int s = 0; s < n_seqs; s++)
                for (int p = 0; p < w.len[s]; p++, total++) {
                    size_t o = ((size_t)s * MAX_LEN + (size_t)p) * (size_t)m->cfg.n_vocab;
                    bad += memcmp(ref + o, got + o, sizeof(float) * (size_t)m->cfg.n_vocab) != 0;
                }
            if (bad)
                fprintf(stderr, "%s (KV %s/%s): batch %d (%s order): %d of %d tokens' logits "
                        "differ\n", path, pgd_type_name(kt), pgd_type_name(vt), sizes[si],
                        major ? "sequence" : "position", bad, total);
            CHECK_EQ_INT(bad, 0);
        }
    printf("%s (KV %s/%s): %d sequences, logits bit-identical at batch 1, 3, 16, 64\n", path,
           pgd_type_name(kt), pgd_type_name(vt), n_seqs);
    free(ref);
    free(got);
    pgd_pool_free(pool);
    pgd_model_free(m);
}

int main(int argc, char **argv) {
    const pgd_type F32 = PGD_TYPE_F32;
    if (argc > 1) {
        for (int i = 1; i < argc; i++) {
            check_model(argv[i], MAX_SEQS, MAX_LEN, F32, F32);
            check_model(argv[i], MAX_SEQS, MAX_LEN, PGD_TYPE_F16, PGD_TYPE_F16);
        }
        return test_report("test_batch_invariance");
    }
    check_model("tests/data/models/stories260K.gguf", MAX_SEQS, MAX_LEN, F32, F32);
    check_model("tests/data/models/stories260K.gguf", MAX_SEQS, MAX_LEN, PGD_TYPE_F16,
                PGD_TYPE_BF16);
    check_model("tests/data/models/llama-2-tiny-random.gguf", MAX_SEQS, MAX_LEN, F32, F32);
    const char *smol = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    /* the quantized KV types (blocks of 32) need its heads of 64 */
    if (access(smol, R_OK) == 0) {
        check_model(smol, 10, 8, F32, F32);
        check_model(smol, 10, 8, PGD_TYPE_Q8_0, PGD_TYPE_Q8_0);
        check_model(smol, 10, 8, PGD_TYPE_Q4_0, PGD_TYPE_Q4_0);
        check_model(smol, 10, 8, PGD_TYPE_Q8_0, PGD_TYPE_F16);
    }
    else printf("%s not fetched: skipped (scripts/fetch-default-model.sh)\n", smol);
    return test_report("test_batch_invariance");
}
