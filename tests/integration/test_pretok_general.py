"""The general pre-tokenizer engine (issue 39): every GGUF `tokenizer.ggml.pre` family Pagoda
knows and any tokenizer.json Sequence of Split / Digits / Punctuation / ByteLevel / ...
pre-tokenizers, id for id against Hugging Face `tokenizers`.

References:
  - llama.cpp's vocabulary test files (ggml-vocab-NAME.gguf with .inp strings and the .out ids HF
    tokenizers gave them), taken from the llama-cpp-python 0.3.36 source distribution: fetched
    once with `pip download --no-binary :all: --no-deps llama-cpp-python==0.3.36` and only those
    files extracted into ~/.cache/pagoda/llama-cpp-python-0.3.36-vocab.
  - HF `tokenizers` Tokenizers built from each GGUF's vocabulary and merges with that model's real
    pre_tokenizer (and normalizer) configuration (pretok_configs.py), saved as tokenizer.json:
    Pagoda loads that directory and the GGUF, and both must give HF's ids over the mixed corpus
    (tok_corpus.pretok_corpus: code, CJK, Arabic, Devanagari, emoji, digit and whitespace runs,
    contractions in every case, control characters), decode back to the text, and split it into
    HF's pieces (`pre_tokenize_str`).
  - Families without a vocabulary in llama.cpp's files -- gpt-4o (o200k: Phi-4, GPT-4o), deepseek-v3
    (V3/R1) and the rest of pretok_configs.PIPELINES -- use their real pre-tokenizer with a borrowed
    byte-level vocabulary, gpt-2's (a GGUF retagged with gguf-new-metadata --pre-tokenizer): the
    splitting is what is under test, and the ids then follow from it.
  - The engine alone (`pagoda tokenize --split-regex`) against Oniguruma through HF's Split, and
    the match lists against the Python `regex` module, for every pattern of the table.
Hostile inputs (100k-character runs, quantifier bait) must finish and split back into their text."""
import functools
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import unicodedata
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import pretok_configs as cfg  # noqa: E402
import tok_corpus  # noqa: E402
import util  # noqa: E402

tokenizers = pytest.importorskip("tokenizers")
gguf = pytest.importorskip("gguf")
from tokenizers import Regex, Tokenizer, pre_tokenizers  # noqa: E402

LLAMACPP_PY = "0.3.36"


@functools.lru_cache(maxsize=None)
def llamacpp_models():
    """The folder of llama.cpp's vocabulary test files (fetched and extracted once)."""
    out = util.CACHE / f"llama-cpp-python-{LLAMACPP_PY}-vocab"
    names = [f"ggml-vocab-{n}.gguf{ext}" for n in cfg.SDIST_VOCABS for ext in ("", ".inp", ".out")]
    if all((out / n).exists() for n in names):
        return out
    with tempfile.TemporaryDirectory() as tmp:
        p = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-binary", ":all:",
                            "--no-deps", f"llama-cpp-python=={LLAMACPP_PY}", "-d", tmp],
                           capture_output=True, timeout=900)
        if p.returncode != 0:
            pytest.skip(f"pip download llama-cpp-python=={LLAMACPP_PY} failed: "
                        f"{p.stderr.decode(errors='replace')[-300:]}")
        sdist = next(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
        part = out.with_name(out.name + ".part")
        part.mkdir(parents=True, exist_ok=True)
        with tarfile.open(sdist) as tf:
            for m in tf.getmembers():
                base = m.name.rsplit("/", 1)[-1]
                if base in names and "/vendor/llama.cpp/models/" in m.name and m.isfile():
                    with tf.extractfile(m) as src:
                        (part / base).write_bytes(src.read())
        missing = [n for n in names if not (part / n).exists()]
        assert not missing, f"not in the sdist: {missing}"
        part.rename(out) if not out.exists() else None
    return out


def vocab_path(name):
    return llamacpp_models() / f"ggml-vocab-{name}.gguf"


def reference_cases(name):
    base = llamacpp_models() / f"ggml-vocab-{name}.gguf"
    inp = base.with_name(base.name + ".inp").read_text(encoding="utf-8")
    texts = inp.split("\n__ggml_vocab_test__\n")[:-1]
    out = base.with_name(base.name + ".out").read_text().split("\n")[:-1]
    assert len(texts) == len(out)
    return texts, [[int(x) for x in line.split()] for line in out]


@functools.lru_cache(maxsize=None)
def gguf_vocab(path):
    r = gguf.GGUFReader(str(path))

    def arr(key):
        f = r.fields.get(key)
        vals = [f.parts[i] for i in f.data]
        if f.types[-1] == gguf.GGUFValueType.STRING:
            return [bytes(v).decode("utf-8") for v in vals]
        return [v[0].item() for v in vals]

    return arr("tokenizer.ggml.tokens"), arr("tokenizer.ggml.token_type"), arr(
        "tokenizer.ggml.merges")


def tokenizer_json(vocab_file, name, pre=None):
    """A tokenizer.json (as a dict) for the GGUF's vocabulary and merges with name's real
    normalizer / pre_tokenizer (or pre); control and unknown tokens special, user-defined ones
    plain added tokens (as in the models' files)."""
    tokens, types, merges = gguf_vocab(str(vocab_file))
    norm, real_pre, ignore = cfg.PIPELINES[name]
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": ty in (2, 3)}
             for i, (t, ty) in enumerate(zip(tokens, types)) if ty in (2, 3, 4)]
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": norm, "pre_tokenizer": pre or real_pre, "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None, "fuse_unk": False,
                  "byte_fallback": False, "ignore_merges": ignore,
                  "vocab": {t: i for i, t in enumerate(tokens)},
                  "merges": [m.split(" ", 1) for m in merges]},
    }


