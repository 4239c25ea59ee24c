"""Bad model files: each gets a one-line error on stderr that names the file and says what is
wrong, and a non-zero exit status (1) -- never a crash (a signal) or a hang.

The corrupted files are derived from real ones (stories260K.gguf, the tiny HF models) by
editing exactly one thing, located by walking the GGUF header as the format defines it."""
import json
import os
import shutil
import struct
from pathlib import Path

import pytest

from util import DATA, run_pagoda

STORIES = DATA / "models" / "stories260K.gguf"


def walk_gguf(buf):
    """Returns (kv, tensors): kv maps key -> (value_offset, type); tensors is a list of dicts with
    name, name_off, type_off, offset_off (byte positions of those fields in the header)."""
    off = 4 + 4
    n_tensors, n_kv = struct.unpack_from("<QQ", buf, off)
    off += 16
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

    def read_str(o):
        (n,) = struct.unpack_from("<Q", buf, o)
        return buf[o + 8:o + 8 + n].decode("utf-8", "replace"), o + 8 + n

    def skip_value(t, o):
        if t == 8:
            return read_str(o)[1]
        if t == 9:
            et, n = struct.unpack_from("<IQ", buf, o)
            o += 12
            for _ in range(n):
                o = skip_value(et, o)
            return o
        return o + sizes[t]

    kv = {}
    for _ in range(n_kv):
        key, off = read_str(off)
        (t,) = struct.unpack_from("<I", buf, off)
        off += 4
        kv[key] = (off, t)
        off = skip_value(t, off)
    tensors = []
    for _ in range(n_tensors):
        name_off = off
        name, off = read_str(off)
        (nd,) = struct.unpack_from("<I", buf, off)
        off += 4 + 8 * nd
        tensors.append({"name": name, "name_off": name_off, "type_off": off, "offset_off": off + 4})
        off += 12
    return kv, tensors, off


def expect_error(path, *needles, extra=()):
    p = run_pagoda("generate", "-m", path, "-p", "Once", "-n", "2", *extra, check=False, timeout=60)
    err = p.stderr.decode("utf-8", "replace")
    lines = [l for l in err.splitlines() if l.strip()]
    assert p.returncode == 1, f"exit {p.returncode} (negative = killed by a signal): {err}"
    assert len(lines) == 1, f"expected one line, got: {err!r}"
    assert str(path) in lines[0], f"message does not name the file: {lines[0]!r}"
    for n in needles:
        assert n in lines[0], f"{n!r} not in {lines[0]!r}"
    return lines[0]


@pytest.fixture()
def stories_bytes():
    return bytearray(STORIES.read_bytes())


def write(tmp_path, name, data):
    p = tmp_path / name
    p.write_bytes(bytes(data))
    return p


def test_missing_file(tmp_path):
    expect_error(tmp_path / "nope.gguf", "cannot open")


def test_empty_file(tmp_path):
    expect_error(write(tmp_path, "empty.gguf", b""), "not a GGUF file")


def test_wrong_magic(tmp_path, stories_bytes):
    stories_bytes[0:4] = b"GGML"
    expect_error(write(tmp_path, "magic.gguf", stories_bytes), "bad magic")


def test_unsupported_version(tmp_path, stories_bytes):
    struct.pack_into("<I", stories_bytes, 4, 99)
    expect_error(write(tmp_path, "ver.gguf", stories_bytes), "unsupported GGUF version 99")


@pytest.mark.parametrize("frac", [0.0005, 0.01, 0.3, 0.999])
def test_truncated(tmp_path, stories_bytes, frac):
    cut = max(9, int(len(stories_bytes) * frac))
    expect_error(write(tmp_path, f"trunc{frac}.gguf", stories_bytes[:cut]), "truncated")


def test_tensor_offset_out_of_range(tmp_path, stories_bytes):
    _, tensors, _ = walk_gguf(stories_bytes)
    struct.pack_into("<Q", stories_bytes, tensors[-1]["offset_off"], 1 << 40)
    expect_error(write(tmp_path, "offset.gguf", stories_bytes), "outside the file")


def test_unaligned_tensor_offset(tmp_path, stories_bytes):
    _, tensors, _ = walk_gguf(stories_bytes)
    struct.pack_into("<Q", stories_bytes, tensors[1]["offset_off"], 3)
    expect_error(write(tmp_path, "align.gguf", stories_bytes), "not aligned")


