"""The `openai` SDK's Responses API (/v1/responses): create, stream (typed events and the final
response), parse with a Pydantic text_format, a function tool round trip through a
function_call_output item, and a previous_response_id chain whose later turns hit the prefix
cache. Each answer is held to the plain chat API's greedy answer to the same conversation, and
each body to the OpenAI OpenAPI description."""
import json
import uuid

import openai
import pydantic
import pytest
import requests
from openai.types.responses import ResponseStreamEvent
from pydantic import BaseModel

from server_util import validate

QUESTION = "What is the capital of France?"
SYSTEM = "You are a helpful assistant. Answer briefly."
WEATHER = {"type": "function", "name": "get_weather", "strict": False,
           "description": "Get the current weather in a city",
           "parameters": {"type": "object", "properties": {
               "city": {"type": "string", "description": "The city's name"}},
               "required": ["city"]}}
STREAM_EVENT = pydantic.TypeAdapter(ResponseStreamEvent)


class Address(BaseModel):
    city: str
    country: str


class Person(BaseModel):
    name: str
    age: int
    address: Address


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url("/v1"), api_key="x", max_retries=0)


def check_text_against(resp, ref):
    """A Responses answer against the chat API's answer to the same conversation: the same text,
    token counts and stop."""
    choice = ref["choices"][0]
    assert resp.output_text == choice["message"]["content"], (resp.output_text, choice)
    assert resp.usage.input_tokens == ref["usage"]["prompt_tokens"], resp.usage
    assert resp.usage.output_tokens == ref["usage"]["completion_tokens"], resp.usage
    assert resp.usage.total_tokens == resp.usage.input_tokens + resp.usage.output_tokens
    if choice["finish_reason"] == "length":
        assert resp.status == "incomplete", resp
        assert resp.incomplete_details.reason == "max_output_tokens", resp.incomplete_details
    else:
        assert resp.status == "completed" and resp.incomplete_details is None, resp
    messages = [o for o in resp.output if o.type == "message"]
    assert len(messages) == 1 and messages[0].role == "assistant", resp.output
    assert [c.type for c in messages[0].content] == ["output_text"], messages[0]


