#!/usr/bin/env python3
"""Router goldens made by Megatron-Core's own router functions (issue 22).

Writes tests/golden/moe/router_goldens.json (format: README.md beside this script), which
tests/unit/model/test_router_megatron.cpp reads. Each value comes from calling Megatron-Core's
functions in megatron/core/transformer/moe/moe_utils.py on fixed random fp32 CPU tensors, in the
order TopKRouter.routing (router.py) calls them; gradients come from torch autograd through them.

Made by hand in a venv outside the repository (CI never runs this script):
    python3 -m venv /work/venv-megatron
    /work/venv-megatron/bin/pip install torch==2.6.0 megatron-core==0.16.1
    /work/venv-megatron/bin/python tests/golden/moe/make_router_goldens.py
The committed goldens were made with Python 3.11.7, torch 2.6.0 (PyPI) and megatron-core 0.16.1
(PyPI); the JSON's "generator" records the versions of the run that wrote it.

What had to be done around Megatron's code (all on one CPU process):
- get_updated_expert_bias all-reduces the counts over
  parallel_state.get_tensor_and_data_parallel_group(with_context_parallel=True); the script
  starts a one-rank gloo process group and points that getter at it, and sums the per-rank counts
  itself (the all-reduce over one rank is the identity).
- The reduce groups of the aux losses (TP x CP, TP x DP x CP) are emulated as TopKRouter's
  get_tokens_per_expert_and_token_count does: counts summed over the ranks' routing maps and
  total_num_tokens = local tokens * ranks; switch_load_balancing_loss_func is then called per rank.
- The "full_router" cases run TopKRouter.routing itself (TransformerConfig, a ProcessGroupCollection
  of the one-rank gloo group, torch.cuda.current_device patched to the CPU for its count buffers).
  `--check-topk-router JSON` checks that emulation: it runs every aux-loss and z-loss case of the
  written goldens through TopKRouter.routing itself, on `ranks` CPU processes joined by a gloo
  group standing in for tp_cp and tp_dp_cp (torch.cuda.current_device patched to the CPU for the
  router's count buffers), and prints the largest difference of the logits' gradients (for the
  committed goldens: 0 in every case, bit-identical; the check takes about 15 minutes on 2 cores,
  most of it importing Megatron-Core in each spawned process).
"""
import argparse
import json
import os
import platform
import sys

import torch
import torch.distributed as dist

import megatron.core
from megatron.core import parallel_state
from megatron.core.transformer.moe import moe_utils

SEED = 20261127
OUT_DEFAULT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "router_goldens.json")


def flat(tensor):
    """A tensor as a flat list of Python numbers (fp32 values widened exactly to double)."""
    tensor = tensor.detach()
    if tensor.dtype == torch.bool:
        tensor = tensor.to(torch.int32)
    return tensor.reshape(-1).tolist()


class Logits:
    """Seeded fp32 logits and upstream gradients; every case draws from the same stream in order."""

    def __init__(self, seed):
        self.generator = torch.Generator().manual_seed(seed)

    def normal(self, *shape, scale=1.0):
        return torch.randn(*shape, generator=self.generator, dtype=torch.float32) * scale

    def uniform(self, *shape, low=0.0, high=1.0):
        return low + (high - low) * torch.rand(*shape, generator=self.generator, dtype=torch.float32)

    def integers(self, *shape, high):
        return torch.randint(0, high, shape, generator=self.generator)


def route(logits, topk, score_function, pre_softmax, num_groups, group_topk, scaling_factor, expert_bias):
    """Megatron's topk_routing_with_score_function with the router's arguments."""
    return moe_utils.topk_routing_with_score_function(
        logits,
        topk,
        use_pre_softmax=pre_softmax,
        num_groups=num_groups or None,
        group_topk=group_topk or None,
        scaling_factor=scaling_factor,
        score_function=score_function,
        expert_bias=expert_bias,
    )


