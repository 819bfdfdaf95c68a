#!/usr/bin/env python3
"""A DeepSeek-V3-style tokenizer.json and golden ids for mt's Split-sequence pre-tokenizer
(lib/text/split_pretokenizer.h) through HuggingFaceTokenizer.

1. Trains a byte-level BPE (Hugging Face tokenizers' BpeTrainer, VOCAB_SIZE, min_frequency 2, the
   256-byte alphabet, special token <|endoftext|>) on data/demo/tinyshakespeare.txt and
   data/corpus/war_and_peace_pg2600.txt with DeepSeek-V3's pre-tokenizer: Sequence of the three
   Split regexes below (behavior Isolated) and ByteLevel(add_prefix_space=False, use_regex=False),
   decoder ByteLevel; writes deepseek_v3_style_tokenizer.json.
2. Encodes with the reference (tokenizers over that file, add_special_tokens=False,
   encode_special_tokens=True unless "allow_special"):
     torture.jsonl  ours (CJK, kana, digit runs, punctuation, newlines) and every text of
                    tests/golden/tokenizer/edge_cases.jsonl and testvectors.jsonl: the pieces of
                    the three Splits, the ids, and decode's text (special tokens kept, as mt does)
     random.jsonl   the 10,000 strings of the tokenizer goldens (random_00..03.jsonl): pieces and
                    ids as [count, FNV-1a 64] (pieces: each piece's UTF-8 then a zero byte; ids:
                    little-endian int32)
     corpora.jsonl  the two corpus files, each as one text: ids as [count, FNV-1a 64]
     meta.json      versions and sizes
The regexes are DeepSeek-V3's tokenizer.json (Hugging Face, deepseek-ai/DeepSeek-V3,
pre_tokenizer.pretokenizers[0..2].pattern.Regex) as Python strings after JSON decoding.
Run by regenerate.sh (a venv with tokenizers==0.23.3).
"""
import json
import struct
import sys
from pathlib import Path

import tokenizers
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
CORPORA = [ROOT / "data/demo/tinyshakespeare.txt", ROOT / "data/corpus/war_and_peace_pg2600.txt"]
TOKENIZER_GOLDENS = ROOT / "tests/golden/tokenizer"
VOCAB_SIZE = 2000
DEEPSEEK_V3_REGEXES = [
    "\\p{N}{1,3}",
    "[一-龥\u3040-ゟ゠-ヿ]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+|"
    " ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
]
OUR_CASES = [
    ("digits", "1 12 123 1234 12345 3.14159 ½²① ٣٤٥٦"),
    ("cjk_kana", "我想在apple工作1314151天～ ひらがなカタカナ ー 漢字かな混じり 龥龦 ㇰ"),
    ("ascii_punct_letters", "'s 'T $foo (bar) \"q\" x.y a-b #tag @user [x]"),
    ("punct_runs_newlines", "!!!\n\n ??\r\n... «»— ---\r\r\n"),
    ("letters_marks", "é e\u0301 \u0301a नमस्ते 1abc \u00a0word \tword"),
    ("whitespace", "a  b   \n  c \r\n\r\n d\u3000e\u2028f  "),
    ("symbols", "a+b=c 5€ ©2024 ™ ≤≥ 😀👍🏽"),
    ("controls", "a\x00b\x01c\x7fd\u200be\ufeff"),
    ("special_text", "a<|endoftext|>b"),
]
SPECIAL_CASES = [("special", "a<|endoftext|>b <|endoftext|>")]
FNV_OFFSET, FNV_PRIME = 0xCBF29CE484222325, 0x100000001B3


def fnv1a64(data):
    value = FNV_OFFSET
    for byte in data:
        value = ((value ^ byte) * FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return f"{value:016x}"


def ids_hash(ids):
    return [len(ids), fnv1a64(struct.pack(f"<{len(ids)}i", *ids))]


def pieces_hash(pieces):
    return [len(pieces), fnv1a64(b"".join(p.encode("utf-8") + b"\x00" for p in pieces))]


def train():
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False) for regex in DEEPSEEK_V3_REGEXES] +
        [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=["<|endoftext|>"])
    tokenizer.train([str(path) for path in CORPORA], trainer)
    path = HERE / "deepseek_v3_style_tokenizer.json"
    tokenizer.save(str(path))
    saved = json.loads(path.read_text())["pre_tokenizer"]["pretokenizers"]
    assert [step["pattern"]["Regex"] for step in saved[:3]] == DEEPSEEK_V3_REGEXES
    return Tokenizer.from_file(str(path))


SPLITS_ONLY = pre_tokenizers.Sequence(
    [pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False) for regex in DEEPSEEK_V3_REGEXES])


def pieces(tokenizer, text):
    """The pieces after the three Splits (before ByteLevel maps their bytes to its alphabet)."""
    return [piece for piece, _ in SPLITS_ONLY.pre_tokenize_str(text)]


def encode(tokenizer, text, allow_special=False):
    tokenizer.encode_special_tokens = not allow_special
    return tokenizer.encode(text, add_special_tokens=False).ids


def write_jsonl(path, records):
    with open(path, "w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=True, separators=(",", ":")) + "\n")


def torture_texts():
    for name, text in OUR_CASES:
        yield {"name": name, "source": "mt", "text": text}
    for name, text in SPECIAL_CASES:
        yield {"name": name, "source": "mt", "text": text, "allow_special": True}
    for file_name in ("edge_cases.jsonl", "testvectors.jsonl"):
        with open(TOKENIZER_GOLDENS / file_name, encoding="utf-8") as handle:
            for index, line in enumerate(handle):
                record = json.loads(line)
                out = {"source": f"tokenizer/{file_name}", "index": index, "text": record["text"]}
                if record.get("allow_special"):
                    out["allow_special"] = True
                yield out


def main():
    tokenizer = train()
    torture = []
    for record in torture_texts():
        ids = encode(tokenizer, record["text"], record.get("allow_special", False))
        record.update(pieces=pieces(tokenizer, record["text"]), ids=ids, decoded=tokenizer.decode(ids, skip_special_tokens=False))
        torture.append(record)
    write_jsonl(HERE / "torture.jsonl", torture)
    randoms = []
    for part in range(4):
        with open(TOKENIZER_GOLDENS / f"random_{part:02d}.jsonl", encoding="utf-8") as handle:
            for line in handle:
                text = json.loads(line)["text"]
                randoms.append({"pieces": pieces_hash(pieces(tokenizer, text)), "ids": ids_hash(encode(tokenizer, text))})
    write_jsonl(HERE / "random.jsonl", randoms)
    corpora = []
    for path in CORPORA:
        text = path.read_bytes().decode("utf-8")
        corpora.append({"corpus": str(path.relative_to(ROOT)), "bytes": len(text.encode("utf-8")),
                        "ids": ids_hash(encode(tokenizer, text))})
    write_jsonl(HERE / "corpora.jsonl", corpora)
    meta = {"tokenizers": tokenizers.__version__, "vocab_size": tokenizer.get_vocab_size(), "torture": len(torture),
            "random": len(randoms)}
    (HERE / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(meta, file=sys.stderr)


if __name__ == "__main__":
    main()
