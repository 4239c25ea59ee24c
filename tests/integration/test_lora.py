"""PEFT LoRA adapters on the CPU backend, against peft on transformers.

Adapters are made with peft on the tiny random models of make_tiny_models.py and saved with
save_pretrained (lora_ref.py); their lora_A/lora_B are seeded random values, so each adapter
moves the logits by far more than the bounds. Pagoda applies an adapter to the HF directory and
to the F32 GGUF (whose Llama Q/K rows are permuted: Pagoda permutes the adapter's q/k B rows to
match), and must give peft's logits at test_forward's F32 bound and peft's greedy tokens;
tensor parallel (two ranks) must give the one-rank answer. The server serves several adapters
beside the base model (--lora-modules), each request by its "model", with a prefix cache kept
apart per adapter. A bad adapter directory is refused with an error naming the file.
"""
import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import requests
import torch

sys.path.insert(0, str(Path(__file__).parent))
import util  # noqa: E402
from lora_ref import ALL7, Ref, make_adapter  # noqa: E402
from server_util import SANITIZER_MARKERS, Server, sse_events, validate  # noqa: E402
from test_forward import F32_BOUND, describe_worst, prompt_ids  # noqa: E402

torch.set_num_threads(2)

N_GEN = 16
# Two ranks against one on the same F32 weights: the row-parallel projections (o_proj,
# down_proj and their adapters' A) sum two halves instead of one whole, which moves logits by
# 3.5e-7..6e-7 of max|logit| on these models with and without an adapter (measured); 1e-5 leaves
# an order of magnitude and is far below what a mis-split adapter does (the adapters move
# logits by 0.26..0.78 of max|logit|).
TP_BOUND = 1e-5

# adapter name -> (tiny model, LoraConfig arguments, seed of its random weights)
ADAPTERS = {
    # every projection of every layer
    "llama": ("llama", dict(r=8, lora_alpha=16, target_modules=list(ALL7)), 1),
    # the server's second adapter: another rank and scale, some projections, layer 1 only
    "llama-b": ("llama", dict(r=4, lora_alpha=16, layers_to_transform=[1],
                              target_modules=["q_proj", "k_proj", "o_proj", "up_proj"]), 2),
    # rsLoRA (scale lora_alpha / sqrt(r) = 4, where lora_alpha / r would be 2), layer 0 only,
    # on a model with q/k/v biases
    "qwen2": ("qwen2", dict(r=4, lora_alpha=8, use_rslora=True, layers_to_transform=[0],
                            target_modules=["q_proj", "v_proj", "down_proj"]), 3),
    # stored in half precision (kept so in memory: the op widens each element)
    "llama-bf16": ("llama", dict(r=8, lora_alpha=16, target_modules=list(ALL7),
                                 dtype=torch.bfloat16), 10),
    "qwen2-f16": ("qwen2", dict(r=4, lora_alpha=8, target_modules=list(ALL7),
                                dtype=torch.float16), 11),
    # other architectures: Gemma 3 (GELU gate, QK-norm, sliding-window layers, embeddings
    # scaled), SmolLM3 (NoPE layers), and the attention of a mixture of experts (its experts
    # take no adapter)
    "gemma3": ("gemma3", dict(r=8, lora_alpha=16, target_modules=list(ALL7)), 7),
    "smollm3": ("smollm3", dict(r=8, lora_alpha=16, target_modules=list(ALL7)), 8),
    "qwen3moe": ("qwen3moe", dict(r=8, lora_alpha=16,
                                  target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]), 9),
    # refused (test_bad_adapter): made for other dimensions (head_dim 32: q_proj 64 -> 128)
    # than the tiny Llama's; adapting the embedding or the LM head (peft then also saves the
    # base layer: ...embed_tokens.lora_embedding_A/B and .base_layer.weight, lm_head.lora_A/B
    # and .base_layer.weight)
    "qwen3": ("qwen3", dict(r=8, lora_alpha=16, target_modules=list(ALL7)), 4),
    "llama-embed": ("llama", dict(r=8, lora_alpha=16,
                                  target_modules=list(ALL7) + ["embed_tokens"]), 5),
    "llama-lm_head": ("llama", dict(r=8, lora_alpha=16,
                                    target_modules=list(ALL7) + ["lm_head"]), 6),
}


@pytest.fixture(scope="module")
def adapters(tiny_models, tmp_path_factory):
    """adapters(name) -> the saved adapter directory (made once per module)."""
    root = tmp_path_factory.mktemp("lora")
    made = {}

    def get(name):
        if name not in made:
            model, config, seed = ADAPTERS[name]
            made[name] = make_adapter(tiny_models[model]["hf"], root / name, seed, **config)
        return made[name]
    return get


@pytest.fixture(scope="module")
def refs(tiny_models, adapters):
    """refs(model, adapter=None) -> lora_ref.Ref (transformers, with the adapter through peft)."""
    cache = {}

    def get(model, adapter=None):
        if (model, adapter) not in cache:
            cache[model, adapter] = Ref(tiny_models[model]["hf"],
                                        adapters(adapter) if adapter else None)
        return cache[model, adapter]
    return get


def model_path(tiny_models, model, fmt):
    return tiny_models[model]["hf" if fmt == "hf" else "gguf_" + fmt]


