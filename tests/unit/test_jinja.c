/* Tests of the Jinja interpreter (src/api/jinja.c): feature cases whose expected output jinja2
 * produced, the error and limit contract of the API, concurrent rendering of one parsed template,
 * and random mutations of the real chat templates (run under -DPAGODA_SANITIZE=ON too).
 *
 * The table below was generated once by rendering each case with jinja2 3.1.6 the way
 * transformers compiles chat templates (ImmutableSandboxedEnvironment(trim_blocks=True,
 * lstrip_blocks=True), loopcontrols, json.dumps tojson, raise_exception, strftime_now at
 * 2024-07-26 10:30 local time). The same cases live in FEATURE_CASES of
 * tests/integration/test_chat_templates.py, which compares them with jinja2 live. */
#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api/jinja.h"
#include "test.h"

enum { J_OK, J_RAISE, J_ERROR };

struct jcase {
    const char *tmpl;
    const char *ctx; /* JSON or NULL */
    int kind;
    const char *expect; /* J_OK: the text; J_RAISE: raise_exception's message */
};

#define CTX "ctx"
static const struct jcase cases[] = {
    {"{{ 'a\\tb\\n' }}|{{ \"q'\" }}|{{ 'x' 'y' }}", NULL, J_OK, "a\tb\n|q'|xy"},
    {"{{ 42 }} {{ -7 }} {{ 1_000 }} {{ 0x1F }} {{ 0o17 }} {{ 0b101 }}", NULL, J_OK,
     "42 -7 1000 31 15 5"},
    {"{{ 2.5 }} {{ 1e3 }} {{ 1.5e-7 }} {{ 3.0 }} {{ 1e16 }} {{ 0.1 + 0.2 }} {{ 1/3 }} {{ 2**0.5 }}",
     NULL, J_OK,
     "2.5 1000.0 1.5e-07 3.0 1e+16 0.30000000000000004 0.3333333333333333 1.4142135623730951"},
    {"{{ true }} {{ false }} {{ none }} {{ True }} {{ None }}", NULL, J_OK,
     "True False None True None"},
    {"{{ [1, 'a', none, true, 2.0] }} {{ (1,) }} {{ (1, 'b') }} {{ {'k': 'v', 'n': [1]} }}", NULL,
     J_OK, "[1, 'a', None, True, 2.0] (1,) (1, 'b') {'k': 'v', 'n': [1]}"},
    {"{{ ['it\\'s', 'say \"hi\"', 'both \\' \"', 'tab\\t', 'nl\\n', 'back\\\\'] }}", NULL, J_OK,
     "[\"it's\", 'say \"hi\"', 'both \\' \"', 'tab\\t', 'nl\\n', 'back\\\\']"},
    {"a  {{- ' b ' -}}  c\n  {%- if true %} d {% endif -%}  \n e", NULL, J_OK, "a b c d e"},
    {"  {% if true %}\n    x\n  {% endif %}\n  y\n", NULL, J_OK, "    x\n  y"},
    {"{% if true %}a{% endif %}\nb\n{# c #}\nd  {#- e -#}  f", NULL, J_OK, "ab\ndf"},
    {"{% raw %}{{ not }} {% if %}{% endraw %}|{%- raw -%}  x  {%- endraw -%}|", NULL, J_OK,
     "{{ not }} {% if %}|x|"},
    {"line1\r\nline2\rline3\n\n", NULL, J_OK, "line1\nline2\nline3\n"},
    {"{{ xs }}{{ xs|length }}{{ d }}{{ n }}{{ undefined_var }}|{{ e }}|", CTX, J_OK,
     "[3, 1, 2]3{'b': 2, 'a': 1, 'c': [1, 'x']}None||"},
    {"  {%+ if true %}plus{% endif %}\n{% if true +%}\nkeep{% endif %}", NULL, J_OK,
     "  plus\nkeep"},
    {"{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7.5 % 2 }} {{ 2 ** 10 }} {{ 7 / 2 }} "
     "{{ 6 / 3 }}",
     NULL, J_OK, "3 -4 1 2 1.5 1024 3.5 2.0"},
    {"{{ 1 + 2 * 3 - 4 }} {{ (1 + 2) * 3 }} {{ 2 ** 3 ** 2 }} {{ -2 ** 2 }} {{ 10 - -3 }}", NULL,
     J_OK, "3 9 64 4 13"},
    {"{{ 'ab' ~ 1 ~ none ~ true ~ [1] }} {{ 'ab' + 'cd' }} {{ 'ab' * 3 }} {{ [1] + [2, 3] }} {{ "
     "[0] * 3 }}",
     NULL, J_OK, "ab1NoneTrue[1] abcd ababab [1, 2, 3] [0, 0, 0]"},
    {"{{ 1 < 2 < 3 }} {{ 1 < 3 < 2 }} {{ 'a' < 'b' }} {{ 1 == 1.0 }} {{ 1 == true }} {{ [1,2] == "
     "[1,2] }} {{ 'a' != 'b' }}",
     NULL, J_OK, "True False True True True True True"},
    {"{{ 'ell' in 'hello' }} {{ 2 in xs }} {{ 'a' in d }} {{ 'z' not in d }} {{ not 1 in xs }}",
     CTX, J_OK, "True True True True False"},
    {"{{ 1 and 'x' }} {{ 0 and 'x' }} {{ 0 or 'y' }} {{ '' or none }} {{ not 0 }} {{ not xs }}",
     CTX, J_OK, "x 0 y None True False"},
    {"{{ 'y' if t else 'n' }} {{ 'y' if n else 'n' }} [{{ 'y' if n }}]", CTX, J_OK, "y n []"},
    {"{{ d.a }} {{ d['b'] }} {{ d.c[1] }} {{ d.c.0 }} {{ d.zz }} {{ xs[-1] }} {{ xs[5] }} {{ "
     "msgs[0].role }}",
     CTX, J_OK, "1 2 x 1  2  user"},
    {"{{ xs[1:] }} {{ xs[:-1] }} {{ xs[::-1] }} {{ xs[::2] }} {{ 'abcdef'[1:4] }} {{ "
     "'abcdef'[::-2] }} {{ u8[1:4] }} {{ u8[-3:] }}",
     CTX, J_OK, "[1, 2] [3, 1] [2, 1, 3] [3, 2] bcd fdb \303\251ll  \303\205\303\211"},
    {"{{ n.foo }}|{{ (n.foo) is defined }}|{{ 'str'.foo is defined }}|{{ xs.foo }}", CTX, J_OK,
     "|False|False|"},
    {"{{ x is defined }} {{ xs is defined }} {{ n is none }} {{ n is not none }} {{ xs is "
     "undefined }}",
     CTX, J_OK, "False True True False False"},
    {"{{ s is string }} {{ xs is string }} {{ d is mapping }} {{ xs is mapping }} {{ xs is "
     "iterable }} {{ s is iterable }} {{ 3 is iterable }} {{ nope is iterable }}",
     CTX, J_OK, "True False True False True True False True"},
    {"{{ 3 is number }} {{ 3.5 is float }} {{ 3 is integer }} {{ true is boolean }} {{ true is "
     "number }} {{ xs is sequence }} {{ d is sequence }}",
     CTX, J_OK, "True True True True True True True"},
    {"{{ 4 is even }} {{ 3 is odd }} {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(4) }} {{ 'a' is "
     "equalto 'a' }} {{ 2 is gt 1 }} {{ 'ab' is lower }} {{ 'AB' is upper }} {{ 1 is in xs }}",
     CTX, J_OK, "True True True False True True True True True"},
    {"{{ true is true }} {{ 1 is true }} {{ false is false }} {{ n is sameas none }} {{ range is "
     "callable }} {{ d is callable }}",
     CTX, J_OK, "True False True True True False"},
    {"{{ s|trim }}|{{ s|trim|length }}|{{ 'xxhixx'|trim('x') }}|{{ s|upper }}|{{ s|lower }}|{{ "
     "'hello world-foo (bar)'|title }}|{{ 'hELLO'|capitalize }}",
     CTX, J_OK, "Hello, World|12|hi|  HELLO, WORLD  |  hello, world  |Hello World-Foo (Bar)|Hello"},
    {"{{ xs|join(', ') }} {{ xs|join }} {{ msgs|map(attribute='role')|join('/') }} {{ "
     "xs|map('string')|list }} {{ xs|first }} {{ xs|last }} {{ s|first }}",
     CTX, J_OK, "3, 1, 2 312 user/assistant/user ['3', '1', '2'] 3 2  "},
    {"{{ xs|sort }} {{ xs|sort(reverse=true) }} {{ ['b','A','c']|sort }} {{ "
     "['b','A','c']|sort(case_sensitive=true) }} {{ "
     "msgs|sort(attribute='content')|map(attribute='content')|list }}",
     CTX, J_OK, "[1, 2, 3] [3, 2, 1] ['A', 'b', 'c'] ['A', 'b', 'c'] ['bye', 'hi', 'yo']"},
    {"{{ xs|min }} {{ xs|max }} {{ xs|sum }} {{ [1.5, 2]|sum }} {{ xs|reverse|list }} {{ "
     "'abc'|reverse }} {{ [1,2,1,3]|unique|list }} {{ ['a','A','b']|unique|list }}",
     CTX, J_OK, "1 3 6 3.5 [2, 1, 3] cba [1, 2, 3] ['a', 'b']"},
    {"{{ d|items|list }} {{ d|dictsort }} {{ d|list }} {{ d|length }} {{ 'h\303\251llo'|length }} "
     "{{ nope|length }} {{ nope|list }}",
     CTX, J_OK,
     "[('b', 2), ('a', 1), ('c', [1, 'x'])] [('a', 1), ('b', 2), ('c', [1, 'x'])] ['b', 'a', 'c'] "
     "3 5 0 []"},
    {"{{ nope|default('dflt') }} {{ e|default('dflt') }} {{ e|default('dflt', true) }} {{ n|d('x') "
     "}} {{ 0|default(5, boolean=true) }}",
     CTX, J_OK, "dflt  dflt None 5"},
    {"{{ '42'|int }} {{ ' 7 '|int }} {{ '3.9'|int }} {{ 'x'|int }} {{ 'x'|int(-1) }} {{ 3.99|int "
     "}} {{ '0x1A'|int(0, 16) }} {{ '2.5'|float }} {{ 'a'|float }} {{ 3|float }}",
     NULL, J_OK, "42 7 3 0 -1 3 26 2.5 0.0 3.0"},
    {"{{ 5|string ~ 'x' }} {{ [1]|string }} {{ none|string }} {{ 'a<b>&\"c\\''|e }} {{ 'x'|safe }} "
     "{{ -3|abs }} {{ 2.567|round(2) }} {{ 2.5|round }} {{ 3.5|round }} {{ 2.1|round(0, 'ceil') }}",
     NULL, J_OK, "5x [1] None a&lt;b&gt;&amp;&#34;c&#39; x 3 2.57 2.0 4.0 3.0"},
    {"{{ 'a-b-c'|replace('-', '+') }} {{ 'aaa'|replace('a', 'b', 2) }} {{ 'hi'|center(8) }}| {{ 'a "
     "b  c'|wordcount }} {{ '%s=%d'|format('x', 3) }} {{ 'x'|format }}",
     NULL, J_OK, "a+b+c bba    hi   | 3 x=3 x"},
    {"{{ msgs|selectattr('role', 'equalto', 'user')|list|length }} {{ msgs|rejectattr('role', "
     "'equalto', 'user')|map(attribute='content')|list }} {{ [0,1,2,'',none]|select|list }} {{ "
     "xs|select('odd')|list }} {{ xs|reject('gt', 1)|list }}",
     CTX, J_OK, "2 ['yo'] [1, 2] [3, 1] [1]"},
    {"{{ msgs|selectattr('role')|list|length }} {{ msgs|map(attribute='missing', "
     "default='\?')|list }} {{ ['a','b']|map('upper')|join }}",
     CTX, J_OK, "3 ['\?', '\?', '\?'] AB"},
    {"{{ 'a\\nb\\n\\nc'|indent }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'a\\n\\nb'|indent(width='>', "
     "blank=true) }}",
     NULL, J_OK, "a\n    b\n\n    c|  a\n  b|a\n>\n>b"},
    {"{{ 'The quick brown fox jumps'|truncate(12) }}|{{ 'The quick brown fox jumps'|truncate(12, "
     "true) }}|{{ 'short'|truncate(12) }}",
     NULL, J_OK, "The...|The quick...|short"},
    {"{{ d|tojson }} {{ xs|tojson }} {{ 'a\"b\\\\c\\n\\t\\u0001\303\251\360\237\230\200'|tojson }} "
     "{{ none|tojson }} {{ true|tojson }} {{ 2.50|tojson }}",
     CTX, J_OK,
     "{\"b\": 2, \"a\": 1, \"c\": [1, \"x\"]} [3, 1, 2] "
     "\"a\\\"b\\\\c\\n\\t\\u0001\303\251\360\237\230\200\" null true 2.5"},
    {"{{ d|tojson(indent=2) }}\n{{ [] |tojson(indent=2) }}{{ {}|tojson(indent=4) }}{{ "
     "[[1,[]],{}]|tojson(indent=1) }}",
     CTX, J_OK,
     "{\n  \"b\": 2,\n  \"a\": 1,\n  \"c\": [\n    1,\n    \"x\"\n  ]\n}\n[]{}[\n [\n  1,\n  []\n "
     "],\n {}\n]"},
    {"{{ d|tojson(sort_keys=true) }} {{ d|tojson(separators=(',', ':')) }} {{ {1: 'a', 2.5: 'b', "
     "true: 'c', none: 'd'}|tojson }}",
     CTX, J_OK,
     "{\"a\": 1, \"b\": 2, \"c\": [1, \"x\"]} {\"b\":2,\"a\":1,\"c\":[1,\"x\"]} {\"1\": \"c\", "
     "\"2.5\": \"b\", \"null\": \"d\"}"},
    {"{{ msgs|tojson }} {{ 1e20|tojson }} {{ -0.0|tojson }} {{ 1e-7|tojson }} {{ "
     "123456789012|tojson }}",
     CTX, J_OK,
     "[{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"yo\"}, "
     "{\"role\": \"user\", \"content\": \"bye\"}] 1e+20 -0.0 1e-07 123456789012"},
    {"{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ 'xxaxx'.strip('x') }}|{{ "
     "'\\n\\nab\\n'.lstrip('\\n') }}|{{ 'ab  \\n'.rstrip() }}",
     CTX, J_OK, "Hello, World|Hello, World  |  Hello, World|a|ab\n|ab"},
    {"{{ 'a,b,,c'.split(',') }} {{ ' a  b c '.split() }} {{ 'a,b,c'.split(',', 1) }} {{ "
     "'a,b,c'.rsplit(',', 1) }} {{ 'x</think>y</think>z'.split('</think>')[-1] }} {{ ' a b "
     "'.rsplit() }}",
     NULL, J_OK, "['a', 'b', '', 'c'] ['a', 'b', 'c'] ['a', 'b,c'] ['a,b', 'c'] z ['a', 'b']"},
    {"{{ s.startswith('  He') }} {{ s.endswith('d  ') }} {{ 'abc'.startswith(('x', 'a')) }} {{ "
     "'Hello'.upper() }} {{ 'Hello'.lower() }} {{ 'hello wORLD'.title() }} {{ 'hELLO'.capitalize() "
     "}}",
     CTX, J_OK, "True True True HELLO hello Hello World Hello"},
    {"{{ 'a-b-c'.replace('-', '') }} {{ 'aaa'.replace('a', 'b', 1) }} {{ 'abcabc'.find('c') }} {{ "
     "'abc'.find('z') }} {{ 'abcabc'.count('bc') }} {{ ', '.join(['a', 'b']) }} {{ "
     "'l1\\nl2\\r\\nl3'.splitlines() }}",
     NULL, J_OK, "abc baa 2 -1 2 a, b ['l1', 'l2', 'l3']"},
    {"{{ '{} and {}'.format('x', 1) }} {{ '{0}{1}{0}'.format('a', 'b') }} {{ "
     "'{name}!'.format(name='Bob') }} {{ 'abc'.removeprefix('a') }} {{ 'abc'.removesuffix('c') }} "
     "{{ '12'.isdigit() }} {{ 'a1'.isalnum() }} {{ '7'.zfill(3) }}",
     NULL, J_OK, "x and 1 aba Bob! bc ab True True 007"},
    {"{{ u8.upper() }} {{ u8|upper }} {{ u8.title() }} {{ '\303\205\303\211\303\216'.lower() }} {{ "
     "u8|length }} {{ u8[1] }} {{ u8.find('w') }}",
     CTX, J_OK,
     "H\303\211LLO W\303\226RLD \303\205\303\211 H\303\211LLO W\303\226RLD \303\205\303\211 "
     "H\303\251llo W\303\266rld \303\205\303\251 \303\245\303\251\303\256 14 \303\251 6"},
    {"{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %} {{ d.keys()|list }} {{ "
     "d.values()|list }} {{ d.get('a') }} {{ d.get('z') }} {{ d.get('z', 9) }}",
     CTX, J_OK, "b=2;a=1;c=[1, 'x']; ['b', 'a', 'c'] [2, 1, [1, 'x']] 1 None 9"},
    {"{% if n %}a{% elif xs|length > 5 %}b{% elif t %}c{% else %}d{% endif %}", CTX, J_OK, "c"},
    {"{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ "
     "loop.first }}{{ loop.last }}{{ loop.length }}:{{ x }} {% endfor %}",
     CTX, J_OK, "1032TrueFalse3:3 2121FalseFalse3:1 3210FalseTrue3:2 "},
    {"{% for x in xs %}{{ loop.previtem }}-{{ loop.nextitem }} {{ loop.cycle('odd', 'even') }}|{% "
     "endfor %}",
     CTX, J_OK, "-1 odd|3-2 even|1- odd|"},
    {"{% for x in [] %}a{% else %}empty{% endfor %} {% for x in xs if x > 1 %}{{ x }}{{ "
     "loop.length }}{% else %}none{% endfor %}",
     CTX, J_OK, "empty 3222"},
    {"{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }}{% endfor %} {% for (a, b) in d|dictsort %}{{ a "
     "}}{% endfor %} {% for c in 'h\303\251y' %}[{{ c }}]{% endfor %}",
     CTX, J_OK, "37 abc [h][\303\251][y]"},
    {"{% for x in xs %}{% if x == 1 %}{% continue %}{% endif %}{% if x == 2 %}{% break %}{% endif "
     "%}{{ x }}{% endfor %}",
     CTX, J_OK, "3"},
    {"{% for i in range(3) %}{% for j in range(i) %}{{ i }}{{ j }}{{ loop.index }}{% endfor %}{{ "
     "loop.index }},{% endfor %}",
     NULL, J_OK, "1,1012,2012123,"},
    {"{{ range(5)|list }} {{ range(2, 5)|list }} {{ range(10, 0, -3)|list }} {{ range(0)|list }}",
     NULL, J_OK, "[0, 1, 2, 3, 4] [2, 3, 4] [10, 7, 4, 1] []"},
    {"{% set x = 1 %}{% set y, z = 2, 3 %}{{ x + y + z }}{% for i in xs %}{% set x = i %}{% endfor "
     "%}{{ x }}",
     CTX, J_OK, "61"},
    {"{% set ns = namespace(total=0, found=false) %}{% for x in xs %}{% set ns.total = ns.total + "
     "x %}{% if x == 1 %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.total }} {{ "
     "ns.found }}",
     CTX, J_OK, "6 True"},
    {"{% set ns = namespace() %}{% set ns.a = 'v' %}{{ ns.a }}{% set msgs2 = msgs[1:] %}{{ "
     "msgs2|length }}{{ msgs|length }}",
     CTX, J_OK, "v23"},
    {"{% set block %}inner {{ 1 + 1 }}{% endset %}[{{ block }}]{% set s = s|trim %}{{ s }}", CTX,
     J_OK, "[inner 2]Hello, World"},
    {"{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('A') }} {{ "
     "greet('B', '\?') }} {{ greet(punct='.', name='C') }}",
     NULL, J_OK, "Hi A! Hi B\? Hi C."},
    {"{% macro rec(n) %}{% if n > 0 %}{{ n }}{{ rec(n - 1) }}{% endif %}{% endmacro %}{{ rec(4) }}",
     NULL, J_OK, "4321"},
    {"{% macro show(m) %}{{ m.role|upper }}:{{ m['content'] }}{% endmacro %}{% for m in msgs %}{{ "
     "show(m) }} {% endfor %}",
     CTX, J_OK, "USER:hi ASSISTANT:yo USER:bye "},
    {"{% filter upper %}hello {{ 'x' }}{% endfilter %} {% with a = 1, b = 2 %}{{ a + b }}{% "
     "endwith %}{{ a }}",
     NULL, J_OK, "HELLO X 3"},
    {"{{ strftime_now('%Y-%m-%d %d %b %Y %H:%M') }}", NULL, J_OK, "2024-07-26 26 Jul 2024 10:30"},
    {"{{ dict(a=1, b='x') }} {{ namespace(a=1).a }}", NULL, J_OK, "{'a': 1, 'b': 'x'} 1"},
    {"{% generation %}gen {{ 1 }}{% endgeneration %}", NULL, J_OK, "gen 1"},
    {"{% for m in msgs %}{% if loop.index0 % 2 == 0 %}{{ m.content }}{% endif %}{% endfor %}", CTX,
     J_OK, "hibye"},
    {"{%- for m in msgs -%}\n  {{- m.role -}}\n  {%- if not loop.last %},{% endif -%}\n{%- endfor "
     "%}\n",
     CTX, J_OK, "user,assistant,user"},
    {"{{ '%s is %d years' % ('Al', 30) }} {{ '%05.1f|%-4s|%x' % (3.14159, 'ab', 255) }} {{ '%(a)s' "
     "% {'a': 1} }}",
     NULL, J_OK, "Al is 30 years 003.1|ab  |ff 1"},
    {"{{ raise_exception('Custom error: ' ~ 2) }}", NULL, J_RAISE, "Custom error: 2"},
    {"{% for m in msgs %}{% if m.role == 'assistant' %}{{ raise_exception('no assistants') }}{% "
     "endif %}{% endfor %}",
     CTX, J_RAISE, "no assistants"},
    {"{{ 'a' + 1 }}", NULL, J_ERROR, NULL},
    {"{{ nope.attr }}", NULL, J_ERROR, NULL},
    {"{{ nope() }}", NULL, J_ERROR, NULL},
    {"{{ 1 / 0 }}", NULL, J_ERROR, NULL},
    {"{% for a, b in [[1, 2, 3]] %}{% endfor %}", NULL, J_ERROR, NULL},
    {"{{ d|tojson(indent=2, sort_keys=true) }} {{ xs[::0] }}", CTX, J_ERROR, NULL},
    {"{{ 'a' < 1 }}", NULL, J_ERROR, NULL},
    {"{% if x %}unclosed", NULL, J_ERROR, NULL},
    {"{{ x |unknownfilter }}", NULL, J_ERROR, NULL},
    {"{% if false %}{{ x|unknownfilter }}{% endif %}ok", NULL, J_OK, "ok"},
    {"{{ 1 + }}", NULL, J_ERROR, NULL},
    {"{% endfor %}", NULL, J_ERROR, NULL},
    {"{% include 'x' %}", NULL, J_ERROR, NULL},
    {"{{ [].append(1) }}", NULL, J_ERROR, NULL},
};
#define CTX_JSON                                                                                   \
    "{\"xs\": [3, 1, 2], \"d\": {\"b\": 2, \"a\": 1, \"c\": [1, \"x\"]}, \"s\": \"  Hello, World " \
    " \", \"n\": null, \"msgs\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": "          \
    "\"assistant\", \"content\": \"yo\"}, {\"role\": \"user\", \"content\": \"bye\"}], \"t\": "    \
    "true, \"f\": 2.5, \"u8\": \"h\303\251llo w\303\266rld \303\205\303\211\", \"e\": \"\"}"

