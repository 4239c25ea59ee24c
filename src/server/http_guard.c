/* The front door (http_guard.h): the strict head check, and every client connection. Each
 * waits here for its first head, then is relayed to MHD through a socketpair: each later head
 * is checked where it lies in the socket (MSG_PEEK) before it is forwarded, each body framed
 * (Content-Length, or chunk by chunk), and MHD's answers pass back as they come, their framing
 * followed so that the next request goes to MHD only once the last answer is out. A refused
 * connection is answered, shut for writing, and drained for up to two seconds before it is
 * closed, so that the unread head does not turn the close into a reset that would discard the
 * answer. uv_poll_t handles on nonblocking sockets; one timer enforces the deadlines. */
#include "server/http_guard.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
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

/* How an accepted head frames its request: what the relay forwards. */
typedef struct frame {
    size_t start, end;      /* the empty lines before the request line; the head's end */
    unsigned long long cl;  /* the Content-Length (0 without one) */
    bool chunked, is_head;  /* a chunked body; a HEAD request (its answer has no body) */
} frame;

static int check_head(const char *buf, size_t n, size_t max_body, char *msg, size_t msg_cap,
                      pgd_reject_reason *why, frame *f) {
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
    f->start = start;
    f->end = end;
    f->cl = has_cl ? cl : 0;
    f->chunked = n_te > 0;
    f->is_head = sp1 - line == 4 && !memcmp(line, "HEAD", 4);
    return PGD_HEAD_OK;
}

int pgd_http_head_check(const char *buf, size_t n, size_t max_body, char *msg, size_t msg_cap,
                        pgd_reject_reason *why) {
    frame f;
    return check_head(buf, n, max_body, msg, msg_cap, why, &f);
}

/* ---- the connections ---- */

/* A connection's phase. */
enum {
    C_FIRST,   /* waiting for its first head (in g's pending list; counted in n_waiting) */
    C_RELAY,   /* relayed to and from MHD through a socketpair */
    C_CLOSING, /* MHD's side is closed: the rest of the answer goes out, then the shutdown */
    C_LINGER,  /* shut for writing: the client's bytes are read and dropped until it closes */
    C_DEAD,    /* closed (its handles' close callbacks pending) */
};
/* Where the client's bytes are in their request (the relay forwards only what passed). */
enum { RQ_HEAD, RQ_PASS, RQ_CHUNKED };
/* Where a chunked request body is (RQ_CHUNKED). */
enum { CS_SIZE, CS_EXT, CS_SIZE_LF, CS_DATA, CS_DATA_CR, CS_DATA_LF, CS_TRAILER, CS_TLINE,
       CS_TLINE_LF, CS_END_LF };
/* Where MHD's bytes are in their answer (the relay reads only its framing). */
enum { RS_HEAD, RS_BODY, RS_CSIZE, RS_CDATA, RS_CTRAILER, RS_TO_EOF };

/* Bytes read from one side that the other did not take yet (a pooled buffer, or none). */
typedef struct stash {
    char *buf;     /* (SCRATCH) or NULL when empty */
    uint32_t off, len;
} stash;

typedef struct conn {
    uv_poll_t poll, mpoll;       /* the client's socket; ours of the socketpair (C_RELAY on) */
    struct pgd_http_guard *g;
    int fd, mfd;                 /* the client's socket; ours of the pair (-1: none) */
    uint8_t phase, rq, cs, rs;
    uint8_t n_handles;           /* open uv handles: the conn is freed when none is left */
    bool relay;                  /* in g's relay list (else the pending list) */
    bool c_fin, c_eof;           /* the client shut its side (seen by poll; read to its end) */
    bool m_eof, m_wr_shut;       /* MHD's side ended; ours shut for writing */
    bool head_started;           /* a later head's first bytes came: its deadline runs */
    bool rs_no_body;             /* the current request is a HEAD: its answer has no body */
    bool rs_chunked, rs_has_cl;
    bool m_closes;               /* MHD's last answer said Connection: close: no next request */
    uint8_t lbn;                 /* bytes kept of the answer's current line (at most 40) */
    int lowat;                   /* SO_RCVLOWAT set while a head is incomplete (0: default) */
    int outstanding;             /* requests forwarded whose final answer has not ended */
    uint16_t rs_status, rs_line; /* the answer's status; its head's line number */
    uint32_t line_len;           /* a chunk-ext or trailer line's length so far */
    uint64_t left;               /* RQ_PASS: bytes to forward; CS_DATA: the chunk's rest */
    uint64_t skip;               /* empty lines before a request line, dropped */
    uint64_t csize, body;        /* the chunk size being read; a chunked body's bytes so far */
    uint64_t rs_left;            /* RS_BODY/RS_CDATA: bytes of the answer's body to pass */
    char lb[40];                 /* the start of the answer's current head line */
    bool then_chunked;           /* after RQ_PASS: a chunked body follows */
    stash in, out;               /* client -> MHD; MHD -> client */
    double deadline;             /* pgd_now_s() seconds */
    struct sockaddr_storage addr;
    socklen_t addrlen;
    struct conn *prev, *next;    /* in its list, oldest first */
} conn;