def topk_routing_case(rng, name, tokens, experts, topk, score_function, pre_softmax=False, num_groups=0,
                      group_topk=0, scaling_factor=None, with_bias=False, logit_scale=2.0):
    logits = rng.normal(tokens, experts, scale=logit_scale)
    # Positive biased scores (sigmoid in (0, 1) plus a bias in [0, 0.25)): HF masks dropped groups
    # with 0.0 where Megatron uses -inf, so positive scores keep the two equal.
    expert_bias = rng.uniform(experts, high=0.25) if with_bias else None
    grad_probs = rng.normal(tokens, experts)
    leaf = logits.clone().requires_grad_(True)
    probs, routing_map = route(leaf, topk, score_function, pre_softmax, num_groups, group_topk, scaling_factor,
                               expert_bias)
    (probs * grad_probs).sum().backward()
    return {
        "name": name, "tokens": tokens, "experts": experts, "topk": topk, "score_function": score_function,
        "pre_softmax": pre_softmax, "num_groups": num_groups, "group_topk": group_topk,
        "scaling_factor": scaling_factor, "expert_bias": None if expert_bias is None else flat(expert_bias),
        "logits": flat(logits), "probs": flat(probs), "routing_map": flat(routing_map),
        "grad_probs": flat(grad_probs), "grad_logits": flat(leaf.grad),
    }


def topk_routing_cases(rng):
    return [
        topk_routing_case(rng, "softmax_mixtral_s16_e8_k2", 16, 8, 2, "softmax"),
        topk_routing_case(rng, "softmax_pre_s16_e8_k2", 16, 8, 2, "softmax", pre_softmax=True),
        topk_routing_case(rng, "softmax_pre_s12_e4_k1", 12, 4, 1, "softmax", pre_softmax=True),
        topk_routing_case(rng, "softmax_scaled_s10_e8_k3", 10, 8, 3, "softmax", scaling_factor=1.5),
        topk_routing_case(rng, "softmax_pre_scaled_s10_e8_k3", 10, 8, 3, "softmax", pre_softmax=True,
                          scaling_factor=1.5),
        topk_routing_case(rng, "sigmoid_s12_e8_k1", 12, 8, 1, "sigmoid"),
        topk_routing_case(rng, "sigmoid_s12_e8_k2", 12, 8, 2, "sigmoid"),
        topk_routing_case(rng, "sigmoid_bias_s16_e16_k4", 16, 16, 4, "sigmoid", with_bias=True),
        topk_routing_case(rng, "sigmoid_bias_k1_s12_e8", 12, 8, 1, "sigmoid", with_bias=True),
        topk_routing_case(rng, "sigmoid_bias_scaled_s16_e16_k4", 16, 16, 4, "sigmoid", with_bias=True,
                          scaling_factor=2.5),
        topk_routing_case(rng, "softmax_groups4_top2_s16_e16_k4", 16, 16, 4, "softmax", num_groups=4,
                          group_topk=2),
        topk_routing_case(rng, "softmax_pre_groups4_top2_s16_e16_k4", 16, 16, 4, "softmax", pre_softmax=True,
                          num_groups=4, group_topk=2),
        topk_routing_case(rng, "sigmoid_groups4_top2_s16_e16_k4", 16, 16, 4, "sigmoid", num_groups=4,
                          group_topk=2),
        topk_routing_case(rng, "sigmoid_bias_groups4_top2_s16_e16_k4", 16, 16, 4, "sigmoid", num_groups=4,
                          group_topk=2, with_bias=True),
        topk_routing_case(rng, "deepseek_v3_sigmoid_bias_groups8_top4_s6_e64_k8", 6, 64, 8, "sigmoid",
                          num_groups=8, group_topk=4, scaling_factor=2.5, with_bias=True),
    ] + group_scores_beyond_top2_cases()


def group_scores_beyond_top2_cases():
    """Group limits where a group's score sums its top 3 (k / group_topk), not DeepSeek's fixed top 2;
    drawn from their own stream so the cases above keep their logits."""
    rng = Logits(SEED + 1)
    return [
        topk_routing_case(rng, "sigmoid_bias_groups4_top1_s12_e16_k3", 12, 16, 3, "sigmoid", num_groups=4,
                          group_topk=1, with_bias=True),
        topk_routing_case(rng, "softmax_groups8_top2_s8_e32_k6", 8, 32, 6, "softmax", num_groups=8, group_topk=2),
    ]


def keep_mask_lower_row_first(probs_in, map_in, capacity, drop_policy):
    """The capacity keep mask with ties broken by the lower row: per expert the `capacity` rows of
    highest prob (policy probs) or map value (policy position: routed rows first), equal values by
    ascending row; every row when capacity > rows (apply_router_token_dropping's own shortcut)."""
    tokens, experts = probs_in.shape
    if capacity > tokens:
        return torch.ones(tokens, experts, dtype=torch.bool)
    values = probs_in if drop_policy == "probs" else map_in.to(torch.float32)
    keep = torch.zeros(tokens, experts, dtype=torch.bool)
    for e in range(experts):
        order = sorted(range(tokens), key=lambda t: (-values[t, e].item(), t))
        keep[order[:capacity], e] = True
    return keep


