"""Tools on a server whose chat template names no tool-call format (SmolLM2's, started with no
--tool-call-parser), as vLLM serves them without a tool parser (issue 33, items 1-3):

- the tool round trip: the assistant message sent back as the openai SDK returned it (content
  null, tool_calls with string arguments), then a tool message; content null, absent, a string
  or text parts all reach the template in the form it reads (vLLM's _parse_chat_message_content:
  a string, "" for null, parts joined with "\\n"; a list of parts for a template that loops over
  content), checked id for id against transformers' rendering on every template in
  tests/data/chat-templates and on one that loops over content;
- tool_choice "required" and a named function: the answer is held to vLLM's JSON (an array of
  {"name", "parameters"}, or the function's arguments) and returned as tool_calls, streamed as
  deltas the SDK assembles, arguments valid for the tool's parameters (jsonschema);
- tools with tool_choice "auto" (or absent): a 400 naming --tool-call-parser, as vLLM answers.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import requests

import util
from server_util import Server, sse_events, validate

jsonschema = pytest.importorskip("jsonschema")
openai = pytest.importorskip("openai")

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "The city's name"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Get the current time in a time zone",
    "parameters": {"type": "object", "properties": {
        "timezone": {"type": "string"}, "utc": {"type": "boolean"}}, "required": ["timezone"]}}}
TOOLS = [WEATHER, TIME]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather like in Paris today?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def strict(s):
    """A tool's parameters as the answer is held to them (xgrammar's strict mode: declared
    properties only)."""
    if isinstance(s, dict):
        out = {k: strict(v) for k, v in s.items()}
        if isinstance(s.get("properties"), dict):
            out["properties"] = {k: strict(v) for k, v in s["properties"].items()}
            out.setdefault("additionalProperties", False)
        return out
    return s


def check_call(call, names=PARAMS):
    """An OpenAI tool call (a dict) of one of the tools, its arguments valid for that tool's
    parameters (no undeclared key, none twice)."""
    assert call["type"] == "function" and call["id"].startswith("call_"), call
    name = call["function"]["name"]
    assert name in names, call
    args = call["function"]["arguments"]
    pairs = json.loads(args, object_pairs_hook=lambda kv: kv)
    assert len({k for k, _ in pairs}) == len(pairs), args
    jsonschema.validate(json.loads(args), strict(PARAMS[name]))
    return name, json.loads(args)


def chat(server, **body):
    body = {"messages": ASK, "temperature": 0, "max_tokens": 60, **body}
    return requests.post(server.url("/v1/chat/completions"), json=body, timeout=120,
                         stream=body.get("stream", False))


@pytest.fixture(scope="module")
def client(default_server):
    return openai.OpenAI(base_url=default_server.url("/v1"), api_key="x", max_retries=0)


@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id


# ---- tool_choice required and named, no parser ----

@pytest.mark.parametrize("choice", ["required", NAMED], ids=["required", "named"])
def test_forced_call_without_a_parser(default_server, choice):
    """The answer is the call: tool_calls with content null; finish_reason tool_calls for
    "required", stop for a named function (vLLM's, as OpenAI); the call is complete within 60
    tokens (compact JSON), never raw text."""
    r = chat(default_server, tools=TOOLS, tool_choice=choice)
    assert r.status_code == 200, r.text
    validate(r.json(), "CreateChatCompletionResponse")
    c = r.json()["choices"][0]
    assert c["message"]["content"] is None and c["message"]["tool_calls"], c
    assert c["finish_reason"] == ("stop" if choice == NAMED else "tool_calls"), c
    for call in c["message"]["tool_calls"]:
        name, _ = check_call(call)
        if choice == NAMED:
            assert name == "get_weather"
    assert r.json()["usage"]["completion_tokens"] < 40, r.json()["usage"]


@pytest.mark.parametrize("choice", ["required", NAMED], ids=["required", "named"])
def test_forced_call_streamed(default_server, client, model, choice):
    """Streamed: tool_calls deltas that the openai SDK's stream assembles into the same calls,
    no content, the same finish_reason."""
    whole = chat(default_server, tools=TOOLS, tool_choice=choice).json()["choices"][0]
    r = chat(default_server, tools=TOOLS, tool_choice=choice, stream=True)
    events = [e for e in sse_events(r.iter_lines()) if e != "[DONE]"]
    for e in events:
        validate(e, "CreateChatCompletionStreamResponse")
    calls, content, finish = {}, "", None
    for chunk in client.chat.completions.create(model=model, messages=ASK, tools=TOOLS,
                                                tool_choice=choice, temperature=0,
                                                max_tokens=60, stream=True):
        d = chunk.choices[0].delta
        content += d.content or ""
        for tc in d.tool_calls or []:
            cur = calls.setdefault(tc.index, {"id": "", "type": "function",
                                              "function": {"name": "", "arguments": ""}})
            cur["id"] += tc.id or ""
            cur["function"]["name"] += (tc.function.name or "") if tc.function else ""
            cur["function"]["arguments"] += (tc.function.arguments or "") if tc.function else ""
        finish = chunk.choices[0].finish_reason or finish
    assert content == "" and finish == whole["finish_reason"]
    got = [(c["function"]["name"], json.loads(c["function"]["arguments"]))
           for _, c in sorted(calls.items())]
    want = [(c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in whole["message"]["tool_calls"]]
    assert got == want
    for c in calls.values():
        check_call(c)
    # the first delta is OpenAI's: the role, content null; its call carries the id and name
    first = events[0]["choices"][0]["delta"]
    assert first["role"] == "assistant" and first["content"] is None, first
    if choice == NAMED:
        # the arguments stream as they are written (instructor's partial objects need it), in
        # the ids the whole answer gives
        pieces = [tc["function"]["arguments"] for e in events for ch in e["choices"]
                  for tc in ch["delta"].get("tool_calls") or []]
        assert len([p for p in pieces if p]) > 3, pieces
        assert "".join(pieces) == whole["message"]["tool_calls"][0]["function"]["arguments"]
        # (ids as the whole answer makes them: "call_<response id>_<choice>_<call>")
        assert first["tool_calls"][0]["id"] == f"call_{events[0]['id']}_0_0"
        assert first["tool_calls"][0]["function"]["name"] == "get_weather"


def test_required_call_is_held_to_each_tool(default_server):
    """Sampled (several seeds): every call of a required answer names a tool and holds that
    tool's parameters (told apart by the name written first)."""
    for seed in range(4):
        r = chat(default_server, tools=TOOLS, tool_choice="required", temperature=1.0,
                 seed=seed, max_tokens=120)
        assert r.status_code == 200, r.text
        c = r.json()["choices"][0]
        if c["finish_reason"] == "length":
            continue
        for call in c["message"]["tool_calls"]:
            check_call(call)


# ---- tool_choice auto: refused without a parser ----

@pytest.mark.parametrize("extra", [{}, {"tool_choice": "auto"}], ids=["absent", "auto"])
def test_auto_without_a_parser_is_400(default_server, extra):
    r = chat(default_server, tools=TOOLS, **extra)
    assert r.status_code == 400, r.text
    validate(r.json(), "ErrorResponse")
    e = r.json()["error"]
    assert e["param"] == "tool_choice" and "--tool-call-parser" in e["message"], e


def test_tool_choice_none_is_plain_text(default_server):
    r = chat(default_server, tools=TOOLS, tool_choice="none", max_tokens=8)
    plain = chat(default_server, max_tokens=8)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"] == plain.json()["choices"][0]["message"]


# ---- the round trip ----

def test_round_trip_with_the_sdk(client, model):
    """messages.append(resp.choices[0].message), then a tool message: the second request is
    answered (it was a 400: SmolLM2's template concatenates content, and null is no string)."""
    resp = client.chat.completions.create(model=model, messages=ASK, tools=TOOLS,
                                          tool_choice=NAMED, temperature=0, max_tokens=60)
    msg = resp.choices[0].message
    assert msg.content is None and msg.tool_calls
    messages = list(ASK) + [msg, {"role": "tool", "tool_call_id": msg.tool_calls[0].id,
                                  "content": json.dumps({"temperature_c": 18})}]
    again = client.chat.completions.create(model=model, messages=messages, temperature=0,
                                           max_tokens=12)
    assert isinstance(again.choices[0].message.content, str)
    assert again.usage.prompt_tokens > resp.usage.prompt_tokens


def tokenize(server, body):
    r = requests.post(server.url("/tokenize"), json=body, timeout=60)
    return r.status_code, r.json()


CALL = {"id": "abcdefghi", "type": "function",  # 9 characters: Mistral's templates want so
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}


def conversation(assistant, tool):
    """A round trip whose assistant content is assistant and tool content tool ("absent" for
    none)."""
    a = {"role": "assistant", "tool_calls": [CALL]}
    t = {"role": "tool", "tool_call_id": CALL["id"], "name": "get_weather"}
    if assistant != "absent":
        a["content"] = assistant
    if tool != "absent":
        t["content"] = tool
    return [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Weather in"},
                                         {"type": "text", "text": "Paris?"}]},
            a, t, {"role": "user", "content": "Thanks"}]