static time_t fixed_now(void) {
    struct tm tm = {.tm_year = 2024 - 1900,
                    .tm_mon = 6,
                    .tm_mday = 26,
                    .tm_hour = 10,
                    .tm_min = 30,
                    .tm_isdst = -1};
    return mktime(&tm);
}

/* Parses and renders; returns the status, *out (caller frees) on success. */
static int render(const char *tmpl, const char *ctx_json, const pgd_jinja_opts *opts, char **out,
                  pgd_err *err) {
    pgd_jinja_tmpl *t = NULL;
    *out = NULL;
    int rc = pgd_jinja_parse(tmpl, strlen(tmpl), &t, err);
    if (rc) return rc;
    cJSON *ctx = ctx_json ? cJSON_Parse(ctx_json) : NULL;
    size_t n = 0;
    rc = pgd_jinja_render(t, ctx, opts, out, &n, err);
    if (!rc && strlen(*out) != n) rc = -100; /* no NUL inside these outputs */
    cJSON_Delete(ctx);
    pgd_jinja_free(t);
    return rc;
}

static void test_cases(void) {
    pgd_jinja_opts opts = {.now = fixed_now()};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const struct jcase *c = &cases[i];
        char *out = NULL;
        pgd_err err = {{0}};
        int rc = render(c->tmpl, c->ctx ? CTX_JSON : NULL, &opts, &out, &err);
        bool ok;
        if (c->kind == J_OK)
            ok = rc == 0 && out && !strcmp(out, c->expect);
        else if (c->kind == J_RAISE)
            ok = rc == PGD_EINVAL && !strcmp(err.msg, c->expect);
        else
            ok = rc < 0 && err.msg[0] && !strchr(err.msg, '\n');
        CHECK(ok);
        if (!ok)
            fprintf(stderr, "case %zu: %s\n  rc=%d out=%s err=%s\n  expected: %s\n", i, c->tmpl, rc,
                    out ? out : "(null)", err.msg, c->expect ? c->expect : "(an error)");
        free(out);
    }
}

