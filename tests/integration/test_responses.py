"""The Responses API (/v1/responses) over raw HTTP against a real `pagoda serve`: the greedy
answer equal to the chat path's, the event stream (event names, sequence numbers, order,
deltas adding up, item ids equal to the final and the stored response), text.format
json_schema, a forced function call (hermes) and its function_call_output round trip, a
previous_response_id chain whose later turns hit the prefix cache, GET and DELETE, background
runs and cancel, the 400s and 404s; every non-streamed body validated against the OpenAPI
file's Response schema. max_output_tokens stays small: the model decodes ~40 tokens/s on 2
cores."""
import json
import time

import pytest
import requests

import util
from server_util import Server, validate
from test_json_output import TOOL_W

CHAT_Q = "What is the capital of France?"


@pytest.fixture(scope="module")
def server(default_server):
    return default_server


@pytest.fixture(scope="module")
def qwen_rnd(tmp_path_factory):
    """The random Llama with Qwen2.5's template: hermes tool calls."""
    model = util.model_with_template(tmp_path_factory, "Qwen-Qwen2.5-7B-Instruct.jinja")
    s = Server(model)
    s.start()
    yield s
    s.stop()


def post(server, body, path="/v1/responses", **kw):
    return requests.post(server.url(path), json=body, timeout=300, **kw)


def ok(r):
    assert r.status_code == 200, r.text
    body = r.json()
    validate(body, "Response")
    return body


def output_text(resp):
    """What the SDK's output_text computes: the output_text parts of the message items."""
    return "".join(c["text"] for it in resp["output"] if it["type"] == "message"
                   for c in it["content"] if c["type"] == "output_text")


def sse(r):
    """[(event name, data object)] of a Responses stream; asserts the framing
    ("event: NAME\\ndata: JSON\\n\\n") and that the name is the data's type."""
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/event-stream")
    events, name = [], None
    for line in r.iter_lines():  # (SSE is UTF-8 whatever the content type says)
        line = line.decode("utf-8")
        if not line:
            name = None
            continue
        if line.startswith("event: "):
            assert name is None, line
            name = line[len("event: "):]
            continue
        assert line.startswith("data: ") and name, line
        data = json.loads(line[len("data: "):])
        assert data["type"] == name, (name, data)
        events.append((name, data))
    return events


def chat_text(server, messages, max_tokens):
    r = post(server, {"messages": messages, "max_tokens": max_tokens, "temperature": 0},
             "/v1/chat/completions")
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"], r.json()["choices"][0]["finish_reason"]


# ---- plain ----

def test_plain_equals_the_chat_answer(server):
    body = ok(post(server, {"input": CHAT_Q, "max_output_tokens": 12, "temperature": 0,
                            "metadata": {"k": "v"}, "user": "u1"}))
    assert body["id"].startswith("resp_") and body["object"] == "response"
    assert "output_text" not in body
    text, finish = chat_text(server, [{"role": "user", "content": CHAT_Q}], 12)
    assert output_text(body) == text and text
    assert body["status"] == ("incomplete" if finish == "length" else "completed")
    if finish == "length":
        assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    [msg] = body["output"]
    assert msg["type"] == "message" and msg["role"] == "assistant"
    assert msg["id"].startswith("msg_") and msg["content"][0]["annotations"] == []
    u = body["usage"]
    chat = post(server, {"messages": [{"role": "user", "content": CHAT_Q}], "max_tokens": 12,
                         "temperature": 0}, "/v1/chat/completions").json()["usage"]
    assert u["output_tokens"] == chat["completion_tokens"] and u["output_tokens"] <= 12
    assert u["input_tokens"] == chat["prompt_tokens"]
    assert u["total_tokens"] == u["input_tokens"] + u["output_tokens"]
    assert u["input_tokens"] > 5 and u["input_tokens_details"]["cached_tokens"] >= 0
    assert body["metadata"] == {"k": "v"} and body["user"] == "u1"
    assert body["max_output_tokens"] == 12 and body["temperature"] == 0
    assert body["store"] is True and body["background"] is False
    assert body["tools"] == [] and body["tool_choice"] == "auto"
    # "tools": [] (what the agents SDK sends without tools) is no tools, on a server that has
    # no tool-call parser for "auto"
    assert output_text(ok(post(server, {"input": CHAT_Q, "max_output_tokens": 12,
                                        "temperature": 0, "tools": []}))) == text


