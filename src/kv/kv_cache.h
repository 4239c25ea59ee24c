/* Paged KV storage: the K and V tensors of every layer that the block manager's block ids
 * (kv/kv.h) name, in the memory of the backends that hold a model's shards (one allocation per
 * rank for K and one for V). kv.h never sees these; the forward pass reads and writes them
 * through pgd_kv_cache_layer, and the runner copies blocks for copy-on-write. */
#ifndef PGD_KV_CACHE_H
#define PGD_KV_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "core/types.h"
#include "util/status.h"

struct pgd_model;

/* n_blocks blocks of block_size token slots, every layer's K and V for one logical block id.
 * Slot = block * block_size + offset. */
typedef struct pgd_kv_cache {
    pgd_type dtype, vtype;    /* K's and V's: F32, F16, BF16, Q8_0 or Q4_0 (CPU) */
    int32_t n_layer, n_blocks, block_size, kv_dim; /* kv_dim: one rank's n_kv_head * head_dim */
    /* A latent cache (multi-head latent attention, cfg.kv_lora_rank): one row per token, the
     * latent and the rotated key, which is K; V is the same storage (rv == rk: the attention
     * reads the latent as its values), so a token costs one row, not two. */
    bool latent;
    void *k, *v;              /* rank 0's (n_layer, n_blocks * block_size, kv_dim) of dtype */
    int32_t n_ranks;
    void *rk[PGD_MAX_TP], *rv[PGD_MAX_TP]; /* each rank's K and V, in its backend's memory */
    const struct pgd_model *model; /* borrowed: whose shards' backends hold the storage */
} pgd_kv_cache;

/* Allocates storage for n_blocks blocks (zeroed lazily by the OS) on m's shards' backends; m is
 * borrowed and must outlive c. K's type dtype, V's vtype. */
int pgd_kv_cache_init(pgd_kv_cache *c, const struct pgd_model *m, pgd_type dtype,
                      int32_t n_blocks, int32_t block_size, pgd_err *err);
int pgd_kv_cache_init2(pgd_kv_cache *c, const struct pgd_model *m, pgd_type dtype, pgd_type vtype,
                       int32_t n_blocks, int32_t block_size, pgd_err *err);
/* Whether t can be a KV element type (F32, F16, BF16, Q8_0, Q4_0). */
bool pgd_kv_type_ok(pgd_type t);
void pgd_kv_cache_free(pgd_kv_cache *c);
/* Bytes one token slot takes across all layers (K and V, both of dtype; a latent cache's one
 * row). */
size_t pgd_kv_cache_bytes_per_token(const struct pgd_model *m, pgd_type dtype);
/* The same with K of dtype and V of vtype. */
size_t pgd_kv_cache_bytes_per_token2(const struct pgd_model *m, pgd_type dtype, pgd_type vtype);
/* Copies the first n slots of block src to block dst in every layer (copy-on-write). */
void pgd_kv_cache_copy_block(pgd_kv_cache *c, int32_t src, int32_t dst, int32_t n);

/* Bytes of one block across every rank and layer, K and V (the disk tier's payload). */
size_t pgd_kv_cache_block_bytes(const pgd_kv_cache *c);
/* Copies block b's bytes out to dst (block_bytes) / in from src: every rank's, then every
 * layer's K slots then V slots, raw, whatever the types. Host memory only (the CPU backend). */
void pgd_kv_cache_block_read(const pgd_kv_cache *c, int32_t b, void *dst);
void pgd_kv_cache_block_write(pgd_kv_cache *c, int32_t b, const void *src);

/* Layer il's storage on rank `rank`, as the backend ops see it (no window, scale or softcap:
 * the forward pass sets those per layer). */
static inline pgd_kv_layer pgd_kv_cache_layer(const pgd_kv_cache *c, int rank, int il) {
    size_t slots = (size_t)c->n_blocks * (size_t)c->block_size;
    size_t k_layer = slots * pgd_type_row_bytes(c->dtype, (uint64_t)c->kv_dim);
    size_t v_layer = slots * pgd_type_row_bytes(c->vtype, (uint64_t)c->kv_dim);
    pgd_kv_layer l = {
        .dtype = c->dtype,
        .vtype = c->vtype,
        .k = (char *)c->rk[rank] + (size_t)il * k_layer,
        .v = (char *)c->rv[rank] + (size_t)il * (c->latent ? k_layer : v_layer),
        .block_size = c->block_size,
        .kv_dim = c->kv_dim,
    };
    return l;
}

#endif
