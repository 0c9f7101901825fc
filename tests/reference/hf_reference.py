# Hugging Face transformers reference for trident's golden tests (tests/model/hf_golden_test.cc):
# a tiny GPT-2, BLOOM, Llama or Mixtral is built from its config by transformers itself (random weights are
# never used: trident's weights are copied in, nothing is downloaded), in float64; its logits, its
# own loss (labels shifted inside the model) and every parameter gradient are written back in
# trident's names and layouts; for Mixtral also each layer's router logits and chosen experts. Runs with the venv of scripts/install-python-deps (transformers
# pinned; torch 1.13 from Debian).
"""HF transformers float64 reference: --inputs IN.trtf --output OUT.trtf."""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tensor_file import read_tensor_file, write_tensor_file  # noqa: E402

# Order of the "config" (i64) and "hyper" (f64) entries written by hf_golden_test.cc.
CONFIG_KEYS = ["vocab", "vocab_padded", "hidden", "num_layers", "num_heads", "ffn_hidden",
               "seq_len", "max_positions", "batch", "query_groups", "rope_scaling",
               "rope_original_max_positions", "eod", "num_experts", "topk", "moe_ffn_hidden"]
HYPER_KEYS = ["norm_eps", "rotary_base", "rope_factor", "rope_low", "rope_high"]


def hf_model(variant, c, h):
    import transformers as tf
    common = dict(vocab_size=c["vocab"])
    if variant == "gpt2":
        cfg = tf.GPT2Config(n_positions=c["max_positions"], n_embd=c["hidden"],
                            n_layer=c["num_layers"], n_head=c["num_heads"],
                            n_inner=c["ffn_hidden"], activation_function="gelu_new",
                            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                            layer_norm_epsilon=h["norm_eps"], **common)
        model = tf.GPT2LMHeadModel(cfg)
    elif variant == "bloom":
        if c["ffn_hidden"] != 4 * c["hidden"]:
            raise ValueError("BLOOM's MLP is 4 x hidden in transformers")
        cfg = tf.BloomConfig(hidden_size=c["hidden"], n_layer=c["num_layers"],
                             n_head=c["num_heads"], layer_norm_epsilon=h["norm_eps"],
                             hidden_dropout=0.0, attention_dropout=0.0, **common)
        model = tf.BloomForCausalLM(cfg)
    elif variant == "llama":
        scaling = None
        if c["rope_scaling"]:
            scaling = {"rope_type": "llama3", "factor": h["rope_factor"],
                       "low_freq_factor": h["rope_low"], "high_freq_factor": h["rope_high"],
                       "original_max_position_embeddings": c["rope_original_max_positions"]}
        cfg = tf.LlamaConfig(hidden_size=c["hidden"], intermediate_size=c["ffn_hidden"],
                             num_hidden_layers=c["num_layers"],
                             num_attention_heads=c["num_heads"],
                             num_key_value_heads=c["query_groups"],
                             max_position_embeddings=c["max_positions"],
                             rms_norm_eps=h["norm_eps"], rope_theta=h["rotary_base"],
                             rope_scaling=scaling, tie_word_embeddings=False,
                             attention_bias=False, mlp_bias=False, hidden_act="silu", **common)
        model = tf.LlamaForCausalLM(cfg)
    elif variant == "mixtral":
        if c["rope_scaling"]:
            raise ValueError("transformers' Mixtral has no rope_scaling")
        # router_aux_loss_coef 0: the loss is the language-model loss alone (transformers' load
        # balancing loss, over all layers at once, is not Megatron's per-layer one).
        cfg = tf.MixtralConfig(hidden_size=c["hidden"], intermediate_size=c["moe_ffn_hidden"],
                               num_hidden_layers=c["num_layers"],
                               num_attention_heads=c["num_heads"],
                               num_key_value_heads=c["query_groups"],
                               max_position_embeddings=c["max_positions"],
                               rms_norm_eps=h["norm_eps"], rope_theta=h["rotary_base"],
                               tie_word_embeddings=False, hidden_act="silu",
                               num_local_experts=c["num_experts"], num_experts_per_tok=c["topk"],
                               router_aux_loss_coef=0.0, router_jitter_noise=0.0,
                               sliding_window=None, **common)
        model = tf.MixtralForCausalLM(cfg)
    else:
        raise ValueError(f"unknown variant {variant}")
    cfg._attn_implementation = "eager"
    return model.double().eval()


