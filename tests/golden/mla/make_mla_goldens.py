#!/usr/bin/env python3
"""Multi-latent attention goldens made by Megatron-Core's own MLASelfAttention (issue 22).

Writes tests/golden/mla/mla_goldens.json (format: README.md beside this script), which
tests/unit/model/test_mla_megatron.cpp reads. Each case builds MLASelfAttention from
Megatron-Core's local GPT layer spec (get_gpt_layer_local_spec(multi_latent_attention=True,
qk_layernorm=...): ColumnParallelLinear projections, RMSNorm latent norms, DotProductAttention,
RowParallelLinear output) on one CPU process (a one-rank gloo group as TP = PP = CP = 1), sets
seeded fp32 weights, runs forward on a seeded input and backward from a seeded output grad, and
records the weights (Megatron's names), input, output, input grad and every weight grad.

Made by hand in a venv outside the repository (CI never runs this script):
    python3 -m venv /work/venv-megatron
    /work/venv-megatron/bin/pip install torch==2.6.0 megatron-core==0.16.1
    /work/venv-megatron/bin/python tests/golden/mla/make_mla_goldens.py

What had to be done around Megatron's code (all on one CPU process):
- multi_latent_attention.HAVE_TE is set False (Transformer Engine is not installed), and
  torch.cuda.current_device is patched to return "cpu", and Megatron's default causal mask
  (transformer/utils.py get_default_causal_mask, which builds it on "cuda") is rebuilt on the CPU.
- rope_type is "rope" (MLATransformerConfig's default is "yarn" with factor 40; YaRN is a separate
  item) and rotary_scaling_factor 1, so the softmax scale is 1/sqrt(qk_head_dim + qk_pos_emb_head_dim).
- Megatron-Core's local DotProductAttention takes no k_channels / v_channels (MLA is built with
  Transformer Engine's, which is not installed here): the core attention is CausalCoreAttention
  below, softmax(q k^T * softmax_scale + causal mask) v in fp32 with torch ops, built with the
  arguments MLA passes. Every projection, norm, split, RoPE and concatenation is Megatron's code.
- Tensors are [s, b, h] in Megatron; the JSON stores activations sample-major (b, s, h) as mt's rows.
"""
import argparse
import json
import os
import platform

import torch
import torch.distributed as dist

import megatron.core
from megatron.core import parallel_state
from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed  # noqa: F401

SEED = 20261128
OUT_DEFAULT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mla_goldens.json")

# hidden, heads, q_lora_rank (0: none), kv_lora_rank, qk_head_dim, qk_pos_emb_head_dim, v_head_dim,
# qk_layernorm, batch, seq
CASES = [
    dict(name="q_lora_norms", hidden=24, heads=4, q_lora_rank=10, kv_lora_rank=12, qk_head_dim=6,
         qk_pos_emb_head_dim=4, v_head_dim=5, qk_layernorm=True, batch=2, seq=7),
    dict(name="no_q_lora_no_norms", hidden=16, heads=2, q_lora_rank=0, kv_lora_rank=8, qk_head_dim=4,
         qk_pos_emb_head_dim=6, v_head_dim=8, qk_layernorm=False, batch=1, seq=9),
]


def flat(tensor):
    return tensor.detach().reshape(-1).tolist()


def patch_for_cpu():
    torch.cuda.current_device = lambda: "cpu"
    from megatron.core.transformer import utils
    from megatron.core.fusions import fused_softmax

    def causal_mask(sq):
        return torch.triu(torch.ones(sq, sq), diagonal=1).bool()

    utils.get_default_causal_mask = causal_mask
    fused_softmax.get_default_causal_mask = causal_mask
    # Transformer Engine's module imports without TE, leaving TELinear None with HAVE_TE True, which
    # MultiLatentAttention.__init__ then passes to isinstance: no TE here.
    from megatron.core.transformer import multi_latent_attention
    multi_latent_attention.HAVE_TE = False


def one_rank_groups():
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("gloo", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)


