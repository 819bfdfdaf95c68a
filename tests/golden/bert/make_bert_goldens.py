#!/usr/bin/env python3
"""BERT goldens made by Megatron-Core's own BertModel (issue 25).

Writes tests/golden/bert/bert_goldens.json (format: README.md beside this script), which
tests/unit/model/test_bert.cpp reads. Each case builds megatron.core.models.bert.BertModel from the
local layer spec (bert_layer_local_spec: pre-LN TransformerLayer, SelfAttention with
AttnMaskType.padding, DotProductAttention, MLP) on one CPU process (a one-rank gloo group as
TP = PP = 1), output layer tied to the word embeddings, sets seeded fp32 weights, runs forward on
a fixed batch and backward from the loss as pretrain_bert.py's loss_func computes it:
    lm loss  = sum(per-token cross-entropy * loss_mask) / sum(loss_mask)
    sop loss = cross_entropy(binary_logits, is_random)        (binary head only)
    loss     = lm loss + sop loss
and records the weights and their grads under mt's parameter names (below), the batch, the losses.

Made by hand in a venv outside the repository (CI never runs this script):
    python3 -m venv /work/venv-megatron
    /work/venv-megatron/bin/pip install torch==2.6.0 megatron-core==0.16.1
    /work/venv-megatron/bin/python tests/golden/bert/make_bert_goldens.py

What had to be done around Megatron's code (all on one CPU process):
- torch.cuda.current_device is patched to return "cpu", and the CUDA RNG tracker DotProductAttention
  forks around its attention dropout (p = 0 here) is a no-op.
- GELU as Megatron trains BERT: the encoder MLP with bias_activation_fusion on (--bias-gelu-fusion,
  the default: bias_gelu_impl, the tanh form) and BertLMHead's own torch.nn.functional.gelu (the
  erf form), both Megatron's code unchanged.
- vocab_size is the padded vocabulary (Megatron's BertModel takes the padded size); the cases have
  no padding columns, so Megatron's softmax over them and mt's exclusion of them agree.
- Names: Megatron's encoder.* are mt's decoder.*; Megatron's fused linear_qkv (per query group:
  the group's query heads, then its key head, then its value head) is split into mt's
  linear_q / linear_k / linear_v; the rest keep Megatron's names.
- Tensors are [s, b, h] in Megatron; the JSON stores the batch sample-major (b, s) as mt's rows.
"""
import argparse
import contextlib
import json
import os
import platform

import torch
import torch.distributed as dist
import torch.nn.functional as F

import megatron.core
from megatron.core import parallel_state

SEED = 20261128
OUT_DEFAULT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bert_goldens.json")

# The batch: per sample its valid length (padding after), the [SEP] position that starts segment B
# (token types 1 from there on the valid tokens), its masked positions and is_random.
CASES = [
    dict(name="binary_head", layers=2, hidden=16, heads=2, ffn=64, vocab=64, seq=12, max_pos=16,
         binary_head=True, lengths=[12, 8, 5], segment_b=[6, 4, 3], masked=[[1, 4, 9], [2, 6], [1]],
         is_random=[0, 1, 1]),
    dict(name="no_binary_head", layers=2, hidden=16, heads=2, ffn=64, vocab=64, seq=12, max_pos=16,
         binary_head=False, lengths=[10, 12], segment_b=[0, 0], masked=[[1, 3, 8], [2, 5, 7, 11]],
         is_random=[0, 0]),
]


def flat(tensor):
    """The values, each written with the fewest digits that read back as the same float32."""
    values = tensor.detach().reshape(-1)
    if not values.is_floating_point():
        return values.tolist()
    return [float(str(v)) for v in values.float().numpy()]


class NoRngTracker:
    """DotProductAttention forks the CUDA RNG tracker around its (p = 0) dropout: a no-op here."""

    def fork(self, *args, **kwargs):
        return contextlib.nullcontext()


def one_rank_groups():
    torch.cuda.current_device = lambda: "cpu"
    from megatron.core import tensor_parallel
    tensor_parallel.get_cuda_rng_tracker = NoRngTracker
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29519")
    dist.init_process_group("gloo", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)


def build(case):
    from megatron.core.models.bert.bert_layer_specs import bert_layer_local_spec
    from megatron.core.models.bert.bert_model import BertModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(
        num_layers=case["layers"], hidden_size=case["hidden"], num_attention_heads=case["heads"],
        ffn_hidden_size=case["ffn"], activation_func=F.gelu, layernorm_epsilon=1e-5, add_bias_linear=True,
        attention_dropout=0.0, hidden_dropout=0.0, params_dtype=torch.float32, use_cpu_initialization=True,
        bias_activation_fusion=True, bias_dropout_fusion=False, masked_softmax_fusion=False,
        apply_rope_fusion=False, gradient_accumulation_fusion=False, persist_layer_norm=False)
    model = BertModel(config=config, num_tokentypes=2 if case["binary_head"] else 0,
                      transformer_layer_spec=bert_layer_local_spec, vocab_size=case["vocab"],
                      max_sequence_length=case["max_pos"], share_embeddings_and_output_weights=True,
                      add_binary_head=case["binary_head"], parallel_output=True)
    return model


