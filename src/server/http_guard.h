/* The front door: every request head, the first of a connection and each later one, is read
 * with MSG_PEEK (nothing is consumed) and checked strictly (RFC 9110/9112) before libmicrohttpd
 * sees it, so what MHD 0.9.75 mishandles (a malformed Content-Length answered with two header
 * blocks, bare CR, NUL cutting a path, unknown transfer codings left unanswered) gets one
 * well-formed answer from here. The guard keeps the client's socket and hands MHD one end of a
 * socketpair (MHD_add_connection, with the client's address) through which it relays: heads
 * that passed and their bodies one way, MHD's answers the other, one request at a time.
 * Connections still without a complete head wait here, not in MHD's table: each has a
 * deadline, each client address a limit, and a full table evicts its oldest to admit a new
 * client. Runs on the I/O thread's libuv loop. */
#ifndef PGD_SERVER_HTTP_GUARD_H
#define PGD_SERVER_HTTP_GUARD_H

#include <stdbool.h>
#include <stdarg.h>
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

/* Called with MHD's end of each connection whose first head passed (a Unix socketpair's end;
 * addr: the client's); takes the socket. */
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
/* After MHD_stop_daemon: relays the last MHD wrote as far as the clients' sockets take it now,
 * closes every handle (run the loop afterwards for their close callbacks), and frees g once
 * they have closed. */
void pgd_http_guard_close(pgd_http_guard *g);

/* MHD's error log (MHD_OPTION_EXTERNAL_LOGGER) to stderr, less what the relay's socketpair makes
 * MHD 0.9.75 say at every answer: that TCP_NODELAY and TCP_CORK fail (a Unix socket has
 * neither, and needs neither: the relay writes each piece to the client as it comes). */
void pgd_http_guard_mhd_log(void *arg, const char *fmt, va_list ap);

#endif
