"""The default model (SmolLM2-135M-Instruct, GGUF Q4_1) against transformers reading the same file.

transformers dequantizes every Q4_1/Q8_0/F32 tensor to float32, so it is the reference for
Pagoda's --weights-f32 path (which does the same) and, within a stated margin, for the fast
path that keeps weights quantized and quantizes activations to 8 bits.
"""
import hashlib
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
import util  # noqa: E402

torch.set_num_threads(2)

N_GEN = 32
CHAT = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain in one sentence why the sky is blue.",
    "List three prime numbers.",
]
PLAIN = [
    "The quick brown fox",
    "Once upon a time, in a small village,",
    "def fibonacci(n):\n",
    "The three laws of thermodynamics are",
]


@pytest.fixture(scope="module")
def reference(default_model):
    """Prompt ids, transformers' greedy continuations and its logits over prompt+continuation,
    cached under util.CACHE keyed by the model file's size and the prompts."""
    key = hashlib.sha256(json.dumps([default_model.stat().st_size, CHAT, PLAIN, N_GEN]).encode())
    cache = util.CACHE / f"smollm2-ref-{key.hexdigest()[:16]}"
    if not (cache / "done").exists():
        from transformers import AutoModelForCausalLM, AutoTokenizer
        d, f = str(default_model.parent), default_model.name
        tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
        model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32).eval()
        model.generation_config.eos_token_id = None  # like --ignore-eos
        prompts = [tok.apply_chat_template([{"role": "user", "content": c}], tokenize=False,
                                           add_generation_prompt=True) for c in CHAT] + PLAIN
        seqs, logits = [], []
        for text in prompts:
            ids = tok.encode(text, add_special_tokens=False)
            with torch.no_grad():
                out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=N_GEN,
                                     pad_token_id=0, attention_mask=torch.ones(1, len(ids), dtype=torch.long))
                cont = out[0, len(ids):].tolist()
                logits.append(model(torch.tensor([ids + cont])).logits[0].numpy())
            seqs.append(dict(text=text, prompt=ids, cont=cont))
        cache.mkdir(parents=True, exist_ok=True)
        (cache / "seqs.json").write_text(json.dumps(seqs))
        np.save(cache / "logits.npy", np.concatenate(logits))
        (cache / "done").write_text("")
    seqs = json.loads((cache / "seqs.json").read_text())
    logits = np.load(cache / "logits.npy", mmap_mode="r")
    return seqs, logits


def test_greedy_weights_f32_matches_transformers(pagoda_bin, default_model, reference):
    seqs, _ = reference
    mismatches = []
    for s in seqs:
        p = util.run_pagoda("generate", "-m", default_model, "--ids", " ".join(map(str, s["prompt"])),
                            "-n", N_GEN, "--temperature", "0", "--ignore-eos", "--print-ids",
                            "--weights-f32")
        got = [int(x) for x in p.stdout.split()]
        if got != s["cont"]:
            i = next((i for i, (a, b) in enumerate(zip(got, s["cont"])) if a != b), len(got))
            mismatches.append(f"{s['text'][:40]!r}: first difference at step {i}: "
                              f"pagoda {got[i:i + 4]} vs transformers {s['cont'][i:i + 4]}")
    assert not mismatches, "\n".join(mismatches)


