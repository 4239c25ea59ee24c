/* Pre-tokenizers: hand-written matchers equivalent to the regexes of GPT-2 (also SmolLM2, after
 * splitting off every digit), Llama 3, Qwen2 and Mistral's Tekken, with the leftmost-first
 * alternation and backtracking of the regex engines (Oniguruma in HF tokenizers, fancy-regex in
 * tiktoken) made explicit. */
#include "tokenizer/tok_internal.h"

#include "tokenizer/unicode.h"

enum {
    L = PGD_UNI_LETTER, N = PGD_UNI_NUMBER, S = PGD_UNI_SPACE,
    UP = PGD_UNI_UPPERISH, LO = PGD_UNI_LOWERISH,
};

typedef struct text_cps {
    const char *s;        /* the text */
    const uint32_t *cp;   /* (n) code points (PGD_UNI_INVALID | byte for invalid bytes) */
    const uint8_t *fl;    /* (n) L/N/S flags */
    const uint32_t *off;  /* (n + 1) byte offset of each code point */
    pgd_pretok_fn fn;
    void *ctx;
} text_cps;

static int emit(const text_cps *t, size_t a, size_t b) {
    return t->fn(t->ctx, t->s + t->off[a], t->off[b] - t->off[a]);
}

/* 's|'t|'re|'ve|'m|'ll|'d, optionally case-insensitive: length matched at pos (0 if none). */
static size_t contraction(const text_cps *t, size_t pos, size_t end, bool icase) {
    if (t->cp[pos] != '\'' || pos + 1 >= end) return 0;
    uint32_t c1 = t->cp[pos + 1];
    if (icase) {
        if (c1 >= 'A' && c1 <= 'Z') c1 += 32;
        if (c1 == 0x17F) c1 = 's'; /* LATIN SMALL LETTER LONG S case-folds to 's' */
    }
    if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
    if (pos + 2 >= end) return 0;
    uint32_t c2 = t->cp[pos + 2];
    if (icase && c2 >= 'A' && c2 <= 'Z') c2 += 32;
    if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return 3;
    return 0;
}

/* Whitespace tail shared by both regexes: \s+(?!\S)|\s+ (with newline_rule: \s*[\r\n]+ first). */
static int whitespace(const text_cps *t, size_t *pos, size_t end, bool newline_rule) {
    size_t p = *pos, q = p, last_nl = 0;
    while (q < end && (t->fl[q] & S)) {
        if (t->cp[q] == '\r' || t->cp[q] == '\n') last_nl = q + 1;
        q++;
    }
    size_t stop;
    if (newline_rule && last_nl) stop = last_nl;
    else if (q - p > 1 && q < end) stop = q - 1; /* leave the last space to the next word */
    else if (q > p) stop = q;
    else stop = p + 1; /* no alternative matches: a lone character */
    *pos = stop;
    return emit(t, p, stop);
}

/*  ?[^\s\p{L}\p{N}]+ and then [\r\n]* (Llama 3, Qwen2) or [\r\n/]* (Tekken: slash) at pos: the
 * end of the match, or 0 if there is none. */
static size_t punct_run(const text_cps *t, size_t pos, size_t end, bool slash) {
    size_t p = pos + (t->cp[pos] == ' ');
    if (p >= end || (t->fl[p] & (L | N | S))) return 0;
    size_t q = p + 1;
    while (q < end && !(t->fl[q] & (L | N | S))) q++;
    while (q < end && (t->cp[q] == '\r' || t->cp[q] == '\n' || (slash && t->cp[q] == '/'))) q++;
    return q;
}

/* Emits [*pos, q) when an earlier alternative matched (q > 0), else the whitespace ones
 * (\s*[\r\n]+|\s+(?!\S)|\s+); moves *pos past the piece. */
static int emit_or_space(const text_cps *t, size_t *pos, size_t q, size_t end) {
    if (!q) return whitespace(t, pos, end, true);
    int rc = emit(t, *pos, q);
    *pos = q;
    return rc;
}

/* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static int split_gpt2(const text_cps *t, size_t pos, size_t end) {
    while (pos < end) {
        size_t k = contraction(t, pos, end, false);
        if (k) {
            int rc = emit(t, pos, pos + k);
            if (rc) return rc;
            pos += k;
            continue;
        }
        size_t p = pos + (t->cp[pos] == ' ' && pos + 1 < end);
        unsigned f = t->fl[p];
        if (p < end && !(t->cp[pos] == ' ' && p == pos)) {
            unsigned cls = (f & L) ? L : (f & N) ? N : (f & S) ? 0 : 8;
            if (cls) {
                size_t q = p + 1;
                if (cls == 8)
                    while (q < end && !(t->fl[q] & (L | N | S))) q++;
                else
                    while (q < end && (t->fl[q] & cls)) q++;
                int rc = emit(t, pos, q);
                if (rc) return rc;
                pos = q;
                continue;
            }
        }
        int rc = whitespace(t, &pos, end, false);
        if (rc) return rc;
    }
    return 0;
}

/* (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max_digits}|
 *  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
static int split_llama3(const text_cps *t, size_t pos, size_t end, size_t max_digits) {
    while (pos < end) {
        size_t k = contraction(t, pos, end, true);
        if (k) {
            int rc = emit(t, pos, pos + k);
            if (rc) return rc;
            pos += k;
            continue;
        }
        uint32_t c = t->cp[pos];
        unsigned f = t->fl[pos];
        size_t q = 0;
        if (f & L) {
            q = pos + 1;
        } else if (c != '\r' && c != '\n' && !(f & N) && pos + 1 < end && (t->fl[pos + 1] & L)) {
            q = pos + 2;
        }
        if (q) {
            while (q < end && (t->fl[q] & L)) q++;
        } else if (f & N) {
            q = pos + 1;
            while (q < end && q - pos < max_digits && (t->fl[q] & N)) q++;
        } else {
            q = punct_run(t, pos, end, false);
        }
        int rc = emit_or_space(t, &pos, q, end);
        if (rc) return rc;
    }
    return 0;
}

/* End of [UP]*[LO]+ from s (UP: [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}], LO: [\p{Ll}\p{Lm}\p{Lo}\p{M}]),
 * or 0 if it does not match there: the greedy UP run gives back characters until an LO one
 * follows (Lm, Lo and marks are in both sets), which LO+ then extends as far as it goes. */