def weight_map(variant, c):
    """[(trident name, hf name, to_hf, from_hf)]: to_hf maps trident's tensor to HF's, from_hf
    maps an HF-shaped gradient back to trident's layout (padded vocabulary rows zero)."""
    C, NH, L, V, Vp = c["hidden"], c["num_heads"], c["num_layers"], c["vocab"], c["vocab_padded"]
    HS = C // NH
    G = c["query_groups"]

    def vocab(t):
        return t[:V]

    def unvocab(g):
        out = torch.zeros((Vp,) + tuple(g.shape[1:]), dtype=g.dtype)
        out[:V] = g
        return out

    same = (lambda t: t, lambda g: g)
    T = (lambda t: t.t(), lambda g: g.t())
    rows = []
    if variant == "gpt2":
        rows += [("embedding.word_embeddings.weight", "transformer.wte.weight", vocab, unvocab),
                 ("embedding.position_embeddings.weight", "transformer.wpe.weight", *same)]

        # trident rows (NH, 3, HS) <-> HF Conv1D columns (3, NH, HS)
        def qkv_w(t):
            return t.reshape(NH, 3, HS, C).permute(1, 0, 2, 3).reshape(3 * C, C).t()

        def qkv_w_back(g):
            return g.t().reshape(3, NH, HS, C).permute(1, 0, 2, 3).reshape(3 * C, C)

        def qkv_b(t):
            return t.reshape(NH, 3, HS).permute(1, 0, 2).reshape(3 * C)

        def qkv_b_back(g):
            return g.reshape(3, NH, HS).permute(1, 0, 2).reshape(3 * C)

        for l in range(L):
            p, q = f"layers.{l}.", f"transformer.h.{l}."
            rows += [(p + "input_layernorm.weight", q + "ln_1.weight", *same),
                     (p + "input_layernorm.bias", q + "ln_1.bias", *same),
                     (p + "self_attention.query_key_value.weight", q + "attn.c_attn.weight",
                      qkv_w, qkv_w_back),
                     (p + "self_attention.query_key_value.bias", q + "attn.c_attn.bias",
                      qkv_b, qkv_b_back),
                     (p + "self_attention.dense.weight", q + "attn.c_proj.weight", *T),
                     (p + "self_attention.dense.bias", q + "attn.c_proj.bias", *same),
                     (p + "post_attention_layernorm.weight", q + "ln_2.weight", *same),
                     (p + "post_attention_layernorm.bias", q + "ln_2.bias", *same),
                     (p + "mlp.dense_h_to_4h.weight", q + "mlp.c_fc.weight", *T),
                     (p + "mlp.dense_h_to_4h.bias", q + "mlp.c_fc.bias", *same),
                     (p + "mlp.dense_4h_to_h.weight", q + "mlp.c_proj.weight", *T),
                     (p + "mlp.dense_4h_to_h.bias", q + "mlp.c_proj.bias", *same)]
        rows += [("final_layernorm.weight", "transformer.ln_f.weight", *same),
                 ("final_layernorm.bias", "transformer.ln_f.bias", *same)]
    elif variant == "bloom":
        rows += [("embedding.word_embeddings.weight", "transformer.word_embeddings.weight",
                  vocab, unvocab),
                 ("embedding.word_embeddings_layernorm.weight",
                  "transformer.word_embeddings_layernorm.weight", *same),
                 ("embedding.word_embeddings_layernorm.bias",
                  "transformer.word_embeddings_layernorm.bias", *same)]
        for l in range(L):
            p, q = f"layers.{l}.", f"transformer.h.{l}."
            for name in ["input_layernorm.weight", "input_layernorm.bias",
                         "self_attention.query_key_value.weight",  # (NH, 3, HS) in both
                         "self_attention.query_key_value.bias", "self_attention.dense.weight",
                         "self_attention.dense.bias", "post_attention_layernorm.weight",
                         "post_attention_layernorm.bias", "mlp.dense_h_to_4h.weight",
                         "mlp.dense_h_to_4h.bias", "mlp.dense_4h_to_h.weight",
                         "mlp.dense_4h_to_h.bias"]:
                rows.append((p + name, q + name, *same))
        rows += [("final_layernorm.weight", "transformer.ln_f.weight", *same),
                 ("final_layernorm.bias", "transformer.ln_f.bias", *same)]
    else:  # llama, mixtral
        hpg = NH // G
        rows += [("embedding.word_embeddings.weight", "model.embed_tokens.weight", vocab, unvocab)]
        for l in range(L):
            p, q = f"layers.{l}.", f"model.layers.{l}."
            qkv = p + "self_attention.query_key_value.weight"

            # trident rows (G, hpg + 2, HS): hpg query heads, a key and a value head per group
            def part(t, lo, hi):
                return t.reshape(G, hpg + 2, HS, C)[:, lo:hi].reshape(-1, C)

            rows += [(p + "input_layernorm.weight", q + "input_layernorm.weight", *same),
                     (qkv, q + "self_attn.q_proj.weight", lambda t: part(t, 0, hpg), None),
                     (qkv, q + "self_attn.k_proj.weight", lambda t: part(t, hpg, hpg + 1), None),
                     (qkv, q + "self_attn.v_proj.weight",
                      lambda t: part(t, hpg + 1, hpg + 2), None),
                     (p + "self_attention.dense.weight", q + "self_attn.o_proj.weight", *same),
                     (p + "post_attention_layernorm.weight", q + "post_attention_layernorm.weight",
                      *same)]
            if variant == "llama":
                rows += [(p + "mlp.dense_h_to_4h.weight", q + "mlp.gate_proj.weight",
                          lambda t: t[0], None),
                         (p + "mlp.dense_h_to_4h.weight", q + "mlp.up_proj.weight",
                          lambda t: t[1], None),
                         (p + "mlp.dense_4h_to_h.weight", q + "mlp.down_proj.weight", *same)]
                continue
            # Mixtral: trident's router (E, C) is gate; its experts' stacked (E, 2, F, C) holds
            # expert e's w1 at [e, 0] and w3 at [e, 1], its (E, C, F) w2 at [e].
            moe = q + "block_sparse_moe."
            rows.append((p + "mlp.router.weight", moe + "gate.weight", *same))
            for e in range(c["num_experts"]):
                rows += [(p + "mlp.experts.dense_h_to_4h.weight", moe + f"experts.{e}.w1.weight",
                          lambda t, e=e: t[e, 0], None),
                         (p + "mlp.experts.dense_h_to_4h.weight", moe + f"experts.{e}.w3.weight",
                          lambda t, e=e: t[e, 1], None),
                         (p + "mlp.experts.dense_4h_to_h.weight", moe + f"experts.{e}.w2.weight",
                          lambda t, e=e: t[e], None)]
        rows += [("final_layernorm.weight", "model.norm.weight", *same),
                 ("output_layer.weight", "lm_head.weight", vocab, unvocab)]
    return rows


