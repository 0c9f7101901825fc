#!/usr/bin/env python3
"""Mixture of experts against the dense model of the same active parameters, side by side.

The MoE model has E experts of F_e each, top-k routing; the dense model's MLP has k x F_e, so both
spend the same matmul FLOPs per token in their MLPs (the MoE adds the router and the routing ops)
while the MoE holds E / k times the MLP weights. Both train with `trident train` on the same data,
threads and batch, in turn (dense, moe, dense, moe, ...) so a shared machine's drift hits both.
Each run's figure is the median step time over the profiled window (--profile), the table the
median over rounds: ms per iteration, tokens/s, the ratio dense / moe, and the MoE's routing share:
the time of its router, dispatch map, permutation and combine ops (forward and backward) over the
iteration, from the profile's per-op table.

With --ep N the three models run as N data-parallel ranks under mpirun (threads / N each): the
dense model, the MoE at expert parallelism 1 and the MoE with its experts split over the N ranks
(--expert-model-parallel-size N); the table adds the all-to-all's share (the all_to_all_v waits of
the token exchange, from rank 0's profile) and the MoE tokens/s relative to the dense model's.

With --ep-load ITERS it measures what `trident plan` assumes of expert parallelism's load: the
busiest expert-parallel rank's rows over the mean (plan.h's kMoeLoadImbalance). For EP = 2, 4 and
8 it trains one process whose global batch is EP micro-batches, with experts in the first layer
only (--moe-layer-freq = the layer count) and logging every iteration, so each iteration's tokens
per expert are the rows one MoE layer call sends every expert under EP data-parallel ranks; the
experts grouped EP ways (consecutive, as the ranks hold them) give each rank's rows. It reports
the median, 90th percentile and maximum over the second half of the iterations, with the Switch
load-balancing loss 0.01 and without.

With --balance ITERS it instead trains the MoE model ITERS iterations with each balancing option
(no auxiliary loss; the Switch load-balancing loss 0.01; that with a capacity of 1.0 x the even
share dropping by probability; the per-sequence loss) and reports the last log interval's expert
load (the busiest expert's tokens over the mean), the dropped share and the language-model loss.

Usage (from the repo root, after scripts/build trident):
  bench/moe/run_moe_bench.py [--rounds 3] [--threads 2] [--experts 8] [--topk 2]
                             [--data PREFIX --tokenizer DIR] [--balance 100] [--ep 2] [--bf16]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(trident, common, extra, threads, workdir, name, ranks=1):
    metrics = os.path.join(workdir, f"{name}.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    env = dict(os.environ, OMP_NUM_THREADS=str(max(1, threads // ranks)),
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1", OMPI_MCA_mpi_yield_when_idle="1")
    launcher = ["mpirun", "-np", str(ranks), "--bind-to", "none"] if ranks > 1 else []
    cmd = launcher + [trident, "train"] + common + extra + ["--metrics-jsonl", metrics]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"run_moe_bench: {' '.join(cmd)} failed ({proc.returncode}):\n"
                 f"{proc.stderr[-3000:]}{proc.stdout[-3000:]}")
    profile = None
    last = None
    with open(metrics) as f:
        for line in f:
            rec = json.loads(line)
            if "profile" in rec:
                profile = rec["profile"]
            elif "moe_tokens_per_expert" in rec:
                last = rec
    if "--profile" not in extra and "--profile" not in common:
        return last, 0.0
    if profile is None:
        sys.exit(f"run_moe_bench: no profile record in {metrics}")
    # The profile table's per-op rows: "| op | kind | calls/step | ms/step | share | rate |".
    moe_ms = a2a_ms = 0.0
    for line in (proc.stdout + proc.stderr).splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) > 5 and cells[1].startswith("moe_"):
            moe_ms += float(cells[4])
        if len(cells) > 5 and cells[1] == "all_to_all_v":
            a2a_ms += float(cells[4])
    if ranks > 1:
        return profile["iter_ms"], moe_ms, a2a_ms
    return profile["iter_ms"], moe_ms


def records(metrics):
    with open(metrics) as f:
        return [r for r in map(json.loads, f) if "moe_tokens_per_expert" in r]


def ep_load(args, common, moe, workdir):
    base = [x for x in common if x != "--profile"]
    i = base.index("--profile-step-start")
    del base[i:i + 4]
    for flag, value in (("--train-iters", args.ep_load), ("--log-interval", 1),
                        ("--num-layers", args.layers)):
        base[base.index(flag) + 1] = str(value)
    print(f"{args.experts} experts top-{args.topk}, hidden {args.hidden}, seq {args.seq}, "
          f"micro-batch {args.micro_batch}, experts in layer 0 of {args.layers}; iterations "
          f"{args.ep_load // 2 + 1}-{args.ep_load}")
    print("| balancing | EP | busiest rank's rows / mean: median | p90 | max |")
    print("| --- | --- | --- | --- | --- |")
    for name, coeff in (("aux_loss 0.01", "0.01"), ("none", "0")):
        for ep in (2, 4, 8):
            if args.experts % ep:
                continue
            run_args = list(base)
            run_args[run_args.index("--global-batch-size") + 1] = str(ep * args.micro_batch)
            flags = list(moe) + ["--moe-layer-freq", str(args.layers)]
            flags[flags.index("--moe-aux-loss-coeff") + 1] = coeff
            run(args.trident, run_args, flags, args.threads, workdir, "ep_load")
            ratios = []
            for rec in records(os.path.join(workdir, "ep_load.jsonl"))[args.ep_load // 2:]:
                t = rec["moe_tokens_per_expert"]
                per = len(t) // ep
                loads = [sum(t[r * per:(r + 1) * per]) for r in range(ep)]
                ratios.append(max(loads) / (sum(loads) / ep))
            ratios.sort()
            p90 = ratios[min(len(ratios) - 1, int(0.9 * len(ratios)))]
            print(f"| {name} | {ep} | {statistics.median(ratios):.3f} | {p90:.3f} | "
                  f"{ratios[-1]:.3f} |", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--topk", type=int, default=2)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--expert-ffn", type=int, default=256)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--data", default="/work/shared/data/megatron/meg-gpt2-openwebtext_text_document")
    ap.add_argument("--tokenizer", default="/work/shared/data/tokenizers/gpt2")
    ap.add_argument("--trident", default=os.path.join(ROOT, "build", "tools", "trident"))
    ap.add_argument("--balance", type=int, default=0, metavar="ITERS")
    ap.add_argument("--ep", type=int, default=1, metavar="N")
    ap.add_argument("--ep-load", type=int, default=0, metavar="ITERS")
    ap.add_argument("--bf16", action="store_true", help="both models in BF16 (--bf16)")
    args = ap.parse_args()

    workdir = tempfile.mkdtemp(prefix="trident_moe_bench_")
    common = [
        "--num-layers", str(args.layers), "--hidden-size", str(args.hidden),
        "--num-attention-heads", "4", "--seq-length", str(args.seq),
        "--max-position-embeddings", str(args.seq), "--micro-batch-size", str(args.micro_batch),
        "--global-batch-size", str(args.micro_batch), "--train-iters", "12", "--lr", "3e-4",
        "--swiglu", "--disable-bias-linear", "--normalization", "RMSNorm",
        "--position-embedding-type", "rope", "--use-flash-attn",
        "--tokenizer-type", "GPT2BPETokenizer",
        "--vocab-file", os.path.join(args.tokenizer, "gpt2-vocab.json"),
        "--merge-file", os.path.join(args.tokenizer, "gpt2-merges.txt"),
        "--data-path", args.data, "--split", "98,2,0", "--eval-interval", "1000", "--eval-iters", "0",
        "--log-interval", "1", "--profile", "--profile-step-start", "4",
        "--profile-step-end", "12", "--data-cache-path", os.path.join(workdir, "cache"),
    ]
    if args.bf16:
        common.append("--bf16")
    dense = ["--ffn-hidden-size", str(args.topk * args.expert_ffn)]
    moe = ["--ffn-hidden-size", str(args.topk * args.expert_ffn), "--num-experts",
           str(args.experts), "--moe-router-topk", str(args.topk), "--moe-ffn-hidden-size",
           str(args.expert_ffn), "--moe-aux-loss-coeff", "0.01"]
    if args.ep_load > 0:
        ep_load(args, common, moe, workdir)
        return
    if args.balance > 0:
        base = [x for x in common if x not in ("--profile",)]
        i = base.index("--profile-step-start")
        del base[i:i + 4]
        i = base.index("--train-iters")
        base[i + 1] = str(args.balance)
        i = base.index("--log-interval")
        base[i + 1] = "10"
        print("| balancing | expert load max/mean | dropped | lm loss |")
        print("| --- | --- | --- | --- |")
        for name, extra in (
                ("none", []), ("aux_loss 0.01", ["--moe-aux-loss-coeff", "0.01"]),
                ("aux_loss 0.01, capacity 1.0 (probs)",
                 ["--moe-aux-loss-coeff", "0.01", "--moe-expert-capacity-factor", "1.0"]),
                ("seq_aux_loss 0.01", ["--moe-aux-loss-coeff", "0.01",
                                       "--moe-router-load-balancing-type", "seq_aux_loss"])):
            flags = list(moe)
            j = flags.index("--moe-aux-loss-coeff")
            del flags[j:j + 2]
            rec, _ = run(args.trident, base, flags + extra, args.threads, workdir, "balance")
            t = rec["moe_tokens_per_expert"]
            load = max(t) / (sum(t) / len(t))
            print(f"| {name} | {load:.2f} | {100 * rec['moe_dropped_fraction']:.2f}% | "
                  f"{rec['lm_loss']:.3f} |", flush=True)
        return
    if args.ep > 1:
        n = args.ep
        i = common.index("--global-batch-size")
        common[i + 1] = str(args.micro_batch * n)
        models = (("dense", dense), ("moe ep1", moe),
                  (f"moe ep{n}", moe + ["--expert-model-parallel-size", str(n)]))
        times = {name: [] for name, _ in models}
        routing = {name: [] for name, _ in models}
        a2a = {name: [] for name, _ in models}
        for r in range(args.rounds):
            for name, extra in models:
                ms, routing_ms, a2a_ms = run(args.trident, common, extra, args.threads, workdir,
                                             name.replace(" ", "_"), ranks=n)
                times[name].append(ms)
                routing[name].append(routing_ms / ms)
                a2a[name].append(a2a_ms / ms)
                print(f"round {r + 1}: {name} {ms:.1f} ms/iteration", flush=True)
        tokens = args.micro_batch * args.seq * n
        d = statistics.median(times["dense"])
        print()
        print(f"{n} ranks (data-parallel), {max(1, args.threads // n)} thread(s) each; "
              f"{args.layers} layers, hidden {args.hidden}, seq {args.seq}, micro-batch "
              f"{args.micro_batch}; MoE: {args.experts} experts of {args.expert_ffn}, "
              f"top-{args.topk}; dense: ffn {args.topk * args.expert_ffn}")
        print("| model | ms / iteration | tokens / s | vs dense | routing ops' share | "
              "all-to-all share |")
        print("| --- | --- | --- | --- | --- | --- |")
        for name, _ in models:
            m = statistics.median(times[name])
            share = "-" if name == "dense" else f"{100 * statistics.median(routing[name]):.1f}%"
            print(f"| {name} | {m:.1f} | {tokens / m * 1e3:.0f} | {d / m:.3f} | {share} | "
                  f"{100 * statistics.median(a2a[name]):.1f}% |")
        return
    times = {"dense": [], "moe": []}
    moe_share = []
    for r in range(args.rounds):
        for name, extra in (("dense", dense), ("moe", moe)):
            ms, routing_ms = run(args.trident, common, extra, args.threads, workdir, name)
            times[name].append(ms)
            if name == "moe":
                moe_share.append(routing_ms / ms)
            print(f"round {r + 1}: {name} {ms:.1f} ms/iteration", flush=True)
    tokens = args.micro_batch * args.seq
    d, m = statistics.median(times["dense"]), statistics.median(times["moe"])
    print()
    print(f"{args.layers} layers, hidden {args.hidden}, seq {args.seq}, micro-batch "
          f"{args.micro_batch}, {args.threads} threads; MoE: {args.experts} experts of "
          f"{args.expert_ffn}, top-{args.topk}; dense: ffn {args.topk * args.expert_ffn}")
    print("| model | ms / iteration | tokens / s | routing ops' share |")
    print("| --- | --- | --- | --- |")
    print(f"| dense | {d:.1f} | {tokens / d * 1e3:.0f} | - |")
    print(f"| MoE | {m:.1f} | {tokens / m * 1e3:.0f} | "
          f"{100 * statistics.median(moe_share):.1f}% |")
    print(f"dense / MoE time: {d / m:.3f} (MoE tokens/s relative to dense: {d / m:.3f})")


if __name__ == "__main__":
    main()
