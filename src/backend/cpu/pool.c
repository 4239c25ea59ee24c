/* Thread pool: workers pinned one per CPU spin (with pause) on a generation counter between
 * runs, and sleep on a condition variable only after a few milliseconds idle, so the ~240 ops of
 * one decode step each cost an atomic store and a cache-line transfer, not a futex wake-up.
 * run_chunks hands out chunks dynamically and never waits for a worker that has not joined, so
 * a worker descheduled by another process (a shared machine) delays no one. */
#include "backend/cpu/pool.h"
#include "util/env.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

#define SPIN_ITERS (1 << 17) /* idle pauses before sleeping (a few ms) */
#define WAIT_SPINS (1 << 12) /* pauses the caller waits for stragglers before yielding */
#define YIELD_EVERY 256      /* idle pauses between sched_yield calls */

struct pgd_pool {
    int n_threads;
    pthread_t *threads;     /* (n_threads - 1) workers */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* Written by the caller, read by every worker: one line; the counters each get their own. */
    _Alignas(64) atomic_uint generation; /* bumped once per run (and once at shutdown) */
    atomic_bool stop;
    pgd_pool_fn fn;             /* run: every thread calls fn(ctx, ith, nth) */
    pgd_pool_chunk_fn chunk_fn; /* run_chunks: chunks claimed one at a time, or NULL */
    void *ctx;
    long n_chunks;
    _Alignas(64) atomic_long next_chunk;
    _Alignas(64) atomic_int n_pending;   /* run: workers still running the current job */
    _Alignas(64) atomic_int n_active;    /* run_chunks: workers inside the current job */
    _Alignas(64) atomic_uint closed;     /* run_chunks: the last generation closed to joiners */
    _Alignas(64) atomic_int n_sleeping;  /* workers in (or entering) pthread_cond_wait */
};

typedef struct worker_arg {
    pgd_pool *pool;
    int ith;
} worker_arg;

/* Pins the calling thread to the ith CPU of the process's affinity mask; failure is harmless
 * (containers may forbid it) and leaves the thread unpinned. */
static void pin_to_cpu(int ith) {
#ifdef __linux__
    const char *env = pgd_env(PGD_ENV_PIN);
    if (env && env[0] == '0') return;
    cpu_set_t allowed, one;
    if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return;
    int n = CPU_COUNT(&allowed);
    if (n <= 1) return;
    int want = ith % n, seen = 0;
    for (int c = 0; c < CPU_SETSIZE; c++) {
        if (!CPU_ISSET(c, &allowed)) continue;
        if (seen++ == want) {
            CPU_ZERO(&one);
            CPU_SET(c, &one);
            (void)pthread_setaffinity_np(pthread_self(), sizeof one, &one);
            return;
        }
    }
#else
    (void)ith;
#endif
}

static void *worker_main(void *arg) {
    worker_arg wa = *(worker_arg *)arg;
    free(arg);
    pgd_pool *p = wa.pool;
    pin_to_cpu(wa.ith);
    unsigned seen = 0;
    for (;;) {
        unsigned g;
        int spins = 0;
        while ((g = atomic_load_explicit(&p->generation, memory_order_acquire)) == seen &&
               spins < SPIN_ITERS) {
            cpu_relax();
            /* Let a thread sharing this CPU (the caller, on an oversubscribed machine) run. */
            if (++spins % YIELD_EVERY == 0) sched_yield();
        }
        if (g == seen) {
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->n_sleeping, 1);
            while ((g = atomic_load(&p->generation)) == seen) pthread_cond_wait(&p->cv, &p->mu);
            atomic_fetch_sub(&p->n_sleeping, 1);
            pthread_mutex_unlock(&p->mu);
        }
        seen = g;
        if (atomic_load_explicit(&p->stop, memory_order_relaxed)) return NULL;
        /* Join the job only while it is open: the caller may have finished every chunk of a
         * chunked job (and moved on) while this worker was descheduled. A plain job is never
         * closed before every worker has run it. Nothing of the job is read before the check. */
        atomic_fetch_add(&p->n_active, 1);
        if (atomic_load(&p->generation) == g && atomic_load(&p->closed) != g) {
            if (!p->chunk_fn) {
                p->fn(p->ctx, wa.ith, p->n_threads);
                atomic_fetch_sub_explicit(&p->n_pending, 1, memory_order_release);
            } else {
                pgd_pool_chunk_fn cf = p->chunk_fn;
                void *ctx = p->ctx;
                long n = p->n_chunks, c;
                while ((c = atomic_fetch_add_explicit(&p->next_chunk, 1, memory_order_relaxed)) <
                       n)
                    cf(ctx, c, wa.ith);
            }
        }
        atomic_fetch_sub_explicit(&p->n_active, 1, memory_order_release);
    }
}

