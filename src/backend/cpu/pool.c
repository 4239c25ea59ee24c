/* Thread pool: workers spin briefly, then sleep on a condition variable between runs, so
 * back-to-back ops (one per matmul) do not each pay a full futex wake-up. */
#include "backend/cpu/pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

#define SPIN_ITERS 20000

struct pgd_pool {
    int n_threads;
    pthread_t *threads;     /* (n_threads - 1) workers */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_uint generation; /* bumped once per run (and once at shutdown) */
    atomic_int n_pending;   /* workers still running the current job */
    atomic_bool stop;
    pgd_pool_fn fn;
    void *ctx;
};

typedef struct worker_arg {
    pgd_pool *pool;
    int ith;
} worker_arg;

static void *worker_main(void *arg) {
    worker_arg wa = *(worker_arg *)arg;
    free(arg);
    pgd_pool *p = wa.pool;
    unsigned seen = 0;
    for (;;) {
        unsigned g;
        int spins = 0;
        while ((g = atomic_load_explicit(&p->generation, memory_order_acquire)) == seen &&
               spins < SPIN_ITERS)
            spins++;
        if (g == seen) {
            pthread_mutex_lock(&p->mu);
            while ((g = atomic_load_explicit(&p->generation, memory_order_acquire)) == seen)
                pthread_cond_wait(&p->cv, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        seen = g;
        if (atomic_load(&p->stop)) return NULL;
        p->fn(p->ctx, wa.ith, p->n_threads);
        atomic_fetch_sub_explicit(&p->n_pending, 1, memory_order_release);
    }
}

int pgd_pool_create(int n_threads, pgd_pool **out, pgd_err *err) {
    *out = NULL;
    if (n_threads < 1) n_threads = 1;
    pgd_pool *p = calloc(1, sizeof *p);
    if (!p) return pgd_err_set(err, PGD_ENOMEM, "thread pool: out of memory");
    p->n_threads = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    atomic_init(&p->generation, 0);
    atomic_init(&p->n_pending, 0);
    atomic_init(&p->stop, false);
    if (n_threads > 1) {
        p->threads = calloc((size_t)n_threads - 1, sizeof *p->threads);
        if (!p->threads) goto fail_mem;
        for (int i = 1; i < n_threads; i++) {
            worker_arg *wa = malloc(sizeof *wa);
            if (!wa) goto fail_mem;
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
    p->ctx = ctx;
    atomic_store_explicit(&p->n_pending, p->n_threads - 1, memory_order_relaxed);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    fn(ctx, 0, p->n_threads);
    while (atomic_load_explicit(&p->n_pending, memory_order_acquire) > 0) sched_yield();
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
