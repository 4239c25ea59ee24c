#!/usr/bin/env python3
"""Decode speed of a DeepSeek-V2-Lite-shaped model, Pagoda against llama.cpp on the same GGUF,
same threads, run alternately (issue 39).

The GGUF is written here with gguf-py as llama.cpp's converter writes `deepseek2` (one KV head
of kv_lora_rank + rope, attn_k_b / attn_v_b, stacked experts; make_tiny_deepseek.py's layout):
configs/models/DeepSeek-V2-Lite.json's shapes (hidden 2048, 16 heads, kv_lora_rank 512, rope 64,
nope 128, v 128, no q LoRA, experts of 1408 with 6 per token and 2 shared, the first layer
dense, 27 layers: llama.cpp reads a deepseek2 file without q LoRA only at V2-Lite's 26 or 27
layers) but --experts of its 64 (a token reads 6 experts' weights either way; fewer keep the
file, ~2.6 GB at 16, within a shared machine's memory) and the 32,000-token Llama 2 vocabulary
(llama.cpp loads a GGUF only with a tokenizer as large as its embedding; the LM head is 3.2x
narrower than V2-Lite's 102,400), weights random Q4_0 blocks (random quants, small scales: values do not
matter to speed, the router is F32 N(0, 0.02^2) so routing spreads over the experts).

For each round: `pagoda bench -p 0 -n N -d DEPTH -t T --kv-dtype f16` and `llama-bench -p 0
-n N -d DEPTH -t T --repack 0` (F16 KV both), the order swapping every round; prints a markdown
table of the median decode tokens/s per engine and their ratio, and the KV bytes per token of
the latent cache against per-head K/V for the full 27-layer model.

  python bench/deepseek_decode.py --llama-bench /tmp/.../llama-bench --rounds 3

Not run by CI."""
import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "integration"))


