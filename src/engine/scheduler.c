/* The scheduler (scheduler.h): queues, admission under the token budget, prefill chunks,
 * priority and preemption. It reaches KV blocks through kv/ and everything else through its
 * hooks. */
#include <string.h>

#include "engine/scheduler.h"
#include "util/clock.h"
#include "util/status.h"

/* ---- lists ---- */

void pgd_seq_list_push_back(seq_list *l, seq *s) {
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
static void list_enqueue(const pgd_sched_config *c, seq_list *l, seq *s, bool front) {
    if (!c->priority_scheduling) {
        if (front) list_push_front(l, s);
        else pgd_seq_list_push_back(l, s);
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

/* ---- admission ---- */

/* Recompute preemption: drop the sequence's KV and put it back at the head of the queue (in its
 * place, under priority scheduling). */
static void preempt(pgd_sched *sc, seq *s) {
    list_remove(&sc->running, s);
    pgd_kv_release(sc->mgr, &s->kv);
    if (sc->hooks.release) sc->hooks.release(sc->hooks.ctx, s);
    s->n_computed = 0;
    s->n_draft = 0;
    s->sched_n = 0;
    s->state = SEQ_WAITING;
    s->disk_done = false;
    list_enqueue(&sc->cfg, &sc->waiting, s, true);
    if (sc->hooks.pending) sc->hooks.pending(sc->hooks.ctx, 1);
    sc->num_preemptions++;
}

/* Reserves blocks for n more tokens of s; performs a copy-on-write copy if one is needed. */
static bool reserve(pgd_sched *sc, seq *s, int32_t n) {
    pgd_kv_copy cp;
    if (pgd_kv_reserve(sc->mgr, &s->kv, s->n_computed, s->n_computed + n, &cp)) return false;
    if (cp.n && sc->hooks.copy_blocks) sc->hooks.copy_blocks(sc->hooks.ctx, &cp);
    return true;
}

/* Largest n <= want whose blocks fit in the free pool. */
static int32_t fit_tokens(pgd_sched *sc, seq *s, int32_t want) {
    int32_t bs = sc->cfg.block_size;
    int32_t have = s->kv.n_blocks * bs - s->n_computed; /* slots left in reserved blocks */
    if (have < 0) have = 0;
    int64_t can = (int64_t)have + (int64_t)pgd_kv_n_free(sc->mgr) * bs;
    return want < can ? want : (int32_t)can;
}

/* Logits rows a chunk of n tokens from s->n_computed needs: the last token's when the chunk
 * ends the sequence, plus one per prompt position still owing its next token's logprob. */
int32_t pgd_sched_chunk_rows(const seq *s, int32_t n) {
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
    if (pgd_sched_chunk_rows(s, n) <= left) return n;
    int32_t c = s->n_computed, a = c > s->lp_pos ? c : s->lp_pos;
    if (s->prompt_lp && a - c + left < n) n = a - c + left; /* left rows of prompt positions */
    while (n > 0 && pgd_sched_chunk_rows(s, n) > left) n--; /* at most once more: the last row */
    return n;
}

/* Whether s may start from the prefix cache: not while it owes prompt logprobs, whose
 * positions' logits a cache hit would skip. */
static bool may_hit_prefix(const seq *s) { return !s->prompt_lp || s->lp_pos >= s->n_prompt - 1; }

/* Looks a waiting s up in the prefix cache: s->kv takes the blocks it matches, s->n_computed
 * their tokens; stats0 keeps the counters for undo_lookup. */
static int32_t lookup_prefix(pgd_sched *sc, seq *s, int64_t stats0[2]) {
    stats0[0] = sc->mgr->stats.prefix_queries;
    stats0[1] = sc->mgr->stats.prefix_hits;
    s->n_computed =
        may_hit_prefix(s) ? pgd_kv_match_prefix(sc->mgr, &s->kv, s->tokens, s->n_tokens) : 0;
    return s->n_computed;
}

/* Undoes lookup_prefix, counters included: s did not start after all. */
static void undo_lookup(pgd_sched *sc, seq *s, const int64_t stats0[2]) {
    pgd_kv_release(sc->mgr, &s->kv);
    s->n_computed = 0;
    sc->mgr->stats.prefix_queries = stats0[0];
    sc->mgr->stats.prefix_hits = stats0[1];
}

/* Preempts the running sequences of a lower priority than s (a larger value; the tail first)
 * while s's next chunk of up to a whole budget does not fit in the free blocks (or, waiting,
 * s has no sequence slot). */
static void preempt_below(pgd_sched *sc, seq *s, bool waiting) {
    int32_t rem = s->n_tokens - s->n_computed, budget = sc->cfg.max_num_batched_tokens;
    int32_t want = rem < budget ? rem : budget;
    while (sc->running.tail && sc->running.tail != s && sc->running.tail->priority > s->priority &&
           ((waiting && sc->running.n >= sc->cfg.max_num_seqs) || fit_tokens(sc, s, want) < want))
        preempt(sc, sc->running.tail);
}

/* Priority scheduling, before a step is formed: the running sequences still in prefill, best
 * first, and the first waiting request take the room they need from lower priorities. Decodes
 * need no help: one that misses a block preempts the list's tail, the lowest priority. */
static void make_room(pgd_sched *sc) {
    if (!sc->cfg.priority_scheduling) return;
    for (seq *s = sc->running.head; s; s = s->next)
        if (s->n_tokens - s->n_computed > 1) preempt_below(sc, s, false);
    seq *h = sc->waiting.head;
    if (!h || h->loading || (sc->running.tail && sc->running.tail->priority <= h->priority))
        return;
    int64_t stats0[2];
    lookup_prefix(sc, h, stats0);
    preempt_below(sc, h, true);
    undo_lookup(sc, h, stats0);
}

static int32_t schedule(pgd_sched *sc, seq **sched, int32_t *n_sched) {
    int32_t budget = sc->cfg.max_num_batched_tokens, used = 0, ns = 0, rows = 0;
    const int32_t spec_off_at = sc->cfg.spec_disable_by_batch_size;
    make_room(sc);
    const bool spec_step = spec_off_at <= 0 || sc->running.n < spec_off_at;
    /* 1. running decodes, in admission order */
    for (seq *s = sc->running.head, *next; s && used < budget; s = next) {
        next = s->next;
        if (s->n_tokens - s->n_computed != 1) continue;
        /* speculation: the pending token plus k proposals, if their blocks are free (proposals
         * never preempt anyone) */
        int32_t k = s->spec && spec_step && sc->hooks.propose
                        ? sc->hooks.propose(sc->hooks.ctx, s, budget - used - 1)
                        : 0;
        if (k > 0 && !reserve(sc, s, 1 + k)) {
            k = 0;
            if (sc->hooks.unpropose) sc->hooks.unpropose(sc->hooks.ctx, s);
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
        while (!reserve(sc, s, 1)) {
            seq *victim = sc->running.tail;
            if (victim == next) next = next->next; /* never happens before s, but keep next valid */
            preempt(sc, victim);
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
    PGD_ASSERT(rows <= sc->cfg.max_logits);
    /* 2. prefill chunks of running sequences */
    for (seq *s = sc->running.head; s && used < budget; s = s->next) {
        int32_t rem = s->n_tokens - s->n_computed;
        if (rem <= 1 || s->sched_n) continue;
        int32_t n = fit_tokens(sc, s, rem < budget - used ? rem : budget - used);
        n = fit_rows(s, n, sc->cfg.max_logits - rows);
        if (n <= 0 || !reserve(sc, s, n)) continue;
        s->sched_n = n;
        sched[ns++] = s;
        used += n;
        rows += pgd_sched_chunk_rows(s, n);
    }
    /* 3. waiting requests, in order (preempted ones first; by priority under priority
     *    scheduling) */
    bool admit = !sc->cfg.static_batching || sc->running.n == 0 || sc->admitting;
    sc->admitting = false;
    while (admit && sc->waiting.head && used < budget && sc->running.n < sc->cfg.max_num_seqs) {
        seq *s = sc->waiting.head;
        if (s->loading) break; /* its blocks are on their way from disk */
        int64_t stats0[2];
        int32_t hit = lookup_prefix(sc, s, stats0);
        if (!s->disk_done && may_hit_prefix(s) && sc->hooks.disk_lookup &&
            sc->hooks.disk_lookup(sc->hooks.ctx, s)) {
            /* counted when it is admitted, with what the load brought */
            sc->mgr->stats.prefix_queries = stats0[0];
            sc->mgr->stats.prefix_hits = stats0[1];
            break;
        }
        int32_t rem = s->n_tokens - s->n_computed;
        int32_t n = fit_tokens(sc, s, rem < budget - used ? rem : budget - used);
        n = fit_rows(s, n, sc->cfg.max_logits - rows);
        if (n <= 0 || !reserve(sc, s, n)) {
            /* does not fit now: undo the lookup and wait (the head is never skipped) */
            undo_lookup(sc, s, stats0);
            break;
        }
        if (!s->admitted_once) {
            if (sc->hooks.admit) sc->hooks.admit(sc->hooks.ctx, s);
            s->n_cached = hit;
            s->admitted_once = true;
            s->queue_seconds = pgd_now_s() - s->t_submit;
            sc->prompt_tokens_total += s->n_prompt;
        }
        list_remove(&sc->waiting, s);
        if (sc->hooks.pending) sc->hooks.pending(sc->hooks.ctx, -1);
        s->state = SEQ_RUNNING;
        list_enqueue(&sc->cfg, &sc->running, s, false);
        s->sched_n = n;
        sched[ns++] = s;
        used += n;
        rows += pgd_sched_chunk_rows(s, n);
        /* static batching fills its batch over as many steps as the token budget needs */
        sc->admitting = sc->cfg.static_batching && sc->running.n < sc->cfg.max_num_seqs;
    }
    if (!sc->waiting.head) sc->admitting = false;
    *n_sched = ns;
    return used;
}

/* ---- the interface ---- */

void pgd_sched_init(pgd_sched *sc, const pgd_sched_config *c, pgd_kv_mgr *mgr,
                    const pgd_sched_hooks *hooks) {
    memset(sc, 0, sizeof *sc);
    sc->cfg = *c;
    sc->mgr = mgr;
    if (hooks) sc->hooks = *hooks;
}

static void free_list(seq_list *l) {
    for (seq *s = l->head, *n; s; s = n) {
        n = s->next;
        pgd__seq_free(s);
    }
    memset(l, 0, sizeof *l);
}

void pgd_sched_free(pgd_sched *sc) {
    free_list(&sc->waiting);
    free_list(&sc->running);
}

void pgd_sched_add(pgd_sched *sc, seq *s) {
    s->state = SEQ_WAITING;
    list_enqueue(&sc->cfg, &sc->waiting, s, false);
}

seq *pgd_sched_find(pgd_sched *sc, uint64_t id) {
    seq *lists[2] = {sc->waiting.head, sc->running.head};
    for (int l = 0; l < 2; l++)
        for (seq *s = lists[l]; s; s = s->next)
            if (s->id == id) return s;
    return NULL;
}

void pgd_sched_remove(pgd_sched *sc, seq *s) {
    list_remove(s->state == SEQ_RUNNING ? &sc->running : &sc->waiting, s);
    if (s->state == SEQ_WAITING && sc->hooks.pending) sc->hooks.pending(sc->hooks.ctx, -1);
    pgd_kv_release(sc->mgr, &s->kv);
    if (sc->hooks.release) sc->hooks.release(sc->hooks.ctx, s);
}

int32_t pgd_sched_step(pgd_sched *sc, seq **sched, int32_t *n_sched) {
    int32_t used = schedule(sc, sched, n_sched);
    while (*n_sched == 0 && sc->running.n > 0) {
        /* nothing fits (every running sequence is mid-prefill and the pool is full): free room
         * by preempting the most recent one; a single sequence always fits (admission check) */
        preempt(sc, sc->running.tail);
        used = schedule(sc, sched, n_sched);
    }
    return used;
}
