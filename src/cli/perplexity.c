/* `pagoda perplexity`: llama-perplexity's measurement of a model on a text -- the perplexity over
 * non-overlapping windows of --ctx-size tokens, each window scoring only its second half -- and,
 * with --kl-divergence, the KL divergence of this run's next-token distributions from the ones a
 * reference run saved (--kl-divergence-base FILE, in the format below).
 *
 * Base file (little-endian, the host's order; version 1):
 *   char     magic[8]   "PAGODAKL"
 *   uint32   version, n_vocab, n_ctx, n_chunk, first (= n_ctx / 2)
 *   int32    bos        the token put at each window's position 0 (-1: none, tokens as they are)
 *   uint32   reserved   0
 *   int32    tokens[n_chunk * n_ctx]   the text's ids as tokenized (before BOS substitution)
 *   float32  log_probs[n_chunk][n_ctx - 1 - first][n_vocab]
 * log_probs[c][j] is the log-softmax of the logits at position first + j of window c (predicting
 * its token first + j + 1), computed as max + log(sum(exp(x - max))) in double and rounded to
 * float32. llama.cpp stores these as uint16 over the top 16 nats of each row; float32 costs twice
 * the bytes and makes the KL of a run against its own base exactly 0. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend/cpu/pool.h"
#include "backend/cpu/quant.h"
#include "cli/cli.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "util/clock.h"
#include "util/mapfile.h"
#include "util/options.h"

#define BASE_MAGIC "PAGODAKL"
#define BASE_VERSION 1u
#define BASE_HEADER_BYTES (8 + 7 * 4)
#define MAX_CTX (1 << 20)

typedef struct ppl_opts {
    pgd_engine_opts eng; /* the engine and model options (util/options.h) */
    const char *file;    /* -f: the text */
    const char *base;    /* --kl-divergence-base: written, or read with --kl-divergence */
    long n_ctx;          /* -c: window length (llama.cpp's default 512) */
    long n_chunks;       /* --chunks: the most windows; -1: all */
    long n_batch;        /* -b: tokens per forward pass (capped at n_ctx) */
    long int8_act;       /* --int8-act: -1 leaves PAGODA_INT8_ACT's choice, else 0 or 1 */
    bool ctx_set, kl;
} ppl_opts;

static void usage(FILE *f) {
    fprintf(f,
            "usage: pagoda perplexity -m MODEL -f TEXT [-c N] [--chunks K] [-b B] [-t T]\n"
            "                         [--kl-divergence-base FILE [--kl-divergence]]\n"
            "                         [--int8-act 0|1] [engine and model options]\n"
            "Perplexity of a text as llama-perplexity measures it: the text is tokenized whole\n"
            "(BOS as the model adds it), cut into non-overlapping windows of N tokens, each\n"
            "window's position 0 set to BOS, and the tokens of each window's second half scored\n"
            "(positions N/2 .. N-2 predicting N/2+1 .. N-1). Prints the running PPL per window,\n"
            "[1]x,[2]y,..., then 'Final estimate: PPL = X +/- Y'.\n"
            "  -f, --file TEXT     the text (at least 2 windows of tokens)\n"
            "  -c, --ctx-size N    window length in tokens (default 512)\n"
            "  --chunks K          score only the first K windows (default: all)\n"
            "  -b, --batch-size B  tokens per forward pass (default 512; at most N)\n"
            "  --kl-divergence-base FILE  without --kl-divergence: save this run's\n"
            "                      log-probabilities of every scored position to FILE (float32;\n"
            "                      src/cli/perplexity.c documents the format)\n"
            "  --kl-divergence     read FILE instead and run this model on its tokens (-f may\n"
            "                      be left out; given, it must tokenize to the same ids): PPL,\n"
            "                      KL divergence, Delta p and same-top-token statistics against\n"
            "                      the saved run, as llama-perplexity --kl-divergence prints them\n"
            "  --int8-act 0|1      1: 8-bit activations for quantized matmuls; 0: F32 (the\n"
            "                      reference); default: $PAGODA_INT8_ACT's choice\n"
            "Engine and model options:\n");
    pgd_opt_help(f, pgd_engine_opt_table, pgd_engine_opt_count, PGD_CMD_PERPLEXITY);
}

/* Whether a is one of this command's own options that take a value. */
static bool takes_value(const char *a) {
    static const char *const names[] = {"-f", "--file", "-c", "--ctx-size", "--chunks", "-b",
                                        "--batch-size", "--kl-divergence-base", "--int8-act"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(a, names[i])) return true;
    return false;
}

