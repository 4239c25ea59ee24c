"""JSON output (response_format {"type": "json_object"}).

1. The recognizer (src/sample/json_grammar.c, through tests/tools/pgd_json_tool) against
   Python's json module: on generated documents, on every prefix of them and on random byte
   mutations, it calls a byte string a complete document exactly when json.loads (strict UTF-8,
   no NaN/Infinity) accepts it, and never refuses a prefix of a valid document.
2. The server: constrained answers of a real model parse as JSON objects; sampled answers of a
   random model (the real 32k Llama 2 vocabulary) are complete objects when they stop and
   prefixes of one when cut by max_tokens, where the same requests without the constraint are
   not JSON; streaming gives the same text; bad response_format values, best_of and tool_choice
   get 400s."""
import json
import random
import re
import subprocess

import pytest
import requests

import util
from server_util import Server, sse_events, validate

TOOL = util.BUILD / "pgd_json_tool"
RANDOM_LLAMA = util.DATA / "models" / "llama-2-tiny-random.gguf"


def _raise(c):
    raise ValueError(f"constant {c}")


def py_complete(b: bytes, object_only: bool) -> bool:
    """A whole JSON document for strict parsers: Python's json, less NaN/Infinity and lone
    surrogate escapes (which UTF-8 cannot hold and serde_json, for one, refuses)."""
    try:
        v = json.loads(b.decode("utf-8"), parse_constant=_raise)
        json.dumps(v, ensure_ascii=False).encode("utf-8")
    except (ValueError, UnicodeError, RecursionError):
        return False
    return isinstance(v, dict) or not object_only


SPACE = re.compile(rb"( |\n{1,2}[ \t]{0,20})?")  # llama.cpp's json-schema-to-grammar space rule


def ws_ok(b: bytes) -> bool:
    """Every whitespace run between tokens (outside strings) is one llama.cpp's JSON grammars
    allow: nothing, one space, or one or two newlines and up to 20 spaces or tabs (a prefix of
    such a run is one too)."""
    in_str = esc = False
    run = b""
    for c in b:
        ch = bytes([c])
        if in_str:
            if esc:
                esc = False
            elif ch == b"\\":
                esc = True
            elif ch == b'"':
                in_str = False
            continue
        if ch in b" \t\n\r":
            run += ch
            continue
        if not SPACE.fullmatch(run):
            return False
        run = b""
        in_str = ch == b'"'
    return bool(SPACE.fullmatch(run))


def tool(cases):
    """cases: [(mode 'o'|'a', bytes)] -> ['complete'|'prefix'|'reject']"""
    assert TOOL.exists(), f"build pgd_json_tool first: {TOOL} is missing"
    inp = "".join(f"{m} {b.hex()}\n" for m, b in cases)
    p = subprocess.run([str(TOOL)], input=inp, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    out = p.stdout.split()
    assert len(out) == len(cases)
    return out


# ---- 1. the recognizer against Python's json ----

ALPHABET = ["a", "Z", " ", "é", "ß", "\u20ac", "\U0001F600", "\u2028", "\n", "\t", "\x01", '"',
            "\\", "/", "\ud7ff", "\ue000", "\uffff", "0"]


def rand_str(rng):
    return "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 8)))


def rand_num(rng):
    k = rng.randint(0, 5)
    if k == 0:
        return rng.randint(-10**18, 10**18)
    if k == 1:
        return rng.randint(-9, 9)
    if k == 2:
        return rng.uniform(-1e6, 1e6)
    if k == 3:
        return rng.choice([0.0, -0.0, 1e-300, 5e300, 1.5e-7, 123456789.125])
    return rng.random()


def rand_value(rng, depth):
    k = rng.randint(0, 9 if depth < 7 else 5)
    if k <= 1:
        return rand_str(rng)
    if k <= 3:
        return rand_num(rng)
    if k == 4:
        return rng.choice([True, False, None])
    if k == 5 and depth > 0:
        return rng.choice([{}, []])
    if k <= 7:
        return {rand_str(rng): rand_value(rng, depth + 1) for _ in range(rng.randint(0, 4))}
    return [rand_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]


def dumps(rng, v):
    kw = rng.choice([{}, {"indent": 2}, {"indent": "\t"}, {"separators": (",", ":")},
                     {"indent": 1, "separators": (" ,", " : ")}])
    s = json.dumps(v, ensure_ascii=rng.random() < 0.5, **kw)
    if rng.random() < 0.2:
        s = rng.choice([" ", "\n", "\r\n"]) + s + rng.choice(["", " ", "\n"])
    return s.encode("utf-8")


def documents(seed, n):
    rng = random.Random(seed)
    docs = []
    for _ in range(n):
        top = rng.random()
        v = (rand_value(rng, 0) if top < 0.3 else
             {rand_str(rng): rand_value(rng, 1) for _ in range(rng.randint(0, 5))})
        docs.append(dumps(rng, v))
    # the corner cases by hand: numbers' forms, escapes, literals, empty containers
    docs += [b'{"a":-0}', b'{"a":0.5e+10}', b'{"a":-1E-2}', b'{"a":[true,false,null]}',
             b'{"\\u00e9\\n\\"\\\\\\/\\b\\f\\r\\t":""}', b"[]", b"{}", b"0", b"-0.0e0", b'""',
             b'{"a":{"b":{"c":[[[]]]}}}', b'"\\ud83d\\ude00"', b'"\\ud83d"', b'"\\ude00"',
             b'"\\ud83d\\n"', b'"\\ud83d\\ud83d"', b'"\\uDBFF\\uDFFF"']
    return docs


MUTATION_BYTES = b'{}[]":,\\.+-eE0123456789tfnrlsu \t\n\r\x00\x1f\x7f\x80\xbf\xc0\xc3\xe2\xed\xf0\xf4\xf5\xff'


def mutate(rng, b):
    b = bytearray(b)
    for _ in range(rng.randint(1, 3)):
        op = rng.randint(0, 2)
        i = rng.randint(0, len(b))
        c = MUTATION_BYTES[rng.randrange(len(MUTATION_BYTES))]
        if op == 0 or not b:
            b[i:i] = bytes([c])
        elif op == 1:
            del b[min(i, len(b) - 1)]
        else:
            b[min(i, len(b) - 1)] = c
    return bytes(b)


@pytest.mark.parametrize("mode", ["a", "o"])
def test_recognizer_agrees_with_python_json(mode):
    rng = random.Random(7)
    docs = documents(11, 600)
    cases, want = [], []
    for d in docs:
        cases.append((mode, d))
        valid = py_complete(d, mode == "o")
        want.append(None if not valid else ("complete",) if ws_ok(d) else ("reject",))
        # every prefix of a valid document is accepted (whole ones where Python takes them), up
        # to a whitespace run past the bound
        if valid:
            cuts = range(len(d)) if len(d) < 80 else sorted(rng.sample(range(len(d)), 80))
            for k in cuts:
                p = d[:k]
                cases.append((mode, p))
                want.append(("reject",) if not ws_ok(p) else
                            ("complete",) if py_complete(p, mode == "o") else ("prefix",))
        for _ in range(6):
            m = mutate(rng, d)
            cases.append((mode, m))
            want.append(("complete",) if py_complete(m, mode == "o") and ws_ok(m)
                        else ("prefix", "reject"))
    got = tool(cases)
    bad = [(c[1], g, w) for c, g, w in zip(cases, got, want) if w and g not in w]
    assert not bad, f"{len(bad)} of {len(cases)} disagree with Python's json, e.g. {bad[:5]}"
    # documents Python takes whose whitespace runs past the bound ("\r\n", deep indents) are
    # among them, refused
    spaced = [d for d in docs if py_complete(d, mode == "o") and not ws_ok(d)]
    assert len(spaced) > 20, len(spaced)
    # the documents that are not objects in 'o' mode are refused on their first byte
    n_reject = sum(g == "reject" for g in got)
    n_complete = sum(g == "complete" for g in got)
    assert n_reject > 100 and n_complete > 300, (n_reject, n_complete)


def test_recognizer_bounds():
    """Depth, whitespace runs and number lengths are bounded: a loop of a weak model ends.
    Whitespace as llama.cpp's JSON grammars bound it, each gap nothing, one space, or one or
    two newlines and up to 20 spaces or tabs."""
    deep = b"[" * 32
    ws = b"{\n\n" + b" \t" * 10
    num = b"[" + b"1" * 40
    got = tool([("a", deep), ("a", deep + b"["), ("o", ws), ("o", ws + b" "), ("a", num),
                ("a", num + b"1"), ("o", b"{ "), ("o", b"{  "), ("o", b"{\n\n\n"),
                ("o", b"{\t"), ("o", b"{\r\n"), ("o", b"{ \n"), ("o", b'{"a" : 1 ,\n"b":2 }'),
                ("o", b'{"a":\n\t1}  '), ("o", b'{"a":\n\t1}\n\n')])
    assert got == ["prefix", "reject", "prefix", "reject", "prefix", "reject", "prefix",
                   "reject", "reject", "reject", "reject", "reject", "complete", "reject",
                   "complete"]
    assert [ws_ok(b) for b in (ws, ws + b" ", b'{"a" : 1 ,\n"b":2 }', b"{\r\n")] == \
        [True, False, True, False]


VOCABS = [util.DATA / "vocab" / f"ggml-vocab-{v}.gguf" for v in ("llama-spm", "llama-bpe",
                                                                   "qwen2")]


@pytest.mark.parametrize("vocab", VOCABS, ids=lambda p: p.stem)
def test_mask_equals_its_definition(vocab):
    """The mask (a trie walk outside strings, precomputed plain tokens inside them) allows
    exactly the tokens whose bytes a copy of the state accepts, at the states of every prefix
    of a few generated objects (the tool checks each token)."""
    rng = random.Random(3)
    docs = [d for d in documents(5, 40) if py_complete(d, True) and ws_ok(d)][:12]
    docs += [b'{"a": "\\', b'{"a": "\\u00', b'{"a": "\xc3', b'{"a": "\xe2\x82']
    cases = [("o", d[:k]) for d in docs for k in sorted(rng.sample(range(len(d) + 1),
                                                                  min(len(d) + 1, 30)))]
    inp = "".join(f"{m} {b.hex()}\n" for m, b in cases)
    p = subprocess.run([str(TOOL), "mask", str(vocab)], input=inp, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    counts = [int(x) for x in p.stdout.split()]
    assert len(counts) == len(cases)
    assert min(counts) >= 1 and max(counts) > 1000  # in a string, most of the vocabulary


# ---- 2. the server ----

JSON_FMT = {"type": "json_object"}


post = util.post


def test_real_model_answers_a_json_object(smol):
    n_free_json = 0
    for q in ["Give me a JSON object describing a cat, with its name and age.",
              "What is the capital of France? Answer in JSON."]:
        body = {"messages": [{"role": "user", "content": q}], "temperature": 0,
                "max_tokens": 200}
        free = post(smol, "/v1/chat/completions", body)
        r = post(smol, "/v1/chat/completions", dict(body, response_format=JSON_FMT))
        assert r.status_code == 200, r.text
        validate(r.json(), "CreateChatCompletionResponse")
        c = r.json()["choices"][0]
        assert c["finish_reason"] == "stop", c
        assert isinstance(json.loads(c["message"]["content"]), dict), c
        # the mask changes a greedy answer only where it was not JSON: one that was (the capital)
        # comes out the same, one that was not (a Markdown fence first) does not
        assert free.status_code == 200
        ft = free.json()["choices"][0]["message"]["content"]
        assert (ft == c["message"]["content"]) == py_complete(ft.encode(), True), (ft, c)
        n_free_json += py_complete(ft.encode(), True)
    assert n_free_json == 1  # both cases were met


def check_choice(text, finish):
    if finish == "stop":
        v = json.loads(text.encode("utf-8").decode("utf-8"), parse_constant=_raise)
        assert isinstance(v, dict), text
    else:
        assert finish == "length"
        assert tool([("o", text.encode("utf-8"))]) == ["prefix"], text


def test_sampled_random_model_output_is_json(rnd):
    """A random model samples from all 32,000 tokens; constrained, each choice is a JSON object
    (or a prefix of one when max_tokens cuts it). A bias towards quotes and braces makes most
    of them close within the budget."""
    tok = post(rnd, "/tokenize", {"prompt": '"}', "add_special_tokens": False}).json()
    bias = {str(t): 6 for t in tok["tokens"]}
    base = {"prompt": "Hello", "max_tokens": 48, "n": 8, "temperature": 1.0}
    n_stop = 0
    for seed in range(4):
        r = post(rnd, "/v1/completions", dict(base, seed=seed, response_format=JSON_FMT,
                                              logit_bias=bias))
        assert r.status_code == 200, r.text
        validate(r.json(), "CreateCompletionResponse")
        for c in r.json()["choices"]:
            check_choice(c["text"], c["finish_reason"])
            n_stop += c["finish_reason"] == "stop"
        free = post(rnd, "/v1/completions", dict(base, seed=seed, logit_bias=bias)).json()
        for c in free["choices"]:
            assert not py_complete(c["text"].encode(), True)
    assert n_stop >= 4, n_stop


def test_stream_matches_and_greedy_random_model(rnd):
    body = {"prompt": "Hello", "max_tokens": 40, "temperature": 0.7, "seed": 5,
            "response_format": JSON_FMT}
    whole = post(rnd, "/v1/completions", body).json()["choices"][0]
    r = requests.post(rnd.url("/v1/completions"), json=dict(body, stream=True), stream=True,
                      timeout=300)
    text, finish = "", None
    for ev in sse_events(r.iter_lines()):
        if ev == "[DONE]":
            break
        ch = ev["choices"][0]
        text += ch["text"]
        finish = ch.get("finish_reason") or finish
    assert (text, finish) == (whole["text"], whole["finish_reason"])
    check_choice(text, finish)
    g = post(rnd, "/v1/completions", dict(body, temperature=0)).json()["choices"][0]
    check_choice(g["text"], g["finish_reason"])


@pytest.mark.parametrize("extra,param", [
    ({"response_format": {"type": "json_schema"}}, "response_format"),
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"response_format": "json_object"}, "response_format"),
    ({"response_format": {}}, "response_format"),
    ({"response_format": JSON_FMT, "min_tokens": 3}, "min_tokens"),
    ({"best_of": 3}, "best_of"),
    ({"best_of": 1, "n": 2}, "best_of"),
    ({"best_of": "2"}, "best_of"),
])
def test_refused_output_options(rnd, extra, param):
    r = post(rnd, "/v1/completions", dict({"prompt": "Hi", "max_tokens": 2}, **extra))
    assert r.status_code == 400, r.text
    validate(r.json(), "ErrorResponse")
    assert r.json()["error"]["param"] == param
    ok = post(rnd, "/v1/completions", {"prompt": "Hi", "max_tokens": 2, "best_of": 1,
                                       "response_format": {"type": "text"}})
    assert ok.status_code == 200, ok.text


