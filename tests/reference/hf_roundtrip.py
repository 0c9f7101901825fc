# Round trip through trident of a transformers model directory, for `trident convert`:
#   transformers builds a tiny random GPT-2 / BLOOM / Llama / Mixtral / Qwen2-MoE / Qwen2 from its
#   config
#   and saves it with save_pretrained (safetensors, sharded, in the dtype asked for) with a
#   byte-level BPE tokenizer;
#   trident convert --from-hf imports it into a checkpoint of a TP x PP x DP / ZeRO layout;
#   trident convert --to-hf exports that checkpoint again (sharded).
# Checks: every tensor of the export is bitwise identical to the original (names, dtypes, shapes,
# bytes), the export loads with AutoModelForCausalLM / AutoTokenizer.from_pretrained as it is and
# gives the original model's logits exactly, and the tokenizer encodes the same ids.
"""--trident PATH --work DIR --variant gpt2|bloom|llama|mixtral|qwen2_moe|qwen2_moe_sparse|qwen2
--dtype float32|bfloat16|float16."""

import argparse
import json
import os
import shutil
import subprocess
import sys

import torch


def tokenizer(work):
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast
    texts = ["the quick brown fox jumps over the lazy dog %d times" % i for i in range(50)]
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(texts, vocab_size=300, min_frequency=1,
                            special_tokens=["<|endoftext|>"])
    return PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, bos_token="<|endoftext|>",
                                   eos_token="<|endoftext|>", unk_token="<|endoftext|>")


def model(variant, vocab, dtype, layers=4, std=0.02, aux_coef=0.02, norm_topk_prob=False,
          sparse_step=1, mlp_only=()):
    import transformers as tf
    if variant == "gpt2":
        cfg = tf.GPT2Config(vocab_size=vocab, n_positions=32, n_embd=32, n_layer=3, n_head=4,
                            n_inner=48)
        m = tf.GPT2LMHeadModel(cfg)
    elif variant == "bloom":
        cfg = tf.BloomConfig(vocab_size=vocab, hidden_size=32, n_layer=3, n_head=4)
        m = tf.BloomForCausalLM(cfg)
    elif variant == "mixtral":
        cfg = tf.MixtralConfig(vocab_size=vocab, hidden_size=32, intermediate_size=40,
                               num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                               max_position_embeddings=64, rope_theta=5000.0,
                               num_local_experts=4, num_experts_per_tok=2,
                               router_aux_loss_coef=0.02, tie_word_embeddings=False)
        m = tf.MixtralForCausalLM(cfg)
    elif variant in ("qwen2_moe", "qwen2_moe_sparse"):
        # Biases on q, k, v alone; 4 experts of 16 (top 2) and a gated shared expert of 24 in
        # every sparse layer; intermediate_size is the dense layers' MLP (none unless
        # decoder_sparse_step > 1 or mlp_only_layers). qwen2_moe_sparse: of 4 layers, step 2
        # makes 1 and 3 sparse, mlp_only_layers [1] leaves 3 (trident's --moe-layer-freq
        # [0,0,0,1], exported as decoder_sparse_step 4).
        if variant == "qwen2_moe_sparse":
            sparse_step, mlp_only = 2, (1,)
        cfg = tf.Qwen2MoeConfig(vocab_size=vocab, hidden_size=32, intermediate_size=40,
                                num_hidden_layers=layers, num_attention_heads=4,
                                num_key_value_heads=2, max_position_embeddings=64,
                                rope_theta=5000.0, rms_norm_eps=1e-6, num_experts=4,
                                num_experts_per_tok=2, moe_intermediate_size=16,
                                shared_expert_intermediate_size=24,
                                norm_topk_prob=norm_topk_prob, decoder_sparse_step=sparse_step,
                                mlp_only_layers=list(mlp_only),
                                router_aux_loss_coef=aux_coef, initializer_range=std,
                                tie_word_embeddings=False)
        m = tf.Qwen2MoeForCausalLM(cfg)
    elif variant == "qwen2":
        # Llama with biases on q, k and v alone.
        cfg = tf.Qwen2Config(vocab_size=vocab, hidden_size=32, intermediate_size=48,
                             num_hidden_layers=layers, num_attention_heads=4,
                             num_key_value_heads=2, max_position_embeddings=64, rope_theta=5000.0,
                             rms_norm_eps=1e-6, initializer_range=std, tie_word_embeddings=False)
        m = tf.Qwen2ForCausalLM(cfg)
    else:
        cfg = tf.LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=48,
                             num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                             max_position_embeddings=64, rope_theta=5000.0,
                             rope_scaling={"rope_type": "llama3", "factor": 4.0,
                                           "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                           "original_max_position_embeddings": 16},
                             tie_word_embeddings=False)
        m = tf.LlamaForCausalLM(cfg)
    with torch.no_grad():  # biases and norms away from their 0/1 init, so every tensor matters
        for p in m.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return m.to(getattr(torch, dtype)).eval()


