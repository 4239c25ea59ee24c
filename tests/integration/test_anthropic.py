"""The Anthropic Messages API (POST /v1/messages, /v1/messages/count_tokens) over raw HTTP
against a real `pagoda serve`: the message and its event stream in Anthropic's shapes, the
stream adding up to the whole answer, stop reasons, forced tool use (hermes and mistral
templates) and the tool_result round trip, count_tokens against usage, errors in Anthropic's
shape, and x-api-key. (The anthropic SDK's own tests are in tests/clients.)"""
import json

import jsonschema
import pytest
import requests

import util
from server_util import Server

HEADERS = {"anthropic-version": "2023-06-01", "content-type": "application/json"}

# Anthropic's Message as its API reference writes it (the fields Pagoda can produce).
USAGE = {"type": "object", "required": ["input_tokens", "output_tokens"], "properties": {
    "input_tokens": {"type": "integer", "minimum": 0},
    "output_tokens": {"type": "integer", "minimum": 0},
    "cache_read_input_tokens": {"type": ["integer", "null"], "minimum": 0},
    "cache_creation_input_tokens": {"type": ["integer", "null"], "minimum": 0}}}
BLOCK = {"oneOf": [
    {"type": "object", "required": ["type", "text"], "properties": {
        "type": {"const": "text"}, "text": {"type": "string"}}},
    {"type": "object", "required": ["type", "thinking", "signature"], "properties": {
        "type": {"const": "thinking"}, "thinking": {"type": "string"},
        "signature": {"type": "string"}}},
    {"type": "object", "required": ["type", "id", "name", "input"], "properties": {
        "type": {"const": "tool_use"}, "id": {"type": "string", "pattern": "^toolu_"},
        "name": {"type": "string"}, "input": {"type": "object"}}}]}
MESSAGE = {"type": "object", "required": ["id", "type", "role", "content", "model", "stop_reason",
                                          "stop_sequence", "usage"], "properties": {
    "id": {"type": "string", "pattern": "^msg_"}, "type": {"const": "message"},
    "role": {"const": "assistant"}, "model": {"type": "string"},
    "content": {"type": "array", "items": BLOCK},
    "stop_reason": {"enum": ["end_turn", "max_tokens", "stop_sequence", "tool_use"]},
    "stop_sequence": {"type": ["string", "null"]}, "usage": USAGE}}
ERROR = {"type": "object", "required": ["type", "error"], "properties": {
    "type": {"const": "error"},
    "error": {"type": "object", "required": ["type", "message"], "properties": {
        "type": {"enum": ["invalid_request_error", "authentication_error", "permission_error",
                          "not_found_error", "request_too_large", "rate_limit_error",
                          "api_error", "overloaded_error"]},
        "message": {"type": "string"}}}}}
ERROR_TYPE = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error"}

WEATHER = {"name": "weather", "description": "The weather in a city.", "input_schema": {
    "type": "object", "properties": {"city": {"enum": ["Oslo", "Paris"]},
                                     "days": {"type": "integer"}},
    "required": ["city", "days"], "additionalProperties": False}}
TIME = {"name": "time", "input_schema": {
    "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"],
    "additionalProperties": False}}


def model_id(server, headers=None):
    r = requests.get(server.url("/v1/models"), headers=headers, timeout=30)
    return r.json()["data"][0]["id"]


def messages(server, body, path="/v1/messages", headers=HEADERS):
    return requests.post(server.url(path), data=json.dumps(body), headers=headers, timeout=300)


def body_for(server, text="What is the capital of France?", headers=None, **kw):
    return {"model": model_id(server, headers), "max_tokens": 24, "temperature": 0,
            "messages": [{"role": "user", "content": text}], **kw}


def ok_message(r):
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/json")
    m = r.json()
    jsonschema.validate(m, MESSAGE)
    return m


def text_of(m):
    return "".join(b["text"] for b in m["content"] if b["type"] == "text")


