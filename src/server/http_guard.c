/* The front door (http_guard.h): the strict head check, and the connections waiting for their
 * first head. Each waiting connection is a uv_poll_t on its socket; one timer enforces the
 * deadlines. A refused connection is answered, shut for writing, and drained for up to two
 * seconds before it is closed, so that the unread head does not turn the close into a reset
 * that would discard the answer. */
#include "server/http_guard.h"

#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "api/openai.h"
#include "util/clock.h"

#define LINGER_MS 2000

/* ---- the head check ---- */

static bool tchar(unsigned char c) { /* RFC 9110 5.6.2 */
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c && strchr("!#$%&'*+-.^_`|~", c));
}

static int refuse(char *msg, size_t cap, pgd_reject_reason *why, pgd_reject_reason r, int st,
                  const char *text) {
    snprintf(msg, cap, "%s", text);
    *why = r;
    return st;
}

static bool name_is(const char *p, size_t n, const char *name) {
    return strlen(name) == n && !strncasecmp(p, name, n);
}

/* Trims optional whitespace (SP, HTAB) from both ends of [*p, *p + *n). */
static void trim_ows(const char **p, size_t *n) {
    while (*n && (**p == ' ' || **p == '\t')) (*p)++, (*n)--;
    while (*n && ((*p)[*n - 1] == ' ' || (*p)[*n - 1] == '\t')) (*n)--;
}

