/* Prometheus metrics with vLLM's names under the `pagoda:` prefix. Counters and histograms are
 * updated on the I/O thread only; engine gauges are read from pgd_engine_get_stats. */
#ifndef PGD_SERVER_METRICS_H
#define PGD_SERVER_METRICS_H

#include <stdbool.h>
#include <stdint.h>

#include "pagoda/pagoda.h"

typedef enum { PGD_H_TTFT, PGD_H_ITL, PGD_H_E2E, PGD_H_QUEUE, PGD_H_COUNT } pgd_histogram_id;

#define PGD_H_MAX_BUCKETS 24

typedef struct pgd_histogram {
    const char *name, *help;
    int n_buckets;
    const double *bounds;          /* (n_buckets) upper bounds */
    uint64_t counts[PGD_H_MAX_BUCKETS + 1]; /* last: +Inf */
    double sum;
    uint64_t count;
} pgd_histogram;

typedef struct pgd_metrics {
    pgd_histogram h[PGD_H_COUNT];
    uint64_t finished_stop, finished_length, finished_abort;
    int n_spec_positions;          /* num_speculative_tokens, or 0 when speculation is off */
} pgd_metrics;

/* n_spec_positions: the per-position acceptance series exported (the configured
 * num_speculative_tokens); 0 when speculative decoding is off, which leaves the spec_decode_*
 * counters out altogether, as vLLM does. */
void pgd_metrics_init(pgd_metrics *m, int n_spec_positions);
void pgd_metrics_free(pgd_metrics *m);
void pgd_metrics_observe(pgd_metrics *m, pgd_histogram_id h, double seconds);
void pgd_metrics_count_finish(pgd_metrics *m, const char *reason, bool aborted);
/* The text exposition (malloc'd) with the engine's gauges from st (NULL while loading: zeros);
 * with LoRA adapters (n_loras > 0, their names), vLLM's lora_requests_info too. */
char *pgd_metrics_render(const pgd_metrics *m, const pgd_engine_stats *st, const char *model,
                         const char *const *lora_names, int n_loras);

#endif
