#!/usr/bin/env python3
"""Writes a Qwen3-MoE GGUF with real Qwen3-30B-A3B shapes (hidden 2048, 32/4 heads of 128, 128
experts of 768, 8 per token, the 151,936-token Qwen2 vocabulary and tokenizer) but only --layers
layers, with random Q8_0 weights that are all distinct bytes (a dummy model's weights view one
shared buffer, which a CPU's caches would serve): the model `pagoda bench` and llama.cpp run for
the CPU mixture-of-experts figures in bench/RESULTS.md.

  python bench/make_moe_model.py OUT.gguf [--layers 4]

Needs the test virtualenv (numpy, gguf). Weights are Q8_0 blocks of 32 random int8 with one F16
scale (values ~N(0, 0.02)); norms are 1, the routers F32 ~N(0, 0.02) (routing near uniform).
"""
import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "integration"))
import make_tiny_models as mt  # noqa: E402

DIM, HEADS, KV_HEADS, HEAD_DIM = 2048, 32, 4, 128
EXPERTS, USED, EXPERT_FFN, VOCAB = 128, 8, 768, 151936


def q8_0(rng, *shape):
    """Random Q8_0 bytes for a tensor of `shape` (last dimension a multiple of 32)."""
    *lead, n = shape
    blocks = np.empty((*lead, n // 32, 34), dtype=np.uint8)
    blocks[..., :2] = np.full((*lead, n // 32), 0.02 / 73, dtype=np.float16).view(np.uint8).reshape(
        *lead, n // 32, 2)
    q = rng.integers(-127, 128, size=(*lead, n // 32, 32), dtype=np.int8)
    blocks[..., 2:] = q.view(np.uint8)
    return blocks.reshape(*lead, n // 32 * 34)


def start(path, arch, name, layers, ctx, dim, ffn, heads, kv_heads, head_dim, theta):
    """A GGUFWriter for `path` with the metadata every shaped benchmark model carries."""
    import gguf
    w = gguf.GGUFWriter(path, arch)
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name(name)
    w.add_block_count(layers)
    w.add_context_length(ctx)
    w.add_embedding_length(dim)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_freq_base(theta)
    w.add_layer_norm_rms_eps(1e-6)
    return w


def add_dense_block(w, rng, b, dim, heads, kv_heads, head_dim, ffn):
    """A dense layer's attention and FFN matrices (random Q8_0), in the converter's order."""
    import gguf
    Q8 = gguf.GGMLQuantizationType.Q8_0
    w.add_tensor(b + "attn_q.weight", q8_0(rng, heads * head_dim, dim), raw_dtype=Q8)
    w.add_tensor(b + "attn_k.weight", q8_0(rng, kv_heads * head_dim, dim), raw_dtype=Q8)
    w.add_tensor(b + "attn_v.weight", q8_0(rng, kv_heads * head_dim, dim), raw_dtype=Q8)
    w.add_tensor(b + "attn_output.weight", q8_0(rng, dim, heads * head_dim), raw_dtype=Q8)
    w.add_tensor(b + "ffn_gate.weight", q8_0(rng, ffn, dim), raw_dtype=Q8)
    w.add_tensor(b + "ffn_up.weight", q8_0(rng, ffn, dim), raw_dtype=Q8)
    w.add_tensor(b + "ffn_down.weight", q8_0(rng, dim, ffn), raw_dtype=Q8)


def finish(w):
    """Writes the file of a writer whose metadata and tensors are all added."""
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    import gguf
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=4)
    a = ap.parse_args()
    rng = np.random.default_rng(1)
    w = start(a.out, "qwen3moe", f"Qwen3-30B-A3B-shaped, {a.layers} layers, random Q8_0",
              a.layers, 40960, DIM, 6144, HEADS, KV_HEADS, HEAD_DIM, 1e6)
    w.add_expert_count(EXPERTS)
    w.add_expert_used_count(USED)
    w.add_expert_feed_forward_length(EXPERT_FFN)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    mt.copy_tokenizer_kv(w, mt.read_gguf_kv(mt.VOCAB_DIR / "ggml-vocab-qwen2.gguf"))
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    Q8, F32 = gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.F32
    ones = np.ones(DIM, dtype=np.float32)
    w.add_tensor("token_embd.weight", q8_0(rng, VOCAB, DIM), raw_dtype=Q8)
    w.add_tensor("output.weight", q8_0(rng, VOCAB, DIM), raw_dtype=Q8)
    w.add_tensor("output_norm.weight", ones)
    for il in range(a.layers):
        b = f"blk.{il}."
        w.add_tensor(b + "attn_norm.weight", ones)
        w.add_tensor(b + "ffn_norm.weight", ones)
        w.add_tensor(b + "attn_q_norm.weight", np.ones(HEAD_DIM, dtype=np.float32))
        w.add_tensor(b + "attn_k_norm.weight", np.ones(HEAD_DIM, dtype=np.float32))
        w.add_tensor(b + "attn_q.weight", q8_0(rng, HEADS * HEAD_DIM, DIM), raw_dtype=Q8)
        w.add_tensor(b + "attn_k.weight", q8_0(rng, KV_HEADS * HEAD_DIM, DIM), raw_dtype=Q8)
        w.add_tensor(b + "attn_v.weight", q8_0(rng, KV_HEADS * HEAD_DIM, DIM), raw_dtype=Q8)
        w.add_tensor(b + "attn_output.weight", q8_0(rng, DIM, HEADS * HEAD_DIM), raw_dtype=Q8)
        w.add_tensor(b + "ffn_gate_inp.weight",
                     (0.02 * rng.standard_normal((EXPERTS, DIM))).astype(np.float32), raw_dtype=F32)
        w.add_tensor(b + "ffn_gate_exps.weight", q8_0(rng, EXPERTS, EXPERT_FFN, DIM), raw_dtype=Q8)
        w.add_tensor(b + "ffn_up_exps.weight", q8_0(rng, EXPERTS, EXPERT_FFN, DIM), raw_dtype=Q8)
        w.add_tensor(b + "ffn_down_exps.weight", q8_0(rng, EXPERTS, DIM, EXPERT_FFN), raw_dtype=Q8)
    finish(w)


if __name__ == "__main__":
    main()
