#!/usr/bin/python3
"""PyTorch side of the GPT-2 124M training benchmark (tests/bench/bench_gpt2.sh).

Trains GPT-2 124M (learned positions, LayerNorm, GELU-tanh, tied embeddings, no dropout) for a
few AdamW steps on random tokens and prints one JSON line: tokens/s and median step time.
Run with Debian's /usr/bin/python3 (torch 1.13) or another interpreter that has torch.
"""
import argparse
import json
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, hidden, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ln2 = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, 4 * hidden)
        self.fc2 = nn.Linear(4 * hidden, hidden)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        if hasattr(F, "scaled_dot_product_attention"):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(c // self.heads)
            mask = torch.ones(t, t, dtype=torch.bool).tril()
            y = scores.masked_fill(~mask, float("-inf")).softmax(-1) @ v
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, vocab=50257, hidden=768, layers=12, heads=12, max_positions=1024):
        super().__init__()
        self.wte = nn.Embedding(vocab, hidden)
        self.wpe = nn.Embedding(max_positions, hidden)
        self.blocks = nn.ModuleList(Block(hidden, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(hidden)

    def forward(self, tokens, labels):
        t = tokens.shape[1]
        x = self.wte(tokens) + self.wpe(torch.arange(t))
        for block in self.blocks:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.T
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1))


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--seq", type=int, required=True)
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--compile", action="store_true", help="torch.compile the model (torch >= 2)")
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = GPT2()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
    step_model = torch.compile(model) if args.compile else model
    times = []
    for _ in range(args.steps):
        tokens = torch.randint(0, 50257, (args.batch, args.seq))
        labels = torch.randint(0, 50257, (args.batch, args.seq))
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.dtype == "bf16"):
            loss = step_model(tokens, labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    median = statistics.median(times[1:])
    print(json.dumps({"impl": f"torch {torch.__version__}{' compile' if args.compile else ''}", "dtype": args.dtype,
                      "batch": args.batch, "seq": args.seq, "median_step_ms": median * 1e3,
                      "tokens_per_s": args.batch * args.seq / median, "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
