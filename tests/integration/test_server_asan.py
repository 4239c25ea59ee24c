"""The server under AddressSanitizer + UndefinedBehaviorSanitizer + LeakSanitizer: a subset of the
server suite (every error case, completions and chat in all their shapes, dropped streams,
concurrent streams, SIGTERM) against $PAGODA_ASAN_BUILD/pagoda, failing on any sanitizer report
in the server's stderr or a non-zero exit. Skipped when PAGODA_ASAN_BUILD is not set
(scripts/test.sh sets it). To run the whole server suite under ASan instead:
    PAGODA_SERVER_BIN=build-srv-asan/pagoda ASAN_OPTIONS=detect_leaks=1 pytest tests/integration/test_server*.py
"""
import asyncio
import os
import socket
from pathlib import Path

import pytest
import requests

import test_server_errors as errs
import test_server_load as load
from server_util import STORIES, Server, sse_events

ASAN_BUILD = os.environ.get("PAGODA_ASAN_BUILD")
pytestmark = pytest.mark.skipif(not ASAN_BUILD, reason="PAGODA_ASAN_BUILD is not set")
ENV = {"ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0:halt_on_error=1",
       "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1"}


def asan_bin():
    b = Path(ASAN_BUILD) / "pagoda"
    assert b.exists(), f"{b} is missing: build the ASan configuration first"
    return b


def test_asan_stories_subset():
    s = Server(STORIES, "--api-key", errs.KEY, "--max-num-seqs", "16", binary=asan_bin(),
               env=ENV, ready_timeout=300)
    s.start()
    try:
        url = s.url("/v1/completions")
        # every malformed request
        for case in errs.CASES:
            name, method, path, body, headers, status, _, _ = case
            r = errs.send(s, method, path, body, headers)
            assert r.status_code == status, f"{name}: {r.status_code} {r.text[:300]}"
        # completions: plain, n, stop, echo, logprobs, token prompts, streaming with usage
        for body in ({"prompt": "Once upon a time", "max_tokens": 16, "temperature": 0},
                     {"prompt": ["Once", "upon"], "max_tokens": 8, "n": 2, "temperature": 0.9,
                      "seed": 3},
                     {"prompt": "Once upon a time", "max_tokens": 24, "stop": [" the", "."]},
                     {"prompt": "Once upon a time", "max_tokens": 4, "echo": True},
                     {"prompt": "Once upon a time", "max_tokens": 4, "echo": True,
                      "logprobs": 2},
                     {"prompt": [[1, 400, 300], [1]], "max_tokens": 0, "echo": True,
                      "logprobs": 1, "n": 2},
                     {"prompt": [[1, 400, 300], [1, 5]], "max_tokens": 4, "logprobs": 5},
                     {"prompt": "Lily", "max_tokens": 8, "logit_bias": {"5": -100},
                      "presence_penalty": 1, "frequency_penalty": 0.5, "top_k": 5, "min_p": 0.1}):
            r = requests.post(url, json=body, headers=errs.AUTH, timeout=120)
            assert r.status_code == 200, r.text
        with requests.post(url, json={"prompt": "Once", "max_tokens": 12, "n": 2, "stream": True,
                                      "logprobs": 2, "stream_options": {"include_usage": True}},
                           headers=errs.AUTH, stream=True, timeout=120) as r:
            events = list(sse_events(r.iter_lines()))
        assert events[-1] == "[DONE]" and events[-2]["usage"]["completion_tokens"] == 24
        with requests.post(url, json={"prompt": "Once upon", "max_tokens": 3, "stream": True,
                                      "echo": True, "logprobs": 2, "n": 2},
                           headers=errs.AUTH, stream=True, timeout=120) as r:
            events = list(sse_events(r.iter_lines()))
        first = events[0]["choices"][0]["logprobs"]
        assert events[-1] == "[DONE]" and first["token_logprobs"][0] is None
        for p in ("/tokenize", "/detokenize"):
            body = {"prompt": "héllo wörld"} if p == "/tokenize" else {"tokens": [1, 400, 300]}
            assert requests.post(s.url(p), json=body, headers=errs.AUTH,
                                 timeout=30).status_code == 200
        # dropped streams
        socks = []
        for _ in range(8):
            raw = socket.create_connection(("127.0.0.1", s.port), timeout=60)
            data = b'{"prompt": "Once", "max_tokens": 400, "ignore_eos": true, "stream": true}'
            raw.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                        + errs.KEY.encode() + b"\r\nContent-Length: " + str(len(data)).encode()
                        + b"\r\n\r\n" + data)
            assert raw.recv(4096)
            socks.append(raw)
        for raw in socks:
            raw.close()
        # concurrent streams (httpx needs the key)
        reqs = load.make_requests(32)
        expected = [requests.post(url, json=b, headers=errs.AUTH, timeout=120).json()
                    ["choices"][0]["text"] for b in reqs]

        async def all_streams():
            import httpx
            async with httpx.AsyncClient(timeout=300, headers=errs.AUTH) as c:
                return await asyncio.gather(*(load.stream_one(c, url, b) for b in reqs))
        results = asyncio.run(all_streams())
        assert [r[0] for r in results] == expected
        m = s.wait_metrics(load.idle, timeout=60)
        assert load.idle(m), m
    finally:
        s.stop()  # asserts exit 0 and no ASan/LSan/UBSan report


