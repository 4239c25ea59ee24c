/* GGUF and safetensors parsers: real files parse with the expected contents; truncations at
 * every length and tens of thousands of seeded random mutations never crash or read out of
 * bounds (run under AddressSanitizer in CI) and always end in either success or a one-line
 * error that names the file. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/gguf.h"
#include "model/safetensors.h"
#include "test.h"

static uint64_t rng_state = 0x1234567890abcdefull;
static uint64_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* Parses buf as GGUF in a malloc'd copy of exactly len bytes, so ASan sees any overread. */
static int parse_copy(const unsigned char *buf, size_t len, pgd_err *err) {
    /* The full-length case reuses one buffer: an overread past its end is still caught. */
    static unsigned char *full;
    static size_t full_len;
    bool reuse = full_len == len;
    if (!full && !full_len) {
        full_len = len;
        full = malloc(len);
        reuse = true;
    }
    unsigned char *c = reuse ? full : malloc(len ? len : 1);
    CHECK(c != NULL);
    if (c != buf) memcpy(c, buf, len);
    pgd_gguf g;
    int rc = pgd_gguf_parse(&g, c, len, "fuzz.gguf", err);
    if (rc == 0) {
        /* Touch every tensor's first and last byte: they must be inside the buffer. */
        volatile unsigned char sink = 0;
        for (uint64_t i = 0; i < g.n_tensors; i++)
            if (g.tensors[i].nbytes) {
                sink ^= ((const unsigned char *)g.tensors[i].data)[0];
                sink ^= ((const unsigned char *)g.tensors[i].data)[g.tensors[i].nbytes - 1];
            }
        (void)sink;
        pgd_gguf_close(&g);
    }
    if (!reuse) free(c);
    return rc;
}

static void test_real_files(void) {
    pgd_gguf g;
    pgd_err err;
    CHECK_EQ_INT(pgd_gguf_open(&g, "tests/data/models/stories260K.gguf", &err), 0);
    CHECK_EQ_INT(g.version, 3);
    pgd_str arch;
    CHECK_EQ_INT(pgd_gguf_get_str(&g, "general.architecture", &arch), 0);
    CHECK(pgd_str_eq(arch, "llama"));
    uint32_t dim;
    CHECK_EQ_INT(pgd_gguf_get_u32(&g, "llama.embedding_length", &dim), 0);
    CHECK_EQ_INT(dim, 64); /* the model README: dim 64, 5 layers, 8 heads, 4 KV heads */
    const pgd_gguf_tensor *t = pgd_gguf_find_tensor(&g, "token_embd.weight");
    CHECK(t != NULL);
    CHECK_EQ_INT(t->ne[0], 64);
    CHECK_EQ_INT(t->ne[1], 512);
    CHECK_EQ_INT(t->type, PGD_TYPE_F32);
    const pgd_gguf_kv *toks;
    CHECK_EQ_INT(pgd_gguf_get_arr(&g, "tokenizer.ggml.tokens", PGD_GGUF_STRING, &toks), 0);
    CHECK_EQ_INT(toks->arr_n, 512);
    pgd_gguf_close(&g);

    CHECK_EQ_INT(pgd_gguf_open(&g, "tests/data/models/llama-2-tiny-random.gguf", &err), 0);
    t = pgd_gguf_find_tensor(&g, "blk.0.attn_q.weight");
    CHECK(t != NULL);
    CHECK_EQ_INT(t->type, PGD_TYPE_F16);
    pgd_gguf_close(&g);

    CHECK(pgd_gguf_open(&g, "tests/data/does-not-exist.gguf", &err) == PGD_EIO);
    CHECK(strstr(err.msg, "tests/data/does-not-exist.gguf") != NULL);
}

