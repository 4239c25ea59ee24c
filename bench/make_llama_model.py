#!/usr/bin/env python3
"""Writes a Llama GGUF with a released model's layer shapes (--shape: llama-3.2-1b, hidden 2048,
32/8 heads of 64, FFN 8192, 16 layers, theta 5e5, the default; tinyllama-1.1b, hidden 2048, 32/4
heads, FFN 5632, 22 layers; llama-3-8b, hidden 4096, 32/8 heads of 128, FFN 14336, 32 layers)
and random Q8_0 weights that are all distinct bytes, with the Llama 2 vocabulary of
tests/data/vocab (32,000 tokens, not Llama 3's 128k). Every row is a multiple of
256, so bench/llamacpp_quantize.py turns it into a Q4_K_M / Q3_K_M / IQ4_XS... file without
fallback types, as llama.cpp quantizes the released 1B-8B models.

  python bench/make_llama_model.py OUT.gguf [--shape tinyllama-1.1b] [--layers N]

--layers fewer than the shape's keeps every matrix's shape (per-layer speed is the same) and
makes an 8B shape fit a quick benchmark.

Needs the test virtualenv (numpy, gguf).
"""
import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests" / "integration"))
import make_tiny_models as mt  # noqa: E402
from make_moe_model import add_dense_block, finish, q8_0, start  # noqa: E402

# dim, heads, kv heads, head dim, FFN, layers, rope theta
SHAPES = {
    "llama-3.2-1b": (2048, 32, 8, 64, 8192, 16, 5e5),
    "tinyllama-1.1b": (2048, 32, 4, 64, 5632, 22, 1e4),
    "llama-3-8b": (4096, 32, 8, 128, 14336, 32, 5e5),
}


def main():
    import gguf
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="llama-3.2-1b")
    ap.add_argument("--layers", type=int, help="default: the shape's")
    a = ap.parse_args()
    DIM, HEADS, KV_HEADS, HEAD_DIM, FFN, layers, theta = SHAPES[a.shape]
    a.layers = a.layers or layers
    vocab_kv = mt.read_gguf_kv(mt.VOCAB_DIR / "ggml-vocab-llama-spm.gguf")
    n_vocab = len(vocab_kv["tokenizer.ggml.tokens"][2])
    rng = np.random.default_rng(1)
    w = start(a.out, "llama", f"{a.shape}-shaped, {a.layers} layers, random Q8_0", a.layers,
              8192, DIM, FFN, HEADS, KV_HEADS, HEAD_DIM, theta)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_vocab_size(n_vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    mt.copy_tokenizer_kv(w, vocab_kv)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    Q8 = gguf.GGMLQuantizationType.Q8_0
    ones = np.ones(DIM, dtype=np.float32)
    w.add_tensor("token_embd.weight", q8_0(rng, n_vocab, DIM), raw_dtype=Q8)
    w.add_tensor("output_norm.weight", ones)
    w.add_tensor("output.weight", q8_0(rng, n_vocab, DIM), raw_dtype=Q8)
    for il in range(a.layers):
        b = f"blk.{il}."
        w.add_tensor(b + "attn_norm.weight", ones)
        w.add_tensor(b + "ffn_norm.weight", ones)
        add_dense_block(w, rng, b, DIM, HEADS, KV_HEADS, HEAD_DIM, FFN)
    finish(w)


if __name__ == "__main__":
    main()
