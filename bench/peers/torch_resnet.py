#!/usr/bin/env python3
"""PyTorch side of brasa's `cuda.resnet_*` and `cuda.conv_*` figures.

--bench train: training steps of ResNet-18 in its CIFAR form (3x3 stem at
  stride 1, no max pool, stages of 2 BasicBlocks at widths 64/128/256/512 and
  strides 1/2/2/2, 1x1 conv + batch norm shortcuts, global average pool,
  linear head; torchvision's layers, names and initialisation), the same model
  as brasa's `brasa_nn::models::ResNet` with `ResNetConfig::resnet18(3, 10)`.
  A step: forward and mean cross entropy under torch.autocast(bfloat16),
  backward, SGD (lr 0.05, momentum 0.9, weight decay 5e-4), zero_grad
  (set_to_none). Random 32x32 images, 8 batches cycled. PyTorch at its best
  in eager mode: the model and the batches channels last
  (memory_format=torch.channels_last) and torch.backends.cudnn.benchmark on.
  Prints {"bench": "train", "samples_per_s": median over timed chunks, ...}.

--bench conv: forward + backward (the input's and the weight's gradients,
  torch.autograd.grad with a given output gradient) of 3x3 convolutions,
  stride 1, padding 1, no bias, C -> C channels at HxW, batch 128, in
  bfloat16, channels last, cudnn.benchmark on. Prints one line per shape:
  {"bench": "conv", "channels": C, "size": H, "seconds": median per iteration, ...}.

Timings synchronize the device before starting and before stopping, as
brasa's side does; warm-up iterations (where cudnn.benchmark runs its
search) are not timed.

Usage: python torch_resnet.py --bench train|conv [--device cuda:0|cpu]
           [--batch N] [--width N] [--warmup N] [--steps N] [--iters N]
           [--shapes C:H,C:H,...] [--threads T]
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


class BasicBlock(nn.Module):
    def __init__(self, c_in, c_out, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.downsample = None
        if stride != 1 or c_in != c_out:
            self.downsample = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu(out + identity)


class ResNet(nn.Module):
    """torchvision's ResNet with the CIFAR stem (3x3 conv, stride 1, no max pool)."""

    def __init__(self, in_channels=3, num_classes=10, width=64, blocks=(2, 2, 2, 2)):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, width, 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        c_in = width
        for stage, n in enumerate(blocks):
            c_out = width * 2 ** stage
            layer = []
            for b in range(n):
                layer.append(BasicBlock(c_in, c_out, 2 if stage > 0 and b == 0 else 1))
                c_in = c_out
            setattr(self, f"layer{stage + 1}", nn.Sequential(*layer))
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(c_in, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def runtime(device):
    info = {"runtime": "torch-" + torch.__version__.split("+")[0], "device": str(device)}
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["cudnn"] = torch.backends.cudnn.version()
    return info


def bench_train(args, device):
    torch.manual_seed(0)
    model = ResNet(3, 10, args.width).to(device).to(memory_format=torch.channels_last)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    g = torch.Generator().manual_seed(1)
    batches = [
        (
            torch.randn(args.batch, 3, 32, 32, generator=g).to(device).contiguous(memory_format=torch.channels_last),
            torch.randint(0, 10, (args.batch,), generator=g).to(device),
        )
        for _ in range(8)
    ]

    def step(i):
        x, y = batches[i % len(batches)]
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for i in range(args.warmup):
        step(i)
    sync(device)
    chunk = max(1, args.steps // 5)
    rates, done = [], 0
    while done < args.steps:
        n = min(chunk, args.steps - done)
        t0 = time.perf_counter()
        for i in range(n):
            loss = step(done + i)
        sync(device)
        rates.append(n * args.batch / (time.perf_counter() - t0))
        done += n
    print(json.dumps({
        "bench": "train", "samples_per_s": statistics.median(rates), "final_loss": loss.item(),
        "batch": args.batch, "width": args.width, "steps": args.steps, "warmup": args.warmup,
        "parameters": sum(p.numel() for p in model.parameters()), **runtime(device),
    }), flush=True)


def bench_conv(args, device):
    g = torch.Generator().manual_seed(2)
    for spec in args.shapes.split(","):
        c, size = (int(v) for v in spec.split(":"))
        fmt = torch.channels_last
        x = torch.randn(args.batch, c, size, size, generator=g).to(device, torch.bfloat16).contiguous(memory_format=fmt)
        x.requires_grad_(True)
        w = (torch.randn(c, c, 3, 3, generator=g) * (2.0 / (9 * c)) ** 0.5).to(device, torch.bfloat16)
        w = w.contiguous(memory_format=fmt).requires_grad_(True)
        dy = torch.randn(args.batch, c, size, size, generator=g).to(device, torch.bfloat16).contiguous(memory_format=fmt)

        def once():
            y = F.conv2d(x, w, None, stride=1, padding=1)
            return torch.autograd.grad(y, (x, w), dy)

        for _ in range(args.warmup):
            once()
        sync(device)
        t0 = time.perf_counter()
        for _ in range(args.iters):
            once()
        sync(device)
        seconds = (time.perf_counter() - t0) / args.iters
        flops = 3 * 2 * args.batch * size * size * c * c * 9  # forward, input grad, weight grad
        print(json.dumps({
            "bench": "conv", "channels": c, "size": size, "batch": args.batch, "dtype": "bf16",
            "seconds": seconds, "tflops": flops / seconds / 1e12, "iters": args.iters, **runtime(device),
        }), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True, choices=["train", "conv"])
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--shapes", default="64:32,128:16,256:8,512:4")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda":
        # PyTorch's best eager settings for convolutions: time the cuDNN
        # algorithms for each shape and keep the fastest.
        torch.backends.cudnn.benchmark = True
        torch.cuda.set_device(device)
    if args.bench == "train":
        bench_train(args, device)
    else:
        bench_conv(args, device)


if __name__ == "__main__":
    sys.exit(main())
