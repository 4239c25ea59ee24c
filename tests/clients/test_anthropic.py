"""The `anthropic` SDK against /v1/messages: create and stream (text held to the chat API's
greedy answer; get_final_message equal to the streamed text), a tool_use -> tool_result round
trip, count_tokens, errors in Anthropic's shape with its status codes, and x-api-key auth."""
import base64
import json

import anthropic
import pydantic
import pytest
import requests
from anthropic.types import ErrorResponse, Message, RawMessageStreamEvent

from conftest import API_KEY

SYSTEM = "You are a helpful assistant. Answer briefly."
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
ASK = [{"role": "user", "content": "What is the weather like in Paris today?"}]
TOOL = {"name": "get_weather", "description": "Get the current weather in a city",
        "input_schema": {"type": "object", "properties": {
            "city": {"type": "string", "description": "The city's name"}}, "required": ["city"]}}
FORCE = {"type": "tool", "name": "get_weather"}
# The SDK (2.x) has no sampling parameters: temperature rides in extra_body, as the API takes it.
GREEDY = {"extra_body": {"temperature": 0}}
MESSAGE = pydantic.TypeAdapter(Message)
EVENT = pydantic.TypeAdapter(RawMessageStreamEvent)
ERROR = pydantic.TypeAdapter(ErrorResponse)
# a 1x1 PNG
PNG = base64.b64encode(bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000100e221bc330000000049454e44ae426082")).decode()


@pytest.fixture(scope="module")
def client(server):
    return anthropic.Anthropic(base_url=server.url(), api_key="x", max_retries=0)


def prompt_tokens(usage):
    """All the prompt's tokens: Anthropic's input_tokens leaves out those read from or written
    to the cache, which it counts apart."""
    return (usage.input_tokens + (usage.cache_read_input_tokens or 0)
            + (usage.cache_creation_input_tokens or 0))


def check_against_chat(msg, ref):
    """A Messages answer against the chat API's answer to the same conversation."""
    choice = ref["choices"][0]
    assert [b.type for b in msg.content] == ["text"], msg.content
    assert msg.content[0].text == choice["message"]["content"], (msg.content, choice)
    assert msg.stop_reason == {"stop": "end_turn", "length": "max_tokens"}[
        choice["finish_reason"]], (msg.stop_reason, choice)
    assert prompt_tokens(msg.usage) == ref["usage"]["prompt_tokens"], msg.usage
    assert msg.usage.output_tokens == ref["usage"]["completion_tokens"], msg.usage


@pytest.mark.parametrize("max_tokens", [16, 3])
def test_create(client, server, model, refs, max_tokens):
    raw = client.messages.with_raw_response.create(
        model=model, system=SYSTEM, messages=QUESTION, max_tokens=max_tokens, **GREEDY)
    MESSAGE.validate_python(raw.http_response.json())
    msg = raw.parse()
    assert msg.type == "message" and msg.role == "assistant" and msg.model == model, msg
    ref = refs.chat(server, model, [{"role": "system", "content": SYSTEM}] + QUESTION,
                    max_tokens)
    check_against_chat(msg, ref)
    # system as text blocks: the same prompt
    blocks = client.messages.create(model=model, system=[{"type": "text", "text": SYSTEM}],
                                    messages=QUESTION, max_tokens=max_tokens, **GREEDY)
    check_against_chat(blocks, ref)


def test_stream(client, server, model, refs):
    with client.messages.stream(model=model, system=SYSTEM, messages=QUESTION, max_tokens=16,
                                **GREEDY) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert final.content[0].text == text
    check_against_chat(final, refs.chat(
        server, model, [{"role": "system", "content": SYSTEM}] + QUESTION, 16))


def test_stream_wire(server, model):
    """The raw SSE stream: `event: T` naming each data's type, each event parsed by the SDK's
    RawMessageStreamEvent union (pings aside), message_start first and message_stop last."""
    r = requests.post(server.url("/v1/messages"), timeout=120, stream=True,
                      headers={"x-api-key": "x", "anthropic-version": "2023-06-01"},
                      json={"model": model, "messages": QUESTION, "max_tokens": 8,
                            "stream": True, "temperature": 0})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/event-stream"), r.headers
    name, types = None, []
    for line in r.iter_lines(decode_unicode=True):
        if not line:
            continue
        if line.startswith("event: "):
            name = line[len("event: "):]
            continue
        assert line.startswith("data: "), line
        data = json.loads(line[len("data: "):])
        assert name == data["type"], (name, data)
        if data["type"] != "ping":
            EVENT.validate_python(data)
            types.append(data["type"])
    assert types[0] == "message_start" and types[-1] == "message_stop", types
    assert {"content_block_start", "content_block_delta", "content_block_stop",
            "message_delta"} <= set(types), types


@pytest.fixture(scope="module")
def tool_use(client, model):
    return client.messages.create(model=model, messages=ASK, tools=[TOOL], tool_choice=FORCE,
                                  max_tokens=60, **GREEDY)


def test_tool_use(tool_use, refs):
    uses = [b for b in tool_use.content if b.type == "tool_use"]
    assert len(uses) == 1 and uses[0].name == "get_weather" and uses[0].id, tool_use.content
    refs.check(uses[0].input, TOOL["input_schema"])
    assert tool_use.stop_reason == "tool_use", tool_use


def test_tool_use_stream(client, model, tool_use):
    """Streamed, the forced call arrives as input_json_delta events that the SDK assembles into
    the same input as the non-streamed answer."""
    with client.messages.stream(model=model, messages=ASK, tools=[TOOL], tool_choice=FORCE,
                                max_tokens=60, **GREEDY) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_message()
    assert "input_json" in kinds, kinds
    got = [b for b in final.content if b.type == "tool_use"]
    want = [b for b in tool_use.content if b.type == "tool_use"]
    assert [(b.name, b.input) for b in got] == [(b.name, b.input) for b in want], final
    assert final.stop_reason == "tool_use"


def test_tool_result_round_trip(client, model, tool_use):
    use = next(b for b in tool_use.content if b.type == "tool_use")
    messages = ASK + [
        {"role": "assistant", "content": tool_use.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                      "content": "It is sunny and 18 degrees Celsius."}]}]
    msg = client.messages.create(model=model, messages=messages, tools=[TOOL],
                                 tool_choice={"type": "none"}, max_tokens=20, **GREEDY)
    assert msg.content and msg.content[0].type == "text" and msg.content[0].text, msg
    assert msg.stop_reason in ("end_turn", "max_tokens"), msg
    assert prompt_tokens(msg.usage) > prompt_tokens(tool_use.usage), msg.usage
    count = client.messages.count_tokens(model=model, messages=messages, tools=[TOOL],
                                         tool_choice={"type": "none"})
    assert count.input_tokens == prompt_tokens(msg.usage)


