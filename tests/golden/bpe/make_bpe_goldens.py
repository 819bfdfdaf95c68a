#!/usr/bin/env python3
"""Hugging Face tokenizers' BpeTrainer merges for mt's BPE trainer test (tests/golden/bpe).

Trains HF's byte-level BPE the way lib/text/bpe_trainer.h says mt matches it (ByteLevel
pre-tokenizer without prefix space, the 256 ByteLevel characters as initial alphabet,
"<|endoftext|>" as the one special token, min_frequency 2) on a corpus read as one document, and
writes the merges in GPT-2's vocab.bpe form ("#version: 0.2", then one "left right" line per
merge in rank order). Run by make_bpe_goldens.sh inside a venv with `tokenizers`; never in CI.

    make_bpe_goldens.py --corpus FILE --vocab-size N --out MERGES.txt
"""
import argparse
import json

import tokenizers
from tokenizers import Tokenizer, models, pre_tokenizers, trainers


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", required=True)
    parser.add_argument("--vocab-size", type=int, required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    with open(args.corpus, "rb") as handle:
        text = handle.read().decode("utf-8")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=args.vocab_size, min_frequency=2, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator([text], trainer=trainer)
    merges = json.loads(tokenizer.to_str())["model"]["merges"]
    lines = [m if isinstance(m, str) else " ".join(m) for m in merges]
    with open(args.out, "w", encoding="utf-8") as handle:
        handle.write("#version: 0.2\n" + "".join(line + "\n" for line in lines))
    print("tokenizers %s: %s, vocab %d: %d merges -> %s" % (
        tokenizers.__version__, args.corpus, tokenizer.get_vocab_size(), len(lines), args.out))


if __name__ == "__main__":
    main()
