/* The engine's public API (pagoda.h): creation and sizing, submission into the inbox, the
 * step -- schedule (scheduler.c), run (runner.c), postprocess (output.c) -- and its events,
 * built in a step-local buffer and published to the outbox in one short critical section, the
 * engine thread, LoRA slots and stats. engine_impl.h maps the files. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "engine/engine_impl.h"
#include "engine/engine_internal.h"
#include "kv/kv_disk.h"
#include "kv/kv_events.h"
#include "util/clock.h"
#include "util/xalloc.h"
#include "util/env.h"

/* ---- events ---- */

/* Locks out_mu with room in the outbox for extra more events beside those queued and the
 * FINISH slots reserved: PGD_OK, or PGD_ENOMEM (still locked, the outbox as it was). A larger
 * outbox is allocated with the lock released; under it the queued events are copied over and
 * the buffers swapped (rare: the capacity doubles), so a poll never waits on an allocation. */
static int outbox_lock_room(pgd_engine *e, size_t extra) {
    pthread_mutex_lock(&e->out_mu);
    for (;;) {
        size_t need = e->n_events + e->n_fin_reserved + extra, cap = e->cap_events;
        if (need <= cap) return PGD_OK;
        pthread_mutex_unlock(&e->out_mu);
        size_t nc = cap ? cap * 2 : 256;
        if (nc < need) nc = need;
        pgd_event *n = nc <= SIZE_MAX / sizeof *n ? malloc(nc * sizeof *n) : NULL;
        pthread_mutex_lock(&e->out_mu);
        if (!n) return PGD_ENOMEM;
        if (e->cap_events != cap || e->n_events > nc) { /* another thread grew it meanwhile */
            free(n);
            continue;
        }
        if (e->n_events) memcpy(n, e->events, e->n_events * sizeof *n);
        pgd_event *old = e->events;
        e->events = n;
        e->cap_events = nc;
        pthread_mutex_unlock(&e->out_mu);
        free(old);
        pthread_mutex_lock(&e->out_mu);
    }
}

/* Moves this step's events to the outbox in one critical section, with the stats: FINISH events
 * into the slots their requests reserved, token events into the room left (out of memory: the
 * ones that do not fit are dropped; their requests go on). Engine thread. */