def test_instructions_and_items_are_the_chat_messages(server):
    """instructions is a system message first; input items (input_text parts, developer
    messages, an assistant's output_text) are the chat's messages in order."""
    items = [{"role": "user", "content": [{"type": "input_text", "text": "Hi, I am Ann."}]},
             {"type": "message", "role": "assistant",
              "content": [{"type": "output_text", "text": "Hello Ann!"}]},
             {"role": "developer", "content": "Answer in one word."},
             {"role": "user", "content": "What is my name?"}]
    body = ok(post(server, {"input": items, "instructions": "You are terse.",
                            "max_output_tokens": 8, "temperature": 0}))
    text, _ = chat_text(server, [{"role": "system", "content": "You are terse."},
                                 {"role": "user", "content": "Hi, I am Ann."},
                                 {"role": "assistant", "content": "Hello Ann!"},
                                 {"role": "system", "content": "Answer in one word."},
                                 {"role": "user", "content": "What is my name?"}], 8)
    assert output_text(body) == text
    assert body["instructions"] == "You are terse."


# ---- streaming ----

def check_stream(events):
    """The Responses stream grammar; returns the final response object."""
    names = [n for n, _ in events]
    for _, d in events:
        validate(d, "ResponseStreamEvent")
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
    assert names[:2] == ["response.created", "response.in_progress"]
    assert names[-1] in ("response.completed", "response.incomplete"), names
    assert events[0][1]["response"]["status"] == "in_progress"
    final = events[-1][1]["response"]
    validate(final, "Response")
    out = final["output"]
    deltas, added, done = {}, [], []
    for name, d in events[2:-1]:
        k = d["output_index"]
        item = out[k]
        if "item_id" in d:
            assert d["item_id"] == item["id"]
        if name == "response.output_item.added":
            assert d["item"]["id"] == item["id"] and d["item"]["status"] == "in_progress"
            added.append(k)
        elif name == "response.output_item.done":
            assert d["item"] == item
            done.append(k)
        elif name.endswith(".delta"):
            assert k in added and k not in done
            deltas[k] = deltas.get(k, "") + d["delta"]
            if name == "response.output_text.delta":
                assert d["logprobs"] == [] and d["content_index"] == 0
        elif name == "response.output_text.done":
            assert d["text"] == deltas.get(k, "") == item["content"][0]["text"]
        elif name == "response.reasoning_text.done":
            assert d["text"] == deltas.get(k, "") == item["content"][0]["text"]
        elif name == "response.function_call_arguments.done":
            assert d["arguments"] == deltas[k] == item["arguments"]
            assert d["name"] == item["name"]
        elif name in ("response.content_part.added", "response.content_part.done"):
            assert d["content_index"] == 0
        else:
            raise AssertionError(f"unexpected event {name}")
    assert added == done == list(range(len(out)))
    return final


def test_stream(server):
    req = {"input": CHAT_Q, "max_output_tokens": 10, "temperature": 0}
    events = sse(post(server, dict(req, stream=True), stream=True))
    final = check_stream(events)
    names = [n for n, _ in events]
    assert names[2:5] == ["response.output_item.added", "response.content_part.added",
                          "response.output_text.delta"]
    assert names[-4:-1] == ["response.output_text.done", "response.content_part.done",
                            "response.output_item.done"]
    assert names.count("response.output_text.delta") >= 2
    whole = ok(post(server, req))
    assert output_text(final) == output_text(whole) and output_text(final)
    assert final["status"] == whole["status"]
    assert final["usage"]["output_tokens"] == whole["usage"]["output_tokens"] >= 2
    # the stored response is the one the stream ended with
    stored = requests.get(server.url(f"/v1/responses/{final['id']}"), timeout=30)
    assert ok(stored) == final


