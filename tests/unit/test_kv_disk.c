/* The disk tier's store (kv/kv_disk.h) on a temporary directory: blocks written behind and
 * read back byte for byte, a load stopped by a token or parent mismatch, LRU eviction under
 * the bound, re-indexing at open, and the damage it must never use: a flipped byte (caught by
 * the checksum on load), a truncated file, a leftover temporary file and another namespace's
 * entries (dropped at open), a write that fails and a store too small for one entry. */
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kv/kv_disk.h"
#include "test.h"

#define BS 4
#define PAY 256
#define NKV 8

static uint8_t kv[NKV][PAY]; /* the "KV storage" loads fill */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int wakes;

static void wake(void *arg) {
    (void)arg;
    pthread_mutex_lock(&mu);
    wakes++;
    pthread_mutex_unlock(&mu);
}

static void put(void *arg, int32_t block, const void *payload) {
    (void)arg;
    memcpy(kv[block], payload, PAY);
}

static char dir[256];

static pgd_kv_disk *open_store(uint64_t digest, size_t cap_entries, pgd_kv_disk_stats *st) {
    pgd_kv_disk_config c = {.dir = dir, .cap_bytes = cap_entries * pgd_kv_disk_entry_bytes(BS, PAY),
                            .digest = digest, .block_size = BS, .payload_bytes = PAY,
                            .n_slots = 2, .max_load = NKV, .wake = wake, .put = put};
    pgd_kv_disk *d = NULL;
    pgd_err err;
    CHECK_EQ_INT(pgd_kv_disk_open(&c, &d, &err), 0);
    if (d && st) pgd_kv_disk_get_stats(d, st);
    return d;
}

/* the block i of the test chain: its tokens and payload */
static void block_of(int i, int32_t *tok, uint8_t *pay) {
    for (int t = 0; t < BS; t++) tok[t] = 100 * i + t;
    for (int b = 0; b < PAY; b++) pay[b] = (uint8_t)(i * 37 + b * 11);
}

static uint64_t H[6] = {0, 0x1111, 0x2222, 0x3333, 0x4444, 0x5555}; /* chain hashes; H[0]: root */

static void wait_stats(pgd_kv_disk *d, pgd_kv_disk_stats *st, int64_t entries, int64_t errs) {
    for (int i = 0; i < 2000; i++) {
        pgd_kv_disk_get_stats(d, st);
        if (st->entries + st->write_errors + st->writes_dropped >= entries + errs) return;
        usleep(1000);
    }
}

static void write_block(pgd_kv_disk *d, int i) {
    int32_t slot, tok[BS];
    uint8_t pay[PAY];
    void *buf;
    while (!(buf = pgd_kv_disk_slot(d, &slot))) pgd_kv_disk_wait_slot(d);
    block_of(i, tok, pay);
    memcpy(buf, pay, PAY);
    pgd_kv_disk_write(d, slot, H[i], H[i - 1], tok);
}

/* Loads blocks first..first+n-1 of the chain into kv[0..n): n_ok. tamper: the index of a
 * block whose expected tokens are changed (-1: none). */
static int32_t load(pgd_kv_disk *d, int first, int n, int tamper) {
    int32_t blocks[NKV], toks[NKV * BS];
    uint64_t hashes[NKV];
    uint8_t pay[PAY];
    for (int i = 0; i < n; i++) {
        blocks[i] = i;
        hashes[i] = H[first + i];
        block_of(first + i, toks + i * BS, pay);
        if (i == tamper) toks[i * BS] ^= 1;
    }
    memset(kv, 0, sizeof kv);
    CHECK_EQ_INT(pgd_kv_disk_load(d, 42, n, blocks, hashes, H[first - 1], toks), 0);
    CHECK_EQ_INT(pgd_kv_disk_load(d, 43, n, blocks, hashes, H[first - 1], toks), PGD_EAGAIN);
    uint64_t tag = 0;
    int32_t ok = -1;
    for (int i = 0; i < 5000 && !pgd_kv_disk_load_done(d, &tag, &ok); i++) usleep(1000);
    CHECK_EQ_INT(tag, 42);
    CHECK(!pgd_kv_disk_loading(d));
    for (int i = 0; i < ok; i++) {
        int32_t t[BS];
        block_of(first + i, t, pay);
        CHECK(!memcmp(kv[i], pay, PAY));
    }
    return ok;
}

/* An entry's file, or (tmp) the temporary file this process writes it to. */
static void path_of(char *p, size_t n, uint64_t h, bool tmp) {
    if (tmp)
        snprintf(p, n, "%s/.tmp-%016llx-%ld.kvb", dir, (unsigned long long)h, (long)getpid());
    else
        snprintf(p, n, "%s/%016llx.kvb", dir, (unsigned long long)h);
}

static int count_files(void) {
    DIR *dh = opendir(dir);
    int n = 0;
    struct dirent *de;
    while (dh && (de = readdir(dh)))
        if (strstr(de->d_name, ".kvb")) n++;
    if (dh) closedir(dh);
    return n;
}

static void test_checksum(void) {
    uint8_t buf[1000];
    for (int i = 0; i < 1000; i++) buf[i] = (uint8_t)(i * 7);
    uint64_t h = pgd_kv_disk_checksum(buf, sizeof buf, 0);
    int same = 0;
    for (int i = 0; i < 1000; i += 37) /* one flipped bit anywhere, lanes and tail alike */
        for (int bit = 0; bit < 8; bit += 3) {
            buf[i] ^= (uint8_t)(1u << bit);
            same += pgd_kv_disk_checksum(buf, sizeof buf, 0) == h;
            buf[i] ^= (uint8_t)(1u << bit);
        }
    CHECK_EQ_INT(same, 0);
    CHECK(pgd_kv_disk_checksum(buf, 999, 0) != h);
    CHECK(pgd_kv_disk_checksum(buf, sizeof buf, 1) != h);
}

