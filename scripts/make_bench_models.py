#!/usr/bin/env python3
"""Writes the benchmark models of bench/RESULTS.md (issues 3 and 6), outside the repository:

  SmolLM2-135M-Instruct.Q8_0.gguf / .F16.gguf   requantized from models/SmolLM2-135M-Instruct.Q4_1.gguf
                                                (dequantized with gguf-py, all metadata copied)
  tinyllama-1.1b-random.Q8_0.gguf / .F16.gguf   TinyLlama-1.1B shapes (hidden 2048, 22 layers,
                                                32 heads, 4 KV heads, FFN 5632, vocab 32000),
                                                random N(0, 0.02) weights, the SentencePiece
                                                tokenizer of tests/data/vocab/ggml-vocab-llama-spm.gguf
  smollm2-draft-random.Q8_0.gguf / .F32.gguf    a tiny random-weight draft for SmolLM2 (issue 6's
                                                draft-model benchmark): llama architecture, hidden 64,
                                                2 layers, 4 heads, 2 KV heads, FFN 256, vocab 49152,
                                                random N(0, 0.02) weights, and every tokenizer.* field
                                                of models/SmolLM2-135M-Instruct.Q4_1.gguf (same
                                                vocabulary, so it can draft for SmolLM2; its
                                                proposals are almost never accepted: the overhead side)

Tensors are produced, quantized and written one at a time (GGUFWriter's streaming API), so
memory stays near the size of the largest tensor. Run with a venv python that has numpy and gguf, e.g.
  ~/.cache/pagoda/venv-22175dda12c87815/bin/python scripts/make_bench_models.py [--out DIR] [--only NAME]
(--only smol-draft-q8_0 writes just the draft, in well under a minute).
"""
import argparse
import os
import sys
import time

import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT, GGUFValueType as VT

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
SPM_VOCAB = os.path.join(ROOT, "tests", "data", "vocab", "ggml-vocab-llama-spm.gguf")
FILE_TYPE = {QT.Q8_0: 7, QT.F16: 1, QT.F32: 0}  # llama_ftype: MOSTLY_Q8_0, MOSTLY_F16, ALL_F32


def encode(arr, qtype):
    """float32 (rows, cols) -> (array to write, raw_dtype or None)."""
    if qtype == QT.F16:
        return arr.astype(np.float16), None
    if qtype == QT.F32:
        return arr.astype(np.float32), None
    return gguf.quants.quantize(arr, qtype), qtype


def copy_fields(reader, writer, prefix=None, skip=()):
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in skip:
            continue
        if prefix and not key.startswith(prefix):
            continue
        vtype = VT(field.types[0])
        sub = VT(field.types[-1]) if vtype == VT.ARRAY else None
        val = field.contents()
        writer.add_key_value(key, val, vtype, sub)


def requant_smollm2(out_dir, qtype):
    r = gguf.GGUFReader(SMOL)
    arch = r.fields["general.architecture"].contents()
    path = os.path.join(out_dir, f"SmolLM2-135M-Instruct.{qtype.name}.gguf")

    def add_kv(w):
        copy_fields(r, w, skip=("general.file_type",))
        w.add_file_type(FILE_TYPE[qtype])

    tensors = []
    for t in r.tensors:
        ne = [int(x) for x in t.shape]  # ggml order: ne0 = columns
        if len(ne) == 1:
            shape, q = (1, ne[0]), QT.F32
        else:
            shape, q = (ne[1], ne[0]), qtype

        def make(t=t, q=q, shape=shape):
            f = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float32)
            arr, _ = encode(f, q)
            return arr.reshape(-1) if shape[0] == 1 else arr

        # 1-D tensors keep their 1-D shape in the file.
        tensors.append((t.name, shape if len(ne) > 1 else (ne[0],), q, make))
    write_streaming(path, arch, add_kv, tensors)
    return path


