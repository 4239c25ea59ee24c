/* KV block pool: free list (doubly linked, LRU order), reference counts, the prefix-cache map
 * (open addressing with linear probing and backward-shift deletion) and copy-on-write. */
#include <stdlib.h>
#include <string.h>

#include "kv/kv.h"

/* ---- hash ---- */

static uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

static uint64_t block_hash(uint64_t parent, const int32_t *tokens, int32_t n) {
    uint64_t h = mix64(parent ^ 0x9e3779b97f4a7c15ull);
    for (int32_t i = 0; i < n; i++) h = mix64(h ^ ((uint64_t)(uint32_t)tokens[i] + 0x632be59bd9b4e019ull * (uint64_t)(i + 1)));
    return h ? h : 1; /* 0 means "no hash" */
}

/* The parent hash of a sequence's first block: its namespace's. */
static uint64_t root_hash(const pgd_kv_seq *s) {
    return s->ns ? mix64(0x6a09e667f3bcc909ull ^ s->ns) : 0;
}

/* ---- events ---- */

static void log_event(pgd_kv_mgr *m, uint8_t kind, uint64_t hash, uint64_t parent, uint32_t ns,
                      const int32_t *tokens) {
    pgd_kv_event_log *l = &m->log;
    if (!l->cap) return;
    size_t nt = tokens ? (size_t)m->block_size : 0;
    if (l->n == l->cap || l->n_tok + nt > l->cap_tok) {
        l->lost++;
        return;
    }
    l->ev[l->n++] = (pgd_kv_event){.kind = kind, .ns = ns, .hash = hash, .parent = parent,
                                   .tok = l->n_tok};
    if (nt) memcpy(l->tokens + l->n_tok, tokens, nt * sizeof *tokens);
    l->n_tok += nt;
}

/* ---- the disk tier's spill ring ---- */

static void spill_push(pgd_kv_mgr *m, int32_t b) {
    pgd_kv_spill_ring *r = &m->spill;
    if (!r->cap || m->blocks[b].ns != 0) return;
    if (r->n == r->cap) {
        r->lost++;
        return;
    }
    size_t i = (r->head + r->n++) % r->cap;
    r->block[i] = b;
    r->gen[i] = m->blocks[b].gen;
}

/* ---- map ---- */

static size_t map_slot(const pgd_kv_mgr *m, uint64_t h) { return (size_t)(h & (m->map_cap - 1)); }

static int32_t map_get(const pgd_kv_mgr *m, uint64_t h) {
    for (size_t i = map_slot(m, h);; i = (i + 1) & (m->map_cap - 1)) {
        if (m->map_keys[i] == 0) return -1;
        if (m->map_keys[i] == h) return m->map_vals[i];
    }
}

static void map_put(pgd_kv_mgr *m, uint64_t h, int32_t block) {
    size_t i = map_slot(m, h);
    while (m->map_keys[i] != 0 && m->map_keys[i] != h) i = (i + 1) & (m->map_cap - 1);
    m->map_keys[i] = h;
    m->map_vals[i] = block;
}

/* Removes h only if it maps to block (a newer block may have taken the hash over). */
static void map_del(pgd_kv_mgr *m, uint64_t h, int32_t block) {
    size_t mask = m->map_cap - 1, i = map_slot(m, h);
    while (m->map_keys[i] != h) {
        if (m->map_keys[i] == 0) return;
        i = (i + 1) & mask;
    }
    if (m->map_vals[i] != block) return;
    /* backward-shift deletion keeps probe chains intact without tombstones */
    size_t j = i;
    for (;;) {
        j = (j + 1) & mask;
        if (m->map_keys[j] == 0) break;
        size_t home = map_slot(m, m->map_keys[j]);
        /* can entry j move into the hole at i? only if its home is not in (i, j] cyclically */
        bool in_range = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (in_range) continue;
        m->map_keys[i] = m->map_keys[j];
        m->map_vals[i] = m->map_vals[j];
        i = j;
    }
    m->map_keys[i] = 0;
}

/* ---- free list ---- */

static void list_remove(pgd_kv_mgr *m, int32_t b) {
    pgd_kv_block *k = &m->blocks[b];
    if (k->prev >= 0) m->blocks[k->prev].next = k->next;
    else m->free_head = k->next;
    if (k->next >= 0) m->blocks[k->next].prev = k->prev;
    else m->free_tail = k->prev;
    k->prev = k->next = -1;
    m->n_free--;
    if (k->hash) m->n_cached--;
}

