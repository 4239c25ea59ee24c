"""Pagoda's forward pass against transformers on tiny random Llama, Llama-3-rope, Qwen2, Qwen3
(QK-norm), SmolLM3 (NoPE layers), Mixtral, Qwen3-MoE and Qwen2-MoE (mixtures of experts, the
last with a shared expert), Mistral (sliding-window attention) and Qwen2 with a sliding window on
one of its two layers.

Every model is read in each form Pagoda loads (HF safetensors directory, GGUF F32 / F16 / Q8_0)
and compared with transformers on the same token ids: teacher-forced logits over a 64-token
prompt, and 64-token greedy continuations.
"""
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
import util  # noqa: E402

torch.set_num_threads(2)

MODELS = ("llama", "llama3rope", "qwen2", "qwen3", "smollm3", "mixtral", "qwen3moe", "qwen2moe",
          "mistral", "qwen2swa", "gemma3", "gemma2")
N_PROMPT = 64
N_GEN = 64

# Relative error is max|pagoda - ref| / max|ref| over all 64 x n_vocab logits.
# F32 everywhere: both sides sum the same products in a different order; float32 rounding
# (2^-24 per op, a few hundred accumulations, two layers) stays near 1e-6, so 1e-4 leaves two
# orders of magnitude and still catches any real mistake (a wrong rope pair, bias or eps
# moves logits by O(1) on this network).
F32_BOUND = 1e-4
# F16 weights against transformers on the same F16-rounded weights: the weights agree exactly,
# and what is left is how Pagoda multiplies them. If it converts activations to F16 (as ggml's
# CPU F16 dot does) it adds rounding of the same size as rounding the weights, which on these
# models moves logits by 1.7e-3 of max|ref| (measured, see make_tiny_models.init_weights);
# 1e-2 allows ~5x that and is still ~100x below what a misread tensor does.
F16_BOUND = 1e-2
# Q8_0 against transformers on the dequantized Q8_0 weights: again the weights agree exactly;
# Pagoda also quantizes each activation row to 8 bits per block of 32 (as ggml's Q8_0 dot
# does). That is the same format applied to the other operand, and rounding the weights to
# Q8_0 moved logits by 2.7e-2..3.3e-2 of max|ref| on these models (measured); activation
# rounding at the same relative precision should cost about as much, so the bound is 3x that.
Q8_0_BOUND = 1e-1
# Loading a quantized file with --weights-f32 dequantizes at load and then runs the F32 path,
# so it must match transformers on the dequantized weights as tightly as F32 does.
BOUNDS = {"hf": F32_BOUND, "F32": F32_BOUND, "F16": F16_BOUND, "Q8_0": Q8_0_BOUND,
          "F16-weights-f32": F32_BOUND, "Q8_0-weights-f32": F32_BOUND}
FORMATS = tuple(BOUNDS)
# (model, format) pairs: qwen2swa has no GGUF forms (GGUF carries no per-layer windows).
CASES = [(n, f) for f in FORMATS for n in MODELS if f == "hf" or n != "qwen2swa"]


def prompt_ids(name, n_vocab):
    # Random ids below the vocabulary's special tokens (Qwen2's start at 151643, Llama's
    # <unk> <s> </s> are 0..2), seeded per model.
    lo, hi = (3, n_vocab) if n_vocab != 151936 else (0, 151643)
    rng = np.random.default_rng(20240 + sum(map(ord, name)))
    return rng.integers(lo, hi, size=N_PROMPT).tolist()


def model_path(m, fmt):
    return m["hf_dir"] if fmt == "hf" else m["gguf_" + fmt.split("-")[0]]


def extra_args(fmt):
    return ["--weights-f32"] if fmt.endswith("weights-f32") else []


def q8_0_round(t):
    """t rounded to Q8_0 and back by the gguf package's own quantizer (the one that wrote the
    file)."""
    import gguf
    a = t.detach().to(torch.float32).numpy()
    q = gguf.quants.quantize(a, gguf.GGMLQuantizationType.Q8_0)
    return torch.from_numpy(gguf.quants.dequantize(q, gguf.GGMLQuantizationType.Q8_0).copy())