int pgd_http_head_check(const char *buf, size_t n, size_t max_body, char *msg, size_t msg_cap,
                        pgd_reject_reason *why) {
    /* Line endings first, over every byte seen: a bare CR or LF, or a NUL, is refused as soon
     * as it arrives (a head ended by bare CRs would otherwise never end). */
    size_t start = 0;
    while (start + 1 < n && buf[start] == '\r' && buf[start + 1] == '\n') start += 2; /* 9112 2.2 */
    size_t end = 0; /* the head's length once its blank line is found */
    for (size_t i = start; i < n && !end; i++) {
        unsigned char c = (unsigned char)buf[i];
        if (c == '\r' && i + 1 < n && buf[i + 1] != '\n')
            return refuse(msg, msg_cap, why, PGD_REJ_MALFORMED, 400,
                          "a bare CR in the request head (lines end with CRLF)");
        if (c == '\n' && (i == start || buf[i - 1] != '\r'))
            return refuse(msg, msg_cap, why, PGD_REJ_MALFORMED, 400,
                          "a bare LF in the request head (lines end with CRLF)");
        if (c == 0)
            return refuse(msg, msg_cap, why, PGD_REJ_MALFORMED, 400,
                          "a NUL byte in the request head");
        if (c == '\n' && i >= start + 3 && buf[i - 2] == '\n') end = i + 1;
    }
    /* The request line as soon as it is complete: HTTP/0.9 and HTTP/2 prefaces get their
     * answer without waiting for a blank line they may never send. */
    const char *line = buf + start, *eol = memchr(line, '\n', n - start);
    if (!eol) return PGD_HEAD_MORE;
    size_t ll = (size_t)(eol - line) - 1; /* without CRLF */
    const char *sp1 = memchr(line, ' ', ll);
    const char *sp2 = sp1 ? memchr(sp1 + 1, ' ', ll - (size_t)(sp1 + 1 - line)) : NULL;
    if (!sp1 || !sp2)
        return refuse(msg, msg_cap, why, PGD_REJ_MALFORMED, 400,
                      "the request line is not 'METHOD TARGET HTTP/1.1'");
    const char *ver = sp2 + 1;
    size_t vl = ll - (size_t)(ver - line);
    if (vl < 5 || strncmp(ver, "HTTP/", 5))
        return refuse(msg, msg_cap, why, PGD_REJ_MALFORMED, 400,
                      "the request line is not 'METHOD TARGET HTTP/1.1'");
    if (!(vl == 8 && (!strncmp(ver, "HTTP/1.1", 8) || !strncmp(ver, "HTTP/1.0", 8))))
        return refuse(msg, msg_cap, why, PGD_REJ_VERSION, 505,
                      "only HTTP/1.1 and HTTP/1.0 are served");
    bool http10 = ver[7] == '0';
    if (sp1 == line || sp1 - line > 32)
        return refuse(msg, msg_cap, why, PGD_REJ_MALFORMED, 400, "an invalid method");
    for (const char *p = line; p < sp1; p++)
        if (!tchar((unsigned char)*p))
            return refuse(msg, msg_cap, why, PGD_REJ_MALFORMED, 400, "an invalid method");
    if (sp2 == sp1 + 1)
        return refuse(msg, msg_cap, why, PGD_REJ_MALFORMED, 400, "an empty request target");
    for (const char *p = sp1 + 1; p < sp2; p++)
        if ((unsigned char)*p <= 0x20 || (unsigned char)*p >= 0x7f)
            return refuse(msg, msg_cap, why, PGD_REJ_MALFORMED, 400,
                          "a control, space or non-ASCII byte in the request target");
    if (!end) return PGD_HEAD_MORE;

    /* The header fields. */
    int n_host = 0, n_auth = 0, n_xkey = 0, n_te = 0, n_codings = 0;
    bool has_cl = false, chunked_last = false;
    unsigned long long cl = 0;
    for (const char *p = eol + 1; p < buf + end - 2;) {
        const char *e = memchr(p, '\r', (size_t)(buf + end - p)); /* (CRLF checked above) */
        if (*p == ' ' || *p == '\t')
            return refuse(msg, msg_cap, why, PGD_REJ_MALFORMED, 400,
                          "a folded header line (obs-fold, RFC 9112 5.2)");
        const char *colon = p;
        while (colon < e && *colon != ':') {
            if (!tchar((unsigned char)*colon))
                return refuse(msg, msg_cap, why, PGD_REJ_MALFORMED, 400,
                              *colon == ' ' || *colon == '\t'
                                  ? "whitespace between a header name and its colon"
                                  : "an invalid byte in a header name");
            colon++;
        }
        if (colon == e || colon == p)
            return refuse(msg, msg_cap, why, PGD_REJ_MALFORMED, 400,
                          "a header line without a name and a colon");
        const char *v = colon + 1;
        size_t vn = (size_t)(e - v), nn = (size_t)(colon - p);
        for (size_t i = 0; i < vn; i++) {
            unsigned char c = (unsigned char)v[i];
            if ((c < 0x20 && c != '\t') || c == 0x7f)
                return refuse(msg, msg_cap, why, PGD_REJ_MALFORMED, 400,
                              "a control byte in a header value");
        }
        trim_ows(&v, &vn);
        if (name_is(p, nn, "Host")) n_host++;
        else if (name_is(p, nn, "Authorization")) n_auth++;
        else if (name_is(p, nn, "x-api-key")) n_xkey++;
        else if (name_is(p, nn, "Content-Length")) {
            unsigned long long x = 0;
            size_t i = 0;
            for (; i < vn && v[i] >= '0' && v[i] <= '9'; i++) {
                if (x > (UINT64_MAX - 9) / 10) break; /* past 2^64: not a length we can take */
                x = x * 10 + (unsigned)(v[i] - '0');
            }
            if (!vn || i != vn)
                return refuse(msg, msg_cap, why, PGD_REJ_MALFORMED, 400,
                              "an invalid Content-Length (one decimal number)");
            if (has_cl && x != cl)
                return refuse(msg, msg_cap, why, PGD_REJ_SMUGGLING, 400,
                              "the request has Content-Length headers that disagree");
            has_cl = true, cl = x;
        } else if (name_is(p, nn, "Transfer-Encoding")) {
            n_te++;
            for (size_t i = 0; i < vn;) { /* a list of codings: only a lone "chunked" is read */
                size_t j = i;
                while (j < vn && v[j] != ',') j++;
                const char *c = v + i;
                size_t cn = j - i;
                trim_ows(&c, &cn);
                if (cn) n_codings++, chunked_last = cn == 7 && !strncasecmp(c, "chunked", 7);
                i = j + 1;
            }
        }
        p = e + 2;
    }
    if (n_host != 1 && !(http10 && n_host == 0))
        return refuse(msg, msg_cap, why, PGD_REJ_MALFORMED, 400,
                      n_host ? "more than one Host header" : "an HTTP/1.1 request without Host");
    if (n_auth > 1 || n_xkey > 1)
        return refuse(msg, msg_cap, why, PGD_REJ_MALFORMED, 400,
                      "more than one Authorization or x-api-key header");
    if (n_te) {
        if (has_cl)
            return refuse(msg, msg_cap, why, PGD_REJ_SMUGGLING, 400,
                          "both Content-Length and Transfer-Encoding (RFC 9112 6.1)");
        if (http10)
            return refuse(msg, msg_cap, why, PGD_REJ_SMUGGLING, 400,
                          "Transfer-Encoding in an HTTP/1.0 request (RFC 9112 6.1)");
        if (n_codings != 1 || !chunked_last)
            return refuse(msg, msg_cap, why, PGD_REJ_CODING, 501,
                          "the only transfer coding accepted is a lone 'chunked'");
        /* the first chunk's size, when it came with the head */
        unsigned long long x = 0;
        for (size_t i = end; i < n; i++) {
            int d = buf[i] >= '0' && buf[i] <= '9'   ? buf[i] - '0'
                    : buf[i] >= 'a' && buf[i] <= 'f' ? buf[i] - 'a' + 10
                    : buf[i] >= 'A' && buf[i] <= 'F' ? buf[i] - 'A' + 10
                                                     : -1;
            if (d < 0) break;
            x = x > max_body ? x : x * 16 + (unsigned)d; /* (saturates: stays > max_body) */
        }
        if (x > max_body) {
            snprintf(msg, msg_cap, "a chunk larger than the request body limit (%zu bytes)",
                     max_body);
            *why = PGD_REJ_TOO_LARGE;
            return 413;
        }
    }
    if (has_cl && cl > max_body) {
        snprintf(msg, msg_cap, "the request body exceeds %zu bytes", max_body);
        *why = PGD_REJ_TOO_LARGE;
        return 413;
    }
    return PGD_HEAD_OK;
}

