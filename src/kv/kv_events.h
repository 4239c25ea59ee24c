/* KV events for KV-aware routers, in vLLM's wire format (vllm/distributed/kv_events.py):
 * the prefix cache's changes published on a ZMQ PUB socket, three frames per message (topic,
 * 8-byte big-endian sequence number, msgpack payload), the payload a KVEventBatch
 * [ts, [event...], data_parallel_rank] whose events are
 *   ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
 *    lora_name]
 *   ["BlockRemoved", block_hashes, medium]
 *   ["AllBlocksCleared"]                       (the first batch, sequence 0: a fresh cache)
 * and a ROUTER socket that replays the batches still held (the last buffer_steps) from a
 * sequence number a subscriber sends, then an end marker (sequence -1, empty payload).
 *
 * The engine thread encodes a step's events and copies them into a ring under a short lock;
 * a publisher thread sends them. Publishing never waits on the network: a send backlog over
 * max_queue_size skips its oldest batches on the PUB socket (counted as overflow; they stay
 * in the ring for replay), and a batch that falls out of the ring unsent is counted as lost.
 * Built with libzmq and msgpack-c (PGD_HAVE_KV_EVENTS); without them a config that enables
 * events is refused. */
#ifndef PGD_KV_EVENTS_H
#define PGD_KV_EVENTS_H

#include <stdint.h>

#include "kv/kv.h"
#include "util/status.h"

typedef struct pgd_kv_publisher pgd_kv_publisher;

typedef struct pgd_kv_pub_stats {
    int64_t batches;  /* sequence numbers assigned */
    int64_t sent;     /* batches sent on the PUB socket */
    int64_t overflow; /* batches skipped on the PUB socket (backlog over max_queue_size) */
    int64_t lost;     /* batches gone from the ring unsent, and events the step's log lost */
    int64_t replays;  /* replay requests served */
} pgd_kv_pub_stats;

/* Parses vLLM's KVEventsConfig JSON (enable_kv_cache_events, publisher "zmq" or "null",
 * endpoint, replay_endpoint, topic, buffer_steps, hwm, max_queue_size) and, when it enables
 * events, binds (or connects, as vLLM decides from the address) and starts publishing; *out is
 * NULL when it does not. medium: "CPU" or "GPU", the cache's memory. Errors name the field. */
int pgd_kv_publisher_new(const char *config_json, const char *medium, pgd_kv_publisher **out,
                         pgd_err *err);
void pgd_kv_publisher_free(pgd_kv_publisher *p);

/* A prefix-cache namespace's LoRA adapter (*lora_id 0 and *lora_name NULL: the base model). */
typedef void (*pgd_kv_lora_fn)(void *arg, uint32_t ns, int64_t *lora_id, const char **lora_name);

/* One batch of the log's events (none: nothing is published). Engine thread only. */
void pgd_kv_publish(pgd_kv_publisher *p, const pgd_kv_event_log *log, int32_t block_size,
                    pgd_kv_lora_fn lora, void *lora_arg);
/* The last sequence number assigned, -1 before the first. */
int64_t pgd_kv_publisher_last_seq(pgd_kv_publisher *p);
void pgd_kv_publisher_stats(pgd_kv_publisher *p, pgd_kv_pub_stats *st);

#endif
