/* `pagoda batch`: offline batch inference. Reads one JSON request per line, runs them all
 * through the engine at once, writes one JSON result per line in input order, with a progress
 * bar and a summary on stderr. A bad line gets an error result; the others still run. */
#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "engine/engine_internal.h"
#include "api/openai.h"
#include "api/params.h"
#include "pagoda/pagoda.h"
#include "util/clock.h"
#include "util/mapfile.h"
#include "util/options.h"
#include "util/parse.h"
#include "util/xalloc.h"
#include "util/env.h"

typedef struct result {
    cJSON *id;            /* the request's "id" (a copy), or null */
    char *error;          /* set for a bad line or a failed request */
    char *text;
    size_t text_len, text_cap;
    int32_t *ids;
    size_t n_ids, cap_ids;
    const char *finish;
    int32_t n_prompt, n_completion, n_cached;
    bool done;
    int32_t logprobs;     /* alternatives asked for; -1: no "logprobs" in the output */
    cJSON *lp;            /* the "logprobs" array being built */
    float *embedding;     /* an "input" line's vector (pgd_engine_dim floats), or NULL */
} result;

typedef struct pending {
    pgd_api_request api;  /* the line as api/openai.c parses a request body */
    pgd_request_params p; /* borrows from api */
    int line;
} pending;

/* --lora-modules: the adapters' names and directories (pointers into spec), and the base model's
 * name (its file's or directory's base name, as the server's default) */
#define BATCH_MAX_LORAS 64
typedef struct lora_set {
    char *spec;
    const char *names[BATCH_MAX_LORAS], *paths[BATCH_MAX_LORAS];
    int n;
    char base[256];
} lora_set;

static void usage_batch(FILE *f) {
    fprintf(f,
            "usage: pagoda batch [-m MODEL] --input IN.jsonl --output OUT.jsonl [options]\n"
            "Each input line: a /v1/completions body as pagoda serve takes it (\"prompt\": one\n"
            "  string or token ids, n=1; every sampling, stop, logprobs, response_format and\n"
            "  guided_* parameter), plus \"id\" (copied to the result); without \"seed\" a line\n"
            "  is seeded with its index. \"speculative\": false opts out of speculation.\n"
            "  Or, for an embedding, {\"id\": ..., \"input\": \"...\" or [token ids]} (output:\n"
            "  {\"id\", \"embedding\", \"prompt_tokens\"}, as /v1/embeddings computes it)\n"
            "Each output line (input order): {\"id\", \"text\", \"token_ids\", \"finish_reason\",\n"
            "  \"prompt_tokens\", \"completion_tokens\", \"cached_tokens\"[, \"logprobs\"]} or\n"
            "  {\"id\", \"error\"}; \"logprobs\": [{\"token\", \"logprob\", \"top_logprobs\":\n"
            "  [{\"token\", \"logprob\"}]}] from the raw model distribution.\n"
            "options:\n"
            "  --stagger N                   submit one request every N steps (default: all at once)\n"
            "  --stats FILE                  write the run's statistics as JSON\n"
            "  --trace FILE                  write one line per step: seconds, running, waiting,\n"
            "                                tokens in the step\n"
            "  --static-batching             baseline: admit a new batch only when the last is done\n"
            "  --no-progress                 no progress bar\n"
            "engine and model options (the same as pagoda serve's; --lora-modules: a line with\n"
            "\"model\": NAME runs with that adapter, any name but the model's own an error line):\n");
    pgd_opt_help(f, pgd_engine_opt_table, pgd_engine_opt_count, PGD_CMD_BATCH);
}

static void set_error(result *r, const char *msg) {
    free(r->error);
    r->error = strdup(msg);
    r->done = true;
}

/* A line's "model" with --lora-modules: an adapter's name (-> its pgd_request_params.lora), the
 * base model's, or none; anything else is refused. Without adapters "model" is not read. */