static void publish(pgd_engine *e) {
    int32_t n_fin = 0;
    for (int32_t i = 0; i < e->n_step_ev; i++) n_fin += e->step_ev[i].type == PGD_EVENT_FINISH;
    size_t n_tok = (size_t)(e->n_step_ev - n_fin);
    outbox_lock_room(e, n_tok); /* (out of memory: room for fewer tokens) */
    PGD_ASSERT((size_t)n_fin <= e->n_fin_reserved);
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

/* Reserves the outbox slot of a new request's FINISH: 0 or PGD_ENOMEM. Any thread. */
static int reserve_finish(pgd_engine *e) {
    int rc = outbox_lock_room(e, 1);
    if (!rc) e->n_fin_reserved++;
    pthread_mutex_unlock(&e->out_mu);
    return rc;
}

static void unreserve_finish(pgd_engine *e) {
    pthread_mutex_lock(&e->out_mu);
    e->n_fin_reserved--;
    pthread_mutex_unlock(&e->out_mu);
}

/* The next event of this step (its header zeroed); never fails: a full step buffer is
 * published first. Engine thread. */
pgd_event *pgd__step_event(pgd_engine *e) {
    if (e->n_step_ev == e->cap_step_ev) publish(e);
    pgd_event *ev = &e->step_ev[e->n_step_ev++];
    memset(ev, 0, offsetof(pgd_event, text));
    ev->text_len = 0;
    return ev;
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

static int install_lora(pgd_engine *e, pgd_lora *l, int32_t *k, pgd_err *err);

/* ---- the scheduler's hooks ---- */

static void hook_unpropose(void *ctx, seq *s) {
    pgd_engine *e = ctx;
    if (e->spec_mode == PGD_SPEC_DRAFT) pgd_draft_rollback(&e->draft, &s->out->dseq, s->n_tokens);
}

static void hook_release(void *ctx, seq *s) {
    pgd_engine *e = ctx;
    if (e->spec_mode == PGD_SPEC_DRAFT) pgd_draft_seq_release(&e->draft, &s->out->dseq);
}

/* (a grammar starts on the engine thread: it needs the engine's scratch) */
static void hook_admit(void *ctx, seq *s) {
    pgd_engine *e = ctx;
    if (s->cons) pgd_constraint_start(s->cons, e->gr_scratch);
}

static void hook_copy_blocks(void *ctx, const pgd_kv_copy *cp) {
    pgd_engine *e = ctx;
    pgd_kv_cache_copy_block(&e->kv, cp->src, cp->dst, cp->n);
}

static void hook_pending(void *ctx, int32_t delta) {
    pgd_engine *e = ctx;
    pthread_mutex_lock(&e->in_mu);
    e->n_pending += delta;
    pthread_mutex_unlock(&e->in_mu);
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
        return pgd__fail(err, errlen, PGD_EINVAL, "%s", "invalid engine configuration (block size, "
                         "max-num-batched-tokens, max-num-seqs or speculative decoding)");
    if (c->priority_scheduling && c->static_batching)
        return pgd__fail(err, errlen, PGD_EINVAL, "%s", "static batching admits in arrival order: "
                         "it cannot be combined with priority scheduling");
    if (!(c->gpu_memory_utilization >= 0 && c->gpu_memory_utilization <= 1))
        return pgd__fail(err, errlen, PGD_EINVAL, "%s", "gpu_memory_utilization must be in (0, 1]");
    pgd_engine *e = calloc(1, sizeof *e);
    if (!e) return pgd__fail(err, errlen, PGD_ENOMEM, "%s", "out of memory");
    e->cfg = *c;
    e->next_id = 1;
    pthread_mutex_init(&e->in_mu, NULL);
    pthread_mutex_init(&e->lora_mu, NULL);
    pthread_mutex_init(&e->fwd_mu, NULL);
    pthread_mutex_init(&e->out_mu, NULL);
    pthread_cond_init(&e->out_cv, NULL);
    pthread_cond_init(&e->in_cv, NULL);
    pthread_mutex_init(&e->dump_mu, NULL);
    pthread_cond_init(&e->dump_cv, NULL);
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
    pgd_type kdt = (pgd_type)c->kv_dtype, vdt = c->kv_split ? (pgd_type)c->kv_dtype_v : kdt;
    e->max_blocks_per_seq = (e->n_ctx + c->block_size - 1) / c->block_size;
    e->spec_mode = c->speculative;
    e->spec_k = c->num_speculative_tokens ? c->num_speculative_tokens : 5;
    e->ngram_min = c->ngram_min ? c->ngram_min : 1;
    e->ngram_max = c->ngram_max ? c->ngram_max : 4;
    if (e->ngram_max < e->ngram_min) e->ngram_max = e->ngram_min;
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
        e->lora_names = calloc((size_t)slots, sizeof *e->lora_names);
        if (!e->loras || !e->lora_ns || !e->lora_users || !e->lora_retired || !e->lora_names) {
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
        size_t per_block =
            pgd_kv_cache_bytes_per_token2(e->model, kdt, vdt) * (size_t)c->block_size;
        /* (0: rows these types cannot hold, which pgd_kv_cache_init2 refuses by name) */
        n_blocks = per_block ? c->kv_cache_bytes / per_block : 1;
        if (n_blocks < 1) {
            rc = pgd_err_set(&perr, PGD_EINVAL, "KV cache budget of %zu bytes holds no block of "
                             "%d tokens (%zu bytes each)", c->kv_cache_bytes, c->block_size,
                             per_block);
            goto fail_perr;
        }
    }
    if (n_blocks > (size_t)INT32_MAX / (size_t)c->block_size)
        n_blocks = (size_t)INT32_MAX / (size_t)c->block_size;
    if ((rc = pgd_kv_cache_init2(&e->kv, e->model, kdt, vdt, (int32_t)n_blocks, c->block_size,
                                 &perr)))
        goto fail_perr;
    if ((rc = pgd_kv_mgr_init(&e->mgr, (int32_t)n_blocks, c->block_size, !c->no_prefix_caching,
                              &perr)))
        goto fail_perr;
    if (c->kv_events_config) { /* the cache's memory: the host's, or a device's */
        const char *medium = e->model->shards[0].be.ops->mem_info ? "GPU" : "CPU";
        if ((rc = pgd_kv_publisher_new(c->kv_events_config, medium, &e->kv_pub, &perr)) ||
            (e->kv_pub && (rc = pgd_kv_events_enable(&e->mgr, &perr))))
            goto fail_perr;
    }
    if ((rc = pgd__disk_open(e, &perr))) goto fail_perr;
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
    pgd_sched_config sc = {.block_size = c->block_size,
                           .max_num_batched_tokens = c->max_num_batched_tokens,
                           .max_num_seqs = c->max_num_seqs, .max_logits = e->max_logits,
                           .spec_disable_by_batch_size = c->speculative_disable_by_batch_size,
                           .priority_scheduling = c->priority_scheduling,
                           .static_batching = c->static_batching};
    pgd_sched_hooks hooks = {.ctx = e, .propose = pgd__propose, .unpropose = hook_unpropose,
                             .release = hook_release, .admit = hook_admit,
                             .copy_blocks = hook_copy_blocks, .pending = hook_pending,
                             .disk_lookup = pgd__disk_lookup};
    pgd_sched_init(&e->sched, &sc, &e->mgr, &hooks);
    size_t T = (size_t)c->max_num_batched_tokens, S = (size_t)c->max_num_seqs;
    /* a step's events: a token per logits row, a prompt token per row and one more per
     * sequence, a FINISH per sequence (more, from aborts, publish early) */
    e->cap_step_ev = 2 * e->max_logits + 2 * c->max_num_seqs;
    size_t L = (size_t)e->max_logits;
    int32_t nv = e->model->cfg.n_vocab;
    const pgd_slice step[] = { /* the step's scratch, sized once */
        {&e->b_tokens, T * sizeof *e->b_tokens}, {&e->b_pos, T * sizeof *e->b_pos},
        {&e->b_seq, T * sizeof *e->b_seq}, {&e->b_slot, T * sizeof *e->b_slot},
        {&e->b_rows, L * sizeof *e->b_rows}, {&e->b_sample, L * sizeof *e->b_sample},
        {&e->b_sampled, L * sizeof *e->b_sampled}, {&e->lp_rows, L * sizeof *e->lp_rows},
        {&e->lp_todo, L * sizeof *e->lp_todo},
        {&e->hidden, L * (size_t)e->model->cfg.dim * sizeof *e->hidden},
        {&e->b_tables, S * sizeof *e->b_tables}, {&e->b_lora, S * sizeof *e->b_lora},
        {&e->b_seqs, S * sizeof *e->b_seqs},
        {&e->step_ev, (size_t)e->cap_step_ev * sizeof *e->step_ev},
        {&e->eog, (size_t)nv * sizeof *e->eog},
    };
    if (!(e->step_block = pgd_alloc_slices(step, sizeof step / sizeof step[0]))) {
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
    const char *ds = pgd_env(PGD_ENV_DEVICE_SAMPLING);
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

void pgd_engine_free(pgd_engine *e) {
    if (!e) return;
    pgd_engine_stop(e);
    pgd__disk_close(e); /* (writes what is still only in RAM) */
    pgd_sched_free(&e->sched);
    for (seq *s = e->incoming.head, *n; s; s = n) {
        n = s->next;
        pgd__seq_free(s);
    }
    pgd_fwd_free(&e->fwd);
    for (int32_t i = 0; e->loras && i < e->n_loras; i++) pgd_lora_free(e->loras[i]);
    free(e->loras);
    free(e->lora_ns);
    free(e->lora_users);
    free(e->lora_retired);
    for (int32_t i = 0; e->lora_names && i < e->n_loras; i++) free(e->lora_names[i]);
    free(e->lora_names);
    pgd_kv_publisher_free(e->kv_pub);
    free(e->dump_out);
    pthread_mutex_destroy(&e->dump_mu);
    pthread_cond_destroy(&e->dump_cv);
    pthread_mutex_destroy(&e->lora_mu);
    pthread_mutex_destroy(&e->fwd_mu);
    pgd_draft_free(&e->draft);
    pgd_kv_cache_free(&e->kv);
    pgd_kv_mgr_free(&e->mgr);
    pgd_pool_free(e->pool);
    pgd_model_free(e->model);
    free(e->step_block); /* b_*, lp_*, hidden, step_ev, eog */
    pgd_sampler_scratch_free(&e->sample_scratch);
    pgd_json_vocab_free(&e->json_vocab);
    pgd_grammar_scratch_free(e->gr_scratch);
    free(e->json_allow);
    free(e->aborts);
    free(e->events);
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
int32_t pgd_engine_n_vocab(const pgd_engine *e) { return e->model->cfg.n_vocab; }
const char *pgd_engine_model_type(const pgd_engine *e) { return e->model->cfg.model_type; }
const char *pgd_engine_architecture(const pgd_engine *e) { return e->model->cfg.architecture; }
bool pgd_engine_add_bos(const pgd_engine *e) {
    const pgd_model *m = e->model;
    if (!m->tok) return m->cfg.bos_id >= 0 && m->cfg.bos_id < m->cfg.n_vocab;
    return pgd_tokenizer_add_bos(m->tok);
}
bool pgd_engine_has_tokenizer(const pgd_engine *e) { return e->model->tok != NULL; }

/* ---- submission ---- */

int pgd_engine_submit(pgd_engine *e, const pgd_request_params *p, uint64_t *id, char *err,
                      size_t errlen) {
    seq *s;
    int rc = pgd__request_new(e, p, &s, err, errlen);
    if (rc) return rc;
    if (reserve_finish(e)) {
        pgd__seq_free(s);
        return pgd__fail(err, errlen, PGD_ENOMEM, "%s", "out of memory");
    }
    pthread_mutex_lock(&e->in_mu);
    if (e->cfg.max_waiting > 0 && e->n_pending >= e->cfg.max_waiting) {
        pthread_mutex_unlock(&e->in_mu);
        unreserve_finish(e);
        pgd__seq_free(s);
        return pgd__fail(err, errlen, PGD_ERANGE, "%s", "the waiting queue is full");
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
            pgd__seq_free(s);
            return pgd__fail(err, errlen, PGD_EINVAL, "%s", "the LoRA adapter is not loaded");
        }
    }
    s->id = e->next_id++;
    s->t_submit = pgd_now_s();
    *id = s->id;
    e->n_pending++;
    pgd_seq_list_push_back(&e->incoming, s);
    pthread_cond_signal(&e->in_cv);
    pthread_mutex_unlock(&e->in_mu);
    return PGD_OK;
}

void pgd_engine_flush_cache(pgd_engine *e) {
    pthread_mutex_lock(&e->in_mu);
    e->flush_cache = true;
    pthread_cond_signal(&e->in_cv);
    pthread_mutex_unlock(&e->in_mu);
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

/* ---- LoRA slots ---- */

/* Empties slot k (index k - 1) and frees its adapter; fwd_mu and lora_mu held. */
static void lora_slot_free(pgd_engine *e, int32_t k) {
    pgd_err perr;
    pgd_fwd_set_lora(&e->fwd, k + 1, NULL, &perr); /* emptying allocates nothing: cannot fail */
    pgd_lora_free(e->loras[k]);
    e->loras[k] = NULL;
    e->lora_retired[k] = false;
}

/* Frees the retired slots no sequence holds; fwd_mu and lora_mu held. */
static void lora_sweep(pgd_engine *e) {
    __atomic_store_n(&e->lora_gc, false, __ATOMIC_RELAXED);
    for (int32_t k = 0; k < e->n_loras; k++)
        if (e->loras[k] && e->lora_retired[k] && e->lora_users[k] == 0) lora_slot_free(e, k);
}

/* The engine thread, between steps: frees what unloads and finished sequences left. */
static void lora_collect(pgd_engine *e) {
    if (!__atomic_load_n(&e->lora_gc, __ATOMIC_ACQUIRE)) return;
    pthread_mutex_lock(&e->fwd_mu);
    pthread_mutex_lock(&e->lora_mu);
    lora_sweep(e);
    pthread_mutex_unlock(&e->lora_mu);
    pthread_mutex_unlock(&e->fwd_mu);
}

/* Puts adapter l (taken over, freed on failure) into a free slot, *k its number. Waits for the
 * forward pass in progress (a pool thread: never the I/O thread). */
static int install_lora(pgd_engine *e, pgd_lora *l, int32_t *k, pgd_err *err) {
    pthread_mutex_lock(&e->fwd_mu);
    pthread_mutex_lock(&e->lora_mu);
    lora_sweep(e); /* an unloaded slot is free again */
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
    pthread_mutex_unlock(&e->fwd_mu);
    if (rc) pgd_lora_free(l);
    return rc;
}

/* Marks that a retired slot may be free, and wakes the engine thread to collect it. */
static void lora_gc_request(pgd_engine *e) {
    __atomic_store_n(&e->lora_gc, true, __ATOMIC_RELEASE);
    pthread_mutex_lock(&e->in_mu);
    pthread_cond_signal(&e->in_cv);
    pthread_mutex_unlock(&e->in_mu);
}

/* A finished sequence lets go of its adapter; the last one out of an unloaded slot has it freed
 * before the next step. Engine thread. */
void pgd__lora_release(pgd_engine *e, seq *s) {
    if (!s->lora) return;
    pthread_mutex_lock(&e->lora_mu);
    int32_t k = s->lora - 1;
    if (--e->lora_users[k] == 0 && e->lora_retired[k])
        __atomic_store_n(&e->lora_gc, true, __ATOMIC_RELEASE);
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
    pthread_mutex_lock(&e->lora_mu); /* (bookkeeping only: never waits on a forward pass) */
    int32_t k = lora - 1;
    int rc = e->loras[k] && !e->lora_retired[k] ? PGD_OK : PGD_ENOENT;
    bool idle = !rc && e->lora_users[k] == 0;
    if (!rc) e->lora_retired[k] = true; /* no new request takes it; freed once none holds it */
    pthread_mutex_unlock(&e->lora_mu);
    if (idle) lora_gc_request(e);
    return rc;
}

int pgd_engine_set_lora_name(pgd_engine *e, int32_t lora, const char *name) {
    if (lora < 1 || lora > e->n_loras) return PGD_ENOENT;
    char *d = name ? strdup(name) : NULL;
    if (name && !d) return PGD_ENOMEM;
    pthread_mutex_lock(&e->lora_mu);
    free(e->lora_names[lora - 1]);
    e->lora_names[lora - 1] = d;
    pthread_mutex_unlock(&e->lora_mu);
    return PGD_OK;
}

/* ---- KV events and the cache dump ---- */

/* CLOCK_REALTIME ms from now, for pthread_cond_timedwait. */
static struct timespec deadline_in(int ms) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

/* The adapter and name a prefix-cache namespace belongs to (pgd_kv_lora_fn); none once its
 * slot is freed. Engine thread; the name stays valid until the slot's next load or rename. */
static void lora_of_ns(void *arg, uint32_t ns, int64_t *lora_id, const char **lora_name) {
    pgd_engine *e = arg;
    pthread_mutex_lock(&e->lora_mu);
    for (int32_t k = 0; k < e->n_loras; k++)
        if (e->loras[k] && e->lora_ns[k] == ns) {
            *lora_id = k + 1;
            *lora_name = e->lora_names[k];
            break;
        }
    pthread_mutex_unlock(&e->lora_mu);
}

/* Publishes the cache's changes since the last call as one batch. Engine thread. */
static void kv_events_out(pgd_engine *e) {
    if (!e->kv_pub) return;
    pgd_kv_publish(e->kv_pub, &e->mgr.log, e->mgr.block_size, lora_of_ns, e);
    e->mgr.log.lost = 0;
    pgd_kv_events_clear(&e->mgr);
}

/* The registered blocks as JSON (pgd_engine_kv_dump); NULL when out of memory. Hashes are
 * printed as unsigned integers (JSON numbers of any size). Engine thread, between steps. */
static char *kv_dump_json(pgd_engine *e) {
    kv_events_out(e); /* every change so far is in a batch up to seq */
    const pgd_kv_mgr *m = &e->mgr;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return NULL;
    fprintf(f, "{\"seq\":%lld,\"block_size\":%d,\"blocks\":[",
            (long long)(e->kv_pub ? pgd_kv_publisher_last_seq(e->kv_pub) : -1), m->block_size);
    bool first = true;
    for (int32_t b = 0; b < m->n_blocks; b++) {
        const pgd_kv_block *k = &m->blocks[b];
        if (!k->hash) continue;
        int64_t lora_id = 0;
        const char *lora_name = NULL;
        if (k->ns) lora_of_ns(e, k->ns, &lora_id, &lora_name);
        fprintf(f, "%s{\"block_hash\":%llu,\"parent_block_hash\":", first ? "" : ",",
                (unsigned long long)k->hash);
        if (k->parent_hash) fprintf(f, "%llu", (unsigned long long)k->parent_hash);
        else fputs("null", f);
        fputs(",\"token_ids\":[", f);
        for (int32_t t = 0; t < m->block_size; t++)
            fprintf(f, "%s%d", t ? "," : "", m->tokens[(size_t)b * m->block_size + t]);
        fprintf(f, "],\"ns\":%u,\"lora_id\":", k->ns);
        if (lora_id) fprintf(f, "%lld", (long long)lora_id);
        else fputs("null", f);
        fputs(",\"lora_name\":", f);
        if (lora_name) { /* (a served name: letters, digits and punctuation; escaped anyway) */
            fputc('"', f);
            for (const char *c = lora_name; *c; c++)
                if (*c == '"' || *c == '\\') fprintf(f, "\\%c", *c);
                else if ((unsigned char)*c < 0x20) fprintf(f, "\\u%04x", *c);
                else fputc(*c, f);
            fputc('"', f);
        } else {
            fputs("null", f);
        }
        fprintf(f, ",\"ref\":%d}", k->ref);
        first = false;
    }
    fputs("]}", f);
    if (fclose(f)) {
        free(buf);
        return NULL;
    }
    return buf;
}

/* Answers a pending pgd_engine_kv_dump. Engine thread. */
static void kv_dump_serve(pgd_engine *e) {
    pthread_mutex_lock(&e->in_mu);
    bool want = e->dump_req != e->dump_done;
    pthread_mutex_unlock(&e->in_mu);
    if (!want) return;
    char *json = kv_dump_json(e);
    pthread_mutex_lock(&e->in_mu);
    free(e->dump_out);
    e->dump_out = json;
    e->dump_done = e->dump_req;
    pthread_cond_broadcast(&e->dump_cv);
    pthread_mutex_unlock(&e->in_mu);
}

int pgd_engine_kv_dump(pgd_engine *e, char **json, int timeout_ms) {
    *json = NULL;
    if (!e->thread_running) return PGD_EAGAIN;
    pthread_mutex_lock(&e->dump_mu); /* one request at a time */
    pthread_mutex_lock(&e->in_mu);
    uint64_t want = ++e->dump_req;
    pthread_cond_signal(&e->in_cv);
    struct timespec ts = deadline_in(timeout_ms);
    while (e->dump_done < want)
        if (pthread_cond_timedwait(&e->dump_cv, &e->in_mu, &ts) != 0) break;
    int rc = PGD_EAGAIN;
    if (e->dump_done >= want) {
        *json = e->dump_out;
        e->dump_out = NULL;
        rc = *json ? PGD_OK : PGD_ENOMEM;
    }
    pthread_mutex_unlock(&e->in_mu);
    pthread_mutex_unlock(&e->dump_mu);
    return rc;
}

/* ---- the step ---- */

static void drain_inbox(pgd_engine *e) {
    pthread_mutex_lock(&e->in_mu);
    seq_list in = e->incoming;
    memset(&e->incoming, 0, sizeof e->incoming);
    size_t na = e->n_aborts;
    uint64_t small[64], *ab = na <= 64 ? small : malloc(na * sizeof *ab);
    if (ab && na) memcpy(ab, e->aborts, na * sizeof *ab); /* aborts: NULL before the first */
    else na = 0; /* out of memory: aborts retried next step */
    e->n_aborts -= na;
    bool flush = e->flush_cache;
    e->flush_cache = false;
    pthread_mutex_unlock(&e->in_mu);
    if (flush) pgd_kv_drop_cached(&e->mgr); /* (blocks in use keep their hashes) */
    kv_dump_serve(e);
    for (seq *s = in.head, *n; s; s = n) {
        n = s->next;
        pgd_sched_add(&e->sched, s);
    }
    for (size_t i = 0; i < na; i++) {
        seq *s = pgd_sched_find(&e->sched, ab[i]);
        if (s) pgd__finish(e, s, PGD_FINISH_ABORT, NULL);
    }
    if (ab != small) free(ab);
}

/* Brings the engine thread's counters up to date (publish copies them out); O(running
 * sequences), with no lock held. */
static void snapshot_stats(pgd_engine *e) {
    pgd_engine_stats *s = &e->stats;
    s->num_running = e->sched.running.n;
    s->num_preemptions = e->sched.num_preemptions;
    s->prompt_tokens_total = e->sched.prompt_tokens_total;
    s->num_waiting = e->sched.waiting.n;
    s->lora_running = s->lora_waiting = 0;
    for (int l = 0; e->n_loras && l < 2; l++)
        for (seq *q = (l ? e->sched.waiting : e->sched.running).head; q; q = q->next)
            if (q->lora >= 1 && q->lora <= 64)
                *(l ? &s->lora_waiting : &s->lora_running) |= 1ull << (q->lora - 1);
    s->kv_blocks_total = e->mgr.n_blocks;
    s->kv_blocks_used = e->mgr.n_blocks - e->mgr.n_free;
    s->kv_blocks_cached = e->mgr.n_cached;
    s->kv_usage_perc = 100.0 * s->kv_blocks_used / (double)s->kv_blocks_total;
    s->prefix_cache_queries = e->mgr.stats.prefix_queries;
    s->prefix_cache_hits = e->mgr.stats.prefix_hits;
    if (e->kv_pub) {
        pgd_kv_pub_stats ks;
        pgd_kv_publisher_stats(e->kv_pub, &ks);
        s->kv_events_batches = ks.batches;
        s->kv_events_overflow = ks.overflow;
        s->kv_events_lost = ks.lost;
    }
    s->kv_disk_writes_dropped = e->mgr.spill.lost; /* (pgd_engine_get_stats adds the store's) */
    int64_t reserved = 0, filled = 0;
    for (seq *q = e->sched.running.head; q; q = q->next) {
        int64_t r = (int64_t)q->kv.n_blocks * e->cfg.block_size;
        reserved += r;
        filled += q->n_computed < r ? q->n_computed : r;
    }
    s->kv_fragmentation_perc =
        reserved ? 100.0 * (double)(reserved - filled) / (double)reserved : 0;
}

int pgd_engine_step(pgd_engine *e) {
    lora_collect(e);
    drain_inbox(e);
    pgd__disk_pump(e); /* a finished load's blocks are in the cache before admission */
    int32_t ns = 0;
    int32_t used = pgd_sched_step(&e->sched, e->b_seqs, &ns); /* schedule */
    if (ns == 0 || e->n_step_ev) { /* aborts' FINISH events go out now, not after a forward */
        bool any = e->n_step_ev > 0;
        kv_events_out(e);
        snapshot_stats(e);
        publish(e);
        if (any && e->notify) e->notify(e->notify_arg);
        if (ns == 0) return 0;
    }
    int32_t nt = 0;
    int rc = pgd__run(e, ns, &nt); /* run */
    PGD_ASSERT(nt == used);
    int32_t n_prefill = 0;
    for (int32_t i = 0; i < ns; i++) {
        seq *s = e->b_seqs[i];
        if ((s->sched_n > 1 && !s->n_draft) || s->n_computed < s->n_prompt)
            n_prefill += s->sched_n;
    }
    if (!rc) pgd__score_prompts(e, ns);
    pgd__postprocess(e, ns, rc); /* postprocess, with no lock held: the I/O thread polls */
    e->stats.steps++;
    e->stats.last_step_seqs = ns;
    e->stats.last_step_tokens = nt;
    e->stats.prefill_tokens_total += n_prefill;
    pgd__disk_pump(e); /* this step's new blocks start for the disk */
    kv_events_out(e);
    snapshot_stats(e);
    publish(e);
    if (e->notify) e->notify(e->notify_arg);
    return nt;
}

bool pgd_engine_has_work(pgd_engine *e) {
    pthread_mutex_lock(&e->in_mu);
    bool w = e->incoming.n > 0 || e->n_aborts > 0 || e->flush_cache || e->dump_req != e->dump_done;
    pthread_mutex_unlock(&e->in_mu);
    return w || e->sched.waiting.n > 0 || e->sched.running.n > 0;
}

int pgd_engine_poll(pgd_engine *e, pgd_event *out, int max, int timeout_ms) {
    pthread_mutex_lock(&e->out_mu);
    if (e->n_events == 0 && timeout_ms > 0) {
        struct timespec ts = deadline_in(timeout_ms);
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
    prctl(PR_SET_NAME, "pgd-engine"); /* (top -H; the server's fault-injection test) */
    while (!e->stop_thread) {
        lora_collect(e);
        pgd__disk_pump(e);
        /* (a request waiting on a disk load is no work until the disk thread wakes us) */
        if (!pgd_engine_has_work(e) || pgd__disk_stalled(e)) {
            pthread_mutex_lock(&e->in_mu);
            while (!e->stop_thread && e->incoming.n == 0 && e->n_aborts == 0 && !e->flush_cache &&
                   e->dump_req == e->dump_done && !__atomic_load_n(&e->lora_gc, __ATOMIC_ACQUIRE) &&
                   !e->disk_wake)
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
    if (e->disk) { /* the store's counters as they are now (its writes go on between steps) */
        pgd_kv_disk_stats ds;
        pgd_kv_disk_get_stats(e->disk, &ds);
        out->kv_disk = true;
        out->kv_disk_hits = ds.hits;
        out->kv_disk_misses = ds.misses;
        out->kv_disk_bytes_read = ds.bytes_read;
        out->kv_disk_bytes_written = ds.bytes_written;
        out->kv_disk_evictions = ds.evictions;
        out->kv_disk_corrupt = ds.corrupt;
        out->kv_disk_write_errors = ds.write_errors;
        out->kv_disk_writes_dropped += ds.writes_dropped;
        out->kv_disk_entries = ds.entries;
        out->kv_disk_bytes = ds.bytes;
    }
}

/* Reference counts equal the table entries that name each block; every running sequence holds
 * exactly the blocks its computed tokens need (nothing left over from rolled-back proposals),
 * every waiting one none (but one loading from disk: its blocks; the load holds its own). */
static int check_tables(const pgd_kv_mgr *m, const seq_list *running, const seq_list *waiting,
                        bool draft, int64_t extra) {
    int64_t refs = 0, entries = 0;
    for (int32_t b = 0; b < m->n_blocks; b++) refs += m->blocks[b].ref;
    const seq_list *lists[2] = {running, waiting};
    for (int l = 0; l < 2; l++)
        for (const seq *s = lists[l]->head; s; s = s->next) {
            const pgd_kv_seq *kv = draft ? &s->out->dseq.kv : &s->kv;
            int32_t n = draft ? s->out->dseq.n_computed : s->n_computed;
            int32_t want = l == 1 && !draft ? (s->loading ? kv->n_blocks : 0)
                                            : (n + m->block_size - 1) / m->block_size;
            if (kv->n_blocks != want) return PGD_EFORMAT;
            if (draft && n > s->n_tokens) return PGD_EFORMAT;
            for (int32_t i = 0; i < kv->n_blocks; i++)
                if (m->blocks[kv->table[i]].ref < 1) return PGD_EFORMAT;
            entries += kv->n_blocks;
        }
    return refs == entries + (draft ? 0 : extra) ? PGD_OK : PGD_EFORMAT;
}

int pgd__engine_check(pgd_engine *e) {
    int rc = pgd_kv_check(&e->mgr);
    if (rc) return rc;
    if ((rc = check_tables(&e->mgr, &e->sched.running, &e->sched.waiting, false, e->dl_n)))
        return rc;
    if (e->spec_mode == PGD_SPEC_DRAFT) {
        if ((rc = pgd_kv_check(&e->draft.mgr))) return rc;
        if ((rc = check_tables(&e->draft.mgr, &e->sched.running, &e->sched.waiting, true, 0)))
            return rc;
        if (e->sched.running.n == 0 && e->sched.waiting.n == 0 &&
            e->draft.mgr.n_free != e->draft.mgr.n_blocks)
            return PGD_EFORMAT;
    }
    if (e->sched.running.n == 0 && e->sched.waiting.n == 0) {
        if (e->mgr.n_free != e->mgr.n_blocks) return PGD_EFORMAT;
        for (int32_t b = 0; b < e->mgr.n_blocks; b++)
            if (e->mgr.blocks[b].ref != 0) return PGD_EFORMAT;
    }
    return PGD_OK;
}

void pgd__engine_spec_always_accept(pgd_engine *e, bool on) { e->spec_broken = on; }