# ---- 3. JSON Schema (response_format json_schema) ----

SCHEMAS = {
    "scalars": {"type": "object", "properties": {
        "name": {"type": "string"}, "age": {"type": "integer"}, "score": {"type": "number"},
        "ok": {"type": "boolean", "description": "an annotation"},
        "tag": {"enum": ["a", "b c", "é", 1, 2.5, True, None]}, "kind": {"const": "x"}},
        "required": ["name", "age"], "additionalProperties": False},
    "nested": {"type": "object", "properties": {
        "items": {"type": "array", "minItems": 1, "maxItems": 3, "items": {
            "type": "object", "properties": {"id": {"type": "integer"},
                                             "v": {"type": ["string", "null"]}},
            "required": ["id"], "additionalProperties": False}},
        "meta": {"type": "object"}},
        "required": ["items"], "additionalProperties": False},
    "refs": {"$defs": {"pt": {"type": "object", "properties": {
        "x": {"type": "number"}, "y": {"type": "number"}}, "required": ["x", "y"],
        "additionalProperties": False}},
        "type": "object", "properties": {
            "a": {"$ref": "#/$defs/pt"},
            "b": {"anyOf": [{"$ref": "#/$defs/pt"}, {"type": "null"}]},
            "c": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
            "d": {"anyOf": [{"enum": ["p", "q"]}, {"type": "array", "items": {"type": "boolean"},
                                                   "minItems": 2, "maxItems": 2}]}},
        "required": ["a", "b", "c"], "additionalProperties": False},
    "open": {"type": "object", "properties": {"n": {"type": "integer"}},
             "additionalProperties": {"type": "boolean"}},
    "tagged": {"type": "object", "properties": {"pets": {"type": "array", "items": {"oneOf": [
        {"type": "object", "properties": {"kind": {"const": "cat"}, "lives": {"type": "integer"}},
         "required": ["kind", "lives"], "additionalProperties": False},
        {"type": "object", "properties": {"kind": {"const": "dog"}, "good": {"type": "boolean"},
                                          "toy": {"type": "string"}},
         "required": ["kind"], "additionalProperties": False},
        {"type": "object", "properties": {"kind": {"const": "fish", "title": "a tag"},
                                          "fins": {"type": "integer"}},
         "required": ["fins", "kind"]},
        {"type": "null"}]}}}, "required": ["pets"], "additionalProperties": False},
    "prefixes": {"type": "object", "properties": {
        "a": {"type": "integer"}, "ab": {"type": "integer"}, "abc": {"type": "string"},
        "e": {"enum": [1, 12, 123, -1, "1"]}},
        "required": ["ab"], "additionalProperties": False},
    # what Pydantic writes for Field(min_length=..., ge=..., gt=...), PositiveFloat, conlist
    "bounds": {"type": "object", "properties": {
        "name": {"type": "string", "minLength": 2, "maxLength": 5},
        "code": {"type": "string", "maxLength": 1},
        "age": {"type": "integer", "minimum": 18, "maximum": 120},
        "neg": {"type": "integer", "exclusiveMaximum": -5, "minimum": -1000},
        "price": {"type": "number", "exclusiveMinimum": 0, "maximum": 99.5},
        "temp": {"type": ["number", "null"], "minimum": -40.5, "exclusiveMaximum": 60},
        "big": {"type": "integer", "minimum": 1000000},
        "unit": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
        "nick": {"anyOf": [{"type": "string", "minLength": 3}, {"type": "null"}]},
        "tags": {"type": "array", "maxItems": 3,
                 "items": {"type": "string", "minLength": 1, "maxLength": 3}}},
        "required": ["name", "age", "price", "unit"], "additionalProperties": False},
    # what Pydantic writes for nested models, Optional and Literal fields: no
    # additionalProperties anywhere (strict mode: only the declared keys, none twice)
    "pydantic": {"$defs": {"Address": {"properties": {
        "city": {"title": "City", "type": "string"},
        "zip": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None}},
        "required": ["city"], "title": "Address", "type": "object"}},
        "properties": {"name": {"title": "Name", "type": "string"},
                       "age": {"title": "Age", "type": "integer"},
                       "kind": {"enum": ["a", "b"], "title": "Kind", "type": "string"},
                       "home": {"$ref": "#/$defs/Address"},
                       "past": {"items": {"$ref": "#/$defs/Address"}, "type": "array",
                                "maxItems": 3},
                       "extra": {"type": "object"}},
        "required": ["name", "age", "home"], "title": "Person", "type": "object"},
    # what Pydantic writes for Field(pattern=...) / constr(pattern=...): held as a whole match
    # (the examples are the generator's values)
    "patterns": {"type": "object", "properties": {
        "date": {"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}$",
                 "examples": ["2024-01-31", "1999-12-01"]},
        "code": {"type": "string", "pattern": r"[A-Z]{2}-\d+", "minLength": 5, "maxLength": 6,
                 "examples": ["AB-12", "ZZ-999"]},
        "word": {"type": ["string", "null"], "pattern": r"[a-zé\"\\\n]+", "maxLength": 8,
                 "examples": ["é", 'a"b', "x\\y\nz"]}},
        "required": ["date", "code"], "additionalProperties": False},
}


