"""Speculative decoding as users and operators see it (issue 6): the vLLM-style
pagoda:spec_decode_* counters on /metrics, each request's proposed and accepted tokens in the
access log, and the per-request opt-out ("speculative": false).

Model: stories260K, whose greedy text loops; the prompt repeats a passage, so n-gram prompt
lookup proposes tokens the model accepts."""
import json
import time

import pytest
import requests

from server_util import STORIES, Server

K = 4  # --num-speculative-tokens: the per-position series are 0..K-1
PASSAGE = "Tom had a red ball. He liked to play with the ball in the park. "
PROMPT = PASSAGE * 4
SPEC = ("drafts", "draft_tokens", "accepted_tokens")


@pytest.fixture(scope="module")
def spec_server():
    s = Server(STORIES, "--speculative", "ngram", "--num-speculative-tokens", str(K))
    s.start()
    yield s
    s.stop()


def spec_metrics(server):
    m = server.wait_metrics(lambda m: m["pagoda:num_requests_running"] == 0, timeout=30)
    out = {k: m[f"pagoda:spec_decode_num_{k}_total"] for k in SPEC}
    out["per_pos"] = [m[f"pagoda:spec_decode_num_accepted_tokens_per_pos_total{{position={i}}}"]
                      for i in range(K)]
    assert f"pagoda:spec_decode_num_accepted_tokens_per_pos_total{{position={K}}}" not in m
    return out


def access_log(server, req_id, timeout=10):
    """The access-log line of request req_id (written once the response has been sent)."""
    deadline = time.time() + timeout
    while True:
        for line in server.stderr().splitlines():
            if line.startswith("{") and f'"id":"{req_id}"' in line:
                j = json.loads(line)  # the line must stay valid JSON
                if j.get("event") == "request":
                    return j
        assert time.time() < deadline, f"no log line for {req_id}:\n{server.stderr()[-4000:]}"
        time.sleep(0.05)


def complete(server, **extra):
    body = {"prompt": PROMPT, "max_tokens": 48, "temperature": 0, "ignore_eos": True, **extra}
    r = requests.post(server.url("/v1/completions"), json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_metrics_and_access_log_count_one_request(spec_server):
    before = spec_metrics(spec_server)
    body = complete(spec_server)
    after = spec_metrics(spec_server)
    d = {k: after[k] - before[k] for k in SPEC}
    per_pos = [a - b for a, b in zip(after["per_pos"], before["per_pos"])]
    assert d["drafts"] > 0
    assert d["draft_tokens"] >= d["accepted_tokens"] > 0, d
    assert d["draft_tokens"] <= K * d["drafts"]
    assert sum(per_pos) == d["accepted_tokens"], per_pos
    assert sum(after["per_pos"]) == after["accepted_tokens"]
    # a position is reached only after every earlier one was accepted
    assert all(per_pos[i] >= per_pos[i + 1] for i in range(K - 1)), per_pos

    log = access_log(spec_server, body["id"])
    assert log["status"] == 200 and log["completion_tokens"] == 48
    assert log["spec_draft_tokens"] == d["draft_tokens"]
    assert log["spec_accepted_tokens"] == d["accepted_tokens"]
    assert log["spec_acceptance"] == pytest.approx(d["accepted_tokens"] / d["draft_tokens"],
                                                   abs=1e-4)


def test_opt_out_proposes_nothing(spec_server):
    spec = complete(spec_server)
    before = spec_metrics(spec_server)
    body = complete(spec_server, speculative=False)
    after = spec_metrics(spec_server)
    assert {k: after[k] - before[k] for k in SPEC} == {k: 0 for k in SPEC}
    assert after["per_pos"] == before["per_pos"]
    # greedy output does not depend on speculation
    assert body["choices"][0]["text"] == spec["choices"][0]["text"]
    log = access_log(spec_server, body["id"])
    assert log["spec_draft_tokens"] == 0 and log["spec_accepted_tokens"] == 0
    assert log["spec_acceptance"] is None

    r = requests.post(spec_server.url("/v1/completions"),
                      json={"prompt": PROMPT, "max_tokens": 4, "speculative": "no"}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "speculative", r.text


def test_no_spec_metrics_without_speculation():
    """As in vLLM, the spec_decode_* series exist only when speculative decoding is on; the
    access log still carries the fields (zero, acceptance null)."""
    with Server(STORIES) as s:
        assert not [k for k in s.metrics() if "spec_decode" in k]
        body = complete(s)
        log = access_log(s, body["id"])
        assert log["spec_draft_tokens"] == 0 and log["spec_acceptance"] is None


DOC = ('{"name": "Ada Lovelace", "born": 1815, "field": "mathematics", '
       '"known_for": "the first published program"}')
DOC_SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string"}, "born": {"type": "integer"}, "field": {"type": "string"},
    "known_for": {"type": "string"}}, "required": ["name", "born"]}


def test_constrained_requests_speculate_exactly(default_model, default_server):
    """Structured output with n-gram speculation (the answer copies the prompt's JSON, so
    proposals are accepted): the greedy answer of every kind of constraint equals the one of the
    server without speculation, and the access log shows accepted proposals for each."""
    import util
    gbnf = (util.DATA / "grammars" / "json.gbnf").read_text()
    kinds = [{"response_format": {"type": "json_object"}}, {"guided_json": DOC_SCHEMA},
             {"guided_grammar": gbnf}, {"guided_regex": r'\{"name": "[A-Za-z ]+", .*\}'},
             {"guided_choice": [DOC, "none"]}]
    chat = {"messages": [{"role": "user", "content": "Repeat this JSON exactly: " + DOC}],
            "max_tokens": 64, "temperature": 0}
    with Server(default_model, "--speculative", "ngram", "--num-speculative-tokens", "4") as s:
        for extra in kinds:
            want = requests.post(default_server.url("/v1/chat/completions"),
                                 json=dict(chat, **extra), timeout=120).json()
            got = requests.post(s.url("/v1/chat/completions"), json=dict(chat, **extra),
                                timeout=120).json()
            text = got["choices"][0]["message"]["content"]
            assert text == want["choices"][0]["message"]["content"], (extra, got, want)
            assert got["choices"][0]["finish_reason"] == want["choices"][0]["finish_reason"]
            log = access_log(s, got["id"])
            assert log["spec_accepted_tokens"] > 0, (extra, log)
