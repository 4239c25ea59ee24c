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
import json
import os
import random
import socket
import subprocess
from pathlib import Path

import pytest
import requests

import util
from server_util import sse_events, validate

xgr = pytest.importorskip("xgrammar")

TOOL = util.BUILD / "pgd_grammar_tool"

# llama.cpp's grammars/json.gbnf, as published (tests/data/README.md)
JSON_GBNF = (util.DATA / "grammars" / "json.gbnf").read_text(encoding="utf-8")

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
    ('root ::= "a"{,2} "b"{ 1 , 2 }', ["b", "aab", "abb"]),  # {,n}: llama.cpp's 0..n
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
    ('root = "a"', "expected ':' (Lark) or '::=' (GBNF) after 'root'"),
    ('root ::= "a"\nx = "b"', "expected '::=' after 'x'"),
    ('// only a comment', "the grammar has no rules"),
    ('root ::= "\\q"', "unknown escape"),
    ('root ::= "\\uD800"', "not a character"),
    ('root ::= "a" )', "unexpected ')'"),
]


def xgr_form(grammar):
    """The grammar in xgrammar's EBNF: "" where llama.cpp's json.gbnf leaves an alternative
    empty, a class for '.' (any character) and {0,n} for {,n}, which xgrammar does not read."""
    return (grammar.replace("ws ::= |", 'ws ::= "" |').replace("+ .", "+ [\\x00-\\U0010FFFF]")
            .replace("{,", "{0,"))


def xgr_statuses(grammar, texts):
    """xgrammar's word for each text under grammar (ours, in xgr_form): "match", "prefix" or
    "dead"."""
    g = xgr.Grammar.from_ebnf(xgr_form(grammar))
    compiled = xgr.GrammarCompiler(xgr.TokenizerInfo([])).compile_grammar(g)
    out = []
    for text in texts:
        if xgr.testing._is_grammar_accept_string(g, text):
            out.append("match")
            continue
        m = xgr.GrammarMatcher(compiled, terminate_without_stop_token=True)
        out.append("prefix" if m.accept_string(text) else "dead")
    return out


def tool(grammar, texts, tmp_path, *pre):
    f = tmp_path / "g.gbnf"
    f.write_text(grammar, encoding="utf-8")
    inp = "".join((t if isinstance(t, bytes) else t.encode("utf-8")).hex() + "\n" for t in texts)
    return subprocess.run([str(TOOL), *pre, str(f)], input=inp, capture_output=True, text=True,
                          timeout=300)


def texts_for(samples, seed):
    return util.mutated_texts(samples, seed, "\"{}")


@pytest.mark.parametrize("grammar,samples", GRAMMARS, ids=[g[:30] for g, _ in GRAMMARS])
def test_against_xgrammar(grammar, samples, tmp_path):
    texts = texts_for(samples, sum(grammar.encode()) & 0xFFFF)
    want = xgr_statuses(grammar, texts)
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


# (a grammar in the Lark-like form vLLM converts for xgrammar, the same in GBNF, samples)
LARK = [
    ('?start: select_statement\n'
     '?select_statement: "SELECT " column_list " FROM " table_name\n'
     '?column_list: column_name ("," column_name)*\n'
     '?table_name: identifier\n'
     '?column_name: identifier\n'
     '?identifier: [a-z_]+\n',
     'root ::= "SELECT " cols " FROM " id\ncols ::= id ("," id)*\nid ::= [a-z_]+',
     ["SELECT a,b_c FROM t", "SELECT x FROM y"]),
    ("// a short answer\nanswer: 'yes'\n      | 'no' '.'?\n\n      | \"maybe\" # or not\n",
     'root ::= "yes" | "no" "."? | "maybe"', ["yes", "no.", "no", "maybe"]),
    ("item: [a-z]+\nstart: item (', ' item)* '\\''",
     "root ::= [a-z]+ (\", \" [a-z]+)* \"'\"", ["a, bc'", "x'"]),
]


