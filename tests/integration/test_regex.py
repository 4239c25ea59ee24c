"""Regular expressions for constrained output (guided_regex, structured_outputs.regex).

1. The compiler (src/sample/regex.c, through tests/tools/pgd_regex_tool) against the `regex`
   package (a dependency of transformers), whose fullmatch with partial=True says whether a
   text is a prefix of some match: on many patterns, every text -- samples, all their prefixes,
   one-character mutations and random strings over the pattern's alphabet -- is a "match", a
   "prefix" or "dead" for both alike. Refused patterns get a message.
2. The mask: for prefixes of matches, the tokens of real vocabularies pgd_json_vocab_walk_dfa
   allows are exactly those whose bytes keep the DFA alive (checked token by token).
3. The server: sampled answers of a random-weight model are whole matches when they stop and
   prefixes of one when cut by max_tokens, where unconstrained ones are not; a real model's
   greedy answer, streamed or not; bad patterns get 400s naming the parameter."""
import subprocess

import pytest
import regex
import requests

import util
from server_util import Server, sse_events, validate

TOOL = util.BUILD / "pgd_regex_tool"
RANDOM_LLAMA = util.DATA / "models" / "llama-2-tiny-random.gguf"

# (pattern, samples that match it)
PATTERNS = [
    (r"\d{4}-\d{2}-\d{2}", ["2024-03-05", "0000-00-00"]),
    (r"^[A-Z][a-z]+( [A-Z][a-z]+)*$", ["Paris", "New York", "Ab Cd Ef"]),
    (r"(yes|no|maybe)", ["yes", "no", "maybe"]),
    (r"(ab|a)(bc|c)?", ["ab", "abc", "abbc", "a", "ac"]),
    (r"[a-z0-9._%+-]+@[a-z0-9.-]+\.[a-z]{2,4}", ["john.doe@example.com", "a@b.io"]),
    (r"\(\d{3}\) \d{3}-\d{4}", ["(555) 123-4567"]),
    (r"-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?", ["0", "-12.5e+3", "7E2", "3.14"]),
    (r"[^\n]{0,5}x", ["x", "abcdex", "é中 x"]),
    (r".+\.", ["a.", "étoile.", "中文."]),
    (r"[à-ÿ]+|[\u4e00-\u9fff]{2}", ["éè", "中文", "ÿ"]),
    (r"(?:\w+\s?){1,3}", ["hello world", "a_1 b2 c3", "x"]),
    (r"\S+\s\S+", ["a b", "foo\tbar"]),
    (r"a{2,}b{,2}c{,}d{}", ["aad{}", "aaabbd{}", "aabccd{}"]),  # {,2}: {0,2}; {,}: *; {} literal
    (r"[\]\-^]+", ["]", "-^", "^]-"]),
    (r"x*y*z*", ["", "xyz", "zz"]),
    (r"((a|b)*c){2}", ["cc", "abcbac"]),
    (r"\x41\u00e9\U0001F600", ["Aé😀"]),
    (r"[\d\s]+", ["1 2", "  3"]),
    (r"[^\d]+", ["abc", "é"]),
    (r"\$\d+(\.\d\d)?", ["$5", "$10.99"]),
    (r"(a|)+b", ["b", "aab"]),
    (r"[a-c]{3}?", ["abc"]),
]

REFUSED = [
    (r"(a)\1", "backreferences"),
    (r"a(?=b)", "groups"),
    (r"(?P<x>a)", "groups"),
    (r"(?i)a", "groups"),
    (r"a++", "possessive"),
    (r"\bfoo", "word boundaries"),
    (r"[a-", "unterminated"),
    (r"a{3,2}", "bad repeat range"),
    (r"a{1001}", "repeat counts"),
    (r"(a", "missing )"),
    (r"a)", "unbalanced"),
    (r"*a", "nothing to repeat"),
    (r"a^b", "only at the start"),
    (r"a$b", "only at the end"),
    (r"[z-a]", "bad character range"),
    (r"\q", "unsupported escape"),
    (r"[^\x00-\U0010FFFF]", "matches no string"),
    (r"(a{1000}){1000}", "too large"),
    (r"(a|b)*a(a|b){14}", "too complex"),
    # an audit's: 600 scattered two-byte characters in a class, 9 times over (31-35 s to build
    # before the work budget; now refused as soon as the budget is spent)
    ("(?:[" + "".join(chr(0x101 + 2 * i) for i in range(600)) + "ab])*a[" +
     "".join(chr(0x101 + 2 * i) for i in range(600)) + "ab]{8}", "too complex"),
]


def status(pattern, text):
    flags = regex.ASCII  # \d \w \s as ASCII, as Pagoda (and JSON Schema's ECMA 262) read them
    if regex.fullmatch(pattern, text, flags=flags):
        return "match"
    if regex.fullmatch(pattern, text, flags=flags, partial=True):
        return "prefix"
    return "dead"


