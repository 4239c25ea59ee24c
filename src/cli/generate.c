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
#include "model/lora.h"
#include "model/model.h"
#include "pagoda/pagoda.h"
#include "sample/grammar.h"
#include "sample/sampler.h"
#include "util/clock.h"
#include "util/mapfile.h"
#include "util/options.h"

#define PREFILL_CHUNK 64

typedef struct gen_opts {
    pgd_engine_opts eng;      /* the engine and model options (util/options.h) */
    const char *prompt, *file, *ids, *out, *lora;
    const char *grammar, *grammar_file; /* llama.cpp's --grammar / --grammar-file */
    long n_predict;
    float temperature, top_p;
    long top_k;
    unsigned long long seed;
    bool seed_set, ignore_eos, print_ids;
} gen_opts;

static void usage_generate(FILE *f) {
    fprintf(f,
            "usage: pagoda generate [-m MODEL] [-p PROMPT | --file F | --ids \"1 2 3\"] [-n N]\n"
            "                       [--temperature T] [--top-p P] [--top-k K] [--seed S]\n"
            "                       [--ignore-eos] [--print-ids] [--lora DIR]\n"
            "                       [--grammar G | --grammar-file F] [engine and model options]\n"
            "Writes only the generated text to stdout; prefill and decode speeds to stderr.\n"
            "  -p PROMPT        prompt text (BOS is added when the model's metadata says so;\n"
            "                   an empty prompt generates from BOS)\n"
            "  --file F         read the prompt from a file, byte for byte\n"
            "  --ids LIST       the whole prompt as token ids (no BOS added)\n"
            "  -n N             tokens to generate (default 128)\n"
            "  --temperature T  0 is greedy (default 0.8); --top-p (0.95), --top-k (40), --seed\n"
            "  --ignore-eos     keep generating past end-of-generation tokens\n"
            "  --print-ids      print generated token ids instead of text\n"
            "  --grammar G, --grammar-file F  the output is a sentence of this GBNF grammar\n"
            "                   (or the Lark-like form), as the server's guided_grammar\n"
            "  --lora DIR       run with a LoRA adapter: a PEFT directory (adapter_config.json,\n"
            "                   adapter_model.safetensors; CPU backend)\n"
            "With --load-format dummy and no tokenizer.json beside the config, give --ids (or no\n"
            "prompt: BOS from config.json) and token ids are printed; with --speculative the\n"
            "acceptance rate is reported on stderr.\n"
            "Engine and model options (the same as pagoda serve's):\n");
    pgd_opt_help(f, pgd_engine_opt_table, pgd_engine_opt_count, PGD_CMD_GENERATE);
}

/* Fills o (free o->eng with pgd_engine_opts_free whatever it returns): 0, 1 after --help, or
 * -1 after one line on stderr. */
static int parse_gen(int argc, char **argv, gen_opts *o, bool logits_cmd) {
    *o = (gen_opts){.n_predict = 128, .temperature = 0.8f, .top_p = 0.95f, .top_k = 40};
    unsigned cmd = logits_cmd ? PGD_CMD_LOGITS : PGD_CMD_GENERATE;
    if (pgd_engine_opts_init(&o->eng, cmd)) return -1;
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
        } else if ((l = pgd_opt_parse_arg(&o->eng, pgd_engine_opt_table, pgd_engine_opt_count,
                                          cmd, argc, argv, &i))) {
            if (l < 0) return -1;
            has_v = false;
        } else if (!v) {
            fprintf(stderr, "pagoda: option %s needs a value\n", a);
            return -1;
        } else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) {
            o->prompt = v;
        } else if (!strcmp(a, "--file")) {
            o->file = v;
        } else if (!strcmp(a, "--ids")) {
            o->ids = v;
        } else if (!strcmp(a, "--lora")) {
            o->lora = v;
        } else if (!strcmp(a, "--grammar") && !logits_cmd) {
            o->grammar = v;
        } else if (!strcmp(a, "--grammar-file") && !logits_cmd) {
            o->grammar_file = v;
        } else if (!strcmp(a, "--out") && logits_cmd) {
            o->out = v;
        } else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) {
            if (pgd_cli_parse_long(v, 0, 1 << 24, &o->n_predict)) goto bad;
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
    if (o->grammar && o->grammar_file) {
        fprintf(stderr, "pagoda: give only one of --grammar and --grammar-file\n");
        return -1;
    }
    return 0;
}

/* Loads the model, pool and session for `pagoda logits`; parses --ids. */
typedef struct gen_ctx {
    pgd_model *model;
    pgd_pool *pool;
    pgd_session sess;
    pgd_lora *lora;
    int32_t *prompt;
    size_t n_prompt;
} gen_ctx;

static void gen_free(gen_ctx *g) {
    if (g->sess.model) pgd_session_free(&g->sess);
    pgd_lora_free(g->lora);
    pgd_pool_free(g->pool);
    pgd_model_free(g->model);
    free(g->prompt);
    memset(g, 0, sizeof *g);
}