@functools.lru_cache(maxsize=None)
def hf_dir(vocab_file, name):
    """A Hugging Face tokenizer directory for (vocabulary, family), built once per session."""
    d = Path(tempfile.mkdtemp(prefix=f"pretok-{name}-"))
    (d / "tokenizer.json").write_text(json.dumps(tokenizer_json(vocab_file, name)),
                                      encoding="utf-8")
    return d


@functools.lru_cache(maxsize=None)
def hf_tok(vocab_file, name):
    return Tokenizer.from_file(str(hf_dir(vocab_file, name) / "tokenizer.json"))


@functools.lru_cache(maxsize=None)
def borrowed_gguf(name):
    """gpt-2's vocabulary with tokenizer.ggml.pre = name (made once, cached)."""
    out = util.CACHE / f"pretok-borrowed-{LLAMACPP_PY}" / f"vocab-gpt2-as-{name}.gguf"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tool = Path(sys.executable).with_name("gguf-new-metadata")
        tmp = out.with_suffix(".tmp")
        subprocess.run([str(tool), str(vocab_path("gpt-2")), str(tmp), "--pre-tokenizer", name],
                       check=True, capture_output=True)
        tmp.rename(out)
    return out


def pagoda_jsonl(cmd, model, lines, *extra, check=True):
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False, encoding="utf-8") as f:
        for x in lines:
            f.write(json.dumps(x, ensure_ascii=False) + "\n")
        name = f.name
    try:
        args = [cmd] + (["-m", model] if model else []) + list(extra) + ["--jsonl", name]
        p = util.run_pagoda(*args, check=check)
    finally:
        os.unlink(name)
    out = p.stdout.decode("utf-8").split("\n")
    assert out[-1] == ""
    return out[:-1]


def pagoda_ids(model, texts, *extra):
    out = pagoda_jsonl("tokenize", model, texts, "--no-bos", "--no-special", *extra)
    assert len(out) == len(texts)
    return [[int(x) for x in line.split()] for line in out]


def pagoda_pieces(model, texts, *extra):
    return [json.loads(x) for x in pagoda_jsonl("tokenize", model, texts, "--pieces-bytelevel",
                                                *extra)]


def split_regex(pattern, texts, behavior="Isolated", invert=False):
    extra = ["--split-regex", pattern, "--split-behavior", behavior] + (["--invert"] if invert
                                                                           else [])
    return [json.loads(x) for x in pagoda_jsonl("tokenize", None, texts, *extra)]


def compare(what, texts, ours, ref):
    bad = [(t, o, r) for t, o, r in zip(texts, ours, ref) if o != r]
    msg = "\n".join(f"  {t!r}\n    pagoda {o}\n    hf     {r}" for t, o, r in bad[:8])
    assert not bad, f"{what}: {len(bad)}/{len(texts)} differ:\n{msg}"