def test_count_tokens(client, model):
    msg = client.messages.create(model=model, system=SYSTEM, messages=QUESTION, max_tokens=4,
                                 **GREEDY)
    count = client.messages.count_tokens(model=model, system=SYSTEM, messages=QUESTION)
    assert count.input_tokens == prompt_tokens(msg.usage) > 0, (count, msg.usage)


def test_count_tokens_tools(client, model, tool_use):
    with_tools = client.messages.count_tokens(model=model, messages=ASK, tools=[TOOL],
                                              tool_choice=FORCE)
    assert with_tools.input_tokens == prompt_tokens(tool_use.usage)


def test_error_image(client, model):
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model=model, max_tokens=8, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": PNG}},
            {"type": "text", "text": "What is in this image?"}]}])
    assert e.value.status_code == 400
    body = ERROR.validate_python(e.value.response.json())
    assert body.error.type == "invalid_request_error", body


def test_error_unknown_model(client):
    with pytest.raises(anthropic.NotFoundError) as e:
        client.messages.create(model="no-such-model", max_tokens=8, messages=QUESTION)
    assert e.value.status_code == 404
    body = ERROR.validate_python(e.value.response.json())
    assert body.error.type == "not_found_error", body


def test_api_key(auth_server):
    model = requests.get(auth_server.url("/v1/models"), timeout=30,
                         headers={"Authorization": f"Bearer {API_KEY}"}).json()["data"][0]["id"]
    for kw in ({"api_key": API_KEY}, {"auth_token": API_KEY}):  # x-api-key; Bearer
        ok = anthropic.Anthropic(base_url=auth_server.url(), max_retries=0, **kw)
        msg = ok.messages.create(model=model, messages=QUESTION, max_tokens=4, **GREEDY)
        assert msg.content[0].text, msg
    wrong = anthropic.Anthropic(base_url=auth_server.url(), api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as e:
        wrong.messages.create(model=model, messages=QUESTION, max_tokens=4)
    assert e.value.status_code == 401
    body = ERROR.validate_python(e.value.response.json())
    assert body.error.type == "authentication_error", body