@pytest.mark.parametrize("lark,gbnf,samples", LARK, ids=["sql", "answer", "start-later"])
def test_lark_form_reads_as_its_gbnf(lark, gbnf, samples, tmp_path):
    """A grammar without '::=' is the Lark-like form (rules 'name:', '?name', '|' lines,
    single quotes, '//' comments, root 'start' or the first rule): on every text it says what
    the same grammar in GBNF says, which says what xgrammar says."""
    texts = texts_for(samples, 11)
    a, b = tool(lark, texts, tmp_path), tool(gbnf, texts, tmp_path)
    assert a.returncode == 0 and b.returncode == 0, a.stdout + a.stderr + b.stdout
    assert a.stdout == b.stdout
    want = xgr_statuses(gbnf, texts)
    assert [w.rstrip("+") for w in a.stdout.split()] == want
    assert "match" in want and "prefix" in want and "dead" in want


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


MASK_EXTRA = [  # free text that the walk's short cuts take, and text that they must not
    (r'root ::= "\"" [^"\\]* "\"" [ ]?', ['"Ada é中 😀 x"']),
    ('root ::= [a-zé中]{0,6} "."', ["aé中bb.", "中中中中中中."]),
    ('root ::= ([a-z]+ | [é-ü]+ " ")* "!"', ["abéü cd!", "é !"]),
    (r'root ::= item*' '\n' r'item ::= [^\n]* "\n"', ["x é\n\n中 y\n"]),
]


@pytest.mark.parametrize("vocab", ["ggml-vocab-llama-spm.gguf", "ggml-vocab-qwen2.gguf"])
def test_mask_matches_definition(vocab, tmp_path):
    """Every byte prefix of the samples (so states inside a cut character too): the mask is
    exactly the tokens whose bytes the recognizer takes."""
    path = util.DATA / "vocab" / vocab
    for grammar, samples in [GRAMMARS[i] for i in (0, 1, 2, 8, 9, 16)] + MASK_EXTRA:
        data = [x.encode("utf-8") for x in samples]
        prefixes = sorted({d[:i] for d in data for i in range(len(d) + 1)})
        p = tool(grammar, prefixes, tmp_path, "mask", str(path))
        assert p.returncode == 0, (grammar[:30], p.stderr)
        counts = [int(x) for x in p.stdout.split()]
        assert len(counts) == len(prefixes) and max(counts) > 0
        # each token less a leading space (a SentencePiece first piece): at the start
        p = tool(grammar, [b"", data[0][:1]], tmp_path, "mask-drop", str(path))
        assert p.returncode == 0 and len(p.stdout.split()) == 2, (grammar[:30], p.stderr)


# ---- 4. the server ----

post = util.post


def full_status(grammar, text):
    return xgr_statuses(grammar, [text])[0]


SERVER_GRAMMARS = [ARITH.replace("root ::= expr", 'root ::= "[" expr "]"'),
                   'root ::= [A-Z]{2} "-" [0-9]{3} | "none"',
                   'root ::= item{1,3}\nitem ::= "- " [a-zé ]{1,8} "\\n"']


@pytest.mark.parametrize("grammar", SERVER_GRAMMARS, ids=["arith", "code", "list"])
def test_sampled_answers_are_sentences(rnd, grammar):
    """The random model's sampled answers wander over the whole vocabulary: constrained, each
    is a sentence of the grammar when it stops and a prefix of one when max_tokens cuts it (by
    xgrammar); unconstrained, none is."""
    util.check_sampled_constrained(rnd, {"guided_grammar": grammar},
                                   lambda t: full_status(grammar, t), 2)  # (3, 24, 15 of 24)


