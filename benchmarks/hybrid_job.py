#!/usr/bin/python3
"""A hybrid job (a replicated pipeline stage) under two builds of tandem, alternated.

    benchmarks/hybrid_job.py --before OTHER/build/release [--after build/release]
                             [--rounds 8] [--train-limit 32768]

The product's path: `tandem run JOB.yaml` on a local node daemon, a 784-1024-1024-10
MLP (1.9 M parameters, 7.5 MB of gradients) in two stages, the first (flatten and both
wide linears) as two replicas that sum their gradients every step, the second (the
classifier) alone: three worker processes, one thread each, Unix-socket (ipc) links and
group, named in the job so that an older `--before` build runs them too (ipc is what a
local run chooses now; before it chose tcp on loopback); 1F1B,
4 microbatches of 128, SGD, `--train-limit` Fashion-MNIST samples for one epoch. Each
round runs the `--before` build's tandem, then the `--after` build's, and prints both
runs' samples/s (the run's own figure) and the ratio after / before; then the median
ratio. Meant for a change to how replicas sum (build the commit before it in another
tree); the weights of the two are compared as the runs' train losses, which print too.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

# train_step_bench's mlp-wide (benchmarks/train_step_cases.h), written out for tandem run.
MODEL = """name: mlp-wide
input: [1, 28, 28]
layers:
  - flatten
  - linear: {out: 1024}
  - relu
  - linear: {out: 1024}
  - relu
  - linear: {out: 10}
"""

JOB = """model: {model}
data: fashion-mnist
train_limit: {limit}
test_limit: 512
epochs: 1
batch: 128
microbatches: 4
schedule: 1f1b
optimizer: {{kind: sgd, lr: 0.01, momentum: 0.9}}
transport: ipc
partition: [{{layers: [0, 4], replicas: 2}}, [4, 6]]
seed: 1
"""


def run(build, job):
    tandem = os.path.join(build, "targets", "tandem", "tandem")
    out = subprocess.run([tandem, "run", job], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{tandem} run {job} failed ({out.returncode}):\n{out.stdout}{out.stderr}")
    text = out.stdout + out.stderr
    rate = re.search(r"\((\d+) samples/s\)", text)
    loss = re.search(r"train loss ([0-9.]+)", text)
    if not rate or not loss:
        sys.exit(f"no samples/s or train loss in the output of {tandem}:\n{text}")
    return int(rate.group(1)), loss.group(1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="the build folder of the other tree")
    ap.add_argument("--after", default="build/release")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--train-limit", type=int, default=32768)
    a = ap.parse_args()
    if a.rounds < 1 or a.train_limit < 512:
        sys.exit("--rounds must be at least 1 and --train-limit at least 512")
    with tempfile.TemporaryDirectory(prefix="tandem-hybrid-") as d:
        model = os.path.join(d, "wide.yaml")
        job = os.path.join(d, "hybrid.yaml")
        with open(model, "w") as f:
            f.write(MODEL)
        with open(job, "w") as f:
            f.write(JOB.format(model=model, limit=a.train_limit))
        print(f"conditions: {a.before} then {a.after} each round, one local daemon, 3 worker "
              f"processes of 1 thread, ipc links and group, {a.train_limit} samples, {os.cpu_count()} CPUs")
        print(f"{'round':>5} {'before/s':>9} {'after/s':>9} {'after/before':>13}  train loss")
        ratios = []
        for r in range(a.rounds):
            b, lb = run(a.before, job)
            n, ln = run(a.after, job)
            ratios.append(n / b)
            print(f"{r + 1:>5} {b:>9} {n:>9} {n / b:>13.3f}  {lb} / {ln}")
        print(f"median after/before: {statistics.median(ratios):.3f} "
              f"(range {min(ratios):.3f}-{max(ratios):.3f})")


if __name__ == "__main__":
    main()