static void list_push_tail(pgd_kv_mgr *m, int32_t b) {
    pgd_kv_block *k = &m->blocks[b];
    k->prev = m->free_tail;
    k->next = -1;
    if (m->free_tail >= 0) m->blocks[m->free_tail].next = b;
    else m->free_head = b;
    m->free_tail = b;
    m->n_free++;
    if (k->hash) m->n_cached++;
}

/* Takes the least recently released free block, evicting its cached contents. */
static int32_t take_free(pgd_kv_mgr *m) {
    int32_t b = m->free_head;
    if (b < 0) return -1;
    list_remove(m, b);
    pgd_kv_block *k = &m->blocks[b];
    if (k->hash) {
        map_del(m, k->hash, b);
        log_event(m, PGD_KV_EV_REMOVED, k->hash, 0, 0, NULL);
        k->hash = 0;
    }
    k->ref = 1;
    k->gen++;
    k->parent = -1;
    return b;
}

static void unref(pgd_kv_mgr *m, int32_t b) {
    pgd_kv_block *k = &m->blocks[b];
    if (--k->ref == 0) list_push_tail(m, b);
}

/* ---- public ---- */

int pgd_kv_mgr_init(pgd_kv_mgr *m, int32_t n_blocks, int32_t block_size, bool prefix_caching,
                    pgd_err *err) {
    memset(m, 0, sizeof *m);
    if (n_blocks < 1 || block_size < 1)
        return pgd_err_set(err, PGD_EINVAL, "KV pool needs at least one block of one token");
    m->n_blocks = n_blocks;
    m->block_size = block_size;
    m->prefix_caching = prefix_caching;
    m->map_cap = 16;
    while (m->map_cap < (size_t)n_blocks * 2) m->map_cap *= 2;
    m->blocks = calloc((size_t)n_blocks, sizeof *m->blocks);
    m->tokens = malloc((size_t)n_blocks * (size_t)block_size * sizeof *m->tokens);
    m->map_keys = calloc(m->map_cap, sizeof *m->map_keys);
    m->map_vals = calloc(m->map_cap, sizeof *m->map_vals);
    if (!m->blocks || !m->tokens || !m->map_keys || !m->map_vals) {
        pgd_kv_mgr_free(m);
        return pgd_err_set(err, PGD_ENOMEM, "KV pool: out of memory for %d blocks", n_blocks);
    }
    m->free_head = m->free_tail = -1;
    for (int32_t b = 0; b < n_blocks; b++) {
        m->blocks[b].parent = -1;
        list_push_tail(m, b);
    }
    return PGD_OK;
}

void pgd_kv_mgr_free(pgd_kv_mgr *m) {
    free(m->blocks);
    free(m->tokens);
    free(m->map_keys);
    free(m->map_vals);
    free(m->log.ev);
    free(m->log.tokens);
    free(m->spill.block);
    free(m->spill.gen);
    memset(m, 0, sizeof *m);
}

int pgd_kv_seq_init(pgd_kv_seq *s, int32_t max_blocks) {
    memset(s, 0, sizeof *s);
    s->table = malloc((size_t)(max_blocks > 0 ? max_blocks : 1) * sizeof *s->table);
    if (!s->table) return PGD_ENOMEM;
    s->max_blocks = max_blocks;
    return PGD_OK;
}

void pgd_kv_seq_free(pgd_kv_seq *s) {
    free(s->table);
    memset(s, 0, sizeof *s);
}

int32_t pgd_kv_blocks_needed(const pgd_kv_mgr *m, const pgd_kv_seq *s, int32_t n_tokens) {
    int32_t want = (n_tokens + m->block_size - 1) / m->block_size;
    return want > s->n_blocks ? want - s->n_blocks : 0;
}

int32_t pgd_kv_match_prefix(pgd_kv_mgr *m, pgd_kv_seq *s, const int32_t *tokens, int32_t n) {
    PGD_ASSERT(s->n_blocks == 0);
    int32_t bs = m->block_size;
    m->stats.prefix_queries += n;
    if (!m->prefix_caching || n < 1) return 0;
    uint64_t parent_hash = root_hash(s);
    int32_t parent = -1;
    /* only blocks that end before the last token: its logits must be computed */
    int32_t n_full = (n - 1) / bs;
    if (n_full > s->max_blocks) n_full = s->max_blocks;
    for (int32_t i = 0; i < n_full; i++) {
        const int32_t *bt = tokens + (size_t)i * bs;
        uint64_t h = block_hash(parent_hash, bt, bs);
        int32_t b = map_get(m, h);
        if (b < 0) break;
        pgd_kv_block *k = &m->blocks[b];
        bool parent_ok = k->ns == s->ns &&
                         (parent < 0 ? k->parent == -1
                                     : k->parent == parent &&
                                           k->parent_gen == m->blocks[parent].gen);
        if (!parent_ok || memcmp(m->tokens + (size_t)b * bs, bt, (size_t)bs * sizeof *bt)) break;
        if (k->ref == 0) list_remove(m, b);
        k->ref++;
        s->table[s->n_blocks++] = b;
        parent_hash = h;
        parent = b;
    }
    s->n_hashed = s->n_blocks;
    s->chain_hash = parent_hash;
    int32_t hit = s->n_blocks * bs;
    m->stats.prefix_hits += hit;
    return hit;
}