#define SCRATCH 16384 /* one read's bytes; a stash's capacity */
#define POOL_KEEP 64  /* free stash buffers kept for reuse (the rest go back to malloc) */

typedef struct list {
    conn *head, *tail;
} list;

struct pgd_http_guard {
    uv_loop_t *loop;
    uv_poll_t listen;
    uv_timer_t timer;
    int listen_fd, port, n_waiting; /* n_waiting: connections in C_FIRST */
    bool quiesced, closing;
    bool accept_paused;        /* out of descriptors: accepting again at the next tick */
    int open_handles;
    pgd_http_guard_cfg cfg;
    pgd_http_guard_pass_fn pass;
    void *arg;
    pgd_metrics *metrics;
    list pending;              /* connections that never passed a head (C_FIRST, or refused) */
    list relays;               /* connections handed to MHD */
    char *peek;                /* (max_head_bytes + 32) a head under check */
    char *scratch;             /* (SCRATCH) bytes on their way from one side to the other */
    char *free_bufs;           /* stash buffers for reuse, linked through their first bytes */
    int n_free;
};

static char *buf_get(pgd_http_guard *g) {
    char *b = g->free_bufs;
    if (!b) return malloc(SCRATCH);
    memcpy(&g->free_bufs, b, sizeof(char *));
    g->n_free--;
    return b;
}

static void buf_put(pgd_http_guard *g, char *b) {
    if (!b) return;
    if (g->n_free >= POOL_KEEP || g->closing) {
        free(b);
        return;
    }
    memcpy(b, &g->free_bufs, sizeof(char *));
    g->free_bufs = b;
    g->n_free++;
}

static void list_add(list *l, conn *c) {
    c->prev = l->tail;
    c->next = NULL;
    if (l->tail) l->tail->next = c;
    else l->head = c;
    l->tail = c;
}

static void list_remove(list *l, conn *c) {
    if (c->prev) c->prev->next = c->next;
    else l->head = c->next;
    if (c->next) c->next->prev = c->prev;
    else l->tail = c->prev;
    c->prev = c->next = NULL;
}

static void guard_handle_closed(pgd_http_guard *g) {
    if (--g->open_handles == 0 && g->closing) {
        while (g->free_bufs) {
            char *b = g->free_bufs;
            memcpy(&g->free_bufs, b, sizeof(char *));
            free(b);
        }
        free(g->peek);
        free(g->scratch);
        free(g);
    }
}

static void conn_handle_closed(uv_handle_t *h) {
    conn *c = h->data;
    pgd_http_guard *g = c->g;
    if (h == (uv_handle_t *)&c->mpoll) {
        close(c->mfd);
        c->mfd = -1;
    }
    if (--c->n_handles == 0) {
        close(c->fd);
        buf_put(g, c->in.buf);
        buf_put(g, c->out.buf);
        free(c);
    }
    guard_handle_closed(g);
}

static void listen_closed(uv_handle_t *h) { guard_handle_closed(h->data); }

/* Closes MHD's side: MHD reads EOF there, or fails its next write (a client that left). */
static void close_mhd_side(conn *c) {
    if (c->mfd < 0 || uv_is_closing((uv_handle_t *)&c->mpoll)) return;
    c->m_eof = c->m_wr_shut = true;
    buf_put(c->g, c->in.buf);
    c->in = (stash){0};
    uv_close((uv_handle_t *)&c->mpoll, conn_handle_closed);
}

/* Closes the connection now, both sides. */
static void drop(conn *c) {
    pgd_http_guard *g = c->g;
    if (uv_is_closing((uv_handle_t *)&c->poll)) return;
    list_remove(c->relay ? &g->relays : &g->pending, c);
    if (c->phase == C_FIRST) g->n_waiting--;
    c->phase = C_DEAD;
    close_mhd_side(c);
    uv_close((uv_handle_t *)&c->poll, conn_handle_closed);
}