def _int_range(s):
    """The integers a bounded schema s allows: [lo, hi], within what Pagoda writes."""
    import math
    lo, hi = -(10**14 - 1), 10**15 - 1
    if "minimum" in s:
        lo = max(lo, math.ceil(s["minimum"]))
    if "exclusiveMinimum" in s:
        lo = max(lo, math.floor(s["exclusiveMinimum"]) + 1)
    if "maximum" in s:
        hi = min(hi, math.floor(s["maximum"]))
    if "exclusiveMaximum" in s:
        hi = min(hi, math.ceil(s["exclusiveMaximum"]) - 1)
    return lo, hi


def gen_bounded_number(rng, s, t):
    """A number of the one form Pagoda writes within s's bounds: an integer, or (a number
    schema) v + f with 0 < f < 1 where every such value lies within them."""
    lo, hi = _int_range(s)
    if t == "number" and rng.random() < 0.6:
        mn = s.get("minimum", s.get("exclusiveMinimum", -1e9))
        mx = s.get("maximum", s.get("exclusiveMaximum", 1e9))
        for _ in range(100):
            v = rng.randint(int(max(mn, -1e6)) - 1, int(min(mx, 1e6)) + 1)
            x = v + rng.choice([0.5, 0.25, 0.125, 0.75, 0.375])
            a, b = (v, v + 1) if v >= 0 else (v - 1, v)  # the integer part's range of values
            x = x if v >= 0 else v - (x - v)
            if a >= mn and b <= mx and jsonschema_num_ok(s, x):
                return x
    if lo <= hi:
        return rng.randint(lo, min(hi, lo + 10**6)) if rng.random() < 0.5 else \
            rng.randint(max(lo, hi - 10**6), hi)
    return gen_bounded_number(rng, s, "number")


def jsonschema_num_ok(s, x):
    import jsonschema
    return jsonschema.Draft202012Validator(s).is_valid(x)


def gen_instance(rng, s, root, depth=0):
    """A random instance of schema s (the subset Pagoda supports)."""
    if s is True or not any(k in s for k in ("type", "properties", "enum", "const", "anyOf",
                                             "oneOf", "$ref", "items")):
        return rand_value(rng, 5)
    if "$ref" in s:
        return gen_instance(rng, root["$defs"][s["$ref"].split("/")[-1]], root, depth)
    if "anyOf" in s or "oneOf" in s:
        return gen_instance(rng, rng.choice(s.get("anyOf") or s["oneOf"]), root, depth)
    if "const" in s:
        return s["const"]
    if "enum" in s:
        return rng.choice(s["enum"])
    t = s.get("type", "object")
    t = rng.choice(t) if isinstance(t, list) else t
    if t == "object":
        props = s.get("properties", {})
        out = {k: gen_instance(rng, v, root, depth + 1) for k, v in props.items()
               if k in s.get("required", []) or rng.random() < 0.5}
        addl = s.get("additionalProperties", "properties" not in s)  # xgrammar's strict mode
        if addl is not False and rng.random() < 0.5:
            for _ in range(rng.randint(1, 2)):
                # keys of a schema's objects are written without escapes (one form)
                k = "".join(ch for ch in rand_str(rng) if ch >= " " and ch not in '"\\') + "_x"
                out[k] = gen_instance(rng, addl, root, depth + 1)
        items = list(out.items())
        rng.shuffle(items)
        # a union's tag (a required const) comes first, as the recognizer writes it
        items.sort(key=lambda kv: not ("const" in props.get(kv[0], {}) and
                                       kv[0] in s.get("required", [])))
        return dict(items)
    if t == "array":
        lo, hi = s.get("minItems", 0), s.get("maxItems", 4)
        return [gen_instance(rng, s.get("items", True), root, depth + 1)
                for _ in range(rng.randint(lo, min(hi, lo + 3)))]
    if t == "string" and "pattern" in s:
        return rng.choice(s["examples"])
    if t == "string":
        v = rand_str(rng)
        lo, hi = s.get("minLength", 0), s.get("maxLength", 10**9)
        while len(v) < lo:
            v += rand_str(rng) or "a"
        return v[:rng.randint(lo, min(hi, max(lo, len(v))))]
    if t in ("integer", "number") and any(k in s for k in ("minimum", "maximum",
                                                          "exclusiveMinimum", "exclusiveMaximum")):
        return gen_bounded_number(rng, s, t)
    if t == "integer":
        return rng.randint(-10**6, 10**6)
    if t == "number":
        return rng.choice([rng.randint(-99, 99), rng.uniform(-1e3, 1e3), 1.5e-7])
    if t == "boolean":
        return rng.random() < 0.5
    return None


def strict(s):
    """s as vLLM's default backend reads it (xgrammar's strict mode): an object schema that
    declares properties and says nothing of others takes no others."""
    if isinstance(s, list):
        return [strict(x) for x in s]
    if not isinstance(s, dict):
        return s
    out = {k: (v if k in ("enum", "const", "examples", "default") else strict(v))
           for k, v in s.items()}
    if isinstance(s.get("properties"), dict):
        out["properties"] = {k: strict(v) for k, v in s["properties"].items()}
        out.setdefault("additionalProperties", False)
    return out


def schema_valid(schema, b: bytes) -> bool:
    """b is valid for jsonschema (Draft 2020-12) under the strict reading of schema."""
    import jsonschema
    try:
        v = json.loads(b.decode("utf-8"), parse_constant=_raise)
    except (ValueError, UnicodeDecodeError):
        return False
    return jsonschema.Draft202012Validator(strict(schema)).is_valid(v)


