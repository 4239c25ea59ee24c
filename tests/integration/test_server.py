"""The OpenAI-compatible server against the official `openai` SDK and the OpenAI schema file, on
the default model (SmolLM2-135M-Instruct): completions and chat, streaming and not, n > 1, stop
strings, logprobs, seeds, usage, the other endpoints, and the README's curl examples as written.
max_tokens stays small: the model decodes ~40 tokens/s on 2 cores."""
import json
import re
import subprocess

import pytest
import requests

import server_util
from server_util import sse_events, validate

openai = pytest.importorskip("openai")

PROMPT = "The capital of France is"
CHAT = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def server(default_server):
    return default_server


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url("/v1"), api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model_id(client):
    return client.models.list().data[0].id


def post(server, path, body, **kw):
    return requests.post(server.url(path), json=body, timeout=120, **kw)


def n_tokens(server, text):
    r = post(server, "/tokenize", {"prompt": text})
    assert r.status_code == 200, r.text
    return r.json()["count"]


# ---- plain endpoints ----

def test_health_models_metrics(server, client):
    r = requests.get(server.url("/health"), timeout=10)
    assert r.status_code == 200 and r.json()["status"] == "ok"
    r = requests.get(server.url("/v1/models"), timeout=10)
    assert r.status_code == 200
    validate(r.json(), "ListModelsResponse")
    models = client.models.list().data
    assert len(models) == 1 and models[0].id == "SmolLM2-135M-Instruct.Q4_1.gguf"
    m = server.metrics()
    for name in ("pagoda:num_requests_running", "pagoda:num_requests_waiting",
                 "pagoda:kv_cache_usage_perc", "pagoda:kv_cache_fragmentation_perc",
                 "pagoda:prefix_cache_queries_total", "pagoda:prefix_cache_hits_total",
                 "pagoda:num_preemptions_total", "pagoda:prompt_tokens_total",
                 "pagoda:generation_tokens_total",
                 "pagoda:request_success_total{finished_reason=stop}",
                 "pagoda:time_to_first_token_seconds_count",
                 "pagoda:inter_token_latency_seconds_count",
                 "pagoda:e2e_request_latency_seconds_count",
                 "pagoda:request_queue_time_seconds_count"):
        assert name in m, f"{name} missing from /metrics"


def test_cached_tokens_are_the_prefix_cache_hits(server):
    """usage.prompt_tokens_details.cached_tokens (OpenAI's field) counts the prompt tokens the
    prefix cache served: 0 for a new prompt, then exactly what /metrics' hit counter gained."""
    body = {"messages": [{"role": "user", "content": "Name three colours of the rainbow, "
                          "and say which one you like best and why. " * 3}],
            "max_tokens": 2, "temperature": 0}
    hits = lambda: server.metrics()["pagoda:prefix_cache_hits_total"]
    h0 = hits()
    a = post(server, "/v1/chat/completions", body).json()["usage"]
    h1 = hits()
    b = post(server, "/v1/chat/completions", body).json()["usage"]
    h2 = hits()
    assert a["prompt_tokens_details"]["cached_tokens"] == h1 - h0
    assert b["prompt_tokens_details"]["cached_tokens"] == h2 - h1 > 0
    assert b["prompt_tokens_details"]["cached_tokens"] < b["prompt_tokens"]


def test_one_token_answers_leave_their_prompt_cached(server):
    """A request that ends on its first token (max_tokens 1, as a classifier or a scoring call
    sends) still leaves its prompt's full blocks to the prefix cache: the same prompt again is
    served all of them (it used to lose the last prefill chunk's blocks: 0 cached here)."""
    words = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima".split()
    text = " ".join(words[i % len(words)] + str(i) for i in range(60))
    body = {"prompt": text, "max_tokens": 1, "temperature": 0}
    a = post(server, "/v1/completions", body).json()["usage"]
    b = post(server, "/v1/completions", body).json()["usage"]
    assert a["prompt_tokens_details"]["cached_tokens"] == 0
    n = a["prompt_tokens"]
    assert n > 32
    # every full block of 16 but the one holding the last token, which is always recomputed
    assert b["prompt_tokens_details"]["cached_tokens"] == (n - 1) // 16 * 16


