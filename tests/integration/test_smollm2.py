"""The default model (SmolLM2-135M-Instruct, GGUF Q4_1) against transformers reading the same file.

transformers dequantizes every Q4_1/Q8_0/F32 tensor to float32, so it is the reference for
Pagoda's --weights-f32 path (which does the same) and, within a stated margin, for the fast
path that keeps weights quantized and quantizes activations to 8 bits.
"""
import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
import util  # noqa: E402

torch.set_num_threads(2)

N_GEN = 32
CHAT = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain in one sentence why the sky is blue.",
    "List three prime numbers.",
]
PLAIN = [
    "The quick brown fox",
    "Once upon a time, in a small village,",
    "def fibonacci(n):\n",
    "The three laws of thermodynamics are",
]


@pytest.fixture(scope="module")
def reference(default_model):
    """Prompt ids, transformers' greedy continuations and its logits over prompt+continuation,
    cached under util.CACHE keyed by the model file's size and the prompts."""
    key = hashlib.sha256(json.dumps([default_model.stat().st_size, CHAT, PLAIN, N_GEN]).encode())
    cache = util.CACHE / f"smollm2-ref-{key.hexdigest()[:16]}"
    if not (cache / "done").exists():
        from transformers import AutoModelForCausalLM, AutoTokenizer
        d, f = str(default_model.parent), default_model.name
        tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
        model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32).eval()
        model.generation_config.eos_token_id = None  # like --ignore-eos
        prompts = [tok.apply_chat_template([{"role": "user", "content": c}], tokenize=False,
                                           add_generation_prompt=True) for c in CHAT] + PLAIN
        seqs, logits = [], []
        for text in prompts:
            ids = tok.encode(text, add_special_tokens=False)
            with torch.no_grad():
                out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=N_GEN,
                                     pad_token_id=0, attention_mask=torch.ones(1, len(ids), dtype=torch.long))
                cont = out[0, len(ids):].tolist()
                logits.append(model(torch.tensor([ids + cont])).logits[0].numpy())
            seqs.append(dict(text=text, prompt=ids, cont=cont))
        cache.mkdir(parents=True, exist_ok=True)
        (cache / "seqs.json").write_text(json.dumps(seqs))
        np.save(cache / "logits.npy", np.concatenate(logits))
        (cache / "done").write_text("")
    seqs = json.loads((cache / "seqs.json").read_text())
    logits = np.load(cache / "logits.npy", mmap_mode="r")
    return seqs, logits


def test_greedy_weights_f32_matches_transformers(pagoda_bin, default_model, reference):
    seqs, _ = reference
    mismatches = []
    for s in seqs:
        p = util.run_pagoda("generate", "-m", default_model, "--ids", " ".join(map(str, s["prompt"])),
                            "-n", N_GEN, "--temperature", "0", "--ignore-eos", "--print-ids",
                            "--weights-f32")
        got = [int(x) for x in p.stdout.split()]
        if got != s["cont"]:
            i = next((i for i, (a, b) in enumerate(zip(got, s["cont"])) if a != b), len(got))
            mismatches.append(f"{s['text'][:40]!r}: first difference at step {i}: "
                              f"pagoda {got[i:i + 4]} vs transformers {s['cont'][i:i + 4]}")
    assert not mismatches, "\n".join(mismatches)


def test_quantized_path_teacher_forced(pagoda_bin, default_model, reference, tmp_path):
    """Pagoda's fast path (Q4_1 weights, activations quantized to 8 bits per block of 32) under
    teacher forcing over every prompt + reference continuation (~400 positions).

    The activation rounding moves every logit a little. Let err be the |logit difference| over
    all positions and tokens, and B = 2 * p99.9(err). Pagoda can only pick token b over the
    reference's best a if ref[a] - ref[b] <= |err_a| + |err_b|; with both errors at or below
    their 99.9th percentile that is a gap below B. So: the arg-max must agree at >= 99% of
    positions, and every disagreement must be a near-tie with reference top-2 gap < B; a
    disagreement at a wider gap means an error far outside the usual rounding noise there.
    """
    seqs, ref = reference
    parts = []
    for s in seqs:
        ids = s["prompt"] + s["cont"]
        out = tmp_path / "logits.f32"
        p = util.run_pagoda("logits", "-m", default_model, "--ids", " ".join(map(str, ids)), "--out", out)
        n_vocab = int(p.stdout.split()[-1])
        parts.append(np.fromfile(out, dtype="<f4").reshape(len(ids), n_vocab))
    got = np.concatenate(parts)
    ref = np.asarray(ref)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    err = np.abs(got - ref)
    p999 = float(np.quantile(err, 0.999))
    bound = 2 * p999
    top2 = np.sort(ref, axis=1)[:, -2:]
    gap = top2[:, 1] - top2[:, 0]
    agree = got.argmax(1) == ref.argmax(1)
    print(f"\n{len(ref)} positions: arg-max agreement {agree.mean():.4f}; |logit diff| max "
          f"{err.max():.4f}, p99.9 {p999:.4f}, mean {err.mean():.4f}; max|ref| {np.abs(ref).max():.2f}; "
          f"disagreements (position, ref top-2 gap): "
          f"{[(int(i), round(float(gap[i]), 4)) for i in np.flatnonzero(~agree)]}; bound B {bound:.4f}")
    assert agree.mean() >= 0.99, f"arg-max agrees at only {agree.mean():.4f} of positions"
    wide = [(int(i), float(gap[i])) for i in np.flatnonzero(~agree) if gap[i] >= bound]
    assert not wide, f"arg-max differs where the reference's top-2 gap is >= B={bound:.4f}: {wide}"