def tool_schema(schema, docs, tmp_path):
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema))
    inp = "".join(f"o {b.hex()}\n" for b in docs)
    p = subprocess.run([str(TOOL), "schema", str(path)], input=inp, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout.split()
    assert len(out) == len(docs)
    return out


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_schema_recognizer_against_jsonschema(name, tmp_path):
    """Instances generated from the schema (compact or indented; keys in any order) are accepted
    whole and never refused part-way; a mutated document the recognizer accepts whole is valid
    for Python's jsonschema (Draft 2020-12): the recognizer never lets an invalid answer
    through."""
    schema = SCHEMAS[name]
    rng = random.Random(name)
    docs, want = [], []
    for i in range(120):
        v = gen_instance(rng, schema, schema)
        b = json.dumps(v, ensure_ascii=False,
                       **({"indent": 1} if i % 3 == 0 else {"separators": (",", ":")})).encode()
        assert schema_valid(schema, b), b  # the generator's own check
        docs.append(b)
        want.append("complete")
        for k in sorted(rng.sample(range(len(b)), min(len(b), 25))):
            docs.append(b[:k])
            want.append("prefix")
        for _ in range(8):
            docs.append(mutate(rng, b))
            want.append(None)
    got = tool_schema(schema, docs, tmp_path)
    bad = [(d, g, w) for d, g, w in zip(docs, got, want) if w and g != w]
    assert not bad, f"{len(bad)} refused or misjudged, e.g. {bad[:4]}"
    unsound = [d for d, g in zip(docs, got) if g == "complete" and not schema_valid(schema, d)]
    assert not unsound, f"accepted but invalid: {unsound[:4]}"
    mutated = [g for g, w in zip(got, want) if w is None]
    assert mutated.count("reject") > len(mutated) // 4


NUMBER_BOUNDS = [
    {"type": "integer", "minimum": 18, "maximum": 120},
    {"type": "integer", "exclusiveMaximum": -5, "minimum": -1000},
    {"type": "integer", "minimum": 5, "maximum": 5},
    {"type": "number", "exclusiveMinimum": 0, "maximum": 99.5},
    {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
    {"type": "number", "minimum": -40.5, "exclusiveMaximum": 60},
    {"type": "number", "exclusiveMaximum": 0},
    {"type": "number", "minimum": -1, "maximum": -0.5},
    {"type": "number", "minimum": 0.5, "maximum": 1900.25},
]


@pytest.mark.parametrize("bounds", NUMBER_BOUNDS, ids=lambda b: json.dumps(b)[:60])
def test_schema_number_bounds_exhaustive(bounds, tmp_path):
    """Every text over "-0159.e}" of up to 6 bytes as the value of a bounded number: what the
    recognizer calls complete is valid for jsonschema (never an out-of-range or zero-fraction
    number through an exclusive bound), and no prefix it accepts is a dead end -- one more byte
    always keeps it going (so a masked generation can always finish). The integers in range of
    up to 4 digits are all accepted."""
    import itertools
    schema = {"type": "object", "properties": {"a": bounds}, "required": ["a"],
              "additionalProperties": False}
    alpha = "-0159.e}"
    texts = [""] + ["".join(t) for n in range(1, 7) for t in itertools.product(alpha, repeat=n)]
    got = dict(zip(texts, tool_schema(schema, [b'{"a":' + t.encode() for t in texts], tmp_path)))
    unsound = [t for t, g in got.items() if g == "complete" and
               not schema_valid(schema, b'{"a":' + t.encode())]
    assert not unsound, unsound[:10]
    dead = [t for t, g in got.items() if g == "prefix" and len(t) < 6 and
            all(got[t + c] == "reject" for c in alpha)]
    assert not dead, dead[:10]
    lo, hi = _int_range(bounds)
    ints = [str(v) for v in range(max(lo, -999), min(hi, 9999) + 1)]
    got_ints = tool_schema(schema, [b'{"a":%s}' % v.encode() for v in ints], tmp_path)
    assert set(got_ints) <= {"complete"}, [v for v, g in zip(ints, got_ints) if g != "complete"]
    n_complete = sum(g == "complete" for g in got.values())
    print(f"{n_complete} of {len(texts)} texts complete")
    assert n_complete > 0


def test_schema_bounds_rounding(tmp_path):
    """As a double a fraction can round onto an exclusive bound at either end of its integer
    part (0.99999999999999999999 is 1.0; 99999999999999.001 is 99999999999999.0): the first
    fraction digit keeps 0.1 away from such an end. Found by an audit."""
    cases = [  # (bounds, document value, Pagoda's verdict)
        ({"exclusiveMaximum": 1}, "0.99999999999999999999", "reject"),
        ({"exclusiveMaximum": 1}, "0.89999999999999999999", "complete"),
        ({"exclusiveMinimum": 99999999999999, "maximum": 1e15}, "99999999999999.001", "reject"),
        ({"exclusiveMinimum": 99999999999999, "maximum": 1e15}, "99999999999999.5", "complete"),
        ({"exclusiveMaximum": -5}, "-5.0000000000000000001", "reject"),
        ({"exclusiveMaximum": -5}, "-5.5", "complete"),
        ({"exclusiveMinimum": 0, "exclusiveMaximum": 1}, "0.5", "complete"),
    ]
    for bounds, v, want in cases:
        schema = {"type": "object", "properties": {"x": dict(bounds, type="number")},
                  "required": ["x"], "additionalProperties": False}
        doc = b'{"x":' + v.encode() + b"}"
        assert tool_schema(schema, [doc], tmp_path) == [want], (bounds, v)
        assert schema_valid(schema, doc) == (want == "complete"), (bounds, v)
    # bounds do not constrain a type without numbers (and are not refused there)
    assert tool_schema({"type": "object", "properties": {"s": {"type": "string",
                                                               "minimum": 1e300}}},
                       [b'{"s":"a"}'], tmp_path) == ["complete"]


INVALID = {
    "scalars": ['{"name":"a"}', '{"name":"a","age":1.5}', '{"name":"a","age":1,"extra":1}',
                '{"name":"a","age":1,"tag":"z"}', '{"name":"a","age":1,"kind":"y"}',
                '{"name":1,"age":1}', '{"name":"a","age":1,"tag":2}',
                '{"name":"a","age":1,"ok":null}'],
    "nested": ['{"items":[]}', '{"items":[{"id":1},{"id":2},{"id":3},{"id":4}]}',
               '{"items":[{"id":1,"v":3}]}', '{"items":[{"v":"a"}]}', '{"meta":{}}',
               '{"items":[{"id":1}],"meta":[]}'],
    "refs": ['{"a":{"x":1},"b":null,"c":"s"}', '{"a":{"x":1,"y":2},"b":null,"c":true}',
             '{"a":{"x":1,"y":2},"b":null,"c":"s","d":"r"}',
             '{"a":{"x":1,"y":2},"b":null,"c":"s","d":[true,false,true]}',
             '{"a":{"x":1,"y":2},"b":null,"c":"s","d":[true]}',
             '{"a":{"x":1,"y":2},"b":{"x":1},"c":1}', '{"a":null,"b":null,"c":1}'],
    "open": ['{"n":1,"z":3}', '{"n":1.5}', '{"z":"x"}'],
    "tagged": ['{"pets":[{"kind":"cow"}]}', '{"pets":[{"kind":"cat"}]}',
               '{"pets":[{"kind":"dog","lives":3}]}', '{"pets":[{"kind":"cat","lives":"x"}]}',
               '{"pets":[{"fins":2}]}', '{"pets":[{}]}'],
    "prefixes": ['{"abcd":1}', '{"ab":1,"e":2}', '{"ab":1,"e":1234}', '{"a":1}',
                 '{"ab":1,"abc":2}', '{"ab":1,"e":"12"}'],
    "bounds": ["{%s}" % ",".join(f'"{n}":{x}' for n, x in dict(
        [("name", '"ab"'), ("age", "30"), ("price", "1"), ("unit", "0.5"), (k, v)]).items())
               for k, v in [("name", '"a"'), ("name", '"abcdef"'), ("code", '"ab"'),
                            ("age", "17"), ("age", "121"), ("age", "-18"), ("neg", "-5"),
                            ("neg", "-1001"), ("price", "0"), ("price", "-0.5"),
                            ("price", "99.75"), ("temp", "60"), ("temp", "-41"),
                            ("temp", "-40.75"), ("big", "999999"), ("unit", "1"),
                            ("unit", "0"), ("nick", '"ab"'), ("tags", '["abcd"]'),
                            ("tags", '[""]'), ("code", '"\\ud83d\\ude00x"'),
                            ("unit", "0.99999999999999999999")]] +
              ['{"name":"ab","age":30,"price":1}', '{"name":"ab","age":30,"price":1,"unit":0.0}',
               '{"name":"\\u00e9","age":30,"price":1,"unit":0.5}'],
}


@pytest.mark.parametrize("name", list(INVALID))
def test_schema_refuses_invalid_documents(name, tmp_path):
    """Each case breaks one rule (a required property missing, a wrong type, an extra key, an
    enum value outside the list, too few or too many items, a duplicate key): the recognizer
    never calls it complete, and jsonschema agrees it is invalid."""
    schema = SCHEMAS[name]
    docs = [d.encode() for d in INVALID[name]]
    for d in docs:
        assert not schema_valid(schema, d), d
    # valid, but not in the one form Pagoda writes: an integer as 1e3 or 1.0, a key twice
    stricter = [b'{"age":1e3,"name":""}', b'{"name":"a","age":1.0}',
                b'{"name":"a","age":1,"name":"b"}'] if name == "scalars" else []
    for d in stricter:
        assert schema_valid(schema, d), d
    got = tool_schema(schema, docs + stricter, tmp_path)
    assert "complete" not in got, list(zip(docs + stricter, got))


@pytest.mark.parametrize("lo,hi", [(0, None), (2, 3), (3, None), (0, 1)])
def test_schema_pattern_is_a_whole_match(tmp_path, lo, hi):
    """A string with a pattern is complete exactly when Python's regex (ASCII \\d \\w \\s)
    matches its decoded text whole, in the form Pagoda writes under a pattern: characters as
    themselves, \\" \\\\ \\n ... and \\u00XX for control characters (json.dumps with
    ensure_ascii writes others as \\uXXXX: refused, the mask never takes them); every prefix of
    such a document is a prefix. With minLength / maxLength (characters) as well, only the
    matches within them are complete."""
    import regex
    pat = r"(\d{2}|é+|\"[^\"]*\"|😀\n|\x01)x?"
    v = {"type": "string", "pattern": pat, "minLength": lo}
    if hi is not None:
        v["maxLength"] = hi
    schema = {"type": "object", "properties": {"v": v}, "required": ["v"],
              "additionalProperties": False}
    texts = ["12", "12x", "1", "123", "éé", "éx", "e", '"a b"', '"a"x', '""', '"', "😀\n",
             "😀", "😀\nx", "", "x", "é\"", "12\n", "\x01", "\x01x", "\x02"]
    docs, want = [], []
    for t in texts:
        for ascii_ in (False, True):
            whole = bool(regex.fullmatch(pat, t, flags=regex.ASCII)) and (t.isascii() or
                                                                           not ascii_) and \
                lo <= len(t) <= (hi if hi is not None else 10**9)
            b = json.dumps({"v": t}, ensure_ascii=ascii_, separators=(",", ":")).encode()
            docs.append(b)
            want.append("complete" if whole else "reject")
            if whole:
                docs += [b[:k] for k in range(1, len(b))]
                want += ["prefix"] * (len(b) - 1)
    got = tool_schema(schema, docs, tmp_path)
    bad = [(d, g, w) for d, g, w in zip(docs, got, want) if g != w]
    assert not bad, bad[:6]


@pytest.mark.parametrize("pattern,lo,hi,prefixes", [
    # match lengths with a gap (2, 5) around the window: "aaa" must be refused, or it strands
    ("a{2}|a{5}", 2, 4, ['{"s":"', '{"s":"a', '{"s":"aa']),
    # an escape must leave room: after "abcd" no "\\n" + letter fits in 5 characters
    ("^[a-z]+(\\n[a-z]+)*$", 0, 5, ['{"s":"', '{"s":"abc', '{"s":"abc\\', '{"s":"abcd']),
    ("\\x01|ab", 2, None, ['{"s":"', '{"s":"a']),
])
def test_schema_pattern_lengths_never_strand(pattern, lo, hi, prefixes, tmp_path):
    """With minLength/maxLength beside a pattern, every prefix the recognizer takes has a token
    to go on with (the mask of each is not empty: an audit found empty ones), and the prefixes
    that could not end well are refused on their last byte."""
    v = {"type": "string", "pattern": pattern, "minLength": lo}
    if hi is not None:
        v["maxLength"] = hi
    schema = {"type": "object", "properties": {"s": v}, "required": ["s"],
              "additionalProperties": False}
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema))
    docs = [p.encode() for p in prefixes] + [b'{"s":"aaa', b'{"s":"abcd\\', b'{"s":"\\u0001"']
    got = tool_schema(schema, docs, tmp_path)
    ok = [d for d, g in zip(docs, got) if g == "prefix"]
    assert set(ok) >= {p.encode() for p in prefixes}, list(zip(docs, got))
    assert b'{"s":"aaa' not in ok or pattern != "a{2}|a{5}"
    assert b'{"s":"abcd\\' not in ok
    inp = "".join(f"o {b.hex()}\n" for b in ok)
    p = subprocess.run([str(TOOL), "mask", str(VOCABS[0]), str(path)], input=inp,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    counts = [int(x) for x in p.stdout.split()]
    assert len(counts) == len(ok) and min(counts) >= 1, list(zip(ok, counts))


def test_schema_pattern_without_a_fitting_length_is_refused(tmp_path):
    path = tmp_path / "schema.json"
    path.write_text(json.dumps({"type": "object", "properties": {"s": {
        "type": "string", "pattern": "(ab){1,3}", "minLength": 3, "maxLength": 3}}}))
    p = subprocess.run([str(TOOL), "schema", str(path)], input="", capture_output=True, text=True)
    assert p.returncode == 3 and "matches no string of 3 to 3 characters" in p.stdout, p.stdout


@pytest.mark.parametrize("name", ["scalars", "refs", "prefixes", "tagged", "bounds", "patterns",
                                  "pydantic"])
def test_schema_mask_equals_its_definition(name, tmp_path):
    schema = SCHEMAS[name]
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema))
    rng = random.Random(1)
    cases = []
    for _ in range(10):
        b = json.dumps(gen_instance(rng, schema, schema), ensure_ascii=False).encode()
        cases += [b[:k] for k in sorted(rng.sample(range(len(b) + 1), min(len(b) + 1, 20)))]
    inp = "".join(f"o {b.hex()}\n" for b in cases)
    p = subprocess.run([str(TOOL), "mask", str(VOCABS[0]), str(path)], input=inp,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-500:] + p.stderr
    counts = [int(x) for x in p.stdout.split()]
    assert len(counts) == len(cases) and min(counts) >= 1


