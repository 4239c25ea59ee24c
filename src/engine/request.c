/* The request record (request.h): a submission's validation against the model and the
 * engine's limits, and its copy into a record that owns everything it points to. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_impl.h"

int pgd__fail(char *err, size_t errlen, int rc, const char *fmt, const char *arg) {
    if (err && errlen) snprintf(err, errlen, fmt, arg);
    return rc;
}

/* The record and its seq_out in one allocation (the record first: freeing it frees both). */
typedef struct seq_block {
    seq s;
    struct seq_out out;
} seq_block;

void pgd__seq_free(seq *s) {
    if (!s) return;
    free(s->tokens);
    pgd_kv_seq_free(&s->kv);
    if (s->out) { /* (a record made without one: the scheduler's tests) */
        pgd_draft_seq_free(&s->out->dseq);
        pgd_sampler_free(&s->out->sampler);
    }
    pgd_constraint_free(s->cons);
    for (int i = 0; i < s->n_stop; i++) free(s->stop[i]);
    free(s->stop_ids);
    free(s->allowed);
    free(s->text);
    free(s);
}

/* The request holds its output to a grammar: its text, or compiled already. */
static bool wants_grammar(const pgd_request_params *p) { return p->grammar || p->grammar_c; }

/* s's copies of p's stop token ids and allowed token ids (as a mask): PGD_OK
 * or PGD_ENOMEM (what was copied is freed with s). */
static int copy_constraints(pgd_engine *e, seq *s, const pgd_request_params *p) {
    int32_t nv = e->model->cfg.n_vocab;
    s->include_stop = p->include_stop;
    if (p->n_stop_token_ids) {
        if (!(s->stop_ids = malloc((size_t)p->n_stop_token_ids * sizeof *s->stop_ids)))
            return PGD_ENOMEM;
        memcpy(s->stop_ids, p->stop_token_ids, (size_t)p->n_stop_token_ids * sizeof *s->stop_ids);
        s->n_stop_ids = p->n_stop_token_ids;
    }
    if (p->n_allowed_token_ids) {
        if (!(s->allowed = calloc((size_t)nv, 1))) return PGD_ENOMEM;
        for (int32_t i = 0; i < p->n_allowed_token_ids; i++)
            s->allowed[p->allowed_token_ids[i]] = 1;
    }
    return PGD_OK;
}

/* s's output constraint for p (one kind at most: validated), or none: PGD_OK, or a negative
 * status with the error line in why. */
static int kind_constraint(pgd_engine *e, seq *s, const pgd_request_params *p, char *why,
                          size_t whylen) {
    int32_t nv = e->model->cfg.n_vocab;
    if (p->n_choices) {
        int rc = pgd_constraint_choice_new(p->choices, p->n_choices, &s->cons);
        if (rc) snprintf(why, whylen, "out of memory");
        return rc;
    }
    if (p->regex)
        return pgd_constraint_regex_new(p->regex, p->regex_dfa, nv, &s->cons, why, whylen);
    if (wants_grammar(p))
        return pgd_constraint_grammar_new(p->grammar, p->grammar_c, nv, &s->cons, why, whylen);
    if (p->json_object || p->json_schema)
        return pgd_constraint_json_new(p->json_schema, p->json_schema ? p->json_schema_c : NULL,
                                       p->json_prefix, p->json_suffix, &s->cons, why, whylen);
    return PGD_OK;
}

/* The kind's constraint, behind a "think first" wrapper when p says the answer reasons before
 * it (constrain_after; think_open: the answer may open the thinking with that token -- one the
 * vocabulary lacks leaves the constraint on from the first token). */
static int new_constraint(pgd_engine *e, seq *s, const pgd_request_params *p, char *why,
                          size_t whylen) {
    int rc = kind_constraint(e, s, p, why, whylen);
    if (rc || !s->cons || !p->constrain_after || !*p->constrain_after) return rc;
    int32_t tok = p->think_open ? pgd_json_vocab_find(&e->json_vocab, p->think_open,
                                                      strlen(p->think_open))
                                : -1;
    if (p->think_open && tok < 0) return PGD_OK;
    pgd_constraint *inner = s->cons;
    s->cons = NULL;
    if ((rc = pgd_constraint_think_first_new(inner, p->constrain_after, tok, &s->cons)))
        snprintf(why, whylen, "%s", rc == PGD_ENOMEM ? "out of memory"
                                                     : "constrain_after is too long");
    return rc;
}

