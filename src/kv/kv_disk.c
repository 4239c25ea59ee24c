/* The prefix cache's disk tier (kv_disk.h): entry files, their index (an open-addressing map
 * over an LRU list), the staging slots of write-behind and the disk thread.
 *
 * An entry file, DIR/<hash as 16 hex digits>.kvb, is the 64-byte header below, the block's
 * tokens (int32) and its payload, in the host's byte order; the checksum covers all of it
 * (with its own field zero). It is written as DIR/.tmp-<hash>-<pid>.kvb and renamed, so a
 * kill -9 mid-write leaves a temporary file (deleted at the next open) and never a short entry;
 * a power loss that tears the renamed file is caught by the checksum on load. No fsync: losing
 * the newest entries to a crash costs a recompute, never a wrong answer. */
#include "kv/kv_disk.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define KVD_MAGIC "PGDKVBK1"
#define KVD_VERSION 1u
#define KVD_HDR 64

typedef struct kvd_hdr {
    char magic[8];
    uint32_t version, block_size;
    uint64_t digest, hash, parent, payload_bytes;
    uint64_t checksum; /* over the whole file with this field zero */
    uint64_t reserved;
} kvd_hdr;
_Static_assert(sizeof(kvd_hdr) == KVD_HDR, "entry header is 64 bytes");

typedef struct kvd_entry {
    uint64_t hash;
    int32_t prev, next; /* LRU list (head: least recently used), or the free stack (next) */
} kvd_entry;

struct pgd_kv_disk {
    pgd_kv_disk_config c;
    char *dir;
    size_t entry_bytes, tok_off, pay_off; /* a file's size; tokens' and payload's offsets */
    pthread_mutex_t mu;
    pthread_cond_t cv;      /* the disk thread waits for work */
    pthread_cond_t slot_cv; /* pgd_kv_disk_wait_slot waits for a free slot */
    pthread_t thread;
    bool thread_on, stop;
    /* index: entries (cap_entries), the LRU list of used ones, the free stack, the map */
    kvd_entry *ent;
    int32_t cap_entries, n_ent, lru_head, lru_tail, free_top;
    uint64_t *map_keys; /* (map_cap) hash -> entry; 0 = empty */
    int32_t *map_vals;  /* (map_cap) */
    size_t map_cap;
    /* write-behind: n_slots buffers laid out as the file; free stack and queue of filled ones */
    uint8_t *slots;     /* (n_slots, entry_bytes) */
    int32_t *slot_free, n_slot_free;
    int32_t *wq, wq_head, wq_n; /* (n_slots) ring */
    /* the one load: 0 idle, 1 queued, 2 done (waiting for pgd_kv_disk_load_done) */
    int load_state;
    uint64_t load_tag, load_parent0;
    int32_t load_n, load_ok;
    int32_t *load_blocks;   /* (max_load) */
    uint64_t *load_hashes;  /* (max_load) */
    int32_t *load_tokens;   /* (max_load, block_size) */
    uint8_t *rbuf;          /* (entry_bytes + 1) the loader's read buffer */
    pgd_kv_disk_stats st;
};

/* ---- checksum ---- */

static inline uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static inline uint64_t load64(const uint8_t *p) {
    uint64_t x;
    memcpy(&x, p, 8);
    return x;
}

#define CK_P1 0x9e3779b185ebca87ull
#define CK_P2 0xc2b2ae3d27d4eb4full
#define CK_P3 0x165667b19e3779f9ull

static inline uint64_t ck_round(uint64_t acc, uint64_t w) {
    return rotl64(acc + w * CK_P2, 31) * CK_P1;
}

/* Four independent multiply-rotate lanes over 32-byte stripes (memory speed on one core), the
 * lanes folded, then the tail words and bytes, then a final avalanche. */
