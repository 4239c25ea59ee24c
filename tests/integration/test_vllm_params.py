"""vLLM's request extensions (stop_token_ids, include_stop_str_in_output, skip_special_tokens,
allowed_token_ids, truncate_prompt_tokens, guided_json, guided_choice, structured_outputs; the
regular expressions have their own tests, test_regex.py): each
is honoured, checked against a reference -- the engine's own greedy ids from `pagoda generate`,
the same request in its plain OpenAI form, the texts of the tokens allowed -- or refused by name
with a 400 (grammar constraints, bad_words, beam search), never ignored: a client
written for vLLM must not get an unconstrained answer it did not ask for."""
import json

import pytest
import requests

import util
from server_util import Server, sse_events, validate

RANDOM_LLAMA = util.DATA / "models" / "llama-2-tiny-random.gguf"
PROMPT = "The capital of France is"


post = util.post


def ok(server, path, body, schema=None):
    r = post(server, path, body)
    assert r.status_code == 200, r.text
    validate(r.json(), schema or ("CreateChatCompletionResponse" if "messages" in body
                                  else "CreateCompletionResponse"))
    return r.json()


def tokens(server, text):
    return post(server, "/tokenize", {"prompt": text, "add_special_tokens": False}).json()["tokens"]


def detok(server, ids):
    return post(server, "/detokenize", {"tokens": ids}).json()["prompt"]


def greedy_ids(model, ids, n):
    """The engine's own greedy continuation of ids (pagoda generate, unbatched)."""
    p = util.run_pagoda("generate", "-m", model, "--ids", " ".join(map(str, ids)), "-n", n,
                        "--temperature", "0", "--ignore-eos", "--print-ids")
    return [int(x) for x in p.stdout.split()]


def streamed_text(server, body, stop_reason=None):
    r = requests.post(server.url("/v1/completions"), json=dict(body, stream=True), stream=True,
                      timeout=300)
    assert r.status_code == 200, r.text
    text, finish, reason = "", None, []
    for ev in sse_events(r.iter_lines(decode_unicode=True)):
        if ev == "[DONE]":
            break
        if ev["choices"] and ev["choices"][0]["finish_reason"]:  # (the schema's is not null)
            validate(ev, "CreateCompletionResponse")
        for c in ev["choices"]:
            text += c["text"]
            finish = c["finish_reason"] or finish
            if c["finish_reason"]:
                reason.append(c["stop_reason"])
            else:
                assert c["stop_reason"] is None  # in every chunk, as vLLM sends it
    assert reason == [stop_reason], reason  # set once, in the last chunk
    return text, finish


def test_stop_token_ids(smol):
    ids = tokens(smol, PROMPT)
    ref = greedy_ids(util.DEFAULT_MODEL, ids, 12)
    k = next(i for i in range(3, 12) if ref[i] not in ref[:i])  # a token not seen before it
    base = {"prompt": ids, "max_tokens": 12, "temperature": 0, "stop_token_ids": [ref[k]]}
    c = ok(smol, "/v1/completions", base)
    # the output ends at the stop token, without its text, which counts as generated (vLLM)
    assert c["choices"][0]["text"] == detok(smol, ref[:k])
    assert c["choices"][0]["finish_reason"] == "stop"
    assert c["usage"]["completion_tokens"] == k + 1
    assert c["choices"][0]["stop_reason"] == ref[k]  # vLLM's: the stop token's id
    assert streamed_text(smol, base, ref[k]) == (detok(smol, ref[:k]), "stop")
    # include_stop_str_in_output keeps its text
    c = ok(smol, "/v1/completions", dict(base, include_stop_str_in_output=True))
    assert c["choices"][0]["text"] == detok(smol, ref[:k + 1])
    # while output < min_tokens the stop token cannot be sampled: the answer departs from ref
    # at position k and runs past it
    c = ok(smol, "/v1/completions", dict(base, min_tokens=k + 2))
    assert c["usage"]["completion_tokens"] >= k + 2
    assert not c["choices"][0]["text"].startswith(detok(smol, ref[:k + 1]))


