/* The output path, after the forward pass: sampling (with the output constraints' masks:
 * JSON, choices, a regex, a grammar, allowed ids), speculative verification, stop tokens and
 * strings, detokenization, logprobs and prompt logprobs, embeddings, and the events of it all,
 * written to the step's buffer (engine.c publishes them). Engine thread; no lock held. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_impl.h"
#include "util/clock.h"

_Static_assert(PGD_SPEC_MAX_K == PGD_SPEC_MAX_TOKENS, "one limit on proposals");

#define GRAMMAR_WORK_MSG                                                                         \
    "the grammar is too ambiguous here: its token mask needs more than 10^7 parse steps"

/* Room for `need` more bytes of s->text: 0, or PGD_ENOMEM (the text is left as it was). Grows
 * rarely: the text starts with 8 bytes per token of max_tokens. */
static int text_reserve(seq *s, size_t need) {
    if (s->text_len + need <= s->text_cap) return 0;
    size_t nc = (s->text_len + need) * 2;
    char *t = realloc(s->text, nc);
    if (!t) return PGD_ENOMEM;
    s->text = t;
    s->text_cap = nc;
    return 0;
}

/* The longest prefix of t[0..n) of at most max bytes that ends on a character boundary (an
 * event's text is whole characters). */
static size_t utf8_cut(const char *t, size_t n, size_t max) {
    if (n <= max) return n;
    size_t k = max;
    while (k > 0 && ((unsigned char)t[k] & 0xC0) == 0x80) k--;
    return k;
}

/* s's FINISH event, into its reserved slot at the next publish. */
static void emit_finish(pgd_engine *e, seq *s, pgd_finish_reason why, const char *error) {
    pgd_event *ev = pgd__step_event(e);
    ev->type = PGD_EVENT_FINISH;
    ev->request_id = s->id;
    ev->user_data = s->user_data;
    ev->token = -1;
    ev->finish_reason = why;
    ev->n_prompt = s->n_prompt;
    ev->n_completion = s->n_tokens - s->n_prompt;
    ev->n_cached = s->n_cached;
    ev->n_spec_draft_tokens = s->n_spec_draft;
    ev->n_spec_accepted = s->n_spec_accepted;
    ev->queue_seconds = s->admitted_once ? s->queue_seconds : pgd_now_s() - s->t_submit;
    ev->stop_string = why == PGD_FINISH_STOP ? s->stop_str : -1;
    ev->stop_token = why == PGD_FINISH_STOP ? s->stop_tok : -1;
    size_t rest = s->text_len > s->emitted ? s->text_len - s->emitted : 0;
    rest = utf8_cut(s->text + s->emitted, rest, PGD_EVENT_TEXT_MAX);
    if (rest) memcpy(ev->text, s->text + s->emitted, rest);
    ev->text_len = (int32_t)rest;
    s->emitted += rest;
    ev->error[0] = 0;
    if (error) snprintf(ev->error, sizeof ev->error, "%s", error);
}

static bool in_ids(const int32_t *ids, int32_t n, int32_t id) {
    for (int32_t i = 0; i < n; i++)
        if (ids[i] == id) return true;
    return false;
}