# ---- structured output and tools ----

def test_json_schema_format(server):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
              "required": ["city"], "additionalProperties": False}
    fmt = {"type": "json_schema", "name": "answer", "schema": schema, "strict": True}
    body = ok(post(server, {"input": CHAT_Q + " Reply in JSON.", "max_output_tokens": 40,
                            "temperature": 0, "text": {"format": fmt}}))
    assert body["status"] == "completed", body
    import jsonschema
    jsonschema.validate(json.loads(output_text(body)), schema)
    assert body["text"]["format"]["type"] == "json_schema"
    assert body["text"]["format"]["name"] == "answer"
    assert body["text"]["format"]["schema"] == schema
    body = ok(post(server, {"input": CHAT_Q + " Reply in JSON.", "max_output_tokens": 40,
                            "temperature": 0, "text": {"format": {"type": "json_object"}}}))
    if body["status"] == "completed":
        json.loads(output_text(body))


RESP_TOOL = {"type": "function", "name": TOOL_W["function"]["name"],
             "description": "The weather in a city",
             "parameters": TOOL_W["function"]["parameters"], "strict": True}


def test_function_call_and_output_round_trip(qwen_rnd):
    import jsonschema
    req = {"input": "Weather in Oslo?", "tools": [RESP_TOOL], "max_output_tokens": 200,
           "tool_choice": {"type": "function", "name": "weather"}, "temperature": 0}
    body = ok(post(qwen_rnd, req))
    calls = [it for it in body["output"] if it["type"] == "function_call"]
    assert len(calls) == 1, body["output"]
    call = calls[0]
    assert call["name"] == "weather" and call["id"].startswith("fc_")
    assert call["status"] == "completed" and call["call_id"]
    jsonschema.validate(json.loads(call["arguments"]), RESP_TOOL["parameters"])
    assert body["tools"] == [RESP_TOOL]
    assert body["tool_choice"] == {"type": "function", "name": "weather"}
    # streamed: the same call, whole in one delta
    final = check_stream(sse(post(qwen_rnd, dict(req, stream=True), stream=True)))
    scalls = [it for it in final["output"] if it["type"] == "function_call"]
    assert [(c["name"], c["arguments"]) for c in scalls] == [("weather", call["arguments"])]
    # the call and its output handed back: the prompt holds both
    turn = [{"role": "user", "content": "Weather in Oslo?"},
            {"type": "function_call", "call_id": call["call_id"], "name": "weather",
             "arguments": call["arguments"]},
            {"type": "function_call_output", "call_id": call["call_id"],
             "output": "sunny, 21 C"}]
    base = {"tools": [RESP_TOOL], "max_output_tokens": 4, "temperature": 0}
    one = ok(post(qwen_rnd, dict(base, input=turn[:1])))
    two = ok(post(qwen_rnd, dict(base, input=turn)))
    assert two["usage"]["input_tokens"] > one["usage"]["input_tokens"] + 10
    # the same turn as chat messages gives the same prompt
    r = post(qwen_rnd, {"messages": [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call["call_id"], "type": "function",
             "function": {"name": "weather", "arguments": call["arguments"]}}]},
        {"role": "tool", "tool_call_id": call["call_id"], "content": "sunny, 21 C"}],
        "tools": [{"type": "function", "function": {k: v for k, v in RESP_TOOL.items()
                                                     if k != "type"}}],
        "max_tokens": 4, "temperature": 0}, "/v1/chat/completions")
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == two["usage"]["input_tokens"]


# ---- the store ----

