"""Mistral's Tekken tokenizer (Mistral Nemo, Small 3, Ministral, Pixtral), id for id against
Mistral's own implementation.

The vocabulary is the real one: `tekken_240718.json` (Mistral Nemo's), shipped inside the
`mistral_common` package (Apache-2.0; installed from PyPI into the test virtualenv, not copied
into this repository). The reference ids come from `mistral_common`'s `Tekkenizer` (tiktoken
underneath: the pattern in the file, then byte-pair merges by rank with a whole-word lookup
first). Pagoda reads the vocabulary in both forms a user downloads:
  - a GGUF vocabulary, as llama.cpp's converter writes Mistral Nemo's (`tokenizer.ggml.model`
    gpt2, `tokenizer.ggml.pre` "tekken", byte-level token texts and merges), and
  - a Hugging Face `tokenizer.json`, as transformers' `convert_tekken_tokenizer` writes it
    (Split on the Tekken pattern + ByteLevel, BPE with ignore_merges).
Both are built here from the file (cached under ~/.cache/pagoda, keyed by the package version).
Compared: the shared tokenizer corpus (tok_corpus.py) without special-token parsing, a corpus
that stresses the pattern (case runs, marks, digits, slashes after newlines), the round trip
through `pagoda detokenize`, special-token parsing against the HF conversion, and the
pre-tokenizer's pieces against the `regex` module running the file's pattern."""
import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import tok_corpus  # noqa: E402
import util  # noqa: E402
from test_tokenizer import compare, compare_pieces, pagoda_encode, pagoda_jsonl  # noqa: E402

mistral_common = pytest.importorskip("mistral_common")
gguf = pytest.importorskip("gguf")


def tekken_file():
    import importlib.resources as res
    p = Path(str(res.files("mistral_common") / "data" / "tekken_240718.json"))
    if not p.exists():
        pytest.skip(f"{p} is missing from mistral_common {mistral_common.__version__}")
    return p


@pytest.fixture(scope="module")
def forms():
    """{"hf": dir with tokenizer.json, "gguf": vocabulary-only GGUF}, built once per version."""
    out = util.CACHE / f"tekken-{mistral_common.__version__}"
    hf, gg = out / "hf", out / "vocab-tekken.gguf"
    if not gg.exists():
        from transformers.integrations.mistral import convert_tekken_tokenizer
        tok = convert_tekken_tokenizer(str(tekken_file()))
        tok.save_pretrained(str(hf))
        j = json.loads((hf / "tokenizer.json").read_text(encoding="utf-8"))
        vocab = j["model"]["vocab"]
        tokens = [None] * len(vocab)
        for t, i in vocab.items():
            tokens[i] = t
        special = {a["id"] for a in j["added_tokens"] if a["special"]}
        assert None not in tokens and len(special) == 1000
        merges = [m if isinstance(m, str) else " ".join(m) for m in j["model"]["merges"]]
        tmp = gg.with_suffix(".tmp")
        w = gguf.GGUFWriter(str(tmp), "llama")
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("tekken")
        w.add_token_list(tokens)
        w.add_token_types([3 if i in special else 1 for i in range(len(tokens))])
        w.add_token_merges(merges)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_unk_token_id(0)
        w.add_add_bos_token(True)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        tmp.rename(gg)
    return {"hf": hf, "gguf": gg}


@pytest.fixture(scope="module")
def reference():
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer
    return Tekkenizer.from_file(str(tekken_file()))


