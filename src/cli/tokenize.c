/* `pagoda tokenize` and `pagoda detokenize`: the tokenizer on the command line, with a JSONL
 * batch mode for the integration tests and a throughput benchmark. Loads only the tokenizer,
 * so vocabulary-only GGUF files work. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "tokenizer/tokenizer.h"
#include "util/clock.h"
#include "util/mapfile.h"

/* Encodes into *ids (grown as needed). */
static int encode(const pgd_tokenizer *t, const char *s, size_t n, bool bos, bool special,
                  int32_t **ids, size_t *cap, size_t *n_out) {
    for (;;) {
        int rc = pgd_tokenizer_encode_special(t, s, n, bos, special, *ids, *cap, n_out);
        if (rc != PGD_ERANGE) return rc;
        int32_t *ni = realloc(*ids, sizeof(int32_t) * *n_out);
        if (!ni) return PGD_ENOMEM;
        *ids = ni;
        *cap = *n_out;
    }
}

static void print_ids(const int32_t *ids, size_t n) {
    for (size_t i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
    putchar('\n');
}

/* JSON strings with every byte kept: cJSON's strings end at a NUL, and a text may hold U+0000. */

/* Prints s[0..n) as a JSON string literal (escapes as cJSON writes them; other bytes as is). */
static void print_json_string(const char *s, size_t n) {
    putchar('"');
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        switch (c) {
        case '"': fputs("\\\"", stdout); break;
        case '\\': fputs("\\\\", stdout); break;
        case '\b': fputs("\\b", stdout); break;
        case '\f': fputs("\\f", stdout); break;
        case '\n': fputs("\\n", stdout); break;
        case '\r': fputs("\\r", stdout); break;
        case '\t': fputs("\\t", stdout); break;
        default:
            if (c < 0x20) printf("\\u%04x", c);
            else putchar(c);
        }
    }
    putchar('"');
}

static int hex4(const char *s, const char *end, unsigned *v) {
    if (end - s < 4) return -1;
    *v = 0;
    for (int k = 0; k < 4; k++) {
        char c = s[k];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        *v = *v * 16 + (unsigned)d;
    }
    return 0;
}

/* The JSON string literal that is s[0..n) (surrounding spaces aside) into out (malloc'd; its
 * length in *len, NULs kept); -1 if it is not one. */
