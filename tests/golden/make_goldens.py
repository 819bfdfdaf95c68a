#!/usr/bin/python3
"""PyTorch golden-reference generator for mt's training tests.

Reads the initial parameters mt writes (`mt-train ... --save-init INIT.h5`), rebuilds the same
GPT or LLaMA model in PyTorch (fp32, CPU, deterministic, one thread), trains it for the case's
train_iters steps on a learnable stream drawn from mt's Philox mock data (case_tokens) with
Megatron's loss averaging, grad clipping, LR schedule and AdamW, and writes the goldens (step-0
logits, per-step loss / grad norm / LR, the tokens and the final parameters) that mt's tests
compare against. The spec it follows is in README.md next to this file; the cases are in
cases.json.

    make_goldens.py --case tiny-gpt2 --init INIT.h5 --out GOLDEN.h5
    make_goldens.py --case tiny-gpt2 --random-init INIT.h5   # writes a random init in mt's layout
"""

import argparse
import json
import math
import os
import sys

import h5py
import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import philox  # noqa: E402

CASES_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cases.json")
MT_FORMAT = "mt-checkpoint"
MT_FORMAT_VERSION = 1
CLIP_EPSILON = 1e-6


def load_case(name):
    """The case dictionary `name` from cases.json."""
    with open(CASES_PATH) as handle:
        cases = json.load(handle)
    if name not in cases:
        raise SystemExit("unknown case %r (cases.json has: %s)" % (name, ", ".join(sorted(cases))))
    return cases[name]