def test_tokenize_detokenize(server):
    r = post(server, "/tokenize", {"prompt": "Hello world, how are you?"})
    assert r.status_code == 200
    ids = r.json()["tokens"]
    assert r.json()["count"] == len(ids) > 0
    r = post(server, "/detokenize", {"tokens": ids})
    assert r.status_code == 200 and r.json()["prompt"] == "Hello world, how are you?"


# ---- completions ----

def test_completion_greedy_usage_schema(server, client, model_id):
    r = post(server, "/v1/completions", {"model": model_id, "prompt": PROMPT, "max_tokens": 6,
                                          "temperature": 0})
    assert r.status_code == 200, r.text
    validate(r.json(), "CreateCompletionResponse")
    c = client.completions.create(model=model_id, prompt=PROMPT, max_tokens=6, temperature=0)
    assert c.object == "text_completion" and len(c.choices) == 1
    assert c.choices[0].text == r.json()["choices"][0]["text"]  # greedy is deterministic
    assert c.choices[0].text.startswith(" Paris")
    assert c.choices[0].finish_reason == "length"
    assert c.usage.prompt_tokens == n_tokens(server, PROMPT)
    assert c.usage.completion_tokens == 6
    assert c.usage.total_tokens == c.usage.prompt_tokens + 6


def test_completion_stream_matches_and_counts(server, client, model_id):
    full = client.completions.create(model=model_id, prompt=PROMPT, max_tokens=8, temperature=0)
    with requests.post(server.url("/v1/completions"), stream=True, timeout=120,
                       json={"prompt": PROMPT, "max_tokens": 8, "temperature": 0, "stream": True,
                             "stream_options": {"include_usage": True}}) as r:
        assert r.status_code == 200
        assert r.headers["Content-Type"].startswith("text/event-stream")
        events = list(sse_events(r.iter_lines()))
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    for ch in chunks:
        validate(ch, "CompletionStreamChunk")  # CreateCompletionResponse, finish_reason nullable
    for ch in chunks[:-2]:
        assert ch["choices"][0]["finish_reason"] is None
    usage = chunks[-1]["usage"]
    assert chunks[-1]["choices"] == []
    text_chunks = [c for c in chunks[:-1] if c["choices"][0]["text"]]
    assert "".join(c["choices"][0]["text"] for c in chunks[:-1]) == full.choices[0].text
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    # every token of this English text decodes to non-empty text: one chunk per token
    assert usage["completion_tokens"] == len(text_chunks) == 8
    assert usage["prompt_tokens"] == n_tokens(server, PROMPT)
    assert len({c["id"] for c in chunks}) == 1
    # and through the SDK
    stream = client.completions.create(model=model_id, prompt=PROMPT, max_tokens=8, temperature=0,
                                       stream=True)
    assert "".join(c.choices[0].text for c in stream if c.choices) == full.choices[0].text


def test_completion_n_and_prompt_forms(server, client, model_id):
    c = client.completions.create(model=model_id, prompt=PROMPT, max_tokens=4, n=3, temperature=1,
                                  seed=7)
    assert sorted(ch.index for ch in c.choices) == [0, 1, 2]
    assert c.usage.completion_tokens == 12  # n=3 x 4 (no EOS within 4 tokens at this prompt)
    assert c.usage.prompt_tokens == n_tokens(server, PROMPT)
    validate(c.model_dump(exclude_unset=True), "CreateCompletionResponse")
    # array of strings, token ids, array of token-id arrays: all the same greedy answer
    ids = post(server, "/tokenize", {"prompt": PROMPT}).json()["tokens"]
    a = client.completions.create(model=model_id, prompt=[PROMPT, "Once upon a time"],
                                  max_tokens=4, temperature=0)
    b = client.completions.create(model=model_id, prompt=ids, max_tokens=4, temperature=0)
    d = client.completions.create(model=model_id, prompt=[ids, ids], max_tokens=4, temperature=0)
    assert len(a.choices) == 2 and len(d.choices) == 2
    assert a.choices[0].text == b.choices[0].text == d.choices[0].text == d.choices[1].text
    # streaming n=2: both indexes stream to a finish
    stream = client.completions.create(model=model_id, prompt=PROMPT, max_tokens=3, n=2,
                                       temperature=0, stream=True)
    texts, fins = {0: "", 1: ""}, {}
    for ch in stream:
        for c2 in ch.choices:
            texts[c2.index] += c2.text
            if c2.finish_reason:
                fins[c2.index] = c2.finish_reason
    assert fins == {0: "length", 1: "length"} and texts[0] == texts[1]


