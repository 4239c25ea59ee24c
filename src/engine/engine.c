/* The engine: request lifecycle, the scheduler, the runner and detokenization.
 *
 * Every step re-forms the batch under a token budget: running decodes first (preempting the
 * most recently admitted sequence by recompute when a block is missing), then prefill chunks of
 * partially prefilled sequences, then waiting requests in arrival order while blocks, budget
 * and the sequence cap allow. Priority scheduling orders both lists by (priority, arrival)
 * instead, preempts the lowest priority, and lets a request take room from lower ones. The
 * scheduler sees sequences and block counts, the runner builds the flattened batch, the block
 * manager (src/kv) sees only token and block ids. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend/cpu/pool.h"
#include "kv/kv.h"
#include "model/lora.h"
#include "model/model.h"
#include "pagoda/pagoda.h"
#include "engine/engine_internal.h"
#include "sample/grammar.h"
#include "sample/json_grammar.h"
#include "sample/regex.h"
#include "sample/sampler.h"
#include "spec/spec.h"
#include "util/clock.h"

_Static_assert(PGD_SPEC_MAX_K == PGD_SPEC_MAX_TOKENS, "one limit on proposals");

#define MAX_STOP 16
#define MAX_STOP_IDS 64     /* stop token ids per request */
#define MAX_STOP_LEN 64
#define RE_MEMO 4           /* states whose masks a regex or grammar request keeps */
#define GRAMMAR_WORK_MSG                                                                         \
    "the grammar is too ambiguous here: its token mask needs more than 10^7 parse steps"

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
    double t_submit, queue_seconds; /* monotonic seconds; time until first scheduled */
    pgd_kv_seq kv;
    pgd_sampler sampler;
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
    pgd_spec_adapt adapt;     /* its adaptive number of proposals */
    int32_t n_draft;          /* proposals scheduled this step: tokens[n_tokens..+n_draft) */
    int32_t n_spec_draft, n_spec_accepted; /* proposals verified and accepted, for FINISH */
    pgd_draft_seq dseq;       /* draft-model KV (DRAFT mode) */
    bool ignore_eos, aborted;
    char *stop[MAX_STOP];
    int32_t n_stop, hold;     /* hold: bytes held back that may start a stop string */
    char *text;               /* (text_cap) generated text so far */
    size_t text_len, text_cap, emitted;
    pgd_detok detok;
    seq_state state;
    struct seq *prev, *next;  /* in waiting or running */
    int32_t sched_n;          /* tokens scheduled this step */
    int32_t logit_row;        /* row of this step's logits, or -1 */
    bool dev_sampled;         /* this step's token is sampled by the backend (b_sampled) */
    bool json;                /* output constrained to a JSON object (json_st) */
    pgd_json_state json_st;
    pgd_json_schema schema;   /* its schema, when the request gave one */
    int32_t *stop_ids;        /* (n_stop_ids) vLLM's stop_token_ids */
    int32_t n_stop_ids;
    bool include_stop;        /* include_stop_str_in_output */
    uint8_t *allowed;         /* (n_vocab) allowed_token_ids as a mask, or NULL */
    char **choices;           /* (n_choices) guided_choice, or NULL */
    size_t *ch_len;           /* (n_choices) their lengths */
    int32_t stop_str, stop_tok; /* what stopped it (FINISH's stop_string / stop_token), or -1 */
    int32_t n_choices;
    uint8_t *ch_alive;        /* (n_choices) the choices the output is still a prefix of */
    size_t ch_pos;            /* bytes of output so far (each a prefix of the alive choices) */
    bool has_re;              /* guided_regex: re, in state re_q */
    pgd_regex re;
    int32_t re_q;
    /* the masks of the last RE_MEMO DFA or grammar states seen (a pattern like [a-z ]+ stays in
     * a few, and its mask walks most of the vocabulary): (n_vocab) each, allocated with the
     * request; a regex's states by number, a grammar's by key (gr_keys) */
    uint8_t *re_memo[RE_MEMO];
    int32_t re_memo_q[RE_MEMO], re_memo_next;
    pgd_grammar_key *gr_keys; /* (RE_MEMO) */
    const char *err_msg;      /* why a constraint ended it (FINISH_ERROR), or NULL: the default */
    bool has_gr;              /* guided_grammar: gr, in state gr_st (started at admission, on
                                 the engine thread: it needs the engine's scratch) */
    pgd_grammar gr;
    pgd_grammar_state gr_st;
    /* constrain_after: the constraint (JSON, choices) waits for c_after while thinking */
    enum { C_ON, C_THINKING, C_FIRST } c_wait; /* C_FIRST: think_tok or the constraint */
    char *c_after;
    size_t c_scan;            /* text before this was searched for c_after */
    int32_t think_tok;        /* think_open's token, or -1 */
} seq;

typedef struct seq_list {
    seq *head, *tail;
    int32_t n;
} seq_list;

struct pgd_engine;
static int install_lora(struct pgd_engine *e, struct pgd_lora *l, int32_t *k, pgd_err *err);

struct pgd_engine {
    pgd_engine_config cfg;
    pgd_model *model;
    pgd_pool *pool;
    pgd_fwd fwd;
    /* LoRA slots 1..n_loras (loras[k - 1], NULL: free), changed between steps under lora_mu
     * (the engine thread holds it over each forward pass): each one's prefix-cache namespace
     * (never reused: a new load is a new namespace), the sequences holding it, and whether it
     * was unloaded while held */
    pthread_mutex_t lora_mu;
    struct pgd_lora **loras;
    uint32_t *lora_ns;
    int32_t *lora_users;
    bool *lora_retired;
    int32_t n_loras;
    uint32_t next_ns;
    pgd_kv_cache kv;
    pgd_kv_mgr mgr;
    int32_t n_ctx, max_blocks_per_seq;
    pgd_sampler_scratch sample_scratch; /* shared by every sequence's sampler */
    int32_t *eog;                   /* (n_eog) end-of-generation token ids */
    int32_t n_eog;
    pgd_json_vocab json_vocab;      /* tokens' bytes for the JSON mask (with a tokenizer) */
    pgd_grammar_scratch *gr_scratch; /* every grammar request's feeding and masking (with a
                                        tokenizer; the engine thread alone) */
    pgd_grammar_key gr_key;         /* the key of the state being masked */
    uint8_t *json_allow;            /* (n_vocab) this step's mask */
    /* speculative decoding */
    pgd_spec_mode spec_mode;
    int32_t spec_k, ngram_min, ngram_max;
    pgd_draft draft;                /* DRAFT mode */
    bool spec_broken;               /* test hook: accept every proposal (breaks exactness) */

    seq_list waiting, running;
    uint64_t next_id;

    /* step buffers, sized once */
    int32_t *b_tokens, *b_pos, *b_seq;          /* (max_num_batched_tokens) */
    int32_t *b_rows;                            /* (max_logits) */
    int32_t max_logits;                         /* logit rows per step */
    /* sampling on the backend (PAGODA_DEVICE_SAMPLING): rows whose chain is temperature, top-k,
     * top-p and min-p only are sampled there; the logits come to the host only for the rest */
    bool device_sampling;
    pgd_sample_row *b_sample;                   /* (max_logits) */
    int32_t *b_sampled;                         /* (max_logits) */
    int64_t *b_slot;                            /* (max_num_batched_tokens) */
    const int32_t **b_tables;                   /* (max_num_seqs) */
    int32_t *b_lora;                            /* (max_num_seqs) their adapters */
    seq **b_seqs;                               /* (max_num_seqs) sequences in this step */
    /* prompt logprobs of this step, by logits row, computed on the pool before postprocess */
    struct lp_row {
        int32_t token, n_top, rank;
        float logprob;
        int32_t top_ids[PGD_MAX_TOP_LOGPROBS];
        float top_logprobs[PGD_MAX_TOP_LOGPROBS];
    } *lp_rows;                                 /* (max_logits) */
    float *hidden;                              /* (max_logits, dim): embeddings' rows */
    int32_t *lp_todo;                           /* (max_logits) rows to score */

    /* inbox: submissions and aborts from other threads */
    pthread_mutex_t in_mu;
    seq_list incoming;
    uint64_t *aborts;
    size_t n_aborts, cap_aborts;
    int32_t n_pending;         /* incoming + waiting, for the queue bound */

    /* this step's events, built with no lock held and published at its end in one short
     * critical section (publish); a full buffer is published early, so it never drops one */
    pgd_event *step_ev;                         /* (cap_step_ev) */
    int32_t n_step_ev, cap_step_ev;

    /* outbox, under out_mu: events not yet polled, and the FINISH slots reserved for requests
     * submitted and not finished (cap_events >= n_events + n_fin_reserved always: a FINISH
     * always has room, so exactly one per request arrives whatever malloc does) */
    pthread_mutex_t out_mu;
    pthread_cond_t out_cv;
    pgd_event *events;
    size_t n_events, cap_events, n_fin_reserved;
    pgd_engine_stats stats_pub; /* stats as of the last publish, for pgd_engine_get_stats */

    /* thread */
    pthread_t thread;
    bool thread_running;
    volatile bool stop_thread;
    pthread_cond_t in_cv;
    void (*notify)(void *);
    void *notify_arg;

    pgd_engine_stats stats;    /* the engine thread's; copied to stats_pub when publishing */
    bool admitting;            /* static batching: the current batch is still being filled */
};

/* ---- lists ---- */

static void list_push_back(seq_list *l, seq *s) {
    s->prev = l->tail;
    s->next = NULL;
    if (l->tail) l->tail->next = s;
    else l->head = s;
    l->tail = s;
    l->n++;
}

static void list_push_front(seq_list *l, seq *s) {
    s->next = l->head;
    s->prev = NULL;
    if (l->head) l->head->prev = s;
    else l->tail = s;
    l->head = s;
    l->n++;
}

/* Whether a is served before b under priority scheduling: the lower priority value, then the
 * earlier submission (ids increase with submission). */
static bool served_before(const seq *a, const seq *b) {
    return a->priority != b->priority ? a->priority < b->priority : a->id < b->id;
}

/* Puts s into the waiting or running list l. First come, first served appends (a preempted
 * sequence goes back to the front of the queue: front); priority scheduling keeps both lists in
 * served_before order, so a list's tail is always its lowest priority, latest arrival. */
static void list_enqueue(const pgd_engine_config *c, seq_list *l, seq *s, bool front) {
    if (!c->priority_scheduling) {
        if (front) list_push_front(l, s);
        else list_push_back(l, s);
        return;
    }
    seq *at = l->tail; /* s goes right after at */
    while (at && served_before(s, at)) at = at->prev;
    if (!at) {
        list_push_front(l, s);
        return;
    }
    s->prev = at;
    s->next = at->next;
    if (at->next) at->next->prev = s;
    else l->tail = s;
    at->next = s;
    l->n++;
}

static void list_remove(seq_list *l, seq *s) {
    if (s->prev) s->prev->next = s->next;
    else l->head = s->next;
    if (s->next) s->next->prev = s->prev;
    else l->tail = s->prev;
    s->prev = s->next = NULL;
    l->n--;
}

