"""--load-format dummy (random weights from a config.json alone), and the backend options every
model command shares (--device, --tensor-parallel-size, --gpu-memory-utilization), on the CPU:
generate and batch on token ids without a tokenizer, bench's JSON, serve's refusal without a
tokenizer and its text endpoints with one, the usage errors (exit 2, one line), and every
configs/models/*.json read by a command that never allocates the weights."""
import json
import os
import shutil
import subprocess

import pytest
import requests

import util
from server_util import Server

TINY = util.DATA / "dummy-tiny" / "config.json"
CONFIGS = sorted((util.ROOT / "configs" / "models").glob("*.json"))
SHARED = ["--device", "cpu", "--tensor-parallel-size", "1", "--gpu-memory-utilization", "0.5"]


def pagoda(*args, **kw):
    kw.setdefault("check", False)
    return util.run_pagoda(*args, **kw)


def one_line(p):
    err = p.stderr.decode().strip()
    assert err and "\n" not in err, err
    return err


def gen_ids(*extra):
    p = pagoda("generate", "--load-format", "dummy", "-m", TINY, "-n", "8", "--print-ids",
               "--temperature", "0", "-t", "1", *extra, check=True)
    return [int(t) for t in p.stdout.decode().split()]


def test_generate_ids_deterministic():
    a = gen_ids("--ids", "1 2 3")
    assert len(a) == 8 and all(0 <= t < 256 for t in a), a
    assert gen_ids("--ids", "1 2 3") == a


def test_generate_options_folder_and_tensor_parallel():
    ref = gen_ids("--ids", "1 2 3")
    # the config's folder works as -m; the shared options are accepted on the CPU; TP=2 (4 heads,
    # 2 KV heads) gives the same greedy ids
    p = pagoda("generate", "--load-format", "dummy", "-m", TINY.parent, "--ids", "1 2 3", "-n",
               "8", "--print-ids", "--temperature", "0", "-t", "1", *SHARED, check=True)
    assert [int(t) for t in p.stdout.decode().split()] == ref
    assert gen_ids("--ids", "1 2 3", "--tensor-parallel-size", "2") == ref
    p = pagoda("generate", "--load-format", "dummy", "-m", TINY, "--ids", "1 2 3",
               "--tensor-parallel-size", "3")
    assert p.returncode == 1 and "does not divide" in one_line(p)


MOE_KEYS = {"qwen3_moe": dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                              norm_topk_prob=True),
            "mixtral": dict(num_local_experts=4, num_experts_per_tok=2),
            "qwen2_moe": dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                              shared_expert_intermediate_size=64)}


@pytest.mark.parametrize("arch", ["qwen3", "smollm3", "qwen3_moe", "mixtral", "qwen2_moe"])
def test_dummy_architectures(arch, tmp_path):
    """The tiny config as Qwen3 (QK-norm gains of ones), SmolLM3 (a NoPE layer), Qwen3-MoE and
    Mixtral, Qwen2-MoE (experts, a shared one): dummy weights load and generate, the same ids with TP=2. (Their outputs
    are checked against transformers in test_forward.py: dummy weights make near-flat logits
    that say little.)"""
    cfg = json.loads(TINY.read_text())
    cfg.update(model_type=arch, architectures=[arch.capitalize() + "ForCausalLM"],
               num_hidden_layers=4, **MOE_KEYS.get(arch, {}))
    (tmp_path / "config.json").write_text(json.dumps(cfg))

    def ids(path, *extra):
        p = pagoda("generate", "--load-format", "dummy", "-m", path, "--ids", "1 2 3 4 5 6", "-n",
                   "8", "--print-ids", "--temperature", "0", "-t", "1", *extra, check=True)
        return [int(t) for t in p.stdout.decode().split()]
    got = ids(tmp_path / "config.json")
    assert len(got) == 8
    assert ids(tmp_path / "config.json", "--tensor-parallel-size", "2") == got


def test_generate_without_tokenizer():
    # no prompt: BOS from config.json; ids are printed even without --print-ids
    p = pagoda("generate", "--load-format", "dummy", "-m", TINY, "-n", "4", "--temperature", "0",
               "-t", "1", check=True)
    assert len(p.stdout.split()) == 4, p.stdout
    assert b"no tokenizer" in p.stderr
    p = pagoda("generate", "--load-format", "dummy", "-m", TINY, "-p", "hello", "-n", "4")
    assert p.returncode == 1 and "no tokenizer" in one_line(p)


