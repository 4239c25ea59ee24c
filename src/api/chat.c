/* Chat template rendering for the server. */
#include "api/chat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void add_token_string(cJSON *ctx, const char *key, const pgd_tokenizer *tok, int32_t id) {
    char buf[256];
    int n = id >= 0 ? pgd_tokenizer_token_bytes(tok, id, true, buf, sizeof buf - 1) : 0;
    buf[n > 0 ? n : 0] = 0;
    cJSON_AddStringToObject(ctx, key, buf);
}

int pgd_chat_render(const pgd_jinja_tmpl *t, const pgd_tokenizer *tok, const cJSON *messages,
                    const cJSON *tools, bool add_generation_prompt, char **out, char *err,
                    size_t errlen) {
    *out = NULL;
    cJSON *ctx = cJSON_CreateObject();
    if (!ctx) {
        snprintf(err, errlen, "out of memory");
        return PGD_ENOMEM;
    }
    /* the context borrows nothing: duplicate so the caller's objects stay untouched */
    cJSON_AddItemToObject(ctx, "messages", cJSON_Duplicate(messages, true));
    if (tools) cJSON_AddItemToObject(ctx, "tools", cJSON_Duplicate(tools, true));
    cJSON_AddBoolToObject(ctx, "add_generation_prompt", add_generation_prompt);
    add_token_string(ctx, "bos_token", tok, pgd_tokenizer_bos(tok));
    add_token_string(ctx, "eos_token", tok, pgd_tokenizer_eos(tok));
    pgd_err e = {{0}};
    size_t len = 0;
    /* templates come from model files: bound a hostile one to well under a second of CPU */
    pgd_jinja_opts opts = {.max_steps = 5000000};
    int rc = pgd_jinja_render(t, ctx, &opts, out, &len, &e);
    cJSON_Delete(ctx);
    if (rc) snprintf(err, errlen, "%s", e.msg);
    return rc;
}