def tied_entries(probs_in, map_in, capacity, drop_policy, pad_to_capacity):
    """The entries whose place in the output depends on how torch.topk breaks ties: per expert, the
    rows whose kept value equals the capacity-th largest of the column (when anything is dropped),
    as far as the output map depends on them (an unrouted row matters only with padding)."""
    tokens, experts = probs_in.shape
    tied = torch.zeros(tokens, experts, dtype=torch.bool)
    if capacity > tokens:
        return tied
    values = probs_in if drop_policy == "probs" else map_in.to(torch.float32)
    for e in range(experts):
        boundary = torch.sort(values[:, e], descending=True).values[capacity - 1]
        at_boundary = values[:, e] == boundary
        if (values[:, e] >= boundary).sum() > capacity:  # more rows at the boundary than places
            tied[:, e] = at_boundary if pad_to_capacity else at_boundary & map_in[:, e]
    return tied


def ties_by_lower_row(probs_in, map_in, map_out, capacity, drop_policy, pad_to_capacity):
    """Whether torch.topk's (unspecified) tie order gave the lower-row-first result."""
    keep = keep_mask_lower_row_first(probs_in, map_in, capacity, drop_policy)
    expected = keep if pad_to_capacity else keep & map_in
    return bool(torch.equal(expected, map_out))


def token_dropping_case(rng, name, tokens, experts, topk, score_function, capacity_factor, drop_policy,
                        pad_to_capacity, pre_softmax=False):
    logits = rng.normal(tokens, experts, scale=2.0)
    probs_in, map_in = route(logits, topk, score_function, pre_softmax, 0, 0, None, None)
    probs, routing_map = moe_utils.apply_router_token_dropping(
        probs_in, map_in, router_topk=topk, capacity_factor=capacity_factor, drop_policy=drop_policy,
        pad_to_capacity=pad_to_capacity)
    capacity = moe_utils.get_capacity(num_tokens=tokens * topk, num_experts=experts, capacity_factor=capacity_factor)
    return {
        "name": name, "tokens": tokens, "experts": experts, "topk": topk, "capacity_factor": capacity_factor,
        "drop_policy": drop_policy, "pad_to_capacity": pad_to_capacity, "score_function": score_function,
        "pre_softmax": pre_softmax, "logits": flat(logits), "capacity": capacity,
        "probs_in": flat(probs_in), "routing_map_in": flat(map_in), "probs": flat(probs),
        "routing_map": flat(routing_map),
        "tied": flat(tied_entries(probs_in, map_in, capacity, drop_policy, pad_to_capacity)),
        "ties_by_lower_row": ties_by_lower_row(probs_in, map_in, routing_map, capacity, drop_policy, pad_to_capacity),
    }


def token_dropping_cases(rng):
    cases = []
    for policy in ("probs", "position"):
        for pad in (False, True):
            suffix = f"{policy}{'_pad' if pad else ''}"
            cases.append(token_dropping_case(rng, f"cf1_{suffix}_s16_e8_k2", 16, 8, 2, "softmax", 1.0, policy, pad))
            cases.append(token_dropping_case(rng, f"cf0.5_{suffix}_s16_e8_k2", 16, 8, 2, "softmax", 0.5, policy,
                                             pad))
            cases.append(token_dropping_case(rng, f"cf1.3_{suffix}_sigmoid_s13_e6_k3", 13, 6, 3, "sigmoid", 1.3,
                                             policy, pad))
        cases.append(token_dropping_case(rng, f"cf4_capacity_equals_tokens_{policy}_s16_e8_k2", 16, 8, 2,
                                         "softmax", 4.0, policy, False))
        cases.append(token_dropping_case(rng, f"cf5_no_drop_{policy}_pad_s16_e8_k2", 16, 8, 2, "softmax", 5.0,
                                         policy, True))
    return cases


def to_megatron_order(rows, seq_length, batch):
    """mt's sample-major rows (b*seq_length + s) -> Megatron's [s, b] rows (s*batch + b)."""
    experts = rows.shape[-1]
    return rows.reshape(batch, seq_length, experts).transpose(0, 1).reshape(seq_length * batch, experts)