uint64_t pgd_kv_disk_checksum(const void *p, size_t n, uint64_t seed) {
    const uint8_t *b = p;
    uint64_t v[4] = {seed + CK_P1 + CK_P2, seed + CK_P2, seed, seed - CK_P1};
    size_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int k = 0; k < 4; k++) v[k] = ck_round(v[k], load64(b + i + 8 * k));
    uint64_t h = rotl64(v[0], 1) + rotl64(v[1], 7) + rotl64(v[2], 12) + rotl64(v[3], 18);
    for (int k = 0; k < 4; k++) h = (h ^ ck_round(0, v[k])) * CK_P1 + CK_P3;
    h += (uint64_t)n;
    for (; i + 8 <= n; i += 8) h = rotl64(h ^ ck_round(0, load64(b + i)), 27) * CK_P1 + CK_P3;
    for (; i < n; i++) h = rotl64(h ^ (b[i] * CK_P3), 11) * CK_P1;
    h ^= h >> 33;
    h *= CK_P2;
    h ^= h >> 29;
    h *= CK_P3;
    h ^= h >> 32;
    return h;
}

size_t pgd_kv_disk_entry_bytes(int32_t block_size, size_t payload_bytes) {
    return KVD_HDR + (size_t)block_size * sizeof(int32_t) + payload_bytes;
}

/* The checksum of a whole entry image (its checksum field read as zero). */
static uint64_t entry_sum(const uint8_t *img, size_t n) {
    static const uint8_t zero[8] = {0};
    uint64_t h = pgd_kv_disk_checksum(img, offsetof(kvd_hdr, checksum), 0);
    h = pgd_kv_disk_checksum(zero, 8, h);
    size_t after = offsetof(kvd_hdr, checksum) + 8;
    return pgd_kv_disk_checksum(img + after, n - after, h);
}

/* ---- index (under mu) ---- */

static size_t map_slot(const pgd_kv_disk *d, uint64_t h) {
    return (size_t)((h ^ (h >> 29)) & (d->map_cap - 1));
}

static int32_t map_get(const pgd_kv_disk *d, uint64_t h) {
    for (size_t i = map_slot(d, h);; i = (i + 1) & (d->map_cap - 1)) {
        if (d->map_keys[i] == 0) return -1;
        if (d->map_keys[i] == h) return d->map_vals[i];
    }
}

static void map_put(pgd_kv_disk *d, uint64_t h, int32_t e) {
    size_t i = map_slot(d, h);
    while (d->map_keys[i] != 0 && d->map_keys[i] != h) i = (i + 1) & (d->map_cap - 1);
    d->map_keys[i] = h;
    d->map_vals[i] = e;
}

/* Backward-shift deletion, as kv/block.c's map. */
static void map_del(pgd_kv_disk *d, uint64_t h) {
    size_t mask = d->map_cap - 1, i = map_slot(d, h);
    while (d->map_keys[i] != h) {
        if (d->map_keys[i] == 0) return;
        i = (i + 1) & mask;
    }
    for (size_t j = i;;) {
        j = (j + 1) & mask;
        if (d->map_keys[j] == 0) break;
        size_t home = map_slot(d, d->map_keys[j]);
        bool in_range = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (in_range) continue;
        d->map_keys[i] = d->map_keys[j];
        d->map_vals[i] = d->map_vals[j];
        i = j;
    }
    d->map_keys[i] = 0;
}

static void lru_unlink(pgd_kv_disk *d, int32_t e) {
    kvd_entry *k = &d->ent[e];
    if (k->prev >= 0) d->ent[k->prev].next = k->next;
    else d->lru_head = k->next;
    if (k->next >= 0) d->ent[k->next].prev = k->prev;
    else d->lru_tail = k->prev;
    k->prev = k->next = -1;
}

static void lru_push(pgd_kv_disk *d, int32_t e) {
    kvd_entry *k = &d->ent[e];
    k->prev = d->lru_tail;
    k->next = -1;
    if (d->lru_tail >= 0) d->ent[d->lru_tail].next = e;
    else d->lru_head = e;
    d->lru_tail = e;
}