static void test_errors_and_limits(void) {
    char *out;
    pgd_err err;
    /* syntax errors: PGD_EFORMAT with line and column */
    CHECK_EQ_INT(render("a\n{% if x %}\n{{ 1 + }}", NULL, NULL, &out, &err), PGD_EFORMAT);
    CHECK(strstr(err.msg, "line 3 col") != NULL);
    CHECK_EQ_INT(render("{% for %}", NULL, NULL, &out, &err), PGD_EFORMAT);
    CHECK_EQ_INT(render("{{ 'unterminated }}", NULL, NULL, &out, &err), PGD_EFORMAT);
    CHECK_EQ_INT(render("{# open comment", NULL, NULL, &out, &err), PGD_EFORMAT);
    CHECK_EQ_INT(render("{% include 'x' %}", NULL, NULL, &out, &err), PGD_EUNSUPPORTED);
    /* raise_exception: exactly the message */
    CHECK_EQ_INT(render("x{{ raise_exception('Roles must alternate') }}", NULL, NULL, &out, &err),
                 PGD_EINVAL);
    CHECK(!strcmp(err.msg, "Roles must alternate"));
    /* runtime errors name the line */
    CHECK_EQ_INT(render("\n\n{{ 'a' + 1 }}", NULL, NULL, &out, &err), PGD_EINVAL);
    CHECK(!strncmp(err.msg, "line 3: ", 8));
    /* limits: output, steps, macro recursion, memory, nesting */
    pgd_jinja_opts small = {.max_output = 1000};
    CHECK_EQ_INT(render("{% for i in range(1000) %}xx{% endfor %}", NULL, &small, &out, &err),
                 PGD_ERANGE);
    CHECK_EQ_INT(render("{{ 'x' * 100000000000 }}", NULL, NULL, &out, &err), PGD_ERANGE);
    pgd_jinja_opts steps = {.max_steps = 100000};
    CHECK_EQ_INT(
        render("{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}", NULL,
               &steps, &out, &err),
        PGD_ERANGE);
    CHECK_EQ_INT(
        render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", NULL, NULL, &out, &err),
        PGD_ERANGE);
    pgd_jinja_opts mem = {.max_memory = 1 << 20};
    CHECK_EQ_INT(render("{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% set ns.l = "
                        "ns.l + [i] %}{% endfor %}",
                        NULL, &mem, &out, &err),
                 PGD_ERANGE);
    CHECK_EQ_INT(render("{% set ns = namespace(v=1) %}{% for i in range(10000) %}{% set ns.v = "
                        "[ns.v] %}{% endfor %}",
                        NULL, NULL, &out, &err),
                 PGD_ERANGE);
    CHECK_EQ_INT(render("{{ range(100000000)|length }}", NULL, NULL, &out, &err), PGD_ERANGE);
    CHECK_EQ_INT(render("{{ 9223372036854775807 + 1 }}", NULL, NULL, &out, &err), PGD_ERANGE);
    char deep[4096];
    size_t k = 0;
    k += (size_t)snprintf(deep + k, sizeof deep - k, "{{ ");
    for (int i = 0; i < 1000; i++) deep[k++] = '(';
    deep[k++] = '1';
    for (int i = 0; i < 1000; i++) deep[k++] = ')';
    snprintf(deep + k, sizeof deep - k, " }}");
    CHECK_EQ_INT(render(deep, NULL, NULL, &out, &err), PGD_ERANGE);
    k = 0;
    for (int i = 0; i < 300 && k + 20 < sizeof deep; i++)
        k += (size_t)snprintf(deep + k, sizeof deep - k, "{%% if 1 %%}");
    deep[k] = 0;
    CHECK_EQ_INT(render(deep, NULL, NULL, &out, &err), PGD_ERANGE);
    /* long left-deep chains count as nesting too (the evaluator recurses along them) */
    static char chain[16384];
    k = (size_t)snprintf(chain, sizeof chain, "{{ 1");
    for (int i = 0; i < 2000; i++) k += (size_t)snprintf(chain + k, sizeof chain - k, " + 1");
    snprintf(chain + k, sizeof chain - k, " }}");
    CHECK_EQ_INT(render(chain, NULL, NULL, &out, &err), PGD_ERANGE);
    k = (size_t)snprintf(chain, sizeof chain, "{{ 'a'");
    for (int i = 0; i < 2000; i++) k += (size_t)snprintf(chain + k, sizeof chain - k, "|trim");
    snprintf(chain + k, sizeof chain - k, " }}");
    CHECK_EQ_INT(render(chain, NULL, NULL, &out, &err), PGD_ERANGE);
    k = (size_t)snprintf(chain, sizeof chain, "{{ 1");
    for (int i = 0; i < 100; i++) k += (size_t)snprintf(chain + k, sizeof chain - k, " + 1");
    snprintf(chain + k, sizeof chain - k, " }}");
    CHECK_EQ_INT(render(chain, NULL, NULL, &out, &err), 0);
    CHECK(out && !strcmp(out, "101"));
    free(out);
    /* a NUL byte and invalid UTF-8 are data like any other */
    pgd_jinja_tmpl *t;
    CHECK_EQ_INT(pgd_jinja_parse("a\0b{{ 1 }}\xff", 11, &t, &err), 0);
    size_t n;
    CHECK_EQ_INT(pgd_jinja_render(t, NULL, NULL, &out, &n, &err), 0);
    CHECK(n == 5 && !memcmp(out, "a\0b1\xff", 5));
    free(out);
    pgd_jinja_free(t);
    /* the context must be an object */
    cJSON *arr = cJSON_CreateArray();
    CHECK_EQ_INT(pgd_jinja_parse("x", 1, &t, &err), 0);
    CHECK_EQ_INT(pgd_jinja_render(t, arr, NULL, &out, &n, &err), PGD_EINVAL);
    cJSON_Delete(arr);
    pgd_jinja_free(t);
}

