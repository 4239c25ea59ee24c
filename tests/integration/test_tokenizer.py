"""`pagoda tokenize` / `pagoda detokenize` against Hugging Face `tokenizers`, id for id.

References (no hub access: every reference is built from the GGUF files we ship):
  smollm2   SmolLM2's vocabulary from the default model GGUF. transformers' GGUF conversion
            (AutoTokenizer.from_pretrained(dir, gguf_file=...)) gives a plain ByteLevel
            pre-tokenizer, but SmolLM2's real tokenizer.json is Sequence[Digits(individual_digits
            =true), ByteLevel(add_prefix_space=false, use_regex=true)], so the reference is built
            with `tokenizers` from the GGUF vocab/merges with that real configuration.
  llama3    ggml-vocab-llama-bpe.gguf: BPE(ignore_merges=true) + Split(Llama 3 regex, isolated) +
            ByteLevel(add_prefix_space=false, use_regex=false), decoder ByteLevel - as in
            Meta-Llama-3's tokenizer.json.
  qwen2     ggml-vocab-qwen2.gguf: NFC normalizer + Split(Qwen2 regex, isolated) + ByteLevel, as
            in Qwen2's tokenizer.json.
  llama-spm ggml-vocab-llama-spm.gguf: BPE(byte_fallback=true, fuse_unk=true) with the merges
            transformers derives from the GGUF scores, normalizer Prepend("▁") + Replace(" ", "▁"),
            no pre-tokenizer - as in Llama-2's tokenizer.json.
Compared: every corpus string without BOS and without special-token parsing (HF:
encode_special_tokens=True, which still matches non-special added tokens, as pagoda does), and
a smaller corpus with special parsing on. Round trip: pagoda's detokenize of pagoda's ids must
give the input back exactly (NFC of the input for Qwen2); for SentencePiece that means the
dummy-prefix space added when encoding is dropped again when decoding.
"""
import functools
import json
import random
import os
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import tok_corpus  # noqa: E402
import util  # noqa: E402

tokenizers = pytest.importorskip("tokenizers")
gguf = pytest.importorskip("gguf")

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers  # noqa: E402
from tokenizers import pre_tokenizers  # noqa: E402

VOCAB = util.DATA / "vocab"
LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
             r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_RE = LLAMA3_RE.replace(r"\p{N}{1,3}", r"\p{N}")


@functools.lru_cache(maxsize=None)
def read_gguf_vocab(path):
    r = gguf.GGUFReader(str(path))

    def arr(key):
        f = r.fields.get(key)
        if f is None:
            return None
        vals = [f.parts[i] for i in f.data]
        if f.types[-1] == gguf.GGUFValueType.STRING:
            return [bytes(v).decode("utf-8") for v in vals]
        return [v[0].item() for v in vals]

    return arr("tokenizer.ggml.tokens"), arr("tokenizer.ggml.token_type"), arr(
        "tokenizer.ggml.merges"), arr("tokenizer.ggml.scores")


def add_gguf_specials(tok, tokens, types):
    """Unknown and control tokens (types 2, 3) as special added tokens (as "<unk>", "<s>" are in
    Llama 2's tokenizer.json), user-defined (4) as plain added ones."""
    tok.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                            for i, t in enumerate(types) if t in (2, 3)])
    tok.add_tokens([AddedToken(tokens[i], special=False, normalized=False)
                    for i, t in enumerate(types) if t == 4])


def build_bytelevel(path, kind):
    tokens, types, merges, _ = read_gguf_vocab(path)
    vocab = {t: i for i, t in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    tok = Tokenizer(models.BPE(vocab, pairs, ignore_merges=(kind == "llama3")))
    kind = "llama3" if kind == "smaug" else kind  # the same split, every merge applied
    if kind == "smollm2":
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_RE if kind == "llama3" else QWEN2_RE),
                                 behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    if kind == "qwen2":
        tok.normalizer = normalizers.NFC()
    tok.decoder = decoders.ByteLevel()
    add_gguf_specials(tok, tokens, types)
    return tok


