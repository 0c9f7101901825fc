#!/usr/bin/env python3
"""Side-by-side training-step benchmark: trident vs PyTorch on the same machine, same threads.

Peers: the current PyTorch from bench/setup-peer-venv (2.15: eager, and torch.compile; fused AdamW
and scaled_dot_product_attention in both) and, with --with-debian, Debian's PyTorch 1.13 (the
tests' golden reference). Every (config, dtype) runs its systems in turn, A B C A B C ..., so the
drift of a shared machine hits all of them; each run's figure is the median of its timed steps,
the table gives the median over rounds, the ratio peer / trident (> 1: trident faster) and each
process's peak resident set (getrusage of the finished child: model, optimizer state, activations,
the runtime's own libraries and, for torch.compile, its compiler).

Usage (from the repo root, after scripts/build trident_gpt_step_bench and bench/setup-peer-venv):
  bench/e2e/run_step_bench.py [--rounds 2] [--threads 2] [--configs small,124m-t256,124m-t1024]
                              [--dropout 0.1]
                              [--dtypes fp32,bf16] [--systems trident,eager,compile] [--with-debian]
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
    "124m-t1024": (12, 768, 12, 50257, 1, 1024),
}
LABELS = {"trident": "trident", "eager": "PyTorch {v} eager", "compile": "PyTorch {v} compile",
          "debian": "PyTorch {d} (Debian)"}


def run_rss(cmd, env):
    """Like run, with the child's peak RSS (MiB) measured by the kernel (wait4)."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    # Read the pipes without reaping the child, then reap it with wait4 for its own rusage.
    out = proc.stdout.read()
    err = proc.stderr.read()
    _, status, ru = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.exit(f"run_step_bench: {' '.join(cmd)} failed ({proc.returncode}):\n"
                 f"{err.decode()[-3000:]}")
    rec = json.loads(out.decode().strip().splitlines()[-1])
    return rec, ru.ru_maxrss / 1024.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--configs", default="small,124m-t256,124m-t1024")
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--systems", default="trident,eager,compile")
    ap.add_argument("--with-debian", action="store_true",
                    help="also Debian's /usr/bin/python3 (PyTorch 1.13)")
    ap.add_argument("--dropout", type=float, default=0.0, metavar="P",
                    help="hidden and attention dropout P in every system (Megatron's default "
                         "0.1; 0 by default here, as the published baselines)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=2,
                    help="untimed steps first (torch.compile compiles in the first)")
    ap.add_argument("--build", default="build")
    ap.add_argument("--peer-python",
                    default=os.path.join(os.environ.get("TRIDENT_BENCH_VENV",
                                                        "/opt/trident-bench-venv"), "bin/python"))
    ap.add_argument("--json", help="also write every run's record to this file")
    args = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    systems = args.systems.split(",")
    if args.with_debian and "debian" not in systems:
        systems.append("debian")
    for s in systems:
        if s not in LABELS:
            ap.error(f"unknown system {s!r} (one of {', '.join(LABELS)})")
    if any(s in ("eager", "compile") for s in systems) and not os.access(args.peer_python, os.X_OK):
        sys.exit(f"run_step_bench: no peer PyTorch at {args.peer_python}; run bench/setup-peer-venv "
                 "(or pass --peer-python, or --systems trident --with-debian)")
    tri_bin = os.path.join(root, args.build, "bench/e2e/trident_gpt_step_bench")
    if "trident" in systems and not os.access(tri_bin, os.X_OK):
        sys.exit(f"run_step_bench: {tri_bin} missing; run scripts/build trident_gpt_step_bench")
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads),
               OPENBLAS_NUM_THREADS=str(args.threads))
    torch_py = os.path.join(root, "bench/e2e/torch_gpt_step.py")
    versions = {}
    rows, records = [], []
    for name in args.configs.split(","):
        L, C, NH, V, B, T = CONFIGS[name]
        common = ["--num-layers", str(L), "--hidden-size", str(C), "--num-attention-heads", str(NH),
                  "--vocab-size", str(V), "--micro-batch-size", str(B), "--seq-length", str(T),
                  "--hidden-dropout", str(args.dropout), "--attention-dropout", str(args.dropout)]
        for dtype in args.dtypes.split(","):
            cmds = {}
            for s in systems:
                if s == "trident":
                    cmds[s] = [tri_bin, *common, "--warmup", str(args.warmup),
                               "--steps", str(args.steps)] + (["--bf16"] if dtype == "bf16" else [])
                    continue
                py = "/usr/bin/python3" if s == "debian" else args.peer_python
                cmds[s] = [py, torch_py, *common, "--threads", str(args.threads), "--dtype", dtype,
                           "--warmup", str(args.warmup), "--steps", str(args.steps)] + \
                    (["--compile"] if s == "compile" else [])
            ms = {s: [] for s in systems}
            rss = {s: [] for s in systems}
            for r in range(args.rounds):
                for s in systems:
                    rec, peak = run_rss(cmds[s], env)
                    ms[s].append(rec["median_ms"])
                    rss[s].append(peak)
                    if "torch" in rec:
                        versions[s] = rec["torch"].split("+")[0]
                    records.append({"config": name, "dtype": dtype, "system": s, "round": r + 1,
                                    "peak_rss_mib": peak, **rec})
                    print(f"# {name} {dtype} round {r + 1}: {s} {rec['median_ms']:.1f} ms, "
                          f"peak RSS {peak:.0f} MiB", file=sys.stderr, flush=True)
            rows.append((name, dtype, B * T, {s: statistics.median(ms[s]) for s in systems},
                         {s: max(rss[s]) for s in systems}))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)
    v = versions.get("eager", versions.get("compile", "2.x"))
    labels = {s: LABELS[s].format(v=v, d=versions.get("debian", "1.13")) for s in systems}
    peers = [s for s in systems if s != "trident"]
    with open("/proc/cpuinfo") as f:
        cpu = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "?")
    print(f"CPU: {cpu}, {args.threads} threads; medians of {args.rounds} alternating rounds, "
          f"{args.steps} timed steps each after {args.warmup} warm-up")
    print()
    head = "| config | dtype | tokens/step | " + " | ".join(f"{labels[s]} ms" for s in systems)
    if "trident" in systems:
        head += " | " + " | ".join(f"{labels[s]} / trident" for s in peers)
    print(head + " |")
    print("|---|---|---:|" + "---:|" * (len(systems) + (len(peers) if "trident" in systems else 0)))
    for name, dtype, tok, m, _ in rows:
        line = f"| {name} | {dtype} | {tok} | " + " | ".join(f"{m[s]:.0f}" for s in systems)
        if "trident" in systems:
            line += " | " + " | ".join(f"{m[s] / m['trident']:.2f}x" for s in peers)
        print(line + " |")
    print()
    print("| config | dtype | " + " | ".join(f"{labels[s]} peak RSS MiB" for s in systems) + " |")
    print("|---|---|" + "---:|" * len(systems))
    for name, dtype, _, _, r in rows:
        print(f"| {name} | {dtype} | " + " | ".join(f"{r[s]:.0f}" for s in systems) + " |")


if __name__ == "__main__":
    main()