def sse(r):
    """The stream's events as (name, data): each frame exactly "event: NAME\\ndata: JSON" and a
    blank line, data.type equal to NAME."""
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/event-stream")
    raw = r.content.decode()
    assert raw.endswith("\n\n"), raw[-200:]
    out = []
    for frame in raw[:-2].split("\n\n"):
        lines = frame.split("\n")
        assert len(lines) == 2 and lines[0].startswith("event: ") and \
            lines[1].startswith("data: "), frame
        name, data = lines[0][len("event: "):], json.loads(lines[1][len("data: "):])
        assert data["type"] == name, frame
        out.append((name, data))
    return out


def replay(events):
    """Checks Anthropic's event grammar -- message_start, ping, then for each block index 0, 1,
    ... its content_block_start, deltas of its kind and content_block_stop, then one
    message_delta and message_stop -- and returns the message the events build."""
    names = [n for n, _ in events]
    assert names[:2] == ["message_start", "ping"], names
    assert names[-2:] == ["message_delta", "message_stop"], names
    msg = events[0][1]["message"]
    assert msg["content"] == [] and msg["stop_reason"] is None and msg["stop_sequence"] is None
    jsonschema.validate(msg["usage"], USAGE)
    content, bufs, open_index = [], {}, None
    for name, d in events[2:-2]:
        if name == "content_block_start":
            assert open_index is None and d["index"] == len(content), (names, d)
            open_index = d["index"]
            block = d["content_block"]
            if block["type"] == "tool_use":
                assert block["input"] == {}
                bufs[open_index] = ""
            content.append(block)
        elif name == "content_block_delta":
            assert d["index"] == open_index, d
            block, delta = content[open_index], d["delta"]
            kind = {"text_delta": "text", "thinking_delta": "thinking",
                    "signature_delta": "thinking", "input_json_delta": "tool_use"}[delta["type"]]
            assert block["type"] == kind, (block, delta)
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            elif delta["type"] == "signature_delta":
                block["signature"] = delta["signature"]
            else:
                bufs[open_index] += delta["partial_json"]
        else:
            assert name == "content_block_stop" and d["index"] == open_index, (name, d)
            if open_index in bufs:
                content[open_index]["input"] = json.loads(bufs[open_index])
            open_index = None
    assert open_index is None
    delta = events[-2][1]
    jsonschema.validate(delta["usage"], {"type": "object", "required": ["output_tokens"]})
    msg.update(content=content, stop_reason=delta["delta"]["stop_reason"],
               stop_sequence=delta["delta"]["stop_sequence"])
    start_input = msg["usage"]["input_tokens"]  # the whole prompt: the cache's share comes later
    msg["usage"].update(delta["usage"])
    assert start_input == total_input(msg) > 0, (start_input, msg["usage"])
    jsonschema.validate(msg, MESSAGE)
    return msg


def total_input(m):
    """Anthropic's total input tokens: its input_tokens leave out what the cache served."""
    u = m["usage"]
    return u["input_tokens"] + (u.get("cache_read_input_tokens") or 0) + \
        (u.get("cache_creation_input_tokens") or 0)


@pytest.fixture(scope="module")
def qwen_rnd(tmp_path_factory):
    """The random model with Qwen2.5's template: hermes tool calls."""
    s = Server(util.model_with_template(tmp_path_factory, "Qwen-Qwen2.5-7B-Instruct.jinja"))
    s.start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def mistral_rnd(tmp_path_factory):
    """The random model with Mistral Nemo's template, which refuses tool-call ids that are not 9
    letters and digits."""
    s = Server(util.model_with_template(tmp_path_factory,
                                        "mistralai-Mistral-Nemo-Instruct-2407.jinja"))
    s.start()
    yield s
    s.stop()


# ---- text ----

