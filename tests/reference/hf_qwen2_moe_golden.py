# The transformers side of tests/model/hf_qwen2_moe_test.cc (HfQwen2MoeGolden): a tiny random
# Qwen2MoeForCausalLM (hf_roundtrip.py's, 2 layers: hidden 32, 4 heads in 2 key/value groups,
# biases on q, k, v, 4 experts of 16 with top 2, a gated shared expert of 24) is saved with
# save_pretrained (float32 safetensors) for `trident convert --from-hf`, then run in float64 on a
# batch of random tokens: its logits, its own loss (labels shifted inside the model), every
# parameter's gradient (transformers' names) and each layer's router logits and chosen experts
# are written to a tensor file. router_aux_loss_coef 0: the loss is the language model's alone
# (transformers' load-balancing loss pools all layers; Megatron-Core's is per layer).
# --dense: a Qwen2 instead (Qwen2ForCausalLM: Llama with q, k, v biases, intermediate 48).
# --layers, --sparse-step, --mlp-only: dense layers among the sparse ones (decoder_sparse_step,
# mlp_only_layers; the dense MLP of intermediate_size); the router outputs are written under the
# layer's own index.
"""--out DIR --output OUT.trtf [--norm-topk-prob] [--layers N] [--sparse-step S]
[--mlp-only I,J] [--dense]."""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_roundtrip import model  # noqa: E402
from tensor_file import write_tensor_file  # noqa: E402

VOCAB, BATCH, SEQ = 250, 3, 12


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--norm-topk-prob", action="store_true")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--sparse-step", type=int, default=1)
    ap.add_argument("--mlp-only", default="")
    ap.add_argument("--dense", action="store_true", help="a Qwen2 (Qwen2ForCausalLM), no experts")
    a = ap.parse_args(argv)
    mlp_only = [int(i) for i in a.mlp_only.split(",") if i]
    torch.manual_seed(13)
    # std 0.2: large enough that every layer, bias and expert matters for the output.
    if a.dense:
        m = model("qwen2", VOCAB, "float32", layers=a.layers, std=0.2)
        sparse = []
    else:
        m = model("qwen2_moe", VOCAB, "float32", layers=a.layers, std=0.2, aux_coef=0.0,
                  norm_topk_prob=a.norm_topk_prob, sparse_step=a.sparse_step, mlp_only=mlp_only)
        sparse = [i for i in range(a.layers)
                  if i not in mlp_only and (i + 1) % a.sparse_step == 0]
    m.config._attn_implementation = "eager"
    m.save_pretrained(a.out, safe_serialization=True)
    m = m.double()
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ))
    if a.dense:
        out = m(input_ids=tokens, labels=tokens)
    else:
        out = m(input_ids=tokens, labels=tokens, output_router_logits=True)
    out.loss.backward()
    k = getattr(m.config, "num_experts_per_tok", 0)
    result = [("tokens", tokens.to(torch.int32)),
              ("logits", out.logits.detach().reshape(-1, VOCAB)),
              ("loss", out.loss.detach().reshape(1))]
    router_logits = out.router_logits if sparse else ()
    assert len(router_logits) == len(sparse), (len(router_logits), sparse)
    for layer, logits in zip(sparse, router_logits):
        chosen = torch.topk(torch.softmax(logits, dim=-1), k, dim=-1).indices
        result += [(f"router_logits.{layer}", logits.detach().contiguous()),
                   (f"router_experts.{layer}", chosen.to(torch.int64).contiguous())]
    for name, p in m.named_parameters():
        result.append(("grad." + name, p.grad.detach().contiguous()))
    write_tensor_file(a.output, result)
    print(f"{type(m).__name__} saved in {a.out}; sparse layers {sparse}; "
          f"loss {float(out.loss):.6f}")


if __name__ == "__main__":
    main(sys.argv[1:])