def from_megatron_order(rows, seq_length, batch):
    experts = rows.shape[-1]
    return rows.reshape(seq_length, batch, experts).transpose(0, 1).reshape(seq_length * batch, experts)


def aux_loss_case(rng, name, loss_type, score_function, experts, topk, coeff, ranks, micro_batches=1,
                  tokens=None, seq_length=1, batch=1):
    """Per (micro-batch, rank): Megatron's aux value and its gradient w.r.t. that rank's logits."""
    if loss_type == "seq_aux_loss":
        tokens = seq_length * batch
    logits = rng.normal(micro_batches, ranks, tokens, experts, scale=1.5)
    values, grads, counts_used = [], [], []
    global_counts = torch.zeros(experts)
    for m in range(micro_batches):
        leaves = [logits[m, r].clone().requires_grad_(True) for r in range(ranks)]
        scored = []
        for leaf in leaves:
            rows = to_megatron_order(leaf, seq_length, batch) if loss_type == "seq_aux_loss" else leaf
            routing_map, scores = moe_utils.compute_routing_scores_for_aux_loss(rows, topk, score_function)
            if loss_type == "seq_aux_loss":  # TopKRouter._apply_seq_aux_loss: [s, b*E], k -> k*b
                routing_map = routing_map.reshape(seq_length, -1)
                scores = scores.reshape(seq_length, -1)
            scored.append((routing_map, scores))
        # get_tokens_per_expert_and_token_count: counts all-reduced over the group, T = local * size.
        reduced = sum(routing_map.sum(dim=0) for routing_map, _ in scored)
        total_tokens = scored[0][0].shape[0] * ranks
        if loss_type == "global_aux_loss":  # running average over the micro-batches of the batch
            global_counts = global_counts + reduced
            reduced = global_counts / (m + 1)
        counts_used.append(reduced)
        for leaf, (_, scores) in zip(leaves, scored):
            value = moe_utils.switch_load_balancing_loss_func(
                probs=scores, tokens_per_expert=reduced, total_num_tokens=total_tokens, topk=topk,
                num_experts=experts, moe_aux_loss_coeff=coeff)
            if loss_type == "seq_aux_loss":
                value = value / batch
            value.backward()
            values.append(value.item())
            grads.append(leaf.grad.clone())
    return {
        "name": name, "type": loss_type, "score_function": score_function, "tokens": tokens,
        "experts": experts, "topk": topk, "coeff": coeff, "ranks": ranks, "micro_batches": micro_batches,
        "seq_length": seq_length, "batch": batch, "logits": flat(logits), "values": values,
        "grad_logits": flat(torch.stack(grads)), "tokens_per_expert": flat(torch.stack(counts_used)),
    }


def aux_loss_cases(rng):
    return [
        aux_loss_case(rng, "aux_softmax_s16_e8_k2", "aux_loss", "softmax", 8, 2, 1e-2, 1, tokens=16),
        aux_loss_case(rng, "aux_sigmoid_s12_e16_k4", "aux_loss", "sigmoid", 16, 4, 1e-2, 1, tokens=12),
        aux_loss_case(rng, "aux_softmax_2ranks_s8_e8_k2", "aux_loss", "softmax", 8, 2, 1e-2, 2, tokens=8),
        aux_loss_case(rng, "seq_aux_softmax_seq8_b3_e8_k2", "seq_aux_loss", "softmax", 8, 2, 1e-4, 1,
                      seq_length=8, batch=3),
        aux_loss_case(rng, "seq_aux_sigmoid_2ranks_seq5_b2_e16_k4", "seq_aux_loss", "sigmoid", 16, 4, 1e-4, 2,
                      seq_length=5, batch=2),
        aux_loss_case(rng, "global_aux_softmax_2ranks_3mb_s8_e8_k2", "global_aux_loss", "softmax", 8, 2, 1e-2, 2,
                      micro_batches=3, tokens=8),
        aux_loss_case(rng, "global_aux_sigmoid_2mb_s10_e16_k4", "global_aux_loss", "sigmoid", 16, 4, 1e-3, 1,
                      micro_batches=2, tokens=10),
    ]