def test_text_answer_is_the_chat_answer(smol):
    """A greedy answer: Anthropic's message, its text the chat completion's content, its usage
    the chat's (input split into uncached and cache-read tokens)."""
    body = body_for(smol, system=[{"type": "text", "text": "You are terse."}])
    m = ok_message(messages(smol, body))
    assert m["model"] == body["model"]
    assert [b["type"] for b in m["content"]] == ["text"] and m["content"][0]["text"], m
    assert m["stop_reason"] in ("end_turn", "max_tokens") and m["stop_sequence"] is None
    assert m["usage"]["cache_creation_input_tokens"] == 0
    chat = requests.post(smol.url("/v1/chat/completions"), timeout=300, json={
        "model": body["model"], "max_tokens": 24, "temperature": 0,
        "messages": [{"role": "system", "content": "You are terse."}] + body["messages"]}).json()
    c = chat["choices"][0]
    assert text_of(m) == c["message"]["content"]
    assert m["stop_reason"] == {"stop": "end_turn", "length": "max_tokens"}[c["finish_reason"]]
    assert m["usage"]["output_tokens"] == chat["usage"]["completion_tokens"]
    assert total_input(m) == chat["usage"]["prompt_tokens"]
    # the same conversation in blocks: the same answer
    blocks = dict(body, system="You are terse.", messages=[{"role": "user", "content": [
        {"type": "text", "text": "What is the capital "}, {"type": "text", "text": "of France?"}]}])
    assert text_of(ok_message(messages(smol, blocks))) == text_of(m)


def test_stream_adds_up_to_the_answer(smol):
    body = body_for(smol, max_tokens=32)
    whole = ok_message(messages(smol, body))
    events = sse(messages(smol, dict(body, stream=True)))
    got = replay(events)
    assert [b["type"] for b in got["content"]] == ["text"]
    assert sum(1 for n, _ in events if n == "content_block_delta") > 1  # it streamed
    assert got["content"] == whole["content"]
    assert got["stop_reason"] == whole["stop_reason"] and got["id"].startswith("msg_")
    assert got["usage"]["output_tokens"] == whole["usage"]["output_tokens"]
    assert total_input(got) == total_input(whole)


def test_stop_reasons(smol):
    body = body_for(smol, max_tokens=40)
    text = text_of(ok_message(messages(smol, body)))
    words = text.split()
    assert len(words) >= 4, text
    stop = " " + words[2]  # a stop sequence the greedy answer meets
    for stream in (False, True):
        r = messages(smol, dict(body, stop_sequences=[stop], stream=stream))
        m = replay(sse(r)) if stream else ok_message(r)
        assert m["stop_reason"] == "stop_sequence" and m["stop_sequence"] == stop, m
        assert text_of(m) == text[:text.index(stop)]
        r = messages(smol, dict(body, max_tokens=3, stream=stream))
        m = replay(sse(r)) if stream else ok_message(r)
        assert m["stop_reason"] == "max_tokens" and m["usage"]["output_tokens"] == 3, m
        assert m["stop_sequence"] is None


def test_prefill_continues_the_final_assistant_turn(smol):
    """A final assistant turn is continued, as Anthropic does: the answer holds only the new
    text, as the chat path's continue_final_message gives it."""
    body = body_for(smol, max_tokens=12)
    body["messages"].append({"role": "assistant", "content": "The capital of France is"})
    m = ok_message(messages(smol, body))
    chat = requests.post(smol.url("/v1/chat/completions"), timeout=300, json={
        "model": body["model"], "max_tokens": 12, "temperature": 0, "messages": body["messages"],
        "continue_final_message": True, "add_generation_prompt": False}).json()
    assert text_of(m) == chat["choices"][0]["message"]["content"]
    assert not text_of(m).startswith("The capital")


# ---- tools ----

def check_tool_use(block, tools):
    assert block["type"] == "tool_use" and block["id"].startswith("toolu_"), block
    schema = {t["name"]: t["input_schema"] for t in tools}[block["name"]]
    jsonschema.validate(block["input"], schema)


