"""The server under load, on stories260K (tiny, fast): 32 streaming clients that drop mid-stream
leave nothing running and no KV block allocated; 256 concurrent streaming clients all get the
same greedy text as when each request runs alone, over 5 rounds without memory growth; SIGTERM
during load finishes every accepted request, refuses new ones and exits 0."""
import asyncio
import json
import socket
import threading
import time

import pytest
import requests

from server_util import STORIES, Server, is_sanitized, sse_events, validate

httpx = pytest.importorskip("httpx")

NAMES = ["Lily", "Tom", "Sue", "Ben", "Max", "Anna", "Tim", "Sam", "Mia", "Jack", "Lucy", "Bob",
         "Zoe", "Leo", "Amy", "Dan"]
PLACES = ["park", "garden", "forest", "house", "school", "river", "beach", "farm"]


def make_requests(n):
    """n distinct greedy requests of different lengths (some stop at EOS, some at max_tokens)."""
    out = []
    for i in range(n):
        prompt = f"Once upon a time, {NAMES[i % 16]} went to the {PLACES[(i // 16) % 8]}"
        if i >= 128:
            prompt += " with a friend"
        out.append({"prompt": prompt, "max_tokens": 8 + (i * 7) % 56, "temperature": 0})
    return out


def run_alone(server, reqs):
    texts = []
    for body in reqs:
        r = requests.post(server.url("/v1/completions"), json=body, timeout=60)
        assert r.status_code == 200, r.text
        texts.append(r.json()["choices"][0]["text"])
    return texts


async def stream_one(client, url, body):
    """One streaming completion; returns (text, finish_reason, n_text_chunks, usage)."""
    text, finish, usage = "", None, None
    async with client.stream("POST", url, json=dict(body, stream=True,
                                                    stream_options={"include_usage": True})) as r:
        if r.status_code != 200:
            return None, f"HTTP {r.status_code}: {(await r.aread())[:300]!r}", 0, None
        lines = [line async for line in r.aiter_lines()]
    for ev in sse_events(lines):
        if ev == "[DONE]":
            break
        if ev.get("usage"):
            usage = ev["usage"]
        for ch in ev["choices"]:
            text += ch["text"]
            finish = ch["finish_reason"] or finish
    return text, finish, len(lines), usage


async def stream_all(url, reqs):
    limits = httpx.Limits(max_connections=len(reqs) + 8, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=httpx.Timeout(300.0), limits=limits) as client:
        return await asyncio.gather(*(stream_one(client, url, b) for b in reqs),
                                    return_exceptions=True)


def idle(m):
    return m["pagoda:num_requests_running"] == 0 and m["pagoda:num_requests_waiting"] == 0 and \
        m["pagoda:kv_cache_blocks_used"] == 0


@pytest.fixture(scope="module")
def server():
    # A small KV pool (819 blocks of 16 tokens, ~13k tokens): the pool is touched lazily and the
    # free list is LRU-ordered, so with the default 512 MiB each round would touch (and add to
    # RSS) blocks never used before, which looks like a leak but is not. With 16 MiB the first
    # round touches the whole pool, so rounds 2 and 3 compare like with like.
    s = Server(STORIES, "--max-num-seqs", "64", "--kv-cache-memory", "16MiB")
    s.start()
    yield s
    s.stop()


def open_stream(port, body):
    """A raw HTTP/1.1 streaming request; returns the socket after the first SSE bytes arrived."""
    data = json.dumps(dict(body, stream=True)).encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
    got = b""
    while b"data: " not in got:
        chunk = s.recv(4096)
        assert chunk, f"closed before streaming: {got[:300]!r}"
        got += chunk
    return s


