#!/usr/bin/env python3
"""Writes GGUF files the way llama.cpp's llama-quantize does, through llama-cpp-python's
llama_model_quantize (the same library), so Pagoda can be checked and benchmarked on the
mixed-type files users download (Q4_K_M keeps some tensors in Q6_K, and rows that are not a
multiple of 256 fall back to Q5_0 / Q5_1 / Q8_0 / IQ4_NL).

  ~/.cache/pagoda/venv-llamacpp/bin/python bench/llamacpp_quantize.py SRC.gguf OUT_DIR \\
      Q4_K_M Q3_K_M Q2_K IQ4_XS ...

A quantized SRC needs --requantize (llama-quantize's --allow-requantize): the result carries
both roundings, fine for checking layouts and speed, not for judging quality.
"""
import argparse
import ctypes
import os

import llama_cpp as L

FTYPES = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "Q2_K": 10, "Q3_K_S": 11,
          "Q3_K_M": 12, "Q3_K_L": 13, "Q4_K_S": 14, "Q4_K_M": 15, "Q5_K_S": 16, "Q5_K_M": 17,
          "Q6_K": 18, "IQ4_NL": 25, "IQ4_XS": 30}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("src")
    ap.add_argument("out_dir")
    ap.add_argument("types", nargs="+", choices=sorted(FTYPES))
    ap.add_argument("--requantize", action="store_true")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    a = ap.parse_args()
    os.makedirs(a.out_dir, exist_ok=True)
    stem = os.path.splitext(os.path.basename(a.src))[0].split(".")[0]
    for t in a.types:
        p = L.llama_model_quantize_default_params()
        p.ftype = FTYPES[t]
        p.nthread = a.threads
        p.allow_requantize = a.requantize
        out = os.path.join(a.out_dir, f"{stem}.{t}.gguf")
        rc = L.llama_model_quantize(a.src.encode(), out.encode(), ctypes.byref(p))
        if rc != 0:
            raise SystemExit(f"llama_model_quantize {t} failed ({rc})")
        print(out)


if __name__ == "__main__":
    main()