class Refs:
    """transformers reference models for one tiny model, one per weight format."""

    def __init__(self, name, m):
        from transformers import AutoConfig, AutoModelForCausalLM
        from safetensors.torch import load_file, save_file

        self.name, self.m = name, m
        self.f32 = AutoModelForCausalLM.from_pretrained(m["hf_dir"], dtype=torch.float32).eval()
        self.config = AutoConfig.from_pretrained(m["hf_dir"])
        sd = self.f32.state_dict()

        def rounded(k, v):  # what the GGUF files keep in F32: 1-D tensors, the MoE routers
            return v.ndim >= 2 and not k.endswith(("mlp.gate.weight", "shared_expert_gate.weight"))
        # The F16 GGUF keeps 1-D tensors (norms, biases) in F32; round the rest, as the file does.
        self.f16 = self._with({k: (v.half().float() if rounded(k, v) else v) for k, v in sd.items()})
        # transformers dequantizes the Q8_0 GGUF itself. The result is cached: reading GGUF
        # metadata with the gguf package takes seconds for these vocabularies. The GGUF
        # carries no rope_scaling (llama3 rope lives in rope_freqs.weight, which transformers
        # ignores), so the weights go into a model built from the HF config.
        cache = Path(m["hf_dir"]).parent / "refs" / f"{name}.Q8_0.dequantized.safetensors"
        if "gguf_Q8_0" not in m:
            return
        if m["arch"] in ("qwen3", "smollm3", "mixtral", "qwen3_moe", "qwen2_moe", "mistral",
                         "gemma3_text", "gemma2"):
            # transformers reads no smollm3 GGUF, reads qwen3 ones without their key_length
            # (it builds 128-wide heads), and these MoE files not as llama.cpp writes them: round
            # the weights as the file does instead (Q8_0 rounds each row's blocks of 32, so it
            # commutes with the converter's Q/K row permutation and with stacking the experts),
            # norms, 1-D tensors and routers kept F32
            self.q8 = self._with({k: (q8_0_round(v) if rounded(k, v) else v) for k, v in sd.items()})
            return
        if not cache.exists():
            d, f = m["gguf_Q8_0"].rsplit("/", 1)
            g = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
            cache.parent.mkdir(exist_ok=True)
            qsd = {k: v.detach().clone().contiguous() for k, v in g.state_dict().items()}
            save_file(qsd, str(cache.with_suffix(".tmp")))
            cache.with_suffix(".tmp").rename(cache)
        self.q8 = self._with(load_file(str(cache)))

    def _with(self, sd):
        model = type(self.f32)(self.config).to(torch.float32).eval()
        missing, unexpected = model.load_state_dict(sd, strict=False)
        assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
        if self.config.tie_word_embeddings:
            model.tie_weights()
        return model

    def model(self, fmt):
        return {"hf": self.f32, "F32": self.f32, "F16": self.f16,
                "Q8_0": getattr(self, "q8", None)}[fmt.split("-")[0]]

    @torch.no_grad()
    def logits(self, fmt, ids):
        return self.model(fmt)(torch.tensor([ids])).logits[0].numpy()

    @torch.no_grad()
    def greedy(self, fmt, ids):
        model = self.model(fmt)
        model.generation_config.eos_token_id = None  # like --ignore-eos: eos is just a token
        out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=N_GEN,
                             pad_token_id=0, attention_mask=torch.ones(1, len(ids), dtype=torch.long))
        return out[0, len(ids):].tolist()


@pytest.fixture(scope="module")
def refs(tiny_models):
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = Refs(name, tiny_models[name])
        return cache[name]
    return get


def pagoda_logits(model, ids, extra, tmp_path):
    # F32 KV, the reference option, for the bounds against transformers (the default, F16, is
    # held to transformers' greedy text below)
    out = tmp_path / "logits.f32"
    p = util.run_pagoda("logits", "-m", model, "--ids", " ".join(map(str, ids)),
                        "--out", out, "--kv-dtype", "f32", *extra)
    n_vocab = int(p.stdout.split()[-1])
    a = np.fromfile(out, dtype="<f4")
    assert a.size == len(ids) * n_vocab, (a.size, len(ids), n_vocab)
    return a.reshape(len(ids), n_vocab)


def pagoda_greedy(model, ids, extra):
    p = util.run_pagoda("generate", "-m", model, "--ids", " ".join(map(str, ids)), "-n", N_GEN,
                        "--temperature", "0", "--ignore-eos", "--print-ids", *extra)
    return [int(x) for x in p.stdout.split()]


def describe_worst(a, ref, bound):
    """Where Pagoda and the reference part: the first position over the bound, the worst logit."""
    d = np.abs(a - ref)
    per_pos = d.max(1) / np.abs(ref).max()
    i, j = np.unravel_index(d.argmax(), d.shape)
    return (f"first position over the bound: {int(np.argmax(per_pos > bound))}; worst at position "
            f"{i}, token {j}: pagoda {a[i, j]:.6g} vs ref {ref[i, j]:.6g}; per-position rel err "
            f"(first 8): {np.array2string(per_pos[:8], precision=2)}")


