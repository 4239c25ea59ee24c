/* Prometheus metrics with vLLM's names under the `pagoda:` prefix (or `vllm:` itself, for routers
 * that hard-code vLLM's names: --metrics-prefix). Counters and histograms are updated on the I/O
 * thread only; engine gauges are read from pgd_engine_get_stats. */
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

/* Why a connection or request was refused before it reached the API (http_rejected_total) */
typedef enum {
    PGD_REJ_MALFORMED,      /* an ill-formed request head (400) */
    PGD_REJ_SMUGGLING,      /* Content-Length with Transfer-Encoding, or lengths that disagree */
    PGD_REJ_CODING,         /* a transfer coding other than chunked (501) */
    PGD_REJ_VERSION,        /* not HTTP/1.x (505) */
    PGD_REJ_TOO_LARGE,      /* a head past --max-header-bytes (431), a declared body past 413 */
    PGD_REJ_HEAD_TIMEOUT,   /* no complete head within --request-head-timeout */
    PGD_REJ_BODY_TIMEOUT,   /* a body slower than --request-body-timeout / --request-body-min-rate */
    PGD_REJ_PER_CLIENT,     /* past --max-connections-per-client */
    PGD_REJ_EVICTED,        /* the oldest waiting head, closed to admit a new client */
    PGD_REJ_OVERSIZED,      /* a chat past --max-messages or --max-prompt-bytes */
    PGD_REJ_COUNT
} pgd_reject_reason;

typedef struct pgd_metrics {
    uint64_t http_rejected[PGD_REJ_COUNT];
    pgd_histogram h[PGD_H_COUNT];
    uint64_t finished_stop, finished_length, finished_abort;
    int n_spec_positions;          /* num_speculative_tokens, or 0 when speculation is off */
    /* the KV cache's configuration, for vLLM's cache_config_info (block_size 0: not exported) */
    int block_size;
    const char *cache_dtype;       /* (borrowed) "f32", "f16", "bf16" */
    bool prefix_caching;
    const char *prefix;            /* (borrowed) every name's prefix: "pagoda" (NULL) or "vllm" */
} pgd_metrics;

/* n_spec_positions: the per-position acceptance series exported (the configured
 * num_speculative_tokens); 0 when speculative decoding is off, which leaves the spec_decode_*
 * counters out altogether, as vLLM does. */
void pgd_metrics_init(pgd_metrics *m, int n_spec_positions);
void pgd_metrics_free(pgd_metrics *m);
void pgd_metrics_observe(pgd_metrics *m, pgd_histogram_id h, double seconds);
void pgd_metrics_count_reject(pgd_metrics *m, pgd_reject_reason why);
void pgd_metrics_count_finish(pgd_metrics *m, const char *reason, bool aborted);
/* The text exposition (malloc'd) with the engine's gauges from st (NULL while loading: zeros);
 * with LoRA adapters (n_loras > 0, their names), vLLM's lora_requests_info too; once the model
 * is loaded, vLLM's cache_config_info (block_size, num_gpu_blocks, ...: the llm-d endpoint
 * picker reads it). */
char *pgd_metrics_render(const pgd_metrics *m, const pgd_engine_stats *st, const char *model,
                         const char *const *lora_names, int n_loras);

#endif
