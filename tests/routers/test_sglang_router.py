"""Pagoda as a worker of SGLang's model gateway (PyPI sglang-router, pinned in requirements.txt):
two replicas of `pagoda serve` behind `sglang-router launch` on 127.0.0.1.

- The router registers each worker from its /server_info and /model_info (falling back to the
  older /get_ names) and takes the model id from served_model_name: /v1/models through the
  router shows Pagoda's id (without those endpoints it shows "unknown").
- round_robin spreads requests over both replicas (their access logs), and every answer is a
  complete completion.
- /get_load, which the power-of-two policy reads, is [{dp_rank, num_reqs, num_waiting_reqs,
  num_tokens}] and counts a request while it runs; the router's /get_loads shows both workers.
- /flush_cache drops the prefix cache's unreferenced blocks: a repeated prompt is served from
  the cache (usage.prompt_tokens_details.cached_tokens > 0) until the flush, and not after.
"""
import json
import os
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
import requests

import util
from server_util import Server

STORIES = util.DATA / "models" / "stories260K.gguf"
MODEL_ID = STORIES.name
ROUTER = Path(os.environ.get("VIRTUAL_ENV", Path(os.sys.executable).parents[1])) / "bin" / \
    "sglang-router"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    assert ROUTER.exists(), f"{ROUTER}: install tests/routers/requirements.txt"
    replicas = [Server(STORIES, threads=1).start() for _ in range(2)]
    port = free_port()
    log = tmp_path_factory.mktemp("router") / "router.log"
    urls = [r.url() for r in replicas]
    with open(log, "w") as f:
        router = subprocess.Popen(
            [str(ROUTER), "launch", "--host", "127.0.0.1", "--port", str(port),
             "--policy", "round_robin", "--worker-urls", *urls, "--log-level", "info",
             "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())],
            stdout=f, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while True:  # registered: the model listed under its id
        try:
            r = requests.get(base + "/v1/models", timeout=5)
            if r.status_code == 200 and r.json()["data"]:
                break
        except requests.RequestException:
            pass
        assert router.poll() is None, log.read_text()[-3000:]
        assert time.time() < deadline, log.read_text()[-3000:]
        time.sleep(0.2)
    yield {"base": base, "replicas": replicas, "log": log}
    router.terminate()
    router.wait(timeout=30)
    for r in replicas:
        r.stop()


def paths(replica):
    """(method, path) of each request in the replica's access log."""
    out = []
    for line in replica.stderr().splitlines():
        if line.startswith("{") and '"event":"request"' in line:
            e = json.loads(line)
            out.append((e["method"], e["path"]))
    return out


def test_router_takes_the_model_id_from_server_info(cluster):
    ids = [m["id"] for m in requests.get(cluster["base"] + "/v1/models", timeout=10).json()["data"]]
    assert ids == [MODEL_ID], ids
    for r in cluster["replicas"]:  # what the router asked each worker
        asked = set(paths(r))
        assert ("GET", "/server_info") in asked and ("GET", "/model_info") in asked, asked


def test_worker_contract_shapes(cluster):
    r = cluster["replicas"][0]
    for path in ("/server_info", "/get_server_info"):
        info = requests.get(r.url(path), timeout=10).json()
        assert info["served_model_name"] == MODEL_ID and info["model_path"] == str(STORIES)
        assert info["is_generation"] is True and info["dp_size"] == 1
        assert isinstance(info["max_running_requests"], int) and info["max_running_requests"] > 0
        assert info["model_type"] == "llama" and info["architectures"] == ["LlamaForCausalLM"]
    for path in ("/model_info", "/get_model_info"):
        mi = requests.get(r.url(path), timeout=10).json()
        assert mi["model_path"] == str(STORIES) and mi["is_generation"] is True
        assert mi["model_type"] == "llama" and mi["architectures"] == ["LlamaForCausalLM"]
        assert mi["served_model_name"] == MODEL_ID and mi["vocab_size"] == 512


def test_get_load_counts_a_running_request(cluster):
    r = cluster["replicas"][1]
    idle = requests.get(r.url("/get_load"), timeout=10).json()
    assert idle == [{"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0}], idle
    body = {"model": MODEL_ID, "prompt": "Once upon a time", "max_tokens": 480,
            "ignore_eos": True, "stream": True}
    seen = []
    with requests.post(r.url("/v1/completions"), json=body, stream=True, timeout=120) as resp:
        for i, line in enumerate(resp.iter_lines()):
            if i == 4:  # a few tokens in: the request runs
                seen = requests.get(r.url("/get_load"), timeout=10).json()
    assert seen and seen[0]["num_reqs"] == 1 and seen[0]["num_tokens"] > 0, seen
    loads = requests.get(cluster["base"] + "/get_loads", timeout=10).json()
    assert sorted(w["worker"] for w in loads["workers"]) == sorted(
        x.url() for x in cluster["replicas"]), loads


def test_round_robin_spreads_over_the_replicas(cluster):
    before = [sum(p == ("POST", "/v1/completions") for p in paths(r)) for r in cluster["replicas"]]
    out = {}

    def one(i):
        out[i] = requests.post(cluster["base"] + "/v1/completions", timeout=60, json={
            "model": MODEL_ID, "prompt": f"Once upon a time {i}", "max_tokens": 4,
            "temperature": 0})
    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert len(out) == 8
    for r in out.values():
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["finish_reason"] == "length", r.text
    after = [sum(p == ("POST", "/v1/completions") for p in paths(r)) for r in cluster["replicas"]]
    served = [a - b for a, b in zip(after, before)]
    assert sum(served) == 8 and min(served) >= 3, served


def test_flush_cache_drops_cached_prefixes(cluster):
    r = cluster["replicas"][0]
    prompt = "Once upon a time, there was a little girl named Lily. She loved to play " * 3
    body = {"model": MODEL_ID, "prompt": prompt, "max_tokens": 2, "temperature": 0}

    def cached():
        resp = requests.post(r.url("/v1/completions"), json=body, timeout=60)
        assert resp.status_code == 200, resp.text
        return resp.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    cached()
    assert cached() > 0  # the repeated prompt's full blocks come from the prefix cache
    f = requests.post(r.url("/flush_cache"), timeout=10)
    assert f.status_code == 200, f.text
    assert cached() == 0  # flushed: computed again
    assert cached() > 0


def test_a_killed_replica_loses_no_request():
    """SIGKILL one of two replicas: the router (with retries on, as the README deploys it)
    answers every non-streamed request sent after the kill from the other replica, and a
    replica restarted on the same address rejoins once its /health says 200. (Without
    --retry-max-retries, sglang-router 0.3.2 answered 2 of 8 such requests with a 500.)"""
    ports = [free_port(), free_port()]
    replicas = [Server(STORIES, "--port", str(p), threads=1).start() for p in ports]
    port = free_port()
    router = subprocess.Popen(
        [str(ROUTER), "launch", "--host", "127.0.0.1", "--port", str(port),
         "--policy", "round_robin", "--worker-urls", *[r.url() for r in replicas],
         "--retry-max-retries", "5", "--retry-initial-backoff-ms", "50",
         "--health-check-interval-secs", "1", "--health-failure-threshold", "1",
         "--health-success-threshold", "1", "--log-level", "warn",
         "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    restarted = None
    try:
        deadline = time.time() + 60
        while True:
            try:
                if requests.get(base + "/v1/models", timeout=5).json()["data"]:
                    break
            except (requests.RequestException, ValueError, KeyError):
                pass
            assert router.poll() is None and time.time() < deadline
            time.sleep(0.2)

        def complete(i):
            return requests.post(base + "/v1/completions", timeout=60, json={
                "model": MODEL_ID, "prompt": f"Once upon a time {i}", "max_tokens": 3})
        assert all(complete(i).status_code == 200 for i in range(4))
        replicas[1].kill()  # SIGKILL
        codes = [complete(i).status_code for i in range(8)]
        assert codes == [200] * 8, codes
        restarted = Server(STORIES, "--port", str(ports[1]), threads=1).start()
        deadline = time.time() + 30
        while not any(p == ("POST", "/v1/completions") for p in paths(restarted)):
            assert complete(0).status_code == 200
            assert time.time() < deadline, "the restarted replica was never sent a request"
            time.sleep(0.2)
    finally:
        router.terminate()
        router.wait(timeout=30)
        for r in [replicas[0], restarted]:
            if r:
                r.stop()