def hf_ids(tok, texts):
    tok.encode_special_tokens = True  # no special-token parsing, as pagoda's --no-special
    return [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]


@pytest.fixture(scope="module")
def corpus():
    c = tok_corpus.pretok_corpus()
    assert len(c) >= 3000
    return c


@pytest.fixture(scope="module")
def small(corpus):
    """The strings pretok_corpus adds to the shared corpus, and the first 600 of that."""
    return corpus[:600] + corpus[2400:]


def check_round_trip(name, model, tok, texts, ours):
    """pagoda detokenize of pagoda's ids gives the text back (its NFC form under an NFC
    normalizer) -- or, where the vocabulary lacks some byte's character (falcon's lacks U+000B,
    among others, which HF's BPE then drops, as Pagoda does), HF's decode of the same ids.
    (Where the two differ otherwise it is on purpose: DeepSeek's added tokens "ö", "ø", ... stand
    for the bytes UTF-8 never uses, and HF's decode turns them into U+FFFD where Pagoda, as
    llama.cpp, gives their text.)"""
    back = [json.loads(x) for x in pagoda_jsonl("detokenize", model, ours)]
    assert len(back) == len(texts)
    tokens, _, _ = gguf_vocab(str(vocab_path(name) if name in cfg.SDIST_VOCABS
                                  else vocab_path("gpt-2")))
    have = set(tokens)
    alphabet = [chr(c) for c in range(33, 127)] + [chr(c) for c in range(161, 173)] + \
        [chr(c) for c in range(174, 256)] + [chr(c) for c in range(256, 256 + 68)]
    if all(c in have for c in alphabet):
        want = ([unicodedata.normalize("NFC", t) for t in texts] if cfg.PIPELINES[name][0]
                else texts)
    else:
        want = tok.decode_batch(ours, skip_special_tokens=False)
    bad = [(s, b) for s, b in zip(want, back) if s != b]
    assert not bad, f"{name}: {len(bad)} round trips differ, e.g. {bad[:3]}"


@pytest.mark.parametrize("name", cfg.SDIST_VOCABS)
def test_llamacpp_reference_ids(name, pagoda_bin):
    """llama.cpp's reference cases: Pagoda's ids from the GGUF (and, for the hand-written
    pre-tokenizers, through the general engine too), and the HF tokenizer this test builds from
    pretok_configs give the ids HF gave them -- the second proves the configurations real."""
    texts, ref = reference_cases(name)
    compare(f"{name} (gguf)", texts, pagoda_ids(vocab_path(name), texts), ref)
    compare(f"{name} (general engine)", texts,
            pagoda_ids(vocab_path(name), texts, "--general-pretok"), ref)
    compare(f"{name} (HF built from pretok_configs)", texts,
            hf_ids(hf_tok(str(vocab_path(name)), name), texts), ref)


@pytest.mark.parametrize("name", cfg.SDIST_VOCABS)
def test_corpus_gguf_and_hf_dir(name, corpus, pagoda_bin, capsys):
    """The mixed corpus id for id against HF in both forms Pagoda loads, the round trip, and the
    pieces against HF's pre_tokenize_str."""
    vf = vocab_path(name)
    tok = hf_tok(str(vf), name)
    ref = hf_ids(tok, corpus)
    ours = pagoda_ids(vf, corpus)
    compare(f"{name} (gguf)", corpus, ours, ref)
    compare(f"{name} (tokenizer.json)", corpus, pagoda_ids(hf_dir(str(vf), name), corpus), ref)
    check_round_trip(name, vf, tok, corpus, ours)
    hf_pieces = [[p for p, _ in tok.pre_tokenizer.pre_tokenize_str(t)] for t in corpus]
    compare(f"{name} pieces", corpus, pagoda_pieces(hf_dir(str(vf), name), corpus), hf_pieces)
    with capsys.disabled():
        print(f"\n[pretok] {name}: {len(corpus)} strings id-for-id with HF (gguf and "
              f"tokenizer.json), round trips, pieces")


BORROWED = [n for n in cfg.PIPELINES if n not in cfg.SDIST_VOCABS]


