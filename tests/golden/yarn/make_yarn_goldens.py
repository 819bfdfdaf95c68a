#!/usr/bin/env python3
"""YaRN goldens made by Megatron-Core's own YarnRotaryEmbedding and MLASelfAttention (issue 22).

Writes tests/golden/yarn/yarn_goldens.json (format: README.md beside this script), which
tests/unit/model/test_yarn.cpp reads:
- "tables": per YaRN setting, Megatron's inverse frequencies (the angle table at position 1), its
  concentration factor, MLA's softmax mscale (_yarn_get_mscale(factor, mscale_all_dim)), and the
  cos and sin tables (cos(emb) * concentration, as get_cached_cos_sin builds them) at a few
  positions, for the rotary head size given;
- "mla": MLASelfAttention built with rope_type="yarn" (everything else as tests/golden/mla), its
  softmax scale, seeded fp32 weights, input, output grad, output, input grad and weight grads.

Made by hand in the venv of tests/golden/mla (outside the repository; CI never runs this script):
    /work/venv-megatron/bin/python tests/golden/yarn/make_yarn_goldens.py
It reuses tests/golden/mla/make_mla_goldens.py's CPU patches, one-rank groups, causal core attention
and weight filling; every YaRN computation is Megatron's code.
"""
import argparse
import json
import os
import platform
import sys

import torch

import megatron.core

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "mla"))
import make_mla_goldens as mla  # noqa: E402

SEED = 20261128
OUT_DEFAULT = os.path.join(HERE, "yarn_goldens.json")
POSITIONS = [0, 1, 2, 3, 7, 100, 1000, 4095, 4096, 8191]

# YaRN settings: the rotary head size (MLA's qk_pos_emb_head_dim), base, factor, original length,
# beta_fast, beta_slow, mscale, mscale_all_dim.
TABLES = [
    dict(name="deepseek_v3", dim=64, base=10000.0, factor=40.0, original=4096, beta_fast=32.0, beta_slow=1.0,
         mscale=1.0, mscale_all_dim=1.0),
    dict(name="cli_defaults", dim=64, base=10000.0, factor=1.0, original=4096, beta_fast=32.0, beta_slow=1.0,
         mscale=1.0, mscale_all_dim=0.0),
    dict(name="concentration", dim=16, base=10000.0, factor=4.0, original=512, beta_fast=16.0, beta_slow=2.0,
         mscale=1.0, mscale_all_dim=0.707),
    dict(name="equal_ends", dim=8, base=500000.0, factor=8.0, original=4, beta_fast=4.0, beta_slow=1.0,
         mscale=0.9, mscale_all_dim=0.0),
]

# MLA layers with YaRN (the shapes of tests/golden/mla with YaRN settings).
MLA_CASES = [
    dict(name="yarn_deepseek_scale", hidden=24, heads=4, q_lora_rank=10, kv_lora_rank=12, qk_head_dim=6,
         qk_pos_emb_head_dim=4, v_head_dim=5, qk_layernorm=True, batch=2, seq=7,
         factor=40.0, original=4096, beta_fast=32.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0),
    dict(name="yarn_concentration", hidden=16, heads=2, q_lora_rank=0, kv_lora_rank=8, qk_head_dim=4,
         qk_pos_emb_head_dim=8, v_head_dim=8, qk_layernorm=False, batch=1, seq=9,
         factor=4.0, original=4096, beta_fast=32.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=0.707),
]


def flat(tensor):
    return tensor.detach().reshape(-1).tolist()


def table_case(case):
    from megatron.core.models.common.embeddings.yarn_rotary_pos_embedding import (
        YarnRotaryEmbedding, _yarn_get_mscale)
    rope = YarnRotaryEmbedding(case["dim"], rotary_base=case["base"], use_cpu_initialization=True,
                               scaling_factor=case["factor"], original_max_position_embeddings=case["original"],
                               beta_fast=case["beta_fast"], beta_slow=case["beta_slow"], mscale=case["mscale"],
                               mscale_all_dim=case["mscale_all_dim"])
    emb, concentration = rope.forward(max(POSITIONS) + 1)  # [s, 1, 1, dim]
    emb = emb.reshape(emb.shape[0], -1)
    half = case["dim"] // 2
    rows = emb[POSITIONS]
    return {
        **case,
        "positions": POSITIONS,
        "inv_freq": flat(emb[1, :half]),
        "concentration": concentration,
        "softmax_mscale": _yarn_get_mscale(case["factor"], case["mscale_all_dim"]),
        "cos": flat((rows.cos() * concentration)[:, :half]),
        "sin": flat((rows.sin() * concentration)[:, :half]),
    }


def build_yarn_mla(case):
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.spec_utils import build_module
    from megatron.core.transformer.transformer_config import MLATransformerConfig

    config = MLATransformerConfig(
        num_layers=1, hidden_size=case["hidden"], num_attention_heads=case["heads"],
        q_lora_rank=case["q_lora_rank"] or None, kv_lora_rank=case["kv_lora_rank"],
        qk_head_dim=case["qk_head_dim"], qk_pos_emb_head_dim=case["qk_pos_emb_head_dim"],
        v_head_dim=case["v_head_dim"], rope_type="yarn", rotary_scaling_factor=case["factor"], rotary_base=10000,
        original_max_position_embeddings=case["original"], beta_fast=case["beta_fast"],
        beta_slow=case["beta_slow"], mscale=case["mscale"], mscale_all_dim=case["mscale_all_dim"],
        normalization="RMSNorm", layernorm_epsilon=1e-5, add_bias_linear=False, qk_layernorm=case["qk_layernorm"],
        attention_dropout=0.0, hidden_dropout=0.0, params_dtype=torch.float32, use_cpu_initialization=True,
        bias_dropout_fusion=False, apply_rope_fusion=False, masked_softmax_fusion=False,
        gradient_accumulation_fusion=False)
    spec = get_gpt_layer_local_spec(multi_latent_attention=True, qk_layernorm=case["qk_layernorm"],
                                    normalization="RMSNorm")
    attention_spec = spec.submodules.self_attention
    attention_spec.submodules.core_attention = mla.CausalCoreAttention
    return build_module(attention_spec, config=config, layer_number=1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=OUT_DEFAULT)
    args = parser.parse_args()
    mla.patch_for_cpu()
    mla.one_rank_groups()
    tables = [table_case(case) for case in TABLES]
    generator = torch.Generator().manual_seed(SEED)
    mla.build = build_yarn_mla  # run_case builds through mla.build
    layers = [mla.run_case(case, generator) for case in MLA_CASES]
    result = {
        "generator": {"script": "tests/golden/yarn/make_yarn_goldens.py", "python": platform.python_version(),
                      "torch": torch.__version__, "megatron_core": megatron.core.__version__, "seed": SEED},
        "tables": tables,
        "mla": layers,
    }
    with open(args.out + ".tmp", "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    os.replace(args.out + ".tmp", args.out)
    print("wrote", args.out, [c["name"] for c in tables], [c["name"] for c in layers],
          [(c["name"], c["softmax_scale"]) for c in layers])


if __name__ == "__main__":
    main()