def ids_for(model):
    return prompt_ids(model, 151936 if model.startswith("qwen") else 32000)


def tp_env(n):
    return dict(os.environ, PAGODA_TENSOR_PARALLEL=str(n))


def pagoda_logits(model, ids, out, *extra, env=None):
    # F32 KV: the reference option, for the bounds against PEFT on transformers
    p = util.run_pagoda("logits", "-m", model, "--ids", " ".join(map(str, ids)), "--out", out,
                        "--kv-dtype", "f32", *extra, env=env)
    n_vocab = int(p.stdout.split()[-1])
    a = np.fromfile(out, dtype="<f4")
    assert a.size == len(ids) * n_vocab, (a.size, len(ids), n_vocab)
    return a.reshape(len(ids), n_vocab)


def pagoda_greedy(model, ids, n, *extra, env=None):
    p = util.run_pagoda("generate", "-m", model, "--ids", " ".join(map(str, ids)), "-n", n,
                        "--temperature", "0", "--ignore-eos", "--print-ids", *extra, env=env)
    return [int(x) for x in p.stdout.split()]


def rel(a, ref):
    return float(np.abs(a - ref).max() / np.abs(ref).max())


# ---- logits and greedy tokens against peft ----

LOGIT_CASES = [("llama", "hf"), ("llama", "F32"), ("llama-b", "F32"), ("qwen2", "hf"),
               ("qwen2", "F32"), ("gemma3", "hf"), ("gemma3", "F32"), ("smollm3", "hf"),
               ("smollm3", "F32"), ("qwen3moe", "hf"), ("qwen3moe", "F32"), ("llama-bf16", "hf"),
               ("llama-bf16", "F32"), ("qwen2-f16", "F32")]


@pytest.mark.parametrize("adapter,fmt", LOGIT_CASES)
def test_lora_logits(pagoda_bin, tiny_models, adapters, refs, adapter, fmt, tmp_path):
    """Teacher-forced logits over 64 tokens with the adapter equal peft's at the F32 bound; the
    adapter moves peft's logits by over 100x that bound (so ignoring it, a wrong scale, a
    missing q/k permutation on the GGUF, or a wrong layer fails)."""
    model = ADAPTERS[adapter][0]
    ids = ids_for(model)
    ref = refs(model, adapter).logits(ids)
    moved = rel(ref, refs(model).logits(ids))
    assert moved > 100 * F32_BOUND, f"the adapter hardly moves peft's logits ({moved:.3e})"
    a = pagoda_logits(model_path(tiny_models, model, fmt), ids, tmp_path / "l.f32",
                      "--lora", adapters(adapter))
    assert a.shape == ref.shape
    err = rel(a, ref)
    print(f"{adapter} {fmt}: rel err {err:.3e} (bound {F32_BOUND:.0e}); adapter moves logits "
          f"by {moved:.3f}")
    assert err <= F32_BOUND, (f"{adapter} {fmt}: rel err {err:.3e} > {F32_BOUND}; "
                              + describe_worst(a, ref, F32_BOUND))


def test_lora_quantized_base(pagoda_bin, tiny_models, adapters, tmp_path):
    """On a Q8_0 base the adapter adds its delta to the quantized projections' output: the
    quantized path gives the logits of the reference path (the same file's weights dequantized
    at load, --weights-f32) with the same adapter, at the F32 bound; the adapter moves them far
    more than that."""
    path, lora = tiny_models["llama"]["gguf_Q8_0"], adapters("llama")
    ids = ids_for("llama")
    q = pagoda_logits(path, ids, tmp_path / "q.f32", "--lora", lora)
    f = pagoda_logits(path, ids, tmp_path / "f.f32", "--lora", lora, "--weights-f32")
    base = pagoda_logits(path, ids, tmp_path / "b.f32", "--weights-f32")
    assert rel(q, f) <= F32_BOUND, describe_worst(q, f, F32_BOUND)
    assert rel(base, f) > 100 * F32_BOUND


GREEDY_CASES = [("llama", "hf"), ("llama", "F32"), ("qwen2", "hf")]


@pytest.mark.parametrize("adapter,fmt", GREEDY_CASES)
def test_lora_greedy(pagoda_bin, tiny_models, adapters, refs, adapter, fmt):
    """`generate --lora` gives PeftModel.generate(do_sample=False)'s tokens, token for token (F32
    weights: exact, as test_forward's test_greedy holds F32 models), and they are not the base
    model's."""
    model = ADAPTERS[adapter][0]
    ids = ids_for(model)
    want = refs(model, adapter).greedy(ids, N_GEN)
    assert len(want) == N_GEN
    assert want != refs(model).greedy(ids, N_GEN), "the adapter leaves peft's greedy tokens"
    got = pagoda_greedy(model_path(tiny_models, model, fmt), ids, N_GEN, "--lora",
                        adapters(adapter))
    first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
    assert got == want, f"{adapter} {fmt}: differs from peft's generate() first at step {first}"


