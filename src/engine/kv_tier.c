/* The engine's side of the prefix cache's disk tier (kv/kv_disk.h): the store's namespace
 * digest, the lookup past the RAM cache at admission (the scheduler's disk_lookup hook), the
 * load's completion, write-behind staging and the shutdown flush. Engine thread, but for the
 * two callbacks the disk thread makes (wake, put). */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend/cpu/quant.h"
#include "engine/engine_impl.h"
#include "kv/kv_disk.h"

#define DIGEST_SPAN (1u << 20) /* a model file's first and last MiB go into the digest */

/* A file's identity: its size and the checksum of its first and last MiB (a GGUF's header and
 * metadata, and the tail of its tensors); 0 when it cannot be read. */
static uint64_t file_digest(const char *path, uint8_t *buf) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat sb;
    if (fd < 0) return 0;
    uint64_t h = 0;
    if (fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode)) {
        uint64_t size = (uint64_t)sb.st_size;
        h = pgd_kv_disk_checksum(&size, sizeof size, 0x6b76646973ull);
        ssize_t n = pread(fd, buf, DIGEST_SPAN, 0);
        if (n > 0) h = pgd_kv_disk_checksum(buf, (size_t)n, h);
        off_t tail = sb.st_size > (off_t)DIGEST_SPAN ? sb.st_size - (off_t)DIGEST_SPAN : 0;
        n = pread(fd, buf, DIGEST_SPAN, tail);
        if (n > 0) h = pgd_kv_disk_checksum(buf, (size_t)n, h);
    }
    close(fd);
    return h;
}

/* The model's identity: a file's digest, or for a Hugging Face directory the sum of its
 * regular files' (name and digest; readdir's order does not matter). */
static int model_digest(const char *path, uint64_t *out, pgd_err *err) {
    uint8_t *buf = malloc(DIGEST_SPAN);
    if (!buf) return pgd_err_set(err, PGD_ENOMEM, "out of memory");
    struct stat sb;
    uint64_t h = 0;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        DIR *dh = opendir(path);
        struct dirent *de;
        char p[4096];
        while (dh && (de = readdir(dh))) {
            if (de->d_name[0] == '.') continue;
            snprintf(p, sizeof p, "%s/%s", path, de->d_name);
            uint64_t f = file_digest(p, buf);
            if (f) h += pgd_kv_disk_checksum(de->d_name, strlen(de->d_name), f);
        }
        if (dh) closedir(dh);
    } else {
        h = file_digest(path, buf);
    }
    free(buf);
    if (!h) return pgd_err_set(err, PGD_EIO, "--kv-cache-dir: cannot read the model %.200s to "
                               "key the disk cache", path);
    *out = h;
    return PGD_OK;
}

/* The disk thread's callbacks: a load finished or a slot came free; a verified block's
 * payload into the KV storage (its block is held by the load: nothing else touches it). */
static void disk_wake(void *arg) {
    pgd_engine *e = arg;
    pthread_mutex_lock(&e->in_mu);
    e->disk_wake = true;
    pthread_cond_signal(&e->in_cv);
    pthread_mutex_unlock(&e->in_mu);
}

static void disk_put(void *arg, int32_t block, const void *payload) {
    pgd_engine *e = arg;
    pgd_kv_cache_block_write(&e->kv, block, payload);
}