/* ---- the waiting connections ---- */

typedef struct pending {
    uv_poll_t poll;
    struct pgd_http_guard *g;
    int fd;
    bool lingering;            /* answered: draining until the client closes */
    bool passed;               /* handed to MHD: the socket is not ours to close */
    double deadline;           /* pgd_now_s() seconds */
    struct sockaddr_storage addr;
    socklen_t addrlen;
    struct pending *prev, *next; /* oldest first */
} pending;

struct pgd_http_guard {
    uv_loop_t *loop;
    uv_poll_t listen;
    uv_timer_t timer;
    int listen_fd, port, n_pending, n_waiting; /* n_waiting: pending and not lingering */
    bool quiesced, closing;
    int open_handles;
    pgd_http_guard_cfg cfg;
    pgd_http_guard_pass_fn pass;
    void *arg;
    pgd_metrics *metrics;
    pending *head, *tail;
    char *peek;                /* (max_head_bytes + 32) */
};

static void handle_closed(uv_handle_t *h) {
    pgd_http_guard *g = h->data;
    if (h != (uv_handle_t *)&g->listen && h != (uv_handle_t *)&g->timer) {
        pending *p = (pending *)h;
        if (!p->passed) close(p->fd);
        free(p);
    }
    if (--g->open_handles == 0 && g->closing) {
        free(g->peek);
        free(g);
    }
}

static void drop(pending *p) {
    pgd_http_guard *g = p->g;
    if (p->prev) p->prev->next = p->next;
    else g->head = p->next;
    if (p->next) p->next->prev = p->prev;
    else g->tail = p->prev;
    g->n_pending--;
    if (!p->lingering) g->n_waiting--;
    uv_close((uv_handle_t *)&p->poll, handle_closed);
}

static const char *reason_phrase(int st) {
    switch (st) {
    case 400: return "Bad Request";
    case 408: return "Request Timeout";
    case 413: return "Content Too Large";
    case 431: return "Request Header Fields Too Large";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    default: return "HTTP Version Not Supported";
    }
}

static void linger_cb(uv_poll_t *h, int status, int events);

