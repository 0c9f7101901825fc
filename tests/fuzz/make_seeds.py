#!/usr/bin/python3
"""Writes the seed corpora of tests/fuzz/corpus/<target>/ (small valid files of every format).

Run from the repository root: /usr/bin/python3 tests/fuzz/make_seeds.py. The GPTDataset-cache and
checkpoint seeds come from the fuzz targets themselves (TRIDENT_FUZZ_DUMP_SEED, see
scripts/test-sanitizers --seeds), the SentencePiece model from spm_train. Deterministic.
"""
import io
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

SEP = b"\n@@FILE@@\n"
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def put(target, name, data):
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def idx_bytes(lengths, dtype_code, item, docs):
    out = b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + bytes([dtype_code])
    out += struct.pack("<QQ", len(lengths), len(docs))
    out += struct.pack("<%di" % len(lengths), *lengths)
    ptr, ptrs = 0, []
    for n in lengths:
        ptrs.append(ptr)
        ptr += n * item
    out += struct.pack("<%dq" % len(ptrs), *ptrs)
    out += struct.pack("<%dq" % len(docs), *docs)
    return out


def indexed():
    # fuzz_idx: the .bin is fixed at 4096 bytes, so these describe 4096 bytes.
    put("fuzz_idx", "u16_3docs.idx", idx_bytes([1000, 24, 1000, 24], 8, 2, [0, 1, 2, 4]))
    put("fuzz_idx", "u8_1doc.idx", idx_bytes([4096], 1, 1, [0, 1]))
    put("fuzz_idx", "i32_2docs.idx", idx_bytes([512, 512], 4, 4, [0, 1, 2]))
    put("fuzz_idx", "i64_one.idx", idx_bytes([512], 5, 8, [0, 1]))
    # fuzz_idx_bin: .idx + separator + .bin
    toks = np.arange(40, dtype=np.uint16) * 7
    put("fuzz_idx_bin", "u16.pair",
        idx_bytes([5, 10, 25], 8, 2, [0, 2, 3]) + SEP + toks.tobytes())
    put("fuzz_idx_bin", "i32.pair",
        idx_bytes([3, 1], 4, 4, [0, 1, 2]) + SEP + np.array([1, 70000, 3, 4], "<i4").tobytes())
    put("fuzz_idx_bin", "empty_docs.pair", idx_bytes([], 8, 2, [0]) + SEP)


def npy(a):
    b = io.BytesIO()
    np.save(b, a)
    return b.getvalue()


def npys():
    put("fuzz_npy", "i32_1d.npy", npy(np.arange(10, dtype="<i4")))
    put("fuzz_npy", "i64_2d.npy", npy(np.arange(12, dtype="<i8").reshape(6, 2)))
    put("fuzz_npy", "u4_1d.npy", npy(np.arange(7, dtype="<u4")[::-1].copy()))
    put("fuzz_npy", "i2_1d.npy", npy(np.array([0, 1, 1, 0], dtype="<i2")))
    put("fuzz_npy", "empty.npy", npy(np.zeros((0, 2), dtype="<i4")))


def byte_tokens():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def small_bpe():
    bt = byte_tokens()
    vocab = {bt[b]: b for b in range(256)}
    merges = []
    for a in " thea":
        for b in "thean":
            l, r = bt[ord(a)], bt[ord(b)]
            if l + r not in vocab:
                vocab[l + r] = len(vocab)
            merges.append((l, r))
    l, r = bt[ord(" ")] + bt[ord("t")], bt[ord("h")] + bt[ord("e")]
    vocab[l + r] = len(vocab)
    merges.append((l, r))
    vocab["<|endoftext|>"] = len(vocab)
    return vocab, merges


TEXTS = [b"the heat in the sea", "héllo wörld, 東京 \U0001F600!".encode(), b"a\xff\xfeb\xc3 \r\n\tx"]


