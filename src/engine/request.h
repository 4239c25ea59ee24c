/* The request record (one sequence: its tokens, KV, sampler, stop strings, detokenizer, output
 * constraint, speculation, prompt logprobs, embedding) and its creation from the public
 * parameters: validation and allocation with one cleanup path. Internal to src/engine.
 * The record is what the scheduler reads (scalars, tokens, KV); the state of sampling,
 * detokenization and speculation, whose types belong to sample/, tokenizer/ and spec/, is in
 * its seq_out (engine/seq_out.h), so the scheduler includes none of those layers. */
#ifndef PGD_ENGINE_REQUEST_H
#define PGD_ENGINE_REQUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kv/kv.h"
#include "pagoda/pagoda.h"

struct pgd_constraint;
struct seq_out;

#define MAX_STOP 16
#define MAX_STOP_IDS 64     /* stop token ids per request */
#define MAX_STOP_LEN 64

typedef enum { SEQ_WAITING, SEQ_RUNNING } seq_state;

typedef struct seq {
    uint64_t id, user_data;
    int32_t lora;             /* the LoRA slot it holds (pgd_request_params.lora), 0: none */
    int32_t priority;         /* pgd_request_params.priority: lower first */
    int32_t *tokens;          /* (n_prompt + max_tokens): prompt, then generated tokens */
    int32_t n_prompt, n_tokens, max_tokens;
    int32_t n_computed;       /* tokens whose K/V are in the cache */
    int32_t n_cached;         /* prompt tokens served by the prefix cache at first admission */
    bool admitted_once;
    /* the disk tier: loading, the waiting s holds its RAM prefix hit and the blocks a load is
     * filling (and waits at the head of the queue); disk_done: the disk was looked at (the
     * load is over, what it read is in the RAM cache; or nothing was there), so admission
     * looks no further than RAM until a preemption */
    bool loading, disk_done;
    double t_submit, queue_seconds; /* monotonic seconds; time until first scheduled */
    pgd_kv_seq kv;
    struct seq_out *out;      /* sampling, detokenization and speculation state (seq_out.h) */
    int32_t logprobs;         /* top alternatives per token event; -1: no logprobs */
    /* prompt_logprobs: positions p in [lp_pos, n_prompt - 1) still owe the logprob of token
     * p + 1 (their logits rows: lp_row.. lp_row + lp_n this step); lp_started: token 0's event
     * (no logprob) is out */
    bool prompt_lp, lp_started;
    float *embed_out;         /* embeddings: where the last prompt token's hidden state goes */
    int32_t embed_row;        /* this step's row of it, or -1 */
    int32_t prompt_top;       /* alternatives per prompt token */
    int32_t lp_pos, lp_row, lp_n;
    bool spec;                /* speculative decoding on for this request */
    int32_t n_draft;          /* proposals scheduled this step: tokens[n_tokens..+n_draft) */
    int32_t n_spec_draft, n_spec_accepted; /* proposals verified and accepted, for FINISH */
    bool ignore_eos, aborted;
    char *stop[MAX_STOP];
    int32_t n_stop, hold;     /* hold: bytes held back that may start a stop string */
    char *text;               /* (text_cap) generated text so far */
    size_t text_len, text_cap, emitted;
    seq_state state;
    struct seq *prev, *next;  /* in waiting or running */
    int32_t sched_n;          /* tokens scheduled this step */
    int32_t logit_row;        /* row of this step's logits, or -1 */
    bool dev_sampled;         /* this step's token is sampled by the backend (b_sampled) */
    struct pgd_constraint *cons;     /* the output constraint (JSON, choices, a regex, a grammar;
                                 maybe behind a think-first wrapper), or NULL */
    int32_t *stop_ids;        /* (n_stop_ids) vLLM's stop_token_ids */
    int32_t n_stop_ids;
    bool include_stop;        /* include_stop_str_in_output */
    uint8_t *allowed;         /* (n_vocab) allowed_token_ids as a mask, or NULL */
    int32_t stop_str, stop_tok; /* what stopped it (FINISH's stop_string / stop_token), or -1 */
    const char *err_msg;      /* why a constraint ended it (FINISH_ERROR), or NULL: the default */
} seq;

typedef struct seq_list {
    seq *head, *tail;
    int32_t n;
} seq_list;


/* s's output is held to JSON, choices, a regex or a grammar. */
static inline bool constrained_output(const seq *s) {
    return s->cons != NULL;
}

struct pgd_engine;

/* A new record for p (borrowed; everything it points to is copied), validated against e's
 * model and limits: PGD_OK and *out (the caller's, freed with pgd__seq_free), or a negative
 * status with one line in err. Any thread: reads only what does not change after create. */
int pgd__request_new(struct pgd_engine *e, const pgd_request_params *p, seq **out, char *err,
                     size_t errlen);
/* Writes fmt with arg into err (errlen bytes) and returns rc. */
int pgd__fail(char *err, size_t errlen, int rc, const char *fmt, const char *arg);
/* Frees s and everything it owns (KV tables included: release the blocks first). NULL: no-op. */
void pgd__seq_free(seq *s);

#endif
