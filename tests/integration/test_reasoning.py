"""--reasoning-parser: a thinking model's <think>...</think> comes back as
message.reasoning_content (streamed as reasoning_content deltas), the rest as content.

The tiny random Llama (32k vocabulary) carries a real chat template (DeepSeek-R1-Distill's,
whose generation prompt opens "<think>\\n", or SmolLM3's, whose model opens it). Its answers are
random text pulled towards the tags' tokens. The same requests go to a server without the
parser:
its raw answer, split by the rule below (vLLM's deepseek_r1 and qwen3 parsers), must equal what
the parsing server returns, whole and streamed; tool calls still parse from the content."""
import json
import subprocess

import pytest
import requests

import util
from server_util import Server, sse_events, validate

RANDOM_LLAMA = util.DATA / "models" / "llama-2-tiny-random.gguf"
CHAT = [{"role": "user", "content": "Why is the sky blue?"}]


def split(fmt, x):
    """(reasoning, content) of raw answer x: a leading <think> (after whitespace) is dropped;
    deepseek_r1 thinks from the start, qwen3 only after that <think>; thinking ends at the first
    </think>. None where a part is absent or (content) empty."""
    s = x.lstrip(" \n\r\t")
    opens = s.startswith("<think>")
    if not opens and fmt == "qwen3":
        return None, x
    body = s[len("<think>"):] if opens else x
    if "</think>" not in body:
        return body, None
    r, _, c = body.partition("</think>")
    return r, c or None


def tag_bias(server, tags, weight):
    """A bias towards the tokens of the tags."""
    ids = set()
    for t in tags:
        r = requests.post(server.url("/tokenize"), json={"prompt": t, "add_special_tokens": False},
                          timeout=30)
        ids |= set(r.json()["tokens"])
    return {str(i): weight for i in ids}


TAGGED = {"type": "object", "properties": {"a": {"const": "x </think> y <think> z"}},
          "required": ["a"], "additionalProperties": False}


def ask(seed, bias):
    """Random text pulled towards the tags' tokens (+12 each: over 160 tokens most answers hold
    "</think>", 4 tokens in the 32k vocabulary)."""
    return {"logit_bias": bias}


def as_json():
    return {"response_format": {"type": "json_schema",
                                "json_schema": {"name": "t", "schema": TAGGED}}}


def chat(server, seed, stream=False, **extra):
    body = {"messages": CHAT, "max_tokens": 160, "temperature": 1.0, "seed": seed, "n": 4,
            "stream": stream}
    body.update(extra)
    r = requests.post(server.url("/v1/chat/completions"), json=body, timeout=120, stream=stream)
    assert r.status_code == 200, r.text
    if not stream:
        validate(r.json(), "CreateChatCompletionResponse")
        return [c["message"] for c in sorted(r.json()["choices"], key=lambda c: c["index"])]
    msgs = {}
    for ev in sse_events(r.iter_lines()):
        if ev == "[DONE]":
            break
        validate(ev, "CreateChatCompletionStreamResponse")
        for ch in ev["choices"]:
            m = msgs.setdefault(ch["index"], {"content": None, "reasoning_content": None})
            for k in ("content", "reasoning_content"):
                if ch["delta"].get(k):
                    m[k] = (m[k] or "") + ch["delta"][k]
    return [msgs[i] for i in sorted(msgs)]


