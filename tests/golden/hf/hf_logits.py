#!/usr/bin/env python3
"""Logits of an exported mt model under transformers, on fixed tokens (make_hf_goldens.sh runs it).

Loads DIR (mt-ckpt export --format hf) with the class its config.json names (GPT2LMHeadModel,
LlamaForCausalLM, MixtralForCausalLM or DeepseekV3ForCausalLM, the last in transformers >= 4.51;
eager attention, fp32, CPU, one thread), runs the case's
fixed tokens and writes
OUT: /tokens int32 (batch, seq_length), /logits float32 (batch, seq_length, vocab_size), root
attributes case, architecture, transformers_version, torch_version.

    hf_logits.py --case tiny-gpt2 --model DIR --out tests/golden/hf/tiny-gpt2-logits.h5

A case not in tests/golden/cases.json (tiny-mixtral, tiny-deepseek: mt-train's presets) takes its
seq_length and vocab_size from DIR's config.json (max_position_embeddings, vocab_size).
"""
import argparse
import json
import os

import h5py
import numpy as np
import torch
import transformers

BATCH = 2
CASES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cases.json")


def fixed_tokens(case):
    """(BATCH, seq_length) ids spread over the vocabulary: (37 s + 11 t + 5) mod vocab_size."""
    s = np.arange(BATCH)[:, None]
    t = np.arange(case["seq_length"])[None, :]
    return ((37 * s + 11 * t + 5) % case["vocab_size"]).astype(np.int32)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", required=True)
    parser.add_argument("--model", required=True, help="directory written by mt-ckpt export --format hf")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with open(os.path.join(args.model, "config.json")) as handle:
        config = json.load(handle)
    architecture = config["architectures"][0]
    with open(CASES) as handle:
        case = json.load(handle).get(args.case) or {"seq_length": config["max_position_embeddings"],
                                                    "vocab_size": config["vocab_size"]}
    model_class = {"GPT2LMHeadModel": transformers.GPT2LMHeadModel,
                   "LlamaForCausalLM": transformers.LlamaForCausalLM,
                   "MixtralForCausalLM": transformers.MixtralForCausalLM,
                   "DeepseekV3ForCausalLM": getattr(transformers, "DeepseekV3ForCausalLM", None)}[architecture]
    if model_class is None:
        raise SystemExit("transformers %s has no %s" % (transformers.__version__, architecture))
    model = model_class.from_pretrained(args.model, torch_dtype=torch.float32, attn_implementation="eager")
    model.eval()
    tokens = fixed_tokens(case)
    with torch.no_grad():
        logits = model(torch.from_numpy(tokens.astype(np.int64))).logits.numpy().astype(np.float32)
    if logits.shape != (BATCH, case["seq_length"], case["vocab_size"]):
        raise SystemExit("logits of shape %s, expected %s" % (logits.shape, (BATCH, case["seq_length"], case["vocab_size"])))
    with h5py.File(args.out, "w") as handle:
        handle.attrs["case"] = args.case
        handle.attrs["architecture"] = architecture
        handle.attrs["transformers_version"] = transformers.__version__
        handle.attrs["torch_version"] = str(torch.__version__)
        handle.create_dataset("tokens", data=tokens)
        handle.create_dataset("logits", data=logits)
    print("%s: %s logits %s, |max| %.4f -> %s" % (args.case, architecture, logits.shape, np.abs(logits).max(), args.out))


if __name__ == "__main__":
    main()
