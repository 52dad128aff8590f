#!/usr/bin/env python3
"""PyTorch side of brasa's `workloads.*` figures (and `nn.transformer_train_*`).

Trains one workload for a number of steps and prints one JSON line:
{"runtime": "torch-2.15.0", "workload": ..., "dtype": "f32"|"bf16",
 "samples_per_s": median over timed chunks, "saved_bytes": bytes of the
 distinct storages saved for backward by one step's graph, "final_loss": ...}

The models, batch sizes, optimizers and synthetic data are the same as
`bench/src/workload_figures.rs` builds in brasa; `brasa-bench --filter
workloads` runs this script and brasa's worker alternately (interleaved), so
both see the same machine state. bf16 is `torch.autocast("cpu", torch.bfloat16)`
around forward and loss, as brasa's `autocast(DType::BF16)`.

Usage: python torch_workloads.py --workload NAME --dtype f32|bf16 [--steps N] [--threads T]
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def wide_mlp():
    return nn.Sequential(nn.Linear(3072, 2048), nn.GELU(), nn.Linear(2048, 2048), nn.GELU(), nn.Linear(2048, 100))


def deep_mlp():
    layers = []
    for _ in range(8):
        layers += [nn.Linear(256, 256), nn.ReLU()]
    layers.append(nn.Linear(256, 10))
    return nn.Sequential(*layers)


def cnn_bn():
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 8 * 8, 10),
    )


class EncoderClassifier(nn.Module):
    """Encoder layers over [batch, seq, d_model], mean-pooled into a linear head."""

    def __init__(self, layers, d_model, heads, d_ff, norm_first, dropout, classes=10):
        super().__init__()
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(d_model, heads, d_ff, dropout=dropout, activation="gelu",
                                       batch_first=True, norm_first=norm_first)
            for _ in range(layers))
        self.head = nn.Linear(d_model, classes)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x.mean(dim=1))


# name: (build, batch, sample shape, classes, optimizer)
def resnet():
    """ResNet-18 in its CIFAR form at half width: torch_resnet.py's model."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from torch_resnet import ResNet

    return ResNet(3, 10, width=32)


# Model and batches in torch.channels_last.
CHANNELS_LAST = {"resnet_channels_last"}

WORKLOADS = {
    "wide_mlp": (wide_mlp, 256, (3072,), 100, "sgd"),
    "deep_mlp": (deep_mlp, 128, (256,), 10, "adamw"),
    "cnn_bn": (cnn_bn, 64, (3, 32, 32), 10, "sgd"),
    "resnet": (resnet, 32, (3, 32, 32), 10, "sgd"),
    "resnet_channels_last": (resnet, 32, (3, 32, 32), 10, "sgd"),
    "encoder": (lambda: EncoderClassifier(1, 256, 4, 1024, True, 0.0), 16, (128, 256), 10, "adamw"),
    "transformer": (lambda: EncoderClassifier(4, 384, 6, 1536, False, 0.1), 16, (128, 384), 10, "adamw"),
}


def saved_bytes_of_one_step(model, x, y, dtype):
    """Bytes of the distinct storages autograd saves for backward in one forward."""
    storages = {}

    def pack(t):
        s = t.untyped_storage()
        storages[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = forward_loss(model, x, y, dtype)
    loss.backward()
    model.zero_grad(set_to_none=True)
    return sum(storages.values())


def forward_loss(model, x, y, dtype):
    if dtype == "bf16":
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return F.cross_entropy(model(x), y)
    return F.cross_entropy(model(x), y)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", required=True, choices=sorted(WORKLOADS))
    ap.add_argument("--dtype", default="f32", choices=["f32", "bf16"])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    build, batch, shape, classes, opt_name = WORKLOADS[args.workload]
    model = build()
    model.train()
    if opt_name == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn((batch,) + shape, generator=g), torch.randint(0, classes, (batch,), generator=g))
               for _ in range(4)]
    if args.workload in CHANNELS_LAST:
        model = model.to(memory_format=torch.channels_last)
        batches = [(x.contiguous(memory_format=torch.channels_last), y) for x, y in batches]

    def step(i):
        x, y = batches[i % len(batches)]
        loss = forward_loss(model, x, y, args.dtype)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for i in range(args.warmup):
        step(i)
    saved = saved_bytes_of_one_step(model, *batches[0], args.dtype)
    chunk = max(1, args.steps // 5)
    rates, done = [], 0
    while done < args.steps:
        n = min(chunk, args.steps - done)
        t0 = time.perf_counter()
        for i in range(n):
            loss = step(done + i)
        rates.append(n * batch / (time.perf_counter() - t0))
        done += n
    print(json.dumps({
        "runtime": "torch-" + torch.__version__.split("+")[0], "workload": args.workload, "dtype": args.dtype,
        "samples_per_s": statistics.median(rates), "saved_bytes": saved, "final_loss": loss.item(),
        "threads": torch.get_num_threads(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }), flush=True)


if __name__ == "__main__":
    sys.exit(main())