@pytest.mark.parametrize("name,fmt", CASES)
def test_logits(pagoda_bin, tiny_models, refs, name, fmt, tmp_path):
    r = refs(name)
    ids = prompt_ids(name, r.config.vocab_size)
    ref = r.logits(fmt, ids)
    a = pagoda_logits(model_path(tiny_models[name], fmt), ids, extra_args(fmt), tmp_path)
    assert a.shape == ref.shape
    rel = float(np.abs(a - ref).max() / np.abs(ref).max())
    print(f"{name} {fmt}: rel err {rel:.3e} (bound {BOUNDS[fmt]:.0e}), "
          f"argmax agreement {np.mean(a.argmax(1) == ref.argmax(1)):.3f}")
    assert rel <= BOUNDS[fmt], f"{name} {fmt}: rel err {rel:.3e} > {BOUNDS[fmt]}; " + describe_worst(a, ref, BOUNDS[fmt])


@pytest.mark.parametrize("name,fmt", CASES)
def test_greedy(pagoda_bin, tiny_models, refs, name, fmt, tmp_path):
    """Greedy continuations.

    Exact formats (F32, HF dir, --weights-f32) must reproduce transformers' generate() token for
    token. For F16/Q8_0 a different token is allowed only at a near-tie. The reference is
    teacher-forced on Pagoda's own tokens (after a flip the two continuations are different
    texts, so comparing later positions with generate() would say nothing), and so is Pagoda
    (`pagoda logits`). Let err be |pagoda - ref| over all those logits and margin
    = 2 * p99.9(err): Pagoda can only prefer b over the reference's best a if
    ref[a] - ref[b] <= |err_a| + |err_b|, which for errors at or below their 99.9th percentile
    is below the margin. Checked at every step: ref[pagoda token] >= max(ref) - margin. It
    implies agreement with generate() up to the first near-tie.
    """
    r = refs(name)
    ids = prompt_ids(name, r.config.vocab_size)
    got = pagoda_greedy(model_path(tiny_models[name], fmt), ids, extra_args(fmt))
    assert len(got) == N_GEN, got
    want = r.greedy(fmt, ids)
    assert len(want) == N_GEN
    first_diff = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
    print(f"{name} {fmt}: first difference from generate() at step {first_diff}")
    if BOUNDS[fmt] == F32_BOUND:
        assert got == want, f"{name} {fmt}: differs from generate() first at step {first_diff}"
        return
    ref = r.logits(fmt, ids + got)[len(ids) - 1:-1]  # row i predicts got[i]
    pg = pagoda_logits(model_path(tiny_models[name], fmt), ids + got, extra_args(fmt), tmp_path)
    margin = 2 * float(np.quantile(np.abs(pg[len(ids) - 1:-1] - ref), 0.999))
    short = ref.max(1) - ref[np.arange(N_GEN), got]
    bad = [i for i in range(N_GEN) if short[i] > margin]
    ties = [(i, round(float(short[i]), 4)) for i in range(N_GEN) if 0 < short[i] <= margin]
    print(f"  near-tie choices (step, ref gap): {ties}; margin {margin:.3f}")
    assert not bad, (f"{name} {fmt}: at steps {bad} Pagoda chose a token the reference ranks "
                     f"{[round(float(short[i]), 3) for i in bad]} below its best (margin {margin:.3f})")


@pytest.mark.parametrize("name", MODELS)
def test_greedy_tensor_parallel(pagoda_bin, tiny_models, refs, name):
    """Tensor parallel over the CPU's in-process communicator, two ranks (two heads and one KV
    head each; Qwen3's QK-norm gains go to both, SmolLM3's NoPE layer is one on both, every
    expert's FFN columns are split in two and the router is whole on both): the F32
    file's greedy continuation is still transformers' own, token for token."""
    r = refs(name)
    ids = prompt_ids(name, r.config.vocab_size)
    got = pagoda_greedy(model_path(tiny_models[name], "F32" if name != "qwen2swa" else "hf"), ids,
                        ["--tensor-parallel-size", "2"])
    assert got == r.greedy("F32", ids)


