/* Prometheus text exposition format 0.0.4. */
#include "server/metrics.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const double ttft_b[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
                                0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80};
static const double itl_b[] = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
                               1, 2.5, 5, 7.5, 10, 20, 40, 80};
static const double e2e_b[] = {0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60,
                               120, 240, 480, 960, 1920, 7680};

void pgd_metrics_init(pgd_metrics *m, int n_spec_positions) {
    memset(m, 0, sizeof *m);
    m->n_spec_positions = n_spec_positions < 0                     ? 0
                          : n_spec_positions > PGD_SPEC_MAX_TOKENS ? PGD_SPEC_MAX_TOKENS
                                                                   : n_spec_positions;
    struct { const char *n, *h; const double *b; int nb; } defs[PGD_H_COUNT] = {
        {"time_to_first_token_seconds", "Time to first token in seconds.", ttft_b,
         (int)(sizeof ttft_b / sizeof *ttft_b)},
        {"inter_token_latency_seconds", "Time between successive output tokens in seconds.",
         itl_b, (int)(sizeof itl_b / sizeof *itl_b)},
        {"e2e_request_latency_seconds", "End-to-end request latency in seconds.", e2e_b,
         (int)(sizeof e2e_b / sizeof *e2e_b)},
        {"request_queue_time_seconds", "Time from submission to the engine to the first token "
         "in seconds (an upper bound of the queue time: it includes the prefill).", e2e_b,
         (int)(sizeof e2e_b / sizeof *e2e_b)},
    };
    for (int i = 0; i < PGD_H_COUNT; i++) {
        m->h[i].name = defs[i].n;
        m->h[i].help = defs[i].h;
        m->h[i].bounds = defs[i].b;
        m->h[i].n_buckets = defs[i].nb;
    }
}

void pgd_metrics_free(pgd_metrics *m) { (void)m; }

void pgd_metrics_observe(pgd_metrics *m, pgd_histogram_id id, double v) {
    pgd_histogram *h = &m->h[id];
    int b = 0;
    while (b < h->n_buckets && v > h->bounds[b]) b++;
    h->counts[b]++;
    h->sum += v;
    h->count++;
}

static const char *const reject_names[PGD_REJ_COUNT] = {
    "malformed", "smuggling", "transfer_coding", "http_version", "too_large", "head_timeout",
    "body_timeout", "per_client_limit", "evicted", "oversized_chat"};

void pgd_metrics_count_reject(pgd_metrics *m, pgd_reject_reason why) {
    if ((unsigned)why < PGD_REJ_COUNT) m->http_rejected[why]++;
}

void pgd_metrics_count_finish(pgd_metrics *m, const char *reason, bool aborted) {
    if (aborted) m->finished_abort++;
    else if (!strcmp(reason, "length")) m->finished_length++;
    else m->finished_stop++;
}

typedef struct buf {
    char *p;
    size_t n, cap;
} buf;

static void bprintf(buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void bprintf(buf *b, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) return;
        if (b->p && b->n + (size_t)k < b->cap) {
            b->n += (size_t)k;
            return;
        }
        size_t nc = (b->cap + (size_t)k + 1) * 2;
        char *np = realloc(b->p, nc);
        if (!np) return;
        b->p = np;
        b->cap = nc;
    }
}

/* p: the metric names' prefix ("pagoda" or "vllm", --metrics-prefix) */
static void gauge(buf *b, const char *p, const char *model, const char *name, const char *type,
                  const char *help, double v) {
    bprintf(b, "# HELP %s:%s %s\n# TYPE %s:%s %s\n%s:%s{model_name=\"%s\"} %.17g\n", p, name, help,
            p, name, type, p, name, model, v);
}

/* "a,b": the adapters whose bits are set in mask. */
static void lora_list(buf *b, const char *const *names, int n, uint64_t mask) {
    bool first = true;
    for (int k = 0; k < n && k < 64; k++)
        if (mask >> k & 1) {
            bprintf(b, "%s%s", first ? "" : ",", names[k]);
            first = false;
        }
}

