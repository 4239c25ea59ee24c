"""GBNF grammars for constrained output (guided_grammar, structured_outputs.grammar, grammar).

1. The recognizer (src/sample/grammar.c, through tests/tools/pgd_grammar_tool) against
   xgrammar, the grammar engine vLLM serves guided_grammar with: on many grammars, every text --
   samples, all their prefixes, one-character mutations and random strings over the grammar's
   alphabet -- is a "match", a "prefix" or "dead" for both alike. Pagoda feeds each text a byte
   at a time, so every cut of a multi-byte character is exercised too.
2. The mask: for prefixes of samples, the tokens of real vocabularies pgd_grammar_allowed
   allows are exactly those whose bytes keep the recognizer alive (checked token by token).
3. Grammars the compiler refuses get a message naming the problem.
4. The server: sampled answers of a random-weight model are sentences of the grammar when they
   stop and prefixes of one when cut by max_tokens; a real model's greedy answer, streamed or
   not; bad grammars get 400s naming the parameter."""
import random
import subprocess

import pytest
import requests

import util
from server_util import sse_events, validate

xgr = pytest.importorskip("xgrammar")

TOOL = util.BUILD / "pgd_grammar_tool"

# llama.cpp's grammars/json.gbnf, as published
JSON_GBNF = r'''root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws

# Optional space: by convention, applied in this grammar after literal chars when allowed
ws ::= | " " | "\n" [ \t]{0,20}
'''

ARITH = r'''root ::= expr
expr ::= term (("+" | "-") term)*
term ::= factor (("*" | "/") factor)*
factor ::= number | "(" expr ")" | "-" factor
number ::= [0-9]+ ("." [0-9]+)?
'''

LIST = r'''# a list of items, one per line
root ::= item+
item ::= "- " [^\n]+ "\n"
'''

# (grammar, samples that it accepts)
GRAMMARS = [
    (JSON_GBNF, ['{"a": 1}', '{ "name": "Ada", "tags": ["x", "y"], "n": -2.5e3, "ok": true}',
                 '{}', '{"s": "é\\n\\u00e9 中"}', '{"x": {"y": [null, false, [] ]}}']),
    (ARITH, ["1+2*3", "(1.5-2)/-4", "((7))", "10*-(2+3)"]),
    (LIST, ["- eggs\n- milk\n", "- é中\n"]),
    ('root ::= "yes" | "no" | "maybe"', ["yes", "no", "maybe"]),
    ('root ::= [a-z]{2,4} "-" [0-9]{3}', ["ab-123", "abcd-000"]),
    ('root ::= ("ab" | "a") ("bc" | "c")?', ["ab", "abc", "abbc", "a", "ac"]),
    ('root ::= ("a" | "ab")* "b"', ["b", "ab", "abb", "aab", "ababab"]),
    ('root ::= x{3}\nx ::= [xyz] | "-"', ["xyz", "---", "x-z"]),
    ('root ::= [^abc]+ .', ["dd", "é中x", "zza"]),
    ('root ::= [à-ÿ]+ | [\\u4e00-\\u9fff]{2} | "\\U0001F600"', ["éè", "中文", "\U0001F600"]),
    ('root ::= "\\x41\\t\\"\\\\" [\\[\\]]', ['A\t"\\[', 'A\t"\\]']),
    ('root ::= a b "."\na ::= "x"?\nb ::= "y"*', [".", "x.", "xy.", "yyy."]),
    ('root ::= ( "(" root ")" )*', ["", "()", "(())()", "((()))"]),
    ('root ::= "a"{0,3} "b"{2,} "c"?', ["bb", "aaabbbc", "abb"]),
    ('root ::= [0-9]{1,3} ("," [0-9]{3})*', ["1", "1,000", "999,999,999"]),
    ('root ::= "日本" [一-龥]* ("。" | "！")', ["日本。", "日本語！"]),
    ('root ::=\n  "a" |\n  "b" (  # a comment\n  "c"\n  | "d"\n  )', ["a", "bc", "bd"]),
]

REFUSED = [
    ('root ::= "a', "unterminated string"),
    ('root ::= [a-', "unterminated character class"),
    ('root ::= b', "rule 'b' is used but not defined"),
    ('rot ::= "a"', "no rule named 'root'"),
    ('root ::= "a"\nroot ::= "b"', "defined twice"),
    ('root ::= root "a" | "b"', "left-recursive"),
    ('root ::= a\na ::= b? a "x" | "y"\nb ::= "z"', "left-recursive"),
    ('root ::= "a" root', "can never end"),
    ('root ::= [^\\x00-\\U0010FFFF]', "matches no character"),
    ('root ::= [z-a]', "bad character range"),
    ('root ::= "a"{3,2}', "bad repetition range"),
    ('root ::= "a"{1001}', "limited to 1000"),
    ('root ::= ' + ' '.join(['"abcdefghij"{1000}'] * 7), "too large"),
    ('root ::= * "a"', "nothing to repeat"),
    ('root ::= ("a"', "expected ')'"),
    ('root = "a"', "expected '::='"),
    ('root ::= "\\q"', "unknown escape"),
    ('root ::= "\\uD800"', "not a character"),
    ('root ::= "a" )', "unexpected ')'"),
]