def llama_grads_back(c, named_grads, name):
    """Gradient of a Llama / Mixtral parameter trident fuses (QKV, gate/up, the experts) from
    HF's separate ones."""
    C, NH, G = c["hidden"], c["num_heads"], c["query_groups"]
    HS, hpg = C // NH, NH // G
    l = name.split(".")[1]
    q = f"model.layers.{l}."
    experts = range(c["num_experts"])
    moe = q + "block_sparse_moe.experts."
    if name.endswith("experts.dense_h_to_4h.weight"):
        return torch.stack([torch.stack([named_grads[moe + f"{e}.w1.weight"],
                                         named_grads[moe + f"{e}.w3.weight"]]) for e in experts])
    if name.endswith("experts.dense_4h_to_h.weight"):
        return torch.stack([named_grads[moe + f"{e}.w2.weight"] for e in experts])
    if name.endswith("query_key_value.weight"):
        gq = named_grads[q + "self_attn.q_proj.weight"].reshape(G, hpg, HS, C)
        gk = named_grads[q + "self_attn.k_proj.weight"].reshape(G, 1, HS, C)
        gv = named_grads[q + "self_attn.v_proj.weight"].reshape(G, 1, HS, C)
        return torch.cat([gq, gk, gv], dim=1).reshape(-1, C)
    return torch.stack([named_grads[q + "mlp.gate_proj.weight"],
                        named_grads[q + "mlp.up_proj.weight"]])