def tool(pattern, texts, *pre):
    inp = "".join(t.encode("utf-8").hex() + "\n" for t in texts)
    p = subprocess.run([str(TOOL), *pre, pattern.encode("utf-8").hex()], input=inp,
                       capture_output=True, text=True, timeout=120)
    return p


def texts_for(samples, seed):
    return util.mutated_texts(samples, seed)


@pytest.mark.parametrize("pattern,samples", PATTERNS, ids=[p for p, _ in PATTERNS])
def test_against_python_regex(pattern, samples):
    texts = texts_for(samples, sum(pattern.encode()) & 0xFFFF)  # the same texts every run
    want = [status(pattern, t) for t in texts]
    assert all(w == "match" for w, t in zip(want, texts) if t in samples), "a sample must match"
    p = tool(pattern, texts)
    assert p.returncode == 0, p.stdout + p.stderr
    got = p.stdout.split()
    bad = [(t, g, w) for t, g, w in zip(texts, got, want) if g != w]
    assert not bad, bad[:10]
    print(pattern, {k: want.count(k) for k in ("match", "prefix", "dead")})


def test_partial_utf8_characters():
    """Bytes that cut a character are a prefix when the character can come, dead otherwise."""
    e = "é".encode("utf-8")
    p = subprocess.run([str(TOOL), "[^a-z]".encode().hex()], input=e[:1].hex() + "\n",
                       capture_output=True, text=True)
    assert p.stdout.split() == ["prefix"]
    p = subprocess.run([str(TOOL), "[a-z]".encode().hex()], input=e[:1].hex() + "\n",
                       capture_output=True, text=True)
    assert p.stdout.split() == ["dead"]
    # a lone continuation byte or an invalid lead byte is never a prefix of well-formed text
    p = subprocess.run([str(TOOL), ".*".encode().hex()], input="80\nc0\nff\ned\neda0\n",
                       capture_output=True, text=True)
    assert p.stdout.split() == ["dead", "dead", "dead", "prefix", "dead"]  # ED A0: a surrogate


@pytest.mark.parametrize("pattern,why", REFUSED, ids=[p[:40] for p, _ in REFUSED])
def test_refused_patterns(pattern, why):
    p = tool(pattern, [])
    assert p.returncode == 3 and why in p.stdout, p.stdout + p.stderr


@pytest.mark.parametrize("vocab", ["ggml-vocab-llama-spm.gguf", "ggml-vocab-qwen2.gguf"])
def test_mask_matches_definition(vocab):
    path = util.DATA / "vocab" / vocab
    for pattern, samples in PATTERNS[:12]:
        prefixes = sorted({s[:i] for s in samples for i in range(len(s) + 1)})
        p = tool(pattern, prefixes, "mask", str(path))
        assert p.returncode == 0, (pattern, p.stderr)
        counts = [int(x) for x in p.stdout.split()]
        assert len(counts) == len(prefixes)


# ---- 3. the server ----

post = util.post


@pytest.mark.parametrize("pattern", [r"\d{3}-[A-Z]{2}", r"(ab|cd)+e", r"[a-zé]{2,6}!"])
def test_sampled_answers_match(rnd, pattern):
    util.check_sampled_constrained(rnd, {"guided_regex": pattern},
                                   lambda t: status(pattern, t), 4)


def test_real_model_greedy(default_server):
    s = default_server
    body = {"prompt": "The capital of France is", "max_tokens": 16, "temperature": 0,
            "structured_outputs": {"regex": r" (Paris|London|Berlin)\."}}
    r = post(s, "/v1/completions", body)
    assert r.status_code == 200, r.text
    c = r.json()["choices"][0]
    assert c["text"] == " Paris." and c["finish_reason"] == "stop", c
    r = post(s, "/v1/completions", dict(body, stream=True), stream=True)
    text = "".join(ch["text"] for ev in sse_events(r.iter_lines(decode_unicode=True))
                   if ev != "[DONE]" for ch in ev["choices"])
    assert text == " Paris."
    chat = {"messages": [{"role": "user", "content": "Give me a date in ISO format."}],
            "max_tokens": 16, "temperature": 0, "guided_regex": r"\d{4}-\d{2}-\d{2}"}
    r = post(s, "/v1/chat/completions", chat)
    assert r.status_code == 200, r.text
    validate(r.json(), "CreateChatCompletionResponse")
    assert status(chat["guided_regex"], r.json()["choices"][0]["message"]["content"]) == "match"


@pytest.mark.parametrize("extra,param", [
    ({"guided_regex": "a(?=b)"}, "guided_regex"), ({"guided_regex": 5}, "guided_regex"),
    ({"structured_outputs": {"regex": "(a"}}, "structured_outputs.regex"),
    ({"guided_regex": "a", "guided_choice": ["a"]}, None)])
def test_bad_patterns_are_400(default_server, extra, param):
    r = post(default_server, "/v1/completions", dict({"prompt": "x", "max_tokens": 2}, **extra))
    assert r.status_code == 400, r.text
    validate(r.json(), "ErrorResponse")
    assert r.json()["error"]["param"] == param, r.json()
