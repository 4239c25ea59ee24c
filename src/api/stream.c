/* The streamed chat answer's split (stream.h). */
#include "api/stream.h"

#include <stdlib.h>
#include <string.h>

#include "api/reasoning.h"
#include "api/tool_calls.h"
#include "util/xalloc.h"

void pgd_api_choice_append(pgd_api_choice *ch, const char *t, size_t n) {
    pgd_bytes_append(&ch->text, &ch->text_len, &ch->text_cap, t, n); /* (else unchanged) */
}

/* The reasoning's span of the text so far, rescanned only while it may still change: once the
 * content has started it is final. The scan is O(new bytes). */
static pgd_reasoning_span span_of(const pgd_api_request *r, pgd_api_choice *ch, bool done) {
    if (ch->r_final) return ch->r_span;
    pgd_reasoning_span sp;
    pgd_reasoning_scan((pgd_reasoning_format)r->reasoning, ch->text ? ch->text : "",
                       ch->text_len, done, ch->r_known, &sp);
    ch->r_known = ch->text_len;
    ch->r_final = sp.content;
    ch->r_span = sp;
    return sp;
}

void pgd_api_stream_split(const pgd_api_request *r, const char *id, int i, pgd_api_choice *ch,
                          const char *add, size_t add_len, const char **fin, pgd_api_delta *d) {
    pgd_api_choice_append(ch, add, add_len);
    const char *t = ch->text ? ch->text : "";
    pgd_reasoning_span sp = span_of(r, ch, *fin != NULL);
    *d = (pgd_api_delta){.reasoning = t, .content = t};
    if (sp.thinking) {
        size_t from = ch->r_emitted > sp.r_off ? ch->r_emitted : sp.r_off;
        d->reasoning = t + from;
        d->reasoning_len = sp.r_end > from ? sp.r_end - from : 0;
        ch->r_emitted = from + d->reasoning_len;
    }
    if (!sp.content) return;
    size_t base = sp.c_off, n = ch->text_len - base, safe = n; /* the content: t[base..] */
    if (ch->emitted < base) ch->emitted = base;
    if (r->tool_format) {
        bool opened = ch->t_opened;
        if (opened) {
            safe = ch->t_safe;
        } else {
            safe = pgd_tool_calls_stream_safe((pgd_tool_format)r->tool_format, t + base, n,
                                              ch->t_known, &opened);
            ch->t_known = n;
            ch->t_opened = opened;
            ch->t_safe = safe;
        }
        if (*fin) {
            safe = n; /* all of it is content, unless it holds calls */
            if (opened) d->calls = pgd_api_choice_tool_calls(r, id, i, t + base, n, &safe, fin);
        }
    }
    d->content = t + ch->emitted;
    d->content_len = base + safe > ch->emitted ? base + safe - ch->emitted : 0;
    ch->emitted += d->content_len;
}

/* The tokens up to the one after which the content began are the reasoning's (the one holding
 * "</think>" with them), none when the answer does not think; an answer that never leaves its
 * thinking is all reasoning. */
void pgd_api_count_reasoning(pgd_api_request *r, pgd_api_choice *ch, bool token, bool done,
                             bool scanned) {
    if (ch->n_reasoning < 0) return; /* counted */
    if (token) ch->n_reasoning++;
    pgd_reasoning_span sp = scanned ? ch->r_span : span_of(r, ch, done);
    if (!sp.content && !done) return;
    r->reasoning_tokens += sp.thinking ? ch->n_reasoning : 0;
    ch->n_reasoning = -1;
}
