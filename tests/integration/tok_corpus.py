"""Deterministic tokenizer test corpus (no downloads): English, code, whitespace runs, digits,
CJK, emoji (ZWJ sequences, skin tones, flags), combining marks, mixed scripts, contractions in
every case, and text that looks like special tokens. Characters are limited to what Python's
unicodedata (Unicode 14) knows, so the C tables and the reference agree on every class.

    python tok_corpus.py                  # prints the corpus as JSONL (one JSON string a line)
    python tok_corpus.py --english BYTES  # prints about BYTES of English prose (benchmark input)
"""
import json
import random
import sys

WORDS = (
    "the quick brown fox jumps over lazy dog a an and or but if then else when while for to "
    "of in on at by with from into about between through during before after above below "
    "time person year way day thing man world life hand part child eye woman place work week "
    "case point government company number group problem fact be have do say get make go know "
    "take see come think look want give use find tell ask seem feel try leave call good new "
    "first last long great little own other old right big high different small large next early "
    "young important few public bad same able model token server request inference latency "
    "throughput kernel memory cache batch queue stream Hello World Paris London OpenAI GPT "
    "Llama Qwen SmolLM tokenizer naïve café résumé coöperate façade Zürich"
).split()

CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d"]
SUBJECTS = ["I", "you", "he", "she", "it", "we", "they", "John", "the model", "that"]

CODE = [
    "def add(a, b):\n    return a + b\n",
    "for (int i = 0; i < n; i++) {\n\tsum += x[i] * y[i];\n}\n",
    "if __name__ == \"__main__\":\n    main()\n",
    "const f = (x) => x ** 2; // square\nconsole.log(f(12));\n",
    "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); return 0; }\n",
    "SELECT id, name FROM users WHERE age >= 21 ORDER BY name DESC;",
    "    x = [i for i in range(100) if i % 3 == 0]\n\n\n",
    "<html><body><div class=\"a\">Hi &amp; bye</div></body></html>",
    "{\"key\": [1, 2.5, -3e10, true, null], \"nested\": {\"a\": \"b\"}}",
    "fn main() {\r\n    let v: Vec<u32> = vec![1, 2, 3];\r\n}\r\n",
    "$ ls -la | grep '\\.py$' && echo \"done\" >> log.txt",
    "\t\tif (a != b && c <= d || !e) { return -1; }",
    "x+=1;y-=2;z*=3;w/=4;q%=5;a<<=1;b>>=2;c&=d;e|=f;g^=h;",
    "@decorator\nclass Foo(Bar, metaclass=Meta):\n    '''Docstring.'''\n    pass",
    "<?php echo $x->y['z']; ?>",
]

CJK = [
    "我们今天去公园散步。", "机器学习是人工智能的一个分支", "東京は日本の首都です。",
    "ひらがなとカタカナ、漢字", "한국어 문장은 이렇게 씁니다.", "中文，标点！还有？“引号”",
    "大規模言語モデル（LLM）", "서울특별시", "繁體中文與简体中文", "ｆｕｌｌｗｉｄｔｈ　ＡＢＣ　１２３",
]

EMOJI = [
    "😀", "👍🏽", "👨\u200d👩\u200d👧\u200d👦", "🏳️\u200d🌈", "🇺🇸🇯🇵", "❤️", "🤖 robots",
    "👩🏿\u200d💻", "🧑\u200d🚀", "☕️ and 🍰", "🔥🔥🔥", "1️⃣2️⃣", "🫠",
]

COMBINING = [
    "e\u0301", "a\u0308", "n\u0303o", "cafe\u0301", "Å", "A\u030a", "\u212b", "q\u0301\u0323",
    "Tiếng Việt có dấu", "Tie\u0302\u0301ng Vie\u0323\u0302t", "ḍ̇", "d\u0307\u0323",
    "\u1100\u1161\u11a8", "각", "ﬁ ligature", "x\u0338", "Ω \u2126", "e\u0301\u0301\u0301",
]

SCRIPTS = [
    "Привет, как дела?", "Ελληνικά γράμματα", "مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया",
    "สวัสดีครับ", "Γειά σου Κόσμε", "ქართული", "Հայերեն", "ᚠᚢᚦᚨᚱᚲ", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "𝟙𝟚𝟛",
    "Ⅻ ⅷ ½ ¾ ² ³ ①②", "٣٤٥ ۶۷۸ ४५६", "ǅemal", "İstanbul ıi", "Straße STRASSE",
]

