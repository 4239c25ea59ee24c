"""`pagoda render-template` against Python's jinja2 with Hugging Face's settings.

Every template in tests/data/chat-templates/ and SmolLM2's own (from its GGUF) is rendered over a
set of conversations, with add_generation_prompt true and false, by pagoda and by jinja2 the way
transformers' apply_chat_template does it (ImmutableSandboxedEnvironment(trim_blocks=True,
lstrip_blocks=True) with loopcontrols, its json.dumps-based tojson, raise_exception, strftime_now;
variables messages, tools=None, documents=None, add_generation_prompt, bos_token, eos_token).
The texts must be equal; where jinja2 raises, pagoda must fail too (with raise_exception's exact
message), and it must never crash. Random mutations of every template must never crash either.
"""
import copy
import datetime
import functools
import json
import random

import pytest

import util

TEMPLATE_DIR = util.DATA / "chat-templates"
TEMPLATES = sorted(TEMPLATE_DIR.glob("*.jinja"))
FIXED_NOW = datetime.datetime(2024, 7, 26, 10, 30, 0)  # what strftime_now() sees on both sides
DATE_ARG = "2024-07-26T10:30:00"
BOS, EOS = "<s>", "</s>"

jinja2 = pytest.importorskip("jinja2")


def _compile(src):
    """The template compiled exactly as transformers compiles it (its own function when
    transformers is installed, else the same environment built here)."""
    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template

        return _compile_jinja_template(src)
    except ImportError:
        pass
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    return env.from_string(src)


def reference(src, messages, tools, add_gen, bos, eos, extra=None):
    """('ok', text) | ('raise', raise_exception's message) | ('error', description)."""
    try:
        tmpl = _compile(src)
    except jinja2.TemplateError as e:
        return ("error", f"{type(e).__name__}: {e}")
    kwargs = dict(extra or {})
    kwargs.update(messages=copy.deepcopy(messages), tools=copy.deepcopy(tools), documents=None,
                  add_generation_prompt=add_gen,
                  strftime_now=lambda fmt: FIXED_NOW.strftime(fmt))
    if bos is not None:
        kwargs["bos_token"] = bos
    if eos is not None:
        kwargs["eos_token"] = eos
    try:
        return ("ok", tmpl.render(**kwargs))
    except jinja2.TemplateError as e:
        if type(e) is jinja2.exceptions.TemplateError:  # raise_exception raises exactly this
            return ("raise", str(e))
        return ("error", f"{type(e).__name__}: {e}")
    except Exception as e:  # TypeError, ValueError ... from Python operations in the template
        return ("error", f"{type(e).__name__}: {e}")


def run_render(tmp_path, messages, tools=None, add_gen=False, template=None, model=None,
               bos=BOS, eos=EOS, extra=None, timeout=60):
    mfile = tmp_path / "messages.json"
    mfile.write_text(json.dumps(messages, ensure_ascii=False), encoding="utf-8")
    args = ["render-template", "--messages", mfile, "--date", DATE_ARG]
    args += ["-m", model] if model else ["--template", template]
    if tools is not None:
        tfile = tmp_path / "tools.json"
        tfile.write_text(json.dumps(tools, ensure_ascii=False), encoding="utf-8")
        args += ["--tools", tfile]
    if extra:
        vfile = tmp_path / "vars.json"
        vfile.write_text(json.dumps(extra, ensure_ascii=False), encoding="utf-8")
        args += ["--vars", vfile]
    if add_gen:
        args.append("--add-generation-prompt")
    if bos is not None:
        args += ["--bos-token", bos]
    if eos is not None:
        args += ["--eos-token", eos]
    return util.run_pagoda(*args, check=False, timeout=timeout)


