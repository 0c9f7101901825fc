# What transformers computes with a model directory written by `trident convert --to-hf`, for
# tests/dist/equivalence_test.cc (Llama trained in TP2 x PP2, exported): loads it with
# AutoModelForCausalLM.from_pretrained as it is, writes the logits of a prompt (float64) and the
# ids of a greedy generate() (float32, as loaded) for the C++ side to compare with trident's.
# --expect-class checks the class transformers loads; --trident-params writes every weight as
# loaded, in trident's names and layouts (hf_reference.py's map, independent of trident's own,
# padded vocabulary rows zero), for tests/model/hf_mixtral_test.cc to compare bitwise.
"""--model DIR --prompt '5 6 7' --max-new-tokens N --output OUT.trtf
[--expect-class NAME] [--trident-params OUT.trtf --vocab-padded VP]."""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_reference import llama_grads_back, weight_map  # noqa: E402
from tensor_file import write_tensor_file  # noqa: E402


def trident_params(m, vocab_padded):
    """Every weight of a loaded Llama / Mixtral in trident's names and layouts."""
    cfg = m.config
    c = {"hidden": cfg.hidden_size, "num_heads": cfg.num_attention_heads,
         "num_layers": cfg.num_hidden_layers, "vocab": cfg.vocab_size,
         "vocab_padded": vocab_padded, "query_groups": cfg.num_key_value_heads,
         "num_experts": getattr(cfg, "num_local_experts", 0)}
    variant = {"llama": "llama", "mixtral": "mixtral"}[cfg.model_type]
    hf = {n: p.detach() for n, p in m.named_parameters()}
    out, done = [], set()
    for tname, hname, _, from_hf in weight_map(variant, c):
        if tname in done:
            continue
        done.add(tname)
        w = from_hf(hf[hname]) if from_hf else llama_grads_back(c, hf, tname)
        out.append((tname, w.contiguous()))
    return out


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompt", required=True)
    ap.add_argument("--max-new-tokens", type=int, default=50)
    ap.add_argument("--output", required=True)
    ap.add_argument("--expect-class", default="")
    ap.add_argument("--trident-params", default="")
    ap.add_argument("--vocab-padded", type=int, default=0)
    a = ap.parse_args(argv)
    from transformers import AutoModelForCausalLM
    m = AutoModelForCausalLM.from_pretrained(a.model).eval()
    if a.expect_class and type(m).__name__ != a.expect_class:
        raise SystemExit(f"{a.model} loads as {type(m).__name__}, not {a.expect_class}")
    if a.trident_params:  # as loaded (the file's dtype), before anything converts the model
        write_tensor_file(a.trident_params, trident_params(m, a.vocab_padded))
    ids = torch.tensor([[int(t) for t in a.prompt.split()]])
    with torch.no_grad():
        # synced_gpus given: otherwise generate() imports torch.distributed.fsdp, which Debian's
        # torch 1.13 cannot import under Python 3.11 (a dataclass with a mutable default).
        gen = m.generate(ids, max_new_tokens=a.max_new_tokens, min_new_tokens=a.max_new_tokens,
                         do_sample=False, num_beams=1, pad_token_id=0, synced_gpus=False)
        logits = m.double()(ids).logits[0]
    print(f"{type(m).__name__}: generated {gen.shape[1] - ids.shape[1]} tokens")
    write_tensor_file(a.output, [("logits", logits.contiguous()),
                                 ("generated", gen[0, ids.shape[1]:].to(torch.int64))])


if __name__ == "__main__":
    main(sys.argv[1:])
