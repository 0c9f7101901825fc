#!/usr/bin/env python3
"""trident plan --gpu cpu against measured `trident train` iteration times on this machine.

For every layout of the equivalence tests (tests/dist/equivalence_test.cc) and each model size,
runs `trident train` under mpirun (OMP_NUM_THREADS=1 per rank, as the tests run), takes the median
iteration time of the iterations after the first `--skip`, asks `trident plan --format json` for
its prediction with the same flags, and prints a markdown table with the error. Needs a
calibration first:  build/tools/trident plan --gpu cpu --calibrate --threads-per-rank 1
(the script then times each layout's shapes, and the collectives of each rank count with
`mpirun -np N trident plan --gpu cpu --calibrate-comm`, unless told not to).
Usage (repo root, after scripts/build trident_cli):
  bench/plan/compare_cpu.py [--models small,medium] [--layouts dp2,tp2,...] [--iters 8]
                            [--rounds 3] [--recalibrate]
"""
import argparse
import json
import os
import random
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile

CLI = os.path.join(os.path.dirname(__file__), "..", "..", "build", "tools", "trident")

MODELS = {
    # The equivalence tests' model, and one where compute outweighs per-call overheads.
    "small": "--num-layers 4 --hidden-size 32 --num-attention-heads 4 --seq-length 16 "
             "--micro-batch-size 2 --global-batch-size 16",
    "medium": "--num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 128 "
              "--micro-batch-size 2 --global-batch-size 16",
}

# name: (ranks, flags, tp) as in tests/dist/equivalence_test.cc
LAYOUTS = {
    "single": (1, "", 1),
    "dp2": (2, "", 1),
    "dp4": (4, "", 1),
    "tp2": (2, "--tensor-model-parallel-size 2", 2),
    "tp4": (4, "--tensor-model-parallel-size 4", 4),
    "tp2dp2": (4, "--tensor-model-parallel-size 2", 2),
    "tp2sp": (2, "--tensor-model-parallel-size 2 --sequence-parallel", 2),
    "tp4spdp2": (8, "--tensor-model-parallel-size 4 --sequence-parallel", 4),
    "pp2": (2, "--pipeline-model-parallel-size 2", 1),
    "pp4": (4, "--pipeline-model-parallel-size 4", 1),
    "pp2gpipe": (2, "--pipeline-model-parallel-size 2 --pipeline-schedule gpipe", 1),
    "pp2v2": (2, "--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 1", 1),
    "pp2uneven": (2, "--pipeline-model-parallel-size 2 --decoder-first-pipeline-num-layers 1", 1),
    "tp2pp2dp2": (8, "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2", 2),
    "zero1dp2": (2, "--zero-stage 1 --ddp-bucket-size 5000", 1),
    "zero2dp4": (4, "--zero-stage 2", 1),
    "zero3dp2": (2, "--zero-stage 3", 1),
    "zero3dp4": (4, "--zero-stage 3", 1),
    "zero3dp3": (3, "--zero-stage 3 --ddp-bucket-size 3000 --global-batch-size 12", 1),
    "pp2dp2zero2": (4, "--pipeline-model-parallel-size 2 --zero-stage 2", 1),
    "tp2pp2dp2zero3sp": (8, "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 "
                            "--zero-stage 3 --sequence-parallel", 2),
}

ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1", OMPI_MCA_mpi_yield_when_idle="1",
           OMP_NUM_THREADS="1")


def make_corpus(prefix, vocab=300, docs=400):
    """A Megatron .bin/.idx pair (uint16 tokens), written directly (format: docs/formats)."""
    rng = random.Random(3)
    seqs = [[rng.randrange(vocab) for _ in range(60 + d % 23)] for d in range(docs)]
    with open(prefix + ".bin", "wb") as f:
        for s in seqs:
            f.write(struct.pack("<%dH" % len(s), *s))
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", 8))
        f.write(struct.pack("<QQ", len(seqs), len(seqs) + 1))
        f.write(struct.pack("<%di" % len(seqs), *[len(s) for s in seqs]))
        ptr, ptrs = 0, []
        for s in seqs:
            ptrs.append(ptr)
            ptr += 2 * len(s)
        f.write(struct.pack("<%dq" % len(seqs), *ptrs))
        f.write(struct.pack("<%dq" % (len(seqs) + 1), *range(len(seqs) + 1)))