def pattern_corpus():
    """Strings aimed at the pattern's corners: the upper-then-lower backtracking ([UP]*[LO]+
    gives back Lm/Lo/mark characters), a lead character that is a mark, punctuation or a space,
    single digits, " ?punct+[\\r\\n/]*" and the whitespace rules."""
    base = [
        "HTTPServer", "XMLHttpRequest", "iPhone", "McDonald's", "ABCdef GHI jkl", "ǅemal ǈ",
        "ÀÉÎõü", "É\u0301cole", "a\u0301\u0302b", "\u0301abc", "\u0301ABC", " \u0301x",
        "ʰello ʰELLO Aʰb", "日本語のテキスト", "한국어 텍스트", "Ελληνικά ΚΕΦΑΛΑΙΑ", "Русский ТЕКСТ",
        "x1y22z333", "3.14159", "1,000,000", "v2.0-beta", "a/b/c", "!!\n/\n//", "?\r\n/x",
        "end.\n\n\nnext", "  \t\n  x", "tail   ", "\n", "\r\n\r\n", " !", " !!x", "(ABC)", "'s 'T",
        "don't", "DON'T", "e-mail", "😀 emoji👍🏽 ok", "🇫🇷!", "a\u200db", "\u00a0nbsp", "x\u2028y",
        "Mc\u0308Z", "ABC\u0301", "ABC\u0301d", "AB\u02b0C", "\u02b0\u02b0", "\u0903\u0915\u093f",
    ]
    return base + [a + " " + b for a, b in zip(base, reversed(base))]


@pytest.mark.parametrize("form", ["gguf", "hf"])
def test_matches_mistral_common(form, forms, reference, pagoda_bin, capsys):
    texts = tok_corpus.corpus() + pattern_corpus()
    ref = [reference.encode(t, bos=False, eos=False) for t in texts]
    ours = pagoda_encode(forms[form], texts, special=False)
    compare(f"tekken ({form})", texts, ours, ref)
    back = [json.loads(x) for x in pagoda_jsonl("detokenize", forms[form], ours)]
    bad = [(t, b) for t, b in zip(texts, back) if t != b]
    assert not bad, f"{len(bad)} round trips differ, e.g. {bad[:5]}"
    with capsys.disabled():
        print(f"\n[tokenizer] tekken ({form}): {len(texts)} strings id-for-id with "
              f"mistral_common {mistral_common.__version__}, {len(texts)} round trips")


def test_special_parsing_matches_hf(forms):
    from tokenizers import Tokenizer
    hf = Tokenizer.from_file(str(forms["hf"] / "tokenizer.json"))
    spec = tok_corpus.special_corpus() + ["[INST] Hi [/INST]</s>[INST]x", "<s>[TOOL_CALLS]"]
    ref = [e.ids for e in hf.encode_batch(spec, add_special_tokens=False)]
    for form in ("gguf", "hf"):
        compare(f"tekken ({form}, special)", spec, pagoda_encode(forms[form], spec, True), ref)


@pytest.mark.parametrize("form", ["gguf", "hf"])
def test_pieces_match_the_pattern(form, forms):
    """The pieces themselves, against the `regex` module running tekken.json's pattern: ids
    alone can hide a wrong split where no merge crosses it."""
    pattern = json.loads(tekken_file().read_text(encoding="utf-8"))["config"]["pattern"]
    compare_pieces("tekken", forms[form], pattern, tok_corpus.corpus() + pattern_corpus())


NEMO_TEMPLATE = util.DATA / "chat-templates" / "mistralai-Mistral-Nemo-Instruct-2407.jinja"
CONVERSATIONS = [
    [{"role": "user", "content": "Hello there!"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "What is 2+2?"}],
    [{"role": "user", "content": "Écris un haïku sur la mer.\nMerci !"},
     {"role": "assistant", "content": "Vagues  d'argent..."},
     {"role": "user", "content": "HTTPServer/XMLHttpRequest: 12 345?"}],
]


