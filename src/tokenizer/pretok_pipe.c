/* Pre-tokenizer pipelines (see pretok_pipe.h): Hugging Face's Sequence semantics over one
 * decoded view of the text, and the GGUF pre-tokenizer names. */
#include "tokenizer/pretok_pipe.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/pretok_regex.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

/* The patterns, as the models' tokenizer.json files have them (non-ASCII characters written as
 * \x{...} so that no editor or tool can normalise them). */
const char pgd__re_gpt2[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
const char pgd__re_llama3[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const char pgd__re_qwen2[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const char pgd__re_tekken[] =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+|"
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*|"
    "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
/* Qwen3.5: letters take their marks, and marks are not punctuation */
static const char RE_QWEN35[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| "
    "?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
/* o200k (GPT-4o, Phi-4, Llama 4) */
static const char RE_O200K[] =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*"
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
/* DeepSeek LLM (7B/67B): newlines, then Latin/Greek/Cyrillic/... letters, then ASCII and
 * full-width punctuation, trailing spaces, CJK and Hangul, digit runs */
static const char RE_DSL_LETTERS[] =
    "\\s?[A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}"
    "\\x{1C4}-\\x{293}\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}"
    "\\x{37F}\\x{386}\\x{388}-\\x{38A}\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}\\x{3F7}-\\x{481}"
    "\\x{48A}-\\x{52F}\\x{531}-\\x{556}\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}\\x{13F8}-\\x{13FD}"
    "\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}"
    "\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}\\x{1F20}-\\x{1F45}"
    "\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}\\x{1F5F}-\\x{1F7D}"
    "\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}\\x{1FC6}-\\x{1FCC}"
    "\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}"
    "\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}"
    "\\x{2124}\\x{2126}\\x{2128}\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}\\x{2139}"
    "\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}\\x{214E}\\x{2183}\\x{2184}\\x{2C00}-\\x{2C7B}"
    "\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}\\x{A640}-\\x{A66D}"
    "\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}"
    "\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{FB17}\\x{FF21}-\\x{FF3A}"
    "\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}\\x{104B0}-\\x{104D3}\\x{104D8}-\\x{104FB}"
    "\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}\\x{118A0}-\\x{118DF}\\x{1E900}-\\x{1E943}]+";
static const char RE_DSL_PUNCT[] =
    "\\s?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3000}-\\x{3002}]+";
static const char RE_DSL_CJK[] = "[\\x{4E00}-\\x{9FA5}\\x{800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+";
/* DeepSeek V3 / R1 */
static const char RE_DSV3_CJK[] = "[\\x{4E00}-\\x{9FA5}\\x{3040}-\\x{309F}\\x{30A0}-\\x{30FF}]+";
static const char RE_DSV3_MAIN[] =
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}"
    "\\p{M}]+| ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char RE_SPARK_MAIN[] =
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}"
    "\\p{M}]+| ?[\\p{P}\\p{S}]+|[\\r\\n]|\\s+(?!\\S)|\\s+";
/* BLOOM: anything but whitespace and sentence punctuation, with one leading space */
static const char RE_BLOOM[] =
    " ?[^(\\s|[.,!?\\x{2026}\\x{3002}\\x{FF0C}\\x{3001}\\x{964}\\x{6D4}\\x{60C}])]+";
/* Ling / Bailing MoE: possessive quantifiers */
static const char RE_BAILING[] =
    "'(?i:[sdmt]|ll|ve|re)|[^\\r\\n\\p{L}\\p{N}]?+\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]++[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+";
static const char RE_SEED_CODER[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| "
    "?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char RE_UFAKZEKA[] =
    "[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)"
    "|\\s+";
static const char RE_EXAONE_MOE[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?(?:\\p{L}\\p{M}*(?: \\p{L}\\p{M}*)*)+|"
    "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]?|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+";
static const char RE_MINICPM5[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}+| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char RE_YOUTU_CJK[] =
    "[\\x{AC00}-\\x{D7A3}\\x{3131}-\\x{318E}]+|[\\x{FF01}\\x{2026}\\x{201C}\\x{201D}\\x{2018}"
    "\\x{2019}\\x{2014}\\x{FF1A}\\x{FF1B}\\x{FF0C}\\x{3001}-\\x{303F}\\x{FE30}-\\x{FE4F}]+|"
    "[\\x{3105}-\\x{312F}]+|[\\x{4E00}-\\x{9FA5}\\x{3040}-\\x{309F}\\x{30A0}-\\x{30FF}]+";
static const char RE_YOUTU_MAIN[] =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*"
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
    "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
/* Jais 2: whitespace runs cut in powers of two */
static const char RE_JAIS2[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s{512}(?!\\S)|\\s{256}(?!\\S)|\\s{128}(?!\\S)|"
    "\\s{64}(?!\\S)|\\s{32}(?!\\S)|\\s{16}(?!\\S)|\\s{8}(?!\\S)|\\s{4}(?!\\S)|\\s{1,2}(?!\\S)|"
    "\\s{1}";
/* Tiny Aya / Cohere2 MoE: digits in groups of three from the right, then o200k */
static const char RE_AYA_DIGITS[] = "\\d{1,3}(?=(?:\\d{3})*\\b)";

#define SPLIT(re) {PGD_STEP_SPLIT, PGD_SPLIT_ISOLATED, false, false, false, false, 0, re, 0}
#define BYTELEVEL(use_re) {PGD_STEP_BYTELEVEL, 0, false, false, use_re, false, 0, NULL, 0}
#define DIGITS(indiv) {PGD_STEP_DIGITS, 0, false, indiv, false, false, 0, NULL, 0}
#define PUNCT(beh) {PGD_STEP_PUNCT, beh, false, false, false, false, 0, NULL, 0}
#define NONE {0, 0, false, false, false, false, 0, NULL, 0}
#define FAST(names, fast, flags) {names, fast, flags, {NONE}}

/* llama.cpp's names (src/llama-vocab.cpp) grouped by the pre-tokenizer their models'
 * tokenizer.json has; llama.cpp's flags where they change the ids (ignore_merges, no BOS). */
static const pgd_pretok_named NAMED[] = {
    FAST("gpt-2|default|phi-2|gigachat|a.x-4.0|mellum|exaone4|olmo|jais|trillion|granite-docling",
         PGD_PRE_GPT2, 0),
    FAST("mpt", PGD_PRE_GPT2, PGD_PRE_F_NFC), /* GPT-NeoX's tokenizer: NFC + ByteLevel */
    FAST("smollm|starcoder|refact|codeshell|exaone|minerva-7b|mellum2", PGD_PRE_SMOLLM, 0),
    FAST("command-r", PGD_PRE_SMOLLM, PGD_PRE_F_NFC),
    FAST("llama3|llama-v3|llama-bpe|falcon3|falcon-h1|pixtral|midm-2.0|lfm2", PGD_PRE_LLAMA3,
         PGD_PRE_F_IGNORE_MERGES),
    FAST("smaug-bpe|dbrx", PGD_PRE_LLAMA3, 0),
    FAST("chatglm-bpe", PGD_PRE_LLAMA3, PGD_PRE_F_NO_BOS),
    FAST("glm4|glm5", PGD_PRE_LLAMA3, PGD_PRE_F_NO_BOS | PGD_PRE_F_IGNORE_MERGES),
    FAST("qwen2|deepseek-r1-qwen", PGD_PRE_QWEN2, PGD_PRE_F_NFC),
    FAST("megrez|stablelm2|hunyuan|solar-open|grok-2|kormo|f2llmv2", PGD_PRE_QWEN2, 0),
    FAST("tekken", PGD_PRE_TEKKEN, PGD_PRE_F_IGNORE_MERGES),
    {"qwen35", PGD_PRE_GENERAL, 0, {SPLIT(RE_QWEN35), BYTELEVEL(false)}},
    {"deepseek-llm", PGD_PRE_GENERAL, 0,
     {SPLIT("[\\r\\n]"), SPLIT(RE_DSL_LETTERS), SPLIT(RE_DSL_PUNCT), SPLIT("\\s+$"),
      SPLIT(RE_DSL_CJK), DIGITS(false), BYTELEVEL(false)}},
    {"deepseek-coder", PGD_PRE_GENERAL, 0,
     {SPLIT("[\\r\\n]"), SPLIT("\\s?\\p{L}+"), SPLIT("\\s?\\p{P}+"), SPLIT(RE_DSL_CJK),
      DIGITS(true), BYTELEVEL(false)}},
    {"deepseek-v3|hunyuan-dense|joyai-llm|hy_v4", PGD_PRE_GENERAL, 0,
     {SPLIT("\\p{N}{1,3}"), SPLIT(RE_DSV3_CJK), SPLIT(RE_DSV3_MAIN), BYTELEVEL(false)}},
    {"spark2_5", PGD_PRE_GENERAL, 0,
     {SPLIT("\\p{N}{1,3}"), SPLIT(RE_DSV3_CJK), SPLIT(RE_SPARK_MAIN), SPLIT("\\p{N}"),
      BYTELEVEL(false)}},
    {"falcon", PGD_PRE_GENERAL, 0,
     {PUNCT(PGD_SPLIT_CONTIGUOUS), BYTELEVEL(true), DIGITS(false), SPLIT("[0-9][0-9][0-9]")}},
    {"gpt-4o|llama4|kanana2|talkie|minimax-m2", PGD_PRE_GENERAL, 0,
     {SPLIT(RE_O200K), BYTELEVEL(false)}},
    {"tiny_aya|cohere2moe", PGD_PRE_GENERAL, 0,
     {SPLIT(RE_AYA_DIGITS), SPLIT(RE_O200K), BYTELEVEL(false)}},
    {"bailingmoe|bailingmoe2|llada-moe", PGD_PRE_GENERAL, 0,
     {SPLIT(RE_BAILING), BYTELEVEL(false)}},
    {"seed-coder", PGD_PRE_GENERAL, 0, {SPLIT(RE_SEED_CODER), BYTELEVEL(false)}},
    {"ufakzeka", PGD_PRE_GENERAL, 0, {SPLIT(RE_UFAKZEKA), BYTELEVEL(false)}},
    {"exaone-moe", PGD_PRE_GENERAL, 0, {SPLIT(RE_EXAONE_MOE), BYTELEVEL(false)}},
    {"minicpm5", PGD_PRE_GENERAL, PGD_PRE_F_IGNORE_MERGES,
     {SPLIT("\\p{N}{1,3}"), SPLIT(RE_MINICPM5), BYTELEVEL(false)}},
    {"youtu", PGD_PRE_GENERAL, PGD_PRE_F_IGNORE_MERGES,
     {SPLIT(RE_YOUTU_CJK), SPLIT(RE_YOUTU_MAIN), BYTELEVEL(false)}},
    {"jais-2", PGD_PRE_GENERAL, 0, {SPLIT(RE_JAIS2), BYTELEVEL(false)}},
    {"laguna", PGD_PRE_GENERAL, 0,
     {SPLIT("[^\\n]+|[\\n]+"), SPLIT(pgd__re_qwen2), BYTELEVEL(false)}},
    {"bloom|poro-chat|gpt3-finnish", PGD_PRE_GENERAL, 0, {SPLIT(RE_BLOOM), BYTELEVEL(false)}},
    {"viking", PGD_PRE_GENERAL, 0, {SPLIT(RE_BLOOM), DIGITS(true), BYTELEVEL(false)}},
};

const pgd_pretok_named *pgd__pretok_named(const char *name, size_t len) {
    for (size_t k = 0; k < sizeof NAMED / sizeof NAMED[0]; k++) {
        const char *p = NAMED[k].names;
        while (*p) {
            const char *bar = strchr(p, '|');
            size_t l = bar ? (size_t)(bar - p) : strlen(p);
            if (l == len && memcmp(p, name, len) == 0) return &NAMED[k];
            p += l + (bar != NULL);
        }
    }
    return NULL;
}

int pgd__pretok_named_steps(const pgd_pretok_named *nm) {
    int n = 0;
    while (n < 8 && (nm->steps[n].kind != PGD_STEP_SPLIT || nm->steps[n].pattern)) n++;
    return n;
}

/* ---- the pipeline ---- */

typedef struct step {
    uint8_t kind, behavior;
    bool invert, flag, use_regex;
    uint32_t delim;
    pgd_re *re;
} step;

struct pgd_pretok {
    step *steps;
    int n;
    pgd_re *gpt2; /* ByteLevel(use_regex) */
};

int pgd__pretok_new(pgd_pretok **out) {
    *out = calloc(1, sizeof **out);
    return *out ? 0 : PGD_ENOMEM;
}

void pgd__pretok_free(pgd_pretok *p) {
    if (!p) return;
    for (int k = 0; k < p->n; k++) pgd__re_free(p->steps[k].re);
    free(p->steps);
    pgd__re_free(p->gpt2);
    free(p);
}

int pgd__pretok_n_steps(const pgd_pretok *p) { return p->n; }

int pgd__pretok_n_bytelevel(const pgd_pretok *p) {
    int c = 0;
    for (int k = 0; k < p->n; k++) c += p->steps[k].kind == PGD_STEP_BYTELEVEL;
    return c;
}

int pgd__pretok_add(pgd_pretok *p, const pgd_pretok_step_spec *spec, char *msg, size_t msg_cap) {
    step s = {spec->kind, spec->behavior, spec->invert, spec->flag, spec->use_regex, spec->delim,
              NULL};
    int rc = 0;
    if (spec->kind == PGD_STEP_SPLIT) {
        size_t len = spec->pattern_len ? spec->pattern_len : strlen(spec->pattern);
        rc = spec->literal ? pgd__re_compile_literal(spec->pattern, len, &s.re, msg, msg_cap)
                           : pgd__re_compile(spec->pattern, len, &s.re, msg, msg_cap);
        if (rc) return rc;
    }
    if (spec->kind == PGD_STEP_BYTELEVEL && spec->use_regex && !p->gpt2) {
        rc = pgd__re_compile(pgd__re_gpt2, strlen(pgd__re_gpt2), &p->gpt2, msg, msg_cap);
        if (rc) {
            pgd__re_free(s.re);
            return rc;
        }
    }
    step *ns = realloc(p->steps, sizeof(step) * (size_t)(p->n + 1));
    if (!ns) {
        pgd__re_free(s.re);
        if (msg && msg_cap) snprintf(msg, msg_cap, "out of memory");
        return PGD_ENOMEM;
    }
    p->steps = ns;
    p->steps[p->n++] = s;
    return 0;
}

int pgd__pretok_build(const pgd_pretok_step_spec *steps, int n, pgd_pretok **out, char *msg,
                      size_t msg_cap) {
    pgd_pretok *p;
    if (pgd__pretok_new(&p)) return PGD_ENOMEM;
    for (int k = 0; k < n; k++) {
        int rc = pgd__pretok_add(p, &steps[k], msg, msg_cap);
        if (rc) {
            pgd__pretok_free(p);
            return rc;
        }
    }
    *out = p;
    return 0;
}

int pgd__pretok_for_fast(pgd_tok_pre fast, pgd_pretok **out, char *msg, size_t msg_cap) {
    const pgd_pretok_step_spec bl_regex = BYTELEVEL(true), bl = BYTELEVEL(false);
    const pgd_pretok_step_spec digits = DIGITS(true);
    pgd_pretok_step_spec s[2];
    int n = 2;
    switch (fast) {
    case PGD_PRE_GPT2: s[0] = bl_regex, n = 1; break;
    case PGD_PRE_SMOLLM: s[0] = digits, s[1] = bl_regex; break;
    case PGD_PRE_LLAMA3: s[0] = (pgd_pretok_step_spec)SPLIT(pgd__re_llama3), s[1] = bl; break;
    case PGD_PRE_QWEN2: s[0] = (pgd_pretok_step_spec)SPLIT(pgd__re_qwen2), s[1] = bl; break;
    case PGD_PRE_TEKKEN: s[0] = (pgd_pretok_step_spec)SPLIT(pgd__re_tekken), s[1] = bl; break;
    default:
        if (msg && msg_cap) snprintf(msg, msg_cap, "no pipeline for this pre-tokenizer");
        return PGD_EUNSUPPORTED;
    }
    return pgd__pretok_build(s, n, out, msg, msg_cap);
}

/* ---- running ---- */

typedef struct piece {
    uint32_t a, b; /* character indices in the current view */
} piece;

/* The current text and its decoded view. */
typedef struct view {
    const char *text;
    size_t len;
    bool bytes; /* byte-level view: character i is byte i */
    uint32_t *cp, *off;
    uint8_t *cat;
    uint32_t m;
} view;

/* Segments (HF's (offsets, is_match) list) into pieces, by behavior. One piece is held back so
 * a later segment can extend it (Contiguous, MergedWithPrevious) or start it earlier
 * (MergedWithNext); empty pieces are dropped as they leave, as HF's split drops them. */
typedef struct sink {
    piece *out;
    size_t n;
    uint8_t beh;
    bool invert;
    uint32_t base; /* the piece's first character: segments are relative to it */
    bool has, hold_match, prev_match;
    uint32_t hs, he;
} sink;

static inline void sink_put(sink *k, uint32_t s, uint32_t e) {
    if (s != e) k->out[k->n++] = (piece){k->base + s, k->base + e};
}

static inline void sink_flush(sink *k) {
    if (k->has) sink_put(k, k->hs, k->he);
    k->has = false;
}

static void sink_begin(sink *k, uint32_t base) {
    k->base = base;
    k->has = k->hold_match = k->prev_match = false;
}

static void sink_seg(sink *k, uint32_t s, uint32_t e, bool m) {
    m = m != k->invert;
    switch (k->beh) {
    case PGD_SPLIT_REMOVED:
        if (!m) sink_put(k, s, e);
        return;
    case PGD_SPLIT_ISOLATED: sink_put(k, s, e); return;
    case PGD_SPLIT_CONTIGUOUS:
        if (k->has && m == k->prev_match) k->he = e;
        else sink_flush(k), k->has = true, k->hs = s, k->he = e;
        k->prev_match = m;
        return;
    case PGD_SPLIT_MERGED_PREV:
        if (m && !k->prev_match && k->has) k->he = e;
        else sink_flush(k), k->has = true, k->hs = s, k->he = e;
        k->prev_match = m;
        return;
    default: /* MERGED_NEXT */
        if (k->has && k->hold_match && !m) s = k->hs;
        else sink_flush(k);
        k->has = true, k->hs = s, k->he = e, k->hold_match = m;
        return;
    }
}

static void sink_end(sink *k) { sink_flush(k); }

typedef struct match_ctx {
    sink *k;
    uint32_t prev;
} match_ctx;

static int on_match(void *vctx, uint32_t s, uint32_t e) {
    match_ctx *c = vctx;
    if (c->prev != s) sink_seg(c->k, c->prev, s, false);
    sink_seg(c->k, s, e, true);
    c->prev = e;
    return 0;
}

static int split_regex(const pgd_re *re, const view *v, piece pc, sink *k, pgd_re_scratch *rs) {
    pgd_re_subject subj = {v->cp + pc.a, v->cat + pc.a, pc.b - pc.a};
    match_ctx c = {k, 0};
    sink_begin(k, pc.a);
    int rc = pgd__re_find_iter(re, &subj, rs, on_match, &c);
    if (rc) return rc;
    if (c.prev != subj.n) sink_seg(k, c.prev, subj.n, false);
    sink_end(k);
    return 0;
}

static bool is_punct(uint32_t c, unsigned cat) {
    if (c < 128)
        return (c >= '!' && c <= '/') || (c >= ':' && c <= '@') || (c >= '[' && c <= '`') ||
               (c >= '{' && c <= '~');
    unsigned g = cat & PGD_GCP_GC;
    return g >= PGD_GC_PC && g <= PGD_GC_PO;
}

/* Splits on the characters a predicate picks: each one a match of its own (HF's Pattern for a
 * char predicate), the runs between them non-matches. */
static void split_chars(const step *st, const view *v, piece pc, sink *k) {
    sink_begin(k, pc.a);
    uint32_t last = 0, len = pc.b - pc.a;
    for (uint32_t i = 0; i < len; i++) {
        uint32_t c = v->cp[pc.a + i];
        unsigned cat = v->cat[pc.a + i], g = cat & PGD_GCP_GC;
        bool hit;
        switch (st->kind) {
        case PGD_STEP_DIGITS: hit = g >= PGD_GC_ND && g <= PGD_GC_NO; break;
        case PGD_STEP_PUNCT: hit = is_punct(c, cat); break;
        case PGD_STEP_WS_SPLIT: hit = (cat & PGD_GCP_WS) != 0; break;
        default: hit = c == st->delim; break;
        }
        if (!hit) continue;
        if (last < i) sink_seg(k, last, i, false);
        sink_seg(k, i, i + 1, true);
        last = i + 1;
    }
    if (len > last) sink_seg(k, last, len, false);
    sink_end(k);
}

/* Decodes v->text into the view arrays (sized for len + 1 characters). */
static void view_decode(view *v) {
    v->m = pgd__re_decode(v->text, v->len, v->bytes, v->cp, v->cat, v->off);
}

static int view_alloc(view *v, pgd_pretok_scratch *sc, size_t len) {
    size_t n = len + 1;
    char *mem = pgd__tok_scratch_get(&sc->chars, n * (4 + 4 + 1) + 8);
    if (!mem) return PGD_ENOMEM;
    v->cp = (uint32_t *)mem;
    v->off = v->cp + n;
    v->cat = (uint8_t *)(v->off + n);
    return 0;
}

void pgd__pretok_scratch_free(pgd_pretok_scratch *sc) {
    free(sc->fast.buf);
    free(sc->text.buf);
    free(sc->chars.buf);
    free(sc->pieces.buf);
    free(sc->re.memo.buf);
    free(sc->re.frames.buf);
    free(sc->re.runs.buf);
    memset(sc, 0, sizeof *sc);
}

int pgd__pretok_run(const pgd_pretok *p, const char *s, size_t n, pgd_pretok_fn fn, void *ctx,
                    pgd_pretok_scratch *sc) {
    if (n == 0) return 0;
    if (n >= UINT32_MAX / 4) return PGD_ERANGE;
    /* room for the text doubled (a prefix space before every piece, at most one a byte) */
    size_t cap = 2 * n + 2;
    view v = {s, n, false, NULL, NULL, NULL, 0};
    int rc = view_alloc(&v, sc, cap);
    if (rc) return rc;
    piece *bufs = pgd__tok_scratch_get(&sc->pieces, sizeof(piece) * 2 * (cap + 1));
    if (!bufs) return PGD_ENOMEM;
    view_decode(&v);
    piece *cur = bufs, *nxt = bufs + cap + 1;
    size_t nc = 1;
    cur[0] = (piece){0, v.m};
    sink k = {0};
    for (int si = 0; si < p->n; si++) {
        const step *st = &p->steps[si];
        if (st->kind == PGD_STEP_BYTELEVEL) {
            if (st->flag && !v.bytes) {
                /* add_prefix_space: a space before every piece that does not start with one */
                char *t = pgd__tok_scratch_get(&sc->text, v.len + nc + 1);
                if (!t) return PGD_ENOMEM;
                size_t w = 0;
                for (size_t i = 0; i < nc; i++) {
                    uint32_t a = v.off[cur[i].a], b = v.off[cur[i].b];
                    size_t start = w;
                    if (v.text[a] != ' ') t[w++] = ' ';
                    memcpy(t + w, v.text + a, b - a);
                    w += b - a;
                    nxt[i] = (piece){(uint32_t)start, (uint32_t)w}; /* bytes for now */
                }
                v.text = t, v.len = w;
                view_decode(&v);
                /* byte offsets -> character indices (both increase) */
                uint32_t ci = 0;
                for (size_t i = 0; i < nc; i++) {
                    while (v.off[ci] < nxt[i].a) ci++;
                    uint32_t a = ci;
                    while (v.off[ci] < nxt[i].b) ci++;
                    cur[i] = (piece){a, ci};
                }
            }
            if (st->use_regex) {
                k.out = nxt, k.n = 0, k.beh = PGD_SPLIT_ISOLATED, k.invert = false;
                for (size_t i = 0; i < nc; i++)
                    if ((rc = split_regex(p->gpt2, &v, cur[i], &k, &sc->re))) return rc;
                piece *t = cur;
                cur = nxt, nxt = t, nc = k.n;
            }
            if (!v.bytes) { /* from here on the pieces' characters are their bytes, mapped */
                for (size_t i = 0; i < nc; i++) cur[i] = (piece){v.off[cur[i].a], v.off[cur[i].b]};
                v.bytes = true;
                if (si + 1 < p->n) view_decode(&v); /* a later step looks at them */
            }
            continue;
        }
        k.out = nxt, k.n = 0, k.beh = st->behavior, k.invert = st->invert;
        if (st->kind == PGD_STEP_DIGITS)
            k.beh = st->flag ? PGD_SPLIT_ISOLATED : PGD_SPLIT_CONTIGUOUS, k.invert = false;
        else if (st->kind == PGD_STEP_WS_SPLIT || st->kind == PGD_STEP_CHAR_DELIM)
            k.beh = PGD_SPLIT_REMOVED, k.invert = false;
        for (size_t i = 0; i < nc; i++) {
            if (st->kind == PGD_STEP_SPLIT) {
                if ((rc = split_regex(st->re, &v, cur[i], &k, &sc->re))) return rc;
            } else {
                split_chars(st, &v, cur[i], &k);
            }
        }
        piece *t = cur;
        cur = nxt, nxt = t, nc = k.n;
    }
    for (size_t i = 0; i < nc; i++) {
        uint32_t a = v.bytes ? cur[i].a : v.off[cur[i].a], b = v.bytes ? cur[i].b : v.off[cur[i].b];
        if ((rc = fn(ctx, v.text + a, b - a))) return rc;
    }
    return 0;
}

/* ---- the engine alone (tokenizer.h) ---- */

struct pgd_split_regex {
    pgd_pretok *p;
};

int pgd_split_regex_new(const char *pattern, const char *behavior, bool invert,
                        pgd_split_regex **out, pgd_err *err) {
    static const char *const names[] = {"Removed", "Isolated", "MergedWithPrevious",
                                        "MergedWithNext", "Contiguous"};
    int beh = -1;
    for (int k = 0; k < 5; k++)
        if (strcmp(behavior, names[k]) == 0) beh = k;
    if (beh < 0) return pgd_err_set(err, PGD_EINVAL, "unknown split behavior '%s'", behavior);
    pgd_pretok_step_spec sp = SPLIT(pattern);
    sp.behavior = (uint8_t)beh;
    sp.invert = invert;
    pgd_split_regex *r = calloc(1, sizeof *r);
    if (!r) return pgd_err_set(err, PGD_ENOMEM, "out of memory");
    char msg[200];
    int rc = pgd__pretok_build(&sp, 1, &r->p, msg, sizeof msg);
    if (rc) {
        free(r);
        return pgd_err_set(err, rc, "pattern '%.80s': %s", pattern, msg);
    }
    *out = r;
    return 0;
}

int pgd_split_regex_run(const pgd_split_regex *r, const char *text, size_t len,
                        int (*fn)(void *ctx, const char *piece, size_t len), void *ctx) {
    pgd_pretok_scratch sc;
    memset(&sc, 0, sizeof sc);
    int rc = pgd__pretok_run(r->p, text, len, fn, ctx, &sc);
    pgd__pretok_scratch_free(&sc);
    return rc;
}

void pgd_split_regex_free(pgd_split_regex *r) {
    if (!r) return;
    pgd__pretok_free(r->p);
    free(r);
}
