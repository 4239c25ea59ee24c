/* Decoding: token ids back to bytes, whole sequences, and the streaming detokenizer that only
 * ever releases complete UTF-8 characters. */
#include "tokenizer/tok_internal.h"

#include <stdlib.h>
#include <string.h>

#include "tokenizer/unicode.h"

static bool is_special(const pgd_tokenizer *t, int32_t id) {
    return t->tok_type[id] == PGD_TOK_CONTROL || t->tok_type[id] == PGD_TOK_UNKNOWN;
}

/* Decoded bytes of id (borrowed), or NULL when it renders as nothing. */
static const char *piece(const pgd_tokenizer *t, int32_t id, bool render_special, size_t *n) {
    if (is_special(t, id) && !render_special) {
        *n = 0;
        return NULL;
    }
    *n = t->dec_len[id];
    return t->dec_pool + t->dec_off[id];
}

const char *pgd_tokenizer_piece(const pgd_tokenizer *t, int32_t id, size_t *n) {
    *n = 0;
    if (id < 0 || id >= t->n_vocab) return NULL;
    return piece(t, id, false, n);
}

int pgd_tokenizer_token_bytes(const pgd_tokenizer *t, int32_t id, bool render_special,
                              char *buf, size_t cap) {
    if (id < 0 || id >= t->n_vocab) return PGD_EINVAL;
    size_t n;
    const char *p = piece(t, id, render_special, &n);
    if (n > cap || n > INT32_MAX) return PGD_ERANGE;
    if (n) memcpy(buf, p, n);
    return (int)n;
}

/* SentencePiece with a dummy prefix: the first emitted piece loses its leading space. */
static bool drops_first_space(const pgd_tokenizer *t) {
    return t->model == PGD_TOKM_SPM && t->add_space_prefix;
}

int pgd_tokenizer_decode(const pgd_tokenizer *t, const int32_t *ids, size_t n,
                         bool render_special, char **out, size_t *out_len) {
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_vocab) return PGD_EINVAL;
        size_t l;
        piece(t, ids[i], render_special, &l);
        total += l;
    }
    char *s = malloc(total + 1);
    if (!s) return PGD_ENOMEM;
    size_t k = 0;
    bool first = true;
    for (size_t i = 0; i < n; i++) {
        size_t l;
        const char *p = piece(t, ids[i], render_special, &l);
        if (l == 0) continue;
        if (first && drops_first_space(t) && p[0] == ' ' && !is_special(t, ids[i])) p++, l--;
        first = false;
        memcpy(s + k, p, l);
        k += l;
    }
    s[k] = 0;
    if (!pgd__utf8_valid(s, k)) { /* bytes that are no character: U+FFFD, never raw */
        size_t m = pgd__utf8_lossy(s, k, NULL);
        char *c = malloc(m + 1);
        if (!c) {
            free(s);
            return PGD_ENOMEM;
        }
        pgd__utf8_lossy(s, k, c);
        c[m] = 0;
        free(s);
        s = c;
        k = m;
    }
    *out = s;
    *out_len = k;
    return 0;
}

void pgd_detok_init(pgd_detok *d, const pgd_tokenizer *t, bool render_special) {
    memset(d, 0, sizeof *d);
    d->tok = t;
    d->first = true;
    d->render_special = render_special;
}

bool pgd_detok_drops_space(const pgd_detok *d) {
    return d->tok && d->first && drops_first_space(d->tok);
}

int pgd_detok_push(pgd_detok *d, int32_t id, char *out, size_t cap) {
    const pgd_tokenizer *t = d->tok;
    if (id < 0 || id >= t->n_vocab) return PGD_EINVAL;
    size_t l;
    const char *p = piece(t, id, d->render_special, &l);
    if (l == 0) return 0;
    if (d->first && drops_first_space(t) && p[0] == ' ' && !is_special(t, id)) p++, l--;
    d->first = false;
    size_t np = (size_t)d->n_pending;
    if (np + l > cap) return PGD_ERANGE;
    memcpy(out, d->pending, np);
    memcpy(out + np, p, l);
    size_t total = np + l;
    size_t hold = pgd__utf8_incomplete_tail(out, total);
    memcpy(d->pending, out + total - hold, hold);
    d->n_pending = (int)hold;
    size_t r = total - hold;
    if (pgd__utf8_valid(out, r)) return (int)r;
    /* Bytes that are no character (a byte token out of place): each maximal ill-formed subpart
     * becomes U+FFFD, as in the whole text (held bytes are a well-formed start, so no subpart
     * spans two pushes). Converted in place from the end of out. */
    size_t m = pgd__utf8_lossy(out, r, NULL);
    if (m > cap || m > INT32_MAX) return PGD_ERANGE;
    memmove(out + m - r, out, r);
    pgd__utf8_lossy(out + m - r, r, out);
    return (int)m;
}

size_t pgd_detok_cap(const pgd_tokenizer *t) {
    return 3 * ((size_t)t->max_dec_len + sizeof ((pgd_detok *)0)->pending);
}

int pgd_detok_flush(pgd_detok *d, char *out, size_t cap) {
    size_t np = (size_t)d->n_pending;
    if (!np) return 0;
    /* a well-formed start of a character (pgd__utf8_incomplete_tail): one maximal subpart */
    if (cap < 3) return PGD_ERANGE;
    memcpy(out, "\xEF\xBF\xBD", 3);
    d->n_pending = 0;
    return 3;
}
