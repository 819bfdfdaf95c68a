#!/usr/bin/env python3
"""Hugging Face tokenizers' side of tests/bench/bench_bpe_train.sh.

Splits a corpus at the first newline after --train-fraction of its bytes (optionally writing the
two parts to --write-split DIR as train.txt and heldout.txt, for mt to read), trains HF's
byte-level BPE on the first part as one document (ByteLevel(add_prefix_space=False) pre-tokenizer,
BpeTrainer with the 256 ByteLevel characters as initial alphabet and "<|endoftext|>" as the one
special token), and prints one JSON line: tokens per byte of the held-out part, training time and,
given mt's files (--mt-vocab/--mt-merges), the held-out tokens per byte of mt's vocabulary under
HF's own BPE encoder and how many leading merges the two vocabularies share.
Needs `pip install tokenizers`.
"""
import argparse
import json
import os
import time

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers


def split_corpus(path, fraction):
    data = open(path, "rb").read()
    cut = data.find(b"\n", int(len(data) * fraction))
    cut = len(data) if cut < 0 else cut + 1
    return data[:cut].decode("utf-8"), data[cut:].decode("utf-8")


def byte_level(model):
    tokenizer = Tokenizer(model)
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def merges_of(tokenizer):
    merges = json.loads(tokenizer.to_str())["model"]["merges"]
    return [m if isinstance(m, str) else " ".join(m) for m in merges]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", required=True)
    parser.add_argument("--train-fraction", type=float, default=0.9)
    parser.add_argument("--vocab-size", type=int, required=True)
    parser.add_argument("--min-frequency", type=int, default=2)
    parser.add_argument("--write-split", metavar="DIR")
    parser.add_argument("--save-merges", metavar="FILE", help="HF's merges in vocab.bpe form")
    parser.add_argument("--mt-vocab")
    parser.add_argument("--mt-merges")
    args = parser.parse_args()

    train, heldout = split_corpus(args.corpus, args.train_fraction)
    if args.write_split:
        os.makedirs(args.write_split, exist_ok=True)
        for name, text in (("train.txt", train), ("heldout.txt", heldout)):
            with open(os.path.join(args.write_split, name), "wb") as f:
                f.write(text.encode("utf-8"))
    heldout_bytes = len(heldout.encode("utf-8"))

    tokenizer = byte_level(models.BPE())
    trainer = trainers.BpeTrainer(
        vocab_size=args.vocab_size,
        min_frequency=args.min_frequency,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    start = time.perf_counter()
    tokenizer.train_from_iterator([train], trainer=trainer)
    train_s = time.perf_counter() - start
    ids = tokenizer.encode(heldout).ids if heldout else []
    assert tokenizer.decode(ids) == heldout
    hf_merges = merges_of(tokenizer)
    if args.save_merges:
        with open(args.save_merges, "w", encoding="utf-8") as f:
            f.write("#version: 0.2\n" + "".join(m + "\n" for m in hf_merges))
    record = {
        "impl": "hf-tokenizers",
        "version": __import__("tokenizers").__version__,
        "vocab_size": tokenizer.get_vocab_size(),
        "merges": len(hf_merges),
        "train_s": round(train_s, 3),
        "heldout_bytes": heldout_bytes,
        "heldout_tokens": len(ids),
        "tokens_per_byte": len(ids) / heldout_bytes if heldout_bytes else None,
    }
    if args.mt_vocab and args.mt_merges:
        mt = byte_level(models.BPE.from_file(args.mt_vocab, args.mt_merges))
        record["mt_files_heldout_tokens_hf_encoder"] = len(mt.encode(heldout).ids)
        with open(args.mt_merges, encoding="utf-8") as f:
            mt_merges = [line.rstrip("\n") for line in f if not line.startswith("#version")]
        shared = 0
        while shared < min(len(mt_merges), len(hf_merges)) and mt_merges[shared] == hf_merges[shared]:
            shared += 1
        record["shared_leading_merges"] = shared
        record["mt_merges"] = len(mt_merges)
    print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