/* Appends the text of token id and decides whether s is finished. */
static pgd_finish_reason accept_token(pgd_engine *e, seq *s, int32_t id, pgd_event *ev) {
    s->tokens[s->n_tokens++] = id;
    ev->type = PGD_EVENT_TOKEN;
    ev->request_id = s->id;
    ev->user_data = s->user_data;
    ev->token = id;
    ev->text_len = 0;
    ev->text_offset = (int32_t)s->text_len;
    if (!e->model->tok) { /* no tokenizer: ids only, no text and no end-of-generation token */
        if (in_ids(s->stop_ids, s->n_stop_ids, id)) {
            s->stop_tok = id;
            return PGD_FINISH_STOP;
        }
        return s->n_tokens - s->n_prompt >= s->max_tokens || s->n_tokens >= e->n_ctx
                   ? PGD_FINISH_LENGTH
                   : 0;
    }
    /* an end-of-generation or stop token ends it without its text (vLLM's rule; with
     * include_stop its text stays, as vLLM keeps it then) */
    bool eog = !s->ignore_eos && pgd_tokenizer_is_eog(e->model->tok, id);
    if (!eog && in_ids(s->stop_ids, s->n_stop_ids, id)) s->stop_tok = id;
    pgd_finish_reason why = eog || s->stop_tok >= 0 ? PGD_FINISH_STOP : 0;
    if (why && !s->include_stop) return why;
    if (text_reserve(s, pgd_detok_cap(e->model->tok)) == 0) {
        int nb = pgd_detok_push(&s->out->detok, id, s->text + s->text_len, s->text_cap - s->text_len);
        if (nb > 0) s->text_len += (size_t)nb;
    } /* out of memory: the token's text is lost, the generation goes on */
    /* no stop string ends the generation before min_tokens (as in vLLM, whose stop check
     * returns early until then) */
    int n_stop = !why && s->n_tokens - s->n_prompt >= s->out->sampler.params.min_tokens ? s->n_stop : 0;
    for (int i = 0; i < n_stop; i++) {
        /* a match must start at or after emitted: earlier text was checked when emitted */
        size_t from = s->emitted, l = strlen(s->stop[i]);
        char *hit = memmem(s->text + from, s->text_len - from, s->stop[i], l);
        if (hit) {
            s->text_len = (size_t)(hit - s->text) + (s->include_stop ? l : 0);
            s->stop_str = i;
            why = PGD_FINISH_STOP;
        }
    }
    if (!why && (s->n_tokens - s->n_prompt >= s->max_tokens || s->n_tokens >= e->n_ctx))
        why = PGD_FINISH_LENGTH;
    size_t end = s->text_len;
    if (!why && s->hold) {
        end = s->text_len > (size_t)s->hold ? s->text_len - (size_t)s->hold : 0;
        while (end > s->emitted && (s->text[end] & 0xC0) == 0x80) end--; /* UTF-8 boundary */
    }
    if (end > s->emitted) {
        size_t k = utf8_cut(s->text + s->emitted, end - s->emitted, PGD_EVENT_TEXT_MAX);
        memcpy(ev->text, s->text + s->emitted, k);
        ev->text_len = (int32_t)k;
        s->emitted += k;
    }
    return why;
}

/* Emits the token event of id, chosen from logits (raw, for logprobs). */
static pgd_finish_reason emit_token(pgd_engine *e, seq *s, int32_t id, const float *logits) {
    pgd_event *ev = pgd__step_event(e);
    pgd_finish_reason why = accept_token(e, s, id, ev);
    if (s->logprobs >= 0) {
        ev->logprob = pgd_logprobs(logits, e->model->cfg.n_vocab, id, s->logprobs, ev->top_ids,
                                   ev->top_logprobs);
        ev->n_top = s->logprobs;
    }
    e->stats.generation_tokens_total++;
    return why;
}

/* The log-probability, alternatives and rank of lp_rows[lp_todo[i]]'s token (a pool chunk). */
static void score_row(void *ctx, long i, int ith) {
    (void)ith;
    pgd_engine *e = ctx;
    int32_t row = e->lp_todo[i], nv = e->model->cfg.n_vocab;
    struct lp_row *r = &e->lp_rows[row];
    const float *lg = e->fwd.logits + (size_t)row * nv;
    r->logprob = pgd_logprobs(lg, nv, r->token, r->n_top, r->top_ids, r->top_logprobs);
    int32_t above = 0; /* the tokens more likely than it (vLLM's rank) */
    for (int32_t t = 0; t < nv; t++) above += lg[t] > lg[r->token];
    r->rank = above + 1;
}

/* Scores the prompt positions of this step's sequences into lp_rows, a row per chunk of the
 * pool: a log-softmax over the vocabulary each (49k-152k exps), too much for the engine thread
 * alone when a step holds hundreds of them. */
