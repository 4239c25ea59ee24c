"""DeepSeek-V2/V3 (issue 39): multi-head latent attention over the latent KV cache and DeepSeek's
experts, on tiny random models (make_tiny_deepseek.py): V2 (q LoRA, softmax routing limited to
groups, YaRN), V2-Lite's layout (one q matrix, greedy routing, tied embeddings) and V3 (sigmoid
routing with its bias, groups scored by their best two, renormalized, YaRN), each with a dense
first layer and shared experts.

Proofs: logits and greedy text against transformers in every form Pagoda loads (HF directory
in F32 and BF16, GGUF F32/F16/Q8_0 as llama.cpp's converter writes deepseek2, --weights-f32), with
test_forward.py's bounds; the latent cache's logits bit-identical at batch 1, 3, 16 and 64
(test_batch_invariance on these models); the batched engine (chunked prefill, prefix hits, a pool
small enough to preempt) equal to each request run alone; the cache's size per token and the
parameter count in kv-plan; --load-format dummy; clean refusals of what is not supported and of
malformed files.
"""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
import util  # noqa: E402
from test_engine import assert_same, chunked_equals_alone, run_batch  # noqa: E402
from test_forward import (F32_BOUND, N_GEN, describe_worst, extra_args,  # noqa: E402
                          pagoda_greedy, pagoda_logits, q8_0_round)

torch.set_num_threads(2)

MODELS = ("dsv2", "dsv2lite", "dsv3")
FORMATS = ("hf", "hf-bf16", "F32", "F16", "Q8_0", "F16-weights-f32", "Q8_0-weights-f32")
N_PROMPT = 48
# Every form against transformers on the weights its file holds (F16- or Q8_0-rounded as the
# file rounds them): Pagoda multiplies F32 activations by exactly those weights, so what is left
# is float32 summation order, as for F32 (test_forward.F32_BOUND; measured 1e-6..2e-6 here), and
# greedy text is generate()'s token for token. test_forward's wider F16/Q8_0 bounds allow for
# 8-bit activations, which these tests do not run.
BOUND = F32_BOUND


@pytest.fixture(scope="session")
def ds_models():
    script = Path(__file__).parent / "make_tiny_deepseek.py"
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, f"make_tiny_deepseek.py failed:\n{p.stderr}"
    return json.loads(p.stdout.strip().splitlines()[-1])


def model_path(m, fmt):
    if fmt == "hf-bf16":
        return bf16_dir(Path(m["hf_dir"]))
    return m["hf_dir"] if fmt == "hf" else m["gguf_" + fmt.split("-")[0]]


def kept_f32(key):
    """What a BF16 checkpoint keeps in F32: V3's routing bias (as the released one does)."""
    return key.endswith("e_score_correction_bias")