SPECIALS = [
    "<|im_start|>", "<|im_end|>", "<s>", "</s>", "<unk>", "<|endoftext|>", "<|begin_of_text|>",
    "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>", "[INST]", "<<SYS>>", "<pad>",
    "<|im_start", "im_start|>", "<|", "|>", "<0x41>", "<|reserved_special_token_5|>",
]

WHITESPACE = [" ", "  ", "   ", "    ", "\t", "\t\t", "\n", "\n\n", "\r\n", " \n", "\n ",
              "  \n\n  ", "\u00a0", "\u3000", "\u2003", "\u2028", "\x0b", "\x0c", "\x85", " \t "]

DIGITS = ["0", "7", "42", "123", "1234", "12345", "1234567890", "3.14159", "1,000,000",
          "2024-01-15", "+1 (555) 010-9999", "0x1F", "1e-9", "v2.0.1", "99%", "$19.99",
          "ID: 007", "١٢٣", "１２３"]


def english_sentence(r):
    n = r.randint(3, 16)
    ws = [r.choice(WORDS) for _ in range(n)]
    if r.random() < 0.5:
        ws[0] = ws[0].capitalize()
    s = " ".join(ws)
    if r.random() < 0.3:
        i = r.randrange(len(ws))
        s = s.replace(ws[i], ws[i] + ",", 1)
    return s + r.choice([".", "!", "?", "", "...", ";", ":"])


def contraction(r):
    c = r.choice(CONTRACTIONS)
    c = "".join(ch.upper() if r.random() < 0.4 else ch for ch in c)
    subj = r.choice(SUBJECTS)
    if r.random() < 0.3:
        subj = subj.upper()
    forms = [subj + c + " " + r.choice(WORDS), subj + c, c, " " + c + " ", subj + " " + c,
             "don" + c.replace("'", "’"), subj + c + c, "'" + r.choice(WORDS), "''" + c]
    return r.choice(forms)


def whitespace_mix(r):
    parts = []
    for _ in range(r.randint(1, 6)):
        parts.append(r.choice(WHITESPACE) * r.randint(1, 3))
        if r.random() < 0.7:
            parts.append(r.choice(WORDS + DIGITS + ["!", "...", "-"]))
    return "".join(parts)


def digits(r):
    k = r.random()
    if k < 0.4:
        return r.choice(DIGITS)
    if k < 0.7:
        return str(r.randint(0, 10 ** r.randint(1, 15)))
    return r.choice(["", " ", "a", "x=", "(", "#"]) + str(r.randint(0, 99999)) + r.choice(
        ["", " ", "th", "px", ".", "abc", " 12"])


def mixed(r, pools):
    k = r.randint(2, 6)
    sep = r.choice(["", " ", "  ", "\n", "\t", " - "])
    return sep.join(r.choice(r.choice(pools)) for _ in range(k))


def corpus(n=2400, seed=1234):
    r = random.Random(seed)
    out = ["", " ", "  ", "\n", "\t", "a", "A", " a", "Hello", " Hello", "Hello world",
           "  leading", "trailing  ", "   \n\n   ", "\r\n\r\n"]
    out += CODE + CJK + EMOJI + COMBINING + SCRIPTS + SPECIALS + WHITESPACE + DIGITS
    pools = [WORDS, CJK, EMOJI, COMBINING, SCRIPTS, SPECIALS, WHITESPACE, DIGITS, CODE]
    gens = [
        (0.22, english_sentence), (0.12, contraction), (0.12, whitespace_mix), (0.1, digits),
        (0.06, lambda r: r.choice(CODE) * r.randint(1, 2)),
        (0.06, lambda r: "".join(r.choice(CJK) for _ in range(r.randint(1, 3)))),
        (0.06, lambda r: mixed(r, [EMOJI, WORDS, WHITESPACE])),
        (0.06, lambda r: mixed(r, [COMBINING, WORDS, SCRIPTS])),
        (0.06, lambda r: mixed(r, [SCRIPTS, CJK, WORDS, DIGITS])),
        (0.06, lambda r: mixed(r, [SPECIALS, WORDS, WHITESPACE])),
        (0.08, lambda r: mixed(r, pools)),
    ]
    total = sum(w for w, _ in gens)
    while len(out) < n:
        x = r.random() * total
        for w, g in gens:
            x -= w
            if x <= 0:
                out.append(g(r))
                break
    return out


def special_corpus(n=300, seed=99):
    """Strings with special-token text in them, for the parse_special comparison."""
    r = random.Random(seed)
    out = []
    while len(out) < n:
        parts = []
        for _ in range(r.randint(1, 5)):
            parts.append(r.choice(SPECIALS) if r.random() < 0.5 else english_sentence(r))
            if r.random() < 0.3:
                parts.append(r.choice(WHITESPACE))
        out.append("".join(parts))
    return out


