#!/usr/bin/python3
"""PyTorch peer for tandem's training-step benchmarks (CPU, same models, same threads).

Run by benchmarks/compare_torch.py in a fresh process per thread count, because Debian's
torch sends linear layers to the system OpenBLAS, whose thread count is fixed by
OPENBLAS_NUM_THREADS at load time and which torch.set_num_threads does not control.

Prints one JSON object per case: {"case", "threads", "seconds_per_step" (median),
"samples_per_s"}; for the epoch case the whole epoch's wall time.
"""
import argparse
import gzip
import json
import os
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn as nn


def mlp_wide():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024),
                         nn.ReLU(), nn.Linear(1024, 10))


def mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128),
                         nn.ReLU(), nn.Linear(128, 10))


def cnn():
    return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, 10))


MODELS = {"mlp-wide": mlp_wide, "mlp": mlp, "cnn": cnn}


def train_step(model, opt, loss_fn, x, y):
    opt.zero_grad(set_to_none=True)
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()
    return loss


def bench_step(name, batch, steps, warmup):
    torch.manual_seed(0)
    model = MODELS[name]()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    x = torch.randn(batch, 1, 28, 28)
    y = torch.randint(0, 10, (batch,))
    for _ in range(warmup):
        train_step(model, opt, loss_fn, x, y)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        train_step(model, opt, loss_fn, x, y)
        times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    return {"seconds_per_step": med, "samples_per_s": batch / med}


def load_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def bench_epoch(name, batch, data_dir):
    """One epoch over Fashion-MNIST, normalised per batch as tandem does."""
    images = load_idx(os.path.join(data_dir, "train-images-idx3-ubyte.gz"))
    labels = torch.from_numpy(load_idx(os.path.join(data_dir, "train-labels-idx1-ubyte.gz")).astype(np.int64))
    torch.manual_seed(0)
    model = MODELS[name]()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    n = images.shape[0]
    t0 = time.perf_counter()
    order = torch.randperm(n)
    for b in range(0, n, batch):
        idx = order[b:b + batch].numpy()
        x = torch.from_numpy(images[idx].astype(np.float32)).div_(255.0).sub_(0.2860).div_(0.3530)
        train_step(model, opt, loss_fn, x.unsqueeze(1), labels[idx])
    return {"epoch_seconds": time.perf_counter() - t0}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--case", action="append", required=True,
                   help="model:batch for a step, or epoch:model:batch")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    a = p.parse_args()
    if os.environ.get("OPENBLAS_NUM_THREADS") != str(a.threads):
        sys.exit("set OPENBLAS_NUM_THREADS=%d before starting (see the module docstring)" % a.threads)
    torch.set_num_threads(a.threads)
    for case in a.case:
        parts = case.split(":")
        if parts[0] == "epoch":
            r = bench_epoch(parts[1], int(parts[2]), a.data_dir)
        else:
            r = bench_step(parts[0], int(parts[1]), a.steps, a.warmup)
        r.update({"case": case, "threads": a.threads, "torch": torch.__version__})
        print(json.dumps(r), flush=True)


if __name__ == "__main__":
    main()
