/* The OpenAI Responses API (/v1/responses) beyond the dialect table (api/dialect.h): the store
 * of responses that previous_response_id chains from and GET/DELETE read, and background runs.
 * All calls are made on the server's I/O thread. */
#ifndef PGD_API_RESPONSES_H
#define PGD_API_RESPONSES_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>

#include "api/dialect.h"

/* An in-memory store of responses, bounded in bytes (--responses-store-size), evicting the
 * least recently used. Each entry: the response object as the API returns it, and the
 * conversation that produced it (the chat messages of its input, its instructions aside, and
 * its output), which a later request's previous_response_id continues. */
typedef struct pgd_resp_store pgd_resp_store;

pgd_resp_store *pgd_resp_store_new(size_t max_bytes);
void pgd_resp_store_free(pgd_resp_store *st);
/* Stores (or replaces) id: response (borrowed, copied) and messages (borrowed, copied; may be
 * NULL to keep the entry's). 0, or PGD_ENOMEM / PGD_ERANGE (one entry larger than the bound). */
int pgd_resp_store_put(pgd_resp_store *st, const char *id, const cJSON *response,
                       const cJSON *messages);
/* The stored response object of id (borrowed until the next put/delete), or NULL. A hit counts
 * as a use for the LRU order. */
const cJSON *pgd_resp_store_get(pgd_resp_store *st, const char *id);
/* The stored conversation of id (borrowed until the next put/delete), or NULL. */
const cJSON *pgd_resp_store_messages(pgd_resp_store *st, const char *id);
/* 0, or PGD_ENOENT when id is not stored. */
int pgd_resp_store_delete(pgd_resp_store *st, const char *id);
size_t pgd_resp_store_bytes(const pgd_resp_store *st);
size_t pgd_resp_store_count(const pgd_resp_store *st);

/* A Responses request's state (the dialect's void *state): */
/* whether it asked for background: true (the server answers at once and runs it detached) */
bool pgd_responses_background(const void *state);
/* The response object as it stands now (status "queued"/"in_progress"), malloc'd JSON: the
 * immediate answer of a background request. It is also put into the store (when store is on). */
char *pgd_responses_snapshot(void *state);
/* A background run has started (its prompt is submitted): the stored object's status becomes
 * "in_progress" (when store is on and it was not cancelled). */
void pgd_responses_mark_running(void *state);
/* The run was cancelled (POST /v1/responses/{id}/cancel): the final object's status is
 * "cancelled" whatever the chat answer says. */
void pgd_responses_mark_cancelled(void *state);

#endif