def test_forced_tool_use(qwen_rnd):
    """tool_choice {"type": "tool"}: the answer ends in that tool_use, its input valid for the
    input_schema, stop_reason tool_use; streamed, the same call as start, one input_json_delta
    and stop. {"type": "any"} among two tools: a call of either."""
    body = {"model": model_id(qwen_rnd), "max_tokens": 400, "temperature": 0,
            "messages": [{"role": "user", "content": "Weather in Oslo?"}], "tools": [WEATHER],
            "tool_choice": {"type": "tool", "name": "weather"}}
    m = ok_message(messages(qwen_rnd, body))
    assert m["stop_reason"] == "tool_use" and m["stop_sequence"] is None, m
    calls = [b for b in m["content"] if b["type"] == "tool_use"]
    assert len(calls) == 1 and m["content"][-1] == calls[0], m
    check_tool_use(calls[0], [WEATHER])
    got = replay(sse(messages(qwen_rnd, dict(body, stream=True))))
    assert got["stop_reason"] == "tool_use"
    assert [(b["name"], b["input"]) for b in got["content"] if b["type"] == "tool_use"] == \
        [(calls[0]["name"], calls[0]["input"])]
    names = set()
    for t in (0.0, 1.0, 1.0, 1.0, 1.0, 1.0):
        m = ok_message(messages(qwen_rnd, dict(body, tools=[WEATHER, TIME], temperature=t,
                                               tool_choice={"type": "any"})))
        assert m["stop_reason"] == "tool_use", m
        check_tool_use(m["content"][-1], [WEATHER, TIME])
        names.add(m["content"][-1]["name"])
    assert names <= {"weather", "time"} and names


def test_tool_choice_none_and_auto(qwen_rnd):
    body = {"model": model_id(qwen_rnd), "max_tokens": 8, "temperature": 0,
            "messages": [{"role": "user", "content": "Hi"}], "tools": [WEATHER]}
    for choice in ({"type": "none"}, {"type": "auto"}):
        m = ok_message(messages(qwen_rnd, dict(body, tool_choice=choice)))
        assert all(b["type"] == "text" for b in m["content"]), m
        assert m["stop_reason"] in ("end_turn", "max_tokens")


def round_trip(server, tools, first, result_id=None, is_error=False, follow_up=True):
    """The conversation after the first answer: its content handed back as the assistant turn,
    then a user turn with the tool_result for its call (and a question after it: not for
    Mistral's template, which wants an assistant turn between two user turns, a tool's result
    aside)."""
    call = first["content"][-1]
    body = {"model": model_id(server), "max_tokens": 4, "temperature": 0, "tools": tools,
            "messages": [{"role": "user", "content": "Weather in Oslo?"},
                         {"role": "assistant", "content": first["content"]},
                         {"role": "user", "content": [
                             {"type": "tool_result", "tool_use_id": result_id or call["id"],
                              "content": [{"type": "text", "text": "sunny, 18 C"}],
                              "is_error": is_error},
                             {"type": "text", "text": "And tomorrow?"}]}]}
    if not follow_up:
        body["messages"][-1]["content"].pop()
    return body


def test_tool_result_round_trip(qwen_rnd, mistral_rnd):
    """The answer's tool_use handed back with its tool_result renders: with Mistral's template,
    which refuses a call id that is not 9 letters and digits, only if "toolu_" + id maps back to
    the chat id; the prompt holds the call and the result (count_tokens grows), and the tool
    result in is_error form renders too. A result for an id the template refuses is a 400 in
    Anthropic's shape."""
    for server in (qwen_rnd, mistral_rnd):
        first = ok_message(messages(server, {
            "model": model_id(server), "max_tokens": 400, "temperature": 0,
            "messages": [{"role": "user", "content": "Weather in Oslo?"}], "tools": [WEATHER],
            "tool_choice": {"type": "any"}}))
        assert first["stop_reason"] == "tool_use", first
        check_tool_use(first["content"][-1], [WEATHER])
        follow_up = server is qwen_rnd
        body = round_trip(server, [WEATHER], first, follow_up=follow_up)
        m = ok_message(messages(server, body))
        assert m["stop_reason"] in ("end_turn", "max_tokens", "tool_use")
        n_all = messages(server, body, "/v1/messages/count_tokens").json()["input_tokens"]
        n_first = messages(server, dict(body, messages=body["messages"][:1]),
                           "/v1/messages/count_tokens").json()["input_tokens"]
        assert n_all > n_first + 10, (n_all, n_first)
        assert total_input(m) == n_all
        ok_message(messages(server, round_trip(server, [WEATHER], first, is_error=True,
                                               follow_up=follow_up)))
    r = messages(mistral_rnd, round_trip(mistral_rnd, [WEATHER], first, result_id="toolu_1",
                                         follow_up=False))
    check_error(r, 400, "length 9")