/* Indexes hash (the caller made room: n_ent < cap_entries). */
static void index_add(pgd_kv_disk *d, uint64_t hash) {
    int32_t e = d->free_top;
    PGD_ASSERT(e >= 0);
    d->free_top = d->ent[e].next;
    d->ent[e].hash = hash;
    lru_push(d, e);
    map_put(d, hash, e);
    d->n_ent++;
    d->st.entries = d->n_ent;
    d->st.bytes = (int64_t)d->n_ent * (int64_t)d->entry_bytes;
}

static void index_drop(pgd_kv_disk *d, int32_t e) {
    map_del(d, d->ent[e].hash);
    lru_unlink(d, e);
    d->ent[e].next = d->free_top;
    d->free_top = e;
    d->n_ent--;
    d->st.entries = d->n_ent;
    d->st.bytes = (int64_t)d->n_ent * (int64_t)d->entry_bytes;
}

/* ---- files (disk thread, no lock held) ---- */

/* DIR/<hash>.kvb, or the temporary DIR/.tmp-<hash>-<pid>.kvb (two servers of one model may
 * share a directory: their writes of a block never share a temporary file). */
static void entry_path(const pgd_kv_disk *d, char *buf, size_t n, uint64_t hash, bool tmp) {
    if (tmp)
        snprintf(buf, n, "%s/.tmp-%016llx-%ld.kvb", d->dir, (unsigned long long)hash,
                 (long)getpid());
    else
        snprintf(buf, n, "%s/%016llx.kvb", d->dir, (unsigned long long)hash);
}

static void remove_entry_file(const pgd_kv_disk *d, uint64_t hash) {
    char path[4096];
    entry_path(d, path, sizeof path, hash, false);
    unlink(path);
}

/* Whether the header describes an entry of this store, of the right size. */
static bool header_ok(const pgd_kv_disk *d, const kvd_hdr *h) {
    return !memcmp(h->magic, KVD_MAGIC, 8) && h->version == KVD_VERSION &&
           h->block_size == (uint32_t)d->c.block_size && h->digest == d->c.digest &&
           h->payload_bytes == (uint64_t)d->c.payload_bytes && h->hash != 0;
}

static bool write_all(int fd, const uint8_t *p, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        p += w;
        n -= (size_t)w;
    }
    return true;
}

/* Reads up to n bytes; the count read, or -1. */
static ssize_t read_all(int fd, uint8_t *p, size_t n) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, p + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -1;
        if (r == 0) break;
        got += (size_t)r;
    }
    return (ssize_t)got;
}

/* Writes one staged image to its temporary file: whether it is all there. */
static bool write_tmp(pgd_kv_disk *d, uint8_t *img, const char *tmp) {
    kvd_hdr h;
    memcpy(&h, img, sizeof h);
    h.checksum = 0;
    memcpy(img, &h, sizeof h);
    h.checksum = entry_sum(img, d->entry_bytes);
    memcpy(img, &h, sizeof h);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return false;
    bool ok = write_all(fd, img, d->entry_bytes);
    ok = close(fd) == 0 && ok;
    if (!ok) unlink(tmp);
    return ok;
}

/* ---- the disk thread ---- */

/* One staged block: written to its temporary file, room made (the least recently used entries
 * go, so the bound is exceeded by one file at most, while it is being written), renamed into
 * place, indexed. A failed write evicts nothing. */