def schema_fmt(schema):
    return {"type": "json_schema", "json_schema": {"name": "t", "strict": True, "schema": schema}}


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_sampled_random_model_follows_the_schema(rnd, name, tmp_path):
    """Sampled answers of the random model are valid for the schema when they stop and a prefix
    of a valid one when max_tokens cuts them; none ends in an error (a state with no token to
    go on)."""
    schema = SCHEMAS[name]
    cut = []
    tok = post(rnd, "/tokenize", {"prompt": '"}]', "add_special_tokens": False}).json()
    n_stop = 0
    for seed, weight in enumerate([8, 4, 2]):  # strong to weak pulls towards closing
        bias = {str(t): weight for t in tok["tokens"]}
        r = post(rnd, "/v1/completions", {
            "prompt": "Hello", "max_tokens": 160, "n": 8, "temperature": 1.0, "seed": seed,
            "logit_bias": bias, "response_format": schema_fmt(schema)})
        assert r.status_code == 200, r.text
        for c in r.json()["choices"]:
            b = c["text"].encode()
            if c["finish_reason"] == "stop":
                assert schema_valid(schema, b), b
                n_stop += 1
            else:
                assert c["finish_reason"] == "length", c
                cut.append(b)
    if cut:
        assert tool_schema(schema, cut, tmp_path) == ["prefix"] * len(cut), cut
    print(name, "stopped", n_stop, "of 24")
    assert n_stop >= 3, n_stop


def test_real_model_follows_a_schema(smol):
    schema = {"type": "object", "properties": {
        "name": {"enum": ["Tom", "Felix", "Luna"]}, "age": {"type": "integer"},
        "indoor": {"type": "boolean"}}, "required": ["name", "age", "indoor"],
        "additionalProperties": False}
    r = post(smol, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Describe a cat as JSON."}], "temperature": 0,
        "max_tokens": 60, "response_format": schema_fmt(schema)})
    assert r.status_code == 200, r.text
    validate(r.json(), "CreateChatCompletionResponse")
    c = r.json()["choices"][0]
    assert c["finish_reason"] == "stop", c
    assert schema_valid(schema, c["message"]["content"].encode()), c


STRICT_CASES = [
    # declared properties only, none twice; a schema without properties takes any
    ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}},
     [b'{"a":1}', b'{"a":1,"b":"x"}', b'{}', b'{"c":1}', b'{"a":1,"c":2}', b'{"a":1,"a":2}',
      b'{"b":"x","b":"y"}', b'{"ab":1}']),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
      "additionalProperties": True}, [b'{"a":1,"z":2}', b'{"a":1}', b'{"a":1,"a":2}']),
    ({"type": "object", "properties": {"a": {"type": "integer"}},
      "additionalProperties": {"type": "string"}}, [b'{"a":1,"z":"s"}', b'{"a":1,"z":2}']),
    ({"type": "object", "properties": {}}, [b'{}', b'{"a":1}']),
    ({"type": "object"}, [b'{}', b'{"a":1}', b'{"a":{"b":[1]}}']),
    ({"type": "object", "properties": {"o": {"type": "object", "properties": {
        "k": {"type": "boolean"}}}, "p": {"type": "object"}}},
     [b'{"o":{"k":true}}', b'{"o":{"k":true,"x":1}}', b'{"o":{},"p":{"x":1}}',
      b'{"o":{"k":true,"k":false}}']),
    (SCHEMAS["pydantic"], [b'{"name":"A","age":3,"home":{"city":"P"}}',
                           b'{"name":"A","age":3,"home":{"city":"P","country":"F"}}',
                           b'{"name":"A","age":3,"home":{"city":"P"},"nick":"x"}',
                           b'{"name":"A","age":3,"home":{"city":"P","zip":null},"extra":{"q":1}}',
                           b'{"name":"A","name":"B","age":3,"home":{"city":"P"}}']),
]


@pytest.mark.parametrize("schema,docs", STRICT_CASES, ids=range(len(STRICT_CASES)))
def test_schema_strict_mode_as_xgrammar(schema, docs, tmp_path):
    """Without additionalProperties an object that declares properties takes only those, and
    none twice: a document is complete exactly when vLLM's default backend (xgrammar, strict
    mode) accepts it (compact documents with keys in the declared order, which xgrammar
    enforces and Pagoda does not), and is valid for jsonschema under that reading."""
    xgr = pytest.importorskip("xgrammar")
    from xgrammar.testing import _is_grammar_accept_string
    g = xgr.Grammar.from_json_schema(json.dumps(schema), strict_mode=True)
    got = tool_schema(schema, docs, tmp_path)
    want = ["complete" if _is_grammar_accept_string(g, d.decode()) else "reject" for d in docs]
    assert got == want, list(zip(docs, got, want))
    for d, w in zip(docs, want):  # (json.loads keeps the last of a key twice)
        assert (schema_valid(schema, d) and not key_twice(d)) == (w == "complete"), d


