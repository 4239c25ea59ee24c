"""The client compatibility suite (issue 33): the real client packages (openai, openai-agents,
anthropic, langchain-openai, instructor, litellm; tests/clients/requirements.txt) against a real
`pagoda serve` on the default model. Expected values come from references, never from the
test's own text: the plain chat API's greedy answer to the same conversation, jsonschema on the
tools' and Pydantic models' schemas, the SDKs' own types, and the OpenAI OpenAPI description.

One server per configuration and test module (each starts in about a second, and a server that
dies fails only its own module): the default one (no tool-call parser option), one with
--api-key, and (in test_openai.py) one with a one-place waiting queue."""
import os
import sys
from pathlib import Path

import pytest

# Offline: no SDK phones home (cost maps, telemetry, tracing exports).
os.environ.update({
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "LITELLM_TELEMETRY": "False",
    "LANGSMITH_TRACING": "false",
    "LANGCHAIN_TRACING_V2": "false",
    "LANGSMITH_TRACING_V2": "false",
    "OPENAI_AGENTS_DISABLE_TRACING": "1",
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
})
for var in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL",
            "ANTHROPIC_AUTH_TOKEN", "PAGODA_API_KEY"):
    os.environ.pop(var, None)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import util  # noqa: E402

API_KEY = "sk-pagoda-clients-test"


@pytest.fixture(scope="module")
def server():
    """`pagoda serve` on the default model, with no tool-call parser option."""
    from server_util import Server
    assert util.DEFAULT_MODEL.exists(), "run scripts/fetch-default-model.sh first"
    s = Server(util.DEFAULT_MODEL)
    s.start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def auth_server():
    """The default model behind --api-key API_KEY."""
    from server_util import Server
    s = Server(util.DEFAULT_MODEL, "--api-key", API_KEY)
    s.start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def model(server):
    """The served model's name, as GET /v1/models lists it."""
    import requests
    r = requests.get(server.url("/v1/models"), timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["data"][0]["id"]


def chat_reference(server, model, messages, max_tokens, **extra):
    """The plain chat API's greedy answer (the chat.completion JSON) to messages: the reference
    the other APIs' answers to the same conversation are held to."""
    import requests
    body = dict(model=model, messages=messages, max_tokens=max_tokens, temperature=0, **extra)
    r = requests.post(server.url("/v1/chat/completions"), json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def loads_unique(text):
    """json.loads that fails on a key repeated in one object (the grammar must not repeat one)."""
    import json

    def pairs(kv):
        keys = [k for k, _ in kv]
        assert len(keys) == len(set(keys)), f"a key repeated in {text!r}"
        return dict(kv)
    return json.loads(text, object_pairs_hook=pairs)


def closed_schema(schema):
    """schema with additionalProperties: false on every object schema that does not say
    otherwise: what the answer must match when the server generates no undeclared property."""
    if isinstance(schema, dict):
        out = {k: closed_schema(v) for k, v in schema.items()}
        if "properties" in out and "additionalProperties" not in out:
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [closed_schema(v) for v in schema]
    return schema


def check_instance(value, schema):
    """value (a JSON text or a parsed object) validates against schema and carries no property
    the schema does not declare (jsonschema's Draft 2020-12 validator)."""
    import jsonschema
    if isinstance(value, (str, bytes)):
        value = loads_unique(value)
    jsonschema.Draft202012Validator(closed_schema(schema)).validate(value)
    return value


@pytest.fixture(scope="session")
def refs():
    """The helpers above, for the test modules."""
    import types
    return types.SimpleNamespace(chat=chat_reference, loads_unique=loads_unique,
                                 check=check_instance, closed=closed_schema)


def pytest_configure(config):
    # the SDKs' own import-time warnings (litellm's TypedDicts under Pydantic) are not Pagoda's
    config.addinivalue_line("filterwarnings", "ignore::UserWarning:pydantic._internal")
