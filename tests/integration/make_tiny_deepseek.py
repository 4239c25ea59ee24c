#!/usr/bin/env python3
"""Builds tiny random DeepSeek-V2/V3 models (multi-head latent attention, experts with shared
experts and grouped routing) for test_deepseek.py: a Hugging Face directory (F32 safetensors in
the hub's layout) and GGUF files in F32, F16 and Q8_0 written the way llama.cpp's converter
writes `deepseek2` (conversion/deepseek.py, DeepseekV2Model: one KV head of kv_lora_rank + rope,
kv_b_proj split into attn_k_b (transposed per head) and attn_v_b, the experts stacked, the
metadata keys), with make_tiny_models.py's tokenizer helpers and the Llama 2 vocabulary.

Its own cache (~/.cache/pagoda/tiny-deepseek-<script hash>), so the other tiny models are not
rebuilt when this file changes. Usage: make_tiny_deepseek.py [OUT_DIR]; prints the manifest.
"""
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
import make_tiny_models as mt  # noqa: E402

SCRIPT = Path(__file__).resolve()
SEED = 4321

# Shapes: 4 heads, a latent of 32 with a 16-wide rope key (the cached row is 48), nope 32 and
# v 32 (rows of 32: Q8_0 blocks, also for attn_k_b's rows of nope), 8 experts of 32 columns, 2
# per token, in 4 groups of 2 of which 2 are kept (so the groups change which experts run),
# shared experts, one dense first layer. YaRN as the released configs have it (mscale =
# mscale_all_dim: the rotated parts are not rescaled, the scores are by mscale_all_dim^2).
COMMON = dict(vocab_size=32000, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
              num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512,
              kv_lora_rank=32, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32,
              n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
              first_k_dense_replace=1, rms_norm_eps=1e-6, rope_theta=10000.0,
              bos_token_id=1, eos_token_id=2, hidden_act="silu", attention_bias=False)
YARN = dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=128, beta_fast=32,
            beta_slow=1, mscale=0.707, mscale_all_dim=0.707)

SPECS = {
    # DeepSeek-V2: q LoRA, softmax routing limited to the 2 best of 4 groups (their best expert),
    # weights not renormalized but scaled (routed_scaling_factor), 2 shared experts, YaRN.
    "dsv2": dict(arch="deepseek_v2", config=dict(
        COMMON, q_lora_rank=64, n_shared_experts=2, n_group=4, topk_group=2,
        topk_method="group_limited_greedy", routed_scaling_factor=1.5, norm_topk_prob=False,
        scoring_func="softmax", tie_word_embeddings=False, rope_scaling=dict(YARN))),
    # DeepSeek-V2-Lite's layout: no q LoRA (one q_proj), plain greedy top-k, 2 shared experts,
    # no rope scaling, tied embeddings.
    "dsv2lite": dict(arch="deepseek_v2", config=dict(
        COMMON, q_lora_rank=None, n_shared_experts=2, n_group=1, topk_group=1,
        topk_method="greedy", routed_scaling_factor=1.0, norm_topk_prob=False,
        scoring_func="softmax", tie_word_embeddings=True)),
    # DeepSeek-V3: sigmoid scores, a routing bias (e_score_correction_bias), groups scored by
    # their best two, renormalized and scaled by 2.5, one shared expert, interleaved rope, YaRN
    # with V3's mscale 1.
    "dsv3": dict(arch="deepseek_v3", config=dict(
        COMMON, q_lora_rank=64, n_shared_experts=1, n_group=4, topk_group=2,
        topk_method="noaux_tc", routed_scaling_factor=2.5, norm_topk_prob=True,
        scoring_func="sigmoid", rope_interleave=True, tie_word_embeddings=False,
        rope_scaling=dict(YARN, mscale=1.0, mscale_all_dim=1.0))),
}
CLASSES = {"deepseek_v2": ("DeepseekV2Config", "DeepseekV2ForCausalLM"),
           "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM")}
VOCAB = "ggml-vocab-llama-spm.gguf"
GGUF_TYPES = ("F32", "F16", "Q8_0")


def script_hash():
    return hashlib.sha256(SCRIPT.read_bytes() + (SCRIPT.parent / "make_tiny_models.py")
                          .read_bytes()).hexdigest()[:16]


def default_out_dir():
    cache = Path(os.environ.get("PAGODA_CACHE", Path.home() / ".cache" / "pagoda"))
    return cache / f"tiny-deepseek-{script_hash()}"


def manifest(out):
    return {name: dict(arch=spec["arch"], hf_dir=str(out / name),
                       **{f"gguf_{t}": str(out / f"{name}.{t}.gguf") for t in GGUF_TYPES})
            for name, spec in SPECS.items()}