def test_completion_stop_strings(server, client, model_id):
    base = client.completions.create(model=model_id, prompt=PROMPT, max_tokens=12,
                                      temperature=0).choices[0].text
    words = base.split()
    assert len(words) >= 3, base
    stop = words[2]
    cut = base[:base.index(stop)]
    c = client.completions.create(model=model_id, prompt=PROMPT, max_tokens=12, temperature=0,
                                  stop=[stop, "zzzzqqq"])
    assert c.choices[0].text == cut and c.choices[0].finish_reason == "stop"
    stream = client.completions.create(model=model_id, prompt=PROMPT, max_tokens=12,
                                       temperature=0, stop=stop, stream=True)
    parts = list(stream)
    assert "".join(p.choices[0].text for p in parts if p.choices) == cut
    assert parts[-1].choices[0].finish_reason == "stop"


def test_completion_echo(server, client, model_id):
    c = client.completions.create(model=model_id, prompt=PROMPT, max_tokens=3, temperature=0,
                                  echo=True)
    plain = client.completions.create(model=model_id, prompt=PROMPT, max_tokens=3, temperature=0)
    assert c.choices[0].text == PROMPT + plain.choices[0].text


def test_completion_echo_token_ids(server):
    """A prompt of token ids is echoed as their text (the ids' decode), as vLLM does: the same
    response as for the text prompt."""
    ids = post(server, "/tokenize", {"prompt": PROMPT}).json()["tokens"]
    a = post(server, "/v1/completions", {"prompt": ids, "max_tokens": 3, "temperature": 0,
                                         "echo": True})
    b = post(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 3, "temperature": 0,
                                         "echo": True})
    assert a.status_code == b.status_code == 200, a.text
    assert a.json()["choices"][0]["text"] == b.json()["choices"][0]["text"]
    assert b.json()["choices"][0]["text"].startswith(PROMPT)


def test_min_tokens_defers_stop_strings(server):
    """No stop string ends the generation before min_tokens (vLLM's rule): the text is the
    unconstrained greedy text cut at the first stop that starts in the min_tokens-th token's text
    or later (located by that run's text_offset), and at least min_tokens tokens long."""
    base = post(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 24, "temperature": 0,
                                            "logprobs": 0}).json()["choices"][0]
    text, off = base["text"], base["logprobs"]["text_offset"]
    m = 8
    assert text.find(" ") < off[m - 1] < text.find(" ", off[m - 1]), text  # a space before too
    r = post(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 24, "temperature": 0,
                                         "stop": [" "], "min_tokens": m})
    assert r.status_code == 200, r.text
    c = r.json()["choices"][0]
    assert c["text"] == text[:text.find(" ", off[m - 1])] and c["finish_reason"] == "stop"
    assert r.json()["usage"]["completion_tokens"] >= m


