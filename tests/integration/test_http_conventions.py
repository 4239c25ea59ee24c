"""The HTTP and OpenAI conventions clients rely on beyond the bodies: 404 model_not_found as
OpenAI's NotFoundError, models.retrieve, a real `created`, X-Request-Id, CORS as vLLM's
Starlette middleware answers it, HEAD, Allow on a 405, keep-alive on GET, 415 for a compressed
body, /version. Runs on stories260K (small and fast: no chat needed)."""
import gzip
import http.client
import json
import time

import pytest
import requests

from server_util import STORIES, Server, validate

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def server():
    t0 = int(time.time())
    s = Server(STORIES)
    s.start()
    s.t0 = t0
    yield s
    s.stop()


@pytest.fixture(scope="module")
def strict_cors():
    s = Server(STORIES, "--allowed-origins", '["https://app.example"]', "--allowed-methods",
               "GET,POST", "--allowed-headers", "authorization", "--allow-credentials")
    s.start()
    yield s
    s.stop()


def client(s):
    return openai.OpenAI(base_url=s.url("/v1"), api_key="x", max_retries=0, timeout=60)


def test_unknown_model_is_openai_not_found(server):
    with pytest.raises(openai.NotFoundError) as ei:
        client(server).completions.create(model="gpt-17", prompt="a", max_tokens=1)
    assert ei.value.status_code == 404
    assert ei.value.code == "model_not_found" and ei.value.param == "model"
    validate(ei.value.response.json(), "ErrorResponse")


def test_models_retrieve_and_created(server):
    c = client(server)
    listed = c.models.list().data
    m = c.models.retrieve(listed[0].id)
    assert m.id == listed[0].id and m.object == "model"
    assert server.t0 - 5 <= m.created <= time.time() + 5  # a real timestamp, not 0
    assert listed[0].created == m.created
    validate(requests.get(server.url(f"/v1/models/{m.id}"), timeout=10).json(), "Model")
    with pytest.raises(openai.NotFoundError):
        c.models.retrieve("no-such-model")


def test_request_id_echoed_or_made(server):
    r = requests.get(server.url("/health"), headers={"X-Request-Id": "trace-42"}, timeout=10)
    assert r.headers["X-Request-Id"] == "trace-42"
    r = requests.post(server.url("/v1/completions"), json={"prompt": "a", "max_tokens": 2},
                      timeout=60)
    assert r.status_code == 200 and r.headers["X-Request-Id"] == r.json()["id"]
    r = requests.post(server.url("/v1/completions"), json={"prompt": 5}, timeout=60)
    assert r.status_code == 400 and r.headers["X-Request-Id"]
    ids = {requests.get(server.url("/v1/models"), timeout=10).headers["X-Request-Id"]
           for _ in range(3)}
    assert len(ids) == 3  # one per request
    with requests.post(server.url("/v1/completions"), stream=True, timeout=60,
                       headers={"X-Request-Id": "stream-7"},
                       json={"prompt": "a", "max_tokens": 2, "stream": True}) as r:
        assert r.headers["X-Request-Id"] == "stream-7"


def test_head_allow_and_version(server):
    g = requests.get(server.url("/v1/models"), timeout=10)
    h = requests.head(server.url("/v1/models"), timeout=10)
    assert h.status_code == 200 and h.content == b""
    assert h.headers["Content-Length"] == g.headers["Content-Length"]
    r = requests.put(server.url("/v1/models"), timeout=10)
    assert r.status_code == 405 and r.headers["Allow"] == "GET, HEAD"
    validate(r.json(), "ErrorResponse")
    r = requests.get(server.url("/v1/chat/completions"), timeout=10)
    assert r.status_code == 405 and r.headers["Allow"] == "POST"
    r = requests.get(server.url("/version"), timeout=10)
    assert r.status_code == 200
    out = __import__("subprocess").run([str(server.binary), "--version"], capture_output=True,
                                       text=True)
    assert out.stdout.split()[-1] == r.json()["version"]


def test_get_keeps_the_connection(server):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    for path in ("/health", "/v1/models", "/metrics", "/version"):
        conn.request("GET", path)
        r = r0 = conn.getresponse()
        r.read()
        assert r.status == 200 and r0.getheader("Connection") != "close", path
        assert not r.will_close, path
    sock = conn.sock
    conn.request("GET", "/health")
    conn.getresponse().read()
    assert conn.sock is sock  # the same socket served every request
    conn.close()


def test_compressed_body_is_415(server):
    body = gzip.compress(json.dumps({"prompt": "a", "max_tokens": 1}).encode())
    r = requests.post(server.url("/v1/completions"), data=body, timeout=10,
                      headers={"Content-Encoding": "gzip", "Content-Type": "application/json"})
    assert r.status_code == 415, r.text
    validate(r.json(), "ErrorResponse")


