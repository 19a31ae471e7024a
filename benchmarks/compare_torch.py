#!/usr/bin/python3
"""Training-step speed of tandem next to PyTorch, measured in the same run.

    benchmarks/compare_torch.py [--build build/release] [--threads 1,2] [--memory]
                                [--cases cnn,resnet18]

For each thread count it runs our Google Benchmark binary (train_step_bench) and the
PyTorch peer (benchmarks/torch_peer.py, a fresh process with OPENBLAS_NUM_THREADS,
OMP_NUM_THREADS and OMP_WAIT_POLICY=PASSIVE set so torch's thread count is what it
claims, glibc's malloc told to keep freed blocks as tandem's pool does (MALLOC_KEEP), and
OPENBLAS_CORETYPE set to the OpenBLAS kernels tandem runs, which `tandem devices` names), then
a full Fashion-MNIST epoch of examples/models/mlp.yaml at batch 128 in both. It prints
milliseconds per step and the ratio torch/tandem: >= 1.0 means tandem is at least as fast.
With --memory it also reports the peak resident memory of
`tandem train` for the CNN at batch 128 (one epoch), from /usr/bin/time -v.

Needs python3-torch (scripts/setup --with-peer). Timings on shared machines are noisy:
compare only figures from one run.
"""
import argparse
import functools
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASES = [("MlpWide_b256", "mlp-wide:256", "MLP 784-1024-1024-10, batch 256"),
         ("Cnn_b128", "cnn:128", "CNN (examples/models/cnn.yaml), batch 128"),
         ("GptMini_b16", "gpt-mini:16", "GPT (examples/models/gpt-mini.yaml), batch 16"),
         ("Resnet18_b32", "resnet18:32", "resnet18 (resnet18.yaml), batch 32"),
         ("MobilenetV2_b32", "mobilenet_v2:32", "mobilenet_v2 (mobilenet_v2.yaml), batch 32")]


def ours(build, threads, cases):
    """Seconds per step and GFLOP/s per case, and the sgemm reference's GFLOP/s ("Sgemm1024")."""
    exe = os.path.join(build, "benchmarks", "train_step_bench")
    keys = [k for k, _, _ in cases] + ["Sgemm1024"]
    out = subprocess.run([exe, "--benchmark_format=json",
                          "--benchmark_filter=(%s)/%d/" % ("|".join(keys), threads)],
                         check=True, capture_output=True, text=True).stdout
    result, rate = {}, {}
    for b in json.loads(out)["benchmarks"]:
        for key in keys:
            if key in b["name"]:
                scale = {"ms": 1e-3, "us": 1e-6, "ns": 1e-9, "s": 1.0}[b["time_unit"]]
                result[key] = b["real_time"] * scale
                rate[key] = b["gflops"]
    return result, rate


# tandem's CPU backend keeps freed buffers for the next step (a caching pool). PyTorch's CPU
# tensors come from glibc's malloc, which maps every block over its threshold afresh and
# unmaps it when freed: the CNN step then takes ~17,000 page faults (67 MB of fresh pages),
# whose cost on this VM's hypervisor swings from 60 to 270 ms a step between runs. glibc is
# told to keep its blocks (largest mmap threshold, no trimming), so the peer caches as we do.
MALLOC_KEEP = {"MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "17179869184",
               "MALLOC_TOP_PAD_": "268435456"}


@functools.lru_cache(maxsize=None)
def blas_core(build):
    """The OpenBLAS kernel set tandem runs here, as `tandem devices` names it (OpenBLAS's pick
    for the CPU, or what OPENBLAS_CORETYPE names). The peer's matrix products are OpenBLAS's
    too (Debian's torch, BLAS_INFO=generic): it is given the same set."""
    exe = os.path.join(build, "targets", "tandem", "tandem")
    out = subprocess.run([exe, "devices"], check=True, capture_output=True, text=True).stdout
    found = re.search(r"^cpu .* OpenBLAS (\S+)", out, re.M)
    if not found:
        sys.exit("compare: `tandem devices` names no OpenBLAS kernel set:\n" + out)
    return found.group(1)


def peer_env(threads, build):
    env = dict(os.environ)
    env.update(OPENBLAS_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads),
               OMP_WAIT_POLICY="PASSIVE", OPENBLAS_CORETYPE=blas_core(build), **MALLOC_KEEP)
    return env


def torch(threads, cases, build, steps=None, warmup=None):
    cmd = ["/usr/bin/python3", os.path.join(ROOT, "benchmarks", "torch_peer.py"),
           "--threads", str(threads)]
    if steps is not None:
        cmd += ["--steps", str(steps)]
    if warmup is not None:
        cmd += ["--warmup", str(warmup)]
    for c in cases:
        cmd += ["--case", c]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=peer_env(threads, build)).stdout
    return {json.loads(line)["case"]: json.loads(line) for line in out.splitlines() if line.strip()}