void pgd__score_prompts(pgd_engine *e, int32_t ns) {
    int32_t n = 0;
    for (int32_t i = 0; i < ns; i++) {
        const seq *s = e->b_seqs[i];
        for (int32_t j = 0; j < s->lp_n; j++) {
            struct lp_row *r = &e->lp_rows[s->lp_row + j];
            r->token = s->tokens[s->lp_pos + j + 1];
            r->n_top = s->prompt_top;
            e->lp_todo[n++] = s->lp_row + j;
        }
    }
    if (n) pgd_pool_run_chunks(e->pool, score_row, e, n);
}

/* Emits the prompt-token events of s whose logits this step computed (rows lp_row.. lp_row +
 * lp_n, positions lp_pos..), token 0's (no logprob) first. */
static void emit_prompt_logprobs(pgd_engine *e, seq *s) {
    for (int32_t j = s->lp_started ? 0 : -1; j < s->lp_n; j++) {
        pgd_event *ev = pgd__step_event(e);
        int32_t p = s->lp_pos + j; /* scores token p + 1 */
        ev->type = PGD_EVENT_PROMPT_TOKEN;
        ev->request_id = s->id;
        ev->user_data = s->user_data;
        ev->token = s->tokens[p + 1];
        ev->text_offset = p + 1;
        ev->n_top = -1;
        if (j < 0) continue;
        const struct lp_row *r = &e->lp_rows[s->lp_row + j];
        ev->logprob = r->logprob;
        ev->rank = r->rank;
        ev->n_top = r->n_top;
        memcpy(ev->top_ids, r->top_ids, (size_t)r->n_top * sizeof *r->top_ids);
        memcpy(ev->top_logprobs, r->top_logprobs, (size_t)r->n_top * sizeof *r->top_logprobs);
    }
    s->lp_started = true;
    s->lp_pos += s->lp_n;
    s->lp_n = 0;
}

/* What the constraints read and write with: e's vocabulary bytes, end-of-generation tokens and
 * grammar scratch. */
static pgd_constraint_env constraint_env(pgd_engine *e) {
    return (pgd_constraint_env){.vocab = &e->json_vocab, .eog = e->eog, .n_eog = e->n_eog,
                                .n_vocab = e->model->cfg.n_vocab, .gr_scratch = e->gr_scratch,
                                .gr_key = &e->gr_key};
}

/* SentencePiece with a dummy prefix after a prompt of BOS alone: the detokenizer drops the
 * next piece's leading space (pgd_detok), so the constraints must not see it either. */
static bool drops_space(const pgd_engine *e, const seq *s) {
    return e->model->tok && pgd_detok_drops_space(&s->out->detok);
}

/* The bytes token id adds to the text: its piece, less a leading space when drop. */
static const char *token_text(const pgd_engine *e, int32_t id, bool drop, size_t *n) {
    const char *t = e->json_vocab.text[id];
    *n = e->json_vocab.len[id];
    if (drop && *n > 0 && t[0] == ' ') t++, (*n)--;
    return t;
}

/* The mask of s's next token in e->json_allow, when it has one: its constraint's,
 * narrowed to allowed_token_ids, and without the stop tokens while output < min_tokens. */
