#!/usr/bin/env python3
"""trident plan's GPU time model against published training throughputs (docs/plan.md).

Each row: the published model, layout and cluster, the published iteration time (measured, or
derived from the published TFLOP/s with the paper's own FLOP formula), and trident plan's
prediction for the same flags. Prints a markdown table. Usage (repo root, after scripts/build
trident_cli):  bench/plan/validate_gpu.py
"""
import json
import os
import subprocess

CLI = os.path.join(os.path.dirname(__file__), "..", "..", "build", "tools", "trident")


def model(L, h, a, s=2048, V=51200):
    return dict(L=L, h=h, a=a, s=s, V=V)


def flops_with_recompute(m, B):
    """Megatron 2021 (arXiv:2104.04473 eq. 3): 96 B s l h^2 (1 + s/(6h) + V/(16 l h))."""
    return 96 * B * m["s"] * m["L"] * m["h"] ** 2 * (
        1 + m["s"] / (6 * m["h"]) + m["V"] / (16 * m["L"] * m["h"]))


def flops_model(m, B):
    """Model FLOPs (no recompute): 72 B s l h^2 (1 + s/(6h) + V/(12 l h))."""
    return 72 * B * m["s"] * m["L"] * m["h"] ** 2 * (
        1 + m["s"] / (6 * m["h"]) + m["V"] / (12 * m["L"] * m["h"]))


ROWS = []
# BLOOM-176B: bigscience-workshop/bigscience train/tr11-176B-ml/chronicles.md, log line
# "elapsed time per iteration (s): 105.22 ... TFLOPs: 149.02" at GBS 2048, 384 A100-80GB.
ROWS.append(dict(
    name="BLOOM-176B", source="BigScience tr11 chronicles (log line, GBS 2048)",
    gpu="A100-80GB", gpus=384, m=model(70, 14336, 112, V=250680),
    flags="--model bloom --tensor-model-parallel-size 4 --pipeline-model-parallel-size 12 "
          "--decoder-first-pipeline-num-layers 5 --decoder-last-pipeline-num-layers 5 "
          "--micro-batch-size 2 --global-batch-size 2048 --recompute-granularity full "
          "--make-vocab-size-divisible-by 128",
    published_s=105.22))
# MT-NLG 530B: Smith et al., arXiv:2201.11990, throughput table (GBS 1920, TP8 PP35).
for nodes, t in ((280, 60.1), (350, 50.2), (420, 44.4)):
    ROWS.append(dict(
        name="MT-NLG 530B, %d nodes" % nodes, source="arXiv:2201.11990 (iteration time)",
        gpu="A100-80GB", gpus=nodes * 8, m=model(105, 20480, 128, V=50257),
        flags="--tensor-model-parallel-size 8 --pipeline-model-parallel-size 35 "
              "--micro-batch-size 1 --global-batch-size 1920 --recompute-granularity full",
        published_s=t))
# Megatron-LM, Narayanan et al., arXiv:2104.04473 Table 1 (weak scaling, full recomputation,
# TFLOP/s counted with recomputation); iteration time derived with the paper's formula.
for p, a, h, L, tp, pp, n, B, tf in (
        (1.7, 24, 2304, 24, 1, 1, 32, 512, 137), (3.6, 32, 3072, 30, 2, 1, 64, 512, 138),
        (7.5, 32, 4096, 36, 4, 1, 128, 512, 142), (18.4, 48, 6144, 40, 8, 1, 256, 1024, 135),
        (39.1, 64, 8192, 48, 8, 2, 512, 1536, 138), (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140),
        (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148),
        (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155),
        (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163),
        (1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163)):
    m = model(L, h, a)
    ROWS.append(dict(
        name="Megatron-LM %.1fB" % p, source="arXiv:2104.04473 Table 1 (%d TFLOP/s)" % tf,
        gpu="A100-80GB", gpus=n, m=m,
        flags="--tensor-model-parallel-size %d --pipeline-model-parallel-size %d "
              "--micro-batch-size 1 --global-batch-size %d --recompute-granularity full"
              % (tp, pp, B),
        published_s=flops_with_recompute(m, B) / (tf * 1e12 * n)))
# Korthikanti et al., arXiv:2205.05198 (sequence parallelism + selective recomputation), DP = 1,
# model FLOPs utilisation (MFU) as in the Megatron-LM README; iteration time derived from MFU.
for p, a, h, L, pp, n, B, mfu in ((22, 64, 6144, 48, 1, 8, 4, 0.415),
                                  (175, 96, 12288, 96, 8, 64, 64, 0.514),
                                  (530, 128, 20480, 105, 35, 280, 280, 0.560),
                                  (1000, 160, 25600, 128, 64, 512, 512, 0.563)):
    m = model(L, h, a)
    ROWS.append(dict(
        name="Megatron SP+selective %dB" % p, source="arXiv:2205.05198 / README (MFU %.1f%%)"
        % (100 * mfu), gpu="A100-80GB", gpus=n, m=m,
        flags="--tensor-model-parallel-size 8 --pipeline-model-parallel-size %d "
              "--micro-batch-size 1 --global-batch-size %d --sequence-parallel "
              "--recompute-granularity selective" % (pp, B),
        published_s=flops_model(m, B) / (mfu * 312e12 * n)))


def main():
    print("| run | layout | GPUs | published s/iter | predicted s/iter | error | predicted MFU | "
          "source |")
    print("|---|---|---|---|---|---|---|---|")
    errs = []
    for r in ROWS:
        m = r["m"]
        cmd = [CLI, "plan", "--gpu", r["gpu"], "--num-gpus", str(r["gpus"]), "--format", "json",
               "--bf16", "--use-flash-attn", "--num-layers", str(m["L"]), "--hidden-size",
               str(m["h"]), "--num-attention-heads", str(m["a"]), "--seq-length", str(m["s"]),
               "--max-position-embeddings", str(m["s"]), "--vocab-size", str(m["V"])
               ] + r["flags"].split()
        j = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
        t = j["time"]["iteration_s"]
        err = (t - r["published_s"]) / r["published_s"]
        errs.append(abs(err))
        lay = j["layout"]
        print("| %s | TP%d PP%d DP%d mbs %d | %d | %.2f | %.2f | %+.1f%% | %.1f%% | %s |" % (
            r["name"], lay["tp"], lay["pp"], lay["dp"], lay["micro_batch_size"], r["gpus"],
            r["published_s"], t, 100 * err, 100 * j["time"]["mfu"], r["source"]))
    print("\nrows within 15%%: %d of %d; median |error| %.1f%%" % (
        sum(e <= 0.15 for e in errs), len(errs), 100 * sorted(errs)[len(errs) // 2]))


if __name__ == "__main__":
    main()
