/* KV block manager: prefix-cache hits and their limits, copy-on-write, LRU eviction, and a
 * seeded random workload of thousands of operations (allocations, forks, commits, releases)
 * after which every block is free or cached with a zero reference count. */
#include <stdlib.h>
#include <string.h>

#include "kv/kv.h"
#include "test.h"

static uint64_t rs = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(uint32_t n) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (uint32_t)(rs % n);
}

static void test_prefix_hits(void) {
    pgd_kv_mgr m;
    pgd_err err;
    CHECK_EQ_INT(pgd_kv_mgr_init(&m, 16, 4, true, &err), 0);
    int32_t toks[20];
    for (int i = 0; i < 20; i++) toks[i] = 100 + i;
    pgd_kv_seq a, b, c;
    pgd_kv_seq_init(&a, 8);
    pgd_kv_seq_init(&b, 8);
    pgd_kv_seq_init(&c, 8);
    pgd_kv_copy cp;
    /* a computes 10 tokens: blocks 0,1 full, block 2 partial */
    CHECK_EQ_INT(pgd_kv_match_prefix(&m, &a, toks, 10), 0);
    CHECK_EQ_INT(pgd_kv_reserve(&m, &a, 0, 10, &cp), 0);
    CHECK_EQ_INT(cp.n, 0);
    CHECK_EQ_INT(a.n_blocks, 3);
    pgd_kv_commit(&m, &a, toks, 10);
    CHECK_EQ_INT(a.n_hashed, 2);
    /* b with the same first 9 tokens: 2 full blocks hit (8 tokens), shared with a */
    CHECK_EQ_INT(pgd_kv_match_prefix(&m, &b, toks, 9), 8);
    CHECK_EQ_INT(b.table[0], a.table[0]);
    CHECK_EQ_INT(m.blocks[a.table[0]].ref, 2);
    /* a prompt of exactly 8 tokens may only reuse the first block: the last token's block is
     * recomputed so its logits exist */
    CHECK_EQ_INT(pgd_kv_match_prefix(&m, &c, toks, 8), 4);
    pgd_kv_release(&m, &c);
    /* a different token in block 1 stops the match after block 0 */
    int32_t other[12];
    memcpy(other, toks, sizeof other);
    other[5] = 7;
    CHECK_EQ_INT(pgd_kv_match_prefix(&m, &c, other, 12), 4);
    pgd_kv_release(&m, &c);
    pgd_kv_release(&m, &b);
    pgd_kv_release(&m, &a);
    CHECK_EQ_INT(pgd_kv_check(&m), 0);
    CHECK_EQ_INT(m.n_free, 16);
    CHECK_EQ_INT(m.n_cached, 2); /* a's two full blocks stay cached */
    /* after release they still hit */
    CHECK_EQ_INT(pgd_kv_match_prefix(&m, &c, toks, 12), 8);
    pgd_kv_release(&m, &c);
    /* eviction: allocating every block evicts the cached ones (least recently released first) */
    pgd_kv_seq big;
    pgd_kv_seq_init(&big, 16);
    int32_t z[64] = {0};
    CHECK_EQ_INT(pgd_kv_reserve(&m, &big, 0, 64, &cp), 0);
    CHECK_EQ_INT(m.n_cached, 0);
    CHECK_EQ_INT(pgd_kv_reserve(&m, &c, 0, 1, &cp), PGD_ENOMEM);
    pgd_kv_commit(&m, &big, z, 64);
    pgd_kv_release(&m, &big);
    CHECK_EQ_INT(pgd_kv_match_prefix(&m, &c, toks, 12), 0); /* evicted */
    pgd_kv_release(&m, &c);
    CHECK_EQ_INT(pgd_kv_check(&m), 0);
    pgd_kv_seq_free(&a);
    pgd_kv_seq_free(&b);
    pgd_kv_seq_free(&c);
    pgd_kv_seq_free(&big);
    pgd_kv_mgr_free(&m);
}