static int gen_setup(const gen_opts *o, gen_ctx *g) {
    memset(g, 0, sizeof *g);
    pgd_err err = {{0}};
    pgd_model_opts mo;
    pgd_cli_model_opts(&o->eng, &mo);
    int rc = pgd_model_load(o->eng.model, &mo, &g->model, &err);
    if (rc) {
        fprintf(stderr, "pagoda: %s\n", err.msg);
        return rc;
    }
    long nt = o->eng.threads ? o->eng.threads : sysconf(_SC_NPROCESSORS_ONLN);
    if (nt < 1) nt = 1;
    pgd_kv_dtype kt, vt;
    pgd_engine_opts_kv_types(&o->eng, &kt, &vt);
    if ((rc = pgd_pool_create((int)nt, &g->pool, &err)) ||
        (rc = pgd_session_init_kv2(&g->sess, g->model, g->pool, PREFILL_CHUNK, (pgd_type)kt,
                                   (pgd_type)vt, &err)) ||
        (o->lora && ((rc = pgd_lora_load(o->lora, g->model, &g->lora, &err)) ||
                     (rc = pgd_fwd_use_lora(&g->sess.fwd, g->lora, &err))))) {
        fprintf(stderr, "pagoda: %s\n", err.msg);
        gen_free(g);
        return rc;
    }
    g->sess.lora = o->lora ? 1 : 0;
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
    fprintf(stderr, "pagoda: logits needs --ids\n");
    gen_free(g);
    return PGD_EINVAL;
}

/* Tokenizes the prompt the options give (text, file or ids); ids are malloc'd. */
static int prompt_ids(const gen_opts *o, pgd_engine *e, int32_t **ids, size_t *n) {
    *ids = NULL;
    *n = 0;
    if (o->ids) {
        if (pgd_cli_parse_ids(o->ids, ids, n)) {
            fprintf(stderr, "pagoda: --ids: not a list of token ids\n");
            return PGD_EINVAL;
        }
        return PGD_OK;
    }
    if (!pgd_engine_has_tokenizer(e) && (o->file || (o->prompt && *o->prompt))) {
        fprintf(stderr, "pagoda: %s has no tokenizer (no tokenizer.json beside its config): give "
                        "the prompt as --ids, or no prompt to start from BOS\n", o->eng.model);
        return PGD_EUNSUPPORTED;
    }
    char *text = NULL;
    size_t len = 0;
    pgd_err err = {{0}};
    if (o->file) {
        int rc = pgd_read_file(o->file, &text, &len, &err);
        if (rc) {
            fprintf(stderr, "pagoda: %s\n", err.msg);
            return rc;
        }
    }
    const char *t = o->file ? text : o->prompt ? o->prompt : "";
    if (!o->file) len = strlen(t);
    size_t cap = len + 8;
    *ids = malloc(cap * sizeof **ids);
    int rc = *ids ? pgd_engine_tokenize(e, t, len, true, true, *ids, cap, n) : PGD_ENOMEM;
    free(text);
    if (rc) fprintf(stderr, "pagoda: cannot tokenize the prompt: %s\n", pgd_status_str(rc));
    return rc;
}

/* --grammar / --grammar-file compiled into *g before the model loads (a bad one fails at
 * once, with the file's name): 0, or 2 after a message. *g is zeroed when there is none. */
static int load_grammar(const gen_opts *o, pgd_grammar *g) {
    memset(g, 0, sizeof *g);
    if (!o->grammar && !o->grammar_file) return 0;
    char *text = NULL, msg[300];
    size_t len = o->grammar ? strlen(o->grammar) : 0;
    pgd_err err = {{0}};
    if (o->grammar_file && pgd_read_file(o->grammar_file, &text, &len, &err)) {
        fprintf(stderr, "pagoda: %s\n", err.msg);
        return 2;
    }
    int rc = pgd_grammar_compile(text ? text : o->grammar, len, g, msg, sizeof msg);
    free(text);
    if (rc) {
        fprintf(stderr, "pagoda: %s: %s\n", o->grammar_file ? o->grammar_file : "--grammar",
                rc == PGD_ENOMEM ? "out of memory" : msg);
        return 2;
    }
    return 0;
}

/* A command of this file: its options parsed (exit 0 after --help, 2 on a bad one), then run. */
static int run_command(int argc, char **argv, bool logits_cmd, int (*run)(gen_opts)) {
    gen_opts o;
    int prc = parse_gen(argc, argv, &o, logits_cmd);
    int rc = prc ? (prc > 0 ? 0 : 2) : run(o);
    pgd_engine_opts_free(&o.eng);
    return rc;
}

/* `pagoda generate`: one request through the engine (a batch of one). */
static int generate_run(gen_opts o);

int pgd_cli_generate(int argc, char **argv) { return run_command(argc, argv, false, generate_run); }