static bool again(void) { return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR; }

/* Sends n bytes to fd; what it does not take now goes to st (empty before). Returns 0, or -1
 * when the peer is gone. */
static int send_or_stash(pgd_http_guard *g, int fd, const char *b, size_t n, stash *st) {
    ssize_t w = send(fd, b, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0 && !again()) return -1;
    if (w < 0) w = 0;
    if ((size_t)w < n) {
        if (!st->buf && !(st->buf = buf_get(g))) return -1;
        memcpy(st->buf, b + w, n - (size_t)w);
        st->off = 0;
        st->len = (uint32_t)(n - (size_t)w);
    }
    return 0;
}

/* Sends what st holds to fd. Returns 0 (st may still hold some), or -1 when the peer is gone. */
static int flush(pgd_http_guard *g, int fd, stash *st) {
    if (!st->len) return 0;
    ssize_t w = send(fd, st->buf + st->off, st->len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0) return again() ? 0 : -1;
    st->off += (uint32_t)w;
    st->len -= (uint32_t)w;
    if (!st->len) {
        buf_put(g, st->buf);
        *st = (stash){0};
    }
    return 0;
}

static void set_lowat(conn *c, int v) {
    if (c->lowat == v) return;
    int x = v ? v : 1;
    (void)setsockopt(c->fd, SOL_SOCKET, SO_RCVLOWAT, &x, sizeof x);
    c->lowat = v;
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

static void update(conn *c);
static void poll_cb(uv_poll_t *h, int status, int events);

/* Answers c with st and an OpenAI error object and closes it: MHD's side now (it is between
 * requests, or in one the client will not finish), the client's once the answer is out. */
static void answer(conn *c, int st, const char *message, pgd_reject_reason why) {
    pgd_http_guard *g = c->g;
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
    char *js = pgd_api_error_json(&e);
    const char *body = js ? js : "{}";
    int n = snprintf(g->scratch, SCRATCH,
                     "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %zu"
                     "\r\nConnection: close\r\n%s\r\n%s",
                     st, reason_phrase(st), strlen(body), st == 503 ? "Retry-After: 1\r\n" : "",
                     body);
    free(js);
    pgd_metrics_count_reject(g->metrics, why);
    set_lowat(c, 0);
    if (c->phase == C_FIRST) g->n_waiting--;
    close_mhd_side(c);
    c->phase = C_CLOSING;
    c->deadline = pgd_now_s() + LINGER_MS / 1000.0;
    /* (the out stash is empty here: a later head is read only once the last answer is out) */
    if (n < 0 || n >= SCRATCH || send_or_stash(g, c->fd, g->scratch, (size_t)n, &c->out)) {
        drop(c);
        return;
    }
    update(c);
}

/* ---- MHD's answers: their framing, so that the next request waits for its turn ---- */

static void answer_ended(conn *c) {
    if (c->outstanding > 0) c->outstanding--;
    c->rs = RS_HEAD;
    c->rs_line = 0;
    c->lbn = 0;
}

/* One line of an answer's head (the first 40 bytes of it in c->lb, c->lbn of them). */
static void answer_head_line(conn *c, bool empty) {
    if (empty) { /* the head's end */
        if (c->rs_status >= 100 && c->rs_status < 200) { /* 100 Continue: the answer follows */
            c->rs_line = 0;
            return;
        }
        if (c->rs_no_body || c->rs_status == 204 || c->rs_status == 304) answer_ended(c);
        else if (c->rs_chunked) c->rs = RS_CSIZE, c->rs_left = 0;
        else if (c->rs_has_cl && !c->rs_left) answer_ended(c);
        else c->rs = c->rs_has_cl ? RS_BODY : RS_TO_EOF;
        return;
    }
    if (c->rs_line++ == 0) {
        c->rs_chunked = c->rs_has_cl = false;
        c->rs_status = 0;
        for (int i = 9; i < 12 && i < c->lbn && c->lb[i] >= '0' && c->lb[i] <= '9'; i++)
            c->rs_status = (uint16_t)(c->rs_status * 10 + (c->lb[i] - '0'));
    } else if (c->lbn > 15 && !strncasecmp(c->lb, "Content-Length:", 15)) {
        c->rs_has_cl = true;
        c->rs_left = 0;
        for (int i = 15; i < c->lbn; i++)
            if (c->lb[i] >= '0' && c->lb[i] <= '9')
                c->rs_left = c->rs_left * 10 + (uint64_t)(c->lb[i] - '0');
    } else if (c->lbn > 11 && !strncasecmp(c->lb, "Connection:", 11)) {
        for (int i = 11; i + 5 <= c->lbn; i++)
            if (!strncasecmp(c->lb + i, "close", 5)) c->m_closes = true;
    } else if (c->lbn > 18 && !strncasecmp(c->lb, "Transfer-Encoding:", 18)) {
        for (int i = 18; i + 7 <= c->lbn; i++)
            if (!strncasecmp(c->lb + i, "chunked", 7)) c->rs_chunked = true;
    }
}

/* Follows the framing of n bytes of MHD's answers (MHD's own output: trusted, read lightly). */
static void scan_answer(conn *c, const char *b, size_t n) {
    for (size_t i = 0; i < n;) {
        switch (c->rs) {
        case RS_HEAD:
        case RS_CTRAILER:
            for (; i < n; i++) {
                char ch = b[i];
                if (ch == '\n') {
                    bool empty = c->lbn == 0;
                    if (c->rs == RS_HEAD) answer_head_line(c, empty);
                    else if (empty) answer_ended(c);
                    c->lbn = 0;
                    i++;
                    break;
                }
                if (ch != '\r' && c->lbn < sizeof c->lb) c->lb[c->lbn++] = ch;
                else if (ch != '\r') c->lbn = sizeof c->lb; /* (stays non-empty) */
            }
            break;
        case RS_BODY:
        case RS_CDATA: {
            size_t k = n - i < c->rs_left ? n - i : (size_t)c->rs_left;
            i += k;
            c->rs_left -= k;
            if (!c->rs_left) {
                if (c->rs == RS_BODY) answer_ended(c);
                else c->rs = RS_CSIZE, c->lbn = 0;
            }
            break;
        }
        case RS_CSIZE: /* "hex[;ext]\r\n": the size is its leading hex digits */
            for (; i < n; i++) {
                char ch = b[i];
                if (ch == '\n') {
                    i++;
                    c->rs = c->rs_left ? RS_CDATA : RS_CTRAILER;
                    if (c->rs_left) c->rs_left += 2; /* (the CRLF after the data) */
                    c->lbn = 0;
                    break;
                }
                int d = ch >= '0' && ch <= '9'   ? ch - '0'
                        : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10
                        : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10
                                                 : -1;
                if (!c->lbn && d >= 0 && c->rs_left < (1ull << 56))
                    c->rs_left = c->rs_left * 16 + (uint64_t)d;
                else if (ch != '\r') c->lbn = 1; /* past the digits: an extension */
            }
            break;
        default: /* RS_TO_EOF: the answer ends when MHD closes */
            i = n;
        }
    }
}

/* ---- the client's requests: each head checked, each body framed ---- */

/* Reads a chunked body's framing over n bytes of b (the client's, peeked). Returns the bytes
 * that belong to the body (all n, or up to its end), with *done set at its end; or -1 with
 * a refusal in *st, msg and *why. */
static long scan_chunks(conn *c, const char *b, size_t n, bool *done, int *st, char *msg,
                        size_t cap, pgd_reject_reason *why) {
    size_t max = c->g->cfg.max_body_bytes;
    *done = false;
    for (size_t i = 0; i < n;) {
        unsigned char ch = (unsigned char)b[i];
        switch (c->cs) {
        case CS_SIZE: {
            int d = ch >= '0' && ch <= '9'   ? ch - '0'
                    : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10
                    : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10
                                             : -1;
            if (d >= 0) {
                c->csize = c->csize * 16 + (uint64_t)d;
                c->line_len++;
                if (c->csize > max || c->body + c->csize > max) {
                    snprintf(msg, cap, "a chunked body larger than the limit (%zu bytes)", max);
                    *why = PGD_REJ_TOO_LARGE, *st = 413;
                    return -1;
                }
                i++;
                break;
            }
            if (!c->line_len) goto bad;
            if (ch == '\r') c->cs = CS_SIZE_LF, i++;
            else if (ch == ';' || ch == ' ' || ch == '\t') c->cs = CS_EXT;
            else goto bad;
            break;
        }
        case CS_EXT: /* chunk extensions: ignored, but no control bytes and not endless */
            if (ch == '\r') c->cs = CS_SIZE_LF;
            else if ((ch < 0x20 && ch != '\t') || ch == 0x7f || ++c->line_len > 4096) goto bad;
            i++;
            break;
        case CS_SIZE_LF:
            if (ch != '\n') goto bad;
            i++;
            c->line_len = 0;
            c->body += c->csize;
            c->left = c->csize;
            c->cs = c->csize ? CS_DATA : CS_TRAILER;
            c->csize = 0;
            break;
        case CS_DATA: {
            size_t k = n - i < c->left ? n - i : (size_t)c->left;
            i += k;
            c->left -= k;
            if (!c->left) c->cs = CS_DATA_CR;
            break;
        }
        case CS_DATA_CR:
        case CS_DATA_LF:
            if (ch != (c->cs == CS_DATA_CR ? '\r' : '\n')) goto bad;
            i++;
            c->cs = c->cs == CS_DATA_CR ? CS_DATA_LF : CS_SIZE;
            break;
        case CS_TRAILER: /* a trailer line starts, or the blank line that ends the body */
            if (ch == '\r') c->cs = CS_END_LF, i++;
            else c->cs = CS_TLINE;
            break;
        case CS_TLINE:
            if (ch == '\r') c->cs = CS_TLINE_LF;
            else if ((ch < 0x20 && ch != '\t') || ch == 0x7f ||
                     ++c->line_len > c->g->cfg.max_head_bytes)
                goto bad;
            i++;
            break;
        case CS_TLINE_LF:
        case CS_END_LF:
            if (ch != '\n') goto bad;
            i++;
            c->line_len = 0;
            if (c->cs == CS_END_LF) {
                *done = true;
                return (long)i;
            }
            c->cs = CS_TRAILER;
            break;
        }
    }
    return (long)n;
bad:
    snprintf(msg, cap, "a malformed chunk in the request body (RFC 9112 7.1)");
    *why = PGD_REJ_MALFORMED, *st = 400;
    return -1;
}

static void pass_first(conn *c);

/* The next head on the client's socket, checked where it lies (MSG_PEEK): a head that passed
 * sets up its framing, a refused one is answered; an incomplete one waits (SO_RCVLOWAT: the
 * socket polls readable again only when more comes, not on the same bytes). Returns whether
 * the relay goes on. */
static bool next_head(conn *c) {
    pgd_http_guard *g = c->g;
    size_t cap = g->cfg.max_head_bytes + 32; /* (+32: the first chunk's size after the head) */
    ssize_t r = recv(c->fd, g->peek, cap, MSG_PEEK | MSG_DONTWAIT);
    if (r < 0 && again()) return false;
    if (r <= 0) { /* the client is done (or gone) */
        if (c->phase == C_FIRST || r < 0) drop(c);
        else c->c_eof = true;
        return false;
    }
    char msg[160];
    pgd_reject_reason why = PGD_REJ_MALFORMED;
    frame f;
    int v = check_head(g->peek, (size_t)r, g->cfg.max_body_bytes, msg, sizeof msg, &why, &f);
    if (v == PGD_HEAD_MORE && (size_t)r >= g->cfg.max_head_bytes) {
        v = 431, why = PGD_REJ_TOO_LARGE;
        snprintf(msg, sizeof msg, "the request head exceeds %zu bytes", g->cfg.max_head_bytes);
    }
    if (v == PGD_HEAD_MORE) {
        if (c->c_fin) { /* the client shut its side with half a head: nothing more will come */
            if (c->phase == C_FIRST) drop(c);
            else c->c_eof = true;
            return false;
        }
        if (!c->head_started && c->phase == C_RELAY) {
            c->head_started = true;
            c->deadline = pgd_now_s() + g->cfg.head_timeout_ms / 1000.0;
        }
        set_lowat(c, (int)r + 1);
        return false;
    }
    if (v != PGD_HEAD_OK) {
        answer(c, v, msg, why);
        return false;
    }
    set_lowat(c, 0);
    c->head_started = false;
    c->skip = f.start;
    c->left = f.end - f.start + (f.chunked ? 0 : f.cl);
    c->then_chunked = f.chunked;
    c->rs_no_body = f.is_head;
    c->rq = RQ_PASS;
    c->outstanding++;
    if (c->phase == C_FIRST) pass_first(c);
    return c->phase == C_RELAY;
}

/* Moves the client's bytes to MHD as far as their framing, MHD's turn and the socket buffers
 * allow (a bounded number of reads, so that other connections get theirs). */
static void forward(conn *c) {
    pgd_http_guard *g = c->g;
    for (int k = 0; k < 16 && c->phase == C_RELAY; k++) {
        if (c->in.len) {
            if (flush(g, c->mfd, &c->in)) { /* MHD closed: its answer is still to be read */
                buf_put(g, c->in.buf);
                c->in = (stash){0};
                c->m_wr_shut = true;
            }
            if (c->in.len) return;
        }
        if (c->m_wr_shut) return;
        if (c->c_eof) { /* the client's end, after what it sent in full */
            shutdown(c->mfd, SHUT_WR);
            c->m_wr_shut = true;
            return;
        }
        ssize_t r;
        switch (c->rq) {
        case RQ_HEAD:
            /* one request at a time: the next head is read once the last answer is out */
            if (c->outstanding || c->out.len || c->m_eof || c->m_closes) {
                if (c->c_fin) c->c_eof = true; /* (what it sent after goes unanswered) */
                if (c->c_fin) continue;
                return;
            }
            if (!next_head(c)) {
                if (c->c_eof && c->phase == C_RELAY) continue;
                return;
            }
            break;
        case RQ_PASS:
            if (c->skip) { /* (empty lines before a request line are not forwarded) */
                r = recv(c->fd, g->scratch, c->skip < SCRATCH ? c->skip : SCRATCH, MSG_DONTWAIT);
                if (r > 0) c->skip -= (uint64_t)r;
            } else {
                r = recv(c->fd, g->scratch, c->left < SCRATCH ? c->left : SCRATCH, MSG_DONTWAIT);
                if (r > 0) {
                    c->left -= (uint64_t)r;
                    if (send_or_stash(g, c->mfd, g->scratch, (size_t)r, &c->in))
                        c->m_wr_shut = true;
                }
            }
            if (r < 0 && again()) return;
            if (r < 0) {
                drop(c);
                return;
            }
            if (r == 0) c->c_eof = true;
            else if (!c->skip && !c->left) {
                c->rq = c->then_chunked ? RQ_CHUNKED : RQ_HEAD;
                c->cs = CS_SIZE;
                c->csize = c->body = 0;
                c->line_len = 0;
            }
            break;
        case RQ_CHUNKED: {
            r = recv(c->fd, g->scratch, SCRATCH, MSG_PEEK | MSG_DONTWAIT);
            if (r < 0 && again()) return;
            if (r < 0) {
                drop(c);
                return;
            }
            if (r == 0) {
                c->c_eof = true;
                break;
            }
            bool done;
            int st = 400;
            char msg[160];
            pgd_reject_reason why = PGD_REJ_MALFORMED;
            long used = scan_chunks(c, g->scratch, (size_t)r, &done, &st, msg, sizeof msg, &why);
            if (used < 0) {
                /* MHD has part of this request and no answer yet: ours is the answer */
                if (c->out.len || c->rs != RS_HEAD || c->rs_line) drop(c);
                else answer(c, st, msg, why);
                return;
            }
            r = recv(c->fd, g->scratch, (size_t)used, MSG_DONTWAIT); /* (the same bytes) */
            if (r != used) {
                drop(c);
                return;
            }
            if (send_or_stash(g, c->mfd, g->scratch, (size_t)r, &c->in)) c->m_wr_shut = true;
            if (done) c->rq = RQ_HEAD;
            break;
        }
        }
    }
}

/* Moves MHD's bytes to the client as they come (no holding back: SSE events go out as MHD
 * writes them), a bounded number of reads a call. */
static void backward(conn *c) {
    pgd_http_guard *g = c->g;
    if (c->out.len && flush(g, c->fd, &c->out)) {
        drop(c);
        return;
    }
    if (c->out.len || c->m_eof) c->deadline = pgd_now_s() + 10 * LINGER_MS / 1000.0;
    for (int k = 0; k < 16 && !c->out.len && !c->m_eof; k++) {
        ssize_t r = recv(c->mfd, g->scratch, SCRATCH, MSG_DONTWAIT);
        if (r < 0 && again()) break;
        if (r <= 0) {
            c->m_eof = true;
            break;
        }
        scan_answer(c, g->scratch, (size_t)r);
        if (send_or_stash(g, c->fd, g->scratch, (size_t)r, &c->out)) {
            drop(c);
            return;
        }
    }
}

static void lingering(conn *c) {
    set_lowat(c, 0); /* (the drain reads whatever comes) */
    c->phase = C_LINGER;
    c->deadline = pgd_now_s() + LINGER_MS / 1000.0;
    shutdown(c->fd, SHUT_WR);
}

/* Sets what each socket is polled for, from what the connection waits for. */
static void update(conn *c) {
    if (uv_is_closing((uv_handle_t *)&c->poll)) return;
    if (c->phase == C_CLOSING && !c->out.len) lingering(c);
    int ev = 0, mev = 0;
    switch (c->phase) {
    case C_FIRST: ev = UV_READABLE | (c->c_fin ? 0 : UV_DISCONNECT); break;
    case C_CLOSING: ev = UV_WRITABLE; break;
    case C_LINGER: ev = UV_READABLE; break;
    case C_RELAY: {
        bool want = !c->c_eof && !c->in.len && !c->m_wr_shut &&
                    (c->rq != RQ_HEAD ||
                     (!c->outstanding && !c->out.len && !c->m_eof && !c->m_closes));
        ev = (want ? UV_READABLE : 0) | (c->c_fin || c->c_eof ? 0 : UV_DISCONNECT) |
             (c->out.len ? UV_WRITABLE : 0);
        mev = (c->out.len || c->m_eof ? 0 : UV_READABLE) | (c->in.len ? UV_WRITABLE : 0);
        break;
    }
    }
    if (ev) uv_poll_start(&c->poll, ev, poll_cb);
    else uv_poll_stop(&c->poll);
    if (c->mfd >= 0 && !uv_is_closing((uv_handle_t *)&c->mpoll)) {
        if (mev) uv_poll_start(&c->mpoll, mev, poll_cb);
        else uv_poll_stop(&c->mpoll);
    }
}

/* One step of a relayed connection: each direction as far as it goes, then what ends. */
static void relay_step(conn *c) {
    backward(c);
    if (uv_is_closing((uv_handle_t *)&c->poll)) return;
    forward(c);
    if (uv_is_closing((uv_handle_t *)&c->poll)) return;
    if (c->phase == C_RELAY && c->m_eof && !c->out.len) {
        /* MHD closed (an answer with Connection: close, a timeout, a client it gave up on) */
        close_mhd_side(c);
        c->phase = C_CLOSING;
    }
    update(c);
}

static void poll_cb(uv_poll_t *h, int status, int events) {
    conn *c = h->data;
    pgd_http_guard *g = c->g;
    if (status < 0 && h == &c->poll) {
        drop(c);
        return;
    }
    if (status < 0) c->m_eof = true;
    if (h == &c->poll && (events & UV_DISCONNECT)) c->c_fin = true;
    switch (c->phase) {
    case C_FIRST:
        next_head(c);
        if (uv_is_closing((uv_handle_t *)&c->poll)) return;
        if (c->phase == C_RELAY) relay_step(c);
        else update(c);
        break;
    case C_RELAY: relay_step(c); break;
    case C_CLOSING:
        c->deadline = pgd_now_s() + LINGER_MS / 1000.0; /* (a client that reads gets its time) */
        if (flush(g, c->fd, &c->out)) drop(c);
        else update(c);
        break;
    case C_LINGER: {
        ssize_t r = recv(c->fd, g->scratch, SCRATCH, MSG_DONTWAIT);
        if (r == 0 || (r < 0 && !again())) drop(c);
        break;
    }
    }
}

/* The first head passed: MHD gets the other end of a socketpair, with the client's address
 * (its per-address limit and the logs read that), and this connection relays. */
static void pass_first(conn *c) {
    pgd_http_guard *g = c->g;
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv)) {
        drop(c);
        return;
    }
    if (uv_poll_init(g->loop, &c->mpoll, sv[0])) {
        close(sv[0]), close(sv[1]);
        drop(c);
        return;
    }
    c->mpoll.data = c;
    c->n_handles++;
    g->open_handles++;
    c->mfd = sv[0];
    list_remove(&g->pending, c);
    list_add(&g->relays, c);
    c->relay = true;
    c->phase = C_RELAY;
    g->n_waiting--;
    uv_poll_start(&c->mpoll, UV_READABLE, poll_cb);
    /* the head goes into the pair before MHD is told of it, so it reads it at once */
    forward(c);
    if (c->phase == C_DEAD) close(sv[1]);
    else g->pass(g->arg, sv[1], (struct sockaddr *)&c->addr, c->addrlen);
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
        struct sockaddr_storage addr;
        socklen_t addrlen = sizeof addr;
        int fd = accept4(g->listen_fd, (struct sockaddr *)&addr, &addrlen,
                         SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0 && (errno == EMFILE || errno == ENFILE)) { /* (else it polls readable on) */
            uv_poll_stop(&g->listen);
            g->accept_paused = true;
        }
        if (fd < 0) return;
        int one = 1; /* (the relay writes what MHD wrote, when it wrote it: no Nagle delay) */
        (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        int same = 0;
        if (g->cfg.max_per_client > 0)
            for (conn *q = g->pending.head; q; q = q->next)
                same += q->phase == C_FIRST && same_client(&q->addr, &addr);
        conn *c = calloc(1, sizeof *c);
        if (!c || uv_poll_init(g->loop, &c->poll, fd)) {
            free(c);
            close(fd);
            continue;
        }
        g->open_handles++;
        c->n_handles = 1;
        c->poll.data = c;
        c->g = g;
        c->fd = fd;
        c->mfd = -1;
        c->addr = addr;
        c->addrlen = addrlen;
        c->phase = C_FIRST;
        c->deadline = pgd_now_s() + g->cfg.head_timeout_ms / 1000.0;
        list_add(&g->pending, c);
        g->n_waiting++;
        uv_poll_start(&c->poll, UV_READABLE | UV_DISCONNECT, poll_cb);
        if (g->cfg.max_per_client > 0 && same >= g->cfg.max_per_client) {
            answer(c, 503, "too many connections from this client address", PGD_REJ_PER_CLIENT);
            continue;
        }
        /* a full table: the connection that has waited longest for its head makes room (a
         * slow-header flood delays new clients by at most its eviction, never locks them out) */
        if (g->n_waiting > g->cfg.max_pending) {
            conn *old = g->pending.head;
            while (old && old->phase != C_FIRST) old = old->next;
            if (old && old != c) {
                pgd_metrics_count_reject(g->metrics, PGD_REJ_EVICTED);
                drop(old);
            }
        }
    }
}