int pgd_pool_create(int n_threads, pgd_pool **out, pgd_err *err) {
    *out = NULL;
    if (n_threads < 1) n_threads = 1;
    pgd_pool *p = aligned_alloc(64, (sizeof *p + 63) / 64 * 64);
    if (!p) return pgd_err_set(err, PGD_ENOMEM, "thread pool: out of memory");
    *p = (pgd_pool){.n_threads = n_threads};
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    atomic_init(&p->generation, 0);
    atomic_init(&p->n_pending, 0);
    atomic_init(&p->n_sleeping, 0);
    atomic_init(&p->stop, false);
    if (n_threads > 1) {
        p->threads = calloc((size_t)n_threads - 1, sizeof *p->threads);
        if (!p->threads) goto fail_mem;
        for (int i = 1; i < n_threads; i++) {
            worker_arg *wa = malloc(sizeof *wa);
            if (!wa) {
                p->n_threads = i;
                goto fail_mem;
            }
            wa->pool = p;
            wa->ith = i;
            if (pthread_create(&p->threads[i - 1], NULL, worker_main, wa) != 0) {
                free(wa);
                p->n_threads = i; /* only i-1 workers exist; free() joins those */
                pgd_pool_free(p);
                return pgd_err_set(err, PGD_ENOMEM, "thread pool: cannot create thread %d", i);
            }
        }
    }
    *out = p;
    return PGD_OK;
fail_mem:
    pgd_pool_free(p);
    return pgd_err_set(err, PGD_ENOMEM, "thread pool: out of memory");
}

void pgd_pool_run(pgd_pool *p, pgd_pool_fn fn, void *ctx) {
    if (p->n_threads == 1) {
        fn(ctx, 0, 1);
        return;
    }
    p->fn = fn;
    p->chunk_fn = NULL;
    p->ctx = ctx;
    atomic_store_explicit(&p->n_pending, p->n_threads - 1, memory_order_relaxed);
    /* seq_cst pairs with the sleeper's n_sleeping increment: either we see it and wake it, or
     * it sees the new generation before waiting. */
    atomic_fetch_add(&p->generation, 1);
    if (atomic_load(&p->n_sleeping) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    fn(ctx, 0, p->n_threads);
    int spins = 0;
    while (atomic_load_explicit(&p->n_pending, memory_order_acquire) > 0) {
        if (++spins < WAIT_SPINS) cpu_relax();
        else sched_yield(); /* a worker was descheduled (oversubscribed machine) */
    }
}

void pgd_pool_run_chunks(pgd_pool *p, pgd_pool_chunk_fn fn, void *ctx, long n_chunks) {
    if (p->n_threads == 1 || n_chunks <= 1) {
        for (long c = 0; c < n_chunks; c++) fn(ctx, c, 0);
        return;
    }
    p->chunk_fn = fn;
    p->ctx = ctx;
    p->n_chunks = n_chunks;
    atomic_store_explicit(&p->next_chunk, 0, memory_order_relaxed);
    unsigned g = atomic_fetch_add(&p->generation, 1) + 1;
    if (atomic_load(&p->n_sleeping) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    long c;
    while ((c = atomic_fetch_add_explicit(&p->next_chunk, 1, memory_order_relaxed)) < n_chunks)
        fn(ctx, c, 0);
    /* Every chunk is claimed. Close the job (seq_cst, pairs with the joiner's n_active
     * increment) and wait only for workers that joined it: one still asleep or descheduled is
     * not waited for. */
    atomic_store(&p->closed, g);
    int spins = 0;
    while (atomic_load(&p->n_active) > 0) {
        if (++spins < WAIT_SPINS) cpu_relax();
        else sched_yield();
    }
}

int pgd_pool_n_threads(const pgd_pool *p) { return p->n_threads; }

void pgd_pool_free(pgd_pool *p) {
    if (!p) return;
    if (p->threads) {
        pthread_mutex_lock(&p->mu);
        atomic_store(&p->stop, true);
        atomic_fetch_add(&p->generation, 1);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
        for (int i = 1; i < p->n_threads; i++) pthread_join(p->threads[i - 1], NULL);
        free(p->threads);
    }
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p);
}
