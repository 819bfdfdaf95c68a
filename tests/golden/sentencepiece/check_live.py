#!/usr/bin/python3
"""Live oracle for mt-tokenize's SentencePiece models: python3-sentencepiece (Debian 0.1.97).

  check_live.py encode MODEL JSONL IDS     IDS (mt-tokenize encode --format jsonl of JSONL's "text"
                                           fields) must equal sentencepiece's encode, line by line
  check_live.py dataset MODEL JSONL PREFIX PREFIX.bin/.idx (mt-tokenize --append-eod
                                           --output-format megatron) must hold, per document,
                                           sentencepiece's ids and then the model's eos (no BOS)
Prints "ok N" and exits 0, or names the first document that differs and exits 1.
"""
import json
import subprocess
import sys

import sentencepiece as spm


def fail(message):
    print(f"check_live.py: {message}", file=sys.stderr)
    sys.exit(1)


def texts(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f if line.strip()]


def main():
    mode, model, jsonl, target = sys.argv[1:5]
    sp = spm.SentencePieceProcessor(model_file=model)
    expected = [sp.encode(text) for text in texts(jsonl)]
    if mode == "encode":
        with open(target, encoding="utf-8") as f:
            got = [json.loads(line) for line in f.read().split("\n")[:-1]]
    else:
        if sp.eos_id() < 0:
            fail("the model has no eos")
        expected = [ids + [sp.eos_id()] for ids in expected]
        reader = subprocess.run([sys.executable, sys.argv[5], target], capture_output=True, text=True, check=True)
        got = [[int(t) for t in line.split(":", 1)[1].split()]
               for line in reader.stdout.splitlines() if line.startswith("sequence ")]
    if len(got) != len(expected):
        fail(f"{len(got)} documents, the reference has {len(expected)}")
    for index, (mine, reference) in enumerate(zip(got, expected)):
        if mine != reference:
            fail(f"document {index}: mt {mine[:12]}..., sentencepiece {reference[:12]}...")
    print(f"ok {len(got)}")


if __name__ == "__main__":
    main()
