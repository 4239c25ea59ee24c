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

/* The length of Python's str.isspace() character ending t[0..n) (UTF-8), or 0. */
static size_t space_at_end(const char *t, size_t n) {
    static const char *const ws[] = {"\t", "\n", "\x0b", "\x0c", "\r", "\x1c", "\x1d", "\x1e",
                                     "\x1f", " ", "\xc2\x85", "\xc2\xa0", "\xe1\x9a\x80",
                                     "\xe2\x80\xa8", "\xe2\x80\xa9", "\xe2\x80\xaf",
                                     "\xe2\x81\x9f", "\xe3\x80\x80"};
    for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) {
        size_t k = strlen(ws[i]);
        if (k <= n && !memcmp(t + n - k, ws[i], k)) return k;
    }
    /* U+2000..U+200A: E2 80 80..8A */
    if (n >= 3 && (unsigned char)t[n - 3] == 0xE2 && (unsigned char)t[n - 2] == 0x80 &&
        (unsigned char)t[n - 1] >= 0x80 && (unsigned char)t[n - 1] <= 0x8A)
        return 3;
    return 0;
}

static size_t rstrip_len(const char *t, size_t n) {
    for (size_t k; (k = space_at_end(t, n)) > 0;) n -= k;
    return n;
}

/* The final message's last text (its content string, or the last content part with a "text"),
 * or NULL. */
static cJSON *final_text(cJSON *msgs, cJSON **holder, const char **key) {
    cJSON *m = cJSON_GetArrayItem(msgs, cJSON_GetArraySize(msgs) - 1);
    cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content"), *part = NULL, *p;
    *holder = m;
    *key = "content";
    if (cJSON_IsArray(c)) {
        cJSON_ArrayForEach(p, c) if (cJSON_IsString(cJSON_GetObjectItemCaseSensitive(p, "text")))
            part = p;
        if (!part) return NULL;
        *holder = part;
        *key = "text";
        c = cJSON_GetObjectItemCaseSensitive(part, "text");
    }
    return cJSON_IsString(c) ? c : NULL;
}

/* Appends CONTINUE_TAG to the final message's last text; its text before (stripped, as
 * transformers checks it) into *stripped (malloc'd). False when it has none. */
static bool tag_final(cJSON *msgs, char **stripped) {
    cJSON *holder;
    const char *key;
    cJSON *c = final_text(msgs, &holder, &key);
    if (!c) return false;
    const char *v = c->valuestring;
    size_t n = strlen(v), lead = 0;
    while (lead < n) { /* Python's strip(): both ends */
        size_t k = 0;
        for (size_t w = 1; w <= 3 && lead + w <= n && !k; w++)
            if (space_at_end(v + lead, w) == w) k = w;
        if (!k) break;
        lead += k;
    }
    size_t end = lead < n ? rstrip_len(v, n) : lead;
    char *s = malloc(n + sizeof CONTINUE_TAG);
    *stripped = malloc(end - lead + 1);
    if (!s || !*stripped) {
        free(s);
        return false;
    }
    memcpy(*stripped, v + lead, end - lead);
    (*stripped)[end - lead] = 0;
    memcpy(s, v, n);
    memcpy(s + n, CONTINUE_TAG, sizeof CONTINUE_TAG);
    bool ok = cJSON_ReplaceItemInObjectCaseSensitive(holder, key, cJSON_CreateString(s));
    free(s);
    return ok;
}

/* Cuts the rendering where the tag was (transformers' rule: right before it when the template
 * kept its trailing space, else there less the whitespace before it). False when the template
 * did not write the tag, or dropped the final message's text. */
static bool cut_at_tag(char *out, const char *stripped) {
    static const char tag[] = "CONTINUE_FINAL_MESSAGE_TAG"; /* CONTINUE_TAG without its space */
    char *at = NULL;
    for (char *p = strstr(out, tag); p; p = strstr(p + 1, tag)) at = p;
    if (!at || !strstr(out, stripped)) return false;
    bool spaced = at[sizeof tag - 1] == ' ';
    *at = 0;
    if (!spaced) out[rstrip_len(out, (size_t)(at - out))] = 0;
    return true;
}

/* The texts of content parts (parse_messages made each {"type": "text", "text": ...}) joined
 * with "\n", as vLLM joins them. */
static cJSON *joined_text(const cJSON *parts) {
    size_t n = 0;
    const cJSON *p;
    cJSON_ArrayForEach(p, parts) {
        const char *tx = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(p, "text"));
        n += (tx ? strlen(tx) : 0) + 1;
    }
    char *buf = malloc(n + 1), *w = buf;
    if (!buf) return NULL;
    cJSON_ArrayForEach(p, parts) {
        const char *tx = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(p, "text"));
        if (w != buf) *w++ = '\n';
        size_t l = strlen(tx ? tx : "");
        memcpy(w, tx ? tx : "", l);
        w += l;
    }
    *w = 0;
    cJSON *j = cJSON_CreateString(buf);
    free(buf);
    return j;
}

/* Each message's content in the form the template reads (vLLM's _parse_chat_message_content):
 * with parts false (the "string" format) a string, "" for null or absent, parts joined with
 * "\n"; with parts true (the template loops over content: "openai") a list of parts, [] for
 * null or absent, a string as one text part. A tool message's text is a string either way. */
static void content_as_template_reads(cJSON *msgs, bool parts) {
    cJSON *m;
    cJSON_ArrayForEach(m, msgs) {
        const char *role = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m, "role"));
        bool tool = role && !strcmp(role, "tool");
        cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content"), *v = NULL;
        if (!c || cJSON_IsNull(c)) {
            v = parts && !tool ? cJSON_CreateArray() : cJSON_CreateString("");
        } else if (cJSON_IsArray(c) && (tool || !parts)) {
            v = joined_text(c);
        } else if (cJSON_IsString(c) && parts && !tool) {
            v = cJSON_CreateArray();
            cJSON *p = cJSON_CreateObject();
            cJSON_AddStringToObject(p, "type", "text");
            cJSON_AddStringToObject(p, "text", c->valuestring);
            cJSON_AddItemToArray(v, p);
        }
        if (!v) continue;
        if (c) cJSON_ReplaceItemInObjectCaseSensitive(m, "content", v);
        else cJSON_AddItemToObject(m, "content", v);
    }
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
    content_as_template_reads(msgs, pgd_jinja_iterates_content(t));
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
    char *stripped = NULL;
    if (o->continue_final && !tag_final(msgs, &stripped)) {
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
    if (!rc && o->continue_final && !cut_at_tag(*out, stripped)) {
        free(*out);
        *out = NULL;
        snprintf(err, errlen, "continue_final_message: the template does not write the final "
                              "message's text (it cannot be continued)");
        rc = PGD_EINVAL;
    }
    free(stripped);
    return rc;
}