def build_spm(path):
    tokens, types, _, _ = read_gguf_vocab(path)
    # The merges a SentencePiece BPE model implies (pairs ordered by the merged piece's score),
    # as transformers' GGUF converter extracts them.
    from transformers import AutoTokenizer
    conv = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    merges = json.loads(conv.backend_tokenizer.to_str())["model"]["merges"]
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab, [tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1))
                                       for m in merges],
                               unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"),
                                           normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    add_gguf_specials(tok, tokens, types)
    return tok


VOCABS = {
    "smollm2": (lambda: util.DEFAULT_MODEL, lambda p: build_bytelevel(p, "smollm2")),
    "llama3": (lambda: VOCAB / "ggml-vocab-llama-bpe.gguf", lambda p: build_bytelevel(p, "llama3")),
    "qwen2": (lambda: VOCAB / "ggml-vocab-qwen2.gguf", lambda p: build_bytelevel(p, "qwen2")),
    # SmolLM3's GGUF files say tokenizer.ggml.pre "smaug-bpe": the Llama 3 vocabulary retagged
    "smaug": (lambda: smaug_vocab(), lambda p: build_bytelevel(p, "smaug")),
    "llama-spm": (lambda: VOCAB / "ggml-vocab-llama-spm.gguf", build_spm),
}


@functools.lru_cache(maxsize=None)
def smaug_vocab():
    """ggml-vocab-llama-bpe.gguf with tokenizer.ggml.pre = "smaug-bpe" (made once, cached)."""
    import subprocess
    import sys
    out = util.CACHE / "vocab-smaug-bpe.gguf"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tool = Path(sys.executable).with_name("gguf-new-metadata")
        tmp = out.with_suffix(".tmp")
        subprocess.run([str(tool), str(VOCAB / "ggml-vocab-llama-bpe.gguf"), str(tmp),
                        "--pre-tokenizer", "smaug-bpe"], check=True, capture_output=True)
        tmp.rename(out)
    return out


def hf_tokenizer(name):
    """The HF reference of VOCABS[name], built once per session (tens of seconds for 128k)."""
    return VOCABS[name][1](VOCABS[name][0]())


def pagoda_jsonl(cmd, model, lines, *extra):
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False, encoding="utf-8") as f:
        for x in lines:
            f.write(json.dumps(x, ensure_ascii=False) + "\n")
        name = f.name
    try:
        p = util.run_pagoda(cmd, "-m", model, *extra, "--jsonl", name)
    finally:
        os.unlink(name)
    out = p.stdout.decode("utf-8").split("\n")
    assert out[-1] == ""
    return out[:-1]


def pagoda_encode(model, texts, special):
    extra = ["--no-bos"] + ([] if special else ["--no-special"])
    out = pagoda_jsonl("tokenize", model, texts, *extra)
    assert len(out) == len(texts)
    return [[int(x) for x in line.split()] for line in out]


def compare(name, texts, ours, ref):
    bad = [(t, o, r) for t, o, r in zip(texts, ours, ref) if o != r]
    msg = "\n".join(f"  {t!r}\n    pagoda {o}\n    hf     {r}" for t, o, r in bad[:10])
    assert not bad, f"{name}: {len(bad)}/{len(texts)} strings differ:\n{msg}"


@pytest.fixture(scope="module")
def corpus():
    c = tok_corpus.corpus()
    assert len(c) >= 2000
    return c


@pytest.mark.parametrize("name", list(VOCABS))
def test_matches_hf(name, corpus, pagoda_bin, capsys):
    path = VOCABS[name][0]()
    if not path.exists():
        pytest.skip(f"{path} missing")
    ref_tok = hf_tokenizer(name)

    # 1. no special-token parsing
    ref_tok.encode_special_tokens = True
    ref = [e.ids for e in ref_tok.encode_batch(corpus, add_special_tokens=False)]
    ours = pagoda_encode(path, corpus, special=False)
    compare(name, corpus, ours, ref)

    # 2. special parsing on
    spec = tok_corpus.special_corpus()
    ref_tok.encode_special_tokens = False
    ref_s = [e.ids for e in ref_tok.encode_batch(spec, add_special_tokens=False)]
    ours_s = pagoda_encode(path, spec, special=True)
    compare(name + " (special)", spec, ours_s, ref_s)

    # 3. round trip through pagoda detokenize
    back = [json.loads(x) for x in pagoda_jsonl("detokenize", path, ours)]
    assert len(back) == len(corpus)
    want = corpus
    if name == "qwen2":
        import unicodedata
        want = [unicodedata.normalize("NFC", s) for s in corpus]
    bad = [(s, b) for s, b in zip(want, back) if s != b]
    assert not bad, f"{name}: {len(bad)} round trips differ, e.g. {bad[:5]}"
    # and pagoda's decode agrees with HF's on the same ids
    hf_dec = ref_tok.decode_batch(ours, skip_special_tokens=False)
    bad = [(s, b) for s, b in zip(hf_dec, back) if s != b]
    assert not bad, f"{name}: {len(bad)} decodes differ from HF, e.g. {bad[:5]}"
    with capsys.disabled():
        print(f"\n[tokenizer] {name}: {len(corpus)} strings id-for-id, {len(spec)} with "
              f"special parsing, {len(corpus)} round trips")


