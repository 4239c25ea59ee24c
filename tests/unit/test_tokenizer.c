/* Tokenizer: llama.cpp's reference tokenizations of three real vocabularies (SentencePiece
 * Llama 2, byte-level Llama 3 and Qwen2) id for id, stories260K, byte fallback, special tokens,
 * decoding, and the streaming detokenizer's UTF-8 edge cases. Run from the repository root. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/gguf.h"
#include "test.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

static char *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    if (b) b[n] = 0, *len = (size_t)n;
    return b;
}

static pgd_tokenizer *load(const char *path, pgd_gguf *g) {
    pgd_err err = {{0}};
    pgd_tokenizer *t = NULL;
    if (pgd_gguf_open(g, path, &err) != 0) {
        fprintf(stderr, "%s\n", err.msg);
        return NULL;
    }
    if (pgd_tokenizer_load_gguf(g, &t, &err) != 0) fprintf(stderr, "%s\n", err.msg);
    return t;
}

/* Encodes into a fresh buffer; returns the count (or -1). */
static long enc(const pgd_tokenizer *t, const char *s, size_t n, bool bos, bool special,
                int32_t **ids) {
    size_t cap = n + 2, got = 0;
    *ids = malloc(sizeof(int32_t) * cap);
    int rc = pgd_tokenizer_encode(t, s, n, bos, special, *ids, cap, &got);
    if (rc == PGD_ERANGE) {
        *ids = realloc(*ids, sizeof(int32_t) * got);
        rc = pgd_tokenizer_encode(t, s, n, bos, special, *ids, got, &got);
    }
    return rc == 0 ? (long)got : -1;
}