def test_real_model_json_grammar_equals_json_mode(default_server):
    """llama.cpp's json.gbnf and response_format json_object are two implementations of almost
    the same language (json.gbnf's whitespace and number digits are narrower): on the real model
    their greedy answers agree token for token, here and streamed, and xgrammar takes the
    answer as a sentence."""
    s = default_server
    chat = {"messages": [{"role": "user", "content": "Give a JSON object with a name and an "
                          "age."}], "max_tokens": 60, "temperature": 0}
    want = post(s, "/v1/chat/completions", dict(chat, response_format={"type": "json_object"}))
    want = want.json()["choices"][0]
    assert want["finish_reason"] == "stop", want
    for key in ("grammar", "guided_grammar"):
        r = post(s, "/v1/chat/completions", dict(chat, **{key: JSON_GBNF}))
        assert r.status_code == 200, r.text
        validate(r.json(), "CreateChatCompletionResponse")
        got = r.json()["choices"][0]
        assert got["message"]["content"] == want["message"]["content"], (got, want)
        assert got["finish_reason"] == "stop"
    assert full_status(JSON_GBNF, want["message"]["content"]) == "match"
    r = post(s, "/v1/chat/completions", dict(chat, stream=True,
                                             structured_outputs={"grammar": JSON_GBNF}),
             stream=True)
    text = "".join(ch["delta"].get("content") or "" for ev in
                   sse_events(r.iter_lines(decode_unicode=True)) if ev != "[DONE]"
                   for ch in ev["choices"])
    assert text == want["message"]["content"]


def test_real_model_greedy_choice(default_server):
    """A grammar of a few answers: the greedy answer is the one the model scores first, and it
    is the same through guided_choice, the same language another way."""
    body = {"prompt": "The capital of France is", "max_tokens": 16, "temperature": 0}
    g = 'root ::= " " city "."\ncity ::= "Paris" | "London" | "Berlin"'
    r = post(default_server, "/v1/completions", dict(body, guided_grammar=g))
    assert r.status_code == 200, r.text
    c = r.json()["choices"][0]
    ref = post(default_server, "/v1/completions",
               dict(body, guided_choice=[" Paris.", " London.", " Berlin."])).json()
    assert c["text"] == ref["choices"][0]["text"] == " Paris.", (c, ref)
    assert c["finish_reason"] == "stop"


@pytest.mark.parametrize("extra,param,why", [
    ({"guided_grammar": "root ::= foo"}, "guided_grammar", "'foo' is used but not defined"),
    ({"grammar": 'root ::= "a" root'}, "grammar", "can never end"),
    ({"structured_outputs": {"grammar": 5}}, "structured_outputs.grammar", "must be a string"),
    ({"guided_grammar": "x" * 70000}, "guided_grammar", "longer than"),
    # a byte of a character in the message would make the body invalid UTF-8 (the fuzzer's)
    ({"guided_grammar": 'root ::= "\\é"'}, "guided_grammar", "unknown escape: \\ then 0xC3"),
    ({"guided_grammar": 'root ::= "a"', "guided_regex": "a"}, None, "one kind"),
    ({"grammar": 'root ::= "a"', "response_format": {"type": "json_object"}}, None, "one kind")])
def test_bad_grammars_are_400(default_server, extra, param, why):
    r = post(default_server, "/v1/completions", dict({"prompt": "x", "max_tokens": 2}, **extra))
    assert r.status_code == 400, r.text
    r.content.decode("utf-8")  # strictly: a body of well-formed UTF-8
    validate(r.json(), "ErrorResponse")
    assert r.json()["error"]["param"] == param, r.json()
    assert why in r.json()["error"]["message"], r.json()


def test_too_ambiguous_grammar_fails_alone(default_server):
    """A grammar that keeps hundreds of parse stacks over a broad class would take seconds a
    token to mask: the request fails with the reason once its mask passes the work limit, and
    the server goes on serving (the same prompt with a plain grammar)."""
    g = 'root ::= x{0,30} [^\\n]*\nx ::= [^\\n]{0,30}'
    body = {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}
    r = post(default_server, "/v1/completions", dict(body, guided_grammar=g))
    assert r.status_code == 500, r.text
    validate(r.json(), "ErrorResponse")
    assert "too ambiguous" in r.json()["error"]["message"]
    r = post(default_server, "/v1/completions", dict(body, guided_grammar='root ::= [^\\n]*'))
    free = post(default_server, "/v1/completions", body).json()
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == free["choices"][0]["text"]