def write_streaming(path, arch, add_kv, tensors):
    """tensors: (name, (rows, cols) or (n,), type, make() -> encoded array), written in order:
    tensor infos first (sizes follow from shape and type), then each tensor as it is made."""
    fixed = []
    for name, shape, q, make in tensors:
        if len(shape) == 1:
            fixed.append((name, (1, shape[0]), q, make, True))
        else:
            fixed.append((name, shape, q, make, False))
    tmp = path + ".tmp"
    w = gguf.GGUFWriter(tmp, arch)
    add_kv(w)
    for name, (rows, cols), q, make, one_d in fixed:
        if q in (QT.F16, QT.F32):
            dt = np.dtype(np.float16 if q == QT.F16 else np.float32)
            w.add_tensor_info(name, (cols,) if one_d else (rows, cols), dt, rows * cols * dt.itemsize)
        else:
            bs, ts = gguf.GGML_QUANT_SIZES[q]
            w.add_tensor_info(name, (rows, cols // bs * ts), np.dtype(np.uint8),
                              rows * (cols // bs * ts), raw_dtype=q)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for *_, make, _one_d in fixed:
        arr = make()
        w.write_tensor_data(arr)
        del arr
    w.close()
    os.replace(tmp, path)


def random_tinyllama(out_dir, qtype, seed=1234):
    return random_llama(out_dir, qtype, f"tinyllama-1.1b-random.{qtype.name}.gguf",
                        "TinyLlama-1.1B-shaped random weights (pagoda bench)", SPM_VOCAB,
                        dim=2048, n_layer=22, n_head=32, n_kv=4, ffn=5632, vocab=32000, ctx=2048,
                        rope_base=10000.0, seed=seed)


def random_smol_draft(out_dir, qtype, seed=4321):
    """A random-weight draft with SmolLM2's exact tokenizer (all tokenizer.* fields copied)."""
    return random_llama(out_dir, qtype, f"smollm2-draft-random.{qtype.name}.gguf",
                        "SmolLM2-vocabulary random draft (pagoda bench)", SMOL,
                        dim=64, n_layer=2, n_head=4, n_kv=2, ffn=256, vocab=49152, ctx=8192,
                        rope_base=100000.0, seed=seed)


def random_llama(out_dir, qtype, fname, title, vocab_src, dim, n_layer, n_head, n_kv, ffn, vocab,
                 ctx, rope_base, seed):
    hd = dim // n_head
    vr = gguf.GGUFReader(vocab_src)
    n_tok = len(vr.fields["tokenizer.ggml.tokens"].data)
    if n_tok != vocab:
        raise SystemExit(f"{vocab_src}: {n_tok} tokens, expected {vocab}")
    path = os.path.join(out_dir, fname)

    def add_kv(w):
        w.add_name(title)
        w.add_context_length(ctx)
        w.add_embedding_length(dim)
        w.add_block_count(n_layer)
        w.add_feed_forward_length(ffn)
        w.add_head_count(n_head)
        w.add_head_count_kv(n_kv)
        w.add_rope_dimension_count(hd)
        w.add_layer_norm_rms_eps(1e-5)
        w.add_rope_freq_base(rope_base)
        w.add_vocab_size(vocab)
        w.add_file_type(FILE_TYPE[qtype])
        copy_fields(vr, w, prefix="tokenizer.")

    def rand(shape, idx):
        def make():
            rng = np.random.default_rng(seed * 1000 + idx)
            a = rng.standard_normal(shape, dtype=np.float32)
            a *= 0.02
            return encode(a, qtype)[0]
        return make

    def ones(n):
        return lambda: np.ones(n, dtype=np.float32)

    tensors = [("token_embd.weight", (vocab, dim), qtype, rand((vocab, dim), 0))]
    k = 1
    for il in range(n_layer):
        p = f"blk.{il}."
        tensors.append((p + "attn_norm.weight", (dim,), QT.F32, ones(dim)))
        for name, shape in (("attn_q", (dim, dim)), ("attn_k", (n_kv * hd, dim)),
                            ("attn_v", (n_kv * hd, dim)), ("attn_output", (dim, dim))):
            tensors.append((p + name + ".weight", shape, qtype, rand(shape, k)))
            k += 1
        tensors.append((p + "ffn_norm.weight", (dim,), QT.F32, ones(dim)))
        for name, shape in (("ffn_gate", (ffn, dim)), ("ffn_up", (ffn, dim)), ("ffn_down", (dim, ffn))):
            tensors.append((p + name + ".weight", shape, qtype, rand(shape, k)))
            k += 1
    tensors.append(("output_norm.weight", (dim,), QT.F32, ones(dim)))
    tensors.append(("output.weight", (vocab, dim), qtype, rand((vocab, dim), k)))
    write_streaming(path, "llama", add_kv, tensors)
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.expanduser("~/.cache/pagoda/bench-models"))
    ap.add_argument("--only", choices=["smol-q8_0", "smol-f16", "tiny-q8_0", "tiny-f16",
                                       "smol-draft-q8_0", "smol-draft-f32"], action="append")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    jobs = {
        "smol-q8_0": lambda: requant_smollm2(a.out, QT.Q8_0),
        "smol-f16": lambda: requant_smollm2(a.out, QT.F16),
        "tiny-q8_0": lambda: random_tinyllama(a.out, QT.Q8_0),
        "tiny-f16": lambda: random_tinyllama(a.out, QT.F16),
        "smol-draft-q8_0": lambda: random_smol_draft(a.out, QT.Q8_0),
        "smol-draft-f32": lambda: random_smol_draft(a.out, QT.F32),
    }
    for name in a.only or list(jobs):
        t = time.time()
        path = jobs[name]()
        print(f"{path}: {os.path.getsize(path) / 1e6:.1f} MB in {time.time() - t:.1f} s", flush=True)


if __name__ == "__main__":
    sys.exit(main())