FORMS = [(None, "sunny"), ("absent", None), ("Let me check.", [{"type": "text", "text": "sun"},
                                                              {"type": "text", "text": "ny"}]),
         ([{"type": "text", "text": "Let me"}, {"type": "text", "text": "check."}], "absent")]


def as_vllm(messages, parts):
    """The messages as vLLM hands them to a template: content a string ("" for null or absent,
    text parts joined with "\\n") or, where the template loops over content, a list of parts;
    a tool message's text a string; tool-call arguments as objects."""
    out = []
    for m in messages:
        m = json.loads(json.dumps(m))
        c = m.get("content")
        texts = [p["text"] for p in c] if isinstance(c, list) else [] if c is None else [c]
        if m["role"] == "tool" or not parts:
            m["content"] = "\n".join(texts)
        else:
            m["content"] = [{"type": "text", "text": t} for t in texts]
        for tc in m.get("tool_calls") or []:
            tc["function"]["arguments"] = json.loads(tc["function"]["arguments"])
        out.append(m)
    return out


PARTS_TEMPLATE = (  # loops over content, as Llama 4's and the vision models' templates do
    "{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}[{{ part['text'] }}]{% endfor %}{% endif %}"
    "{% if message.tool_calls %}{% for tc in message.tool_calls %}<call>{{ tc.function.name }}"
    "{{ tc.function.arguments | tojson }}</call>{% endfor %}{% endif %}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}")

