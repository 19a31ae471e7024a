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
import math
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


def resnet18():
    """torchvision's resnet18 for 1x28x28 images and 10 classes: examples/models/resnet18.yaml."""
    import torchvision
    model = torchvision.models.resnet18(num_classes=10)
    model.conv1 = nn.Conv2d(1, 64, 7, stride=2, padding=3, bias=False)
    return model


def mobilenet_v2():
    """torchvision's mobilenet_v2 for 1x28x28 images and 10 classes:
    examples/models/mobilenet_v2.yaml."""
    import torchvision
    model = torchvision.models.mobilenet_v2(num_classes=10)
    model.features[0][0] = nn.Conv2d(1, 32, 3, stride=2, padding=1, bias=False)
    return model


class Block(nn.Module):
    """tandem's transformer block: x + attn(ln1(x)); x + fc2(gelu(fc1(ln2(x)))), causal."""

    def __init__(self, d, heads, mlp, context):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, mlp), nn.Linear(mlp, d)
        mask = torch.triu(torch.ones(context, context, dtype=torch.bool), diagonal=1)
        self.register_buffer("mask", mask)

    def forward(self, x):
        b, t, d = x.shape
        h = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        s = (h[0] @ h[1].transpose(-2, -1)) / math.sqrt(d // self.heads)
        a = (s.masked_fill(self.mask[:t, :t], float("-inf")).softmax(-1) @ h[2])
        x = x + self.out(a.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(nn.functional.gelu(self.fc1(self.ln2(x))))

    def step(self, x, cache):
        """The new tokens x [B, tn, d] after those whose keys and values `cache` holds."""
        b, tn, d = x.shape
        h = self.qkv(self.ln1(x)).view(b, tn, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        k, v = h[1], h[2]
        if cache:
            k, v = torch.cat([cache[0], k], 2), torch.cat([cache[1], v], 2)
        cache[:] = [k, v]
        t = k.shape[2]
        s = (h[0] @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        a = s.masked_fill(self.mask[t - tn:t, :t], float("-inf")).softmax(-1) @ v
        x = x + self.out(a.transpose(1, 2).reshape(b, tn, d))
        return x + self.fc2(nn.functional.gelu(self.fc1(self.ln2(x))))


class Gpt(nn.Module):
    """examples/models/gpt-mini.yaml: bytes, context 128, 4 blocks of width 128, 4 heads."""

    def __init__(self, vocab=256, context=128, d=128, heads=4, mlp=512, blocks=4):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(context, d) * 0.02)
        self.blocks = nn.Sequential(*[Block(d, heads, mlp, context) for _ in range(blocks)])
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, ids):
        x = self.embed(ids) + self.pos[:ids.shape[1]]
        return self.head(self.ln(self.blocks(x)))

    def step(self, ids, caches, past):
        x = self.embed(ids) + self.pos[past:past + ids.shape[1]]
        for block, cache in zip(self.blocks, caches):
            x = block.step(x, cache)
        return self.head(self.ln(x))


def bench_generate(count, cache, context=640):
    """Greedy decoding of `count` tokens after a 16-byte prompt, as generate_bench does:
    with a key/value cache per block, or recomputing the prefix every step."""
    torch.manual_seed(0)
    model = Gpt(context=context).eval()
    ids = torch.tensor([list(b"The cat sat on t")])
    caches = [[] for _ in model.blocks]
    times = []
    with torch.no_grad():
        t0 = time.perf_counter()
        feed, past = ids, 0
        for _ in range(count):
            logits = model.step(feed, caches, past) if cache else model(ids)
            token = logits[0, -1].argmax().view(1, 1)
            times.append(time.perf_counter())
            if cache:
                past += feed.shape[1]
                feed = token
            ids = torch.cat([ids, token], 1)
    intervals = [b - a for a, b in zip(times, times[1:])]
    return {"tokens_per_s": len(intervals) / sum(intervals),
            "first_token_ms": 1e3 * (times[0] - t0)}


# benchmarks/generate_bench's BM_GenerateLlama model: Llama-shaped, width 512, 8 heads of
# which 2 key/value heads, 6 blocks, SwiGLU 1376 wide, a 4096-token vocabulary.
LLAMA_BENCH = dict(model_type="llama", hidden_size=512, intermediate_size=1376,
                   num_attention_heads=8, num_key_value_heads=2, num_hidden_layers=6,
                   vocab_size=4096, max_position_embeddings=640, rms_norm_eps=1e-5,
                   rope_theta=10000.0, tie_word_embeddings=False)


def bench_llama(count):
    """Greedy decoding of `count` tokens after a 16-token prompt with the module's own
    key/value cache, as generate_bench's BM_GenerateLlama does."""
    from torch_llama import Llama
    torch.manual_seed(0)
    model = Llama(LLAMA_BENCH).eval()
    ids = torch.tensor([list(b"The cat sat on t")])
    caches = [{} for _ in model.model.layers]
    times = []
    with torch.no_grad():
        t0 = time.perf_counter()
        feed, past = ids, 0
        for _ in range(count):
            logits = model(feed, torch.arange(past, past + feed.shape[1]), caches)
            token = logits[0, -1].argmax().view(1, 1)
            times.append(time.perf_counter())
            past += feed.shape[1]
            feed = token
    intervals = [b - a for a, b in zip(times, times[1:])]
    return {"tokens_per_s": len(intervals) / sum(intervals),
            "first_token_ms": 1e3 * (times[0] - t0)}


MODELS = {"mlp-wide": mlp_wide, "mlp": mlp, "cnn": cnn, "gpt-mini": Gpt, "resnet18": resnet18,
          "mobilenet_v2": mobilenet_v2}
TOKENS = {"gpt-mini": (256, 128)}  # language models: vocab, context


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
    if name in TOKENS:  # a token-level loss: logits [B, T, V] as rows [B*T, V]
        vocab, context = TOKENS[name]
        x = torch.randint(0, vocab, (batch, context))
        y = torch.randint(0, vocab, (batch * context,))
        ce = nn.CrossEntropyLoss()
        loss_fn = lambda logits, labels: ce(logits.reshape(-1, vocab), labels)
    else:
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


def bench_conv(n, c, h, w, oc, k, stride, pad, steps, warmup):
    """One convolution with bias: forward, then the input's and the weights' gradients
    (torch.autograd.grad of a fixed upstream gradient), each timed apart (medians)."""
    torch.manual_seed(0)
    x = torch.randn(n, c, h, w, requires_grad=True)
    weight = torch.randn(oc, c, k, k, requires_grad=True)
    bias = torch.randn(oc, requires_grad=True)
    fwd, bwd = [], []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        y = torch.nn.functional.conv2d(x, weight, bias, stride=stride, padding=pad)
        t1 = time.perf_counter()
        torch.autograd.grad(y, (x, weight, bias), torch.ones_like(y))
        t2 = time.perf_counter()
        if i >= warmup:
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
    return {"forward_s": statistics.median(fwd), "backward_s": statistics.median(bwd)}


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
                   help="model:batch for a step, epoch:model:batch, or "
                        "generate:TOKENS:cache|nocache, llama:TOKENS, or "
                        "conv:N:C:H:W:OC:K:STRIDE:PAD")
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
        elif parts[0] == "generate":
            r = bench_generate(int(parts[1]), parts[2] == "cache")
        elif parts[0] == "llama":
            r = bench_llama(int(parts[1]))
        elif parts[0] == "conv":
            r = bench_conv(*[int(v) for v in parts[1:]], a.steps, a.warmup)
        else:
            r = bench_step(parts[0], int(parts[1]), a.steps, a.warmup)
        r.update({"case": case, "threads": a.threads, "torch": torch.__version__})
        print(json.dumps(r), flush=True)


if __name__ == "__main__":
    main()
