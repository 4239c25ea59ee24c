"""The pre-tokenizers of real models as their tokenizer.json files have them (Hugging Face
`tokenizers` JSON: normalizer, pre_tokenizer, BPE ignore_merges), keyed by the GGUF
`tokenizer.ggml.pre` names llama.cpp gives them (src/llama-vocab.cpp). The tests build HF
references from these and check Pagoda against them; Pagoda's own table (src/tokenizer/
pretok_pipe.c) is written separately, so the two check each other.

Non-ASCII characters in patterns are written as escapes: some tools normalise text, and NFC turns
U+1FD3 into U+0390, which would turn deepseek-llm's range U+1FD0-U+1FD3 into an empty one."""

GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
CL100K = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
          r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = CL100K.replace(r"\p{N}{1,3}", r"\p{N}")
QWEN35 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+"
          r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
TEKKEN = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|"
          r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|"
          r"\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
O200K = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
         r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
         r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
         r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
         r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
DSL_LETTERS = (
    "\\s?[A-Za-z\xb5\xc0-\xd6\xd8-\xf6\xf8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af"
    "\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1"
    "\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd"
    "\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d"
    "\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4"
    "\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec"
    "\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128"
    "\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b"
    "\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787"
    "\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a"
    "\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2"
    "\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+")
DSL_PUNCT = "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+"
DSL_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
DSV3_CJK = "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"
DSV3_MAIN = ("[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}"
             "\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+")
SPARK_MAIN = ("[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}"
              "\\p{M}]+| ?[\\p{P}\\p{S}]+|[\r\n]|\\s+(?!\\S)|\\s+")
BLOOM = " ?[^(\\s|[.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c])]+"
BAILING = (r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|"
           r"\s*[\r\n]|\s+(?!\S)|\s+")
SEED_CODER = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|"
              r"\s*[\r\n]+|\s+(?!\S)|\s+")
UFAKZEKA = r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
EXAONE_MOE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|"
              r"\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+")
MINICPM5 = CL100K.replace(r"\p{N}{1,3}", r"\p{N}+")
YOUTU_CJK = ("[\uac00-\ud7a3\u3131-\u318e]+|[\uff01\u2026\u201c\u201d\u2018\u2019\u2014\uff1a\uff1b"
             "\uff0c\u3001-\u303f\ufe30-\ufe4f]+|[\u3105-\u312f]+|[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+")
YOUTU_MAIN = O200K.replace(r"\p{N}{1,3}", r"\p{N}")
JAIS2 = CL100K.replace(r"\s+(?!\S)|\s+", "|".join(
    [rf"\s{{{k}}}(?!\S)" for k in (512, 256, 128, 64, 32, 16, 8, 4)] + [r"\s{1,2}(?!\S)", r"\s{1}"]))
AYA_DIGITS = r"\d{1,3}(?=(?:\d{3})*\b)"


def split(regex, behavior="Isolated", invert=False):
    return {"type": "Split", "pattern": {"Regex": regex}, "behavior": behavior, "invert": invert}


def bytelevel(use_regex=False, prefix=False):
    return {"type": "ByteLevel", "add_prefix_space": prefix, "trim_offsets": True,
            "use_regex": use_regex}


def digits(individual):
    return {"type": "Digits", "individual_digits": individual}


def seq(*steps):
    return {"type": "Sequence", "pretokenizers": list(steps)}


NFC = {"type": "NFC"}

# name -> (normalizer, pre_tokenizer, BPE ignore_merges as llama.cpp applies it to the GGUF)
PIPELINES = {
    "gpt-2": (None, bytelevel(True), False),
    "mpt": (NFC, bytelevel(True), False),  # GPT-NeoX's tokenizer
    "starcoder": (None, seq(digits(True), bytelevel(True)), False),
    "refact": (None, seq(digits(True), bytelevel(True)), False),
    "smollm": (None, seq(digits(True), bytelevel(True)), False),
    "command-r": (NFC, seq(digits(True), bytelevel(True)), False),
    "llama-bpe": (None, seq(split(CL100K), bytelevel()), True),
    "smaug-bpe": (None, seq(split(CL100K), bytelevel()), False),
    "qwen2": (NFC, seq(split(QWEN2), bytelevel()), False),
    "qwen35": (None, seq(split(QWEN35), bytelevel()), False),
    "tekken": (None, seq(split(TEKKEN), bytelevel()), True),
    "falcon": (None, seq({"type": "Punctuation", "behavior": "Contiguous"}, bytelevel(True),
                         digits(False), split("[0-9][0-9][0-9]")), False),
    "deepseek-llm": (None, seq(split("[\r\n]"), split(DSL_LETTERS), split(DSL_PUNCT),
                               split("\\s+$"), split(DSL_CJK), digits(False), bytelevel()), False),
    "deepseek-coder": (None, seq(split("[\r\n]"), split("\\s?\\p{L}+"), split("\\s?\\p{P}+"),
                                 split(DSL_CJK), digits(True), bytelevel()), False),
    "deepseek-v3": (None, seq(split(r"\p{N}{1,3}"), split(DSV3_CJK), split(DSV3_MAIN), bytelevel()),
                    False),
    "spark2_5": (None, seq(split(r"\p{N}{1,3}"), split(DSV3_CJK), split(SPARK_MAIN),
                           split(r"\p{N}"), bytelevel()), False),
    "gpt-4o": (None, seq(split(O200K), bytelevel()), False),
    "tiny_aya": (None, seq(split(AYA_DIGITS), split(O200K), bytelevel()), False),
    "bailingmoe": (None, seq(split(BAILING), bytelevel()), False),
    "seed-coder": (None, seq(split(SEED_CODER), bytelevel()), False),
    "ufakzeka": (None, seq(split(UFAKZEKA), bytelevel()), False),
    "exaone-moe": (None, seq(split(EXAONE_MOE), bytelevel()), False),
    "minicpm5": (None, seq(split(r"\p{N}{1,3}"), split(MINICPM5), bytelevel()), True),
    "youtu": (None, seq(split(YOUTU_CJK), split(YOUTU_MAIN), bytelevel()), True),
    "jais-2": (None, seq(split(JAIS2), bytelevel()), False),
    "laguna": (None, seq(split("[^\\n]+|[\\n]+"), split(QWEN2), bytelevel()), False),
    "bloom": (None, seq(split(BLOOM), bytelevel()), False),
    "viking": (None, seq(split(BLOOM), digits(True), bytelevel()), False),
}

# the vocabularies of llama.cpp's test files (llama-cpp-python's sdist) whose pre-tokenizer this
# table names, with the .inp/.out reference ids HF tokenizers made
SDIST_VOCABS = ["gpt-2", "mpt", "starcoder", "refact", "command-r", "falcon", "deepseek-llm",
                "deepseek-coder", "qwen35", "qwen2", "llama-bpe"]
# the hand-written pre-tokenizers, whose general-engine pipelines must give the same pieces
FAST_PATHS = ["gpt-2", "smollm", "llama-bpe", "qwen2", "tekken"]


def split_patterns():
    """Every distinct Split pattern of the table."""
    out = []

    def walk(p):
        if p["type"] == "Sequence":
            for q in p["pretokenizers"]:
                walk(q)
        elif p["type"] == "Split" and p["pattern"]["Regex"] not in out:
            out.append(p["pattern"]["Regex"])
    for _, pre, _ in PIPELINES.values():
        walk(pre)
    return [GPT2] + [p for p in out if p != GPT2]
