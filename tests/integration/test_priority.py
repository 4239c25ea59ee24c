"""Priority scheduling (vLLM's `--scheduling-policy priority` and its requests' "priority"):
requests run in the order of their priority (lower first), a higher priority preempts a lower
one that holds the sequence slot it needs, and every answer equals the same request's answer
with the server to itself. A server without the policy refuses a priority other than 0 with a
400 naming the parameter, as vLLM does."""
import json
import os
import threading
from pathlib import Path

import pytest
import requests

import util
from server_util import Server, sse_events, validate

post = util.post
PROMPT = "Once upon a time, in a quiet village by the sea,"


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {"prompt": PROMPT, "max_tokens": 2}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}),
    ("/v1/embeddings", {"input": PROMPT}),
])
def test_priority_needs_the_policy(smol, path, body):
    r = post(smol, path, dict(body, priority=1))
    assert r.status_code == 400, r.text
    validate(r.json(), "ErrorResponse")
    assert r.json()["error"]["param"] == "priority"
    assert "--scheduling-policy priority" in r.json()["error"]["message"]
    assert post(smol, path, dict(body, priority=0)).status_code == 200


ASAN_BUILD = os.environ.get("PAGODA_ASAN_BUILD")
ASAN_ENV = {"ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0:halt_on_error=1",
            "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1"}


@pytest.fixture(scope="module", params=["release", "asan"])
def prio(request, default_model):
    """One sequence slot under priority scheduling: whoever runs holds the whole engine. Also
    under AddressSanitizer (with scripts/test.sh's PAGODA_ASAN_BUILD): preemption and
    re-admission by priority, with no sanitizer report and a clean exit."""
    kw = {}
    if request.param == "asan":
        if not ASAN_BUILD:
            pytest.skip("PAGODA_ASAN_BUILD is not set")
        kw = dict(binary=Path(ASAN_BUILD) / "pagoda", env=ASAN_ENV, ready_timeout=300)
    s = Server(default_model, "--scheduling-policy", "priority", "--max-num-seqs", "1", **kw)
    s.start()
    yield s
    s.stop()  # (asserts exit 0 and no sanitizer report)


@pytest.mark.parametrize("bad", [1.5, "1", True, 2 ** 31])
def test_priority_must_be_an_int32(prio, bad):
    r = post(prio, "/v1/completions", {"prompt": PROMPT, "max_tokens": 2, "priority": bad})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "priority"


def test_higher_priority_goes_first(prio):
    """A (priority 5) streams a long answer; B (priority 10) queues behind it; C (priority -3)
    arrives last, preempts A at once and finishes first; A resumes (recomputed) and finishes
    before B. Every text is the one its request gets alone."""
    bodies = {
        "A": {"prompt": PROMPT, "max_tokens": 200, "temperature": 0, "ignore_eos": True,
              "priority": 5},
        "B": {"prompt": "The best thing about the sea is", "max_tokens": 12, "temperature": 0,
              "priority": 10},
        "C": {"prompt": "My favourite colour is", "max_tokens": 12, "temperature": 0,
              "priority": -3},
    }
    alone = {k: post(prio, "/v1/completions", b).json()["choices"][0]["text"]
             for k, b in bodies.items()}
    pre0 = prio.metrics()["pagoda:num_preemptions_total"]
    done, texts, started = [], {}, threading.Event()

    def stream_a():
        r = requests.post(prio.url("/v1/completions"), json=dict(bodies["A"], stream=True),
                          stream=True, timeout=300)
        r.encoding = "utf-8"
        text = ""
        for ev in sse_events(r.iter_lines(decode_unicode=True)):
            if ev == "[DONE]":
                break
            text += "".join(c["text"] for c in ev["choices"])
            if text:
                started.set()
        texts["A"] = text
        done.append("A")

    def plain(k):
        r = post(prio, "/v1/completions", bodies[k])
        assert r.status_code == 200, r.text
        texts[k] = r.json()["choices"][0]["text"]
        done.append(k)

    threads = [threading.Thread(target=stream_a)]
    threads[0].start()
    assert started.wait(120)
    threads.append(threading.Thread(target=plain, args=("B",)))
    threads[1].start()
    m = prio.wait_metrics(lambda m: m["pagoda:num_requests_waiting"] == 1)
    assert m["pagoda:num_requests_waiting"] == 1 and "A" not in done, (m, done)
    threads.append(threading.Thread(target=plain, args=("C",)))
    threads[2].start()
    for t in threads:
        t.join(300)
    assert done == ["C", "A", "B"], done
    assert texts == alone
    assert prio.metrics()["pagoda:num_preemptions_total"] == pre0 + 1


def test_batch_priority(tmp_path, default_model):
    """`pagoda batch` lines take "priority" under --scheduling-policy priority, with the same
    answers; without the policy such a line is an error line and the others run."""
    lines = [{"id": i, "prompt": "Story %d:" % i, "max_tokens": 8, "temperature": 0,
              "priority": p} for i, p in enumerate([3, -1, 0, 7])]
    lines.append({"id": 9, "input": PROMPT, "priority": 2})
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("".join(json.dumps(x) + "\n" for x in lines))
    res = {}
    for policy in ("priority", "fcfs"):
        util.run_pagoda("batch", "-m", default_model, "--input", inp, "--output", out,
                        "--no-progress", "--max-num-seqs", "1", "--scheduling-policy", policy)
        res[policy] = [json.loads(x) for x in out.read_text().splitlines()]
    plain = [{k: v for k, v in x.items() if k != "priority"} for x in lines]
    inp.write_text("".join(json.dumps(x) + "\n" for x in plain))
    util.run_pagoda("batch", "-m", default_model, "--input", inp, "--output", out,
                    "--no-progress", "--max-num-seqs", "1")
    ref = [json.loads(x) for x in out.read_text().splitlines()]
    assert res["priority"] == ref
    assert [r["id"] for r in res["fcfs"]] == [0, 1, 2, 3, 9]
    for r in res["fcfs"]:
        if r["id"] == 2:
            assert r == ref[2]
        else:
            assert "scheduling" in r["error"]["message"], r