def test_previous_response_chain_hits_the_prefix_cache(server):
    hits = server.metrics()["pagoda:prefix_cache_hits_total"]
    turns = ["My name is Ann and I live in Paris.", "Where do I live?", "What is my name?"]
    prev, bodies = None, []
    for i, text in enumerate(turns):
        req = {"input": text, "max_output_tokens": 8, "temperature": 0,
               "instructions": "You are helpful." if i == 0 else None}
        if prev:
            req["previous_response_id"] = prev
        body = ok(post(server, req))
        assert body["previous_response_id"] == prev
        bodies.append(body)
        prev = body["id"]
    u = [b["usage"] for b in bodies]
    assert u[1]["input_tokens"] > u[0]["input_tokens"] and u[2]["input_tokens"] > u[1]["input_tokens"]
    assert u[1]["input_tokens_details"]["cached_tokens"] > 0
    assert u[2]["input_tokens_details"]["cached_tokens"] > u[1]["input_tokens_details"]["cached_tokens"]
    after = server.wait_metrics(lambda m: m["pagoda:prefix_cache_hits_total"] > hits)
    assert after["pagoda:prefix_cache_hits_total"] > hits
    # the third turn's prompt is the whole conversation (the first instructions not carried)
    conv = [{"role": "user", "content": turns[0]},
            {"role": "assistant", "content": output_text(bodies[0])},
            {"role": "user", "content": turns[1]},
            {"role": "assistant", "content": output_text(bodies[1])},
            {"role": "user", "content": turns[2]}]
    text, _ = chat_text(server, conv, 8)
    assert output_text(bodies[2]) == text
    r = post(server, {"messages": conv, "max_tokens": 1}, "/v1/chat/completions")
    assert r.json()["usage"]["prompt_tokens"] == u[2]["input_tokens"]


