#!/usr/bin/env python3
"""Generates src/tokenizer/unicode_tables.c from Python's unicodedata.

Tables (all sorted, searched by binary search at run time):
  - class ranges: letter (\\p{L}), number (\\p{N}), the two letter-and-mark classes of
    Mistral's Tekken regex ([\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}] and
    [\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]), whitespace (\\s as Oniguruma and the Rust regex crate
    see it: White_Space = U+0009..U+000D, U+0085, and categories Zs, Zl, Zp) and "may change
    under NFC" (the NFC quick check);
  - NFC data: canonical combining classes, canonical decompositions (one level, expanded
    recursively at run time) and primary composites (pairs that compose). Hangul syllables are
    handled algorithmically in the C code and are left out of these tables;
  - for the general pre-tokenizer regex engine (pretok_regex.c): every character's general
    category with three property bits (White_Space, Script=Han, and "in \\w beyond its
    category"), and simple case folding (pairs (character, folded) and the same pairs ordered by
    the folded one). \\w is Oniguruma's (HF tokenizers' engine): Alphabetic, marks, Nd and Pc,
    plus the Latin-1 superscripts and fractions (U+00B2 U+00B3 U+00B9 U+00BC-U+00BE) and without
    the joiners U+200C/U+200D, which Unicode's \\w (the `regex` module's) has.
Script=Han and \\w come from the `regex` module (tests/requirements.txt pulls it in through
transformers), restricted to the characters unicodedata's version assigns, so every table
speaks of one Unicode version.

Usage: python3 scripts/gen_unicode_tables.py > src/tokenizer/unicode_tables.c
"""
import sys
import unicodedata

import regex

MAX_CP = 0x110000
FLAG_L, FLAG_N, FLAG_WS, FLAG_NFC_CHECK, FLAG_UPPERISH, FLAG_LOWERISH = 1, 2, 4, 8, 16, 32


def _comp_seconds():
    out = set()
    for cp in range(MAX_CP):
        d = unicodedata.decomposition(chr(cp))
        if d and not d.startswith("<") and len(d.split()) == 2:
            out.add(int(d.split()[1], 16))
    out.update(range(0x1161, 0x1176))  # Hangul V jamo compose with a preceding L
    out.update(range(0x11A8, 0x11C3))  # Hangul T jamo compose with a preceding LV
    return out


COMP_SECONDS = _comp_seconds()


def flags_of(cp):
    c = chr(cp)
    cat = unicodedata.category(c)
    f = 0
    if cat[0] == "L":
        f |= FLAG_L
    if cat[0] == "N":
        f |= FLAG_N
    # Mistral's Tekken regex: [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}] and [\p{Ll}\p{Lm}\p{Lo}\p{M}]
    if cat in ("Lu", "Lt", "Lm", "Lo") or cat[0] == "M":
        f |= FLAG_UPPERISH
    if cat in ("Ll", "Lm", "Lo") or cat[0] == "M":
        f |= FLAG_LOWERISH
    if cat in ("Zs", "Zl", "Zp") or 0x09 <= cp <= 0x0D or cp == 0x85:
        f |= FLAG_WS
    # NFC quick check: the character may change under NFC or combine with its neighbour.
    if (unicodedata.combining(c) or unicodedata.normalize("NFC", c) != c
            or cp in COMP_SECONDS):
        f |= FLAG_NFC_CHECK
    return f


def ranges(fn):
    """[(first, last, value)] runs of equal non-zero fn(cp)."""
    out = []
    cur = None
    for cp in range(MAX_CP):
        v = fn(cp)
        if cur and v == cur[2] and cur[1] == cp - 1:
            cur[1] = cp
            continue
        if cur:
            out.append(tuple(cur))
            cur = None
        if v:
            cur = [cp, cp, v]
    if cur:
        out.append(tuple(cur))
    return out


# General categories in the order of PGD_GC_* (unicode.h); Cn (unassigned) is 0.
GC_NAMES = ["Cn", "Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd", "Nl", "No", "Pc", "Pd",
            "Ps", "Pe", "Pi", "Pf", "Po", "Sm", "Sc", "Sk", "So", "Zs", "Zl", "Zp", "Cc", "Cf",
            "Cs", "Co"]
GC_WORD = {"Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd", "Nl", "Pc"}
GCP_WS, GCP_HAN, GCP_WORDX = 32, 64, 128
ONIG_WORD_LATIN1 = (0xB2, 0xB3, 0xB9, 0xBC, 0xBD, 0xBE)
# simple foldings Unicode 15 added that Oniguruma (as HF tokenizers builds it) already has
FOLD_EXTRA = {0x1FD3: 0x390, 0x1FE3: 0x3B0}