def make_model(spec):
    """The transformers model of spec with random weights (seeded), F32."""
    import transformers
    cfg_cls, model_cls = (getattr(transformers, n) for n in CLASSES[spec["arch"]])
    cfg = dict(spec["config"])
    rs = cfg.pop("rope_scaling", None)
    config = cfg_cls(**cfg, rope_parameters=dict(rs, rope_theta=cfg["rope_theta"]) if rs else None)
    torch.manual_seed(SEED)
    model = model_cls(config).to(torch.float32).eval()
    gen = torch.Generator().manual_seed(SEED + len(spec["arch"]))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("norm.weight", "layernorm.weight")):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith("embed_tokens.weight"):
                p.copy_(torch.randn(p.shape, generator=gen))
            elif name.endswith(("q_a_proj.weight", "q_b_proj.weight", "q_proj.weight",
                                "kv_a_proj_with_mqa.weight", "kv_b_proj.weight")):
                # (as make_tiny_models' q/k: sharp attention amplifies weight rounding)
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            elif name == "lm_head.weight":
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.25 * torch.randn(p.shape, generator=gen))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):  # V3: large enough to move choices
                b.copy_(0.1 * torch.randn(b.shape, generator=gen))
    if config.tie_word_embeddings:
        model.tie_weights()
    return model


def on_disk_config(spec):
    """config.json as the released checkpoints write it (rope_scaling at the top level)."""
    return dict(architectures=[CLASSES[spec["arch"]][1]], model_type=spec["arch"],
                torch_dtype="float32", **spec["config"])


def state_dict(model):
    """The model's tensors, e_score_correction_bias included (a buffer, saved by transformers)."""
    sd = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    return sd


