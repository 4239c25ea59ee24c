#!/usr/bin/env python3
"""Builds the tiny random models the forward-pass tests compare against transformers.

Each model is written twice over: as a Hugging Face directory (config.json, model.safetensors
in F32, tokenizer.json, tokenizer_config.json) and as GGUF files in F32, F16 and Q8_0 laid out
the way llama.cpp's convert_hf_to_gguf.py lays out these architectures (metadata keys, tensor
names and types, the Q/K row permutation for llama, rope_freqs for llama3 rope scaling, the
tokenizer.ggml.* keys copied from the real vocabulary GGUFs under tests/data/vocab).

Usage: make_tiny_models.py [OUT_DIR]   (default ~/.cache/pagoda/tiny-models-<script hash>)
Prints a JSON manifest (model name -> paths) on stdout; does nothing if OUT_DIR is complete.
"""
import hashlib
import json
import math
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import torch

SCRIPT = Path(__file__).resolve()
ROOT = SCRIPT.parents[2]
VOCAB_DIR = ROOT / "tests" / "data" / "vocab"
SEED = 1234

# Shapes are tiny but keep every feature the engine must get right: GQA (4 query heads share
# 2 KV heads), head_dim 16 (so the rope pairing of convert's permutation matters), rows that
# are multiples of 32 (Q8_0 blocks), and real 32k / 152k vocabularies (tokenizer, big lm_head).
COMMON = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)