/* ---- sequences ---- */

static void seq_free(seq *s) {
    if (!s) return;
    free(s->tokens);
    pgd_kv_seq_free(&s->kv);
    pgd_draft_seq_free(&s->dseq);
    pgd_sampler_free(&s->sampler);
    pgd_json_schema_free(&s->schema);
    for (int i = 0; i < s->n_stop; i++) free(s->stop[i]);
    for (int i = 0; i < s->n_choices; i++) free(s->choices[i]);
    free(s->choices);
    free(s->ch_len);
    free(s->ch_alive);
    free(s->stop_ids);
    free(s->allowed);
    free(s->c_after);
    pgd_regex_free(&s->re);
    for (int i = 0; i < RE_MEMO; i++) free(s->re_memo[i]);
    pgd_grammar_free(&s->gr);
    pgd_grammar_state_free(&s->gr_st);
    free(s->gr_keys);
    free(s->text);
    free(s);
}

/* ---- events ---- */

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

/* Grows the outbox to hold at least need events; out_mu held. Rare: the capacity doubles. */
static int outbox_grow(pgd_engine *e, size_t need) {
    if (need <= e->cap_events) return PGD_OK;
    size_t nc = e->cap_events ? e->cap_events * 2 : 256;
    if (nc < need) nc = need;
    pgd_event *n = realloc(e->events, nc * sizeof *n);
    if (!n) return PGD_ENOMEM;
    e->events = n;
    e->cap_events = nc;
    return PGD_OK;
}

/* Moves this step's events to the outbox in one critical section, with the stats: FINISH events
 * into the slots their requests reserved, token events into the room left (out of memory: the
 * ones that do not fit are dropped; their requests go on). Engine thread. */
static void publish(pgd_engine *e) {
    int32_t n_fin = 0;
    for (int32_t i = 0; i < e->n_step_ev; i++) n_fin += e->step_ev[i].type == PGD_EVENT_FINISH;
    size_t n_tok = (size_t)(e->n_step_ev - n_fin);
    pthread_mutex_lock(&e->out_mu);
    PGD_ASSERT((size_t)n_fin <= e->n_fin_reserved);
    outbox_grow(e, e->n_events + e->n_fin_reserved + n_tok); /* else room for fewer tokens */
    size_t room = e->cap_events - e->n_events - e->n_fin_reserved; /* token events that fit */
    for (int32_t i = 0; i < e->n_step_ev; i++) {
        const pgd_event *ev = &e->step_ev[i];
        if (ev->type == PGD_EVENT_FINISH) e->n_fin_reserved--;
        else if (room == 0) continue;
        else room--;
        e->events[e->n_events++] = *ev;
    }
    e->stats_pub = e->stats;
    pthread_cond_broadcast(&e->out_cv);
    pthread_mutex_unlock(&e->out_mu);
    e->n_step_ev = 0;
}

/* The next event of this step (its header zeroed); never fails: a full step buffer is
 * published first. Engine thread. */
static pgd_event *step_event(pgd_engine *e) {
    if (e->n_step_ev == e->cap_step_ev) publish(e);
    pgd_event *ev = &e->step_ev[e->n_step_ev++];
    memset(ev, 0, offsetof(pgd_event, text));
    ev->text_len = 0;
    return ev;
}

/* Reserves the outbox slot of a new request's FINISH: 0 or PGD_ENOMEM. Any thread. */
static int reserve_finish(pgd_engine *e) {
    pthread_mutex_lock(&e->out_mu);
    int rc = outbox_grow(e, e->n_events + e->n_fin_reserved + 1);
    if (!rc) e->n_fin_reserved++;
    pthread_mutex_unlock(&e->out_mu);
    return rc;
}

static void unreserve_finish(pgd_engine *e) {
    pthread_mutex_lock(&e->out_mu);
    e->n_fin_reserved--;
    pthread_mutex_unlock(&e->out_mu);
}

