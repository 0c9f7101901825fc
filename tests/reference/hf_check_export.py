# What transformers computes with a model directory written by `trident convert --to-hf`, for
# tests/dist/equivalence_test.cc (Llama trained in TP2 x PP2, exported): loads it with
# AutoModelForCausalLM.from_pretrained as it is, writes the logits of a prompt (float64) and the
# ids of a greedy generate() (float32, as loaded) for the C++ side to compare with trident's.
"""--model DIR --prompt '5 6 7' --max-new-tokens N --output OUT.trtf."""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tensor_file import write_tensor_file  # noqa: E402


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompt", required=True)
    ap.add_argument("--max-new-tokens", type=int, default=50)
    ap.add_argument("--output", required=True)
    a = ap.parse_args(argv)
    from transformers import AutoModelForCausalLM
    m = AutoModelForCausalLM.from_pretrained(a.model).eval()
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
