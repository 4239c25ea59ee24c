"""`litellm` with model "openai/<served name>" and api_base the server's /v1: completion,
streaming and tools, held to the plain chat API's greedy answer and the tool's schema."""
import litellm
import pytest

litellm.telemetry = False

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "The city's name"}}, "required": ["city"]}}}


@pytest.fixture(scope="module")
def kw(server, model):
    return {"model": f"openai/{model}", "api_base": server.url("/v1"), "api_key": "x",
            "temperature": 0, "num_retries": 0}


def test_completion(kw, server, model, refs):
    r = litellm.completion(messages=QUESTION, max_tokens=16, **kw)
    ref = refs.chat(server, model, QUESTION, 16)
    assert r.choices[0].message.content == ref["choices"][0]["message"]["content"], r
    assert r.choices[0].finish_reason == ref["choices"][0]["finish_reason"]
    assert r.usage.prompt_tokens == ref["usage"]["prompt_tokens"]
    assert r.usage.completion_tokens == ref["usage"]["completion_tokens"]


def test_stream(kw, server, model, refs):
    chunks = list(litellm.completion(messages=QUESTION, max_tokens=16, stream=True, **kw))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    ref = refs.chat(server, model, QUESTION, 16)
    assert text == ref["choices"][0]["message"]["content"], (text, ref)
    assert len(chunks) > 2
    assert [c.choices[0].finish_reason for c in chunks if c.choices and
            c.choices[0].finish_reason][-1] == ref["choices"][0]["finish_reason"]


@pytest.mark.parametrize("choice", ["required", "named"])
def test_tools(kw, choice, refs):
    tool_choice = ("required" if choice == "required"
                   else {"type": "function", "function": {"name": "get_weather"}})
    r = litellm.completion(messages=[{"role": "user", "content":
                                      "What is the weather like in Paris today?"}],
                           tools=[WEATHER], tool_choice=tool_choice, max_tokens=60, **kw)
    calls = r.choices[0].message.tool_calls
    assert calls and len(calls) == 1 and calls[0].function.name == "get_weather", r
    refs.check(calls[0].function.arguments, WEATHER["function"]["parameters"])