/* s's FINISH event, into its reserved slot at the next publish. */
static void emit_finish(pgd_engine *e, seq *s, pgd_finish_reason why, const char *error) {
    pgd_event *ev = step_event(e);
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

/* ---- configuration ---- */

void pgd_engine_config_default(pgd_engine_config *c) {
    memset(c, 0, sizeof *c);
    c->block_size = 16;
    c->kv_cache_bytes = (size_t)512 << 20;
    c->kv_dtype = PGD_KV_F32;
    c->max_num_batched_tokens = 512;
    c->max_num_seqs = 64;
}

static int fail(char *err, size_t errlen, int rc, const char *fmt, const char *arg) {
    if (err && errlen) snprintf(err, errlen, fmt, arg);
    return rc;
}

/* Device backends (CUDA): the KV blocks that fit in gpu_memory_utilization x each GPU's memory
 * once the weights and the activations of the largest step are resident (vLLM's profiling run).
 * Runs that step -- max_num_batched_tokens tokens, max_logits logit rows -- over a scratch KV
 * pool, so every buffer the backend grows lazily (the dequantized-weight scratch of its GEMM
 * path, cuBLAS workspaces) exists when the free memory is read. What other processes hold on a
 * GPU counts against its share. Every rank holds its kv_dim slice of every block. */
static int device_kv_blocks(pgd_engine *e, pgd_type kdt, size_t *n_blocks, pgd_err *err) {
    const pgd_engine_config *c = &e->cfg;
    const pgd_model *m = e->model;
    int32_t T = c->max_num_batched_tokens, bs = c->block_size;
    int32_t len = T < e->n_ctx ? T : e->n_ctx;      /* tokens per profiling sequence */
    int32_t n_seq = (T + len - 1) / len, bps = (len + bs - 1) / bs;
    int32_t n_logits = e->max_logits < T ? e->max_logits : T;
    int32_t *tok = calloc((size_t)T, sizeof *tok), *pos = malloc((size_t)T * sizeof *pos);
    int32_t *sq = malloc((size_t)T * sizeof *sq), *rows = malloc((size_t)T * sizeof *rows);
    int32_t *blocks = malloc((size_t)n_seq * (size_t)bps * sizeof *blocks);
    const int32_t **tables = malloc((size_t)n_seq * sizeof *tables);
    int64_t *slot = malloc((size_t)T * sizeof *slot);
    pgd_kv_cache kv = {0};
    int rc;
    if (!tok || !pos || !sq || !rows || !blocks || !tables || !slot) {
        rc = pgd_err_set(err, PGD_ENOMEM, "engine: out of memory");
        goto done;
    }
    for (int32_t i = 0; i < n_seq * bps; i++) blocks[i] = i;
    for (int32_t j = 0; j < n_seq; j++) tables[j] = blocks + (size_t)j * bps;
    for (int32_t i = 0; i < T; i++) {
        pos[i] = i % len;
        sq[i] = i / len;
        slot[i] = (int64_t)tables[sq[i]][pos[i] / bs] * bs + pos[i] % bs;
    }
    for (int32_t i = 0; i < n_logits; i++) rows[i] = T - n_logits + i;
    pgd_batch b = {.n_tokens = T, .tokens = tok, .pos = pos, .seq = sq, .slot = slot,
                   .block_tables = tables, .n_logits = n_logits, .logit_rows = rows};
    if ((rc = pgd_kv_cache_init(&kv, m, kdt, n_seq * bps, bs, err))) goto done;
    if ((rc = pgd_model_forward(&e->fwd, &kv, &b))) {
        rc = pgd_err_set(err, rc, "the profiling step of %d tokens failed", T);
        goto done;
    }
    pgd_kv_cache_free(&kv);
    float util = c->gpu_memory_utilization > 0 ? c->gpu_memory_utilization : 0.9f;
    size_t per_block = (size_t)2 * (size_t)m->cfg.n_layer * (size_t)m->shards[0].n_kv_head *
                       (size_t)m->cfg.head_dim * pgd_dtype_size(kdt) * (size_t)bs;
    *n_blocks = SIZE_MAX;
    for (int r = 0; r < m->n_ranks; r++) {
        pgd_backend *be = &m->shards[r].be;
        size_t free_b, total;
        if ((rc = be->ops->mem_info(be, &free_b, &total))) {
            rc = pgd_err_set(err, rc, "cannot read the memory of GPU %d", be->device);
            goto done;
        }
        double budget = (double)util * (double)total - (double)(total - free_b);
        size_t nb = budget > 0 ? (size_t)(budget / (double)per_block) : 0;
        if (nb < 1) {
            rc = pgd_err_set(err, PGD_ENOMEM, "GPU %d: weights and the activations of a %d-token "
                             "step take %.2f GiB of %.2f GiB; --gpu-memory-utilization %.2f leaves "
                             "no room for a KV block (raise it or lower --max-num-batched-tokens)",
                             be->device, T, (double)(total - free_b) / 1073741824.0,
                             (double)total / 1073741824.0, util);
            goto done;
        }
        if (nb < *n_blocks) *n_blocks = nb;
    }
    rc = PGD_OK;
done:
    pgd_kv_cache_free(&kv);
    free(tok);
    free(pos);
    free(sq);
    free(rows);
    free(blocks);
    free(tables);
    free(slot);
    return rc;
}

int pgd_engine_create(const pgd_engine_config *c, pgd_engine **out, char *err, size_t errlen) {
    *out = NULL;
    pgd_err perr = {{0}};
    if (c->block_size < 1 || c->block_size > 1024 || c->max_num_batched_tokens < 1 ||
        c->max_num_seqs < 1 || c->max_num_seqs > 4096 || c->num_speculative_tokens < 0 ||
        c->num_speculative_tokens > PGD_SPEC_MAX_TOKENS || c->ngram_min < 0 ||
        c->ngram_max < 0 || c->speculative_disable_by_batch_size < 0 ||
        (c->ngram_min && c->ngram_max && c->ngram_min > c->ngram_max) ||
        (c->speculative != PGD_SPEC_NONE && c->speculative != PGD_SPEC_NGRAM &&
         c->speculative != PGD_SPEC_DRAFT))
        return fail(err, errlen, PGD_EINVAL, "%s", "invalid engine configuration (block size, "
                    "max-num-batched-tokens, max-num-seqs or speculative decoding)");
    if (c->priority_scheduling && c->static_batching)
        return fail(err, errlen, PGD_EINVAL, "%s", "static batching admits in arrival order: "
                    "it cannot be combined with priority scheduling");
    if (!(c->gpu_memory_utilization >= 0 && c->gpu_memory_utilization <= 1))
        return fail(err, errlen, PGD_EINVAL, "%s", "gpu_memory_utilization must be in (0, 1]");
    pgd_engine *e = calloc(1, sizeof *e);
    if (!e) return fail(err, errlen, PGD_ENOMEM, "%s", "out of memory");
    e->cfg = *c;
    e->next_id = 1;
    pthread_mutex_init(&e->in_mu, NULL);
    pthread_mutex_init(&e->lora_mu, NULL);
    pthread_mutex_init(&e->out_mu, NULL);
    pthread_cond_init(&e->out_cv, NULL);
    pthread_cond_init(&e->in_cv, NULL);
    int rc;
    pgd_model_opts mo = {.weights_f32 = c->weights_f32, .n_ctx = c->n_ctx,
                         .tensor_parallel = c->tensor_parallel_size,
                         .load_format = c->load_format_dummy ? PGD_LOAD_DUMMY : PGD_LOAD_AUTO,
                         .gpu_memory_utilization = c->gpu_memory_utilization};
    if (c->device) {
        if (!strcmp(c->device, "cpu")) mo.device = 1 + PGD_DEVICE_CPU;
        else if (!strcmp(c->device, "cuda")) mo.device = 1 + PGD_DEVICE_CUDA;
        else {
            pgd_err_set(&perr, PGD_EINVAL, "device '%.32s': expected cpu or cuda", c->device);
            rc = PGD_EINVAL;
            goto fail_perr;
        }
    }
    rc = pgd_model_load(c->model_path, &mo, &e->model, &perr);
    if (rc) goto fail_perr;
    e->n_ctx = e->model->cfg.n_ctx;
    long nt = c->n_threads > 0 ? c->n_threads : sysconf(_SC_NPROCESSORS_ONLN);
    if ((rc = pgd_pool_create(nt > 0 ? (int)nt : 1, &e->pool, &perr))) goto fail_perr;
    pgd_type kdt = (pgd_type)c->kv_dtype;
    e->max_blocks_per_seq = (e->n_ctx + c->block_size - 1) / c->block_size;
    e->spec_mode = c->speculative;
    e->spec_k = c->num_speculative_tokens ? c->num_speculative_tokens : 5;
    e->ngram_min = c->ngram_min ? c->ngram_min : 1;
    e->ngram_max = c->ngram_max ? c->ngram_max : 4;
    if (e->ngram_max < e->ngram_min) e->ngram_max = e->ngram_min;
    const char *broken = getenv("PAGODA_TEST_SPEC_ALWAYS_ACCEPT");
    e->spec_broken = broken && !strcmp(broken, "1");
    /* a speculating sequence asks logits for its k proposals plus the bonus row */
    int64_t ml = c->max_num_seqs;
    if (e->spec_mode != PGD_SPEC_NONE) ml *= e->spec_k + 1;
    if (ml > c->max_num_batched_tokens) ml = c->max_num_batched_tokens;
    if (ml < c->max_num_seqs) ml = c->max_num_seqs;
    e->max_logits = (int32_t)ml;
    if ((rc = pgd_fwd_init(&e->fwd, e->model, e->pool, c->max_num_batched_tokens, e->max_logits,
                           &perr)))
        goto fail_perr;
    int32_t slots = c->max_loras > c->n_loras ? c->max_loras : c->n_loras;
    if (slots > 0) {
        e->loras = calloc((size_t)slots, sizeof *e->loras);
        e->lora_ns = calloc((size_t)slots, sizeof *e->lora_ns);
        e->lora_users = calloc((size_t)slots, sizeof *e->lora_users);
        e->lora_retired = calloc((size_t)slots, sizeof *e->lora_retired);
        if (!e->loras || !e->lora_ns || !e->lora_users || !e->lora_retired) {
            rc = pgd_err_set(&perr, PGD_ENOMEM, "engine: out of memory");
            goto fail_perr;
        }
        if ((rc = pgd_fwd_reserve_loras(&e->fwd, slots, &perr))) goto fail_perr;
        e->n_loras = slots;
        for (int32_t i = 0; i < c->n_loras; i++) {
            pgd_lora *l;
            int32_t k;
            if ((rc = pgd_lora_load(c->lora_paths[i], e->model, &l, &perr)) ||
                (rc = install_lora(e, l, &k, &perr)))
                goto fail_perr;
        }
    }
    size_t n_blocks = 0;
    if (e->model->shards[0].be.ops->mem_info) {
        if ((rc = device_kv_blocks(e, kdt, &n_blocks, &perr))) goto fail_perr;
    } else {
        size_t per_block = pgd_kv_cache_bytes_per_token(e->model, kdt) * (size_t)c->block_size;
        n_blocks = c->kv_cache_bytes / per_block;
        if (n_blocks < 1) {
            rc = pgd_err_set(&perr, PGD_EINVAL, "KV cache budget of %zu bytes holds no block of "
                             "%d tokens (%zu bytes each)", c->kv_cache_bytes, c->block_size,
                             per_block);
            goto fail_perr;
        }
    }
    if (n_blocks > (size_t)INT32_MAX / (size_t)c->block_size)
        n_blocks = (size_t)INT32_MAX / (size_t)c->block_size;
    if ((rc = pgd_kv_cache_init(&e->kv, e->model, kdt, (int32_t)n_blocks, c->block_size, &perr)))
        goto fail_perr;
    if ((rc = pgd_kv_mgr_init(&e->mgr, (int32_t)n_blocks, c->block_size, !c->no_prefix_caching,
                              &perr)))
        goto fail_perr;
    if (e->spec_mode == PGD_SPEC_DRAFT) {
        if (!c->draft_model_path) {
            rc = pgd_err_set(&perr, PGD_EINVAL, "speculative decoding with a draft model needs "
                             "a draft model path");
            goto fail_perr;
        }
        if ((rc = pgd_draft_init(&e->draft, c->draft_model_path, e->pool, e->model->cfg.n_vocab,
                                 e->n_ctx, (int32_t)n_blocks, c->block_size,
                                 c->max_num_batched_tokens, &perr)))
            goto fail_perr;
    }
    size_t T = (size_t)c->max_num_batched_tokens, S = (size_t)c->max_num_seqs;
    e->b_tokens = malloc(T * sizeof *e->b_tokens);
    e->b_pos = malloc(T * sizeof *e->b_pos);
    e->b_seq = malloc(T * sizeof *e->b_seq);
    e->b_rows = malloc((size_t)e->max_logits * sizeof *e->b_rows);
    e->b_slot = malloc(T * sizeof *e->b_slot);
    e->b_tables = malloc(S * sizeof *e->b_tables);
    e->b_lora = calloc(S, sizeof *e->b_lora);
    e->b_seqs = malloc(S * sizeof *e->b_seqs);
    e->b_sample = malloc((size_t)e->max_logits * sizeof *e->b_sample);
    e->b_sampled = malloc((size_t)e->max_logits * sizeof *e->b_sampled);
    e->lp_rows = malloc((size_t)e->max_logits * sizeof *e->lp_rows);
    e->lp_todo = malloc((size_t)e->max_logits * sizeof *e->lp_todo);
    e->hidden = malloc((size_t)e->max_logits * (size_t)e->model->cfg.dim * sizeof *e->hidden);
    /* a step's events: a token per logits row, a prompt token per row and one more per
     * sequence, a FINISH per sequence (more, from aborts, publish early) */
    e->cap_step_ev = 2 * e->max_logits + 2 * c->max_num_seqs;
    e->step_ev = malloc((size_t)e->cap_step_ev * sizeof *e->step_ev);
    int32_t nv = e->model->cfg.n_vocab;
    e->eog = malloc((size_t)nv * sizeof *e->eog);
    if (!e->b_tokens || !e->b_pos || !e->b_seq || !e->b_rows || !e->b_slot || !e->b_tables ||
        !e->b_lora ||
        !e->b_seqs || !e->b_sample || !e->b_sampled || !e->lp_rows || !e->lp_todo || !e->eog ||
        !e->hidden || !e->step_ev) {
        rc = pgd_err_set(&perr, PGD_ENOMEM, "engine: out of memory");
        goto fail_perr;
    }
    /* a model without a tokenizer (--load-format dummy) has no end-of-generation token */
    for (int32_t i = 0; e->model->tok && i < nv; i++)
        if (pgd_tokenizer_is_eog(e->model->tok, i)) e->eog[e->n_eog++] = i;
    if ((rc = pgd_sampler_scratch_init(&e->sample_scratch, nv, e->eog, e->n_eog, &perr)))
        goto fail_perr;
    /* a step's mask (constrained requests); the bytes of every token, for JSON and choices */
    e->json_allow = malloc((size_t)nv);
    if (!e->json_allow ||
        (e->model->tok && (pgd_json_vocab_build(&e->json_vocab, e->model->tok, nv) ||
                           !(e->gr_scratch = pgd_grammar_scratch_new(e->json_vocab.max_len))))) {
        rc = pgd_err_set(&perr, PGD_ENOMEM, "engine: out of memory");
        goto fail_perr;
    }
    /* On by default where the logits live in device memory of one GPU (downloading them costs
     * n_vocab floats per row); PAGODA_DEVICE_SAMPLING=1 forces it (on the CPU too: the path CI
     * tests), =0 turns it off. Several ranks gather the logits on the host anyway. */
    const char *ds = getenv("PAGODA_DEVICE_SAMPLING");
    if (ds && *ds) e->device_sampling = ds[0] == '1';
    else e->device_sampling = e->model->device != PGD_DEVICE_CPU && e->model->n_ranks == 1;
    if (!e->model->shards[0].be.ops->sample) e->device_sampling = false;
    e->stats.kv_blocks_total = (int32_t)n_blocks;
    e->stats_pub = e->stats;
    *out = e;
    return PGD_OK;
fail_perr:
    if (err && errlen) snprintf(err, errlen, "%s", perr.msg);
    pgd_engine_free(e);
    return rc;
}

static void free_list(seq_list *l) {
    for (seq *s = l->head, *n; s; s = n) {
        n = s->next;
        seq_free(s);
    }
    memset(l, 0, sizeof *l);
}

void pgd_engine_free(pgd_engine *e) {
    if (!e) return;
    pgd_engine_stop(e);
    free_list(&e->waiting);
    free_list(&e->running);
    free_list(&e->incoming);
    pgd_fwd_free(&e->fwd);
    for (int32_t i = 0; e->loras && i < e->n_loras; i++) pgd_lora_free(e->loras[i]);
    free(e->loras);
    free(e->lora_ns);
    free(e->lora_users);
    free(e->lora_retired);
    pthread_mutex_destroy(&e->lora_mu);
    pgd_draft_free(&e->draft);
    pgd_kv_cache_free(&e->kv);
    pgd_kv_mgr_free(&e->mgr);
    pgd_pool_free(e->pool);
    pgd_model_free(e->model);
    free(e->b_tokens);
    free(e->b_pos);
    free(e->b_seq);
    free(e->b_rows);
    free(e->b_slot);
    free(e->b_tables);
    free(e->b_lora);
    free(e->b_seqs);
    free(e->b_sample);
    free(e->b_sampled);
    free(e->lp_rows);
    free(e->hidden);
    free(e->lp_todo);
    pgd_sampler_scratch_free(&e->sample_scratch);
    free(e->eog);
    pgd_json_vocab_free(&e->json_vocab);
    pgd_grammar_scratch_free(e->gr_scratch);
    free(e->json_allow);
    free(e->aborts);
    free(e->events);
    free(e->step_ev);
    pthread_mutex_destroy(&e->in_mu);
    pthread_mutex_destroy(&e->out_mu);
    pthread_cond_destroy(&e->out_cv);
    pthread_cond_destroy(&e->in_cv);
    free(e);
}

int pgd_engine_tokenize(pgd_engine *e, const char *text, size_t len, bool add_bos,
                        bool parse_special, int32_t *out, size_t cap, size_t *n_out) {
    if (!e->model->tok) {
        /* no tokenizer (--load-format dummy): only the empty text, which is BOS alone */
        if (len > 0) return PGD_EUNSUPPORTED;
        bool bos = add_bos && pgd_engine_add_bos(e);
        *n_out = bos;
        if (bos && cap < 1) return PGD_ERANGE;
        if (bos) out[0] = e->model->cfg.bos_id;
        return PGD_OK;
    }
    return pgd_tokenizer_encode_special(e->model->tok, text, len, add_bos, parse_special, out,
                                        cap, n_out);
}

int32_t pgd_engine_n_ctx(const pgd_engine *e) { return e->n_ctx; }
int32_t pgd_engine_dim(const pgd_engine *e) { return e->model->cfg.dim; }
bool pgd_engine_add_bos(const pgd_engine *e) {
    const pgd_model *m = e->model;
    if (!m->tok) return m->cfg.bos_id >= 0 && m->cfg.bos_id < m->cfg.n_vocab;
    return pgd_tokenizer_add_bos(m->tok);
}
bool pgd_engine_has_tokenizer(const pgd_engine *e) { return e->model->tok != NULL; }

/* ---- submission ---- */

/* The request holds its output to a grammar: its text, or compiled already. */
static bool wants_grammar(const pgd_request_params *p) { return p->grammar || p->grammar_c; }

/* s's copies of p's stop token ids, allowed token ids (as a mask) and choices: PGD_OK or
 * PGD_ENOMEM (what was copied is freed with s). */
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
    if (p->constrain_after && *p->constrain_after && (s->json || p->n_choices || p->regex ||
                                                      wants_grammar(p))) {
        if (!(s->c_after = strdup(p->constrain_after))) return PGD_ENOMEM;
        s->c_wait = p->think_open ? C_FIRST : C_THINKING;
        s->think_tok = p->think_open ? pgd_json_vocab_find(&e->json_vocab, p->think_open,
                                                           strlen(p->think_open))
                                     : -1;
    }
    if (p->n_choices) {
        s->choices = calloc((size_t)p->n_choices, sizeof *s->choices);
        s->ch_len = malloc((size_t)p->n_choices * sizeof *s->ch_len);
        s->ch_alive = malloc((size_t)p->n_choices);
        if (!s->choices || !s->ch_len || !s->ch_alive) return PGD_ENOMEM;
        memset(s->ch_alive, 1, (size_t)p->n_choices);
        for (; s->n_choices < p->n_choices; s->n_choices++) {
            if (!(s->choices[s->n_choices] = strdup(p->choices[s->n_choices]))) return PGD_ENOMEM;
            s->ch_len[s->n_choices] = strlen(p->choices[s->n_choices]);
        }
    }
    return PGD_OK;
}