def test_unknown_tensor_type(tmp_path, stories_bytes):
    _, tensors, _ = walk_gguf(stories_bytes)
    struct.pack_into("<I", stories_bytes, tensors[0]["type_off"], 99)
    expect_error(write(tmp_path, "type.gguf", stories_bytes), "unknown tensor type 99")


@pytest.mark.parametrize("ty,want", [(9, "has type Q8_1, which the CPU backend does not support"),
                                     (10, "not a multiple of the Q2_K block size")])
def test_unsupported_but_known_tensor_type(tmp_path, stories_bytes, ty, want):
    # Q8_1 is a real ggml type no backend multiplies (llama.cpp's activation format); Q2_K is
    # read, but stories260K's 64-element rows are no whole number of its 256-element blocks.
    _, tensors, _ = walk_gguf(stories_bytes)
    struct.pack_into("<I", stories_bytes, tensors[0]["type_off"], ty)
    expect_error(write(tmp_path, f"type{ty}.gguf", stories_bytes), want)


def test_unknown_architecture(tmp_path, stories_bytes):
    kv, _, _ = walk_gguf(stories_bytes)
    off, t = kv["general.architecture"]
    assert t == 8
    (n,) = struct.unpack_from("<Q", stories_bytes, off)
    assert stories_bytes[off + 8:off + 8 + n] == b"llama"
    stories_bytes[off + 8:off + 8 + n] = b"gpt5x"
    expect_error(write(tmp_path, "arch.gguf", stories_bytes), "unsupported architecture 'gpt5x'")


def test_newline_in_a_quoted_string_stays_one_line(tmp_path, stories_bytes):
    """A metadata string quoted into the error (an architecture of "ll\\nma") cannot split it
    over two lines: control characters are written as '?'."""
    kv, _, _ = walk_gguf(stories_bytes)
    off, _ = kv["general.architecture"]
    stories_bytes[off + 8:off + 8 + 5] = b"ll\nma"
    expect_error(write(tmp_path, "nl.gguf", stories_bytes), "unsupported architecture 'll?ma'")


@pytest.mark.parametrize("brk", ["\u2028", "\u2029", "\u0085"])
def test_unicode_line_break_in_a_quoted_string_stays_one_line(tmp_path, stories_bytes, brk):
    """U+2028, U+2029 and U+0085 end a line for Python's splitlines() (and so for log readers
    that follow Unicode): they are written as '?' like the control characters."""
    kv, _, _ = walk_gguf(stories_bytes)
    off, _ = kv["general.architecture"]
    enc = brk.encode()
    name = b"l" + enc + b"a" * (4 - len(enc))
    assert len(name) == 5
    stories_bytes[off + 8:off + 8 + 5] = name
    want = "unsupported architecture 'l?" + "a" * (4 - len(enc)) + "'"
    expect_error(write(tmp_path, "u.gguf", stories_bytes), want)


def test_fifo_as_model_file(tmp_path):
    """A FIFO given as the model is refused at once; the open no longer waits for a writer."""
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    expect_error(fifo, "not a regular file")


def rename_tensor(buf, name, new):
    """Renames tensor name of the GGUF bytes buf to new (the same length), in place."""
    assert len(new) == len(name)
    _, tensors, _ = walk_gguf(buf)
    o = next(t for t in tensors if t["name"] == name)["name_off"] + 8
    buf[o:o + len(name)] = new.encode()


def test_missing_tensor(tmp_path, stories_bytes):
    rename_tensor(stories_bytes, "blk.0.attn_q.weight", "blk.0.attn_x.weight")
    expect_error(write(tmp_path, "missing.gguf", stories_bytes), "missing tensor 'blk.0.attn_q.weight'")


def test_missing_tokenizer(tmp_path, stories_bytes):
    kv, _, _ = walk_gguf(stories_bytes)
    off, _ = kv["tokenizer.ggml.tokens"]
    # Rename the key in place (same length) so the tokenizer's token list is gone.
    key = b"tokenizer.ggml.tokens"
    kstart = off - 4 - len(key)
    assert stories_bytes[kstart:kstart + len(key)] == key
    stories_bytes[kstart:kstart + len(key)] = b"tokenizer.ggml.tokenx"
    expect_error(write(tmp_path, "notok.gguf", stories_bytes), "missing tokenizer")


def test_huge_array_count(tmp_path, stories_bytes):
    kv, _, _ = walk_gguf(stories_bytes)
    off, t = kv["tokenizer.ggml.tokens"]
    assert t == 9
    struct.pack_into("<Q", stories_bytes, off + 4, (1 << 62))
    expect_error(write(tmp_path, "arr.gguf", stories_bytes), "tokenizer.ggml.tokens")