def test_lora_speculation_is_exact(pagoda_bin, tiny_models, adapters, refs):
    """Speculative decoding with an adapter keeps peft's greedy tokens: the draft (the base model,
    without the adapter) proposes, the model with the adapter verifies, so every proposal the
    adapter's model would not choose is rejected. (The n-gram proposer shares that
    verification; on these random models its proposals never occur.)"""
    ids = ids_for("llama")
    path, lora = tiny_models["llama"]["hf"], adapters("llama")
    want = refs("llama", "llama").greedy(ids, 2 * N_GEN)
    p = util.run_pagoda("generate", "-m", path, "--ids", " ".join(map(str, ids)), "-n",
                        2 * N_GEN, "--temperature", "0", "--ignore-eos", "--print-ids",
                        "--lora", lora, "--speculative", "draft", "--num-speculative-tokens",
                        "4", "--draft-model", path)
    got = [int(x) for x in p.stdout.split()]
    err = p.stderr.decode()
    proposed = int(err.split("speculation: ")[1].split()[0])
    assert proposed > 0, err
    assert got == want, f"{got} != peft's {want}"


TP_CASES = [("llama", "hf"), ("llama", "F32"), ("qwen2", "F32")]


@pytest.mark.parametrize("adapter,fmt", TP_CASES)
def test_lora_tensor_parallel(pagoda_bin, tiny_models, adapters, adapter, fmt, tmp_path):
    """PAGODA_TENSOR_PARALLEL=2 (the CPU's in-process communicator: two heads and one KV head
    per rank, the adapters' B rows of q/k/v/gate/up and A columns of o/down split with their
    projections) with an adapter gives the one-rank greedy tokens and logits within TP_BOUND.
    The two runs' logits are not bit-identical: two ranks really ran (summing halves rounds
    differently), rather than a silent fall-back to one with an adapter."""
    model = ADAPTERS[adapter][0]
    path, lora = model_path(tiny_models, model, fmt), adapters(adapter)
    ids = ids_for(model)
    one = pagoda_logits(path, ids, tmp_path / "tp1.f32", "--lora", lora, env=tp_env(1))
    two = pagoda_logits(path, ids, tmp_path / "tp2.f32", "--lora", lora, env=tp_env(2))
    err = rel(two, one)
    print(f"{adapter} {fmt}: TP=2 vs TP=1 rel {err:.3e}")
    assert err <= TP_BOUND, f"TP=2 rel err {err:.3e} > {TP_BOUND}; " + describe_worst(
        two, one, TP_BOUND)
    assert not np.array_equal(two, one), "TP=2 gave TP=1's logits bit for bit: did it split?"
    g1 = pagoda_greedy(path, ids, N_GEN, "--lora", lora, env=tp_env(1))
    g2 = pagoda_greedy(path, ids, N_GEN, "--lora", lora, env=tp_env(2))
    assert len(g1) == N_GEN and g2 == g1


# ---- the server: several adapters, one base model ----

@pytest.fixture(scope="module")
def lora_server(pagoda_bin, tiny_models, adapters):
    """`pagoda serve` on the tiny Llama's HF directory (it has a tokenizer), adapters a and b."""
    # F32 KV, the reference option: outputs are held to PEFT on transformers at 1e-5
    s = Server(tiny_models["llama"]["hf"], "--lora-modules",
               f"a={adapters('llama')},b={adapters('llama-b')}", "--kv-dtype", "f32")
    s.start()
    yield s
    s.stop()


# Prompts of 35 and 57 tokens with BOS (over 2 and 3 KV blocks of 16 tokens).
PROMPT = ("Once upon a time, in a land far away, there lived a little girl named Lily who "
          "loved to play outside in the park with her friends and her dog.")
LONG_PROMPT = ("The old lighthouse keeper climbed the spiral stairs every evening at dusk, "
               "carrying a lantern, a flask of tea and a worn notebook in which he wrote down "
               "the ships he saw, the colour of the sea and the shape of the clouds.")


def reference_text(tiny_models, adapters, model, prompt):
    """What `pagoda generate` writes for prompt alone (16 tokens, greedy, past EOS) with the
    adapter that model names ("a", "b"; anything else: none)."""
    lora = {"a": ["--lora", adapters("llama")], "b": ["--lora", adapters("llama-b")]}
    p = util.run_pagoda("generate", "-m", tiny_models["llama"]["hf"], "-p", prompt, "-n",
                        N_GEN, "--temperature", "0", "--ignore-eos", *lora.get(model, []))
    return p.stdout.decode("utf-8", "replace")


def complete(server, prompt, model=None, stream=False):
    body = {"prompt": prompt, "max_tokens": N_GEN, "temperature": 0, "ignore_eos": True}
    if model is not None:
        body["model"] = model
    if not stream:
        r = requests.post(server.url("/v1/completions"), json=body, timeout=300)
        assert r.status_code == 200, r.text
        c = r.json()["choices"][0]
        assert c["finish_reason"] == "length" and r.json()["usage"]["completion_tokens"] == N_GEN
        assert model is None or r.json()["model"] == model, r.json()  # the name asked for
        return c["text"]
    with requests.post(server.url("/v1/completions"), json=dict(body, stream=True), stream=True,
                       timeout=300) as r:
        assert r.status_code == 200, r.text
        text = ""
        for ev in sse_events(r.iter_lines()):
            if ev == "[DONE]":
                break
            text += "".join(c["text"] for c in ev["choices"])
        return text


