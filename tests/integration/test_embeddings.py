"""/v1/embeddings: the last prompt token's final hidden state (after the model's final norm),
L2-normalized (last-token pooling, as Qwen3-Embedding and other decoder embedding models pool),
against transformers' own hidden states of the tiny random Qwen3; the OpenAI response schema;
base64 encoding; errors; and equality with each input run alone while other work shares the
engine's steps."""
import base64
import concurrent.futures
import struct

import numpy as np
import pytest
import requests
import torch

from server_util import Server, validate

IDS = [[151, 2, 9000, 77, 31337, 5, 123], [42], list(range(1000, 1100))]


@pytest.fixture(scope="module")
def model_dir(tiny_models):
    return tiny_models["qwen3"]["hf"]


@pytest.fixture(scope="module")
def server(model_dir):
    # F32 KV, the reference option: the embeddings are held to transformers' at 1e-5
    s = Server(model_dir, "--kv-dtype", "f32")
    s.start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def reference(model_dir):
    from transformers import AutoModel
    m = AutoModel.from_pretrained(model_dir, dtype=torch.float32).eval()

    def embed(ids):
        with torch.no_grad():
            h = m(torch.tensor([ids])).last_hidden_state[0, -1].double().numpy()
        return h / np.linalg.norm(h)
    return embed


def post(server, body, status=200):
    r = requests.post(server.url("/v1/embeddings"), json=body, timeout=120)
    assert r.status_code == status, r.text
    return r.json()


def test_against_transformers(server, reference):
    j = post(server, {"input": IDS})
    validate(j, "CreateEmbeddingResponse")
    assert j["object"] == "list" and [d["index"] for d in j["data"]] == [0, 1, 2]
    assert j["usage"] == {"prompt_tokens": sum(map(len, IDS)), "total_tokens": sum(map(len, IDS))}
    for ids, d in zip(IDS, j["data"]):
        got = np.array(d["embedding"])
        assert got.shape == (64,) and abs(np.linalg.norm(got) - 1) < 1e-6
        err = np.abs(got - reference(ids)).max()
        print(f"{len(ids)} tokens: max |pagoda - transformers| = {err:.2e}")
        assert err < 1e-5


def test_text_is_its_tokens(server):
    text = "Embeddings of a sentence, tokenized as a completion's prompt."
    ids = requests.post(server.url("/tokenize"), json={"prompt": text}, timeout=60).json()["tokens"]
    a = post(server, {"input": text})["data"][0]["embedding"]
    b = post(server, {"input": ids})["data"][0]["embedding"]
    assert a == b
    assert post(server, {"input": [text, text]})["usage"]["prompt_tokens"] == 2 * len(ids)


def test_base64(server):
    f = post(server, {"input": IDS[0]})["data"][0]["embedding"]
    name = requests.get(server.url("/v1/models"), timeout=60).json()["data"][0]["id"]
    j = post(server, {"input": IDS[0], "encoding_format": "base64", "dimensions": 64,
                      "model": name, "user": "u"})
    # (the schema knows only the float form; OpenAI's SDKs ask for base64 by default and decode
    # it as little-endian float32, as here)
    assert j["data"][0]["object"] == "embedding" and j["model"] == name
    raw = base64.b64decode(j["data"][0]["embedding"])
    assert list(struct.unpack("<64f", raw)) == pytest.approx(f, abs=0, rel=1e-7)


@pytest.mark.parametrize("body,param", [
    ({}, "input"), ({"input": ""}, "input"), ({"input": []}, "input"), ({"input": [[]]}, "input"),
    ({"input": 5}, "input"), ({"input": [1, 2**40]}, "input"),
    ({"input": list(range(600))}, "input"),  # past the 512-token context
    ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
    ({"input": "x", "dimensions": 32}, "dimensions"), ({"input": "x", "stream": True}, "stream"),
    ({"input": "x", "model": "other"}, "model"),
])
def test_errors(server, body, param):
    # an unknown model is OpenAI's and vLLM's 404 (model_not_found); the rest 400
    j = post(server, body, status=404 if param == "model" else 400)
    assert j["error"]["param"] == param and j["error"]["type"] == "invalid_request_error", j