def test_quantized_path_teacher_forced(pagoda_bin, default_model, reference, tmp_path):
    """Pagoda's fast path (Q4_1 weights, activations quantized to 8 bits per block of 32) under
    teacher forcing over every prompt + reference continuation (~400 positions).

    The activation rounding moves every logit a little. Let err be the |logit difference| over
    all positions and tokens, and B = 2 * p99.9(err). Pagoda can only pick token b over the
    reference's best a if ref[a] - ref[b] <= |err_a| + |err_b|; with both errors at or below
    their 99.9th percentile that is a gap below B. So: the arg-max must agree at >= 99% of
    positions, and every disagreement must be a near-tie with reference top-2 gap < B; a
    disagreement at a wider gap means an error far outside the usual rounding noise there.
    """
    seqs, ref = reference
    parts = []
    for s in seqs:
        ids = s["prompt"] + s["cont"]
        out = tmp_path / "logits.f32"
        p = util.run_pagoda("logits", "-m", default_model, "--ids", " ".join(map(str, ids)), "--out", out,
                            "--kv-dtype", "f32")  # the reference KV type
        n_vocab = int(p.stdout.split()[-1])
        parts.append(np.fromfile(out, dtype="<f4").reshape(len(ids), n_vocab))
    got = np.concatenate(parts)
    ref = np.asarray(ref)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    err = np.abs(got - ref)
    p999 = float(np.quantile(err, 0.999))
    bound = 2 * p999
    top2 = np.sort(ref, axis=1)[:, -2:]
    gap = top2[:, 1] - top2[:, 0]
    agree = got.argmax(1) == ref.argmax(1)
    print(f"\n{len(ref)} positions: arg-max agreement {agree.mean():.4f}; |logit diff| max "
          f"{err.max():.4f}, p99.9 {p999:.4f}, mean {err.mean():.4f}; max|ref| {np.abs(ref).max():.2f}; "
          f"disagreements (position, ref top-2 gap): "
          f"{[(int(i), round(float(gap[i]), 4)) for i in np.flatnonzero(~agree)]}; bound B {bound:.4f}")
    assert agree.mean() >= 0.99, f"arg-max agrees at only {agree.mean():.4f} of positions"
    wide = [(int(i), float(gap[i])) for i in np.flatnonzero(~agree) if gap[i] >= bound]
    assert not wide, f"arg-max differs where the reference's top-2 gap is >= B={bound:.4f}: {wide}"


# ---- prompt logprobs: completions' echo with logprobs (what lm-evaluation-harness sends) ----

