#!/usr/bin/env python3
"""Writes the extra models bench/gpu/check.sh compares CUDA with the CPU on (greedy ids of
bench/gpu/models/*.gguf, a directory git ignores: carry it to the GPU machine). Run here, with
the test virtualenv:  "$(bash scripts/setup-venv.sh)/bin/python" bench/gpu/make_models.py

- kquant.gguf: the random Llama of tests/integration/test_quant_models.py (dim 256, 2 layers,
  32k vocabulary) with every matrix in Q4_K, Q5_K or Q6_K (llama.cpp's Q4_K_M and Q5_K_M
  types): their GEMV, dequantization and embedding on the GPU end to end (kernels/qblocks.h);
- quantmix.gguf: the same model over all 12 quantized types;
- qwen3.Q8_0.gguf and smollm3.F16.gguf from tests/integration/make_tiny_models.py (QK-norm,
  NoPE layers).
"""
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "integration"))
import make_tiny_models as mtm  # noqa: E402
from gguf import GGMLQuantizationType as T  # noqa: E402
from test_quant_models import Mixed  # noqa: E402


def main():
    out = ROOT / "bench" / "gpu" / "models"
    out.mkdir(parents=True, exist_ok=True)
    Mixed(out, [T.Q4_K, T.Q5_K, T.Q6_K], "kquant")
    Mixed(out)
    tiny = mtm.default_out_dir()
    if not (tiny / ".complete").exists():
        sys.argv = [sys.argv[0], str(tiny)]
        mtm.main()
    for name in ("qwen3.Q8_0.gguf", "smollm3.F16.gguf"):
        shutil.copy(tiny / name, out / name)
    for p in sorted(out.glob("*.gguf")):
        print(f"{p.relative_to(ROOT)}: {p.stat().st_size / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
