/* Speculative decoding: proposers (n-gram prompt lookup, a draft model) and the exact
 * verification rule. The engine schedules a sequence's pending token plus k proposals as one
 * chunk, gets the target's logits for all k + 1 rows from one forward pass, and walks them with
 * pgd_spec_verify_token: the output distribution is the target's, whatever was proposed.
 *
 * Verification (Leviathan et al. 2023, Chen et al. 2023): a proposal x drawn from the draft
 * distribution q is accepted with probability min(1, p(x) / q(x)), where p is the target's
 * distribution after the request's whole logits-processor chain; on rejection the token is
 * drawn from normalize(max(0, p - q)). Both proposers here are deterministic (q is one-hot on
 * x): accept with probability p(x), else draw from p with x removed. Under greedy decoding p is
 * one-hot on the processed arg-max, so this is "accept while equal to the arg-max, then take the
 * arg-max". */
#ifndef PGD_SPEC_SPEC_H
#define PGD_SPEC_SPEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kv/kv.h"
#include "model/model.h"
#include "sample/sampler.h"
#include "util/status.h"

#define PGD_SPEC_MAX_K 16

/* ---- verification ---- */

/* Applies the rejection rule to proposal x under target distribution p (from
 * pgd_sampler_dist_compute; its candidate array is overwritten on rejection). q: the draft's
 * distribution as n_vocab probabilities, or NULL for a deterministic proposal (q(x) = 1).
 * Returns x with *accepted = true, or the replacement token with *accepted = false. Uses the
 * sampler's RNG (no draw when the outcome is certain). */
int32_t pgd_spec_verify_token(pgd_sampler *s, pgd_sampler_dist *p, int32_t x, const float *q,
                              bool *accepted);

/* ---- n-gram prompt lookup ---- */

/* Finds the most recent earlier occurrence of the last n tokens of tokens[0..n_tokens), for n
 * from n_max down to n_min, and copies up to k tokens that followed it into out. Returns the
 * number proposed (0: no match). */
int32_t pgd_spec_ngram_propose(const int32_t *tokens, int32_t n_tokens, int32_t n_min,
                               int32_t n_max, int32_t k, int32_t *out);

/* ---- per-request adaptation of k ---- */

typedef struct pgd_spec_adapt {
    int32_t k;          /* proposals to ask for next time, 1..k_max */
    int32_t k_max;
    int32_t n_fail;     /* consecutive verifications that accepted nothing */
    int32_t pause;      /* steps left without speculation */
} pgd_spec_adapt;

void pgd_spec_adapt_init(pgd_spec_adapt *a, int32_t k_max);
/* How many proposals to ask for this step (0: pause); counts down a pause. */
int32_t pgd_spec_adapt_want(pgd_spec_adapt *a);
/* Records that n_accepted of n_proposed proposals were accepted. */
void pgd_spec_adapt_update(pgd_spec_adapt *a, int32_t n_proposed, int32_t n_accepted);

/* ---- draft model ---- */

/* A smaller model with the target's vocabulary, with its own paged KV cache (no prefix
 * caching). Each sequence's draft KV holds the sequence's tokens up to d->n_computed; it is
 * caught up lazily at proposal time and rolled back with the target after verification. */
typedef struct pgd_draft {
    pgd_model *model;       /* owned */
    pgd_kv_cache kv;
    pgd_kv_mgr mgr;
    pgd_fwd fwd;            /* max_tokens = chunk, one logit row */
    int32_t chunk, n_ctx, max_blocks_per_seq;
    void *b_block;                     /* one allocation: the four arrays below */
    int32_t *b_tokens, *b_pos, *b_seq; /* (chunk) */
    int64_t *b_slot;                   /* (chunk) */
} pgd_draft;

typedef struct pgd_draft_seq {
    pgd_kv_seq kv;
    int32_t n_computed;     /* leading tokens whose draft K/V are in the draft cache */
} pgd_draft_seq;

/* Loads the draft model from path and sizes its KV pool for n_blocks blocks of block_size.
 * Fails when its vocabulary size differs from n_vocab. pool is borrowed. */
int pgd_draft_init(pgd_draft *d, const char *path, pgd_pool *pool, int32_t n_vocab,
                   int32_t n_ctx, int32_t n_blocks, int32_t block_size, int32_t chunk,
                   pgd_err *err);
void pgd_draft_free(pgd_draft *d);
int pgd_draft_seq_init(pgd_draft *d, pgd_draft_seq *ds);
/* Frees the sequence's draft blocks (the table itself stays for reuse). */
void pgd_draft_seq_release(pgd_draft *d, pgd_draft_seq *ds);
void pgd_draft_seq_free(pgd_draft_seq *ds);
/* Proposes up to k greedy draft tokens continuing tokens[0..n_tokens) into out. Returns the
 * number proposed: 0 when the draft's pool or context has no room (its blocks are released
 * then) or the forward pass fails. */
int32_t pgd_draft_propose(pgd_draft *d, pgd_draft_seq *ds, const int32_t *tokens,
                          int32_t n_tokens, int32_t k, int32_t *out);
/* Keeps only the first n_valid tokens' draft K/V (frees the blocks past them). */
void pgd_draft_rollback(pgd_draft *d, pgd_draft_seq *ds, int32_t n_valid);

#endif