def _log_softmax(x):
    x = np.asarray(x, dtype=np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def _echo(server, prompt, **kw):
    import requests
    body = dict(dict(prompt=prompt, max_tokens=0, echo=True, logprobs=5, temperature=0), **kw)
    r = requests.post(server.url("/v1/completions"), json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def _check_echo_shape(body, server_util, n):
    """The legacy completions shape: aligned arrays, null first score, offsets that add up."""
    for ch in body["choices"]:
        lp = ch["logprobs"]
        assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == \
            len(lp["text_offset"]) == n
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        assert lp["text_offset"][0] == 0
        assert all(lp["text_offset"][i + 1] == lp["text_offset"][i] + len(lp["tokens"][i].encode())
                   for i in range(n - 1))
    # OpenAI's (and vLLM's) legacy API sends null for the first token's scores with echo; the
    # published schema's item types omit it, so the rest of the body is validated without it
    trimmed = json.loads(json.dumps(body))
    for ch in trimmed["choices"]:
        for k in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
            ch["logprobs"][k] = ch["logprobs"][k][1:]
    server_util.validate(trimmed, "CreateCompletionResponse")


@pytest.fixture(scope="module")
def f32_server(default_model):
    """The server on the reference path (weights dequantized to F32, F32 KV), with a step of 24
    tokens and 4 logits rows, so scored prompts are split across many steps."""
    from server_util import Server
    s = Server(default_model, "--weights-f32", "--kv-dtype", "f32", "--max-num-batched-tokens", "24",
               "--max-num-seqs", "4")
    s.start()
    yield s
    s.stop()


def test_panels_without_huge_pages(pagoda_bin, default_model, reference, tmp_path):
    """The CPU's 16-row weight panels do not depend on huge pages: with PAGODA_HUGEPAGES=0 (as
    where THP is "never") the logits are bit-identical to the default's. The panels sum each row
    in another order than the row-major kernels, so PAGODA_PACK=0 (no panels) must differ: the
    comparison would see weights left unpacked."""
    ids = " ".join(map(str, reference[0][0]["prompt"]))

    def logits(**env):
        out = tmp_path / "logits.f32"
        util.run_pagoda("logits", "-m", default_model, "--ids", ids, "--out", out,
                        env={**os.environ, **env})
        return out.read_bytes()

    default = logits()
    assert logits(PAGODA_HUGEPAGES="0") == default
    assert logits(PAGODA_PACK="0") != default


def test_echo_logprobs_match_transformers(f32_server, reference):
    """Every prompt token's logprob (and the best alternative's) equals transformers'
    log-softmax of the logits at the position before it, on all 8 reference sequences, sent
    as one request of 8 token-id prompts (they share the engine's steps)."""
    import server_util
    seqs, ref = reference
    ids = [s["prompt"] + s["cont"] for s in seqs]
    body = _echo(f32_server, ids)
    assert [c["index"] for c in body["choices"]] == list(range(len(ids)))
    assert body["usage"]["prompt_tokens"] == sum(map(len, ids))
    assert body["usage"]["completion_tokens"] == 0
    off, worst, worst_top = 0, 0.0, 0.0
    for seq_ids, ch in zip(ids, body["choices"]):
        n = len(seq_ids)
        _check_echo_shape({"choices": [ch], **{k: body[k] for k in body if k != "choices"}},
                          server_util, n)
        assert ch["finish_reason"] == "length"
        lsm = _log_softmax(ref[off:off + n])
        off += n
        got = np.array(ch["logprobs"]["token_logprobs"][1:], dtype=np.float64)
        want = lsm[np.arange(n - 1), seq_ids[1:]]
        worst = max(worst, float(np.abs(got - want).max()))
        best = np.array([max(t.values()) for t in ch["logprobs"]["top_logprobs"][1:]])
        worst_top = max(worst_top, float(np.abs(best - lsm[:n - 1].max(axis=1)).max()))
        assert all(len(t) == 5 for t in ch["logprobs"]["top_logprobs"][1:])
    print(f"\nmax |logprob - transformers| {worst:.2e}, of the best alternative {worst_top:.2e}")
    assert worst < 5e-4 and worst_top < 5e-4


def test_echo_logprobs_lm_eval_request(f32_server, reference):
    """lm-evaluation-harness's loglikelihood request (local-completions): context+continuation
    ids, max_tokens 1, echo, logprobs 1; it sums token_logprobs[ctxlen:-1] and calls the
    continuation greedy when each token's logprob is the top one. Both agree with
    transformers; streamed, the answer is the same."""
    import requests
    seqs, ref = reference
    offs = np.cumsum([0] + [len(s["prompt"]) + len(s["cont"]) for s in seqs])
    body = {"prompt": [s["prompt"] + s["cont"][:8] for s in seqs[:4]], "max_tokens": 1,
            "echo": True, "logprobs": 1, "temperature": 0, "seed": 1234}
    r = requests.post(f32_server.url("/v1/completions"), json=body, timeout=300)
    assert r.status_code == 200, r.text
    out = r.json()
    for i, (s, ch) in enumerate(zip(seqs[:4], out["choices"])):
        ctxlen = len(s["prompt"])
        lp = ch["logprobs"]
        assert len(lp["tokens"]) == ctxlen + 8 + 1  # the prompt, then the 1 generated token
        total = sum(lp["token_logprobs"][ctxlen:-1])
        lsm = _log_softmax(ref[offs[i]:offs[i] + ctxlen + 8])
        want = sum(lsm[ctxlen - 1 + j, s["cont"][j]] for j in range(8))
        assert total == pytest.approx(want, abs=1e-3)
        scores = zip(lp["token_logprobs"][ctxlen:-1], lp["top_logprobs"][ctxlen:-1])
        greedy = all(t == pytest.approx(max(top.values()), abs=1e-6) for t, top in scores)
        assert greedy  # the continuations are transformers' greedy ones
    # streamed: the echo (with every prompt score) comes first, then the generated token
    import server_util
    r = requests.post(f32_server.url("/v1/completions"), json=dict(body, stream=True),
                      timeout=300, stream=True)
    assert r.status_code == 200
    merged = {}
    for ev in server_util.sse_events(r.iter_lines()):
        if ev == "[DONE]":
            break
        for ch in ev["choices"]:
            m = merged.setdefault(ch["index"], {"text": "", "lp": {}})
            m["text"] += ch["text"]
            for k, v in (ch.get("logprobs") or {}).items():
                m["lp"].setdefault(k, []).extend(v)
    for ch in out["choices"]:
        assert merged[ch["index"]]["text"] == ch["text"]
        assert merged[ch["index"]]["lp"] == ch["logprobs"]


def test_echo_logprobs_batched_engine_equals_unbatched(pagoda_bin, default_model, reference,
                                                       tmp_path):
    """On the fast path (Q4_1 weights): the server's prompt scores, computed in steps shared by
    other requests (n=2, two prompts, 24-token steps, 4 logits rows), twice so the second run
    could have used the prefix cache, equal the log-softmax of `pagoda logits` (the unbatched
    single-sequence path) to float rounding."""
    from server_util import Server
    seqs, _ = reference
    ids = [seqs[0]["prompt"] + seqs[0]["cont"], seqs[5]["prompt"] + seqs[5]["cont"]]
    want = []
    for x in ids:
        out = tmp_path / "logits.f32"
        p = util.run_pagoda("logits", "-m", default_model, "--ids", " ".join(map(str, x)),
                            "--out", out)
        n_vocab = int(p.stdout.split()[-1])
        lsm = _log_softmax(np.fromfile(out, dtype="<f4").reshape(len(x), n_vocab))
        want.append(lsm[np.arange(len(x) - 1), x[1:]])
    with Server(default_model, "--max-num-batched-tokens", "24", "--max-num-seqs", "4") as s:
        for _ in range(2):
            body = _echo(s, ids, n=2, max_tokens=3)
            assert len(body["choices"]) == 4
            for ch in body["choices"]:
                w = want[ch["index"] // 2]
                lp = ch["logprobs"]
                assert len(lp["tokens"]) == len(w) + 1 + 3
                got = np.array(lp["token_logprobs"][1:len(w) + 1], dtype=np.float64)
                assert np.abs(got - w).max() < 1e-5
                # offsets add up every token's bytes, the generated ones continuing the
                # prompt's (vLLM's rule; the prompt starts with a special token, which its
                # echoed text leaves out)
                assert all(lp["text_offset"][k + 1] == lp["text_offset"][k] +
                           len(lp["tokens"][k].encode()) for k in range(len(lp["tokens"]) - 1))


def test_echo_bounds(default_server):
    """Scored prompt tokens count against --max-request-tokens (one small request must not ask
    for a body of hundreds of MB); echo alone takes a prompt as long as the context; min_tokens
    above an echo's max_tokens 0 is refused."""
    import requests
    url = default_server.url("/v1/completions")
    ids = list(range(1000, 2024))  # 64 x n=16 x (1,024 + 1) tokens: past the 1,048,576
    r = requests.post(url, timeout=60, json={"prompt": [ids] * 64, "n": 16, "echo": True,
                                             "logprobs": 20, "max_tokens": 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens", r.text
    assert "scored prompt tokens" in r.json()["error"]["message"]
    r = requests.post(url, timeout=60, json={"prompt": "Hi", "echo": True, "max_tokens": 0,
                                             "min_tokens": 3})
    assert r.status_code == 400 and r.json()["error"]["param"] == "min_tokens", r.text
    from server_util import Server
    with Server(util.DATA / "models" / "stories260K.gguf") as s:  # a 512-token context
        url = s.url("/v1/completions")
        n_ctx = requests.post(s.url("/tokenize"), json={"prompt": "a"},
                              timeout=60).json()["max_model_len"]
        full = [3 + i % 500 for i in range(n_ctx)]
        r = requests.post(url, timeout=300, json={"prompt": full, "echo": True,
                                                  "max_tokens": 0, "logprobs": 0})
        assert r.status_code == 200, r.text
        assert len(r.json()["choices"][0]["logprobs"]["tokens"]) == n_ctx
        assert r.json()["usage"]["completion_tokens"] == 0
        r = requests.post(url, timeout=60, json={"prompt": full + [5], "echo": True,
                                                 "max_tokens": 0})
        assert r.status_code == 400, r.text


def test_echo_alone(default_server):
    """echo with max_tokens 0: the prompt back and nothing generated (vLLM and OpenAI's legacy
    API); max_tokens 0 without echo stays a 400 (test_server_errors.py)."""
    import requests
    url = default_server.url("/v1/completions")
    r = requests.post(url, json={"prompt": "The capital of France is", "max_tokens": 0,
                                 "echo": True}, timeout=60)
    assert r.status_code == 200, r.text
    c = r.json()["choices"][0]
    assert c["text"] == "The capital of France is" and c["logprobs"] is None
    assert c["finish_reason"] == "length" and r.json()["usage"]["completion_tokens"] == 0


def test_prompt_logprobs_extension_matches_transformers(f32_server, reference):
    """vLLM's prompt_logprobs extension: per choice, null then {id: {logprob, rank,
    decoded_token}} for each prompt token and its top alternatives; the values and ranks are
    transformers' (ranks compared where no other logit is within 1e-3 of the token's)."""
    import requests
    import server_util
    seqs, ref = reference
    s = seqs[4]
    ids = s["prompt"] + s["cont"]
    r = requests.post(f32_server.url("/v1/completions"), timeout=300, json={
        "prompt": ids, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 3})
    assert r.status_code == 200, r.text
    body = r.json()
    server_util.validate(body, "CreateCompletionResponse")
    pl = body["choices"][0]["prompt_logprobs"]
    assert body["choices"][0]["logprobs"] is None and len(pl) == len(ids) and pl[0] is None
    off = sum(len(x["prompt"]) + len(x["cont"]) for x in seqs[:4])
    lsm = _log_softmax(ref[off:off + len(ids)])
    checked = 0
    for i in range(1, len(ids)):
        row = lsm[i - 1]
        e = pl[i]
        assert str(ids[i]) in e and 3 <= len(e) <= 4
        assert e[str(ids[i])]["logprob"] == pytest.approx(row[ids[i]], abs=5e-4)
        top = np.argsort(-row)[:3]
        for j, t in enumerate(top):
            if str(t) in e and int(t) != ids[i]:
                assert e[str(t)]["rank"] == j + 1
        if np.sort(np.abs(row - row[ids[i]]))[1] > 1e-3:
            assert e[str(ids[i])]["rank"] == int((row > row[ids[i]]).sum()) + 1
            checked += 1
    assert checked > len(ids) // 2
    # chat: once, at the top level, for the rendered prompt
    r = requests.post(f32_server.url("/v1/chat/completions"), timeout=300, json={
        "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "prompt_logprobs": 0})
    assert r.status_code == 200, r.text
    c = r.json()
    server_util.validate(c, "CreateChatCompletionResponse")
    assert len(c["prompt_logprobs"]) == c["usage"]["prompt_tokens"]
    assert all(len(e) == 1 for e in c["prompt_logprobs"][1:])
    r = requests.post(f32_server.url("/v1/completions"), timeout=60, json={
        "prompt": "Hi", "max_tokens": 1, "prompt_logprobs": 1, "stream": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt_logprobs"


def test_streamed_scored_echo_client_disconnect_aborts(default_server):
    """A streamed echo with logprobs sends nothing until its prompt is scored (the echo goes out
    with the scores): a client that leaves meanwhile is noticed by the socket check and its
    choices cancelled at once, not after the whole prompt (~20 s here)."""
    import json as js
    import socket
    import time
    s = default_server
    before = s.metrics()
    body = js.dumps({"prompt": [1000 + i for i in range(2500)], "max_tokens": 4, "n": 2,
                     "echo": True, "logprobs": 5, "stream": True}).encode()
    sock = socket.create_connection(("127.0.0.1", s.port), timeout=60)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                 b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    m = s.wait_metrics(lambda m: m["pagoda:num_requests_running"] > 0, timeout=30)
    assert m["pagoda:num_requests_running"] > 0
    time.sleep(0.5)
    sock.close()
    t = time.time()
    m = s.wait_metrics(lambda m: m["pagoda:num_requests_running"] == 0, timeout=30)
    assert m["pagoda:num_requests_running"] == 0
    assert time.time() - t < 6, f"cancelled after {time.time() - t:.1f} s"
    aborted = m["pagoda:request_success_total{finished_reason=abort}"] - \
        before.get("pagoda:request_success_total{finished_reason=abort}", 0)
    assert aborted == 2
