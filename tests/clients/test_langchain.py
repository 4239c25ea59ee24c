"""`langchain-openai`'s ChatOpenAI pointed at the server: a bind_tools round trip (the tool
forced by tool_choice) and with_structured_output in its three methods (function_calling,
json_mode, json_schema), each returning a valid Pydantic object."""
import pytest
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field

ASK = "What is the weather like in Paris today?"
DESCRIBE = ('Return a JSON object with the keys "name" (a string) and "age" (an integer) that '
            "describes this person: Alice is 30 years old.")


class Person(BaseModel):
    """A person."""
    name: str = Field(description="The person's name")
    age: int = Field(description="The person's age in years")


@tool
def get_weather(city: str) -> str:
    """Get the current weather in a city."""
    return f"It is sunny and 18 degrees Celsius in {city}."


@pytest.fixture(scope="module")
def llm(server, model):
    return ChatOpenAI(model=model, base_url=server.url("/v1"), api_key="x", temperature=0,
                      max_tokens=60, max_retries=0)


def test_bind_tools_round_trip(llm, refs):
    bound = llm.bind_tools([get_weather], tool_choice="get_weather")
    question = HumanMessage(ASK)
    ai = bound.invoke([question])
    assert len(ai.tool_calls) == 1 and ai.tool_calls[0]["name"] == "get_weather", ai
    refs.check(ai.tool_calls[0]["args"],
               convert_to_openai_tool(get_weather)["function"]["parameters"])
    assert not ai.invalid_tool_calls, ai.invalid_tool_calls
    result = get_weather.invoke(ai.tool_calls[0])  # a ToolMessage answering the call's id
    assert result.tool_call_id == ai.tool_calls[0]["id"]
    final = llm.invoke([question, ai, result])
    assert isinstance(final.content, str) and final.content, final
    assert not final.tool_calls, final
    assert final.usage_metadata["input_tokens"] > ai.usage_metadata["input_tokens"]


@pytest.mark.parametrize("method", ["function_calling", "json_mode", "json_schema"])
def test_with_structured_output(llm, method, refs):
    structured = llm.with_structured_output(Person, method=method, include_raw=True)
    out = structured.invoke(DESCRIBE)
    assert out["parsing_error"] is None, out
    assert isinstance(out["parsed"], Person), out
    raw = out["raw"]
    if method == "function_calling":
        assert len(raw.tool_calls) == 1, raw
        args = raw.tool_calls[0]["args"]
    else:
        args = refs.loads_unique(raw.content)
    assert refs.check(args, Person.model_json_schema()) == out["parsed"].model_dump()
    assert raw.response_metadata["finish_reason"] in ("stop", "tool_calls"), raw