def test_batch_lines_take_guided_grammar(tmp_path):
    """`pagoda batch` lines take guided_grammar: the random model's sampled answers are
    sentences, and a bad grammar is that line's error while the others run."""
    import json
    from test_engine import run_pagoda
    model = util.DATA / "models" / "llama-2-tiny-random.gguf"
    g = SERVER_GRAMMARS[1]
    reqs = [{"id": i, "prompt": "Code:", "max_tokens": 8, "temperature": 1.0, "seed": i,
             "guided_grammar": g} for i in range(4)]
    reqs.append({"id": 9, "prompt": "x", "guided_grammar": "root ::= [a-"})
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in reqs))
    run_pagoda("batch", "-m", model, "--input", inp, "--output", out, "--no-progress")
    res = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert all(full_status(g, res[i]["text"]) == "match" for i in range(4)), res
    assert "unterminated character class" in res[9]["error"]["message"], res[9]


def concurrent_matches_alone(server, bodies, url_path="/v1/completions"):
    """Each body's answer sent alone, then all of them at once (one engine step holds many
    grammar requests: one shared scratch, a mask memo each): the texts must be equal."""
    import asyncio
    import httpx
    url = server.url(url_path)
    alone = [post(server, url_path, b).json()["choices"][0]["text"] for b in bodies]

    async def all_at_once():
        async with httpx.AsyncClient(timeout=300) as c:
            rs = await asyncio.gather(*(c.post(url, json=b) for b in bodies))
        return [r.json()["choices"][0]["text"] for r in rs]
    assert asyncio.run(all_at_once()) == alone
    return alone


GREEDY_MIX = [
    {"prompt": "A person as JSON: ", "max_tokens": 40, "temperature": 0, "grammar": JSON_GBNF},
    {"prompt": "Shopping list:\n", "max_tokens": 30, "temperature": 0,
     "guided_grammar": LIST},
    {"prompt": "2+2=", "max_tokens": 10, "temperature": 0, "guided_grammar": ARITH},
    {"prompt": "Is water wet? ", "max_tokens": 5, "temperature": 0,
     "guided_grammar": 'root ::= "yes" | "no" | "maybe"'},
    {"prompt": "Once upon a time", "max_tokens": 20, "temperature": 0},
]


def test_concurrent_grammar_requests_match_alone(default_server):
    texts = concurrent_matches_alone(default_server, GREEDY_MIX * 2)
    for b, t in zip(GREEDY_MIX, texts):
        g = b.get("grammar") or b.get("guided_grammar")
        if g:
            assert full_status(g, t) in ("match", "prefix"), (g[:30], t)