SPECS = {
    # Llama 2 layout: untied lm_head, plain rope.
    "llama": dict(arch="llama", vocab="ggml-vocab-llama-spm.gguf",
                  config=dict(COMMON, vocab_size=32000, head_dim=16, rope_theta=10000.0,
                              rms_norm_eps=1e-5, tie_word_embeddings=False,
                              bos_token_id=1, eos_token_id=2, hidden_act="silu")),
    # Llama 3.1 rope scaling with original_max_position_embeddings=32: with head_dim 16 and
    # theta 1e4 the wavelengths 2*pi/theta^(-2i/16) are 6.3, 19.9, 62.8, ... so the eight
    # frequency pairs fall in all three regimes (kept: < 32/4, smoothed: 8..32, divided by 8:
    # > 32). Tied embeddings (no output.weight in the GGUF).
    "llama3rope": dict(arch="llama", vocab="ggml-vocab-llama-spm.gguf",
                       config=dict(COMMON, vocab_size=32000, head_dim=16, rope_theta=10000.0,
                                   rms_norm_eps=1e-5, tie_word_embeddings=True,
                                   bos_token_id=1, eos_token_id=2, hidden_act="silu",
                                   rope_scaling=dict(rope_type="llama3", factor=8.0,
                                                     low_freq_factor=1.0, high_freq_factor=4.0,
                                                     original_max_position_embeddings=32))),
    # Qwen2: q/k/v biases, tied embeddings, theta 1e6, the 151,936-token vocabulary (the
    # embedding is 151936 x 64 = 39 MB in F32; the tokenizer conversion is the slow part).
    "qwen2": dict(arch="qwen2", vocab="ggml-vocab-qwen2.gguf",
                  config=dict(COMMON, vocab_size=151936, rope_theta=1000000.0,
                              rms_norm_eps=1e-6, tie_word_embeddings=True,
                              bos_token_id=151643, eos_token_id=151643, hidden_act="silu",
                              use_sliding_window=False)),
    # Qwen3: no biases, RMSNorm on every Q and K head before rope (q_norm/k_norm), head_dim 32
    # apart from hidden/heads (so the heads are wider than the residual: q is 128 wide against
    # 64), an untied lm_head, the Qwen2 vocabulary as Qwen3 ships it.
    "qwen3": dict(arch="qwen3", vocab="ggml-vocab-qwen2.gguf",
                  config=dict(COMMON, vocab_size=151936, head_dim=32, rope_theta=1000000.0,
                              rms_norm_eps=1e-6, tie_word_embeddings=False,
                              bos_token_id=151643, eos_token_id=151645, hidden_act="silu",
                              use_sliding_window=False, sliding_window=None,
                              max_window_layers=2)),
    # SmolLM3: Llama with NoPE layers. Four layers so that the default pattern (no rope where
    # (layer + 1) % 4 == 0, the one llama.cpp hard-codes for smollm3 GGUF files) has one; the
    # HF config lists it in no_rope_layers as the released config.json does. Tied embeddings.
    "smollm3": dict(arch="smollm3", vocab="ggml-vocab-llama-spm.gguf",
                    config=dict(COMMON, num_hidden_layers=4, vocab_size=32000, head_dim=16,
                                rope_theta=5000000.0, rms_norm_eps=1e-6,
                                tie_word_embeddings=True, bos_token_id=1, eos_token_id=2,
                                pad_token_id=None, hidden_act="silu", no_rope_layers=[1, 1, 1, 0],
                                no_rope_layer_interval=4, use_sliding_window=False,
                                sliding_window=None)),
    # Mixtral: Llama attention, every FFN a mixture of 4 experts (intermediate_size wide), 2 per
    # token, their router weights rescaled to sum to 1. llama.cpp writes it as a llama GGUF with
    # expert_count and the experts stacked in ffn_{gate,up,down}_exps.
    "mixtral": dict(arch="mixtral", gguf_arch="llama", vocab="ggml-vocab-llama-spm.gguf",
                    config=dict(COMMON, vocab_size=32000, head_dim=16, rope_theta=1000000.0,
                                rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1,
                                eos_token_id=2, hidden_act="silu", sliding_window=None,
                                num_local_experts=4, num_experts_per_tok=2)),
    # Mistral v0.1: Llama with sliding-window attention on every layer. A 24-position window
    # (shorter than the tests' 64-token prompt, not a multiple of Pagoda's 32-position tiles);
    # the GGUF names it in llama.attention.sliding_window (llama.cpp's converter writes no such
    # key for Mistral: Pagoda reads it where present).
    "mistral": dict(arch="mistral", gguf_arch="llama", vocab="ggml-vocab-llama-spm.gguf",
                    config=dict(COMMON, vocab_size=32000, head_dim=16, rope_theta=10000.0,
                                rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1,
                                eos_token_id=2, hidden_act="silu", sliding_window=24)),
    # Qwen2 with use_sliding_window: the layers from max_window_layers on (here the second of
    # two) attend to a 40-position window, the others to everything; config.json lists them in
    # layer_types as transformers 5 writes it. Only the HF form: GGUF has no per-layer windows
    # (hf_only), and the Llama 2 vocabulary keeps it small.
    "qwen2swa": dict(arch="qwen2", vocab="ggml-vocab-llama-spm.gguf", hf_only=True,
                     config=dict(COMMON, vocab_size=32000, rope_theta=1000000.0,
                                 rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=1,
                                 eos_token_id=2, hidden_act="silu", use_sliding_window=True,
                                 sliding_window=40, max_window_layers=1,
                                 layer_types=["full_attention", "sliding_attention"])),
    # Gemma 3 (text, as gemma-3-1b): GELU (tanh) gate, the embedding scaled by sqrt(64), RMSNorm
    # gains as offsets from 1 (llama.cpp's converter adds the 1), post-attention and post-FFN norms,
    # QK-norm, attention scaled by query_pre_attn_scalar^-1/2 (head_dim, as all but 27B: GGUF files
    # do not carry it; test_forward varies it in config.json), five sliding layers (24-position
    # window, RoPE base 1e4) to one global layer (base 1e6, linear scaling by 2 as gemma-3-4b has
    # 8), tied embeddings. Six layers: llama.cpp hard-codes the one-in-six pattern for gemma3 GGUFs,
    # config.json names it (sliding_window_pattern).
    "gemma3": dict(arch="gemma3_text", gguf_arch="gemma3", vocab="ggml-vocab-llama-spm.gguf",
                   config=dict(COMMON, num_hidden_layers=6, vocab_size=32000, head_dim=16,
                               rope_theta=1000000.0, rope_local_base_freq=10000.0,
                               rope_scaling=dict(rope_type="linear", factor=2.0),
                               query_pre_attn_scalar=16, sliding_window=24,
                               sliding_window_pattern=6, hidden_activation="gelu_pytorch_tanh",
                               rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=1,
                               eos_token_id=2, pad_token_id=0, final_logit_softcapping=None,
                               attn_logit_softcapping=None)),
    # Gemma 2 (as gemma-2-2b): Gemma 3's layer without QK-norm, attention scores and final logits
    # soft-capped (at 4 and 6 here, where the tiny model's scores and logits reach them; the
    # released 50 and 30 would hardly bend them), every other layer (from the first) sliding
    # (24 positions), one RoPE base (1e4) for all. (Its 64 greedy tokens are only ~13 distinct
    # ones: the logits test carries the weight here.)
    "gemma2": dict(arch="gemma2", vocab="ggml-vocab-llama-spm.gguf",
                   config=dict(COMMON, vocab_size=32000, head_dim=16, rope_theta=10000.0,
                               query_pre_attn_scalar=16, sliding_window=24,
                               hidden_activation="gelu_pytorch_tanh", rms_norm_eps=1e-6,
                               tie_word_embeddings=True, bos_token_id=1, eos_token_id=2,
                               pad_token_id=0, attn_logit_softcapping=4.0,
                               final_logit_softcapping=6.0)),
    # Qwen3-MoE: Qwen3 attention (QK-norm, head_dim 32), 8 experts of 32 columns, 2 per token,
    # norm_topk_prob as Qwen3-30B-A3B has it; the config keys as its config.json writes them.
    "qwen3moe": dict(arch="qwen3_moe", gguf_arch="qwen3moe", vocab="ggml-vocab-qwen2.gguf",
                     config=dict(COMMON, vocab_size=151936, head_dim=32, rope_theta=1000000.0,
                                 rms_norm_eps=1e-6, tie_word_embeddings=False,
                                 bos_token_id=151643, eos_token_id=151645, hidden_act="silu",
                                 use_sliding_window=False, sliding_window=None,
                                 max_window_layers=2, num_experts=8, num_experts_per_tok=2,
                                 moe_intermediate_size=32, norm_topk_prob=True,
                                 decoder_sparse_step=1, mlp_only_layers=[])),
    # Qwen2-MoE: Qwen2 attention (q/k/v biases), 8 experts of 32 columns, 2 per token, their
    # probabilities not rescaled (norm_topk_prob false, as Qwen1.5-MoE-A2.7B), and a shared
    # expert of 64 columns behind a sigmoid gate.
    "qwen2moe": dict(arch="qwen2_moe", gguf_arch="qwen2moe", vocab="ggml-vocab-qwen2.gguf",
                     config=dict(COMMON, vocab_size=151936, rope_theta=1000000.0,
                                 rms_norm_eps=1e-6, tie_word_embeddings=False,
                                 bos_token_id=151643, eos_token_id=151643, hidden_act="silu",
                                 use_sliding_window=False, sliding_window=None,
                                 max_window_layers=2, num_experts=8, num_experts_per_tok=2,
                                 moe_intermediate_size=32, shared_expert_intermediate_size=64,
                                 norm_topk_prob=False, decoder_sparse_step=1,
                                 mlp_only_layers=[])),
}

