# The router reference for tests/kernels/moe_router_golden.cc: megatron-core's own
# topk_routing_with_score_function (megatron/core/transformer/moe/moe_utils.py, the pip package
# scripts/install-python-deps puts in /opt/trident-pyref), unmodified, on the logits trident
# dumped (as float64): softmax or sigmoid scores, pre-softmax, the top-k scaling factor, the
# expert bias, and group-limited routing (num_groups / group_topk).
# Usage: moe_router_mcore.py --inputs IN.trtf --output OUT.trtf
"""Runs megatron-core's router on each dumped case and writes its probabilities and map."""

import argparse
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "data", "reference"))
from mcore_import import load_megatron_core  # noqa: E402
from tensor_file import read_tensor_file, write_tensor_file  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--inputs", required=True)
    ap.add_argument("--output", required=True)
    args = ap.parse_args()
    load_megatron_core()
    from megatron.core.transformer.moe.moe_utils import topk_routing_with_score_function

    t = read_tensor_file(args.inputs)
    out = {}
    for i in range(int(t["cases"].item())):
        topk, sigmoid, pre_softmax, scaling, groups, group_topk, has_bias = t[f"cfg_{i}"].tolist()
        logits = t[f"logits_{i}"].double()
        bias = t[f"bias_{i}"].double() if has_bias else None
        probs, routing_map = topk_routing_with_score_function(
            logits, int(topk), use_pre_softmax=bool(pre_softmax),
            num_groups=int(groups) if groups > 1 else None,
            group_topk=int(group_topk) if groups > 1 else None,
            scaling_factor=scaling if scaling != 1.0 else None,
            score_function="sigmoid" if sigmoid else "softmax", expert_bias=bias)
        out[f"probs_{i}"] = probs.double()
        out[f"map_{i}"] = routing_map.long()
    write_tensor_file(args.output, out)


if __name__ == "__main__":
    main()