def z_loss_case(rng, name, tokens, experts, coeff, ranks):
    logits = rng.normal(ranks, tokens, experts, scale=3.0)
    values, grads = [], []
    for r in range(ranks):
        leaf = logits[r].clone().requires_grad_(True)
        value = moe_utils.z_loss_func(leaf, coeff / ranks)  # TopKRouter.apply_z_loss divides by |TP x CP|
        value.backward()
        values.append(value.item())
        grads.append(leaf.grad.clone())
    return {"name": name, "tokens": tokens, "experts": experts, "coeff": coeff, "ranks": ranks,
            "logits": flat(logits), "values": values, "grad_logits": flat(torch.stack(grads))}


def z_loss_cases(rng):
    return [z_loss_case(rng, "z_s16_e8", 16, 8, 1e-3, 1), z_loss_case(rng, "z_2ranks_s7_e64", 7, 64, 1e-3, 2)]


def expert_bias_case(rng, name, experts, rate, ranks, tie_expert=None):
    counts_per_rank = rng.integers(ranks, experts, high=20).to(torch.float32)
    if tie_expert is not None:  # one expert exactly at the (integer) mean: sign(0) = 0 keeps its bias
        counts_per_rank[:, tie_expert] = 0
        others = counts_per_rank.sum()
        counts_per_rank[0, (tie_expert + 1) % experts] += (-others) % (experts - 1)
        counts_per_rank[0, tie_expert] = counts_per_rank.sum() / (experts - 1)
    counts = counts_per_rank.sum(dim=0)
    expert_bias = rng.normal(experts, scale=0.01)
    updated = moe_utils.get_updated_expert_bias(counts.clone(), expert_bias, rate)
    return {"name": name, "experts": experts, "rate": rate, "counts_per_rank": flat(counts_per_rank),
            "counts": flat(counts), "expert_bias": flat(expert_bias), "updated": flat(updated)}


def expert_bias_cases(rng):
    return [expert_bias_case(rng, "bias_e8_1rank", 8, 1e-3, 1),
            expert_bias_case(rng, "bias_e8_4ranks_tie", 8, 1e-3, 4, tie_expert=3),
            expert_bias_case(rng, "bias_e64_2ranks_rate0.01", 64, 1e-2, 2)]


def one_rank_gloo_group():
    """A one-process gloo group standing in for TP x DP x CP in get_updated_expert_bias."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("gloo", rank=0, world_size=1)
    parallel_state.get_tensor_and_data_parallel_group = lambda with_context_parallel=False: dist.group.WORLD


def topk_router(case, group, loss_type, z_loss_coeff, **moe_settings):
    """Megatron's TopKRouter for a golden case, its groups all `group`, training."""
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.transformer.moe.router import TopKRouter
    from megatron.core.transformer.transformer_config import TransformerConfig
    torch.cuda.current_device = lambda: "cpu"  # the router's count buffers; no GPU here
    config = TransformerConfig(
        num_layers=1, hidden_size=8, num_attention_heads=1, num_moe_experts=case["experts"],
        moe_router_topk=case.get("topk", 2), moe_router_score_function=case.get("score_function", "softmax"),
        moe_router_load_balancing_type=loss_type, moe_aux_loss_coeff=case.get("coeff", 0.0),
        moe_z_loss_coeff=z_loss_coeff, moe_ffn_hidden_size=8, ffn_hidden_size=8, **moe_settings)
    groups = ProcessGroupCollection(tp=group, cp=group, tp_cp=group, tp_dp_cp=group)
    router = TopKRouter(config=config, pg_collection=groups)
    router.train()
    return router