def test_include_stop_str_in_output(smol):
    ids = tokens(smol, PROMPT)
    full = detok(smol, greedy_ids(util.DEFAULT_MODEL, ids, 16))
    stop = full.strip().split()[1]  # the answer's second word
    at = full.index(stop)
    base = {"prompt": ids, "max_tokens": 16, "temperature": 0, "stop": ["zzz", stop]}
    c = ok(smol, "/v1/completions", base)["choices"][0]
    assert c["text"] == full[:at] and c["stop_reason"] == stop  # vLLM's: the string matched
    c = ok(smol, "/v1/completions", dict(base, include_stop_str_in_output=True))
    assert c["choices"][0]["text"] == full[:at + len(stop)]
    assert streamed_text(smol, dict(base, include_stop_str_in_output=True), stop) == \
        (full[:at + len(stop)], "stop")
    # ended by max_tokens, or by the end-of-generation token: null
    c = ok(smol, "/v1/completions", dict(base, stop=None, max_tokens=3))["choices"][0]
    assert c["finish_reason"] == "length" and c["stop_reason"] is None


def test_skip_special_tokens(smol):
    """The end-of-turn token ends the answer; with skip_special_tokens false and
    include_stop_str_in_output its text is part of it, as vLLM returns it."""
    body = {"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 64,
            "temperature": 0}
    plain = ok(smol, "/v1/chat/completions", body)["choices"][0]
    assert plain["finish_reason"] == "stop"  # ended by <|im_end|>
    assert plain["stop_reason"] is None
    c = ok(smol, "/v1/chat/completions",
           dict(body, skip_special_tokens=False, include_stop_str_in_output=True))["choices"][0]
    assert c["message"]["content"] == plain["message"]["content"] + "<|im_end|>"
    c = ok(smol, "/v1/chat/completions", dict(body, skip_special_tokens=False))["choices"][0]
    assert c["message"]["content"] == plain["message"]["content"]


