# The mixture-of-experts reference for tests/model/moe_golden_test.cc: transformers' own sparse MoE
# blocks (pinned in scripts/install-python-deps, venv $TRIDENT_HF_PYTHON), in float64, with
# trident's dumped weights copied in:
#   mixtral, mixtral_top1: MixtralSparseMoeBlock (softmax over all experts, top-k, renormalised)
#   qwen2:                 Qwen2MoeSparseMoeBlock with norm_topk_prob=False (the top-k of the
#                          full softmax, not renormalised: Megatron's --moe-router-pre-softmax),
#                          with its shared expert (SwiGLU, shared_sizes[0] wide) and sigmoid gate
# The loss whose gradients are compared: sum(out * d_out) + aux_coeff * aux + z_coeff * z, with
# aux = transformers' load_balancing_loss_func / top_k (Megatron's Switch loss: transformers'
# counts each of the k choices as a fraction of the tokens, Megatron divides by k) and
# z = mean over tokens of logsumexp(router logits)^2 (ST-MoE's router z-loss).
# Usage: moe_reference.py --inputs IN.trtf --output OUT.trtf --variant NAME
"""Runs transformers' MoE block on the dumped weights and writes outputs and gradients."""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tensor_file import read_tensor_file, write_tensor_file  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--inputs", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--variant", required=True, choices=["mixtral", "mixtral_top1", "qwen2"])
    args = ap.parse_args()
    t = read_tensor_file(args.inputs)
    B, T, C, E, K, F = (int(v) for v in t["sizes"].tolist())
    aux_coeff, z_coeff = (float(v) for v in t["coeffs"].tolist())
    router, fc, fc2 = t["router"].double(), t["fc"].double(), t["fc2"].double()

    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func
    if args.variant.startswith("mixtral"):
        from transformers import MixtralConfig
        from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock
        cfg = MixtralConfig(hidden_size=C, intermediate_size=F, num_local_experts=E,
                            num_experts_per_tok=K, router_jitter_noise=0.0)
        block = MixtralSparseMoeBlock(cfg).double()
        with torch.no_grad():
            block.gate.weight.copy_(router)
            for e in range(E):
                block.experts[e].w1.weight.copy_(fc[e, 0])
                block.experts[e].w3.weight.copy_(fc[e, 1])
                block.experts[e].w2.weight.copy_(fc2[e])
        gate_of = lambda e: block.experts[e].w1.weight  # noqa: E731
        up_of = lambda e: block.experts[e].w3.weight  # noqa: E731
        down_of = lambda e: block.experts[e].w2.weight  # noqa: E731
    else:
        from transformers import Qwen2MoeConfig
        from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeSparseMoeBlock
        S = int(t["shared_sizes"].tolist()[0])
        cfg = Qwen2MoeConfig(hidden_size=C, moe_intermediate_size=F,
                             shared_expert_intermediate_size=S, num_experts=E,
                             num_experts_per_tok=K, norm_topk_prob=False)
        block = Qwen2MoeSparseMoeBlock(cfg).double()
        with torch.no_grad():
            block.gate.weight.copy_(router)
            for e in range(E):
                block.experts[e].gate_proj.weight.copy_(fc[e, 0])
                block.experts[e].up_proj.weight.copy_(fc[e, 1])
                block.experts[e].down_proj.weight.copy_(fc2[e])
            sfc, sfc2 = t["shared_fc"].double(), t["shared_fc2"].double()
            block.shared_expert.gate_proj.weight.copy_(sfc[0])
            block.shared_expert.up_proj.weight.copy_(sfc[1])
            block.shared_expert.down_proj.weight.copy_(sfc2)
            block.shared_expert_gate.weight.copy_(t["shared_gate"].double())
        gate_of = lambda e: block.experts[e].gate_proj.weight  # noqa: E731
        up_of = lambda e: block.experts[e].up_proj.weight  # noqa: E731
        down_of = lambda e: block.experts[e].down_proj.weight  # noqa: E731
    block.train()

    x = t["x"].double().view(B, T, C).requires_grad_(True)
    out, logits = block(x)
    aux = load_balancing_loss_func((logits,), E, K) / K
    z = torch.logsumexp(logits, dim=-1).square().mean()
    loss = (out.reshape(B * T, C) * t["d_out"].double()).sum() + aux_coeff * aux + z_coeff * z
    loss.backward()

    def grad(w):
        return w.grad if w.grad is not None else torch.zeros_like(w)

    d_fc = torch.stack([torch.stack([grad(gate_of(e)), grad(up_of(e))]) for e in range(E)])
    d_fc2 = torch.stack([grad(down_of(e)) for e in range(E)])
    extra = []
    if args.variant == "qwen2":
        se = block.shared_expert
        extra = [("d_shared_fc", torch.stack([grad(se.gate_proj.weight), grad(se.up_proj.weight)])),
                 ("d_shared_fc2", grad(se.down_proj.weight)),
                 ("d_shared_gate", grad(block.shared_expert_gate.weight))]
    write_tensor_file(args.output, extra + [
        ("out", out.detach().reshape(B * T, C)),
        ("logits", logits.detach()),
        ("d_x", x.grad.reshape(B * T, C)),
        ("d_router", block.gate.weight.grad),
        ("d_fc", d_fc),
        ("d_fc2", d_fc2),
        ("aux", (aux_coeff * aux).detach().reshape(1)),
        ("z", (z_coeff * z).detach().reshape(1)),
    ])


if __name__ == "__main__":
    main()