@pytest.mark.skipif(not os.environ.get("PAGODA_ASAN_BUILD"), reason="PAGODA_ASAN_BUILD is not set")
def test_grammar_server_under_asan(default_model, tmp_path):
    """The grammar paths of the server under ASan + UBSan + LSan: every kind of request here,
    sampled n > 1, a refused grammar, the work limit, a stream dropped mid-answer, concurrent
    requests; no sanitizer report and exit 0 (Server.stop checks). The recognizer tool too, on
    the xgrammar texts of the first grammars."""
    from test_server_asan import ENV, asan_bin
    from server_util import Server
    s = Server(default_model, binary=asan_bin(), env=ENV, ready_timeout=300)
    s.start()
    try:
        concurrent_matches_alone(s, GREEDY_MIX)
        r = post(s, "/v1/completions", {"prompt": "x", "max_tokens": 8, "n": 3, "seed": 1,
                                        "temperature": 1, "guided_grammar": ARITH})
        assert r.status_code == 200, r.text
        for extra, code in (({"guided_grammar": "root ::= (x"}, 400),
                            ({"guided_grammar": 'root ::= x{0,30} [^\\n]*\nx ::= [^\\n]{0,30}'},
                             500)):
            r = post(s, "/v1/completions", dict({"prompt": "x", "max_tokens": 4}, **extra))
            assert r.status_code == code, r.text
        raw = socket.create_connection(("127.0.0.1", s.port), timeout=60)
        data = json.dumps({"prompt": "A list:\n", "max_tokens": 200, "stream": True,
                           "guided_grammar": LIST}).encode()
        raw.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " +
                    str(len(data)).encode() + b"\r\n\r\n" + data)
        assert raw.recv(4096)
        raw.close()
    finally:
        s.stop()
    asan_tool = Path(os.environ["PAGODA_ASAN_BUILD"]) / "pgd_grammar_tool"
    env = dict(os.environ, **ENV)
    for grammar, samples in GRAMMARS[:4]:
        texts = texts_for(samples, 7)
        f = tmp_path / "g.gbnf"
        f.write_text(grammar, encoding="utf-8")
        inp = "".join(t.encode("utf-8").hex() + "\n" for t in texts)
        want = tool(grammar, texts, tmp_path).stdout
        p = subprocess.run([str(asan_tool), str(f)], input=inp, capture_output=True, text=True,
                           timeout=300, env=env)
        assert p.returncode == 0 and p.stdout == want and "Sanitizer" not in p.stderr, p.stderr
        p = subprocess.run([str(asan_tool), "mask", str(util.DATA / "vocab" /
                                                        "ggml-vocab-llama-spm.gguf"), str(f)],
                           input="".join(t.encode("utf-8").hex() + "\n" for t in samples),
                           capture_output=True, text=True, timeout=300, env=env)
        assert p.returncode == 0 and "Sanitizer" not in p.stderr, p.stderr


def test_real_model_lark_grammar(default_server):
    """vLLM's simplified-SQL example in the Lark-like form, through guided_grammar on the real
    model: the greedy answer is a sentence of the grammar (by xgrammar, on its GBNF form), and
    the GBNF form gives the same answer."""
    lark, gbnf, _ = LARK[0]
    chat = {"messages": [{"role": "user", "content": "Generate an SQL query to show the "
                          "'username' and 'email' from the 'users' table."}],
            "max_tokens": 30, "temperature": 0}
    r = post(default_server, "/v1/chat/completions", dict(chat, guided_grammar=lark))
    assert r.status_code == 200, r.text
    text = r.json()["choices"][0]["message"]["content"]
    assert full_status(gbnf, text) in ("match", "prefix") and text.startswith("SELECT "), text
    r2 = post(default_server, "/v1/chat/completions", dict(chat, guided_grammar=gbnf))
    assert r2.json()["choices"][0]["message"]["content"] == text


def test_generate_takes_a_grammar(default_server, tmp_path):
    """`pagoda generate --grammar-file` (llama.cpp's option): the greedy text is the server's
    answer to the same prompt under the same grammar; --grammar takes the text itself; a bad
    grammar fails before the model loads, naming the file and the line."""
    gfile = util.DATA / "grammars" / "json.gbnf"
    prompt = "A person as JSON: "
    base = ["generate", "-m", util.DEFAULT_MODEL, "-p", prompt, "-n", "40", "--temperature", "0"]
    text = util.run_pagoda(*base, "--grammar-file", gfile).stdout.decode()
    want = post(default_server, "/v1/completions", {"prompt": prompt, "max_tokens": 40,
                                                    "temperature": 0, "grammar": JSON_GBNF})
    assert text == want.json()["choices"][0]["text"], (text, want.text)
    assert full_status(JSON_GBNF, text) in ("match", "prefix") and text.startswith("{")
    g = 'root ::= "yes" | "no"'
    assert util.run_pagoda(*base, "--grammar", g).stdout.decode() in ("yes", "no")
    bad = tmp_path / "bad.gbnf"
    bad.write_text('root ::= item\nitem ::= "a" (')
    p = util.run_pagoda(*base, "--grammar-file", bad, check=False)
    assert p.returncode == 2 and str(bad) in p.stderr.decode() and "line 2" in p.stderr.decode()


