#!/usr/bin/env python3
"""Default-config transformers models and their loss on a periodic token sequence (make_default_config_goldens.sh runs it).

Builds GPT2LMHeadModel(GPT2Config(...)) and LlamaForCausalLM(LlamaConfig(...)) with torch's seed
fixed, every field at the class's default except the size fields SHRUNK lists (so the files stay
small) and LLaMA's attention_dropout, set to 0.1 (its default is 0.0) so that the import of a
dropout is exercised for both families. GPT-2 keeps GPT2Config()'s attn_pdrop, resid_pdrop and
embd_pdrop of 0.1. Each model is saved with save_pretrained (safetensors) as OUT/<name>/
(config.json, model.safetensors), and OUT/losses.json records transformers' loss (model.eval(),
so dropout off; fp32, eager attention, CPU, one thread) on the sequence TOKENS: PERIOD repeated,
of which the model reads SEQ_LENGTH tokens and predicts the next SEQ_LENGTH (labels=input_ids,
transformers' own shift); then, as mt-train's optimizer with --lr 1e-4 --weight-decay 0.01
--clip-grad 1 (AdamW, betas 0.9 0.999, eps 1e-8, no decay of biases and norm weights), the
gradient norm before clipping and the loss after one step. tests/tools/mt-ckpt.bats imports each
directory with mt-ckpt import --format hf, trains two steps with dropout off on that sequence and
compares mt's lm_loss of both steps and the first grad_norm.

    make_default_config_goldens.py --out tests/golden/hf/default-config
"""
import argparse
import json
import os

import torch
import transformers

SEED = 1234
VOCAB_SIZE = 96
SEQ_LENGTH = 16
# Eight distinct ids; SEQ_LENGTH is a multiple of the period, so every sample mt's data pipeline
# cuts from the repeated sequence (SEQ_LENGTH + 1 tokens from a multiple of SEQ_LENGTH) is the same.
PERIOD = [17, 3, 42, 88, 61, 5, 29, 70]
SHRUNK = {
    "gpt2": {"vocab_size": VOCAB_SIZE, "n_layer": 2, "n_embd": 32, "n_head": 4},
    "llama": {"vocab_size": VOCAB_SIZE, "num_hidden_layers": 2, "hidden_size": 32, "intermediate_size": 64,
              "num_attention_heads": 4},
}
LLAMA_ATTENTION_DROPOUT = 0.1
LR, WEIGHT_DECAY, CLIP_GRAD, BETAS, EPS = 1e-4, 0.01, 1.0, (0.9, 0.999), 1e-8


def models():
    """(name, model) for each family, initialised by transformers from torch's fixed seed."""
    torch.manual_seed(SEED)
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(**SHRUNK["gpt2"]))
    torch.manual_seed(SEED)
    llama = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(**SHRUNK["llama"], attention_dropout=LLAMA_ATTENTION_DROPOUT,
                                 attn_implementation="eager"))
    return [("gpt2", gpt2), ("llama", llama)]


def periodic_input():
    """(1, SEQ_LENGTH + 1) ids: the period repeated; the logits at the last position predict
    nothing, transformers shifts labels by one."""
    ids = (PERIOD * (SEQ_LENGTH // len(PERIOD) + 1))[: SEQ_LENGTH + 1]
    return torch.tensor([ids], dtype=torch.int64)


def loss_on_period(model):
    """transformers' mean next-token loss over SEQ_LENGTH predictions on the periodic sequence."""
    input_ids = periodic_input()
    model.eval()
    with torch.no_grad():
        return float(model(input_ids=input_ids, labels=input_ids).loss)


def one_step(model):
    """(gradient norm before clipping, loss after the step) of one AdamW step on the periodic
    sequence as mt-train takes it: decoupled weight decay on matrices only, global-norm clipping."""
    input_ids = periodic_input()
    model.eval()  # dropout off
    parameters = list(model.parameters())
    optimizer = torch.optim.AdamW(
        [{"params": [p for p in parameters if p.ndim >= 2], "weight_decay": WEIGHT_DECAY},
         {"params": [p for p in parameters if p.ndim < 2], "weight_decay": 0.0}], lr=LR, betas=BETAS, eps=EPS)
    model(input_ids=input_ids, labels=input_ids).loss.backward()
    grad_norm = float(torch.nn.utils.clip_grad_norm_(parameters, CLIP_GRAD))
    optimizer.step()
    return grad_norm, loss_on_period(model)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="directory for <name>/ and losses.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    record = {"transformers_version": transformers.__version__, "torch_version": str(torch.__version__),
              "seed": SEED, "seq_length": SEQ_LENGTH, "period": PERIOD, "shrunk": SHRUNK,
              "llama_attention_dropout": LLAMA_ATTENTION_DROPOUT,
              "optimizer": {"lr": LR, "weight_decay": WEIGHT_DECAY, "clip_grad": CLIP_GRAD, "betas": BETAS, "eps": EPS},
              "loss": {}, "grad_norm": {}, "loss_after_step": {}}
    for name, model in models():
        model = model.float()
        directory = os.path.join(args.out, name)
        model.save_pretrained(directory, safe_serialization=True)
        generation_config = os.path.join(directory, "generation_config.json")
        if os.path.exists(generation_config):
            os.remove(generation_config)  # mt's import reads config.json and model.safetensors only
        record["loss"][name] = loss_on_period(model)
        record["grad_norm"][name], record["loss_after_step"][name] = one_step(model)
        print("%s: loss %.9g, grad norm %.9g, loss after one step %.9g -> %s" % (
            name, record["loss"][name], record["grad_norm"][name], record["loss_after_step"][name], directory))
    with open(os.path.join(args.out, "losses.json"), "w") as handle:
        json.dump(record, handle, indent=2)
        handle.write("\n")


if __name__ == "__main__":
    main()