static unsigned char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)n);
    CHECK(b && fread(b, 1, (size_t)n, f) == (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return b;
}

static void check_err_line(int rc, const pgd_err *err, const char *name) {
    if (rc == 0) return;
    CHECK(strstr(err->msg, name) == err->msg); /* starts with the file name */
    CHECK(strchr(err->msg, '\n') == NULL);     /* one line */
}

static void test_gguf_fuzz(void) {
    size_t len;
    unsigned char *buf = slurp("tests/data/models/stories260K.gguf", &len);
    pgd_err err;
    /* Every truncation of the header region, and a spread of truncations in the data. */
    size_t header_end = 0;
    {
        pgd_gguf g;
        CHECK_EQ_INT(pgd_gguf_parse(&g, buf, len, "x", &err), 0);
        header_end = (size_t)(g.data - buf);
        pgd_gguf_close(&g);
    }
    int n_ok = 0, n_err = 0;
    parse_copy(buf, len, &err); /* allocates the reusable full-length buffer */
    for (size_t cut = 0; cut < len; cut += cut < header_end + 64 ? 1 : 997) {
        int rc = parse_copy(buf, cut, &err);
        CHECK(rc != 0); /* a truncated file never parses */
        check_err_line(rc, &err, "fuzz.gguf");
        n_err++;
    }
    /* Random mutations of the header region: flip bytes, write random 64-bit values. */
    unsigned char *mut = malloc(len);
    CHECK(mut != NULL);
    for (int iter = 0; iter < 20000; iter++) {
        memcpy(mut, buf, len);
        int n_mut = 1 + (int)(rnd() % 4);
        for (int k = 0; k < n_mut; k++) {
            size_t pos = (size_t)(rnd() % header_end);
            if (rnd() % 2) {
                mut[pos] = (unsigned char)rnd();
            } else if (pos + 8 <= len) {
                uint64_t v = rnd() % 3 == 0 ? rnd() : (rnd() % 3 == 1 ? UINT64_MAX - rnd() % 16 : rnd() % 4096);
                memcpy(mut + pos, &v, 8);
            }
        }
        size_t cut = rnd() % 8 == 0 ? (size_t)(rnd() % len) : len;
        int rc = parse_copy(mut, cut, &err);
        check_err_line(rc, &err, "fuzz.gguf");
        if (rc) n_err++;
        else n_ok++;
    }
    printf("gguf fuzz: %d rejected, %d accepted (all without a crash)\n", n_err, n_ok);
    free(mut);
    free(buf);
}

static void test_safetensors(void) {
    /* A well-formed two-tensor file, built by hand. */
    const char *hdr = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]},"
                      "\"b\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[16,24]},"
                      "\"__metadata__\":{\"format\":\"pt\"}}";
    size_t hl = strlen(hdr), len = 8 + hl + 24;
    unsigned char *buf = calloc(1, len);
    CHECK(buf != NULL);
    uint64_t h = hl;
    memcpy(buf, &h, 8);
    memcpy(buf + 8, hdr, hl);
    pgd_safetensors st = {0};
    pgd_err err;
    CHECK_EQ_INT(pgd_st_parse(&st, buf, len, "t.safetensors", &err), 0);
    CHECK_EQ_INT(st.n_tensors, 2);
    const pgd_st_tensor *a = pgd_st_find(&st, "a");
    CHECK(a && a->type == PGD_TYPE_F32 && a->n_dims == 2 && a->nbytes == 16);
    pgd_st_close(&st);

    int n_err = 0, n_ok = 0;
    for (int iter = 0; iter < 20000; iter++) {
        unsigned char *m = malloc(len);
        CHECK(m != NULL);
        memcpy(m, buf, len);
        int n_mut = 1 + (int)(rnd() % 3);
        for (int k = 0; k < n_mut; k++) {
            size_t pos = (size_t)(rnd() % (8 + hl));
            static const char alphabet[] = "0123456789[]{}\",:-e.FB1623";
            m[pos] = rnd() % 2 ? (unsigned char)rnd() : (unsigned char)alphabet[rnd() % (sizeof alphabet - 1)];
        }
        size_t cut = rnd() % 4 == 0 ? (size_t)(rnd() % len) : len;
        unsigned char *c = malloc(cut ? cut : 1);
        CHECK(c != NULL);
        memcpy(c, m, cut);
        pgd_safetensors s2 = {0};
        int rc = pgd_st_parse(&s2, c, cut, "fuzz.safetensors", &err);
        check_err_line(rc, &err, "fuzz.safetensors");
        for (size_t i = 0; rc == 0 && i < s2.n_tensors; i++)
            CHECK((const unsigned char *)s2.tensors[i].data + s2.tensors[i].nbytes <= c + cut);
        pgd_st_close(&s2);
        if (rc) n_err++;
        else n_ok++;
        free(c);
        free(m);
    }
    printf("safetensors fuzz: %d rejected, %d accepted (all without a crash)\n", n_err, n_ok);
    free(buf);
}

int main(void) {
    test_real_files();
    test_gguf_fuzz();
    test_safetensors();
    return test_report("test_gguf");
}
