/* KV events publisher (kv_events.h): vLLM's ZmqEventPublisher's wire format and replay. */
#include "kv/kv_events.h"

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef PGD_HAVE_KV_EVENTS
#include <errno.h>
#include <msgpack.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>
#endif

typedef struct kv_events_config {
    bool enable;
    char publisher[16];
    char endpoint[256], replay_endpoint[256], topic[256];
    int64_t buffer_steps, hwm, max_queue_size;
} kv_events_config;

/* A string field into dst (NULL in the JSON: empty). */
static int cfg_str(const cJSON *it, char *dst, size_t cap, pgd_err *err) {
    if (cJSON_IsNull(it)) {
        dst[0] = 0;
        return PGD_OK;
    }
    if (!cJSON_IsString(it) || strlen(it->valuestring) >= cap)
        return pgd_err_set(err, PGD_EINVAL, "--kv-events-config: \"%s\" must be a string of at "
                           "most %zu bytes", it->string, cap - 1);
    memcpy(dst, it->valuestring, strlen(it->valuestring) + 1);
    return PGD_OK;
}

static int cfg_int(const cJSON *it, int64_t lo, int64_t *dst, pgd_err *err) {
    if (!cJSON_IsNumber(it) || it->valuedouble != (double)(int64_t)it->valuedouble ||
        it->valuedouble < (double)lo || it->valuedouble > 1e9)
        return pgd_err_set(err, PGD_EINVAL, "--kv-events-config: \"%s\" must be an integer in "
                           "[%lld, 1000000000]", it->string, (long long)lo);
    *dst = (int64_t)it->valuedouble;
    return PGD_OK;
}

/* vLLM's KVEventsConfig: its fields and defaults; an unknown field is an error, as there. */
static int parse_config(const char *json, kv_events_config *c, pgd_err *err) {
    *c = (kv_events_config){.enable = false, .publisher = "zmq", .endpoint = "tcp://*:5557",
                            .buffer_steps = 10000, .hwm = 100000, .max_queue_size = 100000};
    cJSON *root = cJSON_Parse(json);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return pgd_err_set(err, PGD_EINVAL, "--kv-events-config: not a JSON object");
    }
    int rc = PGD_OK;
    for (const cJSON *it = root->child; it && !rc; it = it->next) {
        const char *k = it->string;
        if (!strcmp(k, "enable_kv_cache_events")) {
            if (!cJSON_IsBool(it))
                rc = pgd_err_set(err, PGD_EINVAL, "--kv-events-config: \"%s\" must be a boolean",
                                 k);
            else c->enable = cJSON_IsTrue(it);
        } else if (!strcmp(k, "publisher")) {
            rc = cfg_str(it, c->publisher, sizeof c->publisher, err);
            if (!rc && strcmp(c->publisher, "zmq") && strcmp(c->publisher, "null"))
                rc = pgd_err_set(err, PGD_EINVAL, "--kv-events-config: unknown publisher \"%s\" "
                                 "(zmq or null)", c->publisher);
        } else if (!strcmp(k, "endpoint")) {
            rc = cfg_str(it, c->endpoint, sizeof c->endpoint, err);
        } else if (!strcmp(k, "replay_endpoint")) {
            rc = cfg_str(it, c->replay_endpoint, sizeof c->replay_endpoint, err);
        } else if (!strcmp(k, "topic")) {
            rc = cfg_str(it, c->topic, sizeof c->topic, err);
        } else if (!strcmp(k, "buffer_steps")) {
            rc = cfg_int(it, 1, &c->buffer_steps, err);
        } else if (!strcmp(k, "hwm")) {
            rc = cfg_int(it, 0, &c->hwm, err);
        } else if (!strcmp(k, "max_queue_size")) {
            rc = cfg_int(it, 1, &c->max_queue_size, err);
        } else {
            rc = pgd_err_set(err, PGD_EINVAL, "--kv-events-config: unknown field \"%s\"", k);
        }
    }
    cJSON_Delete(root);
    if (!rc && c->enable && !strcmp(c->publisher, "zmq") && !c->endpoint[0])
        rc = pgd_err_set(err, PGD_EINVAL, "--kv-events-config: the zmq publisher needs an "
                         "endpoint");
    if (!rc && !strcmp(c->publisher, "null")) c->enable = false;
    return rc;
}

