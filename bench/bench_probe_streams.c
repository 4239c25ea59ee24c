/* Read-bandwidth probe variants (not a test): T threads (pinned to CPUs 0..T-1) each read their
 * half of a 1 GiB buffer in transparent huge pages as S concurrent sequential streams, either
 * 1/S of the part apart (BL = 0: the probe `pagoda bench` ran before 2026-11-30) or in blocks of
 * S x BL cache lines with the streams BL lines apart (BL > 0), optionally prefetching each stream
 * PF lines ahead. Best of REPS passes (each after a warm-up pass), GB/s. It picked the probe of
 * src/cli/bench.c (bw_task); figures in bench/RESULTS.md.
 *   gcc -O2 -mavx2 -mfma -o /tmp/bench_probe_streams bench/bench_probe_streams.c -lpthread
 *   /tmp/bench_probe_streams T S PF REPS [BL] */
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define MAX_T 16
#define MAX_S 16

typedef struct probe {
    const float *buf;
    size_t lines; /* 64-byte lines in buf */
    int n_threads, streams, pf, bl;
    pthread_barrier_t bar;
    float sink[MAX_T];
} probe;

typedef struct worker {
    probe *p;
    int ith;
} worker;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Line q of the part: adds its two halves to s and prefetches pf lines ahead. */
static inline __m256 read_line(const float *q, int pf, __m256 s) {
    if (pf) _mm_prefetch((const char *)(q + 16 * pf), _MM_HINT_T0);
    return _mm256_add_ps(_mm256_add_ps(s, _mm256_load_ps(q)), _mm256_load_ps(q + 8));
}

static void pass(probe *p, int ith) {
    const size_t per = p->lines / (size_t)p->n_threads, lo = (size_t)ith * per;
    const int S = p->streams;
    __m256 s[MAX_S];
    for (int k = 0; k < MAX_S; k++) s[k] = _mm256_setzero_ps();
    if (p->bl) {
        const size_t bl = (size_t)p->bl, n_blk = per / ((size_t)S * bl);
        for (size_t b = 0; b < n_blk; b++) {
            const float *blk = p->buf + (lo + b * (size_t)S * bl) * 16;
            for (size_t i = 0; i < bl; i++)
                for (int k = 0; k < S; k++)
                    s[k] = read_line(blk + ((size_t)k * bl + i) * 16, p->pf, s[k]);
        }
    } else {
        const size_t len = per / (size_t)S;
        for (size_t i = 0; i < len; i++)
            for (int k = 0; k < S; k++)
                s[k] = read_line(p->buf + (lo + (size_t)k * len + i) * 16, p->pf, s[k]);
    }
    for (int k = 1; k < S; k++) s[0] = _mm256_add_ps(s[0], s[k]);
    float out[8];
    _mm256_storeu_ps(out, s[0]);
    p->sink[ith] = out[0];
}

/* Warm-up pass, then the timed pass between the main thread's two barrier waits. */
static void *run(void *arg) {
    worker *w = arg;
    cpu_set_t cs;
    CPU_ZERO(&cs);
    CPU_SET(w->ith, &cs);
    (void)pthread_setaffinity_np(pthread_self(), sizeof cs, &cs); /* a hint */
    for (int rep = 0; rep < 2; rep++) {
        pthread_barrier_wait(&w->p->bar);
        pass(w->p, w->ith);
        pthread_barrier_wait(&w->p->bar);
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: bench_probe_streams T S PF REPS [BL]\n");
        return 2;
    }
    probe p = {.n_threads = atoi(argv[1]), .streams = atoi(argv[2]), .pf = atoi(argv[3]),
               .bl = argc > 5 ? atoi(argv[5]) : 0};
    const int reps = atoi(argv[4]);
    if (p.n_threads < 1 || p.n_threads > MAX_T || p.streams < 1 || p.streams > MAX_S ||
        p.pf < 0 || p.bl < 0 || reps < 1) {
        fprintf(stderr, "bench_probe_streams: 1 <= T <= %d, 1 <= S <= %d, PF, BL >= 0\n", MAX_T,
                MAX_S);
        return 2;
    }
    const size_t bytes = (size_t)1 << 30;
    float *buf = aligned_alloc((size_t)2 << 20, bytes);
    if (!buf) {
        fprintf(stderr, "bench_probe_streams: out of memory\n");
        return 1;
    }
    (void)madvise(buf, bytes, MADV_HUGEPAGE); /* a hint; ignored where THP is off */
    memset(buf, 0, bytes);
    p.buf = buf;
    p.lines = bytes / 64;
    double best = 0;
    for (int r = 0; r < reps; r++) {
        pthread_t th[MAX_T];
        worker w[MAX_T];
        if (pthread_barrier_init(&p.bar, NULL, (unsigned)p.n_threads + 1) != 0) return 1;
        for (int i = 0; i < p.n_threads; i++) {
            w[i] = (worker){&p, i};
            if (pthread_create(&th[i], NULL, run, &w[i]) != 0) {
                fprintf(stderr, "bench_probe_streams: pthread_create failed\n");
                return 1;
            }
        }
        pthread_barrier_wait(&p.bar); /* warm-up pass */
        pthread_barrier_wait(&p.bar);
        pthread_barrier_wait(&p.bar);
        double t = now_s();
        pthread_barrier_wait(&p.bar);
        t = now_s() - t;
        for (int i = 0; i < p.n_threads; i++) pthread_join(th[i], NULL);
        pthread_barrier_destroy(&p.bar);
        if ((double)bytes / t / 1e9 > best) best = (double)bytes / t / 1e9;
    }
    printf("T=%d S=%d PF=%d BL=%d: best %.2f GB/s (sum %g)\n", p.n_threads, p.streams, p.pf, p.bl,
           best, (double)p.sink[0]);
    free(buf);
    return 0;
}
