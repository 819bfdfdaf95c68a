#!/usr/bin/python3
"""PyTorch's side of the GPU benchmark (issue 23's "Fast"), run by tests/gpu/run_on_gpu.sh on the
same GPU as mt-train --device cuda. Plain PyTorch models with scaled_dot_product_attention, bf16
autocast over fp32 parameters (Megatron's bf16: fp32 main weights), fused AdamW:

  gpt2    GPT-2 124M (12 layers, hidden 768, 12 heads, vocabulary 50257, tied embeddings,
          LayerNorm, GELU) at micro-batch 16, sequence 1024, global batch 16
  llama   a LLaMA-3-8B-shaped stack of 4 layers (hidden 4096, 32 heads, 8 KV heads, FFN 14336,
          vocabulary 128256, untied, RMSNorm, RoPE, SwiGLU) at micro-batch 1, sequence 4096,
          global batch 8 (8 micro-batches accumulated per step)
  attention   causal attention forward+backward on SDPA's flash backend at both models' shapes

  gpu_bench_torch.py --model gpt2|llama --mode eager|compile [--steps N] [--warmup N]
  gpu_bench_torch.py --attention

Prints one JSON line per measurement: tokens/s, median step ms and MFU for a model; ms and TFLOP/s
for attention. Model FLOPs per token: 6 x (non-embedding parameters + the logits GEMM's h x V)
+ 12 x layers x hidden x sequence (attention scores and values, forward and backward, unmasked,
as PaLM counts them). MFU is against the GPU's dense bf16 peak (H100 SXM and H200 989.5 TFLOP/s,
H100 PCIe 756); run_on_gpu.sh also gives PyTorch's MFU under mt-train's own FLOP count.
A benchmark, not a test: quote the figures, don't assert on them.
"""
import argparse
import json
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

PEAK_BF16 = [("H100 PCIe", 756e12), ("H100", 989.5e12), ("H200", 989.5e12), ("A100", 312e12)]


def peak_flops():
    name = torch.cuda.get_device_name()
    for key, peak in PEAK_BF16:
        if key in name:
            return name, peak
    return name, None