/* Prefix-cache namespaces (one per LoRA adapter): blocks computed in one are never served to a
 * sequence of another, and each namespace keeps its own copy of the same tokens. */
static void test_namespaces(void) {
    pgd_kv_mgr m;
    pgd_err err;
    CHECK_EQ_INT(pgd_kv_mgr_init(&m, 16, 4, true, &err), 0);
    int32_t toks[12];
    for (int i = 0; i < 12; i++) toks[i] = 7 + i;
    pgd_kv_seq s[4];
    pgd_kv_copy cp;
    for (int i = 0; i < 4; i++) pgd_kv_seq_init(&s[i], 4);
    s[1].ns = 1;
    s[2].ns = 2;
    s[3].ns = 1;
    for (int i = 0; i < 3; i++) { /* namespaces 0, 1, 2 compute the same 12 tokens */
        CHECK_EQ_INT(pgd_kv_match_prefix(&m, &s[i], toks, 12), 0);
        CHECK_EQ_INT(pgd_kv_reserve(&m, &s[i], 0, 12, &cp), 0);
        pgd_kv_commit(&m, &s[i], toks, 12);
        CHECK_EQ_INT(s[i].n_hashed, 3);
    }
    CHECK(s[0].table[0] != s[1].table[0] && s[1].table[0] != s[2].table[0]);
    /* a second sequence of namespace 1 shares namespace 1's blocks only */
    CHECK_EQ_INT(pgd_kv_match_prefix(&m, &s[3], toks, 12), 8);
    CHECK_EQ_INT(s[3].table[0], s[1].table[0]);
    CHECK_EQ_INT(s[3].table[1], s[1].table[1]);
    for (int i = 0; i < 4; i++) pgd_kv_release(&m, &s[i]);
    CHECK_EQ_INT(pgd_kv_check(&m), 0);
    CHECK_EQ_INT(m.n_cached, 9); /* three namespaces' three full blocks each */
    for (int i = 0; i < 4; i++) pgd_kv_seq_free(&s[i]);
    pgd_kv_mgr_free(&m);
}

static void test_copy_on_write(void) {
    pgd_kv_mgr m;
    pgd_err err;
    CHECK_EQ_INT(pgd_kv_mgr_init(&m, 8, 4, true, &err), 0);
    pgd_kv_seq a, b;
    pgd_kv_seq_init(&a, 8);
    pgd_kv_seq_init(&b, 8);
    pgd_kv_copy cp;
    CHECK_EQ_INT(pgd_kv_reserve(&m, &a, 0, 6, &cp), 0); /* blocks: full + 2 of 4 used */
    pgd_kv_fork(&m, &a, &b);
    CHECK_EQ_INT(m.blocks[a.table[1]].ref, 2);
    int32_t shared_last = a.table[1];
    /* b writes position 6 into the shared partial block: it gets a private copy of 2 slots */
    CHECK_EQ_INT(pgd_kv_reserve(&m, &b, 6, 7, &cp), 0);
    CHECK(b.table[1] != shared_last);
    CHECK_EQ_INT(cp.src, shared_last);
    CHECK_EQ_INT(cp.dst, b.table[1]);
    CHECK_EQ_INT(cp.n, 2);
    CHECK_EQ_INT(b.table[0], a.table[0]); /* the full block stays shared */
    CHECK_EQ_INT(m.blocks[shared_last].ref, 1);
    /* a now writes into its block, which is private again: no copy */
    CHECK_EQ_INT(pgd_kv_reserve(&m, &a, 6, 7, &cp), 0);
    CHECK_EQ_INT(cp.n, 0);
    CHECK_EQ_INT(a.table[1], shared_last);
    pgd_kv_release(&m, &a);
    pgd_kv_release(&m, &b);
    CHECK_EQ_INT(pgd_kv_check(&m), 0);
    CHECK_EQ_INT(m.n_free, 8);
    pgd_kv_seq_free(&a);
    pgd_kv_seq_free(&b);
    pgd_kv_mgr_free(&m);
}