# ---- thinking ----

def test_thinking_blocks(tmp_path_factory):
    """With --reasoning-parser, the reasoning comes back as a thinking block (signature "") before
    the text, streamed as thinking_delta then signature_delta; its text the chat answer's
    reasoning_content. A thinking block handed back in the assistant turn is accepted. (DeepSeek-R1
    Distill's template opens the thinking: the random model's answer is all reasoning, or
    reasoning then text.)"""
    model = util.model_with_template(tmp_path_factory,
                                     "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja")
    with Server(model, "--reasoning-parser", "deepseek_r1") as s:
        body = {"model": model_id(s), "max_tokens": 24, "temperature": 0,
                "thinking": {"type": "enabled", "budget_tokens": 1024},
                "messages": [{"role": "user", "content": "Why is the sky blue?"}]}
        m = ok_message(messages(s, body))
        assert m["content"][0]["type"] == "thinking" and m["content"][0]["thinking"], m
        assert m["content"][0]["signature"] == ""
        assert [b["type"] for b in m["content"][1:]] in ([], ["text"]), m
        chat = requests.post(s.url("/v1/chat/completions"), timeout=300, json={
            "model": body["model"], "max_tokens": 24, "temperature": 0,
            "messages": body["messages"]}).json()["choices"][0]["message"]
        assert m["content"][0]["thinking"] == chat["reasoning_content"]
        assert text_of(m) == (chat["content"] or "")
        events = sse(messages(s, dict(body, stream=True)))
        kinds = [d["delta"]["type"] for n, d in events if n == "content_block_delta"
                 and d["index"] == 0]
        assert kinds[-1] == "signature_delta" and set(kinds[:-1]) == {"thinking_delta"}, kinds
        assert replay(events)["content"] == m["content"]
        turn = dict(body, messages=body["messages"] + [
            {"role": "assistant", "content": m["content"] + [{"type": "text", "text": "Air."}]},
            {"role": "user", "content": "Why?"}])
        ok_message(messages(s, turn))


def test_thinking_sets_enable_thinking(tmp_path_factory):
    """thinking enabled / disabled reaches the template as enable_thinking (SmolLM3's closes the
    thinking in the prompt when it is false): count_tokens as /tokenize with that variable."""
    model = util.model_with_template(tmp_path_factory, "HuggingFaceTB-SmolLM3-3B.jinja")
    with Server(model) as s:
        msgs = [{"role": "user", "content": "Why is the sky blue?"}]
        body = {"model": model_id(s), "messages": msgs}
        n = {}
        for on in (True, False):
            think = {"type": "enabled", "budget_tokens": 2048} if on else {"type": "disabled"}
            r = messages(s, dict(body, thinking=think), "/v1/messages/count_tokens")
            assert r.status_code == 200, r.text
            n[on] = r.json()["input_tokens"]
            t = requests.post(s.url("/tokenize"), timeout=60, json={
                "messages": msgs, "chat_template_kwargs": {"enable_thinking": on}}).json()
            assert n[on] == len(t["tokens"]), (on, n, t)
        assert n[True] != n[False], n


# ---- count_tokens ----

