/* The Responses API's store (api/responses.h): stored response objects and the conversations
 * that produced them, bounded by the sum of their printed sizes and evicted least recently
 * used first. A hash of the ids finds an entry; a doubly linked list keeps the use order. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "api/responses.h"
#include "util/status.h"

typedef struct entry {
    char *id;                    /* owned */
    cJSON *response, *messages;  /* owned; messages may be NULL */
    size_t bytes;                /* what the entry counts against the bound */
    struct entry *prev, *next;   /* use order: prev is more recent */
    struct entry *hnext;         /* the hash bucket's chain */
} entry;

struct pgd_resp_store {
    size_t max_bytes, bytes, count;
    entry **buckets;             /* (n_buckets) chains, n_buckets a power of two */
    size_t n_buckets;
    entry *head, *tail;          /* most and least recently used */
};

static uint64_t hash_id(const char *s) { /* FNV-1a */
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

pgd_resp_store *pgd_resp_store_new(size_t max_bytes) {
    pgd_resp_store *st = calloc(1, sizeof *st);
    if (!st) return NULL;
    st->max_bytes = max_bytes;
    st->n_buckets = 64;
    st->buckets = calloc(st->n_buckets, sizeof *st->buckets);
    if (!st->buckets) {
        free(st);
        return NULL;
    }
    return st;
}

static void entry_free(entry *e) {
    free(e->id);
    cJSON_Delete(e->response);
    cJSON_Delete(e->messages);
    free(e);
}

void pgd_resp_store_free(pgd_resp_store *st) {
    if (!st) return;
    for (entry *e = st->head, *n; e; e = n) {
        n = e->next;
        entry_free(e);
    }
    free(st->buckets);
    free(st);
}

static entry **bucket_of(pgd_resp_store *st, const char *id) {
    return &st->buckets[hash_id(id) & (st->n_buckets - 1)];
}

static entry *find(pgd_resp_store *st, const char *id) {
    for (entry *e = *bucket_of(st, id); e; e = e->hnext)
        if (!strcmp(e->id, id)) return e;
    return NULL;
}

static void list_unlink(pgd_resp_store *st, entry *e) {
    if (e->prev) e->prev->next = e->next;
    else st->head = e->next;
    if (e->next) e->next->prev = e->prev;
    else st->tail = e->prev;
    e->prev = e->next = NULL;
}

static void list_push_front(pgd_resp_store *st, entry *e) {
    e->prev = NULL;
    e->next = st->head;
    if (st->head) st->head->prev = e;
    st->head = e;
    if (!st->tail) st->tail = e;
}

/* Takes e out of the store (hash, list, counts) and frees it. */
static void remove_entry(pgd_resp_store *st, entry *e) {
    for (entry **p = bucket_of(st, e->id); *p; p = &(*p)->hnext)
        if (*p == e) {
            *p = e->hnext;
            break;
        }
    list_unlink(st, e);
    st->bytes -= e->bytes;
    st->count--;
    entry_free(e);
}

/* Doubles the buckets when the chains average more than two entries; a failed allocation
 * keeps the old table (longer chains, still correct). */
static void maybe_grow(pgd_resp_store *st) {
    if (st->count <= st->n_buckets * 2) return;
    size_t nb = st->n_buckets * 2;
    entry **b = calloc(nb, sizeof *b);
    if (!b) return;
    for (entry *e = st->head; e; e = e->next) {
        entry **slot = &b[hash_id(e->id) & (nb - 1)];
        e->hnext = *slot;
        *slot = e;
    }
    free(st->buckets);
    st->buckets = b;
    st->n_buckets = nb;
}

static size_t printed_size(const cJSON *x) {
    if (!x) return 0;
    char *s = cJSON_PrintUnformatted(x);
    if (!s) return SIZE_MAX;
    size_t n = strlen(s);
    free(s);
    return n;
}

/* The id's old entry is dropped whatever the outcome: a stale answer (a background response's
 * "queued" object) must not outlive a newer one that could not be stored. */
int pgd_resp_store_put(pgd_resp_store *st, const char *id, const cJSON *response,
                       const cJSON *messages) {
    entry *old = find(st, id);
    cJSON *msgs = NULL;
    if (messages) msgs = cJSON_Duplicate(messages, true);
    else if (old) msgs = old->messages, old->messages = NULL;
    if (old) remove_entry(st, old);
    entry *e = calloc(1, sizeof *e);
    if (!e || (messages && !msgs)) goto nomem;
    e->messages = msgs;
    msgs = NULL;
    e->id = strdup(id);
    e->response = cJSON_Duplicate(response, true);
    if (!e->id || !e->response) goto nomem;
    size_t rb = printed_size(e->response), mb = printed_size(e->messages);
    if (rb == SIZE_MAX || mb == SIZE_MAX) goto nomem;
    e->bytes = strlen(id) + rb + mb;
    if (e->bytes > st->max_bytes) {
        entry_free(e);
        return PGD_ERANGE;
    }
    while (st->bytes + e->bytes > st->max_bytes) remove_entry(st, st->tail);
    entry **slot = bucket_of(st, id);
    e->hnext = *slot;
    *slot = e;
    list_push_front(st, e);
    st->bytes += e->bytes;
    st->count++;
    maybe_grow(st);
    return 0;
nomem:
    cJSON_Delete(msgs);
    if (e) entry_free(e);
    return PGD_ENOMEM;
}

const cJSON *pgd_resp_store_get(pgd_resp_store *st, const char *id) {
    entry *e = find(st, id);
    if (!e) return NULL;
    list_unlink(st, e);
    list_push_front(st, e);
    return e->response;
}

const cJSON *pgd_resp_store_messages(pgd_resp_store *st, const char *id) {
    entry *e = find(st, id);
    if (!e) return NULL;
    list_unlink(st, e); /* continuing a conversation is a use of it */
    list_push_front(st, e);
    return e->messages;
}

int pgd_resp_store_delete(pgd_resp_store *st, const char *id) {
    entry *e = find(st, id);
    if (!e) return PGD_ENOENT;
    remove_entry(st, e);
    return 0;
}

size_t pgd_resp_store_bytes(const pgd_resp_store *st) { return st->bytes; }
size_t pgd_resp_store_count(const pgd_resp_store *st) { return st->count; }
