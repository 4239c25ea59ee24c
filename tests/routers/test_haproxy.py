"""Pagoda behind HAProxy (Debian's /usr/sbin/haproxy) with the shipped docker/haproxy.cfg itself:
three `pagoda serve` replicas on 127.0.0.1, their addresses given to the file through its
environment variables.

- least-connections spreads concurrent requests over all three replicas (their access logs);
- a stream passes unbuffered: its first event reaches the client while the replica is still
  generating (its /get_load counts the request), and the events are the replica's own, whole
  and in order ([DONE] last, every choice's text the greedy text);
- SIGKILL one replica while a batch of non-streamed requests runs, some of them on it: every
  request is answered 200 (HAProxy's L7 retries send the cut ones to another replica), the dead
  one is marked DOWN by the /health checks and is sent nothing more, and a replica restarted on
  the same port is UP again once its /health says 200 and is sent requests;
- SIGTERM one replica while streamed and non-streamed requests run, some on it: it drains (what
  it runs finishes; it closes its listening socket and answers 503 to new requests on open
  connections, which HAProxy resends), every request is answered whole, streams included, the
  replica exits 0 and is marked DOWN.
"""
import csv
import io
import os
import re
import signal
import socket
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

import util
from server_util import Server, sse_events
from test_sglang_router import free_port, paths

STORIES = util.DATA / "models" / "stories260K.gguf"
CFG = util.ROOT / "docker" / "haproxy.cfg"
HAPROXY = Path(os.environ.get("HAPROXY", "/usr/sbin/haproxy"))


def completions(replica):
    return sum(p == ("POST", "/v1/completions") for p in paths(replica))