int pgd__request_new(pgd_engine *e, const pgd_request_params *p, seq **out, char *err,
                     size_t errlen) {
    char msg[200];
    *out = NULL;
    const pgd_model_config *mc = &e->model->cfg;
    if (p->n_prompt < 1 || !p->prompt)
        return pgd__fail(err, errlen, PGD_EINVAL, "%s", "the prompt is empty");
    if (p->lora < 0 || p->lora > e->n_loras)
        return pgd__fail(err, errlen, PGD_EINVAL, "%s", "no such LoRA adapter slot");
    if (p->max_tokens < 0)
        return pgd__fail(err, errlen, PGD_EINVAL, "%s", "max_tokens must not be negative");
    if (p->priority && !e->cfg.priority_scheduling)
        return pgd__fail(err, errlen, PGD_EINVAL, "%s", "a priority other than 0 needs priority "
                         "scheduling (--scheduling-policy priority)");
    if (p->embedding && p->max_tokens)
        return pgd__fail(err, errlen, PGD_EINVAL, "%s", "an embedding request generates nothing");
    for (int32_t i = 0; i < p->n_prompt; i++)
        if (p->prompt[i] < 0 || p->prompt[i] >= mc->n_vocab) {
            snprintf(msg, sizeof msg, "token id %d is outside the vocabulary (0..%d)",
                     p->prompt[i], mc->n_vocab - 1);
            return pgd__fail(err, errlen, PGD_EINVAL, "%s", msg);
        }
    if ((int64_t)p->n_prompt + p->max_tokens > e->n_ctx) {
        snprintf(msg, sizeof msg, "the prompt (%d tokens) plus max_tokens (%d) exceeds the "
                 "context length (%d tokens)", p->n_prompt, p->max_tokens, e->n_ctx);
        return pgd__fail(err, errlen, PGD_EINVAL, "%s", msg);
    }
    int64_t need = ((int64_t)p->n_prompt + p->max_tokens + e->cfg.block_size - 1) /
                   e->cfg.block_size;
    if (need > e->mgr.n_blocks) {
        snprintf(msg, sizeof msg, "the prompt (%d tokens) plus max_tokens (%d) needs %lld KV "
                 "blocks; the whole pool has %d", p->n_prompt, p->max_tokens, (long long)need,
                 e->mgr.n_blocks);
        return pgd__fail(err, errlen, PGD_EINVAL, "%s", msg);
    }
    if (!(p->temperature >= 0) || !(p->top_p >= 0 && p->top_p <= 1) || p->top_k < 0)
        return pgd__fail(err, errlen, PGD_EINVAL, "%s",
                         "temperature must be >= 0, top_p in [0, 1], top_k >= 0");
    if (p->n_stop < 0 || p->n_stop > MAX_STOP)
        return pgd__fail(err, errlen, PGD_EINVAL, "%s", "at most 16 stop strings");
    if (p->n_stop > 0 && !e->model->tok)
        return pgd__fail(err, errlen, PGD_EUNSUPPORTED, "%s", "stop strings need a tokenizer; "
                         "the model has none (--load-format dummy)");
    bool json = p->json_object || p->json_schema;
    if (json && !e->model->tok)
        return pgd__fail(err, errlen, PGD_EUNSUPPORTED, "%s", "JSON output needs a tokenizer; "
                         "the model has none (--load-format dummy)");
    bool gram = wants_grammar(p);
    if ((json || p->n_choices || p->regex || gram) && p->min_tokens > 0)
        return pgd__fail(err, errlen, PGD_EINVAL, "%s", "min_tokens cannot be combined with "
                         "structured output (JSON, choices, a regex, a grammar), which ends "
                         "where it is whole");
    for (int32_t i = 0; i < p->n_stop; i++) {
        size_t l = p->stop[i] ? strlen(p->stop[i]) : 0;
        if (l == 0 || l > MAX_STOP_LEN)
            return pgd__fail(err, errlen, PGD_EINVAL, "%s", "stop strings must be 1 to 64 bytes");
    }
    int32_t nv = e->model->cfg.n_vocab;
    if (p->n_stop_token_ids < 0 || p->n_stop_token_ids > MAX_STOP_IDS ||
        p->n_allowed_token_ids < 0 || p->n_allowed_token_ids > nv)
        return pgd__fail(err, errlen, PGD_EINVAL, "%s", "too many stop or allowed token ids");
    for (int32_t i = 0; i < p->n_stop_token_ids + p->n_allowed_token_ids; i++) {
        int32_t t = i < p->n_stop_token_ids ? p->stop_token_ids[i]
                                            : p->allowed_token_ids[i - p->n_stop_token_ids];
        if (t < 0 || t >= nv)
            return pgd__fail(err, errlen, PGD_EINVAL, "%s", "a stop or allowed token id is outside "
                             "the vocabulary");
    }
    if (p->n_choices < 0 || p->n_choices > PGD_MAX_CHOICES)
        return pgd__fail(err, errlen, PGD_EINVAL, "%s", "too many choices");
    if ((p->n_choices || p->regex || gram) && !e->model->tok)
        return pgd__fail(err, errlen, PGD_EINVAL, "%s", "choices, regular expressions and grammars "
                         "need a tokenizer; the model has none (--load-format dummy)");
    if (json + (p->n_choices > 0) + (p->regex != NULL) + gram > 1)
        return pgd__fail(err, errlen, PGD_EINVAL, "%s", "one kind of structured output at a time "
                         "(JSON, choices, a regular expression or a grammar)");
    for (int32_t i = 0; i < p->n_choices; i++) {
        size_t l = p->choices[i] ? strlen(p->choices[i]) : 0;
        if (l == 0 || l > PGD_MAX_CHOICE_LEN)
            return pgd__fail(err, errlen, PGD_EINVAL, "%s", "choices must be 1 to 4096 bytes");
    }
    seq_block *b = calloc(1, sizeof *b); /* the record and its output state, freed as one */
    if (!b) return pgd__fail(err, errlen, PGD_ENOMEM, "%s", "out of memory");
    seq *s = &b->s;
    s->out = &b->out;
    int rc;
    s->tokens = malloc(((size_t)p->n_prompt + (size_t)p->max_tokens) * sizeof *s->tokens);
    /* 8 bytes a token, and room for the longest token's text beyond (text_reserve) */
    s->text_cap = (size_t)p->max_tokens * 8 + 64 +
                  (e->model->tok ? pgd_detok_cap(e->model->tok) : 0);
    s->text = malloc(s->text_cap);
    pgd_sampler_params sp = {.temperature = p->temperature,
                             .top_p = p->top_p > 0 ? p->top_p : 1.0f,
                             .top_k = p->top_k, .min_p = p->min_p,
                             .presence_penalty = p->presence_penalty,
                             .frequency_penalty = p->frequency_penalty,
                             .repetition_penalty = p->repetition_penalty,
                             .bias_ids = p->logit_bias_ids, .bias = p->logit_bias,
                             .n_bias = p->n_logit_bias, .min_tokens = p->min_tokens,
                             .seed = p->seed};
    pgd_err serr = {{0}};
    int src = !s->tokens || !s->text || pgd_kv_seq_init(&s->kv, e->max_blocks_per_seq) ||
                      (e->spec_mode == PGD_SPEC_DRAFT && pgd_draft_seq_init(&e->draft, &s->out->dseq))
                  ? PGD_ENOMEM
                  : pgd_sampler_init(&s->out->sampler, &sp, &e->sample_scratch, &serr);
    if (src) {
        rc = pgd__fail(err, errlen, src, "%s", src == PGD_ENOMEM ? "out of memory" : serr.msg);
        goto fail;
    }
    if (p->logprobs < -1 || p->logprobs > PGD_MAX_TOP_LOGPROBS || p->prompt_top_logprobs < 0 ||
        p->prompt_top_logprobs > PGD_MAX_TOP_LOGPROBS) {
        rc = pgd__fail(err, errlen, PGD_EINVAL, "%s", "logprobs must be between 0 and 20");
        goto fail;
    }
    /* a zeroed params struct means no logprobs: -1 and 0 differ only for callers that ask */
    s->logprobs = p->logprobs;
    s->prompt_lp = p->prompt_logprobs;
    s->embed_out = p->embedding;
    s->prompt_top = p->prompt_top_logprobs;
    /* constrained requests speculate too: advance verifies proposal j under the mask of the
     * state after the tokens it emitted before it (a refused proposal has p = 0: rejected, and
     * the replacement comes from the masked distribution), so the output distribution is the
     * constrained one, as without proposals */
    s->spec = e->spec_mode != PGD_SPEC_NONE && !p->no_speculation;
    if (copy_constraints(e, s, p)) {
        rc = pgd__fail(err, errlen, PGD_ENOMEM, "%s", "out of memory");
        goto fail;
    }
    char why[256];
    if ((rc = new_constraint(e, s, p, why, sizeof why))) {
        rc = pgd__fail(err, errlen, rc, "%s", why);
        goto fail;
    }
    pgd_spec_adapt_init(&s->out->adapt, e->spec_k);
    memcpy(s->tokens, p->prompt, (size_t)p->n_prompt * sizeof *s->tokens);
    s->n_prompt = s->n_tokens = p->n_prompt;
    s->max_tokens = p->max_tokens;
    s->user_data = p->user_data;
    s->ignore_eos = p->ignore_eos;
    s->priority = p->priority;
    for (int32_t i = 0; i < p->n_stop; i++) {
        s->stop[i] = strdup(p->stop[i]);
        if (!s->stop[i]) {
            rc = pgd__fail(err, errlen, PGD_ENOMEM, "%s", "out of memory");
            goto fail;
        }
        s->n_stop++;
        int32_t l = (int32_t)strlen(p->stop[i]);
        if (l - 1 > s->hold) s->hold = l - 1;
    }
    pgd_detok_init(&s->out->detok, e->model->tok, p->render_special);
    /* SentencePiece decoders drop the leading space of the text's first piece; generated text
     * continues the prompt, so that applies only when the prompt is BOS alone. */
    s->out->detok.first = e->model->tok && p->n_prompt == 1 &&
                     p->prompt[0] == pgd_tokenizer_bos(e->model->tok);
    s->logit_row = -1;
    s->stop_str = s->stop_tok = -1;
    *out = s;
    return PGD_OK;
fail:
    pgd__seq_free(s);
    return rc;
}
