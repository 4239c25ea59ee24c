"""The batched engine against its own unbatched path (issue 4, proofs 1 and 3).

Reference: every request run alone (`--max-num-seqs 1 --no-prefix-caching`: a batch of one, no
cache). Under test: the same 64 requests submitted at once and staggered, with prefix caching on
and off, prefill chunks of 16, 64 and 512 tokens, and a KV pool so small that preemption happens.
Greedy outputs must be identical, and so must sampled outputs with a fixed seed.

Model: the real trained stories260K (5 layers, GQA) with its context length raised from 512 to
4096 in the GGUF header, so prompts of up to 1,500 tokens fit (RoPE is defined at any position;
beyond 512 the text quality is irrelevant to an equality test)."""
import json
import random
import struct

import pytest

from test_bad_input import walk_gguf
from util import DATA, run_pagoda

STORIES = DATA / "models" / "stories260K.gguf"
BLOCK = 16


@pytest.fixture(scope="session")
def long_model(tmp_path_factory):
    buf = bytearray(STORIES.read_bytes())
    kv, _, _ = walk_gguf(buf)
    off, t = kv["llama.context_length"]
    assert t == 4 and struct.unpack_from("<I", buf, off)[0] == 512
    struct.pack_into("<I", buf, off, 4096)
    p = tmp_path_factory.mktemp("engine") / "stories260K-ctx4096.gguf"
    p.write_bytes(bytes(buf))
    return p


def make_requests(n=64, seed=1234):
    rng = random.Random(seed)
    shared = [rng.randrange(3, 512) for _ in range(300)]
    reqs = []
    for i in range(n):
        plen = rng.choice([1, 2, 7, 16, 17, 33, 100, 250, 512, 777, 1024, 1500, rng.randrange(1, 1501)])
        toks = [1] + [rng.randrange(3, 512) for _ in range(plen - 1)]
        if i % 4 == 0 and plen > 310:  # a quarter share a 300-token prefix after BOS
            toks[1:301] = shared
        # output lengths: Pareto-like, capped
        out = min(96, int(rng.paretovariate(1.5) * 4))
        r = {"id": i, "prompt": toks, "max_tokens": max(1, out), "ignore_eos": i % 5 != 0}
        if i % 2:
            r.update(temperature=0.9, top_p=0.9, top_k=40, seed=1000 + i)
        else:
            r.update(temperature=0)
        reqs.append(r)
    return reqs


def run_batch(model, tmp_path, name, reqs, *opts):
    inp = tmp_path / f"{name}.in.jsonl"
    out = tmp_path / f"{name}.out.jsonl"
    stats = tmp_path / f"{name}.stats.json"
    inp.write_text("".join(json.dumps(r) + "\n" for r in reqs))
    run_pagoda("batch", "-m", model, "--input", inp, "--output", out, "--stats", stats,
               "--no-progress", *opts)
    results = [json.loads(l) for l in out.read_text().splitlines()]
    assert [r["id"] for r in results] == [r["id"] for r in reqs]
    for r in results:
        assert "error" not in r, r
    return results, json.loads(stats.read_text())


@pytest.fixture(scope="module")
def reference(long_model, tmp_path_factory):
    reqs = make_requests()
    res, stats = run_batch(long_model, tmp_path_factory.mktemp("ref"), "alone", reqs,
                           "--max-num-seqs", "1", "--no-prefix-caching")
    assert stats["preemptions"] == 0
    return reqs, res


def assert_same(res, ref):
    for a, b in zip(res, ref):
        assert a["token_ids"] == b["token_ids"], f"request {a['id']} differs"
        assert a["text"] == b["text"]
        assert a["finish_reason"] == b["finish_reason"]
        assert a["completion_tokens"] == b["completion_tokens"]


