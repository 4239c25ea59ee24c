#!/usr/bin/env python3
"""Tokenizer speed: the general pre-tokenizer engine against the hand-written fast paths (issue 39).

For each vocabulary with a hand-written pre-tokenizer (GPT-2, SmolLM2's Digits + GPT-2, Llama 3,
Qwen2, Tekken's pattern on gpt-2's vocabulary), `pagoda tokenize --bench` is run on the same file
with the fast path and with `--general-pretok` (the same pipeline through the general regex
engine; the tests prove the pieces equal), measuring the whole encode (pre-tokenizer + BPE) and,
with --pieces, the pre-tokenizer alone. Then the families that only the general engine runs
(deepseek-llm, deepseek-coder, falcon: llama.cpp's vocabularies; gpt-4o and deepseek-v3: their
patterns on gpt-2's vocabulary). Each figure is the median of --rounds medians of `pagoda
tokenize --bench` (itself the median of five one-second runs); fast and general alternate.

Inputs: English prose (tok_corpus.py --english 1000000) and the mixed test corpus
(tok_corpus.pretok_corpus, joined by newlines, x4). The vocabularies come from the caches the
tests fill (tests/integration/test_pretok_general.py: llama-cpp-python's vocab files and the
retagged gpt-2 ones); run that test once first.

    python bench/tokenizer_pretok.py [--rounds 3] [--pagoda build/pagoda]
"""
import argparse
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "integration"))
import tok_corpus  # noqa: E402
import util  # noqa: E402

LLAMACPP = util.CACHE / "llama-cpp-python-0.3.36-vocab"
BORROWED = util.CACHE / "pretok-borrowed-0.3.36"
FAST = [
    ("GPT-2 (ggml-vocab-gpt-2)", LLAMACPP / "ggml-vocab-gpt-2.gguf"),
    ("SmolLM2 (Digits + GPT-2)", ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"),
    ("Llama 3 (ggml-vocab-llama-bpe)", ROOT / "tests" / "data" / "vocab" / "ggml-vocab-llama-bpe.gguf"),
    ("Qwen2 (ggml-vocab-qwen2, NFC)", ROOT / "tests" / "data" / "vocab" / "ggml-vocab-qwen2.gguf"),
    ("Tekken pattern (gpt-2 vocab)", BORROWED / "vocab-gpt2-as-tekken.gguf"),
]
GENERAL = [
    ("deepseek-llm (6 Splits)", LLAMACPP / "ggml-vocab-deepseek-llm.gguf"),
    ("deepseek-coder", LLAMACPP / "ggml-vocab-deepseek-coder.gguf"),
    ("falcon (steps after ByteLevel)", LLAMACPP / "ggml-vocab-falcon.gguf"),
    ("gpt-4o / o200k (gpt-2 vocab)", BORROWED / "vocab-gpt2-as-gpt-4o.gguf"),
    ("deepseek-v3 (gpt-2 vocab)", BORROWED / "vocab-gpt2-as-deepseek-v3.gguf"),
]


def mbs(pagoda, model, path, *extra):
    p = subprocess.run([str(pagoda), "tokenize", "-m", str(model), "--no-bos", "--bench",
                        str(path), *extra], capture_output=True, check=True, timeout=600)
    return float(re.match(rb"([0-9.]+) MB/s", p.stdout).group(1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pagoda", default=str(util.PAGODA))
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    files = {"English 1 MB": tmp / "en.txt", "mixed corpus": tmp / "mixed.txt"}
    files["English 1 MB"].write_text(tok_corpus.english_text(1000000), encoding="utf-8")
    files["mixed corpus"].write_text("\n".join(tok_corpus.pretok_corpus()) * 4, encoding="utf-8")
    sizes = {k: v.stat().st_size for k, v in files.items()}
    print(f"files: " + ", ".join(f"{k} {sizes[k]:,} bytes" for k in files))
    print("\n| vocabulary | file | encode fast | encode general | ratio | pre-tokenizer fast |"
          " pre-tokenizer general | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for name, model in FAST:
        if not model.exists():
            print(f"| {name} | missing: {model} |")
            continue
        for fname, path in files.items():
            r = {k: [] for k in ("ef", "eg", "pf", "pg")}
            for _ in range(a.rounds):
                r["ef"].append(mbs(a.pagoda, model, path))
                r["eg"].append(mbs(a.pagoda, model, path, "--general-pretok"))
                r["pf"].append(mbs(a.pagoda, model, path, "--pieces"))
                r["pg"].append(mbs(a.pagoda, model, path, "--pieces", "--general-pretok"))
            m = {k: statistics.median(v) for k, v in r.items()}
            print(f"| {name} | {fname} | {m['ef']:.1f} | {m['eg']:.1f} | {m['eg'] / m['ef']:.2f} |"
                  f" {m['pf']:.1f} | {m['pg']:.1f} | {m['pg'] / m['pf']:.2f} |", flush=True)
    print("\n| family (general engine only) | file | encode | pre-tokenizer |")
    print("|---|---|---|---|")
    for name, model in GENERAL:
        if not model.exists():
            print(f"| {name} | missing: {model} |")
            continue
        for fname, path in files.items():
            e = statistics.median(mbs(a.pagoda, model, path) for _ in range(a.rounds))
            p = statistics.median(mbs(a.pagoda, model, path, "--pieces") for _ in range(a.rounds))
            print(f"| {name} | {fname} | {e:.1f} | {p:.1f} |", flush=True)


if __name__ == "__main__":
    main()