def check_same(ref, p):
    """pagoda's result p matches jinja2's ref."""
    stderr = p.stderr.decode("utf-8", errors="replace")
    assert p.returncode in (0, 1), f"pagoda crashed or misbehaved: rc={p.returncode} {stderr}"
    kind, val = ref
    if kind == "ok":
        assert p.returncode == 0, f"jinja2 rendered but pagoda failed: {stderr}"
        got = p.stdout.decode("utf-8")
        assert got == val, f"\n--- jinja2 ---\n{val!r}\n--- pagoda ---\n{got!r}"
    else:
        assert p.returncode == 1, f"jinja2 failed ({val}) but pagoda rendered {p.stdout!r}"
        assert stderr.count("\n") == 1 and stderr.endswith("\n"), f"not one line: {stderr!r}"
        if kind == "raise":
            assert stderr == f"pagoda render-template: {val}\n"


# ------------------------------------------------------------------------ conversations ----

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name, e.g. \"Paris\""},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "add",
        "description": "Add two numbers — exactly",
        "parameters": {"type": "object", "properties": {
            "a": {"type": "number", "minimum": -0.5}, "b": {"type": "integer"}},
            "required": ["a", "b"]},
        "return": {"type": "number"}}},
]

SYS = {"role": "system", "content": "You are a helpful assistant."}
U1 = {"role": "user", "content": "Hello!"}
A1 = {"role": "assistant", "content": "Hi! How can I help?"}
U2 = {"role": "user", "content": "What is 2+2?"}
A2 = {"role": "assistant", "content": "4"}

EDGE = ("Line one\nLine two\r\n\ttabbed \"double\" 'single' \\back\\slash\\n "
        "{{ not_a_var }} {% if x %} {# c #} — ünïcödé 日本語 😀  ")


def _tool_call(args):
    return {"id": "call12345", "type": "function",
            "function": {"name": "get_weather", "arguments": args}}


CONVERSATIONS = {
    "user": ([U1], None, None),
    "system_user": ([SYS, U1], None, None),
    "multi_turn": ([U1, A1, U2], None, None),
    "system_multi_turn": ([SYS, U1, A1, U2, A2, {"role": "user", "content": "Thanks"}], None, None),
    "assistant_last": ([SYS, U1, A1], None, None),
    "edge_content": ([{"role": "system", "content": "  " + EDGE + "\n"},
                      {"role": "user", "content": EDGE},
                      {"role": "assistant", "content": "\n" + EDGE},
                      {"role": "user", "content": "\n\n  padded  \n"}], None, None),
    "thinking": ([U1, {"role": "assistant", "content": "<think>Greet back.</think>Hello there."},
                  U2], None, None),
    "no_think_system": ([{"role": "system", "content": "Be brief. /no_think"}, U1], None, None),
    "empty_content": ([{"role": "system", "content": ""}, {"role": "user", "content": ""}], None,
                      None),
    "tools_plain": ([SYS, {"role": "user", "content": "Weather in Paris?"}], TOOLS, None),
    "tools_no_system": ([{"role": "user", "content": "Add 1 and 2"}], TOOLS, None),
    "tool_call_dict_args": ([
        SYS, {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None,
         "tool_calls": [_tool_call({"city": "Paris", "unit": "celsius"})]},
        {"role": "tool", "tool_call_id": "call12345", "name": "get_weather",
         "content": "{\"temperature\": 21.5}"},
        {"role": "assistant", "content": "It is 21.5 °C in Paris."},
        {"role": "user", "content": "Thanks!"}], TOOLS, None),
    "tool_call_string_args": ([
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None,
         "tool_calls": [_tool_call("{\"city\": \"Paris\"}")]},
        {"role": "tool", "tool_call_id": "call12345", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call12345", "content": "21 degrees"}], TOOLS, None),
    "tool_content_mapping": ([
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": [_tool_call({"city": "Oslo"})]},
        {"role": "tool", "tool_call_id": "call12345", "content": {"temp": -3, "sky": "clear"}}],
        None, None),
    "consecutive_users": ([U1, U2], None, None),
    "starts_with_assistant": ([A1, U1], None, None),
    "system_only": ([SYS], None, None),
    "empty": ([], None, None),
    "vars_no_thinking": ([SYS, U1, A1, U2], None, {"enable_thinking": False}),
    "vars_llama_options": ([SYS, U1], TOOLS, {"date_string": "01 Jan 2025",
                                               "tools_in_user_message": False,
                                               "builtin_tools": ["brave_search", "wolfram_alpha"]}),
    "vars_builtin_tool_call": ([
        {"role": "user", "content": "Search"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"type": "function", "function": {"name": "brave_search",
                                              "arguments": {"query": "pagoda"}}}]},
        {"role": "ipython", "content": "results"}], None, {"builtin_tools": ["brave_search"]}),
    "long": ([SYS] + [m for i in range(20) for m in (
        {"role": "user", "content": f"Question {i}: what is {i} squared?"},
        {"role": "assistant", "content": f"{i} squared is {i * i}."})]
        + [{"role": "user", "content": "Done."}], None, None),
}