#ifndef PGD_HAVE_KV_EVENTS

struct pgd_kv_publisher {
    int unused;
};

int pgd_kv_publisher_new(const char *config_json, const char *medium, pgd_kv_publisher **out,
                         pgd_err *err) {
    (void)medium;
    *out = NULL;
    kv_events_config c;
    int rc = parse_config(config_json, &c, err);
    if (!rc && c.enable)
        rc = pgd_err_set(err, PGD_EUNSUPPORTED, "--kv-events-config: this build has no KV "
                         "events (build with libzmq and msgpack-c: apt-get install libzmq3-dev "
                         "libmsgpack-dev)");
    return rc;
}
void pgd_kv_publisher_free(pgd_kv_publisher *p) { (void)p; }
void pgd_kv_publish(pgd_kv_publisher *p, const pgd_kv_event_log *log, int32_t block_size,
                    pgd_kv_lora_fn lora, void *lora_arg) {
    (void)p, (void)log, (void)block_size, (void)lora, (void)lora_arg;
}
int64_t pgd_kv_publisher_last_seq(pgd_kv_publisher *p) { (void)p; return -1; }
void pgd_kv_publisher_stats(pgd_kv_publisher *p, pgd_kv_pub_stats *st) {
    (void)p;
    memset(st, 0, sizeof *st);
}

#else

typedef struct slot {
    int64_t seq; /* -1: empty */
    size_t len, cap;
    char *data;
} slot;

struct pgd_kv_publisher {
    kv_events_config cfg;
    char medium[8];
    void *ctx, *pub, *replay;
    int efd;                /* wakes the publisher thread */
    pthread_t thread;
    bool thread_running, stop;
    msgpack_sbuffer sbuf;   /* the engine thread's encoding buffer */
    /* the ring: batch seq lives in slots[seq % n_slots] until overwritten */
    pthread_mutex_t mu;
    slot *slots;
    int64_t n_slots, next_seq, last_sent;
    pgd_kv_pub_stats st;
};

static void wake(pgd_kv_publisher *p) {
    uint64_t one = 1;
    ssize_t w = write(p->efd, &one, sizeof one); /* (a full counter is still a wake-up) */
    (void)w;
}

static void put_be64(unsigned char b[8], int64_t v) {
    for (int i = 7; i >= 0; i--, v = (int64_t)((uint64_t)v >> 8)) b[i] = (unsigned char)(v & 0xff);
}

/* Copies the encoded batch into the ring as the next sequence number. Under mu. */
static void enqueue(pgd_kv_publisher *p, const char *data, size_t len) {
    pthread_mutex_lock(&p->mu);
    int64_t seq = p->next_seq;
    slot *s = &p->slots[seq % p->n_slots];
    if (s->cap < len) {
        char *d = realloc(s->data, len);
        if (!d) {
            p->st.lost++;
            pthread_mutex_unlock(&p->mu);
            return;
        }
        s->data = d;
        s->cap = len;
    }
    if (s->seq >= 0 && s->seq > p->last_sent) p->st.lost++; /* overwritten unsent */
    memcpy(s->data, data, len);
    s->len = len;
    s->seq = seq;
    p->next_seq++;
    p->st.batches++;
    pthread_mutex_unlock(&p->mu);
    wake(p);
}