static size_t upper_lower(const text_cps *t, size_t s, size_t end) {
    size_t u = s;
    while (u < end && (t->fl[u] & UP)) u++;
    for (size_t k = u + 1; k-- > s;)
        if (k < end && (t->fl[k] & LO)) {
            size_t q = k + 1;
            while (q < end && (t->fl[q] & LO)) q++;
            return q;
        }
    return 0;
}

/* Tekken (tekken.json's pattern; Mistral Nemo, Small 3, Ministral):
 * [^\r\n\p{L}\p{N}]?[UP]*[LO]+|[^\r\n\p{L}\p{N}]?[UP]+[LO]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|
 * \s*[\r\n]+|\s+(?!\S)|\s+  -- no contractions; the optional lead is any character but
 * \r, \n, a letter or a digit (a space, punctuation, a mark). */
static int split_tekken(const text_cps *t, size_t pos, size_t end) {
    while (pos < end) {
        uint32_t c = t->cp[pos];
        unsigned f = t->fl[pos];
        bool lead = c != '\r' && c != '\n' && !(f & (L | N)) && pos + 1 < end;
        size_t q = lead ? upper_lower(t, pos + 1, end) : 0; /* the lead taken first, then not */
        if (!q) q = upper_lower(t, pos, end);
        if (!q) { /* [UP]+[LO]*: no LO follows the UP run here, or the first alternative had */
            size_t s = lead && (t->fl[pos + 1] & UP) ? pos + 1 : (f & UP) ? pos : end;
            if (s < end) {
                q = s;
                while (q < end && (t->fl[q] & UP)) q++;
            }
        }
        if (!q && (f & N)) q = pos + 1;
        if (!q) q = punct_run(t, pos, end, true);
        int rc = emit_or_space(t, &pos, q, end);
        if (rc) return rc;
    }
    return 0;
}

int pgd__pretok_fast(pgd_tok_pre pre, const char *s, size_t n, pgd_pretok_fn fn, void *ctx,
                     pgd_tok_scratch *sc) {
    if (n == 0) return 0;
    if (pre == PGD_PRE_NONE) return fn(ctx, s, n);
    if (n >= UINT32_MAX) return PGD_ERANGE;
    char *mem = pgd__tok_scratch_get(sc, n * 4 + (n + 1) * 4 + n + 1);
    if (!mem) return PGD_ENOMEM;
    uint32_t *cp = (uint32_t *)mem;
    uint32_t *off = cp + n;
    uint8_t *fl = (uint8_t *)(off + n + 1);
    const unsigned char *u = (const unsigned char *)s;
    size_t m = 0;
    for (size_t i = 0; i < n;) {
        off[m] = (uint32_t)i;
        if (u[i] < 0x80) {
            cp[m] = u[i];
            fl[m] = (uint8_t)pgd__uni_flags(u[i]);
            i++;
        } else {
            i += (size_t)pgd__utf8_decode(u + i, n - i, &cp[m]);
            fl[m] = (uint8_t)(pgd__uni_flags(cp[m]) & (L | N | S | UP | LO));
        }
        m++;
    }
    off[m] = (uint32_t)n;
    fl[m] = 0; /* sentinel: lets matchers read one past a range's end */
    text_cps t = {s, cp, fl, off, fn, ctx};
    switch (pre) {
    case PGD_PRE_GPT2: return split_gpt2(&t, 0, m);
    case PGD_PRE_LLAMA3: return split_llama3(&t, 0, m, 3);
    case PGD_PRE_QWEN2: return split_llama3(&t, 0, m, 1);
    case PGD_PRE_TEKKEN: return split_tekken(&t, 0, m);
    case PGD_PRE_SMOLLM: {
        /* Digits(individual_digits=true): every \p{N} is its own piece; the GPT-2 regex then
         * runs on the text between them */
        size_t a = 0;
        while (a < m) {
            size_t b = a;
            while (b < m && !(fl[b] & N)) b++;
            int rc = split_gpt2(&t, a, b);
            if (rc) return rc;
            if (b < m) {
                rc = emit(&t, b, b + 1);
                if (rc) return rc;
                b++;
            }
            a = b;
        }
        return 0;
    }
    default: return fn(ctx, s, n);
    }
}