#define NSEQ 24
/* The KV events' view of the cache (kv.h's event log), rebuilt from the events alone. */
typedef struct ev_model {
    uint64_t hash[64];
    int32_t tok[64][4];
    int n, n_stored, n_removed;
} ev_model;

/* Applies the log and clears it; then the model must hold exactly the registered blocks. */
static void ev_check(pgd_kv_mgr *m, ev_model *em) {
    for (size_t e = 0; e < m->log.n; e++) {
        const pgd_kv_event *ev = &m->log.ev[e];
        int at = -1;
        for (int i = 0; i < em->n; i++)
            if (em->hash[i] == ev->hash) at = i;
        if (ev->kind == PGD_KV_EV_STORED) {
            CHECK(at < 0 && em->n < 64); /* never stored twice without a removal between */
            em->hash[em->n] = ev->hash;
            memcpy(em->tok[em->n++], m->log.tokens + ev->tok, sizeof em->tok[0]);
            em->n_stored++;
        } else {
            CHECK(at >= 0); /* a removal names a stored block */
            if (at >= 0) {
                em->hash[at] = em->hash[--em->n];
                memcpy(em->tok[at], em->tok[em->n], sizeof em->tok[0]);
            }
            em->n_removed++;
        }
    }
    CHECK_EQ_INT((int)m->log.lost, 0);
    pgd_kv_events_clear(m);
    int n = 0;
    for (int32_t b = 0; b < m->n_blocks; b++) {
        if (!m->blocks[b].hash) continue;
        n++;
        int at = -1;
        for (int i = 0; i < em->n; i++)
            if (em->hash[i] == m->blocks[b].hash) at = i;
        CHECK(at >= 0 && !memcmp(em->tok[at], m->tokens + (size_t)b * 4, sizeof em->tok[0]));
    }
    CHECK_EQ_INT(n, em->n);
}

static void test_random_workload(void) {
    pgd_kv_mgr m;
    pgd_err err;
    CHECK_EQ_INT(pgd_kv_mgr_init(&m, 64, 4, true, &err), 0);
    CHECK_EQ_INT(pgd_kv_events_enable(&m, &err), 0);
    ev_model em = {.n = 0};
    pgd_kv_seq seqs[NSEQ];
    int32_t toks[NSEQ][128];
    int32_t len[NSEQ], done[NSEQ];
    bool live[NSEQ] = {0};
    for (int i = 0; i < NSEQ; i++) pgd_kv_seq_init(&seqs[i], 32);
    int n_ops = 0, n_hits = 0, n_cow = 0, n_fail = 0;
    for (int step = 0; step < 20000; step++) {
        ev_check(&m, &em); /* (the previous operation's events) */
        if (rnd(400) == 0) pgd_kv_drop_cached(&m);
        int i = (int)rnd(NSEQ);
        pgd_kv_seq *s = &seqs[i];
        pgd_kv_copy cp;
        if (!live[i]) {
            /* new sequence: a few shared prompt families so prefixes repeat */
            uint32_t fam = rnd(3);
            len[i] = 1 + (int32_t)rnd(60);
            for (int k = 0; k < 128; k++) toks[i][k] = k < 40 ? (int32_t)(fam * 1000 + k) : (int32_t)rnd(50);
            if (rnd(4) == 0) {
                int j = (int)rnd(NSEQ);
                if (live[j] && j != i) { /* fork from a live sequence, e.g. n > 1 samples */
                    memcpy(toks[i], toks[j], sizeof toks[i]);
                    len[i] = done[j] + 1 + (int32_t)rnd(5);
                    if (len[i] > 120) len[i] = 120;
                    pgd_kv_fork(&m, &seqs[j], s);
                    done[i] = done[j];
                    live[i] = true;
                    n_ops++;
                    continue;
                }
            }
            int32_t hit = pgd_kv_match_prefix(&m, s, toks[i], len[i]);
            n_hits += hit > 0;
            CHECK(hit < len[i] && hit % 4 == 0);
            done[i] = hit;
            live[i] = true;
        } else if (rnd(10) == 0 || done[i] >= 120) {
            pgd_kv_release(&m, s); /* finish or abort */
            live[i] = false;
            n_ops++;
            continue;
        }
        /* compute a chunk */
        int32_t want = done[i] + 1 + (int32_t)rnd(16);
        if (want > 120) want = 120;
        if (want <= done[i]) continue;
        if (pgd_kv_reserve(&m, s, done[i], want, &cp) != 0) {
            n_fail++;
            if (rnd(2)) { /* preempt it */
                pgd_kv_release(&m, s);
                live[i] = false;
            }
            continue;
        }
        n_cow += cp.n > 0;
        CHECK(s->n_blocks * 4 >= want);
        /* the blocks written from done[i] on must be private */
        for (int32_t b = done[i] / 4; b < s->n_blocks; b++) CHECK_EQ_INT(m.blocks[s->table[b]].ref, 1);
        done[i] = want;
        pgd_kv_commit(&m, s, toks[i], done[i]);
        n_ops++;
        if (step % 97 == 0) CHECK_EQ_INT(pgd_kv_check(&m), 0);
    }
    for (int i = 0; i < NSEQ; i++)
        if (live[i]) pgd_kv_release(&m, &seqs[i]);
    CHECK_EQ_INT(pgd_kv_check(&m), 0);
    CHECK_EQ_INT(m.n_free, m.n_blocks);
    for (int b = 0; b < m.n_blocks; b++) CHECK_EQ_INT(m.blocks[b].ref, 0);
    CHECK(n_hits > 100);
    CHECK(n_cow > 10);
    CHECK(n_fail > 10);
    ev_check(&m, &em);
    CHECK(em.n_stored > 1000 && em.n_removed > 1000);
    printf("kv random workload: %d ops, %d prefix hits, %d copy-on-writes, %d failed reservations, "
           "%d blocks stored and %d removed by the events\n", n_ops, n_hits, n_cow, n_fail,
           em.n_stored, em.n_removed);
    for (int i = 0; i < NSEQ; i++) pgd_kv_seq_free(&seqs[i]);
    pgd_kv_mgr_free(&m);
}