static void test_store(void) {
    pgd_kv_disk_stats st;
    pgd_kv_disk *d = open_store(7, 3, &st);
    if (!d) return;
    CHECK_EQ_INT(st.entries, 0);
    for (int i = 1; i <= 3; i++) write_block(d, i);
    wait_stats(d, &st, 3, 0);
    CHECK_EQ_INT(st.entries, 3);
    CHECK_EQ_INT(st.bytes_written, 3 * (int64_t)pgd_kv_disk_entry_bytes(BS, PAY));
    for (int i = 1; i <= 3; i++) CHECK(pgd_kv_disk_has(d, H[i]));
    CHECK(!pgd_kv_disk_has(d, H[4]));
    CHECK_EQ_INT(load(d, 1, 3, -1), 3); /* touches 1, 2, 3 in that order */
    pgd_kv_disk_get_stats(d, &st);
    CHECK_EQ_INT(st.hits, 3);
    /* the tokens of block 2 differ from the file's: the run stops there, the file stays */
    CHECK_EQ_INT(load(d, 1, 3, 1), 1); /* touches 1 only: 2 is now the least recently used */
    CHECK(pgd_kv_disk_has(d, H[2]));
    /* a wrong parent for the first block: nothing */
    H[0] = 99;
    CHECK_EQ_INT(load(d, 1, 1, -1), 0);
    H[0] = 0;
    /* a fourth entry evicts the least recently used one */
    write_block(d, 4);
    wait_stats(d, &st, 3, 0);
    for (int i = 0; i < 1000 && st.evictions == 0; i++, usleep(1000)) pgd_kv_disk_get_stats(d, &st);
    CHECK_EQ_INT(st.evictions, 1);
    CHECK(!pgd_kv_disk_has(d, H[2]));
    CHECK(pgd_kv_disk_has(d, H[4]));
    CHECK_EQ_INT(st.corrupt, 0);
    /* a write whose temporary file cannot be made (a directory in its place) fails cleanly */
    char p[512];
    path_of(p, sizeof p, H[5], true);
    CHECK_EQ_INT(mkdir(p, 0755), 0);
    write_block(d, 5);
    wait_stats(d, &st, 3, 1);
    CHECK_EQ_INT(st.write_errors, 1);
    CHECK(!pgd_kv_disk_has(d, H[5]));
    rmdir(p);
    pgd_kv_disk_close(d);
    CHECK_EQ_INT(count_files(), 3); /* 1, 3, 4 */

    /* damage: a flipped payload byte in 3, 4 truncated, a leftover temporary file */
    path_of(p, sizeof p, H[3], false);
    int fd = open(p, O_RDWR);
    CHECK(fd >= 0);
    uint8_t c;
    off_t at = (off_t)pgd_kv_disk_entry_bytes(BS, PAY) - 5;
    CHECK_EQ_INT(pread(fd, &c, 1, at), 1);
    c ^= 0x10;
    CHECK_EQ_INT(pwrite(fd, &c, 1, at), 1);
    close(fd);
    path_of(p, sizeof p, H[4], false);
    CHECK_EQ_INT(truncate(p, 100), 0);
    path_of(p, sizeof p, H[5], true);
    fd = open(p, O_WRONLY | O_CREAT, 0644);
    CHECK(fd >= 0 && write(fd, "torn", 4) == 4);
    close(fd);
    d = open_store(7, 3, &st); /* re-index: 1 and 3 (its damage is inside), 4 and tmp dropped */
    if (!d) return;
    CHECK_EQ_INT(st.entries, 2);
    CHECK_EQ_INT(st.corrupt, 2);
    CHECK(pgd_kv_disk_has(d, H[1]) && pgd_kv_disk_has(d, H[3]) && !pgd_kv_disk_has(d, H[4]));
    CHECK_EQ_INT(load(d, 1, 1, -1), 1);
    CHECK_EQ_INT(load(d, 3, 1, -1), 0); /* the checksum catches the flipped byte */
    pgd_kv_disk_get_stats(d, &st);
    CHECK_EQ_INT(st.corrupt, 3);
    CHECK(!pgd_kv_disk_has(d, H[3]));
    CHECK_EQ_INT(count_files(), 1);
    pgd_kv_disk_close(d);

    /* another namespace (another model, KV type...): its entries are foreign and go */
    d = open_store(8, 3, &st);
    if (!d) return;
    CHECK_EQ_INT(st.entries, 0);
    CHECK_EQ_INT(st.corrupt, 1);
    CHECK_EQ_INT(count_files(), 0);
    pgd_kv_disk_close(d);

    /* a store too small for one entry drops every write */
    d = open_store(8, 0, &st);
    if (!d) return;
    write_block(d, 1);
    wait_stats(d, &st, 0, 1);
    CHECK_EQ_INT(st.writes_dropped, 1);
    CHECK_EQ_INT(st.entries, 0);
    pgd_kv_disk_close(d);
    CHECK_EQ_INT(count_files(), 0);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/pgd-kv-disk-XXXXXX");
    if (!mkdtemp(dir)) return 1;
    test_checksum();
    test_store();
    rmdir(dir);
    return test_report("test_kv_disk");
}
