"""Chat template options of vLLM's chat API, against transformers' renderer
(transformers.utils.chat_template_utils.render_jinja_template, what apply_chat_template runs):

- continue_final_message: the prompt ends inside the final assistant message, which the model
  continues (an assistant prefill);
- chat_template_kwargs: more template variables, such as SmolLM3's and Qwen3's enable_thinking.

The prompt's token ids come back through prompt_logprobs (each entry's one key), so they are
compared one by one with the ids of transformers' rendering."""
import pytest
import requests

import util
from server_util import Server, validate

render_jinja_template = pytest.importorskip(
    "transformers.utils.chat_template_utils").render_jinja_template


def prompt_ids(server, body):
    """The prompt token ids of a chat request (its first id is not reported: None) and the
    answer."""
    r = requests.post(server.url("/v1/chat/completions"), timeout=120,
                      json=dict(body, prompt_logprobs=0, max_tokens=body.get("max_tokens", 1)))
    assert r.status_code == 200, r.text
    validate(r.json(), "CreateChatCompletionResponse")
    pl = r.json()["prompt_logprobs"]
    assert len(pl) == r.json()["usage"]["prompt_tokens"]
    return [None] + [int(next(iter(e))) for e in pl[1:]], r.json()


def tokenize(server, text):
    r = requests.post(server.url("/tokenize"), json={"prompt": text,
                                                     "add_special_tokens": False}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def chat_template_of(model):
    from gguf import GGUFReader
    f = GGUFReader(str(model)).fields["tokenizer.chat_template"]
    return bytes(f.parts[f.data[0]]).decode()


CONV = [{"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "The capital of France is"}]


def test_continue_final_message(default_server, default_model):
    """SmolLM2's template: the prompt is transformers' continue_final_message rendering, id for
    id, and the greedy answer is what a completion of that text gives."""
    tmpl = chat_template_of(default_model)
    want_text = render_jinja_template([CONV], chat_template=tmpl, continue_final_message=True,
                                      bos_token="<|im_start|>", eos_token="<|im_end|>")[0][0]
    assert want_text.endswith("The capital of France is")
    want = tokenize(default_server, want_text)
    got, body = prompt_ids(default_server, {"messages": CONV, "continue_final_message": True,
                                            "add_generation_prompt": False, "max_tokens": 6,
                                            "temperature": 0})
    assert got[1:] == want[1:] and len(got) == len(want)
    r = requests.post(default_server.url("/v1/completions"), timeout=120, json={
        "prompt": want, "max_tokens": 6, "temperature": 0})
    assert body["choices"][0]["message"]["content"] == r.json()["choices"][0]["text"]
    # a content given as parts continues from its last text part
    parts = [CONV[0], {"role": "assistant", "content": [
        {"type": "text", "text": "The capital of France is"}]}]
    got_parts, _ = prompt_ids(default_server, {"messages": parts, "continue_final_message": True})
    assert got_parts == got


@pytest.mark.parametrize("body,param", [
    ({"messages": CONV[:1], "continue_final_message": True}, "continue_final_message"),
    ({"messages": CONV, "continue_final_message": True, "add_generation_prompt": True},
     "continue_final_message"),
    ({"messages": CONV, "chat_template_kwargs": [1]}, "chat_template_kwargs"),
    ({"messages": CONV, "chat_template_kwargs": {"messages": []}}, "chat_template_kwargs"),
    ({"messages": CONV, "continue_final_message": "yes"}, "continue_final_message"),
    ({"messages": CONV, "continue_final_message": True,
      "chat_template_kwargs": {"add_generation_prompt": True}}, "continue_final_message"),
])
def test_refused_template_options(default_server, body, param):
    r = requests.post(default_server.url("/v1/chat/completions"), json=dict(body, max_tokens=1),
                      timeout=60)
    assert r.status_code == 400, r.text
    validate(r.json(), "ErrorResponse")
    assert r.json()["error"]["param"] == param


def test_chat_template_kwargs(tmp_path_factory):
    """SmolLM3's template on the random model: enable_thinking false renders "/no_think" and an
    empty think block, as transformers renders it with that variable; the default differs."""
    tmpl_path = util.DATA / "chat-templates" / "HuggingFaceTB-SmolLM3-3B.jinja"
    model = util.model_with_template(tmp_path_factory, tmpl_path.name)
    msgs = CONV[:1]
    with Server(model) as s:
        for kwargs in ({"enable_thinking": False}, {}):
            want_text = render_jinja_template(
                [msgs], chat_template=tmpl_path.read_text(), add_generation_prompt=True,
                bos_token="<s>", eos_token="</s>", **kwargs)[0][0]
            want = tokenize(s, want_text)
            got, _ = prompt_ids(s, {"messages": msgs, "chat_template_kwargs": kwargs})
            assert got[1:] == want[1:] and len(got) == len(want), kwargs
            if kwargs:
                assert "/no_think" in want_text
                no_think = got
        assert got != no_think


@pytest.mark.parametrize("template", ["meta-llama-Llama-3.2-3B-Instruct.jinja",
                                      "google-gemma-2-2b-it.jinja",
                                      "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja"])
def test_continue_final_message_edges(tmp_path_factory, template):
    """Templates that trim the content (Llama 3.x, Gemma) or rewrite it (R1 drops what precedes
    "</think>"): the cut strips what Python's str.rstrip() strips (U+00A0 too), and a final
    message the rendering does not hold is refused, as transformers raises (an audit found
    both)."""
    model = util.model_with_template(tmp_path_factory, template)
    src = (util.DATA / "chat-templates" / template).read_text()
    with Server(model) as s:
        for last in ["x\u00a0", "Result: ", "a\x0c", "<think>hmm</think>Result:"]:
            msgs = [CONV[0], {"role": "assistant", "content": last}]
            try:
                want_text = render_jinja_template([msgs], chat_template=src,
                                                  continue_final_message=True,
                                                  bos_token="<s>", eos_token="</s>")[0][0]
            except ValueError:
                want_text = None
            r = requests.post(s.url("/v1/chat/completions"), timeout=60, json={
                "messages": msgs, "continue_final_message": True, "max_tokens": 1,
                "prompt_logprobs": 0})
            if want_text is None:
                assert r.status_code == 400, (last, r.text)
                continue
            assert r.status_code == 200, (last, r.text)
            got = [int(next(iter(e))) for e in r.json()["prompt_logprobs"][1:]]
            assert got == tokenize(s, want_text)[1:], (last, want_text[-30:])


def test_tokenize_chat(default_server):
    """/tokenize with messages (vLLM's chat form): the ids a chat completion of them takes,
    template options included; bad messages get the chat endpoint's 400."""
    for body in ({"messages": CONV[:1]}, {"messages": CONV, "continue_final_message": True},
                 {"messages": CONV[:1], "add_generation_prompt": False}):
        r = requests.post(default_server.url("/tokenize"), json=body, timeout=60)
        assert r.status_code == 200, r.text
        toks = r.json()["tokens"]
        assert r.json()["count"] == len(toks)
        ids, _ = prompt_ids(default_server, body)
        assert toks[1:] == ids[1:] and len(toks) == len(ids), body
    r = requests.post(default_server.url("/tokenize"), json={"messages": [{"role": "user"}]},
                      timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"].startswith("messages"), r.text
    r = requests.post(default_server.url("/tokenize"), json={"messages": CONV[:1],
                                                             "continue_final_message": True},
                      timeout=60)
    assert r.status_code == 400, r.text


def test_tokenize_chat_options(default_server):
    """"messages": null is the prompt form; add_special_tokens on a chat adds what the model's
    metadata adds for a text (nothing for SmolLM2), off by default as in vLLM."""
    url = default_server.url("/tokenize")
    r = requests.post(url, json={"prompt": "hi", "messages": None}, timeout=60)
    assert r.status_code == 200 and r.json()["tokens"] == tokenize(default_server, "hi"), r.text
    a = requests.post(url, json={"messages": CONV[:1]}, timeout=60).json()["tokens"]
    b = requests.post(url, json={"messages": CONV[:1], "add_special_tokens": True},
                      timeout=60).json()["tokens"]
    c = requests.post(url, json={"prompt": "x", "add_special_tokens": True}, timeout=60)
    plain = tokenize(default_server, "x")
    assert b[len(b) - len(a):] == a and len(b) - len(a) == len(c.json()["tokens"]) - len(plain)
    r = requests.post(url, json={"messages": CONV[:1], "add_special_tokens": 1}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "add_special_tokens"