def test_count_tokens_is_the_prompt(smol, qwen_rnd):
    """count_tokens (no max_tokens, as Anthropic's takes) equals the input tokens of the same
    request (cache reads included), with system, tools and blocks."""
    cases = [(smol, body_for(smol, system="Be brief.", max_tokens=2)),
             (smol, body_for(smol, max_tokens=2, messages=[
                 {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
                 {"role": "user", "content": [{"type": "text", "text": "Bye"}]}])),
             (qwen_rnd, {"model": model_id(qwen_rnd), "max_tokens": 2, "tools": [WEATHER, TIME],
                         "messages": [{"role": "user", "content": "Weather?"}]})]
    for server, body in cases:
        ct = {k: v for k, v in body.items() if k not in ("max_tokens", "temperature")}
        r = messages(server, ct, "/v1/messages/count_tokens")
        assert r.status_code == 200, r.text
        assert list(r.json()) == ["input_tokens"] and r.json()["input_tokens"] > 0
        m = ok_message(messages(server, body))
        assert total_input(m) == r.json()["input_tokens"], (m["usage"], r.json())
    # tools make the prompt longer (the template lists them)
    bare = {"model": model_id(qwen_rnd), "messages": [{"role": "user", "content": "Weather?"}]}
    n = [messages(qwen_rnd, b, "/v1/messages/count_tokens").json()["input_tokens"]
         for b in (bare, dict(bare, tools=[WEATHER]))]
    assert n[1] > n[0] + 10, n


# ---- errors ----

def check_error(r, status, needle):
    assert r.status_code == status, r.text
    e = r.json()
    jsonschema.validate(e, ERROR)
    assert e["error"]["type"] == ERROR_TYPE[status], e
    assert needle in e["error"]["message"], e
    return e


@pytest.mark.parametrize("change,needle", [
    ({"max_tokens": None}, "max_tokens"),
    ({"max_tokens": "8"}, "max_tokens"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {
        "type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}]}, "'image'"),
    ({"messages": [{"role": "user", "content": [{"type": "document", "source": {
        "type": "text", "media_type": "text/plain", "data": "x"}}]}]}, "'document'"),
    ({"messages": [{"role": "system", "content": "x"}]}, "role"),
    ({"temperature": 1.5}, "temperature"),
    ({"tool_choice": {"type": "any"}}, "no 'tools'"),
    ({"stop_sequences": "END"}, "stop_sequences"),
    ({"thinking": {"type": "enabled", "budget_tokens": 10}}, "budget_tokens"),
])
def test_bad_requests(smol, change, needle):
    body = body_for(smol)
    for k, v in change.items():
        if v is None:
            del body[k]
        else:
            body[k] = v
    check_error(messages(smol, body), 400, needle)
    check_error(messages(smol, dict(body, stream=True)), 400, needle)  # JSON, before any event
    if "max_tokens" not in change:  # count_tokens reads the same body
        check_error(messages(smol, body, "/v1/messages/count_tokens"), 400, needle)


def test_other_errors(smol):
    r = requests.post(smol.url("/v1/messages"), data=b"{not json", headers=HEADERS, timeout=60)
    check_error(r, 400, "JSON")
    check_error(messages(smol, dict(body_for(smol), model="claude-sonnet-4-5")), 404,
                "claude-sonnet-4-5")
    # found after parsing (the prompt is rendered): still Anthropic's shape, streamed or not
    long = "Tell me everything about France. " * 2500  # past the 8192-token context
    for stream in (False, True):
        check_error(messages(smol, body_for(smol, long, stream=stream)), 400, "context length")
    # unknown optional fields are tolerated, as Anthropic's API does
    ok_message(messages(smol, dict(body_for(smol, max_tokens=2), metadata={"user_id": "u"},
                                   service_tier="auto", top_k=5, top_p=0.9,
                                   thinking={"type": "disabled"})))


def test_api_key(default_model):
    """With --api-key, Anthropic's x-api-key header (or OpenAI's bearer) is needed: without it
    or with another key, a 401 authentication_error in Anthropic's shape."""
    with Server(default_model, "--api-key", "sk-test-1") as s:
        body = body_for(s, max_tokens=2, headers={"x-api-key": "sk-test-1"})
        check_error(messages(s, body), 401, "API key")
        check_error(messages(s, body, headers=dict(HEADERS, **{"x-api-key": "sk-wrong"})), 401,
                    "API key")
        check_error(messages(s, body, "/v1/messages/count_tokens"), 401, "API key")
        ok_message(messages(s, body, headers=dict(HEADERS, **{"x-api-key": "sk-test-1"})))
        ok_message(messages(s, body, headers=dict(HEADERS, authorization="Bearer sk-test-1")))