# arch -> (transformers config class, model class) names, looked up in transformers
HF_CLASSES = {"llama": ("LlamaConfig", "LlamaForCausalLM"),
              "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
              "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
              "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM"),
              "mixtral": ("MixtralConfig", "MixtralForCausalLM"),
              "mistral": ("MistralConfig", "MistralForCausalLM"),
              "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM"),
              "gemma2": ("Gemma2Config", "Gemma2ForCausalLM"),
              "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM"),
              "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM")}
# Architectures llama.cpp's converter writes with the Q/K rows permuted (LlamaModel subclasses).
PERMUTED = ("llama", "smollm3", "mixtral", "mistral")

GGUF_TYPES = ("F32", "F16", "Q8_0")


def script_hash():
    return hashlib.sha256(SCRIPT.read_bytes()).hexdigest()[:16]


def default_out_dir():
    cache = Path(os.environ.get("PAGODA_CACHE", Path.home() / ".cache" / "pagoda"))
    return cache / f"tiny-models-{script_hash()}"


def manifest(out):
    m = {}
    for name, spec in SPECS.items():
        # "hf" is the same directory under the name test_bad_input.py uses.
        ggufs = () if spec.get("hf_only") else GGUF_TYPES
        m[name] = dict(arch=spec["arch"], hf_dir=str(out / name), hf=str(out / name),
                       **{f"gguf_{t}": str(out / f"{name}.{t}.gguf") for t in ggufs})
    return m