def test_generate_device_cuda_is_clear():
    """A CPU-only build refuses --device cuda in one line; a CUDA build without a GPU falls back
    to the CPU; with a GPU it runs there. Whichever, no crash."""
    p = pagoda("generate", "--load-format", "dummy", "-m", TINY, "--ids", "1 2 3", "-n", "8",
               "--print-ids", "--temperature", "0", "-t", "1", "--device", "cuda",
               "--gpu-memory-utilization", "0.2", timeout=300)
    if p.returncode == 0:
        assert len(p.stdout.split()) == 8
    else:
        assert p.returncode == 1 and "-DPAGODA_CUDA=ON" in one_line(p)


def test_batch_token_id_prompts(tmp_path):
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text(json.dumps({"id": 1, "prompt": [1, 2, 3], "max_tokens": 8, "temperature": 0})
                   + "\n" + json.dumps({"id": 2, "prompt": "text", "max_tokens": 2}) + "\n")
    pagoda("batch", "--load-format", "dummy", "-m", TINY, "--input", inp, "--output", out,
           "--no-progress", "-t", "1", *SHARED, check=True)
    r1, r2 = [json.loads(line) for line in out.read_text().splitlines()]
    assert r1["token_ids"] == gen_ids("--ids", "1 2 3") and r1["text"] == ""
    assert "no tokenizer" in r2["error"]["message"]


def test_bench_json():
    p = pagoda("bench", "--load-format", "dummy", "-m", TINY, "-p", "16", "-n", "8", "-r", "1",
               "--batch", "1,4", "--json", "-t", "1", check=True, timeout=300)
    j = json.loads(p.stdout)
    assert [r["test"] for r in j["results"]] == ["pp16", "tg8", "batch1", "batch4"]
    assert j["weight_type"] == "BF16" and all(r["tokens_per_s"] > 0 for r in j["results"])
    # the ceilings the fractions are of: the CPU's probes here (a GPU's own on CUDA)
    assert j["device"] == "cpu" and j["bandwidth_gbs"] > 0 and j["peak_gflops"] > 0
    # probed before and after the tests; the roofline is the better reading of each
    assert j["bandwidth_gbs"] == max(j["bandwidth_gbs_before_after"])
    assert j["peak_gflops"] == max(j["peak_gflops_before_after"])
    # batchB: the longer of reading the weights once and computing B tokens' flops
    for r in j["results"][2:]:
        b = int(r["test"][len("batch"):])
        t_bw = j["weight_bytes_per_step"] / (j["bandwidth_gbs"] * 1e9)
        t_fl = 2 * j["params"] * b / (j["peak_gflops"] * 1e9)
        assert r["roofline_tokens_per_s"] == pytest.approx(b / max(t_bw, t_fl), rel=1e-3)
        assert r["bound"] == ("bandwidth" if t_bw > t_fl else "compute")


def dims256(tmp_path):
    """The tiny config with rows of 256 and 512 elements (K-quant super-blocks)."""
    cfg = json.loads(TINY.read_text())
    cfg.update(hidden_size=256, intermediate_size=512, vocab_size=512)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return tmp_path / "config.json", cfg


@pytest.mark.parametrize("dtype", ["F16", "Q8_0", "Q5_0", "IQ4_XS", "Q2_K", "Q4_K_M"])
def test_dummy_weight_types(dtype, tmp_path):
    """PAGODA_DUMMY_TYPE: every matrix in a GGUF type (Q4_K_M: Q6_K for V, down and the LM head,
    Q4_K for the rest), the bytes a step reads as gguf-py's block sizes make them, and greedy ids
    equal to those of the same weights widened to F32 (--weights-f32)."""
    gguf = pytest.importorskip("gguf")
    path, cfg = dims256(tmp_path)
    env = dict(os.environ, PAGODA_DUMMY_TYPE=dtype)
    p = pagoda("bench", "--load-format", "dummy", "-m", path, "-p", "8", "-n", "4", "-r", "1",
               "--batch", "2", "--json", "-t", "1", check=True, timeout=300, env=env)
    j = json.loads(p.stdout)
    main, other = ("Q4_K", "Q6_K") if dtype == "Q4_K_M" else (dtype, dtype)
    assert (j["weight_type"], j["head_type"]) == (main, other)

    def nbytes(name, n):
        per, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[name]]
        return n // per * size
    d, f, v, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], 2
    kv = d // cfg["num_attention_heads"] * cfg["num_key_value_heads"]
    other_n = L * (d * kv + f * d) + d * v  # V, down, the head
    main_n = L * (d * d + d * kv + d * d + 2 * d * f)  # Q, K, O, gate, up
    assert j["params"] == main_n + other_n
    assert j["weight_bytes_per_step"] == nbytes(main, main_n) + nbytes(other, other_n)
    assert all(r["tokens_per_s"] > 0 for r in j["results"])
    ids = ["generate", "--load-format", "dummy", "-m", path, "--ids", "1 2 3", "-n", "8",
           "--temperature", "0", "--print-ids", "-t", "1"]
    a = pagoda(*ids, check=True, env=env).stdout.split()
    assert len(a) == 8 and a == pagoda(*ids, "--weights-f32", check=True, env=env).stdout.split()