@pytest.mark.parametrize("name", BORROWED)
def test_borrowed_vocab(name, small, pagoda_bin):
    """Families with no vocabulary among llama.cpp's test files (gpt-4o/o200k, deepseek-v3, ...):
    their real pre-tokenizer over gpt-2's byte-level vocabulary, as a GGUF tagged with the name
    and as a tokenizer.json, against HF; and the round trip."""
    gf = borrowed_gguf(name)
    vf = str(vocab_path("gpt-2"))
    tok = hf_tok(vf, name)
    ref = hf_ids(tok, small)
    ours = pagoda_ids(gf, small)
    compare(f"{name} (gguf)", small, ours, ref)
    compare(f"{name} (tokenizer.json)", small, pagoda_ids(hf_dir(vf, name), small), ref)
    hf_pieces = [[p for p, _ in tok.pre_tokenizer.pre_tokenize_str(t)] for t in small]
    compare(f"{name} pieces (gguf)", small, pagoda_pieces(gf, small), hf_pieces)
    check_round_trip(name, gf, tok, small, ours)


@pytest.mark.parametrize("name", cfg.FAST_PATHS)
def test_general_engine_reproduces_fast_paths(name, corpus, pagoda_bin):
    """The hand-written pre-tokenizers (GPT-2, SmolLM, Llama 3, Qwen2, Tekken) and the general
    engine running the pipelines they stand for give the same pieces and ids."""
    model = vocab_path(name) if name in cfg.SDIST_VOCABS else borrowed_gguf(name)
    fast = pagoda_pieces(model, corpus)
    general = pagoda_pieces(model, corpus, "--general-pretok")
    compare(f"{name} pieces, general engine vs hand-written", corpus, general, fast)
    compare(f"{name} ids, general engine vs hand-written", corpus,
            pagoda_ids(model, corpus, "--general-pretok"), pagoda_ids(model, corpus))


def _hf_split_pieces(pattern, texts, behavior="isolated", invert=False):
    pt = pre_tokenizers.Split(Regex(pattern), behavior=behavior, invert=invert)
    return [[p for p, _ in pt.pre_tokenize_str(t)] for t in texts]


@pytest.mark.parametrize("pattern", cfg.split_patterns())
def test_engine_against_oniguruma_and_regex(pattern, corpus, pagoda_bin):
    """Each Split pattern of the table alone: the engine's pieces equal Oniguruma's (HF's Split,
    Isolated) on the corpus; and its matches equal the Python `regex` module's, searching on from
    each match's end as Oniguruma's find_iter does (patterns with anchors or \\b are left to
    Oniguruma: Ruby's $ is a line anchor, and `regex`'s \\w is Unicode's, not Oniguruma's)."""
    ours = split_regex(pattern, corpus)
    compare("pieces vs Oniguruma", corpus, ours, _hf_split_pieces(pattern, corpus))
    if any(x in pattern for x in ("$", "^", "\\b")):
        return
    import regex
    rx = regex.compile(pattern)

    def find_iter(t):  # Oniguruma's find_iter (the onig crate's FindMatches)
        out, pos, last = [], 0, None
        while pos <= len(t):
            m = rx.search(t, pos)
            if not m:
                break
            if m.start() == m.end() and last == m.end():
                pos += 1
                continue
            pos = last = m.end()
            out.append(m.group())
        return out

    matches = [json.loads(x) for x in pagoda_jsonl("tokenize", None, corpus, "--split-regex",
                                                   pattern, "--split-behavior", "Removed",
                                                   "--invert")]
    compare("matches vs regex", corpus, matches, [[m for m in find_iter(t) if m] for t in corpus])