/* 0, 1 after --help, or -1 after one line on stderr. o->eng is freed by the caller. */
static int parse(int argc, char **argv, ppl_opts *o) {
    *o = (ppl_opts){.n_ctx = 512, .n_chunks = -1, .n_batch = 512, .int8_act = -1};
    if (pgd_engine_opts_init(&o->eng, PGD_CMD_PERPLEXITY)) return -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 1;
        }
        if (!strcmp(a, "--kl-divergence")) {
            o->kl = true;
            continue;
        }
        int orc = pgd_opt_parse_arg(&o->eng, pgd_engine_opt_table, pgd_engine_opt_count,
                                    PGD_CMD_PERPLEXITY, argc, argv, &i);
        if (orc < 0) return -1;
        if (orc) continue;
        if (!v) {
            fprintf(stderr, takes_value(a) ? "pagoda: option %s needs a value\n"
                                           : "pagoda: unknown option '%s' (see --help)\n", a);
            return -1;
        }
        int rc = 0;
        if (!strcmp(a, "-f") || !strcmp(a, "--file")) {
            o->file = v;
        } else if (!strcmp(a, "--kl-divergence-base")) {
            o->base = v;
        } else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) {
            rc = pgd_cli_parse_long(v, 3, MAX_CTX, &o->n_ctx);
            o->ctx_set = true;
        } else if (!strcmp(a, "--chunks")) {
            rc = pgd_cli_parse_long(v, 1, 1L << 30, &o->n_chunks);
        } else if (!strcmp(a, "-b") || !strcmp(a, "--batch-size")) {
            rc = pgd_cli_parse_long(v, 1, MAX_CTX, &o->n_batch);
        } else if (!strcmp(a, "--int8-act")) {
            rc = pgd_cli_parse_long(v, 0, 1, &o->int8_act);
        } else {
            fprintf(stderr, "pagoda: unknown option '%s' (see --help)\n", a);
            return -1;
        }
        if (rc) {
            fprintf(stderr, "pagoda: invalid value '%s' for %s\n", v, a);
            return -1;
        }
        i++;
    }
    if (o->kl && !o->base) {
        fprintf(stderr, "pagoda: --kl-divergence needs --kl-divergence-base FILE (the saved "
                        "reference run)\n");
        return -1;
    }
    if (!o->kl && !o->file) {
        fprintf(stderr, "pagoda: perplexity needs a text: -f FILE\n");
        return -1;
    }
    return 0;
}

/* Running sums of the KL comparison (llama.cpp's kl_divergence_result). */
typedef struct kl_sums {
    double nll, nll2, nll_base, nll_base2, nll_nll_base;
    double kld, kld2, p_diff, p_diff2, p_diff4;
    long same_top, count;
} kl_sums;

typedef struct ppl_run {
    const ppl_opts *o;
    pgd_model *model;
    pgd_pool *pool;
    pgd_session sess;
    bool have_sess;
    int32_t *tokens;          /* (n_tokens) the text's ids, or the base file's */
    size_t n_tokens;
    int32_t n_vocab, n_ctx, first, n_scored, n_chunk;
    int32_t bos;              /* put at each window's position 0; -1: none */
    int32_t *win;             /* (n_ctx) one window, BOS substituted */
    float *lp;                /* (n_vocab) this run's log-probs at one position */
    float *lb;                /* (n_vocab) the base's (KL) */
    float *kld_v, *dp_v;      /* (n_chunk * n_scored) each position's KL and Delta p (KL) */
    FILE *bf;                 /* the base file: written, or read (KL) */
    bool bf_writing;
    double nll, nll2;         /* perplexity: sums of -log p and its square, in double */
    long count;
    kl_sums k;
} ppl_run;

/* One logits row: lp = log-softmax(x) rounded to float32 (the max-subtracted exponentials
 * summed in double); returns the row's log-sum-exp. */
static double log_softmax(const float *x, int32_t nv, float *lp) {
    float mx = x[0];
    for (int32_t i = 1; i < nv; i++)
        if (x[i] > mx) mx = x[i];
    double sum = 0;
    for (int32_t i = 0; i < nv; i++) sum += expf(x[i] - mx);
    double lse = (double)mx + log(sum);
    for (int32_t i = 0; i < nv; i++) lp[i] = (float)((double)x[i] - lse);
    return lse;
}

static int32_t argmax(const float *v, int32_t n) {
    int32_t im = 0;
    for (int32_t i = 1; i < n; i++)
        if (v[i] > v[im]) im = i;
    return im;
}