def test_mixtral_split_experts_gguf(pagoda_bin, tiny_models, refs, tmp_path):
    """Mixtral GGUFs converted before llama.cpp stacked the experts (early 2024) name each
    expert's matrices (blk.N.ffn_gate.E.weight, ...): the same weights written that way give
    the stacked file's logits bit for bit."""
    import make_tiny_models as mt
    spec = mt.SPECS["mixtral"]
    sd = refs("mixtral").f32.state_dict()
    path = tmp_path / "mixtral-split.F32.gguf"
    mt.write_gguf(path, spec, sd, mt.read_gguf_kv(mt.VOCAB_DIR / spec["vocab"]), "F32",
                  split_experts=True)
    ids = prompt_ids("mixtral", spec["config"]["vocab_size"])
    split = pagoda_logits(path, ids, [], tmp_path)
    stacked = pagoda_logits(tiny_models["mixtral"]["gguf_F32"], ids, [], tmp_path)
    assert np.array_equal(split, stacked)


def test_sliding_window_layers_from_max_window_layers(pagoda_bin, tiny_models, refs, tmp_path):
    """A Qwen2 config.json without layer_types (as transformers 4 wrote them): the windowed
    layers are those from max_window_layers on, as transformers derives them. Without the list
    the logits are the same bit for bit; with max_window_layers 0 both layers are windowed, which
    transformers (on the same config) agrees with and which changes the logits."""
    import json
    import shutil
    from transformers import AutoModelForCausalLM
    src = Path(tiny_models["qwen2swa"]["hf"])
    d = tmp_path / "swa"
    shutil.copytree(src, d)
    cfg = json.loads((d / "config.json").read_text())
    del cfg["layer_types"]
    (d / "config.json").write_text(json.dumps(cfg))
    ids = prompt_ids("qwen2swa", cfg["vocab_size"])
    base = pagoda_logits(src, ids, [], tmp_path)
    assert np.array_equal(pagoda_logits(d, ids, [], tmp_path), base)
    cfg["max_window_layers"] = 0
    (d / "config.json").write_text(json.dumps(cfg))
    both = pagoda_logits(d, ids, [], tmp_path)
    ref = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0].numpy()
    assert float(np.abs(both - want).max() / np.abs(want).max()) <= F32_BOUND
    assert float(np.abs(both - base).max() / np.abs(base).max()) > 1e-2


@pytest.mark.parametrize("name", ["gemma2", "gemma3"])
def test_gemma_query_pre_attn_scalar(pagoda_bin, tiny_models, tmp_path, name):
    """Gemma scales attention scores by query_pre_attn_scalar^-1/2 (the 27Bs: 144 and 168 against
    head_dim 128); the tiny models' equals their head_dim. With 24 in config.json the logits
    change, and still match transformers on the same config."""
    import json
    import shutil
    from transformers import AutoModelForCausalLM
    src = Path(tiny_models[name]["hf"])
    d = tmp_path / "g"
    shutil.copytree(src, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["query_pre_attn_scalar"] = 24
    (d / "config.json").write_text(json.dumps(cfg))
    ids = prompt_ids(name, cfg["vocab_size"])
    got = pagoda_logits(d, ids, [], tmp_path)
    ref = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0].numpy()
    assert float(np.abs(got - want).max() / np.abs(want).max()) <= F32_BOUND
    base = pagoda_logits(src, ids, [], tmp_path)
    assert float(np.abs(got - base).max() / np.abs(base).max()) > 1e-2


@pytest.mark.parametrize("caps", ["absent", "null"])
def test_gemma2_softcapping_defaults(pagoda_bin, tiny_models, tmp_path, caps):
    """Gemma 2's soft-capping keys: without them transformers caps at its defaults (50 and 30),
    with null it does not cap; Pagoda reads both as transformers does."""
    import json
    import shutil
    from transformers import AutoModelForCausalLM
    d = tmp_path / "g2"
    shutil.copytree(tiny_models["gemma2"]["hf"], d)
    cfg = json.loads((d / "config.json").read_text())
    for k in ("attn_logit_softcapping", "final_logit_softcapping"):
        if caps == "absent":
            del cfg[k]
        else:
            cfg[k] = None
    (d / "config.json").write_text(json.dumps(cfg))
    ids = prompt_ids("gemma2", cfg["vocab_size"])
    got = pagoda_logits(d, ids, [], tmp_path)
    ref = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    assert ref.config.final_logit_softcapping == (30.0 if caps == "absent" else None)
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0].numpy()
    assert float(np.abs(got - want).max() / np.abs(want).max()) <= F32_BOUND