static int line_lora(const cJSON *j, const lora_set *ls, int32_t *lora, char *msg, size_t ml) {
    *lora = 0;
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(j, "model");
    if (!ls->n || !m || cJSON_IsNull(m)) return 0;
    if (cJSON_IsString(m)) {
        if (!strcmp(m->valuestring, ls->base)) return 0;
        for (int i = 0; i < ls->n; i++)
            if (!strcmp(m->valuestring, ls->names[i])) {
                *lora = i + 1;
                return 0;
            }
    }
    snprintf(msg, ml, "\"model\" must be '%.64s' or one of the adapters --lora-modules names",
             ls->base);
    return -1;
}

/* One prompt per line: a string or token ids (the API takes arrays of prompts too). */
static bool one_prompt(const cJSON *pr) {
    if (cJSON_IsString(pr)) return true;
    if (!cJSON_IsArray(pr)) return false;
    const cJSON *x;
    cJSON_ArrayForEach(x, pr) if (!cJSON_IsNumber(x)) return false;
    return true;
}

/* A line is a request body as the server takes it: a "prompt" line a /v1/completions body, an
 * "input" line a /v1/embeddings body, both parsed by api/openai.c and mapped to the engine by
 * api/params.c as the server maps them. A line's own: "id" (copied to its result), "model" (an
 * adapter's name), one prompt and n=1, and the seed, when none is given, is the line's index
 * (a rerun gives the same answers). The prompt is tokenized here (with BOS, special tokens
 * parsed); constraints are compiled by the engine at submit, as before. */
static int parse_line(pgd_engine *e, const lora_set *ls, const char *line, const cJSON *j,
                      pending *pd, result *r, char *msg, size_t ml) {
    const cJSON *x;
    if ((x = cJSON_GetObjectItemCaseSensitive(j, "id"))) r->id = cJSON_Duplicate(x, true);
    int32_t lora;
    if (line_lora(j, ls, &lora, msg, ml)) return -1;
    const cJSON *pr = cJSON_GetObjectItemCaseSensitive(j, "prompt");
    bool embed = !pr && (pr = cJSON_GetObjectItemCaseSensitive(j, "input")) != NULL;
    const char *key = embed ? "input" : "prompt";
    cJSON_ArrayForEach(x, j) /* an embedding line has nothing else to say */
        if (embed && strcmp(x->string, "id") && strcmp(x->string, "input") &&
            strcmp(x->string, "model") && strcmp(x->string, "priority")) {
            snprintf(msg, ml, "an embedding line (\"input\") takes no \"%.64s\"", x->string);
            return -1;
        }
    if (!one_prompt(pr)) {
        snprintf(msg, ml, "\"%s\" must be a string or an array of token ids", key);
        return -1;
    }
    /* the model's vocabulary bounds token ids; its context, prompts and answers */
    int32_t n_ctx = pgd_engine_n_ctx(e);
    pgd_api_limits lim = {.max_n = 1, .max_logprobs = 20, .max_tokens_limit = 10000000,
                          .max_prompts = 1, .max_prompt_tokens = n_ctx,
                          .n_vocab = pgd_engine_n_vocab(e),
                          .priority_scheduling = true /* the engine's submit checks it */};
    pgd_api_error aerr = {0};
    pgd_api_request *a = &pd->api;
    int rc;
    if (embed) { /* /v1/embeddings refuses what it does not know: the line's "id" goes */
        cJSON *body = cJSON_Duplicate(j, true);
        cJSON_DeleteItemFromObjectCaseSensitive(body, "id");
        char *txt = body ? cJSON_PrintUnformatted(body) : NULL;
        cJSON_Delete(body);
        if (!txt) {
            snprintf(msg, ml, "out of memory");
            return -1;
        }
        rc = pgd_api_parse_embeddings(txt, strlen(txt), &lim, pgd_engine_dim(e), a, &aerr);
        free(txt);
    } else {
        rc = pgd_api_parse(line, strlen(line), false, &lim, a, &aerr);
    }
    if (rc) {
        snprintf(msg, ml, "%s", aerr.message);
        return -1;
    }
    pgd_api_prompt *p = &a->prompts[0];
    if (p->text) {
        size_t len = strlen(p->text), cap = len + 8, n = 0;
        p->ids = malloc(cap * sizeof *p->ids);
        if (!p->ids || pgd_engine_tokenize(e, p->text, len, true, true, p->ids, cap, &n)) {
            if (pgd_engine_has_tokenizer(e)) snprintf(msg, ml, "cannot tokenize the %s", key);
            else snprintf(msg, ml, "the model has no tokenizer: give \"%s\" as token ids", key);
            return -1;
        }
        p->n_ids = (int32_t)n;
    }
    pgd_api_budget bud = {.n_ctx = n_ctx};
    if (pgd_api_prepare(a, &bud, &aerr)) {
        snprintf(msg, ml, "%s", aerr.message);
        return -1;
    }
    if (embed && !(r->embedding = calloc((size_t)pgd_engine_dim(e), sizeof(float)))) {
        snprintf(msg, ml, "out of memory");
        return -1;
    }
    pgd_api_engine_params(a, 0, n_ctx, a->has_seed ? a->seed : (uint64_t)pd->line, &pd->p);
    pd->p.embedding = r->embedding;
    pd->p.lora = lora;
    r->logprobs = a->logprobs;
    return 0;
}

