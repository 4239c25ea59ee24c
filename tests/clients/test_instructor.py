"""`instructor` on the openai client: Mode.JSON, Mode.JSON_SCHEMA and Mode.TOOLS, and
create_partial streaming, each returning a valid Pydantic object (max_retries=0: one attempt,
no re-asking that would hide a bad answer)."""
import instructor
import openai
import pytest
from pydantic import BaseModel, Field

# Mode.JSON sends no schema to the server (json_object, the schema in the system prompt): the
# 135M model copies that schema back unless the user's message shows the shape of an answer.
MESSAGES = [{"role": "user", "content":
             'Alice is 30 years old. Reply with her data as JSON: {"name": ..., "age": ...}'}]


class Person(BaseModel):
    """A person."""
    name: str = Field(description="The person's name")
    age: int = Field(description="The person's age in years")


def make(server, mode):
    return instructor.from_openai(openai.OpenAI(base_url=server.url("/v1"), api_key="x",
                                                max_retries=0), mode=mode)


def raw_json(completion, mode):
    msg = completion.choices[0].message
    if mode == instructor.Mode.TOOLS:
        assert len(msg.tool_calls) == 1, msg
        return msg.tool_calls[0].function.arguments
    return msg.content


@pytest.fixture(scope="module")
def answers(server, model):
    """{mode: (person, completion)} of one non-streamed call per mode, computed once."""
    cache = {}

    def get(mode):
        if mode not in cache:
            cache[mode] = make(server, mode).chat.completions.create_with_completion(
                model=model, response_model=Person, messages=MESSAGES, max_tokens=100,
                temperature=0, max_retries=0)
        return cache[mode]
    return get


@pytest.mark.parametrize("mode", [instructor.Mode.JSON, instructor.Mode.JSON_SCHEMA,
                                  instructor.Mode.TOOLS], ids=lambda m: m.name)
def test_mode(answers, mode, refs):
    person, completion = answers(mode)
    assert isinstance(person, Person), person
    assert completion.choices[0].finish_reason in ("stop", "tool_calls"), completion
    assert refs.check(raw_json(completion, mode), Person.model_json_schema()) == \
        person.model_dump()


@pytest.mark.parametrize("mode", [instructor.Mode.TOOLS, instructor.Mode.JSON_SCHEMA],
                         ids=lambda m: m.name)
def test_create_partial(server, model, answers, mode):
    """Streamed partial objects: each a Person whose fields so far are set, the last one
    complete and equal to the non-streamed answer in the same mode."""
    client = make(server, mode)
    partials = list(client.chat.completions.create_partial(
        model=model, response_model=Person, messages=MESSAGES, max_tokens=100, temperature=0,
        max_retries=0))
    assert len(partials) >= 2, partials
    last = Person.model_validate(partials[-1].model_dump())
    assert last.model_dump() == answers(mode)[0].model_dump(), (last, answers(mode)[0])