def test_vocab_only_gguf_is_not_a_model():
    expect_error(DATA / "vocab" / "ggml-vocab-llama-spm.gguf", "missing tensor")


def test_directory_without_config(tmp_path):
    expect_error(tmp_path, "config.json")


# ---- Hugging Face directories, derived from the tiny Llama made by make_tiny_models.py ----

@pytest.fixture()
def hf_dir(tmp_path, tiny_models):
    src = tiny_models["llama"]["hf"]
    dst = tmp_path / "hf"
    shutil.copytree(src, dst)
    return dst


def test_hf_missing_tokenizer(hf_dir):
    (hf_dir / "tokenizer.json").unlink()
    expect_error(hf_dir, "missing tokenizer")


def test_hf_bad_config_json(hf_dir):
    (hf_dir / "config.json").write_text("{not json")
    expect_error(hf_dir, "config.json", "not a JSON object")


def test_hf_absurd_context_length(hf_dir):
    """max_position_embeddings of 2^31 - 1 (block counts past int32 further on): refused at load
    with the bound, not an overflow in the engine."""
    cfg = json.loads((hf_dir / "config.json").read_text())
    cfg["max_position_embeddings"] = 2**31 - 1
    (hf_dir / "config.json").write_text(json.dumps(cfg))
    expect_error(hf_dir, "context length 2147483647")


def test_hf_context_shorter_than_the_prompt(hf_dir):
    """A model whose context cannot hold the prompt: the message names the model file."""
    cfg = json.loads((hf_dir / "config.json").read_text())
    cfg["max_position_embeddings"] = 1
    (hf_dir / "config.json").write_text(json.dumps(cfg))
    expect_error(hf_dir, "the context holds 1")


def test_hf_unknown_model_type(hf_dir):
    cfg = json.loads((hf_dir / "config.json").read_text())
    cfg["model_type"] = "mamba"
    (hf_dir / "config.json").write_text(json.dumps(cfg))
    expect_error(hf_dir, "unsupported model_type 'mamba'")