ENGINE_CASES = [
    r"a*", r"\b", r"(?=\d)", r"\s*", r"^\s*|\s*$", r"^.|.$", r"\w+|[^\w\s]+", r"\p{Lu}\p{Ll}*?",
    r"\p{L}+?", r"[a-z&&[^aeiou]]+", r"(?i)[a-z]+", r"(?i:K)", r"\d{2,3}", r"\d{2,}", r"\d{,2}",
    r"(?:ab|a)(?:bc|b)?", r"\P{L}+", r"[\p{^L}]", r"\h+", r"\W+", r"\D+", r"\S+", r"(a|ab)(c|bcd)(d*)",
    r"[\x{4E00}-\x{9FFF}]+", r"\p{Han}+", r"(?=(\d{3})+(?!\d))", r".", r"(?m:.)", r"\A\s|\s\z", r"\Z",
    r"[ab]++b", r"\p{L}\B\p{L}", r"\x41|\u00e9", r"[\t\n\r\f\v]", r"(?<name>\d)+", r"(?#c)x|y",
    r"[]a]", r"[^]a]+", r"[a-]+", r"\.\*\+\?\(\)\[\]\{\}\|\\", r"x{", r"a{2}?", r"\p{Lu}&&x",
]


@pytest.mark.parametrize("behavior", ["Isolated", "Removed", "MergedWithPrevious",
                                      "MergedWithNext", "Contiguous"])
def test_engine_constructs_and_behaviors(behavior, corpus, pagoda_bin):
    """Constructs beyond the real patterns (lazy and possessive quantifiers, intervals, empty
    matches, anchors, \\b, nested classes and intersections, named groups, comments, escapes),
    under every Split behavior, inverted or not: the same pieces as Oniguruma through HF."""
    texts = corpus[:150] + corpus[2400:2650] + ["", "a", "aaa", "ab ab", "x\ny\n\nz", "  \n  ", "'S 'LL 'ſ 'K",
                            "]a]", "a{2}", "x{", "\t\n\r\x0b\x0c", "ǅ ǆ Ǆ"]
    hb = {"Isolated": "isolated", "Removed": "removed", "MergedWithPrevious": "merged_with_previous",
          "MergedWithNext": "merged_with_next", "Contiguous": "contiguous"}[behavior]
    for pattern in ENGINE_CASES:
        for invert in (False, True):
            compare(f"{pattern!r} {behavior} invert={invert}", texts,
                    split_regex(pattern, texts, behavior, invert),
                    _hf_split_pieces(pattern, texts, hb, invert))


def test_unicode_classes_match_oniguruma(pagoda_bin):
    """The engine's classes and case folding against Oniguruma over every character Unicode 14
    assigns (the version of Pagoda's tables): \\p{..} for each category, Han, \\s, \\d, \\w
    (Oniguruma's: with the Latin-1 superscripts and fractions, without the joiners), and the
    characters (?i:c) matches for every cased c."""
    chars = "".join(chr(c) for c in range(0x110000)
                    if unicodedata.category(chr(c)) not in ("Cn", "Cs", "Co"))
    chunks = [chars[k:k + 4096] for k in range(0, len(chars), 4096)]
    for cls in [r"\p{L}", r"\p{Lu}", r"\p{Ll}", r"\p{Lt}", r"\p{Lm}", r"\p{Lo}", r"\p{M}", r"\p{N}",
                r"\p{Nd}", r"\p{No}", r"\p{P}", r"\p{S}", r"\p{Z}", r"\p{C}", r"\p{Han}", r"\s",
                r"\d", r"\w", r"\h"]:
        compare(cls, chunks, split_regex(cls, chunks, "Removed", True),
                _hf_split_pieces(cls, chunks, "removed", True))
    # (?i): every ASCII letter, every character whose case orbit is not just its lower/upper
    # pair (the long s, the Kelvin sign, Greek sigmas, Cherokee, ...), and 150 others
    import random
    cased = [c for c in chars if c.lower() != c or c.upper() != c]
    odd = [c for c in cased if c.isascii() or len({c, c.lower(), c.upper(), c.lower().upper(),
                                                   c.upper().lower()}) != 2]
    picks = sorted(set(odd) | set(random.Random(5).sample(cased, 150)))
    picks = [c for c in picks if c not in "\ufb05\ufb06"]  # multi-character folds ("st")
    text = "".join(cased)
    bad = []
    for c in picks:
        p = "(?i:" + (c if c.isalnum() else "\\" + c) + ")"
        a = split_regex(p, [text], "Removed", True)[0]
        b = _hf_split_pieces(p, [text], "removed", True)[0]
        if a != b:
            bad.append((p, a, b))
    assert not bad, f"{len(bad)} case-insensitive characters differ, e.g. {bad[:5]}"