def gcp_of(cp):
    c = chr(cp)
    cat = unicodedata.category(c)
    v = GC_NAMES.index(cat)
    if cat == "Cn":
        return 0
    if flags_of(cp) & FLAG_WS:
        v |= GCP_WS
    if regex.match(r"\p{Han}", c):
        v |= GCP_HAN
    if cat not in GC_WORD and (regex.match(r"\w", c) or cp in ONIG_WORD_LATIN1) and \
            cp not in (0x200C, 0x200D):
        v |= GCP_WORDX
    return v


def simple_fold(cp):
    """Simple case folding (CaseFolding.txt's C + S statuses) from str.upper/lower: the lower
    case of the upper case when both are one character. The dotless i and the dotted capital I
    fold only under the Turkic (T) status, which Oniguruma's default folding leaves out.
    Multi-character foldings (U+00DF ss, U+FB05 st, ...) are left out: one character matches one
    character."""
    c = chr(cp)
    if cp in (0x130, 0x131):
        return cp
    if cp in FOLD_EXTRA:
        return FOLD_EXTRA[cp]
    u = c.upper()
    if len(u) != 1:
        u = c
    lo = u.lower()
    if len(lo) != 1:
        lo = c.lower() if len(c.lower()) == 1 else c
    return ord(lo)


def is_hangul_syllable(cp):
    return 0xAC00 <= cp <= 0xD7A3


def main():
    w = sys.stdout.write
    w("/* GENERATED by scripts/gen_unicode_tables.py from Python's unicodedata (Unicode %s).\n"
      " * Do not edit by hand. */\n" % unicodedata.unidata_version)
    w('#include "tokenizer/unicode.h"\n\n')

    flag_ranges = ranges(flags_of)
    w("const pgd_uni_range pgd__uni_flag_ranges[] = {\n")
    for a, b, v in flag_ranges:
        w("    {0x%X, 0x%X, %d},\n" % (a, b, v))
    w("};\nconst int pgd__uni_n_flag_ranges = %d;\n\n" % len(flag_ranges))

    ccc_ranges = ranges(lambda cp: unicodedata.combining(chr(cp)))
    w("const pgd_uni_range pgd__uni_ccc_ranges[] = {\n")
    for a, b, v in ccc_ranges:
        w("    {0x%X, 0x%X, %d},\n" % (a, b, v))
    w("};\nconst int pgd__uni_n_ccc_ranges = %d;\n\n" % len(ccc_ranges))

    decomp = []
    comp = []
    for cp in range(MAX_CP):
        if is_hangul_syllable(cp):
            continue
        d = unicodedata.decomposition(chr(cp))
        if not d or d.startswith("<"):
            continue
        parts = [int(x, 16) for x in d.split()]
        assert 1 <= len(parts) <= 2
        decomp.append((cp, parts[0], parts[1] if len(parts) == 2 else 0))
        # A primary composite is a canonical pair decomposition that NFC recomposes.
        if len(parts) == 2 and unicodedata.normalize("NFC", chr(parts[0]) + chr(parts[1])) == chr(cp):
            comp.append((parts[0], parts[1], cp))
    w("const pgd_uni_decomp pgd__uni_decomp[] = {\n")
    for cp, a, b in decomp:
        w("    {0x%X, 0x%X, 0x%X},\n" % (cp, a, b))
    w("};\nconst int pgd__uni_n_decomp = %d;\n\n" % len(decomp))
    comp.sort()
    w("const pgd_uni_comp pgd__uni_comp[] = {\n")
    for a, b, cp in comp:
        w("    {0x%X, 0x%X, 0x%X},\n" % (a, b, cp))
    w("};\nconst int pgd__uni_n_comp = %d;\n\n" % len(comp))

    gcp = ranges(gcp_of)
    w("const pgd_uni_range pgd__uni_gcp_ranges[] = {\n")
    for a, b, v in gcp:
        w("    {0x%X, 0x%X, %d},\n" % (a, b, v))
    w("};\nconst int pgd__uni_n_gcp_ranges = %d;\n\n" % len(gcp))

    fold = [(cp, simple_fold(cp)) for cp in range(MAX_CP)
            if unicodedata.category(chr(cp)) != "Cn" and simple_fold(cp) != cp]
    w("const pgd_uni_fold pgd__uni_fold[] = {\n")
    for cp, f in fold:
        w("    {0x%X, 0x%X},\n" % (cp, f))
    w("};\nconst int pgd__uni_n_fold = %d;\n" % len(fold))
    w("const pgd_uni_fold pgd__uni_unfold[] = {\n")
    for cp, f in sorted(fold, key=lambda x: (x[1], x[0])):
        w("    {0x%X, 0x%X},\n" % (cp, f))
    w("};\n")


if __name__ == "__main__":
    main()
