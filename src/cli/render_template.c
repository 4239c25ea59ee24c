/* `pagoda render-template`: renders a chat template (a model's own, or a .jinja file) over a
 * conversation and prints exactly the prompt text, with the variables Hugging Face passes
 * (messages, tools, documents, add_generation_prompt, bos_token, eos_token). */
#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "api/jinja.h"
#include "cli/cli.h"
#include "model/gguf.h"
#include "tokenizer/tokenizer.h"

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: pagoda render-template (-m MODEL | --template FILE.jinja) --messages FILE.json\n"
        "                              [--add-generation-prompt] [--bos-token S] [--eos-token S]\n"
        "                              [--tools FILE.json] [--vars FILE.json] [--date YYYY-MM-DD]\n"
        "\n"
        "Prints the prompt text the chat template renders (no newline is added).\n"
        "  -m MODEL                 a GGUF file or Hugging Face directory: its chat template and\n"
        "                           BOS/EOS token strings\n"
        "  --template FILE          a Jinja template file instead (no BOS/EOS unless given)\n"
        "  --messages FILE          a JSON array of messages, or an object with \"messages\"\n"
        "                           (and optionally \"tools\")\n"
        "  --add-generation-prompt  end with the assistant turn's opening\n"
        "  --bos-token S, --eos-token S   override the token strings\n"
        "  --tools FILE             a JSON array of tool definitions\n"
        "  --vars FILE              a JSON object of extra template variables\n"
        "                           (e.g. {\"enable_thinking\": false})\n"
        "  --date YYYY-MM-DD[THH:MM:SS]   what strftime_now() sees (default: now)\n");
}

