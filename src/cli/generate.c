/* `pagoda generate` (text in, generated text out; speeds on stderr) and `pagoda logits`
 * (teacher-forced logits of a token sequence, for comparing against reference implementations). */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend/cpu/pool.h"
#include "cli/cli.h"
#include "model/model.h"
#include "sample/sampler.h"
#include "util/mapfile.h"

#define PREFILL_CHUNK 64

typedef struct gen_opts {
    const char *model, *prompt, *file, *ids, *out;
    long n_predict, threads, ctx;
    float temperature, top_p;
    long top_k;
    unsigned long long seed;
    bool seed_set, ignore_eos, print_ids, weights_f32;
} gen_opts;

static void usage_generate(FILE *f) {
    fprintf(f,
            "usage: pagoda generate [-m MODEL] [-p PROMPT | --file F | --ids \"1 2 3\"] [-n N]\n"
            "                       [--temperature T] [--top-p P] [--top-k K] [--seed S]\n"
            "                       [--threads N] [--ctx N] [--ignore-eos] [--print-ids]\n"
            "                       [--weights-f32]\n"
            "Writes only the generated text to stdout; prefill and decode speeds to stderr.\n"
            "  -m MODEL         GGUF file or Hugging Face model directory (default %s)\n"
            "  -p PROMPT        prompt text (BOS is added when the model's metadata says so;\n"
            "                   an empty prompt generates from BOS)\n"
            "  --file F         read the prompt from a file, byte for byte\n"
            "  --ids LIST       the whole prompt as token ids (no BOS added)\n"
            "  -n N             tokens to generate (default 128)\n"
            "  --temperature T  0 is greedy (default 0.8); --top-p (0.95), --top-k (40), --seed\n"
            "  --ignore-eos     keep generating past end-of-generation tokens\n"
            "  --print-ids      print generated token ids instead of text\n"
            "  --weights-f32    dequantize every weight to F32 at load (reference path)\n",
            pgd_cli_default_model());
}

static int parse_gen(int argc, char **argv, gen_opts *o, bool logits_cmd) {
    *o = (gen_opts){.model = pgd_cli_default_model(), .n_predict = 128, .threads = 0,
                    .temperature = 0.8f, .top_p = 0.95f, .top_k = 40};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool has_v = true;
        long l;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage_generate(stdout);
            return 1;
        } else if (!strcmp(a, "--ignore-eos")) {
            o->ignore_eos = true, has_v = false;
        } else if (!strcmp(a, "--print-ids")) {
            o->print_ids = true, has_v = false;
        } else if (!strcmp(a, "--weights-f32")) {
            o->weights_f32 = true, has_v = false;
        } else if (!v) {
            fprintf(stderr, "pagoda: option %s needs a value\n", a);
            return -1;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            o->model = v;
        } else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) {
            o->prompt = v;
        } else if (!strcmp(a, "--file")) {
            o->file = v;
        } else if (!strcmp(a, "--ids")) {
            o->ids = v;
        } else if (!strcmp(a, "--out") && logits_cmd) {
            o->out = v;
        } else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) {
            if (pgd_cli_parse_long(v, 0, 1 << 24, &o->n_predict)) goto bad;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            if (pgd_cli_parse_long(v, 1, 1024, &o->threads)) goto bad;
        } else if (!strcmp(a, "--ctx")) {
            if (pgd_cli_parse_long(v, 1, 1 << 24, &o->ctx)) goto bad;
        } else if (!strcmp(a, "--temperature") || !strcmp(a, "--temp")) {
            if (pgd_cli_parse_float(v, 0, 100, &o->temperature)) goto bad;
        } else if (!strcmp(a, "--top-p")) {
            if (pgd_cli_parse_float(v, 1e-6f, 1, &o->top_p)) goto bad;
        } else if (!strcmp(a, "--top-k")) {
            if (pgd_cli_parse_long(v, 0, 1 << 30, &o->top_k)) goto bad;
        } else if (!strcmp(a, "--seed")) {
            if (pgd_cli_parse_long(v, 0, 0x7fffffffL, &l)) goto bad;
            o->seed = (unsigned long long)l, o->seed_set = true;
        } else {
            fprintf(stderr, "pagoda: unknown option '%s' (see --help)\n", a);
            return -1;
        }
        if (has_v) i++;
        continue;
    bad:
        fprintf(stderr, "pagoda: invalid value '%s' for %s\n", v, a);
        return -1;
    }
    if (!!o->prompt + !!o->file + !!o->ids > 1) {
        fprintf(stderr, "pagoda: give only one of -p, --file and --ids\n");
        return -1;
    }
    return 0;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Loads the model, pool and session; builds the prompt ids. */