CASES = [(t, c, g) for t in TEMPLATES for c in CONVERSATIONS for g in (False, True)]


@pytest.mark.parametrize("template,conv,add_gen", CASES,
                         ids=[f"{t.stem}-{c}-{'gen' if g else 'nogen'}" for t, c, g in CASES])
def test_template_matches_jinja2(pagoda_bin, tmp_path, template, conv, add_gen):
    messages, tools, extra = CONVERSATIONS[conv]
    src = template.read_text(encoding="utf-8")
    ref = reference(src, messages, tools, add_gen, BOS, EOS, extra)
    p = run_render(tmp_path, messages, tools, add_gen, template=template, extra=extra)
    check_same(ref, p)


@functools.lru_cache(maxsize=None)
def _gguf_template_and_tokens(path):
    gguf = pytest.importorskip("gguf")
    r = gguf.GGUFReader(str(path))

    def field(name):
        f = r.fields[name]
        return f.parts[f.data[0]]

    tmpl = bytes(field("tokenizer.chat_template")).decode("utf-8")
    tokens = r.fields["tokenizer.ggml.tokens"]

    def token(key):
        i = int(field(key)[0])
        return bytes(tokens.parts[tokens.data[i]]).decode("utf-8")

    return tmpl, token("tokenizer.ggml.bos_token_id"), token("tokenizer.ggml.eos_token_id")


@pytest.mark.parametrize("conv", list(CONVERSATIONS))
@pytest.mark.parametrize("add_gen", [False, True])
def test_smollm2_own_template(pagoda_bin, default_model, tmp_path, conv, add_gen):
    messages, tools, extra = CONVERSATIONS[conv]
    src, bos, eos = _gguf_template_and_tokens(default_model)
    assert bos == "<|im_start|>" and eos == "<|im_end|>"
    ref = reference(src, messages, tools, add_gen, bos, eos, extra)
    p = run_render(tmp_path, messages, tools, add_gen, model=default_model, bos=None, eos=None,
                   extra=extra)
    check_same(ref, p)


def test_raise_exception_message(pagoda_bin, tmp_path):
    gemma = TEMPLATE_DIR / "google-gemma-2-2b-it.jinja"
    p = run_render(tmp_path, [U1, U2], template=gemma)
    assert p.returncode == 1
    assert p.stderr.decode() == ("pagoda render-template: Conversation roles must alternate "
                                 "user/assistant/user/assistant/...\n")


def test_messages_object_with_tools(pagoda_bin, tmp_path):
    """--messages may hold {"messages": [...], "tools": [...]}."""
    qwen = TEMPLATE_DIR / "Qwen-Qwen2.5-7B-Instruct.jinja"
    messages = [SYS, U1]
    p = run_render(tmp_path, {"messages": messages, "tools": TOOLS}, template=qwen)
    check_same(reference(qwen.read_text(), messages, TOOLS, False, BOS, EOS), p)


