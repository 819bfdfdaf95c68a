#!/usr/bin/python3
"""Prints the mt-train flags of a golden case in cases.json (used by regenerate.sh, so mt-train and
make_goldens.py train the same configuration; tests/unit/train/test_golden.cpp reads cases.json itself)."""
import json
import os
import sys

FLAG_OF = {
    "num_layers": "--num-layers", "hidden_size": "--hidden-size", "ffn_hidden_size": "--ffn-hidden-size",
    "num_attention_heads": "--num-attention-heads", "vocab_size": "--vocab-size",
    "make_vocab_size_divisible_by": "--make-vocab-size-divisible-by", "seq_length": "--seq-length",
    "max_position_embeddings": "--max-position-embeddings", "micro_batch_size": "--micro-batch-size",
    "global_batch_size": "--global-batch-size", "train_iters": "--train-iters", "lr": "--lr", "min_lr": "--min-lr",
    "lr_warmup_iters": "--lr-warmup-iters", "lr_decay_style": "--lr-decay-style", "weight_decay": "--weight-decay",
    "clip_grad": "--clip-grad", "adam_beta1": "--adam-beta1", "adam_beta2": "--adam-beta2", "adam_eps": "--adam-eps",
    "norm_epsilon": "--norm-epsilon", "init_method_std": "--init-method-std", "seed": "--seed",
    "rotary_base": "--rotary-base",
}


def flags(case):
    out = ["--model", "tiny-llama" if case["model"] == "llama" else "tiny-gpt", "--mock-data", "--hidden-dropout", "0",
           "--eval-iters", "0"]
    if case["num_query_groups"] != case["num_attention_heads"]:
        out += ["--group-query-attention", "--num-query-groups", str(case["num_query_groups"])]
    for key, flag in FLAG_OF.items():
        if key in case:
            out += [flag, str(case[key])]
    return out


def main():
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "cases.json")) as f:
        cases = json.load(f)
    print(" ".join(flags(cases[sys.argv[1]])))


if __name__ == "__main__":
    main()