def test_logprobs_text_offset_unmoved_by_stop_strings(server):
    """The text held back while a stop string might match does not shift text_offset: with a
    stop string that never matches, the offsets equal the run's without one, streamed or not."""
    body = {"prompt": PROMPT, "max_tokens": 8, "temperature": 0, "logprobs": 0}
    want = post(server, "/v1/completions", body).json()["choices"][0]["logprobs"]["text_offset"]
    assert want[0] == 0 and want == sorted(want) and want[-1] > 0
    held = dict(body, stop=["zzzzzzzzzzzzzzzzzzzz"])
    got = post(server, "/v1/completions", held).json()["choices"][0]["logprobs"]["text_offset"]
    assert got == want
    r = requests.post(server.url("/v1/completions"), json=dict(held, stream=True), timeout=120)
    streamed = [o for ev in sse_events(r.iter_lines()) if ev != "[DONE]"
                for ch in ev["choices"] if ch.get("logprobs")
                for o in ch["logprobs"]["text_offset"]]
    assert streamed == want


def test_seed_reproducible(server, client, model_id):
    def run(seed):
        return client.completions.create(model=model_id, prompt="Once upon a time", max_tokens=10,
                                         temperature=1.0, seed=seed).choices[0].text
    a, b = run(1234), run(1234)
    assert a == b
    others = {run(s) for s in (1, 2, 3)}
    assert len(others | {a}) > 1, "different seeds never change a temperature-1 sample"
    ch = [client.chat.completions.create(model=model_id, messages=CHAT, max_tokens=8,
                                         temperature=1.0, seed=99).choices[0].message.content
          for _ in range(2)]
    assert ch[0] == ch[1]


def _lp_missing(values):
    return all(v == 0 for v in values)


