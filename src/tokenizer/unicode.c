/* UTF-8 decoding, character classes and NFC for the tokenizers. The tables are generated
 * (unicode_tables.c); this file only searches them and runs the normalisation algorithm of
 * UAX #15 (decompose, reorder by combining class, recompose). */
#include "tokenizer/unicode.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "util/status.h"

int pgd__utf8_seq_len(unsigned char c) {
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) return 2;
    if (c >= 0xE0 && c <= 0xEF) return 3;
    if (c >= 0xF0 && c <= 0xF4) return 4;
    return 0;
}

/* The character at u[0..n): its length (1..4) when complete and well formed, else minus the
 * length of its maximal subpart (the longest start of a well-formed sequence it begins with; at
 * least 1 byte). UTF-8's narrowed second-byte ranges rule out overlongs, surrogates and code
 * points past U+10FFFF. */
static int wf_char(const unsigned char *u, size_t n) {
    unsigned char c = u[0];
    int need = pgd__utf8_seq_len(c);
    if (need == 1) return 1;
    if (need == 0) return -1;
    int ok = 1;
    while (ok < need && (size_t)ok < n) {
        unsigned char b = u[ok], lo = 0x80, hi = 0xBF;
        if (ok == 1) {
            if (c == 0xE0) lo = 0xA0;
            else if (c == 0xED) hi = 0x9F;
            else if (c == 0xF0) lo = 0x90;
            else if (c == 0xF4) hi = 0x8F;
        }
        if (b < lo || b > hi) break;
        ok++;
    }
    return ok == need ? need : -ok;
}

bool pgd__utf8_valid(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        int l = wf_char(u + i, n - i);
        if (l < 0) return false;
        i += (size_t)l;
    }
    return true;
}

size_t pgd__utf8_incomplete_tail(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        unsigned char c = u[n - back];
        if ((c & 0xC0) == 0x80) continue; /* continuation: look further back */
        return pgd__utf8_seq_len(c) > (int)back && wf_char(u + n - back, back) == -(int)back
                   ? back
                   : 0;
    }
    return 0;
}

size_t pgd__utf8_lossy(const char *s, size_t n, char *out) {
    const unsigned char *u = (const unsigned char *)s;
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        int l = wf_char(u + i, n - i);
        if (l > 0) {
            if (out) memmove(out + k, s + i, (size_t)l); /* may overlap: see the header */
            k += (size_t)l;
            i += (size_t)l;
        } else {
            if (out) memcpy(out + k, "\xEF\xBF\xBD", 3);
            k += 3;
            i += (size_t)-l;
        }
    }
    return k;
}

int pgd__utf8_decode(const unsigned char *s, size_t n, uint32_t *cp) {
    unsigned char c = s[0];
    int len = pgd__utf8_seq_len(c);
    if (len == 1) {
        *cp = c;
        return 1;
    }
    if (len == 0 || (size_t)len > n) goto invalid;
    uint32_t v = c & (0x7F >> len);
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) goto invalid;
        v = (v << 6) | (s[i] & 0x3F);
    }
    /* overlong 3/4-byte forms, surrogates, beyond U+10FFFF */
    if ((len == 3 && v < 0x800) || (len == 4 && (v < 0x10000 || v > 0x10FFFF)) ||
        (v >= 0xD800 && v <= 0xDFFF))
        goto invalid;
    *cp = v;
    return len;
invalid:
    *cp = PGD_UNI_INVALID | c;
    return 1;
}

int pgd__utf8_encode(uint32_t cp, char *out) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

static uint32_t range_lookup(const pgd_uni_range *r, int n, uint32_t cp) {
    int lo = 0, hi = n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (cp < r[mid].first) hi = mid - 1;
        else if (cp > r[mid].last) lo = mid + 1;
        else return r[mid].value;
    }
    return 0;
}

