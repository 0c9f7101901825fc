# A tiny random transformers model saved with save_pretrained (safetensors, no tokenizer), for
# tests that start from a Hugging Face directory (tests/model/hf_mixtral_test.cc: import, fine-tune,
# export). The model is hf_roundtrip.py's (norms and biases away from their init).
"""--variant gpt2|bloom|llama|mixtral|qwen2_moe --vocab V --dtype float32 --out DIR."""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_roundtrip import model  # noqa: E402


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--variant", required=True,
                    choices=["gpt2", "bloom", "llama", "mixtral", "qwen2_moe"])
    ap.add_argument("--vocab", type=int, required=True)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    torch.manual_seed(11)
    m = model(a.variant, a.vocab, a.dtype)
    m.save_pretrained(a.out, safe_serialization=True)
    print(f"{type(m).__name__} saved in {a.out}")


if __name__ == "__main__":
    main(sys.argv[1:])