@pytest.mark.parametrize("template,fmt,tags", [
    # the template opens the thinking: a pull towards "</think>" closes it in most answers
    ("deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja", "deepseek_r1", ["</think>"]),
    # the model must open it: answers rarely start with "<think>" exactly (checked: the split
    # agrees with the raw answer either way; the thinking path is the one above's)
    ("HuggingFaceTB-SmolLM3-3B.jinja", "qwen3", ["<think>", "</think>"]),
])
def test_reasoning_split_matches_raw_answer(tmp_path_factory, template, fmt, tags):
    model = util.model_with_template(tmp_path_factory, template)
    raw, seen = {}, {"thinking": 0, "content": 0, "both": 0}
    with Server(model) as s:
        bias = tag_bias(s, tags, 12)
        for seed in range(4):
            raw[seed] = [m["content"] for m in chat(s, seed, **ask(seed, bias))]
            assert all("reasoning_content" not in m for m in chat(s, seed, **ask(seed, bias)))
    with Server(model, "--reasoning-parser", fmt) as s:
        for seed in range(4):
            whole = chat(s, seed, **ask(seed, bias))
            streamed = chat(s, seed, stream=True, **ask(seed, bias))
            for x, w, st in zip(raw[seed], whole, streamed):
                r, c = split(fmt, x)
                assert (w["reasoning_content"], w["content"]) == (r, c), (x, w)
                # streamed: the deltas add up to the same parts ("" and None both: nothing)
                assert (st["reasoning_content"] or None, st["content"]) == (r or None, c), (x, st)
                seen["thinking"] += r is not None
                seen["content"] += c is not None
                seen["both"] += r is not None and c is not None
    print(fmt, seen)
    assert seen["content"] >= 2, seen
    if fmt == "deepseek_r1":
        assert seen["both"] >= 2 and seen["thinking"] > seen["both"], seen


