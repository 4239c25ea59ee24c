/* Token sampling for one sequence: greedy (temperature 0), temperature, top-k, top-p, with a
 * per-sequence RNG seeded from the request's seed, so samples depend only on logits and seed.
 * (The full logits-processor chain arrives with the speculative-decoding issue.) */
#ifndef PGD_SAMPLE_SAMPLER_H
#define PGD_SAMPLE_SAMPLER_H

#include <stdbool.h>
#include <stdint.h>

#include "util/status.h"

typedef struct pgd_sampler_params {
    float temperature; /* 0: greedy */
    float top_p;       /* 1: off */
    int32_t top_k;     /* 0: off */
    uint64_t seed;
} pgd_sampler_params;

typedef struct pgd_token_prob {
    int32_t id;
    float p;
} pgd_token_prob;

typedef struct pgd_sampler {
    pgd_sampler_params params;
    int32_t n_vocab;
    uint64_t rng[4];        /* xoshiro256** state */
    pgd_token_prob *cand;   /* (n_vocab) scratch, allocated once or borrowed */
    bool owns_cand;
} pgd_sampler;

int pgd_sampler_init(pgd_sampler *s, const pgd_sampler_params *p, int32_t n_vocab, pgd_err *err);
/* Same, with a borrowed scratch of n_vocab candidates (samplers used by one thread at a time can
 * share one). */
int pgd_sampler_init_with(pgd_sampler *s, const pgd_sampler_params *p, int32_t n_vocab,
                          pgd_token_prob *scratch, pgd_err *err);
void pgd_sampler_free(pgd_sampler *s);
/* Picks the next token from logits (n_vocab floats, not modified). */
int32_t pgd_sampler_sample(pgd_sampler *s, const float *logits);
/* Index of the largest logit; the lowest index wins ties (as torch.argmax). */
int32_t pgd_argmax(const float *logits, int32_t n);
/* Uniform double in [0, 1) from the sampler's RNG. */
double pgd_sampler_uniform(pgd_sampler *s);

#endif
