# The Lion reference for tests/optim/lion_golden.cc: lion-pytorch's Lion optimizer (pip package
# lion-pytorch, installed by scripts/install-python-deps into /opt/trident-pyref), in float64, on
# the inputs trident dumped (a parameter table's tensors, gradients and schedule for a few steps).
# Usage: lion_reference.py --inputs IN.trtf --output OUT.trtf
"""Runs lion_pytorch.Lion over the dumped steps and writes the weights and the momentum."""

import argparse
import os
import sys

import torch
from lion_pytorch import Lion

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tensor_file import read_tensor_file, write_tensor_file  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--inputs", required=True)
    ap.add_argument("--output", required=True)
    args = ap.parse_args()
    t = read_tensor_file(args.inputs)
    offsets, numels, decay = t["offsets"].tolist(), t["numels"].tolist(), t["decay"].tolist()
    flat0 = t["params"].double()
    grads = t["grads"].double()
    lrs, scales = t["lrs"].tolist(), t["scales"].tolist()
    beta1, beta2, weight_decay = t["hyper"].tolist()

    params = [flat0[o:o + n].clone().requires_grad_(True) for o, n in zip(offsets, numels)]
    decayed = [p for p, d in zip(params, decay) if d]
    plain = [p for p, d in zip(params, decay) if not d]
    opt = Lion([{"params": decayed, "weight_decay": weight_decay},
                {"params": plain, "weight_decay": 0.0}],
               lr=lrs[0], betas=(beta1, beta2))
    ambiguous = torch.zeros(flat0.numel(), dtype=torch.int64)
    for step, (lr, scale) in enumerate(zip(lrs, scales)):
        for group in opt.param_groups:
            group["lr"] = lr
        for p, o, n in zip(params, offsets, numels):
            g = grads[step, o:o + n] * scale
            p.grad = g.clone()
            m = opt.state[p]["exp_avg"] if len(opt.state[p]) else torch.zeros_like(p)
            a, b = beta1 * m.detach(), (1.0 - beta1) * g
            near_zero = ((a + b).abs() <= 1e-6 * (a.abs() + b.abs())) & ((a.abs() + b.abs()) > 0)
            ambiguous[o:o + n] += near_zero.long()
        opt.step()

    out_p = torch.zeros_like(flat0)
    out_m = torch.zeros_like(flat0)
    for p, o, n in zip(params, offsets, numels):
        out_p[o:o + n] = p.detach()
        out_m[o:o + n] = opt.state[p]["exp_avg"]
    write_tensor_file(args.output, [("params", out_p), ("exp_avg", out_m), ("ambiguous", ambiguous)])


if __name__ == "__main__":
    main()