/* Speculative rollback: a sequence reserves room for proposals, keeps only what survived
 * (pgd_kv_truncate), thousands of times; registered (full, committed) blocks are never freed by
 * a truncation, and at the end every block is back. */
static void test_truncate(void) {
    pgd_kv_mgr m;
    pgd_err err;
    CHECK_EQ_INT(pgd_kv_mgr_init(&m, 64, 4, true, &err), 0);
    pgd_kv_seq a;
    pgd_kv_seq_init(&a, 64);
    pgd_kv_copy cp;
    /* 10 tokens computed + 6 proposals: 4 blocks; keep 11 -> 3 blocks */
    CHECK_EQ_INT(pgd_kv_reserve(&m, &a, 0, 16, &cp), 0);
    CHECK_EQ_INT(a.n_blocks, 4);
    int32_t b2 = a.table[2];
    pgd_kv_truncate(&m, &a, 11);
    CHECK_EQ_INT(a.n_blocks, 3);
    CHECK_EQ_INT(a.table[2], b2);
    CHECK_EQ_INT(m.n_free, 61);
    pgd_kv_truncate(&m, &a, 12); /* nothing to free; never grows */
    CHECK_EQ_INT(a.n_blocks, 3);
    pgd_kv_truncate(&m, &a, 8);  /* exactly two blocks */
    CHECK_EQ_INT(a.n_blocks, 2);
    CHECK_EQ_INT(pgd_kv_check(&m), 0);
    pgd_kv_release(&m, &a);
    /* random: grow by 1 + k, keep 1 + accepted, commit what is computed */
    int32_t toks[256];
    for (int i = 0; i < 256; i++) toks[i] = (int32_t)rnd(5); /* repeats: prefix-cache hits */
    pgd_kv_seq s[4];
    int32_t n_comp[4] = {0};
    for (int i = 0; i < 4; i++) pgd_kv_seq_init(&s[i], 64);
    int n_rollback = 0;
    for (int it = 0; it < 20000; it++) {
        int i = (int)rnd(4);
        if (n_comp[i] == 0 && s[i].n_blocks == 0)
            n_comp[i] = pgd_kv_match_prefix(&m, &s[i], toks, 1 + (int32_t)rnd(200));
        int32_t k = (int32_t)rnd(8);
        if (n_comp[i] + 1 + k > 250 || rnd(50) == 0) {
            pgd_kv_release(&m, &s[i]);
            n_comp[i] = 0;
            continue;
        }
        if (pgd_kv_reserve(&m, &s[i], n_comp[i], n_comp[i] + 1 + k, &cp)) continue;
        int32_t acc = (int32_t)rnd((uint32_t)k + 1);
        n_comp[i] += 1 + acc;
        if (acc < k) n_rollback++;
        pgd_kv_truncate(&m, &s[i], n_comp[i]);
        CHECK_EQ_INT(s[i].n_blocks, (n_comp[i] + 3) / 4);
        pgd_kv_commit(&m, &s[i], toks, n_comp[i]);
        if (it % 500 == 0) CHECK_EQ_INT(pgd_kv_check(&m), 0);
    }
    CHECK(n_rollback > 1000);
    for (int i = 0; i < 4; i++) {
        pgd_kv_release(&m, &s[i]);
        pgd_kv_seq_free(&s[i]);
    }
    CHECK_EQ_INT(m.n_free, m.n_blocks);
    CHECK_EQ_INT(pgd_kv_check(&m), 0);
    pgd_kv_seq_free(&a);
    pgd_kv_mgr_free(&m);
}

