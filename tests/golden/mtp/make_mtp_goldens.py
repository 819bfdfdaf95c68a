#!/usr/bin/env python3
"""Multi-token prediction goldens made by Megatron-Core's own GPTModel with an MTP block (issue 22).

Writes tests/golden/mtp/mtp_goldens.json (format: README.md beside this script), which
tests/unit/model/test_mtp_megatron.cpp reads. Each case builds GPTModel from Megatron-Core's local
GPT layer spec with get_gpt_mtp_block_spec (MultiTokenPredictionBlock: enorm, hnorm, eh_proj, a
transformer layer like the decoder's last, final_layernorm; the word embedding and output layer
shared) on one CPU process (a one-rank gloo group as TP = PP = CP = 1), sets seeded fp32 weights,
runs a training forward on a seeded batch with a loss mask, and backward of
    J = sum(lm_loss * mask) / sum(mask)
with MTPLossAutoScaler's main_loss_backward_scale at 1 (so the MTP losses add
mtp_loss_scaling_factor / D * sum_k mean_k to J, as Megatron's schedule does for one micro-batch).
It records the weights and grads under mt's tensor names, the LM loss, and the MTP losses of each
depth as MTPLossLoggingHelper's tracker holds them (sum(mask_k * loss_k) / sum(mask_k)).

Made by hand in a venv outside the repository (CI never runs this script):
    python3 -m venv /work/venv-megatron
    /work/venv-megatron/bin/pip install torch==2.6.0 megatron-core==0.16.1
    /work/venv-megatron/bin/python tests/golden/mtp/make_mtp_goldens.py

What had to be done around Megatron's code (all on one CPU process):
- torch.cuda.current_device is patched to return "cpu" (the MTP loss tracker allocates there) and
  Megatron's default causal mask (transformer/utils.py get_default_causal_mask, built on "cuda")
  is rebuilt on the CPU.
- The core attention is CausalCoreAttention below (softmax(q k^T / sqrt(d), causal) v with k/v
  repeated per query group, as DotProductAttention computes it), because the local
  DotProductAttention forks the CUDA RNG tracker even without dropout. Every embedding, norm,
  projection, RoPE, roll, concatenation and loss is Megatron's code.
- Names: Megatron's fused linear_qkv (per query group: its heads' q rows, then k, then v) is split
  into mt's linear_q / linear_k / linear_v, and the SwiGLU linear_fc1 (gate rows, then up rows)
  into linear_fc1_gate / linear_fc1_up; mtp.layers.<k>.transformer_layer.<x> is mt's
  decoder.layers.<num_layers + k>.<x>. Everything else keeps Megatron's name.
- Tensors are [s, b, h] in Megatron; tokens, labels and masks are stored sample-major (b, s).
"""
import argparse
import json
import os
import platform

import torch
import torch.distributed as dist

import megatron.core
from megatron.core import parallel_state

SEED = 20261128
OUT_DEFAULT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mtp_goldens.json")

CASES = [
    # A LLaMA-shaped model (RMSNorm, RoPE, SwiGLU, GQA, tied embedding) with two MTP depths.
    dict(name="llama_two_depths", num_layers=2, hidden=16, heads=4, query_groups=2, ffn=24, vocab=32, batch=2,
         seq=8, mtp_num_layers=2, mtp_loss_scaling_factor=0.3, untie=False),
    # One depth (DeepSeek-V3's count), untied output layer, Megatron's default factor 0.1.
    dict(name="untied_one_depth", num_layers=1, hidden=12, heads=2, query_groups=2, ffn=20, vocab=48, batch=1,
         seq=9, mtp_num_layers=1, mtp_loss_scaling_factor=0.1, untie=True),
]


def flat(tensor):
    return tensor.detach().reshape(-1).tolist()


def patch_for_cpu():
    torch.cuda.current_device = lambda: "cpu"
    from megatron.core.transformer import utils
    from megatron.core.fusions import fused_softmax

    def causal_mask(sq, *args, **kwargs):
        return torch.triu(torch.ones(sq, sq), diagonal=1).bool()

    utils.get_default_causal_mask = causal_mask
    fused_softmax.get_default_causal_mask = causal_mask


def one_rank_groups():
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29519")
    dist.init_process_group("gloo", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)


class CausalCoreAttention(torch.nn.Module):
    """softmax(q k^T / sqrt(d), causal) v with grouped k/v repeated per query group (Megatron's
    DotProductAttention without its dropout RNG tracker): q [s, b, n, d], k/v [s, b, g, d] -> [s, b, n d]."""

    def __init__(self, config, layer_number, attn_mask_type, attention_type, attention_dropout=None,
                 softmax_scale=None, cp_comm_type=None, pg_collection=None, **kwargs):
        super().__init__()
        self.scale = softmax_scale

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None):
        s, _, n, d = query.shape
        repeat = n // key.shape[2]
        key = key.repeat_interleave(repeat, dim=2)
        value = value.repeat_interleave(repeat, dim=2)
        scale = self.scale if self.scale is not None else d ** -0.5
        scores = torch.einsum("sbnd,tbnd->bnst", query, key) * scale
        scores = scores.masked_fill(torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1), float("-inf"))
        out = torch.einsum("bnst,tbnd->sbnd", torch.softmax(scores, dim=-1), value)
        return out.reshape(s, out.shape[1], -1)