def n_tokens(server, prompt):
    r = requests.post(server.url("/tokenize"), json={"prompt": prompt}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["count"]


def base_id(server):
    r = requests.get(server.url("/v1/models"), timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["data"][0]["id"]


def test_lora_server_models(lora_server, tiny_models, adapters):
    """/v1/models: the base model first, then each adapter (id its name, parent the base model,
    root its directory); the listing still matches OpenAI's schema. An unknown model name is
    the error it was (404, as OpenAI and vLLM answer; param "model", code model_not_found, the name in the message)."""
    r = requests.get(lora_server.url("/v1/models"), timeout=30)
    assert r.status_code == 200, r.text
    validate(r.json(), "ListModelsResponse")
    data = r.json()["data"]
    base = Path(tiny_models["llama"]["hf"]).name  # an HF directory's model id: its name
    assert [m["id"] for m in data] == [base, "a", "b"], data
    for m, name in zip(data[1:], ("llama", "llama-b")):
        assert m["object"] == "model" and m["parent"] == base, m
        assert m["root"] in (str(adapters(name)), os.path.realpath(adapters(name))), m
    r = requests.post(lora_server.url("/v1/completions"),
                      json={"model": "no-such-adapter", "prompt": [5, 6], "max_tokens": 1},
                      timeout=30)
    assert r.status_code == 404, r.text
    err = r.json()["error"]
    assert err["param"] == "model" and err["code"] == "model_not_found", err
    assert "no-such-adapter" in err["message"], err


def test_lora_server_concurrent(lora_server, tiny_models, adapters):
    """The same request (a 35-token prompt: over 2 KV blocks of 16) with the base model (by its
    name and with no "model"), a and b, three times each plus once streamed, all at once: every
    answer is its own model's `pagoda generate` alone (and carries the model name asked for),
    and the three models' answers differ."""
    assert n_tokens(lora_server, PROMPT) > 32
    base = base_id(lora_server)
    refs = {m: reference_text(tiny_models, adapters, m, PROMPT) for m in (base, "a", "b")}
    assert len(set(refs.values())) == 3, f"the adapters do not change the answer: {refs}"
    jobs = [(m, stream) for m in (base, "a", "b") for stream in (False, False, False, True)]
    jobs += [(None, False), (None, True)]
    with ThreadPoolExecutor(len(jobs)) as pool:
        texts = list(pool.map(lambda j: complete(lora_server, PROMPT, *j), jobs))
    for (m, stream), text in zip(jobs, texts):
        want = refs[m or base]
        assert text == want, f"model {m!r} (stream {stream}): {text!r} != alone {want!r}"


def test_lora_server_prefix_cache_per_adapter(lora_server, tiny_models, adapters):
    """A 57-token prompt (3 full KV blocks) in turn with the base model, a, the base model, a,
    b: each answer is its model's answer alone. The prefix cache is per adapter: a's first run
    and b's take no prompt token from it (the base model's KV of the same prompt is not
    theirs), the base model's and a's second runs do (so the cache is in play)."""
    assert n_tokens(lora_server, LONG_PROMPT) > 48
    base = base_id(lora_server)
    refs = {m: reference_text(tiny_models, adapters, m, LONG_PROMPT) for m in (base, "a", "b")}
    assert len(set(refs.values())) == 3, f"the adapters do not change the answer: {refs}"

    def hits():
        return lora_server.metrics()["pagoda:prefix_cache_hits_total"]

    for m, cached in ((base, False), ("a", False), (base, True), ("a", True), ("b", False)):
        before = hits()
        text = complete(lora_server, LONG_PROMPT, m)
        took = hits() - before
        assert text == refs[m], f"{m}: {text!r} != alone {refs[m]!r} (prefix hits {took})"
        if cached:
            assert took > 0, f"{m}: the second run of the prompt took nothing from the cache"
        else:
            assert took == 0, f"{m}: took {took} prompt tokens from another model's cache"


# ---- bad adapters ----

def _edit_config(**changes):
    def edit(d):
        p = d / "adapter_config.json"
        cfg = json.loads(p.read_text())
        for k, v in changes.items():
            cfg[k] = v(cfg[k]) if callable(v) else v
        p.write_text(json.dumps(cfg, indent=2))
    return edit


def _with_tensors(**shapes):
    """Adds (or replaces) tensors of adapter_model.safetensors: name suffix after
    base_model.model. -> shape."""
    def edit(d):
        from safetensors.torch import load_file, save_file
        p = d / "adapter_model.safetensors"
        sd = load_file(str(p))
        for k, shape in shapes.items():
            k = "base_model.model." + k
            sd[k] = 0.01 * torch.ones(shape)
        save_file(sd, str(p), metadata={"format": "pt"})
    return edit


def _truncate(n):
    def edit(d):
        p = d / "adapter_model.safetensors"
        data = p.read_bytes()
        p.write_bytes(data[:n if n > 0 else len(data) // 2])
    return edit


def _remove(*names):
    def edit(d):
        for n in names:
            (d / n).unlink()
    return edit


# case -> (what the directory is: an edit of a copy of the good Llama adapter, "missing" (no
# such directory) or another adapter's name (a copy of it, whole); what the error must name,
# any of: "dir", "config" (adapter_config.json), "weights" (adapter_model.safetensors), "bin"
# (adapter_model.bin))
BAD = {
    "missing-dir": ("missing", ("dir",)),
    "empty-dir": (_remove("adapter_config.json", "adapter_model.safetensors", "README.md"),
                  ("dir",)),
    "no-config": (_remove("adapter_config.json"), ("config",)),
    "bin-only": (lambda d: (d / "adapter_model.safetensors").rename(d / "adapter_model.bin"),
                 ("weights", "bin")),
    # peft's own adapters of embed_tokens and lm_head (beside the 7 projections)
    "target-embed_tokens": ("llama-embed", ("config", "weights")),
    "target-lm_head": ("llama-lm_head", ("config", "weights")),
    # an lm_head LoRA in the file that adapter_config.json does not list
    "lm_head-tensor": (_with_tensors(**{"lm_head.lora_A.weight": (8, 64),
                                        "lm_head.lora_B.weight": (32000, 8)}), ("weights",)),
    "modules_to_save": (_edit_config(modules_to_save=["lm_head"]), ("config",)),
    "use_dora": (_edit_config(use_dora=True), ("config",)),
    "bias-all": (_edit_config(bias="all"), ("config",)),
    "bias-lora_only": (_edit_config(bias="lora_only"), ("config",)),
    "rank_pattern": (_edit_config(rank_pattern={"q_proj": 8}), ("config",)),
    "alpha_pattern": (_edit_config(alpha_pattern={"q_proj": 32}), ("config",)),
    # the Qwen3 adapter (same targets, made for head_dim 32: q/k/v outputs twice the Llama's)
    "other-model": ("qwen3", ("weights",)),
    # k_proj's B as if the model had 4 KV heads (64 rows where the tiny Llama's k is 32)
    "k-lora_B-rows": (_with_tensors(**{"model.layers.1.self_attn.k_proj.lora_B.weight":
                                       (64, 8)}), ("weights",)),
    # down_proj's A reading a 256-wide intermediate (the tiny Llama's is 128)
    "down-lora_A-cols": (_with_tensors(**{"model.layers.0.mlp.down_proj.lora_A.weight":
                                          (8, 256)}), ("weights",)),
    "truncated-half": (_truncate(0), ("weights",)),
    "truncated-header": (_truncate(20), ("weights",)),
}
COMMANDS = ("logits", "generate", "serve")


def names(err, d, kinds):
    """Whether err names one of kinds' paths: the whole path, or the directory and the file's
    name."""
    for kind in kinds:
        if kind == "dir":
            if str(d) in err:
                return True
            continue
        f = {"config": "adapter_config.json", "weights": "adapter_model.safetensors",
             "bin": "adapter_model.bin"}[kind]
        if str(d / f) in err or (str(d) in err and f in err):
            return True
    return False


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("case", list(BAD))
def test_bad_adapter(pagoda_bin, tiny_models, adapters, tmp_path, case, command):
    """Each bad adapter (an edit of a copy of a good one) makes logits, generate and serve (as
    the second of two --lora-modules) exit with a status (not a signal), with an error on
    stderr naming the offending file, and no crash or sanitizer report."""
    edit, kinds = BAD[case]
    d = tmp_path / "adapter"
    if edit != "missing":
        shutil.copytree(adapters(edit if isinstance(edit, str) else "llama"), d)
        if callable(edit):
            edit(d)
    model = tiny_models["llama"]["hf"]
    if command == "logits":
        args = ["logits", "-m", model, "--ids", "1 2 3", "--out", tmp_path / "x.f32", "--lora", d]
    elif command == "generate":
        args = ["generate", "-m", model, "--ids", "1 2 3", "-n", "2", "--temperature", "0",
                "--lora", d]
    else:
        args = ["serve", "-m", model, "--port", "0", "-t", "1", "--lora-modules",
                f"good={adapters('llama')},bad={d}"]
    p = subprocess.run([str(util.PAGODA)] + [str(a) for a in args], capture_output=True,
                       timeout=30, stdin=subprocess.DEVNULL)
    err = p.stderr.decode("utf-8", "replace")
    assert p.returncode != 0, f"{case} {command}: accepted (exit 0):\n{err[-2000:]}"
    assert p.returncode > 0, f"{case} {command}: killed by signal {-p.returncode}:\n{err[-2000:]}"
    assert err.strip(), f"{case} {command}: exit {p.returncode} with nothing on stderr"
    for marker in SANITIZER_MARKERS + ("Sanitizer", "Segmentation"):
        assert marker not in err, f"{case} {command}: {marker!r} in stderr:\n{err[-4000:]}"
    assert names(err, d, kinds), (f"{case} {command}: the error names none of {kinds} under "
                                  f"{d}:\n{err[-2000:]}")


@pytest.mark.parametrize("spec,why", [
    ("a", "is not NAME=DIR"),
    ("=DIR", "is not NAME=DIR"),
    ("a=", "is not NAME=DIR"),
    ("a=D1,a=D2", "is taken"),
    ("a b=D", "is not NAME=DIR"),
    ('q"x=D', "has a space, quote"),
])
def test_lora_modules_syntax(pagoda_bin, tiny_models, spec, why):
    """A malformed --lora-modules list (no NAME=DIR, a name taken twice or by the model, a name
    that could not go into JSON as it is) stops `pagoda serve` before it loads anything, with one
    line saying what is wrong."""
    model = tiny_models["llama"]["hf"]
    args = ["serve", "-m", model, "--port", "0", "--lora-modules"] + spec.split(" ")
    p = subprocess.run([str(util.PAGODA)] + [str(a) for a in args], capture_output=True,
                       timeout=30, stdin=subprocess.DEVNULL)
    err = p.stderr.decode("utf-8", "replace")
    assert p.returncode > 0, err
    assert "--lora-modules" in err and why in err, err


def test_lora_modules_base_name_taken(pagoda_bin, tiny_models, adapters):
    """An adapter may not take the base model's name (requests for it would be ambiguous)."""
    model = tiny_models["llama"]["hf"]
    p = subprocess.run([str(util.PAGODA), "serve", "-m", str(model), "--port", "0",
                        "--served-model-name", "m", "--lora-modules", f"m={adapters('llama')}"],
                       capture_output=True, timeout=30, stdin=subprocess.DEVNULL)
    err = p.stderr.decode("utf-8", "replace")
    assert p.returncode > 0 and "is taken" in err, err


def test_lora_batch(pagoda_bin, tiny_models, adapters, tmp_path):
    """`pagoda batch --lora-modules`: each line runs with the adapter its "model" names, or
    without (no "model", or the model's own name: its directory's base name), all in one run,
    each line's tokens those of `generate` alone; an unknown name is that line's error and the
    other lines still run."""
    path = tiny_models["llama"]["hf"]
    ids = ids_for("llama")[:20]
    base = Path(path).name
    want = {m: pagoda_greedy(path, ids, N_GEN, *extra) for m, extra in
            (("a", ["--lora", adapters("llama")]), ("b", ["--lora", adapters("llama-b")]),
             (None, []))}
    assert len({tuple(v) for v in want.values()}) == 3
    models = ["a", None, "b", base, "a", "nope", "b"]
    lines = []
    for i, m in enumerate(models):
        line = {"id": i, "prompt": ids, "max_tokens": N_GEN, "temperature": 0,
                "ignore_eos": True}
        if m is not None:
            line["model"] = m
        lines.append(json.dumps(line))
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("\n".join(lines) + "\n")
    util.run_pagoda("batch", "-m", path, "--input", inp, "--output", out, "--no-progress",
                    "--lora-modules", f"a={adapters('llama')}", f"b={adapters('llama-b')}")
    got = [json.loads(x) for x in out.read_text().splitlines()]
    assert [g["id"] for g in got] == list(range(len(models)))
    for g, m in zip(got, models):
        if m == "nope":
            assert "error" in g and "model" in g["error"]["message"], g
            continue
        assert g["token_ids"] == want[None if m == base else m], (m, g)


def test_lora_metrics(pagoda_bin, tiny_models, adapters):
    """/metrics carries vLLM's lora_requests_info: max_lora, and the adapters with running and
    with waiting requests (one sequence runs at a time here, so a request for b with n = 3 has
    b both running and waiting), empty again when they finish; its value is the Unix time, as
    vLLM's."""
    import re
    import threading
    import time
    s = Server(tiny_models["llama"]["hf"], "--max-num-seqs", "1", "--lora-modules",
               f"a={adapters('llama')},b={adapters('llama-b')}")
    s.start()
    try:
        def info():
            text = requests.get(s.url("/metrics"), timeout=10).text
            m = re.search(r'^pagoda:lora_requests_info\{[^}]*max_lora="(\d+)",'
                          r'running_lora_adapters="([^"]*)",waiting_lora_adapters="([^"]*)"\} '
                          r'(\S+)$', text, re.M)
            assert m, text
            assert abs(float(m[4]) - time.time()) < 60, m[0]
            return m.groups()[:3]

        assert info() == ("2", "", "")
        body = {"model": "b", "prompt": [1, 450, 4996], "max_tokens": 400, "n": 3,
                "temperature": 0, "ignore_eos": True}
        t = threading.Thread(target=lambda: requests.post(s.url("/v1/completions"), json=body,
                                                          timeout=300))
        t.start()
        seen = set()
        while t.is_alive():
            seen.add(info())
        t.join()
        assert ("2", "b", "b") in seen, seen
        assert info() == ("2", "", "")
    finally:
        s.stop()


# ---- adapters loaded and unloaded while serving (vLLM's runtime LoRA updating) ----

def lora_post(server, route, **body):
    return requests.post(server.url(route), json=body, timeout=60)


def test_runtime_lora_routes_off_by_default(lora_server, adapters):
    """Without --allow-runtime-lora-updating the routes do not exist (as in vLLM)."""
    r = lora_post(lora_server, "/v1/load_lora_adapter", lora_name="c",
                  lora_path=str(adapters("llama")))
    assert r.status_code == 404, r.text
    r = lora_post(lora_server, "/v1/unload_lora_adapter", lora_name="a")
    assert r.status_code == 404, r.text


def test_runtime_lora_load_unload(pagoda_bin, tiny_models, adapters):
    """Load an adapter, serve it, unload it, load another one under a new name into the freed
    slot: each answer is its adapter's answer alone, the new adapter takes nothing from the old
    one's prefix cache (a load is a new namespace, whatever its slot), and names, errors and
    /v1/models follow vLLM's routes."""
    s = Server(tiny_models["llama"]["hf"], "--allow-runtime-lora-updating", "--max-loras", "1")
    s.start()
    try:
        base = base_id(s)
        refs = {m: reference_text(tiny_models, adapters, m, LONG_PROMPT) for m in ("a", "b")}
        r = lora_post(s, "/v1/load_lora_adapter", lora_name="a", lora_path=str(adapters("llama")))
        assert r.status_code == 200 and r.text == "Success: LoRA adapter 'a' added successfully."
        assert [m["id"] for m in requests.get(s.url("/v1/models"), timeout=30).json()["data"]] \
            == [base, "a"]
        # the same name again, the model's own name, a bad directory, no slot left
        for name, path, code, words in (
                ("a", adapters("llama"), 400, "already been loaded"),
                (base, adapters("llama"), 400, "already been loaded"),
                ("c", "/no/such/dir", 400, "/no/such/dir"),
                ("c", adapters("llama-b"), 400, "slots are taken")):
            r = lora_post(s, "/v1/load_lora_adapter", lora_name=name, lora_path=str(path))
            assert r.status_code == code and words in r.json()["error"]["message"], r.text
        r = lora_post(s, "/v1/load_lora_adapter", lora_name="c")
        assert r.status_code == 400 and r.json()["error"]["param"] == "lora_path", r.text
        assert complete(s, LONG_PROMPT, "a") == refs["a"]
        assert complete(s, LONG_PROMPT, "a") == refs["a"]  # now from a's prefix cache
        r = lora_post(s, "/v1/unload_lora_adapter", lora_name="a")
        assert r.status_code == 200 and r.text == "Success: LoRA adapter 'a' removed successfully."
        r = lora_post(s, "/v1/unload_lora_adapter", lora_name="a")
        assert r.status_code == 404 and "cannot be found" in r.json()["error"]["message"]
        r = requests.post(s.url("/v1/completions"),
                          json={"model": "a", "prompt": "Hi", "max_tokens": 2}, timeout=30)
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found", r.text
        r = lora_post(s, "/v1/load_lora_adapter", lora_name="b",
                      lora_path=str(adapters("llama-b")))
        assert r.status_code == 200, r.text
        before = s.metrics()["pagoda:prefix_cache_hits_total"]
        assert complete(s, LONG_PROMPT, "b") == refs["b"]
        assert s.metrics()["pagoda:prefix_cache_hits_total"] == before, "b got a's cached KV"
    finally:
        s.stop()


def test_runtime_lora_unload_while_running(pagoda_bin, tiny_models, adapters):
    """Unloading an adapter while a request streams with it: the request finishes with the
    adapter (its whole answer is the adapter's answer alone), new requests for it are refused,
    and its slot takes a new adapter once it is done."""
    s = Server(tiny_models["llama"]["hf"], "--allow-runtime-lora-updating", "--max-loras", "1")
    s.start()
    try:
        n = 400
        assert lora_post(s, "/v1/load_lora_adapter", lora_name="a",
                         lora_path=str(adapters("llama"))).status_code == 200
        want = util.run_pagoda("generate", "-m", tiny_models["llama"]["hf"], "-p", PROMPT, "-n",
                               n, "--temperature", "0", "--ignore-eos", "--lora",
                               adapters("llama")).stdout.decode("utf-8", "replace")
        body = {"model": "a", "prompt": PROMPT, "max_tokens": n, "temperature": 0,
                "ignore_eos": True, "stream": True}
        text, unloaded = "", None
        with requests.post(s.url("/v1/completions"), json=body, stream=True, timeout=300) as r:
            assert r.status_code == 200, r.text
            for ev in sse_events(r.iter_lines()):
                if ev == "[DONE]":
                    break
                text += "".join(c["text"] for c in ev["choices"])
                if unloaded is None:  # after the first chunk: the request runs
                    unloaded = lora_post(s, "/v1/unload_lora_adapter", lora_name="a")
        assert unloaded is not None and unloaded.status_code == 200, unloaded
        assert text == want
        r = requests.post(s.url("/v1/completions"),
                          json={"model": "a", "prompt": "Hi", "max_tokens": 2}, timeout=30)
        assert r.status_code == 404, r.text  # model_not_found, as OpenAI
        r = lora_post(s, "/v1/load_lora_adapter", lora_name="b",
                      lora_path=str(adapters("llama-b")))
        assert r.status_code == 200, r.text  # the one slot was freed when the request ended
    finally:
        s.stop()


@pytest.mark.skipif(not os.environ.get("PAGODA_ASAN_BUILD"), reason="PAGODA_ASAN_BUILD is not set")
def test_lora_server_asan(tiny_models, adapters):
    """The LoRA paths under AddressSanitizer + UBSan + LeakSanitizer: a --lora-modules adapter
    and one loaded at run time, requests of the base model and both adapters at once (tensor
    parallel on two CPU ranks), a bad load, an unload while its request streams, a reload into
    the freed slot, SIGTERM: exit 0 and no sanitizer report."""
    binary = Path(os.environ["PAGODA_ASAN_BUILD"]) / "pagoda"
    env = {"ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0:halt_on_error=1",
           "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
           "PAGODA_TENSOR_PARALLEL": "2"}
    s = Server(tiny_models["llama"]["hf"], "--allow-runtime-lora-updating", "--max-loras", "2",
               "--lora-modules", f"a={adapters('llama')}", binary=binary, env=env,
               ready_timeout=300)
    s.start()
    try:
        assert lora_post(s, "/v1/load_lora_adapter", lora_name="b",
                         lora_path=str(adapters("llama-b"))).status_code == 200
        assert lora_post(s, "/v1/load_lora_adapter", lora_name="c",
                         lora_path="/no/such/dir").status_code == 400
        jobs = [(m, stream) for m in (None, "a", "b") for stream in (False, True)]
        with ThreadPoolExecutor(len(jobs)) as pool:
            texts = list(pool.map(lambda j: complete(s, PROMPT, *j), jobs))
        assert len(set(texts)) == 3
        body = {"model": "b", "prompt": PROMPT, "max_tokens": 64, "temperature": 0,
                "ignore_eos": True, "stream": True}
        with requests.post(s.url("/v1/completions"), json=body, stream=True, timeout=300) as r:
            for i, _ in enumerate(sse_events(r.iter_lines())):
                if i == 0:
                    assert lora_post(s, "/v1/unload_lora_adapter",
                                     lora_name="b").status_code == 200
        assert lora_post(s, "/v1/load_lora_adapter", lora_name="b2",
                         lora_path=str(adapters("llama-b"))).status_code == 200
        assert complete(s, PROMPT, "b2") == texts[4]
    finally:
        s.stop()  # asserts exit 0 and no ASan/LSan/UBSan report


def test_lora_embeddings(lora_server, refs):
    """/v1/embeddings with "model": an adapter is the adapter's model's last hidden state (after
    the final norm), L2-normalized, as PEFT on transformers computes it; the base model's differs
    from it."""
    ids = ids_for("llama")[:24]
    pm = refs("llama", "llama").model  # PeftModel: its inner model carries the adapter's layers
    with torch.no_grad():
        h = pm.base_model.model.model(torch.tensor([ids])).last_hidden_state[0, -1]
    want = h.double().numpy() / np.linalg.norm(h.double().numpy())
    got = {}
    for m in ("a", None):
        body = {"input": [ids]}
        if m:
            body["model"] = m
        r = requests.post(lora_server.url("/v1/embeddings"), json=body, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["model"] == (m or base_id(lora_server))
        got[m] = np.array(r.json()["data"][0]["embedding"])
    err = np.abs(got["a"] - want).max()
    assert err < 1e-5, err
    assert np.abs(got[None] - want).max() > 100 * err + 1e-3


@pytest.mark.skipif(not os.environ.get("PAGODA_ASAN_BUILD"), reason="PAGODA_ASAN_BUILD is not set")
def test_lora_runtime_churn_asan(tiny_models, adapters):
    """Adapters loaded and unloaded over and over while requests for them stream in, under
    ASan/UBSan/LSan: every request is answered, with 200 (and then its adapter's answer, or the
    base model's) or 404 model_not_found (its adapter was unloaded); nothing crashes, leaks or
    hangs, and the server stops cleanly."""
    import random
    import threading
    binary = Path(os.environ["PAGODA_ASAN_BUILD"]) / "pagoda"
    env = {"ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0:halt_on_error=1",
           "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1"}
    s = Server(tiny_models["llama"]["hf"], "--allow-runtime-lora-updating", "--max-loras", "2",
               "--max-num-seqs", "4", binary=binary, env=env, ready_timeout=300)
    s.start()
    try:
        base = base_id(s)
        want = {m: reference_text(tiny_models, adapters, m, PROMPT) for m in (base, "a", "b")}
        paths = {"a": adapters("llama"), "b": adapters("llama-b")}
        stop = threading.Event()
        codes = []

        def churn():
            rng = random.Random(1)
            while not stop.is_set():
                name = rng.choice("ab")
                lora_post(s, "/v1/load_lora_adapter", lora_name=name, lora_path=str(paths[name]))
                lora_post(s, "/v1/unload_lora_adapter", lora_name=rng.choice("ab"))

        def ask(i):
            m = (base, "a", "b")[i % 3]
            body = {"model": m, "prompt": PROMPT, "max_tokens": N_GEN, "temperature": 0,
                    "ignore_eos": True}
            r = requests.post(s.url("/v1/completions"), json=body, timeout=300)
            codes.append(r.status_code)
            if r.status_code == 200:
                assert r.json()["choices"][0]["text"] == want[m]
            else:
                assert r.status_code == 404 and m != base, r.text
                assert r.json()["error"]["code"] == "model_not_found", r.text

        t = threading.Thread(target=churn)
        t.start()
        try:
            with ThreadPoolExecutor(6) as pool:
                list(pool.map(ask, range(60)))
        finally:
            stop.set()
            t.join()
        assert codes.count(200) >= 20, codes
    finally:
        s.stop()  # asserts exit 0 and no ASan/LSan/UBSan report