def test_asan_chat_default_model(default_model):
    """The chat path (template rendering on the thread pool) on the real model."""
    s = Server(default_model, binary=asan_bin(), env=ENV, ready_timeout=300)
    s.start()
    try:
        chat = {"messages": [{"role": "system", "content": "Be brief."},
                             {"role": "user", "content": [{"type": "text", "text": "Hi!"}]}],
                "max_tokens": 4, "temperature": 0}
        r = requests.post(s.url("/v1/chat/completions"), json=chat, timeout=300)
        assert r.status_code == 200, r.text
        with requests.post(s.url("/v1/chat/completions"),
                           json=dict(chat, stream=True, logprobs=True, top_logprobs=2),
                           stream=True, timeout=300) as r:
            events = list(sse_events(r.iter_lines()))
        assert events[-1] == "[DONE]"
        r = requests.post(s.url("/v1/chat/completions"),
                          json={"messages": [{"role": "user", "content": "x"}], "top_p": 7},
                          timeout=60)
        assert r.status_code == 400
    finally:
        s.stop()


def test_asan_dialects_and_http(default_model):
    """The Responses and Anthropic dialects (stream and not, tools, the store, a chain, a
    background run cancelled and one left running at SIGTERM), the tool-call paths without a
    parser, CORS and the routes answered after the read: no sanitizer report, exit 0."""
    s = Server(default_model, "--responses-store-size", "8KiB", binary=asan_bin(), env=ENV,
               ready_timeout=300)
    s.start()
    try:
        R, M = s.url("/v1/responses"), s.url("/v1/messages")
        tool = {"type": "function", "name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
        a = requests.post(R, json={"input": "Hi", "instructions": "Be brief.",
                                   "max_output_tokens": 4, "temperature": 0}, timeout=300)
        assert a.status_code == 200, a.text
        b = requests.post(R, json={"input": "More", "previous_response_id": a.json()["id"],
                                   "max_output_tokens": 4, "temperature": 0}, timeout=300)
        assert b.status_code == 200, b.text
        with requests.post(R, json={"input": "Weather in Paris?", "tools": [tool],
                                    "tool_choice": "required", "max_output_tokens": 30,
                                    "stream": True}, stream=True, timeout=300) as r:
            assert r.status_code == 200 and list(r.iter_lines())
        for i in range(12):  # the 8 KiB store evicts as it fills
            r = requests.post(R, json={"input": f"{i} " + "x" * 400, "max_output_tokens": 1},
                              timeout=300)
            assert r.status_code == 200, r.text
        assert requests.delete(s.url(f"/v1/responses/{b.json()['id']}"),
                               timeout=30).status_code in (200, 404)
        bg = requests.post(R, json={"input": "Tell a long story.", "background": True,
                                    "temperature": 0, "max_output_tokens": 200},
                           timeout=300).json()
        assert requests.post(s.url(f"/v1/responses/{bg['id']}/cancel"),
                             timeout=30).status_code == 200
        msg = {"model": "SmolLM2-135M-Instruct.Q4_1.gguf", "max_tokens": 4,
               "messages": [{"role": "user", "content": "Hi"}]}
        assert requests.post(M, json=msg, timeout=300).status_code == 200
        with requests.post(M, json=dict(msg, stream=True), stream=True, timeout=300) as r:
            assert r.status_code == 200 and list(r.iter_lines())
        t = dict(msg, max_tokens=30, tools=[{"name": "get_weather",
                                             "input_schema": tool["parameters"]}],
                 tool_choice={"type": "tool", "name": "get_weather"})
        assert requests.post(M, json=t, timeout=300).json()["stop_reason"] == "tool_use"
        assert requests.post(s.url("/v1/messages/count_tokens"), json=msg,
                             timeout=300).status_code == 200
        assert requests.post(M, json={"messages": []}, timeout=30).status_code == 400
        ct = {"messages": [{"role": "user", "content": "Weather?"}], "max_tokens": 30,
              "tools": [{"type": "function", "function": tool | {"type": None}}]}
        ct["tools"][0]["function"].pop("type")
        for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
            with requests.post(s.url("/v1/chat/completions"), stream=True, timeout=300,
                               json=dict(ct, tool_choice=choice, stream=True)) as r:
                assert r.status_code == 200 and list(r.iter_lines())
        r = requests.options(s.url("/v1/chat/completions"), timeout=30, headers={
            "Origin": "https://a.example", "Access-Control-Request-Method": "POST"})
        assert r.status_code == 200
        assert requests.head(s.url("/v1/models"), timeout=30).status_code == 200
        # left running: shutdown aborts it and stores the outcome
        requests.post(R, json={"input": "Tell a long story.", "background": True,
                               "max_output_tokens": 2000}, timeout=300)
    finally:
        s.stop()


def test_asan_hostile_http():
    """test_hostile_http.py (issue 35: smuggling, malformed heads, slow clients, the 1,100
    connection flood, oversized chats) against the ASan build: each server it starts must stop
    with exit 0 and no sanitizer report (server_util.Server.stop checks both)."""
    import subprocess
    import sys
    env = dict(os.environ, PAGODA_SERVER_BIN=str(asan_bin()), **ENV)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        str(Path(__file__).with_name("test_hostile_http.py"))],
                       env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
