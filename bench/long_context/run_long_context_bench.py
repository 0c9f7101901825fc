#!/usr/bin/env python3
"""Long sequences: activation memory per rank and step time against the sequence length, for one
rank and the sequence split over ranks by context parallelism (the ring, --context-parallel-size)
and by DeepSpeed-Ulysses (--ds-sequence-parallel-size).

Each layout trains the same small GPT (Llama-style: RMSNorm, rotary, SwiGLU, flash attention) on
the same data, one sample of S tokens per step (global batch 1: the split ranks are the only
ranks), for --iters iterations under mpirun. The figures per run, from rank 0's log and metrics:
  - activations: the bytes of one micro-batch's activation arena on a rank (the saved activations
    of every layer, the workspace and, split, the ring's or the all-to-all's buffers), which is
    what a long sequence fills; the ratio to the one-rank run shows the 1 / C fall;
  - peak RSS: the rank's peak resident memory (weights, optimizer state and the process too);
  - ms / iteration: the median over the iterations after the first (--rounds rounds alternated
    over the layouts, the median of the rounds' figures).
On one 2-core host the split runs oversubscribe the cores, so their times show the overheads
(exchange, more kernel calls) at the same total compute, not a speed-up; the memory is exact.

Usage (from the repo root, after scripts/build trident):
  bench/long_context/run_long_context_bench.py [--seqs 2048,4096,8192,16384]
      [--layouts 1,cp2,cp4,uly2,uly4] [--iters 4] [--rounds 1] [--hidden 256] [--layers 2]
      [--heads 8] [--threads 2]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def layout_flags(layout):
    """'1' -> 1 rank; 'cpN' -> the ring over N; 'ulyN' -> Ulysses over N."""
    if layout == "1":
        return 1, []
    m = re.fullmatch(r"(cp|uly)(\d+)", layout)
    if not m:
        sys.exit(f"run_long_context_bench: unknown layout {layout!r} (1, cpN or ulyN)")
    n = int(m.group(2))
    flag = "--context-parallel-size" if m.group(1) == "cp" else "--ds-sequence-parallel-size"
    return n, [flag, str(n)]


def run(args, seq, layout, workdir):
    ranks, extra = layout_flags(layout)
    name = f"{layout}_{seq}"
    metrics = os.path.join(workdir, f"{name}.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    env = dict(os.environ, OMP_NUM_THREADS=str(max(1, args.threads // ranks)),
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1", OMPI_MCA_mpi_yield_when_idle="1")
    launcher = ["mpirun", "-np", str(ranks), "--bind-to", "none"] if ranks > 1 else []
    cmd = launcher + [args.trident, "train",
                      "--num-layers", str(args.layers), "--hidden-size", str(args.hidden),
                      "--num-attention-heads", str(args.heads), "--seq-length", str(seq),
                      "--max-position-embeddings", str(seq), "--micro-batch-size", "1",
                      "--global-batch-size", "1", "--train-iters", str(args.iters),
                      "--lr", "3e-4", "--model", "llama", "--use-flash-attn",
                      "--tokenizer-type", "GPT2BPETokenizer",
                      "--vocab-file", os.path.join(args.tokenizer, "gpt2-vocab.json"),
                      "--merge-file", os.path.join(args.tokenizer, "gpt2-merges.txt"),
                      "--data-path", args.data, "--split", "98,2,0", "--eval-iters", "0",
                      "--eval-interval", "100000", "--log-interval", "1",
                      "--data-cache-path", os.path.join(workdir, "cache"),
                      "--metrics-jsonl", metrics] + extra
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    log = proc.stdout + proc.stderr
    if proc.returncode != 0:
        sys.exit(f"run_long_context_bench: {' '.join(cmd)} failed ({proc.returncode}):\n"
                 f"{log[-4000:]}")
    act = re.search(r"activations (\d+) slot\(s\) x (\d+) B", log)
    rss = re.search(r"peak RSS per rank \[(\d+)", log)
    if not act or not rss:
        sys.exit(f"run_long_context_bench: no memory lines in the log of {name}:\n{log[-3000:]}")
    times = []
    with open(metrics) as f:
        for line in f:
            rec = json.loads(line)
            if "iter_ms" in rec and "iteration" in rec and rec["iteration"] > 1:
                times.append(rec["iter_ms"])
    return {"activations": int(act.group(1)) * int(act.group(2)), "rss": int(rss.group(1)),
            "ms": statistics.median(times)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seqs", default="2048,4096,8192,16384")
    ap.add_argument("--layouts", default="1,cp2,cp4,uly2,uly4")
    ap.add_argument("--iters", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--data", default="/work/shared/data/megatron/meg-gpt2-openwebtext_text_document")
    ap.add_argument("--tokenizer", default="/work/shared/data/tokenizers/gpt2")
    ap.add_argument("--trident", default=os.path.join(ROOT, "build", "tools", "trident"))
    args = ap.parse_args()
    seqs = [int(s) for s in args.seqs.split(",")]
    layouts = args.layouts.split(",")
    workdir = tempfile.mkdtemp(prefix="trident_long_context_bench_")
    results = {}
    for _ in range(args.rounds):
        for seq in seqs:
            for layout in layouts:
                r = run(args, seq, layout, workdir)
                results.setdefault((seq, layout), []).append(r)
    print(f"GPT (Llama-style) {args.layers} layers, hidden {args.hidden}, {args.heads} heads; "
          f"1 sample per step; {args.threads} threads in all; {args.iters} iterations, "
          f"median of {args.rounds} round(s)")
    print("| seq | layout | ranks | activations / rank (MiB) | vs 1 rank | peak RSS / rank (MiB) "
          "| ms / iteration |")
    print("|---|---|---|---|---|---|---|")
    for seq in seqs:
        base = None
        for layout in layouts:
            rs = results[(seq, layout)]
            act = statistics.median(r["activations"] for r in rs)
            if layout == "1":
                base = act
            ratio = f"{act / base:.3f}" if base else "-"
            print(f"| {seq} | {layout} | {layout_flags(layout)[0]} | {act / 2**20:.1f} | {ratio} | "
                  f"{statistics.median(r['rss'] for r in rs) / 2**20:.1f} | "
                  f"{statistics.median(r['ms'] for r in rs):.0f} |")


if __name__ == "__main__":
    main()