static void do_write(pgd_kv_disk *d, int32_t slot) {
    uint8_t *img = d->slots + (size_t)slot * d->entry_bytes;
    kvd_hdr h;
    memcpy(&h, img, sizeof h);
    char tmp[4096], fin[4096];
    entry_path(d, tmp, sizeof tmp, h.hash, true);
    entry_path(d, fin, sizeof fin, h.hash, false);
    pthread_mutex_lock(&d->mu);
    int32_t e = map_get(d, h.hash);
    bool skip = e >= 0 || d->cap_entries == 0;
    if (e >= 0) { /* written before: it is recently used again */
        lru_unlink(d, e);
        lru_push(d, e);
    } else if (d->cap_entries == 0) {
        d->st.writes_dropped++;
    }
    pthread_mutex_unlock(&d->mu);
    bool ok = skip || write_tmp(d, img, tmp);
    pthread_mutex_lock(&d->mu);
    while (!skip && ok && d->n_ent >= d->cap_entries) {
        int32_t v = d->lru_head;
        uint64_t vh = d->ent[v].hash;
        index_drop(d, v);
        d->st.evictions++;
        pthread_mutex_unlock(&d->mu);
        remove_entry_file(d, vh);
        pthread_mutex_lock(&d->mu);
    }
    pthread_mutex_unlock(&d->mu);
    if (!skip && ok && rename(tmp, fin) != 0) {
        unlink(tmp);
        ok = false;
    }
    pthread_mutex_lock(&d->mu);
    if (!skip && ok) {
        index_add(d, h.hash);
        d->st.bytes_written += (int64_t)d->entry_bytes;
    } else if (!skip) {
        d->st.write_errors++;
    }
    d->slot_free[d->n_slot_free++] = slot;
    pthread_cond_broadcast(&d->slot_cv);
    pthread_mutex_unlock(&d->mu);
}

/* Drops entry hash from the index and the disk as corrupt. */
static void drop_corrupt(pgd_kv_disk *d, uint64_t hash) {
    pthread_mutex_lock(&d->mu);
    int32_t e = map_get(d, hash);
    if (e >= 0) index_drop(d, e);
    d->st.corrupt++;
    pthread_mutex_unlock(&d->mu);
    remove_entry_file(d, hash);
}

/* Reads, verifies and puts block i of the load: whether it is good. */
static bool load_one(pgd_kv_disk *d, int32_t i) {
    uint64_t hash = d->load_hashes[i];
    uint64_t parent = i ? d->load_hashes[i - 1] : d->load_parent0;
    const int32_t *want = d->load_tokens + (size_t)i * (size_t)d->c.block_size;
    char path[4096];
    entry_path(d, path, sizeof path, hash, false);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) { /* gone (deleted behind our back): forget it, recompute */
        pthread_mutex_lock(&d->mu);
        int32_t e = map_get(d, hash);
        if (e >= 0) index_drop(d, e);
        pthread_mutex_unlock(&d->mu);
        return false;
    }
    ssize_t got = read_all(fd, d->rbuf, d->entry_bytes + 1);
    close(fd);
    kvd_hdr h;
    if (got >= KVD_HDR) memcpy(&h, d->rbuf, sizeof h);
    if (got != (ssize_t)d->entry_bytes || !header_ok(d, &h) || h.hash != hash ||
        h.checksum != entry_sum(d->rbuf, d->entry_bytes)) {
        drop_corrupt(d, hash);
        return false;
    }
    /* a sound entry of another chain (a hash collision) is left alone, and not used */
    if (h.parent != parent ||
        memcmp(d->rbuf + d->tok_off, want, (size_t)d->c.block_size * sizeof *want))
        return false;
    d->c.put(d->c.arg, d->load_blocks[i], d->rbuf + d->pay_off);
    pthread_mutex_lock(&d->mu);
    int32_t e = map_get(d, hash);
    if (e >= 0) {
        lru_unlink(d, e);
        lru_push(d, e);
    }
    d->st.hits++;
    d->st.bytes_read += (int64_t)d->entry_bytes;
    pthread_mutex_unlock(&d->mu);
    return true;
}

