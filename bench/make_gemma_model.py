#!/usr/bin/env python3
"""Writes a Gemma GGUF with a released model's layer shapes and random Q8_0 weights that are all
distinct bytes (a dummy model's weights view one shared buffer, which a CPU's caches would
serve): the files `pagoda bench` and llama.cpp run for the Gemma figures in bench/RESULTS.md.

  python bench/make_gemma_model.py OUT.gguf --arch gemma3 [--layers 26]
  python bench/make_gemma_model.py OUT.gguf --arch gemma2 [--layers 8]

gemma3: gemma-3-1b's layers (hidden 1152, 4/1 heads of 256, FFN 6912, 512-position windows on
five layers of six); gemma2: gemma-2-2b's (hidden 2304, 8/4 heads of 256, FFN 9216, 4096-position
windows on every other layer, soft-capping at 50 and 30). Both with the Llama 2 vocabulary of
tests/data/vocab (32,000 tokens: Gemma's own 256k vocabulary is not in the repository, so the
LM head is smaller than the released models'). Needs the test virtualenv (numpy, gguf).
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

SHAPES = {  # dim, heads, kv heads, head_dim, ffn, window
    "gemma3": (1152, 4, 1, 256, 6912, 512),
    "gemma2": (2304, 8, 4, 256, 9216, 4096),
}


def main():
    import gguf
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--arch", choices=sorted(SHAPES), required=True)
    ap.add_argument("--layers", type=int, default=26)
    a = ap.parse_args()
    dim, heads, kv_heads, hd, ffn, window = SHAPES[a.arch]
    vocab_kv = mt.read_gguf_kv(mt.VOCAB_DIR / "ggml-vocab-llama-spm.gguf")
    n_vocab = len(vocab_kv["tokenizer.ggml.tokens"][2])
    rng = np.random.default_rng(1)
    w = start(a.out, a.arch, f"{a.arch}-shaped, {a.layers} layers, random Q8_0", a.layers,
              32768 if a.arch == "gemma3" else 8192, dim, ffn, heads, kv_heads, hd,
              1e6 if a.arch == "gemma3" else 1e4)
    w.add_sliding_window(window)
    if a.arch == "gemma2":
        w.add_attn_logit_softcapping(50.0)
        w.add_final_logit_softcapping(30.0)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    mt.copy_tokenizer_kv(w, vocab_kv)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    Q8 = gguf.GGMLQuantizationType.Q8_0
    ones = np.ones(dim, dtype=np.float32)
    w.add_tensor("token_embd.weight", q8_0(rng, n_vocab, dim), raw_dtype=Q8)  # tied LM head
    w.add_tensor("output_norm.weight", ones)
    for il in range(a.layers):
        b = f"blk.{il}."
        for n in ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm"):
            w.add_tensor(b + n + ".weight", ones)
        if a.arch == "gemma3":
            w.add_tensor(b + "attn_q_norm.weight", np.ones(hd, dtype=np.float32))
            w.add_tensor(b + "attn_k_norm.weight", np.ones(hd, dtype=np.float32))
        add_dense_block(w, rng, b, dim, heads, kv_heads, hd, ffn)
    finish(w)


if __name__ == "__main__":
    main()