def test_create(client, server, model, refs):
    raw = client.responses.with_raw_response.create(
        model=model, instructions=SYSTEM, input=QUESTION, max_output_tokens=16, temperature=0)
    validate(raw.http_response.json(), "Response")
    resp = raw.parse()
    assert resp.object == "response" and resp.model == model, resp
    ref = refs.chat(server, model, [{"role": "system", "content": SYSTEM},
                                    {"role": "user", "content": QUESTION}], 16)
    check_text_against(resp, ref)
    # cut by max_output_tokens: incomplete, as the chat answer's "length"
    short = client.responses.create(model=model, instructions=SYSTEM, input=QUESTION,
                                    max_output_tokens=3, temperature=0)
    check_text_against(short, refs.chat(server, model, [
        {"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}], 3))


def test_stream(client, server, model, refs):
    with client.responses.stream(model=model, instructions=SYSTEM, input=QUESTION,
                                 max_output_tokens=16, temperature=0) as stream:
        events = list(stream)
        final = stream.get_final_response()
    ref = refs.chat(server, model, [{"role": "system", "content": SYSTEM},
                                    {"role": "user", "content": QUESTION}], 16)
    check_text_against(final, ref)
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"], types
    assert types[-1] == ("response.completed" if final.status == "completed"
                         else "response.incomplete"), types
    for need in ("response.output_item.added", "response.content_part.added",
                 "response.output_text.delta", "response.output_text.done",
                 "response.content_part.done", "response.output_item.done"):
        assert need in types, (need, types)
    seq = [e.sequence_number for e in events]
    assert seq == list(range(seq[0], seq[0] + len(seq))), seq
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert "".join(e.delta for e in deltas) == final.output_text
    done = next(e for e in events if e.type == "response.output_text.done")
    assert done.text == final.output_text
    item_id = next(o.id for o in final.output if o.type == "message")
    added = next(e for e in events if e.type == "response.output_item.added")
    assert added.item.id == item_id and {e.item_id for e in deltas} == {item_id}
    assert events[0].response.id == final.id


def test_stream_wire(server, model):
    """The raw SSE stream: `event: T` lines naming each data's type, every data parsed by the
    SDK's ResponseStreamEvent union (not leniently) and valid against the OpenAPI description."""
    r = requests.post(server.url("/v1/responses"), timeout=120, stream=True, json={
        "model": model, "input": QUESTION, "max_output_tokens": 8, "temperature": 0,
        "stream": True})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/event-stream"), r.headers
    name, n = None, 0
    for line in r.iter_lines(decode_unicode=True):
        if not line:
            name = None
            continue
        if line.startswith("event: "):
            name = line[len("event: "):]
            continue
        assert line.startswith("data: "), line
        data = json.loads(line[len("data: "):])
        assert name == data["type"], (name, data)
        STREAM_EVENT.validate_python(data)
        validate(data, "ResponseStreamEvent")
        n += 1
    assert data["type"] in ("response.completed", "response.incomplete"), data
    validate(data["response"], "Response")
    assert n >= 8


def test_parse_text_format(client, model, refs):
    resp = client.responses.parse(
        model=model, input="Extract the person: Alice is 30 years old and lives in Paris, "
        "France.", text_format=Person, max_output_tokens=100, temperature=0)
    assert resp.status == "completed", resp
    assert isinstance(resp.output_parsed, Person), resp.output
    assert refs.check(resp.output_text, Person.model_json_schema()) == \
        resp.output_parsed.model_dump()


def test_function_tool_round_trip(client, server, model, refs):
    ask = [{"role": "user", "content": "What is the weather like in Paris today?"}]
    raw = client.responses.with_raw_response.create(
        model=model, input=ask, tools=[WEATHER], max_output_tokens=60, temperature=0,
        tool_choice={"type": "function", "name": "get_weather"})
    validate(raw.http_response.json(), "Response")
    first = raw.parse()
    calls = [o for o in first.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather", first.output
    refs.check(calls[0].arguments, WEATHER["parameters"])
    assert calls[0].call_id and first.status == "completed", first
    result = json.dumps({"temperature_celsius": 18, "sky": "clear"})
    second = client.responses.create(
        model=model, max_output_tokens=20, temperature=0,
        input=ask + first.output + [{"type": "function_call_output", "call_id": calls[0].call_id,
                                     "output": result}])
    assert second.output_text, second
    # the same conversation in the chat API: the assistant's tool call, then the tool's answer
    ref = refs.chat(server, model, ask + [
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": calls[0].call_id, "type": "function",
            "function": {"name": calls[0].name, "arguments": calls[0].arguments}}]},
        {"role": "tool", "tool_call_id": calls[0].call_id, "content": result}], 20)
    check_text_against(second, ref)


def test_function_call_streamed(client, model, refs):
    """A forced function call streamed: function_call_arguments delta and done events on the
    call's item, adding up to the final response's call and to the non-streamed one."""
    ask = [{"role": "user", "content": "What is the weather like in Paris today?"}]
    kw = dict(model=model, input=ask, tools=[WEATHER], max_output_tokens=60, temperature=0,
              tool_choice={"type": "function", "name": "get_weather"})
    plain = client.responses.create(**kw)
    with client.responses.stream(**kw) as stream:
        events = list(stream)
        final = stream.get_final_response()
    want = [(o.name, o.arguments) for o in plain.output if o.type == "function_call"]
    calls = [o for o in final.output if o.type == "function_call"]
    assert [(o.name, o.arguments) for o in calls] == want, (final.output, plain.output)
    deltas = [e for e in events if e.type == "response.function_call_arguments.delta"]
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert deltas and len(done) == 1, [e.type for e in events]
    assert "".join(e.delta for e in deltas) == done[0].arguments == calls[0].arguments
    assert {e.item_id for e in deltas} == {done[0].item_id} == {calls[0].id}
    refs.check(calls[0].arguments, WEATHER["parameters"])


def test_previous_response_id_chain(client, server, model, refs):
    """Three turns chained by previous_response_id: turns 2 and 3 are served from the prefix
    cache (the instructions open with a fresh id, so turn 1 shares no block with anything), and
    turn 3 answers the whole conversation as the chat API does."""
    instructions = f"Session {uuid.uuid4().hex}. You are a helpful assistant."
    turns = ["My name is Ada and I like green tea.", "What do I like to drink?",
             "And what is my name?"]
    out, prev = [], None
    for text in turns:
        chain = {"previous_response_id": prev} if prev else {}
        resp = client.responses.create(model=model, instructions=instructions, input=text,
                                       max_output_tokens=12, temperature=0, **chain)
        out.append(resp)
        prev = resp.id
    cached = [r.usage.input_tokens_details.cached_tokens for r in out]
    assert cached[0] == 0 and cached[1] > 0 and cached[2] > 0, cached
    assert all(c <= r.usage.input_tokens for c, r in zip(cached, out)), cached
    assert out[1].usage.input_tokens > out[0].usage.input_tokens + out[0].usage.output_tokens
    assert out[1].previous_response_id == out[0].id
    conversation = [{"role": "system", "content": instructions}]
    for text, resp in zip(turns[:2], out[:2]):
        conversation += [{"role": "user", "content": text},
                         {"role": "assistant", "content": resp.output_text}]
    conversation.append({"role": "user", "content": turns[2]})
    check_text_against(out[2], refs.chat(server, model, conversation, 12))
    # the store: GET returns the stored answer, DELETE removes it
    got = client.responses.retrieve(out[0].id)
    assert got.id == out[0].id and got.output_text == out[0].output_text
    client.responses.delete(out[2].id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(out[2].id)


@pytest.mark.parametrize("what", ["web_search", "input_image"])
def test_unsupported_is_named(client, model, what):
    """What Pagoda cannot do (built-in tools, image inputs) is a 400 naming it, not ignored."""
    if what == "web_search":
        kw = {"input": QUESTION, "tools": [{"type": "web_search"}]}
    else:
        kw = {"input": [{"role": "user", "content": [
            {"type": "input_text", "text": "What is in this image?"},
            {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="}]}]}
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=model, max_output_tokens=4, **kw)
    assert what in e.value.message, e.value.message
    validate(e.value.response.json(), "ErrorResponse")