int pgd__disk_open(pgd_engine *e, pgd_err *err) {
    const pgd_engine_config *c = &e->cfg;
    if (!c->kv_cache_dir) return PGD_OK;
    if (e->model->shards[0].be.ops->mem_info)
        return pgd_err_set(err, PGD_EUNSUPPORTED, "the disk KV cache (--kv-cache-dir) is for "
                           "the CPU backend");
    if (c->no_prefix_caching)
        return pgd_err_set(err, PGD_EINVAL, "the disk KV cache (--kv-cache-dir) needs the "
                           "prefix cache (drop --no-prefix-caching)");
    uint64_t mdig;
    int rc = model_digest(c->model_path, &mdig, err);
    if (rc) return rc;
    /* Everything that makes a block's bytes what they are besides its tokens: the model, the
     * KV types and layout, RoPE, and the switches that change the numbers. */
    const pgd_model_config *mc = &e->model->cfg;
    struct {
        uint64_t model;
        int32_t dtype, vtype, block_size, n_layer, n_kv_head, head_dim, kv_dim, n_ranks;
        int32_t rope_mode, n_ctx, weights_f32, int8_act, dummy, version;
        float rope_theta, rope_theta_local;
    } key;
    memset(&key, 0, sizeof key); /* (padding too) */
    key.model = mdig;
    key.dtype = e->kv.dtype;
    key.vtype = e->kv.vtype;
    key.block_size = c->block_size;
    key.n_layer = mc->n_layer;
    key.n_kv_head = mc->n_kv_head;
    key.head_dim = mc->head_dim;
    key.kv_dim = e->kv.kv_dim;
    key.n_ranks = e->kv.n_ranks;
    key.rope_mode = (int32_t)mc->rope_mode;
    key.n_ctx = mc->n_ctx;
    key.weights_f32 = c->weights_f32;
    key.int8_act = pgd_cpu_int8_act_mode();
    key.dummy = c->load_format_dummy;
    key.version = 1;
    key.rope_theta = mc->rope_theta;
    key.rope_theta_local = mc->rope_theta_local;
    uint64_t digest = pgd_kv_disk_checksum(&key, sizeof key, 0);
    size_t payload = pgd_kv_cache_block_bytes(&e->kv);
    /* staging: 64 MiB of blocks in flight to the disk (at least 8), within the disk's bound */
    size_t nslot = ((size_t)64 << 20) / payload;
    if (nslot < 8) nslot = 8;
    if (nslot > (size_t)e->mgr.n_blocks) nslot = (size_t)e->mgr.n_blocks;
    size_t mb = (size_t)e->max_blocks_per_seq;
    e->dl_blocks = malloc(mb * sizeof *e->dl_blocks);
    e->dl_hashes = malloc(mb * sizeof *e->dl_hashes);
    if (!e->dl_blocks || !e->dl_hashes)
        return pgd_err_set(err, PGD_ENOMEM, "disk KV cache: out of memory");
    if ((rc = pgd_kv_spill_enable(&e->mgr, err))) return rc;
    pgd_kv_disk_config dc = {.dir = c->kv_cache_dir, .cap_bytes = c->kv_cache_disk_bytes,
                             .digest = digest, .block_size = c->block_size,
                             .payload_bytes = payload, .n_slots = (int32_t)nslot,
                             .max_load = e->max_blocks_per_seq, .wake = disk_wake,
                             .put = disk_put, .arg = e};
    return pgd_kv_disk_open(&dc, &e->disk, err);
}

bool pgd__disk_lookup(void *ctx, seq *s) {
    pgd_engine *e = ctx;
    pgd_kv_mgr *m = &e->mgr;
    if (!e->disk || s->kv.ns != 0) return false; /* (an adapter's KV is never spilled) */
    int32_t bs = m->block_size, n_ram = s->kv.n_blocks;
    /* as pgd_kv_match_prefix: never the block holding the last token */
    int32_t n_full = (s->n_tokens - 1) / bs;
    if (n_full > s->kv.max_blocks) n_full = s->kv.max_blocks;
    if (n_ram >= n_full || pgd_kv_disk_loading(e->disk)) return false;
    uint64_t parent = s->kv.chain_hash, h = parent;
    int32_t d = 0, room = pgd_kv_n_free(m);
    while (n_ram + d < n_full && d < room) {
        h = pgd_kv_hash(m, h, s->tokens + (size_t)(n_ram + d) * bs);
        if (!pgd_kv_disk_has(e->disk, h)) break;
        e->dl_hashes[d++] = h;
    }
    if (d == 0) {
        /* (once per admission: a head that waits for room does not look again each step) */
        if (room > 0) {
            pgd_kv_disk_count_miss(e->disk);
            s->disk_done = true;
        }
        return false;
    }
    pgd_kv_copy cp;
    /* (writing from the hit's end touches no shared block: no copy) */
    if (pgd_kv_reserve(m, &s->kv, s->n_computed, (n_ram + d) * bs, &cp)) return false;
    PGD_ASSERT(cp.n == 0);
    for (int32_t i = 0; i < d; i++) {
        e->dl_blocks[i] = s->kv.table[n_ram + i];
        pgd_kv_block_ref(m, e->dl_blocks[i]);
    }
    if (pgd_kv_disk_load(e->disk, s->id, d, e->dl_blocks, e->dl_hashes, parent,
                         s->tokens + (size_t)n_ram * bs)) {
        for (int32_t i = d - 1; i >= 0; i--) pgd_kv_block_unref(m, e->dl_blocks[i]);
        pgd_kv_truncate(m, &s->kv, n_ram * bs);
        return false;
    }
    e->dl_n = d;
    e->dl_first = n_ram;
    s->loading = true;
    return true;
}

