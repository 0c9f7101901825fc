#!/usr/bin/env python3
"""Reference token ids from Hugging Face `tokenizers` for trident's tokenizer tests.

Each input file is read as bytes, decoded as UTF-8 with errors="replace" (invalid sequences become
U+FFFD, the Unicode "maximal subpart" rule), encoded whole, and its ids are written to
OUT_DIR/<i>.ids as little-endian int32 (and, with --write-text, the repaired text to <i>.txt). OUT_DIR/meta.json records the vocab size and versions.

  hf_tokenize.py --vocab V --merges M --out-dir D FILE...     GPT-2 BPE from vocab.json + merges.txt
  hf_tokenize.py --tokenizer-json T --out-dir D FILE...       a tokenizer.json
"""
import argparse
import array
import json
import os
import sys

import tokenizers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers


def byte_decoder():
    """Inverse of GPT-2's bytes_to_unicode: byte-level character -> byte."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) +
                 list(range(0xAE, 0x100)))
    chars, n = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + n)] = b
            n += 1
    return chars


def write_pieces(text, path):
    decoder = byte_decoder()
    pre = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    with open(path, "wb") as f:
        for piece, _ in pre.pre_tokenize_str(text):
            raw = bytes(decoder[c] for c in piece)
            f.write(len(raw).to_bytes(4, "little") + raw)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab")
    ap.add_argument("--merges")
    ap.add_argument("--tokenizer-json")
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--pieces", action="store_true",
                    help="also write OUT_DIR/<i>.pieces: the GPT-2 pre-tokenizer pieces of the "
                         "text (HF ByteLevel pre-tokenizer), each as int32 length + UTF-8 bytes")
    ap.add_argument("--write-text", action="store_true",
                    help="also write OUT_DIR/<i>.txt: the decoded (repaired) text as UTF-8")
    ap.add_argument("files", nargs="+")
    args = ap.parse_args()

    if args.tokenizer_json:
        tok = Tokenizer.from_file(args.tokenizer_json)
    else:
        # What Megatron's GPT2BPETokenizer does: byte-level BPE, GPT-2 regex, no special tokens.
        tok = Tokenizer(models.BPE.from_file(args.vocab, args.merges))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.decoder = decoders.ByteLevel()

    os.makedirs(args.out_dir, exist_ok=True)
    for i, path in enumerate(args.files):
        with open(path, "rb") as f:
            text = f.read().decode("utf-8", errors="replace")
        if args.write_text:
            with open(os.path.join(args.out_dir, f"{i}.txt"), "wb") as f:
                f.write(text.encode("utf-8"))
        if args.pieces:
            write_pieces(text, os.path.join(args.out_dir, f"{i}.pieces"))
        ids = array.array("i", tok.encode(text).ids)
        if sys.byteorder != "little":
            ids.byteswap()
        with open(os.path.join(args.out_dir, f"{i}.ids"), "wb") as f:
            ids.tofile(f)
    with open(os.path.join(args.out_dir, "meta.json"), "w") as f:
        json.dump({"vocab_size": tok.get_vocab_size(with_added_tokens=True),
                   "tokenizers_version": tokenizers.__version__}, f)


if __name__ == "__main__":
    main()
