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

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int bench(const pgd_tokenizer *t, const char *s, size_t n, bool bos, bool special) {
    int32_t *ids = NULL;
    size_t cap = 0, got = 0;
    double mbs[5];
    for (int r = 0; r < 5; r++) {
        double t0 = pgd_now_s(), el;
        long reps = 0;
        do {
            if (encode(t, s, n, bos, special, &ids, &cap, &got) != 0) {
                free(ids);
                return -1;
            }
            reps++;
            el = pgd_now_s() - t0;
        } while (el < 1.0);
        mbs[r] = (double)n * (double)reps / el / 1e6;
    }
    qsort(mbs, 5, sizeof mbs[0], cmp_double);
    printf("%.2f MB/s (median of 5; %zu bytes -> %zu tokens)\n", mbs[2], n, got);
    free(ids);
    return 0;
}

/* Prints a piece of the text as a JSON string, comma-separated (ctx: the text). */
static int print_piece(void *ctx, size_t a, size_t b) {
    const char *s = ctx;
    char *p = malloc(b - a + 1);
    if (!p) return PGD_ENOMEM;
    memcpy(p, s + a, b - a);
    p[b - a] = 0;
    cJSON *j = cJSON_CreateString(p);
    char *out = j ? cJSON_PrintUnformatted(j) : NULL;
    free(p);
    cJSON_Delete(j);
    if (!out) return PGD_ENOMEM;
    printf(a ? ", %s" : "%s", out);
    free(out);
    return 0;
}

static int print_pieces(const pgd_tokenizer *t, const char *s, size_t n) {
    putchar('[');
    int rc = pgd_tokenizer_pieces(t, s, n, print_piece, (void *)s);
    puts("]");
    return rc;
}

static void usage_tokenize(FILE *f) {
    fprintf(f, "usage: pagoda tokenize [-m MODEL] [--no-bos] [--no-special] [--pieces] "
               "(TEXT | --file F | --jsonl F | --bench F)\n"
               "  MODEL is a GGUF file or a Hugging Face model directory (tokenizer.json).\n"
               "  --jsonl F: each line of F is a JSON string; prints one line of ids per line.\n"
               "  --pieces: prints the pre-tokenizer's pieces instead (a JSON array of strings: "
               "its regex alone,\n"
               "    no special tokens, no normalization; text that is not UTF-8 is not JSON).\n"
               "  --bench F: prints the tokenizer's throughput on F in MB/s.\n");
}

int pgd_cli_tokenize(int argc, char **argv) {
    const char *model = NULL, *file = NULL, *jsonl = NULL, *bench_file = NULL, *text = NULL;
    bool no_bos = false, no_special = false, pieces = false;
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
    if (!model) model = pgd_cli_default_model();
    pgd_err err = {{0}};
    pgd_tokenizer *t = NULL;
    if (pgd_tokenizer_load_path(model, &t, &err) != 0) {
        fprintf(stderr, "pagoda: %s\n", err.msg);
        return 1;
    }
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
    if (pieces && (text || file)) {
        if (print_pieces(t, text ? text : buf, text ? strlen(text) : len)) goto enc_fail;
    } else if (text) {
        if (encode(t, text, strlen(text), bos, special, &ids, &cap, &n) != 0) goto enc_fail;
        print_ids(ids, n);
    } else if (file) {
        if (encode(t, buf, len, bos, special, &ids, &cap, &n) != 0) goto enc_fail;
        print_ids(ids, n);
    } else if (bench_file) {
        if (bench(t, buf, len, bos, special) != 0) goto enc_fail;
    } else {
        char *line = buf;
        for (long ln = 1; line < buf + len; ln++) {
            char *eol = memchr(line, '\n', (size_t)(buf + len - line));
            size_t ll = eol ? (size_t)(eol - line) : (size_t)(buf + len - line);
            cJSON *j = cJSON_ParseWithLength(line, ll);
            if (!cJSON_IsString(j)) {
                cJSON_Delete(j);
                fprintf(stderr, "pagoda: %s:%ld: not a JSON string\n", jsonl, ln);
                goto done;
            }
            size_t jl = strlen(j->valuestring);
            int rc = pieces ? print_pieces(t, j->valuestring, jl)
                            : encode(t, j->valuestring, jl, bos, special, &ids, &cap, &n);
            cJSON_Delete(j);
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
        cJSON *str = cJSON_CreateString(s);
        free(s);
        char *js = str ? cJSON_PrintUnformatted(str) : NULL;
        cJSON_Delete(str);
        if (!js) {
            fprintf(stderr, "pagoda: out of memory\n");
            goto done;
        }
        puts(js);
        free(js);
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