def key_twice(b: bytes) -> bool:
    """Some object of the document b has a key twice."""
    twice = []

    def hook(kv):
        twice.append(len({k for k, _ in kv}) < len(kv))
        return dict(kv)
    json.loads(b, object_pairs_hook=hook)
    return any(twice)


def test_schema_whitespace_is_compact(tmp_path):
    """The whitespace an answer may hold between tokens is llama.cpp's: json.dumps(indent=2)
    output is taken to 10 levels (20 spaces), a third newline, a lone tab or '\r' are not; the mask never
    offers a token that would break the rule (its definition, on SmolLM2's vocabulary)."""
    schema = {"type": "object", "properties": {"a": {"type": "array", "items": {}}}}
    pretty = json.dumps({"a": [[[[[[[[[1]]]]]]]]]}, indent=2).encode()  # 1 at 20 spaces
    deeper = json.dumps({"a": [[[[[[[[[[1]]]]]]]]]]}, indent=2).encode()  # 22
    docs = [pretty, deeper, b'{\n\n"a":[]}', b'{\n\n\n"a":[]}', b'{"a":\t[]}', b'{"a":[]\r\n}',
            b'{ "a" : [ 1 , 2 ] }', b'{  "a":[]}']
    got = tool_schema(schema, docs, tmp_path)
    assert got == ["complete", "reject", "complete", "reject", "reject", "reject", "complete",
                   "reject"]
    assert [ws_ok(d) for d in docs] == [g == "complete" for g in got]


def test_real_model_pydantic_schema_has_only_declared_keys(smol):
    """A Pydantic model's schema (no additionalProperties): the real model's answer holds only
    the declared keys, validates, and is compact (the forced get_weather call of issue 33 took 61
    tokens, mostly newlines, before the bound)."""
    pydantic = pytest.importorskip("pydantic")

    class Address(pydantic.BaseModel):
        city: str
        country: str

    class Person(pydantic.BaseModel):
        name: str
        age: int
        address: Address

    schema = Person.model_json_schema()
    assert "additionalProperties" not in json.dumps(schema)
    r = post(smol, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Extract the person: Alice is 30 years old and "
                                                 "lives in Paris, France."}],
        "temperature": 0, "max_tokens": 80, "response_format": schema_fmt(schema)})
    assert r.status_code == 200, r.text
    c = r.json()["choices"][0]
    assert c["finish_reason"] == "stop", c
    v = json.loads(c["message"]["content"])
    assert set(v) == {"name", "age", "address"} and set(v["address"]) == {"city", "country"}, v
    Person.model_validate(v)
    assert schema_valid(schema, c["message"]["content"].encode())
    assert ws_ok(c["message"]["content"].encode())
    assert r.json()["usage"]["completion_tokens"] < 60, r.json()["usage"]


@pytest.mark.parametrize("schema,needle", [
    ({"type": "object", "properties": {"a": {"type": "string", "pattern": "a(?=b)"}}},
     "'pattern' a(?=b): only (...) and (?:...) groups"),
    ({"type": "object", "properties": {"a": {"type": "string", "pattern": 5}}},
     "'pattern' must be a string"),
    ({"type": "object", "properties": {"a": {"type": "string", "pattern": "[^\\x00-\\U0010FFFF]"}}},
     "matches no string"),
    ({"type": "object", "properties": {"a": {"type": "integer", "multipleOf": 2}}},
     "'multipleOf'"),
    ({"type": "object", "properties": {"a": {"type": "number", "minimum": 0.2, "maximum": 0.8}}},
     "bounds"),
    ({"type": "object", "properties": {"a": {"type": "string", "minLength": 3, "maxLength": 2}}},
     "minLength"),
    ({"type": "object", "properties": {"a": {"enum": ["x"], "maxLength": 2}}}, "enum"),
    ({"type": "object", "properties": {"a": {"type": "integer", "exclusiveMinimum": True}}},
     "exclusiveMinimum"),
    ({"type": "array"}, "root"),
    ({"anyOf": [{"type": "object"}, {"type": "null"}]}, "root"),
    ({"type": "object", "properties": {"a": {"$ref": "#"}}}, "recursive"),
    ({"$defs": {"n": {"type": "object", "properties": {"k": {"$ref": "#/$defs/n"}}}},
      "type": "object", "properties": {"n": {"$ref": "#/$defs/n"}}}, "recursive"),
    ({"type": "object", "properties": {"a": {"anyOf": [{"type": "integer"},
                                                        {"type": "number"}]}}}, "different"),
    ({"type": "object", "properties": {"a": {"oneOf": [
        {"type": "object", "properties": {"k": {"const": "x"}}},
        {"type": "object", "properties": {"k": {"const": "y"}}}]}}}, "told apart"),
    ({"type": "object", "required": ["z"], "properties": {"a": {}}}, "'z'"),
    ({"type": "object", "properties": {"a": {"type": "array", "minItems": 3, "maxItems": 2}}},
     "minItems"),
    ({"type": "object", "properties": {"a": {"enum": []}}}, "enum"),
    ({"type": "object", "properties": {"a": {"type": "strnig"}}}, "strnig"),
])
def test_refused_schemas(rnd, schema, needle):
    r = post(rnd, "/v1/completions", {"prompt": "Hi", "max_tokens": 2,
                                      "response_format": schema_fmt(schema)})
    assert r.status_code == 400, r.text
    validate(r.json(), "ErrorResponse")
    assert r.json()["error"]["param"] == "response_format"
    assert needle in r.json()["error"]["message"], r.json()["error"]["message"]


def test_batch_lines_take_response_format(tmp_path):
    """`pagoda batch` input lines take the same response_format: answers follow the schema (or
    are a prefix of a valid one when cut), and a refused schema is that line's error."""
    schema = SCHEMAS["scalars"]
    lines = [{"id": i, "prompt": "Hello", "max_tokens": 160, "temperature": 1.0, "seed": i,
              "logit_bias": {"376": 8, "29913": 8, "6525": 8},
              "response_format": schema_fmt(schema)} for i in range(6)]
    lines.append({"id": "bad", "prompt": "Hello", "response_format": schema_fmt({"type": "array"})})
    lines.append({"id": "obj", "prompt": "Hello", "max_tokens": 160, "temperature": 1.0,
                  "logit_bias": {"376": 8, "29913": 8, "6525": 8},
                  "response_format": {"type": "json_object"}})
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("".join(json.dumps(x) + "\n" for x in lines))
    util.run_pagoda("batch", "-m", RANDOM_LLAMA, "--input", inp, "--output", out, "-t", "1")
    res = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert "root" in res["bad"]["error"]["message"]
    for i in range(6):
        b = res[i]["text"].encode()
        if res[i]["finish_reason"] == "stop":
            assert schema_valid(schema, b), b
        else:
            assert tool_schema(schema, [b], tmp_path) == ["prefix"], b
    check_choice(res["obj"]["text"], res["obj"]["finish_reason"])


# ---- 4. tool calls (tool_choice required / named; the hermes format) ----

TOOL_W = {"type": "function", "function": {"name": "weather", "parameters": {
    "type": "object", "properties": {"city": {"enum": ["Oslo", "Paris"]},
                                     "days": {"type": "integer"}},
    "required": ["city", "days"], "additionalProperties": False}}}
TOOL_T = {"type": "function", "function": {"name": "time", "parameters": {
    "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"],
    "additionalProperties": False}}}


def with_template(tmp_path_factory, template):
    """The random model carrying a real chat template (set by gguf-new-metadata), served."""
    model = util.model_with_template(tmp_path_factory, template)
    s = Server(model)
    s.start()
    s.model_path = model
    return s


@pytest.fixture(scope="module")
def qwen_rnd(tmp_path_factory):
    """Qwen2.5's template asks for <tool_call> tags: the server parses hermes calls."""
    s = with_template(tmp_path_factory, "Qwen-Qwen2.5-7B-Instruct.jinja")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def llama3_rnd(tmp_path_factory):
    """Llama 3.1's template asks for {"name", "parameters"} first: llama3_json calls."""
    s = with_template(tmp_path_factory, "meta-llama-Llama-3.1-8B-Instruct.jinja")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def mistral_rnd(tmp_path_factory):
    """Mistral Nemo's template writes [TOOL_CALLS]: mistral calls, 9-character ids."""
    s = with_template(tmp_path_factory, "mistralai-Mistral-Nemo-Instruct-2407.jinja")
    yield s
    s.stop()


def chat_tools(server, tools, choice, stream=False, seed=0, **extra):
    body = {"messages": [{"role": "user", "content": "Weather in Oslo?"}], "max_tokens": 400,
            "temperature": 0.8, "seed": seed, "tools": tools, "tool_choice": choice,
            "stream": stream, **extra}
    return requests.post(server.url("/v1/chat/completions"), json=body, timeout=300,
                         stream=stream)


