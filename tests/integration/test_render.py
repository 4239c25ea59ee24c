"""vLLM's render endpoints (issue 36; the llm-d endpoint picker tokenizes through them):
POST /v1/chat/completions/render and /v1/completions/render answer what the request would be
prefilled with -- vLLM's GenerateRequest (request_id, token_ids, features, sampling_params) --
without generating. The token ids must be the ones the request itself is prefilled with: the
reference is the same request's usage.prompt_tokens and /tokenize (checked against HF tokenizers
and transformers' chat templates elsewhere), and the render must refuse what the request would
refuse (a prompt past the context)."""
import pytest
import requests

import util
from server_util import Server


@pytest.fixture(scope="module")
def server():
    s = Server(util.DEFAULT_MODEL)
    s.start()
    yield s
    s.stop()


def post(server, path, body):
    return requests.post(server.url(path), json=body, timeout=60)


def test_chat_render_is_the_prefilled_prompt(server):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello!"}]
    r = post(server, "/v1/chat/completions/render",
             {"messages": msgs, "max_tokens": 5, "temperature": 0.5, "stop": ["x"], "seed": 7})
    assert r.status_code == 200, r.text
    g = r.json()
    assert set(g) >= {"request_id", "token_ids", "features", "sampling_params"}, g
    assert g["request_id"].startswith("chatcmpl-") and g["features"] is None
    tok = post(server, "/tokenize", {"messages": msgs}).json()["tokens"]
    assert g["token_ids"] == tok
    sp = g["sampling_params"]
    assert sp["max_tokens"] == 5 and sp["temperature"] == 0.5 and sp["stop"] == ["x"]
    assert sp["seed"] == 7
    done = post(server, "/v1/chat/completions", {"messages": msgs, "max_tokens": 1}).json()
    assert done["usage"]["prompt_tokens"] == len(g["token_ids"])


def test_completions_render_one_per_prompt(server):
    prompts = ["Once upon a time", "The capital of France is"]
    r = post(server, "/v1/completions/render", {"prompt": prompts})
    assert r.status_code == 200, r.text
    out = r.json()
    assert isinstance(out, list) and len(out) == 2, out
    for p, g in zip(prompts, out):
        assert g["token_ids"] == post(server, "/tokenize", {"prompt": p}).json()["tokens"]
        assert g["sampling_params"]["max_tokens"] == 16  # the completions default
    ids = post(server, "/v1/completions/render", {"prompt": [5, 6, 7]}).json()
    assert ids[0]["token_ids"] == [5, 6, 7]


def test_render_refuses_what_the_request_would(server):
    long = "word " * 9000  # past the 8,192-token context with the default max_tokens
    for path, body in (("/v1/completions/render", {"prompt": long}),
                       ("/v1/completions", {"prompt": long})):
        r = post(server, path, body)
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", \
            (path, r.text)
    r = post(server, "/v1/chat/completions/render", {"messages": "not a list"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages", r.text
    assert requests.get(server.url("/v1/completions/render"), timeout=10).status_code == 405


def test_cache_config_info(server):
    """vLLM's cache_config_info (the llm-d endpoint picker reads block_size and num_gpu_blocks
    from it), agreeing with /server_info and the KV pool's gauge."""
    import re
    text = requests.get(server.url("/metrics"), timeout=10).text
    m = re.search(r'^pagoda:cache_config_info\{([^}]*)\} 1$', text, re.M)
    assert m, text[:2000]
    labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
    info = requests.get(server.url("/server_info"), timeout=10).json()
    assert int(labels["block_size"]) == info["page_size"] == 16, labels
    blocks = re.search(r'^pagoda:kv_cache_blocks_total\{[^}]*\} (\d+)', text, re.M)
    assert blocks and int(labels["num_gpu_blocks"]) == int(blocks.group(1)), labels
    assert int(labels["num_gpu_blocks"]) * 16 == info["max_total_num_tokens"]
    assert labels["cache_dtype"] == "f16" and labels["enable_prefix_caching"] == "True", labels
