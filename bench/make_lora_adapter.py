"""Writes a random PEFT-format LoRA adapter (adapter_config.json, adapter_model.safetensors) for
the shapes of a GGUF model, on every q/k/v/o and gate/up/down projection: what
`pagoda bench --lora` measures the cost of adapters with (the values do not matter to speed).

    python bench/make_lora_adapter.py models/SmolLM2-135M-Instruct.Q4_1.gguf /tmp/lora-r16 --rank 16
"""
import argparse
import json
from pathlib import Path

import numpy as np
from gguf import GGUFReader
from safetensors.numpy import save_file


def field(r, key):
    f = r.fields[key]
    return int(f.parts[f.data[0]][0])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("gguf")
    ap.add_argument("out")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--alpha", type=float, default=32)
    ap.add_argument("--dtype", choices=("f32", "f16"), default="f32",
                    help="the tensors' type (Pagoda keeps F16 and BF16 adapters as they are)")
    a = ap.parse_args()
    r = GGUFReader(a.gguf)
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    dim = field(r, f"{arch}.embedding_length")
    n_layer = field(r, f"{arch}.block_count")
    n_head = field(r, f"{arch}.attention.head_count")
    n_kv = field(r, f"{arch}.attention.head_count_kv")
    ffn = field(r, f"{arch}.feed_forward_length")
    hd = dim // n_head
    shapes = {"self_attn.q_proj": (n_head * hd, dim), "self_attn.k_proj": (n_kv * hd, dim),
              "self_attn.v_proj": (n_kv * hd, dim), "self_attn.o_proj": (dim, n_head * hd),
              "mlp.gate_proj": (ffn, dim), "mlp.up_proj": (ffn, dim), "mlp.down_proj": (dim, ffn)}
    rng = np.random.default_rng(0)
    t = {}
    for il in range(n_layer):
        for mod, (n_out, n_in) in shapes.items():
            p = f"base_model.model.model.layers.{il}.{mod}"
            dt = np.float16 if a.dtype == "f16" else np.float32
            t[p + ".lora_A.weight"] = rng.normal(0, 0.02, (a.rank, n_in)).astype(dt)
            t[p + ".lora_B.weight"] = rng.normal(0, 0.02, (n_out, a.rank)).astype(dt)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    save_file(t, str(out / "adapter_model.safetensors"))
    cfg = {"peft_type": "LORA", "r": a.rank, "lora_alpha": a.alpha, "bias": "none",
           "target_modules": [m.split(".")[1] for m in shapes], "modules_to_save": None}
    (out / "adapter_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    print(f"{out}: rank {a.rank}, {n_layer} layers x 7 matrices, "
          f"{sum(v.nbytes for v in t.values()) / 1e6:.1f} MB of {a.dtype.upper()}")


if __name__ == "__main__":
    main()
