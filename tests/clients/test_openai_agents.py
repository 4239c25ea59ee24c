"""The `openai-agents` SDK: an Agent with one function tool, run to completion through the
Responses API (OpenAIResponsesModel on an AsyncOpenAI client pointed at the server). The call is
forced with ModelSettings(tool_choice=...) and the run stops on the first tool's output, so the
135M model completes it."""
import json

import jsonschema
from agents import (Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool,
                    set_tracing_disabled)
from openai import AsyncOpenAI

set_tracing_disabled(True)


def test_agent_function_tool(server, model):
    ran = []

    @function_tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city.

        Args:
            city: The city's name.
        """
        ran.append(city)
        return f"It is sunny and 18 degrees Celsius in {city}."

    client = AsyncOpenAI(base_url=server.url("/v1"), api_key="x", max_retries=0)
    agent = Agent(
        name="weather", instructions="You answer questions about the weather.",
        tools=[get_weather], tool_use_behavior="stop_on_first_tool",
        model=OpenAIResponsesModel(model=model, openai_client=client),
        model_settings=ModelSettings(tool_choice="get_weather", temperature=0, max_tokens=60))
    result = Runner.run_sync(agent, "What is the weather like in Paris today?", max_turns=3)
    assert len(ran) == 1 and isinstance(ran[0], str), ran
    assert result.final_output == f"It is sunny and 18 degrees Celsius in {ran[0]}."
    # the call the model made: one function_call whose arguments the tool's schema accepts
    calls = [o for r in result.raw_responses for o in r.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather", calls
    args = json.loads(calls[0].arguments)
    jsonschema.validate(args, get_weather.params_json_schema)
    assert args["city"] == ran[0]


def test_agent_streamed(server, model):
    """The same run streamed (Runner.run_streamed: the Responses API's events, assembled by the
    SDK)."""
    import asyncio
    ran = []

    @function_tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city.

        Args:
            city: The city's name.
        """
        ran.append(city)
        return f"It is sunny in {city}."

    async def go():
        client = AsyncOpenAI(base_url=server.url("/v1"), api_key="x", max_retries=0)
        agent = Agent(
            name="weather", instructions="You answer questions about the weather.",
            tools=[get_weather], tool_use_behavior="stop_on_first_tool",
            model=OpenAIResponsesModel(model=model, openai_client=client),
            model_settings=ModelSettings(tool_choice="get_weather", temperature=0,
                                         max_tokens=60))
        run = Runner.run_streamed(agent, "What is the weather like in Paris today?",
                                  max_turns=3)
        kinds = [e.type async for e in run.stream_events()]
        return run, kinds

    run, kinds = asyncio.run(go())
    assert "raw_response_event" in kinds, kinds
    assert len(ran) == 1 and run.final_output == f"It is sunny in {ran[0]}.", (ran, run)