class CausalCoreAttention(torch.nn.Module):
    """softmax(q k^T * scale, causal) v: q, k [s, b, n, dk], v [s, b, n, dv] -> [s, b, n * dv]."""

    def __init__(self, config, layer_number, attn_mask_type, attention_type, softmax_scale=None, k_channels=None,
                 v_channels=None, cp_comm_type=None, pg_collection=None):
        super().__init__()
        self.softmax_scale = softmax_scale

    def forward(self, query, key, value, attention_mask, packed_seq_params=None, attn_mask_type=None):
        s = query.shape[0]
        scores = torch.einsum("sbnd,tbnd->bnst", query, key) * self.softmax_scale
        mask = torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1)
        scores = scores.masked_fill(mask, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out = torch.einsum("bnst,tbnd->sbnd", probs, value)
        return out.reshape(s, out.shape[1], -1)


def build(case):
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import MLATransformerConfig

    config = MLATransformerConfig(
        num_layers=1, hidden_size=case["hidden"], num_attention_heads=case["heads"],
        q_lora_rank=case["q_lora_rank"] or None, kv_lora_rank=case["kv_lora_rank"],
        qk_head_dim=case["qk_head_dim"], qk_pos_emb_head_dim=case["qk_pos_emb_head_dim"],
        v_head_dim=case["v_head_dim"], rope_type="rope", rotary_scaling_factor=1.0, rotary_base=10000,
        normalization="RMSNorm", layernorm_epsilon=1e-5, add_bias_linear=False, qk_layernorm=case["qk_layernorm"],
        attention_dropout=0.0, hidden_dropout=0.0, params_dtype=torch.float32, use_cpu_initialization=True,
        bias_dropout_fusion=False, apply_rope_fusion=False, masked_softmax_fusion=False,
        gradient_accumulation_fusion=False)
    spec = get_gpt_layer_local_spec(multi_latent_attention=True, qk_layernorm=case["qk_layernorm"],
                                    normalization="RMSNorm")
    attention_spec = spec.submodules.self_attention
    attention_spec.submodules.core_attention = CausalCoreAttention
    from megatron.core.transformer.spec_utils import build_module
    return build_module(attention_spec, config=config, layer_number=1)


def run_case(case, generator):
    module = build(case)
    weights = {}
    for name, param in sorted(module.named_parameters()):
        with torch.no_grad():
            if name.endswith("layer_norm_weight") or "layernorm" in name:
                param.copy_(1.0 + 0.2 * torch.randn(param.shape, generator=generator))
            else:
                param.copy_(0.3 * torch.randn(param.shape, generator=generator))
        weights[name] = {"shape": list(param.shape), "values": flat(param)}
    b, s, h = case["batch"], case["seq"], case["hidden"]
    x_bsh = torch.randn(b, s, h, generator=generator)
    dy_bsh = torch.randn(b, s, h, generator=generator)
    x = x_bsh.transpose(0, 1).contiguous().requires_grad_(True)  # [s, b, h]
    out, bias = module(x, attention_mask=None)
    assert bias is None
    out.backward(dy_bsh.transpose(0, 1))
    grads = {name: flat(param.grad) for name, param in sorted(module.named_parameters())}
    return {
        **case,
        "softmax_scale": module.softmax_scale,
        "weights": weights,
        "x": flat(x_bsh),
        "dy": flat(dy_bsh),
        "y": flat(out.detach().transpose(0, 1)),
        "dx": flat(x.grad.transpose(0, 1)),
        "grads": grads,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=OUT_DEFAULT)
    args = parser.parse_args()
    patch_for_cpu()
    one_rank_groups()
    generator = torch.Generator().manual_seed(SEED)
    cases = [run_case(case, generator) for case in CASES]
    result = {
        "generator": {"script": "tests/golden/mla/make_mla_goldens.py", "python": platform.python_version(),
                      "torch": torch.__version__, "megatron_core": megatron.core.__version__, "seed": SEED},
        "cases": cases,
    }
    with open(args.out + ".tmp", "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    os.replace(args.out + ".tmp", args.out)
    print("wrote", args.out, [c["name"] for c in cases])


if __name__ == "__main__":
    main()
