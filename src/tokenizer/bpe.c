/* Rank-ordered BPE merging (Hugging Face semantics): repeatedly apply the lowest-ranked merge,
 * the leftmost occurrence first. A binary heap of candidate pairs is checked lazily on pop,
 * so a word of n symbols costs O(n log n). Used for byte-level BPE words and for
 * SentencePiece vocabularies loaded from a tokenizer.json (merges by rank, byte fallback). */
#include "tokenizer/tok_internal.h"

#include <string.h>

#include "tokenizer/unicode.h"

typedef struct sym {
    int32_t id;         /* token id; -1: unknown piece (byte fallback); -2: merged away */
    int32_t prev, next; /* neighbours in the word, -1 at the ends */
    uint32_t start, len; /* bytes of the piece in the word (for byte fallback) */
} sym;

typedef struct cand {
    int32_t rank;
    int32_t pos;  /* left symbol */
    int32_t a, b; /* ids of the pair when pushed; stale if they changed */
    int32_t merged;
} cand;

static bool cand_less(const void *xv, const void *yv) {
    const cand *x = xv, *y = yv;
    return x->rank < y->rank || (x->rank == y->rank && x->pos < y->pos);
}

static void try_pair(const pgd_tokenizer *t, const sym *s, int32_t pos, cand *h, size_t *nh) {
    if (pos < 0) return;
    int32_t nx = s[pos].next;
    if (nx < 0 || s[pos].id < 0 || s[nx].id < 0) return;
    int32_t merged;
    int32_t rank = pgd__tok_pair_find(t, s[pos].id, s[nx].id, &merged);
    if (rank < 0) return;
    const cand c = {rank, pos, s[pos].id, s[nx].id, merged};
    pgd__heap_push(h, nh, &c, sizeof c, cand_less);
}

/* Byte fallback for a piece with no token: its bytes as <0xXX> / byte-level tokens, else unk. */
static void emit_unknown(const pgd_tokenizer *t, const unsigned char *w, const sym *s,
                         pgd_tok_out *o) {
    bool all = true;
    for (uint32_t k = 0; k < s->len; k++) all &= t->byte_tok[w[s->start + k]] >= 0;
    if (all) {
        for (uint32_t k = 0; k < s->len; k++) pgd__tok_emit(o, t->byte_tok[w[s->start + k]]);
    } else if (t->unk >= 0) {
        pgd__tok_emit(o, t->unk);
    }
}

/* Merges the symbols s[0..n) (a linked list in order) and emits the result. */
static int merge_and_emit(const pgd_tokenizer *t, const unsigned char *w, sym *s, int32_t n,
                          cand *h, pgd_tok_out *o) {
    size_t nh = 0;
    for (int32_t i = 0; i + 1 < n; i++) try_pair(t, s, i, h, &nh);
    while (nh > 0) {
        cand c;
        pgd__heap_pop(h, &nh, &c, sizeof c, cand_less);
        sym *l = &s[c.pos];
        if (l->id != c.a || l->next < 0) continue;
        sym *r = &s[l->next];
        if (r->id != c.b) continue;
        l->id = c.merged;
        l->len += r->len;
        r->id = -2;
        l->next = r->next;
        if (r->next >= 0) s[r->next].prev = c.pos;
        try_pair(t, s, l->prev, h, &nh);
        try_pair(t, s, c.pos, h, &nh);
    }
    for (int32_t i = 0; i >= 0; i = s[i].next) {
        if (s[i].id >= 0) pgd__tok_emit(o, s[i].id);
        else emit_unknown(t, w, &s[i], o);
    }
    return 0;
}

int pgd__bpe_word(const pgd_tokenizer *t, const unsigned char *w, size_t n, pgd_tok_out *o,
                  pgd_tok_scratch *sc) {
    if (n == 0) return 0;
    if (n == 1) {
        int32_t id = t->byte_tok[w[0]];
        if (id >= 0) pgd__tok_emit(o, id);
        else if (t->unk >= 0) pgd__tok_emit(o, t->unk);
        return 0;
    }
    if (n > INT32_MAX / 4) return PGD_ERANGE;
    size_t need = n * sizeof(sym) + 3 * n * sizeof(cand) + 2 * n;
    char *mem = pgd__tok_scratch_get(sc, need);
    if (!mem) return PGD_ENOMEM;
    sym *s = (sym *)mem;
    cand *h = (cand *)(mem + n * sizeof(sym));
    if (t->ignore_merges) {
        /* HF's ignore_merges: a word that is itself a token is not split */
        char *bl = mem + n * sizeof(sym) + 3 * n * sizeof(cand);
        size_t k = 0;
        for (size_t i = 0; i < n; i++)
            k += (size_t)pgd__utf8_encode(pgd__bytelevel_cp(w[i]), bl + k);
        int32_t id = pgd__tok_lookup(t, bl, k);
        if (id >= 0) {
            pgd__tok_emit(o, id);
            return 0;
        }
    }
    /* a byte whose character the vocabulary lacks: without an unknown token HF's BPE leaves it
       out of the word (its neighbours may merge across it); with one it stays, as unk */
    int32_t ns = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = t->byte_tok[w[i]];
        if (id < 0 && t->unk < 0) continue;
        s[ns] = (sym){id, ns - 1, -1, (uint32_t)i, 1};
        if (ns > 0) s[ns - 1].next = ns;
        ns++;
    }
    if (ns == 0) return 0;
    return merge_and_emit(t, w, s, ns, h, o);
}

/* SentencePiece vocabulary with rank merges (tokenizer.json "BPE" + byte_fallback): symbols are
 * UTF-8 characters; a character without a token falls back to its bytes. */
int pgd__bpe_chars(const pgd_tokenizer *t, const char *str, size_t n, pgd_tok_out *o,
                   pgd_tok_scratch *sc) {
    if (n == 0) return 0;
    if (n > INT32_MAX / 4) return PGD_ERANGE;
    const unsigned char *w = (const unsigned char *)str;
    char *mem = pgd__tok_scratch_get(sc, n * sizeof(sym) + 3 * n * sizeof(cand));
    if (!mem) return PGD_ENOMEM;
    sym *s = (sym *)mem;
    cand *h = (cand *)(mem + n * sizeof(sym));
    int32_t ns = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int l = pgd__utf8_decode(w + i, n - i, &cp);
        int32_t id = (cp & PGD_UNI_INVALID) ? -1 : pgd__tok_lookup(t, str + i, (size_t)l);
        s[ns] = (sym){id, ns - 1, -1, (uint32_t)i, (uint32_t)l};
        if (ns > 0) s[ns - 1].next = ns;
        ns++;
        i += (size_t)l;
    }
    return merge_and_emit(t, w, s, ns, h, o);
}
