#!/usr/bin/env python3
"""Golden token ids for mt's tokenizers, from the reference implementations.

Writes, next to this script (or --out DIR), JSONL files of the ids that the references give for
  edge_cases.jsonl   data/corpus/edge_cases.jsonl plus a few cases of our own (some with
                     "allow_special": true, i.e. special-token text becomes its id)
  testvectors.jsonl  llama.cpp's 46 tokenizer test strings (with llama.cpp's expected ids)
  random_NN.jsonl    ~10,000 seeded random strings of code points assigned in Unicode 15.0.0
  corpora.jsonl      per document of the big corpora: id count and FNV-1a 64 of the ids
and meta.json (versions, seed, disagreement counts between references).

References (tiktoken and HF tokenizers from PyPI; tiktoken is given the local rank files, it never
downloads anything):
  gpt2     tiktoken r50k_base (GPT-2 pattern, <|endoftext|>=50256)
  gpt2_hf  HF tokenizers, gpt2-hf/tokenizer.json
  cl100k   tiktoken cl100k_base
  llama3   tiktoken with Meta's llama3 tokenizer.model, pattern and 256 special tokens
Every string is encoded without special tokens (tiktoken encode_ordinary; HF with
encode_special_tokens=True) unless its record says "allow_special": true.

The tokenizer files and corpora are the repository's data/ (data/tokenizers, data/corpus and
data/demo/tinyshakespeare.txt); the JSONL corpora tinyshakespeare.jsonl and war_and_peace.jsonl are
those texts split by the rules of data/corpus/SOURCES.md (corpus_documents below).
Run by regenerate.sh (which makes a venv with the pinned versions); see README.md.
"""
import argparse
import bisect
import json
import random
import re
import struct
import sys
import time
from pathlib import Path

import tiktoken
import tiktoken.load
import tokenizers

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]