def test_cors_default_allows_any_origin(server):
    """vLLM's defaults (*): a cross-origin answer says Access-Control-Allow-Origin: *, and a
    preflight is answered 200 with the requested headers allowed."""
    r = requests.get(server.url("/v1/models"), headers={"Origin": "https://x.example"},
                     timeout=10)
    assert r.headers["Access-Control-Allow-Origin"] == "*"
    assert "Access-Control-Allow-Origin" not in requests.get(server.url("/v1/models"),
                                                             timeout=10).headers
    r = requests.options(server.url("/v1/chat/completions"), timeout=10, headers={
        "Origin": "https://x.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    assert r.status_code == 200 and r.text == "OK"
    assert r.headers["Access-Control-Allow-Origin"] == "*"
    assert "POST" in r.headers["Access-Control-Allow-Methods"].split(", ")
    assert r.headers["Access-Control-Allow-Headers"] == "authorization, content-type"
    assert r.headers["Access-Control-Max-Age"] == "600"
    # OPTIONS that is not a preflight is a plain 405
    r = requests.options(server.url("/v1/chat/completions"), timeout=10)
    assert r.status_code == 405 and r.headers["Allow"] == "POST"


def test_cors_restricted(strict_cors):
    s = strict_cors
    ok = {"Origin": "https://app.example", "Access-Control-Request-Method": "POST",
          "Access-Control-Request-Headers": "Authorization"}
    r = requests.options(s.url("/v1/completions"), headers=ok, timeout=10)
    assert r.status_code == 200, r.text
    assert r.headers["Access-Control-Allow-Origin"] == "https://app.example"
    assert r.headers["Access-Control-Allow-Credentials"] == "true"
    assert r.headers["Vary"] == "Origin"
    assert r.headers["Access-Control-Allow-Methods"] == "GET, POST"
    assert r.headers["Access-Control-Allow-Headers"] == \
        "accept, accept-language, authorization, content-language, content-type"
    for change, refused in (({"Origin": "https://evil.example"}, "origin"),
                            ({"Access-Control-Request-Method": "DELETE"}, "method"),
                            ({"Access-Control-Request-Headers": "x-secret"}, "headers")):
        r = requests.options(s.url("/v1/completions"), headers={**ok, **change}, timeout=10)
        assert r.status_code == 400 and r.text == f"Disallowed CORS {refused}", (change, r.text)
    r = requests.get(s.url("/v1/models"), headers={"Origin": "https://app.example"}, timeout=10)
    assert r.headers["Access-Control-Allow-Origin"] == "https://app.example"
    r = requests.get(s.url("/v1/models"), headers={"Origin": "https://evil.example"}, timeout=10)
    assert "Access-Control-Allow-Origin" not in r.headers


def test_several_served_names():
    """vLLM's --served-model-name takes several names: each is accepted as "model" (an agent
    that sends its own model name can be pointed at Pagoda), /v1/models lists each, and
    answers name the first."""
    s = Server(STORIES, "--served-model-name", "tiny, claude-sonnet-4-5")
    s.start()
    try:
        c = client(s)
        assert [m.id for m in c.models.list().data] == ["tiny", "claude-sonnet-4-5"]
        assert c.models.retrieve("claude-sonnet-4-5").id == "claude-sonnet-4-5"
        for name in ("tiny", "claude-sonnet-4-5"):
            r = c.completions.create(model=name, prompt="a", max_tokens=2)
            assert r.model == "tiny"
        with pytest.raises(openai.NotFoundError):
            c.completions.create(model="tiny,", prompt="a", max_tokens=2)
    finally:
        s.stop()


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", b'{"prompt": "a", "max_tokens": 1, "max_tokens": 900}'),
    ("/v1/completions", b'{"prompt": "a", "logit_bias": {"5": 1, "6": 2, "5": -100}}'),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "a", "role": "x"}]}'),
    ("/v1/embeddings", b'{"input": "a", "input": "b"}'),
    ("/tokenize", b'{"prompt": "a", "prompt": "b"}'),
    ("/v1/responses", b'{"input": "a", "store": false, "store": true}'),
    ("/v1/messages", b'{"model": "m", "max_tokens": 1, "messages": [], "max_tokens": 2}'),
])
def test_duplicate_keys_refused(server, path, body):
    """A key twice in one object, at any depth, is a 400 naming it on every route (neither
    cJSON's first-wins nor the usual last-wins: a proxy must not read another request)."""
    r = requests.post(server.url(path), data=body, timeout=30,
                      headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    j = r.json()
    msg = j["error"]["message"]
    assert "twice" in msg and ("'max_tokens'" in msg or "'5'" in msg or "'role'" in msg or
                               "'input'" in msg or "'prompt'" in msg or "'store'" in msg), j
    # the same keys once each are fine (where the route can serve stories260K)
    if path == "/v1/completions":
        ok = requests.post(server.url(path), json={"prompt": "a", "max_tokens": 1}, timeout=30)
        assert ok.status_code == 200
    # a wide object (sorted, not quadratic) with one repeat deep inside
    wide = "{" + ",".join(f'"{i}": 0' for i in range(20000)) + ', "7": 1}'
    r = requests.post(server.url("/v1/completions"), timeout=30,
                      data=('{"prompt": "a", "logit_bias": ' + wide + "}").encode())
    assert r.status_code == 400 and "'7'" in r.json()["error"]["message"], r.text
