#!/usr/bin/env python3
"""tokenizer.json conversions of llama_style_2k.model, and their goldens from Hugging Face `tokenizers`.

Needs a venv outside the repository with pinned tokenizers, transformers (and Debian's
python3-sentencepiece, python3-protobuf through --system-site-packages), e.g.
  /usr/bin/python3 -m venv --system-site-packages /work/venv-spmjson
  /work/venv-spmjson/bin/pip install tokenizers==0.20.3 transformers==4.46.3
  /work/venv-spmjson/bin/python tests/golden/sentencepiece/make_hf_goldens.py
Writes, next to this script:
  llama_style_2k.legacy.json     LlamaTokenizerFast(legacy=True) as transformers converts LLaMA-2:
                                 normalizer Sequence[Prepend("▁"), Replace(" ", "▁")], no
                                 pre-tokenizer, BPE with byte_fallback and fuse_unk, decoder
                                 Sequence[Replace("▁", " "), ByteFallback, Fuse, Strip(" ", 1, 0)],
                                 post-processor TemplateProcessing "<s> $A"
  llama_style_2k.metaspace.json  the same with legacy=False: no normalizer, pre-tokenizer
                                 Metaspace(prepend_scheme "first", split false)
  llama_style_2k.split.json      the metaspace file with Metaspace(prepend_scheme "always", split
                                 true) and a Metaspace decoder, as older Mistral/LLaMA files
  hf_goldens.jsonl               one record a line, per file ("model" = the file name):
    {"model", "set": "edge_cases", "index", "text", "ids", "decoded", "sentencepiece_ids"}
        the 49 strings of tests/golden/tokenizer/edge_cases.jsonl and the texts of SPECIAL_TEXTS:
        encode(text, add_special_tokens=False) (tokenizers always splits out added tokens), and
        decode(ids, skip_special_tokens=False); sentencepiece_ids: what sentencepiece gives for
        the .model (it never splits out control pieces), to see where the two references differ
    {"model", "set": "sequence", "index", "text", "ids"}  encode with add_special_tokens=True
    {"model", "set": "random_NN" | "tinyshakespeare.txt", "first", "count", "tokens", "ids_fnv",
     "decoded_fnv"}  the random strings of the tokenizer goldens in blocks of 100, the demo corpus
        line by line in blocks of 1,000 lines and whole (first -1); hashes as make_goldens.py's
    {"model", "set": "decode", "index", "ids", "decoded"}  300 seeded random id sequences
  hf_meta.json                   versions, seed, record count, and per file the edge cases where
                                 tokenizers and sentencepiece give different ids
"""
import json
import os
import random
import struct
import sys

import sentencepiece as spm
import tokenizers
import transformers
from transformers import LlamaTokenizerFast

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
SEED = 20261127
MODEL = "llama_style_2k"
SPECIAL_TEXTS = ["Hello <s> world", "<s>Hello</s> world", "[INST] Hi [/INST] there", " <s>  x", "a</s>", "<s>"]


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


def convert():
    """The three tokenizer.json texts, by file name."""
    model_file = os.path.join(HERE, MODEL + ".model")
    files = {}
    for legacy, name in ((True, "legacy"), (False, "metaspace")):
        fast = LlamaTokenizerFast(vocab_file=model_file, legacy=legacy, add_prefix_space=True, from_slow=True)
        files[f"{MODEL}.{name}.json"] = json.loads(fast.backend_tokenizer.to_str())
    split = json.loads(json.dumps(files[f"{MODEL}.metaspace.json"]))
    split["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True}
    split["decoder"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True}
    files[f"{MODEL}.split.json"] = split
    return files


def block_record(tok, model, name, first, texts):
    ids_hash, text_hash, tokens = Fnv(), Fnv(), 0
    for text in texts:
        ids = tok.encode(text, add_special_tokens=False).ids
        tokens += len(ids)
        ids_hash.add(struct.pack(f"<i{len(ids)}i", len(ids), *ids))
        text_hash.add(tok.decode(ids, skip_special_tokens=False).encode("utf-8") + b"\xff")
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
    token_goldens = os.path.join(ROOT, "tests", "golden", "tokenizer")
    edge = [json.loads(line)["text"] for line in open(os.path.join(token_goldens, "edge_cases.jsonl"), encoding="utf-8")]
    edge += SPECIAL_TEXTS
    randoms = {}
    for k in range(4):
        name = f"random_{k:02d}"
        randoms[name] = [json.loads(line)["text"]
                         for line in open(os.path.join(token_goldens, name + ".jsonl"), encoding="utf-8")]
    with open(os.path.join(ROOT, "data", "demo", "tinyshakespeare.txt"), encoding="utf-8", newline="") as f:
        demo = f.read()
    sp = spm.SentencePieceProcessor(model_file=os.path.join(HERE, MODEL + ".model"))
    records, differences = [], {}
    for file_name, content in convert().items():
        text = json.dumps(content, ensure_ascii=False, indent=1) + "\n"
        with open(os.path.join(HERE, file_name), "w", encoding="utf-8") as f:
            f.write(text)
        tok = tokenizers.Tokenizer.from_str(text)
        differences[file_name] = []
        for index, sample in enumerate(edge):
            ids = tok.encode(sample, add_special_tokens=False).ids
            sp_ids = sp.encode(sample)
            records.append({"model": file_name, "set": "edge_cases", "index": index, "text": sample, "ids": ids,
                            "decoded": tok.decode(ids, skip_special_tokens=False), "sentencepiece_ids": sp_ids})
            if ids != sp_ids:
                differences[file_name].append(index)
        for index, sample in enumerate(SPECIAL_TEXTS + ["Hello world"]):
            records.append({"model": file_name, "set": "sequence", "index": index, "text": sample,
                            "ids": tok.encode(sample).ids})
        for name, texts in randoms.items():
            for first in range(0, len(texts), 100):
                records.append(block_record(tok, file_name, name, first, texts[first:first + 100]))
        lines = demo.split("\n")
        for first in range(0, len(lines), 1000):
            records.append(block_record(tok, file_name, "tinyshakespeare.txt", first, lines[first:first + 1000]))
        records.append(block_record(tok, file_name, "tinyshakespeare.txt", -1, [demo]))
        for index, ids in enumerate(decode_sequences(sp, random.Random(SEED))):
            records.append({"model": file_name, "set": "decode", "index": index, "ids": ids,
                            "decoded": tok.decode(ids, skip_special_tokens=False)})
        print(f"make_hf_goldens: {file_name} done", file=sys.stderr)
    with open(os.path.join(HERE, "hf_goldens.jsonl"), "w", encoding="ascii") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=True) + "\n")
    meta = {"tokenizers": tokenizers.__version__, "transformers": transformers.__version__,
            "sentencepiece": spm.__version__, "seed": SEED, "records": len(records),
            "edge_cases_where_sentencepiece_differs": differences}
    with open(os.path.join(HERE, "hf_meta.json"), "w", encoding="ascii") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