def full_router_case(rng, name, experts, topk, loss_type, coeff, z_loss_coeff, seq_length, batch, micro_batches=1,
                     score_function="softmax", with_bias=False, backward_scale=0.25, **moe_settings):
    """TopKRouter.routing itself on one rank (a one-process gloo group): every step in Megatron's
    order, the probs' backward carrying the aux loss and z-loss gradients times backward_scale
    (MoEAuxLossAutoScaler.set_loss_scale, the trainer's main_loss_backward_scale)."""
    from megatron.core.transformer.moe.moe_utils import MoEAuxLossAutoScaler
    case = {"experts": experts, "topk": topk, "score_function": score_function, "coeff": coeff}
    router = topk_router(case, dist.group.WORLD, loss_type, z_loss_coeff, **moe_settings)
    router.set_layer_number(1)  # so the router records its logged values
    expert_bias = rng.uniform(experts, high=0.25) if with_bias else None
    if with_bias:
        router.expert_bias.copy_(expert_bias)
    MoEAuxLossAutoScaler.set_loss_scale(torch.tensor(backward_scale))
    tokens = seq_length * batch
    logits = rng.normal(micro_batches, tokens, experts, scale=1.5)
    grad_probs = rng.normal(micro_batches, tokens, experts)
    probs_out, maps_out, grads, logged_aux, logged_z = [], [], [], [], []
    tracker = moe_utils.get_moe_layer_wise_logging_tracker()
    for m in range(micro_batches):
        moe_utils.clear_aux_losses_tracker()
        leaf = logits[m].clone().requires_grad_(True)
        shaped = to_megatron_order(leaf, seq_length, batch).reshape(seq_length, batch, experts)
        probs, routing_map = router.routing(shaped)
        (probs * to_megatron_order(grad_probs[m], seq_length, batch)).sum().backward()
        probs_out.append(from_megatron_order(probs.detach(), seq_length, batch))
        maps_out.append(from_megatron_order(routing_map.to(torch.int32), seq_length, batch))
        grads.append(leaf.grad.clone())
        logged = {key: value["values"][0].item() for key, value in tracker.items()}
        logged_aux.append(logged.get({"aux_loss": "load_balancing_loss", "seq_aux_loss": "seq_load_balancing_loss",
                                      "global_aux_loss": "global_load_balancing_loss"}.get(loss_type), None))
        logged_z.append(logged["z_loss"] if z_loss_coeff is not None else None)
    MoEAuxLossAutoScaler.set_loss_scale(torch.tensor(1.0))
    return {
        "name": name, "experts": experts, "topk": topk, "score_function": score_function,
        "pre_softmax": moe_settings.get("moe_router_pre_softmax", False),
        "num_groups": moe_settings.get("moe_router_num_groups") or 0,
        "group_topk": moe_settings.get("moe_router_group_topk") or 0,
        "scaling_factor": moe_settings.get("moe_router_topk_scaling_factor"),
        "expert_bias": None if expert_bias is None else flat(expert_bias),
        "load_balancing_type": loss_type, "aux_loss_coeff": coeff, "z_loss_coeff": z_loss_coeff,
        "capacity_factor": moe_settings.get("moe_expert_capacity_factor"),
        "drop_policy": moe_settings.get("moe_token_drop_policy", "probs"),
        "pad_to_capacity": moe_settings.get("moe_pad_expert_input_to_capacity", False),
        "seq_length": seq_length, "batch": batch, "tokens": tokens, "micro_batches": micro_batches,
        "calculate_per_token_loss": moe_settings.get("calculate_per_token_loss", False),
        "backward_scale": backward_scale, "logits": flat(logits), "grad_probs": flat(grad_probs),
        "probs": flat(torch.stack(probs_out)), "routing_map": flat(torch.stack(maps_out)),
        "grad_logits": flat(torch.stack(grads)), "logged_aux": logged_aux, "logged_z": logged_z,
        "tokens_per_expert": None if not with_bias else flat(router.local_tokens_per_expert),
    }


def full_router_cases():
    """TopKRouter.routing end to end; drawn from their own stream."""
    rng = Logits(SEED + 2)
    return [
        full_router_case(rng, "mixtral_aux_z_capacity_probs_s8_b2_e8_k2", 8, 2, "aux_loss", 1e-2, 1e-3, 8, 2,
                         moe_expert_capacity_factor=1.0, moe_token_drop_policy="probs"),
        full_router_case(rng, "deepseek_sigmoid_bias_groups_seq_aux_s6_b2_e16_k4", 16, 4, "seq_aux_loss", 1e-4, None,
                         6, 2, score_function="sigmoid", with_bias=True, moe_router_enable_expert_bias=True,
                         moe_router_num_groups=4, moe_router_group_topk=2, moe_router_topk_scaling_factor=2.5),
        full_router_case(rng, "pre_softmax_global_aux_z_2mb_s12_e8_k2", 8, 2, "global_aux_loss", 1e-2, 1e-3, 12, 1,
                         micro_batches=2, moe_router_pre_softmax=True),
        full_router_case(rng, "sigmoid_bias_capacity_aux_s10_e8_k2", 8, 2, "aux_loss", 1e-2, 2e-3, 10, 1,
                         score_function="sigmoid", with_bias=True, moe_router_enable_expert_bias=True,
                         moe_expert_capacity_factor=1.5, moe_token_drop_policy="probs"),
    ] + per_token_loss_cases()