/* Reads a whole file into a malloc'd NUL-terminated buffer. */
static char *read_file(const char *path, size_t *len, pgd_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        pgd_err_set(err, PGD_EIO, "%s: cannot open", path);
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (n < cap - 1) break;
        char *nb = realloc(buf, cap * 2);
        if (!nb) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = nb;
        cap *= 2;
    }
    bool bad = ferror(f);
    fclose(f);
    if (!buf || bad) {
        free(buf);
        pgd_err_set(err, buf ? PGD_EIO : PGD_ENOMEM, "%s: cannot read", path);
        return NULL;
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

static cJSON *read_json(const char *path, pgd_err *err) {
    size_t n;
    char *s = read_file(path, &n, err);
    if (!s) return NULL;
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(s, n, &end, false);
    while (j && end && (*end == ' ' || *end == '\n' || *end == '\r' || *end == '\t')) end++;
    if (j && end && *end) {
        cJSON_Delete(j);
        j = NULL;
    }
    if (!j)
        pgd_err_set(err, PGD_EFORMAT, "%s: invalid JSON near byte %zu", path,
                    end ? (size_t)(end - s) : 0);
    free(s);
    return j;
}

/* The text of token id (special tokens rendered), or NULL if the vocabulary has none. */
static char *token_text(const pgd_tokenizer *t, int32_t id) {
    if (id < 0) return NULL;
    char buf[1024];
    int n = pgd_tokenizer_token_bytes(t, id, true, buf, sizeof buf);
    if (n < 0) return NULL;
    char *s = malloc((size_t)n + 1);
    if (!s) return NULL;
    memcpy(s, buf, (size_t)n);
    s[n] = 0;
    return s;
}

/* Loads only the tokenizer of a model (GGUF file or HF directory): the chat template and the
 * BOS/EOS strings, each malloc'd (NULL when absent). */
static int load_model_template(const char *path, char **tmpl, char **bos, char **eos,
                               pgd_err *err) {
    pgd_tokenizer *t = NULL;
    struct stat st;
    int rc;
    bool is_dir = stat(path, &st) == 0 && S_ISDIR(st.st_mode);
    rc = pgd_tokenizer_load_path(path, &t, err);
    if (rc) return rc;
    const char *ct = pgd_tokenizer_chat_template(t);
    *tmpl = ct ? strdup(ct) : NULL;
    if (is_dir) {
        /* newer transformers save the template beside the config, or keep a list of named
         * templates in it; "default" is the one apply_chat_template uses */
        char tp[4096];
        size_t n;
        snprintf(tp, sizeof tp, "%s/chat_template.jinja", path);
        char *file = stat(tp, &st) == 0 ? read_file(tp, &n, NULL) : NULL;
        if (file) {
            free(*tmpl);
            *tmpl = file;
        } else if (!ct) {
            snprintf(tp, sizeof tp, "%s/tokenizer_config.json", path);
            cJSON *cfg = stat(tp, &st) == 0 ? read_json(tp, NULL) : NULL;
            const cJSON *list = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template"), *e;
            if (!cJSON_IsArray(list)) list = NULL;
            cJSON_ArrayForEach(e, list) {
                const cJSON *nm = cJSON_GetObjectItemCaseSensitive(e, "name");
                const cJSON *tx = cJSON_GetObjectItemCaseSensitive(e, "template");
                if (cJSON_IsString(nm) && !strcmp(nm->valuestring, "default") && cJSON_IsString(tx))
                    *tmpl = strdup(tx->valuestring);
            }
            cJSON_Delete(cfg);
        }
    }
    if (!*tmpl) {
        pgd_tokenizer_free(t);
        return pgd_err_set(err, PGD_ENOENT, "%s: the model has no chat template", path);
    }
    *bos = token_text(t, pgd_tokenizer_bos(t));
    *eos = token_text(t, pgd_tokenizer_eos(t));
    pgd_tokenizer_free(t);
    if (!*tmpl) return pgd_err_set(err, PGD_ENOMEM, "out of memory");
    return 0;
}

static int parse_date(const char *s, time_t *out) {
    struct tm tm = {0};
    int y, mo, d, h = 0, mi = 0, se = 0;
    int n = sscanf(s, "%d-%d-%dT%d:%d:%d", &y, &mo, &d, &h, &mi, &se);
    if (n != 3 && n != 6) return -1;
    tm.tm_year = y - 1900;
    tm.tm_mon = mo - 1;
    tm.tm_mday = d;
    tm.tm_hour = h;
    tm.tm_min = mi;
    tm.tm_sec = se;
    tm.tm_isdst = -1;
    *out = mktime(&tm); /* local time, as Python's datetime.now() is */
    return *out == (time_t)-1 ? -1 : 0;
}

int pgd_cli_render_template(int argc, char **argv) {
    const char *model = NULL, *tmpl_path = NULL, *msgs_path = NULL, *tools_path = NULL;
    const char *vars_path = NULL, *bos_arg = NULL, *eos_arg = NULL, *date = NULL;
    bool gen = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool has = i + 1 < argc;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && has)
            model = argv[++i];
        else if (!strcmp(a, "--template") && has)
            tmpl_path = argv[++i];
        else if (!strcmp(a, "--messages") && has)
            msgs_path = argv[++i];
        else if (!strcmp(a, "--tools") && has)
            tools_path = argv[++i];
        else if (!strcmp(a, "--vars") && has)
            vars_path = argv[++i];
        else if (!strcmp(a, "--bos-token") && has)
            bos_arg = argv[++i];
        else if (!strcmp(a, "--eos-token") && has)
            eos_arg = argv[++i];
        else if (!strcmp(a, "--date") && has)
            date = argv[++i];
        else if (!strcmp(a, "--add-generation-prompt"))
            gen = true;
        else {
            fprintf(stderr, "pagoda render-template: unknown or incomplete option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if ((!model) == (!tmpl_path) || !msgs_path) {
        usage(stderr);
        return 2;
    }
    time_t now = 0;
    if (date && parse_date(date, &now)) {
        fprintf(stderr, "pagoda render-template: bad --date '%s' (want YYYY-MM-DD)\n", date);
        return 2;
    }

    pgd_err err = {{0}};
    int rc = 0;
    char *src = NULL, *bos = NULL, *eos = NULL, *out = NULL;
    size_t src_len = 0, out_len = 0;
    cJSON *msgs = NULL, *ctx = NULL, *tools = NULL, *vars = NULL;
    pgd_jinja_tmpl *tmpl = NULL;

    if (model) {
        rc = load_model_template(model, &src, &bos, &eos, &err);
        if (!rc) src_len = strlen(src);
    } else if (!(src = read_file(tmpl_path, &src_len, &err)))
        rc = PGD_EIO;
    if (rc) goto fail;

    rc = PGD_EFORMAT;
    if (!(msgs = read_json(msgs_path, &err))) goto fail;
    if (tools_path && !(tools = read_json(tools_path, &err))) goto fail;
    if (vars_path && !(vars = read_json(vars_path, &err))) goto fail;
    if (vars && !cJSON_IsObject(vars)) {
        pgd_err_set(&err, PGD_EFORMAT, "%s: must be a JSON object", vars_path);
        goto fail;
    }
    /* The conversation: an array, or {"messages": [...], "tools": [...]}. */
    cJSON *m = msgs, *t = tools;
    if (cJSON_IsObject(msgs)) {
        m = cJSON_GetObjectItemCaseSensitive(msgs, "messages");
        if (!t) t = cJSON_GetObjectItemCaseSensitive(msgs, "tools");
    }
    if (!cJSON_IsArray(m)) {
        pgd_err_set(&err, PGD_EFORMAT, "%s: expected an array of messages or {\"messages\": [...]}",
                    msgs_path);
        goto fail;
    }

    /* Variables as transformers' render_jinja_template passes them: tools and documents are
     * always defined (None when absent); extra variables first so that the fixed ones win. */
    rc = PGD_ENOMEM;
    if (!(ctx = cJSON_CreateObject())) goto fail;
    if (vars)
        for (cJSON *v = vars->child; v; v = v->next)
            if (!cJSON_AddItemToObject(ctx, v->string, cJSON_Duplicate(v, true))) goto fail;
    const char *bos_s = bos_arg ? bos_arg : bos, *eos_s = eos_arg ? eos_arg : eos;
    cJSON_DeleteItemFromObjectCaseSensitive(ctx, "messages");
    cJSON_DeleteItemFromObjectCaseSensitive(ctx, "tools");
    cJSON_DeleteItemFromObjectCaseSensitive(ctx, "documents");
    cJSON_DeleteItemFromObjectCaseSensitive(ctx, "add_generation_prompt");
    if (!cJSON_AddItemToObject(ctx, "messages", cJSON_Duplicate(m, true)) ||
        !cJSON_AddItemToObject(
            ctx, "tools", t && !cJSON_IsNull(t) ? cJSON_Duplicate(t, true) : cJSON_CreateNull()) ||
        !cJSON_AddNullToObject(ctx, "documents") ||
        !cJSON_AddBoolToObject(ctx, "add_generation_prompt", gen))
        goto fail;
    if (bos_s) {
        cJSON_DeleteItemFromObjectCaseSensitive(ctx, "bos_token");
        if (!cJSON_AddStringToObject(ctx, "bos_token", bos_s)) goto fail;
    }
    if (eos_s) {
        cJSON_DeleteItemFromObjectCaseSensitive(ctx, "eos_token");
        if (!cJSON_AddStringToObject(ctx, "eos_token", eos_s)) goto fail;
    }

    if ((rc = pgd_jinja_parse(src, src_len, &tmpl, &err))) goto fail;
    pgd_jinja_opts opts = {.now = now};
    if ((rc = pgd_jinja_render(tmpl, ctx, &opts, &out, &out_len, &err))) goto fail;
    if (fwrite(out, 1, out_len, stdout) != out_len || fflush(stdout)) {
        rc = pgd_err_set(&err, PGD_EIO, "cannot write the output");
        goto fail;
    }
    rc = 0;
fail:
    if (rc)
        fprintf(stderr, "pagoda render-template: %s\n", err.msg[0] ? err.msg : pgd_status_str(rc));
    free(out);
    pgd_jinja_free(tmpl);
    cJSON_Delete(ctx);
    cJSON_Delete(msgs);
    cJSON_Delete(tools);
    cJSON_Delete(vars);
    free(src);
    free(bos);
    free(eos);
    return rc ? 1 : 0;
}
