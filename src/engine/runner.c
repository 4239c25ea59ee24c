/* The runner: flattens a step's sequences into one batch (tokens, positions, KV slots, block
 * tables, logits rows for sampling, speculation, prompt logprobs and embeddings), plans which
 * rows the backend samples, and runs the forward pass. It makes no policy decision: the
 * scheduler chose the sequences and their chunks. */
#include <string.h>

#include "engine/engine_impl.h"

/* Asks the request's proposer for up to cap proposals, written after its last token. */
int32_t pgd__propose(void *ctx, seq *s, int32_t cap) {
    pgd_engine *e = ctx;
    int32_t k = pgd_spec_adapt_want(&s->out->adapt);
    int32_t left = s->max_tokens - (s->n_tokens - s->n_prompt) - 1; /* after the next token */
    if (k > left) k = left;
    if (k > cap) k = cap;
    if (s->n_tokens + k > e->n_ctx) k = e->n_ctx - s->n_tokens;
    if (k <= 0) return 0;
    int32_t *out = s->tokens + s->n_tokens;
    if (e->spec_mode == PGD_SPEC_NGRAM)
        return pgd_spec_ngram_propose(s->tokens, s->n_tokens, e->ngram_min, e->ngram_max, k, out);
    return pgd_draft_propose(&e->draft, &s->out->dseq, s->tokens, s->n_tokens, k, out);
}

/* Whether s's next token can be sampled on the backend: its chain is temperature, top-k, top-p
 * and min-p alone -- no processor that reads the history, the bias or a mask (JSON, choices, a
 * regex, allowed ids), no logprobs (they need the logits), no proposals to verify. */
static bool device_sampleable(const pgd_engine *e, const seq *s) {
    const pgd_sampler_params *p = &s->out->sampler.params;
    return s->n_draft == 0 && s->logprobs < 0 && p->n_bias == 0 && !constrained_output(s) &&
           !s->allowed &&
           (p->repetition_penalty == 0 || p->repetition_penalty == 1) &&
           p->presence_penalty == 0 && p->frequency_penalty == 0 &&
           ((e->n_eog == 0 && s->n_stop_ids == 0) || s->n_tokens - s->n_prompt >= p->min_tokens);
}

/* Fills the backend's sample rows for the step's sampleable sequences, each draw's u from the
 * sequence's own generator (none for greedy ones, as on the host). The other rows (placeholders:
 * greedy) are sampled on the host from logits the batch then asks for too, so a sequence's
 * tokens never depend on what shares its step. */
static void plan_device_sampling(pgd_engine *e, int32_t ns, pgd_batch *b) {
    int32_t n_dev = 0, n_host = 0;
    memset(e->b_sample, 0, (size_t)b->n_logits * sizeof *e->b_sample);
    for (int32_t i = 0; i < ns; i++) {
        seq *s = e->b_seqs[i];
        if (s->lp_n > 0) n_host++; /* prompt logprobs are computed from host logits */
        if (s->logit_row < 0) continue;
        if (!device_sampleable(e, s)) {
            n_host++;
            continue;
        }
        const pgd_sampler_params *p = &s->out->sampler.params;
        pgd_sample_row *r = &e->b_sample[s->logit_row];
        *r = (pgd_sample_row){.temperature = p->temperature, .top_p = p->top_p,
                              .min_p = p->min_p, .top_k = p->top_k};
        if (p->temperature > 0 && p->top_k != 1) r->u = pgd_sampler_uniform_f32(&s->out->sampler);
        s->dev_sampled = true;
        n_dev++;
    }
    if (n_dev == 0) return;
    b->sample = e->b_sample;
    b->sampled = e->b_sampled;
    b->need_logits = n_host > 0;
}

int pgd__run(pgd_engine *e, int32_t ns, int32_t *n_tokens) {
    int32_t nt = 0, nl = 0, bs = e->cfg.block_size;
    bool b_hidden = false;
    for (int32_t i = 0; i < ns; i++) {
        seq *s = e->b_seqs[i];
        e->b_tables[i] = s->kv.table;
        e->b_lora[i] = s->lora;
        for (int32_t j = 0; j < s->sched_n; j++) {
            int32_t p = s->n_computed + j;
            e->b_tokens[nt] = s->tokens[p];
            e->b_pos[nt] = p;
            e->b_seq[nt] = i;
            e->b_slot[nt] = (int64_t)s->kv.table[p / bs] * bs + p % bs;
            nt++;
        }
        s->logit_row = -1;
        s->dev_sampled = false;
        s->lp_n = 0;
        if (s->prompt_lp) { /* rows of the prompt positions owing a logprob, in order */
            int32_t c = s->n_computed, a = s->lp_pos;
            PGD_ASSERT(c <= a || a >= s->n_prompt - 1); /* no owed position is skipped */
            int32_t z = c + s->sched_n < s->n_prompt - 1 ? c + s->sched_n : s->n_prompt - 1;
            s->lp_row = nl;
            for (int32_t p = a; p < z; p++) e->b_rows[nl++] = nt - s->sched_n + (p - c);
            s->lp_n = z > a ? z - a : 0;
        }
        if (s->n_draft > 0) { /* every row: the k proposals and the bonus position */
            s->logit_row = nl;
            for (int32_t j = s->sched_n; j > 0; j--) e->b_rows[nl++] = nt - j;
        } else if (s->n_computed + s->sched_n == s->n_tokens && s->max_tokens > 0) {
            s->logit_row = nl;
            e->b_rows[nl++] = nt - 1;
        }
        s->embed_row = -1;
        if (s->embed_out && s->n_computed + s->sched_n == s->n_tokens) {
            s->embed_row = nl; /* (max_tokens is 0: no logit_row) */
            e->b_rows[nl++] = nt - 1;
            b_hidden = true;
        }
    }
    PGD_ASSERT(nl <= e->max_logits);
    *n_tokens = nt;
    pgd_batch b = {.n_tokens = nt, .tokens = e->b_tokens, .pos = e->b_pos, .seq = e->b_seq,
                   .slot = e->b_slot, .block_tables = e->b_tables, .n_logits = nl,
                   .logit_rows = e->b_rows, .hidden = b_hidden ? e->hidden : NULL,
                   .seq_lora = e->n_loras ? e->b_lora : NULL};
    if (e->device_sampling && nl > 0) plan_device_sampling(e, ns, &b);
    if (e->n_loras) pthread_mutex_lock(&e->fwd_mu); /* (a load installs between passes) */
    int rc = pgd_model_forward(&e->fwd, &e->kv, &b);
    if (e->n_loras) pthread_mutex_unlock(&e->fwd_mu);
    return rc;
}