def q4_0_random(shape, rng):
    """Bytes of a Q4_0 tensor of shape (rows of shape[-1]) with random quants, scale 1e-3."""
    n = int(np.prod(shape))
    blocks = rng.integers(0, 256, size=(n // 32, 18), dtype=np.uint8)
    blocks[:, :2] = np.frombuffer(np.float16(1e-3).tobytes(), dtype=np.uint8)
    return blocks.reshape(*shape[:-1], shape[-1] // 32 * 18)


def write_model(path, cfg, layers, n_expert):
    import gguf
    import make_tiny_models as mt
    rng = np.random.default_rng(39)
    vocab_kv = mt.read_gguf_kv(mt.VOCAB_DIR / "ggml-vocab-llama-spm.gguf")
    n_vocab = len(vocab_kv["tokenizer.ggml.tokens"][2])
    d, H, r, rope = cfg["hidden_size"], cfg["num_attention_heads"], cfg["kv_lora_rank"], \
        cfg["qk_rope_head_dim"]
    nope, v, E, F = cfg["qk_nope_head_dim"], cfg["v_head_dim"], n_expert, \
        cfg["moe_intermediate_size"]
    S = cfg["n_shared_experts"] * F
    w = gguf.GGUFWriter(str(path), "deepseek2")
    w.add_name("deepseek-v2-lite-shaped")
    w.add_block_count(layers)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(d)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(H)
    w.add_head_count_kv(1)
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_expert_count(E)
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SOFTMAX)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)
    w.add_leading_dense_block_count(cfg["first_k_dense_replace"])
    w.add_vocab_size(n_vocab)
    w.add_kv_lora_rank(r)
    w.add_key_length(r + rope)
    w.add_value_length(r)
    w.add_key_length_mla(nope + rope)
    w.add_value_length_mla(v)
    w.add_expert_feed_forward_length(F)
    w.add_expert_shared_count(cfg["n_shared_experts"])
    w.add_expert_weights_scale(cfg["routed_scaling_factor"])
    w.add_rope_dimension_count(rope)
    mt.copy_tokenizer_kv(w, vocab_kv)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    Q, F32 = gguf.GGMLQuantizationType.Q4_0, gguf.GGMLQuantizationType.F32
    tensors = [("token_embd.weight", (n_vocab, d), Q), ("output_norm.weight", (d,), F32),
               ("output.weight", (n_vocab, d), Q)]
    for il in range(layers):
        b = f"blk.{il}."
        tensors += [(b + "attn_norm.weight", (d,), F32), (b + "ffn_norm.weight", (d,), F32),
                    (b + "attn_q.weight", (H * (nope + rope), d), Q),
                    (b + "attn_kv_a_mqa.weight", (r + rope, d), Q),
                    (b + "attn_kv_a_norm.weight", (r,), F32),
                    (b + "attn_k_b.weight", (H, r, nope), Q), (b + "attn_v_b.weight", (H, v, r), Q),
                    (b + "attn_output.weight", (d, H * v), Q)]
        if il < cfg["first_k_dense_replace"]:
            I = cfg["intermediate_size"]
            tensors += [(b + "ffn_gate.weight", (I, d), Q), (b + "ffn_up.weight", (I, d), Q),
                        (b + "ffn_down.weight", (d, I), Q)]
        else:
            tensors += [(b + "ffn_gate_inp.weight", (E, d), F32),
                        (b + "ffn_gate_exps.weight", (E, F, d), Q),
                        (b + "ffn_up_exps.weight", (E, F, d), Q),
                        (b + "ffn_down_exps.weight", (E, d, F), Q),
                        (b + "ffn_gate_shexp.weight", (S, d), Q),
                        (b + "ffn_up_shexp.weight", (S, d), Q),
                        (b + "ffn_down_shexp.weight", (d, S), Q)]

    def data(name, shape, t):
        if t == Q:
            return q4_0_random(shape, rng)
        if name.endswith("norm.weight"):
            return np.ones(shape, dtype=np.float32)
        return (0.02 * rng.standard_normal(shape)).astype(np.float32)
    for name, shape, t in tensors:  # the layout first, then the data one tensor at a time
        nbytes = int(np.prod(shape)) // 32 * 18 if t == Q else int(np.prod(shape)) * 4
        # (a quantized tensor's shape in bytes, as gguf-py takes it)
        bshape = (*shape[:-1], shape[-1] // 32 * 18) if t == Q else shape
        w.add_tensor_info(name, bshape, np.dtype(np.uint8 if t == Q else np.float32), nbytes,
                          raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, shape, t in tensors:
        w.write_tensor_data(data(name, shape, t))
    w.close()


def pagoda_tg(a, depth):
    out = subprocess.run([a.pagoda, "bench", "-m", a.model, "-p", "0", "-n", str(a.n), "-d",
                          str(depth), "-t", str(a.threads), "-r", str(a.reps), "--batch", "1",
                          "--kv-dtype", "f16", "--json"], check=True, capture_output=True,
                         text=True).stdout
    j = json.loads(out.strip().splitlines()[-1])
    return next(r["tokens_per_s"] for r in j["results"] if r["test"].startswith("tg"))


def llama_tg(a, depth):
    p = subprocess.run([a.llama_bench, "-m", a.model, "-p", "0", "-n", str(a.n), "-d",
                        str(depth), "-t", str(a.threads), "-r", str(a.reps), "--repack", "0",
                        "-o", "json"], capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"llama-bench failed: {p.stderr[-2000:]}")
    return next(r["avg_ts"] for r in json.loads(p.stdout) if r["n_gen"] > 0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pagoda", default=str(ROOT / "build" / "pagoda"))
    ap.add_argument("--llama-bench", required=True)
    ap.add_argument("-m", "--model", default="/tmp/deepseek-v2-lite-shaped.gguf")
    ap.add_argument("--layers", type=int, default=27)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--depths", default="0,1024")
    ap.add_argument("-n", type=int, default=32)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--reps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    cfg = json.loads((ROOT / "configs" / "models" / "DeepSeek-V2-Lite.json").read_text())
    if not os.path.exists(a.model):
        write_model(a.model + ".tmp", cfg, a.layers, a.experts)
        os.rename(a.model + ".tmp", a.model)
    L, r, rope = cfg["num_hidden_layers"], cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]
    full = 2 * L * cfg["num_attention_heads"] * (cfg["qk_nope_head_dim"] + rope + cfg["v_head_dim"])
    print(f"KV bytes per token, F16, 27 layers: latent {2 * L * (r + rope):,}, per-head K/V "
          f"{full:,} ({full / (2 * L * (r + rope)):.1f}x)")
    print("| depth | Pagoda tg tok/s | llama.cpp tg tok/s | ratio |")
    print("| --- | --- | --- | --- |")
    for depth in [int(x) for x in a.depths.split(",")]:
        p, l = [], []
        for rnd in range(a.rounds):
            if rnd % 2:
                l.append(llama_tg(a, depth))
                p.append(pagoda_tg(a, depth))
            else:
                p.append(pagoda_tg(a, depth))
                l.append(llama_tg(a, depth))
        mp, ml = statistics.median(p), statistics.median(l)
        print(f"| {depth} | {mp:.2f} | {ml:.2f} | {mp / ml:.2f} |  rounds: pagoda "
              f"{[round(x, 2) for x in p]}, llama.cpp {[round(x, 2) for x in l]}", flush=True)


if __name__ == "__main__":
    main()