def build(case):
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec, get_gpt_mtp_block_spec
    from megatron.core.transformer.transformer_config import TransformerConfig
    import torch.nn.functional as F

    config = TransformerConfig(
        num_layers=case["num_layers"], hidden_size=case["hidden"], num_attention_heads=case["heads"],
        num_query_groups=case["query_groups"], ffn_hidden_size=case["ffn"], gated_linear_unit=True,
        activation_func=F.silu, normalization="RMSNorm", layernorm_epsilon=1e-5, add_bias_linear=False,
        attention_dropout=0.0, hidden_dropout=0.0, params_dtype=torch.float32, use_cpu_initialization=True,
        bias_dropout_fusion=False, apply_rope_fusion=False, masked_softmax_fusion=False,
        gradient_accumulation_fusion=False, mtp_num_layers=case["mtp_num_layers"],
        mtp_loss_scaling_factor=case["mtp_loss_scaling_factor"])
    layer_spec = get_gpt_layer_local_spec(normalization="RMSNorm")
    layer_spec.submodules.self_attention.submodules.core_attention = CausalCoreAttention
    mtp_spec = get_gpt_mtp_block_spec(config, layer_spec, use_transformer_engine=False)
    model = GPTModel(config=config, transformer_layer_spec=layer_spec, vocab_size=case["vocab"],
                     max_sequence_length=case["seq"], position_embedding_type="rope", rotary_base=10000,
                     share_embeddings_and_output_weights=not case["untie"], mtp_block_spec=mtp_spec)
    return model


def mt_name(name, case):
    prefix = "mtp.layers."
    if name.startswith(prefix) and ".transformer_layer." in name:
        depth, rest = name[len(prefix):].split(".transformer_layer.", 1)
        return "decoder.layers.%d.%s" % (case["num_layers"] + int(depth), rest)
    return name


def to_mt(name, tensor, case):
    """Megatron's tensor -> {mt name: tensor} (fused q/k/v and SwiGLU fc1 split)."""
    name = mt_name(name, case)
    if name.endswith("self_attention.linear_qkv.weight"):
        base = name[: -len("linear_qkv.weight")]
        groups, heads, hidden = case["query_groups"], case["heads"], case["hidden"]
        d = hidden // heads
        per_group = heads // groups
        t = tensor.reshape(groups, (per_group + 2) * d, hidden)
        q = t[:, : per_group * d].reshape(-1, hidden)
        k = t[:, per_group * d: (per_group + 1) * d].reshape(-1, hidden)
        v = t[:, (per_group + 1) * d:].reshape(-1, hidden)
        return {base + "linear_q.weight": q, base + "linear_k.weight": k, base + "linear_v.weight": v}
    if name.endswith("mlp.linear_fc1.weight"):
        base = name[: -len("linear_fc1.weight")]
        gate, up = tensor.chunk(2, dim=0)
        return {base + "linear_fc1_gate.weight": gate, base + "linear_fc1_up.weight": up}
    return {name: tensor}


def run_case(case, generator):
    from megatron.core.transformer.multi_token_prediction import MTPLossAutoScaler, MTPLossLoggingHelper

    model = build(case)
    model.train()
    weights = {}
    for name, param in sorted(model.named_parameters()):
        with torch.no_grad():
            if "norm" in name:
                param.copy_(1.0 + 0.2 * torch.randn(param.shape, generator=generator))
            else:
                param.copy_(0.3 * torch.randn(param.shape, generator=generator))
        for mt, tensor in to_mt(name, param.detach(), case).items():
            weights[mt] = {"shape": list(tensor.shape), "values": flat(tensor)}
    b, s, vocab = case["batch"], case["seq"], case["vocab"]
    tokens = torch.randint(0, vocab, (b, s), generator=generator)
    labels = torch.randint(0, vocab, (b, s), generator=generator)
    mask = (torch.rand(b, s, generator=generator) > 0.25).float()
    positions = torch.arange(s).unsqueeze(0).expand(b, s).contiguous()

    MTPLossAutoScaler.set_loss_scale(torch.tensor(1.0))
    MTPLossLoggingHelper.tracker.clear()
    lm = model(tokens, positions, None, labels=labels, loss_mask=mask)  # [b, s] per-token loss
    lm_loss = (lm * mask).sum() / mask.sum()
    lm_loss.backward()
    mtp_losses = MTPLossLoggingHelper.tracker["values"].tolist()
    grads = {}
    for name, param in sorted(model.named_parameters()):
        for mt, tensor in to_mt(name, param.grad, case).items():
            grads[mt] = flat(tensor)
    return {
        **case,
        "weights": weights,
        "tokens": flat(tokens),
        "labels": flat(labels),
        "loss_mask": flat(mask),
        "lm_loss": lm_loss.item(),
        "mtp_losses": mtp_losses,
        "grads": grads,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=OUT_DEFAULT)
    args = parser.parse_args()
    patch_for_cpu()
    one_rank_groups()
    torch.manual_seed(SEED)
    generator = torch.Generator().manual_seed(SEED)
    cases = [run_case(case, generator) for case in CASES]
    data = {
        "generator": {
            "script": "tests/golden/mtp/make_mtp_goldens.py",
            "python": platform.python_version(),
            "torch": torch.__version__,
            "megatron_core": megatron.core.__version__,
            "seed": SEED,
        },
        "cases": cases,
    }
    with open(args.out + ".tmp", "w") as out:
        json.dump(data, out, indent=1)
    os.replace(args.out + ".tmp", args.out)


if __name__ == "__main__":
    main()