/* Answers p with st and an OpenAI error object, then lingers. */
static void answer(pending *p, int st, const char *message, pgd_reject_reason why) {
    pgd_http_guard *g = p->g;
    pgd_api_error e;
    pgd_api_error_set(&e, st, st >= 500 && st != 501 && st != 505 ? "server_error"
                                                                   : "invalid_request_error",
                      NULL,
                      st == 413                     ? "request_too_large"
                      : why == PGD_REJ_SMUGGLING      ? "bad_content_length"
                      : why == PGD_REJ_CODING         ? "unsupported_transfer_coding"
                      : why == PGD_REJ_VERSION        ? "http_version_not_supported"
                      : st == 408                     ? "request_timeout"
                      : st == 431 ? "header_too_large"
                      : st == 503 ? "too_many_connections"
                                  : "bad_request",
                      "%s", message);
    char *js = pgd_api_error_json(&e), head[256];
    const char *body = js ? js : "{}";
    int hn = snprintf(head, sizeof head,
                      "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %zu"
                      "\r\nConnection: close\r\n%s\r\n",
                      st, reason_phrase(st), strlen(body), st == 503 ? "Retry-After: 1\r\n" : "");
    /* (a few hundred bytes into an empty send buffer: one send takes them all) */
    if (send(p->fd, head, (size_t)hn, MSG_NOSIGNAL) == hn)
        (void)!send(p->fd, body, strlen(body), MSG_NOSIGNAL);
    free(js);
    shutdown(p->fd, SHUT_WR);
    pgd_metrics_count_reject(g->metrics, why);
    if (!p->lingering) g->n_waiting--;
    p->lingering = true;
    p->deadline = pgd_now_s() + LINGER_MS / 1000.0;
    uv_poll_start(&p->poll, UV_READABLE | UV_DISCONNECT, linger_cb);
}

static void linger_cb(uv_poll_t *h, int status, int events) {
    pending *p = (pending *)h;
    (void)events;
    char sink[4096];
    ssize_t r = status < 0 ? -1 : recv(p->fd, sink, sizeof sink, MSG_DONTWAIT);
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) drop(p);
}

static void head_cb(uv_poll_t *h, int status, int events) {
    pending *p = (pending *)h;
    pgd_http_guard *g = p->g;
    (void)events;
    size_t cap = g->cfg.max_head_bytes + 32; /* (+32: the first chunk's size after the head) */
    ssize_t r = status < 0 ? -1 : recv(p->fd, g->peek, cap, MSG_PEEK | MSG_DONTWAIT);
    if (r < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (r <= 0) { /* gone before its head was complete */
        drop(p);
        return;
    }
    char msg[160];
    pgd_reject_reason why = PGD_REJ_MALFORMED;
    int v = pgd_http_head_check(g->peek, (size_t)r, g->cfg.max_body_bytes, msg, sizeof msg, &why);
    if (v == PGD_HEAD_MORE && (size_t)r >= g->cfg.max_head_bytes) {
        v = 431, why = PGD_REJ_TOO_LARGE;
        snprintf(msg, sizeof msg, "the request head exceeds %zu bytes", g->cfg.max_head_bytes);
    }
    if (v == PGD_HEAD_MORE) return;
    if (v != PGD_HEAD_OK) {
        answer(p, v, msg, why);
        return;
    }
    uv_poll_stop(&p->poll);
    p->passed = true;
    g->pass(g->arg, p->fd, (struct sockaddr *)&p->addr, p->addrlen);
    drop(p);
}

static bool same_client(const struct sockaddr_storage *a, const struct sockaddr_storage *b) {
    if (a->ss_family != b->ss_family) return false;
    if (a->ss_family == AF_INET)
        return ((const struct sockaddr_in *)a)->sin_addr.s_addr ==
               ((const struct sockaddr_in *)b)->sin_addr.s_addr;
    return !memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr,
                   &((const struct sockaddr_in6 *)b)->sin6_addr, 16);
}