def test_get_and_delete(server):
    body = ok(post(server, {"input": "Hi", "max_output_tokens": 3}))
    url = server.url(f"/v1/responses/{body['id']}")
    assert ok(requests.get(url, timeout=30)) == body
    r = requests.delete(url, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json() == {"id": body["id"], "object": "response", "deleted": True}
    for r in (requests.get(url, timeout=30), requests.delete(url, timeout=30)):
        assert r.status_code == 404, r.text
        validate(r.json(), "ErrorResponse")
    # a chain from the deleted response is a 404 too
    r = post(server, {"input": "x", "previous_response_id": body["id"]})
    assert r.status_code == 404 and r.json()["error"]["param"] == "previous_response_id"
    # store: false keeps nothing
    body = ok(post(server, {"input": "Hi", "max_output_tokens": 2, "store": False}))
    assert body["store"] is False
    assert requests.get(server.url(f"/v1/responses/{body['id']}"), timeout=30).status_code == 404


def wait_final(server, rid, timeout=120):
    deadline = time.time() + timeout
    while True:
        body = ok(requests.get(server.url(f"/v1/responses/{rid}"), timeout=30))
        if body["status"] not in ("queued", "in_progress") or time.time() > deadline:
            return body
        time.sleep(0.1)


def test_background_and_cancel(server):
    first = ok(post(server, {"input": "Count to ten.", "max_output_tokens": 6, "temperature": 0,
                             "background": True}))
    assert first["status"] in ("queued", "in_progress") and first["background"] is True
    assert first["output"] == []
    final = wait_final(server, first["id"])
    assert final["status"] in ("completed", "incomplete") and final["usage"]["output_tokens"] <= 6
    whole = ok(post(server, {"input": "Count to ten.", "max_output_tokens": 6, "temperature": 0}))
    assert output_text(final) == output_text(whole)
    # a long one, cancelled while it runs
    # greedy: this answer runs to max_output_tokens (a sampled one may end in time to finish
    # before the GET below)
    long = ok(post(server, {"input": "Write a long story about a dragon.", "temperature": 0,
                            "max_output_tokens": 2000, "background": True}))
    time.sleep(0.5)
    running = ok(requests.get(server.url(f"/v1/responses/{long['id']}"), timeout=30))
    assert running["status"] == "in_progress", running["status"]
    r = post(server, {}, f"/v1/responses/{long['id']}/cancel")
    c = ok(r)
    assert c["status"] == "cancelled" and c["id"] == long["id"]
    final = wait_final(server, long["id"])
    assert final["status"] == "cancelled"
    time.sleep(0.5)  # the run has ended: the stored object stays cancelled, with what it wrote
    final = ok(requests.get(server.url(f"/v1/responses/{long['id']}"), timeout=30))
    assert final["status"] == "cancelled" and final["usage"]["output_tokens"] < 2000
    # a finished response cannot be cancelled
    r = post(server, {}, f"/v1/responses/{first['id']}/cancel")
    assert r.status_code == 400, r.text


@pytest.mark.parametrize("extra,status,param,needle", [
    ({"tools": [{"type": "web_search_preview"}]}, 400, "tools", "web_search_preview"),
    ({"tools": [{"type": "file_search", "vector_store_ids": ["v"]}]}, 400, "tools", "file_search"),
    ({"tools": [{"type": "code_interpreter", "container": {"type": "auto"}}]}, 400, "tools",
     "code_interpreter"),
    ({"tools": [{"type": "computer_use_preview", "display_width": 1, "display_height": 1,
                 "environment": "linux"}]}, 400, "tools", "computer_use_preview"),
    ({"tools": [{"type": "image_generation"}]}, 400, "tools", "image_generation"),
    ({"tools": [{"type": "mcp", "server_label": "x", "server_url": "http://x"}]}, 400, "tools",
     "mcp"),
    ({"input": [{"role": "user", "content": [
        {"type": "input_image", "image_url": "http://x/a.png"}]}]}, 400, "input[0]",
     "input_image"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, 400,
     "input[0]", "input_file"),
    ({"conversation": "conv_123"}, 400, "conversation", "not supported"),
    ({"previous_response_id": "resp_nope"}, 404, "previous_response_id", "not found"),
    ({"background": True, "store": False}, 400, "background", "store"),
    ({"tool_choice": {"type": "file_search"}}, 400, "tool_choice", "file_search"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, 400, "text.format", "schema"),
    ({"temperature": 3}, 400, "temperature", "temperature"),
    ({"input": None}, 400, "input", "input"),
])
def test_refused(server, extra, status, param, needle):
    r = post(server, dict({"input": "Hi", "max_output_tokens": 2}, **extra))
    assert r.status_code == status, r.text
    validate(r.json(), "ErrorResponse")
    e = r.json()["error"]
    assert e["param"] == param and needle in e["message"], e
    if status == 404:
        assert e["code"] == "previous_response_not_found"


def test_reasoning_items(tmp_path_factory):
    """--reasoning-parser deepseek_r1 on DeepSeek-R1's template (which opens the thinking): the
    chat answer's reasoning_content is a reasoning item (reasoning_text) before the message,
    streamed as reasoning_text deltas that add up to it."""
    model = util.model_with_template(tmp_path_factory,
                                     "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja")
    with Server(model, "--reasoning-parser", "deepseek_r1") as s:
        req = {"input": "Hi", "max_output_tokens": 12, "temperature": 0}
        body = ok(post(s, req))
        r = post(s, {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 12,
                     "temperature": 0}, "/v1/chat/completions")
        m = r.json()["choices"][0]["message"]
        assert m["reasoning_content"], m  # (the random model never closes its thinking)
        rs = body["output"][0]
        assert rs["type"] == "reasoning" and rs["id"].startswith("rs_")
        assert rs["content"] == [{"type": "reasoning_text", "text": m["reasoning_content"]}]
        assert rs["summary"] == [] and body["output"][1]["type"] == "message"
        assert output_text(body) == (m["content"] or "")
        final = check_stream(sse(post(s, dict(req, stream=True), stream=True)))
        assert final["output"][0]["content"] == rs["content"]
        assert [it["type"] for it in final["output"]] == [it["type"] for it in body["output"]]