def test_hf_truncated_safetensors(hf_dir):
    st = hf_dir / "model.safetensors"
    data = st.read_bytes()
    st.write_bytes(data[: len(data) // 2])
    expect_error(hf_dir, "model.safetensors", "outside the file")


def test_hf_safetensors_header_too_long(hf_dir):
    st = hf_dir / "model.safetensors"
    data = bytearray(st.read_bytes())
    struct.pack_into("<Q", data, 0, len(data) + 1)
    st.write_bytes(bytes(data))
    expect_error(hf_dir, "model.safetensors", "exceeds the file")


def test_hf_unsupported_dtype(hf_dir):
    st = hf_dir / "model.safetensors"
    data = bytearray(st.read_bytes())
    (n,) = struct.unpack_from("<Q", data, 0)
    hdr = json.loads(data[8:8 + n])
    name = next(k for k in hdr if k != "__metadata__")
    hdr[name]["dtype"] = "I8"
    new = json.dumps(hdr, separators=(",", ":")).encode()
    new += b" " * (n - len(new))  # same header length keeps the data offsets valid
    assert len(new) == n
    data[8:8 + n] = new
    st.write_bytes(bytes(data))
    expect_error(hf_dir, "unsupported dtype I8")


def test_hf_wrong_shape(hf_dir):
    cfg = json.loads((hf_dir / "config.json").read_text())
    cfg["hidden_size"] = cfg["hidden_size"] * 2
    (hf_dir / "config.json").write_text(json.dumps(cfg))
    expect_error(hf_dir, "has shape")


@pytest.mark.parametrize("value,want", [([1, 1, 1], "no_rope_layers must list 2 flags"),
                                        ([1, 2], "no_rope_layers holds a value other than 0"),
                                        ("all", "no_rope_layers must list 2 flags")])
def test_hf_bad_no_rope_layers(hf_dir, value, want):
    """SmolLM3's per-layer NoPE flags: one 0/1 flag per layer, or a one-line error."""
    cfg = json.loads((hf_dir / "config.json").read_text())
    cfg.update(model_type="smollm3", no_rope_layers=value)
    (hf_dir / "config.json").write_text(json.dumps(cfg))
    expect_error(hf_dir, "config.json", want)


def test_hf_untied_without_lm_head(hf_dir):
    """A checkpoint whose config says tie_word_embeddings: false but has no lm_head.weight: the
    missing tensor is named (it used to be served with the embedding as its LM head)."""
    from safetensors.numpy import load_file, save_file
    st = hf_dir / "model.safetensors"
    sd = load_file(str(st))
    del sd["lm_head.weight"]
    save_file(sd, str(st))
    expect_error(hf_dir, "missing tensor 'lm_head.weight'")


def test_hf_qwen3_without_qk_norm(hf_dir):
    """A Qwen3 config over a checkpoint with no q_norm/k_norm gains: the missing tensor named."""
    cfg = json.loads((hf_dir / "config.json").read_text())
    cfg["model_type"] = "qwen3"
    (hf_dir / "config.json").write_text(json.dumps(cfg))
    expect_error(hf_dir, "missing tensor 'model.layers.0.self_attn.q_norm.weight'")


@pytest.mark.parametrize("update,want", [
    (dict(layer_types=["sliding_attention"]), "layer_types must name 2 layers"),
    (dict(layer_types=["full_attention", "chunked_attention"]),
     "layer_types[1] is neither sliding_attention nor full_attention"),
    (dict(layer_types="sliding_attention"), "layer_types must name 2 layers"),
    (dict(sliding_window=-4), "sliding_window or max_window_layers is not a non-negative"),
    (dict(sliding_window="4k"), "sliding_window or max_window_layers is not a non-negative"),
    (dict(max_window_layers=1.5), "sliding_window or max_window_layers is not a non-negative"),
    (dict(model_type="smollm3", layer_types=None), "use_sliding_window without layer_types"),
    (dict(rope_scaling=dict(rope_type="yarn", factor=0.5, original_max_position_embeddings=32)),
     "invalid yarn rope_scaling"),
    (dict(rope_scaling=dict(rope_type="yarn", factor=4, original_max_position_embeddings=None)),
     "invalid yarn rope_scaling"),
])
def test_hf_bad_sliding_window(tmp_path, tiny_models, update, want):
    """Sliding-window settings Pagoda cannot follow exactly: one line naming config.json."""
    expect_config_error(tmp_path, tiny_models, "qwen2swa", update, want)


def expect_config_error(tmp_path, tiny_models, name, update, want):
    """The tiny model `name`'s HF directory with config.json updated: one line naming it."""
    d = tmp_path / name
    shutil.copytree(tiny_models[name]["hf"], d)
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(update)
    (d / "config.json").write_text(json.dumps(cfg))
    expect_error(d, "config.json", want)


@pytest.mark.parametrize("update,want", [
    (dict(final_logit_softcapping=30.0), "final_logit_softcapping is not supported"),
    (dict(attn_logit_softcapping=50.0), "attn_logit_softcapping is not supported"),
    (dict(use_bidirectional_attention=True), "use_bidirectional_attention is not supported"),
    (dict(hidden_activation="relu"), "hidden_activation must be gelu_pytorch_tanh"),
    (dict(sliding_window=None), "a gemma3_text config without sliding_window"),
    (dict(sliding_window_pattern=0), "sliding_window or sliding_window_pattern is not a positive"),
    (dict(query_pre_attn_scalar=0), "invalid query_pre_attn_scalar"),
    (dict(rope_scaling=dict(rope_type="dynamic", factor=4.0)), "unsupported rope scaling type"),
])
def test_hf_bad_gemma3(tmp_path, tiny_models, update, want):
    """Gemma 3 settings Pagoda does not implement (Gemma 2's soft-capping, EmbeddingGemma's
    bidirectional attention) or cannot read: one line naming config.json."""
    expect_config_error(tmp_path, tiny_models, "gemma3", update, want)


@pytest.mark.parametrize("update", [
    dict(query_pre_attn_scalar="16"), dict(attn_logit_softcapping="4"),
    dict(final_logit_softcapping=1e39), dict(attn_logit_softcapping=-1.0),
    dict(query_pre_attn_scalar=1e300),
])
def test_hf_bad_gemma2_numbers(tmp_path, tiny_models, update):
    """Gemma 2 numbers of the wrong type or out of float range are refused, not replaced by a
    default (a string cap turned capping off) or run to non-finite logits (a cap of 1e39)."""
    expect_config_error(tmp_path, tiny_models, "gemma2", update,
                        "invalid query_pre_attn_scalar, local RoPE base or soft-capping")


@pytest.mark.parametrize("key,value,want", [
    ("gemma2.final_logit_softcapping", float("inf"), "invalid metadata"),
    ("gemma3.rope.scaling.factor", float("inf"), "invalid metadata"),
])
def test_gguf_bad_gemma_numbers(tmp_path, tiny_models, key, value, want):
    """Non-finite Gemma metadata is refused by name (it ran to non-finite logits)."""
    name = key.split(".")[0]
    buf = bytearray(Path(tiny_models[name]["gguf_F32"]).read_bytes())
    kv, _, _ = walk_gguf(buf)
    off, t = kv[key]
    assert t == 6  # F32
    struct.pack_into("<f", buf, off, value)
    expect_error(write(tmp_path, "g.gguf", buf), f"{want} {key}")


def test_kv_plan_reads_other_wrapped_configs(tmp_path):
    """kv-plan reads a text_config the loader does not serve (Ministral 3's) as it is."""
    cfg = dict(model_type="mistral3", text_config=dict(
        model_type="ministral3", num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, intermediate_size=128, vocab_size=1000,
        max_position_embeddings=512))
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    p = run_pagoda("kv-plan", "--model-config", tmp_path / "config.json", "--json")
    assert json.loads(p.stdout)["model"]["num_layers"] == 2


@pytest.mark.parametrize("name,key", [("gemma3", "gemma3.attention.sliding_window"),
                                      ("gemma2", "gemma2.attention.sliding_window"),
                                      ("gemma2", "gemma2.attn_logit_softcapping"),
                                      ("gemma2", "gemma2.final_logit_softcapping")])
def test_gguf_gemma_without_key(tmp_path, tiny_models, name, key):
    """Gemma GGUFs must name their sliding window, and Gemma 2's its soft-capping (llama.cpp's
    converter always writes them): without, one line naming the key."""
    buf = bytearray(Path(tiny_models[name]["gguf_F32"]).read_bytes())
    o = buf.index(key.encode())
    buf[o + len(key) - 1] = ord("X")
    expect_error(write(tmp_path, "g.gguf", buf), f"missing or invalid metadata {key}")


# ---- mixtures of experts (tiny Mixtral and Qwen3-MoE of make_tiny_models.py) ----

def moe_dir(tmp_path, tiny_models, name):
    dst = tmp_path / name
    shutil.copytree(tiny_models[name]["hf"], dst)
    return dst


@pytest.mark.parametrize("update,want", [
    (dict(num_experts_per_tok=9), "invalid experts (9 of 8"),
    (dict(num_experts_per_tok=0), "invalid experts (0 of 8"),
    (dict(num_experts=-1), "not a non-negative integer"),
    (dict(mlp_only_layers=[0]), "mlp_only_layers"),
    (dict(decoder_sparse_step=2), "decoder_sparse_step"),
    (dict(num_experts=16), "tensor 'model.layers.0.mlp.gate.weight' has shape [8, 64], "
                           "expected [16, 64]"),
    (dict(moe_intermediate_size=64), "has shape"),
])
def test_hf_bad_experts(tmp_path, tiny_models, update, want):
    """A Qwen3-MoE config whose experts do not match the checkpoint or cannot be run: one line
    naming the file."""
    d = moe_dir(tmp_path, tiny_models, "qwen3moe")
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(update)
    (d / "config.json").write_text(json.dumps(cfg))
    expect_error(d, want)


def test_hf_mixtral_missing_expert(tmp_path, tiny_models):
    """One expert matrix gone from a Mixtral checkpoint: named."""
    from safetensors.numpy import load_file, save_file
    d = moe_dir(tmp_path, tiny_models, "mixtral")
    sd = load_file(str(d / "model.safetensors"))
    del sd["model.layers.1.block_sparse_moe.experts.3.w2.weight"]
    save_file(sd, str(d / "model.safetensors"))
    expect_error(d, "missing tensor 'model.layers.1.block_sparse_moe.experts.3.w2.weight'")


@pytest.mark.parametrize("key,value,want", [
    ("qwen3moe.expert_used_count", 9, "invalid experts (9 of 8"),
    ("qwen3moe.expert_count", 16, "tensor 'blk.0.ffn_gate_inp.weight' has shape [8, 64], "
                                  "expected [16, 64]"),
    # 0 reads as absent: the experts are then feed_forward_length (128) wide, as in Mixtral
    ("qwen3moe.expert_feed_forward_length", 0, "tensor 'blk.0.ffn_gate_exps.weight' has shape "
                                               "[8, 32, 64], expected [8, 128, 64]"),
])
def test_gguf_bad_experts(tmp_path, tiny_models, key, value, want):
    """Expert metadata of a qwen3moe GGUF that disagrees with its tensors: one line."""
    buf = bytearray(Path(tiny_models["qwen3moe"]["gguf_Q8_0"]).read_bytes())
    kv, _, _ = walk_gguf(buf)
    off, t = kv[key]
    assert t == 4  # uint32
    struct.pack_into("<I", buf, off, value)
    expect_error(write(tmp_path, "moe.gguf", buf), want)


def test_gguf_missing_expert_tensor(tmp_path, tiny_models):
    buf = bytearray(Path(tiny_models["mixtral"]["gguf_F16"]).read_bytes())
    name = "blk.1.ffn_down_exps.weight"
    rename_tensor(buf, name, "blk.1.ffn_down_exps.weighx")
    expect_error(write(tmp_path, "moe.gguf", buf), f"missing tensor '{name}'")


def test_gguf_qwen2moe_missing_shared_expert(tmp_path, tiny_models):
    """A qwen2moe GGUF that says it has a shared expert but lacks one of its matrices: named."""
    buf = bytearray(Path(tiny_models["qwen2moe"]["gguf_F32"]).read_bytes())
    name = "blk.0.ffn_up_shexp.weight"
    rename_tensor(buf, name, "blk.0.ffn_up_shexp.weighx")
    expect_error(write(tmp_path, "moe.gguf", buf), f"missing tensor '{name}'")


def test_hf_qwen2moe_without_shared_size(tmp_path, tiny_models):
    """Qwen2-MoE's every layer has a shared expert: a config without its width is refused (it
    was loaded without the shared expert: wrong answers), and kv-plan says the same."""
    d = moe_dir(tmp_path, tiny_models, "qwen2moe")
    cfg = json.loads((d / "config.json").read_text())
    del cfg["shared_expert_intermediate_size"]
    (d / "config.json").write_text(json.dumps(cfg))
    expect_error(d, "shared_expert_intermediate_size")
    p = run_pagoda("kv-plan", "--model-config", d / "config.json", check=False)
    assert p.returncode != 0 and b"shared_expert_intermediate_size" in p.stderr


def test_hf_mixtral_config_on_a_dense_checkpoint(tmp_path, tiny_models):
    """A Mixtral config over a checkpoint without experts names Mixtral's router tensor."""
    d = tmp_path / "hf"
    shutil.copytree(tiny_models["llama"]["hf"], d)
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(model_type="mixtral", num_local_experts=4, num_experts_per_tok=2)
    (d / "config.json").write_text(json.dumps(cfg))
    expect_error(d, "missing tensor 'model.layers.0.block_sparse_moe.gate.weight'")
    del cfg["num_experts_per_tok"]  # kv-plan refuses what the loader refuses
    (d / "config.json").write_text(json.dumps(cfg))
    expect_error(d, "invalid experts (0 of 4")
    p = run_pagoda("kv-plan", "--model-config", d / "config.json", check=False)
    assert p.returncode != 0 and b"expert" in p.stderr


def test_kv_plan_qwen2moe_shared_expert_without_its_key(tmp_path, tiny_models):
    """A qwen2moe GGUF without expert_shared_feed_forward_length: the shared expert is
    feed_forward_length wide (as llama.cpp and the loader read it), in kv-plan's count too."""
    src = Path(tiny_models["qwen2moe"]["gguf_F32"])
    buf = bytearray(src.read_bytes())
    kv, _, _ = walk_gguf(buf)
    key = b"qwen2moe.expert_shared_feed_forward_length"
    o = buf.index(key)
    buf[o:o + len(key)] = b"qwen2moe.expert_shared_feed_forward_lengtX"  # the key is gone
    # feed_forward_length (128) must then be the shared expert's width: give it 64, as the file's
    struct.pack_into("<I", buf, kv["qwen2moe.feed_forward_length"][0], 64)
    path = write(tmp_path, "q2.gguf", buf)
    plan = lambda m: json.loads(run_pagoda("kv-plan", "-m", m, "--json").stdout)["model"]
    assert plan(path)["num_parameters"] == plan(src)["num_parameters"]
    ids = lambda m: run_pagoda("generate", "-m", m, "--ids", "5 6 7", "-n", "8", "--temperature",
                               "0", "--print-ids").stdout
    assert ids(path) == ids(src)
