/* SentencePiece BPE as llama.cpp's llm_tokenizer_spm does it: start from UTF-8 characters,
 * repeatedly merge the adjacent pair whose concatenation is a token with the highest score
 * (ties: leftmost), then emit each piece, falling back to <0xXX> byte tokens for characters
 * that are not in the vocabulary. */
#include "tokenizer/tok_internal.h"

#include "tokenizer/unicode.h"

typedef struct spm_sym {
    int32_t prev, next;
    uint32_t start, n; /* bytes; n == 0 once merged into the left neighbour */
} spm_sym;

typedef struct bigram {
    float score;
    int32_t left, right;
    uint32_t size;
} bigram;

/* max-heap: higher score first, then the leftmost */
static bool big_before(const void *xv, const void *yv) {
    const bigram *x = xv, *y = yv;
    return x->score > y->score || (x->score == y->score && x->left < y->left);
}

static void try_bigram(const pgd_tokenizer *t, const char *s, const spm_sym *sy, int32_t l,
                       int32_t r, bigram *h, size_t *nh) {
    if (l < 0 || r < 0) return;
    uint32_t size = sy[l].n + sy[r].n;
    int32_t id = pgd__tok_lookup(t, s + sy[l].start, size);
    if (id < 0) return;
    const bigram b = {t->scores ? t->scores[id] : 0.0f, l, r, size};
    pgd__heap_push(h, nh, &b, sizeof b, big_before);
}

static int spm_chunk(const pgd_tokenizer *t, const char *s, size_t n, pgd_tok_out *o,
                     pgd_tok_scratch *sc);

static bool is_meta(const char *s, size_t i, size_t n) {
    return i + 3 <= n && s[i] == (char)0xE2 && s[i + 1] == (char)0x96 && s[i + 2] == (char)0x81;
}

int pgd__spm_encode(const pgd_tokenizer *t, const char *s, size_t n, pgd_tok_out *o,
                    pgd_tok_scratch *sc) {
    if (!t->spm_split_words) {
        return t->spm_by_score ? spm_chunk(t, s, n, o, sc) : pgd__bpe_chars(t, s, n, o, sc);
    }
    /* No token has "▁" right after another character, so no merge crosses the start of a
     * "▁" run that follows other text: merging each such word on its own gives the same
     * result (candidates never interact across the boundary) with a small, cache-resident heap. */
    size_t a = 0;
    while (a < n) {
        size_t b = a;
        while (b < n && is_meta(s, b, n)) b += 3;
        while (b < n && !is_meta(s, b, n)) b++;
        int rc = t->spm_by_score ? spm_chunk(t, s + a, b - a, o, sc)
                                 : pgd__bpe_chars(t, s + a, b - a, o, sc);
        if (rc) return rc;
        a = b;
    }
    return 0;
}

static int spm_chunk(const pgd_tokenizer *t, const char *s, size_t n, pgd_tok_out *o,
                     pgd_tok_scratch *sc) {
    if (n == 0) return 0;
    if (n > INT32_MAX / 4) return PGD_ERANGE;
    char *mem = pgd__tok_scratch_get(sc, n * sizeof(spm_sym) + 3 * n * sizeof(bigram));
    if (!mem) return PGD_ENOMEM;
    spm_sym *sy = (spm_sym *)mem;
    bigram *h = (bigram *)(mem + n * sizeof(spm_sym));
    int32_t ns = 0;
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        int l = pgd__utf8_seq_len(u[i]);
        if (l == 0) l = 1;
        if ((size_t)l > n - i) l = (int)(n - i);
        sy[ns] = (spm_sym){ns - 1, i + (size_t)l < n ? ns + 1 : -1, (uint32_t)i, (uint32_t)l};
        ns++;
        i += (size_t)l;
    }
    size_t nh = 0;
    for (int32_t i = 1; i < ns; i++) try_bigram(t, s, sy, i - 1, i, h, &nh);
    while (nh > 0) {
        bigram b;
        pgd__heap_pop(h, &nh, &b, sizeof b, big_before);
        spm_sym *l = &sy[b.left], *r = &sy[b.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != b.size) continue;
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) sy[r->next].prev = b.left;
        try_bigram(t, s, sy, l->prev, b.left, h, &nh);
        try_bigram(t, s, sy, b.left, l->next, h, &nh);
    }
    for (int32_t i = 0; i >= 0; i = sy[i].next) {
        int32_t id = pgd__tok_lookup(t, s + sy[i].start, sy[i].n);
        if (id >= 0) {
            pgd__tok_emit(o, id);
            continue;
        }
        for (uint32_t k = 0; k < sy[i].n; k++) {
            int32_t b = t->byte_tok[u[sy[i].start + k]];
            if (b >= 0) pgd__tok_emit(o, b);
            else if (t->unk >= 0) pgd__tok_emit(o, t->unk);
        }
    }
    return 0;
}