int pgd_kv_reserve(pgd_kv_mgr *m, pgd_kv_seq *s, int32_t first_write, int32_t n_tokens,
                   pgd_kv_copy *copy) {
    int32_t bs = m->block_size;
    copy->n = 0;
    int32_t want = (n_tokens + bs - 1) / bs;
    if (want > s->max_blocks) return PGD_ERANGE;
    /* count what we need: new blocks plus private copies of shared blocks to be written */
    int32_t need = want > s->n_blocks ? want - s->n_blocks : 0;
    for (int32_t i = first_write / bs; i < s->n_blocks && i < want; i++)
        if (m->blocks[s->table[i]].ref > 1) need++;
    if (need > m->n_free) return PGD_ENOMEM;
    for (int32_t i = first_write / bs; i < s->n_blocks && i < want; i++) {
        int32_t old = s->table[i];
        if (m->blocks[old].ref <= 1) continue;
        int32_t nb = take_free(m);
        int32_t n_keep = first_write - i * bs;
        if (n_keep > 0) *copy = (pgd_kv_copy){old, nb, n_keep > bs ? bs : n_keep};
        m->blocks[old].ref--; /* still > 0: shared */
        s->table[i] = nb;
    }
    while (s->n_blocks < want) s->table[s->n_blocks++] = take_free(m);
    return PGD_OK;
}

void pgd_kv_commit(pgd_kv_mgr *m, pgd_kv_seq *s, const int32_t *tokens, int32_t n_computed) {
    int32_t bs = m->block_size;
    int32_t full = n_computed / bs;
    if (full > s->n_blocks) full = s->n_blocks;
    if (!m->prefix_caching) return;
    uint64_t parent_hash = s->n_hashed ? s->chain_hash : root_hash(s);
    for (int32_t i = s->n_hashed; i < full; i++) {
        int32_t b = s->table[i];
        pgd_kv_block *k = &m->blocks[b];
        const int32_t *bt = tokens + (size_t)i * bs;
        uint64_t h = block_hash(parent_hash, bt, bs);
        /* A shared block (ref > 1) was registered by whoever filled it; a block only this
         * sequence holds gets registered now. */
        if (!k->hash && map_get(m, h) < 0) { /* one block per hash: a twin stays private */
            k->hash = h;
            k->parent = i > 0 ? s->table[i - 1] : -1;
            k->parent_gen = i > 0 ? m->blocks[s->table[i - 1]].gen : 0;
            k->ns = s->ns;
            k->parent_hash = i > 0 ? parent_hash : 0;
            memcpy(m->tokens + (size_t)b * bs, bt, (size_t)bs * sizeof *bt);
            map_put(m, h, b);
            log_event(m, PGD_KV_EV_STORED, h, k->parent_hash, s->ns, bt);
            spill_push(m, b);
        }
        parent_hash = h;
    }
    s->n_hashed = full;
    s->chain_hash = parent_hash;
}

void pgd_kv_fork(pgd_kv_mgr *m, const pgd_kv_seq *src, pgd_kv_seq *dst) {
    PGD_ASSERT(dst->n_blocks == 0 && dst->max_blocks >= src->n_blocks);
    for (int32_t i = 0; i < src->n_blocks; i++) {
        dst->table[i] = src->table[i];
        m->blocks[src->table[i]].ref++;
    }
    dst->n_blocks = src->n_blocks;
    dst->n_hashed = src->n_hashed;
    dst->chain_hash = src->chain_hash;
    dst->ns = src->ns;
}

void pgd_kv_release(pgd_kv_mgr *m, pgd_kv_seq *s) {
    for (int32_t i = s->n_blocks - 1; i >= 0; i--) unref(m, s->table[i]);
    s->n_blocks = 0;
    s->n_hashed = 0;
    s->chain_hash = 0;
}