static void expire(list *l, double now) {
    for (conn *c = l->head, *next; c; c = next) {
        next = c->next;
        if (now < c->deadline) continue;
        if (c->phase == C_FIRST || (c->phase == C_RELAY && c->head_started && !c->m_eof))
            answer(c, 408, "the request head did not arrive in time", PGD_REJ_HEAD_TIMEOUT);
        else if (c->phase != C_RELAY || c->m_eof) /* (an answer its client does not read) */
            drop(c);
    }
}

static void timer_cb(uv_timer_t *t) {
    pgd_http_guard *g = t->data;
    double now = pgd_now_s();
    if (g->accept_paused && !g->quiesced) {
        g->accept_paused = false;
        uv_poll_start(&g->listen, UV_READABLE, accept_cb);
    }
    expire(&g->pending, now);
    expire(&g->relays, now);
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
    g->scratch = malloc(SCRATCH);
    socklen_t alen = addr->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                                 : sizeof(struct sockaddr_in);
    int one = 1, err = 0;
    g->listen_fd = socket(addr->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (!g->peek || !g->scratch || g->listen_fd < 0 ||
        setsockopt(g->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) ||
        bind(g->listen_fd, addr, alen) || listen(g->listen_fd, 4096)) {
        err = -errno;
        if (g->listen_fd >= 0) close(g->listen_fd);
        free(g->peek);
        free(g->scratch);
        free(g);
        return err ? err : -ENOMEM;
    }
    /* a relayed connection holds three descriptors (the client's, the pair's two): the soft
     * limit is raised to fit max_pending of them, within the hard limit */
    struct rlimit rl;
    rlim_t want = (rlim_t)cfg->max_pending * 3 + 256;
    if (!getrlimit(RLIMIT_NOFILE, &rl) && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < want) {
        rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > want ? want : rl.rlim_max;
        (void)setrlimit(RLIMIT_NOFILE, &rl);
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

void pgd_http_guard_mhd_log(void *arg, const char *fmt, va_list ap) {
    (void)arg;
    if (strstr(fmt, "option to %s state failed") || strstr(fmt, "Failed to push the data")) return;
    vfprintf(stderr, fmt, ap);
}

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
    /* MHD has stopped: the last it wrote (the drain's 503s) is in the pairs; it goes out as far
     * as each client's socket takes it now */
    for (conn *c = g->relays.head, *next; c; c = next) {
        next = c->next;
        if (c->phase != C_RELAY) continue;
        backward(c);
        if (c->phase == C_RELAY) shutdown(c->fd, SHUT_WR);
    }
    while (g->pending.head) drop(g->pending.head);
    while (g->relays.head) drop(g->relays.head);
    uv_close((uv_handle_t *)&g->listen, listen_closed);
    uv_close((uv_handle_t *)&g->timer, listen_closed);
}