def test_batched_equals_alone(server):
    """Sixteen inputs at once and completions in the same steps: every vector is the one its
    input gets alone, bit for bit (each token's computation does not depend on the batch)."""
    inputs = [IDS[0][: 1 + k % 7] + [k] for k in range(16)]
    alone = [post(server, {"input": x})["data"][0]["embedding"] for x in inputs]

    def completion():
        return requests.post(server.url("/v1/completions"), timeout=120,
                             json={"prompt": IDS[2], "max_tokens": 16, "temperature": 0}).status_code
    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        gen = [ex.submit(completion) for _ in range(3)]
        one = ex.submit(post, server, {"input": inputs})
        singles = [ex.submit(post, server, {"input": x}) for x in inputs]
        assert [d["embedding"] for d in one.result()["data"]] == alone
        assert [f.result()["data"][0]["embedding"] for f in singles] == alone
        assert all(g.result() == 200 for g in gen)


def test_openai_sdk(server):
    """The official SDK (which asks for base64 unless told otherwise, and decodes it)."""
    from openai import OpenAI
    client = OpenAI(base_url=server.url("/v1"), api_key="unused")
    name = client.models.list().data[0].id
    r = client.embeddings.create(model=name, input=["first text", "second"])
    want = post(server, {"input": ["first text", "second"]})
    for got, d in zip(r.data, want["data"]):
        assert got.embedding == pytest.approx(d["embedding"], abs=0, rel=1e-7)
    assert r.usage.prompt_tokens == want["usage"]["prompt_tokens"]


def test_tokenizer_appends_end_of_text(tiny_models, tmp_path, reference):
    """Qwen3-Embedding's tokenizer.json appends <|endoftext|> to every text (a TemplateProcessing
    post-processor: [$A, <|endoftext|>]) and its embeddings pool on that token. The same
    post-processor on the tiny Qwen3: Pagoda's ids are HF tokenizers' (add_special_tokens), and
    the embedding is transformers' at the appended token."""
    import json
    import shutil
    from tokenizers import Tokenizer
    d = tmp_path / "qwen3-eot"
    shutil.copytree(tiny_models["qwen3"]["hf"], d)
    tj = json.loads((d / "tokenizer.json").read_text())
    eot = "<|endoftext|>"
    eot_id = next(t["id"] for t in tj["added_tokens"] if t["content"] == eot)
    tj["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"Sequence": {"id": "A", "type_id": 0}},
                   {"SpecialToken": {"id": eot, "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {eot: {"id": eot, "ids": [eot_id], "tokens": [eot]}}}
    (d / "tokenizer.json").write_text(json.dumps(tj))
    text = "What is the capital of China?"
    want = Tokenizer.from_file(str(d / "tokenizer.json")).encode(text).ids
    assert want[-1] == eot_id
    s = Server(d, "--kv-dtype", "f32")  # the reference KV type, as above
    s.start()
    try:
        got = requests.post(s.url("/tokenize"), json={"prompt": text}, timeout=60).json()["tokens"]
        assert got == want
        e = np.array(post(s, {"input": text})["data"][0]["embedding"])
        assert np.abs(e - reference(want)).max() < 1e-5
    finally:
        s.stop()


def test_batch_lines(server, model_dir, tmp_path):
    """`pagoda batch` lines with "input" are embeddings (an offline run), beside completions:
    the same vectors as the server's."""
    import json
    import util
    lines = [{"id": "a", "input": IDS[0]}, {"id": "b", "prompt": IDS[1], "max_tokens": 3,
                                            "temperature": 0},
             {"id": "c", "input": "some text"}, {"id": "d", "input": "x", "max_tokens": 4},
             {"id": "e", "input": {"text": "x"}}]
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("".join(json.dumps(x) + "\n" for x in lines))
    util.run_pagoda("batch", "-m", model_dir, "--input", inp, "--output", out, "--no-progress",
                    "-t", "2", "--kv-dtype", "f32")  # the server's KV type
    a, b, c, d, e = [json.loads(x) for x in out.read_text().splitlines()]
    assert "takes no \"max_tokens\"" in d["error"]["message"]  # not silently ignored
    assert e["error"]["message"] == '"input" must be a string or an array of token ids'
    want = post(server, {"input": [IDS[0], "some text"]})["data"]
    assert a["embedding"] == want[0]["embedding"] and a["prompt_tokens"] == len(IDS[0])
    assert c["embedding"] == want[1]["embedding"]
    assert len(b["token_ids"]) == 3 and "embedding" not in b