void pgd_kv_truncate(pgd_kv_mgr *m, pgd_kv_seq *s, int32_t n_tokens) {
    int32_t keep = n_tokens <= 0 ? 0 : (n_tokens + m->block_size - 1) / m->block_size;
    PGD_ASSERT(s->n_hashed * m->block_size <= (n_tokens > 0 ? n_tokens : 0));
    for (int32_t i = s->n_blocks - 1; i >= keep; i--) unref(m, s->table[i]);
    if (keep < s->n_blocks) s->n_blocks = keep;
}

int32_t pgd_kv_drop_cached(pgd_kv_mgr *m) {
    int32_t n = 0;
    for (int32_t b = m->free_head; b >= 0; b = m->blocks[b].next) {
        pgd_kv_block *k = &m->blocks[b];
        if (!k->hash) continue;
        map_del(m, k->hash, b);
        log_event(m, PGD_KV_EV_REMOVED, k->hash, 0, 0, NULL);
        k->hash = 0;
        k->gen++; /* (a child registered under it can no longer resolve to it) */
        m->n_cached--;
        n++;
    }
    return n;
}

int pgd_kv_events_enable(pgd_kv_mgr *m, pgd_err *err) {
    pgd_kv_event_log *l = &m->log;
    if (l->cap) return PGD_OK;
    size_t cap = 2 * (size_t)m->n_blocks + 16, cap_tok = (size_t)m->n_blocks * m->block_size;
    l->ev = malloc(cap * sizeof *l->ev);
    l->tokens = malloc(cap_tok * sizeof *l->tokens);
    if (!l->ev || !l->tokens) {
        free(l->ev);
        free(l->tokens);
        l->ev = NULL;
        l->tokens = NULL;
        return pgd_err_set(err, PGD_ENOMEM, "out of memory for the KV event log");
    }
    l->cap = cap;
    l->cap_tok = cap_tok;
    return PGD_OK;
}

int pgd_kv_spill_enable(pgd_kv_mgr *m, pgd_err *err) {
    pgd_kv_spill_ring *r = &m->spill;
    if (r->cap) return PGD_OK;
    size_t cap = 2 * (size_t)m->n_blocks + 16;
    r->block = malloc(cap * sizeof *r->block);
    r->gen = malloc(cap * sizeof *r->gen);
    if (!r->block || !r->gen) {
        free(r->block);
        free(r->gen);
        r->block = NULL;
        r->gen = NULL;
        return pgd_err_set(err, PGD_ENOMEM, "out of memory for the disk tier's spill ring");
    }
    r->cap = cap;
    return PGD_OK;
}

bool pgd_kv_spill_next(pgd_kv_mgr *m, int32_t *block) {
    pgd_kv_spill_ring *r = &m->spill;
    while (r->n > 0) {
        int32_t b = r->block[r->head];
        uint32_t g = r->gen[r->head];
        r->head = (r->head + 1) % r->cap;
        r->n--;
        if (m->blocks[b].gen == g && m->blocks[b].hash) {
            *block = b;
            return true;
        }
        r->lost++; /* evicted or dropped before the writer got to it */
    }
    return false;
}

uint64_t pgd_kv_hash(const pgd_kv_mgr *m, uint64_t parent_hash, const int32_t *tokens) {
    return block_hash(parent_hash, tokens, m->block_size);
}

void pgd_kv_block_ref(pgd_kv_mgr *m, int32_t b) {
    PGD_ASSERT(m->blocks[b].ref > 0);
    m->blocks[b].ref++;
}

void pgd_kv_block_unref(pgd_kv_mgr *m, int32_t b) { unref(m, b); }

int pgd_kv_check(const pgd_kv_mgr *m) {
    int32_t n_free = 0, n_cached = 0, prev = -1;
    for (int32_t b = m->free_head; b >= 0; b = m->blocks[b].next) {
        if (m->blocks[b].ref != 0 || m->blocks[b].prev != prev) return PGD_EFORMAT;
        if (m->blocks[b].hash) n_cached++;
        prev = b;
        if (++n_free > m->n_blocks) return PGD_EFORMAT;
    }
    if (prev != m->free_tail || n_free != m->n_free || n_cached != m->n_cached) return PGD_EFORMAT;
    int32_t n_ref0 = 0;
    for (int32_t b = 0; b < m->n_blocks; b++) {
        if (m->blocks[b].ref < 0) return PGD_EFORMAT;
        if (m->blocks[b].ref == 0) n_ref0++;
        if (m->blocks[b].hash && m->prefix_caching) {
            int32_t mb = map_get(m, m->blocks[b].hash);
            if (mb != b) return PGD_EFORMAT; /* one block per hash, always findable */
        }
    }
    if (n_ref0 != n_free) return PGD_EFORMAT;
    return PGD_OK;
}
