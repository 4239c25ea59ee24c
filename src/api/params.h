/* From a parsed API request to the engine: the checks that need the engine's context, and each
 * choice's pgd_request_params. The server and `pagoda batch` both go through here, so one
 * request means the same to both. */
#ifndef PGD_API_PARAMS_H
#define PGD_API_PARAMS_H

#include <stdint.h>

#include "api/openai.h"
#include "pagoda/pagoda.h"

/* What a request is checked against. */
typedef struct pgd_api_budget {
    int32_t n_ctx;              /* the model's context */
    int32_t max_waiting;        /* prompts x n at most (the waiting queue); 0: no bound */
    int64_t max_request_tokens; /* prompts x n x answer tokens at most; 0: no bound */
} pgd_api_budget;

/* The prompts tokenized: applies truncate_prompt_tokens, then refuses what can never run (more
 * sequences than the queue holds, more answer than --max-request-tokens, an empty prompt, a
 * prompt and max_tokens past the context). 0, or -1 with a 400 in err. */
int pgd_api_prepare(pgd_api_request *r, const pgd_api_budget *b, pgd_api_error *err);

/* Choice i's engine parameters (prompt i / r->n): everything but user_data, embedding and lora,
 * which belong to the caller. seed: this choice's. The pointers borrow from r. */
void pgd_api_engine_params(const pgd_api_request *r, int i, int32_t n_ctx, uint64_t seed,
                           pgd_request_params *out);

/* Whether the request's prompt is scored: echo with logprobs, or prompt_logprobs. */
bool pgd_api_scores_prompt(const pgd_api_request *r);

#endif