CONTROL = ["\x00", "\x01x", "a\x07b", "\x1b[31mred\x1b[0m", "tab\tand\x0bvt\x0cff", "\x7f", "\x1f\x1e",
           "nul\x00in\x00side", "\r", "\r\r\n", "\x85next", "\u200b\u200c\u200d", "\ufeffbom"]

ARABIC_DEVANAGARI = [
    "السلام عليكم ورحمة الله", "اللغة العربية جميلة، أليس كذلك؟", "٣٫١٤ و ١٢٣٤٥", "كتاب\u064e", "مَرْحَبًا",
    "हिन्दी भाषा बहुत सुन्दर है।", "क्षत्रिय ज्ञान श्री", "संस्कृतम् ॥ १२३४ ॥", "अ\u093c\u0902", "नमस्ते, दुनिया!",
    "বাংলা ভাষা", "தமிழ் மொழி", "ภาษาไทยสวยงาม", "עִבְרִית",
]


def pretok_corpus(n=1200, seed=4321):
    """Strings aimed at the pre-tokenizer patterns of every family (issue 39): the shared corpus
    plus control characters, Arabic and Devanagari (marks on letters), uppercase and odd
    contractions ('S 'LL, the long s and the Kelvin sign that fold to s and k), long digit runs
    (groups of three from the right, \\p{N}{1,3}), whitespace runs ending in newlines or text,
    CJK against Latin, and code."""
    r = random.Random(seed)
    base = [
        "DON'T WE'LL THEY'RE I'M YOU'VE SHE'D IT'S", "'S 'T 'RE 'VE 'M 'LL 'D", "x'\u017f y'\u212a",
        "'s'll'd", "don\u2019t", "1", "12", "123", "1234", "12345", "123456", "1234567", "12345678901234567890",
        "1,234,567.89", "v1.2.3-rc4", "0x7fffffff", "3.14e-10", "١٢٣٤٥٦٧", "${HOME}/path/to/file.txt",
        "a  b   c    d     e", "line\n\n\n  indented", "  \n\t \r\n x", "trailing \t \n", "\n\n", "   ",
        "中文English混合Text日本語カタカナ한국어", "東京タワー(Tokyo Tower)は333m", "ＡＢＣ１２３！？",
        "ThisIsCamelCase andSNAKE_CASE_VAR", "HTTPRequestHandler XMLParser iOS", "ǅungla ǈudi",
        "<|im_start|>user\nHi<|im_end|>", "«quoted» “curly” ‘single’ „low“", "em—dash en–dash …",
        "price: $1,299.99 (€1.199,99)", "50% off!!! ***SALE***", "#hashtag @mention http://x.y/z?a=1&b=2",
        "def f(x):\n\treturn x**2  # square\n", "if(a&&b||!c){return;}", "SELECT * FROM t WHERE a>=1;",
        "😀😃😄 👍🏽👍🏿 🇺🇸🇬🇧 👨\u200d👩\u200d👧", "e\u0301 a\u0308 n\u0303", "Ⅻ ⅷ ½ ¾ ² ³ ①②",
    ]
    out = base + CONTROL + ARABIC_DEVANAGARI
    pools = [WORDS, CJK, EMOJI, COMBINING, SCRIPTS, WHITESPACE, DIGITS, CODE, CONTROL, ARABIC_DEVANAGARI,
             base]
    while len(out) < n:
        k = r.random()
        if k < 0.3:
            out.append(mixed(r, pools))
        elif k < 0.45:
            out.append(contraction(r))
        elif k < 0.6:
            out.append(str(r.randint(0, 10 ** r.randint(1, 25))) + r.choice(["", " ", "px", ",", "\n"]))
        elif k < 0.75:
            out.append(whitespace_mix(r))
        else:
            out.append(r.choice(base + CONTROL + ARABIC_DEVANAGARI) + r.choice(
                ["", " ", "  ", "\n", "\t"]) + r.choice(base + CJK + SCRIPTS))
    return corpus() + out


def english_text(nbytes, seed=7):
    r = random.Random(seed)
    parts, size = [], 0
    while size < nbytes:
        para = " ".join(english_sentence(r) for _ in range(r.randint(3, 8))) + "\n\n"
        parts.append(para)
        size += len(para.encode())
    return "".join(parts)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--english":
        sys.stdout.write(english_text(int(sys.argv[2])))
    else:
        for s in corpus():
            print(json.dumps(s, ensure_ascii=False))