/* A finished load: the sequence (if still there) registers the blocks that were read and
 * verified, then lets go of all of them, so that its admission finds them in the RAM cache
 * like any prefix hit (and the KV events report them stored, as vLLM's loaded blocks). */
static void load_finished(pgd_engine *e, uint64_t id, int32_t n_ok) {
    pgd_kv_mgr *m = &e->mgr;
    seq *s = pgd_sched_find(&e->sched, id);
    if (s && s->loading) {
        int32_t keep = (e->dl_first + n_ok) * m->block_size;
        pgd_kv_truncate(m, &s->kv, keep);
        pgd_kv_commit(m, &s->kv, s->tokens, keep);
        pgd_kv_release(m, &s->kv);
        s->n_computed = 0;
        s->loading = false;
        s->disk_done = true;
    }
    /* the load's own references, last block first (a prefix outlives its suffix) */
    for (int32_t i = e->dl_n - 1; i >= 0; i--) pgd_kv_block_unref(m, e->dl_blocks[i]);
    e->dl_n = 0;
}

/* Stages registered blocks into free slots; false when blocks are left and no slot is. */
static bool stage_spills(pgd_engine *e) {
    pgd_kv_mgr *m = &e->mgr;
    int32_t slot = -1, b;
    void *buf = NULL;
    while (m->spill.n > 0) {
        if (!buf && !(buf = pgd_kv_disk_slot(e->disk, &slot))) return false;
        if (!pgd_kv_spill_next(m, &b)) break;
        const pgd_kv_block *k = &m->blocks[b];
        if (pgd_kv_disk_has(e->disk, k->hash)) continue; /* (read from there, or written) */
        pgd_kv_cache_block_read(&e->kv, b, buf);
        pgd_kv_disk_write(e->disk, slot, k->hash, k->parent_hash,
                          m->tokens + (size_t)b * m->block_size);
        buf = NULL;
    }
    if (buf) pgd_kv_disk_unslot(e->disk, slot);
    return true;
}

void pgd__disk_pump(pgd_engine *e) {
    if (!e->disk) return;
    pthread_mutex_lock(&e->in_mu);
    e->disk_wake = false;
    pthread_mutex_unlock(&e->in_mu);
    uint64_t id;
    int32_t n_ok;
    if (pgd_kv_disk_load_done(e->disk, &id, &n_ok)) load_finished(e, id, n_ok);
    stage_spills(e);
}

bool pgd__disk_stalled(const pgd_engine *e) {
    const seq *h = e->sched.waiting.head;
    return e->disk && e->sched.running.n == 0 && h && h->loading;
}

void pgd__disk_close(pgd_engine *e) {
    if (e->disk) {
        while (!stage_spills(e)) pgd_kv_disk_wait_slot(e->disk);
        pgd_kv_disk_close(e->disk); /* (the queue is written, a load in flight finished) */
        e->disk = NULL;
    }
    free(e->dl_blocks);
    free(e->dl_hashes);
    e->dl_blocks = NULL;
    e->dl_hashes = NULL;
}