static void append(result *r, const pgd_event *ev) {
    if (ev->text_len > 0 &&
        pgd_bytes_append(&r->text, &r->text_len, &r->text_cap, ev->text, (size_t)ev->text_len))
        return;
    if (ev->type == PGD_EVENT_TOKEN) {
        if (r->n_ids == r->cap_ids) {
            size_t nc = r->cap_ids ? r->cap_ids * 2 : 64;
            int32_t *n = realloc(r->ids, nc * sizeof *n);
            if (!n) return;
            r->ids = n;
            r->cap_ids = nc;
        }
        r->ids[r->n_ids++] = ev->token;
        if (r->logprobs >= 0) {
            if (!r->lp) r->lp = cJSON_CreateArray();
            cJSON *o = cJSON_CreateObject();
            cJSON_AddNumberToObject(o, "token", ev->token);
            cJSON_AddNumberToObject(o, "logprob", ev->logprob);
            cJSON *top = cJSON_AddArrayToObject(o, "top_logprobs");
            for (int i = 0; i < ev->n_top; i++) {
                cJSON *t = cJSON_CreateObject();
                cJSON_AddNumberToObject(t, "token", ev->top_ids[i]);
                cJSON_AddNumberToObject(t, "logprob", ev->top_logprobs[i]);
                cJSON_AddItemToArray(top, t);
            }
            cJSON_AddItemToArray(r->lp, o);
        }
    }
}

static void progress(int done, int total, long tokens, double t0, bool final) {
    double dt = pgd_now_s() - t0;
    int w = 30, fill = total ? done * w / total : w;
    fprintf(stderr, "\r[");
    for (int i = 0; i < w; i++) fputc(i < fill ? '#' : '.', stderr);
    fprintf(stderr, "] %d/%d requests, %ld tokens, %.1f tokens/s%s", done, total, tokens,
            dt > 0 ? (double)tokens / dt : 0.0, final ? "\n" : "");
}