@pytest.fixture(scope="module")
def nemo(forms):
    """A tiny random MistralForCausalLM in Mistral Nemo's shape where it matters here: the real
    vocabulary and tokenizer (131,072 tokens), head_dim set apart from hidden/heads (Nemo: 128
    against 5120 / 32) and Nemo's chat template -- a Hugging Face directory as users download."""
    import shutil
    out = util.CACHE / f"tekken-{mistral_common.__version__}" / "tiny-nemo"
    if not (out / "config.json").exists():
        import torch
        import transformers
        cfg = transformers.MistralConfig(
            vocab_size=131072, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=32, rope_theta=1e6,
            max_position_embeddings=1024, sliding_window=None, tie_word_embeddings=False,
            bos_token_id=1, eos_token_id=2)
        torch.manual_seed(7)
        model = transformers.MistralForCausalLM(cfg)
        with torch.no_grad():  # wider than the 0.02 init: logits far from uniform
            for p in model.parameters():
                if p.dim() == 2:
                    p.normal_(0, 0.3)
        tmp = out.with_name("tiny-nemo.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(str(tmp))
        for f in forms["hf"].iterdir():
            shutil.copy(f, tmp / f.name)
        tc = json.loads((tmp / "tokenizer_config.json").read_text(encoding="utf-8"))
        tc["chat_template"] = NEMO_TEMPLATE.read_text(encoding="utf-8")
        (tmp / "tokenizer_config.json").write_text(json.dumps(tc), encoding="utf-8")
        tmp.rename(out)
    return out


def mistral_chat_ids(messages):
    """mistral_common's own encoding of a chat (Mistral's reference for its instruct format)."""
    from mistral_common.protocol.instruct.messages import (AssistantMessage, SystemMessage,
                                                           UserMessage)
    from mistral_common.protocol.instruct.request import ChatCompletionRequest
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer
    kinds = {"system": SystemMessage, "user": UserMessage, "assistant": AssistantMessage}
    mt = MistralTokenizer.from_file(str(tekken_file()))
    req = ChatCompletionRequest(messages=[kinds[m["role"]](content=m["content"])
                                          for m in messages])
    return mt.encode_chat_completion(req).tokens


def test_nemo_chat_prompt_and_logits(nemo, tmp_path):
    """Served as Mistral Nemo is: a chat's prompt ids (`/tokenize` with messages, the ids a chat
    completion runs on) equal mistral_common's encoding of the same chat, and the model's
    logits over them match transformers (head_dim 32 with hidden 64 and 4 heads)."""
    import numpy as np
    import torch
    import transformers
    from server_util import Server
    from test_forward import pagoda_logits
    with Server(nemo) as s:
        for msgs in CONVERSATIONS:
            r = util.post(s, "/tokenize", {"messages": msgs})
            assert r.status_code == 200, r.text
            assert r.json()["tokens"] == mistral_chat_ids(msgs), msgs
        r = util.post(s, "/v1/chat/completions", {"messages": CONVERSATIONS[1], "max_tokens": 4,
                                                  "temperature": 0})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] == len(mistral_chat_ids(CONVERSATIONS[1]))
    ids = mistral_chat_ids(CONVERSATIONS[2])
    model = transformers.MistralForCausalLM.from_pretrained(str(nemo), dtype=torch.float32)
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits[0].numpy()
    a = pagoda_logits(nemo, ids, [], tmp_path)
    rel = float(np.abs(a - ref).max() / np.abs(ref).max())
    print(f"tiny Nemo, {len(ids)} chat prompt ids: logits rel err {rel:.2e} against transformers")
    assert rel <= 1e-4, rel  # F32 on both sides (test_forward.py's bound and why)
    assert (a.argmax(1) == ref.argmax(1)).all()


@pytest.mark.skipif(not os.environ.get("PAGODA_ASAN_BUILD"), reason="PAGODA_ASAN_BUILD is not set")
def test_tekken_under_asan(forms, tmp_path):
    """The Tekken matcher and its ids under AddressSanitizer + UBSan (scripts/test.sh's build):
    the whole corpus through --pieces and through encoding, in both forms, with no report."""
    import subprocess
    from server_util import check_no_sanitizer_report
    binary = Path(os.environ["PAGODA_ASAN_BUILD"]) / "pagoda"
    f = tmp_path / "corpus.jsonl"
    texts = tok_corpus.corpus() + pattern_corpus()
    f.write_text("".join(json.dumps(t) + "\n" for t in texts), encoding="utf-8")
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1:halt_on_error=1",
               UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1")
    for form in ("gguf", "hf"):
        for extra in (["--pieces"], ["--no-bos", "--no-special"], []):
            p = subprocess.run([str(binary), "tokenize", "-m", str(forms[form]), *extra,
                                "--jsonl", str(f)], capture_output=True, env=env, timeout=600)
            check_no_sanitizer_report(p.stderr.decode(errors="replace"))
            assert p.returncode == 0, (form, extra, p.stderr[-2000:])
            assert p.stdout.decode().count("\n") == len(texts)