static bool enc_equals(const pgd_tokenizer *t, const char *s, bool special,
                       const int32_t *want, size_t n_want) {
    int32_t *ids;
    long n = enc(t, s, strlen(s), false, special, &ids);
    bool ok = n == (long)n_want && memcmp(ids, want, n_want * sizeof(int32_t)) == 0;
    if (!ok) {
        fprintf(stderr, "  encode(\"%s\") gave:", s);
        for (long i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
        fprintf(stderr, "\n");
    }
    free(ids);
    return ok;
}

/* Every .inp case must give its .out line; every case must also decode back to itself. */
static void vocab_file(const char *name) {
    char path[256], inp_path[300], out_path[300];
    snprintf(path, sizeof path, "tests/data/vocab/ggml-vocab-%s.gguf", name);
    snprintf(inp_path, sizeof inp_path, "%s.inp", path);
    snprintf(out_path, sizeof out_path, "%s.out", path);
    pgd_gguf g;
    pgd_tokenizer *t = load(path, &g);
    CHECK(t != NULL);
    size_t inp_len, out_len;
    char *inp = read_all(inp_path, &inp_len), *out = read_all(out_path, &out_len);
    CHECK(inp && out);
    if (!t || !inp || !out) return;
    const char *sep = "\n__ggml_vocab_test__\n";
    char *p = inp, *line = out;
    int n_cases = 0, n_ok = 0;
    for (;;) {
        char *e = strstr(p, sep);
        if (!e) break;
        size_t n = (size_t)(e - p);
        char *eol = strchr(line, '\n');
        if (!eol) break;
        *eol = 0;
        int32_t want[512];
        size_t nw = 0;
        for (char *q = line; *q;) {
            char *end;
            long v = strtol(q, &end, 10);
            if (end == q) break;
            want[nw++] = (int32_t)v;
            q = end;
        }
        int32_t *ids;
        long got = enc(t, p, n, false, false, &ids);
        bool ok = got == (long)nw && memcmp(ids, want, nw * sizeof(int32_t)) == 0;
        n_cases++;
        n_ok += ok;
        CHECK(ok);
        if (!ok) {
            fprintf(stderr, "  %s case %d \"%.*s\": got", name, n_cases, (int)n, p);
            for (long i = 0; i < got; i++) fprintf(stderr, " %d", ids[i]);
            fprintf(stderr, "\n  want %s\n", line);
        }
        char *dec;
        size_t dl;
        CHECK(pgd_tokenizer_decode(t, ids, (size_t)got, false, &dec, &dl) == 0);
        if (dl != n || memcmp(dec, p, n) != 0) {
            CHECK(!"decode(encode(s)) == s");
            fprintf(stderr, "  %s case %d: decoded \"%s\"\n", name, n_cases, dec);
        }
        free(dec);
        free(ids);
        p = e + strlen(sep);
        line = eol + 1;
    }
    printf("%s: %d/%d reference cases match\n", name, n_ok, n_cases);
    CHECK(n_cases > 30);
    free(inp);
    free(out);
    pgd_tokenizer_free(t);
    pgd_gguf_close(&g);
}

static void test_stories(void) {
    pgd_gguf g;
    pgd_tokenizer *t = load("tests/data/models/stories260K.gguf", &g);
    CHECK(t != NULL);
    if (!t) return;
    CHECK(enc_equals(t, "Once upon a time", false, (int32_t[]){403, 407, 261, 378}, 4));
    CHECK_EQ_INT(pgd_tokenizer_bos(t), 1);
    CHECK_EQ_INT(pgd_tokenizer_eos(t), 2);
    CHECK(pgd_tokenizer_add_bos(t)); /* SentencePiece vocabulary without the key: add BOS */
    int32_t *ids;
    long n = enc(t, "Once", 4, true, false, &ids);
    CHECK(n >= 2 && ids[0] == 1);
    free(ids);
    /* byte fallback: characters outside the 512-token vocabulary become <0xXX> tokens */
    n = enc(t, "\xe4\xb8\xad", 3, false, false, &ids); /* "中" */
    CHECK(n >= 3);
    if (n >= 3) {
        char b[16];
        int l = pgd_tokenizer_token_bytes(t, ids[n - 1], false, b, sizeof b);
        CHECK(l == 1 && (unsigned char)b[0] == 0xAD);
        char *dec;
        size_t dl;
        CHECK(pgd_tokenizer_decode(t, ids, (size_t)n, false, &dec, &dl) == 0);
        CHECK(dl == 3 && memcmp(dec, "\xe4\xb8\xad", 3) == 0);
        free(dec);
        /* streaming: the 3 byte tokens release the character only once complete */
        pgd_detok d;
        pgd_detok_init(&d, t, false);
        char out[300];
        size_t total = 0;
        for (long i = 0; i < n; i++) {
            int w = pgd_detok_push(&d, ids[i], out + total, sizeof out - total);
            CHECK(w >= 0);
            if (i < n - 1) CHECK_EQ_INT(w, 0);
            total += (size_t)(w > 0 ? w : 0);
        }
        CHECK(total == 3 && memcmp(out, "\xe4\xb8\xad", 3) == 0);
        CHECK_EQ_INT(pgd_detok_flush(&d, out, sizeof out), 0);
    }
    free(ids);
    /* special tokens: "<s>" is one token only with parse_special */
    CHECK(enc_equals(t, "<s>", true, (int32_t[]){1}, 1));
    n = enc(t, "<s>", 3, false, false, &ids);
    CHECK(n > 1);
    free(ids);
    char b[16];
    CHECK_EQ_INT(pgd_tokenizer_token_bytes(t, 1, false, b, sizeof b), 0);
    CHECK_EQ_INT(pgd_tokenizer_token_bytes(t, 1, true, b, sizeof b), 3);
    CHECK_EQ_INT(pgd_tokenizer_token_bytes(t, 512, true, b, sizeof b), PGD_EINVAL);
    CHECK_EQ_INT(pgd_tokenizer_token_bytes(t, -1, true, b, sizeof b), PGD_EINVAL);
    CHECK(pgd_tokenizer_is_eog(t, 2));
    CHECK(!pgd_tokenizer_is_eog(t, 403));
    /* too small a buffer: PGD_ERANGE and the needed count */
    int32_t small[2];
    size_t need = 0;
    CHECK_EQ_INT(pgd_tokenizer_encode(t, "Once upon a time", 16, false, false, small, 2, &need),
                 PGD_ERANGE);
    CHECK_EQ_INT(need, 4);
    CHECK_EQ_INT(pgd_tokenizer_encode(t, "", 0, false, false, small, 2, &need), 0);
    CHECK_EQ_INT(need, 0);
    pgd_tokenizer_free(t);
    pgd_gguf_close(&g);
}

/* Byte-level vocabulary: streaming over a 4-byte emoji split across tokens, invalid UTF-8 in
 * and out, special-token matching (longest first). */
static void test_qwen2_specials_and_stream(void) {
    pgd_gguf g;
    pgd_tokenizer *t = load("tests/data/vocab/ggml-vocab-qwen2.gguf", &g);
    CHECK(t != NULL);
    if (!t) return;
    int32_t *ids;
    const char *s = "<|im_start|>user\nhi<|im_end|>";
    long n = enc(t, s, strlen(s), false, true, &ids);
    CHECK(n >= 4 && ids[0] == 151644 && ids[n - 1] == 151645);
    free(ids);
    n = enc(t, s, strlen(s), false, false, &ids);
    CHECK(n > 6);
    for (long i = 0; i < n; i++) CHECK(ids[i] < 151643);
    free(ids);
    CHECK(pgd_tokenizer_is_eog(t, 151645)); /* <|im_end|> */
    CHECK(pgd_tokenizer_is_eog(t, 151643)); /* <|endoftext|> (eos) */
    CHECK(!pgd_tokenizer_add_bos(t));
    CHECK(pgd_tokenizer_chat_template(t) != NULL);

    /* invalid UTF-8 is encoded (byte-level covers every byte); decoded, each maximal
     * ill-formed subpart is U+FFFD: `want` is Python's bytes.decode("utf-8", "replace") of
     * `bad` (the same rule as Rust's from_utf8_lossy in HF's ByteLevel decoder) */
    const char bad[] = "a\xff\xc3(b\xe2\x82";
    const char want[] = "a\xef\xbf\xbd\xef\xbf\xbd(b\xef\xbf\xbd";
    n = enc(t, bad, sizeof bad - 1, false, false, &ids);
    CHECK(n > 0);
    char *dec;
    size_t dl;
    CHECK(pgd_tokenizer_decode(t, ids, (size_t)n, false, &dec, &dl) == 0);
    CHECK(dl == sizeof want - 1 && memcmp(dec, want, dl) == 0);
    free(dec);
    /* streaming the same: only complete characters out, the truncated tail at flush */
    pgd_detok d;
    pgd_detok_init(&d, t, false);
    char out[600];
    size_t total = 0;
    for (long i = 0; i < n; i++) {
        int w = pgd_detok_push(&d, ids[i], out + total, sizeof out - total);
        CHECK(w >= 0);
        total += (size_t)w;
    }
    CHECK(total == sizeof want - 4); /* "\xe2\x82" still pending */
    int w = pgd_detok_flush(&d, out + total, sizeof out - total);
    CHECK_EQ_INT(w, 3);
    total += (size_t)w;
    CHECK(total == sizeof want - 1 && memcmp(out, want, total) == 0);
    free(ids);

    /* an emoji ZWJ sequence fed token by token never emits a partial character */
    const char *emoji = "\xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9\xe2\x80\x8d"
                        "\xf0\x9f\x91\xa7 ok";
    n = enc(t, emoji, strlen(emoji), false, false, &ids);
    pgd_detok_init(&d, t, false);
    total = 0;
    for (long i = 0; i < n; i++) {
        w = pgd_detok_push(&d, ids[i], out + total, sizeof out - total);
        CHECK(w >= 0);
        /* every prefix emitted so far ends on a character boundary */
        total += (size_t)w;
        size_t k = 0;
        while (k < total) {
            uint32_t cp;
            k += (size_t)pgd__utf8_decode((const unsigned char *)out + k, total - k, &cp);
            CHECK(!(cp & PGD_UNI_INVALID));
        }
    }
    CHECK_EQ_INT(pgd_detok_flush(&d, out + total, sizeof out - total), 0);
    CHECK(total == strlen(emoji) && memcmp(out, emoji, total) == 0);
    free(ids);
    /* NFC: a decomposed "é" encodes like the composed one (Qwen2 normalises to NFC) */
    int32_t *a, *b;
    long na = enc(t, "caf\xc3\xa9", 5, false, false, &a);
    long nb = enc(t, "cafe\xcc\x81", 6, false, false, &b);
    CHECK(na == nb && na > 0 && memcmp(a, b, (size_t)na * sizeof(int32_t)) == 0);
    free(a);
    free(b);
    pgd_tokenizer_free(t);
    pgd_gguf_close(&g);
}

static void test_utf8_and_nfc(void) {
    uint32_t cp;
    CHECK_EQ_INT(pgd__utf8_decode((const unsigned char *)"\xc0\x80", 2, &cp), 1); /* overlong */
    CHECK(cp & PGD_UNI_INVALID);
    /* a surrogate */
    CHECK_EQ_INT(pgd__utf8_decode((const unsigned char *)"\xed\xa0\x80", 3, &cp), 1);
    CHECK(cp & PGD_UNI_INVALID);
    CHECK_EQ_INT(pgd__utf8_decode((const unsigned char *)"\xf0\x9f\x98\x80", 4, &cp), 4);
    CHECK_EQ_INT(cp, 0x1F600);
    CHECK_EQ_INT(pgd__utf8_decode((const unsigned char *)"\xf0\x9f\x98", 3, &cp), 1); /* cut */
    CHECK(pgd__uni_flags(0x4E2D) & PGD_UNI_LETTER);  /* 中 */
    CHECK(pgd__uni_flags(0x0663) & PGD_UNI_NUMBER);  /* Arabic-Indic three */
    CHECK(pgd__uni_flags(0x3000) & PGD_UNI_SPACE);   /* ideographic space */
    CHECK(!(pgd__uni_flags(0x1C) & PGD_UNI_SPACE));  /* not \s although Python's isspace() */
    CHECK(pgd__uni_flags(0x85) & PGD_UNI_SPACE);
    CHECK_EQ_INT(pgd__uni_flags(0x1F600), 0);
    char *o;
    size_t ol;
    /* Hangul jamo compose; combining marks reorder (dot below ccc 220 before acute 230) */
    CHECK(pgd__uni_nfc("\xe1\x84\x80\xe1\x85\xa1\xe1\x86\xa8", 9, &o, &ol) == 0);
    CHECK(ol == 3 && memcmp(o, "\xea\xb0\x81", 3) == 0); /* 각 */
    free(o);
    CHECK(pgd__uni_nfc("q\xcc\x81\xcc\xa3", 5, &o, &ol) == 0);
    CHECK(ol == 5 && memcmp(o, "q\xcc\xa3\xcc\x81", 5) == 0);
    free(o);
    CHECK(pgd__uni_nfc("\xe2\x84\xab", 3, &o, &ol) == 0); /* ANGSTROM SIGN -> Å */
    CHECK(ol == 2 && memcmp(o, "\xc3\x85", 2) == 0);
    free(o);
    CHECK(pgd__uni_is_nfc_quick("plain ascii \xe4\xb8\xad", 15));
    CHECK(!pgd__uni_is_nfc_quick("e\xcc\x81", 3));
}

static void test_errors(void) {
    pgd_gguf g;
    pgd_err err = {{0}};
    CHECK(pgd_gguf_open(&g, "tests/data/models/stories260K.gguf", &err) == 0);
    pgd_gguf_close(&g);
    pgd_tokenizer *t = NULL;
    int rc = pgd_tokenizer_load_hf("tests/data/nonexistent/tokenizer.json", NULL, &t, &err);
    CHECK(rc < 0);
    CHECK(t == NULL);
    CHECK(strstr(err.msg, "tokenizer.json") != NULL);
    CHECK(strchr(err.msg, '\n') == NULL);
    /* a file that is not JSON */
    CHECK(pgd_tokenizer_load_hf("tests/data/vocab/README.md", NULL, &t, &err) < 0);
    CHECK(strstr(err.msg, "README.md") != NULL);
}

int main(void) {
    test_utf8_and_nfc();
    vocab_file("llama-spm");
    vocab_file("llama-bpe");
    vocab_file("qwen2");
    test_stories();
    test_qwen2_specials_and_stream();
    test_errors();
    return test_report("test_tokenizer");
}