# tiktoken 0.14.0 tiktoken_ext/openai_public.py (r50k_pat_str and cl100k_base's pat_str).
R50K_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
CL100K_PATTERN = (r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|"""
                  r"""\s++$|\s*[\r\n]|\s+(?!\S)|\s""")
# Meta's llama3 tokenizer.py (meta-llama/llama3, llama/tokenizer.py pat_str).
LLAMA3_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
                  r"""\s*[\r\n]+|\s+(?!\S)|\s+""")
# The original patterns (GPT-2's encoder.py; tiktoken's cl100k before it switched to possessive
# quantifiers and added `\s++$`): used only to count where the pattern change alone matters.
GPT2_ORIGINAL_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
CL100K_SPECIALS = {"<|endoftext|>": 100257, "<|fim_prefix|>": 100258, "<|fim_middle|>": 100259,
                   "<|fim_suffix|>": 100260, "<|endofprompt|>": 100276}

REFS = ("gpt2", "gpt2_hf", "cl100k", "llama3")

FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3


def fnv1a64_ids(ids):
    """FNV-1a 64 over the ids as little-endian int32 bytes (the C++ test computes the same)."""
    h = FNV_OFFSET
    for b in struct.pack("<%di" % len(ids), *ids):
        h = ((h ^ b) * FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % h


def llama3_specials():
    names = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
             "<|reserved_special_token_1|>", "<|reserved_special_token_2|>", "<|reserved_special_token_3|>",
             "<|start_header_id|>", "<|end_header_id|>", "<|reserved_special_token_4|>", "<|eot_id|>"]
    names += ["<|reserved_special_token_%d|>" % i for i in range(5, 256 - 5)]
    assert len(names) == 256
    return {name: 128000 + i for i, name in enumerate(names)}


class References:
    def __init__(self, tok_dir):
        self.encs = {
            "gpt2": tiktoken.Encoding(
                "r50k_base", pat_str=R50K_PATTERN,
                mergeable_ranks=tiktoken.load.load_tiktoken_bpe(str(tok_dir / "r50k_base/r50k_base.tiktoken")),
                special_tokens={"<|endoftext|>": 50256}),
            "cl100k": tiktoken.Encoding(
                "cl100k_base", pat_str=CL100K_PATTERN,
                mergeable_ranks=tiktoken.load.load_tiktoken_bpe(str(tok_dir / "cl100k_base/cl100k_base.tiktoken")),
                special_tokens=CL100K_SPECIALS),
            "llama3": tiktoken.Encoding(
                "llama3", pat_str=LLAMA3_PATTERN,
                mergeable_ranks=tiktoken.load.load_tiktoken_bpe(str(tok_dir / "llama3/tokenizer.model")),
                special_tokens=llama3_specials()),
        }
        self.hf = tokenizers.Tokenizer.from_file(str(tok_dir / "gpt2-hf/tokenizer.json"))
        # Same ranks, the other pattern: not goldens, only for the pattern-difference counts.
        self.variants = {
            "gpt2": tiktoken.Encoding("r50k_orig", pat_str=GPT2_ORIGINAL_PATTERN,
                                      mergeable_ranks=self.encs["gpt2"]._mergeable_ranks, special_tokens={}),
            "cl100k": tiktoken.Encoding("cl100k_meta", pat_str=LLAMA3_PATTERN,
                                        mergeable_ranks=self.encs["cl100k"]._mergeable_ranks, special_tokens={}),
            "llama3": tiktoken.Encoding("llama3_tiktoken", pat_str=CL100K_PATTERN,
                                        mergeable_ranks=self.encs["llama3"]._mergeable_ranks, special_tokens={}),
        }

    def encode(self, name, text, allow_special=False):
        if name == "gpt2_hf":
            self.hf.encode_special_tokens = not allow_special
            return self.hf.encode(text, add_special_tokens=False).ids
        enc = self.encs[name]
        if allow_special:
            return enc.encode(text, allowed_special="all")
        return enc.encode_ordinary(text)

    def encode_batch(self, name, texts):
        if name == "gpt2_hf":
            self.hf.encode_special_tokens = True
            return [e.ids for e in self.hf.encode_batch(texts, add_special_tokens=False)]
        return self.encs[name].encode_ordinary_batch(texts)

    def record(self, text, allow_special=False, **extra):
        rec = dict(extra)
        rec["text"] = text
        if allow_special:
            rec["allow_special"] = True
        for name in REFS:
            rec[name] = self.encode(name, text, allow_special)
        return rec


def tiktoken_text(text):
    """The text tiktoken actually encodes: lone surrogates become U+FFFD (as in tiktoken's core.py)."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


# --------------------------------------------------------------------------------------------
# Unicode Character Database (Debian's unicode-data, /usr/share/unicode, version 15.0.0)

class UCD:
    def __init__(self, ucd_dir):
        self.dir = Path(ucd_dir)
        readme = (self.dir / "ReadMe.txt").read_text(encoding="utf-8")
        if "Unicode15.0.0" not in readme:
            sys.exit("make_token_goldens: %s is not the Unicode 15.0.0 UCD" % self.dir)
        self.category = {}  # cp -> general category, every assigned code point except surrogates
        first = None
        for line in (self.dir / "UnicodeData.txt").read_text(encoding="utf-8").splitlines():
            fields = line.split(";")
            cp, name, gc = int(fields[0], 16), fields[1], fields[2]
            if name.endswith(", First>"):
                first = cp
                continue
            lo = first if name.endswith(", Last>") else cp
            first = None
            if gc == "Cs":
                continue
            for c in range(lo, cp + 1):
                self.category[c] = gc
        self.white_space = sorted(self._property("PropList.txt", "White_Space"))
        self.scripts = {}
        for cp, script in self._ranges("Scripts.txt"):
            if cp in self.category:
                self.scripts.setdefault(script, []).append(cp)
        by_gc = {}
        for cp, gc in self.category.items():
            by_gc.setdefault(gc, []).append(cp)
        self.by_gc = {gc: sorted(cps) for gc, cps in by_gc.items()}
        self.marks = self.by_gc["Mn"] + self.by_gc["Mc"] + self.by_gc["Me"]
        self.numbers = self.by_gc["Nd"] + self.by_gc["Nl"] + self.by_gc["No"]
        self.punct = sorted(cp for gc in ("Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po") for cp in self.by_gc[gc])
        self.symbols = sorted(cp for gc in ("Sm", "Sc", "Sk", "So") for cp in self.by_gc[gc])
        self.letters = sorted(cp for gc in ("Lu", "Ll", "Lt", "Lm", "Lo") for cp in self.by_gc[gc])
        self.emoji_sequences = self._emoji_sequences()
        self.pictographic = sorted(cp for cp in self._property("emoji/emoji-data.txt", "Extended_Pictographic")
                                   if cp in self.category)

    def _ranges(self, path):
        for line in (self.dir / path).read_text(encoding="utf-8").splitlines():
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            cps, value = [f.strip() for f in line.split(";")[:2]]
            lo, _, hi = cps.partition("..")
            for cp in range(int(lo, 16), int(hi or lo, 16) + 1):
                yield cp, value

    def _property(self, path, prop):
        return {cp for cp, value in self._ranges(path) if value == prop}

    def _emoji_sequences(self):
        seqs = []
        for path in ("emoji/emoji-zwj-sequences.txt", "emoji/emoji-sequences.txt"):
            for line in (self.dir / path).read_text(encoding="utf-8").splitlines():
                line = line.split("#", 1)[0].strip()
                if not line:
                    continue
                cps = line.split(";")[0].strip()
                if ".." in cps:
                    continue  # ranges of single Basic_Emoji: covered by `pictographic`
                seqs.append("".join(chr(int(c, 16)) for c in cps.split()))
        assert all(ord(c) in self.category for s in seqs for c in s)
        return seqs


# --------------------------------------------------------------------------------------------
# Random strings

APOSTROPHES = ["'"] * 6 + ["\u2019", "\u2018", "\u02bc", "\uff07"]
CONTRACTION_TAILS = ["s", "t", "re", "ve", "m", "ll", "d", "S", "T", "RE", "Re", "rE", "VE", "Ve", "M", "LL",
                     "Ll", "lL", "D", "\u017f", "\u017ft", "\u212a", "\u212b", "st", "tt", "lll", "dd", "r", "v",
                     "l", "x", "", "'", "1", " s"]
ASCII_PUNCT = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"
SPECIAL_TEXTS = ["<|endoftext|>", "<|begin_of_text|>", "<|eot_id|>", "<|fim_prefix|>", "<|endofprompt|>",
                 "<|start_header_id|>", "<|reserved_special_token_7|>", "<|endoftext", "|>"]
WORDS = ("the of and to in is you that it he was for on are as with his they at be this have from or one "
         "had by word but not what all were we when your can said there use an each which she do how their "
         "if will up other about out many then them these so some her would make like him into time has look "
         "two more write go see number no way could people my than first water been call who oil its now find "
         "long down day did get come made may part Hello World Tokenizer GPT LLaMA don won shouldn it's I'm "
         "URL HTTP JSON camelCase snake_case kebab-case x y z a A I").split()


class RandomStrings:
    def __init__(self, ucd, seed):
        self.ucd = ucd
        self.rng = random.Random(seed)
        self.script_names = sorted(ucd.scripts)
        self.near_space = [0x1C, 0x1D, 0x1E, 0x1F, 0x200B, 0x200C, 0x200D, 0x2060, 0xFEFF, 0x180E, 0x00AD, 0x200E,
                           0x200F, 0x061C]
        self.private_use = [cp for cp, gc in ucd.category.items() if gc == "Co"]

    def pick(self, seq):
        return seq[self.rng.randrange(len(seq))]

    def ws(self):
        r = self.rng.random()
        if r < 0.45:
            return " "
        if r < 0.6:
            return self.pick("\t\n\r")
        return chr(self.pick(self.ucd.white_space))

    def ws_run(self):
        return "".join(self.ws() for _ in range(self.rng.choice([1, 1, 2, 2, 3, 4, 6, 9])))

    def ascii_word(self):
        w = self.pick(WORDS) if self.rng.random() < 0.6 else "".join(
            self.pick("abcdefghijklmnopqrstuvwxyz") for _ in range(self.rng.randint(1, 12)))
        r = self.rng.random()
        if r < 0.15:
            w = w.upper()
        elif r < 0.3:
            w = w.capitalize()
        return w

    def contraction(self):
        word = self.ascii_word() if self.rng.random() < 0.7 else ""
        return word + self.pick(APOSTROPHES) + self.pick(CONTRACTION_TAILS)

    def digits(self):
        r = self.rng.random()
        if r < 0.6:
            n = self.rng.choice([1, 2, 3, 3, 4, 5, 6, 7, 8, 10, 13, 17, 25])
            return "".join(self.pick("0123456789") for _ in range(n))
        if r < 0.75:
            return self.pick(["3.14", "1,000", "2024-01-01", "10:30", "1e-9", "0x1F", "v1.2.3", "50%", "$9.99"])
        return "".join(chr(self.pick(self.ucd.numbers)) for _ in range(self.rng.randint(1, 5)))

    def script_word(self, script=None):
        cps = self.ucd.scripts[script or self.pick(self.script_names)]
        return "".join(chr(self.pick(cps)) for _ in range(self.rng.randint(1, 8)))

    def marks(self):
        base = self.pick(["", "a", "e", " ", "\n", "1", "!", chr(self.pick(self.ucd.letters)), self.ascii_word()])
        return base + "".join(chr(self.pick(self.ucd.marks)) for _ in range(self.rng.randint(1, 4)))

    def emoji(self):
        r = self.rng.random()
        if r < 0.5:
            s = self.pick(self.ucd.emoji_sequences)
        elif r < 0.75:
            s = chr(self.pick(self.ucd.pictographic))
            if self.rng.random() < 0.3:
                s += "\ufe0f"
            if self.rng.random() < 0.2:
                s += chr(self.rng.randint(0x1F3FB, 0x1F3FF))
        elif r < 0.9:  # regional indicators: valid or invalid flags, odd counts
            s = "".join(chr(self.rng.randint(0x1F1E6, 0x1F1FF)) for _ in range(self.rng.randint(1, 5)))
        else:  # ZWJ chain of random pictographs
            s = "\u200d".join(chr(self.pick(self.ucd.pictographic)) for _ in range(self.rng.randint(2, 4)))
        return s * self.rng.choice([1, 1, 1, 2, 3])

    def newlines(self):
        parts = [self.pick(["\n", "\r", "\r\n", "\r\n", "\n\n", " ", "\t", "  ", "\u2028", "\x85", "\x0b", "\x0c"])
                 for _ in range(self.rng.randint(1, 6))]
        return "".join(parts)

    def punct(self):
        r = self.rng.random()
        if r < 0.6:
            return "".join(self.pick(ASCII_PUNCT) for _ in range(self.rng.randint(1, 6)))
        pool = self.ucd.punct if r < 0.8 else self.ucd.symbols
        return "".join(chr(self.pick(pool)) for _ in range(self.rng.randint(1, 4)))

    def odd(self):
        r = self.rng.random()
        if r < 0.35:
            return chr(self.pick(self.near_space))
        if r < 0.55:
            return chr(self.pick(self.ucd.by_gc["Cc"]))
        if r < 0.75:
            return chr(self.pick(self.ucd.by_gc["Cf"]))
        if r < 0.85:
            return chr(self.pick(self.private_use))
        return self.pick(SPECIAL_TEXTS)

    def spaced(self):
        lead = self.ws_run() if self.rng.random() < 0.4 else self.pick([" ", " ", "  ", "\u00a0", "\u3000", "\t"])
        return lead + self.pick([self.ascii_word, self.digits, self.punct, self.marks, self.script_word,
                                 self.contraction, self.emoji])()

    def piece(self):
        gens = [(self.ascii_word, 14), (self.contraction, 8), (self.digits, 8), (self.ws_run, 10),
                (self.script_word, 14), (self.marks, 6), (self.emoji, 6), (self.newlines, 6), (self.punct, 8),
                (self.spaced, 14), (self.odd, 3)]
        total = sum(w for _, w in gens)
        x = self.rng.uniform(0, total)
        for gen, w in gens:
            x -= w
            if x <= 0:
                return gen()
        return gens[-1][0]()

    def string(self):
        return "".join(self.piece() for _ in range(self.rng.choice([1, 1, 2, 2, 3, 3, 4, 5, 6, 8])))

    def coverage(self):
        """Deterministic strings first: every White_Space code point in each context, every script."""
        out = []
        for cp in self.ucd.white_space + self.near_space:
            c = chr(cp)
            out += [c, c * 3, "a" + c + "b", "a" + c + c + "b", c + "Hello", c + c + "Hello", "x" + c,
                    "x" + c + c, c + "1", c + c + "123", c + "!", c + c + "?!", "a" + c + "\n", "a\n" + c,
                    "a" + c + "\r\n" + c + "b", "'s" + c + "'t", c + "\u0301", " " + c + "word", c + "\U0001F600"]
        for script in self.script_names:
            out.append(self.script_word(script) + " " + self.script_word(script))
        return out


# --------------------------------------------------------------------------------------------

MT_EDGE_CASES = [  # (name, text, allow_special)
    ("cl100k_ws_newline_ws_end", "a \n ", False),
    ("cl100k_newline_tab_end", "x\n\t", False),
    ("cl100k_nl_sp_nl_sp_end", "\n \n ", False),
    ("cl100k_crlf_sp_end", "word \r\n  ", False),
    ("cl100k_ws_mid", "a \n b", False),
    ("only_whitespace_mix", " \t\n\r\u00a0\u3000", False),
    ("gpt2_ws_end", "hello   ", False),
    ("contraction_kelvin_upper", "IT'S 'K '\u212a 'ſ 'İ", False),
    ("special_gpt2", "a<|endoftext|>b", True),
    ("special_gpt2_twice", "<|endoftext|><|endoftext|> x <|endoftext", True),
    ("special_llama3_chat", "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>", True),
    ("special_llama3_reserved", "<|reserved_special_token_250|><|reserved_special_token_251|>", True),
    ("special_cl100k_fim", "<|fim_prefix|>def f(<|fim_suffix|>)<|fim_middle|><|endofprompt|>", True),
    ("special_spaces", " <|endoftext|> \n<|eot_id|>\n", True),
]


def jdump(rec):
    # ASCII only: raw U+0085, U+2028 and U+2029 inside a line would split it for many tools.
    return json.dumps(rec, ensure_ascii=True, separators=(",", ":"))


def write_jsonl(path, records):
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for rec in records:
            f.write(jdump(rec) + "\n")
    return path.stat().st_size


VARIANT_NAMES = {"gpt2": "gpt2_vs_gpt2_original_pattern", "cl100k": "cl100k_vs_cl100k_with_llama3_pattern",
                 "llama3": "llama3_vs_llama3_with_cl100k_pattern"}


def disagreements(records, refs=None):
    """How many records each pair of references disagrees on. gpt2 vs gpt2_hf is the real check;
    with refs, also each tiktoken reference against the same ranks under the other pattern."""
    counts = {"gpt2_vs_gpt2_hf": sum(1 for r in records if r["gpt2"] != r["gpt2_hf"])}
    if refs is not None:
        texts = [r["text"] for r in records]
        for name, label in VARIANT_NAMES.items():
            other = refs.variants[name].encode_ordinary_batch(texts)
            counts[label] = sum(1 for r, ids in zip(records, other) if r[name] != ids)
    return counts


def variant_examples(records, refs, limit=12):
    out = {}
    for name, label in VARIANT_NAMES.items():
        out[label] = [r["text"] for r in records if not r.get("allow_special")
                      and r[name] != refs.variants[name].encode_ordinary(r["text"])][:limit]
    return out


def corpus_documents(data, name):
    """The documents of corpus `name`: a .txt is one document; the .jsonl corpora are texts split by
    the rules of data/corpus/SOURCES.md (tests/unit/text/test_tokenizer_golden.cpp does the same)."""
    shakespeare = (data / "demo/tinyshakespeare.txt").read_bytes().decode("utf-8")
    war_and_peace = (data / "corpus/war_and_peace_pg2600.txt").read_bytes().decode("utf-8")
    if name == "tinyshakespeare.txt":
        return [shakespeare]
    if name == "war_and_peace_pg2600.txt":
        return [war_and_peace]
    if name == "tinyshakespeare.jsonl":  # one document per speech; the blank line belongs to neither
        return shakespeare.split("\n\n")
    if name == "war_and_peace.jsonl":  # one document per chapter: cut before each CHAPTER heading
        cuts = [0] + [m.start() for m in re.finditer(r"\r\nCHAPTER [IVXLC]+\r\n", war_and_peace)] + [len(war_and_peace)]
        return [war_and_peace[a:b] for a, b in zip(cuts, cuts[1:]) if b > a]
    raise ValueError("unknown corpus " + name)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(ROOT / "data"), help="the data folder (default: the repository's data/)")
    ap.add_argument("--ucd", default="/usr/share/unicode", help="Unicode 15.0.0 UCD (Debian unicode-data)")
    ap.add_argument("--out", default=str(HERE), help="output folder (default: this script's folder)")
    ap.add_argument("--seed", type=int, default=20260415)
    ap.add_argument("--random-count", type=int, default=10000)
    ap.add_argument("--random-per-file", type=int, default=2500)
    args = ap.parse_args()
    data, out = Path(args.data), Path(args.out)
    tok_dir, corpus_dir = data / "tokenizers", data / "corpus"
    out.mkdir(parents=True, exist_ok=True)
    refs = References(tok_dir)
    meta = {"generator": "tests/golden/tokenizer/make_token_goldens.py", "tiktoken": tiktoken.__version__,
            "tokenizers": tokenizers.__version__, "python": sys.version.split()[0], "unicode": "15.0.0",
            "seed": args.seed, "fnv": "FNV-1a 64 over ids as little-endian int32 bytes", "files": {},
            "disagreements": {}}
    t0 = time.time()

    # Edge cases: data/corpus/edge_cases.jsonl, then ours.
    edge = []
    for line in (corpus_dir / "edge_cases.jsonl").read_text(encoding="utf-8").splitlines():
        case = json.loads(line)
        text = tiktoken_text(case["text"])
        extra = {"name": case["name"], "source": "corpus/edge_cases.jsonl"}
        if text != case["text"]:
            extra["original_text_had_lone_surrogates"] = True
        edge.append(refs.record(text, **extra))
    for name, text, allow in MT_EDGE_CASES:
        edge.append(refs.record(text, allow, name=name, source="mt"))
    meta["files"]["edge_cases.jsonl"] = {"records": len(edge), "bytes": write_jsonl(out / "edge_cases.jsonl", edge)}
    meta["disagreements"]["edge_cases.jsonl"] = disagreements([r for r in edge if not r.get("allow_special")], refs)

    # llama.cpp test vectors.
    tv_dir = tok_dir / "testvectors"
    inputs = (tv_dir / "ggml-vocab-gpt-2.gguf.inp").read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")
    assert inputs[-1] == "", "test vector file must end with the separator"
    inputs = inputs[:-1]
    expected = {}
    for ref, fname in (("llamacpp_gpt2", "ggml-vocab-gpt-2.gguf.out"), ("llamacpp_llama3", "ggml-vocab-llama-bpe.gguf.out")):
        lines = (tv_dir / fname).read_text(encoding="utf-8").split("\n")
        assert lines[-1] == "" and len(lines) - 1 == len(inputs), fname
        expected[ref] = [[int(x) for x in l.split()] for l in lines[:-1]]
    tv = []
    for i, text in enumerate(inputs):
        rec = refs.record(text, index=i, source="llama.cpp models/ggml-vocab-*.gguf.inp")
        rec["llamacpp_gpt2"] = expected["llamacpp_gpt2"][i]
        rec["llamacpp_llama3"] = expected["llamacpp_llama3"][i]
        tv.append(rec)
    meta["files"]["testvectors.jsonl"] = {"records": len(tv), "bytes": write_jsonl(out / "testvectors.jsonl", tv)}
    d = disagreements(tv, refs)
    d["gpt2_vs_llamacpp_gpt2"] = sum(1 for r in tv if r["gpt2"] != r["llamacpp_gpt2"])
    d["gpt2_hf_vs_llamacpp_gpt2"] = sum(1 for r in tv if r["gpt2_hf"] != r["llamacpp_gpt2"])
    d["llama3_vs_llamacpp_llama3"] = sum(1 for r in tv if r["llama3"] != r["llamacpp_llama3"])
    meta["disagreements"]["testvectors.jsonl"] = d
    print("edge cases + test vectors: %.1fs" % (time.time() - t0), file=sys.stderr)

    # Random strings.
    gen = RandomStrings(UCD(args.ucd), args.seed)
    texts = gen.coverage()
    n_coverage = len(texts)
    seen = set(texts)
    while len(texts) < args.random_count:
        s = gen.string()
        if s not in seen:
            seen.add(s)
            texts.append(s)
    for old in out.glob("random_*.jsonl"):
        old.unlink()
    all_random = []
    for part, start in enumerate(range(0, len(texts), args.random_per_file)):
        chunk = texts[start:start + args.random_per_file]
        recs = [{"index": start + j, "text": t} for j, t in enumerate(chunk)]
        for ref in REFS:
            for rec, ids in zip(recs, refs.encode_batch(ref, chunk)):
                rec[ref] = ids
        name = "random_%02d.jsonl" % part
        meta["files"][name] = {"records": len(recs), "bytes": write_jsonl(out / name, recs)}
        all_random += recs
    meta["random"] = {"count": len(texts), "coverage_strings": n_coverage,
                      "code_points": sum(len(t) for t in texts),
                      "utf8_bytes": sum(len(t.encode("utf-8")) for t in texts)}
    meta["disagreements"]["random"] = disagreements(all_random, refs)
    meta["disagreement_examples"] = variant_examples(edge + all_random, refs)
    meta["disagreement_examples"]["gpt2_vs_gpt2_hf"] = [r["text"] for r in all_random if r["gpt2"] != r["gpt2_hf"]][:12]
    print("random strings: %.1fs" % (time.time() - t0), file=sys.stderr)

    # Big corpora: per document id count + FNV-1a 64.
    corpora = []
    for fname in ("tinyshakespeare.jsonl", "war_and_peace.jsonl", "tinyshakespeare.txt", "war_and_peace_pg2600.txt"):
        docs = corpus_documents(data, fname)
        assert all(tiktoken_text(t) == t for t in docs), fname
        ids = {ref: refs.encode_batch(ref, docs) for ref in REFS}
        for i, text in enumerate(docs):
            rec = {"corpus": fname, "doc": i if fname.endswith(".jsonl") else -1, "bytes": len(text.encode("utf-8"))}
            for ref in REFS:
                rec[ref] = [len(ids[ref][i]), fnv1a64_ids(ids[ref][i])]
            corpora.append(rec)
        print("%s: %.1fs" % (fname, time.time() - t0), file=sys.stderr)
    meta["files"]["corpora.jsonl"] = {"records": len(corpora), "bytes": write_jsonl(out / "corpora.jsonl", corpora)}
    meta["disagreements"]["corpora"] = {"gpt2_vs_gpt2_hf": sum(1 for r in corpora if r["gpt2"] != r["gpt2_hf"])}
    meta["corpus_tokens"] = {
        fname: {ref: sum(r[ref][0] for r in corpora if r["corpus"] == fname) for ref in REFS}
        for fname in dict.fromkeys(r["corpus"] for r in corpora)}
    with open(out / "meta.json", "w", encoding="utf-8") as f:
        json.dump(meta, f, ensure_ascii=False, indent=1)
        f.write("\n")
    total = sum(v["bytes"] for v in meta["files"].values())
    print(json.dumps({k: meta[k] for k in ("files", "disagreements", "random", "corpus_tokens")}, indent=1),
          file=sys.stderr)
    print("total %.2f MB in %.1fs" % (total / 1e6, time.time() - t0), file=sys.stderr)


if __name__ == "__main__":
    main()