static bool build_mask(pgd_engine *e, seq *s) {
    int32_t nv = e->model->cfg.n_vocab;
    bool under_min = s->n_stop_ids > 0 && s->n_tokens - s->n_prompt < s->out->sampler.params.min_tokens;
    bool constrained = constrained_output(s);
    uint8_t *a = e->json_allow;
    if (constrained) {
        /* the first token of a SentencePiece answer after BOS alone is read less its leading
         * space (not memoized: other masks see whole pieces) */
        pgd_constraint_env env = constraint_env(e);
        int rc = drops_space(e, s) ? pgd_constraint_mask_drop_space(s->cons, &env, a)
                                   : pgd_constraint_mask(s->cons, &env, a);
        if (rc < 0) {
            /* nothing allowed: the sample fails and ends the request with this */
            s->err_msg = GRAMMAR_WORK_MSG;
            return true;
        }
        constrained = rc != PGD_CONSTRAINT_FREE; /* (a think-first wrapper while thinking) */
    }
    if (!constrained && !s->allowed && !under_min) return false;
    if (!constrained) { /* allowed_token_ids alone (or the stop tokens under min_tokens) */
        if (s->allowed) memcpy(a, s->allowed, (size_t)nv);
        else memset(a, 1, (size_t)nv);
    }
    if (s->allowed && constrained)
        for (int32_t i = 0; i < nv; i++) a[i] &= s->allowed[i];
    if (under_min)
        for (int32_t i = 0; i < s->n_stop_ids; i++) a[s->stop_ids[i]] = 0;
    return true;
}

/* Moves s's constraint (any kind, think-first included) over token id. drop: the token's
 * leading space was dropped from the text (drops_space before it was emitted). */
static pgd_finish_reason constraint_advance(pgd_engine *e, seq *s, int32_t id, bool drop) {
    if (!constrained_output(s)) return 0; /* (and maybe no vocabulary) */
    size_t n;
    const char *t = token_text(e, id, drop, &n);
    pgd_constraint_env env = constraint_env(e);
    switch (pgd_constraint_accept(s->cons, &env, id, t, n)) {
    case PGD_CONSTRAINT_DONE: return PGD_FINISH_STOP;
    case PGD_CONSTRAINT_REFUSED: return PGD_FINISH_ERROR;
    default: return 0;
    }
}

/* After the forward pass: samples the sequence's next token, or verifies its k proposals
 * (rows logit_row .. logit_row + k) and takes the accepted ones plus one more -- a replacement
 * for the first rejected, or the bonus token after the last. Rolls the KV back to what
 * survived and commits full blocks to the prefix cache. Returns a finish reason or 0. */
static pgd_finish_reason advance(pgd_engine *e, seq *s) {
    int32_t nv = e->model->cfg.n_vocab, k = s->n_draft, n_acc = 0;
    const float *rows = e->fwd.logits + (size_t)s->logit_row * nv;
    int32_t drafts[PGD_SPEC_MAX_K];
    memcpy(drafts, s->tokens + s->n_tokens, (size_t)k * sizeof *drafts);
    s->n_draft = 0;
    pgd_finish_reason why = 0;
    for (int32_t j = 0; j <= k && !why; j++) {
        const float *lg = rows + (size_t)j * nv;
        if (s->dev_sampled) { /* k == 0; lg is not used: no logprobs */
            why = emit_token(e, s, e->b_sampled[s->logit_row], lg);
            break;
        }
        pgd_sampler_dist d;
        bool masked = build_mask(e, s);
        if (masked) s->out->sampler.allow = e->json_allow;
        pgd_sampler_dist_compute(&s->out->sampler, lg, s->tokens, s->n_prompt, s->n_tokens, &d);
        s->out->sampler.allow = NULL;
        bool accepted = false;
        int32_t id = j == k ? pgd_sampler_draw(&s->out->sampler, &d)
                   : e->spec_broken ? (accepted = true, drafts[j])
                                    : pgd_spec_verify_token(&s->out->sampler, &d, drafts[j], NULL,
                                                            &accepted);
        /* a masked token: the masks left none with a finite logit (allowed_token_ids outside
         * what the JSON or the choices allow, or non-finite logits) and the sampler fell back
         * on the arg-max */
        if (masked && !e->json_allow[id]) {
            why = PGD_FINISH_ERROR;
            break;
        }
        bool drop = drops_space(e, s); /* before emit_token moves the detokenizer on */
        why = emit_token(e, s, id, lg);
        if (!why) why = constraint_advance(e, s, id, drop);
        if (j == k) break;
        if (!accepted) break;
        e->stats.spec_accepted_per_pos[j]++;
        n_acc++;
    }
    if (k > 0) {
        e->stats.spec_drafts++;
        e->stats.spec_draft_tokens += k;
        e->stats.spec_accepted_tokens += n_acc;
        s->n_spec_draft += k;
        s->n_spec_accepted += n_acc;
        pgd_spec_adapt_update(&s->out->adapt, k, n_acc);
    }
    /* Finished with drafts in flight: their K/V is not worth rolling back for a sequence about
     * to be freed. */
    if (why && k > 0) return why;
    /* K/V is valid for the tokens that were inputs and survived: all but the newest. Committed
     * even when the sequence just finished, so a prompt that ends on its first token
     * (max_tokens 1) still leaves its last chunk's blocks to the prefix cache. */
    if (s->n_computed > s->n_tokens - 1) s->n_computed = s->n_tokens - 1;
    if (k > 0) pgd_kv_truncate(&e->mgr, &s->kv, s->n_computed);
    pgd_kv_commit(&e->mgr, &s->kv, s->tokens, s->n_computed);
    if (why) return why;
    if (e->spec_mode == PGD_SPEC_DRAFT) {
        int32_t dn = s->out->dseq.n_computed < s->n_tokens - 1 ? s->out->dseq.n_computed : s->n_tokens - 1;
        pgd_draft_rollback(&e->draft, &s->out->dseq, dn);
    }
    return 0;
}