def test_disconnect_frees_everything(server):
    before = server.metrics()
    body = {"prompt": "Once upon a time", "max_tokens": 480, "temperature": 0.8,
            "ignore_eos": True}
    socks = [None] * 32
    errors = []

    def opener(i):
        try:
            socks[i] = open_stream(server.port, body)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))
    threads = [threading.Thread(target=opener, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    mid = server.metrics()
    assert mid["pagoda:num_requests_running"] + mid["pagoda:num_requests_waiting"] > 0
    for s in socks:  # drop mid-stream: a reset, as a killed client would leave
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        s.close()
    m = server.wait_metrics(idle, timeout=30)
    assert m["pagoda:num_requests_running"] == 0, m
    assert m["pagoda:num_requests_waiting"] == 0, m
    assert m["pagoda:kv_cache_blocks_used"] == 0, m
    aborted = m["pagoda:request_success_total{finished_reason=abort}"] - \
        before["pagoda:request_success_total{finished_reason=abort}"]
    assert aborted >= 16, f"only {aborted} of 32 dropped streams were aborted"
    # and the server still answers
    r = requests.post(server.url("/v1/completions"),
                      json={"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0},
                      timeout=60)
    assert r.status_code == 200


def test_dropped_stream_logged_as_client_closed(server):
    """The access log line of a stream the client dropped says 499 (nginx's "client closed
    request"), not 200, and counts the tokens generated before the drop, not 0."""
    sk = open_stream(server.port, {"prompt": "Once upon a time", "max_tokens": 480,
                                   "temperature": 0, "ignore_eos": True})
    got = b""
    while got.count(b"data: ") < 4:
        got += sk.recv(4096)
    rid = json.loads(got.split(b"data: ")[1].split(b"\n")[0])["id"]
    sk.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    sk.close()
    server.wait_metrics(idle, timeout=30)
    deadline = time.time() + 10
    while True:
        lines = [json.loads(x) for x in server.stderr().splitlines()
                 if x.startswith('{"event":"request"') and rid in x]
        if lines or time.time() > deadline:
            break
        time.sleep(0.1)
    assert len(lines) == 1, lines
    assert lines[0]["status"] == 499 and lines[0]["client_closed"] is True, lines[0]
    assert 3 <= lines[0]["completion_tokens"] < 480, lines[0]


ROUNDS = 5


def test_256_concurrent_streams_five_rounds(server):
    reqs = make_requests(256)
    expected = run_alone(server, reqs)
    rss = []
    for rnd in range(ROUNDS):
        t0 = time.time()
        results = asyncio.run(stream_all(server.url("/v1/completions"), reqs))
        errors = [(i, r) for i, r in enumerate(results) if isinstance(r, BaseException) or
                  r[0] is None]
        assert not errors, f"round {rnd}: {len(errors)} failed, first: {errors[:3]}"
        wrong = [i for i, r in enumerate(results) if r[0] != expected[i]]
        assert not wrong, (f"round {rnd}: {len(wrong)} outputs differ from the request run "
                           f"alone, e.g. #{wrong[0]}: {results[wrong[0]][0]!r} != "
                           f"{expected[wrong[0]]!r}")
        for i, (text, finish, _, usage) in enumerate(results):
            assert finish in ("stop", "length")
            assert usage and usage["completion_tokens"] <= reqs[i]["max_tokens"]
            if finish == "length":
                assert usage["completion_tokens"] == reqs[i]["max_tokens"]
        m = server.wait_metrics(idle, timeout=30)
        assert idle(m), m
        rss.append(server.rss_kib())
        print(f"round {rnd}: {time.time() - t0:.1f}s, RSS {rss[-1]} KiB")
    if is_sanitized(server.binary):
        return  # ASan keeps freed memory in quarantine; leaks are LeakSanitizer's job there
    # A leak raises RSS every round, so the last round must not pass the highest of the rounds
    # after the first (which warms the allocator and the pool) by more than 5%. Comparing two
    # single rounds was not enough: the heap's size after a round of 256 streams varies by a few
    # MiB (a CI run saw 41864, 39444, 42044 KiB: round 2 6.6% above round 1, 0.4% above round 0).
    peak = max(rss[1:-1])
    assert rss[-1] <= 1.05 * peak, f"RSS grew across rounds: {rss} KiB"


def test_sigterm_during_load_drains():
    s = Server(STORIES, "--max-num-seqs", "16", "--drain-timeout", "60")
    s.start()
    try:
        reqs = [{"prompt": f"Once upon a time, {NAMES[i % 16]} saw a", "max_tokens": 200,
                 "temperature": 0, "ignore_eos": True} for i in range(48)]
        expected = run_alone(s, reqs[:16])
        results = [None] * len(reqs)
        started = threading.Barrier(len(reqs) + 1)

        def client(i):
            text, finish = "", None
            try:
                with requests.post(s.url("/v1/completions"), json=dict(reqs[i], stream=True),
                                   stream=True, timeout=120) as r:
                    first = True
                    for ev in sse_events(r.iter_lines()):
                        if first:  # accepted: the response headers and a first event came
                            started.wait(timeout=60)
                            first = False
                        if ev == "[DONE]":
                            break
                        text += ev["choices"][0]["text"]
                        finish = ev["choices"][0]["finish_reason"] or finish
                results[i] = (text, finish)
            except Exception as e:  # noqa: BLE001 - reported below
                results[i] = e
                started.abort()
        threads = [threading.Thread(target=client, args=(i,)) for i in range(len(reqs))]
        for t in threads:
            t.start()
        started.wait(timeout=60)  # every request has been accepted and is streaming
        s.proc.send_signal(15)
        # new requests are refused: connection refused, or a 503 error object. The server sees
        # the signal when its event loop next runs (libuv), so on a loaded machine a request
        # sent right after kill() may still be accepted; it must then be served in full, and
        # once one request has been refused every later one must be too.
        deadline = time.time() + 5
        refused = 0
        probe = dict(reqs[0], max_tokens=1)
        while time.time() < deadline and refused < 3:
            try:
                r = requests.post(s.url("/v1/completions"), json=probe, timeout=10)
                if r.status_code == 200 and refused == 0:
                    assert r.json()["choices"][0]["finish_reason"] == "length"
                    continue
                assert r.status_code == 503, f"a request after SIGTERM got {r.status_code}"
                assert r.json()["error"]["message"]
                assert r.headers.get("Retry-After")
            except requests.ConnectionError:
                pass
            refused += 1
        assert refused >= 1
        for t in threads:
            t.join(timeout=120)
        bad = [(i, r) for i, r in enumerate(results) if not isinstance(r, tuple)]
        assert not bad, f"{len(bad)} accepted requests failed during the drain: {bad[:3]}"
        for i, (text, finish) in enumerate(results):
            assert finish == "length", (i, finish)
            assert text == expected[i % 16], f"#{i} was cut or changed during the drain"
        s.proc.wait(timeout=60)
    finally:
        err = s.stop(check=False)
    assert s.exit_code == 0, err[-3000:]
    assert '"event":"draining"' in err and '"event":"stopped"' in err
    import server_util
    server_util.check_no_sanitizer_report(err)


def test_drain_timeout_answers_waiting_requests_with_503(default_model):
    """A non-streaming request still running when --drain-timeout passes gets a 503 error object
    (code shutting_down, Retry-After), not a closed connection; a stream ends with an error event
    and [DONE]; the access log says 503 and the server exits 0."""
    s = Server(default_model, "--drain-timeout", "1")
    s.start()
    try:
        out = {}
        body = {"prompt": "Once", "max_tokens": 2000, "ignore_eos": True, "temperature": 0}

        def client():
            try:
                out["r"] = requests.post(s.url("/v1/completions"), timeout=60, json=body)
            except Exception as e:  # noqa: BLE001 - reported below
                out["r"] = e

        def streamer():
            try:
                with requests.post(s.url("/v1/completions"), json=dict(body, stream=True),
                                   stream=True, timeout=60) as r:
                    out["events"] = list(sse_events(r.iter_lines()))
            except Exception as e:  # noqa: BLE001 - reported below
                out["events"] = e
        t, u = threading.Thread(target=client), threading.Thread(target=streamer)
        t.start()
        u.start()
        s.wait_metrics(lambda m: m["pagoda:num_requests_running"] >= 2, timeout=30)
        t0 = time.time()
        s.proc.send_signal(15)
        t.join(timeout=60)
        u.join(timeout=60)
        ev = out["events"]
        assert isinstance(ev, list) and ev[-1] == "[DONE]", ev
        assert ev[-2]["error"]["code"] == "shutting_down", ev[-2]
        validate(ev[-2], "ErrorResponse")
        assert all("choices" in e for e in ev[:-2])
        r = out["r"]
        assert isinstance(r, requests.Response), r
        assert r.status_code == 503, r.text
        validate(r.json(), "ErrorResponse")
        assert r.json()["error"]["code"] == "shutting_down"
        assert r.headers.get("Retry-After")
        assert time.time() - t0 < 20
        s.proc.wait(timeout=30)
    finally:
        err = s.stop(check=False)
    assert s.exit_code == 0, err[-3000:]
    assert '"event":"drain_timeout"' in err
    assert '"status":503' in err, err[-2000:]
    import server_util
    server_util.check_no_sanitizer_report(err)


def test_queue_full_429_retry_after():
    """Beyond --max-waiting, requests get 429 with Retry-After and an error object; the others
    complete, and the server is idle afterwards."""
    s = Server(STORIES, "--max-num-seqs", "1", "--max-waiting", "2")
    s.start()
    try:
        body = {"prompt": "Once upon a time", "max_tokens": 100, "ignore_eos": True,
                "temperature": 0}
        out = [None] * 12

        def client(i):
            out[i] = requests.post(s.url("/v1/completions"), json=body, timeout=120)
        threads = [threading.Thread(target=client, args=(i,)) for i in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        codes = sorted(r.status_code for r in out)
        assert set(codes) == {200, 429} and codes.count(200) >= 3, codes
        from server_util import validate
        for r in out:
            if r.status_code == 429:
                validate(r.json(), "ErrorResponse")
                assert r.headers.get("Retry-After") and r.json()["error"]["code"] == "queue_full"
            else:
                assert r.json()["usage"]["completion_tokens"] == 100
        assert idle(s.wait_metrics(idle, timeout=30))
        # more sequences in one request than the queue holds can never be admitted: a 400
        # naming n, not a 429 to retry forever
        r = requests.post(s.url("/v1/completions"), json=dict(body, max_tokens=2, n=3),
                          timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == "n", r.text
        r = requests.post(s.url("/v1/completions"), json=dict(body, max_tokens=2, n=2),
                          timeout=60)
        assert r.status_code == 200, r.text
    finally:
        s.stop()


def test_nonstreaming_client_disconnect_aborts(server):
    """A non-streaming client that leaves while its answer is computed: the request is cancelled
    (its connection is suspended meanwhile, so the server checks the socket itself)."""
    before = server.metrics()
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": 480, "ignore_eos": True,
                       "n": 4}).encode()
    socks = []
    for _ in range(16):
        s = socket.create_connection(("127.0.0.1", server.port), timeout=60)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                  b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        socks.append(s)
    m = server.wait_metrics(lambda m: m["pagoda:num_requests_running"] > 0, timeout=30)
    assert m["pagoda:num_requests_running"] > 0
    for s in socks:
        s.close()
    m = server.wait_metrics(idle, timeout=30)
    assert idle(m), m
    aborted = m["pagoda:request_success_total{finished_reason=abort}"] - \
        before["pagoda:request_success_total{finished_reason=abort}"]
    assert aborted >= 32, f"only {aborted} of 64 choices were cancelled"


def test_slow_client_is_timed_out():
    """A client that sends half a request and stalls is disconnected after --connection-timeout;
    the server keeps serving meanwhile."""
    s = Server(STORIES, "--connection-timeout", "2")
    s.start()
    try:
        slow = socket.create_connection(("127.0.0.1", s.port), timeout=30)
        slow.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        t0 = time.time()
        r = requests.post(s.url("/v1/completions"), json={"prompt": "Once", "max_tokens": 4},
                          timeout=30)
        assert r.status_code == 200
        try:
            while slow.recv(4096):
                pass
        except ConnectionResetError:
            pass
        waited = time.time() - t0
        assert 1 <= waited < 10, f"the stalled client was dropped after {waited:.1f}s"
        slow.close()
    finally:
        s.stop()