TEMPLATES = sorted(p.name for p in (util.DATA / "chat-templates").glob("*.jinja")) + ["parts"]


def model_with(tmp_path_factory, template):
    if template != "parts":
        return util.model_with_template(tmp_path_factory, template)
    tool = Path(sys.executable).with_name("gguf-new-metadata")
    if not tool.exists():
        pytest.skip("gguf-new-metadata (the gguf package) is not installed")
    d = tmp_path_factory.mktemp("parts")
    (d / "t.jinja").write_text(PARTS_TEMPLATE)
    out = d / "model.gguf"
    subprocess.run([str(tool), str(util.DATA / "models" / "llama-2-tiny-random.gguf"), str(out),
                    "--chat-template-file", str(d / "t.jinja")], check=True, capture_output=True)
    return out


@pytest.mark.parametrize("template", TEMPLATES)
def test_content_forms_match_transformers(tmp_path_factory, template):
    """Each content form, on each template: the prompt's ids are those of transformers'
    rendering of the messages as vLLM hands them over (in the template's content format);
    where transformers raises, the request is a 400."""
    render = pytest.importorskip("transformers.utils.chat_template_utils").render_jinja_template
    src = PARTS_TEMPLATE if template == "parts" else \
        (util.DATA / "chat-templates" / template).read_text()
    parts = template == "parts"
    with Server(model_with(tmp_path_factory, template)) as s:
        seen = []
        for assistant, tool in FORMS:
            msgs = conversation(assistant, tool)
            try:
                text = render([as_vllm(msgs, parts)], chat_template=src, tools=[WEATHER],
                              add_generation_prompt=True, bos_token="<s>",
                              eos_token="</s>")[0][0]
            except Exception:
                text = None
            status, body = tokenize(s, {"messages": msgs, "tools": [WEATHER]})
            if text is None:
                assert status == 400, (assistant, tool, body)
                continue
            assert status == 200, (assistant, tool, body)
            want = tokenize(s, {"prompt": text, "add_special_tokens": False})[1]["tokens"]
            assert body["tokens"] == want, (assistant, tool, text[-200:])
            seen.append(text)
        if parts:  # the template saw lists: each part bracketed
            assert "[Weather in][Paris?]" in seen[0] and "[Let me][check.]" in seen[-1]
        elif seen:  # ... or one string, parts joined with "\n"
            assert "Weather in\nParis?" in seen[0]