def test_completion_logprobs(server, client, model_id):
    r = post(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 5, "temperature": 0,
                                          "logprobs": 3})
    assert r.status_code == 200, r.text
    body = r.json()
    validate(body, "CreateCompletionResponse")
    lp = body["choices"][0]["logprobs"]
    text = body["choices"][0]["text"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == \
        len(lp["text_offset"]) == body["usage"]["completion_tokens"] == 5
    assert "".join(lp["tokens"]) == text
    assert lp["text_offset"][0] == 0
    assert all(lp["text_offset"][i + 1] == lp["text_offset"][i] + len(lp["tokens"][i].encode())
               for i in range(4))
    if _lp_missing(lp["token_logprobs"]) or any(len(t) == 0 for t in lp["top_logprobs"]):
        pytest.xfail("the engine does not fill per-token logprobs yet (waiting for the full "
                     "sampler): token_logprobs are all 0 or top_logprobs empty")
    for tok, v, tops in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
        assert v <= 0 and 1 <= len(tops) <= 3
        assert all(x <= 0 for x in tops.values())
        # greedy: the chosen token is the most likely one
        assert v == pytest.approx(max(tops.values()), abs=1e-4)
        assert tok in tops


def test_chat_logprobs(server, client, model_id):
    c = client.chat.completions.create(model=model_id, messages=CHAT, max_tokens=5,
                                       temperature=0, logprobs=True, top_logprobs=2)
    validate(c.model_dump(exclude_unset=True), "CreateChatCompletionResponse")
    content = c.choices[0].logprobs.content
    assert len(content) == c.usage.completion_tokens
    assert "".join(t.token for t in content) == c.choices[0].message.content
    for t in content:
        assert bytes(t.bytes).decode(errors="replace") == t.token or t.token.startswith("bytes:")
    if _lp_missing([t.logprob for t in content]) or any(not t.top_logprobs for t in content):
        pytest.xfail("the engine does not fill per-token logprobs yet (waiting for the full "
                     "sampler)")
    for t in content:
        assert t.logprob <= 0 and len(t.top_logprobs) == 2
        assert t.logprob == pytest.approx(t.top_logprobs[0].logprob, abs=1e-4)
        assert t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob


# ---- chat ----

def test_chat_nonstream(server, client, model_id):
    r = post(server, "/v1/chat/completions", {"model": model_id, "messages": CHAT,
                                               "max_tokens": 8, "temperature": 0})
    assert r.status_code == 200, r.text
    validate(r.json(), "CreateChatCompletionResponse")
    c = client.chat.completions.create(model=model_id, messages=CHAT, max_tokens=8, temperature=0)
    assert c.object == "chat.completion"
    assert c.choices[0].message.role == "assistant"
    assert c.choices[0].message.content == r.json()["choices"][0]["message"]["content"]
    assert c.choices[0].message.content
    assert c.usage.completion_tokens <= 8 and c.usage.prompt_tokens > n_tokens(
        server, CHAT[0]["content"])
    # text parts and a system message are accepted
    c2 = client.chat.completions.create(
        model=model_id, max_tokens=4, temperature=0,
        messages=[{"role": "system", "content": "You are terse."},
                  {"role": "user", "content": [{"type": "text", "text": "Hi"}]}])
    assert c2.choices[0].finish_reason in ("stop", "length")


def test_chat_stream(server, client, model_id):
    full = client.chat.completions.create(model=model_id, messages=CHAT, max_tokens=8,
                                          temperature=0)
    with requests.post(server.url("/v1/chat/completions"), stream=True, timeout=120,
                       json={"messages": CHAT, "max_tokens": 8, "temperature": 0, "stream": True,
                             "logprobs": True, "stream_options": {"include_usage": True}}) as r:
        assert r.status_code == 200
        events = list(sse_events(r.iter_lines()))
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    for ch in chunks:
        validate(ch, "CreateChatCompletionStreamResponse")
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all("role" not in c["choices"][0]["delta"] for c in chunks[1:-1])
    assert chunks[-2]["choices"][0]["finish_reason"] == full.choices[0].finish_reason
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-2])
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks[:-1])
    assert text == full.choices[0].message.content
    usage = chunks[-1]["usage"]
    assert chunks[-1]["choices"] == []
    assert (usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]) == \
        (full.usage.prompt_tokens, full.usage.completion_tokens, full.usage.total_tokens)
    # one logprobs entry per generated token (an EOS that ends the answer counts, as in vLLM,
    # and has no text)
    assert usage["completion_tokens"] == sum(
        len(c["choices"][0]["logprobs"]["content"]) for c in chunks[:-1]
        if c["choices"][0]["logprobs"])
    assert usage["completion_tokens"] >= sum(
        1 for c in chunks[:-1] if c["choices"][0]["delta"].get("content"))
    # SDK streaming with n=2 and a stop string
    stream = client.chat.completions.create(model=model_id, messages=CHAT, max_tokens=8,
                                            temperature=0, n=2, stream=True)
    texts = {0: "", 1: ""}
    for ch in stream:
        for c in ch.choices:
            texts[c.index] += c.delta.content or ""
    assert texts[0] == texts[1] == full.choices[0].message.content


def test_chat_stop_and_n(server, client, model_id):
    base = client.chat.completions.create(model=model_id, messages=CHAT, max_tokens=12,
                                          temperature=0).choices[0].message.content
    words = base.split()
    if len(words) < 2:
        pytest.skip(f"greedy chat answer too short to cut: {base!r}")
    stop = words[1]
    c = client.chat.completions.create(model=model_id, messages=CHAT, max_tokens=12,
                                       temperature=0, stop=[stop], n=2)
    assert len(c.choices) == 2
    for ch in c.choices:
        assert ch.message.content == base[:base.index(stop)]
        assert ch.finish_reason == "stop"


# ---- the README's curl examples, as written ----

def readme_curl_commands():
    text = (server_util.util.ROOT / "README.md").read_text()
    sec = text.split("## Serving", 1)[1].split("\n## ", 1)[0]
    cmds = []
    for block in re.findall(r"```sh\n(.*?)```", sec, re.S):
        for cmd in re.sub(r"\\\n\s*", "", block).splitlines():
            if cmd.strip().startswith("curl "):
                cmds.append(cmd.strip())
    return cmds