def test_dummy_weight_type_errors(tmp_path):
    path, _ = dims256(tmp_path)
    args = ["generate", "--load-format", "dummy", "--ids", "1 2", "-n", "2"]
    p = pagoda(*args, "-m", path, env=dict(os.environ, PAGODA_DUMMY_TYPE="Q9_9"))
    assert p.returncode != 0 and "PAGODA_DUMMY_TYPE=Q9_9 is not a weight type" in one_line(p)
    assert str(path) in one_line(p)
    # 64-element rows are no whole K-quant super-block
    p = pagoda(*args, "-m", TINY, env=dict(os.environ, PAGODA_DUMMY_TYPE="q4_k"))
    assert p.returncode != 0 and "multiples of 256 elements" in one_line(p)
    assert str(TINY) in one_line(p)


@pytest.mark.parametrize("kv_dtype,elem_bytes", [(None, 2), ("f32", 4)])
def test_bench_depth(kv_dtype, elem_bytes):
    """-d: pp and tg after a context of that many tokens; tg's roofline adds the context's K/V
    bytes to each step's weight bytes (the cache is F16 unless --kv-dtype says otherwise)."""
    cfg = json.loads(TINY.read_text())
    d = 100
    extra = ["--kv-dtype", kv_dtype] if kv_dtype else []
    p = pagoda("bench", "--load-format", "dummy", "-m", TINY, "-p", "8", "-n", "4", "-d", str(d),
               "-r", "1", "--batch", "2", "--json", "-t", "1", *extra, check=True, timeout=300)
    j = json.loads(p.stdout)
    assert j["kv_type"] == (kv_dtype or "f16").upper()
    assert [(r["test"], r["depth"]) for r in j["results"]] == [("pp8", d), ("tg4", d),
                                                               ("batch2", 0)]
    head_dim = cfg["hidden_size"] // cfg["num_attention_heads"]
    kv_bytes = (2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * head_dim * elem_bytes
                * d)
    want = j["bandwidth_gbs"] * 1e9 / (j["weight_bytes_per_step"] + kv_bytes)
    assert j["results"][1]["roofline_tokens_per_s"] == pytest.approx(want, rel=1e-3)
    if kv_dtype:
        return
    # a context past the model's (256 positions) is refused in one line
    p = pagoda("bench", "--load-format", "dummy", "-m", TINY, "-p", "8", "-n", "4", "-d", "300",
               "-t", "1")
    assert p.returncode == 1 and "context" in one_line(p)
    p = pagoda("bench", "--load-format", "dummy", "-m", TINY, "--kv-dtype", "q5_1")
    assert p.returncode == 2 and "--kv-dtype" in one_line(p)  # a usage error, as any bad value
    # q8_0 is llama.cpp's block of 32: a head of 16 cannot hold it, which one line says
    p = pagoda("bench", "--load-format", "dummy", "-m", TINY, "--kv-dtype", "q8_0", "-p", "8",
               "-n", "2", "-t", "1")
    assert p.returncode == 1 and "multiple of 32" in one_line(p)


def test_bench_tensor_parallel_and_shared_options():
    p = pagoda("bench", "--load-format", "dummy", "-m", TINY, "-p", "4", "-n", "2", "-r", "1",
               "--batch", "2", "--json", "-t", "1", *SHARED[:2], "--tensor-parallel-size", "2",
               "--gpu-memory-utilization", "0.5", check=True, timeout=300)
    assert [r["test"] for r in json.loads(p.stdout)["results"]] == ["pp4", "tg2", "batch2"]
    p = pagoda("bench", "--load-format", "dummy", "-m", TINY, "--tensor-parallel-size", "3")
    assert p.returncode == 1 and "does not divide" in one_line(p)


