#!/usr/bin/python3
"""Golden ids of the SentencePiece test models, from the reference (Debian's python3-sentencepiece).

For each model made by make_models.py (llama_style_2k, nfkc_4k, identity_1k) writes goldens.jsonl,
one record a line:
  {"model", "set": "edge_cases", "index", "text", "ids", "decoded"}
      the 49 strings of tests/golden/tokenizer/edge_cases.jsonl (data/corpus/edge_cases.jsonl with
      its lone surrogate already replaced, and the tokenizer goldens' own cases): full ids, and
      decode(ids)
  {"model", "set": "random_NN", "first", "count", "tokens", "ids_fnv", "decoded_fnv"}
      the 10,000 random strings of the tokenizer goldens (random_00.jsonl .. random_03.jsonl) in blocks of 100
  {"model", "set": "<file>", "first", "count", ...}  the corpus files line by line in blocks of
      1,000 lines (each line without its "\n"), and {"set": "<file>", "first": -1, ...} the whole
      file as one text; files: data/demo/tinyshakespeare.txt, data/corpus/war_and_peace_pg2600.txt
  {"model", "set": "decode", "index", "ids", "decoded"}
      300 seeded random id sequences (any id, and runs of byte, control and unknown pieces):
      decoding only
Hashes are FNV-1a 64 (hex): ids_fnv over, per text in order, its id count and its ids as
little-endian int32; decoded_fnv over, per text, the UTF-8 of decode(encode(text)) and one 0xFF byte.
Encoding is sentencepiece's default: no BOS, no EOS, no sampling.
Usage: tests/golden/sentencepiece/make_goldens.py [--data DIR] [--out DIR]
"""
import argparse
import json
import os
import random
import struct
import sys

import sentencepiece as spm

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
MODELS = ["llama_style_2k", "nfkc_4k", "identity_1k"]
CORPORA = ["demo/tinyshakespeare.txt", "corpus/war_and_peace_pg2600.txt"]
SEED = 20261127


class Fnv:
    def __init__(self):
        self.state = 0xCBF29CE484222325

    def add(self, data):
        state = self.state
        for byte in data:
            state = ((state ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
        self.state = state

    def hex(self):
        return f"{self.state:016x}"


def block_record(sp, model, name, first, texts):
    ids_hash, text_hash, tokens = Fnv(), Fnv(), 0
    for text in texts:
        ids = sp.encode(text)
        tokens += len(ids)
        ids_hash.add(struct.pack(f"<i{len(ids)}i", len(ids), *ids))
        text_hash.add(sp.decode(ids).encode("utf-8") + b"\xff")
    return {"model": model, "set": name, "first": first, "count": len(texts), "tokens": tokens,
            "ids_fnv": ids_hash.hex(), "decoded_fnv": text_hash.hex()}


def decode_sequences(sp, rng):
    n = sp.get_piece_size()
    special = [i for i in range(n) if sp.is_control(i) or sp.is_unknown(i) or sp.is_byte(i)]
    special += [sp.piece_to_id("\u2581")] * 4
    sequences = [[rng.randrange(n) for _ in range(rng.randrange(0, 12))] for _ in range(150)]
    sequences += [[rng.choice(special) for _ in range(rng.randrange(1, 10))] for _ in range(150)]
    return sequences


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=os.path.join(ROOT, "data"))
    parser.add_argument("--out", default=HERE)
    args = parser.parse_args()
    token_goldens = os.path.join(ROOT, "tests", "golden", "tokenizer")
    edge = [json.loads(line)["text"] for line in open(os.path.join(token_goldens, "edge_cases.jsonl"), encoding="utf-8")]
    randoms = {}
    for k in range(4):
        name = f"random_{k:02d}"
        randoms[name] = [json.loads(line)["text"]
                         for line in open(os.path.join(token_goldens, name + ".jsonl"), encoding="utf-8")]
    corpora = {}
    for path in CORPORA:
        with open(os.path.join(args.data, path), encoding="utf-8", newline="") as f:
            corpora[os.path.basename(path)] = f.read()
    records = []
    for model in MODELS:
        sp = spm.SentencePieceProcessor(model_file=os.path.join(args.out, model + ".model"))
        for index, text in enumerate(edge):
            ids = sp.encode(text)
            records.append({"model": model, "set": "edge_cases", "index": index, "text": text, "ids": ids,
                            "decoded": sp.decode(ids)})
        for name, texts in randoms.items():
            for first in range(0, len(texts), 100):
                records.append(block_record(sp, model, name, first, texts[first:first + 100]))
        for name, text in corpora.items():
            lines = text.split("\n")
            for first in range(0, len(lines), 1000):
                records.append(block_record(sp, model, name, first, lines[first:first + 1000]))
            records.append(block_record(sp, model, name, -1, [text]))
        for index, ids in enumerate(decode_sequences(sp, random.Random(SEED))):
            records.append({"model": model, "set": "decode", "index": index, "ids": ids, "decoded": sp.decode(ids)})
        print(f"make_goldens: {model} done", file=sys.stderr)
    with open(os.path.join(args.out, "goldens.jsonl"), "w", encoding="ascii") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=True) + "\n")
    meta = {"sentencepiece": spm.__version__, "seed": SEED, "records": len(records)}
    with open(os.path.join(args.out, "meta.json"), "w", encoding="ascii") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
