/* The KV block manager: a pool of fixed-size blocks (one block id covers every layer's K and V
 * slots for block_size tokens), per-sequence block tables, reference counts, copy-on-write, and
 * the prefix cache. It sees only token ids and block ids -- never tensors.
 *
 * Prefix cache: a full block is identified by hash(parent_hash, block_tokens). A hit is accepted
 * only if the block's tokens equal the query's and its parent is the very block (same id, same
 * generation) that the query's previous block resolved to, so a hash collision can never serve
 * wrong KV. Blocks released by finished sequences keep their hash (lazy eviction) and are
 * reused least-recently-released first. */
#ifndef PGD_KV_H
#define PGD_KV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/status.h"

typedef struct pgd_kv_block {
    int32_t ref;          /* sequences using the block; 0 = on the free list */
    int32_t prev, next;   /* free-list links (-1 = none) */
    uint64_t hash;        /* prefix hash of a full, registered block; 0 = none */
    int32_t parent;       /* block id of the previous block in the registering sequence, -1 first */
    uint32_t parent_gen;  /* parent's generation at registration */
    uint32_t gen;         /* bumped whenever the block is (re)allocated */
    uint32_t ns;          /* namespace of the registering sequence (pgd_kv_seq.ns) */
    uint64_t parent_hash; /* hash of the block before it in the registering sequence; 0: first */
} pgd_kv_block;

typedef struct pgd_kv_seq {
    int32_t *table;       /* (max_blocks) block ids */
    int32_t n_blocks, max_blocks;
    int32_t n_hashed;     /* leading full blocks already hashed (registered when prefix caching) */
    uint64_t chain_hash;  /* prefix hash of block n_hashed - 1 (0 before the first) */
    /* Prefix-cache namespace: blocks are shared only between sequences of the same one, as KV
     * computed under one LoRA adapter is not the KV of the same tokens under another (0: the
     * base model). Set after pgd_kv_seq_init. */
    uint32_t ns;
} pgd_kv_seq;

/* A copy-on-write copy the runner must perform before the next step: the first n slots of block
 * src into block dst. */
typedef struct pgd_kv_copy {
    int32_t src, dst, n;
} pgd_kv_copy;

typedef struct pgd_kv_stats {
    int64_t prefix_queries; /* prompt tokens looked up in the prefix cache */
    int64_t prefix_hits;    /* of those, tokens served from it */
} pgd_kv_stats;

/* The prefix cache's changes, for KV-aware routers (vLLM's KV events): a block registered
 * (STORED, with its parent's hash and its tokens), one that lost its registration (REMOVED:
 * evicted for reuse, or dropped by pgd_kv_drop_cached). Recorded only once enabled; the owner
 * takes them out (pgd_kv_events_take) and clears the log, at least once per step. */
typedef enum { PGD_KV_EV_STORED = 1, PGD_KV_EV_REMOVED = 2 } pgd_kv_event_kind;

typedef struct pgd_kv_event {
    uint8_t kind;          /* pgd_kv_event_kind */
    uint32_t ns;           /* STORED: the registering sequence's namespace */
    uint64_t hash, parent; /* parent: STORED, 0 for a sequence's first block */
    size_t tok;            /* STORED: its block_size tokens at log.tokens + tok */
} pgd_kv_event;

typedef struct pgd_kv_event_log {
    pgd_kv_event *ev;  /* (cap) */
    int32_t *tokens;   /* (cap_tok) */
    size_t n, cap, n_tok, cap_tok;
    int64_t lost;      /* events that did not fit (the owner did not take them out in time) */
} pgd_kv_event_log;

/* Registered blocks the disk tier has not written yet (pgd_kv_spill_enable): block ids with
 * their generation at registration, oldest first; an entry whose block was evicted or dropped
 * since is skipped when taken. */
typedef struct pgd_kv_spill_ring {
    int32_t *block;  /* (cap) */
    uint32_t *gen;   /* (cap) */
    size_t head, n, cap;
    int64_t lost;    /* registrations that found the ring full (never written) */
} pgd_kv_spill_ring;

typedef struct pgd_kv_mgr {
    int32_t n_blocks, block_size;
    bool prefix_caching;
    pgd_kv_block *blocks;   /* (n_blocks) */
    int32_t *tokens;        /* (n_blocks, block_size) tokens of registered blocks */
    int32_t free_head, free_tail, n_free;
    int32_t n_cached;       /* free blocks that still hold a registered hash */
    uint64_t *map_keys;     /* (map_cap) open-addressing table hash -> block; 0 = empty */
    int32_t *map_vals;      /* (map_cap) */
    size_t map_cap;
    pgd_kv_stats stats;
    pgd_kv_event_log log; /* cap 0: events off */
    pgd_kv_spill_ring spill; /* cap 0: no disk tier */
} pgd_kv_mgr;