def tokenizers():
    vocab, merges = small_bpe()
    vj = json.dumps(vocab, ensure_ascii=False).encode()
    mt = ("#version: 0.2\n" + "".join(f"{l} {r}\n" for l, r in merges)).encode()
    for i, t in enumerate(TEXTS):
        put("fuzz_gpt2_bpe", f"small_{i}", vj + SEP + mt + SEP + t)
    eot = vocab["<|endoftext|>"]
    base = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {"id": eot, "content": "<|endoftext|>", "single_word": False, "lstrip": False,
             "rstrip": False, "normalized": False, "special": True},
        ],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                          "use_regex": True},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
                           "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": "", "end_of_word_suffix": "",
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": [f"{l} {r}" for l, r in merges]},
    }
    put("fuzz_hf_tokenizer", "gpt2_style", json.dumps(base).encode() + SEP + TEXTS[0])
    bloom = json.loads(json.dumps(base))
    bloom["added_tokens"].append({"id": eot + 1, "content": "<pad>", "single_word": False,
                                  "lstrip": True, "rstrip": False, "normalized": True,
                                  "special": True})
    bloom["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": " ?[^(\\s|[.,!?…。，、।۔،])]+"},
         "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
    bloom["post_processor"] = {"type": "TemplateProcessing",
                               "single": [{"SpecialToken": {"id": "<pad>", "type_id": 0}},
                                          {"Sequence": {"id": "A", "type_id": 0}},
                                          {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}],
                               "pair": [],
                               "special_tokens": {
                                   "<pad>": {"id": "<pad>", "ids": [eot + 1], "tokens": ["<pad>"]},
                                   "<|endoftext|>": {"id": "<|endoftext|>", "ids": [eot],
                                                     "tokens": ["<|endoftext|>"]}}}
    bloom["model"]["merges"] = [[l, r] for l, r in merges]
    put("fuzz_hf_tokenizer", "bloom_style", json.dumps(bloom).encode() + SEP + TEXTS[1] +
        b" <pad> the<|endoftext|>")
    split = json.loads(json.dumps(base))
    split["model"]["ignore_merges"] = True
    split["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"String": "\n"}, "behavior": "Removed", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}]}
    put("fuzz_hf_tokenizer", "split_removed", json.dumps(split).encode() + SEP + TEXTS[2])
    for i, t in enumerate(TEXTS):
        put("fuzz_text", f"text_{i}", t)


def sentencepiece():
    with tempfile.TemporaryDirectory() as d:
        text = os.path.join(d, "t.txt")
        with open(text, "w") as f:
            for i in range(200):
                f.write(f"the quick brown fox {i} jumps over the lazy dog. héllo wörld\n")
        for kind, size in (("unigram", 60), ("bpe", 80)):
            prefix = os.path.join(d, kind)
            subprocess.run(["spm_train", f"--input={text}", f"--model_prefix={prefix}",
                            f"--vocab_size={size}", f"--model_type={kind}",
                            "--num_threads=1", "--minloglevel=2",
                            "--normalization_rule_name=identity"], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            with open(prefix + ".model", "rb") as f:
                put("fuzz_sentencepiece", f"{kind}.model", f.read())


def configs():
    put("fuzz_train_config", "gpt.toml", b"""# a small GPT run
num-layers = 2
hidden-size = 64
num-attention-heads = 4
seq-length = 32
micro-batch-size = 2
global-batch-size = 8
train-iters = 10
lr = 0.0003
min-lr = 3e-5
lr-decay-style = "cosine"
lr-warmup-iters = 2
weight-decay = 0.1
data-path = ["data/corpus_text_document"]
split = "98,1,1"
tokenizer-type = "GPT2BPETokenizer"
vocab-file = "vocab.json"
merge-file = "merges.txt"
save-interval = 5
save = "ckpt"
""")
    put("fuzz_train_config", "bloom_tp.toml", b"""model = "bloom"
num-layers = 4
hidden-size = 64
num-attention-heads = 8
seq-length = 16
bf16 = true
tensor-model-parallel-size = 2
pipeline-model-parallel-size = 2
zero-stage = 1
micro-batch-size = 1
global-batch-size = 4
recompute-granularity = "full"
recompute-method = "block"
data-path = ["0.3", "a_text_document", "0.7", "b_text_document"]
tokenizer-type = "NullTokenizer"
vocab-size = 100
""")
    put("fuzz_train_args", "basic.args", b"\x00" + b"\x00".join([
        b"--num-layers", b"2", b"--hidden-size", b"64", b"--num-attention-heads", b"4",
        b"--seq-length", b"32", b"--micro-batch-size", b"2", b"--global-batch-size", b"8",
        b"--data-path", b"corpus", b"--tokenizer-type", b"NullTokenizer", b"--vocab-size", b"64"]))
    put("fuzz_train_args", "parallel.args", b"\x03" + b"\x00".join([
        b"--tensor-model-parallel-size", b"2", b"--pipeline-model-parallel-size", b"2",
        b"--num-layers", b"4", b"--pipeline-schedule", b"interleaved",
        b"--num-layers-per-virtual-pipeline-stage", b"1", b"--fp16", b"--loss-scale", b"0",
        b"--rampup-batch-size", b"2", b"2", b"100", b"--global-batch-size", b"8",
        b"--micro-batch-size", b"1", b"--split", b"969,30,1", b"--data-path", b"x"]))


if __name__ == "__main__":
    indexed()
    npys()
    tokenizers()
    sentencepiece()
    configs()
    print("seeds written under", ROOT, file=sys.stderr)