# --- GPT-2 ---------------------------------------------------------------------------------------
class Gpt2Block(nn.Module):
    def __init__(self, h, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(h)
        self.qkv = nn.Linear(h, 3 * h)
        self.proj = nn.Linear(h, h)
        self.ln2 = nn.LayerNorm(h)
        self.fc = nn.Linear(h, 4 * h)
        self.out = nn.Linear(4 * h, h)

    def forward(self, x):  # (B, T, C)
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (y.view(b, t, self.heads, c // self.heads).transpose(1, 2) for y in (q, k, v))  # (B, H, T, D)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class Gpt2(nn.Module):
    def __init__(self, layers=12, h=768, heads=12, vocab=50257, seq=1024):
        super().__init__()
        self.wte = nn.Embedding(vocab, h)
        self.wpe = nn.Embedding(seq, h)
        self.blocks = nn.ModuleList(Gpt2Block(h, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(h)
        self.dims = dict(layers=layers, h=h, vocab=vocab, seq=seq)

    def forward(self, tokens):  # (B, T) -> logits (B, T, V)
        x = self.wte(tokens) + self.wpe(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)  # tied output layer


# --- LLaMA-shaped --------------------------------------------------------------------------------
class RmsNorm(nn.Module):
    def __init__(self, h, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(h))
        self.eps = eps

    def forward(self, x):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def rope_tables(seq, d, base, device):
    inv = 1.0 / (base ** (torch.arange(0, d, 2, device=device, dtype=torch.float32) / d))
    angles = torch.outer(torch.arange(seq, device=device, dtype=torch.float32), inv)  # (T, D/2)
    return angles.cos(), angles.sin()


def apply_rope(x, cos, sin):  # x (B, H, T, D), rotate-half convention
    x1, x2 = x.float().chunk(2, dim=-1)
    c, s = cos[None, None], sin[None, None]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).type_as(x)


class LlamaBlock(nn.Module):
    def __init__(self, h, heads, kv_heads, ffn):
        super().__init__()
        self.heads, self.kv_heads, self.d = heads, kv_heads, h // heads
        self.norm1 = RmsNorm(h)
        self.wq = nn.Linear(h, h, bias=False)
        self.wkv = nn.Linear(h, 2 * kv_heads * self.d, bias=False)
        self.wo = nn.Linear(h, h, bias=False)
        self.norm2 = RmsNorm(h)
        self.gate_up = nn.Linear(h, 2 * ffn, bias=False)
        self.down = nn.Linear(ffn, h, bias=False)

    def forward(self, x, cos, sin):  # (B, T, C)
        b, t, c = x.shape
        n = self.norm1(x)
        q = self.wq(n).view(b, t, self.heads, self.d).transpose(1, 2)  # (B, H, T, D)
        k, v = self.wkv(n).view(b, t, 2, self.kv_heads, self.d).permute(2, 0, 3, 1, 4)  # (B, G, T, D) each
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.wo(y.transpose(1, 2).reshape(b, t, c))
        gate, up = self.gate_up(self.norm2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class LlamaStack(nn.Module):
    def __init__(self, layers=4, h=4096, heads=32, kv_heads=8, ffn=14336, vocab=128256, seq=4096, base=500000.0):
        super().__init__()
        self.embed = nn.Embedding(vocab, h)
        self.blocks = nn.ModuleList(LlamaBlock(h, heads, kv_heads, ffn) for _ in range(layers))
        self.norm = RmsNorm(h)
        self.output = nn.Linear(h, vocab, bias=False)
        self.rope = (seq, h // heads, base)
        self.dims = dict(layers=layers, h=h, vocab=vocab, seq=seq)

    def forward(self, tokens):
        cos, sin = rope_tables(*self.rope, tokens.device)
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, cos, sin)
        return self.output(self.norm(x))


# --- training throughput -------------------------------------------------------------------------
def flops_per_token(model):
    d = model.dims
    embedding = sum(p.numel() for name, p in model.named_parameters() if name.startswith(("wte", "wpe", "embed", "output")))
    non_embedding = sum(p.numel() for p in model.parameters()) - embedding
    return 6 * (non_embedding + d["h"] * d["vocab"]) + 12 * d["layers"] * d["h"] * d["seq"]


def train_bench(args):
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.manual_seed(1234)
    if args.model == "gpt2":
        model, micro, global_batch = Gpt2(), 16, 16
    else:
        model, micro, global_batch = LlamaStack(), 1, 8
    model = model.cuda()
    seq, vocab = model.dims["seq"], model.dims["vocab"]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, fused=True)
    forward = torch.compile(model) if args.mode == "compile" else model
    accumulation = global_batch // micro

    def step():
        optimizer.zero_grad(set_to_none=True)
        for _ in range(accumulation):
            tokens = torch.randint(0, vocab, (micro, seq + 1), device="cuda")
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = forward(tokens[:, :-1])
            loss = F.cross_entropy(logits.float().view(-1, vocab), tokens[:, 1:].reshape(-1)) / accumulation
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()

    compile_start = time.perf_counter()
    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    warmup_s = time.perf_counter() - compile_start
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    tokens_per_s = global_batch * seq / median
    gpu, peak = peak_flops()
    flops = flops_per_token(model)
    return dict(impl=f"torch-{args.mode}", model=args.model, gpu=gpu, torch=torch.__version__, dtype="bf16",
                micro_batch=micro, global_batch=global_batch, seq=seq, steps=args.steps,
                median_step_ms=median * 1e3, tokens_per_s=tokens_per_s, flops_per_token=flops,
                tflops=tokens_per_s * flops / 1e12, mfu=tokens_per_s * flops / peak if peak else None,
                warmup_s=warmup_s, peak_memory_gib=torch.cuda.max_memory_allocated() / 2**30)


# --- attention on SDPA's flash backend -----------------------------------------------------------
def attention_bench(batch, heads, kv_heads, seq, d, label, repeats=20):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(batch, heads, seq, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(batch, kv_heads, seq, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(batch, kv_heads, seq, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dout = torch.randn(batch, heads, seq, d, device="cuda", dtype=torch.bfloat16)

    def run():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=kv_heads != heads)
        out.backward(dout)

    for _ in range(3):
        run()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        run()
    end.record()
    torch.cuda.synchronize()
    ms = start.elapsed_time(end) / repeats
    forward_flops = 4 * batch * heads * seq * seq * d / 2  # causal: half the scores
    return dict(impl="torch-sdpa-flash", model=label, gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                dtype="bf16", batch=batch, heads=heads, kv_heads=kv_heads, seq=seq, head_dim=d,
                fwd_bwd_ms=ms, tflops=3.5 * forward_flops / (ms / 1e3) / 1e12)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["gpt2", "llama"])
    parser.add_argument("--mode", choices=["eager", "compile"], default="eager")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--attention", action="store_true")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("gpu_bench_torch.py: no CUDA device")
    if args.attention:
        for shape in [(16, 12, 12, 1024, 64, "gpt2"), (1, 32, 8, 4096, 128, "llama")]:
            try:
                print(json.dumps(attention_bench(*shape)), flush=True)
            except RuntimeError as e:  # the flash backend refused the shape: say so, keep going
                print(json.dumps(dict(impl="torch-sdpa-flash", model=shape[-1], error=str(e).splitlines()[0])), flush=True)
        return
    if not args.model:
        parser.error("give --model or --attention")
    print(json.dumps(train_bench(args)), flush=True)


if __name__ == "__main__":
    main()