static void accept_cb(uv_poll_t *h, int status, int events) {
    pgd_http_guard *g = h->data;
    (void)events;
    if (status < 0) return;
    for (int k = 0; k < 64; k++) { /* (bounded: the loop's other work goes on between) */
        pending tmp;
        tmp.addrlen = sizeof tmp.addr;
        int fd = accept4(g->listen_fd, (struct sockaddr *)&tmp.addr, &tmp.addrlen,
                         SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) return;
        int same = 0;
        if (g->cfg.max_per_client > 0)
            for (pending *q = g->head; q; q = q->next)
                same += !q->lingering && same_client(&q->addr, &tmp.addr);
        pending *p = calloc(1, sizeof *p);
        if (!p || uv_poll_init(g->loop, &p->poll, fd)) {
            free(p);
            close(fd);
            continue;
        }
        g->open_handles++;
        p->poll.data = g;
        p->g = g;
        p->fd = fd;
        p->addr = tmp.addr;
        p->addrlen = tmp.addrlen;
        p->deadline = pgd_now_s() + g->cfg.head_timeout_ms / 1000.0;
        p->prev = g->tail;
        if (g->tail) g->tail->next = p;
        else g->head = p;
        g->tail = p;
        g->n_pending++, g->n_waiting++;
        if (g->cfg.max_per_client > 0 && same >= g->cfg.max_per_client) {
            answer(p, 503, "too many connections from this client address", PGD_REJ_PER_CLIENT);
            continue;
        }
        /* a full table: the connection that has waited longest for its head makes room (a
         * slow-header flood delays new clients by at most its eviction, never locks them out) */
        if (g->n_waiting > g->cfg.max_pending) {
            pending *old = g->head;
            while (old && old->lingering) old = old->next;
            if (old && old != p) {
                pgd_metrics_count_reject(g->metrics, PGD_REJ_EVICTED);
                drop(old);
            }
        }
        uv_poll_start(&p->poll, UV_READABLE | UV_DISCONNECT, head_cb);
    }
}

static void timer_cb(uv_timer_t *t) {
    pgd_http_guard *g = t->data;
    double now = pgd_now_s();
    for (pending *p = g->head, *next; p; p = next) {
        next = p->next;
        if (now < p->deadline) continue;
        if (p->lingering) drop(p);
        else answer(p, 408, "the request head did not arrive in time", PGD_REJ_HEAD_TIMEOUT);
    }
}

int pgd_http_guard_start(uv_loop_t *loop, const struct sockaddr *addr,
                         const pgd_http_guard_cfg *cfg, pgd_http_guard_pass_fn pass, void *arg,
                         pgd_metrics *metrics, pgd_http_guard **out) {
    pgd_http_guard *g = calloc(1, sizeof *g);
    if (!g) return -ENOMEM;
    g->loop = loop;
    g->cfg = *cfg;
    g->pass = pass;
    g->arg = arg;
    g->metrics = metrics;
    g->peek = malloc(cfg->max_head_bytes + 32);
    socklen_t alen = addr->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                                 : sizeof(struct sockaddr_in);
    int one = 1, err = 0;
    g->listen_fd = socket(addr->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (!g->peek || g->listen_fd < 0 ||
        setsockopt(g->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) ||
        bind(g->listen_fd, addr, alen) || listen(g->listen_fd, 4096)) {
        err = -errno;
        if (g->listen_fd >= 0) close(g->listen_fd);
        free(g->peek);
        free(g);
        return err ? err : -ENOMEM;
    }
    struct sockaddr_storage bound;
    socklen_t bl = sizeof bound;
    getsockname(g->listen_fd, (struct sockaddr *)&bound, &bl);
    g->port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                                : ((struct sockaddr_in *)&bound)->sin_port);
    uv_poll_init(loop, &g->listen, g->listen_fd);
    g->listen.data = g;
    uv_poll_start(&g->listen, UV_READABLE, accept_cb);
    uv_timer_init(loop, &g->timer);
    g->timer.data = g;
    uv_timer_start(&g->timer, timer_cb, 250, 250);
    g->open_handles = 2;
    *out = g;
    return 0;
}

int pgd_http_guard_port(const pgd_http_guard *g) { return g->port; }

void pgd_http_guard_quiesce(pgd_http_guard *g) {
    if (g->quiesced) return;
    g->quiesced = true;
    uv_poll_stop(&g->listen);
    close(g->listen_fd);
}

void pgd_http_guard_close(pgd_http_guard *g) {
    if (!g) return;
    pgd_http_guard_quiesce(g);
    g->closing = true;
    while (g->head) drop(g->head);
    uv_close((uv_handle_t *)&g->listen, handle_closed);
    uv_close((uv_handle_t *)&g->timer, handle_closed);
}