def hf_config(name, spec):
    """Returns (transformers config object, config.json dict in the classic on-hub layout).

    transformers 5 saves rope settings as `rope_parameters`; released checkpoints (Llama 3.x,
    Qwen2.5) carry top-level `rope_theta` and `rope_scaling`, so config.json is written that way.
    """
    import transformers
    arch = spec["arch"]
    cfg_name, model_name = HF_CLASSES[arch]
    cls = getattr(transformers, cfg_name)
    cfg = dict(spec["config"])
    on_disk = dict(architectures=[model_name], model_type=arch, torch_dtype="float32",
                   attention_bias=arch == "qwen2", **cfg)
    if arch == "qwen2":
        on_disk.pop("attention_bias")  # Qwen2 always has q/k/v biases; the key is llama's
    elif arch in ("qwen3", "qwen3_moe", "qwen2_moe", "mixtral", "mistral", "gemma3_text",
                  "gemma2"):
        on_disk.pop("attention_bias")  # not in these configs
    else:
        on_disk.update(mlp_bias=False, pretraining_tp=1)
    return cls(**cfg), on_disk


def init_weights(model, arch, gen):
    """Random weights large enough that logits are far from flat and greedy decoding wanders.

    Embedding N(0, 1); linear weights N(0, 0.25^2): with smaller weights (0.08, 0.15) the
    residual stream stays dominated by the current token's own embedding, and with a tied
    lm_head the model then predicts its input token forever (greedy = one repeated token).
    At 0.25 the 64 greedy tokens are ~60 distinct ones and the top-2 logit gaps have a median
    ~1 against logits of ~40. q_proj/k_proj get N(0, 0.1^2): at 0.25 attention is so sharp that
    the net amplifies weight rounding ~10x (F16 weights gave 4.4e-3 relative logit error, Q8_0
    9e-2); at 0.1 it is 1.7e-3 and 3e-2, closer to what the formats themselves cost.
    Norm gains 1 + N(0, 0.1^2) so a missing or misapplied gain shows; Qwen2 q/k/v biases N(0, 0.5^2) so that dropping a bias changes attention measurably.
    """
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("norm.weight"):
                # Gemma's gains are 1 + the stored weight: stored 1 + N(0, 0.1^2), they are ~2
                # (at ~1, or ~0.5, its post-block norms keep the residual stream in a rut and
                # greedy decoding repeats a few tokens; at ~2, 64 steps give ~60 distinct ones)
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            elif pname.endswith("embed_tokens.weight"):
                # (Gemma scales its embedding by sqrt(hidden_size) = 8: the same N(0, 1) after)
                sd = 0.125 if arch in GEMMA else 1.0
                p.copy_(sd * torch.randn(p.shape, generator=gen))
            elif pname.endswith(".bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
            elif pname.endswith(("q_proj.weight", "k_proj.weight")):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            elif pname == "lm_head.weight":
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.25 * torch.randn(p.shape, generator=gen))


def llama_permute(w, n_head, n_head_kv):
    """convert_hf_to_gguf.py's LlamaModel.permute: HF's rotate-half rope layout -> GGML's
    interleaved pairs (rows (h, 2, d/2) -> (h, d/2, 2))."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def llama3_rope_factors(cfg):
    """rope_freqs.weight as convert_hf_to_gguf.py's LlamaModel.generate_extra_tensors computes it."""
    rs = cfg["rope_scaling"]
    base = cfg.get("rope_theta", 10000.0)
    dim = cfg.get("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    factor = rs.get("factor", 8.0)
    low_freq_factor = rs.get("low_freq_factor", 1.0)
    high_freq_factor = rs.get("high_freq_factor", 4.0)
    old_context_len = rs.get("original_max_position_embeddings", 8192)
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_freq_wavelen:
            factors.append(1)
        elif wavelen > low_freq_wavelen:
            factors.append(factor)
        else:
            smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)


HF_TO_GGUF = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm", "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm", "mlp.shared_expert.gate_proj": "ffn_gate_shexp",
    "mlp.shared_expert.up_proj": "ffn_up_shexp", "mlp.shared_expert.down_proj": "ffn_down_shexp",
    "mlp.shared_expert_gate": "ffn_gate_inp_shexp",
}

GEMMA = ("gemma2", "gemma3_text")
# Gemma's four norms per layer (post_attention_layernorm normalizes the attention's output)
GEMMA_TO_GGUF = {"post_attention_layernorm": "post_attention_norm",
                 "pre_feedforward_layernorm": "ffn_norm",
                 "post_feedforward_layernorm": "post_ffw_norm"}


