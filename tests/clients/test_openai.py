"""The `openai` SDK's chat API as agents use it: the tool round trip (the assistant message sent
back as the SDK returned it, content null), required and named tool calls on a server started
with no parser option, parse() with nested Pydantic models, models.list/retrieve, and the
error classes (404, 400, 401, 429)."""
import json
import threading
import time
from typing import Literal

import openai
import pytest
import requests
from pydantic import BaseModel

import util
from conftest import API_KEY
from server_util import Server, validate

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "The city's name"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Get the current time in a time zone",
    "parameters": {"type": "object", "properties": {
        "timezone": {"type": "string", "description": "An IANA time zone"}},
        "required": ["timezone"]}}}
ASK = [{"role": "user", "content": "What is the weather like in Paris today?"}]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}


class Address(BaseModel):
    city: str
    country: str


class Person(BaseModel):
    name: str
    age: int
    address: Address


EXTRACT = [{"role": "user", "content":
            "Extract the person: Alice is 30 years old and lives in Paris, France."}]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url("/v1"), api_key="x", max_retries=0)


def check_call(call, refs):
    """A tool call of the SDK's type whose name is a tool's and whose arguments validate against
    that tool's schema (no undeclared key, none twice). Returns the arguments."""
    assert call.type == "function" and call.id, call
    assert call.function.name in SCHEMAS, call
    return refs.check(call.function.arguments, SCHEMAS[call.function.name])


@pytest.fixture(scope="module")
def forced_call(client, model):
    """The named call get_weather as the SDK returns it (issue 33, items 2 and 4: no parser
    option; a complete call fits in 60 tokens)."""
    return client.chat.completions.create(
        model=model, messages=ASK, tools=[WEATHER], max_tokens=60, temperature=0,
        tool_choice={"type": "function", "function": {"name": "get_weather"}})


def test_named_tool_choice(forced_call, refs):
    choice = forced_call.choices[0]
    assert choice.finish_reason in ("stop", "tool_calls"), choice
    assert choice.message.content is None, choice.message
    assert len(choice.message.tool_calls) == 1, choice.message
    assert choice.message.tool_calls[0].function.name == "get_weather"
    check_call(choice.message.tool_calls[0], refs)


def test_named_tool_choice_streamed(client, model, forced_call):
    """The SDK's stream helper assembles the streamed call into what the plain call returned."""
    with client.chat.completions.stream(
            model=model, messages=ASK, tools=[WEATHER], max_tokens=60, temperature=0,
            tool_choice={"type": "function", "function": {"name": "get_weather"}}) as stream:
        final = stream.get_final_completion()
    got = [(c.function.name, c.function.arguments) for c in final.choices[0].message.tool_calls]
    want = [(c.function.name, c.function.arguments)
            for c in forced_call.choices[0].message.tool_calls]
    assert got == want, (got, want)
    assert final.choices[0].message.content == forced_call.choices[0].message.content, \
        final.choices[0].message


def test_auto_tools_never_silent(client, model):
    """tools with tool_choice "auto" on a server whose template shows no tools and that has no
    parser: a 400 that names the fix (vLLM's answer), or the tools shown in the prompt; never a
    200 that dropped them."""
    plain = client.chat.completions.create(model=model, messages=ASK, max_tokens=4,
                                           temperature=0)
    try:
        resp = client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER],
                                              tool_choice="auto", max_tokens=4, temperature=0)
    except openai.BadRequestError as e:
        assert "tool-call-parser" in e.message, e.message
        return
    assert resp.usage.prompt_tokens > plain.usage.prompt_tokens, (resp.usage, plain.usage)


def test_required_tool_choice(client, model, refs):
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=ASK, tools=[WEATHER, TIME], tool_choice="required",
        max_tokens=60, temperature=0)
    validate(raw.http_response.json(), "CreateChatCompletionResponse")
    choice = raw.parse().choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.tool_calls, choice.message
    for call in choice.message.tool_calls:
        check_call(call, refs)


@pytest.mark.parametrize("content", ["null", "absent", "string", "parts"])
def test_tool_round_trip(client, model, forced_call, content, refs):
    """messages.append(resp.choices[0].message), then a tool message: the second call succeeds,
    whatever form the assistant message's content takes; text and its list-of-parts form are
    the same prompt, and so are null and absent."""
    call = forced_call.choices[0].message.tool_calls[0]
    if content == "null":
        assistant = forced_call.choices[0].message  # the SDK's object: "content": null
    else:
        assistant = forced_call.choices[0].message.model_dump(exclude_none=True)
        assert "content" not in assistant
        if content == "string":
            assistant["content"] = "Let me check."
        elif content == "parts":
            assistant["content"] = [{"type": "text", "text": "Let me check."}]
    tool = {"role": "tool", "tool_call_id": call.id,
            "content": json.dumps({"temperature_celsius": 18, "sky": "clear"})}
    resp = client.chat.completions.create(model=model, messages=ASK + [assistant, tool],
                                          max_tokens=20, temperature=0)
    answer = resp.choices[0].message
    assert isinstance(answer.content, str) and answer.content, answer
    assert resp.usage.prompt_tokens > forced_call.usage.prompt_tokens, resp.usage
    twin = {"null": "absent", "absent": "null", "string": "parts", "parts": "string"}[content]
    other = forced_call.choices[0].message.model_dump(exclude_none=True)
    if twin in ("string", "parts"):
        other["content"] = ("Let me check." if twin == "string"
                            else [{"type": "text", "text": "Let me check."}])
    elif twin == "null":
        other["content"] = None
    ref = client.chat.completions.create(model=model, messages=ASK + [other, tool],
                                         max_tokens=20, temperature=0)
    assert ref.choices[0].message.content == answer.content
    assert ref.usage.prompt_tokens == resp.usage.prompt_tokens