static int parse_json_string(const char *s, size_t n, char **out, size_t *len) {
    const char *end = s + n;
    while (s < end && (*s == ' ' || *s == '\t' || *s == '\r')) s++;
    while (end > s && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\r')) end--;
    if (end - s < 2 || *s != '"' || end[-1] != '"') return -1;
    s++, end--;
    char *o = malloc((size_t)(end - s) + 1), *w = o;
    if (!o) return -1;
    while (s < end) {
        char c = *s++;
        if (c == '"') goto bad;
        if (c != '\\') {
            *w++ = c;
            continue;
        }
        if (s >= end) goto bad;
        c = *s++;
        switch (c) {
        case '"': case '\\': case '/': *w++ = c; break;
        case 'b': *w++ = '\b'; break;
        case 'f': *w++ = '\f'; break;
        case 'n': *w++ = '\n'; break;
        case 'r': *w++ = '\r'; break;
        case 't': *w++ = '\t'; break;
        case 'u': {
            unsigned v, lo;
            if (hex4(s, end, &v)) goto bad;
            s += 4;
            if (v >= 0xD800 && v < 0xDC00) { /* a surrogate pair */
                if (end - s < 6 || s[0] != '\\' || s[1] != 'u' || hex4(s + 2, end, &lo) ||
                    lo < 0xDC00 || lo > 0xDFFF)
                    goto bad;
                s += 6;
                v = 0x10000 + ((v - 0xD800) << 10) + (lo - 0xDC00);
            } else if (v >= 0xDC00 && v < 0xE000) {
                goto bad;
            }
            /* UTF-8: at most 4 bytes from 6 characters of input */
            if (v < 0x80) *w++ = (char)v;
            else if (v < 0x800) *w++ = (char)(0xC0 | v >> 6), *w++ = (char)(0x80 | (v & 63));
            else if (v < 0x10000)
                *w++ = (char)(0xE0 | v >> 12), *w++ = (char)(0x80 | (v >> 6 & 63)),
                *w++ = (char)(0x80 | (v & 63));
            else
                *w++ = (char)(0xF0 | v >> 18), *w++ = (char)(0x80 | (v >> 12 & 63)),
                *w++ = (char)(0x80 | (v >> 6 & 63)), *w++ = (char)(0x80 | (v & 63));
            break;
        }
        default: goto bad;
        }
    }
    *w = 0;
    *out = o;
    *len = (size_t)(w - o);
    return 0;
bad:
    free(o);
    return -1;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int count_piece(void *ctx, const char *piece, size_t len) {
    (void)piece, (void)len;
    (*(size_t *)ctx)++;
    return 0;
}

/* Encodes s (or, pieces_only, runs the pre-tokenizer alone) repeatedly for a second, five
 * times; prints the median throughput. */
static int bench(const pgd_tokenizer *t, const char *s, size_t n, bool bos, bool special,
                 bool pieces_only) {
    int32_t *ids = NULL;
    size_t cap = 0, got = 0;
    double mbs[5];
    for (int r = 0; r < 5; r++) {
        double t0 = pgd_now_s(), el;
        long reps = 0;
        do {
            int rc;
            if (pieces_only) got = 0, rc = pgd_tokenizer_pieces(t, s, n, count_piece, &got);
            else rc = encode(t, s, n, bos, special, &ids, &cap, &got);
            if (rc != 0) {
                free(ids);
                return -1;
            }
            reps++;
            el = pgd_now_s() - t0;
        } while (el < 1.0);
        mbs[r] = (double)n * (double)reps / el / 1e6;
    }
    qsort(mbs, 5, sizeof mbs[0], cmp_double);
    printf("%.2f MB/s (median of 5; %zu bytes -> %zu %s)\n", mbs[2], n, got,
           pieces_only ? "pieces" : "tokens");
    free(ids);
    return 0;
}

/* Where print_piece writes: how many pieces so far, and whether to spell bytes in GPT-2's
 * byte-level alphabet (as HF's pre_tokenize_str does after a ByteLevel step). */
typedef struct piece_out {
    size_t n;
    bool byte_level;
} piece_out;

/* GPT-2's byte-to-unicode map: the code point byte b is written as. */
static unsigned byte_char(unsigned char b) {
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174) return b;
    unsigned n = 0; /* the bytes not kept, numbered in order from 256 */
    for (unsigned k = 0; k < b; k++)
        if (!((k >= 33 && k <= 126) || (k >= 161 && k <= 172) || k >= 174)) n++;
    return 256 + n;
}

/* Prints a piece as a JSON string, comma-separated. */
static int print_piece(void *ctx, const char *s, size_t len) {
    piece_out *po = ctx;
    char *p = malloc(2 * len + 1);
    if (!p) return PGD_ENOMEM;
    size_t k = 0;
    if (po->byte_level) {
        for (size_t i = 0; i < len; i++) {
            unsigned c = byte_char((unsigned char)s[i]);
            if (c < 0x80) p[k++] = (char)c;
            else p[k++] = (char)(0xC0 | (c >> 6)), p[k++] = (char)(0x80 | (c & 0x3F));
        }
    } else {
        memcpy(p, s, len);
        k = len;
    }
    if (po->n++) fputs(", ", stdout);
    print_json_string(p, k);
    free(p);
    return 0;
}

/* The pieces of s: the tokenizer's pre-tokenizer, or the split pattern when sr is set. */
static int print_pieces(const pgd_tokenizer *t, const pgd_split_regex *sr, bool byte_level,
                        const char *s, size_t n) {
    piece_out po = {0, byte_level};
    putchar('[');
    int rc = sr ? pgd_split_regex_run(sr, s, n, print_piece, &po)
                : pgd_tokenizer_pieces(t, s, n, print_piece, &po);
    puts("]");
    return rc;
}

static void usage_tokenize(FILE *f) {
    fprintf(f, "usage: pagoda tokenize [-m MODEL] [--no-bos] [--no-special] [--pieces | "
               "--pieces-bytelevel]\n"
               "         [--general-pretok] (TEXT | --file F | --jsonl F | --bench F)\n"
               "       pagoda tokenize --split-regex PATTERN [--split-behavior B] [--invert] "
               "(TEXT | --jsonl F)\n"
               "  MODEL is a GGUF file or a Hugging Face model directory (tokenizer.json).\n"
               "  --jsonl F: each line of F is a JSON string; prints one line of ids per line.\n"
               "  --pieces: prints the pre-tokenizer's pieces instead (a JSON array of strings: "
               "its patterns alone,\n"
               "    no special tokens, no normalization; text that is not UTF-8 is not JSON).\n"
               "  --pieces-bytelevel: the same, each byte written in GPT-2's byte-level alphabet "
               "(always JSON;\n"
               "    what HF's pre_tokenize_str prints for a byte-level pre-tokenizer).\n"
               "  --general-pretok: runs a hand-written pre-tokenizer (GPT-2, SmolLM, Llama 3, "
               "Qwen2, Tekken)\n"
               "    through the general regex engine instead (same pieces; for tests and "
               "benchmarks).\n"
               "  --split-regex PATTERN: no model; the general engine's pieces of HF's "
               "Split(PATTERN, B, invert)\n"
               "    (B: Isolated (default), Removed, MergedWithPrevious, MergedWithNext, "
               "Contiguous).\n"
               "  --bench F: prints the tokenizer's throughput on F in MB/s (with --pieces: the\n"
               "    pre-tokenizer's alone).\n");
}

int pgd_cli_tokenize(int argc, char **argv) {
    const char *model = NULL, *file = NULL, *jsonl = NULL, *bench_file = NULL, *text = NULL;
    const char *split_re = NULL, *split_beh = "Isolated";
    bool no_bos = false, no_special = false, pieces = false, pieces_bl = false, general = false;
    bool invert = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool has_val = i + 1 < argc;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage_tokenize(stdout);
            return 0;
        } else if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && has_val) {
            model = argv[++i];
        } else if (!strcmp(a, "--no-bos")) {
            no_bos = true;
        } else if (!strcmp(a, "--no-special")) {
            no_special = true;
        } else if (!strcmp(a, "--pieces")) {
            pieces = true;
        } else if (!strcmp(a, "--pieces-bytelevel")) {
            pieces = pieces_bl = true;
        } else if (!strcmp(a, "--general-pretok")) {
            general = true;
        } else if (!strcmp(a, "--split-regex") && has_val) {
            split_re = argv[++i];
        } else if (!strcmp(a, "--split-behavior") && has_val) {
            split_beh = argv[++i];
        } else if (!strcmp(a, "--invert")) {
            invert = true;
        } else if (!strcmp(a, "--file") && has_val) {
            file = argv[++i];
        } else if (!strcmp(a, "--jsonl") && has_val) {
            jsonl = argv[++i];
        } else if (!strcmp(a, "--bench") && has_val) {
            bench_file = argv[++i];
        } else if (a[0] == '-' && a[1] != 0 && strcmp(a, "--") != 0) {
            fprintf(stderr, "pagoda tokenize: unknown or incomplete option '%s'\n", a);
            usage_tokenize(stderr);
            return 2;
        } else {
            if (!strcmp(a, "--") && i + 1 < argc) a = argv[++i];
            if (text) {
                fprintf(stderr, "pagoda tokenize: give the text as one argument (quote it)\n");
                return 2;
            }
            text = a;
        }
    }
    if (!!text + !!file + !!jsonl + !!bench_file != 1) {
        usage_tokenize(stderr);
        return 2;
    }
    pgd_err err = {{0}};
    pgd_tokenizer *t = NULL;
    pgd_split_regex *sr = NULL;
    if (split_re) {
        if (file || bench_file || model) {
            fprintf(stderr, "pagoda tokenize: --split-regex takes TEXT or --jsonl F, no model\n");
            return 2;
        }
        if (pgd_split_regex_new(split_re, split_beh, invert, &sr, &err) != 0) {
            fprintf(stderr, "pagoda: %s\n", err.msg);
            return 1;
        }
        pieces = true;
    } else {
        if (!model) model = pgd_cli_default_model();
        if (pgd_tokenizer_load_path(model, &t, &err) != 0) {
            fprintf(stderr, "pagoda: %s\n", err.msg);
            return 1;
        }
        if (general && pgd_tokenizer_use_general_pretok(t, &err) != 0) {
            fprintf(stderr, "pagoda: %s\n", err.msg);
            pgd_tokenizer_free(t);
            return 1;
        }
    }
    bool bl = pieces_bl && (sr || pgd_tokenizer_byte_level(t));
    bool bos = !no_bos, special = !no_special; /* bos: the model's special tokens */
    char *buf = NULL;
    size_t len = 0, cap = 0, n = 0;
    int32_t *ids = NULL;
    int ret = 1;
    const char *in_path = file ? file : jsonl ? jsonl : bench_file;
    if (in_path && pgd_read_file(in_path, &buf, &len, &err) != 0) {
        fprintf(stderr, "pagoda: %s\n", err.msg);
        goto done;
    }
    if (pieces && (text || file) && !bench_file) {
        if (print_pieces(t, sr, bl, text ? text : buf, text ? strlen(text) : len)) goto enc_fail;
    } else if (text) {
        if (encode(t, text, strlen(text), bos, special, &ids, &cap, &n) != 0) goto enc_fail;
        print_ids(ids, n);
    } else if (file) {
        if (encode(t, buf, len, bos, special, &ids, &cap, &n) != 0) goto enc_fail;
        print_ids(ids, n);
    } else if (bench_file) {
        if (bench(t, buf, len, bos, special, pieces) != 0) goto enc_fail;
    } else {
        char *line = buf;
        for (long ln = 1; line < buf + len; ln++) {
            char *eol = memchr(line, '\n', (size_t)(buf + len - line));
            size_t ll = eol ? (size_t)(eol - line) : (size_t)(buf + len - line);
            char *str;
            size_t jl;
            if (parse_json_string(line, ll, &str, &jl) != 0) {
                fprintf(stderr, "pagoda: %s:%ld: not a JSON string\n", jsonl, ln);
                goto done;
            }
            int rc = pieces ? print_pieces(t, sr, bl, str, jl)
                            : encode(t, str, jl, bos, special, &ids, &cap, &n);
            free(str);
            if (rc != 0) goto enc_fail;
            if (!pieces) print_ids(ids, n);
            line = eol ? eol + 1 : buf + len;
        }
    }
    ret = 0;
    goto done;