def ltor_masks_and_position_ids(tokens, eod):
    """Megatron's get_ltor_masks_and_position_ids with reset_position_ids and
    reset_attention_mask: position ids restart after each EOD token, and no token attends across
    one. Returns position ids (B, T) and the additive (B, 1, T, T) mask (0 or the float64 minimum:
    causal and block-diagonal)."""
    B, T = tokens.shape
    allowed = torch.tril(torch.ones((B, T, T), dtype=torch.bool))
    position_ids = torch.arange(T, dtype=torch.long).unsqueeze(0).repeat(B, 1)
    for b in range(B):
        eod_index = position_ids[b, tokens[b] == eod].clone()
        prev_index = 0
        for i in eod_index.tolist():
            allowed[b, (i + 1):, :(i + 1)] = False
            position_ids[b, (i + 1):] -= (i + 1 - prev_index)
            prev_index = i + 1
    mask = torch.zeros((B, 1, T, T), dtype=torch.float64)
    mask[~allowed.unsqueeze(1)] = torch.finfo(torch.float64).min
    return position_ids, mask


def gpt2_inject_mask(model, mask):
    """transformers' GPT-2 takes only a 2-D padding mask: give every attention layer's _attn the
    4-D additive mask instead (it is added to the causally masked scores before the softmax)."""
    for block in model.transformer.h:
        orig = block.attn._attn

        def _attn(query, key, value, attention_mask=None, head_mask=None, orig=orig):
            return orig(query, key, value, mask, head_mask)
        block.attn._attn = _attn


def run(inputs, variant):
    c = dict(zip(CONFIG_KEYS, (int(v) for v in inputs["config"].tolist())))
    h = dict(zip(HYPER_KEYS, (float(v) for v in inputs["hyper"].tolist())))
    model = hf_model(variant, c, h)
    hf_params = dict(model.named_parameters())
    rows = weight_map(variant, c)
    with torch.no_grad():
        covered = set()
        for tname, hname, to_hf, _ in rows:
            src = to_hf(inputs[tname].to(torch.float64))
            dst = hf_params[hname]
            if tuple(src.shape) != tuple(dst.shape):
                raise ValueError(f"{tname} -> {hname}: shape {tuple(src.shape)} vs "
                                 f"{tuple(dst.shape)}")
            dst.copy_(src)
            covered.add(hname)
    tied = {"lm_head.weight"} if variant not in ("llama", "mixtral") else set()
    missing = set(hf_params) - covered - tied
    if missing:
        raise ValueError(f"HF parameters not set from trident's: {sorted(missing)}")
    tokens = inputs["tokens"].long()
    targets = inputs["labels"].long()  # trident's targets: the next token, -1 ignored
    # HF shifts labels inside the model: label[t + 1] is the target of position t.
    labels = torch.full_like(targets, -100)
    labels[:, 1:] = torch.where(targets[:, :-1] < 0, torch.full_like(targets[:, :-1], -100),
                                targets[:, :-1])
    kwargs = {}
    if c["eod"] >= 0:  # documents: Megatron's position ids and block-diagonal causal mask
        position_ids, mask = ltor_masks_and_position_ids(tokens, c["eod"])
        if (tokens == c["eod"]).sum() < 2 * tokens.shape[0]:
            raise ValueError("the documents variant needs several EOD tokens per sample")
        kwargs["position_ids"] = position_ids
        if variant == "gpt2":
            gpt2_inject_mask(model, mask)
        else:
            kwargs["attention_mask"] = mask
    if variant == "mixtral":
        kwargs["output_router_logits"] = True
    out = model(input_ids=tokens, labels=labels, **kwargs)
    out.loss.backward()
    named_grads = {n: p.grad for n, p in model.named_parameters()}
    result = [("logits", out.logits.detach().reshape(-1, c["vocab"])),
              ("loss", out.loss.detach().reshape(1))]
    if variant == "mixtral":  # each layer's (B*T, E) router logits and its chosen experts
        for l, logits in enumerate(out.router_logits):
            chosen = torch.topk(torch.softmax(logits, dim=-1), c["topk"], dim=-1).indices
            result += [(f"router_logits.{l}", logits.detach().contiguous()),
                       (f"router_experts.{l}", chosen.to(torch.int64).contiguous())]
    done = set()
    for tname, hname, _, from_hf in rows:
        if tname in done:
            continue
        done.add(tname)
        g = from_hf(named_grads[hname]) if from_hf else llama_grads_back(c, named_grads, tname)
        result.append(("grad." + tname, g.detach().contiguous()))
    return result


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--inputs", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--variant", required=True,
                    choices=["gpt2", "bloom", "llama", "mixtral", "gpt2_docs", "llama_docs"])
    a = ap.parse_args(argv)
    torch.manual_seed(0)
    write_tensor_file(a.output, run(read_tensor_file(a.inputs), a.variant.replace("_docs", "")))


if __name__ == "__main__":
    main(sys.argv[1:])