SYNTHETIC = {
    # Split on a string, merged into the next piece; ByteLevel with its own regex and a prefix space
    "string-next": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"String": ", "}, "behavior": "MergedWithNext",
         "invert": False}, cfg.bytelevel(True, True)]},
    "punct-prev": cfg.seq({"type": "Punctuation", "behavior": "MergedWithPrevious"},
                          cfg.digits(False), cfg.bytelevel(True)),
    "whitespace": cfg.seq({"type": "Whitespace"}, cfg.bytelevel(False, True)),
    "wsplit-delim": cfg.seq({"type": "WhitespaceSplit"}, {"type": "CharDelimiterSplit",
                                                          "delimiter": "-"}, cfg.bytelevel()),
    "contiguous-invert": cfg.seq(cfg.split(r"\p{L}+", "Contiguous", True), cfg.bytelevel(True)),
    "removed": cfg.seq(cfg.split(r"\s+", "Removed"), cfg.split(r"\d", "MergedWithPrevious"),
                       cfg.bytelevel()),
    "after-bytelevel": cfg.seq(cfg.bytelevel(True, True), cfg.split(r"\p{Lu}", "MergedWithNext"),
                               cfg.split("Ġ", "Isolated")),
}


@pytest.mark.parametrize("kind", list(SYNTHETIC))
def test_tokenizer_json_pipelines(kind, corpus, pagoda_bin, tmp_path):
    """tokenizer.json pipelines no model ships but HF runs (every behavior, String patterns,
    Punctuation, Whitespace, WhitespaceSplit, CharDelimiterSplit, Digits, a prefix space, steps
    after ByteLevel): Pagoda reads them with no new code path and gives HF's ids and pieces."""
    vf = str(vocab_path("gpt-2"))
    j = tokenizer_json(vf, "gpt-2", pre=SYNTHETIC[kind])
    (tmp_path / "tokenizer.json").write_text(json.dumps(j), encoding="utf-8")
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    texts = corpus[:300] + corpus[2400:3000]
    compare(kind, texts, pagoda_ids(tmp_path, texts), hf_ids(tok, texts))
    hf_pieces = [[p for p, _ in tok.pre_tokenizer.pre_tokenize_str(t)] for t in texts]
    compare(f"{kind} pieces", texts, pagoda_pieces(tmp_path, texts), hf_pieces)


def test_refusals(pagoda_bin, tmp_path):
    """What the engine does not implement is refused in one line naming the file and the step
    or construct; an unknown GGUF pre-tokenizer name is refused as before."""
    vf = str(vocab_path("gpt-2"))
    cases = {
        "UnicodeScripts": ({"type": "UnicodeScripts"}, "pre_tokenizer type 'UnicodeScripts'"),
        "Bert": (cfg.seq({"type": "BertPreTokenizer"}, cfg.bytelevel()), "'BertPreTokenizer'"),
        "lookbehind": (cfg.seq(cfg.split(r"(?<=a)b"), cfg.bytelevel()), "lookbehind"),
        "backref": (cfg.seq(cfg.split(r"(a)\1"), cfg.bytelevel()), "backreferences"),
        "bad-regex": (cfg.seq(cfg.split(r"[z-a]"), cfg.bytelevel()), "empty range"),
        "two-bytelevel": (cfg.seq(cfg.bytelevel(), cfg.bytelevel()), "exactly one ByteLevel"),
        "nullable-loop": (cfg.seq(cfg.split(r"(?:a*)*"), cfg.bytelevel()), "empty string"),
        "multi-fold": (cfg.seq(cfg.split(r"(?i:ss)"), cfg.bytelevel()), "multi-character"),
    }
    for what, (pre, needle) in cases.items():
        d = tmp_path / what
        d.mkdir()
        (d / "tokenizer.json").write_text(json.dumps(tokenizer_json(vf, "gpt-2", pre=pre)))
        p = util.run_pagoda("tokenize", "-m", d, "hello", check=False)
        err = p.stderr.decode()
        assert p.returncode == 1, (what, err)
        assert needle in err and "tokenizer.json" in err and err.count("\n") == 1, (what, err)
    out = util.CACHE / f"pretok-borrowed-{LLAMACPP_PY}" / "vocab-gpt2-as-kimi-k2.gguf"
    if not out.exists():
        borrowed_gguf("kimi-k2")
    p = util.run_pagoda("tokenize", "-m", out, "hello", check=False)
    assert p.returncode == 1 and "tokenizer.ggml.pre 'kimi-k2' not supported" in p.stderr.decode()