def mt_tensors(name, tensor, case):
    """(mt name, tensor) pairs of one Megatron parameter (or its grad)."""
    name = name.replace("encoder.", "decoder.", 1)
    if "linear_qkv" not in name:
        return [(name, tensor)]
    heads, d = case["heads"], case["hidden"] // case["heads"]
    groups = heads  # multi-head attention: one query head per group
    per_group = tensor.reshape(groups, (heads // groups + 2) * d, *tensor.shape[1:])
    q = per_group[:, : (heads // groups) * d].reshape(heads * d, *tensor.shape[1:])
    k = per_group[:, (heads // groups) * d: (heads // groups + 1) * d].reshape(groups * d, *tensor.shape[1:])
    v = per_group[:, (heads // groups + 1) * d:].reshape(groups * d, *tensor.shape[1:])
    return [(name.replace("linear_qkv", "linear_" + part), t) for part, t in (("q", q), ("k", k), ("v", v))]


def make_batch(case, generator):
    b, s, vocab = len(case["lengths"]), case["seq"], case["vocab"]
    tokens = torch.randint(5, vocab, (b, s), generator=generator)
    types = torch.zeros(b, s, dtype=torch.long)
    padding = torch.zeros(b, s)
    labels = torch.full((b, s), -1, dtype=torch.long)
    loss_mask = torch.zeros(b, s)
    for i, length in enumerate(case["lengths"]):
        tokens[i, length:] = 0
        padding[i, :length] = 1
        if case["binary_head"]:
            types[i, case["segment_b"][i]:length] = 1
        for t in case["masked"][i]:
            labels[i, t] = tokens[i, t]
            tokens[i, t] = 3  # [MASK]
            loss_mask[i, t] = 1
    is_random = torch.tensor(case["is_random"], dtype=torch.long)
    return tokens, types, padding, labels, loss_mask, is_random


def run_case(case, generator):
    model = build(case)
    for name, param in sorted(model.named_parameters()):
        with torch.no_grad():
            if "layernorm" in name or "layer_norm" in name:
                param.copy_((1.0 if name.endswith("weight") else 0.0) + 0.2 * torch.randn(param.shape,
                                                                                         generator=generator))
            else:
                param.copy_(0.3 * torch.randn(param.shape, generator=generator))
    tokens, types, padding, labels, loss_mask, is_random = make_batch(case, generator)
    lm_loss_, binary_logits = model(tokens, padding, tokentype_ids=types if case["binary_head"] else None,
                                    lm_labels=labels)
    lm_loss = torch.sum(lm_loss_.float().view(-1) * loss_mask.reshape(-1)) / loss_mask.sum()
    loss = lm_loss
    sop_loss = None
    if case["binary_head"]:
        sop_loss = F.cross_entropy(binary_logits.view(-1, 2).float(), is_random.view(-1), ignore_index=-1)
        loss = lm_loss + sop_loss
    loss.backward()
    weights, grads = {}, {}
    for name, param in sorted(model.named_parameters()):
        for mt_name, value in mt_tensors(name, param.detach(), case):
            weights[mt_name] = {"shape": list(value.shape), "values": flat(value)}
        for mt_name, value in mt_tensors(name, param.grad, case):
            grads[mt_name] = flat(value)
    return {
        **case,
        "tokens": flat(tokens), "token_types": flat(types), "labels": flat(labels),
        "loss_mask": flat(loss_mask), "padding_mask": flat(padding), "is_random": flat(is_random),
        "lm_loss": lm_loss.item(), "sop_loss": sop_loss.item() if sop_loss is not None else None,
        "weights": weights, "grads": grads,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=OUT_DEFAULT)
    args = parser.parse_args()
    one_rank_groups()
    generator = torch.Generator().manual_seed(SEED)
    cases = [run_case(case, generator) for case in CASES]
    result = {
        "generator": {"script": "tests/golden/bert/make_bert_goldens.py", "python": platform.python_version(),
                      "torch": torch.__version__, "megatron_core": megatron.core.__version__, "seed": SEED},
        "cases": cases,
    }
    with open(args.out + ".tmp", "w") as f:
        json.dump(result, f, separators=(",", ":"))
        f.write("\n")
    os.replace(args.out + ".tmp", args.out)
    print("wrote", args.out, [(c["name"], c["lm_loss"], c["sop_loss"]) for c in cases])


if __name__ == "__main__":
    main()