/* ASCII is most of the text: answer it from a small table. */
static const unsigned char ascii_flags[128] = {
    ['\t'] = PGD_UNI_SPACE, ['\n'] = PGD_UNI_SPACE, ['\v'] = PGD_UNI_SPACE,
    ['\f'] = PGD_UNI_SPACE, ['\r'] = PGD_UNI_SPACE, [' '] = PGD_UNI_SPACE,
    ['0'] = PGD_UNI_NUMBER, ['1'] = PGD_UNI_NUMBER, ['2'] = PGD_UNI_NUMBER,
    ['3'] = PGD_UNI_NUMBER, ['4'] = PGD_UNI_NUMBER, ['5'] = PGD_UNI_NUMBER,
    ['6'] = PGD_UNI_NUMBER, ['7'] = PGD_UNI_NUMBER, ['8'] = PGD_UNI_NUMBER,
    ['9'] = PGD_UNI_NUMBER,
#define UP_ (PGD_UNI_LETTER | PGD_UNI_UPPERISH)
#define LO_ (PGD_UNI_LETTER | PGD_UNI_LOWERISH)
    ['A'] = UP_, ['B'] = UP_, ['C'] = UP_, ['D'] = UP_, ['E'] = UP_, ['F'] = UP_, ['G'] = UP_,
    ['H'] = UP_, ['I'] = UP_, ['J'] = UP_, ['K'] = UP_, ['L'] = UP_, ['M'] = UP_, ['N'] = UP_,
    ['O'] = UP_, ['P'] = UP_, ['Q'] = UP_, ['R'] = UP_, ['S'] = UP_, ['T'] = UP_, ['U'] = UP_,
    ['V'] = UP_, ['W'] = UP_, ['X'] = UP_, ['Y'] = UP_, ['Z'] = UP_,
    ['a'] = LO_, ['b'] = LO_, ['c'] = LO_, ['d'] = LO_, ['e'] = LO_, ['f'] = LO_, ['g'] = LO_,
    ['h'] = LO_, ['i'] = LO_, ['j'] = LO_, ['k'] = LO_, ['l'] = LO_, ['m'] = LO_, ['n'] = LO_,
    ['o'] = LO_, ['p'] = LO_, ['q'] = LO_, ['r'] = LO_, ['s'] = LO_, ['t'] = LO_, ['u'] = LO_,
    ['v'] = LO_, ['w'] = LO_, ['x'] = LO_, ['y'] = LO_, ['z'] = LO_,
#undef UP_
#undef LO_
};

unsigned pgd__uni_flags(uint32_t cp) {
    if (cp < 128) return ascii_flags[cp];
    if (cp & PGD_UNI_INVALID) return 0;
    return range_lookup(pgd__uni_flag_ranges, pgd__uni_n_flag_ranges, cp);
}

/* The BMP's categories, one byte each, filled from the ranges once. */
uint8_t pgd__uni_gcp_bmp[0x10000];
static pthread_once_t gcp_once = PTHREAD_ONCE_INIT;

static void gcp_init(void) {
    for (int i = 0; i < pgd__uni_n_gcp_ranges && pgd__uni_gcp_ranges[i].first < 0x10000; i++) {
        const pgd_uni_range *r = &pgd__uni_gcp_ranges[i];
        uint32_t last = r->last < 0xFFFF ? r->last : 0xFFFF;
        memset(pgd__uni_gcp_bmp + r->first, (int)r->value, last - r->first + 1);
    }
}

void pgd__uni_gcp_init(void) { pthread_once(&gcp_once, gcp_init); }

unsigned pgd__uni_gcp(uint32_t cp) {
    if (cp < 0x10000) {
        pgd__uni_gcp_init();
        return pgd__uni_gcp_bmp[cp];
    }
    if (cp & PGD_UNI_INVALID) return 0;
    return range_lookup(pgd__uni_gcp_ranges, pgd__uni_n_gcp_ranges, cp);
}

uint32_t pgd__uni_fold_cp(uint32_t cp) {
    int lo = 0, hi = pgd__uni_n_fold - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (cp < pgd__uni_fold[mid].cp) hi = mid - 1;
        else if (cp > pgd__uni_fold[mid].cp) lo = mid + 1;
        else return pgd__uni_fold[mid].fold;
    }
    return cp;
}

int pgd__uni_case_orbit(uint32_t cp, uint32_t *out, int max) {
    uint32_t f = pgd__uni_fold_cp(cp);
    int n = 0;
    if (n < max) out[n++] = f;
    /* the first pair folding to f, then every one after it */
    int lo = 0, hi = pgd__uni_n_fold;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (pgd__uni_unfold[mid].fold < f) lo = mid + 1;
        else hi = mid;
    }
    for (int i = lo; i < pgd__uni_n_fold && pgd__uni_unfold[i].fold == f && n < max; i++)
        out[n++] = pgd__uni_unfold[i].cp;
    return n;
}

unsigned pgd__uni_ccc(uint32_t cp) {
    if (cp < 0x300 || (cp & PGD_UNI_INVALID)) return 0;
    return range_lookup(pgd__uni_ccc_ranges, pgd__uni_n_ccc_ranges, cp);
}

int pgd__uni_is_nfc_quick(const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        if (p[i] < 0xCC) { /* below U+0300 (or an invalid byte): NFC-stable */
            i++;
            continue;
        }
        uint32_t cp;
        i += (size_t)pgd__utf8_decode(p + i, n - i, &cp);
        if (pgd__uni_flags(cp) & PGD_UNI_NFC_CHECK) return 0;
    }
    return 1;
}

/* ---- NFC ---- */

enum { SBASE = 0xAC00, LBASE = 0x1100, VBASE = 0x1161, TBASE = 0x11A7 };
enum { LCOUNT = 19, VCOUNT = 21, TCOUNT = 28, NCOUNT = VCOUNT * TCOUNT, SCOUNT = LCOUNT * NCOUNT };