# --------------------------------------------------------------------- feature cases ----
# Small templates over the Jinja subset (statements, expressions, filters, tests, methods, and
# errors). tests/unit/test_jinja.c holds their jinja2 outputs, frozen; here they are checked live.
FEATURE_CTX = {"xs": [3, 1, 2], "d": {"b": 2, "a": 1, "c": [1, "x"]}, "s": "  Hello, World  ", "n": None,
       "msgs": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"},
                {"role": "user", "content": "bye"}],
       "t": True, "f": 2.5, "u8": "héllo wörld ÅÉ", "e": ""}
FEATURE_CASES = [
    # literals, output, whitespace control
    ("{{ 'a\\tb\\n' }}|{{ \"q'\" }}|{{ 'x' 'y' }}", {}),
    ("{{ 42 }} {{ -7 }} {{ 1_000 }} {{ 0x1F }} {{ 0o17 }} {{ 0b101 }}", {}),
    ("{{ 2.5 }} {{ 1e3 }} {{ 1.5e-7 }} {{ 3.0 }} {{ 1e16 }} {{ 0.1 + 0.2 }} {{ 1/3 }} {{ 2**0.5 }}", {}),
    ("{{ true }} {{ false }} {{ none }} {{ True }} {{ None }}", {}),
    ("{{ [1, 'a', none, true, 2.0] }} {{ (1,) }} {{ (1, 'b') }} {{ {'k': 'v', 'n': [1]} }}", {}),
    ("{{ ['it\\'s', 'say \"hi\"', 'both \\' \"', 'tab\\t', 'nl\\n', 'back\\\\'] }}", {}),
    ("a  {{- ' b ' -}}  c\n  {%- if true %} d {% endif -%}  \n e", {}),
    ("  {% if true %}\n    x\n  {% endif %}\n  y\n", {}),
    ("{% if true %}a{% endif %}\nb\n{# c #}\nd  {#- e -#}  f", {}),
    ("{% raw %}{{ not }} {% if %}{% endraw %}|{%- raw -%}  x  {%- endraw -%}|", {}),
    ("line1\r\nline2\rline3\n\n", {}),
    ("{{ xs }}{{ xs|length }}{{ d }}{{ n }}{{ undefined_var }}|{{ e }}|", FEATURE_CTX),
    ("  {%+ if true %}plus{% endif %}\n{% if true +%}\nkeep{% endif %}", {}),
    # arithmetic and operators
    ("{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7.5 % 2 }} {{ 2 ** 10 }} {{ 7 / 2 }} {{ 6 / 3 }}", {}),
    ("{{ 1 + 2 * 3 - 4 }} {{ (1 + 2) * 3 }} {{ 2 ** 3 ** 2 }} {{ -2 ** 2 }} {{ 10 - -3 }}", {}),
    ("{{ 'ab' ~ 1 ~ none ~ true ~ [1] }} {{ 'ab' + 'cd' }} {{ 'ab' * 3 }} {{ [1] + [2, 3] }} {{ [0] * 3 }}", {}),
    ("{{ 1 < 2 < 3 }} {{ 1 < 3 < 2 }} {{ 'a' < 'b' }} {{ 1 == 1.0 }} {{ 1 == true }} {{ [1,2] == [1,2] }} {{ 'a' != 'b' }}", {}),
    ("{{ 'ell' in 'hello' }} {{ 2 in xs }} {{ 'a' in d }} {{ 'z' not in d }} {{ not 1 in xs }}", FEATURE_CTX),
    ("{{ 1 and 'x' }} {{ 0 and 'x' }} {{ 0 or 'y' }} {{ '' or none }} {{ not 0 }} {{ not xs }}", FEATURE_CTX),
    ("{{ 'y' if t else 'n' }} {{ 'y' if n else 'n' }} [{{ 'y' if n }}]", FEATURE_CTX),
    # access
    ("{{ d.a }} {{ d['b'] }} {{ d.c[1] }} {{ d.c.0 }} {{ d.zz }} {{ xs[-1] }} {{ xs[5] }} {{ msgs[0].role }}", FEATURE_CTX),
    ("{{ xs[1:] }} {{ xs[:-1] }} {{ xs[::-1] }} {{ xs[::2] }} {{ 'abcdef'[1:4] }} {{ 'abcdef'[::-2] }} {{ u8[1:4] }} {{ u8[-3:] }}", FEATURE_CTX),
    ("{{ n.foo }}|{{ (n.foo) is defined }}|{{ 'str'.foo is defined }}|{{ xs.foo }}", FEATURE_CTX),
    # tests
    ("{{ x is defined }} {{ xs is defined }} {{ n is none }} {{ n is not none }} {{ xs is undefined }}", FEATURE_CTX),
    ("{{ s is string }} {{ xs is string }} {{ d is mapping }} {{ xs is mapping }} {{ xs is iterable }} {{ s is iterable }} {{ 3 is iterable }} {{ nope is iterable }}", FEATURE_CTX),
    ("{{ 3 is number }} {{ 3.5 is float }} {{ 3 is integer }} {{ true is boolean }} {{ true is number }} {{ xs is sequence }} {{ d is sequence }}", FEATURE_CTX),
    ("{{ 4 is even }} {{ 3 is odd }} {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(4) }} {{ 'a' is equalto 'a' }} {{ 2 is gt 1 }} {{ 'ab' is lower }} {{ 'AB' is upper }} {{ 1 is in xs }}", FEATURE_CTX),
    ("{{ true is true }} {{ 1 is true }} {{ false is false }} {{ n is sameas none }} {{ range is callable }} {{ d is callable }}", FEATURE_CTX),
    # filters
    ("{{ s|trim }}|{{ s|trim|length }}|{{ 'xxhixx'|trim('x') }}|{{ s|upper }}|{{ s|lower }}|{{ 'hello world-foo (bar)'|title }}|{{ 'hELLO'|capitalize }}", FEATURE_CTX),
    ("{{ xs|join(', ') }} {{ xs|join }} {{ msgs|map(attribute='role')|join('/') }} {{ xs|map('string')|list }} {{ xs|first }} {{ xs|last }} {{ s|first }}", FEATURE_CTX),
    ("{{ xs|sort }} {{ xs|sort(reverse=true) }} {{ ['b','A','c']|sort }} {{ ['b','A','c']|sort(case_sensitive=true) }} {{ msgs|sort(attribute='content')|map(attribute='content')|list }}", FEATURE_CTX),
    ("{{ xs|min }} {{ xs|max }} {{ xs|sum }} {{ [1.5, 2]|sum }} {{ xs|reverse|list }} {{ 'abc'|reverse }} {{ [1,2,1,3]|unique|list }} {{ ['a','A','b']|unique|list }}", FEATURE_CTX),
    ("{{ d|items|list }} {{ d|dictsort }} {{ d|list }} {{ d|length }} {{ 'héllo'|length }} {{ nope|length }} {{ nope|list }}", FEATURE_CTX),
    ("{{ nope|default('dflt') }} {{ e|default('dflt') }} {{ e|default('dflt', true) }} {{ n|d('x') }} {{ 0|default(5, boolean=true) }}", FEATURE_CTX),
    ("{{ '42'|int }} {{ ' 7 '|int }} {{ '3.9'|int }} {{ 'x'|int }} {{ 'x'|int(-1) }} {{ 3.99|int }} {{ '0x1A'|int(0, 16) }} {{ '2.5'|float }} {{ 'a'|float }} {{ 3|float }}", {}),
    ("{{ 5|string ~ 'x' }} {{ [1]|string }} {{ none|string }} {{ 'a<b>&\"c\\''|e }} {{ 'x'|safe }} {{ -3|abs }} {{ 2.567|round(2) }} {{ 2.5|round }} {{ 3.5|round }} {{ 2.1|round(0, 'ceil') }}", {}),
    ("{{ 'a-b-c'|replace('-', '+') }} {{ 'aaa'|replace('a', 'b', 2) }} {{ 'hi'|center(8) }}| {{ 'a b  c'|wordcount }} {{ '%s=%d'|format('x', 3) }} {{ 'x'|format }}", {}),
    ("{{ msgs|selectattr('role', 'equalto', 'user')|list|length }} {{ msgs|rejectattr('role', 'equalto', 'user')|map(attribute='content')|list }} {{ [0,1,2,'',none]|select|list }} {{ xs|select('odd')|list }} {{ xs|reject('gt', 1)|list }}", FEATURE_CTX),
    ("{{ msgs|selectattr('role')|list|length }} {{ msgs|map(attribute='missing', default='?')|list }} {{ ['a','b']|map('upper')|join }}", FEATURE_CTX),
    ("{{ 'a\\nb\\n\\nc'|indent }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'a\\n\\nb'|indent(width='>', blank=true) }}", {}),
    ("{{ 'The quick brown fox jumps'|truncate(12) }}|{{ 'The quick brown fox jumps'|truncate(12, true) }}|{{ 'short'|truncate(12) }}", {}),
    # tojson
    ("{{ d|tojson }} {{ xs|tojson }} {{ 'a\"b\\\\c\\n\\t\\u0001é😀'|tojson }} {{ none|tojson }} {{ true|tojson }} {{ 2.50|tojson }}", FEATURE_CTX),
    ("{{ d|tojson(indent=2) }}\n{{ [] |tojson(indent=2) }}{{ {}|tojson(indent=4) }}{{ [[1,[]],{}]|tojson(indent=1) }}", FEATURE_CTX),
    ("{{ d|tojson(sort_keys=true) }} {{ d|tojson(separators=(',', ':')) }} {{ {1: 'a', 2.5: 'b', true: 'c', none: 'd'}|tojson }}", FEATURE_CTX),
    ("{{ msgs|tojson }} {{ 1e20|tojson }} {{ -0.0|tojson }} {{ 1e-7|tojson }} {{ 123456789012|tojson }}", FEATURE_CTX),
    # string methods
    ("{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ 'xxaxx'.strip('x') }}|{{ '\\n\\nab\\n'.lstrip('\\n') }}|{{ 'ab  \\n'.rstrip() }}", FEATURE_CTX),
    ("{{ 'a,b,,c'.split(',') }} {{ ' a  b c '.split() }} {{ 'a,b,c'.split(',', 1) }} {{ 'a,b,c'.rsplit(',', 1) }} {{ 'x</think>y</think>z'.split('</think>')[-1] }} {{ ' a b '.rsplit() }}", {}),
    ("{{ s.startswith('  He') }} {{ s.endswith('d  ') }} {{ 'abc'.startswith(('x', 'a')) }} {{ 'Hello'.upper() }} {{ 'Hello'.lower() }} {{ 'hello wORLD'.title() }} {{ 'hELLO'.capitalize() }}", FEATURE_CTX),
    ("{{ 'a-b-c'.replace('-', '') }} {{ 'aaa'.replace('a', 'b', 1) }} {{ 'abcabc'.find('c') }} {{ 'abc'.find('z') }} {{ 'abcabc'.count('bc') }} {{ ', '.join(['a', 'b']) }} {{ 'l1\\nl2\\r\\nl3'.splitlines() }}", {}),
    ("{{ '{} and {}'.format('x', 1) }} {{ '{0}{1}{0}'.format('a', 'b') }} {{ '{name}!'.format(name='Bob') }} {{ 'abc'.removeprefix('a') }} {{ 'abc'.removesuffix('c') }} {{ '12'.isdigit() }} {{ 'a1'.isalnum() }} {{ '7'.zfill(3) }}", {}),
    ("{{ u8.upper() }} {{ u8|upper }} {{ u8.title() }} {{ 'ÅÉÎ'.lower() }} {{ u8|length }} {{ u8[1] }} {{ u8.find('w') }}", FEATURE_CTX),
    # dict methods
    ("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %} {{ d.keys()|list }} {{ d.values()|list }} {{ d.get('a') }} {{ d.get('z') }} {{ d.get('z', 9) }}", FEATURE_CTX),
    # statements
    ("{% if n %}a{% elif xs|length > 5 %}b{% elif t %}c{% else %}d{% endif %}", FEATURE_CTX),
    ("{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}:{{ x }} {% endfor %}", FEATURE_CTX),
    ("{% for x in xs %}{{ loop.previtem }}-{{ loop.nextitem }} {{ loop.cycle('odd', 'even') }}|{% endfor %}", FEATURE_CTX),
    ("{% for x in [] %}a{% else %}empty{% endfor %} {% for x in xs if x > 1 %}{{ x }}{{ loop.length }}{% else %}none{% endfor %}", FEATURE_CTX),
    ("{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }}{% endfor %} {% for (a, b) in d|dictsort %}{{ a }}{% endfor %} {% for c in 'héy' %}[{{ c }}]{% endfor %}", FEATURE_CTX),
    ("{% for x in xs %}{% if x == 1 %}{% continue %}{% endif %}{% if x == 2 %}{% break %}{% endif %}{{ x }}{% endfor %}", FEATURE_CTX),
    ("{% for i in range(3) %}{% for j in range(i) %}{{ i }}{{ j }}{{ loop.index }}{% endfor %}{{ loop.index }},{% endfor %}", {}),
    ("{{ range(5)|list }} {{ range(2, 5)|list }} {{ range(10, 0, -3)|list }} {{ range(0)|list }}", {}),
    ("{% set x = 1 %}{% set y, z = 2, 3 %}{{ x + y + z }}{% for i in xs %}{% set x = i %}{% endfor %}{{ x }}", FEATURE_CTX),
    ("{% set ns = namespace(total=0, found=false) %}{% for x in xs %}{% set ns.total = ns.total + x %}{% if x == 1 %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.total }} {{ ns.found }}", FEATURE_CTX),
    ("{% set ns = namespace() %}{% set ns.a = 'v' %}{{ ns.a }}{% set msgs2 = msgs[1:] %}{{ msgs2|length }}{{ msgs|length }}", FEATURE_CTX),
    ("{% set block %}inner {{ 1 + 1 }}{% endset %}[{{ block }}]{% set s = s|trim %}{{ s }}", FEATURE_CTX),
    ("{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('A') }} {{ greet('B', '?') }} {{ greet(punct='.', name='C') }}", {}),
    ("{% macro rec(n) %}{% if n > 0 %}{{ n }}{{ rec(n - 1) }}{% endif %}{% endmacro %}{{ rec(4) }}", {}),
    ("{% macro show(m) %}{{ m.role|upper }}:{{ m['content'] }}{% endmacro %}{% for m in msgs %}{{ show(m) }} {% endfor %}", FEATURE_CTX),
    ("{% filter upper %}hello {{ 'x' }}{% endfilter %} {% with a = 1, b = 2 %}{{ a + b }}{% endwith %}{{ a }}", {}),
    ("{{ strftime_now('%Y-%m-%d %d %b %Y %H:%M') }}", {}),
    ("{{ dict(a=1, b='x') }} {{ namespace(a=1).a }}", {}),
    ("{% generation %}gen {{ 1 }}{% endgeneration %}", {}),
    ("{% for m in msgs %}{% if loop.index0 % 2 == 0 %}{{ m.content }}{% endif %}{% endfor %}", FEATURE_CTX),
    ("{%- for m in msgs -%}\n  {{- m.role -}}\n  {%- if not loop.last %},{% endif -%}\n{%- endfor %}\n", FEATURE_CTX),
    ("{{ '%s is %d years' % ('Al', 30) }} {{ '%05.1f|%-4s|%x' % (3.14159, 'ab', 255) }} {{ '%(a)s' % {'a': 1} }}", {}),
    # errors (expected: jinja2's exception)
    ("{{ raise_exception('Custom error: ' ~ 2) }}", {}),
    ("{% for m in msgs %}{% if m.role == 'assistant' %}{{ raise_exception('no assistants') }}{% endif %}{% endfor %}", FEATURE_CTX),
    ("{{ 'a' + 1 }}", {}),
    ("{{ nope.attr }}", {}),
    ("{{ nope() }}", {}),
    ("{{ 1 / 0 }}", {}),
    ("{% for a, b in [[1, 2, 3]] %}{% endfor %}", {}),
    ("{{ d|tojson(indent=2, sort_keys=true) }} {{ xs[::0] }}", FEATURE_CTX),
    ("{{ 'a' < 1 }}", {}),
    ("{% if x %}unclosed", {}),
    ("{{ x |unknownfilter }}", {}),
    ("{% if false %}{{ x|unknownfilter }}{% endif %}ok", {}),
    ("{{ 1 + }}", {}),
    ("{% endfor %}", {}),
    ("{% include 'x' %}", {}),
    ("{{ [].append(1) }}", {}),
]