def test_reasoning_parser_is_checked():
    p = subprocess.run([str(util.BUILD / "pagoda"), "serve", "-m", str(RANDOM_LLAMA),
                        "--reasoning-parser", "r2d2", "--port", "0"], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode != 0 and "--reasoning-parser" in p.stderr


def test_constrained_answers_think_first(tmp_path_factory):
    """Under deepseek_r1 a JSON answer, a grammar's or a required tool call thinks first, as
    vLLM applies a grammar only once the reasoning has ended: until "</think>" sampling is
    free -- the same draws as the unconstrained answer of the same seed, so its reasoning is
    that answer's -- and the content after it holds to the schema or the grammar."""
    from test_json_output import TOOL_W
    model = util.model_with_template(tmp_path_factory,
                                     "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja")
    const = TAGGED["properties"]["a"]["const"]
    with Server(model, "--reasoning-parser", "deepseek_r1", "--tool-call-parser", "hermes") as s:
        bias = tag_bias(s, ["</think>"], 12)
        n_json = 0
        for seed in range(3):
            free = chat(s, seed, **ask(seed, bias))
            # (room for the object after a thinking part of up to 160 tokens)
            for m, f in zip(chat(s, seed, **ask(seed, bias), **as_json(), max_tokens=400), free):
                if f["content"] is None:  # the free answer never closed its thinking
                    continue
                assert m["reasoning_content"] == f["reasoning_content"], (m, f)
                assert json.loads(m["content"])["a"] == const, m
                n_json += 1
        assert n_json >= 4
        # a grammar waits for the thinking alike
        n_gram = 0
        for seed in range(3):
            free = chat(s, seed, **ask(seed, bias))
            g = chat(s, seed, **ask(seed, bias), guided_grammar='root ::= ("yes" | "no") "."',
                     max_tokens=200)
            for m, f in zip(g, free):
                if f["content"] is None:
                    continue
                assert m["reasoning_content"] == f["reasoning_content"], (m, f)
                assert m["content"] in ("yes.", "no."), m
                n_gram += 1
        assert n_gram >= 4
        r = requests.post(s.url("/v1/chat/completions"), timeout=120, json={
            "messages": CHAT, "max_tokens": 200, "tools": [TOOL_W], "tool_choice": "required",
            "seed": 1, "temperature": 1.0, "n": 4, **ask(1, bias)})
        assert r.status_code == 200, r.text
        calls = [c for c in r.json()["choices"] if c["finish_reason"] == "tool_calls"]
        assert calls and all(c["message"]["tool_calls"] and c["message"]["reasoning_content"]
                             for c in calls), r.json()


def test_qwen3_answer_constrained_from_the_start_without_a_think_token(tmp_path_factory):
    """qwen3: thinking is optional and opens with the "<think>" token; in a vocabulary without
    such a token (the random Llama's spells it in pieces) a JSON answer is constrained from its
    first token: all content, no reasoning."""
    model = util.model_with_template(tmp_path_factory, "HuggingFaceTB-SmolLM3-3B.jinja")
    with Server(model, "--reasoning-parser", "qwen3") as s:
        bias = tag_bias(s, ["<think>", "</think>"], 12)
        for m in chat(s, 0, **ask(0, bias), **as_json(), max_tokens=400):
            assert m["reasoning_content"] is None, m
            assert json.loads(m["content"])["a"] == TAGGED["properties"]["a"]["const"], m


def test_prompt_that_closes_the_thinking_constrains_from_the_start(tmp_path_factory):
    """A template that closes the thinking itself (SmolLM3's with enable_thinking false ends the
    prompt with "<think>\\n\\n</think>\\n"): under deepseek_r1, which otherwise thinks from the
    start, a JSON answer is held from its first token (an audit found it waiting for a
    "</think>" that never comes, the answer left free). With no "</think>" in the answer,
    deepseek_r1 returns it all as reasoning, as vLLM's parser does."""
    model = util.model_with_template(tmp_path_factory, "HuggingFaceTB-SmolLM3-3B.jinja")
    schema = {"type": "object", "properties": {"a": {"const": "ok"}}, "required": ["a"],
              "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}}
    with Server(model, "--reasoning-parser", "deepseek_r1") as s:
        for m in chat(s, 0, chat_template_kwargs={"enable_thinking": False},
                      response_format=fmt, max_tokens=100):
            whole = (m["reasoning_content"] or "") + (m["content"] or "")
            assert json.loads(whole) == {"a": "ok"}, m


def test_reasoning_tokens_counted(tmp_path_factory):
    """usage.completion_tokens_details.reasoning_tokens (OpenAI's field, and the Responses
    API's output_tokens_details) counts the generated tokens up to the one that completes
    "</think>" (all of them when it never comes): the reference is the same seeded answer's
    tokens, read from its logprobs' bytes on a server without the parser."""
    model = util.model_with_template(tmp_path_factory,
                                     "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja")
    body = lambda seed, bias: {"messages": CHAT, "max_tokens": 160, "temperature": 1.0,
                               "seed": seed, "logit_bias": bias}
    want = {}
    with Server(model) as s:
        bias = tag_bias(s, ["</think>"], 12)
        for seed in range(6):
            r = requests.post(s.url("/v1/chat/completions"), timeout=120,
                              json={**body(seed, bias), "logprobs": True})
            toks = r.json()["choices"][0]["logprobs"]["content"]
            text, k = b"", len(toks)
            for i, t in enumerate(toks):
                text += bytes(t["bytes"])
                if b"</think>" in text:
                    k = i + 1
                    break
            want[seed] = k
    assert len(set(want.values())) > 1, want  # some answers close the thinking, some do not
    with Server(model, "--reasoning-parser", "deepseek_r1") as s:
        for seed in range(6):
            r = requests.post(s.url("/v1/chat/completions"), json=body(seed, bias), timeout=120)
            u = r.json()["usage"]
            assert u["completion_tokens_details"]["reasoning_tokens"] == want[seed], (seed, u)
            with requests.post(s.url("/v1/chat/completions"), stream=True, timeout=120,
                               json={**body(seed, bias), "stream": True,
                                     "stream_options": {"include_usage": True}}) as r:
                evs = [e for e in sse_events(r.iter_lines()) if e != "[DONE]"]
            assert evs[-1]["usage"]["completion_tokens_details"]["reasoning_tokens"] == \
                want[seed]
            r = requests.post(s.url("/v1/responses"), timeout=120, json={
                "input": CHAT[0]["content"], "max_output_tokens": 60, "temperature": 1.0})
            assert r.status_code == 200, r.text
            assert "reasoning_tokens" in r.json()["usage"]["output_tokens_details"]