def _bytes_to_unicode():
    """GPT-2's byte-level alphabet: the character each byte is written as in the vocabulary."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
          + list(range(ord("®"), ord("ÿ") + 1)))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


@pytest.mark.parametrize("name", list(VOCABS))
def test_decode_ill_formed_bytes(name, pagoda_bin):
    """Id sequences that spell ill-formed UTF-8 (byte tokens 0x80-0xFF among ordinary ones) decode
    to valid text with each maximal ill-formed subpart as U+FFFD: for the byte-level vocabularies
    exactly HF's decode (Rust's from_utf8_lossy); for SentencePiece the same rule, which is
    Python's bytes.decode("utf-8", "replace") of the pieces' bytes (HF's ByteFallback instead
    replaces every byte of an ill-formed run of byte tokens, a departure docs/architecture.md
    records)."""
    path = VOCABS[name][0]()
    if not path.exists():
        pytest.skip(f"{path} missing")
    tokens, types, _, _ = read_gguf_vocab(path)
    spm = name == "llama-spm"
    if spm:
        byte_ids = [tokens.index(f"<0x{b:02X}>") for b in range(0x80, 0x100)]
    else:
        alpha = _bytes_to_unicode()
        vocab = {t: i for i, t in enumerate(tokens)}
        # (a vocabulary may lack bytes no UTF-8 text holds: 0xC0, 0xC1, 0xF5-0xFF)
        byte_ids = [vocab[alpha[b]] for b in range(0x80, 0x100) if alpha[b] in vocab]
    normal = [i for i, t in enumerate(types) if t == 1][:20000]
    rng = random.Random(11)
    seqs = [[rng.choice(byte_ids) if rng.random() < 0.6 else rng.choice(normal)
             for _ in range(rng.randint(1, 10))] for _ in range(400)]
    got = [json.loads(x) for x in pagoda_jsonl("detokenize", path, seqs, "--no-special")]
    if spm:
        def raw(i):
            t = tokens[i]
            return bytes([int(t[3:5], 16)]) if t.startswith("<0x") else \
                t.replace("\u2581", " ").encode()
        want = []
        for q in seqs:
            b = b"".join(raw(i) for i in q)
            want.append((b[1:] if b.startswith(b" ") else b).decode("utf-8", "replace"))
    else:
        want = hf_tokenizer(name).decode_batch(seqs, skip_special_tokens=False)
    bad = [(q, w, g) for q, w, g in zip(seqs, want, got) if w != g]
    assert not bad, f"{name}: {len(bad)} of {len(seqs)} differ, e.g. {bad[:3]}"
    assert sum("\ufffd" in g for g in got) > 100  # the cases are there


def test_cli_errors(pagoda_bin, tmp_path):
    p = util.run_pagoda("tokenize", "-m", tmp_path / "nope.gguf", "hi", check=False)
    assert p.returncode == 1
    err = p.stderr.decode()
    assert "nope.gguf" in err and err.count("\n") == 1
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00garbage")
    p = util.run_pagoda("tokenize", "-m", bad, "hi", check=False)
    assert p.returncode == 1 and "bad.gguf" in p.stderr.decode()
    p = util.run_pagoda("detokenize", "-m", VOCAB / "ggml-vocab-qwen2.gguf", "99999999", check=False)
    assert p.returncode != 0 and p.returncode < 128


def test_cli_file_and_bos(pagoda_bin, default_model, tmp_path):
    f = tmp_path / "in.txt"
    f.write_bytes(b"Hello\n  world\n")
    a = util.run_pagoda("tokenize", "-m", default_model, "--file", f).stdout.split()
    b = util.run_pagoda("tokenize", "-m", default_model, "Hello\n  world\n").stdout.split()
    assert a == b and len(a) > 2
    spm = VOCAB / "ggml-vocab-llama-spm.gguf"
    with_bos = util.run_pagoda("tokenize", "-m", spm, "Hello").stdout.split()
    no_bos = util.run_pagoda("tokenize", "-m", spm, "--no-bos", "Hello").stdout.split()
    assert with_bos == [b"1"] + no_bos
    text = util.run_pagoda("detokenize", "-m", spm, *[x.decode() for x in no_bos]).stdout
    assert text == b"Hello"


@pytest.mark.parametrize("name", list(VOCABS))
def test_hf_directory(name, pagoda_bin, tmp_path, capsys):
    """A Hugging Face model directory: the reference saved as tokenizer.json + a config; pagoda
    must recognise its normalizer / pre-tokenizer and give the same ids (merges by rank)."""
    path = VOCABS[name][0]()
    if not path.exists():
        pytest.skip(f"{path} missing")
    tok = VOCABS[name][1](path)
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "eos_token": {"content": "</s>"}, "bos_token": None, "add_bos_token": False,
        "chat_template": "{{ x }}"}))
    texts = tok_corpus.corpus()[:600]
    ref = [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
    compare(name + " tokenizer.json", texts, pagoda_encode(tmp_path, texts, special=True), ref)
    with capsys.disabled():
        print(f"\n[tokenizer] {name} tokenizer.json: {len(texts)} strings id-for-id")


@pytest.mark.parametrize("flag", [True, False])
def test_gguf_add_eos_token(pagoda_bin, tmp_path, flag):
    """tokenizer.ggml.add_eos_token (llama.cpp's; set for embedding models that pool on the end
    of text): EOS is appended to a text encoded with special tokens, and only then."""
    from test_bad_input import walk_gguf
    buf = bytearray((util.DATA / "vocab" / "ggml-vocab-llama-spm.gguf").read_bytes())
    kv, _, _ = walk_gguf(buf)
    off, t = kv["tokenizer.ggml.add_eos_token"]
    assert t == 7 and buf[off] == 0  # a bool, false in the file
    buf[off] = int(flag)
    path = tmp_path / "vocab.gguf"
    path.write_bytes(bytes(buf))
    ids = [int(x) for x in util.run_pagoda("tokenize", "-m", path, "Hello world").stdout.split()]
    plain = [int(x) for x in
             util.run_pagoda("tokenize", "-m", path, "--no-bos", "Hello world").stdout.split()]
    assert ids[0] == 1 and (ids[-1] == 2) == flag and ids[1:len(ids) - flag] == plain


def pagoda_pieces(model, texts):
    """`pagoda tokenize --pieces`: the pre-tokenizer's pieces of each text."""
    return [json.loads(x) for x in pagoda_jsonl("tokenize", model, texts, "--pieces")]


def compare_pieces(name, model, pattern, texts):
    """The hand-written pre-tokenizer against the `regex` module running the vocabulary's own
    pattern (leftmost-first alternation with backtracking, as Oniguruma and fancy-regex)."""
    import regex
    ours = pagoda_pieces(model, texts)
    ref = [regex.findall(pattern, t) for t in texts]
    bad = [(t, o, r) for t, o, r in zip(texts, ours, ref) if o != r]
    msg = "\n".join(f"  {t!r}\n    pagoda {o}\n    regex  {r}" for t, o, r in bad[:10])
    assert not bad, f"{name}: {len(bad)}/{len(texts)} strings split differently:\n{msg}"


@pytest.mark.parametrize("name,pattern", [("llama3", LLAMA3_RE), ("qwen2", QWEN2_RE)])
def test_pieces_match_regex(name, pattern, corpus):
    compare_pieces(name, VOCABS[name][0](), pattern, corpus)
