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


def safetensors_bytes(tensors, metadata=None):
    """tensors: [(name, dtype, shape, raw bytes)] in order; the layout safetensors writes."""
    header, off, data = {}, 0, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        data += raw
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)  # safetensors pads the header to 8 bytes
    return struct.pack("<Q", len(h)) + h + data


def safetensors():
    f32 = np.arange(6, dtype="<f4").reshape(2, 3) / 7
    bf16 = (np.arange(4, dtype="<f4").view("<u4") >> 16).astype("<u2")
    f16 = np.array([1.5, -2.0, 65504.0, 6e-8], dtype="<f2")
    one = safetensors_bytes([("transformer.wte.weight", "F32", [2, 3], f32.tobytes()),
                             ("transformer.ln_f.bias", "BF16", [4], bf16.tobytes()),
                             ("lm_head.weight", "F16", [2, 2], f16.tobytes()),
                             ("empty", "F32", [0, 5], b"")], {"format": "pt"})
    put("fuzz_safetensors", "single.safetensors", one)
    a = safetensors_bytes([("model.embed_tokens.weight", "BF16", [2, 2], bf16.tobytes())],
                          {"format": "pt"})
    b = safetensors_bytes([("model.norm.weight", "F32", [3], f32.tobytes()[:12]),
                           ("lm_head.weight", "F16", [4], f16.tobytes())])
    index = json.dumps({"metadata": {"total_size": 8 + 12 + 8},
                        "weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors",
                                       "model.norm.weight": "model-00002-of-00002.safetensors",
                                       "lm_head.weight": "model-00002-of-00002.safetensors"}},
                       indent=2).encode()
    put("fuzz_safetensors", "sharded.pair", index + SEP + a + SEP + b)


def model_configs():
    # fuzz_model_config: first byte even = HF config.json (byte >> 1 picks --seq-length), odd =
    # a trident checkpoint's "config".
    gpt2 = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": 100,
            "n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 64, "n_inner": None,
            "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
            "initializer_range": 0.02, "tie_word_embeddings": True, "torch_dtype": "float32"}
    bloom = {"architectures": ["BloomForCausalLM"], "model_type": "bloom", "vocab_size": 250,
             "hidden_size": 64, "n_layer": 2, "n_head": 8, "layer_norm_epsilon": 1e-5,
             "apply_residual_connection_post_layernorm": False, "torch_dtype": "bfloat16"}
    llama = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128,
             "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "intermediate_size": 172, "max_position_embeddings": 128,
             "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "hidden_act": "silu",
             "tie_word_embeddings": False, "attention_bias": False, "head_dim": 16,
             "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                              "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
             "torch_dtype": "float16"}
    put("fuzz_model_config", "hf_gpt2.json", b"\x00" + json.dumps(gpt2, indent=2).encode())
    put("fuzz_model_config", "hf_bloom.json", b"\x02" + json.dumps(bloom, indent=2).encode())
    put("fuzz_model_config", "hf_llama.json", b"\x04" + json.dumps(llama, indent=2).encode())
    trident = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
               "ffn_hidden_size": 256, "seq_length": 32, "max_position_embeddings": 64,
               "vocab_size": 100, "make_vocab_size_divisible_by": 128,
               "layernorm_epsilon": 1e-5, "init_method_std": 0.02,
               "position_embedding_type": "rope", "normalization": "RMSNorm", "swiglu": True,
               "num_query_groups": 2, "untie_embeddings_and_output_weights": True,
               "add_bias_linear": False, "rotary_base": 10000.0, "use_rope_scaling": True,
               "rope_scaling_factor": 8.0, "rope_low_freq_factor": 1.0,
               "rope_high_freq_factor": 4.0, "rope_original_max_position_embeddings": 32}
    put("fuzz_model_config", "trident_llama.json", b"\x01" + json.dumps(trident).encode())


def deepspeed_configs():
    # fuzz_deepspeed_config: first byte = world size (bits 0-1) and the flags given (bits 2-7).
    zero1 = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "steps_per_print": 10,
             "gradient_clipping": 1.0, "zero_optimization": {"stage": 1,
                                                             "reduce_bucket_size": 5e8},
             "bf16": {"enabled": True}, "wall_clock_breakdown": False}
    fp16 = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 4,
            "fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 12,
                     "loss_scale_window": 500, "hysteresis": 2, "min_loss_scale": 1},
            "optimizer": {"type": "Adam", "params": {"lr": 3e-4, "betas": [0.9, 0.95],
                                                     "eps": 1e-8, "weight_decay": 0.1}},
            "zero_optimization": {"stage": 2, "overlap_comm": True,
                                  "contiguous_gradients": True}}
    offload = {"train_batch_size": 16, "gradient_accumulation_steps": 2,
               "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme",
                                                                       "nvme_path": "/tmp/nvme",
                                                                       "pin_memory": True},
                                     "offload_param": {"device": "cpu"},
                                     "stage3_prefetch_bucket_size": 1e7}}
    put("fuzz_deepspeed_config", "zero1_bf16.json", b"\x01" + json.dumps(zero1, indent=2).encode())
    put("fuzz_deepspeed_config", "fp16_adam.json", b"\x00" + json.dumps(fp16, indent=2).encode())
    put("fuzz_deepspeed_config", "zero3_offload.json", b"\x02" + json.dumps(offload).encode())


if __name__ == "__main__":
    indexed()
    npys()
    tokenizers()
    sentencepiece()
    configs()
    safetensors()
    model_configs()
    deepspeed_configs()
    print("seeds written under", ROOT, file=sys.stderr)