def bf16_dir(hf):
    """The HF directory as a BF16 checkpoint (every tensor BF16 but kept_f32's, config dtype
    bfloat16), written once beside it."""
    from safetensors.torch import load_file, save_file
    out = hf.parent / (hf.name + ".bf16")
    if out.is_dir():
        return out
    tmp = hf.parent / (hf.name + f".bf16.tmp{__import__('os').getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(hf, tmp)
    sd = load_file(str(hf / "model.safetensors"))
    save_file({k: v if kept_f32(k) else v.to(torch.bfloat16) for k, v in sd.items()},
              str(tmp / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((tmp / "config.json").read_text())
    cfg["torch_dtype"] = "bfloat16"
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    try:
        tmp.rename(out)
    except OSError:  # another run wrote it meanwhile
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def prompt_ids(name):
    rng = np.random.default_rng(39 + sum(map(ord, name)))
    return rng.integers(3, 32000, size=N_PROMPT).tolist()


def q8_0_kv_b(v, cfg):
    """kv_b_proj as the Q8_0 file holds it: attn_k_b (each head's K rows transposed, so its
    blocks of 32 run along qk_nope) and attn_v_b (blocks along kv_lora_rank), rounded and put
    back in transformers' layout."""
    H, nope, vd = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.v_head_dim
    kv = v.reshape(H, nope + vd, -1)
    k = q8_0_round(kv[:, :nope].transpose(1, 2).contiguous()).transpose(1, 2)
    return torch.cat([k, q8_0_round(kv[:, nope:].contiguous())], 1).reshape(v.shape)


class Refs:
    """transformers on the weights each file holds: F32, F16-rounded, Q8_0-rounded (routers,
    norms and the routing bias stay F32, as in the files)."""

    def __init__(self, m):
        from transformers import AutoModelForCausalLM
        self.f32 = AutoModelForCausalLM.from_pretrained(m["hf_dir"], dtype=torch.float32).eval()
        self.memo = {}
        cfg = self.f32.config
        sd = self.f32.state_dict()

        def rounded(k, v):
            return v.ndim >= 2 and not k.endswith("mlp.gate.weight")

        def q8(k, v):
            return q8_0_kv_b(v, cfg) if k.endswith("kv_b_proj.weight") else q8_0_round(v)
        self.models = {"F32": self.f32,
                       "BF16": self._with({k: v if kept_f32(k) else v.bfloat16().float()
                                           for k, v in sd.items()}),
                       "F16": self._with({k: v.half().float() if rounded(k, v) else v
                                          for k, v in sd.items()}),
                       "Q8_0": self._with({k: q8(k, v) if rounded(k, v) else v
                                           for k, v in sd.items()})}

    def _with(self, sd):
        model = type(self.f32)(self.f32.config).to(torch.float32).eval()
        model.load_state_dict(sd, strict=True)
        if self.f32.config.tie_word_embeddings:
            model.tie_weights()
        return model

    def model(self, fmt):
        return self.models[self.key(fmt)]

    @staticmethod
    def key(fmt):
        return {"hf": "F32", "hf-bf16": "BF16"}.get(fmt, fmt.split("-")[0])

    @torch.no_grad()
    def logits(self, fmt, ids):
        return self.model(fmt)(torch.tensor([ids])).logits[0].numpy()

    @torch.no_grad()
    def greedy(self, fmt, ids):
        key = (self.key(fmt), tuple(ids))
        if key not in self.memo:
            self.memo[key] = self._greedy(fmt, ids)
        return self.memo[key]

    def _greedy(self, fmt, ids):
        model = self.model(fmt)
        model.generation_config.eos_token_id = None
        out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=N_GEN,
                             pad_token_id=0,
                             attention_mask=torch.ones(1, len(ids), dtype=torch.long))
        return out[0, len(ids):].tolist()


@pytest.fixture(scope="module")
def refs(ds_models):
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = Refs(ds_models[name])
        return cache[name]
    return get


@pytest.mark.parametrize("name,fmt", [(n, f) for f in FORMATS for n in MODELS])
def test_logits(pagoda_bin, ds_models, refs, name, fmt, tmp_path):
    r = refs(name)
    ids = prompt_ids(name)
    ref = r.logits(fmt, ids)
    a = pagoda_logits(model_path(ds_models[name], fmt), ids, extra_args(fmt), tmp_path)
    rel = float(np.abs(a - ref).max() / np.abs(ref).max())
    print(f"{name} {fmt}: rel err {rel:.3e} (bound {BOUND:.0e})")
    assert rel <= BOUND, f"{name} {fmt}: rel err {rel:.3e}; " + describe_worst(a, ref, BOUND)


@pytest.mark.parametrize("name,fmt", [(n, f) for f in FORMATS for n in MODELS])
def test_greedy(pagoda_bin, ds_models, refs, name, fmt):
    """64 greedy tokens after the prompt: generate()'s own, token for token, in every form."""
    r = refs(name)
    ids = prompt_ids(name)
    got = pagoda_greedy(model_path(ds_models[name], fmt), ids, extra_args(fmt))
    want = r.greedy(fmt, ids)
    assert len(want) == N_GEN
    first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
    assert got == want, f"{name} {fmt}: differs from generate() first at step {first}"


def test_kv_b_unsplit_gguf(pagoda_bin, ds_models, refs, tmp_path):
    """GGUFs from converters before the absorption split carry one attn_kv_b: the same weights
    written so give the split file's logits bit for bit."""
    import make_tiny_deepseek as md
    import make_tiny_models as mt
    spec = md.SPECS["dsv3"]
    sd = md.state_dict(refs("dsv3").f32)
    path = tmp_path / "dsv3-kv_b.F32.gguf"
    md.write_gguf(path, spec, sd, mt.read_gguf_kv(mt.VOCAB_DIR / md.VOCAB), "F32",
                  split_kv_b=False)
    ids = prompt_ids("dsv3")
    assert np.array_equal(pagoda_logits(path, ids, [], tmp_path),
                          pagoda_logits(ds_models["dsv3"]["gguf_F32"], ids, [], tmp_path))


def test_routing_matters(pagoda_bin, ds_models, tmp_path):
    """The routing settings are read, not defaulted: V3's config with its groups off, or its
    bias's file tensor zeroed, gives different logits (a test model whose choices never depend
    on them would let the group and bias code go unchecked)."""
    import shutil
    ids = prompt_ids("dsv3")
    base = pagoda_logits(ds_models["dsv3"]["hf_dir"], ids, [], tmp_path)
    d = tmp_path / "nogroups"
    shutil.copytree(ds_models["dsv3"]["hf_dir"], d)
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(n_group=1, topk_group=1)
    (d / "config.json").write_text(json.dumps(cfg))
    assert float(np.abs(pagoda_logits(d, ids, [], tmp_path) - base).max()) > 1e-2


def test_batch_invariance(ds_models):
    """Each token's logits over the latent cache (F32 and F16) are bit-identical alone and in
    steps of 3, 16 and 64 tokens mixing sequences and prefill chunks (test_batch_invariance.c)."""
    exe = util.BUILD / "test_batch_invariance"
    p = subprocess.run([str(exe), ds_models["dsv2"]["gguf_F32"], ds_models["dsv3"]["gguf_Q8_0"],
                        ds_models["dsv2lite"]["hf_dir"]], capture_output=True, text=True,
                       cwd=util.ROOT, timeout=600)
    print(p.stdout)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("bit-identical at batch 1, 3, 16, 64") == 6


def requests(n=24, seed=7):
    import random
    rng = random.Random(seed)
    shared = [rng.randrange(3, 30000) for _ in range(120)]
    reqs = []
    for i in range(n):
        plen = rng.choice([1, 5, 17, 64, 130, 200])
        toks = [rng.randrange(3, 30000) for _ in range(plen)]
        if i % 3 == 0 and plen > 120:
            toks[:120] = shared
        r = {"id": i, "prompt": toks, "max_tokens": rng.randrange(1, 60), "ignore_eos": True}
        r.update(temperature=0.8, top_p=0.9, seed=i) if i % 2 else r.update(temperature=0)
        reqs.append(r)
    return reqs


@pytest.mark.parametrize("name,fmt", [("dsv2", "gguf_Q8_0"), ("dsv3", "hf_dir")])
def test_batched_equals_alone(ds_models, tmp_path, name, fmt):
    """The engine over the latent cache: prefill chunks of 16 and 512 tokens with prefix hits,
    and a pool of 24 blocks (the largest request alone fits) that forces preemption, give each
    request's output run alone, greedy and seeded sampling alike."""
    model = ds_models[name][fmt]
    reqs = requests()
    ref = chunked_equals_alone(model, tmp_path, reqs)
    # 3 layers x (32 + 16) x 2 bytes (F16, the default) = 288 bytes per token: 24 blocks of 16
    res, stats = run_batch(model, tmp_path, "small", reqs, "--kv-cache-memory", str(24 * 16 * 288),
                           "--max-num-batched-tokens", "64")
    assert stats["kv_blocks_total"] == 24
    assert stats["preemptions"] > 0, "the pool was meant to be too small"
    assert_same(res, ref)


def test_refusals(pagoda_bin, ds_models):
    """What the latent cache does not do is refused in one line naming the model: quantized KV
    types, tensor parallel."""
    m = ds_models["dsv2"]["gguf_F32"]
    for extra, words in ((["--kv-dtype", "q8_0"], "latent KV cache"),
                         (["--tensor-parallel-size", "2"], "latent attention")):
        p = util.run_pagoda("generate", "-m", m, "--ids", "1 2 3", "-n", "2", *extra,
                            check=False)
        err = p.stderr.decode().strip()
        assert p.returncode != 0 and words in err and m in err, err
        assert len(err.splitlines()) == 1, err


@pytest.mark.parametrize("name", MODELS)
def test_kv_plan(pagoda_bin, ds_models, refs, name):
    """kv-plan reads DeepSeek's shapes from the config.json and the GGUF alike: the latent
    cache's bytes per token (layers x (kv_lora_rank + rope) x element size, as the engine sizes
    its pool: test_batched_equals_alone) and transformers' own parameter count."""
    cfg = refs(name).f32.config
    n_params = sum(p.numel() for p in refs(name).f32.parameters())
    for path in (ds_models[name]["hf_dir"], ds_models[name]["gguf_F32"]):
        p = util.run_pagoda("kv-plan", "-m", path, "--kv-dtype", "f16", "--json")
        d = json.loads(p.stdout)
        assert d["kv_bytes_per_token"] == cfg.num_hidden_layers * (
            cfg.kv_lora_rank + cfg.qk_rope_head_dim) * 2
        assert d["model"]["num_parameters"] == n_params, path


def test_dummy_load(pagoda_bin, ds_models, tmp_path, monkeypatch):
    """--load-format dummy makes a DeepSeek config's weights (latent attention, dense first
    layer, experts with shared ones; Q8_0 here): greedy ids are deterministic and in the
    vocabulary, and the batched engine over them equals each request alone."""
    monkeypatch.setenv("PAGODA_DUMMY_TYPE", "Q8_0")
    cfg = Path(ds_models["dsv3"]["hf_dir"]) / "config.json"
    p = [util.run_pagoda("generate", "--load-format", "dummy", "-m", cfg, "--ids", "1 2 3", "-n",
                         "16", "--print-ids", "--temperature", "0") for _ in range(2)]
    a = [int(t) for t in p[0].stdout.split()]
    assert len(a) == 16 and all(0 <= t < 32000 for t in a)
    assert [int(t) for t in p[1].stdout.split()] == a
    reqs = requests(n=12, seed=3)
    ref, _ = run_batch(cfg, tmp_path, "alone", reqs, "--load-format", "dummy", "--max-num-seqs",
                       "1", "--no-prefix-caching")
    res, _ = run_batch(cfg, tmp_path, "batched", reqs, "--load-format", "dummy",
                       "--max-num-batched-tokens", "32")
    assert_same(res, ref)


def test_malformed_files(pagoda_bin, ds_models, refs, tmp_path):
    """A DeepSeek file missing a piece is a one-line error naming the file and the piece: a GGUF
    without layer 0's kv_b (neither attn_k_b/attn_v_b nor attn_kv_b), a config.json with
    kv_lora_rank 0."""
    import shutil
    import make_tiny_deepseek as md
    import make_tiny_models as mt
    sd = {k: v for k, v in md.state_dict(refs("dsv2").f32).items()
          if k != "model.layers.0.self_attn.kv_b_proj.weight"}
    path = tmp_path / "no-kv_b.gguf"
    md.write_gguf(path, md.SPECS["dsv2"], sd, mt.read_gguf_kv(mt.VOCAB_DIR / md.VOCAB), "F32")
    d = tmp_path / "rank0"
    shutil.copytree(ds_models["dsv2"]["hf_dir"], d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["kv_lora_rank"] = 0
    (d / "config.json").write_text(json.dumps(cfg))
    for model, words in ((path, "blk.0.attn_kv_b.weight"), (d, "kv_lora_rank")):
        p = util.run_pagoda("generate", "-m", model, "--ids", "1 2 3", "-n", "2", check=False)
        err = p.stderr.decode().strip()
        assert p.returncode != 0 and words in err and str(model) in err, err
        assert len(err.splitlines()) == 1, err