def admin(sock, cmd):
    """One command on HAProxy's runtime API (the stats socket); its answer."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(5)
        s.connect(str(sock))
        s.sendall(cmd.encode() + b"\n")
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out.decode()


def servers(sock):
    """{server name: its `show stat` row} of the pagoda backend (status UP / DOWN, stot...)."""
    text = admin(sock, "show stat").lstrip("# ")
    return {r["svname"]: r for r in csv.DictReader(io.StringIO(text))
            if r["pxname"] == "pagoda" and r["svname"] not in ("BACKEND", "FRONTEND")}


def wait_status(sock, name, status, timeout):
    deadline = time.time() + timeout
    while (got := servers(sock)[name]["status"]) != status:
        assert time.time() < deadline, f"{name} still {got}, not {status}, after {timeout} s"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    assert HAPROXY.exists(), f"{HAPROXY}: apt-get install haproxy (scripts/install-deps.sh)"
    tmp = tmp_path_factory.mktemp("haproxy")
    ports = [free_port() for _ in range(3)]
    replicas = [Server(STORIES, "--port", str(p), threads=1).start() for p in ports]
    port, sock, log = free_port(), tmp / "stats.sock", tmp / "haproxy.log"
    env = dict(os.environ, PAGODA_HAPROXY_BIND=f"127.0.0.1:{port}",
               PAGODA_HAPROXY_STATS=str(sock),
               **{f"PAGODA_R{i + 1}": f"127.0.0.1:{p}" for i, p in enumerate(ports)})
    with open(log, "w") as f:
        proxy = subprocess.Popen([str(HAPROXY), "-db", "-f", str(CFG)], env=env, stdout=f,
                                 stderr=subprocess.STDOUT)
    c = {"base": f"http://127.0.0.1:{port}", "replicas": replicas, "ports": ports,
         "sock": sock, "log": log, "killed": []}
    try:
        deadline = time.time() + 20
        while not (sock.exists() and all(s["status"] == "UP" for s in servers(sock).values())):
            assert proxy.poll() is None, log.read_text()
            assert time.time() < deadline, log.read_text()
            time.sleep(0.1)
        yield c
    finally:
        print(log.read_text()[-6000:])  # shown when a test fails
        proxy.terminate()
        proxy.wait(timeout=30)
        for r in c["replicas"]:
            r.stop(check=r not in c["killed"])


def complete(base, i, **kw):
    body = {"prompt": f"Once upon a time {i}", "max_tokens": 8, "temperature": 0, **kw}
    return requests.post(base + "/v1/completions", json=body, timeout=60)


def test_least_connections_spreads_over_every_replica(cluster):
    before = [completions(r) for r in cluster["replicas"]]
    with ThreadPoolExecutor(6) as ex:
        out = list(ex.map(lambda i: complete(cluster["base"], i, max_tokens=200, n=2,
                                             ignore_eos=True), range(18)))
    for r in out:
        assert r.status_code == 200, r.text
        assert [c["finish_reason"] for c in r.json()["choices"]] == ["length"] * 2, r.text
    served = [completions(r) - b for r, b in zip(cluster["replicas"], before)]
    assert sum(served) == 18 and all(s > 0 for s in served), served


def test_a_stream_passes_unbuffered_and_whole(cluster):
    body = {"prompt": "Once upon a time", "max_tokens": 480, "ignore_eos": True,
            "temperature": 0, "n": 16, "stream": True, "stream_options": {"include_usage": True}}
    plain = {k: v for k, v in body.items() if k != "stream_options"}
    want = requests.post(cluster["replicas"][0].url("/v1/completions"), timeout=60,
                         json={**plain, "n": 1, "stream": False}).json()["choices"][0]["text"]
    with requests.post(cluster["base"] + "/v1/completions", json=body, stream=True,
                       timeout=60) as resp:
        assert resp.status_code == 200 and \
            resp.headers["Content-Type"].startswith("text/event-stream"), resp.headers
        lines = resp.iter_lines()
        events = sse_events(lines)
        first = next(events)
        # the first event is here: the replica is still generating the other 7,679 tokens
        running = [requests.get(r.url("/get_load"), timeout=5).json()[0]["num_reqs"]
                   for r in cluster["replicas"]]
        rest = list(events)
        assert [x for x in lines if x] == [], "data after [DONE]"
    # (num_reqs counts sequences: the 16 choices on the replica serving the stream)
    assert sorted(running) == [0, 0, 16], f"the stream had ended before its first event: {running}"
    assert rest[-1] == "[DONE]"
    usage = rest[-2]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 16 * 480, usage
    text, finish = {}, {}
    for e in [first] + rest[:-2]:
        assert e["object"] == "text_completion" and e["id"] == first["id"], e
        for c in e["choices"]:
            assert c["index"] not in finish, f"an event after choice {c['index']} finished"
            text[c["index"]] = text.get(c["index"], "") + c["text"]
            if c["finish_reason"]:
                finish[c["index"]] = c["finish_reason"]
    assert finish == {i: "length" for i in range(16)}, finish
    assert all(text[i] == want for i in range(16)), (want, text)


def test_a_killed_replica_loses_no_request_and_a_restarted_one_rejoins(cluster):
    base, sock, victim = cluster["base"], cluster["sock"], cluster["replicas"][1]
    results = {}

    def one(i):
        results[i] = complete(base, i, max_tokens=480, n=4, ignore_eos=True)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(24)]
    batches = [threads[k:k + 6] for k in range(0, 24, 6)]
    for t in batches[0]:
        t.start()
    deadline = time.time() + 20
    while requests.get(victim.url("/get_load"), timeout=5).json()[0]["num_reqs"] == 0:
        assert time.time() < deadline, "no request ever ran on the replica to kill"
        time.sleep(0.002)
    victim.kill()  # SIGKILL, with a request of the batch running on it
    cluster["killed"].append(victim)
    for b in batches[1:]:
        for t in b:
            t.start()
    for t in threads:
        t.join(timeout=120)
    codes = [results[i].status_code for i in range(24)]
    assert codes == [200] * 24, codes
    for r in results.values():
        assert [c["finish_reason"] for c in r.json()["choices"]] == ["length"] * 4, r.text
    # HAProxy's log: the retries field of a request sent again elsewhere reads "+1"
    retried = re.findall(r" \d+/\d+/\d+/\d+/\+\d+ .*\"POST /v1/completions",
                         cluster["log"].read_text())
    assert retried, "no request was retried: none was cut by the kill"

    wait_status(sock, "r2", "DOWN", timeout=10)
    sent = int(servers(sock)["r2"]["stot"])
    for i in range(9):
        assert complete(base, i).status_code == 200
    assert int(servers(sock)["r2"]["stot"]) == sent, "a DOWN server was sent requests"

    restarted = Server(STORIES, "--port", str(cluster["ports"][1]), threads=1).start()
    cluster["replicas"][1] = restarted
    wait_status(sock, "r2", "UP", timeout=10)
    deadline = time.time() + 20
    while completions(restarted) == 0:
        assert complete(base, 0).status_code == 200
        assert time.time() < deadline, "the restarted replica was never sent a request"


def test_a_stopped_replica_drains_and_loses_nothing(cluster):
    base, sock, victim = cluster["base"], cluster["sock"], cluster["replicas"][2]
    results = {}

    def one(i):
        body = {"prompt": f"Once upon a time {i}", "max_tokens": 300, "ignore_eos": True,
                "temperature": 0}
        if i % 2:  # streamed: whole means every event up to [DONE]
            with requests.post(base + "/v1/completions", json=dict(body, stream=True),
                               stream=True, timeout=120) as r:
                lines = [x for x in r.iter_lines() if x]
                results[i] = (r.status_code, bool(lines) and lines[-1] == b"data: [DONE]")
        else:
            r = requests.post(base + "/v1/completions", json=body, timeout=120)
            results[i] = (r.status_code, r.status_code == 200 and
                          r.json()["usage"]["completion_tokens"] == 300)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(18)]
    for t in threads[:6]:
        t.start()
    deadline = time.time() + 20
    while requests.get(victim.url("/get_load"), timeout=5).json()[0]["num_reqs"] == 0:
        assert time.time() < deadline, "no request ever ran on the replica to stop"
        time.sleep(0.002)
    victim.proc.send_signal(signal.SIGTERM)
    for t in threads[6:]:
        t.start()
    for t in threads:
        t.join(timeout=180)
    assert [results[i] for i in range(18)] == [(200, True)] * 18, results
    assert victim.proc.wait(timeout=60) == 0, victim.stderr()[-2000:]
    assert '"event":"draining"' in victim.stderr()
    cluster["killed"].append(victim)  # (exited already)
    wait_status(sock, "r3", "DOWN", timeout=10)