/* An embedding request's vector: its row of this step's hidden states, L2-normalized (the norm
 * in double: a sum of a few thousand squares). */
static void write_embedding(pgd_engine *e, seq *s) {
    const int32_t dim = e->model->cfg.dim;
    const float *h = e->hidden + (size_t)s->embed_row * (size_t)dim;
    double ss = 0;
    for (int32_t i = 0; i < dim; i++) ss += (double)h[i] * h[i];
    float scale = ss > 0 ? (float)(1.0 / sqrt(ss)) : 1.0f;
    for (int32_t i = 0; i < dim; i++) s->embed_out[i] = h[i] * scale;
}

void pgd__finish(pgd_engine *e, seq *s, pgd_finish_reason why, const char *error) {
    pgd_sched_remove(&e->sched, s);
    pgd__lora_release(e, s);
    if (why != PGD_FINISH_ABORT && why != PGD_FINISH_ERROR) {
        /* bytes of a character the generation stopped in the middle of: one U+FFFD, as
         * Hugging Face's decode reports them, so the text stays valid UTF-8 */
        if (text_reserve(s, 3) == 0) {
            int nb = pgd_detok_flush(&s->out->detok, s->text + s->text_len, 3);
            if (nb > 0) s->text_len += (size_t)nb;
        }
    }
    emit_finish(e, s, why, error);
    pgd__seq_free(s);
}

void pgd__postprocess(pgd_engine *e, int32_t ns, int rc) {
    for (int32_t i = 0; i < ns; i++) {
        seq *s = e->b_seqs[i];
        int32_t n = s->sched_n;
        s->sched_n = 0;
        if (rc) {
            pgd__finish(e, s, PGD_FINISH_ERROR, "internal error in the forward pass");
            continue;
        }
        s->n_computed += n;
        if (s->prompt_lp && (s->lp_n || !s->lp_started)) emit_prompt_logprobs(e, s);
        if (s->embed_row >= 0) write_embedding(e, s);
        if (s->logit_row < 0) {
            pgd_kv_commit(&e->mgr, &s->kv, s->tokens, s->n_computed);
            if (s->max_tokens == 0 && s->n_computed == s->n_tokens) /* the prompt only */
                pgd__finish(e, s, PGD_FINISH_LENGTH, NULL);
            continue;
        }
        pgd_finish_reason why = advance(e, s);
        if (why)
            pgd__finish(e, s, why,
                        why != PGD_FINISH_ERROR ? NULL
                        : s->err_msg            ? s->err_msg
                                                : "no token is left that the constraints allow "
                                                  "and the model scores (allowed_token_ids "
                                                  "outside the structured output's, or "
                                                  "non-finite logits)");
    }
}