int pgd_cli_batch(int argc, char **argv) {
    pgd_engine_opts opts;
    if (pgd_engine_opts_init(&opts, PGD_CMD_BATCH)) {
        pgd_engine_opts_free(&opts);
        return 2;
    }
    pgd_engine_config ec;
    const char *in_path = NULL, *out_path = NULL, *stats_path = NULL, *trace_path = NULL;
    FILE *trace = NULL;
    long stagger = 0;
    bool show_progress = true, static_batching = false;
    lora_set ls = {0};
    char lmsg[320];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage_batch(stdout);
            pgd_engine_opts_free(&opts);
            return 0;
        } else if (!strcmp(a, "--static-batching")) {
            static_batching = true;
            continue;
        } else if (!strcmp(a, "--no-progress")) {
            show_progress = false;
            continue;
        }
        int rc = pgd_opt_parse_arg(&opts, pgd_engine_opt_table, pgd_engine_opt_count, PGD_CMD_BATCH,
                                   argc, argv, &i);
        if (rc) {
            if (rc < 0) {
                pgd_engine_opts_free(&opts);
                return 2;
            }
            continue;
        }
        if (!v) {
            fprintf(stderr, "pagoda: option %s needs a value\n", a);
            pgd_engine_opts_free(&opts);
            return 2;
        }
        i++;
        if (!strcmp(a, "--input")) in_path = v;
        else if (!strcmp(a, "--output")) out_path = v;
        else if (!strcmp(a, "--stats")) stats_path = v;
        else if (!strcmp(a, "--trace")) trace_path = v;
        else if (!strcmp(a, "--stagger")) {
            if (pgd_cli_parse_long(v, 0, 1 << 20, &stagger)) {
                fprintf(stderr, "pagoda: invalid value '%s' for %s\n", v, a);
                pgd_engine_opts_free(&opts);
                return 2;
            }
        } else {
            fprintf(stderr, "pagoda: unknown option '%s' (see --help)\n", a);
            pgd_engine_opts_free(&opts);
            return 2;
        }
    }
    pgd_engine_opts_config(&opts, &ec);
    ec.static_batching = static_batching;
    ls.spec = opts.lora_modules; /* taken: the adapter paths point into it */
    opts.lora_modules = NULL;
    if (!in_path || !out_path) {
        usage_batch(stderr);
        free(ls.spec);
        pgd_engine_opts_free(&opts);
        return 2;
    }
    const char *bn = strrchr(ec.model_path, '/');
    snprintf(ls.base, sizeof ls.base, "%s", bn && bn[1] ? bn + 1 : ec.model_path);
    if (ls.spec && pgd_parse_lora_modules(ls.spec, ls.base, ls.names, ls.paths, BATCH_MAX_LORAS,
                                          &ls.n, lmsg, sizeof lmsg)) {
        fprintf(stderr, "pagoda: %s\n", lmsg);
        free(ls.spec);
        pgd_engine_opts_free(&opts);
        return 2;
    }
    ec.lora_paths = ls.paths;
    ec.n_loras = ls.n;
    char *input = NULL;
    size_t in_len = 0;
    pgd_err perr = {{0}};
    if (pgd_read_file(in_path, &input, &in_len, &perr)) {
        fprintf(stderr, "pagoda: %s\n", perr.msg);
        free(ls.spec);
        pgd_engine_opts_free(&opts);
        return 1;
    }
    FILE *out = fopen(out_path, "w");
    if (!out) {
        perror(out_path);
        free(input);
        free(ls.spec);
        pgd_engine_opts_free(&opts);
        return 1;
    }
    char err[512];
    pgd_engine *e = NULL;
    if (pgd_engine_create(&ec, &e, err, sizeof err)) {
        fprintf(stderr, "pagoda: %s\n", err);
        fclose(out);
        free(input);
        free(ls.spec);
        pgd_engine_opts_free(&opts);
        return 1;
    }
    /* a test hook (tests/integration/test_spec.py): a verifier that accepts every proposal */
    const char *broken = pgd_env(PGD_ENV_TEST_SPEC_ALWAYS_ACCEPT);
    if (broken && !strcmp(broken, "1")) pgd__engine_spec_always_accept(e, true);
    /* split lines (blank lines are skipped, not counted) */
    int n_lines = 0, cap_lines = 64;
    char **lines = malloc((size_t)cap_lines * sizeof *lines);
    for (char *p = input, *nl; lines && p < input + in_len; p = nl + 1) {
        nl = memchr(p, '\n', (size_t)(input + in_len - p));
        if (!nl) nl = input + in_len;
        *nl = 0;
        char *q = p;
        while (*q == ' ' || *q == '\t' || *q == '\r') q++;
        if (!*q) continue;
        if (n_lines == cap_lines) {
            char **nls = realloc(lines, (size_t)cap_lines * 2 * sizeof *nls);
            if (!nls) break;
            lines = nls;
            cap_lines *= 2;
        }
        lines[n_lines++] = p;
    }
    result *res = calloc((size_t)(n_lines ? n_lines : 1), sizeof *res);
    pending *pend = calloc((size_t)(n_lines ? n_lines : 1), sizeof *pend);
    int exit_code = 1;
    if (!lines || !res || !pend) {
        fprintf(stderr, "pagoda: out of memory\n");
        goto done;
    }
    int n_valid = 0;
    for (int i = 0; i < n_lines; i++) {
        pend[i].line = i;
        cJSON *j = cJSON_Parse(lines[i]);
        char msg[600];
        if (!cJSON_IsObject(j)) set_error(&res[i], "the line is not a JSON object");
        else if (parse_line(e, &ls, lines[i], j, &pend[i], &res[i], msg, sizeof msg))
            set_error(&res[i], msg);
        else n_valid++;
        cJSON_Delete(j);
    }
    if (trace_path && !(trace = fopen(trace_path, "w"))) {
        perror(trace_path);
        goto done;
    }
    double t0 = pgd_now_s(), last_draw = 0;
    int next = 0, n_done = 0;
    long steps = 0, tokens = 0;
    pgd_event ev[256];
    while (n_done < n_valid) {
        /* submit: everything at once, or one request every `stagger` steps */
        while (next < n_lines && (stagger == 0 || steps >= (long)next * stagger)) {
            pending *pd = &pend[next];
            result *r = &res[next];
            next++;
            if (r->done) continue;
            pd->p.user_data = (uint64_t)pd->line;
            uint64_t rid;
            if (pgd_engine_submit(e, &pd->p, &rid, err, sizeof err)) {
                set_error(r, err);
                n_done++;
            }
            if (stagger) break;
        }
        if (n_done >= n_valid) break;
        int step_tokens = pgd_engine_step(e);
        steps++;
        if (trace) {
            pgd_engine_stats ts;
            pgd_engine_get_stats(e, &ts);
            fprintf(trace, "%.6f %d %d %d\n", pgd_now_s() - t0, ts.last_step_seqs, ts.num_waiting,
                    step_tokens);
        }
        int n;
        while ((n = pgd_engine_poll(e, ev, 256, 0)) > 0)
            for (int i = 0; i < n; i++) {
                result *r = &res[ev[i].user_data];
                append(r, &ev[i]);
                if (ev[i].type == PGD_EVENT_TOKEN) tokens++;
                if (ev[i].type != PGD_EVENT_FINISH) continue;
                static const char *names[] = {"", "stop", "length", "abort", "error"};
                r->finish = names[ev[i].finish_reason];
                r->n_prompt = ev[i].n_prompt;
                r->n_completion = ev[i].n_completion;
                r->n_cached = ev[i].n_cached;
                if (ev[i].finish_reason == PGD_FINISH_ERROR) set_error(r, ev[i].error);
                r->done = true;
                n_done++;
            }
        if (show_progress && pgd_now_s() - last_draw > 0.2) {
            progress(n_done, n_valid, tokens, t0, false);
            last_draw = pgd_now_s();
        }
    }
    double dt = pgd_now_s() - t0;
    if (show_progress) progress(n_done, n_valid, tokens, t0, true);
    for (int i = 0; i < n_lines; i++) {
        result *r = &res[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddItemToObject(o, "id", r->id ? r->id : cJSON_CreateNull());
        r->id = NULL;
        if (r->error) {
            cJSON *eo = cJSON_AddObjectToObject(o, "error");
            cJSON_AddStringToObject(eo, "message", r->error);
        } else if (r->embedding) {
            cJSON *v = cJSON_AddArrayToObject(o, "embedding");
            for (int32_t k = 0; v && k < pgd_engine_dim(e); k++)
                cJSON_AddItemToArray(v, cJSON_CreateNumber(r->embedding[k]));
            cJSON_AddNumberToObject(o, "prompt_tokens", r->n_prompt);
        } else {
            cJSON_AddStringToObject(o, "text", r->text ? r->text : "");
            cJSON *ids = cJSON_AddArrayToObject(o, "token_ids");
            for (size_t k = 0; k < r->n_ids; k++) cJSON_AddItemToArray(ids, cJSON_CreateNumber(r->ids[k]));
            cJSON_AddStringToObject(o, "finish_reason", r->finish ? r->finish : "");
            cJSON_AddNumberToObject(o, "prompt_tokens", r->n_prompt);
            cJSON_AddNumberToObject(o, "completion_tokens", r->n_completion);
            cJSON_AddNumberToObject(o, "cached_tokens", r->n_cached);
            if (r->logprobs >= 0) {
                cJSON_AddItemToObject(o, "logprobs", r->lp ? r->lp : cJSON_CreateArray());
                r->lp = NULL;
            }
        }
        char *txt = cJSON_PrintUnformatted(o);
        if (txt) fprintf(out, "%s\n", txt);
        free(txt);
        cJSON_Delete(o);
    }
    int n_failed = 0;
    for (int i = 0; i < n_lines; i++) n_failed += res[i].error != NULL;
    pgd_engine_stats st;
    pgd_engine_get_stats(e, &st);
    double hit = st.prefix_cache_queries ? 100.0 * st.prefix_cache_hits / st.prefix_cache_queries : 0;
    fprintf(stderr, "requests: %d (%d failed), prompt tokens: %lld, generated tokens: %lld, "
            "time: %.2f s, %.1f generated tokens/s, %.1f total tokens/s\n", n_lines,
            n_failed, (long long)st.prompt_tokens_total,
            (long long)st.generation_tokens_total, dt, st.generation_tokens_total / dt,
            (st.prefill_tokens_total + st.generation_tokens_total) / dt);
    fprintf(stderr, "prefix cache: %.1f%% of %lld prompt tokens hit; prefilled tokens: %lld; "
            "preemptions: %lld; steps: %lld\n", hit, (long long)st.prefix_cache_queries,
            (long long)st.prefill_tokens_total, (long long)st.num_preemptions, (long long)st.steps);
    if (st.spec_drafts)
        fprintf(stderr, "speculation: %lld proposed, %lld accepted (%.1f%%), %.2f accepted per "
                "verification\n", (long long)st.spec_draft_tokens,
                (long long)st.spec_accepted_tokens,
                100.0 * (double)st.spec_accepted_tokens / (double)st.spec_draft_tokens,
                (double)st.spec_accepted_tokens / (double)st.spec_drafts);
    if (stats_path) {
        FILE *sf = fopen(stats_path, "w");
        if (sf) {
            fprintf(sf, "{\"requests\": %d, \"prompt_tokens\": %lld, \"generation_tokens\": %lld, "
                    "\"prefill_tokens\": %lld, \"prefix_cache_queries\": %lld, "
                    "\"prefix_cache_hits\": %lld, \"preemptions\": %lld, \"steps\": %lld, "
                    "\"seconds\": %.6f, \"kv_blocks_total\": %d, \"kv_blocks_used\": %d, "
                    "\"spec_drafts\": %lld, \"spec_draft_tokens\": %lld, "
                    "\"spec_accepted_tokens\": %lld, \"spec_accepted_per_pos\": [",
                    n_lines, (long long)st.prompt_tokens_total,
                    (long long)st.generation_tokens_total, (long long)st.prefill_tokens_total,
                    (long long)st.prefix_cache_queries, (long long)st.prefix_cache_hits,
                    (long long)st.num_preemptions, (long long)st.steps, dt, st.kv_blocks_total,
                    st.kv_blocks_used, (long long)st.spec_drafts,
                    (long long)st.spec_draft_tokens, (long long)st.spec_accepted_tokens);
            for (int k = 0; k < PGD_SPEC_MAX_TOKENS; k++)
                fprintf(sf, "%s%lld", k ? ", " : "", (long long)st.spec_accepted_per_pos[k]);
            fprintf(sf, "]}\n");
            fclose(sf);
        }
    }
    exit_code = 0;
done:
    for (int i = 0; res && i < n_lines; i++) {
        cJSON_Delete(res[i].id);
        free(res[i].error);
        free(res[i].text);
        free(res[i].embedding);
        free(res[i].ids);
        cJSON_Delete(res[i].lp);
    }
    for (int i = 0; pend && i < n_lines; i++) pgd_api_request_free(&pend[i].api);
    if (trace) fclose(trace);
    free(res);
    free(pend);
    free(lines);
    free(input);
    if (fclose(out) != 0) exit_code = 1;
    pgd_engine_free(e);
    free(ls.spec); /* after the engine: the adapter paths point into it */
    pgd_engine_opts_free(&opts);
    return exit_code;
}