def check_call(call, tools, mistral=False):
    import jsonschema
    assert call["type"] == "function"
    if mistral:  # what Mistral's templates require of the ids handed back
        assert len(call["id"]) == 9 and call["id"].isalnum(), call["id"]
    else:
        assert call["id"].startswith("call_")
    fn = {t["function"]["name"]: t["function"] for t in tools}[call["function"]["name"]]
    jsonschema.validate(json.loads(call["function"]["arguments"]), fn["parameters"])


def test_required_tool_call(qwen_rnd):
    """tool_choice "required" with one tool: the answer is that call, its arguments valid for the
    function's parameters; content null, finish_reason tool_calls; streamed the same."""
    for seed in range(3):
        r = chat_tools(qwen_rnd, [TOOL_W], "required", seed=seed)
        assert r.status_code == 200, r.text
        validate(r.json(), "CreateChatCompletionResponse")
        c = r.json()["choices"][0]
        assert c["finish_reason"] == "tool_calls", c
        m = c["message"]
        assert m["content"] is None and len(m["tool_calls"]) == 1, m
        check_call(m["tool_calls"][0], [TOOL_W])
        s = chat_tools(qwen_rnd, [TOOL_W], "required", stream=True, seed=seed)
        events = [e for e in sse_events(s.iter_lines()) if e != "[DONE]"]
        for e in events:
            validate(e, "CreateChatCompletionStreamResponse")
        calls = [tc for e in events for tc in e["choices"][0]["delta"].get("tool_calls") or []]
        content = "".join(e["choices"][0]["delta"].get("content") or "" for e in events)
        assert content == "" and events[-1]["choices"][0]["finish_reason"] == "tool_calls"
        assert [(tc["function"]["name"], json.loads(tc["function"]["arguments"]))
                for tc in calls] == [(m["tool_calls"][0]["function"]["name"],
                                      json.loads(m["tool_calls"][0]["function"]["arguments"]))]


def test_mistral_tool_calls_round_trip(mistral_rnd):
    """Mistral Nemo's template: a required call comes back parsed from [TOOL_CALLS][...] with a
    9-character id, streamed the same; handed back in the next turn with its tool result, the
    template (which refuses other ids) renders it, and the prompt holds the call."""
    r = chat_tools(mistral_rnd, [TOOL_W], "required", seed=1)
    assert r.status_code == 200, r.text
    validate(r.json(), "CreateChatCompletionResponse")
    c = r.json()["choices"][0]
    m = c["message"]
    assert c["finish_reason"] == "tool_calls" and m["content"] is None, c
    check_call(m["tool_calls"][0], [TOOL_W], mistral=True)
    s = chat_tools(mistral_rnd, [TOOL_W], "required", stream=True, seed=1)
    events = [e for e in sse_events(s.iter_lines()) if e != "[DONE]"]
    calls = [tc for e in events for tc in e["choices"][0]["delta"].get("tool_calls") or []]
    assert [tc["function"]["arguments"] for tc in calls] == \
        [m["tool_calls"][0]["function"]["arguments"]]
    assert len(calls[0]["id"]) == 9 and calls[0]["id"].isalnum()
    call = m["tool_calls"][0]
    turn = [{"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": "sunny"}]
    def prompt_tokens(msgs):
        r = requests.post(mistral_rnd.url("/v1/chat/completions"), timeout=60, json={
            "messages": msgs, "tools": [TOOL_W], "max_tokens": 1})
        assert r.status_code == 200, r.text
        return r.json()["usage"]["prompt_tokens"]
    assert prompt_tokens(turn) > prompt_tokens(turn[:1]) + 10
    bad = [dict(turn[1], tool_calls=[dict(call, id="call_1")]),
           dict(turn[2], tool_call_id="call_1")]
    r = requests.post(mistral_rnd.url("/v1/chat/completions"), timeout=60, json={
        "messages": turn[:1] + bad, "tools": [TOOL_W], "max_tokens": 1})
    assert r.status_code == 400 and "length 9" in r.json()["error"]["message"], r.text


def test_named_and_required_among_several(qwen_rnd):
    for name in ["weather", "time"]:
        r = chat_tools(qwen_rnd, [TOOL_W, TOOL_T], {"type": "function",
                                                    "function": {"name": name}})
        assert r.status_code == 200, r.text
        call = r.json()["choices"][0]["message"]["tool_calls"][0]
        assert call["function"]["name"] == name
        check_call(call, [TOOL_W, TOOL_T])
    names = set()
    for seed in range(6):  # each call held to its own function's parameters
        r = chat_tools(qwen_rnd, [TOOL_W, TOOL_T], "required", seed=seed)
        assert r.status_code == 200, r.text
        call = r.json()["choices"][0]["message"]["tool_calls"][0]
        names.add(call["function"]["name"])
        check_call(call, [TOOL_W, TOOL_T])
    assert names == {"weather", "time"}


def test_auto_without_a_call_keeps_the_text(qwen_rnd):
    """With tools and tool_choice auto, an answer that holds no call is content as it is."""
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 12, "temperature": 0}
    plain = requests.post(qwen_rnd.url("/v1/chat/completions"), json=body, timeout=60).json()
    r = requests.post(qwen_rnd.url("/v1/chat/completions"),
                      json=dict(body, tools=[TOOL_W]), timeout=60).json()
    validate(r, "CreateChatCompletionResponse")
    m = r["choices"][0]["message"]
    assert "<tool_call>" not in m["content"] and "tool_calls" not in m
    assert r["choices"][0]["finish_reason"] == plain["choices"][0]["finish_reason"]


@pytest.mark.parametrize("tools,choice,param,needle", [
    ([TOOL_W], {"type": "function", "function": {"name": "nope"}}, "tool_choice", "not in"),
    ([{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "string", "format": "date",
                                               "contentEncoding": "base64"}}}}}],
     "required", "tools", "'contentEncoding'"),
    (None, "required", "tool_choice", "no 'tools'"),
])
def test_refused_tool_choices(qwen_rnd, tools, choice, param, needle):
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
            "tool_choice": choice}
    if tools:
        body["tools"] = tools
    r = requests.post(qwen_rnd.url("/v1/chat/completions"), json=body, timeout=60)
    assert r.status_code == 400, r.text
    validate(r.json(), "ErrorResponse")
    assert r.json()["error"]["param"] == param and needle in r.json()["error"]["message"]