def test_mistral_layer_types(pagoda_bin, tiny_models, tmp_path):
    """A mistral config with layer_types (Ministral's layout): transformers follows the list, and
    so does Pagoda (it used to window every layer)."""
    import json
    import shutil
    from transformers import AutoModelForCausalLM
    d = tmp_path / "m"
    shutil.copytree(tiny_models["mistral"]["hf"], d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["layer_types"] = ["full_attention", "sliding_attention"]
    (d / "config.json").write_text(json.dumps(cfg))
    ids = prompt_ids("mistral", cfg["vocab_size"])
    got = pagoda_logits(d, ids, [], tmp_path)
    ref = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0].numpy()
    assert float(np.abs(got - want).max() / np.abs(want).max()) <= F32_BOUND


@pytest.mark.parametrize("fmt", ["hf", "F32"])
def test_yarn_rope_scaling(pagoda_bin, tiny_models, tmp_path, fmt):
    """YaRN (Qwen2.5/Qwen3's long-context setting): factor 4 over an original context of 32
    positions, so the ramp between extrapolated and interpolated frequencies falls inside the
    tiny Qwen3's 16 frequencies; from config.json's rope_scaling and from a GGUF's
    rope.scaling.* keys (as llama.cpp's converter writes them), against transformers."""
    import json
    import shutil
    import make_tiny_models as mt
    from transformers import AutoModelForCausalLM
    d = tmp_path / "yarn"
    shutil.copytree(tiny_models["qwen3"]["hf"], d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["rope_scaling"] = dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=32)
    (d / "config.json").write_text(json.dumps(cfg))
    ref = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    model = d
    if fmt == "F32":
        spec = dict(mt.SPECS["qwen3"], config=dict(mt.SPECS["qwen3"]["config"],
                                                    rope_scaling=cfg["rope_scaling"]))
        model = tmp_path / "yarn.F32.gguf"
        mt.write_gguf(model, spec, ref.state_dict(),
                      mt.read_gguf_kv(mt.VOCAB_DIR / spec["vocab"]), "F32")
    ids = prompt_ids("qwen3", cfg["vocab_size"])
    got = pagoda_logits(model, ids, [], tmp_path)
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0].numpy()
    assert float(np.abs(got - want).max() / np.abs(want).max()) <= F32_BOUND
    base = pagoda_logits(tiny_models["qwen3"]["hf"], ids, [], tmp_path)
    assert float(np.abs(got - base).max() / np.abs(base).max()) > 1e-2


def test_sliding_window_context(pagoda_bin, tiny_models):
    """A windowed model keeps its whole context (max_position_embeddings, 512), where it was
    once capped at the window (24): a 100-token prompt plus 300 tokens fits."""
    ids = " ".join(map(str, prompt_ids("mistral", 32000) + prompt_ids("llama", 32000)[:36]))
    p = util.run_pagoda("generate", "-m", tiny_models["mistral"]["gguf_F32"], "--ids", ids, "-n",
                        300, "--temperature", "0", "--ignore-eos", "--print-ids")
    assert len(p.stdout.split()) == 300


@pytest.mark.parametrize("name", ["mixtral", "qwen3moe", "qwen2moe"])
def test_moe_int8_activations(pagoda_bin, tiny_models, refs, name, tmp_path, monkeypatch):
    """PAGODA_INT8_ACT=1 (8-bit activations for quantized weights, as ggml's dots) runs the MoE
    models: the F32 routers and shared-expert gate beside Q8_0 experts need wider activation
    rows than the experts (leaving them out of the sizing was an assertion failure). The 8-bit
    activations move logits by up to ~0.17 of max |ref| here (a near-tie of the router flips an
    expert; the default F32 activations stay within 2e-6, test_logits), so only a finite answer
    of the right shape is asserted."""
    monkeypatch.setenv("PAGODA_INT8_ACT", "1")
    r = refs(name)
    ids = prompt_ids(name, r.config.vocab_size)
    a = pagoda_logits(tiny_models[name]["gguf_Q8_0"], ids, [], tmp_path)
    ref = r.logits("Q8_0", ids)
    assert a.shape == ref.shape and np.isfinite(a).all()
    print(f"{name} Q8_0, 8-bit activations: rel err "
          f"{float(np.abs(a - ref).max() / np.abs(ref).max()):.3e}")


