#!/usr/bin/python3
"""Trains the SentencePiece BPE test models with Debian's reference trainer (python3-sentencepiece).

Writes, next to this script (or --out DIR), three small BPE models trained on the repository's
corpus (data/demo/tinyshakespeare.txt and data/corpus/war_and_peace_pg2600.txt, one sentence a
line, no sampling):
  llama_style_2k.model  2,000 pieces, identity normalizer, byte fallback, split digits, no extra-
                        whitespace removal: the normalizer and options LLaMA-2 and Mistral carry;
                        control symbols [INST] and [/INST] as Mixtral 8x22B
  nfkc_4k.model         4,000 pieces, nmt_nfkc (the trainer's default: the precompiled charsmap),
                        no byte fallback, user-defined symbols <sep> and "Pierre"
  identity_1k.model     1,000 pieces, identity normalizer, no byte fallback, extra whitespace removed
The trainer is single-threaded here so that the same inputs give the same files.
Usage: tests/golden/sentencepiece/make_models.py [--data DIR] [--out DIR]
"""
import argparse
import os
import sys

import sentencepiece as spm

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))

MODELS = {
    "llama_style_2k": dict(vocab_size=2000, normalization_rule_name="identity", byte_fallback=True,
                           split_digits=True, remove_extra_whitespaces=False, add_dummy_prefix=True,
                           control_symbols=["[INST]", "[/INST]"], character_coverage=0.9995),
    "nfkc_4k": dict(vocab_size=4000, normalization_rule_name="nmt_nfkc", byte_fallback=False,
                    user_defined_symbols=["<sep>", "Pierre"], character_coverage=0.9995),
    "identity_1k": dict(vocab_size=1000, normalization_rule_name="identity", byte_fallback=False,
                        remove_extra_whitespaces=True, character_coverage=0.9995),
}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=os.path.join(ROOT, "data"))
    parser.add_argument("--out", default=HERE)
    args = parser.parse_args()
    # Relative paths, so that the model files (which record them) do not depend on the checkout.
    data = os.path.abspath(args.data)
    os.chdir(args.out)
    inputs = [os.path.relpath(os.path.join(data, "demo", "tinyshakespeare.txt")),
              os.path.relpath(os.path.join(data, "corpus", "war_and_peace_pg2600.txt"))]
    for name, options in MODELS.items():
        spm.SentencePieceTrainer.train(
            input=",".join(inputs), model_prefix=name, model_type="bpe",
            num_threads=1, input_sentence_size=0, shuffle_input_sentence=False, minloglevel=2, **options)
        os.remove(name + ".vocab")
        size = os.path.getsize(name + ".model")
        print(f"make_models: {name}.model {size} bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