def hub_layout(sd, arch):
    """transformers 5 keeps a layer's experts stacked (mlp.experts.gate_up_proj: (E, 2F, dim),
    gate rows first; mlp.experts.down_proj: (E, dim, F)); released checkpoints name each expert's
    matrices, as save_pretrained writes them back: Qwen3-MoE mlp.experts.<e>.gate_proj/up_proj/
    down_proj, Mixtral block_sparse_moe.gate and block_sparse_moe.experts.<e>.w1 (gate), w3 (up),
    w2 (down)."""
    names = (("block_sparse_moe.experts.{}.w1", "block_sparse_moe.experts.{}.w3",
              "block_sparse_moe.experts.{}.w2") if arch == "mixtral" else
             ("mlp.experts.{}.gate_proj", "mlp.experts.{}.up_proj", "mlp.experts.{}.down_proj"))
    out = {}
    for k, v in sd.items():
        base, _, rest = k.partition(".mlp.")
        if rest == "experts.gate_up_proj":
            f = v.shape[1] // 2
            for e in range(v.shape[0]):
                out[f"{base}.{names[0].format(e)}.weight"] = v[e, :f].contiguous()
                out[f"{base}.{names[1].format(e)}.weight"] = v[e, f:].contiguous()
        elif rest == "experts.down_proj":
            for e in range(v.shape[0]):
                out[f"{base}.{names[2].format(e)}.weight"] = v[e].contiguous()
        elif rest == "gate.weight" and arch == "mixtral":
            out[f"{base}.block_sparse_moe.gate.weight"] = v
        else:
            out[k] = v
    return out


