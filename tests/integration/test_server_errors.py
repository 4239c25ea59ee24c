"""Malformed and hostile requests: each gets its documented status and an OpenAI error object
(validated against ErrorResponse), and the server keeps answering correctly afterwards (a greedy
completion taken before equals one taken after). Runs on stories260K (context 512, no chat
template) with an API key, so authentication is checked too."""
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from server_util import STORIES, Server, validate
from util import DATA

KEY = "test-key-123"
AUTH = {"Authorization": f"Bearer {KEY}"}
GREEDY = {"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0}
LONG_PROMPT = "Once upon a time there was a little girl. " * 60  # ~600 tokens > 512


@pytest.fixture(scope="module")
def server():
    s = Server(STORIES, "--api-key", KEY, "--max-body-bytes", "4MiB")
    s.start()
    r = requests.post(s.url("/v1/completions"), json=GREEDY, headers=AUTH, timeout=60)
    assert r.status_code == 200, r.text
    s.reference = r.json()["choices"][0]["text"]
    assert s.reference
    yield s
    s.stop()


C, CH = "/v1/completions", "/v1/chat/completions"

# (id, method, path, body: dict -> JSON | bytes | None, headers (None: with the key), status,
#  param expected in the error or None, substring expected in the message or None)
CASES = [
    ("bad-json", "POST", C, b'{"prompt": "a",', None, 400, None, "JSON"),
    ("json-array", "POST", C, b"[]", None, 400, None, "object"),
    ("json-null", "POST", C, b"null", None, 400, None, None),
    ("empty-body", "POST", C, b"", None, 400, None, None),
    ("deep-nesting", "POST", C, b"[" * 5000 + b"]" * 5000, None, 400, None, None),
    ("trailing-garbage", "POST", C, b'{"prompt": "a"} xyz', None, 400, None, None),
    ("invalid-utf8", "POST", C, b'{"prompt": "ab\xff\xfe cd", "max_tokens": 2}', None, 400, None,
     "UTF-8"),
    ("invalid-utf8-chat", "POST", CH,
     b'{"messages": [{"role": "user", "content": "\xc3"}]}', None, 400, None, "UTF-8"),
    # well-formed in shape but not UTF-8: an overlong "/", an encoded surrogate, a code point
    # past U+10FFFF, a lead byte no character starts with
    ("utf8-overlong", "POST", C, b'{"prompt": "\xc0\xaf", "max_tokens": 1}', None, 400, None,
     "UTF-8"),
    ("utf8-surrogate", "POST", C, b'{"prompt": "\xed\xa0\x80", "max_tokens": 1}', None, 400,
     None, "UTF-8"),
    ("utf8-past-10ffff", "POST", C, b'{"prompt": "\xf4\x90\x80\x80", "max_tokens": 1}', None,
     400, None, "UTF-8"),
    ("utf8-f5-lead", "POST", C, b'{"prompt": "\xf5\x80\x80\x80", "max_tokens": 1}', None, 400,
     None, "UTF-8"),
    # cJSON's strings end at a NUL: the rest of the prompt would be dropped without a word
    ("prompt-nul", "POST", C, b'{"prompt": "ab\\u0000cd", "max_tokens": 1}', None, 400, None,
     "NUL"),
    ("stop-nul", "POST", C, b'{"prompt": "ab", "stop": ["x\\u0000"]}', None, 400, None, "NUL"),
    ("tokenize-nul", "POST", "/tokenize", b'{"prompt": "a\\u0000b"}', None, 400, None, "NUL"),
    # 64 prompts x n=16 x 1,025 tokens > --max-request-tokens' default 1,048,576 (a 200-byte
    # request asking for a body of gigabytes)
    ("request-tokens-over-limit", "POST", C,
     {"prompt": ["Once"] * 64, "n": 16, "max_tokens": 1025, "ignore_eos": True}, None, 400,
     "max_tokens", "--max-request-tokens"),
    ("min-tokens-over-max-tokens", "POST", C, {"prompt": "a", "max_tokens": 5, "min_tokens": 10},
     None, 400, "min_tokens", None),
    ("prompt-missing", "POST", C, {"max_tokens": 2}, None, 400, "prompt", None),
    ("prompt-empty", "POST", C, {"prompt": ""}, None, 400, "prompt", "empty"),
    ("prompt-empty-array", "POST", C, {"prompt": []}, None, 400, "prompt", None),
    ("prompt-empty-ids", "POST", C, {"prompt": [[]]}, None, 400, "prompt", None),
    ("prompt-number", "POST", C, {"prompt": 5}, None, 400, "prompt", None),
    ("prompt-object", "POST", C, {"prompt": {"a": 1}}, None, 400, "prompt", None),
    ("prompt-negative-id", "POST", C, {"prompt": [-1]}, None, 400, "prompt", None),
    ("prompt-id-beyond-vocab", "POST", C, {"prompt": [1, 100000]}, None, 400, "prompt", None),
    ("prompt-fractional-id", "POST", C, {"prompt": [1.5]}, None, 400, "prompt", None),
    ("prompt-mixed", "POST", C, {"prompt": [1, "a"]}, None, 400, "prompt", None),
    ("prompt-over-context", "POST", C, {"prompt": LONG_PROMPT, "max_tokens": 4}, None, 400,
     "prompt", "512"),
    ("prompt-plus-max-tokens-over-context", "POST", C, {"prompt": "Once", "max_tokens": 600},
     None, 400, "prompt", "512"),
    ("max-tokens-negative", "POST", C, {"prompt": "a", "max_tokens": -1}, None, 400,
     "max_tokens", None),
    ("max-tokens-zero", "POST", C, {"prompt": "a", "max_tokens": 0}, None, 400, "max_tokens", None),
    ("max-tokens-string", "POST", C, {"prompt": "a", "max_tokens": "ten"}, None, 400,
     "max_tokens", None),
    ("max-tokens-huge", "POST", C, {"prompt": "a", "max_tokens": 10**20}, None, 400, "max_tokens",
     None),
    ("max-tokens-inf", "POST", C, b'{"prompt": "a", "max_tokens": 1e400}', None, 400, "max_tokens",
     None),
    ("max-tokens-fraction", "POST", C, {"prompt": "a", "max_tokens": 1.5}, None, 400,
     "max_tokens", None),
    ("temperature-negative", "POST", C, {"prompt": "a", "temperature": -0.5}, None, 400,
     "temperature", None),
    ("temperature-huge", "POST", C, {"prompt": "a", "temperature": 1e9}, None, 400, "temperature",
     None),
    ("temperature-string", "POST", C, {"prompt": "a", "temperature": "hot"}, None, 400,
     "temperature", None),
    ("top-p-zero", "POST", C, {"prompt": "a", "top_p": 0}, None, 400, "top_p", None),
    ("top-p-above-one", "POST", C, {"prompt": "a", "top_p": 1.5}, None, 400, "top_p", None),
    ("top-k-string", "POST", C, {"prompt": "a", "top_k": "x"}, None, 400, "top_k", None),
    ("min-p-above-one", "POST", C, {"prompt": "a", "min_p": 2}, None, 400, "min_p", None),
    ("n-zero", "POST", C, {"prompt": "a", "n": 0}, None, 400, "n", None),
    ("n-huge", "POST", C, {"prompt": "a", "n": 100000}, None, 400, "n", None),
    ("n-string", "POST", C, {"prompt": "a", "n": "2"}, None, 400, "n", None),
    ("logprobs-too-many", "POST", C, {"prompt": "a", "logprobs": 21}, None, 400, "logprobs", None),
    ("logprobs-negative", "POST", C, {"prompt": "a", "logprobs": -1}, None, 400, "logprobs", None),
    ("stop-five", "POST", C, {"prompt": "a", "stop": ["a", "b", "c", "d", "e"]}, None, 400, "stop",
     None),
    ("stop-number", "POST", C, {"prompt": "a", "stop": 123}, None, 400, "stop", None),
    ("stop-empty-string", "POST", C, {"prompt": "a", "stop": [""]}, None, 400, "stop", None),
    ("stream-string", "POST", C, {"prompt": "a", "stream": "yes"}, None, 400, "stream", None),
    ("stream-options-without-stream", "POST", C,
     {"prompt": "a", "stream_options": {"include_usage": True}}, None, 400, "stream_options",
     None),
    ("logit-bias-array", "POST", C, {"prompt": "a", "logit_bias": [1]}, None, 400, "logit_bias",
     None),
    ("logit-bias-bad-key", "POST", C, {"prompt": "a", "logit_bias": {"abc": 1}}, None, 400,
     "logit_bias", None),
    ("logit-bias-huge-value", "POST", C, {"prompt": "a", "logit_bias": {"5": 1000}}, None, 400,
     "logit_bias", None),
    ("seed-string", "POST", C, {"prompt": "a", "seed": "x"}, None, 400, "seed", None),
    ("seed-fraction", "POST", C, {"prompt": "a", "seed": 1.5}, None, 400, "seed", None),
    ("suffix-unsupported", "POST", C, {"prompt": "a", "suffix": "xyz"}, None, 400, "suffix", None),
    ("echo-only-logprobs-range", "POST", C, {"prompt": "a", "echo": True, "max_tokens": 0,
                                             "logprobs": 21}, None, 400, "logprobs", None),
    ("prompt-logprobs-range", "POST", C, {"prompt": "a", "prompt_logprobs": 21}, None, 400,
     "prompt_logprobs", None),
    ("prompt-logprobs-string", "POST", C, {"prompt": "a", "prompt_logprobs": "x"}, None, 400,
     "prompt_logprobs", None),
    ("presence-penalty-range", "POST", C, {"prompt": "a", "presence_penalty": 5}, None, 400,
     "presence_penalty", None),
    ("frequency-penalty-range", "POST", C, {"prompt": "a", "frequency_penalty": -3}, None, 400,
     "frequency_penalty", None),
    ("user-number", "POST", C, {"prompt": "a", "user": 5}, None, 400, "user", None),
    ("model-unknown", "POST", C, {"model": "gpt-17", "prompt": "a"}, None, 404, "model",
     "gpt-17"),
    ("model-number", "POST", C, {"model": 42, "prompt": "a"}, None, 400, "model", None),
    ("messages-missing", "POST", CH, {"max_tokens": 2}, None, 400, "messages", None),
    ("messages-empty", "POST", CH, {"messages": []}, None, 400, "messages", None),
    ("messages-string", "POST", CH, {"messages": "hi"}, None, 400, "messages", None),
    ("message-bad-role", "POST", CH, {"messages": [{"role": "wizard", "content": "hi"}]}, None,
     400, "messages[0]", None),
    ("message-no-role", "POST", CH, {"messages": [{"content": "hi"}]}, None, 400, "messages[0]",
     None),
    ("message-content-number", "POST", CH, {"messages": [{"role": "user", "content": 5}]}, None,
     400, "messages[0]", None),
    ("message-image-part", "POST", CH,
     {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     None, 400, "messages[0]", None),
    ("top-logprobs-without-logprobs", "POST", CH,
     {"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}, None, 400,
     "top_logprobs", None),
    ("top-logprobs-too-many", "POST", CH,
     {"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 30},
     None, 400, "top_logprobs", None),
    ("chat-logprobs-string", "POST", CH,
     {"messages": [{"role": "user", "content": "hi"}], "logprobs": "yes"}, None, 400, "logprobs",
     None),
    ("tools-object", "POST", CH, {"messages": [{"role": "user", "content": "hi"}], "tools": {}},
     None, 400, "tools", None),
    ("max-completion-tokens-zero", "POST", CH,
     {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 0}, None, 400,
     "max_completion_tokens", None),
    ("chat-without-template", "POST", CH, {"messages": [{"role": "user", "content": "hi"}]},
     None, 400, "messages", "chat template"),
    ("tokenize-no-prompt", "POST", "/tokenize", {"text": "a"}, None, 400, "prompt", None),
    ("tokenize-bad-json", "POST", "/tokenize", b"{", None, 400, None, None),
    ("tokenize-invalid-utf8", "POST", "/tokenize", b'{"prompt": "\xff"}', None, 400, None,
     "UTF-8"),
    ("detokenize-negative", "POST", "/detokenize", {"tokens": [-1]}, None, 400, "tokens", None),
    ("detokenize-not-array", "POST", "/detokenize", {"tokens": "1 2"}, None, 400, "tokens", None),
    ("body-10mb", "POST", C, b'{"prompt": "' + b"a" * (10 << 20) + b'"}', None, 413, None, None),
    ("body-10mb-chat", "POST", CH, b'{"messages": [{"role": "user", "content": "'
     + b"a" * (10 << 20) + b'"}]}', None, 413, None, None),
    ("unknown-route", "GET", "/v1/engines", None, None, 404, None, None),
    ("unknown-route-post", "POST", "/v1/audio/transcriptions", {"file": "a"}, None, 404, None,
     None),
    ("embeddings-get", "GET", "/v1/embeddings", None, None, 405, None, "POST"),
    ("wrong-method-get", "GET", C, None, None, 405, None, "POST"),
    ("wrong-method-delete", "DELETE", "/v1/models", None, None, 405, None, "GET"),
    ("wrong-method-post-health", "POST", "/health", {}, None, 405, None, None),
    ("key-missing", "POST", C, {"prompt": "a"}, {}, 401, None, None),
    ("key-wrong", "POST", C, {"prompt": "a"}, {"Authorization": "Bearer nope"}, 401, None, None),
    ("key-prefix", "POST", C, {"prompt": "a"}, {"Authorization": f"Bearer {KEY[:-1]}"}, 401,
     None, None),
    ("key-longer", "POST", C, {"prompt": "a"}, {"Authorization": f"Bearer {KEY}x"}, 401, None,
     None),
    ("key-basic-scheme", "POST", C, {"prompt": "a"}, {"Authorization": f"Basic {KEY}"}, 401,
     None, None),
    ("key-missing-models", "GET", "/v1/models", None, {}, 401, None, None),
]


def send(server, method, path, body, headers):
    h = dict(AUTH if headers is None else headers)
    data = None
    if isinstance(body, dict):
        data = json.dumps(body).encode()
        h["Content-Type"] = "application/json"
    elif isinstance(body, bytes):
        data = body
        h["Content-Type"] = "application/json"
    return requests.request(method, server.url(path), data=data, headers=h, timeout=60)


def test_at_least_40_cases():
    assert len(CASES) >= 40


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_error_case(server, case):
    name, method, path, body, headers, status, param, msg = case
    r = send(server, method, path, body, headers)
    assert r.status_code == status, f"{name}: {r.status_code} {r.text[:500]}"
    assert r.headers["Content-Type"].startswith("application/json")
    err = r.json()
    validate(err, "ErrorResponse")
    assert err["error"]["message"] and err["error"]["type"]
    if status == 401:
        assert err["error"]["type"] == "authentication_error"
    if param is not None:
        assert err["error"]["param"] == param, err
    if msg is not None:
        assert msg in err["error"]["message"], err


def test_prompt_over_context_says_the_numbers(server):
    r = send(server, "POST", C, {"prompt": LONG_PROMPT, "max_tokens": 4}, None)
    assert r.status_code == 400
    n = requests.post(server.url("/tokenize"), json={"prompt": LONG_PROMPT}, headers=AUTH,
                      timeout=30).json()["count"]
    m = r.json()["error"]["message"]
    assert "512" in m and str(n) in m and r.json()["error"]["code"] == "context_length_exceeded"


def test_escaped_backslash_before_u0000_is_text(server):
    """'\\\\u0000' in JSON is a backslash and the text "u0000", not a NUL: taken."""
    r = send(server, "POST", C, b'{"prompt": "a\\\\u0000", "max_tokens": 1}', None)
    assert r.status_code == 200, r.text


def test_bearer_scheme_is_case_insensitive(server):
    for scheme in ("bearer", "BEARER"):
        r = send(server, "POST", C, GREEDY, {"Authorization": f"{scheme} {KEY}"})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == server.reference


def test_declared_oversized_body_refused_before_it_is_sent(server):
    """A Content-Length past --max-body-bytes with "Expect: 100-continue": a 413 comes back
    at once (no "100 Continue"), without the client sending a byte of the body."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sk:
        sk.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                   + KEY.encode() + b"\r\nContent-Type: application/json\r\n"
                   b"Content-Length: 50000000\r\nExpect: 100-continue\r\n\r\n")
        out = b""
        while b"\r\n\r\n" not in out or b"}" not in out.split(b"\r\n\r\n", 1)[1]:
            chunk = sk.recv(65536)
            if not chunk:
                break
            out += chunk
    assert out.startswith(b"HTTP/1.1 413"), out[:300]
    err = json.loads(out.split(b"\r\n\r\n", 1)[1])
    validate(err, "ErrorResponse")
    assert err["error"]["code"] == "request_too_large"


def test_conflicting_content_lengths_refused(server):
    """Two Content-Length headers that disagree: a 400, whichever the server would have
    framed the body by (RFC 9112 6.3; the request-smuggling case behind a proxy)."""
    body = json.dumps(GREEDY).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sk:
        sk.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                   + KEY.encode() + b"\r\nContent-Type: application/json\r\nContent-Length: "
                   + str(len(body)).encode() + b"\r\nContent-Length: 5\r\n\r\n" + body)
        out = b""
        while chunk := sk.recv(65536):
            out += chunk
            if b"\r\n\r\n" in out and out.rstrip().endswith(b"}"):
                break
    assert out.startswith(b"HTTP/1.1 400"), out[:300]
    err = json.loads(out.split(b"\r\n\r\n", 1)[1])
    validate(err, "ErrorResponse")
    assert err["error"]["code"] == "bad_content_length"


def _vocab(path):
    gguf = pytest.importorskip("gguf")
    f = gguf.GGUFReader(str(path)).fields["tokenizer.ggml.tokens"]
    return [bytes(f.parts[i]).decode("utf-8") for i in f.data]


def test_ill_formed_bytes_come_out_as_replacement_characters(server):
    """Byte tokens forced out of place (stories260K's <0xFF>, <0xE2>) never put raw ill-formed
    UTF-8 into a response: each maximal ill-formed subpart is U+FFFD, as Python's
    bytes.decode("utf-8", "replace") (and HF's ByteLevel decoder) gives, in bodies and streams;
    /detokenize the same."""
    vocab = _vocab(STORIES)
    for piece, n in (("<0xFF>", 3), ("<0xE2>", 2)):
        tid = vocab.index(piece)
        want = (bytes([int(piece[3:5], 16)]) * n).decode("utf-8", "replace")
        body = {"prompt": "Once", "max_tokens": n, "temperature": 0, "logit_bias": {str(tid): 100}}
        r = send(server, "POST", C, body, None)
        assert r.status_code == 200, r.text
        text = json.loads(r.content.decode("utf-8"))["choices"][0]["text"]  # strict UTF-8
        assert text == want, (piece, text)
        r = send(server, "POST", C, dict(body, stream=True), None)
        got = ""
        for line in r.content.decode("utf-8").splitlines():  # strict: fails on a raw byte
            if line.startswith("data: {"):
                got += "".join(c["text"] for c in json.loads(line[6:])["choices"])
        assert got == want, (piece, got)
        r = send(server, "POST", "/detokenize", {"tokens": [tid] * n}, None)
        assert r.status_code == 200 and r.json()["prompt"] == want, r.text


@pytest.fixture(scope="module")
def qwen_tmpl_server(tmp_path_factory):
    """stories260K with Qwen2.5's chat template (which renders tools and tool calls), set by
    gguf-new-metadata."""
    tool = Path(sys.executable).with_name("gguf-new-metadata")
    if not tool.exists():
        pytest.skip("gguf-new-metadata (the gguf package) is not installed")
    model = tmp_path_factory.mktemp("qwen-tmpl") / "stories-qwen-template.gguf"
    subprocess.run([str(tool), str(STORIES), str(model), "--chat-template-file",
                    str(DATA / "chat-templates" / "Qwen-Qwen2.5-7B-Instruct.jinja")],
                   check=True, capture_output=True)
    s = Server(model)
    s.start()
    yield s
    s.stop()


def test_chat_assistant_tool_calls_without_content(qwen_tmpl_server):
    """OpenAI lets an assistant message with tool_calls leave out content: it is taken as null,
    so the answer equals the one with "content": null."""
    s = qwen_tmpl_server
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    msgs = [{"role": "user", "content": "What is f?"},
            {"role": "assistant", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "42"}]
    body = {"messages": msgs, "max_tokens": 6, "temperature": 0}
    a = requests.post(s.url(CH), json=body, timeout=60)
    assert a.status_code == 200, a.text
    body["messages"][1] = dict(msgs[1], content=None)
    b = requests.post(s.url(CH), json=body, timeout=60)
    assert b.status_code == 200, b.text
    assert a.json()["choices"][0]["message"] == b.json()["choices"][0]["message"]
    ua, ub = a.json()["usage"], b.json()["usage"]
    assert ua.pop("prompt_tokens_details")["cached_tokens"] == 0  # b's prompt was a's
    assert ub.pop("prompt_tokens_details")["cached_tokens"] > 0
    assert ua == ub


TOOLS = [{"type": "function", "function": {"name": "w", "parameters": {"type": "object"}}}]


def test_tool_choice(qwen_tmpl_server):
    """tool_choice "auto" (and absent) shows the template the tools; "none" does not, so its
    prompt is the one without tools; a value that is none of the four forms is refused.
    ("required" and a named function: test_json_output.py.)"""
    s = qwen_tmpl_server
    base = {"messages": [{"role": "user", "content": "Oslo?"}], "max_tokens": 4,
            "temperature": 0}

    def prompt_tokens(body):
        r = requests.post(s.url(CH), json=body, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()["usage"]["prompt_tokens"]

    plain = prompt_tokens(base)
    with_tools = prompt_tokens(dict(base, tools=TOOLS))
    assert with_tools > plain + 20
    assert prompt_tokens(dict(base, tools=TOOLS, tool_choice="auto")) == with_tools
    assert prompt_tokens(dict(base, tools=TOOLS, tool_choice="none")) == plain
    for choice in ["sometimes", {"type": "function"}, 3]:
        r = requests.post(s.url(CH), json=dict(base, tools=TOOLS, tool_choice=choice), timeout=60)
        assert r.status_code == 400, r.text
        validate(r.json(), "ErrorResponse")
        assert r.json()["error"]["param"] == "tool_choice"


def test_unknown_fields_are_ignored(server):
    body = dict(GREEDY, frobnicate={"x": [1, 2]}, another_unknown_field=True, logit_bias=None,
                user="someone", metadata={"k": "v"})
    r = send(server, "POST", C, body, None)
    assert r.status_code == 200, r.text
    validate(r.json(), "CreateCompletionResponse")
    assert r.json()["choices"][0]["text"] == server.reference


def test_public_routes_need_no_key(server):
    assert requests.get(server.url("/health"), timeout=10).status_code == 200
    assert requests.get(server.url("/metrics"), timeout=10).status_code == 200


def test_raw_socket_garbage(server):
    """Non-HTTP bytes, a truncated body and a huge header: the server drops or answers them, and
    stays up."""
    def raw(payload, read=True):
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
            out = b""
            try:  # the server may drop the connection at any point: that is a fine answer
                s.sendall(payload)
                if read:
                    s.shutdown(socket.SHUT_WR)
                    while chunk := s.recv(65536):
                        out += chunk
            except OSError:
                pass
            return out
    raw(b"\x00\x01\x02 garbage \r\n\r\n")
    # a body cut short: the client goes away without the rest (the server must not wait forever
    # nor keep anything for it)
    raw(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"prompt\"",
        read=False)
    out = raw(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n")
    assert not out.startswith(b"HTTP/1.1 200"), out[:200]
    raw(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n")
    assert requests.get(server.url("/health"), timeout=10).status_code == 200


def test_still_correct_after_the_abuse(server):
    """Runs last in this module (pytest keeps file order): the greedy answer has not changed."""
    r = requests.post(server.url("/v1/completions"), json=GREEDY, headers=AUTH, timeout=60)
    assert r.status_code == 200
    assert r.json()["choices"][0]["text"] == server.reference
    # no request is left running, no block is left allocated
    m = server.wait_metrics(lambda m: m["pagoda:num_requests_running"] == 0 and
                            m["pagoda:kv_cache_blocks_used"] == 0, timeout=10)
    assert m["pagoda:num_requests_running"] == 0
    assert m["pagoda:kv_cache_blocks_used"] == 0


def test_bad_configuration_exits_nonzero(tmp_path):
    import subprocess
    from server_util import SERVER_BIN
    p = subprocess.run([str(SERVER_BIN), "serve", "--help"], capture_output=True, text=True,
                       timeout=30)
    assert p.returncode == 0
    for flag in ("--api-key", "--port", "--host", "--max-body-bytes", "--drain-timeout",
                 "PAGODA_API_KEY", "--config"):
        assert flag in p.stdout, flag
    for args in (["-m", str(tmp_path / "missing.gguf"), "--port", "0"],
                 ["--port", "70000"], ["--no-such-flag"], ["--kv-dtype", "f8"],
                 ["--host", "not-an-ip", "--port", "0"], ["--port=70000"], ["--no-port"],
                 ["--log-requests=maybe"]):
        p = subprocess.run([str(SERVER_BIN), "serve", "-t", "1"] + args, capture_output=True,
                           text=True, timeout=60)
        assert p.returncode != 0, args
        assert "pagoda" in p.stderr, (args, p.stderr)


def test_flag_forms_and_switching_a_default_off():
    """--name=value sets an option as --name value does, and --no-log-requests (or
    --log-requests=false) turns off a switch that is on by default: no access-log line."""
    for off in ("--no-log-requests", "--log-requests=false"):
        s = Server(STORIES, "--max-body-bytes=2KiB", off)
        s.start()
        try:
            r = requests.post(s.url(C), json={"prompt": "a" * 3000}, timeout=30)
            assert r.status_code == 413, r.text  # 2 KiB took effect
            r = requests.post(s.url(C), json=GREEDY, timeout=60)
            assert r.status_code == 200, r.text
        finally:
            s.stop()
        assert '"event":"request"' not in s.stderr(), off
    s = Server(STORIES)
    s.start()
    try:
        requests.post(s.url(C), json=GREEDY, timeout=60)
    finally:
        s.stop()
    assert '"event":"request"' in s.stderr()  # the default logs


def test_sigterm_while_loading_exits_0(default_model):
    """SIGTERM right after the listening line, while the model may still be loading."""
    import subprocess
    import time
    from server_util import SERVER_BIN
    p = subprocess.Popen([str(SERVER_BIN), "serve", "-m", str(default_model), "--port", "0",
                          "-t", "1"], stderr=subprocess.PIPE, text=True)
    line = p.stderr.readline()
    assert '"listening"' in line, line
    time.sleep(0.05)
    p.terminate()
    rest = p.communicate(timeout=120)[1]
    assert p.returncode == 0, rest
    from server_util import check_no_sanitizer_report
    check_no_sanitizer_report(rest)