typedef struct gen_ctx {
    pgd_model *model;
    pgd_pool *pool;
    pgd_session sess;
    int32_t *prompt;
    size_t n_prompt;
} gen_ctx;

static void gen_free(gen_ctx *g) {
    if (g->sess.model) pgd_session_free(&g->sess);
    pgd_pool_free(g->pool);
    pgd_model_free(g->model);
    free(g->prompt);
    memset(g, 0, sizeof *g);
}

static int gen_setup(const gen_opts *o, gen_ctx *g) {
    memset(g, 0, sizeof *g);
    pgd_err err = {{0}};
    pgd_model_opts mo = {.weights_f32 = o->weights_f32, .n_ctx = (int32_t)o->ctx};
    int rc = pgd_model_load(o->model, &mo, &g->model, &err);
    if (rc) {
        fprintf(stderr, "pagoda: %s\n", err.msg);
        return rc;
    }
    long nt = o->threads ? o->threads : sysconf(_SC_NPROCESSORS_ONLN);
    if (nt < 1) nt = 1;
    if ((rc = pgd_pool_create((int)nt, &g->pool, &err)) ||
        (rc = pgd_session_init(&g->sess, g->model, g->pool, PREFILL_CHUNK, &err))) {
        fprintf(stderr, "pagoda: %s\n", err.msg);
        gen_free(g);
        return rc;
    }
    if (o->ids) {
        if (pgd_cli_parse_ids(o->ids, &g->prompt, &g->n_prompt)) {
            fprintf(stderr, "pagoda: --ids: not a list of token ids\n");
            gen_free(g);
            return PGD_EINVAL;
        }
        for (size_t i = 0; i < g->n_prompt; i++)
            if (g->prompt[i] >= g->model->cfg.n_vocab) {
                fprintf(stderr, "pagoda: --ids: token id %d is outside the vocabulary (%d)\n",
                        g->prompt[i], g->model->cfg.n_vocab);
                gen_free(g);
                return PGD_EINVAL;
            }
        return PGD_OK;
    }
    char *text = NULL;
    size_t len = 0;
    if (o->file) {
        if ((rc = pgd_read_file(o->file, &text, &len, &err))) {
            fprintf(stderr, "pagoda: %s\n", err.msg);
            gen_free(g);
            return rc;
        }
    }
    const char *t = o->file ? text : o->prompt ? o->prompt : "";
    if (!o->file) len = strlen(t);
    size_t cap = len + 8, n = 0;
    g->prompt = malloc(cap * sizeof *g->prompt);
    rc = g->prompt ? pgd_tokenizer_encode(g->model->tok, t, len,
                                          pgd_tokenizer_add_bos(g->model->tok), true, g->prompt,
                                          cap, &n)
                   : PGD_ENOMEM;
    free(text);
    if (rc) {
        fprintf(stderr, "pagoda: cannot tokenize the prompt: %s\n", pgd_status_str(rc));
        gen_free(g);
        return rc;
    }
    g->n_prompt = n;
    return PGD_OK;
}

/* Feeds the prompt in chunks; leaves the last token's logits in sess.logits row 0. */
static int prefill(gen_ctx *g, const int32_t *ids, size_t n) {
    for (size_t i = 0; i < n; i += PREFILL_CHUNK) {
        int32_t c = (int32_t)(n - i < PREFILL_CHUNK ? n - i : PREFILL_CHUNK);
        int rc = pgd_session_forward(&g->sess, ids + i, c, false);
        if (rc) return rc;
    }
    return PGD_OK;
}