static void *disk_main(void *arg) {
    pgd_kv_disk *d = arg;
    pthread_mutex_lock(&d->mu);
    for (;;) {
        while (!d->stop && d->load_state != 1 && d->wq_n == 0) pthread_cond_wait(&d->cv, &d->mu);
        if (d->load_state == 1) { /* a request waits on a load: it goes before writes */
            int32_t n = d->load_n;
            pthread_mutex_unlock(&d->mu);
            int32_t ok = 0;
            while (ok < n && load_one(d, ok)) ok++;
            pthread_mutex_lock(&d->mu);
            d->load_ok = ok;
            d->load_state = 2;
            pthread_mutex_unlock(&d->mu);
            d->c.wake(d->c.arg);
            pthread_mutex_lock(&d->mu);
            continue;
        }
        if (d->wq_n > 0) {
            int32_t slot = d->wq[d->wq_head];
            d->wq_head = (d->wq_head + 1) % d->c.n_slots;
            d->wq_n--;
            pthread_mutex_unlock(&d->mu);
            do_write(d, slot);
            d->c.wake(d->c.arg);
            pthread_mutex_lock(&d->mu);
            continue;
        }
        if (d->stop) break; /* (only once the queue is written) */
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

/* ---- open: the directory scan ---- */

static bool hex16(const char *s, uint64_t *out) {
    uint64_t x = 0;
    for (int i = 0; i < 16; i++) {
        char c = s[i];
        int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (v < 0) return false;
        x = x << 4 | (uint64_t)v;
    }
    *out = x;
    return true;
}

/* Indexes the directory's sound entries (header and size; the checksum is verified on load)
 * and deletes the rest of what looks like ours: temporary files, foreign or truncated
 * entries. Entries beyond the bound are evicted. */
static int scan_dir(pgd_kv_disk *d, pgd_err *err) {
    DIR *dh = opendir(d->dir);
    if (!dh) return pgd_err_set(err, PGD_EIO, "--kv-cache-dir %.200s: %s", d->dir, strerror(errno));
    struct dirent *de;
    char path[4096];
    while ((de = readdir(dh))) {
        const char *n = de->d_name;
        size_t len = strlen(n);
        if (len < 4 || strcmp(n + len - 4, ".kvb")) continue;
        snprintf(path, sizeof path, "%s/%s", d->dir, n);
        uint64_t hash;
        if (!strncmp(n, ".tmp-", 5)) { /* a write a kill interrupted */
            unlink(path);
            d->st.corrupt++;
            continue;
        }
        if (len != 20 || !hex16(n, &hash)) continue;
        kvd_hdr h;
        struct stat sb;
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        bool ok = fd >= 0 && fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) &&
                  (size_t)sb.st_size == d->entry_bytes && read_all(fd, (uint8_t *)&h, sizeof h) ==
                  (ssize_t)sizeof h && header_ok(d, &h) && h.hash == hash;
        if (fd >= 0) close(fd);
        if (!ok) {
            unlink(path);
            d->st.corrupt++;
            continue;
        }
        if (map_get(d, hash) >= 0) continue;
        if (d->n_ent >= d->cap_entries) { /* the bound shrank since */
            unlink(path);
            d->st.evictions++;
            continue;
        }
        index_add(d, hash);
    }
    closedir(dh);
    return PGD_OK;
}

int pgd_kv_disk_open(const pgd_kv_disk_config *c, pgd_kv_disk **out, pgd_err *err) {
    *out = NULL;
    if (!c->dir || !*c->dir || c->block_size < 1 || c->payload_bytes < 1 || c->n_slots < 1 ||
        c->max_load < 1 || !c->wake || !c->put)
        return pgd_err_set(err, PGD_EINVAL, "disk KV cache: bad configuration");
    if (mkdir(c->dir, 0755) != 0 && errno != EEXIST)
        return pgd_err_set(err, PGD_EIO, "--kv-cache-dir %.200s: %s", c->dir, strerror(errno));
    pgd_kv_disk *d = calloc(1, sizeof *d);
    if (!d) return pgd_err_set(err, PGD_ENOMEM, "disk KV cache: out of memory");
    d->c = *c;
    d->tok_off = KVD_HDR;
    d->pay_off = KVD_HDR + (size_t)c->block_size * sizeof(int32_t);
    d->entry_bytes = pgd_kv_disk_entry_bytes(c->block_size, c->payload_bytes);
    size_t ce = c->cap_bytes / d->entry_bytes;
    /* (the index costs about 40 bytes an entry: 16 million entries bound it to 640 MiB) */
    d->cap_entries = ce > ((size_t)1 << 24) ? (int32_t)1 << 24 : (int32_t)ce;
    d->map_cap = 16;
    while (d->map_cap < (size_t)d->cap_entries * 2) d->map_cap *= 2;
    d->lru_head = d->lru_tail = -1;
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->cv, NULL);
    pthread_cond_init(&d->slot_cv, NULL);
    size_t ns = (size_t)c->n_slots, ml = (size_t)c->max_load;
    d->dir = strdup(c->dir);
    d->ent = malloc((size_t)(d->cap_entries ? d->cap_entries : 1) * sizeof *d->ent);
    d->map_keys = calloc(d->map_cap, sizeof *d->map_keys);
    d->map_vals = calloc(d->map_cap, sizeof *d->map_vals);
    d->slots = malloc(ns * d->entry_bytes);
    d->slot_free = malloc(ns * sizeof *d->slot_free);
    d->wq = malloc(ns * sizeof *d->wq);
    d->load_blocks = malloc(ml * sizeof *d->load_blocks);
    d->load_hashes = malloc(ml * sizeof *d->load_hashes);
    d->load_tokens = malloc(ml * (size_t)c->block_size * sizeof *d->load_tokens);
    d->rbuf = malloc(d->entry_bytes + 1);
    int rc;
    if (!d->dir || !d->ent || !d->map_keys || !d->map_vals || !d->slots || !d->slot_free ||
        !d->wq || !d->load_blocks || !d->load_hashes || !d->load_tokens || !d->rbuf) {
        rc = pgd_err_set(err, PGD_ENOMEM, "disk KV cache: out of memory for the index of %d "
                         "entries and %d staging slots of %zu bytes", d->cap_entries, c->n_slots,
                         d->entry_bytes);
        goto fail;
    }
    d->free_top = -1;
    for (int32_t e = d->cap_entries - 1; e >= 0; e--) {
        d->ent[e].next = d->free_top;
        d->free_top = e;
    }
    for (int32_t s = 0; s < c->n_slots; s++) d->slot_free[d->n_slot_free++] = s;
    d->c.dir = d->dir;
    if ((rc = scan_dir(d, err))) goto fail;
    if (pthread_create(&d->thread, NULL, disk_main, d) != 0) {
        rc = pgd_err_set(err, PGD_ENOMEM, "disk KV cache: cannot start its thread");
        goto fail;
    }
    d->thread_on = true;
    *out = d;
    return PGD_OK;
fail:
    pgd_kv_disk_close(d);
    return rc;
}

