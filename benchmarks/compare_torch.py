#!/usr/bin/python3
"""Training-step speed of tandem next to PyTorch, measured in the same run.

    benchmarks/compare_torch.py [--build build/release] [--threads 1,2] [--memory]

For each thread count it runs our Google Benchmark binary (train_step_bench) and the
PyTorch peer (benchmarks/torch_peer.py, a fresh process with OPENBLAS_NUM_THREADS,
OMP_NUM_THREADS and OMP_WAIT_POLICY=PASSIVE set so torch's thread count is what it
claims), then a full Fashion-MNIST epoch of examples/models/mlp.yaml at batch 128 in
both. It prints milliseconds per step and the ratio torch/tandem: >= 1.0 means tandem is
at least as fast. With --memory it also reports the peak resident memory of
`tandem train` for the CNN at batch 128 (one epoch), from /usr/bin/time -v.

Needs python3-torch (scripts/setup --with-peer). Timings on shared machines are noisy:
compare only figures from one run.
"""
import argparse
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASES = [("MlpWide_b256", "mlp-wide:256", "MLP 784-1024-1024-10, batch 256"),
         ("Cnn_b128", "cnn:128", "CNN (examples/models/cnn.yaml), batch 128"),
         ("GptMini_b16", "gpt-mini:16", "GPT (examples/models/gpt-mini.yaml), batch 16")]


def ours(build, threads):
    exe = os.path.join(build, "benchmarks", "train_step_bench")
    out = subprocess.run([exe, "--benchmark_format=json",
                          "--benchmark_filter=(MlpWide_b256|Cnn_b128|GptMini_b16)/%d/" % threads],
                         check=True, capture_output=True, text=True).stdout
    result = {}
    for b in json.loads(out)["benchmarks"]:
        for key, _, _ in CASES:
            if key in b["name"]:
                scale = {"ms": 1e-3, "us": 1e-6, "ns": 1e-9, "s": 1.0}[b["time_unit"]]
                result[key] = b["real_time"] * scale
    return result


def peer_env(threads):
    env = dict(os.environ)
    env.update(OPENBLAS_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads),
               OMP_WAIT_POLICY="PASSIVE")
    return env


def torch(threads, cases):
    cmd = ["/usr/bin/python3", os.path.join(ROOT, "benchmarks", "torch_peer.py"),
           "--threads", str(threads)]
    for c in cases:
        cmd += ["--case", c]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=peer_env(threads)).stdout
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
    a = p.parse_args()
    print("%-44s %7s %12s %12s %8s" % ("training step (best of %d rounds)" % a.rounds, "threads",
                                       "tandem ms", "torch ms", "ratio"))
    for t in [int(x) for x in a.threads.split(",")]:
        mine, peer = {}, {}
        for _ in range(a.rounds):
            for key, sec in ours(a.build, t).items():
                mine[key] = min(mine.get(key, sec), sec)
            for case, r in torch(t, [c for _, c, _ in CASES]).items():
                peer[case] = min(peer.get(case, r["seconds_per_step"]), r["seconds_per_step"])
        for key, case, label in CASES:
            ms, pms = mine[key] * 1e3, peer[case] * 1e3
            print("%-44s %7d %12.2f %12.2f %8.2f" % (label, t, ms, pms, pms / ms), flush=True)
    mine = min(our_epoch(a.build, 1) for _ in range(a.rounds))
    peer = min(torch(1, ["epoch:mlp:128"])["epoch:mlp:128"]["epoch_seconds"] for _ in range(a.rounds))
    print("%-44s %7d %11.2fs %11.2fs %8.2f" % ("epoch of mlp.yaml on Fashion-MNIST, batch 128", 1,
                                              mine, peer, peer / mine))
    if a.memory:
        print("peak RSS of tandem train, CNN, batch 128: %.1f MiB (target <= 150 MB)" % peak_memory(a.build))
    return 0


if __name__ == "__main__":
    sys.exit(main())