static const pgd_uni_decomp *find_decomp(uint32_t cp) {
    int lo = 0, hi = pgd__uni_n_decomp - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (cp < pgd__uni_decomp[mid].cp) hi = mid - 1;
        else if (cp > pgd__uni_decomp[mid].cp) lo = mid + 1;
        else return &pgd__uni_decomp[mid];
    }
    return NULL;
}

static uint32_t compose_pair(uint32_t a, uint32_t b) {
    if (a >= LBASE && a < LBASE + LCOUNT && b >= VBASE && b < VBASE + VCOUNT)
        return SBASE + ((a - LBASE) * VCOUNT + (b - VBASE)) * TCOUNT;
    if (a >= SBASE && a < SBASE + SCOUNT && (a - SBASE) % TCOUNT == 0 && b > TBASE &&
        b < TBASE + TCOUNT)
        return a + (b - TBASE);
    int lo = 0, hi = pgd__uni_n_comp - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        const pgd_uni_comp *c = &pgd__uni_comp[mid];
        if (a < c->a || (a == c->a && b < c->b)) hi = mid - 1;
        else if (a > c->a || b > c->b) lo = mid + 1;
        else return c->cp;
    }
    return 0;
}

/* Appends the full canonical decomposition of cp to buf (grown as needed). */
static int decompose(uint32_t cp, uint32_t **buf, size_t *n, size_t *cap) {
    uint32_t tmp[3];
    int nt = 0;
    if (cp >= SBASE && cp < SBASE + SCOUNT) {
        uint32_t si = cp - SBASE;
        tmp[nt++] = LBASE + si / NCOUNT;
        tmp[nt++] = VBASE + (si % NCOUNT) / TCOUNT;
        if (si % TCOUNT) tmp[nt++] = TBASE + si % TCOUNT;
    } else {
        const pgd_uni_decomp *d = (cp & PGD_UNI_INVALID) ? NULL : find_decomp(cp);
        if (d) {
            int rc = decompose(d->a, buf, n, cap);
            if (rc == 0 && d->b) rc = decompose(d->b, buf, n, cap);
            return rc;
        }
        tmp[nt++] = cp;
    }
    if (*n + (size_t)nt > *cap) {
        size_t nc = *cap * 2 + 16;
        uint32_t *nb = realloc(*buf, nc * sizeof *nb);
        if (!nb) return PGD_ENOMEM;
        *buf = nb;
        *cap = nc;
    }
    for (int i = 0; i < nt; i++) (*buf)[(*n)++] = tmp[i];
    return 0;
}

int pgd__uni_nfc(const char *s, size_t len, char **out, size_t *out_len) {
    const unsigned char *p = (const unsigned char *)s;
    size_t cap = len + 16, n = 0;
    uint32_t *cps = malloc(cap * sizeof *cps);
    if (!cps) return PGD_ENOMEM;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        i += (size_t)pgd__utf8_decode(p + i, len - i, &cp);
        if (decompose(cp, &cps, &n, &cap) != 0) {
            free(cps);
            return PGD_ENOMEM;
        }
    }
    /* canonical ordering: stable insertion sort of each run of non-starters */
    for (size_t i = 1; i < n; i++) {
        unsigned cc = pgd__uni_ccc(cps[i]);
        if (cc == 0) continue;
        size_t j = i;
        uint32_t c = cps[i];
        while (j > 0 && pgd__uni_ccc(cps[j - 1]) > cc) {
            cps[j] = cps[j - 1];
            j--;
        }
        cps[j] = c;
    }
    /* canonical composition (UAX #15 reference algorithm) */
    if (n > 0) {
        size_t starter = 0, w = 1;
        unsigned last_cc = pgd__uni_ccc(cps[0]) ? 256 : 0;
        for (size_t i = 1; i < n; i++) {
            uint32_t c = cps[i];
            unsigned cc = pgd__uni_ccc(c);
            uint32_t comp = (cps[starter] & PGD_UNI_INVALID) ? 0 : compose_pair(cps[starter], c);
            if (comp && (last_cc < cc || last_cc == 0) && (last_cc != 256)) {
                cps[starter] = comp;
                continue;
            }
            if (cc == 0) starter = w;
            last_cc = cc;
            cps[w++] = c;
        }
        n = w;
    }
    char *o = malloc(n * 4 + 1);
    if (!o) {
        free(cps);
        return PGD_ENOMEM;
    }
    size_t ol = 0;
    for (size_t i = 0; i < n; i++) {
        if (cps[i] & PGD_UNI_INVALID) o[ol++] = (char)(cps[i] & 0xFF);
        else ol += (size_t)pgd__utf8_encode(cps[i], o + ol);
    }
    o[ol] = 0;
    free(cps);
    *out = o;
    *out_len = ol;
    return 0;
}