HOSTILE = [" " * 100000, "1" * 100000, "a" * 100000, ("a" * 50 + " ") * 2000, "\n" * 100000,
           " \n" * 50000, "'" * 100000, "é" * 50000, "ab" * 50000 + "!", "\u00a0" * 100000,
           "1 " * 50000, "x'S" * 30000, "\u0301" * 50000, "中" * 50000, " " * 99999 + "x",
           "\t" * 50000 + "y" * 50000]
BAIT = [r"(?:a+)+b", r"(?:a|a)*b", r"(?:a|aa)*c", r"(?:\w+\s?)*$", r"(.*a){12}", r"(x+x+)+y",
        r"(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+x", r"\s*[\r\n]+", r"(?:a+?)+?b", r"(?:'|\p{P})*+x"]


def test_hostile_inputs_finish(pagoda_bin):
    """100k-character runs through every pattern of the table and some quantifier bait, and
    through every GGUF family's whole tokenizer: each finishes (no time limit is asserted; the
    engine's memo makes it linear) and the Isolated pieces join back into the text."""
    for pattern in cfg.split_patterns() + BAIT:
        pieces = split_regex(pattern, HOSTILE)
        assert ["".join(p) for p in pieces] == HOSTILE, pattern
    for name in cfg.PIPELINES:
        model = vocab_path(name) if name in cfg.SDIST_VOCABS else borrowed_gguf(name)
        ids = pagoda_ids(model, HOSTILE)
        assert len(ids) == len(HOSTILE) and all(ids), name


def test_hostile_inputs_against_hf(pagoda_bin):
    """Shorter hostile strings (5,000 characters) against HF, ids, for every family."""
    texts = [h[:5000] for h in HOSTILE] + [h[-5000:] for h in HOSTILE]
    for name in cfg.PIPELINES:
        if name in cfg.SDIST_VOCABS:
            model, tok = vocab_path(name), hf_tok(str(vocab_path(name)), name)
        else:
            model, tok = borrowed_gguf(name), hf_tok(str(vocab_path("gpt-2")), name)
        compare(f"{name} hostile", texts, pagoda_ids(model, texts), hf_ids(tok, texts))


@pytest.mark.skipif(not os.environ.get("PAGODA_ASAN_BUILD"), reason="PAGODA_ASAN_BUILD is not set")
def test_general_engine_under_asan(corpus, tmp_path):
    """The engine and the pipelines under AddressSanitizer + UBSan: the corpus and the hostile
    strings through every family (pieces and ids), and the engine alone on the bait."""
    from server_util import check_no_sanitizer_report
    binary = Path(os.environ["PAGODA_ASAN_BUILD"]) / "pagoda"
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1:halt_on_error=1",
               UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1")
    f = tmp_path / "in.jsonl"
    texts = corpus[:1500] + [h[:20000] for h in HOSTILE]
    f.write_text("".join(json.dumps(t) + "\n" for t in texts), encoding="utf-8")

    def run(*args):
        p = subprocess.run([str(binary), "tokenize", *args, "--jsonl", str(f)], capture_output=True,
                           env=env, timeout=900)
        check_no_sanitizer_report(p.stderr.decode(errors="replace"))
        assert p.returncode == 0, (args, p.stderr[-2000:])

    for name in cfg.PIPELINES:
        model = vocab_path(name) if name in cfg.SDIST_VOCABS else borrowed_gguf(name)
        run("-m", str(model), "--pieces")
        run("-m", str(model), "--no-bos", "--no-special")
    for name in cfg.FAST_PATHS:
        model = vocab_path(name) if name in cfg.SDIST_VOCABS else borrowed_gguf(name)
        run("-m", str(model), "--general-pretok", "--no-bos")
    run("-m", str(hf_dir(str(vocab_path("gpt-2")), "falcon")), "--pieces-bytelevel")
    for pattern in BAIT + ENGINE_CASES:
        run("--split-regex", pattern)
