"""SmolLM2-135M with its 576-wide residual stream zero-padded to 768 (a multiple of 256, so
llama-quantize can write K-quants of it: no real model in reach has such rows); RMSNorm gains
scaled by sqrt(576/768), so the padded model computes the same function (up to eps), and
attention.key_length/value_length = 64 as 768 / 9 heads is not the head size. Writes F16.

  python bench/pad_residual.py models/SmolLM2-135M-Instruct.Q4_1.gguf smol768-f16.gguf
  llama-quantize smol768-f16.gguf smol768-q4km.gguf Q4_K_M   # Q5_K_M, Q6_K, IQ4_XS
(issue 37: the KL divergence of 8-bit activations against llama.cpp's; bench/RESULTS.md)"""
import sys, numpy as np, gguf
from gguf import GGUFReader, GGUFWriter, GGUFValueType
src, dst = sys.argv[1], sys.argv[2]
r = GGUFReader(src)
arch = "llama"
w = GGUFWriter(dst, arch)
D, P = 576, 768
for f in r.fields.values():
    name = f.name
    if name.startswith("GGUF.") or name == "general.architecture":
        continue
    t = f.types[0]
    if name == f"{arch}.embedding_length":
        w.add_uint32(name, P); continue
    if t == GGUFValueType.ARRAY:
        st = f.types[1]
        if st == GGUFValueType.STRING:
            vals = [bytes(f.parts[i]).decode("utf-8", "surrogateescape") for i in f.data]
        else:
            vals = [f.parts[i].tolist()[0] for i in f.data]
        w.add_array(name, vals)
    elif t == GGUFValueType.STRING:
        w.add_string(name, bytes(f.parts[f.data[0]]).decode("utf-8"))
    else:
        v = f.parts[f.data[0]].tolist()[0]
        w.add_key_value(name, v, t)
w.add_uint32(f"{arch}.attention.key_length", 64)
w.add_uint32(f"{arch}.attention.value_length", 64)
s = np.float32(np.sqrt(D / P))
for t in r.tensors:
    a = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
    a = a.reshape([int(x) for x in reversed(t.shape.tolist())]) if a.ndim == 1 and len(t.shape) > 1 else a
    n = t.name
    if n.endswith("norm.weight"):
        b = np.zeros(P, np.float32); b[:D] = a * s
    elif n.endswith(("attn_q.weight", "attn_k.weight", "attn_v.weight", "ffn_gate.weight", "ffn_up.weight")) or n == "token_embd.weight" or n == "output.weight":
        b = np.zeros((a.shape[0], P), np.float32); b[:, :D] = a
    elif n.endswith(("attn_output.weight", "ffn_down.weight")):
        b = np.zeros((P, a.shape[1]), np.float32); b[:D] = a
    else:
        raise SystemExit(f"unhandled {n} {a.shape}")
    w.add_tensor(n, b.astype(np.float16) if b.ndim == 2 else b)
w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
