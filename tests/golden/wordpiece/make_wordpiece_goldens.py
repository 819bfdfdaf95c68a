#!/usr/bin/env python3
"""WordPiece test vocabularies and golden ids for mt's BertWordPiece tokenizers (lib/text/wordpiece.h).

1. Trains two vocabularies with Hugging Face tokenizers' WordPiece trainer (BertWordPieceTokenizer,
   the BERT normalizer of each casing) on the repository's corpus, data/demo/tinyshakespeare.txt
   and data/corpus/war_and_peace_pg2600.txt: vocab-uncased.txt (BertWordPieceLowerCase) and
   vocab-cased.txt (BertWordPieceCase), VOCAB_SIZE tokens each, BERT's five special tokens first.
2. Encodes with the reference (tokenizers' BertWordPieceTokenizer over each vocab.txt; for the cased
   one the 100 special tokens <extra_id_0..99> Megatron-Core's BertWordPieceCase adds) and decodes
   the ids back (decode with skip_special_tokens=False):
     torture.jsonl  every text of tests/golden/tokenizer/edge_cases.jsonl and testvectors.jsonl and
                    cases of ours (source "mt"): full ids and decoded text per vocabulary
     random.jsonl   the 10,000 strings of the tokenizer goldens (random_00..03.jsonl): per
                    vocabulary [id count, FNV-1a 64 of the ids] and FNV-1a 64 of the decoded text
   and for every text the words of the reference's normalizer + pre-tokenizer ("<key>_words": the
   list in torture.jsonl, [count, FNV-1a 64 of each word's UTF-8 followed by a zero byte] elsewhere),
   which checks the basic tokenizer on text whose words the small vocabularies make [UNK]
     corpora.jsonl  the two corpus files, each as one text, the same way
     meta.json      versions, vocabulary sizes, special ids, and one text with add_special_tokens
Texts are encoded with encode_special_tokens=True (special-token text stays text) unless the record
says "allow_special": true. FNV-1a 64: offset 0xcbf29ce484222325, prime 0x100000001b3, over the ids
as little-endian int32 (tests/golden/tokenizer/README.md) or over the decoded UTF-8.
Run by regenerate.sh (a venv with tokenizers==0.23.3); see README.md.
"""
import json
import struct
import sys
from pathlib import Path

import tokenizers
from tokenizers import BertWordPieceTokenizer

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
CORPORA = [ROOT / "data/demo/tinyshakespeare.txt", ROOT / "data/corpus/war_and_peace_pg2600.txt"]
TOKENIZER_GOLDENS = ROOT / "tests/golden/tokenizer"
VOCAB_SIZE = 3000
SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
EXTRA_IDS = [f"<extra_id_{i}>" for i in range(100)]
VOCABS = {"uncased": ("vocab-uncased.txt", True), "cased": ("vocab-cased.txt", False)}

OUR_CASES = [
    ("accents_upper", "ÉCOLE Ærø Ñandú Ångström İstanbul ǅemal straße STRASSE"),
    ("greek_final_sigma", "ΟΔΟΣ Σίσυφος ὀδυσσεύς"),
    ("cjk_and_compat", "中文字符和日本語のかな、한국어 조선말 豈更車"),
    ("cjk_extensions", "\U00020000\U0002A700\U0002B740\U0002B920\U0002F800 㐀䶿"),
    ("hangul_syllables", "가각갂 힣 ᄀ ᅡ"),
    ("punct_ascii_symbols", "a$b+c<d=e>f^g`h|i~j #1 @x"),
    ("punct_unicode", "«quote» ‹x› —dash– ‘s’ “d” ¿q? ¡e! §7 ¶ ·"),
    ("symbols_not_punct", "a©b®c°d±e×f÷g€h™i"),
    ("controls_and_format", "a\u0000b\u0001c\u007fd\u0085e\u200bf\u200eg\ufeffh\u00adi\ufffdj"),
    ("private_use", "x\ue000y\U000f0001z\U0010fffd"),
    ("whitespace_kinds", "a\u00a0b\u1680c\u2000d\u2028e\u2029f\u3000g\u202fh\u205fi"),
    ("combining_marks", "e\u0301 a\u0308\u0304 n\u0303 \u0915\u093f \u0e01\u0e34 \u05e9\u05bc"),
    ("combining_spacing", "\U0001D165\U0001D16D \u302e\u302f x\u0903"),
    ("word_100_chars", "a" * 100),
    ("word_101_chars", "a" * 101),
    ("word_100_accented", "é" * 100),
    ("unknown_piece", "qqqqzzzzxxxxjjjj zzz"),
    ("digits_and_numbers", "3.14159 1,000,000 ½ ² ① ٣"),
    ("emoji", "👍🏽 🇺🇸 ❤️ 👨\u200d👩\u200d👧"),
    ("special_text_plain", "[CLS] hello [SEP] [MASK] [UNK] <extra_id_0> [cls]"),
    ("decode_cleanup", "Hello , world ! Is it ? Yes . I ' m, don ' t n't do not it 's we 've they 're"),
    ("hash_prefix_text", "##ing ## #"),
    ("newlines_tabs", "a\nb\r\nc\td\x0be\x0cf"),
]
SPECIAL_CASES = [
    ("special_bert", "[CLS] hello [SEP] world[MASK]x [PAD][UNK]"),
    ("special_extra_ids", "<extra_id_0> a <extra_id_99><extra_id_5>b <extra_id_100>"),
    ("special_lowercase_text", "[cls] [Sep] [MASK]"),
]

FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3


def fnv1a64(data):
    value = FNV_OFFSET
    for byte in data:
        value = ((value ^ byte) * FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return f"{value:016x}"


def ids_hash(ids):
    return [len(ids), fnv1a64(struct.pack(f"<{len(ids)}i", *ids))]


def train_vocabs():
    files = [str(path) for path in CORPORA]
    for key, (file_name, lowercase) in VOCABS.items():
        trainer_tokenizer = BertWordPieceTokenizer(lowercase=lowercase)
        trainer_tokenizer.train(files, vocab_size=VOCAB_SIZE, min_frequency=2, limit_alphabet=1000,
                                special_tokens=SPECIAL_TOKENS, wordpieces_prefix="##", show_progress=False)
        trainer_tokenizer.save_model(str(HERE), key)
        (HERE / f"{key}-vocab.txt").rename(HERE / file_name)


def reference(key):
    file_name, lowercase = VOCABS[key]
    tokenizer = BertWordPieceTokenizer(str(HERE / file_name), lowercase=lowercase)
    if not lowercase:
        tokenizer.add_special_tokens(EXTRA_IDS)  # Megatron-Core's BertWordPieceCase
    return tokenizer


def encode(tokenizer, text, allow_special):
    tokenizer._tokenizer.encode_special_tokens = not allow_special  # the wrapper does not forward it
    return tokenizer.encode(text, add_special_tokens=False).ids


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


def random_texts():
    for part in range(4):
        with open(TOKENIZER_GOLDENS / f"random_{part:02d}.jsonl", encoding="utf-8") as handle:
            for index, line in enumerate(handle):
                yield {"file": f"random_{part:02d}.jsonl", "index": index, "text": json.loads(line)["text"]}


def words(tokenizer, text):
    """The reference's normalized, pre-tokenized words (what BertBasicTokenizer must give)."""
    normalized = tokenizer.normalizer.normalize_str(text)
    return [word for word, _ in tokenizer.pre_tokenizer.pre_tokenize_str(normalized)]


def words_hash(word_list):
    return [len(word_list), fnv1a64(b"".join(word.encode("utf-8") + b"\x00" for word in word_list))]


def write_jsonl(path, records):
    with open(path, "w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=True, separators=(",", ":")) + "\n")


def main():
    train_vocabs()
    refs = {key: reference(key) for key in VOCABS}
    torture = []
    for record in torture_texts():
        for key, tokenizer in refs.items():
            ids = encode(tokenizer, record["text"], record.get("allow_special", False))
            record[key] = ids
            record[key + "_words"] = words(tokenizer, record["text"])
            record[key + "_decoded"] = tokenizer.decode(ids, skip_special_tokens=False)
        torture.append(record)
    write_jsonl(HERE / "torture.jsonl", torture)

    randoms = []
    for record in random_texts():
        out = {"file": record["file"], "index": record["index"]}
        for key, tokenizer in refs.items():
            ids = encode(tokenizer, record["text"], False)
            out[key] = ids_hash(ids)
            out[key + "_words"] = words_hash(words(tokenizer, record["text"]))
            out[key + "_decoded"] = fnv1a64(tokenizer.decode(ids, skip_special_tokens=False).encode("utf-8"))
        randoms.append(out)
    write_jsonl(HERE / "random.jsonl", randoms)

    corpora = []
    for path in CORPORA:
        text = path.read_bytes().decode("utf-8")  # as bytes: CR LF stays CR LF
        out = {"corpus": str(path.relative_to(ROOT)), "bytes": len(text.encode("utf-8"))}
        for key, tokenizer in refs.items():
            ids = encode(tokenizer, text, False)
            out[key] = ids_hash(ids)
            out[key + "_words"] = words_hash(words(tokenizer, text))
            out[key + "_decoded"] = fnv1a64(tokenizer.decode(ids, skip_special_tokens=False).encode("utf-8"))
        corpora.append(out)
    write_jsonl(HERE / "corpora.jsonl", corpora)

    meta = {"tokenizers": tokenizers.__version__, "python": sys.version.split()[0], "vocab_size_trained": VOCAB_SIZE,
            "corpora": [str(path.relative_to(ROOT)) for path in CORPORA]}
    for key, tokenizer in refs.items():
        tokenizer._tokenizer.encode_special_tokens = True
        meta[key] = {
            "vocab_file": VOCABS[key][0],
            "vocab_size": tokenizer.get_vocab_size(with_added_tokens=True),
            "special_ids": {token: tokenizer.token_to_id(token) for token in SPECIAL_TOKENS + EXTRA_IDS
                            if tokenizer.token_to_id(token) is not None},
            "with_special_tokens": {"text": "Hello, World!",
                                    "ids": tokenizer.encode("Hello, World!", add_special_tokens=True).ids},
        }
    (HERE / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"torture {len(torture)}, random {len(randoms)}, corpora {len(corpora)}", file=sys.stderr)


if __name__ == "__main__":
    main()