def measure(np_, flags, work, iters, skip):
    """Median wall and rank-0 CPU ms of the iterations after `skip`, and rank 0's profile of the
    same iterations (ms per iteration by kind, from trident train --profile)."""
    metrics = os.path.join(work, "m.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    cmd = ([shutil.which("mpirun"), "-np", str(np_)] if np_ > 1 else []) + [
        CLI, "train"] + flags.split() + [
        "--train-iters", str(iters), "--log-interval", "1", "--eval-iters", "0",
        "--eval-interval", "1000", "--peak-tflops", "1", "--tokenizer-type", "NullTokenizer",
        "--vocab-size", "300", "--data-path", os.path.join(work, "corpus"),
        "--data-cache-path", os.path.join(work, "cache"), "--metrics-jsonl", metrics,
        "--profile", "--profile-step-start", str(skip), "--profile-step-end", str(iters)]
    subprocess.run(cmd, check=True, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    lines = [json.loads(l) for l in open(metrics)]
    recs = [r for r in lines if "iter_ms" in r]
    prof = next(r["profile"] for r in lines if "profile" in r)
    return (statistics.median([r["iter_ms"] for r in recs[skip:]]),
            statistics.median([r["iter_cpu_ms"] for r in recs[skip:]]), prof)


# The profile's kinds against the plan's terms (ms per iteration).
KINDS = [("GEMM", lambda p: p["GEMM"], lambda t: t["gemm_s"]),
         ("attention", lambda p: p["attention"], lambda t: t["attention_s"]),
         ("memory-bound + loss", lambda p: p["memory-bound"] + p["loss"],
          lambda t: t["elementwise_s"]),
         ("optimizer", lambda p: p["optimizer"], lambda t: t["optimizer_s"]),
         ("communication + bubble", lambda p: p["communication"],
          lambda t: t["tp_comm_s"] + t["pp_comm_s"] + t["dp_exposed_s"] + t["bubble_s"]),
         ("outside", lambda p: p["outside"], lambda t: t["oversubscription_s"])]


def predict(np_, flags, cache, calibrate):
    """--calibrate first times this layout's GEMM and attention shapes (cached)."""
    out = subprocess.run([CLI, "plan", "--gpu", "cpu", "--threads-per-rank", "1", "--num-gpus",
                          str(np_), "--format", "json", "--tokenizer-type", "NullTokenizer",
                          "--vocab-size", "300"] + flags.split() + (
                          ["--calibration-file", cache] if cache else []) + (
                          ["--calibrate"] if calibrate else []),
                         check=True, env=ENV, capture_output=True, text=True).stdout
    return json.loads(out)["time"]


def calibrate_comm(np_, cache):
    """Times trident's collectives over np_ ranks (cached next to the kernels' calibration)."""
    subprocess.run([shutil.which("mpirun"), "-np", str(np_), CLI, "plan", "--gpu", "cpu",
                    "--threads-per-rank", "1", "--calibrate-comm"] + (
                    ["--calibration-file", cache] if cache else []),
                   check=True, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="small,medium")
    ap.add_argument("--layouts", default=",".join(LAYOUTS))
    ap.add_argument("--iters", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3,
                    help="times every layout is trained, the layouts taking turns (round 1 of "
                         "every layout, then round 2, ...), so that the machine's drift hits all "
                         "of them; the median round is compared")
    ap.add_argument("--recalibrate", action="store_true",
                    help="a fresh calibration (kernels, shapes, collectives) before every round, "
                         "each round predicted from its own; the round with the median error is "
                         "shown (this machine's speed moves by 10-15 %% over minutes: a "
                         "calibration predicts the moment it was taken in)")
    ap.add_argument("--skip", type=int, default=3)
    ap.add_argument("--calibration-file", default="")
    ap.add_argument("--no-shape-calibration", action="store_true",
                    help="predict from the shape grid only (no exact timing of the layout's shapes)")
    ap.add_argument("--no-comm-calibration", action="store_true",
                    help="price collectives from the copy bandwidth (no --calibrate-comm runs)")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="trident_plan_bench_")
    make_corpus(os.path.join(work, "corpus"))
    print("load average before: %.1f" % os.getloadavg()[0])
    print("| model | layout | ranks | measured ms (wall), median round (range) | rank-0 CPU ms | "
          "predicted ms | error vs wall | error vs CPU | compute / comm / bubble / shared-cores "
          "ms | load |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    errors, cpu_errors, kinds = [], [], []
    runs = []  # (model, name, np_, flags)
    for model in args.models.split(","):
        for name in args.layouts.split(","):
            np_, lflags, tp = LAYOUTS[name]
            flags = MODELS[model] + " --make-vocab-size-divisible-by %d " % (128 // tp) + lflags
            runs.append((model, name, np_, flags))

    def calibrate_all(cache):
        comm_done = set()
        for model, name, np_, flags in runs:
            if not args.no_shape_calibration:
                predict(np_, flags, cache, True)
            if np_ > 1 and not args.no_comm_calibration and np_ not in comm_done:
                calibrate_comm(np_, cache)
                comm_done.add(np_)

    if not args.recalibrate:
        calibrate_all(args.calibration_file)
    rounds = {r[:2]: [] for r in runs}
    for r in range(args.rounds):
        cache = args.calibration_file
        if args.recalibrate:
            cache = os.path.join(work, "calibration-%d.json" % r)
            calibrate_all(cache)
        for model, name, np_, flags in runs:
            got = measure(np_, flags, work, args.iters, args.skip) + (os.getloadavg()[0],)
            t = predict(np_, flags, cache, False) if args.recalibrate else None
            rounds[(model, name)].append(got + (t,))
    for model, name, np_, flags in runs:
        got = rounds[(model, name)]
        if args.recalibrate:  # each round against its own calibration: the median error
            got = sorted(got, key=lambda g: g[4]["iteration_s"] * 1e3 / g[0])
        else:
            got = sorted(got, key=lambda g: g[0])
        measured, cpu, prof, load, t = got[len(got) // 2]
        spread = "%.0f-%.0f" % (min(g[0] for g in got), max(g[0] for g in got))
        if t is None:
            t = predict(np_, flags, args.calibration_file, False)
        pred = t["iteration_s"] * 1e3
        err = (pred - measured) / measured
        err_cpu = (pred - cpu) / cpu
        errors.append(abs(err))
        cpu_errors.append(abs(err_cpu))
        comp = (t["forward_s"] + t["backward_s"] + t["recompute_s"]) * 1e3
        comm = (t["tp_comm_s"] + t["pp_comm_s"] + t["dp_exposed_s"]) * 1e3
        print("| %s | %s | %d | %.2f (%s) | %.2f | %.2f | %+.1f%% | %+.1f%% | %.2f / %.2f / %.2f / "
              "%.2f | %.1f |" % (model, name, np_, measured, spread, cpu, pred, 100 * err,
                                 100 * err_cpu, comp, comm, t["bubble_s"] * 1e3,
                                 t["oversubscription_s"] * 1e3, load), flush=True)
        kinds.append((model, name, prof["ms_per_iteration"], t))
    print("\nRank 0's profile (trident train --profile, same iterations) against the plan's "
          "terms, ms per iteration, measured / predicted:\n")
    print("| model | layout | " + " | ".join(k[0] for k in KINDS) + " |")
    print("|---|---|" + "---|" * len(KINDS))
    for model, name, p, t in kinds:
        print("| %s | %s | " % (model, name) + " | ".join(
            "%.1f / %.1f" % (m(p), 1e3 * pr(t)) for _, m, pr in KINDS) + " |")
    for what, errs in (("wall", errors), ("CPU", cpu_errors)):
        print("\nvs %s: layouts within 15%%: %d of %d; median |error| %.1f%%, max %.1f%%" % (
            what, sum(e <= 0.15 for e in errs), len(errs), 100 * statistics.median(errs),
            100 * max(errs)))
    shutil.rmtree(work)


if __name__ == "__main__":
    sys.exit(main())