def test_allowed_token_ids(smol):
    allowed = tokens(smol, " the of and a")
    texts = {detok(smol, [t]) for t in allowed}
    c = ok(smol, "/v1/completions", {"prompt": PROMPT, "max_tokens": 10, "temperature": 0.8,
                                     "seed": 1, "logprobs": 0, "allowed_token_ids": allowed})
    lp = c["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == 10 and set(lp["tokens"]) <= texts, (lp["tokens"], texts)
    # greedy among one token: that token every time
    c = ok(smol, "/v1/completions", {"prompt": PROMPT, "max_tokens": 4, "temperature": 0,
                                     "allowed_token_ids": allowed[:1]})
    assert c["choices"][0]["text"] == detok(smol, allowed[:1]) * 4


@pytest.mark.parametrize("choices", [["yes", "no", "maybe not"], ["Pos", "Positive", "Neg"]])
def test_guided_choice_sampled(rnd, choices):
    """A random-weight model samples from all 32,000 tokens: constrained, every answer is one of
    the choices (a choice that another continues, "Pos", included); unconstrained, none is."""
    base = {"prompt": "Hello", "max_tokens": 16, "n": 8, "temperature": 1.0}
    seen = set()
    for seed in range(3):
        c = ok(rnd, "/v1/completions", dict(base, seed=seed, guided_choice=choices))
        for ch in c["choices"]:
            assert ch["text"] in choices and ch["finish_reason"] == "stop", ch
            seen.add(ch["text"])
        free = ok(rnd, "/v1/completions", dict(base, seed=seed))
        assert not any(ch["text"] in choices for ch in free["choices"])
    assert len(seen) >= 2  # the choice is sampled, not fixed
    text, finish = streamed_text(rnd, dict(base, n=1, seed=7, guided_choice=choices))
    assert text in choices and finish == "stop"


def test_guided_choice_cut_by_max_tokens(rnd):
    long = "an answer much longer than one token " * 4
    c = ok(rnd, "/v1/completions", {"prompt": "Hello", "max_tokens": 2,
                                    "guided_choice": [long]})["choices"][0]
    assert c["finish_reason"] == "length" and long.startswith(c["text"]) and c["text"]


def test_structured_outputs_choice_chat(smol):
    body = {"messages": [{"role": "user", "content": "Is the sky blue? Answer yes or no."}],
            "max_tokens": 8, "temperature": 0}
    for extra in ({"structured_outputs": {"choice": ["yes", "no"]}},
                  {"guided_choice": ["yes", "no"]}):
        c = ok(smol, "/v1/chat/completions", dict(body, **extra))["choices"][0]
        assert c["message"]["content"] in ("yes", "no") and c["finish_reason"] == "stop", c


SCHEMA = {"type": "object", "properties": {"name": {"type": "string"},
                                           "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


def test_guided_json_is_response_format_json_schema(smol):
    """guided_json (object or string), structured_outputs.json and llama.cpp's json_schema hold
    the answer to the schema exactly as response_format json_schema does: the same greedy
    text."""
    body = {"messages": [{"role": "user", "content": "Describe a person as JSON."}],
            "max_tokens": 64, "temperature": 0}
    ref = ok(smol, "/v1/chat/completions", dict(body, response_format={
        "type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}))
    want = ref["choices"][0]["message"]["content"]
    assert set(json.loads(want)) == {"name", "age"}
    for extra in ({"guided_json": SCHEMA}, {"guided_json": json.dumps(SCHEMA)},
                  {"structured_outputs": {"json": SCHEMA}},
                  {"json_schema": SCHEMA}):  # (llama.cpp's server field)
        c = ok(smol, "/v1/chat/completions", dict(body, **extra))
        assert c["choices"][0]["message"]["content"] == want, extra
    ref = ok(smol, "/v1/chat/completions", dict(body, response_format={"type": "json_object"}))
    c = ok(smol, "/v1/chat/completions", dict(body, structured_outputs={"json_object": True}))
    assert c["choices"][0]["message"] == ref["choices"][0]["message"]


def test_truncate_prompt_tokens(smol):
    ids = tokens(smol, "One two three four five six seven eight nine ten. " + PROMPT)
    base = {"max_tokens": 8, "temperature": 0}
    want = ok(smol, "/v1/completions", dict(base, prompt=ids[-6:]))["choices"][0]["text"]
    c = ok(smol, "/v1/completions", dict(base, prompt=ids, truncate_prompt_tokens=6))
    assert c["usage"]["prompt_tokens"] == 6 and c["choices"][0]["text"] == want
    # -1: as much as the context holds (all of this prompt)
    c = ok(smol, "/v1/completions", dict(base, prompt=ids, truncate_prompt_tokens=-1))
    assert c["usage"]["prompt_tokens"] == len(ids)
    # echo shows the prompt that ran
    c = ok(smol, "/v1/completions", dict(base, prompt=ids, truncate_prompt_tokens=6, echo=True))
    assert c["choices"][0]["text"] == detok(smol, ids[-6:]) + want


@pytest.mark.parametrize("extra,param", [
    ({"guided_grammar": "root ::= a"}, "guided_grammar"),
    ({"structured_outputs": {"structural_tag": "{}"}}, "structured_outputs"),
    ({"structured_outputs": {"grammar": "root ::= \"a"}}, "structured_outputs.grammar"),
    ({"guided_grammar": "root ::= \"a\"", "min_tokens": 2}, "min_tokens"),
    ({"bad_words": ["Paris"]}, "bad_words"),
    ({"use_beam_search": True}, "use_beam_search"),
    ({"length_penalty": 0.5}, "length_penalty"),
    ({"guided_choice": ["a"], "guided_json": SCHEMA}, None),
    ({"json_schema": "not a schema"}, "json_schema"),
    ({"json_schema": SCHEMA, "grammar": 'root ::= "a"'}, None),
    ({"guided_choice": ["a"], "response_format": {"type": "json_object"}}, None),
    ({"guided_choice": []}, "guided_choice"),
    ({"guided_choice": ["a", ""]}, "guided_choice"),
    ({"guided_choice": "a"}, "guided_choice"),
    ({"guided_json": "not a schema"}, "guided_json"),
    ({"guided_json": {"type": "object", "allOf": [{"type": "object"}]}}, "guided_json"),
    ({"stop_token_ids": [49152]}, "stop_token_ids"),
    ({"stop_token_ids": "2"}, "stop_token_ids"),
    ({"allowed_token_ids": []}, "allowed_token_ids"),
    ({"allowed_token_ids": [-1]}, "allowed_token_ids"),
    ({"truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
    ({"skip_special_tokens": "no"}, "skip_special_tokens"),
    ({"structured_outputs": {"json_object": 5}}, "structured_outputs"),
    ({"guided_choice": ["a", "b"], "min_tokens": 2}, "min_tokens"),
    ({"guided_regex": "a+", "min_tokens": 2}, "min_tokens"),
])
def test_refused(smol, extra, param):
    r = post(smol, "/v1/completions", dict({"prompt": PROMPT, "max_tokens": 4}, **extra))
    assert r.status_code == 400, r.text
    validate(r.json(), "ErrorResponse")
    assert r.json()["error"]["param"] == param, r.json()


def test_contradictory_masks_are_an_error(smol):
    """allowed_token_ids that JSON output or the choices cannot use leave no token: the request
    fails (an error object naming the constraints), not a "stop" with an empty or invalid
    answer (an audit found the sampler's fallback token taken as end-of-generation)."""
    allowed = tokens(smol, " the of")
    for extra in ({"response_format": {"type": "json_object"}}, {"guided_choice": ["yes"]}):
        r = post(smol, "/v1/completions", dict({"prompt": PROMPT, "max_tokens": 4,
                                               "allowed_token_ids": allowed}, **extra))
        assert r.status_code == 500, r.text
        validate(r.json(), "ErrorResponse")
        assert "constraints" in r.json()["error"]["message"], r.json()


def test_batch_lines_take_choices_regex_and_stop_ids(tmp_path):
    """`pagoda batch` input lines take guided_choice, guided_regex and stop_token_ids too (an
    offline classification run): the random model's sampled answers are choices or whole
    matches, and a bad regex is that line's error while the others run."""
    import regex
    from test_engine import run_pagoda
    model = util.DATA / "models" / "llama-2-tiny-random.gguf"
    labels = ["positive", "negative", "neutral"]
    reqs = [{"id": i, "prompt": "Review %d:" % i, "max_tokens": 12, "temperature": 1.0,
             "seed": i, "guided_choice": labels} for i in range(6)]
    reqs += [{"id": 10 + i, "prompt": "Code:", "max_tokens": 8, "temperature": 1.0, "seed": i,
              "guided_regex": "[A-Z]{2}-\\d{3}"} for i in range(4)]
    greedy = {"prompt": "x", "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    reqs += [{"id": 20, "prompt": "x", "guided_regex": "a(?=b)"}, dict(greedy, id=21)]
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in reqs))
    run_pagoda("batch", "-m", model, "--input", inp, "--output", out, "--no-progress")
    res = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert all(res[i]["text"] in labels for i in range(6)), [res[i] for i in range(6)]
    assert all(regex.fullmatch("[A-Z]{2}-\\d{3}", res[10 + i]["text"]) for i in range(4))
    assert "regular expression" in res[20]["error"]["message"], res[20]
    # the same greedy line with its third token as a stop token: the first two, then stop
    ids = res[21]["token_ids"]
    k = next(i for i in range(2, 8) if ids[i] not in ids[:i])
    inp.write_text(json.dumps(dict(greedy, id=22, stop_token_ids=[ids[k]])) + "\n")
    run_pagoda("batch", "-m", model, "--input", inp, "--output", out, "--no-progress")
    r = json.loads(out.read_text())
    assert r["token_ids"][:k] == ids[:k] and r["finish_reason"] == "stop", (r, ids)
    assert len(r["token_ids"]) == k + 1
