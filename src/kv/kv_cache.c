/* Paged KV storage (kv_cache.h): allocated on, copied by and freed through the backends of a
 * model's shards, one K and one V allocation per rank. The model is read for its shape and its
 * shards' backends only; the forward pass (model/forward.c) reads and writes the storage. */
#include "kv/kv_cache.h"

#include <string.h>

#include "model/model.h"

size_t pgd_kv_cache_bytes_per_token(const pgd_model *m, pgd_type dtype) {
    return 2 * (size_t)m->cfg.n_layer * (size_t)m->cfg.n_kv_head * (size_t)m->cfg.head_dim *
           pgd_dtype_size(dtype);
}

int pgd_kv_cache_init(pgd_kv_cache *c, const pgd_model *m, pgd_type dtype, int32_t n_blocks,
                      int32_t block_size, pgd_err *err) {
    memset(c, 0, sizeof *c);
    if (dtype != PGD_TYPE_F32 && dtype != PGD_TYPE_F16 && dtype != PGD_TYPE_BF16)
        return pgd_err_set(err, PGD_EINVAL, "KV cache dtype must be F32, F16 or BF16");
    if (n_blocks < 1 || block_size < 1)
        return pgd_err_set(err, PGD_EINVAL, "KV cache needs at least one block");
    c->dtype = dtype;
    c->n_layer = m->cfg.n_layer;
    c->n_blocks = n_blocks;
    c->block_size = block_size;
    c->model = m;
    c->n_ranks = m->n_ranks;
    c->kv_dim = m->shards[0].n_kv_head * m->cfg.head_dim;
    size_t n = (size_t)c->n_layer * (size_t)n_blocks * (size_t)block_size * (size_t)c->kv_dim;
    for (int r = 0; r < c->n_ranks; r++) {
        pgd_backend *be = &m->shards[r].be;
        c->rk[r] = be->ops->alloc(be, n * pgd_dtype_size(dtype));
        c->rv[r] = be->ops->alloc(be, n * pgd_dtype_size(dtype));
        if (!c->rk[r] || !c->rv[r]) {
            pgd_kv_cache_free(c);
            return pgd_err_set(err, PGD_ENOMEM, "KV cache: cannot allocate %d blocks of %d tokens",
                               n_blocks, block_size);
        }
    }
    c->k = c->rk[0];
    c->v = c->rv[0];
    return PGD_OK;
}

void pgd_kv_cache_free(pgd_kv_cache *c) {
    for (int r = 0; r < c->n_ranks; r++) {
        pgd_backend *be = &c->model->shards[r].be;
        if (c->rk[r]) be->ops->mem_free(be, c->rk[r]);
        if (c->rv[r]) be->ops->mem_free(be, c->rv[r]);
    }
    memset(c, 0, sizeof *c);
}

void pgd_kv_cache_copy_block(pgd_kv_cache *c, int32_t src, int32_t dst, int32_t n) {
    for (int r = 0; r < c->n_ranks; r++) {
        pgd_backend *be = (pgd_backend *)&c->model->shards[r].be;
        for (int il = 0; il < c->n_layer; il++) {
            pgd_kv_layer l = pgd_kv_cache_layer(c, r, il);
            be->ops->copy_block(be, &l, src, dst, n);
        }
    }
}