/* One parsed template rendered by several threads at once gives the same text everywhere. */
struct thr {
    const pgd_jinja_tmpl *t;
    const cJSON *ctx;
    const char *expect;
    int bad;
};

static void *thr_main(void *arg) {
    struct thr *a = arg;
    for (int i = 0; i < 200; i++) {
        char *out = NULL;
        size_t n;
        pgd_err err;
        if (pgd_jinja_render(a->t, a->ctx, NULL, &out, &n, &err) || strcmp(out, a->expect))
            a->bad++;
        free(out);
    }
    return NULL;
}

static void test_threads(void) {
    const char *src =
        "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
        "<{{ m.role }}>{{ m.content|trim }}{{ ' ' ~ loop.index }}{% endfor %}{{ ns.n }}"
        "{{ messages|tojson }}";
    const char *ctx_json = "{\"messages\": [{\"role\": \"user\", \"content\": \" hi \"},"
                           " {\"role\": \"assistant\", \"content\": \"yo\"}]}";
    const char *expect = "<user>hi 1<assistant>yo 22[{\"role\": \"user\", \"content\": \" hi \"}, "
                         "{\"role\": \"assistant\", \"content\": \"yo\"}]";
    pgd_jinja_tmpl *t;
    pgd_err err;
    CHECK_EQ_INT(pgd_jinja_parse(src, strlen(src), &t, &err), 0);
    cJSON *ctx = cJSON_Parse(ctx_json);
    pthread_t th[4];
    struct thr args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (struct thr){.t = t, .ctx = ctx, .expect = expect};
        pthread_create(&th[i], NULL, thr_main, &args[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK_EQ_INT(args[i].bad, 0);
    }
    cJSON_Delete(ctx);
    pgd_jinja_free(t);
}

/* Truncations, deletions, insertions and duplications of the real templates: any result is
 * fine except a crash, a leak or an error message that is not one line (the sanitizer build
 * checks the first two). */
static char *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)len + 1);
    *n = s ? fread(s, 1, (size_t)len, f) : 0;
    fclose(f);
    return s;
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(uint32_t n) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return n ? (uint32_t)(rng_state % n) : 0;
}