CONFIGS = {
    "chunk16": ["--max-num-batched-tokens", "16"],
    "chunk64": ["--max-num-batched-tokens", "64"],
    "chunk512": ["--max-num-batched-tokens", "512"],
    "chunk16-noprefix": ["--max-num-batched-tokens", "16", "--no-prefix-caching"],
    "chunk64-noprefix": ["--max-num-batched-tokens", "64", "--no-prefix-caching"],
    "chunk512-noprefix": ["--max-num-batched-tokens", "512", "--no-prefix-caching"],
    "staggered": ["--max-num-batched-tokens", "64", "--stagger", "3"],
    "staggered-noprefix": ["--max-num-batched-tokens", "512", "--stagger", "5", "--no-prefix-caching"],
    "block8-f32": ["--block-size", "8", "--max-num-batched-tokens", "100"],
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_batched_equals_alone(long_model, tmp_path, reference, name):
    reqs, ref = reference
    res, stats = run_batch(long_model, tmp_path, name, reqs, *CONFIGS[name])
    assert_same(res, ref)
    if "noprefix" not in name:
        assert stats["prefix_cache_hits"] > 0, "the shared 300-token prefixes should hit"
    else:
        assert stats["prefix_cache_hits"] == 0


@pytest.mark.parametrize("chunk", ["16", "512"])
def test_preemption_keeps_outputs(long_model, tmp_path, chunk):
    # Decode-heavy requests: admission only needs a prompt's blocks, so many run at once and
    # then outgrow the pool while decoding. 640 bytes of KV per token (F16, the default): 640 KiB
    # is 64 blocks (1,024 tokens) -- enough for the longest request alone (300 + 200 tokens), far
    # from all.
    rng = random.Random(99)
    reqs = []
    for i in range(64):
        toks = [1] + [rng.randrange(3, 512) for _ in range(rng.randrange(0, 300))]
        r = {"id": i, "prompt": toks, "max_tokens": rng.randrange(100, 201), "ignore_eos": True}
        r.update(temperature=0.9, top_p=0.95, seed=i) if i % 2 else r.update(temperature=0)
        reqs.append(r)
    ref, _ = run_batch(long_model, tmp_path, "alone", reqs, "--max-num-seqs", "1",
                       "--no-prefix-caching")
    res, stats = run_batch(long_model, tmp_path, "small", reqs, "--kv-cache-memory", "640KiB",
                           "--max-num-batched-tokens", chunk)
    assert stats["kv_blocks_total"] == 64
    assert stats["preemptions"] > 0, "the pool was meant to be too small"
    assert stats["kv_blocks_used"] == 0
    assert_same(res, ref)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_half_precision_kv_batched_equals_alone(long_model, tmp_path, dtype):
    # Narrower KV changes the numbers, not the invariance: batched f16/bf16 runs must equal the
    # alone runs with the same KV type.
    reqs = make_requests(n=24, seed=5)
    ref, _ = run_batch(long_model, tmp_path, "alone", reqs, "--max-num-seqs", "1",
                       "--no-prefix-caching", "--kv-dtype", dtype)
    res, _ = run_batch(long_model, tmp_path, "batched", reqs, "--kv-dtype", dtype,
                       "--max-num-batched-tokens", "64")
    assert_same(res, ref)


def test_prefix_cache_prefills_only_the_suffix(long_model, tmp_path):
    rng = random.Random(7)
    system = [1] + [rng.randrange(3, 512) for _ in range(999)]  # 1,000 tokens
    reqs = [{"id": i, "prompt": system + [rng.randrange(3, 512) for _ in range(20)],
             "max_tokens": 8, "temperature": 0, "ignore_eos": True} for i in range(8)]
    off, _ = run_batch(long_model, tmp_path, "nocache", reqs, "--no-prefix-caching",
                       "--max-num-seqs", "1")
    on, stats = run_batch(long_model, tmp_path, "cache", reqs, "--max-num-seqs", "1")
    assert_same(on, off)
    full = len(reqs[0]["prompt"])           # 1,020 tokens
    hit = (1000 // BLOCK) * BLOCK           # 992: the full blocks of the shared prompt
    assert stats["prefill_tokens"] == full + 7 * (full - hit)
    assert stats["prefix_cache_hits"] == 7 * hit
    assert [r["cached_tokens"] for r in on] == [0] + [hit] * 7


def chunked_equals_alone(model, tmp_path, reqs):
    """Each request run alone (no prefix cache) is the reference; with prefill chunks of 16 and
    512 tokens and prefix caching on, every output equals it and the cache is hit. Returns the
    reference."""
    ref, _ = run_batch(model, tmp_path, "alone", reqs, "--max-num-seqs", "1",
                       "--no-prefix-caching")
    for chunk in ("16", "512"):
        res, stats = run_batch(model, tmp_path, "batched" + chunk, reqs,
                               "--max-num-batched-tokens", chunk)
        assert stats["prefix_cache_hits"] > 0
        assert_same(res, ref)
    return ref


@pytest.mark.parametrize("name,fmt", [("qwen3moe", "gguf_Q8_0"), ("mixtral", "gguf_F16"),
                                      ("qwen2moe", "hf"), ("mistral", "gguf_F32"),
                                      ("qwen2swa", "hf"), ("gemma3", "gguf_Q8_0"),
                                      ("gemma2", "hf")])
def test_moe_and_sliding_window_batched_equals_alone(tiny_models, tmp_path, name, fmt):
    """A mixture-of-experts model (tiny random Qwen3-MoE, Mixtral and Qwen2-MoE) through the
    batched engine: each step groups its tokens by expert, so a token's experts run with whatever
    other tokens chose them. A sliding-window model (Mistral: every layer; Qwen2: one layer): each
    token's window starts inside attention tiles and segments that other tokens of the step read
    whole (Gemma 3 too, with its two RoPE bases; Gemma 2 with soft-capped scores). Outputs must
    still equal each request run alone, with prefill chunks of 16 and 512 tokens and prefix
    caching on."""
    model = tiny_models[name][fmt]
    rng = random.Random(7)
    shared = [rng.randrange(3, 30000) for _ in range(120)]
    reqs = []
    for i in range(24):
        plen = rng.choice([1, 5, 17, 64, 130, 200, 333])
        toks = [rng.randrange(3, 30000) for _ in range(plen)]
        if i % 3 == 0 and plen > 130:
            toks[:120] = shared
        r = {"id": i, "prompt": toks, "max_tokens": rng.randrange(1, 40), "ignore_eos": True}
        r.update(temperature=0.8, top_p=0.9, seed=i) if i % 2 else r.update(temperature=0)
        reqs.append(r)
    chunked_equals_alone(model, tmp_path, reqs)