char *pgd_metrics_render(const pgd_metrics *m, const pgd_engine_stats *engine_st,
                         const char *model, const char *const *lora_names, int n_loras) {
    buf b = {0};
    const char *p = m->prefix ? m->prefix : "pagoda";
    pgd_engine_stats st;
    memset(&st, 0, sizeof st);
    if (engine_st) st = *engine_st;
    gauge(&b, p, model, "num_requests_running", "gauge", "Requests in the running batch.",
          st.num_running);
    gauge(&b, p, model, "num_requests_waiting", "gauge", "Requests waiting to be scheduled.",
          st.num_waiting);
    gauge(&b, p, model, "kv_cache_usage_perc", "gauge", "KV-cache block usage (1 = full).",
          st.kv_usage_perc / 100.0);
    gauge(&b, p, model, "kv_cache_fragmentation_perc", "gauge",
          "Unused token slots inside allocated KV blocks over reserved slots (1 = all unused).",
          st.kv_fragmentation_perc / 100.0);
    gauge(&b, p, model, "kv_cache_blocks_used", "gauge", "KV blocks in use.", st.kv_blocks_used);
    gauge(&b, p, model, "kv_cache_blocks_total", "gauge", "KV blocks in the pool.",
          st.kv_blocks_total);
    gauge(&b, p, model, "prefix_cache_queries_total", "counter",
          "Prompt tokens looked up in the prefix cache.", (double)st.prefix_cache_queries);
    gauge(&b, p, model, "prefix_cache_hits_total", "counter",
          "Prompt tokens served from the prefix cache.", (double)st.prefix_cache_hits);
    gauge(&b, p, model, "num_preemptions_total", "counter", "Preempted sequences (recompute).",
          (double)st.num_preemptions);
    gauge(&b, p, model, "prompt_tokens_total", "counter", "Prompt tokens admitted.",
          (double)st.prompt_tokens_total);
    gauge(&b, p, model, "generation_tokens_total", "counter", "Generated tokens.",
          (double)st.generation_tokens_total);
    if (st.kv_events_batches > 0) { /* --kv-events-config (the first batch is sequence 0) */
        gauge(&b, p, model, "kv_events_published_total", "counter",
              "KV event batches published (sequence numbers assigned).",
              (double)st.kv_events_batches);
        gauge(&b, p, model, "kv_events_overflow_total", "counter",
              "KV event batches not sent live (a send backlog over max_queue_size); "
              "still in the replay buffer.", (double)st.kv_events_overflow);
        gauge(&b, p, model, "kv_events_lost_total", "counter",
              "KV event batches gone unsent from the replay buffer, or events not recorded.",
              (double)st.kv_events_lost);
    }
    if (st.kv_disk) { /* --kv-cache-dir */
        gauge(&b, p, model, "kv_disk_hits_total", "counter",
              "KV blocks read back from the disk tier and used.", (double)st.kv_disk_hits);
        gauge(&b, p, model, "kv_disk_misses_total", "counter",
              "Prompt lookups past the RAM prefix cache that found no block on disk.",
              (double)st.kv_disk_misses);
        gauge(&b, p, model, "kv_disk_read_bytes_total", "counter",
              "Bytes read from the disk tier.", (double)st.kv_disk_bytes_read);
        gauge(&b, p, model, "kv_disk_written_bytes_total", "counter",
              "Bytes written to the disk tier.", (double)st.kv_disk_bytes_written);
        gauge(&b, p, model, "kv_disk_evictions_total", "counter",
              "Disk-tier entries deleted to stay under --kv-cache-disk-size.",
              (double)st.kv_disk_evictions);
        gauge(&b, p, model, "kv_disk_corrupt_total", "counter",
              "Disk-tier entries found damaged, truncated or foreign, and deleted.",
              (double)st.kv_disk_corrupt);
        gauge(&b, p, model, "kv_disk_write_errors_total", "counter",
              "Disk-tier writes that failed (full or read-only disk).",
              (double)st.kv_disk_write_errors);
        gauge(&b, p, model, "kv_disk_writes_dropped_total", "counter",
              "Registered KV blocks never written to the disk tier.",
              (double)st.kv_disk_writes_dropped);
        gauge(&b, p, model, "kv_disk_blocks", "gauge", "KV blocks on the disk tier.",
              (double)st.kv_disk_entries);
        gauge(&b, p, model, "kv_disk_usage_bytes", "gauge", "Bytes on the disk tier.",
              (double)st.kv_disk_bytes);
    }
    bprintf(&b, "# HELP %s:request_success_total Finished requests by reason.\n"
                "# TYPE %s:request_success_total counter\n", p, p);
    static const char *const reasons[3] = {"stop", "length", "abort"};
    const uint64_t finished[3] = {m->finished_stop, m->finished_length, m->finished_abort};
    for (int i = 0; i < 3; i++)
        bprintf(&b, "%s:request_success_total{model_name=\"%s\",finished_reason=\"%s\"} %llu\n",
                p, model, reasons[i], (unsigned long long)finished[i]);
    bprintf(&b, "# HELP %s:http_rejected_total Connections and requests refused before "
                "the API (hostile or malformed HTTP, slow clients, limits).\n"
                "# TYPE %s:http_rejected_total counter\n", p, p);
    for (int i = 0; i < PGD_REJ_COUNT; i++)
        bprintf(&b, "%s:http_rejected_total{model_name=\"%s\",reason=\"%s\"} %llu\n", p, model,
                reject_names[i], (unsigned long long)m->http_rejected[i]);
    if (engine_st && m->block_size > 0) { /* vLLM's info gauge: the KV cache as label values */
        bprintf(&b, "# HELP %s:cache_config_info Information of the KV cache configuration.\n"
                    "# TYPE %s:cache_config_info gauge\n"
                    "%s:cache_config_info{model_name=\"%s\",block_size=\"%d\","
                    "num_gpu_blocks=\"%d\",cache_dtype=\"%s\",enable_prefix_caching=\"%s\"} 1\n",
                p, p, p, model, m->block_size, st.kv_blocks_total,
                m->cache_dtype ? m->cache_dtype : "", m->prefix_caching ? "True" : "False");
    }
    if (n_loras > 0) { /* vLLM's info gauge: the adapters in use, as label values */
        /* Its value is a Unix time, as in vLLM (which sets it at every step): a picker that
         * finds several series keeps the latest (llm-d's extractor takes the largest). */
        struct timespec now;
        double t = 1.0; /* (a clock that fails leaves a positive constant) */
        if (!clock_gettime(CLOCK_REALTIME, &now))
            t = (double)now.tv_sec + 1e-9 * (double)now.tv_nsec;
        bprintf(&b, "# HELP %s:lora_requests_info Running and waiting LoRA adapters.\n"
                    "# TYPE %s:lora_requests_info gauge\n"
                    "%s:lora_requests_info{model_name=\"%s\",max_lora=\"%d\","
                    "running_lora_adapters=\"", p, p, p, model, n_loras);
        lora_list(&b, lora_names, n_loras, st.lora_running);
        bprintf(&b, "\",waiting_lora_adapters=\"");
        lora_list(&b, lora_names, n_loras, st.lora_waiting);
        bprintf(&b, "\"} %.3f\n", t);
    }
    if (m->n_spec_positions > 0) {
        gauge(&b, p, model, "spec_decode_num_drafts_total", "counter",
              "Verifications of speculative proposals.", (double)st.spec_drafts);
        gauge(&b, p, model, "spec_decode_num_draft_tokens_total", "counter",
              "Speculative tokens proposed.", (double)st.spec_draft_tokens);
        gauge(&b, p, model, "spec_decode_num_accepted_tokens_total", "counter",
              "Speculative tokens accepted.", (double)st.spec_accepted_tokens);
        bprintf(&b, "# HELP %s:spec_decode_num_accepted_tokens_per_pos_total Speculative "
                    "tokens accepted, by position in the proposal.\n"
                    "# TYPE %s:spec_decode_num_accepted_tokens_per_pos_total counter\n", p, p);
        for (int k = 0; k < m->n_spec_positions; k++)
            bprintf(&b, "%s:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"%s\","
                        "position=\"%d\"} %lld\n",
                    p, model, k, (long long)st.spec_accepted_per_pos[k]);
    }
    for (int i = 0; i < PGD_H_COUNT; i++) {
        const pgd_histogram *h = &m->h[i];
        bprintf(&b, "# HELP %s:%s %s\n# TYPE %s:%s histogram\n", p, h->name, h->help, p, h->name);
        uint64_t cum = 0;
        for (int k = 0; k < h->n_buckets; k++) {
            cum += h->counts[k];
            bprintf(&b, "%s:%s_bucket{model_name=\"%s\",le=\"%g\"} %llu\n", p, h->name, model,
                    h->bounds[k], (unsigned long long)cum);
        }
        cum += h->counts[h->n_buckets];
        bprintf(&b, "%s:%s_bucket{model_name=\"%s\",le=\"+Inf\"} %llu\n", p, h->name, model,
                (unsigned long long)cum);
        bprintf(&b, "%s:%s_sum{model_name=\"%s\"} %.9g\n%s:%s_count{model_name=\"%s\"} %llu\n",
                p, h->name, model, h->sum, p, h->name, model, (unsigned long long)h->count);
    }
    return b.p;
}