static void test_fuzz(void) {
    static const char *const files[] = {
        "HuggingFaceTB-SmolLM3-3B",
        "Qwen-Qwen2.5-7B-Instruct",
        "deepseek-ai-DeepSeek-R1-Distill-Llama-8B",
        "google-gemma-2-2b-it",
        "meta-llama-Llama-3.1-8B-Instruct",
        "meta-llama-Llama-3.2-3B-Instruct",
        "microsoft-Phi-3.5-mini-instruct",
        "mistralai-Mistral-Nemo-Instruct-2407",
    };
    static const char *const snippets[] = {
        "{%",
        "%}",
        "{{",
        "}}",
        "{#",
        "#}",
        "-",
        "+",
        "(",
        ")",
        "[",
        "]",
        "{",
        "}",
        "'",
        "\"",
        "|",
        ".",
        ",",
        ":",
        "=",
        "~",
        "*",
        "**",
        "\\",
        "\n",
        "if",
        "endif",
        "for",
        "endfor",
        "else",
        "set",
        "macro",
        "endmacro",
        "in",
        "not",
        "is",
        "loop",
        "raw",
        "endraw",
        "namespace(",
        "|tojson",
        "[::-1]",
        "0",
        "\xff",
        "range(9999)",
        "messages",
        "{% for x in range(300) %}",
        "{% endfor %}",
    };
    const char *ctx_json =
        "{\"messages\": [{\"role\": \"system\", \"content\": \"sys\"}, {\"role\": \"user\", "
        "\"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": null, \"tool_calls\": "
        "[{\"id\": \"call12345\", \"type\": \"function\", \"function\": {\"name\": \"f\", "
        "\"arguments\": {\"a\": 1}}}]}, {\"role\": \"tool\", \"content\": \"ok\"}], "
        "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": "
        "{}}}],"
        " \"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\"}";
    cJSON *ctx = cJSON_Parse(ctx_json);
    pgd_jinja_opts opts = {.max_steps = 200000, .max_output = 1 << 20};
    int n_ok = 0, n_err = 0;
    for (size_t fi = 0; fi < sizeof files / sizeof files[0]; fi++) {
        char path[256];
        snprintf(path, sizeof path, "tests/data/chat-templates/%s.jinja", files[fi]);
        size_t len;
        char *src = read_all(path, &len);
        CHECK(src != NULL);
        if (!src) continue;
        for (int it = 0; it < 300; it++) {
            size_t cap = len * 6 + 512, n = len;
            char *m = malloc(cap);
            memcpy(m, src, len);
            for (int ops = 1 + (int)rnd(4); ops > 0; ops--) {
                size_t i = rnd((uint32_t)n + 1), j;
                const char *sn;
                switch (rnd(4)) {
                case 0: n = i; break;
                case 1:
                    j = i + 1 + rnd(40);
                    if (j > n) j = n;
                    memmove(m + i, m + j, n - j);
                    n -= j - i;
                    break;
                case 2:
                    sn = snippets[rnd(sizeof snippets / sizeof snippets[0])];
                    if (n + strlen(sn) < cap) {
                        memmove(m + i + strlen(sn), m + i, n - i);
                        memcpy(m + i, sn, strlen(sn));
                        n += strlen(sn);
                    }
                    break;
                default:
                    j = i + 1 + rnd(200);
                    if (j > n) j = n;
                    if (n + (j - i) < cap) {
                        memmove(m + j + (j - i), m + j, n - j);
                        memcpy(m + j, m + i, j - i);
                        n += j - i;
                    }
                }
            }
            pgd_jinja_tmpl *t = NULL;
            pgd_err err = {{0}};
            char *out = NULL;
            size_t out_n;
            int rc = pgd_jinja_parse(m, n, &t, &err);
            if (!rc) rc = pgd_jinja_render(t, ctx, &opts, &out, &out_n, &err);
            if (rc) {
                n_err++;
                CHECK(err.msg[0] && !strchr(err.msg, '\n') && rc < 0);
            } else
                n_ok++;
            free(out);
            pgd_jinja_free(t);
            free(m);
        }
        free(src);
    }
    printf("fuzz: %d rendered, %d failed cleanly\n", n_ok, n_err);
    CHECK(n_ok > 100 && n_err > 100);
    cJSON_Delete(ctx);
}

int main(void) {
    test_cases();
    test_errors_and_limits();
    test_threads();
    test_fuzz();
    return test_report("test_jinja");
}