int pgd_cli_generate(int argc, char **argv) {
    gen_opts o;
    int prc = parse_gen(argc, argv, &o, false);
    if (prc) return prc > 0 ? 0 : 2;
    gen_ctx g;
    if (gen_setup(&o, &g)) return 1;
    pgd_err err = {{0}};
    const pgd_model_config *c = &g.model->cfg;
    int exit_code = 1;
    pgd_sampler smp = {0};
    pgd_sampler_params sp = {.temperature = o.temperature, .top_p = o.top_p,
                             .top_k = (int32_t)o.top_k,
                             .seed = o.seed_set ? o.seed : (uint64_t)time(NULL) ^ (uint64_t)getpid()};
    if (pgd_sampler_init(&smp, &sp, c->n_vocab, &err)) {
        fprintf(stderr, "pagoda: %s\n", err.msg);
        goto done;
    }
    if (g.n_prompt == 0) {
        fprintf(stderr, "pagoda: the prompt is empty and the model adds no BOS token; "
                        "nothing to generate from\n");
        goto done;
    }
    if ((long)g.n_prompt >= c->n_ctx) {
        fprintf(stderr, "pagoda: the prompt has %zu tokens; the context holds %d\n", g.n_prompt,
                c->n_ctx);
        goto done;
    }
    double t0 = now_s();
    int rc = prefill(&g, g.prompt, g.n_prompt);
    double t1 = now_s();
    if (rc) {
        fprintf(stderr, "pagoda: forward pass failed: %s\n", pgd_status_str(rc));
        goto done;
    }
    pgd_detok dt;
    pgd_detok_init(&dt, g.model->tok, false);
    char buf[1024];
    long n_gen = 0;
    for (; n_gen < o.n_predict; n_gen++) {
        int32_t id = pgd_sampler_sample(&smp, g.sess.logits);
        if (!o.ignore_eos && pgd_tokenizer_is_eog(g.model->tok, id)) break;
        if (o.print_ids) {
            printf(n_gen ? " %d" : "%d", id);
        } else {
            int nb = pgd_detok_push(&dt, id, buf, sizeof buf);
            if (nb > 0) fwrite(buf, 1, (size_t)nb, stdout);
        }
        fflush(stdout);
        if (n_gen + 1 == o.n_predict) {
            n_gen++;
            break;
        }
        if (g.sess.n_past >= c->n_ctx) {
            n_gen++;
            fprintf(stderr, "pagoda: context full (%d tokens)\n", c->n_ctx);
            break;
        }
        if ((rc = pgd_session_forward(&g.sess, &id, 1, false))) {
            fprintf(stderr, "pagoda: forward pass failed: %s\n", pgd_status_str(rc));
            goto done;
        }
    }
    if (o.print_ids) {
        printf("\n");
    } else {
        int nb = pgd_detok_flush(&dt, buf, sizeof buf);
        if (nb > 0) fwrite(buf, 1, (size_t)nb, stdout);
    }
    fflush(stdout);
    double t2 = now_s();
    /* n_gen tokens were sampled; n_gen - 1 of them went through a decode step. */
    long n_dec = n_gen > 1 ? n_gen - 1 : 0;
    fprintf(stderr, "\nprefill: %zu tokens in %.3f s (%.1f tokens/s)\n", g.n_prompt, t1 - t0,
            (double)g.n_prompt / (t1 - t0));
    fprintf(stderr, "decode: %ld tokens in %.3f s (%.1f tokens/s)\n", n_gen, t2 - t1,
            n_dec ? (double)n_dec / (t2 - t1) : 0.0);
    exit_code = 0;
done:
    pgd_sampler_free(&smp);
    gen_free(&g);
    return exit_code;
}

int pgd_cli_logits(int argc, char **argv) {
    gen_opts o;
    int prc = parse_gen(argc, argv, &o, true);
    if (prc) return prc > 0 ? 0 : 2;
    if (!o.ids || !o.out) {
        fprintf(stderr, "usage: pagoda logits -m MODEL --ids \"1 2 3\" --out FILE [--weights-f32]\n"
                        "Writes float32 logits, shape (n_ids, n_vocab), row i predicting token i+1.\n");
        return 2;
    }
    gen_ctx g;
    if (gen_setup(&o, &g)) return 1;
    int exit_code = 1;
    int32_t nv = g.model->cfg.n_vocab;
    FILE *f = NULL;
    if ((long)g.n_prompt > g.model->cfg.n_ctx) {
        fprintf(stderr, "pagoda: %zu ids exceed the context (%d)\n", g.n_prompt, g.model->cfg.n_ctx);
        goto done;
    }
    f = fopen(o.out, "wb");
    if (!f) {
        perror(o.out);
        goto done;
    }
    for (size_t i = 0; i < g.n_prompt; i += PREFILL_CHUNK) {
        int32_t c = (int32_t)(g.n_prompt - i < PREFILL_CHUNK ? g.n_prompt - i : PREFILL_CHUNK);
        int rc = pgd_session_forward(&g.sess, g.prompt + i, c, true);
        if (rc) {
            fprintf(stderr, "pagoda: forward pass failed: %s\n", pgd_status_str(rc));
            goto done;
        }
        if (fwrite(g.sess.logits, sizeof(float) * (size_t)nv, (size_t)c, f) != (size_t)c) {
            perror(o.out);
            goto done;
        }
    }
    if (fclose(f) != 0) {
        f = NULL;
        perror(o.out);
        goto done;
    }
    f = NULL;
    printf("%d\n", nv);
    exit_code = 0;
done:
    if (f) fclose(f);
    gen_free(&g);
    return exit_code;
}