/* Scores one position: x its logits, tok the token that follows. 0, or -1 after a message (the
 * base file could not be written or read). */
static int score(ppl_run *r, const float *x, int32_t tok, long idx) {
    int32_t nv = r->n_vocab;
    double lse = log_softmax(x, nv, r->lp);
    if (!r->o->kl) {
        double v = lse - (double)x[tok];
        r->nll += v;
        r->nll2 += v * v;
        r->count++;
        if (r->bf && fwrite(r->lp, sizeof(float), (size_t)nv, r->bf) != (size_t)nv) {
            fprintf(stderr, "pagoda: %s: write failed: %s\n", r->o->base, strerror(errno));
            return -1;
        }
        return 0;
    }
    if (fread(r->lb, sizeof(float), (size_t)nv, r->bf) != (size_t)nv) {
        fprintf(stderr, "pagoda: %s: truncated (log-probs of scored position %ld missing)\n",
                r->o->base, idx);
        return -1;
    }
    /* Both sides from their float32 log-probs, so a run against its own base gives exactly 0.
     * Every term counts (llama.cpp drops those with a base log-prob below -16, the range its
     * uint16 rows keep). */
    const float *lp = r->lp, *lb = r->lb;
    kl_sums *k = &r->k;
    double nll = -(double)lp[tok], nll_b = -(double)lb[tok];
    double kl = 0;
    for (int32_t i = 0; i < nv; i++) {
        float pb = expf(lb[i]);
        if (pb > 0) kl += (double)pb * ((double)lb[i] - (double)lp[i]); /* 0 * -inf is no term */
    }
    double p_diff = exp(-nll) - exp(-nll_b);
    k->nll += nll;
    k->nll2 += nll * nll;
    k->nll_base += nll_b;
    k->nll_base2 += nll_b * nll_b;
    k->nll_nll_base += nll * nll_b;
    k->kld += kl;
    k->kld2 += kl * kl;
    k->p_diff += p_diff;
    k->p_diff2 += p_diff * p_diff;
    k->p_diff4 += p_diff * p_diff * p_diff * p_diff;
    k->same_top += argmax(lp, nv) == argmax(lb, nv);
    k->count++;
    r->kld_v[idx] = (float)kl;
    r->dp_v[idx] = (float)p_diff;
    return 0;
}

/* llama.cpp's estimate of a mean and its standard error from sums (none under 11 samples). */
static void mean_err(double sum, double sum2, long n, double *mean, double *err) {
    *mean = n > 0 ? sum / (double)n : 0;
    double var = n > 0 ? sum2 / (double)n - *mean * *mean : 0;
    *err = var > 0 && n > 10 ? sqrt(var / (double)(n - 1)) : 0;
}

