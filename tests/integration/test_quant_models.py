"""Every quantized GGUF weight type Pagoda reads, end to end.

A small random Llama (dim 256, so the K-quants' 256-element rows fit) is written as one GGUF
whose 16 weight matrices cycle through the 12 quantized types (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
IQ4_XS, IQ4_NL, Q5_0, Q5_1, Q4_0, Q4_1, Q8_0), as llama.cpp's mixed files (Q4_K_M: Q4_K, Q6_K
and, for rows that are not a multiple of 256, Q5_0) do. The reference is transformers on the
same matrices as gguf-py decodes them (gguf.quants.dequantize): both sides hold the same
weights, and Pagoda computes with F32 activations, so the logits must agree as tightly as an
F32 model's (test_forward.F32_BOUND) and greedy decoding token for token.
"""
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
import make_tiny_models as mtm  # noqa: E402
import util  # noqa: E402
from test_forward import F32_BOUND, Q8_0_BOUND, describe_worst  # noqa: E402

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as T  # noqa: E402
from ggml_encode import encode  # noqa: E402

torch.set_num_threads(2)

TYPES = [T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_XS, T.IQ4_NL, T.Q5_0, T.Q5_1, T.Q4_0,
         T.Q4_1, T.Q8_0]
SPEC = dict(arch="llama", vocab="ggml-vocab-llama-spm.gguf",
            config=dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                        max_position_embeddings=512, vocab_size=32000, rope_theta=10000.0,
                        rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1,
                        eos_token_id=2, hidden_act="silu"))
N_PROMPT, N_GEN = 48, 32


class Mixed:
    """The model with its matrices cycling through types (TYPES by default), written to
    out/NAME.gguf, and its transformers reference (bench/gpu/make_models.py writes one of
    K-quants alone too)."""

    def __init__(self, out, types=TYPES, name="quantmix"):
        import transformers
        config, _ = mtm.hf_config("quantmix", SPEC)
        torch.manual_seed(mtm.SEED)
        model = transformers.LlamaForCausalLM(config).to(torch.float32).eval()
        mtm.init_weights(model, "llama", torch.Generator().manual_seed(mtm.SEED + 7))
        # the tiny models' N(0, 0.25^2) linears are sized for dim 64; at 256 the same per-row
        # gain needs half the spread
        with torch.no_grad():
            for k, p in model.named_parameters():
                if p.ndim == 2 and "embed" not in k:
                    p.mul_(0.5)
        sd = {k: v.contiguous() for k, v in model.state_dict().items()}
        cfg = SPEC["config"]
        names = [n for n, a in mtm.gguf_tensors(sd, "llama", cfg) if a.ndim == 2]
        self.types = {n: types[i % len(types)] for i, n in enumerate(names)}
        self.path = out / f"{name}.gguf"
        vocab = mtm.read_gguf_kv(mtm.VOCAB_DIR / SPEC["vocab"])
        mtm.write_gguf(self.path, SPEC, sd, vocab, "mixed", types=self.types)
        # the reference: each HF matrix through the same encoder (per block, so it commutes
        # with the converter's Q/K row permutation) and gguf-py's decoder
        rounded = {}
        for k, v in sd.items():
            [(gname, _)] = list(mtm.gguf_tensors({k: v}, "llama", cfg))
            if gname in self.types:
                t, a = self.types[gname], v.numpy()
                a = gguf.quants.dequantize(encode(a, t), t).reshape(a.shape)
                rounded[k] = torch.from_numpy(np.ascontiguousarray(a, np.float32))
            else:
                rounded[k] = v
        model.load_state_dict(rounded)
        self.model = model
        rng = np.random.default_rng(77)
        self.ids = rng.integers(3, cfg["vocab_size"], size=N_PROMPT).tolist()

    @torch.no_grad()
    def logits(self, ids):
        return self.model(torch.tensor([ids])).logits[0].numpy()


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    return Mixed(tmp_path_factory.mktemp("quantmix"))


def pagoda_logits(m, ids, tmp_path, *extra, env=None):
    out = tmp_path / "logits.f32"
    # F32 KV: the reference option, for the bounds against the reference logits
    p = util.run_pagoda("logits", "-m", m.path, "--ids", " ".join(map(str, ids)), "--out", out,
                        "--kv-dtype", "f32", *extra, env=env)
    n_vocab = int(p.stdout.split()[-1])
    return np.fromfile(out, dtype="<f4").reshape(len(ids), n_vocab)


def test_every_type_is_used(mixed):
    assert len(mixed.types) == 16 and set(mixed.types.values()) == set(TYPES)


@pytest.mark.parametrize("extra", [(), ("--weights-f32",)], ids=["quantized", "weights-f32"])
def test_logits(pagoda_bin, mixed, tmp_path, extra):
    """F32 activations (PAGODA_INT8_ACT=0, the reference) on the quantized blocks, and the
    weights widened at load: the F32 bound."""
    import os
    ref = mixed.logits(mixed.ids)
    a = pagoda_logits(mixed, mixed.ids, tmp_path, *extra,
                      env=dict(os.environ, PAGODA_INT8_ACT="0"))
    rel = float(np.abs(a - ref).max() / np.abs(ref).max())
    print(f"mixed {extra}: rel err {rel:.3e}, argmax agreement "
          f"{np.mean(a.argmax(1) == ref.argmax(1)):.3f}")
    assert rel <= F32_BOUND, describe_worst(a, ref, F32_BOUND)


@pytest.mark.parametrize("mode", ["1", None], ids=["all", "default"])
def test_logits_int8_activations(pagoda_bin, mixed, tmp_path, mode):
    """PAGODA_INT8_ACT=1: the Q4_0/Q4_1/Q8_0 and Q4_K..Q6_K matrices take 8-bit activations,
    the new types keep F32 ones; unset (the default): only Q4_K..Q6_K do. The activation
    rounding costs what it does on Q8_0 files (test_forward.Q8_0_BOUND)."""
    import os
    env = dict(os.environ)
    env.pop("PAGODA_INT8_ACT", None)
    if mode:
        env["PAGODA_INT8_ACT"] = mode
    ref = mixed.logits(mixed.ids)
    a = pagoda_logits(mixed, mixed.ids, tmp_path, env=env)
    rel = float(np.abs(a - ref).max() / np.abs(ref).max())
    print(f"mixed int8 activations ({mode or 'default'}): rel err {rel:.3e}")
    assert rel <= Q8_0_BOUND, describe_worst(a, ref, Q8_0_BOUND)
    if mode is None:  # the K-quants' rounding shows: not the F32 path
        f32 = pagoda_logits(mixed, mixed.ids, tmp_path, env=dict(env, PAGODA_INT8_ACT="0"))
        assert not np.array_equal(a, f32)


def test_greedy(pagoda_bin, mixed):
    p = util.run_pagoda("generate", "-m", mixed.path, "--ids", " ".join(map(str, mixed.ids)),
                        "-n", N_GEN, "--temperature", "0", "--ignore-eos", "--print-ids")
    got = [int(x) for x in p.stdout.split()]
    model = mixed.model
    model.generation_config.eos_token_id = None
    with torch.no_grad():
        out = model.generate(torch.tensor([mixed.ids]), do_sample=False, max_new_tokens=N_GEN,
                             pad_token_id=0,
                             attention_mask=torch.ones(1, N_PROMPT, dtype=torch.long))
    want = out[0, N_PROMPT:].tolist()
    print(f"distinct tokens generated: {len(set(want))}")
    assert got == want
