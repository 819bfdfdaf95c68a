#!/usr/bin/env python3
"""Generates lib/text/wordpiece_tables.inc: what BERT's normalizer and pre-tokenizer do to each code
point, as Hugging Face tokenizers (the reference mt's WordPiece must equal) does it.

tokenizers' BertNormalizer classifies code points with the `unicode_categories` crate and Rust's std
(char::is_whitespace, char::to_lowercase) and decomposes with its own NFD tables; their Unicode
versions are not the UCD 15.0.0 of lib/text/unicode_tables.inc (e.g. unassigned U+0378 is kept
although tokenizers' comment says Cn is removed). So the tables are read off the reference itself:
for every code point c (surrogates excluded) the script asks
  BertNormalizer(lowercase=False).normalize_str(c)   -> "", " ", " c " (CJK padding) or c
  BertNormalizer(lowercase=True).normalize_str(c)    -> the same, with NFD, accent strip, lowercase
  BertPreTokenizer().pre_tokenize_str("a" + c + "a") -> whitespace (dropped), punctuation (isolated)
  NFD().normalize_str(c)                             -> its decomposition
and takes the canonical combining classes from Python's unicodedata, keeping those the reference's
NFD (older tables) honours and checking the emulated NFD against the reference's around probe
marks for every code point. It writes range tables of flags plus the uncased replacement of every code point it changes.
Every step of BertNormalizer is per code point (tokenizers' lowercase() maps char by char, with no
final-sigma rule) except NFD's canonical ordering of marks, which lib/text/wordpiece.cpp does with
the combining classes written here.

Usage (in a venv with tokenizers==0.23.3; regenerate.sh does it):
  python make_wordpiece_tables.py [--out lib/text/wordpiece_tables.inc]
"""
import argparse
import sys
import unicodedata
from pathlib import Path

import tokenizers
from tokenizers.normalizers import NFD, BertNormalizer
from tokenizers.pre_tokenizers import BertPreTokenizer

ROOT = Path(__file__).resolve().parents[3]
REMOVED, TO_SPACE, CHINESE, PUNCT, SPLIT_SPACE, UNCASED_DROP, UNCASED_MAP, DECOMPOSES = 1, 2, 4, 8, 16, 32, 64, 128


HANGUL_FIRST, HANGUL_LAST = 0xAC00, 0xD7A3


def hangul_jamo(cp):
    """The canonical decomposition of a Hangul syllable (Unicode 3.12, arithmetic)."""
    index = cp - HANGUL_FIRST
    lead, vowel, trail = 0x1100 + index // 588, 0x1161 + (index % 588) // 28, 0x11A7 + index % 28
    return chr(lead) + chr(vowel) + (chr(trail) if trail != 0x11A7 else "")


def classify():
    cased = BertNormalizer(lowercase=False)
    uncased = BertNormalizer(lowercase=True)
    nfd = NFD()
    pre = BertPreTokenizer()
    flags, mapping, decompositions, combining = {}, {}, {}, {}
    for cp in range(0x110000):
        if 0xD800 <= cp < 0xE000:
            continue
        ch = chr(cp)
        value = 0
        c_out, u_out = cased.normalize_str(ch), uncased.normalize_str(ch)
        if c_out == "":
            value |= REMOVED
            assert u_out == "", hex(cp)
        elif c_out == " ":
            value |= TO_SPACE
            assert u_out == " ", hex(cp)
        elif c_out == " " + ch + " ":
            value |= CHINESE
            assert u_out.startswith(" ") and u_out.endswith(" ") and len(u_out) >= 3, hex(cp)
            u_out = u_out[1:-1]
        else:
            assert c_out == ch, (hex(cp), c_out)
        decomposed = nfd.normalize_str(ch)
        if value & (REMOVED | TO_SPACE) == 0:
            if decomposed != ch:
                value |= DECOMPOSES
                if HANGUL_FIRST <= cp <= HANGUL_LAST:
                    assert decomposed == hangul_jamo(cp), hex(cp)  # computed in wordpiece.cpp, not stored
                else:
                    decompositions[cp] = decomposed
                # The uncased result is the per-character result of the decomposition.
                assert u_out == "".join(uncased.normalize_str(d).strip(" ") for d in decomposed), hex(cp)
            elif u_out == "":
                value |= UNCASED_DROP
            elif u_out != ch:
                value |= UNCASED_MAP
                mapping[cp] = u_out
        pieces = [p for p, _ in pre.pre_tokenize_str("a" + ch + "a")]
        if pieces == ["a", "a"]:
            value |= SPLIT_SPACE
        elif pieces == ["a", ch, "a"]:
            value |= PUNCT
        else:
            assert pieces == ["a" + ch + "a"], (hex(cp), pieces)
        if value:
            flags[cp] = value
        if unicodedata.combining(ch):
            combining[cp] = unicodedata.combining(ch)
    return flags, mapping, decompositions, combining