def padded_vocab_size(case):
    """vocab_size rounded up to a multiple of make_vocab_size_divisible_by."""
    multiple = case["make_vocab_size_divisible_by"]
    return -(-case["vocab_size"] // multiple) * multiple


def parameter_shapes(case):
    """Ordered {name: shape} of every global parameter of the case's model, in mt's naming."""
    hidden, ffn, layers = case["hidden_size"], case["ffn_hidden_size"], case["num_layers"]
    heads, groups = case["num_attention_heads"], case["num_query_groups"]
    if hidden % heads != 0 or heads % groups != 0:
        raise SystemExit("hidden_size must divide by heads and heads by query groups")
    head_dim = hidden // heads
    q_width, kv_width = heads * head_dim, groups * head_dim
    vocab = padded_vocab_size(case)
    shapes = {}
    if case["model"] == "gpt":
        if groups != heads:
            raise SystemExit("the gpt model has no grouped-query attention")
        shapes["embedding.word_embeddings.weight"] = (vocab, hidden)
        shapes["embedding.position_embeddings.weight"] = (case["max_position_embeddings"], hidden)
        for layer in range(layers):
            prefix = "decoder.layers.%d." % layer
            shapes[prefix + "input_layernorm.weight"] = (hidden,)
            shapes[prefix + "input_layernorm.bias"] = (hidden,)
            for projection in ("linear_q", "linear_k", "linear_v"):
                shapes[prefix + "self_attention.%s.weight" % projection] = (q_width, hidden)
                shapes[prefix + "self_attention.%s.bias" % projection] = (q_width,)
            shapes[prefix + "self_attention.linear_proj.weight"] = (hidden, q_width)
            shapes[prefix + "self_attention.linear_proj.bias"] = (hidden,)
            shapes[prefix + "pre_mlp_layernorm.weight"] = (hidden,)
            shapes[prefix + "pre_mlp_layernorm.bias"] = (hidden,)
            shapes[prefix + "mlp.linear_fc1.weight"] = (ffn, hidden)
            shapes[prefix + "mlp.linear_fc1.bias"] = (ffn,)
            shapes[prefix + "mlp.linear_fc2.weight"] = (hidden, ffn)
            shapes[prefix + "mlp.linear_fc2.bias"] = (hidden,)
        shapes["decoder.final_layernorm.weight"] = (hidden,)
        shapes["decoder.final_layernorm.bias"] = (hidden,)
    elif case["model"] == "llama":
        shapes["embedding.word_embeddings.weight"] = (vocab, hidden)
        for layer in range(layers):
            prefix = "decoder.layers.%d." % layer
            shapes[prefix + "input_layernorm.weight"] = (hidden,)
            shapes[prefix + "self_attention.linear_q.weight"] = (q_width, hidden)
            shapes[prefix + "self_attention.linear_k.weight"] = (kv_width, hidden)
            shapes[prefix + "self_attention.linear_v.weight"] = (kv_width, hidden)
            shapes[prefix + "self_attention.linear_proj.weight"] = (hidden, q_width)
            shapes[prefix + "pre_mlp_layernorm.weight"] = (hidden,)
            shapes[prefix + "mlp.linear_fc1_gate.weight"] = (ffn, hidden)
            shapes[prefix + "mlp.linear_fc1_up.weight"] = (ffn, hidden)
            shapes[prefix + "mlp.linear_fc2.weight"] = (hidden, ffn)
        shapes["decoder.final_layernorm.weight"] = (hidden,)
        shapes["output_layer.weight"] = (vocab, hidden)
    else:
        raise SystemExit("unknown model %r" % case["model"])
    return shapes


def is_norm_parameter(name):
    """True for the weights and biases of LayerNorm / RMSNorm modules."""
    return "layernorm" in name


def write_random_init(case, path):
    """Write an init file in mt's layout: N(0, init_method_std) weights, zero biases, unit norms."""
    generator = torch.Generator().manual_seed(case["seed"])
    with h5py.File(path, "w") as handle:
        handle.attrs["mt_format"] = np.bytes_(MT_FORMAT)
        handle.attrs["mt_format_version"] = np.int64(MT_FORMAT_VERSION)
        handle.attrs["iteration"] = np.int64(0)
        handle.attrs["consumed_samples"] = np.int64(0)
        handle.attrs["config"] = np.bytes_(json.dumps(case, sort_keys=True))
        model_group = handle.create_group("model")
        for name, shape in parameter_shapes(case).items():
            if is_norm_parameter(name) and name.endswith(".weight"):
                values = torch.ones(shape)
            elif name.endswith(".bias"):
                values = torch.zeros(shape)
            else:
                values = torch.normal(0.0, case["init_method_std"], size=shape, generator=generator)
            model_group.create_dataset(name, data=values.numpy().astype(np.float32))


def read_init(case, path):
    """{name: fp32 leaf tensor requiring grad} from an mt init file, checked against the case."""
    shapes = parameter_shapes(case)
    with h5py.File(path, "r") as handle:
        mt_format = handle.attrs.get("mt_format")
        if isinstance(mt_format, bytes):
            mt_format = mt_format.decode()
        if mt_format != MT_FORMAT:
            raise SystemExit("%s: mt_format is %r, expected %r" % (path, mt_format, MT_FORMAT))
        stored = set(handle["model"].keys())
        missing = [name for name in shapes if name not in stored]
        unexpected = sorted(stored - set(shapes))
        if missing or unexpected:
            raise SystemExit("%s: missing tensors %s, unexpected tensors %s" % (path, missing, unexpected))
        params = {}
        for name, shape in shapes.items():
            values = handle["model"][name][()]
            if tuple(values.shape) != shape:
                raise SystemExit("%s: %s has shape %s, expected %s" % (path, name, values.shape, shape))
            params[name] = torch.tensor(values.astype(np.float32), dtype=torch.float32, requires_grad=True)
    return params


def causal_attention(query, key, value):
    """Softmax attention with a causal mask; inputs (B, heads, T, D), output (B, T, heads*D)."""
    batch, heads, seq, head_dim = query.shape
    scores = torch.matmul(query, key.transpose(-1, -2)) * (1.0 / math.sqrt(head_dim))
    future = torch.triu(torch.ones(seq, seq, dtype=torch.bool), diagonal=1)
    probs = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
    return torch.matmul(probs, value).transpose(1, 2).reshape(batch, seq, heads * head_dim)


def gpt_forward(params, tokens, case):
    """Logits (B, T, vocab_size) of the GPT model: learned positions, LayerNorm, GELU-tanh MLP, tied output."""
    batch, seq = tokens.shape
    heads, eps = case["num_attention_heads"], case["norm_epsilon"]
    hidden = case["hidden_size"]
    head_dim = hidden // heads
    word_embeddings = params["embedding.word_embeddings.weight"]
    positions = torch.arange(seq)
    x = F.embedding(tokens, word_embeddings) + F.embedding(positions, params["embedding.position_embeddings.weight"])[None]
    for layer in range(case["num_layers"]):
        p = lambda name: params["decoder.layers.%d.%s" % (layer, name)]  # noqa: E731
        h = F.layer_norm(x, (hidden,), p("input_layernorm.weight"), p("input_layernorm.bias"), eps)
        q, k, v = (
            F.linear(h, p("self_attention.%s.weight" % proj), p("self_attention.%s.bias" % proj))
            .view(batch, seq, heads, head_dim).transpose(1, 2)
            for proj in ("linear_q", "linear_k", "linear_v"))
        attn = causal_attention(q, k, v)
        x = x + F.linear(attn, p("self_attention.linear_proj.weight"), p("self_attention.linear_proj.bias"))
        h2 = F.layer_norm(x, (hidden,), p("pre_mlp_layernorm.weight"), p("pre_mlp_layernorm.bias"), eps)
        m = F.gelu(F.linear(h2, p("mlp.linear_fc1.weight"), p("mlp.linear_fc1.bias")), approximate="tanh")
        x = x + F.linear(m, p("mlp.linear_fc2.weight"), p("mlp.linear_fc2.bias"))
    x = F.layer_norm(x, (hidden,), params["decoder.final_layernorm.weight"], params["decoder.final_layernorm.bias"], eps)
    return F.linear(x, word_embeddings[: case["vocab_size"]])


def rms_norm(x, weight, eps):
    """x * rsqrt(mean(x^2) + eps) * weight over the last dimension, in fp32."""
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * weight


def rotate_half(x):
    """cat(-x2, x1) for x = cat(x1, x2) split in halves along the last dimension."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_tables(seq, head_dim, rotary_base):
    """cos and sin tables (T, D) of rotate-half RoPE for positions 0..T-1, in fp32."""
    inv_freq = 1.0 / (rotary_base ** (torch.arange(0, head_dim, 2).float() / head_dim))
    angles = torch.arange(seq).float()[:, None] * inv_freq[None, :]
    emb = torch.cat((angles, angles), dim=-1)
    return emb.cos(), emb.sin()


def llama_forward(params, tokens, case):
    """Logits (B, T, vocab_size) of the LLaMA model: RMSNorm, RoPE, GQA, SwiGLU, untied output, no biases."""
    batch, seq = tokens.shape
    heads, groups, eps = case["num_attention_heads"], case["num_query_groups"], case["norm_epsilon"]
    head_dim = case["hidden_size"] // heads
    cos, sin = rope_tables(seq, head_dim, case["rotary_base"])
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    x = F.embedding(tokens, params["embedding.word_embeddings.weight"])
    for layer in range(case["num_layers"]):
        p = lambda name: params["decoder.layers.%d.%s" % (layer, name)]  # noqa: E731
        h = rms_norm(x, p("input_layernorm.weight"), eps)
        q = F.linear(h, p("self_attention.linear_q.weight")).view(batch, seq, heads, head_dim)
        k = F.linear(h, p("self_attention.linear_k.weight")).view(batch, seq, groups, head_dim)
        v = F.linear(h, p("self_attention.linear_v.weight")).view(batch, seq, groups, head_dim)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        repeats = heads // groups
        q = q.transpose(1, 2)
        k = k.transpose(1, 2).repeat_interleave(repeats, dim=1)
        v = v.transpose(1, 2).repeat_interleave(repeats, dim=1)
        attn = causal_attention(q, k, v)
        x = x + F.linear(attn, p("self_attention.linear_proj.weight"))
        h2 = rms_norm(x, p("pre_mlp_layernorm.weight"), eps)
        m = F.silu(F.linear(h2, p("mlp.linear_fc1_gate.weight"))) * F.linear(h2, p("mlp.linear_fc1_up.weight"))
        x = x + F.linear(m, p("mlp.linear_fc2.weight"))
    x = rms_norm(x, params["decoder.final_layernorm.weight"], eps)
    return F.linear(x, params["output_layer.weight"][: case["vocab_size"]])


FORWARD = {"gpt": gpt_forward, "llama": llama_forward}


def case_tokens(case, first_sample, num_samples):
    """Tokens (num_samples, seq_length + 1) of the case's training samples.

    With `data_cycle` (a list of token ids) sample s reads the cycle from the phase its first
    mock-data token picks: token(s, t) = cycle[(mock(s, 0) + t) % len(cycle)], a stream a model
    learns within a few steps; without it, the mock-data tokens themselves (chance-level loss).
    """
    mock = philox.mock_tokens(case["seed"], case["vocab_size"], case["seq_length"], first_sample, num_samples)
    if "data_cycle" not in case:
        return mock
    cycle = np.array(case["data_cycle"], dtype=np.int64)
    positions = np.arange(case["seq_length"] + 1, dtype=np.int64)
    return cycle[(mock[:, :1] + positions[None, :]) % len(cycle)]


def learning_rate(case, iteration):
    """LR of 1-based `iteration`: Megatron's OptimizerParamScheduler.get_lr, counted in samples."""
    batch = case["global_batch_size"]
    max_lr, min_lr = case["lr"], case["min_lr"]
    warmup_steps = case.get("lr_warmup_iters", 0) * batch
    decay_steps = case.get("lr_decay_iters", case["train_iters"]) * batch
    num_steps = (iteration - 1) * batch
    style = case["lr_decay_style"]
    if warmup_steps > 0 and num_steps <= warmup_steps:
        return max_lr * num_steps / warmup_steps
    if style == "constant":
        return max_lr
    if num_steps > decay_steps:
        return min_lr
    ratio = (num_steps - warmup_steps) / (decay_steps - warmup_steps)
    if style == "cosine":
        coeff = 0.5 * (math.cos(math.pi * ratio) + 1.0)
    elif style == "linear":
        coeff = 1.0 - ratio
    else:
        raise SystemExit("unsupported lr_decay_style %r" % style)
    return min_lr + coeff * (max_lr - min_lr)


def make_optimizer(case, params):
    """torch AdamW with Megatron's groups: decay for ndim >= 2, none for biases and 1-D params."""
    decay = [tensor for tensor in params.values() if tensor.dim() >= 2]
    no_decay = [tensor for tensor in params.values() if tensor.dim() < 2]
    groups = [{"params": decay, "weight_decay": case["weight_decay"]},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=0.0, betas=(case["adam_beta1"], case["adam_beta2"]),
                             eps=case["adam_eps"], foreach=False)


def train(case, params):
    """Run train_iters steps; return the goldens as numpy arrays (params are updated in place)."""
    forward = FORWARD[case["model"]]
    micro, batch, iters = case["micro_batch_size"], case["global_batch_size"], case["train_iters"]
    seq = case["seq_length"]
    if batch % micro != 0:
        raise SystemExit("global_batch_size must be a multiple of micro_batch_size")
    num_micro = batch // micro
    optimizer = make_optimizer(case, params)
    tensors = list(params.values())

    losses, grad_norms, lrs, all_tokens, step0_logits = [], [], [], [], []
    for iteration in range(1, iters + 1):
        tokens = torch.from_numpy(case_tokens(case, (iteration - 1) * batch, batch))
        all_tokens.append(tokens.numpy().astype(np.int32))
        for tensor in tensors:
            tensor.grad = None
        micro_losses = []
        for index in range(num_micro):
            sample_tokens = tokens[index * micro:(index + 1) * micro]
            inputs, labels = sample_tokens[:, :seq], sample_tokens[:, 1:seq + 1]
            logits = forward(params, inputs, case)
            if iteration == 1:
                step0_logits.append(logits.detach().numpy().copy())
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
            (loss / num_micro).backward()
            micro_losses.append(loss.detach())
        for tensor in tensors:
            if tensor.grad is None:
                tensor.grad = torch.zeros_like(tensor)
        lm_loss = torch.stack(micro_losses).sum() / num_micro

        grad_norm = torch.norm(torch.stack([torch.norm(tensor.grad, 2) for tensor in tensors]), 2).item()
        clip_coeff = case["clip_grad"] / (grad_norm + CLIP_EPSILON)
        if case["clip_grad"] > 0 and clip_coeff < 1.0:
            for tensor in tensors:
                tensor.grad.mul_(clip_coeff)

        lr = learning_rate(case, iteration)
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.step()

        losses.append(lm_loss.item())
        grad_norms.append(grad_norm)
        lrs.append(lr)
        print("iteration %3d  lr %.6e  lm_loss %.6f  grad_norm %.6f%s" % (
            iteration, lr, losses[-1], grad_norm, "  (clipped)" if clip_coeff < 1.0 else ""))

    return {
        "logits_step0": np.concatenate(step0_logits, axis=0).astype(np.float32),
        "lm_loss": np.array(losses, dtype=np.float64),
        "grad_norm": np.array(grad_norms, dtype=np.float64),
        "lr": np.array(lrs, dtype=np.float64),
        "tokens": np.stack(all_tokens).astype(np.int32),
    }


def write_goldens(path, case_name, case, goldens, params):
    """Write the goldens HDF5 file (datasets and root attributes described in README.md)."""
    with h5py.File(path, "w") as handle:
        handle.attrs["case"] = case_name
        handle.attrs["torch_version"] = str(torch.__version__)
        handle.attrs["case_json"] = json.dumps(case, sort_keys=True)
        for name, values in goldens.items():
            handle.create_dataset(name, data=values)
        final = handle.create_group("final")
        for name, tensor in params.items():
            final.create_dataset(name, data=tensor.detach().numpy().astype(np.float32))


def configure_torch():
    """fp32 CPU, deterministic kernels and a single thread so reruns are bit-identical."""
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float32)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", required=True, help="case name in cases.json")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--init", help="mt init file to train from (requires --out)")
    mode.add_argument("--random-init", metavar="INIT", help="write a random init file in mt's layout and exit")
    parser.add_argument("--out", help="goldens HDF5 file to write")
    args = parser.parse_args()

    configure_torch()
    case = load_case(args.case)
    if args.random_init:
        write_random_init(case, args.random_init)
        print("wrote random init for %s to %s" % (args.case, args.random_init))
        return 0
    if not args.out:
        parser.error("--init requires --out")
    params = read_init(case, args.init)
    goldens = train(case, params)
    write_goldens(args.out, args.case, case, goldens, params)
    print("wrote goldens for %s to %s" % (args.case, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
