#!/usr/bin/env python3
"""PyTorch side of brasa's `cuda.*` figures, one bench per call, on cuda:0.

Prints one JSON line {"runtime", "bench", "value", "unit"}. Benches:
  matmul_f32, matmul_bf16   one 4096^3 torch.mm, TFLOP/s (TF32 off: PyTorch's default)
  mlp, cnn                  the nn.* training steps (784-512-512-10 MLP at batch 128,
                            the small CNN at batch 64; SGD momentum), samples/s
  allreduce_1mib, allreduce_64mib
                            torch.distributed.all_reduce of f32 on NCCL, world size 1 on
                            cuda:0 (brasa's nccl.* figures' world on a one-GPU machine):
                            microseconds per all-reduce over a loop of asynchronous launches
  ddp_mlp                   the mlp step under DistributedDataParallel on NCCL, world size 1
                            on cuda:0: milliseconds per step
  sdpa, sdpa_causal         F.scaled_dot_product_attention, bf16 [4, 16, 4096, 128]:
                            forward + backward (autograd.grad of q, k, v) seconds;
                            also the forward's and the backward's alone and the backend
Timings synchronize the device before starting and before stopping, as brasa's.
"""
import argparse
import json
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

DEV = "cuda:0"


def emit(bench, value, unit):
    print(json.dumps({"runtime": "torch-" + torch.__version__.split("+")[0], "bench": bench,
                      "value": value, "unit": unit, "gpu": torch.cuda.get_device_name(0)}), flush=True)


def matmul(dtype, iters=50):
    n = 4096
    a = torch.randn(n, n, device=DEV).to(dtype)
    b = torch.randn(n, n, device=DEV).to(dtype)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        a @ b
    torch.cuda.synchronize()
    return 2 * n ** 3 * iters / (time.perf_counter() - t0) / 1e12


class Cnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3)
        self.conv2 = nn.Conv2d(32, 64, 3)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))


def train(cnn, steps=200, wrap=lambda model: model):
    """Samples/s of the training step; `wrap` wraps the model (DDP)."""
    torch.manual_seed(0)
    if cnn:
        model, batch, shape = Cnn().to(DEV), 64, (1, 28, 28)
    else:
        model = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                              nn.Linear(512, 10)).to(DEV)
        batch, shape = 128, (784,)
    model = wrap(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    xs = [torch.randn((batch,) + shape, device=DEV) for _ in range(8)]
    ys = [torch.randint(0, 10, (batch,), device=DEV) for _ in range(8)]

    def step(i):
        F.cross_entropy(model(xs[i % 8]), ys[i % 8]).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for i in range(10):
        step(i)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(steps):
        step(i)
    torch.cuda.synchronize()
    return steps * batch / (time.perf_counter() - t0)


def sdpa(causal, iters=20):
    torch.manual_seed(0)
    shape = (4, 16, 4096, 128)
    q, k, v = (torch.randn(shape, device=DEV, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    grad = torch.randn(shape, device=DEV, dtype=torch.bfloat16)
    for _ in range(3):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        torch.autograd.grad(out, (q, k, v), grad)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    torch.cuda.synchronize()
    fwd = (time.perf_counter() - t0) / iters
    outs = [F.scaled_dot_product_attention(q, k, v, is_causal=causal) for _ in range(iters)]
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for out in outs:
        torch.autograd.grad(out, (q, k, v), grad)
    torch.cuda.synchronize()
    bwd = (time.perf_counter() - t0) / iters
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        torch.cuda.synchronize()
    kernels = sorted({e.key for e in prof.key_averages()})
    return fwd, bwd, kernels


def init_nccl_world_of_one():
    import os
    import torch.distributed as dist
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device(DEV))
    return dist


def ddp_mlp(steps=200):
    dist = init_nccl_world_of_one()
    rate = train(False, steps, wrap=lambda model: nn.parallel.DistributedDataParallel(model, device_ids=[0]))
    dist.destroy_process_group()
    return 128 / rate * 1e3


def allreduce(mib, iters):
    dist = init_nccl_world_of_one()
    x = torch.ones(mib * 2**18, device=DEV)
    for _ in range(10):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    elapsed = (time.perf_counter() - t0) / iters
    print(json.dumps({"detail": "nccl", "version": ".".join(map(str, torch.cuda.nccl.version()))}), flush=True)
    dist.destroy_process_group()
    return elapsed * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True, choices=["matmul_f32", "matmul_bf16", "mlp", "cnn", "sdpa", "sdpa_causal",
                                                     "allreduce_1mib", "allreduce_64mib", "ddp_mlp"])
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    if args.bench == "matmul_f32":
        emit(args.bench, matmul(torch.float32), "TFLOP/s")
    elif args.bench == "matmul_bf16":
        emit(args.bench, matmul(torch.bfloat16), "TFLOP/s")
    elif args.bench == "ddp_mlp":
        emit(args.bench, ddp_mlp(), "ms")
    elif args.bench.startswith("allreduce_"):
        mib = 1 if args.bench == "allreduce_1mib" else 64
        emit(args.bench, allreduce(mib, 200 if mib == 1 else 50), "us")
    elif args.bench.startswith("sdpa"):
        fwd, bwd, kernels = sdpa(args.bench == "sdpa_causal")
        print(json.dumps({"forward_s": fwd, "backward_s": bwd, "kernels": kernels}), flush=True)
        emit(args.bench, fwd + bwd, "s")
    else:
        emit(args.bench, train(args.bench == "cnn"), "samples/s")


if __name__ == "__main__":
    sys.exit(main())