def test_pydantic_function_tool_parse(client, model):
    """openai.pydantic_function_tool + parse(): a strict tool, forced; parsed_arguments is the
    model."""
    class GetWeather(BaseModel):
        city: str
        unit: Literal["celsius", "fahrenheit"]

    tool = openai.pydantic_function_tool(GetWeather)
    resp = client.chat.completions.parse(
        model=model, messages=ASK, tools=[tool], max_tokens=60, temperature=0,
        tool_choice={"type": "function", "function": {"name": "GetWeather"}})
    call = resp.choices[0].message.tool_calls[0]
    assert isinstance(call.function.parsed_arguments, GetWeather), call
    import jsonschema
    jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])


@pytest.mark.parametrize("where", ["chat", "beta.chat"])
def test_parse_nested_models(client, model, where, refs):
    api = client.chat.completions if where == "chat" else client.beta.chat.completions
    resp = api.parse(model=model, messages=EXTRACT, response_format=Person, max_tokens=100,
                     temperature=0)
    msg = resp.choices[0].message
    assert isinstance(msg.parsed, Person) and isinstance(msg.parsed.address, Address), msg
    assert refs.check(msg.content, Person.model_json_schema()) == msg.parsed.model_dump()


def test_json_schema_without_additional_properties(client, model, refs):
    """A Pydantic schema as is (no additionalProperties: false, as instructor and LangChain send
    it): no undeclared key, no key twice, and the answer ends before max_tokens."""
    resp = client.chat.completions.create(
        model=model, messages=EXTRACT, max_tokens=100, temperature=0,
        response_format={"type": "json_schema", "json_schema": {
            "name": "person", "schema": Person.model_json_schema()}})
    assert resp.choices[0].finish_reason == "stop", resp.choices[0]
    Person.model_validate(refs.check(resp.choices[0].message.content,
                                     Person.model_json_schema()))


def test_models_list_and_retrieve(client, model, server):
    listed = client.models.list()
    assert [m.id for m in listed.data] == [model]
    validate(requests.get(server.url("/v1/models"), timeout=30).json(), "ListModelsResponse")
    got = client.models.retrieve(model)
    assert got.id == model and got.object == "model"
    validate(requests.get(server.url(f"/v1/models/{model}"), timeout=30).json(), "Model")
    assert 1_500_000_000 < got.created <= time.time() + 5, got  # a real timestamp
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_created_and_request_id(client, model):
    t0 = int(time.time())
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=ASK, max_tokens=4, temperature=0,
        extra_headers={"X-Request-Id": "clients-test-42"})
    assert t0 - 1 <= raw.parse().created <= time.time() + 1, raw.parse().created
    assert raw.headers.get("x-request-id") == "clients-test-42", dict(raw.headers)
    resp = client.chat.completions.create(model=model, messages=ASK, max_tokens=4,
                                          temperature=0)
    assert resp._request_id, "no X-Request-Id header"


def test_error_not_found(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="no-such-model", messages=ASK, max_tokens=4)
    assert e.value.status_code == 404 and e.value.code == "model_not_found", e.value.body
    validate(e.value.response.json(), "ErrorResponse")


def test_error_bad_request(client, model):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model, messages=[], max_tokens=4)
    assert e.value.status_code == 400
    validate(e.value.response.json(), "ErrorResponse")


def test_error_authentication(auth_server):
    wrong = openai.OpenAI(base_url=auth_server.url("/v1"), api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        wrong.models.list()
    assert e.value.status_code == 401
    validate(e.value.response.json(), "ErrorResponse")
    right = openai.OpenAI(base_url=auth_server.url("/v1"), api_key=API_KEY, max_retries=0)
    model = right.models.list().data[0].id
    resp = right.chat.completions.create(model=model, messages=ASK, max_tokens=4,
                                         temperature=0)
    assert resp.choices[0].message.content


def test_error_rate_limit():
    """One sequence runs, one waits, and a third request is refused: RateLimitError (429) with
    Retry-After and the error object."""
    s = Server(util.DEFAULT_MODEL, "--max-num-seqs", "1", "--max-waiting", "1")
    s.start()
    held = []
    try:
        body = {"messages": ASK, "max_tokens": 4000, "ignore_eos": True, "temperature": 0,
                "stream": True}
        first = requests.post(s.url("/v1/chat/completions"), json=body, stream=True, timeout=60)
        held.append(first)
        assert first.status_code == 200, first.text
        lines = first.iter_lines()  # kept: a dropped iterator closes the connection
        next(lines)

        def waiter():
            held.append(requests.post(s.url("/v1/chat/completions"), json=body, stream=True,
                                      timeout=60))
        t = threading.Thread(target=waiter, daemon=True)
        t.start()
        m = s.wait_metrics(lambda m: m.get("pagoda:num_requests_waiting", 0) >= 1)
        assert m.get("pagoda:num_requests_waiting", 0) >= 1, m
        client = openai.OpenAI(base_url=s.url("/v1"), api_key="x", max_retries=0)
        model = client.models.list().data[0].id
        with pytest.raises(openai.RateLimitError) as e:
            client.chat.completions.create(model=model, messages=ASK, max_tokens=4)
        assert e.value.status_code == 429
        assert e.value.response.headers.get("retry-after"), dict(e.value.response.headers)
        validate(e.value.response.json(), "ErrorResponse")
    finally:
        for r in held:
            r.close()
        s.stop()
