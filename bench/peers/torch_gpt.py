#!/usr/bin/env python3
"""PyTorch side of brasa's `nn.gpt_train_*` figures.

Times training steps of nanoGPT's character-level GPT and prints one JSON line:
{"runtime": "torch-2.15.0", "config": "cpu", "steps_per_s": median over timed chunks,
 "final_loss": ..., "threads": ..., "device": ...}

The model is nanoGPT's `model.py` GPT (pre-norm blocks, no biases,
`F.scaled_dot_product_attention(is_causal=True)`, exact GELU, the head tied to
the token embedding), the same as brasa's `brasa_nn::models::Gpt`; a step is
forward and mean cross entropy, backward, `clip_grad_norm_(1.0)`, AdamW
(betas (0.9, 0.99), weight decay 0.1 on the parameters of two or more
dimensions, two parameter groups) and `zero_grad(set_to_none=True)`, as
`bench/src/gpt_figures.rs` and `train_gpt` do. Eager mode (no torch.compile).

--config cpu: 4 layers, 4 heads, 128 wide, context 64, batch 12, dropout 0.
--config gpu: 6 layers, 6 heads, 384 wide, context 256, batch 64, dropout 0.2.
--bf16 runs forward and loss under torch.autocast(bfloat16).

Usage: python torch_gpt.py [--config cpu|gpu] [--device cpu|cuda] [--bf16]
                           [--steps N] [--warmup N] [--threads T]
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

CONFIGS = {
    # name: (n_layer, n_head, n_embd, block_size, batch, dropout)
    "cpu": (4, 4, 128, 64, 12, 0.0),
    "gpu": (6, 6, 384, 256, 64, 0.2),
}
VOCAB = 65


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, dropout):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=False)
        self.c_proj = nn.Linear(n_embd, n_embd, bias=False)
        self.resid_dropout = nn.Dropout(dropout)
        self.n_head, self.n_embd, self.dropout = n_head, n_embd, dropout

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class Block(nn.Module):
    def __init__(self, n_embd, n_head, dropout):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, bias=False)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout)
        self.ln_2 = nn.LayerNorm(n_embd, bias=False)
        self.c_fc = nn.Linear(n_embd, 4 * n_embd, bias=False)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * n_embd, n_embd, bias=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.dropout(self.c_proj(self.gelu(self.c_fc(self.ln_2(x)))))


class GPT(nn.Module):
    def __init__(self, n_layer, n_head, n_embd, block_size, dropout):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleList(Block(n_embd, n_head, dropout) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd, bias=False)
        self.lm_head = nn.Linear(n_embd, VOCAB, bias=False)
        self.wte.weight = self.lm_head.weight  # weight tying
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * n_layer) if name.endswith("c_proj.weight") else 0.02
                torch.nn.init.normal_(p, mean=0.0, std=std)

    def forward(self, idx, targets):
        T = idx.size(1)
        pos = torch.arange(0, T, dtype=torch.long, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="cpu", choices=sorted(CONFIGS))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    n_layer, n_head, n_embd, block_size, batch, dropout = CONFIGS[args.config]
    device = torch.device(args.device)
    model = GPT(n_layer, n_head, n_embd, block_size, dropout).to(device)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=1e-3, betas=(0.9, 0.99))
    g = torch.Generator().manual_seed(1)
    windows = [torch.randint(0, VOCAB, (batch, block_size + 1), generator=g) for _ in range(8)]
    batches = [(w[:, :-1].contiguous().to(device), w[:, 1:].contiguous().to(device)) for w in windows]

    def step(i):
        x, y = batches[i % len(batches)]
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.bf16):
            loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    for i in range(args.warmup):
        step(i)
    sync()
    chunk = max(1, args.steps // 5)
    rates, done = [], 0
    while done < args.steps:
        n = min(chunk, args.steps - done)
        t0 = time.perf_counter()
        for i in range(n):
            loss = step(done + i)
        sync()
        rates.append(n / (time.perf_counter() - t0))
        done += n
    print(json.dumps({
        "runtime": "torch-" + torch.__version__.split("+")[0], "config": args.config, "device": str(device),
        "bf16": args.bf16, "steps_per_s": statistics.median(rates), "final_loss": loss.item(),
        "threads": torch.get_num_threads(), "parameters": sum(p.numel() for p in params),
    }), flush=True)


if __name__ == "__main__":
    sys.exit(main())
