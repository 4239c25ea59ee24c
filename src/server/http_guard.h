/* The front door: each connection's first request head is read with MSG_PEEK (nothing is
 * consumed) and checked strictly (RFC 9110/9112) before libmicrohttpd is given the socket, so
 * what MHD 0.9.75 mishandles (a malformed Content-Length answered with two header blocks, bare
 * CR, NUL cutting a path, unknown transfer codings left unanswered) gets one well-formed answer
 * from here. Connections still without a complete head wait here, not in MHD's table: each has
 * a deadline, each client address a limit, and a full table evicts its oldest to admit a new
 * client. Runs on the I/O thread's libuv loop. */
#ifndef PGD_SERVER_HTTP_GUARD_H
#define PGD_SERVER_HTTP_GUARD_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/socket.h>
#include <uv.h>

#include "server/metrics.h"

/* pgd_http_head_check's answers besides an HTTP status */
#define PGD_HEAD_MORE 0 /* no verdict yet: the head is incomplete */
#define PGD_HEAD_OK 1   /* a complete, acceptable head */

/* Checks the request head at the start of buf (n bytes: the head, possibly incomplete, and
 * whatever followed it). Returns PGD_HEAD_MORE, PGD_HEAD_OK, or the HTTP status to refuse it
 * with (400, 413, 501, 505) with a reason in msg and the metrics reason in *why. max_body: the
 * largest Content-Length (or first chunk size) taken. */
int pgd_http_head_check(const char *buf, size_t n, size_t max_body, char *msg, size_t msg_cap,
                        pgd_reject_reason *why);

typedef struct pgd_http_guard_cfg {
    int head_timeout_ms;   /* a connection's first head must be complete within this */
    int max_pending;       /* connections waiting for a head, at most (then the oldest goes) */
    int max_per_client;    /* of those, per client address (0: no limit) */
    size_t max_head_bytes; /* a longer head: 431 */
    size_t max_body_bytes; /* a longer declared body: 413 */
} pgd_http_guard_cfg;

/* Called with each connection whose first head passed; takes the socket. */
typedef void (*pgd_http_guard_pass_fn)(void *arg, int fd, const struct sockaddr *addr,
                                       socklen_t addrlen);

typedef struct pgd_http_guard pgd_http_guard;

/* Listens on addr (port 0: any free one, see pgd_http_guard_port). Returns 0 or -errno. The
 * metrics are borrowed (counted on the loop's thread). */
int pgd_http_guard_start(uv_loop_t *loop, const struct sockaddr *addr,
                         const pgd_http_guard_cfg *cfg, pgd_http_guard_pass_fn pass, void *arg,
                         pgd_metrics *metrics, pgd_http_guard **out);
int pgd_http_guard_port(const pgd_http_guard *g);
/* Stops accepting (the drain): the listening socket is closed; pending heads still finish. */
void pgd_http_guard_quiesce(pgd_http_guard *g);
/* Closes every handle (run the loop afterwards for their close callbacks), then frees g once
 * they have closed. */
void pgd_http_guard_close(pgd_http_guard *g);

#endif