def reference_combining_classes(python_classes):
    """The combining classes the reference's NFD uses. Its tables are older than Python's
    unicodedata: marks assigned later (U+07FD, U+0898.., U+1AC1.. and more) are starters there. A
    mark counts as a starter when the reference does not move it before U+0345 (class 240)."""
    nfd = NFD()
    classes = {}
    for cp, value in python_classes.items():
        if value < 240 and nfd.normalize_str("a\u0345" + chr(cp)).endswith("\u0345"):
            classes[cp] = value
        elif value >= 240:
            classes[cp] = value
    return classes


def check_combining_classes(classes):
    """Emulates NFD with these classes (the reference's own single-character decompositions, then a
    stable sort of each run of marks) and compares it with the reference's NFD on every code point
    after and before marks of class 1, 230 and 240; returns the code points where they differ."""
    nfd = NFD()

    def emulated(text):
        out, run = [], []
        for ch in "".join(nfd.normalize_str(c) for c in text):
            value = classes.get(ord(ch), 0)
            if value:
                run.append((value, ch))
                continue
            out += [c for _, c in sorted(run, key=lambda item: item[0])] + [ch]
            run = []
        return "".join(out + [c for _, c in sorted(run, key=lambda item: item[0])])

    disagreements = []
    for cp in range(0x110000):
        if 0xD800 <= cp < 0xE000:
            continue
        texts = ["a" + probe + chr(cp) for probe in ("\u0334", "\u0301", "\u0345")]
        texts += ["a" + chr(cp) + probe for probe in ("\u0334", "\u0301", "\u0345")]
        if any(nfd.normalize_str(text) != emulated(text) for text in texts):
            disagreements.append(cp)
    return disagreements


def ranges(flags):
    out = []
    for cp in sorted(flags):
        if out and out[-1][1] == cp - 1 and out[-1][2] == flags[cp]:
            out[-1][1] = cp
        else:
            out.append([cp, cp, flags[cp]])
    return out


def c_string(text):
    return '"' + "".join(f"\\x{b:02x}" for b in text.encode("utf-8")) + '"'


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(ROOT / "lib/text/wordpiece_tables.inc"))
    args = parser.parse_args()
    flags, mapping, decompositions, combining = classify()
    combining = reference_combining_classes(combining)
    disagreements = check_combining_classes(combining)
    if disagreements:
        sys.exit("NFD disagrees with Python's unicodedata for " + " ".join(f"U+{cp:04X}" for cp in disagreements[:50]))
    lines = [
        f"// Generated by tests/golden/wordpiece/make_wordpiece_tables.py from HF tokenizers {tokenizers.__version__}",
        "// (BertNormalizer, NFD, BertPreTokenizer) and Python's unicodedata " + unicodedata.unidata_version +
        " (combining classes, less",
        "// the marks the reference's older NFD treats as starters). Do not edit; re-run the script. Flags: 1 removed by clean_text,",
        "// 2 whitespace made a space by clean_text, 4 CJK (padded with spaces), 8 punctuation (isolated by the",
        "// pre-tokenizer), 16 whitespace of the pre-tokenizer, 32 dropped by the uncased normalizer (accent",
        "// strip), 64 replaced by the uncased normalizer (kUncasedReplacements), 128 NFD decomposes it",
        "// (kNfdDecompositions; the Hangul syllables U+AC00..D7A3 decompose arithmetically and are not listed).",
        "// Included by lib/text/wordpiece.cpp.",
        f'constexpr char kWordPieceTablesReference[] = "tokenizers {tokenizers.__version__}";',
        "struct WordPieceFlagRange { char32_t first, last; uint8_t flags; };",
        "constexpr WordPieceFlagRange kWordPieceFlagRanges[] = {",
    ]
    for first, last, value in ranges(flags):
        lines.append(f"    {{0x{first:X}, 0x{last:X}, {value}}},")
    lines += ["};", "struct CodePointText { char32_t code_point; const char* utf8; };",
              "constexpr CodePointText kUncasedReplacements[] = {"]
    for cp in sorted(mapping):
        lines.append(f"    {{0x{cp:X}, {c_string(mapping[cp])}}},")
    lines += ["};", "constexpr CodePointText kNfdDecompositions[] = {"]
    for cp in sorted(decompositions):
        lines.append(f"    {{0x{cp:X}, {c_string(decompositions[cp])}}},")
    lines += ["};", "constexpr WordPieceFlagRange kCombiningClassRanges[] = {"]
    for first, last, value in ranges(combining):
        lines.append(f"    {{0x{first:X}, 0x{last:X}, {value}}},")
    lines.append("};")
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"{args.out}: {len(ranges(flags))} ranges, {len(mapping)} replacements, {len(decompositions)} "
          f"decompositions, {len(ranges(combining))} combining-class ranges", file=sys.stderr)


if __name__ == "__main__":
    main()
