/* The draft-model proposer: a second model with the target's vocabulary and its own paged KV
 * pool. Each sequence's draft cache is caught up lazily (prefill chunks over the tokens it has
 * not seen), then the draft decodes k greedy tokens; after verification the engine rolls it
 * back to the tokens that survived. Sequences are drafted one at a time (simple, and exact;
 * batching the draft's decodes across sequences is a later optimisation). */
#include <stdlib.h>
#include <string.h>

#include "spec/spec.h"
#include "util/xalloc.h"

int pgd_draft_init(pgd_draft *d, const char *path, pgd_pool *pool, int32_t n_vocab,
                   int32_t n_ctx, int32_t n_blocks, int32_t block_size, int32_t chunk,
                   pgd_err *err) {
    memset(d, 0, sizeof *d);
    pgd_model_opts mo = {.n_ctx = n_ctx};
    int rc = pgd_model_load(path, &mo, &d->model, err);
    if (rc) return rc;
    if (d->model->cfg.n_vocab != n_vocab) {
        rc = pgd_err_set(err, PGD_EINVAL, "draft model %s has a vocabulary of %d tokens; the "
                         "target's has %d", path, d->model->cfg.n_vocab, n_vocab);
        goto fail;
    }
    d->n_ctx = d->model->cfg.n_ctx;
    d->chunk = chunk < 1 ? 1 : chunk;
    d->max_blocks_per_seq = (d->n_ctx + block_size - 1) / block_size;
    if ((rc = pgd_kv_cache_init(&d->kv, d->model, PGD_TYPE_F32, n_blocks, block_size, err)) ||
        (rc = pgd_kv_mgr_init(&d->mgr, n_blocks, block_size, false, err)) ||
        (rc = pgd_fwd_init(&d->fwd, d->model, pool, d->chunk, 1, err)))
        goto fail;
    size_t C = (size_t)d->chunk;
    const pgd_slice batch[] = {{&d->b_tokens, C * sizeof *d->b_tokens},
                               {&d->b_pos, C * sizeof *d->b_pos},
                               {&d->b_seq, C * sizeof *d->b_seq},
                               {&d->b_slot, C * sizeof *d->b_slot}};
    if (!(d->b_block = pgd_alloc_slices(batch, sizeof batch / sizeof batch[0]))) {
        rc = pgd_err_set(err, PGD_ENOMEM, "draft model: out of memory");
        goto fail;
    }
    return PGD_OK;
fail:
    pgd_draft_free(d);
    return rc;
}

void pgd_draft_free(pgd_draft *d) {
    if (d->fwd.model) pgd_fwd_free(&d->fwd);
    if (d->kv.k) pgd_kv_cache_free(&d->kv);
    if (d->mgr.blocks) pgd_kv_mgr_free(&d->mgr);
    pgd_model_free(d->model);
    free(d->b_block); /* b_tokens, b_pos, b_seq, b_slot */
    memset(d, 0, sizeof *d);
}

int pgd_draft_seq_init(pgd_draft *d, pgd_draft_seq *ds) {
    ds->n_computed = 0;
    return pgd_kv_seq_init(&ds->kv, d->max_blocks_per_seq);
}

void pgd_draft_seq_release(pgd_draft *d, pgd_draft_seq *ds) {
    pgd_kv_release(&d->mgr, &ds->kv);
    ds->n_computed = 0;
}

void pgd_draft_seq_free(pgd_draft_seq *ds) { pgd_kv_seq_free(&ds->kv); }

/* Runs tokens[0..n) at positions pos0.. through the draft; logits of the last one land in
 * d->fwd.logits. Blocks are already reserved. */
static int run(pgd_draft *d, pgd_draft_seq *ds, const int32_t *tokens, int32_t n, int32_t pos0) {
    int32_t bs = d->mgr.block_size;
    for (int32_t i = 0; i < n; i++) {
        int32_t p = pos0 + i;
        d->b_tokens[i] = tokens[i];
        d->b_pos[i] = p;
        d->b_slot[i] = (int64_t)ds->kv.table[p / bs] * bs + p % bs;
    }
    const int32_t *tables[1] = {ds->kv.table};
    int32_t row = n - 1;
    pgd_batch b = {.n_tokens = n, .tokens = d->b_tokens, .pos = d->b_pos, .seq = d->b_seq,
                   .slot = d->b_slot, .block_tables = tables, .n_logits = 1, .logit_rows = &row};
    return pgd_model_forward(&d->fwd, &d->kv, &b);
}

int32_t pgd_draft_propose(pgd_draft *d, pgd_draft_seq *ds, const int32_t *tokens,
                          int32_t n_tokens, int32_t k, int32_t *out) {
    if (k <= 0) return 0;
    if (ds->n_computed >= n_tokens) pgd_draft_rollback(d, ds, n_tokens - 1); /* recompute the last */
    /* draft inputs: the unseen tokens, then k - 1 of its own proposals */
    if ((int64_t)n_tokens + k - 1 > d->n_ctx) k = d->n_ctx - n_tokens + 1;
    if (k <= 0) return 0;
    pgd_kv_copy cp;
    if (pgd_kv_reserve(&d->mgr, &ds->kv, ds->n_computed, n_tokens + k - 1, &cp)) {
        pgd_draft_seq_release(d, ds); /* no room: start over later */
        return 0;
    }
    while (ds->n_computed < n_tokens) {
        int32_t n = n_tokens - ds->n_computed < d->chunk ? n_tokens - ds->n_computed : d->chunk;
        if (run(d, ds, tokens + ds->n_computed, n, ds->n_computed)) goto fail;
        ds->n_computed += n;
    }
    int32_t nv = d->model->cfg.n_vocab;
    out[0] = pgd_argmax(d->fwd.logits, nv);
    for (int32_t j = 1; j < k; j++) {
        if (run(d, ds, &out[j - 1], 1, ds->n_computed)) goto fail;
        ds->n_computed++;
        out[j] = pgd_argmax(d->fwd.logits, nv);
    }
    return k;
fail:
    pgd_draft_seq_release(d, ds);
    return 0;
}

void pgd_draft_rollback(pgd_draft *d, pgd_draft_seq *ds, int32_t n_valid) {
    if (n_valid < 0) n_valid = 0;
    if (ds->n_computed > n_valid) ds->n_computed = n_valid;
    pgd_kv_truncate(&d->mgr, &ds->kv, ds->n_computed);
}
