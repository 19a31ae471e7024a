#!/usr/bin/python3
"""Convolution speed of tandem next to PyTorch, shape by shape, measured in the same run.

    benchmarks/compare_conv.py [--build build/release] [--threads 1,2] [--rounds 2]

Ours: benchmarks/conv_bench (the CPU backend's conv2d, then conv2dBackwardData and
conv2dBackwardWeight, with bias) on the example CNN's two convolutions and the shapes a
ResNet uses; PyTorch's: benchmarks/torch_peer.py `conv:N:C:H:W:OC:K:STRIDE:PAD`
(torch.nn.functional.conv2d, then torch.autograd.grad of the input, weights and bias), in a
fresh process per thread count under the same conditions as compare_torch.py (threads,
malloc keeping freed blocks). It prints each side's forward and backward milliseconds (the
best of --rounds rounds, alternated), the ratio torch/tandem of their sums (>= 1.0: we are
at least as fast), and our GFLOP/s with its share of a 1024^3 sgemm at the same threads.

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
    """{label: (forward_s, backward_s, gflops)} and the sgemm reference's GFLOP/s."""
    exe = os.path.join(build, "benchmarks", "conv_bench")
    out = subprocess.run([exe, "--benchmark_format=json",
                          "--benchmark_filter=threads:%d(/|$)" % threads],
                         check=True, capture_output=True, text=True).stdout
    result, sgemm = {}, 0.0
    for b in json.loads(out)["benchmarks"]:
        if b["name"].startswith("BM_ConvSgemm/"):
            sgemm = b["gflops"]
        elif b["name"].startswith("BM_Conv/"):
            result[b["label"]] = (b["forward_ms"] / 1e3, b["backward_ms"] / 1e3, b["gflops"])
    return result, sgemm


def peer_case(label):
    n, c, hw, oc, k, stride, pad = label.split()
    h, w = hw.split("x")
    return "conv:" + ":".join([n, c, h, w, oc, k, stride, pad])


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", default=os.path.join(ROOT, "build", "release"))
    p.add_argument("--threads", default="1,2")
    p.add_argument("--rounds", type=int, default=2)
    a = p.parse_args()
    print("conditions, both sides: the same shapes with bias, random normal data, the CPU "
          "threads in the table (torch: OPENBLAS_NUM_THREADS = OMP_NUM_THREADS = threads, "
          "OMP_WAIT_POLICY=PASSIVE: its OpenMP threads sleep at once, "
          "where ours yield-spin up to 2 ms; with OpenMP's spinning default they starve its "
          "OpenBLAS threads, glibc keeping freed blocks, OPENBLAS_CORETYPE=%s as ours "
          "runs), 2 untimed rounds first, then ours: Google Benchmark's mean over >= 0.5 s, "
          "torch: the median of 10; the best of %d alternated rounds; ours: the backend ops "
          "the conv2d layer calls, torch: F.conv2d and autograd.grad (oneDNN's kernels)"
          % (blas_core(a.build), a.rounds))
    print("%-28s %7s %9s %9s %9s %9s %7s %8s %8s" % (
        "conv2d, N C HxW OC K S P", "threads", "fwd ms", "bwd ms", "torch fwd", "torch bwd",
        "ratio", "GFLOP/s", "of sgemm"))
    for t in [int(x) for x in a.threads.split(",")]:
        mine, peer, sgemm = {}, {}, 0.0
        for _ in range(a.rounds):
            got, rate = ours(a.build, t)
            sgemm = max(sgemm, rate)
            for label, v in got.items():
                if label not in mine or sum(v[:2]) < sum(mine[label][:2]):
                    mine[label] = v
            cases = [peer_case(label) for label in got]
            for case, r in torch(t, cases, a.build, steps=10, warmup=2).items():
                v = (r["forward_s"], r["backward_s"])
                if case not in peer or sum(v) < sum(peer[case]):
                    peer[case] = v
        for label, (f, b, gflops) in mine.items():
            pf, pb = peer[peer_case(label)]
            print("%-28s %7d %9.2f %9.2f %9.2f %9.2f %7.2f %8.1f %7.0f%%" % (
                label, t, f * 1e3, b * 1e3, pf * 1e3, pb * 1e3, (pf + pb) / (f + b), gflops,
                100 * gflops / sgemm), flush=True)
        print("sgemm 1024^3 at %d thread%s: %.1f GFLOP/s" % (t, "" if t == 1 else "s", sgemm))
    return 0


if __name__ == "__main__":
    sys.exit(main())