def gguf_tensors(sd, cfg, split_kv_b=True):
    """Yields (gguf name, float32 array) as conversion/deepseek.py's DeepseekV2Model writes them:
    the experts stacked (ffn_{gate,up,down}_exps), the router ffn_gate_inp, V3's bias
    exp_probs_b.bias, the shared experts *_shexp, kv_b_proj split per head into attn_k_b
    (H, r, nope: K's rows transposed) and attn_v_b (H, v, r); split_kv_b False: one attn_kv_b,
    as converters before the split wrote it."""
    H, nope, v = cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["v_head_dim"]
    names = {"self_attn.q_proj": "attn_q", "self_attn.q_a_proj": "attn_q_a",
             "self_attn.q_a_layernorm": "attn_q_a_norm", "self_attn.q_b_proj": "attn_q_b",
             "self_attn.kv_a_proj_with_mqa": "attn_kv_a_mqa",
             "self_attn.kv_a_layernorm": "attn_kv_a_norm", "self_attn.o_proj": "attn_output",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
             "mlp.shared_experts.gate_proj": "ffn_gate_shexp",
             "mlp.shared_experts.up_proj": "ffn_up_shexp",
             "mlp.shared_experts.down_proj": "ffn_down_shexp", "mlp.gate": "ffn_gate_inp",
             "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
    for name, t in sd.items():
        a = t.detach().to(torch.float32).numpy()
        if name == "model.embed_tokens.weight":
            yield "token_embd.weight", a
            continue
        if name == "model.norm.weight":
            yield "output_norm.weight", a
            continue
        if name == "lm_head.weight":
            yield "output.weight", a
            continue
        parts = name.split(".")
        il, module, kind = parts[2], ".".join(parts[3:-1]), parts[-1]
        if module == "mlp.experts" and kind == "gate_up_proj":
            f = a.shape[1] // 2
            yield f"blk.{il}.ffn_gate_exps.weight", np.ascontiguousarray(a[:, :f])
            yield f"blk.{il}.ffn_up_exps.weight", np.ascontiguousarray(a[:, f:])
        elif module == "mlp.experts" and kind == "down_proj":
            yield f"blk.{il}.ffn_down_exps.weight", a
        elif module == "mlp.gate" and kind == "e_score_correction_bias":
            yield f"blk.{il}.exp_probs_b.bias", a
        elif module == "self_attn.kv_b_proj":
            if not split_kv_b:
                yield f"blk.{il}.attn_kv_b.weight", a
                continue
            kv_b = a.reshape(H, nope + v, a.shape[-1])
            yield (f"blk.{il}.attn_k_b.weight",
                   np.ascontiguousarray(kv_b[:, :nope].transpose(0, 2, 1)))
            yield f"blk.{il}.attn_v_b.weight", np.ascontiguousarray(kv_b[:, nope:])
        else:
            yield f"blk.{il}.{names[module]}.{kind}", a


def write_gguf(path, spec, sd, vocab_kv, qtype_name, split_kv_b=True):
    """DeepseekV2Model.set_gguf_parameters' keys (TextModel's first), then the tensors: 1-D
    ones, norms and the router F32, the rest in the file's type."""
    import gguf
    from ggml_encode import encode
    cfg = spec["config"]
    r, rope = cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]
    qt = gguf.GGMLQuantizationType[qtype_name]
    w = gguf.GGUFWriter(str(path), "deepseek2")
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name(f"tiny-deepseek2-{Path(path).stem}")
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(1)  # (MLA as MQA: one KV head of kv_lora_rank + rope)
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_expert_count(cfg["n_routed_experts"])
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    if cfg["n_group"] is not None:
        w.add_expert_group_count(cfg["n_group"])
        w.add_expert_group_used_count(cfg["topk_group"])
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID if cfg["scoring_func"] == "sigmoid"
                             else gguf.ExpertGatingFuncType.SOFTMAX)
    rs = cfg.get("rope_scaling")
    if rs:
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rs["factor"])
        w.add_rope_scaling_orig_ctx_len(rs["original_max_position_embeddings"])
        w.add_rope_scaling_yarn_beta_fast(rs["beta_fast"])
        w.add_rope_scaling_yarn_beta_slow(rs["beta_slow"])
    w.add_file_type({"F32": gguf.LlamaFileType.ALL_F32, "F16": gguf.LlamaFileType.MOSTLY_F16,
                     "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[qtype_name])
    w.add_leading_dense_block_count(cfg["first_k_dense_replace"])
    w.add_vocab_size(cfg["vocab_size"])
    if cfg["q_lora_rank"] is not None:
        w.add_q_lora_rank(cfg["q_lora_rank"])
    w.add_kv_lora_rank(r)
    w.add_key_length(r + rope)
    w.add_value_length(r)
    w.add_key_length_mla(cfg["qk_nope_head_dim"] + rope)
    w.add_value_length_mla(cfg["v_head_dim"])
    w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    w.add_expert_shared_count(cfg["n_shared_experts"])
    w.add_expert_weights_scale(cfg["routed_scaling_factor"])
    if cfg["norm_topk_prob"]:
        w.add_expert_weights_norm(True)
    w.add_rope_dimension_count(rope)
    if rs and rs.get("mscale_all_dim") is not None:
        w.add_rope_scaling_yarn_log_mul(0.1 * rs["mscale_all_dim"])
    mt.copy_tokenizer_kv(w, vocab_kv)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    for name, a in gguf_tensors(sd, cfg, split_kv_b):
        keep = a.ndim <= 1 or name.endswith(("_norm.weight", "ffn_gate_inp.weight"))
        t = gguf.GGMLQuantizationType.F32 if keep else qt
        w.add_tensor(name, encode(a, t), raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def build_one(out, name, spec, vocab_cache):
    from safetensors.torch import save_file
    model = make_model(spec)
    hf = out / f"{name}.tmp"
    shutil.rmtree(hf, ignore_errors=True)
    hf.mkdir(parents=True)
    sd = state_dict(model)
    save_file(mt.hub_layout(sd, spec["arch"]), str(hf / "model.safetensors"),
              metadata={"format": "pt"})
    (hf / "config.json").write_text(json.dumps(on_disk_config(spec), indent=2) + "\n")
    if "kv" not in vocab_cache:
        vocab_cache["kv"] = mt.read_gguf_kv(mt.VOCAB_DIR / VOCAB)
        vocab_cache["tok"] = mt.build_tokenizer(vocab_cache["kv"])
    tok, tok_cfg = vocab_cache["tok"]
    tok.save(str(hf / "tokenizer.json"))
    (hf / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2) + "\n")
    for t in GGUF_TYPES:
        tmp = out / f"{name}.{t}.gguf.tmp"
        write_gguf(tmp, spec, sd, vocab_cache["kv"], t)
        tmp.rename(out / f"{name}.{t}.gguf")
    shutil.rmtree(out / name, ignore_errors=True)
    hf.rename(out / name)


def main():
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else default_out_dir()
    done = out / ".complete"
    if not done.exists():
        out.mkdir(parents=True, exist_ok=True)
        torch.set_num_threads(min(2, os.cpu_count() or 1))
        cache = {}
        for name, spec in SPECS.items():
            build_one(out, name, spec, cache)
        (out / "manifest.json").write_text(json.dumps(manifest(out), indent=2) + "\n")
        done.write_text(script_hash() + "\n")
    print(json.dumps(manifest(out)))


if __name__ == "__main__":
    main()