void pgd_kv_disk_close(pgd_kv_disk *d) {
    if (!d) return;
    if (d->thread_on) {
        pthread_mutex_lock(&d->mu);
        d->stop = true;
        pthread_cond_signal(&d->cv);
        pthread_mutex_unlock(&d->mu);
        pthread_join(d->thread, NULL);
    }
    pthread_mutex_destroy(&d->mu);
    pthread_cond_destroy(&d->cv);
    pthread_cond_destroy(&d->slot_cv);
    free(d->dir);
    free(d->ent);
    free(d->map_keys);
    free(d->map_vals);
    free(d->slots);
    free(d->slot_free);
    free(d->wq);
    free(d->load_blocks);
    free(d->load_hashes);
    free(d->load_tokens);
    free(d->rbuf);
    free(d);
}

/* ---- the engine's side ---- */

bool pgd_kv_disk_has(pgd_kv_disk *d, uint64_t hash) {
    pthread_mutex_lock(&d->mu);
    bool has = hash != 0 && map_get(d, hash) >= 0;
    pthread_mutex_unlock(&d->mu);
    return has;
}

void pgd_kv_disk_count_miss(pgd_kv_disk *d) {
    pthread_mutex_lock(&d->mu);
    d->st.misses++;
    pthread_mutex_unlock(&d->mu);
}

void pgd_kv_disk_count_dropped(pgd_kv_disk *d) {
    pthread_mutex_lock(&d->mu);
    d->st.writes_dropped++;
    pthread_mutex_unlock(&d->mu);
}

