/* Token sampling for one sequence: the logits-processor chain, a per-sequence RNG, and
 * log-probabilities. A sequence's samples depend only on its own logits, its token history and
 * its seed -- never on the batch it shares.
 *
 * The chain, in this order (each step sees the previous step's output):
 *   0. allowed tokens    the rest masked (-inf), when the caller sets allow (response_format)
 *   1. logit bias        logits[id] += bias (OpenAI logit_bias)
 *   2. penalties         repetition (HF/vLLM: every token in prompt + output, once: a positive
 *                        logit is divided by r, a negative one multiplied by r), then frequency
 *                        and presence (OpenAI: output tokens only, logit -= count * frequency +
 *                        (count > 0) * presence)
 *   3. min_tokens        end-of-generation tokens masked (-inf) while output < min_tokens
 *   4. temperature       0 = greedy: the arg-max of the processed logits, probability 1
 *   5. top-k             keep the k largest
 *   6. top-p             keep the smallest prefix (by probability, descending) whose mass
 *                        reaches top_p
 *   7. min-p             drop tokens whose probability is below min_p * the largest one
 * The result is a normalized distribution over a candidate list (pgd_sampler_dist), from which
 * the sampler draws, and against which speculative verification (src/spec) applies the
 * rejection rule.
 *
 * Log-probabilities are those of the raw model distribution (log_softmax of the logits as the
 * model produced them, before any processor), as vLLM reports them by default: they describe
 * what the model believes, independent of the request's sampling knobs.
 *
 * Scratch: every array of vocabulary size lives in one pgd_sampler_scratch, allocated once and
 * shared by the samplers of one thread; nothing is allocated per token. */
#ifndef PGD_SAMPLE_SAMPLER_H
#define PGD_SAMPLE_SAMPLER_H

#include <stdbool.h>
#include <stdint.h>

#include "util/status.h"

typedef struct pgd_sampler_params {
    float temperature;          /* 0: greedy */
    float top_p;                /* (0, 1]; 1: off */
    int32_t top_k;              /* 0: off */
    float min_p;                /* [0, 1]; 0: off */
    float presence_penalty;     /* 0: off */
    float frequency_penalty;    /* 0: off */
    float repetition_penalty;   /* > 0; 1 (or 0): off */
    const int32_t *bias_ids;    /* (n_bias) borrowed by init, copied */
    const float *bias;          /* (n_bias) borrowed by init, copied */
    int32_t n_bias;
    int32_t min_tokens;         /* EOG masked while output tokens < min_tokens */
    uint64_t seed;
} pgd_sampler_params;

typedef struct pgd_token_prob {
    int32_t id;
    float p;
} pgd_token_prob;

/* Vocabulary-sized work arrays shared by the samplers of one thread. */
typedef struct pgd_sampler_scratch {
    int32_t n_vocab;
    float *work;            /* (n_vocab) processed logits */
    pgd_token_prob *cand;   /* (n_vocab) candidate list of the current distribution */
    int32_t *count;         /* (n_vocab) output-token counts, all zero between calls */
    uint8_t *seen;          /* (n_vocab) prompt+output membership, all zero between calls */
    const int32_t *eog;     /* (n_eog) end-of-generation ids, borrowed */
    int32_t n_eog;
} pgd_sampler_scratch;

int pgd_sampler_scratch_init(pgd_sampler_scratch *sc, int32_t n_vocab, const int32_t *eog,
                             int32_t n_eog, pgd_err *err);
void pgd_sampler_scratch_free(pgd_sampler_scratch *sc);

typedef struct pgd_sampler {
    pgd_sampler_params params;  /* bias_ids / bias point at the owned copies below */
    int32_t *bias_ids;          /* (n_bias) owned */
    float *bias;                /* (n_bias) owned */
    uint64_t rng[4];            /* xoshiro256** state */
    pgd_sampler_scratch *sc;    /* borrowed */
    /* (n_vocab) when set, the tokens at 0 are masked (-inf) before the chain: structured output
     * (json_grammar.h). Borrowed; the caller sets it before each dist_compute. */
    const uint8_t *allow;
} pgd_sampler;

/* A processed distribution: cand[0..n) with probabilities summing to 1 (cand is the scratch's
 * array: valid until the next call on the same scratch). sorted: cand is in descending
 * probability order. */
typedef struct pgd_sampler_dist {
    pgd_token_prob *cand;
    int32_t n;
    bool sorted;
} pgd_sampler_dist;

/* Validates p and seeds the RNG. sc is borrowed for the sampler's lifetime. */
int pgd_sampler_init(pgd_sampler *s, const pgd_sampler_params *p, pgd_sampler_scratch *sc,
                     pgd_err *err);
void pgd_sampler_free(pgd_sampler *s);

/* Runs the chain over logits (n_vocab floats, not modified). hist[0..n_hist) is the sequence
 * so far (prompt, then output); the first n_prompt of them are the prompt. */
void pgd_sampler_dist_compute(pgd_sampler *s, const float *logits, const int32_t *hist,
                              int32_t n_prompt, int32_t n_hist, pgd_sampler_dist *d);
/* Draws a token from d with the sampler's RNG (no draw when d has one candidate). */
int32_t pgd_sampler_draw(pgd_sampler *s, const pgd_sampler_dist *d);
/* dist_compute + draw. */
int32_t pgd_sampler_sample(pgd_sampler *s, const float *logits, const int32_t *hist,
                           int32_t n_prompt, int32_t n_hist);
/* Probability of id under d (0 when not a candidate). */
float pgd_sampler_dist_prob(const pgd_sampler_dist *d, int32_t id);

/* Log-probability of id under the raw distribution log_softmax(logits), and the n_top (<= 20)
 * most likely tokens with theirs, most likely first (lowest id first among ties). */
float pgd_logprobs(const float *logits, int32_t n_vocab, int32_t id, int32_t n_top,
                   int32_t *top_ids, float *top_logprobs);

/* Index of the largest logit; the lowest index wins ties (as torch.argmax). */
int32_t pgd_argmax(const float *logits, int32_t n);
/* Uniform double in [0, 1) from the sampler's RNG. */
double pgd_sampler_uniform(pgd_sampler *s);
/* The next uniform as a float in [0, 1) (rounding to float can reach 1.0: that becomes the
 * largest float below 1), the u of a backend-sampled row (device_sample.h). */
float pgd_sampler_uniform_f32(pgd_sampler *s);

#endif
