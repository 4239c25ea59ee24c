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

#define CONTINUE_TAG "CONTINUE_FINAL_MESSAGE_TAG " /* transformers' */

/* Appends CONTINUE_TAG to the last text of the final message in msgs (its content string, or
 * the last content part with a "text"); false when it has none. */
static bool tag_final(cJSON *msgs) {
    cJSON *m = cJSON_GetArrayItem(msgs, cJSON_GetArraySize(msgs) - 1);
    cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content"), *part = NULL, *p;
    if (cJSON_IsArray(c)) {
        cJSON_ArrayForEach(p, c) if (cJSON_IsString(cJSON_GetObjectItemCaseSensitive(p, "text")))
            part = p;
        if (!part) return false;
        m = part;
        c = cJSON_GetObjectItemCaseSensitive(part, "text");
    }
    if (!cJSON_IsString(c)) return false;
    size_t n = strlen(c->valuestring);
    char *s = malloc(n + sizeof CONTINUE_TAG);
    if (!s) return false;
    memcpy(s, c->valuestring, n);
    memcpy(s + n, CONTINUE_TAG, sizeof CONTINUE_TAG);
    bool ok = cJSON_ReplaceItemInObjectCaseSensitive(m, part ? "text" : "content",
                                                     cJSON_CreateString(s));
    free(s);
    return ok;
}

/* Cuts the rendering where the tag was (transformers' rule: right before it when the template
 * kept its trailing space, else there less the whitespace before it). */
static bool cut_at_tag(char *out) {
    static const char tag[] = "CONTINUE_FINAL_MESSAGE_TAG"; /* CONTINUE_TAG without its space */
    char *at = NULL;
    for (char *p = strstr(out, tag); p; p = strstr(p + 1, tag)) at = p;
    if (!at) return false;
    bool spaced = at[sizeof tag - 1] == ' ';
    *at = 0;
    if (!spaced)
        for (size_t n = strlen(out); n > 0 && strchr(" \t\n\r", out[n - 1]); n--) out[n - 1] = 0;
    return true;
}

int pgd_chat_render(const pgd_jinja_tmpl *t, const pgd_tokenizer *tok, const cJSON *messages,
                    const cJSON *tools, const pgd_chat_opts *o, char **out, char *err,
                    size_t errlen) {
    *out = NULL;
    cJSON *ctx = cJSON_CreateObject();
    if (!ctx) {
        snprintf(err, errlen, "out of memory");
        return PGD_ENOMEM;
    }
    /* the context borrows nothing: duplicate so the caller's objects stay untouched */
    cJSON *msgs = cJSON_Duplicate(messages, true);
    cJSON_AddItemToObject(ctx, "messages", msgs);
    if (tools) cJSON_AddItemToObject(ctx, "tools", cJSON_Duplicate(tools, true));
    cJSON_AddBoolToObject(ctx, "add_generation_prompt", o->add_generation_prompt);
    add_token_string(ctx, "bos_token", tok, pgd_tokenizer_bos(tok));
    add_token_string(ctx, "eos_token", tok, pgd_tokenizer_eos(tok));
    const cJSON *kv;
    cJSON_ArrayForEach(kv, o->kwargs) {
        cJSON_DeleteItemFromObjectCaseSensitive(ctx, kv->string);
        cJSON_AddItemToObject(ctx, kv->string, cJSON_Duplicate(kv, true));
    }
    if (o->continue_final && !tag_final(msgs)) {
        cJSON_Delete(ctx);
        snprintf(err, errlen, "continue_final_message: the final message has no text to "
                              "continue");
        return PGD_EINVAL;
    }
    pgd_err e = {{0}};
    size_t len = 0;
    /* templates come from model files: bound a hostile one to well under a second of CPU */
    pgd_jinja_opts opts = {.max_steps = 5000000};
    int rc = pgd_jinja_render(t, ctx, &opts, out, &len, &e);
    cJSON_Delete(ctx);
    if (rc) snprintf(err, errlen, "%s", e.msg);
    if (!rc && o->continue_final && !cut_at_tag(*out)) {
        free(*out);
        *out = NULL;
        snprintf(err, errlen, "continue_final_message: the template does not write the final "
                              "message's text (it cannot be continued)");
        rc = PGD_EINVAL;
    }
    return rc;
}