enc_fail:
    fprintf(stderr, "pagoda: tokenizing failed (out of memory)\n");
done:
    fflush(stdout);
    free(ids);
    free(buf);
    pgd_tokenizer_free(t);
    pgd_split_regex_free(sr);
    return ret;
}

static void usage_detokenize(FILE *f) {
    fprintf(f, "usage: pagoda detokenize [-m MODEL] [--no-special] (IDS... | --jsonl F)\n"
               "  prints the text of the ids (special tokens rendered unless --no-special).\n"
               "  --jsonl F: each line of F is a JSON array of ids; prints one JSON string per "
               "line.\n");
}

int pgd_cli_detokenize(int argc, char **argv) {
    const char *model = NULL, *jsonl = NULL;
    bool no_special = false;
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    int ret = 1;
    pgd_tokenizer *t = NULL;
    char *buf = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage_detokenize(stdout);
            free(ids);
            return 0;
        } else if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && i + 1 < argc) {
            model = argv[++i];
        } else if (!strcmp(a, "--jsonl") && i + 1 < argc) {
            jsonl = argv[++i];
        } else if (!strcmp(a, "--no-special")) {
            no_special = true;
        } else {
            int32_t *more;
            size_t nm;
            if (pgd_cli_parse_ids(a, &more, &nm) != 0) {
                fprintf(stderr, "pagoda detokenize: '%s' is not a list of token ids\n", a);
                free(ids);
                return 2;
            }
            if (n + nm > cap) {
                cap = (n + nm) * 2;
                int32_t *ni = realloc(ids, cap * sizeof *ids);
                if (!ni) {
                    free(more);
                    free(ids);
                    return 1;
                }
                ids = ni;
            }
            if (nm) memcpy(ids + n, more, nm * sizeof *ids);
            n += nm;
            free(more);
        }
    }
    if (!model) model = pgd_cli_default_model();
    pgd_err err = {{0}};
    if (pgd_tokenizer_load_path(model, &t, &err) != 0) {
        fprintf(stderr, "pagoda: %s\n", err.msg);
        goto done;
    }
    if (!jsonl) {
        char *s;
        size_t sl;
        int rc = pgd_tokenizer_decode(t, ids, n, !no_special, &s, &sl);
        if (rc != 0) {
            fprintf(stderr, "pagoda: token id out of range (vocabulary has %d tokens)\n",
                    pgd_tokenizer_n_vocab(t));
            goto done;
        }
        fwrite(s, 1, sl, stdout);
        free(s);
        ret = 0;
        goto done;
    }
    size_t len;
    if (pgd_read_file(jsonl, &buf, &len, &err) != 0) {
        fprintf(stderr, "pagoda: %s\n", err.msg);
        goto done;
    }
    char *line = buf;
    for (long ln = 1; line < buf + len; ln++) {
        char *eol = memchr(line, '\n', (size_t)(buf + len - line));
        size_t ll = eol ? (size_t)(eol - line) : (size_t)(buf + len - line);
        cJSON *j = cJSON_ParseWithLength(line, ll);
        const cJSON *e;
        n = 0;
        bool bad = !cJSON_IsArray(j);
        cJSON_ArrayForEach(e, j) {
            if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble > INT32_MAX) bad = true;
            if (bad) break;
            if (n == cap) {
                cap = cap * 2 + 64;
                int32_t *ni = realloc(ids, cap * sizeof *ids);
                if (!ni) {
                    bad = true;
                    break;
                }
                ids = ni;
            }
            ids[n++] = (int32_t)e->valuedouble;
        }
        cJSON_Delete(j);
        char *s = NULL;
        size_t sl;
        if (bad || pgd_tokenizer_decode(t, ids, n, !no_special, &s, &sl) != 0) {
            fprintf(stderr, "pagoda: %s:%ld: not a JSON array of valid token ids\n", jsonl, ln);
            goto done;
        }
        /* decode's text is valid UTF-8 (ill-formed bytes become U+FFFD, as in HF's decode) */
        print_json_string(s, sl);
        putchar('\n');
        free(s);
        line = eol ? eol + 1 : buf + len;
    }
    ret = 0;
done:
    fflush(stdout);
    free(buf);
    free(ids);
    pgd_tokenizer_free(t);
    return ret;
}
