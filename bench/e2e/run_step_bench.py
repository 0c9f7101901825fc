#!/usr/bin/env python3
"""Side-by-side training-step benchmark: trident vs PyTorch on the same machine, same threads.

Runs the two alternately (A B A B ...) so that drift of a shared machine hits both, takes the
median of each system's per-run medians, and prints the ratio. Usage (from the repo root, after
scripts/build):  bench/e2e/run_step_bench.py [--rounds 3] [--threads 2] [--configs small,124m]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

CONFIGS = {
    # name: (layers, hidden, heads, vocab, batch, seq)
    "small": (6, 384, 6, 8192, 8, 256),
    "small-v50k": (6, 384, 6, 50257, 8, 256),
    "124m": (12, 768, 12, 50257, 4, 64),
    "124m-t256": (12, 768, 12, 50257, 4, 256),
}


def run(cmd, env):
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--configs", default="small,124m")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--build", default="build")
    args = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), OPENBLAS_NUM_THREADS=str(args.threads))
    rows = []
    for name in args.configs.split(","):
        L, C, NH, V, B, T = CONFIGS[name]
        common = ["--num-layers", str(L), "--hidden-size", str(C), "--num-attention-heads", str(NH),
                  "--vocab-size", str(V), "--micro-batch-size", str(B), "--seq-length", str(T)]
        tri = [os.path.join(root, args.build, "bench/e2e/trident_gpt_step_bench"), *common,
               "--warmup", "2", "--steps", str(args.steps)]
        if args.dtype == "bf16":
            tri.append("--bf16")
        tor = ["/usr/bin/python3", os.path.join(root, "bench/e2e/torch_gpt_step.py"), *common,
               "--threads", str(args.threads), "--dtype", args.dtype, "--warmup", "2",
               "--steps", str(args.steps)]
        t_ms, p_ms = [], []
        for r in range(args.rounds):
            t_ms.append(run(tri, env)["median_ms"])
            p_ms.append(run(tor, env)["median_ms"])
            print(f"# {name} round {r + 1}: trident {t_ms[-1]:.1f} ms, pytorch {p_ms[-1]:.1f} ms",
                  file=sys.stderr, flush=True)
        t, p = statistics.median(t_ms), statistics.median(p_ms)
        rows.append((name, B * T, t, p))
    print(f"| config | tokens/step | trident {args.dtype} ms | PyTorch {args.dtype} ms | "
          f"speed-up (PyTorch / trident) |")
    print("|---|---:|---:|---:|---:|")
    for name, tok, t, p in rows:
        print(f"| {name} | {tok} | {t:.1f} | {p:.1f} | {p / t:.2f}x |")


if __name__ == "__main__":
    main()