def gguf_tensors(sd, arch, cfg, split_experts=False):
    """Yields (gguf name, float32 array in HF [out, in] order) like convert_hf_to_gguf.py.
    Experts stay stacked, as llama.cpp stores them: ffn_gate_exps/ffn_up_exps (E, F, dim) and
    ffn_down_exps (E, dim, F); the router is ffn_gate_inp. split_experts: one tensor per
    expert (ffn_gate.<e>, ffn_up.<e>, ffn_down.<e>), as Mixtral GGUFs were written before
    llama.cpp stacked them."""
    def experts(kind, a):
        if not split_experts:
            yield f"{kind}_exps.weight", np.ascontiguousarray(a)
            return
        for e in range(a.shape[0]):
            yield f"{kind}.{e}.weight", np.ascontiguousarray(a[e])

    if arch == "llama" and cfg.get("rope_scaling", {}).get("rope_type") == "llama3":
        yield "rope_freqs.weight", llama3_rope_factors(cfg)
    for name, t in sd.items():
        a = t.detach().to(torch.float32).numpy()
        base, _, rest = name.partition(".mlp.")
        if rest in ("experts.gate_up_proj", "experts.down_proj", "gate.weight"):
            il = base.split(".")[2]
            parts = ([("ffn_gate", a[:, :a.shape[1] // 2]), ("ffn_up", a[:, a.shape[1] // 2:])]
                     if rest == "experts.gate_up_proj" else
                     [("ffn_down", a)] if rest == "experts.down_proj" else [])
            for kind, part in parts:
                for n, x in experts(kind, part):
                    yield f"blk.{il}.{n}", x
            if not parts:
                yield f"blk.{il}.ffn_gate_inp.weight", a
            continue
        if arch in GEMMA and name.endswith("norm.weight"):
            a = a + np.float32(1)  # Gemma{2,3}Model.modify_tensors: the gains stored whole
        if name == "model.embed_tokens.weight":
            yield "token_embd.weight", a
        elif name == "model.norm.weight":
            yield "output_norm.weight", a
        elif name == "lm_head.weight":
            if not cfg["tie_word_embeddings"]:
                yield "output.weight", a
        else:
            parts = name.split(".")  # model.layers.<il>.<module...>.<weight|bias>
            assert parts[:2] == ["model", "layers"], name
            il, module, kind = parts[2], ".".join(parts[3:-1]), parts[-1]
            if arch in PERMUTED and module == "self_attn.q_proj":
                a = llama_permute(a, cfg["num_attention_heads"], cfg["num_attention_heads"])
            elif arch in PERMUTED and module == "self_attn.k_proj":
                a = llama_permute(a, cfg["num_attention_heads"], cfg["num_key_value_heads"])
            names = dict(HF_TO_GGUF, **GEMMA_TO_GGUF) if arch in GEMMA else HF_TO_GGUF
            yield f"blk.{il}.{names[module]}.{kind}", a


def write_gguf(path, spec, sd, vocab_kv, qtype_name, split_experts=False, types=None):
    """types (with qtype_name "mixed"): {gguf tensor name: GGMLQuantizationType} for each
    tensor the file type would quantize, as llama.cpp's Q4_K_M and the like mix types."""
    import gguf
    from ggml_encode import encode
    arch, cfg = spec.get("gguf_arch", spec["arch"]), spec["config"]
    ftype = {"F32": gguf.LlamaFileType.ALL_F32, "F16": gguf.LlamaFileType.MOSTLY_F16,
             "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
             "mixed": gguf.LlamaFileType.MOSTLY_Q4_K_M}[qtype_name]
    wtype = None if types else gguf.GGMLQuantizationType[qtype_name]
    w = gguf.GGUFWriter(str(path), arch)
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name(f"tiny-{arch}-{Path(path).stem}")
    # TextModel.set_gguf_parameters
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    if "head_dim" in cfg:
        w.add_key_length(cfg["head_dim"])
        w.add_value_length(cfg["head_dim"])
    if "num_experts_per_tok" in cfg:  # Mixtral's and Qwen3-MoE's set_gguf_parameters
        w.add_expert_count(cfg.get("num_local_experts", cfg.get("num_experts")))
        w.add_expert_used_count(cfg["num_experts_per_tok"])
        if "moe_intermediate_size" in cfg:
            w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
        if "shared_expert_intermediate_size" in cfg:
            w.add_expert_shared_feed_forward_length(cfg["shared_expert_intermediate_size"])
    if cfg.get("sliding_window"):
        w.add_sliding_window(cfg["sliding_window"])
    if cfg.get("attn_logit_softcapping"):
        w.add_attn_logit_softcapping(cfg["attn_logit_softcapping"])
        w.add_final_logit_softcapping(cfg["final_logit_softcapping"])
    rs = cfg.get("rope_scaling") or {}
    if rs.get("rope_type") == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rs["factor"])
    elif rs.get("rope_type") == "yarn":  # Qwen2Model/Qwen3Model.set_gguf_parameters
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rs["factor"])
        w.add_rope_scaling_orig_ctx_len(rs["original_max_position_embeddings"])
    w.add_file_type(ftype)
    # LlamaModel.set_gguf_parameters (and SmolLM3Model, its subclass) adds these two; Qwen2Model
    # (and Qwen3Model) does not (a real Qwen2 GGUF has
    # neither key: n_vocab comes from the token list, the rope dimension from n_embd / n_head).
    if spec["arch"] in PERMUTED:
        w.add_vocab_size(cfg["vocab_size"])
        w.add_rope_dimension_count(cfg.get("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"]))
    copy_tokenizer_kv(w, vocab_kv)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)

    for name, a in gguf_tensors(sd, spec["arch"], cfg, split_experts):
        # prepare_tensors: 1-D tensors, norms and routers stay F32; the rest takes the file type.
        keep = a.ndim <= 1 or name.endswith(("_norm.weight", "ffn_gate_inp.weight",
                                             "ffn_gate_inp_shexp.weight"))
        qt = gguf.GGMLQuantizationType.F32 if keep else types[name] if types else wtype
        data = encode(a, qt)
        w.add_tensor(name, data, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def read_gguf_kv(path):
    """Reads a GGUF file's metadata: {key: (value type, element type or None, value)}, strings
    as str. gguf.GGUFReader takes ~13 s on a 152k-token vocabulary; this takes a fraction."""
    import struct
    import gguf
    T = gguf.GGUFValueType
    scalar = {T.UINT8: "<B", T.INT8: "<b", T.UINT16: "<H", T.INT16: "<h", T.UINT32: "<I",
              T.INT32: "<i", T.FLOAT32: "<f", T.BOOL: "<?", T.UINT64: "<Q", T.INT64: "<q",
              T.FLOAT64: "<d"}
    buf = Path(path).read_bytes()
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from(fmt, buf, pos)[0]
        pos += struct.calcsize(fmt)
        return v

    def string():
        nonlocal pos
        n = take("<Q")
        s = buf[pos:pos + n].decode("utf-8", errors="surrogateescape")
        pos += n
        return s

    def value(t):
        if t == T.STRING:
            return string()
        return take(scalar[t])

    magic, version = buf[:4], struct.unpack_from("<I", buf, 4)[0]
    assert magic == b"GGUF" and version == 3, (magic, version)
    pos = 8
    take("<Q")  # tensor count
    n_kv = take("<Q")
    kv = {}
    for _ in range(n_kv):
        key = string()
        t = T(take("<I"))
        if t == T.ARRAY:
            sub = T(take("<I"))
            n = take("<Q")
            if sub == T.STRING:
                vals = [string() for _ in range(n)]
            else:
                dt = np.dtype(scalar[sub])
                vals = np.frombuffer(buf, dtype=dt, count=n, offset=pos).tolist()
                pos += n * dt.itemsize
            kv[key] = (t, sub, vals)
        else:
            kv[key] = (t, None, value(t))
    return kv


def copy_tokenizer_kv(w, vocab_kv):
    """Copies every tokenizer.* key of the vocabulary GGUF verbatim, element types included."""
    import gguf
    packed = {}
    for key, (t, sub, val) in vocab_kv.items():
        if key.startswith("tokenizer."):
            w.add_key_value(key, val, t, sub_type=sub)
            if t == gguf.GGUFValueType.ARRAY:
                packed[id(val)] = None
    # GGUFWriter packs arrays one element at a time in Python (~1 s per file for the Qwen2
    # vocabulary): pack each big array once per vocabulary and reuse the bytes.
    orig = w._pack_val
    cache = vocab_kv.setdefault("__packed__", (None, None, {}))[2]

    def pack_val(val, vtype, add_vtype, sub_type=None):
        if id(val) not in packed:
            return orig(val, vtype, add_vtype, sub_type)
        k = (id(val), add_vtype)
        if k not in cache:
            cache[k] = orig(val, vtype, add_vtype, sub_type)
        return cache[k]
    w._pack_val = pack_val


def check_tokenizer(tok, vocab_name):
    """Returns how many of llama.cpp's reference strings for the vocabulary `tok` encodes
    differently from the reference ids (and how many there are)."""
    inp = (VOCAB_DIR / f"{vocab_name}.inp").read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")
    out = (VOCAB_DIR / f"{vocab_name}.out").read_text(encoding="utf-8").splitlines()
    bad = 0
    for text, ids in zip(inp, out):
        bad += tok.encode(text, add_special_tokens=False).ids != [int(x) for x in ids.split()]
    return bad, len(out)


def build_tokenizer(vocab_kv):
    """Builds (tokenizers.Tokenizer, tokenizer_config dict) from a vocabulary GGUF, in the layout
    of the released checkpoints' tokenizer.json (Llama 2: always-prepended SentencePiece dummy
    prefix, BPE with byte fallback; Qwen2: NFC, Qwen2 split regex, byte-level BPE).

    transformers' own GGUF conversion is not used: it takes ~25 s for the Qwen2 vocabulary and,
    for Llama 2, uses Metaspace(prepend_scheme="first"), which drops the dummy prefix of text
    starting with a space (15 of llama.cpp's 46 reference strings come out different).
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
    from tokenizers import pre_tokenizers, processors

    f = {k: v[2] for k, v in vocab_kv.items()}
    kind = f["tokenizer.ggml.model"]
    tokens = f["tokenizer.ggml.tokens"]
    types = f["tokenizer.ggml.token_type"]
    vocab = {t: i for i, t in enumerate(tokens)}
    ids = {k: int(f[f"tokenizer.ggml.{k}_token_id"])
           for k in ("bos", "eos", "unknown", "padding") if f"tokenizer.ggml.{k}_token_id" in f}
    special = [AddedToken(tokens[i], special=True, normalized=False)
               for i, ty in enumerate(types) if ty in (2, 3)]  # UNKNOWN, CONTROL
    if kind == "llama":
        scores = f["tokenizer.ggml.scores"]
        # transformers' SentencePieceExtractor: every split of a piece into two pieces is a
        # merge, ranked by the merged piece's score (descending), then longer left/right first.
        merges = []
        for piece, i in vocab.items():
            for k in range(1, len(piece)):
                l, r = piece[:k], piece[k:]
                if l in vocab and r in vocab:
                    merges.append((l, r, scores[i]))
        merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
        unk = tokens[ids["unknown"]]
        tok = Tokenizer(models.BPE(vocab, [(l, r) for l, r, _ in merges], unk_token=unk,
                                   fuse_unk=True, byte_fallback=True))
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"),
                                               normalizers.Replace(" ", "\u2581")])
        tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                         decoders.Fuse(), decoders.Strip(" ", 1, 0)])
        bos = tokens[ids["bos"]]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, ids["bos"])])
        tok_cfg = dict(add_bos_token=True, add_eos_token=False, bos_token=bos,
                       eos_token=tokens[ids["eos"]], unk_token=unk, pad_token=None,
                       clean_up_tokenization_spaces=False, legacy=True)
    elif kind == "gpt2":
        assert f["tokenizer.ggml.pre"] == "qwen2"
        merges = [tuple(m.split(" ", 1)) for m in f["tokenizer.ggml.merges"]]
        tok = Tokenizer(models.BPE(vocab, merges, byte_fallback=False, fuse_unk=False))
        tok.normalizer = normalizers.NFC()
        pattern = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                   r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        tok.decoder = decoders.ByteLevel()
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
        tok_cfg = dict(add_bos_token=False, bos_token=None, eos_token=tokens[ids["eos"]],
                       pad_token=tokens[ids.get("padding", ids["eos"])], unk_token=None,
                       clean_up_tokenization_spaces=False)
    else:
        raise ValueError(f"unsupported tokenizer.ggml.model {kind!r}")
    tok.add_special_tokens(special)
    tok_cfg.update(tokenizer_class="PreTrainedTokenizerFast", model_max_length=131072)
    if "tokenizer.chat_template" in f:
        tok_cfg["chat_template"] = f["tokenizer.chat_template"]
    return tok, tok_cfg


def build_one(out, name, spec, vocab_cache):
    import transformers
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(SEED + sum(map(ord, name)))
    config, on_disk = hf_config(name, spec)
    cls = getattr(transformers, HF_CLASSES[spec["arch"]][1])
    torch.manual_seed(SEED)
    model = cls(config).to(torch.float32).eval()
    init_weights(model, spec["arch"], gen)
    if config.tie_word_embeddings:
        model.tie_weights()

    hf = out / f"{name}.tmp"
    shutil.rmtree(hf, ignore_errors=True)
    hf.mkdir(parents=True)
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    if config.tie_word_embeddings:
        sd.pop("lm_head.weight", None)  # as save_pretrained writes a tied checkpoint
    save_file(hub_layout(sd, spec["arch"]), str(hf / "model.safetensors"),
              metadata={"format": "pt"})
    (hf / "config.json").write_text(json.dumps(on_disk, indent=2) + "\n")

    vocab_kv = vocab_cache.get(spec["vocab"]) or read_gguf_kv(VOCAB_DIR / spec["vocab"])
    vocab_cache[spec["vocab"]] = vocab_kv
    if ("tokenizer", spec["vocab"]) not in vocab_cache:  # built and checked once per vocabulary
        tok, tok_cfg = build_tokenizer(vocab_kv)
        bad, n = check_tokenizer(tok, spec["vocab"])
        if bad:
            raise SystemExit(f"{name}: tokenizer.json differs from llama.cpp on {bad}/{n} test "
                             "strings")
        vocab_cache[("tokenizer", spec["vocab"])] = tok, tok_cfg
    tok, tok_cfg = vocab_cache[("tokenizer", spec["vocab"])]
    tok.save(str(hf / "tokenizer.json"))
    (hf / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2) + "\n")

    for t in () if spec.get("hf_only") else GGUF_TYPES:
        tmp = out / f"{name}.{t}.gguf.tmp"
        write_gguf(tmp, spec, sd, vocab_kv, t)
        tmp.rename(out / f"{name}.{t}.gguf")
    final = out / name
    shutil.rmtree(final, ignore_errors=True)
    hf.rename(final)


def main():
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else default_out_dir()
    done = out / ".complete"
    if not done.exists():
        out.mkdir(parents=True, exist_ok=True)
        torch.set_num_threads(min(2, os.cpu_count() or 1))
        vocab_cache = {}
        for name, spec in SPECS.items():
            build_one(out, name, spec, vocab_cache)
        (out / "manifest.json").write_text(json.dumps(manifest(out), indent=2) + "\n")
        done.write_text(script_hash() + "\n")
    print(json.dumps(manifest(out)))


if __name__ == "__main__":
    main()