static double covariance(double sa, double sb, double sab, long n) {
    if (n < 10) return 0;
    double dn = (double)n;
    return (sab / dn - (sa / dn) * (sb / dn)) / (dn - 1);
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* The value at fraction f of sorted v (n > 0), interpolated between neighbours as llama.cpp's. */
static double percentile(const float *v, size_t n, double f) {
    if (f <= 0) return v[0];
    if (f >= 1) return v[n - 1];
    double p = f * (double)(n - 1);
    size_t ip = (size_t)p;
    p -= (double)ip;
    return (1 - p) * v[ip] + p * v[ip + 1 < n ? ip + 1 : n - 1];
}

static double median(const float *v, size_t n) {
    return n % 2 ? v[n / 2] : 0.5 * ((double)v[n / 2] + (double)v[n / 2 - 1]);
}

/* The KL statistics of each chunk so far, one table row (llama-perplexity's columns). */
static void kl_chunk_row(const kl_sums *k, int32_t chunk) {
    double lq, eq, lb, eb;
    mean_err(k->nll, k->nll2, k->count, &lq, &eq);
    mean_err(k->nll_base, k->nll_base2, k->count, &lb, &eb);
    double cov = covariance(k->nll, k->nll_base, k->nll_nll_base, k->count);
    double ratio_err = sqrt(fmax(0, eq * eq + eb * eb - 2 * cov));
    double kl, kle, mse, msee;
    mean_err(k->kld, k->kld2, k->count, &kl, &kle);
    mean_err(k->p_diff2, k->p_diff4, k->count, &mse, &msee);
    double rms = sqrt(mse), rms_err = rms > 0 ? 0.5 / rms * msee : 0;
    double top = (double)k->same_top / (double)k->count;
    double top_err = k->count > 1 ? sqrt(top * (1 - top) / (double)(k->count - 1)) : 0;
    printf("%4d    %9.4f ± %9.4f    %10.5f ± %10.5f    %10.5f ± %10.5f    %6.3f ± %6.3f %%"
           "    %6.3f ± %6.3f %%\n",
           chunk, exp(lq), exp(lq) * eq, lq - lb, ratio_err, kl, kle, 100 * rms, 100 * rms_err,
           100 * top, 100 * top_err);
}

/* The summary after the last chunk (llama-perplexity's three blocks). */
static void kl_summary(ppl_run *r) {
    const kl_sums *k = &r->k;
    size_t n = (size_t)k->count;
    if (k->count < 100) { /* llama.cpp's rule: no statistics on so few values */
        fprintf(stderr, "pagoda: %ld scored tokens: too few for the summary statistics (100 or "
                        "more; give a longer text or a larger --ctx-size)\n", k->count);
        return;
    }
    qsort(r->kld_v, n, sizeof *r->kld_v, cmp_float);
    qsort(r->dp_v, n, sizeof *r->dp_v, cmp_float);
    double lq, eq, lb, eb;
    mean_err(k->nll, k->nll2, k->count, &lq, &eq);
    mean_err(k->nll_base, k->nll_base2, k->count, &lb, &eb);
    double ppl = exp(lq), ppl_err = ppl * eq, ppl_b = exp(lb), ppl_b_err = ppl_b * eb;
    double cov = covariance(k->nll, k->nll_base, k->nll_nll_base, k->count);
    double ratio = lq - lb, ratio_err = sqrt(fmax(0, eq * eq + eb * eb - 2 * cov));
    double diff_err = sqrt(fmax(0, ppl_err * ppl_err + ppl_b_err * ppl_b_err -
                                       2 * ppl * ppl_b * cov));
    printf("\n====== Perplexity statistics ======\n");
    printf("Mean PPL(Q)                   : %10.6f ± %10.6f\n", ppl, ppl_err);
    printf("Mean PPL(base)                : %10.6f ± %10.6f\n", ppl_b, ppl_b_err);
    printf("Cor(ln(PPL(Q)), ln(PPL(base))): %6.2f%%\n",
           eq > 0 && eb > 0 ? 100 * cov / (eq * eb) : 100.0);
    printf("Mean ln(PPL(Q)/PPL(base))     : %10.6f ± %10.6f\n", ratio, ratio_err);
    printf("Mean PPL(Q)/PPL(base)         : %10.6f ± %10.6f\n", exp(ratio),
           exp(ratio) * ratio_err);
    printf("Mean PPL(Q)-PPL(base)         : %10.6f ± %10.6f\n", ppl - ppl_b, diff_err);

    double kl, kle;
    mean_err(k->kld, k->kld2, k->count, &kl, &kle);
    const float *v = r->kld_v;
    printf("\n====== KL divergence statistics ======\n");
    printf("Mean    KLD: %10.6f ± %10.6f\n", kl, kle);
    printf("Maximum KLD: %10.6f\n", (double)v[n - 1]);
    static const struct { const char *name; double f; } kq[] = {
        {"99.9%", 0.999}, {"99.0%", 0.99}, {"95.0%", 0.95}, {"90.0%", 0.9}, {NULL, 0.5},
        {"10.0%", 0.1},   {" 5.0%", 0.05}, {" 1.0%", 0.01}, {" 0.1%", 0.001},
    };
    for (size_t i = 0; i < sizeof kq / sizeof kq[0]; i++) {
        if (!kq[i].name) printf("Median  KLD: %10.6f\n", median(v, n));
        else printf("%s   KLD: %10.6f\n", kq[i].name, percentile(v, n, kq[i].f));
    }
    printf("Minimum KLD: %10.6f\n", (double)v[0]);

    double dp, dpe, mse, msee;
    mean_err(k->p_diff, k->p_diff2, k->count, &dp, &dpe);
    const float *d = r->dp_v;
    printf("\n====== Token probability statistics ======\n");
    printf("Mean    Δp: %6.3f ± %5.3f %%\n", 100 * dp, 100 * dpe);
    printf("Maximum Δp: %6.3f%%\n", 100.0 * d[n - 1]);
    static const struct { const char *name; double f; } pq[] = {
        {"99.9%", 0.999}, {"99.0%", 0.99}, {"95.0%", 0.95}, {"90.0%", 0.9}, {"75.0%", 0.75},
        {NULL, 0.5},      {"25.0%", 0.25}, {"10.0%", 0.1},  {" 5.0%", 0.05}, {" 1.0%", 0.01},
        {" 0.1%", 0.001},
    };
    for (size_t i = 0; i < sizeof pq / sizeof pq[0]; i++) {
        if (!pq[i].name) printf("Median  Δp: %6.3f%%\n", 100 * median(d, n));
        else printf("%s   Δp: %6.3f%%\n", pq[i].name, 100 * percentile(d, n, pq[i].f));
    }
    printf("Minimum Δp: %6.3f%%\n", 100.0 * d[0]);
    mean_err(k->p_diff2, k->p_diff4, k->count, &mse, &msee);
    double rms = sqrt(mse);
    printf("RMS Δp    : %6.3f ± %5.3f %%\n", 100 * rms, rms > 0 ? 100 * 0.5 / rms * msee : 0.0);
    double top = (double)k->same_top / (double)n;
    printf("Same top p: %6.3f ± %5.3f %%\n", 100 * top,
           100 * sqrt(top * (1 - top) / (double)(n - 1)));
}

/* Reads the base file's header and tokens (r->bf left at the first log-prob row); checks the
 * file's size against them. 0, or -1 after one line naming the file. */
static int base_open(ppl_run *r) {
    const char *path = r->o->base;
    r->bf = fopen(path, "rb");
    if (!r->bf) {
        fprintf(stderr, "pagoda: %s: cannot open: %s\n", path, strerror(errno));
        return -1;
    }
    char magic[8];
    uint32_t h[7];
    if (fread(magic, 1, 8, r->bf) != 8 || memcmp(magic, BASE_MAGIC, 8) ||
        fread(h, sizeof h[0], 7, r->bf) != 7) {
        fprintf(stderr, "pagoda: %s: not a log-probability file of pagoda perplexity "
                        "--kl-divergence-base\n", path);
        return -1;
    }
    if (h[0] != BASE_VERSION) {
        fprintf(stderr, "pagoda: %s: format version %u; this pagoda reads version %u\n", path,
                h[0], BASE_VERSION);
        return -1;
    }
    uint32_t nv = h[1], nc = h[2], nk = h[3], first = h[4];
    int32_t bos = (int32_t)h[5];
    if (nv < 1 || nv > (1u << 24) || nc < 3 || nc > MAX_CTX || nk < 1 || nk > (1u << 30) ||
        first != nc / 2 || bos < -1 || bos >= (int32_t)nv) {
        fprintf(stderr, "pagoda: %s: corrupt header (n_vocab %u, n_ctx %u, n_chunk %u)\n", path,
                nv, nc, nk);
        return -1;
    }
    uint64_t n_tok = (uint64_t)nk * nc, n_scored = nc - 1 - first;
    uint64_t want = BASE_HEADER_BYTES + 4 * n_tok + 4 * (uint64_t)nk * n_scored * nv;
    struct stat st;
    if (fstat(fileno(r->bf), &st) || (uint64_t)st.st_size != want) {
        fprintf(stderr, "pagoda: %s: %lld bytes where its header promises %llu (truncated or "
                        "not this format)\n", path, (long long)st.st_size,
                (unsigned long long)want);
        return -1;
    }
    r->tokens = malloc(n_tok * sizeof *r->tokens);
    if (!r->tokens) {
        fprintf(stderr, "pagoda: %s: out of memory\n", path);
        return -1;
    }
    if (fread(r->tokens, sizeof *r->tokens, n_tok, r->bf) != n_tok) {
        fprintf(stderr, "pagoda: %s: read error\n", path);
        return -1;
    }
    for (uint64_t i = 0; i < n_tok; i++)
        if (r->tokens[i] < 0 || (uint32_t)r->tokens[i] >= nv) {
            fprintf(stderr, "pagoda: %s: token %llu (%d) is outside its vocabulary (%u)\n", path,
                    (unsigned long long)i, r->tokens[i], nv);
            return -1;
        }
    r->n_tokens = n_tok;
    r->n_vocab = (int32_t)nv;
    r->n_ctx = (int32_t)nc;
    r->n_chunk = (int32_t)nk;
    r->bos = bos;
    return 0;
}

/* Tokenizes the text file into *ids (malloc'd). 0, or -1 after one line naming the file. */
static int tokenize_file(const pgd_model *m, const char *path, int32_t **ids, size_t *n) {
    *ids = NULL;
    *n = 0;
    if (!m->tok) {
        fprintf(stderr, "pagoda: %s has no tokenizer: it cannot read a text\n", m->path);
        return -1;
    }
    char *text = NULL;
    size_t len = 0;
    pgd_err err = {{0}};
    if (pgd_read_file(path, &text, &len, &err)) {
        fprintf(stderr, "pagoda: %s\n", err.msg);
        return -1;
    }
    int rc = PGD_OK;
    size_t cap = len + 8, got = 0;
    if (len == 0) {
        fprintf(stderr, "pagoda: %s: the text is empty\n", path);
        rc = PGD_EINVAL;
    } else if (!(*ids = malloc(cap * sizeof **ids))) {
        rc = PGD_ENOMEM;
    } else {
        bool bos = pgd_tokenizer_add_bos(m->tok) && pgd_tokenizer_bos(m->tok) >= 0;
        rc = pgd_tokenizer_encode(m->tok, text, len, bos, false, *ids, cap, &got);
        if (rc == PGD_ERANGE) { /* more ids than bytes + 8: grow once to the count needed */
            int32_t *g = realloc(*ids, got * sizeof **ids);
            rc = g ? pgd_tokenizer_encode(m->tok, text, len, bos, false, g, got, &got)
                   : PGD_ENOMEM;
            if (g) *ids = g;
        }
        if (rc) fprintf(stderr, "pagoda: %s: cannot tokenize: %s\n", path, pgd_status_str(rc));
    }
    free(text);
    if (rc) {
        free(*ids);
        *ids = NULL;
        return -1;
    }
    *n = got;
    return 0;
}

/* The reference run's file: header, tokens. 0, or -1 after a message. */
static int base_create(ppl_run *r) {
    const char *path = r->o->base;
    r->bf = fopen(path, "wb");
    if (!r->bf) {
        fprintf(stderr, "pagoda: %s: cannot create: %s\n", path, strerror(errno));
        return -1;
    }
    r->bf_writing = true;
    uint32_t h[7] = {BASE_VERSION,         (uint32_t)r->n_vocab, (uint32_t)r->n_ctx,
                     (uint32_t)r->n_chunk, (uint32_t)r->first,   (uint32_t)r->bos, 0};
    size_t n_tok = (size_t)r->n_chunk * (size_t)r->n_ctx;
    if (fwrite(BASE_MAGIC, 1, 8, r->bf) != 8 || fwrite(h, sizeof h[0], 7, r->bf) != 7 ||
        fwrite(r->tokens, sizeof *r->tokens, n_tok, r->bf) != n_tok) {
        fprintf(stderr, "pagoda: %s: write failed: %s\n", path, strerror(errno));
        return -1;
    }
    return 0;
}

/* Runs every window through the model and scores its second half. 0, or -1 after a message. */
static int run_windows(ppl_run *r) {
    const ppl_opts *o = r->o;
    int32_t nv = r->n_vocab, nc = r->n_ctx, nb = r->sess.max_batch;
    double t0 = pgd_now_s();
    if (o->kl)
        printf("chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence"
               "              Δp RMS            Same top p\n");
    for (int32_t c = 0; c < r->n_chunk; c++) {
        const int32_t *src = r->tokens + (size_t)c * (size_t)nc;
        memcpy(r->win, src, (size_t)nc * sizeof *r->win);
        if (r->bos >= 0) r->win[0] = r->bos;
        r->sess.n_past = 0; /* a fresh context: positions 0.. overwrite the cache in order */
        for (int32_t b0 = 0; b0 < nc; b0 += nb) {
            int32_t n = nc - b0 < nb ? nc - b0 : nb;
            bool scored = b0 + n > r->first; /* logits only where a scored position lies */
            int rc = pgd_session_forward(&r->sess, r->win + b0, n, scored);
            if (rc) {
                fprintf(stderr, "pagoda: %s: forward pass failed: %s\n", o->eng.model,
                        pgd_status_str(rc));
                return -1;
            }
            if (!scored) continue;
            for (int32_t p = b0 > r->first ? b0 : r->first; p < b0 + n && p < nc - 1; p++) {
                long idx = (long)c * r->n_scored + (p - r->first);
                if (score(r, r->sess.logits + (size_t)(p - b0) * (size_t)nv, src[p + 1], idx))
                    return -1;
            }
        }
        if (c == 0) {
            double t = pgd_now_s() - t0;
            fprintf(stderr, "perplexity: %.2f seconds per pass - ETA %.2f minutes\n", t,
                    t * r->n_chunk / 60.0);
        }
        if (o->kl) {
            kl_chunk_row(&r->k, c + 1);
        } else {
            printf("[%d]%.4f,", c + 1, exp(r->nll / (double)r->count));
        }
        fflush(stdout);
    }
    double t = pgd_now_s() - t0;
    fprintf(stderr, "perplexity: %d windows of %d tokens in %.2f s (%.1f tokens/s)\n", r->n_chunk,
            nc, t, (double)r->n_chunk * nc / t);
    return 0;
}

static void ppl_final(const ppl_run *r) {
    printf("\n");
    double nll = r->nll / (double)r->count, var = r->nll2 / (double)r->count - nll * nll;
    double ppl = exp(nll);
    if (var > 0) {
        printf("Final estimate: PPL = %.4f +/- %.5f\n", ppl, sqrt(var / (double)(r->count - 1)) *
                                                                ppl);
    } else {
        fprintf(stderr, "pagoda: unexpected negative standard deviation of log(prob) (PPL %.4f)\n",
                ppl);
    }
}

static int run(const ppl_opts *o) {
    ppl_run r = {.o = o, .bos = -1};
    int exit_code = 1;
    bool remove_base = false;
    pgd_err err = {{0}};
    if (o->kl && base_open(&r)) goto done;
    if (o->kl && o->ctx_set && o->n_ctx != r.n_ctx) {
        fprintf(stderr, "pagoda: %s: saved over windows of %d tokens; --ctx-size is %ld\n",
                o->base, r.n_ctx, o->n_ctx);
        goto done;
    }
    if (!o->kl) r.n_ctx = (int32_t)o->n_ctx;
    if (o->file) { /* a missing or empty text fails before the model loads */
        struct stat st;
        if (stat(o->file, &st)) {
            fprintf(stderr, "pagoda: %s: cannot open: %s\n", o->file, strerror(errno));
            goto done;
        }
        if (S_ISDIR(st.st_mode)) {
            fprintf(stderr, "pagoda: %s: is a directory, not a text\n", o->file);
            goto done;
        }
        if (S_ISREG(st.st_mode) && st.st_size == 0) {
            fprintf(stderr, "pagoda: %s: the text is empty\n", o->file);
            goto done;
        }
    }
    if (o->int8_act >= 0) pgd_cpu_set_int8_act(o->int8_act != 0); /* before any weight is used */

    pgd_model_opts mo;
    pgd_cli_model_opts(&o->eng, &mo);
    mo.n_ctx = r.n_ctx; /* the KV cache holds one window */
    if (pgd_model_load(o->eng.model, &mo, &r.model, &err)) {
        fprintf(stderr, "pagoda: %s\n", err.msg);
        goto done;
    }
    const pgd_model *m = r.model;
    if (m->cfg.n_ctx < r.n_ctx) {
        fprintf(stderr, "pagoda: %s: windows of %d tokens exceed the model's context (%d)\n",
                o->eng.model, r.n_ctx, m->cfg.n_ctx);
        goto done;
    }
    int32_t model_bos = -1;
    if (m->tok && pgd_tokenizer_add_bos(m->tok)) model_bos = pgd_tokenizer_bos(m->tok);
    if (o->kl) {
        if (r.n_vocab != m->cfg.n_vocab) {
            fprintf(stderr, "pagoda: %s: saved with a vocabulary of %d tokens; %s has %d\n",
                    o->base, r.n_vocab, o->eng.model, m->cfg.n_vocab);
            goto done;
        }
        if (m->tok && model_bos != r.bos) {
            fprintf(stderr, "pagoda: %s: saved with BOS %d at each window's start; %s's is %d\n",
                    o->base, r.bos, o->eng.model, model_bos);
            goto done;
        }
        if (o->file) { /* the text must give the same ids */
            int32_t *ids;
            size_t n_ids;
            if (tokenize_file(m, o->file, &ids, &n_ids)) goto done;
            size_t i = 0;
            while (i < r.n_tokens && i < n_ids && ids[i] == r.tokens[i]) i++;
            free(ids);
            if (i < r.n_tokens) {
                fprintf(stderr, "pagoda: %s: saved from another token sequence than %s's "
                                "(they differ at token %zu)\n", o->base, o->file, i);
                goto done;
            }
        }
        if (o->n_chunks > 0 && o->n_chunks < r.n_chunk) r.n_chunk = (int32_t)o->n_chunks;
    } else {
        if (tokenize_file(m, o->file, &r.tokens, &r.n_tokens)) goto done;
        r.n_vocab = m->cfg.n_vocab;
        r.bos = model_bos;
        if (r.n_tokens < 2 * (size_t)r.n_ctx) {
            fprintf(stderr, "pagoda: %s: %zu tokens; perplexity over windows of %d needs at "
                            "least %d (2 windows)\n", o->file, r.n_tokens, r.n_ctx, 2 * r.n_ctx);
            goto done;
        }
        size_t n_max = r.n_tokens / (size_t)r.n_ctx;
        r.n_chunk = (int32_t)(o->n_chunks > 0 && (size_t)o->n_chunks < n_max ? (size_t)o->n_chunks
                                                                              : n_max);
    }
    r.first = r.n_ctx / 2;
    r.n_scored = r.n_ctx - 1 - r.first;
    for (size_t i = 0; i < (size_t)r.n_chunk * (size_t)r.n_ctx; i++)
        if (r.tokens[i] >= m->cfg.n_vocab) { /* a tokenizer larger than the LM head */
            fprintf(stderr, "pagoda: %s: token id %d is outside the model's vocabulary (%d)\n",
                    o->eng.model, r.tokens[i], m->cfg.n_vocab);
            goto done;
        }

    long nt = o->eng.threads ? o->eng.threads : sysconf(_SC_NPROCESSORS_ONLN);
    if (nt < 1) nt = 1;
    pgd_kv_dtype kv_type, v_type;
    pgd_engine_opts_kv_types(&o->eng, &kv_type, &v_type);
    int32_t nb = (int32_t)(o->n_batch < r.n_ctx ? o->n_batch : r.n_ctx);
    if (pgd_pool_create((int)nt, &r.pool, &err) ||
        pgd_session_init_kv2(&r.sess, m, r.pool, nb, (pgd_type)kv_type, (pgd_type)v_type, &err)) {
        fprintf(stderr, "pagoda: %s\n", err.msg);
        goto done;
    }
    r.have_sess = true;
    size_t n_pos = (size_t)r.n_chunk * (size_t)r.n_scored;
    r.win = malloc((size_t)r.n_ctx * sizeof *r.win);
    r.lp = malloc((size_t)r.n_vocab * sizeof *r.lp);
    if (o->kl) {
        r.lb = malloc((size_t)r.n_vocab * sizeof *r.lb);
        r.kld_v = malloc(n_pos * sizeof *r.kld_v);
        r.dp_v = malloc(n_pos * sizeof *r.dp_v);
    }
    if (!r.win || !r.lp || (o->kl && (!r.lb || !r.kld_v || !r.dp_v))) {
        fprintf(stderr, "pagoda: out of memory\n");
        goto done;
    }
    fprintf(stderr, "perplexity: %s: %zu tokens, %d windows of %d (scoring %d each), batch %d, "
                    "%ld threads, KV %s/%s, %s activations%s\n",
            o->eng.model, r.n_tokens, r.n_chunk, r.n_ctx, r.n_scored, nb, nt,
            pgd_type_name((pgd_type)kv_type), pgd_type_name((pgd_type)v_type),
            pgd_cpu_int8_act_name(),
            o->eng.weights_f32 ? ", weights F32" : "");
    if (!o->kl && o->base) {
        remove_base = true; /* until every row is written */
        if (base_create(&r)) goto done;
    }
    if (run_windows(&r)) goto done;
    if (o->kl) {
        kl_summary(&r);
    } else {
        ppl_final(&r);
    }
    if (r.bf_writing) {
        FILE *f = r.bf;
        r.bf = NULL;
        if (fclose(f)) {
            fprintf(stderr, "pagoda: %s: write failed: %s\n", o->base, strerror(errno));
            goto done;
        }
        fprintf(stderr, "perplexity: saved the log-probabilities of %zu positions to %s\n", n_pos,
                o->base);
    }
    remove_base = false;
    exit_code = 0;
done:
    fflush(stdout);
    if (r.bf) fclose(r.bf);
    if (remove_base) unlink(o->base); /* a partial file must never serve as a reference */
    free(r.win);
    free(r.lp);
    free(r.lb);
    free(r.kld_v);
    free(r.dp_v);
    free(r.tokens);
    if (r.have_sess) pgd_session_free(&r.sess);
    pgd_pool_free(r.pool);
    pgd_model_free(r.model);
    return exit_code;
}

int pgd_cli_perplexity(int argc, char **argv) {
    ppl_opts o;
    int prc = parse(argc, argv, &o);
    int rc = prc ? (prc > 0 ? 0 : 2) : run(&o);
    pgd_engine_opts_free(&o.eng);
    return rc;
}