void *pgd_kv_disk_slot(pgd_kv_disk *d, int32_t *slot) {
    pthread_mutex_lock(&d->mu);
    int32_t s = d->n_slot_free > 0 ? d->slot_free[--d->n_slot_free] : -1;
    pthread_mutex_unlock(&d->mu);
    *slot = s;
    return s < 0 ? NULL : d->slots + (size_t)s * d->entry_bytes + d->pay_off;
}

void pgd_kv_disk_unslot(pgd_kv_disk *d, int32_t slot) {
    pthread_mutex_lock(&d->mu);
    d->slot_free[d->n_slot_free++] = slot;
    pthread_mutex_unlock(&d->mu);
}

void pgd_kv_disk_write(pgd_kv_disk *d, int32_t slot, uint64_t hash, uint64_t parent,
                       const int32_t *tokens) {
    uint8_t *img = d->slots + (size_t)slot * d->entry_bytes;
    kvd_hdr h = {.version = KVD_VERSION, .block_size = (uint32_t)d->c.block_size,
                 .digest = d->c.digest, .hash = hash, .parent = parent,
                 .payload_bytes = d->c.payload_bytes};
    memcpy(h.magic, KVD_MAGIC, 8);
    memcpy(img, &h, sizeof h);
    memcpy(img + d->tok_off, tokens, (size_t)d->c.block_size * sizeof *tokens);
    pthread_mutex_lock(&d->mu);
    d->wq[(d->wq_head + d->wq_n) % d->c.n_slots] = slot;
    d->wq_n++;
    pthread_cond_signal(&d->cv);
    pthread_mutex_unlock(&d->mu);
}

void pgd_kv_disk_wait_slot(pgd_kv_disk *d) {
    pthread_mutex_lock(&d->mu);
    while (d->n_slot_free == 0) pthread_cond_wait(&d->slot_cv, &d->mu);
    pthread_mutex_unlock(&d->mu);
}

int pgd_kv_disk_load(pgd_kv_disk *d, uint64_t tag, int32_t n, const int32_t *blocks,
                     const uint64_t *hashes, uint64_t parent0, const int32_t *tokens) {
    if (n < 1 || n > d->c.max_load) return PGD_EINVAL;
    pthread_mutex_lock(&d->mu);
    if (d->load_state != 0) {
        pthread_mutex_unlock(&d->mu);
        return PGD_EAGAIN;
    }
    /* (the disk thread reads these only while load_state is 1, set below under mu) */
    memcpy(d->load_blocks, blocks, (size_t)n * sizeof *blocks);
    memcpy(d->load_hashes, hashes, (size_t)n * sizeof *hashes);
    memcpy(d->load_tokens, tokens, (size_t)n * (size_t)d->c.block_size * sizeof *tokens);
    d->load_parent0 = parent0;
    d->load_tag = tag;
    d->load_n = n;
    d->load_ok = 0;
    d->load_state = 1;
    pthread_cond_signal(&d->cv);
    pthread_mutex_unlock(&d->mu);
    return PGD_OK;
}

bool pgd_kv_disk_load_done(pgd_kv_disk *d, uint64_t *tag, int32_t *n_ok) {
    pthread_mutex_lock(&d->mu);
    bool done = d->load_state == 2;
    if (done) {
        *tag = d->load_tag;
        *n_ok = d->load_ok;
        d->load_state = 0;
    }
    pthread_mutex_unlock(&d->mu);
    return done;
}

bool pgd_kv_disk_loading(pgd_kv_disk *d) {
    pthread_mutex_lock(&d->mu);
    bool l = d->load_state != 0;
    pthread_mutex_unlock(&d->mu);
    return l;
}

void pgd_kv_disk_get_stats(pgd_kv_disk *d, pgd_kv_disk_stats *s) {
    pthread_mutex_lock(&d->mu);
    *s = d->st;
    pthread_mutex_unlock(&d->mu);
}