# Multimodal wrappers of tiny models: (tiny model, outer model_type, transformers class, text
# config keys left out at their defaults (Gemma3TextConfig's, MistralConfig's), outer keys).
WRAPPED = {
    "gemma3": ("gemma3", "Gemma3ForConditionalGeneration",
               dict(rms_norm_eps=1e-6, rope_theta=1000000.0, rope_local_base_freq=10000.0,
                    sliding_window_pattern=6, hidden_activation="gelu_pytorch_tanh"),
               dict(mm_tokens_per_image=4, boi_token_index=31997, eoi_token_index=31998,
                    image_token_index=31999,
                    vision_config=dict(model_type="siglip_vision_model", hidden_size=16,
                                       intermediate_size=32, num_hidden_layers=1,
                                       num_attention_heads=2, image_size=28, patch_size=14))),
    "mistral": ("mistral3", "Mistral3ForConditionalGeneration",
                dict(rope_theta=10000.0),
                dict(image_token_index=31999, spatial_merge_size=2,
                     vision_config=dict(model_type="pixtral", hidden_size=16,
                                        intermediate_size=32, num_hidden_layers=1,
                                        num_attention_heads=2, head_dim=8, image_size=56,
                                        patch_size=14))),
}


@pytest.mark.parametrize("name", list(WRAPPED))
def test_multimodal_checkpoint_text_model(pagoda_bin, tiny_models, tmp_path, name):
    """Gemma 3 4B and up and Mistral Small 3.1 ship as image+text checkpoints (model_type gemma3,
    mistral3): config.json nests the text model in text_config, which leaves out the keys at
    their defaults, and the weights sit under language_model.model.* (as released, and as
    transformers 5 still saves them) or model.language_model.* (its names in memory). Pagoda
    serves the text model. The tiny Gemma 3 and Mistral rewritten that way give their own logits
    bit for bit in both layouts; transformers' *ForConditionalGeneration (text only, a random
    tiny vision tower beside it) agrees; so does the directory it saves, whose config.json is
    transformers 5's (every key; Gemma's RoPE settings per layer type in rope_parameters)."""
    import json
    import shutil
    import transformers
    from safetensors.torch import load_file, save_file
    outer_type, cls, defaults, outer = WRAPPED[name]
    src = Path(tiny_models[name]["hf"])
    text = json.loads((src / "config.json").read_text())
    for k, v in defaults.items():
        assert text.pop(k) == v, k
    for k in ("architectures", "torch_dtype"):
        text.pop(k, None)
    cfg = dict(architectures=[cls], model_type=outer_type, text_config=text, eos_token_id=2,
               **outer)

    def with_weights(d, prefix, head):
        d.mkdir()
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(src / f, d / f)
        (d / "config.json").write_text(json.dumps(cfg))
        sd = load_file(str(src / "model.safetensors"))
        save_file({(prefix + k[len("model."):] if k.startswith("model.") else head): v
                   for k, v in sd.items()}, str(d / "model.safetensors"))
        return d
    old = with_weights(tmp_path / "released", "language_model.model.",
                       "language_model.lm_head.weight")
    ids = prompt_ids(name, text["vocab_size"])
    want = pagoda_logits(src, ids, [], tmp_path)
    assert np.array_equal(pagoda_logits(old, ids, [], tmp_path), want)
    ref = getattr(transformers, cls).from_pretrained(old, dtype=torch.float32).eval()
    with torch.no_grad():
        hf = ref(input_ids=torch.tensor([ids])).logits[0].numpy()
    assert float(np.abs(want - hf).max() / np.abs(hf).max()) <= F32_BOUND
    saved = tmp_path / "saved"
    ref.save_pretrained(saved)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / f, saved / f)
    assert np.array_equal(pagoda_logits(saved, ids, [], tmp_path), want)
    renamed = with_weights(tmp_path / "renamed", "model.language_model.", "lm_head.weight")
    assert np.array_equal(pagoda_logits(renamed, ids, [], tmp_path), want)
    # kv-plan reads the nested config as the loader does (its defaults included)
    plan = lambda d: json.loads(util.run_pagoda("kv-plan", "--model-config", d / "config.json",
                                                "--json").stdout)["model"]
    assert plan(old) == plan(src)
    # transformers 5 ties by the outer tie_word_embeddings: false there wants an LM head
    if not text.get("tie_word_embeddings"):
        return
    cfg["tie_word_embeddings"] = False
    (old / "config.json").write_text(json.dumps(cfg))
    p = util.run_pagoda("logits", "-m", old, "--ids", "1 2", "--out", tmp_path / "x",
                        check=False)
    assert p.returncode != 0 and b"missing tensor 'language_model.lm_head.weight'" in p.stderr