def test_readme_curl_examples(server):
    cmds = readme_curl_commands()
    paths = {re.search(r"localhost:8000(/\S*)", c).group(1) for c in cmds}
    assert {"/health", "/v1/models", "/v1/completions", "/v1/chat/completions", "/tokenize",
            "/metrics", "/v1/embeddings"} <= paths, paths
    assert any('"stream": true' in c for c in cmds)
    assert any("json_object" in c for c in cmds)
    for cmd in cmds:
        cmd = cmd.replace("localhost:8000", f"localhost:{server.port}")
        p = subprocess.run(["bash", "-c", cmd + " -w '\\n%{http_code}'"], capture_output=True,
                           text=True, timeout=120)
        assert p.returncode == 0, f"{cmd}: {p.stderr}"
        body, code = p.stdout.rsplit("\n", 1)
        assert code == "200", f"{cmd}: {code} {body}"
        if "/metrics" in cmd:
            assert "pagoda:num_requests_running" in body
        elif '"stream": true' in cmd:
            events = list(sse_events(body.splitlines()))
            assert events[-1] == "[DONE]"
            for e in events[:-1]:
                validate(e, "CreateChatCompletionStreamResponse")
            assert events[-2]["usage"]["completion_tokens"] >= 1
        else:
            j = json.loads(body)
            if "/v1/chat/completions" in cmd:
                validate(j, "CreateChatCompletionResponse")
                if "json_object" in cmd:
                    assert isinstance(json.loads(j["choices"][0]["message"]["content"]), dict)
            elif "/v1/completions" in cmd:
                validate(j, "CreateCompletionResponse")
                assert j["choices"][0]["text"].startswith(" Paris")
            elif "/v1/models" in cmd:
                validate(j, "ListModelsResponse")
            elif "/detokenize" in cmd:
                assert j["prompt"] == "Hello world"
            elif "/tokenize" in cmd:
                assert j["tokens"] == [19556, 905]
            elif "/v1/embeddings" in cmd:
                validate(j, "CreateEmbeddingResponse")
                assert len(j["data"]) == 2
            else:
                assert j == {"status": "ok"}


def test_metrics_after_requests(server):
    """After the requests above: counters moved, histograms observed, nothing left running."""
    m = server.wait_metrics(lambda m: m["pagoda:num_requests_running"] == 0, timeout=30)
    assert m["pagoda:num_requests_running"] == 0 and m["pagoda:num_requests_waiting"] == 0
    assert m["pagoda:kv_cache_blocks_used"] == 0
    assert m["pagoda:prompt_tokens_total"] > 0 and m["pagoda:generation_tokens_total"] > 0
    assert m["pagoda:request_success_total{finished_reason=length}"] > 0
    assert m["pagoda:request_success_total{finished_reason=stop}"] > 0
    assert m["pagoda:prefix_cache_queries_total"] > 0
    for h in ("time_to_first_token_seconds", "inter_token_latency_seconds",
              "e2e_request_latency_seconds", "request_queue_time_seconds"):
        assert m[f"pagoda:{h}_count"] > 0, f"{h} never observed"
        assert m[f"pagoda:{h}_bucket{{le=+Inf}}"] == m[f"pagoda:{h}_count"]


def test_chat_prompt_tokens_equal_rendered_template(server, client, model_id, tmp_path):
    """usage.prompt_tokens of a chat = the tokens of what `pagoda render-template` prints."""
    msgs = [{"role": "system", "content": "You are terse."}] + CHAT
    f = tmp_path / "messages.json"
    f.write_text(json.dumps(msgs))
    p = subprocess.run([str(server.binary), "render-template", "-m", str(server.model),
                        "--messages", str(f), "--add-generation-prompt"], capture_output=True,
                       timeout=60)
    if p.returncode != 0 and b"unknown command" in p.stderr:
        pytest.skip("this build has no render-template command")
    assert p.returncode == 0, p.stderr
    rendered = p.stdout.decode()
    r = post(server, "/tokenize", {"prompt": rendered, "add_special_tokens": False})
    c = client.chat.completions.create(model=model_id, messages=msgs, max_tokens=2,
                                       temperature=0)
    assert c.usage.prompt_tokens == r.json()["count"]