/* The mask memo of a regex or grammar request: PGD_OK or PGD_ENOMEM (seq_free frees it). */
static int alloc_memo(seq *s, int32_t nv) {
    for (int i = 0; i < RE_MEMO; i++) {
        s->re_memo_q[i] = -1;
        if (!(s->re_memo[i] = malloc((size_t)nv))) return PGD_ENOMEM;
    }
    return PGD_OK;
}

int pgd_engine_submit(pgd_engine *e, const pgd_request_params *p, uint64_t *id, char *err,
                      size_t errlen) {
    char msg[200];
    const pgd_model_config *mc = &e->model->cfg;
    if (p->n_prompt < 1 || !p->prompt)
        return fail(err, errlen, PGD_EINVAL, "%s", "the prompt is empty");
    if (p->lora < 0 || p->lora > e->n_loras)
        return fail(err, errlen, PGD_EINVAL, "%s", "no such LoRA adapter slot");
    if (p->max_tokens < 0)
        return fail(err, errlen, PGD_EINVAL, "%s", "max_tokens must not be negative");
    if (p->priority && !e->cfg.priority_scheduling)
        return fail(err, errlen, PGD_EINVAL, "%s", "a priority other than 0 needs priority "
                    "scheduling (--scheduling-policy priority)");
    if (p->embedding && p->max_tokens)
        return fail(err, errlen, PGD_EINVAL, "%s", "an embedding request generates nothing");
    for (int32_t i = 0; i < p->n_prompt; i++)
        if (p->prompt[i] < 0 || p->prompt[i] >= mc->n_vocab) {
            snprintf(msg, sizeof msg, "token id %d is outside the vocabulary (0..%d)",
                     p->prompt[i], mc->n_vocab - 1);
            return fail(err, errlen, PGD_EINVAL, "%s", msg);
        }
    if ((int64_t)p->n_prompt + p->max_tokens > e->n_ctx) {
        snprintf(msg, sizeof msg, "the prompt (%d tokens) plus max_tokens (%d) exceeds the "
                 "context length (%d tokens)", p->n_prompt, p->max_tokens, e->n_ctx);
        return fail(err, errlen, PGD_EINVAL, "%s", msg);
    }
    int64_t need = ((int64_t)p->n_prompt + p->max_tokens + e->cfg.block_size - 1) /
                   e->cfg.block_size;
    if (need > e->mgr.n_blocks) {
        snprintf(msg, sizeof msg, "the prompt (%d tokens) plus max_tokens (%d) needs %lld KV "
                 "blocks; the whole pool has %d", p->n_prompt, p->max_tokens, (long long)need,
                 e->mgr.n_blocks);
        return fail(err, errlen, PGD_EINVAL, "%s", msg);
    }
    if (!(p->temperature >= 0) || !(p->top_p >= 0 && p->top_p <= 1) || p->top_k < 0)
        return fail(err, errlen, PGD_EINVAL, "%s", "temperature must be >= 0, top_p in [0, 1], "
                    "top_k >= 0");
    if (p->n_stop < 0 || p->n_stop > MAX_STOP)
        return fail(err, errlen, PGD_EINVAL, "%s", "at most 16 stop strings");
    if (p->n_stop > 0 && !e->model->tok)
        return fail(err, errlen, PGD_EUNSUPPORTED, "%s", "stop strings need a tokenizer; "
                    "the model has none (--load-format dummy)");
    bool json = p->json_object || p->json_schema;
    if (json && !e->model->tok)
        return fail(err, errlen, PGD_EUNSUPPORTED, "%s", "JSON output needs a tokenizer; "
                    "the model has none (--load-format dummy)");
    bool gram = wants_grammar(p);
    if ((json || p->n_choices || p->regex || gram) && p->min_tokens > 0)
        return fail(err, errlen, PGD_EINVAL, "%s", "min_tokens cannot be combined with "
                    "structured output (JSON, choices, a regex, a grammar), which ends where it "
                    "is whole");
    for (int32_t i = 0; i < p->n_stop; i++) {
        size_t l = p->stop[i] ? strlen(p->stop[i]) : 0;
        if (l == 0 || l > MAX_STOP_LEN)
            return fail(err, errlen, PGD_EINVAL, "%s", "stop strings must be 1 to 64 bytes");
    }
    int32_t nv = e->model->cfg.n_vocab;
    if (p->n_stop_token_ids < 0 || p->n_stop_token_ids > MAX_STOP_IDS ||
        p->n_allowed_token_ids < 0 || p->n_allowed_token_ids > nv)
        return fail(err, errlen, PGD_EINVAL, "%s", "too many stop or allowed token ids");
    for (int32_t i = 0; i < p->n_stop_token_ids + p->n_allowed_token_ids; i++) {
        int32_t t = i < p->n_stop_token_ids ? p->stop_token_ids[i]
                                            : p->allowed_token_ids[i - p->n_stop_token_ids];
        if (t < 0 || t >= nv)
            return fail(err, errlen, PGD_EINVAL, "%s", "a stop or allowed token id is outside "
                        "the vocabulary");
    }
    if (p->n_choices < 0 || p->n_choices > PGD_MAX_CHOICES)
        return fail(err, errlen, PGD_EINVAL, "%s", "too many choices");
    if ((p->n_choices || p->regex || gram) && !e->model->tok)
        return fail(err, errlen, PGD_EINVAL, "%s", "choices, regular expressions and grammars "
                    "need a tokenizer; the model has none (--load-format dummy)");
    if (json + (p->n_choices > 0) + (p->regex != NULL) + gram > 1)
        return fail(err, errlen, PGD_EINVAL, "%s", "one kind of structured output at a time "
                    "(JSON, choices, a regular expression or a grammar)");
    for (int32_t i = 0; i < p->n_choices; i++) {
        size_t l = p->choices[i] ? strlen(p->choices[i]) : 0;
        if (l == 0 || l > PGD_MAX_CHOICE_LEN)
            return fail(err, errlen, PGD_EINVAL, "%s", "choices must be 1 to 4096 bytes");
    }
    seq *s = calloc(1, sizeof *s);
    if (!s) return fail(err, errlen, PGD_ENOMEM, "%s", "out of memory");
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
                      (e->spec_mode == PGD_SPEC_DRAFT && pgd_draft_seq_init(&e->draft, &s->dseq))
                  ? PGD_ENOMEM
                  : pgd_sampler_init(&s->sampler, &sp, &e->sample_scratch, &serr);
    if (src) {
        seq_free(s);
        return fail(err, errlen, src, "%s", src == PGD_ENOMEM ? "out of memory" : serr.msg);
    }
    if (p->logprobs < -1 || p->logprobs > PGD_MAX_TOP_LOGPROBS || p->prompt_top_logprobs < 0 ||
        p->prompt_top_logprobs > PGD_MAX_TOP_LOGPROBS) {
        seq_free(s);
        return fail(err, errlen, PGD_EINVAL, "%s", "logprobs must be between 0 and 20");
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
    s->json = json;
    if (copy_constraints(e, s, p)) {
        seq_free(s);
        return fail(err, errlen, PGD_ENOMEM, "%s", "out of memory");
    }
    if (p->regex) {
        char why[200] = "out of memory";
        int rc = p->regex_dfa
                     ? pgd_regex_copy(&s->re, p->regex_dfa)
                     : pgd_regex_compile(p->regex, strlen(p->regex), &s->re, why, sizeof why);
        if (rc) {
            seq_free(s);
            return fail(err, errlen, rc, "regular expression: %s", why);
        }
        s->has_re = true;
        if (alloc_memo(s, nv)) {
            seq_free(s);
            return fail(err, errlen, PGD_ENOMEM, "%s", "out of memory");
        }
    }
    if (gram) {
        char why[200] = "out of memory";
        int rc = p->grammar_c ? pgd_grammar_copy(&s->gr, p->grammar_c)
                              : pgd_grammar_compile(p->grammar, strlen(p->grammar), &s->gr, why,
                                                    sizeof why);
        if (!rc) rc = pgd_grammar_state_init(&s->gr_st);
        if (!rc && (alloc_memo(s, nv) || !(s->gr_keys = calloc(RE_MEMO, sizeof *s->gr_keys))))
            rc = PGD_ENOMEM;
        if (rc) {
            seq_free(s);
            return fail(err, errlen, rc, "grammar: %s", why);
        }
        s->has_gr = true;
    }
    pgd_json_init(&s->json_st, true);
    if (p->json_schema) {
        char why[200];
        int rc = p->json_schema_c
                     ? pgd_json_schema_copy(&s->schema, p->json_schema_c)
                     : pgd_json_schema_compile(p->json_schema, strlen(p->json_schema), &s->schema,
                                               why, sizeof why);
        if (rc == PGD_ENOMEM) snprintf(why, sizeof why, "out of memory");
        if (!rc && ((p->json_prefix && !(s->schema.prefix = strdup(p->json_prefix))) ||
                    (p->json_suffix && !(s->schema.suffix = strdup(p->json_suffix))))) {
            rc = PGD_ENOMEM;
            snprintf(why, sizeof why, "out of memory");
        }
        if (rc) {
            seq_free(s);
            return fail(err, errlen, rc, "JSON schema: %s", why);
        }
        pgd_json_init_schema(&s->json_st, &s->schema);
    }
    pgd_spec_adapt_init(&s->adapt, e->spec_k);
    memcpy(s->tokens, p->prompt, (size_t)p->n_prompt * sizeof *s->tokens);
    s->n_prompt = s->n_tokens = p->n_prompt;
    s->max_tokens = p->max_tokens;
    s->user_data = p->user_data;
    s->ignore_eos = p->ignore_eos;
    s->priority = p->priority;
    for (int32_t i = 0; i < p->n_stop; i++) {
        s->stop[i] = strdup(p->stop[i]);
        if (!s->stop[i]) {
            seq_free(s);
            return fail(err, errlen, PGD_ENOMEM, "%s", "out of memory");
        }
        s->n_stop++;
        int32_t l = (int32_t)strlen(p->stop[i]);
        if (l - 1 > s->hold) s->hold = l - 1;
    }
    pgd_detok_init(&s->detok, e->model->tok, p->render_special);
    /* SentencePiece decoders drop the leading space of the text's first piece; generated text
     * continues the prompt, so that applies only when the prompt is BOS alone. */
    s->detok.first = e->model->tok && p->n_prompt == 1 &&
                     p->prompt[0] == pgd_tokenizer_bos(e->model->tok);
    s->logit_row = -1;
    s->stop_str = s->stop_tok = -1;
    if (reserve_finish(e)) {
        seq_free(s);
        return fail(err, errlen, PGD_ENOMEM, "%s", "out of memory");
    }
    pthread_mutex_lock(&e->in_mu);
    if (e->cfg.max_waiting > 0 && e->n_pending >= e->cfg.max_waiting) {
        pthread_mutex_unlock(&e->in_mu);
        unreserve_finish(e);
        seq_free(s);
        return fail(err, errlen, PGD_ERANGE, "%s", "the waiting queue is full");
    }
    if (p->lora) { /* the sequence holds its adapter until it finishes (lora_release) */
        pthread_mutex_lock(&e->lora_mu);
        int32_t k = p->lora - 1;
        bool ok = e->loras[k] && !e->lora_retired[k];
        if (ok) {
            e->lora_users[k]++;
            s->lora = p->lora;
            s->kv.ns = e->lora_ns[k];
        }
        pthread_mutex_unlock(&e->lora_mu);
        if (!ok) {
            pthread_mutex_unlock(&e->in_mu);
            unreserve_finish(e);
            seq_free(s);
            return fail(err, errlen, PGD_EINVAL, "%s", "the LoRA adapter is not loaded");
        }
    }
    s->id = e->next_id++;
    s->t_submit = pgd_now_s();
    *id = s->id;
    e->n_pending++;
    list_push_back(&e->incoming, s);
    pthread_cond_signal(&e->in_cv);
    pthread_mutex_unlock(&e->in_mu);
    return PGD_OK;
}

void pgd_engine_abort(pgd_engine *e, uint64_t id) {
    pthread_mutex_lock(&e->in_mu);
    if (e->n_aborts == e->cap_aborts) {
        size_t nc = e->cap_aborts ? e->cap_aborts * 2 : 64;
        uint64_t *n = realloc(e->aborts, nc * sizeof *n);
        if (!n) {
            pthread_mutex_unlock(&e->in_mu);
            return; /* cannot record: the request simply runs to completion */
        }
        e->aborts = n;
        e->cap_aborts = nc;
    }
    e->aborts[e->n_aborts++] = id;
    pthread_cond_signal(&e->in_cv);
    pthread_mutex_unlock(&e->in_mu);
}

/* ---- the step ---- */

/* ---- LoRA slots ---- */

/* Empties slot k (index k - 1) and frees its adapter; lora_mu held. */
static void lora_slot_free(pgd_engine *e, int32_t k) {
    pgd_err perr;
    pgd_fwd_set_lora(&e->fwd, k + 1, NULL, &perr); /* emptying allocates nothing: cannot fail */
    pgd_lora_free(e->loras[k]);
    e->loras[k] = NULL;
    e->lora_retired[k] = false;
}

/* Puts adapter l (taken over, freed on failure) into a free slot, *k its number. */
static int install_lora(pgd_engine *e, pgd_lora *l, int32_t *k, pgd_err *err) {
    pthread_mutex_lock(&e->lora_mu);
    int32_t i = 0;
    while (i < e->n_loras && e->loras[i]) i++;
    int rc = i == e->n_loras ? pgd_err_set(err, PGD_ERANGE, "%s: all %d LoRA adapter slots are "
                                           "taken (--max-loras)", l->path, e->n_loras)
                             : pgd_fwd_set_lora(&e->fwd, i + 1, l, err);
    if (!rc) {
        e->loras[i] = l;
        if (++e->next_ns == 0) e->next_ns++; /* (0 is the base model's) */
        e->lora_ns[i] = e->next_ns;
        e->lora_users[i] = 0;
        *k = i + 1;
    }
    pthread_mutex_unlock(&e->lora_mu);
    if (rc) pgd_lora_free(l);
    return rc;
}

/* A finished sequence lets go of its adapter; the last one out of an unloaded slot frees it. */
static void lora_release(pgd_engine *e, seq *s) {
    if (!s->lora) return;
    pthread_mutex_lock(&e->lora_mu);
    int32_t k = s->lora - 1;
    if (--e->lora_users[k] == 0 && e->lora_retired[k]) lora_slot_free(e, k);
    pthread_mutex_unlock(&e->lora_mu);
    s->lora = 0;
}

int pgd_engine_load_lora(pgd_engine *e, const char *path, int32_t *lora, char *err,
                         size_t errlen) {
    pgd_err perr = {{0}};
    pgd_lora *l = NULL;
    int rc = !e->n_loras ? pgd_err_set(&perr, PGD_EINVAL, "the engine has no LoRA adapter slots "
                                       "(max_loras)")
                         : pgd_lora_load(path, e->model, &l, &perr);
    if (!rc) rc = install_lora(e, l, lora, &perr);
    if (rc && err && errlen) snprintf(err, errlen, "%s", perr.msg);
    return rc;
}

int pgd_engine_unload_lora(pgd_engine *e, int32_t lora) {
    if (lora < 1 || lora > e->n_loras) return PGD_ENOENT;
    pthread_mutex_lock(&e->lora_mu);
    int32_t k = lora - 1;
    int rc = e->loras[k] && !e->lora_retired[k] ? PGD_OK : PGD_ENOENT;
    if (!rc) {
        e->lora_retired[k] = true;
        if (e->lora_users[k] == 0) lora_slot_free(e, k);
    }
    pthread_mutex_unlock(&e->lora_mu);
    return rc;
}

static void finish_seq(pgd_engine *e, seq *s, pgd_finish_reason why, const char *error) {
    list_remove(s->state == SEQ_RUNNING ? &e->running : &e->waiting, s);
    if (s->state == SEQ_WAITING) {
        pthread_mutex_lock(&e->in_mu);
        e->n_pending--;
        pthread_mutex_unlock(&e->in_mu);
    }
    pgd_kv_release(&e->mgr, &s->kv);
    if (e->spec_mode == PGD_SPEC_DRAFT) pgd_draft_seq_release(&e->draft, &s->dseq);
    lora_release(e, s);
    if (why != PGD_FINISH_ABORT && why != PGD_FINISH_ERROR) {
        /* bytes of a character the generation stopped in the middle of: one U+FFFD, as
         * Hugging Face's decode reports them, so the text stays valid UTF-8 */
        if (text_reserve(s, 3) == 0) {
            int nb = pgd_detok_flush(&s->detok, s->text + s->text_len, 3);
            if (nb > 0) s->text_len += (size_t)nb;
        }
    }
    emit_finish(e, s, why, error);
    seq_free(s);
}

static void drain_inbox(pgd_engine *e) {
    pthread_mutex_lock(&e->in_mu);
    seq_list in = e->incoming;
    memset(&e->incoming, 0, sizeof e->incoming);
    size_t na = e->n_aborts;
    uint64_t small[64], *ab = na <= 64 ? small : malloc(na * sizeof *ab);
    if (ab && na) memcpy(ab, e->aborts, na * sizeof *ab); /* aborts: NULL before the first */
    else na = 0; /* out of memory: aborts retried next step */
    e->n_aborts -= na;
    pthread_mutex_unlock(&e->in_mu);
    for (seq *s = in.head, *n; s; s = n) {
        n = s->next;
        s->state = SEQ_WAITING;
        list_enqueue(&e->cfg, &e->waiting, s, false);
    }
    for (size_t i = 0; i < na; i++) {
        seq *lists[2] = {e->waiting.head, e->running.head};
        for (int l = 0; l < 2; l++)
            for (seq *s = lists[l]; s; s = s->next)
                if (s->id == ab[i]) {
                    finish_seq(e, s, PGD_FINISH_ABORT, NULL);
                    l = 2;
                    break;
                }
    }
    if (ab != small) free(ab);
}

/* Recompute preemption: drop the sequence's KV and put it back at the head of the queue (in its
 * place, under priority scheduling). */
static void preempt(pgd_engine *e, seq *s) {
    list_remove(&e->running, s);
    pgd_kv_release(&e->mgr, &s->kv);
    if (e->spec_mode == PGD_SPEC_DRAFT) pgd_draft_seq_release(&e->draft, &s->dseq);
    s->n_computed = 0;
    s->n_draft = 0;
    s->sched_n = 0;
    s->state = SEQ_WAITING;
    list_enqueue(&e->cfg, &e->waiting, s, true);
    pthread_mutex_lock(&e->in_mu);
    e->n_pending++;
    pthread_mutex_unlock(&e->in_mu);
    e->stats.num_preemptions++;
}

/* Reserves blocks for n more tokens of s; performs a copy-on-write copy if one is needed. */
static bool reserve(pgd_engine *e, seq *s, int32_t n) {
    pgd_kv_copy cp;
    if (pgd_kv_reserve(&e->mgr, &s->kv, s->n_computed, s->n_computed + n, &cp)) return false;
    if (cp.n) pgd_kv_cache_copy_block(&e->kv, cp.src, cp.dst, cp.n);
    return true;
}

/* Largest n <= want whose blocks fit in the free pool. */
static int32_t fit_tokens(pgd_engine *e, seq *s, int32_t want) {
    int32_t bs = e->cfg.block_size;
    int32_t have = s->kv.n_blocks * bs - s->n_computed; /* slots left in reserved blocks */
    if (have < 0) have = 0;
    int64_t can = (int64_t)have + (int64_t)pgd_kv_n_free(&e->mgr) * bs;
    return want < can ? want : (int32_t)can;
}

/* Asks the request's proposer for up to cap proposals, written after its last token. */
static int32_t propose(pgd_engine *e, seq *s, int32_t cap) {
    int32_t k = pgd_spec_adapt_want(&s->adapt);
    int32_t left = s->max_tokens - (s->n_tokens - s->n_prompt) - 1; /* after the next token */
    if (k > left) k = left;
    if (k > cap) k = cap;
    if (s->n_tokens + k > e->n_ctx) k = e->n_ctx - s->n_tokens;
    if (k <= 0) return 0;
    int32_t *out = s->tokens + s->n_tokens;
    if (e->spec_mode == PGD_SPEC_NGRAM)
        return pgd_spec_ngram_propose(s->tokens, s->n_tokens, e->ngram_min, e->ngram_max, k, out);
    return pgd_draft_propose(&e->draft, &s->dseq, s->tokens, s->n_tokens, k, out);
}

/* Logits rows a chunk of n tokens from s->n_computed needs: the last token's when the chunk
 * ends the sequence, plus one per prompt position still owing its next token's logprob. */
static int32_t chunk_rows(const seq *s, int32_t n) {
    int32_t c = s->n_computed;
    int32_t rows = c + n == s->n_tokens && (s->max_tokens > 0 || s->embed_out);
    if (s->prompt_lp) {
        int32_t a = c > s->lp_pos ? c : s->lp_pos;
        int32_t b = c + n < s->n_prompt - 1 ? c + n : s->n_prompt - 1;
        if (b > a) rows += b - a;
    }
    return rows;
}

/* Largest n' <= n whose chunk needs at most left logits rows. */
static int32_t fit_rows(const seq *s, int32_t n, int32_t left) {
    if (chunk_rows(s, n) <= left) return n;
    int32_t c = s->n_computed, a = c > s->lp_pos ? c : s->lp_pos;
    if (s->prompt_lp && a - c + left < n) n = a - c + left; /* left rows of prompt positions */
    while (n > 0 && chunk_rows(s, n) > left) n--;           /* at most once more: the last row */
    return n;
}

/* Whether s may start from the prefix cache: not while it owes prompt logprobs, whose
 * positions' logits a cache hit would skip. */
static bool may_hit_prefix(const seq *s) { return !s->prompt_lp || s->lp_pos >= s->n_prompt - 1; }

/* Looks a waiting s up in the prefix cache: s->kv takes the blocks it matches, s->n_computed
 * their tokens; stats0 keeps the counters for undo_lookup. */
static int32_t lookup_prefix(pgd_engine *e, seq *s, int64_t stats0[2]) {
    stats0[0] = e->mgr.stats.prefix_queries;
    stats0[1] = e->mgr.stats.prefix_hits;
    s->n_computed =
        may_hit_prefix(s) ? pgd_kv_match_prefix(&e->mgr, &s->kv, s->tokens, s->n_tokens) : 0;
    return s->n_computed;
}

/* Undoes lookup_prefix, counters included: s did not start after all. */
static void undo_lookup(pgd_engine *e, seq *s, const int64_t stats0[2]) {
    pgd_kv_release(&e->mgr, &s->kv);
    s->n_computed = 0;
    e->mgr.stats.prefix_queries = stats0[0];
    e->mgr.stats.prefix_hits = stats0[1];
}

/* Preempts the running sequences of a lower priority than s (a larger value; the tail first)
 * while s's next chunk of up to a whole budget does not fit in the free blocks (or, waiting,
 * s has no sequence slot). */
static void preempt_below(pgd_engine *e, seq *s, bool waiting) {
    int32_t rem = s->n_tokens - s->n_computed, budget = e->cfg.max_num_batched_tokens;
    int32_t want = rem < budget ? rem : budget;
    while (e->running.tail && e->running.tail != s && e->running.tail->priority > s->priority &&
           ((waiting && e->running.n >= e->cfg.max_num_seqs) || fit_tokens(e, s, want) < want))
        preempt(e, e->running.tail);
}

/* Priority scheduling, before a step is formed: the running sequences still in prefill, best
 * first, and the first waiting request take the room they need from lower priorities. Decodes
 * need no help: one that misses a block preempts the list's tail, the lowest priority. */
static void make_room(pgd_engine *e) {
    if (!e->cfg.priority_scheduling) return;
    for (seq *s = e->running.head; s; s = s->next)
        if (s->n_tokens - s->n_computed > 1) preempt_below(e, s, false);
    seq *h = e->waiting.head;
    if (!h || (e->running.tail && e->running.tail->priority <= h->priority)) return;
    int64_t stats0[2];
    lookup_prefix(e, h, stats0);
    preempt_below(e, h, true);
    undo_lookup(e, h, stats0);
}

static int32_t schedule(pgd_engine *e, seq **sched, int32_t *n_sched) {
    int32_t budget = e->cfg.max_num_batched_tokens, used = 0, ns = 0, rows = 0;
    const int32_t spec_off_at = e->cfg.speculative_disable_by_batch_size;
    make_room(e);
    const bool spec_step = spec_off_at <= 0 || e->running.n < spec_off_at;
    /* 1. running decodes, in admission order */
    for (seq *s = e->running.head, *next; s && used < budget; s = next) {
        next = s->next;
        if (s->n_tokens - s->n_computed != 1) continue;
        /* speculation: the pending token plus k proposals, if their blocks are free (proposals
         * never preempt anyone) */
        int32_t k = s->spec && spec_step ? propose(e, s, budget - used - 1) : 0;
        if (k > 0 && !reserve(e, s, 1 + k)) {
            k = 0;
            if (e->spec_mode == PGD_SPEC_DRAFT)
                pgd_draft_rollback(&e->draft, &s->dseq, s->n_tokens);
        }
        if (k > 0) {
            s->sched_n = 1 + k;
            s->n_draft = k;
            sched[ns++] = s;
            used += 1 + k;
            rows += 1 + k;
            continue;
        }
        bool ok = true;
        while (!reserve(e, s, 1)) {
            seq *victim = e->running.tail;
            if (victim == next) next = next->next; /* never happens before s, but keep next valid */
            preempt(e, victim);
            if (victim == s) {
                ok = false;
                break;
            }
        }
        if (!ok) continue;
        s->sched_n = 1;
        sched[ns++] = s;
        used++;
        rows++;
    }
    /* decodes never run out of rows: max_logits >= max_num_seqs, and a speculating sequence's
     * rows are its tokens, within the budget (pgd_engine_create) */
    PGD_ASSERT(rows <= e->max_logits);
    /* 2. prefill chunks of running sequences */
    for (seq *s = e->running.head; s && used < budget; s = s->next) {
        int32_t rem = s->n_tokens - s->n_computed;
        if (rem <= 1 || s->sched_n) continue;
        int32_t n = fit_tokens(e, s, rem < budget - used ? rem : budget - used);
        n = fit_rows(s, n, e->max_logits - rows);
        if (n <= 0 || !reserve(e, s, n)) continue;
        s->sched_n = n;
        sched[ns++] = s;
        used += n;
        rows += chunk_rows(s, n);
    }
    /* 3. waiting requests, in order (preempted ones first; by priority under priority
     *    scheduling) */
    bool admit = !e->cfg.static_batching || e->running.n == 0 || e->admitting;
    e->admitting = false;
    while (admit && e->waiting.head && used < budget && e->running.n < e->cfg.max_num_seqs) {
        seq *s = e->waiting.head;
        int64_t stats0[2];
        int32_t hit = lookup_prefix(e, s, stats0);
        int32_t rem = s->n_tokens - s->n_computed;
        int32_t n = fit_tokens(e, s, rem < budget - used ? rem : budget - used);
        n = fit_rows(s, n, e->max_logits - rows);
        if (n <= 0 || !reserve(e, s, n)) {
            /* does not fit now: undo the lookup and wait (the head is never skipped) */
            undo_lookup(e, s, stats0);
            break;
        }
        if (!s->admitted_once) {
            if (s->has_gr) pgd_grammar_state_start(&s->gr_st, &s->gr, e->gr_scratch);
            s->n_cached = hit;
            s->admitted_once = true;
            s->queue_seconds = pgd_now_s() - s->t_submit;
            e->stats.prompt_tokens_total += s->n_prompt;
        }
        list_remove(&e->waiting, s);
        pthread_mutex_lock(&e->in_mu);
        e->n_pending--;
        pthread_mutex_unlock(&e->in_mu);
        s->state = SEQ_RUNNING;
        list_enqueue(&e->cfg, &e->running, s, false);
        s->sched_n = n;
        sched[ns++] = s;
        used += n;
        rows += chunk_rows(s, n);
        /* static batching fills its batch over as many steps as the token budget needs */
        e->admitting = e->cfg.static_batching && e->running.n < e->cfg.max_num_seqs;
    }
    if (!e->waiting.head) e->admitting = false;
    *n_sched = ns;
    return used;
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
        int nb = pgd_detok_push(&s->detok, id, s->text + s->text_len, s->text_cap - s->text_len);
        if (nb > 0) s->text_len += (size_t)nb;
    } /* out of memory: the token's text is lost, the generation goes on */
    /* no stop string ends the generation before min_tokens (as in vLLM, whose stop check
     * returns early until then) */
    int n_stop = !why && s->n_tokens - s->n_prompt >= s->sampler.params.min_tokens ? s->n_stop : 0;
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
    pgd_event *ev = step_event(e);
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
static void score_prompts(pgd_engine *e, int32_t ns) {
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
        pgd_event *ev = step_event(e);
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

/* s's output is held to JSON, choices, a regex or a grammar. */
static bool constrained_output(const seq *s) {
    return s->json || s->choices || s->has_re || s->has_gr;
}

/* allow[] of every end-of-generation token = 1 (where the output may end). */
static void allow_eog(const pgd_engine *e, uint8_t *allow) {
    for (int32_t k = 0; k < e->n_eog; k++) allow[e->eog[k]] = 1;
}

/* Keeps mask a in s's memo, over its oldest entry: that entry's index. */
static int memo_put(seq *s, const uint8_t *a, int32_t nv) {
    int m = s->re_memo_next;
    s->re_memo_next = (m + 1) % RE_MEMO;
    memcpy(s->re_memo[m], a, (size_t)nv);
    return m;
}

/* guided_choice: allow[] = the tokens that keep the output a prefix of an alive choice, and
 * the end-of-generation tokens where it is one already. */
static void choice_mask(pgd_engine *e, const seq *s, uint8_t *allow) {
    memset(allow, 0, (size_t)e->model->cfg.n_vocab);
    for (int32_t i = 0; i < s->n_choices; i++) {
        if (!s->ch_alive[i]) continue;
        size_t l = s->ch_len[i];
        if (l > s->ch_pos)
            pgd_json_vocab_allow_prefixes(&e->json_vocab, s->choices[i] + s->ch_pos,
                                          l - s->ch_pos, allow);
        else
            allow_eog(e, allow);
    }
}

/* Some alive choice goes on with t[0..n) after the output so far. */
static bool choice_takes(const seq *s, const char *t, size_t n) {
    for (int32_t i = 0; i < s->n_choices; i++)
        if (s->ch_alive[i] && s->ch_len[i] >= s->ch_pos + n &&
            !memcmp(s->choices[i] + s->ch_pos, t, n))
            return true;
    return false;
}

/* Moves s's choices over token id, whose text adds t[0..n): STOP at an end-of-generation token
 * (the mask allowed it: the output is a choice) or once the output is a choice that no alive
 * one continues. */
static pgd_finish_reason choice_advance(pgd_engine *e, seq *s, int32_t id, const char *t,
                                        size_t n) {
    if (e->json_vocab.eog[id]) return PGD_FINISH_STOP;
    size_t at = s->ch_pos;
    bool any = false, longer = false;
    for (int32_t i = 0; i < s->n_choices; i++) {
        size_t l = s->ch_len[i];
        if (!s->ch_alive[i] || l < at + n || memcmp(s->choices[i] + at, t, n)) {
            s->ch_alive[i] = 0;
            continue;
        }
        any = true;
        longer |= l > at + n;
    }
    s->ch_pos += n;
    /* a refused token: only from logits with no finite value (the sampler's fallback) */
    if (!any || n == 0) return PGD_FINISH_ERROR;
    return longer ? 0 : PGD_FINISH_STOP;
}

/* SentencePiece with a dummy prefix after a prompt of BOS alone: the detokenizer drops the
 * next piece's leading space (pgd_detok), so the constraints must not see it either. */
static bool drops_space(const pgd_engine *e, const seq *s) {
    return e->model->tok && pgd_detok_drops_space(&s->detok);
}

/* The bytes token id adds to the text: its piece, less a leading space when drop. */
static const char *token_text(const pgd_engine *e, int32_t id, bool drop, size_t *n) {
    const char *t = e->json_vocab.text[id];
    *n = e->json_vocab.len[id];
    if (drop && *n > 0 && t[0] == ' ') t++, (*n)--;
    return t;
}

/* The mask of a constrained answer's first token when its leading space is dropped: a grammar
 * walks the trie with the space skipped (within its work limit: false past it); the others by
 * the definition, each token less the space fed to a copy of the state (cheap: a DFA, the JSON
 * machine, choices). Once per request, and only for SentencePiece models given BOS alone. A
 * token left with no text is refused (it would emit nothing). */
static bool first_token_mask(pgd_engine *e, seq *s, uint8_t *a) {
    const pgd_json_vocab *v = &e->json_vocab;
    if (s->has_gr) {
        if (pgd_grammar_allowed_drop_space(&s->gr_st, &s->gr, e->gr_scratch, &e->json_vocab,
                                           a) < 0)
            return false;
        if (pgd_grammar_complete(&s->gr_st)) allow_eog(e, a);
        return true;
    }
    memset(a, 0, (size_t)e->model->cfg.n_vocab);
    for (int32_t id = 0; id < v->n; id++) {
        size_t n;
        const char *t = token_text(e, id, true, &n);
        if (v->eog[id] || n == 0) continue;
        if (s->json) {
            pgd_json_state c = s->json_st;
            a[id] = pgd_json_feed(&c, t, n);
        } else if (s->has_re) {
            a[id] = pgd_regex_feed(&s->re, s->re_q, t, n) >= 0;
        } else {
            a[id] = choice_takes(s, t, n);
        }
    }
    if (s->has_re && s->re.accept[s->re_q]) allow_eog(e, a);
    return true;
}

/* The mask of s's next token in e->json_allow, when it has one: JSON (json_st) or choices,
 * narrowed to allowed_token_ids, and without the stop tokens while output < min_tokens. */
static bool build_mask(pgd_engine *e, seq *s) {
    int32_t nv = e->model->cfg.n_vocab;
    bool under_min = s->n_stop_ids > 0 && s->n_tokens - s->n_prompt < s->sampler.params.min_tokens;
    bool constrained = constrained_output(s) && s->c_wait != C_THINKING;
    if (!constrained && !s->allowed && !under_min) return false;
    uint8_t *a = e->json_allow;
    if (constrained && drops_space(e, s)) { /* (not memoized: other masks see whole pieces) */
        if (!first_token_mask(e, s, a)) {
            s->err_msg = GRAMMAR_WORK_MSG;
            return true;
        }
    } else if (constrained && s->json) {
        pgd_json_allowed(&s->json_st, &e->json_vocab, a);
    } else if (constrained && s->has_re) {
        int m = 0;
        while (m < RE_MEMO && s->re_memo_q[m] != s->re_q) m++;
        if (m < RE_MEMO) {
            memcpy(a, s->re_memo[m], (size_t)nv);
        } else {
            pgd_json_vocab_walk_dfa(&e->json_vocab, &s->re, s->re_q, a);
            if (s->re.accept[s->re_q]) allow_eog(e, a);
            s->re_memo_q[memo_put(s, a, nv)] = s->re_q;
        }
    } else if (constrained && s->has_gr) {
        pgd_grammar_key *key = &e->gr_key;
        pgd_grammar_state_key(&s->gr_st, key);
        int m = 0;
        while (m < RE_MEMO && !pgd_grammar_key_equal(key, &s->gr_keys[m])) m++;
        if (m < RE_MEMO) {
            memcpy(a, s->re_memo[m], (size_t)nv);
        } else {
            if (pgd_grammar_allowed(&s->gr_st, &s->gr, e->gr_scratch, &e->json_vocab, a) < 0) {
                /* nothing allowed: the sample fails and ends the request with this */
                s->err_msg = GRAMMAR_WORK_MSG;
                return true;
            }
            if (pgd_grammar_complete(&s->gr_st)) allow_eog(e, a);
            if (key->n) s->gr_keys[memo_put(s, a, nv)] = *key;
        }
    } else if (constrained) {
        choice_mask(e, s, a);
    } else { /* allowed_token_ids alone (or the stop tokens under min_tokens) */
        if (s->allowed) memcpy(a, s->allowed, (size_t)nv);
        else memset(a, 1, (size_t)nv);
    }
    if (s->c_wait == C_FIRST && s->think_tok >= 0) a[s->think_tok] = 1;
    if (s->allowed && constrained)
        for (int32_t i = 0; i < nv; i++) a[i] &= s->allowed[i];
    if (under_min)
        for (int32_t i = 0; i < s->n_stop_ids; i++) a[s->stop_ids[i]] = 0;
    return true;
}

/* Moves s's JSON state over token id (text t[0..n)): STOP once the object is closed. A token
 * the mask refused can only come from logits with no finite value (the sampler's arg-max
 * fallback): an error. */
static pgd_finish_reason json_advance(pgd_engine *e, seq *s, int32_t id, const char *t,
                                      size_t n) {
    if (e->json_vocab.eog[id] || !n || !pgd_json_feed(&s->json_st, t, n)) return PGD_FINISH_ERROR;
    return pgd_json_complete(&s->json_st) ? PGD_FINISH_STOP : 0;
}

/* Moves s's constraint over token id: JSON or choices, once thinking (constrain_after) is over:
 * a first think_open token starts it, the token that completes c_after ends it. drop: the
 * token's leading space was dropped from the text (drops_space before it was emitted). */
static pgd_finish_reason constraint_advance(pgd_engine *e, seq *s, int32_t id, bool drop) {
    if (s->c_wait == C_FIRST) {
        s->c_wait = id == s->think_tok ? C_THINKING : C_ON;
        if (s->c_wait == C_THINKING) return 0;
    }
    if (s->c_wait == C_THINKING) {
        size_t l = strlen(s->c_after), from = s->c_scan < s->text_len ? s->c_scan : s->text_len;
        if (memmem(s->text + from, s->text_len - from, s->c_after, l)) s->c_wait = C_ON;
        else if (s->text_len >= l) s->c_scan = s->text_len - l + 1; /* a match may straddle */
        return 0;
    }
    if (!constrained_output(s)) return 0; /* (and maybe no vocabulary) */
    size_t n;
    const char *t = token_text(e, id, drop, &n);
    if (s->json) return json_advance(e, s, id, t, n);
    if (s->choices) return choice_advance(e, s, id, t, n);
    if (s->has_re) {
        /* an end-of-generation token only where the mask let it (a match); a refused token
         * only from logits with no finite value (the sampler's fallback) */
        if (e->json_vocab.eog[id]) return PGD_FINISH_STOP;
        int32_t q = n ? pgd_regex_feed(&s->re, s->re_q, t, n) : -1;
        if (q < 0) return PGD_FINISH_ERROR;
        s->re_q = q;
        return s->re.accept[q] && !s->re.extend[q] ? PGD_FINISH_STOP : 0;
    }
    if (s->has_gr) { /* as the regex: STOP at a sentence no byte can extend */
        if (e->json_vocab.eog[id]) return PGD_FINISH_STOP;
        if (!n || !pgd_grammar_feed(&s->gr_st, &s->gr, e->gr_scratch, t, n))
            return PGD_FINISH_ERROR;
        return pgd_grammar_complete(&s->gr_st) && !pgd_grammar_extends(&s->gr_st)
                   ? PGD_FINISH_STOP
                   : 0;
    }
    return 0;
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
        if (masked) s->sampler.allow = e->json_allow;
        pgd_sampler_dist_compute(&s->sampler, lg, s->tokens, s->n_prompt, s->n_tokens, &d);
        s->sampler.allow = NULL;
        bool accepted = false;
        int32_t id = j == k ? pgd_sampler_draw(&s->sampler, &d)
                   : e->spec_broken ? (accepted = true, drafts[j])
                                    : pgd_spec_verify_token(&s->sampler, &d, drafts[j], NULL,
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
        pgd_spec_adapt_update(&s->adapt, k, n_acc);
    }
    if (why) return why;
    /* K/V is valid for the tokens that were inputs and survived: all but the newest */
    if (s->n_computed > s->n_tokens - 1) s->n_computed = s->n_tokens - 1;
    if (k > 0) pgd_kv_truncate(&e->mgr, &s->kv, s->n_computed);
    pgd_kv_commit(&e->mgr, &s->kv, s->tokens, s->n_computed);
    if (e->spec_mode == PGD_SPEC_DRAFT) {
        int32_t dn = s->dseq.n_computed < s->n_tokens - 1 ? s->dseq.n_computed : s->n_tokens - 1;
        pgd_draft_rollback(&e->draft, &s->dseq, dn);
    }
    return 0;
}

/* Whether s's next token can be sampled on the backend: its chain is temperature, top-k, top-p
 * and min-p alone -- no processor that reads the history, the bias or a mask (JSON, choices, a
 * regex, allowed ids), no logprobs (they need the logits), no proposals to verify. */
static bool device_sampleable(const pgd_engine *e, const seq *s) {
    const pgd_sampler_params *p = &s->sampler.params;
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
        const pgd_sampler_params *p = &s->sampler.params;
        pgd_sample_row *r = &e->b_sample[s->logit_row];
        *r = (pgd_sample_row){.temperature = p->temperature, .top_p = p->top_p,
                              .min_p = p->min_p, .top_k = p->top_k};
        if (p->temperature > 0 && p->top_k != 1) r->u = pgd_sampler_uniform_f32(&s->sampler);
        s->dev_sampled = true;
        n_dev++;
    }
    if (n_dev == 0) return;
    b->sample = e->b_sample;
    b->sampled = e->b_sampled;
    b->need_logits = n_host > 0;
}

/* Brings the engine thread's counters up to date (publish copies them out); O(running
 * sequences), with no lock held. */
static void snapshot_stats(pgd_engine *e) {
    pgd_engine_stats *s = &e->stats;
    s->num_running = e->running.n;
    s->num_waiting = e->waiting.n;
    s->lora_running = s->lora_waiting = 0;
    for (int l = 0; e->n_loras && l < 2; l++)
        for (seq *q = (l ? e->waiting : e->running).head; q; q = q->next)
            if (q->lora >= 1 && q->lora <= 64)
                *(l ? &s->lora_waiting : &s->lora_running) |= 1ull << (q->lora - 1);
    s->kv_blocks_total = e->mgr.n_blocks;
    s->kv_blocks_used = e->mgr.n_blocks - e->mgr.n_free;
    s->kv_blocks_cached = e->mgr.n_cached;
    s->kv_usage_perc = 100.0 * s->kv_blocks_used / (double)s->kv_blocks_total;
    s->prefix_cache_queries = e->mgr.stats.prefix_queries;
    s->prefix_cache_hits = e->mgr.stats.prefix_hits;
    int64_t reserved = 0, filled = 0;
    for (seq *q = e->running.head; q; q = q->next) {
        int64_t r = (int64_t)q->kv.n_blocks * e->cfg.block_size;
        reserved += r;
        filled += q->n_computed < r ? q->n_computed : r;
    }
    s->kv_fragmentation_perc = reserved ? 100.0 * (double)(reserved - filled) / (double)reserved : 0;
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

int pgd_engine_step(pgd_engine *e) {
    drain_inbox(e);
    int32_t ns = 0;
    int32_t used = schedule(e, e->b_seqs, &ns);
    while (ns == 0 && e->running.n > 0) {
        /* nothing fits (every running sequence is mid-prefill and the pool is full): free room
         * by preempting the most recent one; a single sequence always fits (admission check) */
        preempt(e, e->running.tail);
        used = schedule(e, e->b_seqs, &ns);
    }
    if (ns == 0) {
        snapshot_stats(e);
        publish(e);
        if (e->notify) e->notify(e->notify_arg);
        return 0;
    }
    if (e->n_step_ev) { /* aborts' FINISH events go out now, not after the forward pass */
        snapshot_stats(e);
        publish(e);
    }

    /* runner: flatten the batch */
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
    PGD_ASSERT(nt == used && nl <= e->max_logits);
    pgd_batch b = {.n_tokens = nt, .tokens = e->b_tokens, .pos = e->b_pos, .seq = e->b_seq,
                   .slot = e->b_slot, .block_tables = e->b_tables, .n_logits = nl,
                   .logit_rows = e->b_rows, .hidden = b_hidden ? e->hidden : NULL,
                   .seq_lora = e->n_loras ? e->b_lora : NULL};
    if (e->device_sampling && nl > 0) plan_device_sampling(e, ns, &b);
    if (e->n_loras) pthread_mutex_lock(&e->lora_mu); /* adapters change between steps only */
    int rc = pgd_model_forward(&e->fwd, &e->kv, &b);
    if (e->n_loras) pthread_mutex_unlock(&e->lora_mu);
    int32_t n_prefill = 0;
    for (int32_t i = 0; i < ns; i++) {
        seq *s = e->b_seqs[i];
        if ((s->sched_n > 1 && !s->n_draft) || s->n_computed < s->n_prompt)
            n_prefill += s->sched_n;
    }

    if (!rc) score_prompts(e, ns);
    /* postprocess, with no lock held: the I/O thread polls meanwhile */
    for (int32_t i = 0; i < ns; i++) {
        seq *s = e->b_seqs[i];
        int32_t n = s->sched_n;
        s->sched_n = 0;
        if (rc) {
            finish_seq(e, s, PGD_FINISH_ERROR, "internal error in the forward pass");
            continue;
        }
        s->n_computed += n;
        if (s->prompt_lp && (s->lp_n || !s->lp_started)) emit_prompt_logprobs(e, s);
        if (s->embed_row >= 0) write_embedding(e, s);
        if (s->logit_row < 0) {
            pgd_kv_commit(&e->mgr, &s->kv, s->tokens, s->n_computed);
            if (s->max_tokens == 0 && s->n_computed == s->n_tokens) /* the prompt only */
                finish_seq(e, s, PGD_FINISH_LENGTH, NULL);
            continue;
        }
        pgd_finish_reason why = advance(e, s);
        if (why)
            finish_seq(e, s, why,
                       why != PGD_FINISH_ERROR ? NULL
                       : s->err_msg            ? s->err_msg
                                               : "no token is left that the constraints allow "
                                                 "and the model scores (allowed_token_ids "
                                                 "outside the structured output's, or "
                                                 "non-finite logits)");
    }
    e->stats.steps++;
    e->stats.last_step_seqs = ns;
    e->stats.last_step_tokens = nt;
    e->stats.prefill_tokens_total += n_prefill;
    snapshot_stats(e);
    publish(e);
    if (e->notify) e->notify(e->notify_arg);
    return nt;
}

bool pgd_engine_has_work(pgd_engine *e) {
    pthread_mutex_lock(&e->in_mu);
    bool w = e->incoming.n > 0 || e->n_aborts > 0;
    pthread_mutex_unlock(&e->in_mu);
    return w || e->waiting.n > 0 || e->running.n > 0;
}

int pgd_engine_poll(pgd_engine *e, pgd_event *out, int max, int timeout_ms) {
    pthread_mutex_lock(&e->out_mu);
    if (e->n_events == 0 && timeout_ms > 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += timeout_ms / 1000;
        ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        while (e->n_events == 0)
            if (pthread_cond_timedwait(&e->out_cv, &e->out_mu, &ts) != 0) break;
    }
    int n = (int)(e->n_events < (size_t)max ? e->n_events : (size_t)max);
    if (n > 0) { /* events is NULL until the first event */
        memcpy(out, e->events, (size_t)n * sizeof *out);
        memmove(e->events, e->events + n, (e->n_events - (size_t)n) * sizeof *e->events);
    }
    e->n_events -= (size_t)n;
    pthread_mutex_unlock(&e->out_mu);
    return n;
}

static void *engine_main(void *arg) {
    pgd_engine *e = arg;
    while (!e->stop_thread) {
        if (!pgd_engine_has_work(e)) {
            pthread_mutex_lock(&e->in_mu);
            while (!e->stop_thread && e->incoming.n == 0 && e->n_aborts == 0)
                pthread_cond_wait(&e->in_cv, &e->in_mu);
            pthread_mutex_unlock(&e->in_mu);
            continue;
        }
        pgd_engine_step(e);
    }
    return NULL;
}

int pgd_engine_start(pgd_engine *e, void (*notify)(void *), void *notify_arg) {
    if (e->thread_running) return PGD_EINVAL;
    e->notify = notify;
    e->notify_arg = notify_arg;
    e->stop_thread = false;
    if (pthread_create(&e->thread, NULL, engine_main, e) != 0) return PGD_ENOMEM;
    e->thread_running = true;
    return PGD_OK;
}

void pgd_engine_stop(pgd_engine *e) {
    if (!e->thread_running) return;
    pthread_mutex_lock(&e->in_mu);
    e->stop_thread = true;
    pthread_cond_broadcast(&e->in_cv);
    pthread_mutex_unlock(&e->in_mu);
    pthread_join(e->thread, NULL);
    e->thread_running = false;
}

void pgd_engine_get_stats(pgd_engine *e, pgd_engine_stats *out) {
    pthread_mutex_lock(&e->out_mu);
    *out = e->stats_pub;
    pthread_mutex_unlock(&e->out_mu);
    pthread_mutex_lock(&e->in_mu);
    out->num_waiting += e->incoming.n;
    pthread_mutex_unlock(&e->in_mu);
}

/* Reference counts equal the table entries that name each block; every running sequence holds
 * exactly the blocks its computed tokens need (nothing left over from rolled-back proposals),
 * every waiting one none. */
static int check_tables(const pgd_kv_mgr *m, const seq_list *running, const seq_list *waiting,
                        bool draft) {
    int64_t refs = 0, entries = 0;
    for (int32_t b = 0; b < m->n_blocks; b++) refs += m->blocks[b].ref;
    const seq_list *lists[2] = {running, waiting};
    for (int l = 0; l < 2; l++)
        for (const seq *s = lists[l]->head; s; s = s->next) {
            const pgd_kv_seq *kv = draft ? &s->dseq.kv : &s->kv;
            int32_t n = draft ? s->dseq.n_computed : s->n_computed;
            int32_t want = l == 1 && !draft ? 0 : (n + m->block_size - 1) / m->block_size;
            if (kv->n_blocks != want) return PGD_EFORMAT;
            if (draft && n > s->n_tokens) return PGD_EFORMAT;
            for (int32_t i = 0; i < kv->n_blocks; i++)
                if (m->blocks[kv->table[i]].ref < 1) return PGD_EFORMAT;
            entries += kv->n_blocks;
        }
    return refs == entries ? PGD_OK : PGD_EFORMAT;
}

int pgd__engine_check(pgd_engine *e) {
    int rc = pgd_kv_check(&e->mgr);
    if (rc) return rc;
    if ((rc = check_tables(&e->mgr, &e->running, &e->waiting, false))) return rc;
    if (e->spec_mode == PGD_SPEC_DRAFT) {
        if ((rc = pgd_kv_check(&e->draft.mgr))) return rc;
        if ((rc = check_tables(&e->draft.mgr, &e->running, &e->waiting, true))) return rc;
        if (e->running.n == 0 && e->waiting.n == 0 && e->draft.mgr.n_free != e->draft.mgr.n_blocks)
            return PGD_EFORMAT;
    }
    if (e->running.n == 0 && e->waiting.n == 0) {
        if (e->mgr.n_free != e->mgr.n_blocks) return PGD_EFORMAT;
        for (int32_t b = 0; b < e->mgr.n_blocks; b++)
            if (e->mgr.blocks[b].ref != 0) return PGD_EFORMAT;
    }
    return PGD_OK;
}