def test_required_call_without_a_format(qwen_rnd):
    """--tool-call-parser none: a required call is vLLM's JSON array of {name, parameters}
    (no <tool_call> tags), a named one its arguments; tools with tool_choice auto are a 400
    naming the option (they were dropped without a word). More in test_tools_generic.py."""
    s = Server(qwen_rnd.model_path, "--tool-call-parser", "none")
    s.start()
    try:
        for choice in ["required", {"type": "function", "function": {"name": "time"}}]:
            r = chat_tools(s, [TOOL_W, TOOL_T], choice)
            assert r.status_code == 200, r.text
            validate(r.json(), "CreateChatCompletionResponse")
            m = r.json()["choices"][0]["message"]
            assert m["content"] is None and m["tool_calls"], m
            for call in m["tool_calls"]:
                check_call(call, [TOOL_W, TOOL_T])
        body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
                "tools": [TOOL_W]}
        r = requests.post(s.url("/v1/chat/completions"), json=body, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice", r.text
        assert "--tool-call-parser" in r.json()["error"]["message"]
        r = requests.post(s.url("/v1/chat/completions"), json=dict(body, tool_choice="none"),
                          timeout=60)
        assert r.status_code == 200 and "tool_calls" not in r.json()["choices"][0]["message"]
    finally:
        s.stop()


# ---- 5. what an audit found (each case failed before its fix) ----

def obj(props, **kw):
    return dict({"type": "object", "properties": props, "required": list(props)}, **kw)


@pytest.mark.parametrize("schema,doc,complete", [
    # enum values are filtered by the type beside them
    (obj({"x": {"type": "string", "enum": ["a", 1]}}), b'{"x":1}', False),
    (obj({"x": {"type": "string", "enum": ["a", 1]}}), b'{"x":"a"}', True),
    (obj({"x": {"type": "integer", "enum": [1.5, 2]}}), b'{"x":2}', True),
    # an escaped key is not matched against the properties: refused, not taken as additional
    ({"type": "object", "properties": {"a": {"type": "integer"}}}, b'{"\\u0061":"s"}', False),
    # enum and const numbers in the exact form that reads back as the schema's number
    (obj({"x": {"const": 1.0000000000000002}}), b'{"x":1}', False),
    (obj({"x": {"const": 1.0000000000000002}}), b'{"x":1.0000000000000002}', True),
    (obj({"x": {"const": 0.30000000000000004}}), b'{"x":0.30000000000000004}', True),
    (obj({"x": {"enum": [1e-7, 2.5]}}), b'{"x":1e-07}', True),
])
def test_audit_verdicts(schema, doc, complete, tmp_path):
    assert schema_valid(schema, doc) == complete
    assert tool_schema(schema, [doc], tmp_path) == ["complete" if complete else "reject"]


EXPO = {"$defs": {"l0": {"enum": ["v%d" % i for i in range(64)]}}}
for _i in range(1, 5):
    EXPO["$defs"][f"l{_i}"] = {"type": "object", "properties": {
        f"p{k}": {"$ref": f"#/$defs/l{_i - 1}"} for k in range(64)}}
EXPO.update({"type": "object", "properties": {"a": {"$ref": "#/$defs/l4"}}})


@pytest.mark.parametrize("text,needle", [
    (json.dumps(obj({"x": {"type": "array", "minItems": 3, "const": [1]}})), "beside"),
    (json.dumps(obj({"x": {"type": "string", "enum": [1, 2]}})), "no 'enum' value"),
    ('{"type":"object","properties":{"x":{"const":9007199254740993}}}', "2^53"),
    ('{"type":"object","properties":{"x":{"enum":[1e400]}}}', "finite"),
    (json.dumps(obj({"p": {"$id": "http://e.com/s", "$defs": {"x": {"type": "string"}},
                           "$ref": "#/$defs/x"}}, **{"$defs": {"x": {"type": "integer"}}})),
     "$id"),
    (json.dumps(obj({"p": {"$ref": "#/$defs/a%20b"}}, **{"$defs": {"a b": {}}})), "paths"),
    (json.dumps(EXPO), "expands|in all"),  # a budget on nodes and on enum bytes
    ('{"type":"object","properties":{"a\\u0000b":{"type":"integer"}}}', "NUL"),
    (json.dumps(obj({"x" * 70000: {"type": "integer"}})), "limited"),
    ('{"type":"object","type":"object"}', "twice"),
    ('{"type":"object"} {}', "not valid JSON"),
])
def test_audit_refusals(text, needle, tmp_path):
    import time
    path = tmp_path / "schema.json"
    path.write_text(text)
    t0 = time.time()
    p = subprocess.run([str(TOOL), "schema", str(path)], input="", capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 3 and any(n in p.stdout for n in needle.split("|")), \
        (p.returncode, p.stdout, p.stderr)
    assert time.time() - t0 < 5  # the 15 KB exponential schema took 13-24 s and 800 MB


def test_audit_invalid_utf8_schema(tmp_path):
    path = tmp_path / "schema.json"
    path.write_bytes(b'{"type":"object","properties":{"a\xff":{"type":"integer"}}}')
    p = subprocess.run([str(TOOL), "schema", str(path)], input="", capture_output=True,
                       text=True, errors="replace", timeout=60)
    assert p.returncode == 3 and "UTF-8" in p.stdout, p.stdout


def test_audit_tool_call_arguments_keep_their_numbers(qwen_rnd):
    """A call's arguments are re-printed exactly (cJSON's printing would turn 0.30000000000000004
    into 0.3): a required call whose only argument is that const gives it back as written."""
    tool = {"type": "function", "function": {"name": "f", "parameters": obj(
        {"x": {"const": 0.30000000000000004}}, additionalProperties=False)}}
    r = chat_tools(qwen_rnd, [tool], "required")
    assert r.status_code == 200, r.text
    args = r.json()["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
    assert json.loads(args) == {"x": 0.30000000000000004}, args


def test_audit_tool_history_arguments_are_objects_to_the_template(qwen_rnd):
    """A past call's arguments come as a JSON string (OpenAI); the template gets the object, so
    the prompt is the same as with the object itself (before: the string, encoded again)."""
    def prompt_tokens(args):
        msgs = [{"role": "user", "content": "weather?"},
                {"role": "assistant", "content": None, "tool_calls": [{
                    "id": "c1", "type": "function",
                    "function": {"name": "weather", "arguments": args}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
        r = requests.post(qwen_rnd.url("/v1/chat/completions"), timeout=60, json={
            "messages": msgs, "tools": [TOOL_W], "max_tokens": 1})
        assert r.status_code == 200, r.text
        return r.json()["usage"]["prompt_tokens"]
    assert prompt_tokens('{"city": "Paris"}') == prompt_tokens({"city": "Paris"})


def test_audit_forced_call_arguments_are_objects(qwen_rnd):
    """parameters {} (or absent) means any object; a non-object schema is refused; a closer
    inside an argument's string does not cut the call."""
    for params in [{}, None]:
        f = {"name": "f"} if params is None else {"name": "f", "parameters": params}
        r = chat_tools(qwen_rnd, [{"type": "function", "function": f}], "required",
                       logit_bias={"376": 6, "29913": 6, "6525": 6})
        assert r.status_code == 200, r.text
        calls = r.json()["choices"][0]["message"].get("tool_calls")
        assert calls and isinstance(json.loads(calls[0]["function"]["arguments"]), dict), r.json()
    r = chat_tools(qwen_rnd, [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "integer"}}}], "required")
    assert r.status_code == 400 and "object schema" in r.json()["error"]["message"], r.text
    tool = {"type": "function", "function": {"name": "f", "parameters": obj(
        {"s": {"const": "a</tool_call>b"}}, additionalProperties=False)}}
    r = chat_tools(qwen_rnd, [tool], "required")
    call = r.json()["choices"][0]["message"]["tool_calls"][0]
    assert json.loads(call["function"]["arguments"]) == {"s": "a</tool_call>b"}


@pytest.mark.parametrize("extra,param,needle", [
    ({"tool_choice": "required", "stop": ["\n"]}, "stop", "required tool call"),
    ({"tools": [TOOL_W] * 2, "tool_choice": "required"}, "tool_choice", "same name"),
    ({"tools": [{"type": "function", "function": {"name": f"f{i}"}} for i in range(65)],
      "tool_choice": "required"}, "tool_choice", "64 tools"),
    ({"tools": [{"type": "function"}]}, "tools", "array of"),
    ({"tools": ["x", 1]}, "tools", "array of"),
    ({"tool_choice": {"type": "custom", "function": {"name": "weather"}}}, "tool_choice", "must"),
    ({"functions": [{"name": "f"}]}, "functions", "deprecated"),
    ({"parallel_tool_calls": "yes"}, "parallel_tool_calls", "boolean"),
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "t", "strict": "yes", "schema": {"type": "object"}}}}, "response_format",
     "strict"),
])
def test_audit_tool_refusals(qwen_rnd, extra, param, needle):
    body = dict({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
                 "tools": [TOOL_W]}, **extra)
    r = requests.post(qwen_rnd.url("/v1/chat/completions"), json=body, timeout=60)
    assert r.status_code == 400, r.text
    validate(r.json(), "ErrorResponse")
    assert r.json()["error"]["param"] == param and needle in r.json()["error"]["message"], r.text


def test_audit_root_id_is_an_annotation(rnd):
    r = post(rnd, "/v1/completions", {"prompt": "Hi", "max_tokens": 2, "response_format":
                                      schema_fmt({"$id": "http://e.com/s", "type": "object"})})
    assert r.status_code == 200, r.text


def test_llama3_json_required_calls(llama3_rnd):
    """With Llama 3.1's template the calls are {"name", "parameters"} with no tags: a forced call
    comes back as a tool call (arguments from "parameters"), streamed the same; one of several
    tools holds its own parameters."""
    for tools, choice in [([TOOL_W], "required"), ([TOOL_W, TOOL_T], "required"),
                          ([TOOL_W, TOOL_T], {"type": "function", "function": {"name": "time"}})]:
        r = chat_tools(llama3_rnd, tools, choice)
        assert r.status_code == 200, r.text
        validate(r.json(), "CreateChatCompletionResponse")
        c = r.json()["choices"][0]
        # vLLM's (and OpenAI's) finish_reason: "stop" for a named function's call
        fin = "stop" if isinstance(choice, dict) else "tool_calls"
        assert c["finish_reason"] == fin and c["message"]["content"] is None, c
        call = c["message"]["tool_calls"][0]
        check_call(call, tools)
        if isinstance(choice, dict):
            assert call["function"]["name"] == "time"
        s = chat_tools(llama3_rnd, tools, choice, stream=True)
        events = [e for e in sse_events(s.iter_lines()) if e != "[DONE]"]
        calls = [tc for e in events for tc in e["choices"][0]["delta"].get("tool_calls") or []]
        assert [(x["function"]["name"], json.loads(x["function"]["arguments"])) for x in calls] \
            == [(call["function"]["name"], json.loads(call["function"]["arguments"]))]
        assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events) == ""


def test_llama3_json_text_answer_is_content(llama3_rnd):
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 12,
            "temperature": 0}
    plain = requests.post(llama3_rnd.url("/v1/chat/completions"), json=body, timeout=60).json()
    r = requests.post(llama3_rnd.url("/v1/chat/completions"), json=dict(body, tools=[TOOL_W]),
                      timeout=60).json()
    m = r["choices"][0]["message"]
    assert "tool_calls" not in m and m["content"] and not m["content"].lstrip().startswith("{")
    s = requests.post(llama3_rnd.url("/v1/chat/completions"), timeout=60, stream=True,
                      json=dict(body, tools=[TOOL_W], stream=True))
    events = [e for e in sse_events(s.iter_lines()) if e != "[DONE]"]
    assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events) == m["content"]
    assert plain["choices"][0]["finish_reason"] == r["choices"][0]["finish_reason"]