int pgd_kv_mgr_init(pgd_kv_mgr *m, int32_t n_blocks, int32_t block_size, bool prefix_caching,
                    pgd_err *err);
void pgd_kv_mgr_free(pgd_kv_mgr *m);

/* A sequence's table, with room for max_blocks blocks. */
int pgd_kv_seq_init(pgd_kv_seq *s, int32_t max_blocks);
void pgd_kv_seq_free(pgd_kv_seq *s);

/* Blocks a sequence needs so that its table covers n_tokens slots. */
int32_t pgd_kv_blocks_needed(const pgd_kv_mgr *m, const pgd_kv_seq *s, int32_t n_tokens);
/* Free blocks (including cached ones, which are evicted on demand). */
static inline int32_t pgd_kv_n_free(const pgd_kv_mgr *m) { return m->n_free; }

/* For a sequence with no blocks: takes the longest run of cached full blocks matching
 * tokens[0..n) -- never the block holding the last token, whose logits must be computed -- and
 * returns the number of tokens they cover (a multiple of block_size). Counts the query. */
int32_t pgd_kv_match_prefix(pgd_kv_mgr *m, pgd_kv_seq *s, const int32_t *tokens, int32_t n);

/* Grows the table to cover n_tokens slots. Slots from first_write on will be written, so a
 * shared block there is replaced by a private copy (copy-on-write), recorded in *copy (copy->n
 * is 0 when nothing must be copied). PGD_ENOMEM if there are not enough free blocks (nothing
 * changes then); check with pgd_kv_blocks_needed first. */
int pgd_kv_reserve(pgd_kv_mgr *m, pgd_kv_seq *s, int32_t first_write, int32_t n_tokens,
                   pgd_kv_copy *copy);

/* Registers the sequence's newly filled full blocks (tokens[0..n_computed) have their KV in
 * the cache) in the prefix cache. */
void pgd_kv_commit(pgd_kv_mgr *m, pgd_kv_seq *s, const int32_t *tokens, int32_t n_computed);

/* dst shares every block of src (reference counts go up); dst must be empty. */
void pgd_kv_fork(pgd_kv_mgr *m, const pgd_kv_seq *src, pgd_kv_seq *dst);

/* Releases every block of the sequence (last block first, so a prefix outlives its suffix in the
 * cache). */
void pgd_kv_release(pgd_kv_mgr *m, pgd_kv_seq *s);

/* Shrinks the table to the blocks that cover the first n_tokens slots, releasing the rest
 * (speculative decoding's rollback of rejected tokens). The sequence's registered blocks must
 * all lie within n_tokens: only unregistered tail blocks are ever freed here. */
void pgd_kv_truncate(pgd_kv_mgr *m, pgd_kv_seq *s, int32_t n_tokens);

/* Drops the prefix cache's unreferenced blocks (SGLang's /flush_cache): every free block that
 * still holds a registered hash forgets it; blocks in use keep theirs. Returns how many. */
int32_t pgd_kv_drop_cached(pgd_kv_mgr *m);

/* Turns event recording on: room for every event one step can make (each block registered
 * once and unregistered once), allocated now so that recording never allocates. */
int pgd_kv_events_enable(pgd_kv_mgr *m, pgd_err *err);
/* Empties the log (after its events went out). */
static inline void pgd_kv_events_clear(pgd_kv_mgr *m) { m->log.n = m->log.n_tok = 0; }

/* Turns the spill ring on (the disk tier): room for two registrations per block, allocated
 * now so that registering never allocates. Only the base model's blocks (namespace 0) are
 * recorded: an adapter's namespace is a per-load number, meaningless after a restart. */
int pgd_kv_spill_enable(pgd_kv_mgr *m, pgd_err *err);
/* The oldest registered block not yet taken that is still registered as it was: true and its
 * id, or false when none is left. */
bool pgd_kv_spill_next(pgd_kv_mgr *m, int32_t *block);
/* A block's chain hash: hash(parent_hash, tokens[0..block_size)); the first block of the base
 * model's sequences has parent_hash 0. */
uint64_t pgd_kv_hash(const pgd_kv_mgr *m, uint64_t parent_hash, const int32_t *tokens);
/* An extra reference to block b, which some sequence holds (a load in flight keeps its target
 * blocks so, whatever happens to the sequence), and its release. */
void pgd_kv_block_ref(pgd_kv_mgr *m, int32_t b);
void pgd_kv_block_unref(pgd_kv_mgr *m, int32_t b);

/* Consistency check for tests: free list, counts and map agree. Returns 0 or a negative code. */
int pgd_kv_check(const pgd_kv_mgr *m);

#endif