@pytest.mark.parametrize("src,ctx", FEATURE_CASES, ids=[f"f{i:02d}" for i in range(len(FEATURE_CASES))])
def test_feature_matches_jinja2(pagoda_bin, tmp_path, src, ctx):
    tfile = tmp_path / "t.jinja"
    tfile.write_text(src, encoding="utf-8")
    ref = reference(src, [], None, False, None, None, ctx)
    p = run_render(tmp_path, [], template=tfile, bos=None, eos=None, extra=ctx)
    check_same(ref, p)


# ----------------------------------------------------------------------------- fuzzing ----

SNIPPETS = ["{%", "%}", "{{", "}}", "{#", "#}", "-", "+", "(", ")", "[", "]", "{", "}", "'", '"',
            "|", ".", ",", ":", "=", "==", "~", "*", "**", "//", "\\", "\n", " ", "%", "#",
            "if", "endif", "for", "endfor", "else", "elif", "set", "macro", "endmacro", "in",
            "not", "is", "loop", "raw", "endraw", "namespace(", "|tojson", "[::-1]", "0", "9e9",
            "range(99999999)", "messages", "{% for x in range(3000) %}", "{% endfor %}"]


def mutate(src, rng):
    s = src
    for _ in range(rng.randint(1, 4)):
        op = rng.random()
        i = rng.randrange(len(s) + 1)
        if op < 0.25:
            s = s[:i]  # truncation
        elif op < 0.5:
            j = min(len(s), i + rng.randint(1, 40))
            s = s[:i] + s[j:]  # deletion
        elif op < 0.8:
            s = s[:i] + rng.choice(SNIPPETS) + s[i:]  # insertion
        else:
            j = min(len(s), i + rng.randint(1, 200))
            s = s[:i] + s[i:j] * rng.randint(2, 5) + s[j:]  # duplication
    return s


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # jinja2 on mutated string escapes
@pytest.mark.parametrize("template", TEMPLATES, ids=[t.stem for t in TEMPLATES])
def test_mutated_templates_never_crash(pagoda_bin, tmp_path, template):
    """Random truncations and mutations: pagoda renders or fails with a one-line error, and
    whenever both it and jinja2 render, the texts are equal."""
    rng = random.Random(template.stem)
    src = template.read_text(encoding="utf-8")
    messages, tools, _ = CONVERSATIONS["tool_call_dict_args"]
    tfile = tmp_path / "mutated.jinja"
    n_both = 0
    for k in range(60):
        mutated = mutate(src, rng)
        tfile.write_text(mutated, encoding="utf-8")
        p = run_render(tmp_path, messages, tools, bool(k & 1), template=tfile, timeout=30)
        stderr = p.stderr.decode("utf-8", errors="replace")
        assert p.returncode in (0, 1), f"mutation {k} crashed (rc={p.returncode}): {stderr}"
        if p.returncode == 1:
            assert stderr.count("\n") == 1, f"mutation {k}: not one line: {stderr!r}"
        ref = reference(mutated, messages, tools, bool(k & 1), BOS, EOS)
        if ref[0] == "ok" and p.returncode == 0:
            assert p.stdout.decode("utf-8") == ref[1], f"mutation {k} renders differently"
            n_both += 1
