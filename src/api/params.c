/* A parsed request -> engine parameters (see params.h). */
#include "api/params.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/tool_calls.h"

bool pgd_api_scores_prompt(const pgd_api_request *r) {
    return (r->echo && r->logprobs >= 0) || r->prompt_logprobs >= 0;
}

/* echo alone and embeddings run the prompt only (max_tokens 0: nothing generated); a chat
 * without max_tokens runs to the end of the context */
static int32_t answer_tokens(const pgd_api_request *r, const pgd_api_prompt *pr, int32_t n_ctx) {
    bool only = r->echo_only || r->embed;
    return r->max_tokens > 0 || only ? r->max_tokens : n_ctx - pr->n_ids;
}

static int refuse(pgd_api_error *err, const char *param, const char *code, const char *msg) {
    pgd_api_error_set(err, 400, "invalid_request_error", param, code, "%s", msg);
    return -1;
}

int pgd_api_prepare(pgd_api_request *r, const pgd_api_budget *b, pgd_api_error *err) {
    char msg[400];
    if (b->max_waiting > 0 && r->n_prompts * r->n > b->max_waiting) {
        /* a 429 would never clear: the queue cannot take this many sequences at once */
        snprintf(msg, sizeof msg, "%d prompts x n=%d sequences exceed the server's waiting queue "
                 "of %d (--max-waiting)", r->n_prompts, r->n, b->max_waiting);
        return refuse(err, r->n > 1 ? "n" : "prompt", NULL, msg);
    }
    /* vLLM's truncate_prompt_tokens: each prompt's last N tokens (-1: the context's length, the
     * prompt plus max_tokens still checked against it below); an echo then shows those */
    int32_t keep = r->truncate_prompt < 0 ? b->n_ctx : r->truncate_prompt;
    for (int p = 0; r->truncate_prompt && p < r->n_prompts; p++) {
        pgd_api_prompt *pr = &r->prompts[p];
        if (pr->n_ids <= keep) continue;
        memmove(pr->ids, pr->ids + (pr->n_ids - keep), (size_t)keep * sizeof *pr->ids);
        pr->n_ids = keep;
        free(pr->text);
        pr->text = NULL;
    }
    /* a 200-byte request must not ask for gigabytes of answer (64 prompts x n=16 x 65,536
     * tokens with 20 logprobs each). Chat without max_tokens ("up to the context") is bounded
     * by n x the context already, and is not counted. Scored prompt tokens (echo with logprobs,
     * prompt_logprobs) are answer tokens too. */
    bool scored = pgd_api_scores_prompt(r);
    int64_t total = 0;
    for (int p = 0; p < r->n_prompts; p++)
        total += (int64_t)r->n * (r->max_tokens + (scored ? r->prompts[p].n_ids : 0));
    if (b->max_request_tokens > 0 && total > b->max_request_tokens) {
        snprintf(msg, sizeof msg, "%d prompts x n=%d x (max_tokens%s) ask for %lld tokens; this "
                 "server answers at most %lld per request (--max-request-tokens)", r->n_prompts,
                 r->n, scored ? " + scored prompt tokens" : "", (long long)total,
                 (long long)b->max_request_tokens);
        return refuse(err, "max_tokens", NULL, msg);
    }
    for (int p = 0; p < r->n_prompts; p++) {
        const pgd_api_prompt *pr = &r->prompts[p];
        if (pr->n_ids == 0) return refuse(err, "prompt", NULL, "the prompt is empty");
        int32_t max_tokens = answer_tokens(r, pr, b->n_ctx);
        if (pr->n_ids + (int64_t)max_tokens > b->n_ctx ||
            (max_tokens < 1 && !r->echo_only && !r->embed)) {
            snprintf(msg, sizeof msg, "this model's maximum context length is %d tokens; the "
                     "prompt has %d tokens and max_tokens is %d", b->n_ctx, pr->n_ids,
                     r->max_tokens > 0 ? r->max_tokens : 0);
            return refuse(err, r->chat ? "messages" : r->embed ? "input" : "prompt",
                          "context_length_exceeded", msg);
        }
    }
    return 0;
}

void pgd_api_engine_params(const pgd_api_request *r, int i, int32_t n_ctx, uint64_t seed,
                           pgd_request_params *out) {
    const pgd_api_prompt *pr = &r->prompts[i / r->n];
    bool tools = r->tool_required;
    *out = (pgd_request_params){
        .prompt = pr->ids, .n_prompt = pr->n_ids, .max_tokens = answer_tokens(r, pr, n_ctx),
        .temperature = r->temperature, .top_p = r->top_p, .top_k = r->top_k, .seed = seed,
        .ignore_eos = r->ignore_eos, .stop = (const char *const *)r->stop, .n_stop = r->n_stop,
        .min_p = r->min_p, .presence_penalty = r->presence_penalty,
        .frequency_penalty = r->frequency_penalty, .repetition_penalty = r->repetition_penalty,
        .logit_bias_ids = r->bias_ids, .logit_bias = r->bias, .n_logit_bias = r->n_bias,
        .min_tokens = r->min_tokens, .logprobs = r->logprobs,
        .no_speculation = r->no_speculation, .prompt_logprobs = pgd_api_scores_prompt(r),
        .prompt_top_logprobs = r->echo && r->logprobs > r->prompt_logprobs ? r->logprobs
                               : r->prompt_logprobs > 0                    ? r->prompt_logprobs
                                                                           : 0,
        .json_object = r->json_object, .json_schema = r->json_schema, .json_schema_c = r->schema_c,
        .stop_token_ids = r->stop_ids, .n_stop_token_ids = r->n_stop_ids,
        .include_stop = r->include_stop, .render_special = r->render_special,
        .allowed_token_ids = r->allowed_ids, .n_allowed_token_ids = r->n_allowed,
        .choices = (const char *const *)r->choices, .n_choices = r->n_choices,
        .regex = r->regex, .regex_dfa = r->regex_dfa, .grammar = r->grammar,
        .grammar_c = r->grammar_c,
        /* a constrained answer thinks first: the prompt may have opened the thinking or closed
         * it already; else deepseek_r1 thinks from the start and under qwen3 the model may open
         * it with its first token */
        .constrain_after = r->reasoning && r->prompt_think != 2 ? PGD_THINK_CLOSE : NULL,
        .think_open = r->reasoning == PGD_REASONING_QWEN3 && !r->prompt_think ? PGD_THINK_OPEN
                                                                              : NULL,
        .json_prefix = tools ? pgd_tool_call_prefix((pgd_tool_format)r->tool_format) : NULL,
        .json_suffix = tools ? pgd_tool_call_suffix((pgd_tool_format)r->tool_format) : NULL,
        .priority = r->priority,
    };
}
