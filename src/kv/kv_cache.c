/* Paged KV storage (kv_cache.h): allocated on, copied by and freed through the backends of a
 * model's shards, one K and one V allocation per rank. The model is read for its shape and its
 * shards' backends only; the forward pass (model/forward.c) reads and writes the storage. */
#include "kv/kv_cache.h"

#include <string.h>

#include "model/model.h"

bool pgd_kv_type_ok(pgd_type t) {
    return t == PGD_TYPE_F32 || t == PGD_TYPE_F16 || t == PGD_TYPE_BF16 || t == PGD_TYPE_Q8_0 ||
           t == PGD_TYPE_Q4_0;
}

size_t pgd_kv_cache_bytes_per_token2(const pgd_model *m, pgd_type dtype, pgd_type vtype) {
    uint64_t kv_dim = (uint64_t)m->cfg.n_kv_head * (uint64_t)m->cfg.head_dim;
    if (m->cfg.kv_lora_rank) /* the latent cache: one row (kv_cache.h) */
        return (size_t)m->cfg.n_layer * (size_t)pgd_type_row_bytes(dtype, kv_dim);
    return (size_t)m->cfg.n_layer *
           (size_t)(pgd_type_row_bytes(dtype, kv_dim) + pgd_type_row_bytes(vtype, kv_dim));
}

size_t pgd_kv_cache_bytes_per_token(const pgd_model *m, pgd_type dtype) {
    return pgd_kv_cache_bytes_per_token2(m, dtype, dtype);
}

int pgd_kv_cache_init(pgd_kv_cache *c, const pgd_model *m, pgd_type dtype, int32_t n_blocks,
                      int32_t block_size, pgd_err *err) {
    return pgd_kv_cache_init2(c, m, dtype, dtype, n_blocks, block_size, err);
}

int pgd_kv_cache_init2(pgd_kv_cache *c, const pgd_model *m, pgd_type dtype, pgd_type vtype,
                       int32_t n_blocks, int32_t block_size, pgd_err *err) {
    memset(c, 0, sizeof *c);
    if (!pgd_kv_type_ok(dtype) || !pgd_kv_type_ok(vtype))
        return pgd_err_set(err, PGD_EINVAL, "KV cache type must be f32, f16, bf16, q8_0 or q4_0");
    if (m->cfg.kv_lora_rank && (dtype != vtype || pgd_type_block_elems(dtype) > 1))
        return pgd_err_set(err, PGD_EUNSUPPORTED, "the latent KV cache of %s (latent attention) "
                           "takes one type, f32, f16 or bf16, for K and V", m->path);
    uint32_t be = pgd_type_block_elems(dtype) > pgd_type_block_elems(vtype)
                      ? pgd_type_block_elems(dtype) : pgd_type_block_elems(vtype);
    if (m->cfg.head_dim % (int32_t)be)
        return pgd_err_set(err, PGD_EUNSUPPORTED, "KV cache types %s/%s need a head size that "
                           "is a multiple of %u; this model's is %d", pgd_type_name(dtype),
                           pgd_type_name(vtype), be, m->cfg.head_dim);
    bool gpu = false; /* (a device's memory: the CUDA kernels read one F32/F16/BF16 type) */
    for (int r = 0; r < m->n_ranks; r++) gpu |= m->shards[r].be.ops->mem_info != NULL;
    if (gpu && (pgd_type_block_elems(dtype) > 1 || pgd_type_block_elems(vtype) > 1))
        return pgd_err_set(err, PGD_EUNSUPPORTED, "KV cache types q8_0 and q4_0 are for the "
                           "CPU backend; on a GPU use f16 or bf16");
    if (gpu && dtype != vtype)
        return pgd_err_set(err, PGD_EUNSUPPORTED, "different K and V cache types are for the "
                           "CPU backend");
    if (n_blocks < 1 || block_size < 1)
        return pgd_err_set(err, PGD_EINVAL, "KV cache needs at least one block");
    c->latent = m->cfg.kv_lora_rank > 0;
    c->dtype = dtype;
    c->vtype = vtype;
    c->n_layer = m->cfg.n_layer;
    c->n_blocks = n_blocks;
    c->block_size = block_size;
    c->model = m;
    c->n_ranks = m->n_ranks;
    c->kv_dim = m->shards[0].n_kv_head * m->cfg.head_dim;
    size_t n = (size_t)c->n_layer * (size_t)n_blocks * (size_t)block_size;
    size_t kb = n * pgd_type_row_bytes(dtype, (uint64_t)c->kv_dim);
    size_t vb = n * pgd_type_row_bytes(vtype, (uint64_t)c->kv_dim);
    for (int r = 0; r < c->n_ranks; r++) {
        pgd_backend *bk = &m->shards[r].be;
        c->rk[r] = bk->ops->alloc(bk, kb);
        c->rv[r] = c->latent ? c->rk[r] : bk->ops->alloc(bk, vb);
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
        if (c->rv[r] && c->rv[r] != c->rk[r]) be->ops->mem_free(be, c->rv[r]);
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

size_t pgd_kv_cache_block_bytes(const pgd_kv_cache *c) {
    size_t row = pgd_type_row_bytes(c->dtype, (uint64_t)c->kv_dim) +
                 pgd_type_row_bytes(c->vtype, (uint64_t)c->kv_dim);
    return (size_t)c->n_ranks * (size_t)c->n_layer * (size_t)c->block_size * row;
}

/* Block b of layer il on rank r: its K and V slots as byte ranges. */
static void block_span(const pgd_kv_cache *c, int r, int il, int32_t b, char **k, size_t *kn,
                       char **v, size_t *vn) {
    pgd_kv_layer l = pgd_kv_cache_layer(c, r, il);
    *kn = (size_t)c->block_size * pgd_type_row_bytes(c->dtype, (uint64_t)c->kv_dim);
    *vn = (size_t)c->block_size * pgd_type_row_bytes(c->vtype, (uint64_t)c->kv_dim);
    *k = (char *)l.k + (size_t)b * *kn;
    *v = (char *)l.v + (size_t)b * *vn;
}

void pgd_kv_cache_block_read(const pgd_kv_cache *c, int32_t b, void *dst) {
    char *o = dst;
    for (int r = 0; r < c->n_ranks; r++)
        for (int il = 0; il < c->n_layer; il++) {
            char *k, *v;
            size_t kn, vn;
            block_span(c, r, il, b, &k, &kn, &v, &vn);
            memcpy(o, k, kn);
            memcpy(o + kn, v, vn);
            o += kn + vn;
        }
}

void pgd_kv_cache_block_write(pgd_kv_cache *c, int32_t b, const void *src) {
    const char *p = src;
    for (int r = 0; r < c->n_ranks; r++)
        for (int il = 0; il < c->n_layer; il++) {
            char *k, *v;
            size_t kn, vn;
            block_span(c, r, il, b, &k, &kn, &v, &vn);
            memcpy(k, p, kn);
            memcpy(v, p + kn, vn);
            p += kn + vn;
        }
}