def fuzz_grammars(n, seed):
    """n broken variants of the test grammars: bytes dropped, repeated, swapped for grammar
    punctuation or random bytes (not always UTF-8), pieces of two grammars spliced."""
    rng = random.Random(seed)
    pool = [g.encode("utf-8") for g, _ in GRAMMARS] + [x[0].encode() for x in REFUSED]
    punct = b'()[]{}|*+?^-."\\:=#\n \'/,0123456789'
    out = []
    for _ in range(n):
        g = bytearray(rng.choice(pool))
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(len(g) + 1)
            op = rng.randrange(5)
            if op == 0 and i < len(g):
                del g[i]
            elif op == 1:
                g[i:i] = bytes([rng.choice(punct)])
            elif op == 2:
                g[i:i] = bytes([rng.randrange(256)])
            elif op == 3 and i < len(g):
                g[i:i] = g[i:i + rng.randint(1, 8)] * rng.randint(1, 3)
            else:
                h = rng.choice(pool)
                g = g[:i] + h[rng.randrange(len(h)):]
        out.append(bytes(g))
    return out


def test_fuzzed_grammars_are_refused_or_matched(tmp_path, binary=None):
    """2,000 broken grammars never crash the compiler or the matcher: each is refused with a
    message or compiles and is matched against its own text; both happen."""
    texts = fuzz_grammars(2000, 5)
    p = subprocess.run([str(binary or TOOL), "compile"], capture_output=True, text=True,
                       input="".join(t.hex() + "\n" for t in texts), timeout=300,
                       env=dict(os.environ, **(asan_env() if binary else {})))
    assert p.returncode == 0, p.stderr[-2000:]
    assert "Sanitizer" not in p.stderr and "runtime error" not in p.stderr, p.stderr[-2000:]
    lines = p.stdout.splitlines()
    assert len(lines) == len(texts)
    refused = [x for x in lines if x.startswith("refused: ")]
    assert all(len(x) > len("refused: ") + 5 for x in refused), refused[:5]
    assert len(refused) > 100 and len(lines) - len(refused) > 100, len(refused)


def asan_env():
    from test_server_asan import ENV
    return ENV


@pytest.mark.skipif(not os.environ.get("PAGODA_ASAN_BUILD"), reason="PAGODA_ASAN_BUILD is not set")
def test_fuzzed_grammars_under_asan(tmp_path):
    test_fuzzed_grammars_are_refused_or_matched(
        tmp_path, Path(os.environ["PAGODA_ASAN_BUILD"]) / "pgd_grammar_tool")


def test_bos_only_prompt_constraints_see_the_text(rnd):
    """SentencePiece drops the first piece's leading space when the prompt is BOS alone: every
    kind of constraint sees the text without it, so a sampled answer still holds to it (an
    answer held to a leading space used to come out without one: 'hem.' for " [a-z]{3}.")."""
    import regex
    base = {"prompt": [1], "max_tokens": 8, "n": 6, "temperature": 1.0}  # BOS alone
    g = 'root ::= " " [a-z]{3} "."'
    cases = [({"guided_grammar": g}, lambda t: full_status(g, t) == "match"),
             ({"guided_regex": r" [a-z]{3}\."}, lambda t: regex.fullmatch(r" [a-z]{3}\.", t)),
             ({"guided_grammar": 'root ::= [a-z]{3} "."'},
              lambda t: regex.fullmatch(r"[a-z]{3}\.", t)),
             ({"guided_choice": [" yes", " no", "maybe"]}, lambda t: t in (" yes", " no", "maybe")),
             ({"response_format": {"type": "json_object"}}, lambda t: t.lstrip()[:1] == "{")]
    for extra, ok in cases:
        n_stop = 0
        for seed in range(2):
            r = post(rnd, "/v1/completions", dict(base, seed=seed, **extra))
            assert r.status_code == 200, r.text
            for c in r.json()["choices"]:
                if c["finish_reason"] == "stop":
                    assert ok(c["text"]), (extra, c)
                    n_stop += 1
        assert n_stop > 0 or "response_format" in extra, extra
