"""Issue 34: the server's request contexts are reference-counted (one for the connection, one per
engine request), so a FINISH lost or a reference not released under memory pressure would leave a
context -- and its client -- waiting forever. The engine reserves each request's FINISH at submit
(tests/unit/test_engine_events.c fails every allocation in turn inside the engine); this test does
it through the whole server. `pgd_serve_faults` is `pagoda` linked with the allocators wrapped so
that every k-th allocation inside pgd_engine_submit fails (k = 1, 2, 3, 5, 11, 29; the engine
thread itself allocates nothing while it steps), while concurrent requests of every kind run --
plain, streamed, n=2 (a failure at the second choice aborts the first), logprobs and echo,
prompt_logprobs, stop strings and ids, JSON, a regex, choices, a grammar. Every request must get one
complete answer (a 200 with each choice finished, an error object, or a stream ending in [DONE]);
the server must then be idle, exit 0 on SIGTERM with every request context freed ("contexts_left":
0 in its "stopped" event), and, in the AddressSanitizer build, with no leak or other report."""
import json
import os
import threading
import time
from pathlib import Path

import pytest
import requests

import util
from server_util import Server, sse_events

STORIES = util.DATA / "models" / "stories260K.gguf"
BUILDS = [("release", Path(os.environ.get("PAGODA_BUILD", util.ROOT / "build")))]
if os.environ.get("PAGODA_ASAN_BUILD"):
    BUILDS.append(("asan", Path(os.environ["PAGODA_ASAN_BUILD"])))

BODIES = [
    {"prompt": "Once upon", "max_tokens": 24, "temperature": 0},
    {"prompt": "Once upon", "max_tokens": 24, "temperature": 0.8, "seed": 3, "n": 2},
    {"prompt": "The cat", "max_tokens": 16, "logprobs": 3, "echo": True},
    {"prompt": "The cat", "max_tokens": 8, "prompt_logprobs": 2},
    {"prompt": "Lily", "max_tokens": 32, "stop": ["dog", "."], "stop_token_ids": [13]},
    {"prompt": "Tom", "max_tokens": 24, "response_format": {"type": "json_object"}},
    {"prompt": "Tom", "max_tokens": 16, "guided_regex": "[a-z]+ [a-z]+"},
    {"prompt": "Is it", "max_tokens": 8, "guided_choice": ["yes", "no"]},
    {"prompt": "Say", "max_tokens": 16, "guided_grammar": 'root ::= "a" [b-d]+ " end"'},
]


def one(server, body, stream, out, i):
    try:
        r = requests.post(server.url("/v1/completions"), json=dict(body, stream=stream),
                          stream=stream, timeout=60)
        if stream and r.status_code == 200:
            evs = list(sse_events(r.iter_lines()))
            out[i] = ("stream", r.status_code, evs)
        else:
            out[i] = ("json", r.status_code, r.json())
    except Exception as e:  # noqa: BLE001 - reported by the assertions
        out[i] = ("exception", 0, repr(e))


def complete(kind, status, payload):
    """One well-formed, finished answer (or an error object): returns whether it is an error."""
    assert kind != "exception", payload
    if kind == "json":
        if status != 200:
            assert status in (400, 429, 500, 503) and "error" in payload, (status, payload)
            return True
        assert all(c["finish_reason"] for c in payload["choices"]), payload
        return False
    assert status == 200 and payload and payload[-1] == "[DONE]", (status, payload)
    evs = payload[:-1]
    return any("error" in e for e in evs)


@pytest.mark.parametrize("every", [1, 2, 3, 5, 11, 29])
@pytest.mark.parametrize("build", BUILDS, ids=[b[0] for b in BUILDS])
def test_submit_allocation_failures_release_every_context(every, build):
    binary = build[1] / "pgd_serve_faults"
    assert binary.exists(), f"build pgd_serve_faults first: {binary} is missing"
    env = {"PGD_FAULT_EVERY": str(every),
           "ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0:halt_on_error=1",
           "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1"}
    s = Server(STORIES, "--max-num-seqs", "8", binary=binary, env=env, ready_timeout=300)
    s.start()
    try:
        out = {}
        threads = []
        cases = [(b, st) for b in BODIES for st in (False, True)]
        for i, (body, stream) in enumerate(cases):
            t = threading.Thread(target=one, args=(s, body, stream, out, i))
            t.start()
            threads.append(t)
        for t in threads:
            t.join(timeout=120)
        assert len(out) == len(cases), f"unanswered: {set(range(len(cases))) - set(out)}"
        errors = sum(complete(*out[i]) for i in sorted(out))
        print(f"every {every} ({build[0]}): {errors} of {len(out)} answers are errors")
        if every == 1:  # every request's first allocation fails: none can run
            assert errors == len(out), out
        deadline = time.time() + 30
        while True:
            m = s.metrics()
            if m["pagoda:num_requests_running"] == 0 and m["pagoda:num_requests_waiting"] == 0:
                break
            assert time.time() < deadline, m
            time.sleep(0.1)
        err = s.stop()  # exit 0, and no sanitizer report (leaks included)
    except BaseException:
        s.kill()
        raise
    events = [json.loads(x) for x in err.splitlines() if x.startswith("{\"event\"")]
    stopped = [e for e in events if e["event"] == "stopped"]
    faults = [e for e in events if e["event"] == "faults"]
    assert stopped and stopped[-1]["contexts_left"] == 0, err[-3000:]
    assert faults and faults[-1]["failed"] > 0, err[-3000:]  # the faults were injected
    assert '"drain_timeout"' not in err, err[-3000:]