def our_epoch(build, threads):
    exe = os.path.join(build, "targets", "tandem", "tandem")
    out = subprocess.run([exe, "train", "--model", os.path.join(ROOT, "examples/models/mlp.yaml"),
                          "--epochs", "1", "--batch", "128", "--threads", str(threads),
                          "--no-progress"], check=True, capture_output=True, text=True).stdout
    return float(re.search(r"test accuracy [0-9.]+, ([0-9.]+) s", out).group(1))


def peak_memory(build):
    exe = os.path.join(build, "targets", "tandem", "tandem")
    r = subprocess.run(["/usr/bin/time", "-v", exe, "train", "--model",
                        os.path.join(ROOT, "examples/models/cnn.yaml"), "--epochs", "1",
                        "--batch", "128", "--threads", "2", "--no-progress"],
                       check=True, capture_output=True, text=True)
    kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", r.stderr).group(1))
    return kb / 1024.0


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", default=os.path.join(ROOT, "build", "release"))
    p.add_argument("--threads", default="1,2")
    p.add_argument("--memory", action="store_true")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--cases", help="comma-separated cases to run (%s; default: all); with it "
                   "the epoch is left out" % ", ".join(c.split(":")[0] for _, c, _ in CASES))
    a = p.parse_args()
    cases = CASES
    if a.cases:
        want = a.cases.split(",")
        cases = [c for c in CASES if c[1].split(":")[0] in want]
        if len(cases) != len(want):
            p.error("--cases: unknown case in %r" % a.cases)
    print("conditions, both sides: the same models (resnet18 and mobilenet_v2: torchvision's, "
          "their stems taking 1 channel, batch norms on the batch's statistics and mobilenet_v2's "
          "dropout 0.2 on both sides), batches and random "
          "data, one training step (upload, zero grads, forward, cross-entropy, backward, SGD "
          "with momentum), the CPU threads in the table (torch: OPENBLAS_NUM_THREADS = OMP_NUM_THREADS = threads, "
          "OMP_WAIT_POLICY=PASSIVE: its OpenMP threads sleep at once, "
          "where ours yield-spin up to 2 ms; with OpenMP's spinning default they starve its "
          "OpenBLAS threads, glibc keeping freed blocks as our pool does), OpenBLAS's %s "
          "kernels (torch: OPENBLAS_CORETYPE), untimed steps first (ours 3, torch 5), then "
          "ours: Google Benchmark's mean, torch: the median of 30; best of %d alternated "
          "rounds; ours through core/train/trainer.h, what `tandem train` runs"
          % (blas_core(a.build), a.rounds))
    print("%-44s %7s %12s %12s %8s %10s %9s" % ("training step (best of %d rounds)" % a.rounds,
                                                "threads", "tandem ms", "torch ms", "ratio",
                                                "GFLOP/s", "of sgemm"))
    sgemm, best_ours, best_peer = {}, {}, {}
    for t in [int(x) for x in a.threads.split(",")]:
        mine, peer, flops = {}, {}, {}
        for _ in range(a.rounds):
            seconds, rate = ours(a.build, t, cases)
            for key, sec in seconds.items():
                if sec < mine.get(key, float("inf")):
                    mine[key], flops[key] = sec, rate[key]
            for case, r in torch(t, [c for _, c, _ in cases], a.build).items():
                peer[case] = min(peer.get(case, r["seconds_per_step"]), r["seconds_per_step"])
        sgemm[t], best_ours[t], best_peer[t] = flops["Sgemm1024"], mine, peer
        for key, case, label in cases:
            ms, pms = mine[key] * 1e3, peer[case] * 1e3
            print("%-44s %7d %12.2f %12.2f %8.2f %10.1f %8.0f%%" % (
                label, t, ms, pms, pms / ms, flops[key], 100 * flops[key] / sgemm[t]), flush=True)
    print("'of sgemm': beside a 1024^3 sgemm through the backend, measured in the same run: " +
          ", ".join("%.1f GFLOP/s at %d thread%s" % (g, t, "" if t == 1 else "s")
                    for t, g in sgemm.items()))
    if len(sgemm) > 1:
        t1, tn = min(sgemm), max(sgemm)
        print("%-44s %19s %12s" % ("gain of %d threads over %d" % (tn, t1), "tandem", "torch"))
        for key, case, label in cases:
            print("%-44s %19.2f %12.2f" % (label, best_ours[t1][key] / best_ours[tn][key],
                                           best_peer[t1][case] / best_peer[tn][case]))
        print("%-44s %19.2f" % ("sgemm 1024^3", sgemm[tn] / sgemm[t1]))
    if a.cases:
        return 0
    mine = min(our_epoch(a.build, 1) for _ in range(a.rounds))
    peer = min(torch(1, ["epoch:mlp:128"], a.build)["epoch:mlp:128"]["epoch_seconds"] for _ in range(a.rounds))
    print("%-44s %7d %11.2fs %11.2fs %8.2f" % ("epoch of mlp.yaml on Fashion-MNIST, batch 128", 1,
                                              mine, peer, peer / mine))
    if a.memory:
        print("peak RSS of tandem train, CNN, batch 128: %.1f MiB (target <= 150 MB)" % peak_memory(a.build))
    return 0


if __name__ == "__main__":
    sys.exit(main())