@pytest.mark.parametrize("cfg", CONFIGS, ids=[c.stem for c in CONFIGS])
def test_model_configs_parse(cfg):
    """kv-plan reads a config.json without allocating weights (dummy-loading an 8B+ model would
    take GBs); its view of the shapes must be the file's."""
    want = json.loads(cfg.read_text())
    p = pagoda("kv-plan", "--model-config", cfg, "--json", check=True)
    m = json.loads(p.stdout)["model"]
    deepseek = want["model_type"] in ("deepseek_v2", "deepseek_v3")
    for key, ref in [("num_layers", "num_hidden_layers"), ("hidden_size", "hidden_size"),
                     ("num_attention_heads", "num_attention_heads"),
                     ("num_key_value_heads", "num_key_value_heads"),
                     ("intermediate_size", "intermediate_size"), ("vocab_size", "vocab_size")]:
        if deepseek and key == "num_key_value_heads":  # the latent cache: one row, one "head"
            assert m[key] == 1 and m["head_dim"] == want["kv_lora_rank"] + want["qk_rope_head_dim"]
            assert p.stdout and json.loads(p.stdout)["kv_bytes_per_token"] == (
                want["num_hidden_layers"] * m["head_dim"] * 2)  # (BF16 by default)
            continue
        assert m[key] == want[ref], (key, m[key], want[ref])
    assert want["model_type"] in ("llama", "mistral", "qwen2", "qwen3", "smollm3", "mixtral",
                                  "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3")
    experts = want.get("num_local_experts",
                       want.get("num_experts", want.get("n_routed_experts", 0)))
    assert m["num_experts"] == experts
    if experts:
        assert m["num_experts_per_tok"] == want["num_experts_per_tok"]
        assert m["moe_intermediate_size"] == want.get("moe_intermediate_size",
                                                      want["intermediate_size"])
    # Parameter counts against the model cards: Qwen3-30B-A3B "30.5B in total and 3.3B
    # activated"; Mixtral 8x7B "46.7B total parameters but only uses 12.9B parameters per token"
    # (mistral.ai/news/mixtral-of-experts); Qwen1.5-MoE-A2.7B "14.3B parameters in total and
    # 2.7B activated" (qwenlm.github.io/blog/qwen-moe); DeepSeek-V3 "671B total parameters with
    # 37B activated for each token", DeepSeek-V2-Lite "15.7B total parameters" (their model
    # cards; V3's checkpoint adds its 14B multi-token-prediction module, which is not counted).
    # Active counts here leave out the input embedding (a decode step gathers rows of it),
    # which the cards count.
    card = {"Qwen3-30B-A3B": (30.5e9, 3.3e9), "Mixtral-8x7B": (46.7e9, 12.9e9),
            "Qwen1.5-MoE-A2.7B": (14.3e9, 2.7e9), "DeepSeek-V3": (671e9, 37e9),
            "DeepSeek-V2-Lite": (15.7e9, None)}.get(cfg.stem)
    if card:
        embed = want["vocab_size"] * want["hidden_size"]
        assert m["num_parameters"] == pytest.approx(card[0], rel=0.01)
        if card[1]:
            assert m["num_active_parameters"] + embed == pytest.approx(card[1], rel=0.02)


@pytest.mark.parametrize("cmd", ["generate", "batch", "serve", "bench"])
def test_usage_errors(cmd):
    for flag, bad in [("--load-format", "safetensors"), ("--gpu-memory-utilization", "0"),
                      ("--gpu-memory-utilization", "1.5"), ("--gpu-memory-utilization", "x"),
                      ("--device", "tpu"), ("--tensor-parallel-size", "0")]:
        p = pagoda(cmd, flag, bad, "-m", TINY)
        assert p.returncode == 2, (cmd, flag, bad, p.stderr)
        err = one_line(p)
        assert bad in err and flag.lstrip("-") in err, err
    help_text = pagoda(cmd, "--help", check=True).stdout.decode()
    for flag in ["--load-format", "--device", "--tensor-parallel-size", "--gpu-memory-utilization"]:
        assert flag in help_text, (cmd, flag)


def test_serve_without_tokenizer_refuses():
    p = subprocess.run([str(util.PAGODA), "serve", "--load-format", "dummy", "-m", str(TINY),
                        "--port", "0", "-t", "1"], capture_output=True, timeout=120)
    assert p.returncode == 1
    errors = [line for line in p.stderr.decode().splitlines() if not line.startswith("{")]
    assert len(errors) == 1 and "no tokenizer.json" in errors[0], p.stderr


def test_serve_with_tokenizer_beside_config(tiny_models, tmp_path):
    """A folder with config.json and tokenizer.json (a model download without its weights)."""
    src = tiny_models["llama"]["hf_dir"]
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(f"{src}/{name}", tmp_path / name)
    with Server(tmp_path, "--load-format", "dummy", "--gpu-memory-utilization", "0.5",
                "--kv-cache-memory", "16MiB") as s:
        r = requests.post(s.url("/v1/completions"), timeout=60,
                          json={"prompt": "Hello world", "max_tokens": 4, "temperature": 0})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["usage"]["completion_tokens"] == 4 and body["choices"][0]["text"]