/* pgd_kv_drop_cached (/flush_cache): free cached blocks forget their hashes, blocks in use keep
 * theirs; the pool stays consistent and a later match finds only what is still held. */
static void test_drop_cached(void) {
    pgd_kv_mgr m;
    pgd_err err;
    CHECK_EQ_INT(pgd_kv_mgr_init(&m, 16, 4, true, &err), 0);
    int32_t toks[12], other[12];
    for (int i = 0; i < 12; i++) toks[i] = 100 + i, other[i] = 500 + i;
    pgd_kv_seq a, b, c;
    pgd_kv_seq_init(&a, 8);
    pgd_kv_seq_init(&b, 8);
    pgd_kv_seq_init(&c, 8);
    pgd_kv_copy cp;
    CHECK_EQ_INT(pgd_kv_reserve(&m, &a, 0, 9, &cp), 0);
    pgd_kv_commit(&m, &a, toks, 9);     /* 2 full blocks registered */
    CHECK_EQ_INT(pgd_kv_reserve(&m, &b, 0, 9, &cp), 0);
    pgd_kv_commit(&m, &b, other, 9);    /* 2 more, held by b */
    pgd_kv_release(&m, &a);             /* a's go to the free list, cached */
    CHECK_EQ_INT(m.n_cached, 2);
    CHECK_EQ_INT(pgd_kv_drop_cached(&m), 2);
    CHECK_EQ_INT(m.n_cached, 0);
    CHECK_EQ_INT(pgd_kv_check(&m), 0);
    CHECK_EQ_INT(pgd_kv_match_prefix(&m, &c, toks, 12), 0); /* a's prefix is gone */
    pgd_kv_release(&m, &c);
    CHECK_EQ_INT(pgd_kv_match_prefix(&m, &c, other, 12), 8); /* b's still held: still found */
    pgd_kv_release(&m, &c);
    pgd_kv_release(&m, &b);
    CHECK_EQ_INT(pgd_kv_drop_cached(&m), 2);
    CHECK_EQ_INT(pgd_kv_check(&m), 0);
    pgd_kv_seq_free(&a);
    pgd_kv_seq_free(&b);
    pgd_kv_seq_free(&c);
    pgd_kv_mgr_free(&m);
}

int main(void) {
    test_prefix_hits();
    test_drop_cached();
    test_namespaces();
    test_copy_on_write();
    test_random_workload();
    test_truncate();
    return test_report("test_kv");
}