/* o by value: the options parse_gen filled, borrowed */
static int generate_run(gen_opts o) {
    pgd_grammar gram;
    if (load_grammar(&o, &gram)) return 2;
    pgd_engine_config ec;
    pgd_engine_opts_config(&o.eng, &ec);
    ec.max_num_seqs = 1;
    ec.lora_paths = &o.lora;
    ec.n_loras = o.lora ? 1 : 0;
    char err[512];
    pgd_engine *e = NULL;
    if (pgd_engine_create(&ec, &e, err, sizeof err)) {
        fprintf(stderr, "pagoda: %s\n", err);
        pgd_grammar_free(&gram);
        return 1;
    }
    int exit_code = 1;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    if (prompt_ids(&o, e, &ids, &n_ids)) goto done;
    if (!pgd_engine_has_tokenizer(e) && !o.print_ids) {
        fprintf(stderr, "pagoda: the model has no tokenizer: printing token ids\n");
        o.print_ids = true;
    }
    if (n_ids == 0) {
        fprintf(stderr, "pagoda: the prompt is empty and the model adds no BOS token; "
                        "nothing to generate from\n");
        goto done;
    }
    if (o.n_predict == 0) {
        exit_code = 0;
        goto done;
    }
    long room = (long)pgd_engine_n_ctx(e) - (long)n_ids;
    if (room < 1) {
        fprintf(stderr, "pagoda: %s: the prompt has %zu tokens; the context holds %d\n", o.eng.model,
                n_ids, pgd_engine_n_ctx(e));
        goto done;
    }
    pgd_request_params rp = {
        .prompt = ids, .n_prompt = (int32_t)n_ids,
        .max_tokens = (int32_t)(o.n_predict < room ? o.n_predict : room),
        .temperature = o.temperature, .top_p = o.top_p, .top_k = (int32_t)o.top_k,
        .seed = o.seed_set ? o.seed : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 16),
        .ignore_eos = o.ignore_eos, .logprobs = -1, .lora = o.lora ? 1 : 0,
        .grammar_c = o.grammar || o.grammar_file ? &gram : NULL,
    };
    uint64_t rid;
    if (pgd_engine_submit(e, &rp, &rid, err, sizeof err)) {
        fprintf(stderr, "pagoda: %s\n", err);
        goto done;
    }
    double t0 = pgd_now_s(), t_first = 0;
    long n_gen = 0;
    bool finished = false;
    pgd_event ev[16];
    while (!finished) {
        pgd_engine_step(e);
        int n = pgd_engine_poll(e, ev, 16, 0);
        for (int i = 0; i < n; i++) {
            if (ev[i].type == PGD_EVENT_TOKEN) {
                if (n_gen++ == 0) t_first = pgd_now_s();
                if (o.print_ids) printf(n_gen > 1 ? " %d" : "%d", ev[i].token);
            } else {
                finished = true;
                if (ev[i].finish_reason == PGD_FINISH_ERROR) {
                    /* the model is the likely culprit (corrupt weights): name it */
                    fprintf(stderr, "pagoda: %s: %s\n", ec.model_path, ev[i].error);
                    goto done;
                }
            }
            if (!o.print_ids && ev[i].text_len)
                fwrite(ev[i].text, 1, (size_t)ev[i].text_len, stdout);
        }
        fflush(stdout);
    }
    if (o.print_ids) printf("\n");
    fflush(stdout);
    double t2 = pgd_now_s();
    if (n_gen == 0) t_first = t2;
    /* the first token comes out of the prefill; the rest each cost one decode step */
    fprintf(stderr, "\nprefill: %zu tokens in %.3f s (%.1f tokens/s)\n", n_ids, t_first - t0,
            (double)n_ids / (t_first - t0));
    fprintf(stderr, "decode: %ld tokens in %.3f s (%.1f tokens/s)\n", n_gen, t2 - t_first,
            n_gen > 1 ? (double)(n_gen - 1) / (t2 - t_first) : 0.0);
    if (ec.speculative != PGD_SPEC_NONE) {
        pgd_engine_stats st;
        pgd_engine_get_stats(e, &st);
        fprintf(stderr, "speculation: %lld proposed, %lld accepted (acceptance rate %.1f%%), "
                "%.2f accepted per verification, %lld decode steps\n",
                (long long)st.spec_draft_tokens, (long long)st.spec_accepted_tokens,
                st.spec_draft_tokens ? 100.0 * (double)st.spec_accepted_tokens /
                                           (double)st.spec_draft_tokens : 0.0,
                st.spec_drafts ? (double)st.spec_accepted_tokens / (double)st.spec_drafts : 0.0,
                (long long)st.steps);
    }
    exit_code = 0;
done:
    free(ids);
    pgd_engine_free(e);
    pgd_grammar_free(&gram);
    return exit_code;
}

static int logits_run(gen_opts o);

int pgd_cli_logits(int argc, char **argv) { return run_command(argc, argv, true, logits_run); }

static int logits_run(gen_opts o) {
    if (!o.ids || !o.out) {
        fprintf(stderr, "usage: pagoda logits -m MODEL --ids \"1 2 3\" --out FILE [--weights-f32] "
                        "[--lora DIR]\n"
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
