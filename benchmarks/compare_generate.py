#!/usr/bin/python3
"""Generation speed of tandem next to PyTorch, measured in the same run.

    benchmarks/compare_generate.py [--build build/release] [--threads 1,2] [--rounds 2]

The model is examples/models/gpt-mini.yaml's shape (width 128, 4 blocks of 4 heads,
byte tokens) with a context of 640; both sides decode greedily after the same 16-byte
prompt, 128 and 512 new tokens. Ours: benchmarks/generate_bench (core/generate.h, the
key/value cache of each attention layer). PyTorch's: benchmarks/torch_peer.py
`generate:N:cache`, the same model with its own cache loop (keys and values
concatenated per block) under torch.no_grad(), in a fresh process per thread count
(OPENBLAS_NUM_THREADS, OMP_NUM_THREADS, glibc keeping freed blocks: compare_torch.py's
MALLOC_KEEP). It prints decoding tokens/s (the steps after the first token) and the ratio
tandem/torch (>= 1.0: we are at least as fast), then the cache's gain: tandem's tokens/s
with the cache over without it, then decoding's weight traffic (weight bytes x tokens/s)
beside a memory copy's rate on the same threads (generate_bench's BM_MemoryCopy). A third row decodes a
Llama-shaped model (width 512, 8 heads of which 2 key/value heads, rotary embedding, 6
SwiGLU blocks, vocabulary 4096): generate_bench's BM_GenerateLlama against torch_peer.py
`llama:128` (benchmarks/torch_llama.py, transformers' Llama written out, its own cache).

Needs python3-torch (scripts/setup --with-peer). Compare only figures from one run.
"""
import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_torch import ROOT, blas_core, torch  # noqa: E402


def ours(build, threads):
    """tokens/s per case; and per case its weight traffic in GB/s, with "copy": the memory's."""
    exe = os.path.join(build, "benchmarks", "generate_bench")
    out = subprocess.run([exe, "--benchmark_format=json",
                          "--benchmark_filter=(BM_Generate.*|BM_MemoryCopy/)threads:%d/" % threads],
                         check=True, capture_output=True, text=True).stdout
    result, traffic = {}, {}
    for b in json.loads(out)["benchmarks"]:
        name = b["name"]  # BM_Generate/tokens:128/cache:1/threads:1/..., BM_GenerateLlama/...
        if name.startswith("BM_MemoryCopy/"):
            traffic["copy"] = b["gb_per_s"]
            continue
        tokens = int(name.split("tokens:")[1].split("/")[0])
        if name.startswith("BM_GenerateLlama/"):
            key = ("llama", tokens)
        elif name.startswith("BM_Generate/"):
            key = (tokens, name.split("cache:")[1].split("/")[0] == "1")
        else:
            continue
        result[key], traffic[key] = b["tokens_per_s"], b["weight_gb_per_s"]
    return result, traffic


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", default=os.path.join(ROOT, "build", "release"))
    p.add_argument("--threads", default="1,2")
    p.add_argument("--rounds", type=int, default=2)
    a = p.parse_args()
    print("conditions, both sides: the same model shape and 16-byte prompt, greedy, one sequence, "
          "CPU threads as in the table (torch: glibc keeping freed blocks, OPENBLAS_NUM_THREADS = "
          "OMP_NUM_THREADS = threads, OMP_WAIT_POLICY=PASSIVE where our pool yield-spins up to "
          "2 ms, OPENBLAS_CORETYPE=%s as ours runs, torch.no_grad), f32 "
          "weights, no warm-up run on either side, tokens/s over the steps after the first "
          "token; ours through core/generate.h, what `tandem generate MODEL` runs in one "
          "process; the llama row: the same Llama shape (GQA 8/2, rope_theta 1e4, SwiGLU "
          "1376, vocab 4096) on both sides, torch's own cache loop" % blas_core(a.build))
    print("%-40s %7s %12s %12s %8s" % ("greedy decoding, tokens/s (best of %d)" % a.rounds,
                                       "threads", "tandem", "torch", "ratio"))
    gains, copy, weights = [], {}, {}
    for t in [int(x) for x in a.threads.split(",")]:
        mine, peer = {}, {}
        for _ in range(a.rounds):
            rates, gbs = ours(a.build, t)
            copy[t] = max(copy.get(t, 0.0), gbs["copy"])
            for key, v in rates.items():
                if v > mine.get(key, 0.0):
                    mine[key], weights[(key, t)] = v, gbs[key]
            for n in (128, 512):
                case = "generate:%d:cache" % n
                v = torch(t, [case], a.build)[case]["tokens_per_s"]
                peer[n] = max(peer.get(n, v), v)
            v = torch(t, ["llama:128"], a.build)["llama:128"]["tokens_per_s"]
            peer["llama"] = max(peer.get("llama", v), v)
        for n in (128, 512):
            print("%-40s %7d %12.1f %12.1f %8.2f" % ("%d tokens, key/value cache" % n, t,
                                                     mine[(n, True)], peer[n],
                                                     mine[(n, True)] / peer[n]), flush=True)
        print("%-40s %7d %12.1f %12.1f %8.2f" % ("llama-shaped, 128 tokens, cache", t,
                                                 mine[("llama", 128)], peer["llama"],
                                                 mine[("llama", 128)] / peer["llama"]), flush=True)
        for n in (128, 512):
            gains.append((n, t, mine[(n, True)], mine[(n, False)]))
    print("\n%-40s %7s %12s %12s %8s" % ("tandem: the cache's gain", "threads", "cache",
                                         "no cache", "gain"))
    for n, t, with_cache, without in gains:
        print("%-40s %7d %12.1f %12.1f %8.2f" % ("%d tokens" % n, t, with_cache, without,
                                                 with_cache / without))
    print("\n%-40s %7s %12s %12s %8s" % ("tandem: weights read per second, GB/s", "threads",
                                         "decoding", "memory copy", "share"))
    for t in sorted(copy):
        for key, label in [((128, True), "128 tokens, cache"), ((512, True), "512 tokens, cache"),
                           (("llama", 128), "llama-shaped, 128 tokens, cache")]:
            print("%-40s %7d %12.1f %12.1f %7.0f%%" % (label, t, weights[(key, t)], copy[t],
                                                       100 * weights[(key, t)] / copy[t]))
    print("(decoding: the model's weight bytes x tokens/s, every weight read once per token; "
          "memory copy: a 256 MiB copy on the same threads, bytes read plus bytes written per "
          "second; a model whose weights stay in the caches can exceed it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
