/* The prefix cache's disk tier (--kv-cache-dir, --kv-cache-disk-size): registered blocks'
 * bytes written behind to one file per block, an in-memory index of them (rebuilt at open by
 * scanning the directory, so the cache survives a restart), least-recently-used eviction under
 * a byte bound, and an asynchronous loader that reads a run of blocks back into the KV storage.
 *
 * Like kv.h it sees no tensors: a block is opaque payload bytes (every rank's, every layer's K
 * and V, whatever their types) plus its tokens, its chain hash and its parent's hash. One store
 * holds one namespace (`digest`: the model file, KV types, block size... the engine's
 * kv_disk_digest); a file of another digest, a truncated one or a leftover temporary file is
 * counted as corrupt and deleted at open, and a checksum failure or a token mismatch on load is
 * counted and deleted then: a damaged file is never used.
 *
 * Threads: one disk thread does all the I/O (writes, loads, evictions); the engine thread
 * queries the index and hands over work under a mutex that the disk thread holds only for
 * in-memory bookkeeping, never over I/O, so the engine thread never waits on the disk. */
#ifndef PGD_KV_DISK_H
#define PGD_KV_DISK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/status.h"

typedef struct pgd_kv_disk pgd_kv_disk;

typedef struct pgd_kv_disk_stats {
    int64_t hits;          /* blocks loaded back and used */
    int64_t misses;        /* lookups past the RAM cache that found no block on disk */
    int64_t bytes_read, bytes_written;
    int64_t evictions;     /* entries deleted to stay under the size bound */
    int64_t corrupt;       /* entries found damaged or foreign (open, load) and deleted */
    int64_t write_errors;  /* writes that failed (full or read-only disk...): recomputed later */
    int64_t writes_dropped; /* blocks never written: no staging slot free in time */
    int64_t entries, bytes; /* on disk now */
} pgd_kv_disk_stats;

/* Called by the disk thread when a load finished or a staging slot came free. */
typedef void (*pgd_kv_disk_wake_fn)(void *arg);
/* Called by the disk thread to put a verified block's payload into KV block `block` (which
 * the load's caller holds, so nothing else touches it). */
typedef void (*pgd_kv_disk_put_fn)(void *arg, int32_t block, const void *payload);

typedef struct pgd_kv_disk_config {
    const char *dir;       /* created if missing (one level) */
    size_t cap_bytes;      /* the most bytes of entry files kept */
    uint64_t digest;       /* the namespace this store's entries are valid in */
    int32_t block_size;    /* tokens per block */
    size_t payload_bytes;  /* bytes of one block's KV */
    int32_t n_slots;       /* write-behind staging slots (payload_bytes each) */
    int32_t max_load;      /* the most blocks one load reads */
    pgd_kv_disk_wake_fn wake;
    pgd_kv_disk_put_fn put;
    void *arg;             /* for wake and put */
} pgd_kv_disk_config;

/* Opens the store (c is copied, c->dir too): creates the directory, indexes its valid entries
 * (deleting damaged ones), allocates every buffer, starts the disk thread. */
int pgd_kv_disk_open(const pgd_kv_disk_config *c, pgd_kv_disk **out, pgd_err *err);
/* Writes what is queued, stops the thread, frees everything. NULL: no-op. */
void pgd_kv_disk_close(pgd_kv_disk *d);

/* Whether the block with this chain hash is on disk (marks it recently used). */
bool pgd_kv_disk_has(pgd_kv_disk *d, uint64_t hash);
/* Counts a lookup that found nothing on disk. */
void pgd_kv_disk_count_miss(pgd_kv_disk *d);

/* Write-behind, engine side: a free staging slot's payload buffer (*slot its number), or NULL
 * when none is free; then pgd_kv_disk_write queues the slot, filled, with the block's identity
 * (tokens: block_size, copied). */
void *pgd_kv_disk_slot(pgd_kv_disk *d, int32_t *slot);
void pgd_kv_disk_write(pgd_kv_disk *d, int32_t slot, uint64_t hash, uint64_t parent,
                       const int32_t *tokens);
/* Gives back a slot taken and not written. */
void pgd_kv_disk_unslot(pgd_kv_disk *d, int32_t slot);
/* Blocks until a staging slot is free (shutdown's flush only). */
void pgd_kv_disk_wait_slot(pgd_kv_disk *d);
/* Counts a block that was never written (no slot free before it was evicted). */
void pgd_kv_disk_count_dropped(pgd_kv_disk *d);

/* Starts reading n blocks (n <= max_load) into KV blocks blocks[0..n): block i must have chain
 * hash hashes[i], parent hash hashes[i - 1] (parent0 for i = 0) and the tokens
 * tokens[i * block_size..]; everything is copied. The first failure ends the run. tag names the
 * load in pgd_kv_disk_load_done. PGD_EAGAIN while another load is in flight. */
int pgd_kv_disk_load(pgd_kv_disk *d, uint64_t tag, int32_t n, const int32_t *blocks,
                     const uint64_t *hashes, uint64_t parent0, const int32_t *tokens);
/* Whether the load has finished: then true, with its tag and the count of leading blocks that
 * were read and verified (*n_ok); the next load may start. */
bool pgd_kv_disk_load_done(pgd_kv_disk *d, uint64_t *tag, int32_t *n_ok);
/* Whether a load was started and not yet taken by pgd_kv_disk_load_done. */
bool pgd_kv_disk_loading(pgd_kv_disk *d);

void pgd_kv_disk_get_stats(pgd_kv_disk *d, pgd_kv_disk_stats *s);

/* The checksum of entry files: 64 bits over n bytes, four 64-bit lanes (for tests). */
uint64_t pgd_kv_disk_checksum(const void *p, size_t n, uint64_t seed);
/* An entry file's size for this configuration. */
size_t pgd_kv_disk_entry_bytes(int32_t block_size, size_t payload_bytes);

#endif