def per_token_loss_cases():
    """--calculate-per-token-loss (aux and z-loss multiplied by the local tokens); own stream."""
    rng = Logits(SEED + 3)
    return [full_router_case(rng, "per_token_loss_aux_z_s9_e8_k2", 8, 2, "aux_loss", 1e-2, 1e-3, 9, 1,
                             calculate_per_token_loss=True)]


def check_rank(rank, case, kind, results):
    """One rank of --check-topk-router: the case's logits through TopKRouter.routing."""
    dist.init_process_group("gloo", rank=rank, world_size=case["ranks"])
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    ranks, tokens, experts = case["ranks"], case["tokens"], case["experts"]
    micro_batches = case.get("micro_batches", 1)
    logits = torch.tensor(case["logits"], dtype=torch.float32).reshape(micro_batches, ranks, tokens, experts)
    if kind == "z_loss":
        router = topk_router(case, dist.group.WORLD, "none", case["coeff"])
    else:
        router = topk_router(case, dist.group.WORLD, case["type"], None)
    grads = []
    for m in range(micro_batches):
        leaf = logits[m, rank].clone().requires_grad_(True)
        if kind != "z_loss" and case["type"] == "seq_aux_loss":  # [s, b, E], Megatron's order
            rows = to_megatron_order(leaf, case["seq_length"], case["batch"])
            shaped = rows.reshape(case["seq_length"], case["batch"], experts)
        else:
            shaped = leaf.reshape(tokens, 1, experts)
        probs, _ = router.routing(shaped)
        probs.backward(torch.zeros_like(probs))  # only the attached losses' gradients (scale 1)
        grads.append(leaf.grad.clone())
    results.put((rank, flat(torch.stack(grads))))  # plain numbers: the process ends before they are read
    dist.destroy_process_group()


def check_against_topk_router(path):
    import torch.multiprocessing as mp
    goldens = json.load(open(path))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    worst = 0.0
    for kind in ("aux_loss", "z_loss"):
        for port, case in enumerate(goldens[kind]):
            os.environ["MASTER_PORT"] = str(29600 + port + (50 if kind == "z_loss" else 0))
            context = mp.get_context("spawn")
            results = context.Queue()
            workers = [context.Process(target=check_rank, args=(r, case, kind, results)) for r in range(case["ranks"])]
            for worker in workers:
                worker.start()
            by_rank = dict(results.get() for _ in workers)
            for worker in workers:
                worker.join()
            ranks, tokens, experts = case["ranks"], case["tokens"], case["experts"]
            golden = torch.tensor(case["grad_logits"]).reshape(-1, ranks, tokens, experts)
            ran = torch.stack([torch.tensor(by_rank[r]).reshape(-1, tokens, experts) for r in range(ranks)], dim=1)
            difference = (ran - golden).abs().max().item()
            scale = golden.abs().max().item()
            worst = max(worst, difference / scale)
            print(f"{kind} {case['name']}: max |TopKRouter - golden| of dlogits = {difference:.3g}"
                  f" (largest |golden| {scale:.3g})")
    print(f"largest relative difference: {worst:.3g}")
    return 0 if worst <= 1e-6 else 1


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=OUT_DEFAULT, help="where to write the JSON (default: beside this script)")
    parser.add_argument("--check-topk-router", metavar="JSON",
                        help="instead of writing: rerun the aux-loss and z-loss cases of JSON through TopKRouter")
    args = parser.parse_args()
    if args.check_topk_router:
        sys.exit(check_against_topk_router(args.check_topk_router))
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    one_rank_gloo_group()
    rng = Logits(SEED)
    goldens = {
        "generator": {"script": "tests/golden/moe/make_router_goldens.py",
                      "megatron_core": megatron.core.__version__, "torch": torch.__version__,
                      "python": platform.python_version(), "seed": SEED},
        "topk_routing": topk_routing_cases(rng),
        "token_dropping": token_dropping_cases(rng),
        "aux_loss": aux_loss_cases(rng),
        "z_loss": z_loss_cases(rng),
        "expert_bias_update": expert_bias_cases(rng),
        "full_router": full_router_cases(),
    }
    dist.destroy_process_group()
    temporary = args.out + ".tmp"
    with open(temporary, "w") as out:
        json.dump(goldens, out, separators=(",", ":"))
        out.write("\n")
    os.replace(temporary, args.out)
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