def xgr_form(grammar):
    """The grammar in xgrammar's EBNF: "" where llama.cpp's json.gbnf leaves an alternative
    empty, and a class for '.' (any character), which xgrammar does not read."""
    return grammar.replace("ws ::= |", 'ws ::= "" |').replace("+ .", "+ [\\x00-\\U0010FFFF]")


def xgr_status(compiled, grammar, text):
    if xgr.testing._is_grammar_accept_string(grammar, text):
        return "match"
    m = xgr.GrammarMatcher(compiled, terminate_without_stop_token=True)
    return "prefix" if m.accept_string(text) else "dead"


def tool(grammar, texts, tmp_path, *pre):
    f = tmp_path / "g.gbnf"
    f.write_text(grammar, encoding="utf-8")
    inp = "".join(t.encode("utf-8").hex() + "\n" for t in texts)
    return subprocess.run([str(TOOL), *pre, str(f)], input=inp, capture_output=True, text=True,
                          timeout=300)


def texts_for(samples, seed):
    rng = random.Random(seed)
    alphabet = sorted(set("".join(samples)) | set("a0-. \né中x\"{}"))
    out = set(samples)
    for s in samples:
        out.update(s[:i] for i in range(len(s) + 1))
        for i in range(len(s)):
            out.add(s[:i] + rng.choice(alphabet) + s[i + 1:])
            out.add(s[:i] + s[i + 1:])
            out.add(s[:i] + rng.choice(alphabet) + s[i:])
    for _ in range(300):
        out.add("".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12))))
    return sorted(out)


@pytest.mark.parametrize("grammar,samples", GRAMMARS, ids=[g[:30] for g, _ in GRAMMARS])
def test_against_xgrammar(grammar, samples, tmp_path):
    g = xgr.Grammar.from_ebnf(xgr_form(grammar))
    compiled = xgr.GrammarCompiler(xgr.TokenizerInfo([])).compile_grammar(g)
    texts = texts_for(samples, sum(grammar.encode()) & 0xFFFF)
    want = [xgr_status(compiled, g, t) for t in texts]
    assert all(w == "match" for w, t in zip(want, texts) if t in samples), "a sample must match"
    p = tool(grammar, texts, tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    got = [w.rstrip("+") for w in p.stdout.split()]
    assert len(got) == len(texts)
    bad = [(t, gw, w) for t, gw, w in zip(texts, got, want) if gw != w]
    assert not bad, bad[:10]
    counts = {k: want.count(k) for k in ("match", "prefix", "dead")}
    assert counts["prefix"] and counts["dead"], counts  # the texts tell the states apart
    print(grammar[:30], counts)


def test_match_ends_where_nothing_extends(tmp_path):
    """'match' when no byte can follow (generation stops there), 'match+' when one can."""
    p = tool('root ::= "a" "b"? | "c"+', ["a", "ab", "c", "cc"], tmp_path)
    assert p.stdout.split() == ["match+", "match", "match+", "match+"]


def test_partial_utf8_characters(tmp_path):
    """Bytes that cut a character are a prefix when the character can come, dead otherwise
    (the tool feeds one byte at a time; these lines hold the bytes themselves)."""
    f = tmp_path / "g.gbnf"
    for grammar, lines, want in [
            ("root ::= [^a-z]", ["c3"], ["prefix"]),             # the first byte of é
            ("root ::= [a-z]", ["c3"], ["dead"]),
            ("root ::= [\\u00e0-\\u00e5]", ["c3", "c3a9", "c3a5"], ["prefix", "dead", "match"]),
            ("root ::= .*", ["80", "c0", "ff", "ed", "eda0", "f4", "f490"],
             ["dead", "dead", "dead", "prefix", "dead", "prefix", "dead"])]:
        f.write_text(grammar)
        p = subprocess.run([str(TOOL), str(f)], input="".join(x + "\n" for x in lines),
                           capture_output=True, text=True)
        assert [w.rstrip("+") for w in p.stdout.split()] == want, (grammar, p.stdout)


@pytest.mark.parametrize("grammar,why", REFUSED, ids=[g[:30] for g, _ in REFUSED])
def test_refused_grammars(grammar, why, tmp_path):
    p = tool(grammar, [], tmp_path)
    assert p.returncode == 3 and why in p.stdout, p.stdout + p.stderr


def test_ambiguity_stays_bounded(tmp_path):
    """An ambiguous grammar (every split of a run of a's) keeps its stacks interned: a long
    text is still recognized, and one more character is still refused exactly."""
    g = 'root ::= x* "b"\nx ::= "a" | "aa" | "aaa"'
    p = tool(g, ["a" * 3000 + "b", "a" * 3000, "a" * 3000 + "c"], tmp_path)
    assert p.stdout.split() == ["match", "prefix", "dead"], p.stdout + p.stderr


@pytest.mark.parametrize("vocab", ["ggml-vocab-llama-spm.gguf", "ggml-vocab-qwen2.gguf"])
def test_mask_matches_definition(vocab, tmp_path):
    path = util.DATA / "vocab" / vocab
    for grammar, samples in [GRAMMARS[i] for i in (0, 1, 2, 8, 9, 16)]:
        prefixes = sorted({s[:i] for s in samples for i in range(len(s) + 1)})
        p = tool(grammar, prefixes, tmp_path, "mask", str(path))
        assert p.returncode == 0, (grammar[:30], p.stderr)
        counts = [int(x) for x in p.stdout.split()]
        assert len(counts) == len(prefixes) and max(counts) > 0