static void pack_str(msgpack_packer *pk, const char *s) {
    size_t n = strlen(s);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

static void pack_header(pgd_kv_publisher *p, msgpack_packer *pk, size_t n_events) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    msgpack_sbuffer_clear(&p->sbuf);
    msgpack_pack_array(pk, 3); /* [ts, events, data_parallel_rank] */
    msgpack_pack_double(pk, (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9);
    msgpack_pack_array(pk, n_events);
}

/* Events grouped as vLLM groups them: a run of STORED blocks that chain (each the parent of the
 * next, one namespace) is one BlockStored; a run of REMOVED ones is one BlockRemoved. Returns
 * the end of the run that starts at i. */
static size_t run_end(const pgd_kv_event_log *l, size_t i) {
    size_t j = i + 1;
    if (l->ev[i].kind == PGD_KV_EV_REMOVED) {
        while (j < l->n && l->ev[j].kind == PGD_KV_EV_REMOVED) j++;
    } else {
        while (j < l->n && l->ev[j].kind == PGD_KV_EV_STORED && l->ev[j].ns == l->ev[i].ns &&
               l->ev[j].parent == l->ev[j - 1].hash)
            j++;
    }
    return j;
}

void pgd_kv_publish(pgd_kv_publisher *p, const pgd_kv_event_log *l, int32_t block_size,
                    pgd_kv_lora_fn lora, void *lora_arg) {
    if (!p) return;
    if (l->lost) {
        pthread_mutex_lock(&p->mu);
        p->st.lost += l->lost;
        pthread_mutex_unlock(&p->mu);
    }
    if (!l->n) return;
    size_t n_runs = 0;
    for (size_t i = 0; i < l->n; i = run_end(l, i)) n_runs++;
    msgpack_packer pk;
    msgpack_packer_init(&pk, &p->sbuf, msgpack_sbuffer_write);
    pack_header(p, &pk, n_runs);
    for (size_t i = 0, j; i < l->n; i = j) {
        j = run_end(l, i);
        const pgd_kv_event *e = &l->ev[i];
        if (e->kind == PGD_KV_EV_REMOVED) {
            msgpack_pack_array(&pk, 3);
            pack_str(&pk, "BlockRemoved");
            msgpack_pack_array(&pk, j - i);
            for (size_t k = i; k < j; k++) msgpack_pack_uint64(&pk, l->ev[k].hash);
            pack_str(&pk, p->medium);
            continue;
        }
        msgpack_pack_array(&pk, 8);
        pack_str(&pk, "BlockStored");
        msgpack_pack_array(&pk, j - i);
        for (size_t k = i; k < j; k++) msgpack_pack_uint64(&pk, l->ev[k].hash);
        if (e->parent) msgpack_pack_uint64(&pk, e->parent);
        else msgpack_pack_nil(&pk);
        msgpack_pack_array(&pk, (j - i) * (size_t)block_size);
        for (size_t k = i; k < j; k++)
            for (int32_t t = 0; t < block_size; t++)
                msgpack_pack_int32(&pk, l->tokens[l->ev[k].tok + (size_t)t]);
        msgpack_pack_int32(&pk, block_size);
        int64_t lora_id = 0;
        const char *lora_name = NULL;
        if (e->ns && lora) lora(lora_arg, e->ns, &lora_id, &lora_name);
        if (lora_id) msgpack_pack_int64(&pk, lora_id);
        else msgpack_pack_nil(&pk);
        pack_str(&pk, p->medium);
        if (lora_name) pack_str(&pk, lora_name);
        else msgpack_pack_nil(&pk);
    }
    msgpack_pack_int32(&pk, 0); /* data_parallel_rank: one engine per process */
    enqueue(p, p->sbuf.data, p->sbuf.size);
}

static bool send_frames(void *sock, const void *const *parts, const size_t *lens, int n) {
    for (int i = 0; i < n; i++)
        if (zmq_send(sock, parts[i], lens[i], ZMQ_DONTWAIT | (i + 1 < n ? ZMQ_SNDMORE : 0)) < 0)
            return false;
    return true;
}

/* Sends what the ring holds past last_sent: at most max_queue_size batches, the newest. The
 * lock is held over one batch at a time (zmq_send copies it), so a step's pgd_kv_publish waits
 * for one send at the most. */
static void send_pending(pgd_kv_publisher *p) {
    pthread_mutex_lock(&p->mu);
    int64_t newest = p->next_seq - 1, start = p->last_sent + 1;
    int64_t oldest = p->next_seq - p->n_slots > 0 ? p->next_seq - p->n_slots : 0;
    if (start < oldest) start = oldest; /* (counted as lost when overwritten) */
    if (newest - start + 1 > p->cfg.max_queue_size) {
        p->st.overflow += newest - start + 1 - p->cfg.max_queue_size;
        start = newest - p->cfg.max_queue_size + 1;
    }
    size_t tlen = strlen(p->cfg.topic);
    for (int64_t q = start; q <= newest; q++) {
        const slot *s = &p->slots[q % p->n_slots];
        if (s->seq == q) { /* (else overwritten since: counted as lost by enqueue) */
            unsigned char be[8];
            put_be64(be, q);
            const void *parts[3] = {p->cfg.topic, be, s->data};
            size_t lens[3] = {tlen, 8, s->len};
            if (send_frames(p->pub, parts, lens, 3)) p->st.sent++;
        }
        p->last_sent = q;
        pthread_mutex_unlock(&p->mu);
        pthread_mutex_lock(&p->mu);
    }
    pthread_mutex_unlock(&p->mu);
}

/* One replay request on the ROUTER socket: [identity, "", start_seq (8 bytes big-endian)].
 * Answers [identity, "", seq, payload] for each held batch from start_seq on, then
 * [identity, "", -1, ""]. */
static void serve_replay(pgd_kv_publisher *p) {
    unsigned char frames[3][64];
    size_t lens[3] = {0};
    int n = 0, more = 1;
    while (more) {
        unsigned char buf[64];
        int r = zmq_recv(p->replay, buf, sizeof buf, ZMQ_DONTWAIT);
        if (r < 0) return;
        if (n < 3 && (size_t)r <= sizeof buf) {
            memcpy(frames[n], buf, (size_t)r);
            lens[n] = (size_t)r;
        }
        n++;
        size_t ml = sizeof more;
        if (zmq_getsockopt(p->replay, ZMQ_RCVMORE, &more, &ml)) more = 0;
    }
    if (n != 3 || lens[2] != 8 || lens[0] > 64) return; /* (vLLM logs and ignores these) */
    int64_t start = 0;
    for (int i = 0; i < 8; i++) start = (int64_t)(((uint64_t)start << 8) | frames[2][i]);
    pthread_mutex_lock(&p->mu); /* (held over one batch at a time, as in send_pending) */
    p->st.replays++;
    int64_t oldest = p->next_seq - p->n_slots > 0 ? p->next_seq - p->n_slots : 0;
    if (start < oldest) start = oldest;
    int64_t end_seq = p->next_seq; /* (what was published when the request came) */
    for (int64_t q = start; q < end_seq; q++) {
        const slot *s = &p->slots[q % p->n_slots];
        if (s->seq != q) continue; /* overwritten meanwhile: gone */
        unsigned char be[8];
        put_be64(be, q);
        const void *parts[4] = {frames[0], "", be, s->data};
        size_t pl[4] = {lens[0], 0, 8, s->len};
        if (!send_frames(p->replay, parts, pl, 4)) break;
        pthread_mutex_unlock(&p->mu);
        pthread_mutex_lock(&p->mu);
    }
    unsigned char end[8];
    put_be64(end, -1);
    const void *parts[4] = {frames[0], "", end, ""};
    size_t pl[4] = {lens[0], 0, 8, 0};
    send_frames(p->replay, parts, pl, 4);
    pthread_mutex_unlock(&p->mu);
}

static void *publisher_main(void *arg) {
    pgd_kv_publisher *p = arg;
    zmq_pollitem_t items[2] = {{.fd = p->efd, .events = ZMQ_POLLIN},
                               {.socket = p->replay, .events = ZMQ_POLLIN}};
    int n_items = p->replay ? 2 : 1;
    for (;;) {
        int r = zmq_poll(items, n_items, 1000);
        if (r < 0 && zmq_errno() != EINTR) break;
        if (items[0].revents & ZMQ_POLLIN) {
            uint64_t v;
            ssize_t rd = read(p->efd, &v, sizeof v);
            (void)rd;
        }
        pthread_mutex_lock(&p->mu);
        bool stop = p->stop;
        pthread_mutex_unlock(&p->mu);
        send_pending(p);
        if (n_items == 2 && (items[1].revents & ZMQ_POLLIN)) serve_replay(p);
        if (stop) break;
    }
    return NULL;
}

/* vLLM's rule: bind a wildcard, IPv6 or local address; connect to any other. */
static bool binds(const char *ep) {
    return strchr(ep, '*') || strstr(ep, "::") || !strncmp(ep, "ipc://", 6) ||
           !strncmp(ep, "inproc://", 9);
}

int pgd_kv_publisher_new(const char *config_json, const char *medium, pgd_kv_publisher **out,
                         pgd_err *err) {
    *out = NULL;
    kv_events_config c;
    int rc = parse_config(config_json, &c, err);
    if (rc || !c.enable) return rc;
    pgd_kv_publisher *p = calloc(1, sizeof *p);
    if (!p) return pgd_err_set(err, PGD_ENOMEM, "out of memory");
    p->cfg = c;
    snprintf(p->medium, sizeof p->medium, "%s", medium);
    p->efd = -1;
    p->last_sent = -1;
    p->n_slots = c.buffer_steps;
    msgpack_sbuffer_init(&p->sbuf);
    if (pthread_mutex_init(&p->mu, NULL)) {
        free(p);
        return pgd_err_set(err, PGD_ENOMEM, "cannot create a mutex");
    }
    p->slots = calloc((size_t)p->n_slots, sizeof *p->slots);
    p->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    p->ctx = zmq_ctx_new();
    if (!p->slots || p->efd < 0 || !p->ctx) {
        rc = pgd_err_set(err, PGD_ENOMEM, "--kv-events-config: cannot set up the publisher");
        goto fail;
    }
    for (int64_t i = 0; i < p->n_slots; i++) p->slots[i].seq = -1;
    int hwm = (int)c.hwm, linger = 0;
    p->pub = zmq_socket(p->ctx, ZMQ_PUB);
    if (!p->pub || zmq_setsockopt(p->pub, ZMQ_SNDHWM, &hwm, sizeof hwm) ||
        zmq_setsockopt(p->pub, ZMQ_LINGER, &linger, sizeof linger) ||
        (binds(c.endpoint) ? zmq_bind(p->pub, c.endpoint) : zmq_connect(p->pub, c.endpoint))) {
        rc = pgd_err_set(err, PGD_EIO, "--kv-events-config: endpoint %s: %s", c.endpoint,
                         zmq_strerror(zmq_errno()));
        goto fail;
    }
    if (c.replay_endpoint[0]) {
        p->replay = zmq_socket(p->ctx, ZMQ_ROUTER);
        if (!p->replay || zmq_setsockopt(p->replay, ZMQ_LINGER, &linger, sizeof linger) ||
            zmq_bind(p->replay, c.replay_endpoint)) {
            rc = pgd_err_set(err, PGD_EIO, "--kv-events-config: replay_endpoint %s: %s",
                             c.replay_endpoint, zmq_strerror(zmq_errno()));
            goto fail;
        }
    }
    /* sequence 0: the cache starts empty (a subscriber that knew an earlier run resets) */
    msgpack_packer pk;
    msgpack_packer_init(&pk, &p->sbuf, msgpack_sbuffer_write);
    pack_header(p, &pk, 1);
    msgpack_pack_array(&pk, 1);
    pack_str(&pk, "AllBlocksCleared");
    msgpack_pack_int32(&pk, 0);
    enqueue(p, p->sbuf.data, p->sbuf.size);
    if (pthread_create(&p->thread, NULL, publisher_main, p)) {
        rc = pgd_err_set(err, PGD_ENOMEM, "--kv-events-config: cannot start the publisher");
        goto fail;
    }
    p->thread_running = true;
    *out = p;
    return PGD_OK;
fail:
    pgd_kv_publisher_free(p);
    return rc;
}

void pgd_kv_publisher_free(pgd_kv_publisher *p) {
    if (!p) return;
    if (p->thread_running) {
        pthread_mutex_lock(&p->mu);
        p->stop = true;
        pthread_mutex_unlock(&p->mu);
        wake(p);
        pthread_join(p->thread, NULL);
    }
    if (p->pub) zmq_close(p->pub);
    if (p->replay) zmq_close(p->replay);
    if (p->ctx) zmq_ctx_term(p->ctx);
    if (p->efd >= 0) close(p->efd);
    for (int64_t i = 0; p->slots && i < p->n_slots; i++) free(p->slots[i].data);
    free(p->slots);
    msgpack_sbuffer_destroy(&p->sbuf);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

int64_t pgd_kv_publisher_last_seq(pgd_kv_publisher *p) {
    pthread_mutex_lock(&p->mu);
    int64_t s = p->next_seq - 1;
    pthread_mutex_unlock(&p->mu);
    return s;
}

void pgd_kv_publisher_stats(pgd_kv_publisher *p, pgd_kv_pub_stats *st) {
    pthread_mutex_lock(&p->mu);
    *st = p->st;
    pthread_mutex_unlock(&p->mu);
}

#endif