def run(cmd):
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--trident", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--variant", required=True,
                    choices=["gpt2", "bloom", "llama", "mixtral", "qwen2_moe",
                             "qwen2_moe_sparse", "qwen2"])
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--layout", default="--tensor-model-parallel-size 2 "
                    "--pipeline-model-parallel-size 2")
    a = ap.parse_args(argv)
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, AutoTokenizer
    torch.manual_seed(7)
    shutil.rmtree(a.work, ignore_errors=True)
    src, ckpt, out = (os.path.join(a.work, d) for d in ("hf_in", "ckpt", "hf_out"))
    tok = tokenizer(a.work)
    m = model(a.variant, len(tok), a.dtype)
    m.save_pretrained(src, max_shard_size="20KB", safe_serialization=True)
    tok.save_pretrained(src)
    assert os.path.exists(os.path.join(src, "model.safetensors.index.json")), "not sharded"
    run([a.trident, "convert", "--from-hf", src, "--save", ckpt] + a.layout.split())
    run([a.trident, "convert", "--load", ckpt, "--to-hf", out, "--max-shard-size", "30000"])

    def tensors(d):
        files = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
        t = {}
        for f in files:
            with safe_open(os.path.join(d, f), framework="pt") as s:
                for k in s.keys():
                    t[k] = s.get_tensor(k)
        return t, files

    before, fin = tensors(src)
    after, fout = tensors(out)
    assert len(fout) > 1 and os.path.exists(os.path.join(out, "model.safetensors.index.json")), \
        f"export not sharded: {fout}"
    assert set(before) == set(after), f"names differ: {set(before) ^ set(after)}"
    for k in before:
        x, y = before[k], after[k]
        assert x.dtype == y.dtype and x.shape == y.shape, f"{k}: {x.dtype} {x.shape} vs " \
            f"{y.dtype} {y.shape}"
        bits = {torch.float32: torch.int32, torch.bfloat16: torch.int16,
                torch.float16: torch.int16}[x.dtype]
        assert torch.equal(x.view(bits), y.view(bits)), f"{k}: not bitwise identical"
    print(f"{len(before)} tensors bitwise identical ({a.dtype}; {len(fin)} shards in, "
          f"{len(fout)} out)")
    with open(os.path.join(ckpt, "latest_checkpointed_iteration.txt")) as f:
        it = int(f.read())
    manifest = json.load(open(os.path.join(ckpt, "iter_%07d" % it, "manifest.json")))
    print("trident layout:", manifest["layout"])
    # Both directories loaded the same way (CPU torch has no FP16 LayerNorm: FP16 runs in FP32).
    dtype = torch.float32 if a.dtype == "float16" else "auto"
    m1 = AutoModelForCausalLM.from_pretrained(src, torch_dtype=dtype).eval()
    m2 = AutoModelForCausalLM.from_pretrained(out, torch_dtype=dtype).eval()
    tok2 = AutoTokenizer.from_pretrained(out)
    text = "the lazy fox jumps 12 times"
    ids = tok(text, return_tensors="pt").input_ids
    assert torch.equal(ids, tok2(text, return_tensors="pt").input_ids), "tokenizer differs"
    with torch.no_grad():
        l1, l2 = m1(ids).logits, m2(ids).logits
    assert l2.dtype == l1.dtype and torch.equal(l1, l2), \
        f"logits differ: max {float((l1.float() - l2.float()).abs().max())}"
    print(f"{type(m2).__name__} loads from the export; logits on {ids.shape[1]} tokens identical")
    if a.variant.startswith("qwen2_moe"):
        # The sparse layers, however the export spells decoder_sparse_step / mlp_only_layers.
        def sparse(c):
            return [i for i in range(c.num_hidden_layers)
                    if i not in c.mlp_only_layers and (i + 1) % c.decoder_sparse_step == 0]
        assert sparse(m1.config) == sparse(m2.config), \
            f"sparse layers {sparse(m1.config)} vs {sparse(m2.config)}"
        print(f"sparse layers {sparse(m2.config)} (decoder_sparse_step "
              f"{m2.config.decoder_sparse_step}, mlp_only_layers {m2.config.mlp_only_layers})")


if __name__ == "__main__":
    main(sys.argv[1:])
